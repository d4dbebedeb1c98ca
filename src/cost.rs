//! A roofline estimate of a kernel graph's time on a GPU: the sum of its
//! kernels' estimates (`smelt_codegen::cost`, which holds the devices and
//! the model), no device run. `smelt fit` ranks recipes with it and
//! rematerialization weighs what it recomputes with it.

pub use smelt_codegen::cost::{estimate, gpu, kernel_time, Bound, Estimate, Gpu, Resources, GPUS, GPU_NAMES};
use smelt_codegen::kernel::{Kernel, Lowered};
use smelt_codegen::Target;
use smelt_ir::{KernelGraph, NodeId};

/// Estimated seconds of node `id` of `g` on `target`'s GPU, with the tile
/// it chooses (0 for what launches nothing: inputs, constants, views).
pub fn node_time(g: &KernelGraph, id: NodeId, target: &Target) -> f64 {
    let Ok(Lowered::Kernel(mut k)) = Kernel::lower(g, id, false) else { return 0.0 };
    smelt_codegen::tiling::choose(&mut k, smelt_codegen::tiling::node_bytes(g, id), target);
    let bytes: usize = g.inputs_of(id).iter().map(|v| g.ty(*v).bytes()).sum::<usize>()
        + if k.written().is_empty() { g.node(id).outputs.iter().map(|t| t.bytes()).sum() } else { 0 };
    kernel_time(&k, bytes, &target.gpu)
}

/// Estimated seconds of every node of `g` on `target`'s GPU.
pub fn graph_time(g: &KernelGraph, target: &Target) -> f64 {
    g.node_ids().map(|n| node_time(g, n, target)).sum()
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
