//! Op attributes as `key=value` pairs: the one place that maps [`Op`] to and
//! from the text format's attribute lists.

use crate::dtype::DType;
use crate::kernel_op::KernelOp;
use crate::op::{BinaryOp, CompareOp, Conv, LogicOp, Named, Op, Optimizer, PadMode, Pool, ReduceOp, Schedule, UnaryOp};
use std::collections::BTreeMap;
use std::fmt;

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A float (printed so that it parses back to the same bits).
    Float(f32),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A boolean.
    Bool(bool),
    /// A dtype.
    DType(DType),
    /// A string (activations, expressions), printed quoted.
    Str(String),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Float(x) => write!(f, "{x:?}"),
            Attr::Ints(v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::DType(d) => write!(f, "{d}"),
            Attr::Str(s) => f.write_str(&super::print::quote(s)),
        }
    }
}

/// The attributes of LRN and its gradient.
fn lrn(l: &crate::Lrn) -> Vec<(&'static str, Attr)> {
    vec![("size", Attr::Int(l.size as i64)), ("alpha", Attr::Float(l.alpha)), ("beta", Attr::Float(l.beta)), ("bias", Attr::Float(l.bias))]
}

fn ints(v: &[usize]) -> Attr {
    Attr::Ints(v.iter().map(|&x| x as i64).collect())
}

/// The attributes of `op`, in printing order.
pub fn attrs_of(op: &Op) -> Vec<(&'static str, Attr)> {
    use Attr::*;
    let pool = |p: &Pool| {
        vec![("kernel", ints(&p.kernel)), ("strides", ints(&p.strides)), ("pads", ints(&p.pads)), ("ceil_mode", Bool(p.ceil_mode))]
    };
    let conv = |c: &Conv| {
        vec![("strides", ints(&c.strides)), ("pads", ints(&c.pads)), ("dilations", ints(&c.dilations)), ("group", Int(c.group as i64))]
    };
    let with_shape = |mut a: Vec<(&'static str, Attr)>, shape: &[usize]| {
        a.push(("shape", ints(shape)));
        a
    };
    match op {
        Op::Conv(c) => conv(c),
        Op::ConvGradData { conv: c, shape } | Op::ConvGradWeight { conv: c, shape } => with_shape(conv(c), shape),
        Op::MaxPoolGrad(p) => pool(p),
        Op::GatherGrad { axis, shape } => vec![("axis", Int(*axis as i64)), ("shape", ints(shape))],
        Op::AvgPoolGrad { pool: p, count_include_pad, shape } => {
            let mut a = pool(p);
            a.push(("count_include_pad", Bool(*count_include_pad)));
            with_shape(a, shape)
        }
        Op::LrnGrad(l) => lrn(l),
        Op::Update(Optimizer::Sgd { lr, momentum, dampening, nesterov, weight_decay, accumulate, schedule }) => vec![
            ("lr", Float(*lr)),
            ("momentum", Float(*momentum)),
            ("dampening", Float(*dampening)),
            ("nesterov", Bool(*nesterov)),
            ("weight_decay", Float(*weight_decay)),
            ("accumulate", Int(*accumulate as i64)),
            ("warmup", Int(schedule.warmup as i64)),
            ("total", Int(schedule.total as i64)),
        ],
        Op::Update(Optimizer::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, accumulate, schedule }) => vec![
            ("lr", Float(*lr)),
            ("beta1", Float(*beta1)),
            ("beta2", Float(*beta2)),
            ("eps", Float(*eps)),
            ("weight_decay", Float(*weight_decay)),
            ("decoupled", Bool(*decoupled)),
            ("accumulate", Int(*accumulate as i64)),
            ("warmup", Int(schedule.warmup as i64)),
            ("total", Int(schedule.total as i64)),
        ],
        Op::Update(Optimizer::Ema { momentum }) => vec![("momentum", Float(*momentum))],
        Op::Update(Optimizer::Count) => vec![],
        Op::BatchNorm { epsilon } => vec![("epsilon", Float(*epsilon))],
        Op::Unary(u) => u.params().into_iter().map(|(k, v)| (k, Float(v))).collect(),
        Op::Clip { min, max } => vec![("min", Float(*min)), ("max", Float(*max))],
        Op::MaxPool(p) => pool(p),
        Op::AveragePool { pool: p, count_include_pad } => {
            let mut a = pool(p);
            a.push(("count_include_pad", Bool(*count_include_pad)));
            a
        }
        Op::Reduce { axes, keepdims, .. } => {
            vec![("axes", ints(axes)), ("keepdims", Bool(*keepdims))]
        }
        Op::Gemm { trans_a, trans_b, alpha, beta } => {
            vec![("trans_a", Bool(*trans_a)), ("trans_b", Bool(*trans_b)), ("alpha", Float(*alpha)), ("beta", Float(*beta))]
        }
        Op::Gather { axis } | Op::Concat { axis } | Op::Flatten { axis } | Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            vec![("axis", Int(*axis as i64))]
        }
        Op::Split { axis, sizes } => vec![("axis", Int(*axis as i64)), ("sizes", ints(sizes))],
        Op::Slice { axes, starts, ends, steps } => {
            vec![("axes", ints(axes)), ("starts", Ints(starts.clone())), ("ends", Ints(ends.clone())), ("steps", Ints(steps.clone()))]
        }
        Op::Reshape { shape } => vec![("shape", ints(shape))],
        Op::Transpose { perm } => vec![("perm", ints(perm))],
        Op::Squeeze { axes } | Op::Unsqueeze { axes } => vec![("axes", ints(axes))],
        Op::LayerNorm { axis, epsilon } => {
            vec![("axis", Int(*axis as i64)), ("epsilon", Float(*epsilon))]
        }
        Op::Lrn(l) => lrn(l),
        Op::Cast { to } => vec![("to", DType(*to))],
        Op::Pad { pads, mode } => {
            let mut a = vec![("pads", ints(pads))];
            match mode {
                PadMode::Constant(v) => a.extend([("mode", Str("constant".into())), ("value", Float(*v))]),
                PadMode::Reflect => a.push(("mode", Str("reflect".into()))),
                PadMode::Edge => a.push(("mode", Str("edge".into()))),
            }
            a
        }
        Op::Expand { shape } => vec![("shape", ints(shape))],
        Op::Tile { repeats } => vec![("repeats", ints(repeats))],
        Op::Input
        | Op::Constant
        | Op::Parameter
        | Op::State
        | Op::Binary(_)
        | Op::Sum
        | Op::Compare(_)
        | Op::Logic(_)
        | Op::Not
        | Op::IsNaN
        | Op::Where
        | Op::GlobalAveragePool
        | Op::MatMul
        | Op::Dropout
        | Op::Identity => vec![],
    }
}

