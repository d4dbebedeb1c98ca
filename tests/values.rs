//! Value kinds: graph inputs, constants, trainable parameters and state.
//! Parameters and state are persistent like constants (outside the arena,
//! in the weights blob) but change between steps, so no pass folds them
//! into anything or converts a copy of them.

mod common;

use smelt_ir::{text, KernelOp, Op, OpSet};

/// A conv whose weight is a parameter, then a batch norm whose scale and
/// shift are parameters and whose running statistics are state.
const MODEL: &str = "graph {
  %0 \"x\" = input : f32[1,3,6,6]
  %1 \"conv.w\" = param : f32[4,3,3,3]
  %2 \"conv\" = conv(%0, %1) {strides=[1,1], pads=[1,1,1,1], dilations=[1,1], group=1} : f32[1,4,6,6]
  %3 \"bn.scale\" = param : f32[4]
  %4 \"bn.bias\" = param : f32[4]
  %5 \"bn.mean\" = state : f32[4] = [0.1,-0.2,0.3,0.0]
  %6 \"bn.var\" = state : f32[4] = [1.0,0.5,2.0,1.5]
  %7 \"bn\" = batch_norm(%2, %3, %4, %5, %6) {epsilon=1e-5} : f32[1,4,6,6]
  %8 \"relu\" = relu(%7) : f32[1,4,6,6]
  output \"y\" = %8
}
";

fn model() -> smelt_ir::Graph {
    let mut g = text::parse(MODEL).unwrap();
    assert_eq!(smelt::fill_missing_weights(&mut g), 3, "the three parameters without data get values");
    g
}

#[test]
fn parameters_and_state_print_parse_and_run() {
    let g = model();
    let printed = text::print(&g);
    assert!(printed.contains("\"conv.w\" = param : f32[4,3,3,3]") && printed.contains("\"bn.mean\" = state : f32[4] = [0.1,-0.2,0.3,0.0]"));
    assert_eq!(text::print(&text::parse(&printed).unwrap()), printed);
    // Persistent names are unique across kinds, and only persistent values take data.
    let dup = MODEL.replace("\"bn.bias\" = param", "\"bn.scale\" = state");
    assert!(text::parse(&dup).unwrap_err().to_string().contains("used twice"));
    let bad = MODEL.replace("%0 \"x\" = input : f32[1,3,6,6]", "%0 \"x\" = input : f32[1,3,6,6] = [1.0]");
    assert!(text::parse(&bad).is_err());
    assert_eq!(g.weight_bytes(), (4 * 3 * 3 * 3 + 4 * 4) * 4);
}

#[test]
fn fusion_never_folds_a_parameter_and_the_numbers_hold() {
    let g = model();
    let x = common::random_inputs(&g, 5);
    let want = smelt_runtime::cpu::run(&g, &x).unwrap();
    // The same model with constants: fusion folds the batch norm into the conv.
    let mut frozen = text::parse(&text::print(&g).replace("= param", "= const").replace("= state", "= const")).unwrap();
    for id in g.node_ids() {
        if let Some(w) = g.weight(id) {
            frozen.set_weight(id, (**w).clone()).unwrap();
        }
    }
    let folded = common::compiled(&frozen, true);
    assert!(folded.node_ids().all(|n| folded.node(n).op != KernelOp::Op(Op::BatchNorm { epsilon: 1e-5 })));
    assert!(!folded.node_ids().any(|n| folded.node(n).op.semantic() == Some(&Op::Parameter)));
    // With parameters, the conv still reads the parameter itself and every
    // parameter and state node survives, unconverted.
    let mut s = common::session(&g, Default::default());
    let compiled = s.compile().unwrap();
    let k = compiled.graph.clone();
    let kinds = |op: Op| k.node_ids().filter(|&n| k.node(n).op.semantic() == Some(&op)).count();
    assert_eq!((kinds(Op::Parameter), kinds(Op::State)), (3, 2), "{}", text::print(&k));
    let conv = k.node_ids().find(|&n| k.node(n).name == "conv").unwrap();
    let w = k.inputs_of(conv)[1];
    assert_eq!((k.node(w.node).name.as_str(), k.node(w.node).op.semantic()), ("conv.w", Some(&Op::Parameter)));
    for graph in [&k, &folded] {
        let got = smelt_runtime::cpu::run(graph, &x).unwrap();
        let c = smelt::compare(&got[0], &want[0], 1e-4, 1e-5);
        assert!(c.ok, "{c:?}\n{}", text::print(graph));
    }
    // A batch norm over parameters is not folded: it runs as its own
    // kernel, reading the parameters from the weights blob.
    let planned = s.plan(&compiled).unwrap();
    let program = s.program(&compiled, &planned).unwrap();
    assert!(program.steps.iter().any(|st| st.node == "bn" && st.kernel.name().starts_with("bn_")));
    let got = program.run_cpu(&program.weights_blob(&k).unwrap(), &x).unwrap();
    let c = smelt::compare(&got[0], &want[0], 1e-4, 1e-5);
    assert!(c.ok, "{c:?}");
    // Without it: planned outside the arena, laid out in the weights blob,
    // run as a program.
    let src = MODEL.replace("%7 \"bn\" = batch_norm(%2, %3, %4, %5, %6) {epsilon=1e-5}", "%7 \"bn\" = add(%2, %1)");
    let src =
        src.replace("%1 \"conv.w\" = param : f32[4,3,3,3]", "%1 \"conv.w\" = param : f32[4,3,3,3]\n  %9 \"b\" = param : f32[1,4,6,6]");
    let src = src.replace("add(%2, %1)", "add(%2, %9)");
    let mut g = text::parse(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    smelt::fill_missing_weights(&mut g);
    let want = smelt_runtime::cpu::run(&g, &x).unwrap();
    let mut s = common::session(&g, Default::default());
    let compiled = s.compile().unwrap();
    let planned = s.plan(&compiled).unwrap();
    let program = s.program(&compiled, &planned).unwrap();
    assert!(program.weights.iter().any(|w| w.name == "conv.w") && program.weights.iter().any(|w| w.name == "b"));
    let got = program.run_cpu(&program.weights_blob(&compiled.graph).unwrap(), &x).unwrap();
    let c = smelt::compare(&got[0], &want[0], 1e-4, 1e-5);
    assert!(c.ok, "{c:?}");
}

#[test]
fn reduced_precision_casts_a_parameter_where_it_is_read() {
    let g = model();
    let opts = smelt::Options {
        precision: smelt_passes::precision::Options { policy: "f16".parse().unwrap(), keep_f32: vec![], ..Default::default() },
        ..Default::default()
    };
    let c = common::session(&g, opts).compile().unwrap();
    let k = c.graph;
    // The parameter stays one f32 tensor (no converted copy that a step
    // would leave stale); a cast reads it.
    let w = k.node_ids().find(|&n| k.node(n).name == "conv.w").unwrap();
    assert_eq!(k.node(w).outputs[0].dtype, smelt_ir::DType::F32);
    assert!(!k.node_ids().any(|n| k.node(n).name.starts_with("conv.w.f16")), "{}", text::print(&k));
    assert!(k.users_of(w).iter().all(|&u| matches!(k.node(u).op, KernelOp::Op(Op::Cast { .. }) | KernelOp::Elementwise { .. })));
    assert_eq!(c.stats.precision.unwrap().weights_converted, 0);
}
