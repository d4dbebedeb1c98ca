//! Fusion keeps the numbers and fuses what it promises: on the nine light
//! models (random-weight variants) and on random graphs.

mod common;

use smelt_ir::onnx::{import_file, read_tensor_file, ImportOptions};
use smelt_ir::{Graph, KernelGraph, KernelOp, NodeId, Op, OpSet, UnaryOp};

fn fused(g: &Graph) -> KernelGraph {
    common::compiled(g, true)
}

fn kernels(g: &KernelGraph, name: &str) -> usize {
    g.node_ids().filter(|&n| g.node(n).op.is_kernel() && g.node(n).op.name() == name).count()
}

/// Whether `id` is a standalone activation reading a convolution that nobody
/// else reads: a Conv+...+ReLU chain that was not fused.
fn unfused_activation(g: &KernelGraph, id: NodeId) -> bool {
    let is_act =
        matches!(g.node(id).op, KernelOp::Op(Op::Unary(UnaryOp::Relu | UnaryOp::Sigmoid) | Op::Clip { .. }) | KernelOp::Elementwise { .. });
    is_act
        && g.inputs_of(id)
            .iter()
            .any(|v| matches!(g.node(v.node).op, KernelOp::Op(Op::Conv(_)) | KernelOp::FusedConv { .. }) && g.users_of(v.node).len() == 1)
}

#[test]
fn light_variants_fused_match_unfused_and_onnxruntime() {
    for name in common::LIGHT {
        let v = common::variant(name);
        let g = import_file(&v.join("model.onnx"), &ImportOptions::default()).unwrap();
        let f = fused(&g);
        let input = read_tensor_file(&v.join("input_0.pb")).unwrap().1;
        let expected = read_tensor_file(&v.join("output_0.pb")).unwrap().1;
        let a = smelt_runtime::cpu::run(&g, std::slice::from_ref(&input)).unwrap();
        let b = smelt_runtime::cpu::run(&f, &[input]).unwrap();
        let c = smelt::compare(&b[0], &a[0], 1e-3, 1e-4);
        assert!(c.ok, "{name}: fused differs from unfused: {c:?}");
        let c = smelt::compare(&b[0], &expected, 1e-3, 1e-4);
        assert!(c.ok, "{name}: fused differs from onnxruntime: {c:?}");

        let before = g.node_ids().filter(|&n| g.node(n).op.is_kernel()).count();
        let after = f.node_ids().filter(|&n| f.node(n).op.is_kernel()).count();
        assert!(after < before, "{name}: {before} kernels before, {after} after");
        assert_eq!(kernels(&f, "batch_norm"), 0, "{name}: a batch norm survived fusion");
        let stray: Vec<_> = f.node_ids().filter(|&n| unfused_activation(&f, n)).map(|n| f.node(n).name.clone()).collect();
        assert!(stray.is_empty(), "{name}: activations not fused into their conv: {stray:?}");
    }
}

/// ResNet-50: every Conv+BN(+ReLU) and every residual tail is one kernel.
#[test]
fn resnet50_is_one_kernel_per_conv() {
    let g = import_file(&common::light_model("resnet50"), &ImportOptions::default()).unwrap();
    let f = fused(&g);
    assert_eq!(kernels(&f, "fused_conv") + kernels(&f, "conv"), 53);
    assert_eq!(kernels(&f, "relu") + kernels(&f, "add") + kernels(&f, "sum") + kernels(&f, "elementwise"), 0);
    let residual = f.node_ids().filter(|&n| matches!(f.node(n).op, KernelOp::FusedConv { residual: true, .. })).count();
    assert_eq!(residual, 16);
    // Each fused conv traces back to one conv and the batch norm folded into it.
    for n in f.node_ids().filter(|&n| matches!(f.node(n).op, KernelOp::FusedConv { .. })) {
        let ops: Vec<&str> = f.origin(n).iter().map(|&o| g.node(o).op.name()).collect();
        let count = |op: &str| ops.iter().filter(|&&o| o == op).count();
        assert!(count("conv") == 1 && count("batch_norm") == 1, "{}: origin {ops:?}", f.node(n).name);
    }
}

/// Random graphs: the fused graph computes the same numbers.
#[test]
fn random_graphs_fuse_without_changing_results() {
    for seed in 0..150 {
        let g = common::random_graph(seed);
        let f = fused(&g);
        let inputs = common::random_inputs(&g, seed + 1000);
        let a = smelt_runtime::cpu::run(&g, &inputs).unwrap();
        let b = smelt_runtime::cpu::run(&f, &inputs).unwrap();
        for (x, y) in common::paired(&b, &a) {
            let c = smelt::compare(x, y, 1e-4, 1e-5);
            assert!(c.ok, "seed {seed}: {c:?}\nbefore:\n{}\nafter:\n{}", smelt_ir::text::print(&g), smelt_ir::text::print(&f));
        }
    }
}

