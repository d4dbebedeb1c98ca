//! Kernels compiled for the emulator by the host C++ compiler, in batches:
//! each kernel's translation sits in a namespace of its own (named by its
//! cache key) with its own launcher, and many such kernels make one
//! translation unit and one shared object, so the compiler's start-up, the
//! header and the link are paid once per batch rather than once per kernel.
//! Every kernel keeps its own cache entry (`KEY.cpp`, its text, and
//! `KEY.so`, a link to its batch's library): a kernel two programs share is
//! compiled once. A batch the compiler rejects is compiled again one kernel
//! per unit, so the error names the culprit.
//!
//! The optimisation level follows the work a kernel's launches do
//! ([`Level::for_work`]); it is part of the key. Every level compiles f32
//! arithmetic exactly as written (no contraction, no fast math), so the
//! levels give the same bytes.

use super::LaunchFn;
use crate::RuntimeError;
use smelt_codegen::cache::Cache;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// smelt's CUDA header for the host compiler.
pub const HEADER: &str = include_str!("smelt_emu.h");

/// Options every kernel is compiled with: f32 arithmetic exactly as written
/// (no contraction into fused multiply-adds, no fast math), as the CPU
/// descriptions compute. The level comes from [`Level`].
const FLAGS: &[&str] = &["-std=c++17", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fvisibility=hidden", "-w"];

/// At most this many kernels in one translation unit (`SMELT_EMU_BATCH`
/// overrides it; 1 compiles each kernel alone): a batch's compile stays
/// short enough that the cores share the work evenly.
const MAX_BATCH: usize = 48;

fn max_batch() -> usize {
    std::env::var("SMELT_EMU_BATCH").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(MAX_BATCH)
}

/// How hard the host compiler optimises a kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// `-O1`: for kernels whose launches are small (most of a test suite's
    /// kernels): compiles in about half the time of `-O2`.
    O1,
    /// `-O2`: for kernels whose launches do enough work that running them
    /// costs more than compiling them.
    #[default]
    O2,
}

impl Level {
    /// Threads (grid times block, summed over a program's launches of the
    /// kernel) from which a kernel is compiled at `-O2`.
    pub const O2_FROM_THREADS: u64 = 1 << 20;

    /// The level for a kernel whose launches run `threads` threads in all.
    pub fn for_work(threads: u64) -> Level {
        if threads >= Level::O2_FROM_THREADS {
            Level::O2
        } else {
            Level::O1
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Level::O1 => "-O1",
            Level::O2 => "-O2",
        }
    }
}

/// A kernel to compile: its name, CUDA C and level.
#[derive(Clone, Debug)]
pub struct KernelSource {
    /// The kernel's name (its `__global__` function).
    pub name: String,
    /// Its CUDA C.
    pub source: String,
    /// The optimisation level.
    pub level: Level,
}

impl KernelSource {
    /// `name` and `source` at `level`.
    pub fn new(name: impl Into<String>, source: impl Into<String>, level: Level) -> KernelSource {
        KernelSource { name: name.into(), source: source.into(), level }
    }
}

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

/// A kernel translated for the host compiler.
#[derive(Clone, Debug)]
pub struct Translated {
    /// The `#include` lines of the source, which go to the top of a unit.
    pub includes: Vec<String>,
    /// The rest of the source, every function signature's pointer
    /// parameters made checked pointers (`smelt_emu::Ptr<const float> in0`),
    /// then `int launch(void**, smelt_emu::Launch*)`, which runs the kernel.
    /// It goes inside a namespace of its own.
    pub body: String,
    /// The macros the source defines, undefined after it.
    pub macros: Vec<String>,
    /// The kernel's parameters.
    pub params: Vec<Param>,
}

