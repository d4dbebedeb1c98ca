//! Chains of reshapes and transposes become at most one transpose. Exports
//! move heads in and out of the batch with several of them (the dynamo
//! exporter writes a key's transpose as transpose, reshape to 3-D,
//! transpose, reshape back); each transpose is a copy kernel. The chain's
//! composite index map is computed on "atoms": each dim is a run of atoms
//! (mixed radix), a transpose reorders dims, a reshape regroups the atoms
//! (splitting one where a new dim boundary falls inside it). When every
//! boundary falls between atoms, the chain equals
//! `reshape(transpose(reshape(x, atoms), perm), out)`: one transpose kernel
//! (that attention folds into its indexing), or none when the permutation
//! is the identity.

use crate::{HashMap, HashSet};
use smelt_ir::traits::Kind;
use smelt_ir::{IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};

/// What the pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Chains rewritten.
    pub chains: usize,
    /// Transpose kernels removed.
    pub transposes_removed: usize,
}

/// One chain: its input, its nodes (first to last), the replacement.
struct Chain {
    x: ValueId,
    nodes: Vec<NodeId>,
    atoms: Vec<usize>,
    perm: Vec<usize>,
}

/// A view: same elements in the same order, another shape.
fn is_reshape(op: &KernelOp) -> bool {
    op.semantic().is_some_and(|op| op.traits().kind == Kind::View)
}

fn is_link(op: &KernelOp) -> bool {
    is_reshape(op) || matches!(op, KernelOp::Op(Op::Transpose { .. }))
}

/// Rewrites the chains of `g`.
pub fn run(g: &mut KernelGraph) -> Result<Stats, IrError> {
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|(_, v)| v.node).collect();
    let private = |n: NodeId| g.users_of(n).len() == 1 && !outputs.contains(&n);
    let mut found: HashMap<NodeId, Chain> = HashMap::default();
    let mut stats = Stats::default();
    for end in g.node_ids() {
        if !is_link(&g.node(end).op) {
            continue;
        }
        // Only maximal chains: the end's reader is not a link it alone feeds.
        let users = g.users_of(end);
        if private(end) && is_link(&g.node(users[0]).op) {
            continue;
        }
        let mut nodes = vec![end];
        let mut x = g.inputs_of(end)[0];
        while is_link(&g.node(x.node).op) && private(x.node) {
            nodes.push(x.node);
            x = g.inputs_of(x.node)[0];
        }
        nodes.reverse();
        let transposes = nodes.iter().filter(|&&n| !is_reshape(&g.node(n).op)).count();
        if transposes < 2 {
            continue;
        }
        let Some((atoms, perm)) = compose(g, x, &nodes) else { continue };
        let identity = perm.iter().enumerate().all(|(i, &p)| i == p);
        stats.chains += 1;
        stats.transposes_removed += transposes - usize::from(!identity);
        found.insert(end, Chain { x, nodes, atoms, perm });
    }
    if found.is_empty() {
        return Ok(stats);
    }
    let absorbed: HashSet<NodeId> = found.values().flat_map(|c| c.nodes[..c.nodes.len() - 1].iter().copied()).collect();
    let out = crate::rebuild(g, &absorbed, |out, id, map| {
        let Some(c) = found.get(&id) else { return Ok(None) };
        let name = &g.node(id).name;
        let origin = g.origins(&c.nodes);
        let shape = g.node(id).outputs[0].shape.clone();
        let mut v = map[&c.x];
        let add = |out: &mut KernelGraph, op: Op, v: ValueId| -> Result<ValueId, IrError> {
            let n = out.add(op, name.clone(), &[v])?;
            out.set_origin(n, origin.clone());
            Ok(ValueId { node: n, slot: 0 })
        };
        let identity = c.perm.iter().enumerate().all(|(i, &p)| i == p);
        if !identity {
            if out.ty(v).shape != c.atoms {
                v = add(out, Op::Reshape { shape: c.atoms.clone() }, v)?;
            }
            v = add(out, Op::Transpose { perm: c.perm.clone() }, v)?;
        }
        if out.ty(v).shape != shape {
            v = add(out, Op::Reshape { shape }, v)?;
        }
        Ok(Some(v.node))
    })?;
    *g = out;
    Ok(stats)
}

