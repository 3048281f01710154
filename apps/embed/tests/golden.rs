//! Correctness against sentence-transformers: token ids and embeddings of the
//! reference sentences in `tests/data/minilm-golden-dev.json`, alone and in
//! padded batches.

use std::path::PathBuf;
use std::sync::OnceLock;

use flotilla_embed::{Precision, SentenceEncoder, cpu_device, default_device};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    suggested_tolerance: Tolerance,
    sentences: Vec<Sentence>,
}

#[derive(Deserialize)]
struct Tolerance {
    max_abs_diff: f32,
    min_cosine: f32,
}

#[derive(Deserialize)]
struct Sentence {
    text: String,
    token_ids: Vec<i64>,
    embedding: Vec<f32>,
    truncated: bool,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model_dir() -> PathBuf {
    std::env::var_os("FLOTILLA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/all-MiniLM-L6-v2"))
}

fn golden() -> Golden {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm-golden-dev.json");
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("reference data {} unreadable: {e}", path.display()));
    serde_json::from_slice(&bytes).expect("golden file parses")
}

fn encoder() -> &'static SentenceEncoder {
    static ENCODER: OnceLock<SentenceEncoder> = OnceLock::new();
    ENCODER.get_or_init(|| {
        let dir = model_dir();
        SentenceEncoder::load(&dir, &default_device()).unwrap_or_else(|e| {
            panic!(
                "model not loadable from {} ({e}); run scripts/fetch-model first",
                dir.display()
            )
        })
    })
}

fn compare(label: &str, got: &[f32], want: &[f32], tol: &Tolerance) {
    assert_eq!(got.len(), want.len(), "{label}: dimension");
    let max_abs = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let dot: f32 = got.iter().zip(want).map(|(a, b)| a * b).sum();
    let na: f32 = got.iter().map(|a| a * a).sum::<f32>().sqrt();
    let nb: f32 = want.iter().map(|b| b * b).sum::<f32>().sqrt();
    let cosine = dot / (na * nb);
    assert!(
        max_abs <= tol.max_abs_diff && cosine >= tol.min_cosine,
        "{label}: max abs diff {max_abs:e}, cosine {cosine}"
    );
}

#[test]
fn token_ids_match_reference() {
    let g = golden();
    let enc = encoder();
    assert!(
        g.sentences.iter().any(|s| s.truncated),
        "data has a truncated text"
    );
    for s in &g.sentences {
        let batch = enc.tokenize(&[s.text.as_str()]).unwrap();
        assert_eq!(batch.row_ids(0), s.token_ids, "ids of {:?}", s.text);
    }
}

#[test]
fn each_sentence_alone_matches_reference() {
    let g = golden();
    let enc = encoder();
    for s in &g.sentences {
        let out = enc.encode(&[s.text.as_str()]).unwrap();
        compare(
            &format!("{:?} alone", s.text),
            out.row(0),
            &s.embedding,
            &g.suggested_tolerance,
        );
    }
}

#[test]
fn padded_mixed_batch_matches_reference() {
    let g = golden();
    let enc = encoder();
    // Every sentence in one batch padded to the longest, in two orders.
    let mut order: Vec<usize> = (0..g.sentences.len()).collect();
    for round in 0..2 {
        let texts: Vec<&str> = order
            .iter()
            .map(|&i| g.sentences[i].text.as_str())
            .collect();
        let out = enc.encode(&texts).unwrap();
        assert_eq!(out.rows(), texts.len());
        for (row, &i) in order.iter().enumerate() {
            let s = &g.sentences[i];
            compare(
                &format!("{:?} in batch (round {round})", s.text),
                out.row(row),
                &s.embedding,
                &g.suggested_tolerance,
            );
        }
        order.reverse();
    }
}

#[test]
fn vectors_are_unit_length() {
    let enc = encoder();
    let texts = [
        "",
        "ok",
        "東京は日本の首都です",
        "emoji 🚀🔥 and accents déjà vu",
    ];
    let out = enc.encode(&texts).unwrap();
    assert_eq!(out.dim, 384);
    for (i, text) in texts.iter().enumerate() {
        let norm: f32 = out.row(i).iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{text:?} has norm {norm}");
    }
}

#[test]
fn padding_does_not_change_non_ascii_vectors() {
    let enc = encoder();
    let texts = [
        "東京は日本の首都です",
        "emoji 🚀🔥 and accents déjà vu",
        "Ångström",
    ];
    let long = "word ".repeat(400);
    let mut batch: Vec<&str> = texts.to_vec();
    batch.push(&long);
    let together = enc.encode(&batch).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let alone = enc.encode(&[t]).unwrap();
        let diff = alone
            .row(0)
            .iter()
            .zip(together.row(i))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{t:?}: padded differs by {diff}");
    }
}

