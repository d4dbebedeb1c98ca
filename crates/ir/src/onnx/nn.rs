//! ONNX's layers: convolutions, products, pooling, normalizations,
//! softmax, attention, resizing and the losses.

use super::nodes::*;
use super::{Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::ValueId;
use crate::op::{BinaryOp, CompareOp, Conv, LogicOp, Op, ReduceOp, UnaryOp};
use crate::tensor::{Tensor, TensorData};
use std::collections::HashMap;

/// The layers: each with its attributes, its arity at `opset` and its
/// lowering.
pub(super) fn spec(op_type: &str, opset: i64) -> Option<Spec> {
    let (attributes, arity, lower): (&'static [&'static str], Arity, Lower) = match op_type {
        "Conv" => (&["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"], (2, 3, 1), conv),
        "ConvTranspose" => (
            &["auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"],
            (2, 3, 1),
            conv_transpose,
        ),
        "MatMul" => (&[], (2, 2, 1), super::elementwise::simple),
        "Gemm" => (&["alpha", "beta", "transA", "transB", "broadcast"], (2, 3, 1), gemm),
        "Einsum" => (&["equation"], (1, ANY, 1), einsum),
        "MaxPool" => (WINDOW, (1, 1, 2), max_pool),
        "AveragePool" => (WINDOW, (1, 1, 1), average_pool),
        "GlobalAveragePool" => (&[], (1, 1, 1), super::elementwise::simple),
        "GlobalMaxPool" => (&[], (1, 1, 1), super::elementwise::small_decompositions),
        "BatchNormalization" => (&["epsilon", "momentum", "spatial", "is_test", "training_mode"], (5, 5, 5), batch_norm),
        "InstanceNormalization" => (&["epsilon"], (3, 3, 1), built),
        "GroupNormalization" => (&["epsilon", "num_groups", "stash_type"], (3, 3, 1), built),
        "LayerNormalization" => (&["axis", "epsilon", "stash_type"], (2, 3, 3), layer_norm),
        "RMSNormalization" => (&["axis", "epsilon", "stash_type"], (2, 2, 1), rms_norm),
        "LRN" => (&["alpha", "beta", "bias", "size"], (1, 1, 1), lrn),
        "Softmax" | "LogSoftmax" => (&["axis"], (1, 1, 1), softmax),
        "Attention" => (
            &[
                "is_causal",
                "kv_num_heads",
                "q_num_heads",
                "qk_matmul_output_mode",
                "scale",
                "softcap",
                "softmax_precision",
                "left_window_size",
                "right_window_size",
            ],
            if opset < 24 { (3, 6, 4) } else { (3, 7, 4) },
            attention,
        ),
        "RotaryEmbedding" => (&["interleaved", "num_heads", "rotary_embedding_dim"], (3, 4, 1), rotary_embedding),
        "Resize" => (
            &[
                "antialias",
                "axes",
                "coordinate_transformation_mode",
                "cubic_coeff_a",
                "exclude_outside",
                "extrapolation_value",
                "keep_aspect_ratio_policy",
                "mode",
                "nearest_mode",
            ],
            (1, 4, 1),
            resize,
        ),
        "NegativeLogLikelihoodLoss" => (&["ignore_index", "reduction"], (2, 3, 1), loss),
        "SoftmaxCrossEntropyLoss" => (&["ignore_index", "reduction"], (2, 3, 2), loss),
        _ => return None,
    };
    Some(Spec { attributes, arity, lower })
}

/// The attributes of a sliding window (pooling).
const WINDOW: &[&str] = &["auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "storage_order", "strides"];

/// `Conv`.
pub(super) fn conv(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, w) = (cx.need(0)?, cx.need(1)?);
    let (xt, wt) = (im.ty(x)?, im.ty(w)?);
    if wt.shape.len() < 3 || xt.shape.len() != wt.shape.len() {
        return Err(cx.bad(format!("input {xt} and weight {wt} do not fit a convolution")));
    }
    let kernel = match cx.ints("kernel_shape")? {
        Some(k) => cx.usizes(k, "kernel_shape")?,
        None => wt.shape[2..].to_vec(),
    };
    if kernel != wt.shape[2..] {
        return Err(cx.bad(format!("kernel_shape {kernel:?} does not match weight {wt}")));
    }
    let n = kernel.len();
    let strides = spatial_attr(cx, "strides", n)?;
    let dilations = spatial_attr(cx, "dilations", n)?;
    let pads = window(cx, &xt.shape[2..], &kernel, &strides, &dilations)?;
    let group = usize::try_from(cx.int("group", 1)?).map_err(|_| cx.bad("negative group"))?;
    let mut ins = vec![x, w];
    ins.extend(cx.input(2));
    emit(im, cx, Op::Conv(Conv { strides, pads, dilations, group }), &ins)
}

/// `Gemm`.
pub(super) fn gemm(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let mut ins = vec![cx.need(0)?, cx.need(1)?];
    ins.extend(cx.input(2));
    let op = Op::Gemm {
        trans_a: cx.int("transA", 0)? != 0,
        trans_b: cx.int("transB", 0)? != 0,
        alpha: cx.float("alpha", 1.0)?,
        beta: cx.float("beta", 1.0)?,
    };
    emit(im, cx, op, &ins)
}

/// `MaxPool`.
pub(super) fn max_pool(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    if cx.extra_outputs_used(im, 1) {
        return Err(cx.unsupported("the Indices output of MaxPool"));
    }
    if cx.int("storage_order", 0)? != 0 {
        return Err(cx.unsupported("storage_order 1"));
    }
    let p = pool_attrs(im, cx)?;
    emit(im, cx, Op::MaxPool(p), &[cx.need(0)?])
}

/// `AveragePool`.
pub(super) fn average_pool(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let p = pool_attrs(im, cx)?;
    let cip = cx.int("count_include_pad", 0)? != 0;
    emit(im, cx, Op::AveragePool { pool: p, count_include_pad: cip }, &[cx.need(0)?])
}

/// `BatchNormalization`.
pub(super) fn batch_norm(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    if cx.extra_outputs_used(im, 1) {
        return Err(cx.unsupported("training-mode outputs (running mean/var)"));
    }
    if cx.int("spatial", 1)? != 1 || cx.int("training_mode", 0)? != 0 {
        return Err(cx.unsupported("non-spatial or training-mode batch normalization"));
    }
    let ins = (0..5).map(|i| cx.need(i)).collect::<Result<Vec<_>, _>>()?;
    emit(im, cx, Op::BatchNorm { epsilon: cx.float("epsilon", 1e-5)? }, &ins)
}

/// `LayerNormalization`.
pub(super) fn layer_norm(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let rank = im.ty(x)?.shape.len();
    let ax = axis(cx, cx.int("axis", -1)?, rank)?;
    let mut ins = vec![x, cx.need(1)?];
    ins.extend(cx.input(2));
    let epsilon = cx.float("epsilon", 1e-5)?;
    let mut out = emit(im, cx, Op::LayerNorm { axis: ax, epsilon }, &ins)?;
    if cx.extra_outputs_used(im, 1) {
        out.extend(layer_norm_stats(im, cx, x, ax, epsilon)?);
    }
    Ok(out)
}

/// `LRN`.
pub(super) fn lrn(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let size = usize::try_from(cx.int("size", 0)?).map_err(|_| cx.bad("negative size"))?;
    let op = Op::Lrn(crate::Lrn { size, alpha: cx.float("alpha", 1e-4)?, beta: cx.float("beta", 0.75)?, bias: cx.float("bias", 1.0)? });
    emit(im, cx, op, &[cx.need(0)?])
}

