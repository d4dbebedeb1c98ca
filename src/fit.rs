//! `smelt fit`: the fastest training recipe under a memory limit, found
//! statically (no device run).
//!
//! A recipe is a micro-batch (a divisor of the batch) with the matching
//! gradient accumulation, a precision and, when the step still does not
//! fit, a recomputation budget. Each candidate is compiled and planned as
//! `smelt plan --train` would (its memory is the checked plan's arena plus
//! the persistent weights and state, exactly) and timed on a GPU's roofline
//! ([`crate::cost`]).
//!
//! The search: for each precision, micro-batches from the largest down.
//! The first that fits without recomputation ends that precision's walk:
//! a smaller one runs the same FLOPs in more launches with fewer threads
//! each, which the roofline never makes faster. Then the micro-batches that
//! did not fit are tried with recomputation (its budget the limit less the
//! persistent bytes), fastest first, and only where even without it their
//! step beats the best that fits. The fastest recipe wins; ties go to the
//! precision listed first (f32, then bf16, then f16) and the larger
//! micro-batch.

use crate::cost::{self, Gpu};
use crate::driver::{Error, Options, Remat, RematReport, Session};
use crate::plan::TrainBreakdown;
use serde::{Deserialize, Serialize};
use smelt_passes::precision::Policy;

/// What `smelt fit` searches.
#[derive(Clone, Debug)]
pub struct Request {
    /// The model (a path or `zoo:NAME`).
    pub spec: String,
    /// The options every candidate shares: dims, fusion, the training
    /// step's configuration (its accumulation is the search's).
    pub options: Options,
    /// The whole batch of an optimizer step.
    pub batch: usize,
    /// Device memory for the step: arena plus persistent bytes.
    pub limit: usize,
    /// The precisions to try, in order of preference.
    pub precisions: Vec<Policy>,
    /// Dynamic loss scaling under f16 (as `smelt train`).
    pub loss_scale: bool,
    /// Data parallelism: GPUs, each running `batch / gpus` samples per
    /// optimizer step (1: none).
    pub gpus: usize,
    /// What the GPUs shard (ZeRO's stages).
    pub shard: Shard,
    /// Which solver chooses the recomputation.
    pub solver: crate::RematSolver,
}

impl Request {
    /// The GPU whose roofline times the step (its options' target's).
    pub fn gpu(&self) -> Gpu {
        self.options.target.gpu
    }
}

/// What data-parallel GPUs shard among themselves, as ZeRO's stages 1 to 3.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shard {
    /// Every GPU holds everything; gradients are all-reduced.
    #[default]
    None,
    /// The optimizer state (ZeRO-1).
    Optimizer,
    /// Optimizer state and gradient accumulators (ZeRO-2).
    Gradients,
    /// Optimizer state, accumulators and parameters (ZeRO-3).
    Parameters,
}

/// One collective of a data-parallel step (planned, not run).
#[derive(Clone, Debug, Serialize)]
pub struct Collective {
    /// `all-reduce`, `reduce-scatter` or `all-gather`.
    pub op: &'static str,
    /// What it moves.
    pub what: &'static str,
    /// Bytes of the whole tensor set (each GPU sends and receives
    /// `(gpus - 1) / gpus` of it, twice for an all-reduce).
    pub bytes: usize,
    /// In buckets of this many bytes.
    pub bucket: usize,
    /// Times per optimizer step.
    pub times: usize,
    /// Estimated seconds per optimizer step on the GPU's links (ring).
    pub seconds: f64,
}

/// The data-parallel part of a recipe: a plan, not run.
#[derive(Clone, Debug, Serialize)]
pub struct DataParallel {
    /// GPUs.
    pub gpus: usize,
    /// What they shard.
    pub shard: Shard,
    /// Per GPU: the persistent bytes one GPU alone would hold.
    pub unsharded_persistent_bytes: usize,
    /// The collectives of one optimizer step.
    pub collectives: Vec<Collective>,
    /// Their summed time, added to the step (no overlap with compute assumed).
    pub communication_seconds: f64,
}

