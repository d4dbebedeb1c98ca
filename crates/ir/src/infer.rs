//! Shape and dtype inference: one function per op, input types in, output
//! types or a message out (the caller names the node).

use crate::dtype::{DType, Shape, TensorType};
use crate::error::TOO_LARGE;
use crate::fused::Expr;
use crate::kernel_op::KernelOp;
use crate::op::{Conv, Op, Pool};

/// Output types of `op` applied to inputs of types `ins`.
pub fn infer(op: &Op, ins: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    let out = match op {
        Op::Input | Op::Constant | Op::Parameter | Op::State => return Err("sources carry their own type".into()),
        Op::Conv(c) => conv(c, ins, false)?,
        Op::BatchNorm { .. } => batch_norm(ins)?,
        Op::Unary(_) | Op::Clip { .. } | Op::Dropout | Op::Identity => {
            arity(ins, 1, 1)?;
            float(ins[0])?;
            ins[0].clone()
        }
        Op::Binary(_) => {
            arity(ins, 2, 2)?;
            same_dtype(ins)?;
            TensorType::new(ins[0].dtype, broadcast_all(ins)?)
        }
        Op::Compare(_) => {
            arity(ins, 2, 2)?;
            same_dtype(ins)?;
            TensorType::new(DType::Bool, broadcast_all(ins)?)
        }
        Op::Logic(_) | Op::Not => {
            arity(ins, if matches!(op, Op::Not) { 1 } else { 2 }, if matches!(op, Op::Not) { 1 } else { 2 })?;
            if let Some(t) = ins.iter().find(|t| t.dtype != DType::Bool) {
                return Err(format!("needs bool inputs, got {t}"));
            }
            TensorType::new(DType::Bool, broadcast_all(ins)?)
        }
        Op::IsNaN => {
            arity(ins, 1, 1)?;
            float(ins[0])?;
            TensorType::new(DType::Bool, ins[0].shape.clone())
        }
        Op::Where => {
            arity(ins, 3, 3)?;
            if ins[0].dtype != DType::Bool {
                return Err(format!("the condition must be bool, got {}", ins[0]));
            }
            same_dtype(&ins[1..])?;
            TensorType::new(ins[1].dtype, broadcast_all(ins)?)
        }
        Op::Sum => {
            arity(ins, 1, usize::MAX)?;
            same_dtype(ins)?;
            TensorType::new(ins[0].dtype, broadcast_all(ins)?)
        }
        Op::MaxPool(p) => pool(p, ins)?,
        Op::AveragePool { pool: p, .. } => pool(p, ins)?,
        Op::GlobalAveragePool => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            rank_at_least(x, 3)?;
            let mut s = x.shape.clone();
            s[2..].iter_mut().for_each(|d| *d = 1);
            TensorType::new(x.dtype, s)
        }
        Op::Reduce { axes, keepdims, .. } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            axes_in_range(axes, x.shape.len())?;
            let mut s = Vec::new();
            for (i, &d) in x.shape.iter().enumerate() {
                if !axes.contains(&i) {
                    s.push(d);
                } else if *keepdims {
                    s.push(1);
                }
            }
            TensorType::new(x.dtype, s)
        }
        Op::Gemm { trans_a, trans_b, .. } => gemm(*trans_a, *trans_b, ins, false)?,
        Op::MatMul => matmul(ins)?,
        Op::Concat { axis } => concat(*axis, ins)?,
        Op::Split { axis, sizes } => return split(*axis, sizes, ins),
        Op::ConvGradData { conv: c, shape } => {
            arity(ins, 2, 2)?;
            let x = TensorType::new(ins[0].dtype, shape.clone());
            expect_forward(&conv(c, &[&x, ins[1]], false)?, ins[0], "dy")?;
            x
        }
        Op::ConvGradWeight { conv: c, shape } => {
            arity(ins, 2, 2)?;
            let w = TensorType::new(ins[0].dtype, shape.clone());
            expect_forward(&conv(c, &[ins[0], &w], false)?, ins[1], "dy")?;
            w
        }
        Op::MaxPoolGrad(p) => {
            arity(ins, 2, 2)?;
            expect_forward(&pool(p, &ins[..1])?, ins[1], "dy")?;
            ins[0].clone()
        }
        Op::AvgPoolGrad { pool: p, shape, .. } => {
            arity(ins, 1, 1)?;
            let x = TensorType::new(ins[0].dtype, shape.clone());
            expect_forward(&pool(p, &[&x])?, ins[0], "dy")?;
            x
        }
        Op::LrnGrad(crate::Lrn { size, .. }) => {
            arity(ins, 2, 2)?;
            float(ins[0])?;
            rank_at_least(ins[0], 2)?;
            if *size == 0 {
                return Err("size must be positive".into());
            }
            expect_forward(ins[0], ins[1], "dy")?;
            ins[0].clone()
        }
        Op::GatherGrad { axis, shape } => {
            arity(ins, 2, 2)?;
            let data = TensorType::new(ins[1].dtype, shape.clone());
            float(&data)?;
            let forward = infer(&Op::Gather { axis: *axis }, &[&data, ins[0]])?.remove(0);
            expect_forward(&forward, ins[1], "dy")?;
            data
        }
        Op::Update(o) => return update(o, ins),
        Op::Slice { axes, starts, ends, steps } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            if axes.len() != starts.len() || axes.len() != ends.len() || axes.len() != steps.len() {
                return Err("slice needs as many starts, ends and steps as axes".into());
            }
            axes_in_range(axes, x.shape.len())?;
            let mut s = x.shape.clone();
            for i in 0..axes.len() {
                s[axes[i]] = slice_len(x.shape[axes[i]], starts[i], ends[i], steps[i])?;
            }
            TensorType::new(x.dtype, s)
        }
        Op::Reshape { shape } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            if checked_numel(shape)? != x.numel() {
                return Err(format!("cannot reshape {x} ({} elements) to {shape:?}", x.numel()));
            }
            TensorType::new(x.dtype, shape.clone())
        }
        Op::Flatten { axis } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            if *axis > x.shape.len() {
                return Err(format!("flatten axis {axis} out of range for {x}"));
            }
            TensorType::new(x.dtype, vec![checked_numel(&x.shape[..*axis])?, checked_numel(&x.shape[*axis..])?])
        }
        Op::Transpose { perm } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            let mut seen = vec![false; x.shape.len()];
            if perm.len() != x.shape.len() || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true)) {
                return Err(format!("{perm:?} is not a permutation of the {} dims of {x}", x.shape.len()));
            }
            TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p]).collect::<Shape>())
        }
        Op::Squeeze { axes } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            axes_in_range(axes, x.shape.len())?;
            if let Some(&a) = axes.iter().find(|&&a| x.shape[a] != 1) {
                return Err(format!("cannot squeeze axis {a} of {x}: its extent is not 1"));
            }
            let s = x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect::<Shape>();
            TensorType::new(x.dtype, s)
        }
        Op::Unsqueeze { axes } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            let rank = x.shape.len() + axes.len();
            axes_in_range(axes, rank)?;
            let mut src = x.shape.iter();
            let s = (0..rank).map(|i| if axes.contains(&i) { 1 } else { *src.next().unwrap_or(&1) }).collect::<Shape>();
            TensorType::new(x.dtype, s)
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            arity(ins, 1, 1)?;
            float(ins[0])?;
            axes_in_range(&[*axis], ins[0].shape.len())?;
            ins[0].clone()
        }
        Op::LayerNorm { axis, .. } => {
            arity(ins, 2, 3)?;
            float(ins[0])?;
            let x = ins[0];
            if *axis >= x.shape.len() {
                return Err(format!("layer_norm axis {axis} out of range for {x}"));
            }
            let norm = &x.shape[*axis..];
            for p in &ins[1..] {
                if broadcast(&p.shape, norm).as_deref() != Some(norm) {
                    return Err(format!("scale/bias {p} does not broadcast to the normalised dims {norm:?}"));
                }
            }
            x.clone()
        }
        Op::Lrn(crate::Lrn { size, .. }) => {
            arity(ins, 1, 1)?;
            rank_at_least(ins[0], 3)?;
            if *size == 0 {
                return Err("lrn size must be positive".into());
            }
            ins[0].clone()
        }
        Op::Pad { pads, mode } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            let r = x.shape.len();
            if pads.len() != 2 * r {
                return Err(format!("pads {pads:?} must have {} entries for {x}", 2 * r));
            }
            if *mode == crate::op::PadMode::Reflect && (0..r).any(|d| pads[d].max(pads[r + d]) >= x.shape[d].max(1)) {
                return Err(format!("reflect padding {pads:?} must be smaller than the dims of {x}"));
            }
            if !matches!(mode, crate::op::PadMode::Constant(_)) && (0..r).any(|d| x.shape[d] == 0 && pads[d] + pads[r + d] > 0) {
                return Err("cannot pad an empty dimension by reflection or edge".into());
            }
            let s = (0..r)
                .map(|d| x.shape[d].checked_add(pads[d]).and_then(|n| n.checked_add(pads[r + d])))
                .collect::<Option<Shape>>()
                .ok_or_else(|| format!("{TOO_LARGE}padding {x} by {pads:?} overflows"))?;
            TensorType::new(x.dtype, s)
        }
        Op::Expand { shape } => {
            arity(ins, 1, 1)?;
            if broadcast(&ins[0].shape, shape).as_deref() != Some(shape.as_slice()) {
                return Err(format!("{} does not broadcast to {shape:?}", ins[0]));
            }
            TensorType::new(ins[0].dtype, shape.clone())
        }
        Op::Gather { axis } => {
            arity(ins, 2, 2)?;
            let (x, i) = (ins[0], ins[1]);
            axes_in_range(&[*axis], x.shape.len())?;
            if !matches!(i.dtype, crate::DType::I64 | crate::DType::I32) {
                return Err(format!("indices must be i64 or i32, got {i}"));
            }
            let mut s = x.shape[..*axis].to_vec();
            s.extend_from_slice(&i.shape);
            s.extend_from_slice(&x.shape[axis + 1..]);
            TensorType::new(x.dtype, s)
        }
        Op::Tile { repeats } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            if repeats.len() != x.shape.len() {
                return Err(format!("tile needs {} repeats for {x}", x.shape.len()));
            }
            let s = x
                .shape
                .iter()
                .zip(repeats)
                .map(|(d, r)| d.checked_mul(*r))
                .collect::<Option<Shape>>()
                .ok_or_else(|| format!("{TOO_LARGE}tiling {x} by {repeats:?} overflows"))?;
            TensorType::new(x.dtype, s)
        }
        Op::Cast { to } => {
            arity(ins, 1, 1)?;
            TensorType::new(*to, ins[0].shape.clone())
        }
    };
    if out.checked_bytes().is_none() {
        return Err(format!("{TOO_LARGE}output shape {:?} exceeds 1 TiB", out.shape));
    }
    Ok(vec![out])
}

