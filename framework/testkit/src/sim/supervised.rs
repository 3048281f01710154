//! A supervised, checkpointing child in the simulated cluster: the proto
//! [`Supervision`] policy on one member, copies of its child on others,
//! started over member↔member links, their epochs from an
//! [`EpochClock`] on the supervisor's (skewed) clock, and a shared
//! checkpoint store that keeps the epoch rule of
//! `flotilla::checkpoint::CheckpointStore` — a save is checked, then lands
//! a moment later, as a list-then-put does.
//!
//! ```text
//! supervisor (member s) ── Start{copy, epoch} ──► host h: announce(epoch) ─► store
//!   ▲ view of s: host down / replaced ⇒ exit ⇒ restart elsewhere       │
//!   └ s reincarnates ⇒ its child is lost                                ▼
//! host h: tick ─ check(epoch) ─ (refused: the copy stops) ─ land(epoch, seq)
//!         reincarnates ⇒ stops every copy it hosts (fenced)
//!         its view shows the owner's incarnation gone ⇒ stops its copies
//! ```
//!
//! Checked after every event: every restore took the newest snapshot of
//! the newest epoch not above the copy's own (worked out apart from the
//! store's ordering) and never went back in the count; at most one copy may
//! save (two copies' effects are never both accepted); a node that took a
//! new incarnation runs nothing its earlier one ran for others; epochs
//! strictly increase.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flotilla_proto::epoch::{Epoch, EpochClock, admits, restore_order};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::membership::{MemberState, MemberView, has_ended};
use flotilla_proto::supervision::{
    Action, ChildSpec, Exit, Intensity, Supervision, SupervisorSpec,
};

use super::Member;

/// The child's id.
pub const CHILD: &str = "ticker";

/// Timing of the supervised child.
#[derive(Debug, Clone, Copy)]
pub struct ChildConfig {
    /// The member whose supervisor runs the child.
    pub supervisor: usize,
    /// Ticks between saves, on the host's clock.
    pub save_every: Duration,
    /// From a save's check to its landing (a list, then a put): uniform
    /// up to this.
    pub put_delay: Duration,
    /// How long a spawn waits for its host before it counts as failed.
    pub spawn_timeout: Duration,
    /// Each member's clock runs at a rate in `1 ± skew`.
    pub skew: f64,
}

impl Default for ChildConfig {
    fn default() -> Self {
        Self {
            supervisor: 0,
            save_every: Duration::from_millis(200),
            put_delay: Duration::from_millis(300),
            spawn_timeout: Duration::from_secs(2),
            skew: 0.05,
        }
    }
}

/// What the child world asks the cluster to do.
#[derive(Debug, Clone)]
pub(super) enum Out {
    /// Send a start order from the supervisor to a host.
    Start { from: usize, to: usize, copy: usize },
    /// Wake the world at `at` with `event`.
    At { at: Instant, event: ChildEvent },
}

/// The world's own timed events.
#[derive(Debug, Clone)]
pub(super) enum ChildEvent {
    /// A start order reached its host.
    Arrived(usize),
    /// A copy announces its epoch to the store.
    Announce(usize),
    /// A copy's save falls due.
    Tick(usize),
    /// A checked save lands.
    Landed { copy: usize, seq: u64 },
    /// A spawn's time is up.
    SpawnTimeout(usize),
    /// The supervisor's policy has a timer.
    Supervisor,
}

/// What `view` holds of `name`: its incarnation and whether it is up.
fn known(view: &BTreeMap<MemberName, MemberView>, name: &str) -> Option<(Incarnation, bool)> {
    view.get(name)
        .map(|m| (m.incarnation, m.state == MemberState::Up))
}

