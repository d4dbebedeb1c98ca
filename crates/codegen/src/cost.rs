//! The roofline model of one kernel's time on a GPU, from its FLOPs, the
//! bytes it reads and writes, the bytes its tensor-core tiles move through
//! shared memory, and its parallelism: no device run. The compiler chooses
//! tensor-core tiles with it ([`crate::tile`]); the root crate's `cost`
//! sums it over a graph.
//!
//! Each kernel takes `max(compute, shared, memory)` plus a launch overhead
//! ([`estimate`]). Compute is the FLOPs its tiles execute (partial tiles
//! padded) over its roof: the tensor cores' f16/bf16 rate for kernels on
//! tensor cores, the CUDA cores' FP32 rate for the others, scaled down by
//! the SMs a launch leaves idle (the last wave of blocks) and, below the
//! warps an SM needs to hide latency, by the warps resident on each.
//! Shared is the bytes a tensor-core kernel's warps load as fragments and
//! store as tiles ([`Kernel::shared_traffic`]) over the SMs' shared-memory
//! bandwidth, scaled as compute is: a 32x32 warp tile reads a byte per 10.7
//! FLOPs, under the 20 an H100's `mma.sync` rate needs. Memory is the bytes
//! it reads and writes over the bandwidth, scaled down by the SMs the launch
//! leaves idle and, below 16 warps of loads in flight on each, by its warps.
//! Occupancy comes from ptxas's registers and shared memory when they are
//! known, else from the threads alone.

use crate::kernel::Kernel;
use serde::Serialize;

/// A GPU's roofs, from its data sheet.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    /// `h100`, `a100`...
    pub name: &'static str,
    /// What it is.
    pub model: &'static str,
    /// Its compute capability (`90` for sm_90): TF32 needs 80.
    pub compute: u32,
    /// FP32 rate of the CUDA cores, FLOP/s.
    pub flops: f64,
    /// Dense f16/bf16 rate of the tensor cores with f32 accumulation,
    /// FLOP/s (the V100's is f16 only: bf16 needs compute_80).
    pub tensor_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Shared-memory bandwidth of all SMs together, bytes/s: 128 bytes per
    /// clock per SM at the boost clock.
    pub shared_bandwidth: f64,
    /// Streaming multiprocessors.
    pub sms: usize,
    /// Resident threads per SM.
    pub threads_per_sm: usize,
    /// The share of the tensor-core rate that `mma.sync` (what `wmma`
    /// compiles to) reaches: Hopper's full rate needs its asynchronous
    /// `wgmma`, and `mma.sync` gets about two thirds of it (FlashAttention-3,
    /// Shah et al. 2024, section 1).
    pub mma_sync: f64,
    /// Resident blocks per SM.
    pub blocks_per_sm: usize,
    /// Shared memory per SM, bytes.
    pub shared_per_sm: usize,
    /// Seconds per kernel launch.
    pub launch: f64,
    /// Device memory, bytes.
    pub memory: usize,
    /// Bytes/s one GPU sends to its neighbours (NVLink, or PCIe for the
    /// L4), one direction: data-parallel collectives use it.
    pub link: f64,
}

const GIB: usize = 1 << 30;

impl Gpu {
    /// Whether its tensor cores take TF32 (compute capability 8.0 on).
    pub fn has_tf32(&self) -> bool {
        self.compute >= 80
    }
}

/// The GPUs `--device` knows.
pub const GPUS: [Gpu; 5] = [
    Gpu {
        name: "h100",
        model: "H100 SXM 80GB",
        compute: 90,
        flops: 67e12,
        tensor_flops: 989e12,
        bandwidth: 3.35e12,
        shared_bandwidth: 33.4e12,
        sms: 132,
        threads_per_sm: 2048,
        mma_sync: 0.67,
        blocks_per_sm: 32,
        shared_per_sm: 228 * 1024,
        launch: 4e-6,
        memory: 80 * GIB,
        link: 450e9,
    },
    Gpu {
        name: "h200",
        model: "H200 SXM 141GB",
        compute: 90,
        flops: 67e12,
        tensor_flops: 989e12,
        bandwidth: 4.8e12,
        shared_bandwidth: 33.4e12,
        sms: 132,
        threads_per_sm: 2048,
        mma_sync: 0.67,
        blocks_per_sm: 32,
        shared_per_sm: 228 * 1024,
        launch: 4e-6,
        memory: 141 * GIB,
        link: 450e9,
    },
    Gpu {
        name: "a100",
        model: "A100 SXM 80GB",
        compute: 80,
        flops: 19.5e12,
        tensor_flops: 312e12,
        bandwidth: 2.04e12,
        shared_bandwidth: 19.5e12,
        sms: 108,
        threads_per_sm: 2048,
        mma_sync: 1.0,
        blocks_per_sm: 32,
        shared_per_sm: 164 * 1024,
        launch: 4e-6,
        memory: 80 * GIB,
        link: 300e9,
    },
    Gpu {
        name: "v100",
        model: "V100 SXM2 32GB",
        compute: 70,
        flops: 15.7e12,
        tensor_flops: 125e12,
        bandwidth: 0.9e12,
        shared_bandwidth: 15.7e12,
        sms: 80,
        threads_per_sm: 2048,
        mma_sync: 1.0,
        blocks_per_sm: 32,
        shared_per_sm: 96 * 1024,
        launch: 4e-6,
        memory: 32 * GIB,
        link: 150e9,
    },
    Gpu {
        name: "l4",
        model: "L4 24GB",
        compute: 89,
        flops: 30.3e12,
        tensor_flops: 121e12,
        bandwidth: 0.3e12,
        shared_bandwidth: 15.1e12,
        sms: 58,
        threads_per_sm: 1536,
        mma_sync: 1.0,
        blocks_per_sm: 24,
        shared_per_sm: 100 * 1024,
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

/// What the roofline model says of one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Seconds, launch overhead included.
    pub seconds: f64,
    /// The compute roof it runs against (tensor or CUDA cores), FLOP/s.
    pub roof: f64,
    /// What limits it.
    pub bound: Bound,
    /// Resident threads per SM over the SM's maximum.
    pub occupancy: f64,
    /// Useful FLOPs over the FLOPs its tiles execute.
    pub tile_efficiency: f64,
}

/// What limits a kernel's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Its FLOPs.
    Compute,
    /// Its bytes.
    Memory,
    /// The bytes its tensor-core tiles move through shared memory.
    Shared,
    /// The launch overhead (it does almost nothing).
    Launch,
}

