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

/// How split execution may cut an op's output along one axis (the batch,
/// or the rows of a 4-D image) and still compute each part from the same
/// part of its data operands. The split pass checks shapes and window
/// geometry; which ops may be cut, and how, is this fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Each part reads the same part of its data operands.
    Same,
    /// As `Same`, unless the axis cut is this one, the op's own (a
    /// concatenation along it, a softmax over it).
    Unless(usize),
    /// Each band of rows reads a band of its input widened by a 2-D window
    /// (convolutions and pools: the halo).
    Window,
    /// As `Same` when its output keeps its operand's extent along the axis
    /// (a reshape: decided by the shapes).
    IfKept,
    /// Not cut along this axis: it mixes parts, or splitting it is not
    /// supported.
    No,
}

/// Which operands of an op are data (cut with its output when it is split)
/// and which are its weights (read whole by every part, and trained by
/// place when they are initializers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// Every operand is data.
    Data,
    /// The first operand is data; every other is a weight (a conv's or a
    /// GEMM's weight and bias).
    WeightsAfterFirst,
    /// The first and the last are data (a fused convolution's residual);
    /// those between them weights.
    WeightsBetween,
    /// The first is data; the next two a learned scale and bias; any after
    /// them running statistics (read whole, not trained by place).
    ScaleBias,
    /// The second is a weight (a GEMM's B); the others data.
    Second,
    /// A product's two factors: either may be a weight (a linear layer
    /// exported as MatMul) and either may be data.
    Factors,
}

impl Operands {
    /// Whether operand `port` of `arity` is data.
    pub fn is_data(self, port: usize, arity: usize) -> bool {
        match self {
            Operands::Data | Operands::Factors => true,
            Operands::WeightsAfterFirst | Operands::ScaleBias => port == 0,
            Operands::WeightsBetween => port == 0 || port + 1 == arity,
            Operands::Second => port != 1,
        }
    }

    /// Whether operand `port` of `arity` is a weight the op learns through
    /// (a trained parameter when it is an initializer).
    pub fn is_weight(self, port: usize, arity: usize) -> bool {
        match self {
            Operands::Data => false,
            Operands::WeightsAfterFirst => port >= 1,
            Operands::WeightsBetween => port >= 1 && port + 1 < arity,
            Operands::ScaleBias => port == 1 || port == 2,
            Operands::Second => port == 1,
            Operands::Factors => port < 2,
        }
    }
}

/// How split execution may cut an op, by samples and by rows, and its
/// operands' roles. See [`Op::cuts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cuts {
    /// Cut along the first axis (samples).
    pub batch: Cut,
    /// Cut along the second-to-last axis (rows of an image).
    pub rows: Cut,
    /// Which operands are data and which weights.
    pub operands: Operands,
}

const fn cut(batch: Cut, rows: Cut, operands: Operands) -> Cuts {
    Cuts { batch, rows, operands }
}

