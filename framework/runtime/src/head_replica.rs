//! The head's control state beside its lease, for the standbys: each
//! change the primary commits to its [`HeadStore`] is written to the
//! shared object store too, before the head answers the change (and only
//! while its [`LeaseGuard`] holds: a head that lost its lease writes
//! nothing). A head that takes the lease over first copies that state
//! into its own store ([`restore`]), so it starts as a head restarted on
//! the primary's state directory would: its jobs, groups and
//! reservations.
//!
//! ```text
//! HeadStore::put_job / put_group / remove_* ── commit (redb) ──► HeadReplica::put / remove
//!                                                                  └─► PREFIX/state/{jobs,groups}/KEY
//! takeover: restore(PREFIX/state) ──► a fresh HeadStore in the state directory
//! ```
//!
//! The entries are the store's own archives, checked when they are read
//! back: a replica that holds something else stops the takeover with a
//! typed error, never state quietly dropped.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::head_lease::LeaseGuard;
use crate::head_store::{HeadStore, HeadStoreError, Mirror};

/// How long one replica write may take before the change is refused.
const WRITE_WITHIN: Duration = Duration::from_secs(5);

/// The folder under the head set's prefix the state lives in.
const STATE: &str = "state";

/// Where the primary mirrors its store: written synchronously (the
/// store's callers are synchronous), on a small runtime of its own.
pub struct HeadReplica {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    guard: LeaseGuard,
    /// Always `Some` until dropped (a runtime is shut down in the
    /// background: it may be dropped on another runtime's thread).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for HeadReplica {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for HeadReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadReplica")
            .field("prefix", &self.prefix)
            .finish()
    }
}

fn entry(prefix: &Path, table: &str, key: &str) -> Path {
    prefix.clone().join(STATE).join(table).join(key)
}

impl HeadReplica {
    /// Mirrors into `store` under `prefix` while `guard` holds.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        guard: LeaseGuard,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("head-replica")
            .enable_all()
            .build()?;
        Ok(Self {
            store,
            prefix,
            guard,
            runtime: Some(runtime),
        })
    }

    /// Runs `fut` on the replica's runtime, from a thread of its own (the
    /// caller may be on another runtime's worker).
    fn block<F>(&self, fut: F) -> Result<(), String>
    where
        F: std::future::Future<Output = object_store::Result<()>> + Send,
    {
        // A write may take only what is left of the lease's validity: one
        // that could land after a standby took over is not made.
        let Some(left) = self.guard.remaining().filter(|d| !d.is_zero()) else {
            return Err("this head does not hold the lease".into());
        };
        let within = left.min(WRITE_WITHIN);
        let Some(runtime) = &self.runtime else {
            return Err("the replica is closed".into());
        };
        let handle = runtime.handle();
        std::thread::scope(|s| {
            s.spawn(|| {
                handle.block_on(async {
                    match tokio::time::timeout(within, fut).await {
                        Ok(done) => done.map_err(|e| e.to_string()),
                        Err(_) => Err(format!("no answer within {within:?}")),
                    }
                })
            })
            .join()
            .unwrap_or_else(|_| Err("the replica's writer panicked".into()))
        })
    }
}

impl Mirror for HeadReplica {
    /// Writes `bytes` as `key` of `table`.
    fn put(&self, table: &str, key: &str, bytes: &[u8]) -> Result<(), String> {
        let path = entry(&self.prefix, table, key);
        let payload = bytes.to_vec();
        self.block(async move {
            self.store.put(&path, payload.into()).await?;
            Ok(())
        })
    }

