//! Mixed precision: a policy that stores and computes most of the graph in
//! f16 or bf16 (kernels accumulate in f32 registers) and keeps f32 where
//! accuracy needs it.
//!
//! Runs after the e-graph fusion, so batch norms are already folded into
//! convolution weights in f32, and each weight is converted once, here.
//! Every node with a float output gets a precision:
//! - f32 under the mixed policies: softmax and log-softmax, layer and batch
//!   normalization, reductions (global average pool, reduce), the final
//!   classifier layer (the last conv, GEMM or matmul before each output) and
//!   any node the user names (`keep_f32`: an op type such as `softmax` or
//!   `conv`, or a node name; `*` matches any run of characters);
//! - the input's precision for data movement that does no arithmetic
//!   (views, concat, transpose, max pooling, pad, slice, gather...);
//! - half for everything else.
//!
//! A float operand whose precision differs from its consumer's is a weight
//! (converted at compile time, once per precision) or an activation (a
//! `cast` node, one per value and precision, shared by consumers), except
//! a half first operand of an f32 convolution or GEMM, which the kernel
//! widens as it loads it. Graph inputs and outputs keep their dtypes: a
//! model still takes and returns f32. The casts are elementwise ops, so
//! `ew-cluster` and `reduce-fuse` fold them into neighbouring kernels; a
//! cast between two kernels that cannot absorb one stays a kernel of its
//! own. So does the graph input's narrowing before the first layer, on
//! purpose: its half copy lets the f32 input die before the layer runs.

use crate::HashMap;
use smelt_ir::traits::{Kind, Precision};
use smelt_ir::{DType, IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};
use std::sync::Arc;

/// A precision policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Everything as imported.
    #[default]
    F32,
    /// Every float op in f16.
    F16,
    /// Every float op in bf16.
    Bf16,
    /// f16, with f32 where accuracy needs it.
    MixedF16,
    /// bf16, with f32 where accuracy needs it.
    MixedBf16,
}

impl Policy {
    /// Every policy, as the CLI spells them.
    pub const NAMES: [&'static str; 5] = ["f32", "f16", "bf16", "mixed-f16", "mixed-bf16"];

    /// The half dtype of the policy (`None` for f32).
    pub fn half(self) -> Option<DType> {
        match self {
            Policy::F32 => None,
            Policy::F16 | Policy::MixedF16 => Some(DType::F16),
            Policy::Bf16 | Policy::MixedBf16 => Some(DType::BF16),
        }
    }

    /// Whether sensitive ops keep f32.
    pub fn mixed(self) -> bool {
        matches!(self, Policy::MixedF16 | Policy::MixedBf16)
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        Ok(match s {
            "f32" => Policy::F32,
            "f16" => Policy::F16,
            "bf16" => Policy::Bf16,
            "mixed-f16" => Policy::MixedF16,
            "mixed-bf16" => Policy::MixedBf16,
            _ => return Err(format!("unknown precision {s:?}: one of {}", Policy::NAMES.join(", "))),
        })
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = [Policy::F32, Policy::F16, Policy::Bf16, Policy::MixedF16, Policy::MixedBf16].iter().position(|p| p == self).unwrap_or(0);
        f.write_str(Policy::NAMES[i])
    }
}

/// Options of the pass.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The policy.
    pub policy: Policy,
    /// Op types or node names (with `*` wildcards) kept in f32.
    pub keep_f32: Vec<String>,
    /// Which f32 products run in TF32 on tensor cores (the kernel graph
    /// carries it: `Graph::tf32`).
    pub tf32: smelt_ir::Tf32,
}

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// The policy.
    pub policy: Policy,
    /// Nodes computing in half precision.
    pub half_nodes: usize,
    /// Float nodes kept in f32, each with its reason.
    pub kept_f32: Vec<Kept>,
    /// Cast nodes inserted on activations.
    pub casts_inserted: usize,
    /// Weights converted to another precision.
    pub weights_converted: usize,
}

/// A node kept in f32 and why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Kept {
    /// The node.
    pub node: String,
    /// Its op.
    pub op: String,
    /// `sensitive op`, `classifier`, `--keep-f32 PATTERN`.
    pub reason: String,
}