/// Translates kernel `name`'s CUDA C for the host compiler.
pub fn translate(name: &str, source: &str) -> Result<Translated, RuntimeError> {
    let bad = |msg: String| RuntimeError::Emulator { kernel: name.to_string(), msg };
    let (mut includes, mut macros) = (Vec::new(), Vec::new());
    let mut out = String::new();
    let mut params = None;
    for line in source.lines() {
        let directive = line.trim_start();
        if directive.starts_with("#include") {
            includes.push(directive.to_string());
            continue;
        }
        if let Some(m) = directive.strip_prefix("#define") {
            let m = m.trim_start();
            let end = m.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(m.len());
            macros.push(m[..end].to_string());
        }
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
        // The kernel itself needs no C linkage (its launcher has it): two
        // kernels of one name in one unit are two namespaces' functions.
        let head = line[..=open].replacen("extern \"C\" ", "", 1);
        out += &format!("{head}{}{}\n", decl.join(", "), &line[close..]);
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
    out += "int launch(void** args, smelt_emu::Launch* l) {\n";
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
    Ok(Translated { includes, body: out, macros, params })
}

/// A kernel ready for a unit: its key, launcher symbol and text.
struct Unit {
    name: String,
    key: String,
    level: Level,
    includes: Vec<String>,
    /// The kernel inside its namespace, then its `extern "C"` launcher.
    text: String,
    params: Vec<Param>,
}

impl Unit {
    fn symbol(&self) -> String {
        format!("smelt_emu_launch_{}", self.key)
    }
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

/// A kernel compiled for the host.
pub struct EmuKernel {
    pub(super) name: String,
    pub(super) params: Vec<Param>,
    pub(super) entry: LaunchFn,
    path: PathBuf,
    _lib: Arc<libloading::Library>,
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

    /// The shared object it was loaded from (its batch's).
    pub fn library(&self) -> &std::path::Path {
        &self.path
    }
}

/// What the emulator's compiler did in this process, summed over calls:
/// `SMELT_EMU_STATS=FILE` also appends one line per call to FILE.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Kernels asked for.
    pub kernels: u64,
    /// Of them, found in the cache.
    pub hits: u64,
    /// Kernels compiled.
    pub compiled: u64,
    /// Translation units the compiler ran on (batches, and single kernels
    /// of a rejected batch).
    pub units: u64,
    /// Seconds spent in the compiler, summed over threads.
    pub compile_seconds: f64,
}

static KERNELS: AtomicU64 = AtomicU64::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);
static COMPILED: AtomicU64 = AtomicU64::new(0);
static UNITS: AtomicU64 = AtomicU64::new(0);
static MICROS: AtomicU64 = AtomicU64::new(0);

/// What the emulator's compiler did in this process so far.
pub fn stats() -> Stats {
    Stats {
        kernels: KERNELS.load(Ordering::Relaxed),
        hits: HITS.load(Ordering::Relaxed),
        compiled: COMPILED.load(Ordering::Relaxed),
        units: UNITS.load(Ordering::Relaxed),
        compile_seconds: MICROS.load(Ordering::Relaxed) as f64 * 1e-6,
    }
}

/// Appends a call's figures to `$SMELT_EMU_STATS`, tab-separated: the
/// process, the thread (a test's name under the test harness), kernels,
/// cache hits, kernels compiled, units, compile seconds, wall seconds.
fn log_stats(kernels: usize, hits: usize, compiled: usize, units: u64, compile_s: f64, wall_s: f64) {
    let Some(path) = std::env::var_os("SMELT_EMU_STATS") else { return };
    let exe = std::env::current_exe().ok().and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned())).unwrap_or_default();
    let thread = std::thread::current().name().unwrap_or("-").to_string();
    let line = format!("{exe}\t{thread}\t{kernels}\t{hits}\t{compiled}\t{units}\t{compile_s:.3}\t{wall_s:.3}\n");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Compiles kernels for the emulator, with a cache on disk.
#[derive(Clone, Debug)]
pub struct EmuCompiler {
    cxx: String,
    pub(super) version: String,
    dir: PathBuf,
    includes: Arc<Mutex<HashMap<Level, Result<PathBuf, String>>>>,
}

