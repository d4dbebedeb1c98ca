//! Vector-Jacobian rules: for each semantic op, the gradient of its
//! operands from the gradient of its output, as ops of the same graph.
//! Each rule reads the forward values it needs (ReLU its output, a
//! convolution's weight gradient its input): what backward keeps alive is
//! what these rules read.

use super::TrainError;
use smelt_ir::{BinaryOp, CompareOp, DType, Graph, LogicOp, NodeId, Op, PadMode, ReduceOp, Tensor, UnaryOp, ValueId};

/// Builds backward ops into a graph.
pub(super) struct Ad<'a> {
    pub g: &'a mut Graph,
    /// The forward node whose rule is being applied (names the new nodes).
    pub name: String,
    count: usize,
}

type R = Result<ValueId, TrainError>;

impl<'a> Ad<'a> {
    pub fn new(g: &'a mut Graph) -> Self {
        Ad { g, name: String::new(), count: 0 }
    }

    pub fn op(&mut self, op: Op, ins: &[ValueId]) -> R {
        self.count += 1;
        let name = format!("{}.grad{}", self.name, self.count);
        let id = self.g.add(op, name, ins).map_err(TrainError::Bug)?;
        Ok(ValueId { node: id, slot: 0 })
    }

    pub fn scalar(&mut self, x: f32) -> ValueId {
        self.g.add_constant(format!("{}.c", self.name), Tensor::from_f32(vec![], vec![x]))
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.g.ty(v).shape.clone()
    }

