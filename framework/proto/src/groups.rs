//! The head's placement groups: what each node has reserved, and the
//! lifecycle of every group, from creation to removal.
//!
//! ```text
//!           create                       every prepare ok
//!  ──────► Pending ── placed ──► Preparing ───────────► Committing ── every commit ok ──► Ready
//!            ▲  │ timeout          │ a prepare refused      │ a commit failed              │
//!            │  ▼                  │ or a node lost:        │ (its bundles are             │
//!            │ Failed              │ rollback (release)     │  placed again)               │
//!            └─────────────────────┴────────────────────────┘                              │
//!            └────────────── a node holding bundles is lost: those are placed again ◄──────┘
//!  remove (any state): every bundle released; the owner gone: removed
//! ```
//!
//! Reservation is all-or-nothing: bundles are prepared on every node of a
//! placement (each node's [`Ledger`](crate::ledger::Ledger) refuses what
//! does not fit), committed only when every node said yes, and released on
//! every node otherwise. A group that cannot be placed waits, pending,
//! until resources appear or its timeout passes, then fails with the
//! solver's reason (which resource is short on which nodes). When a node
//! holding bundles is lost, only those bundles are placed again, under the
//! same strategy (STRICT_SPREAD avoids the nodes the others hold, STRICT_PACK
//! stays on the node of the others), with no timeout: the group is
//! `Rescheduling` until then.
//!
//! The head keeps each group on disk ([`StoredGroup`]: its spec, owner,
//! deadline and the placement it last had ready) and takes them back when
//! it restarts ([`Groups::restore`]): a pending group stays pending under
//! what is left of its timeout, a group that was ready waits for its
//! nodes to report its bundles, as below, before placing any again. A
//! group taken back, from the store or a report, whose owner is not seen
//! up within the confirmation grace is removed and its bundles released:
//! nobody is left to use or remove it.
//!
//! A node joining reports what it holds ([`Held`]): a head that restarted
//! rebuilds its groups from these reports, and a node that was taken for
//! lost gets its bundles back if they were not placed elsewhere meanwhile
//! (otherwise it is told to release them). A bundle counts against its node
//! once, whoever reports it: a rebuilt group's bundles not reported within
//! the confirmation grace are placed again.
//!
//! The machine sends nothing itself: it returns [`Action`]s (ledger
//! operations for nodes, groups whose view changed) and is told each
//! operation's reply.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rkyv::{Archive, Deserialize, Serialize};

use crate::ids::MemberName;
use crate::incarnation::{Incarnation, MemberRef};
use crate::ledger::{GroupRecord, Held, LedgerOp, LedgerReply};
use crate::membership::{MemberState, MemberView};
use crate::placement::{self, Candidate, Resources, Strategy};

/// A tolerance for fractional amounts.
const EPS: f64 = 1e-9;

/// Where a group is in its lifecycle, as its users see it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// Waiting for resources (never placed yet).
    Pending,
    /// Being reserved on its nodes.
    Reserving,
    /// Every bundle is reserved.
    Ready,
    /// Some bundles lost their node and wait to be placed again.
    Rescheduling,
    /// It could not be placed within its timeout.
    Failed,
}

impl GroupState {
    /// Its name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Reserving => "reserving",
            Self::Ready => "ready",
            Self::Rescheduling => "rescheduling",
            Self::Failed => "failed",
        }
    }
}

pub use crate::ids::GroupId;

/// A group as its users see it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GroupView {
    /// Its id.
    pub id: GroupId,
    /// Its state.
    pub state: GroupState,
    /// Grows each time a bundle is placed anew.
    pub revision: u64,
    /// Its strategy (`pack`, …).
    pub strategy: String,
    /// What each bundle holds.
    pub bundles: Vec<Resources>,
    /// The node of each bundle (empty while it has none).
    pub nodes: Vec<MemberName>,
    /// The node that created it, if it dies with it.
    pub owner: Option<MemberName>,
    /// Why it is not ready (the solver's or a node's reason), if it is not.
    pub why: Option<String>,
}

/// A group as the head keeps it on disk, to take it back after a
/// restart ([`Groups::to_store`], [`Groups::restore`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StoredGroup {
    /// Its id.
    pub id: GroupId,
    /// What was asked.
    pub spec: GroupSpec,
    /// The member that owns it and that member's incarnation (`None`:
    /// detached).
    pub owner: Option<MemberRef>,
    /// Whether it was ever ready (then no timeout applies to it).
    pub was_ready: bool,
    /// The node of each bundle when it was last ready (empty strings
    /// where a bundle had none).
    pub nodes: Vec<MemberName>,
    /// The revision of that placement.
    pub revision: u64,
    /// When it fails if it is still pending, in milliseconds since the
    /// Unix epoch (a wall-clock time, so it holds across restarts).
    pub deadline_unix_ms: u64,
}

/// What a node has and has reserved, as the head accounts it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NodeAccount {
    /// The node.
    pub name: MemberName,
    /// What it offers.
    pub capacity: Resources,
    /// What placement groups hold of it.
    pub reserved: Resources,
}

impl NodeAccount {
    /// Its capacity less what is reserved.
    pub fn available(&self) -> Resources {
        let mut left = self.capacity.clone();
        for (k, v) in &self.reserved {
            *left.entry(k.clone()).or_insert(0.0) -= v;
        }
        left
    }
}

/// What a user asks for.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GroupSpec {
    /// What each bundle needs.
    pub bundles: Vec<Resources>,
    /// The strategy (`pack`, `spread`, `strict-pack`, `strict-spread`).
    pub strategy: String,
    /// Labels a node must have.
    pub selector: BTreeMap<String, String>,
    /// How long it may stay pending before it fails, in milliseconds.
    pub timeout_ms: u64,
    /// Whether it outlives the node that created it.
    pub detached: bool,
}

/// A bundle from `(resource, amount)` pairs.
pub fn bundle(pairs: &[(&str, f64)]) -> Resources {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

impl GroupSpec {
    /// A group of `bundles` under `strategy`, failing if still pending
    /// after 30 s, owned by its creator.
    pub fn new(strategy: Strategy, bundles: Vec<Resources>) -> Self {
        Self {
            bundles,
            strategy: strategy.as_str().to_owned(),
            selector: BTreeMap::new(),
            timeout_ms: 30_000,
            detached: false,
        }
    }

    /// Fails if still pending after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Only on nodes with the label `key = value`.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.selector.insert(key.into(), value.into());
        self
    }

    /// Outlives the node that created it (removed only when asked).
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }
}

/// Why a group cannot be created.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BadSpec {
    /// No bundle.
    #[error("a placement group needs at least one bundle")]
    Empty,
    /// An unknown strategy.
    #[error("{0}")]
    Strategy(String),
    /// A negative or non-finite amount.
    #[error("bundle {bundle}: {resource}={amount} is not a finite amount >= 0")]
    Amount {
        /// The bundle.
        bundle: usize,
        /// The resource.
        resource: String,
        /// The amount.
        amount: f64,
    },
}

/// The most bundles a group may grow to.
pub const MAX_BUNDLES: usize = 4096;

/// Why a group did not grow ([`Groups::grow`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrowRefused {
    /// No such group.
    #[error("no such placement group")]
    Unknown,
    /// The group is being placed (or failed): it grows only when ready.
    #[error("the group is {}, not ready; it grows only when ready", .0.as_str())]
    NotReady(GroupState),
    /// No node has room for the bundle now under the group's strategy.
    #[error("no room for one more bundle: {0}")]
    NoRoom(String),
    /// The bundle's amounts cannot be reserved.
    #[error(transparent)]
    Bad(BadSpec),
    /// The group holds the most bundles a group may.
    #[error("a placement group holds at most {0} bundles")]
    TooMany(usize),
}

/// Something for the shell to do.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // made and consumed at once, never stored
pub enum Action {
    /// Send `op` to the ledger of `node`, then pass its reply (or the
    /// failure to deliver it) to [`Groups::replied`] with `tag`.
    Send {
        /// The node.
        node: MemberName,
        /// The operation.
        op: LedgerOp,
        /// What the reply answers.
        tag: Tag,
    },
    /// The view of this group changed (wake whoever waits on it).
    Changed(GroupId),
    /// The group was removed (its owner is gone, or it was asked to).
    Removed(GroupId),
    /// `node` reported holding `bundles` of `group` that no record of the
    /// head gives it (unassigned, or no such bundle): refused, released
    /// on the node, and counted.
    Refused {
        /// The node that reported them.
        node: MemberName,
        /// The group.
        group: GroupId,
        /// The bundles it claimed.
        bundles: Vec<u32>,
    },
}

/// What a ledger reply answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tag {
    /// A prepare of this attempt of the group.
    Prepare(GroupId, u64),
    /// A commit of this attempt of the group.
    Commit(GroupId, u64),
    /// A release: its reply changes nothing.
    Release,
}

/// Tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupsConfig {
    /// How long a rebuilt group waits for its bundles' nodes to report
    /// before placing the missing ones again.
    pub confirm_grace: Duration,
    /// How long a group waits to try again after a node refused a prepare.
    pub retry_after: Duration,
}

impl Default for GroupsConfig {
    fn default() -> Self {
        Self {
            confirm_grace: Duration::from_secs(10),
            retry_after: Duration::from_millis(50),
        }
    }
}

