//! Multi-head self-attention for the CPU backend, on the fused QKV
//! projection as it leaves the matrix product: no per-head copies of Q, K
//! and V as tensors, no `[b, heads, s, s]` mask, padded keys skipped rather
//! than masked.
//!
//! ```text
//! qkv [b, s, 3h] ─► per text, per head: Kᵀ and V of its real tokens (gathered once)
//!                 ─► per query: scores = q·Kᵀ/√d ─► softmax (max-shifted) ─► Σ p·V
//!                 ─► ctx [b, s, h]
//! ```
//!
//! The loops are plain slices, written so the compiler vectorises them, and
//! compiled for the widest vector unit the CPU has (AVX-512, AVX2 + FMA, or
//! the baseline) through [`pulp`]'s run-time dispatch. Texts run in parallel
//! on the caller's rayon pool.

use rayon::prelude::*;

use crate::encoder::fast_gelu::exp_neg;

/// The shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Texts in the batch.
    pub batch: usize,
    /// Padded sequence length.
    pub seq: usize,
    /// Hidden width (`heads × head_dim`).
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
}

/// Computes the attention context of every token: `qkv` is `[batch, seq,
/// 3·hidden]` row-major (query, key, value of each token side by side),
/// `mask` is `[batch, seq]` with 1 for real tokens. Returns `[batch, seq,
/// hidden]`. Each query attends to the real tokens of its own text only.
/// `bias`, `[heads, seq, seq]`, is added to the scaled scores of every
/// text (MPNet's relative position bias).
pub(crate) fn self_attention(
    qkv: &[f32],
    mask: &[i64],
    shape: Shape,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let Shape {
        batch,
        seq,
        hidden,
        heads,
    } = shape;
    assert_eq!(qkv.len(), batch * seq * 3 * hidden, "qkv shape");
    assert_eq!(mask.len(), batch * seq, "mask shape");
    assert!(heads > 0 && hidden % heads == 0, "heads divide the width");
    if let Some(bias) = bias {
        assert_eq!(bias.len(), heads * seq * seq, "bias shape");
    }
    let mut out = vec![0.0f32; batch * seq * hidden];
    if out.is_empty() {
        return out;
    }
    let arch = crate::cpu_level::arch();
    each_text(qkv, mask, shape, bias, &mut out, |t| arch.dispatch(t));
    out
}

/// Runs `run` on every text of the batch, in parallel, writing `out`.
fn each_text(
    qkv: &[f32],
    mask: &[i64],
    shape: Shape,
    bias: Option<&[f32]>,
    out: &mut [f32],
    run: impl Fn(Text<'_>) + Sync,
) {
    let Shape {
        seq, hidden, heads, ..
    } = shape;
    out.par_chunks_mut(seq * hidden)
        .zip(qkv.par_chunks(seq * 3 * hidden))
        .zip(mask.par_chunks(seq))
        .for_each(|((out, qkv), mask)| {
            run(Text {
                qkv,
                mask,
                bias,
                out,
                seq,
                hidden,
                heads,
            })
        });
}

/// One text's attention, all heads: the unit of run-time dispatch.
struct Text<'a> {
    qkv: &'a [f32],
    mask: &'a [i64],
    bias: Option<&'a [f32]>,
    out: &'a mut [f32],
    seq: usize,
    hidden: usize,
    heads: usize,
}

impl pulp::WithSimd for Text<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        text_attention(self);
    }
}

/// Keys scored together: four vector registers of accumulators on
/// AVX-512, eight on AVX2, independent chains of fused multiply-adds.
const KEYS: usize = 64;

/// Lanes of the partial sums in reductions.
const LANES: usize = 16;

