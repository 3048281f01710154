//! Helpers shared by the examples: a throw-away cluster CA (from the test
//! kit) and worker processes started from the example's own executable;
//! and the examples' own actor kind ([`text_stats`]), which `my_node`
//! registers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

pub use flotilla_testkit::ca::{free_addr, scratch_certs};

pub mod text_stats;

/// A worker process running this same executable with `--worker NAME`.
pub struct Worker(Child);

impl Worker {
    /// Starts `current_exe --worker NAME --head HEAD --certs DIR`.
    pub fn start(name: &str, head: SocketAddr, certs: &Path) -> anyhow::Result<Self> {
        let child = Command::new(std::env::current_exe()?)
            .args(["--worker", name, "--head", &head.to_string()])
            .args(["--certs", &certs.to_string_lossy()])
            .spawn()?;
        Ok(Self(child))
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issues a driver's certificate for `name` in the CA folder `certs`.
pub fn issue_driver(certs: &Path, name: &str) -> anyhow::Result<()> {
    flotilla_testkit::ca::issue_role(certs, name, flotilla_proto::role::Role::Driver)?;
    Ok(())
}

/// A `my_node` process: the binary `cargo build -p flotilla-examples
/// --bins` puts beside this example's. Killed with SIGKILL when dropped.
pub struct MyNode(Child);

impl MyNode {
    /// Runs `my_node ARGS` (`head …` or `join …`), its log in `log`.
    pub fn start(args: &[&str], log: &Path) -> anyhow::Result<Self> {
        let binary = std::env::current_exe()?.with_file_name("my_node");
        anyhow::ensure!(
            binary.exists(),
            "{} is missing: cargo build -p flotilla-examples --bins",
            binary.display()
        );
        let child = Command::new(binary)
            .args(args)
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Self(child))
    }

    /// Kills it with SIGKILL, at once.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `my_node` head and a worker for each of `workers`, with the
/// certificates in `certs` and their logs in `dir`: the head's address and
/// the processes.
pub fn my_node_cluster(
    certs: &Path,
    dir: &Path,
    workers: &[&str],
) -> anyhow::Result<(SocketAddr, MyNode, Vec<MyNode>)> {
    let (c, addr) = (certs.to_string_lossy().into_owned(), free_addr());
    let head_addr = addr.to_string();
    let head = MyNode::start(
        &[
            "head", "--name", "head", "--listen", &head_addr, "--certs", &c,
        ],
        &dir.join("head.log"),
    )?;
    let mut started = Vec::new();
    for w in workers {
        let listen = free_addr().to_string();
        let args = [
            "join", "--name", w, "--listen", &listen, "--head", &head_addr, "--certs", &c,
        ];
        started.push(MyNode::start(&args, &dir.join(format!("{w}.log")))?);
    }
    Ok((addr, head, started))
}

impl Drop for MyNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Worker-mode arguments: `--worker NAME --head ADDR --certs DIR`.
pub fn worker_args() -> Option<(String, SocketAddr, PathBuf)> {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    Some((
        get("--worker")?,
        get("--head")?.parse().ok()?,
        get("--certs")?.into(),
    ))
}

/// In worker mode (`--worker NAME --head ADDR --certs DIR`), joins the head
/// with the kinds `register` adds and serves until killed, then returns
/// `Ok(true)`; otherwise returns `Ok(false)` at once.
pub async fn serve_if_worker(
    register: impl FnOnce(flotilla::NodeBuilder) -> flotilla::NodeBuilder,
) -> anyhow::Result<bool> {
    serve_if_worker_with(|_| {}, register).await
}

/// [`serve_if_worker`] with the worker's configuration adjusted by
/// `configure` first (declared resources, labels).
pub async fn serve_if_worker_with(
    configure: impl FnOnce(&mut flotilla::NodeConfig),
    register: impl FnOnce(flotilla::NodeBuilder) -> flotilla::NodeBuilder,
) -> anyhow::Result<bool> {
    let Some((name, head, certs)) = worker_args() else {
        return Ok(false);
    };
    let mut config = flotilla::NodeConfig::new(&name, free_addr(), certs).join(head);
    configure(&mut config);
    let node = register(flotilla::Node::builder(config)).start().await?;
    tokio::signal::ctrl_c().await?;
    node.shutdown().await;
    Ok(true)
}

/// Logs to stderr at `warn` (`error` in worker processes, whose peers
/// vanish when the example ends) unless `FLOTILLA_LOG` says otherwise.
pub fn init_logs() {
    let default = if worker_args().is_some() {
        "error"
    } else {
        "warn"
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
