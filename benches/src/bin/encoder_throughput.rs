//! Sentence-encoder throughput on a JSONL corpus: texts/s and texts per
//! CPU-second for several batch sizes and threading layouts, with model load
//! time and peak RSS.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin encoder_throughput -- \
//!     --texts 1024
//! ```
//!
//! Layouts: `pool=N` runs one encoder whose Burn kernels use a rayon pool of N
//! threads; `workers=N` runs N single-threaded workers on N threads sharing
//! one loaded model (what N one-core model actors of a node do;
//! `--model-per-worker` gives each worker a copy of its own instead). `sorted` batches texts sorted by token
//! length (less padding), `corpus` batches them in file order.
//!
//! With `--st-python PYTHON` (an interpreter with sentence-transformers), the
//! same texts are first embedded by sentence-transformers in the same run;
//! "vs ST" is texts per CPU-second over its best configuration. With
//! `--ort-python PYTHON` (an interpreter with onnxruntime, onnx and
//! safetensors), ONNX Runtime runs the same model, written out as a fused
//! ONNX graph from the same safetensors file, fp32 and dynamic int8, on the
//! same texts; "vs ORT" is over its best fp32 configuration
//! (`benches/python/ort_throughput.py`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use flotilla_benches::{peak_rss_bytes, process_cpu, reset_peak_rss, rss_bytes};
use flotilla_embed::{SentenceEncoder, default_device};

/// The allocator the `node` binary uses too: glibc's returns large blocks to
/// the kernel after every op, and the page faults to get them back cost
/// several percent of the encoder's CPU time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    corpus: flotilla_benches::CorpusArgs,
    /// Configurations to run, `LAYOUT:BATCH:ORDER` with LAYOUT `pool=N` or
    /// `workers=N` and ORDER `sorted` or `corpus`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pool=2:32:corpus,pool=2:32:sorted,pool=2:128:sorted,pool=1:16:sorted,pool=1:32:sorted,workers=2:16:sorted,workers=2:32:sorted,workers=2:128:sorted"
    )]
    configs: Vec<String>,
    /// Python interpreter with sentence-transformers installed: when given,
    /// the same texts are embedded by sentence-transformers first, as the
    /// same-run baseline (`THREADS:BATCH` configurations below).
    #[arg(long)]
    st_python: Option<PathBuf>,
    /// Give every worker of a `workers=N` layout its own copy of the model
    /// instead of sharing one.
    #[arg(long)]
    model_per_worker: bool,
    /// sentence-transformers configurations, `THREADS:BATCH`.
    #[arg(long, value_delimiter = ',', default_value = "2:32,2:128,1:64")]
    st_configs: Vec<String>,
    /// Python interpreter with onnxruntime, onnx and safetensors (and
    /// sentence-transformers, to check the graph): when given, ONNX Runtime
    /// runs the same texts too.
    #[arg(long)]
    ort_python: Option<PathBuf>,
    /// ONNX Runtime configurations, `PRECISION:THREADS:BATCH` with
    /// PRECISION `fp32` or `int8`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fp32:1:16,fp32:1:32,fp32:2:32,int8:1:16,int8:1:32"
    )]
    ort_configs: Vec<String>,
}

/// Best texts per CPU-second of a same-run rival, per precision.
#[derive(Default, Clone, Copy)]
struct Best {
    fp32: Option<f64>,
    int8: Option<f64>,
}

