//! Every op's facts (`Op::traits`) agree with what code generation and the
//! executors do: an op that says it has a kernel lowers to one whose CPU run
//! matches the reference executor and whose CUDA C compiles; an op that says
//! it has none is refused with an error naming the node and why.

mod common;

use smelt_codegen::{Kernel, Lowered, Route};
use smelt_ir::traits::InPlace;
use smelt_ir::{
    Act, BinaryOp, CompareOp, Conv, DType, Expr, KernelGraph, KernelOp, LogicOp, Named, Op, OpSet, Pool, ReduceOp, Rng, Tensor, TensorType,
    UnaryOp,
};

fn f32t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// One instance of every op with operand types it accepts: operand 0 is a
/// graph input, the others constants.
fn samples() -> Vec<(KernelOp, Vec<TensorType>)> {
    let x = f32t(&[1, 4, 5, 5]);
    let conv = Conv { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 };
    let pool = Pool { kernel: vec![3, 3], strides: vec![1, 1], pads: vec![1, 1, 1, 1], ceil_mode: false };
    let gemm = (false, true, 1.0, 1.0);
    let mut v = vec![
        (KernelOp::Op(Op::Conv(conv.clone())), vec![x.clone(), f32t(&[3, 4, 3, 3]), f32t(&[3])]),
        (
            KernelOp::FusedConv { conv, bias: true, residual: true, act: Act::Relu },
            vec![x.clone(), f32t(&[3, 4, 3, 3]), f32t(&[3]), f32t(&[1, 3, 5, 5])],
        ),
        (KernelOp::Op(Op::BatchNorm { epsilon: 1e-5 }), vec![x.clone(), f32t(&[4]), f32t(&[4]), f32t(&[4]), f32t(&[4])]),
        (KernelOp::Op(Op::Clip { min: -0.5, max: 0.5 }), vec![x.clone()]),
        (KernelOp::Op(Op::Sum), vec![x.clone(), x.clone(), f32t(&[4, 1, 1])]),
        (KernelOp::Op(Op::MaxPool(pool.clone())), vec![x.clone()]),
        (KernelOp::Op(Op::AveragePool { pool, count_include_pad: false }), vec![x.clone()]),
        (KernelOp::Op(Op::GlobalAveragePool), vec![x.clone()]),
        (KernelOp::Op(Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdims: true }), vec![x.clone()]),
        (KernelOp::Op(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 2], keepdims: false }), vec![x.clone()]),
        (KernelOp::Op(Op::Reduce { op: ReduceOp::Max, axes: vec![1, 3], keepdims: true }), vec![x.clone()]),
        (
            KernelOp::FusedReduction {
                expr: "mul($0, $1)".parse::<Expr>().unwrap(),
                reduction: smelt_ir::Reducer::Reduce { op: ReduceOp::Mean, axes: vec![3], keepdims: true },
            },
            vec![x.clone(), f32t(&[4, 1, 1])],
        ),
        (
            KernelOp::Op(Op::Gemm { trans_a: gemm.0, trans_b: gemm.1, alpha: gemm.2, beta: gemm.3 }),
            vec![f32t(&[2, 8]), f32t(&[6, 8]), f32t(&[6])],
        ),
        (
            KernelOp::FusedGemm { trans_a: gemm.0, trans_b: gemm.1, alpha: gemm.2, beta: gemm.3, act: Act::Sigmoid },
            vec![f32t(&[2, 8]), f32t(&[6, 8]), f32t(&[6])],
        ),
        (KernelOp::Op(Op::MatMul), vec![f32t(&[2, 3, 8]), f32t(&[8, 5])]),
        // Batched with broadcasting batch dims; a vector times a batch of matrices.
        (KernelOp::Op(Op::MatMul), vec![f32t(&[2, 3, 4, 8]), f32t(&[3, 8, 5])]),
        (KernelOp::Op(Op::MatMul), vec![f32t(&[8]), f32t(&[2, 8, 5])]),
        (KernelOp::Op(Op::Concat { axis: 1 }), vec![x.clone(), f32t(&[1, 2, 5, 5])]),
        (KernelOp::ConcatInPlace { axis: 1 }, vec![x.clone(), f32t(&[1, 2, 5, 5])]),
        (KernelOp::SliceView { axis: 1, start: 1, end: 3 }, vec![x.clone()]),
        (KernelOp::Op(Op::Split { axis: 1, sizes: vec![1, 3] }), vec![x.clone()]),
        (KernelOp::Op(Op::Slice { axes: vec![2], starts: vec![1], ends: vec![4], steps: vec![2] }), vec![x.clone()]),
        (KernelOp::Op(Op::Reshape { shape: vec![1, 100] }), vec![x.clone()]),
        (KernelOp::Op(Op::Flatten { axis: 1 }), vec![x.clone()]),
        (KernelOp::Op(Op::Transpose { perm: vec![0, 2, 3, 1] }), vec![x.clone()]),
        (KernelOp::Op(Op::Squeeze { axes: vec![0] }), vec![x.clone()]),
        (KernelOp::Op(Op::Unsqueeze { axes: vec![0] }), vec![x.clone()]),
        (KernelOp::Op(Op::Softmax { axis: 1 }), vec![x.clone()]),
        (KernelOp::Op(Op::LogSoftmax { axis: 3 }), vec![x.clone()]),
        (KernelOp::Op(Op::LayerNorm { axis: 3, epsilon: 1e-5 }), vec![x.clone(), f32t(&[5]), f32t(&[5])]),
        (KernelOp::Op(Op::LayerNorm { axis: 2, epsilon: 1e-5 }), vec![x.clone(), f32t(&[5, 5])]),
        (
            KernelOp::FusedReduction {
                expr: "add($0,$1)".parse::<Expr>().unwrap(),
                reduction: smelt_ir::Reducer::LayerNorm { axis: 3, epsilon: 1e-5 },
            },
            vec![x.clone(), f32t(&[4, 1, 1]), f32t(&[5]), f32t(&[5])],
        ),
        (KernelOp::Op(Op::Lrn(smelt_ir::Lrn { size: 3, alpha: 1e-4, beta: 0.75, bias: 1.0 })), vec![x.clone()]),
        (KernelOp::Op(Op::Dropout), vec![x.clone()]),
        (KernelOp::Op(Op::Identity), vec![x.clone()]),
        (KernelOp::Op(Op::Pad { pads: vec![0, 0, 1, 1, 0, 0, 1, 1], mode: smelt_ir::PadMode::Edge }), vec![x.clone()]),
        (KernelOp::Op(Op::Expand { shape: vec![2, 4, 5, 5] }), vec![x.clone()]),
        (KernelOp::Op(Op::Gather { axis: 0 }), vec![f32t(&[10, 4]), TensorType::new(DType::I64, vec![3])]),
        (KernelOp::Op(Op::Tile { repeats: vec![1, 1, 2, 1] }), vec![x.clone()]),
        (KernelOp::Op(Op::Cast { to: DType::F16 }), vec![x.clone()]),
        (KernelOp::Elementwise { expr: "add(mul($0,$1),tanh($0))".parse::<Expr>().unwrap() }, vec![x.clone(), f32t(&[4, 1, 1])]),
        (
            KernelOp::FusedReduction { expr: "relu($0)".parse::<Expr>().unwrap(), reduction: smelt_ir::Reducer::GlobalAveragePool },
            vec![x.clone()],
        ),
    ];
    v.extend(UnaryOp::ALL.into_iter().map(|u| (KernelOp::Op(Op::Unary(u)), vec![x.clone()])));
    for b in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow, BinaryOp::Max, BinaryOp::Min, BinaryOp::PRelu] {
        v.push((KernelOp::Op(Op::Binary(b)), vec![x.clone(), f32t(&[4, 1, 1])]));
    }
    let b = |shape: &[usize]| TensorType::new(DType::Bool, shape.to_vec());
    for c in CompareOp::ALL {
        v.push((KernelOp::Op(Op::Compare(c)), vec![x.clone(), f32t(&[4, 1, 1])]));
    }
    for l in LogicOp::ALL {
        v.push((KernelOp::Op(Op::Logic(l)), vec![b(&[1, 4, 5, 5]), b(&[4, 1, 1])]));
    }
    v.push((KernelOp::Op(Op::Not), vec![b(&[1, 4, 5, 5])]));
    let i64t = |shape: &[usize]| TensorType::new(DType::I64, shape.to_vec());
    v.push((KernelOp::Op(Op::Compare(CompareOp::Less)), vec![i64t(&[2, 5]), i64t(&[5])]));
    v.push((KernelOp::Op(Op::Cast { to: DType::F32 }), vec![i64t(&[2, 5])]));
    v.push((KernelOp::Op(Op::Cast { to: DType::Bool }), vec![x.clone()]));
    v.push((KernelOp::Op(Op::Cast { to: DType::F16 }), vec![b(&[2, 5])]));
    v.push((KernelOp::Op(Op::Where), vec![b(&[2, 1, 5]), i64t(&[3, 1]), i64t(&[5])]));
    v.push((KernelOp::Op(Op::Gather { axis: 1 }), vec![f32t(&[2, 10, 3]), i64t(&[2, 2])]));
    v.push((KernelOp::Op(Op::Gather { axis: 0 }), vec![i64t(&[10]), i64t(&[])]));
    v.push((KernelOp::Op(Op::Slice { axes: vec![1, 3], starts: vec![3, 4], ends: vec![-1, -1], steps: vec![-2, -1] }), vec![x.clone()]));
    v.push((KernelOp::Op(Op::Pad { pads: vec![0, 1, 2, 0, 0, 1, 3, 2], mode: smelt_ir::PadMode::Reflect }), vec![x.clone()]));
    v.push((KernelOp::Op(Op::Pad { pads: vec![0, 0, 1, 0, 0, 0, 0, 2], mode: smelt_ir::PadMode::Constant(-1.5) }), vec![x.clone()]));
    v.push((KernelOp::Op(Op::Expand { shape: vec![3, 4, 5, 5] }), vec![f32t(&[4, 1, 5])]));
    v.push((KernelOp::Op(Op::IsNaN), vec![x.clone()]));
    // Integer arithmetic and the narrow integer types.
    for d in [DType::I32, DType::U8, DType::I16] {
        let t = |shape: &[usize]| TensorType::new(d, shape.to_vec());
        for bop in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min] {
            v.push((KernelOp::Op(Op::Binary(bop)), vec![t(&[2, 5]), t(&[5])]));
        }
        v.push((KernelOp::Op(Op::Compare(CompareOp::GreaterOrEqual)), vec![t(&[2, 5]), t(&[5])]));
        v.push((KernelOp::Op(Op::Cast { to: DType::F32 }), vec![t(&[2, 5])]));
    }
    v.push((KernelOp::Op(Op::Where), vec![b(&[1, 4, 5, 5]), f32t(&[4, 1, 1]), f32t(&[5])]));
    for act in [Act::Gelu, Act::GeluTanh] {
        v.push((
            KernelOp::FusedGemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act },
            vec![f32t(&[2, 8]), f32t(&[6, 8]), f32t(&[6])],
        ));
    }
    // Products with an elementwise epilogue: a 3-D matmul with bias and
    // GELU, a transposed Gemm read as [2,5,6] with a scale and a residual,
    // a batched product with an f16 output.
    let epilogue = |product: Op, expr: &str, shape: &[usize]| KernelOp::GemmEpilogue {
        product: smelt_ir::Product::of(&product).unwrap(),
        expr: expr.parse::<Expr>().unwrap(),
        shape: shape.to_vec(),
    };
    v.push((epilogue(Op::MatMul, "gelu(add($0,$1))", &[2, 5, 6]), vec![f32t(&[2, 5, 8]), f32t(&[8, 6]), f32t(&[6])]));
    v.push((
        epilogue(Op::Gemm { trans_a: false, trans_b: true, alpha: 0.5, beta: 1.0 }, "add(mul($0,$1),$2)", &[2, 5, 6]),
        vec![f32t(&[10, 8]), f32t(&[6, 8]), f32t(&[]), f32t(&[2, 5, 6])],
    ));
    v.push((epilogue(Op::MatMul, "cast_f16(relu($0))", &[2, 3, 4, 5]), vec![f32t(&[2, 3, 4, 8]), f32t(&[3, 8, 5])]));
    // Attention: more queries than one block's rows and more keys than one
    // tile; an additive mask broadcast over heads; a scale before the score;
    // keys shared by every batch element.
    let attention = |expr: &str, score, nan_to_zero| KernelOp::Attention {
        expr: expr.parse::<Expr>().unwrap(),
        score,
        nan_to_zero,
        perms: Default::default(),
    };
    v.push((
        attention("add($0,$1)", 0, true),
        vec![f32t(&[2, 3, 70, 8]), f32t(&[2, 3, 8, 20]), f32t(&[2, 3, 20, 6]), f32t(&[2, 1, 70, 20])],
    ));
    v.push((attention("mul($0,$1)", 1, false), vec![f32t(&[2, 3, 5, 8]), f32t(&[3, 8, 17]), f32t(&[2, 3, 17, 8]), f32t(&[])]));
    v.push((attention("$0", 0, false), vec![f32t(&[4, 33, 16]), f32t(&[4, 16, 33]), f32t(&[4, 33, 16])]));
    // Transposes folded into the indexing: heads split out of [b, s, h, d].
    let permuted = KernelOp::Attention {
        expr: "add($0,$1)".parse::<Expr>().unwrap(),
        score: 0,
        nan_to_zero: true,
        perms: [vec![0, 2, 1, 3], vec![0, 2, 3, 1], vec![0, 2, 1, 3], vec![]],
    };
    v.push((permuted, vec![f32t(&[2, 70, 3, 8]), f32t(&[2, 20, 3, 8]), f32t(&[2, 20, 3, 6]), f32t(&[2, 1, 1, 20])]));
    // The output written with the heads merged back: [b, s, h, d].
    let merged = KernelOp::Attention {
        expr: "$0".parse::<Expr>().unwrap(),
        score: 0,
        nan_to_zero: false,
        perms: [vec![0, 2, 1, 3], vec![0, 2, 3, 1], vec![0, 2, 1, 3], vec![0, 2, 1, 3]],
    };
    v.push((merged, vec![f32t(&[2, 70, 3, 8]), f32t(&[2, 20, 3, 8]), f32t(&[2, 20, 3, 6])]));
    // Backward ops and optimizer updates.
    let strided = Conv { strides: vec![2, 2], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 2 };
    let window = Pool { kernel: vec![3, 3], strides: vec![1, 1], pads: vec![1, 1, 1, 1], ceil_mode: false };
    v.push((
        KernelOp::Op(Op::ConvGradData { conv: strided.clone(), shape: vec![1, 4, 5, 5] }),
        vec![f32t(&[1, 4, 3, 3]), f32t(&[4, 2, 3, 3])],
    ));
    v.push((KernelOp::Op(Op::ConvGradWeight { conv: strided, shape: vec![4, 2, 3, 3] }), vec![x.clone(), f32t(&[1, 4, 3, 3])]));
    v.push((KernelOp::Op(Op::MaxPoolGrad(window.clone())), vec![x.clone(), x.clone()]));
    v.push((KernelOp::Op(Op::AvgPoolGrad { pool: window, count_include_pad: false, shape: vec![1, 4, 5, 5] }), vec![x.clone()]));
    v.push((KernelOp::Op(Op::LrnGrad(smelt_ir::Lrn { size: 3, alpha: 1e-4, beta: 0.75, bias: 1.0 })), vec![x.clone(), x.clone()]));
    let i64s = |shape: &[usize]| TensorType::new(DType::I64, shape.to_vec());
    v.push((KernelOp::Op(Op::GatherGrad { axis: 1, shape: vec![2, 6, 3] }), vec![i64s(&[2, 2]), f32t(&[2, 2, 2, 3])]));
    v.push((KernelOp::Op(Op::GatherGrad { axis: 0, shape: vec![3, 4] }), vec![i64s(&[]), f32t(&[4])]));
    let p = f32t(&[4, 5]);
    let sgd = smelt_ir::Optimizer::Sgd {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 1e-4,
        accumulate: 1,
        schedule: Default::default(),
    };
    let adam = common::adam(3, smelt_ir::Schedule { warmup: 2, total: 9 });
    v.push((KernelOp::Op(Op::Update(sgd)), vec![p.clone(), p.clone(), f32t(&[]), p.clone()]));
    v.push((KernelOp::Op(Op::Update(adam)), vec![p.clone(), p.clone(), f32t(&[]), p.clone(), p.clone(), p.clone()]));
    v.push((KernelOp::Op(Op::Update(smelt_ir::Optimizer::Count)), vec![f32t(&[])]));
    v.push((KernelOp::Op(Op::Update(smelt_ir::Optimizer::Ema { momentum: 0.1 })), vec![p.clone(), p.clone(), f32t(&[])]));
    for (op, _) in &v {
        covered(op);
    }
    v
}

