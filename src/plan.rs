//! What `smelt plan` reports: the memory plan of a model, with fusion and
//! without, and its picture.

use crate::report::human_bytes;
use serde::Serialize;
use smelt_ir::{KernelGraph, KernelOp, Op, OpSet};
use smelt_passes::memory::{self, Plan};

/// One tensor live at the peak.
#[derive(Clone, Debug, Serialize)]
pub struct LiveTensor {
    /// The buffer's first value's node name.
    pub name: String,
    /// Bytes.
    pub bytes: usize,
    /// Type of the buffer's first value.
    pub ty: String,
}

/// The memory report of one plan.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// Whether the graph was fused.
    pub fused: bool,
    /// Bytes of all weights (constants); not in the arena.
    pub weights_bytes: usize,
    /// Every non-constant value in its own buffer (graph inputs and outputs included).
    pub naive_activation_bytes: usize,
    /// The largest sum of live buffer bytes at any step of the chosen schedule.
    pub lower_bound_bytes: usize,
    /// The arena: one allocation holding every activation, graph inputs and outputs included.
    pub arena_bytes: usize,
    /// arena / lower bound.
    pub arena_over_lower_bound: f64,
    /// arena / naive.
    pub arena_over_naive: f64,
    /// Kernels launched.
    pub kernels: usize,
    /// Buffers in the arena.
    pub buffers: usize,
    /// The chosen schedule.
    pub schedule: String,
    /// Every schedule tried, with its lower bound.
    pub schedules: Vec<memory::Candidate>,
    /// The assignment order that gave the smallest arena.
    pub assignment_order: String,
    /// The step where live bytes peak.
    pub peak_step: usize,
    /// The node run at the peak step.
    pub peak_node: String,
    /// The largest tensors live at the peak.
    pub peak_live: Vec<LiveTensor>,
    /// Whether the independent checker accepted the plan.
    pub checked: bool,
    /// Weight bytes per dtype.
    pub weights_by_dtype: std::collections::BTreeMap<String, usize>,
    /// Activation bytes per dtype, every value counted once (as the naive sum).
    pub activations_by_dtype: std::collections::BTreeMap<String, usize>,
    /// Kernels that only convert precision (casts nothing could absorb).
    pub cast_kernels: usize,
}

/// Builds the report of `plan` for `g`.
pub fn report(g: &KernelGraph, plan: &Plan, fused: bool, checked: bool) -> MemoryReport {
    let naive: usize =
        g.node_ids().filter(|&n| !g.node(n).op.is_persistent()).flat_map(|n| g.node(n).outputs.iter().map(|t| t.bytes())).sum();
    let peak_live = plan
        .live_at(plan.peak_step)
        .into_iter()
        .take(8)
        .map(|b| LiveTensor { name: b.name.clone(), bytes: b.size, ty: g.ty(b.values[0]).to_string() })
        .collect();
    let peak_node = plan.schedule.get(plan.peak_step).map(|&n| g.node(n).name.clone()).unwrap_or_default();
    MemoryReport {
        fused,
        weights_bytes: g.weight_bytes(),
        naive_activation_bytes: naive,
        lower_bound_bytes: plan.lower_bound,
        arena_bytes: plan.arena,
        arena_over_lower_bound: plan.arena as f64 / plan.lower_bound.max(1) as f64,
        arena_over_naive: plan.arena as f64 / naive.max(1) as f64,
        kernels: g.node_ids().filter(|&n| g.node(n).op.is_kernel()).count(),
        buffers: plan.buffers.len(),
        schedule: plan.schedule_name.clone(),
        schedules: plan.candidates.clone(),
        assignment_order: plan.order_name.clone(),
        peak_step: plan.peak_step,
        peak_node,
        peak_live,
        checked,
        weights_by_dtype: by_dtype(g, true),
        activations_by_dtype: by_dtype(g, false),
        cast_kernels: g.node_ids().filter(|&n| matches!(g.node(n).op, KernelOp::Op(Op::Cast { .. }))).count(),
    }
}

/// Bytes per dtype of the constants (`weights`) or of every other value.
fn by_dtype(g: &KernelGraph, weights: bool) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for n in g.node_ids().filter(|&n| g.node(n).op.is_persistent() == weights) {
        for t in &g.node(n).outputs {
            *m.entry(t.dtype.to_string()).or_insert(0) += t.bytes();
        }
    }
    m
}

/// Bytes of one category, in all and per dtype.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Bytes {
    /// Bytes in all.
    pub bytes: usize,
    /// Tensors (persistent) or buffers (arena).
    pub count: usize,
    /// Bytes per dtype.
    pub by_dtype: std::collections::BTreeMap<String, usize>,
}

