//! Layer normalization spelled out. Exports below opset 17 (optimum's
//! default is 14) write LayerNorm as
//! `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta`,
//! nine ops and two reductions. This pass finds that form after `fuse` and
//! makes it one `layer_norm`, as ONNX Runtime's LayerNormFusion does, so it
//! gets the layer norm kernel (one pass over each row, statistics in f32,
//! the residual add before it read as a prologue) and the precision
//! policy's treatment of normalizations. The square may be `pow(d, 2)` or
//! `d * d`; `gamma` and `beta` are optional, but when present hold one value
//! per normalized element. Any intermediate used elsewhere, or a graph
//! output: the graph is left as it is.

use crate::{HashMap, HashSet};
use smelt_ir::{BinaryOp, IrError, KernelGraph, NodeId, Op, OpSet, ReduceOp, Tensor, UnaryOp, ValueId};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Spelled-out layer norms made one op.
    pub fused: usize,
}

/// One match: the op and its operands; the node it replaces; the nodes it absorbs.
struct Match {
    axis: usize,
    epsilon: f32,
    x: ValueId,
    scale: Option<ValueId>,
    bias: Option<ValueId>,
    absorbed: Vec<NodeId>,
}

/// Fuses the spelled-out layer norms of `g`.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let mut found: HashMap<NodeId, Match> = HashMap::default();
    for id in g.node_ids() {
        if let Some((last, m)) = matched(g, id, &outputs) {
            found.insert(last, m);
        }
    }
    if found.is_empty() {
        return Ok(Stats::default());
    }
    let absorbed: HashSet<NodeId> = found.values().flat_map(|m| m.absorbed.iter().copied()).collect();
    let out = crate::rebuild(g, &absorbed, |out, id, map| {
        let Some(m) = found.get(&id) else { return Ok(None) };
        let x = map[&m.x];
        let scale = match m.scale {
            Some(s) => map[&s],
            None => {
                let ty = out.ty(x).clone();
                let ones = Tensor::from_f32(ty.shape[m.axis..].to_vec(), vec![1.0; ty.shape[m.axis..].iter().product()]);
                out.add_constant(format!("{}.scale", g.node(id).name), ones.cast(ty.dtype))
            }
        };
        let ins: Vec<ValueId> = [x, scale].into_iter().chain(m.bias.map(|b| map[&b])).collect();
        let new = out.add(Op::LayerNorm { axis: m.axis, epsilon: m.epsilon }, g.node(id).name.clone(), &ins)?;
        out.set_origin(new, g.origins(m.absorbed.iter().chain([&id])));
        Ok(Some(new))
    })?;
    let stats = Stats { fused: found.len() };
    *g = out;
    Ok(stats)
}

fn op(g: &KernelGraph, n: NodeId) -> Option<&Op> {
    g.node(n).op.semantic()
}

/// The value of a one-element constant.
fn scalar(g: &KernelGraph, v: ValueId) -> Option<f32> {
    let w = g.weight(v.node).filter(|_| g.node(v.node).op.is_constant())?;
    (w.ty().numel() == 1).then(|| w.to_f32_vec()[0])
}

/// The other operand of binary node `n`, whose operand `v` is.
fn other(g: &KernelGraph, n: NodeId, v: ValueId) -> Option<ValueId> {
    match g.inputs_of(n).as_slice() {
        [a, b] if *a == v => Some(*b),
        [a, b] if *b == v => Some(*a),
        _ => None,
    }
}

fn is_binary(g: &KernelGraph, n: NodeId, b: BinaryOp) -> bool {
    op(g, n) == Some(&Op::Binary(b))
}

/// The match whose first mean is `m1`, with the node it replaces.
fn matched(g: &KernelGraph, m1: NodeId, outputs: &HashSet<NodeId>) -> Option<(NodeId, Match)> {
    let Some(Op::Reduce { op: ReduceOp::Mean, axes, keepdims: true }) = op(g, m1) else { return None };
    let x = g.inputs_of(m1)[0];
    let xt = g.ty(x).clone();
    let rank = xt.shape.len();
    let axis = *axes.first()?;
    if *axes != (axis..rank).collect::<Vec<_>>() || xt.dtype != g.node(m1).outputs[0].dtype || !xt.dtype.is_float() {
        return None;
    }
    let out = |n: NodeId| ValueId { node: n, slot: 0 };
    // Each intermediate is used by the next op only (`d` by the square and the division).
    let single = |n: NodeId| -> Option<NodeId> {
        let users = g.users_of(n);
        (users.len() == 1 && !outputs.contains(&n)).then(|| users[0])
    };
    let d = single(m1)?;
    if !is_binary(g, d, BinaryOp::Sub) || g.inputs_of(d) != [x, out(m1)] || outputs.contains(&d) {
        return None;
    }
    let mut d_users = g.users_of(d);
    d_users.sort();
    d_users.dedup();
    let (sq, div) = match d_users.as_slice() {
        [a, b] if is_binary(g, *b, BinaryOp::Div) => (*a, *b),
        [a, b] if is_binary(g, *a, BinaryOp::Div) => (*b, *a),
        _ => return None,
    };
    let squares = (is_binary(g, sq, BinaryOp::Pow) && g.inputs_of(sq)[0] == out(d) && scalar(g, g.inputs_of(sq)[1]) == Some(2.0))
        || (is_binary(g, sq, BinaryOp::Mul) && g.inputs_of(sq) == [out(d), out(d)]);
    let v = single(sq)?;
    if !squares || op(g, v) != Some(&Op::Reduce { op: ReduceOp::Mean, axes: axes.clone(), keepdims: true }) {
        return None;
    }
    let e = single(v)?;
    let epsilon = scalar(g, other(g, e, out(v))?)?;
    let s = single(e)?;
    if !is_binary(g, e, BinaryOp::Add) || op(g, s) != Some(&Op::Unary(UnaryOp::Sqrt)) || single(s)? != div {
        return None;
    }
    if g.inputs_of(div) != [out(d), out(s)] || epsilon.is_nan() || epsilon < 0.0 {
        return None;
    }
    let mut absorbed = vec![m1, d, sq, v, e, s];
    let mut last = div;
    // One value per normalized element, of x's dtype.
    let norm = &xt.shape[axis..];
    let per_element = |p: ValueId| {
        let t = g.ty(p);
        t.dtype == xt.dtype && t.numel() == norm.iter().product::<usize>() && smelt_ir::broadcast(&t.shape, norm).as_deref() == Some(norm)
    };
    let affine = |b: BinaryOp, last: &mut NodeId, absorbed: &mut Vec<NodeId>| -> Option<ValueId> {
        let next = single(*last).filter(|&n| is_binary(g, n, b))?;
        // Not a value of the pattern itself (a rank-1 x's difference is per element too).
        let p = other(g, next, out(*last)).filter(|&p| per_element(p) && p.node != *last && !absorbed.contains(&p.node))?;
        absorbed.push(std::mem::replace(last, next));
        Some(p)
    };
    let scale = affine(BinaryOp::Mul, &mut last, &mut absorbed);
    let bias = scale.and_then(|_| affine(BinaryOp::Add, &mut last, &mut absorbed));
    (g.node(last).outputs[0] == xt).then_some((last, Match { axis, epsilon, x, scale, bias, absorbed }))
}
