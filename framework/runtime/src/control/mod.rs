//! # Room `control/`: the control service and the status queries
//!
//! Owns the service behind every control stream a node accepts (this
//! file) and the client side of `node status` and its siblings
//! ([`status`], over [`client`]'s sessions), with their rendering ([`render`]). Drives
//! [`flotilla_proto::authority`] (the permission table) and
//! [`flotilla_proto::control`] (requests, replies, paging).
//!
//! May import: `net`, `head`, `remote`, `placement` and the shared files.
//!
//! Serving a control stream accepted by this node, on behalf of the caller
//! its hello proved (member name, incarnation, certificate role). Every
//! request is checked against the permission table
//! ([`flotilla_proto::authority`]) with that identity — never with a name
//! written in the request — and a refusal is a typed answer
//! ([`ControlReply::Denied`]) and a counter. On the head, joins,
//! heartbeats and leaves go through a [`HeadSession`] per stream, whose
//! table pushes follow the head's table; placement and jobs requests go
//! to their services with the caller. On every node: status, its own
//! state, spawns and stops of its actors, and (from the head only) changes
//! to its reservations.
//!
//! ```text
//! Frames<ControlRequest> ─► permission check (caller) ─► HeadSession / services ─► reply (in pages)
//! table watch / push timer ─► HeadSession::poll_push ─► Changes
//! Spawn / Stop ─► spawner (owner / sender = the caller) ─► Spawned / Stop(outcome)
//! ```

pub mod client;
mod query_error;
pub mod render;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::authority::{self, Unauthorized};
use flotilla_proto::control::{
    ControlReply, ControlRequest, HeardFrom, PlacementReply, fit_to_frame, paginate,
};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::head::{HeadSession, Noted};
use flotilla_proto::hello::Refusal;
use flotilla_proto::incarnation::MemberRef;
use flotilla_proto::ledger::LedgerReply;
use flotilla_transport::handshake::{Frames, StreamError, send_msg};
use quinn::{RecvStream, SendStream};
use ractor::ActorRef;
use tokio::sync::watch;

use crate::board::Board;
use crate::caller::Caller;
use crate::clock::{now, sleep_until};
use crate::head::HeadService;
use crate::jobs_slot::JobsSlot;
use crate::placement::PlacementHandle;
use crate::placement::reservations::Reservations;
use crate::remote::call::call;
use crate::remote::spawner::{LocalSpawn, LocalStop, SpawnerMsg, StopReply};
use crate::table::Table;

/// What answers control streams on this node.
#[derive(Clone)]
pub(crate) struct ControlService {
    /// The head service, on the head.
    pub(crate) head: Option<Arc<HeadService>>,
    /// This node's view of the table.
    pub(crate) view: watch::Receiver<Table>,
    /// This node's spawner, for spawn and stop requests.
    pub(crate) spawner: ActorRef<SpawnerMsg>,
    /// This node's supervisors, for status requests.
    pub(crate) board: Board,
    /// This node's GPUs and their holders, for status requests.
    pub(crate) gpus: crate::placement::gpus::GpuSlots,
    /// This node's reservations, which the head changes.
    pub(crate) ledger: Reservations,
    /// The placement service, on the head.
    pub(crate) placement: Option<PlacementHandle>,
    /// The jobs service, once the head serves jobs.
    pub(crate) jobs: JobsSlot,
    /// This node's object store, for its counters.
    pub(crate) objects: flotilla_objects::Store,
    /// The kinds only the head may spawn here.
    pub(crate) head_only: Arc<std::collections::HashSet<String>>,
}

/// How long the spawner may take to answer a stop request.
const STOP_ANSWER: Duration = Duration::from_secs(5);

/// How long a spawn (the actor's `pre_start`, a model load) may take.
const SPAWN_ANSWER: Duration = Duration::from_secs(300);

fn members_reply(table: &Table) -> ControlReply {
    ControlReply::Members {
        version: table.version,
        head: table.head.clone(),
        members: table.members.clone(),
        revoked: table.revoked.clone(),
        more: false,
    }
}

/// Counts and logs a refusal by the permission table; the answer to send.
fn denied(service: &'static str, caller: &Caller, why: Unauthorized) -> ControlReply {
    crate::counters::authority_refused(service, why.code());
    tracing::warn!(member = %caller.member, role = %caller.role, service, error = %why, "request refused");
    ControlReply::Denied(why)
}

/// Sends `reply`, a table in pages under the frame limit; a page over it
/// goes as [`ControlReply::TooLarge`] instead.
async fn send_paged(send: &mut SendStream, reply: ControlReply) -> Result<(), StreamError> {
    for page in paginate(reply) {
        let page = fit_to_frame(page, DEFAULT_MAX_FRAME);
        if let ControlReply::TooLarge { bytes, limit } = &page {
            tracing::warn!(
                bytes,
                limit,
                "NODE-STATUS-004: an answer over the frame limit was refused to its requester"
            );
        }
        send_msg(send, &page, DEFAULT_MAX_FRAME).await?;
    }
    Ok(())
}

