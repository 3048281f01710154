//! # Room `objects/`: the shared-memory object store in the cluster
//!
//! Owns puts, same-host reads and pulls (this file), releases of objects
//! whose owner is gone ([`releases`]) and the object-store URLs jobs and
//! checkpoints name ([`object_url`]). Drives [`flotilla_proto::objects`].
//!
//! May import: `net` (the bulk lane objects are pulled over) and the
//! shared files.
//!
//! The node's object store in the cluster: puts, same-host reads and pulls
//! from other hosts.
//!
//! Every node opens a [`Store`] (capacity `--object-store-mb`) when it
//! starts. An [`ObjectRef`] names its owner node and the owner's host id;
//! [`Objects::get`] maps the segment when the host ids match (no bytes
//! over the network), and otherwise pulls the object once over the owner's
//! bulk lane into this node's store, however many readers ask at once, and
//! keeps the copy until space is needed.
//!
//! ```text
//! get(ref) ─ same host ─► Store::get (mmap)                       ─► ObjectBytes
//!          ─ cached     ─► the copy                                ─► ObjectBytes
//!          ─ other host ─► one pull per object: Hello(Pull) ─► owner's lane
//!                          PullRequest ─► PullReply::Sending ─► bytes into a writer ─► checksum ─► ObjectBytes
//! ```

pub mod object_url;
pub mod releases;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_objects::{ObjectId, Store};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::objects::{
    ObjectKey, ObjectRequest, ObjectStats, PullReply, PullRequest, ReleaseReply,
};
use flotilla_proto::wire::Encode;
use flotilla_transport::handshake;
use tokio::sync::watch;

pub use flotilla_objects::{Object, ObjectBytes, ObjectError, ObjectRef, checksum, f32s};

use crate::identity::Identity;
use crate::net::bulk::{Lane, LaneSendError};
use crate::table::Table;

/// How often a node removes the segments its cluster's dead processes left
/// on its host (besides when it starts).
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The scope of a cluster's segments: from the digest of its cookie, so
/// that clusters sharing a host never touch each other's.
pub fn scope_of(cookie_digest: &[u8; 32]) -> u32 {
    u32::from_le_bytes([
        cookie_digest[0],
        cookie_digest[1],
        cookie_digest[2],
        cookie_digest[3],
    ])
}

/// Removes the segments of cluster `scope` on this host whose process is
/// gone: what a test harness runs once its processes are killed.
pub fn sweep_dead(scope: u32) -> usize {
    flotilla_objects::sweep_dead(scope)
}

/// How long a put waits for space unless told otherwise.
pub const DEFAULT_PUT_TIMEOUT: Duration = Duration::from_secs(60);

/// Why an object could not be put or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectsError {
    /// The store refused or the reference does not hold.
    #[error(transparent)]
    Store(#[from] ObjectError),
    /// The owner is not an up member: its objects cannot be pulled.
    #[error("NODE-OBJ-009: cannot pull object {id}: its owner {owner} is not an up member")]
    OwnerGone {
        /// The object.
        id: ObjectId,
        /// Its owner.
        owner: String,
    },
    /// The owner refused to release objects that were not lent to this
    /// node (they stay held for their borrower, or until their lease).
    #[error(
        "NODE-OBJ-011: {owner} refused to release {refused} object(s) that were not lent to this node"
    )]
    NotBorrower {
        /// The owner.
        owner: String,
        /// How many it refused.
        refused: usize,
    },
    /// The pull failed on the way.
    #[error("NODE-OBJ-010: pulling object {id} from {owner} failed: {reason}")]
    Pull {
        /// The object.
        id: ObjectId,
        /// Its owner.
        owner: String,
        /// What went wrong.
        reason: String,
    },
}

/// Puts and gets on this node's store; cheap to clone.
#[derive(Clone)]
pub struct Objects {
    pub(crate) store: Store,
    pub(crate) lane: Arc<Lane>,
    pub(crate) identity: Arc<Identity>,
    pub(crate) view: watch::Receiver<Table>,
    /// One lock per object being pulled: later readers wait for the first
    /// pull and then read its copy.
    pub(crate) pulling: Arc<Mutex<HashMap<ObjectId, Arc<tokio::sync::Mutex<()>>>>>,
    pub(crate) put_timeout: Duration,
}

