//! The AVX-VNNI kernel, for CPUs with AVX-VNNI and no AVX-512: the VNNI
//! kernel's weight layout read 16 columns at a time, at 256 bits.

use std::arch::x86_64::__m256i;
use std::ops::Range;

use super::dot::AvxVnni;

use super::{Int8Matrix, Int8Rows, PANEL, Panels, RowTile, avx2::store8};

/// The AVX-VNNI kernel on a block of rows (`out` holds exactly them):
/// the VNNI kernel's weight layout read 16 columns (one 64-byte block,
/// two registers) at a time.
pub(super) fn block(
    simd: AvxVnni,
    w: &Int8Matrix,
    x: &Int8Rows,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let tiles = (0..w.n.div_ceil(16)).map(|sixteen| Tile {
        simd,
        w,
        x,
        p: sixteen / (PANEL / 16),
        group: sixteen % (PANEL / 16),
    });
    simd.vectorize(Panels {
        tiles,
        rows,
        n: w.n,
        out,
    })
}

/// Sixteen columns (group `group` of panel `p`) against tiles of rows.
struct Tile<'a> {
    simd: AvxVnni,
    w: &'a Int8Matrix,
    x: &'a Int8Rows,
    p: usize,
    group: usize,
}

impl RowTile for Tile<'_> {
    /// Rows `r0..r0 + R` × the group's 16 columns, summed in 2·R
    /// registers.
    #[inline(always)]
    fn run<const R: usize>(&self, r0: usize, out: &mut [f32]) {
        let &Tile {
            simd,
            w,
            x,
            p,
            group,
        } = self;
        let v3 = simd.v3();
        let quads = w.quads;
        let a: [&[u32]; R] = std::array::from_fn(|i| &x.values[(r0 + i) * quads..][..quads]);
        let zero = v3.avx._mm256_setzero_si256();
        let mut acc = [[zero; 2]; R];
        let panel = w.panel(p);
        for (g, blocks) in panel.chunks_exact(4).enumerate() {
            let b: [__m256i; 2] = pulp::cast(blocks[group]);
            for i in 0..R {
                let av = v3.avx._mm256_set1_epi32(a[i][g] as i32);
                for j in 0..2 {
                    acc[i][j] = simd.dot_u8_i8(acc[i][j], av, b[j]);
                }
            }
        }
        for (i, row_acc) in acc.iter().enumerate() {
            let row = &mut out[i * w.n..(i + 1) * w.n];
            for (j, &sums) in row_acc.iter().enumerate() {
                store8(v3, w, x, r0 + i, p * PANEL + group * 16 + j * 8, sums, row);
            }
        }
    }
}
