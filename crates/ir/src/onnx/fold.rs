//! Constant folding at import: the shape arithmetic of exported graphs
//! (`Shape`, `Gather`, `Concat`, `Slice`, integer arithmetic) and the ops
//! that only reshape a constant.

use crate::dtype::DType;
use crate::infer::broadcast;
use crate::tensor::{Tensor, TensorData};

/// Gathers `indices` along `axis` of `data` (any dtype, through i64 or f32).
pub fn gather(data: &Tensor, indices: &Tensor, axis: usize) -> Result<Tensor, String> {
    let shape = data.shape();
    if axis >= shape.len() {
        return Err(format!("axis {axis} out of range for {}", data.ty()));
    }
    let dim = shape[axis] as i64;
    let idx: Vec<usize> = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim } else { i };
            (0..dim).contains(&j).then_some(j as usize).ok_or_else(|| format!("index {i} out of range for extent {dim}"))
        })
        .collect::<Result<_, _>>()?;
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut order = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &i in &idx {
            order.extend((0..inner).map(|k| (o * shape[axis] + i) * inner + k));
        }
    }
    let mut out_shape = shape[..axis].to_vec();
    out_shape.extend_from_slice(indices.shape());
    out_shape.extend_from_slice(&shape[axis + 1..]);
    Ok(pick(data, &order, out_shape))
}

/// Concatenates constants along `axis`.
pub fn concat(parts: &[&Tensor], axis: usize) -> Result<Tensor, String> {
    let first = parts.first().ok_or("concat of nothing")?;
    let rank = first.shape().len();
    if axis >= rank || parts.iter().any(|p| p.shape().len() != rank || p.ty().dtype != first.ty().dtype) {
        return Err("concat of constants with different ranks or dtypes".into());
    }
    if let Some(p) = parts.iter().find(|p| (0..rank).any(|d| d != axis && p.shape()[d] != first.shape()[d])) {
        return Err(format!("cannot concatenate {} with {} along axis {axis}", p.ty(), first.ty()));
    }
    let outer: usize = first.shape()[..axis].iter().product();
    let mut out_shape = first.shape().to_vec();
    out_shape[axis] = parts.iter().map(|p| p.shape()[axis]).sum();
    // Flatten every part into one index space: part k's elements follow part k-1's.
    let mut offsets = vec![0];
    for p in parts {
        offsets.push(offsets.last().expect("non-empty") + p.ty().numel());
    }
    let mut order = Vec::new();
    for o in 0..outer {
        for (k, p) in parts.iter().enumerate() {
            let chunk = p.ty().numel() / outer.max(1);
            order.extend((0..chunk).map(|i| offsets[k] + o * chunk + i));
        }
    }
    let joined = join(parts);
    Ok(pick(&joined, &order, out_shape))
}

/// Slices a 1-D constant (shape arithmetic only).
pub fn slice_1d(data: &Tensor, start: i64, end: i64, step: i64) -> Result<Tensor, String> {
    if data.shape().len() != 1 {
        return Err("folding slices of constants needs a 1-D constant".into());
    }
    let len = crate::infer::slice_len(data.shape()[0], start, end, step)?;
    let order: Vec<usize> = (0..len).map(|i| (start + i as i64 * step) as usize).collect();
    Ok(pick(data, &order, vec![len]))
}

/// Elementwise integer arithmetic on i64/i32 constants with broadcasting.
pub fn int_binary(a: &Tensor, b: &Tensor, f: fn(i64, i64) -> Option<i64>) -> Result<Tensor, String> {
    let shape = broadcast(a.shape(), b.shape()).ok_or("shapes do not broadcast")?;
    let (av, bv) = (a.to_i64_vec(), b.to_i64_vec());
    let n: usize = shape.iter().product();
    let at = |v: &[i64], s: &[usize], i: usize| -> i64 {
        // Index into a broadcast operand: walk dims from the innermost.
        let (mut rem, mut off, mut stride) = (i, 0, 1);
        for d in (0..shape.len()).rev() {
            let coord = rem % shape[d];
            rem /= shape[d];
            if let Some(k) = (d + s.len()).checked_sub(shape.len()) {
                if s[k] != 1 {
                    off += coord * stride;
                }
                stride *= s[k];
            }
        }
        v[off]
    };
    let out = (0..n)
        .map(|i| f(at(&av, a.shape(), i), at(&bv, b.shape(), i)).ok_or("integer overflow or division by zero"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Tensor::new(shape, TensorData::I64(out)).expect("count matches").cast(a.ty().dtype))
}

fn join(parts: &[&Tensor]) -> Tensor {
    let dtype = parts[0].ty().dtype;
    let n: usize = parts.iter().map(|p| p.ty().numel()).sum();
    let data = match dtype {
        DType::I64 => TensorData::I64(parts.iter().flat_map(|p| p.to_i64_vec()).collect()),
        DType::I32 => TensorData::I32(parts.iter().flat_map(|p| p.to_i64_vec()).map(|x| x as i32).collect()),
        DType::Bool => TensorData::Bool(parts.iter().flat_map(|p| p.to_i64_vec()).map(|x| x != 0).collect()),
        _ => TensorData::F32(parts.iter().flat_map(|p| p.to_f32_vec()).collect()),
    };
    Tensor::new(vec![n], data).expect("count matches").cast(dtype)
}

fn pick(data: &Tensor, order: &[usize], shape: Vec<usize>) -> Tensor {
    let dtype = data.ty().dtype;
    let out = match data.data() {
        TensorData::I64(v) => TensorData::I64(order.iter().map(|&i| v[i]).collect()),
        TensorData::I32(v) => TensorData::I32(order.iter().map(|&i| v[i]).collect()),
        TensorData::Bool(v) => TensorData::Bool(order.iter().map(|&i| v[i]).collect()),
        TensorData::F32(v) => TensorData::F32(order.iter().map(|&i| v[i]).collect()),
        TensorData::F16(v) => TensorData::F16(order.iter().map(|&i| v[i]).collect()),
        TensorData::BF16(v) => TensorData::BF16(order.iter().map(|&i| v[i]).collect()),
    };
    let t = Tensor::new(shape, out).expect("count matches");
    debug_assert_eq!(t.ty().dtype, dtype);
    t
}
