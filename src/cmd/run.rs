//! `smelt run`: the CPU reference executor or the CUDA executor, outputs
//! compared with expected ones and, under a reduced precision, with f32.

use crate::Open as _;
use crate::RunArgs;
use anyhow::{bail, Context, Result};
use serde_json::json;
use smelt::device::Loaded;
use smelt::report::human_bytes;
use smelt::train::{Backend, Progress};
use smelt::{compare, dummy_input, summarize};
use smelt_ir::{onnx, KernelGraph, Tensor};
use smelt_passes::precision::Policy;
use smelt_runtime::exec::{Device, Executor, KernelTime};
use std::path::PathBuf;
use std::time::Instant;

/// What to do with the outputs of a run.
pub struct Outputs<'a> {
    pub inputs: &'a [PathBuf],
    pub expects: &'a [PathBuf],
    pub rtol: f64,
    pub atol: f64,
    pub save: Option<PathBuf>,
    pub json: bool,
}

/// What an executor did: outputs, seconds, a line saying where it ran, and
/// fields for `--json`.
struct Ran {
    outs: Vec<Tensor>,
    secs: f64,
    label: String,
    extra: serde_json::Value,
}

/// `smelt run`.
pub fn run(a: &RunArgs) -> Result<bool> {
    // A memory limit splits what runs above it (as `smelt plan --memory-limit`).
    let mut model = a.model.spec()?;
    model.split_limit = a.memory_limit;
    // TF32 is the GPU's (as PyTorch): the CPU computes in f32 unless asked.
    if a.backend == "cpu" {
        model.no_tf32_by_default();
    }
    let mut s = model.session_with_values()?;
    let compiled = s.compile().with_context(|| format!("cannot compile {}", model.model))?;
    super::log_time("compile", s.timings.passes);
    // Under a reduced precision, also run in f32 and report the error.
    // The f32 CPU reference run is slow at large batches: on a device it
    // runs only when asked.
    let against = a.backend == "cpu" || a.against_f32;
    let reference = if model.precision != Policy::F32 && against { Some(s.compile_f32()?) } else { None };
    let out = Outputs { inputs: &a.inputs, expects: &a.expects, rtol: a.rtol, atol: a.atol, save: a.save_outputs.clone(), json: a.json };
    let reference = reference.as_ref().map(|r| (r, model.precision));
    if a.backend != "cpu" {
        return on_device(&mut s, &compiled, &out, reference, a);
    }
    if a.profile || a.memory_limit.is_some() || a.check_kernels || a.sync || a.check_finite {
        bail!("--profile, --memory-limit, --check-kernels, --check-finite and --sync apply to --backend cuda or emulator (use `smelt plan --memory-limit` for the plan alone)");
    }
    on_cpu(&compiled.graph, &out, reference)
}

fn read_inputs(g: &KernelGraph, files: &[PathBuf]) -> Result<Vec<Tensor>> {
    if files.is_empty() {
        return Ok((0..g.inputs().len()).map(|i| dummy_input(g, i)).collect());
    }
    if files.len() != g.inputs().len() {
        bail!("the model takes {} inputs but {} --input files were given", g.inputs().len(), files.len());
    }
    files.iter().map(|f| Ok(onnx::read_tensor_file(f)?.1)).collect()
}

/// Runs `g` on the CPU reference executor (with a progress bar), then
/// reports; with `reference` (the f32 graph and the policy of `g`), also
/// the error of `g` against it.
pub fn on_cpu(g: &KernelGraph, a: &Outputs, reference: Option<(&KernelGraph, Policy)>) -> Result<bool> {
    // Refused before the inputs are made: the run's peak, and the
    // reference's after it while the outputs are kept.
    let outs: usize = g.outputs().iter().map(|(_, v)| g.ty(*v).bytes()).sum();
    let peak = smelt_runtime::cpu::peak_bytes(g)?.max(match reference {
        Some((r, _)) => smelt_runtime::cpu::peak_bytes(r)?.saturating_add(outs),
        None => 0,
    });
    smelt_runtime::check_host_memory("running on the CPU reference executor", peak)?;
    report(g, a, reference, &mut |ins| {
        let bar = super::bar(g.len(), "{spinner} running on the CPU {bar:30} {pos}/{len} nodes {elapsed}", false);
        let t = Instant::now();
        let outs = smelt_runtime::cpu::run_with_progress(g, ins, &mut |done, _| bar.set_position(done as u64))?;
        bar.finish_and_clear();
        let secs = t.elapsed().as_secs_f64();
        Ok(Ran { outs, secs, label: format!("ran on the CPU reference executor in {secs:.3} s"), extra: json!({"backend": "cpu"}) })
    })
}

