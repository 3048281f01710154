//! Remote spawn of registered actor kinds.
//!
//! Every node runs one spawner actor, reachable from the whole cluster in the
//! process group `flotilla.spawner.NODE`. A spawn request names a kind the
//! node registered, the actor's name and its arguments as an rkyv archive.
//! The spawned actor is linked to the spawner (it never runs unsupervised)
//! and joins the process group of its own name, which is how any node looks
//! it up.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use flotilla_proto::authority::{Sender, Unauthorized, may_stop};
use flotilla_proto::control::StopOutcome;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use ractor_cluster::RactorClusterMessage;
use rkyv::{Archive, Deserialize, Serialize};

use crate::wire::{Decode, decode};

/// Process group of the spawner of `node`.
pub(crate) fn spawner_group(node: &str) -> String {
    format!("flotilla.spawner.{node}")
}

/// A request to start an actor of a registered kind.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SpawnRequest {
    /// The registered kind.
    pub kind: String,
    /// The actor's name, unique in the cluster.
    pub name: String,
    /// The actor's arguments, an rkyv archive of the kind's `Arguments`.
    pub args: Vec<u8>,
    /// The node that asked: the actor stops when that node is no longer up
    /// (down, left, or restarted with a new incarnation).
    pub owner: String,
    /// The asking node's incarnation.
    pub owner_incarnation: u64,
    /// The message type the caller will send the actor
    /// (`std::any::type_name`); the kind's must be the same.
    pub message_type: String,
}

/// Process group of every actor spawned with message type `M`: how a
/// lookup tells an actor's message type, on any node.
pub(crate) fn type_group<M: 'static>() -> String {
    format!("{TYPE_GROUP_PREFIX}{}", std::any::type_name::<M>())
}

/// Prefix of the message-type process groups.
pub(crate) const TYPE_GROUP_PREFIX: &str = "flotilla.msg.";

/// The member table as `(name, incarnation, up)`. A child is stopped when
/// its owner appears with its incarnation and not up, or with a newer
/// incarnation; an owner not yet in the table (it has just joined) keeps
/// its children.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct MemberStates(pub Vec<(String, u64, bool)>);

impl MemberStates {
    /// Whether the node `owner` at `incarnation` is known to be gone.
    pub fn is_gone(&self, owner: &str, incarnation: u64) -> bool {
        self.0
            .iter()
            .any(|(n, i, up)| n == owner && (*i > incarnation || (*i == incarnation && !up)))
    }
}

/// A kind asked for with another message type than its actors take.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TypeMismatch {
    /// The kind.
    pub kind: String,
    /// Its actors' message type.
    pub takes: String,
    /// The caller's.
    pub asked: String,
}

/// The spawner's answer.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpawnReply {
    /// Started; the actor is in the process group of its name.
    #[error("spawned")]
    Spawned,
    /// The node has no kind of that name registered.
    #[error(
        "no actor kind {0:?} is registered on that node; register it with NodeBuilder::register"
    )]
    UnknownKind(String),
    /// An actor of that name already runs on the node.
    #[error("an actor named {0:?} already runs there")]
    NameTaken(String),
    /// The arguments are not a valid archive of the kind's arguments.
    #[error("invalid arguments: {0}")]
    BadArgs(String),
    /// The kind's actors take another message type than the caller's.
    #[error("actors of kind {:?} take {}, not {}", .0.kind, .0.takes, .0.asked)]
    WrongMessageType(TypeMismatch),
    /// The actor failed in `pre_start`.
    #[error("actor failed to start: {0}")]
    Failed(String),
}

crate::remote_type!(SpawnRequest, SpawnReply, MemberStates);

/// The member table as the spawner's own node tells it. Only the node
/// itself may say who is up (it has the table from the head's
/// authenticated control stream): the spawner stops children whose owner
/// is gone, so a table from anywhere else could stop them at will. A
/// `LocalMembers` that arrives from another node is therefore refused when
/// it is decoded, logged and counted (`flotilla_authority_refused_total`),
/// and never reaches the spawner.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LocalMembers(pub MemberStates);

