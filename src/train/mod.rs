//! Training on data (`smelt train`): a compiled training step run again and
//! again on batches of a data set, on any [`Device`] (the CPU's kernel
//! descriptions, the emulator, a GPU), with the weights and the optimizer
//! state living in the program's persistent region from the first step to
//! the last. Nothing here allocates per step beyond a batch's host copy.
//!
//! - [`Data`]: the arrays of an `.npz`, checked against the step's inputs
//!   before any step runs (names, shapes, dtypes, finite values, labels in
//!   range).
//! - [`Trainer`]: the loop's state: the step counter, the epoch's order
//!   (a function of the seed and the epoch, so a checkpoint's RNG state is
//!   the seed and the step), [`Trainer::step`], [`Trainer::weights`],
//!   checkpoints ([`Trainer::save_checkpoint`], [`load_checkpoint`]).
//! - [`evaluate`]: the model's forward pass with the trained weights on the
//!   CPU reference executor: loss and accuracy on a data set.

mod run;

pub use run::{train, Backend, EpochValidation, Progress, Quiet, Run, Start, StepData, Summary};

use crate::driver::Error;
use smelt_codegen::program::Space;
use smelt_ir::{npy, DType, Graph, Op, OpSet, Rng, Tensor, TensorType};
use smelt_passes::train::{CeLayout, IGNORE_INDEX};
use smelt_runtime::exec::{Device, Executor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A data set: one array per input of the training step, all with the same
/// number of samples, as the step takes them.
#[derive(Clone, Debug)]
pub struct Data {
    /// The file it came from.
    pub file: PathBuf,
    /// Samples in every array.
    pub samples: usize,
    /// The file's arrays that feed no input of the step (a note to the user).
    pub unused: Vec<String>,
    columns: Vec<Column>,
}

#[derive(Clone, Debug)]
struct Column {
    /// The step input it feeds.
    input: String,
    /// The input's type (its first dimension is the micro-batch).
    ty: TensorType,
    /// Bytes of one sample.
    row: usize,
    /// Every sample's bytes, as the input's dtype.
    bytes: Vec<u8>,
}

/// The array keys that can feed `input` (of `model_inputs` inputs besides
/// the labels): its name; `x` for the only one; `y` for the labels or targets.
fn keys_for(input: &str, model_inputs: usize) -> Vec<String> {
    let mut keys = vec![input.to_string()];
    match input {
        "labels" | "targets" => keys.push("y".into()),
        _ if model_inputs == 1 => keys.push("x".into()),
        _ => {}
    }
    keys.dedup();
    keys
}

impl Data {
    /// The data set's identity, for checkpoints.
    pub fn identity(&self) -> DataIdentity {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for c in &self.columns {
            eat(c.input.as_bytes());
            eat(&c.bytes);
        }
        DataIdentity { samples: self.samples, fnv64: h }
    }

    /// Reads `path` for a step whose inputs are `inputs` (name, type at the
    /// micro-batch), the labels or targets last. `classes`: the number of
    /// classes that int labels must be below. Everything wrong is said
    /// here, before any step runs: a missing array, a wrong shape or dtype,
    /// arrays of different lengths, a value that is not finite, a label out
    /// of range, fewer samples than `batch`.
    pub fn load(path: &Path, inputs: &[(String, TensorType)], classes: Option<usize>, batch: usize) -> Result<Data, Error> {
        let file = path.display().to_string();
        let err = |msg: String| Error::Data { file: file.clone(), msg };
        let arrays = npy::read_npz(path)?;
        let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
        let model_inputs = inputs.iter().filter(|(n, _)| n != "labels" && n != "targets").count();
        let mut columns = Vec::with_capacity(inputs.len());
        let mut used: Vec<&str> = Vec::new();
        let mut samples: Option<(usize, String)> = None;
        for (input, ty) in inputs {
            let keys = keys_for(input, model_inputs);
            let found: Vec<&String> = arrays.iter().map(|(n, _)| n).filter(|n| keys.contains(n)).collect();
            if found.len() > 1 {
                return Err(err(format!(
                    "input \"{input}\" could take array {}: keep one, so that what is trained on is not a guess",
                    found.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(" or ")
                )));
            }
            let (key, a) = arrays.iter().find(|(n, _)| keys.contains(n)).ok_or_else(|| {
                err(format!(
                    "no array for input \"{input}\" (looked for {}); the archive holds {}",
                    keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(" or "),
                    if names.is_empty() {
                        "nothing".to_string()
                    } else {
                        names.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
                    }
                ))
            })?;
            used.push(key);
            let sample = &ty.shape[1..];
            let what = if input == "labels" { "labels" } else { "samples" };
            if a.shape().len() != ty.shape.len() || &a.shape()[1..] != sample {
                return Err(err(format!(
                    "array '{key}' is {}: input \"{input}\" takes {what} of shape {sample:?} ({ty} per micro-batch), so the array must be [N{}]",
                    a.ty(),
                    sample.iter().map(|d| format!(", {d}")).collect::<String>()
                )));
            }
            let integer = matches!(a.ty().dtype, DType::I64 | DType::I32 | DType::U8);
            let fits = if ty.dtype.is_float() { a.ty().dtype.is_float() } else { integer };
            if !fits {
                let want = if ty.dtype.is_float() { "floats (float32, float64 or float16)" } else { "integers (int64, int32 or uint8)" };
                return Err(err(format!("array '{key}' holds {}: input \"{input}\" takes {want}", a.ty().dtype.name())));
            }
            let n = a.shape()[0];
            match &samples {
                Some((m, other)) if *m != n => {
                    return Err(err(format!("array '{key}' has {n} samples but '{other}' has {m}: every array needs one row per sample")))
                }
                _ => samples = Some((n, key.clone())),
            }
            let a = a.cast(ty.dtype);
            if ty.dtype.is_float() {
                if let Some(i) = a.to_f32_vec().iter().position(|x| !x.is_finite()) {
                    let row = i / sample.iter().product::<usize>().max(1);
                    return Err(err(format!("array '{key}' holds a value that is not finite (NaN or infinite) in sample {row}")));
                }
            } else if input == "labels" {
                if let Some(c) = classes {
                    let per = sample.iter().product::<usize>().max(1);
                    let bad = |y: i64| (y < 0 && y != IGNORE_INDEX) || y >= c as i64;
                    if let Some((i, y)) = a.to_i64_vec().into_iter().enumerate().find(|&(_, y)| bad(y)) {
                        return Err(err(format!(
                            "label {y} of sample {} is out of range: the model has {c} classes (0 to {}; {IGNORE_INDEX} ignores a label)",
                            i / per,
                            c - 1
                        )));
                    }
                }
            }
            let row = ty.bytes() / ty.shape[0].max(1);
            columns.push(Column { input: input.clone(), ty: ty.clone(), row, bytes: a.data().to_le_bytes() });
        }
        let samples = samples.map_or(0, |(n, _)| n);
        if samples < batch {
            return Err(err(format!("{samples} samples, fewer than one batch of {batch}")));
        }
        let unused = names.iter().filter(|n| !used.contains(n)).map(|n| n.to_string()).collect();
        Ok(Data { file: path.to_path_buf(), samples, unused, columns })
    }

    /// The samples a spec `synthetic[:N]` asks for, if `spec` is one.
    pub fn synthetic_spec(spec: &str) -> Option<Result<usize, Error>> {
        let rest = spec.strip_prefix("synthetic")?;
        Some(match rest.strip_prefix(':') {
            None if rest.is_empty() => Ok(Data::SYNTHETIC_SAMPLES),
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::Usage(format!("{spec}: synthetic data takes a positive number of samples (synthetic:2048)"))),
            None => return None,
        })
    }

    /// Samples of `synthetic` data when no number is given.
    pub const SYNTHETIC_SAMPLES: usize = 2048;

    /// A generated classification task for the step's `inputs`: every class
    /// has a fixed prototype (a brightness that grows with the class, a
    /// random colour per channel and a random pattern, drawn from `seed`), and a sample is its class's prototype plus
    /// Gaussian noise of the same size; the labels are uniform. The task is
    /// separable and the same for every `draw`; `draw` picks the samples
    /// (training and validation sets use different draws).
    pub fn synthetic(inputs: &[(String, TensorType)], classes: Option<usize>, samples: usize, seed: u64, draw: u64) -> Result<Data, Error> {
        let file = PathBuf::from(format!("synthetic:{samples}"));
        let err = |msg: String| Error::Data { file: file.display().to_string(), msg };
        let Some(classes) = classes.filter(|&c| c >= 2) else {
            return Err(err(
                "synthetic data is a classification task: it needs a model whose loss is cross-entropy over two or more classes".into(),
            ));
        };
        for (input, ty) in inputs {
            let row = (ty.bytes() / ty.shape[0].max(1)).max(8);
            if row.checked_mul(samples).is_none_or(|b| b > Data::SYNTHETIC_LIMIT) {
                return Err(err(format!(
                    "{samples} samples of input \"{input}\" take more than {} bytes: ask for fewer",
                    Data::SYNTHETIC_LIMIT
                )));
            }
        }
        let mut labels_rng = Rng::new(seed ^ draw.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x6c61_6265_6c73);
        let labels: Vec<usize> = (0..samples).map(|_| labels_rng.below(classes)).collect();
        let mut columns = Vec::with_capacity(inputs.len());
        for (input, ty) in inputs {
            let sample: usize = ty.shape[1..].iter().product();
            let row = ty.bytes() / ty.shape[0].max(1);
            let mut shape = ty.shape.clone();
            shape[0] = samples;
            let values = if input == "labels" && sample == 1 {
                Tensor::from_i64(shape, labels.iter().map(|&y| y as i64).collect()).cast(ty.dtype)
            } else if input == "labels" || input == "targets" {
                return Err(err(format!("input \"{input}\" is {ty}: synthetic data makes one class index per sample only")));
            } else if ty.dtype.is_float() {
                // Prototypes: a colour per channel (dimension 1) and a pattern.
                let channels = ty.shape.get(1).copied().unwrap_or(1).max(1);
                let per_channel = sample / channels;
                let mut rng = Rng::new(seed ^ Rng::from_name(input).next_u64());
                let protos: Vec<Vec<f32>> = (0..classes)
                    .map(|c| {
                        let brightness = 3.0 * c as f32 / (classes - 1) as f32 - 1.5;
                        let colour: Vec<f32> = (0..channels).map(|_| brightness + rng.normal()).collect();
                        (0..sample).map(|i| colour[i / per_channel.max(1)] + 0.5 * rng.normal()).collect()
                    })
                    .collect();
                let mut noise = Rng::new(seed ^ draw.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ Rng::from_name(input).next_u64());
                let mut data = Vec::with_capacity(samples * sample);
                for &y in &labels {
                    data.extend(protos[y].iter().map(|p| p + noise.normal()));
                }
                Tensor::from_f32(shape, data).cast(ty.dtype)
            } else {
                return Err(err(format!(
                    "input \"{input}\" takes {} values: synthetic data makes float inputs only (give an .npz)",
                    ty.dtype.name()
                )));
            };
            columns.push(Column { input: input.clone(), ty: ty.clone(), row, bytes: values.data().to_le_bytes() });
        }
        Ok(Data { file, samples, unused: Vec::new(), columns })
    }

    /// The most bytes one input's synthetic data may take.
    pub const SYNTHETIC_LIMIT: usize = 1 << 30;

    /// The inputs named `names` (all of them when `None`) for the samples
    /// `idx`, in the data's column order, batched.
    pub fn gather(&self, idx: &[usize], names: Option<&[String]>) -> Vec<Tensor> {
        self.columns
            .iter()
            .filter(|c| names.is_none_or(|n| n.contains(&c.input)))
            .map(|c| {
                let mut bytes = Vec::with_capacity(c.row * idx.len());
                for &i in idx {
                    bytes.extend_from_slice(&c.bytes[i * c.row..(i + 1) * c.row]);
                }
                let mut shape = c.ty.shape.clone();
                shape[0] = idx.len();
                Tensor::from_le_bytes(&TensorType::new(c.ty.dtype, shape), &bytes).expect("rows of the input's type")
            })
            .collect()
    }

    /// The labels (or targets) of the samples `idx`.
    fn target(&self, idx: &[usize]) -> Option<Tensor> {
        let last = self.columns.last()?;
        matches!(last.input.as_str(), "labels" | "targets").then(|| self.gather(idx, Some(std::slice::from_ref(&last.input))).remove(0))
    }
}

