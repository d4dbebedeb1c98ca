//! The payloads of fused ops: activations applied in a kernel's epilogue
//! and the expression of a fused elementwise kernel. Both print to and parse
//! from the compact strings the text format uses (`relu`, `clip(0.0,6.0)`,
//! `relu(add($0,mul($1,$2)))`).

use crate::dtype::DType;
use crate::op::{BinaryOp, Op, UnaryOp};
use std::fmt;

/// An activation applied in a kernel's epilogue, in registers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// No activation.
    None,
    /// max(x, 0).
    Relu,
    /// Clamp to `[min, max]` (ReLU6 is `clip(0,6)`).
    Clip(f32, f32),
    /// 1 / (1 + e^-x).
    Sigmoid,
    /// x * sigmoid(x) (SiLU, swish).
    Silu,
}

impl Act {
    /// Applies the activation to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Act::None => x,
            Act::Relu => x.max(0.0),
            Act::Clip(lo, hi) => x.max(lo).min(hi),
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Silu => x / (1.0 + (-x).exp()),
        }
    }
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Act::None => f.write_str("none"),
            Act::Relu => f.write_str("relu"),
            Act::Clip(lo, hi) => write!(f, "clip({lo:?},{hi:?})"),
            Act::Sigmoid => f.write_str("sigmoid"),
            Act::Silu => f.write_str("silu"),
        }
    }
}

impl std::str::FromStr for Act {
    type Err = String;
    fn from_str(s: &str) -> Result<Act, String> {
        Ok(match s {
            "none" => Act::None,
            "relu" => Act::Relu,
            "sigmoid" => Act::Sigmoid,
            "silu" => Act::Silu,
            _ => {
                let inner = s.strip_prefix("clip(").and_then(|r| r.strip_suffix(')')).ok_or_else(|| format!("unknown activation {s:?}"))?;
                let (lo, hi) = inner.split_once(',').ok_or_else(|| format!("bad clip {s:?}"))?;
                let num = |x: &str| x.trim().parse::<f32>().map_err(|_| format!("bad clip bound {x:?}"));
                Act::Clip(num(lo)?, num(hi)?)
            }
        })
    }
}

/// One node of an elementwise expression; operands index earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprNode {
    /// Input `i` of the kernel, broadcast to the output shape.
    Input(usize),
    /// A scalar constant.
    Const(f32),
    /// A function of one operand.
    Unary(UnaryOp, usize),
    /// A function of two operands.
    Binary(BinaryOp, usize, usize),
    /// Clamp to `[min, max]`.
    Clip(f32, f32, usize),
    /// Round to a float dtype (a precision boundary inside a kernel; the
    /// value stays in f32 registers, rounded as a store and load would).
    Cast(DType, usize),
}

/// An elementwise expression: nodes in dependency order, the last is the result.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Expr {
    /// The nodes.
    pub nodes: Vec<ExprNode>,
}

impl Expr {
    /// Appends a node, returning its index.
    pub fn push(&mut self, n: ExprNode) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    /// The largest input index used, plus one.
    pub fn arity(&self) -> usize {
        self.nodes.iter().filter_map(|n| if let ExprNode::Input(i) = n { Some(i + 1) } else { None }).max().unwrap_or(0)
    }

    /// Whether operands only point backwards and the expression is non-empty.
    pub fn is_well_formed(&self) -> bool {
        !self.nodes.is_empty()
            && self.nodes.iter().enumerate().all(|(i, n)| match *n {
                ExprNode::Unary(_, a) | ExprNode::Clip(_, _, a) | ExprNode::Cast(_, a) => a < i,
                ExprNode::Binary(_, a, b) => a < i && b < i,
                _ => true,
            })
    }

    /// The expression of a kernel: a fused expression, or an elementwise
    /// semantic op's ([`Expr::of_op`]).
    pub fn of_kernel(op: &crate::KernelOp, arity: usize) -> Option<Expr> {
        match op {
            crate::KernelOp::Elementwise { expr } => Some(expr.clone()),
            crate::KernelOp::Op(op) => Expr::of_op(op, arity),
            crate::KernelOp::FusedConv { .. }
            | crate::KernelOp::FusedGemm { .. }
            | crate::KernelOp::FusedReduction { .. }
            | crate::KernelOp::ConcatInPlace { .. } => None,
        }
    }

