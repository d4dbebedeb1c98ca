//! The order of passes, with the verifier after each in debug builds.

use crate::{dce, PassError};
use smelt_ir::Graph;

/// What the pipeline did.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Dead code elimination.
    pub dce: dce::Stats,
}

/// Runs every pass on `graph`, in order.
pub fn run(graph: &mut Graph) -> Result<Stats, PassError> {
    let stats = Stats {
        dce: dce::run(graph),
    };
    verify_if(graph, "dce")?;
    Ok(stats)
}

fn verify_if(graph: &Graph, pass: &'static str) -> Result<(), PassError> {
    if cfg!(debug_assertions) {
        smelt_ir::verify(graph).map_err(|source| PassError::Verify { pass, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn dce_removes_unused_branches_only() {
        let text = "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%0) : f32[2]\n  %2 = neg(%0) : f32[2]\n  output \"y\" = %1\n}\n";
        let mut g = smelt_ir::text::parse(text).unwrap();
        let stats = super::run(&mut g).unwrap();
        assert_eq!(stats.dce.removed, 1);
        assert_eq!(smelt_ir::text::print(&g), "graph {\n  %0 \"x\" = input : f32[2]\n  %1 = relu(%0) : f32[2]\n  output \"y\" = %1\n}\n");
    }
}
