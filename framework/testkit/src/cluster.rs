//! Real `node` processes for multi-process tests: a scratch folder with a
//! cluster CA, processes that die with the test, status polling with a
//! deadline.
//!
//! ```text
//! Scratch::new(tag, binary) ─► DIR/certs (CA via `node certs init`)
//!   .spawn("join", "w1", addr, Some(head), certs) ─► Proc (killed on drop), log DIR/w1.log
//!   .status(addr) ─► `node status --json`
//! eventually(budget, cond) ─► value and how long it took, or a failed test
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_proto::incarnation::Incarnation;
use serde_json::Value;

/// The folders of the models tests load: the repository's `models/`
/// (`scripts/fetch-model`) and the small models of every family
/// (`FLOTILLA_TEST_MODELS`, else their default folder). Every node the kit
/// starts allows them (`--allow-path`), as a deployment allows its models'
/// folder: a node loads the models jobs name only under its roots.
pub fn model_roots() -> Vec<PathBuf> {
    let repository = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let small = std::env::var_os("FLOTILLA_TEST_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/flotilla/test-models"))
        });
    [Some(repository), small]
        .into_iter()
        .flatten()
        .filter_map(|p| p.canonicalize().ok())
        .collect()
}

/// `--allow-path` for each of [`model_roots`].
fn model_roots_flags() -> Vec<String> {
    model_roots()
        .into_iter()
        .flat_map(|p| ["--allow-path".to_owned(), p.to_string_lossy().into_owned()])
        .collect()
}

pub use crate::ca::free_addr;

/// A scratch folder with a cluster CA and certificates, and the `node`
/// binary its processes run. Removed on drop unless the test failed (its
/// logs are kept then, and their folder printed).
pub struct Scratch {
    /// The folder.
    pub dir: PathBuf,
    binary: PathBuf,
}

