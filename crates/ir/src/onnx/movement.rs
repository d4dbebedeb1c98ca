//! ONNX's ops that move and select elements (beside the shape ops of
//! `shape_ops.rs`): transposes, triangles, gathers and scatters, one-hot,
//! depth-to-space, ranges and sequences.

use super::nodes::*;
use super::{fold, Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::op::Op;
use crate::tensor::Tensor;
use std::sync::Arc;

/// The movement ops: each with its attributes, its arity at `opset` and
/// its lowering.
pub(super) fn spec(op_type: &str, _opset: i64) -> Option<Spec> {
    let (attributes, arity, lower): (&'static [&'static str], Arity, Lower) = match op_type {
        "Transpose" => (&["perm"], (1, 1, 1), transpose),
        "Trilu" => (&["upper"], (1, 2, 1), trilu),
        "GatherElements" => (&["axis"], (2, 2, 1), gather_elements),
        "GatherND" => (&["batch_dims"], (2, 2, 1), gather_nd),
        "ScatterND" => (&["reduction"], (3, 3, 1), scatter_nd),
        "OneHot" => (&["axis"], (3, 3, 1), built),
        "DepthToSpace" | "SpaceToDepth" => (&["blocksize", "mode"], (1, 1, 1), built),
        "Range" => (&[], (3, 3, 1), range),
        "SplitToSequence" => (&["axis", "keepdims"], (1, 2, 1), split_to_sequence),
        "SequenceAt" => (&[], (2, 2, 1), sequence_at),
        _ => return None,
    };
    Some(Spec { attributes, arity, lower })
}

/// `Transpose`.
pub(super) fn transpose(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let rank = im.ty(x)?.shape.len();
    let perm = match cx.ints("perm")? {
        Some(p) => cx.usizes(p, "perm")?,
        None => (0..rank).rev().collect(),
    };
    emit(im, cx, Op::Transpose { perm }, &[x])
}

/// `Trilu`.
pub(super) fn trilu(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let k = match cx.input(1) {
        Some(_) => const_int_vec(im, cx, 1, "k")?.first().copied().unwrap_or(0),
        None => 0,
    };
    let xt = im.ty(x)?;
    if xt.shape.len() < 2 {
        return Err(cx.bad(format!("invalid ONNX: Trilu needs rank at least 2, got {xt}")));
    }
    // Keep element (i, j) of the last two dims where j - i >= k
    // (upper) or j - i <= k (lower): a constant mask and a select.
    let (n, m) = (xt.shape[xt.shape.len() - 2], xt.shape[xt.shape.len() - 1]);
    if n.saturating_mul(m) > 1 << 26 {
        return Err(cx.too_large(format!("a {n}x{m} triangle mask (at most 2^26 elements)")));
    }
    let upper = cx.int("upper", 1)? != 0;
    let keep = (0..n * m).map(|p| {
        let d = (p % m) as i64 - (p / m) as i64;
        if upper {
            d >= k
        } else {
            d <= k
        }
    });
    let mask = Tensor::new(vec![n, m], crate::tensor::TensorData::Bool(keep.collect())).expect("count matches");
    let zero = Tensor::full(&crate::dtype::TensorType::new(xt.dtype, vec![]), 0.0);
    let (mask_name, zero_name) = (format!("{}:mask", cx.name), format!("{}:zero", cx.name));
    im.env.insert(mask_name.clone(), Entry { konst: Some(Arc::new(mask)), value: None });
    im.env.insert(zero_name.clone(), Entry { konst: Some(Arc::new(zero)), value: None });
    emit(im, cx, Op::Where, &[&mask_name, x, &zero_name])
}

/// `GatherElements`.
pub(super) fn gather_elements(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (d, i) = (cx.need(0)?, cx.need(1)?);
    let (Some(data), Some(idx)) = (im.konst(d).filter(|_| !im.kept.contains(d)), im.konst(i)) else {
        return built(im, cx);
    };
    let ax = axis(cx, cx.int("axis", 0)?, data.shape().len())?;
    Ok(konst(fold::gather_elements(&data, &idx, ax).map_err(|m| cx.bad(m))?))
}

