//! What `smelt compile --out DIR` writes besides the kernels: `plan.json`
//! (the program a runtime executes).

use serde_json::{json, Value};
use smelt_codegen::Program;

/// `plan.json`: the arena and weights sizes, graph inputs and outputs with
/// their arena offsets, the weights layout, and every launch in order with
/// its grid, block, trailing count and pointer arguments.
pub fn plan_json(model: &str, batch: Option<usize>, arch: &str, p: &Program) -> Value {
    let steps: Vec<Value> = p
        .steps
        .iter()
        .map(|s| {
            json!({
                "node": s.node,
                "origin": s.origin.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                "kernel": s.kernel.name(),
                "kind": s.kernel.kind(),
                "source": format!("kernels/{}.cu", s.kernel.name()),
                "ptx": format!("kernels/{}.ptx", s.kernel.name()),
                "grid": s.launch.grid,
                "block": s.launch.block,
                "count": s.launch.count,
                "args": s.args,
                "flops": s.kernel.flops(),
            })
        })
        .collect();
    json!({
        "format": "smelt-plan-1",
        "model": model,
        "batch": batch,
        "arch": arch,
        "arena_bytes": p.arena,
        "weights_bytes": p.weights_bytes,
        "inputs": p.inputs,
        "outputs": p.outputs,
        "weights": p.weights,
        "steps": steps,
    })
}
