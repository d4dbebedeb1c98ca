//! Tensors with data: constants (weights) and the values executors exchange.

use crate::dtype::{DType, TensorType};
use half::{bf16, f16};

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i64 elements.
    I64(Vec<i64>),
    /// i32 elements.
    I32(Vec<i32>),
    /// bool elements.
    Bool(Vec<bool>),
    /// i8 elements.
    I8(Vec<i8>),
    /// u8 elements.
    U8(Vec<u8>),
    /// i16 elements.
    I16(Vec<i16>),
    /// u16 elements.
    U16(Vec<u16>),
    /// u32 elements.
    U32(Vec<u32>),
}

impl TensorData {
    /// The dtype of these elements.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::Bool(_) => DType::Bool,
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::I16(_) => DType::I16,
            TensorData::U16(_) => DType::U16,
            TensorData::U32(_) => DType::U32,
        }
    }

    /// The elements as little-endian bytes (bool as one byte each), as a
    /// device buffer holds them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as u8).collect(),
            TensorData::U8(v) => v.clone(),
            TensorData::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::Bool(v) => v.len(),
            TensorData::I8(v) => v.len(),
            TensorData::U8(v) => v.len(),
            TensorData::I16(v) => v.len(),
            TensorData::U16(v) => v.len(),
            TensorData::U32(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tensor: its type and its elements. `data.len()` always equals
/// `ty.numel()` and `data.dtype()` equals `ty.dtype` (checked by [`Tensor::new`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    ty: TensorType,
    data: TensorData,
}

impl Tensor {
    /// A tensor of `shape` with these elements, or `None` when the element
    /// count does not match the shape.
    pub fn new(shape: impl Into<Vec<usize>>, data: TensorData) -> Option<Tensor> {
        let ty = TensorType::new(data.dtype(), shape);
        (ty.numel() == data.len()).then_some(Tensor { ty, data })
    }

    /// An f32 tensor; panics if the length does not match (for literals in
    /// code and tests, never for user data).
    pub fn from_f32(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Tensor {
        Tensor::new(shape, TensorData::F32(data)).expect("element count matches the shape")
    }

    /// An i64 tensor; panics if the length does not match.
    pub fn from_i64(shape: impl Into<Vec<usize>>, data: Vec<i64>) -> Tensor {
        Tensor::new(shape, TensorData::I64(data)).expect("element count matches the shape")
    }

    /// A tensor of `ty` from little-endian bytes (as [`TensorData::to_le_bytes`]
    /// writes them), or `None` when the byte count does not match.
    pub fn from_le_bytes(ty: &TensorType, bytes: &[u8]) -> Option<Tensor> {
        if bytes.len() != ty.bytes() {
            return None;
        }
        fn chunks<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            b.chunks_exact(N).map(|c| f(c.try_into().expect("exact chunks"))).collect()
        }
        let data = match ty.dtype {
            DType::F32 => TensorData::F32(chunks(bytes, f32::from_le_bytes)),
            DType::F16 => TensorData::F16(chunks(bytes, f16::from_le_bytes)),
            DType::BF16 => TensorData::BF16(chunks(bytes, bf16::from_le_bytes)),
            DType::I64 => TensorData::I64(chunks(bytes, i64::from_le_bytes)),
            DType::I32 => TensorData::I32(chunks(bytes, i32::from_le_bytes)),
            DType::Bool => TensorData::Bool(bytes.iter().map(|&b| b != 0).collect()),
            DType::I8 => TensorData::I8(bytes.iter().map(|&b| b as i8).collect()),
            DType::U8 => TensorData::U8(bytes.to_vec()),
            DType::I16 => TensorData::I16(chunks(bytes, i16::from_le_bytes)),
            DType::U16 => TensorData::U16(chunks(bytes, u16::from_le_bytes)),
            DType::U32 => TensorData::U32(chunks(bytes, u32::from_le_bytes)),
        };
        Some(Tensor { ty: ty.clone(), data })
    }

    /// Dtype and shape.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    /// The elements.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// Consumes the tensor, giving its elements.
    pub fn into_data(self) -> TensorData {
        self.data
    }

    /// The same elements under another shape with the same element count.
    pub fn reshaped(mut self, shape: Vec<usize>) -> Option<Tensor> {
        (shape.iter().product::<usize>() == self.ty.numel()).then(|| {
            self.ty.shape = shape;
            self
        })
    }