#[inline(always)]
fn text_attention(t: Text<'_>) {
    let Text {
        qkv,
        mask,
        bias,
        out,
        seq,
        hidden,
        heads,
    } = t;
    let dim = hidden / heads;
    let scale = 1.0 / (dim as f32).sqrt();
    let keys: Vec<usize> = (0..seq).filter(|&j| mask[j] != 0).collect();
    let n = keys.len();
    if n == 0 {
        // A text with no real token has no context (never produced by the
        // tokenizer, which adds [CLS] and [SEP]).
        return;
    }
    // Kᵀ as [dim, stride] with the keys padded to a multiple of 16 (the
    // scores of a query are then `dim` multiply-adds over rows of keys) and
    // V as [n, dim], for one head at a time.
    let stride = n.div_ceil(16) * 16;
    let row = 3 * hidden;
    let mut kt = vec![0.0f32; dim * stride];
    let mut v = vec![0.0f32; n * dim];
    let mut scores = vec![0.0f32; stride];
    for head in 0..heads {
        let (q_at, k_at, v_at) = (head * dim, hidden + head * dim, 2 * hidden + head * dim);
        for (jj, &j) in keys.iter().enumerate() {
            let token = &qkv[j * row..(j + 1) * row];
            for (d, &x) in token[k_at..k_at + dim].iter().enumerate() {
                kt[d * stride + jj] = x;
            }
            v[jj * dim..(jj + 1) * dim].copy_from_slice(&token[v_at..v_at + dim]);
        }
        for i in 0..seq {
            let q = &qkv[i * row + q_at..i * row + q_at + dim];
            let mut start = 0;
            while start < stride {
                let block = &mut scores[start..];
                match stride - start {
                    16 => score_block::<16>(q, &kt, stride, start, scale, block),
                    32 => score_block::<32>(q, &kt, stride, start, scale, block),
                    48 => score_block::<48>(q, &kt, stride, start, scale, block),
                    _ => score_block::<KEYS>(q, &kt, stride, start, scale, block),
                }
                start += KEYS;
            }
            if let Some(bias) = bias {
                let row = &bias[(head * seq + i) * seq..(head * seq + i + 1) * seq];
                for (score, &j) in scores.iter_mut().zip(&keys) {
                    *score += row[j];
                }
            }
            // Padded keys' scores are -inf, so the softmax runs on whole
            // registers: their weights come out below 1e-37, and the
            // weighted sum reads only the first `n`.
            scores[n..].fill(f32::NEG_INFINITY);
            let inv = softmax(&mut scores);
            let ctx = &mut out[i * hidden + head * dim..i * hidden + (head + 1) * dim];
            match dim {
                32 => weighted_sum::<32>(&scores[..n], &v, ctx),
                64 => weighted_sum::<64>(&scores[..n], &v, ctx),
                _ => weighted_sum_any(&scores[..n], &v, ctx),
            }
            ctx.iter_mut().for_each(|c| *c *= inv);
        }
    }
}

/// Scores of keys `start..start + W` for query `q`: `W` accumulators kept
/// in registers across the `dim` rows of Kᵀ.
#[inline(always)]
fn score_block<const W: usize>(
    q: &[f32],
    kt: &[f32],
    stride: usize,
    start: usize,
    scale: f32,
    out: &mut [f32],
) {
    let mut acc = [0.0f32; W];
    for (d, &qd) in q.iter().enumerate() {
        let keys: &[f32; W] = kt[d * stride + start..d * stride + start + W]
            .try_into()
            .expect("a block of keys");
        for (a, k) in acc.iter_mut().zip(keys) {
            *a = qd.mul_add(*k, *a);
        }
    }
    for (o, a) in out[..W].iter_mut().zip(acc) {
        *o = a * scale;
    }
}

