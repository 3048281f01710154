//! What a fault costs the embed job (`flotilla_embed::job::run`, what
//! `node embed` runs, in this process): the same corpus run clean and with
//! the fault, in the same run, alternating, the median of each.
//!
//! - `poison`: one text makes the actor's model thread panic on any batch
//!   holding it (failpoint `embedder::poison`). The job splits the batch
//!   until the row is isolated; the other rows are embedded.
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
}

/// The job over `input` with the failpoints `points` (an empty string: none).
async fn job(args: &Args, input: &std::path::Path, points: &str) -> anyhow::Result<Run> {
    let out = input.with_extension("out");
    let _ = std::fs::remove_dir_all(&out);
    let mut config = JobConfig::new(
        input.to_string_lossy(),
        out.to_string_lossy(),
        args.corpus.model.clone(),
    );
    config.job.actors_per_node = Some(args.actors);
    config.job.batch_size = args.batch_size;
    config.device = flotilla_embed::DeviceChoice::Cpu;
    flotilla::fail::cfg(
        "embedder::poison",
        if points.is_empty() { "off" } else { points },
    )
    .map_err(anyhow::Error::msg)?;
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
    job(&args, &clean, "").await?;

    let poison = format!("return({MARK})");
    let (mut base, mut faulty) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..args.runs {
        base.push(job(&args, &clean, "").await?.wall);
        let run = job(&args, &poisoned, &poison).await?;
        anyhow::ensure!(
            run.isolated == 1 && run.texts == rows.len() as u64 - 1,
            "the poison run embedded {} texts and isolated {}",
            run.texts,
            run.isolated
        );
        faulty.push(run.wall);
        last = Some(run);
    }
    let run = last.context("no run")?;
    let (base, faulty) = (median(&mut base), median(&mut faulty));
    println!("| case | wall (median) | texts embedded | actor restarts | batches split |");
    println!("| --- | --- | --- | --- | --- |");
    println!("| clean | {base:.2} s | {} | 0 | 0 |", rows.len());
    println!(
        "| one poison row | {faulty:.2} s ({:+.1}%) | {} (1 isolated) | {} | {} |",
        (faulty / base - 1.0) * 100.0,
        run.texts,
        run.restarts,
        run.split
    );
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}
