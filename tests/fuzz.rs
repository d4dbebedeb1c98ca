//! A seeded mutation fuzzer over every phase a command runs
//! ([`smelt::fuzz::exercise`]): byte flips, insertions and truncations of
//! real ONNX files, structural mutations of ONNX graphs (attributes,
//! dimensions, input and output counts, names, types, versions) and of
//! text IR. A case fails on a panic, an abort (an allocation over
//! [`CAP`] aborts, naming the case), a hang (a case over [`CASE_SECS`]),
//! or an error smelt calls its own bug.
//!
//! - `SMELT_FUZZ_CASES` (default [`CASES`]): how many random cases run,
//!   the same ones on any machine under any load.
//! - `SMELT_FUZZ_SECS`: go on past them until this many seconds have passed
//!   (a longer campaign).
//! - `SMELT_FUZZ_SEED` (default 0): which sequence of cases.
//! - `SMELT_FUZZ_CASE=SEED:INDEX`: reruns one case and keeps its input in
//!   `target/fuzz-case.{onnx,tir}`.
//!
//! Every file of `tests/fuzz-corpus` (inputs that once failed) runs first.

mod common;

use smelt::fuzz::{exercise, Format, Reached, Verdict};
use smelt_ir::{OpSet, Rng};
use smelt_onnx_proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension::Value as Dim, type_proto, AttributeProto, Message, ModelProto,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest single allocation a case may make. Sizes that come from
/// input must be checked before they are allocated; a larger request
/// aborts the test, naming the case.
const CAP: usize = 1 << 30;
/// The longest a case may take before it counts as a hang.
const CASE_SECS: u64 = 60;
/// Models whose CPU run holds at most this many bytes are also run.
const RUN_BYTES: usize = 16 << 20;

/// Bytes allocated now, and the most since [`reset_peak`].
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
/// The tests of this file run one at a time (the byte counts are global).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn grow(n: usize) {
    let now = LIVE.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrink(n: usize) {
    LIVE.fetch_sub(n as u64, Ordering::Relaxed);
}

/// Starts measuring the peak from the bytes allocated now; returns them.
fn reset_peak() -> u64 {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// Random cases a run tries (`SMELT_FUZZ_CASES`): a fixed number, so that
/// what is tested does not depend on the machine's load (about as many as
/// the former 60-second budget ran on a loaded 2-core machine).
const CASES: u64 = 6000;

/// The case being run (seed << 32 | index), for the allocator's message.
static CASE: AtomicU64 = AtomicU64::new(u64::MAX);

struct Capped;

impl Capped {
    fn over(&self, size: usize) -> bool {
        if size <= CAP {
            return false;
        }
        // No allocation here: format into a stack buffer.
        use std::io::Write;
        let mut buf = [0u8; 200];
        let c = CASE.load(Ordering::Relaxed);
        let mut w = &mut buf[..];
        let _ = write!(w, "\nfuzz: case SMELT_FUZZ_CASE={}:{} asked for {size} bytes in one allocation\n", c >> 32, c & 0xffff_ffff);
        let n = 200 - w.len();
        let _ = std::io::stderr().write_all(&buf[..n]);
        true
    }
}

unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if self.over(l.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grow(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if self.over(l.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grow(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        shrink(l.size());
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if self.over(new) {
            return std::ptr::null_mut();
        }
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            grow(new);
            shrink(l.size());
        }
        q
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

/// The name of the threads that run cases (whose panics are quiet).
const CASE_THREAD: &str = "fuzz-case";

thread_local! {
    static PANICKED_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Panics are expected to be caught and reported by case: one line each,
/// without a backtrace.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(CASE_THREAD) {
                return default(info); // the test's own assertions
            }
            let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
            PANICKED_AT.with(|p| *p.borrow_mut() = at);
        }))
    });
}

/// One input to try.
struct Case {
    bytes: Vec<u8>,
    format: Format,
    what: String,
}

/// Runs `case` on its own thread (a deep stack of its own would hide
/// recursion on depth: it gets the default 2 MiB), with a time limit.
/// Returns how far it got, or a description of the failure.
fn run(case: &Case) -> Result<Result<Reached, String>, String> {
    let (bytes, format) = (case.bytes.clone(), case.format);
    run_with(&case.what, move || exercise(&bytes, format, RUN_BYTES))
}

/// Runs `f` as [`run`] runs a case: on its own thread, panics caught, with
/// a time limit.
fn run_with<R: Send + 'static>(what: &str, f: impl FnOnce() -> Result<R, Verdict> + Send + 'static) -> Result<Result<R, String>, String> {
    quiet_panics();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(CASE_THREAD.into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r.map_err(|p| (p, PANICKED_AT.with(|a| a.borrow().clone()))));
        })
        .expect("spawn");
    match rx.recv_timeout(Duration::from_secs(CASE_SECS)) {
        Err(_) => Err(format!("{what}: no answer within {CASE_SECS} s (a hang?)")),
        Ok(Err((p, at))) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("{what}: panicked at {at}: {}", msg.unwrap_or_default()))
        }
        Ok(Ok(Err(Verdict::Bug(m)))) => Err(format!("{what}: smelt reports its own bug: {m}")),
        Ok(Ok(Err(Verdict::Refused(m)))) => Ok(Err(m)),
        Ok(Ok(Ok(r))) => Ok(Ok(r)),
    }
}

