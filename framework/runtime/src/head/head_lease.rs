//! The head's lease on a store with conditional writes: the async shell
//! of [`flotilla_proto::lease::HeadLease`]. A head started with a lease
//! store waits as a standby until it holds the lease, then keeps renewing
//! it in a task of its own; the [`LeaseGuard`] it gets says, at any
//! moment, whether it may still act as the primary, and fires once it may
//! not.
//!
//! ```text
//! HeadLease ── poll_op ──► LeaseStore (get / put If-None-Match: * / put If-Match: version)
//!     ▲    ◄── Seen, Written ──┘
//!     └─ events ──► Acquired: acquire() returns ─► LeaseGuard (valid_until, lost)
//!                   Lost:     LeaseGuard::lost fires
//! ```
//!
//! The lease is the object `lease` under the store's prefix; a head set
//! shares one prefix (see [`crate::head::head_replica`] for the state beside it).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::lease::{
    HeadLease, LeaseConfig, LeaseEvent, LeaseOp, LeaseRecord, LostWhy, Seen, Written,
};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use tokio_util::sync::CancellationToken;

/// Reports this head as a standby on `/metrics` (`flotilla_head_role`),
/// until it starts as the primary.
pub fn report_standby() {
    crate::counters::register();
    crate::counters::head_role("standby");
}

/// The object the lease lives in, under the head set's prefix.
pub const LEASE_OBJECT: &str = "lease";

/// How long one request to the lease store may take.
const REQUEST_WITHIN: Duration = Duration::from_secs(2);

/// The lease record in an object store.
#[derive(Debug, Clone)]
pub struct LeaseStore {
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl LeaseStore {
    /// The lease under `prefix` of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &Path) -> Self {
        Self {
            path: prefix.clone().join(LEASE_OBJECT),
            store,
        }
    }

    /// Reads the record and its version; `None` if the store cannot be
    /// read or the record is not readable (both logged).
    pub async fn read(&self) -> Option<Seen> {
        let got = match self.store.get(&self.path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Some(Seen::Absent),
            Err(e) => {
                tracing::warn!(error = %e, "NODE-LEASE-001: cannot read the head lease");
                return None;
            }
        };
        let version = got.meta.e_tag.clone();
        let bytes = match got.bytes().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "NODE-LEASE-001: cannot read the head lease");
                return None;
            }
        };
        let Some(version) = version else {
            tracing::error!(
                "NODE-LEASE-002: the lease store gives no version (ETag); it cannot hold a lease"
            );
            return None;
        };
        match std::str::from_utf8(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|t| LeaseRecord::decode(t).map_err(|e| e.to_string()))
        {
            Ok(record) => Some(Seen::Held { record, version }),
            Err(why) => {
                tracing::error!(error = %why, "NODE-LEASE-003: the head lease record is not readable; no head takes it over until it is removed");
                None
            }
        }
    }

    /// Writes `record` under `mode` (create or replace).
    async fn write(&self, record: &LeaseRecord, mode: PutMode) -> Written {
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let put = self
            .store
            .put_opts(&self.path, record.encode().into_bytes().into(), options);
        match tokio::time::timeout(REQUEST_WITHIN, put).await {
            Ok(Ok(done)) => match done.e_tag {
                Some(v) => Written::Done(v),
                None => {
                    tracing::error!(
                        "NODE-LEASE-002: the lease store gives no version (ETag); it cannot hold a lease"
                    );
                    Written::Failed
                }
            },
            Ok(Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            )) => Written::Conflict,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "NODE-LEASE-001: cannot write the head lease");
                Written::Failed
            }
            Err(_) => {
                tracing::warn!(
                    "NODE-LEASE-001: the head lease write took longer than {REQUEST_WITHIN:?}"
                );
                Written::Failed
            }
        }
    }

    async fn run(&self, op: LeaseOp) -> Answer {
        match op {
            LeaseOp::Read => {
                let seen = match tokio::time::timeout(REQUEST_WITHIN, self.read()).await {
                    Ok(seen) => seen,
                    Err(_) => {
                        tracing::warn!(
                            "NODE-LEASE-001: the head lease could not be read within {REQUEST_WITHIN:?}"
                        );
                        None
                    }
                };
                Answer::Read(seen)
            }
            LeaseOp::Create(record) => {
                let w = self.write(&record, PutMode::Create).await;
                Answer::Written(record, w)
            }
            LeaseOp::Replace { version, record } => {
                let mode = PutMode::Update(UpdateVersion {
                    e_tag: Some(version),
                    version: None,
                });
                let w = self.write(&record, mode).await;
                Answer::Written(record, w)
            }
        }
    }
}

