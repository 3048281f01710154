//! `node head --lease-store URL`: one head of a head set. It waits as a
//! standby (answering nobody, `flotilla_head_role{role="standby"}` on its
//! metrics) until it holds the set's lease, copies the state the former
//! primary left beside the lease into its own state directory, and starts
//! as the head from it, mirroring each change there in turn.
//!
//! ```text
//! standby: acquire(lease) ── held ──► restore(state) ──► Node::builder
//!                                                         .head_replica(mirror)
//!                                                         .incarnation_above(former's)
//! primary: lease renewed in its task; lost ──► the process ends at once (exit 6)
//! ```

use std::time::Duration;

use flotilla::head_lease::{Candidate, LeaseGuard, LeaseStore};
use flotilla::head_replica::HeadReplica;
use flotilla::{NodeBuilder, NodeConfig};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::lease::LeaseConfig;
use tokio_util::sync::CancellationToken;

use crate::LeaseSettings;

/// Why a head of a head set could not take its place.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeadSetError {
    /// The lease store's URL does not name a store.
    #[error("NODE-LEASE-006: lease_store {url:?}: {why}")]
    Store {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The state the former primary left could not be copied.
    #[error(transparent)]
    Restore(#[from] flotilla::head_replica::RestoreError),
    /// The mirror's runtime could not start.
    #[error("NODE-LEASE-006: cannot start the state mirror: {0}")]
    Mirror(std::io::Error),
}

/// A lease held, and what the head starts with.
pub struct Leased {
    /// Whether the lease is still held.
    pub guard: LeaseGuard,
    mirror: HeadReplica,
    floor: Incarnation,
}

impl Leased {
    /// `builder` set to mirror its store and run above the former
    /// primary's incarnation.
    pub fn apply(self, builder: NodeBuilder) -> (NodeBuilder, LeaseGuard) {
        let builder = builder
            .head_replica(self.mirror)
            .incarnation_above(self.floor);
        (builder, self.guard)
    }
}

/// Waits as a standby until this head holds the lease (or `stop` is
/// cancelled: `Ok(None)`), then copies the set's state into `config`'s
/// state folder.
pub async fn take_lease(
    config: &NodeConfig,
    lease: &LeaseSettings,
    stop: CancellationToken,
) -> Result<Option<Leased>, HeadSetError> {
    let (store, prefix) =
        flotilla::object_url::open_url(&lease.url).map_err(|why| HeadSetError::Store {
            url: lease.url.clone(),
            why,
        })?;
    flotilla::head_lease::report_standby();
    let address = config.advertise.unwrap_or(config.listen).to_string();
    tracing::info!(lease = %lease.url, duration = ?lease.duration, "standby: waiting for the head lease");
    let me = Candidate {
        holder: MemberName::from(config.name.clone()),
        address,
        incarnation: Incarnation::new(0),
    };
    let lease_config = LeaseConfig {
        duration: lease.duration,
    };
    let started = std::time::Instant::now();
    let Some(held) = flotilla::head_lease::acquire(
        LeaseStore::new(std::sync::Arc::clone(&store), &prefix),
        me,
        lease_config,
        stop,
    )
    .await
    else {
        return Ok(None);
    };
    let dir = config.state_folder();
    let mirror = HeadReplica::new(
        std::sync::Arc::clone(&store),
        prefix.clone(),
        held.guard.clone(),
        held.term,
    )
    .map_err(HeadSetError::Mirror)?;
    let new_set =
        held.former.is_none() && flotilla::head_replica::is_empty(&store, &prefix).await?;
    if !new_set {
        let restored = flotilla::head_replica::restore(&store, &prefix, dir, held.term).await?;
        tracing::info!(
            term = held.term,
            former = ?held.former.as_ref().map(|f| format!("{} at {}", f.holder, f.address)),
            jobs = restored.jobs,
            groups = restored.groups,
            revoked = restored.revoked,
            waited = ?started.elapsed(),
            "took the head lease: starting as the primary from the set's state"
        );
    }
    // This term's folder is written whole before the head serves: the
    // set's first primary from its own directory, a takeover from what it
    // just copied.
    let seeding = dir.to_path_buf();
    let (mirror, seeded) = tokio::task::spawn_blocking(move || {
        let seeded = flotilla::head_replica::seed(&seeding, &mirror);
        (mirror, seeded)
    })
    .await
    .map_err(|e| HeadSetError::Mirror(std::io::Error::other(e.to_string())))?;
    let seeded = seeded?;
    if new_set {
        tracing::info!(
            term = held.term,
            jobs = seeded.jobs,
            groups = seeded.groups,
            revoked = seeded.revoked,
            "took the new head set's lease: starting as its primary from this head's state"
        );
    }
    match flotilla::head_replica::prune(&store, &prefix, held.term).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(terms = n, "removed the state of the former terms"),
        Err(e) => tracing::warn!(error = %e, "the state of the former terms stays beside this one"),
    }
    Ok(Some(Leased {
        floor: held
            .former
            .map_or(Incarnation::default(), |f| f.incarnation),
        guard: held.guard,
        mirror,
    }))
}

/// The exit code of a head that lost its lease: it stops at once, with
/// no graceful shutdown (its jobs and groups are the new primary's now).
pub const LOST_EXIT_CODE: u8 = 6;

/// Feeds systemd's watchdog every third of `interval` while a standby
/// waits (it has no heartbeat loop yet).
pub async fn feed_while_standby(interval: Duration) {
    let mut tick = tokio::time::interval(interval / 3);
    loop {
        tick.tick().await;
        crate::systemd::watchdog();
    }
}
