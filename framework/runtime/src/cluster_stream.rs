//! A QUIC stream handed to ractor_cluster as its external transport, and
//! the guard that binds ractor's self-asserted node name to the peer's
//! certificate.

use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream, NodeEventSubscription};
use tokio::sync::watch;

/// The name ractor_cluster gives a node: `NAME@NAME` (the hostname part is
/// the node name too, so names are unique per node).
pub(crate) fn ractor_name(node: &str) -> String {
    format!("{node}@{node}")
}

/// One bidirectional QUIC stream of a peer connection.
pub(crate) struct QuicClusterStream {
    pub(crate) send: quinn::SendStream,
    pub(crate) recv: quinn::RecvStream,
    /// The peer's certificate name.
    pub(crate) peer: String,
}

impl ClusterBidiStream for QuicClusterStream {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        (
            Box::new(self.recv),
            Box::new(crate::outbound::CountingWrite { inner: self.send }),
        )
    }

    /// The ractor name the peer's certificate entitles it to; the guard
    /// compares it with the name the peer claims.
    fn peer_label(&self) -> Option<String> {
        Some(ractor_name(&self.peer))
    }
}

/// The ractor sessions of this node: peer node names by session id (once
/// ready), and every open session by the peer its certificate names.
#[derive(Default)]
pub(crate) struct Sessions {
    /// Peer node name by ractor's local node id, for ready sessions.
    pub(crate) peers: std::collections::HashMap<u64, String>,
    /// Open sessions by peer label (`NAME@NAME`): `(node id, session actor)`.
    pub(crate) open: std::collections::HashMap<String, Vec<(u64, ractor::ActorCell)>>,
}

/// Shared [`Sessions`].
pub(crate) type SessionPeers = std::sync::Arc<std::sync::Mutex<Sessions>>;

/// Stops every ractor session with `node`: a new cluster stream from it
/// supersedes them, or it is no longer a member. ractor_cluster's own
/// election between two sessions with one peer can keep the older one,
/// whose process may be dead; this keeps the newest.
pub(crate) fn close_sessions_of(peers: &SessionPeers, node: &str) -> usize {
    let cells = peers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .open
        .remove(&ractor_name(node))
        .unwrap_or_default();
    for (_, cell) in &cells {
        cell.kill();
    }
    cells.len()
}

/// Kills any ractor session whose claimed node name differs from the name
/// its certificate proves, publishes the set of ready peers, and records
/// which node each session id belongs to.
pub(crate) struct SessionGuard {
    pub(crate) ready: watch::Sender<std::collections::BTreeSet<String>>,
    pub(crate) peers: SessionPeers,
}

/// `NAME` from ractor's `NAME@NAME`.
fn node_of(ractor_name: &str) -> String {
    ractor_name
        .split('@')
        .next()
        .unwrap_or(ractor_name)
        .to_owned()
}

impl NodeEventSubscription for SessionGuard {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .entry(ses.peer_addr.clone())
            .or_default()
            .push((ses.node_id, ses.actor.get_cell()));
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        {
            let mut sessions = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            sessions.peers.remove(&ses.node_id);
            if let Some(list) = sessions.open.get_mut(&ses.peer_addr) {
                list.retain(|(id, _)| *id != ses.node_id);
                if list.is_empty() {
                    sessions.open.remove(&ses.peer_addr);
                }
            }
        }
        if let Some(name) = ses.peer_name.as_ref().map(|n| n.name.clone()) {
            self.ready.send_modify(|set| {
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
            self.peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .peers
                .insert(ses.node_id, node_of(&name));
            self.ready.send_modify(|set| {
                set.insert(name);
            });
        }
    }
}
