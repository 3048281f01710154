//! Int8 matrix products for the quantized encoder (`--precision int8`).
//!
//! Weights are quantized once at load, symmetric per output column
//! ([`Int8Matrix`]); activations per row just before each product, over the
//! row's own range with a zero point ([`Int8Rows`]), so one outlier token
//! cannot coarsen the others and a one-sided row (GELU's output) gets all
//! 256 steps. The product sums in 32-bit integers, exactly, then each
//! output is scaled back to `f32` and gets its bias:
//!
//! ```text
//! x [rows, k] f32 ─► q = round(x / sₓ) + z, sₓ = (max − min) / 255 over the row, u8
//! W [k, n]    f32 ─► w = round(W / s_w), s_w = max|W_col| / 127, i8, packed at load
//! y[r, c] = (Σ q·w − z·Σ w) · sₓ[r] · s_w[c] + b[c]
//! ```
//!
//! Four kernels compute the same integers, so a text gets the same vector
//! on every CPU: with AVX-512 VNNI, tiles of 6 rows × 64 columns in 24
//! registers, four byte products per lane and instruction
//! ([`dot::Vnni512`]); with AVX-VNNI and no AVX-512, the same
//! at 256 bits on 6 rows × 16 columns ([`dot::AvxVnni`]);
//! with AVX2 alone, tiles of 6 rows × 16 columns
//! on weights and activations widened to 16 bits, two products per lane
//! and instruction (`vpmaddwd`: exact, where AVX2's byte product saturates);
//! elsewhere a portable loop compiled for the widest vector unit the CPU
//! has through [`pulp`]. Blocks of rows run in parallel on the caller's
//! rayon pool.
//!
//! Weight layout: 64-column panels; within a panel, for each group of four
//! `k`, four 64-byte blocks of 16 columns × 4 bytes (a column's four
//! weights side by side, as `vpdpbusd` takes them).

use rayon::prelude::*;

use crate::cpu_level::CpuLevel;

/// Columns per panel: four 16-lane registers.
const PANEL: usize = 64;
/// Rows per register tile of the VNNI kernel.
const TILE_ROWS: usize = 6;
/// Rows per parallel task: a multiple of [`TILE_ROWS`].
const BLOCK_ROWS: usize = 48;

/// A weight matrix `[k, n]` quantized to int8 per output column, packed for
/// the kernels.
#[derive(Debug, Clone)]
pub struct Int8Matrix {
    n: usize,
    /// `k` rounded up to a multiple of 4, divided by 4.
    quads: usize,
    panels: usize,
    /// `panels × quads × 4` blocks of 16 columns × 4 bytes.
    packed: Vec<[i8; 64]>,
    /// Per column (padded to `panels × 64`): the weights' scale.
    scale: Vec<f32>,
    /// Per column: `Σ w`, what a row's zero point multiplies.
    sums: Vec<i32>,
    /// Per column: the bias.
    bias: Vec<f32>,
    /// The weights widened to 16 bits for the AVX2 kernel, made on its
    /// first use.
    widened: std::sync::OnceLock<Vec<[i16; 16]>>,
}

impl Int8Matrix {
    /// Quantizes `weight`, row-major `[k, n]` (`x · W` layout), and keeps
    /// `bias` (`n` values) beside it.
    pub fn quantize(weight: &[f32], bias: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(weight.len(), k * n, "weight shape");
        assert_eq!(bias.len(), n, "bias shape");
        let quads = k.div_ceil(4);
        let panels = n.div_ceil(PANEL);
        let width = panels * PANEL;
        let mut scale = vec![0.0f32; width];
        let mut q = vec![0i8; quads * 4 * width];
        for c in 0..n {
            let amax = (0..k)
                .map(|r| weight[r * n + c].abs())
                .fold(0.0f32, f32::max);
            let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
            scale[c] = s;
            for r in 0..k {
                q[r * width + c] = (weight[r * n + c] / s).round().clamp(-127.0, 127.0) as i8;
            }
        }
        let mut sums = vec![0i32; width];
        for (c, sum) in sums.iter_mut().enumerate() {
            *sum = (0..k).map(|r| q[r * width + c] as i32).sum::<i32>();
        }
        let mut packed = vec![[0i8; 64]; panels * quads * 4];
        for p in 0..panels {
            for g in 0..quads {
                for block in 0..4 {
                    let dst = &mut packed[(p * quads + g) * 4 + block];
                    for lane in 0..16 {
                        let c = p * PANEL + block * 16 + lane;
                        for b in 0..4 {
                            dst[lane * 4 + b] = q[(g * 4 + b) * width + c];
                        }
                    }
                }
            }
        }
        let mut padded_bias = vec![0.0f32; width];
        padded_bias[..n].copy_from_slice(bias);
        Self {
            n,
            quads,
            panels,
            packed,
            scale,
            sums,
            bias: padded_bias,
            widened: std::sync::OnceLock::new(),
        }
    }

