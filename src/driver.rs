//! The compile driver: the one place that knows the order of compilation
//! and its subtleties. Import and verify ([`Session::open`]), the pass
//! pipeline ([`Session::compile`]), memory planning with the unfused
//! graph's schedule as the fused plan's hint, and the independent check of
//! both plans ([`Session::plan`]), then code generation
//! ([`Session::program`]). The CLI, the tests and the scripts call it; none
//! of them repeats the order.
//!
//! ```
//! let mut s = smelt::Session::open("zoo:mobilenet_v2", smelt::Options::default())?;
//! let compiled = s.compile()?;
//! let planned = s.plan(&compiled)?;
//! assert!(planned.plan.arena >= planned.plan.lower_bound);
//! let program = s.program(&compiled, &planned)?;
//! assert!(!program.steps.is_empty());
//! # Ok::<(), smelt::Error>(())
//! ```

use smelt_codegen::{CodegenError, Program};
use smelt_ir::{onnx, text, zoo, Graph, IrError, KernelGraph, OpSet};
use smelt_passes::memory::{self, Plan};
use smelt_passes::train::{TrainConfig, TrainError, TrainStep};
use smelt_passes::{pipeline, precision, split, PassError};
use std::path::Path;
use std::time::Instant;

/// Everything that can go wrong in the driver. [`Error::is_bug`] tells a
/// user's mistake (a bad model, an unsupported op) from a compiler bug.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model could not be read, parsed, imported or verified.
    #[error(transparent)]
    Model(#[from] IrError),
    /// A pass failed.
    #[error(transparent)]
    Pass(#[from] PassError),
    /// Code generation refused a node or NVRTC failed.
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// A memory plan failed the independent checker: always a compiler bug.
    #[error("the memory plan of the {which} graph failed its check (a compiler bug): {detail}")]
    PlanCheck {
        /// `fused` or `unfused`.
        which: &'static str,
        /// What the checker found.
        detail: String,
    },
    /// A kernel-graph node has no CUDA kernel; names the model nodes it
    /// computes (through provenance), as imported.
    #[error("node {node} ({op}): {detail}; it computes the model's {model}")]
    NoKernel {
        /// The kernel-graph node.
        node: String,
        /// Its op.
        op: String,
        /// What is missing.
        detail: String,
        /// The model nodes, as `"name" (op)`.
        model: String,
    },
    /// The training step could not be built (`--train`).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// An option does not apply (such as `--batch` on a `.tir` file).
    #[error("{0}")]
    Usage(String),
    /// Recomputation cannot bring the arena down to the budget.
    #[error("recomputing saved activations cannot bring the arena under {budget} bytes: the smallest is {smallest} bytes, recomputing {recomputed} values")]
    RematBudget {
        /// The budget.
        budget: usize,
        /// The smallest arena reached.
        smallest: usize,
        /// With that many recomputed nodes.
        recomputed: usize,
    },
    /// A data set or checkpoint does not fit the model (`smelt train`).
    #[error("{file}: {msg}")]
    Data {
        /// The file.
        file: String,
        /// What is wrong.
        msg: String,
    },
    /// Running the program failed (a device, an input, a limit).
    #[error(transparent)]
    Runtime(#[from] smelt_runtime::RuntimeError),
    /// The arena exceeds the memory limit (`--memory-limit`): the message
    /// says what is live at the peak and what would help.
    #[error("{message}")]
    MemoryLimit {
        /// The limit, bytes.
        limit: usize,
        /// The arena, bytes.
        arena: usize,
        /// The largest smaller batch that fits, with its arena.
        smaller_batch: Option<(usize, usize)>,
        /// The whole message.
        message: String,
    },
    /// The loss stopped being finite: training diverged.
    #[error("the loss is {loss} after step {step}: training diverged (try a smaller --lr, or --clip-norm)")]
    Diverged {
        /// The optimizer step (from 1).
        step: usize,
        /// The loss.
        loss: f32,
    },
    /// A trained value stopped being finite (the loss may still be):
    /// nothing is saved from this step on.
    #[error("after step {step}, \"{name}\" holds inf or NaN: training diverged (try a smaller --lr, or --clip-norm); nothing non-finite is saved")]
    NonFiniteWeights {
        /// The optimizer step (from 1).
        step: usize,
        /// The value.
        name: String,
    },
}

impl Error {
    /// Whether this is smelt's fault rather than the input's.
    pub fn is_bug(&self) -> bool {
        match self {
            Error::Model(_)
            | Error::Usage(_)
            | Error::NoKernel { .. }
            | Error::Data { .. }
            | Error::Diverged { .. }
            | Error::NonFiniteWeights { .. }
            | Error::RematBudget { .. }
            | Error::MemoryLimit { .. } => false,
            Error::Runtime(e) => e.is_bug(),
            Error::Pass(e) => e.is_bug(),
            Error::Codegen(e) => e.is_bug(),
            Error::Train(e) => e.is_bug(),
            Error::PlanCheck { .. } => true,
        }
    }
}

/// What to compile and how.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Replaces the exported batch size (ONNX and zoo models).
    pub batch: Option<usize>,
    /// Sizes of named symbolic dimensions (ONNX models), `--dim NAME=N`.
    pub dims: Vec<(String, usize)>,
    /// Values of graph inputs that ops need at compile time (ONNX models),
    /// `--set NAME=VALUES`.
    pub known: Vec<(String, onnx::Known)>,
    /// Turns fusion off everywhere (for comparison).
    pub no_fuse: bool,
    /// The precision policy and the nodes kept in f32.
    pub precision: precision::Options,
    /// Compile a training step of the model instead of its forward pass.
    pub train: Option<TrainConfig>,
    /// Recompute saved activations in the backward pass until the
    /// training step's arena fits this budget (`--remat-budget`).
    pub remat: Option<Remat>,
    /// Split segments of an inference graph (run them by samples or by
    /// bands of rows) until its arena meets this goal (`--memory-limit`,
    /// `--min-memory`).
    pub split: Option<split::Goal>,
    /// What the kernels are compiled for: the GPU (`--device`: their tiles
    /// are chosen on its roofline; the H100 by default) and how the
    /// tensor-core kernels' tiles are chosen (`--tuning`).
    pub target: smelt_codegen::Target,
}

/// Rematerialization under a budget: what [`Session::compile`] recomputes
/// is the cheapest on `gpu` (see [`smelt_passes::remat`]).
#[derive(Clone, Debug, Default)]
pub struct Remat {
    /// The arena's budget in bytes.
    pub budget: usize,
    /// The GPU whose roofline prices a recomputation, and its tiles.
    pub target: smelt_codegen::Target,
    /// Which solver chooses.
    pub solver: RematSolver,
}

/// Which solver chooses what to recompute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RematSolver {
    /// The greedy walk ([`smelt_passes::remat::choose`]): fast, and
    /// monotone in the budget.
    #[default]
    Greedy,
    /// The mixed-integer program ([`smelt_passes::remat::exact`]): the
    /// cheapest choice in its model, within [`RematSolver::TIME_LIMIT`]
    /// (the greedy walk's answer when its choice does not fit).
    Exact,
}

