//! Archives read in place, validated once per object, type and process.
#![allow(unsafe_code)]

use std::any::TypeId;
use std::sync::Mutex;

use rkyv::api::high::HighValidator;
use rkyv::bytecheck::CheckBytes;
use rkyv::{Archive, rancor};

/// The archive types a mapping's bytes were validated as.
#[derive(Default)]
pub(crate) struct Validated(Mutex<Vec<TypeId>>);

#[cfg(test)]
mod tests {
    #[test]
    fn archived_floats_read_as_native_ones() {
        let values = vec![1.5f32, -0.25, 3.0e-7, f32::MAX];
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&values).unwrap();
        let archived =
            rkyv::access::<rkyv::Archived<Vec<f32>>, rkyv::rancor::Error>(&bytes).unwrap();
        assert_eq!(&*super::f32s(archived.as_slice()), &values[..]);
    }
}

/// An object's bytes are not a valid archive of the type asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NODE-OBJ-006: object is not a valid {type_name} archive: {reason}")]
pub struct ArchiveError {
    /// The type asked for.
    pub type_name: &'static str,
    /// What the validator found.
    pub reason: String,
}

/// The native `f32`s of an archived `f32` array (`ArchivedVec<f32>`'s
/// slice), without copying them on little-endian machines (where the
/// archived form is the native one); copied into native order elsewhere.
pub fn f32s(values: &[rkyv::rend::f32_le]) -> std::borrow::Cow<'_, [f32]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `f32_le` is `#[repr(C, align(4))]` around one `f32`
        // holding little-endian bits: on a little-endian machine it has
        // `f32`'s size, alignment and value, so the slice reads as `[f32]`
        // of the same length, borrowed for the same lifetime.
        let native =
            unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<f32>(), values.len()) };
        std::borrow::Cow::Borrowed(native)
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(values.iter().map(|v| v.to_native()).collect())
    }
}

impl Validated {
    /// The archive of `T` in `bytes`: checked with bytecheck the first
    /// time, read without checking after that.
    ///
    /// `bytes` must be the same immutable bytes on every call for one
    /// `Validated` (the store keeps one per mapping; segments never change
    /// once sealed).
    pub(crate) fn access<'b, T>(&self, bytes: &'b [u8]) -> Result<&'b T::Archived, ArchiveError>
    where
        T: Archive + 'static,
        T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>,
    {
        let ty = TypeId::of::<T>();
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&ty) {
            // SAFETY: these bytes passed `rkyv::access::<T::Archived>` on an
            // earlier call (`ty` is recorded only after it did), and they
            // have not changed since: a sealed segment is immutable
            // (segment invariant 1) and this `Validated` belongs to that one
            // mapping.
            return Ok(unsafe { rkyv::access_unchecked::<T::Archived>(bytes) });
        }
        let archived =
            rkyv::access::<T::Archived, rancor::Error>(bytes).map_err(|e| ArchiveError {
                type_name: std::any::type_name::<T>(),
                reason: e.to_string(),
            })?;
        seen.push(ty);
        Ok(archived)
    }
}

/// The alignment the archives' buffers keep (rkyv's `AlignedVec` default;
/// the allocator's large blocks have it).
const ALIGNMENT: usize = 16;

/// The bytes of an [`ArchiveBuf`]: a plain `Vec` when the allocator placed
/// it aligned, else an aligned copy.
enum Buf {
    Plain(Vec<u8>),
    Aligned(rkyv::util::AlignedVec),
}

impl Buf {
    /// `bytes` where they are if aligned, else copied into an aligned buffer.
    fn aligned(bytes: Vec<u8>) -> Self {
        if (bytes.as_ptr() as usize).is_multiple_of(ALIGNMENT) {
            Self::Plain(bytes)
        } else {
            let mut copy = rkyv::util::AlignedVec::with_capacity(bytes.len());
            copy.extend_from_slice(&bytes);
            Self::Aligned(copy)
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Plain(v) => v,
            Self::Aligned(a) => a.as_slice(),
        }
    }
}

