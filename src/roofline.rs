//! `smelt compile --report`: each launch of a program on a GPU's roofline
//! (its FLOPs, bytes moved, arithmetic intensity, what bounds it, the
//! estimated time), with ptxas's registers, spills and the occupancy they
//! allow, and a summary per kind of kernel. An estimate from the model in
//! [`crate::cost`], not a measurement.

use crate::cost::{Bound, Gpu, Resources};
use serde::Serialize;
use smelt_codegen::ptxas::Stats;
use smelt_codegen::Program;
use std::collections::BTreeMap;

/// One launch.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The node it computes.
    pub node: String,
    /// The kernel.
    pub kernel: String,
    /// `conv`, `gemm`, `elementwise`...
    pub kind: &'static str,
    /// Whether its products run on tensor cores.
    pub tensor_cores: bool,
    /// Whether they take f32 operands in TF32.
    pub tf32: bool,
    /// The block tile of a tensor-core conv or GEMM, `MxN` (chosen by the
    /// model: [`smelt_codegen::tile`]).
    pub tile: Option<String>,
    /// A tensor-core conv's activation layouts: `nchw`, `nhwc`, or
    /// `nchw>nhwc` and `nhwc>nchw` where it converts (chosen by
    /// [`smelt_codegen::Program::build`]).
    pub layout: Option<&'static str>,
    /// Useful FLOPs (multiply-adds count two; elementwise kernels one per
    /// operation of their expression).
    pub flops: usize,
    /// Bytes of its operands and result.
    pub bytes: usize,
    /// FLOPs per byte.
    pub intensity: f64,
    /// What bounds it.
    pub bound: Bound,
    /// Estimated seconds.
    pub seconds: f64,
    /// Useful FLOP/s over its compute roof (tensor or CUDA cores).
    pub of_roof: f64,
    /// Useful FLOPs over those its tiles execute.
    pub tile_efficiency: f64,
    /// Resident threads per SM over the maximum.
    pub occupancy: f64,
    /// ptxas's registers per thread, if it ran.
    pub registers: Option<usize>,
    /// ptxas's spill bytes (stores and loads), if it ran.
    pub spill_bytes: Option<usize>,
    /// Static shared memory per block, if ptxas ran.
    pub shared: Option<usize>,
}

/// The launches of one kind together.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Group {
    /// Launches.
    pub launches: usize,
    /// Of which on tensor cores.
    pub on_tensor_cores: usize,
    /// Useful FLOPs.
    pub flops: usize,
    /// Bytes moved.
    pub bytes: usize,
    /// Estimated seconds.
    pub seconds: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The GPU it is estimated on.
    pub device: Gpu,
    /// Every launch in order.
    pub launches: Vec<Row>,
    /// Per kind of kernel.
    pub by_kind: BTreeMap<&'static str, Group>,
    /// Estimated seconds of the whole program.
    pub seconds: f64,
    /// Useful FLOPs of the whole program.
    pub flops: usize,
    /// The share of those FLOPs on tensor cores.
    pub tensor_core_flops: f64,
    /// The convolutions' time at the tensor cores' roof (for their
    /// operands: TF32 at half the f16/bf16 rate) over their estimated time,
    /// when there are convolutions.
    pub conv_of_tensor_roof: Option<f64>,
    /// The best the convolutions could do with the same bytes: their time
    /// at the tensor-core roof over the sum of each one's `max(FLOPs /
    /// tensor roof, bytes / bandwidth)` (a perfect kernel still moves its
    /// operands once).
    pub conv_attainable_of_tensor_roof: Option<f64>,
    /// Whether registers, spills and occupancy come from ptxas (else
    /// occupancy counts threads only).
    pub ptxas: bool,
}

