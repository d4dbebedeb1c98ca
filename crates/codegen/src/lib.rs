//! Code generation. Today: the NVRTC toolchain that every generated kernel
//! goes through (compilation to PTX with the NVRTC log and the offending
//! source line on failure, an on-disk cache keyed by source and options) and
//! the probes that tell whether NVRTC and the CUDA driver can be loaded.
//! Kernels as data: so far elementwise ([`elementwise`]), pooling ([`pool`]),
//! reduction ([`reduce`]), transpose, concat and LRN ([`layout`]) and GEMM
//! ([`gemm`]) kernels, rendered to CUDA C and run on the CPU
//! from the same description; convolutions come next.

mod cache;
pub mod conv;
pub mod elementwise;
mod error;
pub mod gemm;
pub mod kernel;
pub mod layout;
pub mod nvrtc;
pub mod pool;
pub mod program;
pub mod ptxas;
pub mod reduce;

pub use cache::Cache;
pub use error::CodegenError;
pub use kernel::{Kernel, Launch, Lowered};
pub use program::Program;

/// The CUDA C type of a dtype, and the functions that load it to and store
/// it from f32 (empty where no conversion is needed).
pub(crate) fn c_type(d: smelt_ir::DType) -> (&'static str, &'static str, &'static str) {
    use smelt_ir::DType;
    match d {
        DType::F16 => ("__half", "__half2float", "__float2half"),
        DType::BF16 => ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16"),
        DType::F32 => ("float", "", ""),
        DType::I64 => ("long long", "", ""),
        DType::I32 => ("int", "", ""),
        DType::Bool => ("bool", "", ""),
    }
}

/// Whether `libnvrtc` can be loaded (through `LD_LIBRARY_PATH` or the system
/// loader). Never panics: callers use it to skip GPU work with a clear reason.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library; no CUDA call is made.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver library can be loaded.
pub fn cuda_driver_available() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
