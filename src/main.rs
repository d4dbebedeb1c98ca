//! The `smelt` command line: argument handling only. Each command lives in
//! `cmd/`; the compile order lives in the library's driver
//! ([`smelt::Session`]).

/// `print!` to standard output that returns a write error (a closed pipe,
/// a full disk) as [`StdoutError`] instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($t)*).map_err($crate::StdoutError)?
    }};
}

/// `eprintln!` that ignores a standard error that cannot be written (closed
/// by the caller): there is nowhere left to say anything.
macro_rules! errln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

/// `println!` that returns write errors, as [`out!`].
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($t)*).map_err($crate::StdoutError)?
    }};
}

mod cmd;

/// A tolerance: a finite number, zero or more (NaN would make every
/// comparison pass).
fn tolerance(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not a tolerance: give a finite number, 0 or more")),
        Err(e) => Err(e.to_string()),
    }
}

/// Standard output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
pub struct StdoutError(std::io::Error);

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// smelt compiles deep-learning models ahead of time so they fit in GPU
/// memory and run fast, and tells you where every byte goes.
///
/// MODEL is a path to an ONNX file (`.onnx`), a smelt text IR file (`.tir`),
/// or `zoo:NAME` for a built-in model with deterministic random weights
/// (`zoo:resnet50`, `zoo:mobilenet_v2`). With no command, smelt runs the
/// built-in default (zoo:resnet50) on the CPU and shows what it knows about it.
///
/// SMELT_LOG=debug logs each compiler pass's time and statistics to standard
/// error; SMELT_LOG=trace also the IR after each pass.
#[derive(Parser)]
#[command(
    version,
    about,
    long_about,
    after_help = "Examples:\n  smelt inspect model.onnx --batch 8\n  smelt compile model.onnx --dump-ir fuse\n  smelt compile model.onnx --batch 8 --out build/ --ptxas-stats\n  smelt plan model.onnx --batch 8 --svg memory.svg --memory-limit 6GiB\n  smelt plan model.onnx --batch 8 --precision mixed-f16\n  smelt run model.onnx --backend cuda --profile\n  smelt run model.onnx --backend emulator --check-kernels\n  smelt run model.onnx --input input_0.pb --expect output_0.pb\n  smelt print zoo:mobilenet_v2 > mobilenet.tir\n  smelt run mobilenet.tir --json\n  smelt train model.onnx --data train.npz --val val.npz --optimizer adam --batch 32 --epochs 5 --save trained.onnx\n  smelt fit model.onnx --train adam --batch 256 --memory-limit 16GiB --precision auto --save-recipe recipe.json\n  smelt train model.onnx --recipe recipe.json --data train.npz"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Show the op histogram before and the kernels after fusion, parameter
    /// bytes, naive activation bytes (every value in its own buffer) and the
    /// input and output shapes.
    Inspect(InspectArgs),
    /// Run the compiler's passes and print the IR after one of them.
    ///
    /// Passes, in order: dce, fuse (egg equality saturation: conv + batch
    /// norm + bias + activation + residual, gemm + activation), ew-cluster
    /// (elementwise chains into one kernel), reduce-fuse (elementwise
    /// prologues into pooling, reduce and softmax), concat (in-place
    /// concatenation), final-dce. Statistics of each pass go to standard error.
    ///
    /// With --out DIR (or --ptxas-stats), also generate code: every kernel of
    /// the fused, planned graph becomes CUDA C, compiled to PTX with NVRTC
    /// in parallel (cached on disk, in $SMELT_CACHE_DIR or
    /// ~/.cache/smelt/kernels). DIR receives kernels/NAME.cu and
    /// kernels/NAME.ptx, plan.json (kernel order, launch dimensions, each
    /// argument's offset in the arena or the weights blob, the weights
    /// layout), memory.json and memory.svg (the memory plan, as `smelt plan
    /// --json` and `--svg`), and with --weights the weights blob weights.bin.
    /// NVRTC is loaded at run time: put the lib folder of the PyPI wheel
    /// nvidia-cuda-nvrtc-cu12 on LD_LIBRARY_PATH and its headers' folder
    /// (nvidia-cuda-runtime-cu12's include) in SMELT_CUDA_INCLUDE.
    Compile(CompileArgs),
    /// Plan activation memory: a memory-aware schedule, liveness, and offsets
    /// in one arena, checked by an independent checker.
    ///
    /// Shows weights bytes, naive activation bytes (every value in its own
    /// buffer), the liveness lower bound of the chosen schedule, the arena,
    /// their ratios and the peak step with the largest tensors live there,
    /// with fusion and without. The arena holds every activation, graph
    /// inputs and outputs included; weights are separate.
    Plan(PlanArgs),
    /// Run the model on the CPU reference executor, or on a GPU with
    /// --backend cuda.
    ///
    /// With no --input, each float input is the ONNX backend runner's input:
    /// arange(n).reshape(shape) / n. With --expect, the outputs are compared
    /// like numpy.allclose and smelt exits with status 1 when any is out of
    /// tolerance. With --precision other than f32, the f32 graph runs too
    /// and the error against it is printed.
    Run(RunArgs),
    /// Print the model in smelt's text IR (weights by name, not values).
    Print(PrintArgs),
    /// Train the model on data: the compiled training step (forward, loss,
    /// backward, optimizer update) run on every batch, with the weights and
    /// optimizer state in device memory fixed before the first step.
    ///
    /// The data is an .npz (numpy.savez) with one array per model input
    /// (named as the input, or `x` for the only one) and the labels (`y` or
    /// `labels`: int64 or int32 class indices for --loss ce; `targets` or
    /// `y`, floats of the output's shape, for --loss mse), one row per
    /// sample. Every array is checked before the first step: shapes, dtypes,
    /// finite values, labels in range. Each epoch is shuffled by a
    /// generator seeded with --seed and the epoch; a last partial batch is
    /// dropped (the summary says how many samples).
    ///
    /// Backends: cpu (the kernel descriptions of the compiled program, from
    /// one arena and the persistent region: what a GPU runs, on the CPU),
    /// emulator (the generated CUDA C compiled for this CPU, every access
    /// checked) and cuda (GPU 0).
    Train(TrainCmdArgs),
    /// Find the fastest training recipe under a memory limit, statically:
    /// micro-batch (a divisor of --batch) with the matching gradient
    /// accumulation, precision (--precision auto tries f32, mixed-bf16 and
    /// mixed-f16) and which saved activations to recompute in backward.
    ///
    /// Every candidate is compiled and planned exactly as `smelt plan
    /// --train` would (its memory is the checked plan's arena plus the
    /// weights and optimizer state) and timed on --device's roofline
    /// (FLOPs, bytes moved, occupancy and launch overhead of each kernel):
    /// no device run. Prints the recipe, where its bytes go, the FLOPs
    /// recomputation adds and the recipes it beat; --save-recipe writes it
    /// for `smelt train --recipe` and `smelt plan --recipe`. When nothing
    /// fits, says what the smallest footprint is and what it holds (exit 2).
    Fit(FitArgs),
}

