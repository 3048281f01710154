//! `impl Node` for actors: spawning registered kinds on chosen nodes,
//! stopping them, and finding named actors (here or on other nodes).

use std::net::SocketAddr;
use std::time::Duration;

use flotilla_proto::authority::Unauthorized;
use flotilla_proto::control::{ControlReply, ControlRequest, SpawnOrder, StopOutcome};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::hello::Purpose;
use flotilla_proto::incarnation::MemberRef;
use flotilla_transport::handshake::{self, StreamError, recv_msg, send_msg};
use ractor::{ActorRef, Message};

use crate::remote::call::{CallError, call};
use crate::remote::kind::Named;
use crate::remote::spawner::{
    LocalSpawn, LocalStop, SpawnReply, SpawnerMsg, StopReply, TYPE_GROUP_PREFIX,
};
use crate::remote::wire::{Encode, encode};

use super::Node;

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
    /// The target node's permission table refused this node's request.
    #[error("node {node:?} refused the spawn: {why}")]
    Denied {
        /// The target node.
        node: String,
        /// Why.
        why: Unauthorized,
    },
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

/// Why a lookup gave no reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// No actor of that name is visible from this node (yet).
    #[error("no actor named {0:?} is visible from this node")]
    NotFound(String),
    /// The actor of that name takes another message type: a reference of
    /// the asked type would lose every message sent through it.
    #[error("the actor {name:?} takes {takes}, not {asked}")]
    WrongType {
        /// The actor's name.
        name: String,
        /// Its message type.
        takes: String,
        /// The caller's.
        asked: &'static str,
    },
}

/// The message type an actor was spawned with, if it was spawned through
/// a spawner (its type group). A member counts only under the same id and
/// name: another node of the process may hold a reference under the same
/// id to another actor.
fn message_type_of(cell: &ractor::ActorCell) -> Option<String> {
    let id = cell.get_id();
    ractor::pg::which_groups()
        .into_iter()
        .filter(|g| g.starts_with(TYPE_GROUP_PREFIX))
        .find(|g| {
            ractor::pg::get_members(g)
                .iter()
                .any(|c| c.get_id() == id && c.get_name() == cell.get_name())
        })
        .map(|g| g[TYPE_GROUP_PREFIX.len()..].to_owned())
}

/// `cell` as an `ActorRef<M>`, if its message type is `M` or unknown (an
/// actor not spawned through a spawner: the caller's claim stands).
fn typed<M: Message>(name: &str, cell: ractor::ActorCell) -> Result<ActorRef<M>, LookupError> {
    let asked = std::any::type_name::<M>();
    match message_type_of(&cell) {
        Some(takes) if takes != asked => Err(LookupError::WrongType {
            name: name.to_owned(),
            takes,
            asked,
        }),
        _ => Ok(cell.into()),
    }
}

/// How a spawn request was lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// No answer within the timeout.
    #[error("no answer in time")]
    Timeout,
    /// The spawner or its session went away before answering.
    #[error("the node's spawner is gone")]
    Gone,
    /// Spawned, but no reference to it reached this node in time.
    #[error("spawned, but no reference to it reached this node in time")]
    NotVisible,
    /// The node could not be reached, or the control stream failed.
    #[error("the node could not be asked: {0}")]
    Unreachable(String),
}

/// Why a remote stop failed. Sorted by what the caller should do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StopError {
    /// The node did not stop it: this node neither owns the actor nor is
    /// the head, it hosts no such actor, or the actor has not ended yet
    /// (the outcome says which).
    #[error("node {node:?} refused to stop {name:?}: {outcome}")]
    Refused {
        /// The node asked.
        node: String,
        /// The actor.
        name: String,
        /// Its answer.
        outcome: StopOutcome,
    },
    /// No such member is up.
    #[error("node {0:?} is not an up member")]
    NoSuchNode(String),
    /// The request or its answer was lost: the actor may or may not stop.
    #[error("stop request to {node:?} failed: {source}")]
    Unavailable {
        /// The node asked.
        node: String,
        /// What happened.
        source: StopUnavailable,
    },
}

