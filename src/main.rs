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

mod cli;
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

pub(crate) use cli::{FitArgs, ModelArgs};

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
    after_help = "Examples:\n  smelt inspect model.onnx --batch 8\n  smelt compile model.onnx --dump-ir fuse\n  smelt compile model.onnx --batch 8 --out build/ --ptxas-stats\n  smelt compile zoo:resnet50 --batch 32 --precision mixed-f16 --report --device h100\n  smelt plan model.onnx --batch 8 --svg memory.svg --memory-limit 6GiB\n  smelt plan model.onnx --batch 8 --precision mixed-f16\n  smelt run model.onnx --backend cuda --profile\n  smelt run model.onnx --backend emulator --check-kernels\n  smelt run model.onnx --input input_0.pb --expect output_0.pb\n  smelt print zoo:mobilenet_v2 > mobilenet.tir\n  smelt run mobilenet.tir --json\n  smelt train model.onnx --data train.npz --val val.npz --optimizer adam --batch 32 --epochs 5 --save trained.onnx\n  smelt fit model.onnx --train adam --batch 256 --memory-limit 16GiB --precision auto --save-recipe recipe.json\n  smelt train model.onnx --recipe recipe.json --data train.npz"
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
    /// With --out DIR (or --ptxas-stats, or --report), also generate code: every kernel of
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
    /// Time every tensor-core conv and GEMM of the model with each
    /// candidate tile (64x64, 128x64, 64x128, 128x128) on a GPU and keep
    /// the fastest per kernel.
    ///
    /// Each candidate's program runs once checked (every kernel against its
    /// description), once to warm up, then --runs profiled runs; a kernel's
    /// time is the median over the runs of its launches' sum. The table
    /// goes to the kernel cache's folder (tuning/DEVICE.json, merged with
    /// what that holds) or --out; `--tuning FILE` on compile, run, plan,
    /// train and fit gives each kernel it names its measured tile, the
    /// others the roofline model's choice on --device. With --backend
    /// emulator the times are the CPU's: for testing the tuner, not for
    /// choosing a GPU's tiles.
    Tune(TuneArgs),
}

#[derive(Args)]
pub(crate) struct TuneArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Where to time: cuda (GPU 0) or emulator (the generated CUDA C on the CPU).
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "emulator"])]
    pub(crate) backend: String,
    /// Profiled runs per candidate tile (the median counts).
    #[arg(long, default_value_t = 10)]
    pub(crate) runs: usize,
    /// Write the table to FILE.json (merged with it when it holds the same
    /// device's) instead of the kernel cache's folder.
    #[arg(long, value_name = "FILE.json")]
    pub(crate) out: Option<PathBuf>,
    /// Print JSON instead of text.
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
    /// The ptxas target for --ptxas-stats and --report.
    #[arg(long, default_value = smelt_codegen::ptxas::DEFAULT_SM)]
    pub(crate) sm: String,
    /// Print every launch on --device's roofline: FLOPs, bytes moved,
    /// FLOPs per byte, what bounds it (memory, shared memory, compute or launch), estimated time,
    /// share of its roof (tensor cores or CUDA cores), tile efficiency,
    /// registers, spills and occupancy (from ptxas when it is found), then a
    /// line per kind of kernel and the model's estimated time. An estimate,
    /// not a measurement (with --json: the "report" field).
    #[arg(long)]
    pub(crate) report: bool,
    /// With --report, also draw it: every launch on --device's roofline
    /// (FLOPs per byte against estimated FLOP/s), as an SVG.
    #[arg(long, value_name = "FILE.svg", requires = "report")]
    pub(crate) svg: Option<PathBuf>,

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
    /// Fit the arena in SIZE (B, KiB, MiB, GiB, KB, MB, GB; e.g. 6GiB): when the
    /// whole-op plan is larger, split the segments at its peak (by slices of
    /// the batch, or by bands of rows) until it fits; fail, naming a batch
    /// that fits, when nothing does. A training step is only checked.
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
    /// device before the launch), within --kernel-rtol of its output's
    /// range, and against the CPU reference executor running the node's
    /// op on them (channels-last operands converted by code of its own;
    /// TF32 operands rounded as the GPU does), within 1e-4 of the range
    /// (1e-2 for f16 and bf16 outputs); list those that disagree.
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
    /// With --backend cuda: read every kernel's output back (in the warm-up
    /// run) and name the first that made inf or NaN of finite operands, such
    /// as an f16 activation above 65504 under --precision mixed-f16. Always
    /// done on the emulator.
    #[arg(long)]
    pub(crate) check_finite: bool,
    /// With --backend cuda or emulator: time each kernel (CUDA events, or
    /// the host clock) and print its share, bandwidth and FLOP rate. With
    /// --train the profiled run is one more step, after the reported one.
    #[arg(long)]
    pub(crate) profile: bool,
    /// With --backend cuda: timed runs after one warm-up (the emulator
    /// runs once).
    #[arg(long, default_value_t = 20)]
    pub(crate) repeat: usize,
    /// Fit the activation arena in SIZE, splitting as `smelt plan
    /// --memory-limit` does; refuse to run when nothing fits.
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
    #[arg(long, default_value = "cpu", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt::train::Backend::NAMES), |s| s.parse::<smelt::train::Backend>().expect("listed")))]
    pub(crate) backend: smelt::train::Backend,
    /// Refuse to start when the step's device memory (activation arena +
    /// weights and optimizer state) exceeds SIZE, before allocating anything.
    #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
    pub(crate) memory_limit: Option<usize>,
    /// Write the model with the trained weights (and batch-norm running
    /// statistics) as its initializers: same graph, same names.
    #[arg(long, value_name = "FILE.onnx")]
    pub(crate) save: Option<PathBuf>,
    /// Keep a checkpoint in DIR (checkpoint-STEP.npz: parameters, optimizer
    /// state, step counter, linked as checkpoint.npz; checkpoint.json: step,
    /// seed, options, data set, the commit), written every --every steps
    /// and at the end; a kill at any instant leaves a whole checkpoint.
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

/// Opening the model from the command line: notes and the load time to
/// standard error.
pub(crate) trait Open {
    /// Opens the model (import and verify).
    fn session(&self) -> Result<smelt::Session>;
    /// Opens the model for a command that needs the weights' values: a
    /// text file's constants without data get deterministic random ones.
    fn session_with_values(&self) -> Result<smelt::Session>;
}

impl Open for smelt::spec::ModelSpec {
    fn session(&self) -> Result<smelt::Session> {
        let s = self.open(false).with_context(|| format!("cannot load {}", self.model))?;
        cmd::log_time("load", s.timings.import);
        for note in s.train.iter().flat_map(|t| &t.step.notes) {
            errln!("note: {note}");
        }
        Ok(s)
    }

    fn session_with_values(&self) -> Result<smelt::Session> {
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
        None => cmd::inspect::default(&smelt::spec::ModelSpec::new(smelt::DEFAULT_MODEL)),
        Some(Command::Inspect(a)) => cmd::inspect::run(&a),
        Some(Command::Compile(a)) => cmd::compile::run(&a),
        Some(Command::Plan(a)) => cmd::plan::run(&a),
        Some(Command::Run(a)) => cmd::run::run(&a),
        Some(Command::Print(a)) => cmd::print(&a),
        Some(Command::Train(a)) => cmd::train::run(&a),
        Some(Command::Fit(a)) => cmd::fit::run(&a),
        Some(Command::Tune(a)) => cmd::tune::run(&a),
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
