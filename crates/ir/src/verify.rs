//! The verifier: checks every invariant a pass may rely on. A failure after
//! a pass is always a compiler bug.

use crate::error::IrError;
use crate::graph::{display_name, Graph};
use crate::kernel_op::OpSet;
use std::collections::HashSet;

/// Checks `g`: no cycle; inputs connected port by port without gaps; every
/// node's stored output types equal what inference gives; constants have
/// unique names and, when known, data of their type; graph inputs are
/// `Input` nodes and outputs exist.
pub fn verify<O: OpSet>(g: &Graph<O>) -> Result<(), IrError> {
    g.topo_order()?;
    let mut const_names = HashSet::new();
    let mut n_inputs = 0;
    for id in g.node_ids() {
        let node = g.node(id);
        let who = || format!("{id} {}", display_name(&node.name, node.op.name()));
        let ins = g.inputs_of(id);
        for (port, v) in ins.iter().enumerate() {
            if !g.contains(v.node) || v.slot as usize >= g.node(v.node).outputs.len() {
                return Err(IrError::Invalid(format!("{}: input {port} reads missing value {v}", who())));
            }
        }
        match node.op.semantic() {
            Some(op @ (crate::Op::Input | crate::Op::Constant | crate::Op::Parameter | crate::Op::State)) => {
                if !ins.is_empty() || node.outputs.len() != 1 {
                    return Err(IrError::Invalid(format!("{}: must have no inputs and one output", who())));
                }
                if *op != crate::Op::Input {
                    if !const_names.insert(node.name.as_str()) {
                        return Err(IrError::Invalid(format!("{}: the name of a persistent value used twice", who())));
                    }
                    if let Some(w) = g.weight(id) {
                        if *w.ty() != node.outputs[0] {
                            return Err(IrError::Invalid(format!("{}: data is {} but the node says {}", who(), w.ty(), node.outputs[0])));
                        }
                    }
                } else {
                    n_inputs += 1;
                    if !g.inputs().contains(&id) {
                        return Err(IrError::Invalid(format!("{}: input node not listed as a graph input", who())));
                    }
                }
            }
            Some(op @ crate::Op::Update(_)) => {
                // An update writes into what it replaces: distinct parameters or
                // state, each replaced by one update only.
                let mut targets = HashSet::new();
                for slot in 0..node.outputs.len() {
                    let target = op.updated_operand(slot).and_then(|i| ins.get(i));
                    let persistent =
                        target.is_some_and(|t| matches!(g.node(t.node).op.semantic(), Some(crate::Op::Parameter | crate::Op::State)));
                    if !persistent {
                        return Err(IrError::Invalid(format!("{}: output {slot} must replace a parameter or state operand", who())));
                    }
                    let t = target.expect("checked").node;
                    if !targets.insert(t) {
                        return Err(IrError::Invalid(format!("{}: replaces \"{}\" twice", who(), g.node(t).name)));
                    }
                    let writers = g.users_of(t).into_iter().collect::<HashSet<_>>().into_iter().filter(|&u| {
                        g.node(u).op.semantic().is_some_and(|o| {
                            let ui = g.inputs_of(u);
                            (0..g.node(u).outputs.len()).any(|s| o.updated_operand(s).and_then(|i| ui.get(i)).is_some_and(|v| v.node == t))
                        })
                    });
                    if writers.count() > 1 {
                        return Err(IrError::Invalid(format!("{}: \"{}\" is replaced by more than one update", who(), g.node(t).name)));
                    }
                }
                let tys: Vec<_> = ins.iter().map(|&v| g.ty(v)).collect();
                let want = node.op.infer(&tys).map_err(|m| IrError::Invalid(format!("{}: {m}", who())))?;
                if want != node.outputs {
                    return Err(IrError::Invalid(format!("{}: stored types differ from inference", who())));
                }
            }
            _ => {
                let tys: Vec<_> = ins.iter().map(|&v| g.ty(v)).collect();
                let want = node.op.infer(&tys).map_err(|m| IrError::Invalid(format!("{}: {m}", who())))?;
                if want != node.outputs {
                    let show = |ts: &[crate::TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
                    return Err(IrError::Invalid(format!(
                        "{}: stored type {} but inference gives {}",
                        who(),
                        show(&node.outputs),
                        show(&want)
                    )));
                }
            }
        }
    }
    if n_inputs != g.inputs().len() {
        return Err(IrError::Invalid("graph input list does not match the input nodes".into()));
    }
    for (name, v) in g.outputs() {
        if !g.contains(v.node) || v.slot as usize >= g.node(v.node).outputs.len() {
            return Err(IrError::Invalid(format!("output \"{name}\" reads missing value {v}")));
        }
    }
    Ok(())
}
