//! Sending to actors anywhere, with backpressure, and large messages on
//! the bulk lane: a node's [`Outbound`] handle.
//!
//! ractor's `cast` never waits: a message for a remote actor is serialized
//! at once and queued for its session, however far behind the network is.
//! [`Outbound::cast`] counts the bytes it serializes for remote actors
//! against the node's backlog (the bytes its cluster streams have not yet
//! accepted) and waits while that is over the limit, so a fast sender's
//! memory stays bounded by the limit plus the QUIC send buffers.
//!
//! ```text
//! Outbound::cast ─ local actor ─────────────────────────────► mailbox
//!        │ remote, < 256 KiB: wait for the backlog ─► ractor session ─► peer
//!        └ remote, ≥ 256 KiB ─► bulk lane (the peer's second endpoint, own threads) ─► peer
//! ```

use std::sync::Arc;

use flotilla_proto::bulk::BulkHeader;
use ractor::{ActorRef, Message, MessagingErr};
use tokio::sync::watch;

use crate::identity::Identity;
use crate::net::backlog::Backlog;
use crate::net::bulk::{Lane, LaneSendError};
use crate::net::sessions::Sessions;
use crate::table::Table;

/// Serialized casts at least this large travel on the bulk lane.
pub const BULK_THRESHOLD: usize = 256 << 10;

pub use crate::net::backlog::DEFAULT_LIMIT;

/// Why [`Outbound::cast`] could not send. Sorted by what the caller should
/// do.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum CastError<M> {
    /// The actor is gone, or the session to its node is; nothing was sent
    /// and the message comes back. Send it to another actor.
    #[error("the actor is gone or its node unreachable; nothing was sent")]
    Gone(M),
    /// The bulk lane to the actor's node failed after the message was
    /// serialized: it is lost (delivery is at most once). Retry with an
    /// idempotent message.
    #[error("the bulk lane failed: {0}")]
    Lane(LaneSendError),
    /// The actor's session closed as the message was handed to it: it is
    /// lost. Retry with an idempotent message.
    #[error("the session closed while sending")]
    Closed,
    /// The message type cannot travel to a remote actor (its payloads are
    /// not `remote_type!`s); the message comes back. A programming error.
    #[error("the message type cannot be sent to a remote actor; make its payloads remote_type!s")]
    NotRemote(M),
}

/// Debug without the message (message types need not be `Debug`).
impl<M> std::fmt::Debug for CastError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gone(_) => f.write_str("Gone(..)"),
            Self::Lane(e) => f.debug_tuple("Lane").field(e).finish(),
            Self::Closed => f.write_str("Closed"),
            Self::NotRemote(_) => f.write_str("NotRemote(..)"),
        }
    }
}

struct Links {
    identity: Arc<Identity>,
    backlog: Arc<Backlog>,
    lane: Arc<Lane>,
    sessions: Sessions,
    view: watch::Receiver<Table>,
}

