//! Every phase a command runs, on one untrusted model: the harness of the
//! fuzzer (`tests/fuzz.rs`) and of the `cargo fuzz` targets (`fuzz/`).
//!
//! A bad model must come back as [`Verdict::Refused`]: a clear error. A
//! panic, an abort, a hang, or an error smelt itself calls a bug
//! ([`Error::is_bug`]) is a failure of smelt. Beyond what the commands do,
//! the harness checks that the text format reads back what it printed.

use crate::{dummy_input, Error, Options, Session};
use smelt_ir::{onnx, text};

/// How the bytes are to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An ONNX `ModelProto`.
    Onnx,
    /// smelt's text IR, semantic level (a `.tir` file).
    Text,
    /// smelt's text IR, kernel level (what `--dump-ir` prints).
    KernelText,
}

/// How far a model got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reached {
    /// Imported and verified.
    Imported,
    /// Through the pass pipeline.
    Compiled,
    /// Planned, both plans checked.
    Planned,
    /// Every node lowered to a kernel and its CUDA C rendered.
    Lowered,
    /// Run on the CPU reference executor.
    Ran,
}

/// Why a model stopped.
#[derive(Debug)]
pub enum Verdict {
    /// The input was refused with an error that is the input's fault.
    Refused(String),
    /// smelt failed: an error it calls its own bug, or a printed text that
    /// does not parse back.
    Bug(String),
}

fn judge(e: Error) -> Verdict {
    if e.is_bug() {
        Verdict::Bug(e.to_string())
    } else {
        Verdict::Refused(e.to_string())
    }
}

/// Runs every phase on `bytes`: import, print and parse back, compile,
/// plan and check (also split for the smallest arena), lower and render
/// CUDA C, and run on the CPU (with the ONNX runner's inputs) when the
/// run's peak is at most `run_bytes`, the split graph too (its outputs must
/// be the whole graph's).
pub fn exercise(bytes: &[u8], format: Format, run_bytes: usize) -> Result<Reached, Verdict> {
    let refused = |e: smelt_ir::IrError| Verdict::Refused(e.to_string());
    let graph = match format {
        Format::Onnx => onnx::import(bytes, &onnx::ImportOptions::default()).map_err(refused)?,
        Format::Text | Format::KernelText => {
            let src = std::str::from_utf8(bytes).map_err(|e| Verdict::Refused(format!("not UTF-8: {e}")))?;
            if format == Format::KernelText {
                let k = text::parse_kernel(src).map_err(refused)?;
                let printed = text::print(&k);
                text::parse_kernel(&printed).map_err(|e| Verdict::Bug(format!("printed kernel graph does not parse back: {e}")))?;
                return Ok(Reached::Imported);
            }
            text::parse(src).map_err(refused)?
        }
    };
    let printed = text::print(&graph);
    text::parse(&printed).map_err(|e| Verdict::Bug(format!("printed graph does not parse back: {e}")))?;
    let mut s = Session::from_graph("fuzz", graph, Options::default()).map_err(judge)?;
    let compiled = s.compile().map_err(judge)?;
    let printed = text::print(&compiled.graph);
    text::parse_kernel(&printed).map_err(|e| Verdict::Bug(format!("printed compiled graph does not parse back: {e}")))?;
    let planned = s.plan(&compiled).map_err(judge)?;
    let program = s.program(&compiled, &planned).map_err(judge);
    let reached = match program {
        Ok(p) => {
            p.sources();
            Reached::Lowered
        }
        // A node without a kernel is refused by `compile --out`; the CPU run
        // still happens.
        Err(Verdict::Refused(_)) => Reached::Planned,
        Err(bug) => return Err(bug),
    };
    // Split execution of the same graph: planned, checked and lowered.
    let split_options = Options { split: Some(crate::passes::split::Goal::Minimum), ..Options::default() };
    let mut split = Session::from_graph("fuzz", s.source.clone(), split_options).map_err(judge)?;
    let split_compiled = split.compile().map_err(judge)?;
    let split_planned = split.plan(&split_compiled).map_err(judge)?;
    match split.program(&split_compiled, &split_planned).map_err(judge) {
        Ok(_) | Err(Verdict::Refused(_)) => {}
        Err(bug) => return Err(bug),
    }
    let peak = smelt_runtime::cpu::peak_bytes(&compiled.graph).map_err(|e| Verdict::Bug(e.to_string()))?;
    if peak > run_bytes {
        return Ok(reached);
    }
    s.fill_weights().map_err(judge)?;
    let compiled = s.compile().map_err(judge)?;
    let g = &compiled.graph;
    let inputs: Vec<_> = (0..g.inputs().len()).map(|i| dummy_input(g, i)).collect();
    let run = |g: &smelt_ir::KernelGraph| {
        smelt_runtime::cpu::run(g, &inputs)
            .map_err(|e| if e.is_bug() { Verdict::Bug(e.to_string()) } else { Verdict::Refused(e.to_string()) })
    };
    let whole = run(g)?;
    if split_compiled.split.is_some() {
        split.fill_weights().map_err(judge)?;
        let parts = run(&split.compile().map_err(judge)?.graph)?;
        for (a, b) in parts.iter().zip(&whole) {
            // Bands may sum a convolution in another order: a tolerance of
            // the output's range.
            let range = b.to_f32_vec().iter().filter(|x| x.is_finite()).fold(0f64, |m, &x| m.max((x as f64).abs()));
            let c = crate::compare(a, b, 1e-3, 1e-4 * range + 1e-5);
            if !c.ok && a.ty().dtype.is_float() {
                return Err(Verdict::Bug(format!("the split graph computes other outputs than the whole one: {c:?}")));
            }
        }
    }
    Ok(Reached::Ran)
}

