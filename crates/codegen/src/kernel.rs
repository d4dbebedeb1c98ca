//! One kernel of any kind: the description every node of a fused graph
//! lowers to, with its launch geometry, and the CPU run of it.

use crate::attention::Attention;
use crate::conv::Conv;
use crate::elementwise::Elementwise;
use crate::gemm::Gemm;
use crate::grad::Grad;
use crate::launch::linear;
pub use crate::launch::{Launch, BLOCK};
use crate::layout::Layout;
use crate::pool::Pool;
use crate::reduce::Reduction;
use crate::select::Select;
use crate::update::Update;
use crate::CodegenError;
use smelt_ir::{BinaryOp, KernelGraph, KernelOp, NodeId, Op, OpSet, Tensor};

/// A kernel description.
#[derive(Clone, Debug, PartialEq)]
pub enum Kernel {
    /// Fused elementwise (or a single unary/binary op).
    Elementwise(Elementwise),
    /// Max or average pooling.
    Pool(Pool),
    /// Global average pool or softmax, with a prologue.
    Reduction(Reduction),
    /// Transpose, concat copy, LRN.
    Layout(Layout),
    /// (Fused) GEMM.
    Gemm(Gemm),
    /// (Fused) convolution.
    Conv(Conv),
    /// Masks, lookups and movement on any dtype.
    Select(Select),
    /// Fused attention.
    Attention(Attention),
    /// A backward op: convolution, pooling or LRN gradient.
    Grad(Grad),
    /// An optimizer update, in place in the weights blob (no output).
    Update(Update),
}

/// What a node lowers to.
#[derive(Clone, Debug, PartialEq)]
pub enum Lowered {
    /// A kernel.
    Kernel(Box<Kernel>),
    /// Nothing to run: inputs, constants, views (reshape and friends share
    /// their input's bytes) and in-place concatenations (their inputs were
    /// written into place).
    Nothing,
}

/// The describer that lowers a kernel op: each kind of [`Kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// [`Conv`].
    Conv,
    /// [`Attention`].
    Attention,
    /// [`Gemm`].
    Gemm,
    /// [`Pool`].
    Pool,
    /// [`Reduction`].
    Reduction,
    /// [`Layout`].
    Layout,
    /// [`Select`].
    Select,
    /// [`Grad`].
    Grad,
    /// [`Update`].
    Update,
    /// [`Elementwise`].
    Elementwise,
}

/// How a node reaches the GPU: decided by one `match` on every kernel op and
/// every semantic op, with no wildcard arm, so that a new op does not compile
/// until the kernel level says how it runs (or why it does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Nothing runs: sources and views share their bytes.
    Nothing,
    /// Nothing runs when the memory planner aliases it (its producers wrote
    /// into place); a copy kernel of this family otherwise.
    Alias(Family),
    /// A kernel of this family (which may still refuse an instance, such as
    /// a 3-D convolution, with an error naming the node).
    Kernel(Family),
    /// No CUDA kernel, and why: it runs on the CPU reference executor only.
    Refused(&'static str),
}

impl Route {
    /// How node `id` of `g` reaches the GPU.
    pub fn of(g: &KernelGraph, id: NodeId) -> Route {
        use Family as F;
        use Route::Kernel as K;
        let node = g.node(id);
        let float_out = node.outputs.first().is_some_and(|t| t.dtype.is_float());
        match &node.op {
            KernelOp::Op(op) => match op {
                Op::Input | Op::Constant | Op::Parameter | Op::State => Route::Nothing,
                Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Dropout | Op::Identity => {
                    Route::Nothing
                }
                Op::Conv(_) => K(F::Conv),
                Op::Gemm { .. } | Op::MatMul => K(F::Gemm),
                Op::BatchNorm { .. } | Op::Unary(_) | Op::Clip { .. } | Op::Sum => K(F::Elementwise),
                // Integer arithmetic selects and moves elements on any dtype.
                Op::Binary(b) => K(if float_out || *b == BinaryOp::PRelu { F::Elementwise } else { F::Select }),
                // Float to float casts are elementwise expressions; the rest
                // convert element by element on any dtype.
                Op::Cast { .. } => {
                    let float_in = g.inputs_of(id).first().is_some_and(|v| g.ty(*v).dtype.is_float());
                    K(if float_out && float_in { F::Elementwise } else { F::Select })
                }
                Op::Compare(_) | Op::Logic(_) | Op::Not | Op::IsNaN | Op::Where => K(F::Select),
                Op::Slice { .. } | Op::Pad { .. } | Op::Expand { .. } | Op::Tile { .. } | Op::Gather { .. } => K(F::Select),
                Op::MaxPool(_) | Op::AveragePool { .. } => K(F::Pool),
                Op::GlobalAveragePool | Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::LayerNorm { .. } | Op::Reduce { .. } => {
                    K(F::Reduction)
                }
                Op::Concat { .. } | Op::Transpose { .. } | Op::Lrn(_) => K(F::Layout),
                Op::ConvGradData { .. }
                | Op::ConvGradWeight { .. }
                | Op::MaxPoolGrad(_)
                | Op::AvgPoolGrad { .. }
                | Op::GatherGrad { .. }
                | Op::LrnGrad(_) => K(F::Grad),
                Op::Update(_) => K(F::Update),
                Op::Split { .. } => Route::Refused(
                    "no CUDA kernel yet (one kernel per output is still to come): it runs on the CPU reference executor only",
                ),
            },
            KernelOp::FusedConv { .. } => K(F::Conv),
            KernelOp::FusedGemm { .. } | KernelOp::GemmEpilogue { .. } => K(F::Gemm),
            KernelOp::Elementwise { .. } => K(F::Elementwise),
            KernelOp::FusedReduction { .. } => K(F::Reduction),
            KernelOp::ConcatInPlace { .. } => Route::Alias(F::Layout),
            KernelOp::SliceView { .. } => Route::Nothing,
            KernelOp::Attention { .. } => K(F::Attention),
        }
    }
}

