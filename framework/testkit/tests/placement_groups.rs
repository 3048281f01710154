//! Placement groups on a head and three members in one process, each
//! member offering `cpu=2`: every strategy placed as it promises, an
//! infeasible group failing at its timeout with the shortage named,
//! actors spawned into bundles, reservations released on removal and when
//! the owner goes.
//!
//! Clause "placement" of docs/runtime-semantics.md, on the in-process path.

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla::placement_groups::{BundleRef, GroupSpec, PlacementError, Strategy, bundle};
use flotilla::ractor::{ActorRef, call_t};
use flotilla::{MemberState, Node, NodeConfig};
use flotilla_testkit::ca::{free_addr, scratch_certs};
use flotilla_testkit::probe::{self, ECHO, EchoMsg, NoArgs, Payload};

async fn start(config: NodeConfig) -> Node {
    probe::register(Node::builder(config))
        .start()
        .await
        .unwrap()
}

fn cpus(count: u32, name: &str, certs: &std::path::Path, head: std::net::SocketAddr) -> NodeConfig {
    let mut c = NodeConfig::new(name, free_addr(), certs).join(head);
    c.declared.insert("cpu".into(), f64::from(count));
    c.declared.insert("memory_mb".into(), 0.0);
    c.declared.insert("gpu".into(), 0.0);
    c
}

fn total_reserved(nodes: &[flotilla::placement_groups::NodeAccount]) -> f64 {
    nodes.iter().map(|n| n.reserved.values().sum::<f64>()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_placed_as_their_strategy_promises_and_released() {
    let certs = scratch_certs("placement", &["head", "n1", "n2", "n3"]).unwrap();
    let head = start(NodeConfig::new("head", free_addr(), &certs)).await;
    let wait = Duration::from_secs(10);
    let one_cpu = bundle(&[("cpu", 1.0)]);
    // A SPREAD group created the moment the head sees a new member up uses
    // that member. The head's placement once took such a request before the
    // member table's change that came first, and put two bundles on one
    // node while a third stood idle.
    let mut members = Vec::new();
    for (i, n) in ["n1", "n2", "n3"].into_iter().enumerate() {
        members.push(start(cpus(2, n, &certs, head.addr())).await);
        head.wait_members(wait, |t| {
            t.get(n).is_some_and(|m| m.state == MemberState::Up)
        })
        .await
        .expect("member up");
        let id = head
            .create_group(GroupSpec::new(
                Strategy::Spread,
                vec![one_cpu.clone(); i + 1],
            ))
            .await
            .unwrap();
        let v = head.wait_group(&id, wait).await.unwrap();
        let distinct: BTreeSet<_> = v.nodes.iter().collect();
        assert_eq!(distinct.len(), i + 1, "{v:?}");
        assert!(head.remove_group(&id).await.unwrap());
    }

    let spread = head
        .create_group(GroupSpec::new(Strategy::Spread, vec![one_cpu.clone(); 3]))
        .await
        .unwrap();
    let v = head.wait_group(&spread, wait).await.unwrap();
    let distinct: BTreeSet<_> = v.nodes.iter().collect();
    assert_eq!(distinct.len(), 3, "{v:?}");

    // From a member, over its control stream to the head.
    let n1 = &members[0];
    let pack = n1
        .create_group(GroupSpec::new(
            Strategy::StrictPack,
            vec![one_cpu.clone(); 1],
        ))
        .await
        .unwrap();
    let v = n1.wait_group(&pack, wait).await.unwrap();
    assert_eq!(v.owner.as_deref(), Some("n1"));
    let (_, accounts) = head.groups().await.unwrap();
    assert_eq!(total_reserved(&accounts), 4.0, "{accounts:?}");
    let held: f64 = members
        .iter()
        .map(|m| m.reserved_here().get("cpu").copied().unwrap_or(0.0))
        .sum();
    assert_eq!(held, 4.0, "the members' ledgers agree with the head");

    // STRICT_SPREAD of four cannot fit on three nodes: it fails at its
    // timeout, and so does a bundle larger than any node.
    let too_wide = head
        .create_group(
            GroupSpec::new(Strategy::StrictSpread, vec![one_cpu.clone(); 4])
                .with_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    match head.wait_group(&too_wide, wait).await {
        Err(PlacementError::Failed { why, .. }) => {
            assert!(why.contains("4 distinct nodes"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let fat = head
        .create_group(
            GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 3.0)])])
                .with_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    match head.wait_group(&fat, wait).await {
        Err(PlacementError::Failed { why, .. }) => {
            assert!(why.contains("cpu") && why.contains("n1="), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        head.create_group(GroupSpec::new(Strategy::Pack, vec![]))
            .await,
        Err(PlacementError::Invalid(_))
    ));

    // An actor spawned into a bundle runs on the bundle's node.
    let echo: ActorRef<EchoMsg> = head
        .spawn_in_group(
            BundleRef {
                group: &spread,
                index: 2,
            },
            ECHO.named("echo-in-bundle"),
            &NoArgs,
            wait,
        )
        .await
        .unwrap();
    let reply = call_t!(echo, EchoMsg::Echo, 2_000, Payload(b"hi".to_vec())).unwrap();
    assert_eq!(reply, Payload(b"hi".to_vec()));
    assert!(matches!(
        head.spawn_in_group::<EchoMsg, _>(
            BundleRef {
                group: &spread,
                index: 9
            },
            ECHO.named("nope"),
            &NoArgs,
            wait
        )
        .await,
        Err(PlacementError::NoSuchBundle { .. })
    ));

    for id in [&spread, &too_wide, &fat] {
        assert!(head.remove_group(id).await.unwrap());
    }
    assert!(!head.remove_group(&spread).await.unwrap());
    // n1 goes: the group it owns is removed with it.
    let n1 = members.remove(0);
    n1.shutdown().await;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (groups, accounts) = head.groups().await.unwrap();
        let held: f64 = members
            .iter()
            .map(|m| m.reserved_here().values().sum::<f64>())
            .sum();
        if groups.is_empty() && total_reserved(&accounts) == 0.0 && held == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{groups:?} {accounts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        head.wait_group(&pack, wait).await,
        Err(PlacementError::NoSuchGroup(_))
    ));
    for m in members {
        m.shutdown().await;
    }
    head.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
}