/// A named seed input.
type Seed<T> = (String, T);

/// The seeds: small real ONNX files (the node tests and the light models)
/// and text IR printed from random graphs and the zoo.
fn seeds() -> (Vec<Seed<Vec<u8>>>, Vec<Seed<String>>) {
    let mut onnx = Vec::new();
    for family in ["simple", "pytorch-operator", "pytorch-converted", "light"] {
        let dir = common::onnx_data().join(family);
        let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        cases.sort();
        for c in cases {
            let m = c.join("model.onnx");
            if let Ok(b) = std::fs::read(&m) {
                if b.len() <= 1 << 20 {
                    onnx.push((format!("{family}/{}", c.file_name().unwrap().to_string_lossy()), b));
                }
            }
        }
    }
    // Transformer exports (TorchScript: weights inside the file).
    for case in ["torchscript_bert", "torchscript_gpt2", "torchscript_tenc", "torchscript_vit"] {
        if let Ok(b) = std::fs::read(common::testdata().join("transformers").join(case).join("model.onnx")) {
            onnx.push((format!("transformers/{case}"), b));
        }
    }
    let mut tir: Vec<(String, String)> =
        (0..12).map(|s| (format!("random graph {s}"), smelt_ir::text::print(&common::random_graph(s)))).collect();
    tir.push(("zoo:mobilenet_v2".into(), smelt_ir::text::print(&smelt_ir::zoo::mobilenet_v2(1).unwrap())));
    (onnx, tir)
}

const INTERESTING: [i64; 16] =
    [0, 1, -1, 2, -2, 3, 7, 64, 1 << 31, (1 << 31) - 1, 1 << 32, 1 << 40, 1 << 62, (1 << 62) + 1, i64::MAX, i64::MIN];

fn interesting(r: &mut Rng) -> i64 {
    if r.below(3) == 0 {
        r.below(8) as i64
    } else {
        INTERESTING[r.below(INTERESTING.len())]
    }
}

const OPS: [&str; 56] = [
    "Where",
    "Equal",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
    "And",
    "Or",
    "Xor",
    "Not",
    "IsNaN",
    "Range",
    "Mod",
    "Trilu",
    "GatherElements",
    "GatherND",
    "CastLike",
    "Conv",
    "Relu",
    "Add",
    "Mul",
    "Gemm",
    "MatMul",
    "Reshape",
    "Concat",
    "Split",
    "Slice",
    "Pad",
    "Transpose",
    "Softmax",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "BatchNormalization",
    "Clip",
    "Sigmoid",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Gather",
    "Cast",
    "Shape",
    "ConstantOfShape",
    "Expand",
    "Tile",
    "ReduceMean",
    "ReduceSum",
    "LayerNormalization",
    "Dropout",
    "Identity",
    "Sum",
    "Max",
    "PRelu",
    "LRN",
    "Gelu",
    "Constant",
    "Where",
];

const ATTRS: [&str; 20] = [
    "axis",
    "axes",
    "pads",
    "strides",
    "dilations",
    "kernel_shape",
    "group",
    "perm",
    "num_outputs",
    "split",
    "keepdims",
    "transA",
    "transB",
    "ceil_mode",
    "count_include_pad",
    "allowzero",
    "training_mode",
    "size",
    "start",
    "end",
];

