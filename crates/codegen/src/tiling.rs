//! Choosing the tensor-core kernels' block tiles: a pass over described
//! kernels, after lowering (which gives every kernel the square tile) and
//! before names are made unique, for a [`Target`] that code generation takes
//! as an argument (the IR knows nothing of GPUs).

use crate::cost::{self, Gpu};
use crate::kernel::Kernel;
use crate::tile::{Staging, Tile};
use smelt_ir::{KernelGraph, NodeId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the kernels are compiled for: the GPU whose roofline model chooses
/// the tiles, and how they are chosen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Target {
    /// The GPU (`--device`; the H100 by default).
    pub gpu: Gpu,
    /// How the tiles are chosen.
    pub tiles: TileChoice,
}

/// How a tensor-core conv's or GEMM's block tile (`m x n` outputs) is
/// chosen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TileChoice {
    /// The candidate the roofline model estimates fastest on the target GPU.
    #[default]
    Model,
    /// This tile for every kernel (`smelt tune` measures each candidate).
    Every([usize; 2]),
    /// The tile measured fastest per kernel, by its name without the tile
    /// suffix (`smelt tune`'s table); the model's choice for the others.
    Tuned(Arc<BTreeMap<String, [usize; 2]>>),
}

/// Gives kernel `k` (as lowered: the square tile, no tile suffix), moving
/// `bytes`, the tile `target` says: pinned (one tile for all, or a measured
/// table by the kernel's name), else the model's choice on its GPU; a
/// kernel without tensor-core tiles is left as it is.
pub fn choose(k: &mut Kernel, bytes: usize, target: &Target) {
    if k.tile().is_none() {
        return;
    }
    let base = k.name().to_string();
    let pinned = match &target.tiles {
        TileChoice::Model => None,
        TileChoice::Every(mn) => Some(*mn),
        TileChoice::Tuned(table) => table.get(&base).copied(),
    };
    let tile = pinned.and_then(Tile::candidate).unwrap_or_else(|| fastest(k, bytes, &target.gpu));
    set(k, tile);
    k.rename(base + &tile.suffix());
}

/// `k` with tile `t`.
fn set(k: &mut Kernel, t: Tile) {
    match k {
        Kernel::Gemm(g) => g.tile = t,
        Kernel::Conv(c) => c.tile = t,
        _ => {}
    }
}

/// The candidate whose kernel the model estimates fastest on `gpu`, moving
/// `bytes`; the square on a tie (a candidate must be clearly faster: the
/// model is coarse).
fn fastest(k: &Kernel, bytes: usize, gpu: &Gpu) -> Tile {
    let elt = match k {
        Kernel::Gemm(g) => g.dtype.size(),
        Kernel::Conv(c) => c.dtype.size(),
        _ => 4,
    };
    let time = |t: Tile| {
        let mut k = k.clone();
        set(&mut k, t);
        let res = cost::Resources { registers: t.registers(elt), shared: t.shared_bytes(elt, Staging::default()) };
        cost::estimate(&k, bytes, gpu, Some(res)).seconds
    };
    let mut best = (Tile::SQUARE, time(Tile::SQUARE));
    for t in &Tile::CANDIDATES[1..] {
        let s = time(*t);
        if s < best.1 * 0.97 {
            best = (*t, s);
        }
    }
    best.0
}

/// Bytes node `id`'s kernel reads and writes, each operand and output once.
pub fn node_bytes(g: &KernelGraph, id: NodeId) -> usize {
    g.inputs_of(id).iter().map(|v| g.ty(*v).bytes()).sum::<usize>() + g.node(id).outputs.iter().map(|t| t.bytes()).sum::<usize>()
}

/// The kernel of node `id` of `g` with its tile chosen for `target`: what
/// [`crate::Program::build`] runs, for pricing and tests.
pub fn kernel_of(g: &KernelGraph, id: NodeId, target: &Target) -> Option<Kernel> {
    let mut k = Kernel::of(g, id)?;
    choose(&mut k, node_bytes(g, id), target);
    Some(k)
}
