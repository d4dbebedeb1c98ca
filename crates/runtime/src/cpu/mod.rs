//! The CPU reference executor: evaluates the graph in topological order,
//! freeing each value after its last use.

mod conv;
mod elementwise;
mod grad;
mod layout;
mod matmul;
mod norm;
mod pool;

use crate::RuntimeError;
use half::{bf16, f16};
use smelt_ir::{values, DType, Graph, KernelOp, NodeId, Op, OpSet, Product, Tensor, TensorData, TensorType, ValueId};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// Runs `g` on `inputs` (one per graph input, in order); returns one tensor
/// per graph output.
pub fn run<O: Eval>(g: &Graph<O>, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    run_with_progress(g, inputs, &mut |_, _| {})
}

/// As [`run`], calling `progress(done, total)` after each node.
pub fn run_with_progress<O: Eval>(
    g: &Graph<O>,
    inputs: &[Tensor],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Tensor>, RuntimeError> {
    run_keeping(g, inputs, &|_| false, progress).map(|(outs, _)| outs)
}

/// Values kept by [`run_keeping`].
pub type Kept = HashMap<ValueId, Arc<Tensor>>;

/// As [`run`], also returning every value for which `keep` says yes (to
/// check one kernel against the reference with the reference's inputs).
pub fn run_keeping<O: Eval>(
    g: &Graph<O>,
    inputs: &[Tensor],
    keep: &dyn Fn(ValueId) -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Vec<Tensor>, Kept), RuntimeError> {
    let mut kept = HashMap::new();
    if inputs.len() != g.inputs().len() {
        return Err(RuntimeError::Input {
            index: inputs.len(),
            name: String::new(),
            msg: format!("the graph takes {} inputs, {} given", g.inputs().len(), inputs.len()),
        });
    }
    let order = g.topo_order()?;
    let mut uses = use_counts(g, &order);
    crate::check_host_memory("running on the CPU reference executor", peak_bytes(g)?)?;
    let mut vals: HashMap<ValueId, Arc<Tensor>> = HashMap::new();
    for (i, (&id, t)) in g.inputs().iter().zip(inputs).enumerate() {
        let want = &g.node(id).outputs[0];
        if t.ty() != want {
            return Err(RuntimeError::Input { index: i, name: g.node(id).name.clone(), msg: format!("expected {want}, got {}", t.ty()) });
        }
        let v = ValueId { node: id, slot: 0 };
        if keep(v) {
            kept.insert(v, Arc::new(t.clone()));
        }
        vals.insert(v, Arc::new(t.clone()));
    }
    for (done, &id) in order.iter().enumerate() {
        let node = g.node(id);
        if node.op.is_persistent() {
            let w = g.weight(id).ok_or_else(|| RuntimeError::MissingWeight(node.name.clone()))?;
            vals.insert(ValueId { node: id, slot: 0 }, w.clone());
        } else if !node.op.is_input() {
            let ins = g.inputs_of(id);
            let args: Vec<Arc<Tensor>> = ins.iter().map(|v| vals[v].clone()).collect();
            let outs = eval_node(g, id, args)?;
            for (slot, t) in outs.into_iter().enumerate() {
                debug_assert_eq!(t.ty(), &node.outputs[slot], "{} produced the wrong type", node.op.name());
                let v = ValueId { node: id, slot: slot as u32 };
                let t = Arc::new(t);
                if keep(v) {
                    kept.insert(v, t.clone());
                }
                vals.insert(v, t);
            }
            for v in ins {
                let u = uses.get_mut(&v.node).expect("counted");
                *u -= 1;
                if *u == 0 {
                    vals.retain(|k, _| k.node != v.node);
                }
            }
        }
        progress(done + 1, order.len());
    }
    Ok((g.outputs().iter().map(|(_, v)| Arc::unwrap_or_clone(vals[v].clone())).collect(), kept))
}

/// The outputs of node `id` of `g` on `args` (its operands, in order): the
/// op as [`Eval`] computes it, its products' operands first rounded to TF32
/// where the graph runs it in TF32 ([`Eval::tf32`]).
pub fn eval_node<O: Eval>(g: &Graph<O>, id: NodeId, mut args: Vec<Arc<Tensor>>) -> Result<Vec<Tensor>, RuntimeError> {
    let node = g.node(id);
    if O::tf32(g, id) {
        for a in args.iter_mut().take(2).filter(|a| a.ty().dtype == DType::F32) {
            let v: Vec<f32> = a.to_f32_vec().into_iter().map(to_tf32).collect();
            *a = Arc::new(Tensor::from_f32(a.shape().to_vec(), v));
        }
    }
    node.op
        .eval(&args, &node.outputs)
        .map_err(|msg| RuntimeError::Unsupported { node: format!("{id} \"{}\" ({})", node.name, node.op.name()), msg })
}

/// `x` rounded to TF32 as `cvt.rna.tf32.f32` does: to the nearest value
/// with 10 explicit mantissa bits, ties away from zero, overflowing to
/// infinity. Written apart from [`smelt_ir::round_tf32`] (the kernels'
/// descriptions use that one), in f64 arithmetic on the value rather than
/// on its bits, so that the two check each other.
pub fn to_tf32(x: f32) -> f32 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = (x as f64).abs();
    // The binade of |x| (f32 subnormals share the smallest normal one).
    let exp = ((a.to_bits() >> 52) as i32 - 1023).max(-126);
    let ulp = 2f64.powi(exp - 10);
    let q = a / ulp;
    let r = if q - q.floor() >= 0.5 { q.floor() + 1.0 } else { q.floor() };
    let v = r * ulp;
    let v = if v > f32::MAX as f64 { f32::INFINITY } else { v as f32 };
    if x < 0.0 {
        -v
    } else {
        v
    }
}

