//! ONNX import with static shapes. Initializers and constant-producing nodes
//! (`Constant`, `ConstantOfShape`, and `Shape`, `Gather`, `Cast`, `Concat`,
//! `Unsqueeze`... on constants) are folded at import, so the graph holds only
//! real computation. `batch` overrides the batch dimension of every input and
//! of Reshape targets that hard-code the exported batch.

mod elementwise;
mod fold;
mod movement;
mod nn;
mod nodes;
mod reduce;
mod shape_ops;
mod tensor;

pub use tensor::{from_proto, read_tensor_file, to_proto, write_tensor_file};

use crate::dtype::TensorType;
use crate::error::IrError;
use crate::graph::{Graph, ValueId};
use crate::tensor::Tensor;
use smelt_onnx_proto::{Message, ModelProto};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The ONNX IR versions smelt reads: those of its vendored `onnx.proto`.
pub const IR_VERSIONS: std::ops::RangeInclusive<i64> = 3..=14;
/// The default-domain opsets smelt imports: up to the newest of the pinned
/// onnx wheel. Every op smelt supports changed after opset 22 only by
/// gaining types smelt refuses by name.
pub const OPSETS: std::ops::RangeInclusive<i64> = 1..=28;

/// Options of the importer.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Batch size to use instead of the exported one (also the value of a
    /// symbolic first input dimension; 1 when unset).
    pub batch: Option<usize>,
    /// Sizes of symbolic input dimensions by name (`--dim sequence=512`);
    /// a name the model's inputs do not use is an error.
    pub dims: Vec<(String, usize)>,
    /// Where tensors stored as external data are found (the model file's
    /// folder; `None` refuses external data).
    pub base_dir: Option<std::path::PathBuf>,
    /// Keep float initializers as they are (for training): no op reading
    /// one is folded, so that the trained value is the initializer itself
    /// (an exporter's `Transpose` of a weight stays an op, not a new weight).
    pub keep_weights: bool,
    /// Values of graph inputs that ops need at compile time (a shape, axes,
    /// pads, clip bounds: `--set NAME=VALUES`): each becomes a constant
    /// and leaves the graph's inputs. A name that is no graph input, or a
    /// value whose type is not the input's, is an error.
    pub known: Vec<(String, Known)>,
}

/// The value of a graph input given at import ([`ImportOptions::known`]).
#[derive(Clone, Debug)]
pub enum Known {
    /// A whole tensor, of the input's type (test data).
    Tensor(Tensor),
    /// Its elements in row-major order, converted to the input's declared
    /// dtype and shape (`--set NAME=1,2,3`).
    Values(Vec<f64>),
}

/// Imports an `.onnx` file.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Graph, IrError> {
    let bytes = std::fs::read(path).map_err(|source| IrError::Io { path: path.display().to_string(), error: source })?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    import(&bytes, &ImportOptions { base_dir: opts.base_dir.clone().or(base.map(Path::to_path_buf)), ..opts.clone() })
}