#[derive(Args)]
pub(crate) struct FitArgs {
    /// Path to .onnx or .tir, or zoo:NAME.
    pub(crate) model: String,
    /// The whole batch of an optimizer step; micro-batches divide it.
    #[arg(long)]
    pub(crate) batch: usize,
    /// Size of a named symbolic input dimension, as NAME=N (as `smelt plan`).
    #[arg(long = "dim", value_name = "NAME=N", value_parser = dim_size)]
    pub(crate) dims: Vec<(String, usize)>,
    /// Keep these in f32 under a reduced precision (as `smelt plan`).
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    pub(crate) keep_f32: Vec<String>,
    #[command(flatten)]
    pub(crate) train: TrainArgs,
    /// Device memory the step may use: activation arena plus weights,
    /// optimizer state and accumulators (B, KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
    pub(crate) memory_limit: usize,
    /// Precisions to search: auto (f32, mixed-bf16, mixed-f16; the fastest
    /// wins, f32 on a tie) or one policy.
    #[arg(long, default_value = "f32", value_parser = ["auto", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16"])]
    pub(crate) precision: String,
    /// Plan data parallelism over N GPUs: each runs batch / N samples per
    /// optimizer step, memory and time are per GPU, and the collectives
    /// are listed with their sizes. A plan: smelt trains on one GPU.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) gpus: u32,
    /// With --gpus: what the GPUs shard, as ZeRO's stages: none (all-reduce
    /// the gradients), optimizer (stage 1), gradients (stage 2: optimizer
    /// state and accumulators), parameters (stage 3: those and the weights,
    /// gathered a layer at a time).
    #[arg(long, default_value = "none", value_parser = smelt::fit::Shard::NAMES, requires = "gpus")]
    pub(crate) shard: String,
    /// Write the chosen recipe (JSON) for `smelt train --recipe` and `smelt plan --recipe`.
    #[arg(long, value_name = "FILE.json")]
    pub(crate) save_recipe: Option<PathBuf>,
    /// Print JSON instead of text (no progress).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct CompileArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Print the IR after this pass (default: after the last).
    #[arg(long, value_name = "PASS", value_parser = clap::builder::PossibleValuesParser::new(smelt_passes::pipeline::PASSES))]
    pub(crate) dump_ir: Option<String>,
    /// Print the pass statistics (or, with --out, a summary) as JSON on standard output.
    #[arg(long)]
    pub(crate) json: bool,
    /// Generate and compile the kernels into DIR.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// NVRTC target: a virtual architecture gives PTX the driver JIT-compiles for newer GPUs.
    #[arg(long, default_value = smelt_codegen::nvrtc::DEFAULT_ARCH, value_parser = ["compute_70", "compute_75", "compute_80", "compute_86", "compute_89", "compute_90"])]
    pub(crate) arch: String,
    /// Assemble each kernel with ptxas ($SMELT_PTXAS or on PATH; PyPI nvidia-cuda-nvcc-cu12) and print registers and spills.
    #[arg(long)]
    pub(crate) ptxas_stats: bool,
    /// The ptxas target for --ptxas-stats.
    #[arg(long, default_value = smelt_codegen::ptxas::DEFAULT_SM)]
    pub(crate) sm: String,
    /// Also write the weights blob (DIR/weights.bin, laid out as plan.json says).
    #[arg(long, requires = "out")]
    pub(crate) weights: bool,
    /// Compile with this many threads (default: one per core).
    #[arg(long, short = 'j')]
    pub(crate) jobs: Option<usize>,
}

