//! Memory plans: the independent checker accepts every plan of every light
//! model (batch 1 and 8, with and without fusion) and of random graphs, and
//! rejects corrupted plans; fusion never raises the arena; the arena stays
//! within 2% of the schedule's lower bound.

mod common;

use smelt_ir::onnx::{import_file, ImportOptions};
use smelt_ir::{Graph, KernelGraph};
use smelt_passes::memory::{check::check, plan, Plan};

fn compiled(g: &Graph, fuse: bool) -> KernelGraph {
    common::compiled(g, fuse)
}

fn planned(g: &KernelGraph, what: &str) -> Plan {
    let p = plan(g).unwrap();
    check(g, &p).unwrap_or_else(|e| panic!("{what}: checker rejected the plan: {e}"));
    p
}

#[test]
fn light_models_plans_check_and_meet_targets() {
    for name in common::LIGHT {
        for batch in [1, 8] {
            let g = import_file(&common::light_model(name), &ImportOptions { batch: Some(batch), ..Default::default() }).unwrap();
            // The driver plans as the CLI does (the unfused schedule as the
            // fused plan's hint) and checks both plans; check again here.
            let mut s = common::session(&g, Default::default());
            let c = s.compile().unwrap();
            let smelt::Planned { plan: fused, unfused, unfused_plan: plain } = s.plan(&c).unwrap();
            let fused_graph = c.graph;
            for (graph, p, what) in [(&unfused, &plain, "unfused"), (&fused_graph, &fused, "fused")] {
                check(graph, p).unwrap_or_else(|e| panic!("{name} b{batch} {what}: checker rejected the plan: {e}"));
            }
            for (p, what) in [(&plain, "unfused"), (&fused, "fused")] {
                let ratio = p.arena as f64 / p.lower_bound as f64;
                assert!(ratio <= 1.02, "{name} b{batch} {what}: arena {} is {ratio:.4} x the lower bound {}", p.arena, p.lower_bound);
            }
            assert!(fused.arena <= plain.arena, "{name} b{batch}: fusion raised the arena from {} to {}", plain.arena, fused.arena);
        }
    }
}

#[test]
fn random_graph_plans_check() {
    for seed in 0..200 {
        let g = common::random_graph(seed);
        planned(&g.lift(), &format!("seed {seed}"));
        planned(&compiled(&g, true), &format!("seed {seed} fused"));
        // Every kernel kind, several outputs.
        let g = common::random_kernel_graph(seed);
        planned(&g.lift(), &format!("kernel-kind seed {seed}"));
        planned(&compiled(&g, true), &format!("kernel-kind seed {seed} fused"));
    }
}

/// The checker is not a rubber stamp: moving any buffer onto another one
/// that is live at the same time, or swapping in a wrong schedule, fails.
#[test]
fn checker_rejects_corrupted_plans() {
    let g = compiled(&import_file(&common::light_model("squeezenet"), &ImportOptions::default()).unwrap(), true);
    let good = planned(&g, "squeezenet");
    let mut rejected = 0;
    let mut tried = 0;
    for (i, a) in good.buffers.iter().enumerate() {
        // A buffer live at the same time as `a`, placed elsewhere.
        let Some(b) = good.buffers.iter().find(|b| b.id != a.id && b.start <= a.end && a.start <= b.end && b.offset != a.offset) else {
            continue;
        };
        let mut bad = good.clone();
        let shift = b.offset as isize - a.offset as isize;
        for v in &a.values {
            let p = bad.placements.get_mut(v).unwrap();
            p.intervals.iter_mut().for_each(|iv| *iv = ((iv.0 as isize + shift) as usize, (iv.1 as isize + shift) as usize));
        }
        tried += 1;
        rejected += check(&g, &bad).is_err() as usize;
        if i > 40 {
            break;
        }
    }
    assert!(tried > 10 && rejected == tried, "{rejected} of {tried} corrupted plans rejected");
    // A schedule with two adjacent nodes swapped so that one runs before
    // its operand (the first such pair past the middle).
    let k = (good.schedule.len() / 2..good.schedule.len() - 1)
        .find(|&k| g.inputs_of(good.schedule[k + 1]).iter().any(|v| v.node == good.schedule[k]))
        .expect("a node that reads the one scheduled before it");
    let mut bad = good.clone();
    bad.schedule.swap(k, k + 1);
    let e = check(&g, &bad).expect_err("a node before its operand");
    assert!(e.contains("runs before its operand"), "{e}");
    // An arena too small for its placements.
    let mut small = good.clone();
    small.arena /= 2;
    assert!(check(&g, &small).is_err());
}