/// Imports the bytes of an ONNX `ModelProto`.
pub fn import(bytes: &[u8], opts: &ImportOptions) -> Result<Graph, IrError> {
    let model = ModelProto::decode(bytes).map_err(|e| IrError::Malformed(format!("not an ONNX model: {e}")))?;
    let graph = model.graph.as_ref().ok_or_else(|| IrError::Malformed("the model has no graph".into()))?;
    if !IR_VERSIONS.contains(&model.ir_version()) {
        return Err(IrError::UnsupportedFeature(format!(
            "ONNX IR version {} (smelt reads IR versions {} to {})",
            model.ir_version(),
            IR_VERSIONS.start(),
            IR_VERSIONS.end()
        )));
    }
    let opset = model.opset_import.iter().find(|o| o.domain().is_empty() || o.domain() == "ai.onnx").map(|o| o.version()).unwrap_or(1);
    if !OPSETS.contains(&opset) {
        return Err(IrError::UnsupportedFeature(format!(
            "opset {opset} of the default ONNX domain (smelt imports opsets {} to {})",
            OPSETS.start(),
            OPSETS.end()
        )));
    }
    let used = graph.node.iter().flat_map(|n| n.input.iter().cloned()).chain(graph.output.iter().map(|o| o.name().to_string())).collect();
    let graph_inputs = graph.input.iter().map(|i| i.name().to_string()).collect();
    let mut im = Importer {
        g: Graph::new(),
        env: HashMap::new(),
        opset,
        batch: None,
        used,
        kept: Default::default(),
        graph_inputs,
        sequences: HashMap::new(),
        dims: opts.dims.clone(),
    };

    for init in &graph.initializer {
        if init.name().is_empty() {
            return Err(IrError::Malformed("an initializer has no name".into()));
        }
        let t = tensor::from_proto_at(init, opts.base_dir.as_deref())?;
        if opts.keep_weights && t.ty().dtype.is_float() {
            im.kept.insert(init.name().to_string());
        }
        if im.env.insert(init.name().to_string(), Entry { konst: Some(Arc::new(t)), value: None }).is_some() {
            return Err(IrError::Malformed(format!("two initializers are named \"{}\"", init.name())));
        }
    }
    check_dims(graph, opts)?;
    for (name, _) in &opts.known {
        if !im.graph_inputs.contains(name) || im.env.contains_key(name) {
            return Err(IrError::Usage(format!("--set {name}: the model has no graph input named {name}")));
        }
    }
    let mut seen_inputs = std::collections::HashSet::new();
    for input in &graph.input {
        if !seen_inputs.insert(input.name()) {
            return Err(IrError::Malformed(format!("two graph inputs are named \"{}\"", input.name())));
        }
        if input.name().is_empty() {
            return Err(IrError::Malformed("a graph input has no name".into()));
        }
        if im.env.contains_key(input.name()) {
            continue; // an initializer listed as an input (IR version < 4): a constant
        }
        let ty = im.input_type(input, opts)?;
        if let Some((_, k)) = opts.known.iter().find(|(n, _)| n == input.name()) {
            let t = match k {
                Known::Tensor(t) if t.ty() == &ty => t.clone(),
                Known::Tensor(t) => {
                    return Err(IrError::Usage(format!("--set {}: the input is {ty}, the value given is {}", input.name(), t.ty())))
                }
                Known::Values(v) if v.len() != ty.numel() => {
                    return Err(IrError::Usage(format!(
                        "--set {}: the input is {ty} ({} values), {} given",
                        input.name(),
                        ty.numel(),
                        v.len()
                    )))
                }
                Known::Values(v) if ty.dtype.is_float() => {
                    Tensor::from_f32(ty.shape.clone(), v.iter().map(|&x| x as f32).collect()).cast(ty.dtype)
                }
                Known::Values(v) => {
                    if let Some(x) = v.iter().find(|x| x.fract() != 0.0 || !x.is_finite()) {
                        return Err(IrError::Usage(format!("--set {}: the input is {ty}, and {x} is not an integer", input.name())));
                    }
                    Tensor::from_i64(ty.shape.clone(), v.iter().map(|&x| x as i64).collect()).cast(ty.dtype)
                }
            };
            im.env.insert(input.name().to_string(), Entry { konst: Some(Arc::new(t)), value: None });
            continue;
        }
        let v = im.g.add_input(input.name(), ty)?;
        im.env.insert(input.name().to_string(), Entry { konst: None, value: Some(v) });
    }
    for node in &graph.node {
        nodes::convert(&mut im, node).map_err(|e| match (e, im.batch) {
            // Shapes that stop fitting once the batch changes: the exporter
            // wrote the batch into a constant smelt did not recognise.
            (IrError::Shape { node, msg }, Some((exported, new))) if mismatch(&msg) => IrError::Shape {
                node,
                msg: format!("{msg} (with --batch {new}: the exporter may have written its batch, {exported}, into a constant shape here; export with a dynamic batch axis, or at batch {new})"),
            },
            // The same for a size `--dim` gives (a traced sequence length).
            (IrError::Shape { node, msg }, None) if !im.dims.is_empty() && mismatch(&msg) => {
                let given: Vec<String> = im.dims.iter().map(|(n, s)| format!("{n}={s}")).collect();
                IrError::Shape {
                    node,
                    msg: format!("{msg} (with --dim {}: the exporter may have written the exported size into a constant shape here, as a tracer does with a Python int; export with that axis dynamic, or at that size)", given.join(" --dim ")),
                }
            }
            (e, _) => e,
        })?;
    }
    let mut seen_outputs = std::collections::HashSet::new();
    for out in &graph.output {
        if !seen_outputs.insert(out.name()) {
            return Err(IrError::Malformed(format!("graph output \"{}\" is listed twice", out.name())));
        }
        let v = im.value(out.name()).map_err(|_| IrError::Malformed(format!("graph output \"{}\" is never produced", out.name())))?;
        im.check_declared(out, v)?;
        im.g.add_output(out.name(), v);
    }
    if im.g.outputs().is_empty() {
        return Err(IrError::Malformed("the graph has no outputs".into()));
    }
    im.g.remove_dead();
    crate::verify::verify(&im.g)?;
    Ok(im.g)
}

