//! smelt's tensor-graph IR at two levels: a [`Graph`] of semantic [`Op`]s
//! (what a model means) and a [`KernelGraph`] of [`KernelOp`]s (what the GPU
//! runs, made by fusion), with the facts about every op in [`traits`],
//! static [`TensorType`]s on every value, one inference function per op, a
//! [`verify`]er, a text format whose printer and parser round-trip, a
//! [`builder`] with a small model [`zoo`], and ONNX import.
//!
//! ```
#![doc = include_str!("../examples/tiny.rs")]
//! ```
#![deny(missing_docs)]

pub mod builder;
mod dtype;
mod error;
mod fused;
mod graph;
pub mod index;
mod infer;
pub mod kernel_op;
pub mod npy;
pub mod onnx;
mod op;
mod rng;
mod tensor;
pub mod text;
pub mod traits;
pub mod values;
mod verify;
pub mod zoo;

pub use dtype::{round_tf32, DType, Shape, TensorType, Tf32, MAX_TENSOR_BYTES};
pub use error::IrError;
pub use fused::{round_to, Act, Expr, ExprNode};
pub use graph::{Graph, Node, NodeId, ValueId};
pub use infer::{attention_types, broadcast, broadcast_index, broadcast_strides, infer, infer_kernel, slice_len};
pub use kernel_op::{KernelGraph, KernelOp, OpSet, Product, Reducer};
pub use op::{
    apply_binary, apply_unary, erf, max_nan, min_nan, BinaryOp, CompareOp, Conv, LogicOp, Lrn, Named, Op, Optimizer, PadMode, Pool,
    ReduceOp, Schedule, UnaryOp,
};
pub use rng::Rng;
pub use tensor::{Tensor, TensorData};
pub use verify::verify;