/// Output types of a kernel-level op: a semantic op's own, or those of the
/// form fusion made (a kernel that widens its first operand,
/// [`KernelOp::widens_first_operand`], converts one of another float dtype
/// on load: conv and GEMM forms).
pub fn infer_kernel(op: &KernelOp, ins: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    Ok(vec![match op {
        KernelOp::Op(Op::Conv(c)) => conv(c, ins, op.widens_first_operand())?,
        KernelOp::Op(Op::Gemm { trans_a, trans_b, .. }) => gemm(*trans_a, *trans_b, ins, op.widens_first_operand())?,
        KernelOp::Op(op) => return infer(op, ins),
        KernelOp::FusedConv { conv: c, bias, residual, .. } => {
            let n = 2 + *bias as usize + *residual as usize;
            arity(ins, n, n)?;
            let out = conv(c, &ins[..2 + *bias as usize], op.widens_first_operand())?;
            if *residual && *ins[n - 1] != out {
                return Err(format!("residual {} must equal the output {out}", ins[n - 1]));
            }
            out
        }
        KernelOp::FusedGemm { trans_a, trans_b, .. } => gemm(*trans_a, *trans_b, ins, op.widens_first_operand())?,
        KernelOp::Elementwise { expr } => elementwise(expr, ins)?,
        KernelOp::ConcatInPlace { axis } => concat(*axis, ins)?,
        KernelOp::SliceView { axis, start, end } => {
            arity(ins, 1, 1)?;
            let x = ins[0];
            let (axis, start, end) = (*axis, *start, *end);
            if axis >= x.shape.len() || start >= end || end > x.shape[axis] {
                return Err(format!("slice_view [{start}, {end}) of axis {axis} is outside {x}"));
            }
            if x.shape[..axis].iter().product::<usize>() != 1 {
                return Err(format!("slice_view of axis {axis} of {x} is not contiguous (the dims before it have more than one element)"));
            }
            let mut shape = x.shape.clone();
            shape[axis] = end - start;
            TensorType::new(x.dtype, shape)
        }
        KernelOp::Attention { expr, score, perms, .. } => return attention_types(expr, *score, perms, ins).map(|(t, _)| vec![t]),
        KernelOp::GemmEpilogue { product, expr, shape } => {
            if ins.len() < 2 {
                return Err(format!("gemm_epilogue takes the product's two operands, got {} inputs", ins.len()));
            }
            let p = match *product {
                crate::Product::MatMul => infer(&Op::MatMul, &ins[..2])?.remove(0),
                crate::Product::Gemm { trans_a, trans_b, .. } => gemm(trans_a, trans_b, &ins[..2], op.widens_first_operand())?,
            };
            if Ok(p.numel()) != checked_numel(shape) {
                return Err(format!("gemm_epilogue's product {p} cannot be read as shape {shape:?}"));
            }
            let p = TensorType::new(p.dtype, shape.clone());
            let all: Vec<&TensorType> = std::iter::once(&p).chain(ins[2..].iter().copied()).collect();
            let out = elementwise(expr, &all)?;
            if out.shape != *shape {
                return Err(format!("gemm_epilogue's operands broadcast to {:?}, not its shape {shape:?}", out.shape));
            }
            out
        }
        KernelOp::FusedReduction { expr, reduction } => {
            // The prologue reads the first inputs; the reduction's own
            // operands (a layer norm's scale and bias) follow.
            let k = expr.arity().min(ins.len());
            let pre = elementwise(expr, &ins[..k])?;
            let mut all = vec![&pre];
            all.extend_from_slice(&ins[k..]);
            return infer(&reduction.op(), &all);
        }
    }])
}

