//! One ONNX node to smelt ops (or to a folded constant).

use super::{fold, Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::ValueId;
use crate::op::{BinaryOp, CompareOp, Conv, LogicOp, Named, Op, PadMode, Pool, ReduceOp, UnaryOp};
use crate::tensor::{Tensor, TensorData};
use smelt_onnx_proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
use std::collections::HashMap;
use std::sync::Arc;

pub(super) struct Cx<'a> {
    pub(super) node: &'a NodeProto,
    pub(super) name: String,
    pub(super) opset: i64,
    pub(super) attrs: HashMap<&'a str, &'a AttributeProto>,
}

impl<'a> Cx<'a> {
    pub(super) fn unsupported(&self, msg: impl Into<String>) -> IrError {
        IrError::Unsupported { op_type: self.node.op_type().to_string(), node: self.name.clone(), opset: self.opset, msg: msg.into() }
    }
    pub(super) fn bad(&self, msg: impl std::fmt::Display) -> IrError {
        IrError::inference(format!("\"{}\" ({})", self.name, self.node.op_type()), msg.to_string())
    }
    pub(super) fn too_large(&self, msg: impl std::fmt::Display) -> IrError {
        self.bad(format!("{}{msg}", crate::error::TOO_LARGE))
    }
    fn attr(&self, k: &str, want: AttributeType) -> Result<Option<&'a AttributeProto>, IrError> {
        match self.attrs.get(k) {
            None => Ok(None),
            Some(a) if a.r#type() == want || a.r#type() == AttributeType::Undefined => Ok(Some(*a)),
            Some(a) => Err(self.bad(format!("attribute {k} has type {:?}, expected {want:?}", a.r#type()))),
        }
    }
    pub(super) fn int(&self, k: &str, default: i64) -> Result<i64, IrError> {
        Ok(self.attr(k, AttributeType::Int)?.map_or(default, |a| a.i()))
    }
    pub(super) fn float(&self, k: &str, default: f32) -> Result<f32, IrError> {
        Ok(self.attr(k, AttributeType::Float)?.map_or(default, |a| a.f()))
    }
    pub(super) fn ints(&self, k: &str) -> Result<Option<Vec<i64>>, IrError> {
        Ok(self.attr(k, AttributeType::Ints)?.map(|a| a.ints.clone()))
    }
    pub(super) fn string(&self, k: &str) -> Result<Option<String>, IrError> {
        Ok(self.attr(k, AttributeType::String)?.map(|a| String::from_utf8_lossy(a.s()).into_owned()))
    }
    /// Whether any output from the `from`-th on is read by someone.
    pub(super) fn extra_outputs_used(&self, im: &Importer, from: usize) -> bool {
        self.node.output.iter().skip(from).any(|o| !o.is_empty() && im.used.contains(o))
    }
    /// Input `i`'s name, `None` when absent or empty (an omitted optional input).
    pub(super) fn input(&self, i: usize) -> Option<&'a str> {
        self.node.input.get(i).map(|s| s.as_str()).filter(|s| !s.is_empty())
    }
    pub(super) fn need(&self, i: usize) -> Result<&'a str, IrError> {
        self.input(i).ok_or_else(|| self.bad(format!("missing input {i}")))
    }
    pub(super) fn usizes(&self, v: Vec<i64>, what: &str) -> Result<Vec<usize>, IrError> {
        v.into_iter().map(|x| usize::try_from(x).map_err(|_| self.bad(format!("{what} must be non-negative, got {x}")))).collect()
    }
}

pub(super) fn axis(cx: &Cx, a: i64, rank: usize) -> Result<usize, IrError> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    (0..r).contains(&x).then_some(x as usize).ok_or_else(|| cx.bad(format!("axis {a} out of range for rank {rank}")))
}

