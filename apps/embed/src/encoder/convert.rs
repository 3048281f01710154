//! A model folder's copy with its weights stored in another float type:
//! f16 or bf16 halve `model.safetensors` (all-MiniLM-L6-v2: 87 MiB to
//! 44 MiB), for shipping a model where bytes count. The encoder up-casts
//! them on load, or runs them as stored with the same `--precision`.
//!
//! ```text
//! SRC/model.safetensors (f32) ─► each float tensor rounded ─► DST/model.safetensors (f16)
//! SRC/* (config, tokenizer, pooling) ─────── copied ────────► DST/*
//! ```

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::encoder::model_folder::{LoadError, ModelFolder};
use crate::encoder::precision::Precision;

/// Files of other weight formats a Hugging Face folder may carry, not
/// copied: the encoder reads `model.safetensors` only.
const OTHER_WEIGHTS: &[&str] = &["bin", "onnx", "h5", "ot", "msgpack", "safetensors"];

/// What [`convert_folder`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The new weights file.
    pub weights: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Tensors rounded to the new type.
    pub converted: usize,
    /// Tensors copied as stored (integer ones, or already in the type).
    pub kept: usize,
}

/// Copies the model folder `src` to `dst` (created; it must not exist)
/// with every float tensor of its weights stored as `precision`. The
/// source is checked as a model folder first.
pub fn convert_folder(
    src: &Path,
    dst: &Path,
    precision: Precision,
) -> Result<Converted, LoadError> {
    let folder = ModelFolder::open(src)?;
    let io = LoadError::io;
    if dst.exists() {
        return Err(LoadError::Io {
            path: dst.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the destination exists; give a new folder",
            ),
        });
    }
    let weights_path = folder.weights_path();
    let bytes = std::fs::read(&weights_path).map_err(io(&weights_path))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(LoadError::weights(&weights_path))?;
    let (_, metadata) =
        SafeTensors::read_metadata(&bytes).map_err(LoadError::weights(&weights_path))?;
    let target = match precision {
        Precision::F32 => Dtype::F32,
        Precision::F16 => Dtype::F16,
        Precision::Bf16 => Dtype::BF16,
        Precision::Int8 => return Err(LoadError::StoredPrecision(precision)),
    };
    let (mut converted, mut kept) = (0, 0);
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in tensors.tensors() {
        let data = view.data();
        let floats: Option<Vec<f32>> = match view.dtype() {
            d if d == target => None,
            Dtype::F32 => Some(
                data.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::F16 => Some(
                data.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            ),
            Dtype::BF16 => Some(
                data.chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            ),
            _ => None,
        };
        match floats {
            Some(values) => {
                converted += 1;
                let bytes: Vec<u8> = match target {
                    Dtype::F16 => values
                        .iter()
                        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                        .collect(),
                    Dtype::BF16 => values
                        .iter()
                        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                        .collect(),
                    _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                out.push((name, target, view.shape().to_vec(), bytes));
            }
            None => {
                kept += 1;
                out.push((name, view.dtype(), view.shape().to_vec(), data.to_vec()));
            }
        }
    }
    let views = out
        .iter()
        .map(|(name, dtype, shape, data)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(LoadError::weights(&weights_path))?;
    let mut metadata = metadata.metadata().clone().unwrap_or_default();
    metadata.insert("flotilla.converted_to".into(), precision.to_string());
    let serialized =
        safetensors::serialize(views, Some(metadata)).map_err(LoadError::weights(&weights_path))?;

    // Written beside the destination, then renamed into place whole.
    let partial = dst.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    copy_tree(src, &partial)?;
    let new_weights = partial.join("model.safetensors");
    std::fs::write(&new_weights, &serialized).map_err(io(&new_weights))?;
    std::fs::rename(&partial, dst).map_err(io(dst))?;
    Ok(Converted {
        weights: dst.join("model.safetensors"),
        bytes: serialized.len() as u64,
        converted,
        kept,
    })
}

/// Copies the regular files of `src` into `dst`, folders included, except
/// weights files.
fn copy_tree(src: &Path, dst: &Path) -> Result<(), LoadError> {
    let io = LoadError::io;
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        let to = dst.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&path, &to)?;
        } else if kind.is_file() {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !OTHER_WEIGHTS.contains(&ext) {
                std::fs::copy(&path, &to).map_err(io(&path))?;
            }
        }
    }
    Ok(())
}
