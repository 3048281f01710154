//! `node status`: asks any node for its member table, or for its
//! supervisors, as the operator's `admin` identity (or any member
//! identity).

use std::net::SocketAddr;

use flotilla_proto::control::{
    ControlReply, ControlRequest, GpuReport, HeardFrom, PlacementReply, PlacementRequest,
    SupervisorReport,
};
use flotilla_proto::jobs::{JobsReply, JobsRequest};
use flotilla_proto::objects::ObjectStats;

use crate::control::client::ControlClient;
pub use crate::control::query_error::StatusError;
use crate::control::render::PlacementStatus;
use crate::table::Table;

/// Asks the node at `addr` for its member table (read in pages when it
/// is large).
pub async fn query_status(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Table, StatusError> {
    table_of(addr, ask(addr, identity, ControlRequest::Status).await?)
}

/// Asks the node at `addr` for its supervisors and their children.
pub async fn query_supervisors(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Vec<SupervisorReport>, StatusError> {
    supervisors_of(
        addr,
        ask(addr, identity, ControlRequest::Supervisors).await?,
    )
}

/// Asks the node at `addr` for its object-store counters.
pub async fn query_objects(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<ObjectStats, StatusError> {
    objects_of(addr, ask(addr, identity, ControlRequest::Objects).await?)
}

/// Asks the node at `addr` for its GPUs and the actors holding them.
pub async fn query_gpus(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Vec<GpuReport>, StatusError> {
    gpus_of(addr, ask(addr, identity, ControlRequest::Gpus).await?)
}

/// Asks the head at `addr` for its placement groups and every node's
/// capacity and reservations.
pub async fn query_placement(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<PlacementStatus, StatusError> {
    placement_of(addr, ask(addr, identity, PLACEMENT_LIST).await?)
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
        other => Err(unexpected(addr, &other)),
    }
}

/// Sends a jobs request to the head at `addr`; its answer.
pub async fn query_jobs(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
    request: JobsRequest,
) -> Result<JobsReply, StatusError> {
    jobs_of(
        addr,
        ask(addr, identity, ControlRequest::Jobs(request)).await?,
    )
}

/// The same queries through a client's kept connections.
impl ControlClient {
    /// The member table of the node at `addr` (see [`query_status`]).
    pub async fn status(&self, addr: SocketAddr) -> Result<Table, StatusError> {
        table_of(addr, self.ask(addr, ControlRequest::Status).await?)
    }

    /// The supervisors of the node at `addr` (see [`query_supervisors`]).
    pub async fn supervisors(
        &self,
        addr: SocketAddr,
    ) -> Result<Vec<SupervisorReport>, StatusError> {
        supervisors_of(addr, self.ask(addr, ControlRequest::Supervisors).await?)
    }

    /// The object-store counters of the node at `addr` (see
    /// [`query_objects`]).
    pub async fn objects(&self, addr: SocketAddr) -> Result<ObjectStats, StatusError> {
        objects_of(addr, self.ask(addr, ControlRequest::Objects).await?)
    }

    /// The GPUs of the node at `addr` (see [`query_gpus`]).
    pub async fn gpus(&self, addr: SocketAddr) -> Result<Vec<GpuReport>, StatusError> {
        gpus_of(addr, self.ask(addr, ControlRequest::Gpus).await?)
    }

    /// The placement groups and reservations the head at `addr` accounts
    /// (see [`query_placement`]).
    pub async fn placement(&self, addr: SocketAddr) -> Result<PlacementStatus, StatusError> {
        placement_of(addr, self.ask(addr, PLACEMENT_LIST).await?)
    }

    /// How long ago the head at `addr` last heard from each member.
    pub async fn heard(&self, addr: SocketAddr) -> Result<Vec<HeardFrom>, StatusError> {
        match self.ask(addr, ControlRequest::Heard).await? {
            ControlReply::Heard(heard) => Ok(heard),
            other => Err(unexpected(addr, &other)),
        }
    }

    /// A jobs request to the head at `addr` (see [`query_jobs`]).
    pub async fn jobs(
        &self,
        addr: SocketAddr,
        request: JobsRequest,
    ) -> Result<JobsReply, StatusError> {
        jobs_of(addr, self.ask(addr, ControlRequest::Jobs(request)).await?)
    }
}

/// Placement's list request.
const PLACEMENT_LIST: ControlRequest = ControlRequest::Placement(PlacementRequest::List);

/// The answer was not the one asked for.
fn unexpected(addr: SocketAddr, reply: &ControlReply) -> StatusError {
    StatusError::Unexpected {
        addr,
        reply: format!("{reply:?}"),
    }
}

fn table_of(addr: SocketAddr, reply: ControlReply) -> Result<Table, StatusError> {
    match reply {
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
        other => Err(unexpected(addr, &other)),
    }
}

fn supervisors_of(
    addr: SocketAddr,
    reply: ControlReply,
) -> Result<Vec<SupervisorReport>, StatusError> {
    match reply {
        ControlReply::Supervisors(reports) => Ok(reports),
        other => Err(unexpected(addr, &other)),
    }
}

fn objects_of(addr: SocketAddr, reply: ControlReply) -> Result<ObjectStats, StatusError> {
    match reply {
        ControlReply::Objects(stats) => Ok(stats),
        other => Err(unexpected(addr, &other)),
    }
}

fn gpus_of(addr: SocketAddr, reply: ControlReply) -> Result<Vec<GpuReport>, StatusError> {
    match reply {
        ControlReply::Gpus(gpus) => Ok(gpus),
        other => Err(unexpected(addr, &other)),
    }
}

fn placement_of(addr: SocketAddr, reply: ControlReply) -> Result<PlacementStatus, StatusError> {
    match reply {
        ControlReply::Placement(PlacementReply::Groups { groups, nodes }) => {
            Ok(PlacementStatus { groups, nodes })
        }
        other => Err(unexpected(addr, &other)),
    }
}

fn jobs_of(addr: SocketAddr, reply: ControlReply) -> Result<JobsReply, StatusError> {
    match reply {
        ControlReply::Jobs(reply) => Ok(reply),
        other => Err(unexpected(addr, &other)),
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
/// (incarnation 0) speaking for `identity`, on a connection of its own
/// (see [`ControlClient`]); its answer.
async fn ask(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
    request: ControlRequest,
) -> Result<ControlReply, StatusError> {
    let client = ControlClient::new(identity)?;
    let reply = client.ask(addr, request).await;
    client.close().await;
    reply
}
