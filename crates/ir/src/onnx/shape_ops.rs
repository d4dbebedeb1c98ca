//! ONNX ops that produce constants or move data: constants, shape
//! arithmetic folded at import (`Shape`, `Gather`, `Cast`, `Concat`,
//! `Slice`... on constants), reshapes, and padding, expansion, tiling.

use super::nodes::{axes, axis, const_input, const_int_vec, const_ints, emit, konst, reshaping, Arity, Cx, Spec, ANY};
use super::{fold, tensor, Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::op::{Op, PadMode};
use crate::tensor::Tensor;
use std::sync::Arc;

/// Largest constant that folding may create (2 GiB); beyond it a file is
/// taken to be corrupt rather than allocating.
const FOLD_LIMIT_BYTES: usize = 2 << 30;

/// The shape ops: each with its attributes, its arity at `opset` and its
/// lowering (one `match`, [`lower`]).
pub(super) fn spec(op_type: &str, opset: i64) -> Option<Spec> {
    let (attributes, arity): (&'static [&'static str], Arity) = match op_type {
        "Constant" => (
            &["value", "value_float", "value_floats", "value_int", "value_ints", "value_string", "value_strings", "sparse_value"],
            (0, 0, 1),
        ),
        "Size" | "Identity" => (&[], (1, 1, 1)),
        "ConstantOfShape" => (&["value"], (1, 1, 1)),
        "Shape" => (&["start", "end"], (1, 1, 1)),
        "Gather" => (&["axis"], (2, 2, 1)),
        "Cast" => (&["to", "saturate", "round_mode"], (1, 1, 1)),
        "CastLike" => (&["saturate", "round_mode"], (2, 2, 1)),
        "Dropout" => (&["ratio", "is_test", "seed"], if opset < 12 { (1, 1, 2) } else { (1, 3, 2) }),
        "Reshape" => (&["shape", "allowzero"], if opset < 5 { (1, 1, 1) } else { (2, 2, 1) }),
        "Flatten" => (&["axis"], (1, 1, 1)),
        "Squeeze" | "Unsqueeze" => (&["axes"], if opset < 13 { (1, 1, 1) } else { (1, 2, 1) }),
        "Concat" => (&["axis"], (1, ANY, 1)),
        "Split" => (&["axis", "split", "num_outputs"], (1, 2, ANY)),
        "Slice" => (&["starts", "ends", "axes"], if opset < 10 { (1, 1, 1) } else { (3, 5, 1) }),
        "Pad" => (&["mode", "pads", "value", "paddings"], if opset < 11 { (1, 1, 1) } else { (2, 4, 1) }),
        "Expand" => (&[], (2, 2, 1)),
        "Tile" => (&[], if opset < 6 { (3, 3, 1) } else { (2, 2, 1) }),
        _ => return None,
    };
    Some(Spec { attributes, arity, lower })
}

/// Resolves a Reshape target against the input shape (ONNX 0 and -1), after
/// replacing a hard-coded exported batch when `--batch` changes it.
fn reshape_target(im: &Importer, cx: &Cx, mut target: Vec<i64>, input: &[usize]) -> Result<Vec<usize>, IrError> {
    if let Some((exported, new)) = im.batch {
        // The input leads with the new batch, or holds the new batch's
        // elements where the target holds the exported one's (GPT-2's
        // [batch * sequence, 3 hidden] back to [batch, sequence, 3 hidden]).
        let numel: usize = input.iter().product();
        let fixed = target[1.min(target.len())..].iter().try_fold(1usize, |f, &d| f.checked_mul(usize::try_from(d).ok()?));
        let follows = fixed.is_some_and(|f| f.checked_mul(new) == Some(numel) && f.checked_mul(exported) != Some(numel));
        if !target.is_empty() && target[0] == exported as i64 && (input.first() == Some(&new) || follows) {
            target[0] = new as i64;
        }
    }
    let allow_zero = cx.int("allowzero", 0)? != 0;
    let numel: usize = input.iter().product();
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1)
            }
            0 if !allow_zero => {
                out.push(*input.get(i).ok_or_else(|| cx.bad(format!("target {target:?} copies dim {i} that the input lacks")))?)
            }
            d if d >= 0 => out.push(d as usize),
            _ => return Err(cx.bad(format!("invalid reshape target {target:?}"))),
        }
    }
    let known = crate::infer::checked_numel(&out).map_err(|m| cx.bad(format!("invalid reshape target {target:?}: {m}")))?;
    if let Some(i) = infer_at {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(cx.bad(format!("cannot reshape {input:?} to {target:?}")));
        }
        out[i] = numel / known;
    }
    if crate::infer::checked_numel(&out).ok() != Some(numel) {
        return Err(cx.bad(format!("cannot reshape {input:?} ({numel} elements) to {target:?}")));
    }
    Ok(out)
}

