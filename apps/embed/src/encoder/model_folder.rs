//! A sentence-transformers model folder in Hugging Face layout, in the
//! layout of sentence-transformers 2.x/3.x (as Hub models carry it) and of
//! 5.x/6.x (as it saves today): which files must be there, what their
//! configuration says, and the model revision.
//!
//! ```text
//! DIR/modules.json                      the pipeline: Transformer, Pooling, [Dense…], [Normalize]
//! DIR/config.json                       encoder hyper-parameters (model_type bert, roberta,
//!                                       xlm-roberta or mpnet)
//! DIR/model.safetensors                 weights (checked tensor by tensor on load)
//! DIR/tokenizer.json                    Hugging Face tokenizer (WordPiece or SentencePiece)
//! DIR/sentence_bert_config.json         max_seq_length, do_lower_case (older layout)
//! DIR/tokenizer_config.json             model_max_length (newer layout)
//! DIR/config_sentence_transformers.json prompts, default_prompt_name, similarity_fn_name
//! DIR/1_Pooling/config.json             pooling modes, include_prompt
//! DIR/2_Dense/{config.json,model.safetensors}   optional projection
//! ```
//!
//! Without `modules.json` a folder is read as sentence-transformers reads a
//! bare Hugging Face model: the encoder, then `1_Pooling` if present (mean
//! pooling otherwise), and no normalisation.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::encoder::head::{DenseConfig, HeadModule};
use crate::encoder::pooling::Pooling;
pub use crate::load_error::LoadError;
use crate::load_error::read_json;

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

/// The encoder families the loader implements, by `config.json`'s
/// `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// BERT (`bert`): learned absolute positions from 0, token types.
    Bert,
    /// RoBERTa and XLM-RoBERTa (`roberta`, `xlm-roberta`): BERT's layers,
    /// positions counted from past the padding index, one token type.
    Roberta,
    /// MPNet (`mpnet`): positions as RoBERTa's, no token types, and a
    /// relative position bias shared by every layer's attention.
    MpNet,
}

impl Architecture {
    /// The `model_type` values accepted, with their family.
    pub const MODEL_TYPES: [(&'static str, Architecture); 4] = [
        ("bert", Architecture::Bert),
        ("roberta", Architecture::Roberta),
        ("xlm-roberta", Architecture::Roberta),
        ("mpnet", Architecture::MpNet),
    ];
}

/// Encoder hyper-parameters read from `config.json` (BERT and the families
/// built on its layers: see [`Architecture`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Which family the encoder is.
    pub architecture: Architecture,
    /// The padding token's id; RoBERTa and MPNet count positions from
    /// past it.
    pub pad_token_id: usize,
    /// Buckets of MPNet's relative attention bias (0 for other families).
    pub relative_attention_buckets: usize,
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

impl BertConfig {
    /// The first row of the position table used (the padding index + 1 for
    /// RoBERTa and MPNet, 0 for BERT).
    pub fn position_offset(&self) -> usize {
        match self.architecture {
            Architecture::Bert => 0,
            Architecture::Roberta | Architecture::MpNet => self.pad_token_id + 1,
        }
    }

    /// The longest sequence the position table covers.
    pub fn max_positions(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.position_offset())
    }

    /// Whether the encoder adds token-type embeddings.
    pub fn has_token_types(&self) -> bool {
        self.architecture != Architecture::MpNet
    }
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
    pad_token_id: Option<usize>,
    #[serde(default = "default_buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    position_embedding_type: Option<String>,
}

fn default_type_vocab() -> usize {
    2
}
fn default_buckets() -> usize {
    32
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".to_owned()
}

