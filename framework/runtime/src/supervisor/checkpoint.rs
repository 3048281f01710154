//! Checkpoints: snapshots of an actor's state in an object store, so that
//! an actor restarted (on this node or another) continues from its last
//! snapshot instead of from scratch.
//!
//! ```text
//! save(actor, seq, state) ──► PREFIX/ACTOR/SEQ.ckpt  (one put: whole or absent)
//!                              header: magic, format, seq, length, sha-256
//!                              body:   rkyv archive of the state
//!                              older than the last `keep`: deleted
//! restore(actor) ──► newest snapshot that reads back whole and valid;
//!                    a corrupt or truncated one is skipped with a warning
//!                    (NODE-CKPT-002) and the one before it used; none: fresh start
//! fence(actor, start) ──► PREFIX/@ISSUER/ACTOR/EPOCH.epoch announces a
//!                    start; its saves go to EPOCH-SEQ.ckpt there, refused
//!                    (NODE-CKPT-006) once a newer epoch is announced; its
//!                    restore takes the newest snapshot of the newest epoch
//!                    not above its own
//! ```
//!
//! Epochs fence the copies of one supervised child: its supervisor gives
//! every start a larger one ([`flotilla_proto::epoch`]), so a copy left
//! running on a node cut off from the cluster stops being able to save the
//! moment its replacement has announced itself. A store lists the folder
//! before each put, so a save that began before the announcement can still
//! land; it is then older than every snapshot the replacement writes, and
//! never restored over them.
//!
//! A [`Start`] is not taken from a peer's word: the node that spawns a
//! child of a kind registered with
//! [`NodeBuilder::fences_checkpoints`](crate::NodeBuilder::fences_checkpoints)
//! writes it into the child's arguments itself, the epoch from the spawn
//! order and the issuer from the certificate that asked, over whatever
//! the arguments said. The fenced snapshots of one issuer live under
//! `@ISSUER/` (no actor name starts with `@`), so another certificate's
//! spawn of a child of the same name, whatever epoch it claims, neither
//! locks the child out of its checkpoints nor gets its state restored
//! into it. Unfenced saves ([`CheckpointStore::save`]) are keyed by the
//! actor's name alone.
//!
//! The store is a local folder, or any URL `object_store` parses
//! (`file:///…`, `s3://bucket/prefix`, with its settings from the
//! environment as for the embed job's output).

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

pub use flotilla_proto::epoch::{Epoch, Start, TakesStart};

use crate::objects::object_url::{is_url, open_url};
use crate::remote::wire::{Decode, Encode, decode, encode};

/// The first bytes of every checkpoint object.
const MAGIC: &[u8; 4] = b"FLCK";
/// The layout version after the magic.
const FORMAT: u8 = 1;
/// Magic, format, sequence, length, digest.
const HEADER: usize = 4 + 1 + 8 + 8 + 32;

/// Why a checkpoint could not be saved or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The store's URL or folder is unusable.
    #[error("NODE-CKPT-001: checkpoint store {at:?}: {why}")]
    Store {
        /// The URL or folder.
        at: String,
        /// Why.
        why: String,
    },
    /// The store failed an operation.
    #[error("NODE-CKPT-003: checkpoint store {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The object.
        path: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// An actor name that cannot be an object name.
    #[error(
        "NODE-CKPT-004: actor name {0:?} cannot name a checkpoint (use letters, digits, '.', '-', '_')"
    )]
    Name(String),
    /// A failpoint made the operation fail.
    #[error("NODE-CKPT-005: failpoint {0} fired")]
    Injected(&'static str),
    /// A newer start of the actor has announced itself: this copy is
    /// stale and may no longer save.
    #[error(
        "NODE-CKPT-006: checkpoint of {actor} at epoch {epoch} refused: epoch {newer} has started since (this copy is stale)"
    )]
    Stale {
        /// The actor.
        actor: String,
        /// This copy's epoch.
        epoch: Epoch,
        /// The newest epoch the store has seen.
        newer: Epoch,
    },
    /// An epoch further ahead of this node's clock than any supervisor
    /// issues ([`flotilla_proto::epoch::MAX_AHEAD_MICROS`]): forged, and
    /// neither announced nor used.
    #[error(
        "NODE-CKPT-007: checkpoint of {actor} at epoch {epoch} refused: it is more than a minute ahead of this node's clock ({now}), so no supervisor issued it"
    )]
    FromTheFuture {
        /// The actor.
        actor: String,
        /// The epoch given.
        epoch: Epoch,
        /// This node's clock, in microseconds since the Unix epoch.
        now: u64,
    },
    /// A start without an epoch or an issuer cannot fence: the actor's
    /// kind was not registered with
    /// [`NodeBuilder::fences_checkpoints`](crate::NodeBuilder::fences_checkpoints),
    /// or it was started without a supervisor.
    #[error(
        "NODE-CKPT-008: checkpoint of {0} cannot be fenced: its start has no epoch or no issuer"
    )]
    Unfenced(String),
}