/// Lowers one node of an op [`handles`] accepts.
pub(super) fn lower(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    match op_type {
        "Constant" => {
            if let Some(a) = cx.attrs.get("value") {
                let t = a.t.as_ref().ok_or_else(|| cx.bad("value attribute holds no tensor"))?;
                return Ok(konst(tensor::from_proto(t)?));
            }
            let a = |k: &str| cx.attrs.get(k).copied();
            let t = match (a("value_float"), a("value_floats"), a("value_int"), a("value_ints")) {
                (Some(f), ..) => Tensor::from_f32(vec![], vec![f.f()]),
                (_, Some(f), ..) => Tensor::from_f32(vec![f.floats.len()], f.floats.clone()),
                (_, _, Some(i), _) => Tensor::from_i64(vec![], vec![i.i()]),
                (.., Some(i)) => Tensor::from_i64(vec![i.ints.len()], i.ints.clone()),
                _ => {
                    let form = ["value_string", "value_strings", "sparse_value"].into_iter().find(|k| cx.attrs.contains_key(k));
                    return Err(match form {
                        Some(k) => cx.unsupported(format!("Constant's {k} (smelt has no string or sparse tensors)")),
                        None => cx.bad("invalid ONNX: Constant has no value attribute"),
                    });
                }
            };
            Ok(konst(t))
        }
        "Size" => {
            let ty = im.ty(cx.need(0)?)?;
            Ok(konst(Tensor::from_i64(vec![], vec![ty.numel() as i64])))
        }
        "ConstantOfShape" => {
            let dims = const_int_vec(im, cx, 0, "shape")?;
            let value = match cx.attrs.get("value").and_then(|a| a.t.as_ref()) {
                Some(t) => tensor::from_proto(t)?,
                None => Tensor::from_f32(vec![1], vec![0.0]),
            };
            if value.ty().numel() != 1 {
                return Err(cx.bad(format!("invalid ONNX: value must hold one element, got {}", value.ty())));
            }
            let (shape, _) = tensor::numel_of(&dims, value.ty().dtype).map_err(|m| cx.bad(m))?;
            let ty = TensorType::new(value.ty().dtype, shape);
            if ty.bytes() > FOLD_LIMIT_BYTES {
                return Err(cx.too_large(format!("a constant of {} bytes to fold (at most {FOLD_LIMIT_BYTES})", ty.bytes())));
            }
            let v = value.to_f32_vec().first().copied().unwrap_or(0.0);
            let v = if value.ty().dtype.is_float() { v as f64 } else { value.to_i64_vec()[0] as f64 };
            Ok(konst(Tensor::full(&ty, v)))
        }
        "Shape" => {
            let ty = im.ty(cx.need(0)?)?;
            let r = ty.shape.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clamp(cx.int("start", 0)?);
            let end = clamp(cx.int("end", r)?);
            let dims: Vec<i64> = ty.shape[start..end.max(start)].iter().map(|&d| d as i64).collect();
            Ok(konst(Tensor::from_i64(vec![dims.len()], dims)))
        }
        "Gather" => {
            let (data, indices) = (cx.need(0)?, cx.need(1)?);
            let ax = axis(cx, cx.int("axis", 0)?, im.ty(data)?.shape.len())?;
            // A kept weight (training) is an op's operand: a parameter
            // gathered by constant indices (position embeddings) trains.
            match (im.konst(data).filter(|_| !im.kept.contains(data)), im.konst(indices)) {
                // Shape arithmetic: folded.
                (Some(d), Some(i)) => Ok(konst(fold::gather(&d, &i, ax).map_err(|m| cx.bad(m))?)),
                // An embedding lookup or a slice of a computed tensor: an op.
                _ => emit(im, cx, Op::Gather { axis: ax }, &[data, indices]),
            }
        }
        "Cast" | "CastLike" => {
            let to = match op_type {
                "Cast" => tensor::dtype_of(cx.int("to", 0)? as i32).map_err(|m| cx.unsupported(m))?,
                _ => im.ty(cx.need(1)?)?.dtype,
            };
            let x = cx.need(0)?;
            match im.konst(x) {
                Some(t) => Ok(konst(t.cast(to))),
                None => emit(im, cx, Op::Cast { to }, &[x]),
            }
        }
        "Identity" | "Dropout" => {
            // Opset 12 on: a third input says whether to drop (training);
            // with a ratio of 0 it drops nothing.
            if op_type == "Dropout" && cx.input(2).is_some() {
                let training = const_input(im, cx, 2, "training_mode")?.to_i64_vec().iter().any(|&b| b != 0);
                let ratio = match cx.input(1) {
                    Some(_) if training => const_input(im, cx, 1, "ratio")?.to_f32_vec(),
                    _ => vec![0.5],
                };
                if training && ratio.iter().any(|&r| r != 0.0) {
                    return Err(cx.unsupported("training_mode=true (random dropout); export the model in eval mode"));
                }
            }
            let x = cx.need(0)?;
            let ty = im.ty(x)?;
            let mut out = if ty.dtype.is_float() {
                let op = if op_type == "Identity" { Op::Identity } else { Op::Dropout };
                reshaping(im, cx, op, x)?
            } else if op_type == "Identity" {
                // Integers and booleans pass through: the same value.
                vec![im.env.get(x).cloned().ok_or_else(|| cx.bad(format!("input {x} is never produced")))?]
            } else {
                return Err(cx.bad(format!("invalid ONNX: Dropout needs a float input, got {ty}")));
            };
            if cx.extra_outputs_used(im, 1) {
                // Nothing is dropped: the mask is all true.
                let one = super::nodes::constant(im, cx, "true", Tensor::full(&TensorType::new(DType::Bool, vec![]), 1.0))?;
                let mask = super::nodes::one_value(im, cx, Op::Expand { shape: ty.shape }, &[one])?;
                out.push(Entry { konst: None, value: Some(mask) });
            }
            Ok(out)
        }
        "Reshape" => {
            let x = cx.need(0)?;
            let target = if cx.opset < 5 {
                cx.ints("shape")?.ok_or_else(|| cx.bad("missing shape"))?
            } else {
                const_int_vec(im, cx, 1, "the target shape")?
            };
            let shape = reshape_target(im, cx, target, &im.ty(x)?.shape)?;
            reshaping(im, cx, Op::Reshape { shape }, x)
        }
        "Flatten" => {
            let x = cx.need(0)?;
            let rank = im.ty(x)?.shape.len();
            let a = cx.int("axis", 1)?;
            let a = if a < 0 { a + rank as i64 } else { a };
            if !(0..=rank as i64).contains(&a) {
                return Err(cx.bad(format!("axis {a} out of range")));
            }
            reshaping(im, cx, Op::Flatten { axis: a as usize }, x)
        }
        "Squeeze" | "Unsqueeze" => {
            let x = cx.need(0)?;
            let shape = im.ty(x)?.shape;
            let given = if cx.opset >= 13 { const_ints(im, cx, 1, "axes")? } else { cx.ints("axes")? };
            if op_type == "Squeeze" {
                let ax = match given {
                    Some(v) => axes(cx, &v, shape.len())?,
                    None => (0..shape.len()).filter(|&i| shape[i] == 1).collect(),
                };
                reshaping(im, cx, Op::Squeeze { axes: ax }, x)
            } else {
                let v = given.ok_or_else(|| cx.bad("Unsqueeze needs axes"))?;
                let ax = axes(cx, &v, shape.len() + v.len())?;
                reshaping(im, cx, Op::Unsqueeze { axes: ax }, x)
            }
        }
        "Concat" => {
            let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).filter(|s| !s.is_empty()).collect();
            let first = im.ty(ins.first().copied().ok_or_else(|| cx.bad("no inputs"))?)?;
            let ax = axis(
                cx,
                cx.int("axis", 0).and_then(|a| {
                    if cx.attrs.contains_key("axis") || cx.opset < 4 {
                        Ok(a)
                    } else {
                        Err(cx.bad("missing axis"))
                    }
                })?,
                first.shape.len(),
            )?;
            // One input (GPT-2's key and value after an empty cache): the input itself.
            if let [x] = ins.as_slice() {
                if first.dtype.is_float() {
                    return reshaping(im, cx, Op::Identity, x);
                }
            }
            let consts: Option<Vec<Arc<Tensor>>> = ins.iter().map(|n| im.konst(n)).collect();
            match consts {
                Some(cs) if !first.dtype.is_float() => {
                    let refs: Vec<&Tensor> = cs.iter().map(|c| c.as_ref()).collect();
                    Ok(konst(fold::concat(&refs, ax).map_err(|m| cx.bad(m))?))
                }
                _ => emit(im, cx, Op::Concat { axis: ax }, &ins),
            }
        }
        "Split" => {
            let x = cx.need(0)?;
            let shape = im.ty(x)?.shape;
            let ax = axis(cx, cx.int("axis", 0)?, shape.len())?;
            let given = if cx.opset >= 13 { const_ints(im, cx, 1, "split")? } else { cx.ints("split")? };
            let n_out = cx.node.output.len();
            let sizes = match given {
                Some(v) if v.len() != n_out => {
                    return Err(cx.bad(format!("invalid ONNX: split {v:?} has {} entries for {n_out} outputs", v.len())))
                }
                Some(v) => cx.usizes(v, "split")?,
                None => {
                    let parts = if cx.opset >= 18 { cx.int("num_outputs", n_out as i64)? } else { n_out as i64 };
                    if parts != n_out as i64 {
                        return Err(cx.bad(format!("invalid ONNX: num_outputs is {parts} but the node has {n_out} outputs")));
                    }
                    let parts = n_out;
                    let d = shape[ax];
                    let chunk = d.div_ceil(parts.max(1));
                    (0..parts).map(|i| chunk.min(d.saturating_sub(i * chunk))).collect()
                }
            };
            if sizes.iter().try_fold(0usize, |a, &n| a.checked_add(n)) != Some(shape[ax]) {
                return Err(cx.bad(format!("invalid ONNX: split sizes {sizes:?} do not add up to {} along axis {ax}", shape[ax])));
            }
            // One slice per part: each is its own kernel, reading only its part.
            let mut start = 0;
            let mut parts = Vec::with_capacity(sizes.len());
            for &n in &sizes {
                let (s, e) = (start as i64, (start + n) as i64);
                parts.push(emit(im, cx, Op::Slice { axes: vec![ax], starts: vec![s], ends: vec![e], steps: vec![1] }, &[x])?.remove(0));
                start += n;
            }
            Ok(parts)
        }
        "Slice" => {
            let x = cx.need(0)?;
            let shape = im.ty(x)?.shape;
            let (starts, ends, ax, steps) = if cx.opset < 10 {
                (cx.ints("starts")?.unwrap_or_default(), cx.ints("ends")?.unwrap_or_default(), cx.ints("axes")?, None)
            } else {
                (
                    const_int_vec(im, cx, 1, "starts")?,
                    const_int_vec(im, cx, 2, "ends")?,
                    const_ints(im, cx, 3, "axes")?,
                    const_ints(im, cx, 4, "steps")?,
                )
            };
            let n = starts.len();
            let ax = ax.unwrap_or_else(|| (0..n as i64).collect());
            let steps = steps.unwrap_or_else(|| vec![1; n]);
            if ends.len() != n || ax.len() != n || steps.len() != n {
                return Err(cx.bad("starts, ends, axes and steps differ in length"));
            }
            let mut norm = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for i in 0..n {
                let a = axis(cx, ax[i], shape.len())?;
                let d = shape[a] as i64;
                let step = steps[i];
                if step == 0 {
                    return Err(cx.bad("slice step 0"));
                }
                let fix = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
                let (s, e) = if d == 0 {
                    (0, 0) // nothing to take, whatever the step
                } else if step > 0 {
                    (fix(starts[i]).clamp(0, d), fix(ends[i]).clamp(0, d))
                } else {
                    (fix(starts[i]).clamp(0, d - 1), fix(ends[i]).clamp(-1, d - 1))
                };
                norm.0.push(a);
                norm.1.push(s);
                norm.2.push(e);
                norm.3.push(step);
            }
            if let Some(t) = im.konst(x).filter(|t| !t.ty().dtype.is_float()) {
                return Ok(konst(fold::slice(&t, &norm.0, &norm.1, &norm.2, &norm.3).map_err(|m| cx.bad(m))?));
            }
            emit(im, cx, Op::Slice { axes: norm.0, starts: norm.1, ends: norm.2, steps: norm.3 }, &[x])
        }
        "Pad" => {
            let x = cx.need(0)?;
            let rank = im.ty(x)?.shape.len();
            let (raw, value) = if cx.opset < 11 {
                // Opset 1 called them paddings.
                (cx.ints("pads")?.or(cx.ints("paddings")?).unwrap_or_default(), cx.float("value", 0.0)?)
            } else {
                let v = match cx.input(2) {
                    Some(_) => const_input(im, cx, 2, "constant_value")?.to_f32_vec().first().copied().unwrap_or(0.0),
                    None => 0.0,
                };
                (const_int_vec(im, cx, 1, "pads")?, v)
            };
            // Opset 18 may pad only some axes.
            let raw = match const_ints(im, cx, 3, "axes")? {
                Some(ax) => {
                    let ax = axes(cx, &ax, rank)?;
                    let mut full = vec![0; 2 * rank];
                    for (i, &a) in ax.iter().enumerate() {
                        full[a] = raw.get(i).copied().unwrap_or(0);
                        full[rank + a] = raw.get(ax.len() + i).copied().unwrap_or(0);
                    }
                    full
                }
                None => raw,
            };
            if raw.iter().any(|&p| p < 0) {
                return Err(cx.unsupported("negative pads (cropping)"));
            }
            let mode = match cx.string("mode")?.as_deref().unwrap_or("constant") {
                "constant" => PadMode::Constant(value),
                "reflect" => PadMode::Reflect,
                "edge" => PadMode::Edge,
                m => return Err(cx.unsupported(format!("pad mode {m}"))),
            };
            let pads = cx.usizes(raw, "pads")?;
            emit(im, cx, Op::Pad { pads, mode }, &[x])
        }
        "Expand" => {
            let x = cx.need(0)?;
            let mut target: Vec<usize> = cx.usizes(const_int_vec(im, cx, 1, "the shape")?, "shape")?;
            let xt = im.ty(x)?;
            // An exporter's baked batch (a mask, a class token or GQA's keys
            // expanded to it) follows `--batch` when the operand's first
            // dimension broadcasts to it or is the new batch.
            if let Some((exported, new)) = im.batch {
                let lead = target.len().checked_sub(xt.shape.len()).map(|k| if k == 0 { xt.shape.first().copied() } else { None });
                if target.first() == Some(&exported) && lead.is_some_and(|d| d.is_none_or(|d| d == 1 || d == new)) {
                    target[0] = new;
                }
            }
            let shape =
                crate::infer::broadcast(&xt.shape, &target).ok_or_else(|| cx.bad(format!("{xt} does not broadcast with {target:?}")))?;
            emit(im, cx, Op::Expand { shape }, &[x])
        }
        "Tile" => {
            let x = cx.need(0)?;
            if cx.opset < 6 {
                return Err(cx.unsupported("Tile before opset 6 (tiles and axis inputs)"));
            }
            let repeats = cx.usizes(const_int_vec(im, cx, 1, "repeats")?, "repeats")?;
            emit(im, cx, Op::Tile { repeats }, &[x])
        }
        _ => Err(IrError::UnsupportedOp { op_type: op_type.to_string(), node: cx.name.clone(), opset: cx.opset }),
    }
}
