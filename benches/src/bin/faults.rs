//! What a fault costs the embed job (`flotilla_embed::job::run`, what
//! `node embed` runs, in this process): the same corpus run clean and with
//! the fault, in the same run, alternating, the median of each.
//!
//! - one poison row: one text makes the actor's model thread panic on any
//!   batch holding it (failpoint `embedder::poison`). The job splits the
//!   batch until the row is isolated; the other rows are embedded.
//! - one straggler: the first actor started answers 10 times slower than
//!   its model (failpoint `embedder::slow`). The job sends its straggling
//!   batches again to the others when they are idle. Compared with the
//!   clean job and with the clean job on the other actors alone: what the
//!   slow actor costs against not having it.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin faults -- --texts 2048 --runs 3
//! ```

use anyhow::Context;
use clap::Parser;
use flotilla_benches::{median, write_jsonl};
use flotilla_embed::job::JobConfig;

/// The allocator the `node` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The mark the poison row's text holds.
const MARK: &str = "POISON-ROW";

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    corpus: flotilla_benches::CorpusArgs,
    /// Embedding actors.
    #[arg(long, default_value_t = 2)]
    actors: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Runs of each case (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// What one run of the job did.
struct Run {
    wall: f64,
    texts: u64,
    restarts: u64,
    isolated: u64,
    split: u64,
    hedged: u64,
}

/// The job over `input` on `actors` actors with the failpoints `points`
/// (`name=actions;…`; an empty string: none).
async fn job(
    args: &Args,
    input: &std::path::Path,
    actors: usize,
    points: &str,
) -> anyhow::Result<Run> {
    let out = input.with_extension("out");
    let _ = std::fs::remove_dir_all(&out);
    let mut config = JobConfig::new(
        input.to_string_lossy(),
        out.to_string_lossy(),
        args.corpus.model.clone(),
    );
    config.job.actors_per_node = Some(actors);
    config.job.batch_size = args.batch_size;
    config.device = flotilla_embed::DeviceChoice::Cpu;
    for name in ["embedder::poison", "embedder::slow"] {
        flotilla::fail::cfg(name, "off").map_err(anyhow::Error::msg)?;
    }
    for point in points.split(';').filter(|p| !p.is_empty()) {
        let (name, actions) = point
            .split_once('=')
            .context("a failpoint is name=actions")?;
        flotilla::fail::cfg(name, actions).map_err(anyhow::Error::msg)?;
    }
    let started = std::time::Instant::now();
    let summary = flotilla_embed::job::run(config)
        .await
        .with_context(|| format!("the job with {points:?}"))?;
    let run = Run {
        wall: started.elapsed().as_secs_f64(),
        texts: summary.job.rows,
        restarts: summary.job.restarts,
        isolated: summary.job.isolated,
        split: summary.job.split,
        hedged: summary.job.hedged,
    };
    std::fs::remove_dir_all(&out)?;
    Ok(run)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rows = args.corpus.read()?;
    anyhow::ensure!(rows.len() >= 64, "the corpus has {} texts", rows.len());
    let scratch = std::env::temp_dir().join(format!("flotilla-faults-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let (clean, poisoned) = (scratch.join("clean.jsonl"), scratch.join("poisoned.jsonl"));
    write_jsonl(&clean, &rows)?;
    let mut bad = rows.clone();
    let middle = bad.len() / 2;
    bad[middle].1.push_str(&format!(" {MARK}"));
    write_jsonl(&poisoned, &bad)?;
    println!(
        "faults: {} texts, model {}, {} actors, batches of {}, {} runs each, alternating\n",
        rows.len(),
        args.corpus.model.display(),
        args.actors,
        args.batch_size,
        args.runs
    );
    let n = args.actors;
    job(&args, &clean, n, "").await?;

    let poison = format!("embedder::poison=return({MARK})");
    let slow = "embedder::slow=1*return(10)->off";
    let (mut base, mut poisoned_walls, mut slowed, mut fewer) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut last_poison, mut last_slow) = (None, None);
    for _ in 0..args.runs {
        base.push(job(&args, &clean, n, "").await?.wall);
        let run = job(&args, &poisoned, n, &poison).await?;
        anyhow::ensure!(
            run.isolated == 1 && run.texts == rows.len() as u64 - 1,
            "the poison run embedded {} texts and isolated {}",
            run.texts,
            run.isolated
        );
        poisoned_walls.push(run.wall);
        last_poison = Some(run);
        let run = job(&args, &clean, n, slow).await?;
        anyhow::ensure!(
            run.texts == rows.len() as u64,
            "the straggler run lost texts"
        );
        slowed.push(run.wall);
        last_slow = Some(run);
        fewer.push(job(&args, &clean, n - 1, "").await?.wall);
    }
    let (poison_run, slow_run) = (last_poison.context("no run")?, last_slow.context("no run")?);
    let (base, poisoned, slowed, fewer) = (
        median(&mut base),
        median(&mut poisoned_walls),
        median(&mut slowed),
        median(&mut fewer),
    );
    let change = |wall: f64, of: f64| format!("{:+.1}%", (wall / of - 1.0) * 100.0);
    println!(
        "| case | actors | wall (median) | against clean | texts embedded | actor restarts | batches split | sent again |"
    );
    println!("| --- | ---: | --- | --- | --- | ---: | ---: | ---: |");
    println!(
        "| clean | {n} | {base:.2} s | - | {} | 0 | 0 | 0 |",
        rows.len()
    );
    println!(
        "| one poison row | {n} | {poisoned:.2} s | {} | {} (1 isolated) | {} | {} | - |",
        change(poisoned, base),
        poison_run.texts,
        poison_run.restarts,
        poison_run.split
    );
    println!(
        "| one actor 10x slower | {n} | {slowed:.2} s | {} | {} | 0 | 0 | {} (last run) |",
        change(slowed, base),
        slow_run.texts,
        slow_run.hedged
    );
    println!(
        "| clean, without the slow actor | {} | {fewer:.2} s | {} | {} | 0 | 0 | 0 |",
        n - 1,
        change(fewer, base),
        rows.len()
    );
    println!(
        "\nthe slow actor against not having it: {}",
        change(slowed, fewer)
    );
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}
