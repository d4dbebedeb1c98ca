//! Liveness and aliasing: which values share a buffer, and when each
//! buffer is live.
//!
//! - A view (reshape, flatten, squeeze, unsqueeze, identity, dropout) shares
//!   its source's bytes; a `slice_view` shares its slice of them.
//! - The inputs of an in-place concatenation live in their slices of its
//!   output (strided intervals when the axis is not the outermost), unless
//!   the planner chose to copy it: aliasing makes the whole output live from
//!   its first slice's producer on, which can raise the peak.
//! - An elementwise kernel (or batch norm) whose input has the output's type
//!   and dies at this kernel writes over that input; a fused convolution
//!   writes over its residual when the residual dies there and is not also
//!   read as an ordinary operand.
//!
//! - An optimizer update writes into the persistent values it replaces:
//!   its outputs take no arena bytes.
//!
//! Graph inputs are never overwritten; graph outputs live until the end.

use crate::HashMap;
use smelt_ir::traits::{InPlace, Kind};
use smelt_ir::{KernelGraph, KernelOp, NodeId, OpSet, ValueId};

/// A buffer: bytes `[offset, offset + size)` of the arena, live from step
/// `start` to step `end` inclusive (steps index the schedule).
#[derive(Clone, Debug)]
pub struct Buffer {
    /// Index in the plan's buffer list.
    pub id: usize,
    /// Bytes used.
    pub size: usize,
    /// First step at which it is written.
    pub start: usize,
    /// Last step at which it is read (the last step for graph outputs).
    pub end: usize,
    /// Offset in the arena (set by assignment).
    pub offset: usize,
    /// The values it holds, in definition order.
    pub values: Vec<ValueId>,
    /// A name to show: the first value's node name.
    pub name: String,
}

/// A value's place relative to its buffer.
#[derive(Clone, Debug)]
pub struct Rel {
    /// The buffer.
    pub buffer: usize,
    /// Byte intervals relative to the buffer's start.
    pub intervals: Vec<(usize, usize)>,
}

impl Rel {
    /// Absolute placement once offsets are assigned.
    pub fn place(&self, bufs: &[Buffer]) -> super::Placement {
        let o = bufs[self.buffer].offset;
        super::Placement { buffer: self.buffer, intervals: self.intervals.iter().map(|&(a, b)| (a + o, b + o)).collect() }
    }
}

/// Each value's group and its byte intervals relative to the group.
type Places = HashMap<ValueId, (usize, Vec<(usize, usize)>)>;

#[derive(Clone)]
struct Group {
    members: Vec<ValueId>,
    start: usize,
    end: usize,
    input: bool,
}

/// Whether concatenation `id` can alias its inputs into its slices: distinct
/// inputs, none a constant or graph input, each group holding only
/// full-range values (not already a slice of something else).
fn aliasable(g: &KernelGraph, id: NodeId, ins: &[ValueId], rel: &Places, groups: &[Group]) -> bool {
    let distinct: crate::HashSet<_> = ins.iter().collect();
    // Only where every slice is one contiguous interval (the product of the
    // dims before the axis is 1, e.g. channels at batch 1): kernels write
    // their output densely. At batch > 1 the concatenation is a copy; on the
    // light models at batch 8 this costs no arena bytes.
    let contiguous = match g.node(id).op {
        KernelOp::ConcatInPlace { axis } => g.node(id).outputs[0].shape[..axis].iter().product::<usize>() == 1,
        _ => true,
    };
    contiguous
        && distinct.len() == ins.len()
        && ins.iter().all(|u| match rel.get(u) {
            Some((gr, _)) => {
                !groups[*gr].input
                    && *gr != rel[&ValueId { node: id, slot: 0 }].0
                    && groups[*gr].members.iter().all(|m| rel[m].1 == [(0, g.ty(*m).bytes())])
            }
            None => false,
        })
}

