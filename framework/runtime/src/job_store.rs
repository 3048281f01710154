//! The head's detached jobs on disk: an embedded transactional store
//! (redb) in the head's state directory, one entry per job, written and
//! committed before the head answers the change that made it. A head
//! killed and started again on the same directory reads them back: the
//! jobs that ended are listed again, those that had not are started again
//! (see [`crate::jobs`]).
//!
//! Each entry is an rkyv archive of [`StoredJob`], keyed by the job's
//! place in submission order, checked when it is read: a file that is not
//! a store, or an entry that is not a job, is a typed error naming the
//! file (and the entry), never a job quietly dropped.

use std::path::{Path, PathBuf};

use flotilla_proto::jobs::StoredJob;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// The jobs table: submission order → archived [`StoredJob`].
const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");

/// The file the store lives in, in the head's state directory.
pub const FILE: &str = "head-jobs.redb";

/// Why the store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobStoreError {
    /// The file could not be opened or created as a store.
    #[error("job store {path}: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A read or a write failed.
    #[error("job store {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// An entry is not a job this version can read.
    #[error("job store {path}: entry {key} is not a stored job: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The entry's key.
        key: u64,
        /// What the check found.
        reason: String,
    },
}

/// The head's detached jobs on disk.
pub struct JobStore {
    db: redb::Database,
    path: PathBuf,
}

impl std::fmt::Debug for JobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobStore")
            .field("path", &self.path)
            .finish()
    }
}

impl JobStore {
    /// Opens the store in `dir` ([`FILE`]), creating it where there is none.
    pub fn open_in(dir: &Path) -> Result<Self, JobStoreError> {
        Self::open(&dir.join(FILE))
    }

    /// Opens the store at `path`, creating it where there is none.
    pub fn open(path: &Path) -> Result<Self, JobStoreError> {
        let fail = |reason: String| JobStoreError::Open {
            path: path.to_path_buf(),
            reason,
        };
        let db = redb::Database::create(path).map_err(|e| fail(e.to_string()))?;
        // The table exists from the start, so reads never meet its absence.
        let tx = db.begin_write().map_err(|e| fail(e.to_string()))?;
        tx.open_table(JOBS).map_err(|e| fail(e.to_string()))?;
        tx.commit().map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            db,
            path: path.to_path_buf(),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: impl std::fmt::Display) -> JobStoreError {
        JobStoreError::Io {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    /// Every stored job, in submission order.
    pub fn load(&self) -> Result<Vec<StoredJob>, JobStoreError> {
        let tx = self.db.begin_read().map_err(|e| self.io(e))?;
        let table = tx.open_table(JOBS).map_err(|e| self.io(e))?;
        let mut jobs = Vec::new();
        for entry in table.iter().map_err(|e| self.io(e))? {
            let (key, value) = entry.map_err(|e| self.io(e))?;
            let key = key.value();
            // Archives are read from aligned memory.
            let mut bytes = rkyv::util::AlignedVec::<16>::new();
            bytes.extend_from_slice(value.value());
            let job = rkyv::from_bytes::<StoredJob, rkyv::rancor::Error>(&bytes).map_err(|e| {
                JobStoreError::Corrupt {
                    path: self.path.clone(),
                    key,
                    reason: e.to_string(),
                }
            })?;
            if job.seq != key {
                return Err(JobStoreError::Corrupt {
                    path: self.path.clone(),
                    key,
                    reason: format!("it says it is entry {}", job.seq),
                });
            }
            jobs.push(job);
        }
        Ok(jobs)
    }

    /// Writes `job` (replacing its entry) and commits, durably.
    pub fn put(&self, job: &StoredJob) -> Result<(), JobStoreError> {
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(job).map_err(|e| self.io(e))?;
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut table = tx.open_table(JOBS).map_err(|e| self.io(e))?;
            table
                .insert(job.seq, bytes.as_slice())
                .map_err(|e| self.io(e))?;
        }
        self.commit(tx)
    }

    /// Commits `tx` durably, counting it on the head's metrics.
    fn commit(&self, tx: redb::WriteTransaction) -> Result<(), JobStoreError> {
        let started = std::time::Instant::now();
        tx.commit().map_err(|e| self.io(e))?;
        let took = started.elapsed();
        let bytes = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        crate::counters::store_committed(bytes, took);
        Ok(())
    }

    /// Removes the job at `seq`, durably.
    pub fn remove(&self, seq: u64) -> Result<(), JobStoreError> {
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut table = tx.open_table(JOBS).map_err(|e| self.io(e))?;
            table.remove(seq).map_err(|e| self.io(e))?;
        }
        self.commit(tx)
    }
}

#[cfg(test)]
mod tests {
    use flotilla_proto::jobs::{JobRecord, JobSpec};
    use flotilla_proto::placement::Resources;

    use super::*;

    fn job(seq: u64) -> StoredJob {
        let mut record =
            JobRecord::new(format!("job-1-{seq}"), "embed in → out", Some("ops".into()));
        record.started("w1", 2);
        StoredJob {
            seq,
            spec: JobSpec {
                kind: "flotilla.embed.job".into(),
                args: vec![1, 2, 3, seq as u8],
                message_type: "JobMsg".into(),
                resources: Resources::default(),
                description: "embed in → out".into(),
                max_restarts: 3,
            },
            view: (*record).clone(),
            group: Some(format!("pg1-{seq}")),
            ended_unix_ms: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flotilla-job-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn jobs_written_are_read_back_after_the_store_is_opened_again() {
        let dir = scratch("reopen");
        {
            let store = JobStore::open_in(&dir).unwrap();
            assert!(store.load().unwrap().is_empty());
            for seq in [3, 1, 2] {
                store.put(&job(seq)).unwrap();
            }
            let mut ended = job(2);
            ended.ended_unix_ms = Some(1_700_000_000_000);
            store.put(&ended).unwrap();
            store.remove(3).unwrap();
        }
        let store = JobStore::open_in(&dir).unwrap();
        let jobs = store.load().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0], job(1));
        assert_eq!(jobs[1].ended_unix_ms, Some(1_700_000_000_000));
        assert_eq!(jobs[1].view.node.as_deref(), Some("w1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_store_and_an_entry_that_is_not_a_job_are_named() {
        let dir = scratch("corrupt");
        let path = dir.join(FILE);
        std::fs::write(
            &path,
            b"not a database at all, but long enough to be read as one",
        )
        .unwrap();
        let err = JobStore::open(&path).unwrap_err();
        assert!(matches!(err, JobStoreError::Open { .. }), "{err}");
        assert!(err.to_string().contains(FILE), "{err}");
        std::fs::remove_file(&path).unwrap();

        let store = JobStore::open(&path).unwrap();
        let tx = store.db.begin_write().unwrap();
        {
            let mut table = tx.open_table(JOBS).unwrap();
            table.insert(7u64, &b"\x01\x02 not an archive"[..]).unwrap();
        }
        tx.commit().unwrap();
        let err = store.load().unwrap_err();
        assert!(
            matches!(err, JobStoreError::Corrupt { key: 7, .. }),
            "{err}"
        );
        // An archive filed under another key is refused too.
        store.remove(7).unwrap();
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&job(4)).unwrap();
        let tx = store.db.begin_write().unwrap();
        {
            let mut table = tx.open_table(JOBS).unwrap();
            table.insert(5u64, bytes.as_slice()).unwrap();
        }
        tx.commit().unwrap();
        assert!(matches!(
            store.load().unwrap_err(),
            JobStoreError::Corrupt { key: 5, .. }
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
