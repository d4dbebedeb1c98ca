//! The independent checker. It trusts nothing the planner computed but the
//! schedule, the placements and the arena size: it recomputes liveness from
//! the graph and the schedule, then verifies that
//!
//! 1. the schedule runs every non-constant node once, after its operands;
//! 2. every value sits inside the arena, views exactly on their source (a
//!    `slice_view` on its rows of it) and slices of an in-place
//!    concatenation exactly on their slice;
//! 3. no two values live at the same time overlap in the arena (a value is
//!    live from just after the step that writes it through its last read,
//!    reads of a step happening before its writes);
//! 4. a kernel overwrites one of its own inputs only where it reads each
//!    element once before writing it: elementwise ops on an input of the
//!    output's type, a fused convolution on its residual;
//! 5. simulating the schedule, every read finds the bytes its writer left,
//!    not overwritten since (graph outputs are read at the end);
//! 6. an optimizer update, which writes into the parameter and state it
//!    replaces (outside the arena), runs after every other reader of them;
//! 7. a recomputation (`Node::recomputes`) computes what its original
//!    does: the same op and output types, each operand the original's or a
//!    recomputation of it, and it runs after its original.

use super::Plan;
use crate::{HashMap, HashSet};
use smelt_ir::traits::{InPlace, Kind};
use smelt_ir::{KernelGraph, KernelOp, NodeId, OpSet, ValueId};

