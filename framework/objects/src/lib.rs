//! Flotilla's shared-memory object store.
//!
//! Immutable objects (bytes, normally an rkyv archive) live in POSIX
//! shared-memory segments on their node's host. [`Store::put`] returns an
//! [`Object`], the owner's handle, whose [`ObjectRef`] travels in messages;
//! [`Store::get`] on the same host maps the segment and hands out
//! [`ObjectBytes`], a borrow of the bytes or ([`ObjectBytes::archive`]) the
//! archive read in place. Readers on other hosts pull a copy (the runtime's
//! `objects` module) into their own store with [`Store::writer`] and
//! [`ObjectWriter::seal_copy`], which checks the checksum.
//!
//! ```text
//! owner process                      reader process, same host
//! Store::put ─► /dev/shm/flotilla.<scope>.<pid>.<seq> ◄─ Store::get(ref): mmap, header checked
//!   Object (handle, refcounted)          ObjectBytes (borrow) ─► archive::<T>() validated once
//! ```
//!
//! Lifetime: an object is freed when its owner's last [`Object`] handle and
//! the last [`ObjectBytes`] borrowed from it in the owner's process are
//! dropped; readers elsewhere keep what they mapped. Capacity is a hard
//! limit with backpressure: a put waits for space and fails with
//! [`ObjectError::Full`] at its timeout — nothing spills to disk. Segments
//! of a process killed outright are removed by the next store of the
//! cluster that opens on the host.
//!
//! Every `unsafe` of this crate is in its `segment`, `in_place` and
//! `meter` modules, with the invariants that justify it (the only other
//! `unsafe` of the workspace is the encoder's int8 dot product,
//! `flotilla_embed::int8_gemm::dot`). [`meter::Metered`] is not part of
//! the store: the allocator the decoder fuzz tests measure allocations
//! with.

#![warn(clippy::too_many_lines)]

mod in_place;
pub mod meter;
mod object_ref;
mod segment;
mod store;
mod sweep;

pub use flotilla_proto::objects::ObjectStats;
pub use in_place::{ArchiveBuf, ArchiveError, f32s};
pub use object_ref::{
    ArchivedObjectId, ArchivedObjectRef, MAX_NAME_LEN, MAX_OBJECT_SIZE, ObjectId, ObjectRef,
    RefError, checksum,
};
pub use segment::SegmentError;
pub use store::{Object, ObjectBytes, ObjectError, ObjectWriter, Release, Store, StoreConfig};
pub use sweep::{segments, sweep_dead};
