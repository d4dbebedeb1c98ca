//! Training steps as graphs: a model's forward pass, its loss, reverse-mode
//! autodiff (one vector-Jacobian rule per op, `vjp.rs`) and the optimizer's
//! updates, all ops of one semantic graph that the passes fuse and plan like
//! any other.
//!
//! The step is a function of the batch (the model's inputs and the labels)
//! and the persistent values: parameters (the trained float initializers)
//! and state (optimizer moments, the step counter). Its outputs are the
//! loss and, per [`Op::Update`], the new parameter and state, which replace
//! the old ones in place when the step ends (`Op::updated_operand`).

mod vjp;

use crate::{HashMap, HashSet};
use smelt_ir::{CompareOp, DType, Graph, IrError, NodeId, Op, OpSet, Optimizer, ReduceOp, Tensor, TensorType, ValueId};
use std::sync::Arc;

/// The loss a step minimises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// Cross-entropy against integer labels (input `labels`, i64), as
    /// `torch.nn.functional.cross_entropy`: the mean over the labels that
    /// are not [`IGNORE_INDEX`], with label smoothing `0 <= s < 1` as
    /// PyTorch's `label_smoothing`. Logits `[N, C]` (or `[N, C, 1...]`)
    /// take labels `[N]`; per-token logits `[B, S, C]` (rank 3, classes
    /// last, as language models and token classifiers write them) take
    /// labels `[B, S]`; logits `[N, C, d...]` (rank 4 or more, classes
    /// second, as PyTorch's layout for images) take labels `[N, d...]`.
    /// See [`CeLayout`].
    CrossEntropy {
        /// Label smoothing.
        smoothing: f32,
    },
    /// A causal language model's loss, as Hugging Face's `*ForCausalLM`
    /// computes it: logits `[B, S, V]` at position `i` predict label
    /// `i + 1` (labels `[B, S]`, usually the input ids, [`IGNORE_INDEX`]
    /// where no loss is wanted); the per-token cross-entropy of the `S - 1`
    /// shifted pairs.
    CausalLm {
        /// Label smoothing.
        smoothing: f32,
    },
    /// Mean squared error against targets of the output's shape (input
    /// `targets`, f32), mean over every element.
    MeanSquaredError,
    /// Cross-entropy when the output is logits (`[N, C]`, `[N, C, 1...]`),
    /// mean squared error otherwise (with a note saying so).
    Auto {
        /// Label smoothing of the cross-entropy.
        smoothing: f32,
    },
}

/// The label that cross-entropy ignores (PyTorch's `ignore_index`
/// default, which Hugging Face's data collators write for padding).
pub const IGNORE_INDEX: i64 = -100;

/// How cross-entropy reads logits of a shape (see [`Loss::CrossEntropy`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CeLayout {
    /// The classes.
    pub classes: usize,
    /// The logits' axis of the classes: 1, or the last (rank 3).
    pub class_axis: usize,
    /// The labels' shape.
    pub labels: Vec<usize>,
    /// Whether logits at position `i` of axis 1 predict the label at
    /// `i + 1` ([`Loss::CausalLm`]).
    pub shift: bool,
}

impl CeLayout {
    /// The layout of `logits` for plain (`causal` false) or causal-LM
    /// cross-entropy; the error says what shapes would do.
    pub fn of(logits: &[usize], causal: bool) -> Result<CeLayout, String> {
        let r = logits.len();
        if causal {
            return match *logits {
                [b, s, v] if s >= 2 => Ok(CeLayout { classes: v, class_axis: 2, labels: vec![b, s], shift: true }),
                [_, _, _] => Err("a causal language model's loss needs at least 2 positions to predict one".into()),
                _ => Err("a causal language model's loss needs logits [B, S, V]".into()),
            };
        }
        if r < 2 {
            return Err("cross-entropy needs logits [N, C], [B, S, C] or [N, C, d...]".into());
        }
        Ok(if logits[2..].iter().all(|&d| d == 1) {
            CeLayout { classes: logits[1], class_axis: 1, labels: vec![logits[0]], shift: false }
        } else if r == 3 {
            CeLayout { classes: logits[2], class_axis: 2, labels: logits[..2].to_vec(), shift: false }
        } else {
            let mut labels = vec![logits[0]];
            labels.extend_from_slice(&logits[2..]);
            CeLayout { classes: logits[1], class_axis: 1, labels, shift: false }
        })
    }

    /// The labels that enter the loss (after the shift).
    pub fn tokens(&self) -> usize {
        let n: usize = self.labels.iter().product();
        if self.shift {
            n - self.labels[0]
        } else {
            n
        }
    }
}

/// How batch norms train.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum BatchNorm {
    /// As exported for inference: the running statistics normalize (and
    /// stay fixed); scale and bias train.
    #[default]
    Frozen,
    /// Training mode: the batch's statistics normalize, and the running
    /// statistics follow them, `r = (1 - momentum) r + momentum s` (the
    /// variance unbiased), as PyTorch's `model.train()`.
    Train {
        /// PyTorch's momentum (0.1 by default).
        momentum: f32,
    },
}

/// What to train and how.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The loss.
    pub loss: Loss,
    /// The model output the loss reads; `None`: the only one.
    pub loss_on: Option<String>,
    /// The update rule; `None`: the step outputs the gradients (named
    /// `grad:PARAM`) instead of applying them.
    pub optimizer: Option<Optimizer>,
    /// Initializers kept fixed: names, `*` matching any run of characters.
    pub freeze: Vec<String>,
    /// Train exactly the float initializers these match (names, `*`
    /// matching any run of characters; each must match one), instead of
    /// the default rule; `--freeze` still applies. Empty: the default rule.
    pub only: Vec<String>,
    /// How batch norms train.
    pub batch_norm: BatchNorm,
    /// Clip the gradients by their global L2 norm to at most this
    /// (PyTorch's `clip_grad_norm_`, eps 1e-6).
    pub clip_norm: Option<f32>,
    /// Dynamic loss scaling (for f16 training): the loss's gradient starts
    /// at the state `train.loss_scale` (initially 2^16) instead of 1; every
    /// parameter's gradient is multiplied by `1 / scale` when all of them
    /// are finite, and the output `train.grads_finite` (bool `[]`) says
    /// whether they were. The runtime skips the optimizer's updates of a
    /// step whose gradients were not finite and adjusts the scale, as
    /// `torch.amp.GradScaler` does.
    pub loss_scale: bool,
}

