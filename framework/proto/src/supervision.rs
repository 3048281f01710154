//! The restart policy of a supervisor, after Erlang/OTP's: which children
//! to restart when one exits, when to give up (restart intensity), how long
//! to wait first (backoff), and how children are stopped (a shutdown
//! timeout, then a kill).
//!
//! ```text
//!  child exits ─► restart type says ─ no ──► removed (temporary; transient after normal/shutdown)
//!                      │ yes
//!                      ▼
//!             more than max_restarts ─ yes ─► stop every child (last first) ─► Escalate
//!             within `within`?
//!                      │ no
//!                      ▼
//!  one_for_one:  restart it                       ┐
//!  one_for_all:  stop the others, restart all     ├─ after the backoff
//!  rest_for_one: stop those started after it,     │  (doubling, jittered,
//!                restart it and them              ┘   reset after a quiet spell)
//!
//!  stop: Stop ── exit within `shutdown` ──► stopped
//!          └──── no exit by then ─► Kill ─► stopped
//! ```
//!
//! Children are stopped one at a time, the last started first; restarted
//! children start in their order. A temporary child is never restarted,
//! not even when a sibling's failure stopped it. The supervisor's own
//! shutdown ([`Supervision::handle_shutdown`]) stops every child the same
//! way and then reports [`Action::Stopped`].
//!
//! The caller performs the actions it polls and reports what became of them
//! with the current time; the jitter's randomness comes from a seed passed
//! in, so a run is reproducible. Nothing here does I/O.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// When a child that exited is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RestartType {
    /// Always.
    Permanent,
    /// Only after a failure (not after a normal exit or a shutdown).
    Transient,
    /// Never.
    Temporary,
}

impl RestartType {
    /// Whether a child of this type that ended with `exit` is restarted.
    pub fn restarts_after(self, exit: Exit) -> bool {
        match self {
            Self::Permanent => true,
            Self::Transient => exit == Exit::Failure,
            Self::Temporary => false,
        }
    }

    /// Its name in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Permanent => "permanent",
            Self::Transient => "transient",
            Self::Temporary => "temporary",
        }
    }
}

impl std::str::FromStr for RestartType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "permanent" => Ok(Self::Permanent),
            "transient" => Ok(Self::Transient),
            "temporary" => Ok(Self::Temporary),
            other => Err(format!(
                "unknown restart type {other:?} (permanent, transient or temporary)"
            )),
        }
    }
}

/// Which children a failure restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Only the child that exited.
    #[default]
    OneForOne,
    /// Every child.
    OneForAll,
    /// The child that exited and those started after it.
    RestForOne,
}

impl Strategy {
    /// Its name in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OneForOne => "one_for_one",
            Self::OneForAll => "one_for_all",
            Self::RestForOne => "rest_for_one",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "one_for_one" => Ok(Self::OneForOne),
            "one_for_all" => Ok(Self::OneForAll),
            "rest_for_one" => Ok(Self::RestForOne),
            other => Err(format!(
                "unknown strategy {other:?} (one_for_one, one_for_all or rest_for_one)"
            )),
        }
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exit {
    /// It finished its work and stopped by itself.
    Normal,
    /// It was asked to stop, or killed.
    Shutdown,
    /// It failed: panicked, returned an error, failed to start, or its node
    /// went down.
    Failure,
}

/// Restart intensity: more than `max_restarts` restarts within `within`
/// and the supervisor gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intensity {
    /// Restarts allowed within the window.
    pub max_restarts: u32,
    /// The sliding window.
    pub within: Duration,
}

impl Default for Intensity {
    /// 5 restarts per 60 s.
    fn default() -> Self {
        Self {
            max_restarts: 5,
            within: Duration::from_secs(60),
        }
    }
}

/// The wait before a restart: `initial`, doubled for each restart in a row,
/// at most `max`, stretched by up to `jitter` (a fraction) at random; the
/// streak starts again once no restart happened for `reset_after`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Random stretch, a fraction of the wait in `[0, 1]`.
    pub jitter: f64,
    /// A quiet spell after which the waits start from `initial` again.
    pub reset_after: Duration,
}

impl Backoff {
    /// No wait: restart at once, as OTP does.
    pub const NONE: Self = Self {
        initial: Duration::ZERO,
        max: Duration::ZERO,
        jitter: 0.0,
        reset_after: Duration::ZERO,
    };

    /// The wait for the `streak`-th restart in a row (from 1), with `unit`
    /// in `[0, 1)` drawn for the jitter.
    pub fn delay(&self, streak: u32, unit: f64) -> Duration {
        let doublings = streak.saturating_sub(1).min(31);
        let base = self.initial.saturating_mul(1u32 << doublings).min(self.max);
        let stretch = 1.0 + self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        base.mul_f64(stretch).min(self.max)
    }
}

impl Default for Backoff {
    /// From 100 ms to 10 s, 20 % jitter, reset after 30 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            jitter: 0.2,
            reset_after: Duration::from_secs(30),
        }
    }
}

/// How a supervisor restarts its children.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SupervisorSpec {
    /// Which children a failure restarts.
    pub strategy: Strategy,
    /// When to give up.
    pub intensity: Intensity,
    /// Whether the intensity counts each child's restarts on their own
    /// (a pool of like workers, where one bad worker should not use up the
    /// others' allowance) instead of all the supervisor's together (OTP).
    pub per_child: bool,
    /// How long to wait before a restart.
    pub backoff: Backoff,
}

/// One child of a supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    /// Its id, unique among its siblings.
    pub id: String,
    /// When it is restarted.
    pub restart: RestartType,
    /// How long it has to stop when asked before it is killed.
    pub shutdown: Duration,
}

