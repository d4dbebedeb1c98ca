//! ONNX's reductions: the Reduce family, arg-extremes, top-k and
//! cumulative sums.

use super::nodes::*;
use super::{Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::ValueId;
use crate::op::{BinaryOp, CompareOp, LogicOp, Op, ReduceOp, UnaryOp};
use crate::tensor::Tensor;

/// The reductions: each with its attributes, its arity at `opset` and
/// its lowering.
pub(super) fn spec(op_type: &str, opset: i64) -> Option<Spec> {
    let (attributes, arity, lower): (&'static [&'static str], Arity, Lower) = match op_type {
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
            (REDUCE, if opset < 18 { (1, 1, 1) } else { (1, 2, 1) }, reduce)
        }
        "ReduceSum" => (REDUCE, if opset < 13 { (1, 1, 1) } else { (1, 2, 1) }, reduce),
        "ReduceProd" => (REDUCE, if opset < 18 { (1, 1, 1) } else { (1, 2, 1) }, built),
        "ArgMax" | "ArgMin" => (&["axis", "keepdims", "select_last_index"], (1, 1, 1), arg_extreme),
        "TopK" => (&["axis", "k", "largest", "sorted"], if opset < 10 { (1, 1, 2) } else { (2, 2, 2) }, top_k),
        "CumSum" => (&["exclusive", "reverse"], (2, 2, 1), built),
        _ => return None,
    };
    Some(Spec { attributes, arity, lower })
}

/// The attributes of the Reduce family.
const REDUCE: &[&str] = &["axes", "keepdims", "noop_with_empty_axes"];

