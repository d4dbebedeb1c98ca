//! The exact solver: which saved values to recompute, as a mixed-integer
//! program over a schedule (the plan's, with the backward readers of
//! saved values where a recomputation moves them), in the spirit of Checkmate (Jain et
//! al., MLSys 2020) but in [`choose`](super::choose)'s own model (each
//! saved value kept, or recomputed once just before its first backward
//! reader), solved by `microlp`'s branch and bound: pure Rust, so nothing
//! native to build, with a time limit and a proven bound.
//!
//! Binary variables: `x_i`, saved value i is recomputed; `y_m`, a forward
//! computation that only recomputations need (it dies before the backward
//! pass) is recomputed; `z_ij`, saved value i and its saved operand j are
//! both recomputed, so i's recomputation recomputes j privately. Minimise
//! `sum c_i x_i + sum c_m y_m + sum c_j z_ij` subject to, at every step t
//! whose live bytes `L(t)` exceed the budget `B`,
//! `sum b_i x_i >= L(t) - B` over the values i that t lies between the
//! last forward reader and the first backward reader of (their bytes are
//! free there), `y_m >= x_i` for each i that needs m, and
//! `z_ij >= x_i + x_j - 1`. Steps covered by the same values share a row.
//!
//! The model leaves out what only raises the true arena (fragmentation, the
//! recomputed buffers' own lifetimes before their readers) and costs that
//! only add (a private recomputation's own needs), so its optimum is a
//! lower bound of the true cost on that schedule. The chosen set is applied
//! and planned as `choose` plans a prefix; if its arena is over the budget,
//! the model's budget is lowered by the excess and solved again.

use super::{clone_cost, forward, needs, saved, walk, Outcome};
use crate::memory::{self, buffers};
use crate::{HashMap, HashSet};
use smelt_ir::{IrError, KernelGraph, NodeId, OpSet};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What the exact solver found.
#[derive(Clone, Debug)]
pub struct Exact {
    /// The last round's choice applied and planned, if its arena fits.
    pub outcome: Option<Outcome>,
    /// A lower bound of the cost of any choice that fits on this schedule
    /// (the first round's proven bound: later rounds solve a tighter model).
    pub lower_bound: f64,
    /// Whether the first round's optimum was proven within the time limit.
    pub proven: bool,
    /// The model's optimum at the last round (its objective).
    pub model_cost: f64,
    /// Rounds solved.
    pub rounds: usize,
}

