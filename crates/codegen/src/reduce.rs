//! Reduction kernels as data: global average pooling, (log-)softmax,
//! layer normalization and mean, sum or max over any axes, each reading its input through an optional
//! elementwise prologue (a `fused_reduction`: the residual add before a
//! layer norm), so the prologue's value never reaches memory. One thread
//! per reduced row, the row walked in registers, statistics in f32; a long
//! sum, mean, max or average pool (a batch norm's gradient over N, H and W)
//! takes a block of [`BLOCK_THREADS`] per row instead: each thread folds
//! every `BLOCK_THREADS`-th element, then a tree in shared memory folds the
//! threads, in an order the CPU description repeats.

use crate::elementwise::{expr_c, strides};
use smelt_ir::{DType, Expr, ExprNode, KernelGraph, KernelOp, NodeId, Op, ReduceOp, Tensor};

/// What is reduced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Mean over all spatial positions of each (n, c) plane.
    GlobalAveragePool,
    /// Softmax along `axis` (log-softmax when `log`).
    Softmax {
        /// The normalised axis.
        axis: usize,
        /// Log of the softmax.
        log: bool,
    },
    /// Layer normalization over dims `axis..`, with a scale and an optional
    /// bias (the kernel's last operands, one value per normalized element).
    LayerNorm {
        /// First normalized dim.
        axis: usize,
        /// Added to the variance.
        epsilon: f32,
        /// Whether a bias operand follows the scale.
        bias: bool,
    },
    /// Mean, sum or max over the axes set in `mask` (bit d: axis d of
    /// `pre`); one output element per combination of the other axes.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The reduced axes, as a bit set.
        mask: u64,
    },
}

/// A reduction kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduction {
    /// A stable, readable name, e.g. `softmax_a1_1x1000`.
    pub name: String,
    /// The kind.
    pub kind: Kind,
    /// The prologue computing the reduced value from the inputs (`$0` alone
    /// when there is none).
    pub expr: Expr,
    /// The shape the prologue produces (every input broadcasts to it).
    pub pre: Vec<usize>,
    /// Per input: dtype and element strides in `pre`'s index space.
    pub inputs: Vec<(DType, Vec<usize>)>,
    /// The output shape.
    pub output: Vec<usize>,
    /// The output dtype.
    pub out: DType,
    /// Dtypes of the reduction's own operands after the prologue's (a
    /// layer norm's scale and bias).
    pub extra: Vec<DType>,
}

/// Threads of a block that reduces one long row.
pub const BLOCK_THREADS: usize = 256;

/// Rows at least this long are reduced by a block each (shorter ones, one
/// thread each: there are then usually many rows).
const BLOCK_MIN_LEN: usize = 1024;

/// Rows of a layer norm or a softmax over the last axis at least this long
/// are normalized by a block each: a transformer's few thousand rows of
/// hidden size would otherwise occupy a few thousand threads of a GPU that
/// holds a quarter million.
const BLOCK_MIN_NORM_LEN: usize = 256;

/// Folds `len` values as a block of [`BLOCK_THREADS`] does: thread t takes
/// `value(t)`, `value(t + BLOCK_THREADS)`, ... in order, then the threads'
/// partial results pair up in a tree (t with t + 128, then t + 64, ...).
fn block_fold(len: usize, init: f32, mut value: impl FnMut(usize) -> f32, fold: impl Fn(f32, f32) -> f32) -> f32 {
    let mut part = vec![init; BLOCK_THREADS];
    for (t, p) in part.iter_mut().enumerate() {
        for k in (t..len).step_by(BLOCK_THREADS) {
            *p = fold(*p, value(k));
        }
    }
    let mut s = BLOCK_THREADS / 2;
    while s > 0 {
        for t in 0..s {
            part[t] = fold(part[t], part[t + s]);
        }
        s /= 2;
    }
    part[0]
}

