//! # Room `tokenize/`: text to token ids
//!
//! Owns the folder's tokenizer (this file: the Hugging Face wrapper,
//! prompts, truncation, padding) and the WordPiece tokenizer beside it
//! ([`wordpiece`]).
//!
//! May import: the shared files only.
//!
//! Tokenization as sentence-transformers does it: the folder's
//! `tokenizer.json` (WordPiece or SentencePiece), lower-casing where the
//! folder asks for it, a prompt prepended to every text, truncation to
//! `max_seq_length`, and padding per batch to the longest sequence in that
//! batch.
//!
//! A `tokenizer.json` that is a plain BERT WordPiece runs on our own
//! tokenizer ([`crate::tokenize::wordpiece`]), which gives the same ids several
//! times faster; every other one runs on Hugging Face tokenizers.

pub mod wordpiece;

use std::path::Path;

use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

use crate::load_error::LoadError;
use crate::tokenize::wordpiece::{FastWordPiece, Scratch, Token};

/// Why a batch of texts could not be tokenized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// The tokenizer library refused the input.
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
}

/// A padded batch of token ids, row-major `[batch, seq_len]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Number of texts.
    pub batch: usize,
    /// Length of the longest text in tokens; every row is padded to it.
    pub seq_len: usize,
    /// Token ids, `batch * seq_len`.
    pub ids: Vec<i64>,
    /// Token type ids, `batch * seq_len`.
    pub type_ids: Vec<i64>,
    /// 1 for a real token, 0 for padding, `batch * seq_len`.
    pub mask: Vec<i64>,
    /// Tokens at the start of every row that are the prompt's (its special
    /// start token included, as sentence-transformers counts them); 0
    /// without a prompt.
    pub prompt_tokens: usize,
}

impl TokenBatch {
    /// The ids of row `i` without its padding.
    pub fn row_ids(&self, i: usize) -> Vec<i64> {
        let start = i * self.seq_len;
        let row = &self.ids[start..start + self.seq_len];
        let mask = &self.mask[start..start + self.seq_len];
        row.iter()
            .zip(mask)
            .filter(|&(_, m)| *m == 1)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Number of real (unpadded) tokens in the whole batch.
    pub fn real_tokens(&self) -> usize {
        self.mask.iter().filter(|m| **m == 1).count()
    }
}

/// A prompt put before every text, with its length in tokens as
/// sentence-transformers counts it (what pooling leaves out when the folder
/// says `include_prompt: false`), measured once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    text: String,
    tokens: usize,
}

