//! Executors. The CPU reference executor ([`cpu`]), the oracle every test
//! trusts: it runs any IR graph op by op in f32 (f16 and bf16 values are
//! rounded to their dtype after each op, as kernels that store in half do).
//! The CUDA executor ([`cuda`]) runs a compiled program on a GPU in one
//! arena of the planned size; the emulator ([`emu`]) runs the same
//! program's CUDA C on the CPU, and the host device ([`host`]) its kernel
//! descriptions. All three are [`exec::Device`]s driven by one
//! [`exec::Executor`].

pub mod cpu;
pub mod cuda;
pub mod emu;
mod error;
pub mod exec;
pub mod host;

pub use error::RuntimeError;

/// Host memory available now (`MemAvailable` of `/proc/meminfo`; `None`
/// where it cannot be read). `SMELT_HOST_MEMORY` (bytes) overrides it, for
/// tests of the refusal.
pub fn host_memory_available() -> Option<usize> {
    if let Some(v) = std::env::var("SMELT_HOST_MEMORY").ok().and_then(|v| v.parse().ok()) {
        return Some(v);
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses, before anything is allocated, a run whose host memory `need`
/// exceeds what is available.
pub fn check_host_memory(what: &str, need: usize) -> Result<(), RuntimeError> {
    match host_memory_available() {
        Some(available) if need > available => Err(RuntimeError::HostMemory { what: what.to_string(), need, available }),
        _ => Ok(()),
    }
}
