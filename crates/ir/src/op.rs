//! The closed set of operations. Every op documents its inputs; attributes
//! are normalised at import (explicit pads, non-negative axes, resolved
//! reshape targets), so passes never re-derive ONNX defaults.

use crate::dtype::DType;

/// Attributes of a convolution (2-D or 1-D/3-D spatial, NCHW layout).
/// Inputs: `x`, `w`, optionally `bias`.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// Stride per spatial dimension.
    pub strides: Vec<usize>,
    /// Padding: all begins, then all ends (ONNX order), per spatial dimension.
    pub pads: Vec<usize>,
    /// Dilation per spatial dimension.
    pub dilations: Vec<usize>,
    /// Number of groups (channels / group = depthwise when equal to C).
    pub group: usize,
}

/// Window attributes of MaxPool and AveragePool.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Window extent per spatial dimension.
    pub kernel: Vec<usize>,
    /// Stride per spatial dimension.
    pub strides: Vec<usize>,
    /// Padding: all begins, then all ends, per spatial dimension.
    pub pads: Vec<usize>,
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
}

/// Attributes of local response normalization (and its gradient).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lrn {
    /// Number of channels summed over.
    pub size: usize,
    /// Scale.
    pub alpha: f32,
    /// Exponent.
    pub beta: f32,
    /// Offset.
    pub bias: f32,
}

/// How Pad fills the border.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A constant value.
    Constant(f32),
    /// Mirror without repeating the edge (`[1,2,3]` padded by 2 on the left: `3,2,1,2,3`).
    Reflect,
    /// Repeat the edge value.
    Edge,
}

/// Elementwise functions of one input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// max(x, 0).
    Relu,
    /// 1 / (1 + e^-x).
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Error function.
    Erf,
    /// Square root.
    Sqrt,
    /// e^x.
    Exp,
    /// Natural logarithm.
    Log,
    /// -x.
    Neg,
    /// |x|.
    Abs,
    /// 1 / x.
    Reciprocal,
    /// Sign of x (-1, 0, 1).
    Sign,
    /// ln(1 + e^x).
    Softplus,
    /// x if x >= 0 else alpha * x.
    LeakyRelu(f32),
    /// x if x >= 0 else alpha * (e^x - 1).
    Elu(f32),
    /// gamma * (x if x > 0 else alpha * (e^x - 1)); fields are (alpha, gamma).
    Selu(f32, f32),
    /// x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)): GELU (ONNX `Gelu`).
    Gelu,
    /// x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))): GELU's tanh
    /// approximation (ONNX `Gelu` with `approximate="tanh"`, GPT-2's).
    GeluTanh,
    /// The largest integer not above x.
    Floor,
    /// The smallest integer not below x.
    Ceil,
    /// The nearest integer, halves to even (ONNX `Round`).
    Round,
    /// sin x.
    Sin,
    /// cos x.
    Cos,
}

impl UnaryOp {
    /// Every unary function, parameters at their ONNX defaults. The text
    /// format, fused expressions and ONNX import find ops here by name.
    pub const ALL: [UnaryOp; 22] = [
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Reciprocal,
        UnaryOp::Sign,
        UnaryOp::Softplus,
        UnaryOp::LeakyRelu(0.01),
        UnaryOp::Elu(1.0),
        UnaryOp::Selu(1.673_263_2, 1.050_701),
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sin,
        UnaryOp::Cos,
    ];

