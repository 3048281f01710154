//! The embed job's runtime overhead and the pipeline's scaling, in one run.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin pipeline
//! ```
//!
//! 1. **Job vs bare model loop**: the same texts embedded by `N` model
//!    threads calling one shared encoder directly (batches taken from a shared
//!    counter, the actor's own length-sorted micro-batches), then by the
//!    embed job with `N` local actors (source, pipeline, actors, Parquet
//!    parts). Both rates exclude model load; the overhead is the job's loss
//!    against the bare loop. Also: time to first batch, memory per model.
//!    With `--ray-python PYTHON` (an interpreter with ray and
//!    sentence-transformers), Ray runs the same job on the same texts in
//!    the same run (`benches/python/ray_pipeline.py`: as many
//!    sentence-transformers actors, a driver that sorts windows by length
//!    and keeps 2 batches per actor in flight), compared on start-up,
//!    steady-state texts/s and the whole run.
//! 2. **Scaling with sleeping workers**: actors that sleep instead of
//!    computing (100 ms and 1 ms per batch), driven by the framework's
//!    pipeline with a window of 128: all in this process, then with the
//!    actors on two worker processes over QUIC. Ideal = actors / sleep.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use flotilla::pipeline::{BatchId, Event, Pipeline, PipelineConfig, RpcReplyPort, Stage, Verdict};
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::{Node, NodeConfig};
use flotilla_benches::rss_bytes;
use flotilla_embed::{SentenceEncoder, default_device};
use flotilla_examples::{Worker, free_addr, init_logs, scratch_certs, serve_if_worker};

/// The allocator of the `node` binary.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    corpus: flotilla_benches::CorpusArgs,
    /// Model actors (and bare-loop threads).
    #[arg(long, default_value_t = 2)]
    actors: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Sleeping actors.
    #[arg(long, default_value_t = 64)]
    sleepers: usize,
    /// Batches per scaling run.
    #[arg(long, default_value_t = 5_000)]
    batches: u64,
    /// Pipeline window of the scaling runs.
    #[arg(long, default_value_t = 128)]
    window: usize,
    /// Skip part 1 (the model).
    #[arg(long)]
    skip_model: bool,
    /// Skip part 2 (scaling).
    #[arg(long)]
    skip_scaling: bool,
    /// The encoder's precision in part 1 (`f32`, or `int8` for the CPU's
    /// quantized mode); Ray's sentence-transformers run f32 either way.
    #[arg(long, default_value = "f32")]
    precision: flotilla_embed::Precision,
    /// Python interpreter with ray and sentence-transformers: when given,
    /// Ray runs the same job on the same texts after Flotilla's.
    #[arg(long)]
    ray_python: Option<std::path::PathBuf>,
}

/// Runs Ray's job (`benches/python/ray_pipeline.py`) on `input`; its JSON
/// report.
fn ray_job(
    python: &std::path::Path,
    args: &Args,
    input: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<serde_json::Value> {
    let argv: Vec<std::ffi::OsString> = vec![
        args.corpus.model.clone().into(),
        input.into(),
        out.into(),
        args.actors.to_string().into(),
        args.batch_size.to_string().into(),
        flotilla_embed::job::DEFAULT_SORT_WINDOW.to_string().into(),
    ];
    flotilla_benches::run_rival(python, "ray_pipeline.py", &argv)?
        .pop()
        .context("the Ray job printed nothing")
}

// ---------------------------------------------------------------- sleepers

/// How long a sleeper sleeps per batch, in microseconds.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct SleepArgs(u64);

/// A sleeper's answer: the batch id and how long it actually slept.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct Slept {
    batch: u64,
    micros: u64,
}

flotilla::remote_type!(SleepArgs, Slept);

#[derive(RactorClusterMessage)]
enum SleepMsg {
    /// Sleep, then answer with the batch id and the microseconds slept.
    #[rpc]
    Work(u64, RpcReplyPort<Slept>),
}

/// A worker that sleeps instead of computing, one batch at a time.
struct Sleeper;

const SLEEPER: flotilla::ActorKind<SleepMsg, SleepArgs> =
    flotilla::ActorKind::new("flotilla.bench.sleeper");

impl Actor for Sleeper {
    type Msg = SleepMsg;
    type State = Duration;
    type Arguments = SleepArgs;

    async fn pre_start(
        &self,
        _: ActorRef<SleepMsg>,
        args: SleepArgs,
    ) -> Result<Duration, ActorProcessingErr> {
        Ok(Duration::from_micros(args.0))
    }

