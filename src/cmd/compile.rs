//! `smelt compile`: the IR after a pass, or (with `--out` or
//! `--ptxas-stats`) the kernels, their PTX and the program.

use crate::CompileArgs;
use anyhow::{bail, Context, Result};
use serde_json::json;
use smelt::report::human_bytes;
use smelt_codegen::{nvrtc::Compiler, program::compile_all};
use std::path::PathBuf;
use std::time::Instant;

/// `smelt compile`.
pub fn run(a: &CompileArgs) -> Result<bool> {
    if a.out.is_some() || a.ptxas_stats {
        return codegen(a);
    }
    let want = a.dump_ir.clone().unwrap_or_else(|| "final".into());
    let mut dumped = None;
    let mut s = a.model.session()?;
    let compiled = s
        .compile_with(&mut |pass, g| {
            if pass == want {
                dumped = Some(smelt_ir::text::print(g));
            }
        })
        .with_context(|| format!("cannot compile {}", a.model.model))?;
    super::log_time("compile", s.timings.passes);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&compiled.stats)?);
        return Ok(true);
    }
    match dumped {
        Some(text) => out!("{text}"),
        None if want == "final" => out!("{}", smelt_ir::text::print(&compiled.graph)),
        None => bail!("pass {want} did not run (fusion is off?)"),
    }
    errln!("{}", serde_json::to_string(&compiled.stats)?);
    Ok(true)
}

/// `smelt compile --out DIR` / `--ptxas-stats`: lower, compile, write.
fn codegen(o: &CompileArgs) -> Result<bool> {
    let model = &o.model;
    let mut s = if o.out.is_some() { model.session_with_values()? } else { model.session()? };
    let compiled = s.compile()?;
    let planned = s.plan(&compiled)?;
    let program = s.program(&compiled, &planned).with_context(|| format!("cannot generate code for {}", model.model))?;
    let fused = &compiled.graph;
    let sources = program.sources();
    let arch = o.arch.as_str();
    let compiler = Compiler { arch: o.arch.clone(), ..Compiler::default() };
    let threads = o.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = super::bar(sources.len(), "{spinner} compiling kernels {bar:30} {pos}/{len} {wide_msg}", o.json);
    let t = Instant::now();
    let kernels = compile_all(&compiler, &sources, threads, &|name| {
        bar.set_message(name.to_string());
        bar.inc(1);
    });
    bar.finish_and_clear();
    let kernels = kernels.context("kernel compilation failed")?;
    let compile_s = t.elapsed().as_secs_f64();
    let cached = kernels.iter().filter(|c| c.cached).count();

    let mut ptxas = Vec::new();
    if o.ptxas_stats {
        let exe = smelt_codegen::ptxas::find()
            .context("--ptxas-stats needs ptxas: pip install nvidia-cuda-nvcc-cu12 and set SMELT_PTXAS to its nvidia/cuda_nvcc/bin/ptxas, or put it on PATH")?;
        let bar = super::bar(sources.len(), "{spinner} ptxas {bar:30} {pos}/{len}", o.json);
        for c in &kernels {
            ptxas.extend(smelt_codegen::ptxas::stats(&exe, &c.ptx, &o.sm)?);
            bar.inc(1);
        }
        bar.finish_and_clear();
    }

    let title = format!("smelt compile {}{}", model.model, model.batch.map_or(String::new(), |b| format!(" --batch {b}")));
    if let Some(dir) = &o.out {
        let kdir = dir.join("kernels");
        std::fs::create_dir_all(&kdir).with_context(|| format!("cannot create {}", kdir.display()))?;
        let write = |path: PathBuf, text: &[u8]| std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()));
        for ((name, src), c) in sources.iter().zip(&kernels) {
            write(kdir.join(format!("{name}.cu")), src.as_bytes())?;
            write(kdir.join(format!("{name}.ptx")), c.ptx.as_bytes())?;
        }
        let pj = smelt::emit::plan_json(&model.model, model.batch, arch, &program);
        write(dir.join("plan.json"), serde_json::to_string_pretty(&pj)?.as_bytes())?;
        let report = smelt::plan::report(fused, &planned.plan, !model.no_fuse, true);
        let unfused = smelt::plan::report(&planned.unfused, &planned.unfused_plan, false, true);
        let mem = json!({"model": model.model, "batch": model.batch, "plan": report, "without_fusion": unfused});
        write(dir.join("memory.json"), serde_json::to_string_pretty(&mem)?.as_bytes())?;
        let svg = smelt::plan::svg(&title, &planned.plan, fused, (!model.no_fuse).then_some(&planned.unfused_plan));
        write(dir.join("memory.svg"), svg.as_bytes())?;
        if o.weights {
            write(dir.join("weights.bin"), &program.weights_blob(fused)?)?;
        }
        if o.ptxas_stats {
            write(dir.join("ptxas.json"), serde_json::to_string_pretty(&ptxas)?.as_bytes())?;
        }
    }
    let spilling = ptxas.iter().filter(|s| s.spill_stores + s.spill_loads > 0).count();
    if o.json {
        let v = json!({
            "model": model.model,
            "batch": model.batch,
            "arch": arch,
            "kernels": program.steps.len(),
            "distinct_kernels": sources.len(),
            "from_cache": cached,
            "compile_seconds": compile_s,
            "arena_bytes": program.arena,
            "weights_bytes": program.weights_bytes,
            "out": o.out,
            "ptxas": o.ptxas_stats.then_some(&ptxas),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(true);
    }
    if o.ptxas_stats {
        let row = |k: &str, r: &str, sp: &str, sh: &str, st: &str| -> Result<()> {
            outln!("{k:<60} {r:>9} {sp:>12} {sh:>11} {st:>8}");
            Ok(())
        };
        row(&format!("kernel (ptxas -arch={})", o.sm), "registers", "spill bytes", "shared", "stack")?;
        for s in &ptxas {
            let spill = (s.spill_stores + s.spill_loads).to_string();
            row(&s.kernel, &s.registers.to_string(), &spill, &human_bytes(s.shared), &s.stack.to_string())?;
        }
        let max = ptxas.iter().map(|s| s.registers).max().unwrap_or(0);
        outln!(
            "\n{} kernels assembled for {}: at most {max} registers; {}\n",
            ptxas.len(),
            o.sm,
            if spilling == 0 { "no kernel spills".to_string() } else { format!("{spilling} kernels spill") }
        );
    }
    outln!(
        "{}: {} kernel launches, {} distinct kernels compiled for {arch} in {:.2} s ({} from the cache, {} threads)",
        model.model,
        program.steps.len(),
        sources.len(),
        compile_s,
        cached,
        threads
    );
    outln!("arena {}, weights {}", human_bytes(program.arena), human_bytes(program.weights_bytes));
    if let Some(dir) = &o.out {
        outln!(
            "wrote {}/{{kernels/*.cu, kernels/*.ptx, plan.json, memory.json, memory.svg{}}}",
            dir.display(),
            if o.weights { ", weights.bin" } else { "" }
        );
    }
    Ok(true)
}