/// `Err` when `epoch` (of `actor`) is not one a supervisor issues.
fn plausible(actor: &str, epoch: Epoch) -> Result<(), CheckpointError> {
    let now = crate::clock::clock_micros();
    if flotilla_proto::epoch::plausible(epoch, now) {
        Ok(())
    } else {
        Err(CheckpointError::FromTheFuture {
            actor: actor.to_owned(),
            epoch,
            now,
        })
    }
}

/// One object of an actor's checkpoint folder, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// A snapshot: epoch ([`Epoch::NONE`] when unfenced) and sequence.
    Snapshot(Epoch, u64),
    /// A start's announcement of its epoch.
    Announced(Epoch),
}

impl Entry {
    /// The entry an object name stands for, if any.
    fn parse(name: &str) -> Option<Self> {
        if let Some(epoch) = name.strip_suffix(".epoch") {
            return Some(Self::Announced(Epoch::from_micros(epoch.parse().ok()?)));
        }
        let stem = name.strip_suffix(".ckpt")?;
        match stem.split_once('-') {
            Some((epoch, seq)) => Some(Self::Snapshot(
                Epoch::from_micros(epoch.parse().ok()?),
                seq.parse().ok()?,
            )),
            None => Some(Self::Snapshot(Epoch::NONE, stem.parse().ok()?)),
        }
    }

    /// The object's name.
    fn name(self) -> String {
        match self {
            Self::Snapshot(epoch, seq) if epoch.is_none() => format!("{seq:020}.ckpt"),
            Self::Snapshot(epoch, seq) => format!("{:020}-{seq:020}.ckpt", epoch.micros()),
            Self::Announced(epoch) => format!("{:020}.epoch", epoch.micros()),
        }
    }

    fn epoch(self) -> Epoch {
        match self {
            Self::Snapshot(epoch, _) | Self::Announced(epoch) => epoch,
        }
    }
}

/// Why one checkpoint object was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    /// Shorter than its header says.
    #[error("truncated: {got} bytes, {want} expected")]
    Truncated {
        /// Bytes read.
        got: usize,
        /// Bytes the header announces.
        want: usize,
    },
    /// Not a checkpoint, or another layout version.
    #[error("not a checkpoint of this format")]
    Format,
    /// The body does not match its digest.
    #[error("the checksum does not match")]
    Checksum,
    /// The header's sequence is not the one in the object's name.
    #[error("sequence {inside} inside, {named} in the name")]
    Sequence {
        /// In the header.
        inside: u64,
        /// In the name.
        named: u64,
    },
    /// The body is not a valid archive of the state type.
    #[error("the state does not decode: {0}")]
    Decode(String),
}

/// Snapshots of actors' states in one store.
#[derive(Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    keep: usize,
    label: String,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore")
            .field("at", &self.label)
            .field("keep", &self.keep)
            .finish()
    }
}