/// The chain's map as (atom extents in input order, the permutation that
/// takes them to output order), if every reshape boundary falls between
/// atoms. Atoms adjacent in both orders are merged.
fn compose(g: &KernelGraph, x: ValueId, nodes: &[NodeId]) -> Option<(Vec<usize>, Vec<usize>)> {
    // Atoms are numbered; `ext` holds their extents; an atom split in two
    // is replaced by two new atoms everywhere (it occurs once in `dims`
    // and once in `input`).
    // An empty tensor has nothing to move.
    if g.ty(x).shape.contains(&0) {
        return None;
    }
    let mut ext: Vec<usize> = Vec::new();
    let mut dims: Vec<Vec<usize>> = Vec::new();
    for &e in &g.ty(x).shape {
        ext.push(e);
        dims.push(vec![ext.len() - 1]);
    }
    let mut input: Vec<usize> = (0..ext.len()).collect();
    for &n in nodes {
        match &g.node(n).op {
            KernelOp::Op(Op::Transpose { perm }) => dims = perm.iter().map(|&p| dims[p].clone()).collect(),
            _ => {
                let shape = &g.node(n).outputs[0].shape;
                let mut flat: std::collections::VecDeque<usize> = dims.concat().into();
                let mut new = Vec::with_capacity(shape.len());
                for &d in shape {
                    let mut dim = Vec::new();
                    let mut left = d;
                    while left > 1 {
                        let a = flat.pop_front()?;
                        if ext[a] <= left {
                            if left % ext[a] != 0 {
                                return None;
                            }
                            left /= ext[a];
                            dim.push(a);
                        } else {
                            // The boundary falls inside atom a: split it.
                            if !ext[a].is_multiple_of(left) {
                                return None;
                            }
                            let (hi, lo) = (ext.len(), ext.len() + 1);
                            ext.extend([left, ext[a] / left]);
                            let at = input.iter().position(|&i| i == a)?;
                            input.splice(at..=at, [hi, lo]);
                            dim.push(hi);
                            flat.push_front(lo);
                            left = 1;
                        }
                    }
                    new.push(dim);
                }
                // Atoms of extent 1 left over belong nowhere.
                if flat.iter().any(|&a| ext[a] != 1) {
                    return None;
                }
                dims = new;
            }
        }
    }
    // Drop atoms of extent 1, then merge atoms of one output dim that are
    // adjacent in the input too (so that each output dim is one run when it
    // can be, and the transpose's result needs no reshape).
    input.retain(|&a| ext[a] != 1);
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for dim in &dims {
        let mut first = true;
        for &a in dim.iter().filter(|&&a| ext[a] != 1) {
            let pos = input.iter().position(|&i| i == a)?;
            match runs.last_mut() {
                Some(r) if !first && input.iter().position(|&i| i == *r.last().expect("runs are non-empty"))? + 1 == pos => r.push(a),
                _ => runs.push(vec![a]),
            }
            first = false;
        }
    }
    // Runs in input order give the atoms; their output order the permutation.
    let mut by_input: Vec<usize> = (0..runs.len()).collect();
    by_input.sort_by_key(|&r| input.iter().position(|&i| i == runs[r][0]));
    let atoms: Vec<usize> = by_input.iter().map(|&r| runs[r].iter().map(|&a| ext[a]).product()).collect();
    let mut perm = vec![0; runs.len()];
    for (k, &r) in by_input.iter().enumerate() {
        perm[r] = k;
    }
    Some((atoms, perm))
}
