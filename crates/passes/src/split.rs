//! Split execution: a segment of the graph run in parts, so that only one
//! part of its intermediates is alive at a time. This goes below the
//! liveness lower bound of any plan that runs each op whole.
//!
//! - By samples (`How::Batch`): each part runs the segment on a slice of the
//!   batch and writes its slice of the segment's output (an in-place
//!   concatenation along the batch: no copy). Exact, no extra FLOPs.
//! - By rows (`How::Rows`): each part computes a band of the output rows
//!   of a segment of convolutions, pools and pointwise ops from the rows of
//!   the segment's entry that its receptive field needs (the halo rows are
//!   computed again by the neighbouring band). Band pads are the original
//!   pads where the band touches the border and none inside, so a band
//!   computes exactly the rows the whole op would.
//!
//! A segment is the set of nodes that compute one value (the exit) from
//! another (the entry) and weights alone, nothing outside reading its
//! intermediates. A split is a rewrite into ordinary nodes: slices of the
//! entry, one copy of the segment per part (each node keeps its
//! `origin`), and a concatenation of the parts' exits. Planning, the
//! independent checker, code generation and every executor see ordinary
//! kernels; nothing downstream knows about splits.
//!
//! [`choose`] decides: greedy rounds around the plan's peak, each trying
//! every segment in a window of the schedule and several part counts,
//! keeping the cheapest that fits a limit (or the smallest arena).

use crate::memory::{self, Plan};
use crate::{HashMap, HashSet};
use smelt_ir::traits::{Cut, Kind, Operands};
use smelt_ir::{IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};

/// How a segment is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// Slices of the batch (axis 0).
    Batch,
    /// Bands of rows (the second-last axis: H of `[N, C, H, W]`, or of a
    /// channel shuffle's `[N, G, C/G, H, W]`), with halos.
    Rows,
}

impl How {
    /// The split axis of a tensor of `rank` dimensions (`None`: it has none).
    pub fn axis(self, rank: usize) -> Option<usize> {
        match self {
            How::Batch => (rank >= 1).then_some(0),
            How::Rows => (rank >= 3).then(|| rank - 2),
        }
    }

    /// `batch` or `rows`.
    pub fn name(self) -> &'static str {
        match self {
            How::Batch => "batch",
            How::Rows => "rows",
        }
    }
}

/// The nodes computing `exit` from `entry` and weights alone.
#[derive(Clone, Debug)]
pub struct Segment {
    /// The value the segment reads (kept whole; each part reads a slice).
    pub entry: ValueId,
    /// The value it computes (assembled from the parts).
    pub exit: ValueId,
    /// Its nodes, in topological order (the exit's node last).
    pub nodes: Vec<NodeId>,
}

/// A window along the split axis: output rows `[o0, o1)` read input rows
/// `[o0*stride - pad, (o1-1)*stride - pad + (kernel-1)*dilation + 1)`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Window {
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
}

/// How a node reads its first operand along the split axis: `None` for
/// pointwise (the output's rows), `Some` through a window.
type Reads = Option<Window>;

/// How node `n` can be split, or `None` when it cannot: its cut along the
/// axis (the fact table's, [`smelt_ir::traits::Cuts`]) checked against
/// the shapes, and a window's geometry.
fn reads(g: &KernelGraph, n: NodeId, how: How) -> Option<Reads> {
    let node = g.node(n);
    let out = &node.outputs[0];
    let ins = g.inputs_of(n);
    let rank = out.shape.len();
    let first = &g.ty(ins[0]).shape;
    let cuts = node.op.cuts();
    match how {
        How::Rows => {
            if rank < 3 {
                return None;
            }
            match cuts.rows {
                Cut::Same => Some(None),
                Cut::Unless(axis) => (axis != rank - 2).then_some(None),
                Cut::IfKept => (first.len() >= 3 && first[first.len() - 2..] == out.shape[rank - 2..]).then_some(None),
                Cut::Window if rank == 4 => window(g, n).map(Some),
                Cut::Window | Cut::No => None,
            }
        }
        How::Batch => {
            let ok = match cuts.batch {
                Cut::Same | Cut::Window => true,
                Cut::Unless(axis) => axis != 0,
                Cut::IfKept => out.shape.first() == first.first(),
                Cut::No => false,
            };
            (ok && rank >= 1 && !first.is_empty()).then_some(None)
        }
    }
}