    async fn handle(
        &self,
        _: ActorRef<SleepMsg>,
        msg: SleepMsg,
        sleep: &mut Duration,
    ) -> Result<(), ActorProcessingErr> {
        let SleepMsg::Work(id, reply) = msg;
        let t = Instant::now();
        // A thread sleep is precise to tens of microseconds; tokio's timer
        // rounds up to the next millisecond, which alone costs 1–2% at
        // 100 ms and half the rate at 1 ms.
        let d = *sleep;
        tokio::task::spawn_blocking(move || std::thread::sleep(d)).await?;
        let _ = reply.send(Slept {
            batch: id,
            micros: t.elapsed().as_micros() as u64,
        });
        Ok(())
    }
}

struct SleepStage;

impl Stage for SleepStage {
    type Msg = SleepMsg;
    type Batch = ();
    type Reply = Slept;
    type Output = u64;

    fn request(&self, id: BatchId, _: &(), reply: RpcReplyPort<Slept>) -> SleepMsg {
        SleepMsg::Work(id.0, reply)
    }

    fn judge(&self, id: BatchId, _: &(), reply: Slept) -> Verdict<u64> {
        if reply.batch == id.0 {
            Verdict::Done(reply.micros)
        } else {
            Verdict::Retry(format!("answer for batch {}", reply.batch))
        }
    }
}

struct Scaling {
    /// Batches per second over the whole run.
    rate: f64,
    /// Batches per second between the 5th and the 95th percent of
    /// completions (no ramp-up, no partly filled last round).
    steady: f64,
    /// Mean time the actors actually slept per batch.
    slept: Duration,
    first: Duration,
    retries: u64,
}

/// Drives `batches` through sleepers with a window of `window`.
async fn drive_sleepers(
    actors: &[(String, ActorRef<SleepMsg>)],
    batches: u64,
    window: usize,
    outbound: flotilla::Outbound,
) -> anyhow::Result<Scaling> {
    let mut p = Pipeline::new(
        SleepStage,
        PipelineConfig {
            max_in_flight: window,
            memory_budget: usize::MAX,
            deadline: Duration::from_secs(30),
            max_attempts: 3,
            retry_backoff: Duration::from_millis(250),
            hedge: None,
        },
        outbound,
    );
    for (node, a) in actors {
        p.add_worker(node, a.clone());
    }
    let start = Instant::now();
    let mut first = None;
    let (mut next, mut done) = (0u64, 0u64);
    let mut finished: Vec<Duration> = Vec::with_capacity(batches as usize);
    let mut slept = 0u64;
    while done < batches {
        while next < batches && p.has_credit() {
            p.submit(BatchId(next), ());
            next += 1;
        }
        match p.next().await? {
            Some(Event::Done { output, .. }) => {
                done += 1;
                slept += output;
                let now = start.elapsed();
                first.get_or_insert(now);
                finished.push(now);
            }
            Some(other) => anyhow::bail!("batch not done: {other:?}"),
            None => {}
        }
    }
    let (a, b) = (batches as usize / 20, batches as usize * 19 / 20);
    let steady = (b - a) as f64 / (finished[b] - finished[a]).as_secs_f64();
    Ok(Scaling {
        rate: batches as f64 / start.elapsed().as_secs_f64(),
        steady,
        slept: Duration::from_micros(slept / batches.max(1)),
        first: first.unwrap_or_default(),
        retries: p.stats().retries,
    })
}

fn print_scaling(
    place: &str,
    sleep: Duration,
    actors: usize,
    batches: u64,
    s: &Scaling,
    per_actor: f64,
) {
    let ideal = actors as f64 / sleep.as_secs_f64();
    // The best any scheduler can do: every actor busy, whole rounds of the
    // sleep the actors actually took (the last round is partly filled).
    let rounds = batches.div_ceil(actors as u64) as f64;
    let bound = batches as f64 / (rounds * s.slept.as_secs_f64());
    println!(
        "| {place} | {actors} × {} ms | {:.0} | {:.0} | {:.1}% | {:.1}% | {:.0} ({:.1}%) | {:.3} ms | {:.1} ms | {} | {:.1} KiB |",
        sleep.as_millis(),
        s.rate,
        ideal,
        100.0 * s.rate / ideal,
        100.0 * s.rate / bound,
        s.steady,
        100.0 * s.steady / ideal,
        s.slept.as_secs_f64() * 1e3,
        s.first.as_secs_f64() * 1e3,
        s.retries,
        per_actor / 1024.0
    );
}