/// Attributes being consumed while building an op; reports missing,
/// ill-typed and left-over keys.
pub struct Attrs(pub BTreeMap<String, Attr>);

impl Attrs {
    fn take(&mut self, k: &str) -> Result<Attr, String> {
        self.0.remove(k).ok_or_else(|| format!("missing attribute {k}"))
    }
    fn int(&mut self, k: &str) -> Result<i64, String> {
        match self.take(k)? {
            Attr::Int(i) => Ok(i),
            a => Err(format!("attribute {k}={a} must be an integer")),
        }
    }
    fn usize(&mut self, k: &str) -> Result<usize, String> {
        usize::try_from(self.int(k)?).map_err(|_| format!("attribute {k} must be non-negative"))
    }
    fn float(&mut self, k: &str) -> Result<f32, String> {
        match self.take(k)? {
            Attr::Float(x) => Ok(x),
            Attr::Int(i) => Ok(i as f32),
            a => Err(format!("attribute {k}={a} must be a float")),
        }
    }
    fn bool(&mut self, k: &str) -> Result<bool, String> {
        match self.take(k)? {
            Attr::Bool(b) => Ok(b),
            a => Err(format!("attribute {k}={a} must be true or false")),
        }
    }
    fn ints(&mut self, k: &str) -> Result<Vec<i64>, String> {
        match self.take(k)? {
            Attr::Ints(v) => Ok(v),
            a => Err(format!("attribute {k}={a} must be a list of integers")),
        }
    }
    fn lrn(&mut self) -> Result<crate::Lrn, String> {
        Ok(crate::Lrn { size: self.usize("size")?, alpha: self.float("alpha")?, beta: self.float("beta")?, bias: self.float("bias")? })
    }
    fn usizes(&mut self, k: &str) -> Result<Vec<usize>, String> {
        self.ints(k)?.into_iter().map(|x| usize::try_from(x).map_err(|_| format!("attribute {k} must be non-negative"))).collect()
    }
    fn parsed<T: std::str::FromStr<Err = String>>(&mut self, k: &str) -> Result<T, String> {
        match self.take(k)? {
            Attr::Str(s) => s.parse(),
            a => Err(format!("attribute {k}={a} must be a string")),
        }
    }
    fn conv(&mut self) -> Result<Conv, String> {
        Ok(Conv {
            strides: self.usizes("strides")?,
            pads: self.usizes("pads")?,
            dilations: self.usizes("dilations")?,
            group: self.usize("group")?,
        })
    }
    fn pool(&mut self) -> Result<Pool, String> {
        Ok(Pool {
            kernel: self.usizes("kernel")?,
            strides: self.usizes("strides")?,
            pads: self.usizes("pads")?,
            ceil_mode: self.bool("ceil_mode")?,
        })
    }
}

