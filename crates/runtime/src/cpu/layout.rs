//! Data movement on any dtype: concat, split, slice, transpose. Each builds
//! the source index of every output element, then gathers.

use smelt_ir::{PadMode, Tensor, TensorData, TensorType};
use std::sync::Arc;

fn gather(src: &TensorData, idx: impl Iterator<Item = usize>) -> TensorData {
    match src {
        TensorData::F32(v) => TensorData::F32(idx.map(|i| v[i]).collect()),
        TensorData::F16(v) => TensorData::F16(idx.map(|i| v[i]).collect()),
        TensorData::BF16(v) => TensorData::BF16(idx.map(|i| v[i]).collect()),
        TensorData::I64(v) => TensorData::I64(idx.map(|i| v[i]).collect()),
        TensorData::I32(v) => TensorData::I32(idx.map(|i| v[i]).collect()),
        TensorData::Bool(v) => TensorData::Bool(idx.map(|i| v[i]).collect()),
        TensorData::I8(v) => TensorData::I8(idx.map(|i| v[i]).collect()),
        TensorData::U8(v) => TensorData::U8(idx.map(|i| v[i]).collect()),
        TensorData::I16(v) => TensorData::I16(idx.map(|i| v[i]).collect()),
        TensorData::U16(v) => TensorData::U16(idx.map(|i| v[i]).collect()),
        TensorData::U32(v) => TensorData::U32(idx.map(|i| v[i]).collect()),
    }
}

fn make(ty: &TensorType, d: TensorData) -> Tensor {
    Tensor::new(ty.shape.clone(), d).expect("the index list covers the output")
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Calls `f` with every coordinate of `shape`, row-major.
fn coords(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.iter().product::<usize>() == 0 {
        return;
    }
    let mut c = vec![0; shape.len()];
    loop {
        f(&c);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            c[d] += 1;
            if c[d] < shape[d] {
                break;
            }
            c[d] = 0;
        }
    }
}

pub(crate) fn concat(args: &[Arc<Tensor>], axis: usize, out: &TensorType) -> Tensor {
    let outer: usize = out.shape[..axis].iter().product();
    let inner: usize = out.shape[axis + 1..].iter().product();
    let mut parts = Vec::new();
    for a in args {
        parts.push(a.cast(out.dtype).into_data());
    }
    // Interleave rows of each part.
    let rows: Vec<usize> = args.iter().map(|a| a.shape()[axis] * inner).collect();
    macro_rules! join {
        ($var:ident) => {{
            let mut v = Vec::with_capacity(out.numel());
            for o in 0..outer {
                for (p, &r) in parts.iter().zip(&rows) {
                    if let TensorData::$var(src) = p {
                        v.extend_from_slice(&src[o * r..][..r]);
                    }
                }
            }
            TensorData::$var(v)
        }};
    }
    let d = match parts[0] {
        TensorData::F32(_) => join!(F32),
        TensorData::F16(_) => join!(F16),
        TensorData::BF16(_) => join!(BF16),
        TensorData::I64(_) => join!(I64),
        TensorData::I32(_) => join!(I32),
        TensorData::Bool(_) => join!(Bool),
        TensorData::I8(_) => join!(I8),
        TensorData::U8(_) => join!(U8),
        TensorData::I16(_) => join!(I16),
        TensorData::U16(_) => join!(U16),
        TensorData::U32(_) => join!(U32),
    };
    make(out, d)
}

pub(crate) fn split(x: &Tensor, axis: usize, outs: &[TensorType]) -> Vec<Tensor> {
    let mut begin = 0;
    outs.iter()
        .map(|o| {
            let t = slice(x, &[axis], &[begin as i64], &[1], o);
            begin += o.shape[axis];
            t
        })
        .collect()
}

pub(crate) fn slice(x: &Tensor, axes: &[usize], starts: &[i64], steps: &[i64], out: &TensorType) -> Tensor {
    let st = strides(x.shape());
    let r = x.shape().len();
    let (mut start, mut step) = (vec![0i64; r], vec![1i64; r]);
    for i in 0..axes.len() {
        start[axes[i]] = starts[i];
        step[axes[i]] = steps[i];
    }
    let mut idx = Vec::with_capacity(out.numel());
    coords(&out.shape, |c| idx.push((0..r).map(|d| (start[d] + c[d] as i64 * step[d]) as usize * st[d]).sum()));
    make(out, gather(x.data(), idx.into_iter()))
}

