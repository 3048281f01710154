//! Placement groups in the simulated cluster: the head's proto [`Groups`]
//! fed the head's member table and the joins' reports, each member's
//! [`Ledger`], and the ledger operations between them carried over the
//! head↔member links — delayed, and failed after the link timeout for a
//! member cut off from the head.
//!
//! ```text
//! head: Groups ── Send{op} ──(link: latency, jitter; cut ⇒ Err after link_timeout)──► member: Ledger::apply
//!   ▲ replied(tag, reply) ◄──────────────────────────────────────────────────────────┘
//!   ├ set_members(head table), step(now), its timer
//!   └ report(held) when a member joins (its ledger's rejoin)
//! ```
//!
//! Checked after every event: the head never counts more against a node
//! than the node offers, and every ready group sits on members the head
//! has up, as its strategy promised (STRICT_PACK on one node,
//! STRICT_SPREAD on as many as it has bundles). Once the faults end and
//! the cluster settles: every group is ready and the head's accounts
//! equal every up member's ledger.

use std::collections::BTreeSet;
use std::time::Instant;

use flotilla_proto::groups::{Action, GroupSpec, GroupState, Groups, GroupsConfig, Tag, bundle};
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::ledger::{Held, Ledger, LedgerOp, LedgerReply};
use flotilla_proto::membership::{MemberState, MemberView};
use flotilla_proto::placement::{Resources, Strategy};

use crate::rng::SplitMix as Rng;
use flotilla_proto::ids::{GroupId, MemberName};

/// CPUs each member offers.
pub const CPUS: u32 = 2;

/// A tolerance for fractional amounts.
const EPS: f64 = 1e-9;

/// The placement world's timed events.
#[derive(Debug, Clone)]
pub(super) enum PlaceEvent {
    /// A ledger operation reaches its member.
    Deliver {
        member: usize,
        op: LedgerOp,
        tag: Tag,
    },
    /// A member's reply (or the link's failure) reaches the head.
    Reply {
        member: usize,
        tag: Tag,
        reply: Result<LedgerReply, String>,
    },
    /// The head's groups have a timer.
    Timer,
}

/// What the head's groups ask of the links.
#[derive(Debug, Clone)]
pub(super) struct Send {
    pub(super) member: usize,
    pub(super) op: LedgerOp,
    pub(super) tag: Tag,
}

/// The head's groups and the members' ledgers.
pub(super) struct Placement {
    seed: u64,
    groups: Groups,
    pub(super) ledgers: Vec<Ledger>,
    /// Member index by name.
    names: Vec<MemberName>,
    /// The ids of the groups made.
    ids: Vec<GroupId>,
    /// When the groups' timer is set for.
    pub(super) timer: Option<Instant>,
    /// Ledger operations sent, and how many failed (cut off).
    pub(super) sent: usize,
    pub(super) failed: usize,
    /// Bundles the head placed again after losing their node.
    pub(super) moved: usize,
}

