//! A node's object store: its segments, its capacity and its readers.
//!
//! ```text
//! put(bytes) ── waits for capacity ──► segment (sealed) ──► Object (owner handle)
//!                                                            └─ reference() → ObjectRef in messages
//! get(ref), same host ──► own object, or the other store's segment mapped ──► ObjectBytes
//! writer(size) ── bytes written (a pull) ──► seal_copy(ref): checksum ──► cached copy
//! ```
//!
//! Capacity counts the segments this store created that are still mapped
//! here. A put that does not fit first drops cached copies that no reader
//! borrows (oldest first), then waits for owners to free objects, up to its
//! timeout; then it fails with [`ObjectError::Full`]. Nothing spills to disk.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use flotilla_proto::objects::ObjectStats;
use rkyv::api::high::HighValidator;
use rkyv::bytecheck::CheckBytes;
use rkyv::{Archive, rancor};
use tokio::sync::Notify;

use crate::in_place::{ArchiveError, Validated};
use crate::object_ref::{ObjectId, ObjectRef, RefError, checksum};
use crate::segment::{Segment, SegmentError};

/// How a store is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The cluster's scope (see [`ObjectId`]): stores of one cluster on a
    /// host reclaim each other's dead segments, and no other cluster's.
    pub scope: u32,
    /// The node the store belongs to, named in its [`ObjectRef`]s.
    pub owner: String,
    /// The host id: readers with the same one map segments directly.
    pub host: String,
    /// Bytes of objects the store holds at most.
    pub capacity: u64,
}

/// Why an object could not be stored or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The object is larger than the store's whole capacity.
    #[error(
        "NODE-OBJ-001: an object of {size} bytes cannot fit a store of {capacity} bytes; raise --object-store-mb"
    )]
    TooLarge {
        /// The object's size.
        size: u64,
        /// The store's capacity.
        capacity: u64,
    },
    /// No space was freed in time.
    #[error(
        "NODE-OBJ-002: object store full: {size} bytes did not fit ({used} of {capacity} in use) within {waited:?}"
    )]
    Full {
        /// The object's size.
        size: u64,
        /// Bytes in use when the put gave up.
        used: u64,
        /// The store's capacity.
        capacity: u64,
        /// How long the put waited.
        waited: Duration,
    },
    /// The object is gone: its owner freed it, or its process ended.
    #[error("NODE-OBJ-003: object {0} is gone (freed by its owner, or its process ended)")]
    Gone(ObjectId),
    /// The reference itself is malformed.
    #[error("NODE-OBJ-004: malformed object reference: {0}")]
    Malformed(#[from] RefError),
    /// The object lives on another host: pull it.
    #[error("object {id} lives on host {host}; it must be pulled")]
    OtherHost {
        /// The object.
        id: ObjectId,
        /// The owner's host.
        host: String,
    },
    /// The segment holds something other than the reference says.
    #[error("NODE-OBJ-005: segment of object {id} does not match its reference ({what})")]
    Mismatch {
        /// The object.
        id: ObjectId,
        /// Which field differs.
        what: &'static str,
    },
    /// Pulled bytes do not match the reference's checksum: the copy is
    /// dropped.
    #[error(
        "NODE-OBJ-007: object {id} arrived with checksum {got:016x}, its reference says {expected:016x}; the copy was dropped"
    )]
    ChecksumMismatch {
        /// The object.
        id: ObjectId,
        /// The reference's checksum.
        expected: u64,
        /// The checksum of the bytes that arrived.
        got: u64,
    },
    /// The bytes are not the archive asked for.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The segment could not be created or mapped.
    #[error("NODE-OBJ-008: {0}")]
    Segment(#[from] SegmentError),
}

/// A node's object store. Cloning shares it.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    config: StoreConfig,
    pid: u32,
    /// High 24 bits of every `seq` of this store.
    nonce: u64,
    /// The keyed hash (SipHash, keys drawn at open) that gives each object
    /// its token.
    tokens: std::collections::hash_map::RandomState,
    state: Mutex<State>,
    space: Notify,
    puts: AtomicU64,
    local_gets: AtomicU64,
    remote_pulls: AtomicU64,
    pulled_bytes: AtomicU64,
    waits: AtomicU64,
}

