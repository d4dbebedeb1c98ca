//! `smelt fit`: the fastest training recipe under a memory limit (see
//! [`smelt::fit`]), printed with where its bytes go and the recipes it beat.

use crate::FitArgs;
use anyhow::{bail, Context, Result};
use smelt::fit::{Candidate, Outcome, Request, Verdict};
use smelt::report::human_bytes;
use smelt::spec::Choice as _;

/// `smelt fit`.
pub fn run(a: &FitArgs) -> Result<bool> {
    let bar = super::bar(0, "{spinner} {msg} [{elapsed}]", a.json);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar.set_message(format!("compiling and planning {} at micro-batch {}", a.model, a.batch));
    let mut tried = 0;
    let (request, optimizer) = a.spec()?.request()?;
    let f = smelt::fit::Fitting::run(request, optimizer, &mut |c: &Candidate| {
        tried += 1;
        bar.set_message(format!("{tried} recipes tried; last: {} {}x{}: {}", c.precision, c.micro_batch, c.accumulate, verdict(c)));
    })
    .with_context(|| format!("cannot fit {}", a.model))?;
    bar.finish_and_clear();
    if let (Some(path), Some(r)) = (&a.save_recipe, &f.recipe) {
        std::fs::write(path, serde_json::to_string_pretty(r)? + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&f.json())?);
    } else {
        print_text(a, &f.request, &f.outcome, a.batch, &f.optimizer)?;
    }
    if f.recipe.is_none() {
        bail!("{}", f.nothing_fits());
    }
    Ok(true)
}

/// A candidate's verdict in a few words.
fn verdict(c: &Candidate) -> String {
    match &c.verdict {
        Verdict::Fits if c.remat.is_some() => format!("fits by recomputation, {}", human_bytes(c.total_bytes)),
        Verdict::Fits => format!("fits, {}", human_bytes(c.total_bytes)),
        Verdict::PersistentOverLimit => format!("weights and state alone take {}", human_bytes(c.persistent_bytes)),
        Verdict::RematCannotReach { smallest_arena } => {
            format!("over: {} at best, recomputing", human_bytes(smallest_arena + c.persistent_bytes))
        }
        Verdict::Slower { without_remat } => {
            format!("over; not recomputed: {:.2} ms even without recomputation", without_remat * 1e3)
        }
        Verdict::Refused { reason } => reason.clone(),
    }
}

fn print_text(a: &FitArgs, req: &Request, out: &Outcome, batch: usize, optimizer: &str) -> Result<()> {
    let g = &out.gpu;
    outln!(
        "smelt fit {}: batch {batch}, {optimizer}, memory limit {}, timed on the {} roofline ({:.1} TFLOP/s FP32, {:.2} TB/s)",
        req.spec,
        human_bytes(a.memory_limit),
        g.model,
        g.flops / 1e12,
        g.bandwidth / 1e12
    );
    let n = &out.search;
    outln!(
        "decided in {:.1} s with no device run: {} recipes compiled and planned ({:.1} s), {} recomputed ({:.1} s), {} ruled out unplanned (smaller micro-batches {}, slower than a fit {})\n",
        out.decision_seconds,
        n.planned,
        n.plan_seconds,
        n.recomputed,
        n.recompute_seconds,
        n.bounded_smaller + n.bounded_slower,
        n.bounded_smaller,
        n.bounded_slower
    );
    if req.gpus > 1 {
        outln!(
            "data parallel over {} GPUs, sharding {} (ZeRO-style): A PLAN, NOT RUN (smelt trains on one GPU). Memory and time below are per GPU, {} samples each per optimizer step.\n",
            req.gpus,
            a.shard.name(),
            batch / req.gpus
        );
    }
    if let Some(i) = out.chosen {
        let c = &out.candidates[i];
        print_candidate("recipe", c)?;
        if let Some(r) = &c.remat {
            outln!("  recomputed in backward ({} kernels; each runs just before its first reader):", r.recomputed.len());
            for x in r.recomputed.iter().take(12) {
                outln!("    {:<44} before {}", x.name, x.before);
            }
            if r.recomputed.len() > 12 {
                outln!("    ... {} more (--json lists every one)", r.recomputed.len() - 12);
            }
        }
        if let Some(dp) = &c.data_parallel {
            outln!(
                "  collectives per optimizer step ({:.2} ms on {:.0} GB/s links, not overlapped with compute):",
                dp.communication_seconds * 1e3,
                g.link / 1e9
            );
            for x in &dp.collectives {
                outln!(
                    "    {:<15} {:<24} {:>10} x {} ({} buckets of {})",
                    x.op,
                    x.what,
                    human_bytes(x.bytes),
                    x.times,
                    x.bytes.div_ceil(x.bucket),
                    human_bytes(x.bucket)
                );
            }
        }
        let per_gpu = batch / req.gpus;
        let flags = format!(
            "--train {optimizer} --batch {per_gpu}{}{}{}",
            if c.accumulate > 1 { format!(" --accumulate {}", c.accumulate) } else { String::new() },
            if c.precision != "f32" { format!(" --precision {}", c.precision) } else { String::new() },
            c.remat.as_ref().map_or(String::new(), |r| format!(" --remat-budget {}", r.budget)),
        );
        let replica = if req.gpus > 1 { " (one replica's step; the collectives are not run)" } else { "" };
        outln!("\nuse it: smelt train {} {flags} ...{replica}", req.spec);
        if let Some(p) = &a.save_recipe {
            outln!("   or: smelt train {} --recipe {} ... (written; `smelt plan --recipe` shows the same plan)", req.spec, p.display());
        }
    }
    let rest: Vec<&Candidate> = out.candidates.iter().enumerate().filter(|(i, _)| Some(*i) != out.chosen).map(|(_, c)| c).collect();
    if !rest.is_empty() {
        outln!("\nrejected:");
        outln!("  {:<11} {:>12} {:>12} {:>12}  why", "precision", "micro x acc", "memory", "step");
        let best = out.chosen.map(|i| out.candidates[i].step_seconds);
        for c in rest {
            let why = match (&c.verdict, best) {
                (Verdict::Fits, Some(b)) => format!("fits, but {:.1}% slower", (c.step_seconds / b - 1.0) * 100.0),
                _ => verdict(c),
            };
            let time = if c.fits() { format!("{:.2} ms", c.step_seconds * 1e3) } else { "-".into() };
            outln!(
                "  {:<11} {:>12} {:>12} {:>12}  {why}",
                c.precision,
                format!("{} x {}", c.micro_batch, c.accumulate),
                human_bytes(c.total_bytes),
                time
            );
        }
    }
    if let Some(c) = &out.smallest {
        outln!();
        print_candidate("nothing fits; the smallest footprint found (recomputing all it can)", c)?;
    }
    Ok(())
}

