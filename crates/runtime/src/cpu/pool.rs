//! Max and average pooling (any number of spatial dims), global average pooling.

use super::conv::Window;
use super::f32s;
use smelt_ir::{Pool, Tensor, TensorType};

/// `avg` is `None` for max pooling, else `Some(count_include_pad)`.
pub(crate) fn pool(p: &Pool, x: &Tensor, out: &TensorType, avg: Option<bool>) -> Result<Vec<f32>, String> {
    let xs = x.shape();
    let n = p.kernel.len();
    let ones = vec![1; n];
    let win = Window::new(xs, &out.shape, &p.kernel, &p.strides, &ones, &p.pads)?;
    let xv = f32s(x);
    let (planes, isz, osz) = (xs[0] * xs[1], win.in_size(), win.out_size());
    let init = if avg.is_some() { 0.0 } else { f32::NEG_INFINITY };
    let mut y = vec![init; planes * osz];
    let mut count = vec![0u32; osz];
    for pl in 0..planes {
        let xp = &xv[pl * isz..][..isz];
        let yp = &mut y[pl * osz..][..osz];
        count.iter_mut().for_each(|c| *c = 0);
        for t in 0..win.taps() {
            win.for_tap(t, |o, i| {
                if let Some(i) = i {
                    yp[o] = if avg.is_some() { yp[o] + xp[i] } else { smelt_ir::max_nan(yp[o], xp[i]) };
                    count[o] += 1;
                }
            });
        }
        if let Some(include_pad) = avg {
            let div = divisors(p, &win, include_pad, &count);
            yp.iter_mut().zip(&div).for_each(|(v, d)| *v /= d);
        }
    }
    Ok(y)
}

/// Each output position's divisor in average pooling: the window's
/// elements inside the input (`count`, per output position) or, counting
/// padding, the window clipped to the padded input.
pub(crate) fn divisors(p: &Pool, win: &Window, include_pad: bool, count: &[u32]) -> Vec<f32> {
    if !include_pad {
        return count.iter().map(|&c| c.max(1) as f32).collect();
    }
    let n = p.kernel.len();
    let spans: Vec<Vec<f32>> = (0..n)
        .map(|d| {
            (0..win.out[d])
                .map(|o| {
                    let start = (o * p.strides[d]) as isize - p.pads[d] as isize;
                    let end = (start + p.kernel[d] as isize).min((win.input[d] + p.pads[n + d]) as isize);
                    (end - start).max(1) as f32
                })
                .collect()
        })
        .collect();
    (0..win.out_size())
        .map(|o| {
            let (mut rem, mut div) = (o, 1.0);
            for d in (0..n).rev() {
                div *= spans[d][rem % win.out[d]];
                rem /= win.out[d];
            }
            div
        })
        .collect()
}

pub(crate) fn global_avg(x: &Tensor) -> Vec<f32> {
    let xs = x.shape();
    let planes = xs[0] * xs[1];
    let size: usize = xs[2..].iter().product();
    let xv = f32s(x);
    (0..planes).map(|p| xv[p * size..][..size].iter().map(|&v| v as f64).sum::<f64>() as f32 / size as f32).collect()
}
