//! Objects between nodes of one process claiming different hosts: a pull
//! through the owner's bulk lane, shared by concurrent readers; a lent
//! object released over the network; an archive read in place from the
//! pulled copy.
//!
//! Clause "objects" of docs/runtime-semantics.md, on the in-process path.

use std::time::Duration;

use flotilla::{MemberState, Node, NodeConfig};
use flotilla_testkit::ca::{free_addr, scratch_certs};

async fn member(name: &str, host: &str, certs: &std::path::Path, head: &Node) -> Node {
    let mut c = NodeConfig::new(name, free_addr(), certs).join(head.addr());
    c.host_id = Some(host.into());
    c.object_store_bytes = Some(64 << 20);
    Node::builder(c).start().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_pulled_once_and_lent_ones_released_over_the_network() {
    let certs = scratch_certs("objects", &["objhead", "oa", "ob", "oc"]).unwrap();
    let head = Node::builder(NodeConfig::new("objhead", free_addr(), &certs))
        .start()
        .await
        .unwrap();
    let a = member("oa", "host-a", &certs, &head).await;
    let b = member("ob", "host-b", &certs, &head).await;
    head.wait_members(Duration::from_secs(20), |t| {
        ["oa", "ob"]
            .iter()
            .all(|n| t.get(n).is_some_and(|m| m.state == MemberState::Up))
    })
    .await
    .expect("cluster up");
    b.wait_members(Duration::from_secs(20), |t| {
        t.get("oa").is_some_and(|m| m.state == MemberState::Up)
    })
    .await
    .expect("b sees a");

    let texts: Vec<String> = (0..1000).map(|i| format!("text number {i}")).collect();
    let object = a.objects().put_archive(&texts).await.unwrap();
    let reference = object.reference().clone();
    assert_eq!(reference.host, "host-a");

    // Four readers at once on b: one pull.
    let reads: Vec<_> = (0..4)
        .map(|_| {
            let (objects, r) = (b.objects(), reference.clone());
            tokio::spawn(async move { objects.get(&r).await.map(|bytes| bytes.len()) })
        })
        .collect();
    for read in reads {
        assert_eq!(read.await.unwrap().unwrap() as u64, reference.size);
    }
    let stats = b.objects().stats();
    assert_eq!(
        stats.remote_pulls, 1,
        "one pull for four readers: {stats:?}"
    );
    assert_eq!(stats.pulled_bytes, reference.size);
    let copy = b.objects().get(&reference).await.unwrap();
    let archived = copy.archive::<Vec<String>>().unwrap();
    assert_eq!(archived[999].as_str(), "text number 999");
    let typed = b
        .objects()
        .get_archive::<Vec<String>>(&reference)
        .await
        .unwrap();
    assert_eq!(typed.len(), 1000);
    assert_eq!(typed[0].as_str(), "text number 0");
    assert!(
        b.objects()
            .get_archive::<Vec<u64>>(&reference)
            .await
            .is_err(),
        "not an archive of that type"
    );
    drop(typed);

    // Lent, then released by b over the network: a frees it.
    let lent = a.objects().lend(object, b.name(), Duration::from_secs(600));
    assert_eq!(a.objects().store().lent(), 1);
    b.objects().release(&lent).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.objects().store().lent() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the release did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(a.objects().stats().count, 0, "freed once released");

    // What a freed object's pull says.
    drop(copy);
    let c = member("oc", "host-c", &certs, &head).await;
    c.wait_members(Duration::from_secs(20), |t| {
        t.get("oa").is_some_and(|m| m.state == MemberState::Up)
    })
    .await
    .expect("c sees a");
    let gone = c.objects().get(&reference).await.unwrap_err();
    assert!(gone.to_string().contains("NODE-OBJ-003"), "{gone}");

    for n in [c, b, a, head] {
        n.shutdown().await;
    }
}
