//! Elementwise clustering: merges each tree of elementwise ops (unary,
//! binary with broadcasting, clip, sum, float casts, earlier clusters) into one
//! `elementwise` kernel, so its intermediates never reach memory.
//!
//! A producer joins its consumers' kernels when every user is elementwise,
//! it is not a graph output, and either it has a single user or it is a
//! cheap op (one unary, binary or clip, not a whole earlier cluster): a
//! cheap value read by several elementwise consumers is recomputed in each
//! of them (an ALU op costs far less than a write and a read of memory),
//! anything else with several consumers is materialised once. Inside one
//! kernel a value used twice is computed once. Broadcasting inside a tree is
//! exact: elementwise functions commute with broadcasting.

use crate::{HashMap, HashSet};
use smelt_ir::{Expr, ExprNode, IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Elementwise kernels made from two or more ops.
    pub clusters: usize,
    /// Ops absorbed into a consumer's kernel.
    pub absorbed: usize,
}

/// Elementwise float ops, float-to-float casts included (integer arithmetic
/// stays as it is: fused kernels compute in float).
fn is_elementwise(g: &KernelGraph, id: NodeId) -> bool {
    let n = g.node(id);
    n.outputs[0].dtype.is_float()
        && g.inputs_of(id).iter().all(|v| g.ty(*v).dtype.is_float())
        && Expr::of_kernel(&n.op, g.inputs_of(id).len()).is_some()
}

/// Clusters `g` in place.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let order = g.topo_order()?;
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    // A node is absorbed into its single elementwise user.
    let absorbed: HashSet<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| {
            let users = g.users_of(id);
            let op = &g.node(id).op;
            let cheap = matches!(op, KernelOp::Op(Op::Unary(_) | Op::Binary(_) | Op::Clip { .. } | Op::Cast { .. }));
            is_elementwise(g, id)
                && !users.is_empty()
                && (users.len() == 1 || cheap)
                && !outputs.contains(&id)
                && users.iter().all(|&u| is_elementwise(g, u))
        })
        .collect();
    let mut out = KernelGraph::new();
    out.set_tf32(g.tf32());
    let mut map: HashMap<ValueId, ValueId> = HashMap::default();
    let mut stats = Stats::default();
    for &id in &order {
        if absorbed.contains(&id) {
            continue;
        }
        let node = g.node(id);
        let has_absorbed_input = g.inputs_of(id).iter().any(|v| absorbed.contains(&v.node));
        let new = if has_absorbed_input {
            let mut b =
                ExprBuilder { g, absorbed: &absorbed, expr: Expr::default(), leaves: Vec::new(), count: 0, memo: HashMap::default() };
            b.visit(id);
            stats.clusters += 1;
            stats.absorbed += b.count;
            let ins: Vec<ValueId> = b.leaves.iter().map(|v| map[v]).collect();
            // It computes its own ops and every absorbed one.
            let origin = g.origins(b.memo.keys().chain([&id]));
            let new = out.add(KernelOp::Elementwise { expr: b.expr }, node.name.clone(), &ins)?;
            out.set_origin(new, origin);
            new
        } else {
            let ins: Vec<ValueId> = g.inputs_of(id).iter().map(|v| map[v]).collect();
            out.copy_node_from(g, id, &ins)?
        };
        for slot in 0..node.outputs.len() as u32 {
            map.insert(ValueId { node: id, slot }, ValueId { node: new, slot });
        }
    }
    let outs: Vec<(String, ValueId)> = g.outputs().iter().map(|(n, v)| (n.clone(), map[v])).collect();
    out.set_outputs(outs);
    *g = out;
    Ok(stats)
}

struct ExprBuilder<'a> {
    g: &'a KernelGraph,
    absorbed: &'a HashSet<NodeId>,
    expr: Expr,
    leaves: Vec<ValueId>,
    count: usize,
    /// Expression index of each absorbed node already visited in this kernel.
    memo: HashMap<NodeId, usize>,
}

impl ExprBuilder<'_> {
    fn leaf(&mut self, v: ValueId) -> usize {
        let i = self.leaves.iter().position(|&l| l == v).unwrap_or_else(|| {
            self.leaves.push(v);
            self.leaves.len() - 1
        });
        self.expr.push(ExprNode::Input(i))
    }

    fn operand(&mut self, v: ValueId) -> usize {
        if self.absorbed.contains(&v.node) {
            if let Some(&i) = self.memo.get(&v.node) {
                return i;
            }
            self.count += 1;
            let i = self.node(v.node);
            self.memo.insert(v.node, i);
            i
        } else {
            self.leaf(v)
        }
    }

    /// Appends the expression of node `id` (earlier clusters inlined, their
    /// inputs bound to our operands); returns its index. The absorbed nodes
    /// are built first in post-order, with an explicit stack, so that the
    /// recursion below never goes deeper than one node: a chain of
    /// thousands of elementwise ops must not overflow the stack.
    fn visit(&mut self, id: smelt_ir::NodeId) -> usize {
        let mut stack: Vec<(ValueId, bool)> = self.g.inputs_of(id).into_iter().rev().map(|v| (v, false)).collect();
        let mut seen = HashSet::default();
        while let Some((v, expanded)) = stack.pop() {
            if expanded {
                self.operand(v);
            } else if self.absorbed.contains(&v.node) && !self.memo.contains_key(&v.node) && seen.insert(v.node) {
                stack.push((v, true));
                stack.extend(self.g.inputs_of(v.node).into_iter().rev().map(|w| (w, false)));
            }
        }
        self.node(id)
    }

    /// Appends the expression of node `id` from its operands'.
    fn node(&mut self, id: smelt_ir::NodeId) -> usize {
        let ins = self.g.inputs_of(id);
        let args: Vec<usize> = ins.iter().map(|&v| self.operand(v)).collect();
        let op = &self.g.node(id).op;
        let e = Expr::of_kernel(op, ins.len()).unwrap_or_else(|| unreachable!("{} is not elementwise", op.name()));
        self.expr.inline(&e, &args)
    }
}