/// The order of the samples in `epoch`: shuffled by a generator seeded with
/// the seed and the epoch (so any step's batch follows from the seed and
/// the step alone), or in file order.
pub fn epoch_order(seed: u64, epoch: usize, samples: usize, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..samples).collect();
    if shuffle {
        let mut rng = Rng::new(seed ^ (epoch as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in (1..samples).rev() {
            order.swap(i, rng.below(i + 1));
        }
    }
    order
}

/// How long to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Length {
    /// Whole passes over the data.
    Epochs(usize),
    /// Optimizer steps.
    Steps(usize),
}

/// What the loop does, besides the step itself.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Config {
    /// Samples per optimizer step.
    pub batch: usize,
    /// Micro-batches per optimizer step (the program's batch is batch / accumulate).
    pub accumulate: usize,
    /// How long.
    pub length: Length,
    /// Seed of the data order.
    pub seed: u64,
    /// Shuffle each epoch (else file order).
    pub shuffle: bool,
    /// What a checkpoint must agree on to be resumed: every option that
    /// changes the step ([`recipe`]; formats 1 and 2 held a string).
    pub recipe: serde_json::Value,
}

/// The recipe a checkpoint records and a resumed run must match: the loss,
/// the optimizer (its rule and attributes as the text IR spells them),
/// what trains, batch norms, clipping, precision and fusion, as JSON (the
/// loss scaler's state is the checkpoint's own).
pub fn recipe(cfg: &smelt_passes::train::TrainConfig, precision: &smelt_passes::precision::Options, fusion: bool) -> serde_json::Value {
    use serde_json::json;
    use smelt_ir::text::Attr;
    use smelt_passes::train::{BatchNorm, Loss};
    // f32s as their shortest decimal (0.001, not 0.0010000000474974513).
    let float = |x: f32| format!("{x:?}").parse::<f64>().map_or(json!(null), |v| json!(v));
    let loss = match cfg.loss {
        Loss::CrossEntropy { smoothing } => json!({ "cross_entropy": { "label_smoothing": float(smoothing) } }),
        Loss::CausalLm { smoothing } => json!({ "causal_lm": { "label_smoothing": float(smoothing) } }),
        Loss::MeanSquaredError => json!("mse"),
        Loss::Auto { smoothing } => json!({ "auto": { "label_smoothing": float(smoothing) } }),
    };
    let optimizer = cfg.optimizer.map(|o| {
        let mut m = serde_json::Map::new();
        m.insert("rule".into(), json!(o.name()));
        for (k, a) in smelt_ir::text::attrs_of(&smelt_ir::Op::Update(o)) {
            let v = match a {
                Attr::Float(x) => float(x),
                Attr::Int(i) => json!(i),
                Attr::Bool(b) => json!(b),
                a => json!(a.to_string()),
            };
            m.insert(k.into(), v);
        }
        serde_json::Value::Object(m)
    });
    let batch_norm = match cfg.batch_norm {
        BatchNorm::Frozen => json!("frozen"),
        BatchNorm::Train { momentum } => json!({ "train": { "momentum": float(momentum) } }),
    };
    json!({
        "loss": loss,
        "loss_on": cfg.loss_on,
        "optimizer": optimizer,
        "freeze": cfg.freeze,
        "only": cfg.only,
        "batch_norm": batch_norm,
        "clip_norm": cfg.clip_norm.map(float),
        "precision": precision.policy.to_string(),
        "keep_f32": precision.keep_f32,
        "fusion": fusion,
    })
}

