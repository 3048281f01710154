//! The mesh dial policy: which ractor sessions a node opens, re-opens and
//! closes, given the member table.
//!
//! ```text
//!   member up, my name smaller ──► Dial ──► dialled ──► ready ──► kept
//!        ▲                          │ failed     │ not ready within │ ready lost,
//!        └──────────────────────────┴────────────┴─ ready_within ───┴ connection closed,
//!                                                                     new incarnation
//!   member down or left ──────────► Close (its sessions and bulk streams)
//! ```
//!
//! Of two members, the one with the smaller name dials, so each pair has one
//! session. A session is dialled for one incarnation of the peer: a newer
//! incarnation is dialled afresh. A member missing from the table is not
//! gone: its ready session is kept, and its return with the same
//! incarnation dials nothing. A dial in progress is never repeated. A
//! member that is not up has its sessions closed at once, and again on every
//! [`Mesh::handle_tick`] (cheap, and it catches a session that reappears).
//!
//! The caller feeds events in with the current time and performs the
//! actions it polls; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::ids::MemberName;
use crate::incarnation::Incarnation;
use crate::membership::{MemberState, MemberView};

/// Timing of the dial policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshConfig {
    /// How long a dialled session may take to become ready before it is
    /// dialled again.
    pub ready_within: Duration,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            ready_within: Duration::from_secs(5),
        }
    }
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshAction {
    /// Open a cluster session to `peer` (at `addr`, its `incarnation`), and
    /// report the result with [`Mesh::handle_dialled`].
    Dial {
        /// The peer's name.
        peer: MemberName,
        /// The address it listens on.
        addr: String,
        /// The incarnation the session is for.
        incarnation: Incarnation,
    },
    /// Close every session and bulk stream with `peer`: it is not up.
    Close {
        /// The peer's name.
        peer: MemberName,
    },
}

/// A session this node dialled.
#[derive(Debug, Clone, Copy)]
struct Dialled {
    incarnation: Incarnation,
    opened: Instant,
    was_ready: bool,
}

/// The dial policy of one node.
#[derive(Debug, Clone)]
pub struct Mesh {
    me: MemberName,
    config: MeshConfig,
    /// Members by name: `(addr, incarnation, state)`.
    members: BTreeMap<MemberName, (String, Incarnation, MemberState)>,
    /// Peers whose session is ready.
    ready: BTreeSet<MemberName>,
    dialled: BTreeMap<MemberName, Dialled>,
    /// Dials in progress: peer → incarnation.
    pending: BTreeMap<MemberName, Incarnation>,
    actions: VecDeque<MeshAction>,
}

impl Mesh {
    /// The policy of the node named `me`, with no members yet.
    pub fn new(me: impl Into<MemberName>, config: MeshConfig) -> Self {
        Self {
            me: me.into(),
            config,
            members: BTreeMap::new(),
            ready: BTreeSet::new(),
            dialled: BTreeMap::new(),
            pending: BTreeMap::new(),
            actions: VecDeque::new(),
        }
    }

    /// Whether this node dials `peer` (it has the smaller name).
    pub fn dials(&self, peer: &str) -> bool {
        self.me.as_str() < peer
    }

    /// The member table changed.
    pub fn handle_members(&mut self, now: Instant, members: &[MemberView]) {
        let before = std::mem::take(&mut self.members);
        for m in members.iter().filter(|m| m.name != self.me) {
            self.members
                .insert(m.name.clone(), (m.addr.clone(), m.incarnation, m.state));
        }
        // Newly not up: close at once.
        for (name, (_, inc, state)) in &self.members {
            let was_up = before
                .get(name)
                .is_some_and(|(_, i, s)| i == inc && s.is_live());
            if !state.is_live() && (was_up || !before.contains_key(name)) {
                self.actions
                    .push_back(MeshAction::Close { peer: name.clone() });
            }
        }
        self.evaluate(now);
    }

    /// The session with `peer` became ready (`true`) or stopped being so.
    pub fn handle_ready(&mut self, now: Instant, peer: &str, ready: bool) {
        if ready {
            self.ready.insert(MemberName::from(peer));
        } else {
            self.ready.remove(peer);
        }
        self.evaluate(now);
    }

    /// A dial asked for by [`MeshAction::Dial`] finished.
    pub fn handle_dialled(&mut self, now: Instant, peer: &str, incarnation: Incarnation, ok: bool) {
        if self.pending.get(peer) == Some(&incarnation) {
            self.pending.remove(peer);
        }
        if ok {
            self.dialled.insert(
                MemberName::from(peer),
                Dialled {
                    incarnation,
                    opened: now,
                    was_ready: self.ready.contains(peer),
                },
            );
        }
        self.evaluate(now);
    }

