//! `node dashboard`: a read-only dashboard of a cluster in a browser,
//! served on a loopback address by a process that asks the head over
//! mutual TLS with the operator's certificate (an `observer`'s is enough),
//! so the browser needs no client certificate and the head serves no HTTP
//! of its own. Pages: the cluster (members, the head, each node's
//! resources and object store), the jobs (a page at a time), one job (its
//! rates over the last hour, stage times, the credit window, retries,
//! each actor's share, its placement), and the supervisors.
//!
//! ```text
//! browser ─► GET / , /dashboard.js, /dashboard.css   (the page, from this binary)
//!         ─► GET /api/cluster?page=N ─► status of the head and each member (as `node status --json`)
//!         ─► GET /api/supervisors?page=N ─► each member's supervisors
//!         ─► GET /api/jobs?page=N    ─► JobsRequest::Metrics (50 a page)
//!         ─► GET /api/job?id=ID      ─► JobsRequest::Get + JobsRequest::Account
//! ```
//!
//! Every answer is bounded: members and jobs come a page at a time, a
//! job's history is the head's last hour of samples, its actors at most
//! [`MAX_ACTORS_REPORTED`](flotilla_proto::job_stats::MAX_ACTORS_REPORTED).
//! The page loads nothing from anywhere else (its `Content-Security-Policy`
//! says so to the browser).

pub mod json;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use flotilla::jobs::{JobsReply, JobsRequest};
use flotilla_transport::Identity;
use tokio::net::{TcpListener, TcpStream};

use crate::http::{Request, Response, query_value, read_request};

/// Members (and placement groups) on one page of `/api/cluster`.
pub const MEMBERS_PER_PAGE: usize = 50;
/// Members on one page of `/api/supervisors`.
pub const SUPERVISED_PER_PAGE: usize = 10;
/// Jobs on one page of `/api/jobs`.
pub const JOBS_PER_PAGE: u32 = 50;
/// Requests served at once; more wait to be accepted.
const AT_ONCE: usize = 16;

/// The page's own files; nothing else is loaded.
const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// Every answer's headers: nothing from another origin, no framing.
const HEADERS: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
];

/// Why the dashboard cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address is not a loopback one.
    #[error(
        "NODE-DASH-001: the dashboard listens on a loopback address only ({0} is not one); reach it from elsewhere through an SSH tunnel"
    )]
    NotLoopback(SocketAddr),
    /// The address cannot be listened on.
    #[error("NODE-DASH-002: cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// What answers the browser: the heads to ask, and the control sessions
/// it asks them (and the members) through, kept open between refreshes.
struct Dashboard {
    heads: Vec<SocketAddr>,
    client: flotilla::ControlClient,
}

/// `node dashboard`: serves the dashboard on `args.listen` until stopped.
pub(crate) async fn run(args: crate::DashboardArgs) -> ExitCode {
    let identity = match Identity::load(&args.ask.certs, &args.ask.name) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let client = match flotilla::ControlClient::new(identity) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let listener = match bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    eprintln!("dashboard on http://{addr}/");
    let dashboard = Arc::new(Dashboard {
        heads: args.ask.head,
        client,
    });
    tokio::select! {
        () = serve(listener, dashboard) => ExitCode::SUCCESS,
        () = crate::systemd::wait_for_stop() => ExitCode::SUCCESS,
    }
}

/// Listens on `addr`, a loopback address.
async fn bind(addr: SocketAddr) -> Result<TcpListener, DashboardError> {
    if !addr.ip().is_loopback() {
        return Err(DashboardError::NotLoopback(addr));
    }
    TcpListener::bind(addr)
        .await
        .map_err(|source| DashboardError::Bind { addr, source })
}

async fn serve(listener: TcpListener, dashboard: Arc<Dashboard>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let dashboard = Arc::clone(&dashboard);
        tokio::spawn(async move {
            let _ = dashboard.answer(stream).await;
            drop(permit);
        });
    }
}

