//! Code generation: kernels as data. Every node of a fused graph lowers to a
//! description ([`Kernel`]: [`conv`], [`gemm`], [`elementwise`], [`pool`],
//! [`reduce`], [`layout`]) that renders to CUDA C and runs on the CPU; a
//! [`Program`] puts them in schedule order with arena and weights offsets
//! from the memory plan. NVRTC ([`nvrtc`]) compiles the CUDA C to PTX with
//! an on-disk [`Cache`]; [`ptxas`] reports registers and spills.

pub mod attention;
pub mod cache;
pub mod conv;
pub mod cost;
pub mod elementwise;
mod error;
pub mod gemm;
pub mod grad;
pub mod kernel;
pub mod launch;
pub mod layout;
pub mod nvrtc;
pub mod pool;
pub mod program;
pub mod ptxas;
pub mod reduce;
pub mod select;
pub mod tile;
pub mod tiling;
pub mod update;

pub use cache::Cache;
pub use error::CodegenError;
pub use kernel::{Family, Kernel, Launch, Lowered, Route};
pub use program::Program;
pub use tiling::{Target, TileChoice};

/// The CUDA C type of a dtype, and the functions that load it to and store
/// it from f32 (empty where no conversion is needed).
/// The f32 C expression `x` converted for a store of dtype `d` (floats only).
pub(crate) fn store_c(d: smelt_ir::DType, x: &str) -> String {
    match d {
        smelt_ir::DType::F16 | smelt_ir::DType::BF16 => format!("{}({x})", c_type(d).2),
        _ => x.to_string(),
    }
}

pub(crate) fn c_type(d: smelt_ir::DType) -> (&'static str, &'static str, &'static str) {
    use smelt_ir::DType;
    match d {
        DType::F16 => ("__half", "__half2float", "__float2half"),
        DType::BF16 => ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16"),
        DType::F32 => ("float", "", ""),
        DType::I64 => ("long long", "", ""),
        DType::I32 => ("int", "", ""),
        DType::Bool => ("bool", "", ""),
        DType::I8 => ("signed char", "", ""),
        DType::U8 => ("unsigned char", "", ""),
        DType::I16 => ("short", "", ""),
        DType::U16 => ("unsigned short", "", ""),
        DType::U32 => ("unsigned int", "", ""),
    }
}

/// A CUDA C float literal: `1.5f`, or a bit pattern for infinities and NaN
/// (Rust's `inf` is not C; an ONNX Clip with one bound has an infinite other).
/// C for the larger of `a` and `b`, NaN if either is (as
/// [`smelt_ir::max_nan`]; `fmaxf` drops a NaN). Each operand is evaluated
/// twice: pass names or constants.
pub(crate) fn c_max(a: &str, b: &str) -> String {
    format!("({a} != {a} || {a} > {b} ? {a} : {b})")
}

/// C for the smaller of `a` and `b`, NaN if either is (see [`c_max`]).
pub(crate) fn c_min(a: &str, b: &str) -> String {
    format!("({a} != {a} || {a} < {b} ? {a} : {b})")
}

/// C for `x` clipped to `[lo, hi]` as `min_nan(max_nan(x, lo), hi)` with
/// constant bounds: a NaN stays NaN.
pub(crate) fn c_clip(x: &str, lo: f32, hi: f32) -> String {
    let (lo, hi) = (c_f32(lo), c_f32(hi));
    format!("({x} < {lo} ? ({lo} > {hi} ? {hi} : {lo}) : ({x} > {hi} ? {hi} : {x}))")
}

pub(crate) fn c_f32(x: f32) -> String {
    if x.is_finite() {
        format!("{x:?}f")
    } else {
        format!("__int_as_float(0x{:08x})", x.to_bits())
    }
}

/// Whether `libnvrtc` can be loaded (through `LD_LIBRARY_PATH` or the system
/// loader). Never panics: callers use it to skip GPU work with a clear reason.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library; no CUDA call is made.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The loaded NVRTC's version, e.g. (12, 9), if NVRTC can be loaded.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// The CUDA release that made a PTX text, from its header comment
/// (`// Cuda compilation tools, release 12.9, V12.9.86`).
pub fn ptx_release(ptx: &str) -> Option<(i32, i32)> {
    let line = ptx.lines().take(12).find_map(|l| l.split("compilation tools, release ").nth(1))?;
    let (major, minor) = line.split(',').next()?.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether the CUDA driver library can be loaded.
pub fn cuda_driver_available() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