pub(super) fn axes(cx: &Cx, v: &[i64], rank: usize) -> Result<Vec<usize>, IrError> {
    let mut out = v.iter().map(|&a| axis(cx, a, rank)).collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

pub(super) fn convert(im: &mut Importer, node: &NodeProto) -> Result<(), IrError> {
    let name = if node.name().is_empty() { node.output.first().cloned().unwrap_or_default() } else { node.name().to_string() };
    let cx = Cx { node, name, opset: im.opset, attrs: node.attribute.iter().map(|a| (a.name(), a)).collect() };
    if !(node.domain().is_empty() || node.domain() == "ai.onnx") {
        return Err(IrError::UnsupportedOp {
            op_type: format!("{}.{}", node.domain(), node.op_type()),
            node: cx.name.clone(),
            opset: im.opset,
        });
    }
    if node.output.iter().all(|o| o.is_empty()) {
        return Err(cx.bad("the node has no outputs"));
    }
    // An op is imported only with its arity and its attributes known: one
    // that `lower` handles but either table forgot is refused as
    // unsupported, never imported unchecked.
    let (Some((min_in, max_in, max_out)), Some(known)) = (arity(node.op_type(), im.opset), attributes(node.op_type())) else {
        return Err(IrError::UnsupportedOp { op_type: node.op_type().to_string(), node: cx.name.clone(), opset: im.opset });
    };
    {
        let (n_in, n_out) = (node.input.len(), node.output.len());
        if n_in < min_in || n_in > max_in {
            let want = match (min_in, max_in) {
                (a, b) if a == b => format!("{a}"),
                (a, usize::MAX) => format!("at least {a}"),
                (a, b) => format!("{a} to {b}"),
            };
            return Err(cx.bad(format!("invalid ONNX: {} (opset {}) takes {want} inputs, got {n_in}", node.op_type(), im.opset)));
        }
        if n_out > max_out {
            return Err(cx.bad(format!(
                "invalid ONNX: {} (opset {}) has at most {max_out} outputs, got {n_out}",
                node.op_type(),
                im.opset
            )));
        }
    }
    {
        // An attribute the op does not have is invalid ONNX; ignoring it
        // (a `stride` for `strides`) would compute something else.
        if let Some(a) = node.attribute.iter().find(|a| a.name() != "consumed_inputs" && !known.contains(&a.name())) {
            return Err(cx.bad(format!("invalid ONNX: {} has no attribute \"{}\" (it has {})", node.op_type(), a.name(), list(known))));
        }
        if let Some(a) = node.attribute.iter().find(|a| now_an_input(node.op_type(), im.opset).contains(&a.name())) {
            return Err(cx.bad(format!(
                "invalid ONNX: at opset {} {} of {} is an input, not an attribute",
                im.opset,
                a.name(),
                node.op_type()
            )));
        }
    }
    // Sequences, as the dynamo exporter writes `torch.split`: the parts of
    // a SplitToSequence, each picked by a SequenceAt at a constant index.
    match node.op_type() {
        "SplitToSequence" => return split_to_sequence(im, &cx),
        "SequenceAt" => return sequence_at(im, &cx),
        _ => {}
    }
    let outs = lower(im, &cx)?;
    for (name, entry) in node.output.iter().zip(outs) {
        if name.is_empty() {
            continue;
        }
        if im.env.contains_key(name) {
            return Err(cx.bad(format!("invalid ONNX: it writes \"{name}\", a name already defined (every value has one producer)")));
        }
        im.env.insert(name.clone(), entry);
    }
    Ok(())
}

fn split_to_sequence(im: &mut Importer, cx: &Cx) -> Result<(), IrError> {
    let x = cx.need(0)?;
    let shape = im.ty(x)?.shape;
    let ax = axis(cx, cx.int("axis", 0)?, shape.len())?;
    let d = shape[ax];
    let sizes = match cx.input(1) {
        None if cx.int("keepdims", 1)? == 0 => {
            return Err(cx.unsupported("SplitToSequence into parts of one without their axis (keepdims 0)"));
        }
        None => vec![1; d],
        Some(_) => {
            let t = const_input(im, cx, 1, "split")?;
            let v = t.to_i64_vec();
            if t.ty().shape.is_empty() {
                let c = usize::try_from(v[0]).ok().filter(|&c| c > 0).ok_or_else(|| cx.bad(format!("invalid ONNX: split {}", v[0])))?;
                (0..d.div_ceil(c)).map(|i| c.min(d - i * c)).collect()
            } else {
                cx.usizes(v, "split")?
            }
        }
    };
    if sizes.iter().try_fold(0usize, |a, &n| a.checked_add(n)) != Some(d) {
        return Err(cx.bad(format!("invalid ONNX: split sizes {sizes:?} do not add up to {d} along axis {ax}")));
    }
    let mut parts = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for n in sizes {
        let (s, e) = (start as i64, (start + n) as i64);
        parts.push(emit(im, cx, Op::Slice { axes: vec![ax], starts: vec![s], ends: vec![e], steps: vec![1] }, &[x])?.remove(0));
        start += n;
    }
    let out = cx.node.output.first().filter(|o| !o.is_empty()).ok_or_else(|| cx.bad("the node has no output"))?;
    im.sequences.insert(out.clone(), parts);
    Ok(())
}

fn sequence_at(im: &mut Importer, cx: &Cx) -> Result<(), IrError> {
    let seq = cx.need(0)?;
    let n = im
        .sequences
        .get(seq)
        .map(Vec::len)
        .ok_or_else(|| cx.unsupported(format!("SequenceAt of {seq:?}, a sequence not made by SplitToSequence")))?;
    let i = const_input(im, cx, 1, "position")?.to_i64_vec().first().copied().ok_or_else(|| cx.bad("invalid ONNX: an empty position"))?;
    let j = if i < 0 { i + n as i64 } else { i };
    if !(0..n as i64).contains(&j) {
        return Err(cx.bad(format!("invalid ONNX: position {i} of a sequence of {n}")));
    }
    let entry = im.sequences[seq][j as usize].clone();
    let out = cx.node.output.first().filter(|o| !o.is_empty()).ok_or_else(|| cx.bad("the node has no output"))?;
    if im.env.insert(out.clone(), entry).is_some() {
        return Err(cx.bad(format!("invalid ONNX: it writes \"{out}\", a name already defined (every value has one producer)")));
    }
    Ok(())
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The attributes an op smelt imports may carry, at any opset (the legacy
/// `consumed_inputs` of opset 1 is allowed everywhere); `None` for ops it
/// does not import (an op without an entry here is refused before it is
/// lowered).
fn attributes(op_type: &str) -> Option<&'static [&'static str]> {
    const WINDOW: &[&str] =
        &["auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "storage_order", "strides"];
    Some(match op_type {
        "LeakyRelu" | "Elu" => &["alpha"],
        "Selu" => &["alpha", "gamma"],
        "Gelu" => &["approximate"],
        t if UnaryOp::by_onnx_name(t).is_some() => &[],
        "Add" | "Sub" | "Mul" | "Div" | "Pow" => &["broadcast", "axis"],
        "Max" | "Min" | "Sum" | "PRelu" | "MatMul" | "GlobalAveragePool" | "Identity" | "Expand" | "Tile" | "Not" | "IsNaN" | "Where"
        | "Size" | "Range" | "And" | "Or" | "Xor" => &[],
        t if CompareOp::by_onnx_name(t).is_some() => &[],
        "Mod" => &["fmod"],
        "Trilu" => &["upper"],
        "GatherElements" => &["axis"],
        "GatherND" => &["batch_dims"],
        "ScatterND" => &["reduction"],
        "CastLike" => &["saturate", "round_mode"],
        "Conv" => &["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"],
        "ConvTranspose" => &["auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"],
        "BatchNormalization" => &["epsilon", "momentum", "spatial", "is_test", "training_mode"],
        "Clip" => &["min", "max"],
        "MaxPool" | "AveragePool" => WINDOW,
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum"
        | "ReduceLogSumExp" => &["axes", "keepdims", "noop_with_empty_axes"],
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => &["ignore_index", "reduction"],
        "Gemm" => &["alpha", "beta", "transA", "transB", "broadcast"],
        "Transpose" => &["perm"],
        "Softmax" | "LogSoftmax" | "Flatten" | "Gather" | "Concat" => &["axis"],
        "LayerNormalization" | "RMSNormalization" => &["axis", "epsilon", "stash_type"],
        "HardSigmoid" => &["alpha", "beta"],
        "Attention" => &[
            "is_causal",
            "kv_num_heads",
            "q_num_heads",
            "qk_matmul_output_mode",
            "scale",
            "softcap",
            "softmax_precision",
            "left_window_size",
            "right_window_size",
        ],
        "Celu" | "Swish" | "ThresholdedRelu" => &["alpha"],
        "ArgMax" | "ArgMin" => &["axis", "keepdims", "select_last_index"],
        "OneHot" => &["axis"],
        "RotaryEmbedding" => &["interleaved", "num_heads", "rotary_embedding_dim"],
        "TopK" => &["axis", "k", "largest", "sorted"],
        "Einsum" => &["equation"],
        "DepthToSpace" => &["blocksize", "mode"],
        "SpaceToDepth" => &["blocksize", "mode"],
        "CumSum" => &["exclusive", "reverse"],
        "ReduceProd" => &["axes", "keepdims", "noop_with_empty_axes"],
        "InstanceNormalization" => &["epsilon"],
        "GroupNormalization" => &["epsilon", "num_groups", "stash_type"],
        "Resize" => &[
            "antialias",
            "axes",
            "coordinate_transformation_mode",
            "cubic_coeff_a",
            "exclude_outside",
            "extrapolation_value",
            "keep_aspect_ratio_policy",
            "mode",
            "nearest_mode",
        ],
        "Softsign" | "HardSwish" | "Mish" | "GlobalMaxPool" | "Mean" => &[],
        "IsInf" => &["detect_positive", "detect_negative"],
        "LRN" => &["alpha", "beta", "bias", "size"],
        "Constant" => &["value", "value_float", "value_floats", "value_int", "value_ints", "value_string", "value_strings", "sparse_value"],
        "ConstantOfShape" => &["value"],
        "Shape" => &["start", "end"],
        "Cast" => &["to", "saturate", "round_mode"],
        "Dropout" => &["ratio", "is_test", "seed"],
        "Reshape" => &["shape", "allowzero"],
        "Squeeze" | "Unsqueeze" => &["axes"],
        "Split" => &["axis", "split", "num_outputs"],
        "Slice" => &["starts", "ends", "axes"],
        "Pad" => &["mode", "pads", "value", "paddings"],
        "SplitToSequence" => &["axis", "keepdims"],
        "SequenceAt" => &[],
        _ => return None,
    })
}

/// Attributes that became inputs at `opset` or before: given as
/// attributes, they would be ignored.
fn now_an_input(op_type: &str, opset: i64) -> &'static [&'static str] {
    match op_type {
        "ReduceSum" | "Squeeze" | "Unsqueeze" if opset >= 13 => &["axes"],
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp"
        | "ReduceProd"
            if opset >= 18 =>
        {
            &["axes"]
        }
        "Split" if opset >= 13 => &["split"],
        "Slice" if opset >= 10 => &["starts", "ends", "axes"],
        "Pad" if opset >= 11 => &["pads", "value", "paddings"],
        "Reshape" if opset >= 5 => &["shape"],
        "Clip" if opset >= 11 => &["min", "max"],
        "Dropout" if opset >= 12 => &["ratio"],
        _ => &[],
    }
}

/// (fewest inputs, most inputs, most outputs) of an op smelt imports, as
/// the ONNX spec allows them at `opset`; `None` for ops it does not import.
fn arity(op_type: &str, opset: i64) -> Option<(usize, usize, usize)> {
    const ANY: usize = usize::MAX;
    Some(match op_type {
        "Gelu" | "GlobalAveragePool" | "Transpose" | "Softmax" | "LogSoftmax" | "LRN" | "Flatten" | "Identity" | "Shape" | "Size"
        | "Cast" | "AveragePool" | "ConstantOfShape" => (1, 1, 1),
        t if UnaryOp::by_onnx_name(t).is_some() => (1, 1, 1),
        "Pow" | "MatMul" | "PRelu" | "Add" | "Sub" | "Mul" | "Div" | "Gather" | "Expand" | "Mod" | "GatherElements" | "GatherND"
        | "CastLike" | "And" | "Or" | "Xor" => (2, 2, 1),
        "ScatterND" => (3, 3, 1),
        t if CompareOp::by_onnx_name(t).is_some() => (2, 2, 1),
        "Not" | "IsNaN" => (1, 1, 1),
        "Where" | "Range" => (3, 3, 1),
        "Trilu" => (1, 2, 1),
        "Max" | "Min" | "Sum" | "Concat" => (1, ANY, 1),
        "Conv" | "Gemm" | "ConvTranspose" => (2, 3, 1),
        "BatchNormalization" => (5, 5, 5),
        "Clip" if opset < 11 => (1, 1, 1),
        "Clip" => (1, 3, 1),
        "MaxPool" => (1, 1, 2),
        "NegativeLogLikelihoodLoss" => (2, 3, 1),
        "SoftmaxCrossEntropyLoss" => (2, 3, 2),
        "ReduceSum" if opset < 13 => (1, 1, 1),
        "ReduceSum" => (1, 2, 1),
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp"
            if opset < 18 =>
        {
            (1, 1, 1)
        }
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
            (1, 2, 1)
        }
        "LayerNormalization" => (2, 3, 3),
        "RMSNormalization" => (2, 2, 1),
        "Attention" if opset < 24 => (3, 6, 4),
        "Attention" => (3, 7, 4),
        "HardSigmoid" | "Celu" | "IsInf" | "Softsign" | "HardSwish" | "Swish" | "Mish" | "ThresholdedRelu" | "GlobalMaxPool" => (1, 1, 1),
        "Mean" => (1, ANY, 1),
        "ArgMax" | "ArgMin" => (1, 1, 1),
        "Resize" => (1, 4, 1),
        "RotaryEmbedding" => (3, 4, 1),
        "Einsum" => (1, ANY, 1),
        "TopK" if opset < 10 => (1, 1, 2),
        "TopK" => (2, 2, 2),
        "OneHot" | "InstanceNormalization" | "GroupNormalization" => (3, 3, 1),
        "DepthToSpace" | "SpaceToDepth" => (1, 1, 1),
        "CumSum" => (2, 2, 1),
        "ReduceProd" if opset < 18 => (1, 1, 1),
        "ReduceProd" => (1, 2, 1),
        "Constant" => (0, 0, 1),
        "Dropout" if opset < 12 => (1, 1, 2),
        "Dropout" => (1, 3, 2),
        "Reshape" if opset < 5 => (1, 1, 1),
        "Reshape" => (2, 2, 1),
        "Squeeze" | "Unsqueeze" if opset < 13 => (1, 1, 1),
        "Squeeze" | "Unsqueeze" => (1, 2, 1),
        "Split" => (1, 2, ANY),
        "Slice" if opset < 10 => (1, 1, 1),
        "Slice" => (3, 5, 1),
        "Pad" if opset < 11 => (1, 1, 1),
        "Pad" => (2, 4, 1),
        "Tile" if opset < 6 => (3, 3, 1),
        "Tile" => (2, 2, 1),
        "SplitToSequence" => (1, 2, 1),
        "SequenceAt" => (2, 2, 1),
        _ => return None,
    })
}

pub(super) fn konst(t: Tensor) -> Vec<Entry> {
    vec![Entry { konst: Some(Arc::new(t)), value: None }]
}

pub(super) fn values(id: crate::graph::NodeId, n: usize) -> Vec<Entry> {
    (0..n).map(|slot| Entry { konst: None, value: Some(ValueId { node: id, slot: slot as u32 }) }).collect()
}

/// Results up to this size are folded whatever their inputs' sizes; a
/// larger one only when no input is smaller (an `Expand` of a small
/// constant to a big mask stays an op rather than a big weight).
const FOLD_FREELY_BYTES: usize = 1 << 20;

/// Adds `op` on the named inputs, or folds it when they are all constants
/// and [`fold::op`] evaluates it.
pub(super) fn emit(im: &mut Importer, cx: &Cx, op: Op, inputs: &[&str]) -> Result<Vec<Entry>, IrError> {
    let kept = inputs.iter().any(|n| im.kept.contains(*n));
    let consts: Option<Vec<Arc<Tensor>>> = if kept { None } else { inputs.iter().map(|n| im.konst(n)).collect() };
    if let Some(cs) = consts.filter(|c| !c.is_empty()) {
        let tys: Vec<&crate::dtype::TensorType> = cs.iter().map(|c| c.ty()).collect();
        let out = crate::infer::infer(&op, &tys).map_err(|m| cx.bad(m))?;
        let biggest = tys.iter().map(|t| t.bytes()).max().unwrap_or(0);
        if out.len() == 1 && out[0].bytes() <= biggest.max(FOLD_FREELY_BYTES) {
            let refs: Vec<&Tensor> = cs.iter().map(|c| c.as_ref()).collect();
            if let Some(t) = fold::op(&op, &refs, &out[0]) {
                return Ok(konst(t.map_err(|m| cx.bad(m))?));
            }
        }
    }
    let vs = inputs.iter().map(|n| im.value(n)).collect::<Result<Vec<_>, _>>()?;
    emit_values(im, cx, op, &vs)
}

pub(super) fn emit_values(im: &mut Importer, cx: &Cx, op: Op, vs: &[ValueId]) -> Result<Vec<Entry>, IrError> {
    let id = im.g.add(op, cx.name.clone(), vs).map_err(|e| match e {
        IrError::Shape { msg, .. } => cx.bad(msg),
        IrError::TooLarge { msg, .. } => cx.too_large(msg),
        e => e,
    })?;
    let n = im.g.node(id).outputs.len();
    Ok(values(id, n))
}

/// A reshaping op (`Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, identities):
/// folded when its input is constant, else emitted.
pub(super) fn reshaping(im: &mut Importer, cx: &Cx, op: Op, x: &str) -> Result<Vec<Entry>, IrError> {
    if let Some(t) = im.konst(x).filter(|_| !im.kept.contains(x)) {
        let out = crate::infer::infer(&op, &[t.ty()]).map_err(|m| cx.bad(m))?;
        return Ok(konst((*t).clone().reshaped(out[0].shape.clone()).expect("same element count")));
    }
    emit(im, cx, op, &[x])
}

pub(super) fn const_input(im: &Importer, cx: &Cx, i: usize, what: &str) -> Result<Arc<Tensor>, IrError> {
    let n = cx.need(i)?;
    im.konst(n).ok_or_else(|| {
        if im.graph_inputs.contains(n) {
            IrError::NeedsValue {
                op_type: cx.node.op_type().to_string(),
                node: cx.name.clone(),
                opset: cx.opset,
                what: format!("{what} (input {i})"),
                input: n.to_string(),
            }
        } else {
            cx.unsupported(format!("{what} (input {i}) must be a constant known at import"))
        }
    })
}

pub(super) fn const_ints(im: &Importer, cx: &Cx, i: usize, what: &str) -> Result<Option<Vec<i64>>, IrError> {
    match cx.input(i) {
        None => Ok(None),
        Some(_) => const_int_vec(im, cx, i, what).map(Some),
    }
}

/// A constant integer input (a shape, axes, pads): an i64 or i32 tensor.
pub(super) fn const_int_vec(im: &Importer, cx: &Cx, i: usize, what: &str) -> Result<Vec<i64>, IrError> {
    let t = const_input(im, cx, i, what)?;
    if !matches!(t.ty().dtype, DType::I64 | DType::I32) {
        return Err(cx.bad(format!("invalid ONNX: {what} (input {i}) must be an integer tensor, got {}", t.ty())));
    }
    Ok(t.to_i64_vec())
}

fn window(cx: &Cx, spatial: &[usize], kernel: &[usize], strides: &[usize], dil: &[usize]) -> Result<Vec<usize>, IrError> {
    let n = kernel.len();
    let auto = cx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    match auto.as_str() {
        "NOTSET" => {
            let pads = cx.ints("pads")?.unwrap_or_else(|| vec![0; 2 * n]);
            if pads.len() != 2 * n {
                return Err(cx.bad(format!("pads {pads:?} must have {} entries", 2 * n)));
            }
            cx.usizes(pads, "pads")
        }
        "VALID" => Ok(vec![0; 2 * n]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut pads = vec![0; 2 * n];
            for i in 0..n {
                let big = || cx.too_large(format!("window of kernel {kernel:?}, strides {strides:?}, dilations {dil:?} overflows"));
                let out = spatial[i].div_ceil(strides[i]);
                let eff = dil[i].checked_mul(kernel[i].saturating_sub(1)).and_then(|e| e.checked_add(1)).ok_or_else(big)?;
                let total = out.saturating_sub(1).checked_mul(strides[i]).and_then(|t| t.checked_add(eff)).ok_or_else(big)?;
                let total = total.saturating_sub(spatial[i]);
                let small = total / 2;
                let (b, e) = if auto == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                pads[i] = b;
                pads[n + i] = e;
            }
            Ok(pads)
        }
        other => Err(cx.unsupported(format!("auto_pad {other}"))),
    }
}

fn spatial_attr(cx: &Cx, k: &str, n: usize) -> Result<Vec<usize>, IrError> {
    let v = cx.ints(k)?.unwrap_or_else(|| vec![1; n]);
    if v.len() != n {
        return Err(cx.bad(format!("{k} {v:?} must have {n} entries")));
    }
    if v.iter().any(|&x| x <= 0) {
        return Err(cx.bad(format!("invalid ONNX: {k} {v:?} must be positive")));
    }
    cx.usizes(v, k)
}

fn pool_attrs(im: &Importer, cx: &Cx) -> Result<Pool, IrError> {
    let x = im.ty(cx.need(0)?)?;
    if x.shape.len() < 3 {
        return Err(cx.bad(format!("needs an input of rank at least 3, got {x}")));
    }
    let kernel = cx.usizes(cx.ints("kernel_shape")?.ok_or_else(|| cx.bad("missing kernel_shape"))?, "kernel_shape")?;
    let n = kernel.len();
    let strides = spatial_attr(cx, "strides", n)?;
    let dil = spatial_attr(cx, "dilations", n)?;
    if dil.iter().any(|&d| d != 1) {
        return Err(cx.unsupported("pooling dilations other than 1"));
    }
    if x.shape.len() != n + 2 {
        return Err(cx.bad(format!("kernel_shape {kernel:?} does not fit input {x}")));
    }
    let pads = window(cx, &x.shape[2..], &kernel, &strides, &dil)?;
    Ok(Pool { kernel, strides, pads, ceil_mode: cx.int("ceil_mode", 0)? != 0 })
}

/// `name` with `trailing` size-1 dims appended (registered under a new name).
fn align(im: &mut Importer, cx: &Cx, name: &str, trailing: usize) -> Result<String, IrError> {
    if trailing == 0 {
        return Ok(name.to_string());
    }
    let mut shape = im.ty(name)?.shape;
    shape.extend(std::iter::repeat_n(1, trailing));
    let e = reshaping(im, cx, Op::Reshape { shape }, name)?.remove(0);
    let aligned = format!("{name}:aligned:{}", cx.name);
    im.env.insert(aligned.clone(), e);
    Ok(aligned)
}

/// Neg, Abs and Sign of integers: exact on constants (shape arithmetic in
/// expanded functions); at run time smelt computes them for floats only.
fn int_unary(im: &mut Importer, cx: &Cx, u: UnaryOp, x: &str) -> Result<Vec<Entry>, IrError> {
    let Some(t) = im.konst(x) else {
        return Err(cx.unsupported(format!(
            "{} of a run-time {} tensor (smelt computes it for float types)",
            cx.node.op_type(),
            im.ty(x)?.dtype
        )));
    };
    let f = |v: i64| match u {
        UnaryOp::Neg => v.wrapping_neg(),
        UnaryOp::Abs => v.wrapping_abs(),
        _ => v.signum(),
    };
    let ty = t.ty().clone();
    Ok(konst(Tensor::from_i64(ty.shape.clone(), t.to_i64_vec().into_iter().map(f).collect()).cast(ty.dtype)))
}

fn unary(u: UnaryOp) -> Option<Op> {
    Some(Op::Unary(u))
}

fn lower(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let simple = match op_type {
        "Gelu" => match cx.string("approximate")?.as_deref().unwrap_or("none") {
            "none" => unary(UnaryOp::Gelu),
            "tanh" => unary(UnaryOp::GeluTanh),
            other => return Err(cx.unsupported(format!("approximate={other:?} (Gelu takes \"none\" or \"tanh\")"))),
        },
        t if UnaryOp::by_onnx_name(t).is_some() => {
            let u = UnaryOp::by_onnx_name(t).expect("just found");
            let p = u.params().into_iter().map(|(k, default)| cx.float(k, default)).collect::<Result<Vec<f32>, IrError>>()?;
            unary(u.with_params(&p))
        }
        "Pow" => Some(Op::Binary(BinaryOp::Pow)),
        "Not" => Some(Op::Not),
        "IsNaN" => Some(Op::IsNaN),
        "Where" => Some(Op::Where),
        t if CompareOp::by_onnx_name(t).is_some() => CompareOp::by_onnx_name(t).map(Op::Compare),
        t if LogicOp::by_onnx_name(t).is_some() => LogicOp::by_onnx_name(t).map(Op::Logic),
        "MatMul" => Some(Op::MatMul),
        "GlobalAveragePool" => Some(Op::GlobalAveragePool),
        _ => None,
    };
    if let Some(op) = simple {
        let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
        if let (Op::Unary(u @ (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign)), [x]) = (&op, ins.as_slice()) {
            if !im.ty(x)?.dtype.is_float() {
                return int_unary(im, cx, *u, x);
            }
        }
        if let (Op::Binary(BinaryOp::Pow), [x, y]) = (&op, ins.as_slice()) {
            let (xt, yt) = (im.ty(x)?, im.ty(y)?);
            if xt.dtype.is_float() && !yt.dtype.is_float() {
                // An integer exponent of a float base: the same powers in the base's type.
                let yv = im.value(y)?;
                let yf = one_value(im, cx, Op::Cast { to: xt.dtype }, &[yv])?;
                let xv = im.value(x)?;
                return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, op, &[xv, yf])?) }]);
            }
            if xt.dtype != yt.dtype && xt.dtype.is_float() == yt.dtype.is_float() {
                // Two floats or two integers: the exponent in the base's type.
                let yv = im.value(y)?;
                let yc = one_value(im, cx, Op::Cast { to: xt.dtype }, &[yv])?;
                let xv = im.value(x)?;
                return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, op, &[xv, yc])?) }]);
            }
            if !xt.dtype.is_float() && yt.dtype.is_float() {
                // A float exponent of an integer base: in the exponent's
                // type, then truncated to the base's (as numpy's astype).
                let xv = im.value(x)?;
                let xf = one_value(im, cx, Op::Cast { to: yt.dtype }, &[xv])?;
                let yv = im.value(y)?;
                let p = one_value(im, cx, op, &[xf, yv])?;
                return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, Op::Cast { to: xt.dtype }, &[p])?) }]);
            }
        }
        return emit(im, cx, op, &ins);
    }
    if super::shape_ops::handles(op_type) {
        return super::shape_ops::lower(im, cx);
    }
    match op_type {
        "PRelu" => {
            // Before opset 7 a 1-D slope of C elements is per channel.
            let (x, slope) = (cx.need(0)?, cx.need(1)?);
            let (xt, st) = (im.ty(x)?, im.ty(slope)?);
            let per_channel = cx.opset < 7 && st.shape.len() == 1 && xt.shape.len() > 2 && xt.shape.get(1) == st.shape.first();
            let slope = if per_channel { align(im, cx, slope, xt.shape.len() - 2)? } else { slope.to_string() };
            emit(im, cx, Op::Binary(BinaryOp::PRelu), &[x, &slope])
        }
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" => {
            let mut ins: Vec<String> = cx.node.input.to_vec();
            if cx.opset < 7 && cx.int("broadcast", 0)? != 0 && ins.len() == 2 {
                // Legacy broadcast: b's dims line up with a's from `axis` on.
                let (at, bt) = (im.ty(&ins[0])?, im.ty(&ins[1])?);
                let ax = match cx.attrs.get("axis") {
                    Some(a) => axis(cx, a.i(), at.shape.len())?,
                    None => at.shape.len().saturating_sub(bt.shape.len()),
                };
                let trailing = at
                    .shape
                    .len()
                    .checked_sub(ax + bt.shape.len())
                    .ok_or_else(|| cx.bad(format!("cannot broadcast {bt} into {at} at axis {ax}")))?;
                ins[1] = align(im, cx, &ins[1], trailing)?;
            }
            let ins: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
            let b = match op_type {
                "Add" => BinaryOp::Add,
                "Sub" => BinaryOp::Sub,
                "Mul" => BinaryOp::Mul,
                "Div" => BinaryOp::Div,
                "Max" => BinaryOp::Max,
                _ => BinaryOp::Min,
            };
            let consts: Option<Vec<Arc<Tensor>>> = ins.iter().map(|n| im.konst(n)).collect();
            if let Some(cs) = consts.filter(|cs| cs.len() == 2 && cs.iter().all(|c| matches!(c.ty().dtype, DType::I64 | DType::I32))) {
                let f: fn(i64, i64) -> Option<i64> = match b {
                    BinaryOp::Add => i64::checked_add,
                    BinaryOp::Sub => i64::checked_sub,
                    BinaryOp::Mul => i64::checked_mul,
                    BinaryOp::Div => i64::checked_div,
                    BinaryOp::Max => |a, b| Some(a.max(b)),
                    _ => |a, b| Some(a.min(b)),
                };
                return Ok(konst(fold::int_binary(&cs[0], &cs[1], f).map_err(|m| cx.bad(m))?));
            }
            if ins.len() == 2 {
                return emit(im, cx, Op::Binary(b), &ins);
            }
            if !matches!(b, BinaryOp::Max | BinaryOp::Min) || ins.is_empty() {
                return Err(cx.bad(format!("takes 2 inputs, got {}", ins.len())));
            }
            // Variadic Max/Min: a chain of binary ops.
            let mut acc = im.value(ins[0])?;
            for n in &ins[1..] {
                let v = im.value(n)?;
                acc = emit_values(im, cx, Op::Binary(b), &[acc, v])?[0].value.expect("a value");
            }
            Ok(vec![Entry { konst: None, value: Some(acc) }])
        }
        "Sum" => {
            let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
            emit(im, cx, Op::Sum, &ins)
        }
        "Conv" => {
            let (x, w) = (cx.need(0)?, cx.need(1)?);
            let (xt, wt) = (im.ty(x)?, im.ty(w)?);
            if wt.shape.len() < 3 || xt.shape.len() != wt.shape.len() {
                return Err(cx.bad(format!("input {xt} and weight {wt} do not fit a convolution")));
            }
            let kernel = match cx.ints("kernel_shape")? {
                Some(k) => cx.usizes(k, "kernel_shape")?,
                None => wt.shape[2..].to_vec(),
            };
            if kernel != wt.shape[2..] {
                return Err(cx.bad(format!("kernel_shape {kernel:?} does not match weight {wt}")));
            }
            let n = kernel.len();
            let strides = spatial_attr(cx, "strides", n)?;
            let dilations = spatial_attr(cx, "dilations", n)?;
            let pads = window(cx, &xt.shape[2..], &kernel, &strides, &dilations)?;
            let group = usize::try_from(cx.int("group", 1)?).map_err(|_| cx.bad("negative group"))?;
            let mut ins = vec![x, w];
            ins.extend(cx.input(2));
            emit(im, cx, Op::Conv(Conv { strides, pads, dilations, group }), &ins)
        }
        "ConvTranspose" => conv_transpose(im, cx),
        "ArgMax" | "ArgMin" => arg_extreme(im, cx),
        "Resize" => resize(im, cx),
        "RotaryEmbedding" => rotary_embedding(im, cx),
        "TopK" => top_k(im, cx),
        "Einsum" => einsum(im, cx),
        "OneHot" | "DepthToSpace" | "SpaceToDepth" | "CumSum" | "ReduceProd" | "InstanceNormalization" | "GroupNormalization" => {
            built(im, cx)
        }
        "BatchNormalization" => {
            if cx.extra_outputs_used(im, 1) {
                return Err(cx.unsupported("training-mode outputs (running mean/var)"));
            }
            if cx.int("spatial", 1)? != 1 || cx.int("training_mode", 0)? != 0 {
                return Err(cx.unsupported("non-spatial or training-mode batch normalization"));
            }
            let ins = (0..5).map(|i| cx.need(i)).collect::<Result<Vec<_>, _>>()?;
            emit(im, cx, Op::BatchNorm { epsilon: cx.float("epsilon", 1e-5)? }, &ins)
        }
        "Clip" => {
            let x = cx.need(0)?;
            let (min, max) = if cx.opset < 11 {
                (cx.float("min", f32::NEG_INFINITY)?, cx.float("max", f32::INFINITY)?)
            } else {
                let bound = |i: usize, d: f32| -> Result<f32, IrError> {
                    Ok(match cx.input(i) {
                        Some(_) => const_input(im, cx, i, "a clip bound")?.to_f32_vec().first().copied().unwrap_or(d),
                        None => d,
                    })
                };
                (bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?)
            };
            let ty = im.ty(x)?;
            if !ty.dtype.is_float() && cx.opset >= 11 {
                // Integers: max with the lower bound, min with the upper, exactly.
                let mut v = im.value(x)?;
                for (i, b) in [(1, BinaryOp::Max), (2, BinaryOp::Min)] {
                    if cx.input(i).is_some() {
                        let t = const_input(im, cx, i, "a clip bound")?;
                        let t = Tensor::from_i64(vec![], vec![*t.to_i64_vec().first().ok_or_else(|| cx.bad("an empty clip bound"))?])
                            .cast(ty.dtype);
                        let c = constant(im, cx, if i == 1 { "min" } else { "max" }, t)?;
                        v = one_value(im, cx, Op::Binary(b), &[v, c])?;
                    }
                }
                return Ok(vec![Entry { konst: None, value: Some(v) }]);
            }
            emit(im, cx, Op::Clip { min, max }, &[x])
        }
        "MaxPool" => {
            if cx.extra_outputs_used(im, 1) {
                return Err(cx.unsupported("the Indices output of MaxPool"));
            }
            if cx.int("storage_order", 0)? != 0 {
                return Err(cx.unsupported("storage_order 1"));
            }
            let p = pool_attrs(im, cx)?;
            emit(im, cx, Op::MaxPool(p), &[cx.need(0)?])
        }
        "AveragePool" => {
            let p = pool_attrs(im, cx)?;
            let cip = cx.int("count_include_pad", 0)? != 0;
            emit(im, cx, Op::AveragePool { pool: p, count_include_pad: cip }, &[cx.need(0)?])
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum"
        | "ReduceLogSumExp" => reduce(im, cx),
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => loss(im, cx),
        "Gemm" => {
            let mut ins = vec![cx.need(0)?, cx.need(1)?];
            ins.extend(cx.input(2));
            let op = Op::Gemm {
                trans_a: cx.int("transA", 0)? != 0,
                trans_b: cx.int("transB", 0)? != 0,
                alpha: cx.float("alpha", 1.0)?,
                beta: cx.float("beta", 1.0)?,
            };
            emit(im, cx, op, &ins)
        }
        "Transpose" => {
            let x = cx.need(0)?;
            let rank = im.ty(x)?.shape.len();
            let perm = match cx.ints("perm")? {
                Some(p) => cx.usizes(p, "perm")?,
                None => (0..rank).rev().collect(),
            };
            emit(im, cx, Op::Transpose { perm }, &[x])
        }
        "Softmax" | "LogSoftmax" => {
            let x = cx.need(0)?;
            let shape = im.ty(x)?.shape;
            let default = if cx.opset >= 13 { -1 } else { 1 };
            if shape.is_empty() {
                return Err(cx.bad(format!("invalid ONNX: {op_type} needs an input of rank at least 1, got a scalar")));
            }
            let ax = axis(cx, cx.int("axis", default)?, shape.len())?;
            let make = |axis| {
                if op_type == "Softmax" {
                    Op::Softmax { axis }
                } else {
                    Op::LogSoftmax { axis }
                }
            };
            if cx.opset >= 13 || shape[ax + 1..].iter().all(|&d| d == 1) {
                return emit(im, cx, make(ax), &[x]);
            }
            // Before opset 13 the input is coerced to 2-D at `axis`.
            let outer: usize = shape[..ax].iter().product();
            let inner: usize = shape[ax..].iter().product();
            let flat = emit(im, cx, Op::Reshape { shape: vec![outer, inner] }, &[x])?[0].value.expect("a value");
            let sm = emit_values(im, cx, make(1), &[flat])?[0].value.expect("a value");
            emit_values(im, cx, Op::Reshape { shape }, &[sm])
        }
        "LayerNormalization" => {
            let x = cx.need(0)?;
            let rank = im.ty(x)?.shape.len();
            let ax = axis(cx, cx.int("axis", -1)?, rank)?;
            let mut ins = vec![x, cx.need(1)?];
            ins.extend(cx.input(2));
            let epsilon = cx.float("epsilon", 1e-5)?;
            let mut out = emit(im, cx, Op::LayerNorm { axis: ax, epsilon }, &ins)?;
            if cx.extra_outputs_used(im, 1) {
                out.extend(layer_norm_stats(im, cx, x, ax, epsilon)?);
            }
            Ok(out)
        }
        "RMSNormalization" => rms_norm(im, cx),
        "Attention" => attention(im, cx),
        "HardSigmoid" | "Celu" | "IsInf" | "Softsign" | "HardSwish" | "Swish" | "Mish" | "ThresholdedRelu" | "GlobalMaxPool" => {
            small_decompositions(im, cx)
        }
        "Mean" => {
            let ins: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
            let dtype = im.ty(ins[0])?.dtype;
            if !dtype.is_float() {
                return Err(cx.unsupported(format!("Mean of {dtype} (smelt computes it for float types)")));
            }
            let s = emit(im, cx, Op::Sum, &ins)?.remove(0);
            let sv = match s.value {
                Some(v) => v,
                None => {
                    let name = format!("{}:sum", cx.name);
                    im.env.insert(name.clone(), s);
                    im.value(&name)?
                }
            };
            let n = scalar(im, cx, "1/n", dtype, 1.0 / ins.len() as f64)?;
            Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, Op::Binary(BinaryOp::Mul), &[sv, n])?) }])
        }
        "Mod" => {
            let (a, b) = (cx.need(0)?, cx.need(1)?);
            let (Some(x), Some(y)) = (im.konst(a), im.konst(b)) else {
                return Err(cx.unsupported("Mod of a run-time tensor (only shape arithmetic on constants is folded)"));
            };
            let shape = crate::infer::broadcast(x.shape(), y.shape())
                .ok_or_else(|| cx.bad(format!("{} and {} do not broadcast", x.ty(), y.ty())))?;
            let n = crate::infer::checked_numel(&shape).map_err(|m| cx.bad(m))?;
            if n.saturating_mul(8) > FOLD_FREELY_BYTES.max(x.ty().bytes()).max(y.ty().bytes()) {
                return Err(cx.too_large(format!("a folded Mod of {n} elements from {} and {}", x.ty(), y.ty())));
            }
            Ok(konst(fold::modulo(&x, &y, cx.int("fmod", 0)? != 0).map_err(|m| cx.bad(m))?))
        }
        "Range" => {
            let ins = (0..3).map(|i| const_input(im, cx, i, ["start", "limit", "delta"][i])).collect::<Result<Vec<_>, _>>()?;
            Ok(konst(fold::range(&ins[0], &ins[1], &ins[2]).map_err(|m| cx.bad(m))?))
        }
        "Trilu" => {
            let x = cx.need(0)?;
            let k = match cx.input(1) {
                Some(_) => const_int_vec(im, cx, 1, "k")?.first().copied().unwrap_or(0),
                None => 0,
            };
            let xt = im.ty(x)?;
            if xt.shape.len() < 2 {
                return Err(cx.bad(format!("invalid ONNX: Trilu needs rank at least 2, got {xt}")));
            }
            // Keep element (i, j) of the last two dims where j - i >= k
            // (upper) or j - i <= k (lower): a constant mask and a select.
            let (n, m) = (xt.shape[xt.shape.len() - 2], xt.shape[xt.shape.len() - 1]);
            if n.saturating_mul(m) > 1 << 26 {
                return Err(cx.too_large(format!("a {n}x{m} triangle mask (at most 2^26 elements)")));
            }
            let upper = cx.int("upper", 1)? != 0;
            let keep = (0..n * m).map(|p| {
                let d = (p % m) as i64 - (p / m) as i64;
                if upper {
                    d >= k
                } else {
                    d <= k
                }
            });
            let mask = Tensor::new(vec![n, m], crate::tensor::TensorData::Bool(keep.collect())).expect("count matches");
            let zero = Tensor::full(&crate::dtype::TensorType::new(xt.dtype, vec![]), 0.0);
            let (mask_name, zero_name) = (format!("{}:mask", cx.name), format!("{}:zero", cx.name));
            im.env.insert(mask_name.clone(), Entry { konst: Some(Arc::new(mask)), value: None });
            im.env.insert(zero_name.clone(), Entry { konst: Some(Arc::new(zero)), value: None });
            emit(im, cx, Op::Where, &[&mask_name, x, &zero_name])
        }
        "GatherElements" => {
            let (d, i) = (cx.need(0)?, cx.need(1)?);
            let (Some(data), Some(idx)) = (im.konst(d).filter(|_| !im.kept.contains(d)), im.konst(i)) else {
                return built(im, cx);
            };
            let ax = axis(cx, cx.int("axis", 0)?, data.shape().len())?;
            Ok(konst(fold::gather_elements(&data, &idx, ax).map_err(|m| cx.bad(m))?))
        }
        "ScatterND" => scatter_nd(im, cx),
        "GatherND" => {
            // With constant indices: a Gather along the flattened leading
            // dims of data (a run-time mask selected by shape arithmetic).
            if cx.int("batch_dims", 0)? != 0 {
                return Err(cx.unsupported("GatherND with batch_dims other than 0"));
            }
            let d = cx.need(0)?;
            let idx = const_input(im, cx, 1, "indices")?;
            let dt = im.ty(d)?;
            let k = *idx.shape().last().ok_or_else(|| cx.bad("invalid ONNX: GatherND indices must have rank at least 1"))?;
            if k > dt.shape.len() {
                return Err(cx.bad(format!("invalid ONNX: indices of depth {k} into {dt}")));
            }
            let lead: usize = dt.shape[..k].iter().product();
            let ishape = idx.shape()[..idx.shape().len() - 1].to_vec();
            let tuples = crate::infer::checked_numel(&ishape).map_err(|m| cx.bad(m))?;
            // Index tuples of depth 0 each select all of data (no elements to read them from).
            if k == 0 && tuples > 1 << 24 {
                return Err(cx.too_large(format!("{tuples} empty index tuples")));
            }
            let mut flat = if k == 0 { vec![0; tuples] } else { Vec::with_capacity(tuples) };
            for tuple in idx.to_i64_vec().chunks(k.max(1)).filter(|_| k > 0) {
                let mut f = 0i64;
                for (j, &v) in tuple.iter().enumerate().take(k) {
                    let e = dt.shape[j] as i64;
                    let v = if v < 0 { v + e } else { v };
                    if !(0..e).contains(&v) {
                        return Err(cx.bad(format!("index {v} out of range for extent {e} of {dt}")));
                    }
                    f = f * e + v;
                }
                flat.push(f);
            }
            let flat_name = format!("{}:flat_indices", cx.name);
            im.env.insert(flat_name.clone(), Entry { konst: Some(Arc::new(Tensor::from_i64(ishape, flat))), value: None });
            let mut shape = vec![lead];
            shape.extend_from_slice(&dt.shape[k..]);
            let flat_data = reshaping(im, cx, Op::Reshape { shape }, d)?.remove(0);
            let data_name = format!("{}:flat_data", cx.name);
            im.env.insert(data_name.clone(), flat_data);
            match im.konst(&data_name) {
                Some(t) => {
                    let i = im.konst(&flat_name).expect("just inserted");
                    Ok(konst(fold::gather(&t, &i, 0).map_err(|m| cx.bad(m))?))
                }
                None => emit(im, cx, Op::Gather { axis: 0 }, &[&data_name, &flat_name]),
            }
        }
        "LRN" => {
            let size = usize::try_from(cx.int("size", 0)?).map_err(|_| cx.bad("negative size"))?;
            let op =
                Op::Lrn(crate::Lrn { size, alpha: cx.float("alpha", 1e-4)?, beta: cx.float("beta", 0.75)?, bias: cx.float("bias", 1.0)? });
            emit(im, cx, op, &[cx.need(0)?])
        }
        _ => Err(IrError::UnsupportedOp { op_type: op_type.to_string(), node: cx.name.clone(), opset: cx.opset }),
    }
}

