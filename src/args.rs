//! The options that say which model to open and how: the command line's
//! `ModelArgs` and `TrainArgs` (clap), shared by every command and by the
//! Python package, which passes its keyword arguments as these flags so that
//! both accept and refuse exactly the same things.

use crate::Error;
use clap::{Args, Parser};
use std::path::PathBuf;

/// `Error::Usage` from a format string.
macro_rules! usage {
    ($($t:tt)*) => { Error::Usage(format!($($t)*)) };
}

/// The text of a `--trainable` list: at most 16 MiB (millions of names),
/// UTF-8; anything else is refused, naming the file.
fn read_list(f: &std::path::Path) -> Result<String, Error> {
    use std::io::Read as _;
    const LIMIT: u64 = 16 << 20;
    let bad = |what: String| usage!("--trainable {}: {what}", f.display());
    let mut bytes = Vec::new();
    std::fs::File::open(f).and_then(|h| h.take(LIMIT + 1).read_to_end(&mut bytes)).map_err(|e| bad(e.to_string()))?;
    if bytes.len() as u64 > LIMIT {
        return Err(bad(format!("over {} MiB: a list of names is much smaller", LIMIT >> 20)));
    }
    String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text (one initializer name a line)".into()))
}

/// Parses `--dim NAME=N`.
pub fn dim_size(s: &str) -> Result<(String, usize), String> {
    let (name, n) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=N (e.g. sequence=512)"))?;
    let n: usize = n.trim().parse().map_err(|_| format!("{n:?} is not a size"))?;
    if name.is_empty() || n == 0 {
        return Err(format!("{s:?}: needs a name and a size of at least 1"));
    }
    Ok((name.to_string(), n))
}

