//! The command line's flags for the model, its training step and `smelt
//! fit` (clap), converted into the library's typed options
//! ([`smelt::spec`]), where they are checked as Python's are.

use clap::Args;
use smelt::cost::Gpu;
use smelt::fit::Shard;
use smelt::spec::{self, BatchNormMode, Choice, FitSpec, LossKind, LossScale, ModelSpec, OptimizerKind, StepSpec};
use smelt::RematSolver;
use std::path::PathBuf;

/// A clap parser of a [`Choice`]'s names, giving the value.
fn choice<C: Choice + Send + Sync>() -> impl clap::builder::TypedValueParser<Value = C> {
    clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(C::names()), |s| C::parse(&s).expect("listed"))
}

/// The flags that name a model and say how to compile it (every command).
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Path to .onnx or .tir, or zoo:NAME.
    pub model: String,
    /// Batch size, replacing the exported one (also inside Reshape targets
    /// that hard-code it).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Size of a named symbolic input dimension, as NAME=N (`--dim
    /// sequence=512`); repeatable. A symbolic first dimension is the batch
    /// (--batch, default 1); any other needs --dim. The zoo transformers
    /// take `--dim sequence=N` (default 128).
    #[arg(long = "dim", value_name = "NAME=N", value_parser = spec::dim_size)]
    pub dims: Vec<(String, usize)>,
    /// The value of a graph input that an op needs at compile time (a
    /// Reshape's shape, a reduction's axes, Pad's pads, Clip's bounds), as
    /// NAME=V1,V2,... in row-major order (`--set axes=1,2`); repeatable.
    /// The input becomes a constant and leaves the program's inputs.
    #[arg(long = "set", value_name = "NAME=VALUES", value_parser = spec::set_value)]
    pub set: Vec<(String, Vec<f64>)>,
    /// Turn fusion off everywhere (for comparison).
    #[arg(long)]
    pub no_fuse: bool,
    /// Precision policy: f32 (as imported), f16 or bf16 (every float op),
    /// mixed-f16 or mixed-bf16 (half storage and compute with f32
    /// accumulation; f32 kept for softmax, normalization, reductions, the
    /// final classifier layer and --keep-f32). Graph inputs and outputs stay f32.
    #[arg(long, default_value = "f32", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt_passes::precision::Policy::NAMES), |s| s.parse::<smelt_passes::precision::Policy>().expect("listed")))]
    pub precision: smelt_passes::precision::Policy,
    /// Keep these in f32 under a reduced precision: an op type (softmax,
    /// conv, gemm...) or a node name, `*` matching any characters. Repeatable.
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    pub keep_f32: Vec<String>,
    /// TF32 on tensor cores for f32 products (compute_80 and newer), as
    /// PyTorch's allow_tf32: conv (f32 convolutions and their gradients, as
    /// cuDNN does), on (also GEMMs and MatMuls) or off (exact f32). TF32
    /// rounds each operand to 10 mantissa bits and accumulates in f32 (about
    /// 1e-3 relative error). Default: conv for the GPU (compile, plan, fit,
    /// --backend cuda or emulator); off for --backend cpu, --arch below
    /// compute_80 and --device v100, as PyTorch on each.
    #[arg(long, value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt_ir::Tf32::NAMES), |s| s.parse::<smelt_ir::Tf32>().expect("listed")))]
    pub tf32: Option<smelt_ir::Tf32>,
    /// Split execution for the smallest arena: run the segments at the
    /// memory peak by slices of the batch and by bands of rows (each band
    /// computing the halo rows its convolutions need again), recomputing at
    /// most 15% more FLOPs. Outputs are unchanged. (`--memory-limit` splits
    /// only as much as the limit needs.)
    #[arg(long)]
    pub min_memory: bool,
    /// Tensor-core tiles measured by `smelt tune` (the table it wrote): each
    /// conv and GEMM it names takes its fastest tile; the others the
    /// roofline model's choice on --device.
    #[arg(long, value_name = "FILE.json")]
    pub tuning: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub train: TrainArgs,
}

