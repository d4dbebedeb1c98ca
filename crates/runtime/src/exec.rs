//! The launch path of a compiled [`Program`], written once for every
//! device: the CUDA executor ([`crate::cuda::CudaDevice`]) and the emulator
//! ([`crate::emu::Emulator`]) implement [`Device`], and [`Executor`] does
//! the rest. So the code a GPU runs (the arena and weights allocations,
//! pointers as `base + offset`, parameters packed in the kernel's order as
//! 8-byte values, launch sizes, input and output copies) is the code CI
//! runs on the emulator.

use crate::RuntimeError;
use smelt_codegen::program::{Arg, Program, Space, Step};
use smelt_ir::{DType, KernelGraph, OpSet, Tensor, TensorType};

/// What a device must do to run a program.
pub trait Device {
    /// A loaded kernel.
    type Function: Clone;
    /// A point in the device's timeline (an event on a GPU, an instant on the CPU).
    type Mark;

    /// What the device is, for reports.
    fn info(&self) -> DeviceInfo;
    /// The kernel called `name` (compiled beforehand).
    fn function(&mut self, name: &str) -> Result<Self::Function, RuntimeError>;
    /// Allocates the arena (zeroed) and uploads the weights; returns the
    /// device addresses of both (the arena's aligned to [`ARENA_ALIGN`]).
    fn alloc(&mut self, arena: usize, weights: &[u8]) -> Result<(u64, u64), RuntimeError>;
    /// Copies `bytes` to the arena or the weights at `offset`.
    fn write(&mut self, space: Space, offset: usize, bytes: &[u8]) -> Result<(), RuntimeError>;
    /// Copies the arena's or the weights' bytes at `offset` into `out`
    /// (waiting for the launches before it).
    fn read(&mut self, space: Space, offset: usize, out: &mut [u8]) -> Result<(), RuntimeError>;
    /// Launches `f` for `step` with `params`: one 8-byte value per kernel
    /// parameter, in order (device addresses, then the count if any).
    fn launch(&mut self, f: &Self::Function, step: &Step, grid: [u32; 3], block: [u32; 3], params: &[u64]) -> Result<(), RuntimeError>;
    /// Records a point in the timeline.
    fn mark(&mut self) -> Result<Self::Mark, RuntimeError>;
    /// Milliseconds between two marks (waiting for the second).
    fn elapsed_ms(&mut self, from: &Self::Mark, to: &Self::Mark) -> Result<f64, RuntimeError>;
    /// Waits for everything launched and reports a fault, if any.
    fn finish(&mut self) -> Result<(), RuntimeError>;
}

/// The clock of a device that runs on the host (the CPU runs and the
/// emulator): wall time between marks, each launch having finished when it
/// returns.
pub(crate) struct HostClock;

impl HostClock {
    /// Now.
    pub(crate) fn mark() -> std::time::Instant {
        std::time::Instant::now()
    }

    /// Milliseconds from `from` to `to`.
    pub(crate) fn elapsed_ms(from: &std::time::Instant, to: &std::time::Instant) -> f64 {
        to.duration_since(*from).as_secs_f64() * 1e3
    }
}

/// The alignment every device address of the arena and the weights has (the
/// planner's offsets are multiples of the plan's alignment, so every
/// argument is aligned for vector access).
pub const ARENA_ALIGN: u64 = 256;

/// The device's name, memory and compute capability.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    /// e.g. `NVIDIA H200`, or `emulator (g++)`.
    pub name: String,
    /// Total device memory in bytes (0 where not meaningful).
    pub total_bytes: usize,
    /// Free device memory in bytes when the executor was created.
    pub free_bytes: usize,
    /// (major, minor); (0, 0) for the emulator.
    pub compute_capability: (i32, i32),
}

