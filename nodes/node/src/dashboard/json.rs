//! The dashboard's JSON documents, made from what the head answered: a
//! page of members, a page of jobs, one job.

use flotilla::jobs::{JobMetrics, JobView, LogPage};
use flotilla_proto::job_stats::{Histogram, clip};
use serde_json::{Value, json};

use super::{JOBS_PER_PAGE, MEMBERS_PER_PAGE, SUPERVISED_PER_PAGE};

/// Cuts the list `key` of `doc` to page `page` of `per_page`; returns
/// how many it held.
fn cut(doc: &mut Value, key: &str, page: usize, per_page: usize) -> usize {
    let all = doc[key].as_array().cloned().unwrap_or_default();
    let shown: Vec<Value> = all
        .iter()
        .skip(page.saturating_mul(per_page))
        .take(per_page)
        .cloned()
        .collect();
    doc[key] = Value::Array(shown);
    all.len()
}

/// Page `page` of the status document `status` (`node status --json`):
/// the same document with its `nodes` and its `groups` cut to the page
/// ([`MEMBERS_PER_PAGE`] of each) and each node's supervisors left out
/// (see [`supervisors_page`]), and `page`, `pages`, `members` and
/// `group_count` (in all) beside them.
pub fn cluster_page(status: &str, page: usize) -> Result<String, String> {
    let mut doc: Value = serde_json::from_str(status).map_err(|e| e.to_string())?;
    let members = cut(&mut doc, "nodes", page, MEMBERS_PER_PAGE);
    let groups = cut(&mut doc, "groups", page, MEMBERS_PER_PAGE);
    for node in doc["nodes"].as_array_mut().into_iter().flatten() {
        if let Some(node) = node.as_object_mut() {
            node.remove("supervisors");
        }
    }
    doc["page"] = json!(page);
    doc["pages"] = json!(members.max(groups).div_ceil(MEMBERS_PER_PAGE).max(1));
    doc["members"] = json!(members);
    doc["group_count"] = json!(groups);
    Ok(doc.to_string())
}

/// Page `page` of the members' supervisors in the status document
/// `status`: [`SUPERVISED_PER_PAGE`] members, each with its name and its
/// supervisors (or why it did not answer).
pub fn supervisors_page(status: &str, page: usize) -> Result<String, String> {
    let mut doc: Value = serde_json::from_str(status).map_err(|e| e.to_string())?;
    let members = cut(&mut doc, "nodes", page, SUPERVISED_PER_PAGE);
    let nodes: Vec<Value> = doc["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            json!({
                "name": n["name"],
                "supervisors": n["supervisors"],
                "supervisors_error": n["supervisors_error"],
            })
        })
        .collect();
    let pages = members.div_ceil(SUPERVISED_PER_PAGE).max(1);
    Ok(json!({ "page": page, "pages": pages, "members": members, "nodes": nodes }).to_string())
}

/// A number of seconds as JSON, `null` when not finite.
fn secs(s: f64) -> Value {
    if s.is_finite() { json!(s) } else { Value::Null }
}

/// Page `page` of the jobs: `jobs` holds the page and, when there is a
/// next one, one more.
pub fn jobs_page(jobs: &[JobMetrics], page: usize) -> String {
    let more = jobs.len() > JOBS_PER_PAGE as usize;
    let shown: Vec<Value> = jobs
        .iter()
        .take(JOBS_PER_PAGE as usize)
        .map(|j| {
            json!({
                "id": j.id.as_str(),
                "description": j.description,
                "owner": j.owner,
                "state": j.state.as_str(),
                "done": j.done,
                "total": j.total,
                "rows_per_s": secs(j.rows_per_s()),
                "tokens_per_s": secs(j.tokens_per_s()),
                "eta_s": j.eta_s(),
                "restarts": u64::from(j.restarts) + j.stats.restarts,
                "errors": j.stats.rows_rejected,
                "cost": j.cost,
                "since_progress_s": secs(j.since_progress_s),
            })
        })
        .collect();
    json!({ "page": page, "more": more, "jobs": shown }).to_string()
}

/// A histogram's median, 99th percentile and count.
fn quantiles(name: &str, h: &Histogram) -> Value {
    json!({ "name": name, "p50": h.quantile(0.5), "p99": h.quantile(0.99), "count": h.count() })
}

