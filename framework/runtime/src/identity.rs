//! Who this node is: its name, its current incarnation, the addresses it
//! advertises, what it offers, and the hello it opens streams with.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use flotilla_proto::hello::{Hello, Purpose};
use flotilla_proto::membership::JoinRequest;
use flotilla_proto::resources::Resources;

/// The local node's identity. Everything but the incarnation is fixed at
/// start; the incarnation grows when the head asks the node to rejoin.
#[derive(Debug)]
pub(crate) struct Identity {
    /// The node's name (its certificate's).
    pub(crate) name: String,
    incarnation: AtomicU64,
    /// The address members dial.
    pub(crate) advertise: SocketAddr,
    /// The address members dial for the bulk lane.
    pub(crate) bulk_addr: SocketAddr,
    /// What the node offers to work.
    pub(crate) resources: Resources,
}

/// A fresh incarnation: microseconds since the epoch, and always more than
/// `previous`.
pub(crate) fn fresh_incarnation(previous: u64) -> u64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    micros.max(previous + 1)
}

impl Identity {
    /// The identity of a node starting now.
    pub(crate) fn new(
        name: String,
        advertise: SocketAddr,
        bulk_addr: SocketAddr,
        resources: Resources,
    ) -> Self {
        Self {
            name,
            incarnation: AtomicU64::new(fresh_incarnation(0)),
            advertise,
            bulk_addr,
            resources,
        }
    }

    /// The current incarnation.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// Moves to a new, larger incarnation and returns it.
    pub(crate) fn reincarnate(&self) -> u64 {
        let next = fresh_incarnation(self.incarnation());
        self.incarnation.store(next, Ordering::SeqCst);
        next
    }

    /// This node's hello for a stream of `purpose`.
    pub(crate) fn hello(&self, purpose: Purpose) -> Hello {
        Hello::new(purpose, self.name.clone(), self.incarnation())
    }

    /// The join request of the current incarnation.
    pub(crate) fn join_request(&self) -> JoinRequest {
        JoinRequest {
            name: self.name.clone(),
            addr: self.advertise.to_string(),
            bulk_addr: self.bulk_addr.to_string(),
            incarnation: self.incarnation(),
            resources: self.resources.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_incarnation_is_always_larger() {
        let id = Identity::new(
            "n1".into(),
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            Resources::default(),
        );
        let first = id.incarnation();
        assert!(fresh_incarnation(u64::MAX - 1) == u64::MAX);
        assert!(id.reincarnate() > first);
        assert_eq!(id.join_request().incarnation, id.incarnation());
        assert_eq!(id.hello(Purpose::Cluster).incarnation, id.incarnation());
    }
}
