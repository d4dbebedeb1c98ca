//! Graph passes. [`pipeline::run`] fixes their order and runs the verifier
//! after each one in debug builds and tests. Fusion (`fusion`, `ew_cluster`, `concat`)
//! runs between two dead-code eliminations; memory planning joins as its
//! issue lands.
#![deny(missing_docs)]

/// Hash maps and sets of the passes, keyed by node and value ids: rustc's
/// FxHash, since SipHash's resistance to chosen keys buys nothing on
/// compiler-made ids and was half of `smelt fit`'s time. Public functions
/// that take or return them take or return these.
pub type HashMap<K, V> = rustc_hash::FxHashMap<K, V>;
/// See [`HashMap`].
pub type HashSet<K> = rustc_hash::FxHashSet<K>;

/// `f` of each item, on up to the machine's cores, in the items' order:
/// for independent work whose answer must not depend on the threads.
pub(crate) fn par_map<'a, T: Sync, R: Send>(items: &'a [T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        // As deep a stack as the main thread's and more: the work recurses
        // along chains of the graph (recomputations of recomputations).
        let spawn =
            |c: &'a [T]| std::thread::Builder::new().stack_size(64 << 20).spawn_scoped(s, move || c.iter().map(f).collect::<Vec<R>>());
        // A chunk whose thread cannot start runs here.
        let handles: Vec<_> = items.chunks(chunk).map(|c| spawn(c).map_err(|_| c)).collect();
        handles
            .into_iter()
            .flat_map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                Err(c) => c.iter().map(f).collect(),
            })
            .collect()
    })
}

pub mod attention;
pub mod concat;
pub mod dce;
pub mod ew_cluster;
pub mod fusion;
pub mod gemm_epilogue;
pub mod layer_norm;
pub mod memory;
pub mod pipeline;
pub mod precision;
pub mod reduce_fuse;
pub mod remat;
pub mod split;
pub mod train;
pub mod views;

/// Errors of the passes crate. Passes run on verified graphs, so every
/// failure is a compiler bug: the pass produced a graph the verifier
/// rejects, or found its input inconsistent with what an earlier pass
/// promised.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The graph is invalid after a pass, or a pass failed on it: always a
    /// compiler bug.
    #[error("compiler bug in pass {pass}: {source}")]
    Bug {
        /// The pass that ran last.
        pass: &'static str,
        /// What the verifier found.
        source: smelt_ir::IrError,
    },
}

impl PassError {
    /// Whether this is smelt's fault rather than the input's (always, for
    /// now: the driver verifies every graph before the passes see it).
    pub fn is_bug(&self) -> bool {
        match self {
            PassError::Bug { .. } => true,
        }
    }
}

/// A copy of `g` in topological order without the nodes in `skip`, each
/// node either made anew by `make(out, id, map)` (`Some`: the new node,
/// its inputs found through `map`) or copied; outputs follow their nodes.
/// The passes that replace groups of nodes by one (`reduce-fuse`,
/// `attention`) share it.
pub(crate) fn rebuild<O: smelt_ir::OpSet>(
    g: &smelt_ir::Graph<O>,
    skip: &crate::HashSet<smelt_ir::NodeId>,
    mut make: impl FnMut(
        &mut smelt_ir::Graph<O>,
        smelt_ir::NodeId,
        &crate::HashMap<smelt_ir::ValueId, smelt_ir::ValueId>,
    ) -> Result<Option<smelt_ir::NodeId>, smelt_ir::IrError>,
) -> Result<smelt_ir::Graph<O>, smelt_ir::IrError> {
    use smelt_ir::ValueId;
    let mut out = smelt_ir::Graph::new();
    out.set_tf32(g.tf32());
    let mut map = crate::HashMap::default();
    for id in g.topo_order()? {
        if skip.contains(&id) {
            continue;
        }
        let new = match make(&mut out, id, &map)? {
            Some(n) => n,
            None => {
                let ins: Vec<ValueId> = g.inputs_of(id).iter().map(|v| map[v]).collect();
                out.copy_node_from(g, id, &ins)?
            }
        };
        for slot in 0..g.node(id).outputs.len() as u32 {
            map.insert(ValueId { node: id, slot }, ValueId { node: new, slot });
        }
    }
    out.set_outputs(g.outputs().iter().map(|(n, v)| (n.clone(), map[v])).collect());
    Ok(out)
}