/// Provenance survives every pass: each node of the kernel graph names the
/// model nodes it computes, every computing node of the model (views
/// aside) is named by some kernel-graph node, and only model nodes are named
/// (nine light models and random graphs, at f32 and mixed-f16).
#[test]
fn kernels_trace_back_to_every_model_node() {
    let mut graphs: Vec<(String, Graph)> = common::LIGHT
        .iter()
        .map(|n| (n.to_string(), import_file(&common::variant(n).join("model.onnx"), &ImportOptions::default()).unwrap()))
        .collect();
    graphs.extend((0..60).map(|s| (format!("random graph {s}"), common::random_graph(s))));
    let mut traced = 0;
    for (name, g) in &graphs {
        for policy in ["f32", "mixed-f16"] {
            let opts = smelt::Options {
                precision: smelt_passes::precision::Options { policy: policy.parse().unwrap(), keep_f32: vec![], ..Default::default() },
                ..Default::default()
            };
            let mut s = common::session(g, opts);
            let k = s.compile().unwrap().graph;
            let mut covered = std::collections::HashSet::new();
            for id in k.node_ids() {
                for &o in k.origin(id) {
                    assert!(g.contains(o), "{name} {policy}: {} names {o}, not a model node", k.node(id).name);
                    covered.insert(o);
                }
            }
            let missing: Vec<String> = s
                .source
                .node_ids()
                // Views compute nothing: one of a graph input read only as an
                // output has no kernel to trace to.
                .filter(|&n| s.source.node(n).op.is_kernel() && !covered.contains(&n))
                .map(|n| format!("{n} {} ({})", s.source.node(n).name, s.source.node(n).op.name()))
                .collect();
            assert!(missing.is_empty(), "{name} {policy}: model nodes no kernel traces back to: {missing:?}");
            traced += covered.len();
        }
    }
    println!("{traced} model nodes traced from their kernels");
}

