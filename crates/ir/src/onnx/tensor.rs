//! `TensorProto` to and from [`Tensor`]: initializers, `Constant` values and
//! the `.pb` files of ONNX test data.

use crate::dtype::DType;
use crate::error::IrError;
use crate::tensor::{Tensor, TensorData};
use half::{bf16, f16};
use smelt_onnx_proto::{tensor_proto::DataType, Message, TensorProto};

/// The smelt dtype of an ONNX data type code.
pub fn dtype_of(code: i32) -> Result<DType, String> {
    Ok(match DataType::try_from(code) {
        Ok(DataType::Float) => DType::F32,
        Ok(DataType::Float16) => DType::F16,
        Ok(DataType::Bfloat16) => DType::BF16,
        Ok(DataType::Int64) => DType::I64,
        Ok(DataType::Int32) => DType::I32,
        Ok(DataType::Bool) => DType::Bool,
        Ok(DataType::Int8) => DType::I8,
        Ok(DataType::Uint8) => DType::U8,
        Ok(DataType::Int16) => DType::I16,
        Ok(DataType::Uint16) => DType::U16,
        Ok(DataType::Uint32) => DType::U32,
        Ok(d) => return Err(format!("data type {} is not supported", d.as_str_name())),
        Err(_) => return Err(format!("unknown data type code {code}")),
    })
}

fn code_of(d: DType) -> DataType {
    match d {
        DType::F32 => DataType::Float,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I64 => DataType::Int64,
        DType::I32 => DataType::Int32,
        DType::Bool => DataType::Bool,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I16 => DataType::Int16,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
    }
}

/// Checked element count of ONNX dims.
pub fn numel_of(dims: &[i64], dtype: DType) -> Result<(Vec<usize>, usize), String> {
    let shape = dims.iter().map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}"))).collect::<Result<Vec<_>, _>>()?;
    let ty = crate::TensorType::new(dtype, shape.clone());
    ty.checked_bytes().ok_or_else(|| format!("{}shape {dims:?} exceeds 1 TiB", crate::error::TOO_LARGE))?;
    Ok((shape, ty.numel()))
}

/// The `bytes` bytes of an external tensor: `location` relative to `base`
/// and inside it, `offset` and `length` within the file's size, checked
/// before anything is allocated.
fn read_external(t: &TensorProto, base: &std::path::Path, bytes: usize) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let get = |k: &str| t.external_data.iter().find(|e| e.key() == k).map(|e| e.value().to_string());
    let location = get("location").ok_or("external data without a location")?;
    let rel = std::path::Path::new(&location);
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
        return Err(format!("external data location {location:?} must be a relative path inside the model's folder"));
    }
    let num = |k: &str| -> Result<Option<u64>, String> {
        get(k).map(|v| v.parse::<u64>().map_err(|_| format!("external data {k} {v:?} is not a byte count"))).transpose()
    };
    let offset = num("offset")?.unwrap_or(0);
    if let Some(len) = num("length")? {
        if len != bytes as u64 {
            return Err(format!("external data length {len} bytes, its shape and dtype need {bytes}"));
        }
    }
    let path = base.join(rel);
    let mut f = std::fs::File::open(&path).map_err(|e| format!("external data {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| format!("external data {}: {e}", path.display()))?.len();
    if offset.checked_add(bytes as u64).is_none_or(|end| end > size) {
        return Err(format!("external data {}: {bytes} bytes at offset {offset} exceed its {size} bytes", path.display()));
    }
    let mut buf = vec![0u8; bytes];
    f.seek(SeekFrom::Start(offset)).and_then(|_| f.read_exact(&mut buf)).map_err(|e| format!("external data {}: {e}", path.display()))?;
    Ok(buf)
}

fn chunks<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N).map(|c| c.try_into().expect("exact chunk"))
}

/// Converts a `TensorProto` held in the model. Errors name the tensor.
pub fn from_proto(t: &TensorProto) -> Result<Tensor, IrError> {
    from_proto_at(t, None)
}