/// `GatherND`.
pub(super) fn gather_nd(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    // With constant indices: a Gather along the flattened leading
    // dims of data (a run-time mask selected by shape arithmetic).
    if cx.int("batch_dims", 0)? != 0 {
        return Err(cx.unsupported("GatherND with batch_dims other than 0"));
    }
    let d = cx.need(0)?;
    let idx = const_input(im, cx, 1, "indices")?;
    let dt = im.ty(d)?;
    let k = *idx.shape().last().ok_or_else(|| cx.bad("invalid ONNX: GatherND indices must have rank at least 1"))?;
    if k > dt.shape.len() {
        return Err(cx.bad(format!("invalid ONNX: indices of depth {k} into {dt}")));
    }
    let lead: usize = dt.shape[..k].iter().product();
    let ishape = idx.shape()[..idx.shape().len() - 1].to_vec();
    let tuples = crate::infer::checked_numel(&ishape).map_err(|m| cx.bad(m))?;
    // Index tuples of depth 0 each select all of data (no elements to read them from).
    if k == 0 && tuples > 1 << 24 {
        return Err(cx.too_large(format!("{tuples} empty index tuples")));
    }
    let mut flat = if k == 0 { vec![0; tuples] } else { Vec::with_capacity(tuples) };
    for tuple in idx.to_i64_vec().chunks(k.max(1)).filter(|_| k > 0) {
        let mut f = 0i64;
        for (j, &v) in tuple.iter().enumerate().take(k) {
            let e = dt.shape[j] as i64;
            let v = if v < 0 { v + e } else { v };
            if !(0..e).contains(&v) {
                return Err(cx.bad(format!("index {v} out of range for extent {e} of {dt}")));
            }
            f = f * e + v;
        }
        flat.push(f);
    }
    let flat_name = format!("{}:flat_indices", cx.name);
    im.env.insert(flat_name.clone(), Entry { konst: Some(Arc::new(Tensor::from_i64(ishape, flat))), value: None });
    let mut shape = vec![lead];
    shape.extend_from_slice(&dt.shape[k..]);
    let flat_data = reshaping(im, cx, Op::Reshape { shape }, d)?.remove(0);
    let data_name = format!("{}:flat_data", cx.name);
    im.env.insert(data_name.clone(), flat_data);
    match im.konst(&data_name) {
        Some(t) => {
            let i = im.konst(&flat_name).expect("just inserted");
            Ok(konst(fold::gather(&t, &i, 0).map_err(|m| cx.bad(m))?))
        }
        None => emit(im, cx, Op::Gather { axis: 0 }, &[&data_name, &flat_name]),
    }
}

/// `Range`.
pub(super) fn range(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let ins = (0..3).map(|i| const_input(im, cx, i, ["start", "limit", "delta"][i])).collect::<Result<Vec<_>, _>>()?;
    Ok(konst(fold::range(&ins[0], &ins[1], &ins[2]).map_err(|m| cx.bad(m))?))
}

/// A constant as a graph value (registered under a name derived from the node).
/// ScatterND with constant indices (what exporters write: a window's
/// mask, a slice assignment), any dtype: the data and the updates
/// flattened and concatenated, and one Gather that takes each element from
/// the data or, where an index row writes it, from the updates (the last
/// write of an element wins, as ONNX's reference does).
pub(super) fn scatter_nd(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    match cx.string("reduction")?.as_deref().unwrap_or("none") {
        "none" => {}
        other => return Err(cx.unsupported(format!("ScatterND with reduction={other:?} (smelt computes \"none\")"))),
    }
    let (d, u) = (cx.need(0)?, cx.need(2)?);
    let (dt, ut) = (im.ty(d)?, im.ty(u)?);
    let idx = const_input(im, cx, 1, "indices")?;
    let k = *idx.shape().last().ok_or_else(|| cx.bad("invalid ONNX: ScatterND indices must have rank at least 1"))?;
    if k == 0 || k > dt.shape.len() {
        return Err(cx.bad(format!("invalid ONNX: index rows of {k} for data {dt}")));
    }
    let rows = idx.shape()[..idx.shape().len() - 1].to_vec();
    let mut want = rows.clone();
    want.extend_from_slice(&dt.shape[k..]);
    if ut.shape != want || ut.dtype != dt.dtype {
        return Err(cx.bad(format!("invalid ONNX: updates {ut} for data {dt} and indices {:?} (want {:?})", idx.shape(), want)));
    }
    let n = dt.numel();
    let slice: usize = dt.shape[k..].iter().product();
    made(cx, &TensorType::new(DType::I64, vec![n]))?;
    let mut from: Vec<i64> = (0..n as i64).collect();
    let iv = idx.to_i64_vec();
    for (j, row) in iv.chunks(k).enumerate() {
        let mut base = 0usize;
        for (a, &i) in row.iter().enumerate() {
            let dim = dt.shape[a] as i64;
            let i = if i < 0 { i + dim } else { i };
            if !(0..dim).contains(&i) {
                return Err(cx.bad(format!("index {i} out of range for extent {dim} (axis {a})")));
            }
            base = base * dt.shape[a] + i as usize;
        }
        for t in 0..slice {
            from[base * slice + t] = (n + j * slice + t) as i64;
        }
    }
    let (dv, uv) = (im.value(d)?, im.value(u)?);
    let df = one_value(im, cx, Op::Reshape { shape: vec![n] }, &[dv])?;
    let uf = one_value(im, cx, Op::Reshape { shape: vec![ut.numel()] }, &[uv])?;
    let both = one_value(im, cx, Op::Concat { axis: 0 }, &[df, uf])?;
    let at = constant(im, cx, "sources", Tensor::from_i64(vec![n], from))?;
    let picked = one_value(im, cx, Op::Gather { axis: 0 }, &[both, at])?;
    let out = one_value(im, cx, Op::Reshape { shape: dt.shape.clone() }, &[picked])?;
    Ok(vec![Entry { konst: None, value: Some(out) }])
}
