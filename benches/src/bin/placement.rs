//! Placement solver time: 1,000 nodes × 1,000 bundles (and smaller
//! groups, where the exact search runs) for each strategy, next to a
//! same-run floor: assigning bundles to nodes round robin, which checks
//! nothing.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin placement -- [--rounds 5]
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_proto::placement::{Candidate, Group, Strategy, place};

#[derive(Parser)]
struct Args {
    /// Timed runs per case (the median is printed).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

fn cluster(nodes: usize) -> Vec<Candidate> {
    (0..nodes)
        .map(|i| Candidate {
            name: format!("n{i:05}").into(),
            available: [("cpu".to_owned(), 4.0), ("memory_mb".to_owned(), 16_384.0)]
                .into_iter()
                .collect(),
            labels: BTreeMap::new(),
        })
        .collect()
}

fn group(bundles: usize, strategy: Strategy) -> Group {
    Group {
        bundles: (0..bundles)
            .map(|i| {
                [
                    ("cpu".to_owned(), if i % 3 == 0 { 2.0 } else { 1.0 }),
                    ("memory_mb".to_owned(), 1024.0),
                ]
                .into_iter()
                .collect()
            })
            .collect(),
        strategy,
        selector: BTreeMap::new(),
    }
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!("| nodes × bundles | strategy | solver | round-robin floor |");
    println!("| --- | --- | ---: | ---: |");
    for (nodes, bundles) in [(16, 8), (64, 32), (1000, 1000)] {
        let table = cluster(nodes);
        for strategy in [
            Strategy::Pack,
            Strategy::Spread,
            Strategy::StrictSpread,
            Strategy::StrictPack,
        ] {
            let g = group(bundles, strategy);
            let mut solver = Vec::new();
            let mut floor = Vec::new();
            let mut outcome = String::new();
            for _ in 0..args.rounds.max(1) {
                let t = Instant::now();
                let placed = place(&table, &g);
                solver.push(t.elapsed());
                outcome = match placed {
                    Ok(p) => {
                        let used: std::collections::BTreeSet<&flotilla::MemberName> =
                            p.iter().collect();
                        format!("{} nodes", used.len())
                    }
                    Err(e) => format!("infeasible: {e}"),
                };
                let t = Instant::now();
                let rr: Vec<&str> = (0..bundles)
                    .map(|i| table[i % table.len()].name.as_str())
                    .collect();
                std::hint::black_box(rr);
                floor.push(t.elapsed());
            }
            println!(
                "| {nodes} × {bundles} | {} ({outcome}) | {:.3} ms | {:.3} ms |",
                strategy.as_str(),
                median(solver).as_secs_f64() * 1e3,
                median(floor).as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}
