//! A whole training run as a value: what `smelt train` does, callable from
//! the library and from Python. [`train`] takes an opened [`Session`] (its
//! training step built), a [`Run`] (data, length, backend, checkpoints,
//! save) and a [`Progress`] to report to, checks everything it can before
//! compiling, compiles once, runs the steps and returns a [`Summary`].

use super::{evaluate, load_checkpoint, set_weights, with_tied, Config, Data, Evaluation, Length, StepReport, Trainer};
use crate::device::Loaded;
use crate::driver::Error;
use crate::report::human_bytes;
use crate::Session;
use smelt_ir::{Graph, OpSet, TensorType};
use smelt_passes::train::{CeLayout, Initializer, Loss};
use smelt_runtime::exec::{Device, Executor};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Where a program runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The compiled program's kernel descriptions, on the CPU.
    #[default]
    Cpu,
    /// Its generated CUDA C, compiled for and run on the CPU.
    Emulator,
    /// GPU 0.
    Cuda,
}

impl Backend {
    /// The names `--backend` takes.
    pub const NAMES: [&'static str; 3] = ["cpu", "emulator", "cuda"];

    /// Its name.
    pub fn name(self) -> &'static str {
        Backend::NAMES[self as usize]
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Backend, String> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "emulator" => Ok(Backend::Emulator),
            "cuda" => Ok(Backend::Cuda),
            _ => Err(format!("unknown backend {s:?}: cpu, emulator or cuda")),
        }
    }
}

/// What a training run does besides the step itself (which the session's
/// options hold): `smelt train`'s flags, typed.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// The training data (`.npz`), or `synthetic[:N]`.
    pub data: PathBuf,
    /// Validation data, as `data`.
    pub val: Option<PathBuf>,
    /// Steps or epochs (default: one epoch).
    pub length: Option<Length>,
    /// Where the step runs.
    pub backend: Backend,
    /// Refuse to start when the step's device memory is over this.
    pub memory_limit: Option<usize>,
    /// Write the model with the trained weights here (an `.onnx` model).
    pub save: Option<PathBuf>,
    /// Keep a checkpoint in this folder, every `every` steps and at the end.
    pub checkpoint: Option<PathBuf>,
    /// Steps between checkpoints.
    pub every: Option<u64>,
    /// Continue from the checkpoint in this folder.
    pub resume: Option<PathBuf>,
    /// Seed of the data order (and of synthetic data).
    pub seed: u64,
    /// Take the samples in file order every epoch.
    pub no_shuffle: bool,
    /// Write one JSON line per step and the summary last.
    pub log_json: Option<PathBuf>,
    /// Make this optimizer step's gradients overflow (tests of loss scaling).
    pub inject_overflow: Option<usize>,
}

impl Run {
    /// What can be checked of the run before the model is opened (and
    /// [`train`] checks again): the checkpoint cadence, and the target of
    /// `save` (an `.onnx` model's, a folder that takes a new file), so a bad
    /// target is said before the first step rather than after the last.
    pub fn check(&self, spec: &str) -> Result<(), Error> {
        let usage = |m: String| Error::Usage(m);
        if self.every == Some(0) {
            return Err(usage("--every must be at least 1".into()));
        }
        if self.every.is_some() && self.checkpoint.is_none() {
            return Err(usage("--every needs --checkpoint DIR".into()));
        }
        if self.save.is_some() && !spec.to_ascii_lowercase().ends_with(".onnx") {
            return Err(usage(format!(
                "--save writes the trained weights into the ONNX model: {spec} is not an .onnx file (use --checkpoint to keep its weights)"
            )));
        }
        if let Some(path) = &self.save {
            super::check_writable(path).map_err(|why| usage(format!("--save {}: {why}", path.display())))?;
        }
        Ok(())
    }
}

/// What a run is about to do, once everything is checked and compiled.
#[derive(Clone, Debug)]
pub struct Start {
    /// The model, as named.
    pub spec: String,
    /// The device, as its backend names it.
    pub device: String,
    /// Samples of the data set.
    pub samples: usize,
    /// The batch of an optimizer step and its micro-batches.
    pub batch: usize,
    /// Micro-batches per step.
    pub accumulate: usize,
    /// Optimizer steps per epoch.
    pub steps_per_epoch: usize,
    /// Steps in all, and the step it resumes after.
    pub total: usize,
    /// The step it resumes after (0: from the start).
    pub start: usize,
    /// Activation arena and weights region, bytes.
    pub arena: usize,
    /// Weights, optimizer state and accumulators, bytes.
    pub weights_bytes: usize,
    /// Which initializers train and why the others do not.
    pub initializers: String,
}