impl Bytes {
    fn add(&mut self, dtype: smelt_ir::DType, bytes: usize) {
        self.bytes += bytes;
        self.count += 1;
        *self.by_dtype.entry(dtype.to_string()).or_insert(0) += bytes;
    }
}

/// Where the bytes of a training step go (`smelt plan --train`), in the
/// categories the field uses. The persistent region holds what lives across
/// steps; the arena holds the rest, and its peak is split by what each live
/// buffer holds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrainBreakdown {
    /// The trained parameters (persistent, f32 master weights).
    pub parameters: Bytes,
    /// Optimizer state: momentum buffers, Adam's two moments (persistent).
    pub optimizer_state: Bytes,
    /// Gradient accumulators (persistent; none without accumulation).
    pub accumulators: Bytes,
    /// Other persistent state (the step counter).
    pub other_state: Bytes,
    /// Initializers not trained (frozen, running statistics, constants).
    pub frozen: Bytes,
    /// Every parameter gradient once: what frameworks keep for the whole
    /// step. smelt computes each in the arena and applies its update at
    /// once, so only those at the peak count there.
    pub gradients_if_all_kept: usize,
    /// Parameters + optimizer state + accumulators + other state + frozen.
    pub persistent_bytes: usize,
    /// The step where the arena's live bytes peak.
    pub peak_step: usize,
    /// `forward` or `backward` (where the peak step's node belongs).
    pub peak_phase: String,
    /// At the peak: forward values kept for backward (or, in forward, the live activations).
    pub saved_activations: Bytes,
    /// At the peak: parameter gradients not yet applied.
    pub gradients: Bytes,
    /// At the peak: activation gradients and other backward temporaries.
    pub temporaries: Bytes,
    /// At the peak: the batch (inputs and labels).
    pub batch: Bytes,
    /// At the peak: recomputed forward values (`smelt fit`, `--remat-budget`).
    pub recomputed: Bytes,
    /// Every float initializer of the model: trained, or why not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub initializers: Vec<smelt_passes::train::Initializer>,
    /// The arena (at least the sum of the four above).
    pub arena_bytes: usize,
    /// Persistent bytes plus the arena: the step's device memory.
    pub total_bytes: usize,
    /// The first step after the loss is computed (backward's first step; a
    /// backward op that reads only parameters may run earlier).
    pub backward_starts_at: usize,
}

/// The breakdown of a training step's plan. `forward`: the step graph's
/// forward and loss nodes (kernels whose whole provenance is there are forward).
pub fn train_breakdown(g: &KernelGraph, plan: &Plan, forward: &smelt_passes::HashSet<smelt_ir::NodeId>) -> TrainBreakdown {
    use smelt_ir::traits::Kind;
    let mut b = TrainBreakdown::default();
    let is_fwd = |n: smelt_ir::NodeId| !g.origin(n).is_empty() && g.origin(n).iter().all(|o| forward.contains(o));
    let (mut states, mut accumulators) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    let mut grad_buffers = std::collections::HashSet::new();
    for u in g.node_ids().filter(|&u| g.node(u).op.traits().kind == Kind::Update) {
        let ins = g.inputs_of(u);
        let acc = match g.node(u).op.semantic() {
            Some(Op::Update(o)) if o.accumulate() > 1 => 1,
            _ => 0,
        };
        accumulators.extend(ins.iter().skip(3).take(acc).map(|v| v.node));
        states.extend(ins.iter().skip(3 + acc).map(|v| v.node));
        if let Some(grad) = ins.get(1) {
            b.gradients_if_all_kept += g.ty(*grad).bytes();
            if let Some(p) = plan.placements.get(grad) {
                grad_buffers.insert(p.buffer);
            }
        }
    }
    for n in g.node_ids() {
        let ty = &g.node(n).outputs[0];
        match g.node(n).op.semantic() {
            Some(Op::Parameter) => b.parameters.add(ty.dtype, ty.bytes()),
            Some(Op::State) if states.contains(&n) => b.optimizer_state.add(ty.dtype, ty.bytes()),
            Some(Op::State) if accumulators.contains(&n) => b.accumulators.add(ty.dtype, ty.bytes()),
            Some(Op::State) => b.other_state.add(ty.dtype, ty.bytes()),
            Some(Op::Constant) => b.frozen.add(ty.dtype, ty.bytes()),
            _ => {}
        }
    }
    b.persistent_bytes = b.parameters.bytes + b.optimizer_state.bytes + b.accumulators.bytes + b.other_state.bytes + b.frozen.bytes;
    // Backward starts once the loss (the first output) is computed.
    let loss = g.outputs().first().map(|(_, v)| v.node);
    b.backward_starts_at = plan.schedule.iter().position(|&n| Some(n) == loss).map_or(0, |i| i + 1);
    b.peak_step = plan.peak_step;
    let in_backward = plan.schedule.get(plan.peak_step).is_some_and(|&n| !is_fwd(n));
    b.peak_phase = if in_backward { "backward" } else { "forward" }.into();
    for buf in plan.live_at(plan.peak_step) {
        let v = buf.values[0];
        let dtype = g.ty(v).dtype;
        let cat = if buf.values.iter().any(|v| g.node(v.node).op.is_input()) {
            &mut b.batch
        } else if buf.values.iter().any(|v| g.node(v.node).recomputes.is_some()) {
            &mut b.recomputed
        } else if grad_buffers.contains(&buf.id) {
            &mut b.gradients
        } else if is_fwd(v.node) {
            &mut b.saved_activations
        } else {
            &mut b.temporaries
        };
        cat.add(dtype, buf.size);
    }
    b.arena_bytes = plan.arena;
    b.total_bytes = b.persistent_bytes + plan.arena;
    b
}

