//! The host device: a compiled program's kernel descriptions run on the
//! CPU, from one arena of the planned size and the weights blob, through
//! the same [`Executor`](crate::exec::Executor) as a GPU and the emulator.
//! Each launch runs its kernel's description
//! ([`smelt_codegen::kernel::Kernel::run_in_place`]) on the operands at
//! their offsets and writes its output (or, for an optimizer update, its
//! operands) back at theirs: views, in-place writes and updates of the
//! persistent region happen through the offsets alone, as on a device.
//! This is `smelt train --backend cpu`: no compiler needed, and the
//! program's memory is exactly what a GPU would allocate.

use crate::exec::{Device, DeviceInfo};
use crate::RuntimeError;
use smelt_codegen::program::{Space, Step};
use smelt_ir::Tensor;
use std::time::Instant;

/// Where the host device says the arena and the weights start: fixed,
/// aligned addresses (nothing dereferences them; launches address
/// operands by their planned offsets).
const BASES: (u64, u64) = (1 << 40, 1 << 44);

/// Kernel descriptions run on the CPU.
#[derive(Default)]
pub struct HostDevice {
    arena: Vec<u8>,
    weights: Vec<u8>,
}

impl HostDevice {
    /// A device with nothing allocated.
    pub fn new() -> HostDevice {
        HostDevice::default()
    }

    fn space(&self, space: &Space) -> &[u8] {
        if *space == Space::Arena {
            &self.arena
        } else {
            &self.weights
        }
    }
}

/// A zeroed buffer of `n` bytes, refused (not aborted) when the host cannot give it.
fn zeroed(n: usize, what: &str) -> Result<Vec<u8>, RuntimeError> {
    crate::check_host_memory(what, n)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| RuntimeError::HostMemory { what: what.into(), need: n, available: 0 })?;
    v.resize(n, 0);
    Ok(v)
}

impl Device for HostDevice {
    type Function = ();
    type Mark = Instant;

    fn info(&self) -> DeviceInfo {
        DeviceInfo { name: "CPU (kernel descriptions)".into(), total_bytes: 0, free_bytes: 0, compute_capability: (0, 0) }
    }

    fn function(&mut self, _name: &str) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn alloc(&mut self, arena: usize, weights: &[u8]) -> Result<(u64, u64), RuntimeError> {
        self.arena = zeroed(arena, "the activation arena")?;
        self.weights = zeroed(weights.len(), "the weights")?;
        self.weights.copy_from_slice(weights);
        Ok(BASES)
    }

    fn write(&mut self, space: Space, offset: usize, bytes: &[u8]) -> Result<(), RuntimeError> {
        let mem = if space == Space::Arena { &mut self.arena } else { &mut self.weights };
        let end = offset.checked_add(bytes.len()).filter(|&e| e <= mem.len());
        let end =
            end.ok_or_else(|| RuntimeError::Program(format!("a write of {} bytes at {offset} leaves the {space:?} space", bytes.len())))?;
        mem[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    fn read(&mut self, space: Space, offset: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let mem = self.space(&space);
        let end = offset.checked_add(out.len()).filter(|&e| e <= mem.len());
        let end =
            end.ok_or_else(|| RuntimeError::Program(format!("a read of {} bytes at {offset} leaves the {space:?} space", out.len())))?;
        out.copy_from_slice(&mem[offset..end]);
        Ok(())
    }

    fn launch(&mut self, _: &(), step: &Step, _grid: [u32; 3], _block: [u32; 3], _params: &[u64]) -> Result<(), RuntimeError> {
        let fail = |msg: String| RuntimeError::Kernel { kernel: step.kernel.name().to_string(), node: step.node.clone(), msg };
        let written = step.kernel.written();
        let ins = if written.is_empty() { &step.args[..step.args.len().saturating_sub(1)] } else { &step.args[..] };
        let mut operands = Vec::with_capacity(ins.len());
        for a in ins {
            let mem = self.space(&a.space);
            let bytes = mem.get(a.offset..a.offset + a.bytes).ok_or_else(|| fail(format!("argument {} leaves its space", a.value)))?;
            operands.push(Tensor::from_le_bytes(&a.ty, bytes).ok_or_else(|| fail(format!("{} bytes are not a {}", a.bytes, a.ty)))?);
        }
        let results = step.kernel.run_in_place(&operands.iter().collect::<Vec<_>>());
        let targets: Vec<usize> = if written.is_empty() { vec![step.args.len() - 1] } else { written };
        if targets.len() != results.len() {
            return Err(fail(format!("{} results for {} outputs", results.len(), targets.len())));
        }
        for (i, y) in targets.into_iter().zip(results) {
            let a = &step.args[i];
            let bytes = y.data().to_le_bytes();
            if bytes.len() != a.bytes {
                return Err(fail(format!("a result of {} bytes for {} ({})", bytes.len(), a.value, a.ty)));
            }
            let mem = if a.space == Space::Arena { &mut self.arena } else { &mut self.weights };
            mem[a.offset..a.offset + a.bytes].copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn mark(&mut self) -> Result<Instant, RuntimeError> {
        Ok(crate::exec::HostClock::mark())
    }

    fn elapsed_ms(&mut self, from: &Instant, to: &Instant) -> Result<f64, RuntimeError> {
        Ok(crate::exec::HostClock::elapsed_ms(from, to))
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
}