/// The Reduce family. Mean, Sum and Max are `Op::Reduce`; the others are
/// built from it and elementwise ops (Min = -Max(-x), L1 = Sum|x|, L2 =
/// sqrt(Sum x^2), SumSquare, LogSum = log Sum, LogSumExp = m + log Sum
/// exp(x - m) with m = Max x). Empty axes with `noop_with_empty_axes`
/// keep the elementwise parts, as numpy's reduction over no axis; a
/// reduction over an empty extent is its identity, a constant.
fn reduce(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    let rank = ty.shape.len();
    let axes_in = (op_type == "ReduceSum" && cx.opset >= 13) || cx.opset >= 18;
    let given = if axes_in { const_ints(im, cx, 1, "axes")? } else { cx.ints("axes")? };
    let keepdims = cx.int("keepdims", 1)? != 0;
    let ax = match given {
        Some(v) if !v.is_empty() => axes(cx, &v, rank)?,
        _ if cx.int("noop_with_empty_axes", 0)? != 0 => Vec::new(),
        _ => (0..rank).collect(),
    };
    let float = ty.dtype.is_float();
    if !float && !matches!(op_type, "ReduceMean" | "ReduceSum" | "ReduceMax") {
        return Err(cx.unsupported(format!("{op_type} of {} (smelt computes it for float types)", ty.dtype)));
    }
    if ax.is_empty() && matches!(op_type, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceLogSumExp") {
        return reshaping(im, cx, Op::Identity, x);
    }
    let reduced = Op::Reduce { op: ReduceOp::Sum, axes: ax.clone(), keepdims };
    let out_ty = crate::infer::infer(&reduced, &[&ty]).map_err(|m| cx.bad(m))?.remove(0);
    if !ax.is_empty() && ax.iter().any(|&a| ty.shape[a] == 0) {
        let identity = match op_type {
            "ReduceMean" => f64::NAN,
            "ReduceMax" if ty.dtype == DType::Bool => 0.0,
            "ReduceMax" if ty.dtype == DType::I64 => i64::MIN as f64,
            "ReduceMax" if ty.dtype == DType::I32 => i32::MIN as f64,
            "ReduceMax" => f64::NEG_INFINITY,
            "ReduceMin" => f64::INFINITY,
            "ReduceLogSum" | "ReduceLogSumExp" => f64::NEG_INFINITY,
            _ => 0.0,
        };
        made(cx, &out_ty)?;
        return Ok(konst(Tensor::full(&out_ty, identity)));
    }
    let simple = match op_type {
        "ReduceMean" => Some(ReduceOp::Mean),
        "ReduceSum" => Some(ReduceOp::Sum),
        "ReduceMax" => Some(ReduceOp::Max),
        _ => None,
    };
    if let Some(op) = simple {
        if ty.dtype == DType::Bool {
            // Booleans reduce as 0 and 1.
            let xv = im.value(x)?;
            let f = one_value(im, cx, Op::Cast { to: DType::F32 }, &[xv])?;
            let m = one_value(im, cx, Op::Reduce { op, axes: ax, keepdims }, &[f])?;
            return Ok(vec![Entry { konst: None, value: Some(one_value(im, cx, Op::Cast { to: DType::Bool }, &[m])?) }]);
        }
        return emit(im, cx, Op::Reduce { op, axes: ax, keepdims }, &[x]);
    }
    let xv = im.value(x)?;
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| -> Result<ValueId, IrError> {
        Ok(emit_values(im, cx, op, vs)?[0].value.expect("a value"))
    };
    let sum = |ax: &[usize], keepdims: bool| Op::Reduce { op: ReduceOp::Sum, axes: ax.to_vec(), keepdims };
    let y = match op_type {
        "ReduceMin" => {
            let n = one(im, Op::Unary(UnaryOp::Neg), &[xv])?;
            let m = one(im, Op::Reduce { op: ReduceOp::Max, axes: ax, keepdims }, &[n])?;
            one(im, Op::Unary(UnaryOp::Neg), &[m])?
        }
        "ReduceL1" => {
            let a = one(im, Op::Unary(UnaryOp::Abs), &[xv])?;
            if ax.is_empty() {
                a
            } else {
                one(im, sum(&ax, keepdims), &[a])?
            }
        }
        "ReduceL2" | "ReduceSumSquare" => {
            let sq = one(im, Op::Binary(BinaryOp::Mul), &[xv, xv])?;
            let s = if ax.is_empty() { sq } else { one(im, sum(&ax, keepdims), &[sq])? };
            if op_type == "ReduceL2" {
                one(im, Op::Unary(UnaryOp::Sqrt), &[s])?
            } else {
                s
            }
        }
        "ReduceLogSum" => {
            let s = if ax.is_empty() { xv } else { one(im, sum(&ax, keepdims), &[xv])? };
            one(im, Op::Unary(UnaryOp::Log), &[s])?
        }
        _ => {
            // LogSumExp, shifted by the maximum so that exp cannot overflow.
            let m = one(im, Op::Reduce { op: ReduceOp::Max, axes: ax.clone(), keepdims: true }, &[xv])?;
            let d = one(im, Op::Binary(BinaryOp::Sub), &[xv, m])?;
            let e = one(im, Op::Unary(UnaryOp::Exp), &[d])?;
            let s = one(im, sum(&ax, true), &[e])?;
            let l = one(im, Op::Unary(UnaryOp::Log), &[s])?;
            let y = one(im, Op::Binary(BinaryOp::Add), &[l, m])?;
            if keepdims {
                y
            } else {
                one(im, Op::Reshape { shape: out_ty.shape.clone() }, &[y])?
            }
        }
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// Constants that import builds (masks, positions, identities) hold at
/// most this many elements.
const MADE_LIMIT: usize = 1 << 26;

/// Refuses to build a constant of `ty` over [`MADE_LIMIT`] elements.
fn made(cx: &Cx, ty: &TensorType) -> Result<(), IrError> {
    if ty.numel() > MADE_LIMIT {
        return Err(cx.too_large(format!("a constant {ty} to build (at most 2^26 elements)")));
    }
    Ok(())
}

/// A constant as a graph value (registered under a name derived from the node).
/// ScatterND with constant indices (what exporters write: a window's
/// mask, a slice assignment), any dtype: the data and the updates
/// flattened and concatenated, and one Gather that takes each element from
/// the data or, where an index row writes it, from the updates (the last
/// write of an element wins, as ONNX's reference does).
fn scatter_nd(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    match cx.string("reduction")?.as_deref().unwrap_or("none") {
        "none" => {}
        other => return Err(cx.unsupported(format!("ScatterND with reduction={other:?} (smelt computes \"none\")"))),
    }
    let (d, u) = (cx.need(0)?, cx.need(2)?);
    let (dt, ut) = (im.ty(d)?, im.ty(u)?);
    let idx = const_input(im, cx, 1, "indices")?;
    let k = *idx.shape().last().ok_or_else(|| cx.bad("invalid ONNX: ScatterND indices must have rank at least 1"))?;
    if k == 0 || k > dt.shape.len() {
        return Err(cx.bad(format!("invalid ONNX: index rows of {k} for data {dt}")));
    }
    let rows = idx.shape()[..idx.shape().len() - 1].to_vec();
    let mut want = rows.clone();
    want.extend_from_slice(&dt.shape[k..]);
    if ut.shape != want || ut.dtype != dt.dtype {
        return Err(cx.bad(format!("invalid ONNX: updates {ut} for data {dt} and indices {:?} (want {:?})", idx.shape(), want)));
    }
    let n = dt.numel();
    let slice: usize = dt.shape[k..].iter().product();
    made(cx, &TensorType::new(DType::I64, vec![n]))?;
    let mut from: Vec<i64> = (0..n as i64).collect();
    let iv = idx.to_i64_vec();
    for (j, row) in iv.chunks(k).enumerate() {
        let mut base = 0usize;
        for (a, &i) in row.iter().enumerate() {
            let dim = dt.shape[a] as i64;
            let i = if i < 0 { i + dim } else { i };
            if !(0..dim).contains(&i) {
                return Err(cx.bad(format!("index {i} out of range for extent {dim} (axis {a})")));
            }
            base = base * dt.shape[a] + i as usize;
        }
        for t in 0..slice {
            from[base * slice + t] = (n + j * slice + t) as i64;
        }
    }
    let (dv, uv) = (im.value(d)?, im.value(u)?);
    let df = one_value(im, cx, Op::Reshape { shape: vec![n] }, &[dv])?;
    let uf = one_value(im, cx, Op::Reshape { shape: vec![ut.numel()] }, &[uv])?;
    let both = one_value(im, cx, Op::Concat { axis: 0 }, &[df, uf])?;
    let at = constant(im, cx, "sources", Tensor::from_i64(vec![n], from))?;
    let picked = one_value(im, cx, Op::Gather { axis: 0 }, &[both, at])?;
    let out = one_value(im, cx, Op::Reshape { shape: dt.shape.clone() }, &[picked])?;
    Ok(vec![Entry { konst: None, value: Some(out) }])
}

pub(super) fn constant(im: &mut Importer, cx: &Cx, tag: &str, t: Tensor) -> Result<ValueId, IrError> {
    made(cx, t.ty())?;
    let name = format!("{}:{tag}", cx.name);
    im.env.insert(name.clone(), Entry { konst: Some(Arc::new(t)), value: None });
    im.value(&name)
}

/// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (LogSoftmax over
/// the classes, then the former), from comparisons and reductions: the
/// target's one-hot mask picks each element's class; `weight` scales it,
/// `ignore_index` zeroes it, and `mean` divides by the weights kept.
fn loss(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let sce = cx.node.op_type() == "SoftmaxCrossEntropyLoss";
    let (x, target) = (cx.need(0)?, cx.need(1)?);
    let (xt, tt) = (im.ty(x)?, im.ty(target)?);
    if !xt.dtype.is_float() {
        return Err(cx.bad(format!("invalid ONNX: the input must be a float tensor, got {xt}")));
    }
    if !matches!(tt.dtype, DType::I64 | DType::I32) {
        return Err(cx.bad(format!("invalid ONNX: the target must be int32 or int64, got {tt}")));
    }
    let rank = xt.shape.len();
    if rank < 2 || tt.shape.len() + 1 != rank || tt.shape[0] != xt.shape[0] || tt.shape[1..] != xt.shape[2..] {
        return Err(cx.bad(format!("invalid ONNX: input {xt} and target {tt} do not fit ([N, C, d...] and [N, d...])")));
    }
    let c = xt.shape[1];
    let reduction = cx.string("reduction")?.unwrap_or_else(|| "mean".into());
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(cx.unsupported(format!("reduction={reduction:?} (none, sum or mean)")));
    }
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| -> Result<ValueId, IrError> {
        Ok(emit_values(im, cx, op, vs)?[0].value.expect("a value"))
    };
    let mut xv = im.value(x)?;
    let log_prob = if sce { Some(one(im, Op::LogSoftmax { axis: 1 }, &[xv])?) } else { None };
    if let Some(lp) = log_prob {
        xv = lp;
    }
    // [N, 1, d...] against the classes [1, C, 1...]: the one-hot mask.
    let mut t_shape = tt.shape.clone();
    t_shape.insert(1, 1);
    let tv = im.value(target)?;
    let t1 = one(im, Op::Reshape { shape: t_shape }, &[tv])?;
    let mut c_shape = vec![1; rank];
    c_shape[1] = c;
    made(cx, &TensorType::new(tt.dtype, c_shape.clone()))?;
    let classes = Tensor::from_i64(c_shape.clone(), (0..c as i64).collect()).cast(tt.dtype);
    let classes = constant(im, cx, "classes", classes)?;
    let hot = one(im, Op::Compare(CompareOp::Equal), &[t1, classes])?;
    let zero = constant(im, cx, "zero", Tensor::full(&TensorType::new(xt.dtype, vec![]), 0.0))?;
    let over_classes = |keepdims| Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims };
    let picked = one(im, Op::Where, &[hot, xv, zero])?;
    let picked = one(im, over_classes(false), &[picked])?;
    // Each element's weight: weight[target], or 1; 0 where ignored.
    let w_full = match cx.input(2) {
        Some(w) => {
            let wt = im.ty(w)?;
            if wt.shape != [c] || wt.dtype != xt.dtype {
                return Err(cx.bad(format!("invalid ONNX: the weight must be {} of C = {c} classes, got {wt}", xt.dtype)));
            }
            let wv = im.value(w)?;
            one(im, Op::Reshape { shape: c_shape }, &[wv])?
        }
        None => constant(im, cx, "one", Tensor::full(&TensorType::new(xt.dtype, vec![]), 1.0))?,
    };
    let w = one(im, Op::Where, &[hot, w_full, zero])?;
    let mut w = one(im, over_classes(false), &[w])?;
    let mut picked = picked;
    if let Some(ii) = cx.attrs.get("ignore_index").map(|a| a.i()) {
        let ii = constant(im, cx, "ignore_index", Tensor::from_i64(vec![], vec![ii]).cast(tt.dtype))?;
        let ignored = one(im, Op::Compare(CompareOp::Equal), &[tv, ii])?;
        w = one(im, Op::Where, &[ignored, zero, w])?;
        // An ignored element is 0 even where its input is -inf.
        picked = one(im, Op::Where, &[ignored, zero, picked])?;
    }
    let weighted = one(im, Op::Binary(BinaryOp::Mul), &[picked, w])?;
    let per_element = one(im, Op::Unary(UnaryOp::Neg), &[weighted])?;
    let all: Vec<usize> = (0..rank - 1).collect();
    let total = |im: &mut Importer, v| one(im, Op::Reduce { op: ReduceOp::Sum, axes: all.clone(), keepdims: false }, &[v]);
    let y = match reduction.as_str() {
        "none" => per_element,
        "sum" => total(im, per_element)?,
        _ => {
            let (num, den) = (total(im, per_element)?, total(im, w)?);
            one(im, Op::Binary(BinaryOp::Div), &[num, den])?
        }
    };
    let mut out = vec![Entry { konst: None, value: Some(y) }];
    if sce && cx.extra_outputs_used(im, 1) {
        out.push(Entry { konst: None, value: log_prob });
    }
    Ok(out)
}

