//! Why a model folder could not be loaded ([`LoadError`]), and reading its
//! JSON files: what every part of the loader (folder, pooling, Dense
//! modules, weights, tokenizer) reports through.

use std::path::{Path, PathBuf};

/// Why a model folder could not be loaded. Every variant names the file or
/// tensor at fault so an operator can fix the folder.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file the folder must contain is absent or unreadable.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A JSON configuration file is malformed or lacks a required field.
    #[error("malformed model file {path}: {reason}")]
    Malformed {
        /// The malformed file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The folder holds a model this encoder does not implement.
    #[error("unsupported model in {path}: {reason}")]
    Unsupported {
        /// The configuration file that says so.
        path: PathBuf,
        /// Which setting is unsupported.
        reason: String,
    },
    /// The weights file is not a valid safetensors archive.
    #[error("malformed weights file {path}: {reason}")]
    Weights {
        /// The weights file.
        path: PathBuf,
        /// The decoder's complaint.
        reason: String,
    },
    /// A tensor the model needs is not in the weights file.
    #[error("tensor {name} is missing from {path}")]
    MissingTensor {
        /// The weights file.
        path: PathBuf,
        /// The expected tensor name.
        name: String,
    },
    /// The weights file holds a tensor that this architecture has no place for.
    #[error("unexpected tensor {name} in {path}: not part of this model's architecture")]
    UnexpectedTensor {
        /// The weights file.
        path: PathBuf,
        /// The unexpected tensor name.
        name: String,
    },
    /// A tensor has a shape that disagrees with config.json.
    #[error("tensor {name} in {path} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The weights file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// The shape config.json implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in an element type the loader does not read.
    #[error("tensor {name} in {path} has dtype {dtype}; expected F32, F16 or BF16")]
    TensorDtype {
        /// The weights file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// The device cannot compute in the precision asked for.
    #[error("device {device} does not compute in {precision}")]
    Precision {
        /// The precision asked for.
        precision: crate::Precision,
        /// The device, as Burn names it.
        device: String,
    },
    /// The backend failed to hand back weights it had loaded.
    #[error("backend error while loading: {0}")]
    Backend(String),
    /// Weights are not stored in this precision: it is chosen when a
    /// model loads (`int8`).
    #[error("weights are not stored in {0}: it is chosen when a model loads")]
    StoredPrecision(crate::Precision),
    /// `--dim` asks for more dimensions than the model's vectors have, or
    /// none.
    #[error(
        "cannot keep {asked} dimensions of the model's {width}-dimensional vectors (1 to {width})"
    )]
    Dim {
        /// The dimensions asked for.
        asked: usize,
        /// The model's output width.
        width: usize,
    },
    /// `FLOTILLA_CPU_LEVEL` names no instruction-set level.
    #[error(transparent)]
    CpuLevel(#[from] crate::cpu_level::UnknownCpuLevel),
    /// tokenizer.json could not be parsed or configured.
    #[error("cannot use tokenizer {path}: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer library's complaint.
        reason: String,
    },
}

impl LoadError {
    /// The [`LoadError::Io`] of `path`, for `map_err`.
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    }

    /// The [`LoadError::Weights`] of `path`, for `map_err`.
    pub(crate) fn weights(path: &Path) -> impl FnOnce(safetensors::SafeTensorError) -> LoadError {
        let path = path.to_path_buf();
        move |e| LoadError::Weights {
            path,
            reason: e.to_string(),
        }
    }
}

/// Reads and parses a JSON file, naming it in any error.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let bytes = std::fs::read(path).map_err(LoadError::io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| LoadError::Malformed {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