#[derive(Deserialize)]
struct RawSentenceBert {
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

#[derive(Deserialize)]
struct RawTokenizerConfig {
    model_max_length: Option<f64>,
}

#[derive(Deserialize, Default)]
struct RawSentenceTransformers {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
    similarity_fn_name: Option<String>,
}

#[derive(Deserialize)]
struct RawModule {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
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
    /// The folder of the Transformer module (the root in every layout
    /// sentence-transformers writes).
    encoder_dir: PathBuf,
    /// Encoder hyper-parameters.
    pub config: BertConfig,
    /// Longest token sequence the model reads; longer texts are truncated.
    pub max_seq_length: usize,
    /// Whether texts are lower-cased before tokenizing.
    pub do_lower_case: bool,
    /// How token states become one vector.
    pub pooling: Pooling,
    /// The modules after pooling (Dense layers, Normalize), in order.
    pub head: Vec<HeadModule>,
    /// Named prompts (`config_sentence_transformers.json`).
    pub prompts: BTreeMap<String, String>,
    /// The prompt used when none is asked for.
    pub default_prompt_name: Option<String>,
    /// The similarity function the model was trained for (`cosine`,
    /// `dot`, `euclidean`, `manhattan`), when the folder names one.
    pub similarity: Option<String>,
}

/// What is made of a model's vectors in a job: the prompt before every
/// text, and how many leading dimensions are kept (renormalised when fewer
/// than the model's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Prepended to every text (`""`: none).
    pub prompt: String,
    /// Dimensions kept.
    pub dim: usize,
}

/// The module kinds of `modules.json` this loader runs, by class name.
const MODULE_KINDS: [&str; 4] = ["Transformer", "Pooling", "Dense", "Normalize"];

