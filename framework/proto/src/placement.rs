//! The placement solver: where the bundles of a placement group go, given
//! what each node has available, after Ray's placement-group strategies.
//!
//! ```text
//!   STRICT_PACK    every bundle on one node, or Infeasible
//!   STRICT_SPREAD  every bundle on a node of its own, or Infeasible
//!   PACK           as few nodes as any placement can use
//!   SPREAD         as many distinct nodes as any placement can use
//! ```
//!
//! A placement never gives a node more than it has available, and only
//! uses nodes whose labels match the group's selector. PACK and SPREAD
//! are solved exactly (a bounded search) on groups of at most
//! [`EXACT_NODES`] nodes and [`EXACT_BUNDLES`] bundles, within
//! [`EXACT_BUDGET`] node trials; past that they fall back to greedy
//! placements (first fit by decreasing size for PACK, least-used node
//! first for SPREAD), still never oversubscribing. STRICT_SPREAD is a bipartite matching
//! (exact at any size). The result depends only on the inputs: the same
//! table gives the same placement.

use crate::ids::MemberName;
use std::collections::BTreeMap;

/// Amounts of named resources (`cpu`, `gpu`, `memory_mb`, custom ones).
pub type Resources = BTreeMap<String, f64>;

/// How a group's bundles are spread over nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// As few nodes as possible.
    Pack,
    /// As many distinct nodes as possible.
    Spread,
    /// All on one node, or fail.
    StrictPack,
    /// Each on its own node, or fail.
    StrictSpread,
}

impl Strategy {
    /// Its name on the command line (`pack`, `spread`, `strict-pack`,
    /// `strict-spread`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pack => "pack",
            Self::Spread => "spread",
            Self::StrictPack => "strict-pack",
            Self::StrictSpread => "strict-spread",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "pack" => Ok(Self::Pack),
            "spread" => Ok(Self::Spread),
            "strict-pack" => Ok(Self::StrictPack),
            "strict-spread" => Ok(Self::StrictSpread),
            _ => Err(format!(
                "unknown placement {s:?} (pack, spread, strict-pack or strict-spread)"
            )),
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `NAME=AMOUNT`, the amount a number.
pub fn parse_amount(s: &str) -> Result<(String, f64), String> {
    let (name, amount) = s
        .split_once('=')
        .ok_or_else(|| format!("resource {s:?} is not NAME=AMOUNT"))?;
    let amount: f64 = amount
        .trim()
        .parse()
        .map_err(|_| format!("resource {s:?}: {amount:?} is not a number"))?;
    Ok((name.trim().to_owned(), amount))
}

/// What a bundle asks for, as `NAME=AMOUNT[,NAME=AMOUNT…]`: at least one
/// resource, amounts finite and not negative.
pub fn parse_bundle(s: &str) -> Result<Resources, String> {
    let mut out = Resources::new();
    for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, amount) = parse_amount(pair)?;
        if !amount.is_finite() || amount < 0.0 {
            return Err(format!(
                "resource {pair:?}: amounts are finite and not negative"
            ));
        }
        out.insert(name, amount);
    }
    if out.is_empty() {
        return Err("no resource given".into());
    }
    Ok(out)
}

/// A node as the solver sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its name.
    pub name: MemberName,
    /// What it has available (capacity less what is reserved).
    pub available: Resources,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// A placement group to place.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// What each bundle needs.
    pub bundles: Vec<Resources>,
    /// How to spread them.
    pub strategy: Strategy,
    /// Labels a node must have (all of them, with these values).
    pub selector: BTreeMap<String, String>,
}

/// Why a group cannot be placed now.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Infeasible {
    /// The group has no bundle.
    #[error("the group has no bundle")]
    Empty,
    /// No node matches the selector.
    #[error("no up node has the labels {0:?}")]
    NoMatchingNode(BTreeMap<String, String>),
    /// One bundle fits on no node.
    #[error(
        "bundle {bundle} needs {resource}={need} but the most any node has available is {most} ({nodes})"
    )]
    BundleTooLarge {
        /// The bundle's index.
        bundle: usize,
        /// The resource short everywhere.
        resource: String,
        /// What the bundle needs.
        need: f64,
        /// The most available on one node.
        most: f64,
        /// `name=available` of each matching node.
        nodes: String,
    },
    /// The bundles do not fit together under the strategy.
    #[error("the {strategy} group of {bundles} bundles does not fit: {why}")]
    DoesNotFit {
        /// The strategy.
        strategy: &'static str,
        /// How many bundles.
        bundles: usize,
        /// Which resource is short where.
        why: String,
    },
}

