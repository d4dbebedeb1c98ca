//! Rematerialization: recompute saved activations in the backward pass
//! instead of keeping them from the forward pass, under an arena budget.
//!
//! A training step's first output is its loss; the loss's ancestors are
//! the *forward* nodes, every other one belongs to the backward pass or the
//! updates. A forward value that a backward node reads (directly or through
//! views) is *saved*: it lives from the forward pass to its last backward
//! reader, and the saved values are most of a training step's arena.
//! Recomputing one adds a node that computes the same op from the same
//! operands, or from their recomputations ([`apply`]); its `recomputes`
//! names the original, the backward readers read it instead, and the
//! planner runs it just before its first reader. It keeps its own
//! identity: no pass runs after this one, so nothing merges it back.
//!
//! [`choose`] picks what to recompute. A greedy walk, like XLA's and
//! torch.compile's heuristics: at the peak of the live bytes, recompute the
//! saved value with the lowest cost per byte (with the values only it
//! needs, which would otherwise have to stay alive), until the planned
//! arena fits. The order of picks does not depend on the budget, and the
//! answer is the shortest prefix whose plan fits, so a smaller budget never
//! gives a larger arena or a cheaper recomputation.

mod exact;
pub use exact::{exact, Exact};

use crate::memory::{self, buffers, schedule, Plan};
use crate::{HashMap, HashSet};
use smelt_ir::{IrError, KernelGraph, NodeId, OpSet, ValueId};
use std::collections::BTreeSet;

/// What was recomputed, and the graph and plan that do it.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The graph with the recomputations.
    pub graph: KernelGraph,
    /// Its plan (checked by the caller, as every plan).
    pub plan: Plan,
    /// The recomputed nodes of the input graph, in topological order.
    pub recomputed: Vec<NodeId>,
    /// Their summed cost, in the cost function's units.
    pub cost: f64,
    /// The arena without recomputation.
    pub arena_before: usize,
}

/// The budget cannot be met by recomputing saved values.
#[derive(Clone, Debug)]
pub struct Unreachable {
    /// The smallest arena the walk planned.
    pub smallest: usize,
    /// With that many recomputed nodes and that cost.
    pub recomputed: usize,
    /// Their summed cost.
    pub cost: f64,
}

/// The forward nodes: the ancestors of the first output (the loss) and it.
pub fn forward(g: &KernelGraph) -> HashSet<NodeId> {
    let mut seen = HashSet::default();
    let mut stack: Vec<NodeId> = g.outputs().first().map(|(_, v)| v.node).into_iter().collect();
    while let Some(n) = stack.pop() {
        if seen.insert(n) {
            stack.extend(g.inputs_of(n).iter().map(|v| v.node));
        }
    }
    seen
}

/// A node that may be recomputed: a forward computation (not an input, a
/// persistent value or a view), whose outputs are not graph outputs.
fn computes(g: &KernelGraph, fwd: &HashSet<NodeId>, outs: &HashSet<NodeId>, n: NodeId) -> bool {
    let op = &g.node(n).op;
    fwd.contains(&n) && !op.is_input() && !op.is_persistent() && !op.is_view() && !outs.contains(&n)
}

/// The saved nodes: forward computations that a backward node reads,
/// directly or through forward views.
pub fn saved(g: &KernelGraph) -> Vec<NodeId> {
    let fwd = forward(g);
    let outs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let mut out = Vec::new();
    for n in g.node_ids().filter(|&n| computes(g, &fwd, &outs, n)) {
        let mut stack = vec![n];
        let mut read_late = false;
        while let Some(m) = stack.pop() {
            for u in g.users_of(m) {
                if !fwd.contains(&u) {
                    read_late = true;
                } else if g.node(u).op.is_view() {
                    stack.push(u);
                }
            }
        }
        if read_late {
            out.push(n);
        }
    }
    out
}

