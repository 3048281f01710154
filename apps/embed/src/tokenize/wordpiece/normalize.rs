//! BERT's normalisation and word splitting, with the results of Hugging
//! Face tokenizers' `BertNormalizer` followed by its `BertPreTokenizer`.
//!
//! The normaliser runs its four steps in Hugging Face's order: control
//! characters dropped and whitespace made a space, a space either side of
//! every CJK ideograph, accents stripped (NFD, then the non-spacing marks
//! dropped), lower-casing char by char. The splitter then cuts at
//! whitespace (dropped) and around punctuation (kept, one character a
//! word). The Unicode tables are the ones Hugging Face tokenizers uses
//! (`unicode_categories`, `unicode-normalization-alignments`), so both agree
//! on every character. ASCII texts take a path of their own with the same
//! result.

use unicode_categories::UnicodeCategories;
use unicode_normalization_alignments::UnicodeNormalization;

/// The settings of a `BertNormalizer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BertNormalizer {
    /// Drop control characters, make whitespace a space.
    pub clean_text: bool,
    /// Put a space either side of every CJK ideograph.
    pub handle_chinese_chars: bool,
    /// Strip accents (NFD, non-spacing marks dropped).
    pub strip_accents: bool,
    /// Lower-case every character.
    pub lowercase: bool,
}

/// Whitespace as BERT's cleaning sees it.
fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// Control characters as BERT's cleaning sees them (Cc, Cf, Co; not tab,
/// newline or carriage return).
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

/// The CJK ideograph blocks BERT puts spaces around.
fn is_chinese_char(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// Punctuation as BERT's splitter sees it: ASCII punctuation and every
/// Unicode punctuation category.
pub(crate) fn is_punctuation(c: char) -> bool {
    // Within ASCII, every Unicode punctuation character is ASCII
    // punctuation: the tables are not looked up.
    if c.is_ascii() {
        c.is_ascii_punctuation()
    } else {
        c.is_punctuation()
    }
}

impl BertNormalizer {
    /// `text` normalised into `out` (cleared first).
    pub fn normalize(&self, text: &str, out: &mut String) {
        out.clear();
        if text.is_ascii() {
            self.normalize_ascii(text.as_bytes(), out);
        } else {
            self.normalize_unicode(text, out);
        }
    }

    /// The ASCII path: no ideographs, no accents, one byte a character,
    /// and no table looked up (within ASCII the controls are the C0 codes
    /// and DEL, the whitespace left after them tab, newline, carriage
    /// return and space).
    fn normalize_ascii(&self, text: &[u8], out: &mut String) {
        out.reserve(text.len());
        for &b in text {
            let c = b as char;
            let c = if self.clean_text {
                match b {
                    b'\t' | b'\n' | b'\r' | b' ' => ' ',
                    0..=0x1f | 0x7f => continue,
                    _ => c,
                }
            } else {
                c
            };
            out.push(if self.lowercase {
                c.to_ascii_lowercase()
            } else {
                c
            });
        }
    }

    /// Any text, step by step as Hugging Face tokenizers does it.
    fn normalize_unicode(&self, text: &str, out: &mut String) {
        let clean = self.clean_text;
        let cleaned = text.chars().filter_map(move |c| {
            if !clean {
                Some(c)
            } else if c == '\0' || c == '\u{fffd}' || is_control(c) {
                None
            } else if is_whitespace(c) {
                Some(' ')
            } else {
                Some(c)
            }
        });
        let chinese = self.handle_chinese_chars;
        let spaced = cleaned.flat_map(move |c| {
            let around = chinese && is_chinese_char(c);
            let (before, after) = if around {
                (Some(' '), Some(' '))
            } else {
                (None, None)
            };
            before.into_iter().chain([c]).chain(after)
        });
        let lowercase = self.lowercase;
        let mut push = |c: char| {
            if lowercase {
                out.extend(c.to_lowercase());
            } else {
                out.push(c);
            }
        };
        if self.strip_accents {
            for (c, _) in spaced.nfd() {
                if !c.is_mark_nonspacing() {
                    push(c);
                }
            }
        } else {
            spaced.for_each(push);
        }
    }
}

/// The words of a normalised text, as `BertPreTokenizer` cuts them:
/// whitespace separates words and is dropped, each punctuation character
/// is a word of its own.
pub(crate) fn words(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        loop {
            let mut chars = rest.char_indices();
            let (_, first) = chars.next()?;
            if first.is_whitespace() {
                rest = &rest[first.len_utf8()..];
                continue;
            }
            if is_punctuation(first) {
                let (word, tail) = rest.split_at(first.len_utf8());
                rest = tail;
                return Some(word);
            }
            let end = chars
                .find(|&(_, c)| c.is_whitespace() || is_punctuation(c))
                .map_or(rest.len(), |(i, _)| i);
            let (word, tail) = rest.split_at(end);
            rest = tail;
            return Some(word);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNCASED: BertNormalizer = BertNormalizer {
        clean_text: true,
        handle_chinese_chars: true,
        strip_accents: true,
        lowercase: true,
    };

    fn normalized(n: &BertNormalizer, text: &str) -> String {
        let mut out = String::new();
        n.normalize(text, &mut out);
        out
    }

    #[test]
    fn controls_go_whitespace_becomes_a_space_and_case_and_accents_go() {
        assert_eq!(normalized(&UNCASED, "A\tb\u{0}c\u{7}\u{b}D"), "a bcd");
        assert_eq!(normalized(&UNCASED, "Café Ünïcode"), "cafe unicode");
        assert_eq!(normalized(&UNCASED, "東京abc"), " 東  京 abc");
        let cased = BertNormalizer {
            strip_accents: false,
            lowercase: false,
            ..UNCASED
        };
        assert_eq!(normalized(&cased, "Café\u{200b}\u{fffd}X"), "CaféX");
    }

    #[test]
    fn words_split_at_whitespace_and_around_punctuation() {
        let got: Vec<&str> = words("  Hey friend!  How are you?!? 東 ").collect();
        assert_eq!(
            got,
            [
                "Hey", "friend", "!", "How", "are", "you", "?", "!", "?", "東"
            ]
        );
        assert_eq!(words("   ").count(), 0);
        for c in (0u8..128).map(char::from) {
            assert_eq!(
                is_punctuation(c),
                c.is_ascii_punctuation() || c.is_punctuation(),
                "{c:?}"
            );
        }
    }

    /// The ASCII path gives what the general one gives, byte by byte.
    #[test]
    fn the_ascii_path_agrees_with_the_general_one_on_every_byte() {
        for n in [
            UNCASED,
            BertNormalizer {
                clean_text: false,
                ..UNCASED
            },
            BertNormalizer {
                lowercase: false,
                strip_accents: false,
                ..UNCASED
            },
        ] {
            let text: String = (0u8..128).map(char::from).collect();
            let (mut fast, mut general) = (String::new(), String::new());
            n.normalize_ascii(text.as_bytes(), &mut fast);
            n.normalize_unicode(&text, &mut general);
            assert_eq!(fast, general, "{n:?}");
        }
        assert_eq!(
            words("a«b»c").collect::<Vec<_>>(),
            ["a", "«", "b", "»", "c"]
        );
    }
}
