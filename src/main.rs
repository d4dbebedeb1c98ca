//! The `smelt` command line.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use smelt::report::{human_bytes, inspect, Inspect};
use smelt::{compare, dummy_input, load, summarize, Loaded, DEFAULT_MODEL};
use smelt_ir::{onnx, text, Graph, Tensor};
use std::path::PathBuf;
use std::time::Instant;

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
    after_help = "Examples:\n  smelt inspect model.onnx --batch 8\n  smelt compile model.onnx --dump-ir fuse\n  smelt compile model.onnx --batch 8 --out build/ --ptxas-stats\n  smelt plan model.onnx --batch 8 --svg memory.svg --memory-limit 6GiB\n  smelt plan model.onnx --batch 8 --precision mixed-f16\n  smelt run model.onnx --backend cuda --profile\n  smelt run model.onnx --input input_0.pb --expect output_0.pb\n  smelt print zoo:mobilenet_v2 > mobilenet.tir\n  smelt run mobilenet.tir --json"
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
    Inspect {
        #[command(flatten)]
        model: ModelArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
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
    Compile {
        #[command(flatten)]
        model: ModelArgs,
        /// Print the IR after this pass (default: after the last).
        #[arg(long, value_name = "PASS", value_parser = clap::builder::PossibleValuesParser::new(smelt_passes::pipeline::PASSES))]
        dump_ir: Option<String>,
        /// Print the pass statistics (or, with --out, a summary) as JSON on standard output.
        #[arg(long)]
        json: bool,
        /// Generate and compile the kernels into DIR.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// NVRTC target: a virtual architecture gives PTX the driver JIT-compiles for newer GPUs.
        #[arg(long, default_value = smelt_codegen::nvrtc::DEFAULT_ARCH, value_parser = ["compute_70", "compute_75", "compute_80", "compute_86", "compute_89", "compute_90"])]
        arch: String,
        /// Assemble each kernel with ptxas ($SMELT_PTXAS or on PATH; PyPI nvidia-cuda-nvcc-cu12) and print registers and spills.
        #[arg(long)]
        ptxas_stats: bool,
        /// The ptxas target for --ptxas-stats.
        #[arg(long, default_value = smelt_codegen::ptxas::DEFAULT_SM)]
        sm: String,
        /// Also write the weights blob (DIR/weights.bin, laid out as plan.json says).
        #[arg(long, requires = "out")]
        weights: bool,
        /// Compile with this many threads (default: one per core).
        #[arg(long, short = 'j')]
        jobs: Option<usize>,
    },
    /// Plan activation memory: a memory-aware schedule, liveness, and offsets
    /// in one arena, checked by an independent checker.
    ///
    /// Shows weights bytes, naive activation bytes (every value in its own
    /// buffer), the liveness lower bound of the chosen schedule, the arena,
    /// their ratios and the peak step with the largest tensors live there,
    /// with fusion and without. The arena holds every activation, graph
    /// inputs and outputs included; weights are separate.
    Plan {
        #[command(flatten)]
        model: ModelArgs,
        /// Print JSON instead of text (fields documented in docs/guide.md).
        #[arg(long)]
        json: bool,
        /// Draw live bytes per step and the arena layout to FILE (SVG).
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
        /// Fail when the arena exceeds SIZE (B, KiB, MiB, GiB, KB, MB, GB; e.g. 6GiB).
        #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
        memory_limit: Option<usize>,
        /// Print the time of each phase (import, passes, planning, check).
        #[arg(long)]
        timings: bool,
    },
    /// Run the model on the CPU reference executor, or on a GPU with
    /// --backend cuda.
    ///
    /// With no --input, each float input is the ONNX backend runner's input:
    /// arange(n).reshape(shape) / n. With --expect, the outputs are compared
    /// like numpy.allclose and smelt exits with status 1 when any is out of
    /// tolerance. With --precision other than f32, the f32 graph runs too
    /// and the error against it is printed.
    Run {
        #[command(flatten)]
        model: ModelArgs,
        /// An input tensor (ONNX TensorProto .pb file), one per graph input, in order.
        #[arg(long = "input", value_name = "FILE.pb")]
        inputs: Vec<PathBuf>,
        /// An expected output (TensorProto .pb file), one per graph output, in order.
        #[arg(long = "expect", value_name = "FILE.pb")]
        expects: Vec<PathBuf>,
        /// Relative tolerance for --expect.
        #[arg(long, default_value_t = 1e-3)]
        rtol: f64,
        /// Absolute tolerance for --expect.
        #[arg(long, default_value_t = 1e-7)]
        atol: f64,
        /// Write each output as DIR/output_<i>.pb.
        #[arg(long, value_name = "DIR")]
        save_outputs: Option<PathBuf>,
        /// Where to run: cpu (the reference executor) or cuda (generated
        /// kernels on GPU 0, one arena of the planned size; needs an NVIDIA
        /// driver and NVRTC or a warm kernel cache).
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
        backend: String,
        /// With --backend cuda: time each kernel with CUDA events and print
        /// its share, bandwidth and FLOP rate.
        #[arg(long)]
        profile: bool,
        /// With --backend cuda: timed runs after one warm-up.
        #[arg(long, default_value_t = 20)]
        repeat: usize,
        /// Refuse to run when the activation arena exceeds SIZE (as `smelt plan --memory-limit`).
        #[arg(long, value_name = "SIZE", value_parser = smelt::plan::parse_size)]
        memory_limit: Option<usize>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the model in smelt's text IR (weights by name, not values).
    Print {
        #[command(flatten)]
        model: ModelArgs,
        /// Write to FILE instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ModelArgs {
    /// Path to .onnx or .tir, or zoo:NAME.
    model: String,
    /// Batch size, replacing the exported one (also inside Reshape targets
    /// that hard-code it).
    #[arg(long)]
    batch: Option<usize>,
    /// Turn fusion off everywhere (for comparison).
    #[arg(long)]
    no_fuse: bool,
    /// Precision policy: f32 (as imported), f16 or bf16 (every float op),
    /// mixed-f16 or mixed-bf16 (half storage and compute with f32
    /// accumulation; f32 kept for softmax, normalization, reductions, the
    /// final classifier layer and --keep-f32). Graph inputs and outputs stay f32.
    #[arg(long, default_value = "f32", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(smelt_passes::precision::Policy::NAMES), |s| s.parse::<smelt_passes::precision::Policy>().expect("listed")))]
    precision: smelt_passes::precision::Policy,
    /// Keep these in f32 under a reduced precision: an op type (softmax,
    /// conv, gemm...) or a node name, `*` matching any characters. Repeatable.
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    keep_f32: Vec<String>,
}

impl ModelArgs {
    fn load(&self) -> Result<Loaded> {
        if self.batch == Some(0) {
            bail!("--batch must be at least 1");
        }
        let t = Instant::now();
        let loaded = load(&self.model, self.batch).with_context(|| format!("cannot load {}", self.model))?;
        if loaded.filled_weights > 0 {
            eprintln!(
                "note: {} constants of {} had no data and were filled with deterministic random values",
                loaded.filled_weights, self.model
            );
        }
        log_time("load", t);
        Ok(loaded)
    }

    /// The pipeline's options, with fusion on when `fuse` (and not --no-fuse).
    fn options(&self, fuse: bool) -> smelt_passes::pipeline::Options {
        smelt_passes::pipeline::Options {
            fuse: fuse && !self.no_fuse,
            precision: smelt_passes::precision::Options { policy: self.precision, keep_f32: self.keep_f32.clone() },
            ..Default::default()
        }
    }

    /// The same model at another batch size.
    fn with_batch(&self, batch: usize) -> ModelArgs {
        ModelArgs {
            model: self.model.clone(),
            batch: Some(batch),
            no_fuse: self.no_fuse,
            precision: self.precision,
            keep_f32: self.keep_f32.clone(),
        }
    }

    /// Loads and compiles; returns the graph before and after the passes.
    fn compile(&self, after: &mut dyn FnMut(&str, &Graph)) -> Result<(Graph, Graph, smelt_passes::pipeline::Stats)> {
        let loaded = self.load()?;
        let mut g = loaded.graph.clone();
        let t = Instant::now();
        let stats = smelt::compile_with(&mut g, &self.options(true), after).with_context(|| format!("cannot compile {}", self.model))?;
        log_time("compile", t);
        Ok((loaded.graph, g, stats))
    }
}

fn log_time(what: &str, t: Instant) {
    if std::env::var_os("SMELT_TIMINGS").is_some() {
        eprintln!("{what}: {:.3} s", t.elapsed().as_secs_f64());
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
            eprintln!("[{} {}] {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    let level = std::env::var("SMELT_LOG").ok().and_then(|l| l.parse().ok()).unwrap_or(log::LevelFilter::Warn);
    if log::set_boxed_logger(Box::new(StderrLog(level))).is_ok() {
        log::set_max_level(level);
    }
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => {
            let model =
                ModelArgs { model: DEFAULT_MODEL.into(), batch: None, no_fuse: false, precision: Default::default(), keep_f32: Vec::new() };
            let (before, after, stats) = model.compile(&mut |_, _| {})?;
            println!("smelt: {DEFAULT_MODEL} (built-in, deterministic random weights)\n");
            print_inspect(&inspect(&before, &after), &stats);
            let (plan, _, _) = plan_checked(&after, None)?;
            println!(
                "memory plan: arena {} for every activation (lower bound {}, checked), weights {}; `smelt plan` tells more",
                human_bytes(plan.arena),
                human_bytes(plan.lower_bound),
                human_bytes(after.weight_bytes())
            );
            println!();
            let run = RunArgs { inputs: &[], expects: &[], rtol: 1e-3, atol: 1e-7, save: None, json: false };
            let ok = cmd_run(&after, &run, None)?;
            println!(
                "\nTry `smelt --help`, `smelt inspect MODEL`, `smelt plan MODEL --svg memory.svg`, `smelt run MODEL --expect FILE.pb`."
            );
            exit_if(!ok)
        }
        Some(Command::Inspect { model, json }) => {
            let (before, after, stats) = model.compile(&mut |_, _| {})?;
            let report = inspect(&before, &after);
            if json {
                let mut v = serde_json::to_value(&report)?;
                v["passes"] = serde_json::to_value(&stats)?;
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("model: {}\n", model.model);
                print_inspect(&report, &stats);
            }
            Ok(())
        }
        Some(Command::Compile { model, out, arch, ptxas_stats, sm, weights, jobs, json, .. }) if out.is_some() || ptxas_stats => {
            let opts = CodegenOpts { out, arch, ptxas_stats, sm, weights, jobs, json };
            cmd_codegen(&model, &opts)
        }
        Some(Command::Compile { model, dump_ir, json, .. }) => {
            let want = dump_ir.unwrap_or_else(|| "final".into());
            let mut dumped = None;
            let (_, after, stats) = model.compile(&mut |pass, g| {
                if pass == want {
                    dumped = Some(text::print(g));
                }
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
                return Ok(());
            }
            match dumped {
                Some(s) => print!("{s}"),
                None if want == "final" => print!("{}", text::print(&after)),
                None => bail!("pass {want} did not run (fusion is off?)"),
            }
            eprintln!("{}", serde_json::to_string(&stats)?);
            Ok(())
        }
        Some(Command::Plan { model, json, svg, memory_limit, timings }) => cmd_plan(&model, json, svg, memory_limit, timings),
        Some(Command::Run { model, inputs, expects, rtol, atol, save_outputs, json, backend, profile, repeat, memory_limit }) => {
            let (before, g, _) = model.compile(&mut |_, _| {})?;
            // Under a reduced precision, also run in f32 and report the error.
            let reference = if model.precision != smelt_passes::precision::Policy::F32 {
                let mut r = before.clone();
                let opts = smelt_passes::pipeline::Options { precision: Default::default(), ..model.options(true) };
                smelt::compile_with(&mut r, &opts, &mut |_, _| {})?;
                Some(r)
            } else {
                None
            };
            let run = RunArgs { inputs: &inputs, expects: &expects, rtol, atol, save: save_outputs, json };
            let reference = reference.as_ref().map(|r| (r, model.precision));
            let ok = if backend == "cuda" {
                cmd_run_cuda(&model, (&before, &g), &run, reference, &CudaArgs { profile, memory_limit, repeat })?
            } else {
                if profile || memory_limit.is_some() {
                    bail!("--profile and --memory-limit apply to --backend cuda (use `smelt plan --memory-limit` for the plan alone)");
                }
                cmd_run(&g, &run, reference)?
            };
            exit_if(!ok)
        }
        Some(Command::Print { model, output }) => {
            let loaded = model.load()?;
            let s = text::print(&loaded.graph);
            match output {
                Some(p) => std::fs::write(&p, s).with_context(|| format!("cannot write {}", p.display()))?,
                None => print!("{s}"),
            }
            Ok(())
        }
    }
}

fn exit_if(fail: bool) -> Result<()> {
    if fail {
        std::process::exit(1);
    }
    Ok(())
}

fn print_inspect(r: &Inspect, stats: &smelt_passes::pipeline::Stats) {
    for p in &r.inputs {
        println!("input   {:<24} {}{:?}", p.name, p.dtype, p.shape);
    }
    for p in &r.outputs {
        println!("output  {:<24} {}{:?}", p.name, p.dtype, p.shape);
    }
    println!("\nparameters        {:>10}  in {} constants", human_bytes(r.parameter_bytes), r.parameters);
    println!("naive activations {:>10}  (every value in its own buffer)", human_bytes(r.naive_activation_bytes));
    println!("\n{:<22} {:>6}    {:<22} {:>6}", format!("{} ops before", r.ops), "", format!("{} kernels after", r.kernels), "");
    let sorted = |h: &std::collections::BTreeMap<String, usize>| {
        let mut v: Vec<(String, usize)> = h.iter().map(|(k, v)| (k.clone(), *v)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    };
    let (a, b) = (sorted(&r.op_histogram), sorted(&r.kernel_histogram));
    for i in 0..a.len().max(b.len()) {
        let cell = |v: &[(String, usize)]| v.get(i).map_or(format!("{:29}", ""), |(k, n)| format!("  {k:<20} {n:>6}"));
        println!("{}    {}", cell(&a), cell(&b));
    }
    if let Some(f) = &stats.fusion {
        println!("\nfusion: {} iterations, {} e-nodes, stop reason {}, {:.1} ms", f.iterations, f.egraph_nodes, f.stop_reason, f.millis);
    }
}

fn read_inputs(g: &Graph, files: &[PathBuf]) -> Result<Vec<Tensor>> {
    if files.is_empty() {
        return Ok((0..g.inputs().len()).map(|i| dummy_input(g, i)).collect());
    }
    if files.len() != g.inputs().len() {
        bail!("the model takes {} inputs but {} --input files were given", g.inputs().len(), files.len());
    }
    files.iter().map(|f| Ok(onnx::read_tensor_file(f)?.1)).collect()
}

struct RunArgs<'a> {
    inputs: &'a [PathBuf],
    expects: &'a [PathBuf],
    rtol: f64,
    atol: f64,
    save: Option<PathBuf>,
    json: bool,
}

/// Runs `g` on the CPU; with `reference` (the f32 graph and the policy of
/// `g`), also runs that and reports the error of `g` against it.
/// What an executor did: outputs, seconds, a line saying where it ran, and
/// fields for `--json`.
struct Ran {
    outs: Vec<Tensor>,
    secs: f64,
    label: String,
    extra: serde_json::Value,
}

/// The CPU reference executor, with a progress bar.
fn run_cpu(g: &Graph, ins: &[Tensor]) -> Result<Ran> {
    let bar = ProgressBar::new(g.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} running on the CPU {bar:30} {pos}/{len} nodes {elapsed}").expect("valid template"),
    );
    let t = Instant::now();
    let outs = smelt_runtime::cpu::run_with_progress(g, ins, &mut |done, _| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    Ok(Ran { outs, secs, label: format!("ran on the CPU reference executor in {secs:.3} s"), extra: json!({"backend": "cpu"}) })
}

fn cmd_run(g: &Graph, a: &RunArgs, reference: Option<(&Graph, smelt_passes::precision::Policy)>) -> Result<bool> {
    cmd_run_on(g, a, reference, &mut |ins| run_cpu(g, ins))
}

/// Runs `g` with `exec`, then reports, compares and saves its outputs.
fn cmd_run_on(
    g: &Graph,
    a: &RunArgs,
    reference: Option<(&Graph, smelt_passes::precision::Policy)>,
    exec: &mut dyn FnMut(&[Tensor]) -> Result<Ran>,
) -> Result<bool> {
    let RunArgs { inputs, expects, rtol, atol, json, .. } = *a;
    let save = &a.save;
    let ins = read_inputs(g, inputs)?;
    if !expects.is_empty() && expects.len() != g.outputs().len() {
        bail!("the model has {} outputs but {} --expect files were given", g.outputs().len(), expects.len());
    }
    let expected = expects.iter().map(|f| Ok(onnx::read_tensor_file(f)?.1)).collect::<Result<Vec<_>>>()?;
    let Ran { outs, secs, label, extra } = exec(&ins)?;
    if let Some(dir) = &save {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (i, ((name, _), t)) in g.outputs().iter().zip(&outs).enumerate() {
            onnx::write_tensor_file(&dir.join(format!("output_{i}.pb")), name, t)?;
        }
    }
    let against_f32: Option<Vec<smelt::PrecisionError>> = match reference {
        Some((r, _)) => {
            let want = smelt_runtime::cpu::run(r, &ins)?;
            Some(outs.iter().zip(&want).map(|(h, w)| smelt::precision_error(h, w)).collect())
        }
        None => None,
    };
    let mut ok = true;
    let mut rows = Vec::new();
    for (i, ((name, _), t)) in g.outputs().iter().zip(&outs).enumerate() {
        let s = summarize(t);
        let cmp = expected.get(i).map(|e| compare(t, e, rtol, atol));
        ok &= cmp.as_ref().is_none_or(|c| c.ok);
        rows.push((name, t, s, cmp));
    }
    if json {
        let outputs: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, (name, t, s, cmp))| {
                json!({"name": name, "dtype": t.ty().dtype.name(), "shape": t.shape(), "summary": s, "comparison": cmp,
                       "against_f32": against_f32.as_ref().map(|e| &e[i])})
            })
            .collect();
        let mut v = json!({"precision": reference.map_or("f32".to_string(), |(_, p)| p.to_string()), "seconds": secs, "ok": ok, "rtol": rtol, "atol": atol, "outputs": outputs});
        if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
            v.extend(extra);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ok);
    }
    println!("{label}{}", reference.map_or(String::new(), |(_, p)| format!(" at precision {p}")));
    for (i, (name, t, s, cmp)) in rows.into_iter().enumerate() {
        println!(
            "output {name}: {}  min {:.6} max {:.6} mean {:.6} argmax {}{}",
            t.ty(),
            s.min,
            s.max,
            s.mean,
            s.argmax,
            if s.finite { "" } else { "  (NOT FINITE)" }
        );
        if let Some(e) = against_f32.as_ref().map(|e| &e[i]) {
            println!(
                "  against f32: max abs err {:.3e} ({:.3e} of the largest |output|)  max rel err {:.3e}  arg-max agrees on {} of {} rows",
                e.max_abs, e.max_abs_over_range, e.max_rel, e.argmax_agree, e.rows
            );
        }
        if let Some(c) = cmp {
            match &c.error {
                Some(e) => println!("  expected: MISMATCH: {e}"),
                None => println!(
                    "  expected: {}  max abs err {:.3e}  max rel err {:.3e}  {} of {} elements outside rtol {rtol:e} atol {atol:e}",
                    if c.ok { "OK" } else { "MISMATCH" },
                    c.max_abs,
                    c.max_rel,
                    c.mismatches,
                    c.elements
                ),
            }
        }
    }
    Ok(ok)
}

/// Plans `g` (following `hint` too) and checks the plan; returns the plan
/// and the time taken to plan and to check.
fn plan_checked(g: &Graph, hint: Option<&[String]>) -> Result<(smelt_passes::memory::Plan, f64, f64)> {
    let t = Instant::now();
    let plan = smelt_passes::memory::plan_with_hint(g, hint)?;
    let plan_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    smelt_passes::memory::check::check(g, &plan).map_err(|e| anyhow::anyhow!("the memory plan failed its check (a compiler bug): {e}"))?;
    Ok((plan, plan_s, t.elapsed().as_secs_f64()))
}

fn cmd_plan(model: &ModelArgs, json: bool, svg: Option<PathBuf>, limit: Option<usize>, timings: bool) -> Result<()> {
    let t0 = Instant::now();
    let loaded = model.load()?;
    let import_s = t0.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut fused = loaded.graph.clone();
    let stats = smelt::compile_with(&mut fused, &model.options(true), &mut |_, _| {})?;
    let passes_s = t.elapsed().as_secs_f64();
    // Without fusion first: for comparison, and its schedule is a hint for
    // the fused graph (so fusion never raises the peak).
    let mut plain = loaded.graph.clone();
    smelt::compile_with(&mut plain, &model.options(false), &mut |_, _| {})?;
    let (plain_plan, _, _) = plan_checked(&plain, None)?;
    let hint = smelt_passes::memory::schedule_names(&plain, &plain_plan);
    let (plan, plan_s, check_s) = plan_checked(&fused, Some(&hint))?;
    let report = smelt::plan::report(&fused, &plan, !model.no_fuse, true);
    let plain_report = smelt::plan::report(&plain, &plain_plan, false, true);
    if let Some(path) = &svg {
        let title = format!("smelt plan {}{}", model.model, model.batch.map_or(String::new(), |b| format!(" --batch {b}")));
        let other = (!model.no_fuse).then_some(&plain_plan);
        std::fs::write(path, smelt::plan::svg(&title, &plan, &fused, other)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if json {
        let v = json!({
            "model": model.model,
            "batch": model.batch,
            "plan": report,
            "without_fusion": plain_report,
            "fusion": stats.fusion,
            "timings_seconds": {"import": import_s, "passes": passes_s, "plan": plan_s, "check": check_s},
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("model: {}{}\n", model.model, model.batch.map_or(String::new(), |b| format!(" (batch {b})")));
        let cols: Vec<&smelt::plan::MemoryReport> = if model.no_fuse { vec![&plain_report] } else { vec![&report, &plain_report] };
        let head: Vec<&str> = if model.no_fuse { vec!["without fusion"] } else { vec!["with fusion", "without fusion"] };
        println!("{:<34}{}", "", head.iter().map(|h| format!("{h:>18}")).collect::<String>());
        let row = |label: &str, f: &dyn Fn(&smelt::plan::MemoryReport) -> String| {
            println!("{label:<34}{}", cols.iter().map(|r| format!("{:>18}", f(r))).collect::<String>())
        };
        row("weights", &|r| human_bytes(r.weights_bytes));
        row("kernels", &|r| r.kernels.to_string());
        row("naive activations", &|r| human_bytes(r.naive_activation_bytes));
        row("lower bound (live bytes at peak)", &|r| human_bytes(r.lower_bound_bytes));
        row("arena", &|r| human_bytes(r.arena_bytes));
        row("arena / lower bound", &|r| format!("{:.4}", r.arena_over_lower_bound));
        row("arena / naive", &|r| format!("{:.3}", r.arena_over_naive));
        row("schedule", &|r| r.schedule.clone());
        if model.precision != smelt_passes::precision::Policy::F32 {
            let per = |m: &std::collections::BTreeMap<String, usize>| {
                m.iter().map(|(d, b)| format!("{d} {}", human_bytes(*b))).collect::<Vec<_>>().join(", ")
            };
            println!("\nprecision {} (with fusion):", model.precision);
            println!("  weights by dtype       {}", per(&report.weights_by_dtype));
            println!("  activations by dtype   {}  (every value once)", per(&report.activations_by_dtype));
            println!("  cast kernels           {}  (casts nothing could absorb)", report.cast_kernels);
            if let Some(p) = &stats.precision {
                let kept: Vec<String> = p.kept_f32.iter().map(|k| format!("{} ({}: {})", k.node, k.op, k.reason)).collect();
                println!("  kept in f32            {}", if kept.is_empty() { "nothing".to_string() } else { kept.join(", ") });
            }
        }
        println!(
            "\nschedules tried: {}",
            report.schedules.iter().map(|c| format!("{} {}", c.name, human_bytes(c.lower_bound))).collect::<Vec<_>>().join(", ")
        );
        println!("peak at step {} (node \"{}\"), largest tensors live there:", report.peak_step, report.peak_node);
        for l in &report.peak_live {
            println!("  {:<40} {:>10}  {}", l.name, human_bytes(l.bytes), l.ty);
        }
        println!("\nthe arena holds every activation, graph inputs and outputs included; weights are separate. Checked: no two live buffers overlap.");
        if let Some(p) = &svg {
            println!("picture: {}", p.display());
        }
    }
    if timings {
        eprintln!(
            "timings: import {:.1} ms, passes {:.1} ms, plan {:.1} ms, check {:.1} ms",
            import_s * 1e3,
            passes_s * 1e3,
            plan_s * 1e3,
            check_s * 1e3
        );
    }
    if let Some(limit) = limit {
        enforce_limit(model, &report, limit)?;
    }
    Ok(())
}

struct CodegenOpts {
    out: Option<PathBuf>,
    arch: String,
    ptxas_stats: bool,
    sm: String,
    weights: bool,
    jobs: Option<usize>,
    json: bool,
}

/// The unfused graph of `before` and the checked plans of `fused` and of
/// it (the unfused schedule is the fused plan's hint, as in `smelt plan`).
fn plan_fused(model: &ModelArgs, before: &Graph, fused: &Graph) -> Result<(Graph, smelt_passes::memory::Plan, smelt_passes::memory::Plan)> {
    let mut plain = before.clone();
    smelt::compile_with(&mut plain, &model.options(false), &mut |_, _| {})?;
    let (plan, plain_plan) = smelt::plan_both(fused, &plain)?;
    smelt_passes::memory::check::check(fused, &plan)
        .map_err(|e| anyhow::anyhow!("the memory plan failed its check (a compiler bug): {e}"))?;
    Ok((plain, plan, plain_plan))
}

/// `smelt compile --out DIR` / `--ptxas-stats`: lower, compile, write.
fn cmd_codegen(model: &ModelArgs, o: &CodegenOpts) -> Result<()> {
    use smelt_codegen::{nvrtc::Compiler, program::compile_all, Program};
    let (before, fused, _) = model.compile(&mut |_, _| {})?;
    let (plain, plan, plain_plan) = plan_fused(model, &before, &fused)?;
    let program = Program::build(&fused, &plan).with_context(|| format!("cannot generate code for {}", model.model))?;
    let sources = program.sources();
    let arch = o.arch.as_str();
    let compiler = Compiler { arch: o.arch.clone(), ..Compiler::default() };
    let threads = o.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = ProgressBar::new(sources.len() as u64);
    bar.set_style(ProgressStyle::with_template("{spinner} compiling kernels {bar:30} {pos}/{len} {wide_msg}").expect("valid template"));
    if o.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let t = Instant::now();
    let compiled = compile_all(&compiler, &sources, threads, &|name| {
        bar.set_message(name.to_string());
        bar.inc(1);
    });
    bar.finish_and_clear();
    let compiled = compiled.context("kernel compilation failed")?;
    let compile_s = t.elapsed().as_secs_f64();
    let cached = compiled.iter().filter(|c| c.cached).count();

    let mut ptxas = Vec::new();
    if o.ptxas_stats {
        let exe = smelt_codegen::ptxas::find()
            .context("--ptxas-stats needs ptxas: pip install nvidia-cuda-nvcc-cu12 and set SMELT_PTXAS to its nvidia/cuda_nvcc/bin/ptxas, or put it on PATH")?;
        let bar = ProgressBar::new(sources.len() as u64);
        bar.set_style(ProgressStyle::with_template("{spinner} ptxas {bar:30} {pos}/{len}").expect("valid template"));
        if o.json {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        for c in &compiled {
            ptxas.extend(smelt_codegen::ptxas::stats(&exe, &c.ptx, &o.sm)?);
            bar.inc(1);
        }
        bar.finish_and_clear();
    }

    let title = format!("smelt compile {}{}", model.model, model.batch.map_or(String::new(), |b| format!(" --batch {b}")));
    if let Some(dir) = &o.out {
        let kdir = dir.join("kernels");
        std::fs::create_dir_all(&kdir).with_context(|| format!("cannot create {}", kdir.display()))?;
        let write = |path: PathBuf, text: &[u8]| std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()));
        for ((name, src), c) in sources.iter().zip(&compiled) {
            write(kdir.join(format!("{name}.cu")), src.as_bytes())?;
            write(kdir.join(format!("{name}.ptx")), c.ptx.as_bytes())?;
        }
        let pj = smelt::emit::plan_json(&model.model, model.batch, arch, &program);
        write(dir.join("plan.json"), serde_json::to_string_pretty(&pj)?.as_bytes())?;
        let report = smelt::plan::report(&fused, &plan, !model.no_fuse, true);
        let mem = json!({"model": model.model, "batch": model.batch, "plan": report, "without_fusion": smelt::plan::report(&plain, &plain_plan, false, true)});
        write(dir.join("memory.json"), serde_json::to_string_pretty(&mem)?.as_bytes())?;
        write(dir.join("memory.svg"), smelt::plan::svg(&title, &plan, &fused, (!model.no_fuse).then_some(&plain_plan)).as_bytes())?;
        if o.weights {
            write(dir.join("weights.bin"), &program.weights_blob(&fused))?;
        }
        if o.ptxas_stats {
            write(dir.join("ptxas.json"), serde_json::to_string_pretty(&ptxas)?.as_bytes())?;
        }
    }
    let spilling: Vec<&smelt_codegen::ptxas::Stats> = ptxas.iter().filter(|s| s.spill_stores + s.spill_loads > 0).collect();
    if o.json {
        let v = json!({
            "model": model.model,
            "batch": model.batch,
            "arch": arch,
            "kernels": program.steps.len(),
            "distinct_kernels": sources.len(),
            "from_cache": cached,
            "compile_seconds": compile_s,
            "arena_bytes": program.arena,
            "weights_bytes": program.weights_bytes,
            "out": o.out,
            "ptxas": o.ptxas_stats.then_some(&ptxas),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if o.ptxas_stats {
            println!(
                "{:<60} {:>9} {:>12} {:>11} {:>8}",
                format!("kernel (ptxas -arch={})", o.sm),
                "registers",
                "spill bytes",
                "shared",
                "stack"
            );
            for s in &ptxas {
                println!(
                    "{:<60} {:>9} {:>12} {:>11} {:>8}",
                    s.kernel,
                    s.registers,
                    s.spill_stores + s.spill_loads,
                    human_bytes(s.shared),
                    s.stack
                );
            }
            let max = ptxas.iter().map(|s| s.registers).max().unwrap_or(0);
            println!(
                "\n{} kernels assembled for {}: at most {max} registers; {}\n",
                ptxas.len(),
                o.sm,
                if spilling.is_empty() { "no kernel spills".to_string() } else { format!("{} kernels spill", spilling.len()) }
            );
        }
        println!(
            "{}: {} kernel launches, {} distinct kernels compiled for {arch} in {:.2} s ({} from the cache, {} threads)",
            model.model,
            program.steps.len(),
            sources.len(),
            compile_s,
            cached,
            threads
        );
        println!("arena {}, weights {}", human_bytes(program.arena), human_bytes(program.weights_bytes));
        if let Some(dir) = &o.out {
            println!(
                "wrote {}/{{kernels/*.cu, kernels/*.ptx, plan.json, memory.json, memory.svg{}}}",
                dir.display(),
                if o.weights { ", weights.bin" } else { "" }
            );
        }
    }
    Ok(())
}

/// Fails with `smelt plan`'s message when the arena exceeds `limit`, naming
/// the largest smaller batch that fits.
fn enforce_limit(model: &ModelArgs, report: &smelt::plan::MemoryReport, limit: usize) -> Result<()> {
    if report.arena_bytes <= limit {
        return Ok(());
    }
    // Find the largest smaller batch that fits, when the batch can change.
    let mut fit = None;
    if !model.model.ends_with(".tir") {
        let mut b = model.batch.unwrap_or(1) / 2;
        while b >= 1 && fit.is_none() {
            let m = model.with_batch(b);
            let g = load(&m.model, m.batch)?.graph;
            let (mut fused, mut plain) = (g.clone(), g);
            smelt::compile_with(&mut fused, &m.options(true), &mut |_, _| {})?;
            smelt::compile_with(&mut plain, &m.options(false), &mut |_, _| {})?;
            let (p, _) = smelt::plan_both(&fused, &plain)?;
            if p.arena <= limit {
                fit = Some((b, p.arena));
            }
            b /= 2;
        }
    }
    bail!("{}", smelt::plan::over_limit(report, limit, fit))
}

/// `smelt run --backend cuda`: plan (refusing over --memory-limit before
/// touching the device), generate and compile the kernels, load them with
/// the weights on the GPU, run once to warm up, then `repeat` timed runs.
fn cmd_run_cuda(
    model: &ModelArgs,
    graphs: (&Graph, &Graph),
    a: &RunArgs,
    reference: Option<(&Graph, smelt_passes::precision::Policy)>,
    cuda: &CudaArgs,
) -> Result<bool> {
    use smelt_codegen::{nvrtc::Compiler, program::compile_all, Program};
    let (before, fused) = graphs;
    let (_, plan, _) = plan_fused(model, before, fused)?;
    let report = smelt::plan::report(fused, &plan, !model.no_fuse, true);
    if let Some(limit) = cuda.memory_limit {
        enforce_limit(model, &report, limit)?;
    }
    if let Some(why) = smelt_runtime::cuda::unavailable() {
        bail!("--backend cuda needs an NVIDIA GPU: {why}");
    }
    let program = Program::build(fused, &plan).with_context(|| format!("cannot generate code for {}", model.model))?;
    let sources = program.sources();
    let bar = ProgressBar::new(sources.len() as u64)
        .with_style(ProgressStyle::with_template("{spinner} compiling kernels {bar:30} {pos}/{len}").expect("valid template"));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let compiled = compile_all(&Compiler::default(), &sources, threads, &|_| bar.inc(1)).context("kernel compilation failed")?;
    bar.finish_and_clear();
    let ptx: std::collections::HashMap<String, String> =
        sources.iter().map(|(n, _)| n.clone()).zip(compiled.into_iter().map(|c| c.ptx)).collect();
    let blob = program.weights_blob(fused);
    let (arena, weights_bytes) = (program.arena, program.weights_bytes);
    let mut exec = smelt_runtime::cuda::CudaExecutor::new(program, &ptx, &blob, cuda.memory_limit)?;
    let (profile, repeat) = (cuda.profile, cuda.repeat.max(1));
    let json_out = a.json;
    cmd_run_on(fused, a, reference, &mut |ins| {
        exec.run(ins, false)?; // warm-up: module JIT, first-touch costs
        let mut times = Vec::with_capacity(repeat);
        let mut last = None;
        for _ in 0..repeat {
            let (outs, ms, _) = exec.run(ins, false)?;
            times.push(ms);
            last = Some(outs);
        }
        let kernels = if profile { exec.run(ins, true)?.2 } else { Vec::new() };
        times.sort_by(f64::total_cmp);
        let (min, median) = (times[0], times[times.len() / 2]);
        let dev = &exec.device;
        if profile && !json_out {
            let total: f64 = kernels.iter().map(|k| k.ms).sum();
            println!("{:<56} {:>9} {:>6} {:>9} {:>10}", "kernel (profiled run, CUDA events)", "ms", "share", "GB/s", "GFLOP/s");
            let mut sorted: Vec<_> = kernels.iter().collect();
            sorted.sort_by(|x, y| y.ms.total_cmp(&x.ms));
            for k in &sorted {
                println!(
                    "{:<56} {:>9.4} {:>5.1}% {:>9.1} {:>10.1}",
                    k.kernel,
                    k.ms,
                    100.0 * k.ms / total.max(1e-12),
                    k.bytes as f64 / (k.ms * 1e6),
                    k.flops as f64 / (k.ms * 1e6)
                );
            }
            println!("{} kernels, {total:.3} ms in kernels\n", kernels.len());
        }
        Ok(Ran {
            outs: last.expect("at least one run"),
            secs: median / 1e3,
            label: format!(
                "ran on {} (compute capability {}.{}): median {median:.3} ms, min {min:.3} ms over {repeat} runs; device memory {} (arena {} + weights {})",
                dev.name,
                dev.compute_capability.0,
                dev.compute_capability.1,
                human_bytes(arena + weights_bytes),
                human_bytes(arena),
                human_bytes(weights_bytes)
            ),
            extra: json!({"backend": "cuda", "device": dev, "runs": repeat, "median_ms": median, "min_ms": min,
                          "arena_bytes": arena, "weights_bytes": weights_bytes, "device_bytes": exec.device_bytes(), "kernels": kernels}),
        })
    })
}

struct CudaArgs {
    profile: bool,
    memory_limit: Option<usize>,
    repeat: usize,
}