/// What makes a command work on a training step instead of the forward pass.
#[derive(Args, Clone, Default)]
#[command(next_help_heading = "Training (a whole step: forward, loss, backward, optimizer update)")]
#[command(group(clap::ArgGroup::new("step").args(["train", "recipe"]).multiple(true)))]
pub struct TrainArgs {
    /// Compile one training step with this optimizer: sgd (no momentum
    /// unless --momentum, as torch.optim.SGD), adam or adamw. Trained: every float initializer
    /// that is a conv, gemm or matmul weight, a norm's scale or bias, or a
    /// bias added to a layer (and a text model's `param`s), or exactly those
    /// --trainable or --train-only name; except --freeze.
    #[arg(long, visible_alias = "optimizer", value_name = "OPTIMIZER", value_parser = choice::<OptimizerKind>())]
    pub train: Option<OptimizerKind>,
    /// The loss: ce (cross-entropy against int64 labels, input `labels`:
    /// logits [N, C] take labels [N], per-token logits [B, S, V] labels
    /// [B, S], logits [N, C, H, W] labels [N, H, W]; labels of -100 are
    /// ignored, the mean is over the others, as PyTorch's), causal-lm (a
    /// language model's loss: logits [B, S, V] at position i predict label
    /// i + 1, so the labels can be the input ids, as Hugging Face's
    /// *ForCausalLM), mse (against f32 targets of the output's shape, input
    /// `targets`) or auto (ce when the output is logits [N, C], mse
    /// otherwise). A model ending in Softmax is trained on its input.
    #[arg(long, default_value = "auto", value_parser = choice::<LossKind>(), requires = "step")]
    pub loss: LossKind,
    /// The output the loss reads (default: the only one).
    #[arg(long, value_name = "OUTPUT", requires = "step")]
    pub loss_on: Option<String>,
    /// Label smoothing of the cross-entropy, in [0, 1) (default 0).
    #[arg(long, requires = "step")]
    pub label_smoothing: Option<f32>,
    /// Learning rate (default 0.01 for sgd, 0.001 for adam and adamw).
    #[arg(long, requires = "step")]
    pub lr: Option<f32>,
    /// SGD's momentum (default 0, as in torch.optim.SGD: no momentum
    /// buffers). Adam's moments use betas (0.9, 0.999), as PyTorch's default.
    #[arg(long, requires = "step")]
    pub momentum: Option<f32>,
    /// Nesterov momentum (sgd).
    #[arg(long, requires = "step")]
    pub nesterov: bool,
    /// Weight decay: added to the gradient (sgd, adam) or decoupled (adamw,
    /// default 0.01 there).
    #[arg(long, requires = "step")]
    pub weight_decay: Option<f32>,
    /// Gradient accumulation: K micro-batches of batch/K per update (the
    /// plan is the micro-step's; the accumulators are persistent).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), requires = "step")]
    pub accumulate: u32,
    /// Learning-rate schedule: a cosine decay to 0 over this many optimizer
    /// steps, after --warmup steps of linear warmup (Hugging Face's
    /// cosine-with-warmup). Default: constant.
    #[arg(long, value_name = "STEPS", requires = "step")]
    pub cosine: Option<usize>,
    /// Steps of linear learning-rate warmup (with --cosine).
    #[arg(long, value_name = "STEPS", default_value_t = 0, requires = "step")]
    pub warmup: usize,
    /// Clip the gradients by their global L2 norm (PyTorch's
    /// clip_grad_norm_): every gradient is kept until all are computed.
    #[arg(long, value_name = "MAX_NORM", requires = "step")]
    pub clip_norm: Option<f32>,
    /// Batch norm: frozen (as exported: running statistics normalize, scale
    /// and bias train) or train (batch statistics; the running statistics
    /// follow them with PyTorch's momentum 0.1, as `model.train()`).
    #[arg(long, default_value = "frozen", value_parser = choice::<BatchNormMode>(), requires = "step")]
    pub batch_norm: BatchNormMode,
    /// Loss scaling under --precision f16 or mixed-f16: dynamic (the
    /// gradients of a scaled loss, unscaled before the update; a step whose
    /// gradients overflow is skipped and the scale halved, and it doubles
    /// after 2000 clean steps, as torch.amp.GradScaler) or none. bf16 and
    /// f32 need none.
    #[arg(long, default_value = "dynamic", value_parser = choice::<LossScale>(), requires = "step")]
    pub loss_scale: LossScale,
    /// Keep these initializers fixed: names, `*` matching any characters. Repeatable.
    #[arg(long = "freeze", value_name = "PATTERN", requires = "step")]
    pub freeze: Vec<String>,
    /// Train exactly the initializers named in FILE, one name a line, as
    /// PyTorch lists them: `[n for n, p in model.named_parameters() if
    /// p.requires_grad]` (instead of smelt's rule; --freeze still applies).
    /// Each must be a float initializer of the model. `plan --train` shows
    /// what is trained and why the rest is not.
    #[arg(long, value_name = "FILE", requires = "step")]
    pub trainable: Option<std::path::PathBuf>,
    /// Train exactly the float initializers matching PATTERN (`*` matches
    /// any characters; repeatable; each must match one), instead of smelt's
    /// rule.
    #[arg(long = "train-only", value_name = "PATTERN", requires = "step")]
    pub train_only: Vec<String>,
    /// Recompute saved activations in the backward pass, instead of keeping
    /// them from the forward pass, until the step's activation arena is at
    /// most SIZE: the values cheapest to recompute per byte saved (on
    /// --device's roofline) at the peak first. `smelt fit` chooses SIZE.
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size, requires = "step")]
    pub remat_budget: Option<usize>,
    /// What chooses the recomputed values: greedy (the cheapest per byte at
    /// the peak, first; fast, and a smaller budget never gives a larger
    /// arena or a cheaper recomputation) or exact (a mixed-integer program:
    /// the cheapest choice in its model, with a proven lower bound; up to 20
    /// s a plan, and not monotone in the budget by construction).
    #[arg(long, value_name = "SOLVER", default_value = "greedy", value_parser = choice::<RematSolver>(), requires = "step")]
    pub remat_solver: RematSolver,
    /// The GPU whose roofline (FP32 and tensor-core rates, bandwidth, SMs,
    /// launch overhead) chooses the tensor-core kernels' tiles, prices a
    /// recomputation and makes `smelt compile --report`'s estimate: h100
    /// (default), h200, a100, v100 or l4.
    #[arg(long, value_name = "GPU", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt::cost::GPU_NAMES), |s| spec::gpu_named(&s).expect("listed")))]
    pub device: Option<Gpu>,
    /// Take batch, accumulation, precision, optimizer and recomputation
    /// budget from a recipe written by `smelt fit --save-recipe` (with its
    /// dimensions, recomputation solver and device: the flags that set
    /// these are refused beside it).
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["accumulate", "remat_budget", "remat_solver", "device", "batch", "precision", "dims"])]
    pub recipe: Option<PathBuf>,
}

