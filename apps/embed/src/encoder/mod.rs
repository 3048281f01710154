//! # Room `encoder/`: token ids to vectors
//!
//! Owns the model folder and what it names ([`model_folder`], [`head`],
//! [`pooling`], [`convert`]), one file per model family (`bert`: BERT,
//! RoBERTa, XLM-RoBERTa and MPNet) and the layers they share (attention,
//! GELU, weights, precision, the int8 products of [`int8_gemm`], whose
//! [`int8_gemm::dot`] is the crate's only `unsafe`), and the
//! [`SentenceEncoder`] that runs them (this file).
//!
//! May import: `tokenize` and the shared files.
//!
//! [`SentenceEncoder`]: a model folder loaded onto a device, turning texts
//! into embeddings as the folder's pipeline says: encoder, pooling, Dense
//! layers, normalisation.

pub(crate) mod attention;
pub(crate) mod bert;
pub mod convert;
pub(crate) mod fast_gelu;
pub mod head;
pub mod int8_gemm;
pub mod model_folder;
pub mod pooling;
pub(crate) mod precision;
pub(crate) mod quantized;
pub(crate) mod weights;

use std::path::Path;
use std::time::{Duration, Instant};

use burn::tensor::Device;

use crate::encoder::bert::{BackendError, Bert};
use crate::encoder::head::Head;
use crate::encoder::model_folder::{LoadError, ModelFolder, ModelRevision};
use crate::encoder::precision::Precision;
use crate::tokenize::{Prompt, TextTokenizer, TokenBatch, TokenizeError};

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

/// Embeddings of one batch, row-major (unit vectors where the folder ends
/// with `Normalize`).
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

    /// The first `dim` values of every vector, renormalised (Matryoshka
    /// truncation); unchanged when `dim` is the width.
    ///
    /// # Panics
    ///
    /// When `dim` is 0 or wider than the vectors.
    pub fn truncated(self, dim: usize) -> Embeddings {
        if dim == self.dim {
            return self;
        }
        Embeddings {
            values: crate::encoder::head::truncate_rows(&self.values, self.dim, dim),
            dim,
        }
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
/// // A query prompt, and the first 128 dimensions renormalised:
/// let query = encoder.encode_prompted(&["what is an actor?"], "query: ")?.truncated(128);
/// assert_eq!(query.dim, 128);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SentenceEncoder {
    folder: ModelFolder,
    revision: ModelRevision,
    tokenizer: TextTokenizer,
    /// The folder's default prompt (none: empty), measured at load.
    default_prompt: Prompt,
    model: Bert,
    head: Head,
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
        crate::cpu_level::CpuLevel::from_env()?;
        let folder = ModelFolder::open(dir)?;
        let tokenizer = folder.tokenizer()?;
        let default_prompt =
            tokenizer
                .prompt(folder.default_prompt())
                .map_err(|e| LoadError::Tokenizer {
                    path: folder.tokenizer_path(),
                    reason: e.to_string(),
                })?;
        let path = folder.weights_path();
        let bytes = std::fs::read(&path).map_err(LoadError::io(&path))?;
        let revision = ModelRevision::of_bytes(&bytes);
        let model = Bert::from_safetensors(&folder.config, &path, &bytes, device, precision)?;
        let head = Head::load(&folder.head, device)?;
        Ok(Self {
            folder,
            revision,
            tokenizer,
            default_prompt,
            model,
            head,
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
        self.folder.output_dim()
    }

    /// The folder's configuration: pooling, modules, prompts, similarity.
    pub fn folder(&self) -> &ModelFolder {
        &self.folder
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

    /// Tokenizes a batch as [`SentenceEncoder::encode`] would: with the
    /// folder's default prompt, if it names one.
    pub fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch, TokenizeError> {
        self.tokenizer
            .tokenize_prompted(texts, &self.default_prompt)
    }

    /// `text` as a prompt (its length in tokens measured once), for
    /// [`SentenceEncoder::tokenize_prompted`].
    pub fn prompt(&self, text: &str) -> Result<Prompt, TokenizeError> {
        self.tokenizer.prompt(text)
    }

    /// Tokenizes a batch with `prompt` prepended to every text.
    pub fn tokenize_prompted(
        &self,
        texts: &[&str],
        prompt: &Prompt,
    ) -> Result<TokenBatch, TokenizeError> {
        self.tokenizer.tokenize_prompted(texts, prompt)
    }

    /// Embeds an already tokenized batch.
    pub fn encode_tokens(&self, tokens: &TokenBatch) -> Result<Embeddings, BackendError> {
        if tokens.batch == 0 {
            return Ok(Embeddings {
                dim: self.dim(),
                values: Vec::new(),
            });
        }
        let states = self.model.forward(tokens)?;
        let pooled = self
            .folder
            .pooling
            .forward(states, &tokens.mask, tokens.prompt_tokens);
        let values = self
            .head
            .forward(pooled)
            .try_into_vec_as::<f32>()
            .map_err(|e| BackendError(e.to_string()))?;
        Ok(Embeddings {
            dim: self.dim(),
            values,
        })
    }

    /// Embeds `texts` as one batch padded to its longest text, with the
    /// folder's default prompt if it names one. Padding never changes a
    /// text's vector.
    pub fn encode(&self, texts: &[&str]) -> Result<Embeddings, EncodeError> {
        let tokens = self.tokenize(texts)?;
        Ok(self.encode_tokens(&tokens)?)
    }

    /// [`SentenceEncoder::encode`] with `prompt` prepended to every text
    /// (`""`: none, whatever the folder's default).
    pub fn encode_prompted(&self, texts: &[&str], prompt: &str) -> Result<Embeddings, EncodeError> {
        let tokens = self.tokenize_prompted(texts, &self.prompt(prompt)?)?;
        Ok(self.encode_tokens(&tokens)?)
    }
}
