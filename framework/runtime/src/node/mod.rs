//! # Room `node/`: the façade and its composition root
//!
//! Owns [`Node`] (one file per concept: this one for the node itself and
//! its member table, `actors.rs` for spawning, stopping and finding
//! actors, [`placement_groups`] for groups, [`drain`] for taking the node
//! out of service), the [`builder`] that
//! starts a node by calling into every other room, the node's
//! [`config`] and its flags ([`config_args`]), the stream [`router`] that
//! hands each accepted QUIC stream to its room, and the process-level
//! helpers ([`host`], [`process`], [`failpoints`]). It drives no proto
//! machine of its own: it composes the rooms that do.
//!
//! May import: every room below it (`net`, `head`, `remote`, `objects`,
//! `placement`, `member`, `control`) and the shared files. Imported by
//! `supervisor/` and `jobs/`, which run on the façade.
//!
//! [`Node`]: a running member of a Flotilla cluster, and what it offers its
//! user: the member table, spawning registered kinds on chosen nodes,
//! finding named actors, bounded sends, a clean stop.

mod actors;
pub mod builder;
pub mod config;
pub mod config_args;
#[doc(hidden)]
pub mod doc_example;
pub mod drain;
pub mod failpoints;
pub mod host;
pub mod placement_groups;
pub mod process;
pub(crate) mod router;

pub use actors::{LookupError, SpawnError, StopError, StopUnavailable, Unavailable};

use flotilla_proto::incarnation::Incarnation;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_transport::Endpoint;
use ractor::ActorRef;
use ractor_cluster::NodeServerMessage;
use tokio::sync::watch;

use crate::board::Board;
use crate::identity::Identity;
use crate::jobs_slot::JobsSlot;
use crate::member::head_client::HeadClient;
use crate::net::bulk::Lane;
use crate::net::outbound::Outbound;
use crate::net::pool::Pool;
use crate::net::sessions::{Sessions, ractor_name};
use crate::node::config_args::{ConfigArgsError, ConfigKinds, archive};
use crate::placement::PlacementHandle;
use crate::placement::reservations::Reservations;
use crate::remote::spawner::{Hosted, SpawnerMsg};
use crate::table::Table;
use crate::tasks::Tasks;
use flotilla_proto::ids::MemberName;

