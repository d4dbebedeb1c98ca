//! GEMM kernels as data: `act(alpha * op(A) @ op(B) + beta * C)` with
//! 16x16 shared-memory tiles, one thread per output element, the bias and
//! activation applied in registers. The same description renders to CUDA C
//! and runs on the CPU.

use crate::elementwise::strides;
use smelt_ir::{Act, DType, KernelGraph, KernelOp, NodeId, Op, Tensor};

/// The tile edge.
pub const TILE: usize = 16;

/// A GEMM kernel (Gemm, fused Gemm with an activation).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// A stable, readable name, e.g. `gemm_tb_relu_m1n4096k9216`.
    pub name: String,
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// A is stored transposed (`[k, m]`).
    pub trans_a: bool,
    /// B is stored transposed (`[n, k]`).
    pub trans_b: bool,
    /// Product scale.
    pub alpha: f32,
    /// Bias scale.
    pub beta: f32,
    /// The bias's strides in the `[m, n]` output (broadcast dims 0), if any.
    pub bias: Option<Vec<usize>>,
    /// The epilogue activation.
    pub act: Act,
    /// Element type of B, C and the output.
    pub dtype: DType,
    /// Element type of A (another float type is converted as it is loaded).
    pub a_dtype: DType,
}

impl Gemm {
    /// The description of node `id`, if it is a (fused) Gemm.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Gemm> {
        let node = g.node(id);
        let (trans_a, trans_b, alpha, beta, act) = match node.op {
            KernelOp::Op(Op::Gemm { trans_a, trans_b, alpha, beta }) => (trans_a, trans_b, alpha, beta, Act::None),
            KernelOp::FusedGemm { trans_a, trans_b, alpha, beta, act } => (trans_a, trans_b, alpha, beta, act),
            _ => return None,
        };
        let ins = g.inputs_of(id);
        let out = &node.outputs[0];
        let (m, n) = (out.shape[0], out.shape[1]);
        let a = g.ty(ins[0]);
        let k = if trans_a { a.shape[0] } else { a.shape[1] };
        let bias = ins.get(2).map(|c| strides(&g.ty(*c).shape, &out.shape));
        let act_tag = if act == Act::None { String::new() } else { format!("_{}", act.to_string().split('(').next().unwrap_or("act")) };
        let t = format!("{}{}", if trans_a { "_ta" } else { "" }, if trans_b { "_tb" } else { "" });
        let mut suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        if !a.dtype.is_float() || !out.dtype.is_float() {
            return None;
        }
        if a.dtype != out.dtype {
            suffix += &format!("_a{}", a.dtype);
        }
        let name = format!("gemm{t}{act_tag}_m{m}n{n}k{k}{suffix}");
        Some(Gemm { name, m, n, k, trans_a, trans_b, alpha, beta, bias, act, dtype: out.dtype, a_dtype: a.dtype })
    }

    /// Launch geometry: (grid x, grid y) of TILE x TILE blocks.
    pub fn grid(&self) -> (usize, usize) {
        (self.n.div_ceil(TILE), self.m.div_ceil(TILE))
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(a, b, [c,] out)`.
    pub fn cuda(&self) -> String {
        let (ty, load, store) = crate::c_type(self.dtype);
        let (aty, aload, _) = crate::c_type(self.a_dtype);
        let (m, n, k) = (self.m, self.n, self.k);
        let a_at = |r: &str, c: &str| {
            if self.trans_a {
                format!("a[(unsigned long long)({c}) * {m} + ({r})]")
            } else {
                format!("a[(unsigned long long)({r}) * {k} + ({c})]")
            }
        };
        let b_at = |r: &str, c: &str| {
            if self.trans_b {
                format!("b[(unsigned long long)({c}) * {k} + ({r})]")
            } else {
                format!("b[(unsigned long long)({r}) * {n} + ({c})]")
            }
        };
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!(
            "// {}: act={} (alpha {:?} * op(A)[{m}x{k}] @ op(B)[{k}x{n}] + beta {:?} * C), {TILE}x{TILE} tiles\n",
            self.name, self.act, self.alpha, self.beta
        );
        let bias = if self.bias.is_some() { format!("const {ty}* __restrict__ c, ") } else { String::new() };
        s += &format!(
            "extern \"C\" __global__ void {}(const {aty}* __restrict__ a, const {ty}* __restrict__ b, {bias}{ty}* __restrict__ out) {{\n",
            self.name
        );
        s += &format!("    __shared__ float as[{TILE}][{TILE}];\n    __shared__ float bs[{TILE}][{TILE}];\n");
        s += &format!("    int tx = threadIdx.x, ty = threadIdx.y;\n    int row = blockIdx.y * {TILE} + ty, col = blockIdx.x * {TILE} + tx;\n    float acc = 0.0f;\n");
        s += &format!("    for (int t = 0; t < {k}; t += {TILE}) {{\n");
        s += &format!("        as[ty][tx] = (row < {m} && t + tx < {k}) ? {aload}({}) : 0.0f;\n", a_at("row", "t + tx"));
        s += &format!("        bs[ty][tx] = (t + ty < {k} && col < {n}) ? {load}({}) : 0.0f;\n", b_at("t + ty", "col"));
        s += &format!("        __syncthreads();\n        #pragma unroll\n        for (int j = 0; j < {TILE}; ++j) acc += as[ty][j] * bs[j][tx];\n        __syncthreads();\n    }}\n");
        s += &format!("    if (row >= {m} || col >= {n}) return;\n    float v = {} * acc;\n", crate::c_f32(self.alpha));
        if let Some(st) = &self.bias {
            s += &format!(
                "    v += {} * {load}(c[(unsigned long long)row * {} + (unsigned long long)col * {}]);\n",
                crate::c_f32(self.beta),
                st[0],
                st[1]
            );
        }
        s += &format!("    v = {};\n", act_c(self.act, "v"));
        s += &format!("    out[(unsigned long long)row * {n} + col] = {store}(v);\n}}\n");
        s
    }

    /// Runs the description on the CPU as the kernel does (f32 accumulation
    /// in ascending k, then alpha, bias, activation).
    pub fn run_cpu(&self, a: &Tensor, b: &Tensor, c: Option<&Tensor>) -> Tensor {
        let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
        let cv = c.map(|c| c.to_f32_vec());
        let (m, n, k) = (self.m, self.n, self.k);
        let mut out = Vec::with_capacity(m * n);
        for row in 0..m {
            for col in 0..n {
                let mut acc = 0.0f32;
                for j in 0..k {
                    let x = if self.trans_a { av[j * m + row] } else { av[row * k + j] };
                    let y = if self.trans_b { bv[col * k + j] } else { bv[j * n + col] };
                    acc += x * y;
                }
                let mut v = self.alpha * acc;
                if let (Some(cv), Some(st)) = (&cv, &self.bias) {
                    v += self.beta * cv[row * st[0] + col * st[1]];
                }
                out.push(self.act.apply(v));
            }
        }
        Tensor::from_f32(vec![m, n], out).cast(self.dtype)
    }
}

/// The activation `act` applied to the C expression `x`.
pub fn act_c(act: Act, x: &str) -> String {
    match act {
        Act::None => x.to_string(),
        Act::Relu => format!("fmaxf({x}, 0.0f)"),
        Act::Clip(lo, hi) => format!("fminf(fmaxf({x}, {}), {})", crate::c_f32(lo), crate::c_f32(hi)),
        Act::Sigmoid => format!("1.0f / (1.0f + expf(-{x}))"),
        Act::Silu => format!("{x} / (1.0f + expf(-{x}))"),
    }
}