/// The output of fused attention, and the scores' type: see
/// [`KernelOp::Attention`].
pub fn attention_types(
    expr: &Expr,
    score: usize,
    perms: &[Vec<usize>; 4],
    ins: &[&TensorType],
) -> Result<(TensorType, TensorType), String> {
    arity(ins, 3, usize::MAX)?;
    let mut read = Vec::with_capacity(3);
    for (t, perm) in ins.iter().zip(&perms[..3]) {
        if perm.is_empty() {
            read.push((*t).clone());
        } else {
            read.push(infer(&Op::Transpose { perm: perm.clone() }, &[t])?.remove(0));
        }
    }
    let (q, kt, v) = (&read[0], &read[1], &read[2]);
    if [q, kt, v].iter().any(|t| t.shape.len() < 2) {
        return Err(format!("attention needs q, k and v of rank at least 2, got {q}, {kt}, {v}"));
    }
    let scores = matmul(&[q, kt])?;
    let out = matmul(&[&scores, v])?;
    let extras = &ins[3..];
    if score > extras.len() {
        return Err(format!("score input {score} of {} prologue inputs", extras.len() + 1));
    }
    let mut pre: Vec<&TensorType> = extras.to_vec();
    pre.insert(score, &scores);
    let s = elementwise(expr, &pre)?;
    if s.shape != scores.shape {
        return Err(format!("the prologue's inputs broadcast to {s}, beyond the scores {scores}"));
    }
    let out = TensorType::new(v.dtype, out.shape);
    if perms[3].is_empty() {
        return Ok((out, s));
    }
    Ok((infer(&Op::Transpose { perm: perms[3].clone() }, &[&out])?.remove(0), s))
}

