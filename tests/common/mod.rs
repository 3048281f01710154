//! Helpers shared by the multi-process tests: a scratch folder with a
//! cluster CA, `node` processes that die with the test, polling.

#![allow(dead_code)]

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

pub const NODE: &str = env!("CARGO_BIN_EXE_node");

/// A scratch folder with a cluster CA and certificates.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Self { dir };
        s.node(&["certs", "init", "--out", s.certs().to_str().unwrap()]);
        s
    }

    pub fn certs(&self) -> PathBuf {
        self.dir.join("certs")
    }

    pub fn issue(&self, name: &str) {
        let certs = self.certs();
        let c = certs.to_str().unwrap();
        self.node(&["certs", "issue", "--ca", c, "--name", name, "--out", c]);
    }

    pub fn node(&self, args: &[&str]) -> String {
        let out = Command::new(NODE).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "node {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Starts `node head` or `node join`; logs go to DIR/NAME.log.
    pub fn spawn(
        &self,
        role: &str,
        name: &str,
        listen: SocketAddr,
        head: Option<SocketAddr>,
        certs: &Path,
    ) -> Proc {
        self.spawn_with(role, name, listen, head, certs, &[])
    }

    /// [`Scratch::spawn`] with extra flags.
    pub fn spawn_with(
        &self,
        role: &str,
        name: &str,
        listen: SocketAddr,
        head: Option<SocketAddr>,
        certs: &Path,
        extra: &[&str],
    ) -> Proc {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(NODE);
        cmd.arg(role)
            .args(["--name", name, "--listen", &listen.to_string()])
            .args(["--certs", certs.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(h) = head {
            cmd.args(["--head", &h.to_string()]);
        }
        Proc {
            child: cmd.spawn().unwrap(),
            name: name.to_owned(),
            addr: listen,
        }
    }

    pub fn status(&self, addr: SocketAddr) -> Option<Value> {
        let out = Command::new(NODE)
            .args([
                "status",
                "--json",
                "--head",
                &addr.to_string(),
                "--certs",
                self.certs().to_str().unwrap(),
            ])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

pub struct Proc {
    pub child: Child,
    pub name: String,
    pub addr: SocketAddr,
}

impl Proc {
    /// Waits for the process to exit, failing the test after `budget`.
    pub fn exit_within(&mut self, budget: Duration) -> std::process::ExitStatus {
        let (status, _) = eventually(budget, || self.child.try_wait().unwrap());
        status
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_addr() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

/// Polls `cond` until it yields a value or `budget` passes; returns the
/// value and how long it took.
pub fn eventually<T>(budget: Duration, mut cond: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(v) = cond() {
            return (v, start.elapsed());
        }
        assert!(
            start.elapsed() < budget,
            "condition not met within {budget:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn state_of(status: &Value, name: &str) -> Option<String> {
    status["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)
        .map(|n| n["state"].as_str().unwrap_or("").to_owned())
}

pub fn all_up(status: &Value, names: &[&str]) -> bool {
    names
        .iter()
        .all(|n| state_of(status, n).as_deref() == Some("up"))
}

/// Head and workers, all up.
pub fn cluster(s: &Scratch, workers: &[&str]) -> (Proc, Vec<Proc>) {
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    let mut procs = Vec::new();
    for w in workers {
        s.issue(w);
        procs.push(s.spawn("join", w, free_addr(), Some(head.addr), &s.certs()));
    }
    let mut names = vec!["head"];
    names.extend_from_slice(workers);
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &names))
    });
    (head, procs)
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model() -> PathBuf {
    std::env::var_os("FLOTILLA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/all-MiniLM-L6-v2"))
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