/// Parses `--set NAME=VALUES` (comma-separated numbers).
pub fn set_value(s: &str) -> Result<(String, Vec<f64>), String> {
    let (name, v) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=VALUES (e.g. shape=1,-1)"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: needs the name of a graph input"));
    }
    let values = v.split(',').filter(|x| !x.trim().is_empty());
    let values = values.map(|x| x.trim().parse::<f64>().map_err(|_| format!("{x:?} is not a number"))).collect::<Result<_, _>>()?;
    Ok((name.to_string(), values))
}

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
    #[arg(long = "dim", value_name = "NAME=N", value_parser = dim_size)]
    pub dims: Vec<(String, usize)>,
    /// The value of a graph input that an op needs at compile time (a
    /// Reshape's shape, a reduction's axes, Pad's pads, Clip's bounds), as
    /// NAME=V1,V2,... in row-major order (`--set axes=1,2`); repeatable.
    /// The input becomes a constant and leaves the program's inputs.
    #[arg(long = "set", value_name = "NAME=VALUES", value_parser = set_value)]
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
    /// The memory limit that splitting aims at (set by the commands that
    /// take `--memory-limit`).
    #[arg(skip)]
    pub split_limit: Option<usize>,
    /// Tensor-core tiles measured by `smelt tune` (the table it wrote): each
    /// conv and GEMM it names takes its fastest tile; the others the
    /// roofline model's choice on --device.
    #[arg(long, value_name = "FILE.json")]
    pub tuning: Option<std::path::PathBuf>,
    /// How tiles are chosen, overriding --tuning (set by `smelt tune`).
    #[arg(skip)]
    pub tiles: Option<smelt_codegen::TileChoice>,
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
    #[arg(long, visible_alias = "optimizer", value_name = "OPTIMIZER", value_parser = ["sgd", "adam", "adamw"])]
    pub train: Option<String>,
    /// The loss: ce (cross-entropy against int64 labels, input `labels`:
    /// logits [N, C] take labels [N], per-token logits [B, S, V] labels
    /// [B, S], logits [N, C, H, W] labels [N, H, W]; labels of -100 are
    /// ignored, the mean is over the others, as PyTorch's), causal-lm (a
    /// language model's loss: logits [B, S, V] at position i predict label
    /// i + 1, so the labels can be the input ids, as Hugging Face's
    /// *ForCausalLM), mse (against f32 targets of the output's shape, input
    /// `targets`) or auto (ce when the output is logits [N, C], mse
    /// otherwise). A model ending in Softmax is trained on its input.
    #[arg(long, default_value = "auto", value_parser = ["auto", "ce", "causal-lm", "mse"], requires = "step")]
    pub loss: String,
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
    #[arg(long, default_value = "frozen", value_parser = ["frozen", "train"], requires = "step")]
    pub batch_norm: String,
    /// Loss scaling under --precision f16 or mixed-f16: dynamic (the
    /// gradients of a scaled loss, unscaled before the update; a step whose
    /// gradients overflow is skipped and the scale halved, and it doubles
    /// after 2000 clean steps, as torch.amp.GradScaler) or none. bf16 and
    /// f32 need none.
    #[arg(long, default_value = "dynamic", value_parser = ["dynamic", "none"], requires = "step")]
    pub loss_scale: String,
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
    #[arg(long, value_name = "SIZE", value_parser = crate::plan::parse_size, requires = "step")]
    pub remat_budget: Option<usize>,
    /// What chooses the recomputed values: greedy (the cheapest per byte at
    /// the peak, first; fast, and a smaller budget never gives a larger
    /// arena or a cheaper recomputation) or exact (a mixed-integer program:
    /// the cheapest choice in its model, with a proven lower bound; up to 20
    /// s a plan, and not monotone in the budget by construction).
    #[arg(long, value_name = "SOLVER", default_value = "greedy", value_parser = ["greedy", "exact"], requires = "step")]
    pub remat_solver: String,
    /// The GPU whose roofline (FP32 and tensor-core rates, bandwidth, SMs,
    /// launch overhead) chooses the tensor-core kernels' tiles, prices a
    /// recomputation and makes `smelt compile --report`'s estimate: h100,
    /// h200, a100, v100 or l4.
    #[arg(long, value_name = "GPU", default_value = "h100", value_parser = crate::cost::GPU_NAMES)]
    pub device: String,
    /// Take batch, accumulation, precision, optimizer and recomputation
    /// budget from a recipe written by `smelt fit --save-recipe` (with its
    /// dimensions, recomputation solver and device: the flags that set
    /// these are refused beside it).
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["accumulate", "remat_budget", "remat_solver", "device", "batch", "precision", "dims"])]
    pub recipe: Option<PathBuf>,
}

