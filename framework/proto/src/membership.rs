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
//!
//!   Up ── drain ──► Draining ── leave ──► Left      (silence: Down)
//! ```
//!
//! A node start is a new incarnation; a member marked `Down` or `Left` stays
//! so for that incarnation: only a restart (a newer incarnation) brings the
//! name back `Up`. Messages of an older incarnation are dropped.
//!
//! A `Draining` member is alive (it heartbeats, its sessions stay open, the
//! actors it still hosts run) but takes no new work: placement passes it
//! by and moves its bundles, supervisors move their children off it, and it
//! leaves once it hosts nothing or its drain's time is up. It never goes
//! back to `Up` in the same incarnation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rkyv::{Archive, Deserialize, Serialize};

use crate::hello::Refusal;
use crate::ids::MemberName;
use crate::incarnation::Incarnation;
use crate::ledger::Held;
use crate::resources::Resources;
use crate::role::{Role, has_instance, max_members, principal_of};

/// Failure-detector timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetectorConfig {
    /// How often members send heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a member is marked down.
    pub down_after: Duration,
    /// How long a member with an instance tag (a driver's, an admin's or an
    /// observer's process, or a pooled worker's, whose names rarely come
    /// back) stays in the table once it left or is down, before it is
    /// forgotten.
    pub forget_after: Duration,
}

impl DetectorConfig {
    /// How recently a member must have been heard for a join of a newer
    /// incarnation under its name to be refused as a second live process
    /// ([`JoinRefused::NameTaken`]): two heartbeat intervals. A process
    /// restarted after a crash joins once its predecessor has been silent
    /// that long.
    pub fn live_window(&self) -> Duration {
        self.heartbeat_interval * 2
    }
}

impl Default for DetectorConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            down_after: Duration::from_secs(5),
            forget_after: Duration::from_secs(300),
        }
    }
}

/// Whether the incarnation `incarnation` of a member has ended, given what
/// a table holds of that member (`known`: its incarnation there and whether
/// it is up): a newer one is there, or this one is down or left. A member
/// the table does not hold has not ended (it may have just joined).
pub fn has_ended(known: Option<(Incarnation, bool)>, incarnation: Incarnation) -> bool {
    known.is_some_and(|(i, up)| i > incarnation || (i == incarnation && !up))
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
    /// Alive, finishing or handing back what it holds before it leaves:
    /// takes no new work (see the module's notes).
    Draining,
}

impl MemberState {
    /// `"up"`, `"down"`, `"left"` or `"draining"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
            Self::Left => "left",
            Self::Draining => "draining",
        }
    }

    /// Whether the member's process runs, as far as the table knows: up
    /// or draining. Its actors run and its sessions stay open.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Up | Self::Draining)
    }
}

/// The longest drain a request may ask for: one hour.
pub const MAX_DRAIN_MS: u64 = 3_600_000;

/// What became of a drain request ([`Membership::drain`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// The member is draining now (or already was: the first drain's time
    /// holds).
    Draining,
    /// No member of that name.
    Unknown,
    /// The member is down or left already.
    NotLive,
    /// The head itself is not drained: it keeps the table.
    Head,
}

impl DrainOutcome {
    /// A sentence for operators, with a stable code where it refuses.
    pub fn describe(self, name: &str) -> String {
        match self {
            Self::Draining => format!("{name} is draining"),
            Self::Unknown => format!("NODE-DRAIN-001: no member is named {name:?}"),
            Self::NotLive => format!("NODE-DRAIN-002: {name} is down or left already"),
            Self::Head => format!(
                "NODE-DRAIN-003: {name} is the head; it keeps the member table and is not drained"
            ),
        }
    }
}

/// A member as reported to other members and to `node status`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct MemberView {
    /// Node name (its certificate's name).
    pub name: MemberName,
    /// Address other members dial.
    pub addr: String,
    /// Address of the node's bulk lane: its second endpoint, which carries
    /// large messages (see the runtime's `bulk` module).
    pub bulk_addr: String,
    /// The node's host id: members with the same one share memory (see
    /// the runtime's `objects` module).
    pub host: String,
    /// Start counter of this node; larger is newer.
    pub incarnation: Incarnation,
    /// Current state.
    pub state: MemberState,
    /// What the node offers.
    pub resources: Resources,
    /// Actors running on the node, from its last heartbeat.
    pub actors: u32,
    /// The role its certificate carries: workers (and the head) host
    /// work; drivers, admins and tools do not.
    pub role: Role,
    /// While it is draining, how long its drain was given (milliseconds
    /// from when the member sees it draining) before it leaves whatever
    /// it still holds; 0 otherwise.
    pub drain_within_ms: u64,
}

