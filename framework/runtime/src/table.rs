//! The member table as a node knows it.

use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::membership::{MemberState, MemberView};

/// The member table as last known by a node: authoritative on the head,
/// pushed by the head to every member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Version of the head's table.
    pub version: u64,
    /// Name of the head.
    pub head: MemberName,
    /// Every member, sorted by name.
    pub members: Vec<MemberView>,
    /// Serial numbers of revoked certificates (normalised, sorted), as the
    /// head last handed them out.
    pub revoked: Vec<Vec<u8>>,
}

impl Table {
    /// Applies members received from the head: the whole table, or the
    /// members that changed (each replacing its entry, names kept sorted).
    pub fn apply(&mut self, update: flotilla_proto::member::TableUpdate) {
        self.version = update.version;
        self.head = update.head;
        if let Some(revoked) = update.revoked {
            self.revoked = revoked;
        }
        if update.whole {
            self.members = update.members;
            return;
        }
        for name in &update.removed {
            if let Ok(i) = self.members.binary_search_by(|e| e.name.cmp(name)) {
                self.members.remove(i);
            }
        }
        for m in update.members {
            match self.members.binary_search_by(|e| e.name.cmp(&m.name)) {
                Ok(i) => self.members[i] = m,
                Err(i) => self.members.insert(i, m),
            }
        }
    }

    /// Members currently up: those that take new work (a draining member
    /// is live but not up).
    pub fn up(&self) -> impl Iterator<Item = &MemberView> {
        self.members.iter().filter(|m| m.state == MemberState::Up)
    }

    /// Members whose process runs: up or draining.
    pub fn live(&self) -> impl Iterator<Item = &MemberView> {
        self.members.iter().filter(|m| m.state.is_live())
    }

    /// What the table holds of `name`: its incarnation and whether it is
    /// live, up or draining (see
    /// [`flotilla_proto::hello::check_incarnation`]).
    pub fn known(&self, name: &str) -> Option<(Incarnation, bool)> {
        self.get(name).map(|m| (m.incarnation, m.state.is_live()))
    }

    /// One member by name.
    pub fn get(&self, name: &str) -> Option<&MemberView> {
        self.members
            .binary_search_by(|m| m.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.members[i])
    }

    /// What an hour of member `name` costs, as it publishes it (`node join
    /// --price-per-hour`), if it does.
    pub fn price_per_hour(&self, name: &str) -> Option<f64> {
        self.get(name)?
            .resources
            .labels
            .get(flotilla_proto::job_stats::PRICE_LABEL)?
            .parse()
            .ok()
    }

    /// Whether the certificate with serial `serial` (normalised) is
    /// revoked.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.revoked
            .binary_search_by(|r| r.as_slice().cmp(serial))
            .is_ok()
    }

    /// Members that host work (workers and the head), and those that do
    /// not (drivers, admins and tools, by their certificates' roles).
    pub fn split_by_role(&self) -> (Vec<&MemberView>, Vec<&MemberView>) {
        self.members
            .iter()
            .partition(|m| m.role.may_offer_resources())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::member::TableUpdate;
    use flotilla_proto::resources::Resources;

    fn member(name: &str, state: MemberState) -> MemberView {
        MemberView {
            name: name.into(),
            addr: String::new(),
            bulk_addr: String::new(),
            host: String::new(),
            incarnation: Incarnation::new(1),
            state,
            resources: Resources::default(),
            actors: 0,
            role: flotilla_proto::role::Role::Worker,
            drain_within_ms: 0,
        }
    }

    #[test]
    fn changes_replace_entries_and_keep_names_sorted() {
        let mut t = Table::default();
        t.apply(TableUpdate {
            version: 2,
            head: "h".into(),
            whole: true,
            members: vec![member("a", MemberState::Up), member("c", MemberState::Up)],
            removed: Vec::new(),
            revoked: Some(vec![vec![1, 2], vec![3]]),
        });
        t.apply(TableUpdate {
            version: 4,
            head: "h".into(),
            whole: false,
            members: vec![member("b", MemberState::Up), member("c", MemberState::Down)],
            removed: Vec::new(),
            revoked: None,
        });
        let names: Vec<&str> = t.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(t.is_revoked(&[3]) && t.is_revoked(&[1, 2]) && !t.is_revoked(&[2]));
        assert_eq!(t.get("b").unwrap().name, "b");
        assert!(t.get("bb").is_none());
        t.apply(TableUpdate {
            version: 5,
            head: "h".into(),
            whole: false,
            members: Vec::new(),
            removed: vec!["a".into(), "zz".into()],
            revoked: None,
        });
        let names: Vec<&str> = t.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["b", "c"], "a forgotten member is dropped");
        assert_eq!(t.get("c").unwrap().state, MemberState::Down);
        assert_eq!(t.version, 5);
    }
}
