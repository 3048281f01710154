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
//! the cluster CA and the claimed node name equals the certificate's name;
//! frame lengths are checked before allocation; archives are validated
//! before they are read. 0-RTT is never enabled.

pub mod certs;
pub mod endpoint;
pub mod handshake;
pub mod tls;

pub use certs::{CertError, Identity};
pub use endpoint::{BindError, ConnectError, Endpoint, PeerConnection, Tuning};
pub use handshake::{IoError, StreamError};