impl ractor::BytesConvertable for LocalMembers {
    /// Nothing: a node never sends its table to another node's spawner.
    fn into_bytes(self) -> Vec<u8> {
        Vec::new()
    }

    fn from_bytes(_bytes: Vec<u8>) -> Self {
        // ractor decodes under catch_unwind: the message is dropped and
        // the spawner keeps running.
        refuse_remote("spawner_members", Unauthorized::MemberTable)
    }
}

/// A request to stop one of the spawner's children, as the node's own
/// control service passes it on: who asked (a peer's certificate name, or
/// `None` for the node itself) and the head's name, for the authority
/// check. Like [`LocalMembers`], it is refused (and counted) when it
/// arrives from another node.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalStop {
    /// The child's name.
    pub name: String,
    /// Who asked; `None` is this node.
    pub sender: Option<String>,
    /// The head's name as this node's table has it.
    pub head: String,
}

impl ractor::BytesConvertable for LocalStop {
    /// Nothing: stop requests between nodes travel on control streams.
    fn into_bytes(self) -> Vec<u8> {
        Vec::new()
    }

    fn from_bytes(_bytes: Vec<u8>) -> Self {
        refuse_remote("stop", Unauthorized::Stop)
    }
}

/// The answer to a [`LocalStop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReply(pub StopOutcome);

impl ractor::BytesConvertable for StopReply {
    fn into_bytes(self) -> Vec<u8> {
        vec![match self.0 {
            StopOutcome::Stopped => 0,
            StopOutcome::NoSuchActor => 1,
            StopOutcome::NotOwner => 2,
        }]
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(match bytes.first() {
            Some(0) => StopOutcome::Stopped,
            Some(1) => StopOutcome::NoSuchActor,
            _ => StopOutcome::NotOwner,
        })
    }
}

/// Counts and logs a message for the spawner that came from another node
/// although only its own node may send it, then unwinds out of ractor's
/// decoder, which drops the message.
fn refuse_remote(message: &'static str, why: Unauthorized) -> ! {
    crate::counters::authority_refused(message);
    tracing::warn!(error = %why, "refused a message to this node's spawner from another node");
    std::panic::resume_unwind(Box::new(why))
}

/// Messages of the spawner actor.
#[derive(RactorClusterMessage)]
pub enum SpawnerMsg {
    /// Start an actor of a registered kind.
    #[rpc]
    Spawn(SpawnRequest, RpcReplyPort<SpawnReply>),
    /// The member table changed (accepted from the node itself only).
    Members(LocalMembers),
    /// Stop a child (accepted from the node itself only, which checks the
    /// sender of the control stream it came on).
    #[rpc]
    Stop(LocalStop, RpcReplyPort<StopReply>),
}

type SpawnFuture = Pin<Box<dyn Future<Output = Result<ActorCell, SpawnReply>> + Send>>;

/// A registered actor kind: knows how to decode its arguments and start one.
pub(crate) trait Kind: Send + Sync + 'static {
    fn spawn(&self, name: String, args: &[u8], supervisor: ActorCell) -> SpawnFuture;
    /// The kind's message type (`std::any::type_name`).
    fn message_type(&self) -> &'static str;
}

pub(crate) struct KindOf<A, F> {
    pub(crate) factory: F,
    pub(crate) _actor: PhantomData<fn() -> A>,
}