/// A file of a training run that `smelt train` reads besides the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainFile {
    /// The data set (`--data`, `.npz`).
    Data,
    /// A checkpoint's `checkpoint.json` (beside an intact archive).
    CheckpointJson,
    /// A checkpoint's archive (its size committed by an intact JSON).
    CheckpointArrays,
    /// A recipe (`--recipe`).
    Recipe,
    /// A tuning table (`--tuning`).
    Tuning,
}

/// A training step to read hostile files against, as `smelt train` reads
/// them: the model's session, the loop's configuration, a good checkpoint
/// (whose other half each checkpoint case keeps), a good data set, and a
/// folder for the cases' files.
pub struct TrainTarget {
    args: crate::spec::ModelSpec,
    session: Session,
    config: crate::train::Config,
    inputs: Vec<(String, smelt_ir::TensorType)>,
    classes: Option<usize>,
    data: crate::train::Data,
    json: Vec<u8>,
    archive: (String, Vec<u8>),
    dir: std::path::PathBuf,
}

impl TrainTarget {
    /// The step of `args` (a model and its `--train` flags), with the data
    /// set `data` and the checkpoint in `checkpoint` that `smelt train`
    /// made with them; the cases' files go into `dir`.
    pub fn new(
        args: crate::spec::ModelSpec,
        data: &std::path::Path,
        checkpoint: &std::path::Path,
        dir: &std::path::Path,
    ) -> Result<TrainTarget, Error> {
        let mut session = args.open(true)?;
        let step = crate::train::StepData::of(&session)?;
        let (inputs, classes) = (step.inputs, step.cross_entropy.map(|l| l.classes));
        let json = std::fs::read(checkpoint.join("checkpoint.json")).map_err(|e| Error::Usage(e.to_string()))?;
        let meta: crate::train::Checkpoint = serde_json::from_slice(&json).map_err(|e| Error::Usage(e.to_string()))?;
        let name = meta.arrays.clone().unwrap_or_else(|| "checkpoint.npz".into());
        let archive = std::fs::read(checkpoint.join(&name)).map_err(|e| Error::Usage(e.to_string()))?;
        let data = crate::train::Data::load(data, &inputs, classes, meta.config.batch)?;
        // The good checkpoint resumes: what the cases are measured against.
        let mut graph = session.source.clone();
        crate::train::load_checkpoint(checkpoint, &meta.config, &mut graph)?;
        session.source = graph;
        // Resumed runs go one step further than the good checkpoint.
        let mut config = meta.config;
        config.length = crate::train::Length::Steps(meta.step + 1);
        std::fs::create_dir_all(dir.join("ck")).map_err(|e| Error::Usage(e.to_string()))?;
        Ok(TrainTarget { args, session, config, inputs, classes, data, json, archive: (name, archive), dir: dir.to_path_buf() })
    }

    /// The good checkpoint's JSON and archive, as seeds.
    pub fn checkpoint(&self) -> (&[u8], &[u8]) {
        (&self.json, &self.archive.1)
    }