/// A page number from a query string (0 when absent or not a number).
fn page_of(query: &str) -> usize {
    query_value(query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

impl Dashboard {
    async fn answer(&self, mut stream: TcpStream) -> std::io::Result<()> {
        let Some(request) = read_request(&mut stream).await else {
            return Ok(());
        };
        let Request::Get { path, query } = &request else {
            return Response::refusal(&request).send(stream).await;
        };
        let file = |content_type, body: &'static str| Response {
            status: "200 OK",
            content_type,
            headers: HEADERS,
            body: body.as_bytes().to_vec(),
        };
        let response = match path.as_str() {
            "/" => file("text/html; charset=utf-8", PAGE),
            "/dashboard.js" => file("text/javascript; charset=utf-8", SCRIPT),
            "/dashboard.css" => file("text/css; charset=utf-8", STYLE),
            "/api/cluster" => json_answer(self.cluster(page_of(query), false).await),
            "/api/supervisors" => json_answer(self.cluster(page_of(query), true).await),
            "/api/jobs" => json_answer(self.jobs(page_of(query)).await),
            "/api/job" => match query_value(query, "id") {
                Some(id) => json_answer(self.job(&id).await),
                None => Response::text("400 Bad Request", "which job? /api/job?id=ID\n"),
            },
            _ => Response::text("404 Not Found", "not found\n"),
        };
        response.send(stream).await
    }

    /// Asks the active head.
    async fn ask(&self, request: JobsRequest) -> Result<JobsReply, String> {
        flotilla::status::first_answer(&self.heads, |head| self.client.jobs(head, request.clone()))
            .await
            .map(|(_, reply)| reply)
            .map_err(|e| e.to_string())
    }

    /// Page `page` of the members, as `node status --json` shows them, or
    /// of their `supervisors`.
    async fn cluster(&self, page: usize, supervisors: bool) -> Result<String, String> {
        let asked = crate::gather::Gather {
            supervisors,
            objects: !supervisors,
        };
        let report = crate::gather::gather_status(&self.heads, &self.client, asked)
            .await
            .map_err(|e| e.to_string())?;
        if supervisors {
            json::supervisors_page(&report.to_json(), page)
        } else {
            json::cluster_page(&report.to_json(), page)
        }
    }

    /// Page `page` of the jobs' accounts.
    async fn jobs(&self, page: usize) -> Result<String, String> {
        let from = u32::try_from(page)
            .unwrap_or(u32::MAX)
            .saturating_mul(JOBS_PER_PAGE);
        // One more than a page: whether there is a next one.
        let request = JobsRequest::Metrics {
            from,
            limit: JOBS_PER_PAGE + 1,
        };
        match self.ask(request).await? {
            JobsReply::Metrics(jobs) => Ok(json::jobs_page(&jobs, page)),
            other => Err(format!("the head answered {other:?}")),
        }
    }

    /// One job: its view, its account and its driver's log's last lines.
    async fn job(&self, id: &str) -> Result<String, String> {
        let view = match self.ask(JobsRequest::Get(id.into())).await? {
            JobsReply::Job(Some(view)) => view,
            JobsReply::Job(None) => return Err(format!("no job {id}")),
            other => return Err(format!("the head answered {other:?}")),
        };
        let account = match self.ask(JobsRequest::Account(id.into())).await? {
            JobsReply::Account(account) => account,
            other => return Err(format!("the head answered {other:?}")),
        };
        let log = self.log_tail(id).await;
        Ok(json::job(&view, account.as_deref(), log.as_ref()))
    }

    /// The last [`json::LOG_LINES_SHOWN`] lines of job `id`'s driver log
    /// the head keeps, if it answers: where its log ends, then from there
    /// back.
    async fn log_tail(&self, id: &str) -> Option<flotilla::jobs::LogPage> {
        let logs = |after| JobsRequest::Logs {
            id: id.into(),
            after,
        };
        let JobsReply::Logs(Some(end)) = self.ask(logs(u64::MAX)).await.ok()? else {
            return None;
        };
        let from = end.next.saturating_sub(json::LOG_LINES_SHOWN);
        match self.ask(logs(from)).await.ok()? {
            JobsReply::Logs(Some(mut page)) => {
                // Lines logged since the first answer wait for the next refresh.
                let start = page.next - page.lines.len() as u64;
                page.lines.truncate(json::LOG_LINES_SHOWN as usize);
                page.next = start + page.lines.len() as u64;
                Some(page)
            }
            _ => None,
        }
    }
}

/// A JSON answer, or the error as JSON with 502 (the head did not answer
/// as asked).
fn json_answer(body: Result<String, String>) -> Response {
    let (status, body) = match body {
        Ok(body) => ("200 OK", body),
        Err(e) => (
            "502 Bad Gateway",
            serde_json::json!({ "error": e }).to_string(),
        ),
    };
    Response {
        status,
        content_type: "application/json",
        headers: HEADERS,
        body: body.into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_loopback_address_is_listened_on() {
        let outside: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(matches!(
            bind(outside).await,
            Err(DashboardError::NotLoopback(_))
        ));
        let there: SocketAddr = "192.0.2.1:8265".parse().unwrap();
        let e = bind(there).await.unwrap_err().to_string();
        assert!(
            e.starts_with("NODE-DASH-001") && e.contains("192.0.2.1"),
            "{e}"
        );
        assert!(bind("127.0.0.1:0".parse().unwrap()).await.is_ok());
    }

    #[test]
    fn pages_are_read_from_the_query() {
        assert_eq!(page_of("page=3"), 3);
        assert_eq!(page_of("page=x"), 0);
        assert_eq!(page_of(""), 0);
    }
}