/// Builds the buffers of `g` under `schedule` and the place of each value.
/// In-place concatenations listed in `copied` are planned as copies, and so
/// is any that cannot alias its inputs; the third result lists them all.
pub fn build(
    g: &KernelGraph,
    schedule: &[NodeId],
    copied: &crate::HashSet<NodeId>,
) -> (Vec<Buffer>, HashMap<ValueId, Rel>, crate::HashSet<NodeId>) {
    let mut copies = copied.clone();
    let n = schedule.len();
    let step: HashMap<NodeId, usize> = schedule.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    // Last read of each value; graph outputs are read "at the end".
    let mut last: HashMap<ValueId, usize> = HashMap::default();
    for &id in schedule {
        for v in g.inputs_of(id) {
            let e = last.entry(v).or_insert(0);
            *e = (*e).max(step[&id]);
        }
    }
    for (_, v) in g.outputs() {
        last.insert(*v, n.saturating_sub(1));
    }
    let outputs: crate::HashSet<ValueId> = g.outputs().iter().map(|(_, v)| *v).collect();
    // value -> (group, intervals relative to the group)
    let mut rel: Places = HashMap::default();
    let mut groups: Vec<Group> = Vec::new();
    let bytes = |v: ValueId| g.ty(v).bytes();
    for &id in schedule {
        let node = g.node(id);
        let t = step[&id];
        let ins = g.inputs_of(id);
        for slot in 0..node.outputs.len() as u32 {
            let v = ValueId { node: id, slot };
            let end = last.get(&v).copied().unwrap_or(t).max(t);
            if node.op.traits().kind == Kind::Update {
                continue; // written into the persistent value it replaces
            }
            if node.op.is_view() {
                // Shares the source's bytes (nothing when the source is a constant).
                if let Some((gr, iv)) = rel.get(&ins[0]).cloned() {
                    let iv = match node.op {
                        KernelOp::SliceView { axis, start, .. } => {
                            let src = g.ty(ins[0]);
                            let row = src.bytes() / src.shape[axis].max(1);
                            sub_intervals(&iv, start * row, bytes(v))
                        }
                        _ => iv,
                    };
                    groups[gr].members.push(v);
                    groups[gr].end = groups[gr].end.max(end);
                    rel.insert(v, (gr, iv));
                }
                continue;
            }
            groups.push(Group { members: vec![v], start: t, end, input: node.op.is_input() });
            rel.insert(v, (groups.len() - 1, vec![(0, bytes(v))]));
        }
        match &node.op {
            KernelOp::ConcatInPlace { axis } if !copied.contains(&id) && aliasable(g, id, &ins, &rel, &groups) => {
                // Move each input into its slice of the output.
                let v = ValueId { node: id, slot: 0 };
                let gr = rel[&v].0;
                let out = g.ty(v);
                let outer: usize = out.shape[..*axis].iter().product();
                let row = out.bytes() / outer.max(1);
                let mut at = 0;
                for u in &ins {
                    let chunk = g.ty(*u).bytes() / outer.max(1);
                    let mut iv: Vec<(usize, usize)> = Vec::new();
                    for o in 0..outer {
                        let (a, b) = (o * row + at, o * row + at + chunk);
                        match iv.last_mut() {
                            Some(l) if l.1 == a => l.1 = b,
                            _ => iv.push((a, b)),
                        }
                    }
                    at += chunk;
                    let old = rel[u].0;
                    let moved = std::mem::take(&mut groups[old].members);
                    let (s, e) = (groups[old].start, groups[old].end);
                    groups[gr].start = groups[gr].start.min(s);
                    groups[gr].end = groups[gr].end.max(e);
                    for m in moved {
                        rel.insert(m, (gr, iv.clone()));
                        groups[gr].members.push(m);
                    }
                }
            }
            KernelOp::ConcatInPlace { .. } => {
                copies.insert(id);
            }
            op if op.traits().in_place != InPlace::No => {
                // Any operand (elementwise) or only the last (a residual).
                let any = op.traits().in_place == InPlace::Any;
                let v = ValueId { node: id, slot: 0 };
                let vg = rel[&v].0;
                let candidates: Vec<ValueId> = if any { ins.clone() } else { ins.last().copied().into_iter().collect() };
                for u in candidates {
                    let Some((ug, uiv)) = rel.get(&u).cloned() else { continue };
                    let others_read_it = !any && ins[..ins.len() - 1].iter().any(|w| rel.get(w).is_some_and(|r| r.0 == ug));
                    let ok = ug != vg
                        && !groups[ug].input
                        && groups[ug].end == t
                        && !groups[ug].members.iter().any(|m| outputs.contains(m))
                        && g.ty(u) == g.ty(v)
                        && uiv == [(0, bytes(u))]
                        && groups[ug].members.iter().all(|m| rel[m].1 == uiv)
                        && !others_read_it
                        && groups[vg].members.iter().all(|m| rel[m].1 == [(0, bytes(v))]);
                    if ok {
                        let moved = std::mem::take(&mut groups[vg].members);
                        groups[ug].end = groups[ug].end.max(groups[vg].end);
                        for m in moved {
                            rel.insert(m, (ug, uiv.clone()));
                            groups[ug].members.push(m);
                        }
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    // Non-empty groups become buffers.
    let mut id_of: HashMap<usize, usize> = HashMap::default();
    let mut bufs = Vec::new();
    for (i, gr) in groups.iter().enumerate() {
        if gr.members.is_empty() {
            continue;
        }
        let size = gr.members.iter().flat_map(|m| rel[m].1.iter().map(|iv| iv.1)).max().unwrap_or(0);
        let name = g.node(gr.members[0].node).name.clone();
        id_of.insert(i, bufs.len());
        bufs.push(Buffer { id: bufs.len(), size, start: gr.start, end: gr.end, offset: 0, values: gr.members.clone(), name });
    }
    let rel = rel.into_iter().map(|(v, (gr, iv))| (v, Rel { buffer: id_of[&gr], intervals: iv })).collect();
    (bufs, rel, copies)
}

/// Bytes `[off, off + len)` of a value laid out over `iv` (in order).
fn sub_intervals(iv: &[(usize, usize)], off: usize, len: usize) -> Vec<(usize, usize)> {
    let (mut at, mut out) = (0, Vec::new());
    for &(a, b) in iv {
        let (lo, hi) = (off.max(at), (off + len).min(at + b - a));
        if lo < hi {
            out.push((a + lo - at, a + hi - at));
        }
        at += b - a;
    }
    out
}

/// Sum of live buffer bytes at each of `steps` steps.
pub fn live_bytes(bufs: &[Buffer], steps: usize) -> Vec<usize> {
    let mut delta = vec![0i64; steps + 1];
    for b in bufs {
        delta[b.start] += b.size as i64;
        delta[b.end + 1] -= b.size as i64;
    }
    let mut acc = 0i64;
    delta[..steps]
        .iter()
        .map(|d| {
            acc += d;
            acc as usize
        })
        .collect()
}
