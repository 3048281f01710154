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
    let mut procs = vec![net.spawn(s, "head", "head", PORT, None, &FAST, &[])];
    for w in ["w1", "w2"] {
        procs.push(net.spawn(s, "join", w, PORT, Some(head), &FAST, &[]));
    }
    eventually(Duration::from_secs(30), || {
        net.status(s, "head", head, false)
            .filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    (net, procs)
}

/// Runs a 4,000-text job from the driver's namespace; once it has written
/// a few parts, `cut` is applied, held for `hold`, then `heal`. The job
/// must complete with every id exactly once. Prints what it measured.
fn job_through(tag: &str, hold: Duration, cut: impl Fn(&Net), heal: impl Fn(&Net)) {
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

/// Clause "partitions: jobs through cuts": the driver cut from w1 for 12 s
/// (past QUIC's idle timeout) while the head sees everyone up: the batches
/// sent to w1 run out their deadline and go to w2.
#[test]
fn a_job_completes_through_a_driver_cut_off_from_a_worker() {
    job_through(
        "cut-drv-w1",
        Duration::from_secs(12),
        |net| net.cut_between("drv", "w1"),
        |net| net.heal_between("drv", "w1"),
    );
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
