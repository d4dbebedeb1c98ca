//! Backward ops (convolution, pooling and LRN gradients) and optimizer
//! updates: the reference semantics their kernels follow.

use super::conv::Window;
use super::f32s;
use super::matmul::sgemm;
use super::pool::divisors;
use smelt_ir::{Conv, Optimizer, Pool, Tensor, TensorType};

/// dx of a convolution: `W^T dy` per image and group, folded back (col2im).
pub(crate) fn conv_grad_data(c: &Conv, dy: &Tensor, w: &Tensor, out: &TensorType) -> Result<Vec<f32>, String> {
    let (xs, ws) = (&out.shape, w.shape());
    let win = Window::new(xs, dy.shape(), &ws[2..], &c.strides, &c.dilations, &c.pads)?;
    let (n, m, g) = (xs[0], ws[0], c.group);
    let (cg, mg) = (win.c / g, m / g);
    let (k, plane, taps, isz) = (cg * win.taps(), win.out_size(), win.taps(), win.in_size());
    let (dyv, wv) = (f32s(dy), f32s(w));
    let mut dx = vec![0f32; out.numel()];
    let mut col = vec![0f32; k * plane];
    for b in 0..n {
        for gi in 0..g {
            let wg = &wv[gi * mg * k..][..mg * k];
            let dyg = &dyv[(b * m + gi * mg) * plane..][..mg * plane];
            // col[k, plane] = wg^T[k, mg] dyg[mg, plane]
            sgemm(k, mg, plane, 1.0, wg, (1, k), dyg, (plane, 1), 0.0, &mut col);
            let dxg = &mut dx[(b * win.c + gi * cg) * isz..][..cg * isz];
            for ci in 0..cg {
                let dxc = &mut dxg[ci * isz..][..isz];
                for t in 0..taps {
                    let row = &col[(ci * taps + t) * plane..][..plane];
                    win.for_tap(t, |o, i| {
                        if let Some(i) = i {
                            dxc[i] += row[o];
                        }
                    });
                }
            }
        }
    }
    Ok(dx)
}

/// dW of a convolution: `dy cols^T` summed over images, per group.
pub(crate) fn conv_grad_weight(c: &Conv, x: &Tensor, dy: &Tensor, out: &TensorType) -> Result<Vec<f32>, String> {
    let (xs, ws) = (x.shape(), &out.shape);
    let win = Window::new(xs, dy.shape(), &ws[2..], &c.strides, &c.dilations, &c.pads)?;
    let (n, m, g) = (xs[0], ws[0], c.group);
    let (cg, mg) = (win.c / g, m / g);
    let (k, plane, taps, isz) = (cg * win.taps(), win.out_size(), win.taps(), win.in_size());
    let (xv, dyv) = (f32s(x), f32s(dy));
    let mut dw = vec![0f32; out.numel()];
    let mut col = vec![0f32; k * plane];
    for b in 0..n {
        for gi in 0..g {
            let xin = &xv[(b * win.c + gi * cg) * isz..][..cg * isz];
            for ci in 0..cg {
                let xc = &xin[ci * isz..][..isz];
                for t in 0..taps {
                    let row = &mut col[(ci * taps + t) * plane..][..plane];
                    win.for_tap(t, |o, i| row[o] = i.map_or(0.0, |i| xc[i]));
                }
            }
            let dyg = &dyv[(b * m + gi * mg) * plane..][..mg * plane];
            let dwg = &mut dw[gi * mg * k..][..mg * k];
            // dwg[mg, k] += dyg[mg, plane] col^T[plane, k]
            sgemm(mg, plane, k, 1.0, dyg, (plane, 1), &col, (1, plane), 1.0, dwg);
        }
    }
    Ok(dw)
}