/// One job: its view as `node jobs --json` shows it (`job`), its
/// account (`account`: rates, the credit window, retries, stage times,
/// each actor's share, its history, the last rows refused) when the head
/// has one, and the last lines of its driver's log (`log`, each cut to
/// [`LOG_LINE_SHOWN`] bytes) when it has any.
pub fn job(view: &JobView, account: Option<&JobMetrics>, log: Option<&LogPage>) -> String {
    let listed: Value =
        serde_json::from_str(&crate::jobs::to_json(std::slice::from_ref(view))).unwrap_or_default();
    let account = account.map(|j| {
        let s = &j.stats;
        let elapsed = s.elapsed_ms.max(1) as f64;
        let st = &s.stages;
        json!({
            "rows": { "done": s.rows_done, "skipped": s.rows_skipped, "rejected": s.rows_rejected },
            "tokens": { "real": s.tokens, "padded": s.padded_tokens },
            "rows_per_s": secs(j.rows_per_s()),
            "tokens_per_s": secs(j.tokens_per_s()),
            "eta_s": j.eta_s(),
            "since_progress_s": secs(j.since_progress_s),
            "age_s": secs(j.age_s),
            "in_flight": s.in_flight,
            "window": s.window,
            "credit_wait_s": s.credit_wait_ms as f64 / 1000.0,
            "retries": {
                "deadline": s.retries.deadline,
                "error": s.retries.error,
                "lost": s.retries.lost,
                "hedged": s.retries.hedged,
            },
            "actor_restarts": s.restarts,
            "driver_restarts": j.restarts,
            "cpu_s": s.cpu_ms as f64 / 1000.0,
            "cost": j.cost,
            "cost_per_million_tokens": j.cost.and_then(|c| flotilla_proto::job_stats::per_million_tokens(c, s.tokens)),
            "elapsed_s": s.elapsed_ms as f64 / 1000.0,
            "stages": [
                quantiles("queue", &st.queue),
                quantiles("tokenization", &st.tokenization),
                quantiles("inference", &st.inference),
            ],
            "batch_size": quantiles("batch_size", &st.batch_size),
            "actors": s.actors.iter().enumerate().map(|(i, a)| json!({
                "actor": i,
                "node": a.node,
                "batches": a.batches,
                "busy": a.busy_ms as f64 / elapsed,
            })).collect::<Vec<_>>(),
            "errors": s.errors_tail,
            "history": j.history.iter().map(|h| json!({
                "ago_s": h.ago_s, "rows": h.rows, "tokens": h.tokens,
            })).collect::<Vec<_>>(),
        })
    });
    let log = log.map(|page| {
        let lines: Vec<&str> = page.lines.iter().map(|l| clip(l, LOG_LINE_SHOWN)).collect();
        json!({ "lines": lines, "first": page.next - page.lines.len() as u64, "ended": page.ended })
    });
    json!({ "job": listed["jobs"][0], "account": account, "log": log }).to_string()
}

/// Lines of a driver's log the job page shows.
pub const LOG_LINES_SHOWN: u64 = 50;

/// Bytes of a log line the job page shows.
pub const LOG_LINE_SHOWN: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_testkit::fleet;

    /// The largest answer of each page at 1,000 jobs and 500 members, each
    /// as full as the head lets it be, is at most 256 KiB.
    #[test]
    fn every_answer_is_at_most_256_kib_at_a_thousand_jobs_and_500_members() {
        const LIMIT: usize = 256 * 1024;
        let status = fleet::status_json(500, 1000);
        for page in 0..20 {
            let body = cluster_page(&status, page).unwrap();
            assert!(
                body.len() <= LIMIT,
                "cluster page {page}: {} bytes",
                body.len()
            );
        }
        for page in 0..50 {
            let body = supervisors_page(&status, page).unwrap();
            assert!(
                body.len() <= LIMIT,
                "supervisors page {page}: {} bytes",
                body.len()
            );
        }
        // 1,000 jobs with full accounts: histograms filled, 256 actors
        // each, an hour of samples.
        let jobs: Vec<JobMetrics> = (0..1000).map(fleet::full_account).collect();
        for page in 0..20 {
            let from = page * JOBS_PER_PAGE as usize;
            let slice = &jobs[from..(from + JOBS_PER_PAGE as usize + 1).min(jobs.len())];
            let body = jobs_page(slice, page);
            assert!(
                body.len() <= LIMIT,
                "jobs page {page}: {} bytes",
                body.len()
            );
        }
        let view = fleet::job_view(256);
        let body = job(&view, Some(&jobs[0]), Some(&fleet::log_page(50)));
        assert!(body.len() <= LIMIT, "job page: {} bytes", body.len());
    }

    #[test]
    fn members_come_a_page_at_a_time() {
        let nodes: Vec<Value> = (0..250)
            .map(|i| json!({ "name": format!("w{i}") }))
            .collect();
        let status = json!({ "head": "head", "version": 1, "nodes": nodes }).to_string();
        let page: Value = serde_json::from_str(&cluster_page(&status, 4).unwrap()).unwrap();
        assert_eq!(page["nodes"].as_array().unwrap().len(), 50);
        assert_eq!(page["nodes"][0]["name"], "w200");
        assert_eq!((&page["pages"], &page["members"]), (&json!(5), &json!(250)));
        assert_eq!(page["group_count"], 0);
        let sup: Value = serde_json::from_str(&supervisors_page(&status, 24).unwrap()).unwrap();
        assert_eq!(sup["nodes"].as_array().unwrap().len(), 10);
        assert_eq!(
            (&sup["nodes"][0]["name"], &sup["pages"]),
            (&json!("w240"), &json!(25))
        );
        assert_eq!(page["head"], "head");
        assert!(cluster_page("not json", 0).is_err());
    }

    #[test]
    fn a_page_of_jobs_says_whether_there_is_another() {
        let jobs: Vec<JobMetrics> = (0..=JOBS_PER_PAGE as usize).map(fleet::account).collect();
        let page: Value = serde_json::from_str(&jobs_page(&jobs, 0)).unwrap();
        assert_eq!(page["more"], true);
        assert_eq!(page["jobs"].as_array().unwrap().len(), 50);
        let j = &page["jobs"][0];
        assert_eq!(
            (&j["rows_per_s"], &j["eta_s"]),
            (&json!(50.0), &json!(10.0))
        );
        assert_eq!((&j["restarts"], &j["errors"]), (&json!(3), &json!(3)));
        let last: Value = serde_json::from_str(&jobs_page(&jobs[..3], 1)).unwrap();
        assert_eq!(last["more"], false);
    }
}
