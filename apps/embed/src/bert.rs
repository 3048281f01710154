//! The BERT encoder as Burn tensor operations: embeddings, self-attention
//! layers with padding masks, feed-forward blocks, then mean pooling over the
//! attention mask and L2 normalisation.
//!
//! ```text
//! ids ─► word + position + type embeddings ─► LayerNorm
//!     ─► N × [ fused QKV ─► masked attention ─► out proj ─► +res ─► LayerNorm
//!              ─► FFN (act) ─► +res ─► LayerNorm ]
//!     ─► mean over real tokens ─► x / ‖x‖
//! ```

use std::path::Path;

use burn::tensor::activation::{gelu, gelu_approximate, relu};
use burn::tensor::module::{attention, embedding, layer_norm, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, FloatDType, Int, Tensor, TensorData};

use crate::model_folder::{Activation, BertConfig, LoadError};
use crate::precision::Precision;
use crate::tokenize::TokenBatch;
use crate::weights::WeightFile;

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
}

struct Norm {
    gamma: Tensor<1>,
    beta: Tensor<1>,
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

/// A loaded BERT encoder with mean pooling and normalisation.
pub struct Bert {
    config: BertConfig,
    device: Device,
    word: Tensor<2>,
    position: Tensor<2>,
    token_type: Tensor<2>,
    emb_norm: Norm,
    layers: Vec<Layer>,
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
        if !device.supports_dtype(precision.dtype()) {
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
        let token_type = w.table(
            "embeddings.token_type_embeddings.weight",
            config.type_vocab_size,
            h,
        )?;
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
                for (k, part) in ["query", "key", "value"].iter().enumerate() {
                    let name = format!("{p}.attention.self.{part}");
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
            let attn_out = dense(&mut w, "attention.output.dense", h, h)?;
            let (gamma, beta) = w.norm(&format!("{p}.attention.output.LayerNorm"), h)?;
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
        Ok(Self {
            config: config.clone(),
            device: device.clone(),
            word,
            position,
            token_type,
            emb_norm,
            layers,
            host_kernels: *device == Device::flex(),
            precision,
        })
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
                crate::fast_gelu::gelu_in_place(&mut values);
                Tensor::from_data(TensorData::new(values, dims), &self.device)
            }
            Activation::Gelu => gelu(x),
            Activation::GeluTanh => gelu_approximate(x),
            Activation::Relu => relu(x),
        })
    }

    /// Self-attention on the host (CPU backends): `qkv` read back as one
    /// buffer, attention computed per text and head over its real tokens.
    fn host_attention(
        &self,
        qkv: Tensor<3>,
        tokens: &TokenBatch,
    ) -> Result<Tensor<3>, BackendError> {
        let [b, s, _] = qkv.dims();
        let h = self.config.hidden_size;
        let values = qkv
            .try_into_vec_as::<f32>()
            .map_err(|e| BackendError(e.to_string()))?;
        let shape = crate::attention::Shape {
            batch: b,
            seq: s,
            hidden: h,
            heads: self.config.num_attention_heads,
        };
        let ctx = crate::attention::self_attention(&values, &tokens.mask, shape);
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
        let ctx = attention(
            split(0),
            split(1),
            split(2),
            attn_mask.clone(),
            None,
            AttentionModuleOptions::default(),
        );
        ctx.swap_dims(1, 2).reshape([b, s, h])
    }

    /// Runs the encoder on a padded batch and returns the L2-normalised mean
    /// of each text's token states, row-major `[batch, hidden]`.
    ///
    /// `tokens.seq_len` must not exceed `max_position_embeddings`; the
    /// tokenizer's truncation guarantees it.
    pub fn embed(&self, tokens: &TokenBatch) -> Result<Vec<f32>, BackendError> {
        let (b, s) = (tokens.batch, tokens.seq_len);
        if b == 0 {
            return Ok(Vec::new());
        }
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let dev = &self.device;

        let ids = Tensor::<2, Int>::from_data(TensorData::new(tokens.ids.clone(), [b, s]), dev);
        let types =
            Tensor::<2, Int>::from_data(TensorData::new(tokens.type_ids.clone(), [b, s]), dev);
        let mask_f: Vec<f32> = tokens.mask.iter().map(|&m| m as f32).collect();
        let mask_f = Tensor::<2>::from_data(TensorData::new(mask_f, [b, s]), dev);
        let attn_mask: Option<Tensor<4, Bool>> = (!self.host_kernels).then(|| {
            let pad: Vec<bool> = tokens.mask.iter().map(|&m| m == 0).collect();
            let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, s]), dev);
            pad.reshape([b, 1, 1, s]).expand([b, heads, s, s])
        });

        let positions = self.position.clone().narrow(0, 0, s).unsqueeze::<3>();
        let x = embedding(self.word.clone(), ids)
            + positions
            + embedding(self.token_type.clone(), types);
        let mut x = self.norm(x, &self.emb_norm);

        for layer in &self.layers {
            let qkv = layer.qkv.forward(x.clone());
            let ctx = if self.host_kernels {
                self.host_attention(qkv, tokens)?
            } else {
                self.backend_attention(qkv, &attn_mask, [b, s, h])
            };
            x = self.norm(layer.attn_out.forward_f32(ctx) + x, &layer.attn_norm);
            let ffn = layer
                .ffn_out
                .forward_f32(self.activate(layer.ffn_in.forward(x.clone()))?);
            x = self.norm(ffn + x, &layer.ffn_norm);
        }

        let m = mask_f.unsqueeze_dim::<3>(2);
        let summed = (x * m.clone()).sum_dim(1).reshape([b, h]);
        let counts = m.sum_dim(1).reshape([b, 1]).clamp_min(1e-9);
        let mean = summed / counts;
        let norms = mean
            .clone()
            .powi_scalar(2)
            .sum_dim(1)
            .sqrt()
            .clamp_min(1e-12);
        let out = mean / norms;
        out.try_into_vec_as::<f32>()
            .map_err(|e| BackendError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_folder::Activation;
    use safetensors::tensor::{Dtype, TensorView};

    fn tiny_config() -> BertConfig {
        BertConfig {
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

    #[test]
    fn tiny_checkpoint_loads_and_padding_does_not_change_vectors() {
        let model = load(&checkpoint(&tiny_config())).unwrap();
        let short: &[i64] = &[1, 5, 2];
        let long: &[i64] = &[1, 3, 4, 7, 9, 10, 6, 2];
        let alone = model.embed(&batch(&[short])).unwrap();
        let padded = model.embed(&batch(&[long, short])).unwrap();
        assert_eq!(padded.len(), 16);
        let diff = alone
            .iter()
            .zip(&padded[8..])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-6, "padding changed the vector by {diff}");
        let norm: f32 = alone.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }

    /// The CPU's own attention and GELU loops and the backend's kernels
    /// (what GPU backends run) give the same vectors, padding included.
    #[test]
    fn host_loops_and_backend_kernels_agree() {
        let mut model = load(&checkpoint(&tiny_config())).unwrap();
        let tokens = batch(&[&[1, 3, 4, 7, 9, 10, 6, 2], &[1, 5, 2], &[1, 8, 8, 2]]);
        let host = model.embed(&tokens).unwrap();
        model.host_kernels = false;
        let backend = model.embed(&tokens).unwrap();
        let diff = host
            .iter()
            .zip(&backend)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "host and backend differ by {diff}");
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
