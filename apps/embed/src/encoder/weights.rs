//! Reading BERT-family weights from `model.safetensors`, checking every tensor's name
//! and shape against `config.json`, and turning PyTorch layouts into Burn's.

use std::collections::HashSet;
use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use crate::load_error::LoadError;

/// Tensors a BERT-family checkpoint may carry that the encoder does not
/// use: buffers and the pooler of the pre-training task.
const IGNORED: &[&str] = &[
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "pooler.dense.weight",
    "pooler.dense.bias",
];

/// Prefixes of checkpoints saved from a task model (`BertForX`, …) rather
/// than the bare encoder.
const TASK_PREFIXES: &[&str] = &["bert.", "roberta.", "mpnet.", "model."];

/// A parsed weights file that hands out tensors by name, checking shapes and
/// remembering which names were taken so leftovers can be reported.
pub(crate) struct WeightFile<'a> {
    path: &'a Path,
    tensors: SafeTensors<'a>,
    /// `"bert."` (or another of [`TASK_PREFIXES`]) when the checkpoint was
    /// saved from a task model.
    prefix: &'static str,
    /// Names the file may carry unused.
    ignored: &'static [&'static str],
    taken: HashSet<String>,
    device: &'a Device,
}

impl<'a> WeightFile<'a> {
    pub(crate) fn parse(
        path: &'a Path,
        bytes: &'a [u8],
        device: &'a Device,
    ) -> Result<Self, LoadError> {
        let tensors = SafeTensors::deserialize(bytes).map_err(LoadError::weights(path))?;
        let names = tensors.names();
        let prefix = TASK_PREFIXES
            .iter()
            .find(|p| {
                names
                    .iter()
                    .any(|n| n.starts_with(&format!("{p}embeddings.")))
            })
            .copied()
            .unwrap_or("");
        Ok(Self {
            path,
            tensors,
            prefix,
            ignored: IGNORED,
            taken: HashSet::new(),
            device,
        })
    }

    /// A weights file read as named, with no prefix and nothing left unused
    /// (the `Dense` modules after pooling).
    pub(crate) fn parse_plain(
        path: &'a Path,
        bytes: &'a [u8],
        device: &'a Device,
    ) -> Result<Self, LoadError> {
        let tensors = SafeTensors::deserialize(bytes).map_err(LoadError::weights(path))?;
        Ok(Self {
            path,
            tensors,
            prefix: "",
            ignored: &[],
            taken: HashSet::new(),
            device,
        })
    }

    fn values(&mut self, name: &str, expected: &[usize]) -> Result<Vec<f32>, LoadError> {
        let full = format!("{}{name}", self.prefix);
        let view = self
            .tensors
            .tensor(&full)
            .map_err(|_| LoadError::MissingTensor {
                path: self.path.to_path_buf(),
                name: full.clone(),
            })?;
        if view.shape() != expected {
            return Err(LoadError::TensorShape {
                path: self.path.to_path_buf(),
                name: full,
                expected: expected.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(LoadError::TensorDtype {
                    path: self.path.to_path_buf(),
                    name: full,
                    dtype: format!("{other:?}"),
                });
            }
        };
        self.taken.insert(full);
        Ok(values)
    }

    /// A tensor's values on the host, checked against `shape`.
    pub(crate) fn host_values(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, LoadError> {
        self.values(name, shape)
    }

    /// A 1-D tensor such as a bias or a layer-norm parameter.
    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Tensor<1>, LoadError> {
        let values = self.values(name, &[len])?;
        Ok(Tensor::from_data(
            TensorData::new(values, [len]),
            self.device,
        ))
    }

    /// An embedding table, `[rows, width]`, kept as stored.
    pub(crate) fn table(
        &mut self,
        name: &str,
        rows: usize,
        width: usize,
    ) -> Result<Tensor<2>, LoadError> {
        let values = self.values(name, &[rows, width])?;
        Ok(Tensor::from_data(
            TensorData::new(values, [rows, width]),
            self.device,
        ))
    }

    /// A PyTorch `Linear` weight stored `[out, in]`, returned as raw values
    /// transposed to Burn's `[in, out]` layout.
    pub(crate) fn linear_values(
        &mut self,
        name: &str,
        d_in: usize,
        d_out: usize,
    ) -> Result<Vec<f32>, LoadError> {
        let stored = self.values(name, &[d_out, d_in])?;
        let mut out = vec![0.0f32; stored.len()];
        for o in 0..d_out {
            for i in 0..d_in {
                out[i * d_out + o] = stored[o * d_in + i];
            }
        }
        Ok(out)
    }

    /// A layer-norm parameter, stored as `weight`/`bias` or the older
    /// `gamma`/`beta`.
    pub(crate) fn norm(
        &mut self,
        base: &str,
        len: usize,
    ) -> Result<(Tensor<1>, Tensor<1>), LoadError> {
        let modern = format!("{}{base}.weight", self.prefix);
        let (w, b) = if self.tensors.tensor(&modern).is_ok() {
            ("weight", "bias")
        } else {
            ("gamma", "beta")
        };
        Ok((
            self.vector(&format!("{base}.{w}"), len)?,
            self.vector(&format!("{base}.{b}"), len)?,
        ))
    }

    /// Fails on the first tensor in the file that no loader took and that is
    /// not a known unused one.
    pub(crate) fn finish(self) -> Result<(), LoadError> {
        let mut names = self.tensors.names();
        names.sort_unstable();
        for name in names {
            let bare = name.strip_prefix(self.prefix).unwrap_or(name);
            if !self.taken.contains(name) && !self.ignored.contains(&bare) {
                return Err(LoadError::UnexpectedTensor {
                    path: self.path.to_path_buf(),
                    name: name.to_owned(),
                });
            }
        }
        Ok(())
    }
}