/// dx of max pooling: each output's gradient to its window's first maximum.
pub(crate) fn max_pool_grad(p: &Pool, x: &Tensor, dy: &Tensor) -> Result<Vec<f32>, String> {
    let xs = x.shape();
    let ones = vec![1; p.kernel.len()];
    let win = Window::new(xs, dy.shape(), &p.kernel, &p.strides, &ones, &p.pads)?;
    let (xv, dyv) = (f32s(x), f32s(dy));
    let (planes, isz, osz) = (xs[0] * xs[1], win.in_size(), win.out_size());
    let mut dx = vec![0f32; xv.len()];
    let mut best: Vec<(f32, Option<usize>)> = vec![(f32::NEG_INFINITY, None); osz];
    for pl in 0..planes {
        let xp = &xv[pl * isz..][..isz];
        best.iter_mut().for_each(|b| *b = (f32::NEG_INFINITY, None));
        for t in 0..win.taps() {
            win.for_tap(t, |o, i| {
                if let Some(i) = i {
                    if best[o].1.is_none() || xp[i] > best[o].0 {
                        best[o] = (xp[i], Some(i));
                    }
                }
            });
        }
        let dxp = &mut dx[pl * isz..][..isz];
        for (o, &(_, i)) in best.iter().enumerate() {
            if let Some(i) = i {
                dxp[i] += dyv[pl * osz + o];
            }
        }
    }
    Ok(dx)
}

/// dx of average pooling: each output's gradient spread over its window.
pub(crate) fn avg_pool_grad(p: &Pool, include_pad: bool, dy: &Tensor, out: &TensorType) -> Result<Vec<f32>, String> {
    let xs = &out.shape;
    let ones = vec![1; p.kernel.len()];
    let win = Window::new(xs, dy.shape(), &p.kernel, &p.strides, &ones, &p.pads)?;
    let dyv = f32s(dy);
    let (planes, isz, osz) = (xs[0] * xs[1], win.in_size(), win.out_size());
    let mut count = vec![0u32; osz];
    for t in 0..win.taps() {
        win.for_tap(t, |o, i| count[o] += u32::from(i.is_some()));
    }
    let div = divisors(p, &win, include_pad, &count);
    let mut dx = vec![0f32; out.numel()];
    for pl in 0..planes {
        let dyp = &dyv[pl * osz..][..osz];
        let dxp = &mut dx[pl * isz..][..isz];
        for t in 0..win.taps() {
            win.for_tap(t, |o, i| {
                if let Some(i) = i {
                    dxp[i] += dyp[o] / div[o];
                }
            });
        }
    }
    Ok(dx)
}

/// dx of a gather: each slice of `dy` added into the data's slice its index names.
pub(crate) fn gather_grad(indices: &Tensor, dy: &Tensor, axis: usize, out: &smelt_ir::TensorType) -> Result<Vec<f32>, String> {
    let s = &out.shape;
    let (outer, dim, inner) = (s[..axis].iter().product::<usize>(), s[axis], s[axis + 1..].iter().product::<usize>());
    let idx = indices.to_i64_vec();
    let dyv = f32s(dy);
    let mut dx = vec![0f32; out.numel()];
    for o in 0..outer {
        for (k, &i) in idx.iter().enumerate() {
            let j = if i < 0 { i + dim as i64 } else { i };
            if !(0..dim as i64).contains(&j) {
                return Err(format!("index {i} out of range for axis {axis} of extent {dim}"));
            }
            for c in 0..inner {
                dx[(o * dim + j as usize) * inner + c] += dyv[(o * idx.len() + k) * inner + c];
            }
        }
    }
    Ok(dx)
}

/// dx of LRN: `y_i = x_i s_i^-beta`, `s_i = bias + alpha/size sum x_k^2`
/// over the channel window of i, so `dx_j = dy_j s_j^-beta - 2 alpha beta /
/// size x_j sum dy_i x_i s_i^(-beta-1)` over the windows holding j.
pub(crate) fn lrn_grad(x: &Tensor, dy: &Tensor, &smelt_ir::Lrn { size, alpha, beta, bias }: &smelt_ir::Lrn) -> Vec<f32> {
    let xs = x.shape();
    let (n, c) = (xs[0], xs[1]);
    let inner: usize = xs[2..].iter().product();
    let (xv, dyv) = (f32s(x), f32s(dy));
    let (lo, hi) = ((size - 1) / 2, size / 2);
    let mut dx = vec![0f32; xv.len()];
    let (mut s, mut t) = (vec![0f64; c], vec![0f64; c]);
    for b in 0..n {
        for i in 0..inner {
            let at = |ch: usize| (b * c + ch) * inner + i;
            for ch in 0..c {
                let sq: f64 = (ch.saturating_sub(lo)..=(ch + hi).min(c - 1)).map(|k| (xv[at(k)] as f64).powi(2)).sum();
                s[ch] = bias as f64 + alpha as f64 / size as f64 * sq;
                t[ch] = dyv[at(ch)] as f64 * xv[at(ch)] as f64 * s[ch].powf(-beta as f64 - 1.0);
            }
            for j in 0..c {
                let sum: f64 = (j.saturating_sub(hi)..=(j + lo).min(c - 1)).map(|k| t[k]).sum();
                let g =
                    dyv[at(j)] as f64 * s[j].powf(-beta as f64) - 2.0 * alpha as f64 * beta as f64 / size as f64 * xv[at(j)] as f64 * sum;
                dx[at(j)] = g as f32;
            }
        }
    }
    dx
}

