//! A sentence-transformers model folder in Hugging Face layout: which files
//! must be there, what their configuration says, and the model revision.
//!
//! ```text
//! DIR/config.json                  BERT hyper-parameters (model_type "bert")
//! DIR/model.safetensors            weights (checked tensor by tensor on load)
//! DIR/tokenizer.json               Hugging Face tokenizer
//! DIR/sentence_bert_config.json    max_seq_length
//! DIR/1_Pooling/config.json        pooling mode (mean pooling is required)
//! ```

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

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
    #[error("unexpected tensor {name} in {path}: not part of a BERT encoder")]
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

/// The activation function of the feed-forward blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU (`erf` form), Hugging Face's `gelu`.
    Gelu,
    /// Tanh-approximated GELU (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// ReLU.
    Relu,
}

/// BERT hyper-parameters read from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Number of token ids.
    pub vocab_size: usize,
    /// Width of every hidden state (the embedding dimension).
    pub hidden_size: usize,
    /// Number of encoder layers.
    pub num_hidden_layers: usize,
    /// Number of attention heads per layer.
    pub num_attention_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Number of learned positions.
    pub max_position_embeddings: usize,
    /// Number of token types (segments).
    pub type_vocab_size: usize,
    /// Layer-norm epsilon (1e-12 in BERT).
    pub layer_norm_eps: f64,
    /// Feed-forward activation.
    pub activation: Activation,
}

#[derive(Deserialize)]
struct RawBertConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    type_vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    position_embedding_type: Option<String>,
}

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".to_owned()
}

#[derive(Deserialize)]
struct RawPooling {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize)]
struct RawSentenceBert {
    max_seq_length: usize,
}

/// A stable identity of a model's weights: the SHA-256 of `model.safetensors`.
///
/// Every embedding result carries it, so a job can refuse vectors that came
/// from different weights.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRevision(String);

impl ModelRevision {
    /// Wraps a revision string as produced by [`ModelRevision::as_str`].
    pub fn new(revision: impl Into<String>) -> Self {
        Self(revision.into())
    }

    /// The revision of weights held in memory.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::from_digest(&Sha256::digest(bytes))
    }

    fn from_digest(digest: &[u8]) -> Self {
        let mut hex = String::with_capacity(7 + 2 * digest.len());
        hex.push_str("sha256:");
        for byte in digest {
            hex.push_str(&format!("{byte:02x}"));
        }
        Self(hex)
    }

    /// The revision as `sha256:<64 hex digits>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for logs and default job ids.
    pub fn short(&self) -> &str {
        let hex = self.0.strip_prefix("sha256:").unwrap_or(&self.0);
        &hex[..hex.len().min(12)]
    }
}

impl fmt::Display for ModelRevision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated model folder: configuration parsed, files present, revision
/// computed. Loading the weights is [`crate::SentenceEncoder::load`]'s job.
#[derive(Debug, Clone)]
pub struct ModelFolder {
    root: PathBuf,
    /// BERT hyper-parameters.
    pub config: BertConfig,
    /// Longest token sequence the model reads; longer texts are truncated.
    pub max_seq_length: usize,
}

impl ModelFolder {
    /// Reads and validates the configuration files of `root` and checks that
    /// the weights and tokenizer files exist.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, LoadError> {
        let root = root.as_ref().to_path_buf();
        let config = read_bert_config(&root.join("config.json"))?;
        read_pooling(&root.join("1_Pooling").join("config.json"))?;
        let sbert_path = root.join("sentence_bert_config.json");
        let sbert: RawSentenceBert = read_json(&sbert_path)?;
        if sbert.max_seq_length == 0 {
            return Err(LoadError::Malformed {
                path: sbert_path,
                reason: "max_seq_length is 0".into(),
            });
        }
        let max_seq_length = sbert.max_seq_length.min(config.max_position_embeddings);
        for file in ["tokenizer.json", "model.safetensors"] {
            let path = root.join(file);
            std::fs::metadata(&path).map_err(|source| LoadError::Io { path, source })?;
        }
        Ok(Self {
            root,
            config,
            max_seq_length,
        })
    }

    /// Hashes `model.safetensors` (about 0.3 s for MiniLM's 90 MB) without
    /// loading the model: what a driver that hosts no model compares its
    /// workers' revisions against.
    pub fn revision(&self) -> Result<ModelRevision, LoadError> {
        let path = self.weights_path();
        let digest = sha256_file(&path).map_err(|source| LoadError::Io { path, source })?;
        Ok(ModelRevision::from_digest(&digest))
    }

    /// The folder itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Path of `model.safetensors`.
    pub fn weights_path(&self) -> PathBuf {
        self.root.join("model.safetensors")
    }

    /// Path of `tokenizer.json`.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.root.join("tokenizer.json")
    }
}

