//! The nine light models of the onnx wheel and their random-weight variants,
//! end to end through `smelt run --expect`, plus the batch override.

mod common;

use common::{light_model, smelt, variant, LIGHT};
use smelt_ir::onnx::{read_tensor_file, write_tensor_file};
use smelt_ir::Tensor;
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

/// `--batch 4` on models whose Reshape targets hard-code batch 1: the same
/// image in every row gives the batch-1 output in every row.
#[test]
fn batch_override_rewrites_hard_coded_reshapes() {
    let dir = std::env::temp_dir().join(format!("smelt-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["shufflenet", "resnet50", "inception_v1", "bvlc_alexnet"] {
        let v = variant(name);
        let (iname, input) = read_tensor_file(&v.join("input_0.pb")).unwrap();
        let (oname, output) = read_tensor_file(&v.join("output_0.pb")).unwrap();
        let repeat = |t: &Tensor| {
            let mut shape = t.shape().to_vec();
            shape[0] = 4;
            Tensor::from_f32(shape, t.to_f32_vec().repeat(4))
        };
        let (i4, o4) = (dir.join(format!("{name}_in.pb")), dir.join(format!("{name}_out.pb")));
        write_tensor_file(&i4, &iname, &repeat(&input)).unwrap();
        write_tensor_file(&o4, &oname, &repeat(&output)).unwrap();
        run_expect(
            &["--batch", "4", "--input", i4.to_str().unwrap(), "--expect", o4.to_str().unwrap()],
            &v.join("model.onnx"),
            "1e-3",
            "1e-4",
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
