//! From a [`Graph`] into the e-graph, and from the extracted choice back.

use super::lang::{attr_of, symbol_of, AttrEntry, AttrRef, Fl, FusionAnalysis, Origin, ValInfo, ValRef};
use crate::HashMap;
use egg::{EGraph, Id, Symbol};
use smelt_ir::{text::op_by_name, Act, Conv, Graph, IrError, KernelGraph, KernelOp, NodeId, Op, OpSet, ValueId};

/// A graph encoded in an e-graph.
pub struct Encoded {
    /// The e-graph.
    pub egraph: EGraph<Fl, FusionAnalysis>,
    /// The graph outputs, by name, as e-classes.
    pub outputs: Vec<(String, Id)>,
    /// The original node's name for each class it created.
    pub names: HashMap<Id, String>,
    /// Number of nodes that computed something in the input graph.
    pub ops_before: usize,
    /// The class of every value of the input graph (for provenance).
    pub classes: HashMap<ValueId, Id>,
    /// The class of every node of the input graph (its value's, or for a
    /// node with several outputs the class of the node itself).
    pub node_classes: HashMap<NodeId, Id>,
}

fn attr(eg: &mut EGraph<Fl, FusionAnalysis>, e: AttrEntry) -> Id {
    eg.analysis.attrs.push(e);
    let r = AttrRef(eg.analysis.attrs.len() - 1);
    eg.add(Fl::Attr(r))
}

fn sym(eg: &mut EGraph<Fl, FusionAnalysis>, s: &str) -> Id {
    eg.add(Fl::Symbol(Symbol::from(s)))
}

/// Encodes `g`.
pub fn encode(g: &Graph) -> Result<Encoded, IrError> {
    let mut eg: EGraph<Fl, FusionAnalysis> = EGraph::new(FusionAnalysis::default());
    let mut ids: HashMap<ValueId, Id> = HashMap::default();
    let mut node_classes: HashMap<NodeId, Id> = HashMap::default();
    let mut names = HashMap::default();
    let mut ops_before = 0;
    for id in g.topo_order()? {
        let node = g.node(id);
        let ins: Vec<Id> = g.inputs_of(id).iter().map(|v| ids[v]).collect();
        let none = sym(&mut eg, "none");
        ops_before += node.op.is_kernel() as usize;
        let class = match &node.op {
            Op::Input | Op::Constant | Op::Parameter | Op::State => {
                let origin = match &node.op {
                    Op::Input => Origin::Input(id),
                    Op::Constant => Origin::Constant(node.name.clone()),
                    op => Origin::Persistent { name: node.name.clone(), op: op.clone() },
                };
                eg.analysis.vals.push(ValInfo { ty: node.outputs[0].clone(), data: g.weight(id).cloned(), origin });
                eg.add(Fl::Val(ValRef(eg.analysis.vals.len() - 1)))
            }
            Op::Conv(c) => {
                let a = attr(&mut eg, AttrEntry::Op(Op::Conv(c.clone())));
                let b = ins.get(2).copied().unwrap_or(none);
                eg.add(Fl::Conv([a, ins[0], ins[1], b, none, none]))
            }
            Op::BatchNorm { .. } => {
                let a = attr(&mut eg, AttrEntry::Op(node.op.clone()));
                eg.add(Fl::Bn([a, ins[0], ins[1], ins[2], ins[3], ins[4]]))
            }
            Op::Gemm { .. } => {
                let a = attr(&mut eg, AttrEntry::Op(node.op.clone()));
                eg.add(Fl::Gemm([a, ins[0], ins[1], ins.get(2).copied().unwrap_or(none), none]))
            }
            Op::MatMul => eg.add(Fl::MatMul([ins[0], ins[1]])),
            // A function with parameters keeps them in a side table; one
            // without is a symbol the rules can match.
            Op::Unary(u) if !u.params().is_empty() => {
                let a = attr(&mut eg, AttrEntry::Op(node.op.clone()));
                eg.add(Fl::Unary([a, ins[0]]))
            }
            Op::Clip { .. } => {
                let a = attr(&mut eg, AttrEntry::Op(node.op.clone()));
                eg.add(Fl::Unary([a, ins[0]]))
            }
            Op::Unary(_) | Op::Identity | Op::Dropout => {
                let k = sym(&mut eg, node.op.name());
                eg.add(Fl::Unary([k, ins[0]]))
            }
            Op::Binary(_) => {
                let k = sym(&mut eg, node.op.name());
                eg.add(Fl::Binary([k, ins[0], ins[1]]))
            }
            Op::Sum if ins.len() >= 2 => {
                let k = sym(&mut eg, "add");
                ins[1..].iter().fold(ins[0], |acc, &x| eg.add(Fl::Binary([k, acc, x])))
            }
            op => {
                let a = attr(&mut eg, AttrEntry::Opaque { op: op.clone(), name: node.name.clone(), outputs: node.outputs.clone() });
                let opaque = eg.add(Fl::Opaque(std::iter::once(a).chain(ins.iter().copied()).collect()));
                if node.outputs.len() == 1 {
                    opaque
                } else {
                    for (slot, ty) in node.outputs.iter().enumerate() {
                        let s = attr(&mut eg, AttrEntry::Slot { slot: slot as u32, ty: ty.clone() });
                        let out = eg.add(Fl::Out([s, opaque]));
                        ids.insert(ValueId { node: id, slot: slot as u32 }, out);
                        names.entry(out).or_insert_with(|| node.name.clone());
                    }
                    node_classes.insert(id, opaque);
                    names.entry(opaque).or_insert_with(|| node.name.clone());
                    continue;
                }
            }
        };
        ids.insert(ValueId { node: id, slot: 0 }, class);
        node_classes.insert(id, class);
        names.entry(class).or_insert_with(|| node.name.clone());
    }
    let outputs = g.outputs().iter().map(|(n, v)| (n.clone(), ids[v])).collect();
    Ok(Encoded { egraph: eg, outputs, names, ops_before, classes: ids, node_classes })
}

