//! The BERT-family encoder as Burn tensor operations: embeddings,
//! self-attention layers with padding masks, feed-forward blocks; the token
//! states it returns are pooled by [`crate::encoder::pooling`].
//!
//! ```text
//! ids ─► word + position (+ type) embeddings ─► LayerNorm
//!     ─► N × [ fused QKV ─► masked attention (+ relative bias) ─► out proj ─► +res ─► LayerNorm
//!              ─► FFN (act) ─► +res ─► LayerNorm ]
//!     ─► token states [b, s, h]
//! ```
//!
//! The families differ in three places only: RoBERTa and XLM-RoBERTa count
//! positions from past the padding index and have one token type; MPNet
//! does too, has no token types, and adds a relative position bias (T5's
//! bidirectional buckets, shared by every layer) to each head's scores.

use std::path::Path;

use burn::tensor::activation::{gelu, gelu_approximate, relu};
use burn::tensor::module::{attention, embedding, layer_norm, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, FloatDType, Int, Tensor, TensorData};

use crate::encoder::model_folder::{Activation, Architecture, BertConfig, LoadError};
use crate::encoder::precision::Precision;
use crate::encoder::quantized::{
    DenseValues, HostNorm, InputRanges, LayerValues, Product, QuantizedLayer, Scratch,
};
use crate::encoder::weights::WeightFile;
use crate::tokenize::TokenBatch;

struct Dense {
    weight: Tensor<2>,
    bias: Tensor<1>,
}

impl Dense {
    /// `x · W + b` in the weights' float type (`x` cast to it first).
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let x = x.cast(self.weight.dtype());
        linear(x, self.weight.clone(), Some(self.bias.clone()))
    }

    /// [`Dense::forward`] with the result in `f32`, for the residual stream.
    fn forward_f32(&self, x: Tensor<3>) -> Tensor<3> {
        self.forward(x).cast(FloatDType::F32)
    }

    /// The layer with its weights in `precision`.
    fn cast(self, precision: Precision) -> Self {
        Self {
            weight: self.weight.cast(precision.dtype()),
            bias: self.bias.cast(precision.dtype()),
        }
    }

    /// The layer's parameters read back from the device.
    fn values(&self) -> Result<DenseValues, LoadError> {
        Ok(DenseValues {
            weight: read_back(&self.weight)?,
            bias: read_back(&self.bias)?,
        })
    }
}

struct Norm {
    gamma: Tensor<1>,
    beta: Tensor<1>,
}

/// The encoder's layers: Burn tensors, or the CPU's int8 host layers.
enum Layers {
    Burn(Vec<Layer>),
    Int8(Vec<QuantizedLayer>),
}

impl Norm {
    /// The norm's parameters read back from the device.
    fn host(&self) -> Result<HostNorm, LoadError> {
        Ok(HostNorm {
            gamma: read_back(&self.gamma)?,
            beta: read_back(&self.beta)?,
        })
    }
}

/// [`host_values`] while loading.
fn read_back<const D: usize>(t: &Tensor<D>) -> Result<Vec<f32>, LoadError> {
    host_values(t.clone()).map_err(|e| LoadError::Backend(e.0))
}

impl Layer {
    /// The layer in int8, smoothed for inputs that reach `ranges`.
    fn quantize(
        &self,
        ranges: &InputRanges,
        config: &BertConfig,
    ) -> Result<QuantizedLayer, LoadError> {
        let values = LayerValues {
            qkv: self.qkv.values()?,
            attn_out: self.attn_out.values()?,
            attn_norm: self.attn_norm.host()?,
            ffn_in: self.ffn_in.values()?,
            ffn_out: self.ffn_out.values()?,
            ffn_norm: self.ffn_norm.host()?,
        };
        Ok(QuantizedLayer::quantize(
            values,
            ranges,
            config.hidden_size,
            config.intermediate_size,
            config.activation,
        ))
    }
}