impl CheckpointStore {
    /// The store at `at` (a local folder, created if missing, or a URL),
    /// keeping the last `keep` snapshots of each actor (at least 1).
    pub fn open(at: &str, keep: usize) -> Result<Self, CheckpointError> {
        let refused = |why: String| CheckpointError::Store {
            at: at.to_owned(),
            why,
        };
        let (store, prefix) = if is_url(at) {
            open_url(at).map_err(refused)?
        } else {
            std::fs::create_dir_all(at).map_err(|e| refused(e.to_string()))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(at)
                .map_err(|e| refused(e.to_string()))?;
            (Arc::new(fs) as Arc<dyn ObjectStore>, Path::default())
        };
        Ok(Self {
            store,
            prefix,
            keep: keep.max(1),
            label: at.to_owned(),
        })
    }

    /// Where it keeps its snapshots, as given.
    pub fn location(&self) -> &str {
        &self.label
    }

    /// The folder of `actor`'s unfenced snapshots.
    fn folder(&self, actor: &str) -> Result<Path, CheckpointError> {
        Ok(self.prefix.clone().join(object_name(actor)?))
    }

    /// The folder of `actor`'s snapshots fenced by starts `issuer` issued.
    fn fenced_folder(&self, issuer: &str, actor: &str) -> Result<Path, CheckpointError> {
        let issuer = format!("@{}", object_name(issuer)?);
        Ok(self.prefix.clone().join(issuer).join(object_name(actor)?))
    }

    /// Saves `state` as snapshot `seq` of `actor` (one put: the object is
    /// whole or absent), then deletes its snapshots older than the last
    /// `keep`. Unfenced: keyed by the actor's name alone, apart from the
    /// snapshots of fenced starts ([`CheckpointStore::fence`]).
    pub async fn save<T: Encode>(
        &self,
        actor: &str,
        seq: u64,
        state: &T,
    ) -> Result<(), CheckpointError> {
        let folder = self.folder(actor)?;
        self.save_at(actor, &folder, Epoch::NONE, seq, state).await
    }

