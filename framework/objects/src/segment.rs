//! Shared-memory segments: the one module of the workspace with `unsafe`.
//!
//! A segment is a POSIX shared-memory object (`/dev/shm/flotilla.…` on
//! Linux) holding one object: a 64-byte [`Header`] followed by the object's
//! bytes, so the bytes start 64-byte aligned (mappings are page aligned).
//!
//! ```text
//! offset 0                 64                         64 + size
//!        [ magic | version | size | checksum | id | sealed ][ bytes … ]
//! ```
//!
//! # Invariants (what makes the `unsafe` below sound)
//!
//! 1. A segment is written only by the store that created it, only through
//!    [`Segment::data_mut`] (which takes `&mut self`) and only before
//!    [`Segment::seal`]; the store never hands out a `&mut` to a sealed
//!    segment. After sealing nobody writes: readers in this or another
//!    process map it and hand out `&[u8]` only.
//! 2. A reader checks the mapping's length against the header before it
//!    reads a byte of the object, so a truncated segment is an error, not a
//!    fault. Segments are created with mode 0600: only processes of the
//!    node's own user can open, resize or write them. Such a process that
//!    writes into or shrinks a sealed segment breaks the store's
//!    immutability; the host is the trust boundary, as for Ray's plasma.
//! 3. The mapping lives as long as the [`Segment`]; every slice borrows the
//!    segment, so no slice outlives its mapping. Unlinking a segment
//!    (dropping its owner) leaves existing mappings valid: the memory goes
//!    when the last mapping in any process goes.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering, fence};

use shared_memory::{Shmem, ShmemConf, ShmemError};

use crate::object_ref::ObjectId;

/// Bytes before the object's bytes in every segment.
pub(crate) const HEADER_LEN: usize = 64;

/// The first eight bytes of every segment.
const MAGIC: [u8; 8] = *b"FLOBJ\0\0\x01";

/// Layout version of the header.
const VERSION: u32 = 1;

/// What `sealed` holds once the object's bytes are complete.
const SEALED: u64 = 0x5EA1_ED00_5EA1_ED00;

/// A segment's header, as read from its first [`HEADER_LEN`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// The object's size in bytes.
    pub size: u64,
    /// xxh3-64 of the object's bytes.
    pub checksum: u64,
    /// The object's id.
    pub id: ObjectId,
    /// Whether the bytes are complete.
    pub sealed: bool,
}

/// Why a segment could not be created or opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    /// No segment of that name exists (its owner freed it, or it never
    /// existed).
    #[error("no shared-memory segment {0}")]
    Missing(String),
    /// A segment of that name already exists.
    #[error("shared-memory segment {0} already exists")]
    Exists(String),
    /// The segment is shorter than its header says.
    #[error("shared-memory segment {name} holds {have} bytes, its object needs {need}")]
    Truncated {
        /// The segment's name.
        name: String,
        /// Bytes the mapping has.
        have: u64,
        /// Bytes header and object need.
        need: u64,
    },
    /// The segment does not start with a valid header.
    #[error("shared-memory segment {0} is not a Flotilla object (bad header)")]
    NotAnObject(String),
    /// The segment's memory could not be allocated (the filesystem behind
    /// `/dev/shm` is full, or memory is short).
    #[error("shared-memory segment {name}: cannot allocate {bytes} bytes: {errno}")]
    NoMemory {
        /// The segment's name.
        name: String,
        /// Bytes asked for.
        bytes: u64,
        /// What the kernel said.
        errno: nix::errno::Errno,
    },
    /// The operating system refused.
    #[error("shared-memory segment {name}: {source}")]
    Os {
        /// The segment's name.
        name: String,
        /// What `shared_memory` reported.
        #[source]
        source: ShmemError,
    },
}

/// What `shared_memory`'s error says of segment `name`.
fn os_error(name: &str, e: ShmemError) -> SegmentError {
    match e {
        ShmemError::MappingIdExists | ShmemError::LinkExists => {
            SegmentError::Exists(name.to_owned())
        }
        // ENOENT: no such segment.
        ShmemError::MapOpenFailed(2) => SegmentError::Missing(name.to_owned()),
        source => SegmentError::Os {
            name: name.to_owned(),
            source,
        },
    }
}

/// One mapped segment.
pub(crate) struct Segment {
    shm: Shmem,
    name: String,
}

