//! `node embed` on the embedded default: real model, local files.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{
    assert_exactly_once, cosine, model, parts, pyarrow_dataset, read_output, root, s3_put,
    s3_server, scratch,
};

const NODE: &str = env!("CARGO_BIN_EXE_node");

fn embed(input: &Path, output: &Path, extra: &[&str]) -> (bool, String, String) {
    embed_at(
        input.to_str().unwrap(),
        output.to_str().unwrap(),
        extra,
        &[],
    )
}

/// `node embed` with input and output as paths or URLs and `env` set.
fn embed_at(
    input: &str,
    output: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> (bool, String, String) {
    // The test model unless `extra` names another.
    let model = model();
    let default_model = ["--model", model.to_str().unwrap()];
    let out = Command::new(NODE)
        .arg("embed")
        .args(["--input", input, "--output", output])
        .args(if extra.contains(&"--model") {
            &[][..]
        } else {
            &default_model[..]
        })
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`embed_at`] that must succeed; its stdout.
fn embed_ok(input: &str, output: &str, extra: &[&str], env: &[(&str, String)]) -> String {
    let (ok, stdout, stderr) = embed_at(input, output, extra, env);
    assert!(ok, "{stdout}{stderr}");
    stdout
}

#[test]
fn corpus_is_embedded_exactly_once_and_a_rerun_does_nothing() {
    let dir = scratch("corpus");
    let (corpus, ids) = common::corpus(&dir, 4000);
    let output = dir.join("out");
    let args = ["--actors-per-node", "2", "--format", "jsonl"];
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("4000 texts"), "{stdout}");

    assert_exactly_once(&output, &ids);
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

/// `--input s3://…/` on an S3-compatible server: the shards under the
/// prefix (one gzip-compressed) are read in name order, every id once, the
/// malformed line reported with its shard; a glob URL takes what it matches.
#[test]
fn s3_input_shards_are_read_through_the_object_store() {
    let server = s3_server();
    let dir = scratch("s3-in");
    let local = dir.join("in");
    let ids = jsonl_shards(&local);
    for name in [
        "a.jsonl",
        "b.jsonl.gz",
        "sub/c.jsonl",
        "_SUCCESS",
        "notes.txt",
    ] {
        s3_put(
            &server,
            &format!("corpus/{name}"),
            std::fs::read(local.join(name)).unwrap(),
        );
    }
    let env = server.env();
    let run = |input: &str, output: &Path| {
        let extra = ["--actors-per-node", "2", "--format", "jsonl"];
        embed_ok(input, output.to_str().unwrap(), &extra, &env)
    };
    let output = dir.join("out");
    let stdout = run("s3://embeds/corpus/", &output);
    assert!(stdout.contains(" 400 texts"), "{stdout}");
    assert_exactly_once(&output, &ids);
    let errors = std::fs::read_to_string(output.join("errors.jsonl")).unwrap();
    assert!(
        errors.contains("\"shard\":\"b.jsonl.gz\",\"line\":5"),
        "{errors}"
    );
    let globbed = dir.join("out-glob");
    run("s3://embeds/corpus/a*", &globbed);
    assert_exactly_once(&globbed, &ids[..150]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--output s3://…` on an S3-compatible server: parts, manifest and errors
/// land in the bucket, and a rerun finds every batch done there.
#[test]
fn s3_output_is_written_and_resumed() {
    let server = s3_server();
    let input = root().join("examples/data/sample.jsonl");
    let env = server.env();
    let run = || {
        let extra = ["--actors-per-node", "2"];
        embed_ok(input.to_str().unwrap(), "s3://embeds/run", &extra, &env)
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

/// Rows `from..to` of the synthetic corpus as JSON lines, and their ids.
fn corpus_rows(from: u64, to: u64) -> (String, Vec<String>) {
    let seed = flotilla_testkit::corpus::DEFAULT_SEED;
    let mut text = String::new();
    let mut ids = Vec::new();
    for i in from..to {
        let (id, t) = flotilla_testkit::corpus::row(seed, i);
        text.push_str(&serde_json::json!({ "id": id, "text": t }).to_string());
        text.push('\n');
        ids.push(id);
    }
    (text, ids)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A folder of three JSONL shards: `a.jsonl` (rows 0..150), `b.jsonl.gz`
/// (rows 150..300, and a malformed line as its fifth), `sub/c.jsonl`
/// (300..400), beside files that are not shards. Returns the 400 valid ids.
fn jsonl_shards(dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let (a, mut ids) = corpus_rows(0, 150);
    std::fs::write(dir.join("a.jsonl"), a).unwrap();
    let (b, b_ids) = corpus_rows(150, 300);
    let mut lines: Vec<&str> = b.lines().collect();
    lines.insert(4, "{\"id\": \"broken\"");
    std::fs::write(
        dir.join("b.jsonl.gz"),
        gzip((lines.join("\n") + "\n").as_bytes()),
    )
    .unwrap();
    let (c, c_ids) = corpus_rows(300, 400);
    std::fs::write(dir.join("sub/c.jsonl"), c).unwrap();
    std::fs::write(dir.join("_SUCCESS"), "").unwrap();
    std::fs::write(dir.join("notes.txt"), "not a shard").unwrap();
    ids.extend(b_ids);
    ids.extend(c_ids);
    ids
}

/// `--input` as a folder of JSONL shards (one gzip-compressed): every id
/// once, the malformed line reported with its shard and line; a rerun after
/// losing two parts recomputes exactly those two and leaves the rest
/// untouched (batch ids are stable across shards); a glob takes the shards
/// it matches; JSONL and Parquet shards in one input are refused.
#[test]
fn folder_and_glob_inputs_read_every_shard_and_resume_across_them() {
    let dir = scratch("shards");
    let input = dir.join("in");
    let ids = jsonl_shards(&input);
    let output = dir.join("out");
    let args = [
        "--actors-per-node",
        "2",
        "--batch-size",
        "32",
        "--format",
        "jsonl",
    ];
    let (ok, stdout, stderr) = embed(&input, &output, &args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(" 400 texts"), "{stdout}");
    assert_exactly_once(&output, &ids);
    let errors = std::fs::read_to_string(output.join("errors.jsonl")).unwrap();
    let error: serde_json::Value = serde_json::from_str(errors.trim()).unwrap();
    assert_eq!(error["shard"], "b.jsonl.gz", "{errors}");
    assert_eq!(error["line"], 5, "{errors}");

    // Two parts lost (one spans the first two shards): a rerun recomputes
    // those two batches only.
    let before = parts(&output);
    assert_eq!(before.len(), 13, "400 rows in batches of 32");
    for lost in ["batch-00000004.jsonl", "batch-00000011.jsonl"] {
        std::fs::remove_file(output.join("parts").join(lost)).unwrap();
    }
    let (ok, stdout, stderr) = embed(&input, &output, &args);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("in 2 batches (11 skipped as done)"),
        "{stdout}"
    );
    let after = parts(&output);
    for (name, modified) in &before {
        if !["batch-00000004.jsonl", "batch-00000011.jsonl"].contains(&name.as_str()) {
            assert_eq!(after.get(name), Some(modified), "{name} rewritten");
        }
    }
    assert_exactly_once(&output, &ids);

    // A glob: `*` does not cross into sub/.
    let glob = PathBuf::from(format!("{}/*.jsonl*", input.display()));
    let globbed = dir.join("out-glob");
    let (ok, _, stderr) = embed(&glob, &globbed, &args);
    assert!(ok, "{stderr}");
    assert_exactly_once(&globbed, &ids[..300]);

    // Mixed kinds are refused, naming both.
    std::fs::write(input.join("d.parquet"), b"PAR1").unwrap();
    let (ok, _, stderr) = embed(&input, &dir.join("out-mixed"), &args);
    assert!(!ok && stderr.contains("mixes JSONL"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parquet shards (several row groups each) in, Parquet parts out with an
/// input column kept (`--output-columns`): pyarrow reads the parts folder
/// as one dataset with every row, the embedding as a fixed-size list of
/// 384 float32 and the model revision in the schema metadata.
#[test]
fn parquet_shards_in_and_a_parts_folder_pyarrow_reads_whole() {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, RecordBatch, StringArray};

    let dir = scratch("pq-shards");
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let mut ids = Vec::new();
    for (shard, range) in [("p0.parquet", 0..120u64), ("p1.parquet", 120..200)] {
        let rows: Vec<(String, String)> = range
            .map(|i| flotilla_testkit::corpus::row(flotilla_testkit::corpus::DEFAULT_SEED, i))
            .collect();
        ids.extend(rows.iter().map(|(id, _)| id.clone()));
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.0))) as ArrayRef,
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.1))) as ArrayRef,
            ),
            (
                "lang",
                Arc::new(StringArray::from_iter_values(rows.iter().map(|_| "en"))) as ArrayRef,
            ),
        ])
        .unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(50))
            .build();
        let file = std::fs::File::create(input.join(shard)).unwrap();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    let output = dir.join("out");
    let (ok, stdout, stderr) = embed(
        &input,
        &output,
        &[
            "--actors-per-node",
            "2",
            "--batch-size",
            "48",
            "--output-columns",
            "lang",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("200 texts"), "{stdout}");
    assert!(stdout.contains("pyarrow.dataset.dataset("), "{stdout}");
    let read = pyarrow_dataset(&output.join("parts"));
    assert_eq!(read["rows"], 200, "{read}");
    let mut got: Vec<String> = read["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    assert_eq!(
        read["names"],
        serde_json::json!(["id", "embedding", "lang"])
    );
    assert_eq!(
        read["embedding"], "fixed_size_list<item: float not null>[384]",
        "{read}"
    );
    assert!(
        read["metadata"]["flotilla.model_revision"]
            .as_str()
            .unwrap()
            .starts_with("sha256:53aa5117"),
        "{read}"
    );
    assert!(read["lang"].as_array().unwrap().iter().all(|v| v == "en"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Without a model folder, `node embed` says how to get one.
#[test]
fn a_missing_model_folder_says_how_to_fetch_it() {
    let dir = scratch("no-model");
    let input = root().join("examples/data/sample.jsonl");
    let out = Command::new(NODE)
        .arg("embed")
        .args(["--input", input.to_str().unwrap()])
        .args(["--output", dir.join("out").to_str().unwrap()])
        .args(["--model", dir.join("nowhere").to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("scripts/fetch-model"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A count that must be positive, given as 0 (`--batch-size 0` used to
/// run batches of one), is refused by name before anything is read or
/// written, here and for a detached job before the head is asked.
#[test]
fn zero_batch_size_and_other_zero_counts_are_refused_by_name() {
    let dir = scratch("zero");
    let input = root().join("examples/data/sample.jsonl");
    for (flag, extra) in [
        ("--batch-size", &[][..]),
        ("--memory-budget-mb", &[][..]),
        ("--batch-size", &["--detach", "--head", "127.0.0.1:9"][..]),
    ] {
        let (ok, _, stderr) = embed(&input, &dir.join("out"), &[&[flag, "0"], extra].concat());
        assert!(
            !ok && stderr.contains(&format!("{flag} is 0")),
            "{flag} {extra:?}: {stderr}"
        );
        assert!(!dir.join("out").exists(), "nothing written");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The restarts an end summary reports.
fn restarts_in(summary: &str) -> u64 {
    summary
        .split(" actor restarts")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no restart count in {summary}"))
}

/// Clause "supervision: a panicking embedding actor": with the failpoint
/// `embedder::encode` panicking the model thread now and then (the second
/// batch for sure, then 3 % of them), the job's supervisor restarts the
/// actor with its model reloaded, the failed batch goes to the other actor
/// meanwhile, every id is written exactly once and the summary counts the
/// restarts. The same with `--micro-batch 0`, the pipelined threads GPU
/// actors run (a batch answered from a task while the next is tokenized).
#[test]
fn a_job_with_panicking_actors_completes_exactly_once_and_counts_restarts() {
    let dir = scratch("panics");
    let (corpus, ids) = common::corpus(&dir, 640);
    for micro_batch in ["16", "0"] {
        let output = dir.join(format!("out-{micro_batch}"));
        let points = (
            "FLOTILLA_FAILPOINTS",
            "embedder::encode=1*off->1*panic->3%panic".to_owned(),
        );
        let args = [
            "--actors-per-node",
            "2",
            "--format",
            "jsonl",
            "--batch-size",
            "32",
            "--micro-batch",
            micro_batch,
        ];
        let (ok, stdout, stderr) = embed_at(
            corpus.to_str().unwrap(),
            output.to_str().unwrap(),
            &args,
            &[points],
        );
        assert!(ok, "micro-batch {micro_batch}: {stderr}");
        assert_exactly_once(&output, &ids);
        assert!(
            restarts_in(&stdout) >= 1,
            "micro-batch {micro_batch}: {stdout}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A row that panics the actor on every attempt (failpoint
/// `embedder::poison`, set to a mark one text holds): its batch is split
/// until the row is isolated; it goes to errors.jsonl with the reason and
/// every other id is written exactly once; the crashes it causes cost the
/// actors' restart limit once, so a limit of 2 restarts holds the dozen
/// crashes; a rerun sends only that row again, writes no row twice and
/// refuses it again.
#[test]
fn a_row_that_panics_the_actor_is_isolated_and_the_rest_embedded_once() {
    let dir = scratch("poison");
    let (clean, ids) = common::corpus(&dir, 320);
    let poison = &ids[101];
    let corpus = dir.join("poisoned.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(&clean)
        .unwrap()
        .lines()
        .map(|l| {
            let mut row: serde_json::Value = serde_json::from_str(l).unwrap();
            if row["id"] == poison.as_str() {
                let text = format!("{} POISON-ROW", row["text"].as_str().unwrap());
                row["text"] = text.into();
            }
            row.to_string()
        })
        .collect();
    std::fs::write(&corpus, lines.join("\n")).unwrap();
    let output = dir.join("out");
    let args = [
        "--actors-per-node",
        "2",
        "--format",
        "jsonl",
        "--batch-size",
        "32",
        "--max-restarts",
        "2",
    ];
    let points = (
        "FLOTILLA_FAILPOINTS",
        "embedder::poison=return(POISON-ROW)".to_owned(),
    );
    let others: Vec<String> = ids.iter().filter(|id| *id != poison).cloned().collect();
    for run in ["first", "rerun"] {
        let (ok, stdout, stderr) = embed_at(
            corpus.to_str().unwrap(),
            output.to_str().unwrap(),
            &args,
            std::slice::from_ref(&points),
        );
        assert!(ok, "{run}: {stderr}");
        assert!(
            stdout.contains(", 1 failing rows isolated ("),
            "{run}: {stdout}"
        );
        // Past the limit of 2 on the first run: forgiven after the first.
        let least = if run == "first" { 4 } else { 2 };
        assert!(restarts_in(&stdout) >= least, "{run}: {stdout}");
        assert_exactly_once(&output, &others);
        let errors = std::fs::read_to_string(output.join("errors.jsonl")).unwrap();
        let refused: Vec<serde_json::Value> = errors
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(refused.len(), 1, "{run}: {errors}");
        assert_eq!(refused[0]["id"], poison.as_str());
        assert!(
            refused[0]["reason"]
                .as_str()
                .unwrap()
                .starts_with("failed on every attempt"),
            "{errors}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Clause "supervision: restart limit": an actor that panics on every
/// batch is restarted up to --max-restarts times, then the job stops with
/// an error naming the actor and the limit, and exits non-zero; the same
/// command without the failpoint then completes, recomputing no part
/// written before.
#[test]
fn an_actor_past_its_restart_limit_stops_the_job_and_a_rerun_resumes() {
    let dir = scratch("restart-limit");
    let (corpus, ids) = common::corpus(&dir, 320);
    let output = dir.join("out");
    let args = [
        "--actors-per-node",
        "1",
        "--format",
        "jsonl",
        "--batch-size",
        "32",
    ];
    // Two batches get through, then every one panics.
    let points = (
        "FLOTILLA_FAILPOINTS",
        "embedder::encode=2*off->panic".to_owned(),
    );
    let started = std::time::Instant::now();
    let (ok, _, stderr) = embed_at(
        corpus.to_str().unwrap(),
        output.to_str().unwrap(),
        &[&args[..], &["--max-restarts", "3"]].concat(),
        &[points],
    );
    assert!(!ok, "the job should have stopped");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert!(
        stderr.contains("embedding actor local.0: more than 3 restarts within 60s"),
        "{stderr}"
    );
    let written = parts(&output);
    assert_eq!(written.len(), 2, "the two batches before the panics");
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("(2 skipped as done)"), "{stdout}");
    let after = parts(&output);
    for (name, modified) in &written {
        assert_eq!(after.get(name), Some(modified), "{name} was recomputed");
    }
    assert_exactly_once(&output, &ids);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Clause "embed job: length-sorted windows": a job killed with SIGKILL in
/// the middle of a window and run again cuts the same batches from the
/// same windows, so it skips exactly the parts already written and
/// rewrites none; every id is written once.
#[test]
fn a_job_killed_mid_window_resumes_without_recomputing_a_batch() {
    let dir = scratch("window-kill");
    let (corpus, ids) = common::corpus(&dir, 3000);
    let output = dir.join("out");
    let args = [
        "--actors-per-node",
        "1",
        "--format",
        "jsonl",
        "--batch-size",
        "16",
        "--sort-window",
        "512",
    ];
    let mut first = Command::new(NODE)
        .arg("embed")
        .args(["--input", corpus.to_str().unwrap()])
        .args(["--output", output.to_str().unwrap()])
        .args(["--model", model().to_str().unwrap()])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed inside the first window of 32 batches.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while parts(&output).len() < 8 {
        assert!(std::time::Instant::now() < deadline, "no parts written");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = first.kill();
    let _ = first.wait();
    let before = parts(&output);
    assert!(before.len() < 32, "killed past the first window");
    let (ok, stdout, stderr) = embed(&corpus, &output, &args);
    assert!(ok, "{stderr}");
    let skipped = format!("({} skipped as done)", before.len());
    assert!(stdout.contains(&skipped), "{stdout} should say {skipped}");
    let after = parts(&output);
    for (name, modified) in &before {
        assert_eq!(after.get(name), Some(modified), "{name} was rewritten");
    }
    assert_exactly_once(&output, &ids);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--device cuda` where no GPU can be used (this machine, or a build
/// without the `cuda` feature) stops the job before any output with the
/// reason; `--device auto` (the default) runs on the CPU and the summary
/// says where the actors ran.
#[test]
fn a_gpu_asked_for_where_there_is_none_is_refused_with_the_reason() {
    if cfg!(feature = "cuda") && flotilla::config::detect_gpus() > 0 {
        return; // A GPU machine: the refusal cannot happen here.
    }
    let dir = scratch("no-gpu");
    let input = root().join("examples/data/sample.jsonl");
    let (ok, stdout, stderr) = embed(&input, &dir.join("cuda"), &["--device", "cuda"]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("a GPU was asked for"), "{stderr}");
    assert!(!dir.join("cuda/parts").exists() || parts(&dir.join("cuda")).is_empty());

    let (ok, stdout, stderr) = embed(&input, &dir.join("auto"), &["--actors-per-node", "2"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("devices: cpu ×2 (f32)"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The lowest cosine between two jobs' vectors over `ids`.
fn worst_cosine(
    a: &std::collections::HashMap<String, Vec<f32>>,
    b: &std::collections::HashMap<String, Vec<f32>>,
    ids: &[String],
) -> f32 {
    ids.iter()
        .map(|id| cosine(&a[id], &b[id]))
        .fold(1.0f32, f32::min)
}

/// `--precision bf16` runs the job in bfloat16 (on the CPU here): every
/// row is written once, within cosine 0.999 of the f32 job's vector, and
/// the summary names the precision. `node model convert` writes an f16
/// copy of the model folder that the same job loads, and refuses int8.
/// `--precision int8` (with `--device auto`: the CPU) writes every row once
/// within cosine 0.99 of the f32 job's vector.
#[test]
fn quantized_and_half_precision_jobs_stay_within_their_bars_of_the_f32_job() {
    let dir = scratch("precision");
    let (corpus, ids) = common::corpus(&dir, 300);
    let f32_out = dir.join("f32");
    let (ok, stdout, stderr) = embed(&corpus, &f32_out, &["--format", "jsonl"]);
    assert!(ok, "{stdout}{stderr}");

    let convert = |precision: &str, out: &Path| {
        Command::new(NODE)
            .args(["model", "convert", "--precision", precision])
            .args(["--model", model().to_str().unwrap()])
            .args(["--out", out.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let f16_model = dir.join("model-f16");
    let out = convert("f16", &f16_model);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = convert("int8", &dir.join("model-int8"));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(why.contains("chosen when a model loads"), "{why}");

    let bf16_out = dir.join("bf16");
    let half = [
        "--model",
        f16_model.to_str().unwrap(),
        "--format",
        "jsonl",
        "--precision",
        "bf16",
        "--device",
        "cpu",
    ];
    let (ok, stdout, stderr) = embed(&corpus, &bf16_out, &half);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("(bf16)"), "{stdout}");
    assert_exactly_once(&bf16_out, &ids);

    let int8_out = dir.join("int8");
    let quantized = ["--format", "jsonl", "--precision", "int8"];
    let (ok, stdout, stderr) = embed(&corpus, &int8_out, &quantized);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("(int8)"), "{stdout}");
    assert_exactly_once(&int8_out, &ids);

    let full = read_output(&f32_out);
    let worst = worst_cosine(&full, &read_output(&bf16_out), &ids);
    assert!(worst >= 0.999, "bf16: worst cosine {worst}");
    let worst = worst_cosine(&full, &read_output(&int8_out), &ids);
    assert!(worst >= 0.99, "int8: worst cosine {worst}");
    std::fs::remove_dir_all(&dir).unwrap();
}
