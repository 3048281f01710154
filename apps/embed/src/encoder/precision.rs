//! The float type the encoder's matrix products run in.
//!
//! `f32` everywhere is the default. `f16` and `bf16` keep the weights of
//! the dense layers in that type and run the projections, attention and the
//! feed-forward activation in it, while the embeddings, the residual
//! stream, the layer norms and the pooling stay in `f32` (what
//! mixed-precision inference in PyTorch does too). On a GPU they halve the
//! weights' memory and use the tensor cores.
//!
//! `int8` is the CPU's quantized mode: the dense layers' weights quantized
//! per output column at load, their inputs per token as each product runs,
//! the products summed in integers; everything else stays `f32` (see the
//! `quantized` module). Its vectors are within cosine 0.99 of `f32`'s.

use std::fmt;
use std::str::FromStr;

use burn::tensor::FloatDType;

/// The float type of the encoder's dense layers and attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// 32-bit floats everywhere.
    #[default]
    F32,
    /// IEEE half precision in the dense layers and attention.
    F16,
    /// bfloat16 in the dense layers and attention.
    Bf16,
    /// Int8 matrix products in the dense layers, on the CPU.
    Int8,
}

impl Precision {
    /// Every precision, in the order `--precision` lists them.
    pub const ALL: [Precision; 4] = [
        Precision::F32,
        Precision::F16,
        Precision::Bf16,
        Precision::Int8,
    ];

    /// The float type of the parts Burn runs: for `int8`, whose dense
    /// layers are the encoder's own kernels, `f32`.
    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::F32 | Precision::Int8 => FloatDType::F32,
            Precision::F16 => FloatDType::F16,
            Precision::Bf16 => FloatDType::BF16,
        }
    }

    /// Whether only the CPU computes in it (`int8`): `--device auto` then
    /// means the CPU, and a GPU refuses it.
    pub fn cpu_only(self) -> bool {
        self == Precision::Int8
    }

    /// The name `--precision` takes and prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A precision name that is not `f32`, `f16`, `bf16` or `int8`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision {0:?}: expected f32, f16, bf16 or int8")]
pub struct UnknownPrecision(pub String);

impl FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "int8" | "i8" => Ok(Precision::Int8),
            _ => Err(UnknownPrecision(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases_parse() {
        for p in Precision::ALL {
            assert_eq!(p.as_str().parse::<Precision>(), Ok(p));
        }
        assert_eq!("FP16".parse::<Precision>(), Ok(Precision::F16));
        assert_eq!("bfloat16".parse::<Precision>(), Ok(Precision::Bf16));
        let e = "f8".parse::<Precision>().unwrap_err();
        assert!(
            e.to_string().contains("expected f32, f16, bf16 or int8"),
            "{e}"
        );
        assert_eq!("INT8".parse::<Precision>(), Ok(Precision::Int8));
    }
}