    /// The name in the text format and in fused expressions, and the ONNX
    /// op type it imports from (`None`: reached another way, such as an
    /// attribute of another ONNX op).
    pub fn names(self) -> (&'static str, Option<&'static str>) {
        match self {
            UnaryOp::Relu => ("relu", Some("Relu")),
            UnaryOp::Sigmoid => ("sigmoid", Some("Sigmoid")),
            UnaryOp::Tanh => ("tanh", Some("Tanh")),
            UnaryOp::Erf => ("erf", Some("Erf")),
            UnaryOp::Sqrt => ("sqrt", Some("Sqrt")),
            UnaryOp::Exp => ("exp", Some("Exp")),
            UnaryOp::Log => ("log", Some("Log")),
            UnaryOp::Neg => ("neg", Some("Neg")),
            UnaryOp::Abs => ("abs", Some("Abs")),
            UnaryOp::Reciprocal => ("reciprocal", Some("Reciprocal")),
            UnaryOp::Sign => ("sign", Some("Sign")),
            UnaryOp::Softplus => ("softplus", Some("Softplus")),
            UnaryOp::LeakyRelu(_) => ("leaky_relu", Some("LeakyRelu")),
            UnaryOp::Elu(_) => ("elu", Some("Elu")),
            UnaryOp::Selu(..) => ("selu", Some("Selu")),
            // ONNX Gelu chooses between the two with its `approximate` attribute.
            UnaryOp::Gelu => ("gelu", Some("Gelu")),
            UnaryOp::GeluTanh => ("gelu_tanh", None),
            UnaryOp::Floor => ("floor", Some("Floor")),
            UnaryOp::Ceil => ("ceil", Some("Ceil")),
            UnaryOp::Round => ("round", Some("Round")),
            UnaryOp::Sin => ("sin", Some("Sin")),
            UnaryOp::Cos => ("cos", Some("Cos")),
        }
    }

    /// Its name in the text format.
    pub fn name(self) -> &'static str {
        self.names().0
    }

    /// Its parameters, named as ONNX names the attributes.
    pub fn params(self) -> Vec<(&'static str, f32)> {
        match self {
            UnaryOp::LeakyRelu(a) | UnaryOp::Elu(a) => vec![("alpha", a)],
            UnaryOp::Selu(a, g) => vec![("alpha", a), ("gamma", g)],
            UnaryOp::Relu
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh
            | UnaryOp::Erf
            | UnaryOp::Sqrt
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Reciprocal
            | UnaryOp::Sign
            | UnaryOp::Softplus
            | UnaryOp::Gelu
            | UnaryOp::GeluTanh
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Sin
            | UnaryOp::Cos => vec![],
        }
    }

    /// The same function with parameters `p`, in the order of [`UnaryOp::params`].
    pub fn with_params(self, p: &[f32]) -> UnaryOp {
        match (self, p) {
            (UnaryOp::LeakyRelu(_), &[a, ..]) => UnaryOp::LeakyRelu(a),
            (UnaryOp::Elu(_), &[a, ..]) => UnaryOp::Elu(a),
            (UnaryOp::Selu(..), &[a, g, ..]) => UnaryOp::Selu(a, g),
            (u, _) => u,
        }
    }
}

/// The lookups by name of the function enums ([`UnaryOp`], [`CompareOp`],
/// [`LogicOp`]): each says its names once (`names`), and these find it.
pub trait Named: Copy + 'static {
    /// Every variant.
    const VARIANTS: &'static [Self];
    /// Its name in the text format.
    fn text_name(self) -> &'static str;
    /// The ONNX op type that imports as it (default parameters), if any.
    fn onnx_name(self) -> Option<&'static str>;

    /// The variant named `name` in the text format.
    fn by_name(name: &str) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|v| v.text_name() == name)
    }

    /// The variant ONNX op type `op_type` imports as.
    fn by_onnx_name(op_type: &str) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|v| v.onnx_name() == Some(op_type))
    }
}

impl Named for UnaryOp {
    const VARIANTS: &'static [UnaryOp] = &UnaryOp::ALL;
    fn text_name(self) -> &'static str {
        self.names().0
    }
    fn onnx_name(self) -> Option<&'static str> {
        self.names().1
    }
}

impl Named for CompareOp {
    const VARIANTS: &'static [CompareOp] = &CompareOp::ALL;
    fn text_name(self) -> &'static str {
        self.names().0
    }
    fn onnx_name(self) -> Option<&'static str> {
        Some(self.names().1)
    }
}

impl Named for LogicOp {
    const VARIANTS: &'static [LogicOp] = &LogicOp::ALL;
    fn text_name(self) -> &'static str {
        self.names().0
    }
    fn onnx_name(self) -> Option<&'static str> {
        Some(self.names().1)
    }
}