/// No wildcard: a new kernel form does not compile here until [`samples`]
/// has one.
fn covered(op: &KernelOp) {
    match op {
        KernelOp::Op(op) => covered_op(op),
        KernelOp::FusedConv { .. }
        | KernelOp::FusedGemm { .. }
        | KernelOp::Elementwise { .. }
        | KernelOp::FusedReduction { .. }
        | KernelOp::ConcatInPlace { .. }
        | KernelOp::SliceView { .. }
        | KernelOp::Attention { .. }
        | KernelOp::GemmEpilogue { .. } => {}
    }
}

/// No wildcard: a new op does not compile here until [`samples`] has one.
fn covered_op(op: &Op) {
    match op {
        Op::Input | Op::Constant | Op::Parameter | Op::State => unreachable!("sources are not sampled"),
        Op::Conv(_)
        | Op::BatchNorm { .. }
        | Op::Unary(_)
        | Op::Clip { .. }
        | Op::Binary(_)
        | Op::Sum
        | Op::Compare(_)
        | Op::Logic(_)
        | Op::Not
        | Op::IsNaN
        | Op::Where
        | Op::MaxPool(_)
        | Op::AveragePool { .. }
        | Op::GlobalAveragePool
        | Op::Reduce { .. }
        | Op::Gemm { .. }
        | Op::MatMul
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice { .. }
        | Op::Reshape { .. }
        | Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::Lrn(_)
        | Op::Dropout
        | Op::Identity
        | Op::Pad { .. }
        | Op::Expand { .. }
        | Op::Gather { .. }
        | Op::Tile { .. }
        | Op::Cast { .. }
        | Op::ConvGradData { .. }
        | Op::ConvGradWeight { .. }
        | Op::MaxPoolGrad(_)
        | Op::AvgPoolGrad { .. }
        | Op::LrnGrad { .. }
        | Op::GatherGrad { .. }
        | Op::Update(_) => {}
    }
}

