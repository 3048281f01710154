//! # Room `net/`: connections between nodes
//!
//! Owns what carries bytes between members: one QUIC connection per pair
//! of nodes ([`pool`]), the gate every accepted connection passes (its
//! hello, its certificate's role, revocation: [`gate`]), the
//! ractor_cluster sessions carried on a stream ([`sessions`], whose
//! frames pass a per-certificate book: [`frame_gate`]) and the
//! mesh that keeps one per member ([`mesh`]), the bulk lane for large
//! payloads ([`bulk`], served by [`pull_server`]), bounded sends
//! ([`outbound`], queued in a [`backlog`]) and the per-certificate caps
//! on connections ([`quota`]). Drives [`flotilla_proto::hello`],
//! [`flotilla_proto::frame`], [`flotilla_proto::mesh`],
//! [`flotilla_proto::bulk`] and [`flotilla_proto::cluster_frames`].
//!
//! May import: the shared files only.

pub(crate) mod backlog;
pub mod bulk;
pub(crate) mod frame_gate;
pub(crate) mod gate;
pub(crate) mod mesh;
pub mod outbound;
pub(crate) mod pool;
pub(crate) mod pull_server;
pub mod quota;
pub(crate) mod sessions;
