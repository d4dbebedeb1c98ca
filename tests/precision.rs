//! Mixed precision: the arena halves, weights are converted once, casts
//! fold into neighbouring kernels, the numbers stay close to f32, and the
//! f16 kernels check against the reference executor and compile.

mod common;

use smelt_codegen::nvrtc::Compiler;
use smelt_codegen::Program;
use smelt_ir::builder::Builder;
use smelt_ir::onnx::read_tensor_file;
use smelt_ir::{text, Graph, KernelGraph, KernelOp, Op, OpSet, Tensor};
use smelt_passes::pipeline::Stats;
use smelt_passes::precision::{self, Policy};

fn compile(g: &Graph, policy: Policy, keep_f32: &[&str]) -> (KernelGraph, Stats) {
    let opts = smelt::Options {
        precision: precision::Options { policy, keep_f32: keep_f32.iter().map(|s| s.to_string()).collect(), ..Default::default() },
        ..Default::default()
    };
    let c = common::session(g, opts).compile().unwrap();
    (c.graph, c.stats)
}

fn nvrtc() -> Option<Compiler> {
    common::nvrtc_compiler("precision")
}

/// Every distinct kernel of `program`, compiled with NVRTC (when there) and
/// joined into one text for an insta snapshot.
fn compiled_kernels(program: &Program) -> String {
    let nv = nvrtc();
    let mut all = String::new();
    for (name, src) in program.sources() {
        if let Some(nv) = &nv {
            nv.compile(&name, &src).unwrap_or_else(|e| panic!("{e}"));
        }
        all += &format!("// ==== {name} ====\n{src}\n");
    }
    all
}

#[test]
fn mixed_precision_on_the_light_models() {
    let nv = nvrtc();
    let mut sources = Vec::new();
    let mut tensor_core = std::collections::HashSet::new();
    for name in common::LIGHT {
        let v = common::variant(name);
        let plain = common::load(v.join("model.onnx").to_str().unwrap(), None);
        let image = read_tensor_file(&v.join("input_0.pb")).unwrap().1;
        let (f32g, _) = compile(&plain, Policy::F32, &[]);
        let f32_plan = smelt_passes::memory::plan(&f32g).unwrap();
        let want = smelt_runtime::cpu::run(&f32g, std::slice::from_ref(&image)).unwrap();
        for (policy, tol) in [(Policy::MixedF16, 0.1), (Policy::MixedBf16, 0.3)] {
            let (g, stats) = compile(&plain, policy, &[]);
            let half = policy.half().unwrap();
            let p = stats.precision.as_ref().unwrap();
            // The classifier and the softmax stay f32, the rest is half.
            assert!(p.kept_f32.iter().any(|k| k.reason == "classifier"), "{name}: {:?}", p.kept_f32);
            assert!(p.half_nodes > 5 && p.weights_converted > 5, "{name}: {p:?}");
            let plan = smelt_passes::memory::plan(&g).unwrap();
            smelt_passes::memory::check::check(&g, &plan).unwrap();
            let ratio = plan.arena as f64 / f32_plan.arena as f64;
            assert!(ratio <= 0.51, "{name} {policy}: arena {} vs f32 {} ({ratio:.3})", plan.arena, f32_plan.arena);
            // Weights: all but the classifier's (f32) halve.
            assert!(g.weight_bytes() * 4 <= f32g.weight_bytes() * 3, "{name} {policy}: weights not converted");
            // Casts fold into neighbours or into the f32 classifier's loads:
            // only the input image's narrowing remains a kernel (on purpose).
            let casts: Vec<_> = g.node_ids().filter(|&n| matches!(g.node(n).op, KernelOp::Op(Op::Cast { .. }))).collect();
            assert!(casts.len() <= 1, "{name} {policy}: {} cast kernels\n{}", casts.len(), text::print(&g));
            assert!(casts.iter().all(|&c| g.node(g.inputs_of(c)[0].node).op.is_input()), "{name}: a cast kernel not on the input");
            assert!(g.node_ids().any(|n| g.node(n).outputs[0].dtype == half));
            // Interface unchanged; numbers close to f32; same arg-max.
            let got = smelt_runtime::cpu::run(&g, std::slice::from_ref(&image)).unwrap();
            assert_eq!(got[0].ty(), want[0].ty());
            let e = smelt::precision_error(&got[0], &want[0]);
            assert!(e.max_abs_over_range <= tol, "{name} {policy}: {e:?}");
            if policy == Policy::MixedF16 {
                assert_eq!(e.argmax_agree, e.rows, "{name}: {e:?}");
                // Each half kernel's description matches the reference
                // executor on that node's operands (to an f16 rounding: the
                // f32 sums run in another order).
                check_kernels(name, &g, &image);
                // The program of half kernels, run in one arena from the
                // kernel descriptions, ends near the reference: these
                // random-weight nets amplify a one-ulp difference, as they
                // amplify the f16 rounding itself (the tolerance above).
                let program = Program::build(&g, &plan, &Default::default()).unwrap();
                let out = program.run_cpu(&program.weights_blob(&g).unwrap(), std::slice::from_ref(&image)).unwrap();
                let c = smelt::precision_error(&out[0], &got[0]);
                assert!(c.max_abs_over_range <= tol && c.argmax_agree == c.rows, "{name}: program vs reference {c:?}");
            }
            // Every half convolution wide enough for a GEMM tile and every
            // half GEMM runs on tensor cores (the f32 classifier and
            // depthwise convolutions do not).
            let program = Program::build(&g, &plan, &Default::default()).unwrap();
            for k in program.steps.iter().map(|s| &s.kernel) {
                let (product, on_tc) = match k {
                    smelt_codegen::Kernel::Conv(c) => (c.dtype == half && c.algo != smelt_codegen::conv::Algo::Direct, c.tensor_cores()),
                    smelt_codegen::Kernel::Gemm(m) => (m.dtype == half, m.tensor_cores),
                    _ => (false, false),
                };
                assert_eq!(product, on_tc, "{name} {policy}: {} on tensor cores: {on_tc}", k.name());
                if on_tc {
                    tensor_core.insert(k.name().to_string());
                }
            }
            sources.extend(program.sources());
        }
    }
    assert!(tensor_core.len() > 100, "{} tensor-core kernels", tensor_core.len());
    if let Some(nv) = nv {
        sources.sort();
        sources.dedup();
        let done = smelt_codegen::program::compile_all(&nv, &sources, 2, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "{} distinct mixed-f16 and mixed-bf16 kernels of the nine light models compiled with NVRTC, {} on tensor cores",
            done.len(),
            tensor_core.len()
        );
        // Their PTX multiplies on tensor cores.
        for ((name, _), c) in sources.iter().zip(&done) {
            assert_eq!(c.ptx.contains("wmma.mma.sync"), tensor_core.contains(name), "{name}: wmma.mma.sync in its PTX");
        }
        common::ptxas_has_no_spills(&done);
    }
}