/// Converts a `TensorProto` whose data may be in an external file beside
/// the model (in `base`, as the dynamo exporter writes `model.onnx.data`).
pub fn from_proto_at(t: &TensorProto, base: Option<&std::path::Path>) -> Result<Tensor, IrError> {
    let name = t.name();
    let bad = |msg: String| IrError::Malformed(format!("tensor \"{name}\": {msg}"));
    let dtype = dtype_of(t.data_type()).map_err(|m| match DataType::try_from(t.data_type()) {
        Ok(_) => IrError::UnsupportedFeature(format!("tensor \"{name}\": {m}")),
        Err(_) => bad(m),
    })?;
    let (shape, n) = numel_of(&t.dims, dtype).map_err(bad)?;
    let external;
    let (raw, has_raw) = if t.data_location() == smelt_onnx_proto::tensor_proto::DataLocation::External {
        let base = base.ok_or_else(|| bad("its data is in an external file, and the model was not read from a file".into()))?;
        external = read_external(t, base, n * dtype.size()).map_err(bad)?;
        (external.as_slice(), true)
    } else {
        (t.raw_data(), t.raw_data.is_some())
    };
    let data = if has_raw {
        if raw.len() != n * dtype.size() {
            return Err(bad(format!("raw data has {} bytes, {n} elements of {dtype} need {}", raw.len(), n * dtype.size())));
        }
        match dtype {
            DType::F32 => TensorData::F32(chunks::<4>(raw).map(f32::from_le_bytes).collect()),
            DType::F16 => TensorData::F16(chunks::<2>(raw).map(|b| f16::from_bits(u16::from_le_bytes(b))).collect()),
            DType::BF16 => TensorData::BF16(chunks::<2>(raw).map(|b| bf16::from_bits(u16::from_le_bytes(b))).collect()),
            DType::I64 => TensorData::I64(chunks::<8>(raw).map(i64::from_le_bytes).collect()),
            DType::I32 => TensorData::I32(chunks::<4>(raw).map(i32::from_le_bytes).collect()),
            DType::Bool => TensorData::Bool(raw.iter().map(|&b| b != 0).collect()),
            DType::I8 => TensorData::I8(raw.iter().map(|&b| b as i8).collect()),
            DType::U8 => TensorData::U8(raw.to_vec()),
            DType::I16 => TensorData::I16(chunks::<2>(raw).map(i16::from_le_bytes).collect()),
            DType::U16 => TensorData::U16(chunks::<2>(raw).map(u16::from_le_bytes).collect()),
            DType::U32 => TensorData::U32(chunks::<4>(raw).map(u32::from_le_bytes).collect()),
        }
    } else {
        // ONNX keeps 8- to 32-bit integers in int32_data, uint32 in uint64_data.
        let len = match dtype {
            DType::F32 => t.float_data.len(),
            DType::I64 => t.int64_data.len(),
            DType::U32 => t.uint64_data.len(),
            _ => t.int32_data.len(),
        };
        if len != n {
            return Err(bad(format!("has {len} elements, its shape {:?} needs {n}", t.dims)));
        }
        match dtype {
            DType::F32 => TensorData::F32(t.float_data.clone()),
            DType::I64 => TensorData::I64(t.int64_data.clone()),
            DType::I32 => TensorData::I32(t.int32_data.clone()),
            DType::F16 => TensorData::F16(t.int32_data.iter().map(|&b| f16::from_bits(b as u16)).collect()),
            DType::BF16 => TensorData::BF16(t.int32_data.iter().map(|&b| bf16::from_bits(b as u16)).collect()),
            DType::Bool => TensorData::Bool(t.int32_data.iter().map(|&b| b != 0).collect()),
            DType::I8 => TensorData::I8(t.int32_data.iter().map(|&b| b as i8).collect()),
            DType::U8 => TensorData::U8(t.int32_data.iter().map(|&b| b as u8).collect()),
            DType::I16 => TensorData::I16(t.int32_data.iter().map(|&b| b as i16).collect()),
            DType::U16 => TensorData::U16(t.int32_data.iter().map(|&b| b as u16).collect()),
            DType::U32 => TensorData::U32(t.uint64_data.iter().map(|&b| b as u32).collect()),
        }
    };
    Ok(Tensor::new(shape, data).expect("element count checked"))
}

/// Converts a tensor to a `TensorProto` named `name` (raw little-endian data).
pub fn to_proto(name: &str, t: &Tensor) -> TensorProto {
    let raw: Vec<u8> = match t.data() {
        TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        TensorData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        other => other.to_le_bytes(),
    };
    TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(code_of(t.ty().dtype) as i32),
        name: Some(name.to_string()),
        raw_data: Some(raw),
        ..Default::default()
    }
}

/// Reads a `.pb` file holding one `TensorProto`; returns its name and data.
pub fn read_tensor_file(path: &std::path::Path) -> Result<(String, Tensor), IrError> {
    let bytes = std::fs::read(path).map_err(|source| IrError::Io { path: path.display().to_string(), error: source })?;
    let t = TensorProto::decode(bytes.as_slice()).map_err(|e| IrError::Malformed(format!("{}: not a TensorProto: {e}", path.display())))?;
    let data = from_proto(&t).map_err(|e| match e {
        IrError::Malformed(m) => IrError::Malformed(format!("{}: {m}", path.display())),
        e => e,
    })?;
    Ok((t.name().to_string(), data))
}

/// Writes a tensor as a `.pb` file holding one `TensorProto`.
pub fn write_tensor_file(path: &std::path::Path, name: &str, t: &Tensor) -> Result<(), IrError> {
    std::fs::write(path, to_proto(name, t).encode_to_vec())
        .map_err(|source| IrError::Io { path: path.display().to_string(), error: source })
}
