//! The pooling module of a sentence-transformers folder (`1_Pooling`): how
//! a text's token states become one vector, in each of the six modes
//! sentence-transformers implements, read from either layout of its
//! `config.json`.
//!
//! ```text
//! token states [b, s, h] ─► per mode: weights over real tokens ─► Σ w·x   (cls, mean, mean_sqrt_len_tokens,
//!                                                                          weightedmean, lasttoken)
//!                         ─► max over real tokens                          (max)
//!                         ─► modes concatenated in sentence-transformers' order ─► [b, modes·h]
//! ```
//!
//! Tokens of a prompt are left out of every mode when the folder says
//! `include_prompt: false` (INSTRUCTOR-style models), as sentence-transformers
//! does: the first `prompt_tokens` positions count as padding.

use std::path::Path;

use burn::tensor::{Tensor, TensorData};
use serde::Deserialize;

use crate::load_error::{LoadError, read_json};

/// One way of pooling token states into a vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first (unmasked) token: `[CLS]` or `<s>`.
    Cls,
    /// The largest value of each dimension over the real tokens.
    Max,
    /// The mean over the real tokens.
    Mean,
    /// The sum over the real tokens divided by the square root of their
    /// number.
    MeanSqrtLen,
    /// The mean weighted by position (1, 2, 3, …).
    WeightedMean,
    /// The last real token.
    LastToken,
}

impl PoolingMode {
    /// Every mode, in the order sentence-transformers concatenates them.
    pub const ALL: [PoolingMode; 6] = [
        PoolingMode::Cls,
        PoolingMode::Max,
        PoolingMode::Mean,
        PoolingMode::MeanSqrtLen,
        PoolingMode::WeightedMean,
        PoolingMode::LastToken,
    ];