/// Runs `g` with `exec`, then reports, compares and saves its outputs.
fn report(
    g: &KernelGraph,
    a: &Outputs,
    reference: Option<(&KernelGraph, Policy)>,
    exec: &mut dyn FnMut(&[Tensor]) -> Result<Ran>,
) -> Result<bool> {
    let Outputs { inputs, expects, rtol, atol, json, .. } = *a;
    let io = g.inputs().iter().chain(g.outputs().iter().map(|(_, v)| &v.node)).map(|&n| g.node(n).outputs[0].bytes());
    smelt_runtime::check_host_memory("the inputs and outputs", io.fold(0, usize::saturating_add))?;
    let ins = read_inputs(g, inputs)?;
    if !expects.is_empty() && expects.len() != g.outputs().len() {
        bail!("the model has {} outputs but {} --expect files were given", g.outputs().len(), expects.len());
    }
    let expected = expects.iter().map(|f| Ok(onnx::read_tensor_file(f)?.1)).collect::<Result<Vec<_>>>()?;
    // A file that cannot be the output is the user's mistake, said before running.
    for ((file, e), (name, v)) in expects.iter().zip(&expected).zip(g.outputs()) {
        let out = g.ty(*v);
        let same_kind = e.ty().dtype == out.dtype || (e.ty().dtype.is_float() && out.dtype.is_float());
        if e.shape() != out.shape.as_slice() || !same_kind {
            bail!("--expect {} holds {} but output \"{name}\" is {out}", file.display(), e.ty());
        }
    }
    let Ran { outs, secs, label, extra } = exec(&ins)?;
    if let Some(dir) = &a.save {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (i, ((name, _), t)) in g.outputs().iter().zip(&outs).enumerate() {
            onnx::write_tensor_file(&dir.join(format!("output_{i}.pb")), name, t)?;
        }
    }
    let against_f32: Option<Vec<smelt::PrecisionError>> = match reference {
        Some((r, _)) => {
            let want = smelt_runtime::cpu::run(r, &ins)?;
            Some(outs.iter().zip(&want).map(|(h, w)| smelt::precision_error(h, w)).collect())
        }
        None => None,
    };
    let mut ok = true;
    let mut rows = Vec::new();
    for (i, ((name, _), t)) in g.outputs().iter().zip(&outs).enumerate() {
        let s = summarize(t);
        let cmp = expected.get(i).map(|e| compare(t, e, rtol, atol));
        ok &= cmp.as_ref().is_none_or(|c| c.ok);
        rows.push((name, t, s, cmp));
    }
    // Where outputs differ from --expect and products ran in TF32, say so
    // and how to compare exactly.
    let tf32_note = (!ok && g.tf32() != smelt_ir::Tf32::Off)
        .then(|| g.node_ids().filter(|&id| <smelt_ir::KernelOp as smelt_runtime::cpu::Eval>::tf32(g, id)).count())
        .filter(|&n| n > 0)
        .map(|n| {
            format!(
                "{n} kernels ran in TF32 (--tf32 {}, the GPU default, as PyTorch's allow_tf32): their operands are rounded to 10 mantissa bits, \
                 which moves outputs by about 1e-3 of their range; run with --tf32 off to compare in exact f32",
                g.tf32()
            )
        });
    if json {
        let outputs: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, (name, t, s, cmp))| {
                json!({"name": name, "dtype": t.ty().dtype.name(), "shape": t.shape(), "summary": s, "comparison": cmp,
                       "against_f32": against_f32.as_ref().map(|e| &e[i])})
            })
            .collect();
        let mut v = json!({"precision": reference.map_or("f32".to_string(), |(_, p)| p.to_string()), "seconds": secs, "ok": ok, "rtol": rtol, "atol": atol, "outputs": outputs,
                           "tf32": g.tf32().to_string(), "note": tf32_note});
        if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
            v.extend(extra);
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ok);
    }
    outln!("{label}{}", reference.map_or(String::new(), |(_, p)| format!(" at precision {p}")));
    for (i, (name, t, s, cmp)) in rows.into_iter().enumerate() {
        outln!(
            "output {name}: {}  min {:.6} max {:.6} mean {:.6} argmax {}{}",
            t.ty(),
            s.min,
            s.max,
            s.mean,
            s.argmax,
            if s.finite { "" } else { "  (NOT FINITE)" }
        );
        if let Some(e) = against_f32.as_ref().map(|e| &e[i]) {
            outln!(
                "  against f32: max abs err {:.3e} ({:.3e} of the largest |output|)  max rel err {:.3e}  arg-max agrees on {} of {} rows",
                e.max_abs,
                e.max_abs_over_range,
                e.max_rel,
                e.argmax_agree,
                e.rows
            );
        }
        if let Some(c) = cmp {
            match &c.error {
                Some(e) => outln!("  expected: MISMATCH: {e}"),
                None => outln!(
                    "  expected: {}  max abs err {:.3e}  max rel err {:.3e}  {} of {} elements outside rtol {rtol:e} atol {atol:e}",
                    if c.ok { "OK" } else { "MISMATCH" },
                    c.max_abs,
                    c.max_rel,
                    c.mismatches,
                    c.elements
                ),
            }
        }
    }
    if let Some(note) = tf32_note {
        outln!("note: {note}");
    }
    Ok(ok)
}