/// Gradient buckets of 25 MiB, as PyTorch's DDP.
const BUCKET: usize = 25 << 20;
/// Seconds per bucket besides its bytes (launch and synchronisation).
const BUCKET_LATENCY: f64 = 20e-6;

/// How a candidate fared.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// It fits (with recomputation when `remat` says so).
    Fits,
    /// Over the limit, and recomputation was not tried: the persistent
    /// bytes alone exceed it.
    PersistentOverLimit,
    /// Over the limit even recomputing: the smallest arena recomputation
    /// reached.
    RematCannotReach {
        /// That arena, bytes.
        smallest_arena: usize,
    },
    /// Over the limit, and not worth recomputing: even without
    /// recomputation its step is no faster than a recipe that fits.
    Slower {
        /// Its step's seconds without recomputation.
        without_remat: f64,
    },
    /// Not a recipe smelt can run yet.
    Refused {
        /// Why.
        reason: String,
    },
}

/// One recipe tried.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Precision policy.
    pub precision: String,
    /// Samples per micro-step.
    pub micro_batch: usize,
    /// Micro-steps per optimizer step.
    pub accumulate: usize,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The activation arena of one micro-step (with recomputation when it fits by it).
    pub arena_bytes: usize,
    /// Weights, optimizer state, accumulators: outside the arena.
    pub persistent_bytes: usize,
    /// Arena + persistent.
    pub total_bytes: usize,
    /// The arena without recomputation.
    pub arena_without_remat: usize,
    /// Estimated seconds per optimizer step (all micro-steps).
    pub step_seconds: f64,
    /// FLOPs per optimizer step.
    pub step_flops: usize,
    /// FLOPs of recomputation per optimizer step.
    pub recompute_flops: usize,
    /// FLOPs of the forward pass (with the loss) per optimizer step.
    pub forward_flops: usize,
    /// What recomputation did (when it was needed and reached the budget).
    pub remat: Option<RematReport>,
    /// Where the bytes go.
    pub breakdown: TrainBreakdown,
    /// Seconds spent deciding it (compile, plan, recomputation).
    pub seconds: f64,
    /// With `--gpus`: the data-parallel plan (memory and time are per GPU).
    pub data_parallel: Option<DataParallel>,
    /// The weights blob of one GPU holding everything.
    #[serde(skip)]
    blob: usize,
}

impl Candidate {
    /// Whether it fits.
    pub fn fits(&self) -> bool {
        matches!(self.verdict, Verdict::Fits)
    }

    /// The recipe this candidate is.
    pub fn recipe(&self, req: &Request, optimizer: &str) -> Recipe {
        Recipe {
            smelt_recipe: 1,
            model: req.spec.clone(),
            dims: req.options.dims.clone(),
            optimizer: optimizer.to_string(),
            batch: req.batch,
            micro_batch: self.micro_batch,
            accumulate: self.accumulate,
            precision: self.precision.clone(),
            remat_budget: self.remat.as_ref().map(|r| r.budget),
            remat_solver: self.remat.as_ref().map_or(req.solver, |r| r.solver),
            device: req.gpu().name.to_string(),
            gpus: req.gpus,
            shard: req.shard,
            predicted: Prediction {
                arena_bytes: self.arena_bytes,
                persistent_bytes: self.persistent_bytes,
                total_bytes: self.total_bytes,
                step_seconds: self.step_seconds,
                recompute_flops_fraction: self.recompute_flops as f64 / self.step_flops.max(1) as f64,
                recomputed: self.remat.as_ref().map_or(0, |r| r.recomputed.len()),
            },
        }
    }
}

/// What `smelt fit` found.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Every candidate tried, in order.
    pub candidates: Vec<Candidate>,
    /// The index of the chosen one, if any fits.
    pub chosen: Option<usize>,
    /// When nothing fits: the smallest footprint found (recomputing all it
    /// can, at the smallest micro-batch), with what it consists of.
    pub smallest: Option<Candidate>,
    /// The GPU assumed.
    pub gpu: Gpu,
    /// Seconds the search took.
    pub decision_seconds: f64,
    /// How the search went.
    pub search: Search,
}

