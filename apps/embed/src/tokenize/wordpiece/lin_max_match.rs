//! WordPiece's greedy longest-match-first in one pass over each word:
//! LinMaxMatch, from "Fast WordPiece Tokenization" (Song et al., EMNLP
//! 2021).
//!
//! The vocabulary is a trie over bytes; pieces that continue a word (those
//! starting with the prefix, `##`) hang below the prefix's node, `r#`. Each
//! node `v` also holds a failure link `f(v)` and failure pops `F(v)`: when
//! the next byte has no edge from `v`, the longest-match pieces of what was
//! read so far are `F(v)`, and matching goes on from `f(v)` with the bytes
//! not yet given out. Both are computed once, breadth-first, so each byte
//! of a word is looked at a bounded number of times instead of once per
//! candidate end as in the textbook loop. The pieces are the ones the
//! textbook loop (Hugging Face tokenizers' `WordPiece`) gives: a word with
//! no tokenization, or longer than the longest word allowed, is one unknown
//! token.

use std::collections::VecDeque;

/// No node (an absent edge, a node without a failure link, a node that
/// ends no piece).
const NONE: u32 = u32::MAX;

/// A vocabulary compiled for LinMaxMatch.
#[derive(Debug, Clone)]
pub(crate) struct LinMaxMatch {
    /// Per node, its edges: `edges[first[v]..first[v + 1]]`, sorted by byte.
    first: Vec<u32>,
    edges: Vec<(u8, u32)>,
    /// The root's edges as a table.
    root_edges: [u32; 256],
    /// Per node, its failure link.
    fail: Vec<u32>,
    /// Per node, its failure pops: `pops[pop_start[v]..pop_start[v + 1]]`.
    pop_start: Vec<u32>,
    pops: Vec<u32>,
    /// The node of the continuing prefix, `r#`.
    suffix_root: u32,
    /// The unknown token's id.
    unk: u32,
    /// Words of more characters are the unknown token.
    max_chars: usize,
}

/// Why a vocabulary cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VocabError {
    /// The unknown token is not in the vocabulary.
    #[error("the unknown token {0:?} is not in the vocabulary")]
    NoUnk(String),
    /// The continuing prefix is empty.
    #[error("the continuing-subword prefix is empty")]
    NoPrefix,
}

/// The trie while it is built: edges per node, the piece each node ends.
struct Building {
    edges: Vec<Vec<(u8, u32)>>,
    token: Vec<u32>,
}

impl Building {
    fn child(&self, node: u32, byte: u8) -> u32 {
        self.edges[node as usize]
            .iter()
            .find(|&&(b, _)| b == byte)
            .map_or(NONE, |&(_, c)| c)
    }

    fn insert(&mut self, bytes: &[u8]) -> u32 {
        let mut node = 0u32;
        for &b in bytes {
            let next = self.child(node, b);
            node = if next == NONE {
                let new = self.edges.len() as u32;
                self.edges.push(Vec::new());
                self.token.push(NONE);
                self.edges[node as usize].push((b, new));
                new
            } else {
                next
            };
        }
        node
    }
}

impl LinMaxMatch {
    /// Compiles `vocab` (piece and id) with `prefix` marking pieces that
    /// continue a word, `unk` for words with no tokenization and words of
    /// more than `max_chars` characters.
    pub fn new<'a>(
        vocab: impl IntoIterator<Item = (&'a str, u32)>,
        prefix: &str,
        unk: &str,
        max_chars: usize,
    ) -> Result<Self, VocabError> {
        if prefix.is_empty() {
            return Err(VocabError::NoPrefix);
        }
        let mut t = Building {
            edges: vec![Vec::new()],
            token: vec![NONE],
        };
        let mut unk_id = None;
        for (piece, id) in vocab {
            if piece == unk {
                unk_id = Some(id);
            }
            if piece.is_empty() {
                continue;
            }
            let node = t.insert(piece.as_bytes());
            t.token[node as usize] = id;
        }
        let unk = unk_id.ok_or_else(|| VocabError::NoUnk(unk.to_owned()))?;
        let suffix_root = t.insert(prefix.as_bytes());
        let n = t.edges.len();

        // Failure links and pops, breadth-first from the root and from r#
        // together: a link always points at a node whose string (less the
        // prefix) is shorter, which is then already done.
        let mut fail = vec![NONE; n];
        let mut pops: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut queue = VecDeque::from([0u32, suffix_root]);
        while let Some(u) = queue.pop_front() {
            for &(byte, v) in &t.edges[u as usize] {
                if v == suffix_root {
                    continue;
                }
                let (vi, ui) = (v as usize, u as usize);
                if t.token[vi] != NONE {
                    fail[vi] = suffix_root;
                    pops[vi] = vec![t.token[vi]];
                } else {
                    let mut z = fail[ui];
                    let mut popped = pops[ui].clone();
                    while z != NONE && t.child(z, byte) == NONE {
                        popped.extend_from_slice(&pops[z as usize]);
                        z = fail[z as usize];
                    }
                    if z != NONE {
                        fail[vi] = t.child(z, byte);
                        pops[vi] = popped;
                    }
                }
                queue.push_back(v);
            }
        }

        let mut first = Vec::with_capacity(n + 1);
        let mut edges = Vec::new();
        for e in &mut t.edges {
            e.sort_unstable_by_key(|&(b, _)| b);
            first.push(edges.len() as u32);
            edges.extend_from_slice(e);
        }
        first.push(edges.len() as u32);
        let mut root_edges = [NONE; 256];
        for &(b, c) in &t.edges[0] {
            root_edges[b as usize] = c;
        }
        let mut pop_start = Vec::with_capacity(n + 1);
        let mut flat = Vec::new();
        for p in &pops {
            pop_start.push(flat.len() as u32);
            flat.extend_from_slice(p);
        }
        pop_start.push(flat.len() as u32);
        Ok(Self {
            first,
            edges,
            root_edges,
            fail,
            pop_start,
            pops: flat,
            suffix_root,
            unk,
            max_chars,
        })
    }

