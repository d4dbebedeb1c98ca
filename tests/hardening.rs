//! The README's exit-status promise on hostile input: every reproducer of
//! `tests/fuzz-corpus` (each once a panic, an abort, a stack overflow, an
//! exponential output or a silent wrong answer) exits with status 2 and a
//! message naming the node, value or flag at fault, from every command.

mod common;

use std::path::PathBuf;

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus").join(name)
}

fn smelt(args: &[&str]) -> (i32, String, String) {
    let out = common::smelt().args(args).env("SMELT_HOST_MEMORY", (8u64 << 30).to_string()).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// (file, what the message must say), for inputs every command refuses.
const REFUSED: &[(&str, &str)] = &[
    ("same_upper_zero_stride.onnx", "node \"conv0\" (Conv): invalid ONNX: strides [0, 0] must be positive"),
    ("concat_int_mismatch.onnx", "node \"cat0\" (Concat): cannot concatenate i64[2,3] with i64[2,2] along axis 0"),
    ("softmax11_rank0.onnx", "node \"sm0\" (Softmax): invalid ONNX: Softmax needs an input of rank at least 1"),
    ("split_num_outputs_neg.onnx", "node \"sp0\" (Split): invalid ONNX: num_outputs is -1 but the node has 2 outputs"),
    ("split_num_outputs_huge.onnx", "node \"sp0\" (Split): invalid ONNX: num_outputs is 1000000000"),
    ("cos_empty_value.onnx", "node \"cos0\" (ConstantOfShape): invalid ONNX: value must hold one element, got f32[0]"),
    ("zero_elem_huge.onnx", "input \"z\": too large: shape [0, 1099511627776] exceeds 1 TiB"),
    // Found by reading the transformer import: 2^30 empty index tuples, in an 87-byte file.
    ("gathernd_empty_tuples_huge.onnx", "node \"y\" (GatherND): too large: 1073741824 empty index tuples"),
    ("conv_pads_huge.onnx", "node \"conv0\" (Conv): too large: output shape"),
    ("conv_dil_huge.onnx", "node \"conv0\" (Conv): window"),
    ("pad_i64max.onnx", "node \"pad0\" (Pad): too large: output shape"),
    ("tile_wrap.onnx", "node \"tile0\" (Tile): too large: tiling f32[1,3,8,8] by [1, 1, 1, 4611686018427387905] overflows"),
    ("conv_fourth_input.onnx", "node \"conv0\" (Conv): invalid ONNX: Conv (opset 17) takes 2 to 3 inputs, got 4"),
    ("relu_two_inputs.onnx", "node \"r\" (Relu): invalid ONNX: Relu (opset 17) takes 1 inputs, got 2"),
    ("dup_node_outputs.onnx", "node \"r2\" (Sigmoid): invalid ONNX: it writes \"t\", a name already defined"),
    ("output_reuses_input.onnx", "node \"r1\" (Relu): invalid ONNX: it writes \"x\", a name already defined"),
    ("dup_graph_inputs.onnx", "two graph inputs are named \"x\""),
    ("input_no_shape.onnx", "input \"x\": has no shape"),
    ("declared_output_wrong.onnx", "graph output \"y\" is declared f32[1,3,8,9] but the graph computes f32[1,3,8,8]"),
    ("declared_output_wrong_dtype.onnx", "graph output \"y\" is declared i64[1,3,8,8] but the graph computes f32[1,3,8,8]"),
    ("float_reshape_shape.onnx", "node \"r\" (Reshape): invalid ONNX: the target shape (input 1) must be an integer tensor, got f32[2]"),
    ("opset_too_new.onnx", "opset 99 of the default ONNX domain (smelt imports opsets 1 to 28)"),
    ("ir_too_new.onnx", "ONNX IR version 99 (smelt reads IR versions 3 to 14)"),
    ("neg_dim.onnx", "input \"x\": dimension 1 is negative (-3)"),
    ("conv_attr_typo.onnx", "node \"conv0\" (Conv): invalid ONNX: Conv has no attribute \"stride\""),
    ("reducesum_axes_attr.onnx", "node \"rs0\" (ReduceSum): invalid ONNX: at opset 13 axes of ReduceSum is an input"),
    ("dropout_training.onnx", "node \"drop0\" (Dropout, opset 17): training_mode=true (random dropout)"),
    ("split_rank0_from_fuzzer.onnx", "node \"1\" (Split): invalid ONNX"),
    ("unnamed_initializer_from_fuzzer.onnx", "malformed ONNX model: an initializer has no name"),
    ("empty.tir", "line 1: empty file: expected 'graph {'"),
    ("noout.tir", "the graph has no outputs"),
    ("dupout.tir", "line 5: two outputs are named \"y\""),
    ("dupin.tir", "line 3: two inputs are named \"x\""),
    ("i32overflow.tir", "line 3: 99999999999 does not fit i32"),
];

#[test]
fn hostile_models_exit_2_naming_what_is_wrong() {
    let mut bad = Vec::new();
    for (file, want) in REFUSED {
        let path = corpus(file);
        for cmd in ["inspect", "plan", "print", "run"] {
            let (code, _, err) = smelt(&[cmd, path.to_str().unwrap()]);
            if code != 2 || !err.contains(want) || err.contains("panicked") {
                bad.push(format!("smelt {cmd} {file}: exit {code}, wanted 2 and {want:?}; said: {err}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Valid models that once crashed: a chain of 4,700 ops (fusion recursed
/// on its depth), 27 diamonds (their fused expression printed as a tree
/// grew past 5 GB), an empty slice with a negative step.
#[test]
fn deep_and_shared_graphs_compile_print_and_run() {
    for file in ["chain.tir", "diamonds.tir", "slice_neg_step_empty.onnx"] {
        let path = corpus(file);
        for cmd in ["inspect", "plan", "run"] {
            let (code, _, err) = smelt(&[cmd, path.to_str().unwrap()]);
            assert_eq!(code, 0, "smelt {cmd} {file}: {err}");
        }
    }
    let (code, out, err) = smelt(&["compile", corpus("diamonds.tir").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    // 27 diamonds, each node printed once: bindings, not a 5 GB tree.
    assert!(out.len() < 10_000 && out.contains("@25="), "{} bytes:\n{out}", out.len());
}

/// Sizes are refused before anything is allocated: a run or a constant
/// larger than the host memory (8 GiB here, through SMELT_HOST_MEMORY),
/// and a text file's 40 GB constant without data is never filled by the
/// commands that need no values.
#[test]
fn absurd_sizes_are_refused_before_allocating() {
    let (code, _, err) = smelt(&["run", corpus("huge_run.onnx").to_str().unwrap()]);
    assert!(code == 2 && err.contains("running on the CPU reference executor needs 74.51 GiB"), "{code} {err}");
    let (code, _, err) = smelt(&["run", "zoo:resnet50", "--batch", "100000"]);
    assert!(code == 2 && err.contains("of host memory but only 8.00 GiB"), "{code} {err}");
    let big = corpus("bigconst.tir");
    for cmd in ["print", "inspect", "plan"] {
        let (code, _, err) = smelt(&[cmd, big.to_str().unwrap()]);
        assert_eq!(code, 0, "smelt {cmd} bigconst.tir: {err}");
    }
    let (code, _, err) = smelt(&["run", big.to_str().unwrap()]);
    assert!(code == 2 && err.contains("filling the constants that have no data needs 37.25 GiB"), "{code} {err}");
}

/// A reader that stops early ends the command quietly; a full disk is an
/// error with exit 2; a closed standard error leaves only the exit status.
#[test]
fn stdout_failures() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = common::smelt().args(["print", "zoo:resnet50"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = [0u8; 5];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(&first, b"graph");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let bin = env!("CARGO_BIN_EXE_smelt");
    let out = std::process::Command::new("sh").args(["-c", &format!("'{bin}' inspect /nonexistent.onnx 2>&-")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let out = common::smelt().args(["inspect", "zoo:resnet50"]).stdout(full).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("cannot write to standard output: No space left on device"), "{err}");
    }
}

/// Flags: NaN tolerances are refused (they would make any comparison
/// pass), an --expect file of another shape or dtype is exit 2 naming
/// both, and messages say what is wrong once.
#[test]
fn flags_and_messages() {
    let v = common::variant("squeezenet");
    let model = v.join("model.onnx");
    let m = model.to_str().unwrap();
    for flag in ["--rtol", "--atol", "--kernel-rtol"] {
        for val in ["NaN", "inf", "-1"] {
            let (code, _, err) = smelt(&["run", m, &format!("{flag}={val}")]);
            assert!(code == 2 && err.contains("is not a tolerance"), "{flag} {val}: {code} {err}");
        }
    }
    // The model's input as the expected output: another shape.
    let input = v.join("input_0.pb");
    let (code, _, err) = smelt(&["run", m, "--expect", input.to_str().unwrap()]);
    assert!(code == 2 && err.contains("holds f32[1,3,224,224] but output"), "{code} {err}");
    let (code, _, err) = smelt(&["inspect", "/nonexistent/m.onnx"]);
    assert_eq!(code, 2);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    let (code, _, err) = smelt(&["inspect", ""]);
    assert!(code == 2 && err.contains("the model path is empty"), "{err}");
    // At batch 1 nobody is told to shrink the batch; sizes that print
    // alike are shown to the byte.
    let (code, _, err) = smelt(&["plan", "zoo:mobilenet_v2", "--memory-limit", "1MiB"]);
    assert!(code == 2 && !err.contains("smaller batch"), "{err}");
    // (A training step: an inference plan would be split to fit.)
    let (_, out, _) = smelt(&["plan", "zoo:resnet8", "--train", "sgd", "--batch", "4", "--json"]);
    let arena = serde_json::from_str::<serde_json::Value>(&out).unwrap()["plan"]["arena_bytes"].as_u64().unwrap();
    let (code, _, err) = smelt(&["plan", "zoo:resnet8", "--train", "sgd", "--batch", "4", "--memory-limit", &format!("{}B", arena - 1)]);
    assert!(code == 2 && err.contains(&format!("({arena} bytes)")) && err.contains(&format!("({} bytes)", arena - 1)), "{err}");
}

/// Nothing walks a graph or an expression by recursion on its depth: a
/// chain of 10,000 ops of every kind (a run of 5,000 elementwise ops fused
/// into one kernel, convs, residual adds, views) goes through every phase, printed text read back
/// included, on a thread with a 1 MiB stack.
#[test]
fn ten_thousand_op_chains_fit_a_small_stack() {
    let mut text = String::from("graph {\n  %0 \"x\" = input : f32[1,4,8,8]\n  %1 \"w\" = const : f32[4,4,3,3]\n");
    let (mut prev, mut k) = (0, 2);
    for i in 0..10_000 {
        let line = match i % 6 {
            // A run of 5,000 elementwise ops: one fused kernel.
            _ if (2_000..6_998).contains(&i) => format!("{}(%{prev}) : f32[1,4,8,8]", ["relu", "tanh"][i % 2]),
            0 => format!("relu(%{prev}) : f32[1,4,8,8]"),
            1 => format!("conv(%{prev}, %1) {{strides=[1,1], pads=[1,1,1,1], dilations=[1,1], group=1}} : f32[1,4,8,8]"),
            2 => format!("add(%{}, %{}) : f32[1,4,8,8]", k - 1, k - 2),
            3 => format!("reshape(%{prev}) {{shape=[1,256]}} : f32[1,256]"),
            4 => format!("sigmoid(%{prev}) : f32[1,256]"),
            _ => format!("reshape(%{prev}) {{shape=[1,4,8,8]}} : f32[1,4,8,8]"),
        };
        text += &format!("  %{k} = {line}\n");
        prev = k;
        k += 1;
    }
    text += &format!("  output \"y\" = %{prev}\n}}\n");
    let r = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || smelt::fuzz::exercise(text.as_bytes(), smelt::fuzz::Format::Text, 64 << 20))
        .unwrap()
        .join()
        .expect("no panic, no stack overflow");
    assert!(matches!(r, Ok(smelt::fuzz::Reached::Ran)), "{r:?}");
}