/// The 2-D window through which windowed node `n` reads its first operand's
/// rows (a convolution's from its weight's shape).
fn window(g: &KernelGraph, n: NodeId) -> Option<Window> {
    let pool = |p: &smelt_ir::Pool| {
        (p.kernel.len() == 2).then(|| Window { kernel: p.kernel[0], stride: p.strides[0], pad: p.pads[0], dilation: 1 })
    };
    match &g.node(n).op {
        KernelOp::FusedConv { conv, .. } | KernelOp::Op(Op::Conv(conv)) => {
            let w = g.ty(g.inputs_of(n)[1]);
            (conv.strides.len() == 2 && w.shape.len() == 4).then(|| Window {
                kernel: w.shape[2],
                stride: conv.strides[0],
                pad: conv.pads[0],
                dilation: conv.dilations[0],
            })
        }
        KernelOp::Op(Op::MaxPool(p) | Op::AveragePool { pool: p, .. }) => pool(p),
        // The fact table gives no other op a window.
        _ => None,
    }
}

/// Whether operand `v` of node `n`, read whole by every part (a weight),
/// is the same for every part: it does not vary along the split axis.
fn whole_ok(g: &KernelGraph, n: NodeId, port: usize, v: ValueId, how: How) -> bool {
    let node = g.node(n);
    let t = g.ty(v);
    let rank = node.outputs[0].shape.len();
    let operands = node.op.cuts().operands;
    match (&node.op, how) {
        // A GEMM's C may be a matrix of the output's shape.
        (KernelOp::FusedGemm { .. } | KernelOp::Op(Op::Gemm { .. }), How::Batch) if port == 2 => t.shape.len() < 2 || t.shape[0] == 1,
        // A product's right operand: a matrix (not batched), or broadcast.
        (KernelOp::Op(Op::MatMul) | KernelOp::GemmEpilogue { .. }, How::Batch) if port == 1 => {
            t.shape.len() <= 2 || (t.shape.len() < rank || t.shape[0] == 1)
        }
        // Weights and statistics of layers and norms: read whole by every
        // part (a residual convolution's too; its residual is data).
        _ if !operands.is_data(port, g.inputs_of(n).len()) => true,
        _ => {
            // Broadcast from the right: the split axis of the output is axis
            // `axis - (rank - r)` of a rank-r operand.
            let Some(axis) = how.axis(rank) else { return false };
            let r = t.shape.len();
            axis + r < rank || t.shape[axis + r - rank] == 1
        }
    }
}

/// Input rows that output rows `out` read through `w`, clipped to the
/// input's `extent`, with the pads above and below the band: `None` when
/// the band reads padding only.
fn window_rows(out: (usize, usize), w: Window, extent: usize) -> Option<((usize, usize), usize, usize)> {
    let lo = (out.0 * w.stride) as i64 - w.pad as i64;
    let hi = ((out.1 - 1) * w.stride) as i64 - w.pad as i64 + ((w.kernel - 1) * w.dilation) as i64 + 1;
    let (a, b) = (lo.max(0), hi.min(extent as i64));
    (a < b).then(|| ((a as usize, b as usize), (a - lo) as usize, (hi - b) as usize))
}

