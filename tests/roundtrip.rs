//! The text format round-trips: print, parse, print gives the same text on
//! every light model, the zoo and random graphs; a parsed graph computes the
//! same numbers as the original.

mod common;

use smelt_ir::onnx::{import_file, ImportOptions};
use smelt_ir::{text, zoo, Graph, OpSet};
use smelt_runtime::cpu::Eval;

fn roundtrip<O: OpSet>(g: &Graph<O>) -> Graph<O> {
    let printed = text::print(g);
    let parsed = text::parse_as::<O>(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(text::print(&parsed), printed);
    parsed
}

/// Copies every constant's data from `from` by node id (ids survive the round trip).
fn copy_weights<O: OpSet>(from: &Graph<O>, to: &mut Graph<O>) {
    for id in from.node_ids() {
        if let Some(w) = from.weight(id) {
            to.set_weight(id, (**w).clone()).unwrap();
        }
    }
}

#[test]
fn light_models_roundtrip_and_compute_the_same() {
    for name in common::LIGHT {
        let imported = import_file(&common::variant(name).join("model.onnx"), &ImportOptions::default()).unwrap();
        let fused = common::compiled(&imported, true);
        // Both the imported graph and the fused one (fused ops print and parse too).
        same_after_roundtrip(name, &imported);
        same_after_roundtrip(name, &fused);
    }
}

fn same_after_roundtrip<O: Eval>(name: &str, g: &Graph<O>) {
    let mut parsed = roundtrip(g);
    copy_weights(g, &mut parsed);
    let input = smelt::dummy_input(g, 0);
    let a = smelt_runtime::cpu::run(g, std::slice::from_ref(&input)).unwrap();
    let b = smelt_runtime::cpu::run(&parsed, &[input]).unwrap();
    assert_eq!(a, b, "{name}: the parsed graph computes different numbers");
}

#[test]
fn zoo_roundtrips() {
    for name in zoo::NAMES {
        roundtrip(&zoo::get(name, 2).unwrap());
    }
}

/// Random graphs of convs, pools, elementwise ops with broadcasting, concat,
/// split and reshapes: the text round-trips exactly.
#[test]
fn random_graphs_roundtrip() {
    for seed in 0..200 {
        let g = common::random_graph(seed);
        let parsed = roundtrip(&g);
        assert_eq!(parsed.len(), g.len());
    }
}

/// A kernel-level `gemm_epilogue` whose shape overflows is an error, not a
/// panic in the element count.
#[test]
fn gemm_epilogue_shapes_are_checked() {
    let text = "graph {\n  %0 \"a\" = input : f32[4,8]\n  %1 \"b\" = input : f32[8,6]\n  \
                %2 = gemm_epilogue(%0, %1) {expr=\"relu($0)\", shape=[4294967296,4294967296,16], product=\"matmul\"} : f32[24]\n  \
                output \"y\" = %2\n}\n";
    let err = smelt_ir::text::parse_as::<smelt_ir::KernelOp>(text).unwrap_err().to_string();
    assert!(err.contains("cannot be read as shape"), "{err}");
}