#[derive(Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Print JSON instead of text (fields documented in docs/guide.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw live bytes per step and the arena layout to FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub(crate) svg: Option<PathBuf>,
    /// Fail when the arena exceeds SIZE (B, KiB, MiB, GiB, KB, MB, GB; e.g. 6GiB).
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
    pub(crate) memory_limit: Option<usize>,
    /// Print the time of each phase (import, passes, planning, check).
    #[arg(long)]
    pub(crate) timings: bool,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// An input tensor (ONNX TensorProto .pb file), one per graph input, in order.
    #[arg(long = "input", value_name = "FILE.pb")]
    pub(crate) inputs: Vec<PathBuf>,
    /// An expected output (TensorProto .pb file), one per graph output, in order.
    #[arg(long = "expect", value_name = "FILE.pb")]
    pub(crate) expects: Vec<PathBuf>,
    /// Relative tolerance for --expect.
    #[arg(long, default_value_t = 1e-3, value_parser = tolerance)]
    pub(crate) rtol: f64,
    /// Absolute tolerance for --expect.
    #[arg(long, default_value_t = 1e-7, value_parser = tolerance)]
    pub(crate) atol: f64,
    /// Write each output as DIR/output_<i>.pb.
    #[arg(long, value_name = "DIR")]
    pub(crate) save_outputs: Option<PathBuf>,
    /// Where to run: cpu (the reference executor, op by op), cuda
    /// (generated kernels on GPU 0, one arena of the planned size; needs an
    /// NVIDIA driver and NVRTC or a warm kernel cache) or emulator (the same
    /// program, the same generated CUDA C compiled for this CPU by the host
    /// C++ compiler, `c++` or $SMELT_CXX: every launch, offset and
    /// parameter as on a GPU, every memory access checked against its
    /// argument; for debugging kernels without a GPU).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda", "emulator"])]
    pub(crate) backend: String,
    /// With --backend cuda or emulator: check every kernel against its
    /// description's CPU run on the same operands (read back from the
    /// device before the launch) and list those that disagree beyond
    /// --kernel-rtol of their output's range.
    #[arg(long)]
    pub(crate) check_kernels: bool,
    /// Tolerance of --check-kernels, relative to each output's largest
    /// magnitude (one unit in the last place of a half output is allowed
    /// besides).
    #[arg(long, default_value_t = 1e-5, value_parser = tolerance)]
    pub(crate) kernel_rtol: f64,
    /// Under a reduced --precision with --backend cuda or emulator, also run
    /// the f32 graph on the CPU reference executor and report the error
    /// against it (always done with --backend cpu).
    #[arg(long)]
    pub(crate) against_f32: bool,
    /// With --backend cuda: synchronise after every launch, so that a
    /// device fault names its kernel (slower; also SMELT_CUDA_SYNC=1).
    #[arg(long)]
    pub(crate) sync: bool,
    /// With --backend cuda or emulator: time each kernel (CUDA events, or
    /// the host clock) and print its share, bandwidth and FLOP rate. With
    /// --train the profiled run is one more step, after the reported one.
    #[arg(long)]
    pub(crate) profile: bool,
    /// With --backend cuda: timed runs after one warm-up (the emulator
    /// runs once).
    #[arg(long, default_value_t = 20)]
    pub(crate) repeat: usize,
    /// Refuse to run when the activation arena exceeds SIZE (as `smelt plan --memory-limit`).
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
    pub(crate) memory_limit: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct TrainCmdArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The training data (.npz): one array per model input (named as the
    /// input, or `x` when there is one) and the labels (`y`), one row per
    /// sample. `synthetic[:N]` generates N samples (default 2048) of a
    /// separable task for a classifier, from --seed.
    #[arg(long, value_name = "FILE.npz")]
    pub(crate) data: PathBuf,
    /// Validation data (.npz or synthetic[:N], as --data): loss and accuracy
    /// of the forward pass with the trained weights after each epoch and at
    /// the end. Synthetic validation samples are drawn apart from the
    /// training ones, from the same task.
    #[arg(long, value_name = "FILE.npz")]
    pub(crate) val: Option<PathBuf>,
    /// Passes over the data (default 1).
    #[arg(long, conflicts_with = "steps")]
    pub(crate) epochs: Option<usize>,
    /// Optimizer steps in all (across epochs; counted from the start when resuming).
    #[arg(long)]
    pub(crate) steps: Option<usize>,
    /// Where to run: cpu (the compiled program's kernel descriptions),
    /// emulator (its CUDA C on the CPU) or cuda (GPU 0).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "emulator", "cuda"])]
    pub(crate) backend: String,
    /// Refuse to start when the step's device memory (activation arena +
    /// weights and optimizer state) exceeds SIZE, before allocating anything.
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
    pub(crate) memory_limit: Option<usize>,
    /// Write the model with the trained weights (and batch-norm running
    /// statistics) as its initializers: same graph, same names.
    #[arg(long, value_name = "FILE.onnx")]
    pub(crate) save: Option<PathBuf>,
    /// Keep a checkpoint in DIR (checkpoint.npz: parameters, optimizer
    /// state, step counter; checkpoint.json: step, seed, options), written
    /// every --every steps and at the end.
    #[arg(long, value_name = "DIR")]
    pub(crate) checkpoint: Option<PathBuf>,
    /// Steps between checkpoints.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) every: Option<u64>,
    /// Continue from the checkpoint in DIR (made with the same options):
    /// the weights are those an uninterrupted run reaches.
    #[arg(long, value_name = "DIR")]
    pub(crate) resume: Option<PathBuf>,
    /// Seed of the data order.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Take the samples in file order every epoch.
    #[arg(long)]
    pub(crate) no_shuffle: bool,
    /// Write one JSON line per step (step, epoch, loss, ms, samples/s) and the summary last.
    #[arg(long, value_name = "FILE")]
    pub(crate) log_json: Option<PathBuf>,
    /// Print the summary as JSON (no progress bar).
    #[arg(long)]
    pub(crate) json: bool,
    /// Make optimizer step N's gradients overflow (an infinite loss scale),
    /// to see the step skipped (tests of loss scaling).
    #[arg(long, value_name = "N", hide = true)]
    pub(crate) inject_overflow: Option<usize>,
}

