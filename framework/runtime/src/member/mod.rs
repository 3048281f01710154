//! # Room `member/`: a member's side of the head
//!
//! Owns the member link (this file), the list of head addresses a member
//! tries in turn ([`heads`]) and the calls a node makes to the head
//! ([`head_client`]). Drives [`flotilla_proto::member`] (`MemberLink`).
//!
//! May import: `net`, `remote`, `placement` (the node's reservations,
//! fenced when the head counts this incarnation gone) and the shared
//! files.
//!
//! A member's link to the head: the async shell of the proto
//! [`MemberLink`]. It opens the control stream, sends what the machine
//! asks, feeds it the head's replies and the time, applies the tables the
//! head pushes to the node's view, and gives the node a new incarnation
//! when the head asks it to rejoin.
//!
//! ```text
//! MemberLink ── Connect ──► open a control stream (pool, hello), in a task beside the loop
//!     ▲  ── transmit ─────► send_msg
//!     └─ replies, time ◄── Frames<ControlReply> / sleep_until(poll_timeout) / the dial's result
//!        events ─────────► view (Table::apply), fence + Identity::reincarnate
//! ```
//!
//! The loop never waits on a dial: a head that does not answer costs a
//! dial task its QUIC idle timeout, while the loop goes on waking at least
//! every heartbeat interval and ticking the pulse systemd's watchdog is fed
//! from. A member that learns the head no longer counts its incarnation
//! first stops every actor it hosts for another member (their supervisors
//! have restarted them elsewhere), then rejoins as a new incarnation.

pub(crate) mod head_client;
pub(crate) mod heads;

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
use ractor::ActorRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::now;
use crate::identity::Identity;
use crate::member::heads::HeadAddrs;
use crate::net::pool::Pool;
use crate::placement::reservations::Reservations;
use crate::remote::spawner::{Hosted, SpawnerMsg};
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
    /// The task dialling the head ended without an answer.
    #[error("NODE-JOIN-001: the dial to the head ended: {0}")]
    Dial(String),
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
    /// The heads it may follow, shared with the node's calls to the head.
    pub(crate) heads: HeadAddrs,
    /// The head the dial in progress (or the stream open) is to.
    dialed: SocketAddr,
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
    /// The node's spawner, told to stop what it hosts for others before
    /// the node rejoins as a new incarnation.
    pub(crate) spawner: Option<ActorRef<SpawnerMsg>>,
    stream: Option<Stream>,
    /// The dial in progress, beside the loop.
    dialing: Option<JoinHandle<Result<Stream, JoinError>>>,
    /// When the pulse next moves.
    pulse_at: tokio::time::Instant,
    /// Why the last connect failed, for a join that gives up.
    last_error: Option<JoinError>,
    /// Whether the machine has been told to leave.
    leaving: bool,
}

/// What woke a step.
enum Input {
    Reply(Option<Result<ControlReply, StreamError>>),
    Dialed(Result<Stream, JoinError>),
    Time,
    Shutdown,
}

/// How long one dial to the head may take before it is given up and tried
/// afresh: QUIC resends a lost handshake after ever longer waits, so a dial
/// begun while the head was unreachable could otherwise wait seconds past
/// the link's return.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a fenced member waits for the actors it hosted for others to
/// stop before it rejoins anyway.
const FENCE_WAIT: Duration = Duration::from_secs(5);

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

/// What a member's link is handed by the node.
pub(crate) struct MemberParts {
    /// Who this node is.
    pub(crate) identity: Arc<Identity>,
    /// Connections, the head's among them.
    pub(crate) pool: Arc<Pool>,
    /// Where the tables the head pushes go.
    pub(crate) view: watch::Sender<Table>,
    /// The actors this node hosts (stopped when it is fenced).
    pub(crate) hosted: Hosted,
    /// The node's reservations (fenced with it).
    pub(crate) ledger: Reservations,
}