impl Scratch {
    /// A fresh folder named after `tag` with a CA made by `binary certs
    /// init` (with the head's certificate, `head`, and the operator's,
    /// `admin`).
    pub fn new(tag: &str, binary: impl Into<PathBuf>) -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Self {
            dir,
            binary: binary.into(),
        };
        s.node(&["certs", "init", "--out", s.certs().to_str().unwrap()]);
        s
    }

    /// The certificates folder.
    pub fn certs(&self) -> PathBuf {
        self.dir.join("certs")
    }

    /// The binary the processes run.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Issues a worker's certificate for `name`, unless the folder has one
    /// of that name (`node certs init` made `head` and `admin`).
    pub fn issue(&self, name: &str) {
        if !self.certs().join(format!("{name}.crt")).exists() {
            self.issue_role(name, "worker");
        }
    }

    /// Issues a certificate of `role` (`worker`, `driver`, `admin`,
    /// `observer`, `head`) for `name`.
    pub fn issue_role(&self, name: &str, role: &str) {
        let certs = self.certs();
        let c = certs.to_str().unwrap();
        self.node(&[
            "certs", "issue", "--ca", c, "--name", name, "--role", role, "--out", c,
        ]);
    }

    /// Runs the binary with `args` to completion; its stdout.
    pub fn node(&self, args: &[&str]) -> String {
        let out = Command::new(&self.binary).args(args).output().unwrap();
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
        self.launch_in(
            Command::new(&self.binary),
            certs,
            Launch {
                role,
                name,
                listen,
                head,
                flags: &[],
                env: &[],
            },
        )
    }

    /// [`Scratch::spawn`] with this folder's certificates and extra flags.
    pub fn spawn_with(
        &self,
        role: &str,
        name: &str,
        listen: SocketAddr,
        head: Option<SocketAddr>,
        flags: &[&str],
    ) -> Proc {
        self.launch(Launch {
            role,
            name,
            listen,
            head,
            flags,
            env: &[],
        })
    }

    /// Starts the `node` process `launch` describes, with this folder's
    /// certificates.
    pub fn launch(&self, launch: Launch<'_>) -> Proc {
        self.launch_in(Command::new(&self.binary), &self.certs(), launch)
    }

    /// Starts `program` (the binary, or a command that runs it, as `ip
    /// netns exec` does) as `launch` describes, with the certificates in
    /// `certs`.
    pub fn launch_in(&self, mut program: Command, certs: &Path, launch: Launch<'_>) -> Proc {
        let Launch {
            role,
            name,
            listen,
            head,
            flags,
            env,
        } = launch;
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        program
            .envs(env.iter().copied())
            .arg(role)
            .args(["--name", name, "--listen", &listen.to_string()])
            .args(["--certs", certs.to_str().unwrap()])
            .args(model_roots_flags())
            .args(flags)
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(h) = head {
            program.args(["--head", &h.to_string()]);
        }
        Proc {
            child: program.spawn().unwrap(),
            name: name.to_owned(),
            addr: listen,
        }
    }

    /// Starts workers `names` given the heads `heads` (`ADDR,ADDR…`),
    /// each declaring `--resource cpu=2` and allowing detached jobs under
    /// `allow` (this folder and the model, say), and waits until the
    /// head at the first address sees them all up.
    pub fn spawn_set_workers(&self, names: &[&str], heads: &str, allow: &[&Path]) -> Vec<Proc> {
        let mut flags = vec!["--head".to_owned(), heads.to_owned()];
        flags.extend(["--resource".to_owned(), "cpu=2".to_owned()]);
        for root in allow {
            let root = root.canonicalize().unwrap();
            flags.extend([
                "--allow-path".to_owned(),
                root.to_string_lossy().into_owned(),
            ]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let workers = names
            .iter()
            .map(|w| {
                self.issue(w);
                self.spawn_with("join", w, free_addr(), None, &flags)
            })
            .collect();
        let first: SocketAddr = heads.split(',').next().unwrap().parse().unwrap();
        eventually(Duration::from_secs(60), || {
            self.status(first).filter(|st| all_up(st, names))
        });
        workers
    }

    /// Starts one head of a head set: `node head` named `head` (every head
    /// of a set runs the head's certificate) at `listen`, its state in
    /// `DIR/TAG-state`, its metrics at `metrics`, sharing the lease at
    /// `lease` with the others; `env` holds the lease store's settings.
    /// Logs go to `DIR/TAG.log`.
    pub fn spawn_head_of_set(
        &self,
        tag: &str,
        listen: SocketAddr,
        metrics: SocketAddr,
        lease: Lease<'_>,
        env: &[(&str, String)],
    ) -> Proc {
        let state = self.dir.join(format!("{tag}-state"));
        std::fs::create_dir_all(&state).unwrap();
        let log = std::fs::File::create(self.dir.join(format!("{tag}.log"))).unwrap();
        let child = Command::new(&self.binary)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(["head", "--name", "head", "--listen", &listen.to_string()])
            .args(["--certs", self.certs().to_str().unwrap()])
            .args(["--state-dir", state.to_str().unwrap()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args([
                "--lease-store",
                lease.store,
                "--lease-ms",
                &lease.ms.to_string(),
            ])
            .args(model_roots_flags())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Proc {
            child,
            name: "head".into(),
            addr: listen,
        }
    }

    /// Starts `node ROLE` for `name` (issuing its certificate when the
    /// folder has none) with `--metrics-listen` on a free port and `extra`
    /// flags; the process and where its metrics are served.
    pub fn spawn_metered(
        &self,
        role: &str,
        name: &str,
        head: Option<SocketAddr>,
        extra: &[&str],
    ) -> (Proc, SocketAddr) {
        self.issue(name);
        let metrics = crate::ca::free_tcp_addr();
        let listen = metrics.to_string();
        let flags = [extra, &["--metrics-listen", &listen]].concat();
        let proc = self.spawn_with(role, name, free_addr(), head, &flags);
        (proc, metrics)
    }

    /// `node status --json --no-supervisors` against `addr` (the member
    /// table alone, which is quick to poll), if it answers.
    pub fn status(&self, addr: SocketAddr) -> Option<Value> {
        self.status_with(addr, &["--no-supervisors"])
    }

    /// `node status --json` against `addr`, with every node's supervisors.
    pub fn status_with_supervisors(&self, addr: SocketAddr) -> Option<Value> {
        self.status_with(addr, &[])
    }

    fn status_with(&self, addr: SocketAddr, extra: &[&str]) -> Option<Value> {
        let out = Command::new(&self.binary)
            .args([
                "status",
                "--json",
                "--head",
                &addr.to_string(),
                "--certs",
                self.certs().to_str().unwrap(),
            ])
            .args(extra)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// A folder `DIR/NAME` for jobs to read and write, made, with its
    /// links resolved (what a node compares allowed roots against).
    pub fn job_root(&self, name: &str) -> PathBuf {
        let root = self.dir.join(name);
        std::fs::create_dir_all(&root).unwrap();
        root.canonicalize().unwrap()
    }

    /// Starts worker `name` joined to `head`, running detached jobs under
    /// `root` only (`--allow-path`), and waits until the head sees it up.
    pub fn worker_allowing(&self, name: &str, head: SocketAddr, root: &Path) -> Proc {
        self.issue(name);
        let worker = self.spawn_with(
            "join",
            name,
            free_addr(),
            Some(head),
            &["--allow-path", root.to_str().unwrap()],
        );
        eventually(Duration::from_secs(20), || {
            self.status(head).filter(|st| all_up(st, &["head", name]))
        });
        worker
    }

    /// `embed --detach` of `input` to `output` with `model`, submitted to
    /// `head` with the admin's certificate: the job's id.
    pub fn submit_embed(
        &self,
        head: SocketAddr,
        input: &Path,
        output: &Path,
        model: &Path,
    ) -> String {
        let submitted = Command::new(&self.binary)
            .args(["embed", "--detach", "--head", &head.to_string()])
            .args(["--certs", self.certs().to_str().unwrap()])
            .args(["--input", input.to_str().unwrap()])
            .args(["--output", output.to_str().unwrap()])
            .args(["--model", model.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            submitted.status.success(),
            "{}",
            String::from_utf8_lossy(&submitted.stderr)
        );
        String::from_utf8_lossy(&submitted.stdout).trim().to_owned()
    }

    /// `jobs wait ID` against `head` (a minute at most): its exit code and
    /// what it printed.
    pub fn wait_job(&self, head: SocketAddr, id: &str) -> (Option<i32>, String) {
        let waited = Command::new(&self.binary)
            .args(["jobs", "wait", id, "--head", &head.to_string()])
            .args([
                "--certs",
                self.certs().to_str().unwrap(),
                "--timeout-s",
                "60",
            ])
            .output()
            .unwrap();
        (
            waited.status.code(),
            String::from_utf8_lossy(&waited.stdout).into_owned(),
        )
    }

    /// What the process `name` logged so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Scratch {
    /// Removes what the cluster's killed processes left in shared memory
    /// (their processes are gone by now: a test's `Proc`s are declared
    /// after its `Scratch`), then the folder.
    fn drop(&mut self) {
        if let Ok(cookie) = std::fs::read_to_string(self.certs().join("cookie")) {
            let digest = flotilla_transport::certs::cookie_digest(cookie.trim());
            flotilla::objects::sweep_dead(flotilla::objects::scope_of(&digest));
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

/// One `node` process a test starts: `node ROLE --name NAME --listen
/// LISTEN [--head HEAD] FLAGS…` with `env` set (failpoints, store
/// settings).
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// `head` or `join`.
    pub role: &'a str,
    /// The member name (its certificate's).
    pub name: &'a str,
    /// Where it listens.
    pub listen: SocketAddr,
    /// The head it joins, where not given in `flags`.
    pub head: Option<SocketAddr>,
    /// More flags.
    pub flags: &'a [&'a str],
    /// Environment variables.
    pub env: &'a [(&'a str, &'a str)],
}

/// The lease a head set shares: its store (`--lease-store`) and how long
/// it stands unrenewed (`--lease-ms`).
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// The lease store's URL.
    pub store: &'a str,
    /// Milliseconds the lease stands unrenewed.
    pub ms: u64,
}

/// A `node` process, killed when dropped.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// Its node name.
    pub name: String,
    /// Its listen address.
    pub addr: SocketAddr,
}

impl Proc {
    /// Waits for the process to exit, failing the test after `budget`.
    pub fn exit_within(&mut self, budget: Duration) -> std::process::ExitStatus {
        let (status, _) = eventually(budget, || self.child.try_wait().unwrap());
        status
    }

    /// Sends `sig` (`-KILL`, `-STOP`, …) to the process.
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

/// The body of `GET /metrics` from a node's `--metrics-listen` address,
/// if it answers.
pub fn scrape(addr: SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_owned())
}

/// The value of the counter `series` (name and labels exactly as
/// Prometheus prints them) in a scrape, 0 when absent.
pub fn counter(scrape: &str, series: &str) -> u64 {
    gauge(scrape, series).map_or(0, |v| v as u64)
}

/// The value of the gauge `series` (name and labels exactly as Prometheus
/// prints them) in a scrape, if present.
pub fn gauge(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse::<f64>()
            .ok()
    })
}

/// `flotilla_head_role{role="ROLE"}` of the head serving metrics at
/// `metrics` (`None`: it does not answer, or has not reported the role).
pub fn head_role(metrics: SocketAddr, role: &str) -> Option<f64> {
    gauge(
        &scrape(metrics)?,
        &format!("flotilla_head_role{{role=\"{role}\"}}"),
    )
}

/// The entry of node `name` in a status document.
pub fn node_of<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)
}

