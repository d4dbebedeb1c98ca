//! Shared helpers of the integration tests: where the test data lives.
#![allow(dead_code)]

use std::path::PathBuf;

/// The nine light models of the onnx wheel.
pub const LIGHT: [&str; 9] =
    ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"];

/// `.testdata/` (or `$SMELT_TESTDATA`), made by `scripts/fetch-testdata.sh`.
/// Panics with the fix when it is missing: these tests never pass silently.
pub fn testdata() -> PathBuf {
    let dir = std::env::var_os("SMELT_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".testdata"));
    assert!(
        dir.join("onnx-data/light").is_dir() && dir.join("variants/.done").is_file(),
        "test data missing under {}: run scripts/fetch-testdata.sh (or scripts/test.sh)",
        dir.display()
    );
    dir
}

/// The onnx wheel's `backend/test/data`.
pub fn onnx_data() -> PathBuf {
    testdata().join("onnx-data")
}

/// `light/light_<name>.onnx`.
pub fn light_model(name: &str) -> PathBuf {
    onnx_data().join(format!("light/light_{name}.onnx"))
}

/// The random-weight variant folder of a light model.
pub fn variant(name: &str) -> PathBuf {
    testdata().join("variants").join(name)
}

/// The `smelt` binary built for this test run.
pub fn smelt() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_smelt"))
}