/// One kernel's time in a profiled run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelTime {
    /// The node it computes.
    pub node: String,
    /// The kernel.
    pub kernel: String,
    /// Milliseconds.
    pub ms: f64,
    /// Bytes its arguments span (each read or written once): a lower bound
    /// on its memory traffic.
    pub bytes: usize,
    /// Floating-point operations.
    pub flops: usize,
}

/// What a kernel's output is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Against {
    /// Its description's CPU run ([`smelt_codegen::kernel::Kernel::run_in_place`]).
    Description,
    /// The reference executor running the kernel graph's op of its node
    /// ([`crate::cpu::eval_node`]), operands and output converted from
    /// the layouts memory holds them in by code of its own.
    Reference,
}

/// One kernel's output against its description's CPU run, or against the
/// reference executor, on the same operands (from [`Executor::run_checked`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelCheck {
    /// The node it computes.
    pub node: String,
    /// The kernel.
    pub kernel: String,
    /// What it was checked against.
    pub against: Against,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// Largest absolute difference over the largest |expected| element.
    pub of_range: f64,
    /// Elements outside the tolerance.
    pub mismatches: usize,
    /// Whether it is within the tolerance.
    pub ok: bool,
}

struct Launch<F> {
    func: F,
    grid: [u32; 3],
    block: [u32; 3],
}

/// A program loaded on a device.
pub struct Executor<D: Device> {
    device: D,
    program: Program,
    launches: Vec<Launch<D::Function>>,
    bases: (u64, u64),
    /// The kernel graph the program was built from, for
    /// [`Executor::check_against_reference`].
    reference: Option<KernelGraph>,
    /// Whether [`Executor::run`] looks for the first kernel that makes inf
    /// or NaN of finite operands ([`Executor::check_finite`]).
    check_finite: bool,
    /// What the last such run found.
    non_finite: Option<NonFinite>,
}

/// The first kernel of a run whose output held inf or NaN although its
/// operands were finite: where a half activation overflowed (f16's largest
/// value is 65504), or where a value left f32's range.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NonFinite {
    /// The node it computes.
    pub node: String,
    /// The kernel.
    pub kernel: String,
    /// Its output's type.
    pub ty: String,
    /// Elements that are infinite.
    pub inf: usize,
    /// Elements that are NaN.
    pub nan: usize,
}

impl<D: Device> Executor<D> {
    /// Loads `program` with its weights blob on `device`. With
    /// `memory_limit` (on activation memory, as `smelt plan
    /// --memory-limit`), refuses before allocating anything when the arena
    /// exceeds it.
    pub fn new(mut device: D, program: Program, weights: &[u8], memory_limit: Option<usize>) -> Result<Executor<D>, RuntimeError> {
        if let Some(limit) = memory_limit {
            if program.arena > limit {
                return Err(RuntimeError::MemoryLimit { need: program.arena, limit });
            }
        }
        if weights.len() != program.weights_bytes {
            return Err(RuntimeError::Program(format!(
                "weights blob of {} bytes, the program needs {}",
                weights.len(),
                program.weights_bytes
            )));
        }
        let mut launches = Vec::with_capacity(program.steps.len());
        let mut loaded: std::collections::HashMap<String, D::Function> = std::collections::HashMap::new();
        for s in &program.steps {
            let name = s.kernel.name().to_string();
            let func = match loaded.get(&name) {
                Some(f) => f.clone(),
                None => {
                    let f = device.function(&name)?;
                    loaded.insert(name.clone(), f.clone());
                    f
                }
            };
            let dim = |v: [usize; 3], what: &str| -> Result<[u32; 3], RuntimeError> {
                let c = |x: usize| u32::try_from(x).map_err(|_| RuntimeError::Program(format!("kernel {name}: {what} {v:?} too large")));
                Ok([c(v[0])?, c(v[1])?, c(v[2])?])
            };
            let (grid, block) = (dim(s.launch.grid, "grid")?, dim(s.launch.block, "block")?);
            // CUDA's limits, checked on every device so that the emulator
            // refuses what a GPU would.
            let threads = block.iter().map(|&b| b as u64).product::<u64>();
            if grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 || block[2] > 64 || threads > 1024 || threads == 0 {
                return Err(RuntimeError::Program(format!("kernel {name}: grid {grid:?} and block {block:?} exceed CUDA's limits")));
            }
            launches.push(Launch { func, grid, block });
        }
        let bases = device.alloc(program.arena, weights)?;
        if bases.0 % ARENA_ALIGN != 0 || (!weights.is_empty() && bases.1 % ARENA_ALIGN != 0) {
            return Err(RuntimeError::Program(format!(
                "the device placed the arena at {:#x} and the weights at {:#x}: not aligned to {ARENA_ALIGN} bytes",
                bases.0, bases.1
            )));
        }
        Ok(Executor { device, program, launches, bases, reference: None, check_finite: false, non_finite: None })
    }

