//! `smelt._smelt`: the native half of smelt's Python package.
//!
//! A thin layer over the library: each function takes the model's options
//! as a dict (`{"model": ..., "batch": 8, "optimizer": "adam", ...}`, built
//! by `smelt/__init__.py` from keyword arguments) and reads it into the
//! library's typed options ([`smelt::spec`]), which the CLI's flags become
//! too, so both accept and refuse the same things; it returns what the
//! CLI's `--json` prints. Work runs with the GIL released; errors become
//! the exceptions of `smelt.errors`.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use smelt::ir::{IrError, KernelGraph, Tensor, TensorType};
use smelt::passes::train::TrainError;
use smelt::spec::{Choice, FitSpec, ModelSpec, StepSpec};
use smelt::Error;

/// The exception of `smelt.errors` for `e`, with its fields as attributes.
fn to_py(e: Error) -> PyErr {
    Python::attach(|py| match exception(py, &e) {
        Ok(err) => err,
        Err(failed) => failed,
    })
}

fn exception(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    let kw = PyDict::new(py);
    kw.set_item("is_bug", e.is_bug())?;
    let class = match e {
        _ if e.is_bug() => "InternalError",
        Error::Model(IrError::UnsupportedOp { .. } | IrError::Unsupported { .. } | IrError::UnsupportedFeature(_)) => "UnsupportedError",
        Error::NoKernel { .. } => "UnsupportedError",
        Error::Train(TrainError::NoGradient { .. }) => "UnsupportedError",
        Error::Model(IrError::Usage(_) | IrError::Array(_)) | Error::Usage(_) | Error::Data { .. } | Error::Train(TrainError::Usage(_)) => {
            "UsageError"
        }
        Error::Model(_) => "ModelError",
        Error::MemoryLimit { limit, arena, smaller_batch, .. } => {
            kw.set_item("limit", limit)?;
            kw.set_item("arena", arena)?;
            kw.set_item("smaller_batch", smaller_batch)?;
            "MemoryLimitError"
        }
        Error::RematBudget { budget, smallest, .. } => {
            kw.set_item("limit", budget)?;
            kw.set_item("arena", smallest)?;
            "MemoryLimitError"
        }
        _ => "Error",
    };
    let cls = py.import("smelt.errors")?.getattr(class)?;
    Ok(PyErr::from_value(cls.call((e.to_string(),), Some(&kw))?))
}

/// An options dict read key by key: each key is taken once, `None` is the
/// default, and a key left over or of the wrong type is a usage error
/// naming it.
struct Options<'a, 'py>(&'a Bound<'py, PyDict>, std::collections::HashSet<String>);

impl<'a, 'py> Options<'a, 'py> {
    fn new(d: &'a Bound<'py, PyDict>) -> Options<'a, 'py> {
        Options(d, Default::default())
    }

