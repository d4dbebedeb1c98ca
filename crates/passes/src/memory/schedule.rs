//! Candidate schedules: the model's own order, depth-first from the
//! outputs, and list scheduling that prefers the node freeing most bytes.
//! The planner keeps the one with the lowest simulated peak, as XLA's
//! memory scheduler does.

use crate::{HashMap, HashSet};
use smelt_ir::traits::Kind;
use smelt_ir::{IrError, KernelGraph, NodeId, OpSet};

/// Every candidate schedule, by name. Each lists inputs first, then every
/// other non-constant node in a topological order; `given` (such a
/// schedule) is one more.
pub fn candidates(g: &KernelGraph, hint: Option<&[NodeId]>, given: Option<&[NodeId]>) -> Result<Vec<(&'static str, Vec<NodeId>)>, IrError> {
    let topo = g.topo_order()?;
    let keep = |id: &NodeId| !(g.node(*id).op.is_persistent() || g.node(*id).op.is_input());
    let inputs: Vec<NodeId> = g.inputs().to_vec();
    let with_inputs = |v: Vec<NodeId>| inputs.iter().copied().chain(v).collect::<Vec<_>>();
    let model: Vec<NodeId> = topo.iter().copied().filter(keep).collect();
    let mut out = vec![
        ("model", with_inputs(model.clone())),
        ("depth-first", with_inputs(depth_first(g, &model))),
        ("list", with_inputs(list(g, &model))),
    ];
    if let Some(h) = hint {
        out.push(("hint", with_inputs(hinted(g, &model, h))));
    }
    if let Some(o) = given {
        out.push(("given", o.to_vec()));
    }
    // Each again with the nodes that grow memory run as late as they can.
    // (Each schedule on the machine's cores, kept in order.)
    let sunk = crate::par_map(&out, |(name, order)| {
        let name = match *name {
            "model" => "model+late",
            "depth-first" => "depth-first+late",
            "list" => "list+late",
            "hint" => "hint+late",
            _ => "given+late",
        };
        let late = sink_growing(g, order.clone());
        (late != *order).then_some((name, late))
    });
    out.extend(sunk.into_iter().flatten());
    let placed = crate::par_map(&out, |(_, order)| place_updates(g, sink_recomputes(g, order.clone())));
    Ok(out.into_iter().zip(placed).map(|((name, _), order)| (name, order)).collect())
}

/// Moves each node whose output is larger than its operands in the arena
/// (a cast to f32 that the backward pass reads, a mask) to just before its
/// first reader, later ones first: a training step's backward ops that need
/// only forward values would otherwise run in the forward pass and hold
/// their larger outputs across it. (A candidate, not a rule: a longer-lived
/// operand can stop a neighbour from working in place.)
fn sink_growing(g: &KernelGraph, order: Vec<NodeId>) -> Vec<NodeId> {
    let arena_bytes = |v: &smelt_ir::ValueId| if g.node(v.node).op.is_persistent() { 0 } else { g.ty(*v).bytes() };
    let growing: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&n| {
            let node = g.node(n);
            let kind = node.op.traits().kind;
            let out: usize = node.outputs.iter().map(|t| t.bytes()).sum();
            let ins: usize = g.inputs_of(n).iter().map(arena_bytes).sum();
            !node.op.is_view() && !node.op.is_input() && kind != Kind::Update && out > ins
        })
        .collect();
    sink(g, order, &growing)
}

