//! Remote spawn of registered actor kinds.
//!
//! Every node runs one spawner actor, local only: other nodes ask for a
//! spawn on a control stream to the node itself ([`ControlRequest::Spawn`]),
//! whose control service passes it on with the stream's member as the
//! actor's owner. A request names a kind the node registered, the actor's
//! name and its arguments as an rkyv archive. The spawned actor is linked
//! to the spawner (it never runs unsupervised) and joins the process group
//! of its own name, which is how any node looks it up.
//!
//! The spawner is in no process group: nothing on another node can reach
//! it, so no node can pose as another's spawner, nor tell it who is up
//! (the member table it reaps orphans by comes from its own node), nor
//! ask it to stop an actor except through the control stream that proves
//! who asks.
//!
//! [`ControlRequest::Spawn`]: flotilla_proto::control::ControlRequest::Spawn

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use flotilla_proto::authority::{Sender, may_stop};
use flotilla_proto::control::{MAX_ACTORS_PER_PRINCIPAL, SpawnOrder, StopOutcome};
use flotilla_proto::epoch::{Epoch, Start, TakesStart};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::{Incarnation, MemberRef};
use flotilla_proto::role::{Role, principal_of};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use rkyv::{Archive, Deserialize, Serialize};

pub use flotilla_proto::control::{SpawnReply, TypeMismatch};

use crate::remote::wire::{Decode, Encode, decode};

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
pub struct MemberStates(pub Vec<(MemberName, Incarnation, bool)>);

impl MemberStates {
    /// Whether the node `owner` at `incarnation` is known to be gone.
    pub fn is_gone(&self, owner: &str, incarnation: Incarnation) -> bool {
        let known = self
            .0
            .iter()
            .find(|(n, ..)| n == owner)
            .map(|(_, i, up)| (*i, *up));
        flotilla_proto::membership::has_ended(known, incarnation)
    }
}

/// A spawn as the node's control service passes it on: what to spawn, and
/// its owner, the member (and incarnation) of the control stream it came
/// on.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalSpawn {
    /// What to spawn.
    pub order: SpawnOrder,
    /// The member that asked, and its incarnation.
    pub owner: MemberRef,
}

/// A request to stop one of the spawner's children, as the node's own
/// control service passes it on: who asked (the member and role of the
/// control stream, or `None` for the node itself) and the head's name, for
/// the authority check.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalStop {
    /// The child's name.
    pub name: String,
    /// Who asked; `None` is this node.
    pub sender: Option<(String, Role)>,
    /// The head's name as this node's table has it.
    pub head: MemberName,
}

/// The answer to a [`LocalStop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReply(pub StopOutcome);

/// Messages of the spawner actor (local only).
pub enum SpawnerMsg {
    /// Start an actor of a registered kind.
    Spawn(LocalSpawn, RpcReplyPort<SpawnReply>),
    /// The member table changed.
    Members(MemberStates),
    /// Stop a child (the control service has checked nothing: the spawner
    /// checks the sender against the child's owner).
    Stop(LocalStop, RpcReplyPort<StopReply>),
    /// The head no longer counts this node's incarnation: stop every child
    /// another member owns (its supervisor has restarted it elsewhere) and
    /// answer how many, once they have stopped.
    Fence(RpcReplyPort<u32>),
}

impl ractor::Message for SpawnerMsg {}

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
        let states: Vec<(MemberName, Incarnation, bool)> = {
            let t = view.borrow_and_update();
            t.members
                .iter()
                .map(|m| (m.name.clone(), m.incarnation, m.state.is_live()))
                .collect()
        };
        if !states.is_empty()
            && states != last
            && spawner
                .cast(SpawnerMsg::Members(MemberStates(states.clone())))
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

