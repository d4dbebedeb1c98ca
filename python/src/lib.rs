//! `smelt._smelt`: the native half of smelt's Python package.
//!
//! A thin layer over the library: each function takes the command line's
//! flags (`[MODEL, --batch, 8, ...]`, built by `smelt/__init__.py` from
//! keyword arguments), so Python and the CLI accept and refuse exactly the
//! same things, and returns what the CLI's `--json` prints. Work runs with
//! the GIL released; errors become the exceptions of `smelt.errors`.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use smelt::args::{FitArgs, ModelArgs};
use smelt::ir::{IrError, KernelGraph, Tensor, TensorType};
use smelt::passes::train::TrainError;
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

/// Runs `f` with the GIL released, its error as a Python exception.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error> + Send) -> PyResult<T> {
    py.detach(f).map_err(to_py)
}

/// `smelt inspect --json` of the model the flags name.
#[pyfunction]
fn inspect(py: Python<'_>, argv: Vec<String>) -> PyResult<String> {
    detached(py, || {
        let mut s = ModelArgs::parse_from(argv)?.open(false)?;
        let compiled = s.compile()?;
        Ok(smelt::report::inspect_json(&s.source, &compiled).to_string())
    })
}

/// `smelt plan --json` and `--svg` (titled `title`) of the model the flags
/// name, and the notes the training step's construction made. Over `memory_limit` bytes, raises `MemoryLimitError` carrying both
/// (`plan_json`, `svg`).
#[pyfunction]
#[pyo3(signature = (argv, title, memory_limit=None))]
fn plan(py: Python<'_>, argv: Vec<String>, title: String, memory_limit: Option<usize>) -> PyResult<(String, String, Vec<String>)> {
    let (json, svg, notes, over) = detached(py, || {
        let mut m = ModelArgs::parse_from(argv)?;
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

/// `smelt fit --json` of the flags, and when nothing fits, why.
#[pyfunction]
fn fit(py: Python<'_>, argv: Vec<String>) -> PyResult<(String, Option<String>)> {
    detached(py, || {
        let (request, optimizer) = FitArgs::parse_from(argv)?.request()?;
        let f = smelt::fit::Fitting::run(request, optimizer, &mut |_| {})?;
        let why = f.recipe.is_none().then(|| f.nothing_fits());
        Ok((f.json().to_string(), why))
    })
}

/// `smelt compile --out DIR --json`: generates every kernel, compiles it
/// with NVRTC for `arch` (cached on disk), and writes DIR. `progress(done,
/// total, name)` is called after each kernel.
#[pyfunction]
#[pyo3(signature = (argv, out_dir, title, arch=None, weights=false, jobs=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn compile(
    py: Python<'_>,
    argv: Vec<String>,
    out_dir: Option<std::path::PathBuf>,
    title: String,
    arch: Option<String>,
    weights: bool,
    jobs: Option<usize>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    detached(py, move || {
        let m = ModelArgs::parse_from(argv)?;
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

/// `smelt train --json`: the model the flags name (with its training
/// step's flags) trained as the keyword arguments say, on `backend`. Returns
/// the summary and the notes (the step's, the data's).
#[pyfunction]
#[pyo3(signature = (argv, data, backend="cpu", val=None, steps=None, epochs=None, memory_limit=None, save=None, checkpoint=None, every=None, resume=None, seed=0, shuffle=true, log_json=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn train(
    py: Python<'_>,
    argv: Vec<String>,
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
    detached(py, move || {
        let mut m = ModelArgs::parse_from(argv)?;
        m.apply_recipe()?;
        // TF32 is the GPU's (as PyTorch): the CPU computes in f32 unless asked.
        if backend == Backend::Cpu {
            m.no_tf32_by_default();
        }
        if m.train.train.is_none() {
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
fn text(py: Python<'_>, argv: Vec<String>) -> PyResult<String> {
    detached(py, || Ok(smelt::ir::text::print(&ModelArgs::parse_from(argv)?.open(false)?.source)))
}

/// A graph input or output: name, dtype (`f32`, `i64`...), shape.
type Port = (String, String, Vec<usize>);

/// The inputs and outputs of the model the flags name, as imported (no
/// pass runs).
#[pyfunction]
fn ports(py: Python<'_>, argv: Vec<String>) -> PyResult<(Vec<Port>, Vec<Port>)> {
    detached(py, || {
        let s = ModelArgs::parse_from(argv)?.open(false)?;
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
    /// model the flags name: for the CPU reference executor (`cpu`), or
    /// as a program loaded on the `emulator` or `cuda`.
    #[new]
    #[pyo3(signature = (argv, backend="cpu"))]
    fn new(py: Python<'_>, argv: Vec<String>, backend: &str) -> PyResult<Runner> {
        let backend: smelt::train::Backend = backend.parse().map_err(|e| to_py(Error::Usage(e)))?;
        detached(py, || {
            let mut m = ModelArgs::parse_from(argv)?;
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
