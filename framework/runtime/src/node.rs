//! [`Node`]: a running member of a Flotilla cluster, and what it offers its
//! user: the member table, spawning registered kinds on chosen nodes,
//! finding named actors, bounded sends, a clean stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_transport::Endpoint;
use ractor::{ActorRef, Message};
use ractor_cluster::NodeServerMessage;
use tokio::sync::watch;

use crate::bulk::Lane;
use crate::identity::Identity;
use crate::outbound::Outbound;
use crate::sessions::{Sessions, ractor_name};
use crate::spawner::{Hosted, SpawnReply, SpawnRequest, SpawnerMsg, spawner_group};
use crate::table::Table;
use crate::tasks::Tasks;
use crate::wire::{Encode, encode};

/// Why a remote spawn failed. Sorted by what the caller should do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The target node refused: fix the request (kind, name, arguments).
    #[error("node {node:?} refused the spawn: {reply}")]
    Refused {
        /// The target node.
        node: String,
        /// Its answer.
        reply: SpawnReply,
    },
    /// No such member is up, or its session is not ready in time: choose
    /// another node, or wait for it.
    #[error("node {0:?} is not an up member with a ready session")]
    NoSuchNode(String),
    /// The request or its answer was lost (the node died, the call timed
    /// out): the actor may or may not run; look it up before retrying under
    /// the same name.
    #[error("spawn request to {node:?} failed: {why}")]
    Unavailable {
        /// The target node.
        node: String,
        /// What happened.
        why: Unavailable,
    },
}

/// How a spawn request was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// No answer within the timeout.
    #[error("no answer in time")]
    Timeout,
    /// The spawner or its session went away before answering.
    #[error("the node's spawner is gone")]
    Gone,
    /// Spawned, but its process group did not reach this node in time.
    #[error("spawned, but its process group did not reach this node in time")]
    NotVisible,
}

