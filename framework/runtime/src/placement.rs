//! The head's placement service: the [`Groups`] machine behind an
//! async shell that carries its ledger operations to the nodes and
//! answers requests from the whole cluster.
//!
//! ```text
//! Placement requests (control streams, this node) ─┐
//! member joins (what each node holds) ─────────────┼─► Groups (proto) ─► ledger ops
//! member table watch, timer ───────────────────────┘        │
//!     this node's ops ─► its own Reservations                │
//!     a member's ops ─► its Link: one control stream, ops pipelined,
//!                       replies in order back to Groups::replied
//! ```
//!
//! Each member's operations go in order on one stream, so a release sent
//! after a prepare is applied after it. A stream that breaks fails every
//! operation still waiting on it, and the next operation dials again.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::control::{ControlReply, ControlRequest, PlacementReply, PlacementRequest};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::groups::{Action, GroupState, GroupView, Groups, GroupsConfig, Tag};
use flotilla_proto::hello::Purpose;
use flotilla_proto::ledger::{Held, LedgerOp, LedgerReply};
use flotilla_transport::handshake::{self, Frames, send_msg};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::{now, sleep_until};
use crate::identity::Identity;
use crate::pool::Pool;
use crate::reservations::Reservations;
use crate::table::Table;

/// How long dialling a member for its ledger may take.
const DIAL: Duration = Duration::from_secs(2);

enum Command {
    Request {
        peer: String,
        request: PlacementRequest,
        reply: oneshot::Sender<PlacementReply>,
    },
    Report {
        node: String,
        incarnation: u64,
        held: Vec<Held>,
    },
    Replied {
        node: String,
        tag: Tag,
        reply: Result<LedgerReply, String>,
    },
}

/// A handle on the head's placement service.
#[derive(Clone)]
pub(crate) struct PlacementHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl PlacementHandle {
    /// Serves a request from `peer` (a certificate name); a wait is
    /// answered with the group as it is at its timeout.
    pub(crate) async fn request(&self, peer: &str, request: PlacementRequest) -> PlacementReply {
        let timeout = match &request {
            PlacementRequest::Wait { timeout_ms, .. } => Some(Duration::from_millis(*timeout_ms)),
            _ => None,
        };
        let id = match &request {
            PlacementRequest::Wait { id, .. } => Some(id.clone()),
            _ => None,
        };
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.send(Command::Request {
            peer: peer.to_owned(),
            request,
            reply,
        });
        if sent.is_err() {
            return PlacementReply::NotHead;
        }
        match timeout {
            None => rx.await.unwrap_or(PlacementReply::NotHead),
            Some(t) => match tokio::time::timeout(t, rx).await {
                Ok(r) => r.unwrap_or(PlacementReply::NotHead),
                Err(_) => {
                    let id = id.unwrap_or_default();
                    Box::pin(self.request(peer, PlacementRequest::Get { id })).await
                }
            },
        }
    }

    /// What a member that just joined holds.
    pub(crate) fn report(&self, node: String, incarnation: u64, held: Vec<Held>) {
        let _ = self.tx.send(Command::Report {
            node,
            incarnation,
            held,
        });
    }
}

struct Waiter {
    after: Option<u64>,
    reply: oneshot::Sender<PlacementReply>,
}

impl Waiter {
    fn satisfied(&self, view: &GroupView) -> bool {
        view.state == GroupState::Failed
            || (view.state == GroupState::Ready && self.after.is_none_or(|r| view.revision > r))
    }
}

/// A member's ledger link.
struct Link {
    incarnation: u64,
    ops: mpsc::UnboundedSender<(LedgerOp, Tag)>,
}

/// The service's state, owned by its task.
pub(crate) struct PlacementService {
    groups: Groups,
    identity: Arc<Identity>,
    pool: Arc<Pool>,
    view: watch::Receiver<Table>,
    ledger: Reservations,
    rx: mpsc::UnboundedReceiver<Command>,
    tx: mpsc::UnboundedSender<Command>,
    links: HashMap<String, Link>,
    waiters: HashMap<String, Vec<Waiter>>,
}

impl PlacementService {
    /// The service of the head `identity`, and a handle on it.
    pub(crate) fn new(
        identity: Arc<Identity>,
        pool: Arc<Pool>,
        view: watch::Receiver<Table>,
        ledger: Reservations,
        config: GroupsConfig,
    ) -> (Self, PlacementHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let prefix = format!("pg{:x}", identity.incarnation());
        let service = Self {
            groups: Groups::new(prefix, config),
            identity,
            pool,
            view,
            ledger,
            rx,
            tx: tx.clone(),
            links: HashMap::new(),
            waiters: HashMap::new(),
        };
        (service, PlacementHandle { tx })
    }

