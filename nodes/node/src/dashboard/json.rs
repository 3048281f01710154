//! The dashboard's JSON documents, made from what the head answered: a
//! page of members, a page of jobs, one job.

use flotilla::jobs::{JobMetrics, JobView};
use flotilla_proto::job_stats::Histogram;
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
pub(super) fn cluster_page(status: &str, page: usize) -> Result<String, String> {
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
pub(super) fn supervisors_page(status: &str, page: usize) -> Result<String, String> {
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
    use flotilla::jobs::{JobState, JobStats, JobView};

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

    /// The largest answer of each page at 1,000 jobs and 500 members, each
    /// as full as the head lets it be, is at most 256 KiB.
    #[test]
    fn every_answer_is_at_most_256_kib_at_a_thousand_jobs_and_500_members() {
        const LIMIT: usize = 256 * 1024;
        // 500 members, each with three supervisors of ten children, its
        // resources, reservations and object store.
        let child = |i: usize| json!({ "id": format!("embedder-{i:04}"), "running": true, "restarts": 3, "epoch": 1_700_000_000_000_000u64, "node": "worker-0001" });
        let sup = |i: usize| json!({ "name": format!("tree-{i}"), "strategy": "one_for_one", "gave_up": false, "children": (0..10).map(child).collect::<Vec<_>>() });
        let amounts = json!({ "cpu": 64.0, "memory_mb": 262144.0, "gpu": 8.0 });
        let nodes: Vec<Value> = (0..500)
            .map(|i| json!({
                "name": format!("workers~worker-{i:04}-abcdefgh"), "addr": "10.0.12.34:7421", "bulk_addr": "10.0.12.34:7431",
                "host": "a5f0c2d4e6b8a0c2d4e6b8a0c2d4e6b8", "state": "up", "role": "worker", "incarnation": 1_765_000_000_000u64,
                "resources": { "cpus": 64, "memory_bytes": 274877906944u64, "gpus": 8, "labels": { "zone": "eu-west-1a", "price_per_hour": "12.5" }, "custom": {} },
                "actors": 16, "supervisors": (0..3).map(sup).collect::<Vec<_>>(),
                "capacity": amounts, "reserved": amounts, "available": amounts,
                "objects": { "count": 100, "bytes": 1u64 << 30, "capacity": 4u64 << 30, "puts": 1000, "local_gets": 1000, "remote_pulls": 10, "pulled_bytes": 1u64 << 20, "waits": 0 },
            }))
            .collect();
        let bundles: Vec<Value> = (0..16)
            .map(|_| json!({ "resources": { "cpu": 1.0, "memory_mb": 4096.0 }, "node": "workers~worker-0001-abcdefgh" }))
            .collect();
        let groups: Vec<Value> = (0..1000)
            .map(|i| json!({ "id": format!("pg19a2b3c4-{i}"), "state": "ready", "strategy": "spread", "revision": 4, "owner": "driver~0123456789abcdef", "why": null, "bundles": bundles }))
            .collect();
        let status =
            json!({ "head": "head", "version": 9, "nodes": nodes, "groups": groups }).to_string();
        for page in 0..20 {
            let body = cluster_page(&status, page).unwrap();
            assert!(
                body.len() <= LIMIT,
                "cluster page {page}: {} bytes",
                body.len()
            );
        }
        // 1,000 jobs with full accounts: histograms filled, 256 actors
        // each, an hour of samples.
        let full = |n: usize| {
            let mut j = account(n);
            for v in [1.0, 30.0, 300.0, 5000.0] {
                for h in [
                    &mut j.stats.stages.batch_size,
                    &mut j.stats.stages.batch_tokens,
                    &mut j.stats.stages.input_length,
                    &mut j.stats.stages.queue,
                    &mut j.stats.stages.tokenization,
                    &mut j.stats.stages.inference,
                ] {
                    h.record(v);
                }
            }
            j.stats.actors = (0..flotilla_proto::job_stats::MAX_ACTORS_REPORTED)
                .map(|i| flotilla_proto::job_stats::ActorStats {
                    node: format!("workers~worker-{i:04}-abcdefgh"),
                    batches: 123_456,
                    busy_ms: 9_876_543,
                })
                .collect();
            j.history = (0..flotilla_proto::job_stats::SAMPLES_KEPT)
                .map(|i| flotilla_proto::job_stats::Sample {
                    ago_s: 3600 - 10 * i as u32,
                    rows: 1_000_000 * i as u64,
                    tokens: 50_000_000 * i as u64,
                })
                .collect();
            j
        };
        let jobs: Vec<JobMetrics> = (0..1000).map(full).collect();
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
        let group = flotilla_proto::groups::GroupView {
            id: "pg-1".into(),
            state: flotilla_proto::groups::GroupState::Ready,
            revision: 3,
            strategy: "spread".into(),
            bundles: vec![[("cpu".to_owned(), 1.0)].into_iter().collect(); 256],
            nodes: vec!["workers~worker-0001-abcdefgh".into(); 256],
            owner: None,
            why: None,
        };
        let view = JobView {
            id: "job-1".into(),
            description: "embed s3://corpus/2026/ -> s3://vectors/2026/".into(),
            owner: Some("team".into()),
            state: JobState::Running,
            done: 1,
            total: 2,
            node: Some("workers~worker-0001-abcdefgh".into()),
            restarts: 0,
            group: Some(group.clone()),
            work_groups: vec!["pg-1".into()],
            work: vec![group],
            detail: None,
        };
        let body = job(&view, Some(&jobs[0]));
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