/// Nodes computing `exit` from `entry` and weights alone, when they form a
/// segment: one output each, every operand inside, the entry or a weight,
/// and no intermediate read outside or a graph output.
pub fn segment(g: &KernelGraph, entry: ValueId, exit: ValueId, topo: &HashMap<NodeId, usize>) -> Option<Segment> {
    if entry.node == exit.node || exit.slot != 0 || g.node(entry.node).op.is_persistent() {
        return None;
    }
    let (lo, hi) = (topo[&entry.node], topo[&exit.node]);
    if lo >= hi {
        return None;
    }
    // Ancestors of the exit after the entry.
    let mut nodes = HashSet::default();
    let mut stack = vec![exit.node];
    while let Some(n) = stack.pop() {
        if n == entry.node || !nodes.insert(n) {
            continue;
        }
        for v in g.inputs_of(n) {
            let p = g.node(v.node);
            if v.node == entry.node {
                if v != entry {
                    return None;
                }
            } else if p.op.is_persistent() {
            } else if topo[&v.node] <= lo {
                return None; // an activation from before the entry
            } else {
                stack.push(v.node);
            }
        }
    }
    let outputs: HashSet<ValueId> = g.outputs().iter().map(|(_, v)| *v).collect();
    for &n in &nodes {
        let node = g.node(n);
        if node.outputs.len() != 1
            || node.op.is_input()
            || node.recomputes.is_some()
            || node.op.traits().kind == smelt_ir::traits::Kind::Update
        {
            return None;
        }
        if n != exit.node && (outputs.contains(&ValueId { node: n, slot: 0 }) || g.users_of(n).iter().any(|u| !nodes.contains(u))) {
            return None;
        }
    }
    // Every node reaches the exit from the entry (not from weights alone).
    let mut from_entry: HashSet<NodeId> = HashSet::default();
    let mut order: Vec<NodeId> = nodes.iter().copied().collect();
    order.sort_by_key(|n| topo[n]);
    for &n in &order {
        if g.inputs_of(n).iter().any(|v| *v == entry || from_entry.contains(&v.node)) {
            from_entry.insert(n);
        } else {
            return None;
        }
    }
    Some(Segment { entry, exit, nodes: order })
}

/// Splits the first `parts` of `extent` into `parts` nearly equal ranges.
fn ranges(extent: usize, parts: usize) -> Vec<(usize, usize)> {
    (0..parts).map(|k| (k * extent / parts, (k + 1) * extent / parts)).filter(|r| r.0 < r.1).collect()
}

/// A graph with segments split.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The new graph.
    pub graph: KernelGraph,
    /// The schedule: the old one, each segment replaced by its parts (in
    /// order) and the concatenation at its exit's place.
    pub schedule: Vec<NodeId>,
    /// The nodes made, per segment.
    pub made: Vec<Vec<NodeId>>,
}