impl ChildSpec {
    /// A permanent child with a 5 s shutdown timeout.
    pub fn permanent(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            restart: RestartType::Permanent,
            shutdown: Duration::from_secs(5),
        }
    }
}

/// Why a supervisor gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "child {child:?} needed more than {max_restarts} restarts within {within:?}: the supervisor gave up"
)]
pub struct Escalation {
    /// The child whose exit went past the limit.
    pub child: String,
    /// The limit.
    pub max_restarts: u32,
    /// Its window.
    pub within: Duration,
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start (or restart) the child; report [`Supervision::handle_started`],
    /// or [`Supervision::handle_exit`] with [`Exit::Failure`] if it could
    /// not start.
    Start(String),
    /// Ask the child to stop; report its exit.
    Stop(String),
    /// The child did not stop within its shutdown timeout: kill it; report
    /// its exit.
    Kill(String),
    /// Every child is stopped and the supervisor gives up: fail to the
    /// parent with this.
    Escalate(Escalation),
    /// Every child is stopped after [`Supervision::handle_shutdown`].
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Asked to start; not known to run yet.
    Starting,
    Running,
    /// To be started at `due`.
    Waiting {
        due: Instant,
    },
    /// Asked to stop; killed at `kill_at` unless it exits first.
    Stopping {
        kill_at: Option<Instant>,
    },
    /// Not running, waiting for the stops of a group restart.
    Exited,
    /// Not running and not to be restarted.
    Removed,
}

impl State {
    fn runs(self) -> bool {
        matches!(self, Self::Starting | Self::Running | Self::Stopping { .. })
    }
}

#[derive(Debug, Clone)]
struct Child {
    spec: ChildSpec,
    state: State,
    restarts: u32,
    /// Its restarts within the window, when counted per child.
    recent: VecDeque<Instant>,
}

/// What to do once the children queued for stopping are stopped.
#[derive(Debug, Clone, PartialEq)]
enum After {
    Nothing,
    /// Restart these children (indices), after one backoff.
    Restart(BTreeSet<usize>),
    Escalate(Escalation),
    Shutdown,
}

/// A supervisor's policy over its children.
#[derive(Debug, Clone)]
pub struct Supervision {
    spec: SupervisorSpec,
    children: Vec<Child>,
    /// When the restarts within the window happened.
    restarts: VecDeque<Instant>,
    /// Restarts in a row, and when the last was.
    streak: u32,
    last_restart: Option<Instant>,
    rng: u64,
    /// Children to stop, one at a time, in this order.
    stop_queue: VecDeque<usize>,
    /// Children let go: removed once stopped, never started again.
    letting_go: BTreeSet<usize>,
    after: After,
    /// Decided when the intensity was passed.
    escalation: Option<Escalation>,
    started: bool,
    finished: bool,
    actions: VecDeque<Action>,
}

