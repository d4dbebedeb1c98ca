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

use crate::exec::{Device, DeviceInfo, Executor};
use crate::RuntimeError;
use smelt_codegen::cache::Cache;
use smelt_codegen::program::{Program, Space, Step};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// smelt's CUDA header for the host compiler.
pub const HEADER: &str = include_str!("smelt_emu.h");

/// Options every kernel is compiled with: f32 arithmetic exactly as written
/// (no contraction into fused multiply-adds, no fast math), as the CPU
/// descriptions compute.
const FLAGS: &[&str] = &["-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fvisibility=hidden", "-w"];

/// A kernel parameter, as its signature declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// The pointee type (`float`, `__half`, `float4`), or the scalar type.
    pub ty: String,
    /// A pointer (else an `unsigned long long` scalar).
    pub pointer: bool,
    /// A pointer to const.
    pub constant: bool,
    /// Declared `__restrict__`.
    pub restrict: bool,
}

/// One parameter declaration: `[const ]T* [__restrict__ ]NAME` or `T NAME`.
fn parse_param(p: &str) -> Option<Param> {
    let p = p.trim();
    let (constant, rest) = match p.strip_prefix("const ") {
        Some(r) => (true, r.trim()),
        None => (false, p),
    };
    if let Some(star) = rest.find('*') {
        let ty = rest[..star].trim().to_string();
        let after = rest[star + 1..].trim();
        let (restrict, name) = match after.strip_prefix("__restrict__") {
            Some(n) => (true, n.trim()),
            None => (false, after),
        };
        let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        // Multi-word pointee types: `long long`, `unsigned char`.
        let ty = ty.split_whitespace().collect::<Vec<_>>().join(" ");
        return (ty.split(' ').all(ok) && ok(name)).then(|| Param { name: name.to_string(), ty, pointer: true, constant, restrict });
    }
    let (ty, name) = rest.rsplit_once(' ')?;
    let ok = ty.split_whitespace().all(|w| w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    ok.then(|| Param { name: name.to_string(), ty: ty.trim().to_string(), pointer: false, constant, restrict: false })
}

/// The kernel's source for the host compiler, and its parameters: every
/// function signature's pointer parameters become checked pointers
/// (`smelt_emu::Ptr<const float> in0`), then a launcher is appended.
pub fn translate(name: &str, source: &str) -> Result<(String, Vec<Param>), RuntimeError> {
    let bad = |msg: String| RuntimeError::Emulator { kernel: name.to_string(), msg };
    let mut out = String::from("#include \"smelt_emu.h\"\n");
    let mut params = None;
    for line in source.lines() {
        let is_sig = (line.contains("__global__") || line.contains("__device__")) && line.contains('(');
        if !is_sig {
            out += line;
            out.push('\n');
            continue;
        }
        let open = line.find('(').expect("checked");
        let close = line.rfind(')').ok_or_else(|| bad(format!("signature without a closing parenthesis: {line}")))?;
        let mut ps = Vec::new();
        for p in line[open + 1..close].split(',') {
            ps.push(parse_param(p).ok_or_else(|| bad(format!("cannot read parameter `{}`", p.trim())))?);
        }
        let decl: Vec<String> = ps
            .iter()
            .map(|p| {
                if p.pointer {
                    format!("smelt_emu::Ptr<{}{}> {}", if p.constant { "const " } else { "" }, p.ty, p.name)
                } else {
                    format!("{}{} {}", if p.constant { "const " } else { "" }, p.ty, p.name)
                }
            })
            .collect();
        out += &format!("{}{}{}\n", &line[..=open], decl.join(", "), &line[close..]);
        if line.contains("__global__") {
            let fname = line[..open].split_whitespace().last().unwrap_or("");
            if fname != name {
                return Err(bad(format!("the source defines kernel {fname}")));
            }
            // The runtime passes 8-byte values: addresses and counts.
            if let Some(p) = ps.iter().find(|p| !p.pointer && p.ty != "unsigned long long") {
                return Err(bad(format!(
                    "kernel parameter {} is a {}: the runtime passes pointers and unsigned long long counts only",
                    p.name, p.ty
                )));
            }
            params = Some(ps);
        }
    }
    let params = params.ok_or_else(|| bad("no __global__ function in the source".into()))?;
    // Barriers and warp operations need each thread on its own fiber.
    let barriers = ["__syncthreads", "_sync(", "__syncwarp", "__activemask"].iter().any(|c| source.contains(c));
    out += "\nnamespace {\nstruct Args {\n";
    for p in &params {
        if p.pointer {
            out += &format!("    smelt_emu::Ptr<{}{}> {};\n", if p.constant { "const " } else { "" }, p.ty, p.name);
        } else {
            out += &format!("    unsigned long long {};\n", p.name);
        }
    }
    out += "};\nvoid body(void* d) {\n    Args* a = (Args*)d;\n";
    let call: Vec<String> = params.iter().map(|p| format!("a->{}", p.name)).collect();
    out += &format!("    {name}({});\n}}\n}}  // namespace\n\n", call.join(", "));
    out += "extern \"C\" __attribute__((visibility(\"default\"))) int smelt_emu_launch(void** args, smelt_emu::Launch* l) {\n";
    out += "    smelt_emu::current = l;\n    Args a;\n";
    for (i, p) in params.iter().enumerate() {
        if p.pointer {
            out += &format!(
                "    a.{n} = smelt_emu::Ptr<{c}{t}>::make(args[{i}], {i}, \"{n}\");\n",
                n = p.name,
                c = if p.constant { "const " } else { "" },
                t = p.ty
            );
        } else {
            out += &format!("    std::memcpy(&a.{}, args[{i}], 8);\n", p.name);
        }
    }
    // A misaligned vector parameter faults on a GPU (and here): no launch.
    out += "    if (l->errors > 0) return 1;\n";
    out += &format!("    return smelt_emu::run(l, {barriers}, body, &a);\n}}\n");
    Ok((out, params))
}

/// The host C++ compiler: `$SMELT_CXX`, else `c++`.
fn compiler() -> String {
    std::env::var("SMELT_CXX").unwrap_or_else(|_| "c++".into())
}

/// The compiler's identity (its `--version` first line), part of the cache key.
fn compiler_version(cxx: &str) -> Result<String, RuntimeError> {
    let out = std::process::Command::new(cxx).arg("--version").output().map_err(|e| {
        RuntimeError::NoCompiler(format!(
            "cannot run `{cxx}` ({e}): the emulator compiles kernels with a C++ compiler (install g++, or set SMELT_CXX)"
        ))
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string())
}

#[repr(C)]
struct Extent {
    lo: u64,
    hi: u64,
}

#[repr(C)]
struct Launch {
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

type LaunchFn = unsafe extern "C" fn(*mut *mut c_void, *mut Launch) -> c_int;

/// A kernel compiled for the host.
pub struct EmuKernel {
    name: String,
    params: Vec<Param>,
    entry: LaunchFn,
    _lib: libloading::Library,
}

impl std::fmt::Debug for EmuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmuKernel({})", self.name)
    }
}

impl EmuKernel {
    /// Its parameters.
    pub fn params(&self) -> &[Param] {
        &self.params
    }
}

/// Compiles kernels for the emulator, with a cache on disk.
#[derive(Clone, Debug)]
pub struct EmuCompiler {
    cxx: String,
    version: String,
    dir: PathBuf,
    includes: Arc<std::sync::OnceLock<Result<PathBuf, String>>>,
}

impl EmuCompiler {
    /// The host compiler (`$SMELT_CXX` or `c++`), caching in `emu/` under the kernel cache.
    pub fn new() -> Result<EmuCompiler, RuntimeError> {
        let cxx = compiler();
        let version = compiler_version(&cxx)?;
        Ok(EmuCompiler { cxx, version, dir: Cache::default_dir().join("emu"), includes: Arc::default() })
    }

    /// The folder of smelt's CUDA headers for the host compiler (one per
    /// header version, made once), with the main header precompiled when
    /// the compiler can (it halves the time of a small kernel).
    fn includes(&self) -> Result<PathBuf, String> {
        // One thread of this process at a time writes the folder (other
        // processes write under other temporary names, then rename).
        static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        self.includes
            .get_or_init(|| {
                let _one = WRITING.lock().unwrap_or_else(|e| e.into_inner());
                let inc = self.dir.join(format!("include-{}", Cache::key(HEADER, std::slice::from_ref(&self.version))));
                let tag = format!("tmp{}", std::process::id());
                let write = |file: &str, text: &str| -> Result<(), String> {
                    let path = inc.join(file);
                    if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
                        let tmp = path.with_extension(&tag);
                        std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
                        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
                    }
                    Ok(())
                };
                std::fs::create_dir_all(&inc).map_err(|e| format!("{}: {e}", inc.display()))?;
                write("smelt_emu.h", HEADER)?;
                for stub in ["cuda_fp16.h", "cuda_bf16.h", "mma.h", "cuda_pipeline.h"] {
                    write(stub, "#pragma once\n")?;
                }
                let pch = inc.join("smelt_emu.h.gch");
                if !pch.exists() {
                    let tmp = inc.join(format!("smelt_emu.h.gch.{tag}"));
                    let flags = FLAGS.iter().filter(|f| **f != "-shared");
                    let made = std::process::Command::new(&self.cxx)
                        .args(flags)
                        .args(["-x", "c++-header", "-o"])
                        .arg(&tmp)
                        .arg(inc.join("smelt_emu.h"))
                        .output()
                        .is_ok_and(|o| o.status.success());
                    // Without a precompiled header, kernels compile from the text.
                    if made {
                        let _ = std::fs::rename(&tmp, &pch);
                    } else {
                        let _ = std::fs::remove_file(&tmp);
                    }
                }
                Ok(inc)
            })
            .clone()
    }

    /// Compiles (or finds in the cache) and loads kernel `name`.
    pub fn compile(&self, name: &str, source: &str) -> Result<EmuKernel, RuntimeError> {
        let (unit, params) = translate(name, source)?;
        let mut options: Vec<String> = FLAGS.iter().map(|s| s.to_string()).collect();
        options.push(self.version.clone());
        options.push(HEADER.to_string());
        let key = Cache::key(&unit, &options);
        let lib = self.dir.join(format!("{key}.so"));
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e: std::io::Error| RuntimeError::Emulator { kernel: name.to_string(), msg: format!("{p}: {e}") }
        };
        let cpp = self.dir.join(format!("{key}.cpp"));
        let cached = std::fs::read_to_string(&cpp).is_ok_and(|s| s == unit) && lib.exists();
        if !cached {
            let tag = format!("tmp{}_{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], "");
            let inc = self.includes().map_err(|msg| RuntimeError::Emulator { kernel: name.to_string(), msg })?;
            let src_tmp = self.dir.join(format!("{key}.{tag}.cpp"));
            let lib_tmp = self.dir.join(format!("{key}.{tag}.so"));
            std::fs::write(&src_tmp, &unit).map_err(io(&src_tmp))?;
            let out = std::process::Command::new(&self.cxx)
                .args(FLAGS)
                .arg("-I")
                .arg(&inc)
                .arg("-o")
                .arg(&lib_tmp)
                .arg(&src_tmp)
                .output()
                .map_err(|e| RuntimeError::NoCompiler(format!("cannot run `{}`: {e}", self.cxx)))?;
            if !out.status.success() {
                let _ = std::fs::remove_file(&src_tmp);
                let log = String::from_utf8_lossy(&out.stderr);
                let log: String = log.lines().take(30).collect::<Vec<_>>().join("\n");
                return Err(RuntimeError::Emulator { kernel: name.to_string(), msg: format!("the host compiler rejected it:\n{log}") });
            }
            std::fs::rename(&lib_tmp, &lib).map_err(io(&lib))?;
            std::fs::rename(&src_tmp, &cpp).map_err(io(&cpp))?;
        }
        // SAFETY: the library is smelt's own translation of a kernel; its
        // initialisers only set up thread-local variables.
        let l = unsafe { libloading::Library::new(&lib) }
            .map_err(|e| RuntimeError::Emulator { kernel: name.to_string(), msg: format!("loading {}: {e}", lib.display()) })?;
        // SAFETY: `smelt_emu_launch` is the launcher `translate` appended, of this type.
        let entry = unsafe { l.get::<LaunchFn>(b"smelt_emu_launch\0") }
            .map(|s| *s)
            .map_err(|e| RuntimeError::Emulator { kernel: name.to_string(), msg: format!("no launcher in {}: {e}", lib.display()) })?;
        Ok(EmuKernel { name: name.to_string(), params, entry, _lib: l })
    }

    /// Compiles `(name, source)` pairs on `threads` threads, calling
    /// `progress(name)` after each; the first failure is returned.
    pub fn compile_all(
        &self,
        kernels: &[(String, String)],
        threads: usize,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<HashMap<String, Arc<EmuKernel>>, RuntimeError> {
        let compiled = smelt_codegen::program::parallel_map(kernels, threads, |(name, src)| {
            let r = self.compile(name, src);
            progress(name);
            r.map(|k| (name.clone(), Arc::new(k)))
        });
        compiled.into_iter().collect()
    }
}

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
        Ok(Instant::now())
    }

    fn elapsed_ms(&mut self, from: &Instant, to: &Instant) -> Result<f64, RuntimeError> {
        Ok(to.duration_since(*from).as_secs_f64() * 1e3)
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// A program on the emulator.
pub type EmuExecutor = Executor<Emulator>;

/// Compiles every kernel of `program` for the host (on all cores, calling
/// `progress` after each) and loads it with its weights blob.
pub fn executor(program: Program, weights: &[u8], progress: &(dyn Fn(&str) + Sync)) -> Result<EmuExecutor, RuntimeError> {
    let need = program.arena.saturating_add(weights.len());
    crate::check_host_memory("the emulator's arena and weights", need)?;
    let compiler = EmuCompiler::new()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernels = compiler.compile_all(&program.sources(), threads, progress)?;
    Executor::new(Emulator::new(kernels, &compiler), program, weights, None)
}