async fn scaling(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## Scaling: {} sleeping actors, {} batches, window {}\n",
        args.sleepers, args.batches, args.window
    );
    println!(
        "| where | actors × sleep | batches/s | ideal | of ideal | of bound | steady 5–95% | actual sleep | first batch | retries | memory per actor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let sleeps = [Duration::from_millis(100), Duration::from_millis(1)];

    // In this process.
    for sleep in sleeps {
        let before = rss_bytes();
        let mut actors = Vec::new();
        for _ in 0..args.sleepers {
            let (a, _) = Actor::spawn(None, Sleeper, SleepArgs(sleep.as_micros() as u64)).await?;
            actors.push(("local".to_owned(), a));
        }
        let per_actor = rss_bytes().saturating_sub(before) as f64 / args.sleepers as f64;
        let s = drive_sleepers(
            &actors,
            args.batches,
            args.window,
            flotilla::Outbound::local(),
        )
        .await?;
        print_scaling(
            "one process",
            sleep,
            args.sleepers,
            args.batches,
            &s,
            per_actor,
        );
        for (_, a) in actors {
            a.stop(None);
        }
    }

    // Over QUIC: this process is the head, two worker processes host the actors.
    let certs = scratch_certs("pipeline-bench", &["head", "w1", "w2"])?;
    let node = Node::builder(NodeConfig::new("head", free_addr(), &certs))
        .start()
        .await?;
    let workers = [
        ("w1", Worker::start("w1", node.addr(), &certs)?),
        ("w2", Worker::start("w2", node.addr(), &certs)?),
    ];
    node.wait_members(Duration::from_secs(30), |t| t.up().count() == 3)
        .await
        .context("workers did not join")?;
    for (round, sleep) in sleeps.into_iter().enumerate() {
        let before: u64 = workers
            .iter()
            .map(|(_, w)| flotilla::process::rss_bytes_of(w.pid()))
            .sum();
        let mut actors = Vec::new();
        for i in 0..args.sleepers {
            let (name, _) = &workers[i % workers.len()];
            let actor: ActorRef<SleepMsg> = node
                .spawn_on(
                    name,
                    SLEEPER.named(format!("sleeper-{round}-{i}")),
                    &SleepArgs(sleep.as_micros() as u64),
                    Duration::from_secs(10),
                )
                .await?;
            actors.push((name.to_string(), actor));
        }
        let after: u64 = workers
            .iter()
            .map(|(_, w)| flotilla::process::rss_bytes_of(w.pid()))
            .sum();
        let per_actor = after.saturating_sub(before) as f64 / args.sleepers as f64;
        let s = drive_sleepers(&actors, args.batches, args.window, node.outbound()).await?;
        print_scaling(
            "2 workers over QUIC",
            sleep,
            args.sleepers,
            args.batches,
            &s,
            per_actor,
        );
        // This round's sleepers stay, idle, until the head leaves: stopping
        // a remote actor through its ActorRef stops only this node's proxy
        // of it, and the next spawn on that worker then fails.
    }
    node.shutdown().await;
    drop(workers);
    let _ = std::fs::remove_dir_all(certs);
    Ok(())
}

// ------------------------------------------------------------------- model

/// `threads` model threads sharing one loaded encoder (as the embedding
/// actors of a node do), each with a one-thread pool, taking batches from a
/// shared counter. Returns (texts/s after load, memory of the loaded model
/// in bytes).
fn bare_loop(args: &Args, texts: &[String]) -> anyhow::Result<(f64, f64)> {
    let before = rss_bytes();
    let device = if args.precision.cpu_only() {
        flotilla_embed::cpu_device()
    } else {
        default_device()
    };
    let model = SentenceEncoder::load_with(&args.corpus.model, &device, args.precision)?;
    let per_model = rss_bytes().saturating_sub(before) as f64;
    let encoders: Vec<&SentenceEncoder> = (0..args.actors).map(|_| &model).collect();
    let batches: Vec<&[String]> = texts.chunks(args.batch_size).collect();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let handles: Vec<_> = encoders
            .iter()
            .map(|encoder| {
                let (next, batches) = (Arc::clone(&next), &batches);
                scope.spawn(move || -> anyhow::Result<()> {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(batch) = batches.get(i) else {
                            return Ok(());
                        };
                        let v = pool
                            .install(|| flotilla_embed::actor::embed_sorted(encoder, batch, 16))?;
                        std::hint::black_box(v);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("model thread panicked"))??;
        }
        Ok(())
    })?;
    Ok((
        texts.len() as f64 / start.elapsed().as_secs_f64(),
        per_model,
    ))
}

