//! # Room `supervisor/`: supervision trees and checkpoints
//!
//! Owns the supervisor actor (this file), its children on other nodes
//! ([`RemoteChild`], carved out in `remote_child.rs`) and checkpoint
//! recovery from an external store ([`checkpoint`]). Drives
//! [`flotilla_proto::supervision`] (restart limits, backoff, escalation)
//! and [`flotilla_proto::epoch`] (checkpoint fencing).
//!
//! May import: `node` (remote children are spawned through the façade),
//! `remote`, `objects` and the shared files.
//!
//! Supervisors: the async shell of the proto [`Supervision`] policy over
//! ractor actors. A supervisor is an actor; it starts its children, learns
//! of their exits from ractor's supervision events (local children are
//! linked to it, remote ones monitored through their proxies) and from the
//! member table (a remote child's node that is no longer up), feeds them to
//! the policy with tokio's clock, and performs what the policy asks.
//!
//! ```text
//!   ActorFailed / ActorTerminated ─┐                      ┌─► Start: ChildStart::start (children started together run in parallel)
//!   member table (remote nodes) ───┼─► Supervision ───────┼─► Stop / Kill: ChildStart::stop / kill
//!   Tick (poll_timeout) ───────────┤   (proto policy)     ├─► Escalate: fail, so the parent sees ActorFailed
//!   Shutdown / Status requests ────┘                      └─► events to the owner (started, exited, escalated)
//! ```
//!
//! A supervisor that escalates stops every child and fails with the
//! [`Escalation`]: its own supervisor sees that as a child failure, so trees
//! nest. An owner without a supervisor above it learns of the escalation as
//! [`SupervisorEvent::Escalated`] and decides (a job ends with an error; the
//! `node` binary exits with its documented code).

pub mod checkpoint;
mod remote_child;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flotilla_proto::epoch::Epoch;
use flotilla_proto::incarnation::{Incarnation, MemberRef};
use flotilla_proto::membership::MemberState;
use flotilla_proto::supervision::{Action, Supervision};
use futures::future::BoxFuture;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::{mpsc, watch};

pub use flotilla_proto::supervision::{
    Backoff, ChildSpec, Escalation, Exit, Intensity, RestartType, Strategy, SupervisorSpec,
};

use crate::board::{Board, ChildReport, SupervisorReport};
use crate::clock::now;
use crate::node::{SpawnError, StopError};
use crate::table::Table;
use flotilla_proto::control::EXIT_REASON_SHOWN;

pub use remote_child::{Place, RemoteChild};

/// A child that runs: its cell, and the node it runs on (`None`: this
/// process).
#[derive(Debug, Clone)]
pub struct Running {
    /// The child (for a remote child, its proxy on this node).
    pub cell: ActorCell,
    /// The node it runs on (and that node's incarnation when it
    /// started, 0 if unknown then), for a remote child.
    pub node: Option<MemberRef>,
}

