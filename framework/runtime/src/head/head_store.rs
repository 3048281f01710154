//! The head's control state on disk: an embedded transactional store
//! (redb) in the head's state directory holding its detached jobs and its
//! placement groups, each entry written and committed before the head
//! answers the change that made it. A head killed and started again on the
//! same directory reads them back: the jobs that ended are listed again,
//! those that had not are started again (see [`crate::jobs`]); pending
//! groups stay pending and ready ones wait for their nodes to report
//! their bundles (see [`flotilla_proto::groups`]).
//!
//! Each entry is an rkyv archive ([`StoredJob`] keyed by the job's place
//! in submission order, [`StoredGroup`] by the group's id), checked when
//! it is read: a file that is not a store, or an entry that is not what its
//! table holds, is a typed error naming the file (and the entry), never
//! state quietly dropped.

use std::path::{Path, PathBuf};

use flotilla_proto::groups::StoredGroup;
use flotilla_proto::jobs::StoredJob;
use redb::{Key, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

/// The jobs table: submission order → archived [`StoredJob`].
const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");

/// The groups table: id → archived [`StoredGroup`].
const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("groups");

/// The revocations table: a revoked certificate's serial in hex → the
/// serial. Revocations the head has enforced stay in force across its
/// restarts and takeovers, whatever `crl.pem` it then finds.
const REVOKED: TableDefinition<&str, &[u8]> = TableDefinition::new("revoked");

/// The tables, by name, in the order [`Entries`] holds them.
pub(crate) const TABLES: [&str; 3] = ["jobs", "groups", "revoked"];

/// One entry of a table: its key and its archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    /// The key it is filed under.
    pub(crate) key: String,
    /// The archive (for revocations, the serial itself).
    pub(crate) bytes: Vec<u8>,
}

/// One table's entries, in key order.
pub(crate) type Rows = Vec<Row>;

/// Every entry of the store, per table: the form a
/// replica holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Entries {
    /// The jobs table's.
    pub(crate) jobs: Rows,
    /// The groups table's.
    pub(crate) groups: Rows,
    /// The revocations table's (the value is the serial itself).
    pub(crate) revoked: Rows,
}

impl Entries {
    /// The entries of the table named `table` (one of [`TABLES`]).
    pub(crate) fn table_mut(&mut self, table: &str) -> Option<&mut Rows> {
        match table {
            "jobs" => Some(&mut self.jobs),
            "groups" => Some(&mut self.groups),
            "revoked" => Some(&mut self.revoked),
            _ => None,
        }
    }

    /// Each table's name with its entries.
    pub(crate) fn tables(&self) -> [(&'static str, &Rows); 3] {
        [
            (TABLES[0], &self.jobs),
            (TABLES[1], &self.groups),
            (TABLES[2], &self.revoked),
        ]
    }
}

/// A serial's key in the revocations table: its bytes in hex.
fn serial_key(serial: &[u8]) -> String {
    serial.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file the store lives in, in the head's state directory.
pub const FILE: &str = "head.redb";

/// Why the store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeadStoreError {
    /// The file could not be opened or created as a store.
    #[error("head store {path}: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A read or a write failed.
    #[error("head store {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// An entry is not what its table holds, as this version reads it.
    #[error("head store {path}: {table} entry {key} is not readable: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Its table (`jobs`, `groups`, `revoked`).
        table: &'static str,
        /// The entry's key.
        key: String,
        /// What the check found.
        reason: String,
    },
}

/// Where a store's committed changes are written too (a head set's
/// primary mirrors them beside its lease: [`crate::head::head_replica`]).
pub trait Mirror: Send + Sync {
    /// Writes `bytes` as `key` of `table` (`jobs`, `groups`).
    fn put(&self, table: &str, key: &str, bytes: &[u8]) -> Result<(), String>;
    /// Removes `key` of `table`.
    fn remove(&self, table: &str, key: &str) -> Result<(), String>;
}

/// The head's control state on disk. Shared by the services that write
/// it (each write is its own transaction).
pub struct HeadStore {
    db: redb::Database,
    path: PathBuf,
    /// Where each change is mirrored for standby heads, if anywhere.
    replica: Option<Box<dyn Mirror>>,
}

