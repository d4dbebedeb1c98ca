//! Generated kernels: every elementwise, pooling, reduction (global average
//! pool, softmax, with fused prologues), transpose, concat, LRN and GEMM
//! kernel of the nine light
//! models (fused), described once, run on the CPU from its description and
//! compared with the reference executor, and compiled with NVRTC (required
//! where the test script set SMELT_REQUIRE_NVRTC; skipped with a reason
//! elsewhere).

mod common;

use smelt_codegen::elementwise::Elementwise;
use smelt_codegen::gemm::Gemm;
use smelt_codegen::layout::Layout;
use smelt_codegen::nvrtc::Compiler;
use smelt_codegen::pool::Pool;
use smelt_codegen::reduce::Reduction;
use smelt_codegen::Cache;
use smelt_ir::onnx::{import_file, read_tensor_file, ImportOptions};
use smelt_ir::{text, Graph, NodeId, Tensor, ValueId};
use std::collections::HashSet;
use std::sync::Arc;

fn compiler() -> Option<Compiler> {
    if smelt_codegen::nvrtc_available() {
        let dir = std::env::temp_dir().join(format!("smelt-codegen-{}", std::process::id()));
        return Some(Compiler { cache: Some(Cache::new(dir)), ..Compiler::default() });
    }
    assert!(std::env::var_os("SMELT_REQUIRE_NVRTC").is_none(), "SMELT_REQUIRE_NVRTC is set but libnvrtc cannot be loaded");
    eprintln!("SKIP (NVRTC part): libnvrtc not found; kernels are checked on the CPU only");
    None
}

/// Compiles a kernel's CUDA C with NVRTC (when there) and compares it with
/// its insta snapshot `name`.
fn compile_and_snapshot(nvrtc: Option<&Compiler>, name: &str, kernel: &str, cuda: &str) {
    if let Some(nv) = nvrtc {
        nv.compile(kernel, cuda).unwrap_or_else(|e| panic!("{e}\n{cuda}"));
    }
    insta::assert_snapshot!(name, cuda);
}

/// The inputs of `id` as the reference executor computed them.
fn operands(g: &Graph, id: NodeId, kept: &std::collections::HashMap<ValueId, Arc<Tensor>>) -> Vec<Arc<Tensor>> {
    g.inputs_of(id).iter().map(|v| g.weight(v.node).cloned().unwrap_or_else(|| kept[v].clone())).collect()
}

#[test]
fn every_kernel_but_conv_of_the_light_models_matches_the_reference_and_compiles() {
    let nvrtc = compiler();
    let (mut kernels, mut compiled) = (0, 0);
    for name in common::LIGHT {
        let v = common::variant(name);
        let mut g = import_file(&v.join("model.onnx"), &ImportOptions::default()).unwrap();
        smelt::compile(&mut g, true, &mut |_, _| {}).unwrap();
        let ids: Vec<NodeId> = g
            .node_ids()
            .filter(|&id| {
                Elementwise::of(&g, id).is_some()
                    || Pool::of(&g, id).is_some()
                    || Reduction::of(&g, id).is_some()
                    || Layout::of(&g, id).is_some()
                    || Gemm::of(&g, id).is_some()
            })
            .collect();
        let wanted: HashSet<ValueId> =
            ids.iter().flat_map(|id| g.inputs_of(*id).into_iter().chain([ValueId { node: *id, slot: 0 }])).collect();
        let input = read_tensor_file(&v.join("input_0.pb")).unwrap().1;
        let (_, kept) = smelt_runtime::cpu::run_keeping(&g, &[input], &|v| wanted.contains(&v), &mut |_, _| {}).unwrap();
        for id in &ids {
            let ins = operands(&g, *id, &kept);
            let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
            // The same description runs on the CPU and renders the CUDA C.
            let (kernel, got, cuda) = match (Elementwise::of(&g, *id), Pool::of(&g, *id), Reduction::of(&g, *id)) {
                (Some(d), _, _) => (d.name.clone(), d.run_cpu(&refs), d.cuda()),
                (_, Some(p), _) => (p.name.clone(), p.run_cpu(refs[0]), p.cuda()),
                (_, _, Some(r)) => (r.name.clone(), r.run_cpu(&refs), r.cuda()),
                _ => match (Layout::of(&g, *id), Gemm::of(&g, *id)) {
                    (Some(l), _) => (l.name.clone(), l.run_cpu(&refs), l.cuda()),
                    (_, Some(m)) => (m.name.clone(), m.run_cpu(refs[0], refs[1], refs.get(2).copied()), m.cuda()),
                    _ => unreachable!("filtered above"),
                },
            };
            let want = &kept[&ValueId { node: *id, slot: 0 }];
            // Same arithmetic as the reference, except GEMM's summation order
            // (the reference uses a blocked sgemm): looser there.
            let (rtol, atol) = if Gemm::of(&g, *id).is_some() { (1e-3, 1e-4) } else { (1e-6, 1e-6) };
            let c = smelt::compare(&got, want, rtol, atol);
            assert!(c.ok, "{name}: kernel {kernel} differs from the reference: {c:?}");
            if let Some(nv) = &nvrtc {
                let k = nv.compile(&kernel, &cuda).unwrap_or_else(|e| panic!("{name}: {e}\n{cuda}"));
                assert!(k.ptx.contains(&format!(".entry {kernel}")));
                compiled += 1;
            }
            kernels += 1;
        }
    }
    println!("{kernels} kernels (all but convolutions) checked on the CPU, {compiled} compiled with NVRTC");
    assert!(kernels >= 100, "only {kernels} such kernels in the light models");
}

