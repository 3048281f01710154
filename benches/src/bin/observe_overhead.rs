//! What seeing a job costs the job: the CPU a detached embed job takes
//! with the per-job metrics scraped and the dashboard polled, against the
//! same job with both off, in one run.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin observe_overhead -- \
//!     --node target/release/node [--runs 3] [--texts 4000] [--poll-ms 1000]
//! ```
//!
//! Each run starts, on loopback, a head and two workers (`--resource
//! cpu=2` each) and submits a detached job of `--texts` texts with the real
//! model (`--model`) on two one-cpu actors, in batches of 32, then waits
//! for it to end. Two arms:
//!
//! - **off** (the baseline): the head serves no `/metrics`, no dashboard
//!   runs, and the job is submitted with `--no-cpu-time` (its actors read no
//!   CPU clocks around each batch);
//! - **on**: the head serves `/metrics` (`--metrics-listen`) and `node
//!   dashboard` runs with an observer's certificate; every `--poll-ms`
//!   this process scrapes `/metrics` and asks the dashboard for the
//!   cluster, the jobs and the job pages (what a browser tab on the job
//!   asks every 5 s, and Prometheus every 15 s, by default), and the
//!   actors time each batch's CPU.
//!
//! The cost is the CPU time (user and system, every thread) of every
//! process of the cluster (head, workers, the job's driver within them,
//! and the dashboard) from the submission to the job's end, read from
//! `/proc`, each process apart. The arms alternate (off, on, then on,
//! off, …) so that a drift of the machine falls on both. What is the
//! metrics' own: the head's and the dashboard's CPU beyond the baseline's,
//! and, at the actors, the clock reads around each batch, timed here
//! apart (two reads of a one-thread pool's CPU clock, as an actor makes
//! per batch, `--clock-reads` times). Prints each job, the medians, and
//! the share of the job's CPU these take; the last line reads `observe
//! overhead: on … CPU-s, off … CPU-s, …; attributable …%`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_benches::median;
use flotilla_testkit::ca::free_tcp_addr;
use flotilla_testkit::cluster::{Proc, Scratch, eventually, free_addr, scrape};

#[derive(Parser)]
struct Args {
    /// The `node` binary.
    #[arg(long)]
    node: PathBuf,
    /// The model folder.
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    model: PathBuf,
    /// Jobs of each arm.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Texts in each job.
    #[arg(long, default_value_t = 4000)]
    texts: u64,
    /// How often the `on` arm scrapes `/metrics` and polls the dashboard,
    /// in milliseconds.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// Batches whose clock reads are timed apart.
    #[arg(long, default_value_t = 20_000)]
    clock_reads: u32,
}

/// CPU time of one batch's clock reads at an actor: the CPU clocks of its
/// pool's threads read before and after (a one-thread pool, as an actor of
/// `--actor-resources cpu=1` has), over `batches` batches.
fn clock_reads_per_batch(batches: u32) -> Duration {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool");
    let read = || -> Duration {
        pool.broadcast(|_| cpu_time::ThreadTime::now().as_duration())
            .into_iter()
            .sum()
    };
    let started = cpu_time::ProcessTime::now();
    let mut sum = Duration::ZERO;
    for _ in 0..batches {
        let before = read();
        sum += read().saturating_sub(before);
    }
    std::hint::black_box(sum);
    started.elapsed() / batches.max(1)
}

/// One job's run.
struct Run {
    /// CPU time of every process of the cluster from the submission to the
    /// job's end.
    cpu: Duration,
    /// The same, of the head, the workers and the dashboard apart.
    parts: [Duration; 3],
    /// From the submission to the job's end.
    wall: Duration,
    /// Requests this process made of `/metrics` and the dashboard.
    polls: u64,
}