impl ControlService {
    /// Serves one control stream from `caller` until it ends.
    pub(crate) async fn serve(
        &self,
        caller: Caller,
        mut send: SendStream,
        recv: RecvStream,
    ) -> Result<(), StreamError> {
        let mut requests = Frames::<ControlRequest>::new(recv, DEFAULT_MAX_FRAME);
        let mut session = self.head.as_ref().map(|h| {
            HeadSession::new(
                h.name(),
                caller.member.clone(),
                caller.incarnation,
                caller.role,
            )
        });
        let mut table = self.head.as_ref().map(|h| h.watch());
        loop {
            let push_at = match (&self.head, &session) {
                (Some(h), Some(s)) => h.with(|m| s.poll_timeout(m)),
                _ => None,
            };
            let changed = async {
                match table.as_mut() {
                    Some(t) => t.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                request = requests.next() => {
                    let Some(request) = request else { return Ok(()) };
                    match self.answer(&caller, request?, session.as_mut()).await {
                        Ok(Some(reply)) => send_paged(&mut send, reply).await?,
                        Ok(None) => {}
                        // The node is stopping.
                        Err(()) => return Ok(()),
                    }
                }
                alive = changed => if !alive { return Ok(()) },
                () = sleep_until(push_at) => {}
            }
            if let (Some(h), Some(s)) = (&self.head, session.as_mut())
                && let Some(push) = h.with(|m| s.poll_push(now(), m))
            {
                send_paged(&mut send, push).await?;
            }
        }
    }

    /// The answer to one request of `caller`: `None` for nothing to send
    /// (a live heartbeat), `Err` when the node is stopping.
    async fn answer(
        &self,
        caller: &Caller,
        request: ControlRequest,
        session: Option<&mut HeadSession>,
    ) -> Result<Option<ControlReply>, ()> {
        let sender = caller.sender();
        let reply = match request {
            ControlRequest::Status => match (&self.head, session) {
                (Some(h), Some(s)) => {
                    h.with(|m| s.handle_request(now(), ControlRequest::Status, m))
                        .0
                }
                _ => Some(members_reply(&self.view.borrow())),
            },
            ControlRequest::Supervisors | ControlRequest::Objects | ControlRequest::Gpus => {
                Some(match authority::may_read(sender) {
                    Ok(()) => self.own_state(&request),
                    Err(why) => denied("status", caller, why),
                })
            }
            ControlRequest::Heard => Some(match (authority::may_read(sender), &self.head) {
                (Err(why), _) => denied("status", caller, why),
                (Ok(()), Some(h)) => ControlReply::Heard(h.with(|m| {
                    let heard = m.heard(now()).into_iter();
                    heard
                        .map(|(name, ago)| HeardFrom {
                            name,
                            ms_ago: ago.as_millis() as u64,
                        })
                        .collect()
                })),
                (Ok(()), None) => ControlReply::Refused(Refusal::NotHead),
            }),
            ControlRequest::Stop { name } => Some(self.stop(caller, name).await.ok_or(())?),
            ControlRequest::Spawn(order) => Some(self.spawn(caller, order).await?),
            request @ (ControlRequest::Join(_)
            | ControlRequest::Heartbeat { .. }
            | ControlRequest::Leave { .. }
            | ControlRequest::Drain { .. }) => {
                // A member leaving a node that is not (or no longer) the
                // head has nothing to undo there: its leave is acknowledged.
                let leaving = matches!(request, ControlRequest::Leave { .. });
                let asked = match &request {
                    ControlRequest::Join(_) => "join",
                    ControlRequest::Heartbeat { .. } => "heartbeat",
                    ControlRequest::Drain { .. } => "drain",
                    _ => "leave",
                };
                let reply = match (&self.head, session) {
                    (Some(h), Some(s)) => self.membership(h, s, request),
                    _ if leaving => Some(ControlReply::Ack),
                    _ => Some(ControlReply::Refused(Refusal::NotHead)),
                };
                let reason = match &reply {
                    Some(ControlReply::Refused(refusal)) => Some(refusal.code()),
                    Some(ControlReply::NameTaken(_)) => Some("name_taken"),
                    Some(ControlReply::Denied(why)) => Some(why.code()),
                    _ => None,
                };
                if let Some(reason) = reason {
                    crate::counters::membership_refused(asked, reason);
                }
                reply
            }
            ControlRequest::Placement(request) => {
                Some(ControlReply::Placement(match &self.placement {
                    Some(p) => match p.request(caller, request).await {
                        Ok(reply) => reply,
                        Err(why) => return Ok(Some(denied("placement", caller, why))),
                    },
                    None => PlacementReply::NotHead,
                }))
            }
            ControlRequest::Ledger(op) => Some(if self.head.is_some() {
                // The head's own ledger is changed in-process only.
                ControlReply::Ledger(LedgerReply::NotHead)
            } else {
                let head = self.view.borrow().head.clone();
                match authority::may_change_ledger(sender, &head) {
                    Ok(()) => ControlReply::Ledger(self.ledger.apply(op)),
                    Err(why) => denied("ledger", caller, why),
                }
            }),
            ControlRequest::Jobs(request) => Some(match self.jobs.request(caller, request).await {
                Ok(reply) => ControlReply::Jobs(reply),
                Err(why) => denied("jobs", caller, why),
            }),
        };
        Ok(reply)
    }

    /// A join, heartbeat or leave on the head.
    fn membership(
        &self,
        head: &HeadService,
        session: &mut HeadSession,
        request: ControlRequest,
    ) -> Option<ControlReply> {
        let held = match &request {
            ControlRequest::Join(j) => Some(j.held.clone()),
            _ => None,
        };
        let (reply, noted) = head.with(|m| session.handle_request(now(), request, m));
        if let (Noted::Joined(member), Some(held), Some(p)) = (&noted, held, &self.placement) {
            p.report(member.name.clone(), member.incarnation, held);
        }
        log(&noted);
        reply
    }

    /// The answer to a request about this node's own state (its
    /// supervisors, object store or GPUs), which every node serves alike.
    fn own_state(&self, request: &ControlRequest) -> ControlReply {
        match request {
            ControlRequest::Supervisors => ControlReply::Supervisors(self.board.reports()),
            ControlRequest::Objects => ControlReply::Objects(self.objects.stats()),
            ControlRequest::Gpus => ControlReply::Gpus(self.gpus.report()),
            _ => ControlReply::Refused(Refusal::NotHead),
        }
    }

    /// Passes a stop request from `caller` to the spawner; `None` when the
    /// spawner does not answer (the node is stopping), which ends the
    /// stream.
    async fn stop(&self, caller: &Caller, name: String) -> Option<ControlReply> {
        let req = LocalStop {
            name,
            sender: Some((caller.member.to_string(), caller.role)),
            head: self.view.borrow().head.clone(),
        };
        call(
            &self.spawner,
            |port| SpawnerMsg::Stop(req, port),
            STOP_ANSWER,
        )
        .await
        .ok()
        .map(|StopReply(outcome)| ControlReply::Stop(outcome))
    }

    /// Passes a spawn request from `caller` to the spawner, the caller as
    /// the actor's owner; `Err` when the spawner does not answer.
    async fn spawn(
        &self,
        caller: &Caller,
        order: flotilla_proto::control::SpawnOrder,
    ) -> Result<ControlReply, ()> {
        if let Err(why) = authority::may_spawn(caller.sender()) {
            return Ok(denied("spawn", caller, why));
        }
        if caller.incarnation.is_tool() {
            // A tool is no member: nothing would stop its actors.
            return Ok(denied("spawn", caller, Unauthorized::NotMember));
        }
        // The owner must be the member the table shows, at that
        // incarnation: an older process, or one that is no member, owns
        // nothing here.
        if !crate::net::gate::is_up(&self.view, &caller.member, caller.incarnation).await {
            return Ok(denied("spawn", caller, Unauthorized::NotMember));
        }
        if self.head_only.contains(&order.kind) {
            let head = self.view.borrow().head.clone();
            if let Err(why) = authority::may_spawn_head_only(caller.sender(), &head) {
                return Ok(denied("spawn", caller, why));
            }
        }
        let req = LocalSpawn {
            order,
            owner: MemberRef::new(caller.member.clone(), caller.incarnation),
        };
        call(
            &self.spawner,
            |port| SpawnerMsg::Spawn(req, port),
            SPAWN_ANSWER,
        )
        .await
        .map(ControlReply::Spawned)
        .map_err(|_| ())
    }
}

fn log(noted: &Noted) {
    match noted {
        Noted::Nothing => {}
        Noted::Joined(member) => {
            tracing::info!(node = %member.name, incarnation = %member.incarnation, "member joined");
        }
        Noted::JoinRefused(node, refusal) => {
            tracing::warn!(%node, %refusal, "join refused");
        }
        Noted::NameTaken(holder) => {
            tracing::warn!(%holder, "join refused: the name is a live member's");
        }
        Noted::NotUp(node, outcome) => {
            tracing::warn!(%node, ?outcome, "heartbeat from a member that is not up; asking it to rejoin");
        }
        Noted::Left(node) => tracing::info!(%node, "member left"),
        Noted::Draining(node) => {
            tracing::info!(%node, "member draining: it takes no new work, its bundles are placed again")
        }
    }
}
