//! Launch geometry: what every kernel description says of how it runs, below
//! the describers.

/// Threads per block of the one-thread-per-element kernels.
pub const BLOCK: usize = 256;

/// Launch geometry, and the trailing scalar argument (an element or row
/// count) that some kernels take after their pointers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Launch {
    /// Blocks (x, y, z).
    pub grid: [usize; 3],
    /// Threads per block (x, y, z).
    pub block: [usize; 3],
    /// The `unsigned long long` passed after the pointers, if any.
    pub count: Option<usize>,
}

/// One thread per element of `n`.
pub(crate) fn linear(n: usize) -> Launch {
    Launch { grid: [n.div_ceil(BLOCK).max(1), 1, 1], block: [BLOCK, 1, 1], count: Some(n) }
}
