//! Extraction. The cost of a choice is the bytes it moves through global
//! memory plus a fixed cost per kernel launch, summed over the *set* of
//! e-classes the choice needs: a value read by several consumers is counted
//! once (egg's default extractor sums trees and would count it per use).
//!
//! Elementwise nodes (`un`, `bin`) are priced as what they cost once
//! `ew-cluster` has merged their chains: one write of their output and a
//! quarter launch, no reads (their operands are usually computed in the
//! same kernel). So a BatchNorm with no conv before it becomes a cheaper
//! scale-and-shift that merges with its neighbours, and a fused epilogue
//! (reading a residual once) still beats a separate Add.
//!
//! Why bytes and launches, not codegen's roofline (`smelt_codegen::cost`):
//! every choice within an e-class does the same products (the rules fuse
//! elementwise work into layers and reductions, fold constants and
//! reassociate), and what differs between choices, elementwise work, reads,
//! writes and launches, is memory-bound, which this counts; and an
//! e-node is not a kernel yet (no tile, layout or dtype after precision), so
//! the roofline has nothing to price (`passes` is below `codegen` too).
//!
//! The algorithm is the greedy DAG extraction of the extraction gym: each
//! class keeps its cheapest node together with the set (a bit set) of
//! classes that node transitively needs, priced by the current choice of
//! each; a worklist revisits the parents of a class whose choice improved
//! until nothing changes. A node whose own class appears in its children's
//! sets would form a cycle and is skipped.

use super::lang::{attr_of, AttrEntry, Data, Fl, FusionAnalysis};
use crate::{HashMap, HashSet};
use egg::{EGraph, Id, Language};
use smelt_ir::OpSet;
use std::rc::Rc;

/// Bytes a kernel launch is worth: it keeps a tiny kernel from looking free.
pub const LAUNCH_BYTES: f64 = 16384.0;

/// The own cost of an e-node: bytes read and written, plus a launch, for
/// every node that runs a kernel; zero for leaves and views.
pub fn node_cost(eg: &EGraph<Fl, FusionAnalysis>, class: Id, n: &Fl) -> f64 {
    let bytes = |d: &Data| d.ty.as_ref().map_or(0, |t| t.bytes()) as f64;
    match n {
        Fl::Attr(_) | Fl::Val(_) | Fl::Symbol(_) | Fl::Out(_) => 0.0,
        Fl::Unary(_) | Fl::Binary(_) => bytes(&eg[class].data) + LAUNCH_BYTES / 4.0,
        Fl::Opaque(ch) => match attr_of(eg, ch[0]).map(|a| &eg.analysis.attrs[a.0]) {
            Some(AttrEntry::Opaque { op, outputs, .. }) if op.is_kernel() => {
                ch[1..].iter().map(|&c| bytes(&eg[c].data)).sum::<f64>()
                    + outputs.iter().map(|t| t.bytes() as f64).sum::<f64>()
                    + LAUNCH_BYTES
            }
            _ => 0.0,
        },
        _ => {
            // Distinct tensor operands are read once each.
            let mut seen = HashSet::default();
            let reads: f64 = n.children().iter().filter(|&&c| seen.insert(eg.find(c))).map(|&c| bytes(&eg[c].data)).sum();
            reads + bytes(&eg[class].data) + LAUNCH_BYTES
        }
    }
}

#[derive(Clone)]
struct Best {
    node: Fl,
    own: f64,
    /// Bit set of the classes this choice needs (dense class indices).
    needs: Rc<Vec<u64>>,
    total: f64,
}

/// The chosen e-node of every class reachable from a root.
pub fn extract(eg: &EGraph<Fl, FusionAnalysis>) -> HashMap<Id, Fl> {
    let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
    ids.sort();
    let index: HashMap<Id, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let words = ids.len().div_ceil(64);
    let mut best: Vec<Option<Best>> = vec![None; ids.len()];
    // Parents of each class, to revisit them when a child's choice improves.
    let mut parents: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
    for c in eg.classes() {
        for n in &c.nodes {
            for &ch in n.children() {
                parents[index[&eg.find(ch)]].push(index[&c.id]);
            }
        }
    }
    let mut queue: std::collections::VecDeque<usize> = (0..ids.len()).collect();
    let mut queued = vec![true; ids.len()];
    while let Some(i) = queue.pop_front() {
        queued[i] = false;
        let id = ids[i];
        let mut improved = false;
        for n in &eg[id].nodes {
            let kids: Option<Vec<&Best>> = n.children().iter().map(|c| best[index[&eg.find(*c)]].as_ref()).collect();
            let Some(kids) = kids else { continue };
            if kids.iter().any(|k| k.needs[i / 64] >> (i % 64) & 1 == 1) {
                continue; // would be a cycle
            }
            let mut needs = vec![0u64; words];
            for k in &kids {
                needs.iter_mut().zip(k.needs.iter()).for_each(|(a, b)| *a |= b);
            }
            needs[i / 64] |= 1 << (i % 64);
            let own = node_cost(eg, id, n);
            // Sum the own cost of every needed class's current choice.
            let mut total = own;
            for (w, &bits) in needs.iter().enumerate() {
                let mut b = bits;
                while b != 0 {
                    let j = w * 64 + b.trailing_zeros() as usize;
                    b &= b - 1;
                    if j != i {
                        total += best[j].as_ref().map_or(0.0, |x| x.own);
                    }
                }
            }
            if best[i].as_ref().is_none_or(|b| total < b.total - 1e-9) {
                best[i] = Some(Best { node: n.clone(), own, needs: Rc::new(needs), total });
                improved = true;
            }
        }
        if improved {
            for &p in &parents[i] {
                if !queued[p] {
                    queued[p] = true;
                    queue.push_back(p);
                }
            }
        }
    }
    ids.iter().zip(best).filter_map(|(&id, b)| b.map(|b| (id, b.node))).collect()
}
