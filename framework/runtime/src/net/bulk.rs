//! The bulk lane: large messages on an endpoint and threads of their own.
//!
//! Casts of [`crate::net::outbound::BULK_THRESHOLD`] bytes or more do not go
//! over the ractor session. Each node binds a second QUIC endpoint for
//! them (its address is `bulk_addr` in the member table) and runs that
//! endpoint — its socket, the drivers of its connections, the tasks that
//! frame and hand over received messages — on a tokio runtime of its own.
//! Encrypting, decrypting and framing bulk bytes is most of the CPU a
//! transfer costs, and a QUIC connection driver encrypts or decrypts a
//! whole batch of packets per poll; on the node's own runtime that work
//! held the worker threads that calls and heartbeats need, and shared one
//! connection's packet queue with them. Here it holds neither.
//!
//! ```text
//! sender                                          receiver
//! cast ≥ 256 KiB ─► lane stream to peer ─► bulk endpoint ─► actor mailbox
//!                   (one per peer, waits      (accept, frame, hand over:
//!                    for flow control)         bulk threads)
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flotilla_proto::hello::Purpose;
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::{Incarnation, MemberRef};
use flotilla_proto::role::principal_of;
use flotilla_transport::{BindError, ConnectError, Endpoint, PeerConnection, Tuning, handshake};
use tokio::sync::watch;

use flotilla_objects::Store;

use crate::identity::Identity;
use crate::table::Table;
use crate::tasks::Tasks;
use crate::{counters, net::gate};

/// Worker threads of the bulk runtime.
const THREADS: usize = 2;

/// An open send stream and the incarnation of the peer it was opened to.
type Open = Option<ToIncarnation<quinn::SendStream>>;

/// One send stream per peer, opened on first use.
type Streams = HashMap<MemberName, Arc<tokio::sync::Mutex<Open>>>;

/// A connection per peer for pulls, and the peer incarnation it is to.
type Connections = HashMap<MemberName, ToIncarnation<quinn::Connection>>;

/// A stream or connection to one incarnation of a peer: it leads nowhere
/// once the peer restarts under a new one.
struct ToIncarnation<T> {
    incarnation: Incarnation,
    link: T,
}

/// A node's bulk lane: its endpoint, the runtime that drives it and the
/// open send streams.
pub(crate) struct Lane {
    runtime: Option<tokio::runtime::Runtime>,
    endpoint: Endpoint,
    /// The endpoint's bound address.
    addr: SocketAddr,
    streams: Mutex<Streams>,
    /// Connections that pulls open streams on.
    pulls: Mutex<Connections>,
    /// Payload bytes sent on the lane.
    sent: AtomicU64,
}

/// Why a message did not go out on the bulk lane. Nothing is retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaneSendError {
    /// The message is over the bulk frame limit.
    #[error("message of {0} bytes exceeds the bulk limit of {max} bytes", max = flotilla_proto::bulk::MAX_BULK_PAYLOAD)]
    TooLarge(usize),
    /// The peer is not a member with a bulk lane.
    #[error("{0} is not a member with a bulk lane")]
    NoLane(String),
    /// The lane's connection to the peer could not be made.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The stream to the peer failed.
    #[error(transparent)]
    Stream(#[from] handshake::StreamError),
}

/// Why the bulk lane could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaneError {
    /// Its threads could not be started.
    #[error("NODE-BULK-001: cannot start the bulk lane's threads: {0}")]
    Threads(#[source] std::io::Error),
    /// Its endpoint could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
}

