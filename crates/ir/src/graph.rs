//! The graph: a private petgraph `StableGraph` behind typed ids.

use crate::dtype::TensorType;
use crate::error::IrError;
use crate::kernel_op::OpSet;
use crate::op::Op;
use crate::tensor::Tensor;
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::sync::Arc;

/// A node of the graph. Its `Display` (`%3`) is the text format's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) NodeIndex<u32>);

impl NodeId {
    /// The node's number, as printed in the text format.
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0.index())
    }
}

/// One output of a node: `%3` for slot 0, `%3:1` for slot 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    /// The producing node.
    pub node: NodeId,
    /// Which of its outputs.
    pub slot: u32,
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.slot == 0 {
            write!(f, "{}", self.node)
        } else {
            write!(f, "{}:{}", self.node, self.slot)
        }
    }
}

/// A node: its op, its name (from ONNX or the builder; may be empty) and the
/// type of each output, stored once here.
#[derive(Clone, Debug, PartialEq)]
pub struct Node<O = Op> {
    /// The operation.
    pub op: O,
    /// A human name, used in errors and reports.
    pub name: String,
    /// One type per output slot.
    pub outputs: Vec<TensorType>,
    /// Provenance: the nodes of the model as imported (the semantic graph
    /// the pipeline started from) that this node computes, sorted. Empty in
    /// a semantic graph, where every node is its own origin; set by
    /// `Graph::lift` and by fusion, and kept by every pass, so a kernel can
    /// be traced to the model's nodes whatever passes rebuilt the graph.
    pub origin: Vec<NodeId>,
    /// Rematerialization: the node of this graph whose value this node
    /// computes again (same op, from the same operands or their
    /// recomputations), for readers late in the schedule. A distinct node
    /// on purpose: no pass merges it back. `None` for every other node.
    pub recomputes: Option<NodeId>,
}

/// An edge: output `slot` of the source feeds input `port` of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Port {
    pub slot: u32,
    pub port: u32,
}

/// A tensor graph with static shapes, of semantic ops ([`Op`], the
/// default) or of kernels ([`crate::KernelOp`]).
#[derive(Clone, Debug)]
pub struct Graph<O = Op> {
    pub(crate) g: StableGraph<Node<O>, Port>,
    inputs: Vec<NodeId>,
    outputs: Vec<(String, ValueId)>,
    weights: BTreeMap<String, Arc<Tensor>>,
    /// Which f32 products run in TF32 (a fact of its numbers, which the
    /// reference executor honours; the pipeline sets it, a new graph has
    /// exact f32).
    tf32: crate::Tf32,
}

impl<O> Default for Graph<O> {
    fn default() -> Self {
        Graph { g: StableGraph::default(), inputs: Vec::new(), outputs: Vec::new(), weights: BTreeMap::new(), tf32: crate::Tf32::default() }
    }
}

impl<O: OpSet> Graph<O> {
    /// An empty graph.
    pub fn new() -> Self {
        Graph::default()
    }

    /// An empty graph with room for `nodes` nodes and `edges` operands.
    pub fn with_capacity(nodes: usize, edges: usize) -> Self {
        Graph { g: StableGraph::with_capacity(nodes, edges), ..Graph::default() }
    }

    /// Adds a node applying `op` to `inputs`, inferring its output types.
    pub fn add(&mut self, op: impl Into<O>, name: impl Into<String>, inputs: &[ValueId]) -> Result<NodeId, IrError> {
        let (op, name) = (op.into(), name.into());
        let types: Vec<&TensorType> = inputs.iter().map(|&v| self.try_ty(v)).collect::<Result<_, _>>()?;
        let outputs = op.infer(&types).map_err(|msg| IrError::inference(display_name(&name, op.name()), msg))?;
        Ok(self.add_typed(op, name, inputs, outputs))
    }