/// One structural mutation of a decoded model.
fn mutate_model(m: &mut ModelProto, r: &mut Rng) {
    let Some(g) = m.graph.as_mut() else { return };
    let names: Vec<String> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .chain(g.input.iter().map(|i| i.name().to_string()))
        .chain(g.initializer.iter().map(|t| t.name().to_string()))
        .collect();
    let pick_name = |r: &mut Rng| if names.is_empty() || r.below(8) == 0 { String::new() } else { names[r.below(names.len())].clone() };
    match r.below(14) {
        0..=4 if !g.node.is_empty() => {
            let k = r.below(g.node.len());
            let n = &mut g.node[k];
            match r.below(9) {
                0 | 1 if !n.attribute.is_empty() => {
                    let a = r.below(n.attribute.len());
                    let a = &mut n.attribute[a];
                    match a.r#type() {
                        AttributeType::Ints if !a.ints.is_empty() => {
                            let i = r.below(a.ints.len());
                            a.ints[i] = interesting(r);
                        }
                        AttributeType::Ints => a.ints.push(interesting(r)),
                        AttributeType::Int => a.i = Some(interesting(r)),
                        AttributeType::Float => a.f = Some([0.0, -1.0, f32::NAN, f32::INFINITY, 1e30, 1e-30][r.below(6)]),
                        AttributeType::String => {
                            a.s = Some([&b"SAME_UPPER"[..], b"SAME_LOWER", b"VALID", b"", b"reflect", b"edge"][r.below(6)].to_vec())
                        }
                        AttributeType::Tensor => {
                            if let Some(t) = a.t.as_mut() {
                                match r.below(3) {
                                    0 => t.dims.clear(),
                                    1 => t.dims.push(interesting(r)),
                                    _ => t.data_type = Some(r.below(17) as i32),
                                }
                            }
                        }
                        _ => a.r#type = Some(r.below(12) as i32),
                    }
                }
                2 => {
                    let name = ATTRS[r.below(ATTRS.len())];
                    let attr = if r.below(2) == 0 {
                        AttributeProto {
                            name: Some(name.into()),
                            r#type: Some(AttributeType::Int as i32),
                            i: Some(interesting(r)),
                            ..Default::default()
                        }
                    } else {
                        let ints = (0..r.below(6)).map(|_| interesting(r)).collect();
                        AttributeProto { name: Some(name.into()), r#type: Some(AttributeType::Ints as i32), ints, ..Default::default() }
                    };
                    n.attribute.retain(|a| a.name() != name);
                    n.attribute.push(attr);
                }
                3 if !n.input.is_empty() => {
                    n.input.remove(r.below(n.input.len()));
                }
                4 => {
                    let i = pick_name(r);
                    n.input.push(i);
                }
                5 if !n.input.is_empty() => {
                    let i = r.below(n.input.len());
                    n.input[i] = pick_name(r);
                }
                6 => {
                    let o = if r.below(2) == 0 { pick_name(r) } else { format!("extra{}", r.below(100)) };
                    n.output.push(o);
                }
                7 if !n.output.is_empty() => {
                    let o = r.below(n.output.len());
                    n.output[o] = pick_name(r);
                }
                _ => n.op_type = Some(OPS[r.below(OPS.len())].into()),
            }
        }
        5 if !g.node.is_empty() => {
            let k = r.below(g.node.len());
            match r.below(3) {
                0 => {
                    g.node.remove(k);
                }
                1 => {
                    let n = g.node[k].clone();
                    g.node.insert(r.below(g.node.len() + 1), n);
                }
                _ => {
                    let j = r.below(g.node.len());
                    g.node.swap(k, j);
                }
            }
        }
        6 | 7 if !g.input.is_empty() => {
            let k = r.below(g.input.len());
            let inp = &mut g.input[k];
            if let Some(type_proto::Value::TensorType(tt)) = inp.r#type.as_mut().and_then(|t| t.value.as_mut()) {
                match (r.below(5), tt.shape.as_mut()) {
                    (0, _) => tt.shape = None,
                    (1, _) => tt.elem_type = Some(r.below(17) as i32),
                    (2, Some(s)) if !s.dim.is_empty() => {
                        s.dim.pop();
                    }
                    (_, Some(s)) if !s.dim.is_empty() => {
                        let d = r.below(s.dim.len());
                        s.dim[d].value = Some(if r.below(6) == 0 { Dim::DimParam("n".into()) } else { Dim::DimValue(interesting(r)) });
                    }
                    _ => {}
                }
            } else {
                inp.r#type = None;
            }
            if r.below(8) == 0 {
                let dup = g.input[k].clone();
                g.input.push(dup);
            }
        }
        8 | 9 if !g.initializer.is_empty() => {
            let k = r.below(g.initializer.len());
            let t = &mut g.initializer[k];
            match r.below(5) {
                0 if !t.dims.is_empty() => {
                    let d = r.below(t.dims.len());
                    t.dims[d] = interesting(r);
                }
                1 => t.dims.push(interesting(r).rem_euclid(4)),
                2 => t.data_type = Some(r.below(17) as i32),
                3 => {
                    if let Some(raw) = t.raw_data.as_mut() {
                        raw.truncate(r.below(raw.len() + 1));
                    }
                }
                _ => t.name = Some(pick_name(r)),
            }
        }
        10 if !g.output.is_empty() => {
            let k = r.below(g.output.len());
            match r.below(3) {
                0 => g.output[k].name = Some(pick_name(r)),
                1 => {
                    let dup = g.output[k].clone();
                    g.output.push(dup);
                }
                _ => {
                    if let Some(type_proto::Value::TensorType(tt)) = g.output[k].r#type.as_mut().and_then(|t| t.value.as_mut()) {
                        tt.elem_type = Some(r.below(17) as i32);
                    }
                }
            }
        }
        11 => {
            if let Some(o) = m.opset_import.first_mut() {
                o.version = Some([1, 5, 6, 7, 9, 10, 11, 12, 13, 17, 18, 21, 28, 29, 0, -1][r.below(16)]);
            }
        }
        12 => m.ir_version = Some([0, 1, 3, 4, 7, 8, 10, 14, 15, -1][r.below(10)]),
        _ => {}
    }
}