async fn model(args: &Args) -> anyhow::Result<()> {
    let rows = args.corpus.read()?;
    let texts: Vec<String> = rows.iter().map(|(_, t)| t.clone()).collect();
    let scratch =
        std::env::temp_dir().join(format!("flotilla-pipeline-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let input = scratch.join("input.jsonl");
    let mut jsonl = String::new();
    for (id, text) in &rows {
        jsonl.push_str(&serde_json::json!({ "id": id, "text": text }).to_string());
        jsonl.push('\n');
    }
    std::fs::write(&input, jsonl)?;

    println!(
        "## Embed job vs bare model loop: {} texts, {} model threads/actors, batches of {}, {}\n",
        rows.len(),
        args.actors,
        args.batch_size,
        args.precision
    );
    println!(
        "| run | texts/s (after load) | vs bare loop | time to first batch | memory per model |"
    );
    println!("|---|---|---|---|---|");
    // Bare loop twice around the job, to see the machine's drift.
    let (bare1, per_model) = bare_loop(args, &texts)?;
    println!(
        "| bare model loop | {bare1:.1} | 1.000 | - | {:.0} MiB |",
        per_model / (1 << 20) as f64
    );
    // The job as it runs by default (batches cut from length-sorted
    // windows), and with batches cut in input order.
    let mut jobs = Vec::new();
    for (label, window) in [
        (
            "embed job (local actors, Parquet out)",
            flotilla_embed::job::DEFAULT_SORT_WINDOW,
        ),
        ("embed job, batches in input order (--sort-window 0)", 0),
    ] {
        let mut config = flotilla_embed::job::JobConfig::new(
            input.to_string_lossy(),
            scratch.join(format!("out-w{window}")).to_string_lossy(),
            args.corpus.model.clone(),
        );
        config.job.batch_size = args.batch_size;
        config.job.actors_per_node = Some(args.actors);
        config.job.sort_window = window;
        config.precision = args.precision;
        let summary = flotilla_embed::job::run(config).await?;
        anyhow::ensure!(
            summary.job.rows as usize == rows.len(),
            "job embedded {} texts",
            summary.job.rows
        );
        let compute = summary.job.elapsed.saturating_sub(summary.ready_after);
        jobs.push((
            label,
            summary.job.rows as f64 / compute.as_secs_f64(),
            summary,
        ));
    }
    let (bare2, _) = bare_loop(args, &texts)?;
    let bare = (bare1 + bare2) / 2.0;
    for (label, job, summary) in &jobs {
        println!(
            "| {label} | {job:.1} | {:.3} | {:.2} s (load {:.2} s) | - |",
            job / bare,
            summary
                .job
                .first_part_after
                .unwrap_or_default()
                .as_secs_f64(),
            summary.ready_after.as_secs_f64()
        );
    }
    let job = jobs[0].1;
    println!(
        "| bare model loop again | {bare2:.1} | {:.3} | - | - |",
        bare2 / bare1
    );
    println!(
        "\njob overhead vs the mean of both bare runs: {:.1}%",
        100.0 * (1.0 - job / bare)
    );
    if let Some(python) = &args.ray_python {
        let ray = ray_job(python, args, &input, &scratch.join("out-ray"))?;
        let summary = &jobs[0].2;
        let (ray_start, ray_steady, ray_total) = (
            ray["startup_s"].as_f64().unwrap_or(f64::NAN),
            ray["steady_texts_per_s"].as_f64().unwrap_or(f64::NAN),
            ray["total_s"].as_f64().unwrap_or(f64::NAN),
        );
        let total = summary.job.elapsed.as_secs_f64();
        println!(
            "\n## The same job in Ray (same texts, {} actors, batches of {})\n",
            args.actors, args.batch_size
        );
        println!("| run | start-up s | steady-state texts/s | whole run s |");
        println!("|---|---|---|---|");
        println!(
            "| Flotilla embed job | {:.2} | {job:.1} | {total:.1} |",
            summary.ready_after.as_secs_f64()
        );
        println!(
            "| Ray + sentence-transformers actors | {ray_start:.2} | {ray_steady:.1} | {ray_total:.1} |"
        );
        println!(
            "\nFlotilla / Ray: steady state {:.2}x, whole run {:.2}x faster",
            job / ray_steady,
            ray_total / total
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    if serve_if_worker(|b| b.register(SLEEPER, || Sleeper)).await? {
        return Ok(());
    }
    let args = Args::parse();
    if !args.skip_model {
        model(&args).await?;
    }
    if !args.skip_scaling {
        scaling(&args).await?;
    }
    Ok(())
}