/// Why a request to a member on a control stream got no answer.
#[derive(Debug, thiserror::Error)]
enum AskError {
    /// No such member is up.
    #[error("not an up member")]
    NoSuchNode,
    /// It could not be reached.
    #[error(transparent)]
    Connect(flotilla_transport::ConnectError),
    /// The control stream failed or was refused.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// How a stop request was lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StopUnavailable {
    /// No answer within the timeout.
    #[error("no answer in time")]
    Timeout,
    /// The node could not be reached.
    #[error(transparent)]
    Connect(#[from] flotilla_transport::ConnectError),
    /// The control stream failed or was refused.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The node answered something else, or its spawner is gone.
    #[error("the node gave no answer to the stop request")]
    NoAnswer,
}

impl Node {
    /// Spawns `actor` (a kind registered on `node`, and the name it runs
    /// under there) with `args`, and returns a reference usable from this
    /// node.
    ///
    /// Delivery: the request is sent once; if the answer is lost the actor
    /// may or may not run (look it up before retrying under the same name).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("spawn_on").await?;
    /// use std::time::Duration;
    ///
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::ractor::{ActorRef, call_t};
    ///
    /// let counter: ActorRef<CounterMsg> = node
    ///     .spawn_on(node.name(), COUNTER.named("counter"), &Count(40), Duration::from_secs(5))
    ///     .await?;
    /// counter.cast(CounterMsg::Add(Count(2))).unwrap();
    /// assert_eq!(call_t!(counter, CounterMsg::Get, 1_000, Ask).unwrap(), Count(42));
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn spawn_on<M: Message, A: Encode>(
        &self,
        node: &str,
        actor: Named<M, A>,
        args: &A,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SpawnError> {
        let order = SpawnOrder::of::<M>(actor.kind().name(), actor.name(), encode(args));
        let cell = self.spawn_on_raw(node, order, timeout).await?;
        Ok(cell.into())
    }

    /// [`Node::spawn_on`] with the arguments already archived and the
    /// message type the caller will send named (`std::any::type_name`; the
    /// kind's must be the same): what configured children use
    /// ([`Node::config_args`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("spawn_on_raw").await?;
    /// use std::time::Duration;
    ///
    /// use flotilla::SpawnOrder;
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::ractor::{ActorRef, call_t};
    ///
    /// let order = SpawnOrder::of::<CounterMsg>(COUNTER.name(), "raw", flotilla::wire::encode(&Count(7)));
    /// let cell = node.spawn_on_raw(node.name(), order, Duration::from_secs(5)).await?;
    /// let counter: ActorRef<CounterMsg> = cell.into();
    /// assert_eq!(call_t!(counter, CounterMsg::Get, 1_000, Ask).unwrap(), Count(7));
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn spawn_on_raw(
        &self,
        node: &str,
        order: SpawnOrder,
        timeout: Duration,
    ) -> Result<ractor::ActorCell, SpawnError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let name = order.name.clone();
        let name = name.as_str();
        let unavailable = |why| SpawnError::Unavailable {
            node: node.to_owned(),
            why,
        };
        let reply = if node == self.identity.name {
            let req = LocalSpawn {
                order,
                owner: MemberRef::new(self.identity.name.clone(), self.identity.incarnation()),
            };
            match call(&self.spawner, |port| SpawnerMsg::Spawn(req, port), timeout).await {
                Ok(reply) => reply,
                Err(CallError::Timeout(_)) => return Err(unavailable(Unavailable::Timeout)),
                Err(_) => return Err(unavailable(Unavailable::Gone)),
            }
        } else {
            if !self.wait_session(node, timeout).await {
                return Err(SpawnError::NoSuchNode(node.to_owned()));
            }
            let request = ControlRequest::Spawn(order);
            let asked = tokio::time::timeout_at(deadline, self.ask_member(node, &request)).await;
            match asked {
                Err(_) => return Err(unavailable(Unavailable::Timeout)),
                Ok(Err(AskError::NoSuchNode)) => {
                    return Err(SpawnError::NoSuchNode(node.to_owned()));
                }
                Ok(Err(e)) => return Err(unavailable(Unavailable::Unreachable(e.to_string()))),
                Ok(Ok(ControlReply::Spawned(reply))) => reply,
                Ok(Ok(ControlReply::Denied(why))) => {
                    return Err(SpawnError::Denied {
                        node: node.to_owned(),
                        why,
                    });
                }
                Ok(Ok(other)) => {
                    return Err(unavailable(Unavailable::Unreachable(format!(
                        "unexpected answer {other:?}"
                    ))));
                }
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
            if let Some(a) = self.cell_on(node, name) {
                return Ok(a);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable(Unavailable::NotVisible));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the actor `name` that `node` hosts, and returns once it has
    /// ended (it is killed if it ignores its stop for two seconds), so the
    /// caller may start another copy under the same name at once. Only the
    /// node that spawned it (its owner) or the head may; anyone else is
    /// refused ([`StopError::Refused`], counted on the target). The
    /// request goes on a control stream, whose certificate name is the
    /// sender the target checks.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("stop_on").await?;
    /// use std::time::Duration;
    ///
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::ractor::{ActorRef, call_t};
    ///
    /// let counter: ActorRef<CounterMsg> = node
    ///     .spawn_on(node.name(), COUNTER.named("brief"), &Count(0), Duration::from_secs(5))
    ///     .await?;
    /// node.stop_on(node.name(), "brief", Duration::from_secs(5)).await?;
    /// assert!(call_t!(counter, CounterMsg::Get, 1_000, Ask).is_err());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stop_on(
        &self,
        node: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), StopError> {
        let unavailable = |source: StopUnavailable| StopError::Unavailable {
            node: node.to_owned(),
            source,
        };
        let outcome = if node == self.identity.name {
            let req = LocalStop {
                name: name.to_owned(),
                sender: None,
                head: self.view.borrow().head.clone(),
            };
            match call(&self.spawner, |port| SpawnerMsg::Stop(req, port), timeout).await {
                Ok(StopReply(outcome)) => outcome,
                Err(CallError::Timeout(_)) => return Err(unavailable(StopUnavailable::Timeout)),
                Err(_) => return Err(unavailable(StopUnavailable::NoAnswer)),
            }
        } else {
            let request = ControlRequest::Stop {
                name: name.to_owned(),
            };
            match tokio::time::timeout(timeout, self.ask_member(node, &request)).await {
                Ok(Ok(ControlReply::Stop(outcome))) => outcome,
                Ok(Ok(_)) => return Err(unavailable(StopUnavailable::NoAnswer)),
                Ok(Err(AskError::NoSuchNode)) => {
                    return Err(StopError::NoSuchNode(node.to_owned()));
                }
                Ok(Err(AskError::Connect(e))) => {
                    return Err(unavailable(StopUnavailable::Connect(e)));
                }
                Ok(Err(AskError::Stream(e))) => {
                    return Err(unavailable(StopUnavailable::Stream(e)));
                }
                Err(_) => return Err(unavailable(StopUnavailable::Timeout)),
            }
        };
        match outcome {
            StopOutcome::Stopped => Ok(()),
            outcome => Err(StopError::Refused {
                node: node.to_owned(),
                name: name.to_owned(),
                outcome,
            }),
        }
    }

    /// Sends `request` on a control stream to the up member `node` (its
    /// address from the table, its certificate its principal's) and reads
    /// one answer.
    async fn ask_member(
        &self,
        node: &str,
        request: &ControlRequest,
    ) -> Result<ControlReply, AskError> {
        let addr = self
            .view
            .borrow()
            .live()
            .find(|m| m.name == node)
            .and_then(|m| m.addr.parse::<SocketAddr>().ok())
            .ok_or(AskError::NoSuchNode)?;
        let pc = self
            .pool
            .connect(node, addr)
            .await
            .map_err(AskError::Connect)?;
        let hello = self.identity.hello(Purpose::Control);
        let (mut send, mut recv, _, _) = handshake::dial(&pc.connection, &hello).await?;
        send_msg(&mut send, request, DEFAULT_MAX_FRAME).await?;
        let reply = recv_msg::<ControlReply>(&mut recv, DEFAULT_MAX_FRAME).await?;
        let _ = send.finish();
        Ok(reply)
    }

    /// The actor named `name` on the node `node`, if visible from here and
    /// of message type `M` (a name registered on another node is never
    /// taken for it).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("lookup_on").await?;
    /// use std::time::Duration;
    ///
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::ractor::{ActorRef, call_t};
    ///
    /// node.spawn_on(node.name(), COUNTER.named("there"), &Count(3), Duration::from_secs(5))
    ///     .await?;
    /// let counter: ActorRef<CounterMsg> = node.lookup_on(node.name(), "there")?;
    /// assert_eq!(call_t!(counter, CounterMsg::Get, 1_000, Ask).unwrap(), Count(3));
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lookup_on<M: Message>(
        &self,
        node: &str,
        name: &str,
    ) -> Result<ActorRef<M>, LookupError> {
        let cell = self
            .cell_on(node, name)
            .ok_or_else(|| LookupError::NotFound(name.to_owned()))?;
        typed(name, cell)
    }

    /// The actor known under `name` on `node` (on any peer when `None`)
    /// that this node reaches through its own sessions: named so, or
    /// joined to the process group `name` by hand. One named so is taken
    /// first, the most recently spawned of them.
    fn remote_named(&self, node: Option<&str>, name: &str) -> Option<ractor::ActorCell> {
        let group: std::collections::HashSet<ractor::ActorId> =
            ractor::pg::get_members(&name.to_owned())
                .iter()
                .map(ractor::ActorCell::get_id)
                .collect();
        self.sessions
            .reached(node)
            .into_iter()
            .filter_map(|c| {
                let named = c.get_name().as_deref() == Some(name);
                (named || group.contains(&c.get_id())).then(|| ((named, c.get_id().pid()), c))
            })
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, c)| c)
    }

