//! Exact elementwise semantics of the ops whose results are not floats
//! (comparisons, boolean functions, `where`, integer arithmetic), on tensors
//! of any dtype. The reference executor runs them and ONNX import folds
//! constants with them, so both agree by construction: integers compare
//! and compute as integers, never through f32.

use crate::infer::broadcast_strides;
use crate::op::{apply_binary, BinaryOp, CompareOp, LogicOp};
use crate::tensor::{Tensor, TensorData};

/// For each flat index of `full` in order, the flat index in `shape`
/// broadcast to it (an iterator: no scratch beyond the output).
pub(crate) fn offsets(shape: &[usize], full: &[usize]) -> Offsets {
    Offsets { st: broadcast_strides(shape, full), full: full.to_vec(), idx: vec![0; full.len()], off: 0, left: full.iter().product() }
}

/// See [`offsets`].
pub(crate) struct Offsets {
    st: Vec<usize>,
    full: Vec<usize>,
    idx: Vec<usize>,
    off: usize,
    left: usize,
}

impl Iterator for Offsets {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let here = self.off;
        // Odometer, innermost first.
        for d in (0..self.full.len()).rev() {
            self.idx[d] += 1;
            self.off += self.st[d];
            if self.idx[d] < self.full[d] {
                break;
            }
            self.off -= self.st[d] * self.full[d];
            self.idx[d] = 0;
        }
        Some(here)
    }
}

/// The broadcast shape of `shapes` (checked by inference before any run).
fn full_shape(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    shapes.iter().skip(1).try_fold(shapes[0].to_vec(), |acc, s| {
        crate::infer::broadcast(&acc, s).ok_or_else(|| format!("shapes {acc:?} and {s:?} do not broadcast"))
    })
}

/// Elements as f64 (floats exactly) or i64 (integers and bools exactly).
enum Nums {
    F(Vec<f64>),
    I(Vec<i64>),
}

fn nums(t: &Tensor) -> Nums {
    if t.ty().dtype.is_float() {
        Nums::F(t.to_f32_vec().into_iter().map(f64::from).collect())
    } else {
        Nums::I(t.to_i64_vec())
    }
}

fn bools(t: &Tensor) -> Vec<bool> {
    match t.data() {
        TensorData::Bool(v) => v.clone(),
        _ => t.to_i64_vec().into_iter().map(|x| x != 0).collect(),
    }
}

/// `a <c> b` with broadcasting; a bool tensor.
pub fn compare(c: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let full = full_shape(&[a.shape(), b.shape()])?;
    let pairs = offsets(a.shape(), &full).zip(offsets(b.shape(), &full));
    let out: Vec<bool> = match (nums(a), nums(b)) {
        (Nums::I(x), Nums::I(y)) => pairs.map(|(i, j)| c.apply(x[i], y[j])).collect(),
        (Nums::F(x), Nums::F(y)) => pairs.map(|(i, j)| c.apply(x[i], y[j])).collect(),
        _ => return Err(format!("cannot compare {} with {}", a.ty(), b.ty())),
    };
    Ok(Tensor::new(full, TensorData::Bool(out)).expect("count matches"))
}

/// `a <l> b` on bools with broadcasting.
pub fn logic(l: LogicOp, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let full = full_shape(&[a.shape(), b.shape()])?;
    let (x, y) = (bools(a), bools(b));
    let out = offsets(a.shape(), &full).zip(offsets(b.shape(), &full)).map(|(i, j)| l.apply(x[i], y[j])).collect();
    Ok(Tensor::new(full, TensorData::Bool(out)).expect("count matches"))
}

/// Boolean negation.
pub fn not(a: &Tensor) -> Tensor {
    Tensor::new(a.shape().to_vec(), TensorData::Bool(bools(a).into_iter().map(|b| !b).collect())).expect("count matches")
}

/// Whether each element is NaN (false for integers).
pub fn is_nan(a: &Tensor) -> Tensor {
    let v = match nums(a) {
        Nums::F(v) => v.into_iter().map(f64::is_nan).collect(),
        Nums::I(v) => vec![false; v.len()],
    };
    Tensor::new(a.shape().to_vec(), TensorData::Bool(v)).expect("count matches")
}

