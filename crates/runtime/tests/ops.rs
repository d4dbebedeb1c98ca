//! Ops the model suites exercise little, checked against values computed by
//! hand (or by numpy, noted). Each case is a text-IR graph with inline inputs.

use smelt_ir::{text, Tensor};

/// Parses `src`, runs it with `inputs`, compares output 0 with `want`.
fn check(src: &str, inputs: &[Tensor], want: &[f32]) {
    let g = text::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let out = smelt_runtime::cpu::run(&g, inputs).unwrap();
    let got = out[0].to_f32_vec();
    assert_eq!(got.len(), want.len(), "{src}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "element {i}: got {got:?}, want {want:?}\n{src}");
    }
}

fn x(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(shape, v.to_vec())
}

#[test]
fn layer_norm_normalises_the_last_axis() {
    let src = "graph {\n  %0 \"x\" = input : f32[2,2]\n  %1 \"s\" = const : f32[2] = [1.0,2.0]\n  %2 \"b\" = const : f32[2] = [0.0,1.0]\n  %3 = layer_norm(%0, %1, %2) {axis=1, epsilon=0.0} : f32[2,2]\n  output \"y\" = %3\n}\n";
    check(src, &[x(&[2, 2], &[1.0, 3.0, 4.0, 8.0])], &[-1.0, 3.0, -1.0, 3.0]);
}

#[test]
fn slice_with_negative_step() {
    let src = "graph {\n  %0 \"x\" = input : f32[5]\n  %1 = slice(%0) {axes=[0], starts=[4], ends=[-1], steps=[-2]} : f32[3]\n  output \"y\" = %1\n}\n";
    check(src, &[x(&[5], &[0.0, 1.0, 2.0, 3.0, 4.0])], &[4.0, 2.0, 0.0]);
}

#[test]
fn split_gives_each_part() {
    let src =
        "graph {\n  %0 \"x\" = input : f32[2,3]\n  %1 = split(%0) {axis=1, sizes=[1,2]} : f32[2,1], f32[2,2]\n  output \"a\" = %1:1\n}\n";
    check(src, &[x(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])], &[1.0, 2.0, 4.0, 5.0]);
}

#[test]
fn reduce_mean_over_two_axes() {
    let src =
        "graph {\n  %0 \"x\" = input : f32[2,2,2]\n  %1 = reduce_mean(%0) {axes=[0,2], keepdims=false} : f32[2]\n  output \"y\" = %1\n}\n";
    check(src, &[x(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])], &[3.5, 5.5]);
}

#[test]
fn log_softmax_and_erf() {
    // numpy: log_softmax([0, 1, 2]) = [-2.4076059, -1.4076059, -0.4076059]
    let src = "graph {\n  %0 \"x\" = input : f32[3]\n  %1 = log_softmax(%0) {axis=0} : f32[3]\n  output \"y\" = %1\n}\n";
    check(src, &[x(&[3], &[0.0, 1.0, 2.0])], &[-2.407_606, -1.407_606, -0.407_606]);
    // math.erf(0.3) = 0.32862676, math.erf(-1.5) = -0.96610515
    let src = "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = erf(%0) : f32[2]\n  output \"y\" = %1\n}\n";
    check(src, &[x(&[2], &[0.3, -1.5])], &[0.328_626_76, -0.966_105_15]);
}

#[test]
fn gemm_with_transposes_and_matmul_broadcast() {
    // a^T [2x2] @ b^T [2x1] * 2 + 1: a = [[1,2],[3,4]] -> a^T = [[1,3],[2,4]]; b = [[1,1]]
    let src = "graph {\n  %0 \"a\" = input : f32[2,2]\n  %1 \"b\" = input : f32[1,2]\n  %2 \"c\" = const : f32[] = [1.0]\n  %3 = gemm(%0, %1, %2) {trans_a=true, trans_b=true, alpha=2.0, beta=1.0} : f32[2,1]\n  output \"y\" = %3\n}\n";
    check(src, &[x(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), x(&[1, 2], &[1.0, 1.0])], &[9.0, 13.0]);
    // [2,1,2] @ [2,1] broadcasts the batch: each row dotted with [1,2].
    let src = "graph {\n  %0 \"a\" = input : f32[2,1,2]\n  %1 \"b\" = input : f32[2,1]\n  %2 = matmul(%0, %1) : f32[2,1,1]\n  output \"y\" = %2\n}\n";
    check(src, &[x(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]), x(&[2, 1], &[1.0, 2.0])], &[5.0, 11.0]);
}

