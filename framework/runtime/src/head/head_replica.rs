//! The head's control state beside its lease, for the standbys: each
//! change the primary commits to its [`HeadStore`] is written to the
//! shared object store too, before the head answers the change (and only
//! while its [`LeaseGuard`] holds: a head that lost its lease writes
//! nothing). A head that takes the lease over first copies that state
//! into its own store ([`restore`]), so it starts as a head restarted on
//! the primary's state directory would: its jobs, groups,
//! reservations and the revocations it enforced.
//!
//! ```text
//! HeadStore::put_job / put_group / remove_* ── commit (redb) ──► HeadReplica::put / remove
//!                                               └─► PREFIX/state/term-T/{jobs,groups,revoked}/KEY
//! takeover of term T+1: restore(newest complete term below T+1) ──► a fresh HeadStore
//!                       seed(that store) ──► PREFIX/state/term-(T+1)/…, then its `complete` mark
//!                       prune(the terms below T+1)
//! ```
//!
//! Each term of the lease writes its own folder, and a takeover reads only
//! the newest folder whose primary finished seeding it: a write of an old
//! primary that lands late (its request was in flight when its lease
//! ended) goes into its own term's folder, which no later head reads, so
//! it cannot undo what the new primary wrote.
//!
//! The entries are the store's own archives, checked when they are read
//! back: a replica that holds something else stops the takeover with a
//! typed error, never state quietly dropped.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::head::head_lease::LeaseGuard;
use crate::head::head_store::{Entries, HeadStore, HeadStoreError, Mirror, Row, TABLES};

/// How long one replica write may take before the change is refused.
const WRITE_WITHIN: Duration = Duration::from_secs(5);

/// The folder under the head set's prefix the state lives in.
const STATE: &str = "state";

/// The object that marks a term's folder complete.
const COMPLETE: &str = "complete";

/// Where the primary mirrors its store: written synchronously (the
/// store's callers are synchronous), on a small runtime of its own.
pub struct HeadReplica {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    guard: LeaseGuard,
    /// The lease's term this head holds: the folder it writes.
    term: u64,
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

/// The folder of `term`'s state.
fn term_folder(prefix: &Path, term: u64) -> Path {
    prefix.clone().join(STATE).join(format!("term-{term:020}"))
}

/// The term a folder name (`term-N`) stands for.
fn term_of(name: &str) -> Option<u64> {
    name.strip_prefix("term-")?.parse().ok()
}

fn entry(prefix: &Path, term: u64, table: &str, key: &str) -> Path {
    term_folder(prefix, term).join(table).join(key)
}

impl HeadReplica {
    /// Mirrors into `store` under `prefix`, in the folder of the lease's
    /// `term`, while `guard` holds.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        guard: LeaseGuard,
        term: u64,
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
            term,
            runtime: Some(runtime),
        })
    }

    /// The term whose folder this replica writes.
    pub fn term(&self) -> u64 {
        self.term
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
        let path = entry(&self.prefix, self.term, table, key);
        let payload = bytes.to_vec();
        self.block(async move {
            self.store.put(&path, payload.into()).await?;
            Ok(())
        })
    }

    /// Removes `key` of `table` (gone already is fine).
    fn remove(&self, table: &str, key: &str) -> Result<(), String> {
        let path = entry(&self.prefix, self.term, table, key);
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
    /// Revoked certificates copied.
    pub revoked: usize,
}

