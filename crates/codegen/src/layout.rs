//! Data-movement and per-element kernels as data: transpose, concatenation
//! (as a copy) and local response normalization. One thread per output
//! element; the same description renders to CUDA C and runs on the CPU.

use smelt_ir::{DType, KernelGraph, KernelOp, NodeId, Op, Tensor};

/// What the kernel does.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// Output dim i is input dim `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Concatenation along `axis` of inputs with these extents along it.
    Concat {
        /// The axis.
        axis: usize,
        /// Each input's extent along the axis.
        sizes: Vec<usize>,
    },
    /// Local response normalization across channels.
    Lrn(smelt_ir::Lrn),
}

/// A transpose, concat or LRN kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// A stable, readable name, e.g. `transpose_0213_1x4x60x784`.
    pub name: String,
    /// What it does.
    pub kind: Kind,
    /// The first input's shape.
    pub input: Vec<usize>,
    /// The output shape.
    pub output: Vec<usize>,
    /// Element type (inputs and output).
    pub dtype: DType,
    /// Number of inputs.
    pub arity: usize,
}

/// Row-major element strides of `shape`.
pub(crate) fn row_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

impl Layout {
    /// The description of node `id`, if it is a transpose, a concat (copy or
    /// in place: as a kernel it copies) or an LRN.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Layout> {
        let node = g.node(id);
        let ins = g.inputs_of(id);
        let (kind, tag) = match &node.op {
            KernelOp::Op(Op::Transpose { perm }) => {
                (Kind::Transpose { perm: perm.clone() }, format!("transpose_{}", perm.iter().map(|p| p.to_string()).collect::<String>()))
            }
            KernelOp::Op(Op::Concat { axis }) | KernelOp::ConcatInPlace { axis } => (
                Kind::Concat { axis: *axis, sizes: ins.iter().map(|v| g.ty(*v).shape[*axis]).collect() },
                format!("concat{}_a{axis}", ins.len()),
            ),
            KernelOp::Op(Op::Lrn(l)) => (Kind::Lrn(*l), format!("lrn{}", l.size)),
            _ => return None,
        };
        let out = &node.outputs[0];
        // Float only: the CPU run goes through f32, exact for floats, not
        // for large integers.
        if ins.iter().any(|v| g.ty(*v).dtype != out.dtype) || out.shape.is_empty() || !out.dtype.is_float() {
            return None;
        }
        let dims = out.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        Some(Layout {
            name: format!("{tag}_{dims}{suffix}"),
            kind,
            input: g.ty(ins[0]).shape.clone(),
            output: out.shape.clone(),
            dtype: out.dtype,
            arity: ins.len(),
        })
    }

    /// Number of output elements (threads).
    pub fn numel(&self) -> usize {
        self.output.iter().product()
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(in0, ..., out, n)`.
    pub fn cuda(&self) -> String {
        let (ty, load, store) = crate::c_type(self.dtype);
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!("// {}: {:?}, {:?} -> {:?}\n", self.name, self.kind, self.input, self.output);
        let params: Vec<String> = (0..self.arity).map(|i| format!("const {ty}* __restrict__ in{i}")).collect();
        s += &format!(
            "extern \"C\" __global__ void {}({}, {ty}* __restrict__ out, unsigned long long n) {{\n",
            self.name,
            params.join(", ")
        );
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n";
        match &self.kind {
            Kind::Transpose { perm } => {
                let st = row_strides(&self.input);
                s += "    unsigned long long r = i, src = 0;\n";
                for d in (0..self.output.len()).rev() {
                    s += &format!("    src += (r % {}ull) * {}ull; r /= {}ull;\n", self.output[d], st[perm[d]], self.output[d]);
                }
                s += "    out[i] = in0[src];\n";
            }
            Kind::Concat { axis, sizes } => {
                let inner: usize = self.output[axis + 1..].iter().product();
                let len = self.output[*axis];
                s += &format!("    unsigned long long inner = i % {inner}ull, c = (i / {inner}ull) % {len}ull, outer = i / ({inner}ull * {len}ull);\n");
                let mut start = 0;
                for (k, &n) in sizes.iter().enumerate() {
                    s += &format!(
                        "    if (c < {}ull) {{ out[i] = in{k}[(outer * {n}ull + (c - {start}ull)) * {inner}ull + inner]; return; }}\n",
                        start + n
                    );
                    start += n;
                }
            }
            Kind::Lrn(smelt_ir::Lrn { size, alpha, beta, bias }) => {
                let inner: usize = self.output[2..].iter().product();
                let c = self.output[1];
                let (lo, hi) = ((size - 1) / 2, size / 2);
                s += &format!("    long long ch = (i / {inner}ull) % {c}ull;\n    unsigned long long base = i - ch * {inner}ull;\n    float sq = 0.0f;\n");
                s += &format!("    for (long long k = max(ch - {lo}ll, 0ll); k <= min(ch + {hi}ll, {}ll); ++k) {{ float v = {load}(in0[base + k * {inner}ull]); sq += v * v; }}\n", c - 1);
                s += &format!(
                    "    out[i] = {store}({load}(in0[i]) / powf({} + {} * sq, {}));\n",
                    crate::c_f32(*bias),
                    crate::c_f32(alpha / *size as f32),
                    crate::c_f32(*beta)
                );
            }
        }
        s += "}\n";
        s
    }

    /// Runs the description on the CPU as the kernel does.
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        let n = self.numel();
        match &self.kind {
            Kind::Transpose { perm } => {
                let st = row_strides(&self.input);
                let v = inputs[0].to_f32_vec();
                let out: Vec<f32> = (0..n)
                    .map(|i| {
                        let (mut r, mut src) = (i, 0);
                        for d in (0..self.output.len()).rev() {
                            src += (r % self.output[d]) * st[perm[d]];
                            r /= self.output[d];
                        }
                        v[src]
                    })
                    .collect();
                Tensor::from_f32(self.output.clone(), out).cast(self.dtype)
            }
            Kind::Concat { axis, sizes } => {
                let inner: usize = self.output[axis + 1..].iter().product();
                let len = self.output[*axis];
                let vals: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
                let out: Vec<f32> = (0..n)
                    .map(|i| {
                        let (c, outer) = ((i / inner) % len, i / (inner * len));
                        let mut start = 0;
                        for (k, &m) in sizes.iter().enumerate() {
                            if c < start + m {
                                return vals[k][(outer * m + (c - start)) * inner + i % inner];
                            }
                            start += m;
                        }
                        unreachable!("the axis extent is the sum of the sizes")
                    })
                    .collect();
                Tensor::from_f32(self.output.clone(), out).cast(self.dtype)
            }
            Kind::Lrn(smelt_ir::Lrn { size, alpha, beta, bias }) => {
                let inner: usize = self.output[2..].iter().product();
                let c = self.output[1] as i64;
                let (lo, hi) = (((size - 1) / 2) as i64, (size / 2) as i64);
                let v = inputs[0].to_f32_vec();
                let out: Vec<f32> = (0..n)
                    .map(|i| {
                        let ch = ((i / inner) as i64) % c;
                        let base = i - ch as usize * inner;
                        let sq: f32 = ((ch - lo).max(0)..=(ch + hi).min(c - 1)).map(|k| v[base + k as usize * inner].powi(2)).sum();
                        v[i] / (bias + alpha / *size as f32 * sq).powf(*beta)
                    })
                    .collect();
                Tensor::from_f32(self.output.clone(), out).cast(self.dtype)
            }
        }
    }
}