impl Supervision {
    /// The policy `spec` over `children` (in start order), drawing its
    /// jitter from `seed`. Nothing starts before [`Supervision::start`].
    ///
    /// # Panics
    ///
    /// If two children have the same id.
    pub fn new(spec: SupervisorSpec, children: Vec<ChildSpec>, seed: u64) -> Self {
        let ids: BTreeSet<&str> = children.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), children.len(), "child ids must be unique");
        Self {
            spec,
            children: children
                .into_iter()
                .map(|spec| Child {
                    spec,
                    state: State::Removed,
                    restarts: 0,
                    recent: VecDeque::new(),
                })
                .collect(),
            restarts: VecDeque::new(),
            streak: 0,
            last_restart: None,
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
            stop_queue: VecDeque::new(),
            letting_go: BTreeSet::new(),
            after: After::Nothing,
            escalation: None,
            started: false,
            finished: false,
            actions: VecDeque::new(),
        }
    }

    /// Starts every child, in order (once; later calls do nothing).
    pub fn start(&mut self, _now: Instant) {
        if self.started {
            return;
        }
        self.started = true;
        for c in &mut self.children {
            c.state = State::Starting;
            self.actions.push_back(Action::Start(c.spec.id.clone()));
        }
    }

    /// Adds the child `spec` to a running supervisor, started at once
    /// (after those already there, so last in start order). Returns
    /// whether it was added: not when its id is taken, or the supervisor
    /// has not started, is giving up or shutting down.
    pub fn add_child(&mut self, spec: ChildSpec) -> bool {
        if !self.started
            || self.finished
            || self.index(&spec.id).is_some()
            || matches!(self.after, After::Escalate(_) | After::Shutdown)
        {
            return false;
        }
        self.actions.push_back(Action::Start(spec.id.clone()));
        self.children.push(Child {
            spec,
            state: State::Starting,
            restarts: 0,
            recent: VecDeque::new(),
        });
        true
    }

    /// Lets the child `id` go: stopped if it runs (after the stops queued
    /// before it), then never started again, whatever its restart type
    /// (a pool that shrinks). Returns whether there was such a child still
    /// to let go.
    pub fn remove_child(&mut self, now: Instant, id: &str) -> bool {
        let Some(i) = self.index(id) else {
            return false;
        };
        match self.children[i].state {
            State::Removed => return false,
            State::Waiting { .. } | State::Exited => self.children[i].state = State::Removed,
            State::Stopping { .. } => {
                self.letting_go.insert(i);
            }
            State::Starting | State::Running => {
                self.letting_go.insert(i);
                if !self.stop_queue.contains(&i) {
                    self.stop_queue.push_back(i);
                }
                self.advance(now);
            }
        }
        true
    }

    /// The state of child `i` once a stop asked of it is done: removed if
    /// it was let go, else exited (a group restart may start it again).
    fn stopped(&mut self, i: usize) -> State {
        if self.letting_go.remove(&i) {
            State::Removed
        } else {
            State::Exited
        }
    }

    /// Whether the child `id` was asked to stop and has not exited yet.
    pub fn is_stopping(&self, id: &str) -> bool {
        self.index(id)
            .is_some_and(|i| matches!(self.children[i].state, State::Stopping { .. }))
    }

    /// The child `id` runs.
    pub fn handle_started(&mut self, _now: Instant, id: &str) {
        if let Some(c) = self.child_mut(id)
            && c.state == State::Starting
        {
            c.state = State::Running;
        }
    }

    /// The child `id` ended with `exit` (or could not start: `Failure`).
    pub fn handle_exit(&mut self, now: Instant, id: &str, exit: Exit) {
        let Some(i) = self.index(id) else { return };
        match self.children[i].state {
            State::Stopping { .. } => {
                // Asked for (or it beat the request, which is then moot):
                // the next stop may go.
                let id = self.children[i].spec.id.clone();
                self.actions
                    .retain(|a| !matches!(a, Action::Stop(c) | Action::Kill(c) if *c == id));
                self.children[i].state = self.stopped(i);
                self.advance(now);
            }
            State::Starting | State::Running if self.stop_queue.contains(&i) => {
                // It was going to be stopped anyway.
                self.stop_queue.retain(|j| *j != i);
                self.children[i].state = self.stopped(i);
                self.advance(now);
            }
            State::Starting | State::Running => self.exited(now, i, exit),
            State::Waiting { .. } | State::Exited | State::Removed => {}
        }
    }

    /// The child `id` was moved: its node is draining, so it was stopped
    /// there to start again on another. It starts again at once, and the
    /// restart is charged neither to the restart intensity nor to the
    /// backoff (the child did nothing wrong); a temporary child is not
    /// started again. A child stopping already, or one whose supervisor is
    /// giving up or shutting down, is taken as stopped.
    pub fn handle_moved(&mut self, now: Instant, id: &str) {
        let Some(i) = self.index(id) else { return };
        let movable = matches!(self.children[i].state, State::Starting | State::Running)
            && !self.stop_queue.contains(&i)
            && !matches!(self.after, After::Escalate(_) | After::Shutdown);
        if !movable {
            self.handle_exit(now, id, Exit::Shutdown);
            return;
        }
        if self.children[i].spec.restart == RestartType::Temporary {
            self.children[i].state = State::Removed;
            self.advance(now);
            return;
        }
        self.children[i].restarts += 1;
        self.children[i].state = State::Waiting { due: now };
        self.handle_timeout(now);
    }

    /// The last restart of the child `id` was not its own fault (the work
    /// it was given crashed it, and the caller has already been charged
    /// once for that work): it leaves the restart intensity's window and
    /// the backoff's streak, so one bad input does not use up the
    /// restarts a child is allowed. Returns whether there was a restart to
    /// forgive.
    pub fn pardon(&mut self, id: &str) -> bool {
        let Some(i) = self.index(id) else {
            return false;
        };
        let recent = if self.spec.per_child {
            &mut self.children[i].recent
        } else {
            &mut self.restarts
        };
        if recent.pop_back().is_none() {
            return false;
        }
        self.streak = self.streak.saturating_sub(1);
        true
    }

    /// Stop every child, the last started first, then report
    /// [`Action::Stopped`].
    pub fn handle_shutdown(&mut self, now: Instant) {
        if self.finished || matches!(self.after, After::Escalate(_) | After::Shutdown) {
            return;
        }
        for c in &mut self.children {
            if matches!(c.state, State::Waiting { .. } | State::Exited) {
                c.state = State::Removed;
            }
        }
        self.queue_stops((0..self.children.len()).collect());
        self.after = After::Shutdown;
        self.advance(now);
    }

    /// Time passed: restarts fall due, children that ignored their stop are
    /// killed.
    pub fn handle_timeout(&mut self, now: Instant) {
        for c in &mut self.children {
            match c.state {
                State::Waiting { due } if due <= now => {
                    c.state = State::Starting;
                    self.actions.push_back(Action::Start(c.spec.id.clone()));
                }
                State::Stopping { kill_at: Some(at) } if at <= now => {
                    c.state = State::Stopping { kill_at: None };
                    self.actions.push_back(Action::Kill(c.spec.id.clone()));
                }
                _ => {}
            }
        }
    }

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Supervision::handle_timeout`] has something to do next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.children
            .iter()
            .filter_map(|c| match c.state {
                State::Waiting { due } => Some(due),
                State::Stopping { kill_at } => kill_at,
                _ => None,
            })
            .min()
    }

    /// Its restart intensity.
    pub fn intensity(&self) -> Intensity {
        self.spec.intensity
    }

    /// When the restarts counted against the intensity at `now` happened,
    /// oldest first: those within the window, of the supervisor (or, when
    /// counted per child, of the child nearest to passing it). One more
    /// than [`Intensity::max_restarts`] of them and it gives up.
    pub fn restarts_in_window(&self, now: Instant) -> Vec<Instant> {
        let within = self.spec.intensity.within;
        let counted = |recent: &VecDeque<Instant>| -> Vec<Instant> {
            recent
                .iter()
                .copied()
                .filter(|t| now.saturating_duration_since(*t) < within)
                .collect()
        };
        if self.spec.per_child {
            self.children
                .iter()
                .map(|c| counted(&c.recent))
                .max_by_key(Vec::len)
                .unwrap_or_default()
        } else {
            counted(&self.restarts)
        }
    }

    /// Restarts of the child `id` so far.
    pub fn restarts_of(&self, id: &str) -> Option<u32> {
        self.index(id).map(|i| self.children[i].restarts)
    }

    /// Whether the child `id` is running (or starting, or stopping).
    pub fn is_running(&self, id: &str) -> bool {
        self.index(id)
            .is_some_and(|i| self.children[i].state.runs())
    }

    /// Whether the child `id` is not running but will be started again
    /// (waiting for its backoff or for the stops of its group).
    pub fn is_restarting(&self, id: &str) -> bool {
        self.index(id).is_some_and(|i| {
            matches!(
                self.children[i].state,
                State::Waiting { .. } | State::Exited | State::Starting
            )
        })
    }

    /// Whether the supervisor has escalated or finished its shutdown.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The escalation, from the moment the policy decides to give up (its
    /// children may still be stopping; [`Action::Escalate`] follows once
    /// they are).
    pub fn escalation(&self) -> Option<&Escalation> {
        self.escalation.as_ref()
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.spec.strategy
    }

    /// The children's ids, in start order.
    pub fn children(&self) -> impl Iterator<Item = &str> {
        self.children.iter().map(|c| c.spec.id.as_str())
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.children.iter().position(|c| c.spec.id == id)
    }

    fn child_mut(&mut self, id: &str) -> Option<&mut Child> {
        self.children.iter_mut().find(|c| c.spec.id == id)
    }

    /// A running child `i` ended by itself.
    fn exited(&mut self, now: Instant, i: usize, exit: Exit) {
        if !self.children[i].spec.restart.restarts_after(exit)
            || matches!(self.after, After::Escalate(_) | After::Shutdown)
        {
            self.children[i].state = State::Removed;
            self.advance(now);
            return;
        }
        self.children[i].state = State::Exited;
        // Restart intensity: this restart, and those within the window.
        let within = self.spec.intensity.within;
        let recent = if self.spec.per_child {
            &mut self.children[i].recent
        } else {
            &mut self.restarts
        };
        while recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= within)
        {
            recent.pop_front();
        }
        recent.push_back(now);
        if recent.len() > self.spec.intensity.max_restarts as usize {
            for c in &mut self.children {
                if matches!(c.state, State::Waiting { .. } | State::Exited) {
                    c.state = State::Removed;
                }
            }
            self.stop_queue.clear();
            self.queue_stops((0..self.children.len()).collect());
            let escalation = Escalation {
                child: self.children[i].spec.id.clone(),
                max_restarts: self.spec.intensity.max_restarts,
                within,
            };
            self.escalation = Some(escalation.clone());
            self.after = After::Escalate(escalation);
            self.advance(now);
            return;
        }
        let group: BTreeSet<usize> = match self.spec.strategy {
            Strategy::OneForOne => [i].into(),
            Strategy::OneForAll => (0..self.children.len()).collect(),
            Strategy::RestForOne => (i..self.children.len()).collect(),
        };
        let group: BTreeSet<usize> = group
            .into_iter()
            .filter(|j| *j == i || self.children[*j].state != State::Removed)
            .collect();
        self.children[i].restarts += 1;
        self.queue_stops(group.iter().copied().filter(|j| *j != i).collect());
        match &mut self.after {
            After::Restart(set) => set.extend(group),
            after => *after = After::Restart(group),
        }
        self.advance(now);
    }

    /// Queues the running children among `which` for stopping, the last
    /// started first.
    /// A child whose start has not been polled yet is not started at all.
    fn queue_stops(&mut self, which: BTreeSet<usize>) {
        for j in which.into_iter().rev() {
            let start = Action::Start(self.children[j].spec.id.clone());
            if self.actions.contains(&start) {
                self.actions.retain(|a| *a != start);
                self.children[j].state = State::Exited;
                continue;
            }
            let c = &self.children[j];
            if matches!(c.state, State::Starting | State::Running) && !self.stop_queue.contains(&j)
            {
                self.stop_queue.push_back(j);
            }
        }
    }

    /// Sends the next stop, or, once every queued child is stopped, does
    /// what was waiting for that.
    fn advance(&mut self, now: Instant) {
        if self
            .children
            .iter()
            .any(|c| matches!(c.state, State::Stopping { .. }))
        {
            return;
        }
        if let Some(j) = self.stop_queue.pop_front() {
            let c = &mut self.children[j];
            c.state = State::Stopping {
                kill_at: Some(now + c.spec.shutdown),
            };
            self.actions.push_back(Action::Stop(c.spec.id.clone()));
            return;
        }
        match std::mem::replace(&mut self.after, After::Nothing) {
            After::Nothing => {}
            After::Restart(set) => {
                let delay = self.next_delay(now);
                for j in set {
                    let c = &mut self.children[j];
                    if c.state != State::Exited {
                        continue;
                    }
                    // A temporary child stopped for a sibling stays stopped.
                    c.state = if c.spec.restart == RestartType::Temporary {
                        State::Removed
                    } else {
                        State::Waiting { due: now + delay }
                    };
                }
                self.handle_timeout(now);
            }
            After::Escalate(e) => {
                self.finish();
                self.actions.push_back(Action::Escalate(e));
            }
            After::Shutdown => {
                self.finish();
                self.actions.push_back(Action::Stopped);
            }
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        for c in &mut self.children {
            c.state = State::Removed;
        }
    }

    fn next_delay(&mut self, now: Instant) -> Duration {
        let quiet = self
            .last_restart
            .is_none_or(|t| now.saturating_duration_since(t) >= self.spec.backoff.reset_after);
        self.streak = if quiet { 1 } else { self.streak + 1 };
        self.last_restart = Some(now);
        let unit = self.next_unit();
        self.spec.backoff.delay(self.streak, unit)
    }

    /// A number in `[0, 1)` (splitmix64).
    fn next_unit(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{Just, any, prop_assert, prop_assert_eq, prop_oneof, proptest};
    use proptest::strategy::Strategy as Gen;
    use std::collections::BTreeMap;

    /// Performs a supervisor's actions on pretend children: each starts at
    /// once (unless told to fail), obeys a stop at once unless it hangs,
    /// and dies when killed. Records every action.
    struct Sim {
        s: Supervision,
        now: Instant,
        hangs: BTreeSet<String>,
        fails_to_start: BTreeSet<String>,
        log: Vec<Action>,
    }

    impl Sim {
        fn new(strategy: Strategy, max_restarts: u32, children: &[(&str, RestartType)]) -> Self {
            let spec = SupervisorSpec {
                strategy,
                intensity: Intensity {
                    max_restarts,
                    within: Duration::from_secs(60),
                },
                per_child: false,
                backoff: Backoff::NONE,
            };
            Self::with(spec, children)
        }

        fn with(spec: SupervisorSpec, children: &[(&str, RestartType)]) -> Self {
            let children = children
                .iter()
                .map(|(id, restart)| ChildSpec {
                    id: (*id).into(),
                    restart: *restart,
                    shutdown: Duration::from_secs(5),
                })
                .collect();
            let mut sim = Self {
                s: Supervision::new(spec, children, 7),
                now: Instant::now(),
                hangs: BTreeSet::new(),
                fails_to_start: BTreeSet::new(),
                log: Vec::new(),
            };
            sim.s.start(sim.now);
            sim.run();
            sim.log.clear();
            sim
        }

        fn run(&mut self) {
            while let Some(a) = self.s.poll_action() {
                self.log.push(a.clone());
                match a {
                    Action::Start(id) if self.fails_to_start.contains(&id) => {
                        self.s.handle_exit(self.now, &id, Exit::Failure)
                    }
                    Action::Start(id) => self.s.handle_started(self.now, &id),
                    Action::Stop(id) if self.hangs.contains(&id) => {}
                    Action::Stop(id) | Action::Kill(id) => {
                        self.s.handle_exit(self.now, &id, Exit::Shutdown)
                    }
                    Action::Escalate(_) | Action::Stopped => {}
                }
            }
        }

        fn exit(&mut self, id: &str, exit: Exit) -> Vec<Action> {
            self.log.clear();
            self.s.handle_exit(self.now, id, exit);
            self.run();
            std::mem::take(&mut self.log)
        }

        fn advance(&mut self, by: Duration) -> Vec<Action> {
            self.log.clear();
            self.now += by;
            self.s.handle_timeout(self.now);
            self.run();
            std::mem::take(&mut self.log)
        }
    }

    fn start(id: &str) -> Action {
        Action::Start(id.into())
    }
    fn stop(id: &str) -> Action {
        Action::Stop(id.into())
    }

    use Exit::{Failure, Normal, Shutdown};
    use RestartType::{Permanent, Temporary, Transient};

    #[test]
    fn every_restart_type_against_every_exit_reason() {
        for (restart, exit, restarted) in [
            (Permanent, Normal, true),
            (Permanent, Shutdown, true),
            (Permanent, Failure, true),
            (Transient, Normal, false),
            (Transient, Shutdown, false),
            (Transient, Failure, true),
            (Temporary, Normal, false),
            (Temporary, Shutdown, false),
            (Temporary, Failure, false),
        ] {
            for strategy in [
                Strategy::OneForOne,
                Strategy::OneForAll,
                Strategy::RestForOne,
            ] {
                let mut sim = Sim::new(strategy, 5, &[("a", restart), ("b", Permanent)]);
                let actions = sim.exit("a", exit);
                let case = format!("{restart:?} after {exit:?} under {strategy:?}");
                let expected = match (restarted, strategy) {
                    (false, _) => vec![],
                    (true, Strategy::OneForOne) => vec![start("a")],
                    // b was started after a: both groups stop and restart it.
                    (true, _) => vec![stop("b"), start("a"), start("b")],
                };
                assert_eq!(actions, expected, "{case}");
                assert_eq!(sim.s.is_running("a"), restarted, "{case}");
                assert_eq!(sim.s.restarts_of("a"), Some(u32::from(restarted)), "{case}");
                assert!(sim.s.is_running("b"), "{case}");
            }
        }
    }

    #[test]
    fn one_for_all_stops_the_others_last_first_then_restarts_all_in_order() {
        let mut sim = Sim::new(
            Strategy::OneForAll,
            5,
            &[
                ("a", Permanent),
                ("b", Transient),
                ("c", Permanent),
                ("d", Temporary),
            ],
        );
        assert_eq!(
            sim.exit("b", Failure),
            [
                stop("d"),
                stop("c"),
                stop("a"),
                start("a"),
                start("b"),
                start("c")
            ],
            "the temporary d is stopped and not restarted"
        );
        assert!(!sim.s.is_running("d"));
    }

    #[test]
    fn rest_for_one_restarts_the_child_and_those_started_after_it() {
        let mut sim = Sim::new(
            Strategy::RestForOne,
            5,
            &[("a", Permanent), ("b", Permanent), ("c", Permanent)],
        );
        assert_eq!(sim.exit("b", Failure), [stop("c"), start("b"), start("c")]);
        assert_eq!(sim.exit("c", Failure), [start("c")], "nothing after c");
        assert_eq!(sim.s.restarts_of("a"), Some(0));
    }

    #[test]
    fn a_child_that_always_fails_escalates_after_exactly_max_restarts_for_each_strategy() {
        for strategy in [
            Strategy::OneForOne,
            Strategy::OneForAll,
            Strategy::RestForOne,
        ] {
            let mut sim = Sim::new(
                strategy,
                3,
                &[("a", Permanent), ("b", Permanent), ("c", Permanent)],
            );
            for n in 1..=3 {
                let actions = sim.exit("b", Failure);
                assert!(
                    actions.contains(&start("b")),
                    "{strategy:?} restart {n}: {actions:?}"
                );
            }
            assert_eq!(sim.s.restarts_of("b"), Some(3));
            let actions = sim.exit("b", Failure);
            assert_eq!(
                actions,
                [
                    stop("c"),
                    stop("a"),
                    Action::Escalate(Escalation {
                        child: "b".into(),
                        max_restarts: 3,
                        within: Duration::from_secs(60),
                    })
                ],
                "{strategy:?}"
            );
            assert!(sim.s.is_finished());
            assert_eq!(sim.exit("a", Failure), [], "nothing after the escalation");
            assert!(sim.s.children().all(|c| !sim.s.is_running(c)));
        }
    }

    #[test]
    fn restarts_count_for_the_whole_supervisor_or_per_child() {
        let children = [("a", Permanent), ("b", Permanent)];
        let mut shared = Sim::new(Strategy::OneForOne, 2, &children);
        shared.exit("a", Failure);
        shared.exit("b", Failure);
        assert!(matches!(
            shared.exit("a", Failure).last(),
            Some(Action::Escalate(_))
        ));
        let mut sim = Sim::new(Strategy::OneForOne, 2, &children);
        sim.s.spec.per_child = true;
        for _ in 0..2 {
            assert_eq!(sim.exit("a", Failure), [start("a")]);
            assert_eq!(sim.exit("b", Failure), [start("b")]);
        }
        let actions = sim.exit("b", Failure);
        assert_eq!(
            actions.last(),
            Some(&Action::Escalate(Escalation {
                child: "b".into(),
                max_restarts: 2,
                within: Duration::from_secs(60),
            }))
        );
    }

    #[test]
    fn a_child_that_cannot_start_counts_against_the_intensity() {
        let mut sim = Sim::new(Strategy::OneForOne, 2, &[("a", Permanent)]);
        sim.fails_to_start.insert("a".into());
        let actions = sim.exit("a", Failure);
        assert_eq!(
            actions,
            [
                start("a"),
                start("a"),
                Action::Escalate(Escalation {
                    child: "a".into(),
                    max_restarts: 2,
                    within: Duration::from_secs(60),
                })
            ]
        );
    }

    #[test]
    fn restarts_spread_wider_than_the_window_never_escalate() {
        let mut sim = Sim::new(Strategy::OneForOne, 2, &[("a", Permanent)]);
        for _ in 0..10 {
            assert_eq!(sim.exit("a", Failure), [start("a")]);
            sim.advance(Duration::from_secs(31));
        }
        assert!(!sim.s.is_finished());
        // The last restart, 31 s ago, is the only one in the window.
        assert_eq!(sim.s.restarts_in_window(sim.now).len(), 1);
        // Three within 60 s: past the limit of two.
        sim.advance(Duration::from_secs(60));
        assert!(sim.s.restarts_in_window(sim.now).is_empty());
        sim.exit("a", Failure);
        sim.advance(Duration::from_secs(59));
        sim.exit("a", Failure);
        assert_eq!(sim.s.restarts_in_window(sim.now).len(), 2);
        assert_eq!(sim.s.intensity().max_restarts, 2);
        assert!(matches!(
            sim.exit("a", Failure).last(),
            Some(Action::Escalate(_))
        ));
    }

    /// Restarts forgiven one by one never add up to an escalation; the
    /// same number unforgiven do.
    #[test]
    fn pardoned_restarts_do_not_count_against_the_intensity() {
        let mut sim = Sim::new(Strategy::OneForOne, 2, &[("a", Permanent)]);
        assert_eq!(sim.exit("a", Failure), [start("a")]);
        for _ in 0..10 {
            assert_eq!(sim.exit("a", Failure), [start("a")]);
            assert!(sim.s.pardon("a"));
            sim.advance(Duration::from_secs(1));
        }
        assert!(!sim.s.is_finished());
        assert!(!sim.s.pardon("b"), "no such child");
        assert_eq!(sim.exit("a", Failure), [start("a")]);
        assert!(matches!(
            sim.exit("a", Failure).last(),
            Some(Action::Escalate(_))
        ));
    }

    #[test]
    fn a_child_added_to_a_running_supervisor_starts_and_is_supervised_like_the_others() {
        let mut sim = Sim::new(Strategy::OneForOne, 5, &[("a", Permanent)]);
        assert!(sim.s.add_child(ChildSpec::permanent("b")));
        assert!(
            !sim.s.add_child(ChildSpec::permanent("b")),
            "ids are unique"
        );
        sim.run();
        assert!(sim.s.is_running("b"));
        assert_eq!(sim.exit("b", Failure), [start("b")]);
        assert_eq!(sim.s.restarts_of("b"), Some(1));
        sim.s.handle_shutdown(sim.now);
        sim.run();
        assert!(sim.s.is_finished());
        assert!(!sim.s.add_child(ChildSpec::permanent("c")), "shut down");
    }

    #[test]
    fn a_child_let_go_is_stopped_and_never_started_again() {
        let mut sim = Sim::new(
            Strategy::OneForAll,
            5,
            &[("a", Permanent), ("b", Permanent)],
        );
        sim.log.clear();
        assert!(sim.s.remove_child(sim.now, "b"));
        sim.run();
        assert_eq!(std::mem::take(&mut sim.log), [stop("b")]);
        assert!(!sim.s.is_running("b"));
        assert!(!sim.s.remove_child(sim.now, "b"), "once");
        // A sibling's failure under one-for-all does not bring it back.
        let restarted = sim.exit("a", Failure);
        assert_eq!(restarted, [start("a")]);
        sim.advance(Duration::from_secs(60));
        assert!(!sim.s.is_running("b"));
        assert!(!sim.s.remove_child(sim.now, "nope"));
    }

    #[test]
    fn a_moved_child_starts_again_at_once_and_is_not_charged() {
        let mut sim = Sim::new(
            Strategy::OneForAll,
            1,
            &[("a", Transient), ("b", Permanent), ("t", Temporary)],
        );
        for _ in 0..5 {
            sim.log.clear();
            sim.s.handle_moved(sim.now, "a");
            sim.run();
            // Alone, at once: no sibling stopped under one-for-all, no wait.
            assert_eq!(std::mem::take(&mut sim.log), [start("a")]);
        }
        assert_eq!(sim.s.restarts_of("a"), Some(5));
        assert!(!sim.s.is_finished(), "moves use none of the intensity");
        sim.s.handle_moved(sim.now, "t");
        sim.run();
        assert!(!sim.s.is_running("t"), "a temporary child is not moved");
        // The one failure the intensity allows is still there.
        let restarted = sim.exit("b", Failure);
        assert!(restarted.contains(&start("b")), "{restarted:?}");
        // It shuts down as usual after its moves.
        sim.s.handle_shutdown(sim.now);
        sim.run();
        assert!(sim.s.is_finished());
    }

    #[test]
    fn backoff_waits_grow_are_bounded_and_start_again_after_a_quiet_spell() {
        let spec = SupervisorSpec {
            strategy: Strategy::OneForOne,
            intensity: Intensity {
                max_restarts: 100,
                within: Duration::from_secs(1),
            },
            per_child: false,
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
                jitter: 0.0,
                reset_after: Duration::from_secs(30),
            },
        };
        let mut sim = Sim::with(spec, &[("a", Permanent)]);
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert_eq!(sim.exit("a", Failure), []);
            let due = sim.s.poll_timeout().unwrap();
            waits.push(due - sim.now);
            assert_eq!(sim.advance(due - sim.now - Duration::from_millis(1)), []);
            assert_eq!(sim.advance(Duration::from_millis(1)), [start("a")]);
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
        sim.advance(Duration::from_secs(30));
        sim.exit("a", Failure);
        assert_eq!(
            sim.s.poll_timeout().unwrap() - sim.now,
            Duration::from_millis(100)
        );
    }

    #[test]
    fn jitter_stretches_a_wait_by_at_most_its_fraction_and_never_past_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(150),
            jitter: 0.5,
            reset_after: Duration::from_secs(1),
        };
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(100));
        assert_eq!(b.delay(1, 0.5), Duration::from_millis(125));
        assert_eq!(b.delay(2, 0.5), Duration::from_millis(150), "capped");
        assert_eq!(b.delay(40, 0.3), Duration::from_millis(150));
        let mut s = Supervision::new(SupervisorSpec::default(), vec![], 1);
        let units: Vec<f64> = (0..1000).map(|_| s.next_unit()).collect();
        assert!(units.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = units.iter().sum::<f64>() / 1000.0;
        assert!((0.4..0.6).contains(&mean), "{mean}");
    }

    #[test]
    fn the_escalation_is_known_as_soon_as_it_is_decided() {
        let mut sim = Sim::new(
            Strategy::OneForOne,
            0,
            &[("a", Permanent), ("b", Permanent)],
        );
        sim.hangs.insert("b".into());
        assert_eq!(sim.exit("a", Failure), [stop("b")]);
        assert!(!sim.s.is_finished(), "b is still stopping");
        assert_eq!(sim.s.escalation().map(|e| e.child.as_str()), Some("a"));
    }

    #[test]
    fn a_child_ignoring_its_stop_is_killed_after_its_shutdown_timeout() {
        let mut sim = Sim::new(
            Strategy::OneForAll,
            5,
            &[("a", Permanent), ("b", Permanent)],
        );
        sim.hangs.insert("b".into());
        assert_eq!(sim.exit("a", Failure), [stop("b")]);
        assert_eq!(sim.advance(Duration::from_millis(4_999)), []);
        assert_eq!(
            sim.advance(Duration::from_millis(1)),
            [Action::Kill("b".into()), start("a"), start("b")]
        );
    }

    #[test]
    fn shutdown_stops_children_last_first_one_at_a_time() {
        let mut sim = Sim::new(
            Strategy::OneForOne,
            5,
            &[("a", Permanent), ("b", Permanent), ("c", Permanent)],
        );
        sim.hangs.insert("b".into());
        sim.s.handle_shutdown(sim.now);
        sim.run();
        assert_eq!(std::mem::take(&mut sim.log), [stop("c"), stop("b")]);
        // b hangs: a waits for it.
        assert_eq!(
            sim.advance(Duration::from_secs(5)),
            [Action::Kill("b".into()), stop("a"), Action::Stopped]
        );
        assert!(sim.s.is_finished());
    }

    #[test]
    fn a_restart_waiting_its_backoff_is_cancelled_by_a_shutdown() {
        let spec = SupervisorSpec {
            backoff: Backoff::default(),
            ..SupervisorSpec::default()
        };
        let mut sim = Sim::with(spec, &[("a", Permanent)]);
        assert_eq!(sim.exit("a", Failure), []);
        sim.s.handle_shutdown(sim.now);
        sim.run();
        assert_eq!(std::mem::take(&mut sim.log), [Action::Stopped]);
        assert_eq!(sim.advance(Duration::from_secs(60)), []);
    }

    /// What a supervisor must do, computed directly: which children run,
    /// and whether it has escalated.
    #[derive(Debug, Clone)]
    struct Model {
        strategy: Strategy,
        max: usize,
        types: Vec<RestartType>,
        running: Vec<bool>,
        restarts: Vec<u64>,
        escalated: bool,
    }

    impl Model {
        fn exit(&mut self, now_ms: u64, i: usize, exit: Exit) {
            if self.escalated || !self.running[i] {
                return;
            }
            self.running[i] = false;
            if !self.types[i].restarts_after(exit) {
                return;
            }
            self.restarts.retain(|t| now_ms - t < 60_000);
            self.restarts.push(now_ms);
            if self.restarts.len() > self.max {
                self.escalated = true;
                self.running.iter_mut().for_each(|r| *r = false);
                return;
            }
            let group: Vec<usize> = match self.strategy {
                Strategy::OneForOne => vec![i],
                Strategy::OneForAll => (0..self.types.len()).collect(),
                Strategy::RestForOne => (i..self.types.len()).collect(),
            };
            for j in group {
                if j == i {
                    self.running[j] = true;
                } else if self.running[j] {
                    self.running[j] = self.types[j] != RestartType::Temporary;
                }
            }
        }
    }

    fn restart_type() -> impl Gen<Value = RestartType> {
        prop_oneof![Just(Permanent), Just(Transient), Just(Temporary)]
    }

    fn exit_reason() -> impl Gen<Value = Exit> {
        prop_oneof![Just(Normal), Just(Shutdown), Just(Failure)]
    }

    fn strategy() -> impl Gen<Value = super::Strategy> {
        prop_oneof![
            Just(super::Strategy::OneForOne),
            Just(super::Strategy::OneForAll),
            Just(super::Strategy::RestForOne)
        ]
    }

    proptest! {
        /// With no backoff and children that stop when asked, the running
        /// children and the escalation match the model after every exit.
        #[test]
        fn supervision_matches_the_model(
            strategy in strategy(),
            max in 0u32..4,
            types in proptest::collection::vec(restart_type(), 1..5),
            ops in proptest::collection::vec((0usize..5, exit_reason(), 0u64..40_000), 0..60),
        ) {
            let ids: Vec<String> = (0..types.len()).map(|i| format!("c{i}")).collect();
            let children: Vec<(&str, RestartType)> =
                ids.iter().map(String::as_str).zip(types.iter().copied()).collect();
            let mut sim = Sim::new(strategy, max, &children);
            let mut model = Model {
                strategy,
                max: max as usize,
                types: types.clone(),
                running: vec![true; types.len()],
                restarts: Vec::new(),
                escalated: false,
            };
            let t0 = sim.now;
            for (i, exit, gap) in ops {
                let i = i % types.len();
                sim.advance(Duration::from_millis(gap));
                let now_ms = (sim.now - t0).as_millis() as u64;
                model.exit(now_ms, i, exit);
                sim.exit(&ids[i], exit);
                for (j, id) in ids.iter().enumerate() {
                    prop_assert_eq!(sim.s.is_running(id), model.running[j], "{} after {:?} of {}", id, exit, i);
                }
                prop_assert_eq!(sim.s.is_finished(), model.escalated);
            }
        }

        /// With backoff, children that hang when asked to stop, and starts
        /// that fail: a child is never started twice without an exit in
        /// between, is killed only after its shutdown timeout, and nothing
        /// starts after the supervisor has finished.
        #[test]
        fn supervision_is_safe_with_backoff_hangs_and_failed_starts(
            strategy in strategy(),
            types in proptest::collection::vec(restart_type(), 1..5),
            hangs in proptest::collection::vec(any::<bool>(), 5),
            ops in proptest::collection::vec((0usize..5, exit_reason(), 0u64..3_000, any::<bool>()), 0..60),
            shutdown_at in 0usize..60,
        ) {
            let spec = SupervisorSpec {
                strategy,
                intensity: Intensity { max_restarts: 4, within: Duration::from_secs(10) },
                per_child: false,
                backoff: Backoff {
                    initial: Duration::from_millis(50),
                    max: Duration::from_millis(800),
                    jitter: 0.3,
                    reset_after: Duration::from_secs(5),
                },
            };
            let mut s = Supervision::new(
                spec,
                (0..types.len())
                    .map(|i| ChildSpec {
                        id: format!("c{i}"),
                        restart: types[i],
                        shutdown: Duration::from_millis(500),
                    })
                    .collect(),
                42,
            );
            let mut now = Instant::now();
            let mut alive: BTreeMap<String, bool> = BTreeMap::new();
            let mut asked: BTreeMap<String, Instant> = BTreeMap::new();
            let mut finished = false;
            s.start(now);
            for (step, (i, exit, gap, start_fails)) in ops.into_iter().enumerate() {
                now += Duration::from_millis(gap);
                s.handle_timeout(now);
                if step == shutdown_at {
                    s.handle_shutdown(now);
                }
                let id = format!("c{}", i % types.len());
                if alive.get(&id).copied().unwrap_or(false) {
                    alive.insert(id.clone(), false);
                    s.handle_exit(now, &id, exit);
                }
                while let Some(a) = s.poll_action() {
                    prop_assert!(!finished, "{:?} after the end", a);
                    match a {
                        Action::Start(c) => {
                            prop_assert!(!alive.get(&c).copied().unwrap_or(false), "{} started twice", c);
                            if start_fails {
                                s.handle_exit(now, &c, Failure);
                            } else {
                                alive.insert(c.clone(), true);
                                s.handle_started(now, &c);
                            }
                        }
                        Action::Stop(c) => {
                            prop_assert!(alive[&c], "stopping {} which is not running", c);
                            asked.insert(c.clone(), now);
                            let n: usize = c[1..].parse().unwrap();
                            if !hangs[n] {
                                alive.insert(c.clone(), false);
                                s.handle_exit(now, &c, Shutdown);
                            }
                        }
                        Action::Kill(c) => {
                            prop_assert!(now >= asked[&c] + Duration::from_millis(500), "killed {} early", c);
                            alive.insert(c.clone(), false);
                            s.handle_exit(now, &c, Shutdown);
                        }
                        Action::Escalate(_) | Action::Stopped => {
                            prop_assert!(alive.values().all(|a| !a), "finished with children running");
                            finished = true;
                        }
                    }
                }
                if let Some(at) = s.poll_timeout() {
                    prop_assert!(at >= now || step == 0, "a timeout in the past");
                }
            }
        }
    }
}