    /// Removes `key` of `table` (gone already is fine).
    fn remove(&self, table: &str, key: &str) -> Result<(), String> {
        let path = entry(&self.prefix, table, key);
        self.block(async move {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }
}

/// What a takeover copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Jobs copied.
    pub jobs: usize,
    /// Placement groups copied.
    pub groups: usize,
}

/// Why the replicated state could not be copied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The object store could not be read.
    #[error("NODE-LEASE-005: cannot read the head state under {prefix}: {reason}")]
    Read {
        /// The state's prefix.
        prefix: String,
        /// What went wrong.
        reason: String,
    },
    /// The object store did not take an entry.
    #[error("NODE-LEASE-005: cannot write the head state under {prefix}: {reason}")]
    Write {
        /// The state's prefix.
        prefix: String,
        /// What went wrong.
        reason: String,
    },
    /// The local store could not be written, or an entry is not readable.
    #[error("NODE-LEASE-005: {0}")]
    Store(#[from] HeadStoreError),
}

/// Whether the head set's state under `prefix` holds no entry at all.
pub async fn is_empty(store: &Arc<dyn ObjectStore>, prefix: &Path) -> Result<bool, RestoreError> {
    let folder = prefix.clone().join(STATE);
    match store.list(Some(&folder)).next().await {
        None => Ok(true),
        Some(Ok(_)) => Ok(false),
        Some(Err(e)) => Err(RestoreError::Read {
            prefix: prefix.to_string(),
            reason: e.to_string(),
        }),
    }
}

/// Writes every entry of the head store in `dir` to `replica`: the first
/// primary of a new head set starts from the state its directory held
/// (a single head made one of a set keeps its jobs and groups).
pub fn seed(dir: &std::path::Path, replica: &HeadReplica) -> Result<Restored, RestoreError> {
    let (jobs, groups) = HeadStore::open_in(dir)?.export()?;
    for (table, entries) in [("jobs", &jobs), ("groups", &groups)] {
        for (key, bytes) in entries {
            replica
                .put(table, key, bytes)
                .map_err(|reason| RestoreError::Write {
                    prefix: replica.prefix.to_string(),
                    reason: format!("{table} entry {key} not written: {reason}"),
                })?;
        }
    }
    Ok(Restored {
        jobs: jobs.len(),
        groups: groups.len(),
    })
}

/// Replaces the head store in `dir` with the state under `prefix` of
/// `store` (what the former primary wrote).
pub async fn restore(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    dir: &std::path::Path,
) -> Result<Restored, RestoreError> {
    let read_err = |e: object_store::Error| RestoreError::Read {
        prefix: prefix.to_string(),
        reason: e.to_string(),
    };
    let mut tables: [Vec<(String, Vec<u8>)>; 2] = [Vec::new(), Vec::new()];
    for (i, table) in ["jobs", "groups"].into_iter().enumerate() {
        let folder = prefix.clone().join(STATE).join(table);
        let mut listed = store.list(Some(&folder));
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(read_err)?;
            let key = meta.location.filename().unwrap_or_default().to_owned();
            let bytes = store
                .get(&meta.location)
                .await
                .map_err(read_err)?
                .bytes()
                .await
                .map_err(read_err)?;
            tables[i].push((key, bytes.to_vec()));
        }
    }
    let path = dir.join(crate::head_store::FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(HeadStoreError::Io {
                path,
                reason: e.to_string(),
            }
            .into());
        }
    }
    let local = HeadStore::open(&path)?;
    let [jobs, groups] = tables;
    let restored = Restored {
        jobs: jobs.len(),
        groups: groups.len(),
    };
    local.import(jobs, groups)?;
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head_lease::{Candidate, LeaseStore, acquire};
    use crate::head_store::tests::job;
    use flotilla_proto::lease::LeaseConfig;
    use tokio_util::sync::CancellationToken;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-replica-{tag}-{}-{:x}",
            std::process::id(),
            crate::clock::clock_micros()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The lease under `prefix` of `mem`, taken.
    async fn lease_on(mem: &Arc<dyn ObjectStore>, prefix: &Path) -> crate::head_lease::Acquired {
        acquire(
            LeaseStore::new(Arc::clone(mem), prefix),
            Candidate {
                holder: "head".into(),
                address: "127.0.0.1:1".into(),
                incarnation: 1,
            },
            LeaseConfig {
                duration: Duration::from_secs(4),
            },
            CancellationToken::new(),
        )
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_takeover_finds_what_the_primary_committed_and_not_what_it_removed() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let prefix = Path::from("heads");
        let held = lease_on(&mem, &prefix).await;
        let primary_dir = scratch("primary");
        let replica =
            HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard.clone()).unwrap();
        let primary = HeadStore::open_in(&primary_dir)
            .unwrap()
            .with_replica(replica);
        for seq in 0..3 {
            primary.put_job(&job(seq)).unwrap();
        }
        primary.remove_job(1).unwrap();

        let standby_dir = scratch("standby");
        // A stale local copy is replaced, not merged.
        HeadStore::open_in(&standby_dir)
            .unwrap()
            .put_job(&job(9))
            .unwrap();
        let restored = restore(&mem, &prefix, &standby_dir).await.unwrap();
        assert_eq!(restored, Restored { jobs: 2, groups: 0 });
        let taken = HeadStore::open_in(&standby_dir).unwrap();
        let seqs: Vec<u64> = taken.load_jobs().unwrap().iter().map(|j| j.seq).collect();
        assert_eq!(seqs, [0, 2]);
        assert_eq!(taken.load_jobs().unwrap()[1], job(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_without_the_lease_writes_nothing_and_its_change_fails() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let replica =
            HeadReplica::new(Arc::clone(&mem), Path::from("heads"), LeaseGuard::default()).unwrap();
        let store = HeadStore::open_in(&scratch("unleased"))
            .unwrap()
            .with_replica(replica);
        let e = store.put_job(&job(0)).unwrap_err();
        assert!(e.to_string().contains("does not hold the lease"), "{e}");
        let listed: Vec<_> = mem.list(None).collect().await;
        assert!(listed.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_primary_of_a_new_set_seeds_it_from_its_own_directory() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let prefix = Path::from("heads");
        let held = lease_on(&mem, &prefix).await;
        let single = scratch("single");
        HeadStore::open_in(&single)
            .unwrap()
            .put_job(&job(3))
            .unwrap();
        assert!(is_empty(&mem, &prefix).await.unwrap());
        let replica = HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard).unwrap();
        let seeded = tokio::task::spawn_blocking(move || seed(&single, &replica))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seeded, Restored { jobs: 1, groups: 0 });
        assert!(!is_empty(&mem, &prefix).await.unwrap());
        let standby = scratch("seeded-standby");
        restore(&mem, &prefix, &standby).await.unwrap();
        assert_eq!(
            HeadStore::open_in(&standby).unwrap().load_jobs().unwrap(),
            [job(3)]
        );
    }

    #[tokio::test]
    async fn a_replica_entry_that_is_not_a_job_stops_the_takeover_naming_it() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let prefix = Path::from("heads");
        mem.put(
            &entry(&prefix, "jobs", "4"),
            b"not an archive".to_vec().into(),
        )
        .await
        .unwrap();
        let e = restore(&mem, &prefix, &scratch("corrupt"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("jobs entry 4"), "{e}");
    }
}
