//! Every encoder family, pooling mode and folder feature against
//! sentence-transformers: small random-weight models built by
//! `tests/make_test_models.py` (scripts/make-test-models), each with
//! sentence-transformers' token ids and vectors of English, Chinese,
//! mixed-script and over-length texts, with and without prompts and
//! truncated dimensions.
//!
//! The published all-mpnet-base-v2 (scripts/fetch-model-mpnet) is checked
//! the same way, with a text past its 384 tokens.
//!
//! Bars: token ids identical; in f32 cosine ≥ 0.9999 and max abs diff ≤
//! 1e-4, each text alone and in one padded batch; int8 cosine ≥ 0.99; f16
//! and bf16 cosine ≥ 0.999 on the published model and ≥ 0.99 on the small
//! ones (their weights are drawn wider than trained ones, which costs the
//! half precisions more).

use std::sync::OnceLock;

mod common;

use common::models_dir;

use flotilla_embed::{Precision, SentenceEncoder, cpu_device};
use serde::Deserialize;

#[derive(Deserialize)]
struct References {
    models: Vec<ModelRefs>,
}

#[derive(Deserialize)]
struct ModelRefs {
    model: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: Option<String>,
    prompt_name: Option<String>,
    dim: Option<usize>,
    sentences: Vec<Sentence>,
}

#[derive(Deserialize)]
struct Sentence {
    text: String,
    token_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn references() -> &'static References {
    static REFS: OnceLock<References> = OnceLock::new();
    REFS.get_or_init(|| {
        let path = models_dir().join("references.json");
        let bytes = std::fs::read(&path).unwrap();
        serde_json::from_slice(&bytes).expect("references parse")
    })
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The prompt a case asks for, as `node embed` resolves it.
fn prompt_of<'a>(enc: &'a SentenceEncoder, case: &'a Case) -> &'a str {
    match (&case.prompt, &case.prompt_name) {
        (Some(p), _) => p,
        (None, Some(name)) => enc.folder().prompt(name).unwrap(),
        (None, None) => enc.folder().default_prompt(),
    }
}

/// The published models the references must cover.
const PUBLISHED: [&str; 1] = ["all-mpnet-base-v2"];

/// Every case of every model in `precision`: each text alone and all in
/// one padded batch, held to `check(label, published, got, want)`. Prints
/// each model's lowest cosine.
fn each_vector(precision: Precision, check: impl Fn(&str, bool, &[f32], &[f32])) {
    let refs = references();
    assert!(refs.models.len() >= 13, "every model kind is there");
    for name in PUBLISHED {
        assert!(
            refs.models.iter().any(|m| m.model == name),
            "no references of {name}: run scripts/fetch-model-mpnet, then scripts/make-test-models"
        );
    }
    for model in &refs.models {
        let dir = models_dir().join(&model.model);
        let enc = SentenceEncoder::load_with(&dir, &cpu_device(), precision)
            .unwrap_or_else(|e| panic!("{}: {e}", model.model));
        let published = PUBLISHED.contains(&model.model.as_str());
        let mut lowest = 1.0f32;
        for case in &model.cases {
            let prompt = prompt_of(&enc, case);
            let texts: Vec<&str> = case.sentences.iter().map(|s| s.text.as_str()).collect();
            let dim = case.dim.unwrap_or(enc.dim());
            let batch = enc.encode_prompted(&texts, prompt).unwrap().truncated(dim);
            for (i, s) in case.sentences.iter().enumerate() {
                let label = format!(
                    "{} {precision} prompt {prompt:?} dim {dim}: {:.30}",
                    model.model, s.text
                );
                let alone = enc
                    .encode_prompted(&[s.text.as_str()], prompt)
                    .unwrap()
                    .truncated(dim);
                assert_eq!(alone.dim, s.embedding.len(), "{label}: width");
                lowest = lowest
                    .min(cosine(alone.row(0), &s.embedding))
                    .min(cosine(batch.row(i), &s.embedding));
                check(
                    &format!("{label} (alone)"),
                    published,
                    alone.row(0),
                    &s.embedding,
                );
                check(
                    &format!("{label} (batch)"),
                    published,
                    batch.row(i),
                    &s.embedding,
                );
            }
        }
        eprintln!("{} {precision}: lowest cosine {lowest}", model.model);
    }
}

#[test]
fn token_ids_match_sentence_transformers() {
    for model in &references().models {
        let enc = SentenceEncoder::load(models_dir().join(&model.model), &cpu_device()).unwrap();
        for case in &model.cases {
            let prompt = prompt_of(&enc, case);
            for s in &case.sentences {
                let ids: Vec<u32> = enc
                    .tokenize_prompted(&[s.text.as_str()], &enc.prompt(prompt).unwrap())
                    .unwrap()
                    .row_ids(0)
                    .into_iter()
                    .map(|id| id as u32)
                    .collect();
                assert_eq!(ids, s.token_ids, "{} {prompt:?}: {}", model.model, s.text);
            }
        }
    }
}

#[test]
fn f32_vectors_match_sentence_transformers() {
    each_vector(Precision::F32, |label, _, got, want| {
        let (c, d) = (cosine(got, want), max_abs(got, want));
        assert!(
            c >= 0.9999 && d <= 1e-4,
            "{label}: cosine {c}, max abs diff {d:e}"
        );
    });
}

#[test]
fn int8_vectors_stay_within_their_bar() {
    each_vector(Precision::Int8, |label, _, got, want| {
        let c = cosine(got, want);
        assert!(c >= 0.99, "{label}: cosine {c}");
    });
}

#[test]
fn half_precision_vectors_stay_within_their_bar() {
    for precision in [Precision::F16, Precision::Bf16] {
        each_vector(precision, |label, published, got, want| {
            let c = cosine(got, want);
            let bar = if published { 0.999 } else { 0.99 };
            assert!(c >= bar, "{label}: cosine {c}");
        });
    }
}

/// What the folders say reaches the encoder: widths, normalisation,
/// prompts, similarity.
#[test]
fn folder_features_are_read() {
    let open = |name: &str| SentenceEncoder::load(models_dir().join(name), &cpu_device()).unwrap();
    let dense = open("bert-cls-max-mean-dense-tanh");
    assert_eq!(dense.dim(), 32);
    assert!(dense.folder().normalizes());
    let cls = open("bert-cls");
    assert!(!cls.folder().normalizes());
    let norm: f32 = cls
        .encode(&["a short sentence"])
        .unwrap()
        .values
        .iter()
        .map(|v| v * v)
        .sum();
    assert!((norm.sqrt() - 1.0).abs() > 1e-3, "not normalised: {norm}");
    let xlmr = open("xlmr-cls-normalize");
    assert_eq!(xlmr.folder().prompt("query").unwrap(), "query: ");
    assert_eq!(
        open("mpnet-mean-normalize").folder().similarity.as_deref(),
        Some("dot")
    );
    let excluded = open("bert-mean-prompt-excluded");
    assert!(!excluded.folder().pooling.include_prompt);
    assert_eq!(excluded.folder().default_prompt(), "query: ");
}
