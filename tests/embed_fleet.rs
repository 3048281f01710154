//! A fleet that changes under an embed job: workers killed with SIGKILL
//! and replaced mid-job, its pace measured. Alone in its binary, so that
//! no other test's processes share the cores while it measures.

use std::path::Path;
use std::time::Duration;

mod common;

use common::*;

const NODE: &str = env!("CARGO_BIN_EXE_node");

/// Parts written per second over the `window` before `at`, from their
/// files' times.
fn rate_before(out: &Path, at: std::time::SystemTime, window: Duration) -> f64 {
    let from = at - window;
    let n = parts(out)
        .values()
        .filter(|t| **t > from && **t <= at)
        .count();
    n as f64 / window.as_secs_f64()
}

/// How long after `since` the job's rate over the last 10 s is back to
/// `share` of `base` (parts per second), polling for up to `budget`.
fn back_to(
    out: &Path,
    base: f64,
    share: f64,
    since: std::time::Instant,
    budget: Duration,
) -> Duration {
    const WINDOW: Duration = Duration::from_secs(10);
    let (_, _) = eventually(budget, || {
        let now = std::time::SystemTime::now();
        (since.elapsed() >= WINDOW / 2 && rate_before(out, now, WINDOW) >= share * base)
            .then_some(())
    });
    since.elapsed()
}

/// Clause "fleet: preemption": 30% of the workers killed with SIGKILL
/// mid-job and replaced, twice (1 of 4, then 2 of 6 once the job grew
/// onto two more): the killed workers' bundles go to the replacements,
/// every id comes out exactly once, and the job's throughput (parts per
/// second over 10 s) is back to 90% of its level before the kill within
/// 60 s of the replacements being up. Prints what it measured.
#[test]
fn a_job_keeps_its_pace_through_thirty_percent_of_its_workers_killed_and_replaced() {
    let s = Scratch::new("embed-preempt", NODE);
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    let mut workers = cpu_workers(&s, head.addr, &["k1", "k2", "k3", "k4"], "cpu=1");
    let (input, ids) = corpus(&s.dir, 16_000);
    let out = s.dir.join("out-preempt");
    let running = driver(
        &s,
        &head,
        &input,
        &out,
        "preempt",
        &["--actors", "auto", "--actor-resources", "cpu=1"],
    );
    const BASE: Duration = Duration::from_secs(15);
    let mut measured = Vec::new();
    for (round, victims, added, fresh) in [
        (1, &["k1"][..], &[][..], &["r1"][..]),
        (2, &["k2", "k3"][..], &["k5", "k6"][..], &["r2", "r3"][..]),
    ] {
        if !added.is_empty() {
            workers.extend(cpu_workers(&s, head.addr, added, "cpu=1"));
            for name in added {
                eventually(Duration::from_secs(30), || {
                    (actors_on(&s, &head, name)? >= 1).then_some(())
                });
            }
        }
        // Its pace, once every actor has worked a while.
        eventually(Duration::from_secs(180), || {
            (parts(&out).len() >= 40 * round).then_some(())
        });
        std::thread::sleep(BASE);
        let base = rate_before(&out, std::time::SystemTime::now(), BASE);
        for name in victims {
            let at = workers.iter().position(|w| w.name == *name).unwrap();
            workers.remove(at).signal("-KILL");
        }
        // The replacements join at once, before the victims are found
        // down: taken for growth first, they give way to the victims'
        // bundles once those wait for room.
        workers.extend(cpu_workers(&s, head.addr, fresh, "cpu=1"));
        let up = std::time::Instant::now();
        let took = back_to(&out, base, 0.9, up, Duration::from_secs(60));
        eprintln!(
            "round {round}: {} of {} workers killed; {base:.2} parts/s before, back to 90% {took:?} after the replacements were up",
            victims.len(),
            workers.len() + victims.len() - fresh.len()
        );
        measured.push(took);
        // No bundle is left waiting: every one has a worker.
        eventually(Duration::from_secs(30), || {
            let st = s.status(head.addr)?;
            let g = st["groups"].as_array()?.first()?.clone();
            let placed = g["bundles"]
                .as_array()?
                .iter()
                .all(|b| b["node"].as_str().is_some_and(|n| !n.is_empty()));
            (g["state"] == "ready" && placed).then_some(())
        });
        assert!(
            parts(&out).len() < ids.len().div_ceil(32),
            "the job finished before round {round} was measured"
        );
    }
    let (ok, summary) = finish(&s, running, "preempt");
    assert!(ok, "{summary}");
    assert_exactly_once(&out, &ids);
    eprintln!("{summary}");
    // The two workers added between the rounds grew the job (and the
    // replacements too, when they came before their victims were found
    // down); the victims' actors started again on the replacements.
    let count = |after: &str| -> u64 {
        let at = summary
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in {summary}"));
        summary[..at].rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(count(" actors added as workers joined") >= 2, "{summary}");
    assert!(count(" actor restarts") >= 3, "{summary}");
    // Lost with their nodes, or let go: no crash is charged to a batch.
    let log = std::fs::read_to_string(s.dir.join("driver-preempt.log")).unwrap();
    assert!(!log.contains("charged an attempt"), "{log}");
    assert!(
        measured.iter().all(|t| *t <= Duration::from_secs(60)),
        "{measured:?}"
    );
}
