//! Normalizations and reductions: batch norm, layer norm, LRN, softmax,
//! reduce.

use super::f32s;
use smelt_ir::{ReduceOp, Tensor};
use std::sync::Arc;

pub(crate) fn batch_norm(args: &[Arc<Tensor>], eps: f32) -> Vec<f32> {
    let x = &args[0];
    let (s, b, m, v) = (f32s(&args[1]), f32s(&args[2]), f32s(&args[3]), f32s(&args[4]));
    let c = x.shape()[1];
    let inner: usize = x.shape()[2..].iter().product();
    let xv = f32s(x);
    let mut y = Vec::with_capacity(xv.len());
    for (i, chunk) in xv.chunks(inner.max(1)).enumerate() {
        let ch = i % c;
        let scale = s[ch] / (v[ch] + eps).sqrt();
        let shift = b[ch] - m[ch] * scale;
        y.extend(chunk.iter().map(|&x| x * scale + shift));
    }
    y
}

/// (outer, axis extent, inner) around `axis`.
fn split3(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

pub(crate) fn softmax(x: &Tensor, axis: usize, log: bool) -> Vec<f32> {
    let (outer, n, inner) = split3(x.shape(), axis);
    let xv = f32s(x);
    let mut y = vec![0f32; xv.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let max = (0..n).map(|k| xv[at(k)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = (0..n).map(|k| ((xv[at(k)] - max) as f64).exp()).sum();
            for k in 0..n {
                let z = (xv[at(k)] - max) as f64;
                y[at(k)] = if log { (z - sum.ln()) as f32 } else { (z.exp() / sum) as f32 };
            }
        }
    }
    y
}

pub(crate) fn layer_norm(args: &[Arc<Tensor>], axis: usize, eps: f32) -> Vec<f32> {
    let x = &args[0];
    let xs = x.shape();
    let inner: usize = xs[axis..].iter().product();
    let norm_shape = &xs[axis..];
    let xv = f32s(x);
    // Scale and bias broadcast to the normalised dims.
    let expand = |t: &Tensor| -> Vec<f32> {
        let v = f32s(t);
        (0..inner).map(|i| v[smelt_ir::broadcast_index(i, norm_shape, t.shape())]).collect()
    };
    let scale = expand(&args[1]);
    let bias = args.get(2).map(|b| expand(b)).unwrap_or_else(|| vec![0.0; inner]);
    let mut y = Vec::with_capacity(xv.len());
    for row in xv.chunks(inner.max(1)) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / inner as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        y.extend(row.iter().enumerate().map(|(i, &v)| ((v as f64 - mean) * inv) as f32 * scale[i] + bias[i]));
    }
    y
}

pub(crate) fn lrn(x: &Tensor, &smelt_ir::Lrn { size, alpha, beta, bias }: &smelt_ir::Lrn) -> Vec<f32> {
    let xs = x.shape();
    let (n, c) = (xs[0], xs[1]);
    let inner: usize = xs[2..].iter().product();
    let xv = f32s(x);
    let (lo, hi) = ((size - 1) / 2, size / 2);
    let mut y = vec![0f32; xv.len()];
    for b in 0..n {
        for ch in 0..c {
            for i in 0..inner {
                let from = ch.saturating_sub(lo);
                let to = (ch + hi).min(c - 1);
                let sq: f32 = (from..=to).map(|k| xv[(b * c + k) * inner + i].powi(2)).sum();
                let at = (b * c + ch) * inner + i;
                y[at] = xv[at] / (bias + alpha / size as f32 * sq).powf(beta);
            }
        }
    }
    y
}

pub(crate) fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize]) -> Vec<f32> {
    let xs = x.shape();
    let xv = f32s(x);
    // Output index of each input element: drop reduced coordinates.
    let kept: Vec<usize> = (0..xs.len()).filter(|d| !axes.contains(d)).collect();
    let out_n: usize = kept.iter().map(|&d| xs[d]).product();
    let count = (xv.len() / out_n.max(1)).max(1);
    let init = if op == ReduceOp::Max { f64::NEG_INFINITY } else { 0.0 };
    let mut acc = vec![init; out_n];
    let mut coord = vec![0; xs.len()];
    for &v in xv.iter() {
        let o = kept.iter().fold(0, |o, &d| o * xs[d] + coord[d]);
        acc[o] = if op != ReduceOp::Max {
            acc[o] + v as f64
        } else if acc[o].is_nan() || acc[o] > v as f64 {
            acc[o]
        } else {
            v as f64
        };
        smelt_ir::index::next_index(&mut coord, xs);
    }
    acc.into_iter().map(|a| if op == ReduceOp::Mean { (a / count as f64) as f32 } else { a as f32 }).collect()
}