/// Runs a rival's script on the same texts and returns its best texts per
/// CPU-second, printing its table.
fn run_baseline(
    python: &std::path::Path,
    script: &str,
    title: &str,
    configs: &[String],
    args: &Args,
) -> anyhow::Result<Best> {
    let mut argv: Vec<std::ffi::OsString> = vec![
        args.corpus.model.clone().into(),
        args.corpus.file(&std::env::temp_dir())?.into(),
        args.corpus.texts.to_string().into(),
    ];
    argv.extend(configs.iter().map(Into::into));
    let lines = flotilla_benches::run_rival(python, script, &argv)?;
    let mut best = Best::default();
    println!("baseline: {title} on the same texts");
    println!(
        "{:<30} {:>9} {:>12} {:>13} {:>11}",
        "config", "texts/s", "texts/CPU-s", "peak RSS MiB", "min cosine"
    );
    for v in lines {
        if v["config"] == "load" {
            println!(
                "loaded in {:.2} s, {:.0} MiB RSS",
                v["load_s"].as_f64().unwrap_or(0.0),
                v["rss_mib"].as_f64().unwrap_or(0.0)
            );
            continue;
        }
        let per_cpu = v["texts_per_cpu_s"].as_f64().unwrap_or(0.0);
        let config = v["config"].as_str().unwrap_or("?");
        let slot = if v["precision"] == "int8" {
            &mut best.int8
        } else {
            &mut best.fp32
        };
        *slot = Some(slot.unwrap_or(0.0).max(per_cpu));
        println!(
            "{:<30} {:>9.1} {:>12.1} {:>13.0} {:>11}",
            config,
            v["texts_per_s"].as_f64().unwrap_or(0.0),
            per_cpu,
            v["peak_rss_mib"].as_f64().unwrap_or(0.0),
            v["min_cosine"]
                .as_f64()
                .map_or("-".to_owned(), |c| format!("{c:.7}")),
        );
    }
    println!();
    Ok(best)
}

#[derive(Clone, Copy)]
enum Layout {
    Pool(usize),
    Workers(usize),
}

struct Config {
    label: String,
    layout: Layout,
    batch: usize,
    sorted: bool,
}

fn parse_config(s: &str) -> anyhow::Result<Config> {
    let parts: Vec<&str> = s.split(':').collect();
    let [layout, batch, order] = parts[..] else {
        anyhow::bail!("config {s:?} is not LAYOUT:BATCH:ORDER");
    };
    let layout = match layout.split_once('=') {
        Some(("pool", n)) => Layout::Pool(n.parse()?),
        Some(("workers", n)) => Layout::Workers(n.parse()?),
        _ => anyhow::bail!("layout {layout:?} is not pool=N or workers=N"),
    };
    let sorted = match order {
        "sorted" => true,
        "corpus" => false,
        _ => anyhow::bail!("order {order:?} is not sorted or corpus"),
    };
    Ok(Config {
        label: s.to_owned(),
        layout,
        batch: batch.parse()?,
        sorted,
    })
}

/// Batches of indices into `texts`, sorted by token length when asked.
fn batches(
    encoder: &SentenceEncoder,
    texts: &[String],
    batch: usize,
    sorted: bool,
) -> anyhow::Result<Vec<Vec<usize>>> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    if sorted {
        let lens: Vec<usize> = texts
            .iter()
            .map(|t| encoder.tokenizer().token_count(t))
            .collect::<Result<_, _>>()?;
        order.sort_by_key(|&i| lens[i]);
    }
    Ok(order.chunks(batch).map(<[usize]>::to_vec).collect())
}

fn run_batches(
    encoder: &SentenceEncoder,
    texts: &[String],
    batches: &[Vec<usize>],
) -> anyhow::Result<(usize, usize)> {
    let (mut real, mut padded) = (0, 0);
    for b in batches {
        let refs: Vec<&str> = b.iter().map(|&i| texts[i].as_str()).collect();
        let tokens = encoder.tokenize(&refs)?;
        real += tokens.real_tokens();
        padded += tokens.batch * tokens.seq_len;
        let out = encoder.encode_tokens(&tokens)?;
        anyhow::ensure!(out.rows() == refs.len(), "row count");
    }
    Ok((real, padded))
}

