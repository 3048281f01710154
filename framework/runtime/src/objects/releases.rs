//! Releasing objects in lots: a reader done with objects other nodes lent
//! it hands them back without waiting on each release.

use std::time::Duration;

use crate::objects::{ObjectRef, Objects};

/// Objects no longer needed, released to their owners a few at a time
/// (one request per owner for each lot), without holding up the caller,
/// who waits for what is still on its way before it ends. A release that
/// does not arrive leaves the object to its lease.
pub struct Releases {
    objects: Option<Objects>,
    pending: Vec<ObjectRef>,
    sending: tokio::task::JoinSet<()>,
}

/// Result objects released in one lot.
const RELEASE_LOT: usize = 32;

impl Releases {
    /// Releases through `objects` (none: nothing is sent).
    pub fn new(objects: Option<Objects>) -> Self {
        Self {
            objects,
            pending: Vec::new(),
            sending: tokio::task::JoinSet::new(),
        }
    }

    /// Queues `object`; sends the lot once it is full (or when `now`).
    pub fn release(&mut self, object: Option<ObjectRef>, now: bool) {
        self.pending.extend(object);
        if self.pending.len() >= RELEASE_LOT || (now && !self.pending.is_empty()) {
            self.flush();
        }
    }

    fn flush(&mut self) {
        // Forget the lots already sent: the set holds those on their way.
        while self.sending.try_join_next().is_some() {}
        let lot = std::mem::take(&mut self.pending);
        if let (Some(objects), false) = (self.objects.clone(), lot.is_empty()) {
            self.sending.spawn(async move {
                if let Err(e) = objects.release_all(&lot).await {
                    tracing::debug!(error = %e, "result objects not released; their lease ends them");
                }
            });
        }
    }

    /// Sends what is queued and waits up to `within` for every lot.
    pub async fn finish(&mut self, within: Duration) {
        self.flush();
        let sending = std::mem::take(&mut self.sending);
        let _ = tokio::time::timeout(within, sending.join_all()).await;
    }
}