/// A scalar constant as a graph value.
/// GatherElements of integers at run time, exactly: a Gather of the
/// flattened data at each element's flat index (the position's offset, a
/// constant, plus the index, made non-negative, times the axis' stride).
/// The index arithmetic runs in smelt's integer ops, exact below 2^24: data
/// of more elements is refused.
fn gather_elements_exact(im: &mut Importer, cx: &Cx, data: ValueId, ty: &TensorType, a: usize) -> Result<Vec<Entry>, IrError> {
    let i = cx.need(1)?;
    let it = im.ty(i)?;
    let numel = ty.numel();
    if numel > 1 << 24 {
        return Err(cx.unsupported(format!("GatherElements at run time of {ty} (integer data of at most 2^24 elements)")));
    }
    let r = ty.shape.len();
    let mut strides = vec![1usize; r];
    for d in (0..r.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * ty.shape[d + 1];
    }
    // The offset of each position of the indices, but along the axis.
    let positions = it.numel();
    made(cx, &TensorType::new(DType::I64, vec![positions]))?;
    let mut base = Vec::with_capacity(positions);
    for p in 0..positions {
        let (mut rest, mut off) = (p, 0usize);
        for d in (0..r).rev() {
            let k = rest % it.shape[d];
            rest /= it.shape[d];
            if d != a {
                off += k * strides[d];
            }
        }
        base.push(off as i64);
    }
    let iv = im.value(i)?;
    let iv = if it.dtype == DType::I64 { iv } else { one_value(im, cx, Op::Cast { to: DType::I64 }, &[iv])? };
    let zero = scalar(im, cx, "zero", DType::I64, 0.0)?;
    let dim = scalar(im, cx, "extent", DType::I64, ty.shape[a] as f64)?;
    let stride = scalar(im, cx, "stride", DType::I64, strides[a] as f64)?;
    let negative = one_value(im, cx, Op::Compare(CompareOp::Less), &[iv, zero])?;
    let wrapped = one_value(im, cx, Op::Binary(BinaryOp::Add), &[iv, dim])?;
    let index = one_value(im, cx, Op::Where, &[negative, wrapped, iv])?;
    let scaled = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[index, stride])?;
    let base = constant(im, cx, "offsets", Tensor::from_i64(it.shape.clone(), base))?;
    let flat_index = one_value(im, cx, Op::Binary(BinaryOp::Add), &[scaled, base])?;
    let flat = one_value(im, cx, Op::Reshape { shape: vec![numel] }, &[data])?;
    let out = one_value(im, cx, Op::Gather { axis: 0 }, &[flat, flat_index])?;
    Ok(vec![Entry { konst: None, value: Some(out) }])
}

fn scalar(im: &mut Importer, cx: &Cx, tag: &str, dtype: DType, v: f64) -> Result<ValueId, IrError> {
    constant(im, cx, tag, Tensor::full(&TensorType::new(dtype, vec![]), v))
}

pub(super) fn one_value(im: &mut Importer, cx: &Cx, op: Op, vs: &[ValueId]) -> Result<ValueId, IrError> {
    Ok(emit_values(im, cx, op, vs)?[0].value.expect("a value"))
}

/// The stash type (f32) of LayerNormalization and RMSNormalization:
/// the statistics are computed in it.
fn stashed(im: &mut Importer, cx: &Cx, x: &str) -> Result<ValueId, IrError> {
    if cx.int("stash_type", 1)? != 1 {
        return Err(
            cx.unsupported(format!("stash_type={} (smelt computes the statistics in float32, stash_type=1)", cx.int("stash_type", 1)?))
        );
    }
    let (xv, dtype) = (im.value(x)?, im.ty(x)?.dtype);
    if !dtype.is_float() {
        return Err(cx.bad(format!("invalid ONNX: X must be a float tensor, got {dtype}")));
    }
    if dtype == DType::F32 {
        Ok(xv)
    } else {
        one_value(im, cx, Op::Cast { to: DType::F32 }, &[xv])
    }
}

/// LayerNormalization's Mean and InvStdDev outputs (f32, keeping the
/// normalised dims as 1): mean and 1 / sqrt(var + epsilon).
fn layer_norm_stats(im: &mut Importer, cx: &Cx, x: &str, ax: usize, epsilon: f32) -> Result<Vec<Entry>, IrError> {
    let rank = im.ty(x)?.shape.len();
    let xf = stashed(im, cx, x)?;
    let mean = |axes: Vec<usize>| Op::Reduce { op: ReduceOp::Mean, axes, keepdims: true };
    let m = one_value(im, cx, mean((ax..rank).collect()), &[xf])?;
    let d = one_value(im, cx, Op::Binary(BinaryOp::Sub), &[xf, m])?;
    let sq = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[d, d])?;
    let var = one_value(im, cx, mean((ax..rank).collect()), &[sq])?;
    let eps = scalar(im, cx, "epsilon", DType::F32, epsilon as f64)?;
    let v = one_value(im, cx, Op::Binary(BinaryOp::Add), &[var, eps])?;
    let sd = one_value(im, cx, Op::Unary(UnaryOp::Sqrt), &[v])?;
    let inv = one_value(im, cx, Op::Unary(UnaryOp::Reciprocal), &[sd])?;
    Ok(vec![Entry { konst: None, value: Some(m) }, Entry { konst: None, value: Some(inv) }])
}