    /// Makes [`Executor::run_checked`] also check every kernel against the
    /// reference executor running its node of `g`, the kernel graph the
    /// program was built from, within [`reference_rtol`]: an oracle that
    /// shares nothing with the kernel's description (neither its
    /// arithmetic nor its reading of layouts).
    pub fn check_against_reference(&mut self, g: KernelGraph) -> Result<(), RuntimeError> {
        for s in &self.program.steps {
            if !g.contains(s.id) || g.node(s.id).name != s.node {
                return Err(RuntimeError::Program(format!(
                    "kernel {} computes node {}, which the reference graph does not hold",
                    s.kernel.name(),
                    s.node
                )));
            }
        }
        self.reference = Some(g);
        Ok(())
    }

    /// Makes [`Executor::run`] read every kernel's output back and find the
    /// first that holds inf or NaN made of finite operands (a copy of each
    /// output per launch: cheap on the emulator, a slowdown on a GPU);
    /// [`Executor::non_finite`] says what the last run found.
    pub fn check_finite(&mut self, on: bool) {
        self.check_finite = on;
    }

    /// What the last [`Executor::run`] with [`Executor::check_finite`] found.
    pub fn non_finite(&self) -> Option<&NonFinite> {
        self.non_finite.as_ref()
    }

    /// Whether step `i`'s output holds inf or NaN made of finite operands.
    fn overflowed(&mut self, i: usize) -> Result<Option<NonFinite>, RuntimeError> {
        let s = &self.program.steps[i];
        let (ins, outs) = operands_and_written(s)?;
        let mut found = None;
        for out in &outs {
            if !out.ty.dtype.is_float() {
                continue;
            }
            let mut bytes = vec![0u8; out.bytes];
            self.device.read(out.space.clone(), out.offset, &mut bytes)?;
            let v = tensor(&out.ty, &bytes)?.to_f32_vec();
            let (inf, nan) = (v.iter().filter(|x| x.is_infinite()).count(), v.iter().filter(|x| x.is_nan()).count());
            if inf + nan > 0 {
                found = Some(NonFinite { node: s.node.clone(), kernel: s.kernel.name().to_string(), ty: out.ty.to_string(), inf, nan });
                break;
            }
        }
        let Some(found) = found else { return Ok(None) };
        // Operands written in place hold the output now: not judged.
        let in_place = |a: &Arg| outs.iter().any(|o| o.space == a.space && o.offset == a.offset);
        for a in ins.iter().filter(|a| a.ty.dtype.is_float() && !in_place(a)) {
            let mut bytes = vec![0u8; a.bytes];
            self.device.read(a.space.clone(), a.offset, &mut bytes)?;
            if tensor(&a.ty, &bytes)?.to_f32_vec().iter().any(|x| !x.is_finite()) {
                return Ok(None); // carried in, not made here
            }
        }
        Ok(Some(found))
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, to configure it between runs.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The program it runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Bytes this executor allocated on the device (arena plus weights).
    pub fn device_bytes(&self) -> usize {
        self.program.arena.max(1) + self.program.weights_bytes
    }

    /// The 8-byte parameters of step `i`: `base + offset` per pointer, then the count.
    fn params(&self, i: usize) -> Vec<u64> {
        let s = &self.program.steps[i];
        let base = |space: &Space| if *space == Space::Arena { self.bases.0 } else { self.bases.1 };
        s.args.iter().map(|a| base(&a.space) + a.offset as u64).chain(s.launch.count.map(|c| c as u64)).collect()
    }

    fn load_inputs(&mut self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        let p = &self.program;
        if inputs.len() != p.inputs.len() {
            return Err(RuntimeError::Input {
                index: inputs.len(),
                name: String::new(),
                msg: format!("{} inputs given, {} expected", inputs.len(), p.inputs.len()),
            });
        }
        for (i, (io, t)) in p.inputs.iter().zip(inputs).enumerate() {
            let bytes = t.data().to_le_bytes();
            if bytes.len() != io.bytes || t.ty().to_string() != io.ty {
                return Err(RuntimeError::Input { index: i, name: io.name.clone(), msg: format!("got {}, expected {}", t.ty(), io.ty) });
            }
            self.device.write(Space::Arena, io.offset, &bytes)?;
        }
        Ok(())
    }

    fn outputs(&mut self) -> Result<Vec<Tensor>, RuntimeError> {
        let mut outs = Vec::with_capacity(self.program.outputs.len());
        for i in 0..self.program.outputs.len() {
            let (io, ty) = (&self.program.outputs[i], &self.program.output_types[i]);
            let mut host = vec![0u8; io.bytes];
            self.device.read(io.space.clone(), io.offset, &mut host)?;
            outs.push(tensor(ty, &host)?);
        }
        Ok(outs)
    }

    fn launch(&mut self, i: usize) -> Result<(), RuntimeError> {
        let l = &self.launches[i];
        if l.grid.contains(&0) {
            return Ok(()); // an empty tensor: nothing to do (CUDA refuses an empty grid)
        }
        let params = self.params(i);
        let l = &self.launches[i];
        self.device.launch(&l.func, &self.program.steps[i], l.grid, l.block, &params)
    }

    /// Runs once: inputs in, every kernel, outputs out. With `profile`, each
    /// launch is timed (which adds a little overhead between kernels); the
    /// total is always timed, in milliseconds. With
    /// [`Executor::check_finite`], each output is checked after its launch.
    pub fn run(&mut self, inputs: &[Tensor], profile: bool) -> Result<(Vec<Tensor>, f64, Vec<KernelTime>), RuntimeError> {
        self.load_inputs(inputs)?;
        self.non_finite = None;
        let start = self.device.mark()?;
        let mut times = Vec::new();
        for i in 0..self.launches.len() {
            let before = if profile { Some(self.device.mark()?) } else { None };
            self.launch(i)?;
            if self.check_finite && self.non_finite.is_none() {
                self.non_finite = self.overflowed(i)?;
            }
            if let Some(before) = before {
                let after = self.device.mark()?;
                let ms = self.device.elapsed_ms(&before, &after)?;
                let s = &self.program.steps[i];
                times.push(KernelTime {
                    node: s.node.clone(),
                    kernel: s.kernel.name().to_string(),
                    ms,
                    bytes: s.args.iter().map(|a| a.bytes).sum(),
                    flops: s.kernel.flops(),
                });
            }
        }
        let end = self.device.mark()?;
        let total_ms = self.device.elapsed_ms(&start, &end)?;
        let outs = self.outputs()?;
        self.device.finish()?;
        Ok((outs, total_ms, times))
    }

    /// Runs once, launching every kernel without timing them, and reads
    /// back only the outputs listed (by index): a training step reads its
    /// loss, not the parameters its updates wrote in place.
    pub fn run_reading(&mut self, inputs: &[Tensor], outputs: &[usize]) -> Result<Vec<Tensor>, RuntimeError> {
        self.load_inputs(inputs)?;
        for i in 0..self.launches.len() {
            self.launch(i)?;
        }
        let mut outs = Vec::with_capacity(outputs.len());
        for &i in outputs {
            let (io, ty) = self
                .program
                .outputs
                .get(i)
                .zip(self.program.output_types.get(i))
                .ok_or_else(|| RuntimeError::Program(format!("the program has no output {i}")))?;
            let mut host = vec![0u8; io.bytes];
            self.device.read(io.space.clone(), io.offset, &mut host)?;
            outs.push(tensor(ty, &host)?);
        }
        self.device.finish()?;
        Ok(outs)
    }

    /// As [`Executor::run_reading`], for a loss-scaled training step: the
    /// optimizer's updates ([`smelt_codegen::kernel::Kernel::is_optimizer_step`])
    /// run only when output `guard` (a bool, read back once before the first
    /// of them) is true. Returns the outputs and whether the updates ran.
    pub fn run_guarded(&mut self, inputs: &[Tensor], outputs: &[usize], guard: usize) -> Result<(Vec<Tensor>, bool), RuntimeError> {
        let io =
            self.program.outputs.get(guard).cloned().ok_or_else(|| RuntimeError::Program(format!("the program has no output {guard}")))?;
        if io.bytes != 1 || io.space != Space::Arena {
            return Err(RuntimeError::Program(format!("output {} ({}) is not a flag in the arena", io.name, io.ty)));
        }
        self.load_inputs(inputs)?;
        let mut apply = None;
        for i in 0..self.launches.len() {
            if self.program.steps[i].kernel.is_optimizer_step() {
                let ok = match apply {
                    Some(ok) => ok,
                    None => {
                        let mut flag = [0u8];
                        self.device.read(Space::Arena, io.offset, &mut flag)?;
                        *apply.insert(flag[0] != 0)
                    }
                };
                if !ok {
                    continue;
                }
            }
            self.launch(i)?;
        }
        let mut outs = Vec::with_capacity(outputs.len());
        for &i in outputs {
            let (o, ty) = (&self.program.outputs[i], &self.program.output_types[i]);
            let mut host = vec![0u8; o.bytes];
            self.device.read(o.space.clone(), o.offset, &mut host)?;
            outs.push(tensor(ty, &host)?);
        }
        self.device.finish()?;
        Ok((outs, apply.unwrap_or(true)))
    }

    /// Writes the persistent value `name` (a weight slot of the program):
    /// the host's state that kernels read, such as the loss scale.
    pub fn write_weight(&mut self, name: &str, value: &Tensor) -> Result<(), RuntimeError> {
        let slot =
            self.program.weights.iter().find(|w| w.name == name).ok_or_else(|| RuntimeError::Program(format!("no weight {name}")))?;
        let bytes = value.data().to_le_bytes();
        if bytes.len() != slot.bytes {
            return Err(RuntimeError::Program(format!("{name} holds {} bytes, not {}", slot.bytes, bytes.len())));
        }
        let offset = slot.offset;
        self.device.write(Space::Weights, offset, &bytes)
    }

    /// The weights blob as it is now on the device (optimizer updates write
    /// it in place), laid out as [`Program::weights`] says.
    pub fn read_weights(&mut self) -> Result<Vec<u8>, RuntimeError> {
        let mut blob = vec![0u8; self.program.weights_bytes];
        self.device.read(Space::Weights, 0, &mut blob)?;
        self.device.finish()?;
        Ok(blob)
    }

    /// Runs once and checks every kernel against its description: before
    /// each launch its operands are read back from the device, and after it
    /// its output is compared with [`smelt_codegen::kernel::Kernel::run_cpu`]
    /// on those operands, within `rtol` of the output's range (plus one
    /// unit in the last place for half outputs). Errors do not compound: each
    /// kernel is judged on what it was given.
    pub fn run_checked(&mut self, inputs: &[Tensor], rtol: f64) -> Result<(Vec<Tensor>, Vec<KernelCheck>), RuntimeError> {
        self.load_inputs(inputs)?;
        let mut checks = Vec::with_capacity(self.launches.len());
        for i in 0..self.launches.len() {
            let s = self.program.steps[i].clone();
            // What the kernel writes: its output, or operands in place (an update).
            let (ins, outs) = operands_and_written(&s)?;
            let mut operands = Vec::with_capacity(ins.len());
            for a in ins {
                let mut bytes = vec![0u8; a.bytes];
                self.device.read(a.space.clone(), a.offset, &mut bytes)?;
                operands.push(tensor(&a.ty, &bytes)?);
            }
            self.launch(i)?;
            let wants = s.kernel.run_in_place(&operands.iter().collect::<Vec<_>>());
            let mut got = Vec::with_capacity(outs.len());
            for out in &outs {
                let mut bytes = vec![0u8; out.bytes];
                self.device.read(out.space.clone(), out.offset, &mut bytes)?;
                got.push(tensor(&out.ty, &bytes)?);
            }
            let worst = |c: Vec<KernelCheck>| {
                c.into_iter()
                    .max_by(|a, b| (a.mismatches, a.of_range).partial_cmp(&(b.mismatches, b.of_range)).unwrap_or(std::cmp::Ordering::Equal))
                    .ok_or_else(|| RuntimeError::Program(format!("kernel {} writes nothing", s.kernel.name())))
            };
            let described = got.iter().zip(&wants).map(|(g, w)| check(&s, Against::Description, g, w, |_| rtol)).collect();
            checks.push(worst(described)?);
            if let Some(g) = &self.reference {
                checks.push(worst(against_reference(g, &s, ins, &operands, &outs, &got)?)?);
            }
        }
        let outs = self.outputs()?;
        self.device.finish()?;
        Ok((outs, checks))
    }
}

/// What step `s` reads (every argument but its output; an update's, all of
/// them) and what it writes (its output, or the operands it updates).
fn operands_and_written(s: &Step) -> Result<(&[Arg], Vec<&Arg>), RuntimeError> {
    let written = s.kernel.written();
    if written.is_empty() {
        let (out, ins) = s.args.split_last().ok_or_else(|| RuntimeError::Program(format!("kernel {} has no output", s.kernel.name())))?;
        Ok((ins, vec![out]))
    } else {
        Ok((&s.args[..], written.iter().map(|&w| &s.args[w]).collect()))
    }
}

/// The tolerance of a kernel against the reference executor, relative to
/// the range of its output of type `dtype` (plus one unit in the last place
/// of a half output): sums in another order, fused f32 intermediates the
/// reference rounds to half between ops, and the device's own `expf`.
pub fn reference_rtol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        _ => 1e-4,
    }
}