/// Why a child could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartChildError {
    /// The local actor failed to start.
    #[error("the actor failed to start: {0}")]
    Spawn(#[from] ractor::SpawnErr),
    /// The remote spawn failed.
    #[error(transparent)]
    Remote(#[from] SpawnError),
    /// No up node can host it.
    #[error("no up node can host the child")]
    NoNode,
    /// Its placement-group bundle is not ready, or does not exist.
    #[error("its placement group: {0}")]
    Placement(String),
    /// Its earlier copy, on a node still up, could not be stopped within
    /// the start's time: no new copy starts beside it.
    #[error("its earlier copy could not be stopped: {0}")]
    Fence(#[source] StopError),
}

/// How to start and stop one child.
pub trait ChildStart: Send + Sync + 'static {
    /// Starts the child so that `supervisor` hears of its exit: linked to
    /// it (a local actor) or monitored by it (a remote actor's proxy).
    /// `epoch` is larger than every earlier start's: a child that keeps
    /// checkpoints fences them with it ([`crate::supervisor::checkpoint::CheckpointStore::fence`]).
    fn start(
        &self,
        supervisor: ActorCell,
        epoch: Epoch,
    ) -> BoxFuture<'static, Result<Running, StartChildError>>;

    /// Asks the running child to stop.
    fn stop(&self, running: &Running) {
        running.cell.stop(Some(STOP_REASON.to_owned()));
    }

    /// Kills the running child that ignored its stop. Returns whether its
    /// exit will be reported by ractor (false: count it as stopped now).
    fn kill(&self, running: &Running) -> bool {
        running.cell.kill();
        true
    }

    /// How the exit of a remote child is counted when its node is no
    /// longer up (down, left, or back with a new incarnation).
    fn on_node_lost(&self) -> Exit {
        Exit::Failure
    }
}

/// The reason a supervisor gives the children it stops.
pub const STOP_REASON: &str = "supervisor: shutdown";

/// A local actor made afresh for every start by `make` (the actor and its
/// arguments), linked to the supervisor. `adopt` takes an actor already
/// running as the first start.
pub struct LocalChild<A: Actor, F> {
    make: F,
    first: Mutex<Option<ActorRef<A::Msg>>>,
}

impl<A, F> LocalChild<A, F>
where
    A: Actor,
    F: Fn() -> (A, A::Arguments) + Send + Sync + 'static,
{
    /// A child started by spawning what `make` returns.
    pub fn new(make: F) -> Self {
        Self {
            make,
            first: Mutex::new(None),
        }
    }

    /// Takes `running` (spawned unlinked) as the first start; later ones
    /// spawn afresh.
    pub fn adopt(mut self, running: ActorRef<A::Msg>) -> Self {
        self.first = Mutex::new(Some(running));
        self
    }
}

impl<A, F> ChildStart for LocalChild<A, F>
where
    A: Actor,
    F: Fn() -> (A, A::Arguments) + Send + Sync + 'static,
{
    fn start(
        &self,
        supervisor: ActorCell,
        _epoch: Epoch,
    ) -> BoxFuture<'static, Result<Running, StartChildError>> {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(actor) = first {
            actor.get_cell().link(supervisor);
            return Box::pin(async move {
                Ok(Running {
                    cell: actor.get_cell(),
                    node: None,
                })
            });
        }
        let (actor, args) = (self.make)();
        Box::pin(async move {
            let (actor, _) = Actor::spawn_linked(None, actor, args, supervisor).await?;
            Ok(Running {
                cell: actor.get_cell(),
                node: None,
            })
        })
    }
}

/// One child: its spec and how to start it.
pub struct Child {
    /// Id, restart type, shutdown timeout.
    pub spec: ChildSpec,
    start: Arc<dyn ChildStart>,
}

impl Child {
    /// A child with `spec`, started by `start`.
    pub fn new(spec: ChildSpec, start: impl ChildStart) -> Self {
        Self {
            spec,
            start: Arc::new(start),
        }
    }
}

/// What a supervisor tells its owner.
#[derive(Debug, Clone)]
pub enum SupervisorEvent {
    /// The child started (again, after `restarts` restarts).
    Started {
        /// Its id.
        child: String,
        /// Where and what it is now.
        running: Running,
        /// Its restarts so far.
        restarts: u32,
    },
    /// The child exited, or failed to start.
    Exited {
        /// Its id.
        child: String,
        /// How it ended.
        exit: Exit,
        /// Whether it will be started again.
        restarting: bool,
    },
    /// The supervisor gave up: every child is stopped and it fails.
    Escalated(Escalation),
}

/// Messages of a [`Supervisor`] (local only).
pub enum SupervisorMsg {
    /// Time to look at the policy's timers.
    Tick,
    /// The member table changed.
    Members(Table),
    /// Add a child, started at once (see
    /// [`Supervision::add_child`]); answers whether it was added.
    Add(Child, RpcReplyPort<bool>),
    /// Let a child go: stopped, never started again (see
    /// [`Supervision::remove_child`]); answers whether there was one.
    Remove(String, RpcReplyPort<bool>),
    /// Its children and their restarts.
    Status(RpcReplyPort<Vec<ChildReport>>),
    /// The last restart of this child was caused by the work it was
    /// given, already charged once: forgive it
    /// ([`Supervision::pardon`](flotilla_proto::supervision::Supervision::pardon)).
    Pardon(String),
    /// Stop every child (the last first), then the supervisor; answered
    /// once done.
    Shutdown(RpcReplyPort<()>),
}