impl Kernel {
    /// What node `id` of `g` lowers to; `copied_concat` says whether an
    /// in-place concatenation was planned as a copy after all. An op with no
    /// kernel is an error naming the node.
    pub fn lower(g: &KernelGraph, id: NodeId, copied_concat: bool) -> Result<Lowered, CodegenError> {
        let node = g.node(id);
        let why = match Route::of(g, id) {
            Route::Nothing => return Ok(Lowered::Nothing),
            Route::Alias(_) if !copied_concat => return Ok(Lowered::Nothing),
            Route::Kernel(family) | Route::Alias(family) => match Kernel::describe(family, g, id) {
                Some(k) => return Ok(Lowered::Kernel(Box::new(k))),
                None => format!(
                    "no CUDA kernel for this op with inputs {}",
                    g.inputs_of(id).iter().map(|v| g.ty(*v).to_string()).collect::<Vec<_>>().join(", ")
                ),
            },
            Route::Refused(why) => why.into(),
        };
        Err(CodegenError::NoKernel { node: node.name.clone(), op: node.op.name().to_string(), detail: why, origin: g.origin(id).to_vec() })
    }

    /// The kernel of node `id`, if there is one, as lowered: a tensor-core
    /// kernel with the square tile ([`crate::tiling::kernel_of`] gives the
    /// tile a target chooses, as a program has it).
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Kernel> {
        match Route::of(g, id) {
            Route::Kernel(family) | Route::Alias(family) => Kernel::describe(family, g, id),
            Route::Nothing | Route::Refused(_) => None,
        }
    }

    /// The description of node `id` by `family`'s describer, if it covers
    /// this instance (shapes and dtypes).
    fn describe(family: Family, g: &KernelGraph, id: NodeId) -> Option<Kernel> {
        match family {
            Family::Conv => Conv::of(g, id).map(Kernel::Conv),
            Family::Attention => Attention::of(g, id).map(Kernel::Attention),
            Family::Gemm => Gemm::of(g, id).map(Kernel::Gemm),
            Family::Pool => Pool::of(g, id).map(Kernel::Pool),
            Family::Reduction => Reduction::of(g, id).map(Kernel::Reduction),
            Family::Layout => Layout::of(g, id).map(Kernel::Layout),
            Family::Select => Select::of(g, id).map(Kernel::Select),
            Family::Grad => Grad::of(g, id).map(Kernel::Grad),
            Family::Update => Update::of(g, id).map(Kernel::Update),
            Family::Elementwise => Elementwise::of(g, id).map(Kernel::Elementwise),
        }
    }

    /// Its name (the CUDA function's).
    pub fn name(&self) -> &str {
        match self {
            Kernel::Elementwise(k) => &k.name,
            Kernel::Pool(k) => &k.name,
            Kernel::Reduction(k) => &k.name,
            Kernel::Layout(k) => &k.name,
            Kernel::Gemm(k) => &k.name,
            Kernel::Conv(k) => &k.name,
            Kernel::Select(k) => &k.name,
            Kernel::Attention(k) => &k.name,
            Kernel::Grad(k) => &k.name,
            Kernel::Update(k) => &k.name,
        }
    }

    /// Renames it (to keep names unique in a program).
    pub fn rename(&mut self, name: String) {
        match self {
            Kernel::Elementwise(k) => k.name = name,
            Kernel::Pool(k) => k.name = name,
            Kernel::Reduction(k) => k.name = name,
            Kernel::Layout(k) => k.name = name,
            Kernel::Gemm(k) => k.name = name,
            Kernel::Conv(k) => k.name = name,
            Kernel::Select(k) => k.name = name,
            Kernel::Attention(k) => k.name = name,
            Kernel::Grad(k) => k.name = name,
            Kernel::Update(k) => k.name = name,
        }
    }