/// How a search went: what it planned, what it ruled out without planning
/// (and why), and where its time went.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Search {
    /// Recipes compiled and planned as they are (a precision and a
    /// micro-batch each).
    pub planned: usize,
    /// Micro-batches never compiled: smaller than one that fits as it is
    /// (slower), or refused for the same reason as a larger one.
    pub bounded_smaller: usize,
    /// Recipes over the limit not recomputed: their step without
    /// recomputation is no faster than the best that fits.
    pub bounded_slower: usize,
    /// Recipes recomputed under the limit (compiled and planned again).
    pub recomputed: usize,
    /// Seconds compiling and planning recipes as they are.
    pub plan_seconds: f64,
    /// Seconds recomputing.
    pub recompute_seconds: f64,
    /// Seconds finding the smallest footprint, when nothing fits.
    pub floor_seconds: f64,
}

/// A recipe, as `smelt fit --save-recipe` writes it and `--recipe` reads it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Recipe {
    /// Format version (1).
    pub smelt_recipe: u32,
    /// The model it was made for.
    pub model: String,
    /// Its `--dim` sizes.
    #[serde(default)]
    pub dims: Vec<(String, usize)>,
    /// `sgd`, `adam` or `adamw`.
    pub optimizer: String,
    /// The whole batch of an optimizer step.
    pub batch: usize,
    /// Samples per micro-step (`batch / accumulate`).
    pub micro_batch: usize,
    /// Micro-steps per optimizer step.
    pub accumulate: usize,
    /// Precision policy.
    pub precision: String,
    /// The arena budget recomputation meets (`--remat-budget`), bytes.
    pub remat_budget: Option<usize>,
    /// The solver that chose the recomputation (`--remat-solver`).
    #[serde(default)]
    pub remat_solver: crate::RematSolver,
    /// The GPU whose roofline chose it.
    pub device: String,
    /// Data-parallel GPUs (a plan: smelt runs one).
    #[serde(default = "one")]
    pub gpus: usize,
    /// What they shard.
    #[serde(default)]
    pub shard: Shard,
    /// What `smelt fit` predicted (`smelt plan --recipe` plans the same).
    pub predicted: Prediction,
}

fn one() -> usize {
    1
}

/// A recipe's predicted memory and time.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Prediction {
    /// The planned arena of a micro-step, bytes.
    pub arena_bytes: usize,
    /// Weights, optimizer state and accumulators, bytes.
    pub persistent_bytes: usize,
    /// Both.
    pub total_bytes: usize,
    /// Estimated seconds per optimizer step.
    pub step_seconds: f64,
    /// Recomputation's FLOPs over the step's.
    pub recompute_flops_fraction: f64,
    /// Recomputed kernels.
    pub recomputed: usize,
}

impl Recipe {
    /// Reads and checks a recipe file.
    pub fn load(path: &std::path::Path) -> Result<Recipe, Error> {
        let bad = |msg: String| Error::Data { file: path.display().to_string(), msg };
        let text = crate::read_text(path, 1 << 20).map_err(bad)?;
        let r: Recipe = serde_json::from_str(&text).map_err(|e| bad(format!("not a smelt recipe: {e}")))?;
        if r.smelt_recipe != 1 {
            return Err(bad(format!("recipe format {} (this smelt reads 1)", r.smelt_recipe)));
        }
        let product = r.micro_batch.checked_mul(r.accumulate).and_then(|x| x.checked_mul(r.gpus));
        if r.gpus == 0 || r.accumulate == 0 || r.micro_batch == 0 || product != Some(r.batch) || u32::try_from(r.accumulate).is_err() {
            let (b, m, k, n) = (r.batch, r.micro_batch, r.accumulate, r.gpus);
            return Err(bad(format!("batch {b} is not micro-batch {m} x accumulate {k} x {n} GPUs")));
        }
        if r.precision.parse::<Policy>().is_err() {
            return Err(bad(format!("unknown precision {:?}", r.precision)));
        }
        if cost::gpu(&r.device).is_none() {
            return Err(bad(format!("unknown device {:?}", r.device)));
        }
        if !["sgd", "adam", "adamw"].contains(&r.optimizer.as_str()) {
            return Err(bad(format!("unknown optimizer {:?}", r.optimizer)));
        }
        Ok(r)
    }
}

