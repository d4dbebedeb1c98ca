//! Graph passes. [`pipeline::run`] fixes their order and runs the verifier
//! after each one in debug builds and tests. Fusion (`fusion`, `ew_cluster`, `concat`)
//! runs between two dead-code eliminations; memory planning joins as its
//! issue lands.
#![deny(missing_docs)]

pub mod concat;
pub mod dce;
pub mod ew_cluster;
pub mod fusion;
pub mod memory;
pub mod pipeline;
pub mod precision;
pub mod reduce_fuse;

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