/// `Softmax` and `LogSoftmax` (before opset 13 on the input coerced to 2-D).
pub(super) fn softmax(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let x = cx.need(0)?;
    let shape = im.ty(x)?.shape;
    let default = if cx.opset >= 13 { -1 } else { 1 };
    if shape.is_empty() {
        return Err(cx.bad(format!("invalid ONNX: {op_type} needs an input of rank at least 1, got a scalar")));
    }
    let ax = axis(cx, cx.int("axis", default)?, shape.len())?;
    let make = |axis| {
        if op_type == "Softmax" {
            Op::Softmax { axis }
        } else {
            Op::LogSoftmax { axis }
        }
    };
    if cx.opset >= 13 || shape[ax + 1..].iter().all(|&d| d == 1) {
        return emit(im, cx, make(ax), &[x]);
    }
    // Before opset 13 the input is coerced to 2-D at `axis`.
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax..].iter().product();
    let flat = emit(im, cx, Op::Reshape { shape: vec![outer, inner] }, &[x])?[0].value.expect("a value");
    let sm = emit_values(im, cx, make(1), &[flat])?[0].value.expect("a value");
    emit_values(im, cx, Op::Reshape { shape }, &[sm])
}

/// ConvTranspose: the adjoint of the convolution with the same attributes
/// whose input has the output's shape (`Op::ConvGradData`), sized and
/// padded as the ONNX reference does (`output_shape`, `output_padding`,
/// `auto_pad`), then the bias.
pub(super) fn conv_transpose(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, w) = (cx.need(0)?, cx.need(1)?);
    let (xt, wt) = (im.ty(x)?, im.ty(w)?);
    if wt.shape.len() < 3 || xt.shape.len() != wt.shape.len() || !xt.dtype.is_float() {
        return Err(cx.bad(format!("input {xt} and weight {wt} do not fit a transposed convolution")));
    }
    let n = wt.shape.len() - 2;
    let kernel = wt.shape[2..].to_vec();
    if let Some(k) = cx.ints("kernel_shape")? {
        if cx.usizes(k.clone(), "kernel_shape")? != kernel {
            return Err(cx.bad(format!("kernel_shape {k:?} does not match weight {wt}")));
        }
    }
    let strides = spatial_attr(cx, "strides", n)?;
    let dilations = spatial_attr(cx, "dilations", n)?;
    let group = usize::try_from(cx.int("group", 1)?).ok().filter(|&g| g > 0).ok_or_else(|| cx.bad("group must be positive"))?;
    if xt.shape[1] != wt.shape[0] || xt.shape[1] == 0 || xt.shape[1] % group != 0 {
        return Err(cx.bad(format!("input {xt} has not the weight {wt}'s {} input channels in {group} groups", wt.shape[0])));
    }
    let list = |k: &str| -> Result<Option<Vec<i64>>, IrError> { cx.ints(k) };
    let output_padding = list("output_padding")?.unwrap_or_else(|| vec![0; n]);
    // In i128: no attribute can overflow it.
    let spatial_in: Vec<i128> = xt.shape[2..].iter().map(|&d| d as i128).collect();
    let natural = |i: usize| {
        strides[i] as i128 * (spatial_in[i] - 1)
            + output_padding.get(i).copied().unwrap_or(0) as i128
            + (kernel[i] as i128 - 1) * dilations[i] as i128
            + 1
    };
    let auto = cx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let mut output_shape = list("output_shape")?.map(|v| if v.len() == n + 2 { v[2..].to_vec() } else { v });
    if output_shape.as_ref().is_some_and(|v| v.len() != n) || output_padding.len() != n {
        return Err(cx.bad(format!("invalid ONNX: output_shape and output_padding need {n} values")));
    }
    let pads: Vec<i128> = match (list("pads")?, auto.as_str()) {
        (None, "SAME_UPPER" | "SAME_LOWER") => {
            let out = output_shape
                .get_or_insert_with(|| (0..n).map(|i| (spatial_in[i] * strides[i] as i128).min(i64::MAX as i128) as i64).collect())
                .clone();
            let total: Vec<i128> = (0..n).map(|i| natural(i) - out[i] as i128).collect();
            let (small, big): (Vec<i128>, Vec<i128>) = total.iter().map(|t| (t / 2, t - t / 2)).unzip();
            if auto == "SAME_UPPER" {
                [small, big].concat()
            } else {
                [big, small].concat()
            }
        }
        (None, "NOTSET" | "VALID") => vec![0; 2 * n],
        (Some(p), "NOTSET") if p.len() == 2 * n => p.into_iter().map(i128::from).collect(),
        (Some(p), _) => return Err(cx.bad(format!("invalid ONNX: pads {p:?} with auto_pad {auto}"))),
        (None, other) => return Err(cx.unsupported(format!("auto_pad={other}"))),
    };
    let out: Vec<i128> = match output_shape {
        Some(o) => o.into_iter().map(i128::from).collect(),
        None => (0..n).map(|i| natural(i) - pads[i] - pads[i + n]).collect(),
    };
    if pads.iter().any(|&p| p < 0) || out.iter().any(|&o| o <= 0) {
        return Err(cx.unsupported(format!("pads {pads:?} and output size {out:?} (negative padding)")));
    }
    let huge = |v: i128| v > 1 << 40;
    if pads.iter().copied().any(huge) || out.iter().copied().any(huge) {
        return Err(cx.too_large(format!("pads {pads:?} and output size {out:?}")));
    }
    let channels = wt.shape[1].checked_mul(group).ok_or_else(|| cx.too_large(format!("{} x {group} output channels", wt.shape[1])))?;
    let mut shape = vec![xt.shape[0], channels];
    shape.extend(out.iter().map(|&o| o as usize));
    let conv = Conv { strides, pads: pads.iter().map(|&p| p as usize).collect(), dilations, group };
    // The forward convolution of the output's shape must give the input's.
    // (Its weight [C_in, C_out / group, k...] is the transposed one's.)
    let fwd = crate::infer::infer(&Op::Conv(conv.clone()), &[&TensorType::new(xt.dtype, shape.clone()), &wt]);
    if fwd.ok().map(|t| t[0].shape.clone()) != Some(xt.shape.clone()) {
        return Err(cx.unsupported(format!("an output of {out:?} that the convolution it transposes does not map back onto {xt}")));
    }
    let xv = im.value(x)?;
    let wv = im.value(w)?;
    let y = if n == 1 {
        // 1-D as 2-D with a height of 1 (the kernels are 2-D).
        let (mut xs, mut ws, mut ys) = (xt.shape.clone(), wt.shape.clone(), shape.clone());
        xs.insert(2, 1);
        ws.insert(2, 1);
        ys.insert(2, 1);
        let conv2 = Conv {
            strides: vec![1, conv.strides[0]],
            pads: vec![0, conv.pads[0], 0, conv.pads[1]],
            dilations: vec![1, conv.dilations[0]],
            group,
        };
        let x2 = one_value(im, cx, Op::Reshape { shape: xs }, &[xv])?;
        let w2 = one_value(im, cx, Op::Reshape { shape: ws }, &[wv])?;
        let y2 = one_value(im, cx, Op::ConvGradData { conv: conv2, shape: ys }, &[x2, w2])?;
        one_value(im, cx, Op::Reshape { shape: shape.clone() }, &[y2])?
    } else {
        one_value(im, cx, Op::ConvGradData { conv, shape: shape.clone() }, &[xv, wv])?
    };
    let y = match cx.input(2) {
        Some(bias) => {
            let bt = im.ty(bias)?;
            if bt.shape != [shape[1]] {
                return Err(cx.bad(format!("invalid ONNX: the bias must be [{}], got {bt}", shape[1])));
            }
            let mut bshape = vec![1; shape.len()];
            bshape[1] = shape[1];
            let bv = im.value(bias)?;
            let b = one_value(im, cx, Op::Reshape { shape: bshape }, &[bv])?;
            one_value(im, cx, Op::Binary(BinaryOp::Add), &[y, b])?
        }
        None => y,
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// ONNX Attention (opsets 23 to 25) as the reference computes it: 3-D
/// inputs split into heads, the KV cache appended (`present_key`,
/// `present_value`), grouped KV heads repeated, Q and K each scaled by
/// sqrt(scale), softcap, an additive bias (the mask, bool or float and
/// padded to the keys; causal and sliding-window limits aligned to the
/// bottom right; `nonpad_kv_seqlen`'s padding), softmax (in
/// `softmax_precision`) with rows that attend nothing zeroed, and the
/// product with V. The static part of the bias is a constant.
pub(super) fn attention(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (q, k, v) = (cx.need(0)?, cx.need(1)?, cx.need(2)?);
    let (qt, kt, vt) = (im.ty(q)?, im.ty(k)?, im.ty(v)?);
    let dt = qt.dtype;
    let rank = qt.shape.len();
    if !dt.is_float() || kt.dtype != dt || vt.dtype != dt {
        return Err(cx.bad(format!("invalid ONNX: Q, K and V must share a float type, got {qt}, {kt} and {vt}")));
    }
    if !(rank == 3 || rank == 4) || kt.shape.len() != rank || vt.shape.len() != rank {
        return Err(cx.bad(format!("invalid ONNX: Q, K and V must all be 3-D or all 4-D, got {qt}, {kt} and {vt}")));
    }
    let heads = |name: &str| -> Result<Option<usize>, IrError> {
        match cx.attrs.get(name).map(|a| a.i()) {
            None => Ok(None),
            Some(h) if h > 0 => Ok(Some(h as usize)),
            Some(h) => Err(cx.bad(format!("invalid ONNX: {name}={h}"))),
        }
    };
    let (hq, hkv) = (heads("q_num_heads")?, heads("kv_num_heads")?);
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let b = qt.shape[0];
    // [B, H, S, D] views.
    let to_4d = |im: &mut Importer, name: &str, t: &TensorType, h: Option<usize>| -> Result<(ValueId, [usize; 4]), IrError> {
        let x = im.value(name)?;
        if rank == 4 {
            return Ok((x, [t.shape[0], t.shape[1], t.shape[2], t.shape[3]]));
        }
        let h = h.ok_or_else(|| cx.bad("invalid ONNX: 3-D inputs need q_num_heads and kv_num_heads"))?;
        let (s, hidden) = (t.shape[1], t.shape[2]);
        if hidden % h != 0 || t.shape[0] != b {
            return Err(cx.bad(format!("invalid ONNX: {t} does not split into {h} heads")));
        }
        let x = one(im, Op::Reshape { shape: vec![b, s, h, hidden / h] }, &[x])?;
        Ok((one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[x])?, [b, h, s, hidden / h]))
    };
    let (qv, qs) = to_4d(im, q, &qt, hq)?;
    let (mut kv, mut ks) = to_4d(im, k, &kt, hkv)?;
    let (mut vv, mut vs) = to_4d(im, v, &vt, hkv)?;
    if qs[1] == 0 || ks[1] == 0 || ks[0] != b || vs[0] != b || ks[1] != vs[1] || ks[2] != vs[2] || ks[3] != qs[3] {
        return Err(cx.bad(format!("invalid ONNX: Q {qt}, K {kt} and V {vt} do not fit")));
    }
    // The KV cache.
    let past = match (cx.input(4), cx.input(5)) {
        (Some(pk), Some(pv)) => Some((pk, pv)),
        (None, None) => None,
        _ => return Err(cx.bad("invalid ONNX: past_key and past_value come together")),
    };
    let past_len = match past {
        Some((pk, pv)) => {
            let (pkt, pvt) = (im.ty(pk)?, im.ty(pv)?);
            if pkt.shape.len() != 4
                || pkt.shape[..2] != ks[..2]
                || pkt.shape[3] != ks[3]
                || pvt.shape != [vs[0], vs[1], pkt.shape[2], vs[3]]
            {
                return Err(cx.bad(format!("invalid ONNX: past_key {pkt} and past_value {pvt} do not fit K and V")));
            }
            let (pkv, pvv) = (im.value(pk)?, im.value(pv)?);
            kv = one(im, Op::Concat { axis: 2 }, &[pkv, kv])?;
            vv = one(im, Op::Concat { axis: 2 }, &[pvv, vv])?;
            ks[2] += pkt.shape[2];
            vs[2] += pkt.shape[2];
            pkt.shape[2]
        }
        None => 0,
    };
    let (present_k, present_v) = (kv, vv);
    let (sq, skv) = (qs[2], ks[2]);
    // Grouped KV heads: each repeated for its group of query heads.
    if qs[1] != ks[1] {
        if qs[1] % ks[1] != 0 {
            return Err(cx.bad(format!("invalid ONNX: {} query heads do not group over {} KV heads", qs[1], ks[1])));
        }
        let g = qs[1] / ks[1];
        for (val, s) in [(&mut kv, ks), (&mut vv, vs)] {
            let x = one(im, Op::Reshape { shape: vec![b, s[1], 1, s[2], s[3]] }, &[*val])?;
            let x = one(im, Op::Expand { shape: vec![b, s[1], g, s[2], s[3]] }, &[x])?;
            *val = one(im, Op::Reshape { shape: vec![b, s[1] * g, s[2], s[3]] }, &[x])?;
        }
    }
    // Scores: (Q sqrt(scale)) (K sqrt(scale))^T.
    let scale = match cx.attrs.get("scale") {
        Some(a) => a.f() as f64,
        None => 1.0 / (qs[3] as f64).sqrt(),
    };
    let root = scalar(im, cx, "sqrt(scale)", dt, scale.sqrt())?;
    let mul = Op::Binary(BinaryOp::Mul);
    let qv = one(im, mul.clone(), &[qv, root])?;
    let kv = one(im, mul.clone(), &[kv, root])?;
    let kt_ = one(im, Op::Transpose { perm: vec![0, 1, 3, 2] }, &[kv])?;
    let mut qk = one(im, Op::MatMul, &[qv, kt_])?;
    let softcap = cx.float("softcap", 0.0)?;
    if softcap > 0.0 {
        let inv = scalar(im, cx, "1/softcap", dt, 1.0 / softcap as f64)?;
        let cap = scalar(im, cx, "softcap", dt, softcap as f64)?;
        let x = one(im, mul.clone(), &[qk, inv])?;
        let x = one(im, Op::Unary(UnaryOp::Tanh), &[x])?;
        qk = one(im, mul.clone(), &[x, cap])?;
    }
    // The additive bias: the static limits, a constant [Sq, Skv] ...
    let causal = cx.int("is_causal", 0)? != 0;
    let (left, right) = (cx.int("left_window_size", -1)?, cx.int("right_window_size", -1)?);
    if left < -1 || right < -1 {
        return Err(cx.bad(format!("invalid ONNX: window sizes {left} and {right} (-1 or more)")));
    }
    // Beyond the keys and queries a window limits nothing.
    let reach = (qs[2] + ks[2]) as i64;
    let (left, right) = (left.min(reach), right.min(reach));
    let nonpad = cx.input(6);
    if nonpad.is_some() && past.is_some() {
        return Err(cx.bad("invalid ONNX: nonpad_kv_seqlen cannot be combined with past_key and past_value"));
    }
    made(cx, &TensorType::new(dt, vec![sq, skv]))?;
    let (sqi, skvi) = (sq as i64, skv as i64);
    let allowed = |i: i64, j: i64, off: i64| {
        let diff = i + off - j;
        (!causal || j <= i + off) && (left < 0 || diff <= left) && (right < 0 || -diff <= right)
    };
    let neg_inf = f32::NEG_INFINITY;
    let mut bias: Option<ValueId> = None;
    let add = |im: &mut Importer, bias: Option<ValueId>, x: ValueId| -> Result<ValueId, IrError> {
        match bias {
            None => Ok(x),
            Some(b0) => one(im, Op::Binary(BinaryOp::Add), &[b0, x]),
        }
    };
    if nonpad.is_none() && (causal || left >= 0 || right >= 0) {
        let m: Vec<f32> = (0..sqi)
            .flat_map(|i| (0..skvi).map(move |j| (i, j)))
            .map(|(i, j)| if allowed(i, j, past_len as i64) { 0.0 } else { neg_inf })
            .collect();
        let c = constant(im, cx, "limits", Tensor::from_f32(vec![sq, skv], m).cast(dt))?;
        bias = Some(c);
    }
    let zero = scalar(im, cx, "zero", dt, 0.0)?;
    let minus_inf = scalar(im, cx, "-inf", dt, f64::NEG_INFINITY)?;
    // ... the mask, padded to the keys ...
    if let Some(mask) = cx.input(3) {
        let mt = im.ty(mask)?;
        let last = *mt.shape.last().ok_or_else(|| cx.bad("invalid ONNX: attn_mask is a scalar"))?;
        if last > skv || (mt.dtype != DType::Bool && mt.dtype != dt) {
            return Err(cx.bad(format!("invalid ONNX: attn_mask {mt} does not fit {skv} keys of {dt}")));
        }
        let mut mv = im.value(mask)?;
        if mt.dtype == DType::Bool {
            mv = one(im, Op::Where, &[mv, zero, minus_inf])?;
        }
        if last < skv {
            let mut pad_shape = mt.shape.clone();
            *pad_shape.last_mut().expect("not a scalar") = skv - last;
            made(cx, &TensorType::new(dt, pad_shape.clone()))?;
            let pad = constant(im, cx, "mask padding", Tensor::full(&TensorType::new(dt, pad_shape), f64::NEG_INFINITY))?;
            mv = one(im, Op::Concat { axis: mt.shape.len() - 1 }, &[mv, pad])?;
        }
        bias = Some(add(im, bias, mv)?);
    }
    // ... and the per-batch limits of nonpad_kv_seqlen: key j of batch b
    // is kept when j < n[b], and the causal and window limits hold at the
    // offset n[b] - Sq; each a comparison of n[b] with a constant [Sq, Skv].
    if let Some(n) = nonpad {
        let nt = im.ty(n)?;
        if nt.shape != [b] || !matches!(nt.dtype, DType::I64 | DType::I32) {
            return Err(cx.bad(format!("invalid ONNX: nonpad_kv_seqlen must be int64 [{b}], got {nt}")));
        }
        let nv = im.value(n)?;
        let n3 = one(im, Op::Reshape { shape: vec![b, 1, 1] }, &[nv])?;
        let grid = |f: &dyn Fn(i64, i64) -> i64| -> Tensor {
            let v: Vec<i64> = (0..sqi).flat_map(|i| (0..skvi).map(move |j| (i, j))).map(|(i, j)| f(i, j)).collect();
            Tensor::from_i64(vec![sq, skv], v).cast(nt.dtype)
        };
        // (the comparison, the constant it compares n with)
        let mut conds: Vec<(CompareOp, Tensor)> = vec![(CompareOp::Greater, grid(&|_, j| j))];
        if causal {
            conds.push((CompareOp::GreaterOrEqual, grid(&|i, j| j - i + sqi)));
        }
        if left >= 0 {
            conds.push((CompareOp::LessOrEqual, grid(&|i, j| left - i + sqi + j)));
        }
        if right >= 0 {
            conds.push((CompareOp::GreaterOrEqual, grid(&|i, j| j - i + sqi - right)));
        }
        let mut keep: Option<ValueId> = None;
        for (i, (op, t)) in conds.into_iter().enumerate() {
            let c = constant(im, cx, &format!("nonpad limit {i}"), t)?;
            let x = one(im, Op::Compare(op), &[n3, c])?;
            keep = Some(match keep {
                None => x,
                Some(k0) => one(im, Op::Logic(LogicOp::And), &[k0, x])?,
            });
        }
        let keep = keep.expect("at least the padding");
        let pb = one(im, Op::Where, &[keep, zero, minus_inf])?;
        let pb = one(im, Op::Reshape { shape: vec![b, 1, sq, skv] }, &[pb])?;
        bias = Some(add(im, bias, pb)?);
    }
    let mode = cx.int("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(cx.bad(format!("invalid ONNX: qk_matmul_output_mode={mode} (0 to 3)")));
    }
    let with_bias = match bias {
        Some(bv) => one(im, Op::Binary(BinaryOp::Add), &[qk, bv])?,
        None => qk,
    };
    let mut logits = with_bias;
    let sp = match cx.attrs.get("softmax_precision").map(|a| a.i()) {
        None => dt,
        Some(code) => super::tensor::dtype_of(code as i32)
            .ok()
            .filter(|d| d.is_float())
            .ok_or_else(|| cx.unsupported(format!("softmax_precision={code} (smelt computes softmax in float, float16 or bfloat16)")))?,
    };
    if sp != dt {
        logits = one(im, Op::Cast { to: sp }, &[logits])?;
    }
    let mut p = one(im, Op::Softmax { axis: 3 }, &[logits])?;
    // A row whose bias is -inf everywhere attends nothing: zeros.
    if let Some(bv) = bias {
        let m = one(im, Op::Reduce { op: ReduceOp::Max, axes: vec![im.g.ty(bv).shape.len() - 1], keepdims: true }, &[bv])?;
        let none = one(im, Op::Compare(CompareOp::Equal), &[m, minus_inf])?;
        let zero_sp = scalar(im, cx, "zero (softmax)", sp, 0.0)?;
        p = one(im, Op::Where, &[none, zero_sp, p])?;
    }
    if sp != dt {
        p = one(im, Op::Cast { to: dt }, &[p])?;
    }
    let mut y = one(im, Op::MatMul, &[p, vv])?;
    if rank == 3 {
        let h = qs[1];
        y = one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[y])?;
        y = one(im, Op::Reshape { shape: vec![b, sq, h * vs[3]] }, &[y])?;
    }
    // Modes 0 and 1 give the scores after softcap, as the reference does
    // (the spec's mode 0 is the raw product; they differ only with softcap).
    let qk_out = match mode {
        0 | 1 => qk,
        2 => with_bias,
        _ => p,
    };
    let e = |v: ValueId| Entry { konst: None, value: Some(v) };
    Ok(vec![e(y), e(present_k), e(present_v), e(qk_out)])
}