/// `smelt run --backend cuda|emulator`: plan (refusing over --memory-limit
/// before touching the device), generate and compile the kernels (PTX with
/// NVRTC, or host code with the C++ compiler), load them with the weights,
/// then run: on a GPU once to warm up and `repeat` timed runs, on the
/// emulator once; with --check-kernels, every kernel is checked against
/// its description and against the reference executor.
fn on_device(
    s: &mut smelt::Session,
    compiled: &smelt::Compiled,
    a: &Outputs,
    reference: Option<(&KernelGraph, Policy)>,
    args: &RunArgs,
) -> Result<bool> {
    let fused = &compiled.graph;
    let planned = s.plan(compiled)?;
    if let Some(limit) = args.memory_limit {
        let mem = smelt::plan::report(fused, &planned.plan, !args.model.no_fuse, true);
        smelt::plan::check_limit(s, &mem, limit)?;
    }
    let cuda = args.backend == "cuda";
    if cuda {
        if let Some(why) = smelt_runtime::cuda::unavailable() {
            bail!("--backend cuda needs an NVIDIA GPU: {why}");
        }
    }
    let program = s.program(compiled, &planned).with_context(|| format!("cannot generate code for {}", args.model.model))?;
    let blob = program.weights_blob(fused)?;
    let bar = CompileBar(super::bar(0, "{spinner} compiling kernels {bar:30} {pos}/{len}", false));
    let backend = if cuda { Backend::Cuda } else { Backend::Emulator };
    let loaded = smelt::device::load(program, &blob, backend, args.memory_limit, args.sync, &bar);
    bar.0.finish_and_clear();
    match loaded? {
        Loaded::Cpu(e) => drive(e, fused, a, reference, args),
        Loaded::Emulator(e) => drive(e, fused, a, reference, args),
        Loaded::Cuda(e) => drive(e, fused, a, reference, args),
    }
}

/// The bar of the kernels compiled for a device.
struct CompileBar(indicatif::ProgressBar);

impl Progress for CompileBar {
    fn compiling(&self, kernels: usize) {
        self.0.set_length(kernels as u64);
    }

    fn compiled(&self) {
        self.0.inc(1);
    }
}

