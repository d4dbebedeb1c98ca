//! In-place concatenation: a Concat whose every input is produced by a
//! kernel used by nothing else becomes `concat_in_place`; those producers
//! write straight into their slices of the output, so no copy kernel runs
//! and the memory planner may alias the inputs into the output.

use crate::HashSet;
use smelt_ir::{KernelGraph, KernelOp, NodeId, Op, OpSet};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Concatenations marked in place.
    pub in_place: usize,
    /// Concatenations left as copies (an input is shared, a graph input, a
    /// constant or a view).
    pub copies: usize,
}

/// Marks eligible concatenations of `g`.
pub fn run(g: &mut KernelGraph) -> Stats {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let concats: Vec<NodeId> = g.node_ids().filter(|&id| matches!(g.node(id).op, KernelOp::Op(Op::Concat { .. }))).collect();
    let mut stats = Stats::default();
    for id in concats {
        let ins = g.inputs_of(id);
        let distinct: HashSet<_> = ins.iter().map(|v| v.node).collect();
        let eligible = distinct.len() == ins.len()
            && ins.iter().all(|v| {
                let p = g.node(v.node);
                p.op.is_kernel() && p.outputs.len() == 1 && g.users_of(v.node).len() == 1 && !outputs.contains(&v.node)
            });
        if eligible {
            let KernelOp::Op(Op::Concat { axis }) = g.node(id).op else { unreachable!("filtered above") };
            g.node_mut(id).op = KernelOp::ConcatInPlace { axis };
            stats.in_place += 1;
        } else {
            stats.copies += 1;
        }
    }
    stats
}