/// The Reduce family. Mean, Sum and Max are `Op::Reduce`; the others are
/// built from it and elementwise ops (Min = -Max(-x), L1 = Sum|x|, L2 =
/// sqrt(Sum x^2), SumSquare, LogSum = log Sum, LogSumExp = m + log Sum
/// exp(x - m) with m = Max x). Empty axes with `noop_with_empty_axes`
/// keep the elementwise parts, as numpy's reduction over no axis; a
/// reduction over an empty extent is its identity, a constant.
pub(super) fn reduce(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    let rank = ty.shape.len();
    let axes_in = (op_type == "ReduceSum" && cx.opset >= 13) || cx.opset >= 18;
    let given = if axes_in { const_ints(im, cx, 1, "axes")? } else { cx.ints("axes")? };
    let keepdims = cx.int("keepdims", 1)? != 0;
    let ax = match given {
        Some(v) if !v.is_empty() => axes(cx, &v, rank)?,
        _ if cx.int("noop_with_empty_axes", 0)? != 0 => Vec::new(),
        _ => (0..rank).collect(),
    };
    let float = ty.dtype.is_float();
    if !float && !matches!(op_type, "ReduceMean" | "ReduceSum" | "ReduceMax") {
        return Err(cx.unsupported(format!("{op_type} of {} (smelt computes it for float types)", ty.dtype)));
    }
    if ax.is_empty() && matches!(op_type, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceLogSumExp") {
        return reshaping(im, cx, Op::Identity, x);
    }
    let reduced = Op::Reduce { op: ReduceOp::Sum, axes: ax.clone(), keepdims };
    let out_ty = crate::infer::infer(&reduced, &[&ty]).map_err(|m| cx.bad(m))?.remove(0);
    if !ax.is_empty() && ax.iter().any(|&a| ty.shape[a] == 0) {
        let identity = match op_type {
            "ReduceMean" => f64::NAN,
            "ReduceMax" if ty.dtype == DType::Bool => 0.0,
            "ReduceMax" if ty.dtype == DType::I64 => i64::MIN as f64,
            "ReduceMax" if ty.dtype == DType::I32 => i32::MIN as f64,
            "ReduceMax" => f64::NEG_INFINITY,
            "ReduceMin" => f64::INFINITY,
            "ReduceLogSum" | "ReduceLogSumExp" => f64::NEG_INFINITY,
            _ => 0.0,
        };
        made(cx, &out_ty)?;
        return Ok(konst(Tensor::full(&out_ty, identity)));
    }
    let simple = match op_type {
        "ReduceMean" => Some(ReduceOp::Mean),
        "ReduceSum" => Some(ReduceOp::Sum),
        "ReduceMax" => Some(ReduceOp::Max),
        _ => None,
    };
    if let Some(op) = simple {
        if ty.dtype == DType::Bool {
            // Booleans reduce as 0 and 1.
            let xv = im.value(x)?;
            let f = one_value(im, cx, Op::Cast { to: DType::F32 }, &[xv])?;
            let m = one_value(im, cx, Op::Reduce { op, axes: ax, keepdims }, &[f])?;
            return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, Op::Cast { to: DType::Bool }, &[m])?) }]);
        }
        return emit(im, cx, Op::Reduce { op, axes: ax, keepdims }, &[x]);
    }
    let xv = im.value(x)?;
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| -> Result<ValueId, IrError> {
        Ok(emit_values(im, cx, op, vs)?[0].value.expect("a value"))
    };
    let sum = |ax: &[usize], keepdims: bool| Op::Reduce { op: ReduceOp::Sum, axes: ax.to_vec(), keepdims };
    let y = match op_type {
        "ReduceMin" => {
            let n = one(im, Op::Unary(UnaryOp::Neg), &[xv])?;
            let m = one(im, Op::Reduce { op: ReduceOp::Max, axes: ax, keepdims }, &[n])?;
            one(im, Op::Unary(UnaryOp::Neg), &[m])?
        }
        "ReduceL1" => {
            let a = one(im, Op::Unary(UnaryOp::Abs), &[xv])?;
            if ax.is_empty() {
                a
            } else {
                one(im, sum(&ax, keepdims), &[a])?
            }
        }
        "ReduceL2" | "ReduceSumSquare" => {
            let sq = one(im, Op::Binary(BinaryOp::Mul), &[xv, xv])?;
            let s = if ax.is_empty() { sq } else { one(im, sum(&ax, keepdims), &[sq])? };
            if op_type == "ReduceL2" {
                one(im, Op::Unary(UnaryOp::Sqrt), &[s])?
            } else {
                s
            }
        }
        "ReduceLogSum" => {
            let s = if ax.is_empty() { xv } else { one(im, sum(&ax, keepdims), &[xv])? };
            one(im, Op::Unary(UnaryOp::Log), &[s])?
        }
        _ => {
            // LogSumExp, shifted by the maximum so that exp cannot overflow.
            let m = one(im, Op::Reduce { op: ReduceOp::Max, axes: ax.clone(), keepdims: true }, &[xv])?;
            let d = one(im, Op::Binary(BinaryOp::Sub), &[xv, m])?;
            let e = one(im, Op::Unary(UnaryOp::Exp), &[d])?;
            let s = one(im, sum(&ax, true), &[e])?;
            let l = one(im, Op::Unary(UnaryOp::Log), &[s])?;
            let y = one(im, Op::Binary(BinaryOp::Add), &[l, m])?;
            if keepdims {
                y
            } else {
                one(im, Op::Reshape { shape: out_ty.shape.clone() }, &[y])?
            }
        }
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// ArgMax and ArgMin: the maximum (of x, or of -x) along the axis, then
/// the first (or last, `select_last_index`) position that holds it, as
/// the largest of -index (or of index) where x equals it; int64.
pub(super) fn arg_extreme(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.unsupported(format!("{} of {} (smelt computes it for float types)", cx.node.op_type(), ty.dtype)));
    }
    let rank = ty.shape.len();
    let ax = axis(cx, cx.int("axis", 0)?, rank.max(1))?;
    let n = *ty.shape.get(ax).ok_or_else(|| cx.bad("invalid ONNX: a scalar has no axis"))?;
    if n == 0 || n > 1 << 24 {
        return Err(cx.unsupported(format!("{} over {n} elements (1 to 2^24)", cx.node.op_type())));
    }
    let keepdims = cx.int("keepdims", 1)? != 0;
    let last = cx.int("select_last_index", 0)? != 0;
    let mut xv = im.value(x)?;
    if cx.node.op_type() == "ArgMin" {
        xv = one_value(im, cx, Op::Unary(UnaryOp::Neg), &[xv])?;
    }
    let max = |keepdims| Op::Reduce { op: ReduceOp::Max, axes: vec![ax], keepdims };
    let m = one_value(im, cx, max(true), &[xv])?;
    let at = one_value(im, cx, Op::Compare(CompareOp::Equal), &[xv, m])?;
    // As numpy: where the slice holds a NaN, the (first or last) NaN.
    let nan = one_value(im, cx, Op::IsNaN, &[xv])?;
    let nan_f = one_value(im, cx, Op::Cast { to: DType::F32 }, &[nan])?;
    let any = one_value(im, cx, max(true), &[nan_f])?;
    let any = one_value(im, cx, Op::Cast { to: DType::Bool }, &[any])?;
    let at = one_value(im, cx, Op::Where, &[any, nan, at])?;
    let mut shape = vec![1; rank];
    shape[ax] = n;
    // Positions in f32 (exact below 2^24): index for the last, -index for the first.
    let sign = if last { 1.0 } else { -1.0 };
    let idx = Tensor::from_f32(shape, (0..n).map(|i| sign * i as f32).collect());
    let idx = constant(im, cx, "positions", idx)?;
    let none = scalar(im, cx, "no position", DType::F32, -(n as f64) - 1.0)?;
    let cand = one_value(im, cx, Op::Where, &[at, idx, none])?;
    let mut r = one_value(im, cx, max(keepdims), &[cand])?;
    if !last {
        r = one_value(im, cx, Op::Unary(UnaryOp::Neg), &[r])?;
    }
    let r = one_value(im, cx, Op::Cast { to: DType::I64 }, &[r])?;
    Ok(vec![Entry { konst: None, value: Some(r) }])
}