/// How long a fence waits for one child to stop.
const FENCE_STOP: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a child asked to stop on request may take before it is
/// killed.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a killed child may take to end.
const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits for `cell`, already asked to stop, to end: at most [`STOP_GRACE`],
/// then it is killed and given [`KILL_WAIT`] more. Returns whether it
/// ended. A stop answered only once its actor has ended is what lets an
/// owner start the actor's next copy under the same name without two
/// copies ever running.
async fn ended(cell: ActorCell) -> bool {
    if cell.wait(Some(STOP_GRACE)).await.is_ok() {
        return true;
    }
    tracing::warn!(name = ?cell.get_name(), "an actor ignored its stop; killing it");
    cell.kill();
    cell.wait(Some(KILL_WAIT)).await.is_ok()
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

/// Writes a [`Start`] into a fenced kind's archived arguments, over
/// whatever they say; `Err` for arguments that do not decode.
pub(crate) type Stamp = Arc<dyn Fn(&[u8], &Start) -> Result<Vec<u8>, String> + Send + Sync>;

/// The kinds whose actors fence their checkpoints, by name, with how to
/// stamp their arguments.
pub(crate) type Stamps = Arc<HashMap<String, Stamp>>;

/// The stamp of the kind whose arguments are `T`: decodes them, writes
/// the start in, archives them again.
pub(crate) fn stamp_of<T: Decode + Encode + TakesStart>() -> Stamp {
    Arc::new(|bytes: &[u8], start: &Start| {
        let mut args = decode::<T>(bytes).map_err(|e| e.to_string())?;
        *args.start_mut() = start.clone();
        Ok(crate::remote::wire::encode(&args))
    })
}

/// The start a spawn by `owner` at `epoch` is given: the epoch its
/// supervisor issued and the certificate that asked, never what the
/// arguments claim.
fn start_of(owner: &MemberRef, epoch: Epoch) -> Start {
    Start::new(principal_of(&owner.name), epoch)
}

/// The spawner actor.
pub(crate) struct Spawner;

pub(crate) struct SpawnerArgs {
    pub(crate) kinds: Kinds,
    pub(crate) stamps: Stamps,
    pub(crate) hosted: Hosted,
    /// This node's name: children it owns itself are not fenced.
    pub(crate) node: MemberName,
}

pub(crate) struct SpawnerState {
    kinds: Kinds,
    stamps: Stamps,
    hosted: Hosted,
    node: MemberName,
    children: HashMap<ractor::ActorId, Child>,
    /// The last member table.
    members: MemberStates,
}

struct Child {
    name: String,
    cell: ActorCell,
    owner: MemberRef,
    /// Asked to stop because its owner is gone (once).
    stopping: bool,
}

impl SpawnerState {
    /// Stops children whose owner is no longer up.
    fn reap_orphans(&mut self) {
        for child in self.children.values_mut() {
            if !child.stopping
                && self
                    .members
                    .is_gone(&child.owner.name, child.owner.incarnation)
            {
                child.stopping = true;
                tracing::info!(name = %child.name, owner = %child.owner.name, "stopping an actor whose owner is gone");
                child.cell.stop(Some("owner gone".into()));
            }
        }
    }

    /// Asks the child `req.name` to stop if `req.sender` may, and returns
    /// it to wait for ([`ended`]); or the refusal.
    fn stop(&mut self, req: &LocalStop) -> Result<ActorCell, StopOutcome> {
        let Some(child) = self.children.values_mut().find(|c| c.name == req.name) else {
            return Err(StopOutcome::NoSuchActor);
        };
        let sender = req
            .sender
            .as_ref()
            .map_or(Sender::Local, |(member, role)| Sender::peer(member, *role));
        if let Err(why) = may_stop(sender, &child.owner.name, &req.head) {
            crate::counters::authority_refused("stop", why.code());
            tracing::warn!(name = %req.name, sender = ?req.sender, owner = %child.owner.name, error = %why, "stop refused");
            return Err(StopOutcome::NotOwner);
        }
        tracing::info!(name = %req.name, sender = ?req.sender, "stopping an actor on request");
        child.stopping = true;
        child.cell.stop(Some("stop requested".into()));
        Ok(child.cell.clone())
    }

    /// The child holding `name` that was asked to stop and may not have
    /// ended yet, if any.
    fn stopping_holder(&self, name: &str) -> Option<ActorCell> {
        self.children
            .values()
            .find(|c| c.stopping && c.name == name)
            .map(|c| c.cell.clone())
    }

    /// Stops every child another member owns, all at once, and waits for
    /// them (each at most [`FENCE_STOP`]); answers how many were asked to
    /// stop.
    async fn fence(&mut self) -> u32 {
        let mut stopping = Vec::new();
        for child in self.children.values_mut() {
            if child.owner.name == self.node {
                continue;
            }
            child.stopping = true;
            tracing::warn!(name = %child.name, owner = %child.owner.name, "stopping an actor hosted for another member: this incarnation was fenced");
            stopping.push(child.cell.clone());
        }
        let stopped = stopping.len() as u32;
        futures::future::join_all(
            stopping
                .iter()
                .map(|cell| cell.stop_and_wait(Some("fenced".into()), Some(FENCE_STOP))),
        )
        .await;
        stopped
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
        _: ActorRef<SpawnerMsg>,
        args: SpawnerArgs,
    ) -> Result<SpawnerState, ActorProcessingErr> {
        Ok(SpawnerState {
            kinds: args.kinds,
            stamps: args.stamps,
            hosted: args.hosted,
            node: args.node,
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
            SpawnerMsg::Spawn(LocalSpawn { order: req, owner }, reply) => {
                // The name's former holder was asked to stop: its owner
                // starts the next copy. Let the former one end first.
                if let Some(holder) = state.stopping_holder(&req.name) {
                    ended(holder).await;
                }
                let capped = owner.name != state.node
                    && at_cap(
                        state.children.values().map(|c| c.owner.name.as_str()),
                        &owner.name,
                    );
                let result = match state.kinds.get(&req.kind) {
                    _ if capped => {
                        crate::counters::principal_capped("actors");
                        Err(SpawnReply::TooMany(principal_of(&owner.name).to_owned()))
                    }
                    None => Err(SpawnReply::UnknownKind(req.kind.clone())),
                    Some(kind) if kind.message_type() != req.message_type => {
                        Err(SpawnReply::WrongMessageType(TypeMismatch {
                            kind: req.kind.clone(),
                            takes: kind.message_type().to_owned(),
                            asked: req.message_type.clone(),
                        }))
                    }
                    Some(kind) => match state.stamps.get(&req.kind) {
                        None => {
                            kind.spawn(req.name.clone(), &req.args, myself.get_cell())
                                .await
                        }
                        Some(stamp) => match stamp(&req.args, &start_of(&owner, req.epoch)) {
                            Ok(args) => {
                                kind.spawn(req.name.clone(), &args, myself.get_cell()).await
                            }
                            Err(why) => Err(SpawnReply::BadArgs(why)),
                        },
                    },
                };
                let answer = match result {
                    Ok(cell) => {
                        tracing::info!(kind = %req.kind, name = %req.name, owner = %owner.name, "actor spawned");
                        state.children.insert(
                            cell.get_id(),
                            Child {
                                name: req.name,
                                cell,
                                owner,
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
            SpawnerMsg::Members(up) => {
                state.members = up;
                state.reap_orphans();
            }
            SpawnerMsg::Stop(req, reply) => match state.stop(&req) {
                // Answered once the actor has ended, without holding up
                // the spawner meanwhile.
                Ok(cell) => {
                    tokio::spawn(async move {
                        let outcome = if ended(cell).await {
                            StopOutcome::Stopped
                        } else {
                            StopOutcome::Stopping
                        };
                        let _ = reply.send(StopReply(outcome));
                    });
                }
                Err(outcome) => {
                    let _ = reply.send(StopReply(outcome));
                }
            },
            SpawnerMsg::Fence(reply) => {
                let _ = reply.send(state.fence().await);
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

/// Whether the certificate of the member `owner` already owns
/// [`MAX_ACTORS_PER_PRINCIPAL`] of the actors whose owners are `owners`.
fn at_cap<'a>(owners: impl Iterator<Item = &'a str>, owner: &str) -> bool {
    let principal = principal_of(owner);
    owners.filter(|o| principal_of(o) == principal).count() >= MAX_ACTORS_PER_PRINCIPAL
}

#[cfg(test)]
mod tests {
    use super::{MAX_ACTORS_PER_PRINCIPAL, MemberStates, at_cap};
    use flotilla_proto::incarnation::Incarnation;

    #[test]
    fn one_certificate_cannot_own_more_than_its_cap_of_actors_on_a_node() {
        let owners: Vec<String> = (0..MAX_ACTORS_PER_PRINCIPAL)
            .map(|i| format!("ops~{:016x}", i % 4))
            .collect();
        let owners = || owners.iter().map(String::as_str);
        // Every process of the certificate counts against the one cap.
        assert!(at_cap(owners(), "ops~00000000000000ff"));
        assert!(!at_cap(owners(), "other~0000000000000001"));
        assert!(!at_cap(owners().skip(1), "ops~0000000000000001"));
    }

    #[test]
    fn an_owner_is_gone_when_down_left_or_restarted_not_when_unknown() {
        let t = MemberStates(vec![
            ("d".into(), Incarnation::new(5), true),
            ("x".into(), Incarnation::new(3), false),
        ]);
        assert!(!t.is_gone("d", Incarnation::new(5)));
        assert!(
            t.is_gone("d", Incarnation::new(4)),
            "restarted with a newer incarnation"
        );
        assert!(
            !t.is_gone("d", Incarnation::new(6)),
            "the table has not seen the new start yet"
        );
        assert!(t.is_gone("x", Incarnation::new(3)));
        assert!(
            !t.is_gone("new", Incarnation::new(1)),
            "just joined, not in the table yet"
        );
    }
}
