//! Object ids and the references that travel in messages.

use std::fmt;

use rkyv::{Archive, Deserialize, Serialize};

/// Largest object a store accepts: 64 GiB.
pub const MAX_OBJECT_SIZE: u64 = 64 << 30;

/// Longest node name or host id in an [`ObjectRef`].
pub const MAX_NAME_LEN: usize = 255;

/// Which object: unique on a host for the life of its segments.
///
/// `scope` names the cluster (a digest of its cookie), `pid` the process
/// whose store created the object, `seq` the object within that store (its
/// high 24 bits tell stores of one process apart). Together they name the
/// object's segment, [`ObjectId::segment_name`].
#[derive(
    Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[rkyv(derive(Debug, PartialEq, Eq, Hash))]
pub struct ObjectId {
    /// The cluster's scope.
    pub scope: u32,
    /// The creating process.
    pub pid: u32,
    /// The object within the creating store.
    pub seq: u64,
}

impl ObjectId {
    /// The name of the shared-memory segment holding the object.
    pub fn segment_name(&self) -> String {
        format!("/{}", self.file_name())
    }

    /// The segment's file name under `/dev/shm`.
    pub fn file_name(&self) -> String {
        format!("flotilla.{:08x}.{}.{:x}", self.scope, self.pid, self.seq)
    }

    /// Parses a segment's file name back into an id; `None` for any other
    /// file.
    pub fn from_file_name(name: &str) -> Option<Self> {
        let mut parts = name.strip_prefix("flotilla.")?.split('.');
        let scope = u32::from_str_radix(parts.next()?, 16).ok()?;
        let pid = parts.next()?.parse().ok()?;
        let seq = u64::from_str_radix(parts.next()?, 16).ok()?;
        parts.next().is_none().then_some(Self { scope, pid, seq })
    }
}

impl From<&ArchivedObjectId> for ObjectId {
    fn from(a: &ArchivedObjectId) -> Self {
        Self {
            scope: a.scope.to_native(),
            pid: a.pid.to_native(),
            seq: a.seq.to_native(),
        }
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}-{}-{:x}", self.scope, self.pid, self.seq)
    }
}

/// A reference to an immutable object: what messages carry instead of the
/// bytes. Cheap to clone and to send; reading it is [`crate::Store::get`]
/// on the owner's host, or a pull from the owner elsewhere.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// The object.
    pub id: ObjectId,
    /// The node whose store holds it (and frees it).
    pub owner: String,
    /// The owner's host id: readers with the same host id map the segment.
    pub host: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3-64 of the bytes; a pulled copy must match it.
    pub checksum: u64,
    /// The owner's secret for this object: a pull from another host must
    /// carry it, so only those given the reference can read the object
    /// over the network (see [`crate::Store::token_of`]).
    pub token: u64,
}

/// A reference that cannot name an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefError {
    /// The size is over [`MAX_OBJECT_SIZE`].
    #[error("object reference of {0} bytes exceeds the limit of {MAX_OBJECT_SIZE}")]
    TooLarge(u64),
    /// The owner or host is empty or longer than [`MAX_NAME_LEN`].
    #[error("object reference with an empty or overlong {0}")]
    BadName(&'static str),
    /// Text that is not an object reference.
    #[error("not an object reference (obj:SCOPE-PID-SEQ:SIZE:CHECKSUM:TOKEN:OWNER:HOST): {0:?}")]
    BadToken(String),
}

impl ObjectRef {
    /// Checks what a reference from a peer claims before it is used.
    pub fn check(&self) -> Result<(), RefError> {
        if self.size > MAX_OBJECT_SIZE {
            return Err(RefError::TooLarge(self.size));
        }
        for (what, s) in [("owner", &self.owner), ("host", &self.host)] {
            if s.is_empty() || s.len() > MAX_NAME_LEN {
                return Err(RefError::BadName(what));
            }
        }
        Ok(())
    }
}

