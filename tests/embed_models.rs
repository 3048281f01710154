//! `node embed --model DIR` on every encoder family and folder feature the
//! embedder supports (the small models of `scripts/make-test-models`):
//! the job writes sentence-transformers' vectors, with prompts and
//! truncated dimensions, records the prompt and the similarity function in
//! its output, and refuses what a folder cannot do, naming it.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{cosine, pyarrow_dataset, read_output, scratch, test_models};

const NODE: &str = env!("CARGO_BIN_EXE_node");

/// `node embed` of `input` to `output` with the test model `model`.
fn embed(model: &str, input: &Path, output: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(NODE)
        .arg("embed")
        .args(["--input", input.to_str().unwrap()])
        .args(["--output", output.to_str().unwrap()])
        .args(["--model", test_models().join(model).to_str().unwrap()])
        .args(["--actors", "1", "--batch-size", "3"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A case of the references: its texts and sentence-transformers' vectors.
struct Case {
    texts: Vec<String>,
    vectors: Vec<Vec<f32>>,
}

/// The case of `model` whose settings are `settings` (keys of the case
/// object besides its sentences, e.g. `{"prompt_name": "query"}`).
fn case(model: &str, settings: serde_json::Value) -> Case {
    let refs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(test_models().join("references.json")).unwrap())
            .unwrap();
    let m = refs["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == model)
        .unwrap_or_else(|| panic!("no model {model}"));
    let c = m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            ["prompt", "prompt_name", "dim"]
                .iter()
                .all(|k| c.get(*k).unwrap_or(&serde_json::Value::Null) == &settings[*k])
        })
        .unwrap_or_else(|| panic!("no case {settings} of {model}"));
    let sentences = c["sentences"].as_array().unwrap();
    Case {
        texts: sentences
            .iter()
            .map(|s| s["text"].as_str().unwrap().to_owned())
            .collect(),
        vectors: sentences
            .iter()
            .map(|s| {
                s["embedding"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect(),
    }
}

/// The case's texts as a JSONL file in `dir`, ids `t0`, `t1`, ….
fn input(dir: &Path, case: &Case) -> PathBuf {
    let path = dir.join("texts.jsonl");
    let lines: Vec<String> = case
        .texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": format!("t{i}"), "text": t}).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Each family, pooling and feature through the whole job: every row's
/// vector within cosine 0.9999 and 1e-4 of sentence-transformers'.
#[test]
fn every_model_kind_embeds_as_sentence_transformers_does() {
    let runs: [(&str, serde_json::Value, &[&str]); 7] = [
        (
            "xlmr-cls-normalize",
            serde_json::json!({"prompt_name": "passage"}),
            &["--prompt-name", "passage"],
        ),
        (
            "xlmr-cls-normalize",
            serde_json::json!({"prompt": "query: "}),
            &["--prompt", "query: "],
        ),
        (
            "xlmr-mean-normalize",
            serde_json::json!({"dim": 24}),
            &["--dim", "24"],
        ),
        ("mpnet-mean-normalize", serde_json::json!({}), &[]),
        (
            "mpnet-cls-dense-identity",
            serde_json::json!({}),
            &["--precision", "f32"],
        ),
        ("bert-cls-max-mean-dense-tanh", serde_json::json!({}), &[]),
        // The folder's default prompt applies when none is asked for, and
        // its tokens are left out of the pooling.
        (
            "bert-mean-prompt-excluded",
            serde_json::json!({"prompt_name": "query"}),
            &[],
        ),
    ];
    for (i, (model, settings, args)) in runs.iter().enumerate() {
        let dir = scratch(&format!("models-kind{i}"));
        let case = case(model, settings.clone());
        let input = input(&dir, &case);
        let output = dir.join("out");
        let mut extra = vec!["--format", "jsonl"];
        extra.extend_from_slice(args);
        let (ok, stderr) = embed(model, &input, &output, &extra);
        assert!(ok, "{model} {args:?}: {stderr}");
        let rows = read_output(&output);
        assert_eq!(rows.len(), case.texts.len(), "{model}: every row once");
        for (j, want) in case.vectors.iter().enumerate() {
            let got = &rows[&format!("t{j}")];
            assert_eq!(got.len(), want.len(), "{model} {args:?}: width");
            let diff = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let c = cosine(got, want);
            assert!(
                c >= 0.9999 && diff <= 1e-4,
                "{model} {args:?} row {j}: cosine {c}, max abs diff {diff:e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Parquet parts of a prompted, truncated job: the embedding a fixed-size
/// list of `--dim`'s width, the prompt and the model's similarity function
/// in the schema's metadata (read back by pyarrow).
#[test]
fn parquet_output_records_width_prompt_and_similarity() {
    let dir = scratch("models-parquet");
    let case = case("mpnet-mean-normalize", serde_json::json!({"dim": 32}));
    let input = input(&dir, &case);
    let output = dir.join("out");
    let (ok, stderr) = embed(
        "mpnet-mean-normalize",
        &input,
        &output,
        &["--dim", "32", "--prompt", "search: "],
    );
    assert!(ok, "{stderr}");
    let got = pyarrow_dataset(&output.join("parts"));
    assert_eq!(got["rows"], case.texts.len());
    assert_eq!(
        got["embedding"],
        "fixed_size_list<item: float not null>[32]"
    );
    assert_eq!(got["metadata"]["flotilla.prompt"], "search: ");
    assert_eq!(got["metadata"]["flotilla.similarity"], "dot");
    // Another prompt is another job: its default id differs, and the
    // same output folder refuses it, naming both.
    let (ok, stderr) = embed(
        "mpnet-mean-normalize",
        &input,
        &output,
        &["--dim", "32", "--prompt", "other: "],
    );
    assert!(
        !ok && stderr.contains("other: ") && stderr.contains("search: "),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What a folder cannot do is refused before any row is read, with a
/// message naming what was asked and what there is.
#[test]
fn prompts_dimensions_and_folders_a_model_lacks_are_refused_by_name() {
    let dir = scratch("models-refused");
    let case = case("xlmr-cls-normalize", serde_json::json!({}));
    let input = input(&dir, &case);
    let output = dir.join("out");

    let (ok, stderr) = embed(
        "xlmr-cls-normalize",
        &input,
        &output,
        &["--prompt-name", "summary"],
    );
    assert!(
        !ok && stderr.contains("summary") && stderr.contains("passage, query"),
        "{stderr}"
    );
    let (ok, stderr) = embed("xlmr-cls-normalize", &input, &output, &["--dim", "49"]);
    assert!(
        !ok && stderr.contains("49") && stderr.contains("48"),
        "{stderr}"
    );
    let (ok, stderr) = embed("xlmr-cls-normalize", &input, &output, &["--dim", "0"]);
    assert!(!ok, "{stderr}");
    assert!(!output.join("parts").exists(), "nothing written");

    // A copy of a folder with a pooling mode and then an architecture
    // the embedder does not implement.
    let copy = dir.join("model");
    copy_dir(&test_models().join("bert-cls"), &copy);
    let run = |copy: &Path| {
        Command::new(NODE)
            .arg("embed")
            .args(["--input", input.to_str().unwrap()])
            .args(["--output", output.to_str().unwrap()])
            .args(["--model", copy.to_str().unwrap()])
            .output()
            .unwrap()
    };
    std::fs::write(
        copy.join("1_Pooling/config.json"),
        r#"{"embedding_dimension":64,"pooling_mode":"attention"}"#,
    )
    .unwrap();
    let out = run(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("attention") && stderr.contains("lasttoken"),
        "{stderr}"
    );
    std::fs::write(
        copy.join("1_Pooling/config.json"),
        r#"{"embedding_dimension":64,"pooling_mode":"cls"}"#,
    )
    .unwrap();
    let config = std::fs::read_to_string(copy.join("config.json")).unwrap();
    std::fs::write(
        copy.join("config.json"),
        config.replace("\"bert\"", "\"deberta-v2\""),
    )
    .unwrap();
    let out = run(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("deberta-v2")
            && stderr.contains("xlm-roberta")
            && stderr.contains("mpnet"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
