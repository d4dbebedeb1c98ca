//! A program: the kernels of a fused, planned graph in schedule order, each
//! argument addressed as an offset into the arena (activations, graph
//! inputs and outputs) or into the weights blob (constants, uploaded once).
//! This is what `smelt compile --out` writes as `plan.json`, and what a
//! runtime executes.

use crate::kernel::{Kernel, Launch, Lowered};
use crate::nvrtc::{Compiled, Compiler};
use crate::tiling::Target;
use crate::CodegenError;
use smelt_ir::{KernelGraph, NodeId, OpSet, Tensor, TensorType, ValueId};
use smelt_passes::memory::{Plan, ALIGN};
use std::collections::{HashMap, HashSet};

/// Where an argument's bytes are.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Space {
    /// The activation arena.
    Arena,
    /// The weights blob.
    Weights,
}

/// A pointer argument of a kernel launch.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Arg {
    /// The kernel parameter it binds (`in0`, `x`, `out`, ...).
    pub param: String,
    /// The value's name (`node` or `node:slot`).
    pub value: String,
    /// Arena or weights.
    pub space: Space,
    /// Byte offset of the first element.
    pub offset: usize,
    /// Bytes of the value (contiguous).
    pub bytes: usize,
    /// Its type as the kernel reads it, e.g. `f32[1,64,56,56]`
    /// (channels-last: `f32[1,56,56,64]`).
    #[serde(serialize_with = "display")]
    pub ty: TensorType,
    /// The value is held channels-last: `[N, ..., C]` for an activation
    /// `[N, C, ...]`, `[M, ..., C]` for conv weights `[M, C, ...]`. A fact
    /// of memory (where its producer, or the blob, put it), not of the
    /// kernel reading it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub channels_last: bool,
}

fn display<S: serde::Serializer>(t: &TensorType, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(t)
}

/// One kernel launch.
#[derive(Clone, Debug)]
pub struct Step {
    /// The node it computes.
    pub node: String,
    /// Its id in the kernel graph the program was built from.
    pub id: NodeId,
    /// The model nodes it computes (ids of the semantic graph as imported,
    /// printed `%N` as `smelt print` does).
    pub origin: Vec<NodeId>,
    /// The kernel (its name unique in the program).
    pub kernel: Kernel,
    /// Launch geometry.
    pub launch: Launch,
    /// Pointer arguments in parameter order (inputs, then the output).
    pub args: Vec<Arg>,
}

/// A constant in the weights blob.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WeightSlot {
    /// The constant's name.
    pub name: String,
    /// Its dtype.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Byte offset in the blob (aligned to [`ALIGN`]).
    pub offset: usize,
    /// Bytes.
    pub bytes: usize,
    /// Stored channels-last, `[M, KH, KW, C/groups]` (the weights of a
    /// conv reading a channels-last x): `shape` is that, and the blob holds
    /// the constant permuted.
    pub channels_last: bool,
}

/// A graph input or output and where it lives: in the arena, or (the
/// result of an optimizer update) in the weights blob, over the value it
/// replaced.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Io {
    /// Its name.
    pub name: String,
    /// Its type, e.g. `f32[1,3,224,224]`.
    pub ty: String,
    /// Arena or weights.
    pub space: Space,
    /// Byte offset in the arena (or the weights blob).
    pub offset: usize,
    /// Bytes.
    pub bytes: usize,
}

/// The kernels of a planned graph.
#[derive(Clone, Debug)]
pub struct Program {
    /// Launches in schedule order.
    pub steps: Vec<Step>,
    /// Arena bytes.
    pub arena: usize,
    /// Constants, in order of first use.
    pub weights: Vec<WeightSlot>,
    /// Bytes of the weights blob.
    pub weights_bytes: usize,
    /// Graph inputs.
    pub inputs: Vec<Io>,
    /// Graph outputs.
    pub outputs: Vec<Io>,
    /// The outputs' types.
    pub output_types: Vec<TensorType>,
}