/// A node asking to become a member.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JoinRequest {
    /// Node name (its certificate's name).
    pub name: MemberName,
    /// Address other members dial.
    pub addr: String,
    /// Address of the node's bulk lane.
    pub bulk_addr: String,
    /// The node's host id.
    pub host: String,
    /// Start counter of this node.
    pub incarnation: Incarnation,
    /// What the node offers.
    pub resources: Resources,
    /// The placement-group bundles it holds (see [`crate::groups`]).
    pub held: Vec<Held>,
}

/// How many removals a table remembers, to tell members that are behind.
pub const REMOVALS_KEPT: usize = 4096;

/// Longest address or host id a join may carry, in bytes.
pub const MAX_JOIN_ADDR: usize = 256;
/// Most labels, and most custom resources, a join may carry.
pub const MAX_JOIN_ENTRIES: usize = 64;
/// Longest label key or resource name, in bytes.
pub const MAX_JOIN_KEY: usize = 64;
/// Longest label value, in bytes.
pub const MAX_JOIN_VALUE: usize = 256;
/// Most held placement-group records a join may report.
pub const MAX_JOIN_HELD: usize = 4096;

/// Checks a join request against the stream it came on: the member name
/// and incarnation its hello proved (`member`, `incarnation`) and its
/// certificate's `role`. The names and incarnations must match, observers
/// never join, drivers and admins only offering no resources (work is
/// never placed on them), and what the join carries must be within its
/// bounds ([`MAX_JOIN_ENTRIES`] and the others), so one member cannot make
/// the table too large for everyone else.
pub fn check_join(
    req: &JoinRequest,
    member: &str,
    incarnation: Incarnation,
    role: Role,
) -> Result<(), Refusal> {
    if req.name != member {
        return Err(Refusal::IdentityMismatch);
    }
    if req.incarnation.is_tool() {
        return Err(Refusal::ToolIncarnation);
    }
    if req.incarnation != incarnation {
        return Err(Refusal::IncarnationMismatch);
    }
    let r = &req.resources;
    crate::authority::may_join(
        role,
        r.cpus > 0 || r.gpus > 0 || r.memory_bytes > 0 || r.custom.values().any(|v| *v > 0.0),
    )?;
    let long = |s: &str, max: usize| s.len() > max;
    if long(&req.addr, MAX_JOIN_ADDR)
        || long(&req.bulk_addr, MAX_JOIN_ADDR)
        || long(&req.host, MAX_JOIN_ADDR)
        || r.labels.len() > MAX_JOIN_ENTRIES
        || r.custom.len() > MAX_JOIN_ENTRIES
        || r.labels
            .iter()
            .any(|(k, v)| long(k, MAX_JOIN_KEY) || long(v, MAX_JOIN_VALUE))
        || r.custom.keys().any(|k| long(k, MAX_JOIN_KEY))
        || req.held.len() > MAX_JOIN_HELD
    {
        return Err(Refusal::TooLarge);
    }
    Ok(())
}

/// The live member whose name a join asked for.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NameHolder {
    /// The name.
    pub name: MemberName,
    /// The address it was joined from.
    pub addr: String,
    /// Its incarnation.
    pub incarnation: Incarnation,
    /// How long ago it was last heard, in milliseconds.
    pub silent_ms: u64,
}

impl std::fmt::Display for NameHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NODE-JOIN-009: a live member is named {:?} (incarnation {} at {}, heard {} ms ago); stop it first, or give this node another name",
            self.name, self.incarnation, self.addr, self.silent_ms
        )
    }
}

/// Why [`Membership::join`] refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinRefused {
    /// Refused for good (see [`Refusal`]).
    Refused(Refusal),
    /// Another live process holds the name: it was heard within the
    /// [`DetectorConfig::live_window`]. A process restarted after a crash
    /// sees this until its predecessor has been silent that long.
    NameTaken(NameHolder),
}

