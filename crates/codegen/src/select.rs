//! Kernels on any dtype, one thread per output element: the masks and
//! lookups of transformers (comparisons, boolean ops, `is_nan`, `where`,
//! casts from or to integers and bools, gather) and data movement by an
//! index map (slice, pad, expand, tile). Floats pass through untouched,
//! integers and bools stay exact: the CPU run moves elements, it never
//! converts them through f32. The same description renders to CUDA C.

use crate::layout::row_strides;
use smelt_ir::{BinaryOp, CompareOp, DType, KernelGraph, KernelOp, LogicOp, NodeId, Op, PadMode, Tensor, TensorData};

/// What each output element is.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// `a <op> b` (bool).
    Compare(CompareOp),
    /// `a <op> b` on bools.
    Logic(LogicOp),
    /// `!a`.
    Not,
    /// `a != a` (bool).
    IsNaN,
    /// `c ? x : y`.
    Where,
    /// Integer arithmetic (`+ - * / max min pow`), wrapping as the
    /// reference does; a division by zero or a negative power gives 0 (the
    /// reference executor refuses them).
    IntBinary(BinaryOp),
    /// The input converted to the output's dtype.
    Cast,
    /// `data[.., indices[j], ..]` along `axis`; an index outside the axis
    /// reads as zero (the reference executor refuses it).
    Gather {
        /// The indexed axis of data.
        axis: usize,
        /// Shape of the indices.
        indices: Vec<usize>,
    },
    /// Input element at `start + i * step` per dim.
    Slice {
        /// First index per dim.
        starts: Vec<i64>,
        /// Step per dim.
        steps: Vec<i64>,
    },
    /// Padding: begins per dim, then the fill.
    Pad {
        /// Elements added before each dim.
        begins: Vec<usize>,
        /// How the border is filled.
        mode: PadMode,
    },
    /// Input coordinate `i % extent` per dim (expand: extent 1; tile).
    Repeat,
}

/// A kernel on any dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Select {
    /// A stable, readable name, e.g. `where_2x4x16x16`.
    pub name: String,
    /// What it computes.
    pub kind: Kind,
    /// Per input: dtype and shape.
    pub inputs: Vec<(DType, Vec<usize>)>,
    /// The output shape.
    pub output: Vec<usize>,
    /// The output dtype.
    pub out: DType,
}