    /// Runs until `stop`.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut out = Vec::new();
        self.members_changed(&mut out);
        loop {
            self.groups.step(now(), &mut out);
            self.execute(&mut out);
            let wake = self.groups.poll_timeout();
            tokio::select! {
                cmd = self.rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    // A request sent after its sender saw a member up is
                    // placed knowing that member, even when the table's
                    // change and the request are ready at once.
                    if self.view.has_changed().unwrap_or(false) {
                        self.members_changed(&mut out);
                    }
                    self.handle(cmd, &mut out);
                    // Take what else is queued before the next pass.
                    while let Ok(cmd) = self.rx.try_recv() {
                        self.handle(cmd, &mut out);
                        if out.len() > 1024 {
                            break;
                        }
                    }
                }
                changed = self.view.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.members_changed(&mut out);
                }
                () = sleep_until(wake) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    fn members_changed(&mut self, out: &mut Vec<Action>) {
        let table = self.view.borrow_and_update().clone();
        self.groups.set_members(&table.members, out);
        // Links of members gone or restarted are dropped.
        self.links.retain(|name, link| {
            table
                .up()
                .any(|m| m.name == *name && m.incarnation == link.incarnation)
        });
    }

    fn handle(&mut self, cmd: Command, out: &mut Vec<Action>) {
        match cmd {
            Command::Request {
                peer,
                request,
                reply,
            } => self.request(peer, request, reply, out),
            Command::Report {
                node,
                incarnation,
                held,
            } => self.groups.report(now(), &node, incarnation, held, out),
            Command::Replied { node, tag, reply } => {
                self.groups.replied(now(), &node, tag, reply, out);
            }
        }
    }

    fn request(
        &mut self,
        peer: String,
        request: PlacementRequest,
        reply: oneshot::Sender<PlacementReply>,
        out: &mut Vec<Action>,
    ) {
        let answer = match request {
            PlacementRequest::Create { spec, incarnation } => {
                match self.groups.create(now(), spec, Some((peer, incarnation))) {
                    Ok(id) => PlacementReply::Created(id),
                    Err(e) => PlacementReply::Invalid(e.to_string()),
                }
            }
            PlacementRequest::Remove { id } => {
                PlacementReply::Removed(self.groups.remove(&id, out))
            }
            PlacementRequest::Get { id } => PlacementReply::Group(self.groups.view(&id)),
            PlacementRequest::List => PlacementReply::Groups {
                groups: self.groups.views(),
                nodes: self.groups.accounts(),
            },
            PlacementRequest::Wait {
                id, after_revision, ..
            } => {
                let waiter = Waiter {
                    after: after_revision,
                    reply,
                };
                match self.groups.view(&id) {
                    Some(v) if !waiter.satisfied(&v) => {
                        self.waiters.entry(id).or_default().push(waiter);
                    }
                    v => {
                        let _ = waiter.reply.send(PlacementReply::Group(v));
                    }
                }
                return;
            }
        };
        let _ = reply.send(answer);
    }

    /// Carries out the machine's actions; this node's own ledger answers
    /// at once.
    fn execute(&mut self, out: &mut Vec<Action>) {
        while !out.is_empty() {
            for action in std::mem::take(out) {
                match action {
                    Action::Send { node, op, tag } if node == self.identity.name => {
                        let reply = self.ledger.apply(op);
                        self.groups.replied(now(), &node, tag, Ok(reply), out);
                    }
                    Action::Send { node, op, tag } => self.send(node, op, tag),
                    Action::Changed(id) => self.wake(&id, false),
                    Action::Removed(id) => self.wake(&id, true),
                }
            }
        }
    }

    fn wake(&mut self, id: &str, removed: bool) {
        let view = if removed { None } else { self.groups.view(id) };
        let Some(waiting) = self.waiters.remove(id) else {
            return;
        };
        let mut keep = Vec::new();
        for w in waiting {
            match &view {
                Some(v) if !w.satisfied(v) => {
                    if !w.reply.is_closed() {
                        keep.push(w);
                    }
                }
                v => {
                    let _ = w.reply.send(PlacementReply::Group(v.clone()));
                }
            }
        }
        if !keep.is_empty() {
            self.waiters.insert(id.to_owned(), keep);
        }
    }

