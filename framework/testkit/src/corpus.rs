//! A synthetic English-like corpus, the same on every machine: `{"id",
//! "text"}` rows of 20 to 80 words in sentences, with commas, drawn from a
//! fixed vocabulary by a seeded generator. Row `i` depends only on the
//! seed and `i`, so a corpus of N rows is the first N rows of any larger
//! one. With all-MiniLM-L6-v2's tokenizer, texts average about 63 tokens
//! (from about 25 to 125), the length profile of real short documents.

use std::io::Write;

use crate::rng::SplitMix;

/// The seed of the corpus the tests and benches use.
pub const DEFAULT_SEED: u64 = 1;

/// Words the texts are made of: everyday words, and long technical ones
/// that the tokenizer splits into several pieces.
const WORDS: &[&str] = &[
    "the",
    "a",
    "and",
    "of",
    "to",
    "in",
    "on",
    "with",
    "from",
    "by",
    "for",
    "at",
    "as",
    "into",
    "over",
    "under",
    "after",
    "before",
    "while",
    "because",
    "although",
    "therefore",
    "however",
    "meanwhile",
    "without",
    "across",
    "against",
    "between",
    "during",
    "through",
    "toward",
    "near",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "has",
    "have",
    "had",
    "can",
    "will",
    "may",
    "must",
    "should",
    "would",
    "could",
    "might",
    "do",
    "does",
    "did",
    "not",
    "never",
    "always",
    "often",
    "rarely",
    "usually",
    "sometimes",
    "quietly",
    "slowly",
    "quickly",
    "carefully",
    "together",
    "also",
    "only",
    "still",
    "again",
    "soon",
    "later",
    "here",
    "there",
    "then",
    "now",
    "very",
    "we",
    "they",
    "she",
    "he",
    "it",
    "you",
    "their",
    "our",
    "its",
    "his",
    "her",
    "this",
    "that",
    "these",
    "those",
    "some",
    "many",
    "few",
    "most",
    "every",
    "each",
    "other",
    "another",
    "such",
    "one",
    "two",
    "three",
    "four",
    "five",
    "first",
    "last",
    "next",
    "new",
    "old",
    "young",
    "small",
    "large",
    "long",
    "short",
    "high",
    "low",
    "early",
    "late",
    "bright",
    "dark",
    "quiet",
    "loud",
    "warm",
    "cold",
    "green",
    "golden",
    "silver",
    "wooden",
    "distant",
    "hidden",
    "private",
    "public",
    "rapid",
    "simple",
    "complex",
    "modern",
    "ancient",
    "famous",
    "broken",
    "careful",
    "similar",
    "different",
    "important",
    "possible",
    "available",
    "reliable",
    "efficient",
    "window",
    "door",
    "table",
    "kitchen",
    "garden",
    "river",
    "mountain",
    "island",
    "forest",
    "city",
    "village",
    "street",
    "road",
    "bridge",
    "station",
    "library",
    "school",
    "market",
    "harbor",
    "museum",
    "theatre",
    "hospital",
    "office",
    "factory",
    "farm",
    "field",
    "house",
    "teacher",
    "student",
    "doctor",
    "farmer",
    "writer",
    "builder",
    "engineer",
    "traveler",
    "child",
    "friend",
    "member",
    "leader",
    "neighbor",
    "stranger",
    "family",
    "group",
    "team",
    "supervisor",
    "scientist",
    "musician",
    "painter",
    "driver",
    "sailor",
    "worker",
    "visitor",
    "water",
    "weather",
    "rain",
    "snow",
    "wind",
    "storm",
    "sun",
    "moon",
    "light",
    "shadow",
    "spring",
    "summer",
    "autumn",
    "winter",
    "morning",
    "evening",
    "night",
    "day",
    "year",
    "music",
    "language",
    "story",
    "letter",
    "paper",
    "book",
    "picture",
    "signal",
    "message",
    "question",
    "answer",
    "problem",
    "theory",
    "experiment",
    "example",
    "idea",
    "plan",
    "result",
    "system",
    "network",
    "cluster",
    "process",
    "stream",
    "queue",
    "index",
    "vector",
    "query",
    "token",
    "model",
    "memory",
    "object",
    "placement",
    "throughput",
    "latency",
    "balance",
    "economy",
    "energy",
    "chemistry",
    "biology",
    "physics",
    "history",
    "geography",
    "mathematics",
    "photosynthesis",
    "electromagnetic",
    "internationalization",
    "interoperability",
    "thermodynamics",
    "infrastructure",
    "microorganism",
    "telecommunication",
    "characterization",
    "responsibility",
    "understanding",
    "transformation",
    "approximately",
    "simultaneously",
    "read",
    "write",
    "build",
    "measure",
    "observe",
    "describe",
    "explain",
    "collect",
    "connect",
    "send",
    "receive",
    "deliver",
    "compute",
    "improve",
    "transport",
    "travel",
    "visit",
    "study",
    "open",
    "close",
    "carry",
    "follow",
    "watch",
    "listen",
    "remember",
    "forget",
    "begin",
    "finish",
    "choose",
    "change",
    "grow",
    "move",
    "turn",
    "rest",
    "work",
    "play",
    "sing",
    "walk",
];

/// Row `index` of the corpus of `seed`: its id and text.
pub fn row(seed: u64, index: u64) -> (String, String) {
    let mut rng = SplitMix(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ index);
    // Mix the state once so neighbouring rows differ from their first word.
    rng.next_u64();
    let words = rng.between(20, 80);
    let mut text = String::with_capacity(words as usize * 8);
    let mut sentence_left = rng.between(4, 18);
    let mut start = true;
    for i in 0..words {
        let word = WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
        if !text.is_empty() {
            text.push(' ');
        }
        if start {
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                text.extend(c.to_uppercase());
                text.push_str(chars.as_str());
            }
            start = false;
        } else {
            text.push_str(word);
        }
        sentence_left -= 1;
        if sentence_left == 0 || i + 1 == words {
            text.push('.');
            sentence_left = rng.between(4, 18);
            start = true;
        } else if rng.next_u64().is_multiple_of(12) {
            text.push(',');
        }
    }
    (format!("doc-{index:06}"), text)
}

/// The first `rows` rows of the corpus of `seed`.
pub fn rows(seed: u64, rows: u64) -> impl Iterator<Item = (String, String)> {
    (0..rows).map(move |i| row(seed, i))
}

/// Writes the first `rows` rows of the corpus of `seed` to `out` as JSON
/// lines.
pub fn write_jsonl(out: &mut impl Write, seed: u64, count: u64) -> std::io::Result<()> {
    for (id, text) in rows(seed, count) {
        serde_json::to_writer(&mut *out, &serde_json::json!({ "id": id, "text": text }))?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_depend_on_seed_and_index_only() {
        assert_eq!(row(1, 7), row(1, 7));
        assert_ne!(row(1, 7).1, row(2, 7).1);
        assert_ne!(row(1, 7).1, row(1, 8).1);
        let small: Vec<_> = rows(1, 10).collect();
        let large: Vec<_> = rows(1, 100).take(10).collect();
        assert_eq!(small, large);
    }

    #[test]
    fn texts_have_20_to_80_words_in_sentences() {
        for (id, text) in rows(DEFAULT_SEED, 500) {
            assert!(id.starts_with("doc-"));
            let words = text.split_whitespace().count();
            assert!((20..=80).contains(&words), "{words} words: {text}");
            assert!(text.ends_with('.'));
            assert!(text.chars().next().unwrap().is_uppercase());
        }
    }
}