/// Parses `6GiB`, `512 MiB`, `1.5GB`, `4096` (bytes): binary units B, KiB,
/// MiB, GiB, TiB and decimal KB, MB, GB, TB.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    let x: f64 = num.parse().map_err(|_| format!("{s:?} is not a size: expected a number and a unit, like 6GiB or 512MB"))?;
    let mul: f64 = match unit {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        u => return Err(format!("unknown unit {u:?} in {s:?}: use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB")),
    };
    let bytes = (x * mul).round();
    // 2^64 as a float: anything at or over it would saturate silently.
    if bytes >= usize::MAX as f64 {
        return Err(format!("{s:?} is more bytes than can be counted (at most {} bytes)", usize::MAX));
    }
    Ok(bytes as usize)
}

/// The message for a plan over `limit`.
///
/// `batch` is the current batch where it can change: a batch of 1 gets no
/// advice to shrink it.
pub fn over_limit(r: &MemoryReport, limit: usize, batch: Option<usize>, smaller_batch: Option<(usize, usize)>) -> String {
    // Sizes that round alike are shown to the byte.
    let (need, have) = match (human_bytes(r.arena_bytes), human_bytes(limit)) {
        (a, b) if a == b => (format!("{a} ({} bytes)", r.arena_bytes), format!("{b} ({limit} bytes)")),
        (a, b) => (a, b),
    };
    let mut m = format!(
        "the plan needs {need} of activation memory (arena) but the memory limit is {have}.\n  peak: {} live at step {} (node \"{}\"); the largest tensors live there:\n",
        human_bytes(r.lower_bound_bytes),
        r.peak_step,
        r.peak_node
    );
    for t in &r.peak_live {
        m += &format!("    {:<40} {:>10}  {}\n", t.name, human_bytes(t.bytes), t.ty);
    }
    m += "  what would help:\n";
    match (smaller_batch, batch) {
        (Some((b, bytes)), _) => m += &format!("    - a smaller batch: --batch {b} needs {}\n", human_bytes(bytes)),
        (None, Some(b)) if b > 1 => m += "    - a smaller batch (--batch N): none that halves it fits\n",
        _ => {}
    }
    if !r.fused {
        m += "    - fusion (drop --no-fuse): fewer intermediates reach memory\n";
    }
    if r.activations_by_dtype.contains_key("f32")
        && !r.activations_by_dtype.contains_key("f16")
        && !r.activations_by_dtype.contains_key("bf16")
    {
        m += "    - mixed precision (--precision mixed-f16 or mixed-bf16 about halves activation bytes)\n";
    }
    m += "    - rematerialization (recompute instead of keeping; planned)";
    m
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// An SVG picture: live bytes per step with and without fusion (top), and
/// the arena layout of `plan` (each buffer a rectangle in time x offset,
/// the peak marked).
pub fn svg(title: &str, plan: &Plan, g: &KernelGraph, unfused: Option<&Plan>) -> String {
    svg_marked(title, plan, g, unfused, None, None)
}

/// As [`svg`], with the step where a training step's backward pass starts
/// marked on both plots.
pub fn svg_marked(
    title: &str,
    plan: &Plan,
    g: &KernelGraph,
    unfused: Option<&Plan>,
    backward_at: Option<usize>,
    split: Option<&crate::SplitReport>,
) -> String {
    let (w, left, top_h, lay_h, pad) = (1100.0, 70.0, 220.0, 420.0, 30.0);
    let plot_w = w - left - 20.0;
    let height = pad + top_h + 2.0 * pad + lay_h + 40.0;
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"18\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", esc(title));
    // Top: live bytes per step (x: fraction of the schedule).
    let series: Vec<(&str, Vec<usize>, &str)> = unfused
        .map(|u| ("without fusion", u.live_bytes(), "#c44"))
        .into_iter()
        .chain(split.map(|s| ("with fusion, not split", s.live_before.clone(), "#999")))
        .chain(std::iter::once((if split.is_some() { "with fusion, split" } else { "with fusion" }, plan.live_bytes(), "#26a")))
        .collect();
    let ymax = series.iter().flat_map(|(_, v, _)| v.iter().copied()).max().unwrap_or(1).max(1);
    let y0 = pad + top_h;
    s += &format!("<text x=\"{left}\" y=\"{}\">live bytes per step (MiB; x: progress through the schedule)</text>\n", pad + 2.0);
    for k in 0..=4 {
        let v = ymax as f64 * k as f64 / 4.0;
        let y = y0 - top_h * 0.9 * k as f64 / 4.0;
        s += &format!("<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.1}</text>\n", left + plot_w, left - 6.0, y + 4.0, mib(v as usize));
    }
    for (i, (label, v, color)) in series.iter().enumerate() {
        let n = v.len().max(2) - 1;
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(j, &b)| format!("{:.1},{:.1}", left + plot_w * j as f64 / n as f64, y0 - top_h * 0.9 * b as f64 / ymax as f64))
            .collect();
        s += &format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n", pts.join(" "));
        let peak = v.iter().max().copied().unwrap_or(0);
        s += &format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}: peak {}</text>\n",
            left + plot_w - 260.0,
            pad + 20.0 + 16.0 * i as f64,
            human_bytes(peak)
        );
    }
    // Bottom: the arena layout.
    let ly = y0 + 2.0 * pad;
    let steps = plan.schedule.len().max(1) as f64;
    let arena = plan.arena.max(1) as f64;
    s += &format!(
        "<text x=\"{left}\" y=\"{}\">arena layout with fusion: {} in {} buffers (x: step, y: offset); red line: peak step {}</text>\n",
        ly - 8.0,
        human_bytes(plan.arena),
        plan.buffers.len(),
        plan.peak_step
    );
    s += &format!("<rect x=\"{left}\" y=\"{ly}\" width=\"{plot_w}\" height=\"{lay_h}\" fill=\"#f7f7f7\" stroke=\"#999\"/>\n");
    for b in &plan.buffers {
        let x = left + plot_w * b.start as f64 / steps;
        let bw = (plot_w * (b.end - b.start + 1) as f64 / steps).max(1.0);
        let y = ly + lay_h - lay_h * (b.offset + b.size) as f64 / arena;
        let h = (lay_h * b.size as f64 / arena).max(0.5);
        let hue = (b.id * 47) % 360;
        let ty = g.ty(b.values[0]);
        s += &format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\" fill=\"hsl({hue},55%,65%)\" stroke=\"#333\" stroke-width=\"0.3\"><title>{} {ty}: {} at offset {}, steps {}..{}</title></rect>\n",
            esc(&b.name),
            human_bytes(b.size),
            b.offset,
            b.start,
            b.end
        );
    }
    if let Some(bw) = backward_at {
        let bx = left + plot_w * bw as f64 / steps;
        s += &format!(
            "<line x1=\"{bx:.1}\" x2=\"{bx:.1}\" y1=\"{}\" y2=\"{}\" stroke=\"#080\" stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"{}\" fill=\"#080\">forward | backward</text>\n",
            pad,
            ly + lay_h,
            bx - 56.0,
            ly + lay_h + 30.0
        );
    }
    // Split segments: a band over the steps that run their parts.
    for (i, sp) in split.iter().flat_map(|s| s.splits.iter()).enumerate() {
        let (a, b) = sp.steps;
        let x = left + plot_w * a as f64 / steps;
        let bw = (plot_w * (b - a + 1) as f64 / steps).max(1.0);
        let what = match sp.how {
            smelt_passes::split::How::Batch => "samples",
            smelt_passes::split::How::Rows => "row bands",
        };
        s += &format!(
            "<rect x=\"{x:.1}\" y=\"{ly}\" width=\"{bw:.1}\" height=\"{lay_h}\" fill=\"#fa0\" fill-opacity=\"0.12\" stroke=\"#c80\" stroke-dasharray=\"3 2\"><title>split {}: {} in {} {what}, {} to {}</title></rect>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#a60\" font-size=\"10\">{} x{}</text>\n",
            i + 1,
            sp.nodes.len(),
            sp.parts,
            esc(&sp.entry),
            esc(&sp.exit),
            x + 2.0,
            ly + 12.0 + 11.0 * (i % 4) as f64,
            sp.how.name(),
            sp.parts
        );
    }
    let px = left + plot_w * (plan.peak_step as f64 + 0.5) / steps;
    s += &format!("<line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{ly}\" y2=\"{}\" stroke=\"red\" stroke-width=\"1.5\"/>\n", ly + lay_h);
    for k in 0..=4 {
        let y = ly + lay_h - lay_h * k as f64 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.1}</text>\n",
            left - 6.0,
            y + 4.0,
            mib((arena * k as f64 / 4.0) as usize)
        );
    }
    s += &format!(
        "<text x=\"{left}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">step {}</text>\n",
        ly + lay_h + 16.0,
        left + plot_w,
        ly + lay_h + 16.0,
        plan.schedule.len()
    );
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("6GiB"), Ok(6 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 XB").is_err());
    }
}

