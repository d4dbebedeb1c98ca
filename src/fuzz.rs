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
