//! Elementwise kernels as data: one thread per output element, each input
//! read through its broadcast strides, the expression evaluated in f32 in
//! registers, the result stored in the output's dtype. The same description
//! renders to CUDA C ([`Elementwise::cuda`]) and runs on the CPU
//! ([`Elementwise::run_cpu`]), so CI checks the numbers of every kernel.

use smelt_ir::{BinaryOp, DType, Expr, ExprNode, KernelGraph, KernelOp, NodeId, Op, Tensor, UnaryOp};

/// An elementwise kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Elementwise {
    /// A stable, readable name, e.g. `ew_relu_add_mul_n1c64h56w56`.
    pub name: String,
    /// The expression; `$i` is input i.
    pub expr: Expr,
    /// The output shape (every input broadcasts to it).
    pub shape: Vec<usize>,
    /// Per input: its dtype and its element strides in the output's index
    /// space (0 along broadcast dims).
    pub inputs: Vec<(DType, Vec<usize>)>,
    /// The output dtype.
    pub out: DType,
    /// Four elements per thread through 16-byte `float4` loads and stores
    /// (set by the lowering where [`Elementwise::vectorizable`] and every
    /// operand's address is 16-byte aligned).
    pub vector: bool,
}

pub use smelt_ir::broadcast_strides as strides;

/// The last four operations of `expr`, outermost first, each after `_`
/// (`_relu_add` for `relu(add($0, $1))`): part of a kernel's name.
pub(crate) fn ops_tag(expr: &Expr) -> String {
    expr.nodes
        .iter()
        .rev()
        .filter_map(|n| match n {
            ExprNode::Unary(u, _) => Some(Op::Unary(*u).name()),
            ExprNode::Binary(b, ..) => Some(Op::Binary(*b).name()),
            ExprNode::Clip(..) => Some("clip"),
            ExprNode::Cast(..) => Some("cast"),
            _ => None,
        })
        .take(4)
        .map(|n| format!("_{n}"))
        .collect()
}

fn shape_tag(shape: &[usize]) -> String {
    let letters = ["n", "c", "h", "w"];
    if shape.len() == 4 {
        shape.iter().zip(letters).map(|(d, l)| format!("{l}{d}")).collect()
    } else {
        shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
    }
}

impl Elementwise {
    /// The description of node `id` of `g`, if it is an elementwise kernel
    /// (a fused `elementwise`, or a single unary, binary, clip or sum).
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Elementwise> {
        let node = g.node(id);
        let ins = g.inputs_of(id);
        if ins.iter().any(|v| !g.ty(*v).dtype.is_float()) {
            return None;
        }
        if let KernelOp::Op(Op::BatchNorm { epsilon }) = node.op {
            return Elementwise::batch_norm(g, id, epsilon);
        }
        let expr = Expr::of_kernel(&node.op, ins.len())?;
        let out = &node.outputs[0];
        if !out.dtype.is_float() {
            return None;
        }
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        let name = format!("ew{}_{}{suffix}", ops_tag(&expr), shape_tag(&out.shape));
        let inputs = ins.iter().map(|v| (g.ty(*v).dtype, strides(&g.ty(*v).shape, &out.shape))).collect();
        Some(Elementwise { name, expr, shape: out.shape.clone(), inputs, out: out.dtype, vector: false })
    }

    /// Inference batch norm as its own kernel (when fusion does not fold it):
    /// `x * scale + shift` with `scale = s / sqrt(var + eps)` and `shift =
    /// b - mean * scale` per channel (axis 1), in the reference executor's
    /// order of operations.
    fn batch_norm(g: &KernelGraph, id: NodeId, epsilon: f32) -> Option<Elementwise> {
        let ins = g.inputs_of(id);
        let out = &g.node(id).outputs[0];
        if ins.len() != 5 || out.shape.len() < 2 || !out.dtype.is_float() {
            return None;
        }
        let mut e = Expr::default();
        let [x, s, b, m, v] = [0, 1, 2, 3, 4].map(|i| e.push(ExprNode::Input(i)));
        let eps = e.push(ExprNode::Const(epsilon));
        let var = e.push(ExprNode::Binary(BinaryOp::Add, v, eps));
        let root = e.push(ExprNode::Unary(UnaryOp::Sqrt, var));
        let scale = e.push(ExprNode::Binary(BinaryOp::Div, s, root));
        let ms = e.push(ExprNode::Binary(BinaryOp::Mul, m, scale));
        let shift = e.push(ExprNode::Binary(BinaryOp::Sub, b, ms));
        let xs = e.push(ExprNode::Binary(BinaryOp::Mul, x, scale));
        e.push(ExprNode::Binary(BinaryOp::Add, xs, shift));
        let per_channel: Vec<usize> = (0..out.shape.len()).map(|d| usize::from(d == 1)).collect();
        let mut inputs = vec![(g.ty(ins[0]).dtype, strides(&g.ty(ins[0]).shape, &out.shape))];
        for p in &ins[1..] {
            if g.ty(*p).numel() != out.shape[1] {
                return None;
            }
            inputs.push((g.ty(*p).dtype, per_channel.clone()));
        }
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        let name = format!("bn_{}{suffix}", shape_tag(&out.shape));
        Some(Elementwise { name, expr: e, shape: out.shape.clone(), inputs, out: out.dtype, vector: false })
    }