/// What a run reports as it goes (all optional; [`Quiet`] reports nothing).
pub trait Progress: Sync {
    /// `kernels` kernels are about to be compiled (emulator, CUDA).
    fn compiling(&self, _kernels: usize) {}
    /// One of them is.
    fn compiled(&self) {}
    /// Everything is checked and compiled; the steps start.
    fn started(&self, _start: &Start) {}
    /// A step ran.
    fn step(&self, _report: &StepReport) {}
    /// A validation pass after `epoch` (from 0).
    fn validated(&self, _epoch: usize, _eval: &Evaluation) {}
    /// Something the user should know (arrays of the data nobody reads).
    fn note(&self, _note: &str) {}
}

/// A [`Progress`] that reports nothing.
pub struct Quiet;
impl Progress for Quiet {}

/// Validation after an epoch.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EpochValidation {
    /// The step it followed.
    pub step: usize,
    /// Its loss.
    pub loss: f64,
    /// Its accuracy (cross-entropy).
    pub accuracy: Option<f64>,
}

/// What a run did: `smelt train --json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// The backend.
    pub backend: Backend,
    /// The device, as the backend names it.
    pub device: String,
    /// Steps in all (the last step's number).
    pub steps: usize,
    /// Steps this run ran.
    pub steps_run: usize,
    /// The step it resumed after.
    pub resumed_from: usize,
    /// Samples of the data set.
    pub samples: usize,
    /// The batch of an optimizer step.
    pub batch: usize,
    /// Micro-batches per step.
    pub accumulate: usize,
    /// Steps per epoch.
    pub steps_per_epoch: usize,
    /// Samples each epoch left out (a last partial batch).
    pub dropped_per_epoch: usize,
    /// The model's float initializers and what training did with them.
    pub initializers: Vec<Initializer>,
    /// The first step's loss.
    pub first_loss: Option<f32>,
    /// The last step's loss.
    pub final_loss: Option<f32>,
    /// The mean loss of the last epoch's steps.
    pub final_epoch_mean_loss: f32,
    /// Wall time of the steps.
    pub seconds: f64,
    /// Milliseconds per step.
    pub ms_per_step: f64,
    /// Samples per second.
    pub samples_per_sec: f64,
    /// The activation arena, bytes.
    pub arena_bytes: usize,
    /// Weights, optimizer state and accumulators, bytes.
    pub weights_bytes: usize,
    /// Both.
    pub device_bytes: usize,
    /// The last validation pass.
    pub validation: Option<Evaluation>,
    /// A validation pass after each epoch but the last.
    pub validation_per_epoch: Vec<EpochValidation>,
    /// Where the trained model was written.
    pub saved: Option<PathBuf>,
    /// The checkpoint folder.
    pub checkpoint: Option<PathBuf>,
    /// Initializers replaced in the model.
    pub weights_written: usize,
    /// The loss scale at the end (scaled losses).
    pub loss_scale: Option<f32>,
    /// Steps skipped (gradients not finite).
    pub skipped_steps: usize,
    /// The first step's number.
    #[serde(skip)]
    pub first_step: Option<usize>,
    /// The last step's number.
    #[serde(skip)]
    pub final_step: Option<usize>,
    /// Steps the final epoch mean is over.
    #[serde(skip)]
    pub final_epoch_steps: usize,
}