#[derive(Debug, Clone)]
enum Phase {
    /// Waiting to place the bundles without a node.
    Waiting,
    /// Prepares sent; `waiting` for their replies.
    Preparing {
        attempt: u64,
        plan: Vec<(u32, MemberName)>,
        waiting: BTreeSet<MemberName>,
        refused: Option<String>,
    },
    /// Commits sent.
    Committing {
        attempt: u64,
        plan: Vec<(u32, MemberName)>,
        waiting: BTreeSet<MemberName>,
        failed: BTreeSet<MemberName>,
    },
    /// Every bundle has a node.
    Ready,
    /// Timed out.
    Failed,
}

#[derive(Debug, Clone)]
struct Entry {
    spec: GroupSpec,
    strategy: Strategy,
    owner: Option<MemberRef>,
    revision: u64,
    /// The confirmed node of each bundle.
    nodes: Vec<Option<MemberName>>,
    /// Where a rebuilt group's unconfirmed bundles were, and until when
    /// their nodes may report them.
    unconfirmed: BTreeMap<u32, MemberName>,
    /// The node each bundle was taken from when that node was lost: the
    /// head's record of who may report holding it still (a node that was
    /// only cut off).
    lost_from: BTreeMap<u32, MemberName>,
    confirm_by: Option<Instant>,
    phase: Phase,
    /// Whether it was ever ready (no timeout applies then).
    was_ready: bool,
    deadline: Instant,
    not_before: Option<Instant>,
    why: Option<String>,
    seq: u64,
    /// A group taken back after a restart: removed at this time unless
    /// its owner has been seen up (with the incarnation that owns it).
    owner_by: Option<Instant>,
    /// Members none of its bundles goes to from now on: its owner found
    /// them unfit (see [`Groups::grow`]).
    avoid: BTreeSet<MemberName>,
}

impl Entry {
    fn in_flight(&self) -> Option<&[(u32, MemberName)]> {
        match &self.phase {
            Phase::Preparing { plan, .. } | Phase::Committing { plan, .. } => Some(plan),
            _ => None,
        }
    }

    fn state(&self) -> GroupState {
        match &self.phase {
            Phase::Ready => GroupState::Ready,
            Phase::Failed => GroupState::Failed,
            _ if self.was_ready => GroupState::Rescheduling,
            Phase::Waiting => GroupState::Pending,
            Phase::Preparing { .. } | Phase::Committing { .. } => GroupState::Reserving,
        }
    }
}

#[derive(Debug, Clone)]
struct NodeInfo {
    incarnation: Incarnation,
    capacity: Resources,
    labels: BTreeMap<String, String>,
}

/// The head's placement groups and every node's reservations.
#[derive(Debug, Clone)]
pub struct Groups {
    config: GroupsConfig,
    /// A prefix that makes ids unique across head restarts.
    prefix: String,
    next_id: u64,
    next_attempt: u64,
    groups: BTreeMap<GroupId, Entry>,
    /// Up nodes.
    nodes: BTreeMap<MemberName, NodeInfo>,
    /// What each node has reserved (confirmed and in flight).
    reserved: BTreeMap<MemberName, Resources>,
    /// Whether resources appeared since the last placement pass.
    dirty: bool,
    /// Groups created since the last pass.
    fresh: Vec<GroupId>,
    /// Removed groups of earlier heads (rebuilt here, then removed), so
    /// that a late report does not bring them back.
    removed: BTreeSet<GroupId>,
}

fn add(into: &mut Resources, r: &Resources) {
    for (k, v) in r {
        *into.entry(k.clone()).or_insert(0.0) += v;
    }
}

fn sub(from: &mut Resources, r: &Resources) {
    for (k, v) in r {
        if let Some(have) = from.get_mut(k) {
            *have -= v;
            if have.abs() < EPS {
                from.remove(k);
            }
        }
    }
}

/// Checks a spec; its strategy.
pub fn check_spec(spec: &GroupSpec) -> Result<Strategy, BadSpec> {
    if spec.bundles.is_empty() {
        return Err(BadSpec::Empty);
    }
    for (bundle, b) in spec.bundles.iter().enumerate() {
        if let Some((resource, amount)) = b.iter().find(|(_, n)| !n.is_finite() || **n < 0.0) {
            return Err(BadSpec::Amount {
                bundle,
                resource: resource.clone(),
                amount: *amount,
            });
        }
    }
    spec.strategy.parse().map_err(BadSpec::Strategy)
}

impl Groups {
    /// No groups; ids start with `prefix` (unique per head incarnation).
    pub fn new(prefix: impl Into<String>, config: GroupsConfig) -> Self {
        Self {
            config,
            prefix: prefix.into(),
            next_id: 1,
            next_attempt: 1,
            groups: BTreeMap::new(),
            nodes: BTreeMap::new(),
            reserved: BTreeMap::new(),
            dirty: false,
            fresh: Vec::new(),
            removed: BTreeSet::new(),
        }
    }

    /// Creates a group owned by `owner` (a node and its incarnation);
    /// returns its id. It is placed by the next [`Groups::step`].
    pub fn create(
        &mut self,
        now: Instant,
        spec: GroupSpec,
        owner: Option<MemberRef>,
    ) -> Result<GroupId, BadSpec> {
        let strategy = check_spec(&spec)?;
        let id = GroupId::new(format!("{}-{}", self.prefix, self.next_id));
        self.next_id += 1;
        let owner = if spec.detached { None } else { owner };
        let entry = Entry {
            deadline: now + Duration::from_millis(spec.timeout_ms),
            nodes: vec![None; spec.bundles.len()],
            spec,
            strategy,
            owner,
            revision: 0,
            unconfirmed: BTreeMap::new(),
            lost_from: BTreeMap::new(),
            confirm_by: None,
            phase: Phase::Waiting,
            was_ready: false,
            not_before: None,
            why: None,
            seq: self.next_id,
            owner_by: None,
            avoid: BTreeSet::new(),
        };
        self.groups.insert(id.clone(), entry);
        self.fresh.push(id.clone());
        Ok(id)
    }

    /// Takes back a group the head kept on disk before it restarted: a
    /// group that was ready waits for its nodes to report its bundles
    /// (those not reported within the confirmation grace are placed
    /// again); one that never was is pending for `remaining` of its
    /// timeout. Its owner must be seen up within the grace, or it is
    /// removed. A group already known (reported first) is left as it is.
    pub fn restore(
        &mut self,
        now: Instant,
        stored: StoredGroup,
        remaining: Duration,
    ) -> Result<(), BadSpec> {
        let strategy = check_spec(&stored.spec)?;
        if self.groups.contains_key(&stored.id) || self.removed.contains(&stored.id) {
            return Ok(());
        }
        let bundles = stored.spec.bundles.len();
        let unconfirmed: BTreeMap<u32, MemberName> = if stored.was_ready {
            stored
                .nodes
                .iter()
                .take(bundles)
                .enumerate()
                .filter(|(_, n)| !n.is_empty())
                .map(|(b, n)| (b as u32, n.clone()))
                .collect()
        } else {
            BTreeMap::new()
        };
        self.next_id += 1;
        let entry = Entry {
            nodes: vec![None; bundles],
            strategy,
            owner_by: self.owner_grace(now, stored.owner.as_ref()),
            owner: stored.owner,
            revision: stored.revision,
            unconfirmed,
            lost_from: BTreeMap::new(),
            confirm_by: stored.was_ready.then_some(now + self.config.confirm_grace),
            phase: Phase::Waiting,
            was_ready: stored.was_ready,
            deadline: now + remaining,
            not_before: None,
            why: Some(if stored.was_ready {
                "restored: waiting for its nodes to report".into()
            } else {
                "restored: waiting to be placed".into()
            }),
            seq: self.next_id,
            spec: stored.spec,
            avoid: BTreeSet::new(),
        };
        self.groups.insert(stored.id.clone(), entry);
        self.fresh.push(stored.id.clone());
        Ok(())
    }

    /// The group `id` as the head keeps it on disk, with the wall-clock
    /// time it fails at if still pending.
    pub fn to_store(&self, id: &GroupId, deadline_unix_ms: u64) -> Option<StoredGroup> {
        let e = self.groups.get(id)?;
        Some(StoredGroup {
            id: id.clone(),
            spec: e.spec.clone(),
            owner: e.owner.clone(),
            was_ready: e.was_ready,
            nodes: e
                .nodes
                .iter()
                .map(|n| n.clone().unwrap_or_default())
                .collect(),
            revision: e.revision,
            deadline_unix_ms,
        })
    }

    /// Whether `owner` is up with the incarnation that owns.
    fn owner_up(&self, owner: &MemberRef) -> bool {
        self.nodes
            .get(&owner.name)
            .is_some_and(|n| n.incarnation == owner.incarnation)
    }

    /// Until when a group taken back must see `owner` up (none for a
    /// detached group, or an owner up already).
    fn owner_grace(&self, now: Instant, owner: Option<&MemberRef>) -> Option<Instant> {
        owner
            .filter(|o| !self.owner_up(o))
            .map(|_| now + self.config.confirm_grace)
    }

    /// The group `id` as its users see it.
    pub fn view(&self, id: &GroupId) -> Option<GroupView> {
        let e = self.groups.get(id)?;
        let mut nodes: Vec<MemberName> = e
            .nodes
            .iter()
            .map(|n| n.clone().unwrap_or_default())
            .collect();
        if let Some(plan) = e.in_flight() {
            for (b, n) in plan {
                nodes[*b as usize] = n.clone();
            }
        }
        Some(GroupView {
            id: id.clone(),
            state: e.state(),
            revision: e.revision,
            strategy: e.strategy.as_str().to_owned(),
            bundles: e.spec.bundles.clone(),
            nodes,
            owner: e.owner.as_ref().map(|o| o.name.clone()),
            why: if matches!(e.phase, Phase::Ready) {
                None
            } else {
                e.why.clone()
            },
        })
    }