/// Every kernel of `g` run from its description on the operands the
/// reference executor computed, against the reference's output.
fn check_kernels(name: &str, g: &KernelGraph, image: &Tensor) {
    use smelt_ir::ValueId;
    let ids: Vec<_> = g.node_ids().filter(|&id| smelt_codegen::tiling::kernel_of(g, id, &Default::default()).is_some()).collect();
    let wanted: std::collections::HashSet<ValueId> =
        ids.iter().flat_map(|id| g.inputs_of(*id).into_iter().chain([ValueId { node: *id, slot: 0 }])).collect();
    let (_, kept) = smelt_runtime::cpu::run_keeping(g, std::slice::from_ref(image), &|v| wanted.contains(&v), &mut |_, _| {}).unwrap();
    for id in ids {
        let k = smelt_codegen::tiling::kernel_of(g, id, &Default::default()).unwrap();
        let ins: Vec<std::sync::Arc<Tensor>> =
            g.inputs_of(id).iter().map(|v| g.weight(v.node).cloned().unwrap_or_else(|| kept[v].clone())).collect();
        let got = k.run_cpu(&ins.iter().map(|t| t.as_ref()).collect::<Vec<_>>());
        let c = smelt::compare(&got, &kept[&ValueId { node: id, slot: 0 }], 3e-3, 2e-4);
        assert!(c.ok, "{name}: kernel {} differs from the reference: {c:?}", k.name());
    }
}

/// A small residual network under each policy.
fn block() -> Graph {
    let mut b = Builder::new(3);
    let x = b.input("x", &[1, 8, 6, 6]).unwrap();
    let y = b.conv(x, 8, 3, 1, 1).and_then(|y| b.batch_norm(y, 1.0)).and_then(|y| b.relu(y)).unwrap();
    let y = b.conv(y, 8, 1, 1, 0).and_then(|y| b.batch_norm(y, 1.0)).unwrap();
    let y = b.add(y, x).and_then(|y| b.relu(y)).unwrap();
    let y = b.pool_flatten(y).and_then(|y| b.linear(y, 5)).and_then(|y| b.softmax(y)).unwrap();
    b.finish("y", y).unwrap()
}

