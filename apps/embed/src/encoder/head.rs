//! What a sentence-transformers folder applies after pooling, in the order
//! its `modules.json` lists them: `Dense` layers (`2_Dense`, …; a linear
//! map with an activation, and optionally a residual) and `Normalize`.
//!
//! ```text
//! pooled [b, p] ─► Dense: act(x·W + b) (+ x or x·R) ─► … ─► Normalize: x / ‖x‖ ─► [b, d]
//! ```

use std::path::{Path, PathBuf};

use burn::tensor::activation::{gelu, relu, sigmoid};
use burn::tensor::module::linear;
use burn::tensor::{Device, Tensor, TensorData};
use serde::Deserialize;

use crate::encoder::weights::WeightFile;
use crate::load_error::{LoadError, read_json};

/// The activation of a `Dense` module, by its PyTorch class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseActivation {
    /// `torch.nn.Identity` (no activation).
    Identity,
    /// `torch.nn.Tanh` (sentence-transformers' default).
    Tanh,
    /// `torch.nn.ReLU`.
    Relu,
    /// `torch.nn.GELU` (exact form).
    Gelu,
    /// `torch.nn.Sigmoid`.
    Sigmoid,
}

impl DenseActivation {
    const NAMES: [(&'static str, DenseActivation); 5] = [
        ("Identity", DenseActivation::Identity),
        ("Tanh", DenseActivation::Tanh),
        ("ReLU", DenseActivation::Relu),
        ("GELU", DenseActivation::Gelu),
        ("Sigmoid", DenseActivation::Sigmoid),
    ];

    /// Parses `torch.nn.modules.activation.Tanh` and the like (the module
    /// path before the class name is not checked).
    fn parse(name: &str) -> Option<Self> {
        let class = name.rsplit('.').next().unwrap_or(name);
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == class)
            .map(|(_, a)| *a)
    }

    fn apply(self, x: Tensor<2>) -> Tensor<2> {
        match self {
            DenseActivation::Identity => x,
            DenseActivation::Tanh => x.tanh(),
            DenseActivation::Relu => relu(x),
            DenseActivation::Gelu => gelu(x),
            DenseActivation::Sigmoid => sigmoid(x),
        }
    }
}

/// The configuration of a `Dense` module, read from its folder.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseConfig {
    /// The module's folder (`DIR/2_Dense`).
    pub dir: PathBuf,
    /// Input width.
    pub in_features: usize,
    /// Output width.
    pub out_features: usize,
    /// Whether the layer adds a bias.
    pub bias: bool,
    /// The activation after the linear map.
    pub activation: DenseActivation,
    /// Whether the input is added back (through a linear map when the widths
    /// differ).
    pub residual: bool,
}

#[derive(Deserialize)]
struct RawDense {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default = "tanh")]
    activation_function: String,
    #[serde(default)]
    use_residual: bool,
}

fn yes() -> bool {
    true
}

fn tanh() -> String {
    "torch.nn.modules.activation.Tanh".to_owned()
}

impl DenseConfig {
    /// Reads `dir/config.json` and checks that `dir/model.safetensors` is
    /// there (a `pytorch_model.bin` alone is refused: pickles are not read).
    pub fn read(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("config.json");
        let raw: RawDense = read_json(&path)?;
        let activation = DenseActivation::parse(&raw.activation_function).ok_or_else(|| {
            LoadError::Unsupported {
                path: path.clone(),
                reason: format!(
                    "activation_function {:?}; supported: {}",
                    raw.activation_function,
                    DenseActivation::NAMES.map(|(n, _)| n).join(", ")
                ),
            }
        })?;
        if raw.in_features == 0 || raw.out_features == 0 {
            return Err(LoadError::Malformed {
                path,
                reason: "in_features and out_features must be positive".into(),
            });
        }
        let weights = dir.join("model.safetensors");
        if std::fs::metadata(&weights).is_err() && dir.join("pytorch_model.bin").exists() {
            return Err(LoadError::Unsupported {
                path: dir.join("pytorch_model.bin"),
                reason: "Dense weights as a PyTorch pickle; save the model with safe_serialization (model.safetensors)".into(),
            });
        }
        std::fs::metadata(&weights).map_err(LoadError::io(&weights))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            in_features: raw.in_features,
            out_features: raw.out_features,
            bias: raw.bias,
            activation,
            residual: raw.use_residual,
        })
    }
}

/// A loaded `Dense` module.
#[derive(Debug)]
struct DenseStep {
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    residual: Option<Tensor<2>>,
    identity_residual: bool,
    activation: DenseActivation,
}

/// One step after pooling.
#[derive(Debug)]
enum Step {
    Dense(Box<DenseStep>),
    Normalize,
}