    /// Every element converted to f32 (integers and bools by value).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            TensorData::F32(v) => v.clone(),
            TensorData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f32).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// Every element converted to i64 (floats truncated toward zero).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match &self.data {
            TensorData::I64(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as i64).collect(),
            _ => self.to_f32_vec().into_iter().map(|x| x as i64).collect(),
        }
    }

    /// This tensor converted to `dtype`, with the rounding of a cast.
    pub fn cast(&self, dtype: DType) -> Tensor {
        if dtype == self.ty.dtype {
            return self.clone();
        }
        let data = match dtype {
            DType::I64 => TensorData::I64(self.to_i64_vec()),
            DType::I32 => TensorData::I32(self.to_i64_vec().into_iter().map(|x| x as i32).collect()),
            DType::I8 => TensorData::I8(self.to_i64_vec().into_iter().map(|x| x as i8).collect()),
            DType::U8 => TensorData::U8(self.to_i64_vec().into_iter().map(|x| x as u8).collect()),
            DType::I16 => TensorData::I16(self.to_i64_vec().into_iter().map(|x| x as i16).collect()),
            DType::U16 => TensorData::U16(self.to_i64_vec().into_iter().map(|x| x as u16).collect()),
            DType::U32 => TensorData::U32(self.to_i64_vec().into_iter().map(|x| x as u32).collect()),
            DType::Bool => TensorData::Bool(self.to_f32_vec().into_iter().map(|x| x != 0.0).collect()),
            DType::F32 => TensorData::F32(self.to_f32_vec()),
            DType::F16 => TensorData::F16(self.to_f32_vec().into_iter().map(f16::from_f32).collect()),
            DType::BF16 => TensorData::BF16(self.to_f32_vec().into_iter().map(bf16::from_f32).collect()),
        };
        Tensor { ty: TensorType::new(dtype, self.ty.shape.clone()), data }
    }

    /// The elements at flat indices `order`, exactly (any dtype), as a
    /// tensor of `shape` (whose element count is `order.len()`).
    pub fn take(&self, order: &[usize], shape: Vec<usize>) -> Tensor {
        macro_rules! at {
            ($var:ident, $v:expr) => {
                TensorData::$var(order.iter().map(|&i| $v[i]).collect())
            };
        }
        let data = match &self.data {
            TensorData::F32(v) => at!(F32, v),
            TensorData::F16(v) => at!(F16, v),
            TensorData::BF16(v) => at!(BF16, v),
            TensorData::I64(v) => at!(I64, v),
            TensorData::I32(v) => at!(I32, v),
            TensorData::Bool(v) => at!(Bool, v),
            TensorData::I8(v) => at!(I8, v),
            TensorData::U8(v) => at!(U8, v),
            TensorData::I16(v) => at!(I16, v),
            TensorData::U16(v) => at!(U16, v),
            TensorData::U32(v) => at!(U32, v),
        };
        Tensor::new(shape, data).expect("take: the shape holds one element per index")
    }

    /// The elements of `self` then of `other` (one dtype), flat, exactly;
    /// `None` for two dtypes.
    pub fn concat_flat(&self, other: &Tensor) -> Option<Tensor> {
        macro_rules! cat {
            ($var:ident, $x:expr, $y:expr) => {
                TensorData::$var($x.iter().chain($y.iter()).copied().collect())
            };
        }
        let data = match (&self.data, &other.data) {
            (TensorData::F32(x), TensorData::F32(y)) => cat!(F32, x, y),
            (TensorData::F16(x), TensorData::F16(y)) => cat!(F16, x, y),
            (TensorData::BF16(x), TensorData::BF16(y)) => cat!(BF16, x, y),
            (TensorData::I64(x), TensorData::I64(y)) => cat!(I64, x, y),
            (TensorData::I32(x), TensorData::I32(y)) => cat!(I32, x, y),
            (TensorData::Bool(x), TensorData::Bool(y)) => cat!(Bool, x, y),
            (TensorData::I8(x), TensorData::I8(y)) => cat!(I8, x, y),
            (TensorData::U8(x), TensorData::U8(y)) => cat!(U8, x, y),
            (TensorData::I16(x), TensorData::I16(y)) => cat!(I16, x, y),
            (TensorData::U16(x), TensorData::U16(y)) => cat!(U16, x, y),
            (TensorData::U32(x), TensorData::U32(y)) => cat!(U32, x, y),
            _ => return None,
        };
        Tensor::new(vec![data.len()], data)
    }

    /// A tensor of `ty` whose elements all equal `value`.
    pub fn full(ty: &TensorType, value: f64) -> Tensor {
        let n = ty.numel();
        let data = match ty.dtype {
            DType::F32 => TensorData::F32(vec![value as f32; n]),
            DType::F16 => TensorData::F16(vec![f16::from_f64(value); n]),
            DType::BF16 => TensorData::BF16(vec![bf16::from_f64(value); n]),
            DType::I64 => TensorData::I64(vec![value as i64; n]),
            DType::I32 => TensorData::I32(vec![value as i32; n]),
            DType::I8 => TensorData::I8(vec![value as i8; n]),
            DType::U8 => TensorData::U8(vec![value as u8; n]),
            DType::I16 => TensorData::I16(vec![value as i16; n]),
            DType::U16 => TensorData::U16(vec![value as u16; n]),
            DType::U32 => TensorData::U32(vec![value as u32; n]),
            DType::Bool => TensorData::Bool(vec![value != 0.0; n]),
        };
        Tensor { ty: ty.clone(), data }
    }
}