struct Layer {
    /// Query, key and value projections fused into one `[h, 3h]` matmul.
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    ffn_in: Dense,
    ffn_out: Dense,
    ffn_norm: Norm,
}

/// The backend failed to run the model or to read its output back (a device
/// error on GPU backends).
#[derive(Debug, thiserror::Error)]
#[error("backend error: {0}")]
pub struct BackendError(pub String);

/// A loaded BERT-family encoder.
pub struct Bert {
    config: BertConfig,
    device: Device,
    word: Tensor<2>,
    position: Tensor<2>,
    /// Token-type embeddings (none in MPNet).
    token_type: Option<Tensor<2>>,
    /// MPNet's relative attention bias, `[buckets, heads]` on the host.
    relative_bias: Option<Vec<f32>>,
    emb_norm: Norm,
    layers: Layers,
    /// Whether GELU and attention run as the encoder's own host loops (CPU
    /// backends) rather than as backend kernels.
    host_kernels: bool,
    /// The float type of the dense layers and attention.
    precision: Precision,
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("precision", &self.precision)
            .finish_non_exhaustive()
    }
}

impl Bert {
    /// Builds the encoder from the bytes of a safetensors file (weights
    /// stored in f32, f16 or bf16), checking each tensor's name and shape
    /// against `config`; the dense layers run in `precision`.
    pub fn from_safetensors(
        config: &BertConfig,
        path: &Path,
        bytes: &[u8],
        device: &Device,
        precision: Precision,
    ) -> Result<Self, LoadError> {
        let host_kernels = *device == Device::flex();
        if !device.supports_dtype(precision.dtype()) || (precision.cpu_only() && !host_kernels) {
            return Err(LoadError::Precision {
                precision,
                device: format!("{device:?}"),
            });
        }
        let mut w = WeightFile::parse(path, bytes, device)?;
        let h = config.hidden_size;
        let word = w.table("embeddings.word_embeddings.weight", config.vocab_size, h)?;
        let position = w.table(
            "embeddings.position_embeddings.weight",
            config.max_position_embeddings,
            h,
        )?;
        let token_type = if config.has_token_types() {
            Some(w.table(
                "embeddings.token_type_embeddings.weight",
                config.type_vocab_size,
                h,
            )?)
        } else {
            None
        };
        let relative_bias = if config.architecture == Architecture::MpNet {
            Some(w.host_values(
                "encoder.relative_attention_bias.weight",
                &[
                    config.relative_attention_buckets,
                    config.num_attention_heads,
                ],
            )?)
        } else {
            None
        };
        let mpnet = config.architecture == Architecture::MpNet;
        let (gamma, beta) = w.norm("embeddings.LayerNorm", h)?;
        let emb_norm = Norm { gamma, beta };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let dense = |w: &mut WeightFile<'_>, name: &str, d_in: usize, d_out: usize| {
                let values = w.linear_values(&format!("{p}.{name}.weight"), d_in, d_out)?;
                Ok::<_, LoadError>(Dense {
                    weight: Tensor::from_data(TensorData::new(values, [d_in, d_out]), device),
                    bias: w.vector(&format!("{p}.{name}.bias"), d_out)?,
                })
            };
            let qkv = {
                let mut weight = vec![0.0f32; h * 3 * h];
                let mut bias = Vec::with_capacity(3 * h);
                let parts = if mpnet {
                    ["attention.attn.q", "attention.attn.k", "attention.attn.v"]
                } else {
                    [
                        "attention.self.query",
                        "attention.self.key",
                        "attention.self.value",
                    ]
                };
                for (k, part) in parts.iter().enumerate() {
                    let name = format!("{p}.{part}");
                    let values = w.linear_values(&format!("{name}.weight"), h, h)?;
                    for row in 0..h {
                        weight[row * 3 * h + k * h..row * 3 * h + (k + 1) * h]
                            .copy_from_slice(&values[row * h..(row + 1) * h]);
                    }
                    let b = w.vector(&format!("{name}.bias"), h)?;
                    bias.push(b);
                }
                Dense {
                    weight: Tensor::from_data(TensorData::new(weight, [h, 3 * h]), device),
                    bias: Tensor::cat(bias, 0),
                }
            };
            let (out_name, out_norm) = if mpnet {
                ("attention.attn.o", "attention.LayerNorm")
            } else {
                ("attention.output.dense", "attention.output.LayerNorm")
            };
            let attn_out = dense(&mut w, out_name, h, h)?;
            let (gamma, beta) = w.norm(&format!("{p}.{out_norm}"), h)?;
            let attn_norm = Norm { gamma, beta };
            let ffn_in = dense(&mut w, "intermediate.dense", h, config.intermediate_size)?;
            let ffn_out = dense(&mut w, "output.dense", config.intermediate_size, h)?;
            let (gamma, beta) = w.norm(&format!("{p}.output.LayerNorm"), h)?;
            let ffn_norm = Norm { gamma, beta };
            layers.push(Layer {
                qkv: qkv.cast(precision),
                attn_out: attn_out.cast(precision),
                attn_norm,
                ffn_in: ffn_in.cast(precision),
                ffn_out: ffn_out.cast(precision),
                ffn_norm,
            });
        }
        w.finish()?;
        let mut bert = Self {
            config: config.clone(),
            device: device.clone(),
            word,
            position,
            token_type,
            relative_bias,
            emb_norm,
            layers: Layers::Burn(layers),
            host_kernels,
            precision,
        };
        if precision == Precision::Int8 {
            bert.quantize()?;
        }
        Ok(bert)
    }

    /// The float type of the dense layers and attention.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The hyper-parameters the encoder was built from.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Replaces the float layers with int8 ones, smoothed for the input
    /// ranges the float model reaches on [`calibration_batch`].
    fn quantize(&mut self) -> Result<(), LoadError> {
        let Layers::Burn(layers) = &self.layers else {
            return Ok(());
        };
        let ranges = self
            .calibrate(layers, &calibration_batch(&self.config))
            .map_err(|e| LoadError::Backend(e.0))?;
        let quantized = layers
            .iter()
            .zip(&ranges)
            .map(|(layer, r)| layer.quantize(r, &self.config))
            .collect::<Result<_, _>>()?;
        self.layers = Layers::Int8(quantized);
        Ok(())
    }

    /// The largest magnitude of each input channel of every product, per
    /// layer, when the float layers run `tokens`.
    fn calibrate(
        &self,
        layers: &[Layer],
        tokens: &TokenBatch,
    ) -> Result<Vec<InputRanges>, BackendError> {
        let mut x = self.embeddings(tokens);
        let bias = self.position_bias(tokens.seq_len);
        let mut all = Vec::with_capacity(layers.len());
        for layer in layers {
            let mut r = InputRanges::default();
            x = self.float_layer(layer, x, tokens, &None, &bias, |product, input| {
                let width = input.dims()[2];
                InputRanges::fold(r.of(product), &host_values(input.clone())?, width);
                Ok(())
            })?;
            all.push(r);
        }
        Ok(all)
    }

    /// One float layer on `x`; `seen` is shown each product's input
    /// (calibration looks, inference passes a no-op).
    // One layer's inputs; the model's own state is `self`.
    #[allow(clippy::too_many_arguments)]
    fn float_layer(
        &self,
        layer: &Layer,
        x: Tensor<3>,
        tokens: &TokenBatch,
        attn_mask: &Option<Tensor<4, Bool>>,
        bias: &Option<Vec<f32>>,
        mut seen: impl FnMut(Product, &Tensor<3>) -> Result<(), BackendError>,
    ) -> Result<Tensor<3>, BackendError> {
        seen(Product::Qkv, &x)?;
        let qkv = layer.qkv.forward(x.clone());
        let ctx = if self.host_kernels {
            self.host_attention(qkv, tokens, bias.as_deref())?
        } else {
            self.backend_attention(qkv, attn_mask, bias.as_deref(), x.dims())
        };
        seen(Product::AttnOut, &ctx)?;
        let x = self.norm(layer.attn_out.forward_f32(ctx) + x, &layer.attn_norm);
        seen(Product::FfnIn, &x)?;
        let act = self.activate(layer.ffn_in.forward(x.clone()))?;
        seen(Product::FfnOut, &act)?;
        let ffn = layer.ffn_out.forward_f32(act);
        Ok(self.norm(ffn + x, &layer.ffn_norm))
    }

    /// Word, position and token-type embeddings, summed and normalised.
    /// Positions start at the family's offset (past the padding index for
    /// RoBERTa and MPNet); padded positions get positions too, but no real
    /// token attends to them and pooling skips them.
    fn embeddings(&self, tokens: &TokenBatch) -> Tensor<3> {
        let (b, s) = (tokens.batch, tokens.seq_len);
        let dev = &self.device;
        let ids = Tensor::<2, Int>::from_data(TensorData::new(tokens.ids.clone(), [b, s]), dev);
        let positions = self
            .position
            .clone()
            .narrow(0, self.config.position_offset(), s)
            .unsqueeze::<3>();
        let mut x = embedding(self.word.clone(), ids) + positions;
        if let Some(token_type) = &self.token_type {
            let types =
                Tensor::<2, Int>::from_data(TensorData::new(tokens.type_ids.clone(), [b, s]), dev);
            x = x + embedding(token_type.clone(), types);
        }
        self.norm(x, &self.emb_norm)
    }

    /// MPNet's relative position bias for sequences of `seq` tokens, `[heads,
    /// seq, seq]` (None for other families).
    fn position_bias(&self, seq: usize) -> Option<Vec<f32>> {
        let table = self.relative_bias.as_ref()?;
        let heads = self.config.num_attention_heads;
        let buckets = self.config.relative_attention_buckets;
        // The bucket depends on the distance alone: one per distance, from
        // -(seq - 1) to seq - 1.
        let span = seq.saturating_sub(1) as i64;
        let by_distance: Vec<usize> = (-span..=span)
            .map(|d| relative_bucket(d, buckets))
            .collect();
        let mut bias = vec![0.0f32; heads * seq * seq];
        for i in 0..seq {
            for j in 0..seq {
                let bucket = by_distance[j + span as usize - i];
                for h in 0..heads {
                    bias[(h * seq + i) * seq + j] = table[bucket * heads + h];
                }
            }
        }
        Some(bias)
    }

    fn norm(&self, x: Tensor<3>, n: &Norm) -> Tensor<3> {
        layer_norm(
            x,
            n.gamma.clone(),
            Some(n.beta.clone()),
            self.config.layer_norm_eps,
        )
    }

    fn activate(&self, x: Tensor<3>) -> Result<Tensor<3>, BackendError> {
        Ok(match self.config.activation {
            // On the CPU, a vectorised exact-form GELU beats the backend's
            // scalar erf; other devices keep their own kernel.
            Activation::Gelu if self.host_kernels => {
                let dims = x.dims();
                let mut values = x
                    .try_into_vec_as::<f32>()
                    .map_err(|e| BackendError(e.to_string()))?;
                crate::encoder::fast_gelu::gelu_in_place(&mut values);
                Tensor::from_data(TensorData::new(values, dims), &self.device)
            }
            Activation::Gelu => gelu(x),
            Activation::GeluTanh => gelu_approximate(x),
            Activation::Relu => relu(x),
        })
    }

    /// The shape of an attention call on `b` texts of `s` tokens.
    fn shape(&self, b: usize, s: usize) -> crate::encoder::attention::Shape {
        crate::encoder::attention::Shape {
            batch: b,
            seq: s,
            hidden: self.config.hidden_size,
            heads: self.config.num_attention_heads,
        }
    }

    /// Self-attention on the host (CPU backends): `qkv` read back as one
    /// buffer, attention computed per text and head over its real tokens.
    fn host_attention(
        &self,
        qkv: Tensor<3>,
        tokens: &TokenBatch,
        bias: Option<&[f32]>,
    ) -> Result<Tensor<3>, BackendError> {
        let [b, s, _] = qkv.dims();
        let h = self.config.hidden_size;
        let values = host_values(qkv)?;
        let ctx = crate::encoder::attention::self_attention(
            &values,
            &tokens.mask,
            self.shape(b, s),
            bias,
        );
        Ok(Tensor::from_data(
            TensorData::new(ctx, [b, s, h]),
            &self.device,
        ))
    }

    /// Self-attention as backend kernels (GPU backends).
    fn backend_attention(
        &self,
        qkv: Tensor<3>,
        attn_mask: &Option<Tensor<4, Bool>>,
        bias: Option<&[f32]>,
        [b, s, h]: [usize; 3],
    ) -> Tensor<3> {
        let heads = self.config.num_attention_heads;
        let head_dim = h / heads;
        let split = |k: usize| {
            qkv.clone()
                .narrow(2, k * h, h)
                .reshape([b, s, heads, head_dim])
                .swap_dims(1, 2)
        };
        let bias = bias.map(|bias| {
            Tensor::<3>::from_data(TensorData::new(bias.to_vec(), [heads, s, s]), &self.device)
                .unsqueeze::<4>()
                .expand([b, heads, s, s])
                .cast(qkv.dtype())
        });
        let ctx = attention(
            split(0),
            split(1),
            split(2),
            attn_mask.clone(),
            bias,
            AttentionModuleOptions::default(),
        );
        ctx.swap_dims(1, 2).reshape([b, s, h])
    }

    /// Runs the encoder on a padded batch and returns every token's final
    /// state, `[batch, seq, hidden]` in `f32`.
    ///
    /// `tokens.seq_len` must not exceed [`BertConfig::max_positions`]; the
    /// tokenizer's truncation guarantees it.
    pub fn forward(&self, tokens: &TokenBatch) -> Result<Tensor<3>, BackendError> {
        let (b, s) = (tokens.batch, tokens.seq_len);
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let dev = &self.device;
        if b == 0 || s == 0 {
            return Ok(Tensor::zeros([b, s, h], dev));
        }
        let attn_mask: Option<Tensor<4, Bool>> = (!self.host_kernels).then(|| {
            let pad: Vec<bool> = tokens.mask.iter().map(|&m| m == 0).collect();
            let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, s]), dev);
            pad.reshape([b, 1, 1, s]).expand([b, heads, s, s])
        });
        let bias = self.position_bias(s);

        let mut x = self.embeddings(tokens);

        match &self.layers {
            Layers::Burn(layers) => {
                for layer in layers {
                    x = self.float_layer(layer, x, tokens, &attn_mask, &bias, |_, _| Ok(()))?;
                }
            }
            Layers::Int8(layers) => {
                let mut values = host_values(x)?;
                let shape = self.shape(b, s);
                let mut scratch = Scratch::default();
                let eps = self.config.layer_norm_eps as f32;
                for layer in layers {
                    layer.forward(
                        &mut values,
                        &tokens.mask,
                        shape,
                        bias.as_deref(),
                        eps,
                        &mut scratch,
                    );
                }
                x = Tensor::from_data(TensorData::new(values, [b, s, h]), dev);
            }
        }
        Ok(x.cast(FloatDType::F32))
    }
}

