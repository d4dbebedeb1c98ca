//! ONNX's elementwise ops: unary functions, arithmetic, comparisons and
//! logic, clipping, and the functions built from them.

use super::nodes::*;
use super::{fold, Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::ValueId;
use crate::op::{BinaryOp, CompareOp, LogicOp, Named, Op, ReduceOp, UnaryOp};
use crate::tensor::Tensor;
use std::sync::Arc;

/// The elementwise ops: each with its attributes, its arity at `opset`
/// and its lowering.
pub(super) fn spec(op_type: &str, opset: i64) -> Option<Spec> {
    let (attributes, arity, lower): (&'static [&'static str], Arity, Lower) = match op_type {
        "LeakyRelu" | "Elu" => (&["alpha"], (1, 1, 1), simple),
        "Selu" => (&["alpha", "gamma"], (1, 1, 1), simple),
        "Gelu" => (&["approximate"], (1, 1, 1), simple),
        "HardSigmoid" => (&["alpha", "beta"], (1, 1, 1), small_decompositions),
        "Celu" | "Swish" | "ThresholdedRelu" => (&["alpha"], (1, 1, 1), small_decompositions),
        "IsInf" => (&["detect_positive", "detect_negative"], (1, 1, 1), small_decompositions),
        "Softsign" | "HardSwish" | "Mish" => (&[], (1, 1, 1), small_decompositions),
        t if UnaryOp::by_onnx_name(t).is_some() => (&[], (1, 1, 1), simple),
        t if CompareOp::by_onnx_name(t).is_some() || LogicOp::by_onnx_name(t).is_some() => (&[], (2, 2, 1), simple),
        "Pow" => (&["broadcast", "axis"], (2, 2, 1), simple),
        "Not" | "IsNaN" => (&[], (1, 1, 1), simple),
        "Where" => (&[], (3, 3, 1), simple),
        "PRelu" => (&[], (2, 2, 1), prelu),
        "Add" | "Sub" | "Mul" | "Div" => (&["broadcast", "axis"], (2, 2, 1), arith),
        "Max" | "Min" => (&[], (1, ANY, 1), arith),
        "Sum" => (&[], (1, ANY, 1), sum),
        "Mean" => (&[], (1, ANY, 1), mean),
        "Mod" => (&["fmod"], (2, 2, 1), modulo),
        "Clip" if opset < 11 => (&["min", "max"], (1, 1, 1), clip),
        "Clip" => (&["min", "max"], (1, 3, 1), clip),
        _ => return None,
    };
    Some(Spec { attributes, arity, lower })
}

/// The ops that are one semantic op on their inputs: unary functions,
/// comparisons, logic, `Pow`, `Not`, `IsNaN`, `Where`, `MatMul`,
/// `GlobalAveragePool` (integer `Neg`, `Abs`, `Sign` of constants and
/// mixed-type `Pow` take a cast or a fold).
pub(super) fn simple(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let simple = match op_type {
        "Gelu" => match cx.string("approximate")?.as_deref().unwrap_or("none") {
            "none" => unary(UnaryOp::Gelu),
            "tanh" => unary(UnaryOp::GeluTanh),
            other => return Err(cx.unsupported(format!("approximate={other:?} (Gelu takes \"none\" or \"tanh\")"))),
        },
        t if UnaryOp::by_onnx_name(t).is_some() => {
            let u = UnaryOp::by_onnx_name(t).expect("just found");
            let p = u.params().into_iter().map(|(k, default)| cx.float(k, default)).collect::<Result<Vec<f32>, IrError>>()?;
            unary(u.with_params(&p))
        }
        "Pow" => Some(Op::Binary(BinaryOp::Pow)),
        "Not" => Some(Op::Not),
        "IsNaN" => Some(Op::IsNaN),
        "Where" => Some(Op::Where),
        t if CompareOp::by_onnx_name(t).is_some() => CompareOp::by_onnx_name(t).map(Op::Compare),
        t if LogicOp::by_onnx_name(t).is_some() => LogicOp::by_onnx_name(t).map(Op::Logic),
        "MatMul" => Some(Op::MatMul),
        "GlobalAveragePool" => Some(Op::GlobalAveragePool),
        _ => None,
    };
    let Some(op) = simple else {
        return Err(IrError::UnsupportedOp { op_type: op_type.to_string(), node: cx.name.clone(), opset: cx.opset });
    };
    let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
    if let (Op::Unary(u @ (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign)), [x]) = (&op, ins.as_slice()) {
        if !im.ty(x)?.dtype.is_float() {
            return int_unary(im, cx, *u, x);
        }
    }
    if let (Op::Binary(BinaryOp::Pow), [x, y]) = (&op, ins.as_slice()) {
        let (xt, yt) = (im.ty(x)?, im.ty(y)?);
        if xt.dtype.is_float() && !yt.dtype.is_float() {
            // An integer exponent of a float base: the same powers in the base's type.
            let yv = im.value(y)?;
            let yf = one_value(im, cx, Op::Cast { to: xt.dtype }, &[yv])?;
            let xv = im.value(x)?;
            return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, op, &[xv, yf])?) }]);
        }
        if xt.dtype != yt.dtype && xt.dtype.is_float() == yt.dtype.is_float() {
            // Two floats or two integers: the exponent in the base's type.
            let yv = im.value(y)?;
            let yc = one_value(im, cx, Op::Cast { to: xt.dtype }, &[yv])?;
            let xv = im.value(x)?;
            return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, op, &[xv, yc])?) }]);
        }
        if !xt.dtype.is_float() && yt.dtype.is_float() {
            // A float exponent of an integer base: in the exponent's
            // type, then truncated to the base's (as numpy's astype).
            let xv = im.value(x)?;
            let xf = one_value(im, cx, Op::Cast { to: yt.dtype }, &[xv])?;
            let yv = im.value(y)?;
            let p = one_value(im, cx, op, &[xf, yv])?;
            return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, Op::Cast { to: xt.dtype }, &[p])?) }]);
        }
    }
    emit(im, cx, op, &ins)
}