fn elementwise(expr: &Expr, ins: &[&TensorType]) -> Result<TensorType, String> {
    arity(ins, 1, usize::MAX)?;
    for t in ins {
        float(t)?;
    }
    if !expr.is_well_formed() || expr.arity() != ins.len() {
        return Err(format!("expression {expr} does not use exactly {} inputs", ins.len()));
    }
    let d = expr.dtype(&ins.iter().map(|t| t.dtype).collect::<Vec<_>>())?;
    Ok(TensorType::new(d, broadcast_all(ins)?))
}

/// Numpy broadcast of two shapes, or `None` when they are incompatible.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Shape> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Element strides of `shape` read as `full` under numpy broadcasting (0
/// along broadcast dims): element `c` of `full` is at `sum(c[d] * st[d])`.
pub fn broadcast_strides(shape: &[usize], full: &[usize]) -> Vec<usize> {
    let mut st = vec![0; full.len()];
    let mut s = 1;
    for d in (0..shape.len()).rev() {
        let fd = d + full.len() - shape.len();
        st[fd] = if shape[d] == 1 { 0 } else { s };
        s *= shape[d];
    }
    st
}

/// The flat index in `shape` (broadcast to `full`) of flat index `i` of `full`.
pub fn broadcast_index(i: usize, full: &[usize], shape: &[usize]) -> usize {
    crate::index::offset(i, full, &broadcast_strides(shape, full))
}