impl ModelFolder {
    /// Reads and validates the configuration files of `root` and checks that
    /// the weights and tokenizer files exist.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, LoadError> {
        let root = root.as_ref().to_path_buf();
        let (encoder_dir, pooling, head) = read_modules(&root)?;
        let config = read_bert_config(&encoder_dir.join("config.json"))?;
        let sbert_path = encoder_dir.join("sentence_bert_config.json");
        let sbert: RawSentenceBert = if sbert_path.exists() {
            read_json(&sbert_path)?
        } else {
            RawSentenceBert {
                max_seq_length: None,
                do_lower_case: false,
            }
        };
        let configured = match sbert.max_seq_length {
            Some(0) => {
                return Err(LoadError::Malformed {
                    path: sbert_path,
                    reason: "max_seq_length is 0".into(),
                });
            }
            Some(n) => Some(n),
            None => {
                let path = encoder_dir.join("tokenizer_config.json");
                if path.exists() {
                    let raw: RawTokenizerConfig = read_json(&path)?;
                    // Tokenizers without a limit say 1e30.
                    raw.model_max_length
                        .filter(|n| (1.0..1e9).contains(n))
                        .map(|n| n as usize)
                } else {
                    None
                }
            }
        };
        let max_seq_length = configured
            .unwrap_or(config.max_position_embeddings)
            .min(config.max_positions());
        if max_seq_length == 0 {
            return Err(LoadError::Malformed {
                path: encoder_dir.join("config.json"),
                reason: "no position is left past the padding index".into(),
            });
        }
        let st_path = root.join("config_sentence_transformers.json");
        let st: RawSentenceTransformers = if st_path.exists() {
            read_json(&st_path)?
        } else {
            RawSentenceTransformers::default()
        };
        if let Some(name) = &st.default_prompt_name
            && !st.prompts.contains_key(name)
        {
            return Err(LoadError::Malformed {
                path: st_path,
                reason: format!("default_prompt_name {name:?} is not one of its prompts"),
            });
        }
        let folder = Self {
            root,
            encoder_dir,
            config,
            max_seq_length,
            do_lower_case: sbert.do_lower_case,
            pooling,
            head,
            prompts: st.prompts,
            default_prompt_name: st.default_prompt_name,
            similarity: st.similarity_fn_name,
        };
        folder.check_widths()?;
        for path in [folder.tokenizer_path(), folder.weights_path()] {
            std::fs::metadata(&path).map_err(|source| LoadError::Io { path, source })?;
        }
        Ok(folder)
    }

    /// Checks that each Dense module takes the width it is given.
    fn check_widths(&self) -> Result<(), LoadError> {
        let mut width = self.pooling.output_dim(self.config.hidden_size);
        for module in &self.head {
            if let HeadModule::Dense(dense) = module {
                if dense.in_features != width {
                    return Err(LoadError::Malformed {
                        path: dense.dir.join("config.json"),
                        reason: format!(
                            "in_features is {}, but the module before gives {width}",
                            dense.in_features
                        ),
                    });
                }
                width = dense.out_features;
            }
        }
        Ok(())
    }

    /// Width of the vectors the folder's pipeline produces.
    pub fn output_dim(&self) -> usize {
        self.head
            .iter()
            .rev()
            .find_map(|m| match m {
                HeadModule::Dense(d) => Some(d.out_features),
                HeadModule::Normalize => None,
            })
            .unwrap_or_else(|| self.pooling.output_dim(self.config.hidden_size))
    }

    /// Whether the pipeline ends with unit vectors.
    pub fn normalizes(&self) -> bool {
        matches!(self.head.last(), Some(HeadModule::Normalize))
    }

    /// The text of the prompt named `name`, or a refusal listing the
    /// folder's prompts.
    pub fn prompt(&self, name: &str) -> Result<&str, LoadError> {
        self.prompts
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| LoadError::Unsupported {
                path: self.root.join("config_sentence_transformers.json"),
                reason: format!(
                    "no prompt named {name:?}; the folder has {}",
                    if self.prompts.is_empty() {
                        "none".to_owned()
                    } else {
                        self.prompts.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ),
            })
    }

    /// The prompt used when none is asked for: the folder's default prompt,
    /// or none.
    pub fn default_prompt(&self) -> &str {
        self.default_prompt_name
            .as_deref()
            .and_then(|n| self.prompts.get(n))
            .map_or("", String::as_str)
    }

    /// What a job asks of the vectors, checked against the folder: a
    /// prompt as text, else one of its named prompts, else its default;
    /// and the dimensions kept (all unless `dim`).
    pub fn embed_options(
        &self,
        prompt: Option<&str>,
        prompt_name: Option<&str>,
        dim: Option<usize>,
    ) -> Result<EmbedOptions, LoadError> {
        let prompt = match (prompt, prompt_name) {
            (Some(text), _) => text.to_owned(),
            (None, Some(name)) => self.prompt(name)?.to_owned(),
            (None, None) => self.default_prompt().to_owned(),
        };
        let width = self.output_dim();
        let dim = match dim {
            None => width,
            Some(asked) if asked == 0 || asked > width => {
                return Err(LoadError::Dim { asked, width });
            }
            Some(asked) => asked,
        };
        Ok(EmbedOptions { prompt, dim })
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

    /// Path of the encoder's `model.safetensors`.
    pub fn weights_path(&self) -> PathBuf {
        self.encoder_dir.join("model.safetensors")
    }

    /// Path of `tokenizer.json`.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.encoder_dir.join("tokenizer.json")
    }

    /// The folder's tokenizer as sentence-transformers runs it: truncating
    /// to `max_seq_length`, padding with the model's pad token, lower-casing
    /// where `do_lower_case` says so.
    pub fn tokenizer(&self) -> Result<crate::TextTokenizer, LoadError> {
        crate::TextTokenizer::load_with(
            &self.tokenizer_path(),
            self.max_seq_length,
            u32::try_from(self.config.pad_token_id).ok(),
            self.do_lower_case,
        )
    }
}

