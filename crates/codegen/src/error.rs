//! Errors of the codegen crate.

/// What can go wrong generating or compiling kernels.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// libnvrtc could not be loaded.
    #[error("NVRTC is not available: libnvrtc.so.12 was not found (install the PyPI wheel nvidia-cuda-nvrtc-cu12 and put its lib folder on LD_LIBRARY_PATH)")]
    NvrtcUnavailable,
    /// NVRTC rejected a kernel: its log, and the source line it points at.
    #[error("NVRTC failed to compile kernel {kernel}:\n{log}{}", line.as_ref().map_or(String::new(), |(n, s)| format!("\n  at line {n}: {s}")))]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// NVRTC's log.
        log: String,
        /// The first line the log points at, with its text.
        line: Option<(usize, String)>,
    },
    /// NVRTC failed outside compilation (creating the program, reading PTX).
    #[error("NVRTC error on kernel {kernel}: {msg}")]
    Nvrtc {
        /// The kernel's name.
        kernel: String,
        /// What failed.
        msg: String,
    },
    /// The kernel cache could not be read or written.
    #[error("kernel cache {path}: {error}")]
    Cache {
        /// The file.
        path: String,
        /// The OS error (in the message, so not a `source`: error chains
        /// would print it twice).
        error: std::io::Error,
    },
    /// A node of the kernel graph has no CUDA kernel (an op smelt runs only
    /// on the CPU, or an instance code generation does not cover).
    #[error("node {node} ({op}): {detail}")]
    NoKernel {
        /// The node's name.
        node: String,
        /// Its op.
        op: String,
        /// What is missing.
        detail: String,
        /// The model nodes it computes (its provenance).
        origin: Vec<smelt_ir::NodeId>,
    },
    /// A program cannot be built or run as asked.
    #[error("node {node} ({op}): {detail}")]
    Unsupported {
        /// The node's name.
        node: String,
        /// Its op.
        op: String,
        /// What is missing.
        detail: String,
    },
    /// A header a kernel includes is in none of the include folders.
    #[error("kernel {kernel} includes {header}, which no folder of SMELT_CUDA_INCLUDE holds: {hint}")]
    MissingHeader {
        /// The kernel's name.
        kernel: String,
        /// The header.
        header: String,
        /// Where to get it.
        hint: String,
    },
    /// ptxas failed or could not be run.
    #[error("ptxas: {0}")]
    Ptxas(String),
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The OS error (in the message, not a `source`).
        error: std::io::Error,
    },
}

impl CodegenError {
    /// Whether this is smelt's fault (generated code NVRTC rejects) rather
    /// than the model's (an op with no kernel) or the machine's (no NVRTC,
    /// no ptxas, an unwritable cache).
    pub fn is_bug(&self) -> bool {
        match self {
            CodegenError::Compile { .. } | CodegenError::Nvrtc { .. } => true,
            CodegenError::NvrtcUnavailable
            | CodegenError::MissingHeader { .. }
            | CodegenError::Cache { .. }
            | CodegenError::NoKernel { .. }
            | CodegenError::Unsupported { .. }
            | CodegenError::Ptxas(_)
            | CodegenError::Io { .. } => false,
        }
    }
}
