//! The two levels of the IR. A [`Graph`](crate::Graph) of [`Op`]s is what a
//! user's model means: framework-level ops, the graph that import, autodiff
//! and verification read. A [`KernelGraph`] of [`KernelOp`]s is what the GPU
//! runs: every node one kernel (or a view, a source, an aliased
//! concatenation), made by fusion and read by precision, clustering, the
//! memory planner, code generation and reports. [`Graph::lift`] turns the
//! first into the second node for node, keeping node ids.
//!
//! [`OpSet`] is what the graph, the verifier and the text format need of
//! either level.

use crate::dtype::TensorType;
use crate::fused::{Act, Expr};
use crate::graph::Graph;
use crate::op::{Conv, Op, ReduceOp};
use crate::text::{Attr, Attrs};
use crate::traits::Traits;

/// A graph at the kernel level.
pub type KernelGraph = Graph<KernelOp>;

/// The reduction of a [`KernelOp::FusedReduction`]: the semantic ops whose
/// kernel reads an elementwise prologue (a closed set: every consumer
/// matches all of them).
#[derive(Clone, Debug, PartialEq)]
pub enum Reducer {
    /// Mean over the spatial dimensions.
    GlobalAveragePool,
    /// Softmax along `axis`.
    Softmax {
        /// The axis.
        axis: usize,
    },
    /// Log-softmax along `axis`.
    LogSoftmax {
        /// The axis.
        axis: usize,
    },
    /// Layer normalization from `axis` on (its scale and bias are operands).
    LayerNorm {
        /// First normalized dimension.
        axis: usize,
        /// Added to the variance.
        epsilon: f32,
    },
    /// A reduction over axes.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes, sorted.
        axes: Vec<usize>,
        /// Keep reduced axes with extent 1.
        keepdims: bool,
    },
}

impl Reducer {
    /// `op` as a reducer, if its kernel takes a prologue.
    pub fn of(op: &Op) -> Option<Reducer> {
        Some(match op {
            Op::GlobalAveragePool => Reducer::GlobalAveragePool,
            Op::Softmax { axis } => Reducer::Softmax { axis: *axis },
            Op::LogSoftmax { axis } => Reducer::LogSoftmax { axis: *axis },
            Op::LayerNorm { axis, epsilon } => Reducer::LayerNorm { axis: *axis, epsilon: *epsilon },
            Op::Reduce { op, axes, keepdims } => Reducer::Reduce { op: *op, axes: axes.clone(), keepdims: *keepdims },
            _ => return None,
        })
    }

    /// The semantic op.
    pub fn op(&self) -> Op {
        match self {
            Reducer::GlobalAveragePool => Op::GlobalAveragePool,
            Reducer::Softmax { axis } => Op::Softmax { axis: *axis },
            Reducer::LogSoftmax { axis } => Op::LogSoftmax { axis: *axis },
            Reducer::LayerNorm { axis, epsilon } => Op::LayerNorm { axis: *axis, epsilon: *epsilon },
            Reducer::Reduce { op, axes, keepdims } => Op::Reduce { op: *op, axes: axes.clone(), keepdims: *keepdims },
        }
    }
}

/// The product of a [`KernelOp::GemmEpilogue`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Product {
    /// A batched matrix product (numpy semantics).
    MatMul,
    /// `alpha * op(a) @ op(b)`: a GEMM without its C operand.
    Gemm {
        /// Transpose a.
        trans_a: bool,
        /// Transpose b.
        trans_b: bool,
        /// Product scale.
        alpha: f32,
        /// Bias scale (of a C operand the epilogue adds).
        beta: f32,
    },
}

impl Product {
    /// `op` as a product, if it is one.
    pub fn of(op: &Op) -> Option<Product> {
        match *op {
            Op::MatMul => Some(Product::MatMul),
            Op::Gemm { trans_a, trans_b, alpha, beta } => Some(Product::Gemm { trans_a, trans_b, alpha, beta }),
            _ => None,
        }
    }

    /// The semantic op.
    pub fn op(self) -> Op {
        match self {
            Product::MatMul => Op::MatMul,
            Product::Gemm { trans_a, trans_b, alpha, beta } => Op::Gemm { trans_a, trans_b, alpha, beta },
        }
    }
}