    /// The actor named `name` that this node hosts, if any.
    fn hosted_named(&self, name: &str) -> Option<ractor::ActorCell> {
        ractor::pg::get_members(&name.to_owned())
            .into_iter()
            .find(|c| self.hosted.contains(c.get_id()))
    }

    /// The actor named `name` on the node `node`, if visible from here:
    /// hosted by this node, or reached through this node's own session
    /// with `node` (never through another node of the process).
    fn cell_on(&self, node: &str, name: &str) -> Option<ractor::ActorCell> {
        if node == self.identity.name {
            self.hosted_named(name)
        } else {
            self.remote_named(Some(node), name)
        }
    }

    /// Looks up a named actor anywhere in the cluster: this node's own
    /// first, then one reached through this node's sessions, then any
    /// other actor of this process under that name. An actor spawned
    /// through a spawner is returned only as its own message type: asking
    /// for another is [`LookupError::WrongType`]. For other actors (joined
    /// to a process group by hand) the type is the caller's claim, as with
    /// ractor's registry.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("lookup").await?;
    /// use flotilla::ractor::Message;
    ///
    /// struct Ping;
    /// impl Message for Ping {}
    ///
    /// // No actor of that name runs on this node.
    /// assert!(node.lookup::<Ping>("nobody").is_err());
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lookup<M: Message>(&self, name: &str) -> Result<ActorRef<M>, LookupError> {
        let cell = self
            .hosted_named(name)
            .or_else(|| self.remote_named(None, name))
            .or_else(|| {
                ractor::pg::get_members(&name.to_owned())
                    .into_iter()
                    .find(|c| c.get_id().is_local())
            })
            .ok_or_else(|| LookupError::NotFound(name.to_owned()))?;
        typed(name, cell)
    }

    /// Waits until a named actor is visible from this node, at most
    /// `timeout`; an actor of another message type fails at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("wait_actor").await?;
    /// use std::time::Duration;
    ///
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::ractor::{ActorRef, call_t};
    ///
    /// node.spawn_on(node.name(), COUNTER.named("awaited"), &Count(5), Duration::from_secs(5))
    ///     .await?;
    /// let counter: ActorRef<CounterMsg> = node.wait_actor("awaited", Duration::from_secs(5)).await?;
    /// assert_eq!(call_t!(counter, CounterMsg::Get, 1_000, Ask).unwrap(), Count(5));
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_actor<M: Message>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<ActorRef<M>, LookupError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.lookup(name) {
                Err(LookupError::NotFound(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                found => return found,
            }
        }
    }
}