/// Builds the op named `name` from its attributes.
pub fn op_from(name: &str, mut a: Attrs) -> Result<Op, String> {
    let unary = |u| Ok(Op::Unary(u));
    let binary = |b| Ok(Op::Binary(b));
    let op = match name {
        "input" => Ok(Op::Input),
        "const" => Ok(Op::Constant),
        "param" => Ok(Op::Parameter),
        "state" => Ok(Op::State),
        "conv" => Ok(Op::Conv(a.conv()?)),
        "pad" => {
            let pads = a.usizes("pads")?;
            let mode = match a.take("mode")? {
                Attr::Str(m) if m == "constant" => PadMode::Constant(a.float("value")?),
                Attr::Str(m) if m == "reflect" => PadMode::Reflect,
                Attr::Str(m) if m == "edge" => PadMode::Edge,
                x => return Err(format!("pad mode {x} must be \"constant\", \"reflect\" or \"edge\"")),
            };
            Ok(Op::Pad { pads, mode })
        }
        "expand" => Ok(Op::Expand { shape: a.usizes("shape")? }),
        "tile" => Ok(Op::Tile { repeats: a.usizes("repeats")? }),
        "gather" => Ok(Op::Gather { axis: a.usize("axis")? }),
        "batch_norm" => Ok(Op::BatchNorm { epsilon: a.float("epsilon")? }),
        name if UnaryOp::by_name(name).is_some() => {
            let u = UnaryOp::by_name(name).expect("just found");
            let p = u.params().iter().map(|(k, _)| a.float(k)).collect::<Result<Vec<f32>, String>>()?;
            unary(u.with_params(&p))
        }
        "clip" => Ok(Op::Clip { min: a.float("min")?, max: a.float("max")? }),
        "add" => binary(BinaryOp::Add),
        "sub" => binary(BinaryOp::Sub),
        "mul" => binary(BinaryOp::Mul),
        "div" => binary(BinaryOp::Div),
        "pow" => binary(BinaryOp::Pow),
        "max" => binary(BinaryOp::Max),
        "min" => binary(BinaryOp::Min),
        "prelu" => binary(BinaryOp::PRelu),
        "sum" => Ok(Op::Sum),
        "not" => Ok(Op::Not),
        "is_nan" => Ok(Op::IsNaN),
        "where" => Ok(Op::Where),
        name if CompareOp::by_name(name).is_some() => Ok(Op::Compare(CompareOp::by_name(name).expect("just found"))),
        name if LogicOp::by_name(name).is_some() => Ok(Op::Logic(LogicOp::by_name(name).expect("just found"))),
        "max_pool" => Ok(Op::MaxPool(a.pool()?)),
        "avg_pool" => Ok(Op::AveragePool { pool: a.pool()?, count_include_pad: a.bool("count_include_pad")? }),
        "global_avg_pool" => Ok(Op::GlobalAveragePool),
        "reduce_mean" | "reduce_sum" | "reduce_max" => {
            let op = match name {
                "reduce_mean" => ReduceOp::Mean,
                "reduce_sum" => ReduceOp::Sum,
                _ => ReduceOp::Max,
            };
            Ok(Op::Reduce { op, axes: a.usizes("axes")?, keepdims: a.bool("keepdims")? })
        }
        "gemm" => {
            Ok(Op::Gemm { trans_a: a.bool("trans_a")?, trans_b: a.bool("trans_b")?, alpha: a.float("alpha")?, beta: a.float("beta")? })
        }
        "matmul" => Ok(Op::MatMul),
        "concat" => Ok(Op::Concat { axis: a.usize("axis")? }),
        "split" => Ok(Op::Split { axis: a.usize("axis")?, sizes: a.usizes("sizes")? }),
        "slice" => Ok(Op::Slice { axes: a.usizes("axes")?, starts: a.ints("starts")?, ends: a.ints("ends")?, steps: a.ints("steps")? }),
        "reshape" => Ok(Op::Reshape { shape: a.usizes("shape")? }),
        "flatten" => Ok(Op::Flatten { axis: a.usize("axis")? }),
        "transpose" => Ok(Op::Transpose { perm: a.usizes("perm")? }),
        "squeeze" => Ok(Op::Squeeze { axes: a.usizes("axes")? }),
        "unsqueeze" => Ok(Op::Unsqueeze { axes: a.usizes("axes")? }),
        "softmax" => Ok(Op::Softmax { axis: a.usize("axis")? }),
        "log_softmax" => Ok(Op::LogSoftmax { axis: a.usize("axis")? }),
        "layer_norm" => Ok(Op::LayerNorm { axis: a.usize("axis")?, epsilon: a.float("epsilon")? }),
        "lrn" => Ok(Op::Lrn(a.lrn()?)),
        "conv_grad_data" => Ok(Op::ConvGradData { conv: a.conv()?, shape: a.usizes("shape")? }),
        "conv_grad_weight" => Ok(Op::ConvGradWeight { conv: a.conv()?, shape: a.usizes("shape")? }),
        "max_pool_grad" => Ok(Op::MaxPoolGrad(a.pool()?)),
        "gather_grad" => Ok(Op::GatherGrad { axis: a.usize("axis")?, shape: a.usizes("shape")? }),
        "avg_pool_grad" => {
            Ok(Op::AvgPoolGrad { pool: a.pool()?, count_include_pad: a.bool("count_include_pad")?, shape: a.usizes("shape")? })
        }
        "lrn_grad" => Ok(Op::LrnGrad(a.lrn()?)),
        "sgd_update" => Ok(Op::Update(Optimizer::Sgd {
            lr: a.float("lr")?,
            momentum: a.float("momentum")?,
            dampening: a.float("dampening")?,
            nesterov: a.bool("nesterov")?,
            weight_decay: a.float("weight_decay")?,
            accumulate: a.usize("accumulate")?.max(1),
            schedule: Schedule { warmup: a.usize("warmup")?, total: a.usize("total")? },
        })),
        "adam_update" => Ok(Op::Update(Optimizer::Adam {
            lr: a.float("lr")?,
            beta1: a.float("beta1")?,
            beta2: a.float("beta2")?,
            eps: a.float("eps")?,
            weight_decay: a.float("weight_decay")?,
            decoupled: a.bool("decoupled")?,
            accumulate: a.usize("accumulate")?.max(1),
            schedule: Schedule { warmup: a.usize("warmup")?, total: a.usize("total")? },
        })),
        "count_update" => Ok(Op::Update(Optimizer::Count)),
        "ema_update" => Ok(Op::Update(Optimizer::Ema { momentum: a.float("momentum")? })),
        "dropout" => Ok(Op::Dropout),
        "identity" => Ok(Op::Identity),
        "cast" => match a.take("to")? {
            Attr::DType(to) => Ok(Op::Cast { to }),
            x => Err(format!("attribute to={x} must be a dtype")),
        },
        "fused_conv" | "fused_gemm" | "elementwise" | "fused_reduction" | "concat_in_place" => {
            Err(format!("{name} is a kernel-level op (made by fusion), not an op of a model"))
        }
        _ => Err(format!("unknown op {name}")),
    }?;
    if let Some(k) = a.0.keys().next() {
        return Err(format!("unknown attribute {k} for {name}"));
    }
    Ok(op)
}