/// An archive of `T` in a buffer of its own: validated once, when it is
/// made, and read in place after that ([`ArchiveBuf::get`]), never
/// deserialized. What a large message's payload is received into.
///
/// Invariants that [`ArchiveBuf::get`] relies on: the bytes passed
/// `rkyv::access::<T::Archived>` when the value was made; they are private
/// and never mutated; they sit at a 16-byte aligned address on the heap,
/// which does not move when the value does.
pub struct ArchiveBuf<T> {
    bytes: Buf,
    _type: std::marker::PhantomData<fn() -> T>,
}

impl<T> ArchiveBuf<T>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>,
{
    /// Validates the archive of `T` in `bytes`, keeping the buffer (or an
    /// aligned copy, where the allocator placed it unaligned).
    pub fn from_vec(bytes: Vec<u8>) -> Result<Self, ArchiveError> {
        let bytes = Buf::aligned(bytes);
        rkyv::access::<T::Archived, rancor::Error>(bytes.as_slice()).map_err(|e| ArchiveError {
            type_name: std::any::type_name::<T>(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            bytes,
            _type: std::marker::PhantomData,
        })
    }

    /// Serializes `value` into an archive of its own.
    pub fn new(value: &T) -> Self
    where
        T: flotilla_proto::wire::Encode,
    {
        Self::from_vec(flotilla_proto::wire::encode(value))
            .expect("an archive just serialized is valid")
    }

    /// The archive, read in place.
    pub fn get(&self) -> &T::Archived {
        // SAFETY: the bytes passed `rkyv::access::<T::Archived>` in
        // `from_vec`, the only constructor (`new` and `clone` go through
        // it); they are private to this value and never mutated, and they
        // stay at the aligned heap address they were checked at.
        unsafe { rkyv::access_unchecked::<T::Archived>(self.bytes.as_slice()) }
    }
}

impl<T> ArchiveBuf<T> {
    /// The archive's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The archive's bytes as a `Vec`, without a copy unless the buffer
    /// had to be aligned when it was received.
    pub fn into_vec(self) -> Vec<u8> {
        match self.bytes {
            Buf::Plain(v) => v,
            Buf::Aligned(a) => a.as_slice().to_vec(),
        }
    }
}

impl<T> Clone for ArchiveBuf<T> {
    fn clone(&self) -> Self {
        // Same bytes, so still valid; only their alignment is checked again.
        Self {
            bytes: Buf::aligned(self.as_bytes().to_vec()),
            _type: std::marker::PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for ArchiveBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveBuf")
            .field("type", &std::any::type_name::<T>())
            .field("bytes", &self.as_bytes().len())
            .finish()
    }
}

#[cfg(test)]
mod archive_buf_tests {
    use super::ArchiveBuf;

    #[test]
    fn an_archive_buf_reads_its_archive_in_place_after_one_check() {
        let values: Vec<u32> = (0..1000).collect();
        let buf = ArchiveBuf::<Vec<u32>>::new(&values);
        assert_eq!(buf.get().len(), 1000);
        assert_eq!(buf.get()[999], 999);
        let copy = buf.clone();
        let again = ArchiveBuf::<Vec<u32>>::from_vec(copy.into_vec()).unwrap();
        assert_eq!(again.get()[5], 5);
    }

    #[test]
    fn invalid_archives_are_refused_naming_the_type() {
        let bytes = flotilla_proto::wire::encode(&vec![7u64; 16]);
        assert!(ArchiveBuf::<Vec<u64>>::from_vec(bytes.clone()).is_ok());
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            let err = ArchiveBuf::<Vec<u64>>::from_vec(bytes[..cut].to_vec()).unwrap_err();
            assert!(err.type_name.contains("Vec<u64>"), "{err}");
        }
    }
}
