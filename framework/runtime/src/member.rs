//! A member's link to the head: the async shell of the proto
//! [`MemberLink`]. It opens the control stream, sends what the machine
//! asks, feeds it the head's replies and the time, applies the tables the
//! head pushes to the node's view, and gives the node a new incarnation
//! when the head asks it to rejoin.
//!
//! ```text
//! MemberLink ── Connect ──► open a control stream (pool, hello)
//!     ▲  ── transmit ─────► send_msg
//!     └─ replies, time ◄── Frames<ControlReply> / sleep_until(poll_timeout)
//!        events ─────────► view (Table::apply), Identity::reincarnate
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::control::{ControlReply, ControlRequest};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::hello::{Purpose, Refusal};
use flotilla_proto::member::{MemberConfig, MemberEvent, MemberLink};
use flotilla_proto::membership::NameHolder;
use flotilla_transport::ConnectError;
use flotilla_transport::handshake::{self, Frames, StreamError, send_msg};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::now;
use crate::identity::Identity;
use crate::pool::Pool;
use crate::reservations::Reservations;
use crate::spawner::Hosted;
use crate::table::Table;

/// Why joining the cluster failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The head refused this node.
    #[error("NODE-JOIN-002: the head refused this node: {0}")]
    Refused(Refusal),
    /// Another live process is a member under this node's name.
    #[error("{0}")]
    NameTaken(NameHolder),
    /// The head did not answer in time.
    #[error("NODE-JOIN-001: no answer from the head at {head} within {after:?}")]
    Timeout {
        /// The head's address.
        head: SocketAddr,
        /// How long the join waited.
        after: Duration,
    },
    /// The head could not be reached.
    #[error("NODE-JOIN-001: cannot reach the head at {head}: {source}")]
    Connect {
        /// The head's address.
        head: SocketAddr,
        /// Why.
        source: ConnectError,
    },
    /// The control stream to the head failed.
    #[error("NODE-JOIN-001: the control stream to the head at {head} failed: {source}")]
    Stream {
        /// The head's address.
        head: SocketAddr,
        /// Why.
        source: StreamError,
    },
}

/// An open control stream to the head.
struct Stream {
    send: quinn::SendStream,
    replies: Frames<ControlReply>,
}

/// The member's side, with the handles it needs.
pub(crate) struct Member {
    pub(crate) identity: Arc<Identity>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) head: SocketAddr,
    /// The head's name, when configured: its certificate must be issued
    /// for it.
    pub(crate) head_name: Option<String>,
    pub(crate) view: watch::Sender<Table>,
    pub(crate) hosted: Hosted,
    pub(crate) link: MemberLink,
    /// This node's reservations, reported on every join.
    pub(crate) ledger: Reservations,
    /// Ticked by every pass of the heartbeat loop.
    pub(crate) pulse: watch::Sender<u64>,
    stream: Option<Stream>,
    /// Why the last connect failed, for a join that gives up.
    last_error: Option<JoinError>,
    /// Whether the machine has been told to leave.
    leaving: bool,
}

/// What woke a step.
enum Input {
    Reply(Option<Result<ControlReply, StreamError>>),
    Time,
    Shutdown,
}

/// What one step of the link came to.
enum Step {
    /// Keep going.
    Go,
    /// The first table arrived.
    Joined,
    /// The head refused.
    Refused(Refusal),
    /// Another live process has the name.
    NameTaken(NameHolder),
    /// The leave is done.
    Left,
}