/// A node's way out: bounded casts to any actor. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let node = flotilla::node::doc_example::head("outbound").await?;
/// use std::time::Duration;
/// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
/// let counter = node
///     .spawn_on(node.name(), COUNTER.named("c"), &Count(0), Duration::from_secs(5))
///     .await?;
/// let outbound = node.outbound();
/// // Waits while the node's backlog is over its limit (a remote actor's
/// // large messages go on the bulk lane).
/// outbound.cast(&counter, CounterMsg::Add(Count(42))).await.ok();
/// let count = flotilla::call::call(&counter, |r| CounterMsg::Get(Ask, r), Duration::from_secs(5)).await?;
/// assert_eq!(count, Count(42));
/// assert_eq!((outbound.backlog(), outbound.bulk_bytes()), (0, 0), "nothing went out");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Outbound {
    links: Option<Arc<Links>>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field(
                "node",
                &self.links.as_ref().map(|l| l.identity.name.as_str()),
            )
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// The handle of a process that runs no node: it reaches local actors
    /// only (a remote one is [`CastError::Gone`]).
    pub fn local() -> Self {
        Self { links: None }
    }

    /// The handle of a node.
    pub(crate) fn new(
        identity: Arc<Identity>,
        backlog: Arc<Backlog>,
        lane: Arc<Lane>,
        sessions: Sessions,
        view: watch::Receiver<Table>,
    ) -> Self {
        Self {
            links: Some(Arc::new(Links {
                identity,
                backlog,
                lane,
                sessions,
                view,
            })),
        }
    }

    /// Bytes serialized for remote actors that no cluster stream has
    /// accepted yet.
    pub fn backlog(&self) -> u64 {
        self.links.as_ref().map_or(0, |l| l.backlog.bytes())
    }

    /// Sets the backlog above which [`Outbound::cast`] waits (for this
    /// node; default [`DEFAULT_LIMIT`]).
    pub fn set_limit(&self, bytes: u64) {
        if let Some(l) = &self.links {
            l.backlog.set_limit(bytes);
        }
    }

    /// Payload bytes this node has sent on the bulk lane.
    pub fn bulk_bytes(&self) -> u64 {
        self.links.as_ref().map_or(0, |l| l.lane.sent_bytes())
    }

    /// Casts `msg` to `actor` with backpressure, large messages on the bulk
    /// lane.
    ///
    /// - Local actor: a plain cast.
    /// - Remote actor, serialized message under [`BULK_THRESHOLD`]: waits
    ///   while the node's backlog is over the limit, then goes over the
    ///   ractor session like any cast.
    /// - Larger: goes on the bulk lane to the actor's node, so it never
    ///   holds up small messages and calls on the session; waits for QUIC
    ///   flow control, which bounds what is buffered.
    ///
    /// Delivery: at most once. Order holds among small messages and among
    /// bulk messages from one sender to one node, not between the two
    /// lanes. Cancel safety: if cancelled, the message may or may not have
    /// been sent.
    pub async fn cast<M: Message>(&self, actor: &ActorRef<M>, msg: M) -> Result<(), CastError<M>> {
        let ractor::ActorId::Remote { node_id, pid } = actor.get_id() else {
            return actor.cast(msg).map_err(|e| match e {
                MessagingErr::SendErr(m) => CastError::Gone(m),
                _ => CastError::Closed,
            });
        };
        if !M::serializable() {
            return Err(CastError::NotRemote(msg));
        }
        let Some(links) = &self.links else {
            return Err(CastError::Gone(msg));
        };
        if actor.get_status() >= ractor::ActorStatus::Draining {
            return Err(CastError::Gone(msg));
        }
        let serialized = msg.serialize().map_err(|_| CastError::Closed)?;
        if let ractor::message::SerializedMessage::Cast { variant, args, .. } = &serialized
            && args.len() >= BULK_THRESHOLD
            && let Some(peer) = links.sessions.peer_of(node_id)
        {
            return links
                .lane
                .send(
                    &links.identity,
                    &links.view,
                    &peer,
                    BulkHeader {
                        pid,
                        variant: variant.clone(),
                    },
                    args,
                )
                .await
                .map_err(CastError::Lane);
        }
        let len = match &serialized {
            ractor::message::SerializedMessage::Cast { args, .. } => args.len(),
            ractor::message::SerializedMessage::Call { args, .. } => args.len(),
            _ => 0,
        };
        links.backlog.enqueued(len);
        links.backlog.ready().await;
        actor
            .get_cell()
            .send_serialized(serialized)
            .map_err(|_| CastError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};

    struct Sink;

    impl Actor for Sink {
        type Msg = u64;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<u64>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_local_cast_is_plain_and_a_stopped_actor_hands_the_message_back() {
        let (actor, handle) = Actor::spawn(None, Sink, ()).await.unwrap();
        let out = Outbound::local();
        out.cast(&actor, 1).await.unwrap();
        actor.stop(None);
        handle.await.unwrap();
        assert!(matches!(out.cast(&actor, 7).await, Err(CastError::Gone(7))));
        assert_eq!(out.backlog(), 0);
    }
}