impl ractor::Message for SupervisorMsg {}

/// What a supervisor is started with.
pub struct SupervisorArgs {
    /// Strategy, intensity, backoff.
    pub spec: SupervisorSpec,
    /// Its children, in start order.
    pub children: Vec<Child>,
    /// Where it reports starts, exits and escalation, if anywhere.
    pub events: Option<mpsc::UnboundedSender<SupervisorEvent>>,
    /// The member table, for remote children whose node is lost.
    pub members: Option<watch::Receiver<Table>>,
    /// The jitter's seed, and the floor of the epochs its children's
    /// starts get (give the node's incarnation: larger than every epoch an
    /// earlier run of the node gave).
    pub seed: u64,
    /// The name it reports its children under on a node's board
    /// ([`Node::board`]: `node status` lists them), if it reports.
    pub report: Option<(String, Board)>,
}

/// A supervisor actor. Start it with [`Actor::spawn`] (a root) or
/// [`Actor::spawn_linked`] (under another supervisor).
pub struct Supervisor;

/// A supervisor's state.
pub struct SupervisorState {
    policy: Supervision,
    starts: HashMap<String, Arc<dyn ChildStart>>,
    running: HashMap<String, Running>,
    by_cell: HashMap<ActorId, String>,
    events: Option<mpsc::UnboundedSender<SupervisorEvent>>,
    /// When a Tick is due already.
    tick_at: Option<std::time::Instant>,
    /// Shutdown requests waiting for the children to stop.
    shutdown: Vec<RpcReplyPort<()>>,
    relay: Option<tokio::task::JoinHandle<()>>,
    report: Option<(String, Board)>,
    /// Whether the owner was told of the escalation.
    told_escalation: bool,
    /// Gives each start its epoch.
    epochs: flotilla_proto::epoch::EpochClock,
    /// The epoch of each child's latest start.
    epoch_of: HashMap<String, Epoch>,
    /// How each child's last run ended.
    last_exit: HashMap<String, String>,
}

impl SupervisorState {
    /// Its children as `node status` shows them.
    fn status(&self) -> Vec<ChildReport> {
        self.policy
            .children()
            .map(|id| ChildReport {
                id: id.to_owned(),
                running: self.policy.is_running(id),
                restarts: self.policy.restarts_of(id).unwrap_or(0),
                epoch: self.epoch_of.get(id).copied().unwrap_or_default(),
                node: self
                    .running
                    .get(id)
                    .and_then(|r| r.node.as_ref().map(|n| n.name.clone())),
                last_exit: self.last_exit.get(id).cloned(),
            })
            .collect()
    }

    /// Posts the children's state on the board, if it reports.
    fn post(&self, gave_up: bool) {
        let Some((name, board)) = &self.report else {
            return;
        };
        let intensity = self.policy.intensity();
        // The window's restarts on the wall clock, so that a reader can
        // tell which still count when it reads.
        let (at, wall) = (now(), crate::clock::clock_millis());
        let restarts_unix_ms = self
            .policy
            .restarts_in_window(at)
            .into_iter()
            .map(|t| wall.saturating_sub(at.saturating_duration_since(t).as_millis() as u64))
            .collect();
        board.post(SupervisorReport {
            name: name.clone(),
            strategy: self.policy.strategy().as_str().to_owned(),
            gave_up,
            max_restarts: intensity.max_restarts,
            within_ms: intensity.within.as_millis() as u64,
            restarts_unix_ms,
            children: self.status(),
        });
    }

    fn emit(&self, event: SupervisorEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }

