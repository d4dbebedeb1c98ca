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
    /// Running needs more host memory than the machine has available.
    #[error("{what} needs {} of host memory but only {} is available", human(*need), human(*available))]
    HostMemory {
        /// What needs it.
        what: String,
        /// Bytes needed.
        need: usize,
        /// Bytes available (`MemAvailable`).
        available: usize,
    },
    /// A program cannot be loaded or run as built (always a compiler bug).
    #[error("program: {0}")]
    Program(String),
    /// The emulator could not compile or load a kernel (a bug: generated
    /// code the host compiler rejects).
    #[error("emulator, kernel {kernel}: {msg}")]
    Emulator {
        /// The kernel.
        kernel: String,
        /// What failed.
        msg: String,
    },
    /// A kernel misbehaved: an access outside its argument, a misaligned
    /// vector parameter, overlapping `__restrict__` arguments (a bug in
    /// the generated code or the plan).
    #[error("kernel {kernel} (node {node}): {msg}")]
    Kernel {
        /// The kernel.
        kernel: String,
        /// The node it computes.
        node: String,
        /// What went wrong, with thread and block.
        msg: String,
    },
    /// The emulator needs a C++ compiler and none can be run.
    #[error("no C++ compiler: {0}")]
    NoCompiler(String),
    /// The graph is invalid (always a compiler bug after a pass).
    #[error(transparent)]
    Ir(#[from] smelt_ir::IrError),
}

impl RuntimeError {
    /// Whether this is smelt's fault (a program or kernel that misbehaves,
    /// an invalid graph) rather than the input's or the machine's.
    pub fn is_bug(&self) -> bool {
        match self {
            RuntimeError::Program(_) | RuntimeError::Emulator { .. } | RuntimeError::Kernel { .. } | RuntimeError::Ir(_) => true,
            RuntimeError::Input { .. }
            | RuntimeError::MissingWeight(_)
            | RuntimeError::Unsupported { .. }
            | RuntimeError::NoGpu(_)
            | RuntimeError::Cuda(_)
            | RuntimeError::MemoryLimit { .. }
            | RuntimeError::HostMemory { .. }
            | RuntimeError::NoCompiler(_) => false,
        }
    }
}

fn human(b: usize) -> String {
    format!("{:.2} GiB ({b} bytes)", b as f64 / (1u64 << 30) as f64)
}
