//! # Room `placement/`: resources, groups and their ledger
//!
//! Owns the head's placement service (this file), every node's ledger of
//! reserved bundles ([`reservations`]) and the GPUs a node detects and
//! hands out ([`gpus`]). Drives [`flotilla_proto::groups`] and
//! [`flotilla_proto::ledger`].
//!
//! May import: `head` (the store groups are written to), `net` (links to
//! members) and the shared files.
//!
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
//!
//! Given the head's store ([`HeadStore`]), every group is written there
//! before its creation is answered, again each time it becomes ready
//! (where its bundles are), and removed with it; a head started again on
//! the store takes its groups back ([`Groups::restore`]).
//!
//! Requests are judged by who sent them ([`Caller`]): a group is created
//! owned by its caller's member name and incarnation, removed only by its
//! owner, an admin or the head. Every record the head hands a member is
//! sealed with a key derived from the head's certificate key; what a
//! member reports holding is adopted only if its seal checks, so no member
//! can make the head adopt a group it never created.

pub mod gpus;
pub(crate) mod reservations;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::authority::{self, Unauthorized};
use flotilla_proto::control::{ControlReply, ControlRequest, PlacementReply, PlacementRequest};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::groups::{
    Action, GroupState, GroupView, Groups, GroupsConfig, StoredGroup, Tag,
};
use flotilla_proto::hello::Purpose;
use flotilla_proto::incarnation::{Incarnation, MemberRef};
use flotilla_proto::ledger::{GroupRecord, Held, LedgerOp, LedgerReply};
use flotilla_proto::role::principal_of;
use flotilla_transport::handshake::{self, Frames, send_msg};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::caller::{Caller, sender_of};
use crate::clock::{clock_millis, now, sleep_until};
use crate::head::head_store::HeadStore;
use crate::identity::Identity;
use crate::net::pool::Pool;
use crate::placement::reservations::Reservations;
use crate::table::Table;
use flotilla_proto::ids::{GroupId, MemberName};

/// How long dialling a member for its ledger may take.
const DIAL: Duration = Duration::from_secs(2);

type Answer = Result<PlacementReply, Unauthorized>;

enum Command {
    Request {
        /// Who asked (`None`: this node).
        caller: Option<Caller>,
        request: PlacementRequest,
        reply: oneshot::Sender<Answer>,
    },
    Report {
        node: MemberName,
        incarnation: Incarnation,
        held: Vec<Held>,
    },
    Replied {
        node: MemberName,
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
    /// Serves a request of `caller`; a wait is answered with the group as
    /// it is at its timeout.
    pub(crate) async fn request(&self, caller: &Caller, request: PlacementRequest) -> Answer {
        self.request_as(Some(caller.clone()), request).await
    }

    /// Serves a request of `caller` (`None`: this node itself); a wait is
    /// answered with the group as it is at its timeout.
    pub(crate) async fn request_as(
        &self,
        caller: Option<Caller>,
        request: PlacementRequest,
    ) -> Answer {
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
            caller: caller.clone(),
            request,
            reply,
        });
        if sent.is_err() {
            return Ok(PlacementReply::NotHead);
        }
        match timeout {
            None => rx.await.unwrap_or(Ok(PlacementReply::NotHead)),
            Some(t) => match tokio::time::timeout(t, rx).await {
                Ok(r) => r.unwrap_or(Ok(PlacementReply::NotHead)),
                Err(_) => {
                    let id = id.unwrap_or_default();
                    Box::pin(self.request_as(caller, PlacementRequest::Get { id })).await
                }
            },
        }
    }

    /// What a member that just joined holds.
    pub(crate) fn report(&self, node: MemberName, incarnation: Incarnation, held: Vec<Held>) {
        let _ = self.tx.send(Command::Report {
            node,
            incarnation,
            held,
        });
    }
}

struct Waiter {
    after: Option<u64>,
    reply: oneshot::Sender<Answer>,
    /// The certificate of the member waiting (`None`: this node).
    principal: Option<String>,
}

/// Most waits on groups one certificate may have open at the head.
pub const MAX_WAITERS_PER_PRINCIPAL: usize = 256;

impl Waiter {
    fn satisfied(&self, view: &GroupView) -> bool {
        view.state == GroupState::Failed
            || (view.state == GroupState::Ready && self.after.is_none_or(|r| view.revision > r))
    }
}