impl<A, F> Kind for KindOf<A, F>
where
    A: Actor,
    A::Arguments: Decode,
    F: Fn() -> A + Send + Sync + 'static,
{
    fn message_type(&self) -> &'static str {
        std::any::type_name::<A::Msg>()
    }

    fn spawn(&self, name: String, args: &[u8], supervisor: ActorCell) -> SpawnFuture {
        let args = match decode::<A::Arguments>(args) {
            Ok(a) => a,
            Err(e) => return Box::pin(async move { Err(SpawnReply::BadArgs(e.to_string())) }),
        };
        let actor = (self.factory)();
        Box::pin(async move {
            if ractor::registry::where_is(name.clone()).is_some() {
                return Err(SpawnReply::NameTaken(name));
            }
            let (actor, _) = Actor::spawn_linked(Some(name.clone()), actor, args, supervisor)
                .await
                .map_err(|e| SpawnReply::Failed(e.to_string()))?;
            ractor::pg::join(name, vec![actor.get_cell()]);
            ractor::pg::join(type_group::<A::Msg>(), vec![actor.get_cell()]);
            Ok(actor.get_cell())
        })
    }
}

/// Tells `spawner` who is up whenever that changes in `view` (most table
/// changes are actor counts, which it does not need), until `view` closes
/// or the spawner stops.
pub(crate) async fn relay_members(
    mut view: tokio::sync::watch::Receiver<crate::table::Table>,
    spawner: ActorRef<SpawnerMsg>,
) {
    let mut last = Vec::new();
    loop {
        let states: Vec<(String, u64, bool)> = {
            let t = view.borrow_and_update();
            t.members
                .iter()
                .map(|m| {
                    (
                        m.name.clone(),
                        m.incarnation,
                        m.state == flotilla_proto::membership::MemberState::Up,
                    )
                })
                .collect()
        };
        if !states.is_empty()
            && states != last
            && spawner
                .cast(SpawnerMsg::Members(LocalMembers(MemberStates(
                    states.clone(),
                ))))
                .is_err()
        {
            return;
        }
        last = states;
        if view.changed().await.is_err() {
            return;
        }
    }
}

/// The actors a node's spawner hosts, shared with the node: how many (its
/// heartbeats report it) and which (lookups prefer them).
#[derive(Clone, Default)]
pub(crate) struct Hosted {
    ids: Arc<Mutex<HashSet<ractor::ActorId>>>,
    count: Arc<AtomicU32>,
}

impl Hosted {
    /// Whether the actor `id` is one of this node's.
    pub(crate) fn contains(&self, id: ractor::ActorId) -> bool {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    /// How many actors the node hosts.
    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    fn set(&self, ids: impl Iterator<Item = ractor::ActorId>) {
        let mut set = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        set.clear();
        set.extend(ids);
        self.count.store(set.len() as u32, Ordering::Relaxed);
    }
}

/// Registered kinds by name.
pub(crate) type Kinds = Arc<HashMap<String, Arc<dyn Kind>>>;

/// The spawner actor.
pub(crate) struct Spawner;

pub(crate) struct SpawnerArgs {
    pub(crate) node: String,
    pub(crate) kinds: Kinds,
    pub(crate) hosted: Hosted,
}

pub(crate) struct SpawnerState {
    kinds: Kinds,
    hosted: Hosted,
    children: HashMap<ractor::ActorId, Child>,
    /// The last member table.
    members: MemberStates,
}

struct Child {
    name: String,
    cell: ActorCell,
    owner: (String, u64),
    /// Asked to stop because its owner is gone (once).
    stopping: bool,
}

impl SpawnerState {
    /// Stops children whose owner is no longer up.
    fn reap_orphans(&mut self) {
        for child in self.children.values_mut() {
            if !child.stopping && self.members.is_gone(&child.owner.0, child.owner.1) {
                child.stopping = true;
                tracing::info!(name = %child.name, owner = %child.owner.0, "stopping an actor whose owner is gone");
                child.cell.stop(Some("owner gone".into()));
            }
        }
    }