/// `x` where `cond`, else `y`, all broadcast; the dtype of `x` and `y`.
pub fn select(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor, String> {
    if x.ty().dtype != y.ty().dtype {
        return Err(format!("where of {} and {}", x.ty(), y.ty()));
    }
    let full = full_shape(&[cond.shape(), x.shape(), y.shape()])?;
    let c = bools(cond);
    // x's elements then y's, each output element taking one of them.
    let both = x.concat_flat(y).expect("dtypes checked equal");
    let xn = x.ty().numel();
    let order: Vec<usize> = offsets(cond.shape(), &full)
        .zip(offsets(x.shape(), &full))
        .zip(offsets(y.shape(), &full))
        .map(|((k, i), j)| if c[k] { i } else { xn + j })
        .collect();
    Ok(both.take(&order, full))
}

/// Integer arithmetic as ONNX defines it on integer tensors: wrapping on
/// overflow, division truncating toward zero, `pow` by repeated squaring.
/// Division by zero is an error (ONNX leaves it undefined).
pub fn int_binary(b: BinaryOp, x: &Tensor, y: &Tensor) -> Result<Tensor, String> {
    let dtype = x.ty().dtype;
    let full = full_shape(&[x.shape(), y.shape()])?;
    let (xv, yv) = (x.to_i64_vec(), y.to_i64_vec());
    let f = |a: i64, c: i64| -> Result<i64, String> {
        Ok(match b {
            BinaryOp::Add => a.wrapping_add(c),
            BinaryOp::Sub => a.wrapping_sub(c),
            BinaryOp::Mul => a.wrapping_mul(c),
            BinaryOp::Div => a.checked_div(c).ok_or("integer division by zero")?,
            BinaryOp::Pow => a.wrapping_pow(u32::try_from(c).map_err(|_| format!("integer power {c}"))?),
            BinaryOp::Max => a.max(c),
            BinaryOp::Min => a.min(c),
            BinaryOp::PRelu => apply_binary(b, a as f32, c as f32) as i64,
        })
    };
    let out =
        offsets(x.shape(), &full).zip(offsets(y.shape(), &full)).map(|(i, j)| f(xv[i], yv[j])).collect::<Result<Vec<i64>, String>>()?;
    let t = Tensor::new(full, TensorData::I64(out)).expect("count matches");
    // Narrower results wrap as their own arithmetic would.
    Ok(t.cast(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_compare_exactly() {
        // 2^53 + 1 and 2^53 are equal as f32 and as f64, not as integers.
        let a = Tensor::from_i64(vec![2], vec![(1 << 53) + 1, 3]);
        let b = Tensor::from_i64(vec![1], vec![1 << 53]);
        let eq = compare(CompareOp::Equal, &a, &b).unwrap();
        assert_eq!(eq.data(), &TensorData::Bool(vec![false, false]));
        let gt = compare(CompareOp::Greater, &a, &b).unwrap();
        assert_eq!(gt.data(), &TensorData::Bool(vec![true, false]));
    }

    #[test]
    fn select_broadcasts_all_three() {
        let c = Tensor::new(vec![2, 1], TensorData::Bool(vec![true, false])).unwrap();
        let x = Tensor::from_f32(vec![1, 3], vec![1.0, 2.0, 3.0]);
        let y = Tensor::from_f32(vec![1], vec![-1.0]);
        let w = select(&c, &x, &y).unwrap();
        assert_eq!(w.shape(), &[2, 3]);
        assert_eq!(w.to_f32_vec(), vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
    }

    #[test]
    fn integer_arithmetic_is_exact() {
        let a = Tensor::from_i64(vec![2], vec![(1 << 40) + 1, -7]);
        let b = Tensor::from_i64(vec![1], vec![2]);
        assert_eq!(int_binary(BinaryOp::Add, &a, &b).unwrap().to_i64_vec(), vec![(1 << 40) + 3, -5]);
        assert_eq!(int_binary(BinaryOp::Div, &a, &b).unwrap().to_i64_vec(), vec![(1 << 39), -3]);
        assert!(int_binary(BinaryOp::Div, &a, &Tensor::from_i64(vec![1], vec![0])).is_err());
    }
}
