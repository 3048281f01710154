//! The AVX-512 VNNI kernel: tiles of 6 rows × 64 columns in 24 registers,
//! four byte products per lane and instruction.

use std::arch::x86_64::{__m512, __m512i};
use std::ops::Range;

use super::dot::Vnni512;

use super::{Int8Matrix, Int8Rows, PANEL, Panels, RowTile, finish, lanes};

/// The VNNI kernel on a block of rows (`out` holds exactly them).
pub(super) fn block(
    simd: Vnni512,
    w: &Int8Matrix,
    x: &Int8Rows,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let tiles = (0..w.panels).map(|p| Tile {
        simd,
        w,
        x,
        panel: w.panel(p),
        p,
    });
    simd.vectorize(Panels {
        tiles,
        rows,
        n: w.n,
        out,
    })
}

/// One panel of 64 columns against tiles of rows.
struct Tile<'a> {
    simd: Vnni512,
    w: &'a Int8Matrix,
    x: &'a Int8Rows,
    panel: &'a [[i8; 64]],
    p: usize,
}

impl RowTile for Tile<'_> {
    /// Rows `r0..r0 + R` × the panel's 64 columns, summed in 4·R
    /// registers.
    #[inline(always)]
    fn run<const R: usize>(&self, r0: usize, out: &mut [f32]) {
        let &Tile {
            simd,
            w,
            x,
            panel,
            p,
        } = self;
        let quads = w.quads;
        let a: [&[u32]; R] = std::array::from_fn(|i| &x.values[(r0 + i) * quads..][..quads]);
        let zero = simd.avx512f._mm512_setzero_si512();
        let mut acc = [[zero; 4]; R];
        for (g, blocks) in panel.chunks_exact(4).enumerate() {
            let b: [__m512i; 4] = [
                pulp::cast(blocks[0]),
                pulp::cast(blocks[1]),
                pulp::cast(blocks[2]),
                pulp::cast(blocks[3]),
            ];
            for i in 0..R {
                let av = simd.avx512f._mm512_set1_epi32(a[i][g] as i32);
                for j in 0..4 {
                    acc[i][j] = simd.dot_u8_i8(acc[i][j], av, b[j]);
                }
            }
        }
        let f = simd.avx512f;
        for (i, row_acc) in acc.iter().enumerate() {
            let row = &mut out[i * w.n..(i + 1) * w.n];
            let r = r0 + i;
            let zero = f._mm512_set1_epi32(x.zero[r]);
            let scale = f._mm512_set1_ps(x.scale[r]);
            for (j, &sums) in row_acc.iter().enumerate() {
                let c0 = p * PANEL + j * 16;
                if c0 + 16 <= w.n {
                    // The same arithmetic as `finish`, 16 columns at once.
                    let col = c0..c0 + 16;
                    let w_sums: __m512i = pulp::cast(lanes::<_, 16>(&w.sums[col.clone()]));
                    let w_scale: __m512 = pulp::cast(lanes::<_, 16>(&w.scale[col.clone()]));
                    let bias: __m512 = pulp::cast(lanes::<_, 16>(&w.bias[col.clone()]));
                    let exact = f._mm512_sub_epi32(sums, f._mm512_mullo_epi32(zero, w_sums));
                    let y = f._mm512_add_ps(
                        f._mm512_mul_ps(
                            f._mm512_cvtepi32_ps(exact),
                            f._mm512_mul_ps(scale, w_scale),
                        ),
                        bias,
                    );
                    let y: [f32; 16] = pulp::cast(y);
                    row[col].copy_from_slice(&y);
                } else if c0 < w.n {
                    finish(w, x, r, c0, &pulp::cast::<_, [i32; 16]>(sums), row);
                }
            }
        }
    }
}
