//! Dead code elimination: removes nodes no graph output depends on (ONNX
//! exports often carry unused constants and side branches).

use smelt_ir::{Graph, OpSet};

/// Statistics of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Nodes removed.
    pub removed: usize,
}

/// Removes dead nodes from `graph`.
pub fn run<O: OpSet>(graph: &mut Graph<O>) -> Stats {
    Stats { removed: graph.remove_dead() }
}
