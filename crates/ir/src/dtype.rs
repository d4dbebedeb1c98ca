//! Element types and tensor types.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: f32's exponent with a 7-bit mantissa.
    BF16,
    /// 64-bit signed integer (shapes and indices).
    I64,
    /// 32-bit signed integer.
    I32,
    /// Boolean, one byte per element.
    Bool,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer (images, labels).
    U8,
    /// 16-bit signed integer.
    I16,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit unsigned integer.
    U32,
}

impl DType {
    /// Every dtype, in the order the text format lists them.
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::Bool,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::U32,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I64 => 8,
            DType::Bool | DType::I8 | DType::U8 => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The name used by the text format (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::U32 => "u32",
        }
    }

    /// Parses a text-format name.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static shape: one extent per dimension, outermost first.
pub type Shape = Vec<usize>;

/// The largest tensor smelt accepts, in bytes (1 TiB). Anything larger is an
/// absurd size, almost always a corrupt file, and is refused before any
/// allocation.
pub const MAX_TENSOR_BYTES: u128 = 1 << 40;

/// Dtype and static shape of one value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Shape,
}

impl TensorType {
    /// A new tensor type.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Self {
        TensorType { dtype, shape: shape.into() }
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// The size in bytes without overflow, or `None` when it exceeds
    /// [`MAX_TENSOR_BYTES`]. An empty tensor counts its non-zero extents
    /// too: code that loops over one extent must not meet an absurd one.
    pub fn checked_bytes(&self) -> Option<usize> {
        let mut n: u128 = self.dtype.size() as u128;
        for &d in self.shape.iter().filter(|&&d| d != 0) {
            n = n.checked_mul(d as u128)?;
            if n > MAX_TENSOR_BYTES {
                return None;
            }
        }
        let empty = self.shape.contains(&0);
        usize::try_from(if empty { 0 } else { n }).ok()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Where f32 products may run on tensor cores in TF32 (operands rounded to
/// 10 mantissa bits, products accumulated in f32), as PyTorch's
/// `allow_tf32` switches. A graph's default is exact f32; the command line
/// defaults to [`Tf32::Conv`] on GPU backends, as PyTorch on a GPU does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tf32 {
    /// Every f32 product on CUDA cores in f32.
    #[default]
    Off,
    /// f32 convolutions in TF32 (cuDNN's default).
    Conv,
    /// f32 convolutions, GEMMs and MatMuls in TF32.
    On,
}

impl Tf32 {
    /// The flag's values.
    pub const NAMES: [&'static str; 3] = ["off", "conv", "on"];

    /// Whether f32 convolutions run in TF32.
    pub fn convs(self) -> bool {
        self != Tf32::Off
    }

    /// Whether f32 GEMMs and MatMuls run in TF32.
    pub fn gemms(self) -> bool {
        self == Tf32::On
    }
}

impl std::str::FromStr for Tf32 {
    type Err = String;
    fn from_str(s: &str) -> Result<Tf32, String> {
        match s {
            "off" => Ok(Tf32::Off),
            "conv" => Ok(Tf32::Conv),
            "on" => Ok(Tf32::On),
            _ => Err(format!("unknown TF32 mode {s:?}: one of {}", Tf32::NAMES.join(", "))),
        }
    }
}

impl std::fmt::Display for Tf32 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(Tf32::NAMES[*self as usize])
    }
}

/// `x` rounded to TF32 as `cvt.rna.tf32.f32` does (`wmma::__float_to_tf32`):
/// to 10 mantissa bits, ties away from zero; infinities and NaN unchanged.
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits((x.to_bits() + 0x1000) & 0xffff_e000)
}

#[cfg(test)]
mod tf32_tests {
    use super::round_tf32;

    #[test]
    fn tf32_rounds_to_ten_bits_ties_away_from_zero() {
        let ulp = 2f32.powi(-10);
        assert_eq!(round_tf32(1.0 + ulp / 2.0), 1.0 + ulp);
        assert_eq!(round_tf32(-(1.0 + ulp / 2.0)), -(1.0 + ulp));
        assert_eq!(round_tf32(1.0 + ulp / 4.0), 1.0);
        assert_eq!(round_tf32(1.0 + 0.75 * ulp), 1.0 + ulp);
        assert_eq!(round_tf32(f32::INFINITY), f32::INFINITY);
        assert!(round_tf32(f32::NAN).is_nan());
        assert_eq!(round_tf32(f32::MAX), f32::INFINITY);
    }
}
