//! The int8 dot product of AVX-512 VNNI and AVX-VNNI (`vpdpbusd`) behind
//! safe tokens.
//!
//! The encoder's quantized matrix products need one instruction that
//! [`pulp`] does not wrap: four unsigned-by-signed byte products summed
//! into each 32-bit lane. Calling an intrinsic is `unsafe` in Rust unless
//! the caller proves the CPU has the feature. This module is the only one
//! of the crate allowed `unsafe`, so the proof and the call live here:
//!
//! - [`Vnni512`] (512-bit registers) and [`AvxVnni`] (256-bit, on CPUs
//!   with AVX2 and AVX-VNNI but no AVX-512) can only be made by their
//!   `try_new`, which checks the CPU at run time (or, for `Vnni512`, by
//!   `new_unchecked`, itself `unsafe`).
//! - `dot_u8_i8` takes the token by value, so holding one is the proof the
//!   instruction exists.
//! - Code run through a token's `vectorize` is compiled with its features
//!   enabled, so the instruction is inlined where it is used.
#![allow(unsafe_code)]

use std::arch::x86_64::{__m256i, __m512i, _mm256_dpbusd_avx_epi32, _mm512_dpbusd_epi32};

pulp::simd_type! {
    /// Proof that the CPU runs AVX-512 (F, BW, VL) with VNNI. Each field is
    /// pulp's token for one feature, whose methods are that feature's
    /// intrinsics (`simd.avx512f._mm512_set1_epi32(..)`).
    #[allow(missing_docs)]
    pub struct Vnni512 {
        pub sse: "sse",
        pub sse2: "sse2",
        pub fma: "fma",
        pub avx: "avx",
        pub avx2: "avx2",
        pub avx512f: "avx512f",
        pub avx512bw: "avx512bw",
        pub avx512vl: "avx512vl",
        pub avx512vnni: "avx512vnni",
    }
}

impl Vnni512 {
    /// `acc + Σ a·b` per 32-bit lane, over the lane's four bytes: `a`'s
    /// bytes unsigned, `b`'s signed, no saturation (`vpdpbusd`).
    #[inline(always)]
    pub fn dot_u8_i8(self, acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: a `Vnni512` exists only where `try_new` found AVX-512 F,
        // BW, VL and VNNI on this CPU, or where the caller of the `unsafe`
        // `new_unchecked` promised them; the intrinsic needs nothing else
        // (it reads and writes registers only).
        unsafe { _mm512_dpbusd_epi32(acc, a, b) }
    }
}

/// Proof that the CPU runs AVX2, FMA and AVX-VNNI (the 256-bit byte dot
/// product of CPUs without AVX-512).
#[derive(Debug, Clone, Copy)]
pub struct AvxVnni {
    v3: pulp::x86::V3,
}

impl AvxVnni {
    /// The token, where the CPU has the features.
    pub fn try_new() -> Option<Self> {
        if !std::arch::is_x86_feature_detected!("avxvnni") {
            return None;
        }
        pulp::x86::V3::try_new().map(|v3| Self { v3 })
    }

    /// pulp's AVX2 + FMA token, for the other instructions a kernel uses.
    pub fn v3(self) -> pulp::x86::V3 {
        self.v3
    }

    /// `acc + Σ a·b` per 32-bit lane, over the lane's four bytes: `a`'s
    /// bytes unsigned, `b`'s signed, no saturation (`vpdpbusd`, VEX form).
    #[inline(always)]
    pub fn dot_u8_i8(self, acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: an `AvxVnni` exists only where `try_new` found AVX-VNNI
        // (and AVX2) on this CPU; the intrinsic reads and writes registers
        // only.
        unsafe { _mm256_dpbusd_avx_epi32(acc, a, b) }
    }

    /// Runs `f` compiled with AVX, AVX2, FMA and AVX-VNNI enabled (`f`
    /// must be inlined into it: mark its `call` `#[inline(always)]`).
    #[inline(always)]
    pub fn vectorize<F: pulp::NullaryFnOnce>(self, f: F) -> F::Output {
        #[target_feature(enable = "avx,avx2,fma,avxvnni")]
        #[inline]
        unsafe fn imp<F: pulp::NullaryFnOnce>(f: F) -> F::Output {
            f.call()
        }
        // SAFETY: the token proves every feature `imp` is compiled with.
        unsafe { imp(f) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_sums_four_byte_products_per_lane() {
        let Some(simd) = Vnni512::try_new() else {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to check");
            return;
        };
        let a: [u8; 64] = std::array::from_fn(|i| (i * 4 + 3) as u8);
        let b: [i8; 64] = std::array::from_fn(|i| (i as i8).wrapping_mul(7).wrapping_sub(100));
        let acc: [i32; 16] = std::array::from_fn(|i| i as i32 * 1000 - 7000);
        let got: [i32; 16] = simd.vectorize(
            #[inline(always)]
            || pulp::cast(simd.dot_u8_i8(pulp::cast(acc), pulp::cast(a), pulp::cast(b))),
        );
        for lane in 0..16 {
            let want = acc[lane]
                + (0..4)
                    .map(|k| a[lane * 4 + k] as i32 * b[lane * 4 + k] as i32)
                    .sum::<i32>();
            assert_eq!(got[lane], want, "lane {lane}");
        }
    }

    #[test]
    fn the_256_bit_dot_sums_four_byte_products_per_lane() {
        let Some(simd) = AvxVnni::try_new() else {
            eprintln!("no AVX-VNNI on this CPU: nothing to check");
            return;
        };
        let a: [u8; 32] = std::array::from_fn(|i| (i * 8 + 5) as u8);
        let b: [i8; 32] = std::array::from_fn(|i| (i as i8).wrapping_mul(9).wrapping_sub(60));
        let acc: [i32; 8] = std::array::from_fn(|i| 300 - i as i32 * 77);
        struct Dot([i32; 8], [u8; 32], [i8; 32], AvxVnni);
        impl pulp::NullaryFnOnce for Dot {
            type Output = [i32; 8];
            #[inline(always)]
            fn call(self) -> [i32; 8] {
                let Dot(acc, a, b, simd) = self;
                pulp::cast(simd.dot_u8_i8(pulp::cast(acc), pulp::cast(a), pulp::cast(b)))
            }
        }
        let got = simd.vectorize(Dot(acc, a, b, simd));
        for lane in 0..8 {
            let want = acc[lane]
                + (0..4)
                    .map(|k| a[lane * 4 + k] as i32 * b[lane * 4 + k] as i32)
                    .sum::<i32>();
            assert_eq!(got[lane], want, "lane {lane}");
        }
    }
}