fn broadcast_all(ins: &[&TensorType]) -> Result<Shape, String> {
    let mut s = ins[0].shape.clone();
    for t in &ins[1..] {
        s = broadcast(&s, &t.shape).ok_or_else(|| format!("shapes {:?} and {:?} do not broadcast", s, t.shape))?;
    }
    Ok(s)
}

/// The product of `dims`, or an error when it overflows.
pub fn checked_numel(dims: &[usize]) -> Result<usize, String> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("{TOO_LARGE}shape {dims:?} has more elements than a usize holds"))
}

/// Number of elements of a slice of a dim of extent `dim`.
pub fn slice_len(dim: usize, start: i64, end: i64, step: i64) -> Result<usize, String> {
    if dim == 0 && start == 0 && end == 0 && step != 0 {
        return Ok(0);
    }
    let d = i64::try_from(dim).map_err(|_| format!("{TOO_LARGE}extent {dim}"))?;
    let ok = if step > 0 {
        (0..=d).contains(&start) && (0..=d).contains(&end)
    } else {
        step < 0 && (0..d).contains(&start.min(d - 1).max(0)) && (-1..d).contains(&end)
    };
    if !ok || (step < 0 && d == 0) {
        return Err(format!("slice start {start} end {end} step {step} out of range for extent {dim}"));
    }
    // In i128: a step near i64::MAX must not overflow.
    let (start, end, step) = (start as i128, end as i128, step as i128);
    let len = if step > 0 { (end - start + step - 1).div_euclid(step) } else { (start - end - step - 1).div_euclid(-step) };
    Ok(len.max(0) as usize)
}