impl Prompt {
    /// The prompt's text (`""`: no prompt).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its tokens, its special start token included, a trailing special
    /// token not.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// A configured tokenizer: Hugging Face tokenizers, or our own WordPiece
/// where the folder's tokenizer is a plain BERT WordPiece.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    fast: Option<FastWordPiece>,
    pad_id: u32,
    lowercase: bool,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").finish_non_exhaustive()
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` and overrides whatever padding and truncation it
    /// bakes in: truncation to `max_len` tokens, padding to the longest
    /// sequence of each batch.
    pub fn load(path: &Path, max_len: usize) -> Result<Self, LoadError> {
        Self::load_with(path, max_len, None, false)
    }

    /// [`TextTokenizer::load`] padding with `pad_id` when the tokenizer
    /// names no padding of its own (the model's `pad_token_id`), and
    /// lower-casing every text first when `lowercase` is set.
    pub fn load_with(
        path: &Path,
        max_len: usize,
        pad_id: Option<u32>,
        lowercase: bool,
    ) -> Result<Self, LoadError> {
        let err = |reason: String| LoadError::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        let mut inner = Tokenizer::from_file(path).map_err(|e| err(e.to_string()))?;
        let (pad_id, pad_token) = match (inner.get_padding(), pad_id) {
            (Some(p), _) => (p.pad_id, p.pad_token.clone()),
            (None, Some(id)) => (id, inner.id_to_token(id).unwrap_or_default()),
            (None, None) => {
                let token = "[PAD]".to_owned();
                let id = inner.token_to_id(&token).unwrap_or(0);
                (id, token)
            }
        };
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| err(e.to_string()))?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id: 0,
            pad_token,
        }));
        let fast = FastWordPiece::from_tokenizer(&inner, max_len);
        Ok(Self {
            inner,
            fast,
            pad_id,
            lowercase,
        })
    }

    /// Whether texts run on our own WordPiece rather than Hugging Face
    /// tokenizers.
    pub fn is_fast_wordpiece(&self) -> bool {
        self.fast.is_some()
    }

    /// The same tokenizer, always on Hugging Face tokenizers (what our own
    /// WordPiece is checked against).
    pub fn on_hugging_face(&self) -> Self {
        Self {
            fast: None,
            ..self.clone()
        }
    }

    /// Tokenizes a batch, adding the special tokens (`[CLS]`, `[SEP]`).
    pub fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch, TokenizeError> {
        self.tokenize_prompted(texts, &Prompt::default())
    }

    /// `text` as a prompt of this tokenizer, its length measured.
    pub fn prompt(&self, text: &str) -> Result<Prompt, TokenizeError> {
        Ok(Prompt {
            text: text.to_owned(),
            tokens: if text.is_empty() {
                0
            } else {
                self.prompt_tokens(text)?
            },
        })
    }

    /// Tokenizes a batch with `prompt` prepended to every text, as
    /// sentence-transformers does, recording how many tokens of each row
    /// are the prompt's.
    pub fn tokenize_prompted(
        &self,
        texts: &[&str],
        prompt: &Prompt,
    ) -> Result<TokenBatch, TokenizeError> {
        let (prompt, prompt_tokens) = (prompt.text(), prompt.tokens());
        if let Some(fast) = &self.fast {
            return Ok(self.tokenize_fast(fast, texts, prompt, prompt_tokens));
        }
        // The texts as given when nothing is added to them: no copy.
        let encodings = if prompt.is_empty() && !self.lowercase {
            self.inner.encode_batch(texts.to_vec(), true)
        } else {
            let inputs: Vec<String> = texts.iter().map(|t| self.input(prompt, t)).collect();
            self.inner.encode_batch(inputs, true)
        }
        .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let batch = encodings.len();
        let seq_len = encodings.first().map_or(0, |e| e.len());
        let mut ids = Vec::with_capacity(batch * seq_len);
        let mut type_ids = Vec::with_capacity(batch * seq_len);
        let mut mask = Vec::with_capacity(batch * seq_len);
        for enc in &encodings {
            debug_assert_eq!(enc.len(), seq_len, "batch-longest padding");
            ids.extend(enc.get_ids().iter().map(|&v| i64::from(v)));
            type_ids.extend(enc.get_type_ids().iter().map(|&v| i64::from(v)));
            mask.extend(enc.get_attention_mask().iter().map(|&v| i64::from(v)));
        }
        Ok(TokenBatch {
            batch,
            seq_len,
            ids,
            type_ids,
            mask,
            prompt_tokens,
        })
    }

    /// [`TextTokenizer::tokenize_prompted`] on our own WordPiece.
    fn tokenize_fast(
        &self,
        fast: &FastWordPiece,
        texts: &[&str],
        prompt: &str,
        prompt_tokens: usize,
    ) -> TokenBatch {
        let mut scratch = Scratch::default();
        let mut tokens: Vec<Token> = Vec::new();
        let mut row = Vec::new();
        let mut ends = Vec::with_capacity(texts.len());
        let mut seq_len = 0;
        for text in texts {
            if prompt.is_empty() && !self.lowercase {
                fast.encode(text, &mut row, &mut scratch);
            } else {
                fast.encode(&self.input(prompt, text), &mut row, &mut scratch);
            }
            seq_len = seq_len.max(row.len());
            tokens.extend_from_slice(&row);
            ends.push(tokens.len());
        }
        let batch = texts.len();
        let mut ids = vec![i64::from(self.pad_id); batch * seq_len];
        let mut type_ids = vec![0i64; batch * seq_len];
        let mut mask = vec![0i64; batch * seq_len];
        let mut start = 0;
        for (r, &end) in ends.iter().enumerate() {
            let at = r * seq_len;
            for (j, &Token { id, type_id }) in tokens[start..end].iter().enumerate() {
                ids[at + j] = i64::from(id);
                type_ids[at + j] = i64::from(type_id);
                mask[at + j] = 1;
            }
            start = end;
        }
        TokenBatch {
            batch,
            seq_len,
            ids,
            type_ids,
            mask,
            prompt_tokens,
        }
    }

    /// The text the tokenizer is given: the prompt and the text, lower-cased
    /// when the folder says so.
    fn input(&self, prompt: &str, text: &str) -> String {
        let joined = format!("{prompt}{text}");
        if self.lowercase {
            joined.to_lowercase()
        } else {
            joined
        }
    }

    /// Tokens of `prompt` alone with the special tokens, less a special
    /// token at its end (sentence-transformers' prompt length).
    fn prompt_tokens(&self, prompt: &str) -> Result<usize, TokenizeError> {
        let enc = self
            .inner
            .encode(self.input(prompt, ""), true)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let ends_special = enc.get_special_tokens_mask().last() == Some(&1);
        Ok(enc.len() - usize::from(ends_special))
    }

    /// Number of tokens `text` becomes (special tokens included, truncated),
    /// by the same tokenizer as [`TextTokenizer::tokenize`]. Used to sort
    /// texts by length before batching.
    pub fn token_count(&self, text: &str) -> Result<usize, TokenizeError> {
        Ok(self.tokenize(&[text])?.seq_len)
    }
}
