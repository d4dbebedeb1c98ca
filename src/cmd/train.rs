//! `smelt train`: the library's training run ([`smelt::train::train`]) with
//! progress bars on standard error and its summary as text or JSON.

use crate::Open as _;
use crate::TrainCmdArgs;
use anyhow::Result;
use indicatif::ProgressBar;
use smelt::report::human_bytes;
use smelt::train::{Evaluation, Length, Progress, Run, Start, StepReport, Summary};
use std::sync::Mutex;

/// `smelt train`.
pub fn run(a: &TrainCmdArgs) -> Result<bool> {
    // TF32 is the GPU's (as PyTorch): the CPU computes in f32 unless asked.
    let mut m = a.model.spec()?;
    m.apply_recipe()?;
    if a.backend == smelt::train::Backend::Cpu {
        m.no_tf32_by_default();
    }
    if m.train.optimizer.is_none() {
        anyhow::bail!("smelt train needs an optimizer: --optimizer sgd, adam or adamw");
    }
    let run = Run {
        data: a.data.clone(),
        val: a.val.clone(),
        length: match (a.epochs, a.steps) {
            (_, Some(n)) => Some(Length::Steps(n)),
            (e, None) => Some(Length::Epochs(e.unwrap_or(1))),
        },
        backend: a.backend,
        memory_limit: a.memory_limit,
        save: a.save.clone(),
        checkpoint: a.checkpoint.clone(),
        every: a.every,
        resume: a.resume.clone(),
        seed: a.seed,
        no_shuffle: a.no_shuffle,
        log_json: a.log_json.clone(),
        inject_overflow: a.inject_overflow,
    };
    let bars = Bars { json: a.json, compile: Mutex::new(None), steps: Mutex::new(None) };
    run.check(&m.model)?;
    let s = m.session_with_values()?;
    let summary = smelt::train::train(s, &run, &bars);
    for bar in [&bars.compile, &bars.steps] {
        if let Some(b) = bar.lock().expect("not poisoned").take() {
            b.finish_and_clear();
        }
    }
    let summary = summary?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(true);
    }
    print(&summary)?;
    Ok(true)
}

/// The bars of a run on standard error (none with `--json`).
struct Bars {
    json: bool,
    compile: Mutex<Option<ProgressBar>>,
    steps: Mutex<Option<ProgressBar>>,
}

impl Progress for Bars {
    fn compiling(&self, kernels: usize) {
        let bar = super::bar(kernels, "{spinner} compiling kernels {bar:30} {pos}/{len}", self.json);
        *self.compile.lock().expect("not poisoned") = Some(bar);
    }

    fn compiled(&self) {
        if let Some(b) = &*self.compile.lock().expect("not poisoned") {
            b.inc(1);
        }
    }

    fn started(&self, s: &Start) {
        if let Some(b) = self.compile.lock().expect("not poisoned").take() {
            b.finish_and_clear();
        }
        if !self.json {
            errln!(
                "training {} on {}: {} samples, batch {}{}, {} steps per epoch, {} steps{}; device memory {} (arena {} + weights and state {})",
                s.spec,
                s.device,
                s.samples,
                s.batch,
                if s.accumulate > 1 { format!(" ({} micro-batches)", s.accumulate) } else { String::new() },
                s.steps_per_epoch,
                s.total,
                if s.start > 0 { format!(", resuming after step {}", s.start) } else { String::new() },
                human_bytes(s.arena + s.weights_bytes),
                human_bytes(s.arena),
                human_bytes(s.weights_bytes)
            );
            errln!("{}", s.initializers);
        }
        let memory = human_bytes(s.arena + s.weights_bytes);
        let bar = super::bar(
            s.total - s.start,
            &format!("{{spinner}} step {{msg}} {memory} {{bar:24}} {{pos}}/{{len}} [{{elapsed}} < {{eta}}]"),
            self.json,
        );
        *self.steps.lock().expect("not poisoned") = Some(bar);
    }

    fn step(&self, r: &StepReport) {
        if let Some(b) = &*self.steps.lock().expect("not poisoned") {
            b.set_message(format!("{} loss {:.4} {:.0} samples/s", r.step, r.loss, r.samples_per_sec));
            b.inc(1);
        }
    }

    fn validated(&self, epoch: usize, e: &Evaluation) {
        if self.json {
            return;
        }
        let line = format!("epoch {}: validation loss {:.4}{}", epoch + 1, e.loss, accuracy(e.accuracy));
        match &*self.steps.lock().expect("not poisoned") {
            Some(b) => b.suspend(|| errln!("{line}")),
            None => errln!("{line}"),
        }
    }

    fn note(&self, note: &str) {
        if !self.json {
            errln!("note: {note}");
        }
    }
}

/// The summary as text.
fn print(s: &Summary) -> Result<()> {
    outln!(
        "trained {} steps ({} to {}) in {:.2} s: {:.2} ms per step, {:.0} samples/s on {}",
        s.steps_run,
        s.resumed_from,
        s.steps,
        s.seconds,
        s.ms_per_step,
        s.samples_per_sec,
        s.device
    );
    if let (Some(f), Some(fs), Some(l), Some(ls)) = (s.first_loss, s.first_step, s.final_loss, s.final_step) {
        outln!(
            "loss: {f:.4} at step {fs} -> {l:.4} at step {ls} (mean of the last {} steps {:.4})",
            s.final_epoch_steps,
            s.final_epoch_mean_loss
        );
    }
    if let Some(scale) = s.loss_scale {
        outln!("loss scaling: {} of {} steps skipped (gradients not finite), the scale is now {scale}", s.skipped_steps, s.steps);
    }
    if s.dropped_per_epoch > 0 {
        outln!(
            "each epoch used {} of {} samples: the last {} do not fill a batch of {}",
            s.steps_per_epoch * s.batch,
            s.samples,
            s.dropped_per_epoch,
            s.batch
        );
    }
    if let Some(e) = &s.validation {
        outln!(
            "validation ({} samples, the forward pass on the CPU reference executor): loss {:.4}{}",
            e.samples,
            e.loss,
            accuracy(e.accuracy)
        );
    }
    outln!(
        "device memory: {} (activation arena {} + weights and optimizer state {}), fixed before the first step",
        human_bytes(s.device_bytes),
        human_bytes(s.arena_bytes),
        human_bytes(s.weights_bytes)
    );
    if let Some(p) = &s.saved {
        outln!("saved the trained model to {} ({} initializers replaced)", p.display(), s.weights_written);
    }
    if let Some(d) = &s.checkpoint {
        outln!("checkpoint: {} (step {})", d.display(), s.steps);
    }
    Ok(())
}

fn accuracy(a: Option<f64>) -> String {
    a.map_or(String::new(), |a| format!(", accuracy {:.2}%", 100.0 * a))
}
