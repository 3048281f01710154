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

pub use flotilla_proto::wire::{Decode, Encode, WireError, access, align, decode, encode};

/// Implements ractor's `BytesConvertable` for rkyv types, validating every
/// received archive.
#[macro_export]
macro_rules! remote_type {
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::ractor::BytesConvertable for $t {
            fn into_bytes(self) -> ::std::vec::Vec<u8> {
                $crate::wire::encode(&self)
            }
            fn from_bytes(bytes: ::std::vec::Vec<u8>) -> Self {
                match $crate::wire::decode::<$t>(&bytes) {
                    Ok(value) => value,
                    // ractor decodes under catch_unwind: the message is
                    // dropped and the actor keeps running.
                    Err(e) => $crate::wire::reject(e),
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