#[derive(Args)]
pub(crate) struct PrintArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Write to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
}

/// Parses `--dim NAME=N`.
fn dim_size(s: &str) -> Result<(String, usize), String> {
    let (name, n) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=N (e.g. sequence=512)"))?;
    let n: usize = n.trim().parse().map_err(|_| format!("{n:?} is not a size"))?;
    if name.is_empty() || n == 0 {
        return Err(format!("{s:?}: needs a name and a size of at least 1"));
    }
    Ok((name.to_string(), n))
}

#[derive(Args, Clone)]
pub(crate) struct ModelArgs {
    /// Path to .onnx or .tir, or zoo:NAME.
    pub(crate) model: String,
    /// Batch size, replacing the exported one (also inside Reshape targets
    /// that hard-code it).
    #[arg(long)]
    pub(crate) batch: Option<usize>,
    /// Size of a named symbolic input dimension, as NAME=N (`--dim
    /// sequence=512`); repeatable. A symbolic first dimension is the batch
    /// (--batch, default 1); any other needs --dim. The zoo transformers
    /// take `--dim sequence=N` (default 128).
    #[arg(long = "dim", value_name = "NAME=N", value_parser = dim_size)]
    pub(crate) dims: Vec<(String, usize)>,
    /// Turn fusion off everywhere (for comparison).
    #[arg(long)]
    pub(crate) no_fuse: bool,
    /// Precision policy: f32 (as imported), f16 or bf16 (every float op),
    /// mixed-f16 or mixed-bf16 (half storage and compute with f32
    /// accumulation; f32 kept for softmax, normalization, reductions, the
    /// final classifier layer and --keep-f32). Graph inputs and outputs stay f32.
    #[arg(long, default_value = "f32", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt_passes::precision::Policy::NAMES), |s| s.parse::<smelt_passes::precision::Policy>().expect("listed")))]
    pub(crate) precision: smelt_passes::precision::Policy,
    /// Keep these in f32 under a reduced precision: an op type (softmax,
    /// conv, gemm...) or a node name, `*` matching any characters. Repeatable.
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    pub(crate) keep_f32: Vec<String>,
    #[command(flatten)]
    pub(crate) train: TrainArgs,
}