impl Op {
    /// How split execution may cut this op and which operands are its
    /// weights: one arm per variant, no wildcard.
    pub fn cuts(&self) -> Cuts {
        use Cut as C;
        use Operands as O;
        let pointwise = cut(C::Same, C::Same, O::Data);
        let whole = cut(C::No, C::No, O::Data);
        let unless = |axis: &Vec<usize>, op: Operands| cut(if axis.contains(&0) { C::No } else { C::Same }, C::No, op);
        match self {
            Op::Input | Op::Constant | Op::Parameter | Op::State => whole,
            Op::Conv(_) => cut(C::Same, C::Window, O::WeightsAfterFirst),
            Op::BatchNorm { .. } => cut(C::Same, C::Same, O::ScaleBias),
            Op::LayerNorm { axis, .. } => cut(C::Unless(*axis), C::No, O::ScaleBias),
            Op::Lrn(_) => pointwise,
            Op::Unary(_) | Op::Clip { .. } | Op::Binary(_) | Op::Sum => pointwise,
            Op::Compare(_) | Op::Logic(_) | Op::Not | Op::IsNaN | Op::Where => pointwise,
            Op::Identity | Op::Dropout => pointwise,
            // A precision boundary: not cut (yet).
            Op::Cast { .. } => whole,
            Op::MaxPool(_) => cut(C::Same, C::Window, O::Data),
            // A ceil-mode window past the padding is not counted; a band's
            // bottom pad would be.
            Op::AveragePool { pool, count_include_pad } => {
                cut(C::Same, if *count_include_pad && pool.ceil_mode { C::No } else { C::Window }, O::Data)
            }
            Op::GlobalAveragePool => cut(C::Same, C::No, O::Data),
            Op::Reduce { .. } => whole,
            Op::Gemm { trans_a, .. } => cut(if *trans_a { C::No } else { C::Same }, C::No, O::WeightsAfterFirst),
            Op::MatMul => cut(C::Same, C::No, O::Factors),
            Op::Concat { axis } => cut(C::Unless(*axis), C::Unless(*axis), O::Data),
            Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Flatten { axis } => cut(C::Unless(*axis), C::No, O::Data),
            Op::Reshape { .. } => cut(C::IfKept, C::IfKept, O::Data),
            // A channel shuffle keeps samples first and rows as rows.
            Op::Transpose { perm } => {
                let r = perm.len();
                let rows = r >= 2 && perm[r - 2] == r - 2 && perm[r - 1] == r - 1;
                cut(if perm.first() == Some(&0) { C::Same } else { C::No }, if rows { C::Same } else { C::No }, O::Data)
            }
            Op::Squeeze { axes } | Op::Unsqueeze { axes } => unless(axes, O::Data),
            Op::Slice { axes, .. } => unless(axes, O::Data),
            // An embedding table is trained by its name, not its place: a
            // Gather's table may be a constant the exporter computed.
            Op::Gather { .. } => whole,
            Op::Split { .. } | Op::Pad { .. } | Op::Expand { .. } | Op::Tile { .. } => whole,
            Op::ConvGradData { .. } | Op::ConvGradWeight { .. } | Op::MaxPoolGrad(_) | Op::AvgPoolGrad { .. } => whole,
            Op::LrnGrad(_) | Op::GatherGrad { .. } | Op::Update(_) => whole,
        }
    }
}

impl KernelOp {
    /// How split execution may cut this kernel: a semantic op's own, or
    /// that of the form fusion made.
    pub fn cuts(&self) -> Cuts {
        use crate::kernel_op::{Product, Reducer};
        use Cut as C;
        use Operands as O;
        match self {
            KernelOp::Op(op) => op.cuts(),
            KernelOp::FusedConv { residual, .. } => {
                cut(C::Same, C::Window, if *residual { O::WeightsBetween } else { O::WeightsAfterFirst })
            }
            KernelOp::FusedGemm { trans_a, .. } => cut(if *trans_a { C::No } else { C::Same }, C::No, O::WeightsAfterFirst),
            KernelOp::Elementwise { .. } => cut(C::Same, C::Same, O::Data),
            KernelOp::FusedReduction { reduction, .. } => match reduction {
                Reducer::GlobalAveragePool => cut(C::Same, C::No, O::Data),
                Reducer::Softmax { axis } | Reducer::LogSoftmax { axis } | Reducer::LayerNorm { axis, .. } => {
                    cut(C::Unless(*axis), C::No, O::Data)
                }
                Reducer::Reduce { .. } => cut(C::No, C::No, O::Data),
            },
            // Rows of a product (tokens of a flattened batch too: a
            // transformer's feed-forward block) and its epilogue.
            KernelOp::GemmEpilogue { product, .. } => match product {
                Product::Gemm { trans_a, .. } => cut(if *trans_a { C::No } else { C::Same }, C::No, O::Second),
                Product::MatMul => cut(C::Same, C::No, O::Factors),
            },
            KernelOp::ConcatInPlace { axis } => cut(C::Unless(*axis), C::Unless(*axis), O::Data),
            KernelOp::SliceView { axis, .. } => cut(C::Unless(*axis), C::No, O::Data),
            KernelOp::Attention { perms, .. } => {
                cut(if perms.iter().all(|p| p.first().is_none_or(|&d| d == 0)) { C::Same } else { C::No }, C::No, O::Data)
            }
        }
    }
}