/// Moves each of `late` (in `order`'s order) to just before its first
/// reader, later ones first; one without readers stays.
///
/// The order is a linked list whose nodes carry increasing labels, so a
/// node's first reader is the reader with the smallest label and a move is
/// constant time (labels are spread again when a gap runs out): linear in
/// the schedule and the readers, where moving in a vector was quadratic.
fn sink(g: &KernelGraph, order: Vec<NodeId>, late: &[NodeId]) -> Vec<NodeId> {
    if late.is_empty() {
        return order;
    }
    const GAP: u64 = 1 << 32;
    let len = order.len();
    let (head, tail) = (len, len + 1);
    let slot: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &m)| (m, i)).collect();
    // head -> 0 -> 1 -> ... -> len - 1 -> tail, labelled in steps of GAP.
    let chain: Vec<usize> = std::iter::once(head).chain(0..len).chain(std::iter::once(tail)).collect();
    let (mut next, mut prev, mut label) = (vec![0; len + 2], vec![0; len + 2], vec![0u64; len + 2]);
    for (k, w) in chain.windows(2).enumerate() {
        (next[w[0]], prev[w[1]]) = (w[1], w[0]);
        label[w[1]] = (k as u64 + 1) * GAP;
    }
    for &n in late.iter().rev() {
        let i = slot[&n];
        // Its readers come after it: it only moves later.
        let first =
            g.users_of(n).into_iter().filter_map(|u| slot.get(&u).copied()).filter(|&j| label[j] > label[i]).min_by_key(|&j| label[j]);
        let Some(j) = first else { continue };
        if next[i] == j {
            continue;
        }
        // Unlink i; link it just before j.
        let (p, q) = (prev[i], next[i]);
        next[p] = q;
        prev[q] = p;
        let before = prev[j];
        (next[before], prev[i], next[i], prev[j]) = (i, before, j, i);
        if label[j] - label[before] < 2 {
            // No room between them: spread every label again, in list order.
            let (mut at, mut k) = (head, 0);
            while at != tail {
                label[at] = k * GAP;
                (at, k) = (next[at], k + 1);
            }
            label[tail] = k * GAP;
        } else {
            label[i] = label[before] + (label[j] - label[before]) / 2;
        }
    }
    let mut out = Vec::with_capacity(len);
    let mut at = next[head];
    while at != tail {
        out.push(order[at]);
        at = next[at];
    }
    out
}

/// Moves each recomputation (`Node::recomputes`) to just before its first
/// reader, later ones first, so that a chain of them runs together where
/// the backward pass needs it: recomputing early would keep the value alive
/// as long as the original it replaces. The readers of a recomputation
/// that are not updates move first the same way (a backward op that needs
/// only forward values, such as a ReLU's mask, may have been scheduled in
/// the forward pass, which would pull the recomputation there too).
pub(crate) fn sink_recomputes(g: &KernelGraph, order: Vec<NodeId>) -> Vec<NodeId> {
    let clones: HashSet<NodeId> = order.iter().copied().filter(|&n| g.node(n).recomputes.is_some()).collect();
    if clones.is_empty() {
        return order;
    }
    let readers: HashSet<NodeId> = clones
        .iter()
        .flat_map(|&c| g.users_of(c))
        .filter(|&u| !clones.contains(&u) && g.node(u).op.traits().kind != Kind::Update && !g.users_of(u).is_empty())
        .collect();
    let late: Vec<NodeId> = order.iter().copied().filter(|n| clones.contains(n) || readers.contains(n)).collect();
    sink(g, order, &late)
}

/// The nodes that read `v` or a view of it.
pub(super) fn readers(g: &KernelGraph, v: NodeId) -> Vec<NodeId> {
    let (mut out, mut stack) = (Vec::new(), vec![v]);
    while let Some(n) = stack.pop() {
        for u in g.users_of(n).into_iter().collect::<HashSet<_>>() {
            if g.node(u).op.is_view() {
                stack.push(u);
            }
            out.push(u);
        }
    }
    out
}