/// What makes a command work on a training step instead of the forward pass.
#[derive(Args, Clone, Default)]
#[command(next_help_heading = "Training (a whole step: forward, loss, backward, optimizer update)")]
#[command(group(clap::ArgGroup::new("step").args(["train", "recipe"]).multiple(true)))]
pub(crate) struct TrainArgs {
    /// Compile one training step with this optimizer: sgd (momentum 0.9
    /// unless --momentum), adam or adamw. Trained: every float initializer
    /// that is a conv, gemm or matmul weight, a norm's scale or bias, or a
    /// bias added to a layer (and a text model's `param`s), except --freeze.
    #[arg(long, visible_alias = "optimizer", value_name = "OPTIMIZER", value_parser = ["sgd", "adam", "adamw"])]
    pub(crate) train: Option<String>,
    /// The loss: ce (cross-entropy on logits against int64 labels, input
    /// `labels`), mse (against f32 targets of the output's shape, input
    /// `targets`) or auto (ce when the output is logits [N, C], mse
    /// otherwise). A model ending in Softmax is trained on its input.
    #[arg(long, default_value = "auto", value_parser = ["auto", "ce", "mse"], requires = "step")]
    pub(crate) loss: String,
    /// The output the loss reads (default: the only one).
    #[arg(long, value_name = "OUTPUT", requires = "step")]
    pub(crate) loss_on: Option<String>,
    /// Label smoothing of the cross-entropy, in [0, 1).
    #[arg(long, default_value_t = 0.0, requires = "step")]
    pub(crate) label_smoothing: f32,
    /// Learning rate (default 0.01 for sgd, 0.001 for adam and adamw).
    #[arg(long, requires = "step")]
    pub(crate) lr: Option<f32>,
    /// SGD's momentum (0: no momentum buffers).
    #[arg(long, default_value_t = 0.9, requires = "step")]
    pub(crate) momentum: f32,
    /// Nesterov momentum (sgd).
    #[arg(long, requires = "step")]
    pub(crate) nesterov: bool,
    /// Weight decay: added to the gradient (sgd, adam) or decoupled (adamw,
    /// default 0.01 there).
    #[arg(long, requires = "step")]
    pub(crate) weight_decay: Option<f32>,
    /// Gradient accumulation: K micro-batches of batch/K per update (the
    /// plan is the micro-step's; the accumulators are persistent).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), requires = "step")]
    pub(crate) accumulate: u32,
    /// Learning-rate schedule: a cosine decay to 0 over this many optimizer
    /// steps, after --warmup steps of linear warmup (Hugging Face's
    /// cosine-with-warmup). Default: constant.
    #[arg(long, value_name = "STEPS", requires = "step")]
    pub(crate) cosine: Option<usize>,
    /// Steps of linear learning-rate warmup (with --cosine).
    #[arg(long, value_name = "STEPS", default_value_t = 0, requires = "step")]
    pub(crate) warmup: usize,
    /// Clip the gradients by their global L2 norm (PyTorch's
    /// clip_grad_norm_): every gradient is kept until all are computed.
    #[arg(long, value_name = "MAX_NORM", requires = "step")]
    pub(crate) clip_norm: Option<f32>,
    /// Batch norm: frozen (as exported: running statistics normalize, scale
    /// and bias train) or train (batch statistics; the running statistics
    /// follow them with PyTorch's momentum 0.1, as `model.train()`).
    #[arg(long, default_value = "frozen", value_parser = ["frozen", "train"], requires = "step")]
    pub(crate) batch_norm: String,
    /// Loss scaling under --precision f16 or mixed-f16: dynamic (the
    /// gradients of a scaled loss, unscaled before the update; a step whose
    /// gradients overflow is skipped and the scale halved, and it doubles
    /// after 2000 clean steps, as torch.amp.GradScaler) or none. bf16 and
    /// f32 need none.
    #[arg(long, default_value = "dynamic", value_parser = ["dynamic", "none"], requires = "step")]
    pub(crate) loss_scale: String,
    /// Keep these initializers fixed: names, `*` matching any characters. Repeatable.
    #[arg(long = "freeze", value_name = "PATTERN", requires = "step")]
    pub(crate) freeze: Vec<String>,
    /// Recompute saved activations in the backward pass, instead of keeping
    /// them from the forward pass, until the step's activation arena is at
    /// most SIZE: the values cheapest to recompute per byte saved (on
    /// --device's roofline) at the peak first. `smelt fit` chooses SIZE.
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size, requires = "step")]
    pub(crate) remat_budget: Option<usize>,
    /// What chooses the recomputed values: greedy (the cheapest per byte at
    /// the peak, first; fast, and a smaller budget never gives a larger
    /// arena or a cheaper recomputation) or exact (a mixed-integer program:
    /// the cheapest choice in its model, with a proven lower bound; up to 20
    /// s a plan, and not monotone in the budget by construction).
    #[arg(long, value_name = "SOLVER", default_value = "greedy", value_parser = ["greedy", "exact"], requires = "step")]
    pub(crate) remat_solver: String,
    /// The GPU whose roofline (FP32 rate, bandwidth, SMs, launch overhead)
    /// prices a recomputation: h100, h200, a100, v100 or l4.
    #[arg(long, value_name = "GPU", default_value = "h100", value_parser = smelt::cost::GPU_NAMES)]
    pub(crate) device: String,
    /// Take batch, accumulation, precision, optimizer and recomputation
    /// budget from a recipe written by `smelt fit --save-recipe`.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["accumulate", "remat_budget", "batch", "precision"])]
    pub(crate) recipe: Option<PathBuf>,
}

