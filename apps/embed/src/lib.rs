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

pub mod actor;
mod attention;
mod bert;
pub mod convert;
pub mod cpu_level;
pub mod devices;
mod encoder;
mod fast_gelu;
pub mod head;
pub mod int8_gemm;
pub mod job;
mod load_error;
pub mod model_folder;
pub mod pooling;
mod precision;
mod quantized;
mod shared_models;
pub mod tokenize;
mod weights;
pub mod wordpiece;

pub use bert::{BackendError, Bert};
/// Burn's device handle, as the encoder takes it.
pub use burn::tensor::Device;
pub use convert::{Converted, convert_folder};
pub use cpu_level::{CpuLevel, UnknownCpuLevel};
pub use devices::{DeviceChoice, cpu_device, cuda_devices};
pub use encoder::{Embeddings, EncodeError, SentenceEncoder, default_device};
pub use model_folder::{
    Architecture, BertConfig, EmbedOptions, LoadError, ModelFolder, ModelRevision,
};
pub use pooling::{Pooling, PoolingMode};
pub use precision::{Precision, UnknownPrecision};
pub use shared_models::SharedModels;
pub use tokenize::{Prompt, TextTokenizer, TokenBatch, TokenizeError};
