//! Constant folding at import: the shape arithmetic of exported graphs
//! (`Shape`, `Gather`, `Concat`, `Slice`, integer arithmetic) and the ops
//! that only reshape a constant.

use crate::dtype::{DType, TensorType};
use crate::infer::broadcast;
use crate::op::{apply_binary, apply_unary, Op};
use crate::tensor::{Tensor, TensorData};
use crate::values;

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
    Ok(Tensor::take(data, &order, out_shape))
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
    Ok(Tensor::take(&joined, &order, out_shape))
}

/// Slices a constant of any rank: along each of `axes`, `start`, then
/// every `step`, before `end` (all normalized: in range for the extent).
pub fn slice(data: &Tensor, axes: &[usize], starts: &[i64], ends: &[i64], steps: &[i64]) -> Result<Tensor, String> {
    let shape = data.shape();
    let mut out = shape.to_vec();
    let mut how: Vec<Option<(i64, i64)>> = vec![None; shape.len()];
    for (k, &a) in axes.iter().enumerate() {
        if a >= shape.len() || how[a].is_some() {
            return Err(format!("slice axis {a} out of range or repeated for {}", data.ty()));
        }
        out[a] = crate::infer::slice_len(shape[a], starts[k], ends[k], steps[k])?;
        how[a] = Some((starts[k], steps[k]));
    }
    let order = strided(shape, &out, |d, i| match how[d] {
        Some((start, step)) => (start + i as i64 * step) as usize,
        None => i,
    });
    Ok(Tensor::take(data, &order, out))
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

/// For each element of `out` (row-major), the flat index in `src` whose
/// coordinate along dim d is `at(d, i)` for output coordinate i.
fn strided(src: &[usize], out: &[usize], at: impl Fn(usize, usize) -> usize) -> Vec<usize> {
    let n: usize = out.iter().product();
    let mut order = Vec::with_capacity(n);
    let mut idx = vec![0usize; out.len()];
    for _ in 0..n {
        let mut flat = 0;
        for d in 0..out.len() {
            flat = flat * src[d] + at(d, idx[d]);
        }
        order.push(flat);
        crate::index::next_index(&mut idx, out);
    }
    order
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

/// `op` evaluated on constants, when it is one import folds: elementwise
/// arithmetic, comparisons, boolean functions, `where` and broadcasts
/// (`None`: emit the op instead). Floats compute in f32 as the kernels do,
/// integers exactly.
pub fn op(op: &Op, args: &[&Tensor], out: &TensorType) -> Option<Result<Tensor, String>> {
    let floats = |t: &Tensor| t.to_f32_vec();
    Some(match op {
        Op::Compare(c) => values::compare(*c, args[0], args[1]),
        Op::Logic(l) => values::logic(*l, args[0], args[1]),
        Op::Not => Ok(values::not(args[0])),
        Op::IsNaN => Ok(values::is_nan(args[0])),
        Op::Where => values::select(args[0], args[1], args[2]),
        Op::Binary(b) if !out.dtype.is_float() => values::int_binary(*b, args[0], args[1]),
        Op::Binary(b) => {
            let (x, y) = (floats(args[0]), floats(args[1]));
            let (ix, iy) = (values::offsets(args[0].shape(), &out.shape), values::offsets(args[1].shape(), &out.shape));
            let v = ix.zip(iy).map(|(i, j)| apply_binary(*b, x[i], y[j])).collect();
            Ok(Tensor::from_f32(out.shape.clone(), v).cast(out.dtype))
        }
        Op::Unary(u) => {
            Ok(Tensor::from_f32(out.shape.clone(), floats(args[0]).into_iter().map(|x| apply_unary(*u, x)).collect()).cast(out.dtype))
        }
        Op::Slice { axes, starts, steps, .. } => {
            let shape = args[0].shape();
            let (mut start, mut step) = (vec![0i64; shape.len()], vec![1i64; shape.len()]);
            for (k, &a) in axes.iter().enumerate() {
                start[a] = starts[k];
                step[a] = steps[k];
            }
            Ok(Tensor::take(args[0], &strided(shape, &out.shape, |d, i| (start[d] + i as i64 * step[d]) as usize), out.shape.clone()))
        }
        Op::Transpose { perm } => {
            let shape = args[0].shape();
            // Output dim d walks input dim perm[d].
            let mut src_stride = vec![1usize; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                src_stride[d] = src_stride[d + 1] * shape[d + 1];
            }
            let st: Vec<usize> = perm.iter().map(|&p| src_stride[p]).collect();
            let order = (0..out.numel()).map(|flat| crate::index::offset(flat, &out.shape, &st)).collect::<Vec<_>>();
            Ok(Tensor::take(args[0], &order, out.shape.clone()))
        }
        Op::Expand { .. } => {
            let order: Vec<usize> = values::offsets(args[0].shape(), &out.shape).collect();
            Ok(Tensor::take(args[0], &order, out.shape.clone()))
        }
        _ => return None,
    })
}

/// ONNX `Mod`: the remainder with the divisor's sign (`fmod` false, integers
/// only) or the dividend's (`fmod` true, C's fmod).
pub fn modulo(a: &Tensor, b: &Tensor, fmod: bool) -> Result<Tensor, String> {
    if a.ty().dtype != b.ty().dtype {
        return Err(format!("Mod of {} and {}", a.ty(), b.ty()));
    }
    if a.ty().dtype.is_float() {
        if !fmod {
            return Err("invalid ONNX: Mod of floats needs fmod=1".into());
        }
        let shape = broadcast(a.shape(), b.shape()).ok_or("shapes do not broadcast")?;
        let (x, y) = (a.to_f32_vec(), b.to_f32_vec());
        let (ix, iy) = (values::offsets(a.shape(), &shape), values::offsets(b.shape(), &shape));
        let v = ix.zip(iy).map(|(i, j)| x[i] % y[j]).collect();
        return Ok(Tensor::from_f32(shape, v).cast(a.ty().dtype));
    }
    int_binary(
        a,
        b,
        if fmod { |x, y| x.checked_rem(y) } else { |x, y| x.checked_rem_euclid(y).map(|r| if r != 0 && y < 0 { r + y } else { r }) },
    )
}

/// ONNX `Range` of scalar constants: `start, start + delta, ...` while before `limit`.
pub fn range(start: &Tensor, limit: &Tensor, delta: &Tensor) -> Result<Tensor, String> {
    let dtype = start.ty().dtype;
    if [limit, delta].iter().any(|t| t.ty().dtype != dtype) || [start, limit, delta].iter().any(|t| t.ty().numel() != 1) {
        return Err(format!("Range takes three scalars of one dtype, got {}, {}, {}", start.ty(), limit.ty(), delta.ty()));
    }
    let f = |t: &Tensor| t.to_f32_vec()[0] as f64;
    let (s, l, d) = if dtype.is_float() {
        (f(start), f(limit), f(delta))
    } else {
        (start.to_i64_vec()[0] as f64, limit.to_i64_vec()[0] as f64, delta.to_i64_vec()[0] as f64)
    };
    if d == 0.0 {
        return Err("Range with delta 0".into());
    }
    let n = ((l - s) / d).ceil().max(0.0);
    // Shape arithmetic: positions and indices, never millions of them.
    if n.is_nan() || n > (1u64 << 24) as f64 {
        return Err(format!("{}Range of {n} elements", crate::error::TOO_LARGE));
    }
    let n = n as usize;
    Ok(if dtype.is_float() {
        Tensor::from_f32(vec![n], (0..n).map(|i| (s + i as f64 * d) as f32).collect()).cast(dtype)
    } else {
        let (s, d) = (start.to_i64_vec()[0], delta.to_i64_vec()[0]);
        Tensor::from_i64(vec![n], (0..n as i64).map(|i| s + i * d).collect()).cast(dtype)
    })
}

/// ONNX `GatherElements` of constants: `out[i][j][k] = data[index[i][j][k]][j][k]` along `axis`.
pub fn gather_elements(data: &Tensor, indices: &Tensor, axis: usize) -> Result<Tensor, String> {
    let (ds, is) = (data.shape(), indices.shape());
    if ds.len() != is.len() || axis >= ds.len() {
        return Err(format!("GatherElements of {} by {}", data.ty(), indices.ty()));
    }
    let idx = indices.to_i64_vec();
    let mut order = Vec::with_capacity(idx.len());
    let mut coord = vec![0usize; is.len()];
    for (k, &raw) in idx.iter().enumerate() {
        crate::index::unravel(k, is, &mut coord);
        let e = ds[axis] as i64;
        let v = if raw < 0 { raw + e } else { raw };
        if !(0..e).contains(&v) {
            return Err(format!("index {raw} out of range for extent {e}"));
        }
        coord[axis] = v as usize;
        let mut flat = 0;
        for d in 0..ds.len() {
            if coord[d] >= ds[d] {
                return Err(format!("indices {} do not fit data {}", indices.ty(), data.ty()));
            }
            flat = flat * ds[d] + coord[d];
        }
        order.push(flat);
    }
    Ok(Tensor::take(data, &order, is.to_vec()))
}
