//! Sentence embeddings in Burn.
//!
//! BERT-family encoders (BERT, RoBERTa and XLM-RoBERTa, MPNet), their
//! tokenizers, every pooling mode of sentence-transformers, its Dense and
//! Normalize modules and prompts, loaded from a sentence-transformers folder
//! in Hugging Face layout and matching sentence-transformers' vectors.
//!
//! ```text
//! texts ─► TextTokenizer (prompt, truncate to max_seq_length, pad to batch longest)
//!       ─► Bert (Burn: flex CPU backend by default, CUDA with `cuda`)
//!       ─► Pooling (cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken)
//!       ─► [Dense…] [Normalize] ─► Embeddings { dim, values } (+ truncated to --dim)
//!       + ModelRevision (sha256 of the weights)
//! ```
//!
//! Guarantees: a text's vector does not depend on the batch it is encoded in
//! beyond floating-point rounding; every error names the file or tensor at
//! fault.

// The rooms: each a folder whose mod.rs opens with its map.
//
// - `tokenize/`: text to token ids (the folder's Hugging Face tokenizer,
//   and the WordPiece beside it that gives the same ids faster); imports
//   the shared files only.
// - `encoder/`: token ids to vectors: the model folder and what it names,
//   one file per model family (`bert`: BERT, RoBERTa, XLM-RoBERTa, MPNet)
//   and the shared layers (attention, GELU, pooling, the Dense head,
//   weights, the int8 kernels and their one `unsafe` instruction); imports
//   `tokenize` and the shared files.
// - `actor` (a file): the embedding actor on a node; imports `encoder`.
// - `job/`: the embed job on the data layer; imports `actor` and
//   `encoder`.
//
// Shared files: `load_error` (what a folder can get wrong), `cpu_level`,
// `devices`, `shared_models`.
pub mod actor;
pub mod cpu_level;
pub mod devices;
pub mod encoder;
pub mod job;
mod load_error;
mod shared_models;
pub mod tokenize;

// Module paths of the flat layout.
pub use encoder::{convert, head, int8_gemm, model_folder, pooling};
pub use tokenize::wordpiece;

/// Burn's device handle, as the encoder takes it.
pub use burn::tensor::Device;
pub use convert::{Converted, convert_folder};
pub use cpu_level::{CpuLevel, UnknownCpuLevel};
pub use devices::{DeviceChoice, cpu_device, cuda_devices};
pub use encoder::bert::{BackendError, Bert};
pub use encoder::precision::{Precision, UnknownPrecision};
pub use encoder::{Embeddings, EncodeError, SentenceEncoder, default_device};
pub use model_folder::{
    Architecture, BertConfig, EmbedOptions, LoadError, ModelFolder, ModelRevision,
};
pub use pooling::{Pooling, PoolingMode};
pub use shared_models::SharedModels;
pub use tokenize::{Prompt, TextTokenizer, TokenBatch, TokenizeError};