fn value_name(g: &KernelGraph, v: ValueId) -> String {
    let n = &g.node(v.node).name;
    if g.node(v.node).outputs.len() > 1 {
        format!("{n}:{}", v.slot)
    } else {
        n.clone()
    }
}

/// The constant `v` is a view of (through reshapes and the like), if any.
fn weight_root(g: &KernelGraph, mut v: ValueId) -> Option<ValueId> {
    loop {
        let n = g.node(v.node);
        if n.op.is_persistent() {
            return Some(v);
        }
        if !n.op.is_view() {
            return None;
        }
        v = *g.inputs_of(v.node).first()?;
    }
}

/// The parameter names of a kernel with `n` pointer inputs.
fn params(k: &Kernel, n: usize) -> Vec<String> {
    let mut p: Vec<String> = match k {
        Kernel::Conv(c) => c.params().into_iter().map(String::from).collect(),
        Kernel::Gemm(m) => match &m.epilogue {
            // The epilogue's inputs after the product are in1, in2, ...
            Some(e) => ["a", "b"]
                .iter()
                .map(|s| s.to_string())
                .chain((1..e.inputs.len()).map(|i| format!("in{i}")))
                .chain(["out".to_string()])
                .collect(),
            None => ["a", "b", "c"].iter().take(n).map(|s| s.to_string()).chain(["out".to_string()]).collect(),
        },
        Kernel::Pool(_) => vec!["in".into(), "out".into()],
        // Writes its operands in place: no output.
        Kernel::Update(u) => return u.params(),
        Kernel::Attention(a) => ["q", "kt", "v"]
            .iter()
            .map(|s| s.to_string())
            .chain((0..a.extras.len()).map(|k| format!("e{k}")))
            .chain(["out".to_string()])
            .collect(),
        Kernel::Reduction(r) => (0..r.inputs.len())
            .map(|i| format!("in{i}"))
            .chain(["scale", "bias"].iter().take(r.extra.len()).map(|s| s.to_string()))
            .chain(["out".to_string()])
            .collect(),
        _ => (0..n).map(|i| format!("in{i}")).chain(["out".to_string()]).collect(),
    };
    p.truncate(n + 1);
    p
}

