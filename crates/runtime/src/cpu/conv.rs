//! Convolution by im2col and a blocked GEMM (matrixmultiply), per image and
//! group, for any number of spatial dims.

use super::f32s;
use super::matmul::sgemm;
use smelt_ir::{Conv, Tensor, TensorType};

/// Geometry of a window over an `[N, C, *spatial]` input, any number of
/// spatial dims: for each dim d, `tap[d][k * out[d] + o]` is the input
/// coordinate read by output coordinate o at kernel offset k, or `None` in
/// the padding.
pub(crate) struct Window {
    /// Channels.
    pub c: usize,
    /// Input spatial extents.
    pub input: Vec<usize>,
    /// Kernel extents.
    pub kernel: Vec<usize>,
    /// Output spatial extents.
    pub out: Vec<usize>,
    tap: Vec<Vec<Option<usize>>>,
}

impl Window {
    /// `pads` is all begins then all ends.
    pub fn new(x: &[usize], out: &[usize], kernel: &[usize], strides: &[usize], dil: &[usize], pads: &[usize]) -> Result<Window, String> {
        let n = x.len().checked_sub(2).filter(|&n| n >= 1).ok_or_else(|| format!("a window needs spatial dims, got rank {}", x.len()))?;
        let tap = (0..n)
            .map(|d| {
                let (len, o) = (x[2 + d], out[2 + d]);
                let mut t = Vec::with_capacity(kernel[d] * o);
                for k in 0..kernel[d] {
                    for i in 0..o {
                        let at = (i * strides[d] + k * dil[d]).checked_sub(pads[d]);
                        t.push(at.filter(|&a| a < len));
                    }
                }
                t
            })
            .collect();
        Ok(Window { c: x[1], input: x[2..].to_vec(), kernel: kernel.to_vec(), out: out[2..].to_vec(), tap })
    }

    /// Input positions per image plane.
    pub fn in_size(&self) -> usize {
        self.input.iter().product()
    }

    /// Output positions per image plane.
    pub fn out_size(&self) -> usize {
        self.out.iter().product()
    }

    /// Kernel offsets.
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// Calls `f(output position, flat input position or None)` for every
    /// output position at kernel offset `tap` (flat, row-major).
    pub fn for_tap(&self, tap: usize, mut f: impl FnMut(usize, Option<usize>)) {
        let n = self.input.len();
        let mut k = vec![0; n];
        smelt_ir::index::unravel(tap, &self.kernel, &mut k);
        let mut in_stride = vec![1; n];
        for d in (0..n.saturating_sub(1)).rev() {
            in_stride[d] = in_stride[d + 1] * self.input[d + 1];
        }
        let last = n - 1;
        let row = &self.tap[last][k[last] * self.out[last]..][..self.out[last]];
        let mut o = vec![0; n];
        let mut pos = 0;
        if self.out_size() == 0 {
            return;
        }
        loop {
            // The outer dims' contribution, or None in their padding.
            let mut base = Some(0);
            for d in 0..last {
                base = match (base, self.tap[d][k[d] * self.out[d] + o[d]]) {
                    (Some(b), Some(a)) => Some(b + a * in_stride[d]),
                    _ => None,
                };
            }
            for &t in row {
                f(pos, base.and_then(|b| t.map(|a| b + a)));
                pos += 1;
            }
            let mut d = last;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                o[d] += 1;
                if o[d] < self.out[d] {
                    break;
                }
                o[d] = 0;
            }
        }
    }
}

pub(crate) fn conv(c: &Conv, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &TensorType) -> Result<Vec<f32>, String> {
    let (xs, ws) = (x.shape(), w.shape());
    let win = Window::new(xs, &out.shape, &ws[2..], &c.strides, &c.dilations, &c.pads)?;
    let (n, m, g) = (xs[0], ws[0], c.group);
    let (cg, mg) = (win.c / g, m / g);
    let k = cg * win.taps();
    let plane = win.out_size();
    let (xv, wv) = (f32s(x), f32s(w));
    let mut y = vec![0f32; n * m * plane];
    if let Some(b) = bias {
        let bv = f32s(b);
        for (i, chunk) in y.chunks_mut(plane).enumerate() {
            chunk.fill(bv[i % m]);
        }
    }
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    let direct = win.taps() == 1 && c.strides.iter().all(|&s| s == 1) && c.pads.iter().all(|&p| p == 0);
    let mut col = if direct { Vec::new() } else { vec![0f32; k * plane] };
    for b in 0..n {
        for gi in 0..g {
            let isz = win.in_size();
            let xin = &xv[(b * win.c + gi * cg) * isz..][..cg * isz];
            let cols: &[f32] = if direct {
                xin
            } else {
                im2col(&win, cg, xin, &mut col);
                &col
            };
            let wg = &wv[gi * mg * k..][..mg * k];
            let yg = &mut y[(b * m + gi * mg) * plane..][..mg * plane];
            // yg[mg, plane] = wg[mg, k] * cols[k, plane] + beta * yg
            sgemm(mg, k, plane, 1.0, wg, (k, 1), cols, (plane, 1), beta, yg);
        }
    }
    Ok(y)
}

/// Unfolds `cg` channels of one image into `col[cg*taps, out positions]`.
fn im2col(win: &Window, cg: usize, x: &[f32], col: &mut [f32]) {
    let (plane, taps, isz) = (win.out_size(), win.taps(), win.in_size());
    for ci in 0..cg {
        let xc = &x[ci * isz..][..isz];
        for t in 0..taps {
            let row = &mut col[(ci * taps + t) * plane..][..plane];
            win.for_tap(t, |o, i| row[o] = i.map_or(0.0, |i| xc[i]));
        }
    }
}