/// A member's ledger link.
struct Link {
    incarnation: Incarnation,
    ops: mpsc::UnboundedSender<(LedgerOp, Tag)>,
}

/// What the head's placement service is handed by the node.
pub(crate) struct PlacementParts {
    /// The head's identity.
    pub(crate) identity: Arc<Identity>,
    /// Connections to members, for their ledger links.
    pub(crate) pool: Arc<Pool>,
    /// The member table.
    pub(crate) view: watch::Receiver<Table>,
    /// The head's own ledger.
    pub(crate) ledger: Reservations,
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
    links: HashMap<MemberName, Link>,
    waiters: HashMap<GroupId, Vec<Waiter>>,
    /// The key records are sealed with.
    seal_key: [u8; 32],
    /// Where groups are kept across restarts of the head.
    store: Option<Arc<HeadStore>>,
}

impl PlacementService {
    /// The service of the head `identity`, and a handle on it; with a
    /// store, the groups it held (read from it) are taken back.
    pub(crate) fn new(
        parts: PlacementParts,
        config: GroupsConfig,
        seal_key: [u8; 32],
        stored: Option<(Arc<HeadStore>, Vec<StoredGroup>)>,
    ) -> (Self, PlacementHandle) {
        let PlacementParts {
            identity,
            pool,
            view,
            ledger,
        } = parts;
        let (tx, rx) = mpsc::unbounded_channel();
        let prefix = format!("pg{:x}", identity.incarnation());
        let mut groups = Groups::new(prefix, config);
        let (store, stored) = match stored {
            Some((store, groups)) => (Some(store), groups),
            None => (None, Vec::new()),
        };
        let (at, wall) = (now(), clock_millis());
        for g in stored {
            let id = g.id.clone();
            let remaining = Duration::from_millis(g.deadline_unix_ms.saturating_sub(wall));
            match groups.restore(at, g, remaining) {
                Ok(()) => tracing::info!(group = %id, "placement group taken back from the store"),
                Err(why) => {
                    tracing::error!(group = %id, error = %why, "a stored placement group cannot be taken back; forgotten");
                    if let Some(store) = &store
                        && let Err(e) = store.remove_group(&id)
                    {
                        tracing::error!(group = %id, error = %e, "cannot forget the group on disk");
                    }
                }
            }
        }
        let service = Self {
            groups,
            identity,
            pool,
            view,
            ledger,
            rx,
            tx: tx.clone(),
            links: HashMap::new(),
            waiters: HashMap::new(),
            seal_key,
            store,
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
                caller,
                request,
                reply,
            } => self.request(caller, request, reply, out),
            Command::Report {
                node,
                incarnation,
                held,
            } => {
                let held = self.checked(&node, held);
                self.groups.report(now(), &node, incarnation, held, out);
            }
            Command::Replied { node, tag, reply } => {
                self.groups.replied(now(), &node, tag, reply, out);
            }
        }
    }

    /// What a member reports holding, less the records whose seal does
    /// not check (refused, counted, and released on the member).
    fn checked(&mut self, node: &str, held: Vec<Held>) -> Vec<Held> {
        let (good, forged): (Vec<Held>, Vec<Held>) = held
            .into_iter()
            .partition(|h| seal_checks(&self.seal_key, &h.record));
        for h in forged {
            let why = Unauthorized::UnknownGroup;
            crate::counters::authority_refused("placement", why.code());
            tracing::warn!(%node, group = %h.record.id, error = %why, "a reported group's seal does not check; not adopted");
            self.send(
                MemberName::from(node),
                LedgerOp::Release {
                    group: h.record.id,
                    bundles: Vec::new(),
                },
                Tag::Release,
            );
        }
        good
    }

    fn request(
        &mut self,
        caller: Option<Caller>,
        request: PlacementRequest,
        reply: oneshot::Sender<Answer>,
        out: &mut Vec<Action>,
    ) {
        let sender = sender_of(caller.as_ref());
        let answer = match request {
            PlacementRequest::Create { spec } => {
                if let Err(why) = authority::may_create_group(sender) {
                    let _ = reply.send(Err(why));
                    return;
                }
                if spec.detached
                    && let Err(why) = authority::may_create_detached_group(sender)
                {
                    let _ = reply.send(Err(why));
                    return;
                }
                let owner = match &caller {
                    None => MemberRef::new(self.identity.name.clone(), self.identity.incarnation()),
                    // A tool is no member: nothing would remove its group.
                    Some(c) if c.incarnation.is_tool() => {
                        let _ = reply.send(Err(Unauthorized::NotMember));
                        return;
                    }
                    Some(c) => MemberRef::new(c.member.clone(), c.incarnation),
                };
                let deadline = clock_millis().saturating_add(spec.timeout_ms);
                match self.groups.create(now(), spec, Some(owner)) {
                    Ok(id) => match self.record(&id, deadline) {
                        Ok(()) => PlacementReply::Created(id),
                        Err(e) => {
                            // Not answered as created: nothing of it stays.
                            self.groups.remove(&id, out);
                            PlacementReply::Invalid(format!(
                                "NODE-STORE-002: the head could not record the group: {e}"
                            ))
                        }
                    },
                    Err(e) => PlacementReply::Invalid(e.to_string()),
                }
            }
            PlacementRequest::Remove { id } => {
                if let Some(view) = self.groups.view(&id)
                    && let Err(why) = authority::may_remove_group(sender, view.owner.as_deref())
                {
                    let _ = reply.send(Err(why));
                    return;
                }
                PlacementReply::Removed(self.groups.remove(&id, out))
            }
            PlacementRequest::Grow { id, bundle, avoid } => {
                if let Some(view) = self.groups.view(&id)
                    && let Err(why) = authority::may_remove_group(sender, view.owner.as_deref())
                {
                    let _ = reply.send(Err(why));
                    return;
                }
                match self.groups.grow(&id, bundle, &avoid) {
                    Ok(b) => PlacementReply::Grown(b),
                    Err(why) => PlacementReply::NotGrown(why.to_string()),
                }
            }
            PlacementRequest::Shrink { id, bundle } => {
                if let Some(view) = self.groups.view(&id)
                    && let Err(why) = authority::may_remove_group(sender, view.owner.as_deref())
                {
                    let _ = reply.send(Err(why));
                    return;
                }
                PlacementReply::Shrunk(self.groups.shrink(&id, bundle, out))
            }
            PlacementRequest::Get { id } => PlacementReply::Group(self.groups.view(&id)),
            PlacementRequest::List => PlacementReply::Groups {
                groups: self.groups.views(),
                nodes: self.groups.accounts(),
            },
            PlacementRequest::Wait {
                id, after_revision, ..
            } => {
                if let Err(why) = authority::may_read(sender) {
                    let _ = reply.send(Err(why));
                    return;
                }
                let waiter = Waiter {
                    after: after_revision,
                    reply,
                    principal: caller.as_ref().map(|c| principal_of(&c.member).to_owned()),
                };
                match self.groups.view(&id) {
                    Some(v) if !waiter.satisfied(&v) => {
                        if self.at_waiter_cap(waiter.principal.as_deref()) {
                            crate::counters::principal_capped("group_waits");
                            let _ = waiter.reply.send(Ok(PlacementReply::Invalid(format!(
                                "NODE-PG-008: this certificate already waits on {MAX_WAITERS_PER_PRINCIPAL} groups at the head; wait on fewer at once"
                            ))));
                            return;
                        }
                        self.waiters.entry(id).or_default().push(waiter);
                    }
                    v => {
                        let _ = waiter.reply.send(Ok(PlacementReply::Group(v)));
                    }
                }
                return;
            }
        };
        let _ = reply.send(Ok(answer));
    }

    /// Carries out the machine's actions; this node's own ledger answers
    /// at once.
    fn execute(&mut self, out: &mut Vec<Action>) {
        while !out.is_empty() {
            for action in std::mem::take(out) {
                let action = match action {
                    Action::Send {
                        node,
                        op:
                            LedgerOp::Prepare {
                                mut record,
                                bundles,
                            },
                        tag,
                    } => {
                        record.seal = seal(&self.seal_key, &record).to_vec();
                        Action::Send {
                            node,
                            op: LedgerOp::Prepare { record, bundles },
                            tag,
                        }
                    }
                    other => other,
                };
                match action {
                    Action::Send { node, op, tag } if node == self.identity.name => {
                        let reply = self.ledger.apply(op);
                        self.groups.replied(now(), &node, tag, Ok(reply), out);
                    }
                    Action::Send { node, op, tag } => self.send(node, op, tag),
                    Action::Changed(id) => {
                        if self
                            .groups
                            .view(&id)
                            .is_some_and(|v| v.state == GroupState::Ready)
                            && let Err(e) = self.record(&id, 0)
                        {
                            tracing::error!(group = %id, error = %e, "cannot write where the ready group is; a restarted head will wait for its nodes' reports");
                        }
                        self.wake(&id, false);
                    }
                    Action::Refused {
                        node,
                        group,
                        bundles,
                    } => {
                        let why = Unauthorized::NotYourBundle;
                        crate::counters::authority_refused("placement", why.code());
                        tracing::warn!(%node, %group, ?bundles, error = %why, "a node reported holding bundles no record gives it; released");
                    }
                    Action::Removed(id) => {
                        if let Some(store) = &self.store
                            && let Err(e) = store.remove_group(&id)
                        {
                            tracing::error!(group = %id, error = %e, "cannot forget the removed group on disk");
                        }
                        self.wake(&id, true);
                    }
                }
            }
        }
    }

    /// Writes the group `id` to the store, if there is one
    /// (`deadline_unix_ms`: when it fails if pending; unused once ready).
    fn record(
        &self,
        id: &GroupId,
        deadline_unix_ms: u64,
    ) -> Result<(), crate::head::head_store::HeadStoreError> {
        match (&self.store, self.groups.to_store(id, deadline_unix_ms)) {
            (Some(store), Some(group)) => store.put_group(&group),
            _ => Ok(()),
        }
    }

    /// Whether the certificate `principal` already has
    /// [`MAX_WAITERS_PER_PRINCIPAL`] waits open ([`at_waiter_cap`]).
    fn at_waiter_cap(&mut self, principal: Option<&str>) -> bool {
        at_waiter_cap(&mut self.waiters, principal)
    }

    fn wake(&mut self, id: &GroupId, removed: bool) {
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
                    let _ = w.reply.send(Ok(PlacementReply::Group(v.clone())));
                }
            }
        }
        if !keep.is_empty() {
            self.waiters.insert(id.clone(), keep);
        }
    }

    fn send(&mut self, node: MemberName, op: LedgerOp, tag: Tag) {
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

/// Every part of a record but its seal, in one canonical text: what the
/// group is and whose, and which node holds each bundle at its revision
/// (the head seals each revision it sends, so a member can neither make
/// up a group nor give itself another node's bundle).
fn sealed_part(record: &GroupRecord) -> String {
    format!(
        "{}\0{:?}\0{}\0{:?}\0{:?}\0{}\0{:?}",
        record.id,
        record.owner,
        record.strategy,
        record.bundles,
        record.selector,
        record.revision,
        record.nodes
    )
}

/// HMAC-SHA256 of `record`'s lasting parts under `key`.
fn seal(key: &[u8; 32], record: &GroupRecord) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(sealed_part(record).as_bytes())
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Whether `record`'s seal is the head's (compared without an early exit).
fn seal_checks(key: &[u8; 32], record: &GroupRecord) -> bool {
    let want = seal(key, record);
    record.seal.len() == want.len()
        && record
            .seal
            .iter()
            .zip(want)
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0
}

/// One member's ledger link: operations in order on one control stream,
/// replies matched in order.
async fn run_link(
    node: MemberName,
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
                let Some(opened) = stream.as_mut() else { continue };
                match send_msg(&mut opened.send, &ControlRequest::Ledger(op), DEFAULT_MAX_FRAME).await {
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
        Some(opened) if waiting => opened.replies.recv().await,
        _ => std::future::pending().await,
    }
}

/// A member's ledger stream: where operations go, and its replies in
/// order (`None`: the stream ended).
struct Opened {
    send: quinn::SendStream,
    replies: mpsc::UnboundedReceiver<Option<LedgerReply>>,
}

/// Opens a control stream to `node` and a task reading its replies.
async fn dial(
    pool: &Pool,
    identity: &Identity,
    node: &str,
    addr: SocketAddr,
) -> Result<Opened, String> {
    let pc = pool.connect(node, addr).await.map_err(|e| e.to_string())?;
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
    Ok(Opened { send, replies: rx })
}

/// Whether the certificate `principal` already has
/// [`MAX_WAITERS_PER_PRINCIPAL`] of `waiters` open (those whose asker is
/// gone are dropped first); this node's own (`None`) are never capped.
fn at_waiter_cap(waiters: &mut HashMap<GroupId, Vec<Waiter>>, principal: Option<&str>) -> bool {
    let Some(principal) = principal else {
        return false;
    };
    waiters.retain(|_, waiting| {
        waiting.retain(|w| !w.reply.is_closed());
        !waiting.is_empty()
    });
    let open = waiters
        .values()
        .flatten()
        .filter(|w| w.principal.as_deref() == Some(principal))
        .count();
    open >= MAX_WAITERS_PER_PRINCIPAL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_certificate_cannot_hold_more_than_its_cap_of_group_waits_at_the_head() {
        let mut waiters: HashMap<GroupId, Vec<Waiter>> = HashMap::new();
        let mut askers = Vec::new();
        for i in 0..MAX_WAITERS_PER_PRINCIPAL {
            let (reply, rx) = oneshot::channel();
            askers.push(rx);
            waiters
                .entry(GroupId::new(format!("pg{}", i % 8)))
                .or_default()
                .push(Waiter {
                    after: None,
                    reply,
                    principal: Some("ops".into()),
                });
        }
        assert!(at_waiter_cap(&mut waiters, Some("ops")));
        assert!(!at_waiter_cap(&mut waiters, Some("other")));
        assert!(!at_waiter_cap(&mut waiters, None), "the head's own waits");
        // An asker that gave up (its wait timed out) frees its place.
        drop(askers.pop());
        assert!(!at_waiter_cap(&mut waiters, Some("ops")));
        assert_eq!(
            waiters.values().flatten().count(),
            MAX_WAITERS_PER_PRINCIPAL - 1
        );
    }

    fn record(owner: &str) -> GroupRecord {
        GroupRecord {
            id: "pg1-1".into(),
            revision: 1,
            strategy: "spread".into(),
            bundles: vec![[("cpu".to_owned(), 1.0)].into()],
            nodes: vec!["w1".into()],
            selector: Default::default(),
            owner: Some(MemberRef::new(owner, Incarnation::new(7))),
            seal: Vec::new(),
        }
    }

    #[test]
    fn a_seal_checks_only_under_its_key_and_for_the_fields_it_covers() {
        let key = [3u8; 32];
        let mut r = record("d~1");
        assert!(!seal_checks(&key, &r), "unsealed");
        r.seal = seal(&key, &r).to_vec();
        assert!(seal_checks(&key, &r));
        assert!(!seal_checks(&[4u8; 32], &r), "another head's key");
        // A re-placement moves bundles: the head seals the record again.
        let mut moved = r.clone();
        moved.revision = 2;
        moved.nodes = vec!["w2".into()];
        assert!(!seal_checks(&key, &moved), "moved but not sealed again");
        moved.seal = seal(&key, &moved).to_vec();
        assert!(seal_checks(&key, &moved));
        // Another owner, or a larger bundle, is a forgery.
        let mut other = r.clone();
        other.owner = Some(MemberRef::new("mallory", Incarnation::new(7)));
        assert!(!seal_checks(&key, &other));
        let mut bigger = r;
        bigger.bundles = vec![[("cpu".to_owned(), 64.0)].into()];
        assert!(!seal_checks(&key, &bigger));
    }

    #[test]
    fn a_member_that_rewrites_which_node_holds_a_bundle_cannot_claim_it_from_a_rebuilt_head() {
        let key = [3u8; 32];
        let mut r = record("d~1");
        r.bundles = vec![[("cpu".to_owned(), 1.0)].into(); 2];
        r.nodes = vec!["w1".into(), "w2".into()];
        r.seal = seal(&key, &r).to_vec();
        // w1 holds bundle 0; it reports the record with w2's bundle as its
        // own, at the same revision or a later one.
        let mut forged = r.clone();
        forged.nodes = vec!["w1".into(), "w1".into()];
        assert!(!seal_checks(&key, &forged), "nodes rewritten");
        forged.revision = 9;
        assert!(!seal_checks(&key, &forged), "and a revision made up");
        let mut renumbered = r;
        renumbered.revision = 2;
        assert!(!seal_checks(&key, &renumbered), "a revision made up alone");
    }
}
