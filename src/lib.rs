//! smelt: a graph compiler that makes deep-learning models fit in GPU memory
//! and run fast. This crate is the facade over the workspace crates: the
//! compile [`driver`] ([`Session`]), reports, and the `smelt` command line.

pub mod cost;
pub mod device;
pub mod driver;
pub mod emit;
pub mod fit;
pub mod fuzz;
pub mod plan;
pub mod report;
pub mod roofline;
pub mod spec;
pub mod train;
pub mod tune;

pub use driver::{Compiled, Error, Options, Planned, Recomputed, Remat, RematReport, RematSolver, Session, SplitReport, Timings, Training};

/// The Rust examples of `docs/guide.md`, compiled by `cargo test --doc` so
/// that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideExamples;

pub use smelt_codegen as codegen;
pub use smelt_ir as ir;
pub use smelt_passes as passes;
pub use smelt_runtime as runtime;

use smelt_ir::{Graph, OpSet, Rng, Tensor};

/// The text of a small file smelt reads whole (a checkpoint's JSON, a
/// recipe, a tuning table): at most `cap` bytes of UTF-8, so that a
/// device or a huge file is refused, not read into memory without end.
pub fn read_text(path: &std::path::Path, cap: u64) -> Result<String, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path).and_then(|f| f.take(cap + 1).read_to_end(&mut bytes)).map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > cap {
        return Err(format!("over {} KiB: not a file smelt wrote", cap >> 10));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text: not a file smelt wrote".to_string())
}

/// The model `smelt` runs when given no arguments.
pub const DEFAULT_MODEL: &str = "zoo:resnet50";

/// How a reduced-precision output compares with the f32 one.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PrecisionError {
    /// Largest |half - f32|.
    pub max_abs: f64,
    /// Largest |half - f32| / |f32| over elements with f32 != 0.
    pub max_rel: f64,
    /// max_abs / the largest |f32|: the error relative to the output's scale.
    pub max_abs_over_range: f64,
    /// Rows whose arg-max along the class axis (the last axis longer than
    /// one) agrees with f32's.
    pub argmax_agree: usize,
    /// Rows compared.
    pub rows: usize,
}

/// Compares `half` with `reference` (same shape): errors and the agreement
/// of the arg-max along the class axis, row by row.
pub fn precision_error(half: &Tensor, reference: &Tensor) -> PrecisionError {
    let c = compare(half, reference, 0.0, 0.0);
    let (a, r) = (half.to_f32_vec(), reference.to_f32_vec());
    let shape = reference.shape();
    let axis = shape.iter().rposition(|&d| d > 1).unwrap_or(0);
    let len = shape.get(axis).copied().unwrap_or(1).max(1);
    let inner: usize = shape.iter().skip(axis + 1).product();
    let rows = r.len() / len;
    let argmax = |v: &[f32], row: usize| {
        let base = row / inner * len * inner + row % inner;
        (0..len).max_by(|&i, &j| v[base + i * inner].total_cmp(&v[base + j * inner]).then(j.cmp(&i))).unwrap_or(0)
    };
    let agree = if a.len() == r.len() { (0..rows).filter(|&i| argmax(&a, i) == argmax(&r, i)).count() } else { 0 };
    let range = r.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
    PrecisionError {
        max_abs: c.max_abs,
        max_rel: c.max_rel,
        max_abs_over_range: c.max_abs / range.max(f64::MIN_POSITIVE),
        argmax_agree: agree,
        rows,
    }
}

