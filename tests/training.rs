//! Training steps (`smelt_passes::train`): PyTorch is the oracle for whole
//! steps (`scripts/make_training.py`: three steps of SGD with momentum,
//! Nesterov, Adam and AdamW from the same weights on the same batch), and
//! finite differences check every vector-Jacobian rule.

mod common;

use smelt_ir::onnx::read_tensor_file;
use smelt_ir::{Op, Optimizer, Tensor};
use smelt_passes::train::{training_step, Loss, TrainConfig};
use smelt_runtime::emu::Schedule;
use std::path::PathBuf;

const CASES: [&str; 9] = ["mlp", "mlp_mse", "cnn", "resnet_blocks", "tenc", "lm", "lm_causal", "lm_emb", "bn_fresh"];

fn dir(case: &str) -> PathBuf {
    let d = common::testdata().join("training").join(case);
    assert!(d.join("model.onnx").is_file(), "{} missing: run scripts/fetch-testdata.sh", d.display());
    d
}

/// PyTorch's optimizer of each case directory, as `make_training.py` makes it.
fn optimizer(name: &str) -> Optimizer {
    let sgd = |nesterov, weight_decay| Optimizer::Sgd {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.0,
        nesterov,
        weight_decay,
        accumulate: 1,
        schedule: Default::default(),
    };
    let adam = |weight_decay, decoupled| Optimizer::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
        decoupled,
        accumulate: 1,
        schedule: Default::default(),
    };
    match name {
        "sgd" => sgd(false, 1e-4),
        "sgd_nesterov" => sgd(true, 0.0),
        "adam" => adam(0.0, false),
        "adamw" => adam(0.1, true),
        "sgd_clip" => sgd(false, 0.0),
        "adamw_cosine" => match adam(0.1, true) {
            Optimizer::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, accumulate, .. } => {
                let schedule = smelt_ir::Schedule { warmup: 1, total: 3 };
                Optimizer::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, accumulate, schedule }
            }
            _ => unreachable!(),
        },
        _ => unreachable!(),
    }
}

/// The global-norm clipping of `make_training.py`'s optimizer `name`.
fn clip(name: &str) -> Option<f32> {
    name.ends_with("clip").then_some(0.5)
}

#[test]
fn three_steps_give_pytorchs_weights() {
    for case in CASES {
        let d = dir(case);
        let meta = std::fs::read_to_string(d.join("meta.txt")).unwrap();
        // ce and tokens (per-token logits [B, S, V], labels [B, S] with some
        // at -100) are both cross-entropy, told apart by the logits' shape.
        let loss = if meta.contains("loss=mse") {
            Loss::MeanSquaredError
        } else if meta.contains("loss=causal-lm") {
            Loss::CausalLm { smoothing: 0.0 }
        } else {
            Loss::CrossEntropy { smoothing: 0.0 }
        };
        let x = read_tensor_file(&d.join("input_0.pb")).unwrap().1;
        let labels = read_tensor_file(&d.join("labels.pb")).unwrap().1;
        // What PyTorch trains: smelt's rule finds it, but where the model
        // froze its embedding (requires_grad off: lm, lm_causal), which
        // PyTorch's list (as --trainable reads it) says.
        let pytorch: Vec<String> = std::fs::read_to_string(d.join("trainable.txt")).unwrap().lines().map(String::from).collect();
        let only = if matches!(case, "lm" | "lm_causal") { pytorch.clone() } else { vec![] };
        for opt in ["sgd", "sgd_nesterov", "adam", "adamw", "sgd_clip", "adamw_cosine"] {
            let cfg = TrainConfig {
                loss,
                loss_on: None,
                optimizer: Some(optimizer(opt)),
                freeze: vec![],
                only: only.clone(),
                batch_norm: Default::default(),
                clip_norm: clip(opt),
                loss_scale: false,
            };
            let want_losses = read_tensor_file(&d.join(opt).join("losses.pb")).unwrap().1.to_f32_vec();
            // The step as built, and as the pass pipeline fuses it.
            let mut s =
                smelt::Session::open(d.join("model.onnx").to_str().unwrap(), smelt::Options { train: Some(cfg), ..Default::default() })
                    .unwrap_or_else(|e| panic!("{case}: {e}"));
            let fused = s.compile().unwrap().graph;
            let train = s.train.expect("a training session");
            let trained: std::collections::BTreeSet<&String> = train.step.params.iter().collect();
            assert_eq!(trained, pytorch.iter().collect(), "{case}: the parameters smelt trains are PyTorch's");
            let frozen: Vec<_> = train.step.initializers.iter().filter(|i| !i.trained).collect();
            assert!(frozen.iter().all(|i| i.frozen_because.is_some()), "{case}: {frozen:?}");
            let model = train.model;
            let runs =
                [("as built", steps(train.step.graph, &x, &labels, &want_losses)), ("fused", steps(fused, &x, &labels, &want_losses))];
            for (how, after) in runs {
                let after = after.unwrap_or_else(|e| panic!("{case}/{opt} {how}: {e}"));
                for (name, got) in &after {
                    let want =
                        read_tensor_file(&d.join(opt).join(format!("{name}.pb"))).unwrap_or_else(|e| panic!("{case}/{opt}/{name}: {e}")).1;
                    let initial = model.weight(model.node_ids().find(|&n| model.node(n).name == *name).unwrap()).unwrap();
                    assert!(!smelt::compare(initial, &want, 1e-4, 1e-6).ok, "{case}/{opt}: {name} moved in PyTorch");
                    let (got, want) = without_key_bias(name, opt, got, &want);
                    let c = smelt::compare(&got, &want, 1e-4, 1e-6);
                    assert!(c.ok, "{case}/{opt} {how}: parameter {name} after 3 steps differs from PyTorch's: {c:?}");
                }
                let expected = std::fs::read_dir(d.join(opt)).unwrap().count() - 1;
                assert_eq!(after.len(), expected, "{case}/{opt}: every PyTorch parameter is trained");
                println!("{case}/{opt} {how}: {} parameters after 3 steps match PyTorch's, losses {want_losses:?}", after.len());
            }
        }
    }
}