#[test]
fn revision_is_sha256_of_weights() {
    let enc = encoder();
    assert_eq!(
        enc.revision().as_str(),
        "sha256:53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    );
}

#[derive(Deserialize)]
struct Extra {
    sentences: Vec<ExtraSentence>,
}

#[derive(Deserialize)]
struct ExtraSentence {
    text: String,
    token_ids: Vec<i64>,
    embedding: Vec<f32>,
}

/// CJK, emoji, other scripts, whitespace-only and a text far over
/// max_seq_length, against sentence-transformers' output
/// (tests/data/reference-extra.json, written by tests/make_reference.py).
#[test]
fn non_ascii_whitespace_and_long_texts_match_reference() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference-extra.json");
    let extra: Extra = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let tol = golden().suggested_tolerance;
    let enc = encoder();
    let texts: Vec<&str> = extra.sentences.iter().map(|s| s.text.as_str()).collect();
    let batched = enc.encode(&texts).unwrap();
    for (i, s) in extra.sentences.iter().enumerate() {
        assert_eq!(
            enc.tokenize(&[s.text.as_str()]).unwrap().row_ids(0),
            s.token_ids,
            "ids of {:?}",
            s.text
        );
        let alone = enc.encode(&[s.text.as_str()]).unwrap();
        compare(
            &format!("{:?} alone", s.text),
            alone.row(0),
            &s.embedding,
            &tol,
        );
        compare(
            &format!("{:?} in batch", s.text),
            batched.row(i),
            &s.embedding,
            &tol,
        );
    }
}

/// Every reference sentence of both files, `(text, embedding)`.
fn all_references() -> Vec<(String, Vec<f32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference-extra.json");
    let extra: Extra = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    golden()
        .sentences
        .into_iter()
        .map(|s| (s.text, s.embedding))
        .chain(extra.sentences.into_iter().map(|s| (s.text, s.embedding)))
        .collect()
}

/// Each reference sentence, alone and in one padded batch, against its
/// vector within `tol`.
fn matches_references(enc: &SentenceEncoder, label: &str, tol: &Tolerance) {
    let refs = all_references();
    let texts: Vec<&str> = refs.iter().map(|(t, _)| t.as_str()).collect();
    let batched = enc.encode(&texts).unwrap();
    for (i, (text, want)) in refs.iter().enumerate() {
        let alone = enc.encode(&[text.as_str()]).unwrap();
        compare(&format!("{label} {text:?} alone"), alone.row(0), want, tol);
        compare(
            &format!("{label} {text:?} in batch"),
            batched.row(i),
            want,
            tol,
        );
    }
}

/// f16 and bf16 dense layers (on the CPU here; the same code runs on a
/// GPU) stay within the half-precision bar: cosine 0.999 to
/// sentence-transformers' f32 vectors for every reference sentence.
#[test]
fn half_precisions_match_reference_within_their_bar() {
    let half_bar = Tolerance {
        max_abs_diff: f32::INFINITY,
        min_cosine: 0.999,
    };
    for precision in [Precision::F16, Precision::Bf16] {
        let enc = SentenceEncoder::load_with(model_dir(), &cpu_device(), precision).unwrap();
        assert_eq!(enc.precision(), precision);
        matches_references(&enc, &precision.to_string(), &half_bar);
    }
}

/// A folder converted to f16 weights (`node model convert`) holds half the
/// bytes, loads with the same tokenizer and configuration, and its vectors
/// in f32 stay within cosine 0.9999 of the f32 weights' (rounding the
/// weights moves single values by up to 2.4e-4, past the f32 bar's 1e-4:
/// a check of the f32 arithmetic with such a folder needs a reference made
/// from the same weights, as scripts/device-check makes one).
#[test]
fn weights_stored_as_f16_load_and_match_reference() {
    let out = std::env::temp_dir().join(format!("flotilla-f16-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let converted = flotilla_embed::convert_folder(&model_dir(), &out, Precision::F16).unwrap();
    let original = std::fs::metadata(model_dir().join("model.safetensors"))
        .unwrap()
        .len();
    assert!(
        converted.bytes < original / 2 + (1 << 20),
        "{} bytes against {original}",
        converted.bytes
    );
    // Converting again over an existing folder is refused.
    assert!(flotilla_embed::convert_folder(&model_dir(), &out, Precision::F16).is_err());
    let enc = SentenceEncoder::load(&out, &cpu_device()).unwrap();
    let bar = Tolerance {
        max_abs_diff: 1e-3,
        min_cosine: 0.9999,
    };
    matches_references(&enc, "f16 weights", &bar);
    std::fs::remove_dir_all(&out).unwrap();
}

/// The int8 mode (`--precision int8`) stays within its bar: cosine 0.99 to
/// sentence-transformers' f32 vectors for every reference sentence, alone
/// and in one padded batch.
#[test]
fn int8_matches_reference_within_its_bar() {
    let enc = SentenceEncoder::load_with(model_dir(), &cpu_device(), Precision::Int8).unwrap();
    assert_eq!(enc.precision(), Precision::Int8);
    let refs = all_references();
    let texts: Vec<&str> = refs.iter().map(|(t, _)| t.as_str()).collect();
    let batched = enc.encode(&texts).unwrap();
    let cosine = |a: &[f32], b: &[f32]| {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        dot / (a.iter().map(|x| x * x).sum::<f32>() * b.iter().map(|y| y * y).sum::<f32>()).sqrt()
    };
    let mut lowest = (f32::INFINITY, String::new());
    for (i, (text, want)) in refs.iter().enumerate() {
        let alone = enc.encode(&[text.as_str()]).unwrap();
        for (how, got) in [("alone", alone.row(0)), ("in batch", batched.row(i))] {
            let c = cosine(got, want);
            if c < lowest.0 {
                lowest = (c, format!("{text:?} {how}"));
            }
        }
    }
    eprintln!("int8: lowest cosine {} ({})", lowest.0, lowest.1);
    assert!(
        lowest.0 >= 0.99,
        "int8: cosine {} for {}",
        lowest.0,
        lowest.1
    );
}
