//! Our own WordPiece against Hugging Face tokenizers on the same
//! `tokenizer.json`: identical ids, type ids, masks and padding, batch by
//! batch, over random texts built to hit every branch of BERT's
//! normalisation (controls, whitespace of every kind, accents and
//! combining marks, CJK, case mappings that change length, punctuation of
//! every category, added tokens written in the text, words past the
//! longest allowed, texts past the model's length) and over real text (the
//! repository's documentation, the reference sentences in English, Chinese
//! and mixed scripts, every piece of the vocabulary).

use std::path::{Path, PathBuf};

use flotilla_embed::TextTokenizer;

mod common;

use common::models_dir;

fn model_dir() -> PathBuf {
    std::env::var_os("FLOTILLA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/all-MiniLM-L6-v2")
        })
}

/// SplitMix64: a seeded stream, so a failure names a text that comes back.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// Pieces texts are made of, each a class of what the normaliser and the
/// splitter treat apart.
const PIECES: &[&[&str]] = &[
    // Plain words, cased, with digits.
    &[
        "the",
        "Embedding",
        "JOBS",
        "on",
        "machines",
        "x86_64",
        "2026",
        "naïve",
        "hello",
    ],
    // Whitespace of every kind, as separators.
    &[
        " ", "  ", "\t", "\n", "\r\n", "\u{a0}", "\u{3000}", "\u{2028}", "\u{2009}", "\u{1680}",
    ],
    // Controls and format characters (dropped), the replacement character,
    // NUL, NEL (a control that is also whitespace), private use,
    // unassigned code points.
    &[
        "\u{0}",
        "\u{7}",
        "\u{b}",
        "\u{c}",
        "\u{1f}",
        "\u{7f}",
        "\u{85}",
        "\u{200b}",
        "\u{200d}",
        "\u{feff}",
        "\u{fffd}",
        "\u{e000}",
        "\u{378}",
        "\u{10ffff}",
    ],
    // Accents, precomposed and combining, and marks that are not
    // non-spacing (kept), in orders canonical reordering changes.
    &[
        "Café",
        "e\u{301}",
        "a\u{323}\u{302}",
        "a\u{302}\u{323}",
        "Ünïcödé",
        "Ångström",
        "ﬁ",
        "Ⅻ",
        "ㄱ",
        "한국어",
        "\u{915}\u{93f}",
        "\u{1d165}\u{301}",
        "\u{301}",
    ],
    // Ideographs in and around the CJK blocks, kana, compatibility
    // ideographs (NFD maps them into the block).
    &[
        "東京",
        "中文字",
        "日本語です",
        "\u{f900}",
        "\u{2f800}",
        "\u{20000}",
        "カタカナ",
        "ひらがな",
        "\u{3400}",
    ],
    // Case mappings that change length or depend on context.
    &[
        "İstanbul",
        "ΣΊΣΥΦΟΣ",
        "ς",
        "Straße",
        "ǅ",
        "ΐ",
        "Ⓐ",
        "ＡＢＣ",
    ],
    // Punctuation of every category, ASCII symbols that count as
    // punctuation, symbols that do not.
    &[
        "!",
        "?!",
        "...",
        "«",
        "»",
        "—",
        "‐",
        "「",
        "」",
        "¿",
        "#",
        "##",
        "$",
        "€",
        "@",
        "^",
        "`",
        "~",
        "+",
        "=",
        "|",
        "<",
        ">",
        "©",
        "°",
        "½",
        "🙂",
        "👩‍💻",
    ],
    // Added tokens written in the text, whole and broken.
    &[
        "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "[MASK", "MASK]", "[[CLS]]", "[cls]",
    ],
    // Other scripts.
    &[
        "Привет",
        "мир",
        "مرحبا",
        "שלום",
        "สวัสดี",
        "Ελληνικά",
        "ქართული",
        "नमस्ते",
    ],
];

/// A random text of `words` pieces, every class drawn.
fn random_text(rng: &mut Rng, words: usize) -> String {
    let mut text = String::new();
    for _ in 0..words {
        let class = PIECES[rng.below(PIECES.len())];
        text.push_str(rng.pick(class));
        match rng.below(4) {
            0 => {}
            1 | 2 => text.push(' '),
            _ => text.push_str(rng.pick(PIECES[1])),
        }
        if rng.below(40) == 0 {
            // A word past the longest allowed (100 characters).
            let c = rng.pick(&["a", "é", "東", "z9"]);
            text.push_str(&c.repeat(90 + rng.below(30)));
        }
    }
    text
}

/// Asserts both tokenizers give the same batch for `texts`.
fn same(fast: &TextTokenizer, hf: &TextTokenizer, texts: &[String], what: &str) {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let got = fast.tokenize(&refs).expect("our WordPiece tokenizes");
    let want = hf.tokenize(&refs).expect("Hugging Face tokenizes");
    if got == want {
        return;
    }
    // Narrow it to the first text that differs.
    for (i, text) in texts.iter().enumerate() {
        let one = fast.tokenize(&[text.as_str()]).unwrap();
        let two = hf.tokenize(&[text.as_str()]).unwrap();
        assert_eq!(
            one, two,
            "{what}: text {i} {text:?}: ours (left) and Hugging Face's differ"
        );
    }
    assert_eq!(
        got, want,
        "{what}: the batch differs, though every text agrees alone"
    );
}