impl From<Refusal> for JoinRefused {
    fn from(r: Refusal) -> Self {
        Self::Refused(r)
    }
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
    members: BTreeMap<MemberName, Entry>,
    version: u64,
    /// `(last heard, name)` of every up member silence may mark down.
    silence: BTreeSet<(Instant, MemberName)>,
    /// `(version of last change, name)` of every member.
    changes: BTreeSet<(u64, MemberName)>,
    /// `(when it ended, name)` of every member with an instance tag that
    /// left or is down: forgotten after `forget_after`.
    ended: BTreeSet<(Instant, MemberName)>,
    /// `version → name` of the members forgotten lately, so that changes
    /// since a version can say which to drop (the last
    /// [`REMOVALS_KEPT`]).
    removed: BTreeMap<u64, MemberName>,
    /// Serial numbers of revoked certificates (normalised, sorted), handed
    /// to every member with the table.
    revoked: Vec<Vec<u8>>,
    /// The table version of the revoked list's last change.
    revoked_changed: u64,
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
            ended: BTreeSet::new(),
            removed: BTreeMap::new(),
            revoked: Vec::new(),
            revoked_changed: 0,
        }
    }

    /// Records that `name` left or went down at `now`: a member with an
    /// instance tag (a tool's process, or a pooled worker's) is forgotten
    /// `forget_after` later.
    fn ended_at(&mut self, now: Instant, name: &str) {
        if self.members.contains_key(name) && has_instance(name) {
            self.ended.insert((now, MemberName::from(name)));
        }
    }

    /// Forgets the members of roles that run many processes that left or
    /// went down `forget_after` ago or more; returns their names. Members
    /// hear of it with the next changes ([`Membership::removed_since`]).
    pub fn poll_forget(&mut self, now: Instant) -> Vec<MemberName> {
        let mut forgotten = Vec::new();
        while let Some((at, name)) = self.ended.first().cloned() {
            if now.saturating_duration_since(at) < self.config.forget_after {
                break;
            }
            self.ended.pop_first();
            let Some(entry) = self.members.get(&name) else {
                continue;
            };
            if entry.view.state.is_live() {
                continue;
            }
            self.changes.remove(&(entry.changed, name.clone()));
            self.members.remove(&name);
            self.version += 1;
            self.removed.insert(self.version, name.clone());
            while self.removed.len() > REMOVALS_KEPT {
                self.removed.pop_first();
            }
            forgotten.push(name);
        }
        forgotten
    }

    /// The members forgotten after `version`.
    pub fn removed_since(&self, version: u64) -> Vec<MemberName> {
        self.removed
            .range(version + 1..)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// Sets the serial numbers of revoked certificates (what the CA's
    /// revocation list names); a change is a new table version, pushed to
    /// every member. Returns whether it changed.
    pub fn set_revoked(&mut self, mut serials: Vec<Vec<u8>>) -> bool {
        serials.sort();
        serials.dedup();
        if serials == self.revoked {
            return false;
        }
        self.revoked = serials;
        self.version += 1;
        self.revoked_changed = self.version;
        true
    }

    /// The serial numbers of revoked certificates, sorted.
    pub fn revoked(&self) -> &[Vec<u8>] {
        &self.revoked
    }

    /// The revoked serials if they changed after `version`.
    pub fn revoked_since(&self, version: u64) -> Option<Vec<Vec<u8>>> {
        (self.revoked_changed > version).then(|| self.revoked.clone())
    }

    /// The timing in force.
    pub fn config(&self) -> DetectorConfig {
        self.config
    }

    /// Adds the table's own node (the head), which silence never marks
    /// down.
    pub fn add_local(&mut self, now: Instant, join: JoinRequest) {
        self.insert(now, join, Role::Head, true);
    }

    /// Admits a node of `role` (its certificate's), or a newer incarnation
    /// of a known one.
    ///
    /// The same incarnation joining again is idempotent while it is up; an
    /// older incarnation than the table's is refused. A newer incarnation
    /// is refused while the current one is up and was heard within the
    /// [`DetectorConfig::live_window`]: two live processes never take turns
    /// under one name.
    ///
    /// One certificate (a principal) holds at most
    /// [`max_members`] entries (64, a worker pool's 4,096): a join that
    /// would add one
    /// more is refused, so one certificate cannot grow every node's table
    /// without bound.
    pub fn join(&mut self, now: Instant, join: JoinRequest, role: Role) -> Result<(), JoinRefused> {
        if !self.members.contains_key(&join.name) {
            let principal = principal_of(&join.name);
            let held = self
                .members
                .keys()
                .filter(|name| principal_of(name) == principal)
                .count();
            if held >= max_members(role) {
                return Err(Refusal::TooManyMembers.into());
            }
        }
        if let Some(entry) = self.members.get(&join.name) {
            let known = entry.view.incarnation;
            if join.incarnation < known
                || (join.incarnation == known && !entry.view.state.is_live())
            {
                return Err(Refusal::StaleIncarnation.into());
            }
            let silent = now.saturating_duration_since(entry.last_heard);
            if join.incarnation > known
                && entry.view.state.is_live()
                && (entry.local || silent < self.config.live_window())
            {
                return Err(JoinRefused::NameTaken(NameHolder {
                    name: join.name.clone(),
                    addr: entry.view.addr.clone(),
                    incarnation: known,
                    silent_ms: silent.as_millis() as u64,
                }));
            }
        }
        self.insert(now, join, role, false);
        Ok(())
    }

    /// Records that `name` changed in the next version (callers bump the
    /// version once per operation, then stamp every entry it changed).
    fn stamp(&mut self, name: &str) {
        if let Some(entry) = self.members.get_mut(name) {
            self.changes
                .remove(&(entry.changed, MemberName::from(name)));
            entry.changed = self.version;
            self.changes.insert((self.version, MemberName::from(name)));
        }
    }

    fn insert(&mut self, now: Instant, join: JoinRequest, role: Role, local: bool) {
        let view = MemberView {
            name: join.name.clone(),
            addr: join.addr,
            bulk_addr: join.bulk_addr,
            host: join.host,
            incarnation: join.incarnation,
            state: MemberState::Up,
            resources: join.resources,
            actors: 0,
            role,
            drain_within_ms: 0,
        };
        let previous = self.members.get(&join.name);
        // The same process joining again (its stream was made anew) stays
        // draining: a drain is never undone within an incarnation.
        let view = match previous {
            Some(e)
                if e.view.incarnation == view.incarnation
                    && e.view.state == MemberState::Draining =>
            {
                MemberView {
                    state: MemberState::Draining,
                    drain_within_ms: e.view.drain_within_ms,
                    ..view
                }
            }
            _ => view,
        };
        let changed = previous.is_none_or(|e| e.view != view);
        let stamp = previous.map_or(0, |e| e.changed);
        if let Some(e) = previous
            && !e.local
            && e.view.state.is_live()
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

    /// How long before `now` each member was last heard from (its join or
    /// its latest heartbeat; zero for the table's own node), in name
    /// order.
    pub fn heard(&self, now: Instant) -> Vec<(MemberName, std::time::Duration)> {
        self.members
            .iter()
            .map(|(name, e)| {
                let ago = match e.local {
                    true => std::time::Duration::ZERO,
                    false => now.saturating_duration_since(e.last_heard),
                };
                (name.clone(), ago)
            })
            .collect()
    }

    /// Records a heartbeat from `name` at `now`.
    pub fn heartbeat(
        &mut self,
        now: Instant,
        name: &str,
        incarnation: Incarnation,
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
        if !entry.view.state.is_live() {
            return HeartbeatOutcome::NotUp;
        }
        if !entry.local {
            self.silence
                .remove(&(entry.last_heard, MemberName::from(name)));
            self.silence.insert((now, MemberName::from(name)));
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

    /// Marks `name` as having left cleanly at `now`. Returns whether
    /// anything changed.
    pub fn leave(&mut self, now: Instant, name: &str, incarnation: Incarnation) -> bool {
        match self.members.get_mut(name) {
            Some(entry) if entry.view.incarnation == incarnation && entry.view.state.is_live() => {
                entry.view.state = MemberState::Left;
                entry.view.actors = 0;
                entry.view.drain_within_ms = 0;
                if !entry.local {
                    self.silence
                        .remove(&(entry.last_heard, MemberName::from(name)));
                }
                self.version += 1;
                self.stamp(name);
                self.ended_at(now, name);
                true
            }
            _ => false,
        }
    }

    /// Marks the member `name` draining (see the module's notes), given
    /// `within` to finish or hand back what it holds before it leaves
    /// (at most [`MAX_DRAIN_MS`]). A member draining already keeps its
    /// first drain's time.
    pub fn drain(&mut self, name: &str, within: Duration) -> DrainOutcome {
        let Some(entry) = self.members.get_mut(name) else {
            return DrainOutcome::Unknown;
        };
        if entry.local {
            return DrainOutcome::Head;
        }
        match entry.view.state {
            MemberState::Draining => DrainOutcome::Draining,
            MemberState::Down | MemberState::Left => DrainOutcome::NotLive,
            MemberState::Up => {
                entry.view.state = MemberState::Draining;
                entry.view.drain_within_ms = (within.as_millis() as u64).clamp(1, MAX_DRAIN_MS);
                self.version += 1;
                self.stamp(name);
                DrainOutcome::Draining
            }
        }
    }

    /// Marks every member silent for longer than `down_after` as down and
    /// returns their names.
    pub fn poll_down(&mut self, now: Instant) -> Vec<MemberName> {
        let mut downed = Vec::new();
        while let Some((heard, name)) = self.silence.first().cloned() {
            if now.saturating_duration_since(heard) <= self.config.down_after {
                break;
            }
            self.silence.pop_first();
            if let Some(entry) = self.members.get_mut(&name) {
                entry.view.state = MemberState::Down;
                entry.view.actors = 0;
                entry.view.drain_within_ms = 0;
            }
            self.ended_at(now, &name);
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
        let down = self
            .silence
            .first()
            .map(|(heard, _)| *heard + self.config.down_after + Duration::from_nanos(1));
        let forget = self
            .ended
            .first()
            .map(|(at, _)| *at + self.config.forget_after);
        down.into_iter().chain(forget).min()
    }

    /// Every member, sorted by name.
    pub fn view(&self) -> Vec<MemberView> {
        self.members.values().map(|e| e.view.clone()).collect()
    }

    /// The members that changed after `version`, in the order they changed:
    /// applied to a table of `version`, they give this one.
    pub fn changes_since(&self, version: u64) -> Vec<MemberView> {
        self.changes
            .range((version + 1, MemberName::default())..)
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
    use crate::role::{MAX_MEMBERS_PER_POOL, MAX_MEMBERS_PER_PRINCIPAL};
    use proptest::prelude::*;

    fn req(name: &str, incarnation: Incarnation) -> JoinRequest {
        JoinRequest {
            name: name.into(),
            addr: format!("127.0.0.1:{}", 7000 + incarnation.get()),
            bulk_addr: format!("127.0.0.1:{}", 8000 + incarnation.get()),
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
    fn a_draining_member_stays_alive_until_it_leaves_and_is_never_up_again() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.add_local(t0, req("head", Incarnation::new(1)));
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        assert_eq!(m.drain("head", secs(30)), DrainOutcome::Head);
        assert_eq!(m.drain("nobody", secs(30)), DrainOutcome::Unknown);
        let v = m.version();
        assert_eq!(m.drain("n1", secs(30)), DrainOutcome::Draining);
        assert!(m.version() > v, "a drain is a change pushed to members");
        assert_eq!(state(&m, "n1"), MemberState::Draining);
        assert_eq!(m.get("n1").unwrap().drain_within_ms, 30_000);
        // A second drain keeps the first one's time.
        assert_eq!(m.drain("n1", secs(1)), DrainOutcome::Draining);
        assert_eq!(m.get("n1").unwrap().drain_within_ms, 30_000);
        // Heartbeats keep it alive, and draining.
        assert_eq!(
            m.heartbeat(t0 + secs(3), "n1", Incarnation::new(1), 2),
            HeartbeatOutcome::Alive
        );
        assert!(m.poll_down(t0 + secs(7)).is_empty());
        assert_eq!(state(&m, "n1"), MemberState::Draining);
        // Its stream made anew: the same incarnation joins again and stays
        // draining.
        m.join(t0 + secs(4), req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        assert_eq!(state(&m, "n1"), MemberState::Draining);
        // A second process under the name is still refused while it lives.
        assert!(matches!(
            m.join(t0 + secs(4), req("n1", Incarnation::new(2)), Role::Worker),
            Err(JoinRefused::NameTaken(_))
        ));
        assert!(m.leave(t0 + secs(5), "n1", Incarnation::new(1)));
        assert_eq!(state(&m, "n1"), MemberState::Left);
        assert_eq!(m.get("n1").unwrap().drain_within_ms, 0);
        assert_eq!(m.drain("n1", secs(30)), DrainOutcome::NotLive);
    }

    #[test]
    fn a_silent_draining_member_goes_down() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        m.drain("n1", secs(600));
        assert_eq!(m.poll_down(t0 + secs(6)), vec![MemberName::from("n1")]);
        assert_eq!(state(&m, "n1"), MemberState::Down);
    }

    #[test]
    fn drivers_join_only_without_resources_and_observers_never() {
        let join = |name: &str, cpus: u32| JoinRequest {
            name: name.into(),
            addr: "127.0.0.1:1".into(),
            bulk_addr: "127.0.0.1:2".into(),
            host: "h".into(),
            incarnation: Incarnation::new(1),
            resources: Resources {
                cpus,
                ..Resources::default()
            },
            held: Vec::new(),
        };
        let d = "admin~0a";
        assert_eq!(
            check_join(&join(d, 0), d, Incarnation::new(1), Role::Admin),
            Ok(())
        );
        assert_eq!(
            check_join(&join(d, 4), d, Incarnation::new(1), Role::Admin),
            Err(Refusal::AdminCannotJoin)
        );
        assert_eq!(
            check_join(&join(d, 4), d, Incarnation::new(1), Role::Driver),
            Err(Refusal::AdminCannotJoin)
        );
        assert_eq!(
            check_join(&join(d, 0), d, Incarnation::new(1), Role::Observer),
            Err(Refusal::RoleCannotJoin)
        );
        assert_eq!(
            check_join(&join("n1", 4), "n1", Incarnation::new(1), Role::Worker),
            Ok(())
        );
        assert_eq!(
            check_join(&join("n1", 4), "n2", Incarnation::new(1), Role::Worker),
            Err(Refusal::IdentityMismatch)
        );
        // The stream's hello named incarnation 2; the body may not say 1.
        assert_eq!(
            check_join(&join("n1", 4), "n1", Incarnation::new(2), Role::Worker),
            Err(Refusal::IncarnationMismatch)
        );
    }

    #[test]
    fn a_join_past_its_bounds_is_refused_at_each_bound() {
        let ok = req("n1", Incarnation::new(1));
        assert_eq!(
            check_join(&ok, "n1", Incarnation::new(1), Role::Worker),
            Ok(())
        );
        let mut at = ok.clone();
        for i in 0..MAX_JOIN_ENTRIES {
            at.resources.labels.insert(
                format!("{i:0width$}", width = MAX_JOIN_KEY),
                "v".repeat(MAX_JOIN_VALUE),
            );
        }
        at.addr = "a".repeat(MAX_JOIN_ADDR);
        assert_eq!(
            check_join(&at, "n1", Incarnation::new(1), Role::Worker),
            Ok(()),
            "at the bounds"
        );
        let past: [&dyn Fn(&mut JoinRequest); 6] = [
            &|j| {
                j.resources.labels.insert("one-more".into(), "v".into());
            },
            &|j| {
                let k = j.resources.labels.keys().next().unwrap().clone();
                j.resources.labels.insert(k, "v".repeat(MAX_JOIN_VALUE + 1));
            },
            &|j| {
                j.resources.labels.clear();
                j.resources
                    .labels
                    .insert("k".repeat(MAX_JOIN_KEY + 1), "v".into());
            },
            &|j| j.addr.push('a'),
            &|j| j.host = "h".repeat(MAX_JOIN_ADDR + 1),
            &|j| {
                for i in 0..=MAX_JOIN_ENTRIES {
                    j.resources.custom.insert(format!("r{i}"), 1.0);
                }
            },
        ];
        for (i, f) in past.iter().enumerate() {
            let mut j = at.clone();
            f(&mut j);
            assert_eq!(
                check_join(&j, "n1", Incarnation::new(1), Role::Worker),
                Err(Refusal::TooLarge),
                "case {i}"
            );
        }
    }

    #[test]
    fn drivers_that_left_or_went_down_are_forgotten_and_workers_are_not() {
        let t0 = Instant::now();
        let config = DetectorConfig::default();
        let mut m = Membership::new(config);
        m.join(t0, req("w1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        m.join(t0, req("admin~0a", Incarnation::new(1)), Role::Admin)
            .unwrap();
        m.join(t0, req("alice~0b", Incarnation::new(1)), Role::Driver)
            .unwrap();
        m.join(t0, req("pool~pod-a", Incarnation::new(1)), Role::Worker)
            .unwrap();
        let v = m.version();
        assert!(m.leave(t0, "admin~0a", Incarnation::new(1)));
        assert!(m.leave(t0, "w1", Incarnation::new(1)));
        assert!(m.leave(t0, "pool~pod-a", Incarnation::new(1)));
        // alice falls silent: down, then forgotten too.
        let down = t0 + config.down_after * 2;
        assert_eq!(m.poll_down(down), vec!["alice~0b".to_owned()]);
        let first = t0 + config.forget_after;
        assert_eq!(m.poll_timeout(), Some(first));
        assert!(m.poll_forget(first - Duration::from_millis(1)).is_empty());
        assert_eq!(
            m.poll_forget(first),
            vec!["admin~0a".to_owned(), "pool~pod-a".to_owned()],
            "a pooled worker's process is forgotten as a tool's"
        );
        assert_eq!(
            m.poll_forget(down + config.forget_after),
            vec!["alice~0b".to_owned()]
        );
        assert!(m.get("admin~0a").is_none() && m.get("alice~0b").is_none());
        assert_eq!(
            m.get("w1").unwrap().state,
            MemberState::Left,
            "a worker's name stays"
        );
        assert_eq!(m.removed_since(v), ["admin~0a", "pool~pod-a", "alice~0b"]);
        assert!(m.removed_since(m.version()).is_empty());
        assert_eq!(m.poll_timeout(), None);
    }

    #[test]
    fn a_second_live_process_under_a_name_is_refused_naming_the_first() {
        let t0 = Instant::now();
        let config = DetectorConfig::default();
        let mut m = Membership::new(config);
        m.join(t0, req("w1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        // Heard a moment ago: a second process is refused, the first kept.
        let t1 = t0 + config.heartbeat_interval;
        assert_eq!(
            m.heartbeat(t1, "w1", Incarnation::new(1), 0),
            HeartbeatOutcome::Alive
        );
        let refused = m.join(
            t1 + Duration::from_millis(300),
            req("w1", Incarnation::new(2)),
            Role::Worker,
        );
        assert_eq!(
            refused,
            Err(JoinRefused::NameTaken(NameHolder {
                name: "w1".into(),
                addr: "127.0.0.1:7001".into(),
                incarnation: Incarnation::new(1),
                silent_ms: 300,
            }))
        );
        assert_eq!(m.get("w1").unwrap().incarnation, Incarnation::new(1));
        // Silent for the live window (it crashed): the restart gets in.
        let later = t1 + config.live_window();
        m.join(later, req("w1", Incarnation::new(2)), Role::Worker)
            .unwrap();
        assert_eq!(m.get("w1").unwrap().incarnation, Incarnation::new(2));
        // The head's own name is never taken over.
        m.add_local(t0, req("head", Incarnation::new(1)));
        assert!(matches!(
            m.join(
                later + secs(60),
                req("head", Incarnation::new(9)),
                Role::Worker
            ),
            Err(JoinRefused::NameTaken(_))
        ));
    }

    #[test]
    fn silent_member_is_marked_down_after_the_threshold() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
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
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        for s in 1..=30 {
            assert_eq!(
                m.heartbeat(t0 + secs(s), "n1", Incarnation::new(1), 3),
                HeartbeatOutcome::Alive
            );
            assert!(m.poll_down(t0 + secs(s)).is_empty());
        }
        assert_eq!(m.get("n1").unwrap().actors, 3);
        // Last heard at 30 s; read at 32 s.
        assert_eq!(m.heard(t0 + secs(32)), [("n1".into(), secs(2))]);
    }

    #[test]
    fn local_node_is_never_marked_down() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.add_local(t0, req("head", Incarnation::new(1)));
        assert!(m.poll_down(t0 + secs(3600)).is_empty());
        assert_eq!(m.poll_timeout(), None);
        // Its own node needs no heartbeat: always just heard.
        assert_eq!(m.heard(t0 + secs(3600)), [("head".into(), secs(0))]);
    }

    #[test]
    fn one_certificate_cannot_grow_the_table_past_its_cap_until_its_ended_members_are_forgotten() {
        let t0 = Instant::now();
        let config = DetectorConfig::default();
        let mut m = Membership::new(config);
        let driver = |i: usize| req(&format!("ops~{i:016x}"), Incarnation::new(1));
        for i in 0..MAX_MEMBERS_PER_PRINCIPAL {
            m.join(t0, driver(i), Role::Driver).unwrap();
        }
        assert_eq!(
            m.join(t0, driver(MAX_MEMBERS_PER_PRINCIPAL), Role::Driver),
            Err(Refusal::TooManyMembers.into())
        );
        // Another certificate is not held back, nor a member already in.
        m.join(t0, req("other~01", Incarnation::new(1)), Role::Driver)
            .unwrap();
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        m.join(t0, driver(0), Role::Driver).unwrap();
        // A member that left still counts until it is forgotten.
        assert!(m.leave(t0, &format!("ops~{:016x}", 1), Incarnation::new(1)));
        assert_eq!(
            m.join(t0, driver(MAX_MEMBERS_PER_PRINCIPAL), Role::Driver),
            Err(Refusal::TooManyMembers.into())
        );
        let later = t0 + config.forget_after;
        assert_eq!(m.poll_forget(later).len(), 1);
        m.join(later, driver(MAX_MEMBERS_PER_PRINCIPAL), Role::Driver)
            .unwrap();
        // A worker pool (one certificate, the pods of a Deployment) may
        // hold many more, up to its own cap.
        let pod = |i: usize| req(&format!("pool~pod-{i}"), Incarnation::new(1));
        for i in 0..MAX_MEMBERS_PER_POOL {
            m.join(later, pod(i), Role::Worker).unwrap();
        }
        assert_eq!(
            m.join(later, pod(MAX_MEMBERS_PER_POOL), Role::Worker),
            Err(Refusal::TooManyMembers.into())
        );
    }

    #[test]
    fn clean_stop_is_left_not_down() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        assert!(m.leave(t0, "n1", Incarnation::new(1)));
        assert!(m.poll_down(t0 + secs(60)).is_empty());
        assert_eq!(state(&m, "n1"), MemberState::Left);
        assert_eq!(
            m.heartbeat(t0 + secs(61), "n1", Incarnation::new(1), 0),
            HeartbeatOutcome::NotUp
        );
    }

    #[test]
    fn down_member_returns_only_with_a_new_incarnation() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", Incarnation::new(1)), Role::Worker)
            .unwrap();
        m.poll_down(t0 + secs(6));
        assert_eq!(
            m.heartbeat(t0 + secs(7), "n1", Incarnation::new(1), 0),
            HeartbeatOutcome::NotUp
        );
        assert_eq!(
            m.join(t0 + secs(7), req("n1", Incarnation::new(1)), Role::Worker),
            Err(Refusal::StaleIncarnation.into())
        );
        m.join(t0 + secs(8), req("n1", Incarnation::new(2)), Role::Worker)
            .unwrap();
        assert_eq!(state(&m, "n1"), MemberState::Up);
        assert_eq!(
            m.heartbeat(t0 + secs(8), "n1", Incarnation::new(1), 0),
            HeartbeatOutcome::Stale
        );
    }

    #[test]
    fn older_incarnation_cannot_replace_a_newer_one() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        m.join(t0, req("n1", Incarnation::new(5)), Role::Worker)
            .unwrap();
        assert_eq!(
            m.join(t0, req("n1", Incarnation::new(4)), Role::Worker),
            Err(Refusal::StaleIncarnation.into())
        );
        m.join(t0, req("n1", Incarnation::new(5)), Role::Worker)
            .unwrap();
        assert_eq!(m.get("n1").unwrap().incarnation, Incarnation::new(5));
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
            let live = DetectorConfig::default().live_window();
            let mut snapshots: Vec<(u64, Vec<MemberView>)> = vec![(0, Vec::new())];
            let limit = DetectorConfig::default().down_after;
            for op in ops {
                match op {
                    Op::Join(n, i) => {
                        let name = format!("n{n}");
                        let allowed = match model.get(&name) {
                            None => true,
                            Some(&(inc, up, heard)) => {
                                (i > inc && (!up || now.duration_since(heard) >= live))
                                    || (i == inc && up)
                            }
                        };
                        prop_assert_eq!(m.join(now, req(&name, Incarnation::new(i)), Role::Worker).is_ok(), allowed);
                        if allowed {
                            model.insert(name, (i, true, now));
                        }
                    }
                    Op::Heartbeat(n, i) => {
                        let name = format!("n{n}");
                        let out = m.heartbeat(now, &name, Incarnation::new(i), 0);
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
                        prop_assert_eq!(m.leave(now, &name, Incarnation::new(i)), expect);
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
                    prop_assert_eq!(m.get(name).unwrap().incarnation, Incarnation::new(e.0));
                }
                // The changes since any earlier version, applied to the
                // table of that version, give the table of now.
                for (version, old) in &snapshots {
                    let mut table: BTreeMap<MemberName, MemberView> =
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
