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
//!
//! On a GPU (built with `--features cuda`, `--device cuda`): a
//! configuration's fourth field is its precision (`pool=1:256:sorted:f16`);
//! sentence-transformers configurations `cuda:fp16:BATCH` run PyTorch on
//! the same GPU, and "vs ST16" compares texts/s with its best fp16 one.
//! `--golden FILE[,FILE…]` first checks every reference sentence in each
//! precision the configurations name (token ids identical; f32: cosine
//! ≥ 0.9999 and max abs diff ≤ 1e-4; f16/bf16: cosine ≥ 0.999; int8:
//! cosine ≥ 0.99) and exits 1 after the table if one fails. On the CPU,
//! `int8` is the quantized mode (`pool=1:16:sorted:int8`); "vs ORT8" is
//! over ONNX Runtime's best int8 configuration.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use flotilla_benches::{peak_rss_bytes, process_cpu, reset_peak_rss, rss_bytes};
use flotilla_embed::{DeviceChoice, Precision, SentenceEncoder};

/// The allocator the `node` binary uses too: glibc's returns large blocks to
/// the kernel after every op, and the page faults to get them back cost
/// several percent of the encoder's CPU time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    corpus: flotilla_benches::CorpusArgs,
    /// Configurations to run, `LAYOUT:BATCH:ORDER[:PRECISION]` with LAYOUT
    /// `pool=N` or `workers=N`, ORDER `sorted` or `corpus`, PRECISION `f32`
    /// (default), `f16`, `bf16` or `int8`.
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
    /// sentence-transformers configurations, `THREADS:BATCH` on the CPU or
    /// `cuda:fp32:BATCH` / `cuda:fp16:BATCH` on the GPU.
    #[arg(long, value_delimiter = ',', default_value = "2:32,2:128,1:64")]
    st_configs: Vec<String>,
    /// What the encoder runs on: `auto` (the first GPU where there is one),
    /// `cpu` or `cuda` (fail without a GPU).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Reference files (`apps/embed/tests/data/*.json`): check every
    /// sentence in each precision of the configurations before timing.
    #[arg(long, value_delimiter = ',')]
    golden: Vec<PathBuf>,
    /// Reference files compared and printed like `--golden`, without a bar
    /// (references made from other weights than the model's, say).
    #[arg(long, value_delimiter = ',')]
    golden_info: Vec<PathBuf>,
    /// Write the corpus the bench would read (`--texts` rows, as JSONL) to
    /// this file and exit.
    #[arg(long)]
    write_corpus: Option<PathBuf>,
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

/// Best texts per CPU-second of a same-run rival, per precision, and its
/// best texts per second in fp16 (GPU runs).
#[derive(Default, Clone, Copy)]
struct Best {
    fp32: Option<f64>,
    int8: Option<f64>,
    fp16_per_s: Option<f64>,
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
        let per_s = v["texts_per_s"].as_f64().unwrap_or(0.0);
        let config = v["config"].as_str().unwrap_or("?");
        let slot = if v["precision"] == "int8" {
            &mut best.int8
        } else {
            &mut best.fp32
        };
        *slot = Some(slot.unwrap_or(0.0).max(per_cpu));
        if v["precision"] == "fp16" {
            best.fp16_per_s = Some(best.fp16_per_s.unwrap_or(0.0).max(per_s));
        }
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
    precision: Precision,
}