impl Reduction {
    /// The description of node `id`, if it is a global average pool or a
    /// softmax, fused with a prologue or not.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Reduction> {
        let node = g.node(id);
        let ins = g.inputs_of(id);
        let (expr, inner) = match &node.op {
            KernelOp::FusedReduction { expr, reduction } => (expr.clone(), reduction.op()),
            KernelOp::Op(op) => {
                let mut e = Expr::default();
                e.push(ExprNode::Input(0));
                (e, op.clone())
            }
            KernelOp::FusedConv { .. }
            | KernelOp::FusedGemm { .. }
            | KernelOp::Elementwise { .. }
            | KernelOp::ConcatInPlace { .. }
            | KernelOp::SliceView { .. }
            | KernelOp::Attention { .. }
            | KernelOp::GemmEpilogue { .. } => return None,
        };
        let kind = match inner {
            Op::GlobalAveragePool => Kind::GlobalAveragePool,
            Op::Softmax { axis } => Kind::Softmax { axis, log: false },
            Op::LogSoftmax { axis } => Kind::Softmax { axis, log: true },
            Op::LayerNorm { axis, epsilon } => Kind::LayerNorm { axis, epsilon, bias: ins.len() > expr.arity() + 1 },
            // The axes are a bit set: 64 dims at most.
            Op::Reduce { op, ref axes, .. } if ins.first().is_some_and(|v| g.ty(*v).shape.len() <= 64) => {
                Kind::Reduce { op, mask: axes.iter().fold(0, |m, &a| m | 1 << a) }
            }
            _ => return None,
        };
        let out = &node.outputs[0];
        let (ins, extra) = ins.split_at(expr.arity().min(ins.len()));
        if let Kind::LayerNorm { axis, .. } = kind {
            // One scale (and bias) value per normalized element.
            let len: usize = out.shape[axis..].iter().product();
            if extra.iter().any(|v| g.ty(*v).numel() != len || !g.ty(*v).dtype.is_float()) {
                return None;
            }
        }
        let extra: Vec<DType> = extra.iter().map(|v| g.ty(*v).dtype).collect();
        let pre = ins.iter().fold(Vec::new(), |acc: Vec<usize>, v| smelt_ir::broadcast(&acc, &g.ty(*v).shape).unwrap_or(acc));
        if !out.dtype.is_float() || ins.iter().any(|v| !g.ty(*v).dtype.is_float()) {
            return None;
        }
        let inputs = ins.iter().map(|v| (g.ty(*v).dtype, strides(&g.ty(*v).shape, &pre))).collect();
        let dims: String = pre.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        let fused = if matches!(node.op, KernelOp::FusedReduction { .. }) { "fused_" } else { "" };
        let name = match kind {
            Kind::GlobalAveragePool => format!("{fused}gap_{dims}{suffix}"),
            Kind::Softmax { axis, log } => format!("{fused}{}softmax_a{axis}_{dims}{suffix}", if log { "log" } else { "" }),
            Kind::LayerNorm { axis, .. } => format!("{fused}layer_norm_a{axis}_{dims}{suffix}"),
            Kind::Reduce { op, mask } => {
                let axes: Vec<String> = (0..pre.len()).filter(|d| mask >> d & 1 == 1).map(|d| d.to_string()).collect();
                let op = match op {
                    ReduceOp::Mean => "mean",
                    ReduceOp::Sum => "sum",
                    ReduceOp::Max => "max",
                };
                format!("{fused}reduce_{op}_a{}_{dims}{suffix}", axes.join("_"))
            }
        };
        Some(Reduction { name, kind, expr, pre, inputs, output: out.shape.clone(), out: out.dtype, extra })
    }

    /// Rows reduced: one thread or one block each.
    pub fn row_count(&self) -> usize {
        self.rows().0
    }

    /// Whether each row is reduced by a block of [`BLOCK_THREADS`] (a long
    /// sum, mean or max, a large average pool, a layer norm or a softmax
    /// over contiguous rows of a few hundred).
    pub fn by_block(&self) -> bool {
        let (_, len, inner) = self.rows();
        match self.kind {
            Kind::Reduce { .. } | Kind::GlobalAveragePool => len >= BLOCK_MIN_LEN,
            Kind::LayerNorm { .. } | Kind::Softmax { .. } => inner == 1 && len >= BLOCK_MIN_NORM_LEN,
        }
    }

    /// (rows, row length, inner stride): row r, element k is at flat index
    /// `(r / inner * len + k) * inner + r % inner` of `pre`.
    fn rows(&self) -> (usize, usize, usize) {
        match self.kind {
            Kind::GlobalAveragePool => {
                let len: usize = self.pre[2..].iter().product();
                (self.pre[0] * self.pre[1], len, 1)
            }
            Kind::Softmax { axis, .. } => {
                let inner: usize = self.pre[axis + 1..].iter().product();
                let outer: usize = self.pre[..axis].iter().product();
                (outer * inner, self.pre[axis], inner)
            }
            Kind::LayerNorm { axis, .. } => (self.pre[..axis].iter().product(), self.pre[axis..].iter().product(), 1),
            Kind::Reduce { mask, .. } => {
                let n = |red: u64| (0..self.pre.len()).filter(|d| mask >> d & 1 == red).map(|d| self.pre[d]).product();
                (n(0), n(1), 1)
            }
        }
    }

    /// For a reduction over axes: (extent, stride in `pre`) of the kept
    /// axes and of the reduced ones, outermost first. Other kinds: a row
    /// is `len` elements `inner` apart, rows `inner` to a block.
    fn split_axes(&self) -> (Axes, Axes) {
        let (rows, len, inner) = self.rows();
        let Kind::Reduce { mask, .. } = self.kind else {
            return (vec![(rows / inner.max(1), len * inner), (inner, 1)], vec![(len, inner)]);
        };
        let st = crate::elementwise::strides(&self.pre, &self.pre);
        let (mut kept, mut reduced) = (Vec::new(), Vec::new());
        for (d, (&e, &s)) in self.pre.iter().zip(&st).enumerate() {
            if mask >> d & 1 == 1 { &mut reduced } else { &mut kept }.push((e, s));
        }
        (kept, reduced)
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(in0, ..., out, rows)`.
    pub fn cuda(&self) -> String {
        let ty = |d: DType| crate::c_type(d).0;
        let (_, len, inner) = self.rows();
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!("// {}: {:?} of {} over {:?}\n", self.name, self.kind, self.expr, self.pre);
        let params: Vec<String> =
            self.inputs.iter().enumerate().map(|(i, (d, _))| format!("const {}* __restrict__ in{i}", ty(*d))).collect();
        let extras: String =
            ["scale", "bias"].iter().zip(&self.extra).map(|(n, d)| format!("const {}* __restrict__ {n}, ", ty(*d))).collect();
        // The prologue, evaluated at one flat index of `pre`.
        s += &format!("__device__ __forceinline__ float value_{}({}, unsigned long long f) {{\n", self.name, params.join(", "));
        s += &expr_c(&self.expr, &self.pre, &self.inputs, "f");
        s += "}\n\n";
        let args: Vec<String> = (0..self.inputs.len()).map(|i| format!("in{i}")).collect();
        let args = args.join(", ");
        s += &format!(
            "extern \"C\" __global__ void {}({}, {extras}{}* __restrict__ out, unsigned long long rows) {{\n",
            self.name,
            params.join(", "),
            ty(self.out)
        );
        let block = self.by_block();
        s += if block {
            "    unsigned long long r = blockIdx.x;\n    if (r >= rows) return;\n"
        } else {
            "    unsigned long long r = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n"
        };
        let (kept, reduced) = self.split_axes();
        let base = match self.kind {
            Kind::Reduce { .. } => decompose_c("r", &kept),
            _ => format!("(r / {inner}ull) * {len}ull * {inner}ull + r % {inner}ull"),
        };
        s += &format!("    unsigned long long base = {base};\n");
        let store = |v: &str| crate::store_c(self.out, v);
        if block && matches!(self.kind, Kind::LayerNorm { .. } | Kind::Softmax { .. }) {
            s += &self.block_norm_c(&args, len);
            return s;
        }
        if block {
            let (init, fold, at) = match self.kind {
                Kind::Reduce { op: ReduceOp::Max, .. } => {
                    ("__int_as_float(0xff800000)", "(a != a || a > b ? a : b)", decompose_c("k", &reduced))
                }
                Kind::Reduce { .. } => ("0.0f", "a + b", decompose_c("k", &reduced)),
                _ => ("0.0f", "a + b", "k".to_string()),
            };
            let t = BLOCK_THREADS;
            s += &format!("    __shared__ float part[{t}];\n    const unsigned int t = threadIdx.x;\n    float acc = {init};\n");
            s += &format!(
                "    for (unsigned long long k = t; k < {len}ull; k += {t}ull) {{ float a = acc, b = value_{}({args}, base + {at}); acc = {fold}; }}\n",
                self.name
            );
            s += &tree_fold_c(fold);
            let mean = matches!(self.kind, Kind::GlobalAveragePool | Kind::Reduce { op: ReduceOp::Mean, .. });
            let v = if mean { format!("part[0] / {len}.0f") } else { "part[0]".into() };
            s += &format!("    if (t == 0) out[r] = {};\n}}\n", store(&v));
            return s;
        }
        match self.kind {
            Kind::GlobalAveragePool => {
                s += &format!(
                    "    float acc = 0.0f;\n    for (unsigned long long k = 0; k < {len}ull; ++k) acc += value_{}({args}, base + k);\n",
                    self.name
                );
                s += &format!("    out[r] = {};\n}}\n", store(&format!("acc / {len}.0f")));
            }
            Kind::Softmax { log, .. } => {
                s += &format!("    float m = __int_as_float(0xff800000);\n    for (unsigned long long k = 0; k < {len}ull; ++k) m = fmaxf(m, value_{}({args}, base + k * {inner}ull));\n", self.name);
                s += &format!("    float sum = 0.0f;\n    for (unsigned long long k = 0; k < {len}ull; ++k) sum += expf(value_{}({args}, base + k * {inner}ull) - m);\n", self.name);
                let v = if log { "value - m - logf(sum)" } else { "expf(value - m) / sum" };
                s += &format!(
                    "    for (unsigned long long k = 0; k < {len}ull; ++k) {{\n        float value = value_{}({args}, base + k * {inner}ull);\n        out[base + k * {inner}ull] = {};\n    }}\n}}\n",
                    self.name,
                    store(v)
                );
            }
            Kind::LayerNorm { epsilon, bias, .. } => {
                let f = &self.name;
                let load = |d: DType, x: &str| format!("{}({x})", crate::c_type(d).1);
                s += &format!("    float mean = 0.0f;\n    for (unsigned long long k = 0; k < {len}ull; ++k) mean += value_{f}({args}, base + k);\n    mean /= {len}.0f;\n");
                s += &format!("    float var = 0.0f;\n    for (unsigned long long k = 0; k < {len}ull; ++k) {{ float d = value_{f}({args}, base + k) - mean; var += d * d; }}\n");
                s += &format!("    float inv = rsqrtf(var / {len}.0f + {});\n", crate::c_f32(epsilon));
                let b = if bias { format!(" + {}", load(self.extra[1], "bias[k]")) } else { String::new() };
                s += &format!(
                    "    for (unsigned long long k = 0; k < {len}ull; ++k) out[base + k] = {};\n}}\n",
                    store(&format!("(value_{f}({args}, base + k) - mean) * inv * {}{b}", load(self.extra[0], "scale[k]")))
                );
            }
            Kind::Reduce { op, .. } => {
                let (init, step) = match op {
                    ReduceOp::Max => ("__int_as_float(0xff800000)", "acc = (acc != acc || acc > v ? acc : v)"),
                    ReduceOp::Mean | ReduceOp::Sum => ("0.0f", "acc += v"),
                };
                s += &format!(
                    "    float acc = {init};\n    for (unsigned long long k = 0; k < {len}ull; ++k) {{ float v = value_{}({args}, base + {}); {step}; }}\n",
                    self.name,
                    decompose_c("k", &reduced)
                );
                let v = if op == ReduceOp::Mean { format!("acc / {}.0f", len.max(1)) } else { "acc".into() };
                s += &format!("    out[r] = {};\n}}\n", store(&v));
            }
        }
        s
    }

    /// The body of a layer norm or softmax whose row a block normalizes:
    /// each statistic folded as [`block_fold`] does, then every thread
    /// writes its elements of the row.
    fn block_norm_c(&self, args: &str, len: usize) -> String {
        let (f, t) = (&self.name, BLOCK_THREADS);
        let store = |v: &str| crate::store_c(self.out, v);
        // Folds `init`, then `fold(a, b)` of each thread's `term` (an
        // expression of `v`, the element k's value), into `dst` for all.
        let fold = |dst: &str, init: &str, term: &str, fold: &str| {
            let mut c = format!("    acc = {init};\n");
            c += &format!("    for (unsigned long long k = t; k < {len}ull; k += {t}ull) {{ float v = value_{f}({args}, base + k); float a = acc, b = {term}; acc = {fold}; }}\n");
            c += &tree_fold_c(fold);
            c + &format!("    const float {dst} = part[0];\n    __syncthreads();\n")
        };
        let mut c = format!("    __shared__ float part[{t}];\n    const unsigned int t = threadIdx.x;\n    float acc;\n");
        match self.kind {
            Kind::LayerNorm { epsilon, bias, .. } => {
                let load = |d: DType, x: &str| format!("{}({x})", crate::c_type(d).1);
                c += &fold("sum", "0.0f", "v", "a + b");
                c += &format!("    const float mean = sum / {len}.0f;\n");
                c += &fold("var", "0.0f", "(v - mean) * (v - mean)", "a + b");
                c += &format!("    const float inv = rsqrtf(var / {len}.0f + {});\n", crate::c_f32(epsilon));
                let b = if bias { format!(" + {}", load(self.extra[1], "bias[k]")) } else { String::new() };
                c += &format!(
                    "    for (unsigned long long k = t; k < {len}ull; k += {t}ull) out[base + k] = {};\n}}\n",
                    store(&format!("(value_{f}({args}, base + k) - mean) * inv * {}{b}", load(self.extra[0], "scale[k]")))
                );
            }
            Kind::Softmax { log, .. } => {
                c += &fold("m", "__int_as_float(0xff800000)", "v", "fmaxf(a, b)");
                c += &fold("sum", "0.0f", "expf(v - m)", "a + b");
                let v = if log { "value - m - logf(sum)" } else { "expf(value - m) / sum" };
                c += &format!(
                    "    for (unsigned long long k = t; k < {len}ull; k += {t}ull) {{\n        float value = value_{f}({args}, base + k);\n        out[base + k] = {};\n    }}\n}}\n",
                    store(v)
                );
            }
            _ => unreachable!("only layer norms and softmaxes normalize by block"),
        }
        c
    }

    /// Runs the description on the CPU as the kernel does (f32 arithmetic,
    /// the prologue recomputed at each read).
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        let (inputs, extra) = inputs.split_at(self.inputs.len());
        let extra: Vec<Vec<f32>> = extra.iter().map(|t| t.to_f32_vec()).collect();
        let vals: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
        let mut scratch = Vec::new();
        let mut a = vec![0f32; inputs.len()];
        let mut value = |f: usize| {
            let mut r = f;
            let mut offs = vec![0usize; inputs.len()];
            for d in (0..self.pre.len()).rev() {
                let c = r % self.pre[d];
                r /= self.pre[d];
                for (k, (_, st)) in self.inputs.iter().enumerate() {
                    offs[k] += c * st[d];
                }
            }
            for k in 0..a.len() {
                a[k] = vals[k][offs[k]];
            }
            self.expr.eval(&a, &mut scratch)
        };
        let (rows, len, inner) = self.rows();
        let (kept, reduced) = self.split_axes();
        let n: usize = self.output.iter().product();
        let mut out = vec![0f32; n];
        let block = self.by_block();
        for r in 0..rows {
            let base = decompose(r, &kept);
            match self.kind {
                Kind::LayerNorm { epsilon, bias, .. } if block => {
                    let mean = block_fold(len, 0.0, |k| value(base + k), |a, b| a + b) / len as f32;
                    let var = block_fold(len, 0.0, |k| (value(base + k) - mean) * (value(base + k) - mean), |a, b| a + b);
                    let inv = 1.0 / (var / len as f32 + epsilon).sqrt();
                    for k in 0..len {
                        let b = if bias { extra[1][k] } else { 0.0 };
                        out[base + k] = (value(base + k) - mean) * inv * extra[0][k] + b;
                    }
                    continue;
                }
                Kind::Softmax { log, .. } if block => {
                    let m = block_fold(len, f32::NEG_INFINITY, |k| value(base + k), f32::max);
                    let sum = block_fold(len, 0.0, |k| (value(base + k) - m).exp(), |a, b| a + b);
                    for k in 0..len {
                        let v = value(base + k);
                        out[base + k] = if log { v - m - sum.ln() } else { (v - m).exp() / sum };
                    }
                    continue;
                }
                _ => {}
            }
            if block {
                out[r] = match self.kind {
                    Kind::Reduce { op: ReduceOp::Max, .. } => {
                        block_fold(len, f32::NEG_INFINITY, |k| value(base + decompose(k, &reduced)), f32::max)
                    }
                    Kind::Reduce { op, .. } => {
                        let sum = block_fold(len, 0.0, |k| value(base + decompose(k, &reduced)), |a, b| a + b);
                        if op == ReduceOp::Mean {
                            sum / len as f32
                        } else {
                            sum
                        }
                    }
                    _ => block_fold(len, 0.0, |k| value(base + k), |a, b| a + b) / len as f32,
                };
                continue;
            }
            match self.kind {
                Kind::GlobalAveragePool => {
                    let acc: f32 = (0..len).map(|k| value(base + k)).sum();
                    out[r] = acc / len as f32;
                }
                Kind::Softmax { log, .. } => {
                    let m = (0..len).map(|k| value(base + k * inner)).fold(f32::NEG_INFINITY, f32::max);
                    let sum: f32 = (0..len).map(|k| (value(base + k * inner) - m).exp()).sum();
                    for k in 0..len {
                        let v = value(base + k * inner);
                        out[base + k * inner] = if log { v - m - sum.ln() } else { (v - m).exp() / sum };
                    }
                }
                Kind::LayerNorm { epsilon, bias, .. } => {
                    let mean = (0..len).map(|k| value(base + k)).sum::<f32>() / len as f32;
                    let var: f32 = (0..len).map(|k| (value(base + k) - mean).powi(2)).sum();
                    let inv = 1.0 / (var / len as f32 + epsilon).sqrt();
                    for k in 0..len {
                        let b = if bias { extra[1][k] } else { 0.0 };
                        out[base + k] = (value(base + k) - mean) * inv * extra[0][k] + b;
                    }
                }
                Kind::Reduce { op, .. } => {
                    let vs = (0..len).map(|k| value(base + decompose(k, &reduced)));
                    out[r] = match op {
                        ReduceOp::Max => vs.fold(f32::NEG_INFINITY, smelt_ir::max_nan),
                        ReduceOp::Sum => vs.sum(),
                        ReduceOp::Mean => vs.sum::<f32>() / len.max(1) as f32,
                    };
                }
            }
        }
        Tensor::from_f32(self.output.clone(), out).cast(self.out)
    }
}

/// CUDA C that folds each thread's `acc` into `part[0]` as [`block_fold`]
/// does (a tree over the block's shared `part`, `fold` of `a` and `b`).
fn tree_fold_c(fold: &str) -> String {
    format!(
        "    part[t] = acc;\n    __syncthreads();\n    for (unsigned int s = {}u; s > 0u; s >>= 1) {{\n        if (t < s) {{ float a = part[t], b = part[t + s]; part[t] = {fold}; }}\n        __syncthreads();\n    }}\n",
        BLOCK_THREADS / 2
    )
}

/// Axes as (extent, stride) pairs, outermost first.
type Axes = Vec<(usize, usize)>;

/// The flat offset of index `i` in the space of `axes` ((extent, stride),
/// outermost first).
fn decompose(mut i: usize, axes: &[(usize, usize)]) -> usize {
    let mut off = 0;
    for &(e, s) in axes.iter().rev() {
        off += i % e.max(1) * s;
        i /= e.max(1);
    }
    off
}

/// The same in CUDA C: an expression of the `unsigned long long` variable `i`.
fn decompose_c(i: &str, axes: &[(usize, usize)]) -> String {
    let mut terms = Vec::new();
    let mut div = 1usize;
    for &(e, s) in axes.iter().rev() {
        if e > 1 && s > 0 {
            terms.push(format!("({i} / {div}ull % {e}ull) * {s}ull"));
        }
        div *= e.max(1);
    }
    if terms.is_empty() {
        "0ull".into()
    } else {
        terms.join(" + ")
    }
}
