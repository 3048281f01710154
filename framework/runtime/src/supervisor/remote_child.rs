//! [`RemoteChild`]: a supervised actor of a registered kind on another
//! node (or this one), spawned through the node's façade where the member
//! table or a placement-group bundle says, monitored through its proxy,
//! and started again, with a new epoch, where it can run after its node
//! is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_proto::control::{SpawnOrder, StopOutcome};
use flotilla_proto::epoch::Epoch;
use flotilla_proto::groups::{GroupId, GroupState};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::{Incarnation, MemberRef};
use futures::future::BoxFuture;
use ractor::ActorCell;

use crate::node::placement_groups::{GroupView, PlacementError};
use crate::node::{Node, SpawnError, StopError};
use crate::remote::kind::Named;
use crate::remote::spawner::SpawnReply;
use crate::remote::wire::Encode;
use crate::table::Table;

use super::{ChildStart, Exit, Running, StartChildError};

/// Picks the node a remote child starts on from the member table.
pub type Place = dyn Fn(&Table) -> Option<MemberName> + Send + Sync;

/// An actor of a registered kind, spawned with [`Node::spawn_on`] on the
/// node `place` picks from the member table (`None`: no node can host it
/// now; the start waits for one, within its timeout, then fails), under a
/// fixed name, and monitored through its proxy. Stopped with
/// [`Node::stop_on`].
pub struct RemoteChild {
    node: Arc<Node>,
    kind: String,
    name: String,
    /// Its archived arguments, the same for every start (a kind that
    /// fences its checkpoints has each start's written in by the node that
    /// spawns it).
    args: Vec<u8>,
    message_type: String,
    place: Arc<Place>,
    timeout: Duration,
    on_node_lost: Exit,
    first: Mutex<Option<(MemberName, ActorCell)>>,
    /// The placement-group bundle it runs in, instead of `place`.
    bundle: Option<(GroupId, usize)>,
    /// The node (and its incarnation) its latest copy was started on: a
    /// start stops that copy first, so that two never run.
    latest: Arc<Mutex<Option<MemberRef>>>,
}

impl RemoteChild {
    /// A child `actor` (its kind, and the name it runs under) with `args`,
    /// placed by `place`, each spawn given `timeout`. A lost node
    /// counts as a failure.
    pub fn new<M: ractor::Message, A: Encode>(
        node: Arc<Node>,
        actor: Named<M, A>,
        args: &A,
        place: impl Fn(&Table) -> Option<MemberName> + Send + Sync + 'static,
        timeout: Duration,
    ) -> Self {
        Self::raw(
            node,
            SpawnOrder::of::<M>(
                actor.kind().name(),
                actor.name(),
                crate::remote::wire::encode(args),
            ),
            place,
            timeout,
        )
    }

    /// [`RemoteChild::new`] with the arguments archived already and the
    /// message type named (as [`Node::config_args`] gives them). The
    /// order's epoch is each start's own.
    pub fn raw(
        node: Arc<Node>,
        order: SpawnOrder,
        place: impl Fn(&Table) -> Option<MemberName> + Send + Sync + 'static,
        timeout: Duration,
    ) -> Self {
        Self {
            node,
            kind: order.kind,
            name: order.name,
            args: order.args,
            message_type: order.message_type,
            place: Arc::new(place),
            timeout,
            on_node_lost: Exit::Failure,
            first: Mutex::new(None),
            bundle: None,
            latest: Arc::new(Mutex::new(None)),
        }
    }

    /// Runs the child in bundle `bundle` of the placement group `group`
    /// instead of where `place` says: each start waits (within its
    /// timeout) for the group to be ready and spawns on the bundle's node,
    /// so after the node is lost the restart follows the bundle to the
    /// node the head placed it on again.
    pub fn in_bundle(mut self, group: impl Into<GroupId>, bundle: usize) -> Self {
        self.bundle = Some((group.into(), bundle));
        self
    }

    /// Counts the loss of the child's node as `exit` instead (a transient
    /// child given [`Exit::Shutdown`] is then not restarted elsewhere).
    pub fn on_node_lost(mut self, exit: Exit) -> Self {
        self.on_node_lost = exit;
        self
    }

    /// Takes `actor`, already spawned on `on`, as the first start.
    pub fn adopt(self, on: impl Into<MemberName>, actor: ActorCell) -> Self {
        *self.first.lock().unwrap_or_else(|p| p.into_inner()) = Some((on.into(), actor));
        self
    }
}

/// How long one request to stop a child's earlier copy may take (the
/// target waits up to three seconds for the copy to end).
const FENCE_ASK: Duration = Duration::from_secs(5);