/// `g` with each of `segs` split `how` into `parts` (segments disjoint),
/// `None` when some node cannot be split so. `schedule` is `g`'s.
pub fn apply(g: &KernelGraph, segs: &[Segment], how: How, parts: usize, schedule: &[NodeId]) -> Result<Option<Applied>, IrError> {
    let axis_of = |v: ValueId| how.axis(g.ty(v).shape.len());
    // What each segment's nodes read, checked before building anything.
    let mut plans = Vec::new();
    for s in segs {
        let (Some(axis), Some(_)) = (axis_of(s.exit), axis_of(s.entry)) else { return Ok(None) };
        let extent = g.ty(s.exit).shape[axis];
        if extent < parts || parts < 2 {
            return Ok(None);
        }
        let inside: HashSet<NodeId> = s.nodes.iter().copied().collect();
        let mut how_read = HashMap::default();
        for &n in &s.nodes {
            let Some(r) = reads(g, n, how) else { return Ok(None) };
            for (port, v) in g.inputs_of(n).into_iter().enumerate() {
                let split = v == s.entry || inside.contains(&v.node);
                let (cuts, arity) = (g.node(n).op.cuts(), g.inputs_of(n).len());
                if split && !cuts.operands.is_data(port, arity) {
                    return Ok(None); // a layer's weight computed in the segment
                }
                if split {
                    // A split operand is read at the output's extent (or
                    // through the window, first operand only).
                    let (t, o) = (g.ty(v), &g.node(n).outputs[0]);
                    let same = match how {
                        // Samples: the same leading extent and, except across
                        // ops that change the rank, the same rank.
                        How::Batch => {
                            let view = g.node(n).op.traits().kind == Kind::View;
                            t.shape.first() == o.shape.first() && (view || t.shape.len() == o.shape.len())
                        }
                        // Rows: same rank except across a reshape that keeps them.
                        How::Rows => {
                            let (a, b) = (t.shape.len(), o.shape.len());
                            a >= 3 && (r.is_some() && port == 0 || t.shape[a - 2] == o.shape[b - 2])
                        }
                    };
                    // A windowed op's other data operand is a residual, read as the output.
                    if !same || (r.is_some() && port != 0 && cuts.operands != Operands::WeightsBetween) {
                        return Ok(None);
                    }
                    // A product's right operand is split only as a batch of
                    // matrices beside the left one (a matrix's rows are not
                    // the output's).
                    if cuts.operands == Operands::Factors && port == 1 && !(t.shape.len() == o.shape.len() && o.shape.len() >= 3) {
                        return Ok(None);
                    }
                } else if !whole_ok(g, n, port, v, how) {
                    return Ok(None);
                }
            }
            how_read.insert(n, r);
        }
        plans.push((inside, how_read, extent));
    }
    // Rebuild: inputs first (their order is the program's), then the rest in
    // topological order; a segment's parts are made at its exit.
    let exit_of: HashMap<NodeId, usize> = segs.iter().enumerate().map(|(i, s)| (s.exit.node, i)).collect();
    let skip: HashSet<NodeId> = plans.iter().flat_map(|p| p.0.iter().copied()).collect();
    let mut out = KernelGraph::new();
    out.set_tf32(g.tf32());
    let mut map: HashMap<ValueId, ValueId> = HashMap::default();
    let mut node_map: HashMap<NodeId, NodeId> = HashMap::default();
    let mut made = vec![Vec::new(); segs.len()];
    let topo = g.topo_order()?;
    let order = g.inputs().iter().copied().chain(topo.into_iter().filter(|n| !g.inputs().contains(n)));
    for id in order {
        if let Some(&i) = exit_of.get(&id) {
            let (inside, how_read, extent) = &plans[i];
            let Some(v) = split_one(g, &mut out, &map, &segs[i], inside, how_read, how, ranges(*extent, parts), &mut made[i])? else {
                return Ok(None);
            };
            map.insert(segs[i].exit, v);
            node_map.insert(id, v.node);
            continue;
        }
        if skip.contains(&id) {
            continue;
        }
        let ins: Vec<ValueId> = g.inputs_of(id).iter().map(|v| map[v]).collect();
        let new = out.copy_node_from(g, id, &ins)?;
        out.node_mut(new).recomputes = g.node(id).recomputes.and_then(|r| node_map.get(&r).copied());
        node_map.insert(id, new);
        for slot in 0..g.node(id).outputs.len() as u32 {
            map.insert(ValueId { node: id, slot }, ValueId { node: new, slot });
        }
    }
    out.set_outputs(g.outputs().iter().map(|(n, v)| (n.clone(), map[v])).collect());
    let mut sched = Vec::new();
    for id in schedule {
        match exit_of.get(id) {
            Some(&i) => sched.extend(made[i].iter().copied()),
            None if skip.contains(id) => {}
            None => sched.push(node_map[id]),
        }
    }
    Ok(Some(Applied { graph: out, schedule: sched, made }))
}