/// Elementwise functions of two inputs, with numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b.
    Add,
    /// a - b.
    Sub,
    /// a * b.
    Mul,
    /// a / b.
    Div,
    /// a ^ b.
    Pow,
    /// max(a, b).
    Max,
    /// min(a, b).
    Min,
    /// a if a >= 0 else b * a (parametric ReLU, b the slope).
    PRelu,
}

/// Comparisons of two broadcast operands of one dtype; the output is bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// a == b.
    Equal,
    /// a < b.
    Less,
    /// a <= b.
    LessOrEqual,
    /// a > b.
    Greater,
    /// a >= b.
    GreaterOrEqual,
}

impl CompareOp {
    /// Every comparison.
    pub const ALL: [CompareOp; 5] =
        [CompareOp::Equal, CompareOp::Less, CompareOp::LessOrEqual, CompareOp::Greater, CompareOp::GreaterOrEqual];

    /// (text name, ONNX op type).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            CompareOp::Equal => ("equal", "Equal"),
            CompareOp::Less => ("less", "Less"),
            CompareOp::LessOrEqual => ("less_equal", "LessOrEqual"),
            CompareOp::Greater => ("greater", "Greater"),
            CompareOp::GreaterOrEqual => ("greater_equal", "GreaterOrEqual"),
        }
    }

    /// The comparison of `a` and `b` (integers compare exactly, floats as IEEE does: NaN is unequal to all).
    pub fn apply<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CompareOp::Equal => a == b,
            CompareOp::Less => a < b,
            CompareOp::LessOrEqual => a <= b,
            CompareOp::Greater => a > b,
            CompareOp::GreaterOrEqual => a >= b,
        }
    }
}

/// Boolean functions of two broadcast bool operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogicOp {
    /// a and b.
    And,
    /// a or b.
    Or,
    /// a xor b.
    Xor,
}

impl LogicOp {
    /// Every boolean function.
    pub const ALL: [LogicOp; 3] = [LogicOp::And, LogicOp::Or, LogicOp::Xor];

    /// (text name, ONNX op type).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            LogicOp::And => ("and", "And"),
            LogicOp::Or => ("or", "Or"),
            LogicOp::Xor => ("xor", "Xor"),
        }
    }

    /// The function of `a` and `b`.
    pub fn apply(self, a: bool, b: bool) -> bool {
        match self {
            LogicOp::And => a && b,
            LogicOp::Or => a || b,
            LogicOp::Xor => a != b,
        }
    }
}

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Arithmetic mean.
    Mean,
    /// Sum.
    Sum,
    /// Maximum.
    Max,
}

