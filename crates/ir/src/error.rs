//! Errors of the IR crate.

/// Everything that can go wrong building, parsing, importing or verifying a graph.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    /// An op's inputs do not fit it (shape, dtype or arity).
    #[error("node {node}: {msg}")]
    Shape {
        /// The node, by name and op.
        node: String,
        /// What is wrong.
        msg: String,
    },
    /// A size, index or shape computation from the input exceeds what smelt
    /// accepts (a tensor over 1 TiB, an overflowing extent, an absurd
    /// window): the one error for "too large", with the node or value.
    #[error("{node}: too large: {msg}")]
    TooLarge {
        /// The node (name and op), input or tensor.
        node: String,
        /// What is too large, with the figures.
        msg: String,
    },
    /// The graph is inconsistent (the verifier, a text file, the builder).
    /// From a user's file this is the user's mistake; after a pass it is
    /// reported as the passes crate's `PassError::Bug`.
    #[error("invalid graph: {0}")]
    Invalid(String),
    /// `zoo:NAME` names no built-in model.
    #[error("no built-in model {name:?}; the zoo has {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
    /// The text format could not be parsed.
    #[error("line {line}: {msg}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// The ONNX file is malformed, truncated or inconsistent.
    #[error("malformed ONNX model: {0}")]
    Malformed(String),
    /// A NumPy file (`.npy`, `.npz`: data sets, checkpoints) is malformed,
    /// truncated or damaged: the message starts with the file.
    #[error("{0}")]
    Array(String),
    /// The ONNX model uses an op smelt does not support.
    #[error("unsupported op {op_type} (opset {opset}) in node \"{node}\"")]
    UnsupportedOp {
        /// The ONNX op type.
        op_type: String,
        /// The node's name (or its first output when unnamed).
        node: String,
        /// The model's opset for the op's domain.
        opset: i64,
    },
    /// The ONNX node uses an attribute or attribute value smelt does not support.
    #[error("node \"{node}\" ({op_type}, opset {opset}): {msg}")]
    Unsupported {
        /// The ONNX op type.
        op_type: String,
        /// The node's name.
        node: String,
        /// The model's opset.
        opset: i64,
        /// What is not supported.
        msg: String,
    },
    /// An op needs at compile time a value (a shape, axes, pads, bounds)
    /// that is a graph input: `ImportOptions::known` (`--set NAME=VALUES`)
    /// can give it.
    #[error("node \"{node}\" ({op_type}, opset {opset}): {what} must be a constant known at import, and it is the graph input \"{input}\": give its value with --set {input}=VALUES")]
    NeedsValue {
        /// The ONNX op type.
        op_type: String,
        /// The node's name.
        node: String,
        /// The model's opset.
        opset: i64,
        /// Which input of the node, in words.
        what: String,
        /// The graph input's name.
        input: String,
    },
    /// The model uses a feature smelt does not support (a data type, external data).
    #[error("unsupported: {0}")]
    UnsupportedFeature(String),
    /// An import option does not fit the model (`--dim` naming no
    /// dimension): the user's mistake.
    #[error("{0}")]
    Usage(String),
    /// Reading a file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The OS error (shown in the message, so not a `source`: error
        /// chains would print it twice).
        error: std::io::Error,
    },
}

/// How shape inference marks a "too large" message (see [`IrError::TooLarge`]).
pub(crate) const TOO_LARGE: &str = "too large: ";

impl IrError {
    /// The error of inference failing on `node`: [`IrError::TooLarge`] for a
    /// size, else [`IrError::Shape`].
    pub(crate) fn inference(node: String, msg: String) -> IrError {
        match msg.strip_prefix(TOO_LARGE) {
            Some(m) => IrError::TooLarge { node: format!("node {node}"), msg: m.to_string() },
            None => IrError::Shape { node, msg },
        }
    }
}
