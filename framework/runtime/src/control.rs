//! Control streams: the head's side (join, heartbeats, leave, status) and
//! the member's side (join, then heartbeat until stopped).

use std::net::SocketAddr;
use std::sync::Arc;

use flotilla_proto::control::{ControlReply, ControlRequest};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::hello::{Hello, Purpose, Refusal};
use flotilla_proto::membership::{HeartbeatOutcome, JoinRequest};
use flotilla_transport::handshake::{self, StreamError, recv_msg, send_msg};
use quinn::{RecvStream, SendStream};
use tokio::sync::mpsc;

use crate::node::{Shared, StartError};
use crate::table::Table;

fn members_reply(table: &Table) -> ControlReply {
    ControlReply::Members {
        version: table.version,
        head: table.head.clone(),
        members: table.members.clone(),
    }
}

/// Serves one control stream accepted from `peer` (its certificate name).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    peer: String,
    mut send: SendStream,
    recv: RecvStream,
) -> Result<(), StreamError> {
    // A reader task so that pushes and replies can interleave safely.
    let (tx, mut rx) = mpsc::channel::<Result<ControlRequest, StreamError>>(16);
    tokio::spawn(async move {
        let mut recv = recv;
        loop {
            let msg = match handshake::recv_frame(&mut recv, DEFAULT_MAX_FRAME).await {
                Ok(Some(bytes)) => flotilla_proto::wire::decode::<ControlRequest>(&bytes)
                    .map_err(StreamError::from),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            let stop = msg.is_err();
            if tx.send(msg).await.is_err() || stop {
                return;
            }
        }
    });
    let mut view = shared.view.subscribe();
    let mut member_of: Option<(String, u64)> = None;
    let mut pushed_version = 0;
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else {
                    return Ok(());
                };
                match msg? {
                    ControlRequest::Status => {
                        let table = shared.view.borrow().clone();
                        send_msg(&mut send, &members_reply(&table), DEFAULT_MAX_FRAME).await?;
                    }
                    ControlRequest::Join(req) => {
                        let reply = match shared.head_join(&peer, req.clone()) {
                            Ok(table) => {
                                member_of = Some((req.name.clone(), req.incarnation));
                                pushed_version = table.version;
                                tracing::info!(node = %req.name, addr = %req.addr, incarnation = req.incarnation, "member joined");
                                members_reply(&table)
                            }
                            Err(refusal) => {
                                tracing::warn!(node = %req.name, %refusal, "join refused");
                                ControlReply::Refused(refusal)
                            }
                        };
                        send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                    }
                    ControlRequest::Heartbeat { name, incarnation, actors, .. } => {
                        if name != peer {
                            send_msg(&mut send, &ControlReply::Refused(Refusal::IdentityMismatch), DEFAULT_MAX_FRAME).await?;
                            continue;
                        }
                        match shared.head_heartbeat(&name, incarnation, actors) {
                            HeartbeatOutcome::Alive => {}
                            outcome => {
                                tracing::warn!(node = %name, ?outcome, "heartbeat from a member that is not up; asking it to rejoin");
                                send_msg(&mut send, &ControlReply::Rejoin, DEFAULT_MAX_FRAME).await?;
                            }
                        }
                    }
                    ControlRequest::Leave { name, incarnation } => {
                        if name == peer && shared.head_leave(&name, incarnation) {
                            tracing::info!(node = %name, "member left");
                        }
                        send_msg(&mut send, &ControlReply::Ack, DEFAULT_MAX_FRAME).await?;
                    }
                }
            }
            changed = view.changed(), if member_of.is_some() => {
                if changed.is_err() {
                    return Ok(());
                }
                let table = view.borrow_and_update().clone();
                if table.version != pushed_version {
                    pushed_version = table.version;
                    send_msg(&mut send, &members_reply(&table), DEFAULT_MAX_FRAME).await?;
                }
            }
        }
    }
}

/// The member's end of its control stream to the head.
pub(crate) struct HeadLink {
    send: SendStream,
    recv: RecvStream,
}

/// Dials the head, sends the join request and returns the first table.
pub(crate) async fn join(
    shared: &Arc<Shared>,
    head: SocketAddr,
) -> Result<(HeadLink, Table), StartError> {
    let pc = shared
        .pool
        .connect(shared, None, head)
        .await
        .map_err(|e| StartError::Join(e.to_string()))?;
    let hello = shared.hello(Purpose::Control);
    let (mut send, mut recv, head_name, _) = handshake::dial(&pc.connection, &hello)
        .await
        .map_err(|e| StartError::Join(e.to_string()))?;
    let req = JoinRequest {
        name: shared.name.clone(),
        addr: shared.advertise.to_string(),
        bulk_addr: shared.bulk_addr.to_string(),
        incarnation: shared.incarnation(),
        resources: shared.resources.clone(),
    };
    send_msg(&mut send, &ControlRequest::Join(req), DEFAULT_MAX_FRAME)
        .await
        .map_err(|e| StartError::Join(e.to_string()))?;
    match recv_msg::<ControlReply>(&mut recv, DEFAULT_MAX_FRAME)
        .await
        .map_err(|e| StartError::Join(e.to_string()))?
    {
        ControlReply::Members {
            version,
            head,
            members,
        } => {
            if head != head_name {
                tracing::warn!(%head, %head_name, "head reports a different name than its hello");
            }
            Ok((
                HeadLink { send, recv },
                Table {
                    version,
                    head,
                    members,
                },
            ))
        }
        ControlReply::Refused(r) => Err(StartError::Refused(r)),
        other => Err(StartError::Join(format!(
            "unexpected reply to join: {other:?}"
        ))),
    }
}