/// The cheapest choice of saved values to recompute whose plan fits
/// `budget` (see the module's notes), `cost` and `hint` as for
/// [`choose`](super::choose). `limit` bounds the branch and bound's time,
/// all rounds together; past it the best choice found is taken, and the
/// bound proven so far is reported.
pub fn exact(
    g: &KernelGraph,
    budget: usize,
    hint: Option<&[NodeId]>,
    cost: &dyn Fn(&KernelGraph, NodeId) -> f64,
    limit: Duration,
) -> Result<Exact, IrError> {
    let base = memory::plan_with_hint(g, hint)?;
    if base.arena <= budget {
        let o = Outcome { graph: g.clone(), plan: base.clone(), recomputed: Vec::new(), cost: 0.0, arena_before: base.arena };
        return Ok(Exact { outcome: Some(o), lower_bound: 0.0, proven: true, model_cost: 0.0, rounds: 0 });
    }
    let started = Instant::now();
    let fwd = forward(g);
    let outs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let saved_list = saved(g);
    let saved_set: HashSet<NodeId> = saved_list.iter().copied().collect();
    // The schedule: the plan's, with the backward readers of every saved
    // value moved as the walk moves a recomputation's readers (a ReLU's
    // mask that the planner ran in the forward pass, say, runs just before
    // its own reader): the order the backward pass takes once values are
    // recomputed, which the plain plan's would misstate.
    let all: BTreeSet<NodeId> = saved_list.iter().flat_map(|&n| needs(g, &fwd, &outs, &saved_set, &BTreeSet::new(), n)).collect();
    let (ga, wa) = walk(g, &base.schedule, &all)?;
    let order: Vec<NodeId> =
        wa.order.iter().filter(|&&n| ga.node(n).recomputes.is_none()).filter_map(|n| wa.back.get(n).copied()).collect();
    let (_, w) = walk(g, &order, &BTreeSet::new())?;
    let pos: HashMap<NodeId, usize> = w.order.iter().enumerate().filter_map(|(i, n)| w.back.get(n).map(|&m| (m, i))).collect();
    let live = buffers::live_bytes(&w.bufs, w.order.len());
    let empty = BTreeSet::new();
    // Per saved value: the steps its bytes are free when recomputed (after
    // its last forward reader, before its first backward one), its bytes,
    // what it needs, and its saved operands.
    let mut items = Vec::new();
    for &n in &saved_list {
        let (mut last_fwd, mut first_bwd) = (pos.get(&n).copied().unwrap_or(0), usize::MAX);
        let mut stack = vec![n];
        while let Some(m) = stack.pop() {
            for u in g.users_of(m) {
                let Some(&p) = pos.get(&u) else { continue };
                if fwd.contains(&u) && g.node(u).op.is_view() {
                    stack.push(u);
                } else if fwd.contains(&u) {
                    last_fwd = last_fwd.max(p);
                } else {
                    // A recomputation's reader (not an update) is sunk to
                    // just before its own first reader, as the walk sinks it.
                    let sunk = g.users_of(u).iter().filter_map(|r| pos.get(r)).min().copied();
                    let update = g.node(u).op.traits().kind == smelt_ir::traits::Kind::Update;
                    first_bwd = first_bwd.min(if update { p } else { sunk.unwrap_or(p).max(p) });
                }
            }
        }
        let bytes: usize = g.node(n).outputs.iter().map(|t| t.bytes()).sum();
        let need: Vec<NodeId> =
            needs(g, &fwd, &outs, &saved_set, &empty, n).into_iter().filter(|&m| m != n && !g.node(m).op.is_view()).collect();
        // Saved operands, through forward views and what it needs.
        let mut operands = BTreeSet::new();
        let mut stack: Vec<NodeId> = g.inputs_of(n).iter().map(|v| v.node).collect();
        while let Some(p) = stack.pop() {
            if saved_set.contains(&p) {
                operands.insert(p);
            } else if fwd.contains(&p) && (g.node(p).op.is_view() || need.contains(&p)) {
                stack.extend(g.inputs_of(p).iter().map(|v| v.node));
            }
        }
        items.push(Item { node: n, free: (last_fwd + 1, first_bwd), bytes, need, operands });
    }
    let index: HashMap<NodeId, usize> = items.iter().enumerate().map(|(i, it)| (it.node, i)).collect();
    let mut price: HashMap<NodeId, f64> = HashMap::default();
    let mut c = |m: NodeId| *price.entry(m).or_insert_with(|| cost(g, m));
    let costs: Vec<f64> = items.iter().map(|it| c(it.node)).collect();
    let need_nodes: BTreeSet<NodeId> = items.iter().flat_map(|it| it.need.iter().copied()).collect();
    let need_costs: BTreeMap<NodeId, f64> = need_nodes.iter().map(|&m| (m, c(m))).collect();

    let mut model_budget = budget;
    let mut first: Option<(f64, bool)> = None;
    let mut last = (None, 0.0);
    let mut rounds = 0;
    while rounds < 8 {
        rounds += 1;
        let left = limit.saturating_sub(started.elapsed());
        let Some((chosen, objective, bound, proven)) = solve(&items, &index, &costs, &need_costs, &live, model_budget, left) else {
            break; // no choice frees enough bytes: the model is infeasible
        };
        first.get_or_insert((bound, proven));
        let set: BTreeSet<NodeId> = chosen.iter().flat_map(|&i| needs(g, &fwd, &outs, &saved_set, &empty, items[i].node)).collect();
        let (g2, w2) = walk(g, &order, &set)?;
        let plan = memory::plan_quick(&g2, hint, &w2.order)?;
        let mut p = |m: NodeId| c(m);
        let true_cost = clone_cost(&g2, &w2, &mut p);
        log::debug!(
            "exact round {rounds}: model budget {model_budget}, objective {objective:.4e} (bound {bound:.4e}, proven {proven}), {} chosen, arena {} (budget {budget}), cost {true_cost:.4e}",
            chosen.len(),
            plan.arena
        );
        if plan.arena <= budget {
            let recomputed = g.topo_order()?.into_iter().filter(|n| set.contains(n)).collect();
            last = (Some(Outcome { graph: g2, plan, recomputed, cost: true_cost, arena_before: base.arena }), objective);
            break;
        }
        // Over by the fragmentation and the recomputations' own buffers:
        // ask the model for that much more.
        model_budget = model_budget.saturating_sub((plan.arena - budget).max(1));
        last.1 = objective;
        if started.elapsed() >= limit {
            break;
        }
    }
    let (lower_bound, proven) = first.unwrap_or((f64::INFINITY, true));
    Ok(Exact { outcome: last.0, lower_bound, proven, model_cost: last.1, rounds })
}