/// A spelled-out layer norm over the last dim of x `f32[2,3,8]`: `square`
/// is `pow(%2, %3)` or `mul(%2, %2)`, `tail` what follows the division.
fn spelled_layer_norm(square: &str, tail: &str, output: &str, extra: &str) -> Graph {
    let text = format!(
        "graph {{\n  %0 \"x\" = input : f32[2,3,8]\n  %1 = reduce_mean(%0) {{axes=[2], keepdims=true}} : f32[2,3,1]\n  \
         %2 = sub(%0, %1) : f32[2,3,8]\n  %3 \"two\" = const : f32[] = [2.0]\n  %4 = {square} : f32[2,3,8]\n  \
         %5 = reduce_mean(%4) {{axes=[2], keepdims=true}} : f32[2,3,1]\n  %6 \"eps\" = const : f32[] = [1e-5]\n  \
         %7 = add(%5, %6) : f32[2,3,1]\n  %8 = sqrt(%7) : f32[2,3,1]\n  %9 = div(%2, %8) : f32[2,3,8]\n  \
         %10 \"gamma\" = const : f32[8]\n  %11 \"beta\" = const : f32[8]\n{tail}  output \"y\" = {output}\n{extra}}}\n"
    );
    let mut g = smelt_ir::text::parse(&text).unwrap();
    let mut rng = smelt_ir::Rng::new(3);
    for name in ["gamma", "beta"] {
        let id = g.node_ids().find(|&n| g.node(n).name == name).unwrap();
        let shape = g.node(id).outputs[0].shape.clone();
        let n = shape.iter().product();
        g.set_weight(id, smelt_ir::Tensor::from_f32(shape, (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect())).unwrap();
    }
    g
}

/// Opset 14's LayerNorm (mean, sub, pow, mean, add, sqrt, div, mul, add)
/// becomes one `layer_norm` in each spelling, with the same numbers; an
/// intermediate read elsewhere keeps the graph as it is.
#[test]
fn spelled_out_layer_norms_become_one_op() {
    let affine = "  %12 = mul(%9, %10) : f32[2,3,8]\n  %13 = add(%11, %12) : f32[2,3,8]\n";
    let cases = [
        ("pow(%2, %3)", affine, "%13", "", 1),
        ("mul(%2, %2)", affine, "%13", "", 1),
        ("pow(%2, %3)", "  %12 = mul(%10, %9) : f32[2,3,8]\n", "%12", "", 1),
        ("pow(%2, %3)", "", "%9", "", 1),
        // The variance is an output too: not a layer norm alone.
        ("pow(%2, %3)", affine, "%13", "  output \"var\" = %5\n", 0),
        // Not a square.
        ("mul(%2, %0)", affine, "%13", "", 0),
    ];
    // Over a rank-1 x, the difference is one value per element too: it is
    // not taken for the scale.
    let rank1 = "graph {\n  %0 \"x\" = input : f32[8]\n  %1 = reduce_mean(%0) {axes=[0], keepdims=true} : f32[1]\n  \
                 %2 = sub(%0, %1) : f32[8]\n  %3 = mul(%2, %2) : f32[8]\n  %4 = reduce_mean(%3) {axes=[0], keepdims=true} : f32[1]\n  \
                 %5 \"eps\" = const : f32[] = [1e-5]\n  %6 = add(%4, %5) : f32[1]\n  %7 = sqrt(%6) : f32[1]\n  \
                 %8 = div(%2, %7) : f32[8]\n  %9 = mul(%8, %2) : f32[8]\n  output \"y\" = %9\n}\n";
    let g = smelt_ir::text::parse(rank1).unwrap();
    let f = fused(&g);
    let x1 = smelt_ir::Tensor::from_f32(vec![8], (0..8).map(|i| i as f32 * 0.3 - 1.0).collect());
    let (a, b) = (smelt_runtime::cpu::run(&g, std::slice::from_ref(&x1)).unwrap(), smelt_runtime::cpu::run(&f, &[x1]).unwrap());
    assert!(smelt::compare(&b[0], &a[0], 1e-5, 1e-5).ok, "rank 1");
    let mut rng = smelt_ir::Rng::new(4);
    let x = smelt_ir::Tensor::from_f32(vec![2, 3, 8], (0..48).map(|_| rng.uniform() * 4.0 - 2.0).collect());
    for (square, tail, output, extra, want) in cases {
        let g = spelled_layer_norm(square, tail, output, extra);
        let f = fused(&g);
        let is_layer_norm = |n: NodeId| match &f.node(n).op {
            KernelOp::Op(op) => matches!(op, Op::LayerNorm { .. }),
            KernelOp::FusedReduction { reduction, .. } => matches!(reduction, smelt_ir::Reducer::LayerNorm { .. }),
            _ => false,
        };
        assert_eq!(f.node_ids().filter(|&n| is_layer_norm(n)).count(), want, "{square} {tail} {extra}");
        if want == 1 {
            assert_eq!(
                f.node_ids().filter(|&n| f.node(n).op.is_kernel()).count(),
                1,
                "{square} {tail}: one kernel:\n{}",
                smelt_ir::text::print(&f)
            );
        }
        let a = smelt_runtime::cpu::run(&g, std::slice::from_ref(&x)).unwrap();
        let b = smelt_runtime::cpu::run(&f, std::slice::from_ref(&x)).unwrap();
        for (a, b) in common::paired(&a, &b) {
            let c = smelt::compare(b, a, 1e-5, 1e-5);
            assert!(c.ok, "{square} {tail} {extra}: {c:?}");
        }
    }
}

/// Reshape and transpose chains become at most one transpose, with the same
/// numbers: the dynamo exporter's key transpose (transpose, reshape to 3-D,
/// transpose, reshape back) is one transpose attention can fold; a pair
/// that cancels is none; a chain whose reshape splits a dim unevenly stays.
#[test]
fn transpose_chains_become_one_transpose() {
    let cases = [
        (
            "[2,16,64]",
            "  %1 = reshape(%0) {shape=[2,16,4,16]} : f32[2,16,4,16]\n  %2 = transpose(%1) {perm=[0,2,1,3]} : f32[2,4,16,16]\n  \
             %3 = reshape(%2) {shape=[8,16,16]} : f32[8,16,16]\n  %4 = transpose(%3) {perm=[0,2,1]} : f32[8,16,16]\n  \
             %5 = reshape(%4) {shape=[2,4,16,16]} : f32[2,4,16,16]\n  output \"y\" = %5\n",
            Some(vec![0, 2, 3, 1]),
        ),
        (
            "[6,4]",
            "  %1 = transpose(%0) {perm=[1,0]} : f32[4,6]\n  %2 = transpose(%1) {perm=[1,0]} : f32[6,4]\n  output \"y\" = %2\n",
            None,
        ),
        (
            "[6,4]",
            "  %1 = transpose(%0) {perm=[1,0]} : f32[4,6]\n  %2 = reshape(%1) {shape=[8,3]} : f32[8,3]\n  \
             %3 = transpose(%2) {perm=[1,0]} : f32[3,8]\n  output \"y\" = %3\n",
            Some(vec![1, 2, 0]),
        ),
        (
            "[6,4]",
            "  %1 = transpose(%0) {perm=[1,0]} : f32[4,6]\n  %2 = reshape(%1) {shape=[3,8]} : f32[3,8]\n  \
             %3 = transpose(%2) {perm=[1,0]} : f32[8,3]\n  output \"y\" = %3\n",
            Some(vec![]),
        ),
        // Empty: left alone (no atom of extent 0 is split or divided by).
        (
            "[4,0]",
            "  %1 = transpose(%0) {perm=[1,0]} : f32[0,4]\n  %2 = reshape(%1) {shape=[0,2,2]} : f32[0,2,2]\n  \
             %3 = transpose(%2) {perm=[0,2,1]} : f32[0,2,2]\n  output \"y\" = %3\n",
            Some(vec![]),
        ),
    ];
    let mut rng = smelt_ir::Rng::new(5);
    for (shape, body, want) in cases {
        let text = format!("graph {{\n  %0 \"x\" = input : f32{shape}\n{body}}}\n");
        let g = smelt_ir::text::parse(&text).unwrap();
        let ty = g.node(g.inputs()[0]).outputs[0].clone();
        let x = smelt_ir::Tensor::from_f32(ty.shape.clone(), (0..ty.numel()).map(|_| rng.uniform()).collect());
        let f = fused(&g);
        let perms: Vec<Vec<usize>> = f
            .node_ids()
            .filter_map(|n| match &f.node(n).op {
                KernelOp::Op(Op::Transpose { perm }) => Some(perm.clone()),
                _ => None,
            })
            .collect();
        match &want {
            Some(p) if p.is_empty() => assert_eq!(perms.len(), 2, "{body}: left as it was"),
            Some(p) => assert_eq!(perms, vec![p.clone()], "{body}"),
            None => assert!(perms.is_empty(), "{body}: {perms:?}"),
        }
        let a = smelt_runtime::cpu::run(&g, std::slice::from_ref(&x)).unwrap();
        let b = smelt_runtime::cpu::run(&f, std::slice::from_ref(&x)).unwrap();
        assert_eq!(a[0].to_f32_vec(), b[0].to_f32_vec(), "{body}");
    }
}

/// A Gemm's bias joins its epilogue only while the columns stay the last
/// dim: through a reshape that splits them it would broadcast wrongly, so
/// that Gemm keeps its bias and the tanh stays a kernel of its own.
#[test]
fn gemm_bias_joins_the_epilogue_only_per_column() {
    let mut rng = smelt_ir::Rng::new(9);
    for (tail, want) in [
        ("  %4 = tanh(%3) : f32[4,6]\n  output \"y\" = %4\n", 1),
        ("  %4 = reshape(%3) {shape=[4,2,3]} : f32[4,2,3]\n  %5 = tanh(%4) : f32[4,2,3]\n  output \"y\" = %5\n", 0),
    ] {
        let text = format!(
            "graph {{\n  %0 \"x\" = input : f32[4,8]\n  %1 \"w\" = const : f32[8,6]\n  %2 \"b\" = const : f32[6]\n  \
             %3 = gemm(%0, %1, %2) {{trans_a=false, trans_b=false, alpha=1.0, beta=1.0}} : f32[4,6]\n{tail}}}\n"
        );
        let mut g = smelt_ir::text::parse(&text).unwrap();
        for name in ["w", "b"] {
            let id = g.node_ids().find(|&n| g.node(n).name == name).unwrap();
            let shape = g.node(id).outputs[0].shape.clone();
            let n = shape.iter().product();
            g.set_weight(id, smelt_ir::Tensor::from_f32(shape, (0..n).map(|_| rng.uniform() - 0.5).collect())).unwrap();
        }
        let f = fused(&g);
        assert_eq!(kernels(&f, "gemm_epilogue"), want, "{tail}");
        let x = smelt_ir::Tensor::from_f32(vec![4, 8], (0..32).map(|_| rng.uniform() - 0.5).collect());
        let a = smelt_runtime::cpu::run(&g, std::slice::from_ref(&x)).unwrap();
        let b = smelt_runtime::cpu::run(&f, &[x]).unwrap();
        assert!(smelt::compare(&b[0], &a[0], 1e-5, 1e-6).ok, "{tail}");
    }
}