#[derive(Default)]
struct State {
    used: u64,
    count: u64,
    next: u64,
    /// Objects created here, while a handle or a borrow is alive.
    own: HashMap<ObjectId, Weak<Mapped>>,
    /// Segments of other stores of this host, while borrowed here.
    mapped: HashMap<ObjectId, Weak<Mapped>>,
    /// Copies pulled from other hosts, by the original's id, with the tick
    /// of their last use.
    copies: HashMap<ObjectId, (Arc<Mapped>, u64)>,
    tick: u64,
    /// Objects lent to other holders, until released or their lease ends,
    /// with the member each was lent to.
    lent: HashMap<ObjectId, (Object, Instant, String)>,
}

/// One mapping of one object's segment.
struct Mapped {
    segment: Segment,
    id: ObjectId,
    size: u64,
    /// The checksum in the header (0 until sealed).
    checksum: u64,
    validated: Validated,
    /// The store whose capacity it counts against: set for segments this
    /// store created.
    store: Option<Weak<Inner>>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(inner) = self.store.as_ref().and_then(Weak::upgrade) {
            inner.freed(self.id, self.size);
        }
    }
}

/// The owner's handle on an object it put. Clones share it; the object is
/// freed (its segment unlinked, its capacity returned) when the last handle
/// and the last [`ObjectBytes`] borrowed from it are dropped.
#[derive(Clone)]
pub struct Object {
    mapped: Arc<Mapped>,
    reference: ObjectRef,
}

/// A read-only borrow of an object's bytes, mapped from shared memory.
/// While it lives the bytes stay mapped, even if the owner frees the
/// object.
#[derive(Clone)]
pub struct ObjectBytes {
    mapped: Arc<Mapped>,
}

/// Space reserved for an object being written (a pull); dropping it
/// unwritten frees the space. Bytes go in either all at once through
/// [`ObjectWriter::bytes_mut`], or in order through
/// [`ObjectWriter::append`], which checksums them as they arrive.
pub struct ObjectWriter {
    mapped: Mapped,
    inner: Arc<Inner>,
    /// Bytes appended so far, and their running checksum.
    appended: u64,
    hasher: Box<xxhash_rust::xxh3::Xxh3>,
}

/// What became of a [`Store::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// No longer held for its borrower.
    Released,
    /// Not lent (never, or released or expired already).
    NotLent,
    /// Lent to another member than the one asking: still held.
    NotBorrower,
}

impl Store {
    /// Opens a store, first removing the segments of this cluster's dead
    /// processes on this host (a node killed with SIGKILL leaves its
    /// segments behind; they go when it, or any node of the cluster on the
    /// host, starts again). Returns the store and how many segments it
    /// removed.
    pub fn open(config: StoreConfig) -> (Self, usize) {
        let pid = std::process::id();
        let swept = crate::sweep::sweep(config.scope, pid);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(pid);
        let nonce = (h.finish() & 0xff_ffff) << 40;
        let store = Self {
            inner: Arc::new(Inner {
                config,
                pid,
                nonce,
                tokens: std::collections::hash_map::RandomState::new(),
                state: Mutex::new(State::default()),
                space: Notify::new(),
                puts: AtomicU64::new(0),
                local_gets: AtomicU64::new(0),
                remote_pulls: AtomicU64::new(0),
                pulled_bytes: AtomicU64::new(0),
                waits: AtomicU64::new(0),
            }),
        };
        (store, swept)
    }