impl RematSolver {
    /// The exact solver's time limit.
    pub const TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);
}

/// One recomputation: a kernel run again in the backward pass.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Recomputed {
    /// The recomputing kernel (`NAME.recompute`).
    pub name: String,
    /// The backward kernel it runs just before (its first reader).
    pub before: String,
}

/// What rematerialization did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RematReport {
    /// The budget.
    pub budget: usize,
    /// The arena without recomputation.
    pub arena_before: usize,
    /// The arena with it.
    pub arena_after: usize,
    /// The recomputations, in the order they run.
    pub recomputed: Vec<Recomputed>,
    /// Their estimated time on the GPU, seconds.
    pub cost_seconds: f64,
    /// Their FLOPs.
    pub flops: usize,
    /// The solver whose choice it is.
    pub solver: RematSolver,
    /// With the exact solver: a lower bound of the recomputation's
    /// estimated seconds at this budget (on its schedule), and whether its
    /// optimum was proven within the time limit.
    pub lower_bound_seconds: Option<f64>,
    /// See `lower_bound_seconds`.
    pub proven: Option<bool>,
}

impl Options {
    /// The pipeline's options, fusion on when `fuse` and not `no_fuse`.
    pub fn pipeline(&self, fuse: bool) -> pipeline::Options {
        pipeline::Options { fuse: fuse && !self.no_fuse, precision: self.precision.clone(), ..Default::default() }
    }
}

