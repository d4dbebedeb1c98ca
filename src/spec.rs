//! What to open and how: the typed options every command and the Python
//! package build ([`ModelSpec`], its training step's [`StepSpec`], `smelt
//! fit`'s [`FitSpec`]). The command line converts its flags into these
//! (`src/cli.rs` of the binary), Python its keyword arguments; both are
//! checked here, so the two accept and refuse the same things.

use crate::Error;
use smelt_codegen::cost::Gpu;
use smelt_passes::precision::Policy;
use std::path::{Path, PathBuf};

/// `Error::Usage` from a format string.
macro_rules! usage {
    ($($t:tt)*) => { Error::Usage(format!($($t)*)) };
}

/// A value chosen by name from a fixed list (an option's choices).
pub trait Choice: Copy + PartialEq + Sized + 'static {
    /// What the option is called in messages (`optimizer`, `loss`...).
    const WHAT: &'static str;
    /// Every value with its name.
    const CHOICES: &'static [(&'static str, Self)];

    /// Every name, in order.
    fn names() -> impl Iterator<Item = &'static str> {
        Self::CHOICES.iter().map(|c| c.0)
    }

    /// Its name.
    fn name(self) -> &'static str {
        Self::CHOICES.iter().find(|c| c.1 == self).expect("every value is listed").0
    }

    /// The value named `s`, or a message listing the names.
    fn parse(s: &str) -> Result<Self, String> {
        Self::CHOICES.iter().find(|c| c.0 == s).map(|c| c.1).ok_or_else(|| {
            let names: Vec<&str> = Self::names().collect();
            format!("unknown {} {s:?}: one of {}", Self::WHAT, names.join(", "))
        })
    }
}

/// The training step's optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    /// torch.optim.SGD.
    Sgd,
    /// torch.optim.Adam.
    Adam,
    /// torch.optim.AdamW.
    AdamW,
}

impl Choice for OptimizerKind {
    const WHAT: &'static str = "optimizer";
    const CHOICES: &'static [(&'static str, Self)] =
        &[("sgd", OptimizerKind::Sgd), ("adam", OptimizerKind::Adam), ("adamw", OptimizerKind::AdamW)];
}

/// The training step's loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossKind {
    /// Cross-entropy when the output is logits [N, C], squared error otherwise.
    #[default]
    Auto,
    /// Cross-entropy against int64 labels.
    CrossEntropy,
    /// A causal language model's shifted cross-entropy.
    CausalLm,
    /// Mean squared error against f32 targets.
    MeanSquaredError,
}

impl Choice for LossKind {
    const WHAT: &'static str = "loss";
    const CHOICES: &'static [(&'static str, Self)] =
        &[("auto", LossKind::Auto), ("ce", LossKind::CrossEntropy), ("causal-lm", LossKind::CausalLm), ("mse", LossKind::MeanSquaredError)];
}

/// What batch norms do in a training step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchNormMode {
    /// As exported: running statistics normalize.
    #[default]
    Frozen,
    /// Batch statistics, as `model.train()`.
    Train,
}

impl Choice for BatchNormMode {
    const WHAT: &'static str = "batch norm mode";
    const CHOICES: &'static [(&'static str, Self)] = &[("frozen", BatchNormMode::Frozen), ("train", BatchNormMode::Train)];
}

/// Loss scaling under f16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossScale {
    /// torch.amp.GradScaler's dynamic scale.
    #[default]
    Dynamic,
    /// None.
    None,
}

impl Choice for LossScale {
    const WHAT: &'static str = "loss scaling";
    const CHOICES: &'static [(&'static str, Self)] = &[("dynamic", LossScale::Dynamic), ("none", LossScale::None)];
}

impl Choice for crate::RematSolver {
    const WHAT: &'static str = "recomputation solver";
    const CHOICES: &'static [(&'static str, Self)] = &[("greedy", crate::RematSolver::Greedy), ("exact", crate::RematSolver::Exact)];
}

impl Choice for crate::fit::Shard {
    const WHAT: &'static str = "shard stage";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("none", crate::fit::Shard::None),
        ("optimizer", crate::fit::Shard::Optimizer),
        ("gradients", crate::fit::Shard::Gradients),
        ("parameters", crate::fit::Shard::Parameters),
    ];
}

/// The GPU named `name` (`h100`, `a100`...), or a message listing them.
pub fn gpu_named(name: &str) -> Result<Gpu, String> {
    crate::cost::gpu(name).ok_or_else(|| format!("unknown device {name:?}: one of {}", crate::cost::GPU_NAMES.join(", ")))
}