impl Program {
    /// Lowers every node of `g` in `plan`'s schedule, chooses the
    /// tensor-core kernels' tiles for `target` ([`crate::tiling`]) and their
    /// layouts. Kernel names are made unique by a numeric suffix where two
    /// different kernels would share one.
    pub fn build(g: &KernelGraph, plan: &Plan, target: &Target) -> Result<Program, CodegenError> {
        let mut weights = Vec::new();
        let mut weight_at: HashMap<NodeId, usize> = HashMap::new();
        let mut weights_bytes = 0;
        let mut names: HashMap<String, Vec<String>> = HashMap::new();
        let mut steps = Vec::new();
        let mut kernels = Vec::new();
        for &id in &plan.schedule {
            match Kernel::lower(g, id, plan.copied_concats.contains(&id))? {
                Lowered::Nothing => {}
                Lowered::Kernel(mut k) => {
                    crate::tiling::choose(&mut k, crate::tiling::node_bytes(g, id), target);
                    kernels.push((id, *k))
                }
            }
        }
        let (nhwc, permuted) = choose_layouts(g, &mut kernels);
        for (id, mut kernel) in kernels {
            // Unique names: same name and same source share the name.
            let source = kernel.cuda();
            let seen = names.entry(kernel.name().to_string()).or_default();
            match seen.iter().position(|s| *s == source) {
                Some(0) => {}
                Some(i) => kernel.rename(format!("{}_{i}", kernel.name())),
                None => {
                    let i = seen.len();
                    seen.push(source);
                    if i > 0 {
                        kernel.rename(format!("{}_{i}", kernel.name()));
                    }
                }
            }
            let ins = g.inputs_of(id);
            let names_of = params(&kernel, ins.len());
            let mut args = Vec::new();
            for (param, v) in names_of.iter().zip(ins.iter().copied().chain([ValueId { node: id, slot: 0 }])) {
                let (bytes, mut ty) = (g.ty(v).bytes(), g.ty(v).clone());
                let channels_last = nhwc.contains(&v.node) || permuted.contains(&v.node);
                if channels_last {
                    ty.shape = crate::conv::channels_last_shape(&ty.shape);
                }
                // A view of a constant reads the constant's bytes.
                let v = weight_root(g, v).unwrap_or(v);
                if g.node(v.node).op.is_persistent() {
                    let offset = *weight_at.entry(v.node).or_insert_with(|| {
                        let at = weights_bytes;
                        let ty = g.ty(v);
                        let channels_last = permuted.contains(&v.node);
                        let shape = if channels_last { crate::conv::channels_last_shape(&ty.shape) } else { ty.shape.clone() };
                        weights.push(WeightSlot {
                            name: g.node(v.node).name.clone(),
                            dtype: ty.dtype.to_string(),
                            shape,
                            offset: at,
                            bytes,
                            channels_last,
                        });
                        weights_bytes += bytes.div_ceil(ALIGN) * ALIGN;
                        at
                    });
                    args.push(Arg {
                        param: param.clone(),
                        value: value_name(g, v),
                        space: Space::Weights,
                        offset,
                        bytes,
                        ty,
                        channels_last,
                    });
                    continue;
                }
                let place = plan.placements.get(&v).ok_or_else(|| CodegenError::Unsupported {
                    node: g.node(id).name.clone(),
                    op: g.node(id).op.name().to_string(),
                    detail: format!("value {} has no place in the memory plan", value_name(g, v)),
                })?;
                // The planner aliases only contiguous slices; kernels address
                // their operands densely.
                if place.intervals.len() != 1 {
                    return Err(CodegenError::Unsupported {
                        node: g.node(id).name.clone(),
                        op: g.node(id).op.name().to_string(),
                        detail: format!(
                            "value {} is placed in {} strided pieces; kernels need it contiguous",
                            value_name(g, v),
                            place.intervals.len()
                        ),
                    });
                }
                args.push(Arg {
                    param: param.clone(),
                    value: value_name(g, v),
                    space: Space::Arena,
                    offset: place.intervals[0].0,
                    bytes,
                    ty,
                    channels_last,
                });
            }
            // Four f32 elements per thread where every operand is 16-byte aligned.
            if let Kernel::Elementwise(e) = &mut kernel {
                if e.vectorizable() && args.iter().all(|a| a.offset % 16 == 0) {
                    e.vector = true;
                    e.name += "_v4";
                }
            }
            let launch = kernel.launch();
            steps.push(Step { node: g.node(id).name.clone(), id, origin: g.origin(id).to_vec(), kernel, launch, args });
        }
        // A constant graph output (or a view of one) is read from the
        // weights (not a parameter or state: an update may overwrite it).
        let constant = |n: NodeId| matches!(g.node(n).op.semantic(), Some(smelt_ir::Op::Constant));
        for (_, v) in g.outputs() {
            let root = weight_root(g, *v).unwrap_or(*v);
            if constant(root.node) && !weight_at.contains_key(&root.node) {
                let ty = g.ty(root);
                weight_at.insert(root.node, weights_bytes);
                weights.push(WeightSlot {
                    name: g.node(root.node).name.clone(),
                    dtype: ty.dtype.to_string(),
                    shape: ty.shape.clone(),
                    offset: weights_bytes,
                    bytes: ty.bytes(),
                    channels_last: false,
                });
                weights_bytes += ty.bytes().div_ceil(ALIGN) * ALIGN;
            }
        }
        let io = |v: ValueId, name: String| -> Result<Io, CodegenError> {
            let ty = g.ty(v);
            let root = weight_root(g, v).unwrap_or(v);
            if let Some(&offset) = weight_at.get(&root.node).filter(|_| constant(root.node)) {
                return Ok(Io { name, ty: ty.to_string(), space: Space::Weights, offset, bytes: ty.bytes() });
            }
            // An update's result lives where the value it replaced does.
            if let Some(i) = g.node(v.node).op.semantic().and_then(|op| op.updated_operand(v.slot as usize)) {
                let target = g.inputs_of(v.node)[i].node;
                let offset = *weight_at.get(&target).ok_or_else(|| CodegenError::Unsupported {
                    node: g.node(v.node).name.clone(),
                    op: g.node(v.node).op.name().to_string(),
                    detail: format!("output {name} replaces {}, which no kernel reads", g.node(target).name),
                })?;
                return Ok(Io { name, ty: ty.to_string(), space: Space::Weights, offset, bytes: ty.bytes() });
            }
            let offset = match plan.placements.get(&v) {
                Some(p) if p.intervals.len() == 1 => p.intervals[0].0,
                _ => {
                    return Err(CodegenError::Unsupported {
                        node: g.node(v.node).name.clone(),
                        op: g.node(v.node).op.name().to_string(),
                        detail: format!("graph input or output {name} is not one contiguous piece of the arena (a constant output?)"),
                    })
                }
            };
            Ok(Io { name, ty: ty.to_string(), space: Space::Arena, offset, bytes: ty.bytes() })
        };
        let inputs = g.inputs().iter().map(|&n| io(ValueId { node: n, slot: 0 }, g.node(n).name.clone())).collect::<Result<_, _>>()?;
        let outputs = g.outputs().iter().map(|(name, v)| io(*v, name.clone())).collect::<Result<_, _>>()?;
        let output_types = g.outputs().iter().map(|(_, v)| g.ty(*v).clone()).collect();
        Ok(Program { steps, arena: plan.arena, weights, weights_bytes, inputs, outputs, output_types })
    }