/// A copy of `g` in which every backward reader of a node of `set` (forward
/// computations), or of a forward view of one, reads a recomputation.
/// Returns the graph and where each node of `g` went.
pub fn apply(g: &KernelGraph, set: &BTreeSet<NodeId>) -> Result<(KernelGraph, HashMap<NodeId, NodeId>), IrError> {
    let fwd = forward(g);
    let topo = g.topo_order()?;
    // Which forward nodes the backward pass sees recomputed: those of the
    // set, and views of them.
    let mut again: HashSet<NodeId> = HashSet::default();
    for &n in &topo {
        if set.contains(&n) || (fwd.contains(&n) && g.node(n).op.is_view() && g.inputs_of(n).iter().any(|v| again.contains(&v.node))) {
            again.insert(n);
        }
    }
    // Room for every node, a recomputation of each in the set, and their operands.
    let nodes_at_most = g.len() + 2 * set.len();
    let mut out = KernelGraph::with_capacity(nodes_at_most, 3 * nodes_at_most);
    out.set_tf32(g.tf32());
    let saved_set: HashSet<NodeId> = saved(g).into_iter().collect();
    // Recomputed and read by the backward pass itself (or a view of such).
    let saved_again = |n: NodeId| again.contains(&n) && (saved_set.contains(&n) || g.node(n).op.is_view());
    let mut map: HashMap<ValueId, ValueId> = HashMap::default();
    let mut redo: HashMap<ValueId, ValueId> = HashMap::default();
    let mut nodes = HashMap::default();
    let slots = |n: NodeId| (0..g.node(n).outputs.len() as u32).map(move |slot| ValueId { node: n, slot });
    for &id in &topo {
        let late = !fwd.contains(&id) && !g.node(id).op.is_persistent() && !g.node(id).op.is_input();
        let ins: Vec<ValueId> =
            g.inputs_of(id).iter().map(|v| if late { redo.get(v).copied().unwrap_or(map[v]) } else { map[v] }).collect();
        let new = out.copy_node_from(g, id, &ins)?;
        nodes.insert(id, new);
        map.extend(slots(id).map(|v| (v, ValueId { node: new, slot: v.slot })));
        if again.contains(&id) {
            // An operand that is itself saved and recomputed gets a private
            // recomputation (from what is kept), so that its own, for its
            // backward readers, need not run this early.
            let mut private = HashMap::default();
            let ins: Vec<ValueId> = g
                .inputs_of(id)
                .iter()
                .map(|v| {
                    if saved_again(v.node) {
                        fresh(g, &mut out, &map, &again, &nodes, *v, &mut private)
                    } else {
                        Ok(redo.get(v).copied().unwrap_or(map[v]))
                    }
                })
                .collect::<Result<_, _>>()?;
            let r = out.copy_node_from(g, id, &ins)?;
            let node = out.node_mut(r);
            node.name = format!("{}.recompute", node.name);
            node.recomputes = Some(new);
            redo.extend(slots(id).map(|v| (v, ValueId { node: r, slot: v.slot })));
        }
    }
    out.set_outputs(g.outputs().iter().map(|(n, v)| (n.clone(), map[v])).collect());
    out.remove_dead(); // views recomputed for no reader
    Ok((out, nodes))
}

/// A private recomputation of value `v` (of a node in `again`) in `out`,
/// its operands in `again` recomputed privately too (once per call tree,
/// in `memo`); the others read as computed (`map`).
fn fresh(
    g: &KernelGraph,
    out: &mut KernelGraph,
    map: &HashMap<ValueId, ValueId>,
    again: &HashSet<NodeId>,
    nodes: &HashMap<NodeId, NodeId>,
    v: ValueId,
    memo: &mut HashMap<NodeId, NodeId>,
) -> Result<ValueId, IrError> {
    if !again.contains(&v.node) {
        return Ok(map[&v]);
    }
    if let Some(&r) = memo.get(&v.node) {
        return Ok(ValueId { node: r, slot: v.slot });
    }
    let ins: Vec<ValueId> = g.inputs_of(v.node).iter().map(|u| fresh(g, out, map, again, nodes, *u, memo)).collect::<Result<_, _>>()?;
    let r = out.copy_node_from(g, v.node, &ins)?;
    let node = out.node_mut(r);
    node.name = format!("{}.recompute", node.name);
    node.recomputes = Some(nodes[&v.node]);
    memo.insert(v.node, r);
    Ok(ValueId { node: r, slot: v.slot })
}

/// Saved node `n` with what its recomputation needs besides: the forward
/// computations it reads (through views) that are not saved (they die
/// before the backward pass) and not in `set` already, transitively.
fn needs(
    g: &KernelGraph,
    fwd: &HashSet<NodeId>,
    outs: &HashSet<NodeId>,
    saved: &HashSet<NodeId>,
    set: &BTreeSet<NodeId>,
    n: NodeId,
) -> BTreeSet<NodeId> {
    let mut need = BTreeSet::from([n]);
    let mut stack = vec![n];
    while let Some(m) = stack.pop() {
        for v in g.inputs_of(m) {
            let p = v.node;
            let through_view = g.node(p).op.is_view() && fwd.contains(&p);
            if through_view || (computes(g, fwd, outs, p) && !saved.contains(&p) && !set.contains(&p) && need.insert(p)) {
                stack.push(p);
            }
        }
    }
    need
}

