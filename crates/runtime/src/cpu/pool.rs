//! Max and average pooling (1-D and 2-D), global average pooling.

use super::conv::Window;
use super::f32s;
use smelt_ir::{Pool, Tensor, TensorType};

/// `avg` is `None` for max pooling, else `Some(count_include_pad)`.
pub(crate) fn pool(p: &Pool, x: &Tensor, out: &TensorType, avg: Option<bool>) -> Result<Vec<f32>, String> {
    let xs = x.shape();
    let ones = vec![1; p.kernel.len()];
    let win = Window::new(xs, &out.shape, &p.kernel, &p.strides, &ones, &p.pads)?;
    let n_sp = p.kernel.len();
    // Padding at the end, lifted to 2-D like `Window`.
    let (peh, pew) = if n_sp == 1 { (0, p.pads[1]) } else { (p.pads[2], p.pads[3]) };
    let xv = f32s(x);
    let planes = xs[0] * xs[1];
    let mut y = Vec::with_capacity(planes * win.oh * win.ow);
    for pl in 0..planes {
        let xp = &xv[pl * win.h * win.w..][..win.h * win.w];
        for oy in 0..win.oh {
            for ox in 0..win.ow {
                let (mut acc, mut cnt) = (if avg.is_some() { 0.0 } else { f32::NEG_INFINITY }, 0usize);
                for ky in 0..win.kh {
                    for kx in 0..win.kw {
                        if let Some((iy, ix)) = win.src(oy, ox, ky, kx) {
                            let v = xp[iy * win.w + ix];
                            acc = if avg.is_some() { acc + v } else { acc.max(v) };
                            cnt += 1;
                        }
                    }
                }
                let v = match avg {
                    None => acc,
                    Some(false) => acc / cnt.max(1) as f32,
                    Some(true) => {
                        // Divisor: the window clipped to the padded input.
                        let span = |o: usize, s: usize, pb: usize, k: usize, len: usize, pe: usize| {
                            let start = (o * s) as isize - pb as isize;
                            let end = (start + k as isize).min((len + pe) as isize);
                            (end - start).max(1) as f32
                        };
                        acc / (span(oy, win.sh, win.ph, win.kh, win.h, peh) * span(ox, win.sw, win.pw, win.kw, win.w, pew))
                    }
                };
                y.push(v);
            }
        }
    }
    Ok(y)
}

pub(crate) fn global_avg(x: &Tensor) -> Vec<f32> {
    let xs = x.shape();
    let planes = xs[0] * xs[1];
    let size: usize = xs[2..].iter().product();
    let xv = f32s(x);
    (0..planes).map(|p| xv[p * size..][..size].iter().map(|&v| v as f64).sum::<f64>() as f32 / size as f32).collect()
}