    /// Stops the child `req.name` if `req.sender` may.
    fn stop(&mut self, req: &LocalStop) -> StopOutcome {
        let Some(child) = self.children.values_mut().find(|c| c.name == req.name) else {
            return StopOutcome::NoSuchActor;
        };
        let sender = req.sender.as_deref().map_or(Sender::Local, Sender::Peer);
        if let Err(why) = may_stop(sender, &child.owner.0, &req.head) {
            crate::counters::authority_refused("stop");
            tracing::warn!(name = %req.name, sender = ?req.sender, owner = %child.owner.0, error = %why, "stop refused");
            return StopOutcome::NotOwner;
        }
        tracing::info!(name = %req.name, sender = ?req.sender, "stopping an actor on request");
        child.stopping = true;
        child.cell.stop(Some("stop requested".into()));
        StopOutcome::Stopped
    }

    fn publish(&self) {
        self.hosted.set(self.children.keys().copied());
    }
}

impl Actor for Spawner {
    type Msg = SpawnerMsg;
    type State = SpawnerState;
    type Arguments = SpawnerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SpawnerMsg>,
        args: SpawnerArgs,
    ) -> Result<SpawnerState, ActorProcessingErr> {
        ractor::pg::join(spawner_group(&args.node), vec![myself.get_cell()]);
        Ok(SpawnerState {
            kinds: args.kinds,
            hosted: args.hosted,
            children: HashMap::new(),
            members: MemberStates::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SpawnerMsg>,
        msg: SpawnerMsg,
        state: &mut SpawnerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SpawnerMsg::Spawn(req, reply) => {
                let result = match state.kinds.get(&req.kind) {
                    None => Err(SpawnReply::UnknownKind(req.kind.clone())),
                    Some(kind) if kind.message_type() != req.message_type => {
                        Err(SpawnReply::WrongMessageType(TypeMismatch {
                            kind: req.kind.clone(),
                            takes: kind.message_type().to_owned(),
                            asked: req.message_type.clone(),
                        }))
                    }
                    Some(kind) => {
                        kind.spawn(req.name.clone(), &req.args, myself.get_cell())
                            .await
                    }
                };
                let answer = match result {
                    Ok(cell) => {
                        tracing::info!(kind = %req.kind, name = %req.name, owner = %req.owner, "actor spawned");
                        state.children.insert(
                            cell.get_id(),
                            Child {
                                name: req.name,
                                cell,
                                owner: (req.owner, req.owner_incarnation),
                                stopping: false,
                            },
                        );
                        state.publish();
                        state.reap_orphans();
                        SpawnReply::Spawned
                    }
                    Err(e) => {
                        tracing::warn!(kind = %req.kind, name = %req.name, error = %e, "spawn refused");
                        e
                    }
                };
                let _ = reply.send(answer);
            }
            SpawnerMsg::Members(LocalMembers(up)) => {
                state.members = up;
                state.reap_orphans();
            }
            SpawnerMsg::Stop(req, reply) => {
                let _ = reply.send(StopReply(state.stop(&req)));
            }
        }
        Ok(())
    }

    /// Children that stop or fail are forgotten; the spawner itself keeps
    /// running (restart policies belong to supervisors).
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<SpawnerMsg>,
        event: SupervisionEvent,
        state: &mut SpawnerState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if let Some(Child { name, .. }) = state.children.remove(&cell.get_id()) {
                    tracing::info!(%name, reason = reason.as_deref().unwrap_or(""), "actor stopped");
                }
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(Child { name, .. }) = state.children.remove(&cell.get_id()) {
                    tracing::warn!(%name, %error, "actor failed");
                }
            }
            _ => {}
        }
        state.publish();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::MemberStates;

    #[test]
    fn an_owner_is_gone_when_down_left_or_restarted_not_when_unknown() {
        let t = MemberStates(vec![("d".into(), 5, true), ("x".into(), 3, false)]);
        assert!(!t.is_gone("d", 5));
        assert!(t.is_gone("d", 4), "restarted with a newer incarnation");
        assert!(
            !t.is_gone("d", 6),
            "the table has not seen the new start yet"
        );
        assert!(t.is_gone("x", 3));
        assert!(!t.is_gone("new", 1), "just joined, not in the table yet");
    }
}
