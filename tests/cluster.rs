//! Multi-process cluster tests: real `node` processes on 127.0.0.1 (the
//! `test-node` binary: the `node` command with the probe actors of
//! `flotilla_testkit::probe` registered).
//!
//! Each test names the clause of docs/runtime-semantics.md it checks.

use std::process::Command;

use flotilla_proto::hello::Purpose;
use std::time::{Duration, Instant};

use flotilla_proto::ids::{GroupId, MemberName};
use flotilla_testkit::cluster::*;

const NODE: &str = env!("CARGO_BIN_EXE_test-node");

/// Clause "membership: joining": every member learns the full table.
#[test]
fn head_and_two_workers_all_see_three_up_members() {
    let s = Scratch::new("three", NODE);
    let (head, workers) = cluster(&s, &["w1", "w2"]);
    for p in std::iter::once(&head).chain(&workers) {
        let (st, _) = eventually(Duration::from_secs(10), || {
            s.status(p.addr)
                .filter(|st| all_up(st, &["head", "w1", "w2"]))
        });
        assert_eq!(
            st["nodes"].as_array().unwrap().len(),
            3,
            "view of {}",
            p.name
        );
    }
    let st = s.status(head.addr).unwrap();
    let w1 = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "w1")
        .unwrap();
    assert!(w1["resources"]["cpus"].as_u64().unwrap() >= 1);
    assert!(w1["incarnation"].as_u64().unwrap() > 0);
    let h = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "head")
        .unwrap();
    assert_eq!(
        h["resources"]["cpus"], 0,
        "the head offers no work resources by default"
    );
}

