//! Dead code elimination: removes nodes no graph output depends on (ONNX
//! exports often carry unused constants and side branches).

use smelt_ir::Graph;

/// Statistics of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Nodes removed.
    pub removed: usize,
}

/// Removes dead nodes from `graph`.
pub fn run(graph: &mut Graph) -> Stats {
    Stats { removed: graph.remove_dead() }
}