/// Step `s`'s outputs `got` (written to `outs`) against the reference
/// executor running its node of `g` on `operands` (read from `ins`), each
/// converted from channels-last where memory holds it so
/// ([`Arg::channels_last`]).
fn against_reference(
    g: &KernelGraph,
    s: &Step,
    ins: &[Arg],
    operands: &[Tensor],
    outs: &[&Arg],
    got: &[Tensor],
) -> Result<Vec<KernelCheck>, RuntimeError> {
    let node = g.node(s.id);
    let wrong = |what: String| RuntimeError::Program(format!("kernel {} (node {}): {what}", s.kernel.name(), s.node));
    let values = g.inputs_of(s.id);
    if values.len() != ins.len() {
        return Err(wrong(format!("{} operands, the node has {}", ins.len(), values.len())));
    }
    let mut args = Vec::with_capacity(ins.len());
    for ((a, t), v) in ins.iter().zip(operands).zip(&values) {
        let t = if a.channels_last { channels_first(t) } else { t.clone() };
        if t.ty() != g.ty(*v) {
            return Err(wrong(format!("operand {} is {} in memory, the node reads {}", a.param, t.ty(), g.ty(*v))));
        }
        args.push(std::sync::Arc::new(t));
    }
    let wants = crate::cpu::eval_node(g, s.id, args)?;
    // Which of the node's outputs each written argument holds.
    let written = s.kernel.written();
    let slots: Vec<usize> = if written.is_empty() {
        vec![0]
    } else {
        (0..node.outputs.len())
            .map(|slot| node.op.semantic().and_then(|op| op.updated_operand(slot)).and_then(|i| written.iter().position(|&w| w == i)))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| wrong("writes operands its node does not update".into()))?
    };
    let mut checks = Vec::new();
    for (slot, &k) in slots.iter().enumerate() {
        let (a, t) = (outs[k], &got[k]);
        let t = if a.channels_last { channels_first(t) } else { t.clone() };
        checks.push(check(s, Against::Reference, &t, &wants[slot], reference_rtol));
    }
    Ok(checks)
}

