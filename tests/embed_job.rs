//! `node embed` on the embedded default: real model, local files.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{NODE, assert_exactly_once, ids_of, model, parts, read_output, root};

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

#[test]
fn corpus_is_embedded_exactly_once_and_a_rerun_does_nothing() {
    let corpus = root().join("../shared/data/corpus-4k.jsonl");
    let dir = scratch("corpus");
    let output = dir.join("out");
    let args = ["--actors-per-node", "2", "--format", "jsonl"];
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("4000 texts"), "{stdout}");

    assert_exactly_once(&output, &ids_of(&std::fs::read_to_string(&corpus).unwrap()));
    assert_eq!(
        std::fs::read_to_string(output.join("errors.jsonl")).unwrap(),
        ""
    );

    // The same command again: everything is done, nothing is recomputed.
    let parts_before = parts(&output);
    assert_eq!(parts_before.len(), 63);
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(" 0 texts in 0 batches (63 skipped as done)"),
        "{stdout}"
    );
    assert_eq!(parts(&output), parts_before, "no part rewritten");
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
    let args = [
        "--actors-per-node",
        "1",
        "--batch-size",
        "2",
        "--format",
        "jsonl",
    ];
    let (ok, stdout, stderr) = embed(&input, &output, &args);
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
    let (ok, _, stderr) = embed(&other, &output, &args);
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

/// An S3-compatible server on 127.0.0.1 (moto's, from
/// `scripts/fetch-s3-server`), stopped when dropped.
struct S3Server {
    child: std::process::Child,
    port: u16,
}

impl S3Server {
    fn start() -> Self {
        let path = std::env::var_os("FLOTILLA_S3_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap())
                    .join(".cache/flotilla/s3-venv/bin/moto_server")
            });
        assert!(
            path.exists(),
            "no S3 test server at {}: run scripts/test, or scripts/fetch-s3-server",
            path.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(path)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let server = Self { child, port };
        // Up when it answers; then the bucket.
        let start = std::time::Instant::now();
        while server
            .request("PUT", "/embeds")
            .is_none_or(|status| !status.contains(" 200"))
        {
            assert!(
                start.elapsed().as_secs() < 30,
                "S3 test server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        server
    }

    /// One plain HTTP request; the status line, if any answer came.
    fn request(&self, method: &str, path: &str) -> Option<String> {
        self.response(method, path)
            .and_then(|r| r.lines().next().map(str::to_owned))
    }

    /// One plain HTTP request; the whole response, if any came.
    fn response(&self, method: &str, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--output s3://…` on an S3-compatible server: parts, manifest and errors
/// land in the bucket, and a rerun finds every batch done there.
#[test]
fn s3_output_is_written_and_resumed() {
    let server = S3Server::start();
    let input = root().join("examples/data/sample.jsonl");
    let run = || {
        let out = Command::new(NODE)
            .arg("embed")
            .args(["--input", input.to_str().unwrap()])
            .args(["--output", "s3://embeds/run"])
            .args(["--model", model().to_str().unwrap()])
            .args(["--actors-per-node", "2"])
            .env("AWS_ENDPOINT", format!("http://127.0.0.1:{}", server.port))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let first = run();
    assert!(first.contains(" 200 texts in 4 batches"), "{first}");
    let listing = server
        .response("GET", "/embeds?list-type=2&prefix=run/")
        .unwrap_or_default();
    let keys = ["manifest.json", "errors.jsonl"]
        .into_iter()
        .map(str::to_owned)
        .chain((0..4).map(|b| format!("parts/batch-{b:08}.parquet")));
    for key in keys {
        assert!(
            listing.contains(&format!("<Key>run/{key}</Key>")),
            "run/{key} not in the bucket: {listing}"
        );
    }
    // The rerun lists the bucket's parts and finds every batch there.
    let second = run();
    assert!(
        second.contains(" 0 texts in 0 batches (4 skipped as done)"),
        "{second}"
    );
}
