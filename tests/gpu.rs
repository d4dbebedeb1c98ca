//! GPU tests: the CUDA executor against the CPU reference. Where no NVIDIA
//! GPU can be used (no driver, no device) this prints one SKIP line with the
//! reason and exits successfully; it never passes silently. A plain `main`
//! (harness = false) so that line is never captured (cargo-nextest shows
//! it too: `.config/nextest.toml`).

mod common;

use smelt_codegen::nvrtc::Compiler;
use smelt_codegen::program::compile_all;
use smelt_codegen::Program;
use smelt_ir::{Graph, KernelGraph};
use smelt_runtime::cuda::CudaExecutor;
use std::collections::HashMap;

/// Fuses `plain` under `policy` and plans it as the CLI does (the unfused
/// schedule as a hint), so the kernels are those `smelt compile` caches.
fn compiled(plain: &Graph, policy: &str) -> (KernelGraph, smelt_passes::memory::Plan) {
    let opts = smelt::Options {
        precision: smelt_passes::precision::Options { policy: policy.parse().unwrap(), keep_f32: vec![], ..Default::default() },
        ..Default::default()
    };
    let mut s = common::session(plain, opts);
    let c = s.compile().unwrap();
    let planned = s.plan(&c).unwrap();
    (c.graph, planned.plan)
}

fn executor(g: &KernelGraph, plan: &smelt_passes::memory::Plan, limit: Option<usize>) -> Result<CudaExecutor, smelt_runtime::RuntimeError> {
    let program = Program::build(g, plan, &Default::default()).unwrap();
    let sources = program.sources();
    let compiled = compile_all(&Compiler::default(), &sources, 4, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    let ptx: HashMap<String, String> = sources.iter().map(|(n, _)| n.clone()).zip(compiled.into_iter().map(|c| c.ptx)).collect();
    let blob = program.weights_blob(g).unwrap();
    smelt_runtime::cuda::executor(program, ptx, &blob, limit, true)
}

/// Rows of `t` (over its last non-unit axis) whose two largest values are
/// within `tol` of the largest magnitude: an arg-max there is a coin flip.
fn near_ties(t: &smelt_ir::Tensor, tol: f64) -> usize {
    let v = t.to_f32_vec();
    let len = t.shape().iter().rev().find(|&&d| d > 1).copied().unwrap_or(1);
    let range = v.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
    let rows = v.len() / len.max(1);
    (0..rows)
        .filter(|&r| {
            // The axis is followed by unit dimensions only: rows are contiguous.
            let mut row: Vec<f64> = v[r * len..(r + 1) * len].iter().map(|&x| x as f64).collect();
            row.sort_by(|a, b| b.total_cmp(a));
            row.len() > 1 && row[0] - row[1] <= tol * range
        })
        .count()
}

fn main() {
    // cargo-nextest lists a binary's tests (`--list --format terse`, and
    // again with `--ignored`), then runs each (`--exact NAME`): this binary
    // is one test, `gpu`.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("gpu: test");
        }
        return;
    }
    // No driver library: nothing to test here. A driver that is present
    // but cannot run anything is a failure, not a skip.
    if !smelt_codegen::cuda_driver_available() {
        println!("gpu: SKIP all GPU tests: no CUDA driver (libcuda.so.1 not found)");
        return;
    }
    if let Some(why) = smelt_runtime::cuda::unavailable() {
        eprintln!("gpu: FAIL a CUDA driver is present but no GPU can be used: {why}");
        std::process::exit(1);
    }
    let mut failures = 0;
    let mut check = |what: String, plain: &Graph, policy: &str, inputs: &[smelt_ir::Tensor], tol: f64| {
        let (g, plan) = compiled(plain, policy);
        let want = smelt_runtime::cpu::run(&g, inputs).unwrap();
        let mut exec = executor(&g, &plan, None).unwrap_or_else(|e| panic!("{what}: {e}"));
        for round in 0..2 {
            let (got, ms, _) = exec.run(inputs, round == 1).unwrap_or_else(|e| panic!("{what}: {e}"));
            let e = smelt::precision_error(&got[0], &want[0]);
            // NVRTC contracts multiply-adds and the CPU does not: a row whose
            // two best classes are within the tolerance may swap them.
            let ties = near_ties(&want[0], tol);
            let ok = e.max_abs_over_range <= tol && e.argmax_agree + ties >= e.rows;
            println!(
                "gpu: {} {what}: {ms:.3} ms, max abs err {:.2e} ({:.1e} of range), arg-max {}/{}",
                if ok { "ok  " } else { "FAIL" },
                e.max_abs,
                e.max_abs_over_range,
                e.argmax_agree,
                e.rows
            );
            failures += !ok as usize;
        }
    };
    // Random graphs need NVRTC (their kernels are not in a carried cache).
    if smelt_codegen::nvrtc_available() {
        for seed in 0..20 {
            let g = common::random_graph(seed);
            let x = common::random_inputs(&g, seed);
            check(format!("random graph {seed}"), &g, "f32", &x, 1e-4);
        }
    } else {
        println!("gpu: note: no NVRTC here, so the random graphs are skipped (only cached kernels can run)");
    }
    let have_data = std::env::var_os("SMELT_TESTDATA").is_some()
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".testdata/variants/.done").is_file();
    let names: &[&str] = if have_data { &common::LIGHT } else { &[] };
    for name in names {
        let v = common::variant(name);
        for policy in ["f32", "mixed-f16"] {
            let g = common::load(v.join("model.onnx").to_str().unwrap(), None);
            let x = smelt_ir::onnx::read_tensor_file(&v.join("input_0.pb")).unwrap().1;
            check(format!("{name} {policy}"), &g, policy, &[x], if policy == "f32" { 1e-3 } else { 0.1 });
        }
    }
    // The memory limit refuses before allocating.
    let (g, plan) = compiled(&common::load("zoo:resnet50", None), "f32");
    let program = Program::build(&g, &plan, &Default::default()).unwrap();
    let blob = program.weights_blob(&g).unwrap();
    match smelt_runtime::cuda::executor(program, HashMap::new(), &blob, Some(1 << 20), false) {
        Err(smelt_runtime::RuntimeError::MemoryLimit { .. }) => println!("gpu: ok   the memory limit refuses a 5 MiB arena under 1 MiB"),
        other => {
            println!("gpu: FAIL the memory limit: {:?}", other.err());
            failures += 1;
        }
    }
    if failures > 0 {
        eprintln!("gpu: {failures} failures");
        std::process::exit(1);
    }
}