impl TrainArgs {
    /// The training configuration, when --train is given.
    pub(crate) fn config(&self) -> Result<Option<smelt_passes::train::TrainConfig>> {
        use smelt_ir::Optimizer;
        use smelt_passes::train::{Loss, TrainConfig};
        let Some(opt) = &self.train else { return Ok(None) };
        let wd = self.weight_decay.unwrap_or(if opt == "adamw" { 0.01 } else { 0.0 });
        let schedule = match (self.cosine, self.warmup) {
            (Some(total), w) if w < total => smelt_ir::Schedule { warmup: w, total },
            (Some(total), w) => anyhow::bail!("--warmup {w} must be shorter than --cosine {total}"),
            (None, 0) => smelt_ir::Schedule::default(),
            (None, _) => anyhow::bail!("--warmup needs --cosine STEPS (the schedule's length)"),
        };
        let optimizer = match opt.as_str() {
            "sgd" => Optimizer::Sgd {
                lr: self.lr.unwrap_or(0.01),
                momentum: self.momentum,
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
        if self.nesterov && (opt != "sgd" || self.momentum == 0.0) {
            anyhow::bail!("--nesterov needs --train sgd with a non-zero --momentum");
        }
        let loss = match self.loss.as_str() {
            "mse" => Loss::MeanSquaredError,
            "ce" => Loss::CrossEntropy { smoothing: self.label_smoothing },
            _ => Loss::Auto { smoothing: self.label_smoothing },
        };
        let batch_norm = if self.batch_norm == "train" {
            smelt_passes::train::BatchNorm::Train { momentum: 0.1 }
        } else {
            smelt_passes::train::BatchNorm::Frozen
        };
        if self.clip_norm.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
            anyhow::bail!("--clip-norm must be a positive number");
        }
        Ok(Some(TrainConfig {
            loss,
            loss_on: self.loss_on.clone(),
            optimizer: Some(optimizer),
            freeze: self.freeze.clone(),
            batch_norm,
            clip_norm: self.clip_norm,
            loss_scale: false,
        }))
    }
}

impl ModelArgs {
    /// The default model with default options.
    fn default_model() -> ModelArgs {
        ModelArgs {
            model: smelt::DEFAULT_MODEL.into(),
            batch: None,
            dims: Vec::new(),
            no_fuse: false,
            precision: Default::default(),
            keep_f32: Vec::new(),
            train: TrainArgs::default(),
        }
    }

