//! Which members a job has lost, from the member tables it sees, and
//! their actors removed from the pipeline.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flotilla::pipeline::{Pipeline, Stage};

/// How long a worker node may be missing from the member table (not down
/// or left: absent, as after a head restart, until it rejoins the new
/// head) before its workers are given up.
const ABSENT_GRACE: Duration = Duration::from_secs(15);

/// Which worker nodes the job has lost, from the member tables it sees. A
/// node `down`, `left` or `draining` is lost at once. A node absent from the table is
/// lost only once it has stayed absent for the grace: a restarted head
/// starts with an empty table that the members fill as they rejoin. Time
/// is passed in.
#[derive(Debug, Default)]
pub(crate) struct LostWorkers {
    /// Nodes absent from the last table, since when.
    absent: BTreeMap<String, Instant>,
}

/// What the table says of a worker node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Up,
    Gone,
    Absent,
}

impl LostWorkers {
    /// The nodes among `nodes` lost as of `now`, given what the table
    /// says of each.
    fn lost<'a>(
        &mut self,
        now: Instant,
        nodes: impl Iterator<Item = &'a str>,
        seen: impl Fn(&str) -> Seen,
    ) -> Vec<String> {
        let mut lost = Vec::new();
        let mut still_absent = BTreeMap::new();
        for node in nodes {
            match seen(node) {
                Seen::Up => {}
                Seen::Gone => lost.push(node.to_owned()),
                Seen::Absent => {
                    let since = self.absent.get(node).copied().unwrap_or(now);
                    if now.duration_since(since) >= ABSENT_GRACE {
                        lost.push(node.to_owned());
                    } else {
                        still_absent.insert(node.to_owned(), since);
                    }
                }
            }
        }
        self.absent = still_absent;
        lost
    }

    /// When the next absent node's grace ends, if any is absent.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.absent
            .values()
            .min()
            .map(|since| *since + ABSENT_GRACE)
    }
}

/// Removes the workers of every node the job has lost; their batches go to
/// the others.
pub(crate) fn drop_lost_workers<S: Stage>(
    pipeline: &mut Pipeline<S>,
    tracker: &mut LostWorkers,
    table: &flotilla::Table,
) {
    let seen = |node: &str| match table.get(node) {
        Some(m) if m.state == flotilla::MemberState::Up => Seen::Up,
        Some(_) => Seen::Gone,
        None => Seen::Absent,
    };
    let lost = tracker.lost(Instant::now(), pipeline.nodes(), seen);
    for node in lost {
        let actors = pipeline.remove_node(&node);
        let in_flight = pipeline.in_flight();
        if table
            .get(&node)
            .is_some_and(|m| m.state == flotilla::MemberState::Draining)
        {
            tracing::info!(%node, actors, in_flight, "member draining; its batches go to the other actors");
        } else {
            tracing::warn!(%node, actors, in_flight, "member lost; its batches go to the other actors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(up: &[&str], gone: &[&str]) -> impl Fn(&str) -> Seen {
        let (up, gone): (Vec<String>, Vec<String>) = (
            up.iter().map(|s| s.to_string()).collect(),
            gone.iter().map(|s| s.to_string()).collect(),
        );
        move |n: &str| {
            if up.iter().any(|u| u == n) {
                Seen::Up
            } else if gone.iter().any(|g| g == n) {
                Seen::Gone
            } else {
                Seen::Absent
            }
        }
    }

    #[test]
    fn a_node_down_or_left_is_lost_at_once() {
        let mut t = LostWorkers::default();
        let now = Instant::now();
        let lost = t.lost(now, ["w1", "w2"].into_iter(), seen(&["w1"], &["w2"]));
        assert_eq!(lost, vec!["w2".to_owned()]);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_node_absent_from_a_fresh_table_is_kept_for_the_grace() {
        // A restarted head's first table holds only the members that have
        // rejoined so far.
        let mut t = LostWorkers::default();
        let t0 = Instant::now();
        let nodes = ["w1", "w2"];
        assert!(t.lost(t0, nodes.into_iter(), seen(&["w1"], &[])).is_empty());
        assert_eq!(t.next_deadline(), Some(t0 + ABSENT_GRACE));
        // Still absent a little later: kept, and its grace still counts
        // from when it went missing.
        let t1 = t0 + Duration::from_secs(3);
        assert!(t.lost(t1, nodes.into_iter(), seen(&["w1"], &[])).is_empty());
        assert_eq!(t.next_deadline(), Some(t0 + ABSENT_GRACE));
        // It rejoins: nothing lost, nothing pending.
        let t2 = t0 + Duration::from_secs(5);
        assert!(
            t.lost(t2, nodes.into_iter(), seen(&["w1", "w2"], &[]))
                .is_empty()
        );
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_node_absent_past_the_grace_is_lost() {
        let mut t = LostWorkers::default();
        let t0 = Instant::now();
        assert!(t.lost(t0, ["w2"].into_iter(), seen(&[], &[])).is_empty());
        let lost = t.lost(t0 + ABSENT_GRACE, ["w2"].into_iter(), seen(&[], &[]));
        assert_eq!(lost, vec!["w2".to_owned()]);
        assert_eq!(t.next_deadline(), None);
    }
}