/// One copy of the child, started once.
#[derive(Debug, Clone)]
pub struct Copy {
    /// The member hosting it.
    pub host: usize,
    /// The host's incarnation it was started on.
    pub host_incarnation: Incarnation,
    /// The supervisor member's incarnation that started it.
    pub owner_incarnation: Incarnation,
    /// Its epoch.
    pub epoch: Epoch,
    /// Whether it reached its host.
    pub arrived: bool,
    /// Whether it announced its epoch to the store.
    pub announced: bool,
    /// Whether it runs.
    pub alive: bool,
    /// Its count.
    pub n: u64,
    /// Why it stopped, once it has.
    pub stopped: Option<&'static str>,
}

/// The shared checkpoint store.
#[derive(Debug, Default)]
struct Store {
    /// The newest epoch announced or saved.
    newest: Option<Epoch>,
    /// Snapshots that landed: (epoch, sequence).
    snapshots: Vec<((Epoch, u64), ())>,
}

impl Store {
    fn see(&mut self, epoch: Epoch) {
        self.newest = Some(self.newest.map_or(epoch, |n| n.max(epoch)));
    }

    fn restore(&self, epoch: Epoch) -> Option<(Epoch, u64)> {
        let mut order = self.snapshots.clone();
        restore_order(epoch, &mut order);
        order.first().map(|(k, ())| *k)
    }
}

/// The supervised child and its store.
pub(super) struct World {
    config: ChildConfig,
    seed: u64,
    policy: Supervision,
    epochs: EpochClock,
    last_epoch: Epoch,
    pub(super) copies: Vec<Copy>,
    /// The copy the supervisor counts as its child.
    current: Option<usize>,
    store: Store,
    /// Each member's clock rate.
    rates: Vec<f64>,
    base: Instant,
    /// When the policy's timer is set for.
    timer: Option<Instant>,
    /// The count the latest announced copy restored.
    restored_high: u64,
    /// Draws the put delays.
    rng: crate::rng::SplitMix,
}

impl World {
    pub(super) fn new(config: ChildConfig, seed: u64, rates: Vec<f64>, base: Instant) -> Self {
        let spec = SupervisorSpec {
            intensity: Intensity {
                max_restarts: 1_000_000,
                within: Duration::from_secs(1),
            },
            ..SupervisorSpec::default()
        };
        Self {
            config,
            seed,
            policy: Supervision::new(spec, vec![ChildSpec::permanent(CHILD)], seed),
            epochs: EpochClock::new(0),
            last_epoch: Epoch::NONE,
            copies: Vec::new(),
            current: None,
            store: Store::default(),
            rates,
            base,
            timer: None,
            restored_high: 0,
            rng: crate::rng::SplitMix(seed ^ 0x5eed),
        }
    }

    /// `member`'s clock at `now`, in microseconds.
    fn clock(&self, member: usize, now: Instant) -> u64 {
        let real = (now - self.base).as_secs_f64() * self.rates[member];
        // Clocks start near the Unix epoch's present, as real ones do.
        1_700_000_000_000_000 + (real * 1e6) as u64
    }

    /// `d` on `member`'s clock, in virtual time.
    fn local(&self, member: usize, d: Duration) -> Duration {
        d.div_f64(self.rates[member])
    }

    pub(super) fn start(&mut self, now: Instant, members: &[Member]) -> Vec<Out> {
        self.policy.start(now);
        self.drive(now, members)
    }