    /// Removes the segments of this store's cluster on the host whose
    /// process died since (see [`Store::open`]); how many.
    pub fn sweep(&self) -> usize {
        crate::sweep::sweep(self.inner.config.scope, self.inner.pid)
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Stores a copy of `bytes`, waiting up to `timeout` for space.
    pub async fn put(&self, bytes: &[u8], timeout: Duration) -> Result<Object, ObjectError> {
        self.put_with(bytes.len() as u64, timeout, |buf| {
            buf.copy_from_slice(bytes)
        })
        .await
    }

    /// Stores an object of `size` bytes that `fill` writes in place (an
    /// archive serialized straight into shared memory), waiting up to
    /// `timeout` for space.
    pub async fn put_with(
        &self,
        size: u64,
        timeout: Duration,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Object, ObjectError> {
        let mut writer = self.writer(size, timeout).await?;
        fill(writer.bytes_mut());
        Ok(writer.seal())
    }

    /// Reserves space for an object of `size` bytes, waiting up to
    /// `timeout`.
    pub async fn writer(&self, size: u64, timeout: Duration) -> Result<ObjectWriter, ObjectError> {
        self.reserve(size, timeout).await?;
        let id = {
            let mut state = self.inner.lock();
            state.next += 1;
            ObjectId {
                scope: self.inner.config.scope,
                pid: self.inner.pid,
                seq: self.inner.nonce | state.next,
            }
        };
        let segment = match Segment::create(&id.segment_name(), size) {
            Ok(segment) => segment,
            Err(e) => {
                self.inner.freed(id, size);
                return Err(e.into());
            }
        };
        Ok(ObjectWriter {
            mapped: Mapped {
                segment,
                id,
                size,
                checksum: 0,
                validated: Validated::default(),
                store: Some(Arc::downgrade(&self.inner)),
            },
            inner: Arc::clone(&self.inner),
            appended: 0,
            hasher: Box::default(),
        })
    }

    /// Reads an object of this host: one this store holds, or another
    /// store's segment, mapped read-only. O(1) in the object's size: the
    /// header is checked against the reference, the bytes are not read.
    pub fn get(&self, reference: &ObjectRef) -> Result<ObjectBytes, ObjectError> {
        reference.check()?;
        let id = reference.id;
        if let Some(bytes) = self.held(reference) {
            return Ok(bytes);
        }
        if reference.host != self.inner.config.host {
            return Err(ObjectError::OtherHost {
                id,
                host: reference.host.clone(),
            });
        }
        let (segment, header) = Segment::open(&id.segment_name()).map_err(|e| match e {
            SegmentError::Missing(_) => ObjectError::Gone(id),
            e => ObjectError::Segment(e),
        })?;
        let differs = if header.id != id {
            Some("id")
        } else if header.size != reference.size {
            Some("size")
        } else if header.checksum != reference.checksum {
            Some("checksum")
        } else {
            None
        };
        if let Some(what) = differs {
            return Err(ObjectError::Mismatch { id, what });
        }
        let mapped = Arc::new(Mapped {
            segment,
            id,
            size: header.size,
            checksum: header.checksum,
            validated: Validated::default(),
            store: None,
        });
        let mut state = self.inner.lock();
        let mapped = match state.mapped.get(&id).and_then(Weak::upgrade) {
            Some(raced) => raced,
            None => {
                // Forget segments no longer borrowed, now and then.
                if state.mapped.len() >= 64 && state.mapped.len().is_power_of_two() {
                    state.mapped.retain(|_, w| w.strong_count() > 0);
                }
                state.mapped.insert(id, Arc::downgrade(&mapped));
                mapped
            }
        };
        drop(state);
        self.inner.local_gets.fetch_add(1, Ordering::Relaxed);
        Ok(ObjectBytes { mapped })
    }

    /// The object if this store already holds it or a mapping of it (its
    /// own object, a cached copy, another store's segment borrowed here);
    /// counted as a local get.
    pub fn held(&self, reference: &ObjectRef) -> Option<ObjectBytes> {
        let id = reference.id;
        let mut state = self.inner.lock();
        state.tick += 1;
        let tick = state.tick;
        let found = if let Some((copy, used)) = state.copies.get_mut(&id) {
            *used = tick;
            Some(Arc::clone(copy))
        } else {
            let own = state.own.get(&id).and_then(Weak::upgrade);
            own.or_else(|| state.mapped.get(&id).and_then(Weak::upgrade))
        };
        drop(state);
        let mapped = found.filter(|m| m.size == reference.size)?;
        self.inner.local_gets.fetch_add(1, Ordering::Relaxed);
        Some(ObjectBytes { mapped })
    }

    /// The token of the object `id` of this store: a keyed hash of its id
    /// under keys drawn when the store opened, so nobody without the
    /// object's reference can tell it.
    pub fn token_of(&self, id: ObjectId) -> u64 {
        use std::hash::BuildHasher;
        self.inner.tokens.hash_one((id.scope, id.pid, id.seq))
    }

    /// An object this store created, by id, without counting a get: what
    /// serving a pull reads. `None` unless `token` is the object's (see
    /// [`Store::token_of`]) and the object is still held.
    pub fn lookup(&self, id: ObjectId, token: u64) -> Option<ObjectBytes> {
        if self.token_of(id) != token {
            return None;
        }
        let mapped = self.inner.lock().own.get(&id).and_then(Weak::upgrade);
        Some(ObjectBytes { mapped: mapped? })
    }

    /// Keeps `object` alive for the member `borrower` elsewhere until it
    /// [`Store::release`]s it or `until` passes (then it is dropped at the
    /// next lend or release after that). Returns its reference.
    pub fn lend(&self, object: Object, borrower: &str, until: Instant) -> ObjectRef {
        let reference = object.reference.clone();
        let expired = {
            let mut state = self.inner.lock();
            state
                .lent
                .insert(reference.id, (object, until, borrower.to_owned()));
            expire(&mut state, Instant::now())
        };
        drop(expired);
        reference
    }

    /// Stops holding the lent object `id` for `by` (`None`: this node
    /// itself, which may release anything it lent).
    pub fn release(&self, id: ObjectId, by: Option<&str>) -> Release {
        let (released, expired) = {
            let mut state = self.inner.lock();
            let outcome = match (state.lent.get(&id), by) {
                (None, _) => None,
                (Some((_, _, borrower)), Some(by)) if borrower != by => {
                    return Release::NotBorrower;
                }
                _ => state.lent.remove(&id),
            };
            (outcome, expire(&mut state, Instant::now()))
        };
        let outcome = if released.is_some() {
            Release::Released
        } else {
            Release::NotLent
        };
        // Dropped outside the lock: the last handle frees the segment.
        drop((released, expired));
        outcome
    }

    /// Objects lent and not yet released.
    pub fn lent(&self) -> usize {
        self.inner.lock().lent.len()
    }

    /// What the store has done so far.
    pub fn stats(&self) -> ObjectStats {
        let state = self.inner.lock();
        ObjectStats {
            count: state.count,
            bytes: state.used,
            capacity: self.inner.config.capacity,
            puts: self.inner.puts.load(Ordering::Relaxed),
            local_gets: self.inner.local_gets.load(Ordering::Relaxed),
            remote_pulls: self.inner.remote_pulls.load(Ordering::Relaxed),
            pulled_bytes: self.inner.pulled_bytes.load(Ordering::Relaxed),
            waits: self.inner.waits.load(Ordering::Relaxed),
        }
    }

    /// Takes `size` bytes of capacity, dropping unborrowed cached copies
    /// and then waiting for space as needed.
    async fn reserve(&self, size: u64, timeout: Duration) -> Result<(), ObjectError> {
        let capacity = self.inner.config.capacity;
        if size > capacity {
            return Err(ObjectError::TooLarge { size, capacity });
        }
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut waited = false;
        loop {
            let notified = self.inner.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (fits, evicted, used) = {
                let mut state = self.inner.lock();
                if state.used + size <= capacity {
                    state.used += size;
                    state.count += 1;
                    (true, None, state.used)
                } else {
                    let oldest = state
                        .copies
                        .iter()
                        .filter(|(_, (m, _))| Arc::strong_count(m) == 1)
                        .min_by_key(|(_, (_, tick))| *tick)
                        .map(|(id, _)| *id);
                    let evicted = oldest.and_then(|id| state.copies.remove(&id));
                    (false, evicted, state.used)
                }
            };
            if fits {
                if waited {
                    self.inner.waits.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
            if evicted.is_some() {
                // Dropped outside the lock: its `Drop` returns the space.
                drop(evicted);
                continue;
            }
            waited = true;
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(ObjectError::Full {
                    size,
                    used,
                    capacity,
                    waited: start.elapsed(),
                });
            }
        }
    }
}

/// Takes the lent objects whose lease ended by `now` out of the table, to
/// be dropped once the lock is released.
fn expire(state: &mut State, now: Instant) -> Vec<Object> {
    if !state.lent.values().any(|(_, until, _)| *until <= now) {
        return Vec::new();
    }
    let ended: Vec<ObjectId> = state
        .lent
        .iter()
        .filter(|(_, (_, until, _))| *until <= now)
        .map(|(id, _)| *id)
        .collect();
    ended
        .into_iter()
        .filter_map(|id| state.lent.remove(&id).map(|(o, _, _)| o))
        .collect()
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns the space of a segment this store created.
    fn freed(&self, id: ObjectId, size: u64) {
        let mut state = self.lock();
        state.used -= size;
        state.count -= 1;
        if state.own.get(&id).is_some_and(|w| w.strong_count() == 0) {
            state.own.remove(&id);
        }
        drop(state);
        self.space.notify_waiters();
    }
}

impl ObjectWriter {
    /// The object's bytes, to be written before sealing. Writing here
    /// leaves what [`ObjectWriter::append`] counted behind: the checksum is
    /// then computed over every byte at sealing.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.appended = u64::MAX;
        self.mapped.segment.data_mut(self.mapped.size)
    }

    /// Writes `bytes` after those appended before, checksumming them while
    /// they are in cache; `false` (nothing written) if they would run past
    /// the object's size.
    pub fn append(&mut self, bytes: &[u8]) -> bool {
        let size = self.mapped.size;
        let at = self.appended;
        if at > size || bytes.len() as u64 > size - at {
            return false;
        }
        let at = at as usize;
        self.mapped.segment.data_mut(size)[at..at + bytes.len()].copy_from_slice(bytes);
        self.hasher.update(bytes);
        self.appended += bytes.len() as u64;
        true
    }

    /// The checksum of the bytes as written.
    fn checksum(&mut self) -> u64 {
        if self.appended == self.mapped.size {
            self.hasher.digest()
        } else {
            checksum(self.mapped.segment.data(self.mapped.size))
        }
    }

    /// Seals the bytes as written: the object is immutable from here on.
    pub fn seal(mut self) -> Object {
        let sum = self.checksum();
        self.seal_with(sum)
    }

    fn seal_with(mut self, sum: u64) -> Object {
        let (id, size) = (self.mapped.id, self.mapped.size);
        self.mapped.segment.seal(id, size, sum);
        self.mapped.checksum = sum;
        let config = &self.inner.config;
        let token = {
            use std::hash::BuildHasher;
            self.inner.tokens.hash_one((id.scope, id.pid, id.seq))
        };
        let reference = ObjectRef {
            id,
            owner: config.owner.clone(),
            host: config.host.clone(),
            size,
            checksum: sum,
            token,
        };
        let inner = Arc::clone(&self.inner);
        let mapped = Arc::new(self.mapped);
        inner.lock().own.insert(id, Arc::downgrade(&mapped));
        inner.puts.fetch_add(1, Ordering::Relaxed);
        Object { mapped, reference }
    }

    /// Seals the bytes as a copy of `of`, pulled from another host: the
    /// checksum must match, else the copy is dropped. The copy is cached
    /// under `of`'s id until space is needed.
    pub fn seal_copy(mut self, of: &ObjectRef) -> Result<ObjectBytes, ObjectError> {
        let got = self.checksum();
        if got != of.checksum || self.mapped.size != of.size {
            return Err(ObjectError::ChecksumMismatch {
                id: of.id,
                expected: of.checksum,
                got,
            });
        }
        let inner = Arc::clone(&self.inner);
        let object = self.seal_with(got);
        let mut state = inner.lock();
        state.tick += 1;
        let tick = state.tick;
        state
            .copies
            .insert(of.id, (Arc::clone(&object.mapped), tick));
        drop(state);
        inner.remote_pulls.fetch_add(1, Ordering::Relaxed);
        inner.pulled_bytes.fetch_add(of.size, Ordering::Relaxed);
        // A copy is not a put of this node.
        inner.puts.fetch_sub(1, Ordering::Relaxed);
        Ok(object.bytes())
    }
}

impl Object {
    /// The reference to send in messages.
    pub fn reference(&self) -> &ObjectRef {
        &self.reference
    }

    /// The object's bytes.
    pub fn bytes(&self) -> ObjectBytes {
        ObjectBytes {
            mapped: Arc::clone(&self.mapped),
        }
    }
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Object").field(&self.reference).finish()
    }
}

impl ObjectBytes {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.mapped.segment.data(self.mapped.size)
    }