/// Makes the parts of segment `s` in `out` and their concatenation;
/// returns its value, or `None` when a band reads padding only.
#[allow(clippy::too_many_arguments)]
fn split_one(
    g: &KernelGraph,
    out: &mut KernelGraph,
    map: &HashMap<ValueId, ValueId>,
    s: &Segment,
    inside: &HashSet<NodeId>,
    how_read: &HashMap<NodeId, Reads>,
    how: How,
    parts: Vec<(usize, usize)>,
    made: &mut Vec<NodeId>,
) -> Result<Option<ValueId>, IrError> {
    let axis = |v: ValueId| how.axis(g.ty(v).shape.len()).expect("checked by apply");
    let tag = match how {
        How::Batch => "s",
        How::Rows => "r",
    };
    let bug = |msg: String| IrError::Invalid(format!("split of \"{}\": {msg}", g.node(s.exit.node).name));
    let slice = |out: &mut KernelGraph, v: ValueId, r: (usize, usize), name: String, made: &mut Vec<NodeId>| -> Result<ValueId, IrError> {
        let axis = how.axis(out.ty(v).shape.len()).expect("checked by apply");
        // Contiguous bytes (a slice of the batch, or rows of one image of one
        // channel) are a view; other slices a copy.
        let op = if out.ty(v).shape[..axis].iter().product::<usize>() == 1 {
            KernelOp::SliceView { axis, start: r.0, end: r.1 }
        } else {
            KernelOp::Op(Op::Slice { axes: vec![axis], starts: vec![r.0 as i64], ends: vec![r.1 as i64], steps: vec![1] })
        };
        let n = out.add(op, name, &[v])?;
        made.push(n);
        Ok(ValueId { node: n, slot: 0 })
    };
    let mut exits = Vec::new();
    for (k, &part) in parts.iter().enumerate() {
        // Rows each value must provide: the hull of what its readers need.
        let mut need: HashMap<ValueId, (usize, usize)> = HashMap::default();
        need.insert(s.exit, part);
        let hull = |need: &mut HashMap<ValueId, (usize, usize)>, v: ValueId, r: (usize, usize)| {
            let e = need.entry(v).or_insert(r);
            *e = (e.0.min(r.0), e.1.max(r.1));
        };
        for &n in s.nodes.iter().rev() {
            let r = need[&ValueId { node: n, slot: 0 }];
            for (port, v) in g.inputs_of(n).into_iter().enumerate() {
                if v != s.entry && !inside.contains(&v.node) {
                    continue;
                }
                let want = match how_read[&n] {
                    Some(w) if port == 0 => match window_rows(r, w, g.ty(v).shape[axis(v)]) {
                        Some((rows, _, _)) => rows,
                        None => return Ok(None),
                    },
                    _ => r,
                };
                hull(&mut need, v, want);
            }
        }
        // The entry's rows, then each node's band in order.
        let mut val: HashMap<ValueId, (ValueId, (usize, usize))> = HashMap::default();
        let e = need[&s.entry];
        let full = (0, g.ty(s.entry).shape[axis(s.entry)]);
        let ev = if e == full {
            map[&s.entry]
        } else {
            slice(out, map[&s.entry], e, format!("{}.{tag}{k}.in", g.node(s.exit.node).name), made)?
        };
        val.insert(s.entry, (ev, e));
        for &n in &s.nodes {
            let node = g.node(n);
            let r = need[&ValueId { node: n, slot: 0 }];
            let mut ins = Vec::new();
            let mut pads = None;
            for (port, v) in g.inputs_of(n).into_iter().enumerate() {
                let Some(&(nv, have)) = val.get(&v) else {
                    ins.push(map[&v]);
                    continue;
                };
                let want = match how_read[&n] {
                    Some(w) if port == 0 => {
                        let (rows, top, bottom) =
                            window_rows(r, w, g.ty(v).shape[axis(v)]).ok_or_else(|| bug("a band reads padding only".into()))?;
                        pads = Some((top, bottom));
                        rows
                    }
                    _ => r,
                };
                if want == have {
                    ins.push(nv);
                } else {
                    let name = format!("{}.{tag}{k}.in{port}", node.name);
                    ins.push(slice(out, nv, (want.0 - have.0, want.1 - have.0), name, made)?);
                }
            }
            let op = band_op(&node.op, how, r.1 - r.0, pads);
            let new = out.add(op, format!("{}.{tag}{k}", node.name), &ins)?;
            out.set_origin(new, node.origin.clone());
            made.push(new);
            let got = out.node(new).outputs[0].shape[axis(ValueId { node: n, slot: 0 })];
            if got != r.1 - r.0 {
                return Err(bug(format!("part {k} of \"{}\" has extent {got}, not {}", node.name, r.1 - r.0)));
            }
            val.insert(ValueId { node: n, slot: 0 }, (ValueId { node: new, slot: 0 }, r));
        }
        exits.push(val[&s.exit].0);
    }
    // Producers that are kernels read by nothing else write their slices
    // of a contiguous concatenation in place.
    let in_place = how == How::Batch && exits.iter().all(|v| out.node(v.node).op.is_kernel());
    let axis = axis(s.exit);
    let op = if in_place { KernelOp::ConcatInPlace { axis } } else { KernelOp::Op(Op::Concat { axis }) };
    let c = out.add(op, format!("{}.{}", g.node(s.exit.node).name, how.name()), &exits)?;
    out.set_origin(c, g.node(s.exit.node).origin.clone());
    made.push(c);
    Ok(Some(ValueId { node: c, slot: 0 }))
}

