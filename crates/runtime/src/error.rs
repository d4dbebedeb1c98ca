//! Errors of the runtime crate.

/// What can go wrong running a graph.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The inputs given do not match the graph's inputs.
    #[error("input {index} (\"{name}\"): {msg}")]
    Input {
        /// Position of the input.
        index: usize,
        /// The graph input's name.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// A constant has no data (a text file's weights were never filled).
    #[error("constant \"{0}\" has no data")]
    MissingWeight(String),
    /// The executor cannot run this node.
    #[error("node {node}: {msg}")]
    Unsupported {
        /// The node, by id, name and op.
        node: String,
        /// What is not supported.
        msg: String,
    },
    /// No CUDA device can be used, and why.
    #[error("no GPU: {0}")]
    NoGpu(String),
    /// A CUDA driver call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// The program needs more device memory than the limit allows.
    #[error("the program needs an arena of {need} bytes for its activations, over the memory limit of {limit}")]
    MemoryLimit {
        /// Arena bytes.
        need: usize,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The graph is invalid (always a compiler bug after a pass).
    #[error(transparent)]
    Ir(#[from] smelt_ir::IrError),
}
