//! The head's job store: how long one durable change takes.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin job_store -- [--dir DIR] [--changes 500]
//! ```
//!
//! A store in `DIR` (default: the temporary folder; give the disk the
//! head's state directory is on) takes `--changes` submissions of a job
//! the size of a detached embed job, then as many updates of them, then
//! as many removals, each committed durably as the head commits them
//! (`flotilla::head_store::HeadStore`). Baseline in the same run, same disk:
//! writing the same bytes to a file of their own and `fsync`ing it, the
//! least a durable change costs. Prints p50, p99 and the mean per change;
//! the last line reads `job store: p50 … ms per change (…)`.
//!
//! With `--mirror URL` (an object store, as a head set's `--lease-store`;
//! S3 settings from the `AWS_*` environment) the store is also a head
//! set's primary's: it takes the lease there, and each change is written
//! to the mirror too before it counts, as the primary makes it; the same
//! run measures the store without the mirror first.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use flotilla::Incarnation;
use flotilla::head_store::HeadStore;
use flotilla::jobs::{JobSpec, StoredJob};
use flotilla_benches::percentile;
use flotilla_proto::ids::GroupId;
use flotilla_proto::jobs::JobRecord;

#[derive(Parser)]
struct Args {
    /// Folder on the disk to measure.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Changes of each kind.
    #[arg(long, default_value_t = 500)]
    changes: u64,
    /// Mirror each change to this object store, as a head set's primary.
    #[arg(long)]
    mirror: Option<String>,
}

/// A job as the head stores one: a detached embed job's arguments are
/// about a kilobyte.
fn job(seq: u64, done: u64) -> StoredJob {
    let mut record = JobRecord::new(
        format!("job-19a2b3c4d5e6f-{seq}"),
        "embed s3://corpus/part-*.jsonl → s3://out/run",
        Some("ops".into()),
    );
    record.started("worker-3", 0);
    record.progress(flotilla::jobs::JobProgress {
        state: flotilla::jobs::JobState::Running,
        done,
        total: 1_000_000,
        detail: String::new(),
        groups: vec![GroupId::new(format!("pg19a2b3c4-{seq}"))],
        stats: Default::default(),
        log: Vec::new(),
    });
    StoredJob {
        seq,
        spec: JobSpec {
            kind: "flotilla.embed.job".into(),
            args: vec![7; 1024],
            message_type: "flotilla::jobs::JobMsg".into(),
            resources: Default::default(),
            description: "embed s3://corpus/part-*.jsonl → s3://out/run".into(),
            max_restarts: 3,
        },
        view: (*record).clone(),
        group: Some(format!("pg19a2b3c4-{seq}").into()),
        ended_unix_ms: None,
    }
}

/// p50, p99 and mean of `samples`, in milliseconds.
fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    (percentile(samples, 0.5), percentile(samples, 0.99), mean)
}

fn timed(mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("flotilla-job-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = HeadStore::open_in(&dir)?;
    let n = args.changes;

    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    changes(&store, n, "", &mut rows)?;
    let size = std::fs::metadata(store.path())?.len();
    drop(store);
    // The lease is renewed on this runtime while the mirror is measured.
    let runtime = tokio::runtime::Runtime::new()?;
    if let Some(url) = &args.mirror {
        let (objects, prefix) =
            flotilla::object_url::open_url(url).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
        let held = runtime
            .block_on(flotilla::head_lease::acquire(
                flotilla::head_lease::LeaseStore::new(std::sync::Arc::clone(&objects), &prefix),
                flotilla::head_lease::Candidate {
                    holder: "bench".into(),
                    address: "127.0.0.1:1".into(),
                    incarnation: Incarnation::new(1),
                },
                flotilla_proto::lease::LeaseConfig {
                    duration: std::time::Duration::from_secs(10),
                },
                Default::default(),
            ))
            .ok_or_else(|| anyhow::anyhow!("the lease at {url} was not taken"))?;
        let mirror =
            flotilla::head_replica::HeadReplica::new(objects, prefix, held.guard, held.term)?;
        let mirrored_dir = dir.join("mirrored");
        std::fs::create_dir_all(&mirrored_dir)?;
        let mirrored = HeadStore::open_in(&mirrored_dir)?.with_replica(mirror);
        changes(&mirrored, n, ", mirrored", &mut rows)?;
    }

    // Baseline: the same bytes to a file of their own, fsync'd.
    let bytes = flotilla::rkyv::to_bytes::<flotilla::rkyv::rancor::Error>(&job(1, 64))?;
    let mut baseline = Vec::new();
    for i in 0..n {
        let path = dir.join(format!("plain-{i}"));
        baseline.push(timed(|| {
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            Ok(())
        })?);
    }
    rows.push(("baseline: same bytes to a file, fsync".into(), baseline));

    println!(
        "job store: {n} changes of each kind, {} bytes a job, store file {} KiB, in {}\n",
        bytes.len(),
        size / 1024,
        base.display()
    );
    println!("| change | p50 ms | p99 ms | mean ms |");
    println!("| --- | ---: | ---: | ---: |");
    let mut results = Vec::new();
    for (what, samples) in &mut rows {
        let (p50, p99, mean) = summary(samples);
        println!("| {what} | {p50:.3} | {p99:.3} | {mean:.3} |");
        results.push(p50);
    }
    std::fs::remove_dir_all(&dir)?;
    let fsync = results[results.len() - 1];
    println!(
        "job store: p50 {:.3} ms per change (submission {:.3}, update {:.3}, removal {:.3}; fsync'd file write {fsync:.3})",
        results[..3].iter().sum::<f64>() / 3.0,
        results[0],
        results[1],
        results[2],
    );
    if args.mirror.is_some() {
        println!(
            "job store, mirrored: p50 {:.3} ms per change (submission {:.3}, update {:.3}, removal {:.3})",
            results[3..6].iter().sum::<f64>() / 3.0,
            results[3],
            results[4],
            results[5],
        );
    }
    drop(runtime);
    Ok(())
}

/// `n` submissions, updates and removals on `store`, each timed, as rows
/// of `rows` (their names followed by `suffix`).
fn changes(
    store: &HeadStore,
    n: u64,
    suffix: &str,
    rows: &mut Vec<(String, Vec<f64>)>,
) -> anyhow::Result<()> {
    let mut submit = Vec::new();
    for seq in 1..=n {
        submit.push(timed(|| Ok(store.put_job(&job(seq, 0))?))?);
    }
    rows.push((format!("submission (new entry){suffix}"), submit));
    let mut update = Vec::new();
    for seq in 1..=n {
        update.push(timed(|| Ok(store.put_job(&job(seq, 64 * seq))?))?);
    }
    rows.push((format!("change of state (entry replaced){suffix}"), update));
    let mut remove = Vec::new();
    for seq in 1..=n {
        remove.push(timed(|| Ok(store.remove_job(seq)?))?);
    }
    rows.push((format!("forgotten (entry removed){suffix}"), remove));
    Ok(())
}