/// The loaded modules after pooling.
#[derive(Debug)]
pub(crate) struct Head {
    steps: Vec<Step>,
}

/// A step of the head as the folder lists it.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadModule {
    /// A `Dense` module.
    Dense(DenseConfig),
    /// A `Normalize` module.
    Normalize,
}

impl Head {
    /// Loads the weights of every Dense module onto `device`.
    pub(crate) fn load(modules: &[HeadModule], device: &Device) -> Result<Self, LoadError> {
        let mut steps = Vec::with_capacity(modules.len());
        for module in modules {
            steps.push(match module {
                HeadModule::Normalize => Step::Normalize,
                HeadModule::Dense(c) => {
                    let path = c.dir.join("model.safetensors");
                    let bytes = std::fs::read(&path).map_err(LoadError::io(&path))?;
                    let mut w = WeightFile::parse_plain(&path, &bytes, device)?;
                    let (d_in, d_out) = (c.in_features, c.out_features);
                    let weight = w.linear_values("linear.weight", d_in, d_out)?;
                    let weight = Tensor::from_data(TensorData::new(weight, [d_in, d_out]), device);
                    let bias = if c.bias {
                        Some(w.vector("linear.bias", d_out)?)
                    } else {
                        None
                    };
                    let residual = if c.residual && d_in != d_out {
                        let r = w.linear_values("residual.weight", d_in, d_out)?;
                        Some(Tensor::from_data(TensorData::new(r, [d_in, d_out]), device))
                    } else {
                        None
                    };
                    w.finish()?;
                    Step::Dense(Box::new(DenseStep {
                        weight,
                        bias,
                        residual,
                        identity_residual: c.residual && d_in == d_out,
                        activation: c.activation,
                    }))
                }
            });
        }
        Ok(Self { steps })
    }

    /// Runs every step on pooled vectors `[batch, width]`.
    pub(crate) fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for step in &self.steps {
            x = match step {
                Step::Normalize => normalize(x),
                Step::Dense(d) => {
                    let out =
                        d.activation
                            .apply(linear(x.clone(), d.weight.clone(), d.bias.clone()));
                    match &d.residual {
                        Some(r) => out + x.matmul(r.clone()),
                        None if d.identity_residual => out + x,
                        None => out,
                    }
                }
            };
        }
        x
    }
}

/// Each row divided by its L2 norm (at least 1e-12), as PyTorch's
/// `F.normalize`.
pub(crate) fn normalize(x: Tensor<2>) -> Tensor<2> {
    let norms = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norms
}

/// Keeps the first `dim` values of each `width`-wide row of `values` and
/// renormalises them (Matryoshka truncation).
pub fn truncate_rows(values: &[f32], width: usize, dim: usize) -> Vec<f32> {
    assert!(dim > 0 && dim <= width, "truncation to {dim} of {width}");
    let mut out = Vec::with_capacity(values.len() / width * dim);
    for row in values.chunks(width) {
        let kept = &row[..dim];
        let norm = kept.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        out.extend(kept.iter().map(|v| v / norm));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_parse_from_their_class_paths() {
        assert_eq!(
            DenseActivation::parse("torch.nn.modules.activation.Tanh"),
            Some(DenseActivation::Tanh)
        );
        assert_eq!(
            DenseActivation::parse("torch.nn.modules.linear.Identity"),
            Some(DenseActivation::Identity)
        );
        assert_eq!(
            DenseActivation::parse("torch.nn.modules.activation.Softsign"),
            None
        );
    }

    #[test]
    fn truncation_keeps_a_prefix_and_renormalises() {
        let got = truncate_rows(&[3.0, 4.0, 12.0, 0.0, 0.0, 5.0], 3, 2);
        assert_eq!(got, vec![0.6, 0.8, 0.0, 0.0]);
    }

    #[test]
    fn head_applies_dense_then_normalize() {
        let dev = Device::flex();
        let head = Head {
            steps: vec![
                Step::Dense(Box::new(DenseStep {
                    weight: Tensor::from_data(
                        TensorData::new(vec![2.0f32, 0.0, 0.0, 1.0], [2, 2]),
                        &dev,
                    ),
                    bias: Some(Tensor::from_data(
                        TensorData::new(vec![0.0f32, 1.0], [2]),
                        &dev,
                    )),
                    residual: None,
                    identity_residual: false,
                    activation: DenseActivation::Relu,
                })),
                Step::Normalize,
            ],
        };
        let x = Tensor::<2>::from_data(TensorData::new(vec![1.5f32, -5.0], [1, 2]), &dev);
        let got = head.forward(x).try_into_vec_as::<f32>().unwrap();
        // relu([3, -4]) = [3, 0], normalised.
        assert_eq!(got, vec![1.0, 0.0]);
    }
}