    /// The expression of an elementwise op over its `arity` inputs: unary,
    /// binary, clip, sum, or a float-to-float cast.
    pub fn of_op(op: &Op, arity: usize) -> Option<Expr> {
        let mut e = Expr::default();
        let ins: Vec<usize> = (0..arity).map(|i| e.push(ExprNode::Input(i))).collect();
        match op {
            Op::Unary(u) => e.push(ExprNode::Unary(*u, ins[0])),
            Op::Clip { min, max } => e.push(ExprNode::Clip(*min, *max, ins[0])),
            Op::Binary(b) => e.push(ExprNode::Binary(*b, ins[0], ins[1])),
            Op::Cast { to } if to.is_float() => e.push(ExprNode::Cast(*to, ins[0])),
            Op::Sum if arity >= 1 => {
                let mut acc = ins[0];
                for &a in &ins[1..] {
                    acc = e.push(ExprNode::Binary(BinaryOp::Add, acc, a));
                }
                acc
            }
            _ => return None,
        };
        Some(e)
    }

    /// Appends `other` with its inputs bound to nodes `args` of `self`;
    /// returns the index of its result.
    pub fn inline(&mut self, other: &Expr, args: &[usize]) -> usize {
        let mut remap: Vec<usize> = Vec::with_capacity(other.nodes.len());
        for n in &other.nodes {
            let k = match *n {
                ExprNode::Input(i) => args[i],
                ExprNode::Const(c) => self.push(ExprNode::Const(c)),
                ExprNode::Unary(u, a) => self.push(ExprNode::Unary(u, remap[a])),
                ExprNode::Binary(b, x, y) => self.push(ExprNode::Binary(b, remap[x], remap[y])),
                ExprNode::Clip(lo, hi, a) => self.push(ExprNode::Clip(lo, hi, remap[a])),
                ExprNode::Cast(d, a) => self.push(ExprNode::Cast(d, remap[a])),
            };
            remap.push(k);
        }
        *remap.last().expect("non-empty expression")
    }

    /// The dtype of the result given the inputs' dtypes: operands of a
    /// binary function must agree (constants adapt), a cast sets its dtype.
    pub fn dtype(&self, inputs: &[DType]) -> Result<DType, String> {
        let mut t: Vec<Option<DType>> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let d = match *n {
                ExprNode::Input(i) => Some(*inputs.get(i).ok_or_else(|| format!("expression {self} reads input {i} of {}", inputs.len()))?),
                ExprNode::Const(_) => None,
                ExprNode::Unary(_, a) | ExprNode::Clip(_, _, a) => t[a],
                ExprNode::Binary(b, x, y) => match (t[x], t[y]) {
                    (Some(p), Some(q)) if p != q => {
                        return Err(format!("{} of {p} and {q} in expression {self}: cast one side", Op::Binary(b).name()))
                    }
                    (p, q) => p.or(q),
                },
                ExprNode::Cast(d, _) => Some(d),
            };
            t.push(d);
        }
        Ok(t.last().copied().flatten().or(inputs.first().copied()).unwrap_or(DType::F32))
    }

    /// Evaluates the expression for one element given input values.
    pub fn eval(&self, inputs: &[f32], scratch: &mut Vec<f32>) -> f32 {
        scratch.clear();
        for n in &self.nodes {
            let v = match *n {
                ExprNode::Input(i) => inputs[i],
                ExprNode::Const(c) => c,
                ExprNode::Unary(u, a) => crate::op::apply_unary(u, scratch[a]),
                ExprNode::Binary(b, x, y) => crate::op::apply_binary(b, scratch[x], scratch[y]),
                ExprNode::Clip(lo, hi, a) => scratch[a].max(lo).min(hi),
                ExprNode::Cast(d, a) => round_to(d, scratch[a]),
            };
            scratch.push(v);
        }
        *scratch.last().expect("non-empty expression")
    }

    fn write(&self, i: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.nodes[i] {
            ExprNode::Input(k) => write!(f, "${k}"),
            ExprNode::Const(c) => write!(f, "{c:?}"),
            ExprNode::Unary(u, a) => {
                write!(f, "{}(", u.name())?;
                for (_, p) in u.params() {
                    write!(f, "{p:?},")?;
                }
                self.write(a, f)?;
                f.write_str(")")
            }
            ExprNode::Binary(b, x, y) => {
                write!(f, "{}(", crate::op::Op::Binary(b).name())?;
                self.write(x, f)?;
                f.write_str(",")?;
                self.write(y, f)?;
                f.write_str(")")
            }
            ExprNode::Clip(lo, hi, a) => {
                write!(f, "clip({lo:?},{hi:?},")?;
                self.write(a, f)?;
                f.write_str(")")
            }
            ExprNode::Cast(d, a) => {
                write!(f, "cast_{d}(")?;
                self.write(a, f)?;
                f.write_str(")")
            }
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes.is_empty() {
            return f.write_str("<empty>");
        }
        self.write(self.nodes.len() - 1, f)
    }
}

