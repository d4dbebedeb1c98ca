//! Code generation: today only the probe that tells whether NVRTC can be
//! loaded on this machine. Kernels as data and their CUDA C rendering land
//! here with the code-generation issue.

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