/// A byte-level mutation: flips, a truncation, an insertion, a deletion
/// or a duplicated run.
fn mutate_bytes(b: &mut Vec<u8>, r: &mut Rng) {
    if b.is_empty() {
        b.push(r.next_u64() as u8);
        return;
    }
    match r.below(5) {
        0 => {
            for _ in 0..1 + r.below(8) {
                let at = r.below(b.len());
                b[at] ^= 1 << r.below(8);
            }
        }
        1 => b.truncate(r.below(b.len())),
        2 => {
            let at = r.below(b.len() + 1);
            let ins: Vec<u8> = (0..1 + r.below(16)).map(|_| r.next_u64() as u8).collect();
            b.splice(at..at, ins);
        }
        3 => {
            let at = r.below(b.len());
            let end = (at + 1 + r.below(64)).min(b.len());
            b.drain(at..end);
        }
        _ => {
            let at = r.below(b.len());
            let end = (at + 1 + r.below(64)).min(b.len());
            let run = b[at..end].to_vec();
            b.splice(at..at, run);
        }
    }
}

/// A text mutation on lines and tokens: numbers replaced by interesting
/// ones, op names swapped, lines dropped or repeated, values renumbered,
/// expressions nested.
fn mutate_text(s: &str, r: &mut Rng) -> String {
    let mut lines: Vec<String> = s.lines().map(|l| l.to_string()).collect();
    if lines.is_empty() {
        return s.to_string();
    }
    let k = r.below(lines.len());
    match r.below(7) {
        0 => {
            lines.remove(k);
        }
        1 => {
            let l = lines[k].clone();
            lines.insert(r.below(lines.len() + 1), l);
        }
        2 | 3 => {
            // Replace the n-th number of the line.
            let l = &lines[k];
            let spans: Vec<(usize, usize)> = {
                let b = l.as_bytes();
                let mut v = Vec::new();
                let mut i = 0;
                while i < b.len() {
                    if b[i].is_ascii_digit() {
                        let st = i;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                        v.push((st, i));
                    } else {
                        i += 1;
                    }
                }
                v
            };
            if !spans.is_empty() {
                let (a, e) = spans[r.below(spans.len())];
                let n = interesting(r);
                lines[k] = format!("{}{}{}", &l[..a], n, &l[e..]);
            }
        }
        4 => {
            let ops = ["relu", "add", "conv", "concat", "reshape", "max_pool", "gemm", "softmax", "split", "slice", "pad", "transpose"];
            if let Some(eq) = lines[k].find("= ") {
                let rest = &lines[k][eq + 2..];
                if let Some(p) = rest.find(['(', ' ']) {
                    lines[k] = format!("{}= {}{}", &lines[k][..eq], ops[r.below(ops.len())], &rest[p..]);
                }
            }
        }
        5 => {
            // A deeply nested expression, or a long chain, in one kernel.
            let depth = [10, 40, 1000, 100_000][r.below(4)];
            let e = format!("{}$0{}", "relu(".repeat(depth), ")".repeat(depth));
            lines.insert(lines.len().saturating_sub(1), format!("  %9999 = elementwise(%0) {{expr=\"{e}\"}} : f32[1]"));
        }
        _ => {
            let l = &lines[k];
            if let Some(p) = l.find('%') {
                lines[k] = format!("{}%{}{}", &l[..p], r.below(4000), &l[p + 1..].trim_start_matches(|c: char| c.is_ascii_digit()));
            }
        }
    }
    lines.join("\n") + "\n"
}

/// Case `index` of sequence `seed`: which seed file, which mutations.
fn make_case(seed: u64, index: u64, onnx: &[(String, Vec<u8>)], tir: &[(String, String)]) -> Case {
    let mut r = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index);
    let n_mut = 1 + r.below(3);
    match r.below(10) {
        0..=3 => {
            let (name, b) = &onnx[r.below(onnx.len())];
            let mut m = ModelProto::decode(b.as_slice()).expect("seed decodes");
            for _ in 0..n_mut {
                mutate_model(&mut m, &mut r);
            }
            Case { bytes: m.encode_to_vec(), format: Format::Onnx, what: format!("{name} with {n_mut} structural mutations") }
        }
        4..=6 => {
            let (name, b) = &onnx[r.below(onnx.len())];
            let mut b = b.clone();
            for _ in 0..n_mut {
                mutate_bytes(&mut b, &mut r);
            }
            Case { bytes: b, format: Format::Onnx, what: format!("{name} with {n_mut} byte mutations") }
        }
        _ => {
            let (name, s) = &tir[r.below(tir.len())];
            let mut s = s.clone();
            for _ in 0..n_mut {
                s = mutate_text(&s, &mut r);
            }
            let format = if r.below(4) == 0 { Format::KernelText } else { Format::Text };
            Case { bytes: s.into_bytes(), format, what: format!("{name} with {n_mut} text mutations") }
        }
    }
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus")
}

/// The inputs that once failed: each must now be refused or run, never fail.
#[test]
fn corpus_cases_never_fail() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir()).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty());
    let mut failures = Vec::new();
    for f in &files {
        let format = match f.extension().and_then(|e| e.to_str()) {
            Some("onnx") => Format::Onnx,
            Some("tir") => Format::Text,
            Some("ktir") => Format::KernelText,
            _ => continue,
        };
        let case = Case { bytes: std::fs::read(f).unwrap(), format, what: f.display().to_string() };
        if let Err(e) = run(&case) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{} corpus cases fail:\n{}", failures.len(), failures.join("\n"));
}