/// Moves each optimizer update (`Kind::Update`) to the earliest step after
/// its operands and after every other reader of the values it replaces
/// (through views): its gradient dies as soon as it can, and nothing reads
/// a parameter after its update wrote it. The step counter's update reads
/// nothing another update replaces, but others read the counter: it goes
/// after them.
pub(crate) fn place_updates(g: &KernelGraph, order: Vec<NodeId>) -> Vec<NodeId> {
    let is_update = |n: NodeId| g.node(n).op.traits().kind == Kind::Update;
    let (updates, rest): (Vec<NodeId>, Vec<NodeId>) = order.into_iter().partition(|&n| is_update(n));
    if updates.is_empty() {
        return rest;
    }
    let at: HashMap<NodeId, usize> = rest.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // Per update: the last non-update node it must follow, and whether it
    // must follow other updates (they read what it replaces).
    let mut after: Vec<(Option<usize>, bool, NodeId)> = updates
        .iter()
        .map(|&u| {
            let ins = g.inputs_of(u);
            let op = g.node(u).op.semantic().expect("updates are semantic ops");
            let targets: Vec<NodeId> = (0..g.node(u).outputs.len()).filter_map(|s| op.updated_operand(s)).map(|i| ins[i].node).collect();
            let readers: Vec<NodeId> = targets.iter().flat_map(|&t| readers(g, t)).filter(|&r| r != u).collect();
            let last = ins.iter().map(|v| v.node).chain(readers.iter().copied()).filter_map(|n| at.get(&n).copied()).max();
            (last, readers.iter().any(|&r| is_update(r)), u)
        })
        .collect();
    after.sort_by_key(|&(_, late, _)| late);
    let mut out = Vec::with_capacity(rest.len() + updates.len());
    let (early, late): (Vec<_>, Vec<_>) = after.into_iter().partition(|a| !a.1);
    // Each early update after its step, in their order (bucketed: one pass).
    let mut after_step: Vec<Vec<NodeId>> = vec![Vec::new(); rest.len()];
    for a in &early {
        match a.0 {
            None => out.push(a.2),
            Some(i) => after_step[i].push(a.2),
        }
    }
    for (&n, ups) in rest.iter().zip(after_step) {
        out.push(n);
        out.extend(ups);
    }
    out.extend(late.into_iter().map(|a| a.2));
    out
}

/// A topological order following `hint` (model nodes, the provenance of a
/// kernel graph's nodes, in a preferred order: the best schedule of the
/// unfused graph): a node runs at the latest position of its origin in the
/// hint (where its output would be complete), or right after its latest
/// operand when none is there. Identity, not names, ties the two graphs, so
/// the fused graph can always follow the unfused graph's schedule, and
/// fusion never raises the peak.
fn hinted(g: &KernelGraph, nodes: &[NodeId], hint: &[NodeId]) -> Vec<NodeId> {
    let pos: HashMap<NodeId, usize> = hint.iter().enumerate().rev().map(|(i, &n)| (n, i)).collect();
    let set: HashSet<NodeId> = nodes.iter().copied().collect();
    let rank: HashMap<NodeId, usize> = nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut prio: HashMap<NodeId, (usize, usize)> = HashMap::default();
    for &n in nodes {
        let after_inputs = g.inputs_of(n).iter().filter_map(|v| prio.get(&v.node)).map(|p| p.0).max().unwrap_or(0);
        let p = g.origin(n).iter().filter_map(|o| pos.get(o)).copied().max().unwrap_or(after_inputs).max(after_inputs);
        prio.insert(n, (p, rank[&n]));
    }
    let mut missing: HashMap<NodeId, usize> = nodes
        .iter()
        .map(|&n| (n, g.inputs_of(n).iter().map(|v| v.node).filter(|m| set.contains(m)).collect::<HashSet<_>>().len()))
        .collect();
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<((usize, usize), NodeId)>> =
        nodes.iter().filter(|n| missing[n] == 0).map(|&n| std::cmp::Reverse((prio[&n], n))).collect();
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(std::cmp::Reverse((_, n))) = ready.pop() {
        out.push(n);
        for u in g.users_of(n).into_iter().collect::<HashSet<_>>() {
            if let Some(m) = missing.get_mut(&u) {
                *m -= 1;
                if *m == 0 {
                    ready.push(std::cmp::Reverse((prio[&u], u)));
                }
            }
        }
    }
    out
}

