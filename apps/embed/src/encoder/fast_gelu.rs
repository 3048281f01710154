//! Exact-form GELU for the CPU backend, written so the compiler vectorises
//! it: `x · ½ · (1 + erf(x/√2))` with erf from Abramowitz & Stegun 7.1.26
//! (absolute error ≤ 1.5e-7) and a branch-free `exp`.
//!
//! Burn's CPU backend evaluates `erf` with scalar libm calls, which took a
//! seventh of the encoder's CPU time; this loop does the same work in a few
//! vector instructions per element. It is compiled for the widest vector
//! unit the CPU has (AVX-512, AVX2 + FMA, or the baseline), chosen at run
//! time through [`pulp`], and runs in parallel on the caller's rayon pool.

use rayon::prelude::*;

const P: f32 = 0.327_591_1;
const A1: f32 = 0.254_829_6;
const A2: f32 = -0.284_496_72;
const A3: f32 = 1.421_413_8;
const A4: f32 = -1.453_152_1;
const A5: f32 = 1.061_405_4;

/// `e^x` for `x ≤ 0`, relative error below 2e-7, no branches.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    let x = x.max(-87.0);
    // n = round(x / ln 2) with the 1.5·2²³ trick, r = x − n·ln 2.
    const SHIFT: f32 = 12_582_912.0;
    let shifted = x * std::f32::consts::LOG2_E + SHIFT;
    let n = shifted - SHIFT;
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    // e^r on |r| ≤ ln2/2, degree-6 Taylor polynomial.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2ⁿ from the bits of `shifted`, whose mantissa holds 2²² + n: the low
    // nine bits of n + 127 (1..=127 here) are the exponent field. Integer
    // operations on the bits vectorise; a float-to-integer cast saturates
    // and does not.
    let scale = f32::from_bits(shifted.to_bits().wrapping_add(127) << 23);
    p * scale
}

/// Values per parallel task: large enough that a task outweighs its
/// scheduling.
const CHUNK: usize = 1 << 14;

/// Applies exact-form GELU to every value in place.
pub(crate) fn gelu_in_place(values: &mut [f32]) {
    let arch = crate::cpu_level::arch();
    each_chunk(values, |g| arch.dispatch(g));
}

/// Runs `run` on every chunk of `values`, in parallel.
fn each_chunk(values: &mut [f32], run: impl Fn(Gelu<'_>) + Sync) {
    values
        .par_chunks_mut(CHUNK)
        .for_each(|chunk| run(Gelu(chunk)));
}

/// One chunk of values: the unit of run-time dispatch.
struct Gelu<'a>(&'a mut [f32]);

impl pulp::WithSimd for Gelu<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        gelu_slice(self.0);
    }
}

#[inline(always)]
fn gelu_slice(values: &mut [f32]) {
    for v in values.iter_mut() {
        let x = *v;
        let z = x * std::f32::consts::FRAC_1_SQRT_2;
        let a = z.abs();
        let t = 1.0 / (1.0 + P * a);
        let poly = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5))));
        let erf = (1.0 - poly * exp_neg(-a * a)).copysign(z);
        *v = 0.5 * x * (1.0 + erf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gelu_reference(x: f64) -> f64 {
        0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2))
    }

    /// erf in f64: Maclaurin series below |x| = 3.5 (terms stay far from
    /// f64's limits there), the asymptotic erfc expansion above.
    fn erf64(x: f64) -> f64 {
        let z = x.abs();
        let v = if z < 3.5 {
            let (mut sum, mut term, mut n) = (0.0f64, z, 0.0f64);
            while term.abs() > 1e-18 {
                sum += term / (2.0 * n + 1.0);
                n += 1.0;
                term *= -z * z / n;
            }
            2.0 / std::f64::consts::PI.sqrt() * sum
        } else {
            let z2 = z * z;
            let series = 1.0 - 1.0 / (2.0 * z2) + 3.0 / (4.0 * z2 * z2) - 15.0 / (8.0 * z2.powi(3))
                + 105.0 / (16.0 * z2.powi(4));
            1.0 - (-z2).exp() / (z * std::f64::consts::PI.sqrt()) * series
        };
        v.copysign(x)
    }

    #[test]
    fn matches_exact_gelu_within_a_ten_millionth_per_unit() {
        let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 400.0).collect();
        let mut got = xs.clone();
        gelu_in_place(&mut got);
        for (x, g) in xs.iter().zip(&got) {
            let want = gelu_reference(f64::from(*x));
            let err = (f64::from(*g) - want).abs();
            // A&S bounds erf's error by 1.5e-7, so GELU's by 0.75e-7·|x|,
            // plus f32 rounding of the result.
            assert!(
                err <= 1e-7 * (1.0 + f64::from(x.abs())) + f64::from(f32::EPSILON) * want.abs(),
                "gelu({x}) = {g}, want {want}, err {err:e}"
            );
        }
    }

    /// The loop compiled for each instruction set this CPU has gives the
    /// same values: a CPU without AVX-512 runs the AVX2 one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_instruction_set_level_gives_the_same_values() {
        use pulp::{Simd, WithSimd};
        let xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 / 4000.0).collect();
        let mut levels: Vec<(&str, Vec<f32>)> = Vec::new();
        let mut run = |name, f: &(dyn Fn(Gelu<'_>) + Sync)| {
            let mut v = xs.clone();
            each_chunk(&mut v, f);
            levels.push((name, v));
        };
        run("scalar", &|g| g.with_simd(pulp::Scalar::new()));
        if let Some(v3) = pulp::x86::V3::try_new() {
            run("avx2+fma", &|g| Simd::vectorize(v3, g));
        }
        if let Some(v4) = pulp::x86::V4::try_new() {
            run("avx-512", &|g| Simd::vectorize(v4, g));
        }
        let (_, first) = &levels[0];
        for (name, got) in &levels[1..] {
            for (i, (g, f)) in got.iter().zip(first).enumerate() {
                assert!(
                    (g - f).abs() <= 1e-6 * (1.0 + f.abs()),
                    "{name} at {}: {g} vs scalar {f}",
                    xs[i]
                );
            }
        }
    }

    #[test]
    fn extreme_inputs_are_finite() {
        let mut v = vec![-1e30f32, -100.0, -10.0, 0.0, 10.0, 100.0, 1e30];
        gelu_in_place(&mut v);
        assert!(v.iter().all(|x| x.is_finite()), "{v:?}");
        assert_eq!(v[3], 0.0);
        assert_eq!(v[6], 1e30);
        assert!(v[0].abs() < 1e-6 && v[1].abs() < 1e-6);
    }
}
