//! The node's `/metrics` over HTTP (`--metrics-listen`): every counter the
//! runtime emits through the `metrics` facade and, on a head, every job's
//! account ([`flotilla_proto::job_stats`]: rows, tokens, the credit window,
//! retries, restarts, each actor's busy share, its state and ETA, and the
//! histograms under Text Embeddings Inference's names), in the Prometheus
//! text format. A job that ended is shown for
//! [`ENDED_SERIES_KEPT`](flotilla_proto::job_stats::ENDED_SERIES_KEPT),
//! then its series are dropped.
//!
//! ```text
//! GET /metrics ─► recorder's render + the head's job accounts ─► 200 text/plain
//! anything else ─► 404 / 405; a request head over 8 KiB or slower than 5 s ─► closed
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use flotilla::Node;
use flotilla_proto::job_stats::{self, ENDED_SERIES_KEPT};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::{TcpListener, TcpStream};

use crate::http::{Request, Response, read_request};
/// Connections served at once; more wait to be accepted.
const AT_ONCE: usize = 32;
/// How often the recorder's histograms are folded in.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The metrics endpoint, serving until the process ends.
pub(crate) struct MetricsEndpoint {
    node: Arc<OnceLock<Arc<Node>>>,
}

impl MetricsEndpoint {
    /// Installs the process's recorder and serves `/metrics` on `addr`.
    pub(crate) async fn start(addr: SocketAddr) -> Result<Self, String> {
        let listener = TcpListener::bind(addr).await.map_err(|e| e.to_string())?;
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| e.to_string())?;
        let node = Arc::new(OnceLock::new());
        tokio::spawn({
            let handle = handle.clone();
            async move {
                let mut tick = tokio::time::interval(UPKEEP_EVERY);
                loop {
                    tick.tick().await;
                    handle.run_upkeep();
                }
            }
        });
        tokio::spawn(accept(listener, handle, Arc::clone(&node)));
        Ok(Self { node })
    }

    /// Shows the jobs `node` runs as their head, from now on.
    pub(crate) fn show_jobs_of(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
    }
}

async fn accept(listener: TcpListener, handle: PrometheusHandle, node: Arc<OnceLock<Arc<Node>>>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: try again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (handle, node) = (handle.clone(), Arc::clone(&node));
        tokio::spawn(async move {
            let _ = answer(stream, &handle, node.get()).await;
            drop(permit);
        });
    }
}

async fn answer(
    mut stream: TcpStream,
    handle: &PrometheusHandle,
    node: Option<&Arc<Node>>,
) -> std::io::Result<()> {
    let Some(request) = read_request(&mut stream).await else {
        return Ok(());
    };
    let response = match &request {
        Request::Get { path, .. } if path == "/metrics" => Response {
            status: "200 OK",
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            headers: &[],
            body: render(handle, node).await.into_bytes(),
        },
        Request::Get { .. } => Response::text("404 Not Found", "not found: try /metrics\n"),
        other => Response::refusal(other),
    };
    response.send(stream).await
}

/// The recorder's families, then those of the jobs `node` runs as head.
async fn render(handle: &PrometheusHandle, node: Option<&Arc<Node>>) -> String {
    let mut out = handle.render();
    if let Some(node) = node.filter(|n| n.role() == flotilla_proto::role::Role::Head)
        && let Ok(jobs) = node.job_metrics(0, u32::MAX).await
    {
        let kept: Vec<_> = jobs
            .into_iter()
            .filter(|j| {
                j.ended_s
                    .is_none_or(|s| s <= ENDED_SERIES_KEPT.as_secs_f64())
            })
            .collect();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        job_stats::render(&kept, &mut out);
    }
    out
}