    /// The quantized weight of input `k`, column `c`.
    fn weight(&self, k: usize, c: usize) -> i8 {
        let (p, rest) = (c / PANEL, c % PANEL);
        self.packed[(p * self.quads + k / 4) * 4 + rest / 16][(rest % 16) * 4 + k % 4]
    }

    /// Columns of the output.
    pub fn outputs(&self) -> usize {
        self.n
    }

    fn panel(&self, p: usize) -> &[[i8; 64]] {
        &self.packed[p * self.quads * 4..(p + 1) * self.quads * 4]
    }
}

/// Rows of activations quantized to unsigned bytes, four to a `u32`, with
/// a scale and a zero point per row.
#[derive(Debug, Clone, Default)]
pub struct Int8Rows {
    rows: usize,
    quads: usize,
    values: Vec<u32>,
    scale: Vec<f32>,
    zero: Vec<i32>,
}

impl Int8Rows {
    /// Quantizes `x`, row-major `[rows, k]`, reusing this buffer; with
    /// `factors` (`k` values), each column is multiplied by its factor
    /// first.
    pub fn quantize_from(&mut self, x: &[f32], k: usize, factors: Option<&[f32]>) {
        assert!(k > 0 && x.len().is_multiple_of(k), "rows of {k} values");
        let rows = x.len() / k;
        self.rows = rows;
        self.quads = k.div_ceil(4);
        self.values.clear();
        // What the rounding-up of `k` pads with meets zero weights.
        self.values.resize(rows * self.quads, 0);
        self.scale.clear();
        self.scale.resize(rows, 0.0);
        self.zero.clear();
        self.zero.resize(rows, 0);
        let arch = crate::cpu_level::arch();
        let quads = self.quads;
        let bytes: &mut [u8] = pulp::bytemuck::cast_slice_mut(&mut self.values);
        for (((row, out), scale), zero) in x
            .chunks_exact(k)
            .zip(bytes.chunks_exact_mut(quads * 4))
            .zip(self.scale.iter_mut())
            .zip(self.zero.iter_mut())
        {
            (*scale, *zero) = arch.dispatch(QuantizeRow { row, factors, out });
        }
    }
}

/// One row to quantize: the unit of run-time dispatch.
struct QuantizeRow<'a> {
    row: &'a [f32],
    factors: Option<&'a [f32]>,
    out: &'a mut [u8],
}

impl pulp::WithSimd for QuantizeRow<'_> {
    type Output = (f32, i32);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> (f32, i32) {
        match self.factors {
            None => quantize_row(self.row.iter().copied(), self.out),
            Some(f) => {
                assert_eq!(f.len(), self.row.len(), "a factor per column");
                quantize_row(self.row.iter().zip(f).map(|(v, f)| v * f), self.out)
            }
        }
    }
}

/// Quantizes one row's values into `out` and returns the row's scale and
/// zero point.
#[inline(always)]
fn quantize_row(row: impl Iterator<Item = f32> + Clone, out: &mut [u8]) -> (f32, i32) {
    // The range always holds zero, so zero is a step exactly.
    let (lo, hi) = row
        .clone()
        .fold((0.0f32, 0.0f32), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let range = hi - lo;
    if range.is_nan() || range <= 0.0 {
        // All zeros (or not a number): every byte stays zero.
        return (1.0, 0);
    }
    let inv = 255.0 / range;
    let zero = (-lo * inv).round_ties_even();
    // round(v) lands in the low bits of v + 1.5·2²³ (0 ≤ v ≤ 255 here):
    // integer bits vectorise, a float-to-integer cast saturates and does
    // not.
    const SHIFT: f32 = 12_582_912.0;
    for (o, v) in out.iter_mut().zip(row) {
        let t = (v * inv + zero).clamp(0.0, 255.0);
        *o = (t + SHIFT).to_bits() as u8;
    }
    (range / 255.0, zero as i32)
}

/// Which kernel computes the integer products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 VNNI register tiles.
    Vnni,
    /// AVX-VNNI (256-bit) register tiles, on CPUs without AVX-512.
    AvxVnni,
    /// AVX2 register tiles on 16-bit values.
    Avx2,
    /// The portable loop, vectorised by the compiler.
    Portable,
}