    pub fn bin(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> R {
        self.op(Op::Binary(b), &[x, y])
    }

    pub fn mul(&mut self, x: ValueId, y: ValueId) -> R {
        self.bin(BinaryOp::Mul, x, y)
    }

    pub fn mul_c(&mut self, x: ValueId, c: f32) -> R {
        let c = self.scalar(c);
        self.mul(x, c)
    }

    pub fn un(&mut self, u: UnaryOp, x: ValueId) -> R {
        self.op(Op::Unary(u), &[x])
    }

    /// `dy` where `cond`, else 0.
    pub fn mask(&mut self, cond: ValueId, dy: ValueId) -> R {
        let zero = self.scalar(0.0);
        self.op(Op::Where, &[cond, dy, zero])
    }

    pub fn cmp_c(&mut self, c: CompareOp, x: ValueId, k: f32) -> R {
        let k = self.scalar(k);
        self.op(Op::Compare(c), &[x, k])
    }

    pub fn reshape(&mut self, x: ValueId, shape: Vec<usize>) -> R {
        if self.shape(x) == shape {
            return Ok(x);
        }
        self.op(Op::Reshape { shape }, &[x])
    }

    pub fn sum(&mut self, x: ValueId, axes: Vec<usize>, keepdims: bool) -> R {
        if axes.is_empty() {
            return Ok(x);
        }
        self.op(Op::Reduce { op: ReduceOp::Sum, axes, keepdims }, &[x])
    }

    /// `dy` summed over the axes along which an operand of `shape` was
    /// broadcast to dy's shape.
    pub fn reduce_to(&mut self, dy: ValueId, shape: &[usize]) -> R {
        let s = self.shape(dy);
        let lead = s.len() - shape.len();
        let axes: Vec<usize> = (0..s.len()).filter(|&i| i < lead || (shape[i - lead] == 1 && s[i] != 1)).collect();
        let r = self.sum(dy, axes, true)?;
        self.reshape(r, shape.to_vec())
    }

    pub fn expand(&mut self, x: ValueId, shape: Vec<usize>) -> R {
        if self.shape(x) == shape {
            return Ok(x);
        }
        self.op(Op::Expand { shape }, &[x])
    }

    /// A per-channel vector `[C]` shaped to broadcast over `[N, C, *]` of rank `rank`.
    pub fn per_channel(&mut self, v: ValueId, rank: usize) -> R {
        let mut s = vec![1; rank - 1];
        s[0] = self.shape(v)[0];
        self.reshape(v, s)
    }

    /// Swaps the last two dims.
    pub fn t(&mut self, x: ValueId) -> R {
        let r = self.shape(x).len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.op(Op::Transpose { perm }, &[x])
    }
}

/// The gradient contributions of node `n`'s operands (`None` where an
/// operand needs none), given `dys`, the gradient of each output (`None`:
/// zero). `needs[i]`: whether operand i needs a gradient.
pub(super) fn vjp(ad: &mut Ad, n: NodeId, dys: &[Option<ValueId>], needs: &[bool]) -> Result<Vec<Option<ValueId>>, TrainError> {
    let (op, node_name, out_tys) = {
        let node = ad.g.node(n);
        (node.op.clone(), node.name.clone(), node.outputs.clone())
    };
    let ins = ad.g.inputs_of(n);
    let y = ValueId { node: n, slot: 0 };
    let xs: Vec<Vec<usize>> = ins.iter().map(|&v| ad.g.ty(v).shape.clone()).collect();
    let in_dtype0 = ad.g.ty(ins.first().copied().unwrap_or(y)).dtype;
    let unsupported = |why: &str| TrainError::NoGradient { node: format!("\"{node_name}\" ({})", op.name()), why: why.to_string() };
    let mut out: Vec<Option<ValueId>> = vec![None; ins.len()];
    // Every op but split has one output.
    if !matches!(op, Op::Split { .. }) && dys[0].is_none() {
        return Ok(out);
    }
    let dy = dys[0].unwrap_or(y);
    macro_rules! set {
        ($i:expr, $v:expr) => {
            if needs[$i] {
                out[$i] = Some($v);
            }
        };
    }
    use BinaryOp as B;
    use UnaryOp as U;
    match &op {
        Op::Input | Op::Constant | Op::Parameter | Op::State => {}
        Op::Conv(c) => {
            if needs[0] {
                out[0] = Some(ad.op(Op::ConvGradData { conv: c.clone(), shape: xs[0].clone() }, &[dy, ins[1]])?);
            }
            if needs[1] {
                out[1] = Some(ad.op(Op::ConvGradWeight { conv: c.clone(), shape: xs[1].clone() }, &[ins[0], dy])?);
            }
            if ins.len() > 2 && needs[2] {
                let axes: Vec<usize> = (0..xs[0].len()).filter(|&a| a != 1).collect();
                out[2] = Some(ad.sum(dy, axes, false)?);
            }
        }
        Op::BatchNorm { epsilon } => {
            if needs[3] || needs[4] {
                return Err(unsupported("the running statistics of a frozen batch norm are not trained"));
            }
            let rank = xs[0].len();
            let eps = ad.scalar(*epsilon);
            let var = ad.bin(B::Add, ins[4], eps)?;
            let std = ad.un(U::Sqrt, var)?;
            let inv = ad.un(U::Reciprocal, std)?;
            if needs[0] {
                let k = ad.mul(ins[1], inv)?;
                let k = ad.per_channel(k, rank)?;
                out[0] = Some(ad.mul(dy, k)?);
            }
            let axes: Vec<usize> = (0..rank).filter(|&a| a != 1).collect();
            if needs[1] {
                let mean = ad.per_channel(ins[3], rank)?;
                let inv = ad.per_channel(inv, rank)?;
                let xc = ad.bin(B::Sub, ins[0], mean)?;
                let xhat = ad.mul(xc, inv)?;
                let p = ad.mul(dy, xhat)?;
                out[1] = Some(ad.sum(p, axes.clone(), false)?);
            }
            if needs[2] {
                out[2] = Some(ad.sum(dy, axes, false)?);
            }
        }
        Op::Unary(u) => {
            let x = ins[0];
            let d = match u {
                U::Relu => {
                    let c = ad.cmp_c(CompareOp::Greater, y, 0.0)?;
                    ad.mask(c, dy)?
                }
                U::Sigmoid => {
                    let one = ad.scalar(1.0);
                    let om = ad.bin(B::Sub, one, y)?;
                    let s = ad.mul(y, om)?;
                    ad.mul(dy, s)?
                }
                U::Tanh => {
                    let one = ad.scalar(1.0);
                    let y2 = ad.mul(y, y)?;
                    let s = ad.bin(B::Sub, one, y2)?;
                    ad.mul(dy, s)?
                }
                U::Erf => {
                    let x2 = ad.mul(x, x)?;
                    let nx2 = ad.un(U::Neg, x2)?;
                    let e = ad.un(U::Exp, nx2)?;
                    let s = ad.mul_c(e, std::f32::consts::FRAC_2_SQRT_PI)?;
                    ad.mul(dy, s)?
                }
                U::Sqrt => {
                    let q = ad.bin(B::Div, dy, y)?;
                    ad.mul_c(q, 0.5)?
                }
                U::Exp => ad.mul(dy, y)?,
                U::Log => ad.bin(B::Div, dy, x)?,
                // Piecewise constant: no gradient.
                U::Floor | U::Ceil | U::Round => ad.mul_c(dy, 0.0)?,
                U::Sin => {
                    let c = ad.un(U::Cos, x)?;
                    ad.mul(dy, c)?
                }
                U::Cos => {
                    let s = ad.un(U::Sin, x)?;
                    let d = ad.mul(dy, s)?;
                    ad.un(U::Neg, d)?
                }
                U::Neg => ad.un(U::Neg, dy)?,
                U::Abs => {
                    let s = ad.un(U::Sign, x)?;
                    ad.mul(dy, s)?
                }
                U::Reciprocal => {
                    let y2 = ad.mul(y, y)?;
                    let p = ad.mul(dy, y2)?;
                    ad.un(U::Neg, p)?
                }
                U::Sign => return Ok(out),
                U::Softplus => {
                    let s = ad.un(U::Sigmoid, x)?;
                    ad.mul(dy, s)?
                }
                U::LeakyRelu(a) => {
                    let c = ad.cmp_c(CompareOp::Greater, x, 0.0)?;
                    let neg = ad.mul_c(dy, *a)?;
                    ad.op(Op::Where, &[c, dy, neg])?
                }
                U::Elu(a) => {
                    let c = ad.cmp_c(CompareOp::Greater, x, 0.0)?;
                    let k = ad.scalar(*a);
                    let ya = ad.bin(B::Add, y, k)?;
                    let neg = ad.mul(dy, ya)?;
                    ad.op(Op::Where, &[c, dy, neg])?
                }
                U::Selu(a, gamma) => {
                    let c = ad.cmp_c(CompareOp::Greater, x, 0.0)?;
                    let pos = ad.mul_c(dy, *gamma)?;
                    let e = ad.un(U::Exp, x)?;
                    let e = ad.mul_c(e, a * gamma)?;
                    let neg = ad.mul(dy, e)?;
                    ad.op(Op::Where, &[c, pos, neg])?
                }
                U::Gelu => {
                    // Phi(x) + x phi(x)
                    let xs = ad.mul_c(x, std::f32::consts::FRAC_1_SQRT_2)?;
                    let e = ad.un(U::Erf, xs)?;
                    let one = ad.scalar(1.0);
                    let e1 = ad.bin(B::Add, e, one)?;
                    let cdf = ad.mul_c(e1, 0.5)?;
                    let x2 = ad.mul(x, x)?;
                    let h = ad.mul_c(x2, -0.5)?;
                    let ex = ad.un(U::Exp, h)?;
                    let pdf = ad.mul_c(ex, 0.398_942_3)?;
                    let xp = ad.mul(x, pdf)?;
                    let s = ad.bin(B::Add, cdf, xp)?;
                    ad.mul(dy, s)?
                }
                U::GeluTanh => {
                    // 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 c x^2), th = tanh(k (x + c x^3))
                    let (k, c) = ((2.0 / std::f32::consts::PI).sqrt(), 0.044715f32);
                    let x2 = ad.mul(x, x)?;
                    let cx2 = ad.mul_c(x2, c)?;
                    let one = ad.scalar(1.0);
                    let inner1 = ad.bin(B::Add, cx2, one)?;
                    let inner = ad.mul(x, inner1)?;
                    let u = ad.mul_c(inner, k)?;
                    let th = ad.un(U::Tanh, u)?;
                    let one_th = ad.bin(B::Add, th, one)?;
                    let a = ad.mul_c(one_th, 0.5)?;
                    let th2 = ad.mul(th, th)?;
                    let sech2 = ad.bin(B::Sub, one, th2)?;
                    let cx2_3 = ad.mul_c(x2, 3.0 * c)?;
                    let du1 = ad.bin(B::Add, cx2_3, one)?;
                    let du = ad.mul_c(du1, 0.5 * k)?;
                    let xs = ad.mul(x, sech2)?;
                    let b = ad.mul(xs, du)?;
                    let s = ad.bin(B::Add, a, b)?;
                    ad.mul(dy, s)?
                }
            };
            set!(0, d);
        }
        Op::Clip { min, max } => {
            let lo = ad.cmp_c(CompareOp::GreaterOrEqual, ins[0], *min)?;
            let hi = ad.cmp_c(CompareOp::LessOrEqual, ins[0], *max)?;
            let both = ad.op(Op::Logic(LogicOp::And), &[lo, hi])?;
            let d = ad.mask(both, dy)?;
            set!(0, d);
        }
        Op::Binary(b) => {
            let (a, bb) = (ins[0], ins[1]);
            let (da, db) = match b {
                B::Add => (Some(dy), Some(dy)),
                B::Sub => (Some(dy), if needs[1] { Some(ad.un(U::Neg, dy)?) } else { None }),
                B::Mul => (if needs[0] { Some(ad.mul(dy, bb)?) } else { None }, if needs[1] { Some(ad.mul(dy, a)?) } else { None }),
                B::Div => {
                    let da = if needs[0] { Some(ad.bin(B::Div, dy, bb)?) } else { None };
                    let db = if needs[1] {
                        let q = ad.bin(B::Div, y, bb)?;
                        let p = ad.mul(dy, q)?;
                        Some(ad.un(U::Neg, p)?)
                    } else {
                        None
                    };
                    (da, db)
                }
                B::Pow => {
                    let da = if needs[0] {
                        let one = ad.scalar(1.0);
                        let e = ad.bin(B::Sub, bb, one)?;
                        let p = ad.bin(B::Pow, a, e)?;
                        let k = ad.mul(p, bb)?;
                        Some(ad.mul(dy, k)?)
                    } else {
                        None
                    };
                    let db = if needs[1] {
                        let l = ad.un(U::Log, a)?;
                        let k = ad.mul(y, l)?;
                        Some(ad.mul(dy, k)?)
                    } else {
                        None
                    };
                    (da, db)
                }
                B::Max | B::Min => {
                    // The larger (smaller) operand takes the gradient; a tie splits it.
                    let wins = if *b == B::Max { CompareOp::Greater } else { CompareOp::Less };
                    let half = ad.mul_c(dy, 0.5)?;
                    let zero = ad.scalar(0.0);
                    let eq = ad.op(Op::Compare(CompareOp::Equal), &[a, bb])?;
                    let tie = ad.op(Op::Where, &[eq, half, zero])?;
                    let aw = ad.op(Op::Compare(wins), &[a, bb])?;
                    let bw = ad.op(Op::Compare(wins), &[bb, a])?;
                    let da = ad.op(Op::Where, &[aw, dy, tie])?;
                    let db = ad.op(Op::Where, &[bw, dy, tie])?;
                    (Some(da), Some(db))
                }
                B::PRelu => {
                    let c = ad.cmp_c(CompareOp::Greater, a, 0.0)?;
                    let neg = ad.mul(dy, bb)?;
                    let da = ad.op(Op::Where, &[c, dy, neg])?;
                    let ax = ad.mul(dy, a)?;
                    let zero = ad.scalar(0.0);
                    let db = ad.op(Op::Where, &[c, zero, ax])?;
                    (Some(da), Some(db))
                }
            };
            if let (true, Some(d)) = (needs[0], da) {
                out[0] = Some(ad.reduce_to(d, &xs[0])?);
            }
            if let (true, Some(d)) = (needs[1], db) {
                out[1] = Some(ad.reduce_to(d, &xs[1])?);
            }
        }
        Op::Sum => {
            for i in 0..ins.len() {
                if needs[i] {
                    out[i] = Some(ad.reduce_to(dy, &xs[i])?);
                }
            }
        }
        Op::Where => {
            for (i, keep) in [(1, true), (2, false)] {
                if needs[i] {
                    let zero = ad.scalar(0.0);
                    let d = if keep { ad.op(Op::Where, &[ins[0], dy, zero])? } else { ad.op(Op::Where, &[ins[0], zero, dy])? };
                    out[i] = Some(ad.reduce_to(d, &xs[i])?);
                }
            }
        }
        Op::Compare(_) | Op::Logic(_) | Op::Not | Op::IsNaN => {}
        Op::MaxPool(p) => set!(0, ad.op(Op::MaxPoolGrad(p.clone()), &[ins[0], dy])?),
        Op::AveragePool { pool, count_include_pad } => {
            set!(0, ad.op(Op::AvgPoolGrad { pool: pool.clone(), count_include_pad: *count_include_pad, shape: xs[0].clone() }, &[dy])?)
        }
        Op::GlobalAveragePool => {
            let e = ad.expand(dy, xs[0].clone())?;
            let count: usize = xs[0][2..].iter().product();
            set!(0, ad.mul_c(e, 1.0 / count.max(1) as f32)?);
        }
        Op::Reduce { op: r, axes, .. } => {
            let mut kept = xs[0].clone();
            axes.iter().for_each(|&a| kept[a] = 1);
            let d = ad.reshape(dy, kept.clone())?;
            let d = ad.expand(d, xs[0].clone())?;
            let count: usize = axes.iter().map(|&a| xs[0][a]).product();
            let d = match r {
                ReduceOp::Sum => d,
                ReduceOp::Mean => ad.mul_c(d, 1.0 / count.max(1) as f32)?,
                ReduceOp::Max => {
                    // Split evenly between the maxima, as PyTorch's amax does.
                    let yk = ad.reshape(y, kept)?;
                    let eq = ad.op(Op::Compare(CompareOp::Equal), &[ins[0], yk])?;
                    let m = ad.op(Op::Cast { to: DType::F32 }, &[eq])?;
                    let n = ad.sum(m, axes.clone(), true)?;
                    let q = ad.bin(B::Div, d, n)?;
                    ad.mul(q, m)?
                }
            };
            set!(0, d);
        }
        Op::Gemm { trans_a, trans_b, alpha, beta } => {
            let (a, b) = (ins[0], ins[1]);
            let gemm = |ta, tb| Op::Gemm { trans_a: ta, trans_b: tb, alpha: *alpha, beta: 0.0 };
            if needs[0] {
                out[0] = Some(if *trans_a { ad.op(gemm(*trans_b, true), &[b, dy])? } else { ad.op(gemm(false, !*trans_b), &[dy, b])? });
            }
            if needs[1] {
                out[1] = Some(if *trans_b { ad.op(gemm(true, *trans_a), &[dy, a])? } else { ad.op(gemm(!*trans_a, false), &[a, dy])? });
            }
            if ins.len() > 2 && needs[2] {
                let d = if *beta == 1.0 { dy } else { ad.mul_c(dy, *beta)? };
                out[2] = Some(ad.reduce_to(d, &xs[2])?);
            }
        }
        Op::MatMul => {
            if xs[0].len() < 2 || xs[1].len() < 2 {
                return Err(unsupported("the gradient of a matmul of a vector is not supported yet"));
            }
            if needs[0] {
                let bt = ad.t(ins[1])?;
                let d = ad.op(Op::MatMul, &[dy, bt])?;
                out[0] = Some(ad.reduce_to(d, &xs[0])?);
            }
            if needs[1] {
                let at = ad.t(ins[0])?;
                let d = ad.op(Op::MatMul, &[at, dy])?;
                out[1] = Some(ad.reduce_to(d, &xs[1])?);
            }
        }
        Op::Concat { axis } => {
            let mut off = 0i64;
            for i in 0..ins.len() {
                let len = xs[i][*axis] as i64;
                if needs[i] {
                    out[i] = Some(ad.op(Op::Slice { axes: vec![*axis], starts: vec![off], ends: vec![off + len], steps: vec![1] }, &[dy])?);
                }
                off += len;
            }
        }
        Op::Split { axis, .. } => {
            if needs[0] {
                let mut parts = Vec::new();
                for (slot, d) in dys.iter().enumerate() {
                    let ty = out_tys[slot].clone();
                    parts.push(match d {
                        Some(d) => *d,
                        None => {
                            let zero = ad.scalar(0.0);
                            ad.expand(zero, ty.shape)?
                        }
                    });
                }
                out[0] = Some(ad.op(Op::Concat { axis: *axis }, &parts)?);
            }
        }
        Op::Slice { axes, starts, steps, .. } => {
            if steps.iter().any(|&s| s < 1) {
                return Err(unsupported("the gradient of a slice with a negative step is not supported yet"));
            }
            // A strided axis first spreads dy out: each element followed by
            // step - 1 zeros (a new axis padded, merged), the tail cut.
            let r = xs[0].len();
            let mut d = dy;
            let mut span = ad.shape(y);
            for (i, &a) in axes.iter().enumerate() {
                let (s, n) = (steps[i] as usize, span[a]);
                if s == 1 || n == 0 {
                    continue;
                }
                let mut merged = ad.shape(d);
                let mut wide = merged.clone();
                wide.insert(a + 1, 1);
                d = ad.reshape(d, wide)?;
                let mut pads = vec![0; 2 * (r + 1)];
                pads[r + 1 + a + 1] = s - 1;
                d = ad.op(Op::Pad { pads, mode: PadMode::Constant(0.0) }, &[d])?;
                merged[a] = n * s;
                d = ad.reshape(d, merged)?;
                let keep = (n - 1) * s + 1;
                d = ad.op(Op::Slice { axes: vec![a], starts: vec![0], ends: vec![keep as i64], steps: vec![1] }, &[d])?;
                span[a] = keep;
            }
            let mut pads = vec![0; 2 * r];
            for (i, &a) in axes.iter().enumerate() {
                pads[a] = starts[i] as usize;
                pads[r + a] = xs[0][a] - starts[i] as usize - span[a];
            }
            set!(0, ad.op(Op::Pad { pads, mode: PadMode::Constant(0.0) }, &[d])?);
        }
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Identity | Op::Dropout => {
            set!(0, ad.reshape(dy, xs[0].clone())?)
        }
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            perm.iter().enumerate().for_each(|(i, &p)| inv[p] = i);
            set!(0, ad.op(Op::Transpose { perm: inv }, &[dy])?);
        }
        Op::Softmax { axis } => {
            let p = ad.mul(dy, y)?;
            let s = ad.sum(p, vec![*axis], true)?;
            let d = ad.bin(B::Sub, dy, s)?;
            set!(0, ad.mul(y, d)?);
        }
        Op::LogSoftmax { axis } => {
            let e = ad.un(U::Exp, y)?;
            let s = ad.sum(dy, vec![*axis], true)?;
            let p = ad.mul(e, s)?;
            set!(0, ad.bin(B::Sub, dy, p)?);
        }
        Op::LayerNorm { axis, epsilon } => {
            let x = ins[0];
            let axes: Vec<usize> = (*axis..xs[0].len()).collect();
            let mean = |ad: &mut Ad, v| ad.op(Op::Reduce { op: ReduceOp::Mean, axes: axes.clone(), keepdims: true }, &[v]);
            let mu = mean(ad, x)?;
            let xc = ad.bin(B::Sub, x, mu)?;
            let sq = ad.mul(xc, xc)?;
            let var = mean(ad, sq)?;
            let eps = ad.scalar(*epsilon);
            let ve = ad.bin(B::Add, var, eps)?;
            let sd = ad.un(U::Sqrt, ve)?;
            let rstd = ad.un(U::Reciprocal, sd)?;
            let xhat = ad.mul(xc, rstd)?;
            if needs[0] {
                let gx = ad.mul(dy, ins[1])?;
                let m1 = mean(ad, gx)?;
                let gxh = ad.mul(gx, xhat)?;
                let m2 = mean(ad, gxh)?;
                let t = ad.mul(xhat, m2)?;
                let d = ad.bin(B::Sub, gx, m1)?;
                let d = ad.bin(B::Sub, d, t)?;
                out[0] = Some(ad.mul(d, rstd)?);
            }
            if needs[1] {
                let p = ad.mul(dy, xhat)?;
                out[1] = Some(ad.reduce_to(p, &xs[1])?);
            }
            if ins.len() > 2 && needs[2] {
                out[2] = Some(ad.reduce_to(dy, &xs[2])?);
            }
        }
        Op::Lrn(l) => {
            set!(0, ad.op(Op::LrnGrad(*l), &[ins[0], dy])?)
        }
        Op::Pad { pads, mode } => {
            if !matches!(mode, PadMode::Constant(_)) {
                return Err(unsupported("the gradient of a reflect or edge pad is not supported yet"));
            }
            let r = xs[0].len();
            let axes: Vec<usize> = (0..r).collect();
            let starts: Vec<i64> = (0..r).map(|a| pads[a] as i64).collect();
            let ends: Vec<i64> = (0..r).map(|a| (pads[a] + xs[0][a]) as i64).collect();
            set!(0, ad.op(Op::Slice { axes, starts, ends, steps: vec![1; r] }, &[dy])?);
        }
        Op::Expand { .. } => set!(0, ad.reduce_to(dy, &xs[0])?),
        Op::Tile { repeats } => {
            // Output dim d is [repeats[d], x[d]]: sum over the repeats.
            let inter: Vec<usize> = repeats.iter().zip(&xs[0]).flat_map(|(&r, &d)| [r, d]).collect();
            let d = ad.reshape(dy, inter)?;
            let axes: Vec<usize> = (0..repeats.len()).map(|i| 2 * i).collect();
            let s = ad.sum(d, axes, false)?;
            set!(0, ad.reshape(s, xs[0].clone())?);
        }
        Op::Cast { .. } => {
            set!(0, ad.op(Op::Cast { to: in_dtype0 }, &[dy])?);
        }
        Op::Gather { axis } => set!(0, ad.op(Op::GatherGrad { axis: *axis, shape: xs[0].clone() }, &[ins[1], dy])?),
        Op::ConvGradData { .. }
        | Op::ConvGradWeight { .. }
        | Op::MaxPoolGrad(_)
        | Op::AvgPoolGrad { .. }
        | Op::LrnGrad(_)
        | Op::GatherGrad { .. }
        | Op::Update(_) => return Err(unsupported("second derivatives are not supported")),
    }
    Ok(out)
}