    /// The same graph with every op mapped by `f`: node ids, names, types,
    /// edges, inputs, outputs and weights are kept.
    pub fn map_ops<P>(&self, mut f: impl FnMut(&O) -> P) -> Graph<P> {
        let g = self.g.map(
            |_, n| Node {
                op: f(&n.op),
                name: n.name.clone(),
                outputs: n.outputs.clone(),
                origin: n.origin.clone(),
                recomputes: n.recomputes,
            },
            |_, e| *e,
        );
        Graph { g, inputs: self.inputs.clone(), outputs: self.outputs.clone(), weights: self.weights.clone(), tf32: self.tf32 }
    }

    /// Which f32 products run in TF32.
    pub fn tf32(&self) -> crate::Tf32 {
        self.tf32
    }

    /// Sets which f32 products run in TF32.
    pub fn set_tf32(&mut self, tf32: crate::Tf32) {
        self.tf32 = tf32;
    }

    /// Adds a node with given output types, unchecked (the verifier checks).
    pub(crate) fn add_typed(&mut self, op: O, name: String, inputs: &[ValueId], outputs: Vec<TensorType>) -> NodeId {
        let id = NodeId(self.g.add_node(Node { op, name, outputs, origin: Vec::new(), recomputes: None }));
        for (port, v) in inputs.iter().enumerate() {
            self.g.add_edge(v.node.0, id.0, Port { slot: v.slot, port: port as u32 });
        }
        id
    }

    pub(crate) fn add_raw(&mut self, node: Node<O>) -> NodeId {
        NodeId(self.g.add_node(node))
    }

    pub(crate) fn connect(&mut self, v: ValueId, to: NodeId, port: u32) {
        self.g.add_edge(v.node.0, to.0, Port { slot: v.slot, port });
    }

    pub(crate) fn remove_raw(&mut self, id: NodeId) {
        self.g.remove_node(id.0);
    }

    pub(crate) fn push_input(&mut self, id: NodeId) {
        self.inputs.push(id);
    }

