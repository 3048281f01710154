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