impl Config {
    /// Optimizer steps per epoch (a last partial batch is dropped).
    pub fn steps_per_epoch(&self, samples: usize) -> usize {
        samples / self.batch
    }

    /// Optimizer steps in all; `None` where their micro-steps are more than
    /// [`Config::MAX_MICRO_STEPS`].
    pub fn total_steps(&self, samples: usize) -> Option<usize> {
        let steps = match self.length {
            Length::Epochs(e) => e.checked_mul(self.steps_per_epoch(samples)),
            Length::Steps(s) => Some(s),
        };
        steps.filter(|s| s.checked_mul(self.accumulate.max(1)).is_some_and(|m| m <= Config::MAX_MICRO_STEPS))
    }

    /// The most micro-steps a run counts: the step counter (`train.step`,
    /// which the schedule, Adam's bias correction and accumulation read) is
    /// an f32, exact up to 2^24.
    pub const MAX_MICRO_STEPS: usize = 1 << 24;
}

/// One optimizer step's result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepReport {
    /// Optimizer steps done, this one included.
    pub step: usize,
    /// The epoch it belongs to (from 0).
    pub epoch: usize,
    /// Whether it was the epoch's last.
    pub epoch_end: bool,
    /// The mean loss of its micro-batches.
    pub loss: f32,
    /// Whether its gradients overflowed, so that the optimizer skipped it.
    pub skipped: bool,
    /// The loss scale after it, when the loss is scaled.
    pub loss_scale: Option<f32>,
    /// Milliseconds it took (batch copies included).
    pub ms: f64,
    /// Samples per second over this step.
    pub samples_per_sec: f64,
}

