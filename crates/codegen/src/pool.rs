//! Pooling kernels as data: max and average pooling over any number of
//! spatial dims, one thread per output element, the window walked in
//! registers. The same description renders to CUDA C and runs on the CPU.

use smelt_ir::{DType, KernelGraph, KernelOp, NodeId, Op, Pool as PoolAttrs, Tensor};

/// A max or average pooling kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// A stable, readable name, e.g. `maxpool3x3s2_n1c64h112w112`.
    pub name: String,
    /// Window, strides and pads (begins then ends).
    pub attrs: PoolAttrs,
    /// `None` for max pooling, else `Some(count_include_pad)`.
    pub average: Option<bool>,
    /// Input shape `[N, C, *spatial]`.
    pub input: Vec<usize>,
    /// Output shape.
    pub output: Vec<usize>,
    /// Element type of input and output.
    pub dtype: DType,
}

impl Pool {
    /// The description of node `id`, if it is a max or average pool.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Pool> {
        let node = g.node(id);
        let (attrs, average, kind) = match &node.op {
            KernelOp::Op(Op::MaxPool(p)) => (p.clone(), None, "maxpool"),
            KernelOp::Op(Op::AveragePool { pool, count_include_pad }) => (pool.clone(), Some(*count_include_pad), "avgpool"),
            _ => return None,
        };
        let x = g.ty(g.inputs_of(id)[0]);
        let k: Vec<String> = attrs.kernel.iter().map(|k| k.to_string()).collect();
        let s = attrs.strides.first().copied().unwrap_or(1);
        let out = &node.outputs[0];
        let dims: String = out.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        let name = format!("{kind}{}s{s}_{}{suffix}", k.join("x"), dims);
        Some(Pool { name, attrs, average, input: x.shape.clone(), output: out.shape.clone(), dtype: out.dtype })
    }

    fn spatial(&self) -> usize {
        self.input.len() - 2
    }

    /// Number of output elements (threads).
    pub fn numel(&self) -> usize {
        self.output.iter().product()
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(const T* in, T* out, n)`.
    pub fn cuda(&self) -> String {
        let n = self.spatial();
        let (ty, load, store) = crate::c_type(self.dtype);
        let p = &self.attrs;
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!(
            "// {}: {} pooling, window {:?}, strides {:?}, pads {:?}, {:?} -> {:?}\n",
            self.name,
            if self.average.is_some() { "average" } else { "max" },
            p.kernel,
            p.strides,
            p.pads,
            self.input,
            self.output
        );
        s += &format!(
            "extern \"C\" __global__ void {}(const {ty}* __restrict__ in, {ty}* __restrict__ out, unsigned long long n) {{\n",
            self.name
        );
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n    unsigned long long r = i;\n";
        for d in (0..n).rev() {
            s += &format!("    long long o{d} = r % {}ull; r /= {}ull;\n", self.output[2 + d], self.output[2 + d]);
        }
        let plane: usize = self.input[2..].iter().product();
        s += &format!("    unsigned long long plane = r * {plane}ull; // r is now the (n, c) plane\n");
        s += &format!(
            "    float acc = {};\n    int count = 0;\n",
            if self.average.is_some() { "0.0f" } else { "__int_as_float(0xff800000) /* -inf */" }
        );
        for d in 0..n {
            s += &format!("{}for (int k{d} = 0; k{d} < {}; ++k{d}) {{\n", "    ".repeat(d + 1), p.kernel[d]);
            s += &format!("{}long long x{d} = o{d} * {} + k{d} - {};\n", "    ".repeat(d + 2), p.strides[d], p.pads[d]);
            s += &format!("{}if (x{d} < 0 || x{d} >= {}) continue;\n", "    ".repeat(d + 2), self.input[2 + d]);
        }
        let mut idx = String::from("x0");
        for d in 1..n {
            idx = format!("({idx}) * {} + x{d}", self.input[2 + d]);
        }
        let ind = "    ".repeat(n + 1);
        let v = format!("{load}(in[plane + {idx}])");
        s += &if self.average.is_some() {
            format!("{ind}acc += {v};\n{ind}++count;\n")
        } else {
            format!("{ind}acc = {};\n{ind}++count;\n", crate::c_max("acc", &v))
        };
        for d in (0..n).rev() {
            s += &format!("{}}}\n", "    ".repeat(d + 1));
        }
        match self.average {
            None => {}
            Some(false) => s += "    acc /= (float)(count > 0 ? count : 1);\n",
            Some(true) => {
                // The window clipped to the padded input.
                let mut div = Vec::new();
                for d in 0..n {
                    s += &format!("    long long s{d} = o{d} * {} - {};\n", p.strides[d], p.pads[d]);
                    s += &format!("    long long e{d} = min(s{d} + {}, (long long){});\n", p.kernel[d], self.input[2 + d] + p.pads[n + d]);
                    div.push(format!("(float)max(e{d} - s{d}, 1ll)"));
                }
                s += &format!("    acc /= {};\n", div.join(" * "));
            }
        }
        s += &format!("    out[i] = {store}(acc);\n}}\n");
        s
    }

    /// Runs the description on the CPU exactly as the kernel does.
    #[allow(clippy::needless_range_loop)] // per-dimension index math, as in the CUDA C
    pub fn run_cpu(&self, x: &Tensor) -> Tensor {
        let n = self.spatial();
        let p = &self.attrs;
        let xv = x.to_f32_vec();
        let plane: usize = self.input[2..].iter().product();
        let mut out = Vec::with_capacity(self.numel());
        for i in 0..self.numel() {
            let mut r = i;
            let mut o = vec![0i64; n];
            for d in (0..n).rev() {
                o[d] = (r % self.output[2 + d]) as i64;
                r /= self.output[2 + d];
            }
            let base = r * plane;
            let (mut acc, mut count) = (if self.average.is_some() { 0.0f32 } else { f32::NEG_INFINITY }, 0);
            let taps: usize = p.kernel.iter().product();
            'tap: for t in 0..taps {
                let (mut rem, mut off) = (t, 0usize);
                let mut k = vec![0i64; n];
                for d in (0..n).rev() {
                    k[d] = (rem % p.kernel[d]) as i64;
                    rem /= p.kernel[d];
                }
                for d in 0..n {
                    let xd = o[d] * p.strides[d] as i64 + k[d] - p.pads[d] as i64;
                    if xd < 0 || xd >= self.input[2 + d] as i64 {
                        continue 'tap;
                    }
                    off = off * self.input[2 + d] + xd as usize;
                }
                let v = xv[base + off];
                acc = if self.average.is_some() { acc + v } else { smelt_ir::max_nan(acc, v) };
                count += 1;
            }
            match self.average {
                None => {}
                Some(false) => acc /= count.max(1) as f32,
                Some(true) => {
                    let mut div = 1.0f32;
                    for d in 0..n {
                        let s0 = o[d] * p.strides[d] as i64 - p.pads[d] as i64;
                        let e0 = (s0 + p.kernel[d] as i64).min((self.input[2 + d] + p.pads[n + d]) as i64);
                        div *= (e0 - s0).max(1) as f32;
                    }
                    acc /= div;
                }
            }
            out.push(acc);
        }
        Tensor::from_f32(self.output.clone(), out).cast(self.dtype)
    }
}
