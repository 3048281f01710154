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
