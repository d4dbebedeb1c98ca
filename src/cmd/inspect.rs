//! `smelt inspect`, and `smelt` with no command (the built-in default).

use crate::InspectArgs;
use crate::Open as _;
use anyhow::Result;
use smelt::report::{human_bytes, inspect, Inspect};

/// `smelt` alone: inspect, plan and run the default model.
pub fn default(model: &smelt::spec::ModelSpec) -> Result<bool> {
    let mut s = model.session_with_values()?;
    let compiled = s.compile()?;
    outln!("smelt: {} (built-in, deterministic random weights)\n", model.model);
    print_inspect(&inspect(&s.source, &compiled.graph), &compiled.stats)?;
    let planned = s.plan(&compiled)?;
    outln!(
        "memory plan: arena {} for every activation (lower bound {}, checked), weights {}; `smelt plan` tells more",
        human_bytes(planned.plan.arena),
        human_bytes(planned.plan.lower_bound),
        human_bytes(compiled.graph.weight_bytes())
    );
    outln!();
    let run = super::run::Outputs { inputs: &[], expects: &[], rtol: 1e-3, atol: 1e-7, save: None, json: false };
    let ok = super::run::on_cpu(&compiled.graph, &run, None)?;
    outln!("\nTry `smelt --help`, `smelt inspect MODEL`, `smelt plan MODEL --svg memory.svg`, `smelt run MODEL --expect FILE.pb`.");
    Ok(ok)
}

/// `smelt inspect`.
pub fn run(a: &InspectArgs) -> Result<bool> {
    let mut s = a.model.spec()?.session()?;
    let compiled = s.compile()?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&smelt::report::inspect_json(&s.source, &compiled))?);
    } else {
        outln!("model: {}\n", a.model.model);
        print_inspect(&inspect(&s.source, &compiled.graph), &compiled.stats)?;
    }
    Ok(true)
}

fn print_inspect(r: &Inspect, stats: &smelt_passes::pipeline::Stats) -> Result<()> {
    for p in &r.inputs {
        outln!("input   {:<24} {}{:?}", p.name, p.dtype, p.shape);
    }
    for p in &r.outputs {
        outln!("output  {:<24} {}{:?}", p.name, p.dtype, p.shape);
    }
    outln!("\nparameters        {:>10}  in {} constants", human_bytes(r.parameter_bytes), r.parameters);
    outln!("naive activations {:>10}  (every value in its own buffer)", human_bytes(r.naive_activation_bytes));
    outln!("\n{:<22} {:>6}    {:<22} {:>6}", format!("{} ops before", r.ops), "", format!("{} kernels after", r.kernels), "");
    let sorted = |h: &std::collections::BTreeMap<String, usize>| {
        let mut v: Vec<(String, usize)> = h.iter().map(|(k, v)| (k.clone(), *v)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    };
    let (a, b) = (sorted(&r.op_histogram), sorted(&r.kernel_histogram));
    for i in 0..a.len().max(b.len()) {
        let cell = |v: &[(String, usize)]| v.get(i).map_or(format!("{:29}", ""), |(k, n)| format!("  {k:<20} {n:>6}"));
        outln!("{}    {}", cell(&a), cell(&b));
    }
    if let Some(f) = &stats.fusion {
        outln!("\nfusion: {} iterations, {} e-nodes, stop reason {}, {:.1} ms", f.iterations, f.egraph_nodes, f.stop_reason, f.millis);
    }
    if let Some(l) = stats.layer_norm.as_ref().filter(|l| l.fused > 0) {
        outln!("layer norm: {} spelled out (mean, sub, pow, sqrt, div...) made one op each", l.fused);
    }
    if let Some(v) = stats.views.as_ref().filter(|v| v.chains > 0) {
        outln!("views: {} reshape and transpose chains composed, {} transpose kernels removed", v.chains, v.transposes_removed);
    }
    if let Some(e) = stats.gemm_epilogue.as_ref().filter(|e| e.fused > 0) {
        outln!("gemm epilogue: {} elementwise kernels applied by their products before they store", e.fused);
    }
    if let Some(a) = stats.attention.as_ref().filter(|a| a.blocks > 0) {
        let how = if a.fused == a.blocks { "the scores never reach memory" } else { "the others keep their score tensors" };
        outln!("attention: {} of {} softmax-product blocks fused into one kernel each ({how})", a.fused, a.blocks);
    }
    Ok(())
}
