//! A user-defined actor across three node processes: this process is the
//! head; two workers (this executable with `--worker w1|w2`) register the
//! `WordCounter` kind; the head spawns one counter on each, casts lines to
//! them round-robin and sums their totals with calls.
//!
//! ```text
//! cargo run -p flotilla-examples --bin word_count
//! ```

use std::time::Duration;

use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, call_t};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::{Node, NodeConfig};
use flotilla_examples::{Worker, free_addr, init_logs, scratch_certs, serve_if_worker};

/// A line of text to count.
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
#[rkyv(crate = flotilla::rkyv)]
struct Line(String);

/// Counter arguments: a starting count.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct Start(u64);

flotilla::remote_type!(Line, Start);

#[derive(RactorClusterMessage)]
enum CounterMsg {
    Count(Line),
    #[rpc]
    Total(RpcReplyPort<u64>),
}

struct WordCounter;

/// The kind the workers register [`WordCounter`] as.
const WORD_COUNTER: flotilla::ActorKind<CounterMsg, Start> =
    flotilla::ActorKind::new("word-counter");

impl Actor for WordCounter {
    type Msg = CounterMsg;
    type State = u64;
    type Arguments = Start;

    async fn pre_start(
        &self,
        _: ActorRef<CounterMsg>,
        start: Start,
    ) -> Result<u64, ActorProcessingErr> {
        Ok(start.0)
    }

    async fn handle(
        &self,
        _: ActorRef<CounterMsg>,
        msg: CounterMsg,
        total: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CounterMsg::Count(line) => *total += line.0.split_whitespace().count() as u64,
            CounterMsg::Total(reply) => {
                let _ = reply.send(*total);
            }
        }
        Ok(())
    }
}

const TEXT: &str = "the quick brown fox jumps over the lazy dog
actors send typed messages over quic
every node joins the head and meets every other node
a counter lives on each worker";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    if serve_if_worker(|b| b.register(WORD_COUNTER, || WordCounter)).await? {
        return Ok(());
    }

    let certs = scratch_certs("word-count", &["head", "w1", "w2"])?;
    let node = Node::builder(NodeConfig::new("head", free_addr(), &certs))
        .start()
        .await?;
    let _workers = [
        Worker::start("w1", node.addr(), &certs)?,
        Worker::start("w2", node.addr(), &certs)?,
    ];
    let table = node
        .wait_members(Duration::from_secs(20), |t| t.up().count() == 3)
        .await
        .ok_or_else(|| anyhow::anyhow!("workers did not join"))?;
    print!("{}", flotilla::render::members_text(&table));

    let mut counters: Vec<ActorRef<CounterMsg>> = Vec::new();
    for w in ["w1", "w2"] {
        let name = format!("counter-{w}");
        counters.push(
            node.spawn_on(
                w,
                WORD_COUNTER.named(&name),
                &Start(0),
                Duration::from_secs(10),
            )
            .await?,
        );
    }
    for (i, line) in TEXT.lines().enumerate() {
        counters[i % counters.len()].cast(CounterMsg::Count(Line(line.to_owned())))?;
    }
    let mut total = 0;
    for (w, c) in ["w1", "w2"].iter().zip(&counters) {
        let n = call_t!(c, CounterMsg::Total, 2_000)?;
        println!("counter on {w}: {n} words");
        total += n;
    }
    let expected = TEXT.split_whitespace().count() as u64;
    println!("total {total} words (expected {expected})");
    assert_eq!(total, expected);
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(certs);
    Ok(())
}