/// Runs one training step of `g` (a graph with [`Op::Update`] nodes, as
/// `smelt_passes::train` builds it) on `inputs`: returns the outputs and
/// writes each update's results into the persistent values they replace, so
/// that the next call runs the next step.
pub fn run_step<O: Eval>(g: &mut Graph<O>, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    let outs = run(g, inputs)?;
    let at: HashMap<ValueId, usize> = g.outputs().iter().enumerate().map(|(i, (_, v))| (*v, i)).collect();
    let mut writes = Vec::new();
    for u in g.node_ids() {
        let Some(op @ Op::Update(_)) = g.node(u).op.semantic() else { continue };
        let ins = g.inputs_of(u);
        for slot in 0..g.node(u).outputs.len() {
            let target = ins[op.updated_operand(slot).expect("an update")].node;
            let v = ValueId { node: u, slot: slot as u32 };
            let i = at.get(&v).ok_or_else(|| RuntimeError::Unsupported {
                node: format!("{u} \"{}\"", g.node(u).name),
                msg: "an update whose result is not a graph output".into(),
            })?;
            writes.push((target, outs[*i].clone()));
        }
    }
    for (target, t) in writes {
        let name = g.node(target).name.clone();
        g.set_weight(target, t).map_err(|e| RuntimeError::Unsupported { node: name, msg: e.to_string() })?;
    }
    Ok(outs)
}

/// Remaining uses of each node's outputs; graph outputs count as one more.
fn use_counts<O: OpSet>(g: &Graph<O>, order: &[NodeId]) -> HashMap<NodeId, usize> {
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in order {
        for v in g.inputs_of(id) {
            *uses.entry(v.node).or_default() += 1;
        }
    }
    for (_, v) in g.outputs() {
        *uses.entry(v.node).or_default() += 1;
    }
    uses
}

/// The most bytes [`run`] holds at once: every weight and input, and the
/// computed values alive at the worst node, its inputs and outputs
/// together (each op's own scratch comes on top, at most about its output).
pub fn peak_bytes<O: OpSet>(g: &Graph<O>) -> Result<usize, RuntimeError> {
    let order = g.topo_order()?;
    let mut uses = use_counts(g, &order);
    let bytes = |id: NodeId| g.node(id).outputs.iter().map(|t| t.bytes()).fold(0, usize::saturating_add);
    let held = |id: NodeId| g.node(id).op.is_input() || g.node(id).op.is_persistent();
    let fixed = order.iter().filter(|&&id| held(id)).map(|&id| bytes(id)).fold(0, usize::saturating_add);
    let (mut live, mut peak) = (0usize, 0usize);
    for &id in order.iter().filter(|&&id| !held(id)) {
        live = live.saturating_add(bytes(id));
        peak = peak.max(live);
        for v in g.inputs_of(id) {
            let u = uses.get_mut(&v.node).expect("counted");
            *u -= 1;
            if *u == 0 && !held(v.node) {
                live -= bytes(v.node);
            }
        }
    }
    Ok(fixed.saturating_add(peak))
}

