//! The CUDA executor: a compiled [`Program`] on one GPU through cudarc
//! (the driver library is loaded at run time, so this builds and links with
//! no CUDA toolkit and no GPU).
//!
//! One device allocation of exactly the planned arena holds every
//! activation, graph inputs and outputs included; the weights blob is a
//! second plain allocation, uploaded once. Each run copies the inputs to
//! their arena offsets, launches every kernel in schedule order on one
//! stream with pointers `arena base + offset` (or `weights base + offset`),
//! and copies the outputs back. Repeated runs reuse the modules, the arena
//! and the weights.

use crate::RuntimeError;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use smelt_codegen::program::{Program, Space};
use smelt_ir::{Tensor, TensorType};
use std::collections::HashMap;
use std::sync::Arc;

/// Why no GPU can be used, if none can: `None` when a CUDA device is
/// present. Never panics (cudarc panics when the driver library is missing,
/// so its presence is checked first).
pub fn unavailable() -> Option<String> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Some("no CUDA driver (libcuda.so.1 not found)".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver failed to initialise: {e}")),
    }
}

fn driver(what: &str) -> impl Fn(cudarc::driver::DriverError) -> RuntimeError + '_ {
    move |e| RuntimeError::Cuda(format!("{what}: {e}"))
}

/// The device's name, memory and compute capability.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    /// e.g. `NVIDIA H200`.
    pub name: String,
    /// Total device memory in bytes.
    pub total_bytes: usize,
    /// Free device memory in bytes when the executor was created.
    pub free_bytes: usize,
    /// (major, minor).
    pub compute_capability: (i32, i32),
}

/// One kernel's time in a profiled run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelTime {
    /// The node it computes.
    pub node: String,
    /// The kernel.
    pub kernel: String,
    /// Milliseconds, from CUDA events around the launch.
    pub ms: f64,
    /// Bytes its arguments span (each read or written once): a lower bound
    /// on its memory traffic.
    pub bytes: usize,
    /// Floating-point operations.
    pub flops: usize,
}

struct Launch {
    func: CudaFunction,
    cfg: LaunchConfig,
    args: Vec<(Space, usize)>,
    count: Option<u64>,
}

/// A program loaded on the GPU.
pub struct CudaExecutor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arena: CudaSlice<u8>,
    weights: Option<CudaSlice<u8>>,
    launches: Vec<Launch>,
    program: Program,
    /// The device.
    pub device: DeviceInfo,
}

impl CudaExecutor {
    /// Loads `program` on device 0: `ptx` maps each kernel name to its PTX,
    /// `weights` is the weights blob. With `memory_limit` (on activation
    /// memory, as `smelt plan --memory-limit`), refuses before allocating
    /// anything when the arena exceeds it.
    pub fn new(
        program: Program,
        ptx: &HashMap<String, String>,
        weights: &[u8],
        memory_limit: Option<usize>,
    ) -> Result<CudaExecutor, RuntimeError> {
        if let Some(limit) = memory_limit {
            if program.arena > limit {
                return Err(RuntimeError::MemoryLimit { need: program.arena, limit });
            }
        }
        let need = program.arena + program.weights_bytes;
        if weights.len() != program.weights_bytes {
            return Err(RuntimeError::Cuda(format!(
                "weights blob of {} bytes, the program needs {}",
                weights.len(),
                program.weights_bytes
            )));
        }
        if let Some(why) = unavailable() {
            return Err(RuntimeError::NoGpu(why));
        }
        let ctx = CudaContext::new(0).map_err(driver("creating the context"))?;
        // SAFETY: called before any allocation; this executor orders all
        // work on one stream itself.
        unsafe { ctx.disable_event_tracking() };
        let (free_bytes, total_bytes) = ctx.mem_get_info().map_err(driver("querying memory"))?;
        let device = DeviceInfo {
            name: ctx.name().map_err(driver("querying the device name"))?,
            total_bytes,
            free_bytes,
            compute_capability: ctx.compute_capability().map_err(driver("querying the compute capability"))?,
        };
        if need > free_bytes {
            return Err(RuntimeError::Cuda(format!("the program needs {need} bytes but the device has {free_bytes} free")));
        }
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let mut funcs: HashMap<String, CudaFunction> = HashMap::new();
        let mut launches = Vec::with_capacity(program.steps.len());
        for s in &program.steps {
            let name = s.kernel.name().to_string();
            if !funcs.contains_key(&name) {
                let src = ptx.get(&name).ok_or_else(|| RuntimeError::Cuda(format!("no PTX for kernel {name}")))?;
                let module = ctx
                    .load_module(cudarc::nvrtc::Ptx::from_src(src.clone()))
                    .map_err(|e| RuntimeError::Cuda(format!("loading the PTX of {name}: {e}")))?;
                let f = module.load_function(&name).map_err(|e| RuntimeError::Cuda(format!("kernel {name} in its PTX: {e}")))?;
                funcs.insert(name.clone(), f);
            }
            let dim = |v: [usize; 3], what: &str| -> Result<(u32, u32, u32), RuntimeError> {
                let c = |x: usize| u32::try_from(x).map_err(|_| RuntimeError::Cuda(format!("kernel {name}: {what} {v:?} too large")));
                Ok((c(v[0])?, c(v[1])?, c(v[2])?))
            };
            let cfg = LaunchConfig { grid_dim: dim(s.launch.grid, "grid")?, block_dim: dim(s.launch.block, "block")?, shared_mem_bytes: 0 };
            let args = s.args.iter().map(|a| (a.space.clone(), a.offset)).collect();
            launches.push(Launch { func: funcs[&name].clone(), cfg, args, count: s.launch.count.map(|c| c as u64) });
        }
        let arena = stream.alloc_zeros::<u8>(program.arena.max(1)).map_err(driver("allocating the arena"))?;
        let weights = if weights.is_empty() { None } else { Some(stream.clone_htod(weights).map_err(driver("uploading the weights"))?) };
        stream.synchronize().map_err(driver("uploading the weights"))?;
        Ok(CudaExecutor { ctx, stream, arena, weights, launches, program, device })
    }