pub(crate) fn transpose(x: &Tensor, perm: &[usize], out: &TensorType) -> Tensor {
    let st = strides(x.shape());
    let mut idx = Vec::with_capacity(out.numel());
    coords(&out.shape, |c| idx.push(perm.iter().enumerate().map(|(i, &p)| c[i] * st[p]).sum()));
    make(out, gather(x.data(), idx.into_iter()))
}

/// Pad: every output coordinate maps to an input coordinate (reflected or
/// clamped at the border) or, in constant mode, to the fill value.
pub(crate) fn pad(x: &Tensor, pads: &[usize], mode: PadMode, out: &TensorType) -> Tensor {
    let xs = x.shape();
    let r = xs.len();
    let st = strides(xs);
    // Source index per element; `usize::MAX` marks the constant fill.
    let mut idx = Vec::with_capacity(out.numel());
    coords(&out.shape, |c| {
        let mut off = 0;
        for d in 0..r {
            let i = c[d] as isize - pads[d] as isize;
            let n = xs[d] as isize;
            let j = match mode {
                _ if (0..n).contains(&i) => i,
                PadMode::Constant(_) => {
                    off = usize::MAX;
                    break;
                }
                PadMode::Edge => i.clamp(0, n - 1),
                PadMode::Reflect => {
                    if i < 0 {
                        -i
                    } else {
                        2 * (n - 1) - i
                    }
                }
            };
            off += j as usize * st[d];
        }
        idx.push(off);
    });
    let fill = match mode {
        PadMode::Constant(v) => v,
        _ => 0.0,
    };
    // Gather from the input extended by one fill element at the end.
    let n = x.ty().numel();
    let mut ext = super::f32s(x).into_owned();
    ext.push(fill);
    if x.ty().dtype.is_float() {
        let v: Vec<f32> = idx.iter().map(|&i| ext[if i == usize::MAX { n } else { i }]).collect();
        return super::tensor_of(out, v);
    }
    let mut ints = x.to_i64_vec();
    ints.push(fill as i64);
    let t = Tensor::new(out.shape.clone(), TensorData::I64(idx.iter().map(|&i| ints[if i == usize::MAX { n } else { i }]).collect()))
        .expect("count matches");
    t.cast(out.dtype)
}

/// Expand and Tile: output coordinate d reads input coordinate `c % extent`
/// (a broadcast dim has extent 1; a tiled dim wraps around).
pub(crate) fn repeat(x: &Tensor, out: &TensorType) -> Tensor {
    let xs = x.shape();
    let lead = out.shape.len() - xs.len();
    let st = strides(xs);
    let mut idx = Vec::with_capacity(out.numel());
    coords(&out.shape, |c| idx.push((0..xs.len()).map(|d| (c[lead + d] % xs[d].max(1)) * st[d]).sum()));
    make(out, gather(x.data(), idx.into_iter()))
}

/// Gather along `axis` by run-time indices; an index out of range is an
/// error naming it, never a panic.
pub(crate) fn gather_axis(x: &Tensor, indices: &Tensor, axis: usize, out: &TensorType) -> Result<Tensor, String> {
    let xs = x.shape();
    let dim = xs[axis] as i64;
    let outer: usize = xs[..axis].iter().product();
    let inner: usize = xs[axis + 1..].iter().product();
    let idx: Vec<usize> = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim } else { i };
            if (0..dim).contains(&j) {
                Ok(j as usize)
            } else {
                Err(format!("index {i} out of range for axis {axis} of extent {dim}"))
            }
        })
        .collect::<Result<_, _>>()?;
    let mut order = Vec::with_capacity(out.numel());
    for o in 0..outer {
        for &i in &idx {
            order.extend((0..inner).map(|k| (o * xs[axis] + i) * inner + k));
        }
    }
    Ok(make(out, gather(x.data(), order.into_iter())))
}