    /// Every group, in creation order.
    pub fn views(&self) -> Vec<GroupView> {
        let mut ids: Vec<(&u64, &GroupId)> =
            self.groups.iter().map(|(id, e)| (&e.seq, id)).collect();
        ids.sort();
        ids.into_iter()
            .filter_map(|(_, id)| self.view(id))
            .collect()
    }

    /// Every up node's capacity and reservations, in name order.
    pub fn accounts(&self) -> Vec<NodeAccount> {
        self.nodes
            .iter()
            .map(|(name, info)| NodeAccount {
                name: name.clone(),
                capacity: info.capacity.clone(),
                reserved: self.reserved(name),
            })
            .collect()
    }

    /// What `node` has reserved.
    pub fn reserved(&self, node: &str) -> Resources {
        self.reserved.get(node).cloned().unwrap_or_default()
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether there is no group.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Whether `id` was made by this head (not rebuilt from a report).
    fn is_ours(&self, id: &GroupId) -> bool {
        id.strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.starts_with('-'))
    }

    fn reserve(&mut self, node: &str, r: &Resources) {
        add(self.reserved.entry(MemberName::from(node)).or_default(), r);
    }

    fn unreserve(&mut self, node: &str, r: &Resources) {
        if let Some(have) = self.reserved.get_mut(node) {
            sub(have, r);
            if have.is_empty() {
                self.reserved.remove(node);
            }
        }
        self.dirty = true;
    }

