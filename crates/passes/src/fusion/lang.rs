//! The e-graph language of fusion and its analysis. Shapes and dtypes travel
//! in the analysis data, never in symbols; attributes live in side tables
//! that leaves index (`@3` an attribute entry, `%7` a graph input or constant).

use egg::{define_language, Analysis, DidMerge, EGraph, Id, Symbol};
use smelt_ir::{infer, NodeId, Op, Tensor, TensorType};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Index into [`FusionAnalysis::attrs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttrRef(pub usize);

/// Index into [`FusionAnalysis::vals`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValRef(pub usize);

macro_rules! leaf {
    ($t:ident, $prefix:literal) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
        impl FromStr for $t {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                s.strip_prefix($prefix).and_then(|n| n.parse().ok()).map($t).ok_or(())
            }
        }
    };
}
leaf!(AttrRef, "@");
leaf!(ValRef, "%");

#[allow(missing_docs)]
mod language {
    use super::*;
    define_language! {
        // Fusion's language. Every convolution is `conv`; its last three
        // children are the bias, the residual and the activation, `none` when
        // absent.
        pub enum Fl {
            // `(conv @attrs x w bias residual act)`.
            "conv" = Conv([Id; 6]),
            // `(bn @eps x scale bias mean var)`.
            "bn" = Bn([Id; 6]),
            // `(gemm @attrs a b c act)`, `c` may be `none`.
            "gemm" = Gemm([Id; 5]),
            // `(matmul a b)`.
            "matmul" = MatMul([Id; 2]),
            // `(un kind x)`: kind is a symbol (`relu`) or an attribute (`clip`, `leaky_relu`).
            "un" = Unary([Id; 2]),
            // `(bin kind x y)`, kind a symbol (`add`).
            "bin" = Binary([Id; 3]),
            // `(op @node inputs...)`: any other node, kept as it is.
            "op" = Opaque(Box<[Id]>),
            // `(out @slot x)`: one output of a multi-output `op`.
            "out" = Out([Id; 2]),
            Attr(AttrRef),
            Val(ValRef),
            Symbol(Symbol),
        }
    }
}
pub use language::Fl;

/// An attribute-table entry.
#[derive(Clone, Debug)]
pub enum AttrEntry {
    /// The op whose attributes these are (Conv, BatchNorm, Gemm, Clip, ...).
    Op(Op),
    /// An opaque node: its op, name and output types.
    Opaque {
        /// The op.
        op: Op,
        /// The node's name.
        name: String,
        /// Its output types.
        outputs: Vec<TensorType>,
    },
    /// Output `slot` of an opaque node, of type `ty`.
    Slot {
        /// The output index.
        slot: u32,
        /// Its type.
        ty: TensorType,
    },
}

/// Where a leaf value comes from.
#[derive(Clone, Debug)]
pub enum Origin {
    /// A graph input node of the original graph.
    Input(NodeId),
    /// A constant (original or folded) with this name.
    Constant(String),
    /// A parameter or state of the original graph (`op` says which): its
    /// data is known but it changes between steps, so no rule folds it.
    Persistent {
        /// Its name.
        name: String,
        /// `Op::Parameter` or `Op::State`.
        op: Op,
    },
}

/// A leaf value: a graph input or a constant.
#[derive(Clone, Debug)]
pub struct ValInfo {
    /// Its type.
    pub ty: TensorType,
    /// Its data, for constants.
    pub data: Option<Arc<Tensor>>,
    /// Where it comes from.
    pub origin: Origin,
}

/// Side tables and the per-class data (type and constness).
#[derive(Default)]
pub struct FusionAnalysis {
    /// Attribute table.
    pub attrs: Vec<AttrEntry>,
    /// Value table.
    pub vals: Vec<ValInfo>,
    /// Constants already folded, by rule and inputs: a rule applied again
    /// to the same match reuses them instead of growing the tables.
    pub folded: crate::HashMap<String, (ValRef, ValRef)>,
    gemm: Option<AttrRef>,
}

impl FusionAnalysis {
    /// The attribute entry of a plain Gemm (no transposes, alpha = beta = 1).
    pub fn default_gemm(&mut self) -> AttrRef {
        if let Some(g) = self.gemm {
            return g;
        }
        self.attrs.push(AttrEntry::Op(Op::Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0 }));
        let g = AttrRef(self.attrs.len() - 1);
        self.gemm = Some(g);
        g
    }

    /// Adds a constant to the value table.
    pub fn add_const(&mut self, name: String, t: Tensor) -> ValRef {
        self.vals.push(ValInfo { ty: t.ty().clone(), data: Some(Arc::new(t)), origin: Origin::Constant(name) });
        ValRef(self.vals.len() - 1)
    }
}

/// Per e-class: the tensor type (None for attribute and symbol leaves) and
/// the constant it holds, if any.
#[derive(Clone, Debug, Default)]
pub struct Data {
    /// The type of the class's value.
    pub ty: Option<TensorType>,
    /// The value-table entry when the class is a known constant.
    pub konst: Option<ValRef>,
}

/// The attribute leaf of class `id`, if any.
pub fn attr_of(eg: &EGraph<Fl, FusionAnalysis>, id: Id) -> Option<AttrRef> {
    eg[id].nodes.iter().find_map(|n| if let Fl::Attr(a) = n { Some(*a) } else { None })
}

/// The symbol leaf of class `id`, if any.
pub fn symbol_of(eg: &EGraph<Fl, FusionAnalysis>, id: Id) -> Option<Symbol> {
    eg[id].nodes.iter().find_map(|n| if let Fl::Symbol(s) = n { Some(*s) } else { None })
}

/// The op stored in the attribute leaf of class `id`.
pub fn op_of(eg: &EGraph<Fl, FusionAnalysis>, id: Id) -> Option<&Op> {
    match &eg.analysis.attrs[attr_of(eg, id)?.0] {
        AttrEntry::Op(op) => Some(op),
        _ => None,
    }
}

fn ty(eg: &EGraph<Fl, FusionAnalysis>, id: Id) -> Option<&TensorType> {
    eg[id].data.ty.as_ref()
}

fn is_none(eg: &EGraph<Fl, FusionAnalysis>, id: Id) -> bool {
    symbol_of(eg, id).is_some_and(|s| s.as_str() == "none")
}

fn infer1(op: &Op, ins: &[Option<&TensorType>]) -> Option<TensorType> {
    let ins: Option<Vec<&TensorType>> = ins.iter().copied().collect();
    infer(op, &ins?).ok()?.into_iter().next()
}

impl Analysis<Fl> for FusionAnalysis {
    type Data = Data;

    fn make(eg: &mut EGraph<Fl, Self>, n: &Fl, _id: Id) -> Data {
        let t = |id: Id| ty(eg, id);
        let opt = |id: Id| if is_none(eg, id) { None } else { Some(id) };
        let ty = match n {
            Fl::Val(v) => {
                // Only a constant is constant: parameters and state change.
                let info = &eg.analysis.vals[v.0];
                let konst = (info.data.is_some() && matches!(info.origin, Origin::Constant(_))).then_some(*v);
                return Data { ty: Some(info.ty.clone()), konst };
            }
            Fl::Attr(_) | Fl::Symbol(_) => None,
            Fl::Conv([c, x, w, b, _, _]) => {
                let mut ins = vec![t(*x), t(*w)];
                ins.extend(opt(*b).map(t));
                op_of(eg, *c).and_then(|op| infer1(op, &ins))
            }
            Fl::Bn([_, x, ..]) => t(*x).cloned(),
            Fl::Gemm([g, a, b, c, _]) => {
                let mut ins = vec![t(*a), t(*b)];
                ins.extend(opt(*c).map(t));
                op_of(eg, *g).and_then(|op| infer1(op, &ins))
            }
            Fl::MatMul([a, b]) => infer1(&Op::MatMul, &[t(*a), t(*b)]),
            Fl::Unary([_, x]) => t(*x).cloned(),
            Fl::Binary([_, x, y]) => match (t(*x), t(*y)) {
                (Some(a), Some(b)) => smelt_ir::broadcast(&a.shape, &b.shape).map(|s| TensorType::new(a.dtype, s)),
                _ => None,
            },
            Fl::Opaque(ch) => match attr_of(eg, ch[0]).map(|a| &eg.analysis.attrs[a.0]) {
                Some(AttrEntry::Opaque { outputs, .. }) if outputs.len() == 1 => Some(outputs[0].clone()),
                _ => None,
            },
            Fl::Out([s, _]) => match attr_of(eg, *s).map(|a| &eg.analysis.attrs[a.0]) {
                Some(AttrEntry::Slot { ty, .. }) => Some(ty.clone()),
                _ => None,
            },
        };
        Data { ty, konst: None }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        let mut changed_a = false;
        if a.ty.is_none() && b.ty.is_some() {
            a.ty = b.ty.clone();
            changed_a = true;
        }
        if a.konst.is_none() && b.konst.is_some() {
            a.konst = b.konst;
            changed_a = true;
        }
        DidMerge(changed_a, (b.ty.is_none() && a.ty.is_some()) || (b.konst.is_none() && a.konst.is_some()))
    }
}