impl Lane {
    /// Starts the lane's runtime and binds its endpoint at `addr`.
    pub(crate) fn bind(
        addr: SocketAddr,
        identity: flotilla_transport::Identity,
    ) -> Result<Self, LaneError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(THREADS)
            .thread_name("flotilla-bulk")
            .enable_all()
            .build()
            .map_err(LaneError::Threads)?;
        let endpoint =
            Endpoint::bind_on(addr, identity, &Tuning::default(), runtime.handle().clone())?;
        let bound = endpoint
            .local_addr()
            .map_err(|source| BindError::Socket { addr, source })?;
        Ok(Self {
            runtime: Some(runtime),
            endpoint,
            addr: bound,
            streams: Mutex::new(HashMap::new()),
            pulls: Mutex::new(HashMap::new()),
            sent: AtomicU64::new(0),
        })
    }

    /// The lane's bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Payload bytes this node has sent on the bulk lane.
    pub(crate) fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Accepts bulk connections from members until the lane closes, on the
    /// lane's own threads.
    pub(crate) fn serve(
        self: &Arc<Self>,
        tasks: &Tasks,
        identity: Arc<Identity>,
        view: watch::Receiver<Table>,
        store: Store,
    ) {
        let Some(runtime) = self.runtime.as_ref() else {
            return;
        };
        let lane = Arc::clone(self);
        let conns = tasks.clone();
        let quota = crate::net::quota::Quota::new(crate::net::quota::MAX_CONNECTIONS_PER_PRINCIPAL);
        tasks.spawn_on(runtime.handle(), async move {
            while let Some(incoming) = lane.endpoint.accept_incoming().await {
                let handshake = match incoming {
                    Ok(h) => h,
                    Err(refused) => {
                        counters::tls_refused(refused.reason);
                        tracing::warn!(error = %refused, "bulk connection refused");
                        continue;
                    }
                };
                // Each handshake in a task of its own: a peer that stalls
                // holds only its own slot.
                let (identity, view, store, tasks, quota) = (
                    Arc::clone(&identity),
                    view.clone(),
                    store.clone(),
                    conns.clone(),
                    quota.clone(),
                );
                conns.spawn(async move {
                    match handshake.finish().await {
                        Ok(pc) => {
                            if crate::net::quota::admit(&quota, &pc, &tasks) {
                                serve_connection(identity, view, store, tasks, pc).await
                            }
                        }
                        Err(refused) => {
                            counters::tls_refused(refused.reason);
                            tracing::warn!(error = %refused, "bulk connection refused");
                        }
                    }
                });
            }
        });
    }

    /// Sends a serialized cast (`header`: the actor and the message's
    /// variant) to `peer`: waits for QUIC flow control, which bounds what
    /// is buffered. `view` tells where the peer's lane is, `identity` who
    /// this node is.
    pub(crate) async fn send(
        &self,
        identity: &Identity,
        view: &watch::Receiver<Table>,
        peer: &str,
        header: flotilla_proto::bulk::BulkHeader,
        args: &[u8],
    ) -> Result<(), LaneSendError> {
        use flotilla_proto::bulk::MAX_BULK_PAYLOAD;
        if args.len() > MAX_BULK_PAYLOAD as usize {
            return Err(LaneSendError::TooLarge(args.len()));
        }
        let stream = Arc::clone(
            self.streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(MemberName::from(peer))
                .or_default(),
        );
        let mut stream = stream.lock().await;
        let (incarnation, addr) = view
            .borrow()
            .get(peer)
            .and_then(|m| Some((m.incarnation, m.bulk_addr.parse::<SocketAddr>().ok()?)))
            .ok_or_else(|| LaneSendError::NoLane(peer.to_owned()))?;
        // A stream to an earlier start of the peer leads nowhere.
        if stream
            .as_ref()
            .is_some_and(|s| s.incarnation != incarnation)
        {
            *stream = None;
        }
        if stream.is_none() {
            let pc = self
                .endpoint
                .connect(addr, Some(principal_of(peer)))
                .await?;
            let hello = identity.hello(Purpose::Bulk);
            let (send, _recv, _, _) = handshake::dial(&pc.connection, &hello).await?;
            *stream = Some(ToIncarnation {
                incarnation,
                link: send,
            });
        }
        let send = &mut stream.as_mut().expect("opened above").link;
        let sent = async {
            handshake::send_msg(send, &header, flotilla_proto::frame::DEFAULT_MAX_FRAME).await?;
            handshake::write_all(send, &(args.len() as u32).to_be_bytes()).await?;
            handshake::write_all(send, args).await
        }
        .await;
        match sent {
            Ok(()) => {
                self.sent.fetch_add(args.len() as u64, Ordering::Relaxed);
                counters::sent_bytes("bulk", args.len() as u64);
                Ok(())
            }
            Err(e) => {
                *stream = None;
                Err(e.into())
            }
        }
    }

    /// Drops the send stream to `peer` (its connection closes with it).
    pub(crate) fn forget(&self, peer: &str) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(peer);
        self.pulls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(peer);
    }

    /// Opens a pull stream to `peer`'s lane: its hello answered, ready for
    /// a [`flotilla_proto::objects::PullRequest`]. Pulls to one peer share
    /// a connection, opened on first use and again after it fails.
    pub(crate) async fn open_pull(
        &self,
        identity: &Identity,
        view: &watch::Receiver<Table>,
        peer: &str,
    ) -> Result<(quinn::SendStream, quinn::RecvStream), LaneSendError> {
        let (incarnation, addr) = view
            .borrow()
            .get(peer)
            .filter(|m| m.state.is_live())
            .and_then(|m| Some((m.incarnation, m.bulk_addr.parse::<SocketAddr>().ok()?)))
            .ok_or_else(|| LaneSendError::NoLane(peer.to_owned()))?;
        let cached = self
            .pulls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(peer)
            .filter(|c| c.incarnation == incarnation && c.link.close_reason().is_none())
            .map(|c| c.link.clone());
        let hello = identity.hello(Purpose::Pull);
        if let Some(connection) = cached
            && let Ok((send, recv, _, _)) = handshake::dial(&connection, &hello).await
        {
            return Ok((send, recv));
        }
        let pc = self
            .endpoint
            .connect(addr, Some(principal_of(peer)))
            .await?;
        let (send, recv, _, _) = handshake::dial(&pc.connection, &hello).await?;
        self.pulls.lock().unwrap_or_else(|p| p.into_inner()).insert(
            MemberName::from(peer),
            ToIncarnation {
                incarnation,
                link: pc.connection.clone(),
            },
        );
        Ok((send, recv))
    }

    /// Closes the endpoint and every connection on it.
    pub(crate) fn close(&self) {
        self.endpoint.close();
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Serves the bulk streams a member opens on `pc`; any other stream is
/// refused, and it or a malformed frame closes the connection, and so do
/// the revocation of the peer's certificate and the end of the member
/// incarnation its streams spoke for (what it still had in flight is
/// dropped).
async fn serve_connection(
    identity: Arc<Identity>,
    view: watch::Receiver<Table>,
    store: Store,
    tasks: Tasks,
    pc: PeerConnection,
) {
    let withdrawn = gate::withdrawn(&view, &pc);
    tokio::pin!(withdrawn);
    let mut bound: Option<String> = None;
    let mut speaks_for: Option<MemberRef> = None;
    loop {
        let accept = gate::accept(
            &identity,
            &view,
            &pc,
            &[Purpose::Bulk, Purpose::Pull],
            &mut bound,
        );
        let accepted = tokio::select! {
            a = accept => a,
            () = gate::speaker_fenced(&view, &speaks_for) => return gate::close_fenced(&pc, "bulk"),
            why = &mut withdrawn => return gate::close_withdrawn(&pc, why, "bulk"),
        };
        if let Ok((_, _, hello)) = &accepted {
            speaks_for = Some(MemberRef::new(hello.node.clone(), hello.incarnation));
        }
        let (send, recv) = match accepted {
            Ok((send, recv, hello)) if hello.purpose == Purpose::Pull => {
                tasks.spawn(crate::net::pull_server::serve_pull(
                    store.clone(),
                    hello.node.clone(),
                    send,
                    recv,
                ));
                continue;
            }
            Ok((send, recv, _)) => (send, recv),
            Err(e) if e.is_gone() => return,
            Err(e) => {
                handshake::close_after_accept(&pc, &e).await;
                return;
            }
        };
        let (peer, conn) = (pc.peer.clone(), pc.connection.clone());
        // One stream per peer: serve it here; the next accept waits for
        // the stream after it.
        {
            let received = tokio::select! {
                r = receive(recv) => r,
                () = gate::speaker_fenced(&view, &speaks_for) => return gate::close_fenced(&pc, "bulk"),
                why = &mut withdrawn => return gate::close_withdrawn(&pc, why, "bulk"),
            };
            if let Err(e) = received {
                tracing::warn!(%peer, error = %e, "NODE-WIRE-003: closing connection after a malformed bulk frame");
                e.closing().close(&conn);
            }
            drop(send);
        }
    }
}

/// Delivers bulk messages to their local actors until the stream ends. A
/// message for an actor that is gone, or not remote-capable, is dropped.
async fn receive(mut recv: quinn::RecvStream) -> Result<(), handshake::StreamError> {
    use flotilla_proto::bulk::{BulkHeader, MAX_BULK_PAYLOAD};
    use flotilla_proto::frame::{DEFAULT_MAX_FRAME, FrameError, PREFIX_LEN};
    loop {
        let Some(header) = handshake::recv_frame(&mut recv, DEFAULT_MAX_FRAME).await? else {
            return Ok(());
        };
        let header = flotilla_proto::wire::decode::<BulkHeader>(&header)?;
        let args = handshake::recv_frame(&mut recv, MAX_BULK_PAYLOAD)
            .await?
            .ok_or(FrameError::Truncated {
                got: 0,
                want: PREFIX_LEN,
            })?;
        match ractor::registry::where_is_pid(ractor::ActorId::Local(header.pid)) {
            Some(cell) if cell.supports_remoting() => {
                let msg = ractor::message::SerializedMessage::Cast {
                    variant: header.variant,
                    args,
                    metadata: None,
                };
                if cell.send_serialized(msg).is_err() {
                    counters::frame_dropped("bulk", "actor_stopping");
                    tracing::debug!(
                        pid = header.pid,
                        "bulk message for a stopping actor dropped"
                    );
                }
            }
            Some(_) => {
                counters::frame_dropped("bulk", "not_remote");
                tracing::warn!(
                    pid = header.pid,
                    "bulk message for an actor that is not remotely visible dropped"
                );
            }
            None => {
                counters::frame_dropped("bulk", "no_actor");
                tracing::debug!(
                    pid = header.pid,
                    "bulk message for an unknown actor dropped"
                );
            }
        }
    }
}