/// `PRelu`.
pub(super) fn prelu(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    // Before opset 7 a 1-D slope of C elements is per channel.
    let (x, slope) = (cx.need(0)?, cx.need(1)?);
    let (xt, st) = (im.ty(x)?, im.ty(slope)?);
    let per_channel = cx.opset < 7 && st.shape.len() == 1 && xt.shape.len() > 2 && xt.shape.get(1) == st.shape.first();
    let slope = if per_channel { align(im, cx, slope, xt.shape.len() - 2)? } else { slope.to_string() };
    emit(im, cx, Op::Binary(BinaryOp::PRelu), &[x, &slope])
}

/// `Add`, `Sub`, `Mul`, `Div`, `Max` and `Min` (variadic: a chain).
pub(super) fn arith(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let mut ins: Vec<String> = cx.node.input.to_vec();
    if cx.opset < 7 && cx.int("broadcast", 0)? != 0 && ins.len() == 2 {
        // Legacy broadcast: b's dims line up with a's from `axis` on.
        let (at, bt) = (im.ty(&ins[0])?, im.ty(&ins[1])?);
        let ax = match cx.attrs.get("axis") {
            Some(a) => axis(cx, a.i(), at.shape.len())?,
            None => at.shape.len().saturating_sub(bt.shape.len()),
        };
        let trailing = at
            .shape
            .len()
            .checked_sub(ax + bt.shape.len())
            .ok_or_else(|| cx.bad(format!("cannot broadcast {bt} into {at} at axis {ax}")))?;
        ins[1] = align(im, cx, &ins[1], trailing)?;
    }
    let ins: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
    let b = match op_type {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Max" => BinaryOp::Max,
        _ => BinaryOp::Min,
    };
    let consts: Option<Vec<Arc<Tensor>>> = ins.iter().map(|n| im.konst(n)).collect();
    if let Some(cs) = consts.filter(|cs| cs.len() == 2 && cs.iter().all(|c| matches!(c.ty().dtype, DType::I64 | DType::I32))) {
        let f: fn(i64, i64) -> Option<i64> = match b {
            BinaryOp::Add => i64::checked_add,
            BinaryOp::Sub => i64::checked_sub,
            BinaryOp::Mul => i64::checked_mul,
            BinaryOp::Div => i64::checked_div,
            BinaryOp::Max => |a, b| Some(a.max(b)),
            _ => |a, b| Some(a.min(b)),
        };
        return Ok(konst(fold::int_binary(&cs[0], &cs[1], f).map_err(|m| cx.bad(m))?));
    }
    if ins.len() == 2 {
        return emit(im, cx, Op::Binary(b), &ins);
    }
    if !matches!(b, BinaryOp::Max | BinaryOp::Min) || ins.is_empty() {
        return Err(cx.bad(format!("takes 2 inputs, got {}", ins.len())));
    }
    // Variadic Max/Min: a chain of binary ops.
    let mut acc = im.value(ins[0])?;
    for n in &ins[1..] {
        let v = im.value(n)?;
        acc = emit_values(im, cx, Op::Binary(b), &[acc, v])?[0].value.expect("a value");
    }
    Ok(vec![Entry { konst: None, value: Some(acc) }])
}