/// TopK (K at most 64): K rounds of the maximum (of x, or of -x for the
/// smallest) among the positions not yet taken, and its first position;
/// values and int64 indices in order, ties to the lower index.
pub(super) fn top_k(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.unsupported(format!("TopK of {} (smelt computes it for float types)", ty.dtype)));
    }
    let r = ty.shape.len();
    let a = axis(cx, cx.int("axis", -1)?, r.max(1))?;
    let n = *ty.shape.get(a).ok_or_else(|| cx.bad("invalid ONNX: TopK of a scalar"))?;
    let k = match cx.opset {
        o if o < 10 => cx.int("k", 0)?,
        _ => match const_int_vec(im, cx, 1, "K")?[..] {
            [k] => k,
            _ => return Err(cx.bad("invalid ONNX: K must hold one value")),
        },
    };
    let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| cx.bad(format!("invalid ONNX: K={k} for an axis of {n}")))?;
    if k > 64 || n > 1 << 24 {
        return Err(cx.unsupported(format!("TopK of {k} of {n} (at most 64 of 2^24)")));
    }
    let largest = cx.int("largest", 1)? != 0;
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let mut xs = im.value(x)?;
    if !largest {
        xs = one(im, Op::Unary(UnaryOp::Neg), &[xs])?;
    }
    let mut shape = vec![1; r];
    shape[a] = n;
    let pos = constant(im, cx, "positions", Tensor::from_f32(shape.clone(), (0..n).map(|i| i as f32).collect()).cast(ty.dtype))?;
    let neg_pos = constant(im, cx, "-positions", Tensor::from_f32(shape, (0..n).map(|i| -(i as f32)).collect()).cast(ty.dtype))?;
    let none = scalar(im, cx, "no position", ty.dtype, -(n as f64) - 1.0)?;
    let minus_inf = scalar(im, cx, "-inf", ty.dtype, f64::NEG_INFINITY)?;
    let max = Op::Reduce { op: ReduceOp::Max, axes: vec![a], keepdims: true };
    let eq = Op::Compare(CompareOp::Equal);
    let (mut taken, mut values, mut indices): (Option<ValueId>, Vec<ValueId>, Vec<ValueId>) = (None, vec![], vec![]);
    for _ in 0..k {
        let avail = match taken {
            Some(t) => one(im, Op::Where, &[t, minus_inf, xs])?,
            None => xs,
        };
        let m = one(im, max.clone(), &[avail])?;
        let mut at = one(im, eq.clone(), &[avail, m])?;
        if let Some(t) = taken {
            let free = one(im, Op::Not, &[t])?;
            at = one(im, Op::Logic(LogicOp::And), &[at, free])?;
        }
        let cand = one(im, Op::Where, &[at, neg_pos, none])?;
        let first = one(im, max.clone(), &[cand])?;
        let idx = one(im, Op::Unary(UnaryOp::Neg), &[first])?;
        let hit = one(im, eq.clone(), &[pos, idx])?;
        taken = Some(match taken {
            Some(t) => one(im, Op::Logic(LogicOp::Or), &[t, hit])?,
            None => hit,
        });
        values.push(if largest { m } else { one(im, Op::Unary(UnaryOp::Neg), &[m])? });
        indices.push(idx);
    }
    let cat = |im: &mut Importer, vs: &[ValueId]| if vs.len() == 1 { Ok(vs[0]) } else { one(im, Op::Concat { axis: a }, vs) };
    if k == 0 {
        let mut s = ty.shape.clone();
        s[a] = 0;
        return Ok(vec![
            konst(Tensor::full(&TensorType::new(ty.dtype, s.clone()), 0.0)).remove(0),
            konst(Tensor::full(&TensorType::new(DType::I64, s), 0.0)).remove(0),
        ]);
    }
    let v = cat(im, &values)?;
    let i = cat(im, &indices)?;
    let i = one(im, Op::Cast { to: DType::I64 }, &[i])?;
    Ok(vec![Entry { konst: None, value: Some(v) }, Entry { konst: None, value: Some(i) }])
}