/// SHA-256 of a file, read in 1 MiB blocks.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let bytes = std::fs::read(path).map_err(LoadError::io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| LoadError::Malformed {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn read_bert_config(path: &Path) -> Result<BertConfig, LoadError> {
    let raw: RawBertConfig = read_json(path)?;
    let unsupported = |reason: String| LoadError::Unsupported {
        path: path.to_path_buf(),
        reason,
    };
    match raw.model_type.as_deref() {
        Some("bert") => {}
        Some(other) => {
            return Err(unsupported(format!(
                "model_type is {other:?}; this encoder implements \"bert\""
            )));
        }
        None => return Err(unsupported("model_type is missing".into())),
    }
    if let Some(kind) = raw.position_embedding_type.as_deref()
        && kind != "absolute"
    {
        return Err(unsupported(format!(
            "position_embedding_type {kind:?}; only \"absolute\" is implemented"
        )));
    }
    let activation = match raw.hidden_act.as_str() {
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        "relu" => Activation::Relu,
        other => return Err(unsupported(format!("hidden_act {other:?}"))),
    };
    let sizes = [
        ("vocab_size", raw.vocab_size),
        ("hidden_size", raw.hidden_size),
        ("num_hidden_layers", raw.num_hidden_layers),
        ("num_attention_heads", raw.num_attention_heads),
        ("intermediate_size", raw.intermediate_size),
        ("max_position_embeddings", raw.max_position_embeddings),
        ("type_vocab_size", raw.type_vocab_size),
    ];
    if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
        return Err(LoadError::Malformed {
            path: path.to_path_buf(),
            reason: format!("{name} is 0"),
        });
    }
    if !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
        return Err(LoadError::Malformed {
            path: path.to_path_buf(),
            reason: format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                raw.hidden_size, raw.num_attention_heads
            ),
        });
    }
    Ok(BertConfig {
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: raw.num_attention_heads,
        intermediate_size: raw.intermediate_size,
        max_position_embeddings: raw.max_position_embeddings,
        type_vocab_size: raw.type_vocab_size,
        layer_norm_eps: raw.layer_norm_eps,
        activation,
    })
}

fn read_pooling(path: &Path) -> Result<(), LoadError> {
    let raw: RawPooling = read_json(path)?;
    let others = raw.pooling_mode_cls_token
        || raw.pooling_mode_max_tokens
        || raw.pooling_mode_mean_sqrt_len_tokens
        || raw.pooling_mode_weightedmean_tokens
        || raw.pooling_mode_lasttoken;
    if !raw.pooling_mode_mean_tokens || others {
        return Err(LoadError::Unsupported {
            path: path.to_path_buf(),
            reason: "only mean pooling (pooling_mode_mean_tokens alone) is implemented".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"{"model_type":"bert","vocab_size":11,"hidden_size":8,
        "num_hidden_layers":1,"num_attention_heads":2,"intermediate_size":12,
        "max_position_embeddings":16,"type_vocab_size":2,"layer_norm_eps":1e-12,
        "hidden_act":"gelu"}"#;

    struct Folder(PathBuf);

    impl Folder {
        fn new(tag: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("flotilla-model-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
            let f = Self(dir);
            f.write("config.json", CONFIG);
            f.write(
                "1_Pooling/config.json",
                r#"{"pooling_mode_mean_tokens":true}"#,
            );
            f.write("sentence_bert_config.json", r#"{"max_seq_length":256}"#);
            f.write("tokenizer.json", "{}");
            f.write("model.safetensors", "weights");
            f
        }
        fn write(&self, name: &str, body: &str) {
            std::fs::write(self.0.join(name), body).unwrap();
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn valid_folder_opens_and_caps_length_at_positions() {
        let f = Folder::new("ok");
        let m = ModelFolder::open(&f.0).unwrap();
        assert_eq!(m.config.hidden_size, 8);
        assert_eq!(m.max_seq_length, 16, "capped by max_position_embeddings");
        assert_eq!(m.revision().unwrap(), ModelRevision::of_bytes(b"weights"));
    }

    #[test]
    fn missing_file_is_named() {
        for file in [
            "config.json",
            "1_Pooling/config.json",
            "sentence_bert_config.json",
            "tokenizer.json",
            "model.safetensors",
        ] {
            let f = Folder::new("missing");
            std::fs::remove_file(f.0.join(file)).unwrap();
            let err = ModelFolder::open(&f.0).unwrap_err();
            assert!(
                matches!(err, LoadError::Io { ref path, .. } if path.ends_with(file)),
                "{file}: {err}"
            );
        }
    }

    #[test]
    fn other_architecture_is_refused() {
        let f = Folder::new("roberta");
        f.write("config.json", &CONFIG.replace("\"bert\"", "\"roberta\""));
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(matches!(err, LoadError::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("roberta") && err.to_string().contains("config.json"));
    }

    #[test]
    fn non_mean_pooling_is_refused() {
        let f = Folder::new("cls");
        f.write(
            "1_Pooling/config.json",
            r#"{"pooling_mode_cls_token":true}"#,
        );
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(
            matches!(err, LoadError::Unsupported { ref path, .. } if path.ends_with("1_Pooling/config.json")),
            "{err}"
        );
    }

    #[test]
    fn malformed_json_is_named() {
        let f = Folder::new("malformed");
        f.write("sentence_bert_config.json", "{not json");
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(
            matches!(err, LoadError::Malformed { ref path, .. } if path.ends_with("sentence_bert_config.json")),
            "{err}"
        );
    }

    #[test]
    fn heads_must_divide_hidden_size() {
        let f = Folder::new("heads");
        f.write(
            "config.json",
            &CONFIG.replace("\"num_attention_heads\":2", "\"num_attention_heads\":3"),
        );
        assert!(matches!(
            ModelFolder::open(&f.0),
            Err(LoadError::Malformed { .. })
        ));
    }
}