/// Whether `pat` (with `*` wildcards) matches all of `s`, ignoring case.
pub fn glob(pat: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pat.to_lowercase().chars().collect(), s.to_lowercase().chars().collect());
    // Classic two-pointer wildcard match.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < s.len() {
        if i < p.len() && p[i] != '*' && p[i] == s[j] {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(st) = star {
            i = st + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// The last layer before each graph output, walking back through anything
/// that is not a layer (softmax, pooling, views, elementwise).
fn classifiers(g: &KernelGraph) -> Vec<NodeId> {
    let mut found = Vec::new();
    // A training step's updated weights are outputs too: its classifier is the loss's.
    for (_, v) in g.outputs().iter().filter(|(_, v)| g.node(v.node).op.traits().kind != Kind::Update) {
        let mut stack = vec![v.node];
        let mut seen = crate::HashSet::default();
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            let op = &g.node(n).op;
            if op.traits().kind == Kind::Layer {
                found.push(n);
            } else if op.traits().kind == Kind::Normalization {
                // A normalized output (a transformer's final layer norm) has
                // no classifier; the layers before it feed an f32 norm.
            } else if !(op.is_input() || op.is_persistent()) {
                stack.extend(g.inputs_of(n).iter().filter(|v| !g.node(v.node).op.is_persistent()).map(|v| v.node));
            }
        }
    }
    found
}

/// Whether node `id` looks rows up in a float constant (a Gather of an
/// embedding table).
fn embedding(g: &KernelGraph, id: NodeId) -> bool {
    let table = g.inputs_of(id).first().copied();
    matches!(g.node(id).op, KernelOp::Op(Op::Gather { .. }))
        && table.is_some_and(|t| g.node(t.node).op.is_constant() && g.ty(t).dtype.is_float())
}

/// Applies `opts` to `g`.
pub fn run(g: &mut KernelGraph, opts: &Options) -> Result<Stats, IrError> {
    let mut stats = Stats { policy: opts.policy, ..Stats::default() };
    let Some(half) = opts.policy.half() else { return Ok(stats) };
    let classifier = if opts.policy.mixed() { classifiers(g) } else { Vec::new() };
    let order = g.topo_order()?;
    let mut out = KernelGraph::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::default();
    // (original value, dtype) -> the converted weight or the cast.
    let mut converted: HashMap<(ValueId, DType), ValueId> = HashMap::default();
    for id in order {
        let node = g.node(id);
        let ins = g.inputs_of(id);
        let float_out = node.outputs.iter().any(|t| t.dtype.is_float());
        // The precision this node computes in, if it is decided here.
        let keep = |reason: String| Some((DType::F32, Some(reason)));
        let traits = node.op.traits();
        let want: Option<(DType, Option<String>)> = match &node.op {
            // Updates read f32 gradients and write f32 master weights and state.
            _ if traits.kind == Kind::Update => keep("optimizer update (f32 master weights)".into()),
            _ if traits.precision == Precision::Fixed => None,
            _ if !float_out => {
                // Comparisons and the like: float operands must agree; use f32.
                let floats = ins.iter().filter(|v| g.ty(**v).dtype.is_float()).count();
                (floats > 1).then_some((DType::F32, None))
            }
            _ if opts.policy.mixed() && traits.precision == Precision::Sensitive => keep("sensitive op".into()),
            _ if classifier.contains(&id) => keep("classifier".into()),
            op => match opts.keep_f32.iter().find(|p| {
                let name = op.name();
                glob(p, name) || glob(p, name.trim_start_matches("fused_")) || glob(p, &node.name)
            }) {
                Some(p) => keep(format!("--keep-f32 {p}")),
                // An embedding table is stored half like any weight: a
                // lookup follows it (BERT-large's word embeddings: 60 MiB).
                None if traits.precision == Precision::Follows && !embedding(g, id) => None,
                None => Some((half, None)),
            },
        };
        let mut new_ins = Vec::with_capacity(ins.len());
        for (k, &v) in ins.iter().enumerate() {
            let m = map[&v];
            let have = out.ty(m).dtype;
            // Follow ops take their first float input's precision; concat
            // inputs must agree with it.
            let target = match &want {
                Some((d, _)) => Some(*d),
                None if traits.precision == Precision::Follows && k > 0 && have.is_float() => ins
                    .iter()
                    .map(|u| out.ty(map[u]).dtype)
                    .find(|d| d.is_float())
                    .filter(|_| matches!(node.op, KernelOp::Op(Op::Concat { .. }) | KernelOp::ConcatInPlace { .. })),
                None => None,
            };
            // Convolutions and GEMMs can convert their first operand as they
            // load it. Taken for a widening (half into an f32 layer: no f32
            // copy at all); a narrowing keeps its cast, whose half copy lets
            // the wide value die before the layer runs (the graph input
            // before the first conv: a lower peak for one small launch).
            let absorbs = k == 0 && have.size() <= target.map_or(0, |d| d.size()) && node.op.widens_first_operand();
            let new = match target {
                Some(d) if have.is_float() && have != d && !absorbs => match converted.get(&(v, d)) {
                    Some(&c) => c,
                    None => {
                        // A constant is converted once; a parameter or state
                        // changes between steps, so it is cast where it is read.
                        let constant = g.node(v.node).op.is_constant();
                        let c = match g.weight(v.node).filter(|_| constant) {
                            Some(w) => {
                                stats.weights_converted += 1;
                                out.add_shared_constant(format!("{}.{d}", g.node(v.node).name), Arc::new(w.cast(d)))
                            }
                            // A constant known by name only (a text file's, a
                            // zoo transformer's, when planning): its converted
                            // copy is a weight too, not an activation.
                            None if constant => {
                                stats.weights_converted += 1;
                                out.add_weight_ref(
                                    format!("{}.{d}", g.node(v.node).name),
                                    smelt_ir::TensorType::new(d, g.ty(v).shape.clone()),
                                )
                            }
                            None => {
                                stats.casts_inserted += 1;
                                let name = format!("{}.to_{d}", g.node(v.node).name);
                                // Provenance: the value it converts.
                                let cast = out.add(Op::Cast { to: d }, name, &[m])?;
                                out.set_origin(cast, g.origin(v.node).to_vec());
                                ValueId { node: cast, slot: 0 }
                            }
                        };
                        converted.insert((v, d), c);
                        c
                    }
                },
                _ => m,
            };
            new_ins.push(new);
        }
        let new = out.copy_node_from(g, id, &new_ins)?;
        if float_out {
            match &want {
                Some((d, Some(reason))) if *d == DType::F32 => {
                    stats.kept_f32.push(Kept { node: node.name.clone(), op: node.op.name().to_string(), reason: reason.clone() })
                }
                Some((d, _)) if *d == half => stats.half_nodes += 1,
                _ => {}
            }
        }
        for slot in 0..node.outputs.len() as u32 {
            map.insert(ValueId { node: id, slot }, ValueId { node: new, slot });
        }
    }
    // Graph outputs keep their dtypes.
    let mut outs = Vec::new();
    for (name, v) in g.outputs() {
        let (m, want) = (map[v], g.ty(*v).dtype);
        let m = if out.ty(m).dtype != want && want.is_float() {
            match converted.get(&(*v, want)) {
                Some(&c) => c,
                None => {
                    stats.casts_inserted += 1;
                    let cast = out.add(Op::Cast { to: want }, format!("{name}.to_{want}"), &[m])?;
                    out.set_origin(cast, g.origin(v.node).to_vec());
                    let c = ValueId { node: cast, slot: 0 };
                    converted.insert((*v, want), c);
                    c
                }
            }
        } else {
            m
        };
        outs.push((name.clone(), m));
    }
    out.set_outputs(outs);
    *g = out;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_whole_names_ignoring_case() {
        assert!(glob("softmax", "Softmax"));
        assert!(glob("conv*", "conv_2d_1"));
        assert!(glob("*fc*", "model/fc8/gemm"));
        assert!(!glob("conv", "fused_conv"));
        assert!(glob("*", ""));
        assert!(!glob("a*b", "ac"));
    }
}