// SAFETY: `Shmem` is a mapping address, a length and an OS id; the mapping
// is valid from any thread. Shared access only reads (invariant 1): the one
// writer holds `&mut Segment`.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` gives out `&[u8]` only.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates segment `name` for an object of `size` bytes, unsealed and
    /// owned: dropping it unlinks the name.
    pub(crate) fn create(name: &str, size: u64) -> Result<Self, SegmentError> {
        let len = HEADER_LEN as u64 + size;
        let len = usize::try_from(len).map_err(|_| SegmentError::Truncated {
            name: name.to_owned(),
            have: 0,
            need: len,
        })?;
        let shm = ShmemConf::new()
            .os_id(name)
            .size(len)
            .create()
            .map_err(|e| os_error(name, e))?;
        let segment = Self {
            shm,
            name: name.to_owned(),
        };
        segment.populate(len)?;
        Ok(segment)
    }

    /// Allocates and maps every page of a new segment now, in one call,
    /// instead of one fault per page as it is written: faster to fill, and
    /// a full `/dev/shm` is an error here rather than a SIGBUS on a write.
    /// Kernels older than 5.14 lack the advice: their pages fault in as
    /// before.
    #[cfg(target_os = "linux")]
    fn populate(&self, len: usize) -> Result<(), SegmentError> {
        use nix::sys::mman::{MmapAdvise, madvise};
        let Some(at) = std::ptr::NonNull::new(self.shm.as_ptr()) else {
            return Ok(());
        };
        // SAFETY: `at..at + len` is exactly this segment's mapping, alive
        // as long as `self`; the advice only allocates and maps its pages
        // (zeroed, as they would be on first touch), nothing is read.
        match unsafe { madvise(at.cast(), len, MmapAdvise::MADV_POPULATE_WRITE) } {
            Ok(()) | Err(nix::errno::Errno::EINVAL) => Ok(()),
            Err(errno) => Err(SegmentError::NoMemory {
                name: self.name.clone(),
                bytes: len as u64,
                errno,
            }),
        }
    }

    /// Elsewhere pages fault in as they are written.
    #[cfg(not(target_os = "linux"))]
    fn populate(&self, _len: usize) -> Result<(), SegmentError> {
        Ok(())
    }

    /// Maps existing segment `name` (not owned: dropping it leaves the
    /// name) and checks its header and length.
    pub(crate) fn open(name: &str) -> Result<(Self, Header), SegmentError> {
        let shm = ShmemConf::new()
            .os_id(name)
            .open()
            .map_err(|e| os_error(name, e))?;
        let segment = Self {
            shm,
            name: name.to_owned(),
        };
        if segment.shm.len() < HEADER_LEN {
            return Err(SegmentError::Truncated {
                name: name.to_owned(),
                have: segment.shm.len() as u64,
                need: HEADER_LEN as u64,
            });
        }
        let header = segment
            .header()
            .ok_or_else(|| SegmentError::NotAnObject(name.to_owned()))?;
        let need = HEADER_LEN as u64 + header.size;
        if (segment.shm.len() as u64) < need {
            return Err(SegmentError::Truncated {
                name: name.to_owned(),
                have: segment.shm.len() as u64,
                need,
            });
        }
        Ok((segment, header))
    }

    /// The segment's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether dropping this mapping unlinks the name.
    #[cfg(test)]
    pub(crate) fn set_owner(&mut self, owner: bool) {
        self.shm.set_owner(owner);
    }

    /// Reads the header; `None` if the magic or version is wrong.
    pub(crate) fn header(&self) -> Option<Header> {
        let mut raw = [0u8; HEADER_LEN];
        // SAFETY: the mapping has at least HEADER_LEN bytes (checked in
        // `open`, sized so in `create`) and lives as long as `self`. The
        // header may be written by its creator only before it is sealed,
        // and `sealed` is read through an atomic below.
        unsafe {
            std::ptr::copy_nonoverlapping(self.shm.as_ptr(), raw.as_mut_ptr(), HEADER_LEN);
        }
        let u64_at = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        let u32_at = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
        if raw[0..8] != MAGIC || u32_at(8) != VERSION {
            return None;
        }
        // SAFETY: offset 48 of a page-aligned mapping is 8-byte aligned and
        // inside the header; AtomicU64 has u64's layout.
        let sealed = unsafe { &*(self.shm.as_ptr().add(48) as *const AtomicU64) };
        let sealed = sealed.load(Ordering::Acquire) == SEALED;
        Some(Header {
            size: u64_at(16),
            checksum: u64_at(24),
            id: ObjectId {
                scope: u32_at(32),
                pid: u32_at(36),
                seq: u64_at(40),
            },
            sealed,
        })
    }

    /// The object's bytes: the `size` bytes after the header.
    pub(crate) fn data(&self, size: u64) -> &[u8] {
        let size = usize::try_from(size).expect("checked against the mapping's length");
        assert!(
            HEADER_LEN + size <= self.shm.len(),
            "object inside its mapping"
        );
        // SAFETY: the range lies inside the mapping (asserted), which lives
        // as long as the borrow of `self`; nobody writes a sealed segment
        // (invariant 1), and an unsealed one is read only by its writer.
        unsafe { std::slice::from_raw_parts(self.shm.as_ptr().add(HEADER_LEN), size) }
    }

    /// The object's bytes for writing, before sealing.
    pub(crate) fn data_mut(&mut self, size: u64) -> &mut [u8] {
        let size = usize::try_from(size).expect("sized at creation");
        assert!(
            HEADER_LEN + size <= self.shm.len(),
            "object inside its mapping"
        );
        // SAFETY: as in `data`; `&mut self` makes this the only borrow in
        // this process, and the segment is not sealed, so no other process
        // reads it (readers refuse unsealed segments).
        unsafe { std::slice::from_raw_parts_mut(self.shm.as_ptr().add(HEADER_LEN), size) }
    }

    /// Writes the header and marks the object complete: from here on the
    /// segment is immutable.
    pub(crate) fn seal(&mut self, id: ObjectId, size: u64, checksum: u64) {
        let mut raw = [0u8; 48];
        raw[0..8].copy_from_slice(&MAGIC);
        raw[8..12].copy_from_slice(&VERSION.to_le_bytes());
        raw[16..24].copy_from_slice(&size.to_le_bytes());
        raw[24..32].copy_from_slice(&checksum.to_le_bytes());
        raw[32..36].copy_from_slice(&id.scope.to_le_bytes());
        raw[36..40].copy_from_slice(&id.pid.to_le_bytes());
        raw[40..48].copy_from_slice(&id.seq.to_le_bytes());
        // SAFETY: the mapping has at least HEADER_LEN bytes; `&mut self`
        // and the unsealed state make this the only writer and reader.
        unsafe {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), self.shm.as_ptr(), raw.len());
        }
        fence(Ordering::Release);
        // SAFETY: as in `header`.
        let sealed = unsafe { &*(self.shm.as_ptr().add(48) as *const AtomicU64) };
        sealed.store(SEALED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(tag: &str) -> String {
        format!("/flotilla.test.{}.{tag}", std::process::id())
    }

    #[test]
    fn a_sealed_segment_reads_back_in_another_mapping() {
        let n = name("seal");
        let mut w = Segment::create(&n, 5).unwrap();
        w.data_mut(5).copy_from_slice(b"hello");
        let id = ObjectId {
            scope: 1,
            pid: 2,
            seq: 3,
        };
        w.seal(id, 5, 42);
        let (r, header) = Segment::open(&n).unwrap();
        assert_eq!(
            header,
            Header {
                size: 5,
                checksum: 42,
                id,
                sealed: true
            }
        );
        assert_eq!(r.data(5), b"hello");
        assert_eq!(r.data(5).as_ptr() as usize % 64, 0);
    }

    #[test]
    fn an_unsealed_segment_says_so_and_a_missing_one_is_missing() {
        let n = name("unsealed");
        let _w = Segment::create(&n, 8).unwrap();
        assert!(matches!(
            Segment::open(&n),
            Err(SegmentError::NotAnObject(_))
        ));
        assert!(matches!(
            Segment::open(&name("never")),
            Err(SegmentError::Missing(_))
        ));
        assert!(matches!(
            Segment::create(&n, 8),
            Err(SegmentError::Exists(_))
        ));
    }

    #[test]
    fn dropping_the_owner_unlinks_but_mappings_stay_readable() {
        let n = name("unlink");
        let mut w = Segment::create(&n, 3).unwrap();
        w.data_mut(3).copy_from_slice(b"abc");
        w.seal(
            ObjectId {
                scope: 0,
                pid: 0,
                seq: 0,
            },
            3,
            0,
        );
        let (r, _) = Segment::open(&n).unwrap();
        drop(w);
        assert!(matches!(Segment::open(&n), Err(SegmentError::Missing(_))));
        assert_eq!(r.data(3), b"abc");
    }
}