/// A convolution whose only reader is a batch norm with frozen statistics
/// (`bn = s (conv - m) / sqrt(v + eps) + b`): differentiated as one linear
/// layer, so backward keeps only the convolution's input. With `k = s inv`,
/// `inv = 1 / sqrt(v + eps)` and `H = conv_grad_weight(x, dy)`:
/// `dW = k H`, `dx = conv_grad_data(k dy, W)`, `db_conv = k sum dy`,
/// `ds = inv (sum_k W H + (b_conv - m) sum dy)` per channel (the sum of
/// `dy` times the conv's output, without the output), `db = sum dy`.
/// Returns the gradients of the conv's operands, then of the batch norm's.
pub(super) fn conv_batch_norm(
    ad: &mut Ad,
    conv: NodeId,
    bn: NodeId,
    dy: ValueId,
    needs_conv: &[bool],
    needs_bn: &[bool],
) -> Result<(Vec<Option<ValueId>>, Vec<Option<ValueId>>), TrainError> {
    let (Op::Conv(c), Op::BatchNorm { epsilon }) = (ad.g.node(conv).op.clone(), ad.g.node(bn).op.clone()) else {
        return Err(TrainError::Bug(smelt_ir::IrError::Invalid("conv_batch_norm on other ops".into())));
    };
    let (ci, bi) = (ad.g.inputs_of(conv), ad.g.inputs_of(bn));
    let (x, w) = (ci[0], ci[1]);
    let (xs, ws) = (ad.shape(x), ad.shape(w));
    let rank = xs.len();
    let mut dc = vec![None; ci.len()];
    let mut db = vec![None; bi.len()];
    let eps = ad.scalar(epsilon);
    let var = ad.bin(BinaryOp::Add, bi[4], eps)?;
    let sd = ad.un(UnaryOp::Sqrt, var)?;
    let inv = ad.un(UnaryOp::Reciprocal, sd)?;
    let k = ad.mul(bi[1], inv)?;
    let axes: Vec<usize> = (0..rank).filter(|&a| a != 1).collect();
    let need_sum = needs_bn[1] || needs_bn[2] || ci.len() > 2 && needs_conv[2];
    let sum_dy = if need_sum { Some(ad.sum(dy, axes, false)?) } else { None };
    if needs_conv[0] {
        let kc = ad.per_channel(k, rank)?;
        let dz = ad.mul(dy, kc)?;
        dc[0] = Some(ad.op(Op::ConvGradData { conv: c.clone(), shape: xs }, &[dz, w])?);
    }
    if needs_conv[1] || needs_bn[1] {
        let h = ad.op(Op::ConvGradWeight { conv: c, shape: ws.clone() }, &[x, dy])?;
        if needs_conv[1] {
            let mut kw = vec![1; ws.len()];
            kw[0] = ws[0];
            let kw = ad.reshape(k, kw)?;
            dc[1] = Some(ad.mul(h, kw)?);
        }
        if needs_bn[1] {
            let wh = ad.mul(w, h)?;
            let dot = ad.sum(wh, (1..ws.len()).collect(), false)?;
            let shift = if ci.len() > 2 { ad.bin(BinaryOp::Sub, ci[2], bi[3])? } else { ad.un(UnaryOp::Neg, bi[3])? };
            let sum_dy = sum_dy.expect("computed for the scale");
            let off = ad.mul(shift, sum_dy)?;
            let t = ad.bin(BinaryOp::Add, dot, off)?;
            db[1] = Some(ad.mul(t, inv)?);
        }
    }
    if needs_bn[2] {
        db[2] = sum_dy;
    }
    if ci.len() > 2 && needs_conv[2] {
        dc[2] = Some(ad.mul(k, sum_dy.expect("computed for the bias"))?);
    }
    Ok((dc, db))
}
