//! The ractor sessions of a node: the QUIC stream handed to ractor_cluster
//! as its external transport, and the guard that binds ractor's
//! self-asserted node name to the peer's certificate and records which
//! session belongs to which peer.
//!
//! ```text
//! QUIC stream (hello: Cluster) ─► QuicClusterStream ─► ractor_cluster NodeSession
//!                                   read half: frames admitted │ events
//!                                   by the frame gate; write   │
//!                                   half counted against the   │
//!                                   backlog                    ▼
//!                                                   SessionGuard: name check,
//!                                                   ready set, session ids
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream, NodeEventSubscription};
use tokio::sync::watch;

use crate::net::backlog::{Backlog, CountingWrite};
use crate::net::frame_gate::{FrameGate, Ticket};
use flotilla_proto::ids::MemberName;

/// The name ractor_cluster gives a node: `NAME@NAME` (the hostname part is
/// the node name too, so names are unique per node).
pub(crate) fn ractor_name(node: &str) -> String {
    format!("{node}@{node}")
}

/// `NAME` from ractor's `NAME@NAME`.
fn node_of(ractor_name: &str) -> String {
    ractor_name
        .split('@')
        .next()
        .unwrap_or(ractor_name)
        .to_owned()
}

/// One bidirectional QUIC stream of a peer connection.
pub(crate) struct QuicClusterStream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    /// The member name the stream's hello proved (checked against the
    /// peer's certificate at the gate).
    peer: MemberName,
    /// The backlog the written bytes are counted against.
    backlog: Arc<Backlog>,
    /// The session's place in the node's frame book.
    ticket: Ticket,
}

impl ClusterBidiStream for QuicClusterStream {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        (
            Box::new(self.ticket.reader(self.recv)),
            Box::new(self.ticket.writer(CountingWrite {
                inner: self.send,
                backlog: self.backlog,
            })),
        )
    }

    /// The ractor name the stream's proven member name entitles the peer
    /// to; the guard compares it with the name the peer claims.
    fn peer_label(&self) -> Option<String> {
        Some(ractor_name(&self.peer))
    }
}

#[derive(Default)]
struct Inner {
    /// Peer node name by ractor's local node id, for ready sessions.
    peers: HashMap<u64, String>,
    /// Open sessions by peer label (`NAME@NAME`): `(node id, session actor)`.
    open: HashMap<String, Vec<(u64, ractor::ActorCell)>>,
}

/// The sessions of one node: which peer each session id belongs to, which
/// are open and which ready. Cheap to clone; every clone sees the same.
#[derive(Clone)]
pub(crate) struct Sessions {
    inner: Arc<Mutex<Inner>>,
    ready: watch::Sender<BTreeSet<String>>,
    frames: FrameGate,
}

/// The stream of one cluster session, as [`Sessions::stream`] makes it.
pub(crate) struct Stream {
    /// Its sending half.
    pub(crate) send: quinn::SendStream,
    /// Its receiving half.
    pub(crate) recv: quinn::RecvStream,
    /// The member name its hello proved.
    pub(crate) member: MemberName,
    /// The name in the peer's certificate.
    pub(crate) principal: String,
}

impl Sessions {
    /// No sessions yet; ractor_cluster's frames of at most `max_frame`
    /// bytes.
    pub(crate) fn new(max_frame: u64) -> Self {
        Self {
            inner: Arc::default(),
            ready: watch::channel(BTreeSet::new()).0,
            frames: FrameGate::new(max_frame),
        }
    }