/// The loss scale a step with [`TrainConfig::loss_scale`] starts from
/// (`torch.amp.GradScaler`'s `init_scale`).
pub const INITIAL_LOSS_SCALE: f32 = 65536.0;

/// Training errors: the user's model or options (most), or smelt's bug.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// An op on the path from a parameter to the loss has no gradient rule.
    #[error("node {node}: cannot train through it: {why}")]
    NoGradient {
        /// The node, by name and op.
        node: String,
        /// Why.
        why: String,
    },
    /// The options do not fit the model.
    #[error("{0}")]
    Usage(String),
    /// Building the step failed: smelt's bug.
    #[error("compiler bug building the training step: {0}")]
    Bug(IrError),
}

impl TrainError {
    /// Whether this is smelt's fault rather than the user's.
    pub fn is_bug(&self) -> bool {
        matches!(self, TrainError::Bug(_))
    }
}

/// A training step.
#[derive(Clone, Debug)]
pub struct TrainStep {
    /// The step's graph: inputs are the model's inputs and the labels (or
    /// targets); outputs the loss, then the updated values or gradients.
    pub graph: Graph,
    /// The trained parameters, by name, in graph order.
    pub params: Vec<String>,
    /// Nodes of the forward pass and the loss (everything else is backward
    /// or update).
    pub forward: HashSet<NodeId>,
    /// What smelt decided that the user should know (a softmax skipped...).
    pub notes: Vec<String>,
    /// The loss (never [`Loss::Auto`]).
    pub loss: Loss,
    /// Every float initializer of the model: trained or not, and why not.
    pub initializers: Vec<Initializer>,
}

/// A float initializer of the model and what training does with it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Initializer {
    /// Its name in the model.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Whether the step trains it.
    pub trained: bool,
    /// Why it is not trained (`None` when it is).
    pub frozen_because: Option<String>,
    /// The initializer it is the transpose of (tied weights: one
    /// parameter, trained as the source; saved as its transpose).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tied_to: Option<String>,
    /// The name of the PyTorch parameter it holds where the file's name is
    /// the exporter's (`onnx::MatMul_530`) and its node's name says
    /// (`--trainable` takes either).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pytorch_name: Option<String>,
}

/// Whether `name` matches `pattern` (`*` matches any run of characters).
pub fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// The last part of the names PyTorch gives its buffers (state that is not
/// a parameter: `requires_grad` off) in the models people export: batch
/// norms' statistics, rotary frequencies and caches, position and token type
/// ids, a positional encoding table (`pe`; `weights`, as M2M100's and
/// XGLM's sinusoidal tables), masks, Swin's relative position index.
const BUFFERS: [&str; 15] = [
    "running_mean",
    "running_var",
    "num_batches_tracked",
    "inv_freq",
    "original_inv_freq",
    "position_ids",
    "token_type_ids",
    "relative_position_index",
    "cos_cached",
    "sin_cached",
    "pe",
    "attn_mask",
    "masked_bias",
    "causal_mask",
    "weights",
];

/// What an initializer's name says it is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Named {
    /// A module path (`model.layers.0.mlp.up_proj.weight`): PyTorch's
    /// exporters keep the names of parameters they write as they are.
    Parameter,
    /// A module path ending in a buffer's name ([`BUFFERS`]).
    Buffer,
    /// Anything else: an exporter's name for a value it computed
    /// (`onnx::MatMul_530`, `/m/Constant_output_0`, `val_26`), or another
    /// tool's convention. The structural rule decides.
    Other,
}

fn named(name: &str) -> Named {
    let path = name.contains('.')
        && !name.starts_with('/')
        && !name.contains("::")
        && name.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'));
    match name.rsplit('.').next() {
        _ if !path => Named::Other,
        Some(last) if BUFFERS.contains(&last) => Named::Buffer,
        _ => Named::Parameter,
    }
}

/// The values trained by default. The graph's parameters (a text model
/// declares them with `param`); float initializers named by a module path
/// (what PyTorch's exporters write for a parameter), but for buffers'
/// names; and, whatever their names, the float initializers that are a
/// layer's weights or bias, a normalization's scale and bias, or a bias
/// added to a layer's output (through views and transposes: exporters
/// transpose a linear layer's weight before its MatMul, and fold the
/// transpose into a new initializer). A bias has at most one dimension
/// over 1: a constant added to a layer's output with more is a mask.
fn trainable(g: &Graph) -> HashSet<NodeId> {
    let mut out: HashSet<NodeId> = g.node_ids().filter(|&n| g.node(n).op == Op::Parameter).collect();
    for n in g.node_ids() {
        let node = g.node(n);
        if node.op == Op::Constant && named(&node.name) == Named::Parameter && candidate(g, n) {
            out.insert(n);
        }
    }
    for n in g.node_ids() {
        let ins = g.inputs_of(n);
        let picked: Vec<usize> = match &g.node(n).op {
            Op::Binary(smelt_ir::BinaryOp::Add) | Op::Sum => {
                // A layer's output: an op with weights that is not a norm (conv, GEMM, matmul).
                let layer = ins.iter().any(|&v| {
                    use smelt_ir::traits::Operands as O;
                    matches!(g.node(through_views(g, v)).op.cuts().operands, O::WeightsAfterFirst | O::Factors)
                });
                if layer {
                    (0..ins.len()).filter(|&i| bias_shaped(&g.ty(ins[i]).shape)).collect()
                } else {
                    vec![]
                }
            }
            // A layer's weights, a norm's scale and bias: the fact table's.
            op => {
                let operands = op.cuts().operands;
                (0..ins.len()).filter(|&i| operands.is_weight(i, ins.len())).collect()
            }
        };
        for i in picked {
            let src = through_views(g, ins[i]);
            if g.node(src).op == Op::Constant && named(&g.node(src).name) != Named::Buffer && candidate(g, src) {
                out.insert(src);
            }
        }
    }
    out
}

/// The value `v` is a view or transpose of.
fn through_views(g: &Graph, mut v: ValueId) -> NodeId {
    loop {
        let op = &g.node(v.node).op;
        if op.traits().kind == smelt_ir::traits::Kind::View || matches!(op, Op::Transpose { .. }) {
            v = g.inputs_of(v.node)[0];
        } else {
            return v.node;
        }
    }
}