/// Node `op` computing `extent` along the split axis: a reshape's target
/// takes the part's batch, a windowed op the band's pads.
fn band_op(op: &KernelOp, how: How, extent: usize, pads: Option<(usize, usize)>) -> KernelOp {
    let mut op = op.clone();
    match (&mut op, how) {
        (KernelOp::Op(Op::Reshape { shape }) | KernelOp::GemmEpilogue { shape, .. }, How::Batch) => shape[0] = extent,
        (KernelOp::Op(Op::Reshape { shape }), How::Rows) => {
            let r = shape.len();
            shape[r - 2] = extent;
        }
        (KernelOp::FusedConv { conv, .. } | KernelOp::Op(Op::Conv(conv)), How::Rows) => {
            if let Some((top, bottom)) = pads {
                conv.pads[0] = top;
                conv.pads[2] = bottom;
            }
        }
        (KernelOp::Op(Op::MaxPool(pool) | Op::AveragePool { pool, .. }), How::Rows) => {
            if let Some((top, bottom)) = pads {
                pool.pads[0] = top;
                pool.pads[2] = bottom;
            }
        }
        _ => {}
    }
    op
}

/// One split the search made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Split {
    /// By samples or rows.
    pub how: How,
    /// Into how many parts.
    pub parts: usize,
    /// The segment's entry (its node's name) and exit.
    pub entry: String,
    /// See `entry`.
    pub exit: String,
    /// The split nodes' names, in order.
    pub nodes: Vec<String>,
    /// FLOPs the parts compute beyond the segment's (halos).
    pub extra_flops: usize,
    /// The arena before this split and after it.
    pub arena_before: usize,
    /// See `arena_before`.
    pub arena_after: usize,
    /// The first and last steps of the final schedule that run its parts
    /// (its slices, parts and concatenation, and later splits of them).
    pub steps: (usize, usize),
}

/// What the search did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The graph with its segments split.
    pub graph: KernelGraph,
    /// Its plan.
    pub plan: Plan,
    /// The splits, in the order they were made.
    pub splits: Vec<Split>,
    /// The arena before any split.
    pub arena_before: usize,
    /// FLOPs of the graph before.
    pub flops_before: usize,
    /// Extra FLOPs of all splits.
    pub extra_flops: usize,
    /// Live bytes at each step of the plan before any split.
    pub live_before: Vec<usize>,
}

/// What the search aims at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// The fewest, cheapest splits that bring the arena to this many bytes.
    Limit(usize),
    /// The smallest arena, recomputing at most [`MAX_EXTRA_FLOPS`] of the
    /// graph's FLOPs.
    Minimum,
}

/// The most halo FLOPs a search adds, as a fraction of the graph's.
pub const MAX_EXTRA_FLOPS: f64 = 0.15;

/// Steps before and after the peak that a segment split by rows may reach.
const WINDOW: usize = 24;

/// Segments split by samples tried per round (the longest).
const BATCH_SEGMENTS: usize = 8;