/// The pipeline of `modules.json`: the encoder's folder, the pooling and
/// what follows it. Without `modules.json`, the encoder at the root, then
/// `1_Pooling` or mean pooling, and nothing after.
fn read_modules(root: &Path) -> Result<(PathBuf, Pooling, Vec<HeadModule>), LoadError> {
    let path = root.join("modules.json");
    if !path.exists() {
        let pooling_path = root.join("1_Pooling").join("config.json");
        let pooling = if pooling_path.exists() {
            Pooling::read(&pooling_path)?
        } else {
            Pooling::mean()
        };
        return Ok((root.to_path_buf(), pooling, Vec::new()));
    }
    let modules: Vec<RawModule> = read_json(&path)?;
    let unsupported = |reason: String| LoadError::Unsupported {
        path: path.clone(),
        reason,
    };
    let kind_of = |m: &RawModule| m.kind.rsplit('.').next().unwrap_or(&m.kind).to_owned();
    let mut iter = modules.iter();
    let encoder = match iter.next() {
        Some(m) if kind_of(m) == "Transformer" => root.join(&m.path),
        Some(m) => {
            return Err(unsupported(format!(
                "the first module is {}; a Transformer must come first",
                m.kind
            )));
        }
        None => return Err(unsupported("no module is listed".into())),
    };
    let pooling = match iter.next() {
        Some(m) if kind_of(m) == "Pooling" => {
            Pooling::read(&root.join(&m.path).join("config.json"))?
        }
        Some(m) => {
            return Err(unsupported(format!(
                "the module after the Transformer is {}; a Pooling module must follow it",
                m.kind
            )));
        }
        None => {
            return Err(unsupported(
                "no Pooling module follows the Transformer (token embeddings are not sentence vectors)"
                    .into(),
            ));
        }
    };
    let mut head = Vec::new();
    for m in iter {
        match kind_of(m).as_str() {
            "Dense" => head.push(HeadModule::Dense(DenseConfig::read(&root.join(&m.path))?)),
            "Normalize" => head.push(HeadModule::Normalize),
            _ => {
                return Err(unsupported(format!(
                    "module {} ({}); supported: {}",
                    m.kind,
                    m.path,
                    MODULE_KINDS.join(", ")
                )));
            }
        }
    }
    Ok((encoder, pooling, head))
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

fn read_bert_config(path: &Path) -> Result<BertConfig, LoadError> {
    let raw: RawBertConfig = read_json(path)?;
    let unsupported = |reason: String| LoadError::Unsupported {
        path: path.to_path_buf(),
        reason,
    };
    let supported = || {
        Architecture::MODEL_TYPES
            .map(|(name, _)| format!("{name:?}"))
            .join(", ")
    };
    let architecture = match raw.model_type.as_deref() {
        Some(name) => Architecture::MODEL_TYPES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                unsupported(format!(
                    "model_type is {name:?}; supported: {}",
                    supported()
                ))
            })?,
        None => {
            return Err(unsupported(format!(
                "model_type is missing; supported: {}",
                supported()
            )));
        }
    };
    let pad_token_id = match (architecture, raw.pad_token_id) {
        (_, Some(id)) => id,
        (Architecture::Bert, None) => 0,
        (_, None) => 1,
    };
    let relative_attention_buckets = match architecture {
        Architecture::MpNet => raw.relative_attention_num_buckets,
        _ => 0,
    };
    if architecture == Architecture::MpNet && relative_attention_buckets < 2 {
        return Err(LoadError::Malformed {
            path: path.to_path_buf(),
            reason: "relative_attention_num_buckets must be at least 2".into(),
        });
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
        architecture,
        pad_token_id,
        relative_attention_buckets,
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
            "sentence_bert_config.json",
            "tokenizer.json",
            "model.safetensors",
            "modules.json",
            "1_Pooling/config.json",
        ] {
            let f = Folder::new("missing");
            f.write("modules.json", MODULES);
            f.write("sentence_bert_config.json", r#"{"max_seq_length":256}"#);
            // The listed Normalize module has no files of its own.
            if file == "modules.json" {
                // A folder without modules.json still opens (a bare model).
                std::fs::remove_file(f.0.join(file)).unwrap();
                let m = ModelFolder::open(&f.0).unwrap();
                assert!(!m.normalizes(), "a bare model is not normalised");
                continue;
            }
            if file == "sentence_bert_config.json" {
                // The newer layout has none: the tokenizer's limit, else
                // the positions, bound the length.
                std::fs::remove_file(f.0.join(file)).unwrap();
                assert_eq!(ModelFolder::open(&f.0).unwrap().max_seq_length, 16);
                f.write("tokenizer_config.json", r#"{"model_max_length":12}"#);
                assert_eq!(ModelFolder::open(&f.0).unwrap().max_seq_length, 12);
                continue;
            }
            std::fs::remove_file(f.0.join(file)).unwrap();
            let err = ModelFolder::open(&f.0).unwrap_err();
            assert!(
                matches!(err, LoadError::Io { ref path, .. } if path.ends_with(file)),
                "{file}: {err}"
            );
        }
    }

    const MODULES: &str = r#"[
        {"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.base.modules.normalize.Normalize"}
    ]"#;

    #[test]
    fn modules_json_decides_the_pipeline() {
        let f = Folder::new("modules");
        f.write("modules.json", MODULES);
        let m = ModelFolder::open(&f.0).unwrap();
        assert!(m.normalizes());
        assert_eq!(m.output_dim(), 8);
        f.write(
            "modules.json",
            &MODULES.replace("Normalize\"}", "LayerNorm\"}"),
        );
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(
            matches!(err, LoadError::Unsupported { .. })
                && err.to_string().contains("LayerNorm")
                && err.to_string().contains("Dense"),
            "{err}"
        );
        // A Dense module that takes the wrong width is named.
        std::fs::create_dir_all(f.0.join("2_Dense")).unwrap();
        f.write(
            "2_Dense/config.json",
            r#"{"in_features":16,"out_features":4,"activation_function":"torch.nn.modules.activation.Tanh"}"#,
        );
        f.write("2_Dense/model.safetensors", "w");
        f.write(
            "modules.json",
            &MODULES.replace("2_Normalize", "2_Dense").replace(
                "sentence_transformers.base.modules.normalize.Normalize",
                "sentence_transformers.models.Dense",
            ),
        );
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(err.to_string().contains("in_features is 16"), "{err}");
        f.write(
            "2_Dense/config.json",
            r#"{"in_features":8,"out_features":4,"activation_function":"torch.nn.modules.activation.Softsign"}"#,
        );
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(err.to_string().contains("Softsign"), "{err}");
        f.write(
            "2_Dense/config.json",
            r#"{"in_features":8,"out_features":4,"activation_function":"torch.nn.modules.linear.Identity"}"#,
        );
        let m = ModelFolder::open(&f.0).unwrap();
        assert_eq!((m.output_dim(), m.normalizes()), (4, false));
    }

    #[test]
    fn prompts_are_read_and_unknown_names_refused() {
        let f = Folder::new("prompts");
        f.write(
            "config_sentence_transformers.json",
            r#"{"prompts":{"query":"query: ","passage":"passage: "},"default_prompt_name":"query","similarity_fn_name":"dot"}"#,
        );
        let m = ModelFolder::open(&f.0).unwrap();
        assert_eq!(m.default_prompt(), "query: ");
        assert_eq!(m.prompt("passage").unwrap(), "passage: ");
        assert_eq!(m.similarity.as_deref(), Some("dot"));
        let err = m.prompt("document").unwrap_err();
        assert!(err.to_string().contains("passage, query"), "{err}");
        f.write(
            "config_sentence_transformers.json",
            r#"{"prompts":{},"default_prompt_name":"query"}"#,
        );
        assert!(matches!(
            ModelFolder::open(&f.0),
            Err(LoadError::Malformed { .. })
        ));
    }

    #[test]
    fn every_family_opens_and_others_are_refused_by_name() {
        let f = Folder::new("families");
        for (model_type, offset) in [("roberta", 2), ("xlm-roberta", 2), ("mpnet", 2)] {
            f.write(
                "config.json",
                &CONFIG.replace("\"bert\"", &format!("{model_type:?}")),
            );
            let m = ModelFolder::open(&f.0).unwrap();
            assert_eq!(m.config.position_offset(), offset, "{model_type}");
            assert_eq!(m.max_seq_length, 14, "{model_type}: positions past padding");
        }
        f.write("config.json", &CONFIG.replace("\"bert\"", "\"deberta-v2\""));
        let err = ModelFolder::open(&f.0).unwrap_err();
        assert!(matches!(err, LoadError::Unsupported { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("deberta-v2") && text.contains("config.json") && text.contains("mpnet"),
            "{text}"
        );
    }

    #[test]
    fn unknown_pooling_is_refused() {
        let f = Folder::new("pooling");
        f.write("1_Pooling/config.json", r#"{"pooling_mode":"attention"}"#);
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
