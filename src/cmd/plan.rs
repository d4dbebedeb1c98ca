//! `smelt plan`: the memory plan with fusion and without, its picture, and
//! the memory limit.

use crate::Open as _;
use crate::PlanArgs;
use anyhow::{Context, Result};
use smelt::plan::MemoryReport;
use smelt::report::human_bytes;
use smelt::spec::{Choice as _, ModelSpec};

/// `smelt plan`.
pub fn run(a: &PlanArgs) -> Result<bool> {
    let mut model = a.model.spec()?;
    model.apply_recipe()?;
    model.split_limit = a.memory_limit;
    let model = &model;
    let p = smelt::plan::Planning::new(model.session()?)?;
    if let Some(path) = &a.svg {
        let train = model.train.optimizer.map_or(String::new(), |o| format!(" --train {}", o.name()));
        let title = format!("smelt plan {}{}{train}", model.model, model.batch.map_or(String::new(), |b| format!(" --batch {b}")));
        std::fs::write(path, p.svg(&title)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let t = &p.session.timings;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&p.json(&model.model, model.batch))?);
    } else {
        print_text(a, model, &p.report, &p.without_fusion, &p.compiled.stats)?;
        if let (Some(t), Some(tr)) = (&p.training, &p.session.train) {
            print_training(model, t, tr, p.compiled.remat.as_ref())?;
        }
        if let Some(s) = &p.compiled.split {
            print_split(s)?;
        }
    }
    if a.timings {
        errln!(
            "timings: import {:.1} ms, passes {:.1} ms, plan {:.1} ms, check {:.1} ms",
            t.import * 1e3,
            t.passes * 1e3,
            t.plan * 1e3,
            t.check * 1e3
        );
    }
    if let Some(limit) = a.memory_limit {
        p.check_limit(limit)?;
    }
    Ok(true)
}

fn print_text(
    a: &PlanArgs,
    model: &ModelSpec,
    report: &MemoryReport,
    plain_report: &MemoryReport,
    stats: &smelt_passes::pipeline::Stats,
) -> Result<()> {
    outln!("model: {}{}\n", model.model, model.batch.map_or(String::new(), |b| format!(" (batch {b})")));
    let cols: Vec<&MemoryReport> = if model.no_fuse { vec![plain_report] } else { vec![report, plain_report] };
    let head: Vec<&str> = if model.no_fuse { vec!["without fusion"] } else { vec!["with fusion", "without fusion"] };
    outln!("{:<34}{}", "", head.iter().map(|h| format!("{h:>18}")).collect::<String>());
    let row = |label: &str, f: &dyn Fn(&MemoryReport) -> String| -> Result<()> {
        outln!("{label:<34}{}", cols.iter().map(|r| format!("{:>18}", f(r))).collect::<String>());
        Ok(())
    };
    row("weights", &|r| human_bytes(r.weights_bytes))?;
    row("kernels", &|r| r.kernels.to_string())?;
    row("naive activations", &|r| human_bytes(r.naive_activation_bytes))?;
    row("lower bound (live bytes at peak)", &|r| human_bytes(r.lower_bound_bytes))?;
    row("arena", &|r| human_bytes(r.arena_bytes))?;
    row("arena / lower bound", &|r| format!("{:.4}", r.arena_over_lower_bound))?;
    row("arena / naive", &|r| format!("{:.3}", r.arena_over_naive))?;
    row("schedule", &|r| r.schedule.clone())?;
    if model.precision != smelt_passes::precision::Policy::F32 {
        let per = |m: &std::collections::BTreeMap<String, usize>| {
            m.iter().map(|(d, b)| format!("{d} {}", human_bytes(*b))).collect::<Vec<_>>().join(", ")
        };
        outln!("\nprecision {} (with fusion):", model.precision);
        outln!("  weights by dtype       {}", per(&report.weights_by_dtype));
        outln!("  activations by dtype   {}  (every value once)", per(&report.activations_by_dtype));
        outln!("  cast kernels           {}  (casts nothing could absorb)", report.cast_kernels);
        if let Some(p) = &stats.precision {
            let mut kept: Vec<String> = p.kept_f32.iter().map(|k| format!("{} ({}: {})", k.node, k.op, k.reason)).collect();
            if kept.len() > 8 {
                // Many layers: counts per op and reason (`--json` lists every node).
                let mut by: std::collections::BTreeMap<(String, String), usize> = Default::default();
                for k in &p.kept_f32 {
                    *by.entry((k.op.clone(), k.reason.clone())).or_default() += 1;
                }
                kept = by.into_iter().map(|((op, why), n)| format!("{n} x {op} ({why})")).collect();
            }
            outln!("  computed in f32        {}", if kept.is_empty() { "nothing".to_string() } else { kept.join(", ") });
        }
    }
    outln!(
        "\nschedules tried: {}",
        report.schedules.iter().map(|c| format!("{} {}", c.name, human_bytes(c.lower_bound))).collect::<Vec<_>>().join(", ")
    );
    outln!("peak at step {} (node \"{}\"), largest tensors live there:", report.peak_step, report.peak_node);
    for l in &report.peak_live {
        outln!("  {:<40} {:>10}  {}", l.name, human_bytes(l.bytes), l.ty);
    }
    outln!("\nthe arena holds every activation, graph inputs and outputs included; weights are separate. Checked: no two live buffers overlap.");
    if let Some(p) = &a.svg {
        outln!("picture: {}", p.display());
    }
    Ok(())
}