/// Runs a loaded program and reports (see [`on_device`]).
fn drive<D: Device>(
    mut exec: Executor<D>,
    fused: &KernelGraph,
    a: &Outputs,
    reference: Option<(&KernelGraph, Policy)>,
    args: &RunArgs,
) -> Result<bool> {
    let (arena, weights_bytes) = (exec.program().arena, exec.program().weights_bytes);
    let (profile, json_out, emulated) = (args.profile, a.json, args.backend == "emulator");
    // A training step updates its weights in place: every run is one more
    // step, so it runs exactly once (and is compared with the reference's one).
    let training = exec.program().steps.iter().any(|s| s.kernel.kind() == "update");
    let repeat = if emulated || training { 1 } else { args.repeat.max(1) };
    if args.check_kernels {
        exec.check_against_reference(fused.clone())?;
    }
    let mut bad_kernels = 0;
    let mut non_finite: Option<smelt_runtime::exec::NonFinite> = None;
    let ok = report(fused, a, reference, &mut |ins| {
        let mut checks = Vec::new();
        let mut times = Vec::with_capacity(repeat);
        let mut last = None;
        if args.check_kernels {
            let t = std::time::Instant::now();
            let (outs, c) = exec.run_checked(ins, args.kernel_rtol)?;
            checks = c;
            if training {
                times.push(t.elapsed().as_secs_f64() * 1e3); // with the checks' copies

                last = Some(outs);
            }
        }
        // Inf or NaN made of finite operands: looked for in the first run
        // (on a GPU, the warm-up) and named below.
        exec.check_finite(emulated || args.check_finite);
        if !emulated && !training {
            exec.run(ins, false)?; // warm-up: module JIT, first-touch costs
            non_finite = exec.non_finite().cloned();
            exec.check_finite(false);
        }
        for _ in 0..repeat.saturating_sub(times.len()) {
            let (outs, ms, _) = exec.run(ins, false)?;
            non_finite = non_finite.take().or_else(|| exec.non_finite().cloned());
            exec.check_finite(false);
            times.push(ms);
            last = Some(outs);
        }
        // A training step's profiled run is one more step, after the one
        // whose outputs are reported: the weights it leaves are not read.
        let kernels = if profile { exec.run(ins, true)?.2 } else { Vec::new() };
        times.sort_by(f64::total_cmp);
        let (min, median) = (times[0], times[times.len() / 2]);
        let dev = exec.device().info();
        bad_kernels = checks.iter().filter(|c| !c.ok).count();
        if !json_out {
            if args.check_kernels {
                use smelt_runtime::exec::Against;
                for c in checks.iter().filter(|c| !c.ok) {
                    let with = if c.against == Against::Description { "its description" } else { "the reference executor" };
                    outln!(
                        "kernel {} (node {}): MISMATCH with {with}: max abs err {:.3e} ({:.3e} of range), {} elements outside",
                        c.kernel,
                        c.node,
                        c.max_abs,
                        c.of_range,
                        c.mismatches
                    );
                }
                for (against, what, tol) in [
                    (Against::Description, "their descriptions", format!("{:e} of range", args.kernel_rtol)),
                    (
                        Against::Reference,
                        "the reference executor (the node's op, layouts converted apart)",
                        format!(
                            "{:e} (f32) or {:e} (f16, bf16) of range",
                            smelt_runtime::exec::reference_rtol(smelt_ir::DType::F32),
                            smelt_runtime::exec::reference_rtol(smelt_ir::DType::F16)
                        ),
                    ),
                ] {
                    let these: Vec<_> = checks.iter().filter(|c| c.against == against).collect();
                    let worst = these.iter().map(|c| c.of_range).fold(0f64, f64::max);
                    outln!(
                        "checked {} kernels against {what}: {} agree within {tol} (worst {worst:.3e})",
                        these.len(),
                        these.iter().filter(|c| c.ok).count(),
                    );
                }
            }
            if profile {
                print_profile(&kernels)?;
            }
        }
        if let Some(n) = &non_finite {
            let why = if n.ty.starts_with("f16") {
                format!(
                    "f16's largest value is 65504 and this model's activations exceed it: run with --precision mixed-bf16 (f32's range in 16 bits) or keep this node in f32 with --keep-f32 '{}'",
                    n.node
                )
            } else {
                "a value left its type's range".to_string()
            };
            eprintln!(
                "warning: kernel {} (node {}) made {} inf and {} NaN values of finite operands ({}): {why}",
                n.kernel, n.node, n.inf, n.nan, n.ty
            );
        }
        let label = if emulated {
            format!(
                "ran on the {} in {median:.3} ms (the generated CUDA C on the CPU, every access checked); arena {} + weights {}",
                dev.name,
                human_bytes(arena),
                human_bytes(weights_bytes)
            )
        } else {
            format!(
                "ran on {} (compute capability {}.{}): median {median:.3} ms, min {min:.3} ms over {repeat} runs; device memory {} (arena {} + weights {})",
                dev.name,
                dev.compute_capability.0,
                dev.compute_capability.1,
                human_bytes(arena + weights_bytes),
                human_bytes(arena),
                human_bytes(weights_bytes)
            )
        };
        Ok(Ran {
            outs: last.expect("at least one run"),
            secs: median / 1e3,
            label,
            extra: json!({"backend": args.backend, "device": dev, "runs": repeat, "median_ms": median, "min_ms": min,
                          "arena_bytes": arena, "weights_bytes": weights_bytes, "device_bytes": exec.device_bytes(), "kernels": kernels,
                          "kernel_checks": if args.check_kernels { json!(checks) } else { json!(null) },
                          "non_finite": non_finite}),
        })
    })?;
    Ok(ok && bad_kernels == 0)
}

fn print_profile(kernels: &[KernelTime]) -> Result<()> {
    let total: f64 = kernels.iter().map(|k| k.ms).sum();
    outln!("{:<56} {:>9} {:>6} {:>9} {:>10}", "kernel (profiled run)", "ms", "share", "GB/s", "GFLOP/s");
    let mut sorted: Vec<_> = kernels.iter().collect();
    sorted.sort_by(|x, y| y.ms.total_cmp(&x.ms));
    for k in &sorted {
        outln!(
            "{:<56} {:>9.4} {:>5.1}% {:>9.1} {:>10.1}",
            k.kernel,
            k.ms,
            100.0 * k.ms / total.max(1e-12),
            k.bytes as f64 / (k.ms * 1e6),
            k.flops as f64 / (k.ms * 1e6)
        );
    }
    outln!("{} kernels, {total:.3} ms in kernels\n", kernels.len());
    Ok(())
}
