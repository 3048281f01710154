//! A real node for the façade's documentation examples: the head of a
//! cluster of its own, on 127.0.0.1, with a CA made for it in a folder of
//! the system's temporary directory (removed when the example's
//! [`DocHead`] is dropped), offering 2 CPUs to placement groups, and two
//! registered kinds: [`COUNTER`], and [`KEEPER`], whose actors fence
//! their checkpoints.

use std::path::PathBuf;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::RactorClusterMessage;
use rkyv::{Archive, Deserialize, Serialize};

use crate::node::Node;
use crate::node::config::NodeConfig;
use crate::remote::kind::ActorKind;
use flotilla_proto::epoch::{Start, TakesStart};

/// The kind [`head`] registers [`Counter`] as.
pub const COUNTER: ActorKind<CounterMsg, Count> = ActorKind::new("doc.counter");

/// A counter's value (its start value, when spawned).
#[derive(
    Archive, Serialize, Deserialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq,
)]
pub struct Count(pub u64);

/// A question with no argument.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask;

crate::remote_type!(Count, Ask);

/// What a [`Counter`] takes.
#[derive(RactorClusterMessage)]
pub enum CounterMsg {
    /// Adds to the count.
    Add(Count),
    /// The count now.
    #[rpc]
    Get(Ask, RpcReplyPort<Count>),
}

/// A counter: starts at its arguments' count, adds, answers.
pub struct Counter;

impl Actor for Counter {
    type Msg = CounterMsg;
    type State = u64;
    type Arguments = Count;

    async fn pre_start(
        &self,
        _: ActorRef<CounterMsg>,
        start: Count,
    ) -> Result<u64, ActorProcessingErr> {
        Ok(start.0)
    }

    async fn handle(
        &self,
        _: ActorRef<CounterMsg>,
        msg: CounterMsg,
        count: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CounterMsg::Add(Count(n)) => *count += n,
            CounterMsg::Get(Ask, reply) => {
                let _ = reply.send(Count(*count));
            }
        }
        Ok(())
    }
}

/// The kind [`head`] registers [`Keeper`] as, one whose actors fence
/// their checkpoints.
pub const KEEPER: ActorKind<KeeperMsg, KeeperArgs> = ActorKind::new("doc.keeper");

/// A [`Keeper`]'s arguments: only its start, which the node that spawns
/// it writes.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct KeeperArgs {
    /// Its start.
    pub start: Start,
}

impl TakesStart for KeeperArgs {
    fn start_mut(&mut self) -> &mut Start {
        &mut self.start
    }
}

/// A start as a [`Keeper`] tells it: its issuer and epoch.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StartSeen {
    /// The certificate whose supervisor issued it.
    pub issuer: String,
    /// Its epoch, in microseconds (0: none).
    pub epoch: u64,
}

crate::remote_type!(KeeperArgs, StartSeen);

/// What a [`Keeper`] takes.
#[derive(RactorClusterMessage)]
pub enum KeeperMsg {
    /// The start it was given.
    #[rpc]
    Start(Ask, RpcReplyPort<StartSeen>),
}

/// An actor that keeps the [`Start`] it was spawned with and tells it.
pub struct Keeper;

impl Actor for Keeper {
    type Msg = KeeperMsg;
    type State = Start;
    type Arguments = KeeperArgs;

    async fn pre_start(
        &self,
        _: ActorRef<KeeperMsg>,
        args: KeeperArgs,
    ) -> Result<Start, ActorProcessingErr> {
        Ok(args.start)
    }

    async fn handle(
        &self,
        _: ActorRef<KeeperMsg>,
        msg: KeeperMsg,
        start: &mut Start,
    ) -> Result<(), ActorProcessingErr> {
        let KeeperMsg::Start(Ask, reply) = msg;
        let _ = reply.send(StartSeen {
            issuer: start.issuer().to_owned(),
            epoch: start.epoch().micros(),
        });
        Ok(())
    }
}

/// A folder of certificates made for an example (a CA, and the head's
/// certificate), removed when dropped.
pub struct DocDir(PathBuf);

impl DocDir {
    /// The folder.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for DocDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The configuration of a head `head` of a new cluster, offering 2 CPUs
/// (CA and certificates in `flotilla-doc-PID-TAG` under the temporary
/// directory, removed with the [`DocDir`]).
pub fn config(tag: &str) -> Result<(NodeConfig, DocDir), Box<dyn std::error::Error>> {
    let dir =
        DocDir(std::env::temp_dir().join(format!("flotilla-doc-{}-{tag}", std::process::id())));
    let _ = std::fs::remove_dir_all(dir.path());
    flotilla_transport::certs::init_ca(dir.path(), "doc", "head")?;
    let mut config = NodeConfig::new("head", "127.0.0.1:0".parse()?, dir.path());
    config.resources = Some(flotilla_proto::resources::Resources {
        cpus: 2,
        ..Default::default()
    });
    Ok((config, dir))
}

/// [`Counter`] as a detached job ([`COUNTER`], from 0, in a bundle of
/// half a CPU, restarted at most 3 times): what the jobs examples submit.
pub fn counter_job() -> flotilla_proto::jobs::JobSpec {
    flotilla_proto::jobs::JobSpec {
        kind: COUNTER.name().into(),
        args: crate::remote::wire::encode(&Count(0)),
        message_type: std::any::type_name::<CounterMsg>().into(),
        resources: [("cpu".to_owned(), 0.5)].into_iter().collect(),
        description: "a counter as a job".into(),
        max_restarts: 3,
    }
}

/// A started head and the folder of its certificates.
pub struct DocHead {
    node: Node,
    _dir: DocDir,
}

impl std::ops::Deref for DocHead {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

/// Starts the head `head` of [`config`], with [`Counter`] registered as
/// [`COUNTER`] (its arguments also readable from configuration) and
/// [`Keeper`] as [`KEEPER`].
pub async fn head(tag: &str) -> Result<DocHead, Box<dyn std::error::Error>> {
    let (config, dir) = config(tag)?;
    let node = Node::builder(config)
        .register_configurable(COUNTER, || Counter)
        .register(KEEPER, || Keeper)
        .fences_checkpoints(KEEPER)
        .start()
        .await?;
    Ok(DocHead { node, _dir: dir })
}
