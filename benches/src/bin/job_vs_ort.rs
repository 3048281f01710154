//! The whole embed job against ONNX Runtime's whole pipeline, texts per
//! CPU-second, in one run.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin job_vs_ort -- \
//!     --ort-python /tmp/rivals/bin/python --texts 1800
//! FLOTILLA_CPU_LEVEL=avx2 cargo run … (Flotilla's kernels held to AVX2)
//! ```
//!
//! For each precision (`f32`, and `int8`: the CPU's quantized mode) the
//! job (`flotilla_embed::job::run`, what `node embed` runs, in this
//! process: JSONL read, length-sorted batches of 64, one actor per core,
//! micro-batches of 16, Parquet parts and manifest) runs on a third of the
//! texts, then on all of them, after a warm-up job; its rate is marginal:
//! the texts the larger run adds over the CPU time it adds, every thread of
//! the process counted, so the model's load is left out. The rival, in the
//! same run (`benches/python/ort_throughput.py`, `pipe-` configurations):
//! ONNX Runtime on one thread with the same model written out as a fused
//! graph (fp32, and dynamic int8), timed over what a user writes around it —
//! Hugging Face tokenizers on every text (one thread), sorting by length,
//! batches of 16, inference, pooling and normalisation in the graph — with
//! its graphs built and loaded before the timing.
//!
//! To read the rates against what the core can do, the bench counts the
//! encoder's multiply-accumulates per text on these texts (sorted batches
//! of the rival's size) and measures one thread's FMA peak (AVX-512 and
//! AVX2), and prints each `f32` run as GMAC per CPU-second and as a share
//! of that peak. The last line reads `job vs ORT: f32 Rx, int8 Rx`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use flotilla_benches::arithmetic::{fma_peaks, macs_per_text};
use flotilla_benches::{JobRun, run_rival, time_job, write_jsonl};
use flotilla_embed::Precision;
use flotilla_embed::job::JobConfig;

/// The allocator the `node` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    corpus: flotilla_benches::CorpusArgs,
    /// Python interpreter with onnxruntime, onnx and tokenizers (the
    /// rival).
    #[arg(long)]
    ort_python: PathBuf,
    /// Embedding actors (default: one per core).
    #[arg(long)]
    actors: Option<usize>,
    /// The rival's batch size (its best on one thread).
    #[arg(long, default_value_t = 16)]
    ort_batch: usize,
}

/// The job over `input` in `precision` with `actors` actors.
async fn job(
    args: &Args,
    input: &Path,
    out: &Path,
    precision: Precision,
    actors: usize,
) -> anyhow::Result<JobRun> {
    let mut config = JobConfig::new(
        input.to_string_lossy(),
        out.to_string_lossy(),
        args.corpus.model.clone(),
    );
    config.job.actors_per_node = Some(actors);
    config.precision = precision;
    config.device = flotilla_embed::DeviceChoice::Cpu;
    time_job(config).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let actors = args
        .actors
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rows = args.corpus.read()?;
    anyhow::ensure!(rows.len() >= 30, "the corpus has {} texts", rows.len());
    let scratch = std::env::temp_dir().join(format!("flotilla-job-vs-ort-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let (warm, third, all) = (
        scratch.join("warm.jsonl"),
        scratch.join("third.jsonl"),
        scratch.join("all.jsonl"),
    );
    write_jsonl(&warm, &rows[..rows.len() / 10])?;
    write_jsonl(&third, &rows[..rows.len() / 3])?;
    write_jsonl(&all, &rows)?;
    let out = scratch.join("out");
    let level = std::env::var("FLOTILLA_CPU_LEVEL").unwrap_or_else(|_| "the CPU's best".into());
    println!(
        "job vs ONNX Runtime: {} texts, model {}, {actors} actors, Flotilla's kernels: {level}\n",
        rows.len(),
        args.corpus.model.display()
    );

    let mut flotilla = Vec::new();
    for precision in [Precision::F32, Precision::Int8] {
        job(&args, &warm, &out, precision, actors).await?;
        let small = job(&args, &third, &out, precision, actors).await?;
        let large = job(&args, &all, &out, precision, actors).await?;
        let (rate, per_cpu) = large.marginal(&small);
        flotilla.push((precision, rate, per_cpu));
    }

    let configs: Vec<std::ffi::OsString> = [
        format!("pipe-fp32:1:{}", args.ort_batch),
        format!("pipe-int8:1:{}", args.ort_batch),
    ]
    .into_iter()
    .map(Into::into)
    .collect();
    let mut argv: Vec<std::ffi::OsString> = vec![
        args.corpus.model.clone().into(),
        all.clone().into(),
        rows.len().to_string().into(),
    ];
    argv.extend(configs);
    let ort = run_rival(&args.ort_python, "ort_throughput.py", &argv)?;
    let rival = |precision: &str| -> anyhow::Result<(f64, f64)> {
        let r = ort
            .iter()
            .find(|r| r["precision"] == precision)
            .with_context(|| format!("ONNX Runtime printed no {precision} result"))?;
        Ok((
            r["texts_per_s"].as_f64().unwrap_or(f64::NAN),
            r["texts_per_cpu_s"].as_f64().unwrap_or(f64::NAN),
        ))
    };

    let folder = flotilla_embed::ModelFolder::open(&args.corpus.model)?;
    let texts: Vec<&str> = rows.iter().map(|(_, t)| t.as_str()).collect();
    let macs = macs_per_text(&folder, &texts, args.ort_batch)?;
    let peaks = fma_peaks();
    let peak = peaks.first().map_or(f64::NAN, |p| p.1);
    println!(
        "arithmetic: {:.1} M multiply-accumulates a text (sorted batches of {}); one thread's f32 FMA peak: {}\n",
        macs / 1e6,
        args.ort_batch,
        peaks
            .iter()
            .map(|(w, p)| format!("{w} {p:.1} GMAC/s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // int8 products run on the integer units: their share of the f32 peak
    // means nothing.
    let share = |per_cpu: f64, precision: Precision| {
        let gmacs = per_cpu * macs / 1e9;
        if precision == Precision::F32 {
            format!("{gmacs:.1} ({:.0}%)", 100.0 * gmacs / peak)
        } else {
            format!("{gmacs:.1}")
        }
    };

    println!(
        "| run | texts/s | texts per CPU-second | vs ORT | GMAC per CPU-second (f32: share of the FMA peak) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut ratios = Vec::new();
    for (precision, rate, per_cpu) in &flotilla {
        let name = if *precision == Precision::Int8 {
            "int8"
        } else {
            "fp32"
        };
        let (ort_rate, ort_cpu) = rival(name)?;
        println!(
            "| ORT whole pipeline {name}, 1 thread, batch {} | {ort_rate:.1} | {ort_cpu:.1} | 1.00x | {} |",
            args.ort_batch,
            share(ort_cpu, *precision)
        );
        println!(
            "| Flotilla job {precision}, {actors} actors, marginal | {rate:.1} | {per_cpu:.1} | **{:.2}x** | {} |",
            per_cpu / ort_cpu,
            share(*per_cpu, *precision)
        );
        ratios.push(format!("{precision} {:.2}x", per_cpu / ort_cpu));
    }
    std::fs::remove_dir_all(&scratch)?;
    println!("job vs ORT: {}", ratios.join(", "));
    Ok(())
}
