//! The encoder's layers with int8 matrix products (`--precision int8`),
//! run as host loops on the CPU: the four dense layers through
//! [`crate::encoder::int8_gemm`], attention and GELU in `f32` through the encoder's
//! own loops, residual + LayerNorm fused in one pass. The hidden states stay
//! one `f32` buffer from the embeddings to the pooling: no tensor is made
//! per layer.
//!
//! ```text
//! x ─► q ─► QKV (int8) ─► attention (f32) ─► q ─► out proj (int8) ─► LN(x + ·)
//!   ─► q ─► FFN in (int8) ─► GELU (f32) ─► q ─► FFN out (int8) ─► LN(x + ·)
//! ```
//!
//! Accuracy: per-column weight scales, and per-token activation ranges
//! with a zero point. A few input channels of every product reach far past
//! the rest (LayerNorm outputs, GELU's output); each channel is divided by
//! a smoothing factor as it is quantized and its weight row multiplied by
//! it (SmoothQuant, α = ½), which keeps one channel from setting every
//! token's scale. The factors come from the channels' ranges on a fixed
//! calibration batch run through the float layers at load. Measured on the
//! golden sentences: lowest cosine 0.995 to the f32 reference (0.982
//! without smoothing and zero points, where QKV's input cost the most;
//! after them FFN-out's does).

use crate::encoder::attention::{Shape, self_attention};
use crate::encoder::int8_gemm::{Int8Matrix, Int8Rows, matmul};
use crate::encoder::model_folder::Activation;

/// LayerNorm parameters on the host.
#[derive(Debug, Clone)]
pub(crate) struct HostNorm {
    /// Scale per channel.
    pub gamma: Vec<f32>,
    /// Shift per channel.
    pub beta: Vec<f32>,
}

/// A dense layer's float parameters as loaded.
#[derive(Debug, Clone)]
pub(crate) struct DenseValues {
    /// Row-major `[inputs, outputs]`.
    pub weight: Vec<f32>,
    /// `outputs` values.
    pub bias: Vec<f32>,
}

/// The float parameters of one layer, for [`QuantizedLayer::quantize`].
pub(crate) struct LayerValues {
    /// Fused query, key and value projection, `[h, 3h]`.
    pub qkv: DenseValues,
    /// Attention output projection, `[h, h]`.
    pub attn_out: DenseValues,
    /// LayerNorm after attention.
    pub attn_norm: HostNorm,
    /// Feed-forward input, `[h, f]`.
    pub ffn_in: DenseValues,
    /// Feed-forward output, `[f, h]`.
    pub ffn_out: DenseValues,
    /// LayerNorm after the feed-forward block.
    pub ffn_norm: HostNorm,
}

/// The largest magnitude each input channel of a layer's four products
/// reached on calibration text, with the float model.
#[derive(Debug, Clone, Default)]
pub(crate) struct InputRanges {
    /// QKV's input (the previous LayerNorm's output), `h` values.
    pub qkv: Vec<f32>,
    /// The attention context, `h` values.
    pub attn_out: Vec<f32>,
    /// FFN-in's input (the attention LayerNorm's output), `h` values.
    pub ffn_in: Vec<f32>,
    /// GELU's output, `f` values.
    pub ffn_out: Vec<f32>,
}

/// One of a layer's four products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Product {
    /// The fused query, key and value projection.
    Qkv,
    /// The attention output projection.
    AttnOut,
    /// The feed-forward input.
    FfnIn,
    /// The feed-forward output.
    FfnOut,
}

impl InputRanges {
    /// The ranges of `product`'s input.
    pub(crate) fn of(&mut self, product: Product) -> &mut Vec<f32> {
        match product {
            Product::Qkv => &mut self.qkv,
            Product::AttnOut => &mut self.attn_out,
            Product::FfnIn => &mut self.ffn_in,
            Product::FfnOut => &mut self.ffn_out,
        }
    }

    /// Column-wise largest magnitudes of `x`, rows of `width`, folded into
    /// `into`.
    pub(crate) fn fold(into: &mut Vec<f32>, x: &[f32], width: usize) {
        if into.len() != width {
            *into = vec![0.0; width];
        }
        for row in x.chunks_exact(width) {
            for (m, v) in into.iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
    }
}

/// One encoder layer in int8.
#[derive(Debug, Clone)]
pub(crate) struct QuantizedLayer {
    qkv: Smoothed,
    attn_out: Smoothed,
    attn_norm: HostNorm,
    ffn_in: Smoothed,
    activation: Activation,
    ffn_out: Smoothed,
    ffn_norm: HostNorm,
}

/// Buffers a forward pass reuses from layer to layer.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    q: Int8Rows,
    wide: Vec<f32>,
    narrow: Vec<f32>,
}

/// A quantized product whose input channels are divided by smoothing
/// factors as they are quantized, the weight rows multiplied by them.
#[derive(Debug, Clone)]
struct Smoothed {
    /// The reciprocals of the factors, one per input channel.
    inverse: Vec<f32>,
    matrix: Int8Matrix,
}

