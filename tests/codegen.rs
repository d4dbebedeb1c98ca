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
use smelt_codegen::program::compile_all;
use smelt_codegen::reduce::Reduction;
use smelt_codegen::tiling::kernel_of;
use smelt_codegen::{Kernel, Program};
use smelt_ir::onnx::{import_file, read_tensor_file, ImportOptions};
use smelt_ir::{text, Graph, KernelGraph, NodeId, Tensor, ValueId};
use std::collections::HashSet;
use std::sync::Arc;

fn compiler() -> Option<Compiler> {
    common::nvrtc_compiler("codegen")
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
fn operands(g: &KernelGraph, id: NodeId, kept: &std::collections::HashMap<ValueId, Arc<Tensor>>) -> Vec<Arc<Tensor>> {
    g.inputs_of(id).iter().map(|v| g.weight(v.node).cloned().unwrap_or_else(|| kept[v].clone())).collect()
}

#[test]
fn every_kernel_of_the_light_models_matches_the_reference_and_compiles() {
    let nvrtc = compiler();
    let (mut checked, mut sources) = (0, Vec::new());
    let mut kinds = std::collections::BTreeMap::new();
    for name in common::LIGHT {
        let v = common::variant(name);
        let g = common::compiled(&import_file(&v.join("model.onnx"), &ImportOptions::default()).unwrap(), true);
        // Every node of the planned graph lowers: no op is left without a kernel.
        let plan = smelt_passes::memory::plan(&g).unwrap();
        let program = Program::build(&g, &plan, &Default::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ids: Vec<NodeId> = g.node_ids().filter(|&id| kernel_of(&g, id, &Default::default()).is_some()).collect();
        let wanted: HashSet<ValueId> =
            ids.iter().flat_map(|id| g.inputs_of(*id).into_iter().chain([ValueId { node: *id, slot: 0 }])).collect();
        let input = read_tensor_file(&v.join("input_0.pb")).unwrap().1;
        // The program end to end, as a device would run it (one arena, the
        // weights blob, every kernel's description at its offsets), against
        // onnxruntime.
        let got = program.run_cpu(&program.weights_blob(&g).unwrap(), std::slice::from_ref(&input)).unwrap();
        let expected = read_tensor_file(&v.join("output_0.pb")).unwrap().1;
        let c = smelt::compare(&got[0], &expected, 1e-3, 1e-4);
        assert!(c.ok, "{name}: the program's output differs from onnxruntime's: {c:?}");
        let (_, kept) = smelt_runtime::cpu::run_keeping(&g, &[input], &|v| wanted.contains(&v), &mut |_, _| {}).unwrap();
        for id in &ids {
            let ins = operands(&g, *id, &kept);
            let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
            // The same description runs on the CPU and renders the CUDA C.
            let k = kernel_of(&g, *id, &Default::default()).unwrap();
            let got = k.run_cpu(&refs);
            let want = &kept[&ValueId { node: *id, slot: 0 }];
            // Same arithmetic as the reference, except the summation order of
            // GEMM and convolution (the reference uses a blocked sgemm).
            let (rtol, atol) = if matches!(k, Kernel::Gemm(_) | Kernel::Conv(_)) { (1e-3, 1e-4) } else { (1e-6, 1e-6) };
            let c = smelt::compare(&got, want, rtol, atol);
            assert!(c.ok, "{name}: kernel {} differs from the reference: {c:?}", k.name());
            *kinds.entry(k.kind()).or_insert(0) += 1;
            checked += 1;
        }
        assert_eq!(program.steps.len(), ids.iter().filter(|n| program_runs(&g, &plan, **n)).count());
        sources.extend(program.sources());
    }
    let mut compiled = 0;
    if let Some(nv) = &nvrtc {
        let done = compile_all(nv, &sources, 2, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        for ((kernel, _), k) in sources.iter().zip(&done) {
            assert!(k.ptx.contains(&format!(".entry {kernel}(")), "{kernel}: no entry in the PTX");
        }
        compiled = done.len();
        common::ptxas_has_no_spills(&done);
    }
    println!("nine light-model programs run end to end from their kernel descriptions match onnxruntime");
    println!("{checked} kernels of the nine light models checked on the CPU ({kinds:?}); {compiled} distinct kernels compiled with NVRTC");
    assert!(kinds.get("conv").copied().unwrap_or(0) >= 400, "too few conv kernels: {kinds:?}");
}

/// Whether node `n` of the schedule is a kernel in the program (in-place
/// concatenations that alias their inputs are not).
fn program_runs(g: &KernelGraph, plan: &smelt_passes::memory::Plan, n: NodeId) -> bool {
    matches!(Kernel::lower(g, n, plan.copied_concats.contains(&n)), Ok(smelt_codegen::Lowered::Kernel(_)))
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
        let g = text::parse_kernel(src).unwrap();
        let id = g.outputs()[0].1.node;
        let d = Elementwise::of(&g, id).unwrap();
        compile_and_snapshot(nvrtc.as_ref(), name, &d.name, &d.cuda());
    }
    // Four elements per thread: same-shape f32 operands.
    let g = text::parse_kernel("graph {\n  %0 \"a\" = input : f32[2,8]\n  %1 \"b\" = input : f32[2,8]\n  %2 = elementwise(%0, %1) {expr=\"relu(add($0,$1))\"} : f32[2,8]\n  output \"y\" = %2\n}\n").unwrap();
    let mut d = Elementwise::of(&g, g.outputs()[0].1.node).unwrap();
    assert!(d.vectorizable());
    d.vector = true;
    assert_eq!(d.threads(), 4);
    compile_and_snapshot(nvrtc.as_ref(), "add_relu_v4", &d.name, &d.cuda());
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
        let g = text::parse_kernel(src).unwrap();
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
        let g = text::parse_kernel(src).unwrap();
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
        let g = text::parse_kernel(src).unwrap();
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
    let g = text::parse_kernel(src).unwrap();
    let id = g.outputs()[0].1.node;
    let m = Gemm::of(&g, id).unwrap();
    let ins = common::random_inputs(&g, 7);
    let want = smelt_runtime::cpu::run(&g, &ins).unwrap();
    let c = smelt::compare(&m.run_cpu(&ins.iter().collect::<Vec<_>>()), &want[0], 1e-5, 1e-5);
    assert!(c.ok, "{c:?}");
    compile_and_snapshot(compiler().as_ref(), "gemm_tb_relu_bias", &m.name, &m.cuda());
}

/// A fused conv in text IR: `x [n,c,h,w]` (or `[n,c,w]` when `h` is None),
/// weights `[m, c/g, kh, kw]`, optional bias and residual.
#[allow(clippy::too_many_arguments)]
fn conv_text(
    dtype: &str,
    n: usize,
    c: usize,
    h: Option<usize>,
    w: usize,
    m: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 4],
    d: [usize; 2],
    g: usize,
    bias: bool,
    res: bool,
    act: &str,
) -> String {
    let out = |len: usize, i: usize| (len + p[i] + p[i + 2] - d[i] * (k[i] - 1) - 1) / s[i] + 1;
    let (oh, ow) = (h.map(|h| out(h, 0)), out(w, 1));
    let sp = |a: Option<usize>, b: usize| a.map_or(format!("{b}"), |a| format!("{a},{b}"));
    let (xs, ws, os) =
        (format!("{n},{c},{}", sp(h, w)), format!("{m},{},{}", c / g, sp(h.map(|_| k[0]), k[1])), format!("{n},{m},{}", sp(oh, ow)));
    let two = |v: [usize; 2]| if h.is_some() { format!("{},{}", v[0], v[1]) } else { v[1].to_string() };
    let pads = if h.is_some() { format!("{},{},{},{}", p[0], p[1], p[2], p[3]) } else { format!("{},{}", p[1], p[3]) };
    let mut t = format!("graph {{\n  %0 \"x\" = input : {dtype}[{xs}]\n  %1 \"w\" = input : {dtype}[{ws}]\n");
    let mut args = vec!["%0".to_string(), "%1".to_string()];
    if bias {
        t += &format!("  %2 \"b\" = input : {dtype}[{m}]\n");
        args.push("%2".into());
    }
    if res {
        t += &format!("  %3 \"r\" = input : {dtype}[{os}]\n");
        args.push("%3".into());
    }
    t += &format!(
        "  %4 \"y\" = fused_conv({}) {{strides=[{}], pads=[{pads}], dilations=[{}], group={g}, bias={bias}, residual={res}, act=\"{act}\"}} : {dtype}[{os}]\n  output \"y\" = %4\n}}\n",
        args.join(", "),
        two(s),
        two(d)
    );
    t
}

/// Checks the conv kernel of `src` against the reference executor.
fn check_conv(src: &str, seed: u64, tol: f64) -> smelt_codegen::conv::Conv {
    let g = text::parse_kernel(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let id = g.outputs()[0].1.node;
    let k = smelt_codegen::conv::Conv::of(&g, id).unwrap_or_else(|| panic!("no conv kernel for\n{src}"));
    let ins = common::random_inputs(&g, seed);
    let want = smelt_runtime::cpu::run(&g, &ins).unwrap();
    let got = k.run_cpu(&ins.iter().collect::<Vec<_>>());
    let c = smelt::compare(&got, &want[0], tol, tol);
    assert!(c.ok, "{}: {c:?}\n{src}", k.name);
    k
}

/// Random convolutions (strides, asymmetric pads, dilations, groups,
/// depthwise, 1-D, bias, residual, each activation, f16, sizes that cross
/// tile edges): the description's CPU run matches the reference executor, and
/// NVRTC compiles the CUDA C of every one.
#[test]
fn random_convs_match_the_reference_and_compile() {
    let mut r = smelt_ir::Rng::new(41);
    let nvrtc = compiler();
    let mut algos = std::collections::BTreeMap::new();
    let mut sources = Vec::new();
    for case in 0..60 {
        let g = [1, 1, 2, 3, 4][r.below(5)];
        let depthwise = r.below(5) == 0;
        let (c, m) = if depthwise {
            let c = 1 + r.below(8);
            (c, c)
        } else {
            (g * (1 + r.below(6)), g * (1 + r.below(80)))
        };
        let g = if depthwise { c } else { g };
        let one_d = r.below(6) == 0;
        let k = [if one_d { 1 } else { 1 + r.below(4) }, 1 + r.below(4)];
        let s = [1 + r.below(2), 1 + r.below(3)];
        let d = [1 + r.below(2), 1 + r.below(2)];
        let p = if one_d { [0, r.below(3), 0, r.below(3)] } else { [r.below(3), r.below(3), r.below(3), r.below(3)] };
        let h = (!one_d).then(|| d[0] * (k[0] - 1) + 1 + r.below(9));
        let w = d[1] * (k[1] - 1) + 1 + r.below(11);
        let act = ["none", "relu", "clip(0.0,6.0)", "sigmoid", "silu"][r.below(5)];
        let dtype = if r.below(4) == 0 { "f16" } else { "f32" };
        let src = conv_text(dtype, 1 + r.below(3), c, h, w, m, k, s, p, d, g, r.below(2) == 0, r.below(2) == 0, act);
        let kern = check_conv(&src, case, if dtype == "f16" { 2e-2 } else { 1e-4 });
        *algos.entry(format!("{:?}", kern.algo)).or_insert(0) += 1;
        sources.push((kern.name.clone(), kern.cuda()));
    }
    if let Some(nv) = &nvrtc {
        compile_all(nv, &sources, 2, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    }
    println!("60 random convs checked: {algos:?}");
    assert!(algos.len() == 3, "every algorithm (direct, implicit GEMM, tensor cores) must be exercised: {algos:?}");
}

/// The CUDA C of fused convolutions, one per pattern: 3x3 with bias and
/// ReLU (implicit GEMM), a strided 1x1 with residual, a depthwise 3x3
/// (direct), a grouped conv, f16, and a 1-D conv.
#[test]
fn conv_cuda_snapshots() {
    let cases = [
        ("conv3x3_bias_relu", conv_text("f32", 1, 8, Some(6), 6, 16, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, true, false, "relu")),
        ("conv1x1_s2_bias_res_relu", conv_text("f32", 2, 8, Some(6), 6, 12, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1, true, true, "relu")),
        (
            "conv3x3_dw_bias_relu6",
            conv_text("f32", 1, 8, Some(5), 5, 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 8, true, false, "clip(0.0,6.0)"),
        ),
        ("conv1x1_g3_bias", conv_text("f32", 1, 24, Some(4), 4, 48, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 3, true, false, "none")),
        ("conv3x3_bias_silu_f16", conv_text("f16", 1, 8, Some(6), 6, 16, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, true, false, "silu")),
        ("conv1d_k5_d2", conv_text("f32", 1, 4, None, 20, 8, [1, 5], [1, 1], [0, 4, 0, 4], [1, 2], 1, false, false, "none")),
    ];
    let nvrtc = compiler();
    for (i, (name, src)) in cases.iter().enumerate() {
        let k = check_conv(src, i as u64, if src.contains("f16") { 2e-2 } else { 1e-4 });
        compile_and_snapshot(nvrtc.as_ref(), name, &k.name, &k.cuda());
    }
    // Channels-last in and out on tensor cores: 16-byte loads of both
    // operands, results staged column-major (checked on the emulator in
    // `every_tensor_core_tile_matches_its_description`).
    let src = conv_text("f16", 2, 16, Some(6), 6, 24, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1, true, true, "relu");
    let k = check_conv(&src, 9, 2e-2).channels_last(true, true);
    assert_eq!(k.vector_loads(), (true, true), "{}", k.name);
    compile_and_snapshot(nvrtc.as_ref(), "conv1x1_bias_res_relu_f16_nhwc", &k.name, &k.cuda());
}

/// Programs of random graphs (in-place elementwise kernels and residual
/// epilogues, views, in-place and copied concatenations, pools, softmax) and
/// of two light models at batch 2, run from their kernel descriptions in one
/// byte arena, match the reference executor on the unfused graph.
#[test]
fn programs_run_from_the_arena_match_the_reference() {
    let check = |what: &str, plain: &Graph, inputs: &[Tensor]| {
        let g = common::compiled(plain, true);
        let plan = smelt_passes::memory::plan(&g).unwrap();
        let program = Program::build(&g, &plan, &Default::default()).unwrap_or_else(|e| panic!("{what}: {e}\n{}", text::print(&g)));
        let got = program.run_cpu(&program.weights_blob(&g).unwrap(), inputs).unwrap();
        let want = smelt_runtime::cpu::run(plain, inputs).unwrap();
        for (a, b) in got.iter().zip(&want) {
            let c = smelt::compare(a, b, 1e-3, 1e-4);
            assert!(c.ok, "{what}: {c:?}\n{}", text::print(&g));
        }
        program.steps.len()
    };
    let mut launches = 0;
    for seed in 0..120 {
        let g = common::random_graph(seed);
        launches += check(&format!("random graph {seed}"), &g, &common::random_inputs(&g, seed));
    }
    for name in ["squeezenet", "inception_v1"] {
        let g = common::load(common::variant(name).join("model.onnx").to_str().unwrap(), Some(2));
        launches += check(name, &g, &common::random_inputs(&g, 3));
    }
    println!("{launches} launches checked");
}

/// Found in review: a clip with one bound (ONNX Clip with only `min`) has
/// an infinite other bound, which must print as valid CUDA C; a kernel
/// reading a view of a constant reads the constant's bytes in the weights
/// blob.
#[test]
fn infinite_bounds_and_views_of_constants() {
    let nvrtc = compiler();
    let src = "graph {\n  %0 \"x\" = input : f32[2,3]\n  %1 \"w\" = const : f32[6]\n  %2 = reshape(%1) {shape=[2,3]} : f32[2,3]\n  %3 = elementwise(%0, %2) {expr=\"clip(0.0,inf,add($0,$1))\"} : f32[2,3]\n  output \"y\" = %3\n}\n";
    let mut g = text::parse_kernel(src).unwrap();
    smelt::fill_missing_weights(&mut g);
    let id = g.outputs()[0].1.node;
    let d = Elementwise::of(&g, id).unwrap();
    assert!(d.cuda().contains("__int_as_float(0x7f800000)"), "{}", d.cuda());
    compile_and_snapshot(nvrtc.as_ref(), "clip_lower_bound_only", &d.name, &d.cuda());
    let plan = smelt_passes::memory::plan(&g).unwrap();
    let program = Program::build(&g, &plan, &Default::default()).unwrap();
    assert_eq!(program.steps[0].args[1].space, smelt_codegen::program::Space::Weights);
    let x = common::random_inputs(&g, 9);
    let got = program.run_cpu(&program.weights_blob(&g).unwrap(), &x).unwrap();
    let want = smelt_runtime::cpu::run(&g, &x).unwrap();
    assert!(smelt::compare(&got[0], &want[0], 0.0, 0.0).ok);
    // The same through a GEMM epilogue.
    let src = "graph {\n  %0 \"x\" = input : f32[3,4]\n  %1 \"w\" = input : f32[4,5]\n  %2 = fused_gemm(%0, %1) {trans_a=false, trans_b=false, alpha=1.0, beta=1.0, act=\"clip(0.0,inf)\"} : f32[3,5]\n  output \"y\" = %2\n}\n";
    let g = text::parse_kernel(src).unwrap();
    let m = Gemm::of(&g, g.outputs()[0].1.node).unwrap();
    if let Some(nv) = &nvrtc {
        nv.compile(&m.name, &m.cuda()).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Tensor-core tiles are chosen on the roofline of the GPU the model is
/// compiled for (`--device`): ResNet-50 at batch 32 (mixed-f16) compiled
/// for an A100, an L4 and an H200 is estimated on each no slower than the
/// H100's tiles would be there, and at least one of them takes other tiles
/// than the H100 and is faster for it.
#[test]
fn tiles_follow_the_target_gpu() {
    let program = |gpu: &str| {
        let precision = smelt_passes::precision::Options { policy: "mixed-f16".parse().unwrap(), ..Default::default() };
        let target = smelt_codegen::Target { gpu: smelt::cost::gpu(gpu).unwrap(), ..Default::default() };
        let options = smelt::Options { batch: Some(32), target, precision, ..Default::default() };
        let mut s = smelt::Session::open("zoo:resnet50", options).unwrap_or_else(|e| panic!("{e}"));
        let compiled = s.compile().unwrap_or_else(|e| panic!("{e}"));
        let planned = s.plan(&compiled).unwrap_or_else(|e| panic!("{e}"));
        s.program(&compiled, &planned).unwrap_or_else(|e| panic!("{e}"))
    };
    let tiles = |p: &Program| p.steps.iter().map(|s| s.kernel.tile()).collect::<Vec<_>>();
    let h100 = program("h100");
    let mut better = Vec::new();
    for name in ["a100", "l4", "h200"] {
        let gpu = smelt::cost::gpu(name).unwrap();
        let own = program(name);
        let (mine, theirs) = (smelt::roofline::report(&own, &gpu, &[]).seconds, smelt::roofline::report(&h100, &gpu, &[]).seconds);
        println!("{name}: {:.3} ms on its own tiles, {:.3} ms on the H100's", mine * 1e3, theirs * 1e3);
        assert!(mine <= theirs, "{name}: its tiles are estimated slower there than the H100's ({mine} s > {theirs} s)");
        if tiles(&own) != tiles(&h100) && mine < theirs {
            better.push(name);
        }
    }
    assert!(!better.is_empty(), "no GPU chose other tiles than the H100");
}

/// Pricing sees the program's tiles: for the model's choice and a pinned
/// tile, every tensor-core kernel of ResNet-50 (mixed-f16) has in the
/// program the tile `tiling::kernel_of` (what `cost::node_time` prices)
/// gives its node, and the pinned one where it is pinned.
#[test]
fn programs_take_the_tiles_pricing_assumes() {
    use smelt_codegen::{Target, TileChoice};
    for tiles in [TileChoice::Model, TileChoice::Every([128, 64])] {
        let target = Target { tiles: tiles.clone(), ..Default::default() };
        let precision = smelt_passes::precision::Options { policy: "mixed-f16".parse().unwrap(), ..Default::default() };
        let options = smelt::Options { batch: Some(8), target: target.clone(), precision, ..Default::default() };
        let mut s = smelt::Session::open("zoo:resnet50", options).unwrap_or_else(|e| panic!("{e}"));
        let compiled = s.compile().unwrap_or_else(|e| panic!("{e}"));
        let planned = s.plan(&compiled).unwrap_or_else(|e| panic!("{e}"));
        let program = s.program(&compiled, &planned).unwrap_or_else(|e| panic!("{e}"));
        let mut tiled = std::collections::BTreeSet::new();
        for step in &program.steps {
            let Some(t) = step.kernel.tile() else { continue };
            let priced = kernel_of(&compiled.graph, step.id, &target).and_then(|k| k.tile());
            assert_eq!(priced, Some(t), "{:?}: {}", tiles, step.kernel.name());
            if tiles != TileChoice::Model {
                assert_eq!([t.m, t.n], [128, 64], "{}", step.kernel.name());
            }
            tiled.insert([t.m, t.n]);
        }
        println!("{tiles:?}: tiles {tiled:?}");
        assert!(!tiled.is_empty(), "{tiles:?}: no tensor-core kernel");
    }
    // TF32 needs compute capability 8.0: every GPU `--device` knows but the V100.
    let without: Vec<&str> = smelt::cost::GPUS.iter().filter(|g| !g.has_tf32()).map(|g| g.name).collect();
    assert_eq!(without, ["v100"]);
}

/// One kernel of each kind not snapshotted above, compiled with NVRTC and
/// compared with its snapshot: fused attention on tensor cores, a GEMM on
/// tensor cores, a normalization by block, a selection (pad), and a
/// training step's convolution weight gradient and Adam update.
#[test]
fn attention_gemm_norm_select_grad_and_update_snapshots() {
    use smelt_ir::builder::Builder;
    use smelt_ir::{BinaryOp, Op};
    let nvrtc = compiler();
    let policy = |p: &str| smelt_passes::precision::Options { policy: p.parse().unwrap(), keep_f32: vec![], ..Default::default() };
    let kernels = |g: &Graph, options: smelt::Options| -> Vec<Kernel> {
        let k = common::session(g, options).compile().unwrap_or_else(|e| panic!("{e}")).graph;
        k.node_ids().filter_map(|id| kernel_of(&k, id, &Default::default())).collect()
    };
    let one = |ks: &[Kernel], what: &str, pred: &dyn Fn(&Kernel) -> bool| -> Kernel {
        ks.iter()
            .find(|k| pred(k))
            .cloned()
            .unwrap_or_else(|| panic!("no {what} kernel among {:?}", ks.iter().map(|k| k.name()).collect::<Vec<_>>()))
    };
    // Attention of 2 heads of 32, 40 queries, 50 keys, in f16.
    let mut b = Builder::new(11);
    let q = b.input("q", &[1, 2, 40, 32]).unwrap();
    let k = b.weight("k".into(), &[1, 2, 50, 32], |r| r.normal());
    let v = b.weight("v".into(), &[1, 2, 50, 32], |r| r.normal());
    let kt = b.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k]).unwrap();
    let s = b.op(Op::MatMul, &[q, kt]).unwrap();
    let scale = b.constant("scale".into(), Tensor::from_f32(vec![], vec![32f32.sqrt().recip()]));
    let s = b.op(Op::Binary(BinaryOp::Mul), &[s, scale]).unwrap();
    let p = b.softmax(s).unwrap();
    let y = b.op(Op::MatMul, &[p, v]).unwrap();
    let ks = kernels(&b.finish("y", y).unwrap(), smelt::Options { precision: policy("f16"), ..Default::default() });
    let attention = one(&ks, "attention", &|k| matches!(k, Kernel::Attention(a) if a.tc_rows.is_some()));
    // A linear layer on tensor cores, in f16.
    let mut b = Builder::new(12);
    let x = b.input("x", &[64, 96]).unwrap();
    let y = b.linear(x, 128).unwrap();
    let ks = kernels(&b.finish("y", y).unwrap(), smelt::Options { precision: policy("f16"), ..Default::default() });
    let gemm = one(&ks, "tensor-core GEMM", &|k| matches!(k, Kernel::Gemm(_)) && k.tensor_cores());
    // A layer norm of 768 (a block per row), then a pad (a selection).
    let mut b = Builder::new(13);
    let x = b.input("x", &[2, 5, 768]).unwrap();
    let scale = b.weight("scale".into(), &[768], |r| 1.0 + 0.1 * r.normal());
    let bias = b.weight("bias".into(), &[768], |r| 0.1 * r.normal());
    let n = b.op(Op::LayerNorm { axis: 2, epsilon: 1e-5 }, &[x, scale, bias]).unwrap();
    let y = b.op(Op::Pad { pads: vec![0, 1, 0, 0, 2, 0], mode: smelt_ir::PadMode::Constant(0.0) }, &[n]).unwrap();
    let ks = kernels(&b.finish("y", y).unwrap(), smelt::Options::default());
    let norm = one(&ks, "block normalization", &|k| matches!(k, Kernel::Reduction(r) if r.by_block()));
    let select = one(&ks, "selection", &|k| matches!(k, Kernel::Select(_)));
    // A training step (Adam, mixed-f16) of conv, relu, linear.
    let mut b = Builder::new(14);
    let x = b.input("x", &[4, 16, 8, 8]).unwrap();
    let y = b.conv(x, 32, 3, 1, 1).unwrap();
    let y = b.relu(y).unwrap();
    let y = b.op(Op::Flatten { axis: 1 }, &[y]).unwrap();
    let y = b.linear(y, 10).unwrap();
    let adam = common::adam(1, Default::default());
    let train = smelt_passes::train::TrainConfig {
        loss: smelt_passes::train::Loss::CrossEntropy { smoothing: 0.0 },
        loss_on: None,
        optimizer: Some(adam),
        freeze: vec![],
        only: vec![],
        batch_norm: Default::default(),
        clip_norm: None,
        loss_scale: false,
    };
    let ks =
        kernels(&b.finish("y", y).unwrap(), smelt::Options { train: Some(train), precision: policy("mixed-f16"), ..Default::default() });
    let grad = one(&ks, "conv weight gradient", &|k| matches!(k, Kernel::Grad(_)));
    let update = one(&ks, "Adam update", &|k| matches!(k, Kernel::Update(_)));
    for (name, k) in [
        ("kind_attention_tc", attention),
        ("kind_gemm_tc", gemm),
        ("kind_norm_by_block", norm),
        ("kind_select_pad", select),
        ("kind_grad_conv_weight", grad),
        ("kind_update_adam", update),
    ] {
        compile_and_snapshot(nvrtc.as_ref(), name, k.name(), &k.cuda());
    }
}

/// Code generation's modules import each other in one direction: the
/// describers below the kernel enum, the tile geometry and launch geometry
/// below the describers, the roofline model and the tile choice above them
/// (a pass over described kernels), the program on top. A `crate::` path
/// outside a comment is an edge: to a module (`crate::tile::Tile`, each
/// item of `crate::{a, b::C}`) or to what the crate root re-exports from
/// one (`crate::Kernel`). Any strongly connected set of modules fails,
/// naming them.
#[test]
fn codegen_modules_import_each_other_without_a_circle() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/codegen/src");
    let mut modules: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str().and_then(|n| n.strip_suffix(".rs")).map(String::from))
        .filter(|m| m != "lib")
        .collect();
    modules.sort();
    let code = |file: &str| -> String {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
    };
    let ident = |s: &str| -> String { s.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    // What the crate root re-exports, by name: `pub use kernel::{Kernel, Route};`.
    let mut reexports = std::collections::HashMap::new();
    for line in code("lib.rs").lines().filter_map(|l| l.trim().strip_prefix("pub use ")) {
        let (module, items) = line.split_once("::").unwrap_or((line, ""));
        for item in items.trim_end_matches(';').trim_matches(|c| c == '{' || c == '}').split(',') {
            reexports.insert(ident(item.rsplit("::").next().unwrap_or(item)), module.to_string());
        }
    }
    let deps: Vec<Vec<usize>> = modules
        .iter()
        .map(|m| {
            let code = code(&format!("{m}.rs"));
            let mut names = Vec::new();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + 7..];
                match rest.strip_prefix('{') {
                    Some(group) => {
                        let group = &group[..group.find('}').unwrap_or(group.len())];
                        names.extend(group.split(',').map(ident));
                    }
                    None => names.push(ident(rest)),
                }
            }
            let mut out: Vec<usize> = names
                .iter()
                .filter_map(|n| {
                    let module = if modules.contains(n) { n } else { reexports.get(n)? };
                    modules.iter().position(|k| k == module && k != m)
                })
                .collect();
            out.sort();
            out.dedup();
            out
        })
        .collect();
    for (m, d) in modules.iter().zip(&deps) {
        println!("{m} -> {}", d.iter().map(|&k| modules[k].as_str()).collect::<Vec<_>>().join(" "));
    }
    // A module is on a circle when it reaches itself.
    let reaches = |from: usize| {
        let (mut seen, mut stack) = (vec![false; modules.len()], deps[from].clone());
        while let Some(k) = stack.pop() {
            if !std::mem::replace(&mut seen[k], true) {
                stack.extend(&deps[k]);
            }
        }
        seen
    };
    let circle: Vec<&str> = (0..modules.len()).filter(|&m| reaches(m)[m]).map(|m| modules[m].as_str()).collect();
    assert!(circle.is_empty(), "codegen modules that import themselves through others: {circle:?}");
    assert!(deps[modules.iter().position(|m| m == "kernel").unwrap()].len() >= 10, "the parse found kernel.rs's describers");
}
