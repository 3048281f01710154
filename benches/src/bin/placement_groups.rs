//! Placement-group lifecycle rate on a loopback cluster: a head and four
//! members in this process (each a real node on 127.0.0.1, with QUIC and
//! mutual TLS), the caller on member n1. Each round creates a group, waits
//! until it is ready and removes it; `--concurrency` callers run at once.
//! The same-run floor is the rate of the cheapest request to the head (a
//! `Get` of an unknown group: one round trip, no reservation).
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin placement_groups -- \
//!     [--groups 5000] [--concurrency 16] [--bundles 1] [--strategy spread]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
use flotilla::{MemberState, Node, NodeConfig};
use flotilla_proto::ids::GroupId;
use flotilla_testkit::ca::{free_addr, scratch_certs};

#[derive(Parser)]
struct Args {
    /// Groups to create, wait for and remove.
    #[arg(long, default_value_t = 5000)]
    groups: usize,
    /// Callers at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Bundles per group, each `{"slot": 0.001}`.
    #[arg(long, default_value_t = 1)]
    bundles: usize,
    /// pack, spread, strict-pack or strict-spread.
    #[arg(long, default_value = "spread")]
    strategy: Strategy,
}

async fn rate<F, Fut>(total: usize, concurrency: usize, node: &Arc<Node>, f: F) -> f64
where
    F: Fn(Arc<Node>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let per = total / concurrency;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (node, f) = (Arc::clone(node), f.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per {
                f(Arc::clone(&node)).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    (per * concurrency) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let names = ["head", "n1", "n2", "n3", "n4"];
    let certs = scratch_certs("pg-bench", &names)?;
    let head = Node::builder(NodeConfig::new("head", free_addr(), &certs))
        .start()
        .await?;
    let mut members = Vec::new();
    for n in &names[1..] {
        let mut c = NodeConfig::new(*n, free_addr(), &certs).join(head.addr());
        c.declared.insert("slot".into(), 1000.0);
        members.push(Arc::new(Node::builder(c).start().await?));
    }
    head.wait_members(Duration::from_secs(20), |t| {
        names
            .iter()
            .all(|n| t.get(n).is_some_and(|m| m.state == MemberState::Up))
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("the cluster did not come up"))?;
    let caller = Arc::clone(&members[0]);
    let spec = GroupSpec::new(
        args.strategy,
        vec![bundle(&[("slot", 0.001)]); args.bundles],
    );

    // Warm the streams.
    rate(200, args.concurrency, &caller, |n| async move {
        n.group(&GroupId::from("none")).await.expect("get");
    })
    .await;
    let floor = rate(args.groups, args.concurrency, &caller, |n| async move {
        n.group(&GroupId::from("none")).await.expect("get");
    })
    .await;
    let lifecycle = rate(args.groups, args.concurrency, &caller, move |n| {
        let spec = spec.clone();
        async move {
            let id = n.create_group(spec).await.expect("create");
            n.wait_group(&id, Duration::from_secs(30))
                .await
                .expect("ready");
            n.remove_group(&id).await.expect("remove");
        }
    })
    .await;
    let (groups, accounts) = caller.groups().await?;
    let left: f64 = accounts
        .iter()
        .map(|a| a.reserved.values().sum::<f64>())
        .sum();
    println!("| case | per second |");
    println!("| --- | ---: |");
    println!(
        "| create + ready + remove, {} bundle(s) {}, {} callers | {lifecycle:.0} |",
        args.bundles,
        args.strategy.as_str(),
        args.concurrency
    );
    println!("| floor: one request to the head (Get) | {floor:.0} |");
    println!(
        "groups left {}, reserved left {:.3}",
        groups.len(),
        left.abs()
    );
    for m in members {
        m.shutdown().await;
    }
    head.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
    Ok(())
}
