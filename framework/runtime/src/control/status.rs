//! `node status`: asks any node for its member table, or for its
//! supervisors, as the operator's `admin` identity (or any member
//! identity).

use std::net::SocketAddr;

use flotilla_proto::control::{
    ControlReply, ControlRequest, Pages, PlacementReply, PlacementRequest, SupervisorReport,
};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::hello::{Hello, Purpose};
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::jobs::{JobsReply, JobsRequest};
use flotilla_proto::objects::ObjectStats;
use flotilla_transport::handshake::{self, StreamError, recv_msg, send_msg};
use flotilla_transport::{BindError, ConnectError};

use crate::control::render::PlacementStatus;
use crate::table::Table;

/// Why the status query failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The identity's certificates folder holds no cluster cookie.
    #[error(
        "NODE-CERT-008: no cluster cookie beside the certificate; copy the `cookie` file `node certs init` wrote into the certs folder"
    )]
    NoCookie,
    /// No local endpoint could be opened.
    #[error("NODE-STATUS-001: cannot open a local endpoint: {0}")]
    Bind(#[from] BindError),
    /// The node could not be reached.
    #[error("NODE-STATUS-001: cannot reach {addr}: {source}")]
    Connect {
        /// The node asked.
        addr: SocketAddr,
        /// Why.
        source: ConnectError,
    },
    /// The exchange failed or was refused.
    #[error("NODE-STATUS-001: status request to {addr} failed: {source}")]
    Stream {
        /// The node asked.
        addr: SocketAddr,
        /// Why.
        source: StreamError,
    },
    /// The identity's certificate carries no role.
    #[error(
        "NODE-AUTH-018: the certificate carries no role; issue a new one with `node certs issue --role …`"
    )]
    NoRole,
    /// The node's permission table refused the request.
    #[error("NODE-STATUS-002: {addr} refused: {why}")]
    Denied {
        /// The node asked.
        addr: SocketAddr,
        /// Why.
        why: flotilla_proto::authority::Unauthorized,
    },
    /// No head address was given to ask.
    #[error("NODE-STATUS-003: no head address given")]
    NoAddress,
    /// The node's answer was over the frame limit.
    #[error(
        "NODE-STATUS-004: {addr}'s answer of {bytes} bytes is over the frame limit of {limit} bytes; ask for less at once"
    )]
    TooLarge {
        /// The node asked.
        addr: SocketAddr,
        /// The answer's size.
        bytes: u64,
        /// The limit.
        limit: u32,
    },
    /// The node answered with something else than a table.
    #[error("NODE-STATUS-001: {addr} answered the status request with {reply}")]
    Unexpected {
        /// The node asked.
        addr: SocketAddr,
        /// What it answered.
        reply: String,
    },
}

