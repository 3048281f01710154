//! Placement groups on three worker processes that each offer `cpu=2`:
//! PACK fills as few nodes as it can, SPREAD uses as many as it can,
//! STRICT_SPREAD wider than the cluster fails at its timeout naming the
//! shortage; an actor spawned into each bundle runs in that bundle's
//! process; a worker killed with SIGKILL has its bundle placed again on
//! another node; removing the groups gives every reservation back.
//!
//! ```text
//! cargo run -p flotilla-examples --bin placement_pack_spread
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use flotilla::placement_groups::{
    BundleRef, GroupSpec, GroupView, PlacementError, Strategy, bundle,
};
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, call_t};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::{Node, NodeConfig};
use flotilla_examples::{Worker, free_addr, init_logs, scratch_certs, serve_if_worker_with};

/// The actor's arguments (none).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct NoArgs;

/// A process id.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
struct Pid(u32);

flotilla::remote_type!(NoArgs, Pid);

#[derive(RactorClusterMessage)]
enum WhereMsg {
    /// The process the actor runs in.
    #[rpc]
    Pid(NoArgs, RpcReplyPort<Pid>),
}

/// Answers with its process id.
struct Where;

/// The kind the workers register [`Where`] as.
const WHERE: flotilla::ActorKind<WhereMsg, NoArgs> = flotilla::ActorKind::new("where");

impl Actor for Where {
    type Msg = WhereMsg;
    type State = ();
    type Arguments = NoArgs;

    async fn pre_start(&self, _: ActorRef<WhereMsg>, _: NoArgs) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<WhereMsg>,
        msg: WhereMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let WhereMsg::Pid(_, reply) = msg;
        let _ = reply.send(Pid(std::process::id()));
        Ok(())
    }
}

fn show(what: &str, g: &GroupView) {
    let used: BTreeSet<&flotilla::MemberName> = g.nodes.iter().collect();
    println!(
        "{what}: {} bundles on {} node(s): {}",
        g.nodes.len(),
        used.len(),
        g.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{i}→{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    let two_cpus = |c: &mut NodeConfig| {
        c.declared.insert("cpu".into(), 2.0);
    };
    if serve_if_worker_with(two_cpus, |b| b.register(WHERE, || Where)).await? {
        return Ok(());
    }
    let names = ["head", "w1", "w2", "w3"];
    let certs = scratch_certs("placement", &names)?;
    let head = Node::builder(NodeConfig::new("head", free_addr(), &certs))
        .start()
        .await?;
    let mut workers: BTreeMap<String, Worker> = BTreeMap::new();
    for w in &names[1..] {
        workers.insert((*w).to_owned(), Worker::start(w, head.addr(), &certs)?);
    }
    head.wait_members(Duration::from_secs(30), |t| {
        names[1..].iter().all(|n| t.up().any(|m| m.name == *n))
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("the workers did not join"))?;
    let wait = Duration::from_secs(20);
    let cpu = bundle(&[("cpu", 1.0)]);

    let pack = head
        .create_group(GroupSpec::new(Strategy::Pack, vec![cpu.clone(); 4]))
        .await?;
    let g = head.wait_group(&pack, wait).await?;
    show("PACK", &g);
    let used: BTreeSet<&flotilla::MemberName> = g.nodes.iter().collect();
    anyhow::ensure!(
        used.len() == 2,
        "4 one-cpu bundles pack onto 2 two-cpu nodes"
    );
    head.remove_group(&pack).await?;

    let spread = head
        .create_group(GroupSpec::new(Strategy::Spread, vec![cpu.clone(); 3]))
        .await?;
    let g = head.wait_group(&spread, wait).await?;
    show("SPREAD", &g);
    let used: BTreeSet<&flotilla::MemberName> = g.nodes.iter().collect();
    anyhow::ensure!(used.len() == 3, "3 bundles spread over 3 nodes");

    let wide = head
        .create_group(
            GroupSpec::new(Strategy::StrictSpread, vec![cpu.clone(); 4])
                .with_timeout(Duration::from_secs(1)),
        )
        .await?;
    match head.wait_group(&wide, wait).await {
        Err(e @ PlacementError::Failed { .. }) => println!("STRICT_SPREAD of 4: {e}"),
        other => anyhow::bail!("a 4-wide STRICT_SPREAD on 3 nodes: {other:?}"),
    }
    head.remove_group(&wide).await?;

    // One actor in each bundle of the SPREAD group: each runs in the
    // process of its bundle's node.
    for (i, node) in g.nodes.iter().enumerate() {
        let actor: ActorRef<WhereMsg> = head
            .spawn_in_group(
                BundleRef {
                    group: &spread,
                    index: i,
                },
                WHERE.named(format!("where-{i}")),
                &NoArgs,
                wait,
            )
            .await?;
        let Pid(pid) = call_t!(actor, WhereMsg::Pid, 5_000, NoArgs)?;
        anyhow::ensure!(
            pid == workers[node.as_str()].pid(),
            "bundle {i} runs on {node}"
        );
        println!("bundle {i}: actor runs in {node}'s process (pid {pid})");
    }

    // Kill the node of bundle 0: the head places that bundle again.
    let victim = g.nodes[0].clone();
    drop(workers.remove(victim.as_str()));
    println!("killed {victim} (SIGKILL)");
    let moved = head
        .watch_group(&spread, Some(g.revision), Duration::from_secs(30))
        .await?
        .ok_or_else(|| anyhow::anyhow!("the group vanished"))?;
    show("SPREAD after the kill", &moved);
    anyhow::ensure!(
        moved.nodes[0] != victim && moved.nodes[1..] == g.nodes[1..],
        "only the lost bundle moved"
    );
    head.remove_group(&spread).await?;
    let (groups, accounts) = head.groups().await?;
    let reserved: f64 = accounts
        .iter()
        .map(|a| a.reserved.values().sum::<f64>())
        .sum();
    println!(
        "after removal: {} groups, {:.1} cpu reserved",
        groups.len(),
        reserved.abs()
    );
    anyhow::ensure!(groups.is_empty() && reserved.abs() < 1e-9);
    drop(workers);
    head.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
    Ok(())
}
