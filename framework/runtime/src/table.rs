//! The member table as a node knows it, and its JSON form for `node status`.

use std::collections::BTreeMap;

use flotilla_proto::control::{GpuReport, SupervisorReport};
use flotilla_proto::membership::{MemberState, MemberView};

/// Each node's supervisors as `node status` asked them: the reports, or
/// why the node did not answer.
pub type Supervisors = BTreeMap<String, Result<Vec<SupervisorReport>, String>>;

/// Each node's object-store counters, by node name, for the nodes that
/// answered.
pub type ObjectCounts = BTreeMap<String, flotilla_proto::objects::ObjectStats>;

/// Each node's GPUs and the actors holding them, by node name, for the
/// nodes that answered.
pub type GpuHolders = BTreeMap<String, Vec<GpuReport>>;
use serde::Serialize;

/// What the head accounts for placement: every group and every up node's
/// capacity and reservations.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlacementStatus {
    /// The groups, in creation order.
    pub groups: Vec<flotilla_proto::groups::GroupView>,
    /// The up nodes' accounts.
    pub nodes: Vec<flotilla_proto::groups::NodeAccount>,
}

/// A placement group as `node status --json` (and `node jobs --json`)
/// show it: `{id, state, strategy, revision, owner, why, bundles:
/// [{resources, node}]}`.
#[derive(Debug, Serialize)]
pub struct GroupJson<'a> {
    id: &'a str,
    state: &'static str,
    strategy: &'a str,
    revision: u64,
    owner: Option<&'a str>,
    why: Option<&'a str>,
    bundles: Vec<BundleJson<'a>>,
}

/// One bundle of a [`GroupJson`].
#[derive(Debug, Serialize)]
pub struct BundleJson<'a> {
    resources: &'a BTreeMap<String, f64>,
    node: Option<&'a str>,
}