impl ObjectRef {
    /// The reference as one line of text, for tools and logs:
    /// `obj:SCOPE-PID-SEQ:SIZE:CHECKSUM:TOKEN:OWNER:HOST` (hex where
    /// [`ObjectId`]'s display is, checksum and token in hex). The owner's
    /// name may hold `:` nowhere, the host id last may.
    pub fn to_token(&self) -> String {
        format!(
            "obj:{}:{}:{:x}:{:x}:{}:{}",
            self.id, self.size, self.checksum, self.token, self.owner, self.host
        )
    }

    /// Reads [`ObjectRef::to_token`]'s form back, checked.
    pub fn from_token(token: &str) -> Result<Self, RefError> {
        let bad = || RefError::BadToken(token.chars().take(80).collect());
        let mut parts = token.trim().splitn(7, ':');
        if parts.next() != Some("obj") {
            return Err(bad());
        }
        let mut id = parts.next().ok_or_else(bad)?.split('-');
        let scope = u32::from_str_radix(id.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let pid = id.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let seq = u64::from_str_radix(id.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        if id.next().is_some() {
            return Err(bad());
        }
        let size = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let checksum = u64::from_str_radix(parts.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let secret = u64::from_str_radix(parts.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let owner = parts.next().ok_or_else(bad)?.to_owned();
        let host = parts.next().ok_or_else(bad)?.to_owned();
        let reference = Self {
            id: ObjectId { scope, pid, seq },
            owner,
            host,
            size,
            checksum,
            token: secret,
        };
        reference.check()?;
        Ok(reference)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} bytes, on {})", self.id, self.size, self.owner)
    }
}

/// The xxh3-64 checksum objects carry.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip_and_others_are_not_ids() {
        let id = ObjectId {
            scope: 0xdead_beef,
            pid: 4242,
            seq: 0xab_0000_0001,
        };
        assert_eq!(ObjectId::from_file_name(&id.file_name()), Some(id));
        assert_eq!(id.segment_name(), format!("/{}", id.file_name()));
        for other in [
            "flotilla.x.1.2",
            "flotilla.1.2",
            "flotilla.1.2.3.4",
            "sem.x",
            "flotilla.1.-2.3",
        ] {
            assert_eq!(ObjectId::from_file_name(other), None, "{other}");
        }
    }

    #[test]
    fn tokens_round_trip_and_junk_is_refused() {
        let r = ObjectRef {
            id: ObjectId {
                scope: 0xabc,
                pid: 77,
                seq: 0xff00_0000_0001,
            },
            owner: "w-1".into(),
            host: "h:with:colons".into(),
            size: 123,
            checksum: 0xdead,
            token: 0x0123_4567_89ab_cdef,
        };
        assert_eq!(ObjectRef::from_token(&r.to_token()), Ok(r.clone()));
        for junk in [
            "",
            "obj:",
            "obj:1-2:3:4:a:b",
            "obj:1-2-3:x:4:a:b",
            "obj:1-2-3:3:4:a",
            "obj:1-2-3:3:4::b",
            "obj:1-2-3:3:4:zz:a:b",
            "ref:1-2-3:3:4:5:a:b",
        ] {
            assert!(ObjectRef::from_token(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn malformed_references_are_refused() {
        let good = ObjectRef {
            id: ObjectId {
                scope: 1,
                pid: 1,
                seq: 1,
            },
            owner: "w1".into(),
            host: "h".into(),
            size: 10,
            checksum: 0,
            token: 0,
        };
        assert_eq!(good.check(), Ok(()));
        let big = ObjectRef {
            size: MAX_OBJECT_SIZE + 1,
            ..good.clone()
        };
        assert_eq!(big.check(), Err(RefError::TooLarge(MAX_OBJECT_SIZE + 1)));
        let nameless = ObjectRef {
            owner: String::new(),
            ..good.clone()
        };
        assert_eq!(nameless.check(), Err(RefError::BadName("owner")));
        let long = ObjectRef {
            host: "h".repeat(300),
            ..good
        };
        assert_eq!(long.check(), Err(RefError::BadName("host")));
    }
}
