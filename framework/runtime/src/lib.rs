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
//! `call` it as any ractor actor, or cast with backpressure through
//! [`Node::outbound`]. Message types derive
//! `ractor_cluster::RactorClusterMessage`; their payloads are rkyv types made
//! remote-capable with [`remote_type!`]. Batch work over many actors goes
//! through [`pipeline::Pipeline`]: bounded in flight, least-loaded routing,
//! deadlines and retries, lost nodes re-dispatched. docs/architecture.md
//! shows which part owns what.
//!
//! Guarantees are stated in `docs/runtime-semantics.md`: per-sender FIFO
//! delivery to a remote actor while its session lives, at-most-once
//! delivery, membership `up → down | left` per incarnation.

mod backlog;
pub mod board;
pub mod builder;
pub mod bulk;
pub mod call;
mod caller;
pub mod checkpoint;
mod clock;
pub mod config;
pub mod config_args;
mod control;
mod counters;
pub mod failpoints;
mod gate;
pub mod gpus;
mod head;
mod head_client;
pub mod head_lease;
pub mod head_replica;
pub mod head_store;
mod heads;
pub mod host;
mod identity;
pub mod jobs;
mod jobs_slot;
pub mod member;
mod mesh;
pub mod node;
mod nonce;
pub mod object_url;
pub mod objects;
pub mod outbound;
pub mod pipeline;
pub mod placement;
pub mod placement_groups;
mod pool;
pub mod process;
mod pull_server;
pub mod quota;
pub mod releases;
mod reservations;
mod router;
mod sessions;
pub mod spawner;
pub mod status;
pub mod supervisor;
pub mod table;
mod tasks;
pub mod wire;

pub use builder::{NodeBuilder, NodeHandle, StartError};
pub use config::NodeConfig;
pub use flotilla_proto::membership::{MemberState, MemberView};
pub use flotilla_proto::resources::Resources;
pub use identity::RecordError;
pub use node::{LookupError, Node, SpawnError, StopError, StopUnavailable};
pub use objects::{ArchivedObject, Object, ObjectBytes, ObjectRef, Objects, ObjectsError};
pub use outbound::Outbound;
pub use status::{
    query, query_gpus, query_jobs, query_objects, query_placement, query_status, query_supervisors,
};
pub use supervisor::{Supervisor, SupervisorArgs, SupervisorEvent, SupervisorMsg};
pub use table::Table;

/// The fail crate, for `fail_point!` in actors (see [`failpoints`]).
pub use fail;
/// The ractor crate, as used by this runtime.
pub use ractor;
/// The ractor_cluster crate, for `RactorClusterMessage`.
pub use ractor_cluster;
/// The rkyv crate, for message payload derives.
pub use rkyv;
