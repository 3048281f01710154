//! Flotilla: typed ractor actors on a cluster of nodes that talk over QUIC.
//!
//! ```text
//!            ┌──────────── head ─────────────┐
//!            │ Membership (failure detector) │◄── control streams: join,
//!            └──────────────┬────────────────┘    heartbeats, status
//!                 member table pushed to all
//!   node n1 ◄════ QUIC (mutual TLS) ════► node n2     one connection per pair
//!     │  ractor_cluster session on one stream        (smaller name dials)
//!     └─ spawner: spawns registered kinds by name; actors found by name
//! ```
//!
//! The paved path: build a [`Node`] from a [`NodeConfig`], register actor
//! kinds, start it, spawn a named actor on a chosen node with
//! [`Node::spawn_on`], find it anywhere with [`Node::lookup`], and `cast` /
//! `call` it as any ractor actor. Message types derive
//! `ractor_cluster::RactorClusterMessage`; their payloads are rkyv types made
//! remote-capable with [`remote_type!`]. Batch work over many actors goes
//! through [`pipeline::Pipeline`]: bounded in flight, least-loaded routing,
//! deadlines and retries, lost nodes re-dispatched.
//!
//! Guarantees are stated in `docs/runtime-semantics.md`: per-sender FIFO
//! delivery to a remote actor while its session lives, at-most-once
//! delivery, membership `up → down | left` per incarnation.

pub mod bulk;
mod cluster_stream;
pub mod config;
pub mod control;
mod mesh;
pub mod node;
pub mod outbound;
pub mod pipeline;
pub mod probe;
pub mod process;
pub mod spawner;
pub mod table;
pub mod wire;

pub use config::NodeConfig;
pub use control::query_status;
pub use flotilla_proto::membership::{MemberState, MemberView};
pub use flotilla_proto::resources::Resources;
pub use node::{Node, NodeBuilder, SpawnError, StartError};
pub use table::Table;

/// The ractor crate, as used by this runtime.
pub use ractor;
/// The ractor_cluster crate, for `RactorClusterMessage`.
pub use ractor_cluster;
/// The rkyv crate, for message payload derives.
pub use rkyv;