/// The pause between two requests to stop an earlier copy whose node
/// could not be reached.
const FENCE_RETRY: Duration = Duration::from_millis(250);

impl RemoteChild {
    /// What a spawn of this child's start at `epoch` needs, owned.
    fn spawn(&self, epoch: Epoch) -> Spawn {
        Spawn {
            node: Arc::clone(&self.node),
            kind: self.kind.clone(),
            name: self.name.clone(),
            args: self.args.clone(),
            message_type: self.message_type.clone(),
            epoch,
            latest: Arc::clone(&self.latest),
        }
    }

    fn start_in_bundle(
        &self,
        supervisor: ActorCell,
        spawn: Spawn,
        group: GroupId,
        bundle: usize,
    ) -> BoxFuture<'static, Result<Running, StartChildError>> {
        let node = Arc::clone(&self.node);
        let timeout = self.timeout;
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut view = node
                .wait_group(&group, timeout)
                .await
                .map_err(|e| StartChildError::Placement(e.to_string()))?;
            // The head may not have seen the loss yet, or the link to the
            // bundle's node is being made again: wait for a session to the
            // node or for the bundle to move, whichever comes first.
            let target = loop {
                let Some(target) = view.nodes.get(bundle).cloned() else {
                    return Err(StartChildError::Placement(format!(
                        "placement group {group} has no bundle {bundle}"
                    )));
                };
                let revision = Some(view.revision);
                if node.members().up().any(|m| m.name == target) {
                    tokio::select! {
                        ready = node.wait_session(&target, left()) => {
                            if ready {
                                break target;
                            }
                            return Err(StartChildError::NoNode);
                        }
                        next = node.watch_group(&group, revision, left()) => view = ready_again(next)?,
                    }
                } else {
                    view = ready_again(node.watch_group(&group, revision, left()).await)?;
                }
                if left().is_zero() {
                    return Err(StartChildError::NoNode);
                }
            };
            let cell = spawn.fenced(&target, deadline).await?;
            Ok(monitored(&node, &supervisor, target, cell))
        })
    }
}

/// The group a watch gave, if it is ready (placed again, or unchanged).
fn ready_again(
    watched: Result<Option<GroupView>, PlacementError>,
) -> Result<GroupView, StartChildError> {
    watched
        .map_err(|e| StartChildError::Placement(e.to_string()))?
        .filter(|v| v.state == GroupState::Ready)
        .ok_or(StartChildError::NoNode)
}

/// A remote child's spawn, with what it needs owned.
struct Spawn {
    node: Arc<Node>,
    kind: String,
    name: String,
    args: Vec<u8>,
    message_type: String,
    /// The start's epoch, which the target stamps into a fenced kind's
    /// arguments.
    epoch: Epoch,
    latest: Arc<Mutex<Option<MemberRef>>>,
}

