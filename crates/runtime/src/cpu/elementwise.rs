//! Elementwise ops with numpy broadcasting.

use super::f32s;
use smelt_ir::{apply_binary, apply_unary, BinaryOp, Expr, Tensor, UnaryOp};
use std::sync::Arc;

pub(crate) fn unary(u: UnaryOp, x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| apply_unary(u, v)).collect()
}

/// Calls `f(out_index, a_index, b_index)` over `full`, innermost dim in a tight loop.
fn for_each2(full: &[usize], sa: &[usize], sb: &[usize], mut f: impl FnMut(usize, usize, usize)) {
    let n: usize = full.iter().product();
    if n == 0 {
        return;
    }
    let r = full.len();
    if r == 0 {
        return f(0, 0, 0);
    }
    let inner = full[r - 1];
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    let mut idx = vec![0; r - 1];
    let (mut oa, mut ob) = (0, 0);
    let mut o = 0;
    loop {
        for j in 0..inner {
            f(o + j, oa + j * ia, ob + j * ib);
        }
        o += inner;
        // Odometer over the outer dims.
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            oa += sa[d];
            ob += sb[d];
            if idx[d] < full[d] {
                break;
            }
            oa -= sa[d] * full[d];
            ob -= sb[d] * full[d];
            idx[d] = 0;
        }
    }
}

pub(crate) fn binary(b: BinaryOp, x: &Tensor, y: &Tensor, full: &[usize]) -> Vec<f32> {
    let f = |x, y| apply_binary(b, x, y);
    let (xv, yv) = (f32s(x), f32s(y));
    if x.shape() == full && y.shape() == full {
        return xv.iter().zip(yv.iter()).map(|(&a, &b)| f(a, b)).collect();
    }
    let mut out = vec![0f32; full.iter().product()];
    for_each2(full, &smelt_ir::broadcast_strides(x.shape(), full), &smelt_ir::broadcast_strides(y.shape(), full), |o, i, j| {
        out[o] = f(xv[i], yv[j])
    });
    out
}

pub(crate) fn sum(args: &[Arc<Tensor>], full: &[usize]) -> Vec<f32> {
    let mut acc = vec![0f32; full.iter().product()];
    let zero = vec![0; full.len()];
    for a in args {
        let av = f32s(a);
        for_each2(full, &zero, &smelt_ir::broadcast_strides(a.shape(), full), |o, _, j| acc[o] += av[j]);
    }
    acc
}

/// Evaluates a fused elementwise expression element by element, reading
/// each input through its broadcast strides.
pub(crate) fn fused(expr: &Expr, args: &[Arc<Tensor>], full: &[usize]) -> Vec<f32> {
    let vals: Vec<_> = args.iter().map(|a| f32s(a)).collect();
    let strides: Vec<Vec<usize>> = args.iter().map(|a| smelt_ir::broadcast_strides(a.shape(), full)).collect();
    let n: usize = full.iter().product();
    let mut out = Vec::with_capacity(n);
    let (mut ins, mut scratch) = (vec![0f32; args.len()], Vec::new());
    let mut coord = vec![0usize; full.len()];
    for _ in 0..n {
        for (k, st) in strides.iter().enumerate() {
            ins[k] = vals[k][coord.iter().zip(st).map(|(c, s)| c * s).sum::<usize>()];
        }
        out.push(expr.eval(&ins, &mut scratch));
        smelt_ir::index::next_index(&mut coord, full);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn erf_matches_known_values() {
        for (x, want) in
            [(0.0f32, 0.0f32), (0.5, 0.520_499_9), (1.0, 0.842_700_8), (2.0, 0.995_322_3), (3.0, 0.999_977_9), (-1.0, -0.842_700_8)]
        {
            assert!((smelt_ir::erf(x) - want).abs() < 1e-6, "erf({x}) = {} not {want}", smelt_ir::erf(x));
        }
    }
}
