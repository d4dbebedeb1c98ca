//! Elementwise prologues into reductions: when the only user of an
//! elementwise kernel is a global average pool, a reduce or a softmax, the
//! reduction computes the expression on the fly and the intermediate never
//! reaches memory (DenseNet's final BatchNorm + ReLU into its pooling).

use smelt_ir::{Expr, IrError, KernelGraph, KernelOp, NodeId, OpSet, ValueId};
use std::collections::{HashMap, HashSet};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Reductions that absorbed their elementwise producer.
    pub fused: usize,
}

/// Fuses elementwise producers into the reductions of `g`.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    // reduction -> its producer, when the producer can be absorbed.
    let mut absorb: HashMap<NodeId, NodeId> = HashMap::new();
    for id in g.node_ids() {
        if !g.node(id).op.semantic().is_some_and(|op| op.is_fusable_reduction()) {
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
        let reduction = g.node(id).op.semantic().cloned().expect("a semantic reduction, checked above");
        // The prologue's inputs, then the reduction's own operands.
        let ins: Vec<ValueId> = pins.iter().chain(&g.inputs_of(id)[1..]).map(|v| map[v]).collect();
        let new = out.add(KernelOp::FusedReduction { expr, reduction: Box::new(reduction) }, g.node(id).name.clone(), &ins)?;
        out.set_origin(new, [g.origin(p), g.origin(id)].concat());
        Ok(Some(new))
    })?;
    let stats = Stats { fused: absorb.len() };
    *g = out;
    Ok(stats)
}