/// The attributes of a kernel-level op, in printing order.
pub fn kernel_attrs_of(op: &KernelOp) -> Vec<(&'static str, Attr)> {
    use Attr::*;
    match op {
        KernelOp::Op(op) => attrs_of(op),
        KernelOp::FusedConv { conv: c, bias, residual, act } => {
            let mut a = attrs_of(&Op::Conv(c.clone()));
            a.extend([("bias", Bool(*bias)), ("residual", Bool(*residual)), ("act", Str(act.to_string()))]);
            a
        }
        KernelOp::FusedGemm { trans_a, trans_b, alpha, beta, act } => {
            let mut a = attrs_of(&Op::Gemm { trans_a: *trans_a, trans_b: *trans_b, alpha: *alpha, beta: *beta });
            a.push(("act", Str(act.to_string())));
            a
        }
        KernelOp::Elementwise { expr } => vec![("expr", Str(expr.to_string()))],
        KernelOp::ConcatInPlace { axis } => vec![("axis", Int(*axis as i64))],
        KernelOp::SliceView { axis, start, end } => {
            vec![("axis", Int(*axis as i64)), ("start", Int(*start as i64)), ("end", Int(*end as i64))]
        }
        KernelOp::Attention { expr, score, nan_to_zero, perms } => vec![
            ("expr", Str(expr.to_string())),
            ("score", Int(*score as i64)),
            ("nan_to_zero", Bool(*nan_to_zero)),
            ("perm_q", ints(&perms[0])),
            ("perm_kt", ints(&perms[1])),
            ("perm_v", ints(&perms[2])),
            ("perm_out", ints(&perms[3])),
        ],
        KernelOp::GemmEpilogue { product, expr, shape } => {
            let product = product.op();
            let mut a = vec![("expr", Str(expr.to_string())), ("shape", ints(shape)), ("product", Str(product.name().to_string()))];
            a.extend(attrs_of(&product));
            a
        }
        KernelOp::FusedReduction { expr, reduction } => {
            let reduction = reduction.op();
            let mut a = vec![("expr", Str(expr.to_string())), ("reduction", Str(reduction.name().to_string()))];
            a.extend(attrs_of(&reduction));
            a
        }
    }
}

