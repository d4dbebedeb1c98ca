//! Graph passes. [`pipeline::run`] fixes their order and runs the verifier
//! after each one in debug builds and tests. Today the pipeline holds dead
//! code elimination; fusion and memory planning join it as their issues land.
#![deny(missing_docs)]

pub mod dce;
pub mod pipeline;

/// Errors of the passes crate.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The graph is invalid after a pass: always a compiler bug.
    #[error("after pass {pass}: {source}")]
    Verify {
        /// The pass that ran last.
        pass: &'static str,
        /// What the verifier found.
        source: smelt_ir::IrError,
    },
}