/// A float initializer that can train: f32, not a scalar, not a mask.
fn candidate(g: &Graph, n: NodeId) -> bool {
    let t = &g.node(n).outputs[0];
    t.dtype == DType::F32 && !t.shape.is_empty() && !g.weight(n).is_some_and(|t| is_mask(t))
}

/// At most one dimension over 1: a bias's shape, not a mask's.
fn bias_shaped(shape: &[usize]) -> bool {
    shape.iter().filter(|&&d| d > 1).count() <= 1
}

/// Tied weights as exporters write them: one PyTorch parameter used twice
/// (an embedding table and the LM head that shares it) reaches the file as
/// two initializers, one the exact transpose of the other. Each copy maps
/// to its source (the one named by a module path, else the first).
fn ties(g: &Graph, floats: &[NodeId]) -> HashMap<NodeId, NodeId> {
    let mats: Vec<(NodeId, &[f32], usize, usize)> = floats
        .iter()
        .filter_map(|&n| {
            let t = g.weight(n)?;
            match (g.node(n).op == Op::Constant, t.shape(), t.data()) {
                (true, &[r, c], smelt_ir::TensorData::F32(v)) => Some((n, v.as_slice(), r, c)),
                _ => None,
            }
        })
        .collect();
    // A copy has the exporter's name; its source, a parameter's (two
    // parameters that happen to be transposes, as identity inits, stay two).
    let mut out = HashMap::default();
    for &(copy, vc, r, c) in mats.iter().filter(|m| named(&g.node(m.0).name) == Named::Other) {
        // Equal values everywhere (a fresh norm's ones) prove nothing.
        if vc.is_empty() || vc.iter().all(|&x| x.to_bits() == vc[0].to_bits()) {
            continue;
        }
        let is_transpose = |vs: &[f32]| {
            // vs is [c, r]: vs[j * r + i] == vc[i * c + j]; a few positions first.
            let at = |k: usize| (k / c, k % c);
            let n = r * c;
            let probe = [0, n / 3, n / 2, 2 * n / 3, n - 1];
            probe.iter().copied().chain(0..n).all(|k| {
                let (i, j) = at(k);
                vs[j * r + i].to_bits() == vc[k].to_bits()
            })
        };
        let source = mats
            .iter()
            .find(|&&(s, vs, sr, sc)| s != copy && (sr, sc) == (c, r) && named(&g.node(s).name) == Named::Parameter && is_transpose(vs));
        if let Some(&(s, ..)) = source {
            out.insert(copy, s);
        }
    }
    out
}

/// PyTorch's names of the weights the TorchScript exporter folded into new
/// initializers (a linear layer's transposed weight, `onnx::MatMul_530`):
/// the module path its MatMul or Gemm node's name holds
/// (`/model/layers.0/mlp/up_proj/MatMul`), and `.weight`.
fn aliases(g: &Graph, floats: &[NodeId]) -> HashMap<NodeId, String> {
    let mut modules: HashMap<NodeId, HashSet<String>> = HashMap::default();
    for n in g.node_ids() {
        let node = g.node(n);
        if !matches!(node.op, Op::MatMul | Op::Gemm { .. }) || !node.name.starts_with('/') {
            continue;
        }
        let Some((path, _)) = node.name[1..].rsplit_once('/') else { continue };
        // The weight: a MatMul's or Gemm's second operand (not a Gemm's bias).
        for v in g.inputs_of(n).into_iter().skip(1).take(1) {
            let src = through_views(g, v);
            if g.node(src).op == Op::Constant && named(&g.node(src).name) == Named::Other {
                modules.entry(src).or_default().insert(format!("{}.weight", path.replace('/', ".")));
            }
        }
    }
    floats
        .iter()
        .filter_map(|n| {
            let m = modules.get(n).filter(|m| m.len() == 1)?;
            Some((*n, m.iter().next()?.clone()))
        })
        .collect()
}