impl<'a> From<&'a flotilla_proto::groups::GroupView> for GroupJson<'a> {
    fn from(g: &'a flotilla_proto::groups::GroupView) -> Self {
        Self {
            id: &g.id,
            state: g.state.as_str(),
            strategy: &g.strategy,
            revision: g.revision,
            owner: g.owner.as_deref(),
            why: g.why.as_deref(),
            bundles: g
                .bundles
                .iter()
                .zip(&g.nodes)
                .map(|(r, n)| BundleJson {
                    resources: r,
                    node: (!n.is_empty()).then_some(n.as_str()),
                })
                .collect(),
        }
    }
}

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
        self.members
            .binary_search_by(|m| m.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.members[i])
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

    /// The status document printed by `node status --json`.
    pub fn to_json(&self) -> String {
        self.to_json_with(&BTreeMap::new())
    }

    /// The status document with each node's supervisors, as far as they
    /// were asked (`Err`: why the node did not answer).
    pub fn to_json_with(&self, supervisors: &Supervisors) -> String {
        self.to_json_full(supervisors, None, &ObjectCounts::new(), &GpuHolders::new())
    }

    /// The status document with each node's supervisors and, when the
    /// head answered, each node's `capacity`, `reserved` and `available`
    /// resources and the placement groups, and each node's object-store
    /// counters (`objects`) and GPUs with their holders (`gpus`: index and
    /// holders of each) as far as it answered.
    pub fn to_json_full(
        &self,
        supervisors: &Supervisors,
        placement: Option<&PlacementStatus>,
        objects: &ObjectCounts,
        gpus: &GpuHolders,
    ) -> String {
        type Amounts = std::collections::BTreeMap<String, f64>;
        let account = |name: &str| -> (Option<Amounts>, Option<Amounts>, Option<Amounts>) {
            let Some(a) = placement.and_then(|p| p.nodes.iter().find(|a| a.name == name)) else {
                return (None, None, None);
            };
            (
                Some(a.capacity.clone()),
                Some(a.reserved.clone()),
                Some(a.available()),
            )
        };
        let groups = placement.map(|p| p.groups.iter().map(GroupJson::from).collect::<Vec<_>>());
        #[derive(Serialize)]
        struct Child<'a> {
            id: &'a str,
            running: bool,
            restarts: u32,
            epoch: u64,
            node: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Sup<'a> {
            name: &'a str,
            strategy: &'a str,
            gave_up: bool,
            children: Vec<Child<'a>>,
        }
        let sups = |name: &str| -> (Option<Vec<Sup<'_>>>, Option<String>) {
            match supervisors.get(name) {
                None => (None, None),
                Some(Err(e)) => (None, Some(e.clone())),
                Some(Ok(list)) => (
                    Some(
                        list.iter()
                            .map(|s| Sup {
                                name: &s.name,
                                strategy: &s.strategy,
                                gave_up: s.gave_up,
                                children: s
                                    .children
                                    .iter()
                                    .map(|c| Child {
                                        id: &c.id,
                                        running: c.running,
                                        restarts: c.restarts,
                                        epoch: c.epoch,
                                        node: c.node.as_deref(),
                                    })
                                    .collect(),
                            })
                            .collect(),
                    ),
                    None,
                ),
            }
        };
        #[derive(Serialize)]
        struct Resources<'a> {
            cpus: u32,
            memory_bytes: u64,
            gpus: u32,
            labels: &'a std::collections::BTreeMap<String, String>,
            custom: &'a std::collections::BTreeMap<String, f64>,
        }
        #[derive(Serialize)]
        struct Node<'a> {
            name: &'a str,
            addr: &'a str,
            bulk_addr: &'a str,
            host: &'a str,
            state: &'static str,
            role: &'static str,
            incarnation: u64,
            resources: Resources<'a>,
            actors: u32,
            #[serde(skip_serializing_if = "Option::is_none")]
            supervisors: Option<Vec<Sup<'a>>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            supervisors_error: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            capacity: Option<Amounts>,
            #[serde(skip_serializing_if = "Option::is_none")]
            reserved: Option<Amounts>,
            #[serde(skip_serializing_if = "Option::is_none")]
            available: Option<Amounts>,
            #[serde(skip_serializing_if = "Option::is_none")]
            objects: Option<Objects>,
            #[serde(skip_serializing_if = "Option::is_none")]
            gpus: Option<Vec<Gpu<'a>>>,
        }
        #[derive(Serialize)]
        struct Gpu<'a> {
            index: u32,
            holders: &'a [String],
        }
        #[derive(Serialize)]
        struct Objects {
            count: u64,
            bytes: u64,
            capacity: u64,
            puts: u64,
            local_gets: u64,
            remote_pulls: u64,
            pulled_bytes: u64,
            waits: u64,
        }
        #[derive(Serialize)]
        struct Doc<'a> {
            head: &'a str,
            version: u64,
            nodes: Vec<Node<'a>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            groups: Option<Vec<GroupJson<'a>>>,
        }
        let doc = Doc {
            head: &self.head,
            version: self.version,
            nodes: self
                .members
                .iter()
                .map(|m| {
                    let (supervisors, supervisors_error) = sups(&m.name);
                    let (capacity, reserved, available) = account(&m.name);
                    Node {
                        supervisors,
                        supervisors_error,
                        capacity,
                        reserved,
                        available,
                        name: &m.name,
                        addr: &m.addr,
                        bulk_addr: &m.bulk_addr,
                        host: &m.host,
                        objects: objects.get(&m.name).map(|o| Objects {
                            count: o.count,
                            bytes: o.bytes,
                            capacity: o.capacity,
                            puts: o.puts,
                            local_gets: o.local_gets,
                            remote_pulls: o.remote_pulls,
                            pulled_bytes: o.pulled_bytes,
                            waits: o.waits,
                        }),
                        gpus: gpus.get(&m.name).map(|list| {
                            list.iter()
                                .map(|g| Gpu {
                                    index: g.index,
                                    holders: &g.holders,
                                })
                                .collect()
                        }),
                        state: m.state.as_str(),
                        role: m.role.as_str(),
                        incarnation: m.incarnation,
                        resources: Resources {
                            cpus: m.resources.cpus,
                            memory_bytes: m.resources.memory_bytes,
                            gpus: m.resources.gpus,
                            labels: &m.resources.labels,
                            custom: &m.resources.custom,
                        },
                        actors: m.actors,
                    }
                })
                .collect(),
            groups,
        };
        serde_json::to_string(&doc).expect("status document serializes")
    }

    /// The placement part of `node status`: each node's capacity,
    /// reserved and available resources, then each group with the node of
    /// every bundle.
    pub fn placement_text(placement: &PlacementStatus) -> String {
        let amounts = |r: &std::collections::BTreeMap<String, f64>| {
            let s: Vec<String> = r
                .iter()
                .filter(|(_, v)| v.abs() > 1e-9)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if s.is_empty() {
                "-".to_owned()
            } else {
                s.join(",")
            }
        };
        let mut out = format!(
            "{:<16} {:<28} {:<20} {}\n",
            "NODE", "CAPACITY", "RESERVED", "AVAILABLE"
        );
        for a in &placement.nodes {
            let available = a.available();
            out.push_str(&format!(
                "{:<16} {:<28} {:<20} {}\n",
                a.name,
                amounts(&a.capacity),
                amounts(&a.reserved),
                amounts(&available)
            ));
        }
        for g in &placement.groups {
            out.push_str(&format!(
                "group {} {} {} revision {}{}{}\n",
                g.id,
                g.strategy,
                g.state.as_str(),
                g.revision,
                g.owner
                    .as_deref()
                    .map(|o| format!(" owner {o}"))
                    .unwrap_or_default(),
                g.why
                    .as_deref()
                    .map(|w| format!(": {w}"))
                    .unwrap_or_default()
            ));
            for (i, (r, n)) in g.bundles.iter().zip(&g.nodes).enumerate() {
                let node = if n.is_empty() { "(none)" } else { n.as_str() };
                out.push_str(&format!("  bundle {i:<3} {:<20} on {node}\n", amounts(r)));
            }
        }
        out
    }

    /// The GPUs part of `node status`: one line per GPU with its holders.
    pub fn gpus_text(gpus: &GpuHolders) -> String {
        let mut out = String::new();
        for (node, list) in gpus {
            for g in list {
                let holders = if g.holders.is_empty() {
                    "(free)".to_owned()
                } else {
                    g.holders.join(", ")
                };
                out.push_str(&format!("{node}: gpu {:<3} {holders}\n", g.index));
            }
        }
        out
    }

    /// The supervisors part of `node status`: one line per child.
    pub fn supervisors_text(supervisors: &Supervisors) -> String {
        let mut out = String::new();
        for (node, answer) in supervisors {
            match answer {
                Err(e) => out.push_str(&format!("{node}: supervisors unknown: {e}\n")),
                Ok(list) => {
                    for s in list {
                        let state = if s.gave_up { "gave up" } else { "running" };
                        out.push_str(&format!(
                            "{node}: supervisor {} ({}, {state})\n",
                            s.name, s.strategy
                        ));
                        for c in &s.children {
                            out.push_str(&format!(
                                "  {:<24} {:<8} restarts {:>3}{}\n",
                                c.id,
                                if c.running { "running" } else { "stopped" },
                                c.restarts,
                                c.node
                                    .as_deref()
                                    .map(|n| format!("  on {n}"))
                                    .unwrap_or_default()
                            ));
                        }
                    }
                }
            }
        }
        out
    }

    /// A human-readable table for `node status`: the nodes that host work,
    /// then (under `DRIVERS AND TOOLS`) the members of other roles.
    pub fn to_text(&self) -> String {
        let (workers, drivers) = self.split_by_role();
        let mut out = format!(
            "{:<16} {:<22} {:<5} {:>5} {:>9} {:>4} {:>6}  {:<18} {}\n",
            "NAME", "ADDR", "STATE", "CPUS", "MEM GiB", "GPUS", "ACTORS", "INCARNATION", "OTHER"
        );
        for m in workers {
            out.push_str(&format!(
                "{:<16} {:<22} {:<5} {:>5} {:>9.1} {:>4} {:>6}  {:<18} {}\n",
                m.name,
                m.addr,
                m.state.as_str(),
                m.resources.cpus,
                m.resources.memory_bytes as f64 / (1u64 << 30) as f64,
                m.resources.gpus,
                m.actors,
                m.incarnation,
                m.resources
                    .custom
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        if !drivers.is_empty() {
            out.push_str(&format!(
                "\nDRIVERS AND TOOLS\n{:<34} {:<22} {:<5} {:<8} {:>6}  {}\n",
                "NAME", "ADDR", "STATE", "ROLE", "ACTORS", "INCARNATION"
            ));
            for m in drivers {
                out.push_str(&format!(
                    "{:<34} {:<22} {:<5} {:<8} {:>6}  {}\n",
                    m.name,
                    m.addr,
                    m.state.as_str(),
                    m.role.as_str(),
                    m.actors,
                    m.incarnation
                ));
            }
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
            host: String::new(),
            incarnation: 1,
            state,
            resources: Resources::default(),
            actors: 0,
            role: flotilla_proto::role::Role::Worker,
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
