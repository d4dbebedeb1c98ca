//! The rewrites, each named and directional. Constant folding (BN into conv
//! weights, per-channel scales and shifts) is done by custom appliers that
//! add the folded tensors to the value table, once per distinct input.

use super::lang::{op_of, symbol_of, Fl, FusionAnalysis, Origin, ValRef};
use egg::{rewrite, Applier, EGraph, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};
use smelt_ir::{infer, Op, Tensor, TensorType};

type EG = EGraph<Fl, FusionAnalysis>;

fn var(s: &str) -> Var {
    s.parse().expect("valid variable")
}

fn pat(s: &str) -> Pattern<Fl> {
    s.parse().expect("valid pattern")
}

/// Every rule of the fusion pass.
pub fn rules() -> Vec<Rewrite<Fl, FusionAnalysis>> {
    let applier = |name: &str, searcher: &str, kind: Fold| Rewrite::new(name, pat(searcher), kind).expect("valid rule");
    vec![
        applier("fold-bn-into-conv", "(bn ?e (conv ?c ?x ?w ?b none none) ?s ?bb ?m ?v)", Fold::BnIntoConv),
        applier("fold-channel-mul-into-conv", "(bin mul (conv ?c ?x ?w ?b none none) ?k)", Fold::MulIntoConv),
        applier("fold-channel-add-into-conv", "(bin add (conv ?c ?x ?w ?b none none) ?k)", Fold::AddIntoConv),
        rewrite!("conv-residual-add"; "(bin add (conv ?c ?x ?w ?b none none) ?r)" => "(conv ?c ?x ?w ?b ?r none)" if residual_fits),
        rewrite!("conv-residual-add-rhs"; "(bin add ?r (conv ?c ?x ?w ?b none none))" => "(conv ?c ?x ?w ?b ?r none)" if residual_fits),
        rewrite!("conv-activation"; "(un ?k (conv ?c ?x ?w ?b ?r none))" => "(conv ?c ?x ?w ?b ?r ?k)" if is_activation),
        rewrite!("conv-silu"; "(bin mul (conv ?c ?x ?w ?b ?r none) (un sigmoid (conv ?c ?x ?w ?b ?r none)))" => "(conv ?c ?x ?w ?b ?r silu)"),
        rewrite!("gemm-activation"; "(un ?k (gemm ?g ?a ?b ?c none))" => "(gemm ?g ?a ?b ?c ?k)" if is_activation),
        applier("matmul-bias-to-gemm", "(bin add (matmul ?a ?b) ?k)", Fold::MatMulBias),
        applier("bn-to-scale-shift", "(bn ?e ?x ?s ?bb ?m ?v)", Fold::BnScaleShift),
        applier("fold-mul-mul-const", "(bin mul (bin mul ?x ?a) ?b)", Fold::MulMul),
        applier("fold-add-add-const", "(bin add (bin add ?x ?a) ?b)", Fold::AddAdd),
        applier("fold-mul-over-add-const", "(bin mul (bin add ?x ?a) ?b)", Fold::MulOverAdd),
        rewrite!("drop-identity"; "(un identity ?x)" => "?x"),
        rewrite!("drop-dropout"; "(un dropout ?x)" => "?x"),
    ]
}

/// `?k` is an activation a kernel epilogue applies: relu, sigmoid, GELU
/// (both forms) or clip.
fn is_activation(eg: &mut EG, _: Id, s: &Subst) -> bool {
    let k = s[var("?k")];
    symbol_of(eg, k).is_some_and(|s| matches!(s.as_str(), "relu" | "sigmoid" | "gelu" | "gelu_tanh"))
        || matches!(op_of(eg, k), Some(Op::Clip { .. }))
}

/// The conv's output type, from its bound attributes and operands.
fn conv_out(eg: &EG, s: &Subst) -> Option<TensorType> {
    let op = op_of(eg, s[var("?c")])?;
    let (x, w) = (eg[s[var("?x")]].data.ty.as_ref()?, eg[s[var("?w")]].data.ty.as_ref()?);
    infer(op, &[x, w]).ok()?.into_iter().next()
}