/// RMSNormalization: x / sqrt(mean(x^2) + epsilon) over the dims from
/// `axis` on, in f32, then times `scale`.
fn rms_norm(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, scale) = (cx.need(0)?, cx.need(1)?);
    let ty = im.ty(x)?;
    let ax = axis(cx, cx.int("axis", -1)?, ty.shape.len())?;
    let xf = stashed(im, cx, x)?;
    let sq = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[xf, xf])?;
    let ms = one_value(im, cx, Op::Reduce { op: ReduceOp::Mean, axes: (ax..ty.shape.len()).collect(), keepdims: true }, &[sq])?;
    let eps = scalar(im, cx, "epsilon", DType::F32, cx.float("epsilon", 1e-5)? as f64)?;
    let v = one_value(im, cx, Op::Binary(BinaryOp::Add), &[ms, eps])?;
    let rms = one_value(im, cx, Op::Unary(UnaryOp::Sqrt), &[v])?;
    let mut y = one_value(im, cx, Op::Binary(BinaryOp::Div), &[xf, rms])?;
    if ty.dtype != DType::F32 {
        y = one_value(im, cx, Op::Cast { to: ty.dtype }, &[y])?;
    }
    let sv = im.value(scale)?;
    let y = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[y, sv])?;
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// HardSigmoid = clip(alpha x + beta, 0, 1); Celu = alpha elu(x / alpha);
/// IsInf = x == +inf or x == -inf (as detected); Softsign = x / (1 + |x|);
/// HardSwish = x hardsigmoid(x) (alpha 1/6); Swish = x sigmoid(alpha x);
/// Mish = x tanh(softplus(x)); ThresholdedRelu = x where x > alpha, else
/// 0; GlobalMaxPool = the maximum over the spatial dims.
fn small_decompositions(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let dtype = im.ty(x)?.dtype;
    if !dtype.is_float() {
        return Err(cx.unsupported(format!("{} of {dtype} (smelt computes it for float types)", cx.node.op_type())));
    }
    let xv = im.value(x)?;
    let mul = Op::Binary(BinaryOp::Mul);
    let unary = |im: &mut Importer, u: UnaryOp, v: ValueId| one_value(im, cx, Op::Unary(u), &[v]);
    let y = match cx.node.op_type() {
        op @ ("HardSigmoid" | "HardSwish") => {
            let (alpha, beta) =
                if op == "HardSwish" { (1.0 / 6.0, 0.5) } else { (cx.float("alpha", 0.2)? as f64, cx.float("beta", 0.5)? as f64) };
            let a = scalar(im, cx, "alpha", dtype, alpha)?;
            let b = scalar(im, cx, "beta", dtype, beta)?;
            let ax = one_value(im, cx, mul.clone(), &[xv, a])?;
            let y = one_value(im, cx, Op::Binary(BinaryOp::Add), &[ax, b])?;
            let hs = one_value(im, cx, Op::Clip { min: 0.0, max: 1.0 }, &[y])?;
            if op == "HardSwish" {
                one_value(im, cx, mul, &[xv, hs])?
            } else {
                hs
            }
        }
        "Softsign" => {
            let a = unary(im, UnaryOp::Abs, xv)?;
            let one_ = scalar(im, cx, "one", dtype, 1.0)?;
            let d = one_value(im, cx, Op::Binary(BinaryOp::Add), &[a, one_])?;
            one_value(im, cx, Op::Binary(BinaryOp::Div), &[xv, d])?
        }
        "Swish" => {
            let a = scalar(im, cx, "alpha", dtype, cx.float("alpha", 1.0)? as f64)?;
            let ax = one_value(im, cx, mul.clone(), &[xv, a])?;
            let s = unary(im, UnaryOp::Sigmoid, ax)?;
            one_value(im, cx, mul, &[xv, s])?
        }
        "Mish" => {
            let sp = unary(im, UnaryOp::Softplus, xv)?;
            let t = unary(im, UnaryOp::Tanh, sp)?;
            one_value(im, cx, mul, &[xv, t])?
        }
        "ThresholdedRelu" => {
            let a = scalar(im, cx, "alpha", dtype, cx.float("alpha", 1.0)? as f64)?;
            let keep = one_value(im, cx, Op::Compare(CompareOp::Greater), &[xv, a])?;
            let zero = scalar(im, cx, "zero", dtype, 0.0)?;
            one_value(im, cx, Op::Where, &[keep, xv, zero])?
        }
        "GlobalMaxPool" => {
            let rank = im.ty(x)?.shape.len();
            if rank < 3 {
                return Err(cx.bad(format!("invalid ONNX: GlobalMaxPool needs [N, C, spatial...], got {}", im.ty(x)?)));
            }
            one_value(im, cx, Op::Reduce { op: ReduceOp::Max, axes: (2..rank).collect(), keepdims: true }, &[xv])?
        }
        "Celu" => {
            let alpha = cx.float("alpha", 1.0)?;
            let inv = scalar(im, cx, "1/alpha", dtype, 1.0 / alpha as f64)?;
            let a = scalar(im, cx, "alpha", dtype, alpha as f64)?;
            let s = one_value(im, cx, mul.clone(), &[xv, inv])?;
            let e = one_value(im, cx, Op::Unary(UnaryOp::Elu(1.0)), &[s])?;
            one_value(im, cx, mul, &[e, a])?
        }
        _ => {
            let (pos, neg) = (cx.int("detect_positive", 1)? != 0, cx.int("detect_negative", 1)? != 0);
            let eq = Op::Compare(CompareOp::Equal);
            let p = scalar(im, cx, "+inf", dtype, f64::INFINITY)?;
            let n = scalar(im, cx, "-inf", dtype, f64::NEG_INFINITY)?;
            let is_p = one_value(im, cx, eq.clone(), &[xv, p])?;
            let is_n = one_value(im, cx, eq, &[xv, n])?;
            match (pos, neg) {
                (true, true) => one_value(im, cx, Op::Logic(LogicOp::Or), &[is_p, is_n])?,
                (true, false) => is_p,
                (false, true) => is_n,
                (false, false) => {
                    let t = TensorType::new(DType::Bool, im.ty(x)?.shape);
                    made(cx, &t)?;
                    return Ok(konst(Tensor::full(&t, 0.0)));
                }
            }
        }
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// ONNX Attention (opsets 23 to 25) as the reference computes it: 3-D
/// inputs split into heads, the KV cache appended (`present_key`,
/// `present_value`), grouped KV heads repeated, Q and K each scaled by
/// sqrt(scale), softcap, an additive bias (the mask, bool or float and
/// padded to the keys; causal and sliding-window limits aligned to the
/// bottom right; `nonpad_kv_seqlen`'s padding), softmax (in
/// `softmax_precision`) with rows that attend nothing zeroed, and the
/// product with V. The static part of the bias is a constant.
fn attention(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (q, k, v) = (cx.need(0)?, cx.need(1)?, cx.need(2)?);
    let (qt, kt, vt) = (im.ty(q)?, im.ty(k)?, im.ty(v)?);
    let dt = qt.dtype;
    let rank = qt.shape.len();
    if !dt.is_float() || kt.dtype != dt || vt.dtype != dt {
        return Err(cx.bad(format!("invalid ONNX: Q, K and V must share a float type, got {qt}, {kt} and {vt}")));
    }
    if !(rank == 3 || rank == 4) || kt.shape.len() != rank || vt.shape.len() != rank {
        return Err(cx.bad(format!("invalid ONNX: Q, K and V must all be 3-D or all 4-D, got {qt}, {kt} and {vt}")));
    }
    let heads = |name: &str| -> Result<Option<usize>, IrError> {
        match cx.attrs.get(name).map(|a| a.i()) {
            None => Ok(None),
            Some(h) if h > 0 => Ok(Some(h as usize)),
            Some(h) => Err(cx.bad(format!("invalid ONNX: {name}={h}"))),
        }
    };
    let (hq, hkv) = (heads("q_num_heads")?, heads("kv_num_heads")?);
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let b = qt.shape[0];
    // [B, H, S, D] views.
    let to_4d = |im: &mut Importer, name: &str, t: &TensorType, h: Option<usize>| -> Result<(ValueId, [usize; 4]), IrError> {
        let x = im.value(name)?;
        if rank == 4 {
            return Ok((x, [t.shape[0], t.shape[1], t.shape[2], t.shape[3]]));
        }
        let h = h.ok_or_else(|| cx.bad("invalid ONNX: 3-D inputs need q_num_heads and kv_num_heads"))?;
        let (s, hidden) = (t.shape[1], t.shape[2]);
        if hidden % h != 0 || t.shape[0] != b {
            return Err(cx.bad(format!("invalid ONNX: {t} does not split into {h} heads")));
        }
        let x = one(im, Op::Reshape { shape: vec![b, s, h, hidden / h] }, &[x])?;
        Ok((one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[x])?, [b, h, s, hidden / h]))
    };
    let (qv, qs) = to_4d(im, q, &qt, hq)?;
    let (mut kv, mut ks) = to_4d(im, k, &kt, hkv)?;
    let (mut vv, mut vs) = to_4d(im, v, &vt, hkv)?;
    if qs[1] == 0 || ks[1] == 0 || ks[0] != b || vs[0] != b || ks[1] != vs[1] || ks[2] != vs[2] || ks[3] != qs[3] {
        return Err(cx.bad(format!("invalid ONNX: Q {qt}, K {kt} and V {vt} do not fit")));
    }
    // The KV cache.
    let past = match (cx.input(4), cx.input(5)) {
        (Some(pk), Some(pv)) => Some((pk, pv)),
        (None, None) => None,
        _ => return Err(cx.bad("invalid ONNX: past_key and past_value come together")),
    };
    let past_len = match past {
        Some((pk, pv)) => {
            let (pkt, pvt) = (im.ty(pk)?, im.ty(pv)?);
            if pkt.shape.len() != 4
                || pkt.shape[..2] != ks[..2]
                || pkt.shape[3] != ks[3]
                || pvt.shape != [vs[0], vs[1], pkt.shape[2], vs[3]]
            {
                return Err(cx.bad(format!("invalid ONNX: past_key {pkt} and past_value {pvt} do not fit K and V")));
            }
            let (pkv, pvv) = (im.value(pk)?, im.value(pv)?);
            kv = one(im, Op::Concat { axis: 2 }, &[pkv, kv])?;
            vv = one(im, Op::Concat { axis: 2 }, &[pvv, vv])?;
            ks[2] += pkt.shape[2];
            vs[2] += pkt.shape[2];
            pkt.shape[2]
        }
        None => 0,
    };
    let (present_k, present_v) = (kv, vv);
    let (sq, skv) = (qs[2], ks[2]);
    // Grouped KV heads: each repeated for its group of query heads.
    if qs[1] != ks[1] {
        if qs[1] % ks[1] != 0 {
            return Err(cx.bad(format!("invalid ONNX: {} query heads do not group over {} KV heads", qs[1], ks[1])));
        }
        let g = qs[1] / ks[1];
        for (val, s) in [(&mut kv, ks), (&mut vv, vs)] {
            let x = one(im, Op::Reshape { shape: vec![b, s[1], 1, s[2], s[3]] }, &[*val])?;
            let x = one(im, Op::Expand { shape: vec![b, s[1], g, s[2], s[3]] }, &[x])?;
            *val = one(im, Op::Reshape { shape: vec![b, s[1] * g, s[2], s[3]] }, &[x])?;
        }
    }
    // Scores: (Q sqrt(scale)) (K sqrt(scale))^T.
    let scale = match cx.attrs.get("scale") {
        Some(a) => a.f() as f64,
        None => 1.0 / (qs[3] as f64).sqrt(),
    };
    let root = scalar(im, cx, "sqrt(scale)", dt, scale.sqrt())?;
    let mul = Op::Binary(BinaryOp::Mul);
    let qv = one(im, mul.clone(), &[qv, root])?;
    let kv = one(im, mul.clone(), &[kv, root])?;
    let kt_ = one(im, Op::Transpose { perm: vec![0, 1, 3, 2] }, &[kv])?;
    let mut qk = one(im, Op::MatMul, &[qv, kt_])?;
    let softcap = cx.float("softcap", 0.0)?;
    if softcap > 0.0 {
        let inv = scalar(im, cx, "1/softcap", dt, 1.0 / softcap as f64)?;
        let cap = scalar(im, cx, "softcap", dt, softcap as f64)?;
        let x = one(im, mul.clone(), &[qk, inv])?;
        let x = one(im, Op::Unary(UnaryOp::Tanh), &[x])?;
        qk = one(im, mul.clone(), &[x, cap])?;
    }
    // The additive bias: the static limits, a constant [Sq, Skv] ...
    let causal = cx.int("is_causal", 0)? != 0;
    let (left, right) = (cx.int("left_window_size", -1)?, cx.int("right_window_size", -1)?);
    if left < -1 || right < -1 {
        return Err(cx.bad(format!("invalid ONNX: window sizes {left} and {right} (-1 or more)")));
    }
    // Beyond the keys and queries a window limits nothing.
    let reach = (qs[2] + ks[2]) as i64;
    let (left, right) = (left.min(reach), right.min(reach));
    let nonpad = cx.input(6);
    if nonpad.is_some() && past.is_some() {
        return Err(cx.bad("invalid ONNX: nonpad_kv_seqlen cannot be combined with past_key and past_value"));
    }
    made(cx, &TensorType::new(dt, vec![sq, skv]))?;
    let (sqi, skvi) = (sq as i64, skv as i64);
    let allowed = |i: i64, j: i64, off: i64| {
        let diff = i + off - j;
        (!causal || j <= i + off) && (left < 0 || diff <= left) && (right < 0 || -diff <= right)
    };
    let neg_inf = f32::NEG_INFINITY;
    let mut bias: Option<ValueId> = None;
    let add = |im: &mut Importer, bias: Option<ValueId>, x: ValueId| -> Result<ValueId, IrError> {
        match bias {
            None => Ok(x),
            Some(b0) => one(im, Op::Binary(BinaryOp::Add), &[b0, x]),
        }
    };
    if nonpad.is_none() && (causal || left >= 0 || right >= 0) {
        let m: Vec<f32> = (0..sqi)
            .flat_map(|i| (0..skvi).map(move |j| (i, j)))
            .map(|(i, j)| if allowed(i, j, past_len as i64) { 0.0 } else { neg_inf })
            .collect();
        let c = constant(im, cx, "limits", Tensor::from_f32(vec![sq, skv], m).cast(dt))?;
        bias = Some(c);
    }
    let zero = scalar(im, cx, "zero", dt, 0.0)?;
    let minus_inf = scalar(im, cx, "-inf", dt, f64::NEG_INFINITY)?;
    // ... the mask, padded to the keys ...
    if let Some(mask) = cx.input(3) {
        let mt = im.ty(mask)?;
        let last = *mt.shape.last().ok_or_else(|| cx.bad("invalid ONNX: attn_mask is a scalar"))?;
        if last > skv || (mt.dtype != DType::Bool && mt.dtype != dt) {
            return Err(cx.bad(format!("invalid ONNX: attn_mask {mt} does not fit {skv} keys of {dt}")));
        }
        let mut mv = im.value(mask)?;
        if mt.dtype == DType::Bool {
            mv = one(im, Op::Where, &[mv, zero, minus_inf])?;
        }
        if last < skv {
            let mut pad_shape = mt.shape.clone();
            *pad_shape.last_mut().expect("not a scalar") = skv - last;
            made(cx, &TensorType::new(dt, pad_shape.clone()))?;
            let pad = constant(im, cx, "mask padding", Tensor::full(&TensorType::new(dt, pad_shape), f64::NEG_INFINITY))?;
            mv = one(im, Op::Concat { axis: mt.shape.len() - 1 }, &[mv, pad])?;
        }
        bias = Some(add(im, bias, mv)?);
    }
    // ... and the per-batch limits of nonpad_kv_seqlen: key j of batch b
    // is kept when j < n[b], and the causal and window limits hold at the
    // offset n[b] - Sq; each a comparison of n[b] with a constant [Sq, Skv].
    if let Some(n) = nonpad {
        let nt = im.ty(n)?;
        if nt.shape != [b] || !matches!(nt.dtype, DType::I64 | DType::I32) {
            return Err(cx.bad(format!("invalid ONNX: nonpad_kv_seqlen must be int64 [{b}], got {nt}")));
        }
        let nv = im.value(n)?;
        let n3 = one(im, Op::Reshape { shape: vec![b, 1, 1] }, &[nv])?;
        let grid = |f: &dyn Fn(i64, i64) -> i64| -> Tensor {
            let v: Vec<i64> = (0..sqi).flat_map(|i| (0..skvi).map(move |j| (i, j))).map(|(i, j)| f(i, j)).collect();
            Tensor::from_i64(vec![sq, skv], v).cast(nt.dtype)
        };
        // (the comparison, the constant it compares n with)
        let mut conds: Vec<(CompareOp, Tensor)> = vec![(CompareOp::Greater, grid(&|_, j| j))];
        if causal {
            conds.push((CompareOp::GreaterOrEqual, grid(&|i, j| j - i + sqi)));
        }
        if left >= 0 {
            conds.push((CompareOp::LessOrEqual, grid(&|i, j| left - i + sqi + j)));
        }
        if right >= 0 {
            conds.push((CompareOp::GreaterOrEqual, grid(&|i, j| j - i + sqi - right)));
        }
        let mut keep: Option<ValueId> = None;
        for (i, (op, t)) in conds.into_iter().enumerate() {
            let c = constant(im, cx, &format!("nonpad limit {i}"), t)?;
            let x = one(im, Op::Compare(op), &[n3, c])?;
            keep = Some(match keep {
                None => x,
                Some(k0) => one(im, Op::Logic(LogicOp::And), &[k0, x])?,
            });
        }
        let keep = keep.expect("at least the padding");
        let pb = one(im, Op::Where, &[keep, zero, minus_inf])?;
        let pb = one(im, Op::Reshape { shape: vec![b, 1, sq, skv] }, &[pb])?;
        bias = Some(add(im, bias, pb)?);
    }
    let mode = cx.int("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(cx.bad(format!("invalid ONNX: qk_matmul_output_mode={mode} (0 to 3)")));
    }
    let with_bias = match bias {
        Some(bv) => one(im, Op::Binary(BinaryOp::Add), &[qk, bv])?,
        None => qk,
    };
    let mut logits = with_bias;
    let sp = match cx.attrs.get("softmax_precision").map(|a| a.i()) {
        None => dt,
        Some(code) => super::tensor::dtype_of(code as i32)
            .ok()
            .filter(|d| d.is_float())
            .ok_or_else(|| cx.unsupported(format!("softmax_precision={code} (smelt computes softmax in float, float16 or bfloat16)")))?,
    };
    if sp != dt {
        logits = one(im, Op::Cast { to: sp }, &[logits])?;
    }
    let mut p = one(im, Op::Softmax { axis: 3 }, &[logits])?;
    // A row whose bias is -inf everywhere attends nothing: zeros.
    if let Some(bv) = bias {
        let m = one(im, Op::Reduce { op: ReduceOp::Max, axes: vec![im.g.ty(bv).shape.len() - 1], keepdims: true }, &[bv])?;
        let none = one(im, Op::Compare(CompareOp::Equal), &[m, minus_inf])?;
        let zero_sp = scalar(im, cx, "zero (softmax)", sp, 0.0)?;
        p = one(im, Op::Where, &[none, zero_sp, p])?;
    }
    if sp != dt {
        p = one(im, Op::Cast { to: dt }, &[p])?;
    }
    let mut y = one(im, Op::MatMul, &[p, vv])?;
    if rank == 3 {
        let h = qs[1];
        y = one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[y])?;
        y = one(im, Op::Reshape { shape: vec![b, sq, h * vs[3]] }, &[y])?;
    }
    // Modes 0 and 1 give the scores after softcap, as the reference does
    // (the spec's mode 0 is the raw product; they differ only with softcap).
    let qk_out = match mode {
        0 | 1 => qk,
        2 => with_bias,
        _ => p,
    };
    let e = |v: ValueId| Entry { konst: None, value: Some(v) };
    Ok(vec![e(y), e(present_k), e(present_v), e(qk_out)])
}

