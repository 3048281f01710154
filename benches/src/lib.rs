//! Shared measuring helpers for the benchmark programs in `src/bin/`.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

/// Process CPU time (user + system, all threads) since start.
pub fn process_cpu() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}

pub use flotilla::process::{peak_rss_bytes, reset_peak_rss, rss_bytes};

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
    /// JSONL corpus, one `{"id": …, "text": …}` per line.
    #[arg(long, default_value = "../shared/data/corpus-4k.jsonl")]
    pub corpus: PathBuf,
    /// How many texts of the corpus to embed.
    #[arg(long, default_value_t = 1024)]
    pub texts: usize,
}

impl CorpusArgs {
    /// The first `texts` rows of the corpus, as `(id, text)`.
    pub fn read(&self) -> anyhow::Result<Vec<(String, String)>> {
        let file = std::fs::File::open(&self.corpus)
            .with_context(|| format!("cannot open {}", self.corpus.display()))?;
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
}