/// The CUDA C of each elementwise pattern, as insta snapshots: a change to
/// the template shows as a reviewable diff.
#[test]
fn elementwise_cuda_snapshots() {
    let cases = [
        ("scale_shift_relu", "graph {\n  %0 \"x\" = input : f32[1,3,4,4]\n  %1 \"s\" = input : f32[3,1,1]\n  %2 \"t\" = input : f32[3,1,1]\n  %3 = elementwise(%0, %1, %2) {expr=\"relu(add(mul($0,$1),$2))\"} : f32[1,3,4,4]\n  output \"y\" = %3\n}\n"),
        ("same_shape_f16", "graph {\n  %0 \"a\" = input : f16[2,8]\n  %1 \"b\" = input : f16[2,8]\n  %2 = elementwise(%0, %1) {expr=\"clip(0.0,6.0,add($0,$1))\"} : f16[2,8]\n  output \"y\" = %2\n}\n"),
        ("tanh_leaky_bf16", "graph {\n  %0 \"a\" = input : bf16[4,5]\n  %1 \"b\" = input : bf16[5]\n  %2 = elementwise(%0, %1) {expr=\"leaky_relu(0.1,tanh(sub($0,$1)))\"} : bf16[4,5]\n  output \"y\" = %2\n}\n"),
    ];
    let nvrtc = compiler();
    for (name, src) in cases {
        let g = text::parse(src).unwrap();
        let id = g.outputs()[0].1.node;
        let d = Elementwise::of(&g, id).unwrap();
        compile_and_snapshot(nvrtc.as_ref(), name, &d.name, &d.cuda());
    }
}

/// The CUDA C of pooling kernels: max with padding, average counting padding.
#[test]
fn pool_cuda_snapshots() {
    let cases = [
        ("maxpool_3x3_s2_pad1", "graph {\n  %0 \"x\" = input : f32[1,2,6,6]\n  %1 = max_pool(%0) {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], ceil_mode=false} : f32[1,2,3,3]\n  output \"y\" = %1\n}\n"),
        ("avgpool_include_pad_f16", "graph {\n  %0 \"x\" = input : f16[1,2,5,5]\n  %1 = avg_pool(%0) {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], ceil_mode=true, count_include_pad=true} : f16[1,2,3,3]\n  output \"y\" = %1\n}\n"),
    ];
    let nvrtc = compiler();
    for (name, src) in cases {
        let g = text::parse(src).unwrap();
        let id = g.outputs()[0].1.node;
        let p = Pool::of(&g, id).unwrap();
        // The description agrees with the reference executor here too.
        let ty = g.ty(g.inputs_of(id)[0]).clone();
        let x = Tensor::from_f32(ty.shape.clone(), (0..ty.numel()).map(|i| (i as f32 * 0.37).sin()).collect()).cast(ty.dtype);
        let want = smelt_runtime::cpu::run(&g, std::slice::from_ref(&x)).unwrap();
        let c = smelt::compare(&p.run_cpu(&x), &want[0], 1e-3, 1e-3);
        assert!(c.ok, "{name}: {c:?}");
        compile_and_snapshot(nvrtc.as_ref(), name, &p.name, &p.cuda());
    }
}