/// The elements of `t` as f32, borrowed when they already are.
pub(crate) fn f32s(t: &Tensor) -> Cow<'_, [f32]> {
    match t.data() {
        TensorData::F32(v) => Cow::Borrowed(v.as_slice()),
        _ => Cow::Owned(t.to_f32_vec()),
    }
}

/// Wraps f32 results as a tensor of `ty`, rounding to half types.
pub(crate) fn tensor_of(ty: &TensorType, v: Vec<f32>) -> Tensor {
    let data = match ty.dtype {
        DType::F32 => TensorData::F32(v),
        DType::F16 => TensorData::F16(v.into_iter().map(f16::from_f32).collect()),
        DType::BF16 => TensorData::BF16(v.into_iter().map(bf16::from_f32).collect()),
        DType::I64 => TensorData::I64(v.into_iter().map(|x| x as i64).collect()),
        DType::I32 => TensorData::I32(v.into_iter().map(|x| x as i32).collect()),
        DType::Bool => TensorData::Bool(v.into_iter().map(|x| x != 0.0).collect()),
        small => return Tensor::from_f32(ty.shape.clone(), v).cast(small),
    };
    Tensor::new(ty.shape.clone(), data).expect("kernels produce the inferred element count")
}

/// Ops the reference executor evaluates: semantic ops and kernels.
pub trait Eval: OpSet + Sized {
    /// The outputs of the op applied to `args`, of types `out`.
    fn eval(&self, args: &[Arc<Tensor>], out: &[TensorType]) -> Result<Vec<Tensor>, String>;

    /// Whether node `id` of `g` multiplies its first two operands in TF32
    /// (`--tf32`): then the reference rounds them first, as the GPU does.
    fn tf32(g: &Graph<Self>, id: NodeId) -> bool;
}

impl Eval for Op {
    fn eval(&self, args: &[Arc<Tensor>], out: &[TensorType]) -> Result<Vec<Tensor>, String> {
        eval(self, args, out)
    }

    /// A semantic graph means exact f32: TF32 is a kernel's choice.
    fn tf32(_: &Graph<Op>, _: NodeId) -> bool {
        false
    }
}

impl Eval for KernelOp {
    /// Where the kernel that runs the node takes f32 operands in TF32 (the
    /// tensor-core convs, GEMMs and convolution gradients under `--tf32`).
    fn tf32(g: &Graph<KernelOp>, id: NodeId) -> bool {
        g.tf32() != smelt_ir::Tf32::Off && smelt_codegen::kernel::Kernel::of(g, id).is_some_and(|k| k.tf32())
    }