/// The cheapest set of saved nodes (with what they need) whose
/// recomputation brings the arena under `budget`, by trying every subset in
/// order of cost, planned as [`choose`] plans its prefixes: the optimum of
/// [`choose`]'s own model (one recomputation per value, run before its
/// first reader), to measure the greedy walk's gap on graphs with at most
/// `max_saved` saved values. `None` when there are more, or nothing fits.
pub fn exhaustive(
    g: &KernelGraph,
    budget: usize,
    hint: Option<&[NodeId]>,
    cost: &dyn Fn(&KernelGraph, NodeId) -> f64,
    max_saved: usize,
) -> Result<Option<(f64, usize)>, IrError> {
    let base = memory::plan_with_hint(g, hint)?;
    if base.arena <= budget {
        return Ok(Some((0.0, base.arena)));
    }
    let fwd = forward(g);
    let outs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let saved_list = saved(g);
    if saved_list.len() > max_saved {
        return Ok(None);
    }
    let saved: HashSet<NodeId> = saved_list.iter().copied().collect();
    let empty = BTreeSet::new();
    let needs: Vec<BTreeSet<NodeId>> = saved_list.iter().map(|&n| needs(g, &fwd, &outs, &saved, &empty, n)).collect();
    let mut price = |m: NodeId| cost(g, m);
    let mut subsets = Vec::new();
    for mask in 1u64..1 << saved_list.len() {
        let set: BTreeSet<NodeId> = (0..saved_list.len()).filter(|i| mask >> i & 1 == 1).flat_map(|i| needs[i].iter().copied()).collect();
        let (g2, w) = walk(g, &base.schedule, &set)?;
        subsets.push((clone_cost(&g2, &w, &mut price), g2, w));
    }
    subsets.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (c, g2, w) in subsets {
        let plan = memory::plan_quick(&g2, hint, &w.order)?;
        if plan.arena <= budget {
            return Ok(Some((c, plan.arena)));
        }
    }
    Ok(None)
}

/// The live bytes of `g` with `set` recomputed, on `base` (a schedule of
/// `g`) with each recomputation just before its first reader.
struct Walk {
    /// The schedule walked.
    order: Vec<NodeId>,
    /// The peak of the live bytes, and its step.
    peak: usize,
    peak_step: usize,
    /// The buffers of the rewritten graph.
    bufs: Vec<buffers::Buffer>,
    /// Each rewritten node's node of `g`.
    back: HashMap<NodeId, NodeId>,
}

fn walk(g: &KernelGraph, base: &[NodeId], set: &BTreeSet<NodeId>) -> Result<(KernelGraph, Walk), IrError> {
    let (g2, nodes) = apply(g, set)?;
    let back: HashMap<NodeId, NodeId> = nodes.iter().map(|(&a, &b)| (b, a)).collect();
    let mut order: Vec<NodeId> = base.iter().filter_map(|n| nodes.get(n).copied()).filter(|n| g2.contains(*n)).collect();
    let placed: HashSet<NodeId> = order.iter().copied().collect();
    // Each recomputation after its operands (then sunk to its first reader).
    for r in g2.topo_order()?.into_iter().filter(|&n| g2.node(n).recomputes.is_some() && !placed.contains(&n)) {
        let after = g2.inputs_of(r).iter().filter_map(|v| order.iter().position(|&m| m == v.node)).max().map_or(0, |p| p + 1);
        order.insert(after, r);
    }
    let order = schedule::place_updates(&g2, schedule::sink_recomputes(&g2, order));
    let (bufs, _, _) = buffers::build(&g2, &order, &HashSet::default());
    let live = buffers::live_bytes(&bufs, order.len());
    let (peak_step, peak) = live.iter().copied().enumerate().max_by_key(|&(i, b)| (b, std::cmp::Reverse(i))).unwrap_or((0, 0));
    Ok((g2, Walk { order, peak, peak_step, bufs, back }))
}

/// The summed cost of every recomputation in a walk's graph (each priced
/// as its original in `g`).
fn clone_cost(g2: &KernelGraph, w: &Walk, price: &mut dyn FnMut(NodeId) -> f64) -> f64 {
    g2.node_ids().filter_map(|n| g2.node(n).recomputes).filter_map(|o| w.back.get(&o).copied()).map(price).sum()
}

/// How many of the cheapest candidates at the peak each round tries.
const TRIES: usize = 8;