/// Our WordPiece and Hugging Face tokenizers for the folder `dir`.
fn pair(dir: &Path, max_len: usize, lowercase: bool) -> (TextTokenizer, TextTokenizer) {
    let fast = TextTokenizer::load_with(&dir.join("tokenizer.json"), max_len, None, lowercase)
        .expect("tokenizer loads");
    assert!(
        fast.is_fast_wordpiece(),
        "{} is a plain BERT WordPiece",
        dir.display()
    );
    let hf = fast.on_hugging_face();
    (fast, hf)
}

/// Random texts in batches of 16, `count` of them, from `seed`.
fn random_batches(fast: &TextTokenizer, hf: &TextTokenizer, seed: u64, count: usize, what: &str) {
    let mut rng = Rng(seed);
    for b in 0..count / 16 {
        let texts: Vec<String> = (0..16)
            .map(|_| {
                let words = rng.below(60) + 1;
                random_text(&mut rng, words)
            })
            .collect();
        same(
            fast,
            hf,
            &texts,
            &format!("{what}, batch {b} of seed {seed}"),
        );
    }
}

/// The repository's documentation, a paragraph and a line at a time, the
/// example corpus and the reference sentences.
fn real_texts() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut texts = Vec::new();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.push(root.join("README.md"));
    docs.sort();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        texts.extend(text.split("\n\n").map(str::to_owned));
        texts.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_owned));
    }
    let sample = std::fs::read_to_string(root.join("examples/data/sample.jsonl")).unwrap();
    for line in sample.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        texts.push(row["text"].as_str().unwrap().to_owned());
    }
    for data in ["minilm-golden-dev.json", "reference-extra.json"] {
        let path = root.join("apps/embed/tests/data").join(data);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for s in v["sentences"].as_array().unwrap() {
            texts.push(s["text"].as_str().unwrap().to_owned());
        }
    }
    assert!(texts.len() > 1000, "{} texts", texts.len());
    texts
}

#[test]
fn minilm_ids_match_hugging_face_on_random_texts() {
    let (fast, hf) = pair(&model_dir(), 256, false);
    random_batches(&fast, &hf, 1, 20_000, "all-MiniLM-L6-v2");
    // A short model length: most texts are cut.
    let (fast, hf) = pair(&model_dir(), 12, false);
    random_batches(&fast, &hf, 2, 4_000, "all-MiniLM-L6-v2 at 12 tokens");
}

#[test]
fn minilm_ids_match_hugging_face_on_real_text() {
    let (fast, hf) = pair(&model_dir(), 256, false);
    let texts = real_texts();
    for (i, chunk) in texts.chunks(16).enumerate() {
        same(&fast, &hf, chunk, &format!("real text, batch {i}"));
    }
    // Every piece of the vocabulary as a text, alone and run together.
    let vocab = std::fs::read_to_string(model_dir().join("vocab.txt")).unwrap();
    let pieces: Vec<String> = vocab.lines().map(str::to_owned).collect();
    for (i, chunk) in pieces.chunks(16).enumerate() {
        same(&fast, &hf, chunk, &format!("vocabulary, batch {i}"));
    }
    let joined: Vec<String> = pieces.chunks(7).map(|c| c.concat()).collect();
    for (i, chunk) in joined.chunks(16).enumerate() {
        same(
            &fast,
            &hf,
            chunk,
            &format!("vocabulary run together, batch {i}"),
        );
    }
}

/// The small BERT test models: a vocabulary of a few hundred pieces (so
/// most words are cut into many pieces, or unknown), a lower-casing one and
/// a cased one lower-cased by sentence-transformers' `do_lower_case`.
#[test]
fn small_vocabularies_cased_and_uncased_match_hugging_face() {
    let models = models_dir();
    for (model, lowercase) in [("bert-cls", false), ("bert-mean-legacy-lowercase", true)] {
        let (fast, hf) = pair(&models.join(model), 64, lowercase);
        random_batches(&fast, &hf, 3, 4_000, model);
        for (i, chunk) in real_texts().chunks(16).take(200).enumerate() {
            same(&fast, &hf, chunk, &format!("{model}, real text, batch {i}"));
        }
    }
}

/// Tokenizers that are not a plain BERT WordPiece stay on Hugging Face
/// tokenizers: SentencePiece (XLM-R), and MPNet's, whose mask token
/// strips the space before it.
#[test]
fn other_tokenizers_stay_on_hugging_face() {
    let models = models_dir();
    for model in ["xlmr-mean-normalize", "mpnet-mean-normalize"] {
        let t = TextTokenizer::load(&models.join(model).join("tokenizer.json"), 64).unwrap();
        assert!(!t.is_fast_wordpiece(), "{model}");
    }
}
