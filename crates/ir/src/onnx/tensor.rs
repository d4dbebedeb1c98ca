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
    }
}

/// Checked element count of ONNX dims.
pub fn numel_of(dims: &[i64], dtype: DType) -> Result<(Vec<usize>, usize), String> {
    let shape = dims.iter().map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}"))).collect::<Result<Vec<_>, _>>()?;
    let ty = crate::TensorType::new(dtype, shape.clone());
    ty.checked_bytes().ok_or_else(|| format!("{}shape {dims:?} exceeds 1 TiB", crate::error::TOO_LARGE))?;
    Ok((shape, ty.numel()))
}

fn chunks<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N).map(|c| c.try_into().expect("exact chunk"))
}

/// Converts a `TensorProto`. Errors name the tensor.
pub fn from_proto(t: &TensorProto) -> Result<Tensor, IrError> {
    let name = t.name();
    let bad = |msg: String| IrError::Malformed(format!("tensor \"{name}\": {msg}"));
    if t.data_location() == smelt_onnx_proto::tensor_proto::DataLocation::External {
        return Err(bad("external data files are not supported".into()));
    }
    let dtype = dtype_of(t.data_type()).map_err(bad)?;
    let (shape, n) = numel_of(&t.dims, dtype).map_err(bad)?;
    let raw = t.raw_data();
    let data = if t.raw_data.is_some() {
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
        }
    } else {
        let len = match dtype {
            DType::F32 => t.float_data.len(),
            DType::I64 => t.int64_data.len(),
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
        TensorData::Bool(v) => v.iter().map(|&x| x as u8).collect(),
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
