//! The emulator: runs the generated CUDA C itself on the CPU. Each kernel's
//! source is compiled, unchanged but for its pointer parameters, as C++ by
//! the host compiler against smelt's own header (`smelt_emu.h`: thread and
//! block indices, `__shared__`, `__syncthreads` over fibers, `__half` and
//! `__nv_bfloat16` with CUDA's rounding, vector types, the math functions),
//! into a shared library cached on disk like PTX. [`Emulator`] is a
//! [`Device`]: the [`Executor`] that drives a GPU drives it, with one arena
//! and one weights blob in host memory at the planned offsets.
//!
//! What it checks that a GPU would not say: every access through a pointer
//! parameter against that argument's planned extent (an access outside
//! names the kernel, the parameter, the index, the thread and the block), a
//! vector parameter's alignment, and `__restrict__` on a parameter whose
//! argument overlaps another argument that a kernel writes. And races
//! between a block's threads: a [`Schedule`] picks the order they run in
//! between barriers, so a kernel run under each must give the same bytes.

mod compile;

pub use compile::{stats, translate, EmuCompiler, EmuKernel, KernelSource, Level, Param, Stats, Translated, HEADER};

use crate::exec::{Device, DeviceInfo, Executor};
use crate::RuntimeError;
use smelt_codegen::program::{Program, Space, Step};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

#[repr(C)]
struct Extent {
    lo: u64,
    hi: u64,
}

#[repr(C)]
pub(crate) struct Launch {
    grid: [u32; 3],
    block: [u32; 3],
    block_begin: u64,
    block_end: u64,
    extents: *const Extent,
    nparams: u64,
    error: *mut c_char,
    error_cap: u64,
    errors: u64,
    schedule: u32,
}

/// The order a block's threads run in between barriers on the emulator.
/// Each is an order a GPU may take, so a kernel without races computes the
/// same bytes under all three; a missing barrier (a warp overwriting shared
/// memory that another still reads, or reading it before the writer is
/// done) shows as different bytes under one of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// Warps advance together from one warp operation to the next (lanes
    /// and warps in order).
    #[default]
    Lockstep,
    /// One warp at a time runs until all its lanes wait at `__syncthreads`,
    /// warps in order.
    WarpsInOrder,
    /// As `WarpsInOrder`, warps and lanes in reverse order.
    WarpsReversed,
}

impl Schedule {
    /// Every schedule.
    pub const ALL: [Schedule; 3] = [Schedule::Lockstep, Schedule::WarpsInOrder, Schedule::WarpsReversed];
}

pub(crate) type LaunchFn = unsafe extern "C" fn(*mut *mut c_void, *mut Launch) -> c_int;