/// A saved value in the model.
struct Item {
    node: NodeId,
    /// Steps `free.0..free.1` hold its bytes only when it is kept.
    free: (usize, usize),
    bytes: usize,
    /// Forward computations only its recomputation needs (not views).
    need: Vec<NodeId>,
    /// Its saved operands.
    operands: BTreeSet<NodeId>,
}

/// Solves the model at `budget`: the chosen items, the objective, the
/// proven lower bound and whether the optimum was proven; `None` when no
/// choice frees enough bytes at some step.
fn solve(
    items: &[Item],
    index: &HashMap<NodeId, usize>,
    costs: &[f64],
    need_costs: &BTreeMap<NodeId, f64>,
    live: &[usize],
    budget: usize,
    limit: Duration,
) -> Option<(Vec<usize>, f64, f64, bool)> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    // One row per set of covering items: the largest excess among its steps.
    let mut rows: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    for (t, &l) in live.iter().enumerate() {
        if l <= budget {
            continue;
        }
        let cover: Vec<usize> = (0..items.len()).filter(|&i| items[i].free.0 <= t && t < items[i].free.1 && items[i].bytes > 0).collect();
        let e = rows.entry(cover).or_insert(0);
        *e = (*e).max(l - budget);
    }
    if let Some((cover, excess)) = rows.iter().find(|(cover, excess)| cover.iter().map(|&i| items[i].bytes).sum::<usize>() < **excess) {
        log::debug!("exact: {excess} bytes over at a step where recomputing {} values frees less", cover.len());
        return None;
    }
    // Costs in units of the largest, for the solver's tolerances.
    let scale = costs.iter().chain(need_costs.values()).fold(0f64, |a, &b| a.max(b)).max(1e-30);
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let x: Vec<_> = costs.iter().map(|&c| p.add_binary_var(c / scale)).collect();
    let y: BTreeMap<NodeId, _> = need_costs.iter().map(|(&m, &c)| (m, p.add_binary_var(c / scale))).collect();
    // A private recomputation of saved value a (with its needs) in i's
    // recomputation, when a chain of recomputed saved operands leads from
    // i to a: r_ia >= x_a + r_ip - 1 for each link p -> a (r_ii = x_i).
    let private: Vec<f64> = items.iter().enumerate().map(|(a, it)| costs[a] + it.need.iter().map(|m| need_costs[m]).sum::<f64>()).collect();
    let links: Vec<Vec<usize>> = items.iter().map(|it| it.operands.iter().filter_map(|o| index.get(o).copied()).collect()).collect();
    for (i, it) in items.iter().enumerate() {
        for m in &it.need {
            p.add_constraint([(y[m], 1.0), (x[i], -1.0)], ComparisonOp::Ge, 0.0);
        }
        let mut r: HashMap<usize, microlp::Variable> = HashMap::from_iter([(i, x[i])]);
        let mut stack = vec![i];
        while let Some(q) = stack.pop() {
            for &a in &links[q] {
                let ra = *r.entry(a).or_insert_with(|| {
                    stack.push(a);
                    p.add_var(private[a] / scale, (0.0, 1.0))
                });
                p.add_constraint([(ra, 1.0), (x[a], -1.0), (r[&q], -1.0)], ComparisonOp::Ge, -1.0);
            }
        }
    }
    // Bytes in units of the largest excess.
    let unit = rows.values().copied().max().unwrap_or(1).max(1) as f64;
    for (cover, excess) in &rows {
        let terms: Vec<_> = cover.iter().map(|&i| (x[i], items[i].bytes as f64 / unit)).collect();
        p.add_constraint(terms.as_slice(), ComparisonOp::Ge, *excess as f64 / unit);
    }
    p.set_time_limit(limit.max(Duration::from_millis(10)));
    let outcome = p.solve().ok()?;
    let proven = outcome.is_optimal();
    let bound = outcome.stats().best_bound.unwrap_or(0.0) * scale;
    let sol = outcome.solution()?;
    let chosen: Vec<usize> = (0..items.len()).filter(|&i| sol.var_value_raw(x[i]) > 0.5).collect();
    Some((chosen, sol.objective() * scale, bound.max(0.0), proven))
}