    /// Number of output elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Threads to launch: one per element, or per four with [`Elementwise::vector`].
    pub fn threads(&self) -> usize {
        if self.vector {
            self.numel() / 4
        } else {
            self.numel()
        }
    }

    /// Whether four elements per thread work: f32 throughout, no input
    /// broadcast, a multiple of four elements.
    pub fn vectorizable(&self) -> bool {
        let dense = strides(&self.shape, &self.shape);
        self.out == DType::F32 && (self.numel() & 3) == 0 && self.inputs.iter().all(|(d, st)| *d == DType::F32 && *st == dense)
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(in0, in1, ..., out, n)`.
    pub fn cuda(&self) -> String {
        if self.vector {
            return self.cuda_vector();
        }
        let ty = |d: DType| crate::c_type(d).0;
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!("// {}: {} over {:?}\n", self.name, self.expr, self.shape);
        let params: Vec<String> = self.inputs.iter().enumerate().map(|(i, (d, _))| format!("const {}* in{i}", ty(*d))).collect();
        // No `__restrict__`: the plan may make the output any input (in place).
        s +=
            &format!("extern \"C\" __global__ void {}({}, {}* out, unsigned long long n) {{\n", self.name, params.join(", "), ty(self.out));
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n";
        s += &expr_c(&self.expr, &self.shape, &self.inputs, "i").replace("    return ", "    float result = ");
        let last = "result".to_string();
        s += &format!("    out[i] = {};\n}}\n", crate::store_c(self.out, &last));
        s
    }

    /// The four-wide kernel: `float4` loads, the expression per lane, one
    /// `float4` store; `n` counts elements.
    fn cuda_vector(&self) -> String {
        let k = self.inputs.len();
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!("// {}: {} over {:?}, four elements per thread\n", self.name, self.expr, self.shape);
        let args: Vec<String> = (0..k).map(|i| format!("float a{i}")).collect();
        s += &format!("__device__ __forceinline__ float value_{}({}) {{\n", self.name, args.join(", "));
        s += &expr_body(&self.expr);
        s += "}\n\n";
        let params: Vec<String> = (0..k).map(|i| format!("const float4* in{i}")).collect();
        s += &format!("extern \"C\" __global__ void {}({}, float4* out, unsigned long long n) {{\n", self.name, params.join(", "));
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i * 4 >= n) return;\n";
        for i in 0..k {
            s += &format!("    float4 v{i} = in{i}[i];\n");
        }
        s += "    float4 r;\n";
        for lane in ["x", "y", "z", "w"] {
            let a: Vec<String> = (0..k).map(|i| format!("v{i}.{lane}")).collect();
            s += &format!("    r.{lane} = value_{}({});\n", self.name, a.join(", "));
        }
        s += "    out[i] = r;\n}\n";
        s
    }

    /// Runs the description on the CPU exactly as the kernel does (f32 in
    /// registers, inputs and output rounded to their dtypes).
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        eval_cpu(&self.expr, &self.shape, &self.inputs, inputs).cast(self.out)
    }
}

/// `expr` at every index of `shape` in f32, each input read through its
/// strides in `layout`, as the generated code does.
pub(crate) fn eval_cpu(expr: &Expr, shape: &[usize], layout: &[(DType, Vec<usize>)], inputs: &[&Tensor]) -> Tensor {
    let vals: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let (mut a, mut scratch) = (vec![0f32; inputs.len()], Vec::new());
    for i in 0..n {
        let mut r = i;
        let mut offs = vec![0usize; inputs.len()];
        for d in (0..shape.len()).rev() {
            let c = r % shape[d];
            r /= shape[d];
            for (k, (_, st)) in layout.iter().enumerate() {
                offs[k] += c * st[d];
            }
        }
        for k in 0..inputs.len() {
            a[k] = vals[k][offs[k]];
        }
        out.push(expr.eval(&a, &mut scratch));
    }
    Tensor::from_f32(shape.to_vec(), out)
}

/// C statements that load each input at flat index `idx` of `shape` (through
/// its broadcast strides), evaluate `expr` in f32 and `return` the result.
pub fn expr_c(expr: &Expr, shape: &[usize], inputs: &[(DType, Vec<usize>)], idx: &str) -> String {
    expr_c_at(expr, shape, inputs, idx, None)
}

/// As [`expr_c`], but input `register` (if any) is not loaded: it is the
/// f32 variable `p` (a GEMM epilogue's product, still in registers).
pub fn expr_c_at(expr: &Expr, shape: &[usize], inputs: &[(DType, Vec<usize>)], idx: &str, register: Option<usize>) -> String {
    let load = |d: DType, v: String| match d {
        DType::F16 => format!("__half2float({v})"),
        DType::BF16 => format!("__bfloat162float({v})"),
        _ => v,
    };
    let mut s = String::new();
    // Coordinates, only when some input broadcasts.
    let broadcast = inputs.iter().any(|(_, st)| st != &strides(shape, shape));
    if broadcast {
        s += &format!("    unsigned long long r = {idx};\n");
        for d in (0..shape.len()).rev() {
            s += &format!("    unsigned long long c{d} = r % {}ull; r /= {}ull;\n", shape[d], shape[d]);
        }
    }
    for (k, (d, st)) in inputs.iter().enumerate() {
        if register == Some(k) {
            s += &format!("    float a{k} = p;\n");
            continue;
        }
        let at = if broadcast {
            let terms: Vec<String> = st
                .iter()
                .enumerate()
                .filter(|(_, &x)| x != 0)
                .map(|(d, &x)| if x == 1 { format!("c{d}") } else { format!("c{d} * {x}ull") })
                .collect();
            if terms.is_empty() {
                "0".to_string()
            } else {
                terms.join(" + ")
            }
        } else {
            idx.to_string()
        };
        s += &format!("    float a{k} = {};\n", load(*d, format!("in{k}[{at}]")));
    }
    s + &expr_body(expr)
}

/// C statements evaluating `expr` in f32 from the inputs `a0`, `a1`, ...
/// and `return`ing the result.
pub(crate) fn expr_body(expr: &Expr) -> String {
    let mut s = String::new();
    for (j, n) in expr.nodes.iter().enumerate() {
        let v = match *n {
            ExprNode::Input(k) => format!("a{k}"),
            ExprNode::Const(c) => crate::c_f32(c),
            ExprNode::Unary(u, a) => unary_c(u, &format!("t{a}")),
            ExprNode::Binary(b, x, y) => binary_c(b, &format!("t{x}"), &format!("t{y}")),
            ExprNode::Clip(lo, hi, a) => crate::c_clip(&format!("t{a}"), lo, hi),
            ExprNode::Cast(DType::F16, a) => format!("__half2float(__float2half(t{a}))"),
            ExprNode::Cast(DType::BF16, a) => format!("__bfloat162float(__float2bfloat16(t{a}))"),
            ExprNode::Cast(_, a) => format!("t{a}"),
        };
        s += &format!("    float t{j} = {v};\n");
    }
    s += &format!("    return t{};\n", expr.nodes.len() - 1);
    s
}

pub(crate) fn unary_c(u: UnaryOp, x: &str) -> String {
    match u {
        UnaryOp::Relu => crate::c_max(x, "0.0f"),
        UnaryOp::Sigmoid => format!("1.0f / (1.0f + expf(-{x}))"),
        UnaryOp::Tanh => format!("tanhf({x})"),
        UnaryOp::Erf => format!("erff({x})"),
        UnaryOp::Sqrt => format!("sqrtf({x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Neg => format!("-{x}"),
        UnaryOp::Abs => format!("fabsf({x})"),
        UnaryOp::Reciprocal => format!("1.0f / {x}"),
        UnaryOp::Sign => format!("(float)(({x} > 0.0f) - ({x} < 0.0f))"),
        UnaryOp::Softplus => format!("({x} > 20.0f ? {x} : log1pf(expf({x})))"),
        UnaryOp::LeakyRelu(a) => format!("({x} >= 0.0f ? {x} : {} * {x})", crate::c_f32(a)),
        UnaryOp::Elu(a) => format!("({x} >= 0.0f ? {x} : {} * expm1f({x}))", crate::c_f32(a)),
        UnaryOp::Selu(a, g) => format!("{} * ({x} > 0.0f ? {x} : {} * expm1f({x}))", crate::c_f32(g), crate::c_f32(a)),
        UnaryOp::Gelu => format!("0.5f * {x} * (1.0f + erff({x} * 0.70710678118654752f))"),
        UnaryOp::GeluTanh => format!("0.5f * {x} * (1.0f + tanhf(0.79788456080286536f * ({x} + 0.044715f * {x} * {x} * {x})))"),
        UnaryOp::Floor => format!("floorf({x})"),
        UnaryOp::Ceil => format!("ceilf({x})"),
        // Round to nearest, halves to even (the default rounding mode).
        UnaryOp::Round => format!("rintf({x})"),
        UnaryOp::Sin => format!("sinf({x})"),
        UnaryOp::Cos => format!("cosf({x})"),
    }
}

fn binary_c(b: BinaryOp, x: &str, y: &str) -> String {
    match b {
        BinaryOp::Add => format!("{x} + {y}"),
        BinaryOp::Sub => format!("{x} - {y}"),
        BinaryOp::Mul => format!("{x} * {y}"),
        BinaryOp::Div => format!("{x} / {y}"),
        BinaryOp::Pow => format!("powf({x}, {y})"),
        BinaryOp::Max => crate::c_max(x, y),
        BinaryOp::Min => crate::c_min(x, y),
        BinaryOp::PRelu => format!("({x} >= 0.0f ? {x} : {y} * {x})"),
    }
}