enum Answer {
    Read(Option<Seen>),
    Written(LeaseRecord, Written),
}

/// Whether this head may act as the primary: shared by the lease's task
/// and whoever writes the head's state.
#[derive(Debug, Clone, Default)]
pub struct LeaseGuard {
    valid_until: Arc<Mutex<Option<Instant>>>,
    lost: CancellationToken,
    /// The holder's incarnation, written into the lease from the next
    /// renewal on (0: not known yet).
    incarnation: Arc<std::sync::atomic::AtomicU64>,
}

impl LeaseGuard {
    /// Whether the lease is held and valid now.
    pub fn holds(&self) -> bool {
        self.remaining().is_some_and(|left| !left.is_zero())
    }

    /// How long the lease stays valid from now without another renewal
    /// (`None`: not held).
    pub fn remaining(&self) -> Option<Duration> {
        if self.lost.is_cancelled() {
            return None;
        }
        let until = (*self.valid_until.lock().unwrap_or_else(|p| p.into_inner()))?;
        until.checked_duration_since(Instant::now())
    }

    /// Completes once the lease is lost (never, while it is held).
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Writes `incarnation` (the head's, once started) into the lease
    /// from its next renewal on: a head that takes over runs above it.
    pub fn set_incarnation(&self, incarnation: Incarnation) {
        self.incarnation
            .store(incarnation.get(), std::sync::atomic::Ordering::Relaxed);
    }

    fn set(&self, until: Option<Instant>) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }
}

/// A lease held: who held it before, and the guard.
#[derive(Debug)]
pub struct Acquired {
    /// The record taken over (`None`: the lease was new).
    pub former: Option<LeaseRecord>,
    /// The term now held.
    pub term: u64,
    /// Whether the lease is still held.
    pub guard: LeaseGuard,
}

/// What this head writes into the lease when it takes it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its member name.
    pub holder: MemberName,
    /// The address it serves the cluster on.
    pub address: String,
    /// A number below the incarnation it will run under.
    pub incarnation: Incarnation,
}

/// Waits as a standby until this head holds the lease in `store`, then
/// keeps renewing it in a task of its own (ended when the lease is lost or
/// `stop` is cancelled). Returns `None` if `stop` is cancelled first.
pub async fn acquire(
    store: LeaseStore,
    me: Candidate,
    config: LeaseConfig,
    stop: CancellationToken,
) -> Option<Acquired> {
    let guard = LeaseGuard::default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let lease = HeadLease::new(
        Instant::now(),
        me.holder,
        me.address,
        me.incarnation,
        config,
    );
    tokio::spawn(drive(lease, store, guard.clone(), Some(tx), stop.clone()));
    tokio::select! {
        acquired = rx => acquired.ok(),
        () = stop.cancelled() => None,
    }
}

/// Runs the lease machine against the store until it is deposed or
/// `stop` is cancelled; either way the guard says the lease is lost from
/// then on (nobody renews it any more).
async fn drive(
    lease: HeadLease,
    store: LeaseStore,
    guard: LeaseGuard,
    on_acquired: Option<tokio::sync::oneshot::Sender<Acquired>>,
    stop: CancellationToken,
) {
    renew(lease, store, &guard, on_acquired, stop).await;
    guard.set(None);
    guard.lost.cancel();
}

