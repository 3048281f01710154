//! The embed job's CPU side alone: reading, parsing, tokenizing, batching,
//! routing to the actors and writing Parquet, with the forward pass not run
//! (each actor answers vectors of zeros of the model's width, and the job
//! records the revision as `zeros-no-forward:…`).
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin feed -- --model DIR --corpus FILE --texts 100000
//! ```
//!
//! For each core count (1, 2 and all this machine has, by default) the job
//! runs in this process (`flotilla_embed::job::run`, what `node embed` runs)
//! with as many actors, twice: on a quarter of the texts, then on all of
//! them (after a first job that warms the page cache and the allocator).
//! The rates are marginal (texts between the two runs over the time
//! between them), so the model's load and the job's start are left out:
//! texts per second, that per core, and texts per CPU-second of the whole
//! process (every thread: reader, driver, actors, writer). Tokenization
//! alone, on one thread over the same texts, is measured in the same run,
//! before and after the jobs: Hugging Face tokenizers (`encode`, text by
//! text: its fastest on one thread) and the tokenizer the job runs for the
//! folder (our own WordPiece for a plain BERT WordPiece, in batches of the
//! job's micro-batch). The last line reads `feed: N texts/s per core (…)`:
//! N is texts per CPU-second with every core.

use std::path::Path;

use anyhow::Context;
use clap::Parser;
use flotilla_benches::{JobRun, process_cpu, time_job, write_jsonl};
use flotilla_embed::job::{Format, JobConfig};

/// The allocator the `node` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    corpus: flotilla_benches::CorpusArgs,
    /// Core counts to run (one actor per core; `all`: this machine's).
    #[arg(long, value_delimiter = ',', default_value = "1,2,all")]
    cores: Vec<String>,
    /// Rows per batch.
    #[arg(long, default_value_t = flotilla_embed::job::DEFAULT_BATCH_SIZE)]
    batch_size: usize,
    /// Write JSONL parts instead of Parquet.
    #[arg(long)]
    jsonl: bool,
}

/// Runs the job over `input` with `actors` actors answering zeros into a
/// fresh folder under `scratch`.
async fn run_job(
    args: &Args,
    input: &Path,
    scratch: &Path,
    actors: usize,
) -> anyhow::Result<JobRun> {
    let stem = input.file_stem().unwrap_or_default().to_string_lossy();
    let output = scratch.join(format!("out-{actors}-{stem}"));
    let mut config = JobConfig::new(
        input.to_string_lossy(),
        output.to_string_lossy(),
        args.corpus.model.clone(),
    );
    config.job.actors_per_node = Some(actors);
    config.job.batch_size = args.batch_size;
    config.job.format = if args.jsonl {
        Format::Jsonl
    } else {
        Format::Parquet
    };
    config.zeros = true;
    time_job(config).await
}

/// Texts per CPU-second of the job's own tokenizer for the folder (our
/// WordPiece where it is a plain BERT WordPiece), on one thread, in
/// batches of the job's micro-batch; and which tokenizer that is.
fn job_tokenizer(model: &Path, texts: &[(String, String)]) -> anyhow::Result<(f64, &'static str)> {
    let tokenizer = flotilla_embed::ModelFolder::open(model)?.tokenizer()?;
    let which = if tokenizer.is_fast_wordpiece() {
        "our WordPiece"
    } else {
        "Hugging Face tokenizers"
    };
    let refs: Vec<&str> = texts.iter().map(|(_, t)| t.as_str()).collect();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let cpu0 = process_cpu();
        let mut tokens = 0usize;
        for batch in refs.chunks(flotilla_embed::job::DEFAULT_MICRO_BATCH) {
            tokens += tokenizer.tokenize(batch)?.real_tokens();
        }
        std::hint::black_box(tokens);
        best = best.max(texts.len() as f64 / (process_cpu() - cpu0).as_secs_f64());
    }
    Ok((best, which))
}