impl Kernel {
    /// Every kernel, the fastest first.
    const ALL: [Kernel; 4] = [
        Kernel::Vnni,
        Kernel::AvxVnni,
        Kernel::Avx2,
        Kernel::Portable,
    ];

    /// Whether this CPU has the kernel's instructions.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return match self {
            Kernel::Vnni => dot::Vnni512::try_new().is_some(),
            Kernel::AvxVnni => dot::AvxVnni::try_new().is_some(),
            Kernel::Avx2 => pulp::x86::V3::try_new().is_some(),
            Kernel::Portable => true,
        };
        #[cfg(not(target_arch = "x86_64"))]
        return self == Kernel::Portable;
    }

    /// The instruction-set level the kernel needs.
    pub fn level(self) -> CpuLevel {
        match self {
            Kernel::Vnni | Kernel::AvxVnni => CpuLevel::Vnni,
            Kernel::Avx2 => CpuLevel::Avx2,
            Kernel::Portable => CpuLevel::Portable,
        }
    }

    /// The fastest kernel this CPU runs, under the level
    /// `FLOTILLA_CPU_LEVEL` caps it to ([`crate::cpu_level`]).
    pub fn detect() -> Self {
        Self::detect_under(CpuLevel::cap())
    }

    /// The fastest kernel this CPU runs at or below `cap`.
    pub fn detect_under(cap: Option<CpuLevel>) -> Self {
        Self::ALL
            .into_iter()
            .find(|k| k.runs_here() && cap.is_none_or(|c| k.level() <= c))
            .unwrap_or(Kernel::Portable)
    }

    /// Every kernel this CPU runs, the portable one first.
    pub fn available() -> Vec<Kernel> {
        Self::ALL
            .into_iter()
            .rev()
            .filter(|k| k.runs_here())
            .collect()
    }
}

/// `out = x · W + b`, row-major `[rows, n]`, with the fastest kernel.
///
/// # Panics
///
/// When `x`'s rows are not as wide as `w`'s inputs or `out` is not `rows ×
/// outputs` long.
pub fn matmul(w: &Int8Matrix, x: &Int8Rows, out: &mut [f32]) {
    matmul_with(Kernel::detect(), w, x, out)
}

/// [`matmul`] with the kernel chosen by the caller (one of
/// [`Kernel::available`]; tests and benches compare them).
///
/// # Panics
///
/// When `x`'s rows are not as wide as `w`'s inputs, `out` is not `rows ×
/// outputs` long, or the CPU lacks the kernel's instructions.
pub fn matmul_with(kernel: Kernel, w: &Int8Matrix, x: &Int8Rows, out: &mut [f32]) {
    assert_eq!(x.quads, w.quads, "input width");
    assert_eq!(out.len(), x.rows * w.n, "output shape");
    if out.is_empty() {
        return;
    }
    let n = w.n;
    #[cfg(target_arch = "x86_64")]
    let pairs = match kernel {
        Kernel::Avx2 => avx2::widen_rows(x),
        _ => Vec::new(),
    };
    out.par_chunks_mut(BLOCK_ROWS * n)
        .enumerate()
        .for_each(|(i, block)| {
            let rows = i * BLOCK_ROWS..i * BLOCK_ROWS + block.len() / n;
            match kernel {
                #[cfg(target_arch = "x86_64")]
                Kernel::Vnni => match dot::Vnni512::try_new() {
                    Some(simd) => vnni::block(simd, w, x, rows, block),
                    None => panic!("the VNNI kernel was chosen on a CPU without AVX-512 VNNI"),
                },
                #[cfg(target_arch = "x86_64")]
                Kernel::AvxVnni => match dot::AvxVnni::try_new() {
                    Some(simd) => avx_vnni::block(simd, w, x, rows, block),
                    None => panic!("the AVX-VNNI kernel was chosen on a CPU without AVX-VNNI"),
                },
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 => match pulp::x86::V3::try_new() {
                    Some(simd) => avx2::block(simd, w, x, &pairs, rows, block),
                    None => panic!("the AVX2 kernel was chosen on a CPU without AVX2"),
                },
                #[cfg(not(target_arch = "x86_64"))]
                Kernel::Vnni | Kernel::AvxVnni | Kernel::Avx2 => {
                    panic!("an x86 kernel was chosen on another architecture")
                }
                Kernel::Portable => crate::cpu_level::arch().dispatch(PortableBlock {
                    w,
                    x,
                    rows,
                    out: block,
                }),
            }
        });
}

