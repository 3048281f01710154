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
//! ```
//!
//! The store is a local folder, or any URL `object_store` parses
//! (`file:///…`, `s3://bucket/prefix`, with its settings from the
//! environment as for the embed job's output).

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use crate::object_url::{is_url, open_url};
use crate::wire::{Decode, Encode, decode, encode};

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

    fn folder(&self, actor: &str) -> Result<Path, CheckpointError> {
        let ok = !actor.is_empty()
            && actor
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            && actor != "."
            && actor != "..";
        if !ok {
            return Err(CheckpointError::Name(actor.to_owned()));
        }
        Ok(self.prefix.clone().join(actor))
    }

    /// Saves `state` as snapshot `seq` of `actor` (one put: the object is
    /// whole or absent), then deletes its snapshots older than the last
    /// `keep`.
    pub async fn save<T: Encode>(
        &self,
        actor: &str,
        seq: u64,
        state: &T,
    ) -> Result<(), CheckpointError> {
        fail::fail_point!("checkpoint::save", |_| Err(CheckpointError::Injected(
            "checkpoint::save"
        )));
        let folder = self.folder(actor)?;
        let path = folder.clone().join(format!("{seq:020}.ckpt"));
        let body = encode(state);
        let mut object = Vec::with_capacity(HEADER + body.len());
        object.extend_from_slice(MAGIC);
        object.push(FORMAT);
        object.extend_from_slice(&seq.to_le_bytes());
        object.extend_from_slice(&(body.len() as u64).to_le_bytes());
        object.extend_from_slice(&Sha256::digest(&body));
        object.extend_from_slice(&body);
        self.store
            .put(&path, PutPayload::from(object))
            .await
            .map_err(|source| CheckpointError::Io {
                op: "put",
                path: path.to_string(),
                source,
            })?;
        let mut seqs = self.sequences(&folder).await?;
        seqs.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
        for (_, old) in seqs.into_iter().skip(self.keep) {
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
        fail::fail_point!("checkpoint::restore", |_| Err(CheckpointError::Injected(
            "checkpoint::restore"
        )));
        let folder = self.folder(actor)?;
        let mut seqs = self.sequences(&folder).await?;
        seqs.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
        for (seq, path) in seqs {
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

    /// The snapshots of the actor in `folder`: sequence and path.
    async fn sequences(&self, folder: &Path) -> Result<Vec<(u64, Path)>, CheckpointError> {
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
        Ok(listed
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.filename()?;
                let seq = name.strip_suffix(".ckpt")?.parse().ok()?;
                Some((seq, meta.location))
            })
            .collect())
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
