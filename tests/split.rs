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

/// The best peer's arena (ONNX Runtime or XLA, fp32) in bytes at batch 1
/// and 8, as issue 17 measured them.
fn peer(name: &str) -> (usize, usize) {
    let mib = |x: f64| (x * (1 << 20) as f64) as usize;
    let (a, b) = match name {
        "resnet50" => (6.9, 55.1),
        "densenet121" => (7.0, 55.3),
        "inception_v1" => (4.4, 35.5),
        "inception_v2" => (3.8, 30.6),
        "shufflenet" => (2.9, 22.9),
        "squeezenet" => (3.7, 30.0),
        "vgg19" => (24.5, 196.0),
        "bvlc_alexnet" => (2.1, 17.1),
        "zfnet512" => (8.7, 69.6),
        _ => unreachable!("a light model"),
    };
    (mib(a), mib(b))
}

/// Runs `name` at `batch` whole and split for each of `goals`: the split
/// outputs equal the whole ones; returns the whole arena and each split one.
fn check(name: &str, batch: usize, goals: &[Goal]) -> (usize, Vec<usize>) {
    let spec = common::variant(name).join("model.onnx").display().to_string();
    let g = common::load(&spec, Some(batch));
    let inputs = common::random_inputs(&g, 7);
    let (want, whole, _, _) = run(&spec, batch, None, &inputs);
    let mut arenas = Vec::new();
    for &goal in goals {
        let (got, arena, splits, extra) = run(&spec, batch, Some(goal), &inputs);
        for (a, b) in common::paired(&got, &want) {
            let c = smelt::compare(a, b, 1e-4, 1e-5);
            assert!(c.ok, "{name} batch {batch} {goal:?}: split outputs differ from unsplit: {c:?}");
        }
        assert!(extra <= smelt::passes::split::MAX_EXTRA_FLOPS + 1e-9, "{name}: {extra} extra FLOPs");
        eprintln!("{name} batch {batch} {goal:?}: arena {whole} -> {arena} in {splits} splits, extra FLOPs {:.1}%", extra * 100.0);
        arenas.push(arena);
    }
    (whole, arenas)
}

/// On every light model: `--min-memory` by rows at batch 1 and by rows and
/// samples at batch 2, and `--memory-limit` at 0.7x the best peer at batch
/// 1, run on the CPU, give the whole model's outputs (rtol 1e-4); each
/// lowers the arena, and the limit is met.
#[test]
fn split_light_models_compute_what_the_whole_ones_do() {
    for name in common::LIGHT {
        let limit = peer(name).0 * 7 / 10;
        let (whole, a) = check(name, 1, &[Goal::Minimum, Goal::Limit(limit)]);
        assert!(a[0] < whole, "{name}: --min-memory did not lower the arena ({whole})");
        assert!(a[1] <= limit, "{name}: {} over the limit {limit}", a[1]);
        let (whole, a) = check(name, 2, &[Goal::Minimum]);
        assert!(a[0] < whole, "{name} batch 2: --min-memory did not lower the arena ({whole})");
    }
}

/// At batch 8 (planned, not run): the limit at 0.7x the best peer is met,
/// and `--min-memory` stays within its FLOP budget.
#[test]
fn batch_8_plans_meet_the_limit() {
    for name in common::LIGHT {
        let spec = common::variant(name).join("model.onnx").display().to_string();
        let limit = peer(name).1 * 7 / 10;
        for goal in [Goal::Limit(limit), Goal::Minimum] {
            let mut s = Session::open(&spec, Options { batch: Some(8), split: Some(goal), ..Default::default() }).unwrap();
            let c = s.compile().unwrap();
            let arena = s.plan(&c).unwrap().plan.arena;
            assert!(arena <= limit, "{name} batch 8 {goal:?}: {arena} over {limit}");
        }
    }
}

#[test]
fn a_memory_limit_splits_as_little_as_it_needs() {
    // Between the whole-op arena and the smallest split one: it fits, with
    // fewer extra FLOPs than the minimum.
    let name = "squeezenet";
    let spec = common::variant(name).join("model.onnx").display().to_string();
    let report = |goal| {
        let mut s = Session::open(&spec, Options { split: Some(goal), ..Default::default() }).unwrap();
        let c = s.compile().unwrap();
        (s.plan(&c).unwrap().plan.arena, c.split.map_or(0, |r| r.extra_flops))
    };
    let (whole, none) = report(Goal::Limit(usize::MAX));
    assert_eq!(none, 0);
    let (smallest, most) = report(Goal::Minimum);
    let limit = (whole + smallest) / 2;
    let (arena, extra) = report(Goal::Limit(limit));
    assert!(arena <= limit && extra < most, "limit {limit}: arena {arena}, {extra} FLOPs against the minimum's {most}");
}

