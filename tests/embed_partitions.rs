//! `node embed --head` through real partitions: the head, two workers and
//! the driver each in a network namespace of their own
//! (`flotilla_testkit::netns`), a link cut mid-job — a worker from the
//! head, the driver from a worker, one direction only, a link that flaps —
//! and healed. Each job completes with every id exactly once.
//!
//! Each test names the clause of docs/runtime-semantics.md it checks.

use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;

use common::*;
use flotilla_testkit::netns::Net;

const NODE: &str = env!("CARGO_BIN_EXE_node");

/// Every node listens on this port of its own namespace's address.
const PORT: u16 = 7500;

/// Heartbeats every 500 ms, down after 2 s of silence.
const FAST: [&str; 4] = ["--heartbeat-ms", "500", "--down-after-ms", "2000"];

/// A head and two workers, each in its namespace, all up; the driver's
/// namespace is `drv`.
fn net_cluster(s: &Scratch) -> (Net, Vec<Proc>) {
    let net = Net::new(&["head", "w1", "w2", "drv"]);
    let head = net.addr("head", PORT);
    let mut procs = vec![net.spawn(s, "head", PORT, None, &FAST)];
    for w in ["w1", "w2"] {
        procs.push(net.spawn(s, w, PORT, Some(head), &FAST));
    }
    eventually(Duration::from_secs(30), || {
        net.status(s, "head", head, false)
            .filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    (net, procs)
}

/// What a job through a cut left: its summary line and each process's log
/// (`driver`, `head`, `w1`, `w2`).
struct Finished {
    summary: String,
    logs: Vec<(&'static str, String)>,
}

impl Finished {
    /// The actor restarts the summary line counts.
    fn restarts(&self) -> u64 {
        let words: Vec<&str> = self.summary.split_whitespace().collect();
        words
            .windows(3)
            .find(|w| w[1] == "actor" && w[2].starts_with("restarts"))
            .and_then(|w| w[0].parse().ok())
            .unwrap_or_else(|| panic!("no restart count in {:?}", self.summary))
    }

    /// The lines of every log that contain `needle`, each with its log's
    /// name.
    fn lines_with(&self, needle: &str) -> Vec<String> {
        self.logs
            .iter()
            .flat_map(|(name, log)| {
                log.lines()
                    .filter(|l| l.contains(needle))
                    .map(move |l| format!("{name}: {l}"))
            })
            .collect()
    }
}

/// Runs a 4,000-text job from the driver's namespace; once it has written
/// a few parts, `cut` is applied, held for `hold`, then `heal`. The job
/// must complete with every id exactly once. Prints what it measured and
/// returns what it left.
fn job_through(tag: &str, hold: Duration, cut: impl Fn(&Net), heal: impl Fn(&Net)) -> Finished {
    let s = Scratch::new(tag, NODE);
    let (net, _procs) = net_cluster(&s);
    let (input, ids) = corpus(&s.dir, 4000);
    let out = s.dir.join("out");
    let log = std::fs::File::create(s.dir.join("driver.log")).unwrap();
    let mut cmd = net.command("drv", s.binary());
    embed_on_cluster(&mut cmd, &input, &out, net.addr("head", PORT), &s.certs());
    cmd.args(["--listen", &net.addr("drv", PORT).to_string()])
        .stdout(Stdio::piped())
        .stderr(log);
    let driver = cmd.spawn().unwrap();
    let mut driver = KillOnDrop(Some(driver));
    let total = ids.len().div_ceil(32);
    eventually(Duration::from_secs(180), || {
        (parts(&out).len() >= 3).then_some(())
    });
    let started = Instant::now();
    cut(&net);
    std::thread::sleep(hold);
    heal(&net);
    let healed = started.elapsed();
    assert!(
        parts(&out).len() < total,
        "the job finished before the link was healed: use a larger corpus"
    );
    let output = driver.0.take().unwrap().wait_with_output().unwrap();
    let finished = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        std::fs::read_to_string(s.dir.join("driver.log")).unwrap_or_default()
    );
    assert_exactly_once(&out, &ids);
    eprintln!(
        "{tag}: cut for {hold:?}, healed at {healed:?}, the job done {finished:?} after the cut: {}",
        stdout.trim()
    );
    // Never two up incarnations of a name: the table holds one per name,
    // and every worker is up again as one.
    eventually(Duration::from_secs(20), || {
        net.status(&s, "head", net.addr("head", PORT), false)
            .filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    drop(driver);
    let logs = ["driver", "head", "w1", "w2"]
        .into_iter()
        .map(|name| {
            let log = s.dir.join(format!("{name}.log"));
            (name, std::fs::read_to_string(log).unwrap_or_default())
        })
        .collect();
    Finished {
        summary: stdout.trim().to_owned(),
        logs,
    }
}

/// A child process killed when the test ends before it does.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Clause "partitions: jobs through cuts": w1 cut from the head (not from
/// the driver nor w2) for 8 s, past the down threshold: the head marks it
/// down, the driver stops using it and re-dispatches its batches, and w1
/// rejoins as a new incarnation after the heal.
#[test]
fn a_job_completes_through_a_worker_cut_off_from_the_head() {
    job_through(
        "cut-head-w1",
        Duration::from_secs(8),
        |net| net.cut_between("w1", "head"),
        |net| net.heal_between("w1", "head"),
    );
}

/// Clause "restarts: one copy of a child": the driver cut from w1 for 12 s
/// (past QUIC's idle timeout) while w1 stays up and its heartbeats reach
/// the head. The batches sent to w1 run out their deadline and go to w2;
/// the driver's supervisor stops w1's actor before it starts it again
/// there, so no spawn is refused for a taken name, and the restarts stay
/// within the job's limit (once, a loop of refused spawns used them all
/// and stopped the job).
#[test]
fn a_job_completes_through_a_driver_cut_off_from_a_worker() {
    let finished = job_through(
        "cut-drv-w1",
        Duration::from_secs(12),
        |net| net.cut_between("drv", "w1"),
        |net| net.heal_between("drv", "w1"),
    );
    let refused = finished.lines_with("already runs there");
    assert!(
        refused.is_empty(),
        "a spawn was refused for a taken name:\n{}",
        refused.join("\n")
    );
    // The cut loses w1's actor once (its link, not its node); the job's
    // limit is 5 restarts within 60 s.
    let restarts = finished.restarts();
    assert!(
        restarts <= 2,
        "{restarts} actor restarts for one cut: {}",
        finished.summary
    );
    let escalated = finished.lines_with("supervisor gives up");
    assert!(escalated.is_empty(), "{}", escalated.join("\n"));
}

/// Clause "partitions: jobs through cuts": w1's packets to the head and
/// the driver are lost for 8 s while theirs reach it (one direction only).
#[test]
fn a_job_completes_through_a_one_way_cut() {
    job_through(
        "one-way-w1",
        Duration::from_secs(8),
        |net| {
            net.block("w1", "head");
            net.block("w1", "drv");
        },
        |net| {
            net.unblock("w1", "head");
            net.unblock("w1", "drv");
        },
    );
}

/// Clause "partitions: jobs through cuts": w1's link goes down and up
/// every second for 8 s.
#[test]
fn a_job_completes_through_a_flapping_link() {
    job_through(
        "flapping-w1",
        Duration::ZERO,
        |net| {
            for _ in 0..4 {
                net.cut("w1");
                std::thread::sleep(Duration::from_secs(1));
                net.heal("w1");
                std::thread::sleep(Duration::from_secs(1));
            }
        },
        |_| {},
    );
}
