//! Shared measuring helpers for the benchmark programs in `src/bin/`.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

pub mod arithmetic;

/// Process CPU time (user + system, all threads) since start.
pub fn process_cpu() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}

pub use flotilla::process::{peak_rss_bytes, reset_peak_rss, rss_bytes};

/// Runs a same-run rival, `benches/python/SCRIPT` (of the current
/// directory's checkout, else of the one the bench was built from) under
/// `python` with `args`, and returns the JSON objects it printed, one a line. A failure
/// carries the tail of what the script wrote to stderr.
pub fn run_rival(
    python: &std::path::Path,
    script: &str,
    args: &[std::ffi::OsString],
) -> anyhow::Result<Vec<serde_json::Value>> {
    // The checkout the bench runs in (a binary carried to another machine
    // runs from the repository root there), else the one it was built in.
    let here = PathBuf::from("benches/python").join(script);
    let path = if here.is_file() {
        here
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("python")
            .join(script)
    };
    let out = std::process::Command::new(python)
        .arg(&path)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::bail!("{script} failed ({}):\n{}", out.status, tail.join("\n"));
    }
    String::from_utf8(out.stdout)?
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).with_context(|| format!("{script} printed {l:?}")))
        .collect()
}

/// Median of a slice of samples (sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    percentile(samples, 0.5)
}

/// The `p`-quantile (0..=1) of samples, nearest-rank; sorts in place.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[rank]
}

/// The model and texts a model benchmark runs on.
#[derive(Debug, Clone, clap::Args)]
pub struct CorpusArgs {
    /// Model folder.
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    pub model: PathBuf,
    /// JSONL corpus, one `{"id": …, "text": …}` per line (default: the
    /// synthetic corpus of `flotilla_testkit::corpus`, seed 1).
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// How many texts of the corpus to embed.
    #[arg(long, default_value_t = 1024)]
    pub texts: usize,
}

impl CorpusArgs {
    /// The first `texts` rows of the corpus, as `(id, text)`.
    pub fn read(&self) -> anyhow::Result<Vec<(String, String)>> {
        let Some(corpus) = &self.corpus else {
            let seed = flotilla_testkit::corpus::DEFAULT_SEED;
            return Ok(flotilla_testkit::corpus::rows(seed, self.texts as u64).collect());
        };
        let file = std::fs::File::open(corpus)
            .with_context(|| format!("cannot open {}", corpus.display()))?;
        let mut rows = Vec::new();
        for line in std::io::BufReader::new(file).lines().take(self.texts) {
            let v: serde_json::Value = serde_json::from_str(&line?)?;
            rows.push((
                v["id"].as_str().context("line without an id")?.to_owned(),
                v["text"]
                    .as_str()
                    .context("line without a text")?
                    .to_owned(),
            ));
        }
        Ok(rows)
    }

    /// A JSONL file holding the rows [`CorpusArgs::read`] returns, for
    /// programs outside this process (the Python baselines): the corpus
    /// file itself, or the synthetic rows written under `dir`.
    pub fn file(&self, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
        if let Some(corpus) = &self.corpus {
            return Ok(corpus.clone());
        }
        let path = dir.join(format!("flotilla-corpus-{}.jsonl", self.texts));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        flotilla_testkit::corpus::write_jsonl(
            &mut out,
            flotilla_testkit::corpus::DEFAULT_SEED,
            self.texts as u64,
        )?;
        std::io::Write::flush(&mut out)?;
        Ok(path)
    }
}

/// One run of the embed job in this process.
#[derive(Debug, Clone, Copy)]
pub struct JobRun {
    /// Texts embedded.
    pub texts: u64,
    /// Wall time of the whole run, load included.
    pub wall: Duration,
    /// CPU time of the process over the run, every thread.
    pub cpu: Duration,
}

impl JobRun {
    /// Texts per second and texts per CPU-second between `smaller` and
    /// this run: what the texts the larger run adds cost, without the
    /// load and start both pay.
    pub fn marginal(&self, smaller: &JobRun) -> (f64, f64) {
        let texts = self.texts.saturating_sub(smaller.texts) as f64;
        (
            texts / self.wall.saturating_sub(smaller.wall).as_secs_f64(),
            texts / self.cpu.saturating_sub(smaller.cpu).as_secs_f64(),
        )
    }
}

/// Runs the embed job of `config` (what `node embed` runs) in this
/// process, timed, and removes its output folder after.
pub async fn time_job(config: flotilla_embed::job::JobConfig) -> anyhow::Result<JobRun> {
    let output = PathBuf::from(&config.job.output);
    let _ = std::fs::remove_dir_all(&output);
    let (cpu0, wall0) = (process_cpu(), std::time::Instant::now());
    let summary = flotilla_embed::job::run(config).await?;
    let run = JobRun {
        texts: summary.job.rows,
        wall: wall0.elapsed(),
        cpu: process_cpu() - cpu0,
    };
    anyhow::ensure!(
        summary.devices.contains("cpu"),
        "the actors ran on {}",
        summary.devices
    );
    std::fs::remove_dir_all(&output)?;
    Ok(run)
}

/// Writes `rows` (id, text) as JSONL to `path`, as the job reads them.
pub fn write_jsonl(path: &std::path::Path, rows: &[(String, String)]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (id, text) in rows {
        serde_json::to_writer(&mut out, &serde_json::json!({"id": id, "text": text}))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