/// Clause "membership: failure detection": a silent member is down within
/// down_after plus one heartbeat, on the head and on other members.
///
/// When the head marked it down is read from the head's log (the line's
/// timestamp), not from polling `node status`: each poll is a process and
/// a handshake, which on a loaded machine adds up to a second to what a
/// poll measures (CI once measured 6.38 s that way).
#[test]
fn killed_worker_is_marked_down_within_six_seconds() {
    let s = Scratch::new("kill9", NODE);
    let (head, mut workers) = cluster(&s, &["w1", "w2"]);
    let w2 = workers.pop().unwrap();
    let w1 = workers.pop().unwrap();
    eventually(Duration::from_secs(10), || {
        s.status(w2.addr)
            .filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    let killed_at = seconds_of_day(std::time::SystemTime::now());
    w1.signal("-KILL");
    eventually(Duration::from_secs(8), || {
        s.status(head.addr)
            .filter(|st| state_of(st, "w1").as_deref() == Some("down"))
    });
    eventually(Duration::from_secs(8), || {
        s.status(w2.addr)
            .filter(|st| state_of(st, "w1").as_deref() == Some("down"))
    });
    let log = s.log("head");
    let line = log
        .lines()
        .find(|l| l.contains("member marked down") && l.contains("node=w1"))
        .unwrap_or_else(|| panic!("the head logs w1 down:\n{log}"));
    let marked_at = logged_seconds_of_day(line);
    let took = Duration::from_secs_f64((marked_at - killed_at).rem_euclid(86_400.0));
    assert!(
        took < Duration::from_secs(6),
        "w1 marked down after {took:?}: {line}"
    );
    eprintln!("w1 marked down by the head {took:?} after SIGKILL");
    assert_eq!(
        state_of(&s.status(head.addr).unwrap(), "w2").as_deref(),
        Some("up")
    );
}

/// Clause "membership: clean stop": SIGTERM makes a member `left`.
#[test]
fn sigterm_makes_a_worker_left_not_down() {
    let s = Scratch::new("term", NODE);
    let (head, mut workers) = cluster(&s, &["w1"]);
    let mut w1 = workers.pop().unwrap();
    w1.signal("-TERM");
    let (_, took) = eventually(Duration::from_secs(5), || {
        s.status(head.addr)
            .filter(|st| state_of(st, "w1").as_deref() == Some("left"))
    });
    assert!(took < Duration::from_secs(4), "left after {took:?}");
    let status = w1.exit_within(Duration::from_secs(20));
    assert!(status.success(), "clean stop exits 0, got {status:?}");
    // Still left, never down, after the detector's threshold.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        state_of(&s.status(head.addr).unwrap(), "w1").as_deref(),
        Some("left")
    );
}

/// Clause "security: identity": a certificate from another CA gets no
/// session, and the node exits non-zero saying why.
#[test]
fn node_with_certificate_from_another_ca_is_refused() {
    let s = Scratch::new("otherca", NODE);
    let (head, _workers) = cluster(&s, &[]);
    // A second CA issues "rogue"; its folder trusts the real cluster CA.
    let other = s.dir.join("other");
    let o = other.to_str().unwrap();
    s.node(&["certs", "init", "--out", o]);
    s.node(&["certs", "issue", "--ca", o, "--name", "rogue", "--out", o]);
    std::fs::copy(s.certs().join("ca.crt"), other.join("ca.crt")).unwrap();
    let mut rogue = s.spawn("join", "rogue", free_addr(), Some(head.addr), &other);
    let status = rogue.exit_within(Duration::from_secs(20));
    assert!(!status.success());
    assert!(
        s.log("rogue").contains("NODE-JOIN-001"),
        "log: {}",
        s.log("rogue")
    );
    // Refused in the TLS handshake, not merely unreachable.
    eventually(Duration::from_secs(5), || {
        s.log("head").contains("NODE-AUTH-001").then_some(())
    });
    let st = s.status(head.addr).unwrap();
    assert_eq!(state_of(&st, "rogue"), None);
}

/// Clause "security: identity": a node claiming a name other than its
/// certificate's is refused.
#[test]
fn node_with_certificate_for_another_name_is_refused() {
    let s = Scratch::new("othername", NODE);
    let (head, _workers) = cluster(&s, &[]);
    s.issue("w1");
    // Present w1's certificate under the name w3.
    let certs = s.certs();
    std::fs::copy(certs.join("w1.crt"), certs.join("w3.crt")).unwrap();
    std::fs::copy(certs.join("w1.key"), certs.join("w3.key")).unwrap();
    let mut w3 = s.spawn("join", "w3", free_addr(), Some(head.addr), &certs);
    let status = w3.exit_within(Duration::from_secs(20));
    assert!(!status.success());
    assert!(
        s.log("w3").contains("NODE-AUTH-002"),
        "log: {}",
        s.log("w3")
    );
    assert_eq!(state_of(&s.status(head.addr).unwrap(), "w3"), None);
}

/// A node with the probe kinds, in this process, joined to `head`.
async fn join_in_process(s: &Scratch, name: &str, head: std::net::SocketAddr) -> flotilla::Node {
    s.issue(name);
    let config = flotilla::NodeConfig::new(name, free_addr(), s.certs()).join(head);
    flotilla_testkit::probe::register(flotilla::Node::builder(config))
        .start()
        .await
        .unwrap()
}

/// Clause "delivery: remote call": a typed call between actors on two
/// workers, spawned by name from a third node, completes. Clause "remote
/// spawn: ownership": once that node has left, the workers stop them.
#[test]
fn remote_call_between_actors_on_two_workers() {
    use flotilla::ractor::{ActorRef, call_t};
    use flotilla_testkit::probe::{
        ECHO, EchoMsg, NoArgs, Payload, RELAY, RelayMsg, RelayReply, RelayRequest,
    };

    let s = Scratch::new("call", NODE);
    let (head, _workers) = cluster(&s, &["w1", "w2"]);
    runtime().block_on(async {
        let node = join_in_process(&s, "t1", head.addr).await;
        let budget = Duration::from_secs(15);
        let echo: ActorRef<EchoMsg> = node
            .spawn_on("w2", ECHO.named("echo-w2"), &NoArgs, budget)
            .await
            .unwrap();
        let relay: ActorRef<RelayMsg> = node
            .spawn_on("w1", RELAY.named("relay-w1"), &NoArgs, budget)
            .await
            .unwrap();

        let reply = call_t!(echo, EchoMsg::Echo, 2_000, Payload(b"ping".to_vec())).unwrap();
        assert_eq!(reply, Payload(b"ping".to_vec()));
        echo.cast(EchoMsg::Note(Payload(vec![1]))).unwrap();
        assert_eq!(
            call_t!(echo, EchoMsg::Notes, 2_000).unwrap(),
            1,
            "cast then call arrive in order"
        );

        // w1's relay calls w2's echo: a call between two remote actors.
        let start = Instant::now();
        loop {
            let req = RelayRequest {
                target: "echo-w2".into(),
                payload: b"hop".to_vec(),
                timeout_ms: 2_000,
            };
            match call_t!(relay, RelayMsg::Relay, 5_000, req).unwrap() {
                RelayReply::Echoed(bytes) => {
                    assert_eq!(bytes, b"hop");
                    break;
                }
                RelayReply::Failed(why) => {
                    assert!(start.elapsed() < budget, "relay kept failing: {why}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        assert!(node.lookup::<EchoMsg>("echo-w2").is_ok());
        // The actor counts reach every member with the next heartbeats.
        let counted = node
            .wait_members(Duration::from_secs(5), |t| {
                ["w1", "w2"]
                    .iter()
                    .all(|w| t.get(w).is_some_and(|m| m.actors == 1))
            })
            .await;
        assert!(counted.is_some(), "w1 and w2 report their actor");
        node.shutdown().await;
    });
    // Actors are owned by the node that spawned them: once it has left,
    // the workers stop them.
    eventually(Duration::from_secs(5), || {
        s.status(head.addr).filter(|st| {
            st["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["name"] == "w1" || n["name"] == "w2")
                .all(|n| n["actors"] == 0)
        })
    });
}

/// One round of large and small casts to a fresh echo named `name` on
/// `worker`: everything arrives intact, and the large ones went over the
/// bulk lane.
async fn bulk_round(node: &flotilla::Node, worker: &str, name: &str) {
    use flotilla::ractor::{ActorRef, call_t};
    use flotilla_testkit::probe::{ECHO, EchoMsg, NoArgs, Payload, Tally};

    let echo: ActorRef<EchoMsg> = node
        .spawn_on(worker, ECHO.named(name), &NoArgs, Duration::from_secs(15))
        .await
        .unwrap();
    let sizes = [1 << 20, 300 << 10, 16, (2 << 20) + 7, 100];
    let mut expected = Tally::default();
    let mut large = 0;
    let outbound = node.outbound();
    let before = outbound.bulk_bytes();
    for (i, size) in sizes.into_iter().enumerate() {
        let payload: Vec<u8> = (0..size).map(|k| (k * 31 + i * 7) as u8).collect();
        expected.add(&payload);
        if size >= flotilla::outbound::BULK_THRESHOLD {
            large += size as u64;
        }
        outbound
            .cast(&echo, EchoMsg::Note(Payload(payload)))
            .await
            .unwrap();
    }
    // The two lanes are not ordered with each other: wait for both.
    let start = Instant::now();
    loop {
        let tally = call_t!(echo, EchoMsg::Tally, 5_000).unwrap();
        if tally == expected {
            break;
        }
        assert!(
            tally.notes < expected.notes && start.elapsed() < Duration::from_secs(10),
            "{name}: got {tally:?}, sent {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let on_bulk = outbound.bulk_bytes() - before;
    assert!(
        on_bulk >= large,
        "{on_bulk} bytes went on the bulk lane, {large} in large payloads"
    );
}

/// Clause "delivery: large messages": casts of 256 KiB or more travel on
/// each member's bulk lane (its second endpoint, advertised in the member
/// table) and arrive intact; a member restarted after `kill -9` gets them
/// on its new lane.
#[test]
fn large_casts_travel_on_the_bulk_lane_intact() {
    let s = Scratch::new("bulk", NODE);
    let (head, mut workers) = cluster(&s, &["w1"]);
    let st = s.status(head.addr).unwrap();
    for n in st["nodes"].as_array().unwrap() {
        let addr: std::net::SocketAddr = n["addr"].as_str().unwrap().parse().unwrap();
        let bulk: std::net::SocketAddr = n["bulk_addr"].as_str().unwrap().parse().unwrap();
        assert_eq!(bulk.ip(), addr.ip(), "{}", n["name"]);
        assert_ne!(bulk.port(), addr.port(), "{}", n["name"]);
    }
    runtime().block_on(async {
        let node = join_in_process(&s, "t2", head.addr).await;
        bulk_round(&node, "w1", "echo-1").await;

        workers[0].signal("-KILL");
        node.wait_members(Duration::from_secs(10), |t| {
            t.get("w1")
                .is_some_and(|m| m.state != flotilla::MemberState::Up)
        })
        .await
        .expect("w1 seen down");
        workers[0] = s.spawn("join", "w1", free_addr(), Some(head.addr), &s.certs());
        node.wait_members(Duration::from_secs(15), |t| {
            t.get("w1")
                .is_some_and(|m| m.state == flotilla::MemberState::Up)
        })
        .await
        .expect("w1 back up");
        bulk_round(&node, "w1", "echo-2").await;
        node.shutdown().await;
    });
}

/// Clause "wire: malformed input": garbage, an oversized length prefix, a
/// truncated frame or an invalid archive closes that connection, on the
/// cluster endpoint and on the bulk lane; the node keeps serving everyone
/// else.
#[test]
fn malformed_frames_close_only_the_offending_connection() {
    let s = Scratch::new("garbage", NODE);
    let (head, _workers) = cluster(&s, &["w1"]);
    s.issue("prober");
    let mut invalid_archive = 16u32.to_be_bytes().to_vec();
    invalid_archive.extend([0xff; 16]);
    let mut truncated = 100u32.to_be_bytes().to_vec();
    truncated.extend([0u8; 10]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("oversized length prefix", u32::MAX.to_be_bytes().to_vec()),
        ("invalid archive", invalid_archive),
        ("truncated frame", truncated),
    ];
    // The same on the bulk lane, where a stream of any other kind is
    // malformed too.
    let bulk_addr: std::net::SocketAddr = s.status(head.addr).unwrap()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "head")
        .unwrap()["bulk_addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut targets: Vec<_> = cases
        .iter()
        .map(|(what, bytes)| (head.addr, what.to_string(), bytes.clone(), None))
        .collect();
    targets.extend(
        cases
            .iter()
            .map(|(what, bytes)| (bulk_addr, format!("bulk lane: {what}"), bytes.clone(), None)),
    );
    let mut bad_bulk_frame = 16u32.to_be_bytes().to_vec();
    bad_bulk_frame.extend([0xff; 16]);
    targets.push((
        bulk_addr,
        "bulk lane: invalid bulk header after a good hello".into(),
        bad_bulk_frame,
        Some(Purpose::Bulk),
    ));
    // A stream on the wrong endpoint is refused, with the reason.
    targets.push((
        bulk_addr,
        "bulk lane: a cluster stream".into(),
        Vec::new(),
        Some(Purpose::Cluster),
    ));
    targets.push((
        head.addr,
        "a bulk stream on the cluster endpoint".into(),
        Vec::new(),
        Some(Purpose::Bulk),
    ));
    runtime().block_on(async {
        // Bulk streams are for members: the prober joins, then speaks as
        // itself from an endpoint of its own.
        let member = join_in_process(&s, "prober", head.addr).await;
        let incarnation = member.incarnation();
        let id = flotilla_transport::Identity::load(&s.certs(), "prober").unwrap();
        let cookie = flotilla_transport::certs::cookie_digest(id.cookie.as_deref().unwrap());
        let ep = flotilla_transport::Endpoint::client(id, &flotilla_transport::Tuning::default())
            .unwrap();
        for (addr, what, bytes, hello) in targets {
            let pc = ep.connect(addr, None).await.unwrap();
            let mut send = match hello {
                None => pc.connection.open_bi().await.unwrap().0,
                Some(purpose) => {
                    let hello =
                        flotilla_proto::hello::Hello::new(purpose, "prober", incarnation, cookie);
                    let dialled = flotilla_transport::handshake::dial(&pc.connection, &hello).await;
                    let belongs = (purpose == Purpose::Bulk) == (addr == bulk_addr);
                    match dialled {
                        Ok((send, ..)) if belongs => send,
                        Err(flotilla_transport::StreamError::Refused(
                            flotilla_proto::hello::Refusal::WrongEndpoint,
                        )) if !belongs => pc.connection.open_bi().await.unwrap().0,
                        other => panic!("{what}: hello answered {other:?}"),
                    }
                }
            };
            send.write_all(&bytes).await.unwrap();
            send.finish().unwrap();
            let closed = tokio::time::timeout(Duration::from_secs(5), pc.connection.closed())
                .await
                .unwrap_or_else(|_| panic!("{what}: connection left open"));
            assert!(
                matches!(closed, quinn::ConnectionError::ApplicationClosed(_)),
                "{what}: closed with {closed:?}"
            );
        }
        member.shutdown().await;
    });
    let st = s.status(head.addr).expect("head still answers");
    assert!(all_up(&st, &["head", "w1"]));
}

/// Clause "membership: joining": a node whose head does not answer exits
/// non-zero, saying why, within its join timeout.
#[test]
fn join_with_unreachable_head_fails_with_a_message() {
    let s = Scratch::new("unreachable", NODE);
    s.issue("w1");
    let nobody = free_addr();
    let start = Instant::now();
    let out = Command::new(NODE)
        .args(["join", "--name", "w1", "--listen", &free_addr().to_string()])
        .args(["--head", &nobody.to_string(), "--join-timeout-ms", "1500"])
        .args(["--certs", s.certs().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "exit code for a failed join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("NODE-JOIN-001") && stderr.contains(&nobody.to_string()),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

/// Clause "security: identity": a bad configuration is refused at start-up
/// with a stable code and exit code 2.
#[test]
fn missing_certificates_fail_at_start_with_exit_code_2() {
    let s = Scratch::new("nocerts", NODE);
    let out = Command::new(NODE)
        .args([
            "head",
            "--name",
            "head",
            "--listen",
            &free_addr().to_string(),
        ])
        .args(["--certs", s.dir.join("absent").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NODE-CERT-001"));
    let out = Command::new(NODE)
        .args(["join", "--name", "w1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NODE-CONFIG-003"));
}

/// A head and a worker `w2` serving its metrics, both seen up; the head,
/// the worker and where the worker's metrics are served.
fn head_and_metered_worker(s: &Scratch) -> (Proc, Proc, std::net::SocketAddr) {
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    let (w2, metrics) = s.spawn_metered("join", "w2", Some(head.addr), &[]);
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w2"]))
    });
    (head, w2, metrics)
}

/// Clause "security: cookie": a node presenting another cluster cookie is
/// refused, says why, and the head counts the refusal on `/metrics`.
#[test]
fn a_node_with_another_cookie_is_refused_and_counted() {
    let s = Scratch::new("cookie", NODE);
    s.issue("w1");
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head"]))
    });
    let out = Command::new(NODE)
        .args(["join", "--name", "w1", "--listen", &free_addr().to_string()])
        .args([
            "--head",
            &head.addr.to_string(),
            "--join-timeout-ms",
            "2000",
        ])
        .args(["--certs", s.certs().to_str().unwrap()])
        .args(["--cookie", "not-the-cluster-cookie"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "exit code for a refused join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NODE-AUTH-005"), "{stderr}");
    let (refused, _) = eventually(Duration::from_secs(5), || {
        scrape(metrics)
            .map(|m| counter(&m, "flotilla_hello_refused_total{reason=\"cookie\"}"))
            .filter(|n| *n >= 1)
    });
    assert!(refused >= 1);
    // The folder's own cookie still joins.
    let _w1 = s.spawn("join", "w1", free_addr(), Some(head.addr), &s.certs());
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w1"]))
    });
}

/// Clauses "membership: incarnations" and "security: fencing": a worker
/// frozen with SIGSTOP past `down_after` is marked down; after SIGCONT it
/// is up again only as a new, larger incarnation, and a stream opened with
/// the old incarnation is refused (and counted).
#[test]
fn a_frozen_worker_returns_only_as_a_newer_incarnation() {
    let s = Scratch::new("frozen", NODE);
    s.issue("w1");
    let fast = ["--heartbeat-ms", "200", "--down-after-ms", "1000"];
    let (head, metrics) = s.spawn_metered("head", "head", None, &fast);
    let w1 = s.spawn_with("join", "w1", free_addr(), Some(head.addr), &fast[..2]);
    let (st, _) = eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    let old = incarnation_of(&st, "w1").unwrap();

    w1.signal("-STOP");
    eventually(Duration::from_secs(10), || {
        s.status(head.addr)
            .filter(|st| state_of(st, "w1").as_deref() == Some("down"))
    });
    w1.signal("-CONT");
    let (st, _) = eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| {
            state_of(st, "w1").as_deref() == Some("up")
                && incarnation_of(st, "w1").is_some_and(|i| i != old)
        })
    });
    let new = incarnation_of(&st, "w1").unwrap();
    assert!(new > old, "rejoined as {new}, was {old}");

    // Nothing of the old incarnation is accepted: a stream that presents
    // it (with w1's own certificate and cookie) is refused.
    runtime().block_on(async {
        let id = flotilla_transport::Identity::load(&s.certs(), "w1").unwrap();
        let cookie = flotilla_transport::certs::cookie_digest(id.cookie.as_deref().unwrap());
        let ep = flotilla_transport::Endpoint::client(id, &flotilla_transport::Tuning::default())
            .unwrap();
        for purpose in [Purpose::Cluster, Purpose::Control] {
            let pc = ep.connect(head.addr, None).await.unwrap();
            let hello = flotilla_proto::hello::Hello::new(purpose, "w1", old, cookie);
            match flotilla_transport::handshake::dial(&pc.connection, &hello).await {
                Err(flotilla_transport::StreamError::Refused(
                    flotilla_proto::hello::Refusal::OldIncarnation,
                )) => {}
                other => panic!("{purpose:?} stream of the old incarnation: {other:?}"),
            }
        }
    });
    let m = scrape(metrics).unwrap();
    assert!(
        counter(
            &m,
            "flotilla_hello_refused_total{reason=\"old_incarnation\"}"
        ) >= 2,
        "{m}"
    );
}

/// Clause "security: authority": a node's spawner is reachable from no
/// other node (it is in no process group), so no member can tell it who is
/// up, and a member that joins the process group another node's spawner
/// was once found by captures no spawn request: spawns go on a control
/// stream to the node itself.
#[test]
fn no_node_reaches_another_nodes_spawner_nor_captures_its_spawns() {
    use flotilla::ractor::{ActorRef, call_t};
    use flotilla_testkit::probe::{ECHO, EchoMsg, NoArgs, Payload};

    let s = Scratch::new("forged", NODE);
    let (head, _w2, _metrics) = head_and_metered_worker(&s);
    runtime().block_on(async {
        let node = join_in_process(&s, "t3", head.addr).await;
        let rogue = join_in_process(&s, "t5", head.addr).await;
        assert!(node.wait_session("w2", Duration::from_secs(15)).await);
        // The rogue poses as w2's spawner: an actor of its own in the group
        // a spawner used to be found by, which counts what it is sent.
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let (pose, _) =
            flotilla::ractor::Actor::spawn(None, flotilla_testkit::probe::Recorder, seen_tx)
                .await
                .unwrap();
        flotilla::ractor::pg::join("flotilla.spawner.w2".to_owned(), vec![pose.get_cell()]);
        let echo: ActorRef<EchoMsg> = node
            .spawn_on(
                "w2",
                ECHO.named("echo-forged"),
                &NoArgs,
                Duration::from_secs(15),
            )
            .await
            .unwrap();
        let on_w2 = node.lookup_on::<EchoMsg>("w2", "echo-forged");
        assert!(on_w2.is_ok(), "the actor runs on w2: {on_w2:?}");
        let reply = call_t!(echo, EchoMsg::Echo, 2_000, Payload(b"still".to_vec())).unwrap();
        assert_eq!(reply, Payload(b"still".to_vec()));
        assert!(seen_rx.try_recv().is_err(), "the pose received nothing");
        // No spawner of another node is visible from here: nothing of w2's
        // or the head's is in the group but the pose (reflected back).
        for (on, group) in [
            ("w2", "flotilla.spawner.w2"),
            ("head", "flotilla.spawner.head"),
        ] {
            let found = node.lookup_on::<EchoMsg>(on, group);
            assert!(
                matches!(found, Err(flotilla::LookupError::NotFound(_))),
                "{on}: {found:?}"
            );
        }
        pose.stop(None);
        rogue.shutdown().await;
        node.shutdown().await;
    });
}

/// Clause "lookup: per node": nodes of one process share ractor's process
/// groups, and ractor_cluster numbers each node's sessions from zero, so
/// two of them can hold references to one remote actor under the same id.
/// Another node of the process stopping takes nothing from a node: the
/// actor it spawned stays visible to it and answers its calls.
#[test]
fn a_nodes_remote_actor_stays_visible_when_another_node_of_its_process_stops() {
    use flotilla::ractor::{ActorRef, call_t};
    use flotilla_testkit::probe::{ECHO, EchoMsg, NoArgs, Payload};

    let s = Scratch::new("shared-ids", NODE);
    let (head, _w2, _metrics) = head_and_metered_worker(&s);
    runtime().block_on(async {
        let node = join_in_process(&s, "t3", head.addr).await;
        let echo: ActorRef<EchoMsg> = node
            .spawn_on(
                "w2",
                ECHO.named("echo-kept"),
                &NoArgs,
                Duration::from_secs(15),
            )
            .await
            .unwrap();
        // Whether the two nodes' references share an id depends on the
        // order their sessions opened in: go on until it happened twice.
        let (mut same_id, mut round) = (0, 0);
        while same_id < 2 && round < 12 {
            round += 1;
            let other = join_in_process(&s, &format!("t5{round}"), head.addr).await;
            let seen = other
                .wait_actor::<EchoMsg>("echo-kept", Duration::from_secs(10))
                .await
                .expect("the other node sees the actor too");
            if seen.get_id() == echo.get_id() {
                same_id += 1;
            }
            other.shutdown().await;
            let until = Instant::now() + Duration::from_secs(10);
            while seen.get_status() != flotilla::ractor::ActorStatus::Stopped
                && Instant::now() < until
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let found = node.lookup_on::<EchoMsg>("w2", "echo-kept");
            assert!(found.is_ok(), "round {round}: {found:?}");
            let reply = call_t!(
                found.unwrap(),
                EchoMsg::Echo,
                2_000,
                Payload(b"kept".to_vec())
            )
            .unwrap();
            assert_eq!(reply, Payload(b"kept".to_vec()));
        }
        assert!(
            same_id > 0,
            "in {round} rounds the nodes' references never shared an id: nothing was tested"
        );
        node.shutdown().await;
    });
}

/// Clauses "remote spawn: stop", "security: authority" and "lookup:
/// typed": a node that neither owns an actor nor is the head cannot stop
/// it (refused and counted on the actor's node); its owner can; a lookup
/// or spawn with another message type fails with a typed error.
#[test]
fn only_the_owner_or_the_head_stops_a_remote_actor() {
    use flotilla::ractor::{ActorRef, call_t};
    use flotilla_proto::control::StopOutcome;
    use flotilla_testkit::probe::{ECHO, EchoMsg, NoArgs, Payload};

    let s = Scratch::new("stop", NODE);
    let (head, _w2, metrics) = head_and_metered_worker(&s);
    runtime().block_on(async {
        let owner = join_in_process(&s, "t4", head.addr).await;
        let other = join_in_process(&s, "t5", head.addr).await;
        let budget = Duration::from_secs(15);
        let echo: ActorRef<EchoMsg> = owner
            .spawn_on("w2", ECHO.named("echo-owned"), &NoArgs, budget)
            .await
            .unwrap();
        // Clause "lookup: typed": asking for another message type fails
        // with the typed error, for a lookup and for a spawn.
        use flotilla_testkit::probe::RelayMsg;
        // The actor's process groups reach `other` over its session with
        // w2, a moment after the spawn.
        let mut wrong = other.lookup::<RelayMsg>("echo-owned");
        let seen = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(wrong, Err(flotilla::LookupError::NotFound(_)))
            && std::time::Instant::now() < seen
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            wrong = other.lookup::<RelayMsg>("echo-owned");
        }
        assert!(
            matches!(&wrong, Err(flotilla::LookupError::WrongType { takes, .. }) if takes.ends_with("EchoMsg")),
            "{wrong:?}"
        );
        // The kind as a program built apart declares it: another message
        // type under the echo's name.
        let apart = flotilla::ActorKind::<RelayMsg, NoArgs>::new(ECHO.name());
        let wrong = owner
            .spawn_on("w2", apart.named("echo-wrong-type"), &NoArgs, budget)
            .await;
        assert!(
            matches!(
                &wrong,
                Err(flotilla::SpawnError::Refused {
                    reply: flotilla::spawner::SpawnReply::WrongMessageType(_),
                    ..
                })
            ),
            "{wrong:?}"
        );
        let refused = other.stop_on("w2", "echo-owned", budget).await;
        assert!(
            matches!(
                refused,
                Err(flotilla::StopError::Refused {
                    outcome: StopOutcome::NotOwner,
                    ..
                })
            ),
            "{refused:?}"
        );
        let reply = call_t!(echo, EchoMsg::Echo, 2_000, Payload(b"alive".to_vec())).unwrap();
        assert_eq!(reply, Payload(b"alive".to_vec()));
        let m = scrape(metrics).unwrap();
        assert_eq!(
            counter(
                &m,
                "flotilla_authority_refused_total{service=\"stop\",reason=\"not_actor_owner\"}"
            ),
            1,
            "{m}"
        );
        owner.stop_on("w2", "echo-owned", budget).await.unwrap();
        eventually(Duration::from_secs(10), || {
            owner.lookup::<EchoMsg>("echo-owned").is_err().then_some(())
        });
        let missing = owner.stop_on("w2", "echo-owned", budget).await;
        assert!(
            matches!(
                missing,
                Err(flotilla::StopError::Refused {
                    outcome: StopOutcome::NoSuchActor,
                    ..
                })
            ),
            "{missing:?}"
        );
        other.shutdown().await;
        owner.shutdown().await;
    });
}

/// Clause "restarts: one copy of a child": a supervised remote child whose
/// proxy ends while its node stays up (the link lost, not the node) is
/// stopped there before it is started again. Once, the restart was
/// refused for the taken name until the restart limit stopped the
/// supervisor; now the restart is counted once, the new copy answers,
/// and the worker hosts one actor, not two.
#[test]
fn a_supervised_remote_child_whose_link_is_lost_is_stopped_before_its_restart() {
    use flotilla::ractor::{Actor, ActorRef, call_t};
    use flotilla::supervisor::{
        Backoff, Child, ChildSpec, Intensity, RemoteChild, Strategy, Supervisor, SupervisorArgs,
        SupervisorEvent, SupervisorSpec,
    };
    use flotilla_testkit::probe::{ECHO, EchoMsg, NoArgs, Payload};
    use std::sync::Arc;

    let s = Scratch::new("one-copy", NODE);
    let (head, _workers) = cluster(&s, &["w1"]);
    runtime().block_on(async {
        let node = Arc::new(join_in_process(&s, "t6", head.addr).await);
        let budget = Duration::from_secs(15);
        let start = RemoteChild::new(
            Arc::clone(&node),
            ECHO.named("echo-supervised"),
            &NoArgs,
            |_: &flotilla::Table| Some(MemberName::from("w1".to_owned())),
            budget,
        );
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let args = SupervisorArgs {
            spec: SupervisorSpec {
                strategy: Strategy::OneForOne,
                intensity: Intensity {
                    max_restarts: 2,
                    within: Duration::from_secs(60),
                },
                per_child: false,
                backoff: Backoff::NONE,
            },
            children: vec![Child::new(ChildSpec::permanent("echo"), start)],
            events: Some(tx),
            members: Some(node.watch_members()),
            seed: node.incarnation().get(),
            report: None,
        };
        let (_supervisor, _) = Actor::spawn(None, Supervisor, args).await.unwrap();
        async fn next(
            events: &mut tokio::sync::mpsc::UnboundedReceiver<SupervisorEvent>,
        ) -> SupervisorEvent {
            tokio::time::timeout(Duration::from_secs(15), events.recv())
                .await
                .expect("an event in time")
                .expect("the supervisor runs")
        }
        let first = match next(&mut events).await {
            SupervisorEvent::Started { running, .. } => running.cell,
            other => panic!("expected the first start, got {other:?}"),
        };
        // Only this node's proxy of the child ends, as when the link to
        // w1 is lost: the actor itself still runs there.
        first.stop(None);
        match next(&mut events).await {
            SupervisorEvent::Exited {
                restarting: true, ..
            } => {}
            other => panic!("expected the proxy's end as an exit, got {other:?}"),
        }
        let again = match next(&mut events).await {
            SupervisorEvent::Started {
                running, restarts, ..
            } => {
                assert_eq!(restarts, 1, "one restart for one lost link");
                running.cell
            }
            other => panic!("expected the restart, got {other:?}"),
        };
        assert_ne!(first.get_id(), again.get_id());
        let echo: ActorRef<EchoMsg> = again.into();
        let reply = call_t!(echo, EchoMsg::Echo, 5_000, Payload(b"one".to_vec())).unwrap();
        assert_eq!(reply, Payload(b"one".to_vec()));
        // One copy on w1, counted with its next heartbeats.
        let one = node
            .wait_members(Duration::from_secs(5), |t| {
                t.get("w1").is_some_and(|m| m.actors == 1)
            })
            .await;
        assert!(one.is_some(), "w1 hosts one copy: {:?}", node.members());
        assert!(
            events.try_recv().is_err(),
            "no refused start, no escalation"
        );
        node.shutdown().await;
    });
    let w1 = s.log("w1");
    assert!(!w1.contains("already runs there"), "{w1}");
    assert!(w1.contains("stopping an actor on request"), "{w1}");
}

/// Clause "security: authority": the bulk lane delivers only to actors a
/// ractor_cluster session would deliver to. Bulk frames addressed to the
/// worker's first pids (its actor system's own actors, none of them
/// remotely visible) are dropped and counted, and the worker keeps
/// serving.
#[test]
fn bulk_frames_for_actors_that_are_not_remote_are_dropped_and_counted() {
    use flotilla_proto::bulk::BulkHeader;
    use flotilla_proto::frame::{DEFAULT_MAX_FRAME, encode};

    let s = Scratch::new("bulk-visible", NODE);
    s.issue("prober");
    let (head, w2, metrics) = head_and_metered_worker(&s);
    let st = s.status(head.addr).unwrap();
    let bulk_addr: std::net::SocketAddr = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "w2")
        .and_then(|n| n["bulk_addr"].as_str())
        .unwrap()
        .parse()
        .unwrap();
    runtime().block_on(async {
        // Bulk streams are for members: the prober joins, then speaks as
        // itself from an endpoint of its own.
        let member = join_in_process(&s, "prober", head.addr).await;
        let incarnation = member.incarnation();
        let id = flotilla_transport::Identity::load(&s.certs(), "prober").unwrap();
        let cookie = flotilla_transport::certs::cookie_digest(id.cookie.as_deref().unwrap());
        let ep = flotilla_transport::Endpoint::client(id, &flotilla_transport::Tuning::default())
            .unwrap();
        let pc = ep.connect(bulk_addr, None).await.unwrap();
        let hello = flotilla_proto::hello::Hello::new(Purpose::Bulk, "prober", incarnation, cookie);
        let (mut send, ..) = flotilla_transport::handshake::dial(&pc.connection, &hello)
            .await
            .unwrap();
        for pid in 0..8 {
            let header = BulkHeader {
                pid,
                variant: "Note".into(),
            };
            let header = flotilla_proto::wire::encode(&header);
            send.write_all(&encode(&header, DEFAULT_MAX_FRAME).unwrap())
                .await
                .unwrap();
            send.write_all(&encode(b"payload", DEFAULT_MAX_FRAME).unwrap())
                .await
                .unwrap();
        }
        send.finish().unwrap();
        let (dropped, _) = eventually(Duration::from_secs(5), || {
            scrape(metrics)
                .map(|m| {
                    counter(
                        &m,
                        "flotilla_frames_dropped_total{lane=\"bulk\",reason=\"not_remote\"}",
                    )
                })
                .filter(|n| *n >= 1)
        });
        assert!(dropped >= 1);
        member.shutdown().await;
    });
    // The worker still serves.
    assert!(
        s.status(w2.addr)
            .is_some_and(|st| all_up(&st, &["head", "w2"]))
    );
}

/// Clause "systemd: notify and watchdog": a member under a notification
/// socket sends READY=1 once joined, WATCHDOG=1 every third of the
/// watchdog interval while its heartbeat loop runs, and STOPPING=1 on
/// SIGTERM.
#[test]
fn systemd_hears_ready_then_watchdog_feeds_then_stopping() {
    let s = Scratch::new("sd-notify", NODE);
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    s.issue("w1");
    let (socket, env) = notify_socket(&s, "w1", Duration::from_millis(600));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let w1 = heartbeating_w1(&s, &head, &env);
    let got = notifications(&socket, Instant::now() + Duration::from_secs(4));
    let states: Vec<&str> = got.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(states.first(), Some(&"READY=1"), "{states:?}");
    let feeds = states.iter().filter(|m| **m == "WATCHDOG=1").count();
    assert!(feeds >= 12, "fed every 200 ms: {states:?}");
    assert!(
        s.status(head.addr).is_some_and(|st| all_up(&st, &["w1"])),
        "ready means joined"
    );
    w1.signal("-TERM");
    let got = notifications(&socket, Instant::now() + Duration::from_secs(3));
    assert!(got.iter().any(|(_, m)| m == "STOPPING=1"), "{got:?}");
}

/// Starts `w1` joining `head` with a 200 ms heartbeat and `env` (its
/// notify socket, failpoints).
fn heartbeating_w1(s: &Scratch, head: &Proc, env: &[(&str, &str)]) -> Proc {
    s.launch(Launch {
        role: "join",
        name: "w1",
        listen: free_addr(),
        head: Some(head.addr),
        flags: &["--heartbeat-ms", "200"],
        env,
    })
}

/// Clause "systemd: notify and watchdog": while the heartbeat loop is
/// wedged (failpoint `node::heartbeat=pause`, after its first passes), the
/// watchdog is not fed.
#[test]
fn a_wedged_heartbeat_loop_stops_feeding_the_watchdog() {
    let s = Scratch::new("sd-watchdog", NODE);
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    s.issue("w1");
    let (socket, env) = notify_socket(&s, "w1", Duration::from_millis(600));
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.push(("FLOTILLA_FAILPOINTS", "node::heartbeat=6*off->pause"));
    let _w1 = heartbeating_w1(&s, &head, &env);
    let got = notifications(&socket, Instant::now() + Duration::from_secs(6));
    let feeds: Vec<Instant> = got
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect();
    assert!(got.iter().any(|(_, m)| m == "READY=1"), "{got:?}");
    assert!(!feeds.is_empty(), "fed while the loop ran: {got:?}");
    let last = *feeds.last().unwrap();
    assert!(
        last.elapsed() >= Duration::from_secs(3),
        "no feed in the last 3 s of the pause: {got:?}"
    );
}

/// Clauses "supervision: trees in config" and "supervision: restart
/// elsewhere from a checkpoint": node `sup` declares in its node.toml a
/// supervisor whose permanent child, a checkpointing ticker, may run on w1
/// or w2. It starts on w1 (node status lists it there); w1 is frozen, its
/// newest snapshot corrupted, then it is killed with kill -9. Within
/// down_after + 3 s of going silent the child runs on w2, which skipped the
/// corrupt snapshot and restored the one before it.
#[test]
fn a_configured_child_is_restarted_on_another_node_from_its_previous_snapshot() {
    let s = Scratch::new("tree", NODE);
    let fast = ["--heartbeat-ms", "500", "--down-after-ms", "2000"];
    let down_after = Duration::from_secs(2);
    s.issue("head");
    let head = s.spawn_with("head", "head", free_addr(), None, &fast);
    let mut workers = Vec::new();
    for w in ["w1", "w2"] {
        s.issue(w);
        workers.push(s.spawn_with("join", w, free_addr(), Some(head.addr), &fast));
    }
    // The child goes to the first of its nodes that is up when the
    // supervisor starts: both workers must be up before it does, or a slow
    // join of w1 sends it to w2.
    eventually(Duration::from_secs(20), || {
        s.status(head.addr)
            .filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    let config = ticker_tree(&s);
    let ckpt = s.dir.join("ckpt");
    s.issue("sup");
    let mut args = fast.to_vec();
    args.extend(["--config", config.to_str().unwrap()]);
    let _sup = s.spawn_with("join", "sup", free_addr(), Some(head.addr), &args);
    let (st, _) = eventually(Duration::from_secs(30), || {
        s.status_with_supervisors(head.addr).filter(|st| {
            supervisor_of(st, "sup", "tickers").is_some_and(|t| {
                t["children"][0]["node"] == "w1" && t["children"][0]["running"] == true
            })
        })
    });
    assert_eq!(
        supervisor_of(&st, "sup", "tickers").unwrap()["strategy"],
        "one_for_one"
    );
    // Snapshots by name (`EPOCH-SEQUENCE.ckpt`, zero-padded: the names
    // sort as the snapshots do) and sequence.
    let snapshots = |dir: &std::path::Path| -> Vec<(String, u64)> {
        let mut found: Vec<(String, u64)> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| {
                    let name = e.ok()?.file_name().to_str()?.to_owned();
                    let stem = name.strip_suffix(".ckpt")?;
                    let seq = stem.rsplit('-').next()?.parse().ok()?;
                    Some((name, seq))
                })
                .collect()
            })
            .unwrap_or_default();
        found.sort_unstable();
        found
    };
    // Fenced by the supervisor's starts: under its certificate's folder.
    let folder = ckpt.join("@sup").join("ticker-1");
    eventually(Duration::from_secs(20), || {
        (snapshots(&folder).len() >= 3).then_some(())
    });

    // Freeze w1, corrupt its newest snapshot, kill it.
    let w1 = workers.remove(0);
    w1.signal("-STOP");
    let silent = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    let seqs = snapshots(&folder);
    let ((newest_name, newest), (_, previous)) =
        (seqs[seqs.len() - 1].clone(), seqs[seqs.len() - 2].clone());
    let path = folder.join(&newest_name);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    w1.signal("-KILL");
    drop(w1);

    let (st, _) = eventually(Duration::from_secs(20), || {
        s.status_with_supervisors(head.addr).filter(|st| {
            supervisor_of(st, "sup", "tickers").is_some_and(|t| {
                t["children"][0]["node"] == "w2" && t["children"][0]["running"] == true
            })
        })
    });
    let took = silent.elapsed();
    let child = &supervisor_of(&st, "sup", "tickers").unwrap()["children"][0];
    assert_eq!(child["restarts"], 1, "{st}");
    let w2_log = std::fs::read_to_string(s.dir.join("w2.log")).unwrap();
    assert!(
        w2_log.contains("NODE-CKPT-002"),
        "the corrupt snapshot was skipped: {w2_log}"
    );
    assert!(
        w2_log.contains(&format!("count={previous}")) && w2_log.contains("ticker restored"),
        "restored {previous}, the snapshot before the corrupt {newest}: {w2_log}"
    );
    // Counted from when w1 went silent to when node status showed it.
    eprintln!("restarted on w2, seen {took:?} after w1 went silent");
    assert!(
        took <= down_after + Duration::from_secs(3),
        "restarted {took:?} after w1 went silent"
    );
}

/// Clause "membership: resources": a node offers what it declares
/// (`--resource`, replacing detection, fractions for custom names), a head
/// offers nothing unless it declares something, `node status` shows both,
/// and a declaration that cannot hold stops the node with a configuration
/// error.
#[test]
fn declared_resources_are_what_a_node_offers() {
    let s = Scratch::new("resources", NODE);
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    s.issue("w1");
    let declared = [
        "--resource",
        "cpu=2",
        "--resource",
        "ssd=1.5",
        "--resource",
        "memory_mb=512",
    ];
    let _w1 = s.spawn_with("join", "w1", free_addr(), Some(head.addr), &declared);
    let (st, _) = eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    let node = |name: &str| {
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap()["resources"]
            .clone()
    };
    let w1 = node("w1");
    assert_eq!(w1["cpus"], 2, "{w1}");
    assert_eq!(w1["memory_bytes"], 512u64 << 20, "{w1}");
    assert_eq!(w1["custom"]["ssd"], 1.5, "{w1}");
    let h = node("head");
    assert_eq!(
        (h["cpus"].as_u64(), h["gpus"].as_u64()),
        (Some(0), Some(0)),
        "{h}"
    );
    s.issue("bad");
    let out = Command::new(NODE)
        .args([
            "join",
            "--name",
            "bad",
            "--listen",
            &free_addr().to_string(),
        ])
        .args([
            "--head",
            &head.addr.to_string(),
            "--certs",
            s.certs().to_str().unwrap(),
        ])
        .args(["--resource", "gpu=0.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu is a whole number"), "{err}");
}

/// A node's GPUs and the actors holding them: a node declaring two GPUs
/// hands them out least-held first, `node status` lists each GPU with its
/// holders (JSON and text), and a slot given back shows as free.
#[test]
fn node_status_lists_which_actor_holds_which_gpu() {
    let s = Scratch::new("gpus", NODE);
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    runtime().block_on(async {
        s.issue("g1");
        let mut config = flotilla::NodeConfig::new("g1", free_addr(), s.certs()).join(head.addr);
        config.declared.insert("gpu".into(), 2.0);
        let builder = flotilla::Node::builder(config);
        let slots = builder.gpu_slots();
        let node = builder.start().await.unwrap();
        let a = slots.take("flotilla.embedder e1").unwrap();
        let b = slots.take("flotilla.embedder e2").unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));

        let holders = |st: &serde_json::Value, gpu: usize| -> Option<Vec<String>> {
            let list = node_of(st, "g1")?["gpus"].as_array()?;
            let g = list.iter().find(|g| g["index"] == gpu)?;
            Some(
                g["holders"]
                    .as_array()?
                    .iter()
                    .map(|h| h.as_str().unwrap().to_owned())
                    .collect(),
            )
        };
        let (st, _) = eventually(Duration::from_secs(20), || {
            s.status(head.addr).filter(|st| holders(st, 1).is_some())
        });
        assert_eq!(holders(&st, 0).unwrap(), ["flotilla.embedder e1"], "{st}");
        assert_eq!(holders(&st, 1).unwrap(), ["flotilla.embedder e2"], "{st}");

        drop(a);
        let st = s.status(head.addr).unwrap();
        assert_eq!(holders(&st, 0).unwrap(), Vec::<String>::new(), "{st}");
        let text = Command::new(NODE)
            .args([
                "status",
                "--no-supervisors",
                "--head",
                &head.addr.to_string(),
            ])
            .args(["--certs", s.certs().to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("g1: gpu 0   (free)"), "{text}");
        assert!(text.contains("g1: gpu 1   flotilla.embedder e2"), "{text}");
        drop(b);
        node.shutdown().await;
    });
}

