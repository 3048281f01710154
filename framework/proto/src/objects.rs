//! Pulling an object from its owner, and the store's counters.
//!
//! A node that needs an object of another host opens a stream on the
//! owner's bulk lane with purpose `Pull`, asks for it by id, and reads the
//! bytes straight into its own store; the checksum of the reference decides
//! whether the copy is kept.
//!
//! A holder of lent objects (see the object store's `lend`) releases them
//! on a stream of the same purpose.
//!
//! ```text
//! reader ── Hello(Pull) ─► owner's bulk endpoint
//!        ── ObjectRequest::Pull{id, size, checksum, token} ─►
//!        ◄─ PullReply::Sending{size} ── size raw bytes ──   (or Gone / Mismatch, then the stream ends)
//! holder ── ObjectRequest::Release[ids] ─►
//!        ◄─ ReleaseReply{refused} ── (the stream ends)
//! ```
//!
//! A pull must carry the object's token, which only its reference holds
//! (an unguessable number the owner's store drew when it put the object):
//! a peer that guesses ids learns nothing, not even which exist. A release
//! is honoured only from the member the object was lent to.

// rkyv's derive emits undocumented public helper items for enums with
// struct variants; every type written here is documented by hand.
#![allow(missing_docs)]

use rkyv::{Archive, Deserialize, Serialize};

/// What a stream of purpose `Pull` asks of the owner.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ObjectRequest {
    /// Send an object's bytes.
    Pull(PullRequest),
    /// Stop holding these lent objects for the sender.
    Release(Vec<ObjectKey>),
}

/// An object's id: its cluster scope, creating process and sequence
/// number.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectKey {
    /// The cluster scope.
    pub scope: u32,
    /// The creating process.
    pub pid: u32,
    /// The sequence number in that process's store.
    pub seq: u64,
}

/// An object asked for by id, with what the asker's reference says of it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// The object's cluster scope.
    pub scope: u32,
    /// Its creating process.
    pub pid: u32,
    /// Its sequence number in that process's store.
    pub seq: u64,
    /// Its size, per the reference.
    pub size: u64,
    /// Its checksum, per the reference.
    pub checksum: u64,
    /// Its token, per the reference.
    pub token: u64,
}

/// The owner's answer to a release.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ReleaseReply {
    /// How many of the objects were released.
    pub released: u32,
    /// Those lent to another member than the sender, which stay held.
    pub refused: Vec<ObjectKey>,
}

/// The owner's answer to a [`PullRequest`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullReply {
    /// `size` raw bytes follow on the stream.
    Sending {
        /// Bytes that follow.
        size: u64,
    },
    /// The owner holds no such object (freed, or never put).
    Gone,
    /// The owner holds an object of that id with another size or checksum.
    Mismatch,
}

/// What a node's object store has done: `objects` in `node status --json`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectStats {
    /// Objects held (own objects and pulled copies).
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The store's capacity in bytes.
    pub capacity: u64,
    /// Objects put.
    pub puts: u64,
    /// Reads served from the host's memory.
    pub local_gets: u64,
    /// Objects pulled from other hosts.
    pub remote_pulls: u64,
    /// Bytes pulled from other hosts.
    pub pulled_bytes: u64,
    /// Puts that waited for space.
    pub waits: u64,
}
