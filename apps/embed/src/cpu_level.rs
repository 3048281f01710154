//! The instruction-set level the encoder's own kernels use: the best the
//! CPU has, or a lower one named by `FLOTILLA_CPU_LEVEL` (`portable`,
//! `avx2`, `avx512`, `vnni`), so that a machine with AVX-512 and VNNI runs,
//! tests and measures what a CPU with only AVX2 runs.
//!
//! The cap covers the int8 matrix products, the attention, GELU,
//! LayerNorm and quantization loops. Burn's f32 matrix products (the gemm
//! crate) choose at run time too, among the kernels the build holds: the
//! crate's `gemm-avx512` feature (default) adds the AVX-512 ones; a build
//! without it runs gemm's AVX2 + FMA kernels, so that build with
//! `FLOTILLA_CPU_LEVEL=avx2` runs the whole encoder as an AVX2-only CPU
//! does.

/// The environment variable that caps the level.
pub const ENV: &str = "FLOTILLA_CPU_LEVEL";

/// An instruction-set level, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuLevel {
    /// No vector extension beyond the baseline: the portable loops.
    Portable,
    /// AVX2 and FMA (x86-64-v3).
    Avx2,
    /// AVX-512 (F, BW, VL…; x86-64-v4), without VNNI.
    Avx512,
    /// VNNI integer dot products (AVX-512 VNNI, or AVX-VNNI).
    Vnni,
}

/// A `FLOTILLA_CPU_LEVEL` value that names no level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ENV}={0:?} names no level; use portable, avx2, avx512 or vnni")]
pub struct UnknownCpuLevel(pub String);

impl std::str::FromStr for CpuLevel {
    type Err = UnknownCpuLevel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" => Ok(CpuLevel::Portable),
            "avx2" => Ok(CpuLevel::Avx2),
            "avx512" => Ok(CpuLevel::Avx512),
            "vnni" => Ok(CpuLevel::Vnni),
            _ => Err(UnknownCpuLevel(s.to_owned())),
        }
    }
}

impl CpuLevel {
    /// The cap `FLOTILLA_CPU_LEVEL` sets: none when unset, or an error
    /// naming a value that is no level.
    pub fn from_env() -> Result<Option<CpuLevel>, UnknownCpuLevel> {
        match std::env::var(ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse().map(Some),
            _ => Ok(None),
        }
    }

    /// The cap in force (an invalid value was refused when the model
    /// loaded, [`crate::SentenceEncoder::load`]; here it caps nothing).
    pub fn cap() -> Option<CpuLevel> {
        Self::from_env().ok().flatten()
    }
}

/// The vector unit the encoder's own loops dispatch to: the best the CPU
/// has, under the cap.
pub(crate) fn arch() -> pulp::Arch {
    arch_under(CpuLevel::cap())
}

fn arch_under(cap: Option<CpuLevel>) -> pulp::Arch {
    #[cfg(target_arch = "x86_64")]
    match cap {
        Some(CpuLevel::Portable) => pulp::Arch::Scalar,
        Some(CpuLevel::Avx2) => pulp::x86::V3::try_new().map_or(pulp::Arch::Scalar, pulp::Arch::V3),
        _ => pulp::Arch::new(),
    }
    #[cfg(not(target_arch = "x86_64"))]
    match cap {
        Some(CpuLevel::Portable) => pulp::Arch::Scalar,
        _ => pulp::Arch::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("AVX2".parse::<CpuLevel>(), Ok(CpuLevel::Avx2));
        assert_eq!(" vnni ".parse::<CpuLevel>(), Ok(CpuLevel::Vnni));
        assert!(CpuLevel::Portable < CpuLevel::Avx2 && CpuLevel::Avx512 < CpuLevel::Vnni);
        let e = "sse4".parse::<CpuLevel>().unwrap_err();
        assert!(e.to_string().contains("FLOTILLA_CPU_LEVEL") && e.to_string().contains("avx512"));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_cap_lowers_the_vector_unit() {
        assert!(matches!(
            arch_under(Some(CpuLevel::Portable)),
            pulp::Arch::Scalar
        ));
        if pulp::x86::V3::try_new().is_some() {
            assert!(matches!(
                arch_under(Some(CpuLevel::Avx2)),
                pulp::Arch::V3(_)
            ));
        }
        if pulp::x86::V4::try_new().is_some() {
            assert!(matches!(arch_under(None), pulp::Arch::V4(_)));
            assert!(matches!(
                arch_under(Some(CpuLevel::Avx512)),
                pulp::Arch::V4(_)
            ));
        }
    }
}
