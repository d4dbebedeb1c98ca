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

/// Errors of the passes crate. Passes run on verified graphs, so every
/// failure is a compiler bug: the pass produced a graph the verifier
/// rejects, or found its input inconsistent with what an earlier pass
/// promised.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The graph is invalid after a pass, or a pass failed on it: always a
    /// compiler bug.
    #[error("compiler bug in pass {pass}: {source}")]
    Bug {
        /// The pass that ran last.
        pass: &'static str,
        /// What the verifier found.
        source: smelt_ir::IrError,
    },
}

impl PassError {
    /// Whether this is smelt's fault rather than the input's (always, for
    /// now: the driver verifies every graph before the passes see it).
    pub fn is_bug(&self) -> bool {
        match self {
            PassError::Bug { .. } => true,
        }
    }
}
