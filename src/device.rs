//! A compiled program loaded on a backend: the CPU (the kernels'
//! descriptions), the emulator (their CUDA C, compiled for the CPU) or
//! CUDA (GPU 0, its kernels compiled by NVRTC). `smelt train`, `smelt run`
//! and Python load programs here, so the choice of device lives in one place.

use crate::driver::Error;
use crate::train::{Backend, Progress};
use smelt_codegen::{nvrtc::Compiler, program::compile_all, Program};
use smelt_ir::Tensor;
use smelt_runtime::cuda::CudaExecutor;
use smelt_runtime::emu::EmuExecutor;
use smelt_runtime::exec::Executor;
use smelt_runtime::host::HostDevice;
use std::collections::HashMap;

/// A program on one of the backends.
pub enum Loaded {
    /// On the CPU, its kernels' descriptions.
    Cpu(Executor<HostDevice>),
    /// On the emulator.
    Emulator(EmuExecutor),
    /// On GPU 0.
    Cuda(CudaExecutor),
}

/// Loads `program` (its weights `blob`) on `backend`, reporting each
/// kernel compiled to `progress`. `memory_limit` and `sync` are CUDA's (a
/// device memory cap, a synchronization after every launch).
pub fn load(
    program: Program,
    blob: &[u8],
    backend: Backend,
    memory_limit: Option<usize>,
    sync: bool,
    progress: &dyn Progress,
) -> Result<Loaded, Error> {
    Ok(match backend {
        Backend::Cpu => Loaded::Cpu(Executor::new(HostDevice::new(), program, blob, None)?),
        Backend::Emulator => {
            progress.compiling(program.sources().len());
            Loaded::Emulator(smelt_runtime::emu::executor(program, blob, &|_| progress.compiled())?)
        }
        Backend::Cuda => {
            if let Some(why) = smelt_runtime::cuda::unavailable() {
                return Err(Error::Usage(format!("--backend cuda needs an NVIDIA GPU: {why}")));
            }
            let sources = program.sources();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            progress.compiling(sources.len());
            let kernels = compile_all(&Compiler::default(), &sources, threads, &|_| progress.compiled())?;
            let ptx: HashMap<String, String> = sources.iter().map(|(n, _)| n.clone()).zip(kernels.into_iter().map(|c| c.ptx)).collect();
            Loaded::Cuda(smelt_runtime::cuda::executor(program, ptx, blob, memory_limit, sync)?)
        }
    })
}

impl Loaded {
    /// One run of the program on `inputs`: its outputs.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        Ok(match self {
            Loaded::Cpu(e) => e.run(inputs, false)?.0,
            Loaded::Emulator(e) => e.run(inputs, false)?.0,
            Loaded::Cuda(e) => e.run(inputs, false)?.0,
        })
    }
}