    /// The stream to hand ractor_cluster for `stream`: what it writes
    /// counted against `backlog`, what it reads admitted under the caps
    /// of the peer's certificate.
    pub(crate) fn stream(&self, stream: Stream, backlog: Arc<Backlog>) -> QuicClusterStream {
        QuicClusterStream {
            ticket: self.frames.open(&stream.principal, &stream.member),
            send: stream.send,
            recv: stream.recv,
            peer: stream.member,
            backlog,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node name behind a ractor session id.
    pub(crate) fn peer_of(&self, node_id: u64) -> Option<String> {
        self.lock().peers.get(&node_id).cloned()
    }

    /// Whether the session with `node` is ready.
    pub(crate) fn is_ready(&self, node: &str) -> bool {
        self.ready.borrow().contains(&ractor_name(node))
    }

    /// A receiver of the set of ready sessions (ractor names).
    pub(crate) fn watch_ready(&self) -> watch::Receiver<BTreeSet<String>> {
        self.ready.subscribe()
    }

    /// Stops every session with `node`: a new cluster stream from it
    /// supersedes them, or it is no longer a member. ractor_cluster's own
    /// election between two sessions with one peer can keep the older one,
    /// whose process may be dead; this keeps the newest. Returns how many
    /// there were.
    pub(crate) fn close(&self, node: &str) -> usize {
        let cells = self
            .lock()
            .open
            .remove(&ractor_name(node))
            .unwrap_or_default();
        for (_, cell) in &cells {
            cell.kill();
        }
        cells.len()
    }

    /// The actors of the peers reached through this node's ready sessions
    /// (with `node` only, when given): the references ractor_cluster made
    /// for them, children of the session actor. Only these are this
    /// node's own. ractor's process groups are shared by every node of the
    /// process, and ractor_cluster numbers the sessions of each node from
    /// zero, so a reference held by another node of the process can carry
    /// the same id as one of these.
    pub(crate) fn reached(&self, node: Option<&str>) -> Vec<ractor::ActorCell> {
        let sessions: Vec<ractor::ActorCell> = {
            let inner = self.lock();
            inner
                .open
                .values()
                .flatten()
                .filter(|(id, _)| {
                    inner
                        .peers
                        .get(id)
                        .is_some_and(|peer| node.is_none_or(|n| n == peer))
                })
                .map(|(_, cell)| cell.clone())
                .collect()
        };
        sessions
            .iter()
            .flat_map(ractor::ActorCell::get_children)
            .filter(|c| !c.get_id().is_local())
            .collect()
    }

    /// The guard to subscribe to the node server's session events.
    pub(crate) fn guard(&self) -> SessionGuard {
        SessionGuard(self.clone())
    }
}

/// Kills any ractor session whose claimed node name differs from the name
/// its certificate proves, publishes the set of ready peers, and records
/// which node each session id belongs to.
pub(crate) struct SessionGuard(Sessions);

impl NodeEventSubscription for SessionGuard {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        crate::counters::session_opened();
        self.0
            .lock()
            .open
            .entry(ses.peer_addr.clone())
            .or_default()
            .push((ses.node_id, ses.actor.get_cell()));
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        crate::counters::session_closed();
        {
            let mut inner = self.0.lock();
            inner.peers.remove(&ses.node_id);
            if let Some(list) = inner.open.get_mut(&ses.peer_addr) {
                list.retain(|(id, _)| *id != ses.node_id);
                if list.is_empty() {
                    inner.open.remove(&ses.peer_addr);
                }
            }
        }
        if let Some(name) = ses.peer_name.as_ref().map(|n| n.name.clone()) {
            self.0.ready.send_modify(|set| {
                set.remove(&name);
            });
        }
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        let claimed = ses.peer_name.as_ref().map(|n| n.name.as_str());
        if claimed != Some(ses.peer_addr.as_str()) {
            tracing::warn!(
                claimed = claimed.unwrap_or(""),
                certificate = %ses.peer_addr,
                "NODE-AUTH-002: ractor session claims a name its certificate does not carry; closed"
            );
            ses.actor.kill();
        }
    }

    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        if let Some(name) = ses.peer_name.as_ref().map(|n| n.name.clone()) {
            self.0.lock().peers.insert(ses.node_id, node_of(&name));
            self.0.ready.send_modify(|set| {
                set.insert(name);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        assert_eq!(ractor_name("n1"), "n1@n1");
        assert_eq!(node_of("n1@n1"), "n1");
        let s = Sessions::new(1 << 20);
        assert!(!s.is_ready("n1"));
        assert_eq!(s.close("n1"), 0);
        assert_eq!(s.peer_of(3), None);
    }
}