/// Seconds spent in each phase so far.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// Reading, importing and verifying the model.
    pub import: f64,
    /// The pass pipeline (the last run).
    pub passes: f64,
    /// Planning the compiled graph (the unfused plan excluded).
    pub plan: f64,
    /// Checking the compiled graph's plan.
    pub check: f64,
    /// Building the program (lowering every node to a kernel).
    pub codegen: f64,
}

/// The graph after the pass pipeline.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The kernel graph (fused unless fusion is off).
    pub graph: KernelGraph,
    /// What each pass did.
    pub stats: pipeline::Stats,
    /// What was recomputed (`Options::remat`).
    pub remat: Option<RematReport>,
    /// What was split (`Options::split`).
    pub split: Option<SplitReport>,
    /// The plan rematerialization or splitting made (the one
    /// [`Session::plan`] would).
    plan: Option<Plan>,
}

/// What splitting did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SplitReport {
    /// The memory limit, or `None` for the smallest arena.
    pub limit: Option<usize>,
    /// The arena before splitting and after.
    pub arena_before: usize,
    /// See `arena_before`.
    pub arena_after: usize,
    /// The graph's FLOPs before splitting.
    pub flops_before: usize,
    /// FLOPs the splits add (halo rows computed twice).
    pub extra_flops: usize,
    /// The splits, in the order the search made them.
    pub splits: Vec<split::Split>,
    /// Live bytes per step before splitting (the picture's comparison).
    #[serde(skip)]
    pub live_before: Vec<usize>,
}

impl Compiled {
    /// The pipeline's graph, not yet planned.
    pub fn new(graph: KernelGraph, stats: pipeline::Stats) -> Compiled {
        Compiled { graph, stats, remat: None, split: None, plan: None }
    }
}

/// The checked memory plan of a compiled graph, and of the same model
/// without fusion (its schedule was the hint; reports compare the two).
#[derive(Clone, Debug)]
pub struct Planned {
    /// The compiled graph's plan.
    pub plan: Plan,
    /// The model compiled without fusion.
    pub unfused: KernelGraph,
    /// Its plan.
    pub unfused_plan: Plan,
}

/// One model being compiled.
#[derive(Clone, Debug)]
pub struct Session {
    /// How the model was named (`model.onnx`, `m.tir`, `zoo:resnet50`).
    pub spec: String,
    /// The options.
    pub options: Options,
    /// The model as imported and verified, dead nodes removed: what the
    /// user's model means, before any pass.
    pub source: Graph,
    /// With `--train`: the training step (its graph is `source`), the
    /// model it was built from, and what smelt decided.
    pub train: Option<Training>,
    /// Constants of a text file that had no data and were filled with
    /// deterministic random values ([`Session::fill_weights`]).
    pub filled_weights: usize,
    /// Time spent so far.
    pub timings: Timings,
    /// The unfused graph and its plan, once made.
    unfused: Option<(KernelGraph, Plan)>,
}

/// The training step a session compiles.
#[derive(Clone, Debug)]
pub struct Training {
    /// The step, as built (also the session's `source`).
    pub step: TrainStep,
    /// The model's forward graph it was built from.
    pub model: Graph,
}