/// Splits segments of `g` until its arena meets `goal` (or no split lowers
/// it). `flops` prices a node. `hint` is the planner's (see
/// [`memory::plan_with_hint`]).
pub fn choose(
    g: &KernelGraph,
    goal: Goal,
    hint: Option<&[NodeId]>,
    flops: &dyn Fn(&KernelGraph, NodeId) -> usize,
) -> Result<Outcome, IrError> {
    let base = memory::plan_with_hint(g, hint)?;
    let flops_before: usize = g.node_ids().map(|n| flops(g, n)).sum();
    let start = State {
        graph: g.clone(),
        schedule: base.schedule.clone(),
        arena: base.arena,
        splits: Vec::new(),
        made: Vec::new(),
        extra: 0,
        area: base.live_bytes().iter().filter(|&&b| b >= base.arena).count(),
    };
    let fits = |s: &State| matches!(goal, Goal::Limit(l) if s.arena <= l);
    let budget = match goal {
        Goal::Limit(_) => usize::MAX,
        Goal::Minimum => (flops_before as f64 * MAX_EXTRA_FLOPS) as usize,
    };
    let mut best = start.clone();
    if !fits(&start) {
        // Samples alone first (exact, free), then rows with samples after.
        let phases: &[&[How]] = match goal {
            Goal::Limit(_) => &[&[How::Batch], &[How::Rows, How::Batch]],
            Goal::Minimum => &[&[How::Rows, How::Batch]],
        };
        for phase in phases {
            let mut s = start.clone();
            for &how in *phase {
                s = search(s, how, goal, budget, flops)?;
            }
            if s.arena < best.arena || (s.arena == best.arena && s.extra < best.extra) || fits(&s) {
                best = s;
            }
            if fits(&best) {
                break;
            }
        }
        if matches!(goal, Goal::Limit(_)) && !fits(&best) {
            // Nothing fits: the smallest arena the search reaches, for the
            // error's figures (FLOPs not counted).
            let mut s = start.clone();
            for how in [How::Rows, How::Batch] {
                s = search(s, how, Goal::Minimum, usize::MAX, flops)?;
            }
            if s.arena < best.arena {
                best = s;
            }
        }
    }
    let live_before = base.live_bytes();
    let plan = if best.splits.is_empty() { base } else { memory::plan_given(&best.graph, &best.schedule)? };
    // Each split's steps: nodes it made, or made from them by a later split
    // (named after them).
    let mut splits = best.splits;
    for (sp, made) in splits.iter_mut().zip(&best.made) {
        let ours = |name: &str| made.contains(name) || name.char_indices().any(|(i, c)| c == '.' && made.contains(&name[..i]));
        let steps: Vec<usize> = (0..plan.schedule.len()).filter(|&i| ours(&best.graph.node(plan.schedule[i]).name)).collect();
        sp.steps = (steps.first().copied().unwrap_or(0), steps.last().copied().unwrap_or(0));
    }
    Ok(Outcome { graph: best.graph, plan, splits, arena_before: start.arena, flops_before, extra_flops: best.extra, live_before })
}

#[derive(Clone)]
struct State {
    graph: KernelGraph,
    schedule: Vec<NodeId>,
    arena: usize,
    splits: Vec<Split>,
    /// Names of the nodes each split made.
    made: Vec<HashSet<String>>,
    extra: usize,
    /// Steps at which live bytes reach the arena.
    area: usize,
}