/// A training step loaded on a device, with its data and the loop's state.
pub struct Trainer<D: Device> {
    exec: Executor<D>,
    data: Data,
    cfg: Config,
    step: usize,
    order: Option<(usize, Vec<usize>)>,
    loss_output: usize,
    state: Vec<Persistent>,
    /// With loss scaling: the output saying whether the gradients were
    /// finite, and the scaler's state.
    scaling: Option<(usize, Scaler)>,
    inject: Option<usize>,
}

/// Dynamic loss scaling as `torch.amp.GradScaler` does it: a step whose
/// gradients overflow is skipped and the scale halved; after
/// [`Scaler::GROWTH_INTERVAL`] clean steps in a row it doubles.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Scaler {
    /// The loss scale.
    pub scale: f32,
    /// Clean steps since the scale last changed.
    pub clean: usize,
    /// Steps skipped so far.
    pub skipped: usize,
}

impl Scaler {
    /// Clean steps before the scale doubles (GradScaler's `growth_interval`).
    pub const GROWTH_INTERVAL: usize = 2000;

    /// The state after a step whose gradients were finite (`ok`) or not.
    fn after(mut self, ok: bool) -> Scaler {
        if ok {
            self.clean += 1;
            if self.clean == Scaler::GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.clean = 0;
            }
        } else {
            self.scale *= 0.5;
            self.clean = 0;
            self.skipped += 1;
        }
        self
    }
}

/// A value an update writes: where it is in the weights blob.
#[derive(Clone, Debug)]
struct Persistent {
    name: String,
    ty: TensorType,
    offset: usize,
}

impl<D: Device> Trainer<D> {
    /// A trainer over `exec` (a training step's program, loaded with its
    /// weights and state) starting after `step` optimizer steps.
    pub fn new(exec: Executor<D>, data: Data, cfg: Config, step: usize) -> Result<Trainer<D>, Error> {
        let p = exec.program();
        let loss_output =
            p.outputs.iter().position(|o| o.name == "loss").ok_or_else(|| Error::Usage("the program has no loss output".into()))?;
        let state = p
            .outputs
            .iter()
            .zip(&p.output_types)
            .filter(|(o, _)| o.space == Space::Weights)
            .map(|(o, ty)| Persistent { name: o.name.clone(), ty: ty.clone(), offset: o.offset })
            .collect();
        if cfg.batch == 0 || cfg.accumulate == 0 || cfg.batch % cfg.accumulate != 0 {
            return Err(Error::Usage(format!("a batch of {} does not split into {} micro-batches", cfg.batch, cfg.accumulate)));
        }
        let guard = p.outputs.iter().position(|o| o.name == "train.grads_finite");
        let scaling = guard.map(|g| (g, Scaler { scale: smelt_passes::train::INITIAL_LOSS_SCALE, clean: 0, skipped: 0 }));
        if scaling.is_some() && cfg.accumulate > 1 {
            return Err(Error::Usage("loss scaling with accumulation is not supported".into()));
        }
        Ok(Trainer { exec, data, cfg, step, order: None, loss_output, state, scaling, inject: None })
    }

    /// The loss scaler's state, when the step scales its loss.
    pub fn scaler(&self) -> Option<Scaler> {
        self.scaling.map(|(_, s)| s)
    }