    /// The connection of the session dialled to `peer` for `incarnation`
    /// closed.
    pub fn handle_closed(&mut self, now: Instant, peer: &str, incarnation: Incarnation) {
        if self
            .dialled
            .get(peer)
            .is_some_and(|d| d.incarnation == incarnation)
        {
            self.dialled.remove(peer);
        }
        self.evaluate(now);
    }

    /// A periodic pass: re-dials what is due and closes again the sessions
    /// of members that are not up.
    pub fn handle_tick(&mut self, now: Instant) {
        for (name, (_, _, state)) in &self.members {
            if !state.is_live() {
                self.actions
                    .push_back(MeshAction::Close { peer: name.clone() });
            }
        }
        self.evaluate(now);
    }

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<MeshAction> {
        self.actions.pop_front()
    }

    /// When a dialled session that is not ready yet runs out of time (call
    /// [`Mesh::handle_tick`] then), if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.dialled
            .iter()
            .filter(|(peer, d)| !d.was_ready && !self.ready.contains(*peer))
            .map(|(_, d)| d.opened + self.config.ready_within)
            .min()
    }

    /// Peers with a dialled session held for them.
    pub fn dialled(&self) -> impl Iterator<Item = &str> {
        self.dialled.keys().map(MemberName::as_str)
    }

    fn evaluate(&mut self, now: Instant) {
        // Forget sessions whose member is down, left or restarted. A member
        // absent from the table is unknown, not gone (a restarted head's
        // table fills as the members rejoin): its session is kept while it
        // is ready (or still has time to become so), so that its return
        // with the same incarnation finds it live and dials nothing.
        let (members, ready, within) = (&self.members, &self.ready, self.config.ready_within);
        self.dialled.retain(|name, d| match members.get(name) {
            Some((_, inc, state)) => *inc == d.incarnation && state.is_live(),
            None => ready.contains(name) || (!d.was_ready && now < d.opened + within),
        });
        for (name, (addr, inc, state)) in &self.members {
            if !state.is_live() || !self.dials(name) {
                continue;
            }
            let ready = self.ready.contains(name);
            let live = match self.dialled.get_mut(name) {
                Some(d) if d.incarnation == *inc => {
                    if ready {
                        d.was_ready = true;
                        true
                    } else {
                        // Once ready it must stay so; before, it has time.
                        !d.was_ready && now < d.opened + self.config.ready_within
                    }
                }
                _ => false,
            };
            if live || self.pending.get(name) == Some(inc) {
                continue;
            }
            self.dialled.remove(name);
            self.pending.insert(name.clone(), *inc);
            self.actions.push_back(MeshAction::Dial {
                peer: name.clone(),
                addr: addr.clone(),
                incarnation: *inc,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    fn member(name: &str, incarnation: Incarnation, state: MemberState) -> MemberView {
        MemberView {
            name: name.into(),
            addr: format!("{name}:1"),
            bulk_addr: format!("{name}:2"),
            host: "h".into(),
            incarnation,
            state,
            resources: Resources::default(),
            actors: 0,
            role: crate::role::Role::Worker,
            drain_within_ms: 0,
        }
    }

    fn actions(m: &mut Mesh) -> Vec<MeshAction> {
        std::iter::from_fn(|| m.poll_action()).collect()
    }

    fn dial(peer: &str, incarnation: Incarnation) -> MeshAction {
        MeshAction::Dial {
            peer: peer.into(),
            addr: format!("{peer}:1"),
            incarnation,
        }
    }

    #[test]
    fn only_the_smaller_name_dials_and_a_dial_in_progress_is_not_repeated() {
        let t0 = Instant::now();
        let mut m = Mesh::new("b", MeshConfig::default());
        let table = [
            member("a", Incarnation::new(1), MemberState::Up),
            member("b", Incarnation::new(1), MemberState::Up),
            member("c", Incarnation::new(1), MemberState::Up),
        ];
        m.handle_members(t0, &table);
        assert_eq!(
            actions(&mut m),
            [dial("c", Incarnation::new(1))],
            "a dials b; b dials c"
        );
        m.handle_members(t0, &table);
        m.handle_tick(t0 + Duration::from_secs(1));
        assert_eq!(actions(&mut m), [], "the dial is in progress");
    }

    #[test]
    fn a_failed_dial_is_retried_and_a_ready_session_is_kept() {
        let t0 = Instant::now();
        let mut m = Mesh::new("a", MeshConfig::default());
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Up)]);
        assert_eq!(actions(&mut m), [dial("b", Incarnation::new(1))]);
        m.handle_dialled(t0, "b", Incarnation::new(1), false);
        assert_eq!(
            actions(&mut m),
            [dial("b", Incarnation::new(1))],
            "failed: dialled again"
        );
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        m.handle_ready(t0, "b", true);
        m.handle_tick(t0 + Duration::from_secs(60));
        assert_eq!(actions(&mut m), []);
        assert_eq!(m.poll_timeout(), None);
    }

    #[test]
    fn a_session_that_never_becomes_ready_is_dialled_again_after_its_time() {
        let t0 = Instant::now();
        let config = MeshConfig {
            ready_within: Duration::from_secs(5),
        };
        let mut m = Mesh::new("a", config);
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Up)]);
        actions(&mut m);
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        assert_eq!(m.poll_timeout(), Some(t0 + Duration::from_secs(5)));
        m.handle_tick(t0 + Duration::from_secs(4));
        assert_eq!(actions(&mut m), []);
        m.handle_tick(t0 + Duration::from_secs(5));
        assert_eq!(actions(&mut m), [dial("b", Incarnation::new(1))]);
    }

    #[test]
    fn lost_readiness_a_closed_connection_or_a_new_incarnation_redial() {
        let t0 = Instant::now();
        let mut m = Mesh::new("a", MeshConfig::default());
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Up)]);
        actions(&mut m);
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        m.handle_ready(t0, "b", true);
        m.handle_ready(t0, "b", false);
        assert_eq!(
            actions(&mut m),
            [dial("b", Incarnation::new(1))],
            "ready lost"
        );
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        m.handle_ready(t0, "b", true);
        m.handle_closed(t0, "b", Incarnation::new(0));
        assert_eq!(actions(&mut m), [], "another incarnation's connection");
        m.handle_closed(t0, "b", Incarnation::new(1));
        assert_eq!(
            actions(&mut m),
            [dial("b", Incarnation::new(1))],
            "connection closed"
        );
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        m.handle_members(t0, &[member("b", Incarnation::new(2), MemberState::Up)]);
        assert_eq!(
            actions(&mut m),
            [dial("b", Incarnation::new(2))],
            "restarted"
        );
    }

    /// A restarted head's first table lacks the members that have not
    /// rejoined yet; their sessions must outlive that (found with a job
    /// running through a head restart: every session was dialled again, and
    /// the batches in flight on them were lost).
    #[test]
    fn a_member_missing_from_a_table_keeps_its_ready_session() {
        let t0 = Instant::now();
        let mut m = Mesh::new("a", MeshConfig::default());
        let b = member("b", Incarnation::new(1), MemberState::Up);
        m.handle_members(t0, std::slice::from_ref(&b));
        actions(&mut m);
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        m.handle_ready(t0, "b", true);
        m.handle_members(t0, &[]);
        m.handle_tick(t0 + Duration::from_secs(30));
        assert_eq!(
            actions(&mut m),
            [],
            "absent: nothing closed, nothing dialled"
        );
        m.handle_members(t0 + Duration::from_secs(31), &[b]);
        assert_eq!(actions(&mut m), [], "back with the same incarnation: kept");
        assert_eq!(m.dialled().collect::<Vec<_>>(), ["b"]);
        m.handle_members(t0, &[]);
        m.handle_ready(t0, "b", false);
        assert_eq!(
            m.dialled().count(),
            0,
            "absent and no longer ready: forgotten"
        );
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Up)]);
        assert_eq!(actions(&mut m), [dial("b", Incarnation::new(1))]);
    }

    #[test]
    fn a_dialled_session_of_an_absent_member_that_never_becomes_ready_is_forgotten() {
        let t0 = Instant::now();
        let mut m = Mesh::new("a", MeshConfig::default());
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Up)]);
        actions(&mut m);
        m.handle_members(t0, &[]);
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        assert_eq!(m.poll_timeout(), Some(t0 + Duration::from_secs(5)));
        m.handle_tick(t0 + Duration::from_secs(5));
        assert_eq!(m.poll_timeout(), None, "no timeout left to spin on");
        assert_eq!(actions(&mut m), [], "an absent member is not dialled");
    }

    #[test]
    fn members_that_are_not_up_are_closed_at_once_and_on_every_tick() {
        let t0 = Instant::now();
        let mut m = Mesh::new("a", MeshConfig::default());
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Up)]);
        actions(&mut m);
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Down)]);
        assert_eq!(actions(&mut m), [MeshAction::Close { peer: "b".into() }]);
        assert_eq!(m.dialled().count(), 0);
        m.handle_members(t0, &[member("b", Incarnation::new(1), MemberState::Down)]);
        assert_eq!(actions(&mut m), [], "no change, no action");
        m.handle_tick(t0);
        assert_eq!(actions(&mut m), [MeshAction::Close { peer: "b".into() }]);
        // A late dial result of the old incarnation is not kept.
        m.handle_dialled(t0, "b", Incarnation::new(1), true);
        assert_eq!(m.dialled().count(), 0);
    }
}