/// The incarnation of `name` in a status document.
pub fn incarnation_of(status: &Value, name: &str) -> Option<Incarnation> {
    node_of(status, name)?["incarnation"]
        .as_u64()
        .map(Incarnation::new)
}

/// The state (`up`, `down`, `left`) of `name` in a status document.
pub fn state_of(status: &Value, name: &str) -> Option<String> {
    node_of(status, name).map(|n| n["state"].as_str().unwrap_or("").to_owned())
}

/// Whether every one of `names` is up in a status document.
pub fn all_up(status: &Value, names: &[&str]) -> bool {
    names
        .iter()
        .all(|n| state_of(status, n).as_deref() == Some("up"))
}

/// A head and `workers`, all seen up by the head.
pub fn cluster(s: &Scratch, workers: &[&str]) -> (Proc, Vec<Proc>) {
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

/// What a node sent to the systemd notification `socket` until `until`,
/// each with when it came.
pub fn notifications(
    socket: &std::os::unix::net::UnixDatagram,
    until: Instant,
) -> Vec<(Instant, String)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while Instant::now() < until {
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        socket.set_read_timeout(Some(left)).unwrap();
        if let Ok(n) = socket.recv(&mut buf) {
            got.push((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).trim().to_owned(),
            ));
        }
    }
    got
}