    /// Announces `start` of `actor` (its supervisor's epoch and issuer)
    /// and returns its checkpoints under that epoch, kept apart from every
    /// other issuer's. Refused as [`CheckpointError::Stale`] if a newer
    /// epoch of the same issuer has announced itself already, as
    /// [`CheckpointError::FromTheFuture`] for an epoch no supervisor
    /// issues, and as [`CheckpointError::Unfenced`] for a start without an
    /// epoch or issuer.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("flotilla-doc-fence-{}", std::process::id()));
    /// use flotilla::checkpoint::{CheckpointStore, Epoch, Start};
    /// let store = CheckpointStore::open(dir.to_str().unwrap(), 3)?;
    /// let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    /// let now = Epoch::from_micros(now.as_micros() as u64);
    /// let first = store.fence("counter", &Start::new("head", now)).await?;
    /// first.save(1, &7u64).await?;
    /// // The next start, at a larger epoch, continues from it; the first may no longer save.
    /// let later = Epoch::from_micros(first.epoch().micros() + 1);
    /// let second = store.fence("counter", &Start::new("head", later)).await?;
    /// assert_eq!(second.restore::<u64>().await?, Some((1, 7)));
    /// assert!(first.save(2, &8u64).await.is_err());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub async fn fence(&self, actor: &str, start: &Start) -> Result<Fenced, CheckpointError> {
        let epoch = start.epoch();
        if !start.is_fenced() {
            return Err(CheckpointError::Unfenced(actor.to_owned()));
        }
        plausible(actor, epoch)?;
        let folder = self.fenced_folder(start.issuer(), actor)?;
        let listed = self.entries(&folder).await?;
        admit(actor, epoch, &listed)?;
        let path = folder.clone().join(Entry::Announced(epoch).name());
        self.put(&path, epoch.to_string().into_bytes()).await?;
        // Earlier announcements are not needed once this one is there.
        for (entry, old) in listed {
            if matches!(entry, Entry::Announced(e) if e < epoch)
                && let Err(source) = self.store.delete(&old).await
            {
                tracing::warn!(path = %old, error = %source, "cannot delete an old epoch");
            }
        }
        Ok(Fenced {
            store: self.clone(),
            actor: actor.to_owned(),
            folder,
            epoch,
        })
    }

    /// Saves `state` as snapshot `seq` of `actor` at `epoch` in `folder`,
    /// unless a newer epoch has announced itself there, then deletes
    /// snapshots older than the last `keep`.
    async fn save_at<T: Encode>(
        &self,
        actor: &str,
        folder: &Path,
        epoch: Epoch,
        seq: u64,
        state: &T,
    ) -> Result<(), CheckpointError> {
        fail::fail_point!("checkpoint::save", |_| Err(CheckpointError::Injected(
            "checkpoint::save"
        )));
        // One listing serves the epoch check and the pruning after the put
        // (a snapshot another writer adds meanwhile is pruned next time).
        let listed = self.entries(folder).await?;
        admit(actor, epoch, &listed)?;
        let path = folder.clone().join(Entry::Snapshot(epoch, seq).name());
        let body = encode(state);
        let mut object = Vec::with_capacity(HEADER + body.len());
        object.extend_from_slice(MAGIC);
        object.push(FORMAT);
        object.extend_from_slice(&seq.to_le_bytes());
        object.extend_from_slice(&(body.len() as u64).to_le_bytes());
        object.extend_from_slice(&Sha256::digest(&body));
        object.extend_from_slice(&body);
        self.put(&path, object).await?;
        let mut snapshots = snapshots(listed);
        snapshots.retain(|(key, _)| *key != (epoch, seq));
        snapshots.push(((epoch, seq), path));
        flotilla_proto::epoch::restore_order(Epoch::from_micros(u64::MAX), &mut snapshots);
        for (_, old) in snapshots.into_iter().skip(self.keep) {
            if let Err(source) = self.store.delete(&old).await {
                tracing::warn!(path = %old, error = %source, "cannot delete an old checkpoint");
            }
        }
        Ok(())
    }

    /// The newest valid snapshot of `actor` and its sequence; `None` if it
    /// has none. Corrupt ones are skipped with a warning.
    pub async fn restore<T: Decode>(
        &self,
        actor: &str,
    ) -> Result<Option<(u64, T)>, CheckpointError> {
        let folder = self.folder(actor)?;
        self.restore_at(&folder, Epoch::from_micros(u64::MAX)).await
    }

    /// The newest valid snapshot in `folder` of the newest epoch not above
    /// `epoch`, and its sequence.
    async fn restore_at<T: Decode>(
        &self,
        folder: &Path,
        epoch: Epoch,
    ) -> Result<Option<(u64, T)>, CheckpointError> {
        fail::fail_point!("checkpoint::restore", |_| Err(CheckpointError::Injected(
            "checkpoint::restore"
        )));
        let mut found = snapshots(self.entries(folder).await?);
        flotilla_proto::epoch::restore_order(epoch, &mut found);
        for ((_, seq), path) in found {
            let bytes = match self.store.get(&path).await {
                Ok(found) => found.bytes().await,
                Err(e) => Err(e),
            };
            let bytes = match bytes {
                Ok(b) => b,
                // Deleted by a concurrent save since the listing: older ones
                // follow.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(source) => {
                    return Err(CheckpointError::Io {
                        op: "get",
                        path: path.to_string(),
                        source,
                    });
                }
            };
            match read::<T>(&bytes, seq) {
                Ok(state) => return Ok(Some((seq, state))),
                Err(why) => {
                    tracing::warn!(%path, error = %why, "NODE-CKPT-002: skipping a corrupt checkpoint; trying the one before")
                }
            }
        }
        Ok(None)
    }

    /// Writes `bytes` to `path` in one put.
    async fn put(&self, path: &Path, bytes: Vec<u8>) -> Result<(), CheckpointError> {
        self.store
            .put(path, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|source| CheckpointError::Io {
                op: "put",
                path: path.to_string(),
                source,
            })
    }

    /// The objects right in `folder` that are snapshots or epochs.
    async fn entries(&self, folder: &Path) -> Result<Vec<(Entry, Path)>, CheckpointError> {
        let depth = folder.parts().count() + 1;
        let listed: Vec<_> =
            self.store
                .list(Some(folder))
                .try_collect()
                .await
                .map_err(|source| CheckpointError::Io {
                    op: "list",
                    path: folder.to_string(),
                    source,
                })?;
        // An epoch no supervisor issued (one a forged start announced) is
        // not counted: it would lock every later start out.
        let now = crate::clock::clock_micros();
        Ok(listed
            .into_iter()
            .filter_map(|meta| {
                if meta.location.parts().count() != depth {
                    return None;
                }
                let entry = Entry::parse(meta.location.filename()?)?;
                if !flotilla_proto::epoch::plausible(entry.epoch(), now) {
                    tracing::warn!(path = %meta.location, "a checkpoint entry's epoch is further ahead of the clock than any supervisor issues; not counted");
                    return None;
                }
                Some((entry, meta.location))
            })
            .collect())
    }
}