/// Runs a launch of `f` over `workers` threads (blocks in contiguous ranges;
/// small launches on one): the message of the first faulty access, if any.
fn execute(
    f: &EmuKernel,
    (grid, block): ([u32; 3], [u32; 3]),
    params: &[u64],
    extents: &[Extent],
    workers: usize,
    schedule: Schedule,
) -> Result<(), String> {
    let blocks = grid.iter().map(|&d| d as u64).product::<u64>();
    let threads = block.iter().map(|&d| d as u64).product::<u64>();
    if threads == 0 || threads > 1024 || blocks == 0 {
        return Err(format!("launch of grid {grid:?} and block {block:?}: CUDA allows 1 to 1024 threads per block"));
    }
    if params.len() != f.params.len() || extents.len() != f.params.len() {
        return Err(format!("launched with {} parameters, the kernel takes {}", params.len(), f.params.len()));
    }
    let workers = if blocks * threads < 1 << 14 { 1 } else { workers.min(blocks as usize).max(1) };
    let per = blocks.div_ceil(workers as u64);
    let results: Vec<(c_int, u64, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers as u64)
            .map(|w| {
                s.spawn(move || {
                    let mut values: Vec<u64> = params.to_vec();
                    let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
                    let mut error = vec![0u8; 1024];
                    let mut l = Launch {
                        grid,
                        block,
                        block_begin: (w * per).min(blocks),
                        block_end: ((w + 1) * per).min(blocks),
                        extents: extents.as_ptr(),
                        nparams: extents.len() as u64,
                        error: error.as_mut_ptr() as *mut c_char,
                        error_cap: error.len() as u64,
                        errors: 0,
                        schedule: schedule as u32,
                    };
                    // SAFETY: the launcher reads one 8-byte value per
                    // parameter through `ptrs` and the extents, and accesses
                    // memory only inside the extents (checked), which the
                    // caller owns for the duration of the launch.
                    let rc = unsafe { (f.entry)(ptrs.as_mut_ptr(), &mut l) };
                    let len = error.iter().position(|&b| b == 0).unwrap_or(error.len());
                    (rc, l.errors, String::from_utf8_lossy(&error[..len]).into_owned())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or((1, 0, "a worker thread panicked".into()))).collect()
    });
    let errors: u64 = results.iter().map(|r| r.1).sum();
    if let Some((_, _, msg)) = results.iter().find(|r| r.0 != 0 || r.1 > 0) {
        let more = if errors > 1 { format!(" ({errors} faulty accesses in all)") } else { String::new() };
        return Err(format!("{msg}{more}"));
    }
    Ok(())
}

/// An argument of [`launch_raw`].
pub enum RawArg<'a> {
    /// A buffer a pointer parameter addresses (its whole extent).
    Buffer(&'a mut [u8]),
    /// An `unsigned long long` value.
    Count(u64),
}

/// Launches a kernel on host buffers, outside any program: for testing
/// hand-written CUDA C (warp operations, tensor-core fragments) on the
/// emulator. Each buffer's address must suit the parameter's alignment.
pub fn launch_raw(kernel: &EmuKernel, grid: [u32; 3], block: [u32; 3], args: &mut [RawArg]) -> Result<(), RuntimeError> {
    launch_raw_scheduled(kernel, (grid, block), args, Schedule::Lockstep)
}

/// As [`launch_raw`], the blocks' threads run in the order of `schedule`.
pub fn launch_raw_scheduled(
    kernel: &EmuKernel,
    (grid, block): ([u32; 3], [u32; 3]),
    args: &mut [RawArg],
    schedule: Schedule,
) -> Result<(), RuntimeError> {
    let mut params = Vec::with_capacity(args.len());
    let mut extents = Vec::with_capacity(args.len());
    for a in args.iter_mut() {
        match a {
            RawArg::Buffer(b) => {
                let lo = b.as_mut_ptr() as u64;
                params.push(lo);
                extents.push(Extent { lo, hi: lo + b.len() as u64 });
            }
            RawArg::Count(c) => {
                params.push(*c);
                extents.push(Extent { lo: 0, hi: 0 });
            }
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    execute(kernel, (grid, block), &params, &extents, threads, schedule).map_err(|msg| RuntimeError::Kernel {
        kernel: kernel.name.clone(),
        node: "-".into(),
        msg,
    })
}

/// Host memory aligned to [`crate::exec::ARENA_ALIGN`].
struct Buffer {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: a plain owned allocation.
unsafe impl Send for Buffer {}

impl Buffer {
    fn zeroed(bytes: usize) -> Result<Buffer, RuntimeError> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), crate::exec::ARENA_ALIGN as usize)
            .map_err(|e| RuntimeError::Program(format!("an arena of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(RuntimeError::Program(format!("cannot allocate {bytes} bytes of host memory for the emulator")));
        }
        Ok(Buffer { ptr, layout })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The emulated device: kernels compiled for the host, one arena and one
/// weights blob in host memory, blocks spread over `threads` OS threads.
pub struct Emulator {
    kernels: HashMap<String, Arc<EmuKernel>>,
    arena: Option<Buffer>,
    weights: Option<Buffer>,
    threads: usize,
    compiler: String,
    schedule: Schedule,
}

impl Emulator {
    /// An emulator running `kernels` (from [`EmuCompiler::compile_all`]).
    pub fn new(kernels: HashMap<String, Arc<EmuKernel>>, compiler: &EmuCompiler) -> Emulator {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Emulator { kernels, arena: None, weights: None, threads, compiler: compiler.version.clone(), schedule: Schedule::Lockstep }
    }

    /// Runs later launches' blocks in the order of `schedule`.
    pub fn set_schedule(&mut self, schedule: Schedule) {
        self.schedule = schedule;
    }

    fn extent(&self, space: &Space, offset: usize, bytes: usize) -> Extent {
        let base = match space {
            Space::Arena => self.arena.as_ref().map_or(0, |b| b.ptr as u64),
            Space::Weights => self.weights.as_ref().map_or(0, |b| b.ptr as u64),
        };
        Extent { lo: base + offset as u64, hi: base + (offset + bytes) as u64 }
    }
}

impl Device for Emulator {
    type Function = Arc<EmuKernel>;
    type Mark = Instant;

    fn info(&self) -> DeviceInfo {
        DeviceInfo { name: format!("emulator ({})", self.compiler), total_bytes: 0, free_bytes: 0, compute_capability: (0, 0) }
    }

    fn function(&mut self, name: &str) -> Result<Arc<EmuKernel>, RuntimeError> {
        self.kernels.get(name).cloned().ok_or_else(|| RuntimeError::Emulator { kernel: name.into(), msg: "not compiled".into() })
    }

    fn alloc(&mut self, arena: usize, weights: &[u8]) -> Result<(u64, u64), RuntimeError> {
        let a = Buffer::zeroed(arena)?;
        let mut w = Buffer::zeroed(weights.len())?;
        w.bytes()[..weights.len()].copy_from_slice(weights);
        let bases = (a.ptr as u64, w.ptr as u64);
        self.arena = Some(a);
        self.weights = Some(w);
        Ok(bases)
    }

    fn write(&mut self, space: Space, offset: usize, bytes: &[u8]) -> Result<(), RuntimeError> {
        let buffer = if space == Space::Arena { &mut self.arena } else { &mut self.weights };
        let a = buffer.as_mut().ok_or_else(|| RuntimeError::Program("write before alloc".into()))?;
        a.bytes()[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn read(&mut self, space: Space, offset: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let buffer = if space == Space::Arena { &mut self.arena } else { &mut self.weights };
        let b = buffer.as_mut().ok_or_else(|| RuntimeError::Program("read before alloc".into()))?;
        out.copy_from_slice(&b.bytes()[offset..offset + out.len()]);
        Ok(())
    }

    fn launch(&mut self, f: &Arc<EmuKernel>, step: &Step, grid: [u32; 3], block: [u32; 3], params: &[u64]) -> Result<(), RuntimeError> {
        let fail = |msg: String| RuntimeError::Kernel { kernel: f.name.clone(), node: step.node.clone(), msg };
        // Extents: each pointer parameter's argument, as planned.
        let mut extents = Vec::with_capacity(params.len());
        let mut args = step.args.iter();
        for p in &f.params {
            if p.pointer {
                let a = args.next().ok_or_else(|| fail(format!("no argument for parameter {}", p.name)))?;
                extents.push(self.extent(&a.space, a.offset, a.bytes));
            } else {
                extents.push(Extent { lo: 0, hi: 0 });
            }
        }
        // `__restrict__` promises that no other parameter reaches the same
        // bytes while either is written.
        for (i, p) in f.params.iter().enumerate().filter(|(_, p)| p.pointer) {
            for (j, q) in f.params.iter().enumerate().filter(|(j, q)| q.pointer && *j > i) {
                let overlap = extents[i].lo < extents[j].hi && extents[j].lo < extents[i].hi;
                if overlap && (p.restrict || q.restrict) && (!p.constant || !q.constant) {
                    return Err(fail(format!(
                        "parameters {} and {} overlap in memory ({} and {} of the plan) but {} is declared __restrict__",
                        p.name,
                        q.name,
                        step.args.get(i).map_or("?", |a| a.value.as_str()),
                        step.args.get(j).map_or("?", |a| a.value.as_str()),
                        if p.restrict { &p.name } else { &q.name }
                    )));
                }
            }
        }
        execute(f, (grid, block), params, &extents, self.threads, self.schedule).map_err(fail)
    }

    fn mark(&mut self) -> Result<Instant, RuntimeError> {
        Ok(crate::exec::HostClock::mark())
    }

    fn elapsed_ms(&mut self, from: &Instant, to: &Instant) -> Result<f64, RuntimeError> {
        Ok(crate::exec::HostClock::elapsed_ms(from, to))
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// A program on the emulator.
pub type EmuExecutor = Executor<Emulator>;

/// Every kernel of `program` once, at the level its launches' work asks
/// for (their FLOPs, or elements produced, summed).
pub fn sources(program: &Program) -> Vec<KernelSource> {
    let mut work: HashMap<&str, u64> = HashMap::new();
    for s in &program.steps {
        *work.entry(s.kernel.name()).or_default() += s.kernel.flops() as u64;
    }
    program
        .sources()
        .into_iter()
        .map(|(name, source)| {
            let level = Level::for_work(work.get(name.as_str()).copied().unwrap_or(u64::MAX));
            KernelSource { name, source, level }
        })
        .collect()
}

/// Compiles the kernels of `programs` into the cache (in batches, on all
/// cores), so that later [`executor`]s of them only load: for callers that
/// run many small programs one after another.
pub fn precompile<'a>(programs: impl IntoIterator<Item = &'a Program>) -> Result<Stats, RuntimeError> {
    let compiler = EmuCompiler::new()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernels: Vec<KernelSource> = programs.into_iter().flat_map(sources).collect();
    let before = stats();
    compiler.compile_many(&kernels, threads, &|_| {})?;
    let after = stats();
    Ok(Stats {
        kernels: after.kernels - before.kernels,
        hits: after.hits - before.hits,
        compiled: after.compiled - before.compiled,
        units: after.units - before.units,
        compile_seconds: after.compile_seconds - before.compile_seconds,
    })
}

/// Compiles every kernel of `program` for the host (in batches on all
/// cores, calling `progress` after each) and loads it with its weights blob.
pub fn executor(program: Program, weights: &[u8], progress: &(dyn Fn(&str) + Sync)) -> Result<EmuExecutor, RuntimeError> {
    let need = program.arena.saturating_add(weights.len());
    crate::check_host_memory("the emulator's arena and weights", need)?;
    let compiler = EmuCompiler::new()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernels = compiler.compile_many(&sources(&program), threads, progress)?;
    let kernels = kernels.into_iter().map(|k| (k.name.clone(), Arc::new(k))).collect();
    Executor::new(Emulator::new(kernels, &compiler), program, weights, None)
}