    /// The driver's options.
    pub(crate) fn options(&self) -> Result<smelt::Options> {
        Ok(smelt::Options {
            batch: self.batch,
            dims: self.dims.clone(),
            no_fuse: self.no_fuse,
            precision: smelt_passes::precision::Options { policy: self.precision, keep_f32: self.keep_f32.clone() },
            train: self.train.config()?.map(|mut t| {
                use smelt_passes::precision::Policy;
                t.loss_scale = matches!(self.precision, Policy::F16 | Policy::MixedF16) && self.train.loss_scale == "dynamic";
                t
            }),
            remat: self.train.remat_budget.map(|budget| smelt::Remat {
                budget,
                gpu: smelt::cost::gpu(&self.train.device).unwrap_or_default(),
                solver: smelt::RematSolver::parse(&self.train.remat_solver).unwrap_or_default(),
            }),
        })
    }

    /// Takes batch, accumulation, precision, optimizer and recomputation
    /// budget from `--recipe` (clap refuses those flags beside it).
    pub(crate) fn apply_recipe(&mut self) -> Result<()> {
        let Some(path) = &self.train.recipe else { return Ok(()) };
        let r = smelt::fit::Recipe::load(path)?;
        if r.gpus > 1 {
            anyhow::bail!(
                "{}: the recipe plans data parallelism over {} GPUs (micro-batch {} each); smelt runs on one GPU: pass its per-GPU flags (--batch {} --accumulate {}) to plan or train one replica",
                path.display(),
                r.gpus,
                r.micro_batch,
                r.batch / r.gpus,
                r.accumulate
            );
        }
        let name = |s: &str| s.trim_start_matches("zoo:").to_string();
        if name(&r.model) != name(&self.model)
            && std::path::Path::new(&r.model).file_name() != std::path::Path::new(&self.model).file_name()
        {
            anyhow::bail!("{}: the recipe was made for {}, not {}", path.display(), r.model, self.model);
        }
        match &self.train.train {
            Some(o) if *o != r.optimizer => anyhow::bail!("{}: the recipe was made for --train {}, not {o}", path.display(), r.optimizer),
            _ => self.train.train = Some(r.optimizer.clone()),
        }
        if self.dims.is_empty() {
            self.dims = r.dims.clone();
        }
        self.batch = Some(r.batch);
        self.train.accumulate = r.accumulate as u32;
        self.precision = r.precision.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        self.train.remat_budget = r.remat_budget;
        self.train.remat_solver = r.remat_solver.name().to_string();
        self.train.device = r.device.clone();
        Ok(())
    }

