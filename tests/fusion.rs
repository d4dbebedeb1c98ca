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
        for (x, y) in b.iter().zip(&a) {
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
                precision: smelt_passes::precision::Options { policy: policy.parse().unwrap(), keep_f32: vec![] },
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