/// Asks the node at `addr` for its member table (read in pages when it
/// is large).
pub async fn query_status(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Table, StatusError> {
    match ask(addr, identity, ControlRequest::Status).await? {
        ControlReply::Members {
            version,
            head,
            members,
            revoked,
            ..
        } => Ok(Table {
            version,
            head,
            members,
            revoked,
        }),
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Asks the node at `addr` for its supervisors and their children.
pub async fn query_supervisors(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Vec<SupervisorReport>, StatusError> {
    match ask(addr, identity, ControlRequest::Supervisors).await? {
        ControlReply::Supervisors(reports) => Ok(reports),
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Asks the node at `addr` for its object-store counters.
pub async fn query_objects(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<ObjectStats, StatusError> {
    match ask(addr, identity, ControlRequest::Objects).await? {
        ControlReply::Objects(stats) => Ok(stats),
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Asks the node at `addr` for its GPUs and the actors holding them.
pub async fn query_gpus(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Vec<flotilla_proto::control::GpuReport>, StatusError> {
    match ask(addr, identity, ControlRequest::Gpus).await? {
        ControlReply::Gpus(gpus) => Ok(gpus),
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Asks the head at `addr` for its placement groups and every node's
/// capacity and reservations.
pub async fn query_placement(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<PlacementStatus, StatusError> {
    let request = ControlRequest::Placement(PlacementRequest::List);
    match ask(addr, identity, request).await? {
        ControlReply::Placement(PlacementReply::Groups { groups, nodes }) => {
            Ok(PlacementStatus { groups, nodes })
        }
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Asks the head at `addr` to drain the member `name`, giving it `within`
/// to hand back what it holds before it leaves; the head's answer. A
/// worker's certificate drains only that worker, an admin's any member.
pub async fn query_drain(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
    name: &str,
    within: std::time::Duration,
) -> Result<flotilla_proto::membership::DrainOutcome, StatusError> {
    let request = ControlRequest::Drain {
        name: name.into(),
        within_ms: within.as_millis() as u64,
    };
    match ask(addr, identity, request).await? {
        ControlReply::Drain(outcome) => Ok(outcome),
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Sends a jobs request to the head at `addr`; its answer.
pub async fn query_jobs(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
    request: JobsRequest,
) -> Result<JobsReply, StatusError> {
    match ask(addr, identity, ControlRequest::Jobs(request)).await? {
        ControlReply::Jobs(reply) => Ok(reply),
        other => Err(StatusError::Unexpected {
            addr,
            reply: format!("{other:?}"),
        }),
    }
}

/// Asks every head of a head set at once (`ask` at each of `heads`) and
/// returns the first answer with the address that gave it: only the
/// active head listens, so a tool given every head address reaches
/// whichever is active without knowing which. All failing, the last
/// failure.
///
/// ```no_run
/// # async fn demo(identity: flotilla_transport::Identity) -> Result<(), flotilla::status::StatusError> {
/// let heads = ["10.0.0.1:7420".parse().unwrap(), "10.0.0.2:7420".parse().unwrap()];
/// let (head, table) =
///     flotilla::status::first_answer(&heads, |a| flotilla::query_status(a, identity.clone()))
///         .await?;
/// println!("{} members, from the head at {head}", table.members.len());
/// # Ok(()) }
/// ```
pub async fn first_answer<T, F, Fut>(
    heads: &[SocketAddr],
    ask: F,
) -> Result<(SocketAddr, T), StatusError>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<T, StatusError>>,
{
    if heads.is_empty() {
        return Err(StatusError::NoAddress);
    }
    let asks = heads.iter().map(|&addr| {
        let asked = ask(addr);
        Box::pin(async move { asked.await.map(|answer| (addr, answer)) })
    });
    match futures::future::select_ok(asks).await {
        Ok((answer, _)) => Ok(answer),
        Err(e) => Err(e),
    }
}

/// Sends any control request to the node at `addr` as a tool speaking for
/// `identity` (see [`query_status`]) and returns its answer: what scripts
/// and tests use for requests no other query wraps. A refusal by the
/// node's permission table is [`StatusError::Denied`].
pub async fn query(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
    request: ControlRequest,
) -> Result<ControlReply, StatusError> {
    ask(addr, identity, request).await
}

/// Sends `request` on a control stream to the node at `addr`, as a tool
/// (incarnation 0) speaking for `identity` (under an instance name of
/// its own for roles that run many processes); its answer, a table in
/// pages joined back. A refusal by the node's permission table is
/// [`StatusError::Denied`].
async fn ask(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
    request: ControlRequest,
) -> Result<ControlReply, StatusError> {
    let role = identity.role.ok_or(StatusError::NoRole)?;
    let name = flotilla_proto::role::member_name(&identity.name, role, crate::nonce::nonce());
    let cookie = identity
        .cookie
        .as_deref()
        .map(flotilla_transport::certs::cookie_digest)
        .ok_or(StatusError::NoCookie)?;
    let endpoint =
        flotilla_transport::Endpoint::client(identity, &flotilla_transport::Tuning::default())?;
    let stream = |source| StatusError::Stream { addr, source };
    let result = async {
        let pc = endpoint
            .connect(addr, None)
            .await
            .map_err(|source| StatusError::Connect { addr, source })?;
        let hello = Hello::new(Purpose::Control, name, Incarnation::TOOL, cookie);
        let (mut send, mut recv, _, _) = handshake::dial(&pc.connection, &hello)
            .await
            .map_err(stream)?;
        send_msg(&mut send, &request, DEFAULT_MAX_FRAME)
            .await
            .map_err(stream)?;
        let mut pages = Pages::default();
        let reply = loop {
            let page = recv_msg::<ControlReply>(&mut recv, DEFAULT_MAX_FRAME)
                .await
                .map_err(stream)?;
            if let Some(reply) = pages.push(page) {
                break reply;
            }
        };
        let _ = send.finish();
        flotilla_transport::Closing::Done.close(&pc.connection);
        match reply {
            ControlReply::Denied(why) => Err(StatusError::Denied { addr, why }),
            ControlReply::TooLarge { bytes, limit } => {
                Err(StatusError::TooLarge { addr, bytes, limit })
            }
            reply => Ok(reply),
        }
    }
    .await;
    endpoint.wait_idle().await;
    result
}