/// Sorted intervals with adjacent ones merged.
fn normal(mut v: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    v.sort();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if l.1 == s => l.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

fn overlap(a: &[(usize, usize)], b: &[(usize, usize)]) -> bool {
    a.iter().any(|&(s, e)| b.iter().any(|&(s2, e2)| s < e2 && s2 < e))
}

/// Checks `plan` for `g`; the error says which values collide and where.
pub fn check(g: &KernelGraph, plan: &Plan) -> Result<(), String> {
    let name = |v: ValueId| format!("{v} \"{}\" ({})", g.node(v.node).name, g.node(v.node).op.name());
    // 1. The schedule.
    let step: HashMap<NodeId, usize> = plan.schedule.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    if step.len() != plan.schedule.len() {
        return Err("a node is scheduled twice".into());
    }
    for id in g.node_ids() {
        let op = &g.node(id).op;
        if !op.is_persistent() && !step.contains_key(&id) {
            return Err(format!("{id} is never scheduled"));
        }
        if op.is_persistent() && step.contains_key(&id) {
            return Err(format!("constant {id} is scheduled"));
        }
    }
    for &id in &plan.schedule {
        for v in g.inputs_of(id) {
            if !g.node(v.node).op.is_persistent() && step[&v.node] >= step[&id] {
                return Err(format!("{id} runs before its operand {}", name(v)));
            }
        }
    }
    // Which values are backed by persistent data (views of weights, the
    // results of updates): not in the arena.
    let mut constant = HashSet::default();
    for &id in &plan.schedule {
        let node = g.node(id);
        if node.op.is_view() && g.inputs_of(id).first().is_some_and(|s| g.node(s.node).op.is_persistent() || constant.contains(s)) {
            constant.insert(ValueId { node: id, slot: 0 });
        }
        if node.op.traits().kind == Kind::Update {
            constant.extend((0..node.outputs.len() as u32).map(|slot| ValueId { node: id, slot }));
        }
    }
    // 6. Updates after every other reader of what they replace.
    for &u in plan.schedule.iter().filter(|&&u| g.node(u).op.traits().kind == Kind::Update) {
        let op = g.node(u).op.semantic().ok_or_else(|| format!("update {u} is not a semantic op"))?;
        let ins = g.inputs_of(u);
        for slot in 0..g.node(u).outputs.len() {
            let target =
                op.updated_operand(slot).and_then(|i| ins.get(i)).ok_or_else(|| format!("update {u} has no operand for output {slot}"))?;
            if !g.node(target.node).op.is_persistent() {
                return Err(format!("update {u} replaces {}, which is not persistent", name(*target)));
            }
            // Readers directly or through views.
            let mut stack = vec![target.node];
            while let Some(n) = stack.pop() {
                for r in g.users_of(n) {
                    if g.node(r).op.is_view() {
                        stack.push(r);
                    } else if r != u && step[&r] > step[&u] {
                        return Err(format!("{r} reads {} after update {u} replaced it", name(*target)));
                    }
                }
            }
        }
    }
    // 7. Recomputations.
    for &id in &plan.schedule {
        let Some(orig) = g.node(id).recomputes else { continue };
        let (n, o) =
            (g.node(id), g.contains(orig).then(|| g.node(orig)).ok_or_else(|| format!("{id} recomputes {orig}, which does not exist"))?);
        if n.op != o.op || n.outputs != o.outputs {
            return Err(format!("{id} recomputes {orig} with another op or type: {} against {}", n.op.name(), o.op.name()));
        }
        let (ins, oins) = (g.inputs_of(id), g.inputs_of(orig));
        let same = |a: &ValueId, b: &ValueId| a == b || (a.slot == b.slot && g.node(a.node).recomputes == Some(b.node));
        if ins.len() != oins.len() || !ins.iter().zip(&oins).all(|(a, b)| same(a, b)) {
            return Err(format!("{id} recomputes {orig} from other operands"));
        }
        if step.get(&orig).is_some_and(|&s| s >= step[&id]) {
            return Err(format!("{id} recomputes {orig} before it ran"));
        }
    }
    // 2. Placements. Buffers start on the plan's alignment (vector loads
    // and stores need 16 bytes; a device allocation gives 256).
    if let Some(b) = plan.buffers.iter().find(|b| b.offset % super::ALIGN != 0) {
        return Err(format!("buffer {} (\"{}\") is at byte {}, not a multiple of {}", b.id, b.name, b.offset, super::ALIGN));
    }
    // Placements.
    let place = |v: ValueId| plan.placements.get(&v).map(|p| p.intervals.as_slice());
    for &id in &plan.schedule {
        let node = g.node(id);
        let ins = g.inputs_of(id);
        for slot in 0..node.outputs.len() as u32 {
            let v = ValueId { node: id, slot };
            if constant.contains(&v) {
                continue;
            }
            let iv = place(v).ok_or_else(|| format!("{} has no placement", name(v)))?;
            let total: usize = iv.iter().map(|(s, e)| e - s).sum();
            if total != g.ty(v).bytes() || iv.iter().any(|&(s, e)| s > e || e > plan.arena) {
                return Err(format!("{} is placed at {iv:?}: wrong size or outside the arena of {} bytes", name(v), plan.arena));
            }
            // Kernels address elements: every piece starts on an element.
            let elem = g.ty(v).dtype.size().max(1);
            if let Some((s, _)) = iv.iter().find(|(s, _)| s % elem != 0) {
                return Err(format!("{} is placed at byte {s}, not a multiple of its element size {elem}", name(v)));
            }
            let on_source = !node.op.is_view()
                || match (&node.op, place(ins[0])) {
                    // The slice's bytes of its (contiguous) source.
                    (KernelOp::SliceView { axis, start, end }, Some(&[(s, e)])) => {
                        let src = g.ty(ins[0]);
                        let row = src.bytes() / src.shape[*axis].max(1);
                        e - s == src.bytes() && iv == [(s + start * row, s + end * row)]
                    }
                    (_, p) => Some(iv) == p,
                };
            if !on_source {
                return Err(format!("view {} is not placed on its source", name(v)));
            }
        }
        if let (KernelOp::ConcatInPlace { axis }, false) = (&node.op, plan.copied_concats.contains(&id)) {
            let axis = *axis;
            let out = ValueId { node: id, slot: 0 };
            let base = match place(out) {
                Some([(s, _)]) => *s,
                _ => return Err(format!("in-place concatenation {} must be one interval", name(out))),
            };
            let ty = g.ty(out);
            let outer: usize = ty.shape[..axis].iter().product();
            let row = ty.bytes() / outer.max(1);
            let mut at = 0;
            for u in &ins {
                let chunk = g.ty(*u).bytes() / outer.max(1);
                let want: Vec<(usize, usize)> = (0..outer).map(|o| (base + o * row + at, base + o * row + at + chunk)).collect();
                let got: Vec<(usize, usize)> = place(*u)
                    .unwrap_or(&[])
                    .iter()
                    .flat_map(|&(s, e)| (s..e).step_by(chunk.max(1)).map(move |a| (a, (a + chunk).min(e))))
                    .collect();
                if got != want {
                    return Err(format!("{} is not placed on its slice of {}", name(*u), name(out)));
                }
                at += chunk;
            }
        }
    }
    // The kernel writes that put each value's bytes in place.
    let mut writers_memo: HashMap<ValueId, Vec<ValueId>> = HashMap::default();
    // An in-place concatenation is written by its inputs' producers, unless
    // the plan copies it.
    let aliased = |id: NodeId| matches!(g.node(id).op, KernelOp::ConcatInPlace { .. }) && !plan.copied_concats.contains(&id);
    fn writers(g: &KernelGraph, v: ValueId, aliased: &dyn Fn(NodeId) -> bool, memo: &mut HashMap<ValueId, Vec<ValueId>>) -> Vec<ValueId> {
        if let Some(w) = memo.get(&v) {
            return w.clone();
        }
        let op = &g.node(v.node).op;
        let w = if op.is_view() {
            writers(g, g.inputs_of(v.node)[0], aliased, memo)
        } else if aliased(v.node) {
            g.inputs_of(v.node).into_iter().flat_map(|u| writers(g, u, aliased, memo)).collect()
        } else {
            vec![v]
        };
        memo.insert(v, w.clone());
        w
    }
    // 3. Lifetimes in half steps: written at 2t+1, read at 2t.
    let mut life: HashMap<ValueId, (usize, usize)> = HashMap::default();
    for &id in &plan.schedule {
        let node = g.node(id);
        if !node.op.is_view() && !aliased(id) && node.op.traits().kind != Kind::Update {
            for slot in 0..node.outputs.len() as u32 {
                let t = 2 * step[&id] + 1;
                life.insert(ValueId { node: id, slot }, (t, t));
            }
        }
    }
    let end = 2 * plan.schedule.len();
    let mut reads: Vec<(ValueId, usize)> = Vec::new();
    for &id in &plan.schedule {
        reads.extend(
            g.inputs_of(id).into_iter().filter(|v| !constant.contains(v) && !g.node(v.node).op.is_persistent()).map(|v| (v, 2 * step[&id])),
        );
    }
    reads.extend(g.outputs().iter().filter(|(_, v)| !constant.contains(v) && !g.node(v.node).op.is_persistent()).map(|(_, v)| (*v, end)));
    for &(v, t) in &reads {
        for w in writers(g, v, &aliased, &mut writers_memo) {
            let l = life.get_mut(&w).expect("every writer has a lifetime");
            l.1 = l.1.max(t);
        }
    }
    let mut written: Vec<(ValueId, (usize, usize))> = life.iter().map(|(&v, &l)| (v, l)).collect();
    written.sort_by_key(|(v, l)| (l.0, *v));
    for (i, (a, la)) in written.iter().enumerate() {
        for (b, lb) in &written[i + 1..] {
            if lb.0 > la.1 {
                break; // sorted by start: no later value is live with `a`
            }
            if overlap(place(*a).unwrap_or(&[]), place(*b).unwrap_or(&[])) {
                return Err(format!("{} and {} are live at the same time and overlap in the arena", name(*a), name(*b)));
            }
        }
    }
    // 4 and 5. Simulate: reads of a step, then its writes.
    let mut log: Vec<(usize, ValueId)> = Vec::new(); // (step, value written)
    let mut when: HashMap<ValueId, usize> = HashMap::default();
    let check_read = |v: ValueId,
                      t: usize,
                      log: &[(usize, ValueId)],
                      when: &HashMap<ValueId, usize>,
                      memo: &mut HashMap<ValueId, Vec<ValueId>>|
     -> Result<(), String> {
        for w in writers(g, v, &aliased, memo) {
            let tw = *when.get(&w).ok_or_else(|| format!("{} is read before it is written", name(w)))?;
            let iw = place(w).unwrap_or(&[]);
            if let Some((s, x)) = log.iter().find(|(s, x)| *s > tw && *x != w && overlap(iw, place(*x).unwrap_or(&[]))) {
                return Err(format!("{} is read at step {t} but {} overwrote it at step {s}", name(w), name(*x)));
            }
        }
        Ok(())
    };
    for &id in &plan.schedule {
        let t = step[&id];
        let node = g.node(id);
        let ins: Vec<ValueId> =
            g.inputs_of(id).into_iter().filter(|v| !constant.contains(v) && !g.node(v.node).op.is_persistent()).collect();
        for &u in &ins {
            check_read(u, t, &log, &when, &mut writers_memo)?;
        }
        if node.op.is_view() || aliased(id) || node.op.traits().kind == Kind::Update {
            continue;
        }
        for slot in 0..node.outputs.len() as u32 {
            let v = ValueId { node: id, slot };
            let iv = place(v).unwrap_or(&[]);
            for &u in &ins {
                let iu: Vec<(usize, usize)> =
                    writers(g, u, &aliased, &mut writers_memo).iter().flat_map(|w| place(*w).unwrap_or(&[]).to_vec()).collect();
                if !overlap(iv, &iu) {
                    continue;
                }
                let same = normal(iu) == normal(iv.to_vec()) && g.ty(u) == g.ty(v);
                // The op's own facts say which operand it may overwrite; the
                // last operand is counted before constants are dropped.
                let in_place = node.op.traits().in_place;
                let elementwise = in_place == InPlace::Any;
                let all = g.inputs_of(id);
                let residual = in_place == InPlace::Last && all.last() == Some(&u) && !all[..all.len() - 1].contains(&u);
                if !(same && (elementwise || residual)) {
                    return Err(format!("{} overwrites its operand {} while reading it", name(v), name(u)));
                }
            }
            log.push((t, v));
            when.insert(v, t);
        }
    }
    for (_, v) in g.outputs() {
        if !constant.contains(v) && !g.node(v.node).op.is_persistent() {
            check_read(*v, plan.schedule.len(), &log, &when, &mut writers_memo)?;
        }
    }
    Ok(())
}
