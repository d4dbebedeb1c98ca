//! Cases found in review: each compiles, plans (checked) and computes the
//! same numbers fused as unfused.

mod common;

use smelt_ir::text;
use smelt_passes::memory::{check::check, plan};

/// Parses, fuses, plans and checks both graphs, and compares their numbers.
fn roundtrip_numbers(src: &str) {
    let mut g = text::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    smelt::fill_missing_weights(&mut g);
    let f = common::compiled(&g, true);
    for graph in [&g.lift(), &f] {
        let p = plan(graph).unwrap();
        check(graph, &p).unwrap_or_else(|e| panic!("{e}\n{}", text::print(graph)));
    }
    let ins = common::random_inputs(&g, 3);
    let a = smelt_runtime::cpu::run(&g, &ins).unwrap();
    let b = smelt_runtime::cpu::run(&f, &ins).unwrap();
    for (x, y) in common::paired(&b, &a) {
        assert_eq!(x.shape(), y.shape(), "{}", text::print(&f));
        let c = smelt::compare(x, y, 1e-3, 1e-4);
        assert!(c.ok, "{c:?}\n{}", text::print(&f));
    }
}

#[test]
fn channel_mul_that_broadcasts_the_conv_output_is_not_folded() {
    roundtrip_numbers(
        "graph {\n  %0 \"x\" = input : f32[1,3,8,8]\n  %1 \"w\" = const : f32[1,3,3,3]\n  %2 \"k\" = const : f32[1,5,1,1] = [1.0,2.0,3.0,4.0,5.0]\n  %3 = conv(%0, %1) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1} : f32[1,1,6,6]\n  %4 = mul(%3, %2) : f32[1,5,6,6]\n  output \"y\" = %4\n}\n",
    );
}

#[test]
fn rank_raising_scalar_mul_does_not_panic() {
    roundtrip_numbers(
        "graph {\n  %0 \"x\" = input : f32[1,3,6,6]\n  %1 \"w\" = const : f32[4,3,3,3]\n  %2 \"k\" = const : f32[1,1,1,1,1] = [2.0]\n  %3 = conv(%0, %1) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1} : f32[1,4,4,4]\n  %4 = mul(%3, %2) : f32[1,1,4,4,4]\n  output \"y\" = %4\n}\n",
    );
}

#[test]
fn nested_in_place_concats_keep_their_slices_apart() {
    roundtrip_numbers(
        "graph {\n  %0 \"x\" = input : f32[1,2,4,4]\n  %1 \"w1\" = const : f32[4,2,1,1]\n  %2 \"w2\" = const : f32[4,2,1,1]\n  %3 \"w3\" = const : f32[8,2,1,1]\n  %4 = conv(%0, %1) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1} : f32[1,4,4,4]\n  %5 = conv(%0, %2) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1} : f32[1,4,4,4]\n  %6 = concat(%4, %5) {axis=1} : f32[1,8,4,4]\n  %7 = tanh(%6) : f32[1,8,4,4]\n  %8 = conv(%0, %3) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1} : f32[1,8,4,4]\n  %9 = concat(%7, %8) {axis=1} : f32[1,16,4,4]\n  output \"y\" = %9\n}\n",
    );
}

#[test]
fn f16_batch_norm_with_f32_parameters_fuses() {
    roundtrip_numbers(
        "graph {\n  %0 \"x\" = input : f16[1,2,3,3]\n  %1 \"s\" = const : f32[2] = [1.0,2.0]\n  %2 \"b\" = const : f32[2] = [0.5,-0.5]\n  %3 \"m\" = const : f32[2] = [0.0,0.1]\n  %4 \"v\" = const : f32[2] = [1.0,4.0]\n  %5 = batch_norm(%0, %1, %2, %3, %4) {epsilon=1e-5} : f16[1,2,3,3]\n  %6 = relu(%5) : f16[1,2,3,3]\n  output \"y\" = %6\n}\n",
    );
}

/// A kernel graph written by hand (in-place concatenation is a kernel-level
/// op): it plans (checked) and computes what the same graph with plain
/// concatenations computes.
#[test]
fn hand_written_in_place_concat_of_a_constant_or_a_repeated_value_plans_as_a_copy() {
    let src = "graph {\n  %0 \"x\" = input : f32[1,2,2,2]\n  %1 \"k\" = const : f32[1,2,2,2]\n  %2 = relu(%0) : f32[1,2,2,2]\n  %3 = concat_in_place(%2, %1) {axis=1} : f32[1,4,2,2]\n  %4 = concat_in_place(%3, %3) {axis=1} : f32[1,8,2,2]\n  %5 = concat_in_place(%0, %2) {axis=1} : f32[1,4,2,2]\n  output \"y\" = %4\n  output \"z\" = %5\n}\n";
    let mut k = text::parse_kernel(src).unwrap();
    smelt::fill_missing_weights(&mut k);
    let p = plan(&k).unwrap();
    check(&k, &p).unwrap_or_else(|e| panic!("{e}\n{}", text::print(&k)));
    let mut g = text::parse(&src.replace("concat_in_place", "concat")).unwrap();
    smelt::fill_missing_weights(&mut g);
    let ins = common::random_inputs(&g, 3);
    let (a, b) = (smelt_runtime::cpu::run(&g, &ins).unwrap(), smelt_runtime::cpu::run(&k, &ins).unwrap());
    assert_eq!(a, b);
}