/// The divisors of `n`, largest first.
pub fn divisors(n: usize) -> Vec<usize> {
    let mut out: Vec<usize> = (1..).take_while(|d| d * d <= n).filter(|d| n.is_multiple_of(*d)).flat_map(|d| [d, n / d]).collect();
    out.sort_unstable_by(|a, b| b.cmp(a));
    out.dedup();
    out
}

/// Searches the recipes of `req` (see the module's notes). `progress` hears
/// of each candidate as it is decided.
pub fn search(req: &Request, progress: &mut dyn FnMut(&Candidate)) -> Result<Outcome, Error> {
    let t = std::time::Instant::now();
    if req.options.train.as_ref().and_then(|t| t.optimizer).is_none() {
        return Err(Error::Usage("smelt fit needs an optimizer: --train sgd, adam or adamw".into()));
    }
    if req.batch == 0 {
        return Err(Error::Usage("--batch must be at least 1".into()));
    }
    if req.gpus == 0 || !req.batch.is_multiple_of(req.gpus) {
        return Err(Error::Usage(format!("--gpus {}: the batch {} does not split evenly over them", req.gpus, req.batch)));
    }
    if req.gpus == 1 && req.shard != Shard::None {
        return Err(Error::Usage("--shard needs --gpus 2 or more".into()));
    }
    // First every recipe as it is, then recomputation where it could win.
    let mut candidates = Vec::new();
    let mut over = Vec::new();
    let mut search = Search::default();
    let phase = std::time::Instant::now();
    for &p in &req.precisions {
        let sizes = divisors(req.batch / req.gpus);
        for (k, &m) in sizes.iter().enumerate() {
            // The step is not kept (a session holds the model's weights):
            // the few worth recomputing are compiled again below.
            let (c, _) = prepare(req, p, m, Some(req.limit))?;
            search.planned += 1;
            // Smaller micro-batches are slower where this one fits as it
            // is, and refused for the same reason where it is refused.
            let done = c.fits() || matches!(c.verdict, Verdict::Refused { .. });
            if matches!(c.verdict, Verdict::RematCannotReach { .. }) {
                over.push((candidates.len(), p));
            }
            progress(&c);
            candidates.push(c);
            if done {
                search.bounded_smaller += sizes.len() - k - 1;
                break;
            }
        }
    }
    search.plan_seconds = phase.elapsed().as_secs_f64();
    let phase = std::time::Instant::now();
    // Recomputation only adds time: a recipe whose step without it is no
    // faster than the best that fits is not worth it. Most promising first.
    over.sort_by(|a, b| candidates[a.0].step_seconds.total_cmp(&candidates[b.0].step_seconds));
    for (i, precision) in over {
        let best = candidates.iter().filter(|c| c.fits()).map(|c| c.step_seconds).fold(f64::INFINITY, f64::min);
        let c = &mut candidates[i];
        if c.step_seconds >= best {
            c.verdict = Verdict::Slower { without_remat: c.step_seconds };
            search.bounded_slower += 1;
        } else if let (again, Some(step)) = prepare(req, precision, c.micro_batch, None)? {
            let before = c.seconds;
            *c = again;
            c.seconds += before;
            recompute(req, c, step, req.limit.saturating_sub(c.persistent_bytes))?;
            search.recomputed += 1;
        }
        progress(c);
    }
    search.recompute_seconds = phase.elapsed().as_secs_f64();
    let phase = std::time::Instant::now();
    let chosen = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.fits())
        .min_by(|(i, a), (j, b)| a.step_seconds.total_cmp(&b.step_seconds).then(i.cmp(j)))
        .map(|(i, _)| i);
    // Nothing fits: the floor, recomputing everything it can at the smallest micro-batch.
    let smallest = match chosen {
        Some(_) => None,
        None => {
            let mut best: Option<Candidate> = None;
            for &p in &req.precisions {
                let (mut c, step) = prepare(req, p, 1, None)?;
                let Some(step) = step else { continue };
                recompute(req, &mut c, step, 0)?;
                if best.as_ref().is_none_or(|b| c.total_bytes < b.total_bytes) {
                    best = Some(c);
                }
            }
            best
        }
    };
    search.floor_seconds = phase.elapsed().as_secs_f64();
    Ok(Outcome { candidates, chosen, smallest, gpu: req.gpu(), decision_seconds: t.elapsed().as_secs_f64(), search })
}