impl Placement {
    /// Ledgers for `names`, and `groups` groups of one or two bundles of
    /// one CPU each under random strategies, drawn from `seed`.
    pub(super) fn new(seed: u64, names: &[MemberName], groups: usize, now: Instant) -> Self {
        let capacity = bundle(&[("cpu", f64::from(CPUS))]);
        let mut p = Self {
            seed,
            groups: Groups::new("h1", GroupsConfig::default()),
            ledgers: names
                .iter()
                .map(|_| Ledger::new(capacity.clone()))
                .collect(),
            names: names.to_vec(),
            ids: Vec::new(),
            timer: None,
            sent: 0,
            failed: 0,
            moved: 0,
        };
        let mut rng = Rng(seed ^ 0x0b0e);
        for _ in 0..groups {
            let strategy = [
                Strategy::Pack,
                Strategy::Spread,
                Strategy::StrictPack,
                Strategy::StrictSpread,
            ][rng.between(0, 3) as usize];
            let bundles = vec![bundle(&[("cpu", 1.0)]); rng.between(1, 2) as usize];
            let mut spec = GroupSpec::new(strategy, bundles).detached();
            // Pending through any partition: it must end up placed.
            spec.timeout_ms = 3_600_000;
            let id = p.groups.create(now, spec, None).expect("a valid spec");
            p.ids.push(id);
        }
        p
    }

    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("no member {name}"))
    }

    /// The head's actions, as sends for the links.
    fn sends(&mut self, out: Vec<Action>) -> Vec<Send> {
        self.sent += out
            .iter()
            .filter(|a| matches!(a, Action::Send { .. }))
            .count();
        self.moved += out
            .iter()
            .filter(|a| matches!(a, Action::Send { op: LedgerOp::Prepare { record, .. }, .. } if record.revision > 1))
            .count();
        out.into_iter()
            .filter_map(|a| match a {
                Action::Send { node, op, tag } => Some(Send {
                    member: self.index(&node),
                    op,
                    tag,
                }),
                Action::Changed(_) | Action::Removed(_) | Action::Refused { .. } => None,
            })
            .collect()
    }

    /// The head's table changed.
    pub(super) fn set_members(&mut self, now: Instant, table: &[MemberView]) -> Vec<Send> {
        let members: Vec<MemberView> = table
            .iter()
            .filter(|m| m.name != super::HEAD)
            .cloned()
            .collect();
        let mut out = Vec::new();
        self.groups.set_members(&members, &mut out);
        self.groups.step(now, &mut out);
        self.sends(out)
    }

    /// A member joined the head, reporting what its ledger holds.
    pub(super) fn report(
        &mut self,
        now: Instant,
        member: usize,
        incarnation: Incarnation,
        held: Vec<Held>,
    ) -> Vec<Send> {
        let mut out = Vec::new();
        self.groups
            .report(now, &self.names[member], incarnation, held, &mut out);
        self.groups.step(now, &mut out);
        self.sends(out)
    }

    /// A member's ledger applies `op`.
    pub(super) fn apply(&mut self, member: usize, op: LedgerOp) -> LedgerReply {
        self.ledgers[member].apply(op)
    }

    /// The head hears a reply.
    pub(super) fn replied(
        &mut self,
        now: Instant,
        member: usize,
        tag: Tag,
        reply: Result<LedgerReply, String>,
    ) -> Vec<Send> {
        let mut out = Vec::new();
        self.groups
            .replied(now, &self.names[member], tag, reply, &mut out);
        self.groups.step(now, &mut out);
        self.sends(out)
    }

    /// The groups' timer fired.
    pub(super) fn step(&mut self, now: Instant) -> Vec<Send> {
        let mut out = Vec::new();
        self.groups.step(now, &mut out);
        self.sends(out)
    }

    /// When the groups next need a step.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.groups.poll_timeout()
    }

    /// The invariants that hold after every event.
    pub(super) fn check(&self, table: &[MemberView]) {
        let seed = self.seed;
        for name in &self.names {
            let cpu = self
                .groups
                .reserved(name)
                .get("cpu")
                .copied()
                .unwrap_or(0.0);
            assert!(
                cpu <= f64::from(CPUS) + EPS,
                "seed {seed}: the head counts {cpu} CPUs against {name}"
            );
        }
        for v in self.groups.views() {
            if v.state != GroupState::Ready {
                continue;
            }
            let distinct: BTreeSet<&MemberName> = v.nodes.iter().collect();
            match v.strategy.as_str() {
                "strict-pack" => assert_eq!(distinct.len(), 1, "seed {seed}: {v:?}"),
                "strict-spread" => assert_eq!(distinct.len(), v.nodes.len(), "seed {seed}: {v:?}"),
                _ => {}
            }
            for n in &v.nodes {
                let up = table
                    .iter()
                    .any(|m| m.name == *n && m.state == MemberState::Up);
                assert!(
                    up,
                    "seed {seed}: {} ready on {n}, which the head does not have up",
                    v.id
                );
            }
        }
    }

    /// Whether every group is ready and the head's accounts equal the
    /// ledger of every member it has up.
    pub(super) fn settled(&self, table: &[MemberView]) -> bool {
        let ready = self.ids.iter().all(|id| {
            self.groups
                .view(id)
                .is_some_and(|v| v.state == GroupState::Ready)
        });
        ready
            && table
                .iter()
                .filter(|m| m.name != super::HEAD && m.state == MemberState::Up)
                .all(|m| {
                    let head = self.groups.reserved(&m.name);
                    let node: Resources = self.ledgers[self.index(&m.name)]
                        .reserved()
                        .into_iter()
                        .filter(|(_, v)| v.abs() > EPS)
                        .collect();
                    head == node
                })
    }

    /// What keeps placement from having settled, for a failure message.
    pub(super) fn unsettled(&self) -> String {
        let views: Vec<String> = self
            .groups
            .views()
            .iter()
            .map(|v| format!("{} {:?} on {:?}", v.id, v.state, v.nodes))
            .collect();
        let ledgers: Vec<String> = self
            .names
            .iter()
            .zip(&self.ledgers)
            .map(|(n, l)| {
                format!(
                    "{n}: head {:?}, ledger {:?}",
                    self.groups.reserved(n),
                    l.reserved()
                )
            })
            .collect();
        format!("groups {views:?}; accounts {ledgers:?}")
    }
}