/// The report of `program` on `gpu`, with ptxas's statistics when it ran.
pub fn report(program: &Program, gpu: &Gpu, ptxas: &[Stats]) -> Report {
    let stats: BTreeMap<&str, &Stats> = ptxas.iter().map(|s| (s.kernel.as_str(), s)).collect();
    let mut launches = Vec::new();
    let mut by_kind: BTreeMap<&'static str, Group> = BTreeMap::new();
    for step in &program.steps {
        let k = &step.kernel;
        let st = stats.get(k.name()).copied();
        let res = st.map(|s| Resources { registers: s.registers, shared: s.shared });
        let bytes: usize = step.args.iter().map(|a| a.bytes).sum();
        let e = crate::cost::estimate(k, bytes, gpu, res);
        let flops = k.flops();
        let row = Row {
            node: step.node.clone(),
            kernel: k.name().to_string(),
            kind: k.kind(),
            tensor_cores: k.tensor_cores(),
            tf32: k.tf32(),
            tile: k.tile().map(|t| format!("{}x{}", t.m, t.n)),
            layout: match k {
                smelt_codegen::Kernel::Conv(c) if c.tensor_cores() => Some(match (c.x_nhwc, c.out_nhwc) {
                    (false, false) => "nchw",
                    (true, true) => "nhwc",
                    (false, true) => "nchw>nhwc",
                    (true, false) => "nhwc>nchw",
                }),
                _ => None,
            },
            flops,
            bytes,
            intensity: flops as f64 / bytes.max(1) as f64,
            bound: e.bound,
            seconds: e.seconds,
            of_roof: flops as f64 / e.seconds / e.roof,
            tile_efficiency: e.tile_efficiency,
            occupancy: e.occupancy,
            registers: st.map(|s| s.registers),
            spill_bytes: st.map(|s| s.spill_stores + s.spill_loads),
            shared: st.map(|s| s.shared),
        };
        let g = by_kind.entry(row.kind).or_default();
        g.launches += 1;
        g.on_tensor_cores += usize::from(row.tensor_cores);
        g.flops += flops;
        g.bytes += bytes;
        g.seconds += row.seconds;
        launches.push(row);
    }
    let seconds = launches.iter().map(|r| r.seconds).sum();
    let flops: usize = launches.iter().map(|r| r.flops).sum();
    let tc: usize = launches.iter().filter(|r| r.tensor_cores).map(|r| r.flops).sum();
    // The convolutions against the tensor-core rate of their operands
    // (TF32: half the f16/bf16 rate).
    let convs = launches.iter().filter(|r| r.kind == "conv");
    let at_roof = |r: &Row| r.flops as f64 / if r.tf32 { gpu.tensor_flops / 2.0 } else { gpu.tensor_flops };
    let roof_seconds: f64 = convs.clone().map(at_roof).sum();
    let conv_of_tensor_roof = by_kind.get("conv").filter(|g| g.seconds > 0.0).map(|g| roof_seconds / g.seconds);
    let attainable: f64 = convs.map(|r| at_roof(r).max(r.bytes as f64 / gpu.bandwidth)).sum();
    let conv_attainable_of_tensor_roof = (attainable > 0.0).then(|| roof_seconds / attainable);
    Report {
        device: *gpu,
        conv_attainable_of_tensor_roof,
        launches,
        by_kind,
        seconds,
        flops,
        tensor_core_flops: tc as f64 / flops.max(1) as f64,
        conv_of_tensor_roof,
        ptxas: !ptxas.is_empty(),
    }
}

/// The report as text: a table of launches, one line per kind, a summary.
pub fn text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let opt = |v: Option<usize>| v.map_or("-".to_string(), |v| v.to_string());
    let _ = writeln!(
        s,
        "{:<44} {:>4} {:>7} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9} {:>6} {:>5} {:>5} {:>5} {:>6}",
        format!("launch on {} (estimate)", r.device.model),
        "tc",
        "tile",
        "layout",
        "GFLOP",
        "MB",
        "FLOP/B",
        "bound",
        "µs",
        "%roof",
        "tile%",
        "regs",
        "spill",
        "occ%"
    );
    for l in &r.launches {
        let name =
            if l.kernel.chars().count() > 44 { format!("{}…", l.kernel.chars().take(43).collect::<String>()) } else { l.kernel.clone() };
        let _ = writeln!(
            s,
            "{name:<44} {:>4} {:>7} {:>9} {:>9.3} {:>9.2} {:>8.1} {:>7} {:>9.1} {:>6.1} {:>5.0} {:>5} {:>5} {:>6.0}",
            match (l.tensor_cores, l.tf32) {
                (true, true) => "tf32",
                (true, false) => "yes",
                _ => "",
            },
            l.tile.as_deref().unwrap_or(""),
            l.layout.unwrap_or(""),
            l.flops as f64 / 1e9,
            l.bytes as f64 / 1e6,
            l.intensity,
            bound_name(l.bound),
            l.seconds * 1e6,
            100.0 * l.of_roof,
            100.0 * l.tile_efficiency,
            opt(l.registers),
            opt(l.spill_bytes),
            100.0 * l.occupancy
        );
    }
    let _ = writeln!(s, "\n{:<12} {:>8} {:>8} {:>10} {:>10} {:>10} {:>7}", "kind", "launches", "on tc", "GFLOP", "MB", "ms", "share");
    for (kind, g) in &r.by_kind {
        let _ = writeln!(
            s,
            "{kind:<12} {:>8} {:>8} {:>10.2} {:>10.1} {:>10.3} {:>6.1}%",
            g.launches,
            g.on_tensor_cores,
            g.flops as f64 / 1e9,
            g.bytes as f64 / 1e6,
            g.seconds * 1e3,
            100.0 * g.seconds / r.seconds.max(f64::MIN_POSITIVE)
        );
    }
    let _ = write!(
        s,
        "\nestimated {:.3} ms on {} ({:.1} GFLOP, {:.1}% of them on tensor cores",
        r.seconds * 1e3,
        r.device.model,
        r.flops as f64 / 1e9,
        100.0 * r.tensor_core_flops
    );
    if let Some(c) = r.conv_of_tensor_roof {
        let _ = write!(s, "; convolutions at {:.0}% of the tensor-core roof, {:.2}x from it", 100.0 * c, 1.0 / c);
    }
    if let Some(c) = r.conv_attainable_of_tensor_roof {
        let _ = write!(s, ", where moving their bytes once allows {:.0}%", 100.0 * c);
    }
    s += ")\n";
    if !r.ptxas {
        s += "ptxas did not run: occupancy counts threads only, registers and spills unknown (install nvidia-cuda-nvcc-cu12 and set SMELT_PTXAS)\n";
    }
    s
}