/// Resize (opset 11 on), separably as the ONNX reference computes it: for
/// each resized axis a constant interpolation matrix [in, out] (nearest,
/// linear or cubic taps, antialiased when asked, `exclude_outside`, every
/// coordinate transformation; rows outside the crop of
/// `tf_crop_and_resize` hold the extrapolation value), applied by a MatMul
/// with the axis moved last.
pub(super) fn resize(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    if cx.opset < 11 {
        return Err(cx.unsupported("Resize before opset 11 (no roi input)"));
    }
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.unsupported(format!("Resize of {} (smelt resizes float tensors)", ty.dtype)));
    }
    let r = ty.shape.len();
    let floats = |i: usize, what: &str| -> Result<Option<Vec<f64>>, IrError> {
        match cx.input(i) {
            None => Ok(None),
            Some(_) => {
                let t = const_input(im, cx, i, what)?;
                Ok((t.ty().numel() > 0).then(|| t.to_f32_vec().into_iter().map(|v| v as f64).collect()))
            }
        }
    };
    let roi_in = floats(1, "roi")?;
    let scales_in = floats(2, "scales")?;
    let sizes_in = match cx.input(3) {
        None => None,
        Some(_) => {
            let t = const_input(im, cx, 3, "sizes")?;
            (t.ty().numel() > 0).then(|| t.to_i64_vec())
        }
    };
    let axes_attr = match cx.ints("axes")? {
        Some(a) => a.iter().map(|&a| axis(cx, a, r)).collect::<Result<Vec<_>, _>>()?,
        None => (0..r).collect(),
    };
    let n_ax = axes_attr.len();
    let s = |k: &str, d: &str| -> Result<String, IrError> { Ok(cx.string(k)?.unwrap_or_else(|| d.into())) };
    let mode = s("mode", "nearest")?;
    let ctm = s("coordinate_transformation_mode", "half_pixel")?;
    let nearest_mode = s("nearest_mode", "round_prefer_floor")?;
    let policy = s("keep_aspect_ratio_policy", "stretch")?;
    let antialias = cx.int("antialias", 0)? != 0;
    let exclude_outside = cx.int("exclude_outside", 0)? != 0;
    let a_cubic = cx.float("cubic_coeff_a", -0.75)? as f64;
    let extrapolation = cx.float("extrapolation_value", 0.0)? as f64;
    if !matches!(mode.as_str(), "nearest" | "linear" | "cubic") {
        return Err(cx.bad(format!("invalid ONNX: mode {mode:?}")));
    }
    if mode == "nearest" && antialias {
        return Err(cx.bad("invalid ONNX: antialias with mode nearest"));
    }
    if !matches!(nearest_mode.as_str(), "round_prefer_floor" | "round_prefer_ceil" | "floor" | "ceil") {
        return Err(cx.bad(format!("invalid ONNX: nearest_mode {nearest_mode:?}")));
    }
    if !matches!(
        ctm.as_str(),
        "half_pixel" | "half_pixel_symmetric" | "pytorch_half_pixel" | "align_corners" | "asymmetric" | "tf_crop_and_resize"
    ) {
        return Err(cx.unsupported(format!("coordinate_transformation_mode={ctm:?}")));
    }
    // Scales and sizes over every axis.
    let dims: Vec<f64> = ty.shape.iter().map(|&d| d as f64).collect();
    let mut scale = vec![1.0; r];
    let mut out: Vec<usize> = ty.shape.clone();
    match (scales_in, sizes_in) {
        (Some(sc), None) => {
            if sc.len() != n_ax || sc.iter().any(|&v| v <= 0.0 || !v.is_finite()) {
                return Err(cx.bad(format!("invalid ONNX: scales {sc:?} for {n_ax} axes")));
            }
            for (i, &a) in axes_attr.iter().enumerate() {
                scale[a] = sc[i];
                out[a] = (sc[i] * dims[a]) as usize;
            }
        }
        (None, Some(sz)) => {
            if sz.len() != n_ax || sz.iter().any(|&v| v <= 0) {
                return Err(cx.bad(format!("invalid ONNX: sizes {sz:?} for {n_ax} axes")));
            }
            for (i, &a) in axes_attr.iter().enumerate() {
                scale[a] = sz[i] as f64 / dims[a];
                out[a] = sz[i] as usize;
            }
            if policy != "stretch" {
                let pick = axes_attr.iter().map(|&a| scale[a]);
                let one = match policy.as_str() {
                    "not_larger" => pick.fold(f64::INFINITY, f64::min),
                    "not_smaller" => pick.fold(f64::NEG_INFINITY, f64::max),
                    p => return Err(cx.bad(format!("invalid ONNX: keep_aspect_ratio_policy {p:?}"))),
                };
                for &a in &axes_attr {
                    scale[a] = one;
                    out[a] = (one * dims[a] + 0.5) as usize;
                }
            }
        }
        _ => return Err(cx.bad("invalid ONNX: Resize needs exactly one of scales and sizes")),
    }
    let mut roi = vec![0.0; 2 * r];
    roi[r..].iter_mut().for_each(|v| *v = 1.0);
    if let Some(given) = roi_in.filter(|_| ctm == "tf_crop_and_resize") {
        if given.len() != 2 * n_ax {
            return Err(cx.bad(format!("invalid ONNX: roi {given:?} for {n_ax} axes")));
        }
        for (i, &a) in axes_attr.iter().enumerate() {
            roi[a] = given[i];
            roi[r + a] = given[n_ax + i];
        }
    }
    let taps = |ratio: f64, sc: f64| -> Vec<f64> {
        match mode.as_str() {
            "nearest" => {
                let up = if ratio == ratio.trunc() {
                    true
                } else {
                    match nearest_mode.as_str() {
                        "round_prefer_floor" => ratio > 0.5,
                        "round_prefer_ceil" => ratio >= 0.5,
                        "floor" => false,
                        _ => true,
                    }
                };
                if up {
                    vec![0.0, 1.0]
                } else {
                    vec![1.0, 0.0]
                }
            }
            "linear" if !antialias => vec![1.0 - ratio, ratio],
            "linear" => {
                let sc = sc.min(1.0);
                let start = (-1.0 / sc).floor() as i64 + 1;
                let c: Vec<f64> = (start..start + 2 - 2 * start).map(|i| (1.0 - ((i as f64 - ratio) * sc).abs()).clamp(0.0, 1.0)).collect();
                let sum: f64 = c.iter().sum();
                c.into_iter().map(|v| v / sum).collect()
            }
            _ if !antialias => {
                let a = a_cubic;
                let (r1, q) = (ratio + 1.0, 1.0 - ratio);
                vec![
                    ((a * r1 - 5.0 * a) * r1 + 8.0 * a) * r1 - 4.0 * a,
                    ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            _ => {
                let (a, sc) = (a_cubic, sc.min(1.0));
                let coeff = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / sc).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start).map(|i| coeff(sc * (i as f64 - ratio))).collect();
                let sum: f64 = c.iter().sum();
                c.into_iter().map(|v| v / sum).collect()
            }
        }
    };
    let mut cur = im.value(x)?;
    let mut shape = ty.shape.clone();
    for &a in &axes_attr {
        let (inw, outw, sc) = (ty.shape[a], out[a], scale[a]);
        if (sc - 1.0).abs() < 1e-9 && outw == inw && roi[a].abs() < 1e-9 && (roi[a + r] - 1.0).abs() < 1e-9 {
            continue;
        }
        if outw == 0 || inw == 0 {
            return Err(cx.unsupported(format!("an empty resize ({inw} to {outw} along axis {a})")));
        }
        made(cx, &TensorType::new(DType::I64, vec![outw]))?;
        let (fin, fout) = (inw as f64, sc * inw as f64);
        // Per output position its taps (input position, weight), or none
        // outside tf_crop_and_resize's crop.
        let mut taps_of: Vec<Vec<(usize, f64)>> = vec![Vec::new(); outw];
        let mut outside = vec![false; outw];
        for o in 0..outw {
            let y = o as f64;
            let x_ori = match ctm.as_str() {
                "align_corners" if fout == 1.0 => 0.0,
                "align_corners" => y * (fin - 1.0) / (fout - 1.0),
                "asymmetric" => y / sc,
                "tf_crop_and_resize" => {
                    let (r0, r1) = (roi[a], roi[a + r]);
                    let x = if fout == 1.0 { (r1 - r0) * (fin - 1.0) / 2.0 } else { y * (r1 - r0) * (fin - 1.0) / (fout - 1.0) };
                    x + r0 * (fin - 1.0)
                }
                "pytorch_half_pixel" if fout == 1.0 => -0.5,
                "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / sc - 0.5,
                _ => {
                    let adjustment = outw as f64 / fout;
                    let center = fin / 2.0;
                    center * (1.0 - adjustment) + (y + 0.5) / sc - 0.5
                }
            };
            if ctm == "tf_crop_and_resize" && !(0.0..=fin - 1.0).contains(&x_ori) {
                outside[o] = true;
                continue;
            }
            let ratio = if x_ori == x_ori.floor() { 1.0 } else { x_ori - x_ori.floor() };
            let mut c = taps(ratio, sc);
            let n = c.len() as i64;
            let pad = (n + 1) / 2;
            let xp = x_ori + pad as f64;
            let p = xp.floor() as i64;
            let frac = xp - p as f64;
            let off = if n % 2 == 0 {
                if frac == 0.0 {
                    -(n / 2)
                } else {
                    -(n / 2) + 1
                }
            } else {
                let base = -((n - 1) / 2);
                if frac <= 0.5 {
                    base
                } else {
                    base + 1
                }
            };
            let start = p + off - pad;
            if exclude_outside {
                for (t, v) in c.iter_mut().enumerate() {
                    let i = start + t as i64;
                    if i < 0 || i >= inw as i64 {
                        *v = 0.0;
                    }
                }
                let sum: f64 = c.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                c.iter_mut().for_each(|v| *v /= sum);
            }
            if c.len() > 64 {
                return Err(cx.unsupported(format!("resizing {inw} to {outw} along axis {a}: {} taps (at most 64)", c.len())));
            }
            taps_of[o] = c.into_iter().enumerate().map(|(t, v)| ((start + t as i64).clamp(0, inw as i64 - 1) as usize, v)).collect();
        }
        // Each tap a Gather of the input along the axis, times its weights
        // (nearest: the one tap of weight 1, no product), summed.
        let mut wshape = vec![1; r];
        wshape[a] = outw;
        if mode == "nearest" {
            for c in taps_of.iter_mut() {
                if let Some(&best) = c.iter().max_by(|x, y| x.1.total_cmp(&y.1)) {
                    *c = vec![best];
                }
            }
        }
        let index = |im: &mut Importer, t: usize, tag: &str| {
            let idx: Vec<i64> = taps_of.iter().map(|c| c.get(t).map_or(0, |x| x.0 as i64)).collect();
            constant(im, cx, &format!("{tag} {a} {t}"), Tensor::from_i64(vec![outw], idx))
        };
        let src = cur;
        if mode == "nearest" {
            let idx = index(im, 0, "nearest")?;
            cur = one_value(im, cx, Op::Gather { axis: a }, &[src, idx])?;
        } else {
            let n = taps_of.iter().map(Vec::len).max().unwrap_or(0);
            let mut acc: Option<ValueId> = None;
            for t in 0..n {
                let idx = index(im, t, "tap")?;
                let w: Vec<f32> = taps_of.iter().map(|c| c.get(t).map_or(0.0, |x| x.1 as f32)).collect();
                let w = constant(im, cx, &format!("weights {a} {t}"), Tensor::from_f32(wshape.clone(), w).cast(ty.dtype))?;
                let g = one_value(im, cx, Op::Gather { axis: a }, &[src, idx])?;
                let term = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[g, w])?;
                acc = Some(match acc {
                    None => term,
                    Some(p) => one_value(im, cx, Op::Binary(BinaryOp::Add), &[p, term])?,
                });
            }
            cur = match acc {
                Some(v) => v,
                None => {
                    let idx = index(im, 0, "tap")?;
                    one_value(im, cx, Op::Gather { axis: a }, &[src, idx])?
                }
            };
        }
        if outside.iter().any(|&o| o) {
            let mask = constant(
                im,
                cx,
                &format!("outside {a}"),
                Tensor::new(wshape.clone(), TensorData::Bool(outside.clone())).expect("one per position"),
            )?;
            let e = scalar(im, cx, "extrapolation", ty.dtype, extrapolation)?;
            cur = one_value(im, cx, Op::Where, &[mask, e, cur])?;
        }
        shape[a] = outw;
    }
    if shape == ty.shape {
        return reshaping(im, cx, Op::Identity, x);
    }
    Ok(vec![Entry { konst: None, value: Some(cur) }])
}