/// Greedy rounds of splits `how` from `s`.
fn search(mut s: State, how: How, goal: Goal, budget: usize, flops: &dyn Fn(&KernelGraph, NodeId) -> usize) -> Result<State, IrError> {
    for _round in 0..64 {
        if matches!(goal, Goal::Limit(l) if s.arena <= l) {
            break;
        }
        let g = &s.graph;
        let plan = memory::plan_order(g, s.schedule.clone());
        let topo: HashMap<NodeId, usize> = plan.schedule.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let peak = plan.peak_step;
        // Rows: every segment within a window around the peak (halos grow
        // with depth). Samples: for each exit, the segment from the
        // earliest entry (the longer, the better: no extra FLOPs).
        let last = plan.schedule.len() - 1;
        let (lo, hi) = match how {
            How::Rows => (peak.saturating_sub(WINDOW), (peak + WINDOW).min(last)),
            How::Batch => (0, last),
        };
        let single = |n: NodeId| g.node(n).outputs.len() == 1 && !g.node(n).op.is_persistent();
        let entries: Vec<NodeId> = plan.schedule[lo..=peak].iter().copied().filter(|&n| single(n)).collect();
        let exits: Vec<NodeId> = plan.schedule[peak..=hi].iter().copied().filter(|&n| single(n) && !g.node(n).op.is_input()).collect();
        let mut segments = Vec::new();
        // Samples: the farthest exits first, each from its earliest entry.
        let exits: Vec<NodeId> = if how == How::Batch { exits.into_iter().rev().collect() } else { exits };
        for &b in &exits {
            for &a in &entries {
                let seg = segment(g, ValueId { node: a, slot: 0 }, ValueId { node: b, slot: 0 }, &topo);
                if let Some(seg) = seg.filter(|s| s.nodes.iter().all(|&n| reads(g, n, how).is_some())) {
                    segments.push(seg);
                    if how == How::Batch {
                        break;
                    }
                }
            }
            if how == How::Batch && segments.len() >= 2 * BATCH_SEGMENTS {
                break;
            }
        }
        if how == How::Batch {
            // The longest (no extra FLOPs either way; the longer, the more
            // whole-batch values it removes).
            segments.sort_by_key(|s| std::cmp::Reverse(s.nodes.len()));
            segments.truncate(BATCH_SEGMENTS);
        }
        let mut best: Option<(Candidate, Applied, Segment, usize)> = None;
        for seg in segments {
            {
                let t = g.ty(seg.exit);
                let extent = how.axis(t.shape.len()).map_or(0, |a| t.shape[a]);
                for parts in part_counts(how, extent) {
                    let Some(applied) = apply(g, std::slice::from_ref(&seg), how, parts, &plan.schedule)? else { break };
                    let p = memory::plan_order(&applied.graph, applied.schedule.clone());
                    let before: usize = seg.nodes.iter().map(|&n| flops(g, n)).sum();
                    let after: usize = applied.made[0].iter().map(|&n| flops(&applied.graph, n)).sum();
                    let area = p.live_bytes().iter().filter(|&&b| b >= p.arena.min(s.arena)).count();
                    let c = Candidate { arena: p.arena, extra: after.saturating_sub(before), parts, area };
                    // Lower, or (samples, free) as high but at fewer steps: a
                    // model of identical layers (a transformer's) peaks in
                    // each, split one at a time.
                    let lower = c.arena < s.arena || (how == How::Batch && c.arena == s.arena && c.area < s.area);
                    if !lower || s.extra + c.extra > budget {
                        continue;
                    }
                    if best.as_ref().is_none_or(|(b, ..)| c.better(b, s.arena, goal)) {
                        best = Some((c, applied, seg.clone(), parts));
                    }
                }
            }
        }
        let Some((c, applied, seg, parts)) = best else { break };
        let name = |n: NodeId| g.node(n).name.clone();
        s.splits.push(Split {
            how,
            parts,
            entry: name(seg.entry.node),
            exit: name(seg.exit.node),
            nodes: seg.nodes.iter().map(|&n| name(n)).collect(),
            extra_flops: c.extra,
            arena_before: s.arena,
            arena_after: c.arena,
            steps: (0, 0),
        });
        s.made.push(applied.made[0].iter().map(|&n| applied.graph.node(n).name.clone()).collect());
        s.extra += c.extra;
        s.arena = c.arena;
        s.area = c.area;
        s.graph = applied.graph;
        s.schedule = applied.schedule;
    }
    Ok(s)
}

/// Part counts tried for a split axis of `extent`.
fn part_counts(how: How, extent: usize) -> Vec<usize> {
    let all: &[usize] = match how {
        How::Batch => &[2, 4, 8, 16, 32, 64],
        How::Rows => &[2, 3, 4, 6, 8, 12, 16],
    };
    let mut v: Vec<usize> = all.iter().copied().filter(|&p| p <= extent).collect();
    if how == How::Batch && extent > 1 && !v.contains(&extent) && extent <= 64 {
        v.push(extent);
    }
    v
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    arena: usize,
    extra: usize,
    parts: usize,
    area: usize,
}

impl Candidate {
    /// Under a limit: fitting beats not fitting, then fewer FLOPs, then
    /// fewer parts (fewer launches); short of
    /// it, more bytes saved per FLOP (free splits first, then the largest
    /// saving). Minimum: the smallest arena, then fewer FLOPs.
    fn better(&self, other: &Candidate, now: usize, goal: Goal) -> bool {
        match goal {
            Goal::Limit(l) => {
                let (a, b) = (self.arena <= l, other.arena <= l);
                if a != b {
                    return a;
                }
                if a {
                    return (self.extra, self.parts, self.arena) < (other.extra, other.parts, other.arena);
                }
                let rate = |c: &Candidate| (now - c.arena) as f64 / (c.extra as f64 + 1.0);
                let (a, b) = (rate(self), rate(other));
                a > b || (a == b && self.area < other.area)
            }
            Goal::Minimum => (self.arena, self.extra, self.area, self.parts) < (other.arena, other.extra, other.area, other.parts),
        }
    }
}