impl Session {
    /// Opens `spec`: a path to `.onnx` or `.tir`, or `zoo:NAME`. Imports and
    /// verifies the model and removes dead nodes.
    pub fn open(spec: &str, options: Options) -> Result<Session, Error> {
        let t = Instant::now();
        if spec.is_empty() {
            return Err(Error::Usage("the model path is empty: give an .onnx or .tir file, or zoo:NAME".into()));
        }
        if options.batch == Some(0) {
            return Err(Error::Usage("--batch must be at least 1".into()));
        }
        // With gradient accumulation the graph is the micro-step's.
        let k = options.train.as_ref().and_then(|t| t.optimizer).map_or(1, |o| o.accumulate());
        let batch = match (k, options.batch) {
            (1, b) => b,
            (k, Some(b)) if b % k == 0 => Some(b / k),
            (k, Some(b)) => {
                return Err(Error::Usage(format!("--accumulate {k}: the batch {b} does not split into {k} equal micro-batches")))
            }
            (k, None) => {
                return Err(Error::Usage(format!("--accumulate {k} needs --batch (the whole batch, split into {k} micro-batches)")))
            }
        };
        let graph = if let Some(name) = spec.strip_prefix("zoo:") {
            if let Some((input, _)) = options.known.first() {
                return Err(Error::Usage(format!("--set {input}: zoo:{name} has no inputs that need a value at compile time")));
            }
            let mut sequence = None;
            for (dim, n) in &options.dims {
                if dim != "sequence" || !zoo::takes_sequence(name) {
                    let what = if zoo::takes_sequence(name) { "sequence" } else { "none: its only size option is --batch" };
                    return Err(Error::Usage(format!("--dim {dim}: zoo:{name} has no dimension {dim} (it has {what})")));
                }
                sequence = Some(*n);
            }
            zoo::get_sized(name, batch.unwrap_or(1), sequence)?
        } else {
            let path = Path::new(spec);
            if path.extension().is_some_and(|e| e == "tir") {
                if batch.is_some() || !options.dims.is_empty() || !options.known.is_empty() {
                    let flag = if options.batch.is_some() {
                        "--batch"
                    } else if options.dims.is_empty() {
                        "--set"
                    } else {
                        "--dim"
                    };
                    return Err(Error::Usage(format!("{flag} does not apply to a .tir file: its shapes are fixed")));
                }
                let src = std::fs::read_to_string(path).map_err(|source| IrError::Io { path: spec.to_string(), error: source })?;
                text::parse(&src)?
            } else {
                let keep_weights = options.train.is_some();
                let known = options.known.clone();
                onnx::import_file(path, &onnx::ImportOptions { batch, dims: options.dims.clone(), base_dir: None, keep_weights, known })?
            }
        };
        let mut s = Session::from_graph(spec, graph, options)?;
        s.timings.import = t.elapsed().as_secs_f64();
        Ok(s)
    }

    /// Gives the constants of a text file that have no data deterministic
    /// random values, for the commands that need values (`run`, `compile
    /// --out`); the others never allocate them. Refuses, before allocating,
    /// constants larger than the host memory available. Returns how many
    /// were filled.
    pub fn fill_weights(&mut self) -> Result<usize, Error> {
        if self.spec.strip_prefix("zoo:").is_some_and(zoo::shapes_only) {
            return Err(Error::Usage(format!(
                "{} is shapes only (its weights are never filled): inspect, plan, compile and fit it; to run or train, export the model with its weights to ONNX",
                self.spec
            )));
        }
        let need: usize = self
            .source
            .node_ids()
            .filter(|&id| self.source.node(id).op.is_persistent() && self.source.weight(id).is_none())
            .map(|id| self.source.node(id).outputs[0].bytes())
            .fold(0, usize::saturating_add);
        if need > 0 {
            smelt_runtime::check_host_memory("filling the constants that have no data", need).map_err(|e| Error::Usage(e.to_string()))?;
        }
        let n = crate::fill_missing_weights(&mut self.source);
        self.unfused = None; // it carries the weights
        self.filled_weights += n;
        Ok(n)
    }

    /// A session over a graph built in memory (the builder, tests).
    /// Verifies it and removes dead nodes.
    /// With `options.train`, the source becomes the model's training step.
    pub fn from_graph(spec: &str, mut graph: Graph, options: Options) -> Result<Session, Error> {
        smelt_ir::verify(&graph)?;
        smelt_passes::dce::run(&mut graph);
        let mut train = None;
        if let Some(cfg) = &options.train {
            let step = smelt_passes::train::training_step(&graph, cfg)?;
            let model = std::mem::replace(&mut graph, step.graph.clone());
            train = Some(Training { step, model });
        }
        Ok(Session { spec: spec.to_string(), options, source: graph, train, filled_weights: 0, timings: Timings::default(), unfused: None })
    }

    /// The same model at another batch size (ONNX and zoo models only).
    pub fn with_batch(&self, batch: usize) -> Result<Session, Error> {
        Session::open(&self.spec, Options { batch: Some(batch), ..self.options.clone() })
    }

    /// Whether the batch size can be changed ([`Session::with_batch`]).
    pub fn batch_can_change(&self) -> bool {
        !self.spec.ends_with(".tir")
    }

    /// Runs the pass pipeline under the session's options.
    pub fn compile(&mut self) -> Result<Compiled, Error> {
        self.compile_with(&mut |_, _| {})
    }

