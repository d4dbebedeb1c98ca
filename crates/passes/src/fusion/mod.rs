//! Fusion by equality saturation (egg): Conv + BatchNorm folding, Conv +
//! bias + activation, Conv + residual Add (+ ReLU), Gemm/MatMul + bias +
//! activation, BatchNorm as scale-and-shift, identities removed. The
//! extractor then picks the cheapest equivalent graph by bytes moved through
//! global memory and kernel launches (see `cost.rs`).
//!
//! Elementwise chains and trees are merged afterwards by `ew_cluster`, and
//! concatenations marked in place by `concat`; the pipeline runs all three.

mod convert;
mod cost;
pub mod lang;
pub mod rules;

use crate::PassError;
use egg::{Runner, SimpleScheduler};
use smelt_ir::{Graph, KernelGraph, OpSet};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Runner limits: generous for the models we know (ResNet-50 saturates in a
/// handful of iterations), explicit so a pathological graph stops.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most iterations.
    pub iterations: usize,
    /// Most e-nodes.
    pub nodes: usize,
    /// Most wall time.
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { iterations: 32, nodes: 200_000, time: Duration::from_secs(20) }
    }
}

/// What the e-graph run did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Why the runner stopped (`Saturated` is the normal case).
    pub stop_reason: String,
    /// Iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub egraph_nodes: usize,
    /// E-classes at the end.
    pub egraph_classes: usize,
    /// Applications per rule.
    pub rule_hits: BTreeMap<String, usize>,
    /// Kernels before fusion.
    pub kernels_before: usize,
    /// Kernels after (before elementwise clustering).
    pub kernels_after: usize,
    /// Time in the e-graph and extraction, milliseconds.
    pub millis: f64,
}

/// Fuses `graph`: the semantic graph in, the kernel graph out.
pub fn run(graph: &Graph, limits: &Limits) -> Result<(KernelGraph, Stats), PassError> {
    let t = Instant::now();
    let bug = |source| PassError::Bug { pass: "fuse", source };
    let convert::Encoded { egraph, outputs, names, ops_before, classes, node_classes } = convert::encode(graph).map_err(bug)?;
    let runner = Runner::default()
        .with_egraph(egraph)
        .with_scheduler(SimpleScheduler)
        .with_iter_limit(limits.iterations)
        .with_node_limit(limits.nodes)
        .with_time_limit(limits.time)
        .run(&rules::rules());
    let mut stats = Stats {
        stop_reason: format!("{:?}", runner.stop_reason.as_ref().expect("a finished runner has a stop reason")),
        iterations: runner.iterations.len(),
        egraph_nodes: runner.egraph.total_number_of_nodes(),
        egraph_classes: runner.egraph.number_of_classes(),
        kernels_before: ops_before,
        ..Default::default()
    };
    for it in &runner.iterations {
        for (rule, n) in &it.applied {
            *stats.rule_hits.entry(rule.to_string()).or_default() += n;
        }
    }
    let choice = cost::extract(&runner.egraph);
    let fused = convert::decode(&runner.egraph, &choice, &outputs, names, &classes, &node_classes, graph).map_err(bug)?;
    stats.kernels_after = fused.node_ids().filter(|&n| fused.node(n).op.is_kernel()).count();
    stats.millis = t.elapsed().as_secs_f64() * 1e3;
    Ok((fused, stats))
}
