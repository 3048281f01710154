//! Flotilla's network transport: the only crate that owns sockets.
//!
//! ```text
//! Endpoint (a node's UDP socket, quinn)
//!   └─ PeerConnection (one per pair of nodes, mutual TLS 1.3 from the cluster CA)
//!        ├─ stream: Hello(Cluster)  → handed to ractor_cluster as its transport
//!        └─ stream: Hello(Control)  → framed rkyv requests (join, heartbeats, status)
//! Endpoint::bind_on (the node's bulk lane: a second socket, its own threads)
//!   └─ PeerConnection
//!        └─ stream: Hello(Bulk)     → large messages
//! ```
//!
//! Guarantees: no stream carries traffic before both certificates chain to
//! the cluster CA, are within their validity, and the claimed member name
//! is one the certificate (its name and role) may speak as; handshakes run
//! side by side, bounded per source and in all, each within a deadline;
//! frame lengths are checked before allocation; archives are validated
//! before they are read. 0-RTT is never enabled.

#![warn(clippy::too_many_lines)]

pub mod certs;
pub mod closing;
pub mod endpoint;
pub mod handshake;
pub mod tls;

pub use certs::{CertError, CertInfo, Identity};
pub use closing::Closing;
pub use endpoint::{
    BindError, ConnectError, Endpoint, Handshake, HandshakeRefused, PeerConnection, Tuning,
};
pub use handshake::{IoError, StreamError};