/// A semantic tensor operation: what a user's model means, as frameworks
/// define it (differentiable where the maths is). Inputs are listed per
/// variant; every op has exactly one output except [`Op::Split`], which has
/// one per part. What fusion makes of these ops for the GPU is a
/// [`crate::KernelOp`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A graph input; the node's name is the input's name. No inputs.
    Input,
    /// A constant (weight); its data is in [`crate::Graph::weight`] under the
    /// node's name. No inputs.
    Constant,
    /// A trainable parameter: persistent data (in [`crate::Graph::weight`]
    /// under the node's name, its initial value) that a training step
    /// updates. Never folded into other constants. No inputs.
    Parameter,
    /// Persistent state that is not trained but changes between steps
    /// (batch norm running statistics, optimizer moments, accumulators):
    /// data under the node's name, never folded. No inputs.
    State,
    /// Convolution. Inputs: x `[N,C,*]`, w `[M,C/group,*k]`, optional bias `[M]`.
    Conv(Conv),
    /// Batch normalization at inference. Inputs: x, scale, bias, mean, var.
    BatchNorm {
        /// Added to the variance.
        epsilon: f32,
    },
    /// Elementwise function of one input.
    Unary(UnaryOp),
    /// Clamp to `[min, max]`. Input: x.
    Clip {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// Elementwise function of two broadcast inputs.
    Binary(BinaryOp),
    /// Sum of any number of broadcast inputs.
    Sum,
    /// Comparison of two broadcast inputs of one dtype; a bool output.
    Compare(CompareOp),
    /// Boolean function of two broadcast bool inputs.
    Logic(LogicOp),
    /// Boolean negation. Input: a bool tensor.
    Not,
    /// Whether each element is NaN. Input: a float tensor; a bool output.
    IsNaN,
    /// `x` where `cond` holds, else `y` (all three broadcast). Inputs: cond
    /// (bool), x, y (one dtype).
    Where,
    /// Max pooling. Input: x `[N,C,*]`.
    MaxPool(Pool),
    /// Average pooling. Input: x `[N,C,*]`.
    AveragePool {
        /// The window.
        pool: Pool,
        /// Count padding elements in the divisor.
        count_include_pad: bool,
    },
    /// Mean over all spatial positions, keeping them as size 1. Input: x.
    GlobalAveragePool,
    /// Reduction over `axes`. Input: x.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes, sorted, non-negative.
        axes: Vec<usize>,
        /// Keep reduced axes with extent 1.
        keepdims: bool,
    },
    /// `alpha * op(a) @ op(b) + beta * c`. Inputs: a `[M,K]`, b `[K,N]`, optional c.
    Gemm {
        /// Transpose a.
        trans_a: bool,
        /// Transpose b.
        trans_b: bool,
        /// Product scale.
        alpha: f32,
        /// Bias scale.
        beta: f32,
    },
    /// Batched matrix product with numpy semantics. Inputs: a, b.
    MatMul,
    /// Concatenation of any number of inputs along `axis`.
    Concat {
        /// Concatenation axis.
        axis: usize,
    },
    /// Split along `axis` into parts of `sizes`; one output per part.
    Split {
        /// Split axis.
        axis: usize,
        /// Extent of each part along `axis`.
        sizes: Vec<usize>,
    },
    /// Strided slice. For each listed axis: elements start, start+step, ...
    /// while before end (after end for negative steps; end may be -1 then).
    Slice {
        /// Sliced axes.
        axes: Vec<usize>,
        /// First index per axis, in range.
        starts: Vec<i64>,
        /// Exclusive end per axis, clamped.
        ends: Vec<i64>,
        /// Step per axis, non-zero.
        steps: Vec<i64>,
    },
    /// Same elements, new shape (fully resolved, no 0 or -1).
    Reshape {
        /// The output shape.
        shape: Vec<usize>,
    },
    /// Reshape to 2-D: dims before `axis` times dims from `axis`.
    Flatten {
        /// First dimension of the second output dimension.
        axis: usize,
    },
    /// Permutation of dimensions: output dim i is input dim `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Remove size-1 dims at `axes` (sorted).
    Squeeze {
        /// Removed axes of the input.
        axes: Vec<usize>,
    },
    /// Insert size-1 dims at `axes` (sorted, positions in the output).
    Unsqueeze {
        /// Inserted axes of the output.
        axes: Vec<usize>,
    },
    /// Softmax along one axis.
    Softmax {
        /// Normalised axis.
        axis: usize,
    },
    /// Log of softmax along one axis.
    LogSoftmax {
        /// Normalised axis.
        axis: usize,
    },
    /// Layer normalization over dims `axis..`. Inputs: x, scale, optional bias.
    LayerNorm {
        /// First normalised dimension.
        axis: usize,
        /// Added to the variance.
        epsilon: f32,
    },
    /// Local response normalization across channels. Input: x `[N,C,*]`.
    Lrn(Lrn),
    /// Identity at inference (dropout is only active in training).
    Dropout,
    /// Identity.
    Identity,
    /// Padding: `pads` holds all begins then all ends, one per dimension.
    Pad {
        /// Elements added before and after each dimension.
        pads: Vec<usize>,
        /// How the border is filled.
        mode: PadMode,
    },
    /// Broadcast to `shape` (numpy rules; the output shape, resolved).
    Expand {
        /// The output shape.
        shape: Vec<usize>,
    },
    /// Select slices along `axis` by integer indices (embedding lookup).
    /// Inputs: data, indices (i64 or i32; negative counts from the end).
    Gather {
        /// The indexed axis of data.
        axis: usize,
    },
    /// Repeat the input `repeats[d]` times along each dimension d.
    Tile {
        /// Repeats per dimension.
        repeats: Vec<usize>,
    },
    /// Element type conversion.
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// Gradient of a convolution with respect to its input (a transposed
    /// convolution). Inputs: dy `[N,M,*]`, w `[M,C/group,*k]`. Output:
    /// `shape`, the input's.
    ConvGradData {
        /// The forward convolution.
        conv: Conv,
        /// The forward input's shape.
        shape: Vec<usize>,
    },
    /// Gradient of a convolution with respect to its weight. Inputs: x, dy.
    /// Output: `shape`, the weight's.
    ConvGradWeight {
        /// The forward convolution.
        conv: Conv,
        /// The weight's shape.
        shape: Vec<usize>,
    },
    /// Gradient of max pooling: each window's gradient goes to the window's
    /// first maximum (as PyTorch routes it). Inputs: x, dy. Output: x's type.
    MaxPoolGrad(Pool),
    /// Gradient of average pooling. Input: dy. Output: `shape`, the input's.
    AvgPoolGrad {
        /// The window.
        pool: Pool,
        /// Padding counted in the divisor.
        count_include_pad: bool,
        /// The forward input's shape.
        shape: Vec<usize>,
    },
    /// Gradient of a gather (a scatter-add): `dy`'s slices added into a
    /// zero tensor of `shape` at the indices. Inputs: indices, dy. Output:
    /// `shape`, the gathered data's.
    GatherGrad {
        /// The indexed axis.
        axis: usize,
        /// The data's shape.
        shape: Vec<usize>,
    },
    /// Gradient of local response normalization. Inputs: x, dy.
    LrnGrad(Lrn),
    /// An optimizer's update of one parameter and its state, in place: the
    /// outputs replace the persistent operands they name (see
    /// [`Op::updated_operand`]) when the step ends. Inputs: param, grad,
    /// step (the state counting completed steps, f32 `[]`), then the
    /// optimizer's state; [`Optimizer::Count`] takes the step alone.
    Update(Optimizer),
}