/// Random cases for `SMELT_FUZZ_SECS`; all failures are listed, with the
/// variable that reruns each.
#[test]
fn mutated_models_never_fail() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (onnx, tir) = seeds();
    assert!(onnx.len() > 100, "only {} ONNX seeds", onnx.len());
    let seed: u64 = std::env::var("SMELT_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    if let Ok(one) = std::env::var("SMELT_FUZZ_CASE") {
        let (s, i) = one.split_once(':').expect("SEED:INDEX");
        let (s, i) = (s.parse().unwrap(), i.parse().unwrap());
        let case = make_case(s, i, &onnx, &tir);
        let ext = if case.format == Format::Onnx { "onnx" } else { "tir" };
        let keep = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/fuzz-case.{ext}"));
        std::fs::write(&keep, &case.bytes).unwrap();
        CASE.store(s << 32 | i, Ordering::Relaxed);
        println!("{} (kept in {})", case.what, keep.display());
        match run(&case) {
            Ok(r) => println!("{r:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let cases: u64 = std::env::var("SMELT_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(CASES);
    let secs: u64 = std::env::var("SMELT_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let t = Instant::now();
    let (mut index, mut failures) = (0u64, Vec::new());
    let mut reached = std::collections::BTreeMap::new();
    while index < cases || t.elapsed() < Duration::from_secs(secs) {
        let case = make_case(seed, index, &onnx, &tir);
        CASE.store(seed << 32 | index, Ordering::Relaxed);
        match run(&case) {
            Ok(Ok(r)) => *reached.entry(format!("{r:?}")).or_insert(0) += 1,
            Ok(Err(_)) => *reached.entry("refused".to_string()).or_insert(0) += 1,
            Err(e) => {
                let line = format!("SMELT_FUZZ_CASE={seed}:{index} {e}");
                eprintln!("{line}");
                failures.push(line);
            }
        }
        index += 1;
    }
    println!("{index} cases in {:.0} s (seed {seed}): {reached:?}", t.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {index} cases fail:\n{}", failures.len(), failures.join("\n"));
    // The fuzzer must reach every phase, or it tests little.
    for phase in ["refused", "Ran"] {
        assert!(reached.contains_key(phase), "no case reached {phase}: {reached:?}");
    }
}

/// The CPU reference executor allocates what its liveness says it holds
/// ([`smelt_runtime::cpu::peak_bytes`], the figure the host memory check
/// uses), plus each op's scratch: measured by the allocator, on real and
/// random models.
#[test]
fn cpu_runs_allocate_what_the_check_assumes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut models: Vec<(String, smelt_ir::Graph)> = vec![
        ("squeezenet".into(), common::load(common::variant("squeezenet").join("model.onnx").to_str().unwrap(), None)),
        ("zoo:mobilenet_v2 batch 2".into(), smelt_ir::zoo::mobilenet_v2(2).unwrap()),
    ];
    models.extend((0..6).map(|s| (format!("random graph {s}"), common::random_graph(s))));
    let mut report = Vec::new();
    for (name, g) in models {
        let k = common::compiled(&g, true);
        let inputs = common::random_inputs(&k, 1);
        let need = smelt_runtime::cpu::peak_bytes(&k).unwrap() as u64;
        let base = reset_peak();
        let outs = smelt_runtime::cpu::run(&k, &inputs).unwrap();
        let used = PEAK.load(Ordering::Relaxed) - base;
        drop(outs);
        // Weights and inputs existed before the run: they count in `need`
        // but were not allocated by it.
        let held: u64 = k.node_ids().filter(|&n| k.node(n).op.is_persistent()).map(|n| k.node(n).outputs[0].bytes() as u64).sum::<u64>()
            + inputs.iter().map(|t| t.ty().bytes() as u64).sum::<u64>();
        report.push(format!(
            "{name}: allocated {used} bytes in the run; liveness {need} bytes of which {held} weights and inputs ({:.2}x of the rest)",
            used as f64 / (need - held).max(1) as f64
        ));
        assert!(used <= 2 * (need - held) + (1 << 20), "{}", report.last().unwrap());
    }
    println!("{}", report.join("\n"));
}

// ------------------------------------------------------------- training files

/// Training cases a run tries (`SMELT_FUZZ_TRAIN_CASES`).
const TRAIN_CASES: u64 = 6000;

/// The good files a training case starts from.
struct TrainSeeds {
    data: Vec<u8>,
    json: Vec<u8>,
    archive: Vec<u8>,
    recipe: Vec<u8>,
    tuning: Vec<u8>,
}

/// The entries of an `.npz` (name, `.npy` bytes), from its arrays.
fn npz_entries(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let arrays = smelt_ir::npy::read_npz_from(std::io::Cursor::new(bytes)).expect("a good seed");
    arrays.iter().map(|(n, t)| (format!("{n}.npy"), smelt_ir::npy::npy_bytes(t))).collect()
}

/// An archive mutated entry by entry, every CRC-32 right: `.npy` headers
/// that lie (shape, dtype, order, length), values that are not finite or
/// out of range, data cut or grown, entries dropped, repeated, renamed or
/// added.
fn mutate_npz(bytes: &[u8], r: &mut Rng) -> Vec<u8> {
    let mut entries = npz_entries(bytes);
    if entries.is_empty() {
        return bytes.to_vec();
    }
    let k = r.below(entries.len());
    // Where a whole `.npy` header ends in `b` (an entry cut short has none).
    let header_end = |b: &[u8]| (b.len() >= 10).then(|| 10 + u16::from_le_bytes([b[8], b[9]]) as usize).filter(|&e| e <= b.len());
    match r.below(8) {
        0 | 1 if header_end(&entries[k].1).is_some() => {
            // The header: one of its numbers, its dtype or its order.
            let (name, b) = &mut entries[k];
            let len = u16::from_le_bytes([b[8], b[9]]) as usize;
            let header = String::from_utf8_lossy(&b[10..10 + len]).to_string();
            let data = b[10 + len..].to_vec();
            let header = match r.below(3) {
                0 => {
                    let n = interesting(r);
                    let open = header.find("'shape': (").map_or(0, |i| i + 10);
                    let close = header[open..].find(')').map_or(header.len(), |i| open + i);
                    let mut dims: Vec<String> =
                        header[open..close].split(',').map(|d| d.trim().to_string()).filter(|d| !d.is_empty()).collect();
                    match r.below(3) {
                        0 if !dims.is_empty() => {
                            let at = r.below(dims.len());
                            dims[at] = n.to_string();
                        }
                        1 => dims.push(n.unsigned_abs().to_string()),
                        _ => {
                            dims.pop();
                        }
                    }
                    let dims = if dims.len() == 1 { format!("{},", dims[0]) } else { dims.join(", ") };
                    format!("{}{dims}{}", &header[..open], &header[close..])
                }
                1 => {
                    let descr = ["<f4", "<f8", "<f2", "<i8", "<i4", "|u1", "|b1", ">f4", "<c8", "O", "<U3", ""][r.below(12)];
                    let at = header.find("'descr': '").map_or(0, |i| i + 10);
                    let end = header[at..].find('\'').map_or(at, |i| at + i);
                    format!("{}{descr}{}", &header[..at], &header[end..])
                }
                _ => header.replace("False", "True"),
            };
            let mut out = b"\x93NUMPY\x01\x00".to_vec();
            out.extend_from_slice(&(header.len() as u16).to_le_bytes());
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(&data);
            *b = out;
            let _ = name;
        }
        2 => {
            // A value: NaN, infinite, huge, negative, or an odd label.
            let b = &mut entries[k].1;
            let start = header_end(b).unwrap_or(b.len());
            if b.len() >= start + 4 {
                let at = start + 4 * r.below((b.len() - start) / 4);
                let v: [u8; 4] = match r.below(5) {
                    0 => f32::NAN.to_le_bytes(),
                    1 => f32::INFINITY.to_le_bytes(),
                    2 => 1e30f32.to_le_bytes(),
                    3 => (-1f32).to_le_bytes(),
                    _ => (interesting(r) as i32).to_le_bytes(),
                };
                b[at..at + 4].copy_from_slice(&v);
            }
        }
        3 if !entries[k].1.is_empty() => {
            let b = &mut entries[k].1;
            if r.below(2) == 0 {
                let keep = r.below(b.len());
                b.truncate(keep);
            } else {
                let more: Vec<u8> = (0..1 + r.below(64)).map(|_| r.next_u64() as u8).collect();
                b.extend(more);
            }
        }
        4 => {
            entries.remove(k);
        }
        5 => {
            // The same array under another name.
            let (name, b) = entries[k].clone();
            entries.push((format!("{}2.npy", name.trim_end_matches(".npy")), b));
        }
        6 => {
            let names = ["x.npy", "y.npy", "labels.npy", "targets.npy", "../x.npy", "", "x", "step.npy", "x.npy/"];
            entries[k].0 = names[r.below(names.len())].to_string();
        }
        _ => {
            let junk: Vec<u8> = (0..r.below(200)).map(|_| r.next_u64() as u8).collect();
            entries.push((format!("extra{}.npy", r.below(3)), junk));
        }
    }
    // Twice the same name: the zip writer refuses it, so the seed goes on.
    smelt_ir::npy::zip_entries(&entries).unwrap_or_else(|_| bytes.to_vec())
}

/// A JSON document mutated in its structure: a number replaced by an
/// interesting one, a string by a hostile one, a key removed or added, a
/// value of another type.
fn mutate_json(bytes: &[u8], r: &mut Rng) -> Vec<u8> {
    use serde_json::Value;
    let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else { return bytes.to_vec() };
    fn nodes(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(nodes).sum(),
            Value::Object(o) => o.values().map(nodes).sum(),
            _ => 0,
        }
    }
    /// Mutates the `n`-th node (depth first) of `v`; whether it was found.
    fn at(v: &mut Value, n: &mut usize, r: &mut Rng) -> bool {
        if *n == 0 {
            mutate_node(v, r);
            return true;
        }
        *n -= 1;
        match v {
            Value::Array(a) => a.iter_mut().any(|x| at(x, n, r)),
            Value::Object(o) => o.values_mut().any(|x| at(x, n, r)),
            _ => false,
        }
    }
    fn hostile(r: &mut Rng) -> Value {
        match r.below(9) {
            0 => Value::from(interesting(r)),
            1 => Value::from(u64::MAX),
            2 => serde_json::json!(1e308),
            3 => serde_json::json!(-0.5),
            4 => Value::from(""),
            5 => Value::from("../../checkpoint-1.npz"),
            6 => Value::from("x".repeat(100_000)),
            7 => Value::Null,
            _ => serde_json::json!({"a": [1, 2, 3]}),
        }
    }
    fn mutate_node(v: &mut Value, r: &mut Rng) {
        match (v, r.below(3)) {
            (Value::Object(o), 0) if !o.is_empty() => {
                let key = o.keys().nth(r.below(o.len())).cloned().expect("in range");
                o.remove(&key);
            }
            (Value::Object(o), 1) => {
                o.insert(["format", "step", "scaler", "arrays", "gpus", "tiles", "batch"][r.below(7)].into(), hostile(r));
            }
            (Value::Array(a), 0) if !a.is_empty() => {
                a.pop();
            }
            (Value::Number(x), _) if r.below(2) == 0 => {
                let f = x.as_f64().unwrap_or(0.0);
                *x = serde_json::Number::from_f64([f * 2.0 + 1.0, -f, f / 3.0, 0.0][r.below(4)]).unwrap_or_else(|| 0.into());
            }
            (t, _) => *t = hostile(r),
        }
    }
    let mut n = r.below(nodes(&v));
    at(&mut v, &mut n, r);
    v.to_string().into_bytes()
}

/// Training case `index` of sequence `seed`.
fn make_train_case(seed: u64, index: u64, s: &TrainSeeds) -> (smelt::fuzz::TrainFile, Vec<u8>, String) {
    use smelt::fuzz::TrainFile;
    let mut r = Rng::new(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ index);
    let file = [TrainFile::Data, TrainFile::CheckpointJson, TrainFile::CheckpointArrays, TrainFile::Recipe, TrainFile::Tuning][r.below(5)];
    let mut b = match file {
        TrainFile::Data => s.data.clone(),
        TrainFile::CheckpointJson => s.json.clone(),
        TrainFile::CheckpointArrays => s.archive.clone(),
        TrainFile::Recipe => s.recipe.clone(),
        TrainFile::Tuning => s.tuning.clone(),
    };
    let n_mut = 1 + r.below(3);
    let structural = r.below(10) < 7;
    for _ in 0..n_mut {
        b = match (structural, file) {
            (false, _) => {
                mutate_bytes(&mut b, &mut r);
                b
            }
            (true, TrainFile::Data | TrainFile::CheckpointArrays) => {
                // A structural mutation needs a readable archive.
                if smelt_ir::npy::read_npz_from(std::io::Cursor::new(&b)).is_ok() {
                    mutate_npz(&b, &mut r)
                } else {
                    b
                }
            }
            (true, _) => mutate_json(&b, &mut r),
        };
    }
    let how = if structural { "structural" } else { "byte" };
    (file, b, format!("{file:?} with {n_mut} {how} mutations"))
}

/// Issue 44: the files a training run reads besides the model (data sets,
/// checkpoints, recipes, tuning tables), made by `smelt train`, `smelt fit`
/// and `smelt tune`'s format, then mutated; each case is read as `smelt
/// train` reads it and, when accepted, used (a batch gathered, one step
/// resumed from the checkpoint, the recipe's or table's step planned). A
/// case fails on a panic, an abort (an allocation over [`CAP`]), a hang,
/// or an error smelt calls its own bug. `SMELT_FUZZ_TRAIN_CASE=SEED:INDEX`
/// reruns one case and keeps its file in `target/fuzz-train-case`: add it
/// to `tests/fuzz-corpus/train` (named for its kind), whose files run first.
#[test]
fn mutated_training_files_never_fail() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runs = common::testdata().join("train_runs").join("mlp");
    let (model, data) = (runs.join("model.onnx"), runs.join("train.npz"));
    assert!(data.is_file(), "test data missing under {}: run scripts/fetch-testdata.sh", runs.display());
    let dir = std::env::temp_dir().join(format!("smelt-fuzz-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (m, ck, recipe) = (model.to_str().unwrap(), dir.join("seed"), dir.join("recipe.json"));
    let cli = |args: &[&str]| {
        let out = common::smelt().args(args).output().unwrap();
        assert!(out.status.success(), "smelt {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let train_flags = ["--train", "adam", "--batch", "8"];
    cli(&[
        &["train", m, "--data", data.to_str().unwrap(), "--steps", "3", "--checkpoint", ck.to_str().unwrap(), "--json"],
        &train_flags[..],
    ]
    .concat());
    cli(&["fit", m, "--batch", "8", "--train", "adam", "--memory-limit", "1MiB", "--save-recipe", recipe.to_str().unwrap(), "--json"]);
    let tuning = smelt::tune::Tuning {
        device: "NVIDIA H100 80GB HBM3".into(),
        tiles: [("gemm_n8k10m16".to_string(), "128x64".to_string()), ("conv3x3_n8c64".to_string(), "64x128".to_string())].into(),
        kernels: Vec::new(),
    };
    let mut args = smelt::spec::ModelSpec::new(m);
    args.batch = Some(8);
    args.train.optimizer = Some(smelt::spec::OptimizerKind::Adam);
    let target = std::sync::Arc::new(smelt::fuzz::TrainTarget::new(args, &data, &ck, &dir.join("cases")).expect("the good files are read"));
    let (json, archive) = target.checkpoint();
    let seeds = TrainSeeds {
        data: std::fs::read(&data).unwrap(),
        json: json.to_vec(),
        archive: archive.to_vec(),
        recipe: std::fs::read(&recipe).unwrap(),
        tuning: serde_json::to_vec_pretty(&tuning).unwrap(),
    };
    // Each good file is accepted as it is: else every case is refused early.
    for (file, b) in [
        (smelt::fuzz::TrainFile::Data, &seeds.data),
        (smelt::fuzz::TrainFile::CheckpointJson, &seeds.json),
        (smelt::fuzz::TrainFile::CheckpointArrays, &seeds.archive),
        (smelt::fuzz::TrainFile::Recipe, &seeds.recipe),
        (smelt::fuzz::TrainFile::Tuning, &seeds.tuning),
    ] {
        let r = target.exercise(file, b);
        assert!(matches!(r, Ok(Ok(()))), "the good {file:?} is not accepted: {r:?}");
    }
    // The files that once failed (tests/fuzz-corpus/train, the kind by the
    // name's start): refused or used, never a failure.
    let mut corpus: Vec<PathBuf> = std::fs::read_dir(corpus_dir().join("train")).unwrap().map(|e| e.unwrap().path()).collect();
    corpus.sort();
    for f in corpus {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let file = match (name.split('-').next().unwrap(), name.ends_with(".json")) {
            ("data", _) => smelt::fuzz::TrainFile::Data,
            ("checkpoint", true) => smelt::fuzz::TrainFile::CheckpointJson,
            ("checkpoint", false) => smelt::fuzz::TrainFile::CheckpointArrays,
            ("recipe", _) => smelt::fuzz::TrainFile::Recipe,
            ("tuning", _) => smelt::fuzz::TrainFile::Tuning,
            _ => panic!("{}: name it data-, checkpoint-, recipe- or tuning-", f.display()),
        };
        let (t, bytes) = (target.clone(), std::fs::read(&f).unwrap());
        if let Err(e) = run_with(&name, move || t.exercise(file, &bytes)) {
            panic!("corpus file {e}");
        }
    }
    let seed: u64 = std::env::var("SMELT_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    if let Ok(one) = std::env::var("SMELT_FUZZ_TRAIN_CASE") {
        let (s, i) = one.split_once(':').expect("SEED:INDEX");
        let (s, i) = (s.parse().unwrap(), i.parse().unwrap());
        let (file, bytes, what) = make_train_case(s, i, &seeds);
        let keep = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-train-case");
        std::fs::write(&keep, &bytes).unwrap();
        println!("{what} (kept in {})", keep.display());
        let t = target.clone();
        match run_with(&what, move || t.exercise(file, &bytes)) {
            Ok(r) => println!("{r:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let cases: u64 = std::env::var("SMELT_FUZZ_TRAIN_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(TRAIN_CASES);
    let t = Instant::now();
    let mut failures = Vec::new();
    let mut outcome: std::collections::BTreeMap<String, [u64; 2]> = Default::default();
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    for index in 0..cases {
        let (file, bytes, what) = make_train_case(seed, index, &seeds);
        CASE.store(seed << 32 | index, Ordering::Relaxed);
        let target = target.clone();
        match run_with(&what, move || target.exercise(file, &bytes)) {
            Ok(Ok(r)) => {
                outcome.entry(format!("{file:?}")).or_default()[r.is_ok() as usize] += 1;
                if let Err(m) = r {
                    // The message less its paths and figures: its kind.
                    let kind: String = m.replace(dir.to_str().unwrap(), "").chars().filter(|c| !c.is_ascii_digit()).take(90).collect();
                    *reasons.entry(format!("{file:?}: {kind}")).or_insert(0u64) += 1;
                }
            }
            Ok(Err(m)) => unreachable!("refusals are answers: {m}"),
            Err(e) => {
                let line = format!("SMELT_FUZZ_TRAIN_CASE={seed}:{index} {e}");
                eprintln!("{line}");
                failures.push(line);
            }
        }
    }
    println!("{cases} training cases in {:.0} s (seed {seed}), [refused, accepted] by file: {outcome:?}", t.elapsed().as_secs_f64());
    for (kind, n) in &reasons {
        println!("{n:6}  {kind}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} of {cases} training cases fail:\n{}", failures.len(), failures.join("\n"));
    // Every kind of file both refused and accepted: the cases reach the
    // checks and what comes after them.
    for (file, [refused, accepted]) in &outcome {
        assert!(*refused > 0 && *accepted > 0, "{file}: {refused} refused, {accepted} accepted");
    }
    assert_eq!(outcome.len(), 5, "{outcome:?}");
}
