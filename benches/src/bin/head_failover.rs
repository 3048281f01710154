//! Failover of a head set: how long from the primary's SIGKILL until the
//! standby is the primary, the workers have rejoined it, and a detached
//! embed job's driver (started again by the new primary, resuming from its
//! manifest) has written its first batch.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin head_failover -- \
//!     --node target/release/node --moto PATH/moto_server [--runs 3] [--lease-ms 3000]
//! ```
//!
//! Each run starts, on loopback, an S3-compatible server (`--moto`, which
//! `scripts/fetch-test-tools` installs) holding the lease, two heads of one
//! set, and two workers given both heads; submits a detached job of
//! `--texts` texts with the real model (`--model`), kills the primary with
//! SIGKILL once the job has written eight batches, and times, from the
//! kill: the standby's `flotilla_head_role{role="primary"}` turning 1; both
//! workers up in its table; from the standby's takeover, the first batch
//! the job writes; and the longest time the job wrote no batch, from the
//! kill to its last batch. Baseline in the same run: the longest time the
//! job wrote no batch before the kill (from its first batch to its
//! eighth). The floors: the lease's duration
//! (a standby may not take over sooner) and the down threshold (how long a
//! member takes to notice a silent head). Prints each run and the medians;
//! the last line reads `failover: median … s to primary, …`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_testkit::ca::free_tcp_addr;
use flotilla_testkit::cluster::{Lease, Scratch, all_up, eventually, free_addr, head_role};
use flotilla_testkit::s3::S3Server;

#[derive(Parser)]
struct Args {
    /// The `node` binary.
    #[arg(long)]
    node: PathBuf,
    /// moto's `moto_server`.
    #[arg(long)]
    moto: PathBuf,
    /// The model folder.
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    model: PathBuf,
    /// Failovers to time.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Texts in the job.
    #[arg(long, default_value_t = 3000)]
    texts: u64,
    /// The head set's lease duration, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
}

/// What one failover took, from the kill.
struct Run {
    primary: Duration,
    members: Duration,
    /// The first batch written after the standby became the primary.
    first_batch: Duration,
    /// The longest time without a batch written, from the kill to the
    /// job's last batch.
    stall: Duration,
    /// The same before the kill (the baseline).
    steady: Duration,
}

/// Batches written before the primary is killed.
const BEFORE_KILL: usize = 8;

/// Parts written to `out` so far.
fn parts(out: &Path) -> usize {
    std::fs::read_dir(out.join("parts")).map_or(0, |d| d.count())
}

