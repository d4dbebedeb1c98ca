//! Bad input gets a clear error naming the node and what is wrong, never a
//! panic: truncated and garbled bytes of every light model, unsupported ops,
//! shape mismatches, absurd sizes, malformed text.

mod common;

use smelt_ir::onnx::{import, ImportOptions};
use smelt_ir::{text, IrError, Rng};
use smelt_onnx_proto::{
    tensor_shape_proto::dimension::Value as Dim, type_proto, AttributeProto, GraphProto, Message, ModelProto, NodeProto,
    OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// Importing must return (Ok or Err), never panic; a graph it returns is verified.
fn import_never_panics(bytes: &[u8], what: &str) -> Result<(), String> {
    let r = std::panic::catch_unwind(|| import(bytes, &ImportOptions::default()).map(|_| ()).map_err(|e| e.to_string()));
    r.unwrap_or_else(|_| panic!("import panicked on {what}"))
}

#[test]
fn truncated_light_models_are_errors() {
    for name in common::LIGHT {
        let bytes = std::fs::read(common::light_model(name)).unwrap();
        for cut in [0, 1, 2, 10, 100, bytes.len() / 3, bytes.len() / 2, bytes.len() * 9 / 10, bytes.len() - 1] {
            let r = import_never_panics(&bytes[..cut], &format!("{name} cut at {cut}"));
            assert!(r.is_err(), "{name} truncated to {cut} bytes imported without error");
        }
    }
}

#[test]
fn garbled_light_models_never_panic() {
    let mut errors = 0;
    let mut total = 0;
    for name in common::LIGHT {
        let orig = std::fs::read(common::light_model(name)).unwrap();
        for seed in 0..12 {
            let mut r = Rng::new(seed);
            let mut bytes = orig.clone();
            // Garble a run of bytes in the graph structure (the first part of
            // the file holds nodes and shapes, not weights).
            let at = r.below(orig.len().min(200_000));
            for b in bytes.iter_mut().skip(at).take(1 + r.below(64)) {
                *b = r.next_u64() as u8;
            }
            errors += import_never_panics(&bytes, &format!("{name} garbled with seed {seed}")).is_err() as usize;
            total += 1;
        }
    }
    println!("{errors} of {total} garbled models were rejected with an error, the rest imported and verified");
    assert!(errors > 0);
}

fn tensor_input(name: &str, dims: &[i64]) -> ValueInfoProto {
    let shape = TensorShapeProto {
        dim: dims
            .iter()
            .map(|&d| smelt_onnx_proto::tensor_shape_proto::Dimension { value: Some(Dim::DimValue(d)), ..Default::default() })
            .collect(),
    };
    let tt = type_proto::Tensor { elem_type: Some(1), shape: Some(shape) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(tt)), ..Default::default() }),
        ..Default::default()
    }
}

