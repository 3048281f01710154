//! The gate every accepted stream passes: the hello is checked against the
//! peer's certificate (its name, role and serial: a revoked one is
//! refused), this node's cookie, the purposes the endpoint serves, the
//! member the connection already speaks for, and what the member table
//! holds of the peer's incarnation (a stream from an incarnation that is
//! down, left or replaced is refused). Cluster, bulk and pull streams are
//! for up members only: a hello from a member the table does not show up
//! yet (one that has just joined, whose entry is on its way) waits for it
//! a moment, then is refused. Every refusal is logged by the caller and
//! counted here.
//!
//! ```text
//! accept_bi ─► Hello (within its deadline) ─► Gate::check ─┬─ member-only purpose: wait for the table
//!                                    ▲                    ├─ Accepted ─► stream
//!                                    │                    └─ Refused(reason) ─► counted, closed
//!   identity (name, incarnation, cookie) · watch<Table> (peer incarnations, revoked serials)
//! ```

use std::time::Duration;

use flotilla_proto::hello::{Hello, Purpose, Refusal};
use flotilla_proto::incarnation::{Incarnation, MemberRef};
use flotilla_transport::PeerConnection;
use flotilla_transport::handshake::{self, Gate, StreamError, needs_membership};
use quinn::{RecvStream, SendStream};
use tokio::sync::watch;

use crate::counters;
use crate::identity::Identity;
use crate::table::Table;

/// How long a member-only stream from a member the table does not show up
/// yet waits for it: the head pushes a join to every member within its
/// push gap (100 ms) and a round trip.
const MEMBER_WAIT: Duration = Duration::from_secs(3);

/// Accepts the next stream `pc`'s peer opens on an endpoint serving
/// `serves`, checked against `identity`, the peers' incarnations and the
/// revoked serials in `view`, and `bound`: the member an earlier stream of
/// the connection proved (set by the first one accepted).
pub(crate) async fn accept(
    identity: &Identity,
    view: &watch::Receiver<Table>,
    pc: &PeerConnection,
    serves: &[Purpose],
    bound: &mut Option<String>,
) -> Result<(SendStream, RecvStream, Hello), StreamError> {
    let (mut send, recv, hello) = handshake::read_hello(&pc.connection).await?;
    let verdict = {
        let known = |name: &str| view.borrow().known(name);
        let revoked = |serial: &[u8]| view.borrow().is_revoked(serial);
        let gate = Gate {
            name: &identity.name,
            incarnation: identity.incarnation(),
            cookie: identity.cookie,
            serves,
            known: &known,
            revoked: &revoked,
            bound: bound.as_deref(),
        };
        gate.check(&hello, pc)
    };
    let verdict = match verdict {
        Ok(()) if needs_membership(hello.purpose) && hello.node != identity.name => {
            member_up(view, &hello).await
        }
        v => v,
    };
    let answered =
        handshake::answer(&mut send, verdict, &identity.name, identity.incarnation()).await;
    if let Err(StreamError::RefusedPeer(refusal)) = &answered {
        counters::hello_refused(*refusal);
    }
    answered?;
    bound.get_or_insert_with(|| hello.node.to_string());
    Ok((send, recv, hello))
}

/// Whether the table shows the hello's member up at its incarnation,
/// waiting up to [`MEMBER_WAIT`] for it to.
async fn member_up(view: &watch::Receiver<Table>, hello: &Hello) -> Result<(), Refusal> {
    if is_up(view, &hello.node, hello.incarnation).await {
        Ok(())
    } else {
        Err(Refusal::NotMember)
    }
}

/// Whether the table shows `member` up at `incarnation`, waiting up to
/// [`MEMBER_WAIT`] for it to (a member that has just joined).
pub(crate) async fn is_up(
    view: &watch::Receiver<Table>,
    member: &str,
    incarnation: Incarnation,
) -> bool {
    let mut view = view.clone();
    let up = |t: &Table| t.known(member) == Some((incarnation, true));
    matches!(
        tokio::time::timeout(MEMBER_WAIT, view.wait_for(up)).await,
        Ok(Ok(_))
    )
}

/// Resolves once `view` shows `member` at a newer incarnation than
/// `incarnation`, or at it and not up (down or left): the streams of that
/// incarnation are fenced. Never while the table does not hold the member
/// (it has just joined), never for incarnation 0 (a tool's), and never
/// once the table's sender is gone.
pub(crate) async fn fenced(view: &watch::Receiver<Table>, member: &str, incarnation: Incarnation) {
    // Incarnation 0 is a tool's, which is no member: nothing to fence.
    if incarnation.is_tool() {
        return std::future::pending().await;
    }
    let mut view = view.clone();
    let gone = |t: &Table| flotilla_proto::membership::has_ended(t.known(member), incarnation);
    if view.wait_for(gone).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// [`fenced`] for the member incarnation a connection's latest stream
/// spoke for; never while none has.
pub(crate) async fn speaker_fenced(view: &watch::Receiver<Table>, speaks_for: &Option<MemberRef>) {
    match speaks_for {
        Some(member) => fenced(view, &member.name, member.incarnation).await,
        None => std::future::pending().await,
    }
}

/// Why a connection's certificate stopped being good while it was open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Withdrawn {
    /// The head's revocation list names it.
    Revoked,
    /// Its validity ended.
    Expired,
}

/// Resolves once the certificate of `pc` is revoked (as `view` says) or
/// expires; never before.
pub(crate) async fn withdrawn(view: &watch::Receiver<Table>, pc: &PeerConnection) -> Withdrawn {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let left = std::time::Duration::from_secs(pc.expires_unix.saturating_sub(now).max(0) as u64);
    tokio::select! {
        () = revoked(view, &pc.serial) => Withdrawn::Revoked,
        () = tokio::time::sleep(left) => Withdrawn::Expired,
    }
}

/// Closes `pc` because its certificate was withdrawn (`why`), on `lane`
/// (`main` or `bulk`): logged, counted
/// (`flotilla_connections_closed_total{reason}`).
pub(crate) fn close_withdrawn(pc: &PeerConnection, why: Withdrawn, lane: &'static str) {
    match why {
        Withdrawn::Revoked => {
            tracing::warn!(peer = %pc.peer, lane, "NODE-AUTH-020: closing the connection of a revoked certificate");
            counters::hello_refused(Refusal::Revoked);
            counters::connection_closed("revoked");
            flotilla_transport::Closing::Revoked.close(&pc.connection);
        }
        Withdrawn::Expired => {
            tracing::warn!(peer = %pc.peer, lane, "NODE-AUTH-027: closing the connection of a certificate that expired while it was open; renew it (node certs renew)");
            counters::connection_closed("expired");
            flotilla_transport::Closing::Expired.close(&pc.connection);
        }
    }
}

/// Closes `pc` because the member incarnation its streams spoke for is no
/// longer up, on `lane` (`main` or `bulk`): logged, counted
/// (`flotilla_fenced_connections_total{endpoint}`).
pub(crate) fn close_fenced(pc: &PeerConnection, lane: &'static str) {
    tracing::warn!(peer = %pc.peer, lane, "NODE-AUTH-023: closing the connection of a member incarnation that is no longer up");
    counters::fenced(lane);
    flotilla_transport::Closing::Fenced.close(&pc.connection);
}

/// Resolves once `view` says the certificate `serial` is revoked; never
/// while it is not (and never once the table's sender is gone).
pub(crate) async fn revoked(view: &watch::Receiver<Table>, serial: &[u8]) {
    let mut view = view.clone();
    if view.wait_for(|t| t.is_revoked(serial)).await.is_err() {
        std::future::pending::<()>().await;
    }
}