fn print_candidate(title: &str, c: &Candidate) -> Result<()> {
    let b = &c.breakdown;
    let acc = if c.accumulate > 1 { format!(" x accumulate {}", c.accumulate) } else { " (no accumulation)".into() };
    outln!("{title}: micro-batch {}{acc}, precision {}", c.micro_batch, c.precision);
    match &c.remat {
        Some(r) => outln!(
            "  recomputation: {} kernels, arena {} -> {} (budget {}), chosen by the {} solver{}",
            r.recomputed.len(),
            human_bytes(r.arena_before),
            human_bytes(r.arena_after),
            human_bytes(r.budget),
            r.solver.name(),
            super::plan::remat_bound(r)
        ),
        None => outln!("  recomputation: none"),
    }
    outln!(
        "  predicted step: {:.2} ms, {:.1} GFLOP; recomputation {:.1} GFLOP: {:.1}% of the step's FLOPs, {:.1}% of the forward pass's",
        c.step_seconds * 1e3,
        c.step_flops as f64 / 1e9,
        c.recompute_flops as f64 / 1e9,
        100.0 * c.recompute_flops as f64 / c.step_flops.max(1) as f64,
        100.0 * c.recompute_flops as f64 / c.forward_flops.max(1) as f64
    );
    outln!(
        "  device memory: {} = persistent {} + arena {}",
        human_bytes(c.total_bytes),
        human_bytes(c.persistent_bytes),
        human_bytes(c.arena_bytes)
    );
    if let Some(dp) = &c.data_parallel {
        outln!(
            "    sharded over {} GPUs: persistent {} on one GPU -> {} on each (with the gathered parameters, under --shard parameters)",
            dp.gpus,
            human_bytes(dp.unsharded_persistent_bytes),
            human_bytes(c.persistent_bytes)
        );
    }
    outln!(
        "    persistent: parameters {}, optimizer state {}, accumulators {}, frozen {}, other {}",
        human_bytes(b.parameters.bytes),
        human_bytes(b.optimizer_state.bytes),
        human_bytes(b.accumulators.bytes),
        human_bytes(b.frozen.bytes),
        human_bytes(b.other_state.bytes)
    );
    outln!(
        "    arena at its peak ({}): saved activations {}, recomputed {}, gradients {}, temporaries {}, batch {}",
        b.peak_phase,
        human_bytes(b.saved_activations.bytes),
        human_bytes(b.recomputed.bytes),
        human_bytes(b.gradients.bytes),
        human_bytes(b.temporaries.bytes),
        human_bytes(b.batch.bytes)
    );
    Ok(())
}