/// Gives every constant and parameter without data deterministic random
/// values seeded by its name (normal, std 0.1), and state without data
/// zeros. Returns how many were filled.
pub fn fill_missing_weights<O: OpSet>(g: &mut Graph<O>) -> usize {
    let missing: Vec<_> = g.node_ids().filter(|&id| g.node(id).op.is_persistent() && g.weight(id).is_none()).collect();
    for &id in &missing {
        let node = g.node(id);
        let mut rng = Rng::from_name(&node.name);
        let ty = node.outputs[0].clone();
        // State (optimizer moments, step counters) starts at zero.
        let state = node.op.semantic() == Some(&smelt_ir::Op::State);
        let vals: Vec<f32> = (0..ty.numel()).map(|_| if state { 0.0 } else { 0.1 * rng.normal() }).collect();
        let t = Tensor::from_f32(ty.shape.clone(), vals).cast(ty.dtype);
        g.set_weight(id, t).expect("type matches the node");
    }
    missing.len()
}

/// The ONNX backend runner's input for a graph input: for a float input of
/// n elements, `arange(n).reshape(shape) / n`; zeros otherwise.
pub fn dummy_input<O: OpSet>(g: &Graph<O>, index: usize) -> Tensor {
    let ty = &g.node(g.inputs()[index]).outputs[0];
    let n = ty.numel();
    if ty.dtype.is_float() {
        Tensor::from_f32(ty.shape.clone(), (0..n).map(|i| i as f32 / n as f32).collect()).cast(ty.dtype)
    } else {
        Tensor::full(ty, 0.0)
    }
}

/// How far `actual` is from `expected`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    /// Largest |actual - expected|.
    pub max_abs: f64,
    /// Largest |actual - expected| / |expected| over elements with expected != 0.
    pub max_rel: f64,
    /// Elements outside `atol + rtol * |expected|`; NaN matches only NaN
    /// and an infinity only the same infinity (as numpy's assert_allclose).
    pub mismatches: usize,
    /// Number of elements compared.
    pub elements: usize,
    /// Whether shapes and dtypes agree and every element is within tolerance.
    pub ok: bool,
    /// Why the comparison failed before looking at elements, if it did.
    pub error: Option<String>,
}

/// Compares elementwise like `numpy.allclose(actual, expected, rtol, atol)`.
pub fn compare(actual: &Tensor, expected: &Tensor, rtol: f64, atol: f64) -> Comparison {
    let mut c = Comparison { max_abs: 0.0, max_rel: 0.0, mismatches: 0, elements: expected.ty().numel(), ok: false, error: None };
    if actual.shape() != expected.shape() {
        c.error = Some(format!("shape {:?} but expected {:?}", actual.shape(), expected.shape()));
        return c;
    }
    let (a, e) = (actual.to_f32_vec(), expected.to_f32_vec());
    for (&x, &y) in a.iter().zip(&e) {
        let (x, y) = (x as f64, y as f64);
        if (x.is_nan() && y.is_nan()) || (x.is_infinite() && x == y) {
            continue;
        }
        let d = (x - y).abs();
        if d.is_nan() || d > atol + rtol * y.abs() {
            c.mismatches += 1;
        }
        if d.is_nan() {
            c.max_abs = f64::NAN;
            continue;
        }
        c.max_abs = c.max_abs.max(d);
        if y != 0.0 {
            c.max_rel = c.max_rel.max(d / y.abs());
        }
    }
    c.ok = c.mismatches == 0;
    c
}

/// Summary statistics of a tensor's elements.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Smallest element.
    pub min: f32,
    /// Largest element.
    pub max: f32,
    /// Mean.
    pub mean: f64,
    /// Index of the largest element (flat).
    pub argmax: usize,
    /// Whether every element is finite.
    pub finite: bool,
}

/// Summarises `t`.
pub fn summarize(t: &Tensor) -> Summary {
    let v = t.to_f32_vec();
    let mut s = Summary { min: f32::INFINITY, max: f32::NEG_INFINITY, mean: 0.0, argmax: 0, finite: true };
    for (i, &x) in v.iter().enumerate() {
        s.finite &= x.is_finite();
        s.min = s.min.min(x);
        if x > s.max {
            s.max = x;
            s.argmax = i;
        }
        s.mean += x as f64;
    }
    s.mean /= v.len().max(1) as f64;
    s
}
