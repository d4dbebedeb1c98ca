//! Memory planning: a memory-aware schedule, liveness with aliasing (views,
//! in-place kernels, in-place concatenation), and offsets in one arena.
//! [`check::check`] verifies any plan independently of how it was made.
//!
//! Graph inputs and outputs live in the arena; weights (constants) do not.

mod assign;
pub(crate) mod buffers;
pub mod check;
pub(crate) mod schedule;

use crate::{HashMap, HashSet};
use smelt_ir::{KernelGraph, KernelOp, NodeId, ValueId};

pub use buffers::Buffer;

/// Alignment of every buffer's offset and size in the arena, in bytes.
pub const ALIGN: usize = 256;

/// Where a value lives: byte intervals `[start, end)` in the arena (one for
/// most values; a strided set for a slice of an in-place concatenation).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The buffer holding the value.
    pub buffer: usize,
    /// Byte intervals in the arena.
    pub intervals: Vec<(usize, usize)>,
}

/// A schedule considered and the lower bound it gives.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Candidate {
    /// `model`, `depth-first` or `list`.
    pub name: String,
    /// Its liveness lower bound in bytes.
    pub lower_bound: usize,
}

/// A memory plan.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Execution order of every node that is not a constant (inputs first).
    pub schedule: Vec<NodeId>,
    /// Name of the chosen schedule.
    pub schedule_name: String,
    /// Every schedule tried.
    pub candidates: Vec<Candidate>,
    /// Buffers with their lifetimes (steps index `schedule`) and offsets.
    pub buffers: Vec<Buffer>,
    /// Placement of every non-constant value.
    pub placements: HashMap<ValueId, Placement>,
    /// Arena size in bytes.
    pub arena: usize,
    /// The largest sum of live buffer bytes at any step of the schedule.
    pub lower_bound: usize,
    /// The step where the lower bound is reached.
    pub peak_step: usize,
    /// Name of the assignment order that gave the smallest arena.
    pub order_name: String,
    /// In-place concatenations planned as copies after all (aliasing them
    /// would raise the peak); the code generator copies these.
    pub copied_concats: HashSet<NodeId>,
}

impl Plan {
    /// Buffers live at `step`, largest first.
    pub fn live_at(&self, step: usize) -> Vec<&Buffer> {
        let mut v: Vec<&Buffer> = self.buffers.iter().filter(|b| b.start <= step && step <= b.end).collect();
        v.sort_by(|a, b| b.size.cmp(&a.size).then(a.start.cmp(&b.start)));
        v
    }

    /// Sum of live buffer bytes at each step.
    pub fn live_bytes(&self) -> Vec<usize> {
        buffers::live_bytes(&self.buffers, self.schedule.len())
    }
}

/// Plans `g`: tries every schedule, keeps the one with the lowest liveness
/// lower bound, then assigns offsets trying several orders.
pub fn plan(g: &KernelGraph) -> Result<Plan, smelt_ir::IrError> {
    plan_with_hint(g, None)
}

/// The model nodes a plan's schedule computes, in order (each node's
/// provenance): a hint for planning a fused version of the same model.
pub fn schedule_origins(g: &KernelGraph, plan: &Plan) -> Vec<NodeId> {
    plan.schedule.iter().flat_map(|&n| g.origin(n).to_vec()).collect()
}

/// As [`plan`], also trying a schedule that follows `hint` (model nodes in
/// order, see [`schedule_origins`]).
pub fn plan_with_hint(g: &KernelGraph, hint: Option<&[NodeId]>) -> Result<Plan, smelt_ir::IrError> {
    Ok(plan_candidates(g, schedule::candidates(g, hint, None)?, true))
}

/// As [`plan_with_hint`], also trying `given` (a schedule of every
/// scheduled node, inputs first), and placing buffers without the local
/// search (a cheaper plan, for rematerialization's many).
pub fn plan_quick(g: &KernelGraph, hint: Option<&[NodeId]>, given: &[NodeId]) -> Result<Plan, smelt_ir::IrError> {
    Ok(plan_candidates(g, schedule::candidates(g, hint, Some(given))?, false))
}

/// Plans `g` on `order` alone (a schedule of every scheduled node, inputs
/// first), placing buffers without the local search: a split search's
/// many candidates.
pub fn plan_order(g: &KernelGraph, order: Vec<NodeId>) -> Plan {
    plan_candidates(g, vec![("given", order)], false)
}

/// Plans `g` on `order` alone, with the local search.
pub fn plan_given(g: &KernelGraph, order: &[NodeId]) -> Result<Plan, smelt_ir::IrError> {
    Ok(plan_candidates(g, vec![("split", order.to_vec())], true))
}

/// Plans `g` on the candidate schedule with the lowest lower bound.
fn plan_candidates(g: &KernelGraph, schedules: Vec<(&'static str, Vec<NodeId>)>, search: bool) -> Plan {
    struct Best {
        name: String,
        order: Vec<NodeId>,
        bufs: Vec<Buffer>,
        rel: HashMap<ValueId, buffers::Rel>,
        lb: usize,
        peak: usize,
        copied: HashSet<NodeId>,
    }
    let eval = |order: &[NodeId], copied: &HashSet<NodeId>| {
        let (bufs, rel, copies) = buffers::build(g, order, copied);
        let live = buffers::live_bytes(&bufs, order.len());
        let (peak, lb) = live.iter().copied().enumerate().max_by_key(|&(i, b)| (b, std::cmp::Reverse(i))).unwrap_or((0, 0));
        (bufs, rel, lb, peak, copies)
    };
    let concats: Vec<NodeId> = g.node_ids().filter(|&n| matches!(g.node(n).op, KernelOp::ConcatInPlace { .. })).collect();
    let mut best: Option<Best> = None;
    let mut candidates = Vec::new();
    // Each schedule's buffers on the machine's cores, then compared in order.
    let evaluated = crate::par_map(&schedules, |(_, order)| {
        // Alias every in-place concatenation, then copy those whose aliasing
        // raises the peak (greedily, one at a time).
        let mut copied = HashSet::default();
        let (mut bufs, mut rel, mut lb, mut peak, mut copies) = eval(order, &copied);
        for &c in &concats {
            if copies.contains(&c) {
                continue; // already a copy (it cannot alias its inputs)
            }
            copied.insert(c);
            let (b2, r2, lb2, p2, c2) = eval(order, &copied);
            if lb2 < lb {
                (bufs, rel, lb, peak, copies) = (b2, r2, lb2, p2, c2);
            } else {
                copied.remove(&c);
            }
        }
        (bufs, rel, lb, peak, copies)
    });
    for ((name, order), (bufs, rel, lb, peak, copies)) in schedules.into_iter().zip(evaluated) {
        candidates.push(Candidate { name: name.to_string(), lower_bound: lb });
        if best.as_ref().is_none_or(|b| lb < b.lb) {
            best = Some(Best { name: name.to_string(), order, bufs, rel, lb, peak, copied: copies });
        }
    }
    let Best { name: schedule_name, order: schedule, mut bufs, rel, lb: lower_bound, peak: peak_step, copied: copied_concats } =
        best.expect("at least one schedule");
    let (arena, order_name) = assign::assign(&mut bufs, search);
    let placements = rel.into_iter().map(|(v, r)| (v, r.place(&bufs))).collect();
    Plan { schedule, schedule_name, candidates, buffers: bufs, placements, arena, lower_bound, peak_step, order_name, copied_concats }
}