    /// The supervisor's actions, performed.
    fn drive(&mut self, now: Instant, members: &[Member]) -> Vec<Out> {
        let mut out = Vec::new();
        let s = self.config.supervisor;
        while let Some(action) = self.policy.poll_action() {
            match action {
                Action::Start(_) => {
                    let host = members
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != s)
                        .find(|(_, m)| {
                            members[s]
                                .view
                                .get(&m.name)
                                .is_some_and(|v| v.state == MemberState::Up)
                        })
                        .map(|(i, m)| (i, members[s].view[&m.name].incarnation));
                    let Some((host, host_incarnation)) = host else {
                        // No host up: the start fails; the policy retries
                        // after its backoff.
                        self.policy.handle_exit(now, CHILD, Exit::Failure);
                        continue;
                    };
                    let epoch = self.epochs.next(self.clock(s, now));
                    assert!(
                        epoch > self.last_epoch,
                        "seed {}: epoch {epoch} after {}",
                        self.seed,
                        self.last_epoch
                    );
                    self.last_epoch = epoch;
                    let copy = self.copies.len();
                    self.copies.push(Copy {
                        host,
                        host_incarnation,
                        owner_incarnation: members[s].link.incarnation(),
                        epoch,
                        arrived: false,
                        announced: false,
                        alive: false,
                        n: 0,
                        stopped: None,
                    });
                    self.current = Some(copy);
                    self.policy.handle_started(now, CHILD);
                    out.push(Out::Start {
                        from: s,
                        to: host,
                        copy,
                    });
                    out.push(Out::At {
                        at: now + self.config.spawn_timeout,
                        event: ChildEvent::SpawnTimeout(copy),
                    });
                }
                Action::Stop(_) | Action::Kill(_) | Action::Stopped => {}
                Action::Escalate(e) => panic!("seed {}: the supervisor gave up: {e}", self.seed),
            }
        }
        if let Some(at) = self.policy.poll_timeout()
            && self.timer.is_none_or(|t| at < t)
        {
            self.timer = Some(at);
            out.push(Out::At {
                at,
                event: ChildEvent::Supervisor,
            });
        }
        out
    }

    /// The current copy is lost: the policy hears of its exit.
    fn lose_current(&mut self, now: Instant, members: &[Member]) -> Vec<Out> {
        if self.current.take().is_some() {
            self.policy.handle_exit(now, CHILD, Exit::Failure);
        }
        self.drive(now, members)
    }

    fn stop(&mut self, copy: usize, why: &'static str) {
        let c = &mut self.copies[copy];
        if c.alive || !c.arrived {
            c.alive = false;
            c.stopped.get_or_insert(why);
        }
    }

    /// Member `i`'s view changed.
    pub(super) fn on_view(&mut self, now: Instant, i: usize, members: &[Member]) -> Vec<Out> {
        let view = &members[i].view;
        let gone =
            |name: &str, incarnation: Incarnation, view: &BTreeMap<MemberName, MemberView>| {
                has_ended(known(view, name), incarnation)
            };
        // A host stops the copies whose owner is gone (the spawner's reap).
        let s = self.config.supervisor;
        for c in 0..self.copies.len() {
            let copy = &self.copies[c];
            if copy.host == i && copy.alive && gone(&members[s].name, copy.owner_incarnation, view)
            {
                self.stop(c, "owner gone");
            }
        }
        // The supervisor restarts a child whose node is down or replaced.
        if i == s
            && let Some(c) = self.current
        {
            let copy = &self.copies[c];
            if gone(&members[copy.host].name, copy.host_incarnation, view) {
                return self.lose_current(now, members);
            }
        }
        Vec::new()
    }

    /// Member `i` learnt it was marked down and takes a new incarnation:
    /// it stops what it hosts for others first.
    pub(super) fn on_reincarnate(
        &mut self,
        now: Instant,
        i: usize,
        members: &[Member],
    ) -> Vec<Out> {
        for c in 0..self.copies.len() {
            if self.copies[c].host == i {
                self.stop(c, "fenced");
            }
        }
        if i == self.config.supervisor {
            return self.lose_current(now, members);
        }
        Vec::new()
    }

    pub(super) fn on_event(
        &mut self,
        now: Instant,
        event: ChildEvent,
        members: &[Member],
    ) -> Vec<Out> {
        let mut out = Vec::new();
        match event {
            ChildEvent::Arrived(c) => {
                let s = &members[self.config.supervisor].name;
                let copy = &mut self.copies[c];
                let owner_gone =
                    has_ended(known(&members[copy.host].view, s), copy.owner_incarnation);
                // A start order for an incarnation the host no longer is,
                // from an owner the host knows is gone, or for a copy
                // already given up, is dropped.
                if members[copy.host].link.incarnation() == copy.host_incarnation
                    && !owner_gone
                    && copy.stopped.is_none()
                {
                    copy.arrived = true;
                    copy.alive = true;
                    out.push(Out::At {
                        at: now + self.rng.upto(self.config.put_delay),
                        event: ChildEvent::Announce(c),
                    });
                }
            }
            ChildEvent::Announce(c) => {
                if !self.copies[c].alive {
                    return out;
                }
                let epoch = self.copies[c].epoch;
                if !admits(epoch, self.store.newest) {
                    self.stop(c, "stale at start");
                    return out;
                }
                self.store.see(epoch);
                self.copies[c].announced = true;
                let restored = self.store.restore(epoch);
                if let Some((e, _)) = restored {
                    assert!(
                        e <= epoch,
                        "seed {}: restored epoch {e} into {epoch}",
                        self.seed
                    );
                }
                let n = restored.map_or(0, |(_, seq)| seq);
                // A restart never goes back in the count.
                assert!(
                    n >= self.restored_high,
                    "seed {}: copy of epoch {epoch} restored {n} after an earlier one restored {}",
                    self.seed,
                    self.restored_high
                );
                self.restored_high = n;
                self.copies[c].n = n;
                let host = self.copies[c].host;
                out.push(Out::At {
                    at: now + self.local(host, self.config.save_every),
                    event: ChildEvent::Tick(c),
                });
            }
            ChildEvent::Tick(c) => {
                if !self.copies[c].alive {
                    return out;
                }
                let epoch = self.copies[c].epoch;
                if !admits(epoch, self.store.newest) {
                    self.stop(c, "save refused");
                    return out;
                }
                self.copies[c].n += 1;
                let host = self.copies[c].host;
                out.push(Out::At {
                    at: now + self.rng.upto(self.config.put_delay),
                    event: ChildEvent::Landed {
                        copy: c,
                        seq: self.copies[c].n,
                    },
                });
                out.push(Out::At {
                    at: now + self.local(host, self.config.save_every),
                    event: ChildEvent::Tick(c),
                });
            }
            ChildEvent::Landed { copy, seq } => {
                let epoch = self.copies[copy].epoch;
                self.store.snapshots.push(((epoch, seq), ()));
                self.store.see(epoch);
            }
            ChildEvent::SpawnTimeout(c) => {
                if !self.copies[c].arrived && self.current == Some(c) {
                    self.copies[c].stopped.get_or_insert("never arrived");
                    return self.lose_current(now, members);
                }
            }
            ChildEvent::Supervisor => {
                if self.timer == Some(now) {
                    self.timer = None;
                    self.policy.handle_timeout(now);
                    return self.drive(now, members);
                }
            }
        }
        out
    }

    /// The invariants that hold after every event.
    pub(super) fn check(&self, members: &[Member]) {
        let seed = self.seed;
        // A node that took a new incarnation runs nothing its earlier one
        // ran for others.
        for c in self.copies.iter().filter(|c| c.alive) {
            assert_eq!(
                members[c.host].link.incarnation(),
                c.host_incarnation,
                "seed {seed}: {} runs a copy of epoch {} started on its incarnation {}",
                members[c.host].name,
                c.epoch,
                c.host_incarnation
            );
        }
        // Only the copy of the newest announced epoch may still save: two
        // copies' effects are never both accepted.
        let newest = self.store.newest.unwrap_or_default();
        let savers: Vec<&Copy> = self
            .copies
            .iter()
            .filter(|c| c.alive && c.announced && admits(c.epoch, self.store.newest))
            .collect();
        assert!(
            savers.len() <= 1,
            "seed {seed}: two copies may save at epoch ≥ {newest}: {savers:?}"
        );
    }

    /// Copies running now.
    pub(super) fn alive(&self) -> impl Iterator<Item = &Copy> {
        self.copies.iter().filter(|c| c.alive)
    }

    /// The copy the supervisor counts as its child.
    pub(super) fn current(&self) -> Option<&Copy> {
        self.current.map(|c| &self.copies[c])
    }
}