/// Clause "membership: clean stop", for a node shared in an `Arc`: while
/// another task still holds the node, `shutdown` leaves the cluster all
/// the same (the member is `left`, never `down`), where it used to need
/// the only reference and the `node` binary skipped the clean leave.
#[test]
fn a_node_still_held_by_a_task_leaves_cleanly_on_shutdown() {
    let s = Scratch::new("held", NODE);
    s.issue("head");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    runtime().block_on(async {
        let node = std::sync::Arc::new(join_in_process(&s, "h1", head.addr).await);
        eventually(Duration::from_secs(20), || {
            s.status(head.addr).filter(|st| all_up(st, &["head", "h1"]))
        });
        let holder = std::sync::Arc::clone(&node);
        let held = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(holder);
        });
        node.shutdown().await;
        assert_eq!(std::sync::Arc::strong_count(&node), 2, "still shared");
        held.abort();
    });
    let (_, took) = eventually(Duration::from_secs(5), || {
        s.status(head.addr)
            .filter(|st| state_of(st, "h1").as_deref() == Some("left"))
    });
    assert!(took < Duration::from_secs(4), "left after {took:?}");
}

/// A driver node in this process, with nothing to offer, joined to `head`.
async fn driver_in_process(s: &Scratch, name: &str, head: std::net::SocketAddr) -> flotilla::Node {
    s.issue_role(name, "driver");
    let mut config = flotilla::NodeConfig::new(name, free_addr(), s.certs()).join(head);
    config.resources = Some(flotilla::Resources::default());
    flotilla::Node::builder(config).start().await.unwrap()
}