/// ConvTranspose: the adjoint of the convolution with the same attributes
/// whose input has the output's shape (`Op::ConvGradData`), sized and
/// padded as the ONNX reference does (`output_shape`, `output_padding`,
/// `auto_pad`), then the bias.
fn conv_transpose(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, w) = (cx.need(0)?, cx.need(1)?);
    let (xt, wt) = (im.ty(x)?, im.ty(w)?);
    if wt.shape.len() < 3 || xt.shape.len() != wt.shape.len() || !xt.dtype.is_float() {
        return Err(cx.bad(format!("input {xt} and weight {wt} do not fit a transposed convolution")));
    }
    let n = wt.shape.len() - 2;
    let kernel = wt.shape[2..].to_vec();
    if let Some(k) = cx.ints("kernel_shape")? {
        if cx.usizes(k.clone(), "kernel_shape")? != kernel {
            return Err(cx.bad(format!("kernel_shape {k:?} does not match weight {wt}")));
        }
    }
    let strides = spatial_attr(cx, "strides", n)?;
    let dilations = spatial_attr(cx, "dilations", n)?;
    let group = usize::try_from(cx.int("group", 1)?).ok().filter(|&g| g > 0).ok_or_else(|| cx.bad("group must be positive"))?;
    if xt.shape[1] != wt.shape[0] || xt.shape[1] == 0 || xt.shape[1] % group != 0 {
        return Err(cx.bad(format!("input {xt} has not the weight {wt}'s {} input channels in {group} groups", wt.shape[0])));
    }
    let list = |k: &str| -> Result<Option<Vec<i64>>, IrError> { cx.ints(k) };
    let output_padding = list("output_padding")?.unwrap_or_else(|| vec![0; n]);
    // In i128: no attribute can overflow it.
    let spatial_in: Vec<i128> = xt.shape[2..].iter().map(|&d| d as i128).collect();
    let natural = |i: usize| {
        strides[i] as i128 * (spatial_in[i] - 1)
            + output_padding.get(i).copied().unwrap_or(0) as i128
            + (kernel[i] as i128 - 1) * dilations[i] as i128
            + 1
    };
    let auto = cx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let mut output_shape = list("output_shape")?.map(|v| if v.len() == n + 2 { v[2..].to_vec() } else { v });
    if output_shape.as_ref().is_some_and(|v| v.len() != n) || output_padding.len() != n {
        return Err(cx.bad(format!("invalid ONNX: output_shape and output_padding need {n} values")));
    }
    let pads: Vec<i128> = match (list("pads")?, auto.as_str()) {
        (None, "SAME_UPPER" | "SAME_LOWER") => {
            let out = output_shape
                .get_or_insert_with(|| (0..n).map(|i| (spatial_in[i] * strides[i] as i128).min(i64::MAX as i128) as i64).collect())
                .clone();
            let total: Vec<i128> = (0..n).map(|i| natural(i) - out[i] as i128).collect();
            let (small, big): (Vec<i128>, Vec<i128>) = total.iter().map(|t| (t / 2, t - t / 2)).unzip();
            if auto == "SAME_UPPER" {
                [small, big].concat()
            } else {
                [big, small].concat()
            }
        }
        (None, "NOTSET" | "VALID") => vec![0; 2 * n],
        (Some(p), "NOTSET") if p.len() == 2 * n => p.into_iter().map(i128::from).collect(),
        (Some(p), _) => return Err(cx.bad(format!("invalid ONNX: pads {p:?} with auto_pad {auto}"))),
        (None, other) => return Err(cx.unsupported(format!("auto_pad={other}"))),
    };
    let out: Vec<i128> = match output_shape {
        Some(o) => o.into_iter().map(i128::from).collect(),
        None => (0..n).map(|i| natural(i) - pads[i] - pads[i + n]).collect(),
    };
    if pads.iter().any(|&p| p < 0) || out.iter().any(|&o| o <= 0) {
        return Err(cx.unsupported(format!("pads {pads:?} and output size {out:?} (negative padding)")));
    }
    let huge = |v: i128| v > 1 << 40;
    if pads.iter().copied().any(huge) || out.iter().copied().any(huge) {
        return Err(cx.too_large(format!("pads {pads:?} and output size {out:?}")));
    }
    let channels = wt.shape[1].checked_mul(group).ok_or_else(|| cx.too_large(format!("{} x {group} output channels", wt.shape[1])))?;
    let mut shape = vec![xt.shape[0], channels];
    shape.extend(out.iter().map(|&o| o as usize));
    let conv = Conv { strides, pads: pads.iter().map(|&p| p as usize).collect(), dilations, group };
    // The forward convolution of the output's shape must give the input's.
    // (Its weight [C_in, C_out / group, k...] is the transposed one's.)
    let fwd = crate::infer::infer(&Op::Conv(conv.clone()), &[&TensorType::new(xt.dtype, shape.clone()), &wt]);
    if fwd.ok().map(|t| t[0].shape.clone()) != Some(xt.shape.clone()) {
        return Err(cx.unsupported(format!("an output of {out:?} that the convolution it transposes does not map back onto {xt}")));
    }
    let xv = im.value(x)?;
    let wv = im.value(w)?;
    let y = if n == 1 {
        // 1-D as 2-D with a height of 1 (the kernels are 2-D).
        let (mut xs, mut ws, mut ys) = (xt.shape.clone(), wt.shape.clone(), shape.clone());
        xs.insert(2, 1);
        ws.insert(2, 1);
        ys.insert(2, 1);
        let conv2 = Conv {
            strides: vec![1, conv.strides[0]],
            pads: vec![0, conv.pads[0], 0, conv.pads[1]],
            dilations: vec![1, conv.dilations[0]],
            group,
        };
        let x2 = one_value(im, cx, Op::Reshape { shape: xs }, &[xv])?;
        let w2 = one_value(im, cx, Op::Reshape { shape: ws }, &[wv])?;
        let y2 = one_value(im, cx, Op::ConvGradData { conv: conv2, shape: ys }, &[x2, w2])?;
        one_value(im, cx, Op::Reshape { shape: shape.clone() }, &[y2])?
    } else {
        one_value(im, cx, Op::ConvGradData { conv, shape: shape.clone() }, &[xv, wv])?
    };
    let y = match cx.input(2) {
        Some(bias) => {
            let bt = im.ty(bias)?;
            if bt.shape != [shape[1]] {
                return Err(cx.bad(format!("invalid ONNX: the bias must be [{}], got {bt}", shape[1])));
            }
            let mut bshape = vec![1; shape.len()];
            bshape[1] = shape[1];
            let bv = im.value(bias)?;
            let b = one_value(im, cx, Op::Reshape { shape: bshape }, &[bv])?;
            one_value(im, cx, Op::Binary(BinaryOp::Add), &[y, b])?
        }
        None => y,
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// ArgMax and ArgMin: the maximum (of x, or of -x) along the axis, then
/// the first (or last, `select_last_index`) position that holds it, as
/// the largest of -index (or of index) where x equals it; int64.
fn arg_extreme(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.unsupported(format!("{} of {} (smelt computes it for float types)", cx.node.op_type(), ty.dtype)));
    }
    let rank = ty.shape.len();
    let ax = axis(cx, cx.int("axis", 0)?, rank.max(1))?;
    let n = *ty.shape.get(ax).ok_or_else(|| cx.bad("invalid ONNX: a scalar has no axis"))?;
    if n == 0 || n > 1 << 24 {
        return Err(cx.unsupported(format!("{} over {n} elements (1 to 2^24)", cx.node.op_type())));
    }
    let keepdims = cx.int("keepdims", 1)? != 0;
    let last = cx.int("select_last_index", 0)? != 0;
    let mut xv = im.value(x)?;
    if cx.node.op_type() == "ArgMin" {
        xv = one_value(im, cx, Op::Unary(UnaryOp::Neg), &[xv])?;
    }
    let max = |keepdims| Op::Reduce { op: ReduceOp::Max, axes: vec![ax], keepdims };
    let m = one_value(im, cx, max(true), &[xv])?;
    let at = one_value(im, cx, Op::Compare(CompareOp::Equal), &[xv, m])?;
    // As numpy: where the slice holds a NaN, the (first or last) NaN.
    let nan = one_value(im, cx, Op::IsNaN, &[xv])?;
    let nan_f = one_value(im, cx, Op::Cast { to: DType::F32 }, &[nan])?;
    let any = one_value(im, cx, max(true), &[nan_f])?;
    let any = one_value(im, cx, Op::Cast { to: DType::Bool }, &[any])?;
    let at = one_value(im, cx, Op::Where, &[any, nan, at])?;
    let mut shape = vec![1; rank];
    shape[ax] = n;
    // Positions in f32 (exact below 2^24): index for the last, -index for the first.
    let sign = if last { 1.0 } else { -1.0 };
    let idx = Tensor::from_f32(shape, (0..n).map(|i| sign * i as f32).collect());
    let idx = constant(im, cx, "positions", idx)?;
    let none = scalar(im, cx, "no position", DType::F32, -(n as f64) - 1.0)?;
    let cand = one_value(im, cx, Op::Where, &[at, idx, none])?;
    let mut r = one_value(im, cx, max(keepdims), &[cand])?;
    if !last {
        r = one_value(im, cx, Op::Unary(UnaryOp::Neg), &[r])?;
    }
    let r = one_value(im, cx, Op::Cast { to: DType::I64 }, &[r])?;
    Ok(vec![Entry { konst: None, value: Some(r) }])
}

/// Resize (opset 11 on), separably as the ONNX reference computes it: for
/// each resized axis a constant interpolation matrix [in, out] (nearest,
/// linear or cubic taps, antialiased when asked, `exclude_outside`, every
/// coordinate transformation; rows outside the crop of
/// `tf_crop_and_resize` hold the extrapolation value), applied by a MatMul
/// with the axis moved last.
fn resize(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    if cx.opset < 11 {
        return Err(cx.unsupported("Resize before opset 11 (no roi input)"));
    }
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.unsupported(format!("Resize of {} (smelt resizes float tensors)", ty.dtype)));
    }
    let r = ty.shape.len();
    let floats = |i: usize, what: &str| -> Result<Option<Vec<f64>>, IrError> {
        match cx.input(i) {
            None => Ok(None),
            Some(_) => {
                let t = const_input(im, cx, i, what)?;
                Ok((t.ty().numel() > 0).then(|| t.to_f32_vec().into_iter().map(|v| v as f64).collect()))
            }
        }
    };
    let roi_in = floats(1, "roi")?;
    let scales_in = floats(2, "scales")?;
    let sizes_in = match cx.input(3) {
        None => None,
        Some(_) => {
            let t = const_input(im, cx, 3, "sizes")?;
            (t.ty().numel() > 0).then(|| t.to_i64_vec())
        }
    };
    let axes_attr = match cx.ints("axes")? {
        Some(a) => a.iter().map(|&a| axis(cx, a, r)).collect::<Result<Vec<_>, _>>()?,
        None => (0..r).collect(),
    };
    let n_ax = axes_attr.len();
    let s = |k: &str, d: &str| -> Result<String, IrError> { Ok(cx.string(k)?.unwrap_or_else(|| d.into())) };
    let mode = s("mode", "nearest")?;
    let ctm = s("coordinate_transformation_mode", "half_pixel")?;
    let nearest_mode = s("nearest_mode", "round_prefer_floor")?;
    let policy = s("keep_aspect_ratio_policy", "stretch")?;
    let antialias = cx.int("antialias", 0)? != 0;
    let exclude_outside = cx.int("exclude_outside", 0)? != 0;
    let a_cubic = cx.float("cubic_coeff_a", -0.75)? as f64;
    let extrapolation = cx.float("extrapolation_value", 0.0)? as f64;
    if !matches!(mode.as_str(), "nearest" | "linear" | "cubic") {
        return Err(cx.bad(format!("invalid ONNX: mode {mode:?}")));
    }
    if mode == "nearest" && antialias {
        return Err(cx.bad("invalid ONNX: antialias with mode nearest"));
    }
    if !matches!(nearest_mode.as_str(), "round_prefer_floor" | "round_prefer_ceil" | "floor" | "ceil") {
        return Err(cx.bad(format!("invalid ONNX: nearest_mode {nearest_mode:?}")));
    }
    if !matches!(
        ctm.as_str(),
        "half_pixel" | "half_pixel_symmetric" | "pytorch_half_pixel" | "align_corners" | "asymmetric" | "tf_crop_and_resize"
    ) {
        return Err(cx.unsupported(format!("coordinate_transformation_mode={ctm:?}")));
    }
    // Scales and sizes over every axis.
    let dims: Vec<f64> = ty.shape.iter().map(|&d| d as f64).collect();
    let mut scale = vec![1.0; r];
    let mut out: Vec<usize> = ty.shape.clone();
    match (scales_in, sizes_in) {
        (Some(sc), None) => {
            if sc.len() != n_ax || sc.iter().any(|&v| v <= 0.0 || !v.is_finite()) {
                return Err(cx.bad(format!("invalid ONNX: scales {sc:?} for {n_ax} axes")));
            }
            for (i, &a) in axes_attr.iter().enumerate() {
                scale[a] = sc[i];
                out[a] = (sc[i] * dims[a]) as usize;
            }
        }
        (None, Some(sz)) => {
            if sz.len() != n_ax || sz.iter().any(|&v| v <= 0) {
                return Err(cx.bad(format!("invalid ONNX: sizes {sz:?} for {n_ax} axes")));
            }
            for (i, &a) in axes_attr.iter().enumerate() {
                scale[a] = sz[i] as f64 / dims[a];
                out[a] = sz[i] as usize;
            }
            if policy != "stretch" {
                let pick = axes_attr.iter().map(|&a| scale[a]);
                let one = match policy.as_str() {
                    "not_larger" => pick.fold(f64::INFINITY, f64::min),
                    "not_smaller" => pick.fold(f64::NEG_INFINITY, f64::max),
                    p => return Err(cx.bad(format!("invalid ONNX: keep_aspect_ratio_policy {p:?}"))),
                };
                for &a in &axes_attr {
                    scale[a] = one;
                    out[a] = (one * dims[a] + 0.5) as usize;
                }
            }
        }
        _ => return Err(cx.bad("invalid ONNX: Resize needs exactly one of scales and sizes")),
    }
    let mut roi = vec![0.0; 2 * r];
    roi[r..].iter_mut().for_each(|v| *v = 1.0);
    if let Some(given) = roi_in.filter(|_| ctm == "tf_crop_and_resize") {
        if given.len() != 2 * n_ax {
            return Err(cx.bad(format!("invalid ONNX: roi {given:?} for {n_ax} axes")));
        }
        for (i, &a) in axes_attr.iter().enumerate() {
            roi[a] = given[i];
            roi[r + a] = given[n_ax + i];
        }
    }
    let taps = |ratio: f64, sc: f64| -> Vec<f64> {
        match mode.as_str() {
            "nearest" => {
                let up = if ratio == ratio.trunc() {
                    true
                } else {
                    match nearest_mode.as_str() {
                        "round_prefer_floor" => ratio > 0.5,
                        "round_prefer_ceil" => ratio >= 0.5,
                        "floor" => false,
                        _ => true,
                    }
                };
                if up {
                    vec![0.0, 1.0]
                } else {
                    vec![1.0, 0.0]
                }
            }
            "linear" if !antialias => vec![1.0 - ratio, ratio],
            "linear" => {
                let sc = sc.min(1.0);
                let start = (-1.0 / sc).floor() as i64 + 1;
                let c: Vec<f64> = (start..start + 2 - 2 * start).map(|i| (1.0 - ((i as f64 - ratio) * sc).abs()).clamp(0.0, 1.0)).collect();
                let sum: f64 = c.iter().sum();
                c.into_iter().map(|v| v / sum).collect()
            }
            _ if !antialias => {
                let a = a_cubic;
                let (r1, q) = (ratio + 1.0, 1.0 - ratio);
                vec![
                    ((a * r1 - 5.0 * a) * r1 + 8.0 * a) * r1 - 4.0 * a,
                    ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            _ => {
                let (a, sc) = (a_cubic, sc.min(1.0));
                let coeff = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / sc).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start).map(|i| coeff(sc * (i as f64 - ratio))).collect();
                let sum: f64 = c.iter().sum();
                c.into_iter().map(|v| v / sum).collect()
            }
        }
    };
    let mut cur = im.value(x)?;
    let mut shape = ty.shape.clone();
    for &a in &axes_attr {
        let (inw, outw, sc) = (ty.shape[a], out[a], scale[a]);
        if (sc - 1.0).abs() < 1e-9 && outw == inw && roi[a].abs() < 1e-9 && (roi[a + r] - 1.0).abs() < 1e-9 {
            continue;
        }
        if outw == 0 || inw == 0 {
            return Err(cx.unsupported(format!("an empty resize ({inw} to {outw} along axis {a})")));
        }
        made(cx, &TensorType::new(DType::I64, vec![outw]))?;
        let (fin, fout) = (inw as f64, sc * inw as f64);
        // Per output position its taps (input position, weight), or none
        // outside tf_crop_and_resize's crop.
        let mut taps_of: Vec<Vec<(usize, f64)>> = vec![Vec::new(); outw];
        let mut outside = vec![false; outw];
        for o in 0..outw {
            let y = o as f64;
            let x_ori = match ctm.as_str() {
                "align_corners" if fout == 1.0 => 0.0,
                "align_corners" => y * (fin - 1.0) / (fout - 1.0),
                "asymmetric" => y / sc,
                "tf_crop_and_resize" => {
                    let (r0, r1) = (roi[a], roi[a + r]);
                    let x = if fout == 1.0 { (r1 - r0) * (fin - 1.0) / 2.0 } else { y * (r1 - r0) * (fin - 1.0) / (fout - 1.0) };
                    x + r0 * (fin - 1.0)
                }
                "pytorch_half_pixel" if fout == 1.0 => -0.5,
                "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / sc - 0.5,
                _ => {
                    let adjustment = outw as f64 / fout;
                    let center = fin / 2.0;
                    center * (1.0 - adjustment) + (y + 0.5) / sc - 0.5
                }
            };
            if ctm == "tf_crop_and_resize" && !(0.0..=fin - 1.0).contains(&x_ori) {
                outside[o] = true;
                continue;
            }
            let ratio = if x_ori == x_ori.floor() { 1.0 } else { x_ori - x_ori.floor() };
            let mut c = taps(ratio, sc);
            let n = c.len() as i64;
            let pad = (n + 1) / 2;
            let xp = x_ori + pad as f64;
            let p = xp.floor() as i64;
            let frac = xp - p as f64;
            let off = if n % 2 == 0 {
                if frac == 0.0 {
                    -(n / 2)
                } else {
                    -(n / 2) + 1
                }
            } else {
                let base = -((n - 1) / 2);
                if frac <= 0.5 {
                    base
                } else {
                    base + 1
                }
            };
            let start = p + off - pad;
            if exclude_outside {
                for (t, v) in c.iter_mut().enumerate() {
                    let i = start + t as i64;
                    if i < 0 || i >= inw as i64 {
                        *v = 0.0;
                    }
                }
                let sum: f64 = c.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                c.iter_mut().for_each(|v| *v /= sum);
            }
            if c.len() > 64 {
                return Err(cx.unsupported(format!("resizing {inw} to {outw} along axis {a}: {} taps (at most 64)", c.len())));
            }
            taps_of[o] = c.into_iter().enumerate().map(|(t, v)| ((start + t as i64).clamp(0, inw as i64 - 1) as usize, v)).collect();
        }
        // Each tap a Gather of the input along the axis, times its weights
        // (nearest: the one tap of weight 1, no product), summed.
        let mut wshape = vec![1; r];
        wshape[a] = outw;
        if mode == "nearest" {
            for c in taps_of.iter_mut() {
                if let Some(&best) = c.iter().max_by(|x, y| x.1.total_cmp(&y.1)) {
                    *c = vec![best];
                }
            }
        }
        let index = |im: &mut Importer, t: usize, tag: &str| {
            let idx: Vec<i64> = taps_of.iter().map(|c| c.get(t).map_or(0, |x| x.0 as i64)).collect();
            constant(im, cx, &format!("{tag} {a} {t}"), Tensor::from_i64(vec![outw], idx))
        };
        let src = cur;
        if mode == "nearest" {
            let idx = index(im, 0, "nearest")?;
            cur = one_value(im, cx, Op::Gather { axis: a }, &[src, idx])?;
        } else {
            let n = taps_of.iter().map(Vec::len).max().unwrap_or(0);
            let mut acc: Option<ValueId> = None;
            for t in 0..n {
                let idx = index(im, t, "tap")?;
                let w: Vec<f32> = taps_of.iter().map(|c| c.get(t).map_or(0.0, |x| x.1 as f32)).collect();
                let w = constant(im, cx, &format!("weights {a} {t}"), Tensor::from_f32(wshape.clone(), w).cast(ty.dtype))?;
                let g = one_value(im, cx, Op::Gather { axis: a }, &[src, idx])?;
                let term = one_value(im, cx, Op::Binary(BinaryOp::Mul), &[g, w])?;
                acc = Some(match acc {
                    None => term,
                    Some(p) => one_value(im, cx, Op::Binary(BinaryOp::Add), &[p, term])?,
                });
            }
            cur = match acc {
                Some(v) => v,
                None => {
                    let idx = index(im, 0, "tap")?;
                    one_value(im, cx, Op::Gather { axis: a }, &[src, idx])?
                }
            };
        }
        if outside.iter().any(|&o| o) {
            let mask = constant(
                im,
                cx,
                &format!("outside {a}"),
                Tensor::new(wshape.clone(), TensorData::Bool(outside.clone())).expect("one per position"),
            )?;
            let e = scalar(im, cx, "extrapolation", ty.dtype, extrapolation)?;
            cur = one_value(im, cx, Op::Where, &[mask, e, cur])?;
        }
        shape[a] = outw;
    }
    if shape == ty.shape {
        return reshaping(im, cx, Op::Identity, x);
    }
    Ok(vec![Entry { konst: None, value: Some(cur) }])
}