impl EmuCompiler {
    /// The host compiler (`$SMELT_CXX` or `c++`), caching in `emu/` under the kernel cache.
    pub fn new() -> Result<EmuCompiler, RuntimeError> {
        let cxx = compiler();
        let version = compiler_version(&cxx)?;
        Ok(EmuCompiler { cxx, version, dir: Cache::default_dir().join("emu"), includes: Arc::default() })
    }

    fn flags(level: Level) -> impl Iterator<Item = &'static str> {
        FLAGS.iter().copied().chain([level.flag()])
    }

    /// The folder of smelt's CUDA headers for the host compiler (one per
    /// header version and level, made once), with the main header
    /// precompiled when the compiler can (it halves the time of a small
    /// unit).
    fn includes(&self, level: Level) -> Result<PathBuf, String> {
        // One thread of this process at a time writes the folder (other
        // processes write under other temporary names, then rename).
        let mut made = self.includes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = made.get(&level) {
            return r.clone();
        }
        let r = (|| {
            let flags: Vec<&str> = EmuCompiler::flags(level).collect();
            let inc = self.dir.join(format!("include-{}", Cache::key(HEADER, &[self.version.clone(), flags.join(" ")])));
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
                let made = std::process::Command::new(&self.cxx)
                    .args(flags.iter().filter(|f| **f != "-shared"))
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
        })();
        made.insert(level, r.clone());
        r
    }

    /// `k` translated, keyed and wrapped in its namespace.
    fn unit(&self, k: &KernelSource) -> Result<Unit, RuntimeError> {
        let t = translate(&k.name, &k.source)?;
        let mut options: Vec<String> = EmuCompiler::flags(k.level).map(str::to_string).collect();
        options.push(self.version.clone());
        options.push(HEADER.to_string());
        options.extend(t.includes.iter().cloned());
        let key = Cache::key(&t.body, &options);
        let mut text = format!("namespace smelt_k_{key} {{\n{}}}  // namespace smelt_k_{key}\n", t.body);
        for m in &t.macros {
            text += &format!("#undef {m}\n");
        }
        text += &format!(
            "extern \"C\" __attribute__((visibility(\"default\"))) int smelt_emu_launch_{key}(void** args, smelt_emu::Launch* l) {{\n    return smelt_k_{key}::launch(args, l);\n}}\n"
        );
        Ok(Unit { name: k.name.clone(), key, level: k.level, includes: t.includes, text, params: t.params })
    }

    fn paths(&self, key: &str) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("{key}.cpp")), self.dir.join(format!("{key}.so")))
    }

    fn cached(&self, u: &Unit) -> bool {
        let (cpp, so) = self.paths(&u.key);
        std::fs::read_to_string(&cpp).is_ok_and(|s| s == u.text) && so.exists()
    }

    /// Compiles `units` (all of one level) as one translation unit and
    /// shared object, and enters each in the cache: the compiler's seconds.
    fn compile_unit(&self, units: &[&Unit]) -> Result<f64, RuntimeError> {
        let first = units.first().expect("a batch has a kernel");
        let fail = |msg: String| RuntimeError::Emulator { kernel: first.name.clone(), msg };
        let inc = self.includes(first.level).map_err(fail)?;
        let mut text = String::from("#include \"smelt_emu.h\"\n");
        let mut seen = std::collections::BTreeSet::new();
        for inc in units.iter().flat_map(|u| &u.includes) {
            if seen.insert(inc) {
                text += inc;
                text.push('\n');
            }
        }
        for u in units {
            text += &u.text;
        }
        let key = Cache::key(&text, &[first.level.flag().to_string(), self.version.clone()]);
        let tag = format!("tmp{}_{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], "");
        let lib_name = format!("batch-{key}.so");
        let lib = self.dir.join(&lib_name);
        let src_tmp = self.dir.join(format!("batch-{key}.{tag}.cpp"));
        let lib_tmp = self.dir.join(format!("batch-{key}.{tag}.so"));
        std::fs::write(&src_tmp, &text).map_err(|e| fail(format!("{}: {e}", src_tmp.display())))?;
        let start = Instant::now();
        let out = std::process::Command::new(&self.cxx)
            .args(EmuCompiler::flags(first.level))
            .arg("-I")
            .arg(&inc)
            .arg("-o")
            .arg(&lib_tmp)
            .arg(&src_tmp)
            .output()
            .map_err(|e| RuntimeError::NoCompiler(format!("cannot run `{}`: {e}", self.cxx)))?;
        let seconds = start.elapsed().as_secs_f64();
        MICROS.fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        UNITS.fetch_add(1, Ordering::Relaxed);
        let _ = std::fs::remove_file(&src_tmp);
        if !out.status.success() {
            let _ = std::fs::remove_file(&lib_tmp);
            let log = String::from_utf8_lossy(&out.stderr);
            let log: String = log.lines().take(30).collect::<Vec<_>>().join("\n");
            return Err(fail(format!("the host compiler rejected it:\n{log}")));
        }
        std::fs::rename(&lib_tmp, &lib).map_err(|e| fail(format!("{}: {e}", lib.display())))?;
        COMPILED.fetch_add(units.len() as u64, Ordering::Relaxed);
        // Each kernel's entry: a link to the batch's library, then its text
        // (written last, so a present text means a complete entry).
        for u in units {
            let (cpp, so) = self.paths(&u.key);
            let (cpp_tmp, so_tmp) = (cpp.with_extension(format!("cpp.{tag}")), so.with_extension(format!("so.{tag}")));
            let _ = std::fs::remove_file(&so_tmp);
            std::os::unix::fs::symlink(&lib_name, &so_tmp).map_err(|e| fail(format!("{}: {e}", so_tmp.display())))?;
            std::fs::rename(&so_tmp, &so).map_err(|e| fail(format!("{}: {e}", so.display())))?;
            std::fs::write(&cpp_tmp, &u.text).map_err(|e| fail(format!("{}: {e}", cpp_tmp.display())))?;
            std::fs::rename(&cpp_tmp, &cpp).map_err(|e| fail(format!("{}: {e}", cpp.display())))?;
        }
        Ok(seconds)
    }

    /// Compiles `units` as one batch; if the compiler rejects it, each
    /// kernel alone, so that the error names the culprit. The compiler's
    /// seconds.
    fn compile_batch(&self, units: &[&Unit]) -> Result<f64, RuntimeError> {
        match self.compile_unit(units) {
            Ok(s) => Ok(s),
            Err(e) if units.len() == 1 => Err(e),
            Err(batch) => {
                // Every kernel that compiles alone is cached; the first
                // that does not is the error. If all do, the batch itself
                // is wrong (kernels that clash in one unit): smelt's bug.
                let mut first = None;
                for u in units {
                    if let Err(e) = self.compile_unit(&[u]) {
                        first = first.or(Some(e));
                    }
                }
                match first {
                    Some(e) => Err(e),
                    None => Err(RuntimeError::Emulator {
                        kernel: units.iter().map(|u| u.name.as_str()).collect::<Vec<_>>().join(", "),
                        msg: format!("each kernel compiles alone but not in one unit: {batch}"),
                    }),
                }
            }
        }
    }

    /// Loads a cached kernel.
    fn load(&self, u: &Unit, libs: &mut HashMap<PathBuf, Arc<libloading::Library>>) -> Result<EmuKernel, RuntimeError> {
        let fail = |msg: String| RuntimeError::Emulator { kernel: u.name.clone(), msg };
        let (_, so) = self.paths(&u.key);
        // Kernels of one batch share its library (loaded once).
        let target = std::fs::canonicalize(&so).map_err(|e| fail(format!("{}: {e}", so.display())))?;
        let lib = match libs.get(&target) {
            Some(l) => l.clone(),
            None => {
                // SAFETY: the library is smelt's own translation of
                // kernels; its initialisers only set up thread-local variables.
                let l =
                    Arc::new(unsafe { libloading::Library::new(&target) }.map_err(|e| fail(format!("loading {}: {e}", target.display())))?);
                libs.insert(target.clone(), l.clone());
                l
            }
        };
        let symbol = u.symbol();
        // SAFETY: the launcher `unit` appended, of this type.
        let entry = unsafe { lib.get::<LaunchFn>(format!("{symbol}\0").as_bytes()) }
            .map(|s| *s)
            .map_err(|e| fail(format!("no launcher {symbol} in {}: {e}", target.display())))?;
        Ok(EmuKernel { name: u.name.clone(), params: u.params.clone(), entry, path: target, _lib: lib })
    }

    /// Compiles (or finds in the cache) and loads kernel `name` at `-O2`.
    pub fn compile(&self, name: &str, source: &str) -> Result<EmuKernel, RuntimeError> {
        let mut all = self.compile_many(&[KernelSource::new(name, source, Level::O2)], 1, &|_| {})?;
        Ok(all.pop().expect("one kernel in, one out"))
    }

    /// Compiles `(name, source)` pairs at `level` on `threads` threads
    /// (see [`EmuCompiler::compile_many`]), by name.
    pub fn compile_all(
        &self,
        kernels: &[(String, String)],
        threads: usize,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<HashMap<String, Arc<EmuKernel>>, RuntimeError> {
        let ks: Vec<KernelSource> = kernels.iter().map(|(n, s)| KernelSource::new(n.clone(), s.clone(), Level::O2)).collect();
        let done = self.compile_many(&ks, threads, progress)?;
        Ok(done.into_iter().map(|k| (k.name.clone(), Arc::new(k))).collect())
    }

    /// Compiles (or finds in the cache) and loads `kernels`, in input
    /// order: the ones not cached in batches of a level, on `threads`
    /// threads, calling `progress(name)` as each is ready. The first
    /// failure is returned.
    pub fn compile_many(
        &self,
        kernels: &[KernelSource],
        threads: usize,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Vec<EmuKernel>, RuntimeError> {
        let start = Instant::now();
        let units = kernels.iter().map(|k| self.unit(k)).collect::<Result<Vec<_>, _>>()?;
        // The kernels to compile, each once, grouped by level.
        let mut missing: BTreeMap<Level, BTreeMap<&str, &Unit>> = BTreeMap::new();
        let mut hits = 0;
        for u in &units {
            if self.cached(u) {
                hits += 1;
                progress(&u.name);
            } else {
                missing.entry(u.level).or_default().insert(&u.key, u);
            }
        }
        let mut batches: Vec<Vec<&Unit>> = Vec::new();
        for group in missing.values() {
            let group: Vec<&Unit> = group.values().copied().collect();
            // At least one batch per thread, at most MAX_BATCH kernels each.
            let n = group.len().div_ceil(max_batch()).max(threads.min(group.len())).max(1);
            let per = group.len().div_ceil(n);
            batches.extend(group.chunks(per).map(<[&Unit]>::to_vec));
        }
        // The largest batches first, so that the threads finish together.
        batches.sort_by_key(|b| std::cmp::Reverse(b.len()));
        let compiled: usize = batches.iter().map(Vec::len).sum();
        let results = smelt_codegen::program::parallel_map(&batches, threads, |b| {
            let r = self.compile_batch(b);
            for u in b {
                progress(&u.name);
            }
            r
        });
        let mut compile_s = 0.0;
        for r in results {
            compile_s += r?;
        }
        let mut libs = HashMap::new();
        let loaded = units.iter().map(|u| self.load(u, &mut libs)).collect::<Result<Vec<_>, _>>()?;
        KERNELS.fetch_add(units.len() as u64, Ordering::Relaxed);
        HITS.fetch_add(hits as u64, Ordering::Relaxed);
        log_stats(units.len(), hits, compiled, batches.len() as u64, compile_s, start.elapsed().as_secs_f64());
        Ok(loaded)
    }
}
