//! The ONNX protobuf messages (`ModelProto`, `TensorProto`, ...), generated at
//! build time from the vendored `proto/onnx.proto` (Apache-2.0, from the onnx
//! project). Kept in its own crate so that it builds once.
#![allow(missing_docs, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/onnx.rs"));

pub use prost::Message;