/// A learning-rate schedule: the factor applied to the base learning rate
/// at each optimizer step. `total == 0`: constant. Otherwise a linear
/// warmup over `warmup` steps, then a cosine decay to 0 at step `total`, as
/// Hugging Face's `get_cosine_schedule_with_warmup` (the first step's
/// factor is 0 when there is a warmup).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Schedule {
    /// Steps of linear warmup.
    pub warmup: usize,
    /// The step where the cosine reaches 0 (0: no schedule).
    pub total: usize,
}

impl Schedule {
    /// The factor at optimizer step `step` (0 for the first).
    pub fn factor(&self, step: u64) -> f64 {
        if self.total == 0 {
            return 1.0;
        }
        let (t, w) = (step as f64, self.warmup as f64);
        if t < w {
            return t / w.max(1.0);
        }
        let progress = (t - w) / (self.total as f64 - w).max(1.0);
        (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
    }
}

/// The rule of an [`Op::Update`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// SGD as PyTorch defines it: `g += wd p`; with momentum,
    /// `buf = momentum buf + (1 - dampening) g` (`buf = g` on the first
    /// step), `g = nesterov ? g + momentum buf : buf`; `p -= lr g`. State:
    /// the momentum buffer, when momentum is not 0.
    Sgd {
        /// Learning rate.
        lr: f32,
        /// Momentum factor (0: none, and no state).
        momentum: f32,
        /// Dampening of the momentum.
        dampening: f32,
        /// Nesterov momentum.
        nesterov: bool,
        /// L2 penalty added to the gradient.
        weight_decay: f32,
        /// Micro-steps per update (1: none); see [`Optimizer::accumulate`].
        accumulate: usize,
        /// The learning rate's schedule.
        schedule: Schedule,
    },
    /// Adam, or AdamW when `decoupled`. State: the first and second moments.
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// Added to the denominator.
        eps: f32,
        /// Weight decay: an L2 penalty (Adam) or decoupled (AdamW).
        weight_decay: f32,
        /// AdamW: `p -= lr wd p` instead of adding `wd p` to the gradient.
        decoupled: bool,
        /// Micro-steps per update (1: none); see [`Optimizer::accumulate`].
        accumulate: usize,
        /// The learning rate's schedule.
        schedule: Schedule,
    },
    /// A running statistic (batch norm in training mode): `p = (1 -
    /// momentum) p + momentum g`, `g` the batch's statistic (PyTorch's
    /// convention for `momentum`). No state.
    Ema {
        /// Weight of the new value.
        momentum: f32,
    },
    /// The step counter: `t + 1`, after every other update has read `t`.
    Count,
}

