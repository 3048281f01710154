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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request head.
const READ_WITHIN: Duration = Duration::from_secs(5);
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

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics,
    NotFound,
    NotAllowed,
    Malformed,
}

/// Reads the request line of `head` (the bytes up to the blank line).
fn asked(head: &[u8]) -> Asked {
    let Some(line) = head.split(|&b| b == b'\n').next() else {
        return Asked::Malformed;
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return Asked::Malformed;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Asked::Malformed;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Asked::Malformed;
    }
    if method != "GET" {
        return Asked::NotAllowed;
    }
    let path = target.split('?').next().unwrap_or("");
    if path == "/metrics" {
        Asked::Metrics
    } else {
        Asked::NotFound
    }
}

/// Reads a request head: `None` when it is over the limit, too slow, or
/// the client went away.
async fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Some(());
            }
            if head.len() > MAX_REQUEST {
                return None;
            }
        }
    };
    tokio::time::timeout(READ_WITHIN, read).await.ok()??;
    Some(head)
}

async fn answer(
    mut stream: TcpStream,
    handle: &PrometheusHandle,
    node: Option<&Arc<Node>>,
) -> std::io::Result<()> {
    let Some(head) = read_head(&mut stream).await else {
        return Ok(());
    };
    let (status, body) = match asked(&head) {
        Asked::Metrics => ("200 OK", render(handle, node).await),
        Asked::NotFound => ("404 Not Found", "not found: try /metrics\n".to_owned()),
        Asked::NotAllowed => ("405 Method Not Allowed", "only GET\n".to_owned()),
        Asked::Malformed => ("400 Bad Request", "malformed request\n".to_owned()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_of_metrics_is_served() {
        assert_eq!(
            asked(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics
        );
        assert_eq!(asked(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Asked::Metrics);
        assert_eq!(asked(b"GET / HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(
            asked(b"GET /metrics/../x HTTP/1.1\r\n\r\n"),
            Asked::NotFound
        );
        assert_eq!(asked(b"POST /metrics HTTP/1.1\r\n\r\n"), Asked::NotAllowed);
        assert_eq!(asked(b"GET /metrics\r\n\r\n"), Asked::Malformed);
        assert_eq!(asked(b"GET /metrics SPDY/3\r\n\r\n"), Asked::Malformed);
        assert_eq!(asked(&[0xff, 0xfe, b'\n']), Asked::Malformed);
    }
}