/// What a graph node can hold: [`Op`] (semantic) or [`KernelOp`].
pub trait OpSet: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static {
    /// The op's name in the text format and in reports.
    fn name(&self) -> &'static str;
    /// Output types from input types, or what is wrong.
    fn infer(&self, ins: &[&TensorType]) -> Result<Vec<TensorType>, String>;
    /// The facts about the op (see [`crate::traits`]).
    fn traits(&self) -> Traits;
    /// The semantic op, when this is one.
    fn semantic(&self) -> Option<&Op>;
    /// Wraps a semantic op.
    fn from_op(op: Op) -> Self;
    /// Attributes in printing order (the text format).
    fn attrs(&self) -> Vec<(&'static str, Attr)>;
    /// The op named `name` with attributes `a` (the text format).
    fn from_attrs(name: &str, a: Attrs) -> Result<Self, String>;

    /// Whether this is a graph input.
    fn is_input(&self) -> bool {
        self.semantic() == Some(&Op::Input)
    }
    /// Whether this is a constant: immutable data that passes may fold.
    fn is_constant(&self) -> bool {
        self.semantic() == Some(&Op::Constant)
    }
    /// Whether this holds persistent data under its name: a constant, a
    /// parameter or state. Persistent values live outside the activation
    /// arena.
    fn is_persistent(&self) -> bool {
        matches!(self.semantic(), Some(Op::Constant | Op::Parameter | Op::State))
    }
    /// Whether it only reinterprets its input's elements (a view).
    fn is_view(&self) -> bool {
        self.traits().kind == crate::traits::Kind::View
    }
    /// Whether it computes anything: not a source or a view. (A kernel op
    /// also says no for a concatenation its producers write in place.)
    fn is_kernel(&self) -> bool {
        !matches!(self.traits().kind, crate::traits::Kind::Source | crate::traits::Kind::View)
    }
}

/// What the GPU runs: one kernel per node.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelOp {
    /// A semantic op run as its own kernel (or, for sources and views, as
    /// nothing).
    Op(Op),
    /// A convolution with its epilogue applied in registers:
    /// `act(conv(x, w) + bias + residual)`. Inputs: x, w, then bias `[M]` if
    /// `bias`, then residual (the output's shape) if `residual`.
    FusedConv {
        /// The convolution.
        conv: Conv,
        /// Whether a bias input follows the weight.
        bias: bool,
        /// Whether a residual input comes last.
        residual: bool,
        /// The activation.
        act: Act,
    },
    /// A Gemm with an activation: `act(alpha * op(a) @ op(b) + beta * c)`.
    FusedGemm {
        /// Transpose a.
        trans_a: bool,
        /// Transpose b.
        trans_b: bool,
        /// Product scale.
        alpha: f32,
        /// Bias scale.
        beta: f32,
        /// The activation.
        act: Act,
    },
    /// One elementwise kernel computing `expr` over its broadcast inputs.
    Elementwise {
        /// The expression; `$i` is input i.
        expr: Expr,
    },
    /// A reduction (global average pool, softmax, layer norm) of a value
    /// that an elementwise expression computes on the fly from the inputs,
    /// so the value never reaches memory. Inputs: the expression's, then
    /// the reduction's own operands (a layer norm's scale and bias).
    FusedReduction {
        /// The elementwise prologue; `$i` is input i.
        expr: Expr,
        /// The reduction applied to its (broadcast) result.
        reduction: Reducer,
    },
    /// A matrix product whose result an elementwise expression consumes in
    /// the kernel's epilogue (a bias and GELU in any exporter's spelling, a
    /// residual add), so the product never reaches memory. Inputs: the
    /// product's a and b, then the expression's other inputs; in `expr`,
    /// `$0` is the product (in f32, as accumulated, read as `shape`) and
    /// `$i` is input `i + 1`.
    GemmEpilogue {
        /// The product: `matmul`, or a `gemm` without its C operand.
        product: Product,
        /// The epilogue.
        expr: Expr,
        /// The output shape; the product is read as this shape (same
        /// elements, as a reshape between them would).
        shape: Vec<usize>,
    },
    /// Rows `[start, end)` along `axis` of its input, where the dims before
    /// `axis` have one element in all: contiguous bytes of the input, a
    /// view at an offset (no kernel). Split execution reads each slice of
    /// the batch so.
    SliceView {
        /// The sliced axis.
        axis: usize,
        /// First index.
        start: usize,
        /// Exclusive end.
        end: usize,
    },
    /// A concatenation whose producers write straight into their slices of
    /// the output: no copy kernel, and the memory planner may alias.
    ConcatInPlace {
        /// Concatenation axis.
        axis: usize,
    },
    /// Attention in one kernel: `softmax(expr(q @ kt, extras...)) @ v`, the
    /// softmax along the keys, so the `[.., queries, keys]` scores never
    /// reach memory. Inputs: q `[.., Sq, D]`, kt `[.., D, Sk]` (the keys
    /// transposed, as exports compute them), v `[.., Sk, Dv]`, then the
    /// extras (masks, scales) that broadcast to the scores' shape.
    Attention {
        /// The scores' prologue; `$score` is the product, the other inputs
        /// are the extras in order.
        expr: Expr,
        /// Which input of `expr` is the product.
        score: usize,
        /// A row whose softmax is NaN (every key masked with -inf) gives
        /// zeros, as exports spell `where(isnan(p), 0, p)`.
        nan_to_zero: bool,
        /// q, kt and v are inputs 0, 1, 2 read through the first three
        /// permutations of their dims (a transpose folded into the kernel's
        /// indexing), and the output is written through the fourth (the
        /// transpose after attention that merges the heads back); empty:
        /// as stored.
        perms: [Vec<usize>; 4],
    },
}