/// [`drive`]'s loop.
async fn renew(
    mut lease: HeadLease,
    store: LeaseStore,
    guard: &LeaseGuard,
    mut on_acquired: Option<tokio::sync::oneshot::Sender<Acquired>>,
    stop: CancellationToken,
) {
    loop {
        let now = Instant::now();
        lease.handle_timeout(now);
        while let Some(event) = lease.poll_event() {
            match event {
                LeaseEvent::Acquired { former } => {
                    let term = lease.term().unwrap_or_default();
                    tracing::info!(term, former = ?former.as_ref().map(|f| &f.holder), "this head holds the lease: primary");
                    if let Some(tx) = on_acquired.take() {
                        let _ = tx.send(Acquired {
                            former,
                            term,
                            guard: guard.clone(),
                        });
                    }
                }
                LeaseEvent::Lost(why) => {
                    let why = match why {
                        LostWhy::Replaced => "another head took the lease over",
                        LostWhy::Expired => "no renewal was written in time",
                    };
                    tracing::error!(why, "NODE-LEASE-004: this head lost its lease");
                    return;
                }
            }
        }
        let incarnation = guard.incarnation.load(std::sync::atomic::Ordering::Relaxed);
        if incarnation != 0 {
            lease.set_incarnation(Incarnation::new(incarnation));
        }
        if let Some(op) = lease.poll_op(now) {
            let answer = tokio::select! {
                a = store.run(op) => a,
                () = stop.cancelled() => return,
            };
            let now = Instant::now();
            match answer {
                Answer::Read(seen) => lease.handle_read(now, seen),
                Answer::Written(record, w) => lease.handle_written(now, record, w),
            }
            guard.set(lease.valid_until());
            continue;
        }
        let wake = lease
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1));
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(name: &str) -> Candidate {
        Candidate {
            holder: name.into(),
            address: "127.0.0.1:1".into(),
            incarnation: Incarnation::new(5),
        }
    }

    #[tokio::test]
    async fn one_of_two_heads_holds_the_lease_and_the_other_takes_over_once_it_stops() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let store = LeaseStore::new(mem, &Path::from("heads"));
        let config = LeaseConfig {
            duration: Duration::from_millis(400),
        };
        let stop_a = CancellationToken::new();
        let a = acquire(store.clone(), candidate("a"), config, stop_a.clone())
            .await
            .unwrap();
        assert!(a.former.is_none());
        assert!(a.guard.holds());
        let stop_b = CancellationToken::new();
        let b = tokio::spawn(acquire(store.clone(), candidate("b"), config, stop_b));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!b.is_finished(), "b took the lease while a renewed it");
        assert!(a.guard.holds());
        // a stops renewing (as a killed head does).
        stop_a.cancel();
        let b = tokio::time::timeout(Duration::from_secs(3), b)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(b.former.as_ref().map(|f| f.holder.as_str()), Some("a"));
        assert_eq!(b.term, 2);
        assert!(b.guard.holds());
        assert!(!a.guard.holds(), "a's validity ended before b took over");
    }

    #[tokio::test]
    async fn a_head_whose_lease_is_replaced_learns_it_has_lost() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let store = LeaseStore::new(Arc::clone(&mem), &Path::from("heads"));
        let config = LeaseConfig {
            duration: Duration::from_millis(400),
        };
        let a = acquire(store, candidate("a"), config, CancellationToken::new())
            .await
            .unwrap();
        let other = LeaseRecord {
            term: 7,
            holder: "z".into(),
            address: "x".into(),
            incarnation: Incarnation::new(1),
            renewal: 0,
        };
        mem.put(
            &Path::from("heads/lease"),
            other.encode().into_bytes().into(),
        )
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(2), a.guard.lost())
            .await
            .expect("the loss is noticed at the next renewal");
        assert!(!a.guard.holds());
    }
}
