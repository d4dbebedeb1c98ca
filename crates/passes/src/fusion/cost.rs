//! Extraction. The cost of a choice is the bytes it moves through global
//! memory plus a fixed cost per kernel launch, summed over the *set* of
//! e-classes the choice needs: a value read by several consumers is counted
//! once (egg's default extractor sums trees and would count it per use).
//!
//! The algorithm is the greedy DAG extraction of the extraction gym: each
//! class keeps its cheapest node together with the set of classes that node
//! transitively needs; iterate to a fixed point. A node whose own class
//! appears in its children's sets would form a cycle and is skipped.

use super::lang::{attr_of, AttrEntry, Data, Fl, FusionAnalysis};
use egg::{EGraph, Id, Language};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Bytes a kernel launch is worth: it keeps a tiny kernel from looking free.
pub const LAUNCH_BYTES: f64 = 16384.0;

/// The own cost of an e-node: bytes read and written, plus a launch, for
/// every node that runs a kernel; zero for leaves and views.
pub fn node_cost(eg: &EGraph<Fl, FusionAnalysis>, class: Id, n: &Fl) -> f64 {
    let bytes = |d: &Data| d.ty.as_ref().map_or(0, |t| t.bytes()) as f64;
    match n {
        Fl::Attr(_) | Fl::Val(_) | Fl::Symbol(_) | Fl::Out(_) => 0.0,
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
            let mut seen = HashSet::new();
            let reads: f64 = n.children().iter().filter(|&&c| seen.insert(eg.find(c))).map(|&c| bytes(&eg[c].data)).sum();
            reads + bytes(&eg[class].data) + LAUNCH_BYTES
        }
    }
}

#[derive(Clone)]
struct Best {
    node: Fl,
    needs: Rc<HashMap<Id, f64>>,
    total: f64,
}

/// The chosen e-node of every class reachable from a root.
pub fn extract(eg: &EGraph<Fl, FusionAnalysis>) -> HashMap<Id, Fl> {
    let mut best: HashMap<Id, Best> = HashMap::new();
    let mut classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    classes.sort();
    let mut changed = true;
    while changed {
        changed = false;
        for &id in &classes {
            for n in &eg[id].nodes {
                let kids: Option<Vec<&Best>> = n.children().iter().map(|c| best.get(&eg.find(*c))).collect();
                let Some(kids) = kids else { continue };
                if kids.iter().any(|k| k.needs.contains_key(&id)) {
                    continue;
                }
                let mut needs: HashMap<Id, f64> = kids.first().map(|k| (*k.needs).clone()).unwrap_or_default();
                for k in kids.iter().skip(1) {
                    for (c, v) in k.needs.iter() {
                        needs.insert(*c, *v);
                    }
                }
                needs.insert(id, node_cost(eg, id, n));
                let total: f64 = needs.values().sum();
                if best.get(&id).is_none_or(|b| total < b.total - 1e-9) {
                    best.insert(id, Best { node: n.clone(), needs: Rc::new(needs), total });
                    changed = true;
                }
            }
        }
    }
    best.into_iter().map(|(id, b)| (id, b.node)).collect()
}
