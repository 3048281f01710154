//! A node's ledger of placement-group reservations: what it has set aside
//! for which bundle, the node-side half of the head's two-phase
//! reservation.
//!
//! ```text
//!  (none) ── prepare ok ──► Prepared ── commit ──► Committed
//!     ▲          │ short: refused   │                  │
//!     └──────────┴──── release ─────┴──── release ─────┘
//!  (re)joining a head: Prepared entries are dropped, Committed ones
//!  are reported (`held`) so a restarted head rebuilds its groups
//! ```
//!
//! A prepare is refused when the bundles do not fit in what the node has
//! left (its capacity less every entry, prepared or committed), so a head
//! whose view of the node is stale can never oversubscribe it. Every
//! operation is idempotent: a repeated prepare of a held bundle, a commit
//! of a committed one and a release of an unknown one change nothing.

// rkyv's derive emits undocumented public helper items for enums with
// struct variants; every type written here is documented by hand.
#![allow(missing_docs)]

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

use crate::ids::{GroupId, MemberName};
use crate::incarnation::MemberRef;
use crate::placement::Resources;

/// A tolerance for fractional amounts.
const EPS: f64 = 1e-9;

/// What a node is told of the group a bundle belongs to, so that a head
/// that restarts can rebuild the group from its members' reports.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GroupRecord {
    /// The group's id.
    pub id: GroupId,
    /// Its revision: it grows each time a bundle moves.
    pub revision: u64,
    /// The strategy (`pack`, `spread`, `strict-pack`, `strict-spread`).
    pub strategy: String,
    /// Every bundle of the group.
    pub bundles: Vec<Resources>,
    /// The node of each bundle at this revision (empty: not placed).
    pub nodes: Vec<MemberName>,
    /// Labels a node must have.
    pub selector: BTreeMap<String, String>,
    /// The node that created it and its incarnation; `None` for a group
    /// that outlives its creator.
    pub owner: Option<MemberRef>,
    /// The head's seal over every field above (a keyed MAC only the head
    /// can make, made again for each revision it sends): a restarted head
    /// adopts a group a member reports holding only if its seal checks, so
    /// no member can make it adopt a group it never created, or a bundle
    /// the head never put on that member. Empty until sealed.
    pub seal: Vec<u8>,
}

/// One operation of the head on a node's ledger.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum LedgerOp {
    /// Set aside these bundles of the group (all or none).
    Prepare {
        /// The group as it will be once committed.
        record: GroupRecord,
        /// The bundles for this node.
        bundles: Vec<u32>,
    },
    /// Make the prepared bundles of the group at this revision held.
    Commit {
        /// The group's id.
        group: GroupId,
        /// Its revision.
        revision: u64,
    },
    /// Give back these bundles of the group (every one when empty).
    Release {
        /// The group's id.
        group: GroupId,
        /// The bundles; empty means all.
        bundles: Vec<u32>,
    },
}

/// What a ledger operation came to.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, thiserror::Error)]
pub enum LedgerReply {
    /// Done.
    #[error("done")]
    Done,
    /// The bundles do not fit in what the node has left.
    #[error("{resource}: {need} asked, {left} left of {capacity}")]
    Short {
        /// The resource.
        resource: String,
        /// What the bundles need together.
        need: f64,
        /// What the node has left.
        left: f64,
        /// Its capacity.
        capacity: f64,
    },
    /// A prepare names a bundle the group does not have.
    #[error("the group has no bundle {0}")]
    NoSuchBundle(u32),
    /// A commit of bundles that are not prepared at that revision.
    #[error("nothing prepared for that group at that revision")]
    NotPrepared,
    /// Only the head may change a node's reservations.
    #[error("NODE-AUTH-012: only the head may reserve a node's resources")]
    NotHead,
}

/// Whether an entry is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prepared,
    Committed,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    resources: Resources,
    phase: Phase,
    revision: u64,
}

/// A node's reservations against its capacity.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    capacity: Resources,
    /// Entries by (group, bundle).
    entries: BTreeMap<(GroupId, u32), Entry>,
    /// The latest record of each group with an entry here.
    records: BTreeMap<GroupId, GroupRecord>,
}