fn arity(ins: &[&TensorType], min: usize, max: usize) -> Result<(), String> {
    if ins.len() < min || ins.len() > max {
        let want = if min == max {
            format!("{min}")
        } else if max == usize::MAX {
            format!("at least {min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(format!("takes {want} inputs, got {}", ins.len()));
    }
    Ok(())
}

fn float(t: &TensorType) -> Result<(), String> {
    if !t.dtype.is_float() {
        return Err(format!("needs a float input, got {t}"));
    }
    Ok(())
}

fn same_dtype(ins: &[&TensorType]) -> Result<(), String> {
    if let Some(t) = ins.iter().find(|t| t.dtype != ins[0].dtype) {
        return Err(format!("mixes dtypes {} and {}", ins[0].dtype, t.dtype));
    }
    Ok(())
}

fn rank_at_least(t: &TensorType, r: usize) -> Result<(), String> {
    if t.shape.len() < r {
        return Err(format!("needs rank at least {r}, got {t}"));
    }
    Ok(())
}

fn axes_in_range(axes: &[usize], rank: usize) -> Result<(), String> {
    if let Some(a) = axes.iter().find(|&&a| a >= rank) {
        return Err(format!("axis {a} out of range for rank {rank}"));
    }
    Ok(())
}

fn spatial_out(input: usize, k: usize, stride: usize, dil: usize, pb: usize, pe: usize, ceil: bool) -> Result<usize, String> {
    if stride == 0 || dil == 0 || k == 0 {
        return Err("kernel, stride and dilation must be positive".into());
    }
    let too_big = || format!("{TOO_LARGE}window (kernel {k}, dilation {dil}) or padding ({pb}, {pe}) overflows");
    let eff = dil.checked_mul(k - 1).and_then(|e| e.checked_add(1)).ok_or_else(too_big)?;
    let padded = input.checked_add(pb).and_then(|p| p.checked_add(pe)).ok_or_else(too_big)?;
    if padded < eff {
        return Err(format!("window {eff} larger than padded input {padded}"));
    }
    let span = padded - eff;
    let mut out = if ceil { span.div_ceil(stride) + 1 } else { span / stride + 1 };
    // ONNX/PyTorch rule: the last window must start inside the input or left padding.
    if ceil && (out - 1).saturating_mul(stride) >= input + pb {
        out -= 1;
    }
    Ok(out)
}

/// Checks that a gradient operand has the forward output's type.
fn expect_forward(forward: &TensorType, got: &TensorType, what: &str) -> Result<(), String> {
    if forward != got {
        return Err(format!("{what} {got} must have the forward output's type {forward}"));
    }
    Ok(())
}

fn update(o: &crate::op::Optimizer, ins: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    let scalar = |t: &TensorType| {
        if t.dtype != DType::F32 || !t.shape.is_empty() {
            return Err(format!("the step counter {t} must be f32[]"));
        }
        Ok(())
    };
    if *o == crate::op::Optimizer::Count {
        arity(ins, 1, 1)?;
        scalar(ins[0])?;
        return Ok(vec![ins[0].clone()]);
    }
    let n = 3 + o.states();
    arity(ins, n, n)?;
    let p = ins[0];
    if p.dtype != DType::F32 {
        return Err(format!("parameter {p} must be f32 (master weights)"));
    }
    scalar(ins[2])?;
    for t in ins[1..2].iter().chain(&ins[3..]) {
        if t != &p {
            return Err(format!("gradient and state {t} must have the parameter's type {p}"));
        }
    }
    Ok(std::iter::once(p.clone()).chain(ins[3..].iter().map(|&t| t.clone())).collect())
}

fn check_window(n: usize, strides: &[usize], pads: &[usize], dil: &[usize]) -> Result<(), String> {
    if strides.len() != n || pads.len() != 2 * n || dil.len() != n {
        return Err(format!("needs {n} strides and dilations and {} pads for {n} spatial dims", 2 * n));
    }
    Ok(())
}

/// `widen`: the kernel computes in its weights' dtype and converts a float
/// x of another dtype as it loads it (a kernel capability: a semantic conv
/// takes operands of one dtype).
fn conv(c: &Conv, ins: &[&TensorType], widen: bool) -> Result<TensorType, String> {
    arity(ins, 2, 3)?;
    let (x, w) = (ins[0], ins[1]);
    float(x)?;
    float(w)?;
    same_dtype(if widen { &ins[1..] } else { ins })?;
    rank_at_least(x, 3)?;
    let n = x.shape.len() - 2;
    if w.shape.len() != n + 2 {
        return Err(format!("weight {w} must have rank {} for input {x}", n + 2));
    }
    check_window(n, &c.strides, &c.pads, &c.dilations)?;
    let g = c.group;
    if g == 0 || x.shape[1] % g != 0 || w.shape[0] % g != 0 || w.shape[1] * g != x.shape[1] {
        return Err(format!("input {x} with {g} groups does not match weight {w}"));
    }
    if let Some(b) = ins.get(2) {
        if b.shape != [w.shape[0]] {
            return Err(format!("bias {b} must be [{}]", w.shape[0]));
        }
    }
    let mut s = vec![x.shape[0], w.shape[0]];
    for i in 0..n {
        s.push(spatial_out(x.shape[2 + i], w.shape[2 + i], c.strides[i], c.dilations[i], c.pads[i], c.pads[n + i], false)?);
    }
    Ok(TensorType::new(w.dtype, s))
}

/// The most element reads a pooling window may make in all (2^48).
const MAX_WINDOW_READS: usize = 1 << 48;

fn pool(p: &Pool, ins: &[&TensorType]) -> Result<TensorType, String> {
    arity(ins, 1, 1)?;
    let x = ins[0];
    float(x)?;
    rank_at_least(x, 3)?;
    let n = x.shape.len() - 2;
    let ones = vec![1; n];
    check_window(n, &p.strides, &p.pads, &ones)?;
    if p.kernel.len() != n {
        return Err(format!("needs {n} kernel extents"));
    }
    let mut s = x.shape[..2].to_vec();
    for i in 0..n {
        if p.pads[i] >= p.kernel[i] || p.pads[n + i] >= p.kernel[i] {
            return Err(format!("padding {:?} must be smaller than the window {:?}", p.pads, p.kernel));
        }
        s.push(spatial_out(x.shape[2 + i], p.kernel[i], p.strides[i], 1, p.pads[i], p.pads[n + i], p.ceil_mode)?);
    }
    // The window reads, element by element: a kernel of absurd extent on a
    // tiny output would loop for ages (padding may be almost the window).
    let work = checked_numel(&s).ok().and_then(|n| checked_numel(&p.kernel).ok().and_then(|k| n.checked_mul(k)));
    if work.is_none_or(|w| w > MAX_WINDOW_READS) {
        return Err(format!("{TOO_LARGE}window {:?} over output {s:?} reads over 2^48 elements", p.kernel));
    }
    Ok(TensorType::new(x.dtype, s))
}

fn batch_norm(ins: &[&TensorType]) -> Result<TensorType, String> {
    arity(ins, 5, 5)?;
    let x = ins[0];
    float(x)?;
    rank_at_least(x, 2)?;
    for p in &ins[1..] {
        if p.shape != [x.shape[1]] {
            return Err(format!("parameter {p} must be [{}] for input {x}", x.shape[1]));
        }
    }
    Ok(x.clone())
}

/// `widen`: as for [`conv`], the kernel converts a float `a` of another
/// dtype to b's as it loads it.
fn gemm(ta: bool, tb: bool, ins: &[&TensorType], widen: bool) -> Result<TensorType, String> {
    arity(ins, 2, 3)?;
    same_dtype(if widen { &ins[1..] } else { ins })?;
    if ins[0].dtype != ins[1].dtype && !(ins[0].dtype.is_float() && ins[1].dtype.is_float()) {
        return Err(format!("mixes dtypes {} and {}", ins[0].dtype, ins[1].dtype));
    }
    let (a, b) = (ins[0], ins[1]);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err(format!("needs 2-D operands, got {a} and {b}"));
    }
    let (m, k) = if ta { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let (k2, n) = if tb { (b.shape[1], b.shape[0]) } else { (b.shape[0], b.shape[1]) };
    if k != k2 {
        return Err(format!("inner dimensions differ: {a} and {b} (trans_a={ta}, trans_b={tb})"));
    }
    if let Some(c) = ins.get(2) {
        if broadcast(&c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
            return Err(format!("bias {c} does not broadcast to [{m},{n}]"));
        }
    }
    Ok(TensorType::new(b.dtype, vec![m, n]))
}

fn matmul(ins: &[&TensorType]) -> Result<TensorType, String> {
    arity(ins, 2, 2)?;
    same_dtype(ins)?;
    let (a, b) = (ins[0], ins[1]);
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err("matmul operands must have rank at least 1".into());
    }
    let a2 = if a.shape.len() == 1 { vec![1, a.shape[0]] } else { a.shape.clone() };
    let b2 = if b.shape.len() == 1 { vec![b.shape[0], 1] } else { b.shape.clone() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(format!("inner dimensions differ: {a} and {b}"));
    }
    let batch = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).ok_or_else(|| format!("batch dims of {a} and {b} do not broadcast"))?;
    let mut s = batch;
    if a.shape.len() > 1 {
        s.push(m);
    }
    if b.shape.len() > 1 {
        s.push(n);
    }
    Ok(TensorType::new(a.dtype, s))
}