/// MPNet's bucket of a relative position (key − query): T5's bidirectional
/// scheme with a maximum distance of 128, half the buckets for keys after
/// the query; exact below a quarter of the buckets, logarithmic above.
fn relative_bucket(relative: i64, buckets: usize) -> usize {
    const MAX_DISTANCE: f64 = 128.0;
    let half = (buckets / 2) as i64;
    let n = -relative;
    let mut bucket = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    bucket += if n < max_exact {
        n
    } else {
        let large = max_exact
            + ((n as f64 / max_exact as f64).ln() / (MAX_DISTANCE / max_exact as f64).ln()
                * (half - max_exact) as f64) as i64;
        large.min(half - 1)
    };
    bucket as usize
}

/// A tensor's values, read back to the host.
fn host_values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, BackendError> {
    t.try_into_vec_as::<f32>()
        .map_err(|e| BackendError(e.to_string()))
}

/// Token ids the int8 mode calibrates on: 8 rows of 48 ids spread over
/// the vocabulary (skipping its first tenth, where special and unused
/// entries sit), the same for every load. The ranges only set how each
/// input channel is shared between activations and weights; every token
/// still gets its own scale at run time.
fn calibration_batch(config: &BertConfig) -> TokenBatch {
    let (rows, len) = (8, 48.min(config.max_positions()));
    let low = config.vocab_size / 10;
    let span = (config.vocab_size - low).max(1) as u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let ids = (0..rows * len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (low as u64 + seed % span) as i64
        })
        .collect();
    TokenBatch {
        batch: rows,
        seq_len: len,
        ids,
        type_ids: vec![0; rows * len],
        mask: vec![1; rows * len],
        prompt_tokens: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoder::model_folder::Activation;
    use safetensors::tensor::{Dtype, TensorView};

    fn tiny_config() -> BertConfig {
        BertConfig {
            architecture: Architecture::Bert,
            pad_token_id: 0,
            relative_attention_buckets: 0,
            vocab_size: 11,
            hidden_size: 8,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 12,
            max_position_embeddings: 16,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            activation: Activation::Gelu,
        }
    }

    /// Every tensor of a BERT checkpoint for `c`, PyTorch layout, with
    /// deterministic pseudo-random values.
    fn checkpoint(c: &BertConfig) -> Vec<(String, Vec<usize>)> {
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let mut t = vec![
            (
                "embeddings.word_embeddings.weight".to_owned(),
                vec![c.vocab_size, h],
            ),
            (
                "embeddings.position_embeddings.weight".to_owned(),
                vec![c.max_position_embeddings, h],
            ),
            (
                "embeddings.token_type_embeddings.weight".to_owned(),
                vec![c.type_vocab_size, h],
            ),
            ("embeddings.LayerNorm.weight".to_owned(), vec![h]),
            ("embeddings.LayerNorm.bias".to_owned(), vec![h]),
            (
                "embeddings.position_ids".to_owned(),
                vec![1, c.max_position_embeddings],
            ),
            ("pooler.dense.weight".to_owned(), vec![h, h]),
            ("pooler.dense.bias".to_owned(), vec![h]),
        ];
        for i in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            for part in ["query", "key", "value"] {
                t.push((format!("{p}.attention.self.{part}.weight"), vec![h, h]));
                t.push((format!("{p}.attention.self.{part}.bias"), vec![h]));
            }
            t.push((format!("{p}.attention.output.dense.weight"), vec![h, h]));
            t.push((format!("{p}.attention.output.dense.bias"), vec![h]));
            t.push((format!("{p}.attention.output.LayerNorm.weight"), vec![h]));
            t.push((format!("{p}.attention.output.LayerNorm.bias"), vec![h]));
            t.push((format!("{p}.intermediate.dense.weight"), vec![f, h]));
            t.push((format!("{p}.intermediate.dense.bias"), vec![f]));
            t.push((format!("{p}.output.dense.weight"), vec![h, f]));
            t.push((format!("{p}.output.dense.bias"), vec![h]));
            t.push((format!("{p}.output.LayerNorm.weight"), vec![h]));
            t.push((format!("{p}.output.LayerNorm.bias"), vec![h]));
        }
        t
    }

    fn serialize(tensors: &[(String, Vec<usize>)]) -> Vec<u8> {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let mut data = Vec::with_capacity(n * 4);
                for _ in 0..n {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let v = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4;
                    data.extend_from_slice(&v.to_le_bytes());
                }
                (name.clone(), shape.clone(), data)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, s, d)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    fn load(tensors: &[(String, Vec<usize>)]) -> Result<Bert, LoadError> {
        let bytes = serialize(tensors);
        Bert::from_safetensors(
            &tiny_config(),
            Path::new("model.safetensors"),
            &bytes,
            &Device::flex(),
            Precision::F32,
        )
    }

    fn batch(rows: &[&[i64]]) -> TokenBatch {
        let seq_len = rows.iter().map(|r| r.len()).max().unwrap();
        let mut t = TokenBatch {
            batch: rows.len(),
            seq_len,
            ids: vec![],
            type_ids: vec![0; rows.len() * seq_len],
            mask: vec![],
            prompt_tokens: 0,
        };
        for r in rows {
            t.ids.extend(
                r.iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, seq_len - r.len())),
            );
            t.mask.extend(
                std::iter::repeat_n(1, r.len()).chain(std::iter::repeat_n(0, seq_len - r.len())),
            );
        }
        t
    }

    /// Mean-pooled, normalised vectors of `tokens`, row-major.
    fn embed(model: &Bert, tokens: &TokenBatch) -> Vec<f32> {
        let states = model.forward(tokens).unwrap();
        let pooled = crate::encoder::pooling::Pooling::mean().forward(states, &tokens.mask, 0);
        host_values(crate::encoder::head::normalize(pooled)).unwrap()
    }

    /// A short text's vector alone, and a long and the short text's
    /// vectors in one padded batch; asserts padding changed nothing.
    fn alone_and_padded(model: &Bert) -> (Vec<f32>, Vec<f32>) {
        let short: &[i64] = &[1, 5, 2];
        let long: &[i64] = &[1, 3, 4, 7, 9, 10, 6, 2];
        let alone = embed(model, &batch(&[short]));
        let padded = embed(model, &batch(&[long, short]));
        assert_eq!(padded.len(), 16);
        let diff = alone
            .iter()
            .zip(&padded[8..])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-6, "padding changed the vector by {diff}");
        (alone, padded)
    }

    #[test]
    fn tiny_checkpoint_loads_and_padding_does_not_change_vectors() {
        let model = load(&checkpoint(&tiny_config())).unwrap();
        let (alone, _) = alone_and_padded(&model);
        let norm: f32 = alone.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }

    /// The CPU's own attention and GELU loops and the backend's kernels
    /// (what GPU backends run) give the same vectors, padding included.
    #[test]
    fn host_loops_and_backend_kernels_agree() {
        let mut model = load(&checkpoint(&tiny_config())).unwrap();
        let tokens = batch(&[&[1, 3, 4, 7, 9, 10, 6, 2], &[1, 5, 2], &[1, 8, 8, 2]]);
        let host = embed(&model, &tokens);
        model.host_kernels = false;
        let backend = embed(&model, &tokens);
        let diff = host
            .iter()
            .zip(&backend)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "host and backend differ by {diff}");
    }

    /// The int8 layers, with each activation a checkpoint may name:
    /// padding changes no vector, and the vectors stay within cosine
    /// 0.9999 of the float model's (on this tiny model; applying GELU in
    /// place of ReLU gives 0.9956).
    #[test]
    fn int8_layers_ignore_padding_and_stay_close_to_f32() {
        for activation in [Activation::Gelu, Activation::GeluTanh, Activation::Relu] {
            let config = BertConfig {
                activation,
                ..tiny_config()
            };
            let bytes = serialize(&checkpoint(&config));
            let load = |p| {
                Bert::from_safetensors(
                    &config,
                    Path::new("model.safetensors"),
                    &bytes,
                    &Device::flex(),
                    p,
                )
                .unwrap()
            };
            let (float, int8) = (load(Precision::F32), load(Precision::Int8));
            assert_eq!(int8.precision(), Precision::Int8);
            let (_, padded) = alone_and_padded(&int8);
            let (_, reference) = alone_and_padded(&float);
            for (q, f) in padded.chunks(8).zip(reference.chunks(8)) {
                let cosine: f32 = q.iter().zip(f).map(|(a, b)| a * b).sum();
                assert!(
                    cosine > 0.9999,
                    "{activation:?}: cosine {cosine} to the float model"
                );
            }
        }
    }

    /// MPNet's buckets (32 of them) agree with transformers'
    /// `relative_position_bucket` at the edges of every range.
    #[test]
    fn relative_buckets_match_transformers() {
        let want = [
            (-300, 15),
            (-129, 15),
            (-128, 15),
            (-127, 15),
            (-64, 14),
            (-33, 12),
            (-32, 12),
            (-31, 11),
            (-17, 10),
            (-16, 10),
            (-15, 9),
            (-9, 8),
            (-8, 8),
            (-7, 7),
            (-1, 1),
            (0, 0),
            (1, 17),
            (7, 23),
            (8, 24),
            (9, 24),
            (15, 25),
            (16, 26),
            (17, 26),
            (31, 27),
            (32, 28),
            (64, 30),
            (127, 31),
            (128, 31),
            (300, 31),
        ];
        for (relative, bucket) in want {
            assert_eq!(relative_bucket(relative, 32), bucket, "{relative}");
        }
    }

    #[test]
    fn bert_prefix_and_gamma_beta_names_load() {
        let renamed: Vec<_> = checkpoint(&tiny_config())
            .into_iter()
            .map(|(n, s)| {
                let n = n
                    .replace("LayerNorm.weight", "LayerNorm.gamma")
                    .replace("LayerNorm.bias", "LayerNorm.beta");
                (format!("bert.{n}"), s)
            })
            .collect();
        load(&renamed).unwrap();
    }

    #[test]
    fn missing_tensor_is_named() {
        let mut t = checkpoint(&tiny_config());
        t.retain(|(n, _)| n != "encoder.layer.1.output.dense.bias");
        match load(&t) {
            Err(LoadError::MissingTensor { name, .. }) => {
                assert_eq!(name, "encoder.layer.1.output.dense.bias")
            }
            other => panic!("expected a missing tensor, got {other:?}"),
        }
    }

    #[test]
    fn wrong_shape_is_named_with_both_shapes() {
        let mut t = checkpoint(&tiny_config());
        for (n, s) in &mut t {
            if n == "encoder.layer.0.intermediate.dense.weight" {
                *s = vec![8, 12];
            }
        }
        match load(&t) {
            Err(LoadError::TensorShape {
                name,
                expected,
                found,
                ..
            }) => {
                assert_eq!(name, "encoder.layer.0.intermediate.dense.weight");
                assert_eq!((expected, found), (vec![12, 8], vec![8, 12]));
            }
            other => panic!("expected a shape error, got {other:?}"),
        }
    }

    #[test]
    fn unexpected_tensor_is_named() {
        let mut t = checkpoint(&tiny_config());
        t.push((
            "encoder.layer.0.attention.self.rotary.weight".to_owned(),
            vec![2],
        ));
        match load(&t) {
            Err(LoadError::UnexpectedTensor { name, .. }) => {
                assert_eq!(name, "encoder.layer.0.attention.self.rotary.weight")
            }
            other => panic!("expected an unexpected-tensor error, got {other:?}"),
        }
    }

    #[test]
    fn garbage_weights_file_is_a_weights_error() {
        let err = Bert::from_safetensors(
            &tiny_config(),
            Path::new("model.safetensors"),
            &[0xff; 64],
            &Device::flex(),
            Precision::F32,
        )
        .unwrap_err();
        assert!(matches!(err, LoadError::Weights { .. }), "{err}");
        assert!(err.to_string().contains("model.safetensors"));
    }
}
