//! The order of passes, with the verifier after each in debug builds:
//! `dce` on the semantic graph, then with fusion on `fuse` (egg: the
//! semantic graph in, the kernel graph out), `layer-norm` (spelled-out
//! layer norms made one op), `views` (reshape and transpose chains made at
//! most one transpose), `precision` (a no-op at f32),
//! `ew-cluster`, `reduce-fuse`, `attention`, `gemm-epilogue`, `concat`, `final-dce` on the
//! kernel graph.
//! Without fusion, the semantic graph is lifted to the kernel level op for
//! op and `precision` runs on it.

use crate::{attention, concat, dce, ew_cluster, fusion, gemm_epilogue, layer_norm, precision, reduce_fuse, views, PassError};
use smelt_ir::{Graph, KernelGraph, OpSet};

/// The names of the passes, in order (for `--dump-ir`).
pub const PASSES: [&str; 11] =
    ["dce", "fuse", "layer-norm", "views", "precision", "ew-cluster", "reduce-fuse", "attention", "gemm-epilogue", "concat", "final-dce"];

/// Options of the pipeline.
#[derive(Clone, Debug)]
pub struct Options {
    /// Run fusion (`fuse`, `ew-cluster`, `concat`).
    pub fuse: bool,
    /// Limits of the e-graph run.
    pub limits: fusion::Limits,
    /// The precision policy (its `tf32` becomes the graph's).
    pub precision: precision::Options,
}

impl Default for Options {
    fn default() -> Self {
        Options { fuse: true, limits: fusion::Limits::default(), precision: precision::Options::default() }
    }
}

/// What the pipeline did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Dead nodes removed, first and last time.
    pub dce_removed: usize,
    /// The e-graph run (absent without fusion).
    pub fusion: Option<fusion::Stats>,
    /// Spelled-out layer norms made one op.
    pub layer_norm: Option<layer_norm::Stats>,
    /// Reshape and transpose chains.
    pub views: Option<views::Stats>,
    /// Elementwise clustering.
    pub ew_cluster: Option<ew_cluster::Stats>,
    /// Elementwise prologues fused into reductions.
    pub reduce_fuse: Option<reduce_fuse::Stats>,
    /// Attention blocks fused into one kernel.
    pub attention: Option<attention::Stats>,
    /// Elementwise consumers fused into GEMM epilogues.
    pub gemm_epilogue: Option<gemm_epilogue::Stats>,
    /// In-place concatenation.
    pub concat: Option<concat::Stats>,
    /// Mixed precision (absent at f32).
    pub precision: Option<precision::Stats>,
}

/// Runs every pass on `graph`, in order: the semantic graph in, the kernel
/// graph out.
pub fn run(graph: &Graph, opts: &Options) -> Result<(KernelGraph, Stats), PassError> {
    run_with(graph, opts, &mut |_, _| {})
}

/// As [`run`], calling `after(pass, graph)` after each pass that ran. Each
/// pass logs its time and statistics at `debug`, the graph after it at `trace`.
pub fn run_with(graph: &Graph, opts: &Options, after: &mut dyn FnMut(&str, &KernelGraph)) -> Result<(KernelGraph, Stats), PassError> {
    let mut t = std::time::Instant::now();
    if log::log_enabled!(log::Level::Trace) {
        log::trace!("before the passes:\n{}", smelt_ir::text::print(graph));
    }
    let mut after = |pass: &str, g: &KernelGraph, stats: &dyn std::fmt::Debug| {
        log::debug!("pass {pass}: {:.2} ms, {stats:?}", t.elapsed().as_secs_f64() * 1e3);
        if log::log_enabled!(log::Level::Trace) {
            log::trace!("after {pass}:\n{}", smelt_ir::text::print(g));
        }
        after(pass, g);
        t = std::time::Instant::now();
    };
    let mut source = graph.clone();
    let mut stats = Stats { dce_removed: dce::run(&mut source).removed, ..Default::default() };
    verify_if(&source, "dce")?;
    let precision = |graph: &mut KernelGraph, stats: &mut Stats| -> Result<(), PassError> {
        if opts.precision.policy != precision::Policy::F32 {
            stats.precision = Some(precision::run(graph, &opts.precision).map_err(|source| PassError::Bug { pass: "precision", source })?);
            verify_if(graph, "precision")?;
        }
        Ok(())
    };
    if !opts.fuse {
        // Every op its own kernel.
        let mut graph = source.lift();
        after("dce", &graph, &stats.dce_removed);
        precision(&mut graph, &mut stats)?;
        if stats.precision.is_some() {
            // The f32 originals of converted weights are dead now.
            stats.dce_removed += dce::run(&mut graph).removed;
            verify_if(&graph, "precision")?;
            after("precision", &graph, &stats.precision);
        }
        graph.set_tf32(opts.precision.tf32);
        return Ok((graph, stats));
    }
    after("dce", &source.lift(), &stats.dce_removed);
    let (mut graph, fusion) = fusion::run(&source, &opts.limits)?;
    stats.fusion = Some(fusion);
    verify_if(&graph, "fuse")?;
    after("fuse", &graph, &stats.fusion);
    stats.layer_norm = step(&mut graph, "layer-norm", layer_norm::run, &mut after)?;
    stats.views = step(&mut graph, "views", views::run, &mut after)?;
    precision(&mut graph, &mut stats)?;
    after("precision", &graph, &stats.precision);
    stats.ew_cluster = step(&mut graph, "ew-cluster", ew_cluster::run, &mut after)?;
    stats.reduce_fuse = step(&mut graph, "reduce-fuse", reduce_fuse::run, &mut after)?;
    stats.attention = step(&mut graph, "attention", attention::run, &mut after)?;
    stats.gemm_epilogue = step(&mut graph, "gemm-epilogue", gemm_epilogue::run, &mut after)?;
    stats.concat = step(&mut graph, "concat", |g| Ok(concat::run(g)), &mut after)?;
    stats.dce_removed += dce::run(&mut graph).removed;
    verify_if(&graph, "final-dce")?;
    after("final-dce", &graph, &stats.dce_removed);
    graph.set_tf32(opts.precision.tf32);
    Ok((graph, stats))
}

/// Runs one kernel-graph pass: its failure is a bug of that pass; the
/// graph is verified after it and `after` sees its statistics.
fn step<S: std::fmt::Debug>(
    graph: &mut KernelGraph,
    pass: &'static str,
    run: impl FnOnce(&mut KernelGraph) -> Result<S, smelt_ir::IrError>,
    after: &mut impl FnMut(&str, &KernelGraph, &dyn std::fmt::Debug),
) -> Result<Option<S>, PassError> {
    let stats = Some(run(graph).map_err(|source| PassError::Bug { pass, source })?);
    verify_if(graph, pass)?;
    after(pass, graph, &stats);
    Ok(stats)
}

fn verify_if<O: OpSet>(graph: &Graph<O>, pass: &'static str) -> Result<(), PassError> {
    if cfg!(debug_assertions) {
        smelt_ir::verify(graph).map_err(|source| PassError::Bug { pass, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn dce_removes_unused_branches_only() {
        let text = "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%0) : f32[2]\n  %2 = neg(%0) : f32[2]\n  output \"y\" = %1\n}\n";
        let g = smelt_ir::text::parse(text).unwrap();
        let (g, stats) = super::run(&g, &super::Options { fuse: false, ..Default::default() }).unwrap();
        assert_eq!(stats.dce_removed, 1);
        assert_eq!(smelt_ir::text::print(&g), "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%0) : f32[2]\n  output \"y\" = %1\n}\n");
    }
}
