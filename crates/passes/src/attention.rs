//! Fused attention: `matmul(softmax(prologue(matmul(q, kt), extras...)), v)`
//! becomes one `attention` kernel, so the scores never reach memory. Runs
//! after `reduce-fuse`, when every exporter's spelling has one normal form:
//! the scale and additive masks are the softmax's prologue (a
//! `fused_reduction`), `where(is_nan(p), 0, p)` (exports guarding rows
//! where every key is masked) and a cast to the second product's precision
//! may sit between the softmax and the product. Anything else between them,
//! a softmax or a product used twice, or shapes the kernel does not take:
//! the graph is left as it is (and `smelt inspect` shows no `attention`).

use crate::{HashMap, HashSet};
use smelt_ir::kernel_op::{ATTENTION_MAX_BATCH, ATTENTION_MAX_HEAD};
use smelt_ir::{BinaryOp, Expr, ExprNode, IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Attention blocks fused into one kernel.
    pub fused: usize,
    /// Softmax-then-product blocks seen (fused or not).
    pub blocks: usize,
}

/// One block to fuse.
struct Block {
    q: ValueId,
    kt: ValueId,
    v: ValueId,
    extras: Vec<ValueId>,
    expr: Expr,
    score: usize,
    nan_to_zero: bool,
    perms: [Vec<usize>; 4],
    absorbed: Vec<NodeId>,
    /// The node the kernel replaces: the second product, or the transpose
    /// after it that the kernel's output permutation folds.
    end: NodeId,
}

/// Fuses the attention blocks of `g`.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let mut stats = Stats::default();
    let mut blocks: HashMap<NodeId, Block> = HashMap::default();
    for id in g.node_ids() {
        if !matches!(g.node(id).op, KernelOp::Op(Op::MatMul)) {
            continue;
        }
        if let Some(b) = block(g, id, &outputs, &mut stats) {
            blocks.insert(b.end, b);
        }
    }
    if blocks.is_empty() {
        return Ok(stats);
    }
    let absorbed: HashSet<NodeId> = blocks.values().flat_map(|b| b.absorbed.iter().copied()).collect();
    let out = crate::rebuild(g, &absorbed, |out, id, map| {
        let Some(b) = blocks.get(&id) else { return Ok(None) };
        let ins: Vec<ValueId> = [b.q, b.kt, b.v].iter().chain(&b.extras).map(|v| map[v]).collect();
        let op = KernelOp::Attention { expr: b.expr.clone(), score: b.score, nan_to_zero: b.nan_to_zero, perms: b.perms.clone() };
        let new = out.add(op, g.node(id).name.clone(), &ins)?;
        out.set_origin(new, g.origins(b.absorbed.iter().chain([&id])));
        Ok(Some(new))
    })?;
    stats.fused = blocks.len();
    *g = out;
    Ok(stats)
}

/// Whether `n` is a float-to-float cast kernel of one input.
fn is_cast(g: &KernelGraph, n: NodeId) -> bool {
    let ins = g.inputs_of(n);
    let float = ins.len() == 1 && g.ty(ins[0]).dtype.is_float() && g.node(n).outputs[0].dtype.is_float();
    float
        && match &g.node(n).op {
            KernelOp::Op(Op::Cast { .. }) => true,
            KernelOp::Elementwise { expr } => matches!(expr.nodes.as_slice(), [ExprNode::Input(0), ExprNode::Cast(_, 0)]),
            _ => false,
        }
}

/// `(c, x)` when `v` is `x * c` (either order) for a one-element float constant `c`.
fn scalar_mul(g: &KernelGraph, v: ValueId) -> Option<(ValueId, ValueId)> {
    if g.node(v.node).op != KernelOp::Op(Op::Binary(BinaryOp::Mul)) {
        return None;
    }
    let ins = g.inputs_of(v.node);
    let scalar = |c: ValueId| g.node(c.node).op.is_constant() && g.ty(c).numel() == 1 && g.ty(c).dtype.is_float();
    match ins.as_slice() {
        [a, b] if scalar(*b) => Some((*b, *a)),
        [a, b] if scalar(*a) => Some((*a, *b)),
        _ => None,
    }
}

/// Whether value `v` is a constant whose every element is 0.
fn is_zero(g: &KernelGraph, v: ValueId) -> bool {
    g.node(v.node).op.is_constant() && g.weight(v.node).is_some_and(|w| w.to_f32_vec().iter().all(|&x| x == 0.0))
}