/// `smelt fit`'s flags.
#[derive(Args, Clone)]
pub struct FitArgs {
    /// Path to .onnx or .tir, or zoo:NAME.
    pub model: String,
    /// The whole batch of an optimizer step; micro-batches divide it.
    #[arg(long)]
    pub batch: usize,
    /// Size of a named symbolic input dimension, as NAME=N (as `smelt plan`).
    #[arg(long = "dim", value_name = "NAME=N", value_parser = spec::dim_size)]
    pub dims: Vec<(String, usize)>,
    /// The value of a graph input needed at compile time, as NAME=VALUES (as `smelt plan`).
    #[arg(long = "set", value_name = "NAME=VALUES", value_parser = spec::set_value)]
    pub set: Vec<(String, Vec<f64>)>,
    /// Keep these in f32 under a reduced precision (as `smelt plan`).
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    pub keep_f32: Vec<String>,
    /// TF32 for f32 products: conv (default), on or off (as `smelt plan`).
    #[arg(long, value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt_ir::Tf32::NAMES), |s| s.parse::<smelt_ir::Tf32>().expect("listed")))]
    pub tf32: Option<smelt_ir::Tf32>,
    /// Tensor-core tiles measured by `smelt tune` (as `smelt plan`): the
    /// step times compared are those of the measured tiles.
    #[arg(long, value_name = "FILE.json")]
    pub tuning: Option<PathBuf>,
    #[command(flatten)]
    pub train: TrainArgs,
    /// Device memory the step may use: activation arena plus weights,
    /// optimizer state and accumulators (B, KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
    pub memory_limit: usize,
    /// Precisions to search: auto (f32, mixed-bf16, mixed-f16; the fastest
    /// wins, f32 on a tie) or one policy.
    #[arg(long, default_value = "f32", value_parser = ["auto", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16"])]
    pub precision: String,
    /// Plan data parallelism over N GPUs: each runs batch / N samples per
    /// optimizer step, memory and time are per GPU, and the collectives
    /// are listed with their sizes. A plan: smelt trains on one GPU.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus: u32,
    /// With --gpus: what the GPUs shard, as ZeRO's stages: none (all-reduce
    /// the gradients), optimizer (stage 1), gradients (stage 2: optimizer
    /// state and accumulators), parameters (stage 3: those and the weights,
    /// gathered a layer at a time).
    #[arg(long, default_value = "none", value_parser = choice::<Shard>(), requires = "gpus")]
    pub shard: Shard,
    /// Write the chosen recipe (JSON) for `smelt train --recipe` and `smelt plan --recipe`.
    #[arg(long, value_name = "FILE.json")]
    pub save_recipe: Option<PathBuf>,
    /// Print JSON instead of text (no progress).
    #[arg(long)]
    pub json: bool,
}

