//! A roofline estimate of a kernel graph's time on a GPU, from each
//! kernel's FLOPs, the bytes it reads and writes and its parallelism: no
//! device run. `smelt fit` ranks recipes with it and rematerialization
//! weighs what it recomputes with it.
//!
//! Each kernel takes `max(flops / compute roof, bytes / bandwidth)`,
//! both roofs scaled down when the kernel launches fewer threads than the
//! GPU holds at once (a small micro-batch leaves SMs idle), plus a launch
//! overhead. The compute roof is the FP32 rate of the CUDA cores: smelt's
//! kernels do not use tensor cores yet, half operands included (they are
//! widened and multiplied on the FP32 pipes).

use serde::Serialize;
use smelt_codegen::kernel::{Kernel, Lowered};
use smelt_ir::{KernelGraph, NodeId};

/// A GPU's roofs, from its data sheet.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    /// `h100`, `a100`...
    pub name: &'static str,
    /// What it is.
    pub model: &'static str,
    /// FP32 rate of the CUDA cores, FLOP/s.
    pub flops: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Streaming multiprocessors.
    pub sms: usize,
    /// Resident threads per SM.
    pub threads_per_sm: usize,
    /// Seconds per kernel launch.
    pub launch: f64,
    /// Device memory, bytes.
    pub memory: usize,
    /// Bytes/s one GPU sends to its neighbours (NVLink, or PCIe for the
    /// L4), one direction: data-parallel collectives use it.
    pub link: f64,
}

const GIB: usize = 1 << 30;

/// The GPUs `--device` knows.
pub const GPUS: [Gpu; 5] = [
    Gpu {
        name: "h100",
        model: "H100 SXM 80GB",
        flops: 67e12,
        bandwidth: 3.35e12,
        sms: 132,
        threads_per_sm: 2048,
        launch: 4e-6,
        memory: 80 * GIB,
        link: 450e9,
    },
    Gpu {
        name: "h200",
        model: "H200 SXM 141GB",
        flops: 67e12,
        bandwidth: 4.8e12,
        sms: 132,
        threads_per_sm: 2048,
        launch: 4e-6,
        memory: 141 * GIB,
        link: 450e9,
    },
    Gpu {
        name: "a100",
        model: "A100 SXM 80GB",
        flops: 19.5e12,
        bandwidth: 2.04e12,
        sms: 108,
        threads_per_sm: 2048,
        launch: 4e-6,
        memory: 80 * GIB,
        link: 300e9,
    },
    Gpu {
        name: "v100",
        model: "V100 SXM2 32GB",
        flops: 15.7e12,
        bandwidth: 0.9e12,
        sms: 80,
        threads_per_sm: 2048,
        launch: 4e-6,
        memory: 32 * GIB,
        link: 150e9,
    },
    Gpu {
        name: "l4",
        model: "L4 24GB",
        flops: 30.3e12,
        bandwidth: 0.3e12,
        sms: 58,
        threads_per_sm: 1536,
        launch: 4e-6,
        memory: 24 * GIB,
        link: 32e9,
    },
];

/// The names `--device` takes.
pub const GPU_NAMES: [&str; 5] = ["h100", "h200", "a100", "v100", "l4"];

/// The GPU named `name`.
pub fn gpu(name: &str) -> Option<Gpu> {
    GPUS.iter().copied().find(|g| g.name.eq_ignore_ascii_case(name))
}

impl Default for Gpu {
    fn default() -> Self {
        GPUS[0]
    }
}

/// Estimated seconds of node `id` of `g` on `gpu` (0 for what launches
/// nothing: inputs, constants, views).
pub fn node_time(g: &KernelGraph, id: NodeId, gpu: &Gpu) -> f64 {
    let Ok(Lowered::Kernel(k)) = Kernel::lower(g, id, false) else { return 0.0 };
    let bytes: usize = g.inputs_of(id).iter().map(|v| g.ty(*v).bytes()).sum::<usize>()
        + if k.written().is_empty() { g.node(id).outputs.iter().map(|t| t.bytes()).sum() } else { 0 };
    kernel_time(&k, bytes, gpu)
}

/// Estimated seconds of kernel `k` moving `bytes` on `gpu`.
pub fn kernel_time(k: &Kernel, bytes: usize, gpu: &Gpu) -> f64 {
    let l = k.launch();
    let threads = (l.grid.iter().product::<usize>() * l.block.iter().product::<usize>()) as f64;
    let fill = (threads / (gpu.sms * gpu.threads_per_sm) as f64).clamp(1e-3, 1.0);
    (k.flops() as f64 / (gpu.flops * fill)).max(bytes as f64 / (gpu.bandwidth * fill)) + gpu.launch
}

/// Estimated seconds of every node of `g` on `gpu`.
pub fn graph_time(g: &KernelGraph, gpu: &Gpu) -> f64 {
    g.node_ids().map(|n| node_time(g, n, gpu)).sum()
}

/// FLOPs of node `id`'s kernel (0 without one).
pub fn node_flops(g: &KernelGraph, id: NodeId) -> usize {
    match Kernel::lower(g, id, false) {
        Ok(Lowered::Kernel(k)) => k.flops(),
        _ => 0,
    }
}

/// FLOPs of node `id`'s kernel when it computes (0 for data movement:
/// copies, slices, concatenations, gathers): what splitting recomputes.
pub fn compute_flops(g: &KernelGraph, id: NodeId) -> usize {
    match Kernel::lower(g, id, false) {
        Ok(Lowered::Kernel(k)) if matches!(*k, Kernel::Layout(_) | Kernel::Select(_)) => 0,
        Ok(Lowered::Kernel(k)) => k.flops(),
        _ => 0,
    }
}

/// FLOPs of every kernel of `g`.
pub fn graph_flops(g: &KernelGraph) -> usize {
    g.node_ids().map(|n| node_flops(g, n)).sum()
}