/// Softmax in place up to its normalisation: each score becomes
/// `e^(s − max)`, and the function returns `1 / Σ`, which the caller
/// applies to the weighted sum (a head's few values) rather than to every
/// weight. The loops vectorise, and the reductions keep one partial result
/// per lane, folded pairwise at the end.
#[inline(always)]
fn softmax(scores: &mut [f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = scores.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    let max = chunks.remainder().iter().fold(
        fold_lanes(lanes, |a, b| if a > b { a } else { b }),
        |m, &x| {
            if x > m { x } else { m }
        },
    );
    let mut sums = [0.0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (t, x) in sums.iter_mut().zip(chunk) {
            *x = exp_neg(*x - max);
            *t += *x;
        }
    }
    let mut rest = 0.0f32;
    for x in chunks.into_remainder() {
        *x = exp_neg(*x - max);
        rest += *x;
    }
    1.0 / (fold_lanes(sums, |a, b| a + b) + rest)
}

/// The lanes combined pairwise, halving the width each step (a few vector
/// operations, where folding one lane after another waits on each).
#[inline(always)]
fn fold_lanes(mut v: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            v[i] = f(v[i], v[i + width]);
        }
        width /= 2;
    }
    v[0]
}

/// `ctx = Σ p[j] · v[j]` with the context in registers: two accumulators
/// (even and odd keys) so that consecutive multiply-adds do not wait on
/// each other.
#[inline(always)]
fn weighted_sum<const D: usize>(p: &[f32], v: &[f32], ctx: &mut [f32]) {
    let mut even = [0.0f32; D];
    let mut odd = [0.0f32; D];
    let mut pairs = p.chunks_exact(2).zip(v.chunks_exact(2 * D));
    for (p, rows) in &mut pairs {
        let (a, b) = rows.split_at(D);
        for (e, x) in even.iter_mut().zip(a) {
            *e = p[0].mul_add(*x, *e);
        }
        for (o, y) in odd.iter_mut().zip(b) {
            *o = p[1].mul_add(*y, *o);
        }
    }
    if p.len() % 2 == 1 {
        let last = p.len() - 1;
        for (e, x) in even.iter_mut().zip(&v[last * D..(last + 1) * D]) {
            *e = p[last].mul_add(*x, *e);
        }
    }
    for ((c, e), o) in ctx.iter_mut().zip(even).zip(odd) {
        *c = e + o;
    }
}

