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

#![warn(clippy::too_many_lines)]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

// The rooms, each a folder whose mod.rs opens with its map
// (docs/architecture.md has one row per folder).
mod control;
mod head;
pub mod jobs;
pub mod member;
pub mod net;
pub mod node;
pub mod objects;
pub mod pipeline;
pub mod placement;
pub mod remote;
pub mod supervisor;

// The shared files, which every room may import and which import no room.
pub mod board;
mod caller;
mod clock;
mod counters;
mod identity;
mod jobs_slot;
mod nonce;
pub mod table;
mod tasks;

// The module paths of the flat layout, kept so that users' imports keep
// working.
pub use control::{client, render, status};
pub use head::{head_lease, head_replica, head_store};
pub use net::{bulk, outbound, quota};
pub use node::{builder, config, config_args, drain, failpoints, host, placement_groups, process};
pub use objects::{object_url, releases};
pub use placement::gpus;
pub use remote::{call, spawner, wire};
pub use supervisor::checkpoint;

pub use control::client::ControlClient;
pub use control::status::{
    query, query_drain, query_gpus, query_jobs, query_objects, query_placement, query_status,
    query_supervisors,
};
pub use flotilla_proto::control::SpawnOrder;
pub use flotilla_proto::ids::MemberName;
pub use flotilla_proto::incarnation::{Incarnation, MemberRef};
pub use flotilla_proto::membership::{DrainOutcome, MemberState, MemberView};
pub use flotilla_proto::resources::Resources;
pub use identity::RecordError;
pub use net::outbound::Outbound;
pub use node::builder::{NodeBuilder, NodeHandle, StartError};
pub use node::config::NodeConfig;
pub use node::{LookupError, Node, SpawnError, StopError, StopUnavailable};
pub use objects::{ArchivedObject, Object, ObjectBytes, ObjectRef, Objects, ObjectsError};
pub use remote::kind::{ActorKind, Named};
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
