//! The member table kept by the head, with incarnations and a heartbeat
//! failure detector.
//!
//! ```text
//!            join (new incarnation)           silence > down_after
//!   (none) ─────────────────────────► Up ───────────────────────────► Down
//!                                      │ ▲ heartbeat                    │
//!                                      │ └──────────┘                   │ join with a newer
//!                                      │ leave (clean stop)             │ incarnation
//!                                      ▼                                ▼
//!                                     Left ◄──────── (rejoin) ────────► Up
//! ```
//!
//! A node start is a new incarnation; a member marked `Down` or `Left` stays
//! so for that incarnation: only a restart (a newer incarnation) brings the
//! name back `Up`. Messages of an older incarnation are dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rkyv::{Archive, Deserialize, Serialize};

use crate::hello::Refusal;
use crate::ledger::Held;
use crate::resources::Resources;

/// Failure-detector timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetectorConfig {
    /// How often members send heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a member is marked down.
    pub down_after: Duration,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            down_after: Duration::from_secs(5),
        }
    }
}

/// Liveness of a member as seen by the head.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Heartbeats arrive.
    Up,
    /// Silent for longer than `down_after`.
    Down,
    /// Stopped cleanly.
    Left,
}

impl MemberState {
    /// `"up"`, `"down"` or `"left"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
            Self::Left => "left",
        }
    }
}

/// A member as reported to other members and to `node status`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct MemberView {
    /// Node name (its certificate's name).
    pub name: String,
    /// Address other members dial.
    pub addr: String,
    /// Address of the node's bulk lane: its second endpoint, which carries
    /// large messages (see the runtime's `bulk` module).
    pub bulk_addr: String,
    /// The node's host id: members with the same one share memory (see
    /// the runtime's `objects` module).
    pub host: String,
    /// Start counter of this node; larger is newer.
    pub incarnation: u64,
    /// Current state.
    pub state: MemberState,
    /// What the node offers.
    pub resources: Resources,
    /// Actors running on the node, from its last heartbeat.
    pub actors: u32,
}

/// A node asking to become a member.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JoinRequest {
    /// Node name (its certificate's name).
    pub name: String,
    /// Address other members dial.
    pub addr: String,
    /// Address of the node's bulk lane.
    pub bulk_addr: String,
    /// The node's host id.
    pub host: String,
    /// Start counter of this node.
    pub incarnation: u64,
    /// What the node offers.
    pub resources: Resources,
    /// The placement-group bundles it holds (see [`crate::groups`]).
    pub held: Vec<Held>,
}

/// Checks a join request against the name proven by the joiner's
/// certificate: the names must match, and the admin identity may join only
/// as a driver that offers no resources (work is never placed on it).
pub fn check_join(req: &JoinRequest, cert_name: &str) -> Result<(), Refusal> {
    if req.name != cert_name {
        return Err(Refusal::IdentityMismatch);
    }
    let r = &req.resources;
    if req.name == crate::hello::ADMIN_NAME && (r.cpus > 0 || r.gpus > 0 || r.memory_bytes > 0) {
        return Err(Refusal::AdminCannotJoin);
    }
    Ok(())
}

/// What became of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// Recorded.
    Alive,
    /// No member of that name: the sender should join.
    Unknown,
    /// From an older incarnation than the member's: dropped.
    Stale,
    /// The member was already marked down or left for this incarnation:
    /// the sender must rejoin with a new incarnation.
    NotUp,
}

#[derive(Debug, Clone)]
struct Entry {
    view: MemberView,
    last_heard: Instant,
    /// The table version of this entry's last change.
    changed: u64,
    /// The table's own node is never marked down by silence.
    local: bool,
}

/// The member table with its failure detector.
///
/// Every operation costs O(log n) in the number of members but
/// [`Membership::view`], so a heartbeat's work does not grow with the
/// cluster: silence deadlines and changes are kept in ordered indexes.
#[derive(Debug, Clone)]
pub struct Membership {
    config: DetectorConfig,
    members: BTreeMap<String, Entry>,
    version: u64,
    /// `(last heard, name)` of every up member silence may mark down.
    silence: BTreeSet<(Instant, String)>,
    /// `(version of last change, name)` of every member.
    changes: BTreeSet<(u64, String)>,
}

impl Membership {
    /// An empty table.
    pub fn new(config: DetectorConfig) -> Self {
        Self {
            config,
            members: BTreeMap::new(),
            version: 0,
            silence: BTreeSet::new(),
            changes: BTreeSet::new(),
        }
    }