#[test]
fn average_pool_counts_padding_only_when_asked() {
    let base = "graph {\n  %0 \"x\" = input : f32[1,1,2,2]\n  %1 = avg_pool(%0) {kernel=[2,2], strides=[1,1], pads=[1,1,0,0], ceil_mode=false, count_include_pad=CIP} : f32[1,1,2,2]\n  output \"y\" = %1\n}\n";
    let input = x(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    check(&base.replace("CIP", "false"), std::slice::from_ref(&input), &[1.0, 1.5, 2.0, 2.5]);
    check(&base.replace("CIP", "true"), &[input], &[0.25, 0.75, 1.0, 2.5]);
}

#[test]
fn f16_results_are_rounded_to_half() {
    let src = "graph {\n  %0 \"x\" = input : f16[1]\n  %1 \"y\" = const : f16[1] = [0.0001]\n  %2 = add(%0, %1) : f16[1]\n  output \"z\" = %2\n}\n";
    let one = Tensor::from_f32([1], vec![1.0]).cast(smelt_ir::DType::F16);
    // 1 + 0.0001 rounds back to 1 in f16 (spacing 2^-10 near 1).
    check(src, &[one], &[1.0]);
}

#[test]
fn pad_reflect_edge_constant() {
    let base = "graph {\n  %0 \"x\" = input : f32[3]\n  %1 = pad(%0) {pads=[2,1], MODE} : f32[6]\n  output \"y\" = %1\n}\n";
    let input = x(&[3], &[1.0, 2.0, 3.0]);
    check(&base.replace("MODE", "mode=\"reflect\""), std::slice::from_ref(&input), &[3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
    check(&base.replace("MODE", "mode=\"edge\""), std::slice::from_ref(&input), &[1.0, 1.0, 1.0, 2.0, 3.0, 3.0]);
    check(&base.replace("MODE", "mode=\"constant\", value=-1.0"), &[input], &[-1.0, -1.0, 1.0, 2.0, 3.0, -1.0]);
}

#[test]
fn expand_and_tile() {
    let src = "graph {\n  %0 \"x\" = input : f32[2,1]\n  %1 = expand(%0) {shape=[2,2,3]} : f32[2,2,3]\n  output \"y\" = %1\n}\n";
    check(src, &[x(&[2, 1], &[1.0, 2.0])], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    let src = "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = tile(%0) {repeats=[3]} : f32[6]\n  output \"y\" = %1\n}\n";
    check(src, &[x(&[2], &[1.0, 2.0])], &[1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
}

#[test]
fn gather_embedding_and_out_of_range_index() {
    let src = "graph {\n  %0 \"ids\" = input : i64[3]\n  %1 \"table\" = const : f32[4,2] = [0.0,0.5,1.0,1.5,2.0,2.5,3.0,3.5]\n  %2 = gather(%1, %0) {axis=0} : f32[3,2]\n  output \"y\" = %2\n}\n";
    check(src, &[Tensor::from_i64([3], vec![3, 0, -1])], &[3.0, 3.5, 0.0, 0.5, 3.0, 3.5]);
    let g = text::parse(src).unwrap();
    let e = smelt_runtime::cpu::run(&g, &[Tensor::from_i64([3], vec![0, 4, 1])]).unwrap_err();
    assert!(e.to_string().contains("index 4 out of range for axis 0 of extent 4"), "{e}");
}