impl Optimizer {
    /// Refuses what PyTorch's optimizers refuse (a negative learning rate,
    /// momentum, epsilon or weight decay; betas outside [0, 1)), and any
    /// value that is not finite.
    pub fn check(&self) -> Result<(), String> {
        let at_least_0 = |what: &str, v: f32| {
            if v >= 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(format!("invalid {what}: {v} (it must be a finite number, 0 or more, as PyTorch's optimizers require)"))
            }
        };
        let beta = |what: &str, v: f32| {
            if (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("invalid {what}: {v} (it must be in [0, 1), as PyTorch's Adam requires)"))
            }
        };
        match *self {
            Optimizer::Sgd { lr, momentum, dampening, weight_decay, .. } => {
                at_least_0("learning rate", lr)?;
                at_least_0("momentum", momentum)?;
                at_least_0("dampening", dampening)?;
                at_least_0("weight decay", weight_decay)
            }
            Optimizer::Adam { lr, beta1, beta2, eps, weight_decay, .. } => {
                at_least_0("learning rate", lr)?;
                beta("beta1", beta1)?;
                beta("beta2", beta2)?;
                at_least_0("epsilon", eps)?;
                at_least_0("weight decay", weight_decay)
            }
            Optimizer::Ema { momentum } if (0.0..=1.0).contains(&momentum) => Ok(()),
            Optimizer::Ema { momentum } => Err(format!("invalid running-statistics momentum: {momentum} (it must be in [0, 1])")),
            Optimizer::Count => Ok(()),
        }
    }

    /// How many state tensors of the parameter's shape it keeps: the
    /// gradient accumulator first (when accumulating), then the rule's own.
    pub fn states(&self) -> usize {
        let acc = usize::from(self.accumulate() > 1);
        match self {
            Optimizer::Sgd { momentum, .. } => acc + usize::from(*momentum != 0.0),
            Optimizer::Adam { .. } => acc + 2,
            Optimizer::Ema { .. } | Optimizer::Count => 0,
        }
    }

    /// Gradient accumulation: with K > 1, each step is a micro-step that
    /// adds its gradient into the accumulator (the first state); every K-th
    /// (the step counter says which) applies the rule to the accumulated
    /// mean `(acc + g) / K` and zeroes the accumulator.
    pub fn accumulate(&self) -> usize {
        match self {
            Optimizer::Sgd { accumulate, .. } | Optimizer::Adam { accumulate, .. } => *accumulate,
            Optimizer::Ema { .. } | Optimizer::Count => 1,
        }
    }

    /// The learning rate at optimizer step `step` (0 for the first): the
    /// base rate times the schedule's factor, rounded to f32.
    pub fn lr_at(&self, step: u64) -> f32 {
        match self {
            Optimizer::Sgd { lr, schedule, .. } | Optimizer::Adam { lr, schedule, .. } => (*lr as f64 * schedule.factor(step)) as f32,
            Optimizer::Ema { .. } | Optimizer::Count => 0.0,
        }
    }

    /// Its name in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd_update",
            Optimizer::Adam { .. } => "adam_update",
            Optimizer::Ema { .. } => "ema_update",
            Optimizer::Count => "count_update",
        }
    }
}