/// The names of the initializers to train, one a line, from `file` (as
/// PyTorch lists them; `#` starts a comment line): at most 16 MiB of UTF-8
/// text with at least one name; anything else is refused, naming the file.
pub fn read_names(file: &Path) -> Result<Vec<String>, Error> {
    use std::io::Read as _;
    const LIMIT: u64 = 16 << 20;
    let bad = |what: String| usage!("--trainable {}: {what}", file.display());
    let mut bytes = Vec::new();
    std::fs::File::open(file).and_then(|h| h.take(LIMIT + 1).read_to_end(&mut bytes)).map_err(|e| bad(e.to_string()))?;
    if bytes.len() as u64 > LIMIT {
        return Err(bad(format!("over {} MiB: a list of names is much smaller", LIMIT >> 20)));
    }
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text (one initializer name a line)".into()))?;
    let names: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect();
    if names.is_empty() {
        return Err(bad("no names in it (one initializer name a line)".into()));
    }
    Ok(names)
}

/// Parses `NAME=N` (a `--dim`).
pub fn dim_size(s: &str) -> Result<(String, usize), String> {
    let (name, n) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=N (e.g. sequence=512)"))?;
    let n: usize = n.trim().parse().map_err(|_| format!("{n:?} is not a size"))?;
    check_dim(name, n)?;
    Ok((name.to_string(), n))
}

/// A named dimension needs a name and a size of at least 1.
pub fn check_dim(name: &str, n: usize) -> Result<(), String> {
    if name.is_empty() || n == 0 {
        return Err(format!("{name}={n}: needs a name and a size of at least 1"));
    }
    Ok(())
}

/// Parses `NAME=VALUES` (a `--set`: comma-separated numbers).
pub fn set_value(s: &str) -> Result<(String, Vec<f64>), String> {
    let (name, v) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=VALUES (e.g. shape=1,-1)"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: needs the name of a graph input"));
    }
    let values = v.split(',').filter(|x| !x.trim().is_empty());
    let values = values.map(|x| x.trim().parse::<f64>().map_err(|_| format!("{x:?} is not a number"))).collect::<Result<_, _>>()?;
    Ok((name.to_string(), values))
}

/// Which model to open and how to compile it (the flags every command
/// shares; `smelt --help` says what each does).
#[derive(Clone, Debug)]
pub struct ModelSpec {
    /// Path to .onnx or .tir, or zoo:NAME.
    pub model: String,
    /// Batch size, replacing the exported one.
    pub batch: Option<usize>,
    /// Sizes of named symbolic dimensions.
    pub dims: Vec<(String, usize)>,
    /// Values of graph inputs needed at compile time, row-major.
    pub set: Vec<(String, Vec<f64>)>,
    /// Fusion off everywhere.
    pub no_fuse: bool,
    /// The precision policy.
    pub precision: Policy,
    /// Op types or node names kept in f32 under a reduced precision.
    pub keep_f32: Vec<String>,
    /// TF32 for f32 products (`None`: convolutions, the GPU's default).
    pub tf32: Option<smelt_ir::Tf32>,
    /// Split execution for the smallest arena.
    pub min_memory: bool,
    /// The memory limit that splitting aims at.
    pub split_limit: Option<usize>,
    /// A tuning table written by `smelt tune`.
    pub tuning: Option<PathBuf>,
    /// How tiles are chosen, overriding `tuning` (set by `smelt tune`).
    pub tiles: Option<smelt_codegen::TileChoice>,
    /// The training step, if any.
    pub train: StepSpec,
}