    /// Removes the group `id`, releasing every bundle; false if unknown.
    pub fn remove(&mut self, id: &GroupId, out: &mut Vec<Action>) -> bool {
        let Some(e) = self.groups.remove(id) else {
            return false;
        };
        if !self.is_ours(id) {
            self.removed.insert(id.clone());
        }
        let held = e
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(b, n)| Some((b as u32, n.as_ref()?)))
            .chain(e.in_flight().into_iter().flatten().map(|(b, n)| (*b, n)));
        let held = by_node(held);
        self.release(id, &e.spec.bundles, held, out);
        out.push(Action::Removed(id.to_owned()));
        true
    }

    /// Adds `bundle` to the ready group `id` when a node has room for it
    /// now, under the group's strategy and selector, beside the bundles
    /// placed (which stay where they are): all or nothing, one bundle at
    /// a time. Returns the new bundle's index; the next
    /// [`Groups::step`] reserves it on its node as it does a bundle placed
    /// again, and the group is ready again at a new revision.
    ///
    /// The members in `avoid` (at most [`MAX_BUNDLES`] are taken) get
    /// none of the group's bundles from now on, this one or any placed
    /// again: its owner found them unfit (an actor of another model
    /// there), so a bundle is not offered there again and again.
    pub fn grow(
        &mut self,
        id: &GroupId,
        bundle: Resources,
        avoid: &[MemberName],
    ) -> Result<u32, GrowRefused> {
        let Some(e) = self.groups.get_mut(id) else {
            return Err(GrowRefused::Unknown);
        };
        e.avoid.extend(avoid.iter().take(MAX_BUNDLES).cloned());
        if !matches!(e.phase, Phase::Ready) {
            return Err(GrowRefused::NotReady(e.state()));
        }
        if let Some((resource, amount)) = bundle.iter().find(|(_, n)| !n.is_finite() || **n < 0.0) {
            return Err(GrowRefused::Bad(BadSpec::Amount {
                bundle: e.nodes.len(),
                resource: resource.clone(),
                amount: *amount,
            }));
        }
        if e.nodes.len() >= MAX_BUNDLES {
            return Err(GrowRefused::TooMany(MAX_BUNDLES));
        }
        place_more(&self.nodes, &self.reserved, e, vec![bundle.clone()])
            .map_err(|why| GrowRefused::NoRoom(why.to_string()))?;
        let Some(e) = self.groups.get_mut(id) else {
            return Err(GrowRefused::Unknown);
        };
        e.spec.bundles.push(bundle);
        e.nodes.push(None);
        e.phase = Phase::Waiting;
        e.not_before = None;
        self.fresh.push(id.clone());
        Ok(e.nodes.len() as u32 - 1)
    }

    /// Takes the last bundle, `bundle`, off the group `id` (never its
    /// only one), releasing its reservation; the group is ready at a new
    /// revision. Only the last bundle goes, so every other keeps its
    /// index. Returns whether it went: not when it is not the last, is the
    /// only one, or is being placed now.
    pub fn shrink(&mut self, id: &GroupId, bundle: u32, out: &mut Vec<Action>) -> bool {
        let Some(e) = self.groups.get_mut(id) else {
            return false;
        };
        let last = e.nodes.len() as u32 - 1;
        if bundle != last || last == 0 || e.in_flight().is_some() {
            return false;
        }
        let bundles = e.spec.bundles.clone();
        let held = e.nodes.pop().flatten();
        e.spec.bundles.pop();
        e.lost_from.remove(&bundle);
        e.unconfirmed.remove(&bundle);
        e.revision += 1;
        if matches!(e.phase, Phase::Waiting) && e.nodes.iter().all(Option::is_some) {
            e.phase = Phase::Ready;
            e.was_ready = true;
        }
        if let Some(node) = held {
            self.release(id, &bundles, [(node, vec![bundle])].into(), out);
        }
        out.push(Action::Changed(id.clone()));
        true
    }

    /// Gives back `held` (bundles of group `id` by node): unreserved here,
    /// released on every node still up (one that is not releases them when
    /// it reports them on rejoining).
    fn release(
        &mut self,
        id: &GroupId,
        bundles: &[Resources],
        held: BTreeMap<MemberName, Vec<u32>>,
        out: &mut Vec<Action>,
    ) {
        for (node, bs) in held {
            for b in &bs {
                self.unreserve(&node, &bundles[*b as usize]);
            }
            if self.nodes.contains_key(&node) {
                out.push(Action::Send {
                    node,
                    op: LedgerOp::Release {
                        group: id.clone(),
                        bundles: bs,
                    },
                    tag: Tag::Release,
                });
            }
        }
    }

    /// The member table changed: nodes up take part, nodes down, left,
    /// draining or restarted lose their bundles (a draining node's are
    /// placed again at once, as a lost node's), groups of owners gone
    /// (down, left or restarted; a draining owner keeps its groups) are
    /// removed.
    /// Members absent from the table are left as they are.
    pub fn set_members(&mut self, members: &[MemberView], out: &mut Vec<Action>) {
        for m in members {
            let known = self.nodes.get(&m.name).map(|n| n.incarnation);
            let up = m.state == MemberState::Up;
            if known.is_some_and(|i| i < m.incarnation || (i == m.incarnation && !up)) {
                self.node_lost(&m.name, out);
            }
            if up {
                let info = NodeInfo {
                    incarnation: m.incarnation,
                    capacity: m.resources.amounts(),
                    labels: m.resources.labels.clone(),
                };
                let changed = self.nodes.get(&m.name).is_none_or(|n| {
                    n.incarnation != info.incarnation
                        || n.capacity != info.capacity
                        || n.labels != info.labels
                });
                if changed {
                    self.nodes.insert(m.name.clone(), info);
                    self.membership_changed();
                }
            }
        }
        let seen: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, e)| {
                e.owner_by.is_some() && e.owner.as_ref().is_some_and(|o| self.owner_up(o))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in seen {
            if let Some(e) = self.groups.get_mut(&id) {
                e.owner_by = None;
            }
        }
        let gone: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, e)| {
                e.owner.as_ref().is_some_and(|o| {
                    members.iter().any(|m| {
                        m.name == o.name
                            && (m.incarnation > o.incarnation
                                || (m.incarnation == o.incarnation && !m.state.is_live()))
                    })
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.remove(&id, out);
        }
    }

    /// Nodes came or went: every waiting group is tried again at once.
    fn membership_changed(&mut self) {
        self.dirty = true;
        for e in self.groups.values_mut() {
            e.not_before = None;
        }
    }

    /// `node` is lost (down, or restarted with an empty ledger): its
    /// bundles are placed again.
    fn node_lost(&mut self, node: &str, out: &mut Vec<Action>) {
        self.nodes.remove(node);
        self.reserved.remove(node);
        self.membership_changed();
        for (id, e) in self.groups.iter_mut() {
            let mut touched = false;
            for (b, n) in e.nodes.iter_mut().enumerate() {
                if n.as_deref() == Some(node) {
                    *n = None;
                    e.lost_from.insert(b as u32, MemberName::from(node));
                    touched = true;
                }
            }
            e.unconfirmed.retain(|_, n| n != node);
            match &mut e.phase {
                Phase::Preparing {
                    waiting, refused, ..
                } if waiting.contains(node) => {
                    waiting.remove(node);
                    refused.get_or_insert_with(|| format!("node {node} was lost"));
                }
                Phase::Committing {
                    waiting, failed, ..
                } if waiting.contains(node) => {
                    waiting.remove(node);
                    failed.insert(MemberName::from(node));
                }
                Phase::Preparing { plan, .. } | Phase::Committing { plan, .. }
                    if plan.iter().any(|(_, n)| n == node) =>
                {
                    touched = true;
                }
                Phase::Ready if touched => e.phase = Phase::Waiting,
                _ => {}
            }
            if touched {
                out.push(Action::Changed(id.clone()));
            }
        }
        // Phases whose last awaited reply was the lost node's.
        let ids: Vec<GroupId> = self.groups.keys().cloned().collect();
        for id in ids {
            self.settle(&id, None, out);
        }
    }

    /// What a node reports on joining (it holds these bundles): a rebuilt
    /// head adopts them, a head that placed them elsewhere releases them.
    pub fn report(
        &mut self,
        now: Instant,
        node: &str,
        incarnation: Incarnation,
        held: Vec<Held>,
        out: &mut Vec<Action>,
    ) {
        if self
            .nodes
            .get(node)
            .is_some_and(|n| n.incarnation < incarnation)
        {
            self.node_lost(node, out);
        }
        for h in held {
            let id = h.record.id.clone();
            if !self.groups.contains_key(&id) && (self.is_ours(&id) || self.removed.contains(&id)) {
                // Removed while the node could not be told.
                out.push(Action::Send {
                    node: MemberName::from(node),
                    op: LedgerOp::Release {
                        group: id,
                        bundles: Vec::new(),
                    },
                    tag: Tag::Release,
                });
                continue;
            }
            if !self.groups.contains_key(&id) {
                let Ok(strategy) = h.record.strategy.parse::<Strategy>() else {
                    continue;
                };
                if h.record.bundles.is_empty() {
                    continue;
                }
                let unconfirmed = h
                    .record
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| !n.is_empty())
                    .map(|(b, n)| (b as u32, n.clone()))
                    .collect();
                self.next_id += 1;
                self.groups.insert(
                    id.clone(),
                    Entry {
                        spec: GroupSpec {
                            bundles: h.record.bundles.clone(),
                            strategy: h.record.strategy.clone(),
                            selector: h.record.selector.clone(),
                            timeout_ms: 0,
                            detached: h.record.owner.is_none(),
                        },
                        strategy,
                        owner: h.record.owner.clone(),
                        revision: h.record.revision,
                        nodes: vec![None; h.record.bundles.len()],
                        unconfirmed,
                        lost_from: BTreeMap::new(),
                        confirm_by: Some(now + self.config.confirm_grace),
                        phase: Phase::Waiting,
                        was_ready: true,
                        deadline: now,
                        not_before: None,
                        why: Some("rebuilt: waiting for its nodes to report".into()),
                        seq: self.next_id,
                        owner_by: self.owner_grace(now, h.record.owner.as_ref()),
                        avoid: BTreeSet::new(),
                    },
                );
            }
            let Some(e) = self.groups.get_mut(&id) else {
                continue;
            };
            if e.confirm_by.is_some() && h.record.revision > e.revision {
                e.revision = h.record.revision;
                for (b, n) in h.record.nodes.iter().enumerate() {
                    if e.nodes.get(b).is_some_and(Option::is_none) && !n.is_empty() {
                        e.unconfirmed.insert(b as u32, n.clone());
                    }
                }
            }
            let in_plan: BTreeSet<u32> = e
                .in_flight()
                .map(|p| p.iter().map(|(b, _)| *b).collect())
                .unwrap_or_default();
            let mut release = Vec::new();
            let mut adopt = Vec::new();
            let mut claimed = Vec::new();
            for b in h.bundles {
                let i = b as usize;
                match e.nodes.get(i) {
                    Some(Some(n)) if n == node => {}
                    // Unassigned: adopted only where the head's own record
                    // (its store, a sealed record, or the node it was taken
                    // from when that node was lost) puts it on this node.
                    Some(None)
                        if !in_plan.contains(&b)
                            && (e.unconfirmed.get(&b).is_some_and(|n| n == node)
                                || e.lost_from.get(&b).is_some_and(|n| n == node)) =>
                    {
                        adopt.push(b);
                    }
                    Some(None) if in_plan.contains(&b) => release.push(b),
                    // Held elsewhere now: a copy this node kept.
                    Some(Some(_)) => release.push(b),
                    // No record gives it to this node, or no such bundle.
                    Some(None) | None => {
                        claimed.push(b);
                        release.push(b);
                    }
                }
            }
            if !claimed.is_empty() {
                out.push(Action::Refused {
                    node: MemberName::from(node),
                    group: id.clone(),
                    bundles: claimed,
                });
            }
            for b in &adopt {
                e.nodes[*b as usize] = Some(MemberName::from(node));
                e.unconfirmed.remove(b);
                e.lost_from.remove(b);
            }
            let bundles: Vec<Resources> = adopt
                .iter()
                .map(|b| e.spec.bundles[*b as usize].clone())
                .collect();
            if !adopt.is_empty() {
                if e.nodes.iter().all(Option::is_some) {
                    e.phase = Phase::Ready;
                    e.confirm_by = None;
                    e.unconfirmed.clear();
                }
                out.push(Action::Changed(id.clone()));
            }
            for r in &bundles {
                self.reserve(node, r);
            }
            if !release.is_empty() {
                out.push(Action::Send {
                    node: MemberName::from(node),
                    op: LedgerOp::Release {
                        group: id.clone(),
                        bundles: release,
                    },
                    tag: Tag::Release,
                });
            }
        }
    }

    /// A node's reply to an operation sent with `tag` (`Err`: it could
    /// not be delivered or answered).
    pub fn replied(
        &mut self,
        now: Instant,
        node: &str,
        tag: Tag,
        reply: Result<LedgerReply, String>,
        out: &mut Vec<Action>,
    ) {
        let (id, want) = match &tag {
            Tag::Release => return,
            Tag::Prepare(id, a) | Tag::Commit(id, a) => (id.clone(), *a),
        };
        let Some(e) = self.groups.get_mut(&id) else {
            return;
        };
        match (&mut e.phase, &tag) {
            (
                Phase::Preparing {
                    attempt,
                    waiting,
                    refused,
                    ..
                },
                Tag::Prepare(..),
            ) if *attempt == want && waiting.contains(node) => {
                waiting.remove(node);
                match reply {
                    Ok(LedgerReply::Done) => {}
                    Ok(other) => {
                        refused.get_or_insert_with(|| format!("node {node} refused: {other}"));
                    }
                    Err(why) => {
                        refused.get_or_insert_with(|| format!("node {node}: {why}"));
                    }
                }
            }
            (
                Phase::Committing {
                    attempt,
                    waiting,
                    failed,
                    ..
                },
                Tag::Commit(..),
            ) if *attempt == want && waiting.contains(node) => {
                waiting.remove(node);
                if reply != Ok(LedgerReply::Done) {
                    failed.insert(MemberName::from(node));
                }
            }
            _ => return,
        }
        self.settle(&id, Some(now), out);
    }

    /// Moves a group on once every reply of its phase is in.
    fn settle(&mut self, id: &GroupId, now: Option<Instant>, out: &mut Vec<Action>) {
        let Some(e) = self.groups.get_mut(id) else {
            return;
        };
        match &mut e.phase {
            Phase::Preparing {
                attempt,
                plan,
                waiting,
                refused,
            } if waiting.is_empty() => {
                let (attempt, plan) = (*attempt, std::mem::take(plan));
                if let Some(why) = refused.take() {
                    // Roll back on every node of the plan.
                    e.phase = Phase::Waiting;
                    e.why = Some(why);
                    e.not_before = now.map(|t| t + self.config.retry_after);
                    let bundles = e.spec.bundles.clone();
                    self.release(
                        id,
                        &bundles,
                        by_node(plan.iter().map(|(b, n)| (*b, n))),
                        out,
                    );
                    out.push(Action::Changed(id.clone()));
                } else {
                    let nodes: BTreeSet<MemberName> = plan.iter().map(|(_, n)| n.clone()).collect();
                    for node in &nodes {
                        out.push(Action::Send {
                            node: node.clone(),
                            op: LedgerOp::Commit {
                                group: id.clone(),
                                revision: e.revision,
                            },
                            tag: Tag::Commit(id.clone(), attempt),
                        });
                    }
                    e.phase = Phase::Committing {
                        attempt,
                        plan,
                        waiting: nodes,
                        failed: BTreeSet::new(),
                    };
                }
            }
            Phase::Committing {
                plan,
                waiting,
                failed,
                ..
            } if waiting.is_empty() => {
                let (plan, failed) = (std::mem::take(plan), std::mem::take(failed));
                let bundles = e.spec.bundles.clone();
                let mut lost = Vec::new();
                for (b, n) in plan {
                    if failed.contains(&n) {
                        lost.push((b, n));
                    } else {
                        e.nodes[b as usize] = Some(n);
                    }
                }
                if e.nodes.iter().all(Option::is_some) {
                    e.phase = Phase::Ready;
                    e.was_ready = true;
                    e.why = None;
                } else if failed.is_empty() {
                    // Some bundles placed again, others still wait for room.
                    e.phase = Phase::Waiting;
                    self.fresh.push(id.clone());
                } else {
                    e.phase = Phase::Waiting;
                    e.why = Some(format!(
                        "a commit failed on {}",
                        failed.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
                for (b, n) in lost {
                    self.unreserve(&n, &bundles[b as usize]);
                }
                out.push(Action::Changed(id.clone()));
            }
            _ => {}
        }
    }

    /// Places what can be placed, fails pending groups past their
    /// timeout, and places again the unconfirmed bundles of rebuilt
    /// groups past their grace.
    pub fn step(&mut self, now: Instant, out: &mut Vec<Action>) {
        let orphans: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, e)| e.owner_by.is_some_and(|t| now >= t))
            .map(|(id, _)| id.clone())
            .collect();
        for id in orphans {
            self.remove(&id, out);
        }
        let ids: Vec<GroupId> = if self.dirty || self.groups.values().any(|e| due(e, now)) {
            let mut all: Vec<(u64, GroupId)> = self
                .groups
                .iter()
                .map(|(id, e)| (e.seq, id.clone()))
                .collect();
            all.sort();
            all.into_iter().map(|(_, id)| id).collect()
        } else {
            std::mem::take(&mut self.fresh)
        };
        self.dirty = false;
        self.fresh.clear();
        for id in ids {
            self.try_place(now, &id, out);
        }
    }

    fn try_place(&mut self, now: Instant, id: &GroupId, out: &mut Vec<Action>) {
        let Some(e) = self.groups.get_mut(id) else {
            return;
        };
        if !matches!(e.phase, Phase::Waiting) {
            return;
        }
        if e.confirm_by.is_some_and(|t| now < t) {
            return;
        }
        if e.confirm_by.take().is_some() {
            e.unconfirmed.clear();
        }
        if e.not_before.is_some_and(|t| now < t) {
            return;
        }
        e.not_before = None;
        let missing: Vec<u32> = (0..e.nodes.len() as u32)
            .filter(|b| e.nodes[*b as usize].is_none())
            .collect();
        if missing.is_empty() {
            e.phase = Phase::Ready;
            e.was_ready = true;
            out.push(Action::Changed(id.clone()));
            return;
        }
        let bundles: Vec<Resources> = missing
            .iter()
            .map(|b| e.spec.bundles[*b as usize].clone())
            .collect();
        let mut missing = missing;
        let mut placed = place_more(&self.nodes, &self.reserved, e, bundles);
        if let Err(why) = &placed
            && e.was_ready
            && missing.len() > 1
        {
            // Bundles placed again (their nodes lost) go one by one: what
            // has room goes now, the rest waits for room, and the group
            // stays rescheduling for them.
            let one = missing.iter().find_map(|b| {
                let bundle = e.spec.bundles[*b as usize].clone();
                place_more(&self.nodes, &self.reserved, e, vec![bundle])
                    .ok()
                    .map(|to| (*b, to))
            });
            if let Some((b, to)) = one {
                e.why = Some(why.to_string());
                missing = vec![b];
                placed = Ok(to);
            }
        }
        match placed {
            Err(why) => {
                let why = why.to_string();
                let changed = e.why.as_deref() != Some(why.as_str());
                e.why = Some(why);
                if !e.was_ready && now >= e.deadline {
                    e.phase = Phase::Failed;
                    out.push(Action::Changed(id.clone()));
                } else if changed {
                    out.push(Action::Changed(id.clone()));
                }
            }
            Ok(to) => {
                let attempt = self.next_attempt;
                self.next_attempt += 1;
                e.revision += 1;
                let plan: Vec<(u32, MemberName)> = missing.into_iter().zip(to).collect();
                let mut nodes: Vec<MemberName> = e
                    .nodes
                    .iter()
                    .map(|n| n.clone().unwrap_or_default())
                    .collect();
                for (b, n) in &plan {
                    nodes[*b as usize] = n.clone();
                }
                let record = GroupRecord {
                    id: id.clone(),
                    revision: e.revision,
                    strategy: e.strategy.as_str().to_owned(),
                    bundles: e.spec.bundles.clone(),
                    nodes,
                    selector: e.spec.selector.clone(),
                    owner: e.owner.clone(),
                    seal: Vec::new(),
                };
                let per = by_node(plan.iter().map(|(b, n)| (*b, n)));
                let bundles = e.spec.bundles.clone();
                e.phase = Phase::Preparing {
                    attempt,
                    plan: plan.clone(),
                    waiting: per.keys().cloned().collect(),
                    refused: None,
                };
                for (b, n) in &plan {
                    self.reserve(n, &bundles[*b as usize]);
                }
                for (node, bs) in per {
                    out.push(Action::Send {
                        node,
                        op: LedgerOp::Prepare {
                            record: record.clone(),
                            bundles: bs,
                        },
                        tag: Tag::Prepare(id.clone(), attempt),
                    });
                }
                out.push(Action::Changed(id.clone()));
            }
        }
    }

    /// When [`Groups::step`] next has something to do on its own (a
    /// timeout, a grace or a retry), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let placing = self
            .groups
            .values()
            .filter(|e| matches!(e.phase, Phase::Waiting))
            .filter_map(|e| {
                [
                    (!e.was_ready).then_some(e.deadline),
                    e.confirm_by,
                    e.not_before,
                ]
                .into_iter()
                .flatten()
                .min()
            });
        let owners = self.groups.values().filter_map(|e| e.owner_by);
        placing.chain(owners).min()
    }
}