/// The block whose second product is `m2`, if it has the attention form.
fn block(g: &KernelGraph, m2: NodeId, outputs: &HashSet<NodeId>, stats: &mut Stats) -> Option<Block> {
    let private = |n: NodeId, users: usize| g.users_of(n).len() == users && !outputs.contains(&n);
    let (p_in, v) = (g.inputs_of(m2)[0], g.inputs_of(m2)[1]);
    let mut absorbed = Vec::new();
    let mut cur = p_in.node;
    if is_cast(g, cur) && private(cur, 1) {
        absorbed.push(cur);
        cur = g.inputs_of(cur)[0].node;
    }
    let mut nan_to_zero = false;
    if let KernelOp::Op(Op::Where) = g.node(cur).op {
        let w = g.inputs_of(cur);
        let test = w[0].node;
        let guards = matches!(g.node(test).op, KernelOp::Op(Op::IsNaN)) && g.inputs_of(test)[0] == w[2] && is_zero(g, w[1]);
        if !(guards && private(cur, 1) && private(test, 1)) {
            return None;
        }
        absorbed.extend([cur, test]);
        nan_to_zero = true;
        cur = w[2].node;
    }
    let softmax = cur;
    let shape = &g.node(softmax).outputs[0].shape;
    let last = shape.len().checked_sub(1)?;
    let (mut expr, pre) = match &g.node(softmax).op {
        KernelOp::Op(Op::Softmax { axis }) if *axis == last => {
            let mut e = Expr::default();
            e.push(ExprNode::Input(0));
            (e, g.inputs_of(softmax))
        }
        KernelOp::FusedReduction { expr, reduction: smelt_ir::Reducer::Softmax { axis } } if *axis == last => {
            (expr.clone(), g.inputs_of(softmax))
        }
        _ => return None,
    };
    stats.blocks += 1;
    // The softmax is read by the product (and the NaN guard) only.
    if !private(softmax, if nan_to_zero { 2 } else { 1 }) {
        return None;
    }
    // The prologue input that is the scores' product.
    let score =
        pre.iter().position(|s| matches!(g.node(s.node).op, KernelOp::Op(Op::MatMul)) && &g.ty(*s).shape == shape && private(s.node, 1))?;
    let qk = pre[score].node;
    let (mut q, mut kt, mut v) = (g.inputs_of(qk)[0], g.inputs_of(qk)[1], v);
    // A transpose read only by this block is folded into the kernel's
    // indexing (the heads split out of the hidden dim, keys transposed).
    // So is a scale of q or k by a scalar constant (exports that scale
    // both by the fourth root of the head size), before or after the
    // transpose: it joins the scores' prologue.
    let mut perms: [Vec<usize>; 4] = Default::default();
    let mut folded = Vec::new();
    let mut scales = Vec::new();
    let mut scaled = |x: &mut ValueId, folded: &mut Vec<NodeId>| {
        if let Some((c, other)) = scalar_mul(g, *x).filter(|_| private(x.node, 1)) {
            scales.push(c);
            folded.push(x.node);
            *x = other;
        }
    };
    for (k, x) in [&mut q, &mut kt, &mut v].into_iter().enumerate() {
        if k < 2 {
            scaled(x, &mut folded);
        }
        if let KernelOp::Op(Op::Transpose { perm }) = &g.node(x.node).op {
            if private(x.node, 1) {
                perms[k] = perm.clone();
                folded.push(x.node);
                *x = g.inputs_of(x.node)[0];
                if k < 2 {
                    scaled(x, &mut folded);
                }
            }
        }
    }
    let mut extras: Vec<ValueId> = pre.iter().enumerate().filter(|&(k, _)| k != score).map(|(_, v)| *v).collect();
    if !scales.is_empty() {
        // The product times each scale (new inputs after the others), then the prologue.
        let mut e = Expr::default();
        let mut s = e.push(ExprNode::Input(score));
        for (i, c) in scales.iter().enumerate() {
            let at = e.push(ExprNode::Input(pre.len() + i));
            s = e.push(ExprNode::Binary(BinaryOp::Mul, s, at));
            extras.push(*c);
        }
        let args: Vec<usize> = (0..pre.len()).map(|i| if i == score { s } else { e.push(ExprNode::Input(i)) }).collect();
        e.inline(&expr, &args);
        expr = e;
    }
    // Shapes and dtypes the kernel takes (its description decides).
    let mut tys = vec![g.ty(q), g.ty(kt), g.ty(v)];
    tys.extend(extras.iter().map(|e| g.ty(*e)));
    let (out, scores) = smelt_ir::attention_types(&expr, score, &perms, &tys).ok()?;
    if out != g.node(m2).outputs[0] || tys.iter().any(|t| !t.dtype.is_float()) {
        return None;
    }
    // What the kernel holds: heads in registers, a grid row per matrix.
    // Head dims: q's as read (its last dim after the permutation) and v's (the output's last).
    let qs = &g.ty(q).shape;
    let d = match perms[0].last() {
        Some(&p) => qs[p],
        None => qs.last().copied().unwrap_or(0),
    };
    let dv = out.shape.last().copied().unwrap_or(0);
    let batches: usize = scores.shape[..scores.shape.len() - 2].iter().product();
    if d > ATTENTION_MAX_HEAD || dv > ATTENTION_MAX_HEAD || batches > ATTENTION_MAX_BATCH {
        return None;
    }
    absorbed.extend([softmax, qk]);
    absorbed.extend(folded);
    // The transpose after the product (through reshapes that keep the
    // shape), read by nothing else: the kernel writes its output permuted.
    let mut end = m2;
    let mut through = Vec::new();
    while private(end, 1) {
        let u = g.users_of(end)[0];
        match &g.node(u).op {
            KernelOp::Op(Op::Reshape { shape }) if *shape == g.node(end).outputs[0].shape => {
                through.push(end);
                end = u;
            }
            KernelOp::Op(Op::Transpose { perm }) => {
                let mut p = perms.clone();
                p[3] = perm.clone();
                if smelt_ir::attention_types(&expr, score, &p, &tys).ok().is_some_and(|(o, _)| o == g.node(u).outputs[0]) {
                    perms = p;
                    through.push(end);
                    end = u;
                }
                break;
            }
            _ => break,
        }
    }
    if perms[3].is_empty() {
        end = m2;
    } else {
        absorbed.extend(through);
    }
    Some(Block { q, kt, v, extras, expr, score, nan_to_zero, perms, absorbed, end })
}
