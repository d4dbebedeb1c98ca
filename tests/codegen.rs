//! Generated kernels: every elementwise kernel of the nine light models
//! (fused), described once, run on the CPU from its description and compared
//! with the reference executor, and compiled with NVRTC (required where the
//! test script set SMELT_REQUIRE_NVRTC; skipped with a reason elsewhere).

mod common;

use smelt_codegen::elementwise::Elementwise;
use smelt_codegen::nvrtc::Compiler;
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

/// The inputs of `id` as the reference executor computed them.
fn operands(g: &Graph, id: NodeId, kept: &std::collections::HashMap<ValueId, Arc<Tensor>>) -> Vec<Arc<Tensor>> {
    g.inputs_of(id).iter().map(|v| g.weight(v.node).cloned().unwrap_or_else(|| kept[v].clone())).collect()
}

#[test]
fn elementwise_kernels_of_the_light_models_match_the_reference_and_compile() {
    let nvrtc = compiler();
    let (mut kernels, mut compiled) = (0, 0);
    for name in common::LIGHT {
        let v = common::variant(name);
        let mut g = import_file(&v.join("model.onnx"), &ImportOptions::default()).unwrap();
        smelt::compile(&mut g, true, &mut |_, _| {}).unwrap();
        let descs: Vec<(NodeId, Elementwise)> = g.node_ids().filter_map(|id| Elementwise::of(&g, id).map(|d| (id, d))).collect();
        let wanted: HashSet<ValueId> =
            descs.iter().flat_map(|(id, _)| g.inputs_of(*id).into_iter().chain([ValueId { node: *id, slot: 0 }])).collect();
        let input = read_tensor_file(&v.join("input_0.pb")).unwrap().1;
        let (_, kept) = smelt_runtime::cpu::run_keeping(&g, &[input], &|v| wanted.contains(&v), &mut |_, _| {}).unwrap();
        for (id, d) in &descs {
            let ins = operands(&g, *id, &kept);
            let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
            let got = d.run_cpu(&refs);
            let want = &kept[&ValueId { node: *id, slot: 0 }];
            let c = smelt::compare(&got, want, 1e-6, 1e-6);
            assert!(c.ok, "{name}: kernel {} differs from the reference: {c:?}", d.name);
            if let Some(nv) = &nvrtc {
                let k = nv.compile(&d.name, &d.cuda()).unwrap_or_else(|e| panic!("{name}: {e}\n{}", d.cuda()));
                assert!(k.ptx.contains(&format!(".entry {}", d.name)));
                compiled += 1;
            }
            kernels += 1;
        }
    }
    println!("{kernels} elementwise kernels checked on the CPU, {compiled} compiled with NVRTC");
    assert!(kernels >= 60, "only {kernels} elementwise kernels in the light models");
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
        let cuda = d.cuda();
        if let Some(nv) = &nvrtc {
            nv.compile(&d.name, &cuda).unwrap_or_else(|e| panic!("{e}"));
        }
        insta::assert_snapshot!(name, cuda);
    }
}