/// The attention's key bias (the middle third of `in_proj_bias`) has a
/// gradient of exactly 0 (the softmax cancels a constant added to a row of
/// scores), so it is rounding noise in PyTorch and in smelt alike, and
/// Adam's normalization turns noise into full steps of either sign. Under
/// Adam those elements are dropped from the comparison; both sides must
/// still have moved them by at most 3 steps of lr.
fn without_key_bias(name: &str, opt: &str, got: &Tensor, want: &Tensor) -> (Tensor, Tensor) {
    if !(name.ends_with("in_proj_bias") && opt.starts_with("adam")) {
        return (got.clone(), want.clone());
    }
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let d = g.len() / 3;
    let keep = |v: &[f32]| Tensor::from_f32(vec![2 * d], v[..d].iter().chain(&v[2 * d..]).copied().collect());
    for i in d..2 * d {
        assert!((g[i] - w[i]).abs() <= 2.0 * 3.0 * 1e-3 + 1e-6, "{name}[{i}]: {} against {}", g[i], w[i]);
    }
    (keep(&g), keep(&w))
}

/// Runs one training step per expected loss on the CPU reference executor
/// (any graph level), checking each loss; returns the parameters after.
fn steps<O: smelt_runtime::cpu::Eval>(
    g: smelt_ir::Graph<O>,
    x: &Tensor,
    labels: &Tensor,
    want_losses: &[f32],
) -> Result<Vec<(String, Tensor)>, String> {
    run_steps(g, &[x.clone(), labels.clone()], want_losses)
}

/// As [`steps`], on `inputs` (the model's, then the labels).
fn run_steps<O: smelt_runtime::cpu::Eval>(
    g: smelt_ir::Graph<O>,
    inputs: &[Tensor],
    want_losses: &[f32],
) -> Result<Vec<(String, Tensor)>, String> {
    Ok(persistent_after(g, inputs, want_losses)?.into_iter().filter(|p| p.2 == Op::Parameter).map(|p| (p.0, p.1)).collect())
}

/// As [`steps`], returning every persistent value after, with its kind.
fn persistent_after<O: smelt_runtime::cpu::Eval>(
    mut g: smelt_ir::Graph<O>,
    inputs: &[Tensor],
    want_losses: &[f32],
) -> Result<Vec<(String, Tensor, Op)>, String> {
    for (i, want) in want_losses.iter().enumerate() {
        let out = smelt_runtime::cpu::run_step(&mut g, inputs).map_err(|e| e.to_string())?;
        let got = out[0].to_f32_vec()[0];
        if (got - want).abs() > 1e-4 * want.abs() + 1e-6 {
            return Err(format!("step {i}: loss {got}, PyTorch {want}"));
        }
    }
    Ok(g.node_ids()
        .filter_map(|n| Some((g.node(n).name.clone(), g.weight(n)?.as_ref().clone(), g.node(n).op.semantic()?.clone())))
        .collect())
}

/// An exporter's folded mask (0 and float32's lowest, added to a product,
/// as the dynamo exporter adds a causal LM's to the attention scores) is
/// not a bias: it stays frozen, and the table says why; the layers' weights
/// and bias train.
#[test]
fn a_folded_additive_mask_is_not_trained_as_a_bias() {
    use smelt_ir::{BinaryOp, DType, TensorType, ValueId};
    let mut g = smelt_ir::Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3])).unwrap();
    let mut rng = smelt_ir::Rng::new(5);
    let w = g.add_constant("w", random(&mut rng, &[3, 4], -1.0, 1.0));
    let low = f32::MIN;
    let mask = g.add_constant("mask", Tensor::from_f32(vec![2, 4], vec![0.0, 0.0, low, low, 0.0, 0.0, 0.0, low]));
    let w2 = g.add_constant("w2", random(&mut rng, &[4, 5], -1.0, 1.0));
    let b2 = g.add_constant("b2", random(&mut rng, &[5], -1.0, 1.0));
    let v = |node| ValueId { node, slot: 0 };
    let scores = g.add(Op::MatMul, "scores", &[x, w]).unwrap();
    let masked = g.add(Op::Binary(BinaryOp::Add), "masked", &[v(scores), mask]).unwrap();
    let p = g.add(Op::Softmax { axis: 1 }, "p", &[v(masked)]).unwrap();
    let out = g.add(Op::MatMul, "out", &[v(p), w2]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Add), "y", &[v(out), b2]).unwrap();
    g.add_output("y", v(y));
    let step = training_step(&g, &sgd_config()).unwrap();
    assert_eq!(step.params, ["w", "w2", "b2"]);
    let m = step.initializers.iter().find(|i| i.name == "mask").unwrap();
    assert!(!m.trained && m.frozen_because.as_deref().is_some_and(|w| w.contains("additive mask")), "{m:?}");
}

/// A one-op model: operands are parameters (float) or constants (others),
/// its first output the model's output.
struct OneOp {
    op: Op,
    operands: Vec<Tensor>,
    /// Operands kept constant (not differentiated): masks, statistics.
    fixed: Vec<usize>,
}

fn model_of(case: &OneOp) -> smelt_ir::Graph {
    let mut g = smelt_ir::Graph::new();
    let ins: Vec<smelt_ir::ValueId> = case
        .operands
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = if t.ty().dtype.is_float() && !case.fixed.contains(&i) { Op::Parameter } else { Op::Constant };
            g.add_persistent(kind, format!("p{i}"), std::sync::Arc::new(t.clone()))
        })
        .collect();
    // A conv followed by a frozen batch norm: its last four operands are the norm's.
    let chained = matches!(case.op, Op::Conv(_)) && case.fixed.len() == 2;
    let split = if chained { ins.len() - 4 } else { ins.len() };
    let id = g.add(case.op.clone(), "op", &ins[..split]).unwrap_or_else(|e| panic!("{}: {e}", case.op.name()));
    let y = smelt_ir::ValueId { node: id, slot: 0 };
    let y = if chained {
        let mut bn_ins = vec![y];
        bn_ins.extend_from_slice(&ins[split..]);
        smelt_ir::ValueId { node: g.add(Op::BatchNorm { epsilon: 1e-3 }, "bn", &bn_ins).unwrap(), slot: 0 }
    } else {
        y
    };
    // Split's parts meet again, so every part reaches the loss.
    let y = if g.node(id).outputs.len() > 1 {
        let parts: Vec<_> = (0..g.node(id).outputs.len() as u32).map(|slot| smelt_ir::ValueId { node: id, slot }).collect();
        let mul = g.add(Op::Binary(smelt_ir::BinaryOp::Mul), "mul", &parts[..2]).unwrap();
        smelt_ir::ValueId { node: mul, slot: 0 }
    } else {
        y
    };
    g.add_output("y", y);
    g
}

fn random(rng: &mut smelt_ir::Rng, shape: &[usize], lo: f32, hi: f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(shape.to_vec(), (0..n).map(|_| lo + (hi - lo) * rng.uniform()).collect())
}