/// One optimizer step: the new parameter, then the new state tensors, as
/// PyTorch's `torch.optim` computes them (bias corrections in f64). With
/// accumulation, a micro-step that does not apply only adds its gradient
/// into the accumulator.
pub(crate) fn update(o: &Optimizer, args: &[std::sync::Arc<Tensor>]) -> Vec<Vec<f32>> {
    let t = f32s(&args[if *o == Optimizer::Count { 0 } else { 2 }])[0];
    if *o == Optimizer::Count {
        return vec![vec![t + 1.0]];
    }
    if let Optimizer::Ema { momentum } = *o {
        let (p, g) = (f32s(&args[0]), f32s(&args[1]));
        return vec![p.iter().zip(g.iter()).map(|(&p, &g)| momentum * g + (1.0 - momentum) * p).collect()];
    }
    let k = o.accumulate().max(1);
    let (mut p, g) = (f32s(&args[0]).into_owned(), f32s(&args[1]).into_owned());
    let mut states: Vec<Vec<f32>> = args[3..].iter().map(|a| f32s(a).into_owned()).collect();
    // The micro-step index and, when it applies, the optimizer's step (1-based).
    let micro = t as u64;
    let g = if k > 1 {
        let acc = &mut states[0];
        if (micro + 1) % k as u64 != 0 {
            acc.iter_mut().zip(&g).for_each(|(a, g)| *a += g);
            let mut out = vec![p];
            out.extend(states);
            return out;
        }
        let mean: Vec<f32> = acc.iter().zip(&g).map(|(a, g)| (a + g) / k as f32).collect();
        acc.iter_mut().for_each(|a| *a = 0.0);
        mean
    } else {
        g
    };
    let step = (micro / k as u64 + 1) as f64;
    let first = step == 1.0;
    let lr = o.lr_at(micro / k as u64);
    let own = usize::from(k > 1);
    match *o {
        Optimizer::Sgd { momentum, dampening, nesterov, weight_decay, .. } => {
            for i in 0..p.len() {
                let mut d = g[i] + weight_decay * p[i];
                if momentum != 0.0 {
                    let buf = &mut states[own];
                    buf[i] = if first { d } else { momentum * buf[i] + (1.0 - dampening) * d };
                    d = if nesterov { d + momentum * buf[i] } else { buf[i] };
                }
                p[i] -= lr * d;
            }
        }
        Optimizer::Adam { beta1, beta2, eps, weight_decay, decoupled, .. } => {
            let bc1 = 1.0 - (beta1 as f64).powf(step);
            let bc2_sqrt = (1.0 - (beta2 as f64).powf(step)).sqrt() as f32;
            let step_size = (lr as f64 / bc1) as f32;
            let (m, v) = states[own..].split_at_mut(1);
            let (m, v) = (&mut m[0], &mut v[0]);
            for i in 0..p.len() {
                let mut d = g[i];
                if decoupled {
                    p[i] *= 1.0 - lr * weight_decay;
                } else {
                    d += weight_decay * p[i];
                }
                m[i] += (d - m[i]) * (1.0 - beta1);
                v[i] = v[i] * beta2 + (1.0 - beta2) * d * d;
                let denom = v[i].sqrt() / bc2_sqrt + eps;
                p[i] -= step_size * m[i] / denom;
            }
        }
        Optimizer::Ema { .. } | Optimizer::Count => unreachable!("handled above"),
    }
    let mut out = vec![p];
    out.extend(states);
    out
}
