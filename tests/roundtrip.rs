//! The text format round-trips: print, parse, print gives the same text on
//! every light model, the zoo and random graphs; a parsed graph computes the
//! same numbers as the original.

mod common;

use smelt_ir::onnx::{import_file, ImportOptions};
use smelt_ir::{builder::Builder, text, zoo, BinaryOp, Graph, Op, Rng, UnaryOp, ValueId};

fn roundtrip(g: &Graph) -> Graph {
    let printed = text::print(g);
    let parsed = text::parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(text::print(&parsed), printed);
    parsed
}

/// Copies every constant's data from `from` by node id (ids survive the round trip).
fn copy_weights(from: &Graph, to: &mut Graph) {
    for id in from.node_ids() {
        if let Some(w) = from.weight(id) {
            to.set_weight(id, (**w).clone()).unwrap();
        }
    }
}

#[test]
fn light_models_roundtrip_and_compute_the_same() {
    for name in common::LIGHT {
        let g = import_file(&common::variant(name).join("model.onnx"), &ImportOptions::default()).unwrap();
        let mut parsed = roundtrip(&g);
        copy_weights(&g, &mut parsed);
        let input = smelt::dummy_input(&g, 0);
        let a = smelt_runtime::cpu::run(&g, std::slice::from_ref(&input)).unwrap();
        let b = smelt_runtime::cpu::run(&parsed, &[input]).unwrap();
        assert_eq!(a, b, "{name}: the parsed graph computes different numbers");
    }
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
        let g = random_graph(seed);
        let parsed = roundtrip(&g);
        assert_eq!(parsed.len(), g.len());
    }
}

pub fn random_graph(seed: u64) -> Graph {
    let mut r = Rng::new(seed);
    let mut b = Builder::new(seed);
    let c = 1 + r.below(4);
    let x = b.input("x", &[1 + r.below(2), c, 4 + r.below(5), 4 + r.below(5)]).unwrap();
    let mut vals: Vec<ValueId> = vec![x];
    for _ in 0..3 + r.below(10) {
        let v = vals[r.below(vals.len())];
        let ty = b.ty(v).clone();
        let out = match r.below(9) {
            0 => b.conv(v, 1 + r.below(4), 1 + 2 * r.below(2), 1 + r.below(2), r.below(2)),
            1 => b.batch_norm(v, 1.0),
            2 => b.relu(v),
            3 => b.op(Op::Unary([UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::LeakyRelu(0.1), UnaryOp::Exp][r.below(4)]), &[v]),
            4 => {
                // Broadcast against a per-channel constant.
                let k = b.weight(format!("k{}", r.next_u64()), &[ty.shape[1], 1, 1], |r| r.normal());
                b.op(Op::Binary([BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub, BinaryOp::Max][r.below(4)]), &[v, k])
            }
            5 if ty.shape.len() == 4 && ty.shape[2] >= 3 => b.max_pool(v, 2, 1 + r.below(2), r.below(2)),
            6 => {
                let w = vals.iter().copied().find(|&w| w != v && b.ty(w).shape == ty.shape);
                match w {
                    Some(w) => b.op(Op::Concat { axis: 1 }, &[v, w]),
                    None => b.op(Op::Clip { min: -1.0, max: 1.5 }, &[v]),
                }
            }
            7 => b.op(Op::Flatten { axis: 1 }, &[v]),
            _ => b.op(Op::Softmax { axis: ty.shape.len() - 1 }, &[v]),
        };
        // Ops that do not fit the chosen value (a conv on a flattened one) are skipped.
        if let Ok(o) = out {
            vals.push(o);
        }
    }
    let last = *vals.last().unwrap();
    b.finish("y", last).unwrap()
}