/// Hugging Face tokenizers on one thread over `texts`, as the folder's
/// `tokenizer.json` configures it: texts per CPU-second.
fn hf_tokenizers(model: &Path, texts: &[(String, String)]) -> anyhow::Result<f64> {
    let file = model.join("tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let cpu0 = process_cpu();
        let mut tokens = 0usize;
        for (_, text) in texts {
            let encoding = tokenizer
                .encode(text.as_str(), true)
                .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
            tokens += encoding.get_ids().len();
        }
        std::hint::black_box(tokens);
        best = best.max(texts.len() as f64 / (process_cpu() - cpu0).as_secs_f64());
    }
    Ok(best)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cores: Vec<usize> = args
        .cores
        .iter()
        .map(|c| match c.as_str() {
            "all" => Ok(all),
            n => n.parse().with_context(|| format!("--cores {n:?}")),
        })
        .collect::<anyhow::Result<_>>()?;
    cores.dedup();
    let rows = args.corpus.read()?;
    anyhow::ensure!(rows.len() >= 8, "the corpus has {} texts", rows.len());
    let scratch = std::env::temp_dir().join(format!("flotilla-feed-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let (small, large) = (scratch.join("quarter.jsonl"), scratch.join("all.jsonl"));
    write_jsonl(&small, &rows[..rows.len() / 4])?;
    write_jsonl(&large, &rows)?;
    let chars = rows.iter().map(|(_, t)| t.chars().count()).sum::<usize>() as f64;

    let hf_before = hf_tokenizers(&args.corpus.model, &rows)?;
    let (own_before, which) = job_tokenizer(&args.corpus.model, &rows)?;
    println!(
        "feed bench: {} texts of {:.0} characters on average, model {}, batches of {}, {} parts; forward pass not run (actors answer vectors of zeros)\n",
        rows.len(),
        chars / rows.len() as f64,
        args.corpus.model.display(),
        args.batch_size,
        if args.jsonl { "JSONL" } else { "Parquet" }
    );
    println!("| cores (actors) | texts/s | texts/s per core | texts per CPU-second |");
    println!("| ---: | ---: | ---: | ---: |");
    // A first job warms the page cache and the allocator.
    run_job(&args, &small, &scratch, 1).await?;
    let mut last = None;
    for &n in &cores {
        let a = run_job(&args, &small, &scratch, n).await?;
        let b = run_job(&args, &large, &scratch, n).await?;
        let (rate, per_cpu) = b.marginal(&a);
        println!(
            "| {n} | {rate:.0} | {:.0} | {per_cpu:.0} |",
            rate / n as f64
        );
        last = Some((n, per_cpu));
    }
    let hf_after = hf_tokenizers(&args.corpus.model, &rows)?;
    let (own_after, _) = job_tokenizer(&args.corpus.model, &rows)?;
    let hf = (hf_before + hf_after) / 2.0;
    let own = (own_before + own_after) / 2.0;
    println!(
        "\nTokenization alone, one thread, same texts, texts per CPU-second (before and after the jobs):\n"
    );
    println!("| tokenizer | texts per CPU-second | before | after | vs Hugging Face |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!("| Hugging Face tokenizers | {hf:.0} | {hf_before:.0} | {hf_after:.0} | 1.00x |");
    println!(
        "| the job's ({which}) | {own:.0} | {own_before:.0} | {own_after:.0} | {:.2}x |",
        own / hf
    );
    std::fs::remove_dir_all(&scratch)?;
    let (n, per_cpu) = last.context("no core count to run")?;
    println!(
        "feed: {per_cpu:.0} texts/s per core ({n} cores, texts per CPU-second, {} written, forward pass not run; tokenization alone: {which} {own:.0}, Hugging Face tokenizers {hf:.0})",
        if args.jsonl { "JSONL" } else { "Parquet" }
    );
    Ok(())
}
