//! Convolution by im2col and a blocked GEMM (matrixmultiply), per image and
//! group. 1-D convolutions run as 2-D with height 1.

use super::f32s;
use super::matmul::sgemm;
use smelt_ir::{Conv, Tensor, TensorType};

/// Geometry of a 2-D window over an NCHW input.
pub(crate) struct Window {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub ph: usize,
    pub pw: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Window {
    /// Lifts 1-D or 2-D attributes to 2-D. `pads` is begins then ends.
    pub fn new(x: &[usize], out: &[usize], kernel: &[usize], strides: &[usize], dil: &[usize], pads: &[usize]) -> Result<Window, String> {
        match x.len() {
            3 => Ok(Window {
                c: x[1],
                h: 1,
                w: x[2],
                kh: 1,
                kw: kernel[0],
                sh: 1,
                sw: strides[0],
                dh: 1,
                dw: dil[0],
                ph: 0,
                pw: pads[0],
                oh: 1,
                ow: out[2],
            }),
            4 => Ok(Window {
                c: x[1],
                h: x[2],
                w: x[3],
                kh: kernel[0],
                kw: kernel[1],
                sh: strides[0],
                sw: strides[1],
                dh: dil[0],
                dw: dil[1],
                ph: pads[0],
                pw: pads[1],
                oh: out[2],
                ow: out[3],
            }),
            r => Err(format!("the CPU executor supports 1-D and 2-D windows, not rank {r}")),
        }
    }

    /// The input row and column read by output (oy, ox) at kernel tap (ky, kx),
    /// `None` in the padding.
    #[inline]
    pub fn src(&self, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
        let y = (oy * self.sh + ky * self.dh).checked_sub(self.ph)?;
        let x = (ox * self.sw + kx * self.dw).checked_sub(self.pw)?;
        (y < self.h && x < self.w).then_some((y, x))
    }
}

pub(crate) fn conv(c: &Conv, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &TensorType) -> Result<Vec<f32>, String> {
    let (xs, ws) = (x.shape(), w.shape());
    let win = Window::new(xs, &out.shape, &ws[2..], &c.strides, &c.dilations, &c.pads)?;
    let (n, m, g) = (xs[0], ws[0], c.group);
    let (cg, mg) = (win.c / g, m / g);
    let k = cg * win.kh * win.kw;
    let plane = win.oh * win.ow;
    let (xv, wv) = (f32s(x), f32s(w));
    let mut y = vec![0f32; n * m * plane];
    if let Some(b) = bias {
        let bv = f32s(b);
        for (i, chunk) in y.chunks_mut(plane).enumerate() {
            chunk.fill(bv[i % m]);
        }
    }
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    let direct = win.kh == 1 && win.kw == 1 && win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0 && c.pads.iter().all(|&p| p == 0);
    let mut col = if direct { Vec::new() } else { vec![0f32; k * plane] };
    for b in 0..n {
        for gi in 0..g {
            let xin = &xv[(b * win.c + gi * cg) * win.h * win.w..][..cg * win.h * win.w];
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

/// Unfolds `cg` channels of one image into `col[cg*kh*kw, oh*ow]`.
fn im2col(win: &Window, cg: usize, x: &[f32], col: &mut [f32]) {
    let plane = win.oh * win.ow;
    for ci in 0..cg {
        let xc = &x[ci * win.h * win.w..][..win.h * win.w];
        for ky in 0..win.kh {
            for kx in 0..win.kw {
                let row = &mut col[((ci * win.kh + ky) * win.kw + kx) * plane..][..plane];
                for oy in 0..win.oh {
                    let dst = &mut row[oy * win.ow..][..win.ow];
                    for (ox, d) in dst.iter_mut().enumerate() {
                        *d = win.src(oy, ox, ky, kx).map_or(0.0, |(y, x)| xc[y * win.w + x]);
                    }
                }
            }
        }
    }
}
