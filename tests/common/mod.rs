//! Helpers shared by the multi-process tests: the process starters of
//! `flotilla_testkit::cluster`, and what the embed tests read back.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::Value;

#[allow(unused_imports)]
pub use flotilla_testkit::cluster::*;
pub use flotilla_testkit::s3::S3Server;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model() -> PathBuf {
    std::env::var_os("FLOTILLA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/all-MiniLM-L6-v2"))
}

/// A program of the test tools' environment (`scripts/fetch-test-tools`):
/// where `env` says, else in its default folder.
pub fn test_tool(env: &str, program: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap())
            .join(".cache/flotilla/test-venv/bin")
            .join(program)
    });
    assert!(
        path.exists(),
        "no {program} at {}: run scripts/test, or scripts/fetch-test-tools",
        path.display()
    );
    path
}

/// The Python that reads outputs back.
pub fn test_python() -> PathBuf {
    test_tool("FLOTILLA_TEST_PYTHON", "python")
}

/// What pyarrow's dataset API makes of a parts folder.
/// A folder of Parquet parts as pyarrow reads it as one dataset: rows,
/// ids, column names, the embedding's type, the schema's metadata (and a
/// `lang` column where there is one).
pub fn pyarrow_dataset(parts: &Path) -> serde_json::Value {
    const READ: &str = r#"
import json, sys
import pyarrow.dataset as ds
d = ds.dataset(sys.argv[1], format="parquet")
t = d.to_table()
meta = {k.decode(): v.decode() for k, v in (d.schema.metadata or {}).items()}
print(json.dumps({
    "rows": t.num_rows,
    "ids": t.column("id").to_pylist(),
    "names": t.schema.names,
    "embedding": str(t.schema.field("embedding").type),
    "metadata": meta,
    "lang": t.column("lang").to_pylist() if "lang" in t.schema.names else None,
}))
"#;
    let out = succeeded(Command::new(test_python()).args(["-c", READ, parts.to_str().unwrap()]));
    serde_json::from_str(&out).unwrap()
}

/// Runs `cmd` to its end, asserting it succeeded (showing what it said
/// otherwise); its standard output.
pub fn succeeded(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The cosine of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

/// A fresh folder under the temporary folder for one test.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-embed-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The small models of every supported family with sentence-transformers'
/// reference vectors (`scripts/make-test-models`): where
/// `FLOTILLA_TEST_MODELS` says, else in its default folder.
pub fn test_models() -> PathBuf {
    let dir = std::env::var_os("FLOTILLA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/flotilla/test-models")
        });
    assert!(
        dir.join("references.json").exists(),
        "no test models in {}: run scripts/test, or scripts/make-test-models",
        dir.display()
    );
    dir
}

