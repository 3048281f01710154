//! Three nodes in one test process, no lock: a node's state is its own, so
//! a head and two members share a process like any other three nodes.
//!
//! Clause "membership: joining" and "delivery: remote call" of
//! docs/runtime-semantics.md, on the in-process path.

use std::time::Duration;

use flotilla::ractor::{ActorRef, call_t};
use flotilla::{MemberState, Node, NodeConfig};
use flotilla_testkit::ca::{free_addr, scratch_certs};
use flotilla_testkit::probe::{self, ECHO, EchoMsg, NoArgs, Payload, Tally};

async fn start(config: NodeConfig) -> Node {
    probe::register(Node::builder(config))
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_and_two_members_in_one_process_see_each_other_and_call_across() {
    let certs = scratch_certs("in-process", &["head", "n1", "n2"]).unwrap();
    let head = start(NodeConfig::new("head", free_addr(), &certs)).await;
    let n1 = start(NodeConfig::new("n1", free_addr(), &certs).join(head.addr())).await;
    let n2 = start(NodeConfig::new("n2", free_addr(), &certs).join(head.addr())).await;
    let all_up = |t: &flotilla::Table| {
        ["head", "n1", "n2"]
            .iter()
            .all(|n| t.get(n).is_some_and(|m| m.state == MemberState::Up))
    };
    for node in [&head, &n1, &n2] {
        node.wait_members(Duration::from_secs(10), all_up)
            .await
            .unwrap_or_else(|| panic!("{} sees everyone up", node.name()));
    }

    // n1 spawns an echo on n2 and calls it; small and large casts through
    // n1's outbound arrive whole (the large ones on the bulk lane).
    let echo: ActorRef<EchoMsg> = n1
        .spawn_on(
            "n2",
            ECHO.named("echo-n2"),
            &NoArgs,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let reply = call_t!(echo, EchoMsg::Echo, 2_000, Payload(b"ping".to_vec())).unwrap();
    assert_eq!(reply, Payload(b"ping".to_vec()));
    let outbound = n1.outbound();
    let mut expected = Tally::default();
    for size in [64usize, 1 << 20, 300] {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        expected.add(&payload);
        outbound
            .cast(&echo, EchoMsg::Note(Payload(payload)))
            .await
            .unwrap();
    }
    // Sealed payloads, small and on the bulk lane, are read where they
    // land and tallied the same.
    for size in [2usize << 20, 100] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        expected.add(&payload);
        let sealed = flotilla::wire::Sealed::new(&Payload(payload));
        outbound
            .cast(&echo, EchoMsg::SealedNote(sealed))
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let tally = call_t!(echo, EchoMsg::Tally, 2_000).unwrap();
        if tally == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tally:?} of {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        outbound.bulk_bytes() >= 3 << 20,
        "the large cast took the bulk lane"
    );
    assert_eq!(n2.outbound().bulk_bytes(), 0, "each node counts its own");

    // A clean leave is seen as `left` by the others.
    n2.shutdown().await;
    n1.wait_members(Duration::from_secs(5), |t| {
        t.get("n2").is_some_and(|m| m.state == MemberState::Left)
    })
    .await
    .expect("n1 sees n2 left");
    n1.shutdown().await;
    head.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
}
