//! How `node status` shows what it gathered: the JSON document of
//! `node status --json` and the text tables, kept out of the member table
//! itself.
//!
//! ```
//! use flotilla::render::{StatusReport, members_text};
//! use flotilla::Table;
//!
//! let table = Table { version: 3, head: "head".into(), ..Table::default() };
//! let doc: serde_json::Value = serde_json::from_str(&StatusReport::new(table.clone()).to_json()).unwrap();
//! assert_eq!(doc["head"], "head");
//! assert_eq!(doc["version"], 3);
//! assert!(members_text(&table).starts_with("NAME"));
//! ```

use std::collections::BTreeMap;

use flotilla_proto::control::{GpuReport, SupervisorReport};
use flotilla_proto::ids::MemberName;
use flotilla_proto::membership::MemberView;
use flotilla_proto::objects::ObjectStats;
use serde::Serialize;

use crate::table::Table;

/// Each node's supervisors as `node status` asked them: the reports, or
/// why the node did not answer.
pub type Supervisors = BTreeMap<MemberName, Result<Vec<SupervisorReport>, String>>;

/// Each node's object-store counters, by node name, for the nodes that
/// answered.
pub type ObjectCounts = BTreeMap<MemberName, ObjectStats>;

/// Each node's GPUs and the actors holding them, by node name, for the
/// nodes that answered.
pub type GpuHolders = BTreeMap<MemberName, Vec<GpuReport>>;

/// Amounts of resources by name.
type Amounts = BTreeMap<String, f64>;

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
    resources: &'a Amounts,
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

/// Everything `node status` gathered: the member table, and what each
/// node answered as far as it was asked.
#[derive(Debug, Clone, Default)]
pub struct StatusReport {
    /// The member table, as the head answered it.
    pub table: Table,
    /// Each node's supervisors (`Err`: why the node did not answer).
    pub supervisors: Supervisors,
    /// The head's placement accounts, when the head answered.
    pub placement: Option<PlacementStatus>,
    /// Each node's object-store counters.
    pub objects: ObjectCounts,
    /// Each node's GPUs and their holders.
    pub gpus: GpuHolders,
    /// Milliseconds since the head last heard from each member, when it
    /// answered.
    pub heard: BTreeMap<MemberName, u64>,
}

impl StatusReport {
    /// A report of the member table alone.
    pub fn new(table: Table) -> Self {
        Self {
            table,
            ..Self::default()
        }
    }

    /// The status document printed by `node status --json`: each node with
    /// its supervisors and, when the head answered, its `capacity`,
    /// `reserved` and `available` resources and the placement groups, and
    /// each node's object-store counters (`objects`) and GPUs with their
    /// holders (`gpus`: index and holders of each) as far as it answered.
    pub fn to_json(&self) -> String {
        let doc = Doc {
            head: &self.table.head,
            version: self.table.version,
            nodes: self.table.members.iter().map(|m| self.node(m)).collect(),
            groups: self
                .placement
                .as_ref()
                .map(|p| p.groups.iter().map(GroupJson::from).collect()),
        };
        serde_json::to_string(&doc).expect("status document serializes")
    }

    /// The whole text of `node status`: the members, then placement, GPUs
    /// and supervisors as far as they were gathered.
    pub fn to_text(&self) -> String {
        let mut out = members_text(&self.table);
        if let Some(p) = &self.placement {
            out.push_str(&placement_text(p));
        }
        out.push_str(&gpus_text(&self.gpus));
        out.push_str(&supervisors_text(&self.supervisors));
        out
    }

    fn node<'a>(&'a self, m: &'a MemberView) -> NodeJson<'a> {
        let (supervisors, supervisors_error) = match self.supervisors.get(&m.name) {
            None => (None, None),
            Some(Err(e)) => (None, Some(e.clone())),
            Some(Ok(list)) => (Some(list.iter().map(SupervisorJson::from).collect()), None),
        };
        let account = self
            .placement
            .as_ref()
            .and_then(|p| p.nodes.iter().find(|a| a.name == m.name));
        NodeJson {
            supervisors,
            supervisors_error,
            capacity: account.map(|a| a.capacity.clone()),
            reserved: account.map(|a| a.reserved.clone()),
            available: account.map(|a| a.available()),
            name: &m.name,
            addr: &m.addr,
            bulk_addr: &m.bulk_addr,
            host: &m.host,
            objects: self.objects.get(&m.name).map(ObjectsJson::from),
            heard_ms_ago: self.heard.get(&m.name).copied(),
            gpus: self.gpus.get(&m.name).map(|list| {
                list.iter()
                    .map(|g| GpuJson {
                        index: g.index,
                        holders: &g.holders,
                    })
                    .collect()
            }),
            state: m.state.as_str(),
            role: m.role.as_str(),
            incarnation: m.incarnation.get(),
            resources: ResourcesJson {
                cpus: m.resources.cpus,
                memory_bytes: m.resources.memory_bytes,
                gpus: m.resources.gpus,
                labels: &m.resources.labels,
                custom: &m.resources.custom,
            },
            actors: m.actors,
        }
    }
}

#[derive(Serialize)]
struct Doc<'a> {
    head: &'a str,
    version: u64,
    nodes: Vec<NodeJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<Vec<GroupJson<'a>>>,
}