/// Node trials the exact search of PACK and SPREAD may make before it
/// settles for the greedy placement.
pub const EXACT_BUDGET: usize = 200_000;
/// The most eligible nodes the exact search is tried on.
pub const EXACT_NODES: usize = 64;
/// The most bundles the exact search is tried on.
pub const EXACT_BUNDLES: usize = 32;

/// A tolerance for fractional amounts.
const EPS: f64 = 1e-9;

fn fits(need: &Resources, left: &Resources) -> bool {
    need.iter()
        .all(|(r, n)| *n <= EPS || left.get(r).copied().unwrap_or(0.0) + EPS >= *n)
}

fn take(left: &mut Resources, need: &Resources) {
    for (r, n) in need {
        *left.entry(r.clone()).or_insert(0.0) -= n;
    }
}

fn give(left: &mut Resources, need: &Resources) {
    for (r, n) in need {
        *left.entry(r.clone()).or_insert(0.0) += n;
    }
}

fn total(bundles: &[Resources]) -> Resources {
    let mut sum = Resources::new();
    for b in bundles {
        give(&mut sum, b);
    }
    sum
}

/// A bundle's size, for ordering: the sum of its amounts.
fn weight(b: &Resources) -> f64 {
    b.values().sum()
}

/// Where each bundle of `group` goes (a node name per bundle, in bundle
/// order), among `nodes`.
pub fn place(nodes: &[Candidate], group: &Group) -> Result<Vec<MemberName>, Infeasible> {
    if group.bundles.is_empty() {
        return Err(Infeasible::Empty);
    }
    let mut eligible: Vec<&Candidate> = nodes
        .iter()
        .filter(|n| {
            group
                .selector
                .iter()
                .all(|(k, v)| n.labels.get(k) == Some(v))
        })
        .collect();
    eligible.sort_by(|a, b| a.name.cmp(&b.name));
    if eligible.is_empty() {
        return Err(Infeasible::NoMatchingNode(group.selector.clone()));
    }
    for (i, b) in group.bundles.iter().enumerate() {
        if !eligible.iter().any(|n| fits(b, &n.available)) {
            let (resource, need) = b
                .iter()
                .find(|(r, n)| {
                    eligible
                        .iter()
                        .all(|c| c.available.get(*r).copied().unwrap_or(0.0) + EPS < **n)
                })
                .map(|(r, n)| (r.clone(), *n))
                .unwrap_or_else(|| ("resources".into(), weight(b)));
            let most = eligible
                .iter()
                .map(|c| c.available.get(&resource).copied().unwrap_or(0.0))
                .fold(0.0, f64::max);
            let nodes = eligible
                .iter()
                .map(|c| {
                    format!(
                        "{}={}",
                        c.name,
                        c.available.get(&resource).copied().unwrap_or(0.0)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Infeasible::BundleTooLarge {
                bundle: i,
                resource,
                need,
                most,
                nodes,
            });
        }
    }
    let names = |idx: Vec<usize>| idx.into_iter().map(|i| eligible[i].name.clone()).collect();
    let does_not_fit = |why: String| Infeasible::DoesNotFit {
        strategy: group.strategy.as_str(),
        bundles: group.bundles.len(),
        why,
    };
    let left: Vec<Resources> = eligible.iter().map(|n| n.available.clone()).collect();
    match group.strategy {
        Strategy::StrictPack => {
            let sum = total(&group.bundles);
            // The node that fits them all with the least to spare.
            eligible
                .iter()
                .enumerate()
                .filter(|(_, n)| fits(&sum, &n.available))
                .min_by(|(_, a), (_, b)| {
                    let spare = |n: &Candidate| weight(&n.available) - weight(&sum);
                    spare(a).total_cmp(&spare(b))
                })
                .map(|(i, _)| names(vec![i; group.bundles.len()]))
                .ok_or_else(|| does_not_fit(shortage(&sum, &eligible)))
        }
        Strategy::StrictSpread => {
            strict_spread(&group.bundles, &left)
                .map(names)
                .ok_or_else(|| {
                    let fit: Vec<&str> = eligible
                        .iter()
                        .filter(|n| group.bundles.iter().any(|b| fits(b, &n.available)))
                        .map(|n| n.name.as_str())
                        .collect();
                    does_not_fit(format!(
                        "it needs {} distinct nodes each fitting its bundle; {} of the {} matching nodes fit one ({})",
                        group.bundles.len(),
                        fit.len(),
                        eligible.len(),
                        fit.join(", ")
                    ))
                })
        }
        Strategy::Pack | Strategy::Spread => {
            let spread = group.strategy == Strategy::Spread;
            let small = left.len() <= EXACT_NODES && group.bundles.len() <= EXACT_BUNDLES;
            let solved = if small {
                exact(&group.bundles, &left, spread)
            } else {
                None
            };
            let found = match solved {
                Some(found) => found,
                None if spread => greedy_spread(&group.bundles, &left),
                None => greedy_pack(&group.bundles, &left),
            };
            found
                .map(names)
                .ok_or_else(|| does_not_fit(shortage(&total(&group.bundles), &eligible)))
        }
    }
}

/// Which resources of `need` the nodes lack together.
fn shortage(need: &Resources, nodes: &[&Candidate]) -> String {
    let short: Vec<String> = need
        .iter()
        .map(|(r, n)| {
            let have: f64 = nodes
                .iter()
                .map(|c| c.available.get(r).copied().unwrap_or(0.0))
                .sum();
            let most = nodes
                .iter()
                .map(|c| c.available.get(r).copied().unwrap_or(0.0))
                .fold(0.0, f64::max);
            format!("{r}: {n} needed, {have} available in all, at most {most} on one node")
        })
        .collect();
    short.join("; ")
}

/// Each bundle on a distinct node: a bipartite matching (augmenting
/// paths, nodes tried in name order).
fn strict_spread(bundles: &[Resources], left: &[Resources]) -> Option<Vec<usize>> {
    if bundles.len() > left.len() {
        return None;
    }
    let mut owner: Vec<Option<usize>> = vec![None; left.len()];
    fn augment(
        b: usize,
        bundles: &[Resources],
        left: &[Resources],
        seen: &mut [bool],
        owner: &mut [Option<usize>],
    ) -> bool {
        for n in 0..left.len() {
            if seen[n] || !fits(&bundles[b], &left[n]) {
                continue;
            }
            seen[n] = true;
            if owner[n].is_none_or(|o| augment(o, bundles, left, seen, owner)) {
                owner[n] = Some(b);
                return true;
            }
        }
        false
    }
    for b in 0..bundles.len() {
        // A free node that fits first; a path that frees one otherwise.
        if let Some(n) =
            (0..left.len()).find(|n| owner[*n].is_none() && fits(&bundles[b], &left[*n]))
        {
            owner[n] = Some(b);
            continue;
        }
        let mut seen = vec![false; left.len()];
        if !augment(b, bundles, left, &mut seen, &mut owner) {
            return None;
        }
    }
    let mut out = vec![0; bundles.len()];
    for (n, o) in owner.iter().enumerate() {
        if let Some(b) = o {
            out[*b] = n;
        }
    }
    Some(out)
}

/// The best placement by an exhaustive search (fewest distinct nodes for
/// PACK, most for SPREAD; ties to the first found, nodes in name order),
/// or `None` when it ran past the budget. `Some(None)`: nothing fits.
fn exact(bundles: &[Resources], left: &[Resources], spread: bool) -> Option<Option<Vec<usize>>> {
    struct Search<'a> {
        bundles: &'a [Resources],
        order: Vec<usize>,
        left: Vec<Resources>,
        uses: Vec<usize>,
        assign: Vec<usize>,
        best: Option<(usize, Vec<usize>)>,
        spread: bool,
        steps: usize,
        /// A placement with this many distinct nodes cannot be beaten.
        goal: usize,
    }
    impl Search<'_> {
        fn distinct(&self) -> usize {
            self.uses.iter().filter(|u| **u > 0).count()
        }
        /// False once out of budget.
        fn go(&mut self, k: usize) -> bool {
            if self.best.as_ref().is_some_and(|(b, _)| *b == self.goal) {
                return true;
            }
            let used = self.distinct();
            if let Some((best, _)) = &self.best {
                let remaining = self.order.len() - k;
                let bound_ok = if self.spread {
                    used + remaining.min(self.uses.iter().filter(|u| **u == 0).count()) > *best
                } else {
                    used < *best
                };
                if !bound_ok {
                    return true;
                }
            }
            if k == self.order.len() {
                self.best = Some((used, self.assign.clone()));
                return true;
            }
            let b = self.order[k];
            // Try every node: the most used first for PACK, the least used
            // first for SPREAD (so the first placement found is already a
            // balanced one).
            let mut tries: Vec<usize> = (0..self.left.len()).collect();
            if self.spread {
                tries.sort_by_key(|n| self.uses[*n]);
            } else {
                tries.sort_by_key(|n| std::cmp::Reverse(self.uses[*n]));
            }
            for n in tries {
                self.steps += 1;
                if self.steps > EXACT_BUDGET {
                    return false;
                }
                if !fits(&self.bundles[b], &self.left[n]) {
                    continue;
                }
                take(&mut self.left[n], &self.bundles[b]);
                self.uses[n] += 1;
                self.assign[b] = n;
                let ok = self.go(k + 1);
                self.uses[n] -= 1;
                give(&mut self.left[n], &self.bundles[b]);
                if !ok {
                    return false;
                }
            }
            true
        }
    }
    let order = largest_first(bundles);
    let goal = if spread {
        bundles.len().min(left.len())
    } else {
        fewest_nodes_possible(bundles, left)
    };
    let mut s = Search {
        bundles,
        order,
        left: left.to_vec(),
        uses: vec![0; left.len()],
        assign: vec![0; bundles.len()],
        best: None,
        spread,
        steps: 0,
        goal,
    };
    if !s.go(0) {
        return None;
    }
    Some(s.best.map(|(_, a)| a))
}