    /// The timing in force.
    pub fn config(&self) -> DetectorConfig {
        self.config
    }

    /// Adds the table's own node, which silence never marks down.
    pub fn add_local(&mut self, now: Instant, join: JoinRequest) {
        self.insert(now, join, true);
    }

    /// Admits a node, or a newer incarnation of a known one.
    ///
    /// The same incarnation joining again is idempotent while it is up; an
    /// older incarnation than the table's is refused.
    pub fn join(&mut self, now: Instant, join: JoinRequest) -> Result<(), Refusal> {
        if let Some(entry) = self.members.get(&join.name) {
            let known = entry.view.incarnation;
            if join.incarnation < known
                || (join.incarnation == known && entry.view.state != MemberState::Up)
            {
                return Err(Refusal::StaleIncarnation);
            }
        }
        self.insert(now, join, false);
        Ok(())
    }

    /// Records that `name` changed in the next version (callers bump the
    /// version once per operation, then stamp every entry it changed).
    fn stamp(&mut self, name: &str) {
        if let Some(entry) = self.members.get_mut(name) {
            self.changes.remove(&(entry.changed, name.to_owned()));
            entry.changed = self.version;
            self.changes.insert((self.version, name.to_owned()));
        }
    }

    fn insert(&mut self, now: Instant, join: JoinRequest, local: bool) {
        let view = MemberView {
            name: join.name.clone(),
            addr: join.addr,
            bulk_addr: join.bulk_addr,
            host: join.host,
            incarnation: join.incarnation,
            state: MemberState::Up,
            resources: join.resources,
            actors: 0,
        };
        let previous = self.members.get(&join.name);
        let changed = previous.is_none_or(|e| e.view != view);
        let stamp = previous.map_or(0, |e| e.changed);
        if let Some(e) = previous
            && !e.local
            && e.view.state == MemberState::Up
        {
            self.silence.remove(&(e.last_heard, join.name.clone()));
        }
        if !local {
            self.silence.insert((now, join.name.clone()));
        }
        self.members.insert(
            join.name.clone(),
            Entry {
                view,
                last_heard: now,
                changed: stamp,
                local,
            },
        );
        // An unchanged entry keeps its stamp, already in the index.
        if changed {
            self.version += 1;
            self.stamp(&join.name);
        }
    }

    /// Records a heartbeat from `name` at `now`.
    pub fn heartbeat(
        &mut self,
        now: Instant,
        name: &str,
        incarnation: u64,
        actors: u32,
    ) -> HeartbeatOutcome {
        let Some(entry) = self.members.get_mut(name) else {
            return HeartbeatOutcome::Unknown;
        };
        if incarnation < entry.view.incarnation {
            return HeartbeatOutcome::Stale;
        }
        if incarnation > entry.view.incarnation {
            return HeartbeatOutcome::Unknown;
        }
        if entry.view.state != MemberState::Up {
            return HeartbeatOutcome::NotUp;
        }
        if !entry.local {
            self.silence.remove(&(entry.last_heard, name.to_owned()));
            self.silence.insert((now, name.to_owned()));
        }
        entry.last_heard = now;
        if entry.view.actors != actors {
            entry.view.actors = actors;
            self.version += 1;
            self.stamp(name);
        }
        HeartbeatOutcome::Alive
    }

    /// Records the local node's actor count.
    pub fn set_actors(&mut self, name: &str, actors: u32) {
        if let Some(entry) = self.members.get_mut(name)
            && entry.view.actors != actors
        {
            entry.view.actors = actors;
            self.version += 1;
            self.stamp(name);
        }
    }

    /// Marks `name` as having left cleanly. Returns whether anything changed.
    pub fn leave(&mut self, name: &str, incarnation: u64) -> bool {
        match self.members.get_mut(name) {
            Some(entry)
                if entry.view.incarnation == incarnation && entry.view.state == MemberState::Up =>
            {
                entry.view.state = MemberState::Left;
                entry.view.actors = 0;
                if !entry.local {
                    self.silence.remove(&(entry.last_heard, name.to_owned()));
                }
                self.version += 1;
                self.stamp(name);
                true
            }
            _ => false,
        }
    }

    /// Marks every member silent for longer than `down_after` as down and
    /// returns their names.
    pub fn poll_down(&mut self, now: Instant) -> Vec<String> {
        let mut downed = Vec::new();
        while let Some((heard, name)) = self.silence.first().cloned() {
            if now.saturating_duration_since(heard) <= self.config.down_after {
                break;
            }
            self.silence.pop_first();
            if let Some(entry) = self.members.get_mut(&name) {
                entry.view.state = MemberState::Down;
                entry.view.actors = 0;
            }
            downed.push(name);
        }
        if !downed.is_empty() {
            self.version += 1;
            for name in &downed {
                self.stamp(name);
            }
        }
        downed.sort();
        downed
    }