    /// Bytes this executor allocated on the device (arena plus weights).
    pub fn device_bytes(&self) -> usize {
        self.program.arena.max(1) + self.program.weights_bytes
    }

    /// Runs once: inputs in, every kernel, outputs out. With `profile`,
    /// each launch is timed with CUDA events (which adds a little overhead
    /// between kernels); the total is always timed.
    pub fn run(&mut self, inputs: &[Tensor], profile: bool) -> Result<(Vec<Tensor>, f64, Vec<KernelTime>), RuntimeError> {
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
            let mut dst = self.arena.slice_mut(io.offset..io.offset + io.bytes);
            self.stream.memcpy_htod(&bytes, &mut dst).map_err(driver("copying an input"))?;
        }
        let (arena_base, _g1) = self.arena.device_ptr(&self.stream);
        let weights_base = self.weights.as_ref().map_or(0, |w| w.device_ptr(&self.stream).0);
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(timing).map_err(driver("recording an event"))?;
        let mut times = Vec::new();
        for (l, s) in self.launches.iter().zip(&p.steps) {
            let ptrs: Vec<u64> =
                l.args.iter().map(|(space, off)| if *space == Space::Arena { arena_base } else { weights_base } + *off as u64).collect();
            let before = if profile { Some(self.stream.record_event(timing).map_err(driver("recording an event"))?) } else { None };
            let mut b = self.stream.launch_builder(&l.func);
            for ptr in &ptrs {
                b.arg(ptr);
            }
            if let Some(c) = &l.count {
                b.arg(c);
            }
            // SAFETY: the arguments match the kernel's parameters (pointers
            // into the arena and the weights, which outlive the launch, then
            // the element count), as the code generator wrote them.
            unsafe { b.launch(l.cfg) }.map_err(|e| RuntimeError::Cuda(format!("launching {} (node {}): {e}", s.kernel.name(), s.node)))?;
            if let Some(before) = before {
                let after = self.stream.record_event(timing).map_err(driver("recording an event"))?;
                let ms = before
                    .elapsed_ms(&after)
                    .map_err(|e| RuntimeError::Cuda(format!("kernel {} (node {}): {e}", s.kernel.name(), s.node)))?;
                times.push(KernelTime {
                    node: s.node.clone(),
                    kernel: s.kernel.name().to_string(),
                    ms: ms as f64,
                    bytes: s.args.iter().map(|a| a.bytes).sum(),
                    flops: s.kernel.flops(),
                });
            }
        }
        let end = self.stream.record_event(timing).map_err(driver("recording an event"))?;
        let total_ms = start.elapsed_ms(&end).map_err(|e| RuntimeError::Cuda(format!("running the program: {e}")))? as f64;
        let mut outs = Vec::with_capacity(p.outputs.len());
        for (io, ty) in p.outputs.iter().zip(&p.output_types) {
            let mut host = vec![0u8; io.bytes];
            self.stream.memcpy_dtoh(&self.arena.slice(io.offset..io.offset + io.bytes), &mut host).map_err(driver("copying an output"))?;
            outs.push(tensor(ty, &host)?);
        }
        self.stream.synchronize().map_err(driver("finishing the run"))?;
        self.ctx.check_err().map_err(driver("after the run"))?;
        Ok((outs, total_ms, times))
    }
}

fn tensor(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, RuntimeError> {
    Tensor::from_le_bytes(ty, bytes).ok_or_else(|| RuntimeError::Cuda(format!("output of {} bytes is not a {ty}", bytes.len())))
}