/// Whether an import error is shapes that do not fit together (what a
/// size baked into a constant gives once `--batch` or `--dim` changes it),
/// not an invalid index or attribute.
fn mismatch(msg: &str) -> bool {
    ["broadcast", "cannot reshape", "cannot concatenate"].iter().any(|k| msg.contains(k))
}

/// Refuses `--dim` names that no graph input uses, and sizes of 0.
fn check_dims(graph: &smelt_onnx_proto::GraphProto, opts: &ImportOptions) -> Result<(), IrError> {
    use smelt_onnx_proto::tensor_shape_proto::dimension::Value as Dim;
    use smelt_onnx_proto::type_proto::Value;
    if opts.dims.is_empty() {
        return Ok(());
    }
    // A set: a hostile file may name a hundred thousand dimensions.
    let mut names: std::collections::BTreeSet<&str> = Default::default();
    // The symbolic first dimensions, which --batch sizes (input, name).
    let mut leading: Vec<(&str, &str)> = Vec::new();
    for input in &graph.input {
        if let Some(Value::TensorType(tt)) = input.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            for (i, d) in tt.shape.iter().flat_map(|s| &s.dim).enumerate() {
                if let Some(Dim::DimParam(p)) = &d.value {
                    names.insert(p.as_str());
                    if i == 0 {
                        leading.push((input.name.as_deref().unwrap_or(""), p.as_str()));
                    }
                }
            }
        }
    }
    for (name, size) in &opts.dims {
        if let (Some(batch), Some((input, _))) = (opts.batch, leading.iter().find(|(_, p)| p == name)) {
            if batch != *size {
                return Err(IrError::Usage(format!(
                    "--dim {name}={size} and --batch both size the first dimension of input \"{input}\" ({name}; --batch makes it {batch}, a micro-batch with --accumulate), and --batch wins: give one of them"
                )));
            }
        }
        if *size == 0 {
            return Err(IrError::Usage(format!("--dim {name}={size}: sizes start at 1")));
        }
        if !names.contains(name.as_str()) {
            let have = if names.is_empty() { "none".to_string() } else { names.iter().take(20).copied().collect::<Vec<_>>().join(", ") };
            return Err(IrError::Usage(format!(
                "--dim {name}: no input of the model has a dimension named {name} (symbolic dimensions: {have})"
            )));
        }
    }
    Ok(())
}

/// What an ONNX name stands for: a constant known at import, a graph value,
/// or both (a constant already materialised as a node).
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub konst: Option<Arc<Tensor>>,
    pub value: Option<ValueId>,
}

pub(crate) struct Importer {
    pub g: Graph,
    pub env: HashMap<String, Entry>,
    pub opset: i64,
    /// (exported batch, requested batch) when `--batch` changes it.
    pub batch: Option<(usize, usize)>,
    /// Names some node or graph output reads.
    pub used: std::collections::HashSet<String>,
    /// Float initializers no op is folded over ([`ImportOptions::keep_weights`]).
    pub kept: std::collections::HashSet<String>,
    /// The graph inputs' names (to say which value `--set` could give).
    pub graph_inputs: std::collections::HashSet<String>,
    /// Sequences (`SplitToSequence`'s output): their parts.
    pub sequences: HashMap<String, Vec<Entry>>,
    /// The sizes `--dim` gives symbolic dimensions.
    pub dims: Vec<(String, usize)>,
}