/// Post-order from the outputs, visiting the operand with the largest
/// subgraph first (so its big intermediates die before the others start).
fn depth_first(g: &KernelGraph, nodes: &[NodeId]) -> Vec<NodeId> {
    let set: HashSet<NodeId> = nodes.iter().copied().collect();
    let mut size: HashMap<NodeId, usize> = HashMap::default();
    for &n in nodes {
        // A tree count: shared operands count once per path, so it saturates
        // (a chain of diamonds doubles it at each step).
        let s = g
            .inputs_of(n)
            .iter()
            .filter(|v| set.contains(&v.node))
            .map(|v| size.get(&v.node).copied().unwrap_or(0))
            .fold(1usize, usize::saturating_add);
        size.insert(n, s);
    }
    let mut done = HashSet::default();
    let mut out = Vec::with_capacity(nodes.len());
    for (_, v) in g.outputs() {
        // Iterative DFS: (node, expanded).
        let mut stack = vec![(v.node, false)];
        while let Some((n, expanded)) = stack.pop() {
            if !set.contains(&n) || done.contains(&n) {
                continue;
            }
            if expanded {
                done.insert(n);
                out.push(n);
                continue;
            }
            stack.push((n, true));
            let mut ins: Vec<NodeId> = g.inputs_of(n).iter().map(|v| v.node).filter(|m| set.contains(m) && !done.contains(m)).collect();
            ins.sort_by_key(|m| size[m]); // pushed last = visited first: the largest
            stack.extend(ins.into_iter().map(|m| (m, false)));
        }
    }
    // Nodes no output needs (none after dce) keep the model order at the end.
    out.extend(nodes.iter().copied().filter(|n| !done.contains(n)));
    out
}

/// Greedy list scheduling: among ready nodes, run the one whose execution
/// frees the most bytes net of what it allocates; ties by model order.
fn list(g: &KernelGraph, nodes: &[NodeId]) -> Vec<NodeId> {
    let set: HashSet<NodeId> = nodes.iter().copied().collect();
    let rank: HashMap<NodeId, usize> = nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut remaining_users: HashMap<NodeId, usize> = HashMap::default();
    let mut missing: HashMap<NodeId, usize> = HashMap::default();
    for &n in nodes {
        let deps: HashSet<NodeId> = g.inputs_of(n).iter().map(|v| v.node).filter(|m| set.contains(m)).collect();
        missing.insert(n, deps.len());
        for d in deps {
            *remaining_users.entry(d).or_default() += 1;
        }
    }
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let bytes = |n: NodeId| -> i64 {
        if g.node(n).op.is_view() {
            0
        } else {
            g.node(n).outputs.iter().map(|t| t.bytes() as i64).sum()
        }
    };
    let mut ready: Vec<NodeId> = nodes.iter().copied().filter(|n| missing[n] == 0).collect();
    let mut out = Vec::with_capacity(nodes.len());
    while !ready.is_empty() {
        let score = |n: NodeId| -> i64 {
            let deps: HashSet<NodeId> = g.inputs_of(n).iter().map(|v| v.node).filter(|m| set.contains(m)).collect();
            let freed: i64 = deps.iter().filter(|d| remaining_users[d] == 1 && !outputs.contains(d)).map(|&d| bytes(d)).sum();
            freed - bytes(n)
        };
        let (i, _) = ready.iter().enumerate().max_by_key(|&(_, &n)| (score(n), std::cmp::Reverse(rank[&n]))).expect("non-empty");
        let n = ready.swap_remove(i);
        out.push(n);
        let deps: HashSet<NodeId> = g.inputs_of(n).iter().map(|v| v.node).filter(|m| set.contains(m)).collect();
        for d in deps {
            *remaining_users.get_mut(&d).expect("counted") -= 1;
        }
        for u in g.users_of(n).into_iter().collect::<HashSet<_>>() {
            if let Some(m) = missing.get_mut(&u) {
                *m -= 1;
                if *m == 0 {
                    ready.push(u);
                }
            }
        }
    }
    out
}