/// `Sum`.
pub(super) fn sum(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
    emit(im, cx, Op::Sum, &ins)
}

/// `Mean`.
pub(super) fn mean(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
    let dtype = im.ty(ins[0])?.dtype;
    if !dtype.is_float() {
        return Err(cx.unsupported(format!("Mean of {dtype} (smelt computes it for float types)")));
    }
    let s = emit(im, cx, Op::Sum, &ins)?.remove(0);
    let sv = match s.value {
        Some(v) => v,
        None => {
            let name = format!("{}:sum", cx.name);
            im.env.insert(name.clone(), s);
            im.value(&name)?
        }
    };
    let n = scalar(im, cx, "1/n", dtype, 1.0 / ins.len() as f64)?;
    Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, Op::Binary(BinaryOp::Mul), &[sv, n])?) }])
}

/// `Mod`.
pub(super) fn modulo(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (a, b) = (cx.need(0)?, cx.need(1)?);
    let (Some(x), Some(y)) = (im.konst(a), im.konst(b)) else {
        return Err(cx.unsupported("Mod of a run-time tensor (only shape arithmetic on constants is folded)"));
    };
    let shape =
        crate::infer::broadcast(x.shape(), y.shape()).ok_or_else(|| cx.bad(format!("{} and {} do not broadcast", x.ty(), y.ty())))?;
    let n = crate::infer::checked_numel(&shape).map_err(|m| cx.bad(m))?;
    if n.saturating_mul(8) > FOLD_FREELY_BYTES.max(x.ty().bytes()).max(y.ty().bytes()) {
        return Err(cx.too_large(format!("a folded Mod of {n} elements from {} and {}", x.ty(), y.ty())));
    }
    Ok(konst(fold::modulo(&x, &y, cx.int("fmod", 0)? != 0).map_err(|m| cx.bad(m))?))
}

/// `Clip`.
pub(super) fn clip(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let (min, max) = if cx.opset < 11 {
        (cx.float("min", f32::NEG_INFINITY)?, cx.float("max", f32::INFINITY)?)
    } else {
        let bound = |i: usize, d: f32| -> Result<f32, IrError> {
            Ok(match cx.input(i) {
                Some(_) => const_input(im, cx, i, "a clip bound")?.to_f32_vec().first().copied().unwrap_or(d),
                None => d,
            })
        };
        (bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?)
    };
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() && cx.opset >= 11 {
        // Integers: max with the lower bound, min with the upper, exactly.
        let mut v = im.value(x)?;
        for (i, b) in [(1, BinaryOp::Max), (2, BinaryOp::Min)] {
            if cx.input(i).is_some() {
                let t = const_input(im, cx, i, "a clip bound")?;
                let t =
                    Tensor::from_i64(vec![], vec![*t.to_i64_vec().first().ok_or_else(|| cx.bad("an empty clip bound"))?]).cast(ty.dtype);
                let c = constant(im, cx, if i == 1 { "min" } else { "max" }, t)?;
                v = one_value(im, cx, Op::Binary(b), &[v, c])?;
            }
        }
        return Ok(vec![Entry { konst: None, value: Some(v) }]);
    }
    emit(im, cx, Op::Clip { min, max }, &[x])
}

/// Neg, Abs and Sign of integers: exact on constants (shape arithmetic in
/// expanded functions); at run time smelt computes them for floats only.
pub(super) fn int_unary(im: &mut Importer, cx: &Cx, u: UnaryOp, x: &str) -> Result<Vec<Entry>, IrError> {
    let Some(t) = im.konst(x) else {
        return Err(cx.unsupported(format!(
            "{} of a run-time {} tensor (smelt computes it for float types)",
            cx.node.op_type(),
            im.ty(x)?.dtype
        )));
    };
    let f = |v: i64| match u {
        UnaryOp::Neg => v.wrapping_neg(),
        UnaryOp::Abs => v.wrapping_abs(),
        _ => v.signum(),
    };
    let ty = t.ty().clone();
    Ok(konst(Tensor::from_i64(ty.shape.clone(), t.to_i64_vec().into_iter().map(f).collect()).cast(ty.dtype)))
}

pub(super) fn unary(u: UnaryOp) -> Option<Op> {
    Some(Op::Unary(u))
}