impl Ledger {
    /// An empty ledger of a node offering `capacity`.
    pub fn new(capacity: Resources) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// What the node offers.
    pub fn capacity(&self) -> &Resources {
        &self.capacity
    }

    /// What every entry (prepared or committed) sets aside, by resource.
    pub fn reserved(&self) -> Resources {
        let mut sum = Resources::new();
        for e in self.entries.values() {
            for (r, n) in &e.resources {
                *sum.entry(r.clone()).or_insert(0.0) += n;
            }
        }
        sum
    }

    /// Applies one operation of the head.
    pub fn apply(&mut self, op: LedgerOp) -> LedgerReply {
        match op {
            LedgerOp::Prepare { record, bundles } => self.prepare(record, &bundles),
            LedgerOp::Commit { group, revision } => self.commit(&group, revision),
            LedgerOp::Release { group, bundles } => {
                self.release(&group, &bundles);
                LedgerReply::Done
            }
        }
    }

    fn prepare(&mut self, record: GroupRecord, bundles: &[u32]) -> LedgerReply {
        let new: Vec<u32> = bundles
            .iter()
            .copied()
            .filter(|b| !self.entries.contains_key(&(record.id.clone(), *b)))
            .collect();
        let mut need = Resources::new();
        for b in &new {
            let Some(r) = record.bundles.get(*b as usize) else {
                return LedgerReply::NoSuchBundle(*b);
            };
            for (name, n) in r {
                *need.entry(name.clone()).or_insert(0.0) += n;
            }
        }
        let reserved = self.reserved();
        for (name, n) in &need {
            if *n <= EPS {
                continue;
            }
            let capacity = self.capacity.get(name).copied().unwrap_or(0.0);
            let left = capacity - reserved.get(name).copied().unwrap_or(0.0);
            if left + EPS < *n {
                return LedgerReply::Short {
                    resource: name.clone(),
                    need: *n,
                    left,
                    capacity,
                };
            }
        }
        for b in new {
            let resources = record.bundles[b as usize].clone();
            self.entries.insert(
                (record.id.clone(), b),
                Entry {
                    resources,
                    phase: Phase::Prepared,
                    revision: record.revision,
                },
            );
        }
        let keep = self
            .records
            .get(&record.id)
            .is_some_and(|r| r.revision > record.revision);
        if !keep {
            self.records.insert(record.id.clone(), record);
        }
        LedgerReply::Done
    }

    fn commit(&mut self, group: &str, revision: u64) -> LedgerReply {
        let mut any = false;
        for ((g, _), e) in self.entries.iter_mut() {
            if g == group && e.revision == revision {
                e.phase = Phase::Committed;
                any = true;
            }
        }
        if any {
            LedgerReply::Done
        } else {
            LedgerReply::NotPrepared
        }
    }

    fn release(&mut self, group: &str, bundles: &[u32]) {
        self.entries
            .retain(|(g, b), _| g != group || !(bundles.is_empty() || bundles.contains(b)));
        if !self.entries.keys().any(|(g, _)| g == group) {
            self.records.remove(group);
        }
    }

    /// Drops every prepared entry (a two-phase reservation the head will
    /// not finish: this node is joining a head again) and returns what the
    /// node holds: each group's latest record with the bundles held here.
    pub fn rejoin(&mut self) -> Vec<Held> {
        self.entries.retain(|_, e| e.phase == Phase::Committed);
        let groups: Vec<GroupId> = self.records.keys().cloned().collect();
        for g in groups {
            if !self.entries.keys().any(|(eg, _)| *eg == g) {
                self.records.remove(&g);
            }
        }
        self.held()
    }

    /// What the node holds: each group's latest record with the bundles
    /// committed here.
    pub fn held(&self) -> Vec<Held> {
        self.records
            .values()
            .filter_map(|record| {
                let bundles: Vec<u32> = self
                    .entries
                    .iter()
                    .filter(|((g, _), e)| *g == record.id && e.phase == Phase::Committed)
                    .map(|((_, b), _)| *b)
                    .collect();
                (!bundles.is_empty()).then(|| Held {
                    record: record.clone(),
                    bundles,
                })
            })
            .collect()
    }
}