/// A running node of a Flotilla cluster.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla::{Node, NodeConfig};
/// let config = NodeConfig::new("n1", "127.0.0.1:7421".parse()?, "certs/")
///     .join("127.0.0.1:7420".parse()?);
/// let node = Node::builder(config).start().await?;
/// println!("{}", flotilla::render::members_text(&node.members()));
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Node {
    pub(crate) configurable: ConfigKinds,
    /// The head's store, where [`crate::NodeBuilder::head_store_in`] named one.
    pub(crate) head_store: Option<Arc<crate::head::head_store::HeadStore>>,
    pub(crate) board: Board,
    pub(crate) pulse: watch::Receiver<u64>,
    pub(crate) identity: Arc<Identity>,
    pub(crate) view: watch::Receiver<Table>,
    pub(crate) sessions: Sessions,
    pub(crate) spawner: ActorRef<SpawnerMsg>,
    pub(crate) hosted: Hosted,
    pub(crate) node_server: ActorRef<NodeServerMessage>,
    pub(crate) endpoint: Endpoint,
    pub(crate) lane: Arc<Lane>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) outbound: Outbound,
    pub(crate) tasks: Tasks,
    /// The placement service, on the head.
    pub(crate) placement: Option<PlacementHandle>,
    /// Calls to the head, from a member.
    pub(crate) head_client: HeadClient,
    /// This node's reservations.
    pub(crate) ledger: Reservations,
    /// The jobs service, once the head serves jobs.
    pub(crate) jobs: JobsSlot,
    /// This node's object store.
    pub(crate) objects: crate::objects::Objects,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.identity.name)
            .field("incarnation", &self.identity.incarnation())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// This node's member name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("name").await?;
    /// assert_eq!(node.name(), "head");
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn name(&self) -> &MemberName {
        &self.identity.name
    }

    /// This node's current incarnation.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("incarnation").await?;
    /// let first = node.incarnation();
    /// assert!(!first.is_tool(), "a tool's is 0; a node's is a clock reading");
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn incarnation(&self) -> Incarnation {
        self.identity.incarnation()
    }

    /// The address other members dial.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("addr").await?;
    /// assert!(node.addr().ip().is_loopback());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.identity.advertise
    }

    /// This node's object store: put objects, read them by reference from
    /// any node (see [`crate::objects`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("objects").await?;
    /// let object = node.objects().put(b"hello").await?;
    /// let bytes = node.objects().get(object.reference()).await?;
    /// assert_eq!(bytes.as_bytes(), b"hello");
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn objects(&self) -> crate::objects::Objects {
        self.objects.clone()
    }

    /// This node's host id: members with the same one share memory.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("host_id").await?;
    /// assert!(!node.host_id().is_empty());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn host_id(&self) -> &str {
        &self.identity.host
    }

    /// The member table as this node knows it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("members").await?;
    /// let table = node.members();
    /// assert!(table.get(node.name()).is_some());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn members(&self) -> Table {
        self.view.borrow().clone()
    }

    /// The archived arguments of the configurable kind `kind` (registered
    /// with [`crate::NodeBuilder::register_configurable`] on this node)
    /// for `value`, and the message type its actors take: what
    /// [`Node::spawn_on_raw`] sends.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("config_args").await?;
    /// use std::time::Duration;
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::SpawnOrder;
    /// // A counter whose start value comes from configuration (JSON).
    /// let (args, message_type) = node.config_args(COUNTER.name(), serde_json::json!(7))?;
    /// let order = SpawnOrder {
    ///     kind: COUNTER.name().into(),
    ///     name: "configured".into(),
    ///     args,
    ///     message_type: message_type.into(),
    ///     epoch: flotilla::checkpoint::Epoch::NONE,
    /// };
    /// let cell = node.spawn_on_raw(node.name(), order, Duration::from_secs(5)).await?;
    /// let counter: flotilla::ractor::ActorRef<CounterMsg> = cell.into();
    /// let count = flotilla::call::call(&counter, |r| CounterMsg::Get(Ask, r), Duration::from_secs(5)).await?;
    /// assert_eq!(count, Count(7));
    /// assert!(node.config_args("no.such.kind", serde_json::json!(7)).is_err());
    /// # Ok(()) }
    /// ```
    pub fn config_args(
        &self,
        kind: &str,
        value: serde_json::Value,
    ) -> Result<(Vec<u8>, &'static str), ConfigArgsError> {
        archive(&self.configurable, kind, value)
    }

    /// This node's supervision board: supervisors given it report there,
    /// and `node status` lists them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("board").await?;
    /// assert!(node.board().reports().is_empty());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn board(&self) -> Board {
        self.board.clone()
    }

    /// Ticks at every pass of the node's heartbeat loop (a member's
    /// heartbeats to the head, the head's failure detector), at least once
    /// per heartbeat interval while the loop runs: what a watchdog watches.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("pulse").await?;
    /// let mut pulse = node.pulse();
    /// pulse.changed().await?;
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn pulse(&self) -> watch::Receiver<u64> {
        self.pulse.clone()
    }

    /// A receiver of the member table, updated on every change.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("watch_members").await?;
    /// let members = node.watch_members();
    /// assert!(members.borrow().get("head").is_some());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch_members(&self) -> watch::Receiver<Table> {
        self.view.clone()
    }

    /// This node's way out: bounded casts to any actor, large messages on
    /// the bulk lane.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("outbound_of").await?;
    /// let outbound = node.outbound();
    /// // Nothing queued for remote actors, nothing sent on the bulk lane.
    /// assert_eq!((outbound.backlog(), outbound.bulk_bytes()), (0, 0));
    /// # Ok(()) }
    /// ```
    pub fn outbound(&self) -> Outbound {
        self.outbound.clone()
    }

    /// Waits until `pred` holds for the member table, at most `timeout`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("wait_members").await?;
    /// use std::time::Duration;
    /// use flotilla::MemberState;
    ///
    /// let up = |t: &flotilla::Table| t.get("head").is_some_and(|m| m.state == MemberState::Up);
    /// assert!(node.wait_members(Duration::from_secs(5), up).await.is_some());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_members(
        &self,
        timeout: Duration,
        pred: impl Fn(&Table) -> bool,
    ) -> Option<Table> {
        let mut rx = self.view.clone();
        tokio::time::timeout(timeout, async {
            rx.wait_for(|t| pred(t)).await.ok().map(|t| t.clone())
        })
        .await
        .ok()
        .flatten()
    }

    /// Waits until the ractor session with `node` is ready.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("wait_session").await?;
    /// use std::time::Duration;
    ///
    /// // With itself a node needs no session.
    /// assert!(node.wait_session(node.name(), Duration::from_secs(1)).await);
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_session(&self, node: &str, timeout: Duration) -> bool {
        if node == self.identity.name {
            return true;
        }
        let want = ractor_name(node);
        let mut rx = self.sessions.watch_ready();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.contains(&want)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The role of this node's certificate.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("role").await?;
    /// assert_eq!(node.role(), flotilla_proto::role::Role::Head);
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn role(&self) -> flotilla_proto::role::Role {
        self.identity.role
    }

    /// Leaves the cluster cleanly (members see this node as `left`; the
    /// head's acknowledgement is awaited, within two seconds), ends every
    /// task of the node, closes every connection and stops the actor
    /// system.
    ///
    /// It takes `&self`, so a node shared in an `Arc` (with its actors'
    /// tasks, a supervisor's pending remote stop, a [`crate::NodeHandle`])
    /// is shut down all the same; whoever still holds it afterwards gets
    /// errors from its calls. A second call does nothing more.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("shutdown").await?;
    /// node.shutdown().await;
    /// // A second call does nothing more.
    /// node.shutdown().await;
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.tasks.shutdown().await;
        self.spawner.stop(None);
        self.node_server.stop(None);
        self.endpoint.close();
        self.lane.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
        tracing::info!(node = %self.identity.name, "node stopped");
    }
}