    /// Opens the model (import and verify).
    pub(crate) fn session(&self) -> Result<smelt::Session> {
        if self.model.is_empty() {
            anyhow::bail!("the model path is empty: give an .onnx or .tir file, or zoo:NAME");
        }
        let s = smelt::Session::open(&self.model, self.options()?).with_context(|| format!("cannot load {}", self.model))?;
        cmd::log_time("load", s.timings.import);
        for note in s.train.iter().flat_map(|t| &t.step.notes) {
            errln!("note: {note}");
        }
        Ok(s)
    }

    /// Opens the model for a command that needs the weights' values: a
    /// text file's constants without data get deterministic random ones.
    pub(crate) fn session_with_values(&self) -> Result<smelt::Session> {
        let mut s = self.session()?;
        let n = s.fill_weights().with_context(|| format!("cannot load {}", self.model))?;
        if n > 0 {
            errln!("note: {n} constants of {} had no data and were filled with deterministic random values", self.model);
        }
        Ok(s)
    }
}

/// Logs to standard error at the level `SMELT_LOG` names (`debug`: each
/// pass's time and statistics; `trace`: also the IR after each pass).
struct StderrLog(log::LevelFilter);

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.0 && m.target().starts_with("smelt")
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            errln!("[{} {}] {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    let level = std::env::var("SMELT_LOG").ok().and_then(|l| l.parse().ok()).unwrap_or(log::LevelFilter::Warn);
    if log::set_boxed_logger(Box::new(StderrLog(level))).is_ok() {
        log::set_max_level(level);
    }
    let result = match Cli::parse().command {
        None => cmd::inspect::default(&ModelArgs::default_model()),
        Some(Command::Inspect(a)) => cmd::inspect::run(&a),
        Some(Command::Compile(a)) => cmd::compile::run(&a),
        Some(Command::Plan(mut a)) => a.model.apply_recipe().and_then(|()| cmd::plan::run(&a)),
        Some(Command::Run(a)) => cmd::run::run(&a),
        Some(Command::Print(a)) => cmd::print(&a),
        Some(Command::Train(mut a)) => a.model.apply_recipe().and_then(|()| cmd::train::run(&a)),
        Some(Command::Fit(a)) => cmd::fit::run(&a),
    };
    // What is still buffered must reach stdout too, or the failure be said.
    let result = result.and_then(|ok| {
        use std::io::Write as _;
        std::io::stdout().flush().map_err(StdoutError)?;
        Ok(ok)
    });
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        // A reader that stopped reading (`smelt print m.onnx | head`) is not an error.
        Err(e) if e.downcast_ref::<StdoutError>().is_some_and(|e| e.0.kind() == std::io::ErrorKind::BrokenPipe) => {}
        Err(e) => {
            errln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}
