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
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::model_folder::{Activation, BertConfig, LoadError};
use crate::tokenize::TokenBatch;
use crate::weights::WeightFile;

struct Dense {
    weight: Tensor<2>,
    bias: Tensor<1>,
}

impl Dense {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        linear(x, self.weight.clone(), Some(self.bias.clone()))
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
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert")
            .field("config", &self.config)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Bert {
    /// Builds the encoder from the bytes of a safetensors file, checking each
    /// tensor's name and shape against `config`.
    pub fn from_safetensors(
        config: &BertConfig,
        path: &Path,
        bytes: &[u8],
        device: &Device,
    ) -> Result<Self, LoadError> {
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
                qkv,
                attn_out,
                attn_norm,
                ffn_in,
                ffn_out,
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
        })
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

    fn activate(&self, x: Tensor<3>) -> Tensor<3> {
        match self.config.activation {
            Activation::Gelu => gelu(x),
            Activation::GeluTanh => gelu_approximate(x),
            Activation::Relu => relu(x),
        }
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
        let head_dim = h / heads;
        let dev = &self.device;

        let ids = Tensor::<2, Int>::from_data(TensorData::new(tokens.ids.clone(), [b, s]), dev);
        let types =
            Tensor::<2, Int>::from_data(TensorData::new(tokens.type_ids.clone(), [b, s]), dev);
        let mask_f: Vec<f32> = tokens.mask.iter().map(|&m| m as f32).collect();
        let mask_f = Tensor::<2>::from_data(TensorData::new(mask_f, [b, s]), dev);
        let pad: Vec<bool> = tokens.mask.iter().map(|&m| m == 0).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, s]), dev);
        let attn_mask: Tensor<4, Bool> = pad.reshape([b, 1, 1, s]).expand([b, heads, s, s]);

        let positions = self.position.clone().narrow(0, 0, s).unsqueeze::<3>();
        let x = embedding(self.word.clone(), ids)
            + positions
            + embedding(self.token_type.clone(), types);
        let mut x = self.norm(x, &self.emb_norm);

        for layer in &self.layers {
            let qkv = layer.qkv.forward(x.clone());
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
                Some(attn_mask.clone()),
                None,
                AttentionModuleOptions::default(),
            );
            let ctx = ctx.swap_dims(1, 2).reshape([b, s, h]);
            x = self.norm(layer.attn_out.forward(ctx) + x, &layer.attn_norm);
            let ffn = layer
                .ffn_out
                .forward(self.activate(layer.ffn_in.forward(x.clone())));
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
