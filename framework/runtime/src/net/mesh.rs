//! Connections between members: the async shell of the proto [`Mesh`]
//! dial policy. It feeds the policy the member table, the ready sessions,
//! the results of its dials and a tick each heartbeat interval, and
//! performs its actions: open a cluster session (a QUIC stream handed to
//! ractor_cluster), close a member's sessions and bulk streams.
//!
//! ```text
//! table watch ─┐                           ┌─► Dial: pool ─► hello ─► client_connect_external
//! ready watch ─┼─► Mesh (proto) ─ actions ─┤
//! dial results ┤                           └─► Close: sessions.close, lane.forget
//! tick ────────┘
//! ```

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::hello::Purpose;
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::mesh::{Mesh, MeshAction};
use flotilla_transport::ConnectError;
use flotilla_transport::handshake::{self, StreamError};
use ractor::ActorRef;
use ractor_cluster::NodeServerMessage;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::{now, sleep_until};
use crate::identity::Identity;
use crate::net::backlog::Backlog;
use crate::net::bulk::Lane;
use crate::net::pool::Pool;
use crate::net::sessions::{Sessions, Stream};
use crate::table::Table;
use crate::tasks::Tasks;

/// Why a cluster session could not be opened.
#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("member address {0:?} is not a socket address")]
    Address(String),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("ractor_cluster refused the stream: {0}")]
    Session(#[from] ractor_cluster::ClientConnectErr),
}

/// What the mesh shell needs.
pub(crate) struct MeshShell {
    pub(crate) identity: Arc<Identity>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) sessions: Sessions,
    pub(crate) node_server: ActorRef<NodeServerMessage>,
    pub(crate) lane: Arc<Lane>,
    pub(crate) backlog: Arc<Backlog>,
    pub(crate) tasks: Tasks,
    pub(crate) view: watch::Receiver<Table>,
    pub(crate) tick: Duration,
}

enum Done {
    Dialled(
        MemberName,
        Incarnation,
        Result<quinn::Connection, DialError>,
    ),
    Closed(MemberName, Incarnation),
}

impl MeshShell {
    /// Keeps the sessions the policy wants until `stop`.
    pub(crate) async fn run(mut self, mut mesh: Mesh, stop: CancellationToken) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let mut ready = self.sessions.watch_ready();
        let mut ready_now: BTreeSet<String> = BTreeSet::new();
        let mut tick = tokio::time::interval(self.tick);
        mesh.handle_members(now(), &self.view.borrow_and_update().members);
        loop {
            while let Some(action) = mesh.poll_action() {
                match action {
                    MeshAction::Dial {
                        peer,
                        addr,
                        incarnation,
                    } => {
                        let (shell, tx) = (self.dialer(), done_tx.clone());
                        self.tasks.spawn(async move {
                            let result = shell.open_session(&peer, &addr).await;
                            let _ = tx.send(Done::Dialled(peer, incarnation, result));
                        });
                    }
                    MeshAction::Close { peer } => {
                        self.lane.forget(&peer);
                        if self.sessions.close(&peer) > 0 {
                            tracing::info!(%peer, "closed the cluster session of a member that is not up");
                        }
                    }
                }
            }
            let timeout = mesh.poll_timeout();
            tokio::select! {
                changed = self.view.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let members = self.view.borrow_and_update().members.clone();
                    mesh.handle_members(now(), &members);
                }
                changed = ready.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let set: BTreeSet<String> = ready.borrow_and_update().clone();
                    for peer in set.symmetric_difference(&ready_now) {
                        let name = peer.split('@').next().unwrap_or(peer).to_owned();
                        mesh.handle_ready(now(), &name, set.contains(peer));
                    }
                    ready_now = set;
                }
                _ = tick.tick() => mesh.handle_tick(now()),
                () = sleep_until(timeout) => mesh.handle_tick(now()),
                Some(done) = done_rx.recv() => match done {
                    Done::Dialled(peer, incarnation, result) => {
                        match result {
                            Ok(connection) => {
                                tracing::info!(%peer, "cluster session opened");
                                let tx = done_tx.clone();
                                let watched = peer.clone();
                                self.tasks.spawn(async move {
                                    connection.closed().await;
                                    let _ = tx.send(Done::Closed(watched, incarnation));
                                });
                                mesh.handle_dialled(now(), &peer, incarnation, true);
                                // It may have become ready before the result came.
                                mesh.handle_ready(now(), &peer, self.sessions.is_ready(&peer));
                            }
                            Err(e) => {
                                tracing::warn!(%peer, error = %e, "cannot open cluster session; will retry");
                                mesh.handle_dialled(now(), &peer, incarnation, false);
                            }
                        }
                    }
                    Done::Closed(peer, incarnation) => mesh.handle_closed(now(), &peer, incarnation),
                },
                () = stop.cancelled() => return,
            }
        }
    }

    fn dialer(&self) -> Dialer {
        Dialer {
            identity: Arc::clone(&self.identity),
            pool: Arc::clone(&self.pool),
            sessions: self.sessions.clone(),
            node_server: self.node_server.clone(),
            backlog: Arc::clone(&self.backlog),
        }
    }
}

/// What one dial needs.
struct Dialer {
    identity: Arc<Identity>,
    pool: Arc<Pool>,
    sessions: Sessions,
    node_server: ActorRef<NodeServerMessage>,
    backlog: Arc<Backlog>,
}

impl Dialer {
    /// Opens a cluster stream to `peer` at `addr` and hands it to
    /// ractor_cluster; returns the connection it went on.
    async fn open_session(&self, peer: &str, addr: &str) -> Result<quinn::Connection, DialError> {
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| DialError::Address(addr.to_owned()))?;
        // A session still held with this peer is stale (it is why we dial).
        self.sessions.close(peer);
        let pc = self.pool.connect(peer, addr).await?;
        let hello = self.identity.hello(Purpose::Cluster);
        let (send, recv, answered_as, _) = handshake::dial(&pc.connection, &hello).await?;
        // Another process of the same certificate at that address is not
        // the member dialled.
        if answered_as != peer {
            return Err(DialError::Stream(handshake::StreamError::Refused(
                flotilla_proto::hello::Refusal::IdentityMismatch,
            )));
        }
        let stream = self.sessions.stream(
            Stream {
                send,
                recv,
                member: MemberName::from(peer),
                principal: pc.peer.clone(),
            },
            Arc::clone(&self.backlog),
        );
        ractor_cluster::client_connect_external(&self.node_server, Box::new(stream)).await?;
        Ok(pc.connection)
    }
}
