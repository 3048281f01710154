//! A BERT WordPiece tokenizer of our own, giving the ids Hugging Face
//! tokenizers gives for a `tokenizer.json` that is a plain BERT WordPiece:
//! a `BertNormalizer`, the `BertPreTokenizer`, a `WordPiece` model and a
//! post-processor that puts special tokens around the text (BERT's
//! `[CLS] … [SEP]`), with added tokens matched as they are written. Any
//! other `tokenizer.json` is left to Hugging Face tokenizers.
//!
//! ```text
//! text ─► added tokens ([CLS], [MASK], …) cut out as written
//!      ─► the rest normalised (normalize.rs) ─► words ─► LinMaxMatch pieces
//!      ─► truncated to the model's length less the special tokens ─► wrapped
//! ```
//!
//! It does what the tokenizer library does in a fraction of the time: no
//! offsets kept per character, no string per piece, one pass over each
//! word (see [`lin_max_match`]), and a text's words stop being read once
//! the pieces fill the model's length.

mod lin_max_match;
mod normalize;

use tokenizers::{
    ModelWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer,
};

use lin_max_match::LinMaxMatch;
use normalize::{BertNormalizer, words};

/// A compiled BERT WordPiece tokenizer (see the module documentation).
#[derive(Debug, Clone)]
pub struct FastWordPiece {
    normalizer: BertNormalizer,
    pieces: LinMaxMatch,
    /// Tokens written into texts that stand for themselves, longest first.
    added: Vec<(String, u32)>,
    /// Whether a byte starts an added token.
    added_first: [bool; 256],
    /// Special tokens before the text and after it, with their type ids.
    before: Vec<Token>,
    after: Vec<Token>,
    /// The text's type id.
    type_id: u32,
    /// Tokens at most, special tokens included.
    max_len: usize,
}

/// One token of a text: its id and type id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// Its id in the vocabulary.
    pub id: u32,
    /// Its token type id.
    pub type_id: u32,
}

impl FastWordPiece {
    /// The tokenizer `tokenizer` describes, truncating to `max_len` tokens
    /// (special tokens included); `None` where it is not a plain BERT
    /// WordPiece (then Hugging Face tokenizers runs it).
    pub fn from_tokenizer(tokenizer: &Tokenizer, max_len: usize) -> Option<Self> {
        let Some(NormalizerWrapper::BertNormalizer(n)) = tokenizer.get_normalizer() else {
            return None;
        };
        let Some(PreTokenizerWrapper::BertPreTokenizer(_)) = tokenizer.get_pre_tokenizer() else {
            return None;
        };
        let ModelWrapper::WordPiece(model) = tokenizer.get_model() else {
            return None;
        };
        if !matches!(
            tokenizer.get_post_processor(),
            Some(PostProcessorWrapper::Bert(_) | PostProcessorWrapper::Template(_))
        ) {
            return None;
        }
        let normalizer = BertNormalizer {
            clean_text: n.clean_text,
            handle_chinese_chars: n.handle_chinese_chars,
            strip_accents: n.strip_accents.unwrap_or(n.lowercase),
            lowercase: n.lowercase,
        };
        let vocab = tokenizer.get_vocab(false);
        let pieces = LinMaxMatch::new(
            vocab.iter().map(|(k, v)| (k.as_str(), *v)),
            &model.continuing_subword_prefix,
            &model.unk_token,
            model.max_input_chars_per_word,
        )
        .ok()?;
        // Added tokens are matched in the text as written only.
        let mut added = Vec::new();
        for (id, token) in tokenizer.get_added_tokens_decoder() {
            if token.normalized || token.lstrip || token.rstrip || token.single_word {
                return None;
            }
            if !token.content.is_empty() {
                added.push((token.content.clone(), id));
            }
        }
        added.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        let mut added_first = [false; 256];
        for (content, _) in &added {
            added_first[content.as_bytes()[0] as usize] = true;
        }
        // Where the special tokens go, as the post-processor places them
        // around a text of one ordinary piece.
        let probe = vocab
            .iter()
            .filter(|(k, _)| k.len() == 1 && k.as_bytes()[0].is_ascii_lowercase())
            .map(|(k, _)| k.as_str())
            .min()?;
        let encoding = tokenizer.encode(probe, true).ok()?;
        let (ids, types, special) = (
            encoding.get_ids(),
            encoding.get_type_ids(),
            encoding.get_special_tokens_mask(),
        );
        let at = special.iter().position(|&s| s == 0)?;
        if special[at + 1..].contains(&0) {
            return None;
        }
        let around = |range: std::ops::Range<usize>| -> Vec<Token> {
            range
                .map(|i| Token {
                    id: ids[i],
                    type_id: types[i],
                })
                .collect()
        };
        Some(Self {
            normalizer,
            pieces,
            added,
            added_first,
            before: around(0..at),
            after: around(at + 1..ids.len()),
            type_id: types[at],
            max_len,
        })
    }

    /// The tokens of `text`, special tokens included, truncated to the
    /// model's length, into `out` (cleared first). `scratch` holds the
    /// normalised text between calls.
    pub fn encode(&self, text: &str, out: &mut Vec<Token>, scratch: &mut Scratch) {
        out.clear();
        let room = self
            .max_len
            .saturating_sub(self.before.len() + self.after.len());
        let ids = &mut scratch.ids;
        ids.clear();
        let mut rest = text;
        while !rest.is_empty() && ids.len() < room {
            let (plain, token, tail) = self.next_added(rest);
            if !plain.is_empty() {
                self.normalizer.normalize(plain, &mut scratch.normalized);
                for word in words(&scratch.normalized) {
                    self.pieces.tokenize(word, ids);
                    if ids.len() >= room {
                        break;
                    }
                }
            }
            if let Some(id) = token {
                ids.push(id);
            }
            rest = tail;
        }
        ids.truncate(room);
        out.extend_from_slice(&self.before);
        out.extend(ids.iter().map(|&id| Token {
            id,
            type_id: self.type_id,
        }));
        out.extend_from_slice(&self.after);
    }

    /// `text` cut at its first added token: the plain text before it, the
    /// token's id, the text after it (leftmost match, longest there).
    fn next_added<'t>(&self, text: &'t str) -> (&'t str, Option<u32>, &'t str) {
        let bytes = text.as_bytes();
        if !self.added.is_empty() {
            for (i, &b) in bytes.iter().enumerate() {
                if !self.added_first[b as usize] {
                    continue;
                }
                if let Some((content, id)) = self
                    .added
                    .iter()
                    .find(|(c, _)| bytes[i..].starts_with(c.as_bytes()))
                {
                    return (&text[..i], Some(*id), &text[i + content.len()..]);
                }
            }
        }
        (text, None, "")
    }
}

/// Buffers [`FastWordPiece::encode`] reuses between texts.
#[derive(Debug, Default)]
pub struct Scratch {
    normalized: String,
    ids: Vec<u32>,
}
