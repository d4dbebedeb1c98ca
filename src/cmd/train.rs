//! `smelt train`: a compiled training step run on the batches of a data
//! set, on the CPU (the kernel descriptions), the emulator or a GPU; the
//! trained weights written back into the ONNX model.

use crate::Open as _;
use crate::TrainCmdArgs;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use smelt::report::human_bytes;
use smelt::train::{evaluate, load_checkpoint, set_weights, with_tied, Config, Data, Evaluation, Length, StepReport, Trainer};
use smelt_codegen::{nvrtc::Compiler, program::compile_all};
use smelt_ir::{Graph, OpSet, TensorType};
use smelt_passes::train::CeLayout;
use smelt_runtime::exec::{Device, Executor};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;

/// `smelt train`.
pub fn run(a: &TrainCmdArgs) -> Result<bool> {
    // TF32 is the GPU's (as PyTorch): the CPU computes in f32 unless asked.
    let mut m = a.model.clone();
    if a.backend == "cpu" {
        m.no_tf32_by_default();
    }
    let m = &m;
    let Some(cfg) = m.train.config()? else {
        bail!("smelt train needs an optimizer: --optimizer sgd, adam or adamw");
    };
    if a.every.is_some() && a.checkpoint.is_none() {
        bail!("--every needs --checkpoint DIR");
    }
    if a.save.is_some() && !m.model.to_ascii_lowercase().ends_with(".onnx") {
        bail!(
            "--save writes the trained weights into the ONNX model: {} is not an .onnx file (use --checkpoint to keep its weights)",
            m.model
        );
    }
    // Where the result goes, checked before the first step rather than after the last.
    if let Some(path) = &a.save {
        smelt::train::check_writable(path).map_err(|why| anyhow::anyhow!("--save {}: {why}", path.display()))?;
    }
    let mut s = m.session_with_values()?;
    let accumulate = cfg.optimizer.map_or(1, |o| o.accumulate());
    let micro = s.source.inputs().first().map_or(1, |&i| s.source.node(i).outputs[0].shape.first().copied().unwrap_or(1));
    let length = match (a.epochs, a.steps) {
        (_, Some(n)) => Length::Steps(n),
        (e, None) => Length::Epochs(e.unwrap_or(1)),
    };
    let config = Config {
        batch: micro * accumulate,
        accumulate,
        length,
        seed: a.seed,
        shuffle: !a.no_shuffle,
        recipe: format!("{cfg:?}; precision {}; keep-f32 {:?}; fusion {}", m.precision, m.keep_f32, !m.no_fuse),
    };
    let (start, scaler, made_on) = match &a.resume {
        Some(dir) => load_checkpoint(dir, &config, &mut s.source)?,
        None => (0, None, None),
    };
    // The step's inputs and the data, checked before anything is compiled.
    let training = s.train.clone().expect("a training session");
    let inputs: Vec<(String, TensorType)> =
        s.source.inputs().iter().map(|&i| (s.source.node(i).name.clone(), s.source.node(i).outputs[0].clone())).collect();
    let loss_on = match &cfg.loss_on {
        Some(o) => o.clone(),
        None => training.model.outputs().first().map(|(n, _)| n.clone()).context("the model has no outputs")?,
    };
    // Cross-entropy's layout of the logits (None: mean squared error).
    let causal = matches!(training.step.loss, smelt_passes::train::Loss::CausalLm { .. });
    let cross_entropy = match training.step.loss {
        smelt_passes::train::Loss::CrossEntropy { .. } | smelt_passes::train::Loss::CausalLm { .. } => {
            let (_, v) = training.model.outputs().iter().find(|(n, _)| *n == loss_on).context("the loss's output")?;
            Some(CeLayout::of(&training.model.ty(*v).shape, causal).map_err(|e| anyhow!("output {loss_on:?}: {e}"))?)
        }
        _ => None,
    };
    let classes = cross_entropy.as_ref().map(|l| l.classes);
    let load = |path: &Path, draw: u64, least: usize| -> Result<Data> {
        let d = match Data::synthetic_spec(&path.to_string_lossy()) {
            Some(n) => Data::synthetic(&inputs, classes, n?, a.seed, draw)?,
            None => Data::load(path, &inputs, classes, least)?,
        };
        if d.samples < least {
            bail!("{}: {} samples, fewer than one batch of {least}", d.file.display(), d.samples);
        }
        if let Some((name, _)) = m.set.iter().find(|(n, _)| d.unused.contains(n)) {
            bail!(
                "--set {name}=... makes the input \"{name}\" a constant, and {} holds an array '{name}' for it: drop one of them",
                d.file.display()
            );
        }
        if !d.unused.is_empty() && !a.json {
            errln!(
                "note: {} holds {} that no input of the training step reads",
                d.file.display(),
                d.unused.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(d)
    };
    let data = load(&a.data, 0, config.batch)?;
    if let Some(was) = made_on.filter(|&was| was != data.identity()) {
        let now = data.identity();
        bail!(
            "--resume: the checkpoint was made on {} samples (hash {:016x}), {} holds {} (hash {:016x}): resume on the same data",
            was.samples,
            was.fnv64,
            data.file.display(),
            now.samples,
            now.fnv64
        );
    }
    let val = a.val.as_ref().map(|v| load(v, 1, 1)).transpose()?;
    let Some(total) = config.total_steps(data.samples) else {
        let asked = match config.length {
            Length::Steps(n) => format!("--steps {n}"),
            Length::Epochs(e) => format!("--epochs {e} of {} steps each", config.steps_per_epoch(data.samples)),
        };
        bail!(
            "{asked} is more steps than can be counted: a run counts at most {} micro-steps (its step counter is an f32): ask for fewer",
            smelt::train::Config::MAX_MICRO_STEPS
        );
    };
    if start > total {
        bail!("the checkpoint has done {start} steps, more than the {total} asked for");
    }
    if total == 0 {
        bail!("nothing to train: 0 steps");
    }
    let compiled = s.compile().with_context(|| format!("cannot compile {}", m.model))?;
    let planned = s.plan(&compiled)?;
    let program = s.program(&compiled, &planned).with_context(|| format!("cannot generate code for {}", m.model))?;
    let device_bytes = program.arena + program.weights_bytes;
    if let Some(limit) = a.memory_limit {
        if device_bytes > limit {
            bail!(
                "the training step needs {} (activation arena {} + weights and optimizer state {}), over --memory-limit {}: try a smaller --batch, --accumulate K, or --precision mixed-bf16 (`smelt plan --train ... ` shows where the bytes go)",
                human_bytes(device_bytes),
                human_bytes(program.arena),
                human_bytes(program.weights_bytes),
                human_bytes(limit)
            );
        }
    }
    let blob = program.weights_blob(&compiled.graph)?;
    let ctx = Run {
        a,
        config,
        data,
        val,
        start,
        scaler,
        total,
        training,
        loss_on,
        cross_entropy,
        spec: m.model.clone(),
        options: s.options.clone(),
    };
    match a.backend.as_str() {
        "cpu" => ctx.go(Executor::new(smelt_runtime::host::HostDevice::new(), program, &blob, None)?),
        "emulator" => {
            let bar = super::bar(program.sources().len(), "{spinner} compiling kernels for the emulator {bar:30} {pos}/{len}", a.json);
            let exec = smelt_runtime::emu::executor(program, &blob, &|_| bar.inc(1)).context("cannot prepare the emulator")?;
            bar.finish_and_clear();
            ctx.go(exec)
        }
        _ => {
            if let Some(why) = smelt_runtime::cuda::unavailable() {
                bail!("--backend cuda needs an NVIDIA GPU: {why}");
            }
            let sources = program.sources();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let bar = super::bar(sources.len(), "{spinner} compiling kernels {bar:30} {pos}/{len}", a.json);
            let kernels = compile_all(&Compiler::default(), &sources, threads, &|_| bar.inc(1)).context("kernel compilation failed")?;
            bar.finish_and_clear();
            let ptx: HashMap<String, String> = sources.iter().map(|(n, _)| n.clone()).zip(kernels.into_iter().map(|c| c.ptx)).collect();
            ctx.go(smelt_runtime::cuda::executor(program, ptx, &blob, None, false)?)
        }
    }
}

/// Everything the loop needs besides the executor.
struct Run<'a> {
    a: &'a TrainCmdArgs,
    config: Config,
    data: Data,
    val: Option<Data>,
    start: usize,
    scaler: Option<smelt::train::Scaler>,
    total: usize,
    training: smelt::Training,
    loss_on: String,
    cross_entropy: Option<CeLayout>,
    spec: String,
    options: smelt::Options,
}

impl Run<'_> {
    fn go<D: Device>(self, exec: Executor<D>) -> Result<bool> {
        let a = self.a;
        let device = exec.device().info().name;
        let (arena, weights_bytes) = (exec.program().arena, exec.program().weights_bytes);
        let mut t = Trainer::new(exec, self.data.clone(), self.config.clone(), self.start)?;
        if let Some(sc) = self.scaler {
            t.set_scaler(sc)?;
        }
        if let Some(at) = a.inject_overflow {
            t.inject_overflow_at(at);
        }
        let per_epoch = self.config.steps_per_epoch(self.data.samples);
        let dropped = self.data.samples - per_epoch * self.config.batch;
        let mut log = match &a.log_json {
            Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?)),
            None => None,
        };
        let log_err = || format!("cannot write --log-json {}", a.log_json.as_deref().unwrap_or(Path::new("")).display());
        let bar = super::bar(self.total - self.start, "{spinner} step {msg} {bar:24} {pos}/{len} [{elapsed} < {eta}]", a.json);
        if !a.json {
            errln!(
                "training {} on {device}: {} samples, batch {}{}, {} steps per epoch, {} steps{}; device memory {} (arena {} + weights and state {})",
                self.spec,
                self.data.samples,
                self.config.batch,
                if self.config.accumulate > 1 { format!(" ({} micro-batches)", self.config.accumulate) } else { String::new() },
                per_epoch,
                self.total,
                if self.start > 0 { format!(", resuming after step {}", self.start) } else { String::new() },
                human_bytes(arena + weights_bytes),
                human_bytes(arena),
                human_bytes(weights_bytes)
            );
            errln!("{}", smelt::train::initializers_summary(&self.training.step.initializers));
        }
        let mut model = self.training.model.clone();
        let rest = self.rest_model()?;
        // What the summary needs, whatever the number of steps: the first
        // and the last epoch's reports (memory per step would bound --steps).
        let mut first: Option<StepReport> = None;
        let mut reports: std::collections::VecDeque<StepReport> = std::collections::VecDeque::new();
        let mut ran = 0usize;
        let mut evals: Vec<(usize, Evaluation)> = Vec::new();
        let started = std::time::Instant::now();
        while t.steps_done() < self.total {
            let r = t.step()?;
            bar.set_message(format!(
                "{} loss {:.4} {:.0} samples/s {}",
                r.step,
                r.loss,
                r.samples_per_sec,
                human_bytes(arena + weights_bytes)
            ));
            bar.inc(1);
            if let Some(w) = log.as_mut() {
                writeln!(w, "{}", serde_json::to_string(&r)?).with_context(log_err)?;
            }
            if let (Some(dir), Some(every)) = (&a.checkpoint, a.every) {
                if r.step as u64 % every == 0 {
                    t.save_checkpoint(dir)?;
                }
            }
            if let (Some(v), true) = (&self.val, r.epoch_end && r.step < self.total) {
                set_weights(&mut model, &with_tied(t.weights()?, &self.training.step.initializers))?;
                let e = evaluate(&model, rest.as_ref(), v, &self.loss_on, self.cross_entropy.as_ref())?;
                if !a.json {
                    bar.suspend(|| errln!("epoch {}: validation loss {:.4}{}", r.epoch + 1, e.loss, accuracy(&e)));
                }
                evals.push((r.step, e));
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
        bar.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        if let Some(dir) = &a.checkpoint {
            t.save_checkpoint(dir)?;
        }
        let weights = with_tied(t.weights()?, &self.training.step.initializers);
        let set = set_weights(&mut model, &weights)?;
        let final_eval = match &self.val {
            Some(v) => Some(evaluate(&model, rest.as_ref(), v, &self.loss_on, self.cross_entropy.as_ref())?),
            None => None,
        };
        if let Some(path) = &a.save {
            if let Some((name, _)) = weights.iter().find(|(_, t)| t.ty().dtype.is_float() && t.to_f32_vec().iter().any(|x| !x.is_finite()))
            {
                return Err(smelt::Error::NonFiniteWeights { step: self.total, name: name.clone() }.into());
            }
            let names: std::collections::HashSet<&str> =
                model.node_ids().filter(|&n| model.node(n).op.is_persistent()).map(|n| model.node(n).name.as_str()).collect();
            let trained: HashMap<String, smelt_ir::Tensor> = weights.iter().filter(|(n, _)| names.contains(n.as_str())).cloned().collect();
            let src = Path::new(&self.spec);
            let bytes = std::fs::read(src).with_context(|| format!("cannot read {}", self.spec))?;
            let out = smelt_ir::onnx::with_initializers(&bytes, src.parent(), &trained)
                .context("cannot write the trained weights into the model")?;
            smelt::train::write_atomically(path, &out).with_context(|| format!("cannot write {}", path.display()))?;
        }
        let last_epoch: Vec<f32> = reports.iter().map(|r| r.loss).collect();
        let summary = json!({
            "backend": a.backend, "device": device, "steps": self.total, "steps_run": ran, "resumed_from": self.start,
            "samples": self.data.samples, "batch": self.config.batch, "accumulate": self.config.accumulate,
            "steps_per_epoch": per_epoch, "dropped_per_epoch": dropped, "initializers": self.training.step.initializers,
            "first_loss": first.as_ref().map(|r| r.loss), "final_loss": reports.back().map(|r| r.loss),
            "final_epoch_mean_loss": last_epoch.iter().sum::<f32>() / last_epoch.len().max(1) as f32,
            "seconds": secs, "ms_per_step": secs * 1e3 / ran.max(1) as f64,
            "samples_per_sec": (ran * self.config.batch) as f64 / secs.max(1e-9),
            "arena_bytes": arena, "weights_bytes": weights_bytes, "device_bytes": arena + weights_bytes,
            "validation": final_eval, "validation_per_epoch": evals.iter().map(|(s, e)| json!({"step": s, "loss": e.loss, "accuracy": e.accuracy})).collect::<Vec<_>>(),
            "saved": a.save, "checkpoint": a.checkpoint, "weights_written": set,
            "loss_scale": t.scaler().map(|s| s.scale), "skipped_steps": t.scaler().map_or(0, |s| s.skipped),
        });
        if let Some(w) = log.as_mut() {
            writeln!(w, "{}", json!({ "summary": summary })).with_context(log_err)?;
            w.flush().with_context(log_err)?;
        }
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&summary)?);
            return Ok(true);
        }
        outln!(
            "trained {} steps ({} to {}) in {secs:.2} s: {:.2} ms per step, {:.0} samples/s on {device}",
            ran,
            self.start,
            self.total,
            secs * 1e3 / ran.max(1) as f64,
            (ran * self.config.batch) as f64 / secs.max(1e-9)
        );
        if let (Some(f), Some(l)) = (first.as_ref(), reports.back()) {
            outln!(
                "loss: {:.4} at step {} -> {:.4} at step {} (mean of the last {} steps {:.4})",
                f.loss,
                f.step,
                l.loss,
                l.step,
                last_epoch.len(),
                last_epoch.iter().sum::<f32>() / last_epoch.len() as f32
            );
        }
        if let Some(sc) = t.scaler() {
            outln!("loss scaling: {} of {} steps skipped (gradients not finite), the scale is now {}", sc.skipped, self.total, sc.scale);
        }
        if dropped > 0 {
            outln!(
                "each epoch used {} of {} samples: the last {dropped} do not fill a batch of {}",
                per_epoch * self.config.batch,
                self.data.samples,
                self.config.batch
            );
        }
        if let Some(e) = &final_eval {
            outln!("validation ({} samples, the forward pass on the CPU reference executor): loss {:.4}{}", e.samples, e.loss, accuracy(e));
        }
        outln!(
            "device memory: {} (activation arena {} + weights and optimizer state {}), fixed before the first step",
            human_bytes(arena + weights_bytes),
            human_bytes(arena),
            human_bytes(weights_bytes)
        );
        if let Some(p) = &a.save {
            outln!("saved the trained model to {} ({set} initializers replaced)", p.display());
        }
        if let Some(d) = &a.checkpoint {
            outln!("checkpoint: {} (step {})", d.display(), self.total);
        }
        Ok(true)
    }

    /// The model's forward pass at the validation remainder's batch, when
    /// the validation set does not split into whole batches.
    fn rest_model(&self) -> Result<Option<Graph>> {
        let Some(v) = &self.val else { return Ok(None) };
        let b =
            self.training.model.inputs().first().map_or(1, |&i| self.training.model.node(i).outputs[0].shape.first().copied().unwrap_or(1));
        let r = v.samples % b.max(1);
        if r == 0 || self.spec.ends_with(".tir") {
            return Ok(None);
        }
        let k = self.config.accumulate;
        let s = smelt::Session::open(&self.spec, smelt::Options { batch: Some(r * k), ..self.options.clone() })?;
        Ok(s.train.map(|t| t.model))
    }
}

fn accuracy(e: &Evaluation) -> String {
    e.accuracy.map_or(String::new(), |a| format!(", accuracy {:.2}%", 100.0 * a))
}