/// `name` (an actor's or an issuer's) as one part of an object's path:
/// letters, digits, '.', '-' and '_' only, and neither `.` nor `..`.
fn object_name(name: &str) -> Result<&str, CheckpointError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && name != "."
        && name != "..";
    if ok {
        Ok(name)
    } else {
        Err(CheckpointError::Name(name.to_owned()))
    }
}

/// The snapshots among `listed`: (epoch, sequence) and path, unordered.
fn snapshots(listed: Vec<(Entry, Path)>) -> Vec<((Epoch, u64), Path)> {
    listed
        .into_iter()
        .filter_map(|(entry, path)| match entry {
            Entry::Snapshot(e, seq) => Some(((e, seq), path)),
            Entry::Announced(_) => None,
        })
        .collect()
}

/// Whether a folder holding `listed` admits `actor`'s effect at `epoch`:
/// refused as [`CheckpointError::Stale`] once it holds a newer epoch.
fn admit(actor: &str, epoch: Epoch, listed: &[(Entry, Path)]) -> Result<(), CheckpointError> {
    let newest = listed.iter().map(|(e, _)| e.epoch()).max();
    if flotilla_proto::epoch::admits(epoch, newest) {
        return Ok(());
    }
    Err(CheckpointError::Stale {
        actor: actor.to_owned(),
        epoch,
        newer: newest.unwrap_or_default(),
    })
}

/// The checkpoints of one start of an actor, at the epoch its supervisor
/// gave it (from [`CheckpointStore::fence`]).
#[derive(Debug, Clone)]
pub struct Fenced {
    store: CheckpointStore,
    actor: String,
    folder: Path,
    epoch: Epoch,
}

impl Fenced {
    /// The epoch of this start.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Saves `state` as snapshot `seq`, unless a newer start has announced
    /// itself ([`CheckpointError::Stale`]: this copy should stop).
    pub async fn save<T: Encode>(&self, seq: u64, state: &T) -> Result<(), CheckpointError> {
        self.store
            .save_at(&self.actor, &self.folder, self.epoch, seq, state)
            .await
    }

    /// The newest valid snapshot of the newest epoch not above this one,
    /// and its sequence.
    pub async fn restore<T: Decode>(&self) -> Result<Option<(u64, T)>, CheckpointError> {
        self.store.restore_at(&self.folder, self.epoch).await
    }
}