impl TrainArgs {
    /// The step's typed options (a `--trainable` file read: its names).
    pub fn spec(&self) -> Result<StepSpec, smelt::Error> {
        Ok(StepSpec {
            optimizer: self.train,
            loss: self.loss,
            loss_on: self.loss_on.clone(),
            label_smoothing: self.label_smoothing,
            lr: self.lr,
            momentum: self.momentum,
            nesterov: self.nesterov,
            weight_decay: self.weight_decay,
            accumulate: self.accumulate,
            cosine: self.cosine,
            warmup: self.warmup,
            clip_norm: self.clip_norm,
            batch_norm: self.batch_norm,
            loss_scale: self.loss_scale,
            freeze: self.freeze.clone(),
            trainable: self.trainable.as_deref().map(spec::read_names).transpose()?.unwrap_or_default(),
            train_only: self.train_only.clone(),
            remat_budget: self.remat_budget,
            remat_solver: self.remat_solver,
            device: self.device,
            recipe: self.recipe.clone(),
        })
    }
}

impl ModelArgs {
    /// The library's typed options.
    pub fn spec(&self) -> Result<ModelSpec, smelt::Error> {
        Ok(ModelSpec {
            model: self.model.clone(),
            batch: self.batch,
            dims: self.dims.clone(),
            set: self.set.clone(),
            no_fuse: self.no_fuse,
            precision: self.precision,
            keep_f32: self.keep_f32.clone(),
            tf32: self.tf32,
            min_memory: self.min_memory,
            split_limit: None,
            tuning: self.tuning.clone(),
            tiles: None,
            train: self.train.spec()?,
        })
    }
}

impl FitArgs {
    /// The library's typed question.
    pub fn spec(&self) -> Result<FitSpec, smelt::Error> {
        let mut model = ModelSpec::new(self.model.clone());
        model.dims = self.dims.clone();
        model.set = self.set.clone();
        model.keep_f32 = self.keep_f32.clone();
        model.tf32 = self.tf32;
        model.tuning = self.tuning.clone();
        model.train = self.train.spec()?;
        Ok(FitSpec {
            model,
            batch: self.batch,
            memory_limit: self.memory_limit,
            precisions: FitSpec::precisions_named(&self.precision)?,
            gpus: self.gpus as usize,
            shard: self.shard,
        })
    }
}