impl std::str::FromStr for Expr {
    type Err = String;
    fn from_str(s: &str) -> Result<Expr, String> {
        let mut e = Expr::default();
        let cs: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
        let mut pos = 0;
        parse_node(&cs, &mut pos, &mut e)?;
        if pos != cs.len() {
            return Err(format!("trailing text in expression {s:?}"));
        }
        Ok(e)
    }
}

fn read_word(cs: &[char], pos: &mut usize) -> String {
    let start = *pos;
    while *pos < cs.len() && !matches!(cs[*pos], '(' | ')' | ',') {
        *pos += 1;
    }
    cs[start..*pos].iter().collect()
}

fn expect(cs: &[char], pos: &mut usize, c: char) -> Result<(), String> {
    if cs.get(*pos) == Some(&c) {
        *pos += 1;
        Ok(())
    } else {
        Err(format!("expected '{c}' in expression"))
    }
}

fn parse_node(cs: &[char], pos: &mut usize, e: &mut Expr) -> Result<usize, String> {
    let word = read_word(cs, pos);
    if let Some(k) = word.strip_prefix('$') {
        return Ok(e.push(ExprNode::Input(k.parse().map_err(|_| format!("bad input {word}"))?)));
    }
    if cs.get(*pos) != Some(&'(') {
        return Ok(e.push(ExprNode::Const(word.parse().map_err(|_| format!("bad constant {word:?}"))?)));
    }
    *pos += 1;
    // Numeric parameters (clip bounds, alphas) come first.
    let n_params = match word.as_str() {
        "clip" | "selu" => 2,
        "leaky_relu" | "elu" => 1,
        _ => 0,
    };
    let mut p = Vec::new();
    for _ in 0..n_params {
        let w = read_word(cs, pos);
        p.push(w.parse::<f32>().map_err(|_| format!("bad parameter {w:?} of {word}"))?);
        expect(cs, pos, ',')?;
    }
    let mut args = vec![parse_node(cs, pos, e)?];
    while cs.get(*pos) == Some(&',') {
        *pos += 1;
        args.push(parse_node(cs, pos, e)?);
    }
    expect(cs, pos, ')')?;
    let node = match (word.as_str(), args.as_slice()) {
        ("clip", &[a]) => ExprNode::Clip(p[0], p[1], a),
        (name, &[a]) if UnaryOp::by_name(name).is_some_and(|u| u.params().len() == p.len()) => {
            ExprNode::Unary(UnaryOp::by_name(name).expect("just found").with_params(&p), a)
        }
        (name, &[a]) if name.starts_with("cast_") => match DType::from_name(&name[5..]).filter(|d| d.is_float()) {
            Some(d) => ExprNode::Cast(d, a),
            None => return Err(format!("{name}: only casts to f32, f16 and bf16 are elementwise")),
        },
        (name, args) => match (crate::text::op_by_name(name), args) {
            (Some(crate::op::Op::Unary(u)), &[a]) => ExprNode::Unary(u, a),
            (Some(crate::op::Op::Binary(b)), &[x, y]) => ExprNode::Binary(b, x, y),
            _ => return Err(format!("{name} with {} operands is not an elementwise function", args.len())),
        },
    };
    Ok(e.push(node))
}

/// `x` rounded to float dtype `d` (the identity for f32).
pub fn round_to(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}
