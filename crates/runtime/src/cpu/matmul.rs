//! Gemm and batched MatMul on matrixmultiply's sgemm.

use super::f32s;
use smelt_ir::{broadcast, broadcast_index, Tensor, TensorType};
use std::sync::Arc;

/// `c[m,n] = alpha * a[m,k] b[k,n] + beta * c`, with row/column strides.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
) {
    assert!(c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(k == 0 || (a.len() > (m - 1) * rsa + (k - 1) * csa && b.len() > (k - 1) * rsb + (n - 1) * csb));
    // SAFETY: the asserts above keep every access in bounds.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

pub(crate) fn gemm(args: &[Arc<Tensor>], ta: bool, tb: bool, alpha: f32, beta: f32, out: &TensorType) -> Vec<f32> {
    let (a, b) = (&args[0], &args[1]);
    let (m, n) = (out.shape[0], out.shape[1]);
    let k = if ta { a.shape()[0] } else { a.shape()[1] };
    let (av, bv) = (f32s(a), f32s(b));
    let sa = if ta { (1, m) } else { (k, 1) };
    let sb = if tb { (1, k) } else { (n, 1) };
    let mut c = vec![0f32; m * n];
    let mut cb = 0.0;
    if let Some(bias) = args.get(2) {
        let bs = bias.shape();
        let bvv = f32s(bias);
        let (r, cl) = match bs.len() {
            0 => (1, 1),
            1 => (1, bs[0]),
            _ => (bs[0], bs[1]),
        };
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = bvv[(i % r) * cl + j % cl];
            }
        }
        cb = beta;
    }
    sgemm(m, k, n, alpha, &av, sa, &bv, sb, cb, &mut c);
    c
}

pub(crate) fn matmul(a: &Tensor, b: &Tensor, out: &TensorType) -> Vec<f32> {
    let a2 = if a.shape().len() == 1 { vec![1, a.shape()[0]] } else { a.shape().to_vec() };
    let b2 = if b.shape().len() == 1 { vec![b.shape()[0], 1] } else { b.shape().to_vec() };
    let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = broadcast(ab, bb).expect("inference checked the batch dims");
    let nb: usize = batch.iter().product();
    let (av, bv) = (f32s(a), f32s(b));
    let mut c = vec![0f32; nb * m * n];
    debug_assert_eq!(c.len(), out.numel());
    for i in 0..nb {
        let ai = broadcast_index(i, &batch, ab);
        let bi = broadcast_index(i, &batch, bb);
        sgemm(m, k, n, 1.0, &av[ai * m * k..][..m * k], (k, 1), &bv[bi * k * n..][..k * n], (n, 1), 0.0, &mut c[i * m * n..][..m * n]);
    }
    c
}