/// Everything `smelt plan` computes for a model: the compiled graph, its
/// checked plan and the unfused one, their reports and, for a training
/// step, where its bytes go. The CLI prints it; the Python package wraps it.
#[derive(Debug)]
pub struct Planning {
    /// The session the model was opened in.
    pub session: crate::Session,
    /// The compiled graph.
    pub compiled: crate::Compiled,
    /// Its checked plan, and the unfused graph's.
    pub planned: crate::Planned,
    /// The compiled graph's report.
    pub report: MemoryReport,
    /// The unfused graph's report.
    pub without_fusion: MemoryReport,
    /// With `--train`: where the step's bytes go.
    pub training: Option<TrainBreakdown>,
}

impl Planning {
    /// Compiles and plans the model of `session` (both plans checked).
    pub fn new(mut session: crate::Session) -> Result<Planning, crate::Error> {
        let compiled = session.compile()?;
        let planned = session.plan(&compiled)?;
        let fused = !session.options.no_fuse;
        let report = report(&compiled.graph, &planned.plan, fused, true);
        let without_fusion = report_of(&planned);
        let training = session.train.as_ref().map(|t| TrainBreakdown {
            initializers: t.step.initializers.clone(),
            ..train_breakdown(&compiled.graph, &planned.plan, &t.step.forward)
        });
        Ok(Planning { session, compiled, planned, report, without_fusion, training })
    }