impl Spawn {
    /// Spawns the child on `target` once no earlier copy of it can run on:
    /// the latest copy is stopped first (its node may still run it after
    /// this node lost the link to it), and a name found taken on `target`
    /// is taken by such a copy, stopped in turn before the spawn is asked
    /// again. Neither counts as a failed start unless `deadline` passes.
    async fn fenced(
        &self,
        target: &str,
        deadline: tokio::time::Instant,
    ) -> Result<ActorCell, StartChildError> {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(on) = latest {
            self.fence(
                &on.name,
                Some(on.incarnation).filter(|i| !i.is_tool()),
                deadline,
            )
            .await?;
        }
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.on(target, left.max(Duration::from_secs(1))).await {
                Err(SpawnError::Refused {
                    reply: SpawnReply::NameTaken(_),
                    ..
                }) if !left.is_zero() => {
                    tracing::info!(child = %self.name, node = %target, "the child's name is still taken there: stopping that copy first");
                    self.fence(target, None, deadline).await?;
                }
                Err(e) => return Err(e.into()),
                Ok(cell) => {
                    let incarnation = self.incarnation_of(target);
                    *self.latest.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(MemberRef::new(target, incarnation));
                    return Ok(cell);
                }
            }
        }
    }

    /// Stops the copy of the child that `on` (at `incarnation`; `None`: any)
    /// may still run, and returns once it has ended or cannot run: `on`
    /// holds no such actor, or is no longer up under that incarnation (a
    /// member the head counted out stops every actor it hosts for others
    /// when it comes back). Asks again while `on` cannot be reached, until
    /// `deadline`.
    async fn fence(
        &self,
        on: &str,
        incarnation: Option<Incarnation>,
        deadline: tokio::time::Instant,
    ) -> Result<(), StartChildError> {
        loop {
            let hosts = self
                .node
                .members()
                .live()
                .any(|m| m.name == on && incarnation.is_none_or(|i| m.incarnation == i));
            if !hosts {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let error = match self.node.stop_on(on, &self.name, left.min(FENCE_ASK)).await {
                Ok(()) => {
                    tracing::info!(child = %self.name, node = %on, "the child's earlier copy stopped");
                    return Ok(());
                }
                Err(
                    StopError::Refused {
                        outcome: StopOutcome::NoSuchActor,
                        ..
                    }
                    | StopError::NoSuchNode(_),
                ) => return Ok(()),
                Err(
                    e @ StopError::Refused {
                        outcome: StopOutcome::NotOwner,
                        ..
                    },
                ) => return Err(StartChildError::Fence(e)),
                Err(e) => e,
            };
            if left.is_zero() {
                return Err(StartChildError::Fence(error));
            }
            tracing::debug!(child = %self.name, node = %on, %error, "cannot stop the child's earlier copy yet");
            tokio::time::sleep(FENCE_RETRY.min(left)).await;
        }
    }

    /// The incarnation the member table gives `target` (the default, 0:
    /// not in it).
    fn incarnation_of(&self, target: &str) -> Incarnation {
        self.node
            .members()
            .get(target)
            .map_or(Incarnation::default(), |m| m.incarnation)
    }

    /// Spawns the child on `target`.
    async fn on(&self, target: &str, timeout: Duration) -> Result<ActorCell, SpawnError> {
        self.node
            .spawn_on_raw(
                target,
                SpawnOrder {
                    kind: self.kind.clone(),
                    name: self.name.clone(),
                    args: self.args.clone(),
                    message_type: self.message_type.clone(),
                    epoch: self.epoch,
                },
                timeout,
            )
            .await
    }
}

/// A remote child running as `cell` on `target`, monitored by `supervisor`.
fn monitored(node: &Node, supervisor: &ActorCell, target: MemberName, cell: ActorCell) -> Running {
    let incarnation = node
        .members()
        .get(&target)
        .map_or(Incarnation::default(), |m| m.incarnation);
    supervisor.monitor(cell.clone());
    Running {
        cell,
        node: Some(MemberRef::new(target, incarnation)),
    }
}

impl ChildStart for RemoteChild {
    fn start(
        &self,
        supervisor: ActorCell,
        epoch: Epoch,
    ) -> BoxFuture<'static, Result<Running, StartChildError>> {
        let node = Arc::clone(&self.node);
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let spawn = self.spawn(epoch);
        if let (Some((group, bundle)), None) = (self.bundle.clone(), &first) {
            return self.start_in_bundle(supervisor, spawn, group, bundle);
        }
        let target = first
            .as_ref()
            .map(|(on, _)| on.clone())
            .or_else(|| (self.place)(&node.members()));
        // No node for it now: wait for the table to offer one, within the
        // spawn's time.
        let waiting = target.is_none().then(|| {
            let place = Arc::clone(&self.place);
            let mut view = node.watch_members();
            async move {
                view.wait_for(|t| place(t).is_some())
                    .await
                    .ok()
                    .and_then(|t| place(&t))
            }
        });
        let timeout = self.timeout;
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let target = match (target, waiting) {
                (Some(t), _) => t,
                (None, Some(wait)) => tokio::time::timeout(timeout, wait)
                    .await
                    .ok()
                    .flatten()
                    .ok_or(StartChildError::NoNode)?,
                (None, None) => return Err(StartChildError::NoNode),
            };
            let cell = match first {
                Some((_, cell)) => {
                    let incarnation = spawn.incarnation_of(&target);
                    *spawn.latest.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(MemberRef::new(target.clone(), incarnation));
                    cell
                }
                None => spawn.fenced(&target, deadline).await?,
            };
            Ok(monitored(&node, &supervisor, target, cell))
        })
    }

    fn stop(&self, running: &Running) {
        let Some(MemberRef { name: on, .. }) = running.node.clone() else {
            return;
        };
        let (node, name) = (Arc::clone(&self.node), self.name.clone());
        tokio::spawn(async move {
            if let Err(e) = node.stop_on(&on, &name, Duration::from_secs(5)).await {
                tracing::warn!(%name, node = %on, error = %e, "cannot stop a supervised remote actor");
            }
        });
    }

    fn kill(&self, running: &Running) -> bool {
        // No kill crosses nodes: ask again, and count it as stopped.
        self.stop(running);
        false
    }

    fn on_node_lost(&self) -> Exit {
        self.on_node_lost
    }
}