fn parse_config(s: &str) -> anyhow::Result<Config> {
    let parts: Vec<&str> = s.split(':').collect();
    let (layout, batch, order, precision) = match parts[..] {
        [layout, batch, order] => (layout, batch, order, Precision::F32),
        [layout, batch, order, precision] => (layout, batch, order, precision.parse()?),
        _ => anyhow::bail!("config {s:?} is not LAYOUT:BATCH:ORDER[:PRECISION]"),
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
        precision,
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

/// The device `choice` names: the first CUDA device, or the CPU.
fn pick_device(choice: DeviceChoice) -> anyhow::Result<flotilla_embed::Device> {
    let gpus = match choice {
        DeviceChoice::Cpu => Vec::new(),
        _ => flotilla_embed::cuda_devices(),
    };
    match (choice, gpus.into_iter().next()) {
        (DeviceChoice::Cpu, _) => Ok(flotilla_embed::cpu_device()),
        (_, Some(gpu)) => Ok(gpu),
        (DeviceChoice::Cuda, None) => anyhow::bail!(
            "--device cuda: no CUDA device (a build without the cuda feature, or no GPU)"
        ),
        (DeviceChoice::Auto, None) => Ok(flotilla_embed::cpu_device()),
    }
}

/// One reference sentence: its text, token ids and vector.
#[derive(serde::Deserialize)]
struct Reference {
    text: String,
    token_ids: Vec<i64>,
    embedding: Vec<f32>,
}

/// A reference file's sentences.
#[derive(serde::Deserialize)]
struct References {
    sentences: Vec<Reference>,
}

/// The worst agreement of one precision with the references.
struct Agreement {
    sentences: usize,
    token_mismatches: usize,
    min_cosine: f64,
    max_abs: f64,
}

/// Embeds every reference sentence, alone and in one padded batch, and
/// returns the worst cosine and difference over both.
fn agree(encoder: &SentenceEncoder, refs: &[Reference]) -> anyhow::Result<Agreement> {
    let mut worst = Agreement {
        sentences: refs.len(),
        token_mismatches: 0,
        min_cosine: 1.0,
        max_abs: 0.0,
    };
    let texts: Vec<&str> = refs.iter().map(|r| r.text.as_str()).collect();
    let padded = encoder.encode(&texts)?;
    for (i, r) in refs.iter().enumerate() {
        let tokens = encoder.tokenize(&[r.text.as_str()])?;
        if tokens.row_ids(0) != r.token_ids {
            worst.token_mismatches += 1;
        }
        let alone = encoder.encode(&[r.text.as_str()])?;
        for got in [alone.row(0), padded.row(i)] {
            let (mut dot, mut na, mut nb, mut max_abs) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for (a, b) in got.iter().zip(&r.embedding) {
                let (a, b) = (f64::from(*a), f64::from(*b));
                dot += a * b;
                na += a * a;
                nb += b * b;
                max_abs = max_abs.max((a - b).abs());
            }
            worst.min_cosine = worst.min_cosine.min(dot / (na.sqrt() * nb.sqrt()));
            worst.max_abs = worst.max_abs.max(max_abs);
        }
    }
    Ok(worst)
}

/// Checks the references in every precision of `precisions`, printing one
/// line each; false when one misses its bar.
fn golden_check(
    files: &[PathBuf],
    encoders: &[(Precision, Arc<SentenceEncoder>)],
    device: &flotilla_embed::Device,
    enforce: bool,
) -> anyhow::Result<bool> {
    let mut refs = Vec::new();
    for f in files {
        let bytes =
            std::fs::read(f).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
        let parsed: References = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{} is not a reference file: {e}", f.display()))?;
        refs.extend(parsed.sentences);
    }
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    println!(
        "{} on {device:?}: {} reference sentences of {}, alone and in one padded batch",
        if enforce {
            "golden check"
        } else {
            "compared (no bar)"
        },
        refs.len(),
        names.join(", ")
    );
    let mut all_ok = true;
    for (precision, encoder) in encoders {
        let precision = *precision;
        let a = agree(encoder, &refs)?;
        let (min_cosine, max_abs) = match precision {
            Precision::F32 => (0.9999, Some(1e-4)),
            Precision::Int8 => (0.99, None),
            Precision::F16 | Precision::Bf16 => (0.999, None),
        };
        let ok = a.token_mismatches == 0
            && a.min_cosine >= min_cosine
            && max_abs.is_none_or(|m| a.max_abs <= m);
        all_ok &= ok;
        if !enforce {
            println!(
                "{precision}: token ids {}, min cosine {:.7}, max abs diff {:.2e}",
                if a.token_mismatches == 0 {
                    "identical"
                } else {
                    "DIFFER"
                },
                a.min_cosine,
                a.max_abs
            );
            continue;
        }
        println!(
            "golden {precision}: {} sentences, token ids {}, min cosine {:.7} (bar {min_cosine}), max abs diff {:.2e}{} -> {}",
            a.sentences,
            if a.token_mismatches == 0 {
                "identical".to_owned()
            } else {
                format!("DIFFER for {}", a.token_mismatches)
            },
            a.min_cosine,
            a.max_abs,
            max_abs.map_or(String::new(), |m| format!(" (bar {m:e})")),
            if ok { "PASS" } else { "FAIL" }
        );
    }
    println!();
    Ok(all_ok)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.write_corpus {
        let rows = args.corpus.read()?;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (id, text) in &rows {
            serde_json::to_writer(&mut out, &serde_json::json!({"id": id, "text": text}))?;
            std::io::Write::write_all(&mut out, b"\n")?;
        }
        std::io::Write::flush(&mut out)?;
        println!("wrote {} rows to {}", rows.len(), path.display());
        return Ok(());
    }
    let configs: Vec<Config> = args
        .configs
        .iter()
        .map(|c| parse_config(c))
        .collect::<Result<_, _>>()?;
    let device = pick_device(args.device)?;
    let mut precisions: Vec<Precision> = Vec::new();
    for c in &configs {
        if !precisions.contains(&c.precision) {
            precisions.push(c.precision);
        }
    }
    if precisions.is_empty() {
        precisions.push(Precision::F32);
    }
    // One encoder per precision, loaded once: the golden check and the
    // timed runs share them.
    let rss_before = rss_bytes();
    let mut encoders: Vec<(Precision, Arc<SentenceEncoder>)> = Vec::new();
    for &p in &precisions {
        let encoder = SentenceEncoder::load_with(&args.corpus.model, &device, p)?;
        encoders.push((p, Arc::new(encoder)));
    }
    let rss_loaded = rss_bytes();
    let (first, encoder) = encoders[0].clone();
    println!(
        "model {} ({}), {} precision(s) loaded in {:.2} s each at most, +{:.0} MiB RSS; device {:?}",
        args.corpus.model.display(),
        encoder.revision().short(),
        encoders.len(),
        encoders
            .iter()
            .map(|(_, e)| e.load_time().as_secs_f64())
            .fold(0.0, f64::max),
        (rss_loaded.saturating_sub(rss_before)) as f64 / (1 << 20) as f64,
        device,
    );
    let golden_ok = args.golden.is_empty() || golden_check(&args.golden, &encoders, &device, true)?;
    if !args.golden_info.is_empty() {
        golden_check(&args.golden_info, &encoders, &device, false)?;
    }
    let texts: Vec<String> = args.corpus.read()?.into_iter().map(|(_, t)| t).collect();
    let texts = Arc::new(texts);
    println!("{} texts", texts.len());
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
    // Warm-up: one small batch per precision so lazy initialisation (and,
    // on a GPU, kernel compilation) is not timed.
    for (_, e) in &encoders {
        e.encode(&["warm up"])?;
    }

    println!(
        "{:<26} {:>9} {:>12} {:>10} {:>8} {:>13} {:>7} {:>7} {:>9} {:>7}",
        "config",
        "texts/s",
        "texts/CPU-s",
        "pad ratio",
        "wall s",
        "peak RSS MiB",
        "vs ST",
        "vs ORT",
        "vs ORT8",
        "vs ST16"
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
    let mut copies: Vec<Arc<SentenceEncoder>> = Vec::new();
    if args.model_per_worker {
        for _ in 1..most_workers {
            copies.push(Arc::new(SentenceEncoder::load_with(
                &args.corpus.model,
                &device,
                first,
            )?));
        }
    }
    for cfg in &configs {
        let encoder = encoders
            .iter()
            .find(|(p, _)| *p == cfg.precision)
            .map(|(_, e)| Arc::clone(e))
            .expect("an encoder per precision of the configurations");
        let plan = batches(&encoder, &texts, cfg.batch, cfg.sorted)?;
        reset_peak_rss();
        let cpu0 = process_cpu();
        let t0 = Instant::now();
        let (real, padded) = match cfg.layout {
            Layout::Pool(n) => pool(n)?.install(|| run_batches(&encoder, &texts, &plan))?,
            Layout::Workers(n) => {
                let mut handles = Vec::new();
                for w in 0..n {
                    // Worker 0 uses the shared encoder, the others their
                    // copy (of the first precision) when they have one.
                    let enc = match w.checked_sub(1).and_then(|i| copies.get(i)) {
                        Some(copy) if cfg.precision == first => Arc::clone(copy),
                        _ => Arc::clone(&encoder),
                    };
                    let share: Vec<Vec<usize>> = plan.iter().skip(w).step_by(n).cloned().collect();
                    let texts = Arc::clone(&texts);
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
        let per_s = texts.len() as f64 / wall;
        let ratio = |b: Option<f64>| b.map_or("-".to_owned(), |b| format!("{:.2}x", per_cpu / b));
        println!(
            "{:<26} {:>9.1} {:>12.1} {:>10.2} {:>8.1} {:>13.0} {:>7} {:>7} {:>9} {:>7}",
            cfg.label,
            per_s,
            per_cpu,
            padded as f64 / real as f64,
            wall,
            peak_rss_bytes() as f64 / (1 << 20) as f64,
            ratio(st.fp32),
            ratio(ort.fp32),
            ratio(ort.int8),
            st.fp16_per_s
                .map_or("-".to_owned(), |b| format!("{:.2}x", per_s / b)),
        );
    }
    println!(
        "process peak RSS (models loaded: {}) {:.0} MiB",
        encoders.len() + copies.len(),
        peak_rss_bytes() as f64 / (1 << 20) as f64
    );
    anyhow::ensure!(golden_ok, "the golden check failed (see its lines above)");
    Ok(())
}