/// What makes the compiled graph a training step (`optimizer` given, or a
/// recipe that names one), and the GPU that prices it.
#[derive(Clone, Debug)]
pub struct StepSpec {
    /// The optimizer: no training step without one (or a recipe).
    pub optimizer: Option<OptimizerKind>,
    /// The loss.
    pub loss: LossKind,
    /// The output the loss reads (default: the only one).
    pub loss_on: Option<String>,
    /// The cross-entropy's label smoothing, in [0, 1).
    pub label_smoothing: Option<f32>,
    /// Learning rate (default 0.01 for SGD, 0.001 for Adam and AdamW).
    pub lr: Option<f32>,
    /// SGD's momentum (default 0).
    pub momentum: Option<f32>,
    /// Nesterov momentum (SGD).
    pub nesterov: bool,
    /// Weight decay (default 0.01 for AdamW, 0 otherwise).
    pub weight_decay: Option<f32>,
    /// Micro-batches per optimizer step (at least 1).
    pub accumulate: u32,
    /// A cosine learning-rate decay over this many steps.
    pub cosine: Option<usize>,
    /// Steps of linear warmup (with `cosine`).
    pub warmup: usize,
    /// Gradient clipping by the global L2 norm.
    pub clip_norm: Option<f32>,
    /// What batch norms do.
    pub batch_norm: BatchNormMode,
    /// Loss scaling under f16.
    pub loss_scale: LossScale,
    /// Initializers kept fixed (names, `*` any characters).
    pub freeze: Vec<String>,
    /// Exactly these initializers are trained (names, as PyTorch lists them).
    pub trainable: Vec<String>,
    /// Exactly the initializers matching these are trained (`*` any characters).
    pub train_only: Vec<String>,
    /// Recompute saved activations until the arena is at most this.
    pub remat_budget: Option<usize>,
    /// What chooses the recomputed values.
    pub remat_solver: crate::RematSolver,
    /// The GPU whose roofline chooses tiles and prices recomputation
    /// (`None`: the H100).
    pub device: Option<Gpu>,
    /// A recipe of `smelt fit` that fixes batch, accumulation, precision,
    /// optimizer, recomputation, dimensions and device.
    pub recipe: Option<PathBuf>,
}

impl Default for StepSpec {
    fn default() -> StepSpec {
        StepSpec {
            optimizer: None,
            loss: LossKind::Auto,
            loss_on: None,
            label_smoothing: None,
            lr: None,
            momentum: None,
            nesterov: false,
            weight_decay: None,
            accumulate: 1,
            cosine: None,
            warmup: 0,
            clip_norm: None,
            batch_norm: BatchNormMode::Frozen,
            loss_scale: LossScale::Dynamic,
            freeze: Vec::new(),
            trainable: Vec::new(),
            train_only: Vec::new(),
            remat_budget: None,
            remat_solver: crate::RematSolver::Greedy,
            device: None,
            recipe: None,
        }
    }
}

impl StepSpec {
    /// The GPU that prices the step (the H100 unless `device` says).
    pub fn gpu(&self) -> Gpu {
        self.device.unwrap_or_default()
    }

    /// The options given that only a training step takes.
    fn step_options(&self) -> Vec<&'static str> {
        let d = StepSpec::default();
        let given = [
            ("loss", self.loss != d.loss),
            ("loss_on", self.loss_on.is_some()),
            ("label_smoothing", self.label_smoothing.is_some()),
            ("lr", self.lr.is_some()),
            ("momentum", self.momentum.is_some()),
            ("nesterov", self.nesterov),
            ("weight_decay", self.weight_decay.is_some()),
            ("accumulate", self.accumulate != 1),
            ("cosine", self.cosine.is_some()),
            ("warmup", self.warmup != 0),
            ("clip_norm", self.clip_norm.is_some()),
            ("batch_norm", self.batch_norm != d.batch_norm),
            ("loss_scale", self.loss_scale != d.loss_scale),
            ("freeze", !self.freeze.is_empty()),
            ("trainable", !self.trainable.is_empty()),
            ("train_only", !self.train_only.is_empty()),
            ("remat_budget", self.remat_budget.is_some()),
            ("remat_solver", self.remat_solver != d.remat_solver),
        ];
        given.iter().filter(|g| g.1).map(|g| g.0).collect()
    }

    /// The training configuration, when an optimizer is given; an option
    /// of the step without one is refused, naming it.
    pub fn config(&self) -> Result<Option<smelt_passes::train::TrainConfig>, Error> {
        use smelt_ir::Optimizer;
        use smelt_passes::train::{Loss, TrainConfig};
        let Some(opt) = self.optimizer else {
            return match self.step_options().as_slice() {
                // A recipe names the optimizer; a command that does not
                // apply recipes (compile, run) compiles the forward pass.
                _ if self.recipe.is_some() => Ok(None),
                [] => Ok(None),
                given => Err(usage!("{} configure a training step: give its optimizer (sgd, adam or adamw)", given.join(", "))),
            };
        };
        if self.accumulate == 0 {
            return Err(usage!("accumulate must be at least 1"));
        }
        let wd = self.weight_decay.unwrap_or(if opt == OptimizerKind::AdamW { 0.01 } else { 0.0 });
        let schedule = match (self.cosine, self.warmup) {
            (Some(total), w) if w < total => smelt_ir::Schedule { warmup: w, total },
            (Some(total), w) => return Err(usage!("--warmup {w} must be shorter than --cosine {total}")),
            (None, 0) => smelt_ir::Schedule::default(),
            (None, _) => return Err(usage!("--warmup needs --cosine STEPS (the schedule's length)")),
        };
        let optimizer = match opt {
            OptimizerKind::Sgd => Optimizer::Sgd {
                lr: self.lr.unwrap_or(0.01),
                momentum: self.momentum.unwrap_or(0.0),
                dampening: 0.0,
                nesterov: self.nesterov,
                weight_decay: wd,
                accumulate: self.accumulate as usize,
                schedule,
            },
            OptimizerKind::Adam | OptimizerKind::AdamW => Optimizer::Adam {
                lr: self.lr.unwrap_or(1e-3),
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: wd,
                decoupled: opt == OptimizerKind::AdamW,
                accumulate: self.accumulate as usize,
                schedule,
            },
        };
        if self.nesterov && (opt != OptimizerKind::Sgd || self.momentum.unwrap_or(0.0) == 0.0) {
            return Err(usage!("--nesterov needs --train sgd with a non-zero --momentum"));
        }
        if let (Some(m), true) = (self.momentum, opt != OptimizerKind::Sgd) {
            return Err(usage!(
                "--momentum {m} is SGD's: {} keeps moving averages with betas (0.9, 0.999), as torch.optim.{} does; drop --momentum or use --train sgd",
                opt.name(),
                if opt == OptimizerKind::Adam { "Adam" } else { "AdamW" }
            ));
        }
        let smoothing = self.label_smoothing.unwrap_or(0.0);
        let loss = match self.loss {
            LossKind::MeanSquaredError if self.label_smoothing.is_some() => {
                return Err(usage!("--label-smoothing is the cross-entropy's: --loss mse has no labels to smooth"))
            }
            LossKind::MeanSquaredError => Loss::MeanSquaredError,
            LossKind::CrossEntropy => Loss::CrossEntropy { smoothing },
            LossKind::CausalLm => Loss::CausalLm { smoothing },
            LossKind::Auto => Loss::Auto { smoothing },
        };
        let batch_norm = match self.batch_norm {
            BatchNormMode::Train => smelt_passes::train::BatchNorm::Train { momentum: 0.1 },
            BatchNormMode::Frozen => smelt_passes::train::BatchNorm::Frozen,
        };
        if self.clip_norm.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
            return Err(usage!("--clip-norm must be a positive number"));
        }
        let mut only = self.train_only.clone();
        only.extend(self.trainable.iter().cloned());
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