/// [1.., n at `at`, ..1] of rank `rank`: 0..n (or -n..0) in `dtype`.
fn positions(rank: usize, at: usize, n: usize, from: i64, dtype: DType) -> Tensor {
    let mut shape = vec![1; rank];
    shape[at] = n;
    Tensor::from_i64(shape, (0..n as i64).map(|i| i + from).collect()).cast(dtype)
}

/// Ops built from others at import: GatherElements at run time (floats
/// and integers: a one-hot
/// comparison of the indices, negative ones too, with the positions, and a
/// sum), OneHot, DepthToSpace and SpaceToDepth (reshape, transpose,
/// reshape), CumSum (a MatMul by a triangular constant), ReduceProd (the
/// products of slices), InstanceNormalization and GroupNormalization.
fn built(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let op_type = cx.node.op_type();
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    let r = ty.shape.len();
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let float_only = |what: &str| -> Result<(), IrError> {
        if ty.dtype.is_float() {
            Ok(())
        } else {
            Err(cx.unsupported(format!("{what} of {} (smelt computes it for float types)", ty.dtype)))
        }
    };
    let xv = im.value(x)?;
    let y = match op_type {
        "GatherElements" => {
            // Integers too (RoBERTa's position ids, computed from the input
            // ids): by a Gather, exact.
            if !matches!(ty.dtype, DType::I64 | DType::I32) {
                float_only("GatherElements at run time")?;
            }
            let i = cx.need(1)?;
            let it = im.ty(i)?;
            let a = axis(cx, cx.int("axis", 0)?, r)?;
            if it.shape.len() != r || !matches!(it.dtype, DType::I64 | DType::I32) || (0..r).any(|d| d != a && it.shape[d] > ty.shape[d]) {
                return Err(cx.bad(format!("invalid ONNX: indices {it} do not fit data {}", ty)));
            }
            let n = ty.shape[a];
            made(cx, &TensorType::new(it.dtype, vec![n]))?;
            if !ty.dtype.is_float() {
                return gather_elements_exact(im, cx, xv, &ty, a);
            }
            let cut: Vec<usize> = (0..r).filter(|&d| d != a && it.shape[d] < ty.shape[d]).collect();
            let mut data = xv;
            if !cut.is_empty() {
                let ends = cut.iter().map(|&d| it.shape[d] as i64).collect();
                data = one(im, Op::Slice { axes: cut.clone(), starts: vec![0; cut.len()], ends, steps: vec![1; cut.len()] }, &[data])?;
            }
            let data = one(im, Op::Unsqueeze { axes: vec![a] }, &[data])?;
            let iv = im.value(i)?;
            let iu = one(im, Op::Unsqueeze { axes: vec![a + 1] }, &[iv])?;
            let pos = constant(im, cx, "positions", positions(r + 1, a + 1, n, 0, it.dtype))?;
            let neg = constant(im, cx, "negative positions", positions(r + 1, a + 1, n, -(n as i64), it.dtype))?;
            let eq = Op::Compare(CompareOp::Equal);
            let h1 = one(im, eq.clone(), &[iu, pos])?;
            let h2 = one(im, eq, &[iu, neg])?;
            let hot = one(im, Op::Logic(LogicOp::Or), &[h1, h2])?;
            let zero = scalar(im, cx, "zero", ty.dtype, 0.0)?;
            let picked = one(im, Op::Where, &[hot, data, zero])?;
            one(im, Op::Reduce { op: ReduceOp::Sum, axes: vec![a + 1], keepdims: false }, &[picked])?
        }
        "OneHot" => {
            let depth = const_input(im, cx, 1, "depth")?;
            if depth.ty().numel() != 1 {
                return Err(cx.bad(format!("invalid ONNX: depth must hold one value, got {}", depth.ty())));
            }
            let d = depth.to_f32_vec()[0];
            if !(d >= 1.0 && d <= (1u32 << 24) as f32) {
                return Err(cx.unsupported(format!("depth {d} (1 to 2^24)")));
            }
            let d = d as usize;
            let a = axis(cx, cx.int("axis", -1)?, r + 1)?;
            let values = cx.need(2)?;
            let vt = im.ty(values)?;
            if vt.numel() != 2 {
                return Err(cx.bad(format!("invalid ONNX: values must hold [off, on], got {vt}")));
            }
            // Every position must be exact in the indices' type.
            let max_index = match ty.dtype {
                DType::I8 => i8::MAX as usize,
                DType::U8 => u8::MAX as usize,
                DType::I16 => i16::MAX as usize,
                DType::U16 => u16::MAX as usize,
                DType::F16 => 2048,
                DType::BF16 => 256,
                _ => usize::MAX,
            };
            if d > max_index {
                return Err(cx.unsupported(format!("OneHot of depth {d} with {} indices", ty.dtype)));
            }
            let iu = one(im, Op::Unsqueeze { axes: vec![a] }, &[xv])?;
            let pos = constant(im, cx, "positions", positions(r + 1, a, d, 0, ty.dtype))?;
            let eq = Op::Compare(CompareOp::Equal);
            let mut hot = one(im, eq.clone(), &[iu, pos])?;
            // Negative indices count from the end (not for unsigned ones).
            if !matches!(ty.dtype, DType::U8 | DType::U16 | DType::U32) {
                let neg = constant(im, cx, "negative positions", positions(r + 1, a, d, -(d as i64), ty.dtype))?;
                let h2 = one(im, eq, &[iu, neg])?;
                hot = one(im, Op::Logic(LogicOp::Or), &[hot, h2])?;
            }
            let vv = im.value(values)?;
            let flat = one(im, Op::Reshape { shape: vec![2] }, &[vv])?;
            let pick = |im: &mut Importer, k: i64| -> Result<ValueId, IrError> {
                let s = one(im, Op::Slice { axes: vec![0], starts: vec![k], ends: vec![k + 1], steps: vec![1] }, &[flat])?;
                one(im, Op::Reshape { shape: vec![] }, &[s])
            };
            let (off, on) = (pick(im, 0)?, pick(im, 1)?);
            one(im, Op::Where, &[hot, on, off])?
        }
        "DepthToSpace" | "SpaceToDepth" => {
            let b = usize::try_from(cx.int("blocksize", 0)?)
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| cx.bad("invalid ONNX: blocksize must be positive"))?;
            let [n, c, h, w] = ty.shape[..] else {
                return Err(cx.bad(format!("invalid ONNX: {op_type} needs [N, C, H, W], got {ty}")));
            };
            if b > c.max(h).max(w).max(1) {
                return Err(cx.bad(format!("invalid ONNX: blocksize {b} for {ty}")));
            }
            let (shape, perm, out) = if op_type == "DepthToSpace" {
                if c % (b * b) != 0 {
                    return Err(cx.bad(format!("invalid ONNX: {c} channels do not divide by blocksize^2 = {}", b * b)));
                }
                let c2 = c / (b * b);
                match cx.string("mode")?.as_deref().map(str::to_ascii_uppercase).as_deref().unwrap_or("DCR") {
                    "DCR" => (vec![n, b, b, c2, h, w], vec![0, 3, 4, 1, 5, 2], vec![n, c2, h * b, w * b]),
                    "CRD" => (vec![n, c2, b, b, h, w], vec![0, 1, 4, 2, 5, 3], vec![n, c2, h * b, w * b]),
                    m => return Err(cx.bad(format!("invalid ONNX: mode {m:?}"))),
                }
            } else {
                if h % b != 0 || w % b != 0 {
                    return Err(cx.bad(format!("invalid ONNX: {h}x{w} does not divide by blocksize {b}")));
                }
                let perm = match cx.string("mode")?.as_deref().map(str::to_ascii_uppercase).as_deref().unwrap_or("DCR") {
                    "DCR" => vec![0, 3, 5, 1, 2, 4],
                    "CRD" => vec![0, 1, 3, 5, 2, 4],
                    m => return Err(cx.bad(format!("invalid ONNX: mode {m:?}"))),
                };
                (vec![n, c, h / b, b, w / b, b], perm, vec![n, c * b * b, h / b, w / b])
            };
            let v = one(im, Op::Reshape { shape }, &[xv])?;
            let v = one(im, Op::Transpose { perm }, &[v])?;
            one(im, Op::Reshape { shape: out }, &[v])?
        }
        "CumSum" => {
            let ax = const_int_vec(im, cx, 1, "axis")?;
            let [ax] = ax[..] else { return Err(cx.bad("invalid ONNX: axis must hold one value")) };
            let a = axis(cx, ax, r)?;
            let n = ty.shape[a];
            let (exclusive, reverse) = (cx.int("exclusive", 0)? != 0, cx.int("reverse", 0)? != 0);
            if n == 0 {
                return reshaping(im, cx, Op::Identity, x);
            }
            // A scan in log2(n) steps, each adding the sum shifted by 2^k
            // positions (zeros shifted in), so every element is the sum of
            // exactly its prefix, infinities included.
            let rev = Op::Slice { axes: vec![a], starts: vec![n as i64 - 1], ends: vec![-1], steps: vec![-1] };
            let shift = |im: &mut Importer, v: ValueId, by: usize| -> Result<ValueId, IrError> {
                let mut pads = vec![0; 2 * r];
                pads[a] = by;
                let p = one(im, Op::Pad { pads, mode: PadMode::Constant(0.0) }, &[v])?;
                one(im, Op::Slice { axes: vec![a], starts: vec![0], ends: vec![n as i64], steps: vec![1] }, &[p])
            };
            let mut v = if reverse { one(im, rev.clone(), &[xv])? } else { xv };
            if exclusive {
                v = shift(im, v, 1)?;
            }
            let mut by = 1;
            while by < n {
                let s = shift(im, v, by)?;
                v = one(im, Op::Binary(BinaryOp::Add), &[v, s])?;
                by *= 2;
            }
            if reverse {
                one(im, rev, &[v])?
            } else {
                v
            }
        }
        "ReduceProd" => {
            float_only("ReduceProd")?;
            let given = if cx.opset >= 18 { const_ints(im, cx, 1, "axes")? } else { cx.ints("axes")? };
            let keepdims = cx.int("keepdims", 1)? != 0;
            let ax = match given {
                Some(v) if !v.is_empty() => axes(cx, &v, r)?,
                _ if cx.int("noop_with_empty_axes", 0)? != 0 => return reshaping(im, cx, Op::Identity, x),
                _ => (0..r).collect(),
            };
            let mut out = ty.shape.clone();
            ax.iter().for_each(|&a| out[a] = 1);
            let final_shape: Vec<usize> =
                if keepdims { out.clone() } else { (0..r).filter(|d| !ax.contains(d)).map(|d| ty.shape[d]).collect() };
            if ax.iter().any(|&a| ty.shape[a] == 0) {
                let t = TensorType::new(ty.dtype, final_shape);
                made(cx, &t)?;
                return Ok(konst(Tensor::full(&t, 1.0)));
            }
            if ax.iter().map(|&a| ty.shape[a]).product::<usize>() > 256 {
                return Err(cx.unsupported("ReduceProd over more than 256 elements per output"));
            }
            let mut v = xv;
            for &a in &ax {
                let slice = |k: usize| Op::Slice { axes: vec![a], starts: vec![k as i64], ends: vec![k as i64 + 1], steps: vec![1] };
                let mut acc = one(im, slice(0), &[v])?;
                for k in 1..ty.shape[a] {
                    let s = one(im, slice(k), &[v])?;
                    acc = one(im, Op::Binary(BinaryOp::Mul), &[acc, s])?;
                }
                v = acc;
            }
            if keepdims {
                v
            } else {
                one(im, Op::Reshape { shape: final_shape }, &[v])?
            }
        }
        _ => {
            // InstanceNormalization and GroupNormalization: normalise over
            // [C / G, spatial...] per sample and group (G = C for instances).
            float_only(op_type)?;
            if r < 3 {
                return Err(cx.bad(format!("invalid ONNX: {op_type} needs [N, C, spatial...], got {ty}")));
            }
            let (n, c) = (ty.shape[0], ty.shape[1]);
            let g = if op_type == "InstanceNormalization" {
                c
            } else {
                usize::try_from(cx.int("num_groups", 0)?)
                    .ok()
                    .filter(|&g| g > 0 && c % g == 0)
                    .ok_or_else(|| cx.bad(format!("invalid ONNX: num_groups must divide {c} channels")))?
            };
            let (scale, bias) = (cx.need(1)?, cx.need(2)?);
            let (st, bt) = (im.ty(scale)?, im.ty(bias)?);
            let per_group = st.shape == [g] && g != c;
            if !(st.shape == [c] || per_group) || bt.shape != st.shape {
                return Err(cx.bad(format!("invalid ONNX: scale {st} and bias {bt} for {c} channels in {g} groups")));
            }
            let spatial: usize = ty.shape[2..].iter().product();
            let grouped = vec![n, g, c / g * spatial];
            // GroupNormalization computes its statistics in stash_type (f32).
            let stash = op_type == "GroupNormalization" && ty.dtype != DType::F32;
            let work = if stash { stashed(im, cx, x)? } else { xv };
            let work_dtype = if stash { DType::F32 } else { ty.dtype };
            let v = one(im, Op::Reshape { shape: grouped.clone() }, &[work])?;
            let mean = |axes: Vec<usize>| Op::Reduce { op: ReduceOp::Mean, axes, keepdims: true };
            let m = one(im, mean(vec![2]), &[v])?;
            let d = one(im, Op::Binary(BinaryOp::Sub), &[v, m])?;
            let sq = one(im, Op::Binary(BinaryOp::Mul), &[d, d])?;
            let var = one(im, mean(vec![2]), &[sq])?;
            let eps = scalar(im, cx, "epsilon", work_dtype, cx.float("epsilon", 1e-5)? as f64)?;
            let ve = one(im, Op::Binary(BinaryOp::Add), &[var, eps])?;
            let sd = one(im, Op::Unary(UnaryOp::Sqrt), &[ve])?;
            let mut normed = one(im, Op::Binary(BinaryOp::Div), &[d, sd])?;
            if stash {
                normed = one(im, Op::Cast { to: ty.dtype }, &[normed])?;
            }
            let (view, affine_shape) = if per_group {
                (grouped, vec![1, g, 1])
            } else {
                let mut s = vec![1; r];
                s[1] = c;
                (ty.shape.clone(), s)
            };
            let normed = one(im, Op::Reshape { shape: view }, &[normed])?;
            let (sv, bv) = (im.value(scale)?, im.value(bias)?);
            let sv = one(im, Op::Reshape { shape: affine_shape.clone() }, &[sv])?;
            let bv = one(im, Op::Reshape { shape: affine_shape }, &[bv])?;
            let y = one(im, Op::Binary(BinaryOp::Mul), &[normed, sv])?;
            let y = one(im, Op::Binary(BinaryOp::Add), &[y, bv])?;
            one(im, Op::Reshape { shape: ty.shape.clone() }, &[y])?
        }
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// RotaryEmbedding (opset 23) as the reference computes it: heads split
/// out ([B, S, H, D]), the first `rotary_embedding_dim` features rotated
/// pairwise (halves, or even and odd ones when `interleaved`) by the
/// cos and sin caches (gathered at `position_ids` when given), the rest
/// passed through.
fn rotary_embedding(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let (x, cos, sin) = (cx.need(0)?, cx.need(1)?, cx.need(2)?);
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.bad(format!("invalid ONNX: the input must be a float tensor, got {ty}")));
    }
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let mut v = im.value(x)?;
    let (b, s, h, d) = match ty.shape[..] {
        [b, h, s, d] => {
            v = one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[v])?;
            (b, s, h, d)
        }
        [b, s, hidden] => {
            let h = usize::try_from(cx.int("num_heads", 0)?)
                .ok()
                .filter(|&h| h > 0 && hidden % h == 0)
                .ok_or_else(|| cx.bad(format!("invalid ONNX: a 3-D input needs num_heads dividing its {hidden} features")))?;
            v = one(im, Op::Reshape { shape: vec![b, s, h, hidden / h] }, &[v])?;
            (b, s, h, hidden / h)
        }
        _ => return Err(cx.bad(format!("invalid ONNX: the input must be 3-D or 4-D, got {ty}"))),
    };
    let rd = match cx.int("rotary_embedding_dim", 0)? {
        0 => d,
        r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        r => return Err(cx.bad(format!("invalid ONNX: rotary_embedding_dim {r} for heads of {d}"))),
    };
    let half = rd / 2;
    let slice = |start: usize, end: usize, step: i64| Op::Slice {
        axes: vec![3],
        starts: vec![start as i64],
        ends: vec![end as i64],
        steps: vec![step],
    };
    let rot = if rd < d { one(im, slice(0, rd, 1), &[v])? } else { v };
    // The caches at each position: [B, S, 1, D/2].
    let mut caches = Vec::new();
    for c in [cos, sin] {
        let mut cv = im.value(c)?;
        let ct = im.ty(c)?;
        if let Some(p) = cx.input(3) {
            let pv = im.value(p)?;
            if ct.shape.len() != 2 || ct.shape[1] != half {
                return Err(cx.bad(format!("invalid ONNX: a cache must be [positions, {half}], got {ct}")));
            }
            cv = one(im, Op::Gather { axis: 0 }, &[cv, pv])?;
        } else if ct.shape != [b, s, half] {
            return Err(cx.bad(format!("invalid ONNX: without position_ids a cache must be [{b}, {s}, {half}], got {ct}")));
        }
        caches.push(one(im, Op::Reshape { shape: vec![b, s, 1, half] }, &[cv])?);
    }
    let (cos, sin) = (caches[0], caches[1]);
    let interleaved = cx.int("interleaved", 0)? != 0;
    let (x1, x2) = if interleaved {
        (one(im, slice(0, rd, 2), &[rot])?, one(im, slice(1, rd, 2), &[rot])?)
    } else {
        (one(im, slice(0, half, 1), &[rot])?, one(im, slice(half, rd, 1), &[rot])?)
    };
    let mul = |im: &mut Importer, a, c| one(im, Op::Binary(BinaryOp::Mul), &[a, c]);
    let (c1, s2, s1, c2) = (mul(im, cos, x1)?, mul(im, sin, x2)?, mul(im, sin, x1)?, mul(im, cos, x2)?);
    let real = one(im, Op::Binary(BinaryOp::Sub), &[c1, s2])?;
    let imag = one(im, Op::Binary(BinaryOp::Add), &[s1, c2])?;
    let rotated = if interleaved {
        let r = one(im, Op::Unsqueeze { axes: vec![4] }, &[real])?;
        let i = one(im, Op::Unsqueeze { axes: vec![4] }, &[imag])?;
        let pairs = one(im, Op::Concat { axis: 4 }, &[r, i])?;
        one(im, Op::Reshape { shape: vec![b, s, h, rd] }, &[pairs])?
    } else {
        one(im, Op::Concat { axis: 3 }, &[real, imag])?
    };
    let mut y = rotated;
    if rd < d {
        let rest = one(im, slice(rd, d, 1), &[v])?;
        y = one(im, Op::Concat { axis: 3 }, &[rotated, rest])?;
    }
    let y = if ty.shape.len() == 4 {
        one(im, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[y])?
    } else {
        one(im, Op::Reshape { shape: ty.shape.clone() }, &[y])?
    };
    Ok(vec![Entry { konst: None, value: Some(y) }])
}