impl TrainArgs {
    /// The training configuration, when --train is given.
    pub fn config(&self) -> Result<Option<smelt_passes::train::TrainConfig>, Error> {
        use smelt_ir::Optimizer;
        use smelt_passes::train::{Loss, TrainConfig};
        let Some(opt) = &self.train else { return Ok(None) };
        let wd = self.weight_decay.unwrap_or(if opt == "adamw" { 0.01 } else { 0.0 });
        let schedule = match (self.cosine, self.warmup) {
            (Some(total), w) if w < total => smelt_ir::Schedule { warmup: w, total },
            (Some(total), w) => return Err(usage!("--warmup {w} must be shorter than --cosine {total}")),
            (None, 0) => smelt_ir::Schedule::default(),
            (None, _) => return Err(usage!("--warmup needs --cosine STEPS (the schedule's length)")),
        };
        let optimizer = match opt.as_str() {
            "sgd" => Optimizer::Sgd {
                lr: self.lr.unwrap_or(0.01),
                momentum: self.momentum.unwrap_or(0.0),
                dampening: 0.0,
                nesterov: self.nesterov,
                weight_decay: wd,
                accumulate: self.accumulate as usize,
                schedule,
            },
            _ => Optimizer::Adam {
                lr: self.lr.unwrap_or(1e-3),
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: wd,
                decoupled: opt == "adamw",
                accumulate: self.accumulate as usize,
                schedule,
            },
        };
        if self.nesterov && (opt != "sgd" || self.momentum.unwrap_or(0.0) == 0.0) {
            return Err(usage!("--nesterov needs --train sgd with a non-zero --momentum"));
        }
        if let (Some(m), true) = (self.momentum, opt != "sgd") {
            return Err(usage!(
                "--momentum {m} is SGD's: {opt} keeps moving averages with betas (0.9, 0.999), as torch.optim.{} does; drop --momentum or use --train sgd",
                if opt == "adam" { "Adam" } else { "AdamW" }
            ));
        }
        let smoothing = self.label_smoothing.unwrap_or(0.0);
        let loss = match self.loss.as_str() {
            "mse" if self.label_smoothing.is_some() => {
                return Err(usage!("--label-smoothing is the cross-entropy's: --loss mse has no labels to smooth"))
            }
            "mse" => Loss::MeanSquaredError,
            "ce" => Loss::CrossEntropy { smoothing },
            "causal-lm" => Loss::CausalLm { smoothing },
            _ => Loss::Auto { smoothing },
        };
        let batch_norm = if self.batch_norm == "train" {
            smelt_passes::train::BatchNorm::Train { momentum: 0.1 }
        } else {
            smelt_passes::train::BatchNorm::Frozen
        };
        if self.clip_norm.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
            return Err(usage!("--clip-norm must be a positive number"));
        }
        let mut only = self.train_only.clone();
        if let Some(f) = &self.trainable {
            let text = read_list(f)?;
            let names: Vec<String> =
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect();
            if names.is_empty() {
                return Err(usage!("--trainable {}: no names in it (one initializer name a line)", f.display()));
            }
            only.extend(names);
        }
        Ok(Some(TrainConfig {
            loss,
            loss_on: self.loss_on.clone(),
            optimizer: Some(optimizer),
            freeze: self.freeze.clone(),
            only,
            batch_norm,
            clip_norm: self.clip_norm,
            loss_scale: false,
        }))
    }
}

impl ModelArgs {
    /// The default model with default options.
    pub fn default_model() -> ModelArgs {
        ModelArgs {
            model: crate::DEFAULT_MODEL.into(),
            batch: None,
            dims: Vec::new(),
            set: Vec::new(),
            no_fuse: false,
            precision: Default::default(),
            keep_f32: Vec::new(),
            tf32: Default::default(),
            min_memory: false,
            split_limit: None,
            tuning: None,
            tiles: None,
            train: TrainArgs::default(),
        }
    }

    /// Exact f32 unless `--tf32` says otherwise: for targets without TF32
    /// (the CPU backend, architectures below compute_80, a V100).
    pub fn no_tf32_by_default(&mut self) {
        self.tf32.get_or_insert(smelt_ir::Tf32::Off);
    }

    /// What the kernels are compiled for: `--device`'s GPU (the default for
    /// an unknown name, which `smelt fit` refuses), tiles as `--tuning` (or
    /// `smelt tune`) says.
    pub fn target(&self) -> Result<smelt_codegen::Target, Error> {
        Ok(smelt_codegen::Target {
            gpu: crate::cost::gpu(&self.train.device).unwrap_or_default(),
            tiles: match (&self.tiles, &self.tuning) {
                (Some(t), _) => t.clone(),
                (None, Some(path)) => smelt_codegen::TileChoice::Tuned(std::sync::Arc::new(
                    crate::tune::Tuning::read(path)?.table().expect("checked when read"),
                )),
                (None, None) => smelt_codegen::TileChoice::Model,
            },
        })
    }