impl std::fmt::Debug for HeadStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadStore")
            .field("path", &self.path)
            .finish()
    }
}

/// A job's key: its submission order.
fn job_key(job: &StoredJob) -> String {
    job.seq.to_string()
}

/// A group's key: its id.
fn group_key(group: &StoredGroup) -> String {
    group.id.to_string()
}

/// An archive read from aligned memory.
fn read_archive<T>(bytes: &[u8]) -> Result<T, String>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<T, rkyv::rancor::Error>(&aligned).map_err(|e| e.to_string())
}

impl HeadStore {
    /// Opens the store in `dir` ([`FILE`]), creating it where there is none.
    pub fn open_in(dir: &Path) -> Result<Self, HeadStoreError> {
        Self::open(&dir.join(FILE))
    }

    /// Opens the store at `path`, creating it where there is none.
    pub fn open(path: &Path) -> Result<Self, HeadStoreError> {
        let fail = |reason: String| HeadStoreError::Open {
            path: path.to_path_buf(),
            reason,
        };
        let db = redb::Database::create(path).map_err(|e| fail(e.to_string()))?;
        // The tables exist from the start, so reads never meet their absence.
        let tx = db.begin_write().map_err(|e| fail(e.to_string()))?;
        tx.open_table(JOBS).map_err(|e| fail(e.to_string()))?;
        tx.open_table(GROUPS).map_err(|e| fail(e.to_string()))?;
        tx.open_table(REVOKED).map_err(|e| fail(e.to_string()))?;
        tx.commit().map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            db,
            path: path.to_path_buf(),
            replica: None,
        })
    }

    /// Mirrors every change, once committed here, to `replica` (a change
    /// the replica refuses is an error, as one the file refuses is).
    pub fn with_replica(mut self, replica: impl Mirror + 'static) -> Self {
        self.replica = Some(Box::new(replica));
        self
    }

    /// Writes `entries` (the replica's form) in one transaction, each
    /// checked as the loads check them.
    pub(crate) fn import(&self, entries: &Entries) -> Result<(), HeadStoreError> {
        let jobs: Vec<StoredJob> = self.checked("jobs", &entries.jobs, job_key)?;
        let groups: Vec<StoredGroup> = self.checked("groups", &entries.groups, group_key)?;
        self.checked_serials(&entries.revoked)?;
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut table = tx.open_table(JOBS).map_err(|e| self.io(e))?;
            for (job, Row { bytes, .. }) in jobs.iter().zip(&entries.jobs) {
                table
                    .insert(job.seq, bytes.as_slice())
                    .map_err(|e| self.io(e))?;
            }
            let mut table = tx.open_table(GROUPS).map_err(|e| self.io(e))?;
            for (group, Row { bytes, .. }) in groups.iter().zip(&entries.groups) {
                table
                    .insert(group.id.as_str(), bytes.as_slice())
                    .map_err(|e| self.io(e))?;
            }
            let mut table = tx.open_table(REVOKED).map_err(|e| self.io(e))?;
            for Row { key, bytes: serial } in &entries.revoked {
                table
                    .insert(key.as_str(), serial.as_slice())
                    .map_err(|e| self.io(e))?;
            }
        }
        self.commit(tx)
    }

    /// Every entry, in the form [`HeadStore::import`] takes, each checked
    /// as the loads check them.
    pub(crate) fn export(&self) -> Result<Entries, HeadStoreError> {
        let entries = Entries {
            jobs: self.entries(JOBS)?,
            groups: self.entries(GROUPS)?,
            revoked: self.entries(REVOKED)?,
        };
        self.checked::<StoredJob>("jobs", &entries.jobs, job_key)?;
        self.checked::<StoredGroup>("groups", &entries.groups, group_key)?;
        self.checked_serials(&entries.revoked)?;
        Ok(entries)
    }

    /// Mirrors a committed change to the replica, if there is one.
    fn mirror(&self, table: &str, key: String, value: Option<&[u8]>) -> Result<(), HeadStoreError> {
        let Some(replica) = &self.replica else {
            return Ok(());
        };
        match value {
            Some(bytes) => replica.put(table, &key, bytes),
            None => replica.remove(table, &key),
        }
        .map_err(|why| {
            self.io(format!(
                "the standby heads' copy refused {table} entry {key}: {why}"
            ))
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: impl std::fmt::Display) -> HeadStoreError {
        HeadStoreError::Io {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    fn corrupt(&self, table: &'static str, key: String, reason: String) -> HeadStoreError {
        HeadStoreError::Corrupt {
            path: self.path.clone(),
            table,
            key,
            reason,
        }
    }

    /// Every entry of `table`, in key order, with its key as text.
    fn entries<K: Key + 'static>(
        &self,
        table: TableDefinition<K, &[u8]>,
    ) -> Result<Rows, HeadStoreError>
    where
        for<'a> K::SelfType<'a>: std::fmt::Display,
    {
        let tx = self.db.begin_read().map_err(|e| self.io(e))?;
        let table = tx.open_table(table).map_err(|e| self.io(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.io(e))? {
            let (key, value) = entry.map_err(|e| self.io(e))?;
            out.push(Row {
                key: key.value().to_string(),
                bytes: value.value().to_vec(),
            });
        }
        Ok(out)
    }

    /// Writes `value` under `key` in `table` (replacing it) and commits,
    /// durably.
    fn put<'k, K: Key + 'static>(
        &self,
        table: TableDefinition<K, &[u8]>,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
        value: &[u8],
    ) -> Result<(), HeadStoreError>
    where
        K::SelfType<'k>: std::fmt::Display,
    {
        let text = key.borrow().to_string();
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut handle = tx.open_table(table).map_err(|e| self.io(e))?;
            handle.insert(key, value).map_err(|e| self.io(e))?;
        }
        self.commit(tx)?;
        self.mirror(table.name(), text, Some(value))
    }

    /// Removes `key` from `table`, durably.
    fn remove<'k, K: Key + 'static>(
        &self,
        table: TableDefinition<K, &[u8]>,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
    ) -> Result<(), HeadStoreError>
    where
        K::SelfType<'k>: std::fmt::Display,
    {
        let text = key.borrow().to_string();
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut handle = tx.open_table(table).map_err(|e| self.io(e))?;
            handle.remove(key).map_err(|e| self.io(e))?;
        }
        self.commit(tx)?;
        self.mirror(table.name(), text, None)
    }

    /// Commits `tx` durably, counting it on the head's metrics.
    fn commit(&self, tx: redb::WriteTransaction) -> Result<(), HeadStoreError> {
        let started = std::time::Instant::now();
        tx.commit().map_err(|e| self.io(e))?;
        let took = started.elapsed();
        let bytes = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        crate::counters::store_committed(bytes, took);
        Ok(())
    }

    /// `entries` of the table `name`, read as `T`; an entry filed under a
    /// key other than its own (`key_of`) is refused too.
    fn checked<T>(
        &self,
        name: &'static str,
        entries: &[Row],
        key_of: impl Fn(&T) -> String,
    ) -> Result<Vec<T>, HeadStoreError>
    where
        T: rkyv::Archive,
        T::Archived: for<'a> rkyv::bytecheck::CheckBytes<
                rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>,
            > + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    {
        entries
            .iter()
            .map(|Row { key, bytes }| {
                let value: T =
                    read_archive(bytes).map_err(|why| self.corrupt(name, key.clone(), why))?;
                let own = key_of(&value);
                if own != *key {
                    return Err(self.corrupt(name, key.clone(), format!("it says it is {own}")));
                }
                Ok(value)
            })
            .collect()
    }

    /// The serials of revocation entries, each filed under its own key.
    fn checked_serials(&self, entries: &[Row]) -> Result<Vec<Vec<u8>>, HeadStoreError> {
        entries
            .iter()
            .map(|Row { key, bytes: serial }| {
                if serial.is_empty() || serial_key(serial) != *key {
                    return Err(self.corrupt(
                        "revoked",
                        key.clone(),
                        format!("it holds the serial {}", serial_key(serial)),
                    ));
                }
                Ok(serial.clone())
            })
            .collect()
    }

    /// Every revoked certificate serial the head has enforced, sorted.
    pub fn load_revoked(&self) -> Result<Vec<Vec<u8>>, HeadStoreError> {
        let mut serials = self.checked_serials(&self.entries(REVOKED)?)?;
        serials.sort();
        Ok(serials)
    }

    /// Adds each of `serials` not stored yet to the revocations, durably
    /// (one commit, then mirrored); the number added.
    pub fn add_revoked(&self, serials: &[Vec<u8>]) -> Result<usize, HeadStoreError> {
        let known = self.load_revoked()?;
        let mut added = Vec::new();
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut table = tx.open_table(REVOKED).map_err(|e| self.io(e))?;
            for serial in serials {
                if serial.is_empty() || known.contains(serial) || added.contains(&serial) {
                    continue;
                }
                table
                    .insert(serial_key(serial).as_str(), serial.as_slice())
                    .map_err(|e| self.io(e))?;
                added.push(serial);
            }
        }
        if added.is_empty() {
            tx.abort().map_err(|e| self.io(e))?;
            return Ok(0);
        }
        self.commit(tx)?;
        for serial in &added {
            self.mirror(REVOKED.name(), serial_key(serial), Some(serial.as_slice()))?;
        }
        Ok(added.len())
    }

    /// Every stored job, in submission order.
    pub fn load_jobs(&self) -> Result<Vec<StoredJob>, HeadStoreError> {
        self.checked("jobs", &self.entries(JOBS)?, job_key)
    }

    /// Writes `job` (replacing its entry) and commits, durably.
    pub fn put_job(&self, job: &StoredJob) -> Result<(), HeadStoreError> {
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(job).map_err(|e| self.io(e))?;
        self.put(JOBS, job.seq, &bytes)
    }

    /// Removes the job at `seq`, durably.
    pub fn remove_job(&self, seq: u64) -> Result<(), HeadStoreError> {
        self.remove(JOBS, seq)
    }

    /// Every stored placement group, by id.
    pub fn load_groups(&self) -> Result<Vec<StoredGroup>, HeadStoreError> {
        self.checked("groups", &self.entries(GROUPS)?, group_key)
    }

    /// Writes `group` (replacing its entry) and commits, durably.
    pub fn put_group(&self, group: &StoredGroup) -> Result<(), HeadStoreError> {
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(group).map_err(|e| self.io(e))?;
        self.put(GROUPS, group.id.as_str(), &bytes)
    }

    /// Removes the group `id`, durably.
    pub fn remove_group(&self, id: &str) -> Result<(), HeadStoreError> {
        self.remove(GROUPS, id)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use flotilla_proto::jobs::{JobRecord, JobSpec};
    use flotilla_proto::placement::Resources;

    use super::*;
    use flotilla_proto::ids::MemberName;
    use flotilla_proto::incarnation::Incarnation;

    /// A stored job of submission place `seq`.
    pub(crate) fn job(seq: u64) -> StoredJob {
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
            group: Some(format!("pg1-{seq}").into()),
            ended_unix_ms: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flotilla-head-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn jobs_written_are_read_back_after_the_store_is_opened_again() {
        let dir = scratch("reopen");
        {
            let store = HeadStore::open_in(&dir).unwrap();
            assert!(store.load_jobs().unwrap().is_empty());
            for seq in [3, 1, 2] {
                store.put_job(&job(seq)).unwrap();
            }
            let mut ended = job(2);
            ended.ended_unix_ms = Some(1_700_000_000_000);
            store.put_job(&ended).unwrap();
            store.remove_job(3).unwrap();
        }
        let store = HeadStore::open_in(&dir).unwrap();
        let jobs = store.load_jobs().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0], job(1));
        assert_eq!(jobs[1].ended_unix_ms, Some(1_700_000_000_000));
        assert_eq!(jobs[1].view.node.as_deref(), Some("w1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn revocations_stay_across_a_reopen_and_travel_in_the_replica_form() {
        let dir = scratch("revoked");
        {
            let store = HeadStore::open_in(&dir).unwrap();
            assert!(store.load_revoked().unwrap().is_empty());
            assert_eq!(
                store.add_revoked(&[vec![0x0b, 0x01], vec![0x0a]]).unwrap(),
                2
            );
            // Known ones and empty serials are not added again.
            assert_eq!(store.add_revoked(&[vec![0x0a], vec![]]).unwrap(), 0);
        }
        let store = HeadStore::open_in(&dir).unwrap();
        assert_eq!(
            store.load_revoked().unwrap(),
            vec![vec![0x0a], vec![0x0b, 0x01]]
        );
        let entries = store.export().unwrap();
        assert_eq!(
            entries.revoked[0],
            Row {
                key: "0a".to_owned(),
                bytes: vec![0x0a]
            }
        );
        let copy = scratch("revoked-copy");
        let other = HeadStore::open_in(&copy).unwrap();
        other.import(&entries).unwrap();
        assert_eq!(other.load_revoked().unwrap(), store.load_revoked().unwrap());
        // An entry filed under another serial's key is refused.
        let mut forged = Entries::default();
        forged.revoked.push(Row {
            key: "0a".into(),
            bytes: vec![0x0c],
        });
        let err = other.import(&forged).unwrap_err();
        assert!(
            matches!(
                err,
                HeadStoreError::Corrupt {
                    table: "revoked",
                    ..
                }
            ),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&copy).unwrap();
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
        let err = HeadStore::open(&path).unwrap_err();
        assert!(matches!(err, HeadStoreError::Open { .. }), "{err}");
        assert!(err.to_string().contains(FILE), "{err}");
        std::fs::remove_file(&path).unwrap();

        let store = HeadStore::open(&path).unwrap();
        let tx = store.db.begin_write().unwrap();
        {
            let mut table = tx.open_table(JOBS).unwrap();
            table.insert(7u64, &b"\x01\x02 not an archive"[..]).unwrap();
        }
        tx.commit().unwrap();
        let err = store.load_jobs().unwrap_err();
        assert!(
            matches!(&err, HeadStoreError::Corrupt { table: "jobs", key, .. } if key == "7"),
            "{err}"
        );
        // An archive filed under another key is refused too.
        store.remove_job(7).unwrap();
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&job(4)).unwrap();
        let tx = store.db.begin_write().unwrap();
        {
            let mut table = tx.open_table(JOBS).unwrap();
            table.insert(5u64, bytes.as_slice()).unwrap();
        }
        tx.commit().unwrap();
        assert!(matches!(
            store.load_jobs().unwrap_err(),
            HeadStoreError::Corrupt { table: "jobs", key, .. } if key == "5"
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn group(id: &str, was_ready: bool) -> StoredGroup {
        StoredGroup {
            id: id.into(),
            spec: flotilla_proto::groups::GroupSpec::new(
                flotilla_proto::placement::Strategy::Spread,
                vec![flotilla_proto::groups::bundle(&[("cpu", 1.0)]); 2],
            ),
            owner: Some(flotilla_proto::incarnation::MemberRef::new(
                "d1",
                Incarnation::new(7),
            )),
            was_ready,
            nodes: if was_ready {
                vec!["w1".into(), "w2".into()]
            } else {
                vec![MemberName::default(); 2]
            },
            revision: u64::from(was_ready),
            deadline_unix_ms: 1_700_000_030_000,
        }
    }

    #[test]
    fn groups_written_are_read_back_beside_the_jobs() {
        let dir = scratch("groups");
        {
            let store = HeadStore::open_in(&dir).unwrap();
            store.put_job(&job(1)).unwrap();
            store.put_group(&group("pg1-2", false)).unwrap();
            store.put_group(&group("pg1-1", false)).unwrap();
            store.put_group(&group("pg1-1", true)).unwrap();
            store.put_group(&group("pg1-3", false)).unwrap();
            store.remove_group("pg1-3").unwrap();
        }
        let store = HeadStore::open_in(&dir).unwrap();
        assert_eq!(
            store.load_groups().unwrap(),
            vec![group("pg1-1", true), group("pg1-2", false)]
        );
        assert_eq!(store.load_jobs().unwrap(), vec![job(1)]);
        // A group filed under another id is refused, naming the entry.
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&group("pg1-9", false)).unwrap();
        store.put(GROUPS, "pg1-8", &bytes).unwrap();
        let err = store.load_groups().unwrap_err();
        assert!(
            matches!(&err, HeadStoreError::Corrupt { table: "groups", key, .. } if key == "pg1-8"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