    /// Performs the policy's actions until it has none; fails with the
    /// escalation when it escalates.
    async fn perform(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
    ) -> Result<(), ActorProcessingErr> {
        loop {
            let mut starts = Vec::new();
            let mut next = None;
            while let Some(action) = self.policy.poll_action() {
                match action {
                    Action::Start(id) => starts.push(id),
                    other => {
                        next = Some(other);
                        break;
                    }
                }
            }
            if starts.is_empty() && next.is_none() {
                break;
            }
            // Children asked to start together start in parallel.
            let clock = crate::clock::clock_micros();
            let mut begun = Vec::with_capacity(starts.len());
            for id in &starts {
                let epoch = self.epochs.next(clock);
                self.epoch_of.insert(id.clone(), epoch);
                begun.push(Arc::clone(&self.starts[id]).start(myself.get_cell(), epoch));
            }
            let results = futures::future::join_all(begun).await;
            for (id, result) in starts.into_iter().zip(results) {
                match result {
                    Ok(running) => {
                        self.by_cell.insert(running.cell.get_id(), id.clone());
                        self.running.insert(id.clone(), running.clone());
                        self.policy.handle_started(now(), &id);
                        let restarts = self.policy.restarts_of(&id).unwrap_or(0);
                        if restarts > 0 {
                            tracing::info!(child = %id, restarts, "child restarted");
                        }
                        self.emit(SupervisorEvent::Started {
                            child: id,
                            running,
                            restarts,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(child = %id, error = %e, "child failed to start");
                        self.exited(id, Exit::Failure, &format!("failed to start: {e}"));
                    }
                }
            }
            match next {
                None => {}
                Some(Action::Start(_)) => unreachable!("starts are gathered above"),
                Some(Action::Stop(id)) => {
                    if let Some(r) = self.running.get(&id) {
                        self.starts[&id].stop(r);
                    }
                }
                Some(Action::Kill(id)) => {
                    if let Some(r) = self.running.get(&id).cloned() {
                        tracing::warn!(child = %id, "child ignored its stop; killing it");
                        if !self.starts[&id].kill(&r) {
                            self.forget(&r.cell.get_id());
                            myself.get_cell().unmonitor(r.cell.clone());
                            self.exited(id, Exit::Shutdown, "killed after ignoring its stop");
                        }
                    }
                }
                Some(Action::Escalate(e)) => {
                    tracing::error!(error = %e, "supervisor gives up");
                    self.post(true);
                    self.tell_escalation();
                    return Err(Box::new(e));
                }
                Some(Action::Stopped) => {
                    for port in self.shutdown.drain(..) {
                        let _ = port.send(());
                    }
                    myself.stop(None);
                }
            }
        }
        self.schedule(myself);
        self.post(false);
        Ok(())
    }

    fn schedule(&mut self, myself: &ActorRef<SupervisorMsg>) {
        let Some(at) = self.policy.poll_timeout() else {
            return;
        };
        if self.tick_at.is_some_and(|t| t <= at) {
            return;
        }
        self.tick_at = Some(at);
        let wait = at.saturating_duration_since(now());
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.cast(SupervisorMsg::Tick);
        });
    }

    fn forget(&mut self, cell: &ActorId) -> Option<(String, Running)> {
        let id = self.by_cell.remove(cell)?;
        let running = self.running.remove(&id)?;
        Some((id, running))
    }

    /// Tells the owner the supervisor gives up, once: as soon as the
    /// policy decides, before the exits of the children it stops, so an
    /// owner never mistakes them for an ordinary loss.
    fn tell_escalation(&mut self) {
        if self.told_escalation {
            return;
        }
        if let Some(e) = self.policy.escalation() {
            self.told_escalation = true;
            self.emit(SupervisorEvent::Escalated(e.clone()));
        }
    }

    /// The child `id` is moved off a draining node (see
    /// [`Supervision::handle_moved`]): its owner hears of a stop.
    fn moved(&mut self, id: String) {
        self.policy.handle_moved(now(), &id);
        let restarting = self.policy.is_restarting(&id);
        self.emit(SupervisorEvent::Exited {
            child: id,
            exit: Exit::Shutdown,
            restarting,
        });
    }

