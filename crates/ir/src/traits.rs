//! Facts about each op, in one place: [`Op::traits`] (semantic ops) and
//! [`KernelOp::traits`] (the forms fusion makes) are the only `match`es on
//! every variant that precision, fusion, clustering, the memory planner and
//! its checker read their rules from. They have no wildcard arm, so a new op
//! does not compile until each fact is decided for it. How an op reaches the
//! GPU is not among them: that is the kernel level's one match
//! (`smelt_codegen::Route::of`).

use crate::kernel_op::KernelOp;
use crate::op::Op;

/// What an op does to its operands, as the passes see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A graph input or a constant: no inputs, nothing computed.
    Source,
    /// Same elements in the same order under another shape: shares its
    /// input's bytes (reshape, flatten, squeeze, unsqueeze, identity).
    View,
    /// Moves or selects elements without arithmetic (concat, split, slice,
    /// transpose, pad, expand, tile, gather, max pooling).
    Movement,
    /// One output element from the operands' elements at the same
    /// (broadcast) index: unary, binary, clip, sum, cast, fused expressions.
    Elementwise,
    /// Reduces along axes: global average pool, reduce, (log-)softmax.
    Reduction,
    /// Normalises with statistics: batch norm, layer norm, LRN.
    Normalization,
    /// Contracts with a weight: conv, GEMM, matmul (the model's layers).
    Layer,
    /// Averages a sliding window.
    Window,
    /// An optimizer's update: its outputs replace persistent operands (the
    /// parameter and its state) when the step ends, after every other reader.
    Update,
}

/// How the precision policy treats an op's float output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Decided by its own attributes or data (inputs, constants, casts).
    Fixed,
    /// Takes its (first float) input's precision: it does no arithmetic.
    Follows,
    /// Kept in f32 by the mixed policies: its numbers are sensitive
    /// (softmax, normalization, reductions).
    Sensitive,
    /// Computes in half under a reduced policy, accumulating in f32.
    Half,
}

/// Which operand an op's output may overwrite (the planner aliases them; the
/// checker accepts the overlap only where this says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InPlace {
    /// Never: the op reads operands at other indices than it writes.
    No,
    /// Any operand of the output's type: every element is read before it is
    /// written, at the same index.
    Any,
    /// Only the last operand (a convolution's residual, read by the thread
    /// that writes the same element in its epilogue).
    Last,
}

/// The facts about one op. See [`Op::traits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traits {
    /// What it does.
    pub kind: Kind,
    /// How the precision policy treats it.
    pub precision: Precision,
    /// Which operand its output may overwrite.
    pub in_place: InPlace,
}

const fn t(kind: Kind, precision: Precision, in_place: InPlace) -> Traits {
    Traits { kind, precision, in_place }
}

impl Op {
    /// The facts about this op, one arm per variant (no wildcard: a new op
    /// is a compile error here until each fact is decided).
    pub fn traits(&self) -> Traits {
        use InPlace as I;
        use Kind as K;
        use Precision as P;
        let layer = t(K::Layer, P::Half, I::No);
        match self {
            Op::Input | Op::Constant | Op::Parameter | Op::State => t(K::Source, P::Fixed, I::No),
            Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Dropout | Op::Identity => {
                t(K::View, P::Follows, I::No)
            }
            Op::Conv(_) | Op::Gemm { .. } => layer,
            Op::MatMul => layer,
            Op::BatchNorm { .. } => t(K::Normalization, P::Sensitive, I::Any),
            // Its kernel reads the residual add before it as a prologue.
            Op::LayerNorm { .. } => t(K::Normalization, P::Sensitive, I::No),
            Op::Lrn(_) => t(K::Normalization, P::Half, I::No),
            Op::Unary(_) | Op::Binary(_) | Op::Clip { .. } | Op::Sum => t(K::Elementwise, P::Half, I::Any),
            Op::Cast { .. } => t(K::Elementwise, P::Fixed, I::No),
            // Bool results: float operands are brought to one precision.
            Op::Compare(_) | Op::Logic(_) | Op::Not | Op::IsNaN => t(K::Elementwise, P::Follows, I::No),
            // Masks select between scores and -inf: kept in f32 by the mixed policies.
            Op::Where => t(K::Elementwise, P::Sensitive, I::No),
            Op::MaxPool(_) => t(K::Movement, P::Follows, I::No),
            Op::AveragePool { .. } => t(K::Window, P::Half, I::No),
            Op::GlobalAveragePool | Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::Reduce { .. } => t(K::Reduction, P::Sensitive, I::No),
            Op::Concat { .. } | Op::Transpose { .. } => t(K::Movement, P::Follows, I::No),
            Op::Slice { .. } | Op::Pad { .. } | Op::Expand { .. } | Op::Tile { .. } | Op::Gather { .. } => {
                t(K::Movement, P::Follows, I::No)
            }
            Op::Split { .. } => t(K::Movement, P::Follows, I::No),
            // Backward ops: one thread per output element (2-D images).
            Op::ConvGradData { .. } | Op::ConvGradWeight { .. } => t(K::Layer, P::Sensitive, I::No),
            Op::MaxPoolGrad(_) | Op::AvgPoolGrad { .. } => t(K::Window, P::Sensitive, I::No),
            Op::LrnGrad(_) => t(K::Normalization, P::Sensitive, I::No),
            Op::GatherGrad { .. } => t(K::Movement, P::Sensitive, I::No),
            Op::Update(_) => t(K::Update, P::Fixed, I::No),
        }
    }
}

impl KernelOp {
    /// The facts about this kernel: a semantic op's own, or those of the
    /// form fusion made.
    pub fn traits(&self) -> Traits {
        use InPlace as I;
        use Kind as K;
        use Precision as P;
        match self {
            KernelOp::Op(op) => op.traits(),
            KernelOp::FusedConv { residual, .. } => {
                Traits { in_place: if *residual { I::Last } else { I::No }, ..t(K::Layer, P::Half, I::No) }
            }
            KernelOp::FusedGemm { .. } => t(K::Layer, P::Half, I::No),
            KernelOp::Elementwise { .. } => t(K::Elementwise, P::Half, I::Any),
            KernelOp::FusedReduction { .. } => t(K::Reduction, P::Sensitive, I::No),
            KernelOp::ConcatInPlace { .. } => t(K::Movement, P::Follows, I::No),
            KernelOp::SliceView { .. } => t(K::View, P::Follows, I::No),
            // Products in the inputs' precision, the softmax in f32 registers.
            KernelOp::Attention { .. } => t(K::Layer, P::Half, I::No),
            KernelOp::GemmEpilogue { .. } => t(K::Layer, P::Half, I::No),
        }
    }

    /// Whether its kernel converts a first operand of another float dtype
    /// as it loads it: a kernel capability, so a kernel-level fact (the
    /// precision pass inserts no cast before a widening load, and
    /// kernel-level type inference accepts the other dtype there). A
    /// semantic conv takes operands of one dtype.
    pub fn widens_first_operand(&self) -> bool {
        match self {
            KernelOp::Op(op) => matches!(op, Op::Conv(_) | Op::Gemm { .. }),
            KernelOp::FusedConv { .. } | KernelOp::FusedGemm { .. } => true,
            KernelOp::GemmEpilogue { product, .. } => matches!(product, crate::Product::Gemm { .. }),
            KernelOp::Elementwise { .. }
            | KernelOp::FusedReduction { .. }
            | KernelOp::ConcatInPlace { .. }
            | KernelOp::SliceView { .. }
            | KernelOp::Attention { .. } => false,
        }
    }
}