    /// The driver's options.
    pub fn options(&self) -> Result<crate::Options, Error> {
        let train = self.train.config()?.map(|mut t| {
            use smelt_passes::precision::Policy;
            t.loss_scale = matches!(self.precision, Policy::F16 | Policy::MixedF16) && self.train.loss_scale == "dynamic";
            t
        });
        let target = self.target()?;
        Ok(crate::Options {
            batch: self.batch,
            dims: self.dims.clone(),
            known: self.set.iter().map(|(n, v)| (n.clone(), smelt_ir::onnx::Known::Values(v.clone()))).collect(),
            no_fuse: self.no_fuse,
            precision: smelt_passes::precision::Options {
                policy: self.precision,
                keep_f32: self.keep_f32.clone(),
                tf32: self.tf32.unwrap_or(smelt_ir::Tf32::Conv),
            },
            train,
            remat: self.train.remat_budget.map(|budget| crate::Remat {
                budget,
                target: target.clone(),
                solver: crate::RematSolver::parse(&self.train.remat_solver).unwrap_or_default(),
            }),
            split: if self.min_memory {
                Some(smelt_passes::split::Goal::Minimum)
            } else {
                self.split_limit.map(smelt_passes::split::Goal::Limit)
            },
            target,
        })
    }

    /// Takes batch, accumulation, precision, optimizer and recomputation
    /// budget from `--recipe` (clap refuses those flags beside it).
    pub fn apply_recipe(&mut self) -> Result<(), Error> {
        let Some(path) = &self.train.recipe else { return Ok(()) };
        let r = crate::fit::Recipe::load(path)?;
        if r.gpus > 1 {
            return Err(usage!(
                "{}: the recipe plans data parallelism over {} GPUs (micro-batch {} each); smelt runs on one GPU: pass its per-GPU flags (--batch {} --accumulate {}) to plan or train one replica",
                path.display(),
                r.gpus,
                r.micro_batch,
                r.batch / r.gpus,
                r.accumulate
            ));
        }
        let name = |s: &str| s.trim_start_matches("zoo:").to_string();
        if name(&r.model) != name(&self.model)
            && std::path::Path::new(&r.model).file_name() != std::path::Path::new(&self.model).file_name()
        {
            return Err(usage!("{}: the recipe was made for {}, not {}", path.display(), r.model, self.model));
        }
        match &self.train.train {
            Some(o) if *o != r.optimizer => {
                return Err(usage!("{}: the recipe was made for --train {}, not {o}", path.display(), r.optimizer))
            }
            _ => self.train.train = Some(r.optimizer.clone()),
        }
        if self.dims.is_empty() {
            self.dims = r.dims.clone();
        }
        self.batch = Some(r.batch);
        self.train.accumulate = r.accumulate as u32;
        self.precision = r.precision.parse().map_err(|e: String| Error::Usage(e))?;
        self.train.remat_budget = r.remat_budget;
        self.train.remat_solver = r.remat_solver.name().to_string();
        self.train.device = r.device.clone();
        Ok(())
    }
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
    #[arg(long = "dim", value_name = "NAME=N", value_parser = dim_size)]
    pub dims: Vec<(String, usize)>,
    /// The value of a graph input needed at compile time, as NAME=VALUES (as `smelt plan`).
    #[arg(long = "set", value_name = "NAME=VALUES", value_parser = set_value)]
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
    #[arg(long, value_name = "SIZE", value_parser = crate::plan::parse_size)]
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
    #[arg(long, default_value = "none", value_parser = crate::fit::Shard::NAMES, requires = "gpus")]
    pub shard: String,
    /// Write the chosen recipe (JSON) for `smelt train --recipe` and `smelt plan --recipe`.
    #[arg(long, value_name = "FILE.json")]
    pub save_recipe: Option<PathBuf>,
    /// Print JSON instead of text (no progress).
    #[arg(long)]
    pub json: bool,
}

