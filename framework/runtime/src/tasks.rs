//! One owner for a node's tasks. Every task of a node is spawned here: tied
//! to the node's shutdown and waited for when the node stops, so nothing
//! outlives the node that started it.
//!
//! ```text
//! Tasks::spawn ──► tracked task, dropped at shutdown if still running
//! Tasks::spawn_graceful ──► tracked task handed a token; it finishes its
//!                           own work (a clean leave) when the token fires
//! Tasks::shutdown ──► cancel every token, wait for every task
//! ```

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The tasks of one node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Tasks {
    /// An owner with no tasks yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Spawns `future` on the current runtime; it is dropped at shutdown.
    pub(crate) fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_on(&tokio::runtime::Handle::current(), future);
    }

    /// Spawns `future` on `runtime`; it is dropped at shutdown.
    pub(crate) fn spawn_on<F>(&self, runtime: &tokio::runtime::Handle, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cancel = self.cancel.clone();
        self.tracker.spawn_on(
            async move {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = future => {}
                }
            },
            runtime,
        );
    }

    /// Spawns the task `make` builds from a token that fires at shutdown;
    /// the task ends itself (after finishing what it must) and shutdown
    /// waits for it.
    pub(crate) fn spawn_graceful<F>(&self, make: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(make(self.cancel.child_token()));
    }

    /// Cancels every task and waits until all have ended.
    pub(crate) async fn shutdown(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn shutdown_drops_plain_tasks_and_waits_for_graceful_ones() {
        let tasks = Tasks::new();
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Flag(Arc::clone(&dropped));
        tasks.spawn(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        let finished = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&finished);
        tasks.spawn_graceful(|token| async move {
            token.cancelled().await;
            // Work after the signal: a leave message, say.
            tokio::time::sleep(Duration::from_millis(50)).await;
            done.store(true, Ordering::SeqCst);
        });
        tasks.shutdown().await;
        assert!(dropped.load(Ordering::SeqCst));
        assert!(finished.load(Ordering::SeqCst));
    }
}