    /// The archive of a `T` these bytes hold, read in place: validated the
    /// first time this process asks for a `T` of this object, not again.
    pub fn archive<T>(&self) -> Result<&T::Archived, ObjectError>
    where
        T: Archive + 'static,
        T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>,
    {
        Ok(self.mapped.validated.access::<T>(self.as_bytes())?)
    }

    /// The checksum the object's segment header records.
    pub fn checksum(&self) -> u64 {
        self.mapped.checksum
    }

    /// The segment the bytes are mapped from.
    pub fn segment_name(&self) -> &str {
        self.mapped.segment.name()
    }
}

impl std::ops::Deref for ObjectBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::fmt::Debug for ObjectBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ObjectBytes({}, {} bytes)",
            self.mapped.id, self.mapped.size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments;

    fn store(scope: u32, owner: &str, capacity: u64) -> Store {
        Store::open(StoreConfig {
            scope,
            owner: owner.into(),
            host: "host-a".into(),
            capacity,
        })
        .0
    }

    /// A scope of its own per test, so parallel tests never sweep or count
    /// each other's segments.
    fn scope(tag: &str) -> u32 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write(tag.as_bytes());
        h.write_u32(std::process::id());
        h.finish() as u32
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn another_store_on_the_host_reads_an_object_in_place() {
        let s = scope("in-place");
        let (a, b) = (store(s, "a", 1 << 20), store(s, "b", 1 << 20));
        let object = a.put(b"hello objects", T).await.unwrap();
        let r = object.reference().clone();
        assert_eq!((r.owner.as_str(), r.size), ("a", 13));
        let bytes = b.get(&r).unwrap();
        assert_eq!(&*bytes, b"hello objects");
        assert_eq!(bytes.as_ptr() as usize % 64, 0, "archives need alignment");
        assert_eq!(b.stats().local_gets, 1);
        assert_eq!(b.stats().count, 0, "a mapping is not b's object");
        let stats = a.stats();
        assert_eq!((stats.count, stats.bytes, stats.puts), (1, 13, 1));
        // A second get reuses the mapping.
        let again = b.get(&r).unwrap();
        assert_eq!(again.as_ptr(), bytes.as_ptr());
    }

    #[tokio::test]
    async fn the_last_handle_frees_and_borrowers_keep_reading() {
        let s = scope("free");
        let (a, b) = (store(s, "a", 1 << 20), store(s, "b", 1 << 20));
        let object = a.put(&[7u8; 1000], T).await.unwrap();
        let r = object.reference().clone();
        let elsewhere = b.get(&r).unwrap();
        let handle = object.clone();
        drop(object);
        assert_eq!(a.stats().bytes, 1000, "a clone still holds it");
        drop(handle);
        assert_eq!((a.stats().count, a.stats().bytes), (0, 0));
        assert!(segments(s).is_empty(), "segment unlinked");
        assert!(matches!(store(s, "c", 1 << 20).get(&r), Err(ObjectError::Gone(id)) if id == r.id));
        assert_eq!(elsewhere[999], 7, "an existing mapping stays valid");
    }

    #[tokio::test]
    async fn a_full_store_makes_puts_wait_then_fit_or_fail() {
        let s = scope("full");
        let a = store(s, "a", 1000);
        let first = a.put(&[1u8; 600], T).await.unwrap();
        let err = a
            .put(&[2u8; 600], Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ObjectError::Full {
                    size: 600,
                    used: 600,
                    capacity: 1000,
                    ..
                }
            ),
            "{err}"
        );
        let waiting = {
            let a = a.clone();
            tokio::spawn(async move { a.put(&[3u8; 600], T).await.map(|o| o.reference().clone()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "waits while the store is full");
        drop(first);
        let second = waiting.await.unwrap().unwrap();
        assert_eq!(second.size, 600);
        assert_eq!(a.stats().waits, 1);
        assert!(matches!(
            a.put(&[0u8; 1001], T).await,
            Err(ObjectError::TooLarge {
                size: 1001,
                capacity: 1000
            })
        ));
    }

    #[tokio::test]
    async fn archives_are_read_in_place_and_bad_ones_refused() {
        let s = scope("archive");
        let a = store(s, "a", 1 << 20);
        let texts = vec!["one".to_owned(), "two".to_owned()];
        let bytes = rkyv::to_bytes::<rancor::Error>(&texts).unwrap();
        let object = a.put(&bytes, T).await.unwrap();
        let read = store(s, "b", 1 << 20).get(object.reference()).unwrap();
        let archived = read.archive::<Vec<String>>().unwrap();
        assert_eq!(archived.len(), 2);
        assert_eq!(archived[1].as_str(), "two");
        // Validated once; read again without checking.
        assert_eq!(read.archive::<Vec<String>>().unwrap()[0].as_str(), "one");
        let junk = a.put(&[0xffu8; 7], T).await.unwrap();
        assert!(matches!(
            junk.bytes().archive::<Vec<String>>(),
            Err(ObjectError::Archive(_))
        ));
    }

    #[tokio::test]
    async fn references_that_do_not_match_their_segment_are_refused() {
        let s = scope("mismatch");
        let a = store(s, "a", 1 << 20);
        let b = store(s, "b", 1 << 20);
        let object = a.put(b"abc", T).await.unwrap();
        let r = object.reference().clone();
        let wrong_size = ObjectRef {
            size: 1 << 20,
            ..r.clone()
        };
        assert!(matches!(
            b.get(&wrong_size),
            Err(ObjectError::Mismatch { what: "size", .. })
        ));
        let wrong_sum = ObjectRef {
            checksum: r.checksum ^ 1,
            ..r.clone()
        };
        assert!(matches!(
            b.get(&wrong_sum),
            Err(ObjectError::Mismatch {
                what: "checksum",
                ..
            })
        ));
        let elsewhere = ObjectRef {
            host: "host-b".into(),
            ..r.clone()
        };
        assert!(matches!(
            b.get(&elsewhere),
            Err(ObjectError::OtherHost { .. })
        ));
        let malformed = ObjectRef {
            owner: String::new(),
            ..r.clone()
        };
        assert!(matches!(b.get(&malformed), Err(ObjectError::Malformed(_))));
        let unknown = ObjectRef {
            id: ObjectId {
                seq: r.id.seq + 99,
                ..r.id
            },
            ..r
        };
        assert!(matches!(b.get(&unknown), Err(ObjectError::Gone(_))));
    }

    #[tokio::test]
    async fn a_copy_with_the_wrong_checksum_is_dropped_and_a_good_one_cached() {
        let s = scope("copy");
        let a = store(s, "a", 1 << 20);
        let original = a.put(b"payload", T).await.unwrap();
        let r = ObjectRef {
            host: "host-b".into(),
            ..original.reference().clone()
        };
        let mut w = a.writer(7, T).await.unwrap();
        w.bytes_mut().copy_from_slice(b"paylaod");
        assert!(matches!(
            w.seal_copy(&r),
            Err(ObjectError::ChecksumMismatch { .. })
        ));
        assert_eq!(a.stats().bytes, 7, "only the original is held");
        let mut w = a.writer(7, T).await.unwrap();
        w.bytes_mut().copy_from_slice(b"payload");
        let copy = w.seal_copy(&r).unwrap();
        assert_eq!(&*copy, b"payload");
        let stats = a.stats();
        assert_eq!(
            (stats.remote_pulls, stats.pulled_bytes, stats.puts),
            (1, 7, 1)
        );
        assert_eq!(&*a.held(&r).expect("cached"), b"payload");
    }

    #[tokio::test]
    async fn appended_bytes_are_checksummed_as_they_arrive() {
        let s = scope("append");
        let a = store(s, "a", 1 << 20);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut w = a.writer(data.len() as u64, T).await.unwrap();
        for chunk in data.chunks(999) {
            assert!(w.append(chunk));
        }
        assert!(!w.append(b"x"), "past the end");
        let object = w.seal();
        assert_eq!(object.reference().checksum, checksum(&data));
        assert_eq!(&*object.bytes(), &data[..]);
        // Appending, then writing in place: the checksum covers what is there.
        let mut w = a.writer(4, T).await.unwrap();
        assert!(w.append(b"ab"));
        w.bytes_mut()[2..].copy_from_slice(b"cd");
        assert_eq!(w.seal().reference().checksum, checksum(b"abcd"));
    }

    #[tokio::test]
    async fn a_pull_must_carry_the_objects_token() {
        let s = scope("token");
        let a = store(s, "a", 1 << 20);
        let object = a.put(b"secret", T).await.unwrap();
        let r = object.reference().clone();
        assert_eq!(r.token, a.token_of(r.id));
        assert_eq!(
            &*a.lookup(r.id, r.token).expect("with its token"),
            b"secret"
        );
        assert!(a.lookup(r.id, r.token ^ 1).is_none(), "a guessed token");
        let next = ObjectId {
            seq: r.id.seq + 1,
            ..r.id
        };
        assert_ne!(a.token_of(next), r.token, "tokens are not sequential");
        // Another store draws other keys.
        let b = store(s, "b", 1 << 20);
        assert_ne!(b.token_of(r.id), r.token);
    }

    #[tokio::test]
    async fn lent_objects_live_until_released_or_their_lease_ends() {
        let s = scope("lend");
        let a = store(s, "a", 1 << 20);
        let first = a.put(b"one", T).await.unwrap();
        let r1 = a.lend(first, "d~1", Instant::now() + Duration::from_secs(60));
        assert_eq!((a.lent(), a.stats().count), (1, 1), "held without a handle");
        // Only its borrower (or the store's own node) releases it.
        assert_eq!(a.release(r1.id, Some("d~2")), Release::NotBorrower);
        assert_eq!(a.lent(), 1);
        assert_eq!(a.release(r1.id, Some("d~1")), Release::Released);
        assert_eq!(
            a.release(r1.id, Some("d~1")),
            Release::NotLent,
            "released once"
        );
        assert_eq!(a.stats().count, 0, "freed on release");
        let second = a.put(b"two", T).await.unwrap();
        let r2 = a.lend(second, "d~1", Instant::now());
        // The next lend drops what has expired.
        let third = a.put(b"three", T).await.unwrap();
        let r3 = a.lend(third, "d~1", Instant::now() + Duration::from_secs(60));
        assert_eq!(a.release(r3.id, None), Release::Released);
        let fourth = a.put(b"four", T).await.unwrap();
        let r3 = a.lend(fourth, "d~1", Instant::now() + Duration::from_secs(60));
        assert!(a.held(&r2).is_none(), "its lease ended");
        assert!(a.held(&r3).is_some());
    }

    #[tokio::test]
    async fn unborrowed_copies_make_room_for_puts() {
        let s = scope("evict");
        let a = store(s, "a", 1000);
        let r = |n: u64, sum| ObjectRef {
            id: ObjectId {
                scope: 9,
                pid: 9,
                seq: n,
            },
            owner: "far".into(),
            host: "host-b".into(),
            size: 400,
            checksum: sum,
            token: 0,
        };
        let sum = checksum(&[5u8; 400]);
        for n in 0..2 {
            let mut w = a.writer(400, T).await.unwrap();
            w.bytes_mut().fill(5);
            drop(w.seal_copy(&r(n, sum)).unwrap());
        }
        let borrowed = a.held(&r(1, sum)).unwrap();
        // 800 of 1000 in use by copies: the put drops copy 0 (unborrowed),
        // not copy 1 (borrowed), and does not wait.
        let put = a.put(&[1u8; 400], Duration::from_millis(10)).await.unwrap();
        assert!(a.held(&r(0, sum)).is_none());
        assert!(a.held(&r(1, sum)).is_some());
        assert_eq!(a.stats().waits, 0);
        drop((put, borrowed));
    }

    #[tokio::test]
    async fn segments_of_dead_processes_are_swept_at_open() {
        let s = scope("sweep");
        let other = scope("sweep-other");
        let live = store(s, "a", 1 << 20);
        let kept = live.put(b"mine", T).await.unwrap();
        let dead = |scope, seq| ObjectId {
            scope,
            pid: u32::MAX - 1,
            seq,
        };
        for id in [dead(s, 1), dead(s, 2), dead(other, 1)] {
            let mut seg = Segment::create(&id.segment_name(), 10).unwrap();
            seg.seal(id, 10, 0);
            seg.set_owner(false);
        }
        let (_, swept) = Store::open(StoreConfig {
            scope: s,
            owner: "b".into(),
            host: "host-a".into(),
            capacity: 1,
        });
        assert_eq!(swept, 2);
        assert_eq!(
            segments(s),
            vec![kept.reference().id],
            "the live process's segment stays"
        );
        assert_eq!(segments(other).len(), 1, "another cluster's are not ours");
        std::fs::remove_file(format!("/dev/shm/{}", dead(other, 1).file_name())).unwrap();
    }
}
