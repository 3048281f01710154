//! The router: every connection of the node's main endpoint (accepted, or
//! dialled by the pool) comes here on a channel, and every stream the peer
//! opens on it passes the [`gate`] and is routed by its hello: cluster streams to ractor_cluster,
//! control streams to the control service. A peer whose hello or frames are
//! malformed has its connection closed; the node keeps serving others.
//!
//! ```text
//! pool / accept loop ─► channel ─► Router ─► per connection: accept_bi + hello
//!                                              ├─ Cluster ─► close stale sessions ─► NodeServer
//!                                              └─ Control ─► ControlService::serve
//! ```

use std::sync::Arc;

use flotilla_proto::hello::Purpose;
use flotilla_transport::{PeerConnection, handshake};
use ractor::ActorRef;
use ractor_cluster::NodeServerMessage;
use tokio::sync::{mpsc, watch};

use crate::backlog::Backlog;
use crate::control::ControlService;
use crate::gate;
use crate::identity::Identity;
use crate::sessions::{QuicClusterStream, Sessions};
use crate::table::Table;
use crate::tasks::Tasks;

/// What routing needs.
pub(crate) struct Router {
    pub(crate) identity: Arc<Identity>,
    pub(crate) view: watch::Receiver<Table>,
    pub(crate) node_server: ActorRef<NodeServerMessage>,
    pub(crate) sessions: Sessions,
    pub(crate) backlog: Arc<Backlog>,
    pub(crate) control: ControlService,
    pub(crate) tasks: Tasks,
}

impl Router {
    /// Serves every connection that arrives on `connections`.
    pub(crate) async fn run(self, mut connections: mpsc::UnboundedReceiver<PeerConnection>) {
        let router = Arc::new(self);
        while let Some(pc) = connections.recv().await {
            let r = Arc::clone(&router);
            router.tasks.spawn(async move { r.serve(pc).await });
        }
    }

    /// Serves the streams the peer opens on `pc`.
    async fn serve(self: Arc<Self>, pc: PeerConnection) {
        loop {
            let accepted = gate::accept(
                &self.identity,
                &self.view,
                &pc,
                &[Purpose::Cluster, Purpose::Control],
            )
            .await;
            match accepted {
                Ok((send, recv, hello)) => match hello.purpose {
                    Purpose::Cluster => {
                        // The peer opens a cluster stream only when it has
                        // no session with us: any we still hold is stale.
                        if self.sessions.close(&pc.peer) > 0 {
                            tracing::info!(peer = %pc.peer, "replaced a stale cluster session");
                        }
                        let stream = QuicClusterStream {
                            send,
                            recv,
                            peer: pc.peer.clone(),
                            backlog: Arc::clone(&self.backlog),
                        };
                        let _ =
                            self.node_server
                                .cast(NodeServerMessage::ConnectionOpenedExternal {
                                    stream: Box::new(stream),
                                    is_server: true,
                                });
                    }
                    Purpose::Bulk | Purpose::Pull => {
                        unreachable!("accept refuses bulk-lane streams here")
                    }
                    Purpose::Control => {
                        let (control, peer, conn) =
                            (self.control.clone(), pc.peer.clone(), pc.connection.clone());
                        self.tasks.spawn(async move {
                            if let Err(e) = control.serve(peer.clone(), send, recv).await {
                                tracing::warn!(%peer, error = %e, "control stream closed");
                                if matches!(
                                    e,
                                    handshake::StreamError::Frame(_)
                                        | handshake::StreamError::Wire(_)
                                ) {
                                    conn.close(
                                        quinn::VarInt::from_u32(e.close_code()),
                                        b"malformed control frame",
                                    );
                                }
                            }
                        });
                    }
                },
                Err(handshake::StreamError::Io(_)) => return,
                Err(e) => {
                    handshake::close_after_accept(&pc, &e).await;
                    return;
                }
            }
        }
    }
}