    /// Continues from a checkpoint's scaler state.
    pub fn set_scaler(&mut self, scaler: Scaler) -> Result<(), Error> {
        let Some((_, s)) = self.scaling.as_mut() else {
            return Err(Error::Usage("the checkpoint has a loss scaler but this step does not scale its loss".into()));
        };
        *s = scaler;
        self.exec.write_weight("train.loss_scale", &Tensor::from_f32(vec![], vec![scaler.scale]))?;
        Ok(())
    }

    /// Makes optimizer step `step` (from 1) overflow: its loss scale is
    /// infinite, so its gradients are, and the step must be skipped (a
    /// test of the skipping, end to end).
    pub fn inject_overflow_at(&mut self, step: usize) {
        self.inject = Some(step);
    }

    /// Optimizer steps done.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// The loop's configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The executor (its device and program).
    pub fn executor(&self) -> &Executor<D> {
        &self.exec
    }

    /// The data.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Runs one optimizer step: the next batch of the epoch's order, as
    /// `accumulate` micro-batches. A loss that is not finite is an error
    /// (the step has been applied: the weights are no longer usable).
    pub fn step(&mut self) -> Result<StepReport, Error> {
        let t = Instant::now();
        let per_epoch = self.cfg.steps_per_epoch(self.data.samples);
        let (epoch, pos) = (self.step / per_epoch, self.step % per_epoch);
        if self.order.as_ref().is_none_or(|(e, _)| *e != epoch) {
            self.order = Some((epoch, epoch_order(self.cfg.seed, epoch, self.data.samples, self.cfg.shuffle)));
        }
        let order = &self.order.as_ref().expect("set above").1;
        let batch = &order[pos * self.cfg.batch..(pos + 1) * self.cfg.batch];
        let micro = self.cfg.batch / self.cfg.accumulate;
        let mut loss = 0f64;
        let mut skipped = false;
        for part in batch.chunks(micro) {
            let ins = self.data.gather(part, None);
            let out = match self.scaling {
                None => self.exec.run_reading(&ins, &[self.loss_output])?,
                Some((guard, scaler)) => {
                    let injected = self.inject == Some(self.step + 1);
                    if injected {
                        self.exec.write_weight("train.loss_scale", &Tensor::from_f32(vec![], vec![f32::INFINITY]))?;
                    }
                    let (out, ok) = self.exec.run_guarded(&ins, &[self.loss_output], guard)?;
                    let next = scaler.after(ok);
                    if next.scale != scaler.scale || injected {
                        self.exec.write_weight("train.loss_scale", &Tensor::from_f32(vec![], vec![next.scale]))?;
                    }
                    self.scaling = Some((guard, next));
                    skipped |= !ok;
                    out
                }
            };
            loss += out[0].to_f32_vec().first().copied().unwrap_or(f32::NAN) as f64;
        }
        let loss = (loss / self.cfg.accumulate as f64) as f32;
        self.step += 1;
        if !loss.is_finite() && !skipped {
            return Err(Error::Diverged { step: self.step, loss });
        }
        let secs = t.elapsed().as_secs_f64();
        Ok(StepReport {
            step: self.step,
            epoch,
            epoch_end: pos + 1 == per_epoch,
            loss,
            skipped,
            loss_scale: self.scaler().map(|s| s.scale),
            ms: secs * 1e3,
            samples_per_sec: self.cfg.batch as f64 / secs.max(1e-9),
        })
    }

    /// Every value the updates write (parameters, batch-norm running
    /// statistics, optimizer state, the step counter), by name, as they are now.
    pub fn weights(&mut self) -> Result<Vec<(String, Tensor)>, Error> {
        let blob = self.exec.read_weights()?;
        self.state
            .iter()
            .map(|p| {
                let bytes = blob
                    .get(p.offset..p.offset + p.ty.bytes())
                    .ok_or_else(|| Error::Usage(format!("{} is outside the weights", p.name)))?;
                let t = Tensor::from_le_bytes(&p.ty, bytes).ok_or_else(|| Error::Usage(format!("{} does not hold a {}", p.name, p.ty)))?;
                Ok((p.name.clone(), t))
            })
            .collect()
    }

