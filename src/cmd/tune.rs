//! `smelt tune`: every tensor-core conv and GEMM of the program timed with
//! each candidate tile on a device, the fastest kept per kernel in a table
//! for `--tuning`.

use crate::Open as _;
use crate::TuneArgs;
use anyhow::{bail, Context, Result};
use serde_json::json;
use smelt::dummy_input;
use smelt::tune::{default_path, measure, tile_name, tiled_steps, Tuning};
use smelt_codegen::tile::Tile;
use smelt_codegen::TileChoice;
use smelt_codegen::{nvrtc::Compiler, program::compile_all, Program};
use smelt_ir::Tensor;
use smelt_runtime::exec::{Device, Executor, KernelTime};
use std::collections::HashMap;

/// `smelt tune`.
pub fn run(a: &TuneArgs) -> Result<bool> {
    let cuda = a.backend == "cuda";
    if cuda {
        if let Some(why) = smelt_runtime::cuda::unavailable() {
            bail!("smelt tune --backend cuda needs an NVIDIA GPU: {why} (--backend emulator times the emulator, to test the tuner)");
        }
    }
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let program = |tiles: TileChoice| -> Result<(Program, Vec<u8>, Vec<Tensor>)> {
        let mut m = a.model.spec()?;
        m.tiles = Some(tiles);
        let mut s = m.session_with_values()?;
        let compiled = s.compile().with_context(|| format!("cannot compile {}", m.model))?;
        let planned = s.plan(&compiled)?;
        let p = s.program(&compiled, &planned).with_context(|| format!("cannot generate code for {}", m.model))?;
        let blob = p.weights_blob(&compiled.graph)?;
        let inputs = (0..compiled.graph.inputs().len()).map(|i| dummy_input(&compiled.graph, i)).collect();
        Ok((p, blob, inputs))
    };
    let (model, _, inputs) = program(TileChoice::Model)?;
    let tiled = tiled_steps(&model).into_iter().flatten().count();
    if tiled == 0 {
        bail!(
            "{}: no conv or GEMM of it runs on tensor cores, so there is no tile to tune (half precisions and TF32 use them: --precision mixed-f16)",
            a.model.model
        );
    }
    let bar = super::bar(Tile::CANDIDATES.len(), "{spinner} timing tiles {bar:30} {pos}/{len} {wide_msg}", a.json);
    let mut runs = Vec::new();
    let mut device = String::new();
    for t in Tile::CANDIDATES {
        bar.set_message(tile_name(t));
        let (p, blob, _) = program(TileChoice::Every([t.m, t.n]))?;
        let what = format!("every tensor-core kernel on {}", tile_name(t));
        let (profiles, name) = if cuda {
            let sources = p.sources();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let kernels = compile_all(&Compiler::default(), &sources, threads, &|_| {}).context("kernel compilation failed")?;
            let ptx: HashMap<String, String> = sources.iter().map(|(n, _)| n.clone()).zip(kernels.into_iter().map(|c| c.ptx)).collect();
            profile(smelt_runtime::cuda::executor(p, ptx, &blob, None, false)?, &inputs, a.runs, true, &what)?
        } else {
            profile(smelt_runtime::emu::executor(p, &blob, &|_| {})?, &inputs, a.runs, false, &what)?
        };
        device = name;
        runs.push(profiles);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let kernels = measure(&model, &runs)?;
    let sum = |pick: &dyn Fn(&smelt::tune::Measured) -> &str| kernels.iter().map(|k| k.ms[pick(k)]).sum::<f64>();
    let (tuned_ms, model_ms) = (sum(&|k| &k.tuned), sum(&|k| &k.model));
    let changed = kernels.iter().filter(|k| k.tuned != k.model).count();
    let table = Tuning { device: device.clone(), tiles: kernels.iter().map(|k| (k.kernel.clone(), k.tuned.clone())).collect(), kernels };
    let path = a.out.clone().unwrap_or_else(|| default_path(&device));
    let mut stored = match Tuning::read(&path) {
        Ok(old) if old.device == device => old,
        _ => Tuning::default(),
    };
    stored.merge(table.clone());
    stored.write(&path)?;
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "device": device, "backend": a.backend, "runs": a.runs, "path": path,
                "kernels": table.kernels, "tuned_ms": tuned_ms, "model_ms": model_ms,
            }))?
        );
        return Ok(true);
    }
    let names: Vec<String> = Tile::CANDIDATES.into_iter().map(tile_name).collect();
    outln!(
        "{:<60} {:>8} {} {:>8} {:>8}",
        "kernel (ms per run, all its launches)",
        "launches",
        names.iter().map(|n| format!("{n:>9}")).collect::<String>(),
        "tuned",
        "model"
    );
    for k in &table.kernels {
        let ms: String = names.iter().map(|n| format!("{:>9.4}", k.ms[n])).collect();
        outln!("{:<60} {:>8} {ms} {:>8} {:>8}", k.kernel, k.launches, k.tuned, k.model);
    }
    outln!(
        "\n{} kernels timed on {device}, the median of {} runs per tile: {tuned_ms:.3} ms per run on the tuned tiles, {model_ms:.3} ms on the model's ({changed} kernels differ)",
        table.kernels.len(),
        a.runs
    );
    if !cuda {
        outln!("note: the emulator's times are the CPU's, not a GPU's: this table tests the tuner and must not choose tiles for a GPU");
    }
    outln!("wrote {} (use it with --tuning {})", path.display(), path.display());
    Ok(true)
}

/// Checks every kernel of `exec`'s program against its description once,
/// warms up (a GPU), then profiles `runs` runs: each launch's time per run,
/// and the device's name.
fn profile<D: Device>(
    mut exec: Executor<D>,
    inputs: &[Tensor],
    runs: usize,
    warm: bool,
    what: &str,
) -> Result<(Vec<Vec<KernelTime>>, String)> {
    let (_, checks) = exec.run_checked(inputs, 1e-4)?;
    if let Some(c) = checks.iter().find(|c| !c.ok) {
        bail!("{what}: kernel {} (node {}) disagrees with its description ({:.3e} of range): a bug in smelt", c.kernel, c.node, c.of_range);
    }
    if warm {
        exec.run(inputs, false)?;
    }
    let profiles = (0..runs).map(|_| exec.run(inputs, true).map(|r| r.2)).collect::<Result<Vec<_>, _>>()?;
    Ok((profiles, exec.device().info().name))
}