/// A lower bound on the nodes any placement needs: for each resource, the
/// fewest nodes whose largest amounts add up to the bundles' total.
fn fewest_nodes_possible(bundles: &[Resources], left: &[Resources]) -> usize {
    let need = total(bundles);
    let mut bound = 1;
    for (r, n) in &need {
        let mut have: Vec<f64> = left
            .iter()
            .map(|l| l.get(r).copied().unwrap_or(0.0))
            .collect();
        have.sort_by(|a, b| b.total_cmp(a));
        let mut sum = 0.0;
        let mut k = 0;
        for h in have {
            if sum + EPS >= *n {
                break;
            }
            sum += h;
            k += 1;
        }
        bound = bound.max(k);
    }
    bound
}

/// Bundle indices, the largest first (ties in bundle order).
fn largest_first(bundles: &[Resources]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..bundles.len()).collect();
    order.sort_by(|a, b| {
        weight(&bundles[*b])
            .total_cmp(&weight(&bundles[*a]))
            .then(a.cmp(b))
    });
    order
}

/// First fit by decreasing size, on the nodes already used first.
fn greedy_pack(bundles: &[Resources], left: &[Resources]) -> Option<Vec<usize>> {
    let mut left = left.to_vec();
    let order = largest_first(bundles);
    let mut used: Vec<bool> = vec![false; left.len()];
    let mut out = vec![0; bundles.len()];
    for b in order {
        let n = (0..left.len())
            .filter(|n| used[*n])
            .chain((0..left.len()).filter(|n| !used[*n]))
            .find(|n| fits(&bundles[b], &left[*n]))?;
        take(&mut left[n], &bundles[b]);
        used[n] = true;
        out[b] = n;
    }
    Some(out)
}