/// `t`, held channels-last (`[N, ..., C]`, or conv weights `[M, ..., C]`),
/// as the graph types it (`[N, C, ...]`): the last axis moved to the
/// second. Its own index arithmetic, not the kernels'.
fn channels_first(t: &Tensor) -> Tensor {
    let shape = t.shape();
    if shape.len() < 3 {
        return t.clone();
    }
    let (n, c) = (shape[0], shape[shape.len() - 1]);
    let inner: usize = shape[1..shape.len() - 1].iter().product();
    let v = t.to_f32_vec();
    let mut out = vec![0f32; v.len()];
    for b in 0..n {
        for i in 0..inner {
            for ch in 0..c {
                out[(b * c + ch) * inner + i] = v[(b * inner + i) * c + ch];
            }
        }
    }
    let mut to = vec![n, c];
    to.extend_from_slice(&shape[1..shape.len() - 1]);
    Tensor::from_f32(to, out).cast(t.ty().dtype)
}

/// `got` against `want`: within `rtol` (of the output's dtype) of the
/// largest |want|, plus one unit in the last place of a half output.
fn check(s: &Step, against: Against, got: &Tensor, want: &Tensor, rtol: impl Fn(DType) -> f64) -> KernelCheck {
    let rtol = rtol(got.ty().dtype);
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let range = w.iter().fold(0f64, |m, x| m.max((*x as f64).abs()));
    let ulp = |x: f64| match got.ty().dtype {
        DType::F16 => (x.abs().max(6.1e-5)).log2().floor().exp2() * 2f64.powi(-10),
        DType::BF16 => (x.abs().max(1.2e-38)).log2().floor().exp2() * 2f64.powi(-7),
        _ => 0.0,
    };
    let (mut max_abs, mut mismatches) = (0f64, 0);
    for (a, b) in g.iter().zip(&w) {
        let (a, b) = (*a as f64, *b as f64);
        let d = if a.is_nan() && b.is_nan() { 0.0 } else { (a - b).abs() };
        let d = if d.is_nan() { f64::INFINITY } else { d };
        max_abs = max_abs.max(d);
        if d > rtol * range + ulp(b) {
            mismatches += 1;
        }
    }
    let mismatches = mismatches + g.len().abs_diff(w.len());
    KernelCheck {
        node: s.node.clone(),
        kernel: s.kernel.name().to_string(),
        against,
        max_abs,
        of_range: if range > 0.0 { max_abs / range } else { max_abs },
        mismatches,
        ok: mismatches == 0,
    }
}

fn tensor(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, RuntimeError> {
    Tensor::from_le_bytes(ty, bytes).ok_or_else(|| RuntimeError::Program(format!("{} bytes are not a {ty}", bytes.len())))
}