    /// The earliest instant at which [`Membership::poll_down`] marks a
    /// member down if nothing is heard from it before (just after its
    /// silence passes `down_after`), if any member can be.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.silence
            .first()
            .map(|(heard, _)| *heard + self.config.down_after + Duration::from_nanos(1))
    }

    /// Every member, sorted by name.
    pub fn view(&self) -> Vec<MemberView> {
        self.members.values().map(|e| e.view.clone()).collect()
    }

    /// The members that changed after `version`, in the order they changed:
    /// applied to a table of `version`, they give this one.
    pub fn changes_since(&self, version: u64) -> Vec<MemberView> {
        self.changes
            .range((version + 1, String::new())..)
            .filter_map(|(_, name)| self.members.get(name).map(|e| e.view.clone()))
            .collect()
    }

    /// One member.
    pub fn get(&self, name: &str) -> Option<&MemberView> {
        self.members.get(name).map(|e| &e.view)
    }

    /// Members in the table.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A counter bumped by every change, for pushing updates only when needed.
    pub fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(name: &str, incarnation: u64) -> JoinRequest {
        JoinRequest {
            name: name.into(),
            addr: format!("127.0.0.1:{}", 7000 + incarnation),
            bulk_addr: format!("127.0.0.1:{}", 8000 + incarnation),
            host: "h".into(),
            incarnation,
            resources: Resources::default(),
            held: Vec::new(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn state(m: &Membership, name: &str) -> MemberState {
        m.get(name).unwrap().state
    }

    #[test]
    fn admin_joins_only_as_a_driver_without_resources() {
        let join = |name: &str, cpus: u32| JoinRequest {
            name: name.into(),
            addr: "127.0.0.1:1".into(),
            bulk_addr: "127.0.0.1:2".into(),
            host: "h".into(),
            incarnation: 1,
            resources: Resources {
                cpus,
                ..Resources::default()
            },
            held: Vec::new(),
        };
        assert_eq!(check_join(&join("admin", 0), "admin"), Ok(()));
        assert_eq!(
            check_join(&join("admin", 4), "admin"),
            Err(Refusal::AdminCannotJoin)
        );
        assert_eq!(check_join(&join("n1", 4), "n1"), Ok(()));
        assert_eq!(
            check_join(&join("n1", 4), "n2"),
            Err(Refusal::IdentityMismatch)
        );
    }

    #[test]
    fn silent_member_is_marked_down_after_the_threshold() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", 1)).unwrap();
        assert!(
            m.poll_down(t0 + secs(5)).is_empty(),
            "exactly 5 s is not yet down"
        );
        assert_eq!(
            m.poll_timeout(),
            Some(t0 + secs(5) + Duration::from_nanos(1))
        );
        assert_eq!(
            m.poll_down(t0 + Duration::from_millis(5001)),
            vec!["n1".to_owned()]
        );
        assert_eq!(state(&m, "n1"), MemberState::Down);
        assert_eq!(m.poll_timeout(), None);
    }

    #[test]
    fn heartbeats_keep_a_member_up() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", 1)).unwrap();
        for s in 1..=30 {
            assert_eq!(
                m.heartbeat(t0 + secs(s), "n1", 1, 3),
                HeartbeatOutcome::Alive
            );
            assert!(m.poll_down(t0 + secs(s)).is_empty());
        }
        assert_eq!(m.get("n1").unwrap().actors, 3);
    }

    #[test]
    fn local_node_is_never_marked_down() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.add_local(t0, req("head", 1));
        assert!(m.poll_down(t0 + secs(3600)).is_empty());
        assert_eq!(m.poll_timeout(), None);
    }

    #[test]
    fn clean_stop_is_left_not_down() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", 1)).unwrap();
        assert!(m.leave("n1", 1));
        assert!(m.poll_down(t0 + secs(60)).is_empty());
        assert_eq!(state(&m, "n1"), MemberState::Left);
        assert_eq!(
            m.heartbeat(t0 + secs(61), "n1", 1, 0),
            HeartbeatOutcome::NotUp
        );
    }

    #[test]
    fn down_member_returns_only_with_a_new_incarnation() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", 1)).unwrap();
        m.poll_down(t0 + secs(6));
        assert_eq!(
            m.heartbeat(t0 + secs(7), "n1", 1, 0),
            HeartbeatOutcome::NotUp
        );
        assert_eq!(
            m.join(t0 + secs(7), req("n1", 1)),
            Err(Refusal::StaleIncarnation)
        );
        m.join(t0 + secs(8), req("n1", 2)).unwrap();
        assert_eq!(state(&m, "n1"), MemberState::Up);
        assert_eq!(
            m.heartbeat(t0 + secs(8), "n1", 1, 0),
            HeartbeatOutcome::Stale
        );
    }

    #[test]
    fn older_incarnation_cannot_replace_a_newer_one() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", 5)).unwrap();
        assert_eq!(m.join(t0, req("n1", 4)), Err(Refusal::StaleIncarnation));
        m.join(t0, req("n1", 5)).unwrap();
        assert_eq!(m.get("n1").unwrap().incarnation, 5);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join(u8, u64),
        Heartbeat(u8, u64),
        Leave(u8, u64),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3, 1u64..4).prop_map(|(n, i)| Op::Join(n, i)),
            (0u8..3, 1u64..4).prop_map(|(n, i)| Op::Heartbeat(n, i)),
            (0u8..3, 1u64..4).prop_map(|(n, i)| Op::Leave(n, i)),
            (0u64..4000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// Against a simple model: a member is up iff its current incarnation
        /// joined, neither left nor fell silent beyond the threshold since.
        #[test]
        fn table_matches_reference_model(ops in proptest::collection::vec(op(), 0..60)) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut m = Membership::new(DetectorConfig::default());
            // name -> (incarnation, up, last_heard)
            let mut model: BTreeMap<String, (u64, bool, Instant)> = BTreeMap::new();
            let mut snapshots: Vec<(u64, Vec<MemberView>)> = vec![(0, Vec::new())];
            let limit = DetectorConfig::default().down_after;
            for op in ops {
                match op {
                    Op::Join(n, i) => {
                        let name = format!("n{n}");
                        let allowed = match model.get(&name) {
                            None => true,
                            Some(&(inc, up, _)) => i > inc || (i == inc && up),
                        };
                        prop_assert_eq!(m.join(now, req(&name, i)).is_ok(), allowed);
                        if allowed {
                            model.insert(name, (i, true, now));
                        }
                    }
                    Op::Heartbeat(n, i) => {
                        let name = format!("n{n}");
                        let out = m.heartbeat(now, &name, i, 0);
                        if let Some(e) = model.get_mut(&name) {
                            if e.0 == i && e.1 {
                                prop_assert_eq!(out, HeartbeatOutcome::Alive);
                                e.2 = now;
                            } else {
                                prop_assert_ne!(out, HeartbeatOutcome::Alive);
                            }
                        } else {
                            prop_assert_eq!(out, HeartbeatOutcome::Unknown);
                        }
                    }
                    Op::Leave(n, i) => {
                        let name = format!("n{n}");
                        let expect = matches!(model.get(&name), Some(&(inc, true, _)) if inc == i);
                        prop_assert_eq!(m.leave(&name, i), expect);
                        if expect {
                            model.get_mut(&name).unwrap().1 = false;
                        }
                    }
                    Op::Advance(ms) => {
                        now += Duration::from_millis(ms);
                        let mut downed = m.poll_down(now);
                        downed.sort();
                        let mut expect = Vec::new();
                        for (name, e) in model.iter_mut() {
                            if e.1 && now.duration_since(e.2) > limit {
                                e.1 = false;
                                expect.push(name.clone());
                            }
                        }
                        prop_assert_eq!(downed, expect);
                    }
                }
                for (name, e) in &model {
                    prop_assert_eq!(m.get(name).unwrap().state == MemberState::Up, e.1);
                    prop_assert_eq!(m.get(name).unwrap().incarnation, e.0);
                }
                // The changes since any earlier version, applied to the
                // table of that version, give the table of now.
                for (version, old) in &snapshots {
                    let mut table: BTreeMap<String, MemberView> =
                        old.iter().map(|v| (v.name.clone(), v.clone())).collect();
                    for v in m.changes_since(*version) {
                        table.insert(v.name.clone(), v);
                    }
                    prop_assert_eq!(table.into_values().collect::<Vec<_>>(), m.view());
                }
                snapshots.push((m.version(), m.view()));
                // The silence deadline is the earliest of the up members'.
                let earliest = model
                    .values()
                    .filter(|e| e.1)
                    .map(|e| e.2 + limit + Duration::from_nanos(1))
                    .min();
                prop_assert_eq!(m.poll_timeout(), earliest);
            }
        }
    }
}
