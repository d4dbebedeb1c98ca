//! The payloads of fused ops: activations applied in a kernel's epilogue
//! and the expression of a fused elementwise kernel. Both print to and parse
//! from the compact strings the text format uses (`relu`, `clip(0.0,6.0)`,
//! `relu(add($0,mul($1,$2)))`).

use crate::dtype::DType;
use crate::op::{BinaryOp, Named, Op, UnaryOp};
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
    /// GELU, exact (erf) form.
    Gelu,
    /// GELU, tanh approximation (GPT-2's).
    GeluTanh,
}

impl Act {
    /// Applies the activation to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Act::None => x,
            Act::Relu => crate::op::max_nan(x, 0.0),
            Act::Clip(lo, hi) => crate::op::min_nan(crate::op::max_nan(x, lo), hi),
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Silu => x / (1.0 + (-x).exp()),
            Act::Gelu => crate::op::apply_unary(UnaryOp::Gelu, x),
            Act::GeluTanh => crate::op::apply_unary(UnaryOp::GeluTanh, x),
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
            Act::Gelu => f.write_str("gelu"),
            Act::GeluTanh => f.write_str("gelu_tanh"),
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
            "gelu" => Act::Gelu,
            "gelu_tanh" => Act::GeluTanh,
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
            | crate::KernelOp::ConcatInPlace { .. }
            | crate::KernelOp::SliceView { .. }
            | crate::KernelOp::Attention { .. }
            | crate::KernelOp::GemmEpilogue { .. } => None,
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
                ExprNode::Clip(lo, hi, a) => crate::op::min_nan(crate::op::max_nan(scratch[a], lo), hi),
                ExprNode::Cast(d, a) => round_to(d, scratch[a]),
            };
            scratch.push(v);
        }
        *scratch.last().expect("non-empty expression")
    }

    /// The operands of node `i`.
    fn operands(&self, i: usize) -> Vec<usize> {
        match self.nodes[i] {
            ExprNode::Input(_) | ExprNode::Const(_) => vec![],
            ExprNode::Unary(_, a) | ExprNode::Clip(_, _, a) | ExprNode::Cast(_, a) => vec![a],
            ExprNode::Binary(_, x, y) => vec![x, y],
        }
    }

    /// Which nodes print as a binding `@k=...;` (and their `k`) rather than inline: those
    /// read more than once (so a DAG prints in linear size, never as its
    /// exponential tree) and those whose inline tree would nest deeper
    /// than [`MAX_INLINE_DEPTH`] (so a long chain never needs a deep
    /// recursion to print or parse).
    fn bindings(&self) -> Vec<Option<usize>> {
        let n = self.nodes.len();
        let mut uses = vec![0usize; n];
        for i in 0..n {
            for a in self.operands(i) {
                uses[a] += 1;
            }
        }
        let leaf = |i: usize| matches!(self.nodes[i], ExprNode::Input(_) | ExprNode::Const(_));
        let (mut bound, mut depth) = (vec![false; n], vec![0usize; n]);
        for i in 0..n {
            if leaf(i) {
                continue;
            }
            depth[i] = 1 + self.operands(i).iter().map(|&a| if bound[a] { 0 } else { depth[a] }).max().unwrap_or(0);
            bound[i] = i + 1 < n && (uses[i] > 1 || depth[i] >= MAX_INLINE_DEPTH);
        }
        let mut next = 0;
        bound
            .into_iter()
            .map(|b| {
                next += b as usize;
                b.then(|| next - 1)
            })
            .collect()
    }

    /// Writes node `i` inline: bound operands by name. Recursion is
    /// bounded by [`MAX_INLINE_DEPTH`] (see [`Expr::bindings`]).
    fn write(&self, i: usize, bound: &[Option<usize>], f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arg = |a: usize, f: &mut fmt::Formatter<'_>| match bound[a] {
            Some(k) => write!(f, "@{k}"),
            None => self.write(a, bound, f),
        };
        match self.nodes[i] {
            ExprNode::Input(k) => write!(f, "${k}"),
            ExprNode::Const(c) => write!(f, "{c:?}"),
            ExprNode::Unary(u, a) => {
                write!(f, "{}(", u.name())?;
                for (_, p) in u.params() {
                    write!(f, "{p:?},")?;
                }
                arg(a, f)?;
                f.write_str(")")
            }
            ExprNode::Binary(b, x, y) => {
                write!(f, "{}(", crate::op::Op::Binary(b).name())?;
                arg(x, f)?;
                f.write_str(",")?;
                arg(y, f)?;
                f.write_str(")")
            }
            ExprNode::Clip(lo, hi, a) => {
                write!(f, "clip({lo:?},{hi:?},")?;
                arg(a, f)?;
                f.write_str(")")
            }
            ExprNode::Cast(d, a) => {
                write!(f, "cast_{d}(")?;
                arg(a, f)?;
                f.write_str(")")
            }
        }
    }
}

