//! Serving a control stream accepted by this node: on the head, through
//! the head service and a [`HeadSession`] per stream; on any other node,
//! status requests only (joins are for the head). On every node, stop
//! requests for its actors, passed to its spawner with the stream's
//! certificate name for the authority check.
//!
//! ```text
//! Frames<ControlRequest> ─► HeadSession::handle_request ─► reply
//! table watch / push timer ─► HeadSession::poll_push ─► Changes
//! Stop{name} ─► spawner (sender = the stream's certificate name) ─► Stop(outcome)
//! ```

use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::control::{ControlReply, ControlRequest, PlacementReply};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::head::{HeadSession, Noted};
use flotilla_proto::hello::Refusal;
use flotilla_proto::jobs::JobsReply;
use flotilla_proto::ledger::LedgerReply;
use flotilla_transport::handshake::{Frames, StreamError, send_msg};
use quinn::{RecvStream, SendStream};
use ractor::ActorRef;
use tokio::sync::watch;

use crate::board::Board;
use crate::call::call;
use crate::clock::{now, sleep_until};
use crate::head::HeadService;
use crate::jobs_slot::JobsSlot;
use crate::placement::PlacementHandle;
use crate::reservations::Reservations;
use crate::spawner::{LocalStop, SpawnerMsg, StopReply};
use crate::table::Table;

/// What answers control streams on this node.
#[derive(Clone)]
pub(crate) struct ControlService {
    /// The head service, on the head.
    pub(crate) head: Option<Arc<HeadService>>,
    /// This node's view of the table.
    pub(crate) view: watch::Receiver<Table>,
    /// This node's spawner, for stop requests.
    pub(crate) spawner: ActorRef<SpawnerMsg>,
    /// This node's supervisors, for status requests.
    pub(crate) board: Board,
    /// This node's GPUs and their holders, for status requests.
    pub(crate) gpus: crate::gpus::GpuSlots,
    /// This node's reservations, which the head changes.
    pub(crate) ledger: Reservations,
    /// The placement service, on the head.
    pub(crate) placement: Option<PlacementHandle>,
    /// The jobs service, once the head serves jobs.
    pub(crate) jobs: JobsSlot,
    /// This node's object store, for its counters.
    pub(crate) objects: flotilla_objects::Store,
}

/// How long the spawner may take to answer a stop request.
const STOP_ANSWER: Duration = Duration::from_secs(5);

fn members_reply(table: &Table) -> ControlReply {
    ControlReply::Members {
        version: table.version,
        head: table.head.clone(),
        members: table.members.clone(),
    }
}