impl Importer {
    fn input_type(&mut self, input: &smelt_onnx_proto::ValueInfoProto, opts: &ImportOptions) -> Result<TensorType, IrError> {
        use smelt_onnx_proto::tensor_shape_proto::dimension::Value as Dim;
        use smelt_onnx_proto::type_proto::Value;
        let bad = |msg: String| IrError::Malformed(format!("input \"{}\": {msg}", input.name()));
        let tt = match input.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(Value::TensorType(tt)) => tt,
            _ => return Err(bad("not a tensor".into())),
        };
        let dtype =
            tensor::dtype_of(tt.elem_type()).map_err(|m| IrError::UnsupportedFeature(format!("input \"{}\": {m}", input.name())))?;
        // A missing shape is "unknown rank", not a scalar (a scalar has an empty dim list).
        let dims = tt.shape.as_ref().map(|s| s.dim.as_slice()).ok_or_else(|| bad("has no shape; smelt needs static shapes".into()))?;
        let mut shape = Vec::with_capacity(dims.len());
        for (i, d) in dims.iter().enumerate() {
            match d.value {
                Some(Dim::DimValue(v)) if v >= 0 => {
                    let v = v as usize;
                    if i == 0 {
                        if let Some(b) = opts.batch {
                            if b != v {
                                self.batch = Some((v, b));
                            }
                            shape.push(b);
                            continue;
                        }
                    }
                    shape.push(v)
                }
                Some(Dim::DimParam(_)) if i == 0 && opts.batch.is_some() => shape.push(opts.batch.unwrap_or(1)),
                Some(Dim::DimParam(ref p)) if opts.dims.iter().any(|(n, _)| n == p) => {
                    shape.push(opts.dims.iter().find(|(n, _)| n == p).map_or(1, |d| d.1))
                }
                Some(Dim::DimParam(_)) if i == 0 => shape.push(1),
                Some(Dim::DimParam(ref p)) if p.is_empty() => {
                    return Err(bad(format!("dimension {i} is unknown (symbolic, unnamed); smelt needs static shapes")))
                }
                Some(Dim::DimParam(ref p)) => {
                    return Err(IrError::Usage(format!(
                        "input \"{}\": dimension {i} is symbolic ({p}): give its size with --dim {p}=N",
                        input.name()
                    )))
                }
                Some(Dim::DimValue(v)) => return Err(bad(format!("dimension {i} is negative ({v})"))),
                _ => return Err(bad(format!("dimension {i} is unknown; smelt needs static shapes"))),
            }
        }
        let ty = TensorType::new(dtype, shape);
        ty.checked_bytes().ok_or_else(|| IrError::TooLarge {
            node: format!("input \"{}\"", input.name()),
            msg: format!("shape {:?} exceeds 1 TiB", ty.shape),
        })?;
        Ok(ty)
    }

    /// Checks a graph output's declared type (when it has one) against the
    /// inferred type: an exporter's declared shape that disagrees means the
    /// file and smelt read the model differently. With `--batch` changing
    /// the batch only the dtype and rank are compared.
    fn check_declared(&self, out: &smelt_onnx_proto::ValueInfoProto, v: ValueId) -> Result<(), IrError> {
        use smelt_onnx_proto::tensor_shape_proto::dimension::Value as Dim;
        use smelt_onnx_proto::type_proto::Value;
        let Some(Value::TensorType(tt)) = out.r#type.as_ref().and_then(|t| t.value.as_ref()) else { return Ok(()) };
        let got = self.g.ty(v);
        let dtype = match tt.elem_type() {
            0 => None,
            c => Some(tensor::dtype_of(c).map_err(|m| IrError::Malformed(format!("graph output \"{}\": {m}", out.name())))?),
        };
        let dims: Option<Vec<Option<i64>>> =
            tt.shape.as_ref().map(|s| s.dim.iter().map(|d| if let Some(Dim::DimValue(v)) = d.value { Some(v) } else { None }).collect());
        // With `--batch`, an output declared with the exported (or a
        // symbolic) batch must come out with the new one: else the exporter
        // baked the batch where smelt did not rewrite it.
        if let (Some((exported, new)), Some(s)) = (self.batch, tt.shape.as_ref()) {
            // A leading dimension of the exported batch, on an output of
            // rank 2 or more (not a scalar-like [1] at batch 1).
            let declared = s.dim.first().map(|d| matches!(d.value, Some(Dim::DimValue(v)) if v == exported as i64) && s.dim.len() >= 2);
            if declared == Some(true) && got.shape.first() != Some(&new) {
                return Err(IrError::Usage(format!(
                    "--batch {new}: graph output \"{}\" comes out {got}, not at batch {new}: the exporter wrote its batch ({exported}) into the graph where smelt cannot rewrite it; export with a dynamic batch axis (dynamic_axes, or dynamic_shapes for dynamo), or at batch {new}",
                    out.name()
                )));
            }
        }
        // An output declared with a dimension `--dim` sizes comes out at
        // that size.
        for (i, d) in tt.shape.iter().flat_map(|s| &s.dim).enumerate() {
            let Some(Dim::DimParam(p)) = &d.value else { continue };
            if let Some((_, size)) = self.dims.iter().find(|(n, _)| n == p) {
                if got.shape.get(i) != Some(size) {
                    return Err(IrError::Usage(format!(
                        "--dim {p}={size}: graph output \"{}\" comes out {got}, its dimension {i} ({p}) not {size}: the exporter wrote the exported size into the graph where smelt cannot rewrite it; export with that axis dynamic, or at that size",
                        out.name()
                    )));
                }
            }
        }
        let rank_ok = dims.as_ref().is_none_or(|d| d.len() == got.shape.len());
        let dims_ok =
            self.batch.is_some() || dims.as_ref().is_none_or(|d| d.iter().zip(&got.shape).all(|(d, &n)| d.is_none_or(|d| d == n as i64)));
        if dtype.is_some_and(|d| d != got.dtype) || !rank_ok || !dims_ok {
            let shown = match &dims {
                Some(d) => d.iter().map(|d| d.map_or("?".into(), |v| v.to_string())).collect::<Vec<_>>().join(","),
                None => "?".into(),
            };
            let d = dtype.map_or("?".to_string(), |d| d.to_string());
            return Err(IrError::Malformed(format!(
                "graph output \"{}\" is declared {d}[{shown}] but the graph computes {got}",
                out.name()
            )));
        }
        Ok(())
    }

    /// The graph value for `name`, materialising a constant on first use.
    pub fn value(&mut self, name: &str) -> Result<ValueId, IrError> {
        let e = self.env.get_mut(name).ok_or_else(|| IrError::Malformed(format!("value \"{name}\" is used before it is defined")))?;
        if let Some(v) = e.value {
            return Ok(v);
        }
        let t = e.konst.clone().expect("an entry holds a value or a constant");
        let v = self.g.add_shared_constant(name, t);
        self.env.get_mut(name).expect("present").value = Some(v);
        Ok(v)
    }

    /// The constant for `name`, if it is known at import.
    pub fn konst(&self, name: &str) -> Option<Arc<Tensor>> {
        self.env.get(name).and_then(|e| e.konst.clone())
    }

    /// The type of `name`.
    pub fn ty(&self, name: &str) -> Result<TensorType, IrError> {
        let e = self.env.get(name).ok_or_else(|| IrError::Malformed(format!("value \"{name}\" is used before it is defined")))?;
        Ok(match (&e.konst, e.value) {
            (Some(t), _) => t.ty().clone(),
            (None, Some(v)) => self.g.ty(v).clone(),
            (None, None) => unreachable!("an entry holds a value or a constant"),
        })
    }
}

