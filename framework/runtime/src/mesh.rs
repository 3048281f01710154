//! Connections between members: one QUIC connection per pair of nodes,
//! every stream on it introduced by a hello; cluster streams handed to
//! ractor_cluster.
//!
//! Dial rule: of two members, the one with the smaller name opens the
//! cluster stream, so each pair has exactly one ractor session. Every node
//! re-evaluates the rule whenever the member table changes and once per
//! heartbeat interval, so a lost session is re-established.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use flotilla_proto::hello::Purpose;
use flotilla_proto::membership::MemberState;
use flotilla_transport::handshake;
use flotilla_transport::{ConnectError, PeerConnection};
use tokio::sync::Mutex;

use crate::cluster_stream::QuicClusterStream;
use crate::node::Shared;
use crate::table::Table;

/// Live connections by peer name.
#[derive(Default)]
pub(crate) struct Pool {
    connections: Mutex<HashMap<String, quinn::Connection>>,
}

impl Pool {
    /// Records a connection (dialled or accepted) as the one to `peer`.
    pub(crate) async fn insert(&self, peer: &str, connection: quinn::Connection) {
        self.connections
            .lock()
            .await
            .insert(peer.to_owned(), connection);
    }

    /// The live connection to `peer`, dialling `addr` if there is none.
    pub(crate) async fn connect(
        &self,
        shared: &Arc<Shared>,
        peer: Option<&str>,
        addr: SocketAddr,
    ) -> Result<PeerConnection, ConnectError> {
        if let Some(name) = peer {
            let map = self.connections.lock().await;
            if let Some(c) = map.get(name)
                && c.close_reason().is_none()
            {
                return Ok(PeerConnection {
                    connection: c.clone(),
                    peer: name.to_owned(),
                });
            }
        }
        let pc = shared.endpoint.connect(addr, peer).await?;
        self.insert(&pc.peer, pc.connection.clone()).await;
        crate::node::serve_connection(Arc::clone(shared), pc.clone());
        Ok(pc)
    }
}

/// Opens a cluster stream to `name` at `addr` and hands it to ractor_cluster.
async fn open_session(
    shared: Arc<Shared>,
    name: String,
    addr: SocketAddr,
) -> Result<quinn::Connection, String> {
    // A session we still hold with this peer is stale (it is why we dial).
    shared.close_sessions_of(&name);
    let pc = shared
        .pool
        .connect(&shared, Some(&name), addr)
        .await
        .map_err(|e| e.to_string())?;
    let hello = shared.hello(Purpose::Cluster);
    let (send, recv, _, _) = handshake::dial(&pc.connection, &hello)
        .await
        .map_err(|e| e.to_string())?;
    let stream = QuicClusterStream {
        send,
        recv,
        peer: pc.peer.clone(),
    };
    ractor_cluster::client_connect_external(&shared.node_server, Box::new(stream))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(pc.connection)
}

/// A cluster session this node dialled.
struct Dialled {
    incarnation: u64,
    connection: quinn::Connection,
    opened: std::time::Instant,
    was_ready: bool,
}

/// How long a dialled session may take to become ready.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl Dialled {
    /// Whether to keep the session given whether it is ready now: once
    /// ready it must stay so; before, it has [`READY_WITHIN`].
    fn still_wanted(&mut self, ready_now: bool) -> bool {
        if ready_now {
            self.was_ready = true;
            return true;
        }
        !self.was_ready && self.opened.elapsed() < READY_WITHIN
    }
}

/// Keeps a ractor session to every member up that this node must dial.
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut view = shared.view.subscribe();
    let mut shutdown = shared.shutdown.subscribe();
    // peer -> the session we dialled
    let mut sessions: HashMap<String, Dialled> = HashMap::new();
    let mut ready = shared.ready_sessions();
    let mut ready_alive = true;
    let (done_tx, mut done_rx) =
        tokio::sync::mpsc::unbounded_channel::<(String, u64, Result<quinn::Connection, String>)>();
    let mut pending: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(shared.detector.heartbeat_interval);
    loop {
        let table: Table = view.borrow_and_update().clone();
        for m in table.up() {
            if m.name == shared.name || shared.name.as_str() > m.name.as_str() {
                continue;
            }
            let live = sessions.get_mut(&m.name).is_some_and(|d| {
                d.incarnation == m.incarnation
                    && d.connection.close_reason().is_none()
                    && d.still_wanted(shared.session_ready(&m.name))
            });
            if live || pending.get(&m.name) == Some(&m.incarnation) {
                continue;
            }
            let Ok(addr) = m.addr.parse::<SocketAddr>() else {
                tracing::warn!(peer = %m.name, addr = %m.addr, "member address is not a socket address");
                continue;
            };
            pending.insert(m.name.clone(), m.incarnation);
            let (shared2, name, inc, tx) = (
                Arc::clone(&shared),
                m.name.clone(),
                m.incarnation,
                done_tx.clone(),
            );
            tokio::spawn(async move {
                let result = open_session(shared2, name.clone(), addr).await;
                let _ = tx.send((name, inc, result));
            });
        }
        sessions.retain(|name, d| {
            table
                .get(name)
                .is_some_and(|m| m.incarnation == d.incarnation && m.state == MemberState::Up)
        });
        // Sessions with members that are down or gone end now, so calls to
        // their actors fail instead of waiting for the transport to time out.
        // Every pass, not only on the change: cheap, and a session that
        // reappears with such a member is closed on the next pass too.
        for m in &table.members {
            if m.state == MemberState::Up || m.name == shared.name {
                continue;
            }
            shared.lane.forget(&m.name);
            if shared.close_sessions_of(&m.name) > 0 {
                tracing::info!(peer = %m.name, state = ?m.state, "closed the cluster session of a member that is not up");
            }
        }
        tokio::select! {
            _ = view.changed() => {}
            r = ready.changed(), if ready_alive => ready_alive = r.is_ok(),
            _ = tick.tick() => {}
            Some((name, inc, result)) = done_rx.recv() => {
                pending.remove(&name);
                match result {
                    Ok(connection) => {
                        tracing::info!(peer = %name, "cluster session opened");
                        sessions.insert(name, Dialled {
                            incarnation: inc,
                            connection,
                            opened: std::time::Instant::now(),
                            was_ready: false,
                        });
                    }
                    Err(e) => tracing::warn!(peer = %name, error = %e, "cannot open cluster session; will retry"),
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}