    /// The value of `key` (not `None`), marked as read.
    fn get(&mut self, key: &str) -> Result<Option<Bound<'py, PyAny>>, Error> {
        self.1.insert(key.to_string());
        let v = self.0.get_item(key).map_err(|e| Error::Usage(format!("option {key}: {e}")))?;
        Ok(v.filter(|v| !v.is_none()))
    }

    /// `key`'s value as `what`, by `f`.
    fn read<T, E>(&mut self, key: &str, what: &str, f: impl FnOnce(&Bound<'py, PyAny>) -> Result<T, E>) -> Result<Option<T>, Error> {
        match self.get(key)? {
            None => Ok(None),
            Some(v) => f(&v).map(Some).map_err(|_| {
                let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
                Error::Usage(format!("option {key} must be {what}, not {ty}"))
            }),
        }
    }

    fn usize(&mut self, key: &str) -> Result<Option<usize>, Error> {
        self.read(key, "a whole number, 0 or more", |v| v.extract::<usize>())
    }

    fn f32(&mut self, key: &str) -> Result<Option<f32>, Error> {
        self.read(key, "a number", |v| v.extract::<f64>().map(|x| x as f32))
    }

    fn bool(&mut self, key: &str) -> Result<bool, Error> {
        Ok(self.read(key, "True or False", |v| v.extract::<bool>())?.unwrap_or(false))
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, Error> {
        self.read(key, "a string", |v| v.extract::<String>())
    }

    fn path(&mut self, key: &str) -> Result<Option<std::path::PathBuf>, Error> {
        self.read(key, "a path", |v| v.extract::<std::path::PathBuf>())
    }

    /// A list of strings (one string is a list of one).
    fn strings(&mut self, key: &str) -> Result<Vec<String>, Error> {
        let read = |v: &Bound<'py, PyAny>| match v.extract::<String>() {
            Ok(s) => Ok(vec![s]),
            Err(_) => v.extract::<Vec<String>>(),
        };
        Ok(self.read(key, "a list of strings", read)?.unwrap_or_default())
    }

    /// `key`'s name among `C`'s choices.
    fn choice<C: Choice>(&mut self, key: &str) -> Result<Option<C>, Error> {
        self.string(key)?.map(|s| C::parse(&s).map_err(Error::Usage)).transpose()
    }

    /// Fails naming the keys nothing read.
    fn done(self) -> Result<(), Error> {
        let mut left: Vec<String> =
            self.0.keys().iter().filter_map(|k| k.extract::<String>().ok()).filter(|k| !self.1.contains(k)).collect();
        left.sort();
        match left.is_empty() {
            true => Ok(()),
            false => Err(Error::Usage(format!("unknown options: {}", left.join(", ")))),
        }
    }

    /// The model and its training step (every key but those `fit` reads).
    fn model(&mut self) -> Result<ModelSpec, Error> {
        let model = self.string("model")?.ok_or_else(|| Error::Usage("no model given".into()))?;
        let mut m = ModelSpec::new(model);
        m.batch = self.usize("batch")?;
        let dims = self.read("dims", "a dict of sizes by name", |v| v.extract::<std::collections::BTreeMap<String, usize>>())?;
        m.dims = dims.unwrap_or_default().into_iter().collect(); // checked by `ModelSpec::options`
        let set =
            self.read("set", "a dict of lists of numbers by input name", |v| v.extract::<std::collections::BTreeMap<String, Vec<f64>>>())?;
        m.set = set.unwrap_or_default().into_iter().collect();
        m.no_fuse = self.bool("no_fuse")?;
        // (`fit` reads "precision" first: a list to search, `auto` included.)
        if !self.1.contains("precision") {
            if let Some(p) = self.string("precision")? {
                m.precision = p.parse().map_err(Error::Usage)?;
            }
        }
        m.keep_f32 = self.strings("keep_f32")?;
        m.tf32 = self.string("tf32")?.map(|t| t.parse().map_err(Error::Usage)).transpose()?;
        m.min_memory = self.bool("min_memory")?;
        m.tuning = self.path("tuning")?;
        m.train = self.step()?;
        Ok(m)
    }

    fn step(&mut self) -> Result<StepSpec, Error> {
        let d = StepSpec::default();
        // Trained names: a list, or a file of them (the CLI's --trainable).
        let mut trainable = self.strings("trainable")?;
        if let Some(file) = self.path("trainable_file")? {
            trainable.extend(smelt::spec::read_names(&file)?);
        }
        Ok(StepSpec {
            optimizer: self.choice("optimizer")?,
            loss: self.choice("loss")?.unwrap_or(d.loss),
            loss_on: self.string("loss_on")?,
            label_smoothing: self.f32("label_smoothing")?,
            lr: self.f32("lr")?,
            momentum: self.f32("momentum")?,
            nesterov: self.bool("nesterov")?,
            weight_decay: self.f32("weight_decay")?,
            accumulate: match self.usize("accumulate")? {
                None => 1,
                Some(k) => u32::try_from(k)
                    .ok()
                    .filter(|&k| k >= 1)
                    .ok_or_else(|| Error::Usage(format!("accumulate {k}: give 1 to {}", u32::MAX)))?,
            },
            cosine: self.usize("cosine")?,
            warmup: self.usize("warmup")?.unwrap_or(0),
            clip_norm: self.f32("clip_norm")?,
            batch_norm: self.choice("batch_norm")?.unwrap_or(d.batch_norm),
            loss_scale: self.choice("loss_scale")?.unwrap_or(d.loss_scale),
            freeze: self.strings("freeze")?,
            trainable,
            train_only: self.strings("train_only")?,
            remat_budget: self.usize("remat_budget")?,
            remat_solver: self.choice("remat_solver")?.unwrap_or(d.remat_solver),
            device: self.string("device")?.map(|g| smelt::spec::gpu_named(&g).map_err(Error::Usage)).transpose()?,
            recipe: self.path("recipe")?,
        })
    }
}