/// [`weighted_sum`] for a head width without a specialised copy.
#[inline(always)]
fn weighted_sum_any(p: &[f32], v: &[f32], ctx: &mut [f32]) {
    let dim = ctx.len();
    ctx.fill(0.0);
    for (p, row) in p.iter().zip(v.chunks_exact(dim)) {
        for (c, x) in ctx.iter_mut().zip(row) {
            *c = p.mul_add(*x, *c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention written out in f64 with an explicit additive mask and
    /// bias.
    fn reference(qkv: &[f32], mask: &[i64], s: Shape, bias: Option<&[f32]>) -> Vec<f64> {
        let dim = s.hidden / s.heads;
        let mut out = vec![0.0f64; s.batch * s.seq * s.hidden];
        let at = |b: usize, t: usize, k: usize| qkv[(b * s.seq + t) * 3 * s.hidden + k] as f64;
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..s.seq {
                    let scores: Vec<f64> = (0..s.seq)
                        .map(|j| {
                            if mask[b * s.seq + j] == 0 {
                                return f64::NEG_INFINITY;
                            }
                            (0..dim)
                                .map(|d| at(b, i, h * dim + d) * at(b, j, s.hidden + h * dim + d))
                                .sum::<f64>()
                                / (dim as f64).sqrt()
                                + bias.map_or(0.0, |b| b[(h * s.seq + i) * s.seq + j] as f64)
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..dim {
                        out[(b * s.seq + i) * s.hidden + h * dim + d] = (0..s.seq)
                            .map(|j| e[j] / z * at(b, j, 2 * s.hidden + h * dim + d))
                            .sum();
                    }
                }
            }
        }
        out
    }

    /// Every value within 1e-5 (relative, past 1) of the reference.
    fn assert_matches_reference(qkv: &[f32], mask: &[i64], s: Shape, bias: Option<&[f32]>) {
        let got = self_attention(qkv, mask, s, bias);
        let want = reference(qkv, mask, s, bias);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() < 1e-5 * (1.0 + w.abs()),
                "{s:?}, value {i}: {g} vs {w}"
            );
        }
    }

    fn values(n: usize, mut seed: u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn matches_a_reference_with_padding_and_a_mask_hole() {
        let s = Shape {
            batch: 3,
            seq: 7,
            hidden: 12,
            heads: 3,
        };
        let qkv = values(s.batch * s.seq * 3 * s.hidden, 0x9e37_79b9_7f4a_7c15);
        let mask: Vec<i64> = [
            [1, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 0, 1, 1, 0, 1, 0],
        ]
        .concat();
        assert_matches_reference(&qkv, &mask, s, None);
        // With a bias per head, query and key (MPNet's), padded keys still
        // skipped.
        let bias = values(s.heads * s.seq * s.seq, 5);
        assert_matches_reference(&qkv, &mask, s, Some(&bias));
    }

    /// Long texts (several blocks of keys, a partial last block) and the
    /// head widths with specialised loops (32, 64) and one without (24).
    #[test]
    fn matches_a_reference_on_long_texts_and_every_head_width() {
        for (hidden, heads) in [(64, 2), (128, 2), (48, 2)] {
            let s = Shape {
                batch: 2,
                seq: 150,
                hidden,
                heads,
            };
            let qkv = values(s.batch * s.seq * 3 * s.hidden, hidden as u64 + 1);
            let mut mask = vec![1i64; 2 * 150];
            mask[150 + 101..].fill(0);
            assert_matches_reference(&qkv, &mask, s, None);
        }
    }

    /// The loops compiled for each instruction set this CPU has (AVX-512,
    /// AVX2 + FMA, none) all match the reference: a CPU without AVX-512
    /// runs the second, and golden tests on one with it run only the first.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_instruction_set_level_matches_the_reference() {
        use pulp::{Simd, WithSimd};
        let s = Shape {
            batch: 2,
            seq: 150,
            hidden: 64,
            heads: 2,
        };
        let qkv = values(s.batch * s.seq * 3 * s.hidden, 11);
        let mut mask = vec![1i64; 2 * 150];
        mask[150 + 77..].fill(0);
        let want = reference(&qkv, &mask, s, None);
        let mut levels: Vec<(&str, Vec<f32>)> = Vec::new();
        let mut run = |name, f: &(dyn Fn(Text<'_>) + Sync)| {
            let mut out = vec![0.0f32; s.batch * s.seq * s.hidden];
            each_text(&qkv, &mask, s, None, &mut out, f);
            levels.push((name, out));
        };
        run("scalar", &|t| t.with_simd(pulp::Scalar::new()));
        if let Some(v3) = pulp::x86::V3::try_new() {
            run("avx2+fma", &|t| Simd::vectorize(v3, t));
        }
        if let Some(v4) = pulp::x86::V4::try_new() {
            run("avx-512", &|t| Simd::vectorize(v4, t));
        }
        for (name, got) in &levels {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() < 1e-5 * (1.0 + w.abs()),
                    "{name}, value {i}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn padding_keys_do_not_change_a_text() {
        let s = Shape {
            batch: 1,
            seq: 5,
            hidden: 8,
            heads: 2,
        };
        let qkv = values(5 * 3 * 8, 7);
        let alone = self_attention(&qkv[..3 * 3 * 8], &[1, 1, 1], Shape { seq: 3, ..s }, None);
        let padded = self_attention(&qkv, &[1, 1, 1, 0, 0], s, None);
        assert_eq!(alone[..], padded[..3 * 8]);
    }

    #[test]
    fn an_empty_batch_is_empty() {
        let s = Shape {
            batch: 0,
            seq: 4,
            hidden: 8,
            heads: 2,
        };
        assert!(self_attention(&[], &[], s, None).is_empty());
    }
}
