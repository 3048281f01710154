//! Serving a control stream accepted by this node: on the head, through
//! the head service and a [`HeadSession`] per stream; on any other node,
//! status requests only (joins are for the head).
//!
//! ```text
//! Frames<ControlRequest> ─► HeadSession::handle_request ─► reply
//! table watch / push timer ─► HeadSession::poll_push ─► Changes
//! ```

use std::sync::Arc;

use flotilla_proto::control::{ControlReply, ControlRequest};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::head::{HeadSession, Noted};
use flotilla_proto::hello::Refusal;
use flotilla_transport::handshake::{Frames, StreamError, send_msg};
use quinn::{RecvStream, SendStream};
use tokio::sync::watch;

use crate::clock::{now, sleep_until};
use crate::head::HeadService;
use crate::table::Table;

/// What answers control streams on this node.
#[derive(Clone)]
pub(crate) enum ControlService {
    /// The head: joins, heartbeats, leaves and status.
    Head(Arc<HeadService>),
    /// Any other node: status, from its own view of the table.
    Member(watch::Receiver<Table>),
}

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
        match self {
            Self::Member(view) => {
                while let Some(request) = requests.next().await {
                    let reply = match request? {
                        ControlRequest::Status => members_reply(&view.borrow()),
                        ControlRequest::Leave { .. } => ControlReply::Ack,
                        ControlRequest::Join(_) | ControlRequest::Heartbeat { .. } => {
                            ControlReply::Refused(Refusal::NotHead)
                        }
                    };
                    send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                }
                Ok(())
            }
            Self::Head(head) => {
                let mut session = HeadSession::new(head.name(), peer);
                let mut view = head.watch();
                loop {
                    let push_at = head.with(|m| session.poll_timeout(m));
                    tokio::select! {
                        request = requests.next() => {
                            let Some(request) = request else { return Ok(()) };
                            let request = request?;
                            let (reply, noted) = head.with(|m| session.handle_request(now(), request, m));
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
