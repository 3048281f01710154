//! Every kernel against the reference integers, and the quantized
//! product against the float one.

use super::*;

fn values(n: usize, seed: u64, spread: f32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
        })
        .collect()
}

/// The integer sums the kernels must produce, from the quantized
/// values directly.
fn reference(w: &Int8Matrix, x: &Int8Rows) -> Vec<f32> {
    let width = w.panels * PANEL;
    let mut out = vec![0.0f32; x.rows * w.n];
    for r in 0..x.rows {
        let bytes: Vec<u8> = x.values[r * x.quads..(r + 1) * x.quads]
            .iter()
            .flat_map(|q| q.to_le_bytes())
            .collect();
        for c in 0..w.n {
            let mut sum = 0i32;
            for (kk, &a) in bytes.iter().enumerate() {
                sum += a as i32 * w.weight(kk, c) as i32;
            }
            let mut sums = [0i32; 16];
            sums[c % 16] = sum;
            let mut row = vec![0.0f32; w.n];
            finish(w, x, r, c - c % 16, &sums, &mut row);
            out[r * w.n + c] = row[c];
        }
    }
    assert!(width >= w.n);
    out
}

fn float_product(x: &[f32], wt: &[f32], bias: &[f32], k: usize, n: usize) -> Vec<f32> {
    let rows = x.len() / k;
    let mut out = bias.repeat(rows);
    for r in 0..rows {
        for kk in 0..k {
            for c in 0..n {
                out[r * n + c] += x[r * k + kk] * wt[kk * n + c];
            }
        }
    }
    out
}

/// Shapes that fill whole tiles and panels and ones that do not (rows
/// not a multiple of 6 or 48, columns not of 16 or 64, `k` not of 4):
/// every kernel gives the reference's integers, bit for bit.
#[test]
fn every_kernel_computes_the_reference_integers() {
    for (rows, k, n) in [
        (1, 4, 16),
        (7, 13, 70),
        (53, 384, 128),
        (100, 36, 200),
        (6, 8, 64),
    ] {
        let wt = values(k * n, 7 + k as u64, 0.2);
        let bias = values(n, 11, 0.5);
        let x = values(rows * k, 3 + rows as u64, 4.0);
        let w = Int8Matrix::quantize(&wt, &bias, k, n);
        let mut q = Int8Rows::default();
        q.quantize_from(&x, k, None);
        let want = reference(&w, &q);
        for kernel in Kernel::available() {
            let mut got = vec![f32::NAN; rows * n];
            matmul_with(kernel, &w, &q, &mut got);
            assert_eq!(got, want, "{kernel:?} on {rows}×{k}×{n}");
        }
    }
}

/// Quantized products stay close to the float product, and a row's
/// outlier coarsens that row only (one scale per row).
#[test]
fn quantized_product_is_close_to_the_float_product() {
    let (rows, k, n) = (20, 384, 96);
    let wt = values(k * n, 5, 0.2);
    let bias = values(n, 9, 0.5);
    let mut x = values(rows * k, 13, 4.0);
    for r in (0..rows).step_by(2) {
        x[r * k + (r * 37) % k] = 40.0;
    }
    let w = Int8Matrix::quantize(&wt, &bias, k, n);
    let mut q = Int8Rows::default();
    q.quantize_from(&x, k, None);
    let mut got = vec![0.0f32; rows * n];
    matmul(&w, &q, &mut got);
    let want = float_product(&x, &wt, &bias, k, n);
    let error = |r: usize| {
        let (g, w) = (&got[r * n..(r + 1) * n], &want[r * n..(r + 1) * n]);
        let err: f32 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
        (err / w.iter().map(|b| b * b).sum::<f32>()).sqrt()
    };
    for r in 0..rows {
        let bar = if r % 2 == 0 { 0.05 } else { 0.01 };
        assert!(error(r) < bar, "row {r}: relative error {}", error(r));
    }
    assert_eq!(w.outputs(), n);
}

#[test]
fn zero_rows_quantize_to_zero_and_give_the_bias() {
    let (k, n) = (8, 16);
    let w = Int8Matrix::quantize(&values(k * n, 1, 1.0), &vec![0.25; n], k, n);
    let mut q = Int8Rows::default();
    q.quantize_from(&[0.0; 16], k, None);
    for kernel in Kernel::available() {
        let mut out = vec![0.0f32; 2 * n];
        matmul_with(kernel, &w, &q, &mut out);
        assert!(out.iter().all(|&v| v == 0.25), "{kernel:?}: {out:?}");
    }
}

/// `FLOTILLA_CPU_LEVEL`'s cap picks the kernel a CPU of that level runs:
/// the AVX2 kernel under `avx2` on a CPU with VNNI, the portable loop
/// under `portable`; no cap, the fastest.
#[test]
fn a_cpu_level_cap_picks_that_levels_kernel() {
    use crate::cpu_level::CpuLevel;
    assert_eq!(
        Kernel::detect_under(None),
        *Kernel::available().last().unwrap()
    );
    assert_eq!(
        Kernel::detect_under(Some(CpuLevel::Portable)),
        Kernel::Portable
    );
    if Kernel::Avx2.runs_here() {
        assert_eq!(Kernel::detect_under(Some(CpuLevel::Avx2)), Kernel::Avx2);
        assert_eq!(Kernel::detect_under(Some(CpuLevel::Avx512)), Kernel::Avx2);
    }
    for cap in [
        CpuLevel::Portable,
        CpuLevel::Avx2,
        CpuLevel::Avx512,
        CpuLevel::Vnni,
    ] {
        assert!(Kernel::detect_under(Some(cap)).level() <= cap);
    }
}
