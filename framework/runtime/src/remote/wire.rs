//! Remote-capable message payloads as rkyv archives.
//!
//! ractor_cluster moves message fields as bytes through ractor's
//! `BytesConvertable`. [`remote_type!`](crate::remote_type) implements it for
//! rkyv types, so a user writes derives, not serialization:
//!
//! ```
//! use flotilla::rkyv::{Archive, Deserialize, Serialize};
//!
//! #[derive(Archive, Serialize, Deserialize, Debug, PartialEq)]
//! #[rkyv(crate = flotilla::rkyv)]
//! pub struct Greeting {
//!     pub text: String,
//! }
//! flotilla::remote_type!(Greeting);
//!
//! use flotilla::ractor::BytesConvertable;
//! let g = Greeting { text: "hi".into() };
//! assert_eq!(Greeting::from_bytes(g.into_bytes()).text, "hi");
//! ```
//!
//! Received bytes are validated with rkyv's checked access. An invalid
//! archive is never read: ractor drops the message (its decoding runs under
//! `catch_unwind`), logs it, and the receiving actor keeps running.
//!
//! A `remote_type!` field arrives deserialized into an owned value: one
//! more copy of every byte, and an allocation per string or vector. A large
//! payload goes as a [`Sealed`] field instead: serialized once by its
//! sender, validated once where it lands and read there in place.

pub use flotilla_proto::wire::{Decode, Encode, WireError, access, align, decode, encode};

/// Implements ractor's `BytesConvertable` for rkyv types, validating every
/// received archive.
#[macro_export]
macro_rules! remote_type {
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::ractor::BytesConvertable for $t {
            fn into_bytes(self) -> ::std::vec::Vec<u8> {
                $crate::remote::wire::encode(&self)
            }
            fn from_bytes(bytes: ::std::vec::Vec<u8>) -> Self {
                match $crate::remote::wire::decode::<$t>(&bytes) {
                    Ok(value) => value,
                    // ractor decodes under catch_unwind: the message is
                    // dropped and the actor keeps running.
                    Err(e) => $crate::remote::wire::reject(e),
                }
            }
        }
    )+};
}

/// Logs an invalid archive and unwinds out of ractor's decoder, which drops
/// the message. Used by [`remote_type!`](crate::remote_type).
#[doc(hidden)]
pub fn reject(error: WireError) -> ! {
    tracing::warn!(%error, "NODE-WIRE-001: dropped a remote message with an invalid archive");
    crate::counters::frame_dropped("cluster", "invalid_archive");
    std::panic::resume_unwind(Box::new(error))
}

/// An rkyv archive of `T` as a message field, read in place: the sender
/// serializes it once ([`Sealed::new`]), the receiving node validates it
/// once where it lands, and the handler reads it with [`Sealed::get`] —
/// no owned copy is deserialized. For large payloads (see
/// docs/runtime-semantics.md, "Delivery" and "Objects"); small ones are simpler as
/// [`remote_type!`](crate::remote_type) fields.
///
/// ```
/// use flotilla::rkyv::{Archive, Deserialize, Serialize};
/// use flotilla::wire::Sealed;
/// use flotilla::ractor::BytesConvertable;
///
/// #[derive(Archive, Serialize, Deserialize)]
/// #[rkyv(crate = flotilla::rkyv)]
/// pub struct Frames {
///     pub pixels: Vec<u8>,
/// }
///
/// let sealed = Sealed::new(&Frames { pixels: vec![9; 1 << 20] });
/// // What a remote receiver gets from the wire:
/// let received = Sealed::<Frames>::from_bytes(sealed.into_bytes());
/// assert_eq!(received.get().pixels.len(), 1 << 20);
/// ```
pub struct Sealed<T>(flotilla_objects::ArchiveBuf<T>);

impl<T> Sealed<T>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>,
{
    /// Serializes `value` once, for sending.
    pub fn new(value: &T) -> Self
    where
        T: Encode,
    {
        Self(flotilla_objects::ArchiveBuf::new(value))
    }

    /// The archive, read in place.
    pub fn get(&self) -> &T::Archived {
        self.0.get()
    }

    /// An owned copy of the value.
    pub fn deserialize(&self) -> T
    where
        T::Archived: rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    {
        rkyv::deserialize::<T, rkyv::rancor::Error>(self.get())
            .expect("a validated archive deserializes")
    }

    /// The archive's size in bytes.
    pub fn len(&self) -> usize {
        self.0.as_bytes().len()
    }

    /// Whether the archive has no bytes (never, for a valid one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Clone for Sealed<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> std::fmt::Debug for Sealed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Sealed").field(&self.0).finish()
    }
}

impl<T> ractor::BytesConvertable for Sealed<T>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>,
{
    fn into_bytes(self) -> Vec<u8> {
        self.0.into_vec()
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        match flotilla_objects::ArchiveBuf::from_vec(bytes) {
            Ok(buf) => Self(buf),
            Err(e) => reject(WireError {
                type_name: e.type_name,
                reason: e.reason,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use ractor::BytesConvertable;

    use super::Sealed;

    #[test]
    fn a_sealed_field_round_trips_and_a_bad_one_is_dropped_not_read() {
        let sealed = Sealed::new(&vec![3u32; 4096]);
        let received = Sealed::<Vec<u32>>::from_bytes(sealed.clone().into_bytes());
        assert_eq!(received.get().len(), 4096);
        assert_eq!(received.deserialize(), sealed.deserialize());
        let mut bytes = sealed.into_bytes();
        bytes.truncate(bytes.len() - 1);
        // ractor decodes fields under catch_unwind: the unwind drops the
        // message.
        assert!(std::panic::catch_unwind(|| Sealed::<Vec<u32>>::from_bytes(bytes)).is_err());
    }
}
