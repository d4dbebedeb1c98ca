//! Shared helpers of the integration tests: where the test data lives.
#![allow(dead_code)]

use smelt_ir::{builder::Builder, BinaryOp, DType, Graph, Op, Rng, Tensor, UnaryOp, ValueId};
use std::path::PathBuf;

/// `a` and `b` element by element, after asserting that both are as long
/// and not empty: a comparison over a plain `zip` of lists of different
/// lengths checks only the shorter one, and over empty lists nothing.
pub fn paired<'a, A, B>(a: &'a [A], b: &'a [B]) -> std::iter::Zip<std::slice::Iter<'a, A>, std::slice::Iter<'a, B>> {
    assert_eq!(a.len(), b.len(), "lists of different lengths compared");
    assert!(!a.is_empty(), "empty lists compared");
    a.iter().zip(b)
}

/// PyTorch's default Adam (lr 1e-3, betas 0.9 and 0.999, eps 1e-8, no
/// weight decay) over `accumulate` micro-batches with `schedule`.
pub fn adam(accumulate: usize, schedule: smelt_ir::Schedule) -> smelt_ir::Optimizer {
    smelt_ir::Optimizer::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: false, accumulate, schedule }
}

/// The nine light models of the onnx wheel.
pub const LIGHT: [&str; 9] =
    ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"];

/// `.testdata/` (or `$SMELT_TESTDATA`), made by `scripts/fetch-testdata.sh`.
/// Panics with the fix when it is missing: these tests never pass silently.
pub fn testdata() -> PathBuf {
    let dir = std::env::var_os("SMELT_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".testdata"));
    assert!(
        dir.join("onnx-data/light").is_dir() && dir.join("variants/.done").is_file(),
        "test data missing under {}: run scripts/fetch-testdata.sh (or scripts/test.sh)",
        dir.display()
    );
    dir
}

/// The onnx wheel's `backend/test/data`.
pub fn onnx_data() -> PathBuf {
    testdata().join("onnx-data")
}

/// `light/light_<name>.onnx`.
pub fn light_model(name: &str) -> PathBuf {
    onnx_data().join(format!("light/light_{name}.onnx"))
}

/// The random-weight variant folder of a light model.
pub fn variant(name: &str) -> PathBuf {
    testdata().join("variants").join(name)
}

/// Seeded standard-normal values for every graph input, in its dtype.
pub fn random_inputs<O: smelt_ir::OpSet>(g: &Graph<O>, seed: u64) -> Vec<Tensor> {
    let mut r = Rng::new(seed);
    g.inputs()
        .iter()
        .map(|&i| {
            let ty = &g.node(i).outputs[0];
            let v: Vec<f32> = (0..ty.numel()).map(|_| r.normal()).collect();
            match ty.dtype {
                // Half true, half false.
                DType::Bool => Tensor::from_f32(ty.shape.clone(), v.into_iter().map(|x| (x > 0.0) as u8 as f32).collect()).cast(ty.dtype),
                _ => Tensor::from_f32(ty.shape.clone(), v).cast(ty.dtype),
            }
        })
        .collect()
}

/// The `smelt` binary built for this test run.
pub fn smelt() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_smelt"))
}

