//! What `smelt compile --out DIR` writes besides the kernels: `plan.json`
//! (the program a runtime executes).

use serde_json::{json, Value};
use smelt_codegen::Program;

/// `plan.json`: the arena and weights sizes, graph inputs and outputs with
/// their arena offsets, the weights layout, and every launch in order with
/// its grid, block, trailing count and pointer arguments.
pub fn plan_json(model: &str, batch: Option<usize>, arch: &str, p: &Program) -> Value {
    let steps: Vec<Value> = p
        .steps
        .iter()
        .map(|s| {
            json!({
                "node": s.node,
                "origin": s.origin.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                "kernel": s.kernel.name(),
                "kind": s.kernel.kind(),
                "source": format!("kernels/{}.cu", s.kernel.name()),
                "ptx": format!("kernels/{}.ptx", s.kernel.name()),
                "grid": s.launch.grid,
                "block": s.launch.block,
                "count": s.launch.count,
                "args": s.args,
                "flops": s.kernel.flops(),
            })
        })
        .collect();
    json!({
        "format": "smelt-plan-1",
        "model": model,
        "batch": batch,
        "arch": arch,
        "arena_bytes": p.arena,
        "weights_bytes": p.weights_bytes,
        "inputs": p.inputs,
        "outputs": p.outputs,
        "weights": p.weights,
        "steps": steps,
    })
}

/// A model compiled to kernels: what `smelt compile --out DIR` makes.
pub struct Build {
    /// The session (its source has every weight's values).
    pub session: crate::Session,
    /// The compiled graph.
    pub compiled: crate::Compiled,
    /// Its checked plan.
    pub planned: crate::Planned,
    /// The program: launches, offsets, weights layout.
    pub program: smelt_codegen::Program,
    /// Each distinct kernel's name and CUDA C.
    pub sources: Vec<(String, String)>,
    /// Each one's PTX (in the order of `sources`).
    pub kernels: Vec<smelt_codegen::nvrtc::Compiled>,
    /// The NVRTC target.
    pub arch: String,
    /// Seconds compiling took.
    pub compile_seconds: f64,
    /// Kernels that came from the cache.
    pub from_cache: usize,
    /// Threads that compiled.
    pub threads: usize,
}

impl Build {
    /// Compiles, plans and generates `session`'s model, then compiles every
    /// distinct kernel with NVRTC for `arch` on `threads` threads (one per
    /// core when `None`), calling `progress(name, total)` after each.
    pub fn new(
        mut session: crate::Session,
        arch: &str,
        threads: Option<usize>,
        progress: &(dyn Fn(&str, usize) + Sync),
    ) -> Result<Build, crate::Error> {
        let compiled = session.compile()?;
        let planned = session.plan(&compiled)?;
        let program = session.program(&compiled, &planned)?;
        let sources = program.sources();
        let compiler = smelt_codegen::nvrtc::Compiler { arch: arch.to_string(), ..Default::default() };
        let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
        let t = std::time::Instant::now();
        let total = sources.len();
        let kernels = smelt_codegen::program::compile_all(&compiler, &sources, threads, &|name| progress(name, total))?;
        let compile_seconds = t.elapsed().as_secs_f64();
        let from_cache = kernels.iter().filter(|c| c.cached).count();
        Ok(Build { session, compiled, planned, program, sources, kernels, arch: arch.to_string(), compile_seconds, from_cache, threads })
    }

    /// Writes `dir`: kernels/NAME.cu and .ptx, plan.json, memory.json,
    /// memory.svg (titled `title`) and with `weights` weights.bin. `model`
    /// is the model as the user named it.
    pub fn write(&self, dir: &std::path::Path, model: &str, title: &str, weights: bool) -> Result<(), crate::Error> {
        let io = |path: &std::path::Path, e: std::io::Error| crate::Error::Usage(format!("cannot write {}: {e}", path.display()));
        let kdir = dir.join("kernels");
        std::fs::create_dir_all(&kdir).map_err(|e| io(&kdir, e))?;
        let write = |path: std::path::PathBuf, bytes: &[u8]| std::fs::write(&path, bytes).map_err(|e| io(&path, e));
        for ((name, src), c) in self.sources.iter().zip(&self.kernels) {
            write(kdir.join(format!("{name}.cu")), src.as_bytes())?;
            write(kdir.join(format!("{name}.ptx")), c.ptx.as_bytes())?;
        }
        let batch = self.session.options.batch;
        let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON serializes");
        write(dir.join("plan.json"), pretty(&plan_json(model, batch, &self.arch, &self.program)).as_bytes())?;
        let fused = !self.session.options.no_fuse;
        let report = crate::plan::report(&self.compiled.graph, &self.planned.plan, fused, true);
        let unfused = crate::plan::report(&self.planned.unfused, &self.planned.unfused_plan, false, true);
        let mem = json!({"model": model, "batch": batch, "plan": report, "without_fusion": unfused});
        write(dir.join("memory.json"), pretty(&mem).as_bytes())?;
        let other = fused.then_some(&self.planned.unfused_plan);
        write(dir.join("memory.svg"), crate::plan::svg(title, &self.planned.plan, &self.compiled.graph, other).as_bytes())?;
        if weights {
            write(dir.join("weights.bin"), &self.program.weights_blob(&self.compiled.graph)?)?;
        }
        Ok(())
    }

    /// `smelt compile --json`'s summary (`out`: where it was written).
    pub fn json(&self, model: &str, out: Option<&std::path::Path>) -> Value {
        json!({
            "model": model,
            "batch": self.session.options.batch,
            "arch": self.arch,
            "kernels": self.program.steps.len(),
            "distinct_kernels": self.sources.len(),
            "from_cache": self.from_cache,
            "compile_seconds": self.compile_seconds,
            "arena_bytes": self.program.arena,
            "weights_bytes": self.program.weights_bytes,
            "out": out,
        })
    }
}
