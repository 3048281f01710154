//! A tool's control sessions ([`flotilla::ControlClient`]): requests to a
//! node share one connection, one stream each, and a connection the node
//! closed (it restarted) is dialled again for the next request.

use std::time::Duration;

use flotilla::{ControlClient, MemberState, Node, NodeConfig};
use flotilla_testkit::ca::{free_addr, scratch_certs};

fn all_up(names: &'static [&'static str]) -> impl Fn(&flotilla::Table) -> bool {
    move |t| {
        names
            .iter()
            .all(|n| t.get(n).is_some_and(|m| m.state == MemberState::Up))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_share_a_connection_and_a_restarted_node_is_dialled_again() {
    let certs = scratch_certs("control-client", &["head", "c1"]).unwrap();
    let head = Node::builder(NodeConfig::new("head", free_addr(), &certs))
        .start()
        .await
        .unwrap();
    let c1_addr = free_addr();
    let c1_config = NodeConfig::new("c1", c1_addr, &certs).join(head.addr());
    let c1 = Node::builder(c1_config.clone()).start().await.unwrap();
    head.wait_members(Duration::from_secs(10), all_up(&["head", "c1"]))
        .await
        .expect("both up");

    let admin = flotilla_transport::Identity::load(&certs, "admin").unwrap();
    let client = ControlClient::new(admin).unwrap();
    // Many requests, some at once, to two nodes: two connections.
    for _ in 0..3 {
        let (table, objects, supervisors) = tokio::join!(
            client.status(head.addr()),
            client.objects(c1_addr),
            client.supervisors(c1_addr),
        );
        assert!(table.unwrap().get("c1").is_some());
        objects.unwrap();
        supervisors.unwrap();
    }
    let mut both = vec![head.addr(), c1_addr];
    both.sort();
    assert_eq!(client.connected(), both);

    // c1 restarts at the same address: its old connection is closed, and
    // the next request dials it again.
    c1.shutdown().await;
    drop(c1);
    let c1 = Node::builder(c1_config).start().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let answered = loop {
        match client.objects(c1_addr).await {
            Ok(stats) => break stats,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "the restarted node never answered: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answered.count, 0);
    assert_eq!(client.connected(), both);

    client.close().await;
    assert!(client.connected().is_empty());
    c1.shutdown().await;
    head.shutdown().await;
}

/// A request to an address where no node answers, given up after a
/// second, does not hold up the client's close: `node status` with a
/// member killed a moment ago returned only when that handshake's idle
/// drained (about 3 s), and the cluster tests timing failure detection
/// through it ran late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_does_not_wait_for_a_handshake_with_a_node_that_never_answers() {
    let certs = scratch_certs("control-client-silent", &["head"]).unwrap();
    let admin = flotilla_transport::Identity::load(&certs, "admin").unwrap();
    let client = ControlClient::new(admin).unwrap();
    let silent = free_addr();
    let asked = tokio::time::timeout(Duration::from_secs(1), client.objects(silent)).await;
    assert!(asked.is_err(), "nothing answers at {silent}: {asked:?}");
    let started = std::time::Instant::now();
    client.close().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "close took {:?}",
        started.elapsed()
    );
}
