//! rkyv archives on the wire.
//!
//! Everything a node receives from outside its process is validated with
//! rkyv's checked access (bytecheck) before a single field is read; an
//! invalid archive is a typed error, never a panic.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

/// A received archive failed validation. The peer misbehaved: drop the
/// message or close the connection, never retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {type_name} archive: {reason}")]
pub struct WireError {
    /// The type the bytes were meant to hold.
    pub type_name: &'static str,
    /// What the validator found.
    pub reason: String,
}

/// Types that can be written with [`encode`].
pub trait Encode:
    for<'a> Serialize<HighSerializer<WireBuf, ArenaHandle<'a>, rancor::Error>>
{
}
impl<T> Encode for T where
    T: for<'a> Serialize<HighSerializer<WireBuf, ArenaHandle<'a>, rancor::Error>>
{
}

/// Room reserved past a write that does not fit: rkyv writes a value's
/// out-of-line data first and its root last, and the root must not move a
/// large archive to a buffer twice its size.
const ROOT_ROOM: usize = 256;

/// The buffer [`encode`] writes an archive into: a `Vec` that grows by what
/// a write needs plus room for the root written last, so a megabyte payload
/// is copied into it once.
#[derive(Debug, Default)]
pub struct WireBuf(Vec<u8>);

impl rkyv::ser::Positional for WireBuf {
    fn pos(&self) -> usize {
        self.0.len()
    }
}

impl<E> rkyv::ser::Writer<E> for WireBuf {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        if self.0.capacity() - self.0.len() < bytes.len() {
            self.0.reserve(bytes.len() + ROOT_ROOM);
        }
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// The alignment checked access needs (rkyv's `AlignedVec` default): the
/// allocator's blocks have it, so received buffers are read where they are.
const ALIGNMENT: usize = 16;

/// Types that can be read back with [`decode`]: their archived form can be
/// validated and deserialized.
pub trait Decode:
    Archive<
        Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
                      + Deserialize<Self, HighDeserializer<rancor::Error>>,
    > + Sized
{
}
impl<T> Decode for T where
    T: Archive<
        Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
                      + Deserialize<T, HighDeserializer<rancor::Error>>,
    >
{
}

/// Serializes `value` into an archive, written straight into the `Vec`
/// that is sent (no copy out of an aligned buffer: positions in an archive
/// are relative, and whoever reads it aligns the bytes if they are not).
///
/// Serialization of the plain data types used on the wire cannot fail; a
/// failure means the type itself is unfit for the wire and panics.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, WireBuf::default())
        .expect("wire types serialize infallibly")
        .0
}

/// Copies `bytes` into an aligned buffer, as checked access requires.
pub fn align(bytes: &[u8]) -> AlignedVec {
    let mut aligned = AlignedVec::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    aligned
}

/// Validates the archive in `bytes` and returns a reference to it without
/// deserializing (zero-copy read). `bytes` must be aligned: use [`align`] on
/// buffers received from the network.
pub fn access<T>(bytes: &AlignedVec) -> Result<&T::Archived, WireError>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>,
{
    rkyv::access::<T::Archived, rancor::Error>(bytes).map_err(|e| WireError {
        type_name: std::any::type_name::<T>(),
        reason: e.to_string(),
    })
}

/// Validates and deserializes an archive received from outside the process.
/// Bytes at an aligned address (every buffer the allocator hands out) are
/// validated where they are; others are first copied into an aligned
/// buffer.
pub fn decode<T: Decode>(bytes: &[u8]) -> Result<T, WireError> {
    let copy;
    let bytes = if (bytes.as_ptr() as usize).is_multiple_of(ALIGNMENT) {
        bytes
    } else {
        copy = align(bytes);
        copy.as_slice()
    };
    let archived = rkyv::access::<T::Archived, rancor::Error>(bytes).map_err(|e| WireError {
        type_name: std::any::type_name::<T>(),
        reason: e.to_string(),
    })?;
    rkyv::deserialize::<T, rancor::Error>(archived).map_err(|e| WireError {
        type_name: std::any::type_name::<T>(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    struct Sample {
        id: u64,
        name: String,
        values: Vec<f32>,
        tag: Option<String>,
        kind: Kind,
    }

    #[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
    enum Kind {
        A,
        B,
    }

    proptest! {
        #[test]
        fn archives_round_trip(id in any::<u64>(), name in ".{0,40}", values in proptest::collection::vec(-1e6f32..1e6, 0..64), tag in proptest::option::of("[a-z]{0,8}")) {
            let s = Sample { id, name, values, tag, kind: Kind::B };
            prop_assert_eq!(decode::<Sample>(&encode(&s)).unwrap(), s);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Sample>(&bytes);
        }
    }

    #[test]
    fn unaligned_bytes_are_copied_then_read() {
        let s = Sample {
            id: 7,
            name: "shifted".into(),
            values: vec![0.5; 4],
            tag: Some("t".into()),
            kind: Kind::A,
        };
        let bytes = encode(&s);
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        let at = &shifted[1..];
        assert!(!(at.as_ptr() as usize).is_multiple_of(ALIGNMENT));
        assert_eq!(decode::<Sample>(at).unwrap(), s);
    }

    #[test]
    fn a_large_archive_fits_the_buffer_its_payload_was_written_into() {
        let bytes = encode(&vec![5u8; 4 << 20]);
        assert!(
            bytes.capacity() < (4 << 20) + 2 * ROOT_ROOM,
            "{}",
            bytes.capacity()
        );
        assert_eq!(decode::<Vec<u8>>(&bytes).unwrap().len(), 4 << 20);
    }

    #[test]
    fn truncated_archive_is_an_error() {
        let bytes = encode(&Sample {
            id: 1,
            name: "node".into(),
            values: vec![1.0; 8],
            tag: None,
            kind: Kind::A,
        });
        for cut in 0..bytes.len() {
            assert!(
                decode::<Sample>(&bytes[..cut]).is_err(),
                "cut at {cut} accepted"
            );
        }
    }

    #[test]
    fn invalid_enum_tag_is_an_error_naming_the_type() {
        let sample = |kind| Sample {
            id: 1,
            name: "abc".into(),
            values: vec![],
            tag: None,
            kind,
        };
        let a = encode(&sample(Kind::A));
        let b = encode(&sample(Kind::B));
        let at = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .expect("tags differ");
        let mut bad = a.clone();
        bad[at] = 9;
        let err = decode::<Sample>(&bad).unwrap_err();
        assert!(err.type_name.contains("Sample"), "{err}");
    }
}