/// Each bundle, largest first, on the fitting node holding the fewest
/// bundles so far (then the most available).
fn greedy_spread(bundles: &[Resources], left: &[Resources]) -> Option<Vec<usize>> {
    let mut left = left.to_vec();
    let order = largest_first(bundles);
    let mut count = vec![0usize; left.len()];
    let mut out = vec![0; bundles.len()];
    for b in order {
        let n = (0..left.len())
            .filter(|n| fits(&bundles[b], &left[*n]))
            .min_by(|x, y| {
                count[*x]
                    .cmp(&count[*y])
                    .then(weight(&left[*y]).total_cmp(&weight(&left[*x])))
                    .then(x.cmp(y))
            })?;
        take(&mut left[n], &bundles[b]);
        count[n] += 1;
        out[b] = n;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};
    use proptest::strategy::Strategy as Gen;

    fn res(pairs: &[(&str, f64)]) -> Resources {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn node(name: &str, cpu: f64) -> Candidate {
        Candidate {
            name: name.into(),
            available: res(&[("cpu", cpu)]),
            labels: BTreeMap::new(),
        }
    }

    fn group(strategy: Strategy, cpus: &[f64]) -> Group {
        Group {
            bundles: cpus.iter().map(|c| res(&[("cpu", *c)])).collect(),
            strategy,
            selector: BTreeMap::new(),
        }
    }

    fn distinct(p: &[MemberName]) -> usize {
        p.iter().collect::<std::collections::BTreeSet<_>>().len()
    }

    #[test]
    fn each_strategy_places_as_it_promises() {
        let nodes = [
            node("a", 2.0),
            node("b", 2.0),
            node("c", 2.0),
            node("d", 2.0),
        ];
        let pack = place(&nodes, &group(Strategy::Pack, &[1.0, 1.0, 1.0, 1.0])).unwrap();
        assert_eq!(distinct(&pack), 2);
        let spread = place(&nodes, &group(Strategy::Spread, &[1.0; 6])).unwrap();
        assert_eq!(distinct(&spread), 4);
        let strict = place(&nodes, &group(Strategy::StrictPack, &[1.0, 1.0])).unwrap();
        assert_eq!(distinct(&strict), 1);
        let apart = place(&nodes, &group(Strategy::StrictSpread, &[2.0; 4])).unwrap();
        assert_eq!(distinct(&apart), 4);
        assert_eq!(
            place(&nodes, &group(Strategy::Pack, &[1.0, 1.0, 1.0, 1.0])).unwrap(),
            pack,
            "the same table, the same placement"
        );
    }

    #[test]
    fn infeasible_groups_say_what_is_short_where() {
        let nodes = [node("a", 2.0), node("b", 1.5)];
        let e = place(&nodes, &group(Strategy::Spread, &[3.0])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bundle 0 needs cpu=3 but the most any node has available is 2 (a=2, b=1.5)"
        );
        let e = place(&nodes, &group(Strategy::StrictSpread, &[1.0; 3])).unwrap_err();
        assert!(e.to_string().contains("needs 3 distinct nodes"), "{e}");
        let e = place(&nodes, &group(Strategy::StrictPack, &[1.5, 1.5])).unwrap_err();
        assert!(
            e.to_string()
                .contains("cpu: 3 needed, 3.5 available in all, at most 2 on one node"),
            "{e}"
        );
        let e = place(&nodes, &group(Strategy::Pack, &[1.5, 1.5, 1.0])).unwrap_err();
        assert!(matches!(e, Infeasible::DoesNotFit { .. }), "{e}");
        assert_eq!(
            place(&nodes, &group(Strategy::Pack, &[])),
            Err(Infeasible::Empty)
        );
        let mut g = group(Strategy::Pack, &[1.0]);
        g.selector.insert("zone".into(), "b".into());
        assert!(matches!(
            place(&nodes, &g),
            Err(Infeasible::NoMatchingNode(_))
        ));
    }

    #[test]
    fn the_selector_keeps_bundles_to_matching_nodes() {
        let mut a = node("a", 4.0);
        a.labels.insert("zone".into(), "x".into());
        let mut b = node("b", 4.0);
        b.labels.insert("zone".into(), "y".into());
        let mut g = group(Strategy::Spread, &[1.0, 1.0]);
        g.selector.insert("zone".into(), "y".into());
        assert_eq!(place(&[a, b], &g).unwrap(), ["b", "b"]);
    }

    #[test]
    fn a_thousand_bundles_on_a_thousand_nodes_are_placed_at_once() {
        let nodes: Vec<Candidate> = (0..1000).map(|i| node(&format!("n{i:04}"), 2.0)).collect();
        for (strategy, used) in [
            (Strategy::Pack, 500),
            (Strategy::Spread, 1000),
            (Strategy::StrictSpread, 1000),
        ] {
            let p = place(&nodes, &group(strategy, &[1.0; 1000])).unwrap();
            assert_eq!(distinct(&p), used, "{strategy:?}");
        }
    }

    #[test]
    fn large_groups_fall_back_to_greedy_placements_that_never_oversubscribe() {
        let nodes: Vec<Candidate> = (0..200).map(|i| node(&format!("n{i:03}"), 4.0)).collect();
        let g = group(Strategy::Pack, &[1.0; 300]);
        let p = place(&nodes, &g).unwrap();
        assert_eq!(distinct(&p), 75, "first fit fills nodes one by one");
        let g = group(Strategy::Spread, &[1.0; 300]);
        let p = place(&nodes, &g).unwrap();
        assert_eq!(distinct(&p), 200);
        let mut per: BTreeMap<&MemberName, usize> = BTreeMap::new();
        for n in &p {
            *per.entry(n).or_default() += 1;
        }
        assert!(per.values().all(|c| *c <= 2));
    }

    /// Every assignment of bundles to nodes that fits.
    fn brute_force(nodes: &[Candidate], bundles: &[Resources]) -> Vec<Vec<usize>> {
        let (n, b) = (nodes.len(), bundles.len());
        let mut out = Vec::new();
        let mut assign = vec![0usize; b];
        loop {
            let mut left: Vec<Resources> = nodes.iter().map(|c| c.available.clone()).collect();
            let mut ok = true;
            for (i, node) in assign.iter().enumerate() {
                if !fits(&bundles[i], &left[*node]) {
                    ok = false;
                    break;
                }
                take(&mut left[*node], &bundles[i]);
            }
            if ok {
                out.push(assign.clone());
            }
            let mut i = 0;
            loop {
                if i == b {
                    return out;
                }
                assign[i] += 1;
                if assign[i] < n {
                    break;
                }
                assign[i] = 0;
                i += 1;
            }
        }
    }

    fn strategy() -> impl Gen<Value = Strategy> {
        proptest::prop_oneof![
            proptest::strategy::Just(Strategy::Pack),
            proptest::strategy::Just(Strategy::Spread),
            proptest::strategy::Just(Strategy::StrictPack),
            proptest::strategy::Just(Strategy::StrictSpread),
        ]
    }

    proptest! {
        /// Against every assignment of small groups to small clusters: the
        /// solver never oversubscribes, fails only when nothing meets the
        /// strategy, and PACK / SPREAD reach the fewest / most distinct
        /// nodes any placement reaches.
        #[test]
        fn placements_match_brute_force(
            caps in proptest::collection::vec((0u8..5, 0u8..3), 1..5),
            needs in proptest::collection::vec((0u8..4, 0u8..2), 1..6),
            strategy in strategy(),
            seed in any::<u8>(),
        ) {
            let nodes: Vec<Candidate> = caps
                .iter()
                .enumerate()
                .map(|(i, (cpu, gpu))| Candidate {
                    name: format!("n{}", (i + seed as usize) % 7).into(),
                    available: res(&[("cpu", f64::from(*cpu) / 2.0), ("gpu", f64::from(*gpu))]),
                    labels: BTreeMap::new(),
                })
                .collect();
            let mut names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            if names.len() != nodes.len() {
                return Ok(());
            }
            let bundles: Vec<Resources> = needs
                .iter()
                .map(|(cpu, gpu)| res(&[("cpu", f64::from(*cpu) / 2.0), ("gpu", f64::from(*gpu))]))
                .collect();
            let g = Group { bundles: bundles.clone(), strategy, selector: BTreeMap::new() };
            let mut sorted = nodes.clone();
            sorted.sort_by(|a, b| a.name.cmp(&b.name));
            let all = brute_force(&sorted, &bundles);
            let count = |a: &Vec<usize>| a.iter().collect::<std::collections::BTreeSet<_>>().len();
            let admissible: Vec<&Vec<usize>> = all
                .iter()
                .filter(|a| match strategy {
                    Strategy::StrictPack => count(a) == 1,
                    Strategy::StrictSpread => count(a) == bundles.len(),
                    _ => true,
                })
                .collect();
            match place(&nodes, &g) {
                Err(e) => prop_assert!(admissible.is_empty(), "{e} but {:?} fits", admissible.first()),
                Ok(p) => {
                    // Never oversubscribed.
                    let mut left: BTreeMap<&str, Resources> =
                        nodes.iter().map(|n| (n.name.as_str(), n.available.clone())).collect();
                    for (i, n) in p.iter().enumerate() {
                        let l = left.get_mut(n.as_str()).unwrap();
                        prop_assert!(fits(&bundles[i], l), "bundle {} oversubscribes {}", i, n);
                        take(l, &bundles[i]);
                    }
                    let used = distinct(&p);
                    match strategy {
                        Strategy::StrictPack => prop_assert_eq!(used, 1),
                        Strategy::StrictSpread => prop_assert_eq!(used, bundles.len()),
                        Strategy::Pack => prop_assert_eq!(Some(used), admissible.iter().map(|a| count(a)).min()),
                        Strategy::Spread => prop_assert_eq!(Some(used), admissible.iter().map(|a| count(a)).max()),
                    }
                    prop_assert_eq!(place(&nodes, &g).unwrap(), p, "deterministic");
                }
            }
        }
    }
}
