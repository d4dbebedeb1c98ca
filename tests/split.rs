//! Split execution (`--min-memory`, `--memory-limit` below the whole-op
//! bound): on the nine light models' random-weight variants, the split
//! program (one arena, every kernel at its planned offsets, as a device
//! runs it) gives the unsplit program's outputs, its plan passes the
//! independent checker, and its arena is below the unsplit one.

mod common;

use smelt::passes::split::Goal;
use smelt::{Options, Session};
use smelt_ir::Tensor;

/// Compiles, plans (the driver checks the plan) and runs `spec` at `batch`
/// on the CPU, split for `goal` or not: the outputs, the arena and the
/// number of splits.
fn run(spec: &str, batch: usize, goal: Option<Goal>, inputs: &[Tensor]) -> (Vec<Tensor>, usize, usize, f64) {
    let mut s = Session::open(spec, Options { batch: Some(batch), split: goal, ..Default::default() }).unwrap();
    let c = s.compile().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let planned = s.plan(&c).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let program = s.program(&c, &planned).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let out = program.run_cpu(&program.weights_blob(&c.graph).unwrap(), inputs).unwrap();
    let extra = c.split.as_ref().map_or(0.0, |r| r.extra_flops as f64 / r.flops_before as f64);
    (out, planned.plan.arena, c.split.as_ref().map_or(0, |r| r.splits.len()), extra)
}

fn check(name: &str, batch: usize, goal: Goal) -> (usize, usize) {
    let spec = common::variant(name).join("model.onnx").display().to_string();
    let g = common::load(&spec, Some(batch));
    let inputs = common::random_inputs(&g, 7);
    let (want, whole, _, _) = run(&spec, batch, None, &inputs);
    let (got, arena, splits, extra) = run(&spec, batch, Some(goal), &inputs);
    for (a, b) in got.iter().zip(&want) {
        let c = smelt::compare(a, b, 1e-4, 1e-5);
        assert!(c.ok, "{name} batch {batch} {goal:?}: split outputs differ from unsplit: {c:?}");
    }
    assert!(extra <= smelt::passes::split::MAX_EXTRA_FLOPS + 1e-9, "{name}: {extra} extra FLOPs");
    eprintln!("{name} batch {batch} {goal:?}: arena {whole} -> {arena} in {splits} splits, extra FLOPs {:.1}%", extra * 100.0);
    (whole, arena)
}

#[test]
fn split_light_models_compute_what_the_whole_ones_do() {
    for name in common::LIGHT {
        // Rows at batch 1, rows and samples at batch 2.
        for batch in [1, 2] {
            let (whole, arena) = check(name, batch, Goal::Minimum);
            assert!(arena < whole, "{name} batch {batch}: --min-memory did not lower the arena ({whole})");
        }
    }
}

#[test]
fn a_memory_limit_splits_as_little_as_it_needs() {
    // Between the whole-op arena and the smallest split one: it fits, with
    // fewer extra FLOPs than the minimum.
    let name = "squeezenet";
    let (whole, _) = check(name, 1, Goal::Limit(usize::MAX));
    let limit = whole * 3 / 4;
    let (_, arena) = check(name, 1, Goal::Limit(limit));
    assert!(arena <= limit, "{arena} > {limit}");
}

/// The split programs' CUDA C on the emulator (band convolutions with
/// their own pads, slices and concatenations of rows, in-place
/// concatenations of samples), every kernel checked against its
/// description, the outputs against the reference executor of the unsplit
/// graph; and every kernel through NVRTC.
#[test]
fn split_programs_run_on_the_emulator_and_compile() {
    let nvrtc = common::nvrtc_compiler("split");
    for (name, batch) in [("shufflenet", 1), ("squeezenet", 2)] {
        let spec = common::variant(name).join("model.onnx").display().to_string();
        let g = common::load(&spec, Some(batch));
        let x = common::random_inputs(&g, 11);
        let mut s = Session::open(&spec, Options { batch: Some(batch), split: Some(Goal::Minimum), ..Default::default() }).unwrap();
        let c = s.compile().unwrap();
        let report = c.split.as_ref().expect("split");
        let hows: std::collections::BTreeSet<_> = report.splits.iter().map(|s| s.how).collect();
        assert!(hows.contains(&smelt::passes::split::How::Rows), "{name}: no split by rows");
        assert!(batch == 1 || hows.contains(&smelt::passes::split::How::Batch), "{name}: no split by samples");
        let planned = s.plan(&c).unwrap();
        let program = s.program(&c, &planned).unwrap();
        if let Some(nv) = &nvrtc {
            smelt_codegen::program::compile_all(nv, &program.sources(), 2, &|_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let blob = program.weights_blob(&c.graph).unwrap();
        let mut exec = smelt_runtime::emu::executor(program, &blob, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        let (outputs, checks) = exec.run_checked(&x, 1e-5).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bad: Vec<String> =
            checks.iter().filter(|c| !c.ok).map(|c| format!("{} (node {}): {:.3e} of range", c.kernel, c.node, c.of_range)).collect();
        assert!(bad.is_empty(), "{name}: kernels disagree with their descriptions:\n{}", bad.join("\n"));
        let unsplit = Session::open(&spec, Options { batch: Some(batch), ..Default::default() }).unwrap().compile().unwrap();
        let want = smelt_runtime::cpu::run(&unsplit.graph, &x).unwrap();
        let r = smelt::compare(&outputs[0], &want[0], 1e-4, 1e-5);
        assert!(r.ok, "{name}: the split program on the emulator differs from the reference: {r:?}");
        eprintln!("{name} batch {batch}: {} kernels checked on the emulator", checks.len());
    }
}
