//! Partitions and outages with real `node` processes (the `test-node`
//! binary): nodes in network namespaces of their own whose links the test
//! cuts and heals (`flotilla_testkit::netns`), and a head killed under
//! members fed by a simulated systemd watchdog.
//!
//! Each test names the clause of docs/runtime-semantics.md it checks.

use std::time::{Duration, Instant};

use flotilla_testkit::cluster::*;
use flotilla_testkit::netns::Net;

const NODE: &str = env!("CARGO_BIN_EXE_test-node");

/// Every node listens on this port of its own namespace's address.
const PORT: u16 = 7400;

/// The ticker of `sup`'s tree as `node status` shows it.
fn ticker(st: &serde_json::Value) -> Option<&serde_json::Value> {
    Some(&supervisor_of(st, "sup", "tickers")?["children"][0])
}

/// The node the ticker of `sup`'s tree runs on, when it runs.
fn ticker_node(st: &serde_json::Value) -> Option<String> {
    let child = ticker(st)?;
    (child["running"] == true).then(|| child["node"].as_str().map(str::to_owned))?
}

/// Clauses "partitions: rejoin" and "partitions: fencing": a worker cut
/// off (its link down both ways) for longer than the QUIC idle timeout is
/// marked down and the supervised child it ran is restarted on the other
/// worker at a newer epoch, from which moment the old copy's checkpoint
/// saves are refused; within 5 s of the heal the worker is up again as a
/// newer incarnation, having first stopped what it hosted for others, and
/// one copy runs.
#[test]
fn a_cut_off_worker_stops_what_it_hosted_for_others_and_is_back_up_within_five_seconds_of_the_heal()
{
    let s = Scratch::new("partition", NODE);
    let net = Net::new(&["head", "w1", "w2", "sup"]);
    let fast = ["--heartbeat-ms", "500", "--down-after-ms", "2000"];
    let head_addr = net.addr("head", PORT);
    let _head = net.spawn(&s, "head", PORT, None, &fast);
    let _w1 = net.spawn(&s, "w1", PORT, Some(head_addr), &fast);
    let _w2 = net.spawn(&s, "w2", PORT, Some(head_addr), &fast);
    let status = |supervisors| net.status(&s, "head", head_addr, supervisors);
    eventually(Duration::from_secs(30), || {
        status(false).filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    let config = ticker_tree(&s);
    let mut flags = fast.to_vec();
    flags.extend(["--config", config.to_str().unwrap()]);
    let _sup = net.spawn(&s, "sup", PORT, Some(head_addr), &flags);
    let (st, _) = eventually(Duration::from_secs(30), || {
        status(true).filter(|st| ticker_node(st).as_deref() == Some("w1"))
    });
    let old = incarnation_of(&st, "w1").unwrap();
    let old_epoch = ticker(&st).unwrap()["epoch"].as_u64().unwrap();

    net.cut("w1");
    let cut = Instant::now();
    let (_, restarted) = eventually(Duration::from_secs(20), || {
        status(true).filter(|st| {
            state_of(st, "w1").as_deref() == Some("down")
                && ticker_node(st).as_deref() == Some("w2")
        })
    });
    // Past QUIC's idle timeout (10 s): w1's connections are dead, not
    // merely silent, when the link returns.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(cut.elapsed()));
    net.heal("w1");
    let (st, back) = eventually(Duration::from_secs(20), || {
        status(false).filter(|st| {
            state_of(st, "w1").as_deref() == Some("up")
                && incarnation_of(st, "w1").is_some_and(|i| i > old)
        })
    });
    eprintln!(
        "ticker restarted on w2 {restarted:?} after the cut; w1 up as a new incarnation {back:?} after the heal"
    );
    assert!(
        back <= Duration::from_secs(5),
        "back {back:?} after the heal"
    );
    assert_eq!(node_of(&st, "w1").unwrap()["actors"], 0, "{st}");
    let w1_log = s.log("w1");
    // The old copy's saves were refused once the new one had started.
    assert!(
        w1_log.contains("NODE-CKPT-006"),
        "w1's copy of the ticker was fenced off its checkpoints: {w1_log}"
    );
    let line = |code: &str| {
        w1_log
            .lines()
            .position(|l| l.contains(code))
            .unwrap_or_else(|| panic!("{code} in w1's log: {w1_log}"))
    };
    assert!(
        line("NODE-JOIN-010") < line("NODE-JOIN-006"),
        "stopped what it hosted for others before rejoining: {w1_log}"
    );
    // One copy: the supervisor's, on w2, restarted once at a newer epoch,
    // continuing from the old epoch's newest snapshot.
    let (st, _) = eventually(Duration::from_secs(5), || {
        status(true).filter(|st| ticker_node(st).as_deref() == Some("w2"))
    });
    let child = ticker(&st).unwrap();
    assert_eq!(child["restarts"], 1, "{st}");
    let new_epoch = child["epoch"].as_u64().unwrap();
    assert!(new_epoch > old_epoch, "epoch {new_epoch} after {old_epoch}");
    let w2_log = s.log("w2");
    assert!(
        w2_log.contains(&format!("epoch={new_epoch}")) && w2_log.contains("ticker restored"),
        "{w2_log}"
    );
    // How long the old copy outlived the new one's start.
    let at = |log: &str, what: &str| log.lines().find(|l| l.contains(what)).and_then(log_seconds);
    if let (Some(started), Some(refused)) = (
        at(&w2_log, &format!("epoch={new_epoch}")),
        at(&w1_log, "NODE-CKPT-006"),
    ) {
        eprintln!(
            "the old copy's first refused save came {:.3} s after the new copy started",
            refused - started
        );
    }
}

/// Seconds since midnight of a log line's timestamp (`…THH:MM:SS.ffffffZ`).
fn log_seconds(line: &str) -> Option<f64> {
    let time = line.split_once('T')?.1.split_once('Z')?.0;
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// Clause "systemd: notify and watchdog" and "partitions: head outage":
/// with the head killed for 60 s, a worker under a 2 s watchdog goes on
/// feeding it at least every half period (its heartbeat loop never waits
/// on a dial), keeps the actor it hosts for another worker, and rejoins
/// the restarted head as the same incarnation.
#[test]
fn workers_ride_out_a_sixty_second_head_outage_feeding_the_watchdog() {
    let s = Scratch::new("head-outage", NODE);
    let fast = ["--heartbeat-ms", "500", "--down-after-ms", "2000"];
    s.issue("head");
    let head_addr = free_addr();
    let mut head = s.spawn_with("head", "head", head_addr, None, &fast);
    let watchdog = Duration::from_secs(2);
    let (socket, env) = notify_socket(&s, "w1", watchdog);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    s.issue("w1");
    let _w1 = s.launch(Launch {
        role: "join",
        name: "w1",
        listen: free_addr(),
        head: Some(head_addr),
        flags: &fast,
        env: &env,
    });
    let config = ticker_tree(&s);
    let mut flags = fast.to_vec();
    flags.extend(["--config", config.to_str().unwrap()]);
    s.issue("sup");
    let _sup = s.spawn_with("join", "sup", free_addr(), Some(head_addr), &flags);
    let (st, _) = eventually(Duration::from_secs(30), || {
        s.status_with_supervisors(head_addr)
            .filter(|st| ticker_node(st).as_deref() == Some("w1") && all_up(st, &["w1", "sup"]))
    });
    let incarnation = incarnation_of(&st, "w1").unwrap_or_else(|| panic!("no w1 in {st}"));

    head.signal("-KILL");
    let _ = head.child.wait();
    let outage = Instant::now();
    let fed: Vec<Instant> = notifications(&socket, outage + Duration::from_secs(60))
        .into_iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(at, _)| at)
        .collect();
    let mut gaps = fed.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
    gaps.push(fed.first().map_or(Duration::MAX, |f| *f - outage));
    let widest = gaps.iter().max().copied().unwrap_or(Duration::MAX);
    assert!(
        widest <= watchdog / 2 + Duration::from_millis(250),
        "fed every {:?} at worst through the outage ({} feeds)",
        widest,
        fed.len()
    );

    let _head = s.spawn_with("head", "head", head_addr, None, &fast);
    let (st, back) = eventually(Duration::from_secs(20), || {
        s.status_with_supervisors(head_addr)
            .filter(|st| all_up(st, &["head", "w1", "sup"]) && ticker_node(st).is_some())
    });
    eprintln!(
        "w1 fed systemd through a 60 s head outage (widest gap {widest:?}); rejoined {back:?} after the head's restart"
    );
    assert_eq!(incarnation_of(&st, "w1"), Some(incarnation), "{st}");
    assert_eq!(ticker_node(&st).as_deref(), Some("w1"), "{st}");
    let sups = node_of(&st, "sup").unwrap()["supervisors"].clone();
    assert_eq!(
        sups[0]["children"][0]["restarts"], 0,
        "kept, not restarted: {st}"
    );
    // Its heartbeats report the actor it kept.
    eventually(Duration::from_secs(5), || {
        s.status(head_addr)
            .filter(|st| node_of(st, "w1").is_some_and(|n| n["actors"] == 1))
    });
}