/// Every vector-Jacobian rule against central finite differences: for a
/// random direction u over every parameter, the gradient's dot product with
/// u equals (L(p + h u) - L(p - h u)) / 2h for the MSE loss against random
/// targets, within 1% (in f32, h = 1e-2, or 1e-3 across kinks: the
/// reference executor has no f64).
#[test]
fn every_gradient_rule_matches_finite_differences() {
    use smelt_ir::{BinaryOp as B, Conv, DType, Pool, ReduceOp, UnaryOp};
    let mut rng = smelt_ir::Rng::new(7);
    let r = &mut rng;
    let x4 = |r: &mut smelt_ir::Rng| random(r, &[2, 4, 6, 6], -1.0, 1.0);
    let pos = |r: &mut smelt_ir::Rng, s: &[usize]| random(r, s, 0.5, 2.0);
    let conv = Conv { strides: vec![2, 1], pads: vec![1, 2, 0, 1], dilations: vec![1, 2], group: 2 };
    let pool = Pool { kernel: vec![3, 2], strides: vec![2, 2], pads: vec![1, 0, 1, 1], ceil_mode: true };
    let mut cases = vec![
        OneOp { op: Op::Conv(conv), operands: vec![x4(r), random(r, &[6, 2, 3, 3], -0.5, 0.5), random(r, &[6], -1.0, 1.0)], fixed: vec![] },
        OneOp {
            op: Op::Conv(Conv { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![1, 1], group: 1 }),
            operands: vec![x4(r), random(r, &[3, 4, 1, 1], -1.0, 1.0)],
            fixed: vec![],
        },
        OneOp {
            op: Op::BatchNorm { epsilon: 1e-3 },
            operands: vec![x4(r), pos(r, &[4]), random(r, &[4], -1.0, 1.0), random(r, &[4], -0.5, 0.5), pos(r, &[4])],
            fixed: vec![3, 4],
        },
        OneOp { op: Op::Clip { min: -0.5, max: 0.4 }, operands: vec![x4(r)], fixed: vec![] },
        // Conv then frozen batch norm: differentiated as one layer.
        OneOp {
            op: Op::Conv(Conv { strides: vec![1, 2], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 2 }),
            operands: vec![
                x4(r),
                random(r, &[6, 2, 3, 3], -0.5, 0.5),
                random(r, &[6], -1.0, 1.0),
                pos(r, &[6]),
                random(r, &[6], -1.0, 1.0),
                random(r, &[6], -0.5, 0.5),
                pos(r, &[6]),
            ],
            fixed: vec![5, 6],
        },
        OneOp {
            op: Op::Conv(Conv { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![1, 1], group: 1 }),
            operands: vec![
                x4(r),
                random(r, &[3, 4, 1, 1], -1.0, 1.0),
                pos(r, &[3]),
                random(r, &[3], -1.0, 1.0),
                random(r, &[3], -0.5, 0.5),
                pos(r, &[3]),
            ],
            fixed: vec![4, 5],
        },
        OneOp { op: Op::Sum, operands: vec![x4(r), random(r, &[4, 1, 6], -1.0, 1.0), random(r, &[6], -1.0, 1.0)], fixed: vec![] },
        OneOp {
            op: Op::Where,
            operands: vec![random(r, &[4, 6, 1], -1.0, 1.0).cast(DType::Bool), x4(r), random(r, &[6], -1.0, 1.0)],
            fixed: vec![],
        },
        OneOp { op: Op::MaxPool(pool.clone()), operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::AveragePool { pool: pool.clone(), count_include_pad: true }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::AveragePool { pool, count_include_pad: false }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::GlobalAveragePool, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::Reduce { op: ReduceOp::Mean, axes: vec![1, 3], keepdims: false }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdims: true }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::Reduce { op: ReduceOp::Max, axes: vec![2], keepdims: false }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::MatMul, operands: vec![random(r, &[2, 3, 4], -1.0, 1.0), random(r, &[4, 5], -1.0, 1.0)], fixed: vec![] },
        OneOp { op: Op::MatMul, operands: vec![random(r, &[2, 1, 3, 4], -1.0, 1.0), random(r, &[3, 4, 2], -1.0, 1.0)], fixed: vec![] },
        OneOp { op: Op::Concat { axis: 1 }, operands: vec![x4(r), random(r, &[2, 2, 6, 6], -1.0, 1.0)], fixed: vec![] },
        OneOp { op: Op::Split { axis: 2, sizes: vec![3, 3] }, operands: vec![x4(r)], fixed: vec![] },
        OneOp {
            op: Op::Slice { axes: vec![1, 3], starts: vec![1, 2], ends: vec![3, 6], steps: vec![1, 1] },
            operands: vec![x4(r)],
            fixed: vec![],
        },
        OneOp { op: Op::Reshape { shape: vec![8, 36] }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::Transpose { perm: vec![2, 0, 3, 1] }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::Softmax { axis: 1 }, operands: vec![x4(r)], fixed: vec![] },
        OneOp { op: Op::LogSoftmax { axis: 3 }, operands: vec![x4(r)], fixed: vec![] },
        OneOp {
            op: Op::LayerNorm { axis: 2, epsilon: 1e-5 },
            operands: vec![x4(r), pos(r, &[6, 6]), random(r, &[6, 6], -1.0, 1.0)],
            fixed: vec![],
        },
        OneOp { op: Op::Lrn(smelt_ir::Lrn { size: 3, alpha: 0.5, beta: 0.75, bias: 1.0 }), operands: vec![x4(r)], fixed: vec![] },
        OneOp {
            op: Op::Pad { pads: vec![0, 1, 2, 0, 1, 0, 1, 2], mode: smelt_ir::PadMode::Constant(0.5) },
            operands: vec![x4(r)],
            fixed: vec![],
        },
        OneOp { op: Op::Expand { shape: vec![3, 4, 5] }, operands: vec![random(r, &[4, 1], -1.0, 1.0)], fixed: vec![] },
        OneOp { op: Op::Tile { repeats: vec![2, 1, 3] }, operands: vec![random(r, &[2, 3, 2], -1.0, 1.0)], fixed: vec![] },
        // A gather's gradient is a scatter-add: repeated and negative indices.
        OneOp {
            op: Op::Gather { axis: 1 },
            operands: vec![random(r, &[2, 5, 3], -1.0, 1.0), Tensor::from_i64(vec![2, 2], vec![1, -1, 1, 0])],
            fixed: vec![],
        },
    ];
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a = if ta { [4, 3] } else { [3, 4] };
        let b = if tb { [5, 4] } else { [4, 5] };
        cases.push(OneOp {
            op: Op::Gemm { trans_a: ta, trans_b: tb, alpha: 0.7, beta: 0.5 },
            operands: vec![random(r, &a, -1.0, 1.0), random(r, &b, -1.0, 1.0), random(r, &[5], -1.0, 1.0)],
            fixed: vec![],
        });
    }
    for u in UnaryOp::ALL {
        let x = match u {
            UnaryOp::Sqrt | UnaryOp::Log | UnaryOp::Reciprocal => pos(r, &[3, 5]),
            // Piecewise constant: zero gradient, and finite differences
            // jump where a step falls between samples.
            UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => continue,
            _ => random(r, &[3, 5], -2.0, 2.0),
        };
        cases.push(OneOp { op: Op::Unary(u), operands: vec![x], fixed: vec![] });
    }
    for b in [B::Add, B::Sub, B::Mul, B::Div, B::Pow, B::Max, B::Min, B::PRelu] {
        let (a, bb) = match b {
            B::Pow | B::Div => (pos(r, &[2, 3, 4]), pos(r, &[3, 1])),
            _ => (random(r, &[2, 3, 4], -1.0, 1.0), random(r, &[3, 1], -1.0, 1.0)),
        };
        cases.push(OneOp { op: Op::Binary(b), operands: vec![a, bb], fixed: vec![] });
    }
    let mut checked = 0;
    // Strided, as Swin's patch merging slices every other row and column
    // (last: the cases before draw the random values they did).
    cases.push(OneOp {
        op: Op::Slice { axes: vec![2, 3], starts: vec![1, 0], ends: vec![6, 6], steps: vec![2, 3] },
        operands: vec![x4(r)],
        fixed: vec![],
    });
    for case in &cases {
        let model = model_of(case);
        let name = format!("{} {:?}", case.op.name(), case.operands.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>());
        let cfg = TrainConfig {
            loss: Loss::MeanSquaredError,
            loss_on: None,
            optimizer: None,
            freeze: vec![],
            only: vec![],
            batch_norm: Default::default(),
            clip_norm: None,
            loss_scale: false,
        };
        let step = training_step(&model, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut g = step.graph;
        let target_ty = g.node(g.inputs()[0]).outputs[0].clone();
        let targets = random(r, &target_ty.shape, -1.0, 1.0);
        let run =
            |g: &smelt_ir::Graph| smelt_runtime::cpu::run(g, std::slice::from_ref(&targets)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = run(&g);
        let params: Vec<_> = g.node_ids().filter(|&n| g.node(n).op == Op::Parameter).collect();
        assert_eq!(out.len(), 1 + params.len(), "{name}: a gradient per parameter");
        let dirs: Vec<Tensor> =
            params.iter().map(|&p| random(r, g.ty(smelt_ir::ValueId { node: p, slot: 0 }).shape.as_slice(), -1.0, 1.0)).collect();
        let mut analytic = 0f64;
        for (i, &p) in params.iter().enumerate() {
            let want = format!("grad:{}", g.node(p).name);
            let at = g.outputs().iter().position(|(n, _)| *n == want).unwrap_or_else(|| panic!("{name}: no {want}"));
            analytic += out[at].to_f32_vec().iter().zip(dirs[i].to_f32_vec()).map(|(&a, b)| a as f64 * b as f64).sum::<f64>();
        }
        // A small step where the function has kinks (maxima, masks), so
        // that no argmax or mask flips; a larger one elsewhere, above f32's
        // rounding of the loss.
        let kinked = matches!(
            case.op,
            Op::MaxPool(_)
                | Op::Reduce { op: ReduceOp::Max, .. }
                | Op::Clip { .. }
                | Op::Binary(B::Max | B::Min | B::PRelu)
                | Op::Unary(UnaryOp::Relu | UnaryOp::Abs | UnaryOp::LeakyRelu(_) | UnaryOp::Elu(_) | UnaryOp::Selu(..))
        );
        let h = if kinked { 1e-3f32 } else { 1e-2 };
        let base: Vec<Tensor> = params.iter().map(|&p| g.weight(p).unwrap().as_ref().clone()).collect();
        let mut loss_at = |sign: f32| {
            for (i, &p) in params.iter().enumerate() {
                let moved: Vec<f32> = base[i].to_f32_vec().iter().zip(dirs[i].to_f32_vec()).map(|(&x, d)| x + sign * h * d).collect();
                g.set_weight(p, Tensor::from_f32(base[i].shape().to_vec(), moved)).unwrap();
            }
            run(&g)[0].to_f32_vec()[0] as f64
        };
        let numeric = (loss_at(1.0) - loss_at(-1.0)) / (2.0 * h as f64);
        let err = (numeric - analytic).abs();
        assert!(
            err <= 1e-2 * numeric.abs().max(analytic.abs()) + 1e-7 / h as f64,
            "{name}: gradient . u = {analytic}, finite differences {numeric}"
        );
        checked += 1;
    }
    println!("{checked} gradient rules match finite differences");
}

/// Cross-entropy with `make_training.py`'s optimizer `opt`.
fn ce(opt: &str, batch_norm: smelt_passes::train::BatchNorm) -> TrainConfig {
    TrainConfig {
        loss: Loss::CrossEntropy { smoothing: 0.0 },
        loss_on: None,
        optimizer: Some(optimizer(opt)),
        freeze: vec![],
        only: vec![],
        batch_norm,
        clip_norm: None,
        loss_scale: false,
    }
}

fn sgd_config() -> TrainConfig {
    ce("sgd", Default::default())
}

/// A case's batch: the input and the labels.
fn batch(d: &std::path::Path) -> (Tensor, Tensor) {
    (read_tensor_file(&d.join("input_0.pb")).unwrap().1, read_tensor_file(&d.join("labels.pb")).unwrap().1)
}

/// Every light model's training step plans, with fusion and without, and
/// both plans pass the independent checker (the driver checks; checked
/// again here); the arena stays within 2% of the schedule's lower bound;
/// the checker rejects the plan once an update runs before a reader of its
/// parameter.
#[test]
fn every_light_models_training_step_plans_and_checks() {
    use smelt_ir::traits::Kind;
    for name in common::LIGHT {
        let path = common::variant(name).join("model.onnx");
        let opts = smelt::Options { batch: Some(2), train: Some(sgd_config()), ..Default::default() };
        let mut s = smelt::Session::open(path.to_str().unwrap(), opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = s.compile().unwrap_or_else(|e| panic!("{name}: {e}"));
        let planned = s.plan(&c).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (g, p, what) in [(&planned.unfused, &planned.unfused_plan, "unfused"), (&c.graph, &planned.plan, "fused")] {
            smelt_passes::memory::check::check(g, p).unwrap_or_else(|e| panic!("{name} {what}: {e}"));
            let ratio = p.arena as f64 / p.lower_bound as f64;
            assert!(ratio <= 1.02, "{name} {what}: arena {} is {ratio:.4} x the lower bound {}", p.arena, p.lower_bound);
            // Corrupt: the first update runs first.
            let mut bad = p.clone();
            let at = bad.schedule.iter().position(|&n| g.node(n).op.traits().kind == Kind::Update).expect("updates");
            let u = bad.schedule.remove(at);
            let first = g.inputs().len();
            bad.schedule.insert(first, u);
            assert!(smelt_passes::memory::check::check(g, &bad).is_err(), "{name} {what}: an update before its readers passes the checker");
        }
        let t = smelt::plan::train_breakdown(&c.graph, &planned.plan, &s.train.as_ref().unwrap().step.forward);
        assert_eq!(t.parameters.count, s.train.as_ref().unwrap().step.params.len(), "{name}");
        assert!(t.optimizer_state.bytes == t.parameters.bytes && t.backward_starts_at > 0, "{name}: {t:?}");
    }
}

/// A conv read only by a frozen batch norm is differentiated as one layer:
/// in ResNet-50's step, nothing in backward reads such a conv's output, so
/// the plan keeps only conv inputs (ReLU outputs) for backward.
#[test]
fn backward_keeps_no_conv_output_before_a_frozen_batch_norm() {
    let model = common::load(common::variant("resnet50").join("model.onnx").to_str().unwrap(), Some(1));
    let step = training_step(&model, &sgd_config()).unwrap();
    let g = &step.graph;
    let mut pairs = 0;
    for n in g.node_ids().filter(|&n| matches!(g.node(n).op, Op::Conv(_))) {
        let users = g.users_of(n);
        if users.iter().any(|&u| matches!(g.node(u).op, Op::BatchNorm { .. })) {
            assert_eq!(users.len(), 1, "conv {:?} is read by {} nodes", g.node(n).name, users.len());
            pairs += 1;
        }
    }
    assert_eq!(pairs, 53, "ResNet-50 has 53 conv + batch norm pairs");
    // ReLU masks read the ReLU's output, never its input (the batch norm's output).
    for n in g.node_ids().filter(|&n| matches!(g.node(n).op, Op::Compare(_))) {
        for v in g.inputs_of(n) {
            assert!(!matches!(g.node(v.node).op, Op::BatchNorm { .. }), "a ReLU mask reads the batch norm's output, not the ReLU's");
        }
    }
}

/// Rows `from..to` of a tensor's leading dimension.
fn rows(t: &Tensor, from: usize, to: usize) -> Tensor {
    let per: usize = t.shape()[1..].iter().product();
    let mut shape = t.shape().to_vec();
    shape[0] = to - from;
    match t.data() {
        smelt_ir::TensorData::I64(v) => Tensor::from_i64(shape, v[from * per..to * per].to_vec()),
        _ => Tensor::from_f32(shape, t.to_f32_vec()[from * per..to * per].to_vec()),
    }
}

/// Gradient accumulation over K micro-batches equals one step on the whole
/// batch (batch norm frozen): two updates of SGD with momentum and of Adam,
/// each from 2 micro-batches of 2 against steps on the batch of 4.
#[test]
fn accumulation_over_micro_batches_equals_the_whole_batch() {
    let d = dir("cnn");
    let (x, labels) = batch(&d);
    for opt in ["sgd", "adam"] {
        let with = |k: usize| {
            let mut o = optimizer(opt);
            match &mut o {
                Optimizer::Sgd { accumulate, .. } | Optimizer::Adam { accumulate, .. } => *accumulate = k,
                _ => unreachable!(),
            }
            TrainConfig {
                loss: Loss::CrossEntropy { smoothing: 0.0 },
                loss_on: None,
                optimizer: Some(o),
                freeze: vec![],
                only: vec![],
                batch_norm: Default::default(),
                clip_norm: None,
                loss_scale: false,
            }
        };
        let path = d.join("model.onnx");
        let open = |k: usize| {
            let opts = smelt::Options { batch: Some(4), train: Some(with(k)), ..Default::default() };
            smelt::Session::open(path.to_str().unwrap(), opts).unwrap_or_else(|e| panic!("{opt} k={k}: {e}"))
        };
        let (whole, micro) = (open(1), open(2));
        assert_eq!(micro.batch(), Some(2), "the accumulating step is the micro-batch's");
        let (mut gw, mut gm) = (whole.source.clone(), micro.source.clone());
        for _ in 0..2 {
            smelt_runtime::cpu::run_step(&mut gw, &[x.clone(), labels.clone()]).unwrap();
            for half in [0, 2] {
                smelt_runtime::cpu::run_step(&mut gm, &[rows(&x, half, half + 2), rows(&labels, half, half + 2)]).unwrap();
            }
        }
        let mut n = 0;
        for id in gw.node_ids().filter(|&i| gw.node(i).op == Op::Parameter) {
            let name = &gw.node(id).name;
            let other = gm.node_ids().find(|&i| gm.node(i).name == *name).unwrap();
            let c = smelt::compare(gm.weight(other).unwrap(), gw.weight(id).unwrap(), 1e-4, 1e-6);
            assert!(c.ok, "{opt}: {name} after accumulation differs from whole-batch steps: {c:?}");
            n += 1;
        }
        // The accumulators are zero after each update.
        let accs: Vec<_> = gm.node_ids().filter(|&i| gm.node(i).name.ends_with(".grad_acc")).collect();
        assert_eq!(accs.len(), 10, "{opt}: an accumulator per parameter");
        for id in accs {
            assert!(gm.weight(id).unwrap().to_f32_vec().iter().all(|&v| v == 0.0), "{opt}: accumulator not reset");
        }
        assert_eq!(n, 10);
    }
}

/// `n` steps of a compiled training step as CUDA C on the emulator (the
/// parameters and state stay on the device between steps), every kernel
/// checked against its description, step `i` in the emulator's schedule
/// `i % 3` (lockstep warps, one warp at a time in order, reversed: a race
/// between a block's threads changes bytes in one of them): the program
/// and the last outputs.
fn emulated_steps(
    s: &mut smelt::Session,
    compiled: &smelt::Compiled,
    inputs: &[Tensor],
    n: usize,
) -> (smelt_codegen::Program, Vec<Tensor>) {
    emulated_steps_from(s, compiled, inputs, n, 0)
}

/// As [`emulated_steps`], step `i` in the schedule `(i + first) % 3`.
fn emulated_steps_from(
    s: &mut smelt::Session,
    compiled: &smelt::Compiled,
    inputs: &[Tensor],
    n: usize,
    first: usize,
) -> (smelt_codegen::Program, Vec<Tensor>) {
    let planned = s.plan(compiled).unwrap_or_else(|e| panic!("{e}"));
    let program = s.program(compiled, &planned).unwrap_or_else(|e| panic!("{e}"));
    let blob = program.weights_blob(&compiled.graph).unwrap();
    let mut exec = smelt_runtime::emu::executor(program.clone(), &blob, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    exec.check_against_reference(compiled.graph.clone()).unwrap();
    let mut outs = Vec::new();
    for i in 0..n {
        let schedule = smelt_runtime::emu::Schedule::ALL[(i + first) % 3];
        exec.device_mut().set_schedule(schedule);
        let (o, checks) = exec.run_checked(inputs, 1e-5).unwrap_or_else(|e| panic!("{schedule:?}: {e}"));
        let bad: Vec<String> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{} ({}) against its {:?}: {:.3e} of range", c.kernel, c.node, c.against, c.of_range))
            .collect();
        assert!(bad.is_empty(), "{schedule:?}: kernels disagree with their descriptions or the reference:\n{}", bad.join("\n"));
        outs = o;
    }
    (program, outs)
}

/// The whole training step as generated CUDA C: the program of each case
/// (fused, planned, every backward op and update a kernel) runs three steps
/// on the emulator, every kernel checked against its description on the
/// operands it was given, the parameters and state updated in place in the
/// weights blob; the weights after three steps are PyTorch's. The program's
/// CPU run (the descriptions over the arena and blob) is checked too, and
/// NVRTC compiles every kernel (ptxas: no spills).
#[test]
fn training_steps_run_as_cuda_c_on_the_emulator() {
    let nvrtc = common::nvrtc_compiler("training");
    let mut sources = std::collections::BTreeMap::new();
    for case in ["cnn", "resnet_blocks", "mlp", "tenc"] {
        let d = dir(case);
        let (x, labels) = batch(&d);
        for opt in ["sgd", "adam"] {
            let opts = smelt::Options { train: Some(ce(opt, Default::default())), ..Default::default() };
            let mut s = smelt::Session::open(d.join("model.onnx").to_str().unwrap(), opts).unwrap();
            let compiled = s.compile().unwrap();
            let inputs = [x.clone(), labels.clone()];
            let (program, outs) = emulated_steps(&mut s, &compiled, &inputs, 3);
            let kinds: std::collections::BTreeSet<&str> = program.steps.iter().map(|st| st.kernel.kind()).collect();
            assert!(kinds.contains("update") && (case == "mlp" || kinds.contains("grad")), "{case}: {kinds:?}");
            sources.extend(program.sources());
            // The descriptions, one step: the same outputs as the reference's first step.
            let cpu = program.run_cpu(&program.weights_blob(&compiled.graph).unwrap(), &inputs).unwrap();
            let want = smelt_runtime::cpu::run(&compiled.graph, &inputs).unwrap();
            for (i, (a, b)) in cpu.iter().zip(&want).enumerate() {
                let (a, b) = without_key_bias(&program.outputs[i].name, opt, a, b);
                let c = smelt::compare(&a, &b, 1e-5, 1e-7);
                assert!(c.ok, "{case}/{opt}: program output {} on the CPU: {c:?}", program.outputs[i].name);
            }
            let mut n = 0;
            for (io, got) in program.outputs.iter().zip(&outs) {
                let path = d.join(opt).join(format!("{}.pb", io.name));
                if let Ok((_, want)) = read_tensor_file(&path) {
                    let (got, want) = without_key_bias(&io.name, opt, got, &want);
                    let c = smelt::compare(&got, &want, 1e-4, 1e-6);
                    assert!(c.ok, "{case}/{opt}: {} after 3 steps on the emulator differs from PyTorch's: {c:?}", io.name);
                    n += 1;
                }
            }
            assert_eq!(n, std::fs::read_dir(d.join(opt)).unwrap().count() - 1, "{case}/{opt}");
            println!(
                "{case}/{opt}: {} kernels ({kinds:?}) on the emulator, {n} parameters after 3 steps match PyTorch's",
                program.steps.len()
            );
        }
    }
    if let Some(nv) = nvrtc {
        let all: Vec<(String, String)> = sources.into_iter().collect();
        let done = smelt_codegen::program::compile_all(&nv, &all, 2, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        common::ptxas_has_no_spills(&done);
        println!("NVRTC compiled the {} distinct kernels of the training steps", done.len());
    }
}

/// Under mixed precision a training step compiles (updates keep f32
/// master weights and read f32 gradients; the classifier is the loss's),
/// its kernels agree with their descriptions on the emulator, and three
/// steps stay near PyTorch's f32 weights.
#[test]
fn mixed_precision_training_steps_compile_and_run() {
    let d = dir("cnn");
    let (x, labels) = batch(&d);
    let opts = smelt::Options {
        train: Some(sgd_config()),
        precision: smelt_passes::precision::Options { policy: "mixed-f16".parse().unwrap(), keep_f32: vec![], ..Default::default() },
        ..Default::default()
    };
    let mut s = smelt::Session::open(d.join("model.onnx").to_str().unwrap(), opts).unwrap();
    let compiled = s.compile().unwrap();
    let stats = compiled.stats.precision.as_ref().unwrap();
    let classifiers: Vec<_> = stats.kept_f32.iter().filter(|k| k.reason == "classifier").collect();
    assert_eq!(classifiers.len(), 1, "only the last gemm is the classifier: {classifiers:?}");
    let (program, outs) = emulated_steps(&mut s, &compiled, &[x.clone(), labels.clone()], 3);
    assert_eq!(program.outputs.len(), outs.len());
    let model = &s.source;
    let mut n = 0;
    for (io, got) in program.outputs.iter().zip(&outs) {
        if let Ok((_, want)) = read_tensor_file(&d.join("sgd").join(format!("{}.pb", io.name))) {
            let err = common::excess(got, &want, 0.0, 0.02);
            assert!(err <= 1.0, "{}: mixed-f16 weights after 3 steps are {err} x 2% of range from PyTorch's f32", io.name);
            // The step moved the weight as PyTorch's did: the distance from
            // the initial weight is PyTorch's within 10%.
            let initial = model.weight(model.node_ids().find(|&id| model.node(id).name == io.name).unwrap()).unwrap();
            let dist =
                |t: &Tensor| t.to_f32_vec().iter().zip(initial.to_f32_vec()).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
            let (ours, theirs) = (dist(got), dist(&want));
            assert!(
                theirs > 0.0 && (ours - theirs).abs() <= 0.1 * theirs,
                "{}: moved {ours:.3e} in 3 mixed-f16 steps, PyTorch's f32 {theirs:.3e}",
                io.name
            );
            n += 1;
        }
    }
    // Every parameter PyTorch trains (its files but the losses) was compared.
    assert_eq!(n, std::fs::read_dir(d.join("sgd")).unwrap().count() - 1, "mixed-f16: parameters compared");
    // One step from the same weights in each schedule of a block's threads
    // (lockstep, warps in order, reversed): the same bytes, or threads race.
    let runs: Vec<Vec<Tensor>> =
        (0..3).map(|first| emulated_steps_from(&mut s, &compiled, &[x.clone(), labels.clone()], 1, first).1).collect();
    for (i, run) in runs.iter().enumerate().skip(1) {
        for ((a, b), io) in common::paired(&runs[0], run).zip(&program.outputs) {
            let same = a.data().to_le_bytes() == b.data().to_le_bytes();
            assert!(same, "{}: a mixed-f16 step in schedule {:?} differs from {:?}", io.name, Schedule::ALL[i], Schedule::ALL[0]);
        }
    }
}

/// Batch norm in training mode (`BatchNorm::Train`): batch statistics
/// normalize and the running statistics follow them. Three steps of SGD
/// with momentum and of Adam from PyTorch's `model.train()` give PyTorch's
/// parameters and running statistics, as built, fused, and as CUDA C on the
/// emulator.
#[test]
fn batch_norm_in_training_mode_matches_pytorch() {
    let d = dir("bn_train");
    let model = common::load(d.join("model.onnx").to_str().unwrap(), None);
    let (x, labels) = batch(&d);
    for opt in ["sgd", "adam"] {
        let cfg = ce(opt, smelt_passes::train::BatchNorm::Train { momentum: 0.1 });
        let want_losses = read_tensor_file(&d.join(opt).join("losses.pb")).unwrap().1.to_f32_vec();
        let step = training_step(&model, &cfg).unwrap();
        let mut s = common::session(&model, smelt::Options { train: Some(cfg), ..Default::default() });
        let compiled = s.compile().unwrap();
        let (program, emulated) = emulated_steps(&mut s, &compiled, &[x.clone(), labels.clone()], 3);
        let emulated: Vec<(String, Tensor)> = program.outputs.iter().map(|io| io.name.clone()).zip(emulated).collect();
        // Every persistent value after three steps: parameters and running statistics.
        let all = |r: Result<Vec<(String, Tensor, Op)>, String>| -> Vec<(String, Tensor)> {
            r.unwrap_or_else(|e| panic!("{opt}: {e}")).into_iter().map(|p| (p.0, p.1)).collect()
        };
        let built = all(persistent_after(step.graph, &[x.clone(), labels.clone()], &want_losses));
        let fused = all(persistent_after(compiled.graph.clone(), &[x.clone(), labels.clone()], &want_losses));
        for (how, values) in [("as built", &built), ("fused", &fused), ("emulated", &emulated)] {
            let mut n = 0;
            for (name, got) in values {
                let want = read_tensor_file(&d.join(opt).join(format!("{name}.pb")))
                    .or_else(|_| read_tensor_file(&d.join(opt).join("running").join(format!("{name}.pb"))));
                if let Ok((_, want)) = want {
                    let c = smelt::compare(got, &want, 1e-4, 1e-6);
                    assert!(c.ok, "{opt} {how}: {name} after 3 steps differs from PyTorch's: {c:?}");
                    n += 1;
                }
            }
            // 8 parameters (2 convs' weights, 2 norms' scale and bias, the linear's two) and 4 running statistics.
            assert_eq!(n, 12, "{opt} {how}: every parameter and running statistic compared");
        }
    }
}

/// The backward kernels at the sizes a GPU trains at (ResNet-8, batch 32):
/// conv data and weight gradients as register-tiled (64x64) and plain
/// (16x16) GEMMs and as small tiles whose threads split the sum, strided
/// too, and batch norm's long sums reduced a block per row, run as CUDA C
/// on the emulator and agree with their descriptions.
#[test]
fn backward_kernels_at_gpu_sizes_run_on_the_emulator() {
    let opts = smelt::Options { batch: Some(32), train: Some(ce("sgd", Default::default())), ..Default::default() };
    let mut s = smelt::Session::open("zoo:resnet8", opts).unwrap_or_else(|e| panic!("{e}"));
    let compiled = s.compile().unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f32> = (0..32 * 3 * 32 * 32).map(|i| ((i * 7919 % 1013) as f32 / 1013.0) - 0.5).collect();
    let labels: Vec<i64> = (0..32).map(|i| i % 10).collect();
    let inputs = [Tensor::from_f32(vec![32, 3, 32, 32], x), Tensor::from_i64(vec![32], labels)];
    let (program, outs) = emulated_steps(&mut s, &compiled, &inputs, 1);
    assert!(outs.iter().all(|t| t.to_f32_vec().iter().all(|v| v.is_finite())));
    let sources = program.sources();
    let has = |prefix: &str, text: &str| sources.iter().any(|(name, src)| name.starts_with(prefix) && src.contains(text));
    assert!(has("conv_grad_data_s2", "(4x4 a thread)"), "a strided data gradient, register-tiled");
    assert!(has("conv_grad_data_s1", "(4x4 a thread)"), "a data gradient, register-tiled");
    assert!(has("conv_grad_data", "(1x1 a thread)"), "a data gradient, 16x16");
    assert!(has("conv_grad_weight", "(16 slices of the sum)"), "a weight gradient, 4x4 tiles, its sum split in 16");
    assert!(has("conv_grad_weight", "(4 slices of the sum)"), "a weight gradient, 8x8 tiles, its sum split in 4");
    assert!(has("reduce_sum", "part[t]"), "a long sum, a block per row");
}

/// The Hugging Face cases of `scripts/make_hf_training.py`: every model by
/// both exporters but Swin (torch.export fails on it), and a fresh Llama.
const HF_CASES: [&str; 17] = [
    "llama_torchscript",
    "llama_torchscript_folded",
    "llama_dynamo",
    "llama_fresh_torchscript",
    "qwen2_tied_torchscript",
    "qwen2_tied_dynamo",
    "gpt2_torchscript",
    "gpt2_dynamo",
    "bert_torchscript",
    "bert_dynamo",
    "roberta_torchscript",
    "roberta_dynamo",
    "vit_torchscript",
    "vit_dynamo",
    "convnext_torchscript",
    "convnext_dynamo",
    "swin_torchscript",
];

/// Transposes a matrix.
fn transposed(t: &Tensor) -> Tensor {
    let (r, c) = (t.shape()[0], t.shape()[1]);
    t.take(&(0..c * r).map(|k| (k % r) * c + k / r).collect::<Vec<_>>(), vec![c, r])
}

/// Every parameter PyTorch trains is trained, and nothing else (tied
/// weights as one parameter); after three steps of SGD and of Adam each
/// ends within 1e-3 (SGD) or 1e-2 (Adam) of PyTorch's update, plus 4 ulps
/// of its largest value (float32 rounding of tiny steps on values near 1).
/// Elements whose exact gradient is zero (attention key biases: a float64
/// PyTorch step says which) are rounding noise on both sides, which Adam
/// turns into steps of up to lr: they must move at most 2 lr a step under
/// Adam, 1e-6 under SGD.
#[test]
fn hugging_face_models_train_as_pytorch_trains_them() {
    let mut table = Vec::new();
    for case in HF_CASES {
        let d = common::testdata().join("hf_training").join(case);
        assert!(d.join("model.onnx").is_file(), "{} missing: run scripts/fetch-testdata.sh", d.display());
        let meta = std::fs::read_to_string(d.join("meta.txt")).unwrap();
        let loss = if meta.contains("loss=causal-lm") { Loss::CausalLm { smoothing: 0.0 } } else { Loss::CrossEntropy { smoothing: 0.0 } };
        let mut inputs: Vec<Tensor> =
            (0..).map(|i| d.join(format!("input_{i}.pb"))).take_while(|p| p.is_file()).map(|p| read_tensor_file(&p).unwrap().1).collect();
        inputs.push(read_tensor_file(&d.join("labels.pb")).unwrap().1);
        let rows: Vec<(String, String, bool)> = std::fs::read_to_string(d.join("params.txt"))
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f[0].to_string(), f[1].to_string(), f[2] == "T")
            })
            .collect();
        let pytorch: std::collections::BTreeSet<&String> = rows.iter().map(|r| &r.1).collect();
        // PyTorch's list where the case has one (names of folded weights
        // resolved through their nodes' names); smelt's rule elsewhere.
        let only: Vec<String> =
            std::fs::read_to_string(d.join("trainable.txt")).map(|t| t.lines().map(String::from).collect()).unwrap_or_default();
        let mut worst = Vec::new();
        for (opt, lr) in [("sgd", 0.1f32), ("adam", 1e-3)] {
            let optimizer = if opt == "sgd" {
                Optimizer::Sgd {
                    lr,
                    momentum: 0.0,
                    dampening: 0.0,
                    nesterov: false,
                    weight_decay: 0.0,
                    accumulate: 1,
                    schedule: Default::default(),
                }
            } else {
                common::adam(1, Default::default())
            };
            let cfg = TrainConfig {
                loss,
                loss_on: None,
                optimizer: Some(optimizer),
                freeze: vec![],
                only: only.clone(),
                batch_norm: Default::default(),
                clip_norm: None,
                loss_scale: false,
            };
            let s = smelt::Session::open(d.join("model.onnx").to_str().unwrap(), smelt::Options { train: Some(cfg), ..Default::default() })
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            let train = s.train.expect("a training session");
            let trained: std::collections::BTreeSet<&String> =
                train.step.initializers.iter().filter(|i| i.trained).map(|i| &i.name).collect();
            assert_eq!(trained, rows.iter().map(|r| &r.0).collect(), "{case}: smelt trains the initializers holding PyTorch's parameters");
            let frozen: Vec<_> = train.step.initializers.iter().filter(|i| !i.trained).collect();
            assert!(frozen.iter().all(|i| i.frozen_because.is_some()), "{case}: {frozen:?}");
            let want_losses = read_tensor_file(&d.join(opt).join("losses.pb")).unwrap().1.to_f32_vec();
            let after = run_steps(train.step.graph, &inputs, &want_losses).unwrap_or_else(|e| panic!("{case}/{opt}: {e}"));
            let after = smelt::train::with_tied(after, &train.step.initializers);
            let model = &train.model;
            let (mut err_worst, mut at) = (0f64, String::new());
            for (onnx, pt, t) in &rows {
                let got = &after.iter().find(|a| &a.0 == onnx).unwrap_or_else(|| panic!("{case}/{opt}: {onnx} not trained")).1;
                let initial = model.weight(model.node_ids().find(|&n| &model.node(n).name == onnx).unwrap()).unwrap();
                let (got, initial) = if *t { (transposed(got), transposed(initial)) } else { (got.clone(), initial.as_ref().clone()) };
                let want = read_tensor_file(&d.join(opt).join(format!("{pt}.pb"))).unwrap().1;
                let zero = read_tensor_file(&d.join("exact_zero").join(format!("{pt}.pb"))).ok().map(|z| z.1.to_f32_vec());
                let (g, w, i0) = (got.to_f32_vec(), want.to_f32_vec(), initial.to_f32_vec());
                let noise = |k: usize| zero.as_ref().is_some_and(|z| z[k] == 1.0);
                let (mut err, mut upd, mut big) = (0f64, 0f64, 0f64);
                for k in 0..w.len() {
                    if noise(k) {
                        // SGD moves it by lr times rounding noise; Adam by up to lr a step.
                        let (moved, bound) = ((g[k] - i0[k]).abs(), if opt == "sgd" { 1e-6 } else { 2.0 * 3.0 * lr + 1e-6 });
                        assert!(moved <= bound, "{case}/{opt}: {pt}[{k}] (zero gradient) moved {moved}");
                        continue;
                    }
                    err = err.max((g[k] - w[k]).abs() as f64);
                    upd = upd.max((w[k] - i0[k]).abs() as f64);
                    big = big.max(w[k].abs() as f64);
                }
                let rel = if opt == "sgd" { 1e-3 } else { 1e-2 };
                let ulps = 4.0 * f32::EPSILON as f64 * big;
                if zero.as_ref().is_some_and(|z| z.iter().all(|&x| x == 1.0)) {
                    continue;
                }
                assert!(upd > 0.0, "{case}/{opt}: {pt} did not move in PyTorch");
                assert!(err <= rel * upd + ulps, "{case}/{opt}: {pt} ({onnx}) differs from PyTorch's by {err:e}, its update {upd:e}");
                if err / upd > err_worst {
                    (err_worst, at) = (err / upd, pt.clone());
                }
            }
            worst.push(format!("{opt} {err_worst:.1e} ({at})"));
        }
        let exporter = meta.lines().find_map(|l| l.strip_prefix("options=")).unwrap_or("");
        table.push(format!(
            "{case} [{exporter}]: PyTorch trains {}, smelt trains {}; worst error / update: {}",
            pytorch.len(),
            rows.len(),
            worst.join(", ")
        ));
    }
    println!("{}", table.join("\n"));
}