/// Heartbeats to the head and applies the tables it pushes until shutdown,
/// then leaves cleanly. Rejoins with a new incarnation when the head says
/// this node is no longer up, and re-dials the head if the link breaks.
pub(crate) async fn run_member(shared: Arc<Shared>, head: SocketAddr, link: HeadLink) {
    let mut link = Some(link);
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let current = match link.take() {
            Some(l) => l,
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(shared.detector.heartbeat_interval) => {}
                    _ = shutdown.changed() => return,
                }
                match join(&shared, head).await {
                    Ok((l, table)) => {
                        tracing::info!(incarnation = shared.incarnation(), "rejoined the cluster");
                        shared.view.send_replace(table);
                        l
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot reach the head; retrying");
                        continue;
                    }
                }
            }
        };
        let HeadLink { mut send, recv } = current;
        let (tx, mut rx) = mpsc::channel::<Result<ControlReply, StreamError>>(16);
        let reader = tokio::spawn(async move {
            let mut recv = recv;
            loop {
                let msg = recv_msg::<ControlReply>(&mut recv, DEFAULT_MAX_FRAME).await;
                let stop = msg.is_err();
                if tx.send(msg).await.is_err() || stop {
                    return;
                }
            }
        });
        let mut tick = tokio::time::interval(shared.detector.heartbeat_interval);
        let outcome: Result<(), String> = loop {
            tokio::select! {
                _ = tick.tick() => {
                    let hb = ControlRequest::Heartbeat {
                        name: shared.name.clone(),
                        incarnation: shared.incarnation(),
                        actors: shared.live_actors(),
                        version: shared.view.borrow().version,
                    };
                    if let Err(e) = send_msg(&mut send, &hb, DEFAULT_MAX_FRAME).await {
                        break Err(e.to_string());
                    }
                }
                msg = rx.recv() => match msg {
                    Some(Ok(ControlReply::Members { version, head, members })) => {
                        shared.view.send_replace(Table { version, head, members });
                    }
                    Some(Ok(ControlReply::Rejoin)) => {
                        shared.new_incarnation();
                        tracing::warn!("NODE-JOIN-006: the head marked this node down; rejoining with a new incarnation");
                        break Err("marked down".into());
                    }
                    Some(Ok(other)) => tracing::debug!(?other, "control reply"),
                    Some(Err(e)) => break Err(e.to_string()),
                    None => break Err("head closed the control stream".into()),
                },
                _ = shutdown.changed() => {
                    let leave = ControlRequest::Leave { name: shared.name.clone(), incarnation: shared.incarnation() };
                    if send_msg(&mut send, &leave, DEFAULT_MAX_FRAME).await.is_ok() {
                        // Wait briefly for the acknowledgement so the leave is recorded.
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                            while let Some(Ok(reply)) = rx.recv().await {
                                if reply == ControlReply::Ack { break; }
                            }
                        }).await;
                    }
                    let _ = send.finish();
                    reader.abort();
                    return;
                }
            }
        };
        reader.abort();
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "link to the head lost");
        }
    }
}

/// Asks the node at `addr` for its member table, as the operator's `admin`
/// identity (or any member identity).
pub async fn query_status(
    addr: SocketAddr,
    identity: flotilla_transport::Identity,
) -> Result<Table, StatusError> {
    let name = identity.name.clone();
    let endpoint =
        flotilla_transport::Endpoint::client(identity, &flotilla_transport::Tuning::default())
            .map_err(|e| StatusError(e.to_string()))?;
    let result = async {
        let pc = endpoint
            .connect(addr, None)
            .await
            .map_err(|e| StatusError(e.to_string()))?;
        let hello = Hello::new(Purpose::Control, name, 0);
        let (mut send, mut recv, _, _) = handshake::dial(&pc.connection, &hello)
            .await
            .map_err(|e| StatusError(e.to_string()))?;
        send_msg(&mut send, &ControlRequest::Status, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| StatusError(e.to_string()))?;
        let reply = recv_msg::<ControlReply>(&mut recv, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| StatusError(e.to_string()))?;
        let _ = send.finish();
        pc.connection.close(quinn::VarInt::from_u32(0), b"done");
        match reply {
            ControlReply::Members {
                version,
                head,
                members,
            } => Ok(Table {
                version,
                head,
                members,
            }),
            other => Err(StatusError(format!("unexpected reply: {other:?}"))),
        }
    }
    .await;
    endpoint.wait_idle().await;
    result
}

/// The status query failed.
#[derive(Debug, thiserror::Error)]
#[error("NODE-STATUS-001: cannot read cluster status: {0}")]
pub struct StatusError(pub String);
