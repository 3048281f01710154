//! `node embed` on the embedded default: real model, local files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const NODE: &str = env!("CARGO_BIN_EXE_node");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    std::env::var_os("FLOTILLA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/all-MiniLM-L6-v2"))
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-embed-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn embed(input: &Path, output: &Path, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(NODE)
        .arg("embed")
        .args([
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ])
        .args(["--model", model().to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every output row: id → embedding, failing on any id seen twice.
fn read_output(output: &Path) -> HashMap<String, Vec<f32>> {
    let mut rows = HashMap::new();
    for entry in std::fs::read_dir(output.join("parts")).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("jsonl"),
            "stray file {path:?}"
        );
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = v["id"].as_str().unwrap().to_owned();
            let emb: Vec<f32> = v["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            assert!(
                rows.insert(id.clone(), emb).is_none(),
                "id {id} written twice"
            );
        }
    }
    rows
}

#[test]
fn corpus_is_embedded_exactly_once_and_a_rerun_does_nothing() {
    let corpus = root().join("../shared/data/corpus-4k.jsonl");
    let dir = scratch("corpus");
    let output = dir.join("out");
    let args = ["--actors-per-node", "2", "--format", "jsonl"];
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("4000 texts"), "{stdout}");

    let rows = read_output(&output);
    let ids: Vec<String> = std::fs::read_to_string(&corpus)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(rows.len(), ids.len());
    for id in &ids {
        let v = rows.get(id).unwrap_or_else(|| panic!("id {id} missing"));
        assert_eq!(v.len(), 384);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{id} has norm {norm}");
    }
    assert_eq!(
        std::fs::read_to_string(output.join("errors.jsonl")).unwrap(),
        ""
    );

    // The same command again: everything is done, nothing is recomputed.
    let parts_before: Vec<_> = std::fs::read_dir(output.join("parts"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(" 0 texts in 0 batches (63 skipped as done)"),
        "{stdout}"
    );
    let parts_after: Vec<_> = std::fs::read_dir(output.join("parts"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    assert_eq!(parts_before, parts_after, "no part rewritten");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_rows_go_to_the_errors_file_and_the_rest_is_embedded() {
    let dir = scratch("bad");
    let input = dir.join("in.jsonl");
    std::fs::write(
        &input,
        "{\"id\":\"a\",\"text\":\"first\"}\nnot json\n{\"id\":\"b\",\"text\":\"second\"}\n{\"id\":\"a\",\"text\":\"dup\"}\n{\"id\":\"c\"}\n{\"id\":5,\"text\":\"numbered\"}\n",
    )
    .unwrap();
    let output = dir.join("out");
    let (ok, stdout, stderr) = embed(
        &input,
        &output,
        &[
            "--actors-per-node",
            "1",
            "--batch-size",
            "2",
            "--format",
            "jsonl",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("3 rows rejected"), "{stdout}");
    let rows = read_output(&output);
    let mut ids: Vec<&String> = rows.keys().collect();
    ids.sort();
    assert_eq!(ids, ["5", "a", "b"]);
    let errors: Vec<serde_json::Value> = std::fs::read_to_string(output.join("errors.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lines: Vec<u64> = errors.iter().map(|e| e["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, [2, 4, 5]);
    assert!(errors[1]["reason"].as_str().unwrap().contains("duplicate"));

    // Another job's output folder is refused.
    let other = dir.join("other.jsonl");
    std::fs::write(&other, "{\"id\":\"x\",\"text\":\"y\"}\n").unwrap();
    let (ok, _, stderr) = embed(
        &other,
        &output,
        &[
            "--actors-per-node",
            "1",
            "--batch-size",
            "2",
            "--format",
            "jsonl",
        ],
    );
    assert!(!ok && stderr.contains("holds job"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parquet in, Parquet out (the default format): custom column names, an
/// integer id column, a null text, the model revision in the file metadata.
#[test]
fn parquet_input_and_output_round_trip() {
    use std::sync::Arc;

    use arrow_array::{
        Array, ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray,
    };
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let dir = scratch("parquet");
    let input = dir.join("in.parquet");
    let schema = Arc::new(Schema::new(vec![
        Field::new("doc_id", DataType::Int64, false),
        Field::new("body", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![10, 11, 12, 13])) as ArrayRef,
            Arc::new(StringArray::from(vec![
                Some("alpha text"),
                None,
                Some("gamma"),
                Some("delta delta"),
            ])) as ArrayRef,
        ],
    )
    .unwrap();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(&input).unwrap(), schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();

    let output = dir.join("out");
    let (ok, stdout, stderr) = embed(
        &input,
        &output,
        &[
            "--actors-per-node",
            "1",
            "--batch-size",
            "2",
            "--id-column",
            "doc_id",
            "--text-column",
            "body",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("3 texts") && stdout.contains("1 rows rejected"),
        "{stdout}"
    );

    let mut ids = Vec::new();
    for entry in std::fs::read_dir(output.join("parts")).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(path.extension().and_then(|e| e.to_str()), Some("parquet"));
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
        let kv = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .clone();
        assert!(kv.iter().any(|k| {
            k.key == "flotilla.model_revision"
                && k.value
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("sha256:53aa5117")
        }));
        for batch in builder.build().unwrap() {
            let batch = batch.unwrap();
            let id = batch
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone();
            let emb = batch
                .column_by_name("embedding")
                .unwrap()
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .unwrap()
                .clone();
            assert_eq!(emb.value_length(), 384);
            for i in 0..batch.num_rows() {
                ids.push(id.value(i).to_owned());
                let v = emb.value(i);
                let v = v.as_any().downcast_ref::<Float32Array>().unwrap();
                let norm: f32 = v.values().iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((norm - 1.0).abs() < 1e-4);
            }
        }
    }
    ids.sort();
    assert_eq!(ids, ["10", "12", "13"]);
    let errors = std::fs::read_to_string(output.join("errors.jsonl")).unwrap();
    assert!(
        errors.contains("\"line\":2") && errors.contains("\"id\":\"11\""),
        "{errors}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