/// Builds the kernel-level op named `name` from its attributes: a form
/// fusion makes, or a semantic op.
pub fn kernel_op_from(name: &str, mut a: Attrs) -> Result<KernelOp, String> {
    let op = match name {
        "fused_conv" => {
            KernelOp::FusedConv { conv: a.conv()?, bias: a.bool("bias")?, residual: a.bool("residual")?, act: a.parsed("act")? }
        }
        "fused_gemm" => KernelOp::FusedGemm {
            trans_a: a.bool("trans_a")?,
            trans_b: a.bool("trans_b")?,
            alpha: a.float("alpha")?,
            beta: a.float("beta")?,
            act: a.parsed("act")?,
        },
        "elementwise" => KernelOp::Elementwise { expr: a.parsed("expr")? },
        "concat_in_place" => KernelOp::ConcatInPlace { axis: a.usize("axis")? },
        "slice_view" => KernelOp::SliceView { axis: a.usize("axis")?, start: a.usize("start")?, end: a.usize("end")? },
        "attention" => KernelOp::Attention {
            expr: a.parsed("expr")?,
            score: a.usize("score")?,
            nan_to_zero: a.bool("nan_to_zero")?,
            perms: [a.usizes("perm_q")?, a.usizes("perm_kt")?, a.usizes("perm_v")?, a.usizes("perm_out")?],
        },
        "fused_reduction" => {
            let expr = a.parsed("expr")?;
            let inner = match a.take("reduction")? {
                Attr::Str(n) => n,
                x => return Err(format!("attribute reduction={x} must be a string")),
            };
            // The reduction's own attributes are the rest.
            let reduction = op_from(&inner, Attrs(std::mem::take(&mut a.0)))?;
            let reduction = crate::Reducer::of(&reduction).ok_or_else(|| format!("{inner} cannot take an elementwise prologue"))?;
            KernelOp::FusedReduction { expr, reduction }
        }
        "gemm_epilogue" => {
            let (expr, shape) = (a.parsed("expr")?, a.usizes("shape")?);
            let inner = match a.take("product")? {
                Attr::Str(n) => n,
                x => return Err(format!("attribute product={x} must be a string")),
            };
            let product = op_from(&inner, Attrs(std::mem::take(&mut a.0)))?;
            let product =
                crate::Product::of(&product).ok_or_else(|| format!("gemm_epilogue's product must be matmul or gemm, not {inner}"))?;
            KernelOp::GemmEpilogue { product, expr, shape }
        }
        _ => return op_from(name, a).map(KernelOp::Op),
    };
    if let Some(k) = a.0.keys().next() {
        return Err(format!("unknown attribute {k} for {name}"));
    }
    Ok(op)
}