/// The group `id` as `node` sees it once `done` holds of it, asking again
/// (through the head's absence) for up to `budget`.
async fn group_when(
    node: &flotilla::Node,
    id: &GroupId,
    budget: Duration,
    done: impl Fn(&Option<flotilla::placement_groups::GroupView>) -> bool,
) -> Option<flotilla::placement_groups::GroupView> {
    let until = Instant::now() + budget;
    loop {
        let seen = node.group(id).await;
        match seen {
            Ok(v) if done(&v) => return v,
            _ if Instant::now() > until => panic!("group {id}: still {seen:?} after {budget:?}"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Clause "head: placement groups on disk": a head killed with SIGKILL and
/// started again on its state directory takes its groups back. A ready
/// group keeps its bundle where it was (same node, same revision: nothing
/// placed anew); a pending group is pending under the same id and is placed
/// when a node with what it needs joins; the group of a driver that went
/// away while the head was down is removed once the confirmation grace
/// passes without it, and its bundle released on its node.
#[test]
fn placement_groups_survive_the_heads_sigkill_and_restart() {
    use flotilla::placement_groups::{GroupSpec, GroupState, Strategy, bundle};

    let s = Scratch::new("groups-head-restart", NODE);
    s.issue("head");
    let state = s.dir.join("head-state");
    std::fs::create_dir_all(&state).unwrap();
    let state_flag = ["--state-dir", state.to_str().unwrap()];
    let head_addr = free_addr();
    let mut head = s.spawn_with("head", "head", head_addr, None, &state_flag);
    s.issue("w1");
    let _w1 = s.spawn_with(
        "join",
        "w1",
        free_addr(),
        Some(head_addr),
        &["--resource", "cpu=2"],
    );
    eventually(Duration::from_secs(20), || {
        s.status(head_addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    runtime().block_on(async {
        let budget = Duration::from_secs(30);
        let d1 = driver_in_process(&s, "d1", head_addr).await;
        let d2 = driver_in_process(&s, "d2", head_addr).await;
        let ready = d1
            .create_group(GroupSpec::new(
                Strategy::Spread,
                vec![bundle(&[("cpu", 1.0)])],
            ))
            .await
            .unwrap();
        let before = d1.wait_group(&ready, budget).await.unwrap();
        assert_eq!(before.nodes, vec!["w1"]);
        let pending = d1
            .create_group(
                GroupSpec::new(Strategy::Pack, vec![bundle(&[("slot", 1.0)])])
                    .with_timeout(Duration::from_secs(600)),
            )
            .await
            .unwrap();
        let orphan = d2
            .create_group(GroupSpec::new(
                Strategy::Pack,
                vec![bundle(&[("cpu", 0.5)])],
            ))
            .await
            .unwrap();
        d2.wait_group(&orphan, budget).await.unwrap();
        assert_eq!(
            d1.group(&pending).await.unwrap().map(|v| v.state),
            Some(GroupState::Pending)
        );

        head.signal("-KILL");
        let _ = head.child.wait();
        // d2 goes away while the head is down, never to come back.
        d2.shutdown().await;
        let head = s.spawn_with("head", "head", head_addr, None, &state_flag);

        let after = group_when(&d1, &ready, budget, |v| {
            v.as_ref().is_some_and(|v| v.state == GroupState::Ready)
        })
        .await
        .unwrap();
        assert_eq!(
            (&after.nodes, after.revision),
            (&before.nodes, before.revision),
            "kept where it was, not placed anew"
        );
        let waiting = d1.group(&pending).await.unwrap().unwrap();
        assert_eq!(waiting.state, GroupState::Pending, "{waiting:?}");
        group_when(&d1, &orphan, budget, Option::is_none).await;
        let (_, accounts) = d1.groups().await.unwrap();
        let w1 = accounts.iter().find(|a| a.name == "w1").unwrap();
        assert_eq!(w1.reserved.get("cpu"), Some(&1.0), "{accounts:?}");

        s.issue("w2");
        let _w2 = s.spawn_with(
            "join",
            "w2",
            free_addr(),
            Some(head.addr),
            &["--resource", "slot=1"],
        );
        let placed = d1.wait_group(&pending, budget).await.unwrap();
        assert_eq!(placed.nodes, vec!["w2"], "{placed:?}");
        let log = s.log("head");
        assert!(
            log.contains("placement group taken back from the store"),
            "{log}"
        );
        drop(head);
    });
}

/// Clause "head: a standby answers nobody": a head of a head set whose
/// lease store cannot be reached waits as a standby (`/metrics` says so,
/// `node status` gets no answer from it) and stops cleanly on SIGTERM; a
/// lease store URL that names no store stops the head at start with exit
/// code 2, naming it.
#[test]
fn a_head_that_cannot_reach_its_lease_store_waits_as_a_standby() {
    let s = Scratch::new("standby-unreachable", NODE);
    s.issue("head");
    let metrics = flotilla_testkit::ca::free_tcp_addr();
    let closed = flotilla_testkit::ca::free_tcp_addr();
    let endpoint = format!("http://{closed}");
    let env = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let addr = free_addr();
    let metrics_flag = metrics.to_string();
    let mut standby = s.launch(Launch {
        role: "head",
        name: "head",
        listen: addr,
        head: None,
        flags: &[
            "--lease-store",
            "s3://heads/set",
            "--metrics-listen",
            &metrics_flag,
        ],
        env: &env,
    });
    eventually(Duration::from_secs(20), || {
        let scraped = scrape(metrics)?;
        (gauge(&scraped, "flotilla_head_role{role=\"standby\"}")? == 1.0).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let scraped = scrape(metrics).unwrap();
    assert_ne!(
        gauge(&scraped, "flotilla_head_role{role=\"primary\"}"),
        Some(1.0),
        "{scraped}"
    );
    assert!(s.status(addr).is_none(), "a standby answers nobody");
    assert!(
        s.log("head").contains("NODE-LEASE-001"),
        "{}",
        s.log("head")
    );
    standby.signal("-TERM");
    assert_eq!(standby.exit_within(Duration::from_secs(10)).code(), Some(0));

    let mut bad = s.spawn_with(
        "head",
        "head",
        free_addr(),
        None,
        &["--lease-store", "nope://heads/set"],
    );
    assert_eq!(bad.exit_within(Duration::from_secs(10)).code(), Some(2));
    assert!(
        s.log("head").contains("NODE-LEASE-006"),
        "{}",
        s.log("head")
    );
}

/// The actors `name` runs, as the head at `head` shows them.
fn actors_on(s: &Scratch, head: std::net::SocketAddr, name: &str) -> Option<u64> {
    node_of(&s.status(head)?, name)?["actors"].as_u64()
}

/// Clause "jobs: no job ends while its actor runs on": a detached job
/// whose supervisor gives up while its actor still runs on an up node
/// (the head's link to it lost, not the node) is marked failed and its
/// actor is stopped there, not left writing for a job that has ended.
#[test]
fn a_detached_job_marked_failed_does_not_leave_its_actor_running() {
    use flotilla::jobs::{JobSpec, JobState};
    use flotilla_testkit::probe::{ECHO, EchoMsg, NoArgs};
    use std::sync::Arc;

    let s = Scratch::new("job-left", NODE);
    s.issue("w1");
    runtime().block_on(async {
        let mut config = flotilla::NodeConfig::new("head", free_addr(), s.certs());
        // Nothing is placed on the head: the job's actor runs on w1.
        config.resources = Some(flotilla::Resources::default());
        let head = Arc::new(flotilla::Node::builder(config).start().await.unwrap());
        let _jobs = head.serve_jobs().unwrap();
        let _w1 = s.spawn("join", "w1", free_addr(), Some(head.addr()), &s.certs());
        eventually(Duration::from_secs(20), || {
            s.status(head.addr())
                .filter(|st| all_up(st, &["head", "w1"]))
        });
        let spec = JobSpec {
            kind: ECHO.name().into(),
            args: flotilla::wire::encode(&NoArgs),
            message_type: std::any::type_name::<EchoMsg>().into(),
            resources: [("cpu".to_owned(), 0.5)].into_iter().collect(),
            description: "an echo as a job".into(),
            max_restarts: 0,
        };
        let id = head.submit_job(spec).await.unwrap();
        let (group, _) = eventually(Duration::from_secs(20), || {
            flotilla::ractor::pg::which_groups()
                .into_iter()
                .find(|g| g.starts_with(&format!("{id}.")))
        });
        eventually(Duration::from_secs(10), || {
            (actors_on(&s, head.addr(), "w1") == Some(1)).then_some(())
        });
        // The head's reference to the job's actor ends, as when its link
        // to w1 is lost: the actor itself still runs there.
        for cell in flotilla::ractor::pg::get_members(&group) {
            if !cell.get_id().is_local() {
                cell.stop(None);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let job = head.job(&id).await.unwrap().expect("the job is listed");
            if job.state == JobState::Failed {
                break;
            }
            assert!(Instant::now() < deadline, "not failed: {job:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eventually(Duration::from_secs(15), || {
            (actors_on(&s, head.addr(), "w1") == Some(0)).then_some(())
        });
        head.shutdown().await;
    });
}

/// Seconds since midnight (UTC) of `at`.
fn seconds_of_day(at: std::time::SystemTime) -> f64 {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    (since.as_secs() % 86_400) as f64 + f64::from(since.subsec_nanos()) / 1e9
}

/// Seconds since midnight (UTC) of a log line's timestamp
/// (`2026-12-07T19:10:00.123456Z  WARN …`).
fn logged_seconds_of_day(line: &str) -> f64 {
    let stamp = line
        .split_whitespace()
        .next()
        .and_then(|t| t.split_once('T'))
        .map(|(_, time)| time.trim_end_matches('Z'))
        .unwrap_or_else(|| panic!("no timestamp: {line}"));
    let mut parts = stamp.splitn(3, ':');
    let mut next = || -> f64 { parts.next().unwrap().parse().unwrap() };
    next() * 3600.0 + next() * 60.0 + next()
}