/// The split programs' CUDA C on the emulator (band convolutions with
/// their own pads, slices and concatenations of rows, in-place
/// concatenations of samples, residual convolutions reading their slice of
/// the residual), every kernel checked against its description, the
/// outputs against the reference executor of the unsplit graph; and every
/// kernel through NVRTC.
#[test]
fn split_programs_run_on_the_emulator_and_compile() {
    let nvrtc = common::nvrtc_compiler("split");
    use smelt::passes::split::How;
    let light = |name: &str| common::variant(name).join("model.onnx").display().to_string();
    for (name, spec, batch, want) in [
        ("shufflenet", light("shufflenet"), 1, &[How::Rows][..]),
        ("squeezenet", light("squeezenet"), 2, &[How::Rows, How::Batch][..]),
        ("resnet8", "zoo:resnet8".to_string(), 2, &[How::Batch][..]),
    ] {
        let g = common::load(&spec, Some(batch));
        let x = common::random_inputs(&g, 11);
        let open = |split| {
            let mut s = Session::open(&spec, Options { batch: Some(batch), split, ..Default::default() }).unwrap();
            s.fill_weights().unwrap();
            s
        };
        let mut s = open(Some(Goal::Minimum));
        let c = s.compile().unwrap();
        let report = c.split.as_ref().expect("split");
        let hows: std::collections::BTreeSet<_> = report.splits.iter().map(|s| s.how).collect();
        assert!(want.iter().all(|h| hows.contains(h)), "{name}: split {hows:?}, not {want:?}");
        let planned = s.plan(&c).unwrap();
        let program = s.program(&c, &planned).unwrap();
        if let Some(nv) = &nvrtc {
            smelt_codegen::program::compile_all(nv, &program.sources(), 2, &|_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let blob = program.weights_blob(&c.graph).unwrap();
        let mut exec = smelt_runtime::emu::executor(program, &blob, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        exec.check_against_reference(c.graph.clone()).unwrap();
        let (outputs, checks) = exec.run_checked(&x, 1e-5).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bad: Vec<String> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{} (node {}) against its {:?}: {:.3e} of range", c.kernel, c.node, c.against, c.of_range))
            .collect();
        assert!(bad.is_empty(), "{name}: kernels disagree with their descriptions or the reference:\n{}", bad.join("\n"));
        let unsplit = open(None).compile().unwrap();
        let want = smelt_runtime::cpu::run(&unsplit.graph, &x).unwrap();
        let r = smelt::compare(&outputs[0], &want[0], 1e-4, 1e-5);
        assert!(r.ok, "{name}: the split program on the emulator differs from the reference: {r:?}");
        eprintln!("{name} batch {batch}: {} kernels checked on the emulator", checks.len());
    }
}

/// The independent checker places a slice view on its bytes of its source:
/// moved by one element, the plan is refused.
#[test]
fn the_checker_refuses_a_misplaced_slice_view() {
    let spec = common::variant("squeezenet").join("model.onnx").display().to_string();
    let mut s = Session::open(&spec, Options { batch: Some(2), split: Some(Goal::Minimum), ..Default::default() }).unwrap();
    let c = s.compile().unwrap();
    let mut plan = s.plan(&c).unwrap().plan;
    smelt::passes::memory::check::check(&c.graph, &plan).unwrap();
    let view =
        c.graph.node_ids().find(|&n| matches!(c.graph.node(n).op, smelt_ir::KernelOp::SliceView { .. })).expect("a slice of the batch");
    let v = smelt_ir::ValueId { node: view, slot: 0 };
    for iv in &mut plan.placements.get_mut(&v).unwrap().intervals {
        *iv = (iv.0 + 4, iv.1 + 4);
    }
    let e = smelt::passes::memory::check::check(&c.graph, &plan).unwrap_err();
    assert!(e.contains("not placed on its source"), "{e}");
}

/// `smelt plan` explains a split plan in words, JSON and the SVG; a limit
/// nothing fits fails with exit 2; a training step is not split.
#[test]
fn plan_explains_a_split() {
    let out = common::smelt().args(["plan", "zoo:resnet50", "--min-memory", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let split = &j["split"];
    let (before, after) = (split["arena_before"].as_u64().unwrap(), j["plan"]["arena_bytes"].as_u64().unwrap());
    assert!(after < before && split["arena_after"].as_u64() == Some(after), "{split}");
    assert!(split["splits"].as_array().unwrap().iter().any(|s| s["how"] == "rows" && s["extra_flops"].as_u64() > Some(0)), "{split}");
    assert!(split["extra_flops"].as_f64().unwrap() <= 0.15 * split["flops_before"].as_f64().unwrap());

    let svg = std::env::temp_dir().join(format!("smelt-split-{}.svg", std::process::id()));
    let out = common::smelt().args(["plan", "zoo:resnet50", "--memory-limit", "4.8MiB", "--svg"]).arg(&svg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("split execution (--memory-limit 4.8 MiB)") && text.contains("bands of rows"), "{text}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("row bands") && picture.contains("not split"), "the SVG marks the split segments");
    std::fs::remove_file(&svg).ok();

    let out = common::smelt().args(["plan", "zoo:resnet50", "--memory-limit", "1KiB"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = common::smelt().args(["plan", "zoo:resnet8", "--min-memory", "--train", "sgd"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--remat-budget"));
}

/// The torchvision-style zoo models (random weights): both modes, run on
/// the CPU, give the whole model's outputs.
#[test]
fn zoo_models_split_and_match() {
    for (spec, limit) in [("zoo:resnet50", 4_800_000), ("zoo:mobilenet_v2", 4_000_000)] {
        let open = |goal: Option<Goal>| {
            let mut s = Session::open(spec, Options { split: goal, ..Default::default() }).unwrap();
            s.fill_weights().unwrap();
            s
        };
        let g = common::load(spec, None);
        let x = common::random_inputs(&g, 3);
        let mut outs = Vec::new();
        for goal in [None, Some(Goal::Minimum), Some(Goal::Limit(limit))] {
            let mut s = open(goal);
            let c = s.compile().unwrap();
            let planned = s.plan(&c).unwrap();
            assert!(goal.is_none() || c.split.is_some(), "{spec} {goal:?}: nothing split");
            if let Some(Goal::Limit(l)) = goal {
                assert!(planned.plan.arena <= l, "{spec}: {} over {l}", planned.plan.arena);
            }
            let program = s.program(&c, &planned).unwrap();
            outs.push(program.run_cpu(&program.weights_blob(&c.graph).unwrap(), &x).unwrap());
        }
        for o in &outs[1..] {
            let c = smelt::compare(&o[0], &outs[0][0], 1e-4, 1e-5);
            assert!(c.ok, "{spec}: {c:?}");
        }
    }
}

/// Residual blocks split by samples: ResNet-50 at batch 2 under
/// `--min-memory` cuts a run of blocks whose fused convolutions add their
/// residual (their weights read whole by each sample, the residual split
/// with them), and gives the whole model's outputs on the CPU.
#[test]
fn residual_blocks_split_by_samples() {
    use smelt::ir::KernelOp;
    let spec = "zoo:resnet50";
    let g = common::load(spec, Some(2));
    let x = common::random_inputs(&g, 5);
    let mut outs = Vec::new();
    let mut residual = Vec::new();
    for goal in [None, Some(Goal::Minimum)] {
        let mut s = Session::open(spec, Options { batch: Some(2), split: goal, ..Default::default() }).unwrap();
        s.fill_weights().unwrap();
        let c = s.compile().unwrap();
        let planned = s.plan(&c).unwrap();
        if let Some(r) = &c.split {
            // Parts of a sample split are named NODE.sK.
            residual = c
                .graph
                .node_ids()
                .filter(|&n| matches!(c.graph.node(n).op, KernelOp::FusedConv { residual: true, .. }))
                .filter(|&n| c.graph.node(n).name.contains(".s"))
                .map(|n| c.graph.node(n).name.clone())
                .collect();
            assert!(r.splits.iter().any(|s| s.how == smelt::passes::split::How::Batch), "no split by samples: {:?}", r.splits);
        }
        let program = s.program(&c, &planned).unwrap();
        outs.push(program.run_cpu(&program.weights_blob(&c.graph).unwrap(), &x).unwrap());
    }
    assert!(!residual.is_empty(), "no residual convolution was split by samples");
    let c = smelt::compare(&outs[1][0], &outs[0][0], 1e-4, 1e-5);
    assert!(c.ok, "{spec} batch 2 split by samples: {c:?}");
}

/// A transformer's feed-forward blocks split by tokens (the rows of the
/// flattened batch): BERT-base at sequence 64, run on the CPU, gives the
/// whole model's outputs.
#[test]
fn transformer_feed_forward_blocks_split_by_tokens() {
    let spec = "zoo:bert_base";
    let mut outs = Vec::new();
    for goal in [None, Some(Goal::Minimum)] {
        let options = Options { dims: vec![("sequence".into(), 64)], split: goal, ..Default::default() };
        let mut s = Session::open(spec, options).unwrap();
        s.fill_weights().unwrap();
        let c = s.compile().unwrap();
        let planned = s.plan(&c).unwrap();
        if goal.is_some() {
            let r = c.split.as_ref().expect("split");
            assert!(r.splits.iter().all(|s| s.how == smelt::passes::split::How::Batch) && r.arena_after < r.arena_before, "{r:?}");
        }
        let program = s.program(&c, &planned).unwrap();
        let x: Vec<Tensor> = (0..c.graph.inputs().len()).map(|i| smelt::dummy_input(&c.graph, i)).collect();
        outs.push(program.run_cpu(&program.weights_blob(&c.graph).unwrap(), &x).unwrap());
    }
    for (a, b) in common::paired(&outs[1], &outs[0]) {
        let c = smelt::compare(a, b, 1e-4, 1e-5);
        assert!(c.ok, "{c:?}");
    }
}