/// Trains the training step of `session` (opened with
/// [`crate::Options::train`], its constants' values filled) as `run` says,
/// reporting to `progress`. Everything that can be checked is checked
/// before the step is compiled: the options, the save target, the
/// checkpoint, the data.
pub fn train(mut s: Session, run: &Run, progress: &dyn Progress) -> Result<Summary, Error> {
    let usage = |m: String| Error::Usage(m);
    let Some(cfg) = s.options.train.clone() else {
        return Err(usage("smelt train needs an optimizer: --optimizer sgd, adam or adamw".into()));
    };
    run.check(&s.spec)?;
    let accumulate = cfg.optimizer.map_or(1, |o| o.accumulate());
    let micro = s.source.inputs().first().map_or(1, |&i| s.source.node(i).outputs[0].shape.first().copied().unwrap_or(1));
    // The recipe as checkpoints record it (the options as given: the loss
    // scaler is the checkpoint's own state).
    let given = smelt_passes::train::TrainConfig { loss_scale: false, ..cfg.clone() };
    let p = &s.options.precision;
    let config = Config {
        batch: micro * accumulate,
        accumulate,
        length: run.length.unwrap_or(Length::Epochs(1)),
        seed: run.seed,
        shuffle: !run.no_shuffle,
        recipe: super::recipe(&given, p, !s.options.no_fuse),
    };
    let (start, scaler, made_on) = match &run.resume {
        Some(dir) => load_checkpoint(dir, &config, &mut s.source)?,
        None => (0, None, None),
    };
    // The step's inputs and the data, checked before anything is compiled.
    let training = s.train.clone().ok_or_else(|| Error::Usage("the session has no training step (--train)".into()))?;
    let StepData { inputs, loss_on, cross_entropy } = StepData::of(&s)?;
    let classes = cross_entropy.as_ref().map(|l| l.classes);
    let set: Vec<&str> = s.options.known.iter().map(|(n, _)| n.as_str()).collect();
    let load = |path: &Path, draw: u64, least: usize| -> Result<Data, Error> {
        let d = match Data::synthetic_spec(&path.to_string_lossy()) {
            Some(n) => Data::synthetic(&inputs, classes, n?, run.seed, draw)?,
            None => Data::load(path, &inputs, classes, least)?,
        };
        if d.samples < least {
            return Err(Error::Data {
                file: d.file.display().to_string(),
                msg: format!("{} samples, fewer than one batch of {least}", d.samples),
            });
        }
        if let Some(name) = set.iter().find(|n| d.unused.iter().any(|u| u == *n)) {
            return Err(usage(format!(
                "--set {name}=... makes the input \"{name}\" a constant, and {} holds an array '{name}' for it: drop one of them",
                d.file.display()
            )));
        }
        if !d.unused.is_empty() {
            progress.note(&format!(
                "{} holds {} that no input of the training step reads",
                d.file.display(),
                d.unused.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
            ));
        }
        Ok(d)
    };
    let data = load(&run.data, 0, config.batch)?;
    if let Some(was) = made_on.filter(|&was| was != data.identity()) {
        let now = data.identity();
        return Err(usage(format!(
            "--resume: the checkpoint was made on {} samples (hash {:016x}), {} holds {} (hash {:016x}): resume on the same data",
            was.samples,
            was.fnv64,
            data.file.display(),
            now.samples,
            now.fnv64
        )));
    }
    let val = run.val.as_ref().map(|v| load(v, 1, 1)).transpose()?;
    let Some(total) = config.total_steps(data.samples) else {
        let asked = match config.length {
            Length::Steps(n) => format!("--steps {n}"),
            Length::Epochs(e) => format!("--epochs {e} of {} steps each", config.steps_per_epoch(data.samples)),
        };
        return Err(usage(format!(
            "{asked} is more steps than can be counted: a run counts at most {} micro-steps (its step counter is an f32): ask for fewer",
            Config::MAX_MICRO_STEPS
        )));
    };
    if start > total {
        return Err(usage(format!("the checkpoint has done {start} steps, more than the {total} asked for")));
    }
    if total == 0 {
        return Err(usage("nothing to train: 0 steps".into()));
    }
    let compiled = s.compile()?;
    let planned = s.plan(&compiled)?;
    let program = s.program(&compiled, &planned)?;
    let device_bytes = program.arena + program.weights_bytes;
    if let Some(limit) = run.memory_limit.filter(|&l| device_bytes > l) {
        return Err(Error::MemoryLimit {
            limit,
            arena: device_bytes,
            smaller_batch: None,
            message: format!(
                "the training step needs {} (activation arena {} + weights and optimizer state {}), over --memory-limit {}: try a smaller --batch, --accumulate K, or --precision mixed-bf16 (`smelt plan --train ... ` shows where the bytes go)",
                human_bytes(device_bytes),
                human_bytes(program.arena),
                human_bytes(program.weights_bytes),
                human_bytes(limit)
            ),
        });
    }
    let blob = program.weights_blob(&compiled.graph)?;
    let ctx = Loop {
        run,
        config,
        data,
        val,
        start,
        scaler,
        total,
        training,
        loss_on,
        cross_entropy,
        spec: s.spec.clone(),
        options: s.options.clone(),
    };
    match crate::device::load(program, &blob, run.backend, None, false, progress)? {
        Loaded::Cpu(e) => ctx.go(e, progress),
        Loaded::Emulator(e) => ctx.go(e, progress),
        Loaded::Cuda(e) => ctx.go(e, progress),
    }
}

