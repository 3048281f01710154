//! A supervised, checkpointing counter that survives the loss of its node.
//!
//! This process is the head and runs a supervisor; two worker processes
//! (this executable with `--worker NAME`) can host the `counter` kind. The
//! supervisor starts the counter on `w1`; the counter saves a snapshot of
//! its count every 5 increments to a checkpoint store (a local folder
//! here; an `s3://` URL works the same). `w1` is killed with SIGKILL; the
//! head marks it down, the supervisor counts that as the child's failure
//! and starts it again on `w2`, where it restores its newest snapshot. The
//! example checks that every increment up to that snapshot survived (those
//! after it died with `w1`, as documented), and that counting goes on.
//!
//! ```text
//! cargo run -p flotilla-examples --bin supervised_counter
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::checkpoint::CheckpointStore;
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, call_t};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::supervisor::{
    Child, ChildSpec, RemoteChild, Supervisor, SupervisorArgs, SupervisorEvent, SupervisorMsg,
    SupervisorSpec,
};
use flotilla::{Node, NodeConfig};
use flotilla_examples::{Worker, free_addr, init_logs, scratch_certs, serve_if_worker};
use tokio::sync::mpsc;

/// Where the counter keeps its snapshots, and under which key.
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
#[rkyv(crate = flotilla::rkyv)]
struct CounterArgs {
    store: String,
    key: String,
    every: u64,
}

/// What a snapshot holds.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct Snapshot {
    n: u64,
}

/// The count, and the value of the last snapshot saved.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
struct Count {
    n: u64,
    saved: u64,
}

flotilla::remote_type!(CounterArgs, Count);

#[derive(RactorClusterMessage)]
enum CounterMsg {
    /// Add one; answered once a snapshot due at the new count is saved.
    #[rpc]
    Add(RpcReplyPort<Count>),
    #[rpc]
    Get(RpcReplyPort<Count>),
}

/// The kind workers register [`Counter`] as.
const COUNTER: flotilla::ActorKind<CounterMsg, CounterArgs> = flotilla::ActorKind::new("counter");

struct Counter;

struct CounterState {
    store: CheckpointStore,
    key: String,
    every: u64,
    count: Count,
}

impl Actor for Counter {
    type Msg = CounterMsg;
    type State = CounterState;
    type Arguments = CounterArgs;

    async fn pre_start(
        &self,
        _: ActorRef<CounterMsg>,
        args: CounterArgs,
    ) -> Result<CounterState, ActorProcessingErr> {
        let store = CheckpointStore::open(&args.store, 3)?;
        let n = match store.restore::<Snapshot>(&args.key).await? {
            Some((_, s)) => s.n,
            None => 0,
        };
        Ok(CounterState {
            store,
            key: args.key,
            every: args.every.max(1),
            count: Count { n, saved: n },
        })
    }

    async fn handle(
        &self,
        _: ActorRef<CounterMsg>,
        msg: CounterMsg,
        state: &mut CounterState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CounterMsg::Add(reply) => {
                state.count.n += 1;
                if state.count.n.is_multiple_of(state.every) {
                    let n = state.count.n;
                    state.store.save(&state.key, n, &Snapshot { n }).await?;
                    state.count.saved = n;
                }
                let _ = reply.send(state.count);
            }
            CounterMsg::Get(reply) => {
                let _ = reply.send(state.count);
            }
        }
        Ok(())
    }
}

/// The next start of the counter: its node and reference.
async fn started(
    events: &mut mpsc::UnboundedReceiver<SupervisorEvent>,
) -> anyhow::Result<(String, ActorRef<CounterMsg>, u32)> {
    loop {
        match events.recv().await {
            Some(SupervisorEvent::Started {
                running, restarts, ..
            }) => {
                let node = running.node.map(|n| n.name).unwrap_or_default();
                return Ok((node.to_string(), running.cell.into(), restarts));
            }
            Some(SupervisorEvent::Exited { exit, .. }) => {
                println!("supervisor: the counter exited ({exit:?})");
            }
            Some(SupervisorEvent::Escalated(e)) => anyhow::bail!("{e}"),
            None => anyhow::bail!("the supervisor stopped"),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    if serve_if_worker(|b| b.register(COUNTER, || Counter)).await? {
        return Ok(());
    }

    let certs = scratch_certs("supervised-counter", &["sup", "w1", "w2"])?;
    let store = certs.join("checkpoints");
    let mut config = NodeConfig::new("sup", free_addr(), &certs);
    // Workers heartbeat every second: down after 3 s of silence.
    config.detector.down_after = Duration::from_secs(3);
    let down_after = config.detector.down_after;
    let node = Arc::new(Node::builder(config).start().await?);
    let mut w1 = Some(Worker::start("w1", node.addr(), &certs)?);
    let _w2 = Worker::start("w2", node.addr(), &certs)?;
    node.wait_members(Duration::from_secs(20), |t| {
        t.up().filter(|m| m.name.starts_with('w')).count() == 2
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("the workers did not join"))?;

    // The counter goes on the first up worker by name.
    let place = |t: &flotilla::Table| {
        t.up()
            .filter(|m| m.name.starts_with('w'))
            .map(|m| m.name.clone())
            .min()
    };
    let args = CounterArgs {
        store: store.to_string_lossy().into_owned(),
        key: "counter".into(),
        every: 5,
    };
    let child = RemoteChild::new(
        Arc::clone(&node),
        COUNTER.named("counter"),
        &args,
        place,
        Duration::from_secs(10),
    );
    let (tx, mut events) = mpsc::unbounded_channel();
    let (supervisor, supervising) = Actor::spawn(
        None,
        Supervisor,
        SupervisorArgs {
            spec: SupervisorSpec::default(),
            children: vec![Child::new(ChildSpec::permanent("counter"), child)],
            events: Some(tx),
            members: Some(node.watch_members()),
            seed: 7,
            report: Some(("counters".into(), node.board())),
        },
    )
    .await?;

    let (on, counter, _) = started(&mut events).await?;
    println!("counter started on {on}");
    anyhow::ensure!(on == "w1", "expected the counter on w1, not {on}");
    let mut last = Count { n: 0, saved: 0 };
    for _ in 0..23 {
        last = call_t!(counter, CounterMsg::Add, 2_000)?;
    }
    println!(
        "counted to {} on w1; last snapshot at {}",
        last.n, last.saved
    );

    drop(w1.take()); // SIGKILL
    let killed = Instant::now();
    println!("w1 killed");
    let (on, counter, restarts) = started(&mut events).await?;
    let took = killed.elapsed();
    println!("counter restarted on {on} after {took:.1?} (restart {restarts})");
    anyhow::ensure!(on == "w2", "expected the counter on w2, not {on}");
    anyhow::ensure!(
        took <= down_after + Duration::from_secs(3),
        "restarted after {took:?}, more than down_after + 3 s"
    );
    let now = call_t!(counter, CounterMsg::Get, 2_000)?;
    println!(
        "restored count {} (increments {}..={} came after the last snapshot and died with w1)",
        now.n,
        last.saved + 1,
        last.n
    );
    anyhow::ensure!(
        now.n == last.saved,
        "restored {} but the last snapshot was {}",
        now.n,
        last.saved
    );
    let next = call_t!(counter, CounterMsg::Add, 2_000)?;
    anyhow::ensure!(next.n == last.saved + 1, "counting did not go on");
    println!("counting goes on: {}", next.n);

    flotilla::call::call(
        &supervisor,
        SupervisorMsg::Shutdown,
        Duration::from_secs(10),
    )
    .await?;
    supervising.await?;
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
    println!("ok");
    Ok(())
}
