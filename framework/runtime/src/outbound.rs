//! Backpressure for remote sends.
//!
//! ractor's `cast` never waits: a message for a remote actor is serialized
//! at once and queued for its session, however far behind the network is.
//! This module counts the bytes serialized for remote actors (by
//! [`remote_type!`](crate::remote_type) payloads) and subtracts the bytes
//! each QUIC cluster stream has accepted; [`cast`] waits while that backlog
//! is over a limit, so a fast sender's memory stays bounded by the limit
//! plus the QUIC send buffers.
//!
//! ```text
//! cast ─► serialize (+bytes) ─► ractor session queue ─► QUIC stream (−bytes) ─► peer
//!   ▲                                                                   │
//!   └──────────── waits while backlog > limit ◄─────────────────────────┘
//! large casts ─► bulk lane: the peer's second endpoint, own threads ──────► peer
//! ```
//!
//! The count is process-wide (all peers together): a slow peer holds back
//! every bounded sender of the process, as a full socket buffer would. When
//! a cluster stream closes, whatever was queued for it is lost with the
//! session, and the count restarts from zero.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use ractor::{ActorRef, Message};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// Default backlog above which [`cast`] waits: 2 MiB.
pub const DEFAULT_LIMIT: u64 = 2 << 20;

static BACKLOG: AtomicU64 = AtomicU64::new(0);
static DRAINED: Notify = Notify::const_new();
static LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_LIMIT);
static BULK_BYTES: AtomicU64 = AtomicU64::new(0);

/// Payload bytes this process has sent on the bulk lane.
pub fn bulk_bytes() -> u64 {
    BULK_BYTES.load(Ordering::Relaxed)
}

/// Records `n` bytes serialized for a remote actor.
#[doc(hidden)]
pub fn enqueued(n: usize) {
    BACKLOG.fetch_add(n as u64, Ordering::Relaxed);
}

fn written(n: usize) {
    let _ = BACKLOG.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
        Some(b.saturating_sub(n as u64))
    });
    DRAINED.notify_waiters();
}

/// Bytes serialized for remote actors that no QUIC stream has accepted yet.
pub fn backlog() -> u64 {
    BACKLOG.load(Ordering::Relaxed)
}

/// Sets the backlog above which [`cast`] waits (process-wide).
pub fn set_limit(bytes: u64) {
    LIMIT.store(bytes.max(1), Ordering::Relaxed);
}

/// Waits until the backlog is at or under the limit.
///
/// Cancel safety: cancelling the wait has no effect.
pub async fn ready() {
    loop {
        let drained = DRAINED.notified();
        if backlog() <= LIMIT.load(Ordering::Relaxed) {
            return;
        }
        drained.await;
    }
}

/// Serialized casts at least this large travel on the bulk lane.
pub const BULK_THRESHOLD: usize = 256 << 10;

/// Why [`cast`] could not send.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CastError {
    /// The message type cannot be sent to a remote actor.
    #[error("message cannot be serialized for a remote actor: {0}")]
    Serialize(String),
    /// The actor is gone, or the session or bulk lane to its node failed.
    /// Nothing is retried: retry with an idempotent message if needed.
    #[error("message not delivered: {0}")]
    Send(String),
}

/// Casts `msg` to `actor` with backpressure, and sends large messages on
/// the bulk lane.
///
/// - Local actor: a plain cast.
/// - Remote actor, serialized message under [`BULK_THRESHOLD`]: waits while
///   the session backlog is over the limit, then goes over the ractor
///   session like any cast.
/// - Larger: goes on the bulk lane to the actor's node (see
///   [`crate::bulk`]: an endpoint and threads of its own), so it never holds
///   up small messages and calls on the session; waits for QUIC flow
///   control, which bounds what is buffered.
///
/// Delivery: at most once. Order holds among small messages and among bulk
/// messages from one sender to one node, not between the two lanes.
/// Cancel safety: if cancelled, the message may or may not have been sent.
pub async fn cast<M: Message>(actor: &ActorRef<M>, msg: M) -> Result<(), CastError> {
    let ractor::ActorId::Remote { node_id, pid } = actor.get_id() else {
        return actor.cast(msg).map_err(|e| CastError::Send(e.to_string()));
    };
    let serialized = msg
        .serialize()
        .map_err(|e| CastError::Serialize(format!("{e:?}")))?;
    if let ractor::message::SerializedMessage::Cast { variant, args, .. } = &serialized
        && args.len() >= BULK_THRESHOLD
        && let Some(node) = crate::node::current()
        && let Some(peer) = node.peer_of(node_id)
    {
        // Counted when serialized; it never enters the session stream.
        written(args.len());
        node.lane
            .send(&node, &peer, pid, variant.clone(), args)
            .await
            .map_err(CastError::Send)?;
        BULK_BYTES.fetch_add(args.len() as u64, Ordering::Relaxed);
        return Ok(());
    }
    ready().await;
    actor
        .get_cell()
        .send_serialized(serialized)
        .map_err(|e| CastError::Send(e.to_string()))
}

/// The write half of a cluster stream, counting the bytes QUIC accepts.
pub(crate) struct CountingWrite<W> {
    pub(crate) inner: W,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWrite<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            written(*n);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A closed stream never writes what was queued for it; since the count
/// is not kept per peer, forget the whole backlog rather than hold every
/// bounded sender back forever. The count rebuilds from the next sends.
impl<W> Drop for CountingWrite<W> {
    fn drop(&mut self) {
        BACKLOG.store(0, Ordering::Relaxed);
        DRAINED.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn waiters_resume_once_writes_drain_the_backlog() {
        set_limit(100);
        enqueued(250);
        let waiter = tokio::spawn(ready());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "250 bytes queued is over the limit");
        let mut w = CountingWrite { inner: Vec::new() };
        w.write_all(&[0u8; 200]).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("woken once under the limit")
            .unwrap();
        assert_eq!(backlog(), 50);
        w.write_all(&[0u8; 80]).await.unwrap();
        assert_eq!(backlog(), 0, "never below zero");
        enqueued(500);
        drop(w);
        assert_eq!(backlog(), 0, "a closed stream releases waiting senders");
        set_limit(DEFAULT_LIMIT);
    }
}
