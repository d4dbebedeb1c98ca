//! `smelt compile`: the IR after a pass, or (with `--out` or
//! `--ptxas-stats`) the kernels, their PTX and the program.

use crate::CompileArgs;
use crate::Open as _;
use anyhow::{bail, Context, Result};
use smelt::report::human_bytes;

/// `smelt compile`.
pub fn run(a: &CompileArgs) -> Result<bool> {
    if a.out.is_some() || a.ptxas_stats || a.report {
        return codegen(a);
    }
    let want = a.dump_ir.clone().unwrap_or_else(|| "final".into());
    let mut dumped = None;
    let model = a.model.spec()?;
    let mut s = model.session()?;
    let compiled = s
        .compile_with(&mut |pass, g| {
            if pass == want {
                dumped = Some(smelt_ir::text::print(g));
            }
        })
        .with_context(|| format!("cannot compile {}", model.model))?;
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
    // No TF32 by default where the target has none.
    let arch: usize = o.arch.trim_start_matches("compute_").trim_start_matches("sm_").parse().unwrap_or(usize::MAX);
    let mut model = o.model.spec()?;
    if arch < 80 || !model.train.gpu().has_tf32() {
        model.no_tf32_by_default();
    }
    let model = &model;
    let s = if o.out.is_some() { model.session_with_values()? } else { model.session()? };
    let bar = std::sync::Mutex::new(None::<indicatif::ProgressBar>);
    let progress = |name: &str, total: usize| {
        let mut b = bar.lock().expect("progress bar");
        let b = b.get_or_insert_with(|| super::bar(total, "{spinner} compiling kernels {bar:30} {pos}/{len} {wide_msg}", o.json));
        b.set_message(name.to_string());
        b.inc(1);
    };
    let build = smelt::emit::Build::new(s, &o.arch, o.jobs, &progress).with_context(|| format!("cannot compile {}", model.model))?;
    if let Some(b) = bar.into_inner().expect("progress bar") {
        b.finish_and_clear();
    }
    let (program, sources, kernels, arch) = (&build.program, &build.sources, &build.kernels, build.arch.as_str());
    let (compile_s, cached, threads) = (build.compile_seconds, build.from_cache, build.threads);

    let mut ptxas = Vec::new();
    // --report uses ptxas when it is there; --ptxas-stats needs it.
    let exe = match smelt_codegen::ptxas::find() {
        Some(exe) => Some(exe),
        None if o.ptxas_stats => {
            bail!("--ptxas-stats needs ptxas: pip install nvidia-cuda-nvcc-cu12 and set SMELT_PTXAS to its nvidia/cuda_nvcc/bin/ptxas, or put it on PATH")
        }
        None => None,
    };
    if let Some(exe) = exe.filter(|_| o.ptxas_stats || o.report) {
        let bar = super::bar(sources.len(), "{spinner} ptxas {bar:30} {pos}/{len}", o.json);
        for c in kernels {
            ptxas.extend(smelt_codegen::ptxas::stats(&exe, &c.ptx, &o.sm)?);
            bar.inc(1);
        }
        bar.finish_and_clear();
    }

    let title = format!("smelt compile {}{}", model.model, model.batch.map_or(String::new(), |b| format!(" --batch {b}")));
    if let Some(dir) = &o.out {
        build.write(dir, &model.model, &title, o.weights)?;
        if o.ptxas_stats {
            let path = dir.join("ptxas.json");
            std::fs::write(&path, serde_json::to_string_pretty(&ptxas)?).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    let spilling = ptxas.iter().filter(|s| s.spill_stores + s.spill_loads > 0).count();
    let gpu = model.train.gpu();
    let report = o.report.then(|| smelt::roofline::report(program, &gpu, &ptxas));
    if let (Some(r), Some(path)) = (&report, &o.svg) {
        let title = format!("{}: every launch on the {} roofline (estimate)", model.model, gpu.model);
        std::fs::write(path, smelt::roofline::svg(&title, r)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if o.json {
        let mut v = build.json(&model.model, o.out.as_deref());
        v["ptxas"] = serde_json::to_value(o.ptxas_stats.then_some(&ptxas))?;
        v["report"] = serde_json::to_value(&report)?;
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
    if let Some(r) = &report {
        outln!("{}", smelt::roofline::text(r));
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