impl Objects {
    /// The node's store itself.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The same handle with puts waiting up to `timeout` for space.
    pub fn with_put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = timeout;
        self
    }

    /// Stores a copy of `bytes`; waits for space up to the put timeout,
    /// then fails with [`ObjectError::Full`].
    pub async fn put(&self, bytes: &[u8]) -> Result<Object, ObjectsError> {
        Ok(self.store.put(bytes, self.put_timeout).await?)
    }

    /// Stores `value` as an rkyv archive, to be read in place with
    /// [`ObjectBytes::archive`].
    pub async fn put_archive<T: Encode>(&self, value: &T) -> Result<Object, ObjectsError> {
        let bytes = flotilla_proto::wire::encode(value);
        self.put(&bytes).await
    }

    /// Reads the object `reference` names: mapped from this host's memory,
    /// or pulled once from its owner's host into this store.
    pub async fn get(&self, reference: &ObjectRef) -> Result<ObjectBytes, ObjectsError> {
        reference.check().map_err(ObjectError::from)?;
        match self.store.get(reference) {
            Err(ObjectError::OtherHost { .. }) => {}
            done => return Ok(done?),
        }
        let lock = Arc::clone(
            self.pulling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(reference.id)
                .or_default(),
        );
        let pulled = {
            let _turn = lock.lock().await;
            match self.store.held(reference) {
                Some(copy) => Ok(copy),
                None => self.pull(reference).await,
            }
        };
        let mut pulling = self.pulling.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&lock) <= 2 {
            pulling.remove(&reference.id);
        }
        pulled
    }

    /// Keeps `object` alive for the member `borrower` on another node
    /// (which has no handle of its own) until it calls
    /// [`Objects::release`] or `lease` passes; returns the reference to
    /// send it. Only `borrower` may release it early.
    pub fn lend(&self, object: Object, borrower: &str, lease: Duration) -> ObjectRef {
        self.store
            .lend(object, borrower, std::time::Instant::now() + lease)
    }

    /// Tells the owner of a lent object that this holder is done with it:
    /// in this process, or on a stream to the owner's bulk lane. A release
    /// that does not arrive leaves the object to its lease; one of an
    /// object lent to another member is refused
    /// ([`ObjectsError::NotBorrower`]) and the object stays.
    pub async fn release(&self, reference: &ObjectRef) -> Result<(), ObjectsError> {
        self.release_all(std::slice::from_ref(reference)).await
    }

    /// [`Objects::release`] for many objects: one request per owner node.
    /// Every owner is told that can be; the first that cannot is the error
    /// (its objects are left to their leases).
    pub async fn release_all(&self, references: &[ObjectRef]) -> Result<(), ObjectsError> {
        let mut by_owner: std::collections::BTreeMap<&str, Vec<&ObjectRef>> = Default::default();
        for r in references {
            if r.owner == self.identity.name {
                self.store.release(r.id, None);
            } else {
                by_owner.entry(r.owner.as_str()).or_default().push(r);
            }
        }
        let mut first_error = None;
        for (owner, refs) in by_owner {
            if let Err(e) = self.release_on(owner, &refs).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Tells `owner` that this node is done with `refs`.
    async fn release_on(&self, owner: &str, refs: &[&ObjectRef]) -> Result<(), ObjectsError> {
        let failed = |reason: String| ObjectsError::Pull {
            id: refs[0].id,
            owner: owner.to_owned(),
            reason,
        };
        let (mut send, mut recv) = self
            .lane
            .open_pull(&self.identity, &self.view, owner)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let keys = refs
            .iter()
            .map(|r| ObjectKey {
                scope: r.id.scope,
                pid: r.id.pid,
                seq: r.id.seq,
            })
            .collect();
        handshake::send_msg(&mut send, &ObjectRequest::Release(keys), DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let _ = send.finish();
        let reply: ReleaseReply = handshake::recv_msg(&mut recv, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if reply.refused.is_empty() {
            Ok(())
        } else {
            Err(ObjectsError::NotBorrower {
                owner: owner.to_owned(),
                refused: reply.refused.len(),
            })
        }
    }

    /// Reads the object `reference` names as the archive of a `T`, in
    /// place (mapped, or pulled once): what a handler of a large payload
    /// sent as an [`ObjectRef`] reads instead of an owned copy.
    pub async fn get_archive<T>(
        &self,
        reference: &ObjectRef,
    ) -> Result<ArchivedObject<T>, ObjectsError>
    where
        T: rkyv::Archive + 'static,
        T::Archived: for<'a> rkyv::bytecheck::CheckBytes<
                rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>,
            >,
    {
        Ok(ArchivedObject::new(self.get(reference).await?)?)
    }

    /// This node's store counters.
    pub fn stats(&self) -> ObjectStats {
        self.store.stats()
    }

    async fn pull(&self, reference: &ObjectRef) -> Result<ObjectBytes, ObjectsError> {
        let (id, owner) = (reference.id, reference.owner.clone());
        let failed = |reason: String| ObjectsError::Pull {
            id,
            owner: owner.clone(),
            reason,
        };
        let (mut send, mut recv) = match self
            .lane
            .open_pull(&self.identity, &self.view, &reference.owner)
            .await
        {
            Ok(streams) => streams,
            Err(LaneSendError::NoLane(_)) => {
                return Err(ObjectsError::OwnerGone {
                    id,
                    owner: owner.clone(),
                });
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        let request = ObjectRequest::Pull(PullRequest {
            scope: id.scope,
            pid: id.pid,
            seq: id.seq,
            size: reference.size,
            checksum: reference.checksum,
            token: reference.token,
        });
        handshake::send_msg(&mut send, &request, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let reply: PullReply = handshake::recv_msg(&mut recv, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| failed(e.to_string()))?;
        match reply {
            PullReply::Sending { size } if size == reference.size => {}
            PullReply::Sending { size } => {
                return Err(failed(format!(
                    "the owner offered {size} bytes, the reference says {}",
                    reference.size
                )));
            }
            PullReply::Gone => return Err(ObjectError::Gone(id).into()),
            PullReply::Mismatch => {
                return Err(ObjectError::Mismatch {
                    id,
                    what: "size or checksum at the owner",
                }
                .into());
            }
        }
        let mut writer = self.store.writer(reference.size, self.put_timeout).await?;
        // Chunks as quinn hands them over, each copied into the segment and
        // checksummed while in cache.
        let mut left = reference.size;
        while left > 0 {
            let chunk = recv
                .read_chunk(left as usize, true)
                .await
                .map_err(|e| failed(e.to_string()))?
                .ok_or_else(|| failed(format!("the stream ended {left} bytes short")))?;
            if !writer.append(&chunk.bytes) {
                return Err(failed("the owner sent more bytes than it offered".into()));
            }
            left -= chunk.bytes.len() as u64;
        }
        // Fault injection: `objects::pull_corrupt=return` flips a byte of
        // every pulled object, as a network or memory fault would.
        let corrupt = (|| {
            fail::fail_point!("objects::pull_corrupt", |_| true);
            false
        })();
        if corrupt && let Some(b) = writer.bytes_mut().first_mut() {
            *b ^= 0xff;
        }
        Ok(writer.seal_copy(reference)?)
    }
}

/// An object's bytes read as the archive of a `T`, in place: what
/// [`Objects::get_archive`] returns. Derefs to `T`'s archived form; the
/// mapping stays while it lives.
pub struct ArchivedObject<T> {
    bytes: ObjectBytes,
    of: std::marker::PhantomData<fn() -> T>,
}

impl<T> ArchivedObject<T>
where
    T: rkyv::Archive + 'static,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>,
{
    /// Validates `bytes` as a `T` archive (once per object, type and
    /// process).
    pub fn new(bytes: ObjectBytes) -> Result<Self, ObjectError> {
        bytes.archive::<T>()?;
        Ok(Self {
            bytes,
            of: std::marker::PhantomData,
        })
    }

    /// The bytes underneath.
    pub fn bytes(&self) -> &ObjectBytes {
        &self.bytes
    }
}

impl<T> std::ops::Deref for ArchivedObject<T>
where
    T: rkyv::Archive + 'static,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>,
{
    type Target = T::Archived;

    fn deref(&self) -> &T::Archived {
        // Validated in `new`: from then on the same bytes read as `T`
        // without checking, and cannot fail.
        self.bytes
            .archive::<T>()
            .expect("validated when the ArchivedObject was made")
    }
}