/// A compiled training step, kept for recomputation.
pub struct Step {
    session: Session,
    compiled: crate::driver::Compiled,
}

/// Compiles, plans and times one recipe without recomputation; with its
/// step when it does not fit `limit` (or there is none) and recomputation
/// might help (the persistent bytes alone fit).
pub fn prepare(req: &Request, precision: Policy, micro: usize, limit: Option<usize>) -> Result<(Candidate, Option<Step>), Error> {
    let per_gpu = req.batch / req.gpus.max(1);
    let k = per_gpu / micro;
    let mut options = req.options.clone();
    options.batch = Some(per_gpu);
    options.precision.policy = precision;
    options.remat = None;
    let scaled = req.loss_scale && matches!(precision, Policy::F16 | Policy::MixedF16);
    if let Some(t) = options.train.as_mut() {
        t.loss_scale = scaled;
        if let Some(o) = t.optimizer.as_mut() {
            set_accumulate(o, k);
        }
    }
    let mut c = Candidate {
        precision: precision.to_string(),
        micro_batch: micro,
        accumulate: k,
        verdict: Verdict::Fits,
        arena_bytes: 0,
        persistent_bytes: 0,
        total_bytes: 0,
        arena_without_remat: 0,
        step_seconds: 0.0,
        step_flops: 0,
        recompute_flops: 0,
        forward_flops: 0,
        remat: None,
        breakdown: TrainBreakdown::default(),
        seconds: 0.0,
        data_parallel: None,
        blob: 0,
    };
    if scaled && k > 1 {
        c.verdict = Verdict::Refused { reason: "f16 loss scaling with accumulation: smelt train refuses it (use mixed-bf16)".into() };
        return Ok((c, None));
    }
    let t = std::time::Instant::now();
    let mut session = Session::open(&req.spec, options)?;
    let compiled = session.compile()?;
    let planned = session.plan(&compiled)?;
    // What `smelt train` allocates beside the arena: the weights blob
    // (parameters, optimizer state, accumulators, constants; aligned).
    c.blob = session.program(&compiled, &planned)?.weights_bytes;
    c.arena_without_remat = planned.plan.arena;
    describe(&mut c, &session, &compiled, &planned, req);
    c.seconds = t.elapsed().as_secs_f64();
    match limit {
        Some(l) if c.total_bytes <= l => Ok((c, None)),
        Some(l) if c.persistent_bytes >= l => {
            c.verdict = Verdict::PersistentOverLimit;
            Ok((c, None))
        }
        _ => {
            c.verdict = Verdict::RematCannotReach { smallest_arena: c.arena_bytes };
            Ok((c, Some(Step { session, compiled })))
        }
    }
}

/// Recomputes saved activations of `c`'s step until its arena fits
/// `budget`; with the smallest arena reached when it cannot.
pub fn recompute(req: &Request, c: &mut Candidate, step: Step, budget: usize) -> Result<(), Error> {
    let t = std::time::Instant::now();
    let Step { mut session, mut compiled } = step;
    let remat = |budget| Remat { budget, target: req.options.target.clone(), solver: req.solver };
    match session.rematerialize(&mut compiled, &remat(budget)) {
        Ok(()) => c.verdict = Verdict::Fits,
        Err(Error::RematBudget { smallest, .. }) => {
            c.verdict = Verdict::RematCannotReach { smallest_arena: smallest };
            if budget > 0 {
                c.seconds += t.elapsed().as_secs_f64();
                return Ok(());
            }
            // The floor: recompute down to the smallest arena reached, to
            // show what it consists of.
            session.rematerialize(&mut compiled, &remat(smallest))?;
        }
        Err(e) => return Err(e),
    }
    let planned = session.plan(&compiled)?;
    describe(c, &session, &compiled, &planned, req);
    c.remat = compiled.remat;
    c.seconds += t.elapsed().as_secs_f64();
    Ok(())
}