/// RotaryEmbedding (opset 23) as the reference computes it: heads split
/// out ([B, S, H, D]), the first `rotary_embedding_dim` features rotated
/// pairwise (halves, or even and odd ones when `interleaved`) by the
/// cos and sin caches (gathered at `position_ids` when given), the rest
/// passed through.
pub(super) fn rotary_embedding(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, cos, sin) = (cx.need(0)?, cx.need(1)?, cx.need(2)?);
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.bad(format!("invalid ONNX: the input must be a float tensor, got {ty}")));
    }
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let mut v = im.value(x)?;
    let (b, s, h, d) = match ty.shape[..] {
        [b, h, s, d] => {
            v = one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[v])?;
            (b, s, h, d)
        }
        [b, s, hidden] => {
            let h = usize::try_from(cx.int("num_heads", 0)?)
                .ok()
                .filter(|&h| h > 0 && hidden % h == 0)
                .ok_or_else(|| cx.bad(format!("invalid ONNX: a 3-D input needs num_heads dividing its {hidden} features")))?;
            v = one(im, Op::Reshape { shape: vec![b, s, h, hidden / h] }, &[v])?;
            (b, s, h, hidden / h)
        }
        _ => return Err(cx.bad(format!("invalid ONNX: the input must be 3-D or 4-D, got {ty}"))),
    };
    let rd = match cx.int("rotary_embedding_dim", 0)? {
        0 => d,
        r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        r => return Err(cx.bad(format!("invalid ONNX: rotary_embedding_dim {r} for heads of {d}"))),
    };
    let half = rd / 2;
    let slice = |start: usize, end: usize, step: i64| Op::Slice {
        axes: vec![3],
        starts: vec![start as i64],
        ends: vec![end as i64],
        steps: vec![step],
    };
    let rot = if rd < d { one(im, slice(0, rd, 1), &[v])? } else { v };
    // The caches at each position: [B, S, 1, D/2].
    let mut caches = Vec::new();
    for c in [cos, sin] {
        let mut cv = im.value(c)?;
        let ct = im.ty(c)?;
        if let Some(p) = cx.input(3) {
            let pv = im.value(p)?;
            if ct.shape.len() != 2 || ct.shape[1] != half {
                return Err(cx.bad(format!("invalid ONNX: a cache must be [positions, {half}], got {ct}")));
            }
            cv = one(im, Op::Gather { axis: 0 }, &[cv, pv])?;
        } else if ct.shape != [b, s, half] {
            return Err(cx.bad(format!("invalid ONNX: without position_ids a cache must be [{b}, {s}, {half}], got {ct}")));
        }
        caches.push(one(im, Op::Reshape { shape: vec![b, s, 1, half] }, &[cv])?);
    }
    let (cos, sin) = (caches[0], caches[1]);
    let interleaved = cx.int("interleaved", 0)? != 0;
    let (x1, x2) = if interleaved {
        (one(im, slice(0, rd, 2), &[rot])?, one(im, slice(1, rd, 2), &[rot])?)
    } else {
        (one(im, slice(0, half, 1), &[rot])?, one(im, slice(half, rd, 1), &[rot])?)
    };
    let mul = |im: &mut Importer, a, c| one(im, Op::Binary(BinaryOp::Mul), &[a, c]);
    let (c1, s2, s1, c2) = (mul(im, cos, x1)?, mul(im, sin, x2)?, mul(im, sin, x1)?, mul(im, cos, x2)?);
    let real = one(im, Op::Binary(BinaryOp::Sub), &[c1, s2])?;
    let imag = one(im, Op::Binary(BinaryOp::Add), &[s1, c2])?;
    let rotated = if interleaved {
        let r = one(im, Op::Unsqueeze { axes: vec![4] }, &[real])?;
        let i = one(im, Op::Unsqueeze { axes: vec![4] }, &[imag])?;
        let pairs = one(im, Op::Concat { axis: 4 }, &[r, i])?;
        one(im, Op::Reshape { shape: vec![b, s, h, rd] }, &[pairs])?
    } else {
        one(im, Op::Concat { axis: 3 }, &[real, imag])?
    };
    let mut y = rotated;
    if rd < d {
        let rest = one(im, slice(rd, d, 1), &[v])?;
        y = one(im, Op::Concat { axis: 3 }, &[rotated, rest])?;
    }
    let y = if ty.shape.len() == 4 {
        one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[y])?
    } else {
        one(im, Op::Reshape { shape: ty.shape.clone() }, &[y])?
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// Einsum without repeated letters in one operand (diagonals): each
/// operand transposed to the order of all letters (the output's first,
/// then the summed ones) with size-1 dims for its missing letters, the
/// broadcast product, and a sum over the summed letters. `...` stands for
/// the same leading dims in every operand.
pub(super) fn einsum(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let eq: String = cx
        .string("equation")?
        .ok_or_else(|| cx.bad("invalid ONNX: Einsum needs an equation"))?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let names: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
    let tys = names.iter().map(|n| im.ty(n)).collect::<Result<Vec<_>, _>>()?;
    let dtype = tys[0].dtype;
    if !dtype.is_float() || tys.iter().any(|t| t.dtype != dtype) {
        return Err(cx.unsupported(format!(
            "Einsum of {} (smelt computes it for one float type)",
            tys.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != names.len() {
        return Err(cx.bad(format!("invalid ONNX: equation {eq:?} has {} operands, the node {}", terms.len(), names.len())));
    }
    // `...` becomes upper-case letters, as many as the widest operand needs.
    let ell = terms.iter().zip(&tys).map(|(t, ty)| if t.contains("...") { ty.shape.len() + 3 - t.len() } else { 0 }).max().unwrap_or(0);
    let ell_letters: String = (0..ell).map(|i| (b'A' + i as u8) as char).collect();
    let expand = |t: &str, rank: usize| -> Result<Vec<char>, IrError> {
        let t = if t.contains("...") {
            let own = rank + 3 - t.len();
            if own > ell || rank + 3 < t.len() {
                return Err(cx.bad(format!("invalid ONNX: {t:?} does not fit rank {rank}")));
            }
            t.replace("...", &ell_letters[ell - own..])
        } else {
            t.to_string()
        };
        let cs: Vec<char> = t.chars().collect();
        if cs.iter().any(|c| !c.is_ascii_alphabetic()) {
            return Err(cx.bad(format!("invalid ONNX: equation {eq:?}")));
        }
        Ok(cs)
    };
    let mut sizes: HashMap<char, usize> = HashMap::new();
    let mut ops: Vec<Vec<char>> = Vec::new();
    for (t, ty) in terms.iter().zip(&tys) {
        let cs = expand(t, ty.shape.len())?;
        if cs.len() != ty.shape.len() {
            return Err(cx.bad(format!("invalid ONNX: {t:?} does not fit {ty}")));
        }
        let mut seen = std::collections::HashSet::new();
        if cs.iter().any(|c| !seen.insert(*c)) {
            return Err(cx.unsupported(format!("Einsum with a repeated letter in {t:?} (a diagonal)")));
        }
        for (c, &d) in cs.iter().zip(&ty.shape) {
            match sizes.insert(*c, d) {
                Some(prev) if prev != d => return Err(cx.bad(format!("invalid ONNX: {c} is {prev} and {d} in {eq:?}"))),
                _ => {}
            }
        }
        ops.push(cs);
    }
    let out: Vec<char> = match rhs {
        Some(r) => {
            let r = if r.contains("...") { r.replace("...", &ell_letters) } else { r };
            let cs: Vec<char> = r.chars().collect();
            if let Some(c) = cs.iter().find(|c| !sizes.contains_key(c)) {
                return Err(cx.bad(format!("invalid ONNX: output letter {c} of {eq:?} is no operand's")));
            }
            cs
        }
        None => {
            // Implicit: the ellipsis, then the letters used once, sorted.
            let mut once: Vec<char> =
                sizes.keys().copied().filter(|c| c.is_ascii_lowercase() && ops.iter().flatten().filter(|x| *x == c).count() == 1).collect();
            once.sort();
            ell_letters.chars().chain(once).collect()
        }
    };
    let summed: Vec<char> = {
        let mut s: Vec<char> = sizes.keys().copied().filter(|c| !out.contains(c)).collect();
        s.sort();
        s
    };
    let all: Vec<char> = out.iter().chain(&summed).copied().collect();
    let full: Vec<usize> = all.iter().map(|c| sizes[c]).collect();
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let mut product: Option<ValueId> = None;
    for (name, cs) in names.iter().zip(&ops) {
        let mut v = im.value(name)?;
        // Its letters in the order of `all`, then size-1 dims for the others.
        let mut order: Vec<usize> = (0..cs.len()).collect();
        order.sort_by_key(|&i| all.iter().position(|c| *c == cs[i]));
        if order.iter().enumerate().any(|(i, &o)| i != o) {
            v = one(im, Op::Transpose { perm: order }, &[v])?;
        }
        let shape: Vec<usize> = all.iter().map(|c| if cs.contains(c) { sizes[c] } else { 1 }).collect();
        v = one(im, Op::Reshape { shape }, &[v])?;
        product = Some(match product {
            None => v,
            Some(p) => one(im, Op::Binary(BinaryOp::Mul), &[p, v])?,
        });
    }
    let mut y = product.ok_or_else(|| cx.bad("invalid ONNX: Einsum with no operands"))?;
    if im.g.ty(y).shape != full {
        y = one(im, Op::Expand { shape: full.clone() }, &[y])?;
    }
    if !summed.is_empty() {
        y = one(im, Op::Reduce { op: ReduceOp::Sum, axes: (out.len()..all.len()).collect(), keepdims: false }, &[y])?;
    }
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// RMSNormalization: x / sqrt(mean(x^2) + epsilon) over the dims from
/// `axis` on, in f32, then times `scale`.
pub(super) fn rms_norm(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, scale) = (cx.need(0)?, cx.need(1)?);
    let ty = im.ty(x)?;
    let ax = axis(cx, cx.int("axis", -1)?, ty.shape.len())?;
    let xf = stashed(im, cx, x)?;
    let sq = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[xf, xf])?;
    let ms = one_value(im, cx, Op::Reduce { op: ReduceOp::Mean, axes: (ax..ty.shape.len()).collect(), keepdims: true }, &[sq])?;
    let eps = scalar(im, cx, "epsilon", DType::F32, cx.float("epsilon", 1e-5)? as f64)?;
    let v = one_value(im, cx, Op::Binary(BinaryOp::Add), &[ms, eps])?;
    let rms = one_value(im, cx, Op::Unary(UnaryOp::Sqrt), &[v])?;
    let mut y = one_value(im, cx, Op::Binary(BinaryOp::Div), &[xf, rms])?;
    if ty.dtype != DType::F32 {
        y = one_value(im, cx, Op::Cast { to: ty.dtype }, &[y])?;
    }
    let sv = im.value(scale)?;
    let y = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[y, sv])?;
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// LayerNormalization's Mean and InvStdDev outputs (f32, keeping the
/// normalised dims as 1): mean and 1 / sqrt(var + epsilon).
pub(super) fn layer_norm_stats(im: &mut Importer, cx: &Cx, x: &str, ax: usize, epsilon: f32) -> Result<Vec<Entry>, IrError> {
    let rank = im.ty(x)?.shape.len();
    let xf = stashed(im, cx, x)?;
    let mean = |axes: Vec<usize>| Op::Reduce { op: ReduceOp::Mean, axes, keepdims: true };
    let m = one_value(im, cx, mean((ax..rank).collect()), &[xf])?;
    let d = one_value(im, cx, Op::Binary(BinaryOp::Sub), &[xf, m])?;
    let sq = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[d, d])?;
    let var = one_value(im, cx, mean((ax..rank).collect()), &[sq])?;
    let eps = scalar(im, cx, "epsilon", DType::F32, epsilon as f64)?;
    let v = one_value(im, cx, Op::Binary(BinaryOp::Add), &[var, eps])?;
    let sd = one_value(im, cx, Op::Unary(UnaryOp::Sqrt), &[v])?;
    let inv = one_value(im, cx, Op::Unary(UnaryOp::Reciprocal), &[sd])?;
    Ok(vec![Entry { konst: None, value: Some(m) }, Entry { konst: None, value: Some(inv) }])
}

/// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (LogSoftmax over
/// the classes, then the former), from comparisons and reductions: the
/// target's one-hot mask picks each element's class; `weight` scales it,
/// `ignore_index` zeroes it, and `mean` divides by the weights kept.
pub(super) fn loss(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let sce = cx.node.op_type() == "SoftmaxCrossEntropyLoss";
    let (x, target) = (cx.need(0)?, cx.need(1)?);
    let (xt, tt) = (im.ty(x)?, im.ty(target)?);
    if !xt.dtype.is_float() {
        return Err(cx.bad(format!("invalid ONNX: the input must be a float tensor, got {xt}")));
    }
    if !matches!(tt.dtype, DType::I64 | DType::I32) {
        return Err(cx.bad(format!("invalid ONNX: the target must be int32 or int64, got {tt}")));
    }
    let rank = xt.shape.len();
    if rank < 2 || tt.shape.len() + 1 != rank || tt.shape[0] != xt.shape[0] || tt.shape[1..] != xt.shape[2..] {
        return Err(cx.bad(format!("invalid ONNX: input {xt} and target {tt} do not fit ([N, C, d...] and [N, d...])")));
    }
    let c = xt.shape[1];
    let reduction = cx.string("reduction")?.unwrap_or_else(|| "mean".into());
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(cx.unsupported(format!("reduction={reduction:?} (none, sum or mean)")));
    }
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| -> Result<ValueId, IrError> {
        Ok(emit_values(im, cx, op, vs)?[0].value.expect("a value"))
    };
    let mut xv = im.value(x)?;
    let log_prob = if sce { Some(one(im, Op::LogSoftmax { axis: 1 }, &[xv])?) } else { None };
    if let Some(lp) = log_prob {
        xv = lp;
    }
    // [N, 1, d...] against the classes [1, C, 1...]: the one-hot mask.
    let mut t_shape = tt.shape.clone();
    t_shape.insert(1, 1);
    let tv = im.value(target)?;
    let t1 = one(im, Op::Reshape { shape: t_shape }, &[tv])?;
    let mut c_shape = vec![1; rank];
    c_shape[1] = c;
    made(cx, &TensorType::new(tt.dtype, c_shape.clone()))?;
    let classes = Tensor::from_i64(c_shape.clone(), (0..c as i64).collect()).cast(tt.dtype);
    let classes = constant(im, cx, "classes", classes)?;
    let hot = one(im, Op::Compare(CompareOp::Equal), &[t1, classes])?;
    let zero = constant(im, cx, "zero", Tensor::full(&TensorType::new(xt.dtype, vec![]), 0.0))?;
    let over_classes = |keepdims| Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims };
    let picked = one(im, Op::Where, &[hot, xv, zero])?;
    let picked = one(im, over_classes(false), &[picked])?;
    // Each element's weight: weight[target], or 1; 0 where ignored.
    let w_full = match cx.input(2) {
        Some(w) => {
            let wt = im.ty(w)?;
            if wt.shape != [c] || wt.dtype != xt.dtype {
                return Err(cx.bad(format!("invalid ONNX: the weight must be {} of C = {c} classes, got {wt}", xt.dtype)));
            }
            let wv = im.value(w)?;
            one(im, Op::Reshape { shape: c_shape }, &[wv])?
        }
        None => constant(im, cx, "one", Tensor::full(&TensorType::new(xt.dtype, vec![]), 1.0))?,
    };
    let w = one(im, Op::Where, &[hot, w_full, zero])?;
    let mut w = one(im, over_classes(false), &[w])?;
    let mut picked = picked;
    if let Some(ii) = cx.attrs.get("ignore_index").map(|a| a.i()) {
        let ii = constant(im, cx, "ignore_index", Tensor::from_i64(vec![], vec![ii]).cast(tt.dtype))?;
        let ignored = one(im, Op::Compare(CompareOp::Equal), &[tv, ii])?;
        w = one(im, Op::Where, &[ignored, zero, w])?;
        // An ignored element is 0 even where its input is -inf.
        picked = one(im, Op::Where, &[ignored, zero, picked])?;
    }
    let weighted = one(im, Op::Binary(BinaryOp::Mul), &[picked, w])?;
    let per_element = one(im, Op::Unary(UnaryOp::Neg), &[weighted])?;
    let all: Vec<usize> = (0..rank - 1).collect();
    let total = |im: &mut Importer, v| one(im, Op::Reduce { op: ReduceOp::Sum, axes: all.clone(), keepdims: false }, &[v]);
    let y = match reduction.as_str() {
        "none" => per_element,
        "sum" => total(im, per_element)?,
        _ => {
            let (num, den) = (total(im, per_element)?, total(im, w)?);
            one(im, Op::Binary(BinaryOp::Div), &[num, den])?
        }
    };
    let mut out = vec![Entry { konst: None, value: Some(y) }];
    if sce && cx.extra_outputs_used(im, 1) {
        out.push(Entry { konst: None, value: log_prob });
    }
    Ok(out)
}