/// Registers per thread and static shared memory per block, from ptxas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Registers per thread.
    pub registers: usize,
    /// Shared memory per block, bytes.
    pub shared: usize,
}

/// Warps an SM needs resident to keep its pipes busy: tensor-core kernels
/// issue few, long instructions (two warps per SM sub-partition); CUDA-core
/// kernels need half the SM's threads.
fn warps_needed(tensor_cores: bool, gpu: &Gpu) -> f64 {
    if tensor_cores {
        8.0
    } else {
        gpu.threads_per_sm as f64 / 64.0
    }
}

/// The roofline estimate of kernel `k` moving `bytes` on `gpu`, with its
/// ptxas resources when known.
pub fn estimate(k: &Kernel, bytes: usize, gpu: &Gpu, res: Option<Resources>) -> Estimate {
    let l = k.launch();
    let block = l.block.iter().product::<usize>().max(1);
    let blocks = l.grid.iter().product::<usize>().max(1);
    // Blocks per SM: threads, the block limit, registers (allocated per
    // warp in units of 256) and shared memory.
    let mut per_sm = (gpu.threads_per_sm / block).min(gpu.blocks_per_sm);
    if let Some(r) = res {
        let per_warp = (r.registers.max(1) * 32).div_ceil(256) * 256;
        per_sm = per_sm.min(65536 / (per_warp * block.div_ceil(32)).max(1));
        if r.shared > 0 {
            per_sm = per_sm.min(gpu.shared_per_sm / (r.shared + 1024));
        }
    }
    let per_sm = per_sm.max(1);
    let occupancy = (per_sm * block) as f64 / gpu.threads_per_sm as f64;
    let tc = k.tensor_cores();
    // TF32 runs at half the f16/bf16 rate (A100, H100, L4 data sheets).
    let tc_rate = if k.tf32() { gpu.tensor_flops / 2.0 } else { gpu.tensor_flops };
    let roof = if tc { tc_rate * gpu.mma_sync } else { gpu.flops };
    // Compute: the busiest SM runs ceil(blocks / sms) blocks, at most
    // per_sm at a time.
    let on_busiest = blocks.div_ceil(gpu.sms);
    let sm_fill = blocks as f64 / (on_busiest * gpu.sms) as f64;
    let warps = (on_busiest.min(per_sm) * block) as f64 / 32.0;
    let latency_fill = (warps / warps_needed(tc, gpu)).min(1.0);
    let tiled = k.tiled_flops().max(k.flops());
    let compute = tiled as f64 / (roof * sm_fill * latency_fill);
    let shared = k.shared_traffic() as f64 / (gpu.shared_bandwidth * sm_fill * latency_fill);
    // Memory: the SMs the launch occupies, each needing 16 warps of loads
    // in flight to take its share of the bandwidth.
    let mem_fill = (sm_fill * (warps / 16.0).min(1.0)).max(1e-3);
    let memory = bytes as f64 / (gpu.bandwidth * mem_fill);
    let busy = compute.max(shared).max(memory);
    let bound = if busy < gpu.launch {
        Bound::Launch
    } else if busy == memory {
        Bound::Memory
    } else if busy == compute {
        Bound::Compute
    } else {
        Bound::Shared
    };
    Estimate { seconds: busy + gpu.launch, roof, bound, occupancy, tile_efficiency: k.flops() as f64 / tiled.max(1) as f64 }
}

/// Estimated seconds of kernel `k` moving `bytes` on `gpu`.
pub fn kernel_time(k: &Kernel, bytes: usize, gpu: &Gpu) -> f64 {
    estimate(k, bytes, gpu, None).seconds
}