    /// The kind, for reports: `elementwise`, `pool`, `reduction`, `layout`, `gemm`, `conv`, `select`, `attention`, `grad`, `update`.
    pub fn kind(&self) -> &'static str {
        match self {
            Kernel::Elementwise(_) => "elementwise",
            Kernel::Pool(_) => "pool",
            Kernel::Reduction(_) => "reduction",
            Kernel::Layout(_) => "layout",
            Kernel::Gemm(_) => "gemm",
            Kernel::Conv(_) => "conv",
            Kernel::Select(_) => "select",
            Kernel::Attention(_) => "attention",
            Kernel::Grad(_) => "grad",
            Kernel::Update(_) => "update",
        }
    }

    /// The CUDA C source.
    pub fn cuda(&self) -> String {
        match self {
            Kernel::Elementwise(k) => k.cuda(),
            Kernel::Pool(k) => k.cuda(),
            Kernel::Reduction(k) => k.cuda(),
            Kernel::Layout(k) => k.cuda(),
            Kernel::Gemm(k) => k.cuda(),
            Kernel::Conv(k) => k.cuda(),
            Kernel::Select(k) => k.cuda(),
            Kernel::Attention(k) => k.cuda(),
            Kernel::Grad(k) => k.cuda(),
            Kernel::Update(k) => k.cuda(),
        }
    }

    /// Launch geometry.
    pub fn launch(&self) -> Launch {
        match self {
            Kernel::Elementwise(k) => Launch { count: Some(k.numel()), ..linear(k.threads()) },
            Kernel::Pool(k) => linear(k.numel()),
            Kernel::Reduction(k) if k.by_block() => {
                Launch { grid: [k.row_count().max(1), 1, 1], block: [crate::reduce::BLOCK_THREADS, 1, 1], count: Some(k.row_count()) }
            }
            Kernel::Reduction(k) => linear(k.row_count()),
            Kernel::Layout(k) => linear(k.numel()),
            Kernel::Select(k) => linear(k.numel()),
            Kernel::Grad(k) => k.launch(),
            Kernel::Update(k) if k.optimizer == smelt_ir::Optimizer::Count => Launch { grid: [1, 1, 1], block: [1, 1, 1], count: None },
            Kernel::Update(k) => linear(k.n),
            Kernel::Attention(k) => Launch { grid: k.grid(), block: [k.threads(), 1, 1], count: None },
            Kernel::Gemm(k) => {
                let ((x, y), [bx, by]) = (k.grid(), k.block());
                Launch { grid: [x.max(1), y.max(1), k.batches().max(1)], block: [bx, by, 1], count: None }
            }
            Kernel::Conv(k) => Launch { grid: k.grid().map(|d| d.max(1)), block: [k.threads(), 1, 1], count: None },
        }
    }

    /// Multiply-adds (GEMM, conv) or elements produced, for FLOP-rate reports.
    pub fn flops(&self) -> usize {
        match self {
            Kernel::Gemm(k) => 2 * k.m * k.n * k.k * k.batches(),
            Kernel::Conv(k) => 2 * k.macs(),
            Kernel::Elementwise(k) => k.numel() * k.expr.nodes.len(),
            Kernel::Pool(k) => k.numel() * k.attrs.kernel.iter().product::<usize>(),
            Kernel::Reduction(k) => k.pre.iter().product(),
            Kernel::Layout(k) => k.numel(),
            Kernel::Select(k) => k.numel(),
            Kernel::Attention(k) => 2 * k.macs(),
            Kernel::Grad(k) => 2 * k.macs(),
            Kernel::Update(k) => 10 * k.n,
        }
    }

    /// Whether its products run on tensor cores.
    pub fn tensor_cores(&self) -> bool {
        match self {
            Kernel::Conv(k) => k.tensor_cores(),
            Kernel::Gemm(k) => k.tensor_cores,
            Kernel::Attention(k) => k.tc_rows.is_some(),
            Kernel::Grad(k) => k.tensor_cores(),
            _ => false,
        }
    }

    /// Whether its tensor-core products take f32 operands in TF32 (half
    /// the f16 rate).
    pub fn tf32(&self) -> bool {
        match self {
            Kernel::Conv(k) => k.tf32,
            Kernel::Gemm(k) => k.tf32,
            Kernel::Grad(k) => k.tf32,
            _ => false,
        }
    }

    /// FLOPs it executes, the padding of partial tiles included: a tiled
    /// product computes whole tiles whatever the problem's edges (equal to
    /// [`Kernel::flops`] for kernels without tiles).
    pub fn tiled_flops(&self) -> usize {
        let up = |x: usize, t: usize| x.div_ceil(t) * t;
        match self {
            Kernel::Gemm(k) if k.tensor_cores => 2 * up(k.m, k.tile.m) * up(k.n, k.tile.n) * up(k.k, crate::tile::DEPTH) * k.batches(),
            Kernel::Gemm(k) => {
                let t = crate::gemm::TILE;
                2 * up(k.m, t) * up(k.n, t) * up(k.k, t) * k.batches()
            }
            Kernel::Conv(k) if k.algo == crate::conv::Algo::TensorCore => {
                2 * k.groups * up(k.mg(), k.tile.m) * up(k.p(), k.tile.n) * up(k.k(), crate::conv::BK)
            }
            Kernel::Conv(k) if k.algo != crate::conv::Algo::Direct => {
                2 * k.groups * up(k.mg(), crate::conv::BM) * up(k.p(), crate::conv::BN) * up(k.k(), crate::conv::BK)
            }
            Kernel::Attention(k) => 2 * k.tiled_macs(),
            _ => self.flops(),
        }
    }

    /// The block tile of a tensor-core conv or GEMM.
    pub fn tile(&self) -> Option<crate::tile::Tile> {
        match self {
            Kernel::Conv(k) if k.tensor_cores() => Some(k.tile),
            Kernel::Gemm(k) if k.tensor_cores => Some(k.tile),
            _ => None,
        }
    }

    /// The name a tensor-core conv or GEMM had when its tile was chosen
    /// (without the tile's and the layout's suffixes): the key of a tuning
    /// table ([`crate::TileChoice::Tuned`]).
    pub fn tile_key(&self) -> Option<String> {
        let t = self.tile()?;
        let mut name = self.name();
        if let Kernel::Conv(c) = self {
            name = name.strip_suffix(c.layout_suffix()).unwrap_or(name);
        }
        Some(name.strip_suffix(&t.suffix()).unwrap_or(name).to_string())
    }

    /// Bytes its tensor-core tiles move through shared memory (fragments
    /// loaded, operand tiles stored, results staged), over the whole launch;
    /// 0 where the model does not count them (CUDA-core kernels, attention
    /// and gradients).
    pub fn shared_traffic(&self) -> usize {
        let steps = |k: usize| k.div_ceil(crate::tile::DEPTH);
        match self {
            Kernel::Conv(k) if k.tensor_cores() => {
                let [x, y, z] = k.grid();
                x * y * z * k.tile.shared_traffic(steps(k.k()), k.dtype.size())
            }
            Kernel::Gemm(k) if k.tensor_cores => {
                let (x, y) = k.grid();
                x * y * k.batches() * k.tile.shared_traffic(steps(k.k), k.dtype.size())
            }
            _ => 0,
        }
    }

    /// The operands a kernel writes in place, by index (an update's
    /// parameter and state); empty for kernels that write an output.
    pub fn written(&self) -> Vec<usize> {
        match self {
            Kernel::Update(k) => k.written(),
            _ => Vec::new(),
        }
    }

    /// Whether it is an optimizer's step (a parameter's update or the step
    /// counter's, not a running statistic's): what a runtime skips when a
    /// loss-scaled step's gradients overflowed.
    pub fn is_optimizer_step(&self) -> bool {
        matches!(self, Kernel::Update(u) if matches!(u.optimizer, smelt_ir::Optimizer::Sgd { .. } | smelt_ir::Optimizer::Adam { .. } | smelt_ir::Optimizer::Count))
    }

    /// Runs the description on the CPU (inputs in the node's order). An
    /// update returns its parameter's new value ([`Kernel::run_in_place`]
    /// has all it writes).
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        match self {
            Kernel::Elementwise(k) => k.run_cpu(inputs),
            Kernel::Pool(k) => k.run_cpu(inputs[0]),
            Kernel::Reduction(k) => k.run_cpu(inputs),
            Kernel::Layout(k) => k.run_cpu(inputs),
            Kernel::Gemm(k) => k.run_cpu(inputs),
            Kernel::Conv(k) => k.run_cpu(inputs),
            Kernel::Select(k) => k.run_cpu(inputs),
            Kernel::Attention(k) => k.run_cpu(inputs),
            Kernel::Grad(k) => k.run_cpu(inputs),
            Kernel::Update(k) => k.run_in_place(inputs).swap_remove(0),
        }
    }

    /// The new values of the operands it writes ([`Kernel::written`]), in
    /// that order; for other kernels, the output.
    pub fn run_in_place(&self, inputs: &[&Tensor]) -> Vec<Tensor> {
        match self {
            Kernel::Update(k) => k.run_in_place(inputs),
            k => vec![k.run_cpu(inputs)],
        }
    }
}
