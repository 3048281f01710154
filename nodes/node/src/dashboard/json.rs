//! The dashboard's JSON documents, made from what the head answered: a
//! page of members, a page of jobs, one job.

use flotilla::jobs::{JobMetrics, JobView};
use flotilla_proto::job_stats::Histogram;
use serde_json::{Value, json};

use super::{JOBS_PER_PAGE, MEMBERS_PER_PAGE};

/// Page `page` of the status document `status` (`node status --json`):
/// the same document with its `nodes` cut to the page, and `page`,
/// `pages` and `members` (in all) beside them.
pub(super) fn cluster_page(status: &str, page: usize) -> Result<String, String> {
    let mut doc: Value = serde_json::from_str(status).map_err(|e| e.to_string())?;
    let nodes = doc["nodes"].as_array().cloned().unwrap_or_default();
    let pages = nodes.len().div_ceil(MEMBERS_PER_PAGE).max(1);
    let shown: Vec<Value> = nodes
        .iter()
        .skip(page.saturating_mul(MEMBERS_PER_PAGE))
        .take(MEMBERS_PER_PAGE)
        .cloned()
        .collect();
    doc["nodes"] = Value::Array(shown);
    doc["page"] = json!(page);
    doc["pages"] = json!(pages);
    doc["members"] = json!(nodes.len());
    Ok(doc.to_string())
}

/// A number of seconds as JSON, `null` when not finite.
fn secs(s: f64) -> Value {
    if s.is_finite() { json!(s) } else { Value::Null }
}

/// Page `page` of the jobs: `jobs` holds the page and, when there is a
/// next one, one more.
pub(super) fn jobs_page(jobs: &[JobMetrics], page: usize) -> String {
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

/// One job: its view as `node jobs --json` shows it (`job`), and its
/// account (`account`: rates, the credit window, retries, stage times,
/// each actor's share, its history) when the head has one.
pub(super) fn job(view: &JobView, account: Option<&JobMetrics>) -> String {
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
            "history": j.history.iter().map(|h| json!({
                "ago_s": h.ago_s, "rows": h.rows, "tokens": h.tokens,
            })).collect::<Vec<_>>(),
        })
    });
    json!({ "job": listed["jobs"][0], "account": account }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla::jobs::{JobState, JobStats};

    fn account(n: usize) -> JobMetrics {
        JobMetrics {
            id: format!("job-{n}").as_str().into(),
            description: format!("embed /data/in-{n} -> /data/out-{n}"),
            owner: Some("driver-team".into()),
            state: JobState::Running,
            done: 500,
            total: 1000,
            restarts: 1,
            age_s: 10.0,
            since_progress_s: 0.5,
            ended_s: None,
            cost: None,
            stats: JobStats {
                rows_done: 500,
                elapsed_ms: 10_000,
                restarts: 2,
                rows_rejected: 3,
                ..JobStats::default()
            },
            history: Vec::new(),
        }
    }

    #[test]
    fn members_come_a_page_at_a_time() {
        let nodes: Vec<Value> = (0..250)
            .map(|i| json!({ "name": format!("w{i}") }))
            .collect();
        let status = json!({ "head": "head", "version": 1, "nodes": nodes }).to_string();
        let page: Value = serde_json::from_str(&cluster_page(&status, 2).unwrap()).unwrap();
        assert_eq!(page["nodes"].as_array().unwrap().len(), 50);
        assert_eq!(page["nodes"][0]["name"], "w200");
        assert_eq!((&page["pages"], &page["members"]), (&json!(3), &json!(250)));
        assert_eq!(page["head"], "head");
        assert!(cluster_page("not json", 0).is_err());
    }

    #[test]
    fn a_page_of_jobs_says_whether_there_is_another() {
        let jobs: Vec<JobMetrics> = (0..=JOBS_PER_PAGE as usize).map(account).collect();
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