    /// As [`Session::compile`], calling `after(pass, graph)` after each pass.
    pub fn compile_with(&mut self, after: &mut dyn FnMut(&str, &KernelGraph)) -> Result<Compiled, Error> {
        let t = Instant::now();
        let (graph, stats) = pipeline::run_with(&self.source, &self.options.pipeline(true), after)?;
        self.timings.passes = t.elapsed().as_secs_f64();
        let mut compiled = Compiled::new(graph, stats);
        if let Some(r) = self.options.remat.clone() {
            self.rematerialize(&mut compiled, &r)?;
        }
        match self.options.split {
            Some(split::Goal::Limit(_)) if self.train.is_some() => {} // the limit is checked, nothing is split
            Some(goal) => self.split(&mut compiled, goal)?,
            None => {}
        }
        Ok(compiled)
    }

    /// Splits segments of the compiled inference graph (by samples or by
    /// bands of rows) until its arena meets `goal` ([`Session::plan`] then
    /// gives that plan). Nothing is split when the arena already fits.
    pub fn split(&mut self, compiled: &mut Compiled, goal: split::Goal) -> Result<(), Error> {
        if self.train.is_some() {
            return Err(Error::Usage("--min-memory splits an inference graph; a training step recomputes instead (--remat-budget)".into()));
        }
        let hint = self.unfused_hint()?;
        let t = Instant::now();
        let o = split::choose(&compiled.graph, goal, Some(&hint), &crate::cost::compute_flops)
            .map_err(|source| Error::Pass(PassError::Bug { pass: "split", source }))?;
        if !o.splits.is_empty() {
            compiled.split = Some(SplitReport {
                limit: match goal {
                    split::Goal::Limit(l) => Some(l),
                    split::Goal::Minimum => None,
                },
                arena_before: o.arena_before,
                arena_after: o.plan.arena,
                flops_before: o.flops_before,
                extra_flops: o.extra_flops,
                splits: o.splits,
                live_before: o.live_before,
            });
            compiled.graph = o.graph;
            compiled.plan = Some(o.plan);
        }
        self.timings.plan += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Recomputes saved activations of the compiled training step until its
    /// plan's arena fits `r.budget` ([`Session::plan`] then gives that plan).
    pub fn rematerialize(&mut self, compiled: &mut Compiled, r: &Remat) -> Result<(), Error> {
        if self.train.is_none() {
            return Err(Error::Usage("recomputation (--remat-budget) applies to a training step: add --train".into()));
        }
        let hint = self.unfused_hint()?;
        let t = Instant::now();
        let target = &r.target;
        let cost = move |g: &KernelGraph, n| crate::cost::node_time(g, n, target);
        let greedy = || -> Result<smelt_passes::remat::Outcome, Error> {
            smelt_passes::remat::choose(&compiled.graph, r.budget, Some(&hint), &cost)?.map_err(|u| Error::RematBudget {
                budget: r.budget,
                smallest: u.smallest,
                recomputed: u.recomputed,
            })
        };
        let (outcome, solver, bound) = match r.solver {
            RematSolver::Greedy => (greedy()?, RematSolver::Greedy, None),
            RematSolver::Exact => {
                let e = smelt_passes::remat::exact(&compiled.graph, r.budget, Some(&hint), &cost, RematSolver::TIME_LIMIT)?;
                let bound = Some((e.lower_bound, e.proven));
                match e.outcome {
                    Some(o) => (o, RematSolver::Exact, bound),
                    None => (greedy()?, RematSolver::Greedy, bound),
                }
            }
        };
        let g = &outcome.graph;
        let order = &outcome.plan.schedule;
        let clones: Vec<_> = order.iter().copied().filter(|&n| g.node(n).recomputes.is_some()).collect();
        let recomputed = clones
            .iter()
            .map(|&n| {
                let at = order.iter().position(|&m| m == n).unwrap_or(0);
                let users = g.users_of(n);
                let before = order[at..].iter().find(|m| users.contains(m)).map_or(String::new(), |&m| g.node(m).name.clone());
                Recomputed { name: g.node(n).name.clone(), before }
            })
            .collect();
        compiled.remat = Some(RematReport {
            budget: r.budget,
            arena_before: outcome.arena_before,
            arena_after: outcome.plan.arena,
            recomputed,
            cost_seconds: clones.iter().map(|&n| crate::cost::node_time(g, n, target)).sum::<f64>().max(0.0),
            flops: clones.iter().map(|&n| crate::cost::node_flops(g, n)).sum(),
            solver,
            lower_bound_seconds: bound.map(|b| b.0).filter(|b| b.is_finite()),
            proven: bound.map(|b| b.1),
        });
        compiled.graph = outcome.graph;
        compiled.plan = Some(outcome.plan);
        self.timings.plan += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// The unfused graph's schedule as model nodes: the fused plan's hint.
    fn unfused_hint(&mut self) -> Result<Vec<smelt_ir::NodeId>, Error> {
        let (g, p) = self.unfused_plan()?;
        Ok(memory::schedule_origins(&g, &p))
    }

    /// The model compiled without fusion and its checked plan (made once).
    fn unfused_plan(&mut self) -> Result<(KernelGraph, Plan), Error> {
        if let Some(u) = &self.unfused {
            return Ok(u.clone());
        }
        let unfused = self.compile_unfused()?;
        let plan = memory::plan(&unfused)?;
        memory::check::check(&unfused, &plan).map_err(|detail| Error::PlanCheck { which: "unfused", detail })?;
        self.unfused = Some((unfused.clone(), plan.clone()));
        Ok((unfused, plan))
    }

    /// The model compiled without fusion (same precision).
    pub fn compile_unfused(&self) -> Result<KernelGraph, Error> {
        Ok(pipeline::run(&self.source, &self.options.pipeline(false))?.0)
    }

    /// The model compiled in f32 (same fusion): the reference a reduced
    /// precision is measured against.
    pub fn compile_f32(&self) -> Result<KernelGraph, Error> {
        let opts = pipeline::Options { precision: precision::Options::default(), ..self.options.pipeline(true) };
        Ok(pipeline::run(&self.source, &opts)?.0)
    }

    /// Plans `compiled`: first the unfused graph, whose best schedule is a
    /// hint for the fused plan (so fusion never raises the peak), then the
    /// compiled graph; both plans pass the independent checker.
    pub fn plan(&mut self, compiled: &Compiled) -> Result<Planned, Error> {
        let (unfused, unfused_plan) = self.unfused_plan()?;
        let hint = memory::schedule_origins(&unfused, &unfused_plan);
        let t = Instant::now();
        let plan = match &compiled.plan {
            Some(p) => p.clone(),
            None => memory::plan_with_hint(&compiled.graph, Some(&hint))?,
        };
        self.timings.plan += t.elapsed().as_secs_f64();
        let t = Instant::now();
        memory::check::check(&compiled.graph, &plan).map_err(|detail| Error::PlanCheck { which: "fused", detail })?;
        self.timings.check = t.elapsed().as_secs_f64();
        Ok(Planned { plan, unfused, unfused_plan })
    }

    /// Lowers every node of the planned graph to a kernel, in schedule
    /// order, with arena and weights offsets.
    pub fn program(&mut self, compiled: &Compiled, planned: &Planned) -> Result<Program, Error> {
        let t = Instant::now();
        let p = Program::build(&compiled.graph, &planned.plan, &self.options.target).map_err(|e| match e {
            CodegenError::NoKernel { node, op, detail, origin } => {
                let names: Vec<String> = origin
                    .iter()
                    .filter(|&&n| self.source.contains(n))
                    .map(|&n| format!("\"{}\" ({})", self.source.node(n).name, self.source.node(n).op.name()))
                    .collect();
                let model = if names.len() == 1 { format!("node {}", names[0]) } else { format!("nodes {}", names.join(", ")) };
                Error::NoKernel { node, op, detail, model }
            }
            e => Error::Codegen(e),
        })?;
        self.timings.codegen = t.elapsed().as_secs_f64();
        Ok(p)
    }

    /// The batch the model runs at: the leading extent of its first input
    /// (`None` for a `.tir` file, whose shapes are fixed, or no input).
    pub fn batch(&self) -> Option<usize> {
        let first = self.source.inputs().first()?;
        self.batch_can_change().then(|| self.source.node(*first).outputs[0].shape.first().copied()).flatten()
    }

    /// The largest batch below the current one (halving) whose arena fits
    /// in `limit` bytes, with that arena; `None` when none does or the batch
    /// cannot change.
    pub fn largest_batch_within(&self, limit: usize) -> Result<Option<(usize, usize)>, Error> {
        if !self.batch_can_change() {
            return Ok(None);
        }
        let mut b = self.batch().unwrap_or(1) / 2;
        while b >= 1 {
            let mut s = self.with_batch(b)?;
            let c = s.compile()?;
            let p = s.plan(&c)?;
            if p.plan.arena <= limit {
                return Ok(Some((b, p.plan.arena)));
            }
            b /= 2;
        }
        Ok(None)
    }
}
