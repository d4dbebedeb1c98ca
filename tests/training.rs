//! Training steps (`smelt_passes::train`): PyTorch is the oracle for whole
//! steps (`scripts/make_training.py`: three steps of SGD with momentum,
//! Nesterov, Adam and AdamW from the same weights on the same batch), and
//! finite differences check every vector-Jacobian rule.

mod common;

use smelt_ir::onnx::read_tensor_file;
use smelt_ir::{Op, Optimizer};
use smelt_passes::train::{training_step, Loss, TrainConfig};
use std::path::PathBuf;

const CASES: [&str; 4] = ["mlp", "mlp_mse", "cnn", "resnet_blocks"];

fn dir(case: &str) -> PathBuf {
    let d = common::testdata().join("training").join(case);
    assert!(d.join("model.onnx").is_file(), "{} missing: run scripts/fetch-testdata.sh", d.display());
    d
}

/// PyTorch's optimizer of each case directory, as `make_training.py` makes it.
fn optimizer(name: &str) -> Optimizer {
    let sgd = |nesterov, weight_decay| Optimizer::Sgd { lr: 0.05, momentum: 0.9, dampening: 0.0, nesterov, weight_decay };
    let adam = |weight_decay, decoupled| Optimizer::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay, decoupled };
    match name {
        "sgd" => sgd(false, 1e-4),
        "sgd_nesterov" => sgd(true, 0.0),
        "adam" => adam(0.0, false),
        "adamw" => adam(0.1, true),
        _ => unreachable!(),
    }
}

#[test]
fn three_steps_give_pytorchs_weights() {
    for case in CASES {
        let d = dir(case);
        let model = common::load(d.join("model.onnx").to_str().unwrap(), None);
        let meta = std::fs::read_to_string(d.join("meta.txt")).unwrap();
        let loss = if meta.contains("loss=mse") { Loss::MeanSquaredError } else { Loss::CrossEntropy { smoothing: 0.0 } };
        let x = read_tensor_file(&d.join("input_0.pb")).unwrap().1;
        let labels = read_tensor_file(&d.join("labels.pb")).unwrap().1;
        for opt in ["sgd", "sgd_nesterov", "adam", "adamw"] {
            let cfg = TrainConfig { loss, loss_on: None, optimizer: Some(optimizer(opt)), freeze: vec![] };
            let step = training_step(&model, &cfg).unwrap_or_else(|e| panic!("{case}: {e}"));
            let mut g = step.graph.clone();
            let want_losses = read_tensor_file(&d.join(opt).join("losses.pb")).unwrap().1.to_f32_vec();
            for (i, want) in want_losses.iter().enumerate() {
                let out =
                    smelt_runtime::cpu::run_step(&mut g, &[x.clone(), labels.clone()]).unwrap_or_else(|e| panic!("{case}/{opt}: {e}"));
                let got = out[0].to_f32_vec()[0];
                assert!((got - want).abs() <= 1e-4 * want.abs() + 1e-6, "{case}/{opt} step {i}: loss {got}, PyTorch {want}");
            }
            let mut checked = 0;
            for id in g.node_ids().filter(|&n| g.node(n).op == Op::Parameter) {
                let name = &g.node(id).name;
                let want =
                    read_tensor_file(&d.join(opt).join(format!("{name}.pb"))).unwrap_or_else(|e| panic!("{case}/{opt}/{name}: {e}")).1;
                let got = g.weight(id).unwrap();
                let initial = model.weight(model.node_ids().find(|&n| model.node(n).name == *name).unwrap()).unwrap();
                assert!(!smelt::compare(initial, &want, 1e-4, 1e-6).ok, "{case}/{opt}: {name} moved in PyTorch");
                let c = smelt::compare(got, &want, 1e-4, 1e-6);
                assert!(c.ok, "{case}/{opt}: parameter {name} after 3 steps differs from PyTorch's: {c:?}");
                checked += 1;
            }
            let expected = std::fs::read_dir(d.join(opt)).unwrap().count() - 1;
            assert_eq!(checked, expected, "{case}/{opt}: every PyTorch parameter is trained");
            println!("{case}/{opt}: {checked} parameters after 3 steps match PyTorch's, losses {want_losses:?}");
        }
    }
}