fn run_once(args: &Args, i: usize) -> anyhow::Result<Run> {
    let s = Scratch::new(&format!("failover-bench-{i}"), &args.node);
    let server = S3Server::start(&args.moto);
    let env = server.env();
    let lease = Lease {
        store: "s3://embeds/heads",
        ms: args.lease_ms,
    };
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let (a_metrics, b_metrics) = (free_tcp_addr(), free_tcp_addr());
    let heads = format!("{a_addr},{b_addr}");
    let mut a = s.spawn_head_of_set("head-a", a_addr, a_metrics, lease, &env);
    eventually(Duration::from_secs(30), || {
        (head_role(a_metrics, "primary")? == 1.0).then_some(())
    });
    let _b = s.spawn_head_of_set("head-b", b_addr, b_metrics, lease, &env);
    eventually(Duration::from_secs(30), || {
        (head_role(b_metrics, "standby")? == 1.0).then_some(())
    });
    let model = args.model.canonicalize()?;
    let _workers = s.spawn_set_workers(&["r1", "r2"], &heads, &[&s.dir, &model]);
    let input = s.dir.join("corpus.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input)?);
    flotilla_testkit::corpus::write_jsonl(
        &mut file,
        flotilla_testkit::corpus::DEFAULT_SEED,
        args.texts,
    )?;
    drop(file);
    let out = s.dir.join("out");
    let submitted = Command::new(&args.node)
        .args(["embed", "--detach", "--head", &heads])
        .args(["--certs", s.certs().to_str().unwrap()])
        .args(["--input", input.to_str().unwrap()])
        .args(["--output", out.to_str().unwrap()])
        .args(["--model", model.to_str().unwrap()])
        .args(["--actors", "2", "--actor-resources", "cpu=1"])
        .args(["--batch-size", "32", "--format", "jsonl"])
        .output()?;
    anyhow::ensure!(
        submitted.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let id = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    // The baseline, in the same run: the longest time without a batch
    // while the primary lives, over the job's first batches.
    let first = eventually(Duration::from_secs(180), || {
        (parts(&out) >= 1).then(Instant::now)
    })
    .0;
    let (mut seen, mut last, mut steady) = (parts(&out), first, Duration::ZERO);
    while seen < BEFORE_KILL {
        anyhow::ensure!(
            first.elapsed() < Duration::from_secs(180),
            "no batches before the kill"
        );
        let now = parts(&out);
        if now > seen {
            steady = steady.max(last.elapsed());
            last = Instant::now();
            seen = now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    a.signal("-KILL");
    let killed = Instant::now();
    let _ = a.child.wait();
    let total = usize::try_from(args.texts.div_ceil(32))?;
    let (mut primary, mut members, mut first_batch) = (None, None, None);
    let (mut seen, mut last_batch, mut stall) = (parts(&out), Duration::ZERO, Duration::ZERO);
    let mut polled = 0u32;
    while primary.is_none() || members.is_none() || seen < total {
        anyhow::ensure!(
            killed.elapsed() < Duration::from_secs(300),
            "the job did not end within 300 s of the kill"
        );
        if primary.is_none() && head_role(b_metrics, "primary") == Some(1.0) {
            primary = Some(killed.elapsed());
        }
        let now = parts(&out);
        if now > seen {
            let at = killed.elapsed();
            stall = stall.max(at - last_batch);
            last_batch = at;
            seen = now;
            if primary.is_some() && first_batch.is_none() {
                first_batch = primary.map(|p| at - p);
            }
        }
        // `node status` costs a process; asked every fourth pass.
        if primary.is_some() && members.is_none() && polled.is_multiple_of(4) {
            let up = s
                .status(b_addr)
                .is_some_and(|st| all_up(&st, &["head", "r1", "r2"]));
            if up {
                members = Some(killed.elapsed());
            }
        }
        polled += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    // Let the job end so that nothing is left running.
    let _ = Command::new(&args.node)
        .args(["jobs", "wait", &id, "--head", &heads])
        .args(["--certs", s.certs().to_str().unwrap(), "--timeout-s", "300"])
        .output()?;
    drop(server);
    Ok(Run {
        primary: primary.unwrap_or_default(),
        members: members.unwrap_or_default(),
        first_batch: first_batch.unwrap_or_default(),
        stall,
        steady,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "head failover: {} runs, lease {} ms, down threshold 5000 ms (the default), {} texts",
        args.runs, args.lease_ms, args.texts
    );
    println!(
        "| run | standby primary s | members rejoined s | first batch after it s | longest stall s | baseline: longest gap before the kill s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let mut runs = Vec::new();
    for i in 0..args.runs {
        let r = run_once(&args, i)?;
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            i + 1,
            r.primary.as_secs_f64(),
            r.members.as_secs_f64(),
            r.first_batch.as_secs_f64(),
            r.stall.as_secs_f64(),
            r.steady.as_secs_f64()
        );
        runs.push(r);
    }
    let med = |f: fn(&Run) -> Duration| median(runs.iter().map(|r| f(r).as_secs_f64()).collect());
    println!(
        "failover: median {:.2} s to primary, {:.2} s to members, {:.2} s from then to the first batch, longest stall {:.2} s against {:.2} s before the kill (lease {:.1} s)",
        med(|r| r.primary),
        med(|r| r.members),
        med(|r| r.first_batch),
        med(|r| r.stall),
        med(|r| r.steady),
        args.lease_ms as f64 / 1e3
    );
    Ok(())
}
