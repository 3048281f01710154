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
//! ```
//!
//! The count is process-wide (all peers together): a slow peer holds back
//! every bounded sender of the process, as a full socket buffer would. When
//! a cluster stream closes, whatever was queued for it is lost with the
//! session, and the count restarts from zero.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use ractor::{ActorRef, Message, MessagingErr};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// Default backlog above which [`cast`] waits: 2 MiB.
pub const DEFAULT_LIMIT: u64 = 2 << 20;

static BACKLOG: AtomicU64 = AtomicU64::new(0);
static DRAINED: Notify = Notify::const_new();
static LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_LIMIT);

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

/// Casts `msg` to `actor`, first waiting while the remote-send backlog is
/// over the limit. For a local actor it casts at once.
///
/// Delivery is that of ractor's `cast`: at most once, in order per sender
/// and receiver while the session lives. Cancel safety: if cancelled while
/// waiting, the message is dropped unsent.
pub async fn cast<M: Message>(actor: &ActorRef<M>, msg: M) -> Result<(), MessagingErr<M>> {
    if !actor.get_id().is_local() {
        ready().await;
    }
    actor.cast(msg)
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
