//! The size of every answer the dashboard and `/metrics` give, and the
//! time to make it, at 1,000 jobs and 500 members, against a small
//! cluster in the same run.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin dashboard_scale -- [--reps 20]
//! ```
//!
//! The head's answers are made from what it holds (the status document
//! `node status --json` writes, the jobs' accounts), here filled by
//! [`flotilla_testkit::fleet`] as full as the head lets them be: each
//! member with three supervisors of ten children, its resources, labels
//! and object store; 1,000 placement groups of 16 bundles; each job with
//! every histogram filled, 256 actors and an hour of samples. For each
//! answer, what the dashboard process does with each request (parse what
//! the head said, cut a page, write JSON; for `/metrics`, the head's job
//! section over every job) is timed `--reps` times; the largest page and
//! the median time are printed. The baseline: the same answers for 3
//! members and 10 jobs. The last line reads `dashboard at 1000 jobs and
//! 500 members: largest answer … KiB, slowest … ms`.

use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_node::dashboard::json::{cluster_page, job, jobs_page, supervisors_page};
use flotilla_node::dashboard::{JOBS_PER_PAGE, MEMBERS_PER_PAGE, SUPERVISED_PER_PAGE};
use flotilla_proto::job_stats::{JobMetrics, render};
use flotilla_testkit::fleet;

#[derive(Parser)]
struct Args {
    /// Times each answer is made.
    #[arg(long, default_value_t = 20)]
    reps: usize,
}

/// One answer at one scale: its largest page and the median time to make
/// a page.
struct Measured {
    bytes: usize,
    time: Duration,
}

/// Makes each of `pages` pages with `make` `reps` times.
fn measure(reps: usize, pages: usize, make: impl Fn(usize) -> String) -> Measured {
    let mut bytes = 0;
    let mut times = Vec::new();
    for _ in 0..reps {
        for page in 0..pages {
            let started = Instant::now();
            let body = make(page);
            times.push(started.elapsed());
            bytes = bytes.max(body.len());
        }
    }
    times.sort();
    Measured {
        bytes,
        time: times[times.len() / 2],
    }
}

/// Every answer for `members` members and `jobs` jobs.
fn answers(reps: usize, members: usize, jobs: usize) -> Vec<(&'static str, Measured)> {
    let status = fleet::status_json(members, jobs);
    let accounts: Vec<JobMetrics> = (0..jobs).map(fleet::full_account).collect();
    let view = fleet::job_view(256);
    let log = fleet::log_page(50);
    let per_page = JOBS_PER_PAGE as usize;
    vec![
        (
            "/api/cluster (a page)",
            measure(reps, members.div_ceil(MEMBERS_PER_PAGE), |p| {
                cluster_page(&status, p).expect("a status document")
            }),
        ),
        (
            "/api/supervisors (a page)",
            measure(reps, members.div_ceil(SUPERVISED_PER_PAGE), |p| {
                supervisors_page(&status, p).expect("a status document")
            }),
        ),
        (
            "/api/jobs (a page)",
            measure(reps, jobs.div_ceil(per_page), |p| {
                let from = p * per_page;
                jobs_page(&accounts[from..(from + per_page + 1).min(jobs)], p)
            }),
        ),
        (
            "/api/job",
            measure(reps, 1, |_| job(&view, Some(&accounts[0]), Some(&log))),
        ),
        (
            "/metrics (every job's section)",
            measure(reps.min(5), 1, |_| {
                let mut out = String::new();
                render(&accounts, &mut out);
                out
            }),
        ),
    ]
}

fn main() {
    let args = Args::parse();
    let small = answers(args.reps, 3, 10);
    let large = answers(args.reps, 500, 1000);
    println!(
        "dashboard answers: 3 members and 10 jobs (baseline) against 500 members and 1,000 jobs, each as full as the head lets it be; median of {} makes",
        args.reps
    );
    println!(
        "| answer | baseline largest KiB | baseline ms | 1,000 jobs / 500 members largest KiB | ms |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    let kib = |b: usize| b as f64 / 1024.0;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for ((name, s), (_, l)) in small.iter().zip(&large) {
        println!(
            "| {name} | {:.1} | {:.2} | {:.1} | {:.2} |",
            kib(s.bytes),
            ms(s.time),
            kib(l.bytes),
            ms(l.time)
        );
    }
    let paged = &large[..4];
    let largest = paged.iter().map(|(_, m)| m.bytes).max().unwrap_or(0);
    let slowest = paged.iter().map(|(_, m)| m.time).max().unwrap_or_default();
    println!(
        "dashboard at 1000 jobs and 500 members: largest answer {:.1} KiB, slowest {:.2} ms; /metrics {:.1} KiB in {:.1} ms",
        kib(largest),
        ms(slowest),
        kib(large[4].1.bytes),
        ms(large[4].1.time)
    );
}