/// A graph computing `op` once: operand 0 a graph input, the rest constants.
fn one_node(op: &KernelOp, types: &[TensorType]) -> KernelGraph {
    let mut g = KernelGraph::new();
    let mut ins = vec![g.add_input("x", types[0].clone()).unwrap()];
    let mut rng = Rng::from_name(op.name());
    for (i, t) in types.iter().enumerate().skip(1) {
        let data = if t.dtype.is_float() {
            Tensor::from_f32(t.shape.clone(), (0..t.numel()).map(|_| rng.normal()).collect())
        } else if t.dtype == DType::Bool {
            Tensor::from_i64(t.shape.clone(), (0..t.numel() as i64).map(|k| k % 3).collect()).cast(DType::Bool)
        } else {
            Tensor::from_i64(t.shape.clone(), (0..t.numel() as i64).map(|k| (k * 3) % 10 - 2).collect()).cast(t.dtype)
        };
        ins.push(g.add_constant(format!("c{i}"), data));
    }
    let id = g.add(op.clone(), op.name(), &ins).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
    for slot in 0..g.node(id).outputs.len() as u32 {
        g.add_output(format!("y{slot}"), smelt_ir::ValueId { node: id, slot });
    }
    g
}

#[test]
fn every_op_lowers_as_its_route_says() {
    let nvrtc = common::nvrtc_compiler("op-traits");
    let (mut kernels, mut refused) = (0, 0);
    for (op, types) in samples() {
        let g = one_node(&op, &types);
        let id = g.node_ids().last().unwrap();
        let traits = op.traits();
        let inputs = common::random_inputs(&g, 1);
        match (Route::of(&g, id), Kernel::lower(&g, id, true)) {
            (Route::Nothing, Ok(Lowered::Nothing)) => {}
            (Route::Kernel(_) | Route::Alias(_), Ok(Lowered::Kernel(k))) => {
                // The description's CPU run matches the reference executor.
                let want = smelt_runtime::cpu::run(&g, &inputs).unwrap();
                let args: Vec<Tensor> =
                    g.inputs_of(id).iter().map(|v| g.weight(v.node).map_or_else(|| inputs[0].clone(), |w| w.as_ref().clone())).collect();
                let got = k.run_cpu(&args.iter().collect::<Vec<_>>());
                let c = smelt::compare(&got, &want[0], 1e-5, 1e-6);
                assert!(c.ok, "{}: kernel {} differs from the reference: {c:?}", op.name(), k.name());
                if let Some(nv) = &nvrtc {
                    nv.compile(k.name(), &k.cuda()).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
                }
                kernels += 1;
            }
            (Route::Refused(_), Err(e)) => {
                let msg = e.to_string();
                assert!(msg.contains(op.name()) && msg.contains("no CUDA kernel"), "{msg}");
                // The CPU reference executor runs it.
                smelt_runtime::cpu::run(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
                refused += 1;
            }
            (l, got) => panic!("{}: its route is {l:?} but lowering gave {got:?}", op.name()),
        }
        if traits.in_place == InPlace::Last {
            assert!(types.len() >= 2, "{}: only an op with operands can overwrite its last", op.name());
        }
    }
    println!("{kernels} ops lower to kernels that match the reference; {refused} are refused with a reason");
    assert!(kernels >= 80 && refused >= 1);
}

#[test]
fn gelu_matches_its_definition_and_imports_from_onnx() {
    // Exact GELU is x * Phi(x); the tanh form is within 1e-3 of it.
    for x in [-3.0f32, -1.0, -0.1, 0.0, 0.5, 2.0, 6.0] {
        let phi = 0.5 * (1.0 + smelt_ir::erf(x / 2f32.sqrt()));
        let exact = smelt_ir::apply_unary(UnaryOp::Gelu, x);
        assert!((exact - x * phi).abs() <= 1e-6, "gelu({x}) = {exact}");
        assert!((smelt_ir::apply_unary(UnaryOp::GeluTanh, x) - exact).abs() <= 1e-3, "gelu_tanh({x})");
    }
    // Text names and parameters round-trip through one table.
    for u in UnaryOp::ALL {
        assert_eq!(UnaryOp::by_name(u.name()), Some(u), "{}", u.name());
    }
    assert_eq!(UnaryOp::by_onnx_name("Gelu"), Some(UnaryOp::Gelu));
}

/// ONNX `Gelu` (opset 20, both `approximate` modes) against onnxruntime,
/// on the CPU reference executor and as the generated kernel's program.
#[test]
fn onnx_gelu_matches_onnxruntime() {
    for case in ["op_gelu", "op_gelu_tanh"] {
        let dir = common::testdata().join("variants").join(case);
        let read = |f: &str| smelt_ir::onnx::read_tensor_file(&dir.join(f)).unwrap().1;
        let (x, want) = (read("input_0.pb"), read("output_0.pb"));
        let mut s = smelt::Session::open(dir.join("model.onnx").to_str().unwrap(), Default::default()).unwrap();
        let reference = smelt_runtime::cpu::run(&s.source, std::slice::from_ref(&x)).unwrap();
        let c = smelt::compare(&reference[0], &want, 1e-5, 1e-6);
        assert!(c.ok, "{case}: reference executor against onnxruntime: {c:?}");
        let compiled = s.compile().unwrap();
        let planned = s.plan(&compiled).unwrap();
        let program = s.program(&compiled, &planned).unwrap();
        let got = program.run_cpu(&program.weights_blob(&compiled.graph).unwrap(), std::slice::from_ref(&x)).unwrap();
        let c = smelt::compare(&got[0], &want, 1e-5, 1e-6);
        assert!(c.ok, "{case}: generated kernel against onnxruntime: {c:?}");
    }
}