/// HardSigmoid = clip(alpha x + beta, 0, 1); Celu = alpha elu(x / alpha);
/// IsInf = x == +inf or x == -inf (as detected); Softsign = x / (1 + |x|);
/// HardSwish = x hardsigmoid(x) (alpha 1/6); Swish = x sigmoid(alpha x);
/// Mish = x tanh(softplus(x)); ThresholdedRelu = x where x > alpha, else
/// 0; GlobalMaxPool = the maximum over the spatial dims.
pub(super) fn small_decompositions(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let dtype = im.ty(x)?.dtype;
    if !dtype.is_float() {
        return Err(cx.unsupported(format!("{} of {dtype} (smelt computes it for float types)", cx.node.op_type())));
    }
    let xv = im.value(x)?;
    let mul = Op::Binary(BinaryOp::Mul);
    let unary = |im: &mut Importer, u: UnaryOp, v: ValueId| one_value(im, cx, Op::Unary(u), &[v]);
    let y = match cx.node.op_type() {
        op @ ("HardSigmoid" | "HardSwish") => {
            let (alpha, beta) =
                if op == "HardSwish" { (1.0 / 6.0, 0.5) } else { (cx.float("alpha", 0.2)? as f64, cx.float("beta", 0.5)? as f64) };
            let a = scalar(im, cx, "alpha", dtype, alpha)?;
            let b = scalar(im, cx, "beta", dtype, beta)?;
            let ax = one_value(im, cx, mul.clone(), &[xv, a])?;
            let y = one_value(im, cx, Op::Binary(BinaryOp::Add), &[ax, b])?;
            let hs = one_value(im, cx, Op::Clip { min: 0.0, max: 1.0 }, &[y])?;
            if op == "HardSwish" {
                one_value(im, cx, mul, &[xv, hs])?
            } else {
                hs
            }
        }
        "Softsign" => {
            let a = unary(im, UnaryOp::Abs, xv)?;
            let one_ = scalar(im, cx, "one", dtype, 1.0)?;
            let d = one_value(im, cx, Op::Binary(BinaryOp::Add), &[a, one_])?;
            one_value(im, cx, Op::Binary(BinaryOp::Div), &[xv, d])?
        }
        "Swish" => {
            let a = scalar(im, cx, "alpha", dtype, cx.float("alpha", 1.0)? as f64)?;
            let ax = one_value(im, cx, mul.clone(), &[xv, a])?;
            let s = unary(im, UnaryOp::Sigmoid, ax)?;
            one_value(im, cx, mul, &[xv, s])?
        }
        "Mish" => {
            let sp = unary(im, UnaryOp::Softplus, xv)?;
            let t = unary(im, UnaryOp::Tanh, sp)?;
            one_value(im, cx, mul, &[xv, t])?
        }
        "ThresholdedRelu" => {
            let a = scalar(im, cx, "alpha", dtype, cx.float("alpha", 1.0)? as f64)?;
            let keep = one_value(im, cx, Op::Compare(CompareOp::Greater), &[xv, a])?;
            let zero = scalar(im, cx, "zero", dtype, 0.0)?;
            one_value(im, cx, Op::Where, &[keep, xv, zero])?
        }
        "GlobalMaxPool" => {
            let rank = im.ty(x)?.shape.len();
            if rank < 3 {
                return Err(cx.bad(format!("invalid ONNX: GlobalMaxPool needs [N, C, spatial...], got {}", im.ty(x)?)));
            }
            one_value(im, cx, Op::Reduce { op: ReduceOp::Max, axes: (2..rank).collect(), keepdims: true }, &[xv])?
        }
        "Celu" => {
            let alpha = cx.float("alpha", 1.0)?;
            let inv = scalar(im, cx, "1/alpha", dtype, 1.0 / alpha as f64)?;
            let a = scalar(im, cx, "alpha", dtype, alpha as f64)?;
            let s = one_value(im, cx, mul.clone(), &[xv, inv])?;
            let e = one_value(im, cx, Op::Unary(UnaryOp::Elu(1.0)), &[s])?;
            one_value(im, cx, mul, &[e, a])?
        }
        _ => {
            let (pos, neg) = (cx.int("detect_positive", 1)? != 0, cx.int("detect_negative", 1)? != 0);
            let eq = Op::Compare(CompareOp::Equal);
            let p = scalar(im, cx, "+inf", dtype, f64::INFINITY)?;
            let n = scalar(im, cx, "-inf", dtype, f64::NEG_INFINITY)?;
            let is_p = one_value(im, cx, eq.clone(), &[xv, p])?;
            let is_n = one_value(im, cx, eq, &[xv, n])?;
            match (pos, neg) {
                (true, true) => one_value(im, cx, Op::Logic(LogicOp::Or), &[is_p, is_n])?,
                (true, false) => is_p,
                (false, true) => is_n,
                (false, false) => {
                    let t = TensorType::new(DType::Bool, im.ty(x)?.shape);
                    made(cx, &t)?;
                    return Ok(konst(Tensor::full(&t, 0.0)));
                }
            }
        }
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}
