//! The bulk lane: large messages for remote actors on their own QUIC
//! stream, so that they never hold up small messages and calls on the
//! ractor_cluster session.
//!
//! ```text
//! stream (Hello purpose Bulk): [BulkHeader frame][payload frame] [BulkHeader frame][payload frame] ...
//! ```

use rkyv::{Archive, Deserialize, Serialize};

/// Largest payload frame on the bulk lane: 256 MiB.
pub const MAX_BULK_PAYLOAD: u32 = 256 << 20;

/// Which actor a bulk payload is for and how to decode it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BulkHeader {
    /// The actor's pid on the receiving node.
    pub pid: u64,
    /// The message variant (ractor's serialized-message tag).
    pub variant: String,
}