/// A random graph of convs (with batch norm, residuals, activations), pools,
/// elementwise ops with broadcasting, concat, flatten and softmax.
pub fn random_graph(seed: u64) -> Graph {
    let mut r = Rng::new(seed);
    let mut b = Builder::new(seed);
    let c = 1 + r.below(4);
    let x = b.input("x", &[1 + r.below(2), c, 4 + r.below(5), 4 + r.below(5)]).unwrap();
    let mut vals: Vec<ValueId> = vec![x];
    for _ in 0..3 + r.below(10) {
        let v = vals[r.below(vals.len())];
        let ty = b.ty(v).clone();
        let out = match r.below(12) {
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
            8 => {
                // A conv-bn-act chain, sometimes with a residual.
                let c = ty.shape.get(1).copied().unwrap_or(1);
                let y = b.conv(v, c, 3, 1, 1).and_then(|y| b.batch_norm(y, 1.0));
                match (y, r.below(3)) {
                    (Ok(y), 0) => b.add(y, v).and_then(|s| b.relu(s)),
                    (Ok(y), 1) => b.op(Op::Unary(UnaryOp::Sigmoid), &[y]).and_then(|s| b.op(Op::Binary(BinaryOp::Mul), &[y, s])),
                    (Ok(y), _) => b.relu6(y),
                    (Err(e), _) => Err(e),
                }
            }
            9 => b.op(Op::Identity, &[v]),
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

/// Assembles every PTX with ptxas for sm_90 and asserts no kernel spills
/// (ptxas is required where the test script set SMELT_PTXAS).
pub fn ptxas_has_no_spills(done: &[smelt_codegen::nvrtc::Compiled]) {
    let Some(exe) = smelt_codegen::ptxas::find() else {
        assert!(std::env::var_os("SMELT_REQUIRE_NVRTC").is_none(), "SMELT_REQUIRE_NVRTC is set but ptxas is not found (SMELT_PTXAS)");
        eprintln!("SKIP (ptxas part): ptxas not found; registers and spills not checked");
        return;
    };
    let stats: Vec<smelt_codegen::ptxas::Stats> = std::thread::scope(|s| {
        let half = done.len().div_ceil(2);
        let parts: Vec<_> = done
            .chunks(half.max(1))
            .map(|part| {
                s.spawn(|| part.iter().flat_map(|c| smelt_codegen::ptxas::stats(&exe, &c.ptx, "sm_90").unwrap()).collect::<Vec<_>>())
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().unwrap()).collect()
    });
    assert_eq!(stats.len(), done.len());
    let spills: Vec<_> = stats.iter().filter(|s| s.spill_loads + s.spill_stores > 0).collect();
    assert!(spills.is_empty(), "kernels spill: {spills:?}");
    let max = stats.iter().max_by_key(|s| s.registers).unwrap();
    println!("ptxas sm_90: {} kernels, none spills, most registers {} ({})", stats.len(), max.registers, max.kernel);
}

/// An NVRTC compiler with a cache private to this test process (`tag`
/// names it), or `None` with a SKIP line where libnvrtc cannot be loaded;
/// where the test script set SMELT_REQUIRE_NVRTC, that is a failure.
pub fn nvrtc_compiler(tag: &str) -> Option<smelt_codegen::nvrtc::Compiler> {
    if smelt_codegen::nvrtc_available() {
        let dir = std::env::temp_dir().join(format!("smelt-{tag}-{}", std::process::id()));
        return Some(smelt_codegen::nvrtc::Compiler { cache: Some(smelt_codegen::Cache::new(dir)), ..Default::default() });
    }
    assert!(std::env::var_os("SMELT_REQUIRE_NVRTC").is_none(), "SMELT_REQUIRE_NVRTC is set but libnvrtc cannot be loaded");
    eprintln!("SKIP (NVRTC part): libnvrtc not found; kernels are checked on the CPU only");
    None
}

/// Whether libnvrtc loads, for a test that needs it (`needs`: what does):
/// where the test script requires it, its absence fails the test; elsewhere
/// the test says why it skips.
pub fn nvrtc_or_skip(needs: &str) -> bool {
    if smelt_codegen::nvrtc_available() {
        return true;
    }
    assert!(std::env::var_os("SMELT_REQUIRE_NVRTC").is_none(), "SMELT_REQUIRE_NVRTC is set but libnvrtc cannot be loaded");
    eprintln!("SKIP: libnvrtc not found; {needs} needs it");
    false
}

/// A driver session over an in-memory graph.
pub fn session(g: &Graph, options: smelt::Options) -> smelt::Session {
    smelt::Session::from_graph("test graph", g.clone(), options).unwrap_or_else(|e| panic!("{e}"))
}

/// `g` through the driver's pass pipeline (fusion when `fuse`).
pub fn compiled(g: &Graph, fuse: bool) -> smelt_ir::KernelGraph {
    session(g, smelt::Options { no_fuse: !fuse, ..Default::default() }).compile().unwrap_or_else(|e| panic!("{e}")).graph
}

/// A model opened by the driver (`path.onnx`, `zoo:NAME`), as imported.
pub fn load(spec: &str, batch: Option<usize>) -> Graph {
    smelt::Session::open(spec, smelt::Options { batch, ..Default::default() }).unwrap_or_else(|e| panic!("{spec}: {e}")).source
}

/// A random graph of every op kind that has a kernel: grouped, dilated and
/// strided convs with batch norm and residuals, max, average and global
/// pooling, LRN, transpose, reshape, flatten, concat, GEMM, softmax and
/// broadcasting elementwise ops; with two or three outputs (one an
/// intermediate value, so a kernel's output is read by the caller and by
/// later kernels).
pub fn random_kernel_graph(seed: u64) -> Graph {
    use smelt_ir::{Conv, Pool};
    let mut r = Rng::new(seed ^ 0x5eed);
    let mut b = Builder::new(seed);
    let c = 2 + r.below(5);
    let x = b.input("x", &[1 + r.below(2), c, 5 + r.below(6), 5 + r.below(6)]).unwrap();
    let mut vals: Vec<ValueId> = vec![x];
    for _ in 0..4 + r.below(10) {
        let v = vals[r.below(vals.len())];
        let ty = b.ty(v).clone();
        let s = &ty.shape;
        let four = s.len() == 4;
        let out = match r.below(14) {
            0 if four && s[1].is_multiple_of(2) => {
                let g = if r.below(2) == 0 { s[1] } else { 2 };
                b.conv_g(v, s[1] * (1 + r.below(2)), 3, 1 + r.below(2), 1, g)
            }
            1 if four => {
                let w = b.weight(format!("dil{}", r.next_u64()), &[2 + r.below(10), s[1], 3, 3], |r| 0.3 * r.normal());
                b.op(Op::Conv(Conv { strides: vec![1; 2], pads: vec![2; 4], dilations: vec![2; 2], group: 1 }), &[v, w])
            }
            2 if four => b.conv(v, 8 + r.below(70), 1 + 2 * r.below(2), 1 + r.below(2), r.below(2)),
            3 if four => b.batch_norm(v, 1.0),
            4 if four && s[2] >= 3 && s[3] >= 3 => {
                let pool = Pool { kernel: vec![3, 2], strides: vec![1 + r.below(2); 2], pads: vec![1, 0, 1, 1], ceil_mode: false };
                b.op(Op::AveragePool { pool, count_include_pad: r.below(2) == 0 }, &[v])
            }
            5 if four => b.op(Op::GlobalAveragePool, &[v]),
            6 if four => b.op(Op::Lrn(smelt_ir::Lrn { size: 3, alpha: 1e-3, beta: 0.75, bias: 1.0 }), &[v]),
            7 if four => b.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[v]).and_then(|t| b.relu(t)),
            8 => {
                let w = vals.iter().copied().find(|&w| w != v && b.ty(w).shape == ty.shape);
                match w {
                    Some(w) => b.op(Op::Concat { axis: 1 }, &[v, w]),
                    None => b.op(Op::Unary(UnaryOp::Tanh), &[v]),
                }
            }
            9 => b.op(Op::Flatten { axis: 1 }, &[v]).and_then(|f| b.linear(f, 3 + r.below(20))).and_then(|y| b.relu(y)),
            10 => {
                let k = if four { b.weight(format!("k{}", r.next_u64()), &[s[1], 1, 1], |r| r.normal()) } else { v };
                b.op(Op::Binary([BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max][r.below(3)]), &[v, k])
            }
            11 if four => {
                let n: usize = s.iter().product();
                b.op(Op::Reshape { shape: vec![s[0], n / s[0]] }, &[v]).and_then(|y| b.softmax(y))
            }
            12 if four => b.max_pool(v, 2, 1 + r.below(2), r.below(2)),
            _ => b.op(Op::Unary([UnaryOp::Sigmoid, UnaryOp::Gelu, UnaryOp::LeakyRelu(0.1)][r.below(3)]), &[v]),
        };
        if let Ok(o) = out {
            vals.push(o);
        }
    }
    let last = *vals.last().unwrap();
    let mut g = b.finish("y", last).unwrap();
    // One or two more outputs: computed values other than the last.
    let mut outs = g.outputs().to_vec();
    for i in 0..1 + r.below(2) {
        let v = vals[1 + r.below(vals.len() - 1)];
        if v != last && !outs.iter().any(|(_, o)| *o == v) && vals.len() > 2 {
            outs.push((format!("extra{i}"), v));
        }
    }
    g.set_outputs(outs);
    g
}

/// `g` with its final Softmax removed: the logits, where every class is
/// checked (most probabilities of a 1000-way softmax are below any useful
/// absolute tolerance).
pub fn logits(mut g: Graph) -> Graph {
    let outs: Vec<_> = g
        .outputs()
        .iter()
        .map(|(name, v)| match g.node(v.node).op {
            Op::Softmax { .. } => (name.clone(), g.inputs_of(v.node)[0]),
            _ => (name.clone(), *v),
        })
        .collect();
    g.set_outputs(outs);
    g
}

/// Largest `|got - want|` over `rtol * |want| + atol_of_range * max|want|`:
/// at most 1 where `got` is within tolerance everywhere.
pub fn excess(got: &Tensor, want: &Tensor, rtol: f64, atol_of_range: f64) -> f64 {
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    assert_eq!(g.len(), w.len(), "output sizes differ: {} against {}", got.ty(), want.ty());
    let range = w.iter().fold(0f64, |m, x| m.max((*x as f64).abs()));
    g.iter()
        .zip(&w)
        .map(|(a, b)| ((*a as f64) - (*b as f64)).abs() / (rtol * (*b as f64).abs() + atol_of_range * range))
        .fold(0f64, f64::max)
}