/// The model and its step as `options` say.
fn model_spec(options: &Bound<'_, PyDict>) -> Result<ModelSpec, Error> {
    let mut o = Options::new(options);
    let m = o.model()?;
    o.done()?;
    Ok(m)
}

/// Runs `f` with the GIL released, its error as a Python exception.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error> + Send) -> PyResult<T> {
    py.detach(f).map_err(to_py)
}

/// `smelt inspect --json` of the model `options` name.
#[pyfunction]
fn inspect(py: Python<'_>, options: &Bound<'_, PyDict>) -> PyResult<String> {
    let m = model_spec(options).map_err(to_py)?;
    detached(py, || {
        let mut s = m.open(false)?;
        let compiled = s.compile()?;
        Ok(smelt::report::inspect_json(&s.source, &compiled).to_string())
    })
}

/// `smelt plan --json` and `--svg` (titled `title`) of the model `options`
/// name, and the notes the training step's construction made. Over `memory_limit` bytes, raises `MemoryLimitError` carrying both
/// (`plan_json`, `svg`).
#[pyfunction]
#[pyo3(signature = (options, title, memory_limit=None))]
fn plan(
    py: Python<'_>,
    options: &Bound<'_, PyDict>,
    title: String,
    memory_limit: Option<usize>,
) -> PyResult<(String, String, Vec<String>)> {
    let mut m = model_spec(options).map_err(to_py)?;
    let (json, svg, notes, over) = detached(py, || {
        m.apply_recipe()?;
        m.split_limit = memory_limit; // over the whole-op plan: split until it fits
        let p = smelt::plan::Planning::new(m.open(false)?)?;
        let json = p.json(&m.model, m.batch).to_string();
        let over = memory_limit.map(|l| p.check_limit(l)).transpose().err();
        let notes = p.session.train.iter().flat_map(|t| t.step.notes.clone()).collect();
        Ok((json, p.svg(&title), notes, over))
    })?;
    match over {
        None => Ok((json, svg, notes)),
        Some(e) => {
            let err = to_py(e);
            let v = err.value(py);
            v.setattr("plan_json", json)?;
            v.setattr("svg", svg)?;
            Err(err)
        }
    }
}

/// `smelt fit --json` of `options` (the model's, `memory_limit`,
/// `precision` (a policy or `auto`), `gpus`, `shard`), and when nothing
/// fits, why.
#[pyfunction]
fn fit(py: Python<'_>, options: &Bound<'_, PyDict>) -> PyResult<(String, Option<String>)> {
    let read = || -> Result<FitSpec, Error> {
        let mut o = Options::new(options);
        let memory_limit = o.usize("memory_limit")?.ok_or_else(|| Error::Usage("fit needs memory_limit".into()))?;
        let precisions = FitSpec::precisions_named(&o.string("precision")?.unwrap_or_else(|| "f32".into()))?;
        let gpus = o.usize("gpus")?.unwrap_or(1);
        let shard = o.choice("shard")?.unwrap_or_default();
        let model = o.model()?;
        o.done()?;
        let batch = model.batch.ok_or_else(|| Error::Usage("fit needs batch: the whole batch of an optimizer step".into()))?;
        Ok(FitSpec { model, batch, memory_limit, precisions, gpus, shard })
    };
    let spec = read().map_err(to_py)?;
    detached(py, || {
        let (request, optimizer) = spec.request()?;
        let f = smelt::fit::Fitting::run(request, optimizer, &mut |_| {})?;
        let why = f.recipe.is_none().then(|| f.nothing_fits());
        Ok((f.json().to_string(), why))
    })
}

