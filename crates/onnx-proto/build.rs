//! Compiles the vendored `proto/onnx.proto` with protox (pure Rust), so the
//! build needs no system `protoc`.
fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["onnx.proto"], ["proto"]).expect("vendored onnx.proto compiles");
    prost_build::Config::new().compile_fds(fds).expect("prost generates the ONNX messages");
}