/// One corruption per rule of the checker, each rejected with its own
/// message: a view placed off its source, a shifted slice of an in-place
/// concatenation, a value off its element alignment, a buffer off the plan's
/// alignment, and a kernel whose output is placed over an operand it reads.
#[test]
fn checker_names_each_kind_of_corruption() {
    use smelt_ir::builder::Builder;
    use smelt_ir::{KernelOp, Op, OpSet};
    let mut b = Builder::new(3);
    let x = b.input("x", &[1, 4, 6, 6]).unwrap();
    let a = b.conv(x, 8, 3, 1, 1).unwrap();
    let c = b.conv(x, 8, 1, 1, 0).unwrap();
    let cat = b.op(Op::Concat { axis: 1 }, &[a, c]).unwrap();
    let s = b.op(Op::Unary(smelt_ir::UnaryOp::Sigmoid), &[cat]).unwrap();
    let f = b.op(Op::Flatten { axis: 1 }, &[s]).unwrap();
    let y = b.linear(f, 10).unwrap();
    let g = compiled(&b.finish("y", y).unwrap(), true);
    let good = planned(&g, "corruption test graph");
    check(&g, &good).unwrap();
    let node = |pred: &dyn Fn(&KernelOp) -> bool| g.node_ids().find(|&n| pred(&g.node(n).op)).expect("the graph has such a node");
    let value = |n| smelt_ir::ValueId { node: n, slot: 0 };
    let shifted = |v: smelt_ir::ValueId, by: usize| {
        let mut bad = good.clone();
        bad.placements.get_mut(&v).unwrap().intervals.iter_mut().for_each(|iv| *iv = (iv.0 + by, iv.1 + by));
        bad.arena += by;
        bad
    };
    let expect = |bad: &Plan, what: &str| {
        let e = check(&g, bad).expect_err(what);
        assert!(e.contains(what), "expected \"{what}\", got: {e}");
    };
    let view = node(&|op| op.is_view());
    expect(&shifted(value(view), 256), "is not placed on its source");
    let concat = node(&|op| matches!(op, KernelOp::ConcatInPlace { .. }));
    assert!(!good.copied_concats.contains(&concat), "the concatenation should be in place");
    expect(&shifted(g.inputs_of(concat)[1], 4), "is not placed on its slice of");
    let sigmoid = g.inputs_of(view)[0];
    expect(&shifted(sigmoid, 2), "not a multiple of its element size");
    let mut off = good.clone();
    off.buffers[0].offset += 16;
    expect(&off, "not a multiple of 256");
    // The GEMM's output over its (flattened) operand, which it reads.
    let gemm = node(&|op| matches!(op, KernelOp::Op(Op::Gemm { .. }) | KernelOp::FusedGemm { .. }));
    let mut over = good.clone();
    let at = over.placements[&sigmoid].intervals[0].0;
    let bytes = g.ty(value(gemm)).bytes();
    over.placements.get_mut(&value(gemm)).unwrap().intervals = vec![(at, at + bytes)];
    let e = check(&g, &over).expect_err("an output over its operand");
    assert!(e.contains("overwrites its operand"), "{e}");
}