impl Restored {
    fn of(entries: &Entries) -> Self {
        Self {
            jobs: entries.jobs.len(),
            groups: entries.groups.len(),
            revoked: entries.revoked.len(),
        }
    }
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

/// The terms whose folders exist under `prefix`, each with whether its
/// primary finished seeding it, oldest first.
async fn terms(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<Vec<(u64, bool)>, RestoreError> {
    let read_err = |e: object_store::Error| RestoreError::Read {
        prefix: prefix.to_string(),
        reason: e.to_string(),
    };
    let listed = store
        .list_with_delimiter(Some(&prefix.clone().join(STATE)))
        .await
        .map_err(read_err)?;
    let mut terms = Vec::new();
    for folder in listed.common_prefixes {
        let Some(term) = folder.filename().and_then(term_of) else {
            continue;
        };
        let complete = match store.head(&term_folder(prefix, term).join(COMPLETE)).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => return Err(read_err(e)),
        };
        terms.push((term, complete));
    }
    terms.sort_unstable();
    Ok(terms)
}

/// The newest term below `below` whose folder is complete.
async fn newest_complete(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    below: u64,
) -> Result<Option<u64>, RestoreError> {
    Ok(terms(store, prefix)
        .await?
        .into_iter()
        .rev()
        .find(|&(term, complete)| term < below && complete)
        .map(|(term, _)| term))
}

/// Whether the head set under `prefix` holds no complete state: a new
/// set, or one whose first primary died before it had seeded it.
pub async fn is_empty(store: &Arc<dyn ObjectStore>, prefix: &Path) -> Result<bool, RestoreError> {
    Ok(newest_complete(store, prefix, u64::MAX).await?.is_none())
}

/// Writes every entry of the head store in `dir` to `replica`'s term, then
/// marks that term complete: the primary's first act, from the state its
/// directory holds (its own, for a new set; what [`restore`] copied, for a
/// takeover). Nothing else is written in the term before it is complete.
pub fn seed(dir: &std::path::Path, replica: &HeadReplica) -> Result<Restored, RestoreError> {
    let entries = HeadStore::open_in(dir)?.export()?;
    let write_err = |what: String, reason: String| RestoreError::Write {
        prefix: replica.prefix.to_string(),
        reason: format!("{what} not written: {reason}"),
    };
    for (table, entries) in entries.tables() {
        for Row { key, bytes } in entries {
            replica
                .put(table, key, bytes)
                .map_err(|reason| write_err(format!("{table} entry {key}"), reason))?;
        }
    }
    let mark = term_folder(&replica.prefix, replica.term).join(COMPLETE);
    replica
        .block(async {
            replica.store.put(&mark, Vec::<u8>::new().into()).await?;
            Ok(())
        })
        .map_err(|reason| write_err(format!("the mark of term {}", replica.term), reason))?;
    Ok(Restored::of(&entries))
}

/// Replaces the head store in `dir` with the newest complete state under
/// `prefix` of `store` written before the term `term` (what the former
/// primaries wrote); empty when there is none.
pub async fn restore(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    dir: &std::path::Path,
    term: u64,
) -> Result<Restored, RestoreError> {
    let read_err = |e: object_store::Error| RestoreError::Read {
        prefix: prefix.to_string(),
        reason: e.to_string(),
    };
    let mut entries = Entries::default();
    if let Some(from) = newest_complete(store, prefix, term).await? {
        for table in TABLES {
            let folder = term_folder(prefix, from).join(table);
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
                if let Some(listed) = entries.table_mut(table) {
                    listed.push(Row {
                        key,
                        bytes: bytes.to_vec(),
                    });
                }
            }
        }
    }
    let path = dir.join(crate::head::head_store::FILE);
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
    local.import(&entries)?;
    Ok(Restored::of(&entries))
}