/// The larger of `a` and `b`, NaN if either is (as IEEE 754's `maximum`,
/// ONNX's Max, numpy's `maximum` and PyTorch's `relu`, `clamp` and max
/// pooling: not `f32::max`, which drops a NaN).
#[inline]
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// The smaller of `a` and `b`, NaN if either is (see [`max_nan`]).
#[inline]
pub fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Applies a unary function to one value (the reference semantics every
/// executor and kernel follows).
#[inline]
pub fn apply_unary(u: UnaryOp, x: f32) -> f32 {
    match u {
        UnaryOp::Relu => max_nan(x, 0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Erf => erf(x),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Reciprocal => x.recip(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Softplus => {
            if x > 20.0 {
                x
            } else {
                x.exp().ln_1p()
            }
        }
        UnaryOp::LeakyRelu(a) => {
            if x >= 0.0 {
                x
            } else {
                a * x
            }
        }
        UnaryOp::Elu(a) => {
            if x >= 0.0 {
                x
            } else {
                a * x.exp_m1()
            }
        }
        UnaryOp::Selu(a, g) => g * if x > 0.0 { x } else { a * x.exp_m1() },
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        UnaryOp::GeluTanh => {
            // In f64: the cube overflows f32 long before tanh saturates.
            let x = x as f64;
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            (0.5 * x * (1.0 + inner.tanh())) as f32
        }
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
    }
}

/// Applies a binary function to one pair of values.
#[inline]
pub fn apply_binary(b: BinaryOp, x: f32, y: f32) -> f32 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Max => max_nan(x, y),
        BinaryOp::Min => min_nan(x, y),
        BinaryOp::PRelu => {
            if x >= 0.0 {
                x
            } else {
                y * x
            }
        }
    }
}

/// erf in f64 (Abramowitz-Stegun 7.1.26 is too coarse for a reference): a
/// series for small |x|, a continued fraction for the tail.
pub fn erf(x: f32) -> f32 {
    let x = x as f64;
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, x2) = (ax, ax, ax * ax);
        for n in 1..60 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction, converges fast for x >= 2.5.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f)
    };
    r.copysign(x) as f32
}

impl Op {
    /// The op's name in the text format and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Constant => "const",
            Op::Parameter => "param",
            Op::State => "state",
            Op::Conv(_) => "conv",
            Op::BatchNorm { .. } => "batch_norm",
            Op::Unary(u) => u.name(),
            Op::Clip { .. } => "clip",
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Pow => "pow",
                BinaryOp::Max => "max",
                BinaryOp::Min => "min",
                BinaryOp::PRelu => "prelu",
            },
            Op::Sum => "sum",
            Op::Compare(c) => c.names().0,
            Op::Logic(l) => l.names().0,
            Op::Not => "not",
            Op::IsNaN => "is_nan",
            Op::Where => "where",
            Op::MaxPool(_) => "max_pool",
            Op::AveragePool { .. } => "avg_pool",
            Op::GlobalAveragePool => "global_avg_pool",
            Op::Reduce { op, .. } => match op {
                ReduceOp::Mean => "reduce_mean",
                ReduceOp::Sum => "reduce_sum",
                ReduceOp::Max => "reduce_max",
            },
            Op::Gemm { .. } => "gemm",
            Op::MatMul => "matmul",
            Op::Concat { .. } => "concat",
            Op::Split { .. } => "split",
            Op::Slice { .. } => "slice",
            Op::Reshape { .. } => "reshape",
            Op::Flatten { .. } => "flatten",
            Op::Transpose { .. } => "transpose",
            Op::Squeeze { .. } => "squeeze",
            Op::Unsqueeze { .. } => "unsqueeze",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Lrn(_) => "lrn",
            Op::Dropout => "dropout",
            Op::Identity => "identity",
            Op::Cast { .. } => "cast",
            Op::Pad { .. } => "pad",
            Op::Expand { .. } => "expand",
            Op::Tile { .. } => "tile",
            Op::Gather { .. } => "gather",
            Op::ConvGradData { .. } => "conv_grad_data",
            Op::ConvGradWeight { .. } => "conv_grad_weight",
            Op::MaxPoolGrad(_) => "max_pool_grad",
            Op::AvgPoolGrad { .. } => "avg_pool_grad",
            Op::LrnGrad(_) => "lrn_grad",
            Op::GatherGrad { .. } => "gather_grad",
            Op::Update(o) => o.name(),
        }
    }

    /// For an [`Op::Update`], the operand that output `slot` replaces: the
    /// parameter for slot 0, the state after the step and gradient for the
    /// others (the counter replaces itself). `None` for every other op.
    pub fn updated_operand(&self, slot: usize) -> Option<usize> {
        match self {
            Op::Update(Optimizer::Count) => Some(slot),
            Op::Update(_) if slot == 0 => Some(0),
            Op::Update(_) => Some(slot + 2),
            _ => None,
        }
    }
}