/// The IR after the passes and the CUDA C of every kernel of a residual
/// block at mixed-f16, as insta snapshots: a change to the policy, the cast
/// fusion or an f16 template shows as a diff.
#[test]
fn mixed_f16_block_snapshots() {
    let g = block();
    let (m, _) = compile(&g, Policy::MixedF16, &[]);
    insta::assert_snapshot!("mixed_f16_block_ir", text::print(&m));
    let plan = smelt_passes::memory::plan(&m).unwrap();
    let program = Program::build(&m, &plan, &Default::default()).unwrap();
    let all = compiled_kernels(&program);
    insta::assert_snapshot!("mixed_f16_block_kernels", all);
    // The kernels compute what the reference executor computes.
    let x = common::random_inputs(&m, 1);
    let want = smelt_runtime::cpu::run(&m, &x).unwrap();
    let got = program.run_cpu(&program.weights_blob(&m).unwrap(), &x).unwrap();
    assert!(smelt::precision_error(&got[0], &want[0]).max_abs_over_range <= 1e-2);
}

#[test]
fn policies_and_keep_f32() {
    let g = block();
    let count =
        |g: &KernelGraph, d: smelt_ir::DType| g.node_ids().filter(|&n| g.node(n).op.is_kernel() && g.node(n).outputs[0].dtype == d).count();
    // f32 is the identity.
    let (f, s) = compile(&g, Policy::F32, &[]);
    assert!(s.precision.is_none() && count(&f, smelt_ir::DType::F16) == 0);
    // Pure f16: even softmax and the classifier; the interface stays f32.
    let (h, s) = compile(&g, Policy::F16, &[]);
    assert!(s.precision.unwrap().kept_f32.is_empty());
    assert_eq!(h.ty(h.outputs()[0].1).dtype, smelt_ir::DType::F32);
    assert!(h.node_ids().any(|n| matches!(&h.node(n).op, KernelOp::Op(Op::Softmax { .. }) | KernelOp::FusedReduction { .. })
        && h.node(n).outputs[0].dtype == smelt_ir::DType::F16));
    // --keep-f32 by op type and by node name pattern.
    let (k, s) = compile(&g, Policy::MixedBf16, &["conv"]);
    let kept = s.precision.unwrap().kept_f32;
    assert!(kept.iter().filter(|k| k.reason == "--keep-f32 conv").count() >= 2, "{kept:?}");
    assert!(k
        .node_ids()
        .all(|n| !matches!(k.node(n).op, KernelOp::FusedConv { .. }) || k.node(n).outputs[0].dtype == smelt_ir::DType::F32));
    // Node names are those after fusion (as `smelt compile` prints them).
    let first_conv = f.node_ids().find(|&n| matches!(f.node(n).op, KernelOp::FusedConv { .. })).map(|n| f.node(n).name.clone()).unwrap();
    let (_, s) = compile(&g, Policy::MixedF16, &[&first_conv]);
    assert!(s.precision.unwrap().kept_f32.iter().any(|k| k.node == first_conv));
    // Every policy computes close to f32.
    let x = common::random_inputs(&g, 2);
    let want = smelt_runtime::cpu::run(&f, &x).unwrap();
    for p in [Policy::F16, Policy::Bf16, Policy::MixedF16, Policy::MixedBf16] {
        let (h, _) = compile(&g, p, &[]);
        let got: Vec<Tensor> = smelt_runtime::cpu::run(&h, &x).unwrap();
        let e = smelt::precision_error(&got[0], &want[0]);
        assert!(e.max_abs_over_range < 0.05, "{p}: {e:?}");
    }
}

