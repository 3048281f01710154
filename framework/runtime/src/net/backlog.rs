//! The bytes a node has serialized for remote actors and its cluster
//! streams have not yet accepted: the measure that bounded sends wait on.
//!
//! ```text
//! Outbound::cast ─► serialize (+bytes) ─► ractor session queue ─► CountingWrite (−bytes) ─► QUIC
//!       ▲                                                                    │
//!       └──────────────── waits while backlog > limit ◄───────────────────────┘
//! ```
//!
//! One count per node, all peers together: a slow peer holds back every
//! bounded sender of the node, as a full socket buffer would. When a cluster
//! stream closes, whatever was queued for it is lost with its session, and
//! the count restarts from zero.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// Default backlog above which bounded sends wait: 2 MiB.
pub const DEFAULT_LIMIT: u64 = 2 << 20;

/// A node's backlog counter.
#[derive(Debug)]
pub(crate) struct Backlog {
    bytes: AtomicU64,
    limit: AtomicU64,
    drained: Notify,
}

impl Default for Backlog {
    fn default() -> Self {
        Self {
            bytes: AtomicU64::new(0),
            limit: AtomicU64::new(DEFAULT_LIMIT),
            drained: Notify::new(),
        }
    }
}

impl Backlog {
    /// Records `n` bytes serialized for a remote actor.
    pub(crate) fn enqueued(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records `n` bytes accepted by a stream (never below zero).
    pub(crate) fn written(&self, n: usize) {
        crate::counters::sent_bytes("cluster", n as u64);
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(n as u64))
            });
        self.drained.notify_waiters();
    }

    /// Forgets everything queued: a stream closed with it.
    pub(crate) fn reset(&self) {
        self.bytes.store(0, Ordering::Relaxed);
        self.drained.notify_waiters();
    }

    /// Bytes serialized and not yet accepted.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Sets the backlog above which [`Backlog::ready`] waits.
    pub(crate) fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Waits until the backlog is at or under the limit.
    ///
    /// Cancel safety: cancelling the wait has no effect.
    pub(crate) async fn ready(&self) {
        loop {
            let drained = self.drained.notified();
            if self.bytes() <= self.limit.load(Ordering::Relaxed) {
                return;
            }
            drained.await;
        }
    }
}

/// The write half of a cluster stream, counting the bytes QUIC accepts
/// against its node's backlog.
pub(crate) struct CountingWrite<W> {
    pub(crate) inner: W,
    pub(crate) backlog: Arc<Backlog>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWrite<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.backlog.written(*n);
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
        self.backlog.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn waiters_resume_once_writes_drain_the_backlog() {
        let backlog = Arc::new(Backlog::default());
        backlog.set_limit(100);
        backlog.enqueued(250);
        let waiter = tokio::spawn({
            let b = Arc::clone(&backlog);
            async move { b.ready().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "250 bytes queued is over the limit");
        let mut w = CountingWrite {
            inner: Vec::new(),
            backlog: Arc::clone(&backlog),
        };
        w.write_all(&[0u8; 200]).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("woken once under the limit")
            .unwrap();
        assert_eq!(backlog.bytes(), 50);
        w.write_all(&[0u8; 80]).await.unwrap();
        assert_eq!(backlog.bytes(), 0, "never below zero");
        backlog.enqueued(500);
        drop(w);
        assert_eq!(
            backlog.bytes(),
            0,
            "a closed stream releases waiting senders"
        );
    }

    #[test]
    fn two_nodes_count_apart() {
        let (a, b) = (Backlog::default(), Backlog::default());
        a.enqueued(10);
        assert_eq!((a.bytes(), b.bytes()), (10, 0));
    }
}