    /// The child of `node` along `byte`.
    #[inline]
    fn child(&self, node: u32, byte: u8) -> u32 {
        if node == 0 {
            return self.root_edges[byte as usize];
        }
        let (a, b) = (
            self.first[node as usize] as usize,
            self.first[node as usize + 1] as usize,
        );
        let edges = &self.edges[a..b];
        if edges.len() <= 8 {
            edges
                .iter()
                .find(|&&(e, _)| e == byte)
                .map_or(NONE, |&(_, c)| c)
        } else {
            edges
                .binary_search_by_key(&byte, |&(e, _)| e)
                .map_or(NONE, |i| edges[i].1)
        }
    }

    #[inline]
    fn pops_of(&self, node: u32) -> &[u32] {
        let (a, b) = (
            self.pop_start[node as usize] as usize,
            self.pop_start[node as usize + 1] as usize,
        );
        &self.pops[a..b]
    }

    /// Appends the pieces of `word` (non-empty, no whitespace) to `out`.
    pub fn tokenize(&self, word: &str, out: &mut Vec<u32>) {
        let start = out.len();
        let too_long = if word.is_ascii() {
            word.len() > self.max_chars
        } else {
            word.chars().count() > self.max_chars
        };
        if too_long || !self.matched(word.as_bytes(), out) {
            out.truncate(start);
            out.push(self.unk);
        }
    }

    /// Matches `word`, pushing its pieces; false where it has no
    /// tokenization (the caller drops what was pushed).
    fn matched(&self, word: &[u8], out: &mut Vec<u32>) -> bool {
        let mut u = 0u32;
        for &byte in word {
            loop {
                let v = self.child(u, byte);
                if v != NONE {
                    u = v;
                    break;
                }
                let f = self.fail[u as usize];
                if f == NONE {
                    return false;
                }
                out.extend_from_slice(self.pops_of(u));
                u = f;
            }
        }
        while u != self.suffix_root && u != 0 {
            let f = self.fail[u as usize];
            if f == NONE {
                return false;
            }
            out.extend_from_slice(self.pops_of(u));
            u = f;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// The textbook loop (what Hugging Face tokenizers runs): at each
    /// start, the longest piece; a word with a position no piece starts
    /// at is the unknown token.
    fn max_match(vocab: &HashMap<String, u32>, word: &str, unk: u32, max: usize) -> Vec<u32> {
        if word.chars().count() > max {
            return vec![unk];
        }
        let mut out = Vec::new();
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len();
            let mut found = None;
            while start < end {
                let sub = &word[start..end];
                let key = if start > 0 {
                    format!("##{sub}")
                } else {
                    sub.to_owned()
                };
                if let Some(&id) = vocab.get(&key) {
                    found = Some(id);
                    break;
                }
                end -= sub.chars().last().map_or(1, char::len_utf8);
            }
            match found {
                Some(id) => out.push(id),
                None => return vec![unk],
            }
            start = end;
        }
        out
    }

    fn compile(pieces: &[&str]) -> (HashMap<String, u32>, LinMaxMatch) {
        let mut vocab: HashMap<String, u32> = HashMap::new();
        vocab.insert("[UNK]".into(), 0);
        for p in pieces {
            let id = vocab.len() as u32;
            vocab.entry((*p).to_owned()).or_insert(id);
        }
        let m = LinMaxMatch::new(
            vocab.iter().map(|(k, v)| (k.as_str(), *v)),
            "##",
            "[UNK]",
            12,
        )
        .unwrap();
        (vocab, m)
    }

    fn run(m: &LinMaxMatch, word: &str) -> Vec<u32> {
        let mut out = vec![999];
        m.tokenize(word, &mut out);
        out.remove(0);
        out
    }

    #[test]
    fn the_paper_s_example_and_the_edges_match_the_textbook_loop() {
        let (vocab, m) = compile(&["a", "abcdx", "##b", "##c", "##cdy", "##dz", "#", "é", "##é"]);
        for word in [
            "abcdz",
            "a",
            "ab",
            "abc",
            "abcd",
            "abcdx",
            "abcdy",
            "abcdxa",
            "b",
            "#",
            "aé",
            "éé",
            "abcdefghijklm",
            "aaaa",
        ] {
            assert_eq!(run(&m, word), max_match(&vocab, word, 0, 12), "{word}");
        }
        assert_eq!(
            run(&m, "abcdz"),
            [vocab["a"], vocab["##b"], vocab["##c"], vocab["##dz"]]
        );
    }

    #[test]
    fn a_vocabulary_without_its_unknown_token_is_refused() {
        let err = LinMaxMatch::new([("a", 1)], "##", "[UNK]", 100).unwrap_err();
        assert_eq!(err, VocabError::NoUnk("[UNK]".into()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// Over random vocabularies of short pieces on a small alphabet
        /// (so that words share many prefixes and suffixes, and some fail),
        /// every word gives the textbook loop's pieces.
        #[test]
        fn any_vocabulary_and_word_give_the_textbook_pieces(
            pieces in proptest::collection::vec("(##)?[abcé]{1,4}", 1..40),
            words in proptest::collection::vec("[abcéd]{1,14}", 1..40),
        ) {
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (vocab, m) = compile(&refs);
            for word in &words {
                prop_assert_eq!(run(&m, word), max_match(&vocab, word, 0, 12), "{}", word);
            }
        }
    }
}
