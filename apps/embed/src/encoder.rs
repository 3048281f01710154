//! [`SentenceEncoder`]: a model folder loaded onto a device, turning texts
//! into normalised embeddings.

use std::path::Path;
use std::time::{Duration, Instant};

use burn::tensor::Device;

use crate::bert::{BackendError, Bert};
use crate::model_folder::{LoadError, ModelFolder, ModelRevision};
use crate::precision::Precision;
use crate::tokenize::{TextTokenizer, TokenBatch, TokenizeError};

/// Why a batch could not be embedded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The texts could not be tokenized.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Normalised embeddings of one batch, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// Width of each vector.
    pub dim: usize,
    /// `rows * dim` values; row `i` is text `i`.
    pub values: Vec<f32>,
}

impl Embeddings {
    /// Number of vectors.
    pub fn rows(&self) -> usize {
        self.values.len().checked_div(self.dim).unwrap_or(0)
    }

    /// The vector of text `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }
}

/// The device the encoder runs on when the caller does not choose: the first
/// CUDA device when the `cuda` feature is built and a GPU is present,
/// otherwise the CPU ([`crate::devices::cpu_device`]).
pub fn default_device() -> Device {
    crate::devices::cuda_devices()
        .into_iter()
        .next()
        .unwrap_or_else(crate::devices::cpu_device)
}

/// A sentence-transformers model loaded for inference.
///
/// Encoding is synchronous and CPU- or GPU-bound: call it from a dedicated
/// thread or a blocking pool, never from an async runtime's worker.
///
/// ```no_run
/// use flotilla_embed::{SentenceEncoder, default_device};
/// let encoder = SentenceEncoder::load("models/all-MiniLM-L6-v2", &default_device())?;
/// let vectors = encoder.encode(&["a sentence", "another one"])?;
/// assert_eq!(vectors.dim, 384);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SentenceEncoder {
    folder: ModelFolder,
    revision: ModelRevision,
    tokenizer: TextTokenizer,
    model: Bert,
    load_time: Duration,
}

impl SentenceEncoder {
    /// Loads the folder at `dir` onto `device`: configuration, tokenizer and
    /// weights, each checked. Runs in `f32`.
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> Result<Self, LoadError> {
        Self::load_with(dir, device, Precision::F32)
    }

    /// [`SentenceEncoder::load`] with the dense layers and attention in
    /// `precision` (see [`Precision`]).
    pub fn load_with(
        dir: impl AsRef<Path>,
        device: &Device,
        precision: Precision,
    ) -> Result<Self, LoadError> {
        let started = Instant::now();
        let folder = ModelFolder::open(dir)?;
        let tokenizer = TextTokenizer::load(&folder.tokenizer_path(), folder.max_seq_length)?;
        let path = folder.weights_path();
        let bytes = std::fs::read(&path).map_err(LoadError::io(&path))?;
        let revision = ModelRevision::of_bytes(&bytes);
        let model = Bert::from_safetensors(&folder.config, &path, &bytes, device, precision)?;
        Ok(Self {
            folder,
            revision,
            tokenizer,
            model,
            load_time: started.elapsed(),
        })
    }

    /// The identity of the loaded weights.
    pub fn revision(&self) -> &ModelRevision {
        &self.revision
    }

    /// The float type of the dense layers and attention.
    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// Width of the embeddings.
    pub fn dim(&self) -> usize {
        self.folder.config.hidden_size
    }

    /// Longest sequence in tokens; longer texts are truncated.
    pub fn max_seq_length(&self) -> usize {
        self.folder.max_seq_length
    }

    /// How long [`SentenceEncoder::load`] took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The tokenizer, for callers that sort or inspect texts by length.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Tokenizes a batch as [`SentenceEncoder::encode`] would.
    pub fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch, TokenizeError> {
        self.tokenizer.tokenize(texts)
    }

    /// Embeds an already tokenized batch.
    pub fn encode_tokens(&self, tokens: &TokenBatch) -> Result<Embeddings, BackendError> {
        Ok(Embeddings {
            dim: self.dim(),
            values: self.model.embed(tokens)?,
        })
    }

    /// Embeds `texts` as one batch padded to its longest text. Padding never
    /// changes a text's vector.
    pub fn encode(&self, texts: &[&str]) -> Result<Embeddings, EncodeError> {
        let tokens = self.tokenize(texts)?;
        Ok(self.encode_tokens(&tokens)?)
    }
}