/// Where `bundles` more of the group `e` go, on `nodes` less what is
/// `reserved`, beside the bundles it has placed: under its strategy
/// (strict ones never on a node they exclude) and selector; a soft
/// strategy tries first the nodes it favours beside those bundles (SPREAD
/// the nodes holding none of them, PACK those holding some), then any.
fn place_more(
    nodes: &BTreeMap<MemberName, NodeInfo>,
    reserved: &BTreeMap<MemberName, Resources>,
    e: &Entry,
    bundles: Vec<Resources>,
) -> Result<Vec<MemberName>, placement::Infeasible> {
    let kept: BTreeSet<&str> = e.nodes.iter().flatten().map(MemberName::as_str).collect();
    let candidates: Vec<Candidate> = nodes
        .iter()
        .filter(|(name, _)| !e.avoid.contains(*name))
        .filter(|(name, _)| match e.strategy {
            Strategy::StrictSpread => !kept.contains(name.as_str()),
            Strategy::StrictPack => kept.is_empty() || kept.contains(name.as_str()),
            _ => true,
        })
        .map(|(name, info)| {
            let mut available = info.capacity.clone();
            if let Some(r) = reserved.get(name) {
                sub(&mut available, r);
            }
            Candidate {
                name: name.clone(),
                available,
                labels: info.labels.clone(),
            }
        })
        .collect();
    let group = placement::Group {
        bundles,
        strategy: e.strategy,
        selector: e.spec.selector.clone(),
    };
    if candidates.is_empty() {
        return Err(placement::Infeasible::NoMatchingNode(
            e.spec.selector.clone(),
        ));
    }
    let favoured: Vec<Candidate> = match e.strategy {
        Strategy::Spread if !kept.is_empty() => candidates
            .iter()
            .filter(|c| !kept.contains(c.name.as_str()))
            .cloned()
            .collect(),
        Strategy::Pack if !kept.is_empty() => candidates
            .iter()
            .filter(|c| kept.contains(c.name.as_str()))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    if !favoured.is_empty()
        && let Ok(to) = placement::place(&favoured, &group)
    {
        return Ok(to);
    }
    placement::place(&candidates, &group)
}

/// Bundles grouped by their node.
fn by_node<'a>(
    bundles: impl Iterator<Item = (u32, &'a MemberName)>,
) -> BTreeMap<MemberName, Vec<u32>> {
    let mut per: BTreeMap<MemberName, Vec<u32>> = BTreeMap::new();
    for (b, n) in bundles {
        per.entry(n.clone()).or_default().push(b);
    }
    per
}

/// Whether a waiting group has a time-driven step due at `now`.
fn due(e: &Entry, now: Instant) -> bool {
    matches!(e.phase, Phase::Waiting)
        && ((!e.was_ready && now >= e.deadline)
            || e.confirm_by.is_some_and(|t| now >= t)
            || e.not_before.is_some_and(|t| now >= t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::resources::Resources as Offer;
    use proptest::prelude::{ProptestConfig, prop_assert, prop_assert_eq, prop_oneof, proptest};
    use proptest::strategy::Strategy as _;

    fn res(pairs: &[(&str, f64)]) -> Resources {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn member(name: &str, incarnation: Incarnation, cpus: u32, up: bool) -> MemberView {
        MemberView {
            name: name.into(),
            addr: String::new(),
            bulk_addr: String::new(),
            host: String::new(),
            incarnation,
            state: if up {
                MemberState::Up
            } else {
                MemberState::Down
            },
            resources: Offer {
                cpus,
                ..Offer::default()
            },
            actors: 0,
            role: crate::role::Role::Worker,
            drain_within_ms: 0,
        }
    }

    fn spec(strategy: &str, bundles: usize, cpu: f64, timeout_ms: u64) -> GroupSpec {
        GroupSpec {
            bundles: vec![res(&[("cpu", cpu)]); bundles],
            strategy: strategy.into(),
            selector: BTreeMap::new(),
            timeout_ms,
            detached: false,
        }
    }

    /// A head and the ledgers of its nodes, delivering every operation at
    /// once (or losing those to nodes in `unreachable`).
    struct Cluster {
        groups: Groups,
        ledgers: BTreeMap<MemberName, Ledger>,
        members: Vec<MemberView>,
        unreachable: BTreeSet<MemberName>,
        changed: Vec<GroupId>,
        now: Instant,
    }

    impl Cluster {
        fn new(nodes: &[(&str, u32)]) -> Self {
            let mut c = Self {
                groups: Groups::new("h1", GroupsConfig::default()),
                ledgers: BTreeMap::new(),
                members: Vec::new(),
                unreachable: BTreeSet::new(),
                changed: Vec::new(),
                now: Instant::now(),
            };
            for (n, cpus) in nodes {
                c.join(n, Incarnation::new(1), *cpus);
            }
            c
        }

        fn join(&mut self, name: &str, incarnation: Incarnation, cpus: u32) {
            let m = member(name, incarnation, cpus, true);
            self.ledgers
                .entry(MemberName::from(name))
                .or_insert_with(|| Ledger::new(m.resources.amounts()));
            self.members.retain(|x| x.name != name);
            self.members.push(m);
            self.sync();
        }

        fn down(&mut self, name: &str) {
            for m in &mut self.members {
                if m.name == name {
                    m.state = MemberState::Down;
                }
            }
            self.sync();
        }

        fn sync(&mut self) {
            let mut out = Vec::new();
            self.groups.set_members(&self.members, &mut out);
            self.run(out);
        }

        fn run(&mut self, mut out: Vec<Action>) {
            loop {
                self.groups.step(self.now, &mut out);
                if out.is_empty() {
                    return;
                }
                for a in std::mem::take(&mut out) {
                    match a {
                        Action::Send { node, op, tag } => {
                            let reply = match self.ledgers.get_mut(&node) {
                                Some(l) if !self.unreachable.contains(&node) => Ok(l.apply(op)),
                                _ => Err("unreachable".to_owned()),
                            };
                            self.groups.replied(self.now, &node, tag, reply, &mut out);
                        }
                        Action::Changed(id) | Action::Removed(id) => self.changed.push(id),
                        Action::Refused { .. } => {}
                    }
                }
            }
        }

        fn create(&mut self, spec: GroupSpec) -> GroupId {
            let id = self
                .groups
                .create(
                    self.now,
                    spec,
                    Some(MemberRef::new("driver", Incarnation::new(1))),
                )
                .unwrap();
            self.run(Vec::new());
            id
        }

        fn advance(&mut self, by: Duration) {
            self.now += by;
            self.run(Vec::new());
        }

        fn state(&self, id: &GroupId) -> GroupState {
            self.groups.view(id).unwrap().state
        }

        /// The head's accounts agree with every ledger.
        fn check_accounts(&self) {
            for (name, l) in &self.ledgers {
                if self
                    .members
                    .iter()
                    .any(|m| m.name == *name && m.state == MemberState::Up)
                {
                    let head = self.groups.reserved(name);
                    let node: Resources = l
                        .reserved()
                        .into_iter()
                        .filter(|(_, v)| v.abs() > EPS)
                        .collect();
                    assert_eq!(head, node, "{name}");
                }
            }
        }
    }

    #[test]
    fn a_group_is_prepared_on_every_node_then_committed() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2)]);
        let id = c
            .groups
            .create(c.now, spec("strict-spread", 2, 1.0, 1000), None)
            .unwrap();
        let mut out = Vec::new();
        c.groups.step(c.now, &mut out);
        let prepares: Vec<&Action> = out
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Send {
                        op: LedgerOp::Prepare { .. },
                        ..
                    }
                )
            })
            .collect();
        assert_eq!(prepares.len(), 2);
        assert_eq!(c.state(&id), GroupState::Reserving);
        assert_eq!(
            c.groups.reserved("a"),
            res(&[("cpu", 1.0)]),
            "in flight counts"
        );
        c.run(out);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Ready);
        assert_eq!(v.nodes, vec!["a", "b"]);
        assert_eq!(c.ledgers["a"].held().len(), 1, "committed on the node");
        c.check_accounts();
    }

    #[test]
    fn a_refused_prepare_rolls_back_every_node_and_retries() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2)]);
        // b's ledger has less than b reported: its prepare is refused.
        c.ledgers
            .insert("b".into(), Ledger::new(res(&[("cpu", 0.0)])));
        let id = c.create(spec("strict-spread", 2, 1.0, 10_000));
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Pending);
        assert!(
            v.why.as_deref().unwrap().contains("node b refused"),
            "{v:?}"
        );
        assert!(
            c.ledgers["a"].reserved().values().all(|v| *v == 0.0),
            "rolled back on a"
        );
        assert!(c.groups.reserved("a").is_empty());
        c.ledgers
            .insert("b".into(), Ledger::new(res(&[("cpu", 2.0)])));
        c.advance(Duration::from_millis(10));
        assert_eq!(
            c.state(&id),
            GroupState::Pending,
            "not before the retry delay"
        );
        c.advance(Duration::from_millis(50));
        assert_eq!(c.state(&id), GroupState::Ready);
        c.check_accounts();
    }

    #[test]
    fn an_unreachable_node_during_commit_gets_its_bundles_placed_again() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1), ("c", 1)]);
        let id = c
            .groups
            .create(c.now, spec("spread", 2, 1.0, 10_000), None)
            .unwrap();
        let mut out = Vec::new();
        c.groups.step(c.now, &mut out);
        // Deliver the prepares, then make b unreachable for the commit.
        let mut next = Vec::new();
        for a in out {
            if let Action::Send { node, op, tag } = a {
                let reply = c.ledgers.get_mut(&node).unwrap().apply(op);
                c.groups.replied(c.now, &node, tag, Ok(reply), &mut next);
            }
        }
        c.unreachable.insert("b".into());
        c.run(next);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Pending, "{v:?}");
        assert_eq!(v.nodes, vec!["a", ""], "a's commit stands");
        assert!(v.why.unwrap().contains("node b"));
        // b is still up in the table: tried again after the delay, in vain.
        c.advance(Duration::from_millis(60));
        assert_eq!(c.state(&id), GroupState::Pending);
        c.down("b");
        let v = c.groups.view(&id).unwrap();
        assert_eq!(
            (v.state, v.nodes),
            (GroupState::Ready, vec!["a".into(), "c".into()])
        );
        c.check_accounts();
    }

    #[test]
    fn a_pending_group_is_placed_when_a_node_joins_and_fails_at_its_timeout_otherwise() {
        let mut c = Cluster::new(&[("a", 2)]);
        let waits = c.create(spec("strict-spread", 2, 1.0, 5_000));
        let fails = c.create(spec("strict-spread", 3, 1.0, 5_000));
        assert_eq!(c.state(&waits), GroupState::Pending);
        let why = c.groups.view(&fails).unwrap().why.unwrap();
        assert!(why.contains("3 distinct nodes"), "{why}");
        assert_eq!(
            c.groups.poll_timeout(),
            Some(c.now + Duration::from_secs(5))
        );
        c.advance(Duration::from_secs(1));
        c.join("b", Incarnation::new(1), 2);
        assert_eq!(c.state(&waits), GroupState::Ready);
        assert_eq!(c.state(&fails), GroupState::Pending);
        c.advance(Duration::from_secs(4));
        let v = c.groups.view(&fails).unwrap();
        assert_eq!(v.state, GroupState::Failed);
        assert!(v.why.unwrap().contains("strict-spread group of 3 bundles"));
        // A node joining later does not revive a failed group.
        c.join("c", Incarnation::new(1), 2);
        assert_eq!(c.state(&fails), GroupState::Failed);
        c.check_accounts();
    }

    #[test]
    fn bundles_of_a_lost_node_are_placed_again_under_the_strategy() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
        let id = c.create(spec("strict-spread", 3, 1.0, 1000));
        let before = c.groups.view(&id).unwrap();
        assert_eq!(before.nodes, vec!["a", "b", "c"]);
        c.changed.clear();
        c.down("b");
        let after = c.groups.view(&id).unwrap();
        assert_eq!(after.state, GroupState::Ready);
        assert_eq!(after.nodes, vec!["a", "d", "c"], "only b's bundle moved");
        assert!(after.revision > before.revision);
        assert!(c.changed.contains(&id), "the owner is told");
        // Nowhere left to go: rescheduling, with no timeout.
        c.down("d");
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Rescheduling);
        assert!(v.why.is_some());
        c.advance(Duration::from_secs(60));
        assert_eq!(c.state(&id), GroupState::Rescheduling);
        // b comes back restarted (an empty ledger): used again.
        c.ledgers
            .insert("b".into(), Ledger::new(res(&[("cpu", 1.0)])));
        c.join("b", Incarnation::new(2), 1);
        assert_eq!(c.groups.view(&id).unwrap().nodes, vec!["a", "b", "c"]);
        c.check_accounts();
    }

    #[test]
    fn a_draining_nodes_bundles_move_at_once_and_a_draining_owner_keeps_its_groups() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1), ("c", 1), ("driver", 0)]);
        let id = c.create(spec("spread", 2, 1.0, 1000));
        assert_eq!(c.groups.view(&id).unwrap().nodes, vec!["a", "b"]);
        let set = |c: &mut Cluster, name: &str, state: MemberState| {
            for m in &mut c.members {
                if m.name == name {
                    m.state = state;
                }
            }
            c.sync();
        };
        set(&mut c, "b", MemberState::Draining);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Ready);
        assert_eq!(v.nodes, vec!["a", "c"], "b's bundle moved, no new one on b");
        // Its owner draining (a driver on a node being drained): the group
        // stays, its owner's process still runs.
        set(&mut c, "driver", MemberState::Draining);
        assert!(c.groups.view(&id).is_some());
        set(&mut c, "driver", MemberState::Left);
        assert!(c.groups.view(&id).is_none(), "an owner that left loses it");
    }

    #[test]
    fn a_group_grows_one_bundle_at_a_time_by_its_strategy_and_shrinks_from_its_end() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2)]);
        let id = c.create(spec("spread", 2, 1.0, 1000));
        let before = c.groups.view(&id).unwrap();
        assert_eq!(before.nodes, vec!["a", "b"]);
        // A node joins: spread grows onto the node holding none of it.
        c.join("c", Incarnation::new(1), 2);
        assert_eq!(c.groups.grow(&id, res(&[("cpu", 1.0)]), &[]), Ok(2));
        assert_eq!(
            c.groups.grow(&id, res(&[("cpu", 1.0)]), &[]),
            Err(GrowRefused::NotReady(GroupState::Rescheduling)),
            "one bundle at a time"
        );
        c.run(Vec::new());
        let grown = c.groups.view(&id).unwrap();
        assert_eq!(grown.state, GroupState::Ready);
        assert_eq!(grown.nodes, vec!["a", "b", "c"]);
        assert!(grown.revision > before.revision);
        c.check_accounts();
        // Strict spread over every node: one more has nowhere to go, and
        // the group is as it was.
        let strict = c.create(spec("strict-spread", 3, 0.5, 1000));
        let was = c.groups.view(&strict).unwrap();
        assert!(matches!(
            c.groups.grow(&strict, res(&[("cpu", 0.5)]), &[]),
            Err(GrowRefused::NoRoom(_))
        ));
        assert_eq!(c.groups.view(&strict).unwrap(), was);
        assert!(matches!(
            c.groups.grow(&id, res(&[("cpu", -1.0)]), &[]),
            Err(GrowRefused::Bad(_))
        ));
        assert_eq!(
            c.groups
                .grow(&GroupId::new("nope"), res(&[("cpu", 1.0)]), &[]),
            Err(GrowRefused::Unknown)
        );
        // Only the last bundle goes, and its reservation with it.
        let mut out = Vec::new();
        assert!(!c.groups.shrink(&id, 0, &mut out), "not the last");
        assert!(c.groups.shrink(&id, 2, &mut out));
        c.run(out);
        let shrunk = c.groups.view(&id).unwrap();
        assert_eq!(shrunk.nodes, vec!["a", "b"]);
        assert_eq!(shrunk.state, GroupState::Ready);
        c.check_accounts();
        let mut out = Vec::new();
        let one = c.create(spec("pack", 1, 0.5, 1000));
        assert!(!c.groups.shrink(&one, 0, &mut out), "never the only one");
    }

    #[test]
    fn a_grown_bundle_avoids_the_members_its_owner_found_unfit_from_then_on() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2), ("c", 2)]);
        let id = c.create(spec("pack", 1, 1.0, 1000));
        let first = c.groups.view(&id).unwrap().nodes[0].clone();
        // PACK would grow beside the first bundle; that member is unfit.
        let unfit = MemberName::from(first.as_str());
        let b = c
            .groups
            .grow(&id, res(&[("cpu", 1.0)]), std::slice::from_ref(&unfit))
            .unwrap();
        c.run(Vec::new());
        let grown = c.groups.view(&id).unwrap();
        assert_ne!(grown.nodes[b as usize], first, "{:?}", grown.nodes);
        // Every later bundle avoids it too, unasked.
        let b = c.groups.grow(&id, res(&[("cpu", 1.0)]), &[]).unwrap();
        c.run(Vec::new());
        assert_ne!(c.groups.view(&id).unwrap().nodes[b as usize], first);
        c.check_accounts();
        // With every other member full or avoided, there is no room.
        let every: Vec<MemberName> = ["a", "b", "c"].map(MemberName::from).to_vec();
        assert!(matches!(
            c.groups.grow(&id, res(&[("cpu", 1.0)]), &every),
            Err(GrowRefused::NoRoom(_))
        ));
    }

    #[test]
    fn lost_bundles_are_placed_again_one_by_one_as_room_appears() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
        let id = c.create(spec("spread", 4, 1.0, 1000));
        c.down("c");
        c.down("d");
        // Room for neither: both wait.
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Rescheduling);
        assert_eq!(v.nodes.iter().filter(|n| n.is_empty()).count(), 2);
        // Room for one: it goes at once, the other still waits.
        c.join("e", Incarnation::new(1), 1);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Rescheduling);
        assert_eq!(v.nodes.iter().filter(|n| n.as_str() == "e").count(), 1);
        assert!(v.why.is_some(), "it says why the other waits");
        c.join("f", Incarnation::new(1), 1);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Ready);
        assert!(v.nodes.iter().all(|n| !n.is_empty()));
        c.check_accounts();
    }

    #[test]
    fn strict_pack_stays_on_the_node_of_the_bundles_it_kept() {
        let mut c = Cluster::new(&[("a", 4), ("b", 4)]);
        let id = c.create(spec("strict-pack", 2, 1.0, 1000));
        assert_eq!(c.groups.view(&id).unwrap().nodes, vec!["a", "a"]);
        c.down("a");
        assert_eq!(c.groups.view(&id).unwrap().nodes, vec!["b", "b"]);
        c.check_accounts();
    }

    #[test]
    fn removing_a_group_releases_it_everywhere_and_an_owner_gone_removes_its_groups() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2), ("driver", 0)]);
        let one = c.create(spec("spread", 2, 1.0, 1000));
        let two = c.create(spec("pack", 1, 1.0, 1000));
        let mut out = Vec::new();
        assert!(c.groups.remove(&one, &mut out));
        assert!(!c.groups.remove(&one, &mut out), "once");
        c.run(out);
        c.check_accounts();
        assert_eq!(c.groups.view(&two).unwrap().state, GroupState::Ready);
        c.join("driver", Incarnation::new(2), 0);
        assert!(c.groups.view(&two).is_none(), "its owner restarted");
        c.check_accounts();
        assert!(c.ledgers.values().all(|l| l.held().is_empty()));
        assert!(c.groups.reserved("a").is_empty() && c.groups.reserved("b").is_empty());
    }

    #[test]
    fn a_restarted_head_rebuilds_groups_from_reports_without_counting_twice() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2), ("c", 2)]);
        let id = c.create(spec("spread", 3, 1.0, 1000));
        let pack = c.create(spec("pack", 2, 0.5, 1000));
        c.check_accounts();
        let before = c.groups.view(&id).unwrap();
        // The head restarts: a fresh machine, the nodes rejoin one by one.
        c.groups = Groups::new("h2", GroupsConfig::default());
        for (n, inc) in [("a", 1), ("b", 1)] {
            let held = c.ledgers.get_mut(n).unwrap().rejoin();
            let mut out = Vec::new();
            c.groups
                .report(c.now, n, Incarnation::new(inc), held.clone(), &mut out);
            // A repeated report changes nothing.
            c.groups
                .report(c.now, n, Incarnation::new(inc), held, &mut out);
            c.run(out);
        }
        let mut out = Vec::new();
        c.groups.set_members(&c.members[..2], &mut out);
        c.run(out);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(v.state, GroupState::Rescheduling, "c has not reported yet");
        assert_eq!(c.groups.reserved("a"), c.ledgers["a"].reserved());
        let held = c.ledgers.get_mut("c").unwrap().rejoin();
        let mut out = Vec::new();
        c.groups
            .report(c.now, "c", Incarnation::new(1), held, &mut out);
        c.run(out);
        c.sync();
        let v = c.groups.view(&id).unwrap();
        assert_eq!(
            (v.state, v.nodes.clone()),
            (GroupState::Ready, before.nodes)
        );
        assert_eq!(c.state(&pack), GroupState::Ready);
        c.check_accounts();
    }

    #[test]
    fn a_rebuilt_groups_unreported_bundles_are_placed_again_after_the_grace() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1), ("c", 1)]);
        // The groups' owner, up throughout.
        c.join("driver", Incarnation::new(1), 0);
        let id = c.create(spec("strict-spread", 2, 1.0, 1000));
        assert_eq!(c.groups.view(&id).unwrap().nodes, vec!["a", "b"]);
        c.groups = Groups::new("h2", GroupsConfig::default());
        let held = c.ledgers.get_mut("a").unwrap().rejoin();
        let mut out = Vec::new();
        c.groups
            .report(c.now, "a", Incarnation::new(1), held, &mut out);
        c.members.retain(|m| m.name != "b");
        c.ledgers.remove("b");
        c.groups.set_members(&c.members, &mut out);
        c.run(out);
        assert_eq!(c.state(&id), GroupState::Rescheduling);
        c.advance(GroupsConfig::default().confirm_grace);
        assert_eq!(c.groups.view(&id).unwrap().nodes, vec!["a", "c"]);
        c.check_accounts();
    }

    #[test]
    fn a_node_taken_for_lost_gets_back_what_was_not_placed_elsewhere() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1)]);
        let id = c.create(spec("strict-spread", 2, 1.0, 1000));
        c.down("b");
        assert_eq!(c.state(&id), GroupState::Rescheduling);
        // b was only partitioned: it rejoins with its ledger and reports.
        let held = c.ledgers.get_mut("b").unwrap().rejoin();
        let mut out = Vec::new();
        c.groups
            .report(c.now, "b", Incarnation::new(1), held, &mut out);
        c.run(out);
        c.join("b", Incarnation::new(1), 1);
        assert_eq!(c.state(&id), GroupState::Ready);
        c.check_accounts();
        // A group removed while b was away is released when b reports it.
        c.down("b");
        let mut out = Vec::new();
        c.groups.remove(&id, &mut out);
        c.run(out);
        assert_eq!(c.ledgers["b"].held().len(), 1, "b could not be told");
        let held = c.ledgers.get_mut("b").unwrap().rejoin();
        let mut out = Vec::new();
        c.groups
            .report(c.now, "b", Incarnation::new(1), held, &mut out);
        c.run(out);
        assert!(c.ledgers["b"].held().is_empty());
        assert!(c.groups.is_empty());
    }

    /// A node's report is checked against the head's own record: a
    /// bundle the head has not given it (one still unassigned, or one
    /// that does not exist) is refused, released on the node and reported
    /// as refused.
    #[test]
    fn a_report_claiming_bundles_the_heads_record_does_not_give_is_refused() {
        let mut c = Cluster::new(&[("a", 1), ("b", 1)]);
        c.join("driver", Incarnation::new(1), 0);
        // Two bundles of 1 CPU on one node: it waits, nothing assigned.
        let waiting = c.create(spec("strict-pack", 2, 1.0, 60_000));
        assert_eq!(c.state(&waiting), GroupState::Pending);
        let claim = |id: &GroupId, bundles: Vec<u32>| Held {
            record: GroupRecord {
                id: id.clone(),
                revision: 99,
                strategy: "strict-pack".into(),
                bundles: vec![res(&[("cpu", 1.0)]); 2],
                nodes: vec!["b".into(), "b".into()],
                selector: BTreeMap::new(),
                owner: Some(MemberRef::new("driver", Incarnation::new(1))),
                seal: Vec::new(),
            },
            bundles,
        };
        let mut out = Vec::new();
        c.groups.report(
            c.now,
            "b",
            Incarnation::new(1),
            vec![claim(&waiting, vec![0, 1, 7])],
            &mut out,
        );
        assert!(
            out.contains(&Action::Refused {
                node: "b".into(),
                group: waiting.clone(),
                bundles: vec![0, 1, 7],
            }),
            "{out:?}"
        );
        assert!(out.iter().any(|a| matches!(
            a,
            Action::Send { node, op: LedgerOp::Release { bundles, .. }, .. }
                if node == "b" && bundles == &vec![0, 1, 7]
        )));
        assert_eq!(c.groups.view(&waiting).unwrap().nodes, vec!["", ""]);
        assert!(c.groups.reserved("b").is_empty(), "nothing reserved for b");
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut g = Groups::new("h", GroupsConfig::default());
        let now = Instant::now();
        assert_eq!(
            g.create(now, spec("pack", 0, 1.0, 0), None),
            Err(BadSpec::Empty)
        );
        assert!(matches!(
            g.create(now, spec("tight", 1, 1.0, 0), None),
            Err(BadSpec::Strategy(_))
        ));
        assert!(matches!(
            g.create(now, spec("pack", 1, -1.0, 0), None),
            Err(BadSpec::Amount { .. })
        ));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Create(u8, u8, u8),
        Remove(u8),
        Down(u8),
        Restart(u8),
        Advance(u16),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, 1u8..4, 1u8..3).prop_map(|(s, n, c)| Op::Create(s, n, c)),
            (0u8..8).prop_map(Op::Remove),
            (0u8..4).prop_map(Op::Down),
            (0u8..4).prop_map(Op::Restart),
            (0u16..3000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever happens, the head's accounts equal the nodes' ledgers,
        /// no ledger holds more than its capacity, and every ready group
        /// keeps its strategy's promise.
        #[test]
        fn accounts_match_the_ledgers_and_ready_groups_keep_their_strategy(
            ops in proptest::collection::vec(op(), 1..30)
        ) {
            let names = ["a", "b", "c", "d"];
            let mut c = Cluster::new(&[("a", 2), ("b", 2), ("c", 2), ("d", 2)]);
            let mut incarnations = [1u64; 4];
            let mut ids = Vec::new();
            for op in ops {
                match op {
                    Op::Create(s, n, cpu) => {
                        let strategy = ["pack", "spread", "strict-pack", "strict-spread"][s as usize];
                        ids.push(c.create(spec(strategy, n as usize, f64::from(cpu), 2000)));
                    }
                    Op::Remove(i) => {
                        if let Some(id) = ids.get(i as usize) {
                            let mut out = Vec::new();
                            c.groups.remove(id, &mut out);
                            c.run(out);
                        }
                    }
                    Op::Down(n) => c.down(names[n as usize]),
                    Op::Restart(n) => {
                        let i = n as usize;
                        incarnations[i] += 1;
                        c.ledgers.insert(names[i].into(), Ledger::new(res(&[("cpu", 2.0)])));
                        c.join(names[i], Incarnation::new(incarnations[i]), 2);
                    }
                    Op::Advance(ms) => c.advance(Duration::from_millis(u64::from(ms))),
                }
                c.check_accounts();
                for l in c.ledgers.values() {
                    prop_assert!(l.reserved().get("cpu").copied().unwrap_or(0.0) <= 2.0 + EPS);
                }
                for v in c.groups.views() {
                    if v.state != GroupState::Ready {
                        continue;
                    }
                    let distinct: BTreeSet<&MemberName> = v.nodes.iter().collect();
                    prop_assert!(v.nodes.iter().all(|n| !n.is_empty()));
                    match v.strategy.as_str() {
                        "strict-pack" => prop_assert_eq!(distinct.len(), 1),
                        "strict-spread" => prop_assert_eq!(distinct.len(), v.nodes.len()),
                        _ => {}
                    }
                    for n in &v.nodes {
                        let up = c.members.iter().any(|m| m.name == *n && m.state == MemberState::Up);
                        prop_assert!(up, "{} on {} which is not up", v.id, n);
                    }
                }
            }
        }
    }

    /// The head restarts: a fresh machine takes back `ids` as the old one
    /// would have kept them on disk, each with `remaining` of its timeout.
    fn restart_from_store(c: &mut Cluster, ids: &[&GroupId], remaining: Duration) {
        let stored: Vec<StoredGroup> = ids
            .iter()
            .map(|id| c.groups.to_store(id, 0).unwrap())
            .collect();
        c.groups = Groups::new("h2", GroupsConfig::default());
        for g in stored {
            c.groups.restore(c.now, g, remaining).unwrap();
        }
    }

    /// Each node reports what its ledger holds, as on rejoining.
    fn report_all(c: &mut Cluster) {
        let names: Vec<MemberName> = c.ledgers.keys().cloned().collect();
        for n in names {
            let held = c.ledgers.get_mut(&n).unwrap().rejoin();
            let mut out = Vec::new();
            c.groups
                .report(c.now, &n, Incarnation::new(1), held, &mut out);
            c.run(out);
        }
    }

    #[test]
    fn a_pending_group_taken_back_stays_pending_until_resources_appear_or_its_time_is_up() {
        let mut c = Cluster::new(&[("a", 1)]);
        c.join("driver", Incarnation::new(1), 0);
        let waits = c.create(spec("pack", 1, 4.0, 600_000));
        let expires = c.create(spec("pack", 1, 8.0, 600_000));
        assert_eq!(c.state(&waits), GroupState::Pending);
        let stored = c.groups.to_store(&expires, 0).unwrap();
        restart_from_store(&mut c, &[&waits], Duration::from_secs(60));
        c.groups
            .restore(c.now, stored, Duration::from_secs(1))
            .unwrap();
        c.sync();
        assert_eq!(c.state(&waits), GroupState::Pending, "same id, pending");
        assert_eq!(c.state(&expires), GroupState::Pending);
        c.advance(Duration::from_secs(1));
        assert_eq!(
            c.state(&expires),
            GroupState::Failed,
            "what was left of its timeout"
        );
        assert_eq!(c.state(&waits), GroupState::Pending);
        c.join("b", Incarnation::new(1), 4);
        let v = c.groups.view(&waits).unwrap();
        assert_eq!(
            (v.state, v.nodes),
            (GroupState::Ready, vec![MemberName::from("b")])
        );
        c.check_accounts();
    }

    #[test]
    fn a_ready_group_taken_back_keeps_its_bundles_where_they_are() {
        let mut c = Cluster::new(&[("a", 2), ("b", 2)]);
        c.join("driver", Incarnation::new(1), 0);
        let id = c.create(spec("spread", 2, 1.0, 1000));
        let before = c.groups.view(&id).unwrap();
        assert_eq!(before.state, GroupState::Ready);
        restart_from_store(&mut c, &[&id], Duration::ZERO);
        c.sync();
        assert_eq!(
            c.state(&id),
            GroupState::Rescheduling,
            "waiting for reports"
        );
        assert!(c.groups.reserved("a").is_empty(), "nothing placed anew");
        report_all(&mut c);
        let v = c.groups.view(&id).unwrap();
        assert_eq!(
            (v.state, &v.nodes, v.revision),
            (GroupState::Ready, &before.nodes, before.revision)
        );
        c.advance(GroupsConfig::default().confirm_grace * 2);
        assert_eq!(
            c.groups.view(&id).unwrap().revision,
            before.revision,
            "never placed again"
        );
        for n in ["a", "b"] {
            assert_eq!(c.ledgers[n].held().len(), 1, "{n} holds its bundle still");
        }
        c.check_accounts();
    }

    #[test]
    fn groups_taken_back_whose_owner_is_not_seen_are_removed_and_released() {
        let mut c = Cluster::new(&[("a", 4)]);
        c.join("driver", Incarnation::new(1), 0);
        let stored = c.create(spec("pack", 1, 1.0, 1000));
        let reported = c.create(spec("pack", 1, 1.0, 1000));
        let detached = c.create(GroupSpec {
            detached: true,
            ..spec("pack", 1, 1.0, 1000)
        });
        // The driver dies while the head is down: it never rejoins.
        c.members.retain(|m| m.name != "driver");
        c.ledgers.remove("driver");
        restart_from_store(&mut c, &[&stored, &detached], Duration::ZERO);
        report_all(&mut c);
        c.sync();
        for id in [&stored, &reported, &detached] {
            assert_eq!(c.state(id), GroupState::Ready, "{id} adopted");
        }
        c.advance(GroupsConfig::default().confirm_grace);
        assert!(c.groups.view(&stored).is_none(), "its owner was not seen");
        assert!(
            c.groups.view(&reported).is_none(),
            "likewise, rebuilt from a report"
        );
        assert_eq!(
            c.state(&detached),
            GroupState::Ready,
            "nobody owns it: kept"
        );
        assert_eq!(c.ledgers["a"].held().len(), 1, "the two released on a");
        c.check_accounts();
    }
}