/// `smelt compile --out DIR --json`: generates every kernel, compiles it
/// with NVRTC for `arch` (cached on disk), and writes DIR. `progress(done,
/// total, name)` is called after each kernel.
#[pyfunction]
#[pyo3(signature = (options, out_dir, title, arch=None, weights=false, jobs=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn compile(
    py: Python<'_>,
    options: &Bound<'_, PyDict>,
    out_dir: Option<std::path::PathBuf>,
    title: String,
    arch: Option<String>,
    weights: bool,
    jobs: Option<usize>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let m = model_spec(options).map_err(to_py)?;
    detached(py, move || {
        let s = m.open(out_dir.is_some())?;
        let done = std::sync::atomic::AtomicUsize::new(0);
        let report = |name: &str, total: usize| {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if let Some(p) = &progress {
                // A failing callback must not stop the compilation.
                Python::attach(|py| {
                    if let Err(e) = p.call1(py, (n, total, name)) {
                        e.print(py);
                    }
                });
            }
        };
        let arch = arch.as_deref().unwrap_or(smelt::codegen::nvrtc::DEFAULT_ARCH);
        let build = smelt::emit::Build::new(s, arch, jobs, &report)?;
        if let Some(dir) = &out_dir {
            build.write(dir, &m.model, &title, weights)?;
        }
        Ok(build.json(&m.model, out_dir.as_deref()).to_string())
    })
}

/// A training run's progress for Python: `progress(done, total, loss)`
/// after each step, and the notes kept for warnings.
struct PyProgress {
    callback: Option<Py<PyAny>>,
    steps: std::sync::atomic::AtomicUsize,
    total: std::sync::atomic::AtomicUsize,
    notes: std::sync::Mutex<Vec<String>>,
}

impl smelt::train::Progress for PyProgress {
    fn started(&self, s: &smelt::train::Start) {
        self.total.store(s.total - s.start, std::sync::atomic::Ordering::Relaxed);
    }

    fn step(&self, r: &smelt::train::StepReport) {
        let n = self.steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(p) = &self.callback {
            let total = self.total.load(std::sync::atomic::Ordering::Relaxed);
            // A failing callback must not stop the training.
            Python::attach(|py| {
                if let Err(e) = p.call1(py, (n, total, r.loss)) {
                    e.print(py);
                }
            });
        }
    }

    fn note(&self, note: &str) {
        self.notes.lock().expect("not poisoned").push(note.to_string());
    }
}