/// What a training step reads of a data set.
pub struct StepData {
    /// The step's inputs: name and type (the first dimension the micro-batch).
    pub inputs: Vec<(String, TensorType)>,
    /// The output the loss reads.
    pub loss_on: String,
    /// The logits' layout under cross-entropy (none: the squared error).
    pub cross_entropy: Option<CeLayout>,
}

impl StepData {
    /// Of the training step of `s`.
    pub fn of(s: &Session) -> Result<StepData, Error> {
        let usage = |m: String| Error::Usage(m);
        let training = s.train.as_ref().ok_or_else(|| usage("the session has no training step (--train)".into()))?;
        let g = &s.source;
        let inputs = g.inputs().iter().map(|&i| (g.node(i).name.clone(), g.node(i).outputs[0].clone())).collect();
        let loss_on = match s.options.train.as_ref().and_then(|c| c.loss_on.clone()) {
            Some(o) => o,
            None => training.model.outputs().first().map(|(n, _)| n.clone()).ok_or_else(|| usage("the model has no outputs".into()))?,
        };
        let causal = matches!(training.step.loss, Loss::CausalLm { .. });
        let cross_entropy = match training.step.loss {
            Loss::CrossEntropy { .. } | Loss::CausalLm { .. } => {
                let (_, v) =
                    training.model.outputs().iter().find(|(n, _)| *n == loss_on).ok_or_else(|| usage("the loss's output".into()))?;
                Some(CeLayout::of(&training.model.ty(*v).shape, causal).map_err(|e| usage(format!("output {loss_on:?}: {e}")))?)
            }
            _ => None,
        };
        Ok(StepData { inputs, loss_on, cross_entropy })
    }
}

/// Everything the loop needs besides the executor.
struct Loop<'a> {
    run: &'a Run,
    config: Config,
    data: Data,
    val: Option<Data>,
    start: usize,
    scaler: Option<super::Scaler>,
    total: usize,
    training: crate::Training,
    loss_on: String,
    cross_entropy: Option<CeLayout>,
    spec: String,
    options: crate::Options,
}