/// Every output row: id → embedding, failing on any id seen twice.
pub fn read_output(output: &Path) -> HashMap<String, Vec<f32>> {
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

/// The first `rows` rows of the synthetic corpus, as a JSONL file in
/// `dir`, and their ids.
pub fn corpus(dir: &Path, rows: u64) -> (PathBuf, Vec<String>) {
    let path = dir.join(format!("corpus-{rows}.jsonl"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    flotilla_testkit::corpus::write_jsonl(&mut out, flotilla_testkit::corpus::DEFAULT_SEED, rows)
        .unwrap();
    std::io::Write::flush(&mut out).unwrap();
    let ids = flotilla_testkit::corpus::rows(flotilla_testkit::corpus::DEFAULT_SEED, rows)
        .map(|(id, _)| id)
        .collect();
    (path, ids)
}

/// The ids of a JSONL text, in order.
pub fn ids_of(jsonl: &str) -> Vec<String> {
    jsonl
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// Every input id exactly once, every vector of width 384 and unit norm.
pub fn assert_exactly_once(output: &Path, ids: &[String]) {
    let rows = read_output(output);
    assert_eq!(rows.len(), ids.len(), "rows written");
    for id in ids {
        let v = rows.get(id).unwrap_or_else(|| panic!("id {id} missing"));
        assert_eq!(v.len(), 384);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{id} has norm {norm}");
    }
}

/// Written JSON-lines parts of an output folder and their modification
/// times.
pub fn parts(output: &Path) -> BTreeMap<String, SystemTime> {
    std::fs::read_dir(output.join("parts"))
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().to_string_lossy().into_owned();
                // Temporary files are not parts yet.
                name.ends_with(".jsonl")
                    .then(|| (name, e.metadata().unwrap().modified().unwrap()))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The arguments of `node embed --head` the cluster tests share: `input`
/// to `output` with the real model, joining `head` with the folder's
/// admin identity, one actor per node, batches of 32, JSON-lines parts.
pub fn embed_on_cluster(
    cmd: &mut std::process::Command,
    input: &Path,
    output: &Path,
    head: std::net::SocketAddr,
    certs: &Path,
) {
    cmd.arg("embed")
        .args(["--input", input.to_str().unwrap()])
        .args(["--output", output.to_str().unwrap()])
        .args(["--model", model().to_str().unwrap()])
        .args(["--head", &head.to_string()])
        .args(["--certs", certs.to_str().unwrap()])
        .args([
            "--actors-per-node",
            "1",
            "--batch-size",
            "32",
            "--format",
            "jsonl",
        ]);
}

/// An S3-compatible server (`scripts/fetch-test-tools`' moto), started.
pub fn s3_server() -> S3Server {
    S3Server::start(&test_tool("FLOTILLA_S3_SERVER", "moto_server"))
}

/// Uploads `bytes` as `key` of the server's bucket.
pub fn s3_put(server: &S3Server, key: &str, bytes: Vec<u8>) {
    use object_store::ObjectStoreExt;
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(flotilla_testkit::s3::BUCKET)
        .with_endpoint(format!("http://127.0.0.1:{}", server.port))
        .with_allow_http(true)
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_region("us-east-1")
        .build()
        .unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store.put(&key.into(), bytes.into()))
        .unwrap();
}

/// A running driver; killed if the test ends before it does.
pub struct Driver(pub Option<std::process::Child>);

impl Driver {
    /// Kills it now, if it runs.
    pub fn kill(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a driver: `node embed --head` with the admin identity.
pub fn driver(
    s: &Scratch,
    head: &Proc,
    input: &Path,
    output: &Path,
    tag: &str,
    extra: &[&str],
) -> Driver {
    driver_env(s, head, input, output, tag, extra, &[])
}

/// [`driver`] with environment variables set (failpoints).
// The flags of one driver process, as a test writes them.
#[allow(clippy::too_many_arguments)]
pub fn driver_env(
    s: &Scratch,
    head: &Proc,
    input: &Path,
    output: &Path,
    tag: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Driver {
    let log = std::fs::File::create(s.dir.join(format!("driver-{tag}.log"))).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node"));
    embed_on_cluster(&mut cmd, input, output, head.addr, &s.certs());
    cmd.envs(env.iter().copied())
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .map(|child| Driver(Some(child)))
        .unwrap()
}

/// Waits for a driver; returns its success and summary line.
pub fn finish(s: &Scratch, mut driver: Driver, tag: &str) -> (bool, String) {
    let child = driver.0.take().expect("running");
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        eprintln!(
            "{}",
            std::fs::read_to_string(s.dir.join(format!("driver-{tag}.log"))).unwrap_or_default()
        );
    }
    (out.status.success(), stdout)
}

/// `node jobs --json` of the head, if it answers.
pub fn jobs_json(s: &Scratch, head: &Proc) -> Option<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["jobs", "--json", "--head", &head.addr.to_string()])
        .args(["--certs", s.certs().to_str().unwrap()])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// Actors a node runs, as the head's table reports them.
pub fn actors_on(s: &Scratch, head: &Proc, node: &str) -> Option<u64> {
    node_of(&s.status(head.addr)?, node)?["actors"].as_u64()
}

/// Workers `names` of the head at `head` declaring `cpus` (`cpu=N`) and
/// allowing detached jobs the test's folder and the model, all up.
pub fn cpu_workers(
    s: &Scratch,
    head: std::net::SocketAddr,
    names: &[&str],
    cpus: &str,
) -> Vec<Proc> {
    cpu_workers_env(s, head, names, cpus, &[], &[])
}

/// [`cpu_workers`] with environment variables set (failpoints) and more
/// flags.
pub fn cpu_workers_env(
    s: &Scratch,
    head: std::net::SocketAddr,
    names: &[&str],
    cpus: &str,
    env: &[(&str, &str)],
    more: &[&str],
) -> Vec<Proc> {
    // Detached jobs read and write the test's folder and the model only.
    let scratch = s.dir.canonicalize().unwrap();
    let model = model().canonicalize().unwrap();
    let workers = names
        .iter()
        .map(|w| {
            s.issue(w);
            let mut flags = vec![
                "--resource",
                cpus,
                "--allow-path",
                scratch.to_str().unwrap(),
                "--allow-path",
                model.to_str().unwrap(),
            ];
            flags.extend_from_slice(more);
            s.launch(Launch {
                role: "join",
                name: w,
                listen: free_addr(),
                head: Some(head),
                flags: &flags,
                env,
            })
        })
        .collect();
    eventually(Duration::from_secs(60), || {
        s.status(head).filter(|st| all_up(st, names)).map(|_| ())
    });
    workers
}