/// A running node of a Flotilla cluster.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla::{Node, NodeConfig};
/// let config = NodeConfig::new("n1", "127.0.0.1:7421".parse()?, "certs/")
///     .join("127.0.0.1:7420".parse()?);
/// let node = Node::builder(config).start().await?;
/// println!("{}", node.members().to_text());
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Node {
    pub(crate) identity: Arc<Identity>,
    pub(crate) view: watch::Receiver<Table>,
    pub(crate) sessions: Sessions,
    pub(crate) spawner: ActorRef<SpawnerMsg>,
    pub(crate) hosted: Hosted,
    pub(crate) node_server: ActorRef<NodeServerMessage>,
    pub(crate) endpoint: Endpoint,
    pub(crate) lane: Arc<Lane>,
    pub(crate) outbound: Outbound,
    pub(crate) tasks: Tasks,
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
    /// This node's name.
    pub fn name(&self) -> &str {
        &self.identity.name
    }

    /// This node's current incarnation.
    pub fn incarnation(&self) -> u64 {
        self.identity.incarnation()
    }

    /// The address other members dial.
    pub fn addr(&self) -> SocketAddr {
        self.identity.advertise
    }

    /// The member table as this node knows it.
    pub fn members(&self) -> Table {
        self.view.borrow().clone()
    }

    /// A receiver of the member table, updated on every change.
    pub fn watch_members(&self) -> watch::Receiver<Table> {
        self.view.clone()
    }

    /// This node's way out: bounded casts to any actor, large messages on
    /// the bulk lane.
    pub fn outbound(&self) -> Outbound {
        self.outbound.clone()
    }

    /// Waits until `pred` holds for the member table, at most `timeout`.
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

    /// Spawns an actor of a kind registered on `node`, named `name`, with
    /// `args`, and returns a reference usable from this node.
    ///
    /// Delivery: the request is sent once; if the answer is lost the actor
    /// may or may not run (look it up before retrying under the same name).
    pub async fn spawn_on<M: Message, A: Encode>(
        &self,
        node: &str,
        kind: &str,
        name: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SpawnError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let spawner: ActorRef<SpawnerMsg> = if node == self.identity.name {
            self.spawner.clone()
        } else {
            if !self.wait_session(node, timeout).await {
                return Err(SpawnError::NoSuchNode(node.to_owned()));
            }
            let group = spawner_group(node);
            let cell = ractor::pg::get_members(&group)
                .into_iter()
                .find(|c| !c.get_id().is_local())
                .ok_or_else(|| SpawnError::NoSuchNode(node.to_owned()))?;
            cell.into()
        };
        let req = SpawnRequest {
            kind: kind.to_owned(),
            name: name.to_owned(),
            args: encode(args),
            owner: self.identity.name.clone(),
            owner_incarnation: self.identity.incarnation(),
        };
        let unavailable = |why| SpawnError::Unavailable {
            node: node.to_owned(),
            why,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let reply = match spawner
            .call(
                |port| SpawnerMsg::Spawn(req, port),
                Some(left.max(Duration::from_millis(1))),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(reply)) => reply,
            Ok(ractor::rpc::CallResult::Timeout) => return Err(unavailable(Unavailable::Timeout)),
            Ok(ractor::rpc::CallResult::SenderError) | Err(_) => {
                return Err(unavailable(Unavailable::Gone));
            }
        };
        if reply != SpawnReply::Spawned {
            return Err(SpawnError::Refused {
                node: node.to_owned(),
                reply,
            });
        }
        let deadline = deadline.max(tokio::time::Instant::now());
        loop {
            if let Some(a) = self.lookup_on(node, name) {
                return Ok(a);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable(Unavailable::NotVisible));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The node an actor seen from here runs on: this node for the actors
    /// its spawner hosts, the peer of the session a remote reference goes
    /// through, `None` for other local actors (of this process but not of
    /// this node, or not spawned through a spawner).
    fn node_of(&self, cell: &ractor::ActorCell) -> Option<String> {
        match cell.get_id() {
            ractor::ActorId::Remote { node_id, .. } => self.sessions.peer_of(node_id),
            id if self.hosted.contains(id) => Some(self.identity.name.clone()),
            ractor::ActorId::Local(_) => None,
        }
    }

    /// The actor named `name` on the node `node`, if visible from here.
    fn lookup_on<M: Message>(&self, node: &str, name: &str) -> Option<ActorRef<M>> {
        ractor::pg::get_members(&name.to_owned())
            .into_iter()
            .find(|c| self.node_of(c).as_deref() == Some(node))
            .map(Into::into)
    }

    /// Looks up a named actor anywhere in the cluster: this node's own
    /// first, then one reached through this node's sessions, then any
    /// other actor of this process under that name. The reference's
    /// message type is the caller's claim, as with ractor's registry: a
    /// wrong `M` is a programming error.
    pub fn lookup<M: Message>(&self, name: &str) -> Option<ActorRef<M>> {
        let members = ractor::pg::get_members(&name.to_owned());
        let rank = |c: &ractor::ActorCell| match self.node_of(c) {
            Some(n) if n == self.identity.name => 0,
            Some(_) => 1,
            None if c.get_id().is_local() => 2,
            None => 3,
        };
        members.into_iter().min_by_key(rank).map(Into::into)
    }

    /// Waits until a named actor is visible from this node.
    pub async fn wait_actor<M: Message>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Option<ActorRef<M>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(a) = self.lookup(name) {
                return Some(a);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Leaves the cluster cleanly (members see this node as `left`; the
    /// head's acknowledgement is awaited, within two seconds), ends every
    /// task of the node, closes every connection and stops the actor
    /// system.
    pub async fn shutdown(self) {
        self.tasks.shutdown().await;
        self.spawner.stop(None);
        self.node_server.stop(None);
        self.endpoint.close();
        self.lane.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
        tracing::info!(node = %self.identity.name, "node stopped");
    }
}
