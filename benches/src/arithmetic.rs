//! How much arithmetic a job is: the encoder's multiply-accumulates per
//! text, and the core's own ceiling for them (its fused multiply-add peak),
//! so a rate in texts per CPU-second can be read as a share of what the
//! core can do at most.

use std::time::Instant;

use flotilla_embed::ModelFolder;

/// A vector width the FMA peak is measured at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorWidth {
    /// 256-bit `ymm` FMAs (AVX2 + FMA): 8 `f32` lanes.
    Avx2,
    /// 512-bit `zmm` FMAs (AVX-512 F): 16 `f32` lanes.
    Avx512,
}

impl std::fmt::Display for VectorWidth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VectorWidth::Avx2 => "AVX2",
            VectorWidth::Avx512 => "AVX-512",
        })
    }
}

/// Independent accumulator chains: more than FMA latency × FMA pipes on
/// the cores we know (4 cycles × 2 pipes), so the pipes never wait.
const CHAINS: usize = 12;

/// Rounds of every chain per timing.
const ROUNDS: u64 = 20_000_000;

/// The best rate of `f32` multiply-accumulates one thread reaches at
/// `width`, in GMAC/s (`CHAINS` independent FMA chains, no memory
/// traffic), or `None` where this CPU lacks the width.
pub fn fma_peak_gmacs(width: VectorWidth) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use pulp::x86::{V3, V4};
        let lanes: u64 = match width {
            VectorWidth::Avx2 => 8,
            VectorWidth::Avx512 => 16,
        };
        let (v3, v4) = (V3::try_new(), V4::try_new());
        match width {
            VectorWidth::Avx2 if v3.is_none() => return None,
            VectorWidth::Avx512 if v4.is_none() => return None,
            _ => {}
        }
        let best = (0..3)
            .map(|_| {
                let start = Instant::now();
                let sum = match (width, v3, v4) {
                    (VectorWidth::Avx2, Some(simd), _) => simd.vectorize(x86::ChainsAvx2(simd)),
                    (VectorWidth::Avx512, _, Some(simd)) => simd.vectorize(x86::ChainsAvx512(simd)),
                    _ => 0.0,
                };
                std::hint::black_box(sum);
                start.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        Some((ROUNDS * CHAINS as u64 * lanes) as f64 / best / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = width;
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use pulp::x86::{V3, V4};

    use super::{CHAINS, ROUNDS};

    /// `ROUNDS` rounds of `CHAINS` independent 256-bit FMA chains.
    pub(super) struct ChainsAvx2(pub V3);

    impl pulp::NullaryFnOnce for ChainsAvx2 {
        type Output = f32;

        #[inline(always)]
        fn call(self) -> f32 {
            let simd = self.0;
            let (a, b) = (
                simd.avx._mm256_set1_ps(0.999_999),
                simd.avx._mm256_set1_ps(1e-7),
            );
            let mut acc = [simd.avx._mm256_set1_ps(1.0); CHAINS];
            for _ in 0..ROUNDS {
                for x in acc.iter_mut() {
                    *x = simd.fma._mm256_fmadd_ps(*x, a, b);
                }
            }
            let sum = acc.iter().fold(simd.avx._mm256_setzero_ps(), |s, x| {
                simd.avx._mm256_add_ps(s, *x)
            });
            let lanes: [f32; 8] = pulp::cast(sum);
            lanes.iter().sum()
        }
    }

    /// `ROUNDS` rounds of `CHAINS` independent 512-bit FMA chains.
    pub(super) struct ChainsAvx512(pub V4);

    impl pulp::NullaryFnOnce for ChainsAvx512 {
        type Output = f32;

        #[inline(always)]
        fn call(self) -> f32 {
            let simd = self.0;
            let f = simd.avx512f;
            let (a, b) = (f._mm512_set1_ps(0.999_999), f._mm512_set1_ps(1e-7));
            let mut acc = [f._mm512_set1_ps(1.0); CHAINS];
            for _ in 0..ROUNDS {
                for x in acc.iter_mut() {
                    *x = f._mm512_fmadd_ps(*x, a, b);
                }
            }
            let sum = acc
                .iter()
                .fold(f._mm512_setzero_ps(), |s, x| f._mm512_add_ps(s, *x));
            let lanes: [f32; 16] = pulp::cast(sum);
            lanes.iter().sum()
        }
    }
}

/// One thread's FMA peak at each width this CPU has, widest first.
pub fn fma_peaks() -> Vec<(VectorWidth, f64)> {
    [VectorWidth::Avx512, VectorWidth::Avx2]
        .into_iter()
        .filter_map(|w| fma_peak_gmacs(w).map(|p| (w, p)))
        .collect()
}

/// The encoder's multiply-accumulates per text over `texts`, run as the
/// rivals run them: sorted by token length, cut into batches of `batch`,
/// each padded to its longest text. Counted: the dense layers of every
/// layer (Q, K, V and the attention output: 4·h², the feed-forward
/// pair: 2·h·ff, per token) and the attention's two products
/// (scores and weighted values: 2·L·h per token); the softmax, norms,
/// GELU and pooling are left out (no multiply-accumulates of size).
pub fn macs_per_text(folder: &ModelFolder, texts: &[&str], batch: usize) -> anyhow::Result<f64> {
    anyhow::ensure!(!texts.is_empty() && batch > 0, "no texts or batch 0");
    let tokenizer = folder.tokenizer()?;
    let mut lengths = texts
        .iter()
        .map(|t| Ok(tokenizer.tokenize(&[t])?.seq_len))
        .collect::<anyhow::Result<Vec<usize>>>()?;
    lengths.sort_unstable();
    let c = &folder.config;
    let (h, ff, layers) = (
        c.hidden_size as f64,
        c.intermediate_size as f64,
        c.num_hidden_layers as f64,
    );
    let total: f64 = lengths
        .chunks(batch)
        .map(|chunk| {
            let padded = *chunk.last().unwrap_or(&0) as f64;
            let rows = chunk.len() as f64 * padded;
            layers * rows * (4.0 * h * h + 2.0 * h * ff + 2.0 * padded * h)
        })
        .sum();
    Ok(total / texts.len() as f64)
}