/// Fills `c`'s memory and time from a compiled, planned step.
fn describe(c: &mut Candidate, s: &Session, compiled: &crate::driver::Compiled, planned: &crate::driver::Planned, req: &Request) {
    let k = c.accumulate;
    let forward = &s.train.as_ref().expect("a training session").step.forward;
    c.breakdown = crate::plan::train_breakdown(&compiled.graph, &planned.plan, forward);
    c.arena_bytes = planned.plan.arena;
    c.persistent_bytes = c.blob;
    c.step_seconds = cost::graph_time(&compiled.graph, &req.options.target) * k as f64;
    if req.gpus > 1 {
        let dp = data_parallel(&c.breakdown, c.blob, k, req);
        // Sharded parameters are gathered a layer at a time: the largest,
        // twice (the one in use and the next), in the arena's stead.
        let gathered = if req.shard == Shard::Parameters { 2 * largest_parameter(&compiled.graph) } else { 0 };
        c.persistent_bytes = c.blob - (dp.unsharded_persistent_bytes - sharded_persistent(&c.breakdown, c.blob, req)) + gathered;
        c.step_seconds += dp.communication_seconds;
        c.data_parallel = Some(dp);
    }
    c.total_bytes = c.arena_bytes + c.persistent_bytes;
    c.step_flops = cost::graph_flops(&compiled.graph) * k;
    c.recompute_flops = compiled.remat.as_ref().map_or(0, |r| r.flops * k);
    let g = &compiled.graph;
    let in_forward = |n| g.node(n).recomputes.is_none() && !g.origin(n).is_empty() && g.origin(n).iter().all(|o| forward.contains(o));
    c.forward_flops = g.node_ids().filter(|&n| in_forward(n)).map(|n| cost::node_flops(g, n)).sum::<usize>() * k;
}

/// Sets an optimizer's gradient accumulation.
fn set_accumulate(o: &mut smelt_ir::Optimizer, k: usize) {
    use smelt_ir::Optimizer;
    if let Optimizer::Sgd { accumulate, .. } | Optimizer::Adam { accumulate, .. } = o {
        *accumulate = k;
    }
}

/// The persistent bytes one GPU holds when `req.gpus` shard what
/// `req.shard` says of `blob` (parameters, optimizer state, accumulators
/// split evenly; frozen values and counters whole).
fn sharded_persistent(b: &TrainBreakdown, blob: usize, req: &Request) -> usize {
    let n = req.gpus.max(1);
    let shard = |bytes: usize| bytes - bytes / n;
    let saved = match req.shard {
        Shard::None => 0,
        Shard::Optimizer => shard(b.optimizer_state.bytes),
        Shard::Gradients => shard(b.optimizer_state.bytes) + shard(b.accumulators.bytes),
        Shard::Parameters => shard(b.optimizer_state.bytes) + shard(b.accumulators.bytes) + shard(b.parameters.bytes),
    };
    blob - saved
}

/// The largest trained parameter of `g`, bytes.
fn largest_parameter(g: &smelt_ir::KernelGraph) -> usize {
    use smelt_ir::OpSet;
    g.node_ids()
        .filter(|&n| g.node(n).op.semantic() == Some(&smelt_ir::Op::Parameter))
        .map(|n| g.node(n).outputs[0].bytes())
        .max()
        .unwrap_or(0)
}