/// TopK (K at most 64): K rounds of the maximum (of x, or of -x for the
/// smallest) among the positions not yet taken, and its first position;
/// values and int64 indices in order, ties to the lower index.
fn top_k(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let x = cx.need(0)?;
    let ty = im.ty(x)?;
    if !ty.dtype.is_float() {
        return Err(cx.unsupported(format!("TopK of {} (smelt computes it for float types)", ty.dtype)));
    }
    let r = ty.shape.len();
    let a = axis(cx, cx.int("axis", -1)?, r.max(1))?;
    let n = *ty.shape.get(a).ok_or_else(|| cx.bad("invalid ONNX: TopK of a scalar"))?;
    let k = match cx.opset {
        o if o < 10 => cx.int("k", 0)?,
        _ => match const_int_vec(im, cx, 1, "K")?[..] {
            [k] => k,
            _ => return Err(cx.bad("invalid ONNX: K must hold one value")),
        },
    };
    let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| cx.bad(format!("invalid ONNX: K={k} for an axis of {n}")))?;
    if k > 64 || n > 1 << 24 {
        return Err(cx.unsupported(format!("TopK of {k} of {n} (at most 64 of 2^24)")));
    }
    let largest = cx.int("largest", 1)? != 0;
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let mut xs = im.value(x)?;
    if !largest {
        xs = one(im, Op::Unary(UnaryOp::Neg), &[xs])?;
    }
    let mut shape = vec![1; r];
    shape[a] = n;
    let pos = constant(im, cx, "positions", Tensor::from_f32(shape.clone(), (0..n).map(|i| i as f32).collect()).cast(ty.dtype))?;
    let neg_pos = constant(im, cx, "-positions", Tensor::from_f32(shape, (0..n).map(|i| -(i as f32)).collect()).cast(ty.dtype))?;
    let none = scalar(im, cx, "no position", ty.dtype, -(n as f64) - 1.0)?;
    let minus_inf = scalar(im, cx, "-inf", ty.dtype, f64::NEG_INFINITY)?;
    let max = Op::Reduce { op: ReduceOp::Max, axes: vec![a], keepdims: true };
    let eq = Op::Compare(CompareOp::Equal);
    let (mut taken, mut values, mut indices): (Option<ValueId>, Vec<ValueId>, Vec<ValueId>) = (None, vec![], vec![]);
    for _ in 0..k {
        let avail = match taken {
            Some(t) => one(im, Op::Where, &[t, minus_inf, xs])?,
            None => xs,
        };
        let m = one(im, max.clone(), &[avail])?;
        let mut at = one(im, eq.clone(), &[avail, m])?;
        if let Some(t) = taken {
            let free = one(im, Op::Not, &[t])?;
            at = one(im, Op::Logic(LogicOp::And), &[at, free])?;
        }
        let cand = one(im, Op::Where, &[at, neg_pos, none])?;
        let first = one(im, max.clone(), &[cand])?;
        let idx = one(im, Op::Unary(UnaryOp::Neg), &[first])?;
        let hit = one(im, eq.clone(), &[pos, idx])?;
        taken = Some(match taken {
            Some(t) => one(im, Op::Logic(LogicOp::Or), &[t, hit])?,
            None => hit,
        });
        values.push(if largest { m } else { one(im, Op::Unary(UnaryOp::Neg), &[m])? });
        indices.push(idx);
    }
    let cat = |im: &mut Importer, vs: &[ValueId]| if vs.len() == 1 { Ok(vs[0]) } else { one(im, Op::Concat { axis: a }, vs) };
    if k == 0 {
        let mut s = ty.shape.clone();
        s[a] = 0;
        return Ok(vec![
            konst(Tensor::full(&TensorType::new(ty.dtype, s.clone()), 0.0)).remove(0),
            konst(Tensor::full(&TensorType::new(DType::I64, s), 0.0)).remove(0),
        ]);
    }
    let v = cat(im, &values)?;
    let i = cat(im, &indices)?;
    let i = one(im, Op::Cast { to: DType::I64 }, &[i])?;
    Ok(vec![Entry { konst: None, value: Some(v) }, Entry { konst: None, value: Some(i) }])
}

/// Einsum without repeated letters in one operand (diagonals): each
/// operand transposed to the order of all letters (the output's first,
/// then the summed ones) with size-1 dims for its missing letters, the
/// broadcast product, and a sum over the summed letters. `...` stands for
/// the same leading dims in every operand.
fn einsum(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
    let eq: String = cx
        .string("equation")?
        .ok_or_else(|| cx.bad("invalid ONNX: Einsum needs an equation"))?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let names: Vec<&str> = cx.node.input.iter().map(|s| s.as_str()).collect();
    let tys = names.iter().map(|n| im.ty(n)).collect::<Result<Vec<_>, _>>()?;
    let dtype = tys[0].dtype;
    if !dtype.is_float() || tys.iter().any(|t| t.dtype != dtype) {
        return Err(cx.unsupported(format!(
            "Einsum of {} (smelt computes it for one float type)",
            tys.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != names.len() {
        return Err(cx.bad(format!("invalid ONNX: equation {eq:?} has {} operands, the node {}", terms.len(), names.len())));
    }
    // `...` becomes upper-case letters, as many as the widest operand needs.
    let ell = terms.iter().zip(&tys).map(|(t, ty)| if t.contains("...") { ty.shape.len() + 3 - t.len() } else { 0 }).max().unwrap_or(0);
    let ell_letters: String = (0..ell).map(|i| (b'A' + i as u8) as char).collect();
    let expand = |t: &str, rank: usize| -> Result<Vec<char>, IrError> {
        let t = if t.contains("...") {
            let own = rank + 3 - t.len();
            if own > ell || rank + 3 < t.len() {
                return Err(cx.bad(format!("invalid ONNX: {t:?} does not fit rank {rank}")));
            }
            t.replace("...", &ell_letters[ell - own..])
        } else {
            t.to_string()
        };
        let cs: Vec<char> = t.chars().collect();
        if cs.iter().any(|c| !c.is_ascii_alphabetic()) {
            return Err(cx.bad(format!("invalid ONNX: equation {eq:?}")));
        }
        Ok(cs)
    };
    let mut sizes: HashMap<char, usize> = HashMap::new();
    let mut ops: Vec<Vec<char>> = Vec::new();
    for (t, ty) in terms.iter().zip(&tys) {
        let cs = expand(t, ty.shape.len())?;
        if cs.len() != ty.shape.len() {
            return Err(cx.bad(format!("invalid ONNX: {t:?} does not fit {ty}")));
        }
        let mut seen = std::collections::HashSet::new();
        if cs.iter().any(|c| !seen.insert(*c)) {
            return Err(cx.unsupported(format!("Einsum with a repeated letter in {t:?} (a diagonal)")));
        }
        for (c, &d) in cs.iter().zip(&ty.shape) {
            match sizes.insert(*c, d) {
                Some(prev) if prev != d => return Err(cx.bad(format!("invalid ONNX: {c} is {prev} and {d} in {eq:?}"))),
                _ => {}
            }
        }
        ops.push(cs);
    }
    let out: Vec<char> = match rhs {
        Some(r) => {
            let r = if r.contains("...") { r.replace("...", &ell_letters) } else { r };
            let cs: Vec<char> = r.chars().collect();
            if let Some(c) = cs.iter().find(|c| !sizes.contains_key(c)) {
                return Err(cx.bad(format!("invalid ONNX: output letter {c} of {eq:?} is no operand's")));
            }
            cs
        }
        None => {
            // Implicit: the ellipsis, then the letters used once, sorted.
            let mut once: Vec<char> =
                sizes.keys().copied().filter(|c| c.is_ascii_lowercase() && ops.iter().flatten().filter(|x| *x == c).count() == 1).collect();
            once.sort();
            ell_letters.chars().chain(once).collect()
        }
    };
    let summed: Vec<char> = {
        let mut s: Vec<char> = sizes.keys().copied().filter(|c| !out.contains(c)).collect();
        s.sort();
        s
    };
    let all: Vec<char> = out.iter().chain(&summed).copied().collect();
    let full: Vec<usize> = all.iter().map(|c| sizes[c]).collect();
    let one = |im: &mut Importer, op: Op, vs: &[ValueId]| one_value(im, cx, op, vs);
    let mut product: Option<ValueId> = None;
    for (name, cs) in names.iter().zip(&ops) {
        let mut v = im.value(name)?;
        // Its letters in the order of `all`, then size-1 dims for the others.
        let mut order: Vec<usize> = (0..cs.len()).collect();
        order.sort_by_key(|&i| all.iter().position(|c| *c == cs[i]));
        if order.iter().enumerate().any(|(i, &o)| i != o) {
            v = one(im, Op::Transpose { perm: order }, &[v])?;
        }
        let shape: Vec<usize> = all.iter().map(|c| if cs.contains(c) { sizes[c] } else { 1 }).collect();
        v = one(im, Op::Reshape { shape }, &[v])?;
        product = Some(match product {
            None => v,
            Some(p) => one(im, Op::Binary(BinaryOp::Mul), &[p, v])?,
        });
    }
    let mut y = product.ok_or_else(|| cx.bad("invalid ONNX: Einsum with no operands"))?;
    if im.g.ty(y).shape != full {
        y = one(im, Op::Expand { shape: full.clone() }, &[y])?;
    }
    if !summed.is_empty() {
        y = one(im, Op::Reduce { op: ReduceOp::Sum, axes: (out.len()..all.len()).collect(), keepdims: false }, &[y])?;
    }
    Ok(vec![Entry { konst: None, value: Some(y) }])
}