/// CPU time (user and system, all threads) of process `pid` so far, at
/// `hz` clock ticks a second.
fn cpu_of(pid: u32, hz: f64) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start at its `)`.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are the 14th and 15th fields; the state (3rd) is
    // the first after the command.
    let total = ticks(11).unwrap_or(0) + ticks(12).unwrap_or(0);
    Duration::from_secs_f64(total as f64 / hz)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`).
fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// The body of `GET path` from the dashboard at `addr`, if it answers 200.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Job `id`'s state, asked of the head with `node jobs --json`.
fn state_of(s: &Scratch, head: SocketAddr, id: &str) -> Option<String> {
    let out = Command::new(s.binary())
        .args(["jobs", "--json", "--head", &head.to_string()])
        .args(["--certs", s.certs().to_str()?])
        .output()
        .ok()?;
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let jobs = listed["jobs"].as_array()?;
    let job = jobs.iter().find(|j| j["id"] == id)?;
    Some(job["state"].as_str()?.to_owned())
}

fn run_once(args: &Args, i: usize, on: bool) -> anyhow::Result<Run> {
    let arm = if on { "on" } else { "off" };
    let s = Scratch::new(&format!("observe-bench-{arm}-{i}"), &args.node);
    let metrics = free_tcp_addr();
    let metrics_flag = metrics.to_string();
    let head_flags: &[&str] = if on {
        &["--metrics-listen", &metrics_flag]
    } else {
        &[]
    };
    let head = s.spawn_with("head", "head", free_addr(), None, head_flags);
    let model = args.model.canonicalize()?;
    let workers = s.spawn_set_workers(&["w1", "w2"], &head.addr.to_string(), &[&s.dir, &model]);
    let mut dashboard = None;
    let listen = free_tcp_addr();
    if on {
        s.issue_role("watcher", "observer");
        let child = Command::new(s.binary())
            .args(["dashboard", "--listen", &listen.to_string()])
            .args(["--head", &head.addr.to_string()])
            .args(["--certs", s.certs().to_str().unwrap(), "--name", "watcher"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(s.dir.join("dashboard.log"))?)
            .spawn()?;
        dashboard = Some(Killed(child));
        eventually(Duration::from_secs(30), || {
            get(listen, "/api/jobs").map(|_| ())
        });
    }
    let input = s.dir.join("corpus.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input)?);
    flotilla_testkit::corpus::write_jsonl(
        &mut file,
        flotilla_testkit::corpus::DEFAULT_SEED,
        args.texts,
    )?;
    file.flush()?;
    drop(file);
    let mut pids: Vec<u32> = std::iter::once(&head)
        .chain(&workers)
        .map(|p: &Proc| p.child.id())
        .collect();
    pids.extend(dashboard.as_ref().map(|d| d.0.id()));

    let hz = ticks_per_second();
    let before: Vec<Duration> = pids.iter().map(|&p| cpu_of(p, hz)).collect();
    let started = Instant::now();
    let out = s.dir.join("out");
    let mut submit = Command::new(s.binary());
    submit
        .args(["embed", "--detach", "--head", &head.addr.to_string()])
        .args(["--certs", s.certs().to_str().unwrap()])
        .args(["--input", input.to_str().unwrap()])
        .args(["--output", out.to_str().unwrap()])
        .args(["--model", model.to_str().unwrap()])
        .args(["--actors", "2", "--actor-resources", "cpu=1"])
        .args(["--batch-size", "32", "--format", "jsonl"]);
    if !on {
        submit.arg("--no-cpu-time");
    }
    let submitted = submit.output()?;
    anyhow::ensure!(
        submitted.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let id = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let poll = Duration::from_millis(args.poll_ms);
    let (mut polls, mut next_poll, mut next_check) = (0u64, Instant::now(), Instant::now());
    loop {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "job {id} did not end within 30 minutes"
        );
        if on && Instant::now() >= next_poll {
            next_poll += poll;
            let asked = [
                scrape(metrics).map(|_| ()),
                get(listen, "/api/cluster").map(|_| ()),
                get(listen, "/api/jobs").map(|_| ()),
                get(listen, &format!("/api/job?id={id}")).map(|_| ()),
            ];
            polls += asked.iter().filter(|a| a.is_some()).count() as u64;
        }
        // `node jobs` costs a process (counted in neither arm): asked
        // every 2 s.
        if Instant::now() >= next_check {
            next_check += Duration::from_secs(2);
            match state_of(&s, head.addr, &id).as_deref() {
                Some("succeeded") => break,
                Some(end @ ("failed" | "cancelled")) => anyhow::bail!("job {id} {end}"),
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = started.elapsed();
    let spent: Vec<Duration> = pids
        .iter()
        .zip(&before)
        .map(|(&p, &b)| cpu_of(p, hz).saturating_sub(b))
        .collect();
    let cpu = spent.iter().sum();
    let parts = [
        spent[0],
        spent[1..3].iter().sum(),
        spent.get(3).copied().unwrap_or_default(),
    ];
    anyhow::ensure!(
        parts_rows(&out)? == args.texts,
        "the job wrote {} rows, not {}",
        parts_rows(&out)?,
        args.texts
    );
    Ok(Run {
        cpu,
        parts,
        wall,
        polls,
    })
}

/// Rows in the JSONL parts under `out/parts`.
fn parts_rows(out: &Path) -> anyhow::Result<u64> {
    let mut rows = 0;
    for part in std::fs::read_dir(out.join("parts"))? {
        let text = std::fs::read_to_string(part?.path())?;
        rows += text.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    }
    Ok(rows)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "observe overhead: {} jobs per arm of {} texts, head and two workers on loopback, polled every {} ms when on",
        args.runs, args.texts, args.poll_ms
    );
    println!(
        "| job | arm | cluster CPU-s | head | workers | dashboard | wall s | requests answered |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let (mut on_runs, mut off_runs) = (Vec::new(), Vec::new());
    for i in 0..args.runs {
        // off, on; then on, off; …
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            let r = run_once(&args, i, on)?;
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {} |",
                i + 1,
                if on { "on" } else { "off" },
                r.cpu.as_secs_f64(),
                r.parts[0].as_secs_f64(),
                r.parts[1].as_secs_f64(),
                r.parts[2].as_secs_f64(),
                r.wall.as_secs_f64(),
                r.polls
            );
            if on {
                on_runs.push(r);
            } else {
                off_runs.push(r);
            }
        }
    }
    let med =
        |runs: &[Run], f: fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let (on_cpu, off_cpu) = (
        med(&on_runs, |r| r.cpu.as_secs_f64()),
        med(&off_runs, |r| r.cpu.as_secs_f64()),
    );
    let (on_wall, off_wall) = (
        med(&on_runs, |r| r.wall.as_secs_f64()),
        med(&off_runs, |r| r.wall.as_secs_f64()),
    );
    // What the metrics take that the baseline does not: the head's and
    // the dashboard's CPU beyond the baseline's head, and the actors'
    // clock reads, one pair per batch.
    let served = med(&on_runs, |r| (r.parts[0] + r.parts[2]).as_secs_f64())
        - med(&off_runs, |r| r.parts[0].as_secs_f64());
    let per_batch = clock_reads_per_batch(args.clock_reads);
    let clocks = per_batch.as_secs_f64() * args.texts.div_ceil(32) as f64;
    let attributable = (served + clocks) / off_cpu * 100.0;
    println!(
        "clock reads: {:.1} us of CPU per batch, {clocks:.4} CPU-s per job; head and dashboard beyond the baseline: {served:.3} CPU-s per job",
        per_batch.as_secs_f64() * 1e6
    );
    println!(
        "observe overhead: on {on_cpu:.2} CPU-s, off {off_cpu:.2} CPU-s, {:+.2}% (wall {on_wall:.1} s against {off_wall:.1} s, {:+.2}%); attributable {attributable:.2}% of the job's CPU",
        (on_cpu / off_cpu - 1.0) * 100.0,
        (on_wall / off_wall - 1.0) * 100.0
    );
    Ok(())
}