/// The residual has exactly the conv's output type (no broadcasting).
fn residual_fits(eg: &mut EG, _: Id, s: &Subst) -> bool {
    let r = eg[s[var("?r")]].data.ty.clone();
    r.is_some() && r == conv_out(eg, s)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fold {
    BnIntoConv,
    MulIntoConv,
    AddIntoConv,
    MatMulBias,
    BnScaleShift,
    MulMul,
    AddAdd,
    MulOverAdd,
}

/// `f(a, b)` elementwise with numpy broadcasting, in f32, as a tensor of
/// `a`'s dtype (small per-channel constants only: refused above 64 Ki elements).
fn const_binary(a: &Tensor, b: &Tensor, f: fn(f32, f32) -> f32) -> Option<Tensor> {
    let shape = smelt_ir::broadcast(a.shape(), b.shape())?;
    let n: usize = shape.iter().product();
    if n > 1 << 16 || a.ty().dtype != b.ty().dtype || !a.ty().dtype.is_float() {
        return None;
    }
    let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
    let at = |v: &[f32], s: &[usize], i: usize| v[smelt_ir::broadcast_index(i, &shape, s)];
    let out: Vec<f32> = (0..n).map(|i| f(at(&av, a.shape(), i), at(&bv, b.shape(), i))).collect();
    Some(Tensor::from_f32(shape, out).cast(a.ty().dtype))
}

/// Data of the constant bound to `v`, with its value-table entry (shared, not copied).
fn konst(eg: &EG, s: &Subst, v: &str) -> Option<(ValRef, std::sync::Arc<Tensor>)> {
    let r = eg[s[var(v)]].data.konst?;
    Some((r, eg.analysis.vals[r.0].data.clone()?))
}

fn is_none(eg: &EG, id: Id) -> bool {
    symbol_of(eg, id).is_some_and(|s| s.as_str() == "none")
}

fn name_of(eg: &EG, r: ValRef) -> String {
    match &eg.analysis.vals[r.0].origin {
        Origin::Constant(n) | Origin::Persistent { name: n, .. } => n.clone(),
        Origin::Input(_) => "input".into(),
    }
}

/// Values of a per-channel constant for `m` channels of `out`: its shape,
/// aligned right, is 1 everywhere except dim 1 (1 or m). `None` otherwise.
fn per_channel(k: &Tensor, out: &TensorType) -> Option<Vec<f32>> {
    let m = *out.shape.get(1)?;
    let r = out.shape.len();
    let ks = k.shape();
    if ks.len() > r {
        return None;
    }
    let aligned: Vec<usize> = std::iter::repeat_n(1, r - ks.len()).chain(ks.iter().copied()).collect();
    let ok = aligned.iter().enumerate().all(|(d, &e)| e == 1 || (d == 1 && e == m));
    let v = k.to_f32_vec();
    ok.then(|| if v.len() == 1 { vec![v[0]; m] } else { v })
}

fn like(t: &Tensor, shape: Vec<usize>, v: Vec<f32>) -> Tensor {
    let f = Tensor::from_f32(shape, v);
    if t.ty().dtype == smelt_ir::DType::F32 {
        f
    } else {
        f.cast(t.ty().dtype)
    }
}

impl Applier<Fl, FusionAnalysis> for Fold {
    fn apply_one(&self, eg: &mut EG, matched: Id, s: &Subst, _: Option<&PatternAst<Fl>>, _: Symbol) -> Vec<Id> {
        let Some(new) = self.build(eg, matched, s) else { return vec![] };
        if eg.union(matched, new) {
            vec![new]
        } else {
            vec![]
        }
    }
}

impl Fold {
    /// Builds the replacement e-node, or `None` when the match does not apply.
    fn build(self, eg: &mut EG, matched: Id, s: &Subst) -> Option<Id> {
        let none = eg.add(Fl::Symbol("none".into()));
        let out_ty = eg[matched].data.ty.clone()?;
        match self {
            Fold::BnIntoConv | Fold::MulIntoConv | Fold::AddIntoConv => {
                let (wr, w) = konst(eg, s, "?w")?;
                let bid = s[var("?b")];
                let b = if is_none(eg, bid) { None } else { Some(konst(eg, s, "?b")?) };
                let m = w.shape()[0];
                // The folded per-channel (scale, shift), and a key naming the inputs.
                let (tag, key, params): (&str, String, Vec<std::sync::Arc<Tensor>>) = match self {
                    Fold::BnIntoConv => {
                        let eps = match op_of(eg, s[var("?e")])? {
                            Op::BatchNorm { epsilon } => *epsilon,
                            _ => return None,
                        };
                        let (refs, ts): (Vec<ValRef>, Vec<_>) =
                            ["?s", "?bb", "?m", "?v"].iter().map(|v| konst(eg, s, v)).collect::<Option<Vec<_>>>()?.into_iter().unzip();
                        ("bn", format!("{refs:?}{}", eps.to_bits()), ts)
                    }
                    Fold::MulIntoConv => {
                        let (kr, k) = konst(eg, s, "?k")?;
                        ("mul", format!("{kr:?}"), vec![k])
                    }
                    _ => {
                        let (kr, k) = konst(eg, s, "?k")?;
                        ("add", format!("{kr:?}"), vec![k])
                    }
                };
                // A broadcast that changes the conv's output type is not a per-channel fold.
                if conv_out(eg, s).as_ref() != Some(&out_ty) || out_ty.shape.get(1) != Some(&m) {
                    return None;
                }
                let cache_key = format!("{tag}:{wr:?}:{:?}:{key}", b.as_ref().map(|(r, _)| *r));
                let (nw, nb) = match eg.analysis.folded.get(&cache_key) {
                    Some(&pair) => pair,
                    None => {
                        let (scale, shift) = match self {
                            Fold::BnIntoConv => {
                                let eps = match op_of(eg, s[var("?e")])? {
                                    Op::BatchNorm { epsilon } => *epsilon,
                                    _ => return None,
                                };
                                let [sc, bb, mean, var_] = [0, 1, 2, 3].map(|i| params[i].to_f32_vec());
                                let scale: Vec<f32> = (0..m).map(|i| sc[i] / (var_[i] + eps).sqrt()).collect();
                                let shift: Vec<f32> = (0..m).map(|i| bb[i] - mean[i] * scale[i]).collect();
                                (scale, shift)
                            }
                            Fold::MulIntoConv => (per_channel(&params[0], &out_ty)?, vec![0.0; m]),
                            _ => (vec![1.0; m], per_channel(&params[0], &out_ty)?),
                        };
                        let mut bv = b.as_ref().map_or(vec![0.0; m], |(_, t)| t.to_f32_vec());
                        for i in 0..m {
                            bv[i] = bv[i] * scale[i] + shift[i];
                        }
                        let base = name_of(eg, wr);
                        let nb = eg.analysis.add_const(format!("{base}.{tag}.bias"), like(&w, vec![m], bv));
                        if self == Fold::AddIntoConv {
                            // Only the bias changes: keep the weights.
                            eg.analysis.folded.insert(cache_key, (wr, nb));
                            let (wid, bid) = (eg.add(Fl::Val(wr)), eg.add(Fl::Val(nb)));
                            return Some(eg.add(Fl::Conv([s[var("?c")], s[var("?x")], wid, bid, none, none])));
                        }
                        let inner = (w.ty().numel() / m.max(1)).max(1);
                        // One pass over the weights, straight into the new tensor.
                        let src: std::borrow::Cow<'_, [f32]> = match w.data() {
                            smelt_ir::TensorData::F32(v) => std::borrow::Cow::Borrowed(v.as_slice()),
                            _ => std::borrow::Cow::Owned(w.to_f32_vec()),
                        };
                        let mut wv: Vec<f32> = Vec::with_capacity(src.len());
                        for (c, &k) in src.chunks(inner).zip(&scale) {
                            wv.extend(c.iter().map(|x| x * k));
                        }
                        let nw = eg.analysis.add_const(format!("{base}.{tag}"), like(&w, w.shape().to_vec(), wv));
                        eg.analysis.folded.insert(cache_key, (nw, nb));
                        (nw, nb)
                    }
                };
                let (wid, bid) = (eg.add(Fl::Val(nw)), eg.add(Fl::Val(nb)));
                Some(eg.add(Fl::Conv([s[var("?c")], s[var("?x")], wid, bid, none, none])))
            }
            Fold::MatMulBias => {
                let (a, b, k) = (eg[s[var("?a")]].data.ty.clone()?, eg[s[var("?b")]].data.ty.clone()?, eg[s[var("?k")]].data.ty.clone()?);
                let n = *b.shape.last()?;
                let bias_ok = k.shape == [n] || k.shape == [1, n];
                if a.shape.len() != 2 || b.shape.len() != 2 || !bias_ok {
                    return None;
                }
                let g = eg.analysis.default_gemm();
                let g = eg.add(Fl::Attr(g));
                Some(eg.add(Fl::Gemm([g, s[var("?a")], s[var("?b")], s[var("?k")], none])))
            }
            Fold::MulMul | Fold::AddAdd | Fold::MulOverAdd => {
                // Two constants applied in a row become one (DenseNet's BN
                // scale-and-shift followed by its exported Mul and Add).
                let ((ar, a), (br, b)) = (konst(eg, s, "?a")?, konst(eg, s, "?b")?);
                let key = format!("{self:?}:{ar:?}:{br:?}");
                let (k1, k2) = match eg.analysis.folded.get(&key) {
                    Some(&p) => p,
                    None => {
                        let mul = |x: f32, y: f32| x * y;
                        let add = |x: f32, y: f32| x + y;
                        let (c1, c2) = match self {
                            Fold::MulMul => (const_binary(&a, &b, mul)?, None),
                            Fold::AddAdd => (const_binary(&a, &b, add)?, None),
                            _ => (b.as_ref().clone(), Some(const_binary(&a, &b, mul)?)),
                        };
                        let base = name_of(eg, ar);
                        let k1 = eg.analysis.add_const(format!("{base}.folded"), c1);
                        let k2 = c2.map(|t| eg.analysis.add_const(format!("{base}.folded.shift"), t)).unwrap_or(k1);
                        eg.analysis.folded.insert(key, (k1, k2));
                        (k1, k2)
                    }
                };
                let x = s[var("?x")];
                let (mul, add) = (eg.add(Fl::Symbol("mul".into())), eg.add(Fl::Symbol("add".into())));
                let c1 = eg.add(Fl::Val(k1));
                let new = match self {
                    Fold::MulMul => eg.add(Fl::Binary([mul, x, c1])),
                    Fold::AddAdd => eg.add(Fl::Binary([add, x, c1])),
                    _ => {
                        let c2 = eg.add(Fl::Val(k2));
                        let scaled = eg.add(Fl::Binary([mul, x, c1]));
                        eg.add(Fl::Binary([add, scaled, c2]))
                    }
                };
                // The folded form must compute the same type (no new broadcast).
                (eg[new].data.ty.as_ref() == Some(&out_ty)).then_some(new)
            }
            Fold::BnScaleShift => {
                // A BatchNorm right after a plain conv folds into it instead.
                let x = s[var("?x")];
                if eg[x].nodes.iter().any(|n| matches!(n, Fl::Conv([.., r, act]) if is_none(eg, *r) && is_none(eg, *act))) {
                    return None;
                }
                let eps = match op_of(eg, s[var("?e")])? {
                    Op::BatchNorm { epsilon } => *epsilon,
                    _ => return None,
                };
                let (refs, ts): (Vec<ValRef>, Vec<_>) =
                    ["?s", "?bb", "?m", "?v"].iter().map(|v| konst(eg, s, v)).collect::<Option<Vec<_>>>()?.into_iter().unzip();
                let rank = out_ty.shape.len();
                let c = out_ty.shape[1];
                let key = format!("scale-shift:{refs:?}:{}:{rank}:{}", eps.to_bits(), out_ty.dtype);
                let (sr, tr) = match eg.analysis.folded.get(&key) {
                    Some(&p) => p,
                    None => {
                        let [sc, bb, mean, var_] = [0, 1, 2, 3].map(|i| ts[i].to_f32_vec());
                        let scale: Vec<f32> = (0..c).map(|i| sc[i] / (var_[i] + eps).sqrt()).collect();
                        let shift: Vec<f32> = (0..c).map(|i| bb[i] - mean[i] * scale[i]).collect();
                        let shape: Vec<usize> = std::iter::once(c).chain(std::iter::repeat_n(1, rank - 2)).collect();
                        let base = name_of(eg, refs[0]);
                        let sr = eg.analysis.add_const(format!("{base}.scale"), Tensor::from_f32(shape.clone(), scale).cast(out_ty.dtype));
                        let tr = eg.analysis.add_const(format!("{base}.shift"), Tensor::from_f32(shape, shift).cast(out_ty.dtype));
                        eg.analysis.folded.insert(key, (sr, tr));
                        (sr, tr)
                    }
                };
                let (sid, tid) = (eg.add(Fl::Val(sr)), eg.add(Fl::Val(tr)));
                let (mul, add) = (eg.add(Fl::Symbol("mul".into())), eg.add(Fl::Symbol("add".into())));
                let scaled = eg.add(Fl::Binary([mul, s[var("?x")], sid]));
                Some(eg.add(Fl::Binary([add, scaled, tid])))
            }
        }
    }
}