    /// Adds a graph input named `name`.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> Result<ValueId, IrError> {
        let name = name.into();
        if ty.checked_bytes().is_none() {
            return Err(IrError::TooLarge { node: format!("input \"{name}\""), msg: format!("shape {:?} exceeds 1 TiB", ty.shape) });
        }
        let id = self.add_typed(O::from_op(Op::Input), name, &[], vec![ty]);
        self.inputs.push(id);
        Ok(ValueId { node: id, slot: 0 })
    }

    /// Adds a constant named `name` (unique among constants) holding `data`.
    pub fn add_constant(&mut self, name: impl Into<String>, data: Tensor) -> ValueId {
        self.add_shared_constant(name, Arc::new(data))
    }

    /// Adds a constant sharing already-loaded data (no copy).
    pub fn add_shared_constant(&mut self, name: impl Into<String>, data: Arc<Tensor>) -> ValueId {
        let name = self.unique_weight_name(name.into());
        let id = self.add_typed(O::from_op(Op::Constant), name.clone(), &[], vec![data.ty().clone()]);
        self.weights.insert(name, data);
        ValueId { node: id, slot: 0 }
    }

    /// Adds a persistent value of kind `op` ([`Op::Constant`],
    /// [`Op::Parameter`] or [`Op::State`]) named `name` (unique among
    /// persistent values) holding `data`.
    pub fn add_persistent(&mut self, op: Op, name: impl Into<String>, data: Arc<Tensor>) -> ValueId {
        let name = self.unique_weight_name(name.into());
        let id = self.add_typed(O::from_op(op), name.clone(), &[], vec![data.ty().clone()]);
        self.weights.insert(name, data);
        ValueId { node: id, slot: 0 }
    }

    /// Adds a persistent value of kind `op` whose data is not (yet) known.
    pub fn add_persistent_ref(&mut self, op: Op, name: impl Into<String>, ty: TensorType) -> ValueId {
        let id = self.add_typed(O::from_op(op), name.into(), &[], vec![ty]);
        ValueId { node: id, slot: 0 }
    }

    /// Adds a constant whose data is not (yet) known: a weight referenced by
    /// name in a text file. [`Graph::weight`] returns `None` for it.
    pub fn add_weight_ref(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let id = self.add_typed(O::from_op(Op::Constant), name.into(), &[], vec![ty]);
        ValueId { node: id, slot: 0 }
    }

    fn unique_weight_name(&self, name: String) -> String {
        if !self.weights.contains_key(&name) {
            return name;
        }
        (1..).map(|i| format!("{name}.{i}")).find(|n| !self.weights.contains_key(n)).expect("some suffix is free")
    }

    /// Copies node `id` of `other` into this graph, reading `inputs` (already
    /// mapped into this graph): inputs stay inputs, constants keep their data.
    pub fn copy_node_from(&mut self, other: &Graph<O>, id: NodeId, inputs: &[ValueId]) -> Result<NodeId, IrError> {
        let n = other.node(id);
        let new = if n.op.is_input() {
            self.add_input(n.name.clone(), n.outputs[0].clone())?.node
        } else if n.op.is_constant() {
            match other.weight(id) {
                Some(w) => self.add_shared_constant(n.name.clone(), w.clone()).node,
                None => self.add_weight_ref(n.name.clone(), n.outputs[0].clone()).node,
            }
        } else if n.op.is_persistent() {
            let op = n.op.semantic().cloned().expect("persistent values are semantic ops");
            match other.weight(id) {
                Some(w) => self.add_persistent(op, n.name.clone(), w.clone()).node,
                None => self.add_persistent_ref(op, n.name.clone(), n.outputs[0].clone()).node,
            }
        } else {
            // Operands of the original's types give the original's outputs
            // (inference is a function of the op and those types).
            let theirs = other.inputs_of(id);
            let same =
                inputs.len() == theirs.len() && inputs.iter().zip(&theirs).all(|(&a, &b)| self.try_ty(a).is_ok_and(|t| t == other.ty(b)));
            if same {
                self.add_typed(n.op.clone(), n.name.clone(), inputs, n.outputs.clone())
            } else {
                self.add(n.op.clone(), n.name.clone(), inputs)?
            }
        };
        self.node_mut(new).origin = n.origin.clone();
        Ok(new)
    }

    /// Sets the provenance of node `id` (sorted, duplicates removed).
    pub fn set_origin(&mut self, id: NodeId, mut origin: Vec<NodeId>) {
        origin.sort();
        origin.dedup();
        self.node_mut(id).origin = origin;
    }

    /// Marks `v` as a graph output named `name`.
    pub fn add_output(&mut self, name: impl Into<String>, v: ValueId) {
        self.outputs.push((name.into(), v));
    }

    /// Replaces the graph outputs.
    pub fn set_outputs(&mut self, outputs: Vec<(String, ValueId)>) {
        self.outputs = outputs;
    }

    /// The node `id`. Panics on a removed id (a compiler bug).
    pub fn node(&self, id: NodeId) -> &Node<O> {
        &self.g[id.0]
    }

    /// The node `id`, mutable.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node<O> {
        &mut self.g[id.0]
    }

    /// Whether `id` is a node of this graph.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.0)
    }

    /// The type of value `v`.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.node(v.node).outputs[v.slot as usize]
    }

    fn try_ty(&self, v: ValueId) -> Result<&TensorType, IrError> {
        self.g
            .node_weight(v.node.0)
            .and_then(|n| n.outputs.get(v.slot as usize))
            .ok_or_else(|| IrError::Invalid(format!("value {v} does not exist")))
    }

    /// The inputs of `id`, in port order.
    pub fn inputs_of(&self, id: NodeId) -> Vec<ValueId> {
        let mut es: Vec<(u32, ValueId)> = self
            .g
            .edges_directed(id.0, Direction::Incoming)
            .map(|e| (e.weight().port, ValueId { node: NodeId(e.source()), slot: e.weight().slot }))
            .collect();
        es.sort_by_key(|&(p, _)| p);
        es.into_iter().map(|(_, v)| v).collect()
    }

    /// The nodes that read any output of `id` (with repetition per use).
    pub fn users_of(&self, id: NodeId) -> Vec<NodeId> {
        self.g.edges_directed(id.0, Direction::Outgoing).map(|e| NodeId(e.target())).collect()
    }

    /// Graph inputs, in order.
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// Graph outputs with their names, in order.
    pub fn outputs(&self) -> &[(String, ValueId)] {
        &self.outputs
    }

    /// The data of persistent node `id` (a constant, parameter or state), if known.
    pub fn weight(&self, id: NodeId) -> Option<&Arc<Tensor>> {
        let n = self.node(id);
        if n.op.is_persistent() {
            self.weights.get(&n.name)
        } else {
            None
        }
    }

    /// Sets the data of a constant node (e.g. filling the weights of a text file).
    pub fn set_weight(&mut self, id: NodeId, data: Tensor) -> Result<(), IrError> {
        let n = self.node(id);
        if !n.op.is_persistent() || n.outputs[0] != *data.ty() {
            return Err(IrError::Invalid(format!("{id} \"{}\" is not a constant of type {}", n.name, data.ty())));
        }
        self.weights.insert(n.name.clone(), Arc::new(data));
        Ok(())
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// All node ids, in index order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices().map(NodeId)
    }

    /// A topological order, deterministic: among ready nodes the lowest index
    /// first. Errors on a cycle.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, IrError> {
        // In-degrees by node index (a stable graph's indices are below its bound).
        let mut indeg = vec![0usize; petgraph::visit::NodeIndexable::node_bound(&self.g)];
        for e in (&self.g).edge_references() {
            indeg[e.target().index()] += 1;
        }
        let mut ready: BinaryHeap<std::cmp::Reverse<NodeIndex<u32>>> =
            self.g.node_indices().filter(|n| indeg[n.index()] == 0).map(std::cmp::Reverse).collect();
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(NodeId(n));
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = &mut indeg[e.target().index()];
                *d -= 1;
                if *d == 0 {
                    ready.push(std::cmp::Reverse(e.target()));
                }
            }
        }
        if order.len() != self.g.node_count() {
            return Err(IrError::Invalid("the graph has a cycle".into()));
        }
        Ok(order)
    }

    /// Removes nodes that no output depends on. Returns how many.
    pub fn remove_dead(&mut self) -> usize {
        let mut live = vec![false; petgraph::visit::NodeIndexable::node_bound(&self.g)];
        let mut stack: Vec<NodeIndex<u32>> = self.outputs.iter().map(|(_, v)| v.node.0).collect();
        stack.extend(self.inputs.iter().map(|n| n.0));
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut live[n.index()], true) {
                stack.extend(self.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        let dead: Vec<_> = self.g.node_indices().filter(|n| !live[n.index()]).collect();
        for &n in &dead {
            let node = self.g.remove_node(n).expect("dead node exists");
            if node.op.is_persistent() && !self.g.node_weights().any(|m| m.op.is_persistent() && m.name == node.name) {
                self.weights.remove(&node.name);
            }
        }
        dead.len()
    }

    /// Total bytes of persistent values (constants, parameters, state).
    pub fn weight_bytes(&self) -> usize {
        self.g.node_weights().filter(|n| n.op.is_persistent()).map(|n| n.outputs[0].bytes()).sum()
    }

    /// Whether every constant has data.
    pub fn has_all_weights(&self) -> bool {
        self.g.node_indices().all(|n| !self.g[n].op.is_persistent() || self.weights.contains_key(&self.g[n].name))
    }
}

/// `"name" (op)` or `op` for error messages.
pub(crate) fn display_name(name: &str, op: &str) -> String {
    if name.is_empty() {
        op.to_string()
    } else {
        format!("\"{name}\" ({op})")
    }
}