/// Split execution in words: each split, what it runs in parts and what it
/// saved and costs.
fn print_split(s: &smelt::SplitReport) -> Result<()> {
    use smelt::passes::split::How;
    let why = s.limit.map_or("--min-memory".to_string(), |l| format!("--memory-limit {}", human_bytes(l)));
    let gflop = |f: usize| f as f64 / 1e9;
    outln!(
        "\nsplit execution ({why}): arena {} -> {} in {} split{}, {:.3} GFLOP recomputed ({:.1}% of the model's {:.2} GFLOP)",
        human_bytes(s.arena_before),
        human_bytes(s.arena_after),
        s.splits.len(),
        if s.splits.len() == 1 { "" } else { "s" },
        gflop(s.extra_flops),
        100.0 * s.extra_flops as f64 / s.flops_before.max(1) as f64,
        gflop(s.flops_before)
    );
    for (i, sp) in s.splits.iter().enumerate() {
        let span = if sp.nodes.len() == 1 {
            format!("\"{}\"", sp.exit)
        } else {
            format!("{} kernels, \"{}\" .. \"{}\"", sp.nodes.len(), sp.nodes[0], sp.exit)
        };
        let how = match sp.how {
            How::Batch => format!("runs once per slice of the batch ({} slices) and writes its slice of \"{}\" in place", sp.parts, sp.exit),
            How::Rows => format!(
                "computes \"{}\" in {} bands of rows, each from the rows of \"{}\" its receptive field needs ({:.3} GFLOP of halo rows computed twice)",
                sp.exit,
                sp.parts,
                sp.entry,
                gflop(sp.extra_flops)
            ),
        };
        outln!(
            "  {}. {span} {how}: arena {} -> {} (steps {}..{})",
            i + 1,
            human_bytes(sp.arena_before),
            human_bytes(sp.arena_after),
            sp.steps.0,
            sp.steps.1
        );
    }
    outln!("  only one part's intermediates are alive at a time; outputs are unchanged. Checked: no two live buffers overlap.");
    Ok(())
}

fn print_training(
    model: &ModelSpec,
    t: &smelt::plan::TrainBreakdown,
    tr: &smelt::Training,
    remat: Option<&smelt::RematReport>,
) -> Result<()> {
    use smelt::plan::Bytes;
    let opt = model.train.optimizer.map_or("?", |o| o.name());
    let k = model.train.accumulate.max(1);
    let micro = if k > 1 { format!(", micro-steps of 1/{k} of the batch") } else { String::new() };
    outln!("\ntraining step ({opt}, {} parameters trained{micro})", tr.step.params.len());
    outln!("{}", smelt::train::initializers_summary(&tr.step.initializers));
    outln!("where the bytes go (with fusion)");
    let line = |label: &str, b: &Bytes, what: &str| -> Result<()> {
        let dt: Vec<String> = b.by_dtype.iter().map(|(d, n)| format!("{d} {}", human_bytes(*n))).collect();
        outln!("  {label:<22}{:>12}  {:<28}{what}", human_bytes(b.bytes), dt.join(", "));
        Ok(())
    };
    outln!("persistent (outside the arena): {}", human_bytes(t.persistent_bytes));
    line("parameters", &t.parameters, &format!("{} tensors, f32 master weights", t.parameters.count))?;
    line("optimizer state", &t.optimizer_state, &format!("{} tensors", t.optimizer_state.count))?;
    line(
        "accumulators",
        &t.accumulators,
        if t.accumulators.count > 0 { "gradient sums over the micro-batches" } else { "none without --accumulate" },
    )?;
    line("frozen", &t.frozen, "initializers not trained, running statistics")?;
    line("other state", &t.other_state, "the step counter, running statistics of training-mode batch norms")?;
    outln!(
        "arena: {} at its peak, step {} ({}; backward starts at step {})",
        human_bytes(t.arena_bytes),
        t.peak_step,
        t.peak_phase,
        t.backward_starts_at
    );
    line("saved activations", &t.saved_activations, "forward values backward still reads")?;
    line("gradients", &t.gradients, &format!("not yet applied (all kept would be {})", human_bytes(t.gradients_if_all_kept)))?;
    if t.recomputed.bytes > 0 {
        line("recomputed", &t.recomputed, "forward values recomputed in backward")?;
    }
    line("temporaries", &t.temporaries, "activation gradients, backward scratch")?;
    line("batch", &t.batch, "inputs and labels")?;
    outln!("total device memory: {} (persistent + arena)", human_bytes(t.total_bytes));
    if let Some(r) = remat {
        outln!(
            "recomputation (--remat-budget {}): {} kernels run again in backward, arena {} -> {}, {:.2} GFLOP ({:.3} ms on the {} roofline), chosen by the {} solver{}",
            human_bytes(r.budget),
            r.recomputed.len(),
            human_bytes(r.arena_before),
            human_bytes(r.arena_after),
            r.flops as f64 / 1e9,
            r.cost_seconds * 1e3,
            model.train.gpu().name,
            r.solver.name(),
            remat_bound(r)
        );
    }
    Ok(())
}

/// The exact solver's bound, in words (empty for the greedy walk).
pub(crate) fn remat_bound(r: &smelt::RematReport) -> String {
    match (r.lower_bound_seconds, r.proven) {
        (Some(b), Some(true)) if r.solver == smelt::RematSolver::Exact => {
            format!(" (optimal in its model: no choice costs under {:.3} ms)", b * 1e3)
        }
        (Some(b), Some(false)) if r.solver == smelt::RematSolver::Exact => {
            format!(" (its time limit passed: no choice costs under {:.3} ms; the best found is kept)", b * 1e3)
        }
        (_, Some(_)) => " (the exact solver's choice did not fit: the greedy walk's)".to_string(),
        _ => String::new(),
    }
}
