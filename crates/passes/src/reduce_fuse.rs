//! Elementwise prologues into reductions: when the only user of an
//! elementwise kernel is a global average pool, a reduce or a softmax, the
//! reduction computes the expression on the fly and the intermediate never
//! reaches memory (DenseNet's final BatchNorm + ReLU into its pooling).
//! Then a cast that is the only reader of a softmax or layer norm whose
//! prologue ends by widening to f32 (the mixed-precision policies' form):
//! the reduction stores the cast's dtype itself, its statistics still f32
//! in registers, so the f32 copy of the hidden states never exists.

use crate::{HashMap, HashSet};
use smelt_ir::{DType, Expr, ExprNode, IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, Reducer, ValueId};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Reductions that absorbed their elementwise producer.
    pub fused: usize,
    /// Reductions that absorbed the cast after them.
    pub casts: usize,
}

/// Fuses elementwise producers into the reductions of `g`.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    // reduction -> its producer, when the producer can be absorbed.
    let mut absorb: HashMap<NodeId, NodeId> = HashMap::default();
    for id in g.node_ids() {
        if g.node(id).op.semantic().is_none_or(|op| Reducer::of(op).is_none()) {
            continue;
        }
        let x = g.inputs_of(id)[0];
        let p = g.node(x.node);
        let float_inputs = g.inputs_of(x.node).iter().all(|v| g.ty(*v).dtype.is_float()) && p.outputs[0].dtype.is_float();
        if float_inputs
            && Expr::of_kernel(&p.op, g.inputs_of(x.node).len()).is_some()
            && g.users_of(x.node).len() == 1
            && !outputs.contains(&x.node)
        {
            absorb.insert(id, x.node);
        }
    }
    let absorbed: HashSet<NodeId> = absorb.values().copied().collect();
    let out = crate::rebuild(g, &absorbed, |out, id, map| {
        let Some(&p) = absorb.get(&id) else { return Ok(None) };
        let pins = g.inputs_of(p);
        let expr = Expr::of_kernel(&g.node(p).op, pins.len()).expect("checked above");
        let reduction = g.node(id).op.semantic().and_then(smelt_ir::Reducer::of).expect("a reduction that takes a prologue, checked above");
        // The prologue's inputs, then the reduction's own operands.
        let ins: Vec<ValueId> = pins.iter().chain(&g.inputs_of(id)[1..]).map(|v| map[v]).collect();
        let new = out.add(KernelOp::FusedReduction { expr, reduction }, g.node(id).name.clone(), &ins)?;
        out.set_origin(new, [g.origin(p), g.origin(id)].concat());
        Ok(Some(new))
    })?;
    let fused = absorb.len();
    *g = out;
    let casts = fuse_casts(g, &outputs)?;
    Ok(Stats { fused, casts })
}

/// Fuses casts into the reductions before them; returns how many.
fn fuse_casts(g: &mut KernelGraph, outputs: &HashSet<NodeId>) -> Result<usize, IrError> {
    // cast -> (reduction, its prologue without the widening).
    let mut found: HashMap<NodeId, (NodeId, Expr)> = HashMap::default();
    for c in g.node_ids() {
        let KernelOp::Op(Op::Cast { to }) = g.node(c).op else { continue };
        let x = g.inputs_of(c)[0];
        let KernelOp::FusedReduction { expr, reduction } = &g.node(x.node).op else { continue };
        let normalizes = match reduction {
            Reducer::LayerNorm { .. } | Reducer::Softmax { .. } | Reducer::LogSoftmax { .. } => true,
            Reducer::GlobalAveragePool | Reducer::Reduce { .. } => false,
        };
        let n = expr.nodes.len();
        let widened = n >= 2 && expr.nodes[n - 1] == ExprNode::Cast(DType::F32, n - 2);
        if !normalizes || !widened || !to.is_float() || g.users_of(x.node).len() != 1 || outputs.contains(&x.node) {
            continue;
        }
        let mut narrow = expr.clone();
        narrow.nodes.pop();
        let dtypes: Vec<DType> = g.inputs_of(x.node).iter().map(|v| g.ty(*v).dtype).collect();
        if narrow.dtype(&dtypes).ok() == Some(to) {
            found.insert(c, (x.node, narrow));
        }
    }
    let absorbed: HashSet<NodeId> = found.values().map(|(r, _)| *r).collect();
    let out = crate::rebuild(g, &absorbed, |out, id, map| {
        let Some((r, expr)) = found.get(&id) else { return Ok(None) };
        let KernelOp::FusedReduction { reduction, .. } = &g.node(*r).op else { unreachable!("matched above") };
        let op = KernelOp::FusedReduction { expr: expr.clone(), reduction: reduction.clone() };
        let ins: Vec<ValueId> = g.inputs_of(*r).iter().map(|v| map[v]).collect();
        let new = out.add(op, g.node(*r).name.clone(), &ins)?;
        out.set_origin(new, [g.origin(*r), g.origin(id)].concat());
        Ok(Some(new))
    })?;
    *g = out;
    Ok(found.len())
}