fn bound_name(b: Bound) -> &'static str {
    match b {
        Bound::Compute => "compute",
        Bound::Memory => "memory",
        Bound::Shared => "shared",
        Bound::Launch => "launch",
    }
}

/// The report as a roofline picture: log-log FLOPs per byte against FLOP/s,
/// the memory roof, the CUDA cores' and the tensor cores' roofs, and each
/// launch as a dot at its estimated rate (filled: on tensor cores),
/// coloured by kind.
pub fn svg(title: &str, r: &Report) -> String {
    let (w, h, left, right, top, bottom) = (900.0, 560.0, 80.0, 170.0, 40.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let (x_lo, x_hi) = (-2.0f64, 4.0f64); // log10 FLOP/B
    let gpu = &r.device;
    let y_hi = (gpu.tensor_flops * 2.0).log10().ceil();
    let y_lo = y_hi - 7.0;
    let px = |x: f64| left + pw * ((x.max(1e-300).log10() - x_lo) / (x_hi - x_lo)).clamp(0.0, 1.0);
    let py = |y: f64| top + ph * (1.0 - ((y.max(1e-300).log10() - y_lo) / (y_hi - y_lo)).clamp(0.0, 1.0));
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        crate::plan::esc(title)
    );
    for e in (x_lo as i32)..=(x_hi as i32) {
        let x = px(10f64.powi(e));
        s += &format!("<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">1e{e}</text>\n", top + ph, top + ph + 16.0);
    }
    for e in (y_lo as i32)..=(y_hi as i32) {
        let y = py(10f64.powi(e));
        s += &format!("<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">1e{e}</text>\n", left + pw, left - 6.0, y + 4.0);
    }
    s += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">FLOPs per byte moved</text>\n", left + pw / 2.0, h - 12.0);
    s += &format!(
        "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">FLOP/s (estimated)</text>\n",
        top + ph / 2.0,
        top + ph / 2.0
    );
    // The roofs: bandwidth times intensity up to each compute roof.
    for (label, roof, color) in [
        ("tensor cores (f16/bf16)", gpu.tensor_flops, "#a33"),
        ("tensor cores by mma.sync", gpu.tensor_flops * gpu.mma_sync, "#d77"),
        ("CUDA cores (f32)", gpu.flops, "#36a"),
    ] {
        let ridge = roof / gpu.bandwidth;
        let lo = 10f64.powf(x_lo);
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\"/>\n",
            px(lo),
            py(lo * gpu.bandwidth),
            px(ridge),
            py(roof),
            left + pw,
            py(roof)
        );
        s += &format!("<text x=\"{}\" y=\"{:.1}\" fill=\"{color}\">{label}</text>\n", left + pw + 6.0, py(roof) + 4.0);
    }
    let colors = ["#2a7", "#a3a", "#e80", "#36a", "#777", "#c44", "#088", "#660", "#333", "#b62"];
    let kinds: Vec<&str> = r.by_kind.keys().copied().collect();
    for l in &r.launches {
        let color = colors[kinds.iter().position(|k| *k == l.kind).unwrap_or(0) % colors.len()];
        let (x, y) = (px(l.intensity.max(1e-2)), py(l.flops as f64 / l.seconds));
        let fill = if l.tensor_cores { color } else { "white" };
        s += &format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{fill}\" stroke=\"{color}\" stroke-width=\"1.5\"><title>{} ({}): {:.1} µs, {:.0} FLOP/B, {}</title></circle>\n",
            crate::plan::esc(&l.kernel),
            l.node,
            l.seconds * 1e6,
            l.intensity,
            if l.tensor_cores { "tensor cores" } else { "CUDA cores" }
        );
    }
    for (i, k) in kinds.iter().enumerate() {
        let y = top + 120.0 + 18.0 * i as f64;
        s += &format!(
            "<circle cx=\"{}\" cy=\"{:.1}\" r=\"4\" fill=\"white\" stroke=\"{}\" stroke-width=\"1.5\"/><text x=\"{}\" y=\"{:.1}\">{k}</text>\n",
            left + pw + 12.0,
            y - 4.0,
            colors[i % colors.len()],
            left + pw + 22.0,
            y
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{:.1}\">filled: on tensor cores</text>\n</svg>\n",
        left + pw + 6.0,
        top + 130.0 + 18.0 * kinds.len() as f64
    );
    s
}