/// Parameters an exporter may have merged: an initializer named by a
/// module path that several nodes of one kind read, in different modules
/// where the node names say (the TorchScript exporter writes one
/// initializer for parameters of equal values, as a fresh model's norms).
fn merged(g: &Graph, floats: &[NodeId]) -> Vec<String> {
    // Readers through views: the exporter reads a merged initializer
    // through an Identity per use.
    let mut readers: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    for n in g.node_ids() {
        let op = &g.node(n).op;
        if op.traits().kind == smelt_ir::traits::Kind::View || matches!(op, Op::Transpose { .. }) {
            continue;
        }
        for v in g.inputs_of(n) {
            readers.entry(through_views(g, v)).or_default().push(n);
        }
    }
    // The module path of a TorchScript node name, calls of one module
    // (`/encoder/...`, `/encoder_1/...`) as one.
    let module = |n: NodeId| {
        let name = &g.node(n).name;
        name.starts_with('/').then(|| {
            let path = name.rsplit_once('/').map_or("", |p| p.0);
            path.split('/')
                .map(|part| match part.rsplit_once('_') {
                    Some((head, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => head,
                    _ => part,
                })
                .collect::<Vec<_>>()
                .join("/")
        })
    };
    let mut out = Vec::new();
    for &p in floats {
        let node = g.node(p);
        if named(&node.name) != Named::Parameter || node.outputs[0].shape.is_empty() {
            continue;
        }
        let Some(rs) = readers.get(&p) else { continue };
        let mut by_kind: std::collections::BTreeMap<String, Vec<NodeId>> = Default::default();
        for &r in rs {
            let op = &g.node(r).op;
            if matches!(op, Op::Binary(_) | Op::LayerNorm { .. } | Op::MatMul | Op::Gemm { .. } | Op::Conv(_) | Op::Gather { .. }) {
                by_kind.entry(format!("{:?}", std::mem::discriminant(op))).or_default().push(r);
            }
        }
        if let Some(rs) = by_kind.values().find(|rs| {
            let modules: HashSet<Option<String>> = rs.iter().map(|&r| module(r)).collect();
            rs.len() > 1 && (modules.len() > 1 || modules.contains(&None))
        }) {
            let names: Vec<&str> = rs.iter().take(3).map(|&r| g.node(r).name.as_str()).collect();
            out.push(format!(
                "initializer {:?} is read by {} nodes of one kind ({}{}): if those are separate parameters in PyTorch, the exporter merged them because their values were equal (a fresh model's norms), and smelt trains one; export with training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False (TorchScript) or optimize=False (dynamo)",
                node.name,
                rs.len(),
                names.join(", "),
                if rs.len() > 3 { ", ..." } else { "" }
            ));
        }
    }
    out
}

/// Whether `t` is an additive mask rather than a bias: it holds values at
/// or below -1e30 (exporters fold a causal or padding mask into a constant
/// of 0 and -inf, or of `torch.finfo(float32).min`, added to the scores).
fn is_mask(t: &Tensor) -> bool {
    t.ty().dtype.is_float() && t.to_f32_vec().iter().any(|&x| x <= -1e30)
}

/// Builds the training step of `model` (a verified semantic graph).
pub fn training_step(model: &Graph, cfg: &TrainConfig) -> Result<TrainStep, TrainError> {
    let bug = TrainError::Bug;
    if let Some(o) = &cfg.optimizer {
        o.check().map_err(TrainError::Usage)?;
    }
    let mut notes = Vec::new();
    // The loss's operand.
    let outputs = model.outputs();
    let (out_name, mut out_v) = match &cfg.loss_on {
        Some(name) => outputs.iter().find(|(n, _)| n == name).cloned().ok_or_else(|| {
            let names: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
            TrainError::Usage(format!("--loss-on {name}: the model has no output {name:?} (its outputs: {})", names.join(", ")))
        })?,
        None if outputs.len() == 1 => outputs[0].clone(),
        None => {
            let names: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
            return Err(TrainError::Usage(format!(
                "the model has {} outputs ({}): choose the one the loss reads with --loss-on",
                names.len(),
                names.join(", ")
            )));
        }
    };
    let logits = |t: &TensorType| t.shape.len() >= 2 && t.shape[2..].iter().all(|&d| d == 1);
    let loss_kind = match cfg.loss {
        Loss::Auto { smoothing } if logits(model.ty(out_v)) => Loss::CrossEntropy { smoothing },
        Loss::Auto { smoothing } if smoothing != 0.0 => {
            return Err(TrainError::Usage(format!(
                "--label-smoothing is the cross-entropy's, and output {out_name:?} is {}, not logits [N, C], so the loss is the mean squared error: drop --label-smoothing, or say --loss ce (per-token logits) or causal-lm",
                model.ty(out_v)
            )))
        }
        Loss::Auto { .. } => {
            notes.push(format!(
                "output {out_name:?} is {}, not logits [N, C]: the loss is the mean squared error against `targets` (--loss ce for per-token cross-entropy, causal-lm for a language model, mse to say so)",
                model.ty(out_v)
            ));
            Loss::MeanSquaredError
        }
        l => l,
    };
    let layout = match loss_kind {
        Loss::CrossEntropy { .. } | Loss::CausalLm { .. } => Some(
            CeLayout::of(&model.ty(out_v).shape, matches!(loss_kind, Loss::CausalLm { .. }))
                .map_err(|why| TrainError::Usage(format!("output {out_name:?} is {}: {why}", model.ty(out_v))))?,
        ),
        _ => None,
    };
    if let Some(layout) = &layout {
        if let Op::Softmax { axis } = model.node(out_v.node).op {
            if axis == layout.class_axis {
                notes.push(format!(
                    "output {out_name:?} is a softmax: cross-entropy is computed on its input (node \"{}\"'s operand), as frameworks train",
                    model.node(out_v.node).name
                ));
                out_v = model.inputs_of(out_v.node)[0];
            }
        }
    }
    let floats: Vec<NodeId> = model
        .node_ids()
        .filter(|&n| matches!(model.node(n).op, Op::Constant | Op::Parameter) && model.node(n).outputs[0].dtype.is_float())
        .collect();
    let alias = aliases(model, &floats);
    let named_by = |p: &str, n: NodeId| matches(p, &model.node(n).name) || alias.get(&n).is_some_and(|a| matches(p, a));
    let freeze = |n: NodeId| cfg.freeze.iter().find(|p| named_by(p, n));
    for p in &cfg.only {
        if !floats.iter().any(|&n| named_by(p, n)) {
            return Err(TrainError::Usage(format!(
                "--trainable/--train-only {p:?}: no float initializer of the model has that name (an exporter may have folded it into a constant, or merged equal initializers into one: export with do_constant_folding=False, in training mode)"
            )));
        }
    }
    let by_rule = trainable(model);
    // A tied copy trains as its source does, as one parameter.
    let tied = ties(model, &floats);
    let chosen = |n: NodeId| {
        model.node(n).op == Op::Parameter
            || if cfg.only.is_empty() { by_rule.contains(&n) } else { cfg.only.iter().any(|p| named_by(p, n)) }
    };
    notes.extend(merged(model, &floats));
    // A batch norm's running statistics are never parameters (PyTorch's
    // buffers); `--batch-norm train` makes them state. An exporter may have
    // merged one with a parameter of equal values (a fresh model's zero
    // means and zero biases, unit variances and unit scales): that
    // initializer trains in its other roles and the batch norm reads a
    // frozen copy of it.
    let norms: Vec<NodeId> = model.node_ids().filter(|&n| matches!(model.node(n).op, Op::BatchNorm { .. })).collect();
    let stat_reads: HashSet<ValueId> = norms.iter().flat_map(|&n| model.inputs_of(n)[3..].to_vec()).collect();
    // Every read but a batch norm's of its statistics, through views.
    let mut other_reads: HashSet<NodeId> = HashSet::default();
    for n in model.node_ids() {
        let op = &model.node(n).op;
        if op.traits().kind == smelt_ir::traits::Kind::View || matches!(op, Op::Transpose { .. }) {
            continue;
        }
        for (i, v) in model.inputs_of(n).iter().enumerate() {
            if !(matches!(op, Op::BatchNorm { .. }) && i >= 3) {
                other_reads.insert(through_views(model, *v));
            }
        }
    }
    let statistics: HashSet<NodeId> = stat_reads.iter().map(|&v| through_views(model, v)).filter(|n| !other_reads.contains(n)).collect();
    let shared: HashSet<NodeId> = stat_reads.iter().map(|&v| through_views(model, v)).filter(|n| other_reads.contains(n)).collect();
    let mut merged_stats: Vec<NodeId> = shared.iter().copied().collect();
    merged_stats.sort_by_key(|&n| model.node(n).name.clone());
    for n in merged_stats {
        notes.push(format!(
            "initializer {:?} is a batch norm's running statistic and also read as a parameter (the exporter merged initializers of equal values): it trains as the parameter, and the batch norm reads its exported value, fixed",
            model.node(n).name
        ));
    }
    // A tied pair is one parameter: chosen by either's name, frozen by
    // either's; it trains as its source.
    let train: HashSet<NodeId> = floats
        .iter()
        .copied()
        .filter(|&n| {
            let pair: Vec<NodeId> = std::iter::once(n).chain(tied.iter().filter(|t| *t.1 == n).map(|t| *t.0)).collect();
            !tied.contains_key(&n)
                && !statistics.contains(&n)
                && pair.iter().any(|&m| chosen(m))
                && pair.iter().all(|&m| freeze(m).is_none())
        })
        .collect();
    // The forward pass, trained initializers as parameters.
    let mut g = Graph::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::default();
    let mut params: Vec<(String, ValueId)> = Vec::new();
    // Batch norms in training mode: their running statistics become state.
    let mut running: HashSet<NodeId> = HashSet::default();
    if let BatchNorm::Train { .. } = cfg.batch_norm {
        for n in model.node_ids().filter(|&n| matches!(model.node(n).op, Op::BatchNorm { .. })) {
            for v in &model.inputs_of(n)[3..] {
                let src = through_views(model, *v);
                if shared.contains(&src) {
                    return Err(TrainError::Usage(format!(
                        "batch norm {:?}: its running statistic is initializer {:?}, which the model also reads as a parameter (the exporter merged initializers of equal values, as a fresh model's zero means and biases): --batch-norm train needs them apart; export with distinct values, or keep batch norms frozen",
                        model.node(n).name,
                        model.node(src).name
                    )));
                }
                if model.node(v.node).op.is_persistent() {
                    running.insert(v.node);
                } else {
                    let what = if model.node(src).op.is_persistent() {
                        format!("{} of initializer {:?}", model.node(v.node).op.name(), model.node(src).name)
                    } else {
                        format!("computed by node {:?} ({})", model.node(v.node).name, model.node(v.node).op.name())
                    };
                    return Err(TrainError::Usage(format!(
                        "batch norm {:?}: its running statistics must be initializers to follow the batch, but one is {what}",
                        model.node(n).name
                    )));
                }
            }
        }
    }
    // What happens to each float initializer, and why.
    let gathered: HashSet<NodeId> =
        model.node_ids().filter(|&n| matches!(model.node(n).op, Op::Gather { .. })).map(|n| model.inputs_of(n)[0].node).collect();
    let initializers: Vec<Initializer> = floats
        .iter()
        .map(|&n| {
            let source = tied.get(&n).copied();
            let (node, trained) = (model.node(n), train.contains(&source.unwrap_or(n)) && !running.contains(&n));
            let frozen_because = (!trained).then(|| {
                if let Some(s) = source {
                    format!("the transpose of {:?} (tied weights), which is frozen", model.node(s).name)
                } else if running.contains(&n) {
                    "a batch norm's running statistic: state that follows the batch (--batch-norm train)".to_string()
                } else if statistics.contains(&n) {
                    "a batch norm's running statistic, fixed as exported (--batch-norm train updates it)".to_string()
                } else if let Some(p) = freeze(n) {
                    format!("--freeze {p}")
                } else if !cfg.only.is_empty() {
                    "not named by --trainable or --train-only".to_string()
                } else if node.outputs[0].shape.is_empty() {
                    "a scalar constant".to_string()
                } else if model.weight(n).is_some_and(|t| is_mask(t)) {
                    "an additive mask (values at or below -1e30): a constant the exporter folded, not a bias".to_string()
                } else if named(&node.name) == Named::Buffer {
                    "named as a PyTorch buffer, not a parameter".to_string()
                } else if gathered.contains(&n) {
                    "a table a Gather reads under a name the exporter made up: a constant it computed (with do_constant_folding or the dynamo optimizer, a parameter gathered by constant indices, as position embeddings, is folded into one: export without folding to train it), or name it with --trainable".to_string()
                } else {
                    "not named by a module path, and not a conv, gemm or matmul operand, a norm's scale or bias, or a bias added to a layer (one dimension over 1): a constant the exporter computed; name it with --trainable or --train-only to train it".to_string()
                }
            });
            let tied_to = source.map(|s| model.node(s).name.clone());
            let pytorch_name = alias.get(&n).cloned();
            Initializer { name: node.name.clone(), shape: node.outputs[0].shape.clone(), trained, frozen_because, tied_to, pytorch_name }
        })
        .collect();
    let step = match (cfg.optimizer, cfg.batch_norm) {
        (None, BatchNorm::Frozen) => None,
        _ => Some(g.add_persistent(Op::State, "train.step", Arc::new(Tensor::from_f32(vec![], vec![0.0])))),
    };
    let mut stat_updates: Vec<(String, ValueId)> = Vec::new();
    // Initializers first, tied copies after their sources.
    let mut order = model.topo_order().map_err(bug)?;
    order.sort_by_key(|&n| (!model.inputs_of(n).is_empty(), tied.contains_key(&n)));
    for id in order {
        let node = model.node(id);
        let source = tied.get(&id).filter(|s| train.contains(s));
        let new = if let Some(s) = source {
            let t = g.add(Op::Transpose { perm: vec![1, 0] }, node.name.clone(), &[map[&ValueId { node: *s, slot: 0 }]]).map_err(bug)?;
            g.set_origin(t, vec![]);
            t
        } else if running.contains(&id) {
            persistent(&mut g, Op::State, &node.name, &node.outputs[0], model.weight(id).cloned()).node
        } else if let (Op::BatchNorm { epsilon }, BatchNorm::Train { momentum }) = (&node.op, cfg.batch_norm) {
            let ins: Vec<ValueId> = model.inputs_of(id).iter().map(|v| map[v]).collect();
            let step = step.expect("made for batch norm in training mode");
            let (y, updates) = batch_norm_train(&mut g, &node.name, &ins, *epsilon, momentum, step)?;
            stat_updates.extend(updates);
            y.node
        } else if train.contains(&id) {
            let v = persistent(&mut g, Op::Parameter, &node.name, &node.outputs[0], model.weight(id).cloned());
            params.push((g.node(v.node).name.clone(), v));
            v.node
        } else if matches!(node.op, Op::BatchNorm { .. })
            && model.inputs_of(id)[3..].iter().any(|v| train.contains(&through_views(model, *v)))
        {
            // A statistic merged with a trained parameter: its exported value.
            let mut ins: Vec<ValueId> = model.inputs_of(id).iter().map(|v| map[v]).collect();
            for (i, v) in model.inputs_of(id).iter().enumerate().skip(3) {
                let src = through_views(model, *v);
                if train.contains(&src) {
                    let t = model.weight(src).ok_or_else(|| TrainError::Usage(format!("{:?} has no value", model.node(src).name)))?;
                    let frozen = Tensor::from_f32(model.ty(*v).shape.clone(), t.to_f32_vec());
                    ins[i] = g.add_constant(format!("{}.running.{i}", node.name), frozen);
                }
            }
            g.copy_node_from(model, id, &ins).map_err(bug)?
        } else {
            let ins: Vec<ValueId> = model.inputs_of(id).iter().map(|v| map[v]).collect();
            g.copy_node_from(model, id, &ins).map_err(bug)?
        };
        g.set_origin(new, vec![]);
        for slot in 0..node.outputs.len() {
            map.insert(ValueId { node: id, slot: slot as u32 }, ValueId { node: new, slot: slot as u32 });
        }
    }
    if params.is_empty() {
        return Err(TrainError::Usage(
            "nothing to train: no float initializer feeds a layer, a norm or a bias (or --freeze matched them all)".into(),
        ));
    }
    let pred = map[&out_v];
    let pty = g.ty(pred).clone();
    if pty.dtype != DType::F32 {
        return Err(TrainError::Usage(format!(
            "output {out_name:?} is {pty}: training needs an f32 model (mixed precision is applied by --precision)"
        )));
    }
    // The loss.
    let mut ad = vjp::Ad::new(&mut g);
    ad.name = "loss".into();
    let taken: HashSet<String> = model.inputs().iter().map(|&i| model.node(i).name.clone()).collect();
    let input_name = |base: &str| {
        std::iter::once(base.to_string()).chain((1..).map(|i| format!("{base}.{i}"))).find(|n| !taken.contains(n)).expect("free")
    };
    let loss = match loss_kind {
        Loss::Auto { .. } => unreachable!("resolved above"),
        Loss::CrossEntropy { smoothing } | Loss::CausalLm { smoothing } => {
            let layout = layout.as_ref().expect("made above for cross-entropy");
            if !(0.0..1.0).contains(&smoothing) {
                return Err(TrainError::Usage(format!("label smoothing {smoothing} must be in [0, 1)")));
            }
            let (c, rank) = (layout.classes, pty.shape.len());
            let labels = ad.g.add_input(input_name("labels"), TensorType::new(DType::I64, layout.labels.clone())).map_err(bug)?;
            // Classes last: [N, C, d...] moves C to the end.
            let mut z = pred;
            if layout.class_axis != rank - 1 {
                let perm: Vec<usize> = std::iter::once(0).chain(2..rank).chain(std::iter::once(1)).collect();
                z = ad.op(Op::Transpose { perm }, &[z])?;
            }
            let mut lab = labels;
            if layout.shift {
                // Position i predicts label i + 1.
                let s = pty.shape[1] as i64;
                z = ad.op(Op::Slice { axes: vec![1], starts: vec![0], ends: vec![s - 1], steps: vec![1] }, &[z])?;
                lab = ad.op(Op::Slice { axes: vec![1], starts: vec![1], ends: vec![s], steps: vec![1] }, &[lab])?;
            }
            let t = layout.tokens();
            let z = ad.reshape(z, vec![t, c])?;
            let lab = ad.reshape(lab, vec![t, 1])?;
            let ls = ad.op(Op::LogSoftmax { axis: 1 }, &[z])?;
            let classes = ad.g.add_constant("loss.classes", Tensor::from_i64(vec![1, c], (0..c as i64).collect()));
            let eq = ad.op(Op::Compare(CompareOp::Equal), &[lab, classes])?;
            let on = ad.scalar(1.0 - smoothing + smoothing / c as f32);
            let off = ad.scalar(smoothing / c as f32);
            let target = ad.op(Op::Where, &[eq, on, off])?;
            // Labels at IGNORE_INDEX weigh 0 and do not count.
            let ignore = ad.g.add_constant("loss.ignore_index", Tensor::from_i64(vec![], vec![IGNORE_INDEX]));
            let ignored = ad.op(Op::Compare(CompareOp::Equal), &[lab, ignore])?;
            let kept = ad.op(Op::Not, &[ignored])?;
            let weight = ad.op(Op::Cast { to: DType::F32 }, &[kept])?;
            let p = ad.mul(target, ls)?;
            let p = ad.mul(p, weight)?;
            let s = ad.sum(p, vec![0, 1], false)?;
            let count = ad.sum(weight, vec![0, 1], false)?;
            let one = ad.scalar(1.0);
            let count = ad.bin(smelt_ir::BinaryOp::Max, count, one)?;
            let mean = ad.bin(smelt_ir::BinaryOp::Div, s, count)?;
            ad.mul_c(mean, -1.0)?
        }
        Loss::MeanSquaredError => {
            let t = ad.g.add_input(input_name("targets"), pty.clone()).map_err(bug)?;
            let d = ad.bin(smelt_ir::BinaryOp::Sub, pred, t)?;
            let sq = ad.mul(d, d)?;
            ad.op(Op::Reduce { op: ReduceOp::Mean, axes: (0..pty.shape.len()).collect(), keepdims: false }, &[sq])?
        }
    };
    let forward: HashSet<NodeId> = ad.g.node_ids().collect();
    // Backward: which values depend on a parameter.
    let order = ad.g.topo_order().map_err(bug)?;
    let mut needs: HashSet<ValueId> = params.iter().map(|p| p.1).collect();
    for &n in &order {
        let diff = !matches!(ad.g.node(n).op, Op::Compare(_) | Op::Logic(_) | Op::Not | Op::IsNaN);
        if diff && ad.g.inputs_of(n).iter().any(|v| needs.contains(v)) {
            for (slot, t) in ad.g.node(n).outputs.iter().enumerate() {
                if t.dtype.is_float() {
                    needs.insert(ValueId { node: n, slot: slot as u32 });
                }
            }
        }
    }
    let mut grads: HashMap<ValueId, Vec<ValueId>> = HashMap::default();
    if cfg.loss_scale && cfg.optimizer.is_some_and(|o| o.accumulate() > 1) {
        return Err(TrainError::Usage("loss scaling with --accumulate is not supported yet: use --precision mixed-bf16, or f32".into()));
    }
    let scale = cfg.loss_scale.then(|| {
        let one = TensorType::new(DType::F32, vec![]);
        persistent(ad.g, Op::State, "train.loss_scale", &one, Some(Arc::new(Tensor::from_f32(vec![], vec![INITIAL_LOSS_SCALE]))))
    });
    let seed = match scale {
        Some(s) => s,
        None => ad.g.add_constant("loss.seed", Tensor::from_f32(vec![], vec![1.0])),
    };
    grads.insert(loss, vec![seed]);
    let mut total: HashMap<ValueId, ValueId> = HashMap::default();
    // Convolutions differentiated with the batch norm that reads them.
    let mut done: HashSet<NodeId> = HashSet::default();
    for &n in order.iter().rev() {
        if done.contains(&n) {
            continue;
        }
        let node = ad.g.node(n);
        let slots = node.outputs.len();
        ad.name = node.name.clone();
        let mut dys = Vec::with_capacity(slots);
        for slot in 0..slots {
            let v = ValueId { node: n, slot: slot as u32 };
            let d = match grads.remove(&v) {
                None => None,
                Some(parts) if parts.len() == 1 => Some(parts[0]),
                Some(parts) => Some(ad.op(Op::Sum, &parts)?),
            };
            if let Some(d) = d {
                total.insert(v, d);
            }
            dys.push(d);
        }
        if dys.iter().all(Option::is_none) || ad.g.node(n).op.is_persistent() {
            continue;
        }
        let ins = ad.g.inputs_of(n);
        let need: Vec<bool> = ins.iter().map(|v| needs.contains(v)).collect();
        if !need.iter().any(|&b| b) {
            continue;
        }
        if let Some(conv) = conv_of_frozen_norm(ad.g, n, &needs) {
            let cins = ad.g.inputs_of(conv);
            let cneed: Vec<bool> = cins.iter().map(|v| needs.contains(v)).collect();
            let dy = dys[0].expect("has a gradient");
            let (dc, db) = vjp::conv_batch_norm(&mut ad, conv, n, dy, &cneed, &need)?;
            for (v, d) in cins.into_iter().zip(dc).chain(ins.into_iter().zip(db)) {
                if let Some(d) = d {
                    grads.entry(v).or_default().push(d);
                }
            }
            done.insert(conv);
            continue;
        }
        let contribs = vjp::vjp(&mut ad, n, &dys, &need)?;
        for (v, d) in ins.into_iter().zip(contribs) {
            if let Some(d) = d {
                grads.entry(v).or_default().push(d);
            }
        }
    }
    // Loss scaling: the gradients unscaled when all are finite (the sum of
    // their magnitudes, in f32, is), zeroed otherwise; the flag is an output.
    let mut finite = None;
    if let Some(scale) = scale {
        ad.name = "unscale".into();
        let mut sums = Vec::new();
        for (_, p) in &params {
            if let Some(&d) = total.get(p) {
                let a = ad.un(smelt_ir::UnaryOp::Abs, d)?;
                let r = ad.shape(a).len();
                sums.push(ad.sum(a, (0..r).collect(), false)?);
            }
        }
        if !sums.is_empty() {
            let all = if sums.len() == 1 { sums[0] } else { ad.op(Op::Sum, &sums)? };
            let max = ad.scalar(f32::MAX);
            let ok = ad.op(Op::Compare(CompareOp::Less), &[all, max])?;
            let inv = ad.un(smelt_ir::UnaryOp::Reciprocal, scale)?;
            let zero = ad.scalar(0.0);
            let coef = ad.op(Op::Where, &[ok, inv, zero])?;
            for (_, p) in &params {
                if let Some(d) = total.get(p).copied() {
                    let unscaled = ad.mul(d, coef)?;
                    total.insert(*p, unscaled);
                }
            }
            finite = Some(ok);
        }
    }
    // Clipping by the global norm: every gradient scaled by
    // min(1, max / (norm + 1e-6)) once all are known.
    if let Some(max) = cfg.clip_norm {
        if cfg.optimizer.is_some_and(|o| o.accumulate() > 1) {
            return Err(TrainError::Usage(
                "--clip-norm with --accumulate is not supported yet (the accumulated gradient is what PyTorch clips)".into(),
            ));
        }
        ad.name = "clip".into();
        let mut squares = Vec::new();
        for (_, p) in &params {
            if let Some(&d) = total.get(p) {
                let sq = ad.mul(d, d)?;
                let r = ad.shape(sq).len();
                squares.push(ad.sum(sq, (0..r).collect(), false)?);
            }
        }
        if !squares.is_empty() {
            let all = if squares.len() == 1 { squares[0] } else { ad.op(Op::Sum, &squares)? };
            let norm = ad.un(smelt_ir::UnaryOp::Sqrt, all)?;
            let eps = ad.scalar(1e-6);
            let den = ad.bin(smelt_ir::BinaryOp::Add, norm, eps)?;
            let m = ad.scalar(max);
            let coef = ad.bin(smelt_ir::BinaryOp::Div, m, den)?;
            let one = ad.scalar(1.0);
            let coef = ad.bin(smelt_ir::BinaryOp::Min, coef, one)?;
            for (_, p) in &params {
                if let Some(d) = total.get(p).copied() {
                    let clipped = ad.mul(d, coef)?;
                    total.insert(*p, clipped);
                }
            }
        }
    }
    // The updates (or the gradients as outputs).
    let mut outs = vec![(fresh_output(&params, "loss"), loss)];
    if let Some(ok) = finite {
        outs.push(("train.grads_finite".into(), ok));
    }
    let mut trained = Vec::new();
    outs.extend(stat_updates);
    for (name, p) in &params {
        let Some(&d) = total.get(p) else {
            notes.push(format!("parameter {name:?} does not reach the loss: not trained"));
            continue;
        };
        trained.push(name.clone());
        match (cfg.optimizer, step) {
            (Some(o), Some(step)) => {
                let ty = ad.g.ty(*p).clone();
                let mut ins = vec![*p, d, step];
                let mut suffixes: Vec<&str> = if o.accumulate() > 1 { vec!["grad_acc"] } else { vec![] };
                suffixes.extend_from_slice(match o {
                    Optimizer::Sgd { .. } => &["momentum"],
                    _ => &["adam_m", "adam_v"],
                });
                for s in &suffixes[..o.states()] {
                    // Zeros, allocated only where the parameter has data (a text
                    // model's may not: planning needs no values).
                    let zeros = ad.g.weight(p.node).map(|_| Arc::new(Tensor::full(&ty, 0.0)));
                    ins.push(persistent(ad.g, Op::State, &format!("{name}.{s}"), &ty, zeros));
                }
                let u = ad.g.add(Op::Update(o), format!("{name}.update"), &ins).map_err(bug)?;
                for slot in 0..ad.g.node(u).outputs.len() {
                    let target = ins[Op::Update(o).updated_operand(slot).expect("an update")];
                    outs.push((ad.g.node(target.node).name.clone(), ValueId { node: u, slot: slot as u32 }));
                }
            }
            _ => outs.push((format!("grad:{name}"), d)),
        }
    }
    if let Some(step) = step {
        let u = ad.g.add(Op::Update(Optimizer::Count), "train.step.update", &[step]).map_err(bug)?;
        outs.push(("train.step".into(), ValueId { node: u, slot: 0 }));
    }
    g.set_outputs(outs);
    g.remove_dead();
    let forward = forward.into_iter().filter(|&n| g.contains(n)).collect();
    smelt_ir::verify(&g).map_err(bug)?;
    Ok(TrainStep { graph: g, params: trained, forward, notes, loss: loss_kind, initializers })
}

/// A persistent value `name` of kind `op` with its data, or a reference
/// without data (filled by the commands that need values).
fn persistent(g: &mut Graph, op: Op, name: &str, ty: &TensorType, data: Option<Arc<Tensor>>) -> ValueId {
    match data {
        Some(w) => g.add_persistent(op, name, w),
        None => g.add_persistent_ref(op, name, ty.clone()),
    }
}

/// A batch norm in training mode, spelled out so that autodiff
/// differentiates through the batch's statistics: `y = (x - mean) /
/// sqrt(var + eps) * scale + bias` over every axis but the channels; and the
/// updates of its running statistics (`ins[3]`, `ins[4]`, state) from the
/// batch's mean and unbiased variance. Returns `y` and the updates' outputs.
fn batch_norm_train(
    g: &mut Graph,
    name: &str,
    ins: &[ValueId],
    epsilon: f32,
    momentum: f32,
    step: ValueId,
) -> Result<(ValueId, Vec<(String, ValueId)>), TrainError> {
    let shape = g.ty(ins[0]).shape.clone();
    let (rank, c) = (shape.len(), shape[1]);
    let axes: Vec<usize> = (0..rank).filter(|&a| a != 1).collect();
    let count: usize = axes.iter().map(|&a| shape[a]).product();
    let mut ad = vjp::Ad::new(g);
    ad.name = name.to_string();
    let mean = |ad: &mut vjp::Ad, v| ad.op(Op::Reduce { op: ReduceOp::Mean, axes: axes.clone(), keepdims: true }, &[v]);
    let mu = mean(&mut ad, ins[0])?;
    let xc = ad.bin(smelt_ir::BinaryOp::Sub, ins[0], mu)?;
    let sq = ad.mul(xc, xc)?;
    let var = mean(&mut ad, sq)?;
    let eps = ad.scalar(epsilon);
    let ve = ad.bin(smelt_ir::BinaryOp::Add, var, eps)?;
    let sd = ad.un(smelt_ir::UnaryOp::Sqrt, ve)?;
    let rstd = ad.un(smelt_ir::UnaryOp::Reciprocal, sd)?;
    let xhat = ad.mul(xc, rstd)?;
    let scale = ad.per_channel(ins[1], rank)?;
    let bias = ad.per_channel(ins[2], rank)?;
    let ys = ad.mul(xhat, scale)?;
    let y = ad.bin(smelt_ir::BinaryOp::Add, ys, bias)?;
    // The running statistics follow the batch's (the variance unbiased).
    let mu_c = ad.reshape(mu, vec![c])?;
    let var_c = ad.reshape(var, vec![c])?;
    let var_u = ad.mul_c(var_c, count as f32 / (count.max(2) - 1) as f32)?;
    let mut updates = Vec::new();
    for (stat, value) in [(ins[3], mu_c), (ins[4], var_u)] {
        let stat_name = ad.g.node(stat.node).name.clone();
        let u = ad.g.add(Op::Update(Optimizer::Ema { momentum }), format!("{stat_name}.update"), &[stat, value, step])?;
        updates.push((stat_name, ValueId { node: u, slot: 0 }));
    }
    Ok((y, updates))
}

/// The convolution that batch norm `n` alone reads, when its statistics
/// are frozen (need no gradient) and it is not a graph output: the pair is
/// differentiated as one layer ([`vjp::conv_batch_norm`]).
fn conv_of_frozen_norm(g: &Graph, n: NodeId, needs: &HashSet<ValueId>) -> Option<NodeId> {
    if !matches!(g.node(n).op, Op::BatchNorm { .. }) {
        return None;
    }
    let ins = g.inputs_of(n);
    let z = ins[0];
    let sole = g.users_of(z.node).len() == 1 && !g.outputs().iter().any(|(_, v)| v.node == z.node);
    let frozen = !needs.contains(&ins[3]) && !needs.contains(&ins[4]);
    (matches!(g.node(z.node).op, Op::Conv(_)) && sole && frozen).then_some(z.node)
}

/// "loss", or a variant no parameter is named.
fn fresh_output(params: &[(String, ValueId)], base: &str) -> String {
    std::iter::once(base.to_string())
        .chain((1..).map(|i| format!("{base}.{i}")))
        .find(|n| !params.iter().any(|(p, _)| p == n) && n != "train.step")
        .expect("free")
}

impl From<IrError> for TrainError {
    fn from(e: IrError) -> Self {
        TrainError::Bug(e)
    }
}