impl ModelSpec {
    /// `model` with every option at its default: the forward pass, f32,
    /// fused, at the exported batch.
    pub fn new(model: impl Into<String>) -> ModelSpec {
        ModelSpec {
            model: model.into(),
            batch: None,
            dims: Vec::new(),
            set: Vec::new(),
            no_fuse: false,
            precision: Policy::F32,
            keep_f32: Vec::new(),
            tf32: None,
            min_memory: false,
            split_limit: None,
            tuning: None,
            tiles: None,
            train: StepSpec::default(),
        }
    }

    /// Exact f32 unless `tf32` says otherwise: for targets without TF32
    /// (the CPU backend, architectures below compute_80, a V100).
    pub fn no_tf32_by_default(&mut self) {
        self.tf32.get_or_insert(smelt_ir::Tf32::Off);
    }

    /// What the kernels are compiled for: the step's GPU, tiles as the
    /// tuning table (or `smelt tune`) says.
    pub fn target(&self) -> Result<smelt_codegen::Target, Error> {
        Ok(smelt_codegen::Target {
            gpu: self.train.gpu(),
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
        for (name, n) in &self.dims {
            check_dim(name, *n).map_err(Error::Usage)?;
        }
        let train = self.train.config()?.map(|mut t| {
            t.loss_scale = matches!(self.precision, Policy::F16 | Policy::MixedF16) && self.train.loss_scale == LossScale::Dynamic;
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
            remat: self.train.remat_budget.map(|budget| crate::Remat { budget, target: target.clone(), solver: self.train.remat_solver }),
            split: if self.min_memory {
                Some(smelt_passes::split::Goal::Minimum)
            } else {
                self.split_limit.map(smelt_passes::split::Goal::Limit)
            },
            target,
        })
    }

    /// Takes batch, accumulation, precision, optimizer, recomputation,
    /// dimensions and device from the step's recipe, if it has one; those
    /// options given beside it are refused.
    pub fn apply_recipe(&mut self) -> Result<(), Error> {
        let Some(path) = self.train.recipe.clone() else { return Ok(()) };
        let t = &self.train;
        let beside = [
            ("batch", self.batch.is_some()),
            ("dims", !self.dims.is_empty()),
            ("precision", self.precision != Policy::F32),
            ("accumulate", t.accumulate != 1),
            ("remat_budget", t.remat_budget.is_some()),
            ("remat_solver", t.remat_solver != crate::RematSolver::Greedy),
            ("device", t.device.is_some()),
        ];
        let beside: Vec<&str> = beside.iter().filter(|b| b.1).map(|b| b.0).collect();
        if !beside.is_empty() {
            return Err(usage!("{}: the recipe fixes {}: leave them out", path.display(), beside.join(", ")));
        }
        let r = crate::fit::Recipe::load(&path)?;
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
        if name(&r.model) != name(&self.model) && Path::new(&r.model).file_name() != Path::new(&self.model).file_name() {
            return Err(usage!("{}: the recipe was made for {}, not {}", path.display(), r.model, self.model));
        }
        let optimizer = OptimizerKind::parse(&r.optimizer).map_err(|e| usage!("{}: {e}", path.display()))?;
        match self.train.optimizer {
            Some(o) if o != optimizer => {
                return Err(usage!("{}: the recipe was made for --train {}, not {}", path.display(), r.optimizer, o.name()))
            }
            _ => self.train.optimizer = Some(optimizer),
        }
        self.dims = r.dims.clone();
        self.batch = Some(r.batch);
        self.train.accumulate =
            u32::try_from(r.accumulate).map_err(|_| usage!("{}: accumulate {} is too large", path.display(), r.accumulate))?;
        self.precision = r.precision.parse().map_err(|e: String| Error::Usage(e))?;
        self.train.remat_budget = r.remat_budget;
        self.train.remat_solver = r.remat_solver;
        self.train.device = Some(gpu_named(&r.device).map_err(|e| usage!("{}: {e}", path.display()))?);
        Ok(())
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

/// `smelt fit`'s question: the model, its whole batch, the training step
/// and the memory limit (what the search chooses is not in it).
#[derive(Clone, Debug)]
pub struct FitSpec {
    /// The model with its dimensions, compile-time inputs, kept-f32
    /// patterns, TF32, tuning table and training step (its optimizer
    /// required; accumulation, recomputation and recipe refused: the search
    /// chooses them). Its batch and precision are ignored.
    pub model: ModelSpec,
    /// The whole batch of an optimizer step.
    pub batch: usize,
    /// Device memory the step may use.
    pub memory_limit: usize,
    /// The precisions to search (the fastest wins; the first on a tie).
    pub precisions: Vec<Policy>,
    /// GPUs of data parallelism.
    pub gpus: usize,
    /// What they shard.
    pub shard: crate::fit::Shard,
}

impl FitSpec {
    /// The precisions `name` searches: `auto` (f32, mixed-bf16, mixed-f16)
    /// or one policy.
    pub fn precisions_named(name: &str) -> Result<Vec<Policy>, Error> {
        match name {
            "auto" => Ok(vec![Policy::F32, Policy::MixedBf16, Policy::MixedF16]),
            p => Ok(vec![p.parse().map_err(|e: String| Error::Usage(format!("{e}, or auto")))?]),
        }
    }

    /// Checks the question: the search's request and the step's optimizer.
    pub fn request(&self) -> Result<(crate::fit::Request, String), Error> {
        let mut m = self.model.clone();
        m.batch = Some(self.batch);
        m.precision = Policy::F32;
        if !m.train.gpu().has_tf32() {
            m.no_tf32_by_default();
        }
        let Some(optimizer) = m.train.optimizer else {
            return Err(Error::Usage("smelt fit needs the training step's optimizer: --train sgd, adam or adamw".into()));
        };
        if m.train.accumulate != 1 || m.train.remat_budget.is_some() || m.train.recipe.is_some() {
            return Err(Error::Usage(
                "smelt fit chooses the accumulation and the recomputation itself: leave out --accumulate, --remat-budget and --recipe"
                    .into(),
            ));
        }
        if self.precisions.is_empty() || self.gpus == 0 || self.batch == 0 {
            return Err(usage!("smelt fit needs a batch, a precision and a GPU count of at least 1"));
        }
        let mut options = m.options()?;
        options.remat = None;
        let request = crate::fit::Request {
            spec: m.model.clone(),
            options,
            batch: self.batch,
            limit: self.memory_limit,
            precisions: self.precisions.clone(),
            loss_scale: m.train.loss_scale == LossScale::Dynamic,
            gpus: self.gpus,
            shard: self.shard,
            solver: m.train.remat_solver,
        };
        Ok((request, optimizer.name().to_string()))
    }
}