/// A notification socket for `name` in the scratch folder, and the
/// environment that points a node at it with a watchdog of `watchdog`.
pub fn notify_socket(
    s: &Scratch,
    name: &str,
    watchdog: Duration,
) -> (std::os::unix::net::UnixDatagram, [(String, String); 2]) {
    let path = s.dir.join(format!("{name}.notify"));
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let env = [
        (
            "NOTIFY_SOCKET".to_owned(),
            path.to_string_lossy().into_owned(),
        ),
        ("WATCHDOG_USEC".to_owned(), watchdog.as_micros().to_string()),
    ];
    (socket, env)
}

/// Writes `DIR/sup.toml`: a supervisor tree `tickers` whose one permanent
/// child, `ticker-1` (kind `flotilla.ticker`, a tick every 20 ms, a
/// snapshot every 10), runs on the first of w1, w2 that is up and
/// checkpoints to `DIR/ckpt`. Returns the file, for `--config`.
pub fn ticker_tree(s: &Scratch) -> PathBuf {
    let config = s.dir.join("sup.toml");
    std::fs::write(
        &config,
        format!(
            "[[supervisor]]\nname = \"tickers\"\n\n[[supervisor.child]]\nkind = \"flotilla.ticker\"\nname = \"ticker-1\"\nnodes = [\"w1\", \"w2\"]\ncheckpoint = {:?}\n[supervisor.child.args]\ntick_ms = 20\nevery = 10\n",
            s.dir.join("ckpt").to_str().unwrap()
        ),
    )
    .unwrap();
    config
}

/// The supervisor `tree` of `node` in a `node status --json` document.
pub fn supervisor_of<'a>(st: &'a Value, node: &str, tree: &str) -> Option<&'a Value> {
    st["nodes"].as_array()?.iter().find(|n| n["name"] == node)?["supervisors"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == tree)
}

/// A two-thread tokio runtime, for tests that run nodes in their own
/// process beside the `node` processes they start.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