/// The collectives of a data-parallel step and their time on ring links.
fn data_parallel(b: &TrainBreakdown, blob: usize, k: usize, req: &Request) -> DataParallel {
    let n = req.gpus;
    let grads = b.parameters.bytes; // f32 gradients, one per parameter
    let ring = |bytes: usize, factor: f64, times: usize| {
        let buckets = bytes.div_ceil(BUCKET).max(1);
        times as f64 * (factor * (n - 1) as f64 / n as f64 * bytes as f64 / req.gpu().link + buckets as f64 * BUCKET_LATENCY)
    };
    let mut cs = Vec::new();
    let mut add = |op: &'static str, what: &'static str, bytes: usize, factor: f64, times: usize| {
        cs.push(Collective { op, what, bytes, bucket: BUCKET, times, seconds: ring(bytes, factor, times) });
    };
    match req.shard {
        // The gradients summed over the micro-steps, then all-reduced once
        // (DDP's no_sync); ZeRO-1 updates its shard and gathers the rest.
        Shard::None => add("all-reduce", "gradients", grads, 2.0, 1),
        Shard::Optimizer => {
            add("reduce-scatter", "gradients", grads, 1.0, 1);
            add("all-gather", "updated parameters", grads, 1.0, 1);
        }
        // Each micro-step's gradients go to their shard's owner at once.
        Shard::Gradients => {
            add("reduce-scatter", "gradients", grads, 1.0, k);
            add("all-gather", "updated parameters", grads, 1.0, 1);
        }
        // The parameters are gathered for the forward and again for the
        // backward pass of every micro-step.
        Shard::Parameters => {
            add("all-gather", "parameters (forward)", grads, 1.0, k);
            add("all-gather", "parameters (backward)", grads, 1.0, k);
            add("reduce-scatter", "gradients", grads, 1.0, k);
        }
    }
    let communication_seconds = cs.iter().map(|c| c.seconds).sum();
    DataParallel { gpus: n, shard: req.shard, unsharded_persistent_bytes: blob, collectives: cs, communication_seconds }
}

/// Everything `smelt fit` computes: the request its flags make, what the
/// search found and the recipe chosen. The CLI prints it; the Python
/// package wraps it.
#[derive(Clone, Debug)]
pub struct Fitting {
    /// The model as the user named it.
    pub model: String,
    /// The request.
    pub request: Request,
    /// `sgd`, `adam` or `adamw`.
    pub optimizer: String,
    /// What the search found.
    pub outcome: Outcome,
    /// The chosen recipe (none when nothing fits).
    pub recipe: Option<Recipe>,
}

impl Fitting {
    /// Searches the recipes of `request` (for a step with `optimizer`,
    /// `sgd`, `adam` or `adamw`), calling `progress` after each candidate.
    pub fn run(request: Request, optimizer: String, progress: &mut dyn FnMut(&Candidate)) -> Result<Fitting, Error> {
        let outcome = search(&request, progress)?;
        let recipe = outcome.chosen.map(|i| outcome.candidates[i].recipe(&request, &optimizer));
        Ok(Fitting { model: request.spec.clone(), request, optimizer, outcome, recipe })
    }

    /// The chosen candidate.
    pub fn chosen(&self) -> Option<&Candidate> {
        self.outcome.chosen.map(|i| &self.outcome.candidates[i])
    }

    /// `smelt fit --json`.
    pub fn json(&self) -> serde_json::Value {
        let out = &self.outcome;
        serde_json::json!({
            "model": self.model,
            "batch": self.request.batch,
            "optimizer": self.optimizer,
            "memory_limit": self.request.limit,
            "device": out.gpu,
            "decision_seconds": out.decision_seconds,
            "search": out.search,
            "recipe": self.recipe,
            "chosen": self.chosen(),
            "candidates": out.candidates,
            "smallest": out.smallest,
        })
    }

    /// Why nothing fits, with the smallest footprint found.
    pub fn nothing_fits(&self) -> String {
        let floor = self
            .outcome
            .smallest
            .as_ref()
            .map_or(String::new(), |c| format!(": the smallest footprint is {}", crate::report::human_bytes(c.total_bytes)));
        format!("no recipe of {} fits in {}{floor}", self.model, crate::report::human_bytes(self.request.limit))
    }
}
