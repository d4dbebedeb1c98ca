//! The nine light models of the onnx wheel and their random-weight variants,
//! end to end through `smelt run --expect`, plus the batch override.

mod common;

use common::{light_model, smelt, variant, LIGHT};
use smelt_ir::onnx::read_tensor_file;
use std::path::Path;

fn run_expect(args: &[&str], model: &Path, rtol: &str, atol: &str) -> String {
    let out = smelt().arg("run").arg(model).args(args).args(["--rtol", rtol, "--atol", atol]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{} failed:\n{text}", model.display());
    assert!(text.contains("expected: OK"), "{text}");
    text
}

#[test]
fn light_models_match_their_expected_outputs() {
    for name in LIGHT {
        let m = light_model(name);
        let expect = m.with_file_name(format!("light_{name}_output_0.pb"));
        let rtol = if name == "densenet121" { "2e-3" } else { "1e-3" };
        run_expect(&["--expect", expect.to_str().unwrap()], &m, rtol, "1e-7");
    }
}

/// The light models' expected outputs are uniform; the variants' are not,
/// so these are the real check of the executor.
#[test]
fn random_weight_variants_match_onnxruntime() {
    for name in LIGHT {
        let v = variant(name);
        let expected = read_tensor_file(&v.join("output_0.pb")).unwrap().1.to_f32_vec();
        let (lo, hi) = expected.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let scale = lo.abs().max(hi.abs());
        assert!(hi - lo > 0.5 * scale && scale > 0.0, "{name}: expected output is near-uniform ({lo}..{hi}): the variant proves nothing");
        let args =
            ["--input", v.join("input_0.pb").to_str().unwrap(), "--expect", v.join("output_0.pb").to_str().unwrap()].map(String::from);
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        run_expect(&args, &v.join("model.onnx"), "1e-3", "1e-4");
        // And without fusion: the reference path stays right too.
        let mut no_fuse = args.clone();
        no_fuse.push("--no-fuse");
        run_expect(&no_fuse, &v.join("model.onnx"), "1e-3", "1e-4");
    }
}

/// `--batch 2` on models whose Reshape targets hard-code batch 1, with a
/// different image in each row (a kernel that mixed up rows would pass with
/// identical ones), against onnxruntime's output of each image.
#[test]
fn batch_override_rewrites_hard_coded_reshapes() {
    for name in ["shufflenet", "resnet50", "inception_v1", "bvlc_alexnet"] {
        let v = variant(name);
        let (input, output) = (v.join("batch_input.pb"), v.join("batch_output.pb"));
        let rows = read_tensor_file(&output).unwrap().1.to_f32_vec();
        assert!(rows[..rows.len() / 2] != rows[rows.len() / 2..], "{name}: both rows are equal: the batch proves nothing");
        run_expect(
            &["--batch", "2", "--input", input.to_str().unwrap(), "--expect", output.to_str().unwrap()],
            &v.join("model.onnx"),
            "1e-3",
            "1e-4",
        );
    }
}

/// The reference executor's logits (the final Softmax's input: every class
/// checked, where most probabilities sit below any useful tolerance) on
/// the fused and the unfused graph, against onnxruntime's: within 1e-3
/// relative plus 1e-4 of the logits' range.
#[test]
fn variants_logits_match_onnxruntime() {
    for name in common::LIGHT {
        let v = variant(name);
        let plain = common::logits(common::load(v.join("model.onnx").to_str().unwrap(), None));
        let x = read_tensor_file(&v.join("input_0.pb")).unwrap().1;
        let want = read_tensor_file(&v.join("logits_0.pb")).unwrap().1;
        for fuse in [true, false] {
            let g = common::compiled(&plain, fuse);
            let got = smelt_runtime::cpu::run(&g, std::slice::from_ref(&x)).unwrap();
            let e = common::excess(&got[0], &want, 1e-3, 1e-4);
            assert!(e <= 1.0, "{name} (fused: {fuse}): logits {e:.2} times the tolerance from onnxruntime's");
        }
    }
}