    fn exited(&mut self, id: String, exit: Exit, why: &str) {
        tracing::info!(child = %id, ?exit, why, "child exited");
        let why = flotilla_proto::job_stats::clip(why, EXIT_REASON_SHOWN);
        self.last_exit.insert(id.clone(), why.to_owned());
        // A child this supervisor asked to stop (a shutdown, a sibling's
        // restart, let go) stopped: its owner hears a shutdown, whatever a
        // remote exit reads as.
        let exit = if self.policy.is_stopping(&id) {
            Exit::Shutdown
        } else {
            exit
        };
        self.policy.handle_exit(now(), &id, exit);
        self.tell_escalation();
        let restarting = self.policy.is_restarting(&id);
        self.emit(SupervisorEvent::Exited {
            child: id,
            exit,
            restarting,
        });
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let specs = args.children.iter().map(|c| c.spec.clone()).collect();
        let starts = args
            .children
            .into_iter()
            .map(|c| (c.spec.id, c.start))
            .collect();
        let relay = args.members.map(|mut rx| {
            let me = myself.clone();
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let table = rx.borrow_and_update().clone();
                    if me.cast(SupervisorMsg::Members(table)).is_err() {
                        return;
                    }
                }
            })
        });
        Ok(SupervisorState {
            report: args.report,
            told_escalation: false,
            policy: Supervision::new(args.spec, specs, args.seed),
            starts,
            running: HashMap::new(),
            by_cell: HashMap::new(),
            events: args.events,
            tick_at: None,
            shutdown: Vec::new(),
            relay,
            epochs: flotilla_proto::epoch::EpochClock::new(args.seed),
            epoch_of: HashMap::new(),
            last_exit: HashMap::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        state.policy.start(now());
        state.perform(&myself).await
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(relay) = state.relay.take() {
            relay.abort();
        }
        if let Some((name, board)) = &state.report {
            board.remove(name);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Tick => {
                state.tick_at = None;
                state.policy.handle_timeout(now());
            }
            SupervisorMsg::Members(table) => {
                let mut lost: Vec<(ActorId, String)> = Vec::new();
                let mut moved: Vec<(ActorId, String)> = Vec::new();
                for (id, r) in &mut state.running {
                    let Some(on) = r.node.as_mut() else {
                        continue;
                    };
                    // Absent (a restarted head's table filling): not lost.
                    let Some(m) = table.get(&on.name) else {
                        continue;
                    };
                    if on.incarnation == Incarnation::default() && m.state.is_live() {
                        // Not in the table when the child started.
                        on.incarnation = m.incarnation;
                    }
                    if !m.state.is_live() || m.incarnation > on.incarnation {
                        lost.push((r.cell.get_id(), id.clone()));
                    } else if m.state == MemberState::Draining {
                        moved.push((r.cell.get_id(), id.clone()));
                    }
                }
                for (cell, id) in moved {
                    // Its node is draining: stopped there, started again
                    // on another (in its bundle, placed again by now),
                    // not charged.
                    if let Some((_, r)) = state.forget(&cell) {
                        myself.get_cell().unmonitor(r.cell.clone());
                        state.starts[&id].stop(&r);
                    }
                    tracing::info!(child = %id, "the node of a supervised child is draining; moving it");
                    state.moved(id);
                }
                for (cell, id) in lost {
                    let exit = state.starts[&id].on_node_lost();
                    if let Some((_, r)) = state.forget(&cell) {
                        myself.get_cell().unmonitor(r.cell.clone());
                    }
                    tracing::warn!(child = %id, "the node of a supervised child is no longer up");
                    state.exited(id, exit, "its node is no longer up");
                }
            }
            SupervisorMsg::Status(port) => {
                let _ = port.send(state.status());
            }
            SupervisorMsg::Add(child, port) => {
                let id = child.spec.id.clone();
                let added = !state.starts.contains_key(&id) && state.policy.add_child(child.spec);
                if added {
                    state.starts.insert(id, child.start);
                }
                let _ = port.send(added);
            }
            SupervisorMsg::Remove(id, port) => {
                let _ = port.send(state.policy.remove_child(now(), &id));
            }
            SupervisorMsg::Pardon(child) => {
                if state.policy.pardon(&child) {
                    tracing::info!(%child, "restart forgiven: the work it was given crashed it");
                }
            }
            SupervisorMsg::Shutdown(port) => {
                state.shutdown.push(port);
                if state.policy.is_finished() {
                    for port in state.shutdown.drain(..) {
                        let _ = port.send(());
                    }
                    myself.stop(None);
                    return Ok(());
                }
                state.policy.handle_shutdown(now());
            }
        }
        state.perform(&myself).await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, exit, why) = match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(id) = state.by_cell.get(&cell.get_id()) {
                    tracing::warn!(child = %id, %error, "child failed");
                }
                (cell, Exit::Failure, format!("failed: {error}"))
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let remote = state
                    .by_cell
                    .get(&cell.get_id())
                    .and_then(|id| state.running.get(id))
                    .is_some_and(|r| r.node.is_some());
                let exit = match reason.as_deref() {
                    // A remote actor's reason does not cross nodes: an exit
                    // not asked for is a failure.
                    _ if remote => Exit::Failure,
                    None => Exit::Normal,
                    Some(_) => Exit::Shutdown,
                };
                let why = match (reason, exit) {
                    (Some(reason), _) => format!("stopped: {reason}"),
                    (None, Exit::Failure) => "ended on its node".to_owned(),
                    (None, _) => "stopped by itself".to_owned(),
                };
                (cell, exit, why)
            }
            _ => return Ok(()),
        };
        if let Some((id, _)) = state.forget(&cell.get_id()) {
            state.exited(id, exit, &why);
            state.perform(&myself).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A child that counts its starts, panics on `Crash`, and sleeps
    /// through its stop when told to hang.
    struct Flaky {
        starts: Arc<std::sync::atomic::AtomicU32>,
        fail_start: bool,
    }

    enum FlakyMsg {
        Crash,
        Hang(Duration),
    }

    impl ractor::Message for FlakyMsg {}

    impl Actor for Flaky {
        type Msg = FlakyMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<FlakyMsg>, (): ()) -> Result<(), ActorProcessingErr> {
            self.starts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.fail_start {
                return Err("cannot start".into());
            }
            Ok(())
        }

        async fn handle(
            &self,
            _: ActorRef<FlakyMsg>,
            msg: FlakyMsg,
            (): &mut (),
        ) -> Result<(), ActorProcessingErr> {
            match msg {
                FlakyMsg::Crash => panic!("crash on request"),
                FlakyMsg::Hang(d) => tokio::time::sleep(d).await,
            }
            Ok(())
        }
    }

    fn flaky(
        id: &str,
        starts: &Arc<std::sync::atomic::AtomicU32>,
        fail_start: bool,
        restart: RestartType,
    ) -> Child {
        let starts = Arc::clone(starts);
        let spec = ChildSpec {
            id: id.into(),
            restart,
            shutdown: Duration::from_secs(5),
        };
        Child::new(
            spec,
            LocalChild::new(move || {
                (
                    Flaky {
                        starts: Arc::clone(&starts),
                        fail_start,
                    },
                    (),
                )
            }),
        )
    }

    async fn supervisor(
        children: Vec<Child>,
        max_restarts: u32,
    ) -> (
        ActorRef<SupervisorMsg>,
        mpsc::UnboundedReceiver<SupervisorEvent>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let args = SupervisorArgs {
            spec: SupervisorSpec {
                strategy: Strategy::OneForOne,
                intensity: Intensity {
                    max_restarts,
                    within: Duration::from_secs(60),
                },
                per_child: false,
                backoff: Backoff {
                    initial: Duration::from_millis(100),
                    max: Duration::from_secs(1),
                    jitter: 0.0,
                    reset_after: Duration::from_secs(30),
                },
            },
            children,
            events: Some(tx),
            members: None,
            seed: 1,
            report: None,
        };
        let (sup, handle) = Actor::spawn(None, Supervisor, args).await.unwrap();
        (sup, rx, handle)
    }

    fn started(event: SupervisorEvent) -> (String, ActorCell, u32) {
        match event {
            SupervisorEvent::Started {
                child,
                running,
                restarts,
            } => (child, running.cell, restarts),
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_child_is_restarted_after_its_backoff() {
        let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (sup, mut events, _) =
            supervisor(vec![flaky("a", &starts, false, RestartType::Permanent)], 3).await;
        let (_, cell, restarts) = started(events.recv().await.unwrap());
        assert_eq!(restarts, 0);
        let before = tokio::time::Instant::now();
        ActorRef::<FlakyMsg>::from(cell)
            .cast(FlakyMsg::Crash)
            .unwrap();
        assert!(matches!(
            events.recv().await.unwrap(),
            SupervisorEvent::Exited {
                exit: Exit::Failure,
                restarting: true,
                ..
            }
        ));
        let (child, _, restarts) = started(events.recv().await.unwrap());
        assert_eq!((child.as_str(), restarts), ("a", 1));
        assert!(
            before.elapsed() >= Duration::from_millis(100),
            "waited its backoff"
        );
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 2);
        let status = flotilla_call(&sup).await;
        assert_eq!(status.len(), 1);
        let first_epoch = status[0].epoch;
        // Its last run's end, as the supervisor saw it.
        let last_exit = status[0].last_exit.clone();
        assert!(
            last_exit
                .as_deref()
                .is_some_and(|w| w.starts_with("failed: ")),
            "{last_exit:?}"
        );
        assert_eq!(
            status,
            [ChildReport {
                id: "a".into(),
                running: true,
                restarts: 1,
                epoch: first_epoch,
                node: None,
                last_exit,
            }]
        );
        assert!(first_epoch.micros() > 2, "above the floor (the seed)");
    }

    async fn flotilla_call(sup: &ActorRef<SupervisorMsg>) -> Vec<ChildReport> {
        crate::remote::call::call(sup, SupervisorMsg::Status, Duration::from_secs(1))
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_that_cannot_start_escalates_and_the_supervisor_fails() {
        let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let healthy = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (_sup, mut events, handle) = supervisor(
            vec![
                flaky("ok", &healthy, false, RestartType::Permanent),
                flaky("bad", &starts, true, RestartType::Permanent),
            ],
            2,
        )
        .await;
        let mut escalation = None;
        while let Some(e) = events.recv().await {
            if let SupervisorEvent::Escalated(e) = e {
                escalation = Some(e);
            }
        }
        let e = escalation.expect("escalated");
        assert_eq!((e.child.as_str(), e.max_restarts), ("bad", 2));
        // The first start and two restarts, no more.
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 3);
        handle.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_nested_supervisor_that_gives_up_is_restarted_by_its_parent() {
        let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let inner_starts = Arc::clone(&starts);
        let inner = Child::new(
            ChildSpec::permanent("inner"),
            LocalChild::new(move || {
                let args = SupervisorArgs {
                    spec: SupervisorSpec {
                        intensity: Intensity {
                            max_restarts: 0,
                            within: Duration::from_secs(60),
                        },
                        backoff: Backoff::NONE,
                        ..SupervisorSpec::default()
                    },
                    children: vec![flaky("leaf", &inner_starts, true, RestartType::Permanent)],
                    events: None,
                    members: None,
                    seed: 2,
                    report: None,
                };
                (Supervisor, args)
            }),
        );
        let (sup, mut events, _) = supervisor(vec![inner], 1).await;
        let mut exits = 0;
        let mut escalated = false;
        while let Some(e) = events.recv().await {
            match e {
                SupervisorEvent::Exited { exit, .. } => {
                    assert_eq!(exit, Exit::Failure);
                    exits += 1;
                }
                SupervisorEvent::Escalated(_) => escalated = true,
                SupervisorEvent::Started { .. } => {}
            }
        }
        // The inner tree failed twice (its leaf cannot start): restarted
        // once by the outer one, whose limit is one, which then gives up.
        assert_eq!(exits, 2);
        assert!(escalated);
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 2);
        drop(sup);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_kills_a_child_that_ignores_its_stop_after_its_timeout() {
        let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (sup, mut events, handle) =
            supervisor(vec![flaky("a", &starts, false, RestartType::Permanent)], 3).await;
        let (_, cell, _) = started(events.recv().await.unwrap());
        ActorRef::<FlakyMsg>::from(cell)
            .cast(FlakyMsg::Hang(Duration::from_secs(3600)))
            .unwrap();
        tokio::task::yield_now().await;
        let before = tokio::time::Instant::now();
        crate::remote::call::call(&sup, SupervisorMsg::Shutdown, Duration::from_secs(60))
            .await
            .unwrap();
        let took = before.elapsed();
        assert!(
            took >= Duration::from_secs(5) && took < Duration::from_secs(6),
            "killed after {took:?}"
        );
        handle.await.unwrap();
    }
}
