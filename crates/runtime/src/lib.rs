//! Executors. The CPU reference executor ([`cpu`]), the oracle every test
//! trusts: it runs any IR graph op by op in f32 (f16 and bf16 values are
//! rounded to their dtype after each op, as kernels that store in half do).
//! The CUDA executor ([`cuda`]) runs a compiled program on a GPU in one
//! arena of the planned size; the emulator ([`emu`]) runs the same
//! program's CUDA C on the CPU. Both are [`exec::Device`]s driven by one
//! [`exec::Executor`].

pub mod cpu;
pub mod cuda;
pub mod emu;
mod error;
pub mod exec;

pub use error::RuntimeError;
