//! Elementwise consumers into GEMM epilogues: when the only user of a
//! matrix product (through views only) is an elementwise kernel that reads
//! it at its own shape, the product's kernel applies the expression before
//! it stores, so the product never reaches memory. This is how every
//! exporter's `MatMul` + bias + GELU (erf or tanh, in whatever order of
//! `Div`, `Erf`, `Add`, `Mul` it writes them) and a residual add become
//! one kernel, without a pattern per spelling. A Gemm's own bias (beta 1)
//! joins the expression.

use crate::{HashMap, HashSet};
use smelt_ir::traits::Kind;
use smelt_ir::{BinaryOp, Expr, ExprNode, IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Products that took their consumer as an epilogue.
    pub fused: usize,
}

/// One fusion: the product node, the views after it, the expression.
struct Fusion {
    product: NodeId,
    absorbed: Vec<NodeId>,
    inputs: Vec<ValueId>,
    expr: Expr,
    op: smelt_ir::Product,
}

/// Fuses elementwise consumers into the products of `g`.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let mut found: HashMap<NodeId, Fusion> = HashMap::default();
    let mut taken: HashSet<NodeId> = HashSet::default();
    for id in g.node_ids() {
        if let Some(f) = fusion(g, id, &outputs).filter(|f| !taken.contains(&f.product)) {
            taken.insert(f.product);
            found.insert(id, f);
        }
    }
    if found.is_empty() {
        return Ok(Stats::default());
    }
    let absorbed: HashSet<NodeId> = found.values().flat_map(|f| f.absorbed.iter().copied()).collect();
    let out = crate::rebuild(g, &absorbed, |out, id, map| {
        let Some(f) = found.get(&id) else { return Ok(None) };
        let ins: Vec<ValueId> = f.inputs.iter().map(|v| map[v]).collect();
        let shape = g.node(id).outputs[0].shape.clone();
        let op = KernelOp::GemmEpilogue { product: f.op, expr: f.expr.clone(), shape };
        let new = out.add(op, g.node(f.product).name.clone(), &ins)?;
        out.set_origin(new, g.origins(f.absorbed.iter().chain([&id])));
        Ok(Some(new))
    })?;
    let stats = Stats { fused: found.len() };
    *g = out;
    Ok(stats)
}

/// The fusion whose consumer is elementwise node `e`, if one applies.
fn fusion(g: &KernelGraph, e: NodeId, outputs: &HashSet<NodeId>) -> Option<Fusion> {
    let node = g.node(e);
    let ins = g.inputs_of(e);
    let elementwise =
        matches!(node.op, KernelOp::Elementwise { .. }) || node.op.semantic().is_some_and(|op| op.traits().kind == Kind::Elementwise);
    let out = &node.outputs[0];
    if !elementwise || !out.dtype.is_float() {
        return None;
    }
    let expr = Expr::of_kernel(&node.op, ins.len())?;
    // The first operand that is a product used by this consumer alone
    // (through views), read unbroadcast.
    ins.iter().find_map(|&v| {
        if g.ty(v).shape != out.shape {
            return None;
        }
        let mut absorbed = Vec::new();
        let mut cur = v.node;
        loop {
            let n = g.node(cur);
            let mut users = g.users_of(cur);
            users.sort();
            users.dedup();
            if users.len() != 1 || outputs.contains(&cur) || n.outputs.len() != 1 {
                return None;
            }
            absorbed.push(cur);
            match &n.op {
                KernelOp::Op(op) if op.traits().kind == Kind::View => cur = g.inputs_of(cur)[0].node,
                _ => break,
            }
        }
        let product = cur;
        let pins = g.inputs_of(product);
        let (op, bias) = match &g.node(product).op {
            KernelOp::Op(Op::MatMul) => (smelt_ir::Product::MatMul, None),
            KernelOp::Op(Op::Gemm { trans_a, trans_b, alpha, beta }) => {
                let bias = pins.get(2).copied();
                // The bias joins the expression when it is one value per
                // column and the columns stay the last dim through the views.
                let n = g.node(product).outputs[0].shape[1];
                let per_column = |c: ValueId| g.ty(c).numel() == n && g.ty(c).shape.last() == Some(&n) && out.shape.last() == Some(&n);
                if bias.is_some_and(|c| *beta != 1.0 || !per_column(c)) {
                    return None;
                }
                (smelt_ir::Product::Gemm { trans_a: *trans_a, trans_b: *trans_b, alpha: *alpha, beta: 1.0 }, bias)
            }
            _ => return None,
        };
        if g.node(product).outputs[0].numel() != out.numel() {
            return None;
        }
        // The new expression: $0 the product (plus its bias), then the
        // consumer's other inputs in order.
        let mut new = Expr::default();
        let mut p = new.push(ExprNode::Input(0));
        let mut inputs = vec![pins[0], pins[1]];
        if let Some(c) = bias {
            let c_at = new.push(ExprNode::Input(1));
            p = new.push(ExprNode::Binary(BinaryOp::Add, p, c_at));
            inputs.push(c);
        }
        let mut args = Vec::with_capacity(ins.len());
        for &x in &ins {
            if x == v {
                args.push(p);
            } else {
                // Kernel input t is `$(t - 1)`.
                inputs.push(x);
                args.push(new.push(ExprNode::Input(inputs.len() - 2)));
            }
        }
        new.inline(&expr, &args);
        Some(Fusion { product, absorbed, inputs, expr: new, op })
    })
}