/// The ONNX model `bytes` (its external data, if any, under `base_dir`)
/// with the initializers named in `weights` replaced by those tensors: the
/// same graph, the same names, new values (`smelt train --save`). Tensors
/// stored as external data are inlined, so the result stands alone. Every
/// tensor must replace an initializer of its type.
pub fn with_initializers(bytes: &[u8], base_dir: Option<&Path>, weights: &HashMap<String, Tensor>) -> Result<Vec<u8>, IrError> {
    let mut model = ModelProto::decode(bytes).map_err(|e| IrError::Malformed(format!("not an ONNX model: {e}")))?;
    let graph = model.graph.as_mut().ok_or_else(|| IrError::Malformed("the model has no graph".into()))?;
    let mut replaced = std::collections::HashSet::new();
    for init in &mut graph.initializer {
        let name = init.name().to_string();
        if let Some(t) = weights.get(&name) {
            let old = tensor::from_proto_at(init, base_dir)?;
            if old.ty() != t.ty() {
                return Err(IrError::Invalid(format!(
                    "initializer \"{name}\" is {} in the model but the new value is {}",
                    old.ty(),
                    t.ty()
                )));
            }
            *init = to_proto(&name, t);
            replaced.insert(name);
        } else if !init.external_data.is_empty() {
            *init = to_proto(&name, &tensor::from_proto_at(init, base_dir)?);
        }
    }
    let mut missing: Vec<&String> = weights.keys().filter(|n| !replaced.contains(*n)).collect();
    if !missing.is_empty() {
        missing.sort();
        return Err(IrError::Invalid(format!("the model has no initializers named {missing:?} to replace")));
    }
    Ok(model.encode_to_vec())
}