impl ControlService {
    /// Serves one control stream accepted from `peer` (its certificate
    /// name) until it ends.
    pub(crate) async fn serve(
        &self,
        peer: String,
        mut send: SendStream,
        recv: RecvStream,
    ) -> Result<(), StreamError> {
        let mut requests = Frames::<ControlRequest>::new(recv, DEFAULT_MAX_FRAME);
        match &self.head {
            None => {
                while let Some(request) = requests.next().await {
                    let request = request?;
                    let reply = match request {
                        ControlRequest::Supervisors
                        | ControlRequest::Objects
                        | ControlRequest::Gpus => self.own_state(&request),
                        ControlRequest::Status => members_reply(&self.view.borrow()),
                        ControlRequest::Leave { .. } => ControlReply::Ack,
                        ControlRequest::Stop { name } => match self.stop(&peer, name).await {
                            Some(reply) => reply,
                            None => return Ok(()),
                        },
                        ControlRequest::Join(_) | ControlRequest::Heartbeat { .. } => {
                            ControlReply::Refused(Refusal::NotHead)
                        }
                        ControlRequest::Placement(_) => {
                            ControlReply::Placement(PlacementReply::NotHead)
                        }
                        ControlRequest::Ledger(op) => {
                            ControlReply::Ledger(self.ledger_op(&peer, op))
                        }
                        ControlRequest::Jobs(_) => ControlReply::Jobs(JobsReply::NotServed),
                    };
                    send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                }
                Ok(())
            }
            Some(head) => {
                let mut session = HeadSession::new(head.name(), peer.clone());
                let mut view = head.watch();
                loop {
                    let push_at = head.with(|m| session.poll_timeout(m));
                    tokio::select! {
                        request = requests.next() => {
                            let Some(request) = request else { return Ok(()) };
                            let request = request?;
                            if let ControlRequest::Stop { name } = request {
                                let Some(reply) = self.stop(&peer, name).await else {
                                    return Ok(());
                                };
                                send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                                continue;
                            }
                            let request = match request {
                                ControlRequest::Supervisors | ControlRequest::Objects | ControlRequest::Gpus => {
                                    let reply = self.own_state(&request);
                                    send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                                    continue;
                                }
                                ControlRequest::Placement(request) => {
                                    let reply = match &self.placement {
                                        Some(p) => p.request(&peer, request).await,
                                        None => PlacementReply::NotHead,
                                    };
                                    send_msg(&mut send, &ControlReply::Placement(reply), DEFAULT_MAX_FRAME).await?;
                                    continue;
                                }
                                ControlRequest::Jobs(request) => {
                                    let reply = ControlReply::Jobs(self.jobs.request(request).await);
                                    send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                                    continue;
                                }
                                ControlRequest::Ledger(_) => {
                                    // The head's own ledger is changed in-process only.
                                    let reply = ControlReply::Ledger(LedgerReply::NotHead);
                                    send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                                    continue;
                                }
                                request => request,
                            };
                            let held = match &request {
                                ControlRequest::Join(j) => Some(j.held.clone()),
                                _ => None,
                            };
                            let (reply, noted) = head.with(|m| session.handle_request(now(), request, m));
                            if let (Noted::Joined(node, incarnation), Some(held), Some(p)) =
                                (&noted, held, &self.placement)
                            {
                                p.report(node.clone(), *incarnation, held);
                            }
                            log(&noted);
                            if let Some(reply) = reply {
                                send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                            }
                        }
                        changed = view.changed() => {
                            if changed.is_err() {
                                return Ok(());
                            }
                        }
                        () = sleep_until(push_at) => {}
                    }
                    if let Some(push) = head.with(|m| session.poll_push(now(), m)) {
                        send_msg(&mut send, &push, DEFAULT_MAX_FRAME).await?;
                    }
                }
            }
        }
    }
}

impl ControlService {
    /// The answer to a request about this node's own state (its
    /// supervisors, object store or GPUs), which every node serves alike.
    /// Both loops pass only those three; anything else is refused.
    fn own_state(&self, request: &ControlRequest) -> ControlReply {
        match request {
            ControlRequest::Supervisors => ControlReply::Supervisors(self.board.reports()),
            ControlRequest::Objects => ControlReply::Objects(self.objects.stats()),
            ControlRequest::Gpus => ControlReply::Gpus(self.gpus.report()),
            _ => ControlReply::Refused(Refusal::NotHead),
        }
    }

    /// Applies an operation of the head on this node's reservations;
    /// refused from anyone else.
    fn ledger_op(&self, peer: &str, op: flotilla_proto::ledger::LedgerOp) -> LedgerReply {
        if peer != self.view.borrow().head {
            crate::counters::authority_refused("ledger");
            tracing::warn!(%peer, "refused a reservation change from a node that is not the head");
            return LedgerReply::NotHead;
        }
        self.ledger.apply(op)
    }

    /// Passes a stop request from `peer` to the spawner; `None` when the
    /// spawner does not answer (the node is stopping), which ends the
    /// stream.
    async fn stop(&self, peer: &str, name: String) -> Option<ControlReply> {
        let req = LocalStop {
            name,
            sender: Some(peer.to_owned()),
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
}

fn log(noted: &Noted) {
    match noted {
        Noted::Nothing => {}
        Noted::Joined(node, incarnation) => {
            tracing::info!(%node, incarnation, "member joined");
        }
        Noted::JoinRefused(node, refusal) => {
            tracing::warn!(%node, %refusal, "join refused");
        }
        Noted::NotUp(node, outcome) => {
            tracing::warn!(%node, ?outcome, "heartbeat from a member that is not up; asking it to rejoin");
        }
        Noted::Left(node) => tracing::info!(%node, "member left"),
    }
}