impl Member {
    /// A member of the head at `head`, not yet joined.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        identity: Arc<Identity>,
        pool: Arc<Pool>,
        head: SocketAddr,
        head_name: Option<String>,
        view: watch::Sender<Table>,
        hosted: Hosted,
        ledger: Reservations,
        config: MemberConfig,
    ) -> Self {
        let link = MemberLink::new(now(), config, identity.join_request());
        Self {
            identity,
            pool,
            head,
            head_name,
            view,
            hosted,
            link,
            ledger,
            pulse: watch::channel(0).0,
            stream: None,
            last_error: None,
            leaving: false,
        }
    }

    /// Joins: runs the link until the first table arrives, at most
    /// `timeout`.
    pub(crate) async fn join(&mut self, timeout: Duration) -> Result<(), JoinError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.step(None, deadline).await {
                Step::Joined => return Ok(()),
                Step::Refused(r) => return Err(JoinError::Refused(r)),
                Step::NameTaken(holder) => return Err(JoinError::NameTaken(holder)),
                Step::Left => unreachable!("no shutdown while joining"),
                Step::Go if tokio::time::Instant::now() >= deadline => {
                    return Err(self.last_error.take().unwrap_or(JoinError::Timeout {
                        head: self.head,
                        after: timeout,
                    }));
                }
                Step::Go => {}
            }
        }
    }

    /// Heartbeats, applies tables and rejoins until `shutdown`, then leaves
    /// cleanly (waiting for the head's acknowledgement within the leave
    /// grace).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        loop {
            match self.step(Some(&shutdown), far).await {
                Step::Left => return,
                Step::Refused(r) => {
                    tracing::error!(refusal = %r, "the head refused this node's rejoin; it is no longer a member");
                    return;
                }
                Step::NameTaken(holder) => {
                    tracing::error!(%holder, "the head refused this node's rejoin; it is no longer a member");
                    return;
                }
                Step::Go | Step::Joined => {}
            }
        }
    }

    /// Performs what the machine asks, then waits for one input.
    async fn step(
        &mut self,
        shutdown: Option<&CancellationToken>,
        until: tokio::time::Instant,
    ) -> Step {
        let mut result = Step::Go;
        loop {
            let mut idle = true;
            while let Some(event) = self.link.poll_event() {
                idle = false;
                match event {
                    MemberEvent::Connect => self.connect(shutdown, until).await,
                    MemberEvent::Table(update) => {
                        self.view.send_modify(|t| t.apply(update));
                        result = Step::Joined;
                    }
                    MemberEvent::Reincarnate => {
                        let incarnation = self.identity.reincarnate();
                        self.link.set_incarnation(incarnation);
                        tracing::warn!(
                            incarnation,
                            "NODE-JOIN-006: the head marked this node down; rejoining with a new incarnation"
                        );
                    }
                    MemberEvent::Refused(r) => return Step::Refused(r),
                    MemberEvent::NameTaken(holder) => return Step::NameTaken(holder),
                    MemberEvent::Left => return Step::Left,
                }
            }
            while let Some(request) = self.link.poll_transmit() {
                idle = false;
                self.send(request).await;
            }
            if idle {
                break;
            }
        }
        if !matches!(result, Step::Go) {
            return result;
        }
        let wake = self
            .link
            .poll_timeout()
            .map_or(until, tokio::time::Instant::from_std)
            .min(until);
        let stopping = shutdown.is_none() || self.leaving;
        let replies = async {
            match self.stream.as_mut() {
                Some(s) => s.replies.next().await,
                None => std::future::pending().await,
            }
        };
        let cancelled = async {
            match shutdown {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let input = tokio::select! {
            reply = replies => Input::Reply(reply),
            () = tokio::time::sleep_until(wake) => Input::Time,
            () = cancelled, if !stopping => Input::Shutdown,
        };
        match input {
            Input::Reply(Some(Ok(reply))) => self.link.handle_reply(now(), reply),
            Input::Reply(Some(Err(e))) => self.lost(&e.to_string()),
            Input::Reply(None) => self.lost("the head closed the control stream"),
            Input::Time => {
                // Fault injection: `node::heartbeat=pause` wedges this loop.
                fail::fail_point!("node::heartbeat");
                self.pulse.send_modify(|n| *n = n.wrapping_add(1));
                self.link.set_actors(self.hosted.count());
                self.link.handle_timeout(now());
            }
            Input::Shutdown => {
                self.leaving = true;
                self.link.handle_shutdown(now());
            }
        }
        Step::Go
    }

    fn lost(&mut self, why: &str) {
        tracing::warn!(error = why, "link to the head lost");
        self.stream = None;
        self.link.handle_link_lost(now());
    }

    async fn send(&mut self, request: ControlRequest) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        if let Err(e) = send_msg(&mut stream.send, &request, DEFAULT_MAX_FRAME).await {
            self.lost(&e.to_string());
        }
    }

    /// Opens a control stream, giving up at `until` or when `shutdown`
    /// fires (a dial to an address nobody answers waits for QUIC's idle
    /// timeout otherwise).
    async fn connect(&mut self, shutdown: Option<&CancellationToken>, until: tokio::time::Instant) {
        self.stream = None;
        let (pool, identity) = (Arc::clone(&self.pool), Arc::clone(&self.identity));
        let head_name = self.head_name.clone();
        let cancelled = async {
            match shutdown {
                Some(token) if !self.leaving => token.cancelled().await,
                _ => std::future::pending().await,
            }
        };
        let opened = tokio::select! {
            opened = tokio::time::timeout_at(until, open(pool, identity, self.head, head_name)) => opened.ok(),
            () = cancelled => None,
        };
        let Some(opened) = opened else {
            // Out of time, or stopping: the step that follows says which.
            self.link.handle_link_lost(now());
            return;
        };
        match opened {
            Ok(stream) => {
                self.stream = Some(stream);
                self.last_error = None;
                self.link.set_held(self.ledger.rejoin());
                self.link.handle_connected(now());
            }
            Err(JoinError::Refused(refusal)) => {
                tracing::warn!(%refusal, "the head refused this node's control stream");
                self.last_error = Some(JoinError::Refused(refusal));
                self.link.handle_refused(now(), refusal);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the head; retrying");
                self.last_error = Some(e);
                self.link.handle_link_lost(now());
            }
        }
    }
}

/// Opens a control stream to the head at `head`, whose certificate must
/// carry the head role (and be issued for `head_name`, when given).
async fn open(
    pool: Arc<Pool>,
    identity: Arc<Identity>,
    head: SocketAddr,
    head_name: Option<String>,
) -> Result<Stream, JoinError> {
    {
        let pc = pool
            .connect_head(head_name.as_deref(), head)
            .await
            .map_err(|source| JoinError::Connect { head, source })?;
        let hello = identity.hello(Purpose::Control);
        let (send, recv, head_name, _) =
            handshake::dial(&pc.connection, &hello)
                .await
                .map_err(|source| match source {
                    StreamError::Refused(r) => JoinError::Refused(r),
                    source => JoinError::Stream { head, source },
                })?;
        tracing::debug!(%head_name, "control stream to the head open");
        Ok(Stream {
            send,
            replies: Frames::new(recv, DEFAULT_MAX_FRAME),
        })
    }
}