    /// Reads `bytes` as `file` and, when that is accepted, goes on as `smelt
    /// train` would: a batch gathered from a data set; one training step
    /// resumed from a checkpoint (on the CPU); a recipe's or a tuning
    /// table's step compiled and planned. `Ok(Err(message))`: refused, the
    /// input's fault; `Ok(Ok(()))`: accepted and used.
    pub fn exercise(&self, file: TrainFile, bytes: &[u8]) -> Result<Result<(), String>, Verdict> {
        let io = |e: std::io::Error| Verdict::Bug(format!("the harness cannot write its file: {e}"));
        let accepted = |r: Result<(), Error>| match r {
            Ok(()) => Ok(Ok(())),
            Err(e) if !e.is_bug() => Ok(Err(e.to_string())),
            Err(e) => Err(Verdict::Bug(e.to_string())),
        };
        match file {
            TrainFile::Data => {
                let path = self.dir.join("data.npz");
                std::fs::write(&path, bytes).map_err(io)?;
                accepted(crate::train::Data::load(&path, &self.inputs, self.classes, self.config.batch).map(|d| {
                    let idx: Vec<usize> = (0..self.config.batch.min(d.samples)).collect();
                    d.gather(&idx, None);
                }))
            }
            TrainFile::CheckpointJson | TrainFile::CheckpointArrays => {
                let dir = self.dir.join("ck");
                let (json, archive) = if file == TrainFile::CheckpointJson {
                    (bytes.to_vec(), self.archive.1.clone())
                } else {
                    // The committed size follows the archive, so that the
                    // checks behind it are reached.
                    let mut meta: serde_json::Value = serde_json::from_slice(&self.json).expect("the good checkpoint");
                    meta["arrays_bytes"] = bytes.len().into();
                    (meta.to_string().into_bytes(), bytes.to_vec())
                };
                std::fs::write(dir.join("checkpoint.json"), json).map_err(io)?;
                std::fs::write(dir.join(&self.archive.0), archive).map_err(io)?;
                let mut s = self.session.clone();
                let loaded = crate::train::load_checkpoint(&dir, &self.config, &mut s.source);
                accepted(loaded.and_then(|(step, scaler, _)| self.one_step(s, step, scaler)))
            }
            TrainFile::Recipe => {
                let path = self.dir.join("recipe.json");
                std::fs::write(&path, bytes).map_err(io)?;
                let mut args = self.args.clone();
                args.train.recipe = Some(path);
                args.batch = None;
                args.dims.clear();
                accepted(args.apply_recipe().and_then(|()| plan_only(&args)))
            }
            TrainFile::Tuning => {
                let path = self.dir.join("tuning.json");
                std::fs::write(&path, bytes).map_err(io)?;
                let mut args = self.args.clone();
                args.tuning = Some(path);
                accepted(plan_only(&args))
            }
        }
    }

    /// One step on the CPU from a resumed checkpoint, as `smelt train
    /// --resume` runs it; a step count past the run's is refused as there.
    fn one_step(&self, mut s: Session, step: usize, scaler: Option<crate::train::Scaler>) -> Result<(), Error> {
        let total = self.config.total_steps(self.data.samples).ok_or_else(|| Error::Usage("too many steps".into()))?;
        if step > total {
            return Err(Error::Usage(format!("the checkpoint has done {step} steps, the run {total}")));
        }
        let compiled = s.compile()?;
        let planned = s.plan(&compiled)?;
        let program = s.program(&compiled, &planned)?;
        let blob = program.weights_blob(&compiled.graph)?;
        let exec = smelt_runtime::exec::Executor::new(smelt_runtime::host::HostDevice::new(), program, &blob, None)?;
        let mut t = crate::train::Trainer::new(exec, self.data.clone(), self.config.clone(), step)?;
        if let Some(sc) = scaler {
            t.set_scaler(sc)?;
        }
        t.step()?;
        Ok(())
    }
}

/// Opens, compiles and plans the step of `args` (a recipe's, a tuning
/// table's), as `smelt plan --train` does.
fn plan_only(args: &crate::spec::ModelSpec) -> Result<(), Error> {
    let mut s = args.open(false)?;
    let compiled = s.compile()?;
    s.plan(&compiled)?;
    Ok(())
}