/// Rebuilds a graph from the extracted choice of each class.
pub fn decode(
    eg: &EGraph<Fl, FusionAnalysis>,
    choice: &HashMap<Id, Fl>,
    outputs: &[(String, Id)],
    names: HashMap<Id, String>,
    classes: &HashMap<ValueId, Id>,
    node_classes: &HashMap<NodeId, Id>,
    original: &Graph,
) -> Result<KernelGraph, IrError> {
    // Classes merged during saturation: keep the name of the earliest node.
    let mut canon: HashMap<Id, String> = HashMap::default();
    let mut sorted: Vec<_> = names.into_iter().collect();
    sorted.sort_by_key(|(id, _)| *id);
    for (id, name) in sorted {
        canon.entry(eg.find(id)).or_insert(name);
    }
    // The nodes of the input graph whose value each class holds.
    let mut members: HashMap<Id, Vec<NodeId>> = HashMap::default();
    let mut nodes: Vec<_> = node_classes.iter().collect();
    nodes.sort();
    for (&n, &c) in nodes {
        members.entry(eg.find(c)).or_default().push(n);
    }
    let mut d = Decoder {
        eg,
        choice,
        names: &canon,
        original,
        classes,
        members,
        reads: Vec::new(),
        g: KernelGraph::new(),
        memo: HashMap::default(),
        vals: HashMap::default(),
        inputs: HashMap::default(),
    };
    // Graph inputs first, in their original order.
    for &i in original.inputs() {
        let n = original.node(i);
        let v = d.g.add_input(n.name.clone(), n.outputs[0].clone())?;
        d.g.set_origin(v.node, vec![i]);
        d.inputs.insert(i, v);
    }
    // Decode in post-order so that `value`'s recursion never goes deeper
    // than one node: a chain of thousands of ops must not overflow the stack.
    for c in d.post_order(outputs.iter().map(|(_, id)| *id))? {
        d.value(c)?;
    }
    for (name, id) in outputs {
        let v = d.value(*id)?;
        d.g.add_output(name.clone(), v);
    }
    d.g.remove_dead();
    // A model node whose value equals a value a kernel reads (an identity
    // of a graph input) computes nothing of its own: its readers carry it.
    let covered: crate::HashSet<NodeId> = d.g.node_ids().flat_map(|n| d.g.origin(n).to_vec()).collect();
    for (&n, &c) in node_classes {
        let op = &original.node(n).op;
        if covered.contains(&n) || op.is_input() || op.is_persistent() {
            continue;
        }
        let c = eg.find(c);
        for (k, reads) in &d.reads {
            if d.g.contains(*k) && reads.contains(&c) {
                let origin = [d.g.origin(*k), &[n]].concat();
                d.g.set_origin(*k, origin);
            }
        }
    }
    Ok(d.g)
}

struct Decoder<'a> {
    eg: &'a EGraph<Fl, FusionAnalysis>,
    choice: &'a HashMap<Id, Fl>,
    names: &'a HashMap<Id, String>,
    original: &'a Graph,
    classes: &'a HashMap<ValueId, Id>,
    members: HashMap<Id, Vec<NodeId>>,
    /// Each node made, with the classes it reads.
    reads: Vec<(NodeId, Vec<Id>)>,
    g: KernelGraph,
    memo: HashMap<Id, ValueId>,
    vals: HashMap<ValRef, ValueId>,
    inputs: HashMap<NodeId, ValueId>,
}