impl Member {
    /// A member of the heads at `heads` (`head_name`: the head's
    /// certificate name, where it is not `head`), not yet joined.
    pub(crate) fn new(
        parts: MemberParts,
        heads: HeadAddrs,
        head_name: Option<String>,
        config: MemberConfig,
    ) -> Self {
        let MemberParts {
            identity,
            pool,
            view,
            hosted,
            ledger,
        } = parts;
        let link = MemberLink::new(now(), config, identity.join_request());
        Self {
            identity,
            pool,
            dialed: heads.current(),
            heads,
            head_name,
            view,
            hosted,
            link,
            ledger,
            pulse: watch::channel(0).0,
            spawner: None,
            stream: None,
            dialing: None,
            pulse_at: tokio::time::Instant::now(),
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
                    let waited = JoinError::Timeout {
                        head: self.dialed,
                        after: timeout,
                    };
                    // A dial that timed out says so for itself; the join
                    // waited longer.
                    return Err(match self.last_error.take() {
                        None | Some(JoinError::Timeout { .. }) => waited,
                        Some(other) => other,
                    });
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
                    MemberEvent::Connect => self.dial(),
                    MemberEvent::Table(update) => {
                        self.view.send_modify(|t| t.apply(update));
                        result = Step::Joined;
                    }
                    MemberEvent::Reincarnate => {
                        Self::fence(self.spawner.clone()).await;
                        let incarnation = self.identity.reincarnate();
                        self.link.set_incarnation(incarnation);
                        tracing::warn!(
                            %incarnation,
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
        let due = self.link.poll_timeout().map(tokio::time::Instant::from_std);
        // Wake for the pulse too, so it moves every heartbeat interval
        // whatever else wakes the loop (a dial's result, a reply).
        let wake = due.unwrap_or(until).min(until).min(self.pulse_at);
        let stopping = shutdown.is_none() || self.leaving;
        let (stream, dialing) = (&mut self.stream, &mut self.dialing);
        let replies = async {
            match stream.as_mut() {
                Some(s) => s.replies.next().await,
                None => std::future::pending().await,
            }
        };
        let dialed = async {
            match dialing.as_mut() {
                Some(task) => match task.await {
                    Ok(result) => result,
                    Err(e) => Err(JoinError::Dial(e.to_string())),
                },
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
            opened = dialed => Input::Dialed(opened),
            () = tokio::time::sleep_until(wake) => Input::Time,
            () = cancelled, if !stopping => Input::Shutdown,
        };
        if tokio::time::Instant::now() >= self.pulse_at {
            // Fault injection: `node::heartbeat=pause` wedges this loop.
            fail::fail_point!("node::heartbeat");
            self.pulse.send_modify(|n| *n = n.wrapping_add(1));
            self.pulse_at = tokio::time::Instant::now() + self.link.config().heartbeat_interval;
        }
        match input {
            Input::Reply(Some(Ok(reply))) => self.link.handle_reply(now(), reply),
            Input::Reply(Some(Err(e))) => self.lost(&e.to_string()),
            Input::Reply(None) => self.lost("the head closed the control stream"),
            Input::Dialed(opened) => {
                self.dialing = None;
                self.opened(opened);
            }
            Input::Time => {
                if due.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    self.link.set_actors(self.hosted.count());
                    self.link.handle_timeout(now());
                }
            }
            Input::Shutdown => {
                self.leaving = true;
                if let Some(task) = self.dialing.take() {
                    task.abort();
                }
                self.link.handle_shutdown(now());
            }
        }
        Step::Go
    }

    fn lost(&mut self, why: &str) {
        self.stream = None;
        if self.heads.len() > 1 {
            // The primary of a head set gone silent is most likely dead,
            // and a standby taking over: the next dial is to the next head.
            self.heads.failed(self.dialed);
            tracing::warn!(error = why, next = %self.heads.current(), "link to the head lost; trying the next head of the set");
        } else {
            tracing::warn!(error = why, "link to the head lost");
        }
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

    /// Starts opening a control stream, in a task beside the loop (a dial
    /// to an address nobody answers waits for QUIC's idle timeout).
    fn dial(&mut self) {
        self.stream = None;
        if let Some(task) = self.dialing.take() {
            task.abort();
        }
        let (pool, identity) = (Arc::clone(&self.pool), Arc::clone(&self.identity));
        let head = self.heads.current();
        self.dialed = head;
        let head_name = self.head_name.clone();
        self.dialing = Some(tokio::spawn(async move {
            tokio::time::timeout(DIAL_TIMEOUT, open(pool, identity, head, head_name))
                .await
                .unwrap_or(Err(JoinError::Timeout {
                    head,
                    after: DIAL_TIMEOUT,
                }))
        }));
    }

    /// What a dial came to.
    fn opened(&mut self, opened: Result<Stream, JoinError>) {
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
                // With a head set, the next dial is to the next head.
                self.heads.failed(self.dialed);
                if self.heads.len() > 1 {
                    tracing::warn!(error = %e, next = %self.heads.current(), "cannot reach the head; trying the next head of the set");
                } else {
                    tracing::warn!(error = %e, "cannot reach the head; retrying");
                }
                self.last_error = Some(e);
                self.link.handle_link_lost(now());
            }
        }
    }

    /// Stops every actor this node hosts for another member, waiting at
    /// most [`FENCE_WAIT`]: the head no longer counts this incarnation, so
    /// their owners have restarted them elsewhere.
    async fn fence(spawner: Option<ActorRef<SpawnerMsg>>) {
        let Some(spawner) = spawner else {
            return;
        };
        let asked = ractor::call_t!(spawner, SpawnerMsg::Fence, FENCE_WAIT.as_millis() as u64);
        match asked {
            Ok(stopped) => tracing::warn!(
                stopped,
                "NODE-JOIN-010: fenced: stopped the actors this node hosted for others before rejoining"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "NODE-JOIN-010: the spawner did not confirm the fence")
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
