//! One ONNX node to smelt ops (or to a folded constant): `convert`
//! validates a node against its family's [`Spec`] and lowers it; the
//! helpers every family uses (attribute readers, `emit`, windows, `built`
//! decompositions, sequences).

use super::{fold, Entry, Importer};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::ValueId;
use crate::op::{BinaryOp, CompareOp, LogicOp, Op, PadMode, Pool, ReduceOp, UnaryOp};
use crate::tensor::Tensor;
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
    // An op is imported only as its family registers it: its attributes,
    // its arity at this opset and its lowering, together.
    let Some(Spec { attributes: known, arity: (min_in, max_in, max_out), lower }) = spec(node.op_type(), im.opset) else {
        return Err(IrError::UnsupportedOp { op_type: node.op_type().to_string(), node: cx.name.clone(), opset: im.opset });
    };
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
        return Err(cx.bad(format!("invalid ONNX: {} (opset {}) has at most {max_out} outputs, got {n_out}", node.op_type(), im.opset)));
    }
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

/// Sequences, as the dynamo exporter writes `torch.split`: the parts of a
/// SplitToSequence, each picked by a SequenceAt at a constant index. The
/// parts are kept by the sequence's name; it has no value of its own.
pub(super) fn split_to_sequence(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
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
    Ok(vec![])
}

/// The part of a sequence at a constant position: its entry, under the
/// node's output.
pub(super) fn sequence_at(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
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
    Ok(vec![])
}

/// (fewest inputs, most inputs, most outputs) of an op at an opset, as
/// the ONNX spec allows them.
pub(super) type Arity = (usize, usize, usize);

/// Any number of inputs or outputs.
pub(super) const ANY: usize = usize::MAX;

/// What lowers an op's node into the graph.
pub(super) type Lower = fn(&mut Importer, &Cx) -> Result<Vec<Entry>, IrError>;

/// How an ONNX op is imported: the attributes it may carry (at any opset;
/// the legacy `consumed_inputs` of opset 1 is allowed everywhere), its
/// input and output counts at the model's opset, and its lowering. Each
/// family registers its ops in one `match` (`spec` of `elementwise`, `nn`,
/// `reduce`, `movement`, `shape_ops`), so an op is known with all three or
/// not at all.
pub(super) struct Spec {
    /// Its attributes.
    pub(super) attributes: &'static [&'static str],
    /// Its arity.
    pub(super) arity: Arity,
    /// Its lowering.
    pub(super) lower: Lower,
}

/// The spec of ONNX op `op_type` at `opset`, from the one family that
/// registers it; `None` for ops smelt does not import.
pub(super) fn spec(op_type: &str, opset: i64) -> Option<Spec> {
    let families: [fn(&str, i64) -> Option<Spec>; 5] =
        [super::elementwise::spec, super::nn::spec, super::reduce::spec, super::movement::spec, super::shape_ops::spec];
    let mut found = families.iter().filter_map(|family| family(op_type, opset));
    let first = found.next();
    debug_assert!(found.next().is_none(), "ONNX op {op_type} is registered by two families");
    first
}

pub(super) fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Attributes that became inputs at `opset` or before: given as
/// attributes, they would be ignored.
pub(super) fn now_an_input(op_type: &str, opset: i64) -> &'static [&'static str] {
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

pub(super) fn konst(t: Tensor) -> Vec<Entry> {
    vec![Entry { konst: Some(Arc::new(t)), value: None }]
}

pub(super) fn values(id: crate::graph::NodeId, n: usize) -> Vec<Entry> {
    (0..n).map(|slot| Entry { konst: None, value: Some(ValueId { node: id, slot: slot as u32 }) }).collect()
}

/// Results up to this size are folded whatever their inputs' sizes; a
/// larger one only when no input is smaller (an `Expand` of a small
/// constant to a big mask stays an op rather than a big weight).
pub(super) const FOLD_FREELY_BYTES: usize = 1 << 20;

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

pub(super) fn window(cx: &Cx, spatial: &[usize], kernel: &[usize], strides: &[usize], dil: &[usize]) -> Result<Vec<usize>, IrError> {
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

pub(super) fn spatial_attr(cx: &Cx, k: &str, n: usize) -> Result<Vec<usize>, IrError> {
    let v = cx.ints(k)?.unwrap_or_else(|| vec![1; n]);
    if v.len() != n {
        return Err(cx.bad(format!("{k} {v:?} must have {n} entries")));
    }
    if v.iter().any(|&x| x <= 0) {
        return Err(cx.bad(format!("invalid ONNX: {k} {v:?} must be positive")));
    }
    cx.usizes(v, k)
}

pub(super) fn pool_attrs(im: &Importer, cx: &Cx) -> Result<Pool, IrError> {
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
pub(super) fn align(im: &mut Importer, cx: &Cx, name: &str, trailing: usize) -> Result<String, IrError> {
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

/// Constants that import builds (masks, positions, identities) hold at
/// most this many elements.
pub(super) const MADE_LIMIT: usize = 1 << 26;

/// Refuses to build a constant of `ty` over [`MADE_LIMIT`] elements.
pub(super) fn made(cx: &Cx, ty: &TensorType) -> Result<(), IrError> {
    if ty.numel() > MADE_LIMIT {
        return Err(cx.too_large(format!("a constant {ty} to build (at most 2^26 elements)")));
    }
    Ok(())
}

pub(super) fn constant(im: &mut Importer, cx: &Cx, tag: &str, t: Tensor) -> Result<ValueId, IrError> {
    made(cx, t.ty())?;
    let name = format!("{}:{tag}", cx.name);
    im.env.insert(name.clone(), Entry { konst: Some(Arc::new(t)), value: None });
    im.value(&name)
}

/// A scalar constant as a graph value.
/// GatherElements of integers at run time, exactly: a Gather of the
/// flattened data at each element's flat index (the position's offset, a
/// constant, plus the index, made non-negative, times the axis' stride).
/// The index arithmetic runs in smelt's integer ops, exact below 2^24: data
/// of more elements is refused.
pub(super) fn gather_elements_exact(im: &mut Importer, cx: &Cx, data: ValueId, ty: &TensorType, a: usize) -> Result<Vec<Entry>, IrError> {
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

pub(super) fn scalar(im: &mut Importer, cx: &Cx, tag: &str, dtype: DType, v: f64) -> Result<ValueId, IrError> {
    constant(im, cx, tag, Tensor::full(&TensorType::new(dtype, vec![]), v))
}

pub(super) fn one_value(im: &mut Importer, cx: &Cx, op: Op, vs: &[ValueId]) -> Result<ValueId, IrError> {
    Ok(emit_values(im, cx, op, vs)?[0].value.expect("a value"))
}

/// The stash type (f32) of LayerNormalization and RMSNormalization:
/// the statistics are computed in it.
pub(super) fn stashed(im: &mut Importer, cx: &Cx, x: &str) -> Result<ValueId, IrError> {
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

/// [1.., n at `at`, ..1] of rank `rank`: 0..n (or -n..0) in `dtype`.
pub(super) fn positions(rank: usize, at: usize, n: usize, from: i64, dtype: DType) -> Tensor {
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
pub(super) fn built(im: &mut Importer, cx: &Cx) -> Result<Vec<Entry>, IrError> {
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
