//! # Room `head/`: membership and the head's durable state
//!
//! Owns the head service (this file: the member table and its failure
//! detector), its store on disk ([`head_store`]), the lease that makes
//! one head of a set primary ([`head_lease`]) and the mirror of the
//! store that follows the lease ([`head_replica`]). Drives
//! [`flotilla_proto::membership`], [`flotilla_proto::head`] and
//! [`flotilla_proto::lease`].
//!
//! May import: the shared files only.
//!
//! The head service: the member table and its failure detector, which the
//! head's control streams share. Every change is published on the node's
//! member-table watch, which the head's own parts (mesh, spawner relay)
//! and its control streams follow.
//!
//! ```text
//! control stream ─► HeadSession (proto) ─┐
//! control stream ─► HeadSession (proto) ─┼─► Membership (proto) ─► watch<Table>
//! detector task: poll_down at poll_timeout ┘
//! ```

pub mod head_lease;
pub mod head_replica;
pub mod head_store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_proto::ids::MemberName;
use flotilla_proto::membership::{DetectorConfig, JoinRequest, Membership};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::now;
use crate::head::head_store::HeadStore;
use crate::table::Table;

/// The head's member table.
pub(crate) struct HeadService {
    name: MemberName,
    membership: Mutex<Membership>,
    view: watch::Sender<Table>,
}

impl HeadService {
    /// A table holding only the head itself (`local`), published on `view`.
    pub(crate) fn new(
        local: JoinRequest,
        detector: DetectorConfig,
        view: watch::Sender<Table>,
    ) -> Self {
        let name = local.name.clone();
        let mut membership = Membership::new(detector);
        membership.add_local(now(), local);
        let head = Self {
            name,
            membership: Mutex::new(membership),
            view,
        };
        head.with(|_| ());
        head
    }

    /// The head's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A receiver of the member table.
    pub(crate) fn watch(&self) -> watch::Receiver<Table> {
        self.view.subscribe()
    }

    /// Runs `f` on the table, then publishes it if it changed.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        let mut m = self.membership.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut m);
        self.view.send_if_modified(|t| {
            if t.version == m.version() && !t.members.is_empty() {
                return false;
            }
            t.version = m.version();
            t.head = self.name.clone();
            t.members = m.view();
            if t.revoked != m.revoked() {
                t.revoked = m.revoked().to_vec();
            }
            true
        });
        r
    }

    /// Adds `serials` to the revoked certificates handed to every member
    /// (revocations only grow); the number that were not revoked yet.
    pub(crate) fn revoke(&self, serials: Vec<Vec<u8>>) -> usize {
        self.with(|m| {
            let mut all = m.revoked().to_vec();
            let known = all.len();
            all.extend(serials);
            all.sort();
            all.dedup();
            let added = all.len() - known;
            if added > 0 {
                m.set_revoked(all);
            }
            added
        })
    }

    /// Follows the CA's revocation list at `path` (checked against the CA
    /// certificates `ca`) until `stop`: read at start and whenever its
    /// size or modification time changes (looked at every `every`), and
    /// handed to every member with the table. A list that does not check
    /// is logged and the one in force kept; revocations only grow (a list
    /// that disappears, or an older copy naming fewer, withdraws none).
    ///
    /// With a `store`, each revocation is written to it too, so that it
    /// stays in force after a restart or a takeover that finds no list, or
    /// an older one ([`HeadService::revoke`] those the store holds at
    /// start).
    pub(crate) async fn follow_revocations(
        &self,
        path: std::path::PathBuf,
        ca: Vec<rustls::pki_types::CertificateDer<'static>>,
        store: Option<Arc<HeadStore>>,
        every: Duration,
        stop: CancellationToken,
    ) {
        let mut seen = None;
        loop {
            let stamp = std::fs::metadata(&path)
                .ok()
                .map(|m| (m.len(), m.modified().ok()));
            if stamp != seen {
                seen = stamp;
                // Revocations only grow while the head runs: a list that
                // disappears, or an older copy naming fewer, withdraws none
                // of those already in force.
                match flotilla_transport::certs::load_revocations(&path, &ca) {
                    Ok(Some(serials)) => {
                        let added = self.revoke(serials.clone());
                        if added > 0 {
                            tracing::warn!(added, path = %path.display(), "revocation list loaded; revoked certificates are refused and their streams closed");
                        }
                        if let Some(store) = &store
                            && let Err(e) = store.add_revoked(&serials)
                        {
                            tracing::error!(error = %e, "NODE-AUTH-028: the revocations are in force but not stored: a restart without the list would not know them");
                        }
                    }
                    Ok(None) => {
                        if self.with(|m| !m.revoked().is_empty()) {
                            tracing::error!(path = %path.display(), "the revocation list is gone; the revocations already in force stay");
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "revocation list not applied; the revocations already in force stay")
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Marks silent members down at the failure detector's deadlines, until
    /// `stop`, waking at least every `idle`; each pass ticks `pulse`.
    pub(crate) async fn run_detector(
        &self,
        stop: CancellationToken,
        idle: Duration,
        pulse: watch::Sender<u64>,
    ) {
        loop {
            // Fault injection: `node::heartbeat=pause` wedges this loop.
            fail::fail_point!("node::heartbeat");
            pulse.send_modify(|n| *n = n.wrapping_add(1));
            let (deadline, downed) = self.with(|m| {
                let downed = m.poll_down(now());
                let forgotten = m.poll_forget(now());
                if !forgotten.is_empty() {
                    tracing::debug!(?forgotten, "drivers and tools that left are forgotten");
                }
                (m.poll_timeout(), downed)
            });
            for name in downed {
                tracing::warn!(node = %name, "member marked down: no heartbeat within the threshold");
            }
            let wake = deadline.map_or_else(
                || tokio::time::Instant::now() + idle,
                tokio::time::Instant::from_std,
            );
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::incarnation::Incarnation;
    use flotilla_proto::membership::MemberState;
    use flotilla_proto::resources::Resources;

    fn join(name: &str) -> JoinRequest {
        JoinRequest {
            name: name.into(),
            addr: "127.0.0.1:1".into(),
            bulk_addr: "127.0.0.1:2".into(),
            host: "h".into(),
            incarnation: Incarnation::new(1),
            resources: Resources::default(),
            held: Vec::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_member_is_marked_down_on_tokio_time() {
        let config = DetectorConfig::default();
        let head = std::sync::Arc::new(HeadService::new(
            join("head"),
            config,
            watch::channel(Table::default()).0,
        ));
        let mut view = head.watch();
        assert_eq!(view.borrow().members.len(), 1);
        head.with(|m| m.join(now(), join("n1"), flotilla_proto::role::Role::Worker))
            .unwrap();
        assert_eq!(view.borrow_and_update().members.len(), 2);
        let stop = CancellationToken::new();
        let detector = tokio::spawn({
            let (head, stop) = (std::sync::Arc::clone(&head), stop.clone());
            async move {
                head.run_detector(stop, config.heartbeat_interval, watch::channel(0).0)
                    .await
            }
        });
        let started = tokio::time::Instant::now();
        view.wait_for(|t| t.get("n1").is_some_and(|m| m.state == MemberState::Down))
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(
            took > config.down_after && took < config.down_after + Duration::from_millis(10),
            "{took:?}"
        );
        stop.cancel();
        detector.await.unwrap();
    }
}
