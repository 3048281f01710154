//! The member table as a node knows it, and its JSON form for `node status`.

use flotilla_proto::membership::{MemberState, MemberView};
use serde::Serialize;

/// The member table as last known by a node: authoritative on the head,
/// pushed by the head to every member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Version of the head's table.
    pub version: u64,
    /// Name of the head.
    pub head: String,
    /// Every member, sorted by name.
    pub members: Vec<MemberView>,
}

impl Table {
    /// Applies members received from the head: the whole table, or the
    /// members that changed (each replacing its entry, names kept sorted).
    pub fn apply(&mut self, update: flotilla_proto::member::TableUpdate) {
        self.version = update.version;
        self.head = update.head;
        if update.whole {
            self.members = update.members;
            return;
        }
        for m in update.members {
            match self.members.binary_search_by(|e| e.name.cmp(&m.name)) {
                Ok(i) => self.members[i] = m,
                Err(i) => self.members.insert(i, m),
            }
        }
    }

    /// Members currently up.
    pub fn up(&self) -> impl Iterator<Item = &MemberView> {
        self.members.iter().filter(|m| m.state == MemberState::Up)
    }

    /// What the table holds of `name`: its incarnation and whether it is
    /// up (see [`flotilla_proto::hello::check_incarnation`]).
    pub fn known(&self, name: &str) -> Option<(u64, bool)> {
        self.get(name)
            .map(|m| (m.incarnation, m.state == MemberState::Up))
    }

    /// One member by name.
    pub fn get(&self, name: &str) -> Option<&MemberView> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The status document printed by `node status --json`.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Resources<'a> {
            cpus: u32,
            memory_bytes: u64,
            gpus: u32,
            labels: &'a std::collections::BTreeMap<String, String>,
        }
        #[derive(Serialize)]
        struct Node<'a> {
            name: &'a str,
            addr: &'a str,
            bulk_addr: &'a str,
            state: &'static str,
            incarnation: u64,
            resources: Resources<'a>,
            actors: u32,
        }
        #[derive(Serialize)]
        struct Doc<'a> {
            head: &'a str,
            version: u64,
            nodes: Vec<Node<'a>>,
        }
        let doc = Doc {
            head: &self.head,
            version: self.version,
            nodes: self
                .members
                .iter()
                .map(|m| Node {
                    name: &m.name,
                    addr: &m.addr,
                    bulk_addr: &m.bulk_addr,
                    state: m.state.as_str(),
                    incarnation: m.incarnation,
                    resources: Resources {
                        cpus: m.resources.cpus,
                        memory_bytes: m.resources.memory_bytes,
                        gpus: m.resources.gpus,
                        labels: &m.resources.labels,
                    },
                    actors: m.actors,
                })
                .collect(),
        };
        serde_json::to_string(&doc).expect("status document serializes")
    }

    /// A human-readable table for `node status`.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{:<16} {:<22} {:<5} {:>5} {:>9} {:>4} {:>6}  {}\n",
            "NAME", "ADDR", "STATE", "CPUS", "MEM GiB", "GPUS", "ACTORS", "INCARNATION"
        );
        for m in &self.members {
            out.push_str(&format!(
                "{:<16} {:<22} {:<5} {:>5} {:>9.1} {:>4} {:>6}  {}\n",
                m.name,
                m.addr,
                m.state.as_str(),
                m.resources.cpus,
                m.resources.memory_bytes as f64 / (1u64 << 30) as f64,
                m.resources.gpus,
                m.actors,
                m.incarnation
            ));
        }
        out
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
            incarnation: 1,
            state,
            resources: Resources::default(),
            actors: 0,
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
        });
        t.apply(TableUpdate {
            version: 4,
            head: "h".into(),
            whole: false,
            members: vec![member("b", MemberState::Up), member("c", MemberState::Down)],
        });
        let names: Vec<&str> = t.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(t.get("c").unwrap().state, MemberState::Down);
        assert_eq!(t.version, 4);
    }
}