    /// The weights blob of `g` (the graph the program was built from): each
    /// constant's little-endian bytes at its offset. A constant without data
    /// (a text model whose weights were never given) is an error, never zeros.
    pub fn weights_blob(&self, g: &KernelGraph) -> Result<Vec<u8>, CodegenError> {
        let mut blob = vec![0u8; self.weights_bytes];
        let by_name: HashMap<&str, NodeId> =
            g.node_ids().filter(|&n| g.node(n).op.is_persistent()).map(|n| (g.node(n).name.as_str(), n)).collect();
        for w in &self.weights {
            let t = by_name.get(w.name.as_str()).and_then(|&n| g.weight(n)).ok_or_else(|| CodegenError::Unsupported {
                node: w.name.clone(),
                op: "constant".into(),
                detail: "has no data: a kernel reads it, so the weights blob cannot be built (give the model its weights)".into(),
            })?;
            let mut bytes = t.data().to_le_bytes();
            if w.channels_last {
                bytes = channels_last_bytes(&bytes, t.shape());
            }
            if bytes.len() != w.bytes {
                return Err(CodegenError::Unsupported {
                    node: w.name.clone(),
                    op: "constant".into(),
                    detail: format!("its data has {} bytes, its type {} {:?} needs {}", bytes.len(), w.dtype, w.shape, w.bytes),
                });
            }
            blob[w.offset..w.offset + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(blob)
    }

    /// Executes the program on the CPU as a device would: one byte arena of
    /// [`Program::arena`] bytes and the weights blob, each step's kernel
    /// description reading its operands at their offsets and writing its
    /// output at its offset. Views, in-place writes and in-place
    /// concatenations happen through the offsets alone, so this checks the
    /// memory plan and the lowering together with the kernels.
    pub fn run_cpu(&self, weights: &[u8], inputs: &[Tensor]) -> Result<Vec<Tensor>, CodegenError> {
        let bad = |what: String| CodegenError::Unsupported { node: "program".into(), op: "run".into(), detail: what };
        if inputs.len() != self.inputs.len() || weights.len() != self.weights_bytes {
            return Err(bad(format!(
                "{} inputs and {} weight bytes given, {} and {} expected",
                inputs.len(),
                weights.len(),
                self.inputs.len(),
                self.weights_bytes
            )));
        }
        let mut arena = vec![0u8; self.arena];
        // Updates write the parameters and their state: a copy of the blob, made on the first write.
        let mut weights = std::borrow::Cow::Borrowed(weights);
        for (io, t) in self.inputs.iter().zip(inputs) {
            let b = t.data().to_le_bytes();
            if b.len() != io.bytes {
                return Err(bad(format!("input {} has {} bytes, {} expected", io.name, b.len(), io.bytes)));
            }
            arena[io.offset..io.offset + io.bytes].copy_from_slice(&b);
        }
        for s in &self.steps {
            let written = s.kernel.written();
            let ins = if written.is_empty() { &s.args[..s.args.len() - 1] } else { &s.args[..] };
            let ts: Vec<Tensor> = ins
                .iter()
                .map(|a| {
                    let mem = if a.space == Space::Arena { &arena[..] } else { &weights[..] };
                    Tensor::from_le_bytes(&a.ty, &mem[a.offset..a.offset + a.bytes]).expect("sizes match the type")
                })
                .collect();
            let ys = s.kernel.run_in_place(&ts.iter().collect::<Vec<_>>());
            let targets: Vec<&Arg> =
                if written.is_empty() { vec![s.args.last().expect("an output")] } else { written.iter().map(|&i| &s.args[i]).collect() };
            for (a, y) in targets.into_iter().zip(ys) {
                let mem = if a.space == Space::Arena { &mut arena[..] } else { &mut weights.to_mut()[..] };
                mem[a.offset..a.offset + a.bytes].copy_from_slice(&y.data().to_le_bytes());
            }
        }
        let read = |io: &Io, ty: &TensorType| {
            let mem = if io.space == Space::Arena { &arena[..] } else { &weights[..] };
            Tensor::from_le_bytes(ty, &mem[io.offset..io.offset + io.bytes]).expect("sizes match")
        };
        Ok(self.outputs.iter().zip(&self.output_types).map(|(io, ty)| read(io, ty)).collect())
    }

    /// The distinct kernels, by name, in first-use order: `(name, source)`.
    pub fn sources(&self) -> Vec<(String, String)> {
        let mut seen = std::collections::HashSet::new();
        self.steps
            .iter()
            .filter(|s| seen.insert(s.kernel.name().to_string()))
            .map(|s| (s.kernel.name().to_string(), s.kernel.cuda()))
            .collect()
    }
}

/// Chooses which activations a program keeps channels-last: the output of
/// a tensor-core conv whose every reader is a tensor-core conv reading it
/// as x (with weights of its own, read directly by nothing else, which the
/// blob then holds permuted) or as the residual of an output kept
/// channels-last too, and whose own residual, if any, is kept channels-last;
/// never a graph output. So a channels-last activation
/// never meets a kernel that reads NCHW, and no transpose runs: the convs at
/// a segment's ends convert as they read or write. Sets the convs' layouts;
/// returns the channels-last activations' nodes and the permuted weights'.
fn choose_layouts(g: &KernelGraph, kernels: &mut [(NodeId, Kernel)]) -> (HashSet<NodeId>, HashSet<NodeId>) {
    let at: HashMap<NodeId, usize> = kernels.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    let tc = |id: NodeId| {
        at.get(&id).and_then(|&i| match &kernels[i].1 {
            Kernel::Conv(c) if c.tensor_cores() => Some(c.residual),
            _ => None,
        })
    };
    let mut readers: HashMap<NodeId, usize> = HashMap::new();
    for (id, _) in kernels.iter() {
        for v in g.inputs_of(*id) {
            *readers.entry(weight_root(g, v).unwrap_or(v).node).or_default() += 1;
        }
    }
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| weight_root(g, *v).unwrap_or(*v).node).collect();
    // Weights a conv may have permuted: a constant it alone reads, directly.
    let own_weights = |id: NodeId| {
        let w = g.inputs_of(id)[1];
        matches!(g.node(w.node).op.semantic(), Some(smelt_ir::Op::Constant))
            && readers.get(&w.node) == Some(&1)
            && !outputs.contains(&w.node)
    };
    let mut nhwc: HashSet<NodeId> = kernels
        .iter()
        .map(|(id, _)| *id)
        .filter(|&id| tc(id).is_some() && g.node(id).outputs.len() == 1 && !outputs.contains(&id))
        .collect();
    loop {
        let keep = |id: NodeId| {
            g.users_of(id).into_iter().all(|u| {
                let Some(residual) = tc(u) else { return false };
                let ins = g.inputs_of(u);
                ins.iter()
                    .enumerate()
                    .filter(|(_, v)| v.node == id)
                    .all(|(i, _)| (i == 0 && own_weights(u)) || (residual && i == ins.len() - 1 && nhwc.contains(&u)))
            })
        };
        // A residual is read in the layout the output is written: a conv
        // writing channels-last needs its residual written so too.
        let residual_fits =
            |id: NodeId| tc(id) != Some(true) || g.inputs_of(id).last().is_some_and(|r| r.slot == 0 && nhwc.contains(&r.node));
        let drop: Vec<NodeId> = nhwc.iter().copied().filter(|&id| !keep(id) || !residual_fits(id)).collect();
        if drop.is_empty() {
            break;
        }
        for id in drop {
            nhwc.remove(&id);
        }
    }
    let mut permuted = HashSet::new();
    for (id, k) in kernels.iter_mut() {
        if let Kernel::Conv(c) = k {
            let x = g.inputs_of(*id)[0].node;
            let (x_nhwc, out_nhwc) = (nhwc.contains(&x), nhwc.contains(id));
            if x_nhwc || out_nhwc {
                *c = c.clone().channels_last(x_nhwc, out_nhwc);
            }
            if x_nhwc {
                permuted.insert(g.inputs_of(*id)[1].node);
            }
        }
    }
    (nhwc, permuted)
}

/// The little-endian bytes of a `[M, C, ...]` tensor permuted to
/// `[M, ..., C]` (conv weights for a channels-last x).
fn channels_last_bytes(bytes: &[u8], shape: &[usize]) -> Vec<u8> {
    let numel: usize = shape.iter().product();
    if numel == 0 || shape.len() < 3 {
        return bytes.to_vec();
    }
    let elt = bytes.len() / numel;
    let (m, c, taps) = (shape[0], shape[1], numel / (shape[0] * shape[1]));
    let mut out = vec![0u8; bytes.len()];
    for o in 0..m {
        for ci in 0..c {
            for t in 0..taps {
                let (src, dst) = (((o * c + ci) * taps + t) * elt, ((o * taps + t) * c + ci) * elt);
                out[dst..dst + elt].copy_from_slice(&bytes[src..src + elt]);
            }
        }
    }
    out
}

/// `f` of every item on `threads` threads (at least one), each taking the
/// next item left; results in input order.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> = items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                *results[i].lock().expect("no panics while holding the lock") = Some(r);
            });
        }
    });
    results.into_iter().map(|m| m.into_inner().expect("no panics while holding the lock").expect("every item was mapped")).collect()
}

/// Compiles `(name, source)` pairs on `threads` threads (at least one),
/// calling `progress(name)` after each. Results are in input order; the
/// first failure is returned.
pub fn compile_all(
    compiler: &Compiler,
    kernels: &[(String, String)],
    threads: usize,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Compiled>, CodegenError> {
    parallel_map(kernels, threads, |(name, src)| {
        let r = compiler.compile(name, src);
        progress(name);
        r
    })
    .into_iter()
    .collect()
}