    fn eval(&self, args: &[Arc<Tensor>], out: &[TensorType]) -> Result<Vec<Tensor>, String> {
        let o = &out[0];
        let float = |v: Vec<f32>| Ok(vec![tensor_of(o, v)]);
        match self {
            KernelOp::Op(op) => eval(op, args, out),
            KernelOp::ConcatInPlace { axis } => Ok(vec![layout::concat(args, *axis, o)]),
            KernelOp::SliceView { axis, start, .. } => Ok(vec![layout::slice(&args[0], &[*axis], &[*start as i64], &[1], o)]),
            KernelOp::Attention { expr, score, nan_to_zero, perms } => {
                // The unfused computation: transposes, scores, prologue, softmax, product.
                let tys: Vec<&TensorType> = args.iter().map(|a| a.ty()).collect();
                let (_, s_ty) = smelt_ir::attention_types(expr, *score, perms, &tys)?;
                let mut args = args.to_vec();
                for (a, perm) in args.iter_mut().zip(&perms[..3]).filter(|(_, p)| !p.is_empty()) {
                    let t = smelt_ir::infer(&Op::Transpose { perm: perm.clone() }, &[a.ty()])?.remove(0);
                    *a = Arc::new(layout::transpose(a, perm, &t));
                }
                let qk_ty = TensorType::new(DType::F32, s_ty.shape.clone());
                let qk = Arc::new(tensor_of(&qk_ty, matmul::matmul(&args[0], &args[1], &qk_ty)));
                let mut pre: Vec<Arc<Tensor>> = args[3..].to_vec();
                pre.insert(*score, qk);
                let s = tensor_of(&TensorType::new(DType::F32, s_ty.shape.clone()), elementwise::fused(expr, &pre, &s_ty.shape));
                let mut p = norm::softmax(&s, s_ty.shape.len() - 1, false);
                if *nan_to_zero {
                    p.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = 0.0);
                }
                let p = Tensor::from_f32(s_ty.shape.clone(), p);
                if perms[3].is_empty() {
                    return float(matmul::matmul(&p, &args[2], o));
                }
                // The product, then the output's permutation.
                let mut shape = s_ty.shape[..s_ty.shape.len() - 1].to_vec();
                shape.push(*args[2].shape().last().expect("rank checked"));
                let y_ty = TensorType::new(DType::F32, shape);
                let y = tensor_of(&y_ty, matmul::matmul(&p, &args[2], &y_ty));
                float(layout::transpose(&y, &perms[3], &TensorType::new(DType::F32, o.shape.clone())).to_f32_vec())
            }
            KernelOp::FusedConv { conv: c, bias, residual, act } => {
                let b = if *bias { Some(args[2].as_ref()) } else { None };
                let mut y = conv::conv(c, &args[0], &args[1], b, o)?;
                if *residual {
                    let r = f32s(args.last().expect("arity checked"));
                    y.iter_mut().zip(r.iter()).for_each(|(y, r)| *y += r);
                }
                y.iter_mut().for_each(|v| *v = act.apply(*v));
                float(y)
            }
            KernelOp::FusedGemm { trans_a, trans_b, alpha, beta, act } => {
                let mut y = matmul::gemm(args, *trans_a, *trans_b, *alpha, *beta, o);
                y.iter_mut().for_each(|v| *v = act.apply(*v));
                float(y)
            }
            KernelOp::Elementwise { expr } => float(elementwise::fused(expr, args, &o.shape)),
            KernelOp::GemmEpilogue { product, expr, shape } => {
                // The product in f32, read as `shape`, then the expression.
                let tys: Vec<&TensorType> = args[..2].iter().map(|a| a.ty()).collect();
                let p_ty = smelt_ir::infer_kernel(&KernelOp::Op(product.op()), &tys)?.remove(0);
                let p = match *product {
                    Product::Gemm { trans_a, trans_b, alpha, beta } => matmul::gemm(&args[..2], trans_a, trans_b, alpha, beta, &p_ty),
                    Product::MatMul => matmul::matmul(&args[0], &args[1], &p_ty),
                };
                let mut ins = vec![Arc::new(Tensor::from_f32(shape.clone(), p))];
                ins.extend(args[2..].iter().cloned());
                float(elementwise::fused(expr, &ins, &o.shape))
            }
            KernelOp::FusedReduction { expr, reduction } => {
                let k = expr.arity().min(args.len());
                let pre_ty = smelt_ir::infer_kernel(
                    &KernelOp::Elementwise { expr: expr.clone() },
                    &args[..k].iter().map(|a| a.ty()).collect::<Vec<_>>(),
                )?
                .remove(0);
                let pre = tensor_of(&pre_ty, elementwise::fused(expr, &args[..k], &pre_ty.shape));
                let mut all = vec![Arc::new(pre)];
                all.extend_from_slice(&args[k..]);
                eval(&reduction.op(), &all, out)
            }
        }
    }
}

