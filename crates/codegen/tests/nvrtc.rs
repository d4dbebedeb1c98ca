//! NVRTC compiles CUDA C here without a GPU. Where libnvrtc is missing these
//! tests skip with a one-line reason, unless SMELT_REQUIRE_NVRTC is set (the
//! test script sets it: CI installs NVRTC from PyPI and must compile).

use smelt_codegen::nvrtc::Compiler;
use smelt_codegen::{Cache, CodegenError};

const RELU: &str = r#"#include <cuda_fp16.h>
extern "C" __global__ void relu_f16(const __half* __restrict__ x, __half* __restrict__ y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __half2float(x[i]);
        y[i] = __float2half(v > 0.0f ? v : 0.0f);
    }
}
"#;

fn compiler(tag: &str) -> Option<Compiler> {
    if !smelt_codegen::nvrtc_available() {
        assert!(
            std::env::var_os("SMELT_REQUIRE_NVRTC").is_none(),
            "SMELT_REQUIRE_NVRTC is set but libnvrtc.so.12 cannot be loaded (LD_LIBRARY_PATH?)"
        );
        eprintln!("SKIP: libnvrtc not found; install nvidia-cuda-nvrtc-cu12 and put its lib folder on LD_LIBRARY_PATH");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("smelt-nvrtc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Some(Compiler { cache: Some(Cache::new(dir)), ..Compiler::default() })
}

#[test]
fn compiles_an_f16_kernel_and_caches_it() {
    let Some(c) = compiler("cache") else { return };
    let first = c.compile("relu_f16", RELU).unwrap_or_else(|e| panic!("{e}"));
    assert!(!first.cached);
    assert!(first.ptx.contains(".entry relu_f16") && first.ptx.contains(".target sm_80"), "{}", &first.ptx[..first.ptx.len().min(400)]);
    let second = c.compile("relu_f16", RELU).unwrap();
    assert!(second.cached);
    assert_eq!(first.ptx, second.ptx);
}

#[test]
fn a_compile_error_carries_the_log_and_the_line() {
    let Some(c) = compiler("error") else { return };
    let bad = "extern \"C\" __global__ void k(float* y) {\n    y[0] = undefined_name;\n}\n";
    match c.compile("k", bad) {
        Err(CodegenError::Compile { log, line, .. }) => {
            assert!(log.contains("undefined_name"), "{log}");
            assert_eq!(line, Some((2, "y[0] = undefined_name;".to_string())));
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