impl Select {
    /// The description of node `id`, if it is one of these ops.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Select> {
        let node = g.node(id);
        let KernelOp::Op(op) = &node.op else { return None };
        let ins = g.inputs_of(id);
        let out = &node.outputs[0];
        let kind = match op {
            Op::Compare(c) => Kind::Compare(*c),
            Op::Logic(l) => Kind::Logic(*l),
            Op::Not => Kind::Not,
            Op::IsNaN => Kind::IsNaN,
            Op::Where => Kind::Where,
            Op::Binary(b) if !out.dtype.is_float() && *b != BinaryOp::PRelu => Kind::IntBinary(*b),
            // Float to float casts are elementwise kernels.
            Op::Cast { .. } if !(out.dtype.is_float() && g.ty(ins[0]).dtype.is_float()) => Kind::Cast,
            Op::Gather { axis } => Kind::Gather { axis: *axis, indices: g.ty(ins[1]).shape.clone() },
            Op::Slice { axes, starts, steps, .. } => {
                let rank = out.shape.len();
                let (mut s, mut t) = (vec![0; rank], vec![1; rank]);
                for (k, &a) in axes.iter().enumerate() {
                    s[a] = starts[k];
                    t[a] = steps[k];
                }
                Kind::Slice { starts: s, steps: t }
            }
            Op::Pad { pads, mode } => Kind::Pad { begins: pads[..out.shape.len()].to_vec(), mode: *mode },
            Op::Expand { .. } | Op::Tile { .. } => Kind::Repeat,
            _ => return None,
        };
        let inputs: Vec<(DType, Vec<usize>)> = ins.iter().map(|v| (g.ty(*v).dtype, g.ty(*v).shape.clone())).collect();
        let tag = match &kind {
            Kind::Compare(c) => c.names().0.to_string(),
            Kind::Logic(l) => l.names().0.to_string(),
            Kind::Cast => format!("cast_{}_to_{}", inputs[0].0, out.dtype),
            Kind::Gather { axis, .. } => format!("gather_a{axis}"),
            Kind::Repeat => if matches!(op, Op::Expand { .. }) { "expand" } else { "tile" }.to_string(),
            _ => op.name().to_string(),
        };
        let dims = out.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let suffix = match &kind {
            Kind::Cast => String::new(),
            _ if inputs.iter().any(|(d, _)| *d != DType::F32) || out.dtype != DType::F32 => {
                format!("_{}", inputs.last().map_or(out.dtype, |i| i.0))
            }
            _ => String::new(),
        };
        Some(Select { name: format!("{tag}_{dims}{suffix}"), kind, inputs, output: out.shape.clone(), out: out.dtype })
    }

    /// Output elements (threads).
    pub fn numel(&self) -> usize {
        self.output.iter().product()
    }

    /// For output element `i`, the element index in each input (`None`: the
    /// pad value, or an out-of-range gather index).
    fn sources(&self, i: usize, indices: Option<&[i64]>) -> Vec<Option<usize>> {
        let coords = {
            let mut c = vec![0; self.output.len()];
            smelt_ir::index::unravel(i, &self.output, &mut c);
            c
        };
        let broadcast = |shape: &[usize]| {
            let st = smelt_ir::broadcast_strides(shape, &self.output);
            Some(coords.iter().zip(&st).map(|(c, s)| c * s).sum())
        };
        match &self.kind {
            Kind::Compare(_) | Kind::Logic(_) | Kind::Not | Kind::IsNaN | Kind::Where | Kind::Cast | Kind::IntBinary(_) => {
                self.inputs.iter().map(|(_, s)| broadcast(s)).collect()
            }
            Kind::Gather { axis, indices: ishape } => {
                let data = &self.inputs[0].1;
                let ni = ishape.len();
                let st = row_strides(data);
                let jst = row_strides(ishape);
                let j: usize = (0..ni).map(|k| coords[axis + k] * jst[k]).sum();
                let raw = indices.expect("gather reads its indices")[j];
                let dim = data[*axis] as i64;
                let v = if raw < 0 { raw + dim } else { raw };
                let src = (0..dim).contains(&v).then(|| {
                    let before: usize = (0..*axis).map(|d| coords[d] * st[d]).sum();
                    let after: usize = (axis + 1..data.len()).map(|d| coords[d + ni - 1] * st[d]).sum();
                    before + v as usize * st[*axis] + after
                });
                vec![src, Some(j)]
            }
            Kind::Slice { starts, steps } => {
                let st = row_strides(&self.inputs[0].1);
                vec![Some((0..coords.len()).map(|d| (starts[d] + coords[d] as i64 * steps[d]) as usize * st[d]).sum())]
            }
            Kind::Pad { begins, mode } => {
                let shape = &self.inputs[0].1;
                let st = row_strides(shape);
                let mut src = 0;
                for d in 0..coords.len() {
                    let (n, p) = (shape[d] as i64, coords[d] as i64 - begins[d] as i64);
                    let c = if (0..n).contains(&p) {
                        p
                    } else {
                        match mode {
                            PadMode::Constant(_) => return vec![None],
                            PadMode::Edge => p.clamp(0, n - 1),
                            PadMode::Reflect => {
                                // Mirror without repeating the edge, period 2n - 2.
                                let period = (2 * n - 2).max(1);
                                let m = p.rem_euclid(period);
                                if m < n {
                                    m
                                } else {
                                    period - m
                                }
                            }
                        }
                    };
                    src += c as usize * st[d];
                }
                vec![Some(src)]
            }
            Kind::Repeat => {
                let shape = &self.inputs[0].1;
                let st = row_strides(shape);
                let off = self.output.len() - shape.len();
                vec![Some((0..shape.len()).map(|d| (coords[d + off] % shape[d]) * st[d]).sum())]
            }
        }
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(in0, ..., out, n)`.
    pub fn cuda(&self) -> String {
        let ty = |d: DType| crate::c_type(d).0;
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!("// {}: {:?}, inputs {:?} -> {:?} {}\n", self.name, self.kind, self.inputs, self.output, self.out);
        // Integer arithmetic may be planned in place (its output over an
        // operand of the same shape): no `__restrict__` there.
        let restrict = if matches!(self.kind, Kind::IntBinary(_)) { "" } else { " __restrict__" };
        let params: Vec<String> = self.inputs.iter().enumerate().map(|(i, (d, _))| format!("const {}*{restrict} in{i}", ty(*d))).collect();
        s += &format!(
            "extern \"C\" __global__ void {}({}, {}*{restrict} out, unsigned long long n) {{\n",
            self.name,
            params.join(", "),
            ty(self.out)
        );
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n";
        // Output coordinates c0.. (innermost last).
        let r = self.output.len();
        if r > 0 {
            s += "    unsigned long long rem = i;\n";
            for d in (0..r).rev() {
                s += &format!("    unsigned long long c{d} = rem % {}ull; rem /= {}ull;\n", self.output[d], self.output[d]);
            }
        }
        let bcast = |shape: &[usize]| -> String {
            let st = smelt_ir::broadcast_strides(shape, &self.output);
            let terms: Vec<String> = (0..r).filter(|&d| st[d] != 0).map(|d| format!("c{d} * {}ull", st[d])).collect();
            if terms.is_empty() {
                "0ull".into()
            } else {
                terms.join(" + ")
            }
        };
        // A value of input k at index expression e, as f32 (floats) or as
        // the integer itself (integers, bools).
        let val = |k: usize, e: &str| -> String {
            let (d, _) = &self.inputs[k];
            match d {
                DType::F16 | DType::BF16 => format!("{}(in{k}[{e}])", crate::c_type(*d).1),
                _ => format!("in{k}[{e}]"),
            }
        };
        let store = |v: &str| -> String {
            match self.out {
                DType::F16 | DType::BF16 => format!("{}((float)({v}))", crate::c_type(self.out).2),
                DType::Bool => format!("(bool)({v})"),
                _ => format!("({})({v})", ty(self.out)),
            }
        };
        match &self.kind {
            Kind::Compare(c) => {
                let op = match c {
                    CompareOp::Equal => "==",
                    CompareOp::Less => "<",
                    CompareOp::LessOrEqual => "<=",
                    CompareOp::Greater => ">",
                    CompareOp::GreaterOrEqual => ">=",
                };
                let (a, b) = (val(0, &bcast(&self.inputs[0].1)), val(1, &bcast(&self.inputs[1].1)));
                s += &format!("    out[i] = ({a}) {op} ({b});\n");
            }
            Kind::Logic(l) => {
                let op = match l {
                    LogicOp::And => "&&",
                    LogicOp::Or => "||",
                    LogicOp::Xor => "!=",
                };
                s += &format!("    out[i] = ((bool)in0[{}]) {op} ((bool)in1[{}]);\n", bcast(&self.inputs[0].1), bcast(&self.inputs[1].1));
            }
            Kind::Not => s += &format!("    out[i] = !in0[{}];\n", bcast(&self.inputs[0].1)),
            Kind::IntBinary(b) => {
                // In 64 bits, unsigned where it must wrap; then narrowed.
                let (x, y) = (bcast(&self.inputs[0].1), bcast(&self.inputs[1].1));
                s += &format!("    long long a = (long long)in0[{x}], b = (long long)in1[{y}];\n");
                s += "    unsigned long long ua = (unsigned long long)a, ub = (unsigned long long)b;\n";
                s += &match b {
                    BinaryOp::Add => "    long long v = (long long)(ua + ub);\n".to_string(),
                    BinaryOp::Sub => "    long long v = (long long)(ua - ub);\n".to_string(),
                    BinaryOp::Mul => "    long long v = (long long)(ua * ub);\n".to_string(),
                    BinaryOp::Div => "    long long v = (b == 0) ? 0 : (b == -1 ? (long long)(0ull - ua) : a / b);\n".to_string(),
                    BinaryOp::Max => "    long long v = a > b ? a : b;\n".to_string(),
                    BinaryOp::Min => "    long long v = a < b ? a : b;\n".to_string(),
                    BinaryOp::PRelu => "    long long v = a >= 0 ? a : (long long)(ua * ub);\n".to_string(),
                    BinaryOp::Pow => "    unsigned long long r = 1ull;\n    if (b < 0) r = 0ull; else while (ub) { if (ub & 1ull) r *= ua; ua *= ua; ub >>= 1; }\n    long long v = (long long)r;\n"
                        .to_string(),
                };
                s += &format!("    out[i] = ({})v;\n", ty(self.out));
            }
            Kind::IsNaN => {
                let v = val(0, &bcast(&self.inputs[0].1));
                s += &format!("    float v = {v};\n    out[i] = v != v;\n");
            }
            Kind::Where => {
                let (c, x, y) = (bcast(&self.inputs[0].1), bcast(&self.inputs[1].1), bcast(&self.inputs[2].1));
                s += &format!("    out[i] = in0[{c}] ? in1[{x}] : in2[{y}];\n");
            }
            Kind::Cast => {
                let v = val(0, &bcast(&self.inputs[0].1));
                let v = if self.out == DType::Bool { format!("({v}) != 0") } else { v };
                s += &format!("    out[i] = {};\n", store(&v));
            }
            Kind::Gather { axis, indices } => {
                let data = &self.inputs[0].1;
                let ni = indices.len();
                let (st, jst) = (row_strides(data), row_strides(indices));
                let j: Vec<String> = (0..ni).map(|k| format!("c{} * {}ull", axis + k, jst[k])).collect();
                let j = if j.is_empty() { "0ull".to_string() } else { j.join(" + ") };
                s += &format!("    long long v = (long long)in1[{j}];\n    if (v < 0) v += {}ll;\n", data[*axis]);
                let mut src: Vec<String> = (0..*axis).map(|d| format!("c{d} * {}ull", st[d])).collect();
                src.push(format!("(unsigned long long)v * {}ull", st[*axis]));
                src.extend((axis + 1..data.len()).map(|d| format!("c{} * {}ull", d + ni - 1, st[d])));
                // Zero of the output type: halves have no conversion from int.
                let zero = match self.out {
                    DType::F16 | DType::BF16 => format!("{}(0.0f)", crate::c_type(self.out).2),
                    d => format!("({})0", ty(d)),
                };
                s += &format!("    out[i] = (v >= 0 && v < {}ll) ? in0[{}] : {zero};\n", data[*axis], src.join(" + "));
            }
            Kind::Slice { starts, steps } => {
                let st = row_strides(&self.inputs[0].1);
                let src: Vec<String> = (0..r)
                    .map(|d| format!("(unsigned long long)({}ll + (long long)c{d} * {}ll) * {}ull", starts[d], steps[d], st[d]))
                    .collect();
                let src = if src.is_empty() { "0ull".to_string() } else { src.join(" + ") };
                s += &format!("    out[i] = in0[{src}];\n");
            }
            Kind::Pad { begins, mode } => {
                let shape = &self.inputs[0].1;
                let st = row_strides(shape);
                s += "    unsigned long long src = 0;\n";
                for d in 0..r {
                    let n = shape[d] as i64;
                    s += &format!("    {{ long long p = (long long)c{d} - {}ll;\n", begins[d]);
                    match mode {
                        PadMode::Constant(v) => {
                            let fill =
                                if self.out.is_float() { store(&crate::c_f32(*v)) } else { format!("({}){}", ty(self.out), *v as i64) };
                            s += &format!("      if (p < 0 || p >= {n}ll) {{ out[i] = {fill}; return; }}\n");
                        }
                        PadMode::Edge => s += &format!("      p = p < 0 ? 0 : (p >= {n}ll ? {}ll : p);\n", n - 1),
                        PadMode::Reflect => {
                            let period = (2 * n - 2).max(1);
                            s += &format!("      long long m = ((p % {period}ll) + {period}ll) % {period}ll;\n      p = m < {n}ll ? m : {period}ll - m;\n");
                        }
                    }
                    s += &format!("      src += (unsigned long long)p * {}ull; }}\n", st[d]);
                }
                s += "    out[i] = in0[src];\n";
            }
            Kind::Repeat => {
                let shape = &self.inputs[0].1;
                let st = row_strides(shape);
                let off = r - shape.len();
                let src: Vec<String> = (0..shape.len()).map(|d| format!("(c{} % {}ull) * {}ull", d + off, shape[d], st[d])).collect();
                let src = if src.is_empty() { "0ull".to_string() } else { src.join(" + ") };
                s += &format!("    out[i] = in0[{src}];\n");
            }
        }
        s += "}\n";
        s
    }

    /// Runs the description on the CPU as the kernel does: elements moved
    /// or selected exactly, comparisons on the values themselves.
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        let n = self.numel();
        let gather_idx = matches!(self.kind, Kind::Gather { .. }).then(|| inputs[1].to_i64_vec());
        let src: Vec<Vec<Option<usize>>> = (0..n).map(|i| self.sources(i, gather_idx.as_deref())).collect();
        let ty = smelt_ir::TensorType::new(self.out, self.output.clone());
        let bools = |v: Vec<bool>| Tensor::new(self.output.clone(), TensorData::Bool(v)).expect("count matches");
        // Exact numbers: f64 holds every float and every i32; i64 as itself.
        let num = |t: &Tensor| -> Vec<f64> { t.to_f32_vec().into_iter().map(f64::from).collect() };
        match &self.kind {
            Kind::Compare(c) => {
                let ints = !inputs[0].ty().dtype.is_float();
                let (a, b) = (inputs[0].to_i64_vec(), inputs[1].to_i64_vec());
                let (x, y) = (num(inputs[0]), num(inputs[1]));
                bools(
                    src.iter()
                        .map(|s| {
                            let (i, j) = (s[0].expect("in range"), s[1].expect("in range"));
                            if ints {
                                c.apply(a[i], b[j])
                            } else {
                                c.apply(x[i], y[j])
                            }
                        })
                        .collect(),
                )
            }
            Kind::Logic(l) => {
                let (a, b) = (inputs[0].to_i64_vec(), inputs[1].to_i64_vec());
                bools(src.iter().map(|s| l.apply(a[s[0].expect("in range")] != 0, b[s[1].expect("in range")] != 0)).collect())
            }
            Kind::Not => {
                let a = inputs[0].to_i64_vec();
                bools(src.iter().map(|s| a[s[0].expect("in range")] == 0).collect())
            }
            Kind::IntBinary(b) => {
                let (a, c) = (inputs[0].to_i64_vec(), inputs[1].to_i64_vec());
                let f = |x: i64, y: i64| match b {
                    BinaryOp::Add => x.wrapping_add(y),
                    BinaryOp::Sub => x.wrapping_sub(y),
                    BinaryOp::Mul => x.wrapping_mul(y),
                    BinaryOp::Div if y == 0 => 0,
                    BinaryOp::Div => x.wrapping_div(y),
                    BinaryOp::Max => x.max(y),
                    BinaryOp::Min => x.min(y),
                    BinaryOp::PRelu if x >= 0 => x,
                    BinaryOp::PRelu => x.wrapping_mul(y),
                    BinaryOp::Pow if y < 0 => 0,
                    BinaryOp::Pow => {
                        let (mut r, mut base, mut e) = (1i64, x, y as u64);
                        while e > 0 {
                            if e & 1 == 1 {
                                r = r.wrapping_mul(base);
                            }
                            base = base.wrapping_mul(base);
                            e >>= 1;
                        }
                        r
                    }
                };
                let v = src.iter().map(|s| f(a[s[0].expect("in range")], c[s[1].expect("in range")])).collect();
                Tensor::from_i64(self.output.clone(), v).cast(self.out)
            }
            Kind::IsNaN => {
                let a = num(inputs[0]);
                bools(src.iter().map(|s| a[s[0].expect("in range")].is_nan()).collect())
            }
            Kind::Cast => {
                let order: Vec<usize> = src.iter().map(|s| s[0].expect("in range")).collect();
                inputs[0].take(&order, self.output.clone()).cast(self.out)
            }
            Kind::Where => {
                let c = inputs[0].to_i64_vec();
                // Concatenate x and y, then pick from the one the condition names.
                let xn = inputs[1].ty().numel();
                let order: Vec<usize> = src
                    .iter()
                    .map(|s| if c[s[0].expect("in range")] != 0 { s[1].expect("in range") } else { xn + s[2].expect("in range") })
                    .collect();
                inputs[1].concat_flat(inputs[2]).expect("one dtype").take(&order, self.output.clone())
            }
            Kind::Gather { .. } | Kind::Slice { .. } | Kind::Repeat | Kind::Pad { .. } => {
                let fill = match self.kind {
                    Kind::Pad { mode: PadMode::Constant(v), .. } => v as f64,
                    _ => 0.0,
                };
                let order: Vec<Option<usize>> = src.iter().map(|s| s[0]).collect();
                let data = inputs[0];
                let filled = Tensor::full(&smelt_ir::TensorType::new(data.ty().dtype, vec![1]), fill);
                let dn = data.ty().numel();
                let order: Vec<usize> = order.into_iter().map(|o| o.unwrap_or(dn)).collect();
                data.concat_flat(&filled).expect("one dtype").take(&order, ty.shape)
            }
        }
    }
}
