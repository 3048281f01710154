//! # Room `remote/`: actors across nodes
//!
//! Owns the wire form of remote messages ([`wire`], [`remote_type!`]),
//! calls that always carry a timeout ([`call`]), actor kinds with their
//! types ([`kind`]) and the spawner that starts registered kinds by name
//! for other nodes ([`spawner`]). Drives
//! [`flotilla_proto::wire`] and [`flotilla_proto::role`] (which kinds a
//! caller may spawn).
//!
//! May import: the shared files only.

pub mod call;
pub mod kind;
pub mod spawner;
pub mod wire;