/// `smelt train --json`: the model `options` name (with its training
/// step) trained as the keyword arguments say, on `backend`. Returns
/// the summary and the notes (the step's, the data's).
#[pyfunction]
#[pyo3(signature = (options, data, backend="cpu", val=None, steps=None, epochs=None, memory_limit=None, save=None, checkpoint=None, every=None, resume=None, seed=0, shuffle=true, log_json=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn train(
    py: Python<'_>,
    options: &Bound<'_, PyDict>,
    data: std::path::PathBuf,
    backend: &str,
    val: Option<std::path::PathBuf>,
    steps: Option<usize>,
    epochs: Option<usize>,
    memory_limit: Option<usize>,
    save: Option<std::path::PathBuf>,
    checkpoint: Option<std::path::PathBuf>,
    every: Option<u64>,
    resume: Option<std::path::PathBuf>,
    seed: u64,
    shuffle: bool,
    log_json: Option<std::path::PathBuf>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, Vec<String>)> {
    use smelt::train::{Backend, Length, Run};
    let backend: Backend = backend.parse().map_err(|e| to_py(Error::Usage(e)))?;
    if steps.is_some() && epochs.is_some() {
        return Err(to_py(Error::Usage("give steps or epochs, not both".into())));
    }
    let mut m = model_spec(options).map_err(to_py)?;
    detached(py, move || {
        m.apply_recipe()?;
        // TF32 is the GPU's (as PyTorch): the CPU computes in f32 unless asked.
        if backend == Backend::Cpu {
            m.no_tf32_by_default();
        }
        if m.train.optimizer.is_none() {
            return Err(Error::Usage("train needs an optimizer: optimizer='sgd', 'adam' or 'adamw'".into()));
        }
        let run = Run {
            data,
            val,
            length: Some(match (steps, epochs) {
                (Some(n), _) => Length::Steps(n),
                (None, e) => Length::Epochs(e.unwrap_or(1)),
            }),
            backend,
            memory_limit,
            save,
            checkpoint,
            every,
            resume,
            seed,
            no_shuffle: !shuffle,
            log_json,
            inject_overflow: None,
        };
        run.check(&m.model)?;
        let s = m.open(true)?;
        let mut notes: Vec<String> = s.train.iter().flat_map(|t| t.step.notes.clone()).collect();
        let p = PyProgress { callback: progress, steps: Default::default(), total: Default::default(), notes: Default::default() };
        let summary = smelt::train::train(s, &run, &p)?;
        notes.extend(p.notes.into_inner().expect("not poisoned"));
        Ok((serde_json::to_string(&summary).expect("a summary serializes"), notes))
    })
}

/// The model in smelt's text IR, as imported.
#[pyfunction]
fn text(py: Python<'_>, options: &Bound<'_, PyDict>) -> PyResult<String> {
    let m = model_spec(options).map_err(to_py)?;
    detached(py, || Ok(smelt::ir::text::print(&m.open(false)?.source)))
}

/// A graph input or output: name, dtype (`f32`, `i64`...), shape.
type Port = (String, String, Vec<usize>);

/// The inputs and outputs of the model `options` name, as imported (no
/// pass runs).
#[pyfunction]
fn ports(py: Python<'_>, options: &Bound<'_, PyDict>) -> PyResult<(Vec<Port>, Vec<Port>)> {
    let m = model_spec(options).map_err(to_py)?;
    detached(py, || {
        let s = m.open(false)?;
        let g = &s.source;
        let port = |name: &str, ty: &TensorType| (name.to_string(), ty.dtype.name().to_string(), ty.shape.clone());
        let ins = g.inputs().iter().map(|&n| port(&g.node(n).name, &g.node(n).outputs[0])).collect();
        let outs = g.outputs().iter().map(|(name, v)| port(name, g.ty(*v))).collect();
        Ok((ins, outs))
    })
}

/// A model compiled for the CPU reference executor, or loaded on the
/// emulator or a GPU, run as often as asked.
#[pyclass(frozen, module = "smelt._smelt")]
struct Runner {
    graph: KernelGraph,
    /// The program on the emulator or CUDA (none: the reference executor).
    device: Option<std::sync::Mutex<smelt::device::Loaded>>,
}

#[pymethods]
impl Runner {
    /// Opens (weights' values filled for a text file) and compiles the
    /// model `options` name: for the CPU reference executor (`cpu`), or
    /// as a program loaded on the `emulator` or `cuda`.
    #[new]
    #[pyo3(signature = (options, backend="cpu"))]
    fn new(py: Python<'_>, options: &Bound<'_, PyDict>, backend: &str) -> PyResult<Runner> {
        let backend: smelt::train::Backend = backend.parse().map_err(|e| to_py(Error::Usage(e)))?;
        let mut m = model_spec(options).map_err(to_py)?;
        detached(py, || {
            if backend == smelt::train::Backend::Cpu {
                // The CPU reference executor: exact f32 (it ignores TF32 anyway).
                m.no_tf32_by_default();
                let mut s = m.open(true)?;
                return Ok(Runner { graph: s.compile()?.graph, device: None });
            }
            let mut s = m.open(true)?;
            let compiled = s.compile()?;
            let planned = s.plan(&compiled)?;
            let program = s.program(&compiled, &planned)?;
            let blob = program.weights_blob(&compiled.graph)?;
            let loaded = smelt::device::load(program, &blob, backend, None, false, &smelt::train::Quiet)?;
            Ok(Runner { graph: compiled.graph, device: Some(std::sync::Mutex::new(loaded)) })
        })
    }