    fn send(&mut self, node: String, op: LedgerOp, tag: Tag) {
        let member = self
            .view
            .borrow()
            .up()
            .find(|m| m.name == node)
            .map(|m| (m.incarnation, m.addr.parse::<SocketAddr>()));
        let Some((incarnation, Ok(addr))) = member else {
            let _ = self.tx.send(Command::Replied {
                node,
                tag,
                reply: Err("not up".into()),
            });
            return;
        };
        let link = self.links.entry(node.clone()).or_insert_with(|| {
            let (ops, rx) = mpsc::unbounded_channel();
            tokio::spawn(run_link(
                node.clone(),
                addr,
                Arc::clone(&self.pool),
                Arc::clone(&self.identity),
                rx,
                self.tx.clone(),
            ));
            Link { incarnation, ops }
        });
        if let Err(mpsc::error::SendError((_, tag))) = link.ops.send((op, tag)) {
            self.links.remove(&node);
            let _ = self.tx.send(Command::Replied {
                node,
                tag,
                reply: Err("link closed".into()),
            });
        }
    }
}

/// One member's ledger link: operations in order on one control stream,
/// replies matched in order.
async fn run_link(
    node: String,
    addr: SocketAddr,
    pool: Arc<Pool>,
    identity: Arc<Identity>,
    mut ops: mpsc::UnboundedReceiver<(LedgerOp, Tag)>,
    back: mpsc::UnboundedSender<Command>,
) {
    let fail = |tag: Tag, why: &str| {
        let _ = back.send(Command::Replied {
            node: node.clone(),
            tag,
            reply: Err(why.to_owned()),
        });
    };
    let mut stream: Option<Opened> = None;
    let mut pending: VecDeque<Tag> = VecDeque::new();
    loop {
        let waiting = !pending.is_empty();
        tokio::select! {
            op = ops.recv() => {
                let Some((op, tag)) = op else {
                    for t in pending.drain(..) {
                        fail(t, "link closed");
                    }
                    return;
                };
                if stream.is_none() {
                    match tokio::time::timeout(DIAL, dial(&pool, &identity, &node, addr)).await {
                        Ok(Ok(s)) => stream = Some(s),
                        Ok(Err(why)) => {
                            tracing::debug!(%node, %why, "cannot reach a member's ledger");
                            fail(tag, &why);
                            continue;
                        }
                        Err(_) => {
                            fail(tag, "timed out dialling");
                            continue;
                        }
                    }
                }
                let Some((send, _)) = stream.as_mut() else { continue };
                match send_msg(send, &ControlRequest::Ledger(op), DEFAULT_MAX_FRAME).await {
                    Ok(()) => pending.push_back(tag),
                    Err(e) => {
                        fail(tag, &e.to_string());
                        for t in pending.drain(..) {
                            fail(t, "stream broke");
                        }
                        stream = None;
                    }
                }
            }
            reply = next_reply(&mut stream, waiting) => {
                match reply.flatten() {
                    Some(r) => {
                        if let Some(tag) = pending.pop_front() {
                            let _ = back.send(Command::Replied { node: node.clone(), tag, reply: Ok(r) });
                        }
                    }
                    None => {
                        for t in pending.drain(..) {
                            fail(t, "stream broke");
                        }
                        stream = None;
                    }
                }
            }
        }
    }
}

/// The next reply on `stream`, once one is awaited.
async fn next_reply(stream: &mut Option<Opened>, waiting: bool) -> Option<Option<LedgerReply>> {
    match stream.as_mut() {
        Some((_, replies)) if waiting => replies.recv().await,
        _ => std::future::pending().await,
    }
}

type Opened = (
    quinn::SendStream,
    mpsc::UnboundedReceiver<Option<LedgerReply>>,
);

/// Opens a control stream to `node` and a task reading its replies.
async fn dial(
    pool: &Pool,
    identity: &Identity,
    node: &str,
    addr: SocketAddr,
) -> Result<Opened, String> {
    let pc = pool
        .connect(Some(node), addr)
        .await
        .map_err(|e| e.to_string())?;
    let hello = identity.hello(Purpose::Control);
    let (send, recv, _, _) = handshake::dial(&pc.connection, &hello)
        .await
        .map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut replies = Frames::<ControlReply>::new(recv, DEFAULT_MAX_FRAME);
        while let Some(reply) = replies.next().await {
            let r = match reply {
                Ok(ControlReply::Ledger(r)) => Some(r),
                _ => None,
            };
            let end = r.is_none();
            if tx.send(r).is_err() || end {
                return;
            }
        }
        let _ = tx.send(None);
    });
    Ok((send, rx))
}