fn eval(op: &Op, args: &[Arc<Tensor>], out: &[TensorType]) -> Result<Vec<Tensor>, String> {
    let o = &out[0];
    let float = |v: Vec<f32>| Ok(vec![tensor_of(o, v)]);
    match op {
        Op::Input | Op::Constant | Op::Parameter | Op::State => unreachable!("handled by the caller"),
        Op::Conv(c) => float(conv::conv(c, &args[0], &args[1], args.get(2).map(|a| a.as_ref()), o)?),
        Op::BatchNorm { epsilon } => float(norm::batch_norm(args, *epsilon)),
        Op::Unary(u) => float(elementwise::unary(*u, &f32s(&args[0]))),
        Op::Clip { min, max } => float(f32s(&args[0]).iter().map(|&x| smelt_ir::min_nan(smelt_ir::max_nan(x, *min), *max)).collect()),
        Op::Binary(b) if !o.dtype.is_float() => Ok(vec![values::int_binary(*b, &args[0], &args[1])?]),
        Op::Binary(b) => float(elementwise::binary(*b, &args[0], &args[1], &o.shape)),
        Op::Compare(c) => Ok(vec![values::compare(*c, &args[0], &args[1])?]),
        Op::Logic(l) => Ok(vec![values::logic(*l, &args[0], &args[1])?]),
        Op::Not => Ok(vec![values::not(&args[0])]),
        Op::IsNaN => Ok(vec![values::is_nan(&args[0])]),
        Op::Where => Ok(vec![values::select(&args[0], &args[1], &args[2])?]),
        Op::Sum => float(elementwise::sum(args, &o.shape)),
        Op::MaxPool(p) => float(pool::pool(p, &args[0], o, None)?),
        Op::AveragePool { pool: p, count_include_pad } => float(pool::pool(p, &args[0], o, Some(*count_include_pad))?),
        Op::GlobalAveragePool => float(pool::global_avg(&args[0])),
        Op::Reduce { op, axes, .. } => float(norm::reduce(*op, &args[0], axes)),
        Op::Gemm { trans_a, trans_b, alpha, beta } => float(matmul::gemm(args, *trans_a, *trans_b, *alpha, *beta, o)),
        Op::MatMul => float(matmul::matmul(&args[0], &args[1], o)),
        Op::Softmax { axis } => float(norm::softmax(&args[0], *axis, false)),
        Op::LogSoftmax { axis } => float(norm::softmax(&args[0], *axis, true)),
        Op::LayerNorm { axis, epsilon } => float(norm::layer_norm(args, *axis, *epsilon)),
        Op::Lrn(l) => float(norm::lrn(&args[0], l)),
        Op::Cast { to } => Ok(vec![args[0].cast(*to)]),
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Dropout | Op::Identity => {
            Ok(vec![args[0].as_ref().clone().reshaped(o.shape.clone()).expect("views keep the element count")])
        }
        Op::Concat { axis } => Ok(vec![layout::concat(args, *axis, o)]),
        Op::Split { axis, .. } => Ok(layout::split(&args[0], *axis, out)),
        Op::Slice { axes, starts, steps, .. } => Ok(vec![layout::slice(&args[0], axes, starts, steps, o)]),
        Op::Transpose { perm } => Ok(vec![layout::transpose(&args[0], perm, o)]),
        Op::Pad { pads, mode } => Ok(vec![layout::pad(&args[0], pads, *mode, o)]),
        Op::Expand { .. } | Op::Tile { .. } => Ok(vec![layout::repeat(&args[0], o)]),
        Op::Gather { axis } => Ok(vec![layout::gather_axis(&args[0], &args[1], *axis, o)?]),
        Op::ConvGradData { conv: c, .. } => float(grad::conv_grad_data(c, &args[0], &args[1], o)?),
        Op::ConvGradWeight { conv: c, .. } => float(grad::conv_grad_weight(c, &args[0], &args[1], o)?),
        Op::MaxPoolGrad(p) => float(grad::max_pool_grad(p, &args[0], &args[1])?),
        Op::AvgPoolGrad { pool: p, count_include_pad, .. } => float(grad::avg_pool_grad(p, *count_include_pad, &args[0], o)?),
        Op::GatherGrad { axis, .. } => float(grad::gather_grad(&args[0], &args[1], *axis, o)?),
        Op::LrnGrad(l) => float(grad::lrn_grad(&args[0], &args[1], l)),
        Op::Update(u) => Ok(grad::update(u, args).into_iter().zip(out).map(|(v, ty)| tensor_of(ty, v)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::to_tf32;

    /// The reference's TF32 rounding and the descriptions' agree on every
    /// binade, the subnormals, ties, the largest values and the specials.
    #[test]
    fn tf32_rounding_agrees_with_the_descriptions() {
        let ulp = 2f32.powi(-10);
        assert_eq!(to_tf32(1.0 + ulp / 2.0), 1.0 + ulp, "a tie goes away from zero");
        assert_eq!(to_tf32(-(1.0 + ulp / 2.0)), -(1.0 + ulp));
        assert_eq!(to_tf32(1.0 + ulp / 2.0 - f32::EPSILON), 1.0, "below a tie goes down");
        assert_eq!(to_tf32(f32::MAX), f32::INFINITY);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..2_000_000u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = if i < 1 << 16 { i << 16 | i } else { state as u32 };
            let x = f32::from_bits(bits);
            let (a, b) = (to_tf32(x), smelt_ir::round_tf32(x));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{x:e} ({bits:#x}): {a:e} against {b:e}");
        }
    }
}