/// The deepest nesting an expression prints inline (and the parser accepts
/// in one statement); deeper subexpressions are bound to names.
pub const MAX_INLINE_DEPTH: usize = 32;

/// A tree prints as `relu(add($0,$1))`; a node read twice, or one deeper
/// than [`MAX_INLINE_DEPTH`], is bound first, named in order:
/// `@0=add($0,$1);mul(@0,@0)`.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes.is_empty() {
            return f.write_str("<empty>");
        }
        let bound = self.bindings();
        for (i, k) in bound.iter().enumerate().filter_map(|(i, b)| b.map(|k| (i, k))) {
            write!(f, "@{k}=")?;
            self.write(i, &bound, f)?;
            f.write_str(";")?;
        }
        self.write(self.nodes.len() - 1, &bound, f)
    }
}

impl std::str::FromStr for Expr {
    type Err = String;
    fn from_str(s: &str) -> Result<Expr, String> {
        let mut e = Expr::default();
        let mut names: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let stmts: Vec<&str> = s.split(';').collect();
        for (k, stmt) in stmts.iter().enumerate() {
            let cs: Vec<char> = stmt.chars().filter(|c| !c.is_whitespace()).collect();
            let last = k + 1 == stmts.len();
            let (name, body) = match cs.iter().position(|&c| c == '=') {
                Some(eq) if !last && cs.first() == Some(&'@') => (cs[..eq].iter().collect::<String>(), &cs[eq + 1..]),
                _ if !last => return Err(format!("expected @N=... before ';' in expression {s:?}")),
                _ => (String::new(), &cs[..]),
            };
            let mut pos = 0;
            let mut p = Parser { cs: body, pos: &mut pos, e: &mut e, names: &names };
            let node = p.node(0)?;
            if pos != body.len() {
                return Err(format!("trailing text in expression {s:?}"));
            }
            if !last && names.insert(name.clone(), node).is_some() {
                return Err(format!("{name} is bound twice in expression {s:?}"));
            }
        }
        Ok(e)
    }
}

struct Parser<'a> {
    cs: &'a [char],
    pos: &'a mut usize,
    e: &'a mut Expr,
    names: &'a std::collections::HashMap<String, usize>,
}

impl Parser<'_> {
    fn word(&mut self) -> String {
        let start = *self.pos;
        while *self.pos < self.cs.len() && !matches!(self.cs[*self.pos], '(' | ')' | ',') {
            *self.pos += 1;
        }
        self.cs[start..*self.pos].iter().collect()
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.cs.get(*self.pos) == Some(&c) {
            *self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{c}' in expression"))
        }
    }

    /// One call or leaf; `depth` bounds the recursion (deeper nesting must
    /// be bound to a name, as printing does).
    fn node(&mut self, depth: usize) -> Result<usize, String> {
        if depth > MAX_INLINE_DEPTH {
            return Err(format!("expression nested deeper than {MAX_INLINE_DEPTH} calls: bind subexpressions with @N=...;"));
        }
        let word = self.word();
        if let Some(k) = word.strip_prefix('$') {
            return Ok(self.e.push(ExprNode::Input(k.parse().map_err(|_| format!("bad input {word}"))?)));
        }
        if word.starts_with('@') {
            return self.names.get(&word).copied().ok_or_else(|| format!("{word} is used before it is bound"));
        }
        if self.cs.get(*self.pos) != Some(&'(') {
            return Ok(self.e.push(ExprNode::Const(word.parse().map_err(|_| format!("bad constant {word:?}"))?)));
        }
        *self.pos += 1;
        // Numeric parameters (clip bounds, alphas) come first.
        let n_params = match word.as_str() {
            "clip" | "selu" => 2,
            "leaky_relu" | "elu" => 1,
            _ => 0,
        };
        let mut p = Vec::new();
        for _ in 0..n_params {
            let w = self.word();
            p.push(w.parse::<f32>().map_err(|_| format!("bad parameter {w:?} of {word}"))?);
            self.expect(',')?;
        }
        let mut args = vec![self.node(depth + 1)?];
        while self.cs.get(*self.pos) == Some(&',') {
            *self.pos += 1;
            args.push(self.node(depth + 1)?);
        }
        self.expect(')')?;
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
        Ok(self.e.push(node))
    }
}

/// `x` rounded to float dtype `d` (the identity for f32).
pub fn round_to(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}