impl FitArgs {
    /// Checks `smelt fit`'s flags: the search's request and the step's
    /// optimizer.
    pub fn request(&self) -> Result<(crate::fit::Request, String), Error> {
        use smelt_passes::precision::Policy;
        let a = self;
        let mut m = ModelArgs {
            model: a.model.clone(),
            batch: Some(a.batch),
            dims: a.dims.clone(),
            set: a.set.clone(),
            no_fuse: false,
            precision: Policy::F32,
            keep_f32: a.keep_f32.clone(),
            tf32: a.tf32,
            min_memory: false,
            split_limit: None,
            tuning: a.tuning.clone(),
            tiles: None,
            train: a.train.clone(),
        };
        let gpu = crate::cost::gpu(&m.train.device);
        if gpu.is_some_and(|g| !g.has_tf32()) {
            m.no_tf32_by_default();
        }
        let Some(optimizer) = m.train.train.clone() else {
            return Err(Error::Usage("smelt fit needs the training step's optimizer: --train sgd, adam or adamw".into()));
        };
        if m.train.accumulate != 1 || m.train.remat_budget.is_some() || m.train.recipe.is_some() {
            return Err(Error::Usage(
                "smelt fit chooses the accumulation and the recomputation itself: leave out --accumulate, --remat-budget and --recipe"
                    .into(),
            ));
        }
        let precisions: Vec<Policy> = match a.precision.as_str() {
            "auto" => vec![Policy::F32, Policy::MixedBf16, Policy::MixedF16],
            p => vec![p.parse().map_err(Error::Usage)?],
        };
        if gpu.is_none() {
            return Err(Error::Usage(format!("unknown --device {}", m.train.device)));
        }
        let mut options = m.options()?;
        options.remat = None;
        let request = crate::fit::Request {
            spec: m.model.clone(),
            options,
            batch: a.batch,
            limit: a.memory_limit,
            precisions,
            loss_scale: m.train.loss_scale == "dynamic",
            gpus: a.gpus as usize,
            shard: crate::fit::Shard::parse(&a.shard).ok_or_else(|| Error::Usage(format!("unknown --shard {}", a.shard)))?,
            solver: crate::RematSolver::parse(&m.train.remat_solver).unwrap_or_default(),
        };
        Ok((request, optimizer))
    }
}

/// `smelt fit`'s flags alone, as a command line.
#[derive(Parser)]
#[command(name = "smelt fit", no_binary_name = true)]
struct FitCommandLine {
    #[command(flatten)]
    fit: FitArgs,
}

impl FitArgs {
    /// Parses `[MODEL, --flag, value, ...]` as `smelt fit` does.
    pub fn parse_from<I: IntoIterator<Item = String>>(argv: I) -> Result<FitArgs, Error> {
        FitCommandLine::try_parse_from(argv).map(|c| c.fit).map_err(clap_error)
    }
}

/// A clap error as a usage error with clap's message, less its `error: `
/// and its pointer to `--help`.
fn clap_error(e: clap::Error) -> Error {
    let text = e.render().to_string();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("For more information")).collect();
    Error::Usage(lines.join("\n").trim().trim_start_matches("error: ").to_string())
}

/// The model flags alone, as a command line (for the Python package).
#[derive(Parser)]
#[command(name = "smelt", no_binary_name = true)]
struct ModelCommandLine {
    #[command(flatten)]
    model: ModelArgs,
}

impl ModelArgs {
    /// Parses `[MODEL, --flag, value, ...]` as every command's model flags
    /// do; clap's message (what is wrong, the values allowed) on error.
    pub fn parse_from<I: IntoIterator<Item = String>>(argv: I) -> Result<ModelArgs, Error> {
        ModelCommandLine::try_parse_from(argv).map(|c| c.model).map_err(clap_error)
    }

    /// Opens the model (import and verify), with the values of a text
    /// file's constants filled when `values` ([`crate::Session::fill_weights`]).
    pub fn open(&self, values: bool) -> Result<crate::Session, Error> {
        if self.model.is_empty() {
            return Err(usage!("the model path is empty: give an .onnx or .tir file, or zoo:NAME"));
        }
        let mut s = crate::Session::open(&self.model, self.options()?)?;
        if values {
            s.fill_weights()?;
        }
        Ok(s)
    }
}