#[test]
fn precision_on_the_command_line() {
    let m = common::variant("squeezenet").join("model.onnx");
    let out = common::smelt().args(["plan", m.to_str().unwrap(), "--precision", "mixed-f16", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["plan"]["weights_by_dtype"]["f16"].as_u64().unwrap() > 0);
    assert!(v["plan"]["activations_by_dtype"]["f16"].as_u64().unwrap() > v["plan"]["activations_by_dtype"]["f32"].as_u64().unwrap());
    let input = common::variant("squeezenet").join("input_0.pb");
    let out = common::smelt()
        .args(["run", m.to_str().unwrap(), "--input", input.to_str().unwrap(), "--precision", "mixed-bf16", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["precision"], "mixed-bf16");
    assert_eq!(v["outputs"][0]["dtype"], "f32");
    let e = &v["outputs"][0]["against_f32"];
    assert!(e["max_abs"].as_f64().unwrap() > 0.0 && e["argmax_agree"] == e["rows"], "{e}");
    let bad = common::smelt().args(["plan", m.to_str().unwrap(), "--precision", "f8"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("mixed-f16"));
}

/// A half activation into an f32 classifier is widened as the classifier's
/// kernel loads it (no cast kernel): SqueezeNet's conv classifier, and a
/// GEMM classifier after a half pooling.
#[test]
fn f32_classifiers_widen_half_inputs_on_load() {
    let mut b = Builder::new(5);
    let x = b.input("x", &[1, 4, 6, 6]).unwrap();
    let y = b.conv(x, 8, 3, 1, 1).and_then(|y| b.relu(y)).unwrap();
    let y = b.conv(y, 5, 1, 1, 0).and_then(|y| b.relu(y)).unwrap();
    let z =
        b.op(Op::MaxPool(smelt_ir::Pool { kernel: vec![2, 2], strides: vec![2, 2], pads: vec![0; 4], ceil_mode: false }), &[y]).unwrap();
    let z = b.op(Op::Flatten { axis: 1 }, &[z]).and_then(|z| b.linear(z, 3)).and_then(|z| b.softmax(z)).unwrap();
    let g = b.finish("y", z).unwrap();
    let (m, _) = compile(&g, Policy::MixedF16, &[]);
    let plan = smelt_passes::memory::plan(&m).unwrap();
    let program = Program::build(&m, &plan, &Default::default()).unwrap();
    let names: Vec<String> = program.sources().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().any(|n| n.starts_with("gemm") && n.ends_with("_af16")), "{names:?}");
    assert_eq!(m.node_ids().filter(|&n| matches!(m.node(n).op, KernelOp::Op(Op::Cast { .. }))).count(), 1, "{}", text::print(&m));
    let all = compiled_kernels(&program);
    insta::assert_snapshot!("mixed_f16_gemm_classifier_kernels", all);
    let x = common::random_inputs(&m, 4);
    let want = smelt_runtime::cpu::run(&m, &x).unwrap();
    let got = program.run_cpu(&program.weights_blob(&m).unwrap(), &x).unwrap();
    assert!(smelt::precision_error(&got[0], &want[0]).max_abs_over_range <= 1e-2);
    // SqueezeNet: its classifier is a conv that reads a half input.
    let sq = common::load(common::variant("squeezenet").join("model.onnx").to_str().unwrap(), None);
    let (sq, _) = compile(&sq, Policy::MixedF16, &[]);
    assert!(sq.node_ids().any(
        |n| smelt_codegen::conv::Conv::of(&sq, n).is_some_and(|c| c.dtype == smelt_ir::DType::F32 && c.x_dtype == smelt_ir::DType::F16)
    ));
}

/// Random graphs (convs with batch norm, residuals, broadcasts, concat,
/// pools, softmax) under every reduced policy: the graph verifies, the
/// memory plan passes its checker, the program run from its kernel
/// descriptions in one arena matches the reference executor on the same
/// graph, and the result stays close to f32.
#[test]
fn random_graphs_under_every_policy() {
    let mut casts = 0;
    for seed in 0..100 {
        let g = common::random_graph(seed);
        let x = common::random_inputs(&g, seed);
        let (f, _) = compile(&g, Policy::F32, &[]);
        let want = smelt_runtime::cpu::run(&f, &x).unwrap();
        for policy in [Policy::F16, Policy::Bf16, Policy::MixedF16, Policy::MixedBf16] {
            let (h, _) = compile(&g, policy, &[]);
            smelt_ir::verify(&h).unwrap_or_else(|e| panic!("seed {seed} {policy}: {e}\n{}", text::print(&h)));
            let plan = smelt_passes::memory::plan(&h).unwrap();
            smelt_passes::memory::check::check(&h, &plan).unwrap_or_else(|e| panic!("seed {seed} {policy}: {e}"));
            let reference = smelt_runtime::cpu::run(&h, &x).unwrap();
            let program =
                Program::build(&h, &plan, &Default::default()).unwrap_or_else(|e| panic!("seed {seed} {policy}: {e}\n{}", text::print(&h)));
            let got = program.run_cpu(&program.weights_blob(&h).unwrap(), &x).unwrap();
            for ((a, r), w) in got.iter().zip(&reference).zip(&want) {
                assert_eq!(a.ty(), w.ty(), "seed {seed} {policy}: the interface changed");
                let e = smelt::precision_error(a, r);
                assert!(e.max_abs_over_range <= 2e-2, "seed {seed} {policy}: program vs reference {e:?}\n{}", text::print(&h));
                let e = smelt::precision_error(a, w);
                let tol = if policy.half() == Some(smelt_ir::DType::BF16) { 0.2 } else { 0.05 };
                assert!(e.max_abs_over_range <= tol, "seed {seed} {policy}: against f32 {e:?}\n{}", text::print(&h));
            }
            casts += h.node_ids().filter(|&n| matches!(h.node(n).op, KernelOp::Op(Op::Cast { .. }))).count();
        }
    }
    println!("400 random graph compilations checked; {casts} standalone cast kernels in all");
}
