//! Elementwise ops with numpy broadcasting.

use super::f32s;
use smelt_ir::{BinaryOp, Tensor, UnaryOp};
use std::sync::Arc;

pub(crate) fn unary(u: UnaryOp, x: &[f32]) -> Vec<f32> {
    let f: Box<dyn Fn(f32) -> f32> = match u {
        UnaryOp::Relu => Box::new(|x| x.max(0.0)),
        UnaryOp::Sigmoid => Box::new(|x| 1.0 / (1.0 + (-x).exp())),
        UnaryOp::Tanh => Box::new(f32::tanh),
        UnaryOp::Erf => Box::new(erf),
        UnaryOp::Sqrt => Box::new(f32::sqrt),
        UnaryOp::Exp => Box::new(f32::exp),
        UnaryOp::Log => Box::new(f32::ln),
        UnaryOp::Neg => Box::new(|x| -x),
        UnaryOp::Abs => Box::new(f32::abs),
        UnaryOp::Reciprocal => Box::new(f32::recip),
        UnaryOp::Sign => Box::new(|x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }),
        UnaryOp::Softplus => Box::new(|x| if x > 20.0 { x } else { x.exp().ln_1p() }),
        UnaryOp::LeakyRelu(a) => Box::new(move |x| if x >= 0.0 { x } else { a * x }),
        UnaryOp::Elu(a) => Box::new(move |x| if x >= 0.0 { x } else { a * x.exp_m1() }),
        UnaryOp::Selu(a, g) => Box::new(move |x| g * if x > 0.0 { x } else { a * x.exp_m1() }),
    };
    x.iter().map(|&v| f(v)).collect()
}

/// erf in f64 (Abramowitz-Stegun 7.1.26 is too coarse for a reference):
/// a series for small |x|, a continued fraction for the tail.
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, x2) = (ax, ax, ax * ax);
        for n in 1..60 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction (Lentz), converges fast for x >= 2.5.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f)
    };
    (r.copysign(x)) as f32
}

fn apply(b: BinaryOp) -> fn(f32, f32) -> f32 {
    match b {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
        BinaryOp::Pow => f32::powf,
        BinaryOp::Max => f32::max,
        BinaryOp::Min => f32::min,
        BinaryOp::PRelu => |a, s| if a >= 0.0 { a } else { s * a },
    }
}

/// Element strides of `shape` broadcast to `full` (0 along broadcast dims).
fn bstrides(shape: &[usize], full: &[usize]) -> Vec<usize> {
    let mut st = vec![0; full.len()];
    let mut s = 1;
    for d in (0..shape.len()).rev() {
        let fd = d + full.len() - shape.len();
        st[fd] = if shape[d] == 1 { 0 } else { s };
        s *= shape[d];
    }
    st
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
    let f = apply(b);
    let (xv, yv) = (f32s(x), f32s(y));
    if x.shape() == full && y.shape() == full {
        return xv.iter().zip(yv.iter()).map(|(&a, &b)| f(a, b)).collect();
    }
    let mut out = vec![0f32; full.iter().product()];
    for_each2(
        full,
        &bstrides(x.shape(), full),
        &bstrides(y.shape(), full),
        |o, i, j| out[o] = f(xv[i], yv[j]),
    );
    out
}

pub(crate) fn sum(args: &[Arc<Tensor>], full: &[usize]) -> Vec<f32> {
    let mut acc = vec![0f32; full.iter().product()];
    let zero = vec![0; full.len()];
    for a in args {
        let av = f32s(a);
        for_each2(full, &zero, &bstrides(a.shape(), full), |o, _, j| {
            acc[o] += av[j]
        });
    }
    acc
}

#[cfg(test)]
mod tests {
    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
            (3.0, 0.999_977_9),
            (-1.0, -0.842_700_8),
        ] {
            assert!(
                (super::erf(x) - want).abs() < 1e-6,
                "erf({x}) = {} not {want}",
                super::erf(x)
            );
        }
    }
}
