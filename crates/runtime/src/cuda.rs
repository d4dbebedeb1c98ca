//! The CUDA device: a compiled program on one GPU through cudarc (the
//! driver library is loaded at run time, so this builds and links with no
//! CUDA toolkit and no GPU). [`crate::exec::Executor`] drives it.
//!
//! One device allocation of exactly the planned arena holds every
//! activation, graph inputs and outputs included; the weights blob is a
//! second plain allocation, uploaded once. Kernels run in schedule order on
//! one stream. With `sync` (the debug switch `SMELT_CUDA_SYNC=1`, or `smelt
//! run --sync`), the stream is synchronised after every launch so that a
//! device fault names the kernel and node that caused it.

use crate::exec::{Device, DeviceInfo, Executor};
use crate::RuntimeError;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use smelt_codegen::program::{Program, Space, Step};
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

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Option<(i32, i32)> {
    let mut v = 0;
    // SAFETY: writes one int; the library is loaded by `unavailable` first.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some((v / 1000, v % 1000 / 10))
}

/// The PTX ISA version a PTX text declares (`.version 8.5`).
fn ptx_version(ptx: &str) -> &str {
    ptx.lines().find_map(|l| l.trim().strip_prefix(".version ")).unwrap_or("unknown")
}

/// GPU 0, with the PTX of every kernel the program will launch.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ptx: HashMap<String, String>,
    arena: Option<CudaSlice<u8>>,
    weights: Option<CudaSlice<u8>>,
    info: DeviceInfo,
    sync: bool,
}

impl CudaDevice {
    /// Opens device 0; `ptx` maps each kernel name to its PTX. With `sync`,
    /// every launch is followed by a synchronisation (see the module docs);
    /// `SMELT_CUDA_SYNC=1` turns it on too.
    pub fn new(ptx: HashMap<String, String>, sync: bool) -> Result<CudaDevice, RuntimeError> {
        if let Some(why) = unavailable() {
            return Err(RuntimeError::NoGpu(why));
        }
        let ctx = CudaContext::new(0).map_err(driver("creating the context"))?;
        // SAFETY: called before any allocation; the executor orders all
        // work on one stream itself.
        unsafe { ctx.disable_event_tracking() };
        let (free_bytes, total_bytes) = ctx.mem_get_info().map_err(driver("querying memory"))?;
        let info = DeviceInfo {
            name: ctx.name().map_err(driver("querying the device name"))?,
            total_bytes,
            free_bytes,
            compute_capability: ctx.compute_capability().map_err(driver("querying the compute capability"))?,
        };
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let sync = sync || std::env::var_os("SMELT_CUDA_SYNC").is_some_and(|v| v != "0");
        Ok(CudaDevice { ctx, stream, ptx, arena: None, weights: None, info, sync })
    }
}

impl Device for CudaDevice {
    type Function = CudaFunction;
    type Mark = CudaEvent;

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn function(&mut self, name: &str) -> Result<CudaFunction, RuntimeError> {
        let src = self.ptx.get(name).ok_or_else(|| RuntimeError::Cuda(format!("no PTX for kernel {name}")))?;
        let module = self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(src.clone())).map_err(|e| {
            let drv = driver_version().map_or("unknown".to_string(), |(a, b)| format!("{a}.{b}"));
            RuntimeError::Cuda(format!(
                "loading the PTX of {name} (PTX ISA {}, driver CUDA {drv}; PTX from a newer NVRTC than the driver does not load): {e}",
                ptx_version(src)
            ))
        })?;
        module.load_function(name).map_err(|e| RuntimeError::Cuda(format!("kernel {name} in its PTX: {e}")))
    }

    fn alloc(&mut self, arena: usize, weights: &[u8]) -> Result<(u64, u64), RuntimeError> {
        let need = arena + weights.len();
        if need > self.info.free_bytes {
            return Err(RuntimeError::Cuda(format!("the program needs {need} bytes but the device has {} free", self.info.free_bytes)));
        }
        let a = self.stream.alloc_zeros::<u8>(arena.max(1)).map_err(driver("allocating the arena"))?;
        let w = if weights.is_empty() { None } else { Some(self.stream.clone_htod(weights).map_err(driver("uploading the weights"))?) };
        self.stream.synchronize().map_err(driver("uploading the weights"))?;
        let base = a.device_ptr(&self.stream).0;
        let wbase = w.as_ref().map_or(0, |w| w.device_ptr(&self.stream).0);
        self.arena = Some(a);
        self.weights = w;
        Ok((base, wbase))
    }

    fn write(&mut self, space: Space, offset: usize, bytes: &[u8]) -> Result<(), RuntimeError> {
        let buffer = if space == Space::Arena { &mut self.arena } else { &mut self.weights };
        let buffer = buffer.as_mut().ok_or_else(|| RuntimeError::Program("write before alloc".into()))?;
        let mut dst = buffer.slice_mut(offset..offset + bytes.len());
        self.stream.memcpy_htod(bytes, &mut dst).map_err(driver("copying an input"))
    }

    fn read(&mut self, space: Space, offset: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let buffer = if space == Space::Arena { &self.arena } else { &self.weights };
        let buffer = buffer.as_ref().ok_or_else(|| RuntimeError::Program("read before alloc".into()))?;
        self.stream.memcpy_dtoh(&buffer.slice(offset..offset + out.len()), out).map_err(driver("copying an output"))?;
        self.stream.synchronize().map_err(driver("copying an output"))
    }

    fn launch(&mut self, f: &CudaFunction, step: &Step, grid: [u32; 3], block: [u32; 3], params: &[u64]) -> Result<(), RuntimeError> {
        let cfg = LaunchConfig { grid_dim: (grid[0], grid[1], grid[2]), block_dim: (block[0], block[1], block[2]), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(f);
        for p in params {
            b.arg(p);
        }
        let name = step.kernel.name();
        // SAFETY: one 8-byte value per kernel parameter, in the kernel's
        // order (device addresses into the arena and the weights, which
        // outlive the launch, then the count), as the code generator wrote
        // the signature.
        unsafe { b.launch(cfg) }.map_err(|e| RuntimeError::Cuda(format!("launching {name} (node {}): {e}", step.node)))?;
        if self.sync {
            self.stream
                .synchronize()
                .map_err(|e| RuntimeError::Cuda(format!("kernel {name} (node {}) failed on the device: {e}", step.node)))?;
        }
        Ok(())
    }

    fn mark(&mut self) -> Result<CudaEvent, RuntimeError> {
        self.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("recording an event"))
    }

    fn elapsed_ms(&mut self, from: &CudaEvent, to: &CudaEvent) -> Result<f64, RuntimeError> {
        from.elapsed_ms(to).map(f64::from).map_err(driver("timing kernels"))
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        self.stream.synchronize().map_err(driver("finishing the run"))?;
        self.ctx.check_err().map_err(driver("after the run"))
    }
}

/// A program on GPU 0.
pub type CudaExecutor = Executor<CudaDevice>;

/// Loads `program` on GPU 0 with its kernels' PTX and weights blob (see
/// [`Executor::new`] for `memory_limit`).
pub fn executor(
    program: Program,
    ptx: HashMap<String, String>,
    weights: &[u8],
    memory_limit: Option<usize>,
    sync: bool,
) -> Result<CudaExecutor, RuntimeError> {
    if let Some(limit) = memory_limit {
        if program.arena > limit {
            return Err(RuntimeError::MemoryLimit { need: program.arena, limit });
        }
    }
    Executor::new(CudaDevice::new(ptx, sync)?, program, weights, memory_limit)
}