impl Smoothed {
    /// Smooths and quantizes `dense` (`[k, n]`) for inputs whose channels
    /// reach `range`: factor `√(a_k / w_k)` per channel, `a_k` the
    /// channel's reach and `w_k` its weight row's largest magnitude, which
    /// balances the two (SmoothQuant with α = ½).
    fn new(mut dense: DenseValues, range: &[f32], k: usize, n: usize) -> Self {
        let mut inverse = Vec::with_capacity(k);
        for kk in 0..k {
            let row = &mut dense.weight[kk * n..(kk + 1) * n];
            let a = range.get(kk).copied().unwrap_or(0.0);
            let w = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let f = if a > 0.0 && w > 0.0 {
                (a / w).sqrt().clamp(1e-3, 1e3)
            } else {
                1.0
            };
            row.iter_mut().for_each(|v| *v *= f);
            inverse.push(1.0 / f);
        }
        Self {
            inverse,
            matrix: Int8Matrix::quantize(&dense.weight, &dense.bias, k, n),
        }
    }

    /// `out = x · W + b` for `x` rows of `k` values.
    fn forward(&self, x: &[f32], q: &mut Int8Rows, out: &mut Vec<f32>) {
        let k = self.inverse.len();
        q.quantize_from(x, k, Some(&self.inverse));
        out.resize(x.len() / k * self.matrix.outputs(), 0.0);
        matmul(&self.matrix, q, out);
    }
}

impl QuantizedLayer {
    /// Quantizes a layer whose products' inputs reach `ranges`; its
    /// feed-forward block applies `activation`.
    pub(crate) fn quantize(
        v: LayerValues,
        ranges: &InputRanges,
        hidden: usize,
        intermediate: usize,
        activation: Activation,
    ) -> Self {
        let (h, f) = (hidden, intermediate);
        Self {
            qkv: Smoothed::new(v.qkv, &ranges.qkv, h, 3 * h),
            attn_out: Smoothed::new(v.attn_out, &ranges.attn_out, h, h),
            attn_norm: v.attn_norm,
            ffn_in: Smoothed::new(v.ffn_in, &ranges.ffn_in, h, f),
            activation,
            ffn_out: Smoothed::new(v.ffn_out, &ranges.ffn_out, f, h),
            ffn_norm: v.ffn_norm,
        }
    }

    /// Runs the layer on `x`, `[batch · seq, hidden]` row-major, in place;
    /// `bias` is the attention's position bias (MPNet's), `[heads, seq,
    /// seq]`.
    // One layer's inputs and its scratch; the weights are `self`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        x: &mut [f32],
        mask: &[i64],
        shape: Shape,
        bias: Option<&[f32]>,
        eps: f32,
        s: &mut Scratch,
    ) {
        self.qkv.forward(x, &mut s.q, &mut s.wide);
        let ctx = self_attention(&s.wide, mask, shape, bias);
        self.attn_out.forward(&ctx, &mut s.q, &mut s.narrow);
        add_norm(x, &s.narrow, &self.attn_norm, eps);

        self.ffn_in.forward(x, &mut s.q, &mut s.wide);
        activate(&mut s.wide, self.activation);
        self.ffn_out.forward(&s.wide, &mut s.q, &mut s.narrow);
        add_norm(x, &s.narrow, &self.ffn_norm, eps);
    }
}

/// The feed-forward activation on host values, as the float layers apply
/// it.
fn activate(values: &mut [f32], activation: Activation) {
    match activation {
        Activation::Gelu => crate::encoder::fast_gelu::gelu_in_place(values),
        Activation::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            for x in values.iter_mut() {
                let v = *x;
                *x = 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.044_715 * v * v * v)).tanh());
            }
        }
        Activation::Relu => values.iter_mut().for_each(|x| *x = x.max(0.0)),
    }
}

/// `x = LayerNorm(x + t)` per row of `norm.gamma.len()` values.
fn add_norm(x: &mut [f32], t: &[f32], norm: &HostNorm, eps: f32) {
    crate::cpu_level::arch().dispatch(AddNorm { x, t, norm, eps });
}

/// Residual and LayerNorm over all rows: the unit of run-time dispatch.
struct AddNorm<'a> {
    x: &'a mut [f32],
    t: &'a [f32],
    norm: &'a HostNorm,
    eps: f32,
}

impl pulp::WithSimd for AddNorm<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let h = self.norm.gamma.len();
        for (row, t) in self.x.chunks_exact_mut(h).zip(self.t.chunks_exact(h)) {
            let mut sum = 0.0f32;
            for (v, t) in row.iter_mut().zip(t) {
                *v += t;
                sum += *v;
            }
            let mean = sum / h as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(&self.norm.gamma).zip(&self.norm.beta) {
                *v = (*v - mean) * inv * g + b;
            }
        }
    }
}