    /// The mode's name in `pooling_mode` (sentence-transformers 5 and later).
    pub fn name(self) -> &'static str {
        match self {
            PoolingMode::Cls => "cls",
            PoolingMode::Max => "max",
            PoolingMode::Mean => "mean",
            PoolingMode::MeanSqrtLen => "mean_sqrt_len_tokens",
            PoolingMode::WeightedMean => "weightedmean",
            PoolingMode::LastToken => "lasttoken",
        }
    }

    /// The mode's flag in the older layout (`pooling_mode_cls_token`, …).
    fn legacy_flag(self) -> &'static str {
        match self {
            PoolingMode::Cls => "pooling_mode_cls_token",
            PoolingMode::Max => "pooling_mode_max_tokens",
            PoolingMode::Mean => "pooling_mode_mean_tokens",
            PoolingMode::MeanSqrtLen => "pooling_mode_mean_sqrt_len_tokens",
            PoolingMode::WeightedMean => "pooling_mode_weightedmean_tokens",
            PoolingMode::LastToken => "pooling_mode_lasttoken",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// A pooling module: its modes (concatenated when more than one) and
/// whether prompt tokens take part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    /// The modes, in sentence-transformers' concatenation order.
    pub modes: Vec<PoolingMode>,
    /// Whether the tokens of a prompt are pooled with the text's.
    pub include_prompt: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawModes {
    One(String),
    Many(Vec<String>),
}

impl Pooling {
    /// Mean pooling over every token, what a folder without a pooling
    /// module gets.
    pub fn mean() -> Self {
        Self {
            modes: vec![PoolingMode::Mean],
            include_prompt: true,
        }
    }

    /// Reads a pooling `config.json` in either layout: `pooling_mode` (one
    /// name or a list) as sentence-transformers 5 and later write it, or
    /// the `pooling_mode_*` flags of earlier versions (no flag set: mean).
    pub fn read(path: &Path) -> Result<Self, LoadError> {
        let raw: serde_json::Map<String, serde_json::Value> = read_json(path)?;
        let malformed = |reason: String| LoadError::Malformed {
            path: path.to_path_buf(),
            reason,
        };
        let include_prompt = match raw.get("include_prompt") {
            None => true,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| malformed(format!("include_prompt is {v}, not a boolean")))?,
        };
        let modes = match raw.get("pooling_mode") {
            Some(value) => {
                let names = match serde_json::from_value::<RawModes>(value.clone()) {
                    Ok(RawModes::One(name)) => vec![name],
                    Ok(RawModes::Many(names)) => names,
                    Err(_) => {
                        return Err(malformed(format!(
                            "pooling_mode is {value}, not a name or a list of names"
                        )));
                    }
                };
                let mut modes = Vec::with_capacity(names.len());
                for name in names {
                    let mode = PoolingMode::parse(&name).ok_or_else(|| LoadError::Unsupported {
                        path: path.to_path_buf(),
                        reason: format!(
                            "pooling_mode {name:?}; supported: {}",
                            PoolingMode::ALL.map(|m| m.name()).join(", ")
                        ),
                    })?;
                    modes.push(mode);
                }
                modes
            }
            None => {
                let mut modes = Vec::new();
                for mode in PoolingMode::ALL {
                    match raw.get(mode.legacy_flag()) {
                        None | Some(serde_json::Value::Bool(false)) => {}
                        Some(serde_json::Value::Bool(true)) => modes.push(mode),
                        Some(v) => {
                            return Err(malformed(format!(
                                "{} is {v}, not a boolean",
                                mode.legacy_flag()
                            )));
                        }
                    }
                }
                if modes.is_empty() {
                    modes.push(PoolingMode::Mean);
                }
                modes
            }
        };
        if modes.is_empty() {
            return Err(malformed("pooling_mode lists no mode".into()));
        }
        let known = [
            "pooling_mode",
            "include_prompt",
            "embedding_dimension",
            "word_embedding_dimension",
        ];
        if let Some(key) = raw.keys().find(|k| {
            !known.contains(&k.as_str()) && !PoolingMode::ALL.iter().any(|m| m.legacy_flag() == *k)
        }) {
            return Err(LoadError::Unsupported {
                path: path.to_path_buf(),
                reason: format!(
                    "pooling setting {key:?}; supported: pooling_mode (or the pooling_mode_* flags) and include_prompt"
                ),
            });
        }
        Ok(Self {
            modes,
            include_prompt,
        })
    }

    /// Width of the pooled vector for token states `hidden` wide.
    pub fn output_dim(&self, hidden: usize) -> usize {
        self.modes.len() * hidden
    }

    /// Which positions of a row take part: its attention mask, with the
    /// first `prompt_tokens` positions cleared when prompts are excluded.
    fn row_mask(&self, mask: &[i64], prompt_tokens: usize) -> Vec<f32> {
        let skip = if self.include_prompt {
            0
        } else {
            prompt_tokens
        };
        mask.iter()
            .enumerate()
            .map(|(j, &m)| if m != 0 && j >= skip { 1.0 } else { 0.0 })
            .collect()
    }

    /// The weight of each position in a weighted-sum mode, for one row.
    fn row_weights(mode: PoolingMode, mask: &[f32]) -> Vec<f32> {
        let s = mask.len();
        let mut w = vec![0.0f32; s];
        match mode {
            PoolingMode::Cls => {
                // The first position left in the mask (the first token when
                // nothing is masked), as sentence-transformers' argmax.
                let first = mask.iter().position(|&m| m != 0.0).unwrap_or(0);
                if s > 0 {
                    w[first] = 1.0;
                }
            }
            PoolingMode::LastToken => {
                if let Some(last) = mask.iter().rposition(|&m| m != 0.0) {
                    w[last] = 1.0;
                }
            }
            PoolingMode::Mean | PoolingMode::MeanSqrtLen => {
                let count: f32 = mask.iter().sum();
                let denominator = count.max(1e-9);
                let denominator = if mode == PoolingMode::Mean {
                    denominator
                } else {
                    denominator.sqrt()
                };
                for (w, &m) in w.iter_mut().zip(mask) {
                    *w = m / denominator;
                }
            }
            PoolingMode::WeightedMean => {
                let total: f32 = mask
                    .iter()
                    .enumerate()
                    .map(|(j, &m)| m * (j + 1) as f32)
                    .sum();
                let total = total.max(1e-9);
                for (j, (w, &m)) in w.iter_mut().zip(mask).enumerate() {
                    *w = m * (j + 1) as f32 / total;
                }
            }
            PoolingMode::Max => unreachable!("max pooling is not a weighted sum"),
        }
        w
    }

    /// Pools token states `x` (`[batch, seq, hidden]`) under the attention
    /// `mask` (`[batch, seq]`, 1 for real tokens), the first
    /// `prompt_tokens` of each row being a prompt's. Returns `[batch,
    /// modes·hidden]`.
    pub fn forward(&self, x: Tensor<3>, mask: &[i64], prompt_tokens: usize) -> Tensor<2> {
        let [b, s, h] = x.dims();
        assert_eq!(mask.len(), b * s, "mask shape");
        let device = x.device();
        let rows: Vec<Vec<f32>> = mask
            .chunks(s.max(1))
            .map(|row| self.row_mask(row, prompt_tokens))
            .collect();
        let mut pooled = Vec::with_capacity(self.modes.len());
        for &mode in &self.modes {
            let out = if mode == PoolingMode::Max {
                // Masked positions are -inf before the max, as
                // sentence-transformers' masked_fill.
                let bias: Vec<f32> = rows
                    .iter()
                    .flatten()
                    .map(|&m| if m != 0.0 { 0.0 } else { f32::NEG_INFINITY })
                    .collect();
                let bias = Tensor::<2>::from_data(TensorData::new(bias, [b, s]), &device);
                (x.clone() + bias.unsqueeze_dim::<3>(2))
                    .max_dim(1)
                    .reshape([b, h])
            } else {
                let weights: Vec<f32> = rows
                    .iter()
                    .flat_map(|row| Self::row_weights(mode, row))
                    .collect();
                let weights = Tensor::<2>::from_data(TensorData::new(weights, [b, s]), &device);
                weights
                    .unsqueeze_dim::<3>(1)
                    .matmul(x.clone())
                    .reshape([b, h])
            };
            pooled.push(out);
        }
        Tensor::cat(pooled, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    fn pooled(
        pooling: &Pooling,
        x: &[f32],
        [b, s, h]: [usize; 3],
        mask: &[i64],
        p: usize,
    ) -> Vec<f32> {
        let x = Tensor::<3>::from_data(TensorData::new(x.to_vec(), [b, s, h]), &Device::flex());
        pooling
            .forward(x, mask, p)
            .try_into_vec_as::<f32>()
            .unwrap()
    }

    fn one(mode: PoolingMode, include_prompt: bool) -> Pooling {
        Pooling {
            modes: vec![mode],
            include_prompt,
        }
    }

    /// Two rows of three positions, one dimension: [1, 2, 3] and [4, 5, pad].
    const X: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 100.0];
    const MASK: [i64; 6] = [1, 1, 1, 1, 1, 0];

    #[test]
    fn every_mode_pools_real_tokens_only() {
        let cases = [
            (PoolingMode::Cls, [1.0, 4.0]),
            (PoolingMode::Max, [3.0, 5.0]),
            (PoolingMode::Mean, [2.0, 4.5]),
            (
                PoolingMode::MeanSqrtLen,
                [6.0 / 3f32.sqrt(), 9.0 / 2f32.sqrt()],
            ),
            (PoolingMode::WeightedMean, [14.0 / 6.0, 14.0 / 3.0]),
            (PoolingMode::LastToken, [3.0, 5.0]),
        ];
        for (mode, want) in cases {
            let got = pooled(&one(mode, true), &X, [2, 3, 1], &MASK, 0);
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "{mode:?}: {got:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn excluded_prompt_tokens_are_not_pooled_but_keep_their_positions() {
        // The first position is a prompt's.
        let cases = [
            (PoolingMode::Cls, [2.0, 5.0]),
            (PoolingMode::Max, [3.0, 5.0]),
            (PoolingMode::Mean, [2.5, 5.0]),
            (PoolingMode::WeightedMean, [13.0 / 5.0, 5.0]),
            (PoolingMode::LastToken, [3.0, 5.0]),
        ];
        let x = [1.0, 2.0, 3.0, 9.0, 5.0, 100.0];
        for (mode, want) in cases {
            let got = pooled(&one(mode, false), &x, [2, 3, 1], &MASK, 1);
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "{mode:?}: {got:?}, want {want:?}");
            }
            // Included, the prompt counts.
            let with = pooled(&one(mode, true), &x, [2, 3, 1], &MASK, 1);
            assert_eq!(with, pooled(&one(mode, true), &x, [2, 3, 1], &MASK, 0));
        }
    }

    #[test]
    fn modes_concatenate_in_order() {
        let p = Pooling {
            modes: vec![PoolingMode::Cls, PoolingMode::Mean],
            include_prompt: true,
        };
        let x = [1.0, 10.0, 3.0, 30.0];
        let got = pooled(&p, &x, [1, 2, 2], &[1, 1], 0);
        assert_eq!(got, vec![1.0, 10.0, 2.0, 20.0]);
        assert_eq!(p.output_dim(2), 4);
    }

    fn read(body: &str) -> Result<Pooling, LoadError> {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-pooling-{}-{}",
            std::process::id(),
            body.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, body).unwrap();
        let got = Pooling::read(&path);
        let _ = std::fs::remove_dir_all(&dir);
        got
    }

    #[test]
    fn both_layouts_read_alike() {
        let legacy = read(
            r#"{"word_embedding_dimension":8,"pooling_mode_cls_token":true,
                "pooling_mode_mean_tokens":true,"pooling_mode_max_tokens":false}"#,
        )
        .unwrap();
        let current = read(
            r#"{"embedding_dimension":8,"pooling_mode":["cls","mean"],"include_prompt":true}"#,
        )
        .unwrap();
        assert_eq!(legacy, current);
        assert_eq!(legacy.modes, vec![PoolingMode::Cls, PoolingMode::Mean]);
        let single = read(r#"{"pooling_mode":"lasttoken","include_prompt":false}"#).unwrap();
        assert_eq!(single.modes, vec![PoolingMode::LastToken]);
        assert!(!single.include_prompt);
        assert_eq!(
            read(r#"{"word_embedding_dimension":8}"#).unwrap(),
            Pooling::mean()
        );
    }

    #[test]
    fn unknown_modes_and_settings_are_refused_by_name() {
        let err = read(r#"{"pooling_mode":"median"}"#).unwrap_err();
        assert!(
            matches!(err, LoadError::Unsupported { .. }) && err.to_string().contains("median"),
            "{err}"
        );
        assert!(err.to_string().contains("weightedmean"), "{err}");
        let err = read(r#"{"pooling_mode":"mean","pooling_mode_attention":true}"#).unwrap_err();
        assert!(err.to_string().contains("pooling_mode_attention"), "{err}");
        let err = read(r#"{"pooling_mode_mean_tokens":"yes"}"#).unwrap_err();
        assert!(matches!(err, LoadError::Malformed { .. }), "{err}");
    }
}