fn concat(axis: usize, ins: &[&TensorType]) -> Result<TensorType, String> {
    arity(ins, 1, usize::MAX)?;
    same_dtype(ins)?;
    let first = ins[0];
    axes_in_range(&[axis], first.shape.len())?;
    let mut s = first.shape.clone();
    s[axis] = 0;
    for t in ins {
        let fits = t.shape.len() == first.shape.len() && s[axis].checked_add(t.shape[axis]).is_some();
        let same_rest =
            t.shape.len() == first.shape.len() && t.shape.iter().zip(&first.shape).enumerate().all(|(i, (a, b))| i == axis || a == b);
        if !same_rest || !fits {
            return Err(format!("cannot concatenate {t} with {first} along axis {axis}"));
        }
        s[axis] += t.shape[axis];
    }
    Ok(TensorType::new(first.dtype, s))
}

fn split(axis: usize, sizes: &[usize], ins: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    arity(ins, 1, 1)?;
    let x = ins[0];
    axes_in_range(&[axis], x.shape.len())?;
    if sizes.is_empty() || sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(x.shape[axis]) {
        return Err(format!("split sizes {sizes:?} do not add up to extent {} of {x}", x.shape[axis]));
    }
    Ok(sizes
        .iter()
        .map(|&n| {
            let mut s = x.shape.clone();
            s[axis] = n;
            TensorType::new(x.dtype, s)
        })
        .collect())
}