/// Bundles of one group that a node holds, as it reports them on joining.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Held {
    /// The group, as the node last heard of it.
    pub record: GroupRecord,
    /// The bundles held here.
    pub bundles: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(pairs: &[(&str, f64)]) -> Resources {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn record(id: &str, revision: u64, bundles: Vec<Resources>) -> GroupRecord {
        GroupRecord {
            seal: Vec::new(),
            id: id.into(),
            revision,
            strategy: "pack".into(),
            nodes: vec!["n1".into(); bundles.len()],
            bundles,
            selector: BTreeMap::new(),
            owner: None,
        }
    }

    #[test]
    fn a_prepare_that_does_not_fit_is_refused_and_sets_nothing_aside() {
        let mut l = Ledger::new(res(&[("cpu", 2.0)]));
        let r = record("g", 1, vec![res(&[("cpu", 1.5)]), res(&[("cpu", 1.0)])]);
        let reply = l.apply(LedgerOp::Prepare {
            record: r.clone(),
            bundles: vec![0, 1],
        });
        assert_eq!(
            reply,
            LedgerReply::Short {
                resource: "cpu".into(),
                need: 2.5,
                left: 2.0,
                capacity: 2.0
            }
        );
        assert!(l.reserved().is_empty());
        let reply = l.apply(LedgerOp::Prepare {
            record: r,
            bundles: vec![0],
        });
        assert_eq!(reply, LedgerReply::Done);
        assert_eq!(l.reserved()["cpu"], 1.5);
    }

    #[test]
    fn prepare_commit_release_round_trip_and_are_idempotent() {
        let mut l = Ledger::new(res(&[("cpu", 2.0)]));
        let r = record("g", 1, vec![res(&[("cpu", 1.0)]), res(&[("cpu", 1.0)])]);
        let prepare = LedgerOp::Prepare {
            record: r,
            bundles: vec![0, 1],
        };
        assert_eq!(l.apply(prepare.clone()), LedgerReply::Done);
        assert_eq!(
            l.apply(prepare),
            LedgerReply::Done,
            "a repeat changes nothing"
        );
        assert_eq!(l.reserved()["cpu"], 2.0);
        assert!(l.held().is_empty(), "prepared is not held");
        let commit = LedgerOp::Commit {
            group: "g".into(),
            revision: 1,
        };
        assert_eq!(
            l.apply(LedgerOp::Commit {
                group: "g".into(),
                revision: 2
            }),
            LedgerReply::NotPrepared
        );
        assert_eq!(l.apply(commit.clone()), LedgerReply::Done);
        assert_eq!(l.apply(commit), LedgerReply::Done);
        assert_eq!(l.held()[0].bundles, vec![0, 1]);
        l.apply(LedgerOp::Release {
            group: "g".into(),
            bundles: vec![1],
        });
        assert_eq!(l.reserved()["cpu"], 1.0);
        l.apply(LedgerOp::Release {
            group: "g".into(),
            bundles: vec![],
        });
        l.apply(LedgerOp::Release {
            group: "other".into(),
            bundles: vec![],
        });
        assert!(l.reserved().is_empty());
        assert!(l.held().is_empty());
    }

    #[test]
    fn rejoining_drops_prepared_entries_and_reports_the_latest_record() {
        let mut l = Ledger::new(res(&[("cpu", 4.0)]));
        l.apply(LedgerOp::Prepare {
            record: record("a", 1, vec![res(&[("cpu", 1.0)])]),
            bundles: vec![0],
        });
        l.apply(LedgerOp::Commit {
            group: "a".into(),
            revision: 1,
        });
        // Bundle 1 of `a` moved here at revision 2.
        let mut moved = record("a", 2, vec![res(&[("cpu", 1.0)]), res(&[("cpu", 1.0)])]);
        moved.nodes = vec!["n1".into(), "n1".into()];
        l.apply(LedgerOp::Prepare {
            record: moved.clone(),
            bundles: vec![1],
        });
        l.apply(LedgerOp::Commit {
            group: "a".into(),
            revision: 2,
        });
        l.apply(LedgerOp::Prepare {
            record: record("b", 1, vec![res(&[("cpu", 1.0)])]),
            bundles: vec![0],
        });
        let held = l.rejoin();
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].record, moved);
        assert_eq!(held[0].bundles, vec![0, 1]);
        assert_eq!(l.reserved()["cpu"], 2.0, "b's prepared bundle is dropped");
    }
}
