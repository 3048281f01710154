//! What a head says of a large fleet, every field as full as the head
//! lets it be: the status document of N members (as `node status --json`
//! writes it) and jobs' accounts with filled histograms, the most actors
//! reported and an hour of samples. What the dashboard's size tests and
//! the `dashboard_scale` bench build their answers from.

use flotilla_proto::groups::{GroupState, GroupView};
use flotilla_proto::job_state::JobState;
use flotilla_proto::job_stats::{
    ActorStats, ERROR_LINE_SHOWN, ERRORS_SHOWN, JobMetrics, JobStats, MAX_ACTORS_REPORTED,
    SAMPLES_KEPT, Sample,
};
use flotilla_proto::jobs::JobView;
use flotilla_proto::jobs::LogPage;
use serde_json::{Value, json};

/// The status document of `members` workers and `groups` placement
/// groups: each member with three supervisors of ten children, its
/// resources and labels, reservations and object store; each group of 16
/// bundles.
pub fn status_json(members: usize, groups: usize) -> String {
    let child = |i: usize| json!({ "id": format!("embedder-{i:04}"), "running": true, "restarts": 3, "epoch": 1_700_000_000_000_000u64, "node": "worker-0001" });
    let sup = |i: usize| json!({ "name": format!("tree-{i}"), "strategy": "one_for_one", "gave_up": false, "children": (0..10).map(child).collect::<Vec<_>>() });
    let amounts = json!({ "cpu": 64.0, "memory_mb": 262144.0, "gpu": 8.0 });
    let nodes: Vec<Value> = (0..members)
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
    let groups: Vec<Value> = (0..groups)
        .map(|i| json!({ "id": format!("pg19a2b3c4-{i}"), "state": "ready", "strategy": "spread", "revision": 4, "owner": "driver~0123456789abcdef", "why": null, "bundles": bundles }))
        .collect();
    json!({ "head": "head", "version": 9, "nodes": nodes, "groups": groups }).to_string()
}

/// Job `n`'s account, running, half done, with nothing in its lists.
pub fn account(n: usize) -> JobMetrics {
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

/// Job `n`'s account as full as the head keeps it: every histogram with
/// values in several buckets, [`MAX_ACTORS_REPORTED`] actors, an hour of
/// samples.
pub fn full_account(n: usize) -> JobMetrics {
    let mut j = account(n);
    j.cost = Some(123.45);
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
    j.stats.actors = (0..MAX_ACTORS_REPORTED)
        .map(|i| ActorStats {
            node: format!("workers~worker-{i:04}-abcdefgh"),
            batches: 123_456,
            busy_ms: 9_876_543,
        })
        .collect();
    j.stats.errors_tail = (0..ERRORS_SHOWN)
        .map(|i| "x".repeat(ERROR_LINE_SHOWN - 8) + &format!("{i:08}"))
        .collect();
    j.history = (0..SAMPLES_KEPT)
        .map(|i| Sample {
            ago_s: 3600 - 10 * i as u32,
            rows: 1_000_000 * i as u64,
            tokens: 50_000_000 * i as u64,
        })
        .collect();
    j
}

/// A running job's view with its placement group of `bundles` bundles,
/// as its driver's and its work's group.
pub fn job_view(bundles: usize) -> JobView {
    let group = GroupView {
        id: "pg-1".into(),
        state: GroupState::Ready,
        revision: 3,
        strategy: "spread".into(),
        bundles: vec![[("cpu".to_owned(), 1.0)].into_iter().collect(); bundles],
        nodes: vec!["workers~worker-0001-abcdefgh".into(); bundles],
        owner: None,
        why: None,
    };
    JobView {
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
    }
}

/// The last `lines` lines of a driver's log, each of 1,024 bytes (as long
/// as the job page shows a line).
pub fn log_page(lines: u64) -> LogPage {
    LogPage {
        lines: (0..lines)
            .map(|i| format!("{i:08} ") + &"log ".repeat(254))
            .collect(),
        next: 10_000,
        dropped: 0,
        ended: false,
    }
}