/// Removes the folders of the terms below `term` (once `term`'s is
/// complete, no head reads them again); the number removed.
pub async fn prune(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    term: u64,
) -> Result<usize, RestoreError> {
    let write_err = |e: object_store::Error| RestoreError::Write {
        prefix: prefix.to_string(),
        reason: e.to_string(),
    };
    let mut removed = 0;
    for (old, _) in terms(store, prefix).await? {
        if old >= term {
            continue;
        }
        // The mark goes first: a prune cut short leaves no folder that
        // says it is complete and is not.
        match store.delete(&term_folder(prefix, old).join(COMPLETE)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(write_err(e)),
        }
        let mut listed = store.list(Some(&term_folder(prefix, old)));
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(write_err)?;
            match store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(write_err(e)),
            }
        }
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::head_lease::{Candidate, LeaseStore, acquire};
    use crate::head::head_store::tests::job;
    use flotilla_proto::incarnation::Incarnation;
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
    async fn lease_on(
        mem: &Arc<dyn ObjectStore>,
        prefix: &Path,
    ) -> crate::head::head_lease::Acquired {
        acquire(
            LeaseStore::new(Arc::clone(mem), prefix),
            Candidate {
                holder: "head".into(),
                address: "127.0.0.1:1".into(),
                incarnation: Incarnation::new(1),
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
            HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard.clone(), 1).unwrap();
        let replica = tokio::task::block_in_place(|| {
            seed(&primary_dir, &replica).unwrap();
            replica
        });
        let primary = HeadStore::open_in(&primary_dir)
            .unwrap()
            .with_replica(replica);
        for seq in 0..3 {
            primary.put_job(&job(seq)).unwrap();
        }
        primary.remove_job(1).unwrap();
        primary.add_revoked(&[vec![0x2a]]).unwrap();

        let standby_dir = scratch("standby");
        // A stale local copy is replaced, not merged.
        HeadStore::open_in(&standby_dir)
            .unwrap()
            .put_job(&job(9))
            .unwrap();
        let restored = restore(&mem, &prefix, &standby_dir, 2).await.unwrap();
        assert_eq!(
            restored,
            Restored {
                jobs: 2,
                groups: 0,
                revoked: 1
            }
        );
        let taken = HeadStore::open_in(&standby_dir).unwrap();
        // The revocations the primary enforced are the standby's too.
        assert_eq!(taken.load_revoked().unwrap(), [vec![0x2a]]);
        let seqs: Vec<u64> = taken.load_jobs().unwrap().iter().map(|j| j.seq).collect();
        assert_eq!(seqs, [0, 2]);
        assert_eq!(taken.load_jobs().unwrap()[1], job(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_without_the_lease_writes_nothing_and_its_change_fails() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let replica = HeadReplica::new(
            Arc::clone(&mem),
            Path::from("heads"),
            LeaseGuard::default(),
            1,
        )
        .unwrap();
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
        let replica = HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard, 1).unwrap();
        let seeded = tokio::task::spawn_blocking(move || seed(&single, &replica))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            seeded,
            Restored {
                jobs: 1,
                groups: 0,
                revoked: 0
            }
        );
        assert!(!is_empty(&mem, &prefix).await.unwrap());
        let standby = scratch("seeded-standby");
        restore(&mem, &prefix, &standby, 2).await.unwrap();
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
            &entry(&prefix, 1, "jobs", "4"),
            b"not an archive".to_vec().into(),
        )
        .await
        .unwrap();
        mem.put(
            &term_folder(&prefix, 1).join(COMPLETE),
            Vec::<u8>::new().into(),
        )
        .await
        .unwrap();
        let e = restore(&mem, &prefix, &scratch("corrupt"), 2)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("jobs entry 4"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_write_of_an_old_primary_does_not_reach_the_state_its_successors_read() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let prefix = Path::from("heads");
        let held = lease_on(&mem, &prefix).await;
        // Term 1: the first primary seeds its state and writes a job.
        let old_dir = scratch("old-primary");
        let old =
            HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard.clone(), 1).unwrap();
        let old = tokio::task::block_in_place(|| {
            seed(&old_dir, &old).unwrap();
            old
        });
        let old = HeadStore::open_in(&old_dir).unwrap().with_replica(old);
        old.put_job(&job(1)).unwrap();
        // Term 2 takes over: copies term 1, seeds its own, prunes term 1.
        let new_dir = scratch("new-primary");
        let restored = restore(&mem, &prefix, &new_dir, 2).await.unwrap();
        assert_eq!(restored.jobs, 1);
        let new =
            HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard.clone(), 2).unwrap();
        let new = tokio::task::block_in_place(|| {
            seed(&new_dir, &new).unwrap();
            new
        });
        assert_eq!(prune(&mem, &prefix, 2).await.unwrap(), 1);
        let new = HeadStore::open_in(&new_dir).unwrap().with_replica(new);
        new.remove_job(1).unwrap();
        new.put_job(&job(2)).unwrap();
        // The old primary's write in flight lands now, after the takeover
        // (its guard is the test's: it still says it holds).
        old.put_job(&job(7)).unwrap();
        old.remove_job(2).unwrap();
        // A third head reads term 2's state, untouched by those writes.
        let third = scratch("third");
        restore(&mem, &prefix, &third, 3).await.unwrap();
        let seqs: Vec<u64> = HeadStore::open_in(&third)
            .unwrap()
            .load_jobs()
            .unwrap()
            .iter()
            .map(|j| j.seq)
            .collect();
        assert_eq!(seqs, [2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_term_its_primary_did_not_finish_seeding_is_not_read() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let prefix = Path::from("heads");
        let held = lease_on(&mem, &prefix).await;
        let first = scratch("complete");
        HeadStore::open_in(&first)
            .unwrap()
            .put_job(&job(1))
            .unwrap();
        let replica =
            HeadReplica::new(Arc::clone(&mem), prefix.clone(), held.guard.clone(), 1).unwrap();
        tokio::task::block_in_place(|| seed(&first, &replica).unwrap());
        assert!(!is_empty(&mem, &prefix).await.unwrap());
        // Term 2 died after one entry, before its mark.
        mem.put(&entry(&prefix, 2, "jobs", "5"), Vec::<u8>::new().into())
            .await
            .unwrap();
        let third = scratch("after-partial");
        let restored = restore(&mem, &prefix, &third, 3).await.unwrap();
        assert_eq!(restored.jobs, 1);
        assert_eq!(
            HeadStore::open_in(&third).unwrap().load_jobs().unwrap(),
            [job(1)]
        );
    }
}
