//! The router: every connection of the node's main endpoint (accepted, or
//! dialled by the pool) comes here on a channel, and every stream the peer
//! opens on it passes the [`gate`] and is routed by its hello: cluster
//! streams to ractor_cluster, control streams to the control service, each
//! with the identity the hello proved (one member per connection). A peer
//! whose hello or frames are malformed has its connection closed, and so
//! does one whose certificate is revoked; the node keeps serving others.
//!
//! ```text
//! pool / accept loop ─► channel ─► Router ─► per connection: accept_bi + hello (gate)
//!                                              ├─ Cluster ─► close stale sessions ─► NodeServer
//!                                              └─ Control ─► ControlService::serve(caller)
//!                                   certificate revoked (table) ─► connection closed
//!                    the incarnation it speaks for not up (table) ─► connection closed
//! ```

use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::hello::Purpose;
use flotilla_proto::incarnation::MemberRef;
use flotilla_transport::{PeerConnection, handshake};
use ractor::ActorRef;
use ractor_cluster::NodeServerMessage;
use tokio::sync::{mpsc, watch};

use crate::caller::Caller;
use crate::control::ControlService;
use crate::identity::Identity;
use crate::net::backlog::Backlog;
use crate::net::gate;
use crate::net::pool::Pool;
use crate::net::sessions::{Sessions, Stream};
use crate::table::Table;
use crate::tasks::Tasks;

/// How long a connection may stay open without its first stream.
const FIRST_STREAM: Duration = Duration::from_secs(10);

/// What routing needs.
pub(crate) struct Router {
    pub(crate) identity: Arc<Identity>,
    pub(crate) view: watch::Receiver<Table>,
    pub(crate) node_server: ActorRef<NodeServerMessage>,
    pub(crate) sessions: Sessions,
    pub(crate) backlog: Arc<Backlog>,
    pub(crate) control: ControlService,
    pub(crate) pool: Arc<Pool>,
    pub(crate) tasks: Tasks,
}

impl Router {
    /// Serves every connection that arrives on `connections` (with
    /// whether it was accepted rather than dialled).
    pub(crate) async fn run(
        self,
        mut connections: mpsc::UnboundedReceiver<(PeerConnection, bool)>,
    ) {
        let router = Arc::new(self);
        while let Some((pc, accepted)) = connections.recv().await {
            let r = Arc::clone(&router);
            router
                .tasks
                .spawn(async move { r.serve(pc, accepted).await });
        }
    }

    /// Serves the streams the peer opens on `pc`, until the connection
    /// ends, the peer's certificate is revoked, or the table shows the member
    /// incarnation its latest stream spoke for down, left or replaced. An accepted connection
    /// whose peer opens no stream within [`FIRST_STREAM`] is closed (one
    /// this node dialled is its own to use).
    async fn serve(self: Arc<Self>, pc: PeerConnection, accepted: bool) {
        let withdrawn = gate::withdrawn(&self.view, &pc);
        tokio::pin!(withdrawn);
        let mut bound: Option<String> = None;
        // The member incarnation the connection's latest stream spoke for.
        let mut speaks_for: Option<MemberRef> = None;
        loop {
            let first = bound.is_none();
            let fenced = gate::speaker_fenced(&self.view, &speaks_for);
            let accept = gate::accept(
                &self.identity,
                &self.view,
                &pc,
                &[Purpose::Cluster, Purpose::Control],
                &mut bound,
            );
            let accepted = tokio::select! {
                a = accept => a,
                why = &mut withdrawn => return gate::close_withdrawn(&pc, why, "main"),
                () = fenced => return gate::close_fenced(&pc, "main"),
                () = tokio::time::sleep(FIRST_STREAM), if first && accepted => {
                    flotilla_transport::Closing::NoStream.close(&pc.connection);
                    return;
                }
            };
            match accepted {
                Ok((send, recv, hello)) => {
                    if first {
                        self.pool.record(&hello.node, &pc.connection).await;
                    }
                    speaks_for = Some(MemberRef::new(hello.node.clone(), hello.incarnation));
                    match hello.purpose {
                        Purpose::Cluster => self.cluster(Stream {
                            send,
                            recv,
                            member: hello.node.clone(),
                            principal: pc.peer.clone(),
                        }),
                        Purpose::Bulk | Purpose::Pull => {
                            unreachable!("the gate refuses bulk-lane streams here")
                        }
                        Purpose::Control => {
                            let caller = Caller {
                                member: hello.node.clone(),
                                // The gate refused a certificate without one.
                                role: pc.role.unwrap_or(flotilla_proto::role::Role::Observer),
                                incarnation: hello.incarnation,
                            };
                            self.control_stream(&pc, caller, send, recv);
                        }
                    }
                }
                Err(e) if e.is_gone() => return,
                Err(e) => {
                    handshake::close_after_accept(&pc, &e).await;
                    return;
                }
            }
        }
    }

    /// Hands a cluster stream from a member to ractor_cluster.
    fn cluster(&self, stream: Stream) {
        // The peer opens a cluster stream only when it has no session with
        // us: any we still hold is stale.
        if self.sessions.close(&stream.member) > 0 {
            tracing::info!(peer = %stream.member, "replaced a stale cluster session");
        }
        let stream = self.sessions.stream(stream, Arc::clone(&self.backlog));
        let _ = self
            .node_server
            .cast(NodeServerMessage::ConnectionOpenedExternal {
                stream: Box::new(stream),
                is_server: true,
            });
    }

    /// Serves a control stream from `caller` in a task of its own.
    fn control_stream(
        &self,
        pc: &PeerConnection,
        caller: Caller,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    ) {
        let (control, conn) = (self.control.clone(), pc.connection.clone());
        self.tasks.spawn(async move {
            let peer = caller.member.clone();
            if let Err(e) = control.serve(caller, send, recv).await {
                tracing::warn!(%peer, error = %e, "control stream closed");
                if matches!(
                    e,
                    handshake::StreamError::Frame(_) | handshake::StreamError::Wire(_)
                ) {
                    e.closing().close(&conn);
                }
            }
        });
    }
}
