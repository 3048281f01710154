//! Ping-pong across two nodes on loopback: this process is the head and
//! pings; a second process (this executable with `--worker pong`) hosts the
//! user-defined `Pong` actor, spawned there by name.
//!
//! ```text
//! cargo run -p flotilla-examples --bin ping_pong
//! ```

use std::time::{Duration, Instant};

use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, call_t};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::{Node, NodeConfig};
use flotilla_examples::{Worker, free_addr, init_logs, scratch_certs, serve_if_worker};

/// A ball with a hit counter.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
struct Ball {
    hits: u64,
}

/// The pong actor's arguments (none).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct NoArgs;

flotilla::remote_type!(Ball, NoArgs);

#[derive(RactorClusterMessage)]
enum PongMsg {
    #[rpc]
    Ping(Ball, RpcReplyPort<Ball>),
}

struct Pong;

/// The kind the worker registers [`Pong`] as.
const PONG: flotilla::ActorKind<PongMsg, NoArgs> = flotilla::ActorKind::new("pong");

impl Actor for Pong {
    type Msg = PongMsg;
    type State = ();
    type Arguments = NoArgs;

    async fn pre_start(&self, _: ActorRef<PongMsg>, _: NoArgs) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<PongMsg>,
        msg: PongMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let PongMsg::Ping(ball, reply) = msg;
        let _ = reply.send(Ball {
            hits: ball.hits + 1,
        });
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    if serve_if_worker(|b| b.register(PONG, || Pong)).await? {
        return Ok(());
    }

    let certs = scratch_certs("ping-pong", &["ping", "pong"])?;
    let node = Node::builder(NodeConfig::new("ping", free_addr(), &certs))
        .start()
        .await?;
    let _worker = Worker::start("pong", node.addr(), &certs)?;
    node.wait_members(Duration::from_secs(20), |t| {
        t.up().any(|m| m.name == "pong")
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("pong did not join"))?;

    let pong: ActorRef<PongMsg> = node
        .spawn_on(
            "pong",
            PONG.named("pong-1"),
            &NoArgs,
            Duration::from_secs(10),
        )
        .await?;
    let mut ball = Ball { hits: 0 };
    for _ in 0..5 {
        let t = Instant::now();
        ball = call_t!(pong, PongMsg::Ping, 2_000, ball)?;
        println!(
            "ping → pong: hits = {} ({:?} round trip)",
            ball.hits,
            t.elapsed()
        );
    }
    assert_eq!(ball.hits, 5);
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
    println!("ok");
    Ok(())
}