fn model(inputs: Vec<ValueInfoProto>, nodes: Vec<NodeProto>, output: &str) -> Vec<u8> {
    let graph = GraphProto {
        node: nodes,
        input: inputs,
        output: vec![ValueInfoProto { name: Some(output.into()), ..Default::default() }],
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn import_err(bytes: &[u8]) -> String {
    import(bytes, &ImportOptions::default()).map(|_| ()).unwrap_err().to_string()
}

#[test]
fn unsupported_op_names_op_node_and_opset() {
    let m = model(vec![tensor_input("x", &[1, 4])], vec![node("NonMaxSuppression", "nms_1", &["x"], &["y"], vec![])], "y");
    let e = import_err(&m);
    assert_eq!(e, "unsupported op NonMaxSuppression (opset 17) in node \"nms_1\"");
}

#[test]
fn shape_mismatch_names_the_node() {
    let m = model(vec![tensor_input("a", &[2, 3]), tensor_input("b", &[4])], vec![node("Add", "add_7", &["a", "b"], &["y"], vec![])], "y");
    let e = import_err(&m);
    assert!(e.contains("\"add_7\" (Add)") && e.contains("do not broadcast"), "{e}");
}

#[test]
fn absurd_sizes_are_refused() {
    let m = model(vec![tensor_input("x", &[1 << 30, 1 << 30, 1 << 20])], vec![node("Relu", "r", &["x"], &["y"], vec![])], "y");
    assert!(import_err(&m).contains("input \"x\": too large: shape [1073741824, 1073741824, 1048576] exceeds 1 TiB"), "{}", import_err(&m));
    let e = import(&m, &ImportOptions::default()).map(|_| ()).unwrap_err();
    assert!(matches!(e, IrError::TooLarge { .. }), "{e:?}");
    let m = model(vec![tensor_input("x", &[-3, 2])], vec![node("Relu", "r", &["x"], &["y"], vec![])], "y");
    assert!(import_err(&m).contains("dimension 0 is negative (-3)"), "{}", import_err(&m));
}

#[test]
fn undefined_value_is_an_error() {
    let m = model(vec![tensor_input("x", &[2])], vec![node("Relu", "r", &["nope"], &["y"], vec![])], "y");
    assert!(import_err(&m).contains("\"nope\" is used before it is defined"));
}

#[test]
fn text_errors_carry_line_numbers() {
    let cases = [
        ("graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%7) : f32[2]\n  output \"y\" = %1\n}\n", "line 3: %7 is not defined"),
        ("graph {\n  %0 \"x\" = input : f32[2]\n  %1 = frobnicate(%0) : f32[2]\n}\n", "line 3: unknown op frobnicate"),
        (
            "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%0) : f32[3]\n  output \"y\" = %1\n}\n",
            "stored type f32[3] but inference gives f32[2]",
        ),
        ("graph {\n  %0 \"x\" = input : f32[2]\n", "missing closing '}'"),
        ("graph {\n  %0 \"x\" = input : f32[4294967296,4294967296,4096]\n}\n", "absurdly large"),
        ("graph {\n  %0 \"x\" = input : f32[2]\n  %1 = conv(%0) {group=1} : f32[2]\n}\n", "line 3: missing attribute"),
    ];
    for (src, want) in cases {
        let e = text::parse(src).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(want), "{e} does not contain {want}");
    }
}

#[test]
fn verifier_failures_are_invalid_graph_errors() {
    let e = text::parse("graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%0) : f32[3]\n  output \"y\" = %1\n}\n").unwrap_err();
    assert!(matches!(e, IrError::Invalid(_)));
}

/// Garbled and truncated text IR: an error with a line number or a verified
/// graph, never a panic.
#[test]
fn garbled_text_never_panics() {
    let g = smelt_ir::zoo::mobilenet_v2(1).unwrap();
    let src = text::print(&g);
    let bytes = src.as_bytes();
    let mut r = Rng::new(9);
    let mut errors = 0;
    for i in 0..300 {
        let mut b = bytes.to_vec();
        if i % 3 == 0 {
            b.truncate(r.below(b.len()));
        } else {
            for _ in 0..1 + r.below(8) {
                let at = r.below(b.len());
                let alphabet = b"%\"{}[]():,=-.0123456789abcxyz \n";
                b[at] = alphabet[r.below(alphabet.len())];
            }
        }
        let s = String::from_utf8_lossy(&b).into_owned();
        let res = std::panic::catch_unwind(|| text::parse(&s).map(|_| ()).map_err(|e| e.to_string()));
        match res {
            Ok(Err(e)) => {
                errors += 1;
                assert!(e.starts_with("line ") || e.starts_with("invalid graph"), "{e}");
            }
            Ok(Ok(())) => {}
            Err(_) => panic!("the parser panicked on variant {i}"),
        }
    }
    assert!(errors > 100, "only {errors} of 300 garbled texts were rejected");
}

/// Sequences as the dynamo exporter writes `torch.split`: a SplitToSequence
/// whose parts a SequenceAt picks. Their arity and attributes are checked
/// like every op's: an attribute they do not have is invalid ONNX, an extra
/// input too.
#[test]
fn sequences_import_and_are_checked_like_any_op() {
    use smelt_onnx_proto::attribute_proto::AttributeType;
    let int = |name: &str, v: i64| AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    };
    let nodes = |split: Vec<AttributeProto>, at: &[&str]| {
        vec![
            node("Constant", "pos", &[], &["p"], vec![int("value_int", 1)]),
            node("SplitToSequence", "split", &["x"], &["s"], split),
            node("SequenceAt", "at", at, &["y"], vec![]),
        ]
    };
    let g = import(&model(vec![tensor_input("x", &[3, 2])], nodes(vec![int("axis", 0)], &["s", "p"]), "y"), &ImportOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let y = g.outputs()[0].1;
    assert_eq!(g.ty(y).shape, vec![1, 2], "the second row of x");
    let e = import_err(&model(vec![tensor_input("x", &[3, 2])], nodes(vec![int("axes", 0)], &["s", "p"]), "y"));
    assert!(e.contains("SplitToSequence has no attribute \"axes\""), "{e}");
    let e = import_err(&model(vec![tensor_input("x", &[3, 2])], nodes(vec![], &["s", "p", "p"]), "y"));
    assert!(e.contains("SequenceAt (opset 17) takes 2 inputs, got 3"), "{e}");
}