    /// Writes a checkpoint into `dir` as one commit: the values the updates
    /// write, by name, into a new `checkpoint-STEP.npz` (synced), then
    /// `checkpoint.json` (the step, the recipe, the data set's identity and
    /// that archive's name and size) written atomically: the commit. A kill
    /// at any instant leaves the previous checkpoint or this one, whole;
    /// then `checkpoint.npz` links to the archive, and archives no commit
    /// names (and the temporary files of a run killed while writing) are
    /// removed. Refuses to save non-finite values (the run has diverged: the
    /// last good checkpoint stays).
    pub fn save_checkpoint(&mut self, dir: &Path) -> Result<(), Error> {
        let io = |error: std::io::Error| Error::Model(smelt_ir::IrError::Io { path: dir.display().to_string(), error });
        std::fs::create_dir_all(dir).map_err(io)?;
        let arrays = self.weights()?;
        if let Some((name, _)) = arrays.iter().find(|(_, t)| t.ty().dtype.is_float() && t.to_f32_vec().iter().any(|x| !x.is_finite())) {
            return Err(Error::NonFiniteWeights { step: self.step, name: name.clone() });
        }
        let file = format!("checkpoint-{}.npz", self.step);
        npy::write_npz(&dir.join(&file), &arrays)?;
        let bytes = std::fs::metadata(dir.join(&file)).map_err(io)?.len();
        let meta = Checkpoint {
            format: 3,
            step: self.step,
            config: self.cfg.clone(),
            scaler: self.scaler(),
            arrays: Some(file.clone()),
            arrays_bytes: Some(bytes),
            data: Some(self.data.identity()),
        };
        write_atomically(&dir.join("checkpoint.json"), serde_json::to_string_pretty(&meta).expect("serializable").as_bytes())
            .map_err(io)?;
        // `checkpoint.npz` (for numpy.load) becomes a link to it, replaced
        // atomically; until then it names the previous archive, still there.
        let tmp = dir.join(format!(".checkpoint.npz.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&file, &tmp).map_err(io)?;
        #[cfg(not(unix))]
        std::fs::copy(dir.join(&file), &tmp).map_err(io)?;
        std::fs::rename(&tmp, dir.join("checkpoint.npz")).map_err(io)?;
        // Older archives, and what a run killed while writing left (its
        // archive's temporary file, or the link's or the JSON's).
        for e in std::fs::read_dir(dir).map_err(io)?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let archive = name.starts_with("checkpoint-") && (name.ends_with(".npz") || name.ends_with(".npz.tmp")) && name != file;
            if archive || (name.starts_with(".checkpoint.") && name.ends_with(".tmp")) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` as one commit: into a temporary file beside it,
/// synced to the disk, then renamed over `path` (and the folder synced), so
/// that a kill or a full disk at any instant leaves the old file or the new
/// one, never part of either.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let name = path.file_name().ok_or_else(|| std::io::Error::other("no file name"))?.to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename itself is durable once the folder is synced.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// Whether [`write_atomically`] can write `path`: its folder exists and
/// takes a new file (checked by making and removing one), and `path` is not
/// a folder. For targets checked before hours of training, not after.
pub fn check_writable(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("it is a folder".into());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let probe = dir.join(format!(".smelt-write-test.{}", std::process::id()));
    std::fs::File::create(&probe).map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// What `checkpoint.json` holds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// The format's version.
    pub format: u32,
    /// Optimizer steps done.
    pub step: usize,
    /// The loop's configuration (seed and recipe included).
    pub config: Config,
    /// The loss scaler's state, when the loss is scaled.
    #[serde(default)]
    pub scaler: Option<Scaler>,
    /// The archive of this checkpoint's values in its folder (format 2 on;
    /// format 1 had `checkpoint.npz`).
    #[serde(default)]
    pub arrays: Option<String>,
    /// That archive's size in bytes (each array in it carries its CRC-32).
    #[serde(default)]
    pub arrays_bytes: Option<u64>,
    /// The training data it was made on.
    #[serde(default)]
    pub data: Option<DataIdentity>,
}

/// What identifies a data set: its samples and a hash of every column's
/// name and bytes (FNV-1a, 64 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataIdentity {
    /// Samples.
    pub samples: usize,
    /// The hash.
    pub fnv64: u64,
}

/// Reads the checkpoint in `dir`, checks that it was made by the same
/// recipe and seed as `cfg`, that it is whole (its archive of the committed
/// size, every entry's CRC-32, every value the step updates present with
/// its type, finite, Adam's second moments non-negative, a positive loss
/// scale) and writes its values into `graph` (the training step, before it
/// is compiled). Returns the steps it had done, the loss scaler's state (for
/// [`Trainer::set_scaler`]) and the identity of the data it was made on
/// (format 2 on; check it with [`Data::identity`]).
pub fn load_checkpoint(dir: &Path, cfg: &Config, graph: &mut Graph) -> Result<(usize, Option<Scaler>, Option<DataIdentity>), Error> {
    let file = dir.join("checkpoint.json");
    let err = |msg: String| Error::Data { file: file.display().to_string(), msg };
    let text = crate::read_text(&file, 1 << 20).map_err(err)?;
    let meta: Checkpoint = serde_json::from_str(&text).map_err(|e| err(format!("not a smelt checkpoint: {e}")))?;
    if !(1..=3).contains(&meta.format) {
        return Err(err(format!("checkpoint format {} (this smelt reads format 3)", meta.format)));
    }
    if meta.format >= 2 && (meta.arrays.is_none() || meta.arrays_bytes.is_none() || meta.data.is_none()) {
        return Err(err(format!(
            "a format {} checkpoint names its archive, the archive's size and its data set: this one lacks one",
            meta.format
        )));
    }
    let same = |what: &str, a: String, b: String| {
        if a == b {
            Ok(())
        } else {
            Err(err(format!("it was made with {what} {a}, this run has {b}: resume with the same options")))
        }
    };
    match &meta.config.recipe {
        serde_json::Value::Object(_) => same("the recipe", meta.config.recipe.to_string(), cfg.recipe.to_string())?,
        // Formats 1 and 2 wrote the recipe as a Rust `Debug` string, which
        // no later smelt reproduces reliably.
        was => {
            return Err(err(format!(
                "checkpoint format {} records its recipe as {was}, which this smelt cannot compare with its own: resume it with the smelt that wrote it, or start over",
                meta.format
            )))
        }
    }
    same("--batch", meta.config.batch.to_string(), cfg.batch.to_string())?;
    same("--accumulate", meta.config.accumulate.to_string(), cfg.accumulate.to_string())?;
    same("--seed", meta.config.seed.to_string(), cfg.seed.to_string())?;
    same("shuffling", meta.config.shuffle.to_string(), cfg.shuffle.to_string())?;
    let archive = dir.join(meta.arrays.as_deref().unwrap_or("checkpoint.npz"));
    if meta.arrays.as_deref().is_some_and(|a| a.contains(['/', '\\']) || a.starts_with('.')) {
        return Err(err(format!("it names the archive {:?}, not a file of its folder", meta.arrays)));
    }
    if let Some(want) = meta.arrays_bytes {
        let got = std::fs::metadata(&archive).map_err(|e| err(format!("cannot read {}: {e}", archive.display())))?.len();
        if got != want {
            return Err(err(format!("{} has {got} bytes, the checkpoint committed {want}: it is damaged", archive.display())));
        }
    }
    if let Some(s) = meta.scaler {
        if !(s.scale.is_finite() && s.scale > 0.0) || s.skipped > meta.step {
            return Err(err(format!("its loss scaler is invalid (scale {}, {} skipped of {} steps)", s.scale, s.skipped, meta.step)));
        }
    }
    let arrays = npy::read_npz(&archive)?;
    for (name, t) in &arrays {
        let v = if t.ty().dtype.is_float() { t.to_f32_vec() } else { Vec::new() };
        if let Some(x) = v.iter().find(|x| !x.is_finite()) {
            return Err(err(format!("\"{name}\" holds {x}: a checkpoint holds finite values only")));
        }
        if name.ends_with(".adam_v") && v.iter().any(|&x| x < 0.0) {
            return Err(err(format!("\"{name}\" (Adam's second moment) holds a negative value")));
        }
        // The step counter counts the micro-steps applied: the checkpoint's
        // steps less those the loss scaler skipped (checked above to be at
        // most the steps), times the accumulation, or the two disagree.
        if name == "train.step" {
            let skipped = meta.scaler.map_or(0, |s| s.skipped);
            let want = (meta.step - skipped).checked_mul(cfg.accumulate).map(|m| m as f64);
            if v.len() != 1 || want != Some(v[0] as f64) {
                return Err(err(format!(
                    "its step counter \"train.step\" holds {v:?}, and the checkpoint says {} steps ({skipped} skipped) of {} micro-batches: they disagree",
                    meta.step, cfg.accumulate
                )));
            }
        }
    }
    let by_name: HashMap<String, smelt_ir::NodeId> =
        graph.node_ids().filter(|&n| graph.node(n).op.is_persistent()).map(|n| (graph.node(n).name.clone(), n)).collect();
    // Every value the updates write (parameters, their optimizer state,
    // running statistics, the step counter) must come from the archive: one
    // left at its initial value would resume another run than the one saved.
    let mut written = std::collections::BTreeSet::new();
    for n in graph.node_ids() {
        let ins = graph.inputs_of(n);
        for slot in 0..graph.node(n).outputs.len() {
            if let Some(v) = graph.node(n).op.updated_operand(slot).and_then(|i| ins.get(i)) {
                written.insert(graph.node(v.node).name.clone());
            }
        }
    }
    for (name, t) in arrays {
        let id = *by_name.get(&name).ok_or_else(|| err(format!("it holds \"{name}\", which the training step does not have")))?;
        let ty = graph.node(id).outputs[0].clone();
        if t.ty() != &ty {
            return Err(err(format!("it holds \"{name}\" as {}, the training step has {ty}", t.ty())));
        }
        graph.set_weight(id, t).map_err(|e| err(e.to_string()))?;
        written.remove(&name);
    }
    if !written.is_empty() {
        let missing: Vec<String> = written.iter().take(5).map(|n| format!("\"{n}\"")).collect();
        let more = if written.len() > 5 { format!(" and {} more", written.len() - 5) } else { String::new() };
        return Err(err(format!(
            "checkpoint.npz lacks {}{more}, which the training step updates: it is incomplete or from another model",
            missing.join(", ")
        )));
    }
    Ok((meta.step, meta.scaler, meta.data))
}

/// Loss and accuracy of a forward pass over a data set.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Evaluation {
    /// Mean loss per label that is not ignored (cross-entropy without
    /// smoothing: per sample, or per token), or per sample (squared error).
    pub loss: f64,
    /// Fraction of those labels that are their logits' arg-max
    /// (cross-entropy only).
    pub accuracy: Option<f64>,
    /// Samples evaluated.
    pub samples: usize,
}

/// Sets the values of `weights` on the persistent nodes of `model` with
/// those names (the others are the optimizer's). Returns how many.
pub fn set_weights(model: &mut Graph, weights: &[(String, Tensor)]) -> Result<usize, Error> {
    let by_name: HashMap<&str, &Tensor> = weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let ids: Vec<_> = model.node_ids().filter(|&n| model.node(n).op.is_persistent()).collect();
    let mut n = 0;
    for id in ids {
        if let Some(t) = by_name.get(model.node(id).name.as_str()) {
            model.set_weight(id, (*t).clone()).map_err(|e| Error::Usage(e.to_string()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// `weights` with the tied copies of `inits` added: each the transpose of
/// its source's value (tied weights are one parameter, written in every
/// place the model reads it).
pub fn with_tied(mut weights: Vec<(String, Tensor)>, inits: &[smelt_passes::train::Initializer]) -> Vec<(String, Tensor)> {
    for i in inits {
        let Some(src) = &i.tied_to else { continue };
        let Some(t) = weights.iter().find(|(n, _)| n == src).map(|w| w.1.clone()) else { continue };
        let (r, c) = (t.ty().shape[0], t.ty().shape[1]);
        let order: Vec<usize> = (0..c * r).map(|k| (k % r) * c + k / r).collect();
        weights.push((i.name.clone(), t.take(&order, vec![c, r])));
    }
    weights
}

/// One line on what a training step trains: how many float initializers
/// are trained and frozen, the frozen ones by reason (a few names each).
pub fn initializers_summary(inits: &[smelt_passes::train::Initializer]) -> String {
    let trained = inits.iter().filter(|i| i.trained).count();
    let mut line = format!("{trained} float initializers trained, {} frozen", inits.len() - trained);
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for i in inits {
        if let Some(why) = &i.frozen_because {
            match reasons.iter_mut().find(|(r, _)| r == why) {
                Some((_, names)) => names.push(&i.name),
                None => reasons.push((why, vec![&i.name])),
            }
        }
    }
    for (why, names) in reasons {
        let shown: Vec<&str> = names.iter().take(3).copied().collect();
        let more = if names.len() > 3 { format!(" and {} more", names.len() - 3) } else { String::new() };
        line += &format!("\n  {} frozen, {why}: {}{more}", names.len(), shown.join(", "));
    }
    line
}

/// Runs `model` (the forward pass, weights set) on every sample of `data`
/// on the CPU reference executor, in batches of its batch size; `rest`
/// (the same model at the remainder's batch size) takes the last partial
/// batch, which is skipped without it. The loss reads output `on`.
pub fn evaluate(model: &Graph, rest: Option<&Graph>, data: &Data, on: &str, cross_entropy: Option<&CeLayout>) -> Result<Evaluation, Error> {
    let batch = model.inputs().first().map_or(1, |&i| model.node(i).outputs[0].shape.first().copied().unwrap_or(1)).max(1);
    let names: Vec<String> = model.inputs().iter().map(|&i| model.node(i).name.clone()).collect();
    let out = model.outputs().iter().position(|(n, _)| n == on).ok_or_else(|| Error::Usage(format!("the model has no output {on:?}")))?;
    let softmax = matches!(model.node(model.outputs()[out].1.node).op, Op::Softmax { .. });
    // Loss and accuracy over labels (tokens) for cross-entropy, samples for
    // the mean squared error.
    let (mut loss, mut right, mut seen, mut counted) = (0f64, 0usize, 0usize, 0usize);
    let mut chunks: Vec<(Vec<usize>, &Graph)> = Vec::new();
    let whole = data.samples / batch * batch;
    for start in (0..whole).step_by(batch) {
        chunks.push(((start..start + batch).collect(), model));
    }
    if let (Some(r), true) = (rest, whole < data.samples) {
        chunks.push(((whole..data.samples).collect(), r));
    }
    for (idx, g) in chunks {
        let ins = data.gather(&idx, Some(&names));
        let ys = smelt_runtime::cpu::run(g, &ins)?;
        let y = ys[out].to_f32_vec();
        let t = data.target(&idx).ok_or_else(|| Error::Usage("the data has no labels or targets".into()))?;
        if let Some(layout) = cross_entropy {
            let labels = t.to_i64_vec();
            let shape = ys[out].shape();
            let c = layout.classes;
            // A sample's logits as [outer, C, inner]: classes second
            // ([N, C, d...]: inner = d...) or last ([B, S, C]: outer = S).
            let (outer, inner) = if layout.class_axis == 1 {
                (1, shape[2..].iter().product::<usize>())
            } else {
                (shape[1..shape.len() - 1].iter().product::<usize>(), 1)
            };
            let per = outer * inner;
            for (i, sample) in y.chunks(per * c).enumerate() {
                let labels = &labels[i * per..][..per];
                let positions = if layout.shift { per - 1 } else { per };
                for pos in 0..positions {
                    let l = labels[if layout.shift { pos + 1 } else { pos }];
                    if l == IGNORE_INDEX {
                        continue;
                    }
                    let (o, k) = (pos / inner, pos % inner);
                    let row: Vec<f32> = (0..c).map(|j| sample[(o * c + j) * inner + k]).collect();
                    let p = if softmax {
                        (row[l as usize] as f64).max(f64::MIN_POSITIVE).ln()
                    } else {
                        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
                        let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
                        row[l as usize] as f64 - lse
                    };
                    loss -= p;
                    let arg = (0..c).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap_or(0);
                    right += (arg == l as usize) as usize;
                    counted += 1;
                }
            }
        } else {
            let t = t.to_f32_vec();
            let per = y.len() / idx.len();
            loss += y.iter().zip(&t).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / per as f64;
            counted += idx.len();
        }
        seen += idx.len();
    }
    Ok(Evaluation {
        loss: loss / counted.max(1) as f64,
        accuracy: cross_entropy.map(|_| right as f64 / counted.max(1) as f64),
        samples: seen,
    })
}
