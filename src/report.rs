//! What `smelt inspect` reports about a graph.

use serde::Serialize;
use smelt_ir::{Graph, KernelGraph, Op, OpSet};
use std::collections::BTreeMap;

/// Shape and dtype of a graph input or output.
#[derive(Clone, Debug, Serialize)]
pub struct Port {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: String,
    /// Static shape.
    pub shape: Vec<usize>,
}

/// The facts `smelt inspect` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Inspect {
    /// Nodes that compute (not inputs or constants).
    pub ops: usize,
    /// Count per op name, e.g. `conv`, before the passes.
    pub op_histogram: BTreeMap<String, usize>,
    /// Kernels after the passes (views and in-place concatenations launch none).
    pub kernels: usize,
    /// Count per op name of the kernels after the passes, e.g. `fused_conv`.
    pub kernel_histogram: BTreeMap<String, usize>,
    /// Number of constants (weights).
    pub parameters: usize,
    /// Bytes of all constants.
    pub parameter_bytes: usize,
    /// Bytes of every value that is not a constant (graph inputs, every
    /// intermediate and the outputs), each in its own buffer.
    pub naive_activation_bytes: usize,
    /// Graph inputs.
    pub inputs: Vec<Port>,
    /// Graph outputs.
    pub outputs: Vec<Port>,
}

/// Inspects a model: `g` as imported, `compiled` after the passes.
pub fn inspect(g: &Graph, compiled: &KernelGraph) -> Inspect {
    let mut kernel_histogram = BTreeMap::new();
    for id in compiled.node_ids() {
        let op = &compiled.node(id).op;
        if op.is_kernel() {
            *kernel_histogram.entry(op.name().to_string()).or_default() += 1;
        }
    }
    let mut op_histogram = BTreeMap::new();
    let (mut ops, mut parameters, mut naive) = (0, 0, 0);
    for id in g.node_ids() {
        let n = g.node(id);
        match n.op {
            Op::Constant | Op::Parameter | Op::State => parameters += 1,
            Op::Input => naive += n.outputs[0].bytes(),
            _ => {
                ops += 1;
                *op_histogram.entry(n.op.name().to_string()).or_default() += 1;
                naive += n.outputs.iter().map(|t| t.bytes()).sum::<usize>();
            }
        }
    }
    let port = |name: &str, t: &smelt_ir::TensorType| Port { name: name.to_string(), dtype: t.dtype.to_string(), shape: t.shape.clone() };
    Inspect {
        ops,
        op_histogram,
        kernels: kernel_histogram.values().sum(),
        kernel_histogram,
        parameters,
        parameter_bytes: g.weight_bytes(),
        naive_activation_bytes: naive,
        inputs: g.inputs().iter().map(|&i| port(&g.node(i).name, &g.node(i).outputs[0])).collect(),
        outputs: g.outputs().iter().map(|(n, v)| port(n, g.ty(*v))).collect(),
    }
}

/// `12.3 MiB`-style sizes.
pub fn human_bytes(b: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", units[u])
    }
}

/// `smelt inspect --json`: [`inspect`] with what each pass did.
pub fn inspect_json(source: &Graph, compiled: &crate::Compiled) -> serde_json::Value {
    let mut v = serde_json::to_value(inspect(source, &compiled.graph)).expect("a report serializes");
    v["passes"] = serde_json::to_value(&compiled.stats).expect("statistics serialize");
    v
}