    /// `smelt plan --json`: `model` as the user named it.
    pub fn json(&self, model: &str, batch: Option<usize>) -> serde_json::Value {
        let t = &self.session.timings;
        serde_json::json!({
            "model": model,
            "batch": batch,
            "plan": self.report,
            "without_fusion": self.without_fusion,
            "fusion": self.compiled.stats.fusion,
            "training": self.training,
            "recomputation": self.compiled.remat,
            "split": self.compiled.split,
            "timings_seconds": {"import": t.import, "passes": t.passes, "plan": t.plan, "check": t.check},
        })
    }

    /// `smelt plan --svg`: live bytes per step (and without fusion), the
    /// arena's layout, where backward starts; `title` heads it.
    pub fn svg(&self, title: &str) -> String {
        let other = (!self.session.options.no_fuse).then_some(&self.planned.unfused_plan);
        let backward = self.training.as_ref().map(|t| t.backward_starts_at);
        svg_marked(title, &self.planned.plan, &self.compiled.graph, other, backward, self.compiled.split.as_ref())
    }

    /// Fails with [`crate::Error::MemoryLimit`] when the arena exceeds
    /// `limit`, naming the largest smaller batch that fits (it compiles
    /// and plans the model at halved batches to find it).
    pub fn check_limit(&self, limit: usize) -> Result<(), crate::Error> {
        check_limit(&self.session, &self.report, limit)
    }
}

/// Fails with [`crate::Error::MemoryLimit`] when `report`'s arena exceeds
/// `limit`, naming the largest smaller batch of `session`'s model that
/// fits (compiled and planned at halved batches to find it).
pub fn check_limit(session: &crate::Session, report: &MemoryReport, limit: usize) -> Result<(), crate::Error> {
    if report.arena_bytes <= limit {
        return Ok(());
    }
    let fits = session.largest_batch_within(limit)?;
    Err(crate::Error::MemoryLimit {
        limit,
        arena: report.arena_bytes,
        smaller_batch: fits,
        message: over_limit(report, limit, session.batch(), fits),
    })
}

fn report_of(p: &crate::Planned) -> MemoryReport {
    report(&p.unfused, &p.unfused_plan, false, true)
}