impl Loop<'_> {
    fn go<D: Device>(self, exec: Executor<D>, progress: &dyn Progress) -> Result<Summary, Error> {
        let run = self.run;
        let device = exec.device().info().name;
        let (arena, weights_bytes) = (exec.program().arena, exec.program().weights_bytes);
        let mut t = Trainer::new(exec, self.data.clone(), self.config.clone(), self.start)?;
        if let Some(sc) = self.scaler {
            t.set_scaler(sc)?;
        }
        if let Some(at) = run.inject_overflow {
            t.inject_overflow_at(at);
        }
        let per_epoch = self.config.steps_per_epoch(self.data.samples);
        let dropped = self.data.samples - per_epoch * self.config.batch;
        let log_path = run.log_json.as_deref().unwrap_or(Path::new(""));
        let log_err = |e: std::io::Error| Error::Usage(format!("cannot write --log-json {}: {e}", log_path.display()));
        let mut log = match &run.log_json {
            Some(p) => Some(std::io::BufWriter::new(
                std::fs::File::create(p).map_err(|e| Error::Usage(format!("cannot create {}: {e}", p.display())))?,
            )),
            None => None,
        };
        progress.started(&Start {
            spec: self.spec.clone(),
            device: device.clone(),
            samples: self.data.samples,
            batch: self.config.batch,
            accumulate: self.config.accumulate,
            steps_per_epoch: per_epoch,
            total: self.total,
            start: self.start,
            arena,
            weights_bytes,
            initializers: super::initializers_summary(&self.training.step.initializers),
        });
        let mut model = self.training.model.clone();
        let rest = self.rest_model()?;
        // What the summary needs, whatever the number of steps: the first
        // and the last epoch's reports (memory per step would bound --steps).
        let mut first: Option<StepReport> = None;
        let mut reports: std::collections::VecDeque<StepReport> = std::collections::VecDeque::new();
        let mut ran = 0usize;
        let mut evals: Vec<EpochValidation> = Vec::new();
        let started = std::time::Instant::now();
        while t.steps_done() < self.total {
            let r = t.step()?;
            progress.step(&r);
            if let Some(w) = log.as_mut() {
                writeln!(w, "{}", serde_json::to_string(&r).expect("a report serializes")).map_err(log_err)?;
            }
            if let (Some(dir), Some(every)) = (&run.checkpoint, run.every) {
                if r.step as u64 % every == 0 {
                    t.save_checkpoint(dir)?;
                }
            }
            if let (Some(v), true) = (&self.val, r.epoch_end && r.step < self.total) {
                set_weights(&mut model, &with_tied(t.weights()?, &self.training.step.initializers))?;
                let e = evaluate(&model, rest.as_ref(), v, &self.loss_on, self.cross_entropy.as_ref())?;
                progress.validated(r.epoch, &e);
                evals.push(EpochValidation { step: r.step, loss: e.loss, accuracy: e.accuracy });
            }
            ran += 1;
            if first.is_none() {
                first = Some(r.clone());
            }
            if reports.len() == per_epoch.max(1) {
                reports.pop_front();
            }
            reports.push_back(r);
        }
        let secs = started.elapsed().as_secs_f64();
        if let Some(dir) = &run.checkpoint {
            t.save_checkpoint(dir)?;
        }
        let weights = with_tied(t.weights()?, &self.training.step.initializers);
        let set = set_weights(&mut model, &weights)?;
        let final_eval = match &self.val {
            Some(v) => Some(evaluate(&model, rest.as_ref(), v, &self.loss_on, self.cross_entropy.as_ref())?),
            None => None,
        };
        if let Some(path) = &run.save {
            if let Some((name, _)) = weights.iter().find(|(_, t)| t.ty().dtype.is_float() && t.to_f32_vec().iter().any(|x| !x.is_finite()))
            {
                return Err(Error::NonFiniteWeights { step: self.total, name: name.clone() });
            }
            let names: std::collections::HashSet<&str> =
                model.node_ids().filter(|&n| model.node(n).op.is_persistent()).map(|n| model.node(n).name.as_str()).collect();
            let trained: HashMap<String, smelt_ir::Tensor> = weights.iter().filter(|(n, _)| names.contains(n.as_str())).cloned().collect();
            let src = Path::new(&self.spec);
            let io = |what: String| move |error: std::io::Error| Error::Model(smelt_ir::IrError::Io { path: what, error });
            let bytes = std::fs::read(src).map_err(io(self.spec.clone()))?;
            let out = smelt_ir::onnx::with_initializers(&bytes, src.parent(), &trained)?;
            super::write_atomically(path, &out).map_err(io(path.display().to_string()))?;
        }
        let last_epoch: Vec<f32> = reports.iter().map(|r| r.loss).collect();
        let summary = Summary {
            backend: run.backend,
            device,
            steps: self.total,
            steps_run: ran,
            resumed_from: self.start,
            samples: self.data.samples,
            batch: self.config.batch,
            accumulate: self.config.accumulate,
            steps_per_epoch: per_epoch,
            dropped_per_epoch: dropped,
            initializers: self.training.step.initializers.clone(),
            first_loss: first.as_ref().map(|r| r.loss),
            final_loss: reports.back().map(|r| r.loss),
            final_epoch_mean_loss: last_epoch.iter().sum::<f32>() / last_epoch.len().max(1) as f32,
            seconds: secs,
            ms_per_step: secs * 1e3 / ran.max(1) as f64,
            samples_per_sec: (ran * self.config.batch) as f64 / secs.max(1e-9),
            arena_bytes: arena,
            weights_bytes,
            device_bytes: arena + weights_bytes,
            validation: final_eval,
            validation_per_epoch: evals,
            saved: run.save.clone(),
            checkpoint: run.checkpoint.clone(),
            weights_written: set,
            loss_scale: t.scaler().map(|s| s.scale),
            skipped_steps: t.scaler().map_or(0, |s| s.skipped),
            first_step: first.as_ref().map(|r| r.step),
            final_step: reports.back().map(|r| r.step),
            final_epoch_steps: last_epoch.len(),
        };
        if let Some(w) = log.as_mut() {
            writeln!(w, "{}", serde_json::json!({ "summary": summary })).map_err(log_err)?;
            w.flush().map_err(log_err)?;
        }
        Ok(summary)
    }

    /// The model's forward pass at the validation remainder's batch, when
    /// the validation set does not split into whole batches.
    fn rest_model(&self) -> Result<Option<Graph>, Error> {
        let Some(v) = &self.val else { return Ok(None) };
        let b =
            self.training.model.inputs().first().map_or(1, |&i| self.training.model.node(i).outputs[0].shape.first().copied().unwrap_or(1));
        let r = v.samples % b.max(1);
        if r == 0 || self.spec.ends_with(".tir") {
            return Ok(None);
        }
        let k = self.config.accumulate;
        let s = Session::open(&self.spec, crate::Options { batch: Some(r * k), ..self.options.clone() })?;
        Ok(s.train.map(|t| t.model))
    }
}
