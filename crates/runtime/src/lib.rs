//! Executors. Today the CPU reference executor, the oracle every test
//! trusts: it runs any IR graph op by op in f32 (f16 and bf16 values are
//! rounded to their dtype after each op, as kernels that store in half do).

pub mod cpu;
mod error;

pub use error::RuntimeError;