    /// The graph's inputs.
    fn inputs(&self) -> Vec<Port> {
        let g = &self.graph;
        g.inputs()
            .iter()
            .map(|&n| (g.node(n).name.clone(), g.node(n).outputs[0].dtype.name().to_string(), g.node(n).outputs[0].shape.clone()))
            .collect()
    }

    /// The graph's outputs.
    fn outputs(&self) -> Vec<Port> {
        let g = &self.graph;
        g.outputs().iter().map(|(name, v)| (name.clone(), g.ty(*v).dtype.name().to_string(), g.ty(*v).shape.clone())).collect()
    }

    /// Runs on the CPU reference executor. Each input is the address and
    /// length of a C-contiguous little-endian buffer of the input's dtype
    /// and shape (a numpy array's, read in place); each output comes back
    /// as (name, dtype, shape, bytearray) for `numpy.frombuffer`.
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(usize, usize)>,
    ) -> PyResult<Vec<(String, String, Vec<usize>, Bound<'py, PyByteArray>)>> {
        let g = &self.graph;
        if inputs.len() != g.inputs().len() {
            return Err(to_py(Error::Usage(format!("the model takes {} inputs but {} were given", g.inputs().len(), inputs.len()))));
        }
        let mut tensors = Vec::with_capacity(inputs.len());
        for (&id, &(addr, len)) in g.inputs().iter().zip(&inputs) {
            let ty: &TensorType = &g.node(id).outputs[0];
            if len != ty.bytes() {
                let msg = format!("input \"{}\" is {ty}: {} bytes, but {len} were given", g.node(id).name, ty.bytes());
                return Err(to_py(Error::Usage(msg)));
            }
            // SAFETY: the caller (smelt/__init__.py) passes the data address
            // and byte length of a contiguous numpy array it holds for the
            // duration of this call; it is read here, with the GIL held.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            tensors.push(Tensor::from_le_bytes(ty, bytes).expect("length checked"));
        }
        let outs = detached(py, || {
            if let Some(device) = &self.device {
                return device.lock().expect("not poisoned").run(&tensors);
            }
            let peak = smelt::runtime::cpu::peak_bytes(g)?;
            smelt::runtime::check_host_memory("running on the CPU reference executor", peak)?;
            Ok(smelt::runtime::cpu::run(g, &tensors)?)
        })?;
        let mut result = Vec::with_capacity(outs.len());
        for ((name, _), t) in g.outputs().iter().zip(outs) {
            let bytes = t.data().to_le_bytes();
            let buf = PyByteArray::new_with(py, bytes.len(), |b| {
                b.copy_from_slice(&bytes);
                Ok(())
            })?;
            result.push((name.clone(), t.ty().dtype.name().to_string(), t.shape().to_vec(), buf));
        }
        Ok(result)
    }
}

/// Bytes in a size such as `6GiB`, `512MB` or `1024` (as `--memory-limit`).
#[pyfunction]
fn parse_size(s: &str) -> PyResult<usize> {
    smelt::plan::parse_size(s).map_err(|e| to_py(Error::Usage(e)))
}

/// `b` bytes in binary units, as the CLI prints them (`45.9 MiB`).
#[pyfunction]
fn human_bytes(b: usize) -> String {
    smelt::report::human_bytes(b)
}

/// The version of the smelt library this module was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _smelt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(fit, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add_function(wrap_pyfunction!(text, m)?)?;
    m.add_function(wrap_pyfunction!(ports, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(human_bytes, m)?)?;
    m.add_class::<Runner>()?;
    Ok(())
}
