//! The AVX2 kernel: weights and activations widened to 16 bits, tiles of
//! 6 rows × 16 columns, two products per lane and instruction
//! (`vpmaddwd`, exact where the byte product saturates).

use std::arch::x86_64::{__m256, __m256i};
use std::ops::Range;

use pulp::x86::V3;

use super::{Int8Matrix, Int8Rows, Panels, RowTile, finish, lanes};

/// Columns per AVX2 panel: two 8-lane registers.
const PANEL: usize = 16;

/// Each row's bytes as 16-bit pairs: `k` and `k + 1` in one `u32`, what
/// one lane of `vpmaddwd` takes.
pub(super) fn widen_rows(x: &Int8Rows) -> Vec<u32> {
    x.values
        .iter()
        .flat_map(|q| {
            let [b0, b1, b2, b3] = q.to_le_bytes().map(u32::from);
            [b0 | b1 << 16, b2 | b3 << 16]
        })
        .collect()
}

/// The weights as 16-column panels: per pair of `k`, two blocks of 8
/// columns × the pair's two 16-bit weights.
fn widen_weights(w: &Int8Matrix) -> Vec<[i16; 16]> {
    let pairs = w.quads * 2;
    let panels = w.panels * (super::PANEL / PANEL);
    let mut out = vec![[0i16; 16]; panels * pairs * 2];
    for p in 0..panels {
        for g in 0..pairs {
            for half in 0..2 {
                let block = &mut out[(p * pairs + g) * 2 + half];
                for lane in 0..8 {
                    for b in 0..2 {
                        block[lane * 2 + b] =
                            w.weight(g * 2 + b, p * PANEL + half * 8 + lane).into();
                    }
                }
            }
        }
    }
    out
}

/// The AVX2 kernel on a block of rows (`out` holds exactly them);
/// `pairs` is [`widen_rows`] of `x`.
pub(super) fn block(
    simd: V3,
    w: &Int8Matrix,
    x: &Int8Rows,
    pairs: &[u32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    let widened = w.widened.get_or_init(|| widen_weights(w));
    let tiles = widened
        .chunks_exact(w.quads * 4)
        .take(w.n.div_ceil(PANEL))
        .enumerate()
        .map(|(p, panel)| Tile {
            simd,
            w,
            x,
            pairs,
            panel,
            p,
        });
    simd.vectorize(Panels {
        tiles,
        rows,
        n: w.n,
        out,
    })
}

/// One panel of 16 columns against tiles of rows.
struct Tile<'a> {
    simd: V3,
    w: &'a Int8Matrix,
    x: &'a Int8Rows,
    pairs: &'a [u32],
    panel: &'a [[i16; 16]],
    p: usize,
}

impl RowTile for Tile<'_> {
    /// Rows `r0..r0 + R` × the panel's 16 columns, summed in 2·R
    /// registers.
    #[inline(always)]
    fn run<const R: usize>(&self, r0: usize, out: &mut [f32]) {
        let &Self {
            simd,
            w,
            x,
            pairs,
            panel,
            p,
        } = self;
        let width = w.quads * 2;
        let a: [&[u32]; R] = std::array::from_fn(|i| &pairs[(r0 + i) * width..][..width]);
        let zero = simd.avx._mm256_setzero_si256();
        let mut acc = [[zero; 2]; R];
        for (g, blocks) in panel.chunks_exact(2).enumerate() {
            let b: [__m256i; 2] = [pulp::cast(blocks[0]), pulp::cast(blocks[1])];
            for i in 0..R {
                let av = simd.avx._mm256_set1_epi32(a[i][g] as i32);
                for j in 0..2 {
                    let product = simd.avx2._mm256_madd_epi16(av, b[j]);
                    acc[i][j] = simd.avx2._mm256_add_epi32(acc[i][j], product);
                }
            }
        }
        for (i, row_acc) in acc.iter().enumerate() {
            let row = &mut out[i * w.n..(i + 1) * w.n];
            for (j, &sums) in row_acc.iter().enumerate() {
                store8(simd, w, x, r0 + i, p * PANEL + j * 8, sums, row);
            }
        }
    }
}

/// Row `r`'s outputs for the 8 columns from `c0` (clipped to `n`): the
/// same arithmetic as `finish`, 8 columns per instruction.
#[inline(always)]
// An inlined kernel step: its registers are its arguments.
#[allow(clippy::too_many_arguments)]
pub(super) fn store8(
    simd: V3,
    w: &Int8Matrix,
    x: &Int8Rows,
    r: usize,
    c0: usize,
    sums: __m256i,
    row: &mut [f32],
) {
    if c0 + 8 <= w.n {
        let col = c0..c0 + 8;
        let zero = simd.avx._mm256_set1_epi32(x.zero[r]);
        let scale = simd.avx._mm256_set1_ps(x.scale[r]);
        let w_sums: __m256i = pulp::cast(lanes::<_, 8>(&w.sums[col.clone()]));
        let w_scale: __m256 = pulp::cast(lanes::<_, 8>(&w.scale[col.clone()]));
        let bias: __m256 = pulp::cast(lanes::<_, 8>(&w.bias[col.clone()]));
        let exact = simd
            .avx2
            ._mm256_sub_epi32(sums, simd.avx2._mm256_mullo_epi32(zero, w_sums));
        let y = simd.avx._mm256_add_ps(
            simd.avx._mm256_mul_ps(
                simd.avx._mm256_cvtepi32_ps(exact),
                simd.avx._mm256_mul_ps(scale, w_scale),
            ),
            bias,
        );
        let y: [f32; 8] = pulp::cast(y);
        row[col].copy_from_slice(&y);
    } else if c0 < w.n {
        finish(w, x, r, c0, &pulp::cast::<_, [i32; 8]>(sums), row);
    }
}