/// The state in a checkpoint object named with `seq`.
fn read<T: Decode>(bytes: &[u8], seq: u64) -> Result<T, Corrupt> {
    if bytes.len() < HEADER {
        if bytes.len() >= 5 && &bytes[..4] == MAGIC {
            return Err(Corrupt::Truncated {
                got: bytes.len(),
                want: HEADER,
            });
        }
        return Err(Corrupt::Format);
    }
    if &bytes[..4] != MAGIC || bytes[4] != FORMAT {
        return Err(Corrupt::Format);
    }
    let inside = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(bytes[13..21].try_into().expect("8 bytes")) as usize;
    let body = &bytes[HEADER..];
    if body.len() != len {
        return Err(Corrupt::Truncated {
            got: bytes.len(),
            want: HEADER.saturating_add(len),
        });
    }
    if Sha256::digest(body).as_slice() != &bytes[21..HEADER] {
        return Err(Corrupt::Checksum);
    }
    if inside != seq {
        return Err(Corrupt::Sequence { inside, named: seq });
    }
    decode::<T>(body).map_err(|e| Corrupt::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
    struct Count {
        n: u64,
        note: String,
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("flotilla-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn count(n: u64) -> Count {
        Count {
            n,
            note: format!("at {n}"),
        }
    }

    #[tokio::test]
    async fn the_newest_snapshot_is_restored_and_only_the_last_few_kept() {
        let dir = scratch("keep");
        let store = CheckpointStore::open(dir.to_str().unwrap(), 3).unwrap();
        assert_eq!(store.restore::<Count>("counter").await.unwrap(), None);
        for seq in 1..=5 {
            store.save("counter", seq, &count(seq * 10)).await.unwrap();
        }
        assert_eq!(
            store.restore::<Count>("counter").await.unwrap(),
            Some((5, count(50)))
        );
        let mut kept: Vec<String> = std::fs::read_dir(dir.join("counter"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                "00000000000000000003.ckpt",
                "00000000000000000004.ckpt",
                "00000000000000000005.ckpt"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_corrupt_or_truncated_newest_snapshot_is_skipped_for_the_one_before() {
        let dir = scratch("corrupt");
        let store = CheckpointStore::open(dir.to_str().unwrap(), 5).unwrap();
        for seq in 1..=3 {
            store.save("c", seq, &count(seq)).await.unwrap();
        }
        let newest = dir.join("c").join("00000000000000000003.ckpt");
        let mut bytes = std::fs::read(&newest).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&newest, &bytes).unwrap();
        assert_eq!(
            store.restore::<Count>("c").await.unwrap(),
            Some((2, count(2)))
        );
        // Truncated, as by a crash of a store without atomic puts.
        let second = dir.join("c").join("00000000000000000002.ckpt");
        let bytes = std::fs::read(&second).unwrap();
        std::fs::write(&second, &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(
            store.restore::<Count>("c").await.unwrap(),
            Some((1, count(1)))
        );
        // Garbage, and a file that is not named as a snapshot.
        std::fs::write(dir.join("c").join("00000000000000000009.ckpt"), b"junk").unwrap();
        std::fs::write(dir.join("c").join("notes.txt"), b"not a checkpoint").unwrap();
        assert_eq!(
            store.restore::<Count>("c").await.unwrap(),
            Some((1, count(1)))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_kind_of_corruption_is_told_apart() {
        let body = encode(&count(7));
        let mut object = Vec::new();
        object.extend_from_slice(MAGIC);
        object.push(FORMAT);
        object.extend_from_slice(&7u64.to_le_bytes());
        object.extend_from_slice(&(body.len() as u64).to_le_bytes());
        object.extend_from_slice(&Sha256::digest(&body));
        object.extend_from_slice(&body);
        assert_eq!(read::<Count>(&object, 7).unwrap(), count(7));
        assert_eq!(
            read::<Count>(&object, 8).unwrap_err(),
            Corrupt::Sequence {
                inside: 7,
                named: 8
            }
        );
        assert!(matches!(
            read::<Count>(&object[..object.len() - 1], 7),
            Err(Corrupt::Truncated { .. })
        ));
        assert_eq!(
            read::<Count>(b"PK\x03\x04 zip", 7).unwrap_err(),
            Corrupt::Format
        );
        let mut flipped = object.clone();
        flipped[HEADER] ^= 1;
        assert_eq!(read::<Count>(&flipped, 7).unwrap_err(), Corrupt::Checksum);
        // A whole, checksummed body of another type does not decode.
        let other = encode(&5u8);
        let mut wrong = object[..13].to_vec();
        wrong.extend_from_slice(&(other.len() as u64).to_le_bytes());
        wrong.extend_from_slice(&Sha256::digest(&other));
        wrong.extend_from_slice(&other);
        assert!(matches!(read::<Count>(&wrong, 7), Err(Corrupt::Decode(_))));
    }

    fn object_of(seq: u64, body: &[u8]) -> Vec<u8> {
        let mut object = Vec::new();
        object.extend_from_slice(MAGIC);
        object.push(FORMAT);
        object.extend_from_slice(&seq.to_le_bytes());
        object.extend_from_slice(&(body.len() as u64).to_le_bytes());
        object.extend_from_slice(&Sha256::digest(body));
        object.extend_from_slice(body);
        object
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2048, ..Default::default() })]

        /// A checkpoint's header and body, spoiled at random: read back as
        /// a typed refusal or a state, never a panic. Bodies are also
        /// spoiled under a fresh checksum, so that they reach the decoder.
        #[test]
        fn spoiled_checkpoints_never_panic(
            at in proptest::prelude::any::<usize>(),
            word in proptest::prelude::any::<u64>(),
            cut in proptest::prelude::any::<usize>(),
            resum in proptest::prelude::any::<bool>(),
        ) {
            let body = encode(&count(7));
            let object = object_of(7, &body);
            let mut spoiled = object.clone();
            let at = at % spoiled.len();
            for (i, b) in word.to_le_bytes().into_iter().enumerate() {
                if let Some(slot) = spoiled.get_mut(at + i) {
                    *slot = b;
                }
            }
            spoiled.truncate(spoiled.len() - cut % 4);
            let _ = read::<Count>(&spoiled, 7);
            if resum && at >= HEADER {
                let resealed = object_of(7, &spoiled[HEADER..]);
                let _ = read::<Count>(&resealed, 7);
            }
        }
    }

    fn e(micros: u64) -> Epoch {
        Epoch::from_micros(micros)
    }

    fn by(epoch: u64) -> Start {
        Start::new("head", e(epoch))
    }

    /// Clause "partitions: fenced checkpoints": once a newer start has
    /// announced its epoch, the older copy's saves are refused, its
    /// announcement too, and restores take the newest snapshot of the
    /// newest epoch not above the caller's own.
    #[tokio::test]
    async fn a_stale_epoch_can_neither_save_nor_be_restored_over_a_newer_one() {
        let dir = scratch("epochs");
        let store = CheckpointStore::open(dir.to_str().unwrap(), 4).unwrap();
        let old = store.fence("t", &by(5)).await.unwrap();
        assert_eq!(old.restore::<Count>().await.unwrap(), None);
        old.save(2, &count(2)).await.unwrap();
        old.save(3, &count(3)).await.unwrap();

        let new = store.fence("t", &by(7)).await.unwrap();
        assert_eq!(
            new.restore::<Count>().await.unwrap(),
            Some((3, count(3))),
            "the newest of the older epoch, before the new one saves"
        );
        let refused = old.save(4, &count(4)).await.unwrap_err();
        assert!(
            matches!(
                refused,
                CheckpointError::Stale { epoch, newer, .. } if epoch == e(5) && newer == e(7)
            ),
            "{refused}"
        );
        assert!(refused.to_string().starts_with("NODE-CKPT-006"));
        assert!(matches!(
            store.fence("t", &by(6)).await,
            Err(CheckpointError::Stale { newer, .. }) if newer == e(7)
        ));
        new.save(4, &count(40)).await.unwrap();
        assert_eq!(new.restore::<Count>().await.unwrap(), Some((4, count(40))));
        // A stale copy that reads finds only its own epoch and older.
        assert_eq!(old.restore::<Count>().await.unwrap(), Some((3, count(3))));

        // A snapshot the old copy wrote after the announcement (its listing
        // came first) is never restored over the newer epoch's.
        let fenced = dir.join("@head").join("t");
        std::fs::write(
            fenced.join(Entry::Snapshot(e(5), 99).name()),
            std::fs::read(fenced.join(Entry::Snapshot(e(5), 3).name())).unwrap(),
        )
        .unwrap();
        assert_eq!(new.restore::<Count>().await.unwrap(), Some((4, count(40))));

        // Unfenced snapshots of the same name are another folder's: they
        // neither take the fenced ones' place nor are refused by them.
        store.save("t", 9, &count(9)).await.unwrap();
        assert_eq!(
            store.restore::<Count>("t").await.unwrap(),
            Some((9, count(9)))
        );
        assert_eq!(new.restore::<Count>().await.unwrap(), Some((4, count(40))));
        let unfenced = store.fence("t", &Start::default()).await.unwrap_err();
        assert!(
            unfenced.to_string().starts_with("NODE-CKPT-008"),
            "{unfenced}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn object_names_round_trip_and_legacy_snapshots_are_epoch_zero() {
        for entry in [
            Entry::Snapshot(Epoch::NONE, 7),
            Entry::Snapshot(e(12), 7),
            Entry::Announced(e(12)),
        ] {
            assert_eq!(Entry::parse(&entry.name()), Some(entry));
        }
        assert_eq!(
            Entry::parse("00000000000000000003.ckpt"),
            Some(Entry::Snapshot(Epoch::NONE, 3))
        );
        assert_eq!(Entry::parse("notes.txt"), None);
        assert_eq!(Entry::parse("x-1.ckpt"), None);
    }

    /// A start whose spawn arguments carry a forged epoch (`u64::MAX`)
    /// cannot announce it, and one already in the store (written by a
    /// node without this check) is not counted: the child's next real
    /// start fences, saves and restores its own snapshots.
    #[tokio::test]
    async fn a_forged_epoch_far_ahead_of_the_clock_locks_no_child_out() {
        let dir = scratch("forged");
        let store = CheckpointStore::open(dir.to_str().unwrap(), 4).unwrap();
        let refused = store.fence("t", &by(u64::MAX)).await.unwrap_err();
        assert!(
            matches!(
                refused,
                CheckpointError::FromTheFuture { epoch, .. } if epoch == e(u64::MAX)
            ),
            "{refused}"
        );
        assert!(
            refused.to_string().starts_with("NODE-CKPT-007"),
            "{refused}"
        );
        // As a store a forged start wrote to looks.
        let folder = dir.join("@head").join("t");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join(Entry::Announced(e(u64::MAX)).name()), b"forged").unwrap();
        let now = crate::clock::clock_micros();
        let real = store.fence("t", &by(now)).await.unwrap();
        real.save(1, &count(1)).await.unwrap();
        assert_eq!(real.restore::<Count>().await.unwrap(), Some((1, count(1))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Another certificate's start of a child of the same name, at an
    /// epoch its node's clock allows (half a minute ahead), saving state of
    /// its own: the child's own starts neither are refused nor restore it.
    #[tokio::test]
    async fn another_certificates_start_of_a_child_neither_locks_it_out_nor_feeds_it_state() {
        let dir = scratch("issuers");
        let store = CheckpointStore::open(dir.to_str().unwrap(), 4).unwrap();
        let now = crate::clock::clock_micros();
        let own = store.fence("t", &Start::new("head", e(now))).await.unwrap();
        own.save(1, &count(1)).await.unwrap();

        let forged = store
            .fence("t", &Start::new("mallory", e(now + 30_000_000)))
            .await
            .unwrap();
        forged.save(1_000, &count(666)).await.unwrap();

        own.save(2, &count(2)).await.unwrap();
        let next = store
            .fence("t", &Start::new("head", e(now + 1)))
            .await
            .unwrap();
        assert_eq!(next.restore::<Count>().await.unwrap(), Some((2, count(2))));
        assert!(dir.join("@mallory").join("t").is_dir());
        for bad in ["..", "a/b", "@head"] {
            assert!(
                matches!(
                    store.fence("t", &Start::new(bad, e(now))).await,
                    Err(CheckpointError::Name(_))
                ),
                "issuer {bad:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn names_that_would_escape_the_store_are_refused() {
        let dir = scratch("names");
        let store = CheckpointStore::open(dir.to_str().unwrap(), 1).unwrap();
        for bad in ["", "..", "a/b", "x y"] {
            assert!(matches!(
                store.save(bad, 1, &count(1)).await,
                Err(CheckpointError::Name(_))
            ));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