/// Recomputes saved values of `g` until its plan's arena is at most
/// `budget` bytes, choosing by `cost` per byte (see the module's notes).
/// `hint` is the planner's (the unfused schedule); `cost(g, n)` is the cost
/// of running node `n` of `g` once. The outcome's plan is what
/// [`memory::plan_quick`] gives its graph with the same hint and the walk's
/// schedule (or, when nothing needs recomputing, [`memory::plan_with_hint`]).
///
/// Each round takes the saved values live at the peak of the walk's
/// schedule, with what only they need (forward values dead before the
/// backward pass), and tries the [`TRIES`] cheapest per byte: the one that
/// lowers the peak at the lowest cost per byte saved (its graph's real
/// recomputations, private ones included) is kept; on a plateau, where
/// another step holds the same peak, the cheapest that does not raise it.
/// Trying, rather than trusting the estimate, finds the picks that pay.
pub fn choose(
    g: &KernelGraph,
    budget: usize,
    hint: Option<&[NodeId]>,
    cost: &dyn Fn(&KernelGraph, NodeId) -> f64,
) -> Result<Result<Outcome, Unreachable>, IrError> {
    let base = memory::plan_with_hint(g, hint)?;
    let arena_before = base.arena;
    if base.arena <= budget {
        return Ok(Ok(Outcome { graph: g.clone(), plan: base, recomputed: Vec::new(), cost: 0.0, arena_before }));
    }
    let fwd = forward(g);
    let outs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let saved: HashSet<NodeId> = saved(g).into_iter().collect();
    let mut cost_of: HashMap<NodeId, f64> = HashMap::default();
    let mut price = |m: NodeId| *cost_of.entry(m).or_insert_with(|| cost(g, m));
    let mut set: BTreeSet<NodeId> = BTreeSet::new();
    let mut total = 0.0;
    let (mut g2, mut now) = walk(g, &base.schedule, &set)?;
    // The smallest arena planned, with its set's size and cost, for the
    // answer when nothing fits.
    let mut lowest: (usize, usize, f64) = (base.arena, 0, 0.0);
    // Each round adds at least one saved node; there are finitely many.
    for _ in 0..=saved.len() {
        // Every prefix is planned (the planner's schedules and the walk's,
        // offsets without the local search), and the answer is the first
        // whose plan fits: a smaller budget takes a later prefix, with a
        // smaller arena and a larger cost.
        if !set.is_empty() {
            let plan = memory::plan_quick(&g2, hint, &now.order)?;
            if plan.arena <= budget {
                let recomputed = g.topo_order()?.into_iter().filter(|n| set.contains(n)).collect();
                return Ok(Ok(Outcome { graph: g2, plan, recomputed, cost: total, arena_before }));
            }
            if plan.arena < lowest.0 {
                lowest = (plan.arena, set.len(), total);
            }
        }
        // The saved values live at the peak that are not recomputed yet,
        // each with what only it needs: forward computations that are not
        // saved (dead before the backward pass) and not recomputed yet.
        let at_peak: BTreeSet<NodeId> = now
            .bufs
            .iter()
            .filter(|b| b.start <= now.peak_step && now.peak_step <= b.end)
            .flat_map(|b| b.values.iter().filter_map(|v| now.back.get(&v.node).copied()))
            .filter(|n| saved.contains(n) && !set.contains(n))
            .collect();
        let mut options: Vec<(f64, BTreeSet<NodeId>)> = Vec::new();
        for &n in &at_peak {
            let need = needs(g, &fwd, &outs, &saved, &set, n);
            let c: f64 = need.iter().filter(|m| !g.node(**m).op.is_view()).map(|&m| price(m)).sum();
            let bytes: usize = g.node(n).outputs.iter().map(|t| t.bytes()).sum();
            options.push((c / bytes.max(1) as f64, need));
        }
        options.sort_by(|a, b| a.0.total_cmp(&b.0));
        // (cost per byte saved, or per byte held on a plateau; lowers the peak; cost; set; walk)
        let mut best: Option<(bool, f64, f64, BTreeSet<NodeId>, KernelGraph, Walk)> = None;
        // The trials are independent: walked on the machine's cores, then
        // weighed in order (the answer does not depend on the threads).
        let trials: Vec<(f64, BTreeSet<NodeId>)> = options.into_iter().take(TRIES).collect();
        let walked = crate::par_map(&trials, |(_, need)| {
            let mut trial = set.clone();
            trial.extend(need.iter().copied());
            walk(g, &base.schedule, &trial)
        });
        for ((ratio, need), walked) in trials.into_iter().zip(walked) {
            let (tg, w) = walked?;
            // What the trial adds, private recomputations included.
            let c = clone_cost(&tg, &w, &mut price) - total;
            let score = match w.peak.cmp(&now.peak) {
                std::cmp::Ordering::Less => (true, c / (now.peak - w.peak) as f64),
                std::cmp::Ordering::Equal => (false, ratio),
                std::cmp::Ordering::Greater => continue,
            };
            let better = best.as_ref().is_none_or(|b| (score.0 && !b.0) || (score.0 == b.0 && score.1 < b.1));
            if better {
                best = Some((score.0, score.1, c, need, tg, w));
            }
        }
        let Some((_, _, c, need, tg, w)) = best else { break };
        total += c;
        set.extend(need);
        (g2, now) = (tg, w);
    }
    let (smallest, recomputed, cost) = lowest;
    Ok(Err(Unreachable { smallest, recomputed, cost }))
}