#[derive(Serialize)]
struct NodeJson<'a> {
    name: &'a str,
    addr: &'a str,
    bulk_addr: &'a str,
    host: &'a str,
    state: &'static str,
    role: &'static str,
    incarnation: u64,
    resources: ResourcesJson<'a>,
    actors: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    heard_ms_ago: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    supervisors: Option<Vec<SupervisorJson<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    supervisors_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<Amounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reserved: Option<Amounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    available: Option<Amounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    objects: Option<ObjectsJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus: Option<Vec<GpuJson<'a>>>,
}

#[derive(Serialize)]
struct ResourcesJson<'a> {
    cpus: u32,
    memory_bytes: u64,
    gpus: u32,
    labels: &'a BTreeMap<String, String>,
    custom: &'a Amounts,
}

#[derive(Serialize)]
struct SupervisorJson<'a> {
    name: &'a str,
    strategy: &'a str,
    gave_up: bool,
    max_restarts: u32,
    within_s: f64,
    /// Restarts it may still take within its window, as the wall clock
    /// reads now.
    restarts_left: u32,
    children: Vec<ChildJson<'a>>,
}

/// Restarts `s` may still take before it gives up, at `now_unix_ms`: its
/// intensity less the restarts it reported that are still in its window.
pub fn restarts_left(s: &SupervisorReport, now_unix_ms: u64) -> u32 {
    let counted = s
        .restarts_unix_ms
        .iter()
        .filter(|&&t| now_unix_ms.saturating_sub(t) < s.within_ms)
        .count();
    s.max_restarts
        .saturating_sub(u32::try_from(counted).unwrap_or(u32::MAX))
}

/// Milliseconds since the Unix epoch on this machine's wall clock.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl<'a> From<&'a SupervisorReport> for SupervisorJson<'a> {
    fn from(s: &'a SupervisorReport) -> Self {
        Self {
            name: &s.name,
            strategy: &s.strategy,
            gave_up: s.gave_up,
            max_restarts: s.max_restarts,
            within_s: s.within_ms as f64 / 1000.0,
            restarts_left: restarts_left(s, wall_ms()),
            children: s
                .children
                .iter()
                .map(|c| ChildJson {
                    id: &c.id,
                    running: c.running,
                    restarts: c.restarts,
                    epoch: c.epoch.micros(),
                    node: c.node.as_deref(),
                    last_exit: c.last_exit.as_deref(),
                })
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct ChildJson<'a> {
    id: &'a str,
    running: bool,
    restarts: u32,
    epoch: u64,
    node: Option<&'a str>,
    last_exit: Option<&'a str>,
}

#[derive(Serialize)]
struct GpuJson<'a> {
    index: u32,
    holders: &'a [String],
}

#[derive(Serialize)]
struct ObjectsJson {
    count: u64,
    bytes: u64,
    capacity: u64,
    puts: u64,
    local_gets: u64,
    remote_pulls: u64,
    pulled_bytes: u64,
    waits: u64,
}

impl From<&ObjectStats> for ObjectsJson {
    fn from(o: &ObjectStats) -> Self {
        Self {
            count: o.count,
            bytes: o.bytes,
            capacity: o.capacity,
            puts: o.puts,
            local_gets: o.local_gets,
            remote_pulls: o.remote_pulls,
            pulled_bytes: o.pulled_bytes,
            waits: o.waits,
        }
    }
}

/// The members part of `node status`: the nodes that host work, then
/// (under `DRIVERS AND TOOLS`) the members of other roles.
pub fn members_text(table: &Table) -> String {
    let (workers, drivers) = table.split_by_role();
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

/// The placement part of `node status`: each node's capacity,
/// reserved and available resources, then each group with the node of
/// every bundle.
pub fn placement_text(placement: &PlacementStatus) -> String {
    let amounts = |r: &Amounts| {
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
                        "{node}: supervisor {} ({}, {state}, {} of {} restarts left in {} s)\n",
                        s.name,
                        s.strategy,
                        restarts_left(s, wall_ms()),
                        s.max_restarts,
                        s.within_ms / 1000
                    ));
                    for c in &s.children {
                        out.push_str(&format!(
                            "  {:<24} {:<8} restarts {:>3}{}{}\n",
                            c.id,
                            if c.running { "running" } else { "stopped" },
                            c.restarts,
                            c.node
                                .as_deref()
                                .map(|n| format!("  on {n}"))
                                .unwrap_or_default(),
                            c.last_exit
                                .as_deref()
                                .map(|w| format!("  last exit: {w}"))
                                .unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(max_restarts: u32, restarts_unix_ms: Vec<u64>) -> SupervisorReport {
        SupervisorReport {
            name: "tree".into(),
            strategy: "one_for_one".into(),
            gave_up: false,
            max_restarts,
            within_ms: 60_000,
            restarts_unix_ms,
            children: Vec::new(),
        }
    }

    /// Restarts older than the window when read no longer count; more
    /// than the intensity leaves none.
    #[test]
    fn restarts_left_counts_those_still_in_the_window_when_read() {
        let now = 1_000_000;
        let s = report(3, vec![now - 70_000, now - 30_000, now - 1_000]);
        assert_eq!(restarts_left(&s, now), 1);
        assert_eq!(restarts_left(&s, now + 30_000), 2);
        assert_eq!(restarts_left(&s, now + 60_000), 3);
        assert_eq!(restarts_left(&report(1, vec![now; 4]), now), 0);
        let json = serde_json::to_value(SupervisorJson::from(&s)).unwrap();
        assert_eq!(
            (json["max_restarts"].as_u64(), json["within_s"].as_f64()),
            (Some(3), Some(60.0))
        );
    }
}