impl Decoder<'_> {
    fn bug(msg: impl Into<String>) -> IrError {
        IrError::Invalid(format!("fusion extraction: {}", msg.into()))
    }

    fn entry(&self, id: Id) -> Result<&AttrEntry, IrError> {
        attr_of(self.eg, id).map(|a| &self.eg.analysis.attrs[a.0]).ok_or_else(|| Self::bug("missing attribute"))
    }

    fn op_attr(&self, id: Id) -> Result<Op, IrError> {
        match self.entry(id)? {
            AttrEntry::Op(op) => Ok(op.clone()),
            _ => Err(Self::bug("expected an op attribute")),
        }
    }

    fn is_none(&self, id: Id) -> bool {
        symbol_of(self.eg, id).is_some_and(|s| s.as_str() == "none")
    }

    fn act(&self, id: Id) -> Result<Act, IrError> {
        if let Some(s) = symbol_of(self.eg, id) {
            return s.as_str().parse().map_err(Self::bug);
        }
        match self.op_attr(id)? {
            Op::Clip { min, max } => Ok(Act::Clip(min, max)),
            op => Err(Self::bug(format!("{} is not an activation", op.name()))),
        }
    }

    fn node(&mut self, id: Id, op: impl Into<KernelOp>, ins: &[Id]) -> Result<ValueId, IrError> {
        let vs = ins.iter().map(|&c| self.value(c)).collect::<Result<Vec<_>, _>>()?;
        let name = self.names.get(&self.eg.find(id)).cloned().unwrap_or_default();
        let n = self.g.add(op, name, &vs)?;
        let origin = self.cone(id, ins);
        self.g.set_origin(n, origin);
        self.reads.push((n, ins.iter().map(|&c| self.eg.find(c)).collect()));
        Ok(ValueId { node: n, slot: 0 })
    }

    /// The nodes of the input graph a node of class `id` reading classes
    /// `ins` computes: from the input nodes whose value is in its class, back
    /// through operands until a value it reads (or a source).
    fn cone(&self, id: Id, ins: &[Id]) -> Vec<NodeId> {
        let stop: crate::HashSet<Id> = ins.iter().map(|&c| self.eg.find(c)).collect();
        let mut stack = self.members.get(&self.eg.find(id)).cloned().unwrap_or_default();
        let (mut seen, mut out) = (crate::HashSet::default(), Vec::new());
        while let Some(n) = stack.pop() {
            let op = &self.original.node(n).op;
            if !seen.insert(n) || op.is_input() || op.is_persistent() {
                continue;
            }
            out.push(n);
            for v in self.original.inputs_of(n) {
                if !stop.contains(&self.eg.find(self.classes[&v])) {
                    stack.push(v.node);
                }
            }
        }
        out
    }

    /// The value classes a chosen node reads, as [`Decoder::value`] decodes them.
    fn operands(&self, n: &Fl) -> Vec<Id> {
        let some = |c: &Id| (!self.is_none(*c)).then_some(*c);
        match n {
            Fl::Val(_) | Fl::Attr(_) | Fl::Symbol(_) => vec![],
            Fl::Conv([_, x, w, b, r, _]) => [Some(*x), Some(*w), some(b), some(r)].into_iter().flatten().collect(),
            Fl::Bn([_, x, s, b, m, v]) => vec![*x, *s, *b, *m, *v],
            Fl::Gemm([_, a, b, c, _]) => [Some(*a), Some(*b), some(c)].into_iter().flatten().collect(),
            Fl::MatMul([a, b]) => vec![*a, *b],
            Fl::Unary([_, x]) => vec![*x],
            Fl::Binary([_, x, y]) => vec![*x, *y],
            Fl::Opaque(ch) => ch[1..].to_vec(),
            Fl::Out([_, x]) => vec![*x],
        }
    }

    /// The value classes reachable from `roots` through the chosen nodes,
    /// operands before their readers; an explicit stack, no recursion.
    fn post_order(&self, roots: impl Iterator<Item = Id>) -> Result<Vec<Id>, IrError> {
        let (mut order, mut done) = (Vec::new(), crate::HashSet::default());
        let mut stack: Vec<(Id, bool)> = roots.map(|r| (self.eg.find(r), false)).collect();
        stack.reverse();
        while let Some((c, expanded)) = stack.pop() {
            if expanded {
                order.push(c);
                continue;
            }
            if !done.insert(c) {
                continue;
            }
            stack.push((c, true));
            let n = self.choice.get(&c).ok_or_else(|| Self::bug(format!("class {c} has no choice")))?;
            // Reversed, so that operands are decoded first to last, as a
            // recursive walk would.
            stack.extend(self.operands(n).into_iter().rev().map(|o| (self.eg.find(o), false)).filter(|(o, _)| !done.contains(o)));
        }
        Ok(order)
    }

    fn value(&mut self, id: Id) -> Result<ValueId, IrError> {
        let id = self.eg.find(id);
        if let Some(&v) = self.memo.get(&id) {
            return Ok(v);
        }
        let n = self.choice.get(&id).ok_or_else(|| Self::bug(format!("class {id} has no choice")))?.clone();
        let v = match &n {
            Fl::Val(r) => {
                if let Some(&v) = self.vals.get(r) {
                    v
                } else {
                    let info = &self.eg.analysis.vals[r.0];
                    let v = match (&info.origin, &info.data) {
                        (Origin::Input(i), _) => self.inputs[i],
                        (Origin::Constant(name), Some(t)) => self.g.add_shared_constant(name.clone(), t.clone()),
                        (Origin::Constant(name), None) => self.g.add_weight_ref(name.clone(), info.ty.clone()),
                        (Origin::Persistent { name, op }, Some(t)) => self.g.add_persistent(op.clone(), name.clone(), t.clone()),
                        (Origin::Persistent { name, op }, None) => self.g.add_persistent_ref(op.clone(), name.clone(), info.ty.clone()),
                    };
                    self.vals.insert(*r, v);
                    v
                }
            }
            Fl::Attr(_) | Fl::Symbol(_) => return Err(Self::bug("a leaf used as a value")),
            Fl::Conv([c, x, w, b, r, act]) => {
                let conv: Conv = match self.op_attr(*c)? {
                    Op::Conv(c) => c,
                    _ => return Err(Self::bug("conv without conv attributes")),
                };
                let (has_b, has_r, act) = (!self.is_none(*b), !self.is_none(*r), self.act(*act)?);
                let mut ins = vec![*x, *w];
                ins.extend(has_b.then_some(*b));
                ins.extend(has_r.then_some(*r));
                let op = if !has_r && act == Act::None {
                    KernelOp::Op(Op::Conv(conv))
                } else {
                    KernelOp::FusedConv { conv, bias: has_b, residual: has_r, act }
                };
                self.node(id, op, &ins)?
            }
            Fl::Bn([e, x, s, b, m, v]) => {
                let op = self.op_attr(*e)?;
                self.node(id, op, &[*x, *s, *b, *m, *v])?
            }
            Fl::Gemm([g, a, b, c, act]) => {
                let Op::Gemm { trans_a, trans_b, alpha, beta } = self.op_attr(*g)? else { return Err(Self::bug("gemm attributes")) };
                let act = self.act(*act)?;
                let mut ins = vec![*a, *b];
                ins.extend((!self.is_none(*c)).then_some(*c));
                let op = if act == Act::None {
                    KernelOp::Op(Op::Gemm { trans_a, trans_b, alpha, beta })
                } else {
                    KernelOp::FusedGemm { trans_a, trans_b, alpha, beta, act }
                };
                self.node(id, op, &ins)?
            }
            Fl::MatMul([a, b]) => self.node(id, Op::MatMul, &[*a, *b])?,
            Fl::Unary([k, x]) => {
                let op = match symbol_of(self.eg, *k) {
                    Some(s) => op_by_name(s.as_str()).ok_or_else(|| Self::bug(format!("unknown op {s}")))?,
                    None => self.op_attr(*k)?,
                };
                self.node(id, op, &[*x])?
            }
            Fl::Binary([k, x, y]) => {
                let s = symbol_of(self.eg, *k).ok_or_else(|| Self::bug("binary kind"))?;
                let op = op_by_name(s.as_str()).ok_or_else(|| Self::bug(format!("unknown op {s}")))?;
                self.node(id, op, &[*x, *y])?
            }
            Fl::Opaque(ch) => {
                let AttrEntry::Opaque { op, .. } = self.entry(ch[0])?.clone() else { return Err(Self::bug("opaque attributes")) };
                self.node(id, op, &ch[1..])?
            }
            Fl::Out([s, x]) => {
                let AttrEntry::Slot { slot, .. } = self.entry(*s)? else { return Err(Self::bug("slot attributes")) };
                let slot = *slot;
                let base = self.value(*x)?;
                ValueId { node: base.node, slot }
            }
        };
        self.memo.insert(id, v);
        Ok(v)
    }
}