/// The largest head dimension (of q and k, and of v) the fused attention
/// kernel keeps in registers; fusion leaves larger heads unfused.
pub const ATTENTION_MAX_HEAD: usize = 128;
/// The most matrices (batch times heads) one attention launch computes.
pub const ATTENTION_MAX_BATCH: usize = 65_535;

impl From<Op> for KernelOp {
    fn from(op: Op) -> KernelOp {
        KernelOp::Op(op)
    }
}

impl OpSet for Op {
    fn name(&self) -> &'static str {
        Op::name(self)
    }
    fn infer(&self, ins: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        crate::infer::infer(self, ins)
    }
    fn traits(&self) -> Traits {
        Op::traits(self)
    }
    fn semantic(&self) -> Option<&Op> {
        Some(self)
    }
    fn from_op(op: Op) -> Op {
        op
    }
    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        crate::text::attrs_of(self)
    }
    fn from_attrs(name: &str, a: Attrs) -> Result<Op, String> {
        crate::text::op_from(name, a)
    }
}

impl OpSet for KernelOp {
    fn name(&self) -> &'static str {
        match self {
            KernelOp::Op(op) => op.name(),
            KernelOp::FusedConv { .. } => "fused_conv",
            KernelOp::FusedGemm { .. } => "fused_gemm",
            KernelOp::Elementwise { .. } => "elementwise",
            KernelOp::FusedReduction { .. } => "fused_reduction",
            KernelOp::ConcatInPlace { .. } => "concat_in_place",
            KernelOp::SliceView { .. } => "slice_view",
            KernelOp::Attention { .. } => "attention",
            KernelOp::GemmEpilogue { .. } => "gemm_epilogue",
        }
    }
    fn infer(&self, ins: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        crate::infer::infer_kernel(self, ins)
    }
    fn traits(&self) -> Traits {
        KernelOp::traits(self)
    }
    fn is_kernel(&self) -> bool {
        !matches!(self, KernelOp::ConcatInPlace { .. })
            && !matches!(self.traits().kind, crate::traits::Kind::Source | crate::traits::Kind::View)
    }
    fn semantic(&self) -> Option<&Op> {
        match self {
            KernelOp::Op(op) => Some(op),
            KernelOp::FusedConv { .. }
            | KernelOp::FusedGemm { .. }
            | KernelOp::Elementwise { .. }
            | KernelOp::FusedReduction { .. }
            | KernelOp::ConcatInPlace { .. }
            | KernelOp::SliceView { .. }
            | KernelOp::Attention { .. }
            | KernelOp::GemmEpilogue { .. } => None,
        }
    }
    fn from_op(op: Op) -> KernelOp {
        KernelOp::Op(op)
    }
    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        crate::text::kernel_attrs_of(self)
    }
    fn from_attrs(name: &str, a: Attrs) -> Result<KernelOp, String> {
        crate::text::kernel_op_from(name, a)
    }
}

impl Graph<Op> {
    /// The same graph at the kernel level, every op run as its own kernel.
    /// Node ids, names, types, inputs, outputs and weights are kept.
    pub fn lift(&self) -> KernelGraph {
        let mut k = self.map_ops(|op| KernelOp::Op(op.clone()));
        for id in self.node_ids() {
            k.set_origin(id, vec![id]);
        }
        k
    }
}

impl KernelGraph {
    /// The nodes of the model as imported that node `id` computes (see
    /// [`crate::Node::origin`]); empty for constants that fusion made.
    pub fn origin(&self, id: crate::NodeId) -> &[crate::NodeId] {
        &self.node(id).origin
    }

    /// The model nodes that `nodes` compute together (for a node replacing
    /// them; [`crate::Graph::set_origin`] sorts and dedups).
    pub fn origins<'a>(&self, nodes: impl IntoIterator<Item = &'a crate::NodeId>) -> Vec<crate::NodeId> {
        nodes.into_iter().flat_map(|&n| self.origin(n).iter().copied()).collect()
    }
}