/// The CUDA C of reductions: a global average pool with a fused prologue,
/// and a softmax.
#[test]
fn reduction_cuda_snapshots() {
    let cases = [
        ("fused_gap_scale_shift_relu", "graph {\n  %0 \"x\" = input : f32[2,3,4,4]\n  %1 \"s\" = input : f32[3,1,1]\n  %2 \"t\" = input : f32[3,1,1]\n  %3 = fused_reduction(%0, %1, %2) {expr=\"relu(add(mul($0,$1),$2))\", reduction=\"global_avg_pool\"} : f32[2,3,1,1]\n  output \"y\" = %3\n}\n"),
        ("softmax_axis1", "graph {\n  %0 \"x\" = input : f32[2,5,3]\n  %1 = softmax(%0) {axis=1} : f32[2,5,3]\n  output \"y\" = %1\n}\n"),
    ];
    let nvrtc = compiler();
    for (name, src) in cases {
        let g = text::parse(src).unwrap();
        let id = g.outputs()[0].1.node;
        let r = Reduction::of(&g, id).unwrap();
        let ins = common::random_inputs(&g, 5);
        let want = smelt_runtime::cpu::run(&g, &ins).unwrap();
        let c = smelt::compare(&r.run_cpu(&ins.iter().collect::<Vec<_>>()), &want[0], 1e-5, 1e-6);
        assert!(c.ok, "{name}: {c:?}");
        compile_and_snapshot(nvrtc.as_ref(), name, &r.name, &r.cuda());
    }
}

/// The CUDA C of data movement and LRN: ShuffleNet's channel shuffle
/// transpose, a channel concat, AlexNet's LRN.
#[test]
fn layout_cuda_snapshots() {
    let cases = [
        ("transpose_channel_shuffle", "graph {\n  %0 \"x\" = input : f32[1,4,3,2,2]\n  %1 = transpose(%0) {perm=[0,2,1,3,4]} : f32[1,3,4,2,2]\n  output \"y\" = %1\n}\n"),
        ("concat_channels", "graph {\n  %0 \"a\" = input : f32[2,2,3]\n  %1 \"b\" = input : f32[2,1,3]\n  %2 = concat(%0, %1) {axis=1} : f32[2,3,3]\n  output \"y\" = %2\n}\n"),
        ("lrn5", "graph {\n  %0 \"x\" = input : f32[1,7,2,2]\n  %1 = lrn(%0) {size=5, alpha=0.0001, beta=0.75, bias=1.0} : f32[1,7,2,2]\n  output \"y\" = %1\n}\n"),
    ];
    let nvrtc = compiler();
    for (name, src) in cases {
        let g = text::parse(src).unwrap();
        let id = g.outputs()[0].1.node;
        let l = Layout::of(&g, id).unwrap();
        let ins = common::random_inputs(&g, 6);
        let want = smelt_runtime::cpu::run(&g, &ins).unwrap();
        let c = smelt::compare(&l.run_cpu(&ins.iter().collect::<Vec<_>>()), &want[0], 1e-5, 1e-6);
        assert!(c.ok, "{name}: {c:?}");
        compile_and_snapshot(nvrtc.as_ref(), name, &l.name, &l.cuda());
    }
}

/// The CUDA C of a fused GEMM (transposed weight, bias, ReLU epilogue).
#[test]
fn gemm_cuda_snapshot() {
    let src = "graph {\n  %0 \"x\" = input : f32[3,20]\n  %1 \"w\" = input : f32[5,20]\n  %2 \"b\" = input : f32[5]\n  %3 = fused_gemm(%0, %1, %2) {trans_a=false, trans_b=true, alpha=1.0, beta=1.0, act=\"relu\"} : f32[3,5]\n  output \"y\" = %3\n}\n";
    let g = text::parse(src).unwrap();
    let id = g.outputs()[0].1.node;
    let m = Gemm::of(&g, id).unwrap();
    let ins = common::random_inputs(&g, 7);
    let want = smelt_runtime::cpu::run(&g, &ins).unwrap();
    let c = smelt::compare(&m.run_cpu(&ins[0], &ins[1], Some(&ins[2])), &want[0], 1e-5, 1e-5);
    assert!(c.ok, "{c:?}");
    compile_and_snapshot(compiler().as_ref(), "gemm_tb_relu_bias", &m.name, &m.cuda());
}