/// Writes one row's outputs for columns `c0..c0 + sums.len()` (clipped to
/// `n`): integer sums scaled back to `f32` plus the bias.
#[inline(always)]
fn finish(w: &Int8Matrix, x: &Int8Rows, r: usize, c0: usize, sums: &[i32], out: &mut [f32]) {
    let end = (c0 + sums.len()).min(w.n);
    let (scale, zero) = (x.scale[r], x.zero[r]);
    for (c, o) in (c0..end).zip(out[c0..end].iter_mut()) {
        *o = (sums[c - c0] - zero * w.sums[c]) as f32 * (scale * w.scale[c]) + w.bias[c];
    }
}

/// One panel of columns against tiles of up to [`TILE_ROWS`] rows: what
/// each register-tiled kernel provides.
trait RowTile {
    /// Rows `r0..r0 + R` of the panel's columns; `out` starts at row `r0`
    /// (rows of `n` values).
    fn run<const R: usize>(&self, r0: usize, out: &mut [f32]);
}

/// Runs `tile` over `rows` in tiles of [`TILE_ROWS`] (the last one
/// shorter); `out` holds exactly those rows of `n` values.
#[inline(always)]
fn each_tile(tile: &impl RowTile, rows: std::ops::Range<usize>, n: usize, out: &mut [f32]) {
    let mut r = rows.start;
    while r < rows.end {
        let o = &mut out[(r - rows.start) * n..];
        match (rows.end - r).min(TILE_ROWS) {
            6 => tile.run::<6>(r, o),
            5 => tile.run::<5>(r, o),
            4 => tile.run::<4>(r, o),
            3 => tile.run::<3>(r, o),
            2 => tile.run::<2>(r, o),
            _ => tile.run::<1>(r, o),
        }
        r += TILE_ROWS;
    }
}

/// A kernel's tiles, one per panel of columns, run over a block of rows:
/// what a kernel runs with its instruction set enabled. (A struct rather
/// than a closure: a closure's `call_once` shim is not inlined into the
/// feature-enabled frame, and the intrinsics then run as calls.)
struct Panels<'a, I> {
    tiles: I,
    rows: std::ops::Range<usize>,
    n: usize,
    out: &'a mut [f32],
}

impl<I: Iterator<Item: RowTile>> pulp::NullaryFnOnce for Panels<'_, I> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        for tile in self.tiles {
            each_tile(&tile, self.rows.clone(), self.n, self.out);
        }
    }
}

/// `N` consecutive values of a per-column vector, for one register.
#[inline(always)]
fn lanes<T: Copy, const N: usize>(v: &[T]) -> [T; N] {
    v.try_into().expect("a register's worth of columns")
}

/// The portable kernel on a block of rows: the unit of run-time dispatch.
struct PortableBlock<'a> {
    w: &'a Int8Matrix,
    x: &'a Int8Rows,
    rows: std::ops::Range<usize>,
    out: &'a mut [f32],
}

impl pulp::WithSimd for PortableBlock<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let Self { w, x, rows, out } = self;
        let quads = w.quads;
        for (r, out_row) in rows.zip(out.chunks_exact_mut(w.n)) {
            let a = &x.values[r * quads..(r + 1) * quads];
            for p in 0..w.panels {
                let panel = w.panel(p);
                let mut sums = [[0i32; 16]; 4];
                for (&quad, blocks) in a.iter().zip(panel.chunks_exact(4)) {
                    let q = quad.to_le_bytes().map(i32::from);
                    for (sum, block) in sums.iter_mut().zip(blocks) {
                        for (s, wq) in sum.iter_mut().zip(block.chunks_exact(4)) {
                            *s += q[0] * wq[0] as i32
                                + q[1] * wq[1] as i32
                                + q[2] * wq[2] as i32
                                + q[3] * wq[3] as i32;
                        }
                    }
                }
                for (b, sum) in sums.iter().enumerate() {
                    let c0 = p * PANEL + b * 16;
                    if c0 < w.n {
                        finish(w, x, r, c0, sum, out_row);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod dot;

#[cfg(target_arch = "x86_64")]
mod vnni;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx_vnni;

#[cfg(test)]
mod tests;