fn pool(threads: usize) -> anyhow::Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let configs: Vec<Config> = args
        .configs
        .iter()
        .map(|c| parse_config(c))
        .collect::<Result<_, _>>()?;
    let texts: Vec<String> = args.corpus.read()?.into_iter().map(|(_, t)| t).collect();
    let texts = Arc::new(texts);
    let st = match &args.st_python {
        Some(python) => run_baseline(
            python,
            "st_throughput.py",
            "sentence-transformers (PyTorch)",
            &args.st_configs,
            &args,
        )?,
        None => Best::default(),
    };
    let ort = match &args.ort_python {
        Some(python) => run_baseline(
            python,
            "ort_throughput.py",
            "ONNX Runtime (fused graph; min cosine against sentence-transformers, first 64 texts)",
            &args.ort_configs,
            &args,
        )?,
        None => Best::default(),
    };
    let device = default_device();

    let rss_before = rss_bytes();
    let encoder = Arc::new(SentenceEncoder::load(&args.corpus.model, &device)?);
    let rss_loaded = rss_bytes();
    println!(
        "model {} ({}), loaded in {:.2} s, +{:.0} MiB RSS; {} texts, device {:?}",
        args.corpus.model.display(),
        encoder.revision().short(),
        encoder.load_time().as_secs_f64(),
        (rss_loaded.saturating_sub(rss_before)) as f64 / (1 << 20) as f64,
        texts.len(),
        device,
    );
    // Warm-up: one small batch so lazy initialisation is not timed.
    encoder.encode(&["warm up"])?;

    println!(
        "{:<26} {:>9} {:>12} {:>10} {:>8} {:>13} {:>7} {:>7} {:>9}",
        "config",
        "texts/s",
        "texts/CPU-s",
        "pad ratio",
        "wall s",
        "peak RSS MiB",
        "vs ST",
        "vs ORT",
        "vs ORT8"
    );
    // Workers share the model, as the embedding actors of a node do (or
    // own a copy each); load them all before timing anything.
    let most_workers = configs
        .iter()
        .filter_map(|c| match c.layout {
            Layout::Workers(n) => Some(n),
            Layout::Pool(_) => None,
        })
        .max()
        .unwrap_or(1);
    let mut models = vec![Arc::clone(&encoder)];
    for _ in 1..most_workers {
        models.push(if args.model_per_worker {
            Arc::new(SentenceEncoder::load(&args.corpus.model, &device)?)
        } else {
            Arc::clone(&encoder)
        });
    }
    for cfg in &configs {
        let plan = batches(&encoder, &texts, cfg.batch, cfg.sorted)?;
        reset_peak_rss();
        let cpu0 = process_cpu();
        let t0 = Instant::now();
        let (real, padded) = match cfg.layout {
            Layout::Pool(n) => pool(n)?.install(|| run_batches(&encoder, &texts, &plan))?,
            Layout::Workers(n) => {
                let mut handles = Vec::new();
                for (w, enc) in models.iter().take(n).enumerate() {
                    let share: Vec<Vec<usize>> = plan.iter().skip(w).step_by(n).cloned().collect();
                    let texts = Arc::clone(&texts);
                    let enc = Arc::clone(enc);
                    handles.push(std::thread::spawn(
                        move || -> anyhow::Result<(usize, usize)> {
                            pool(1)?.install(|| run_batches(&enc, &texts, &share))
                        },
                    ));
                }
                let mut sum = (0, 0);
                for h in handles {
                    let (r, p) = h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
                    sum.0 += r;
                    sum.1 += p;
                }
                sum
            }
        };
        let wall = t0.elapsed().as_secs_f64();
        let cpu = (process_cpu() - cpu0).as_secs_f64();
        let per_cpu = texts.len() as f64 / cpu;
        let ratio = |b: Option<f64>| b.map_or("-".to_owned(), |b| format!("{:.2}x", per_cpu / b));
        println!(
            "{:<26} {:>9.1} {:>12.1} {:>10.2} {:>8.1} {:>13.0} {:>7} {:>7} {:>9}",
            cfg.label,
            texts.len() as f64 / wall,
            per_cpu,
            padded as f64 / real as f64,
            wall,
            peak_rss_bytes() as f64 / (1 << 20) as f64,
            ratio(st.fp32),
            ratio(ort.fp32),
            ratio(ort.int8),
        );
    }
    println!(
        "process peak RSS (models loaded: {}) {:.0} MiB",
        if args.model_per_worker {
            models.len()
        } else {
            1
        },
        peak_rss_bytes() as f64 / (1 << 20) as f64
    );
    Ok(())
}
