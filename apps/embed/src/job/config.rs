//! What a job is told: its input, output, model and limits, defined once
//! for the command line, Rust programs and detached jobs.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::sink::Format;

/// Rows per batch unless told otherwise.
pub const DEFAULT_BATCH_SIZE: usize = 64;
/// Texts per forward pass on the CPU unless told otherwise (the embedding
/// actor's default).
pub use crate::actor::DEFAULT_MICRO_BATCH;
/// Rows of a length-sorted window unless told otherwise.
pub const DEFAULT_SORT_WINDOW: usize = 4096;
/// Bytes of batches in flight at most unless told otherwise: 512 MiB.
pub const DEFAULT_MEMORY_BUDGET: usize = 512 << 20;

/// A job setting out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} is {value}: {rule}")]
pub struct SettingError {
    /// The setting, as the command line names it.
    pub name: &'static str,
    /// The value given.
    pub value: String,
    /// What it must be.
    pub rule: &'static str,
}

/// Settings of an embed job, defined once: the flags of `node embed`
/// (`clap`), the fields a Rust program sets, and the wire form of a
/// detached job (`serde`, see [`super::detached::DetachedJob`]). What
/// belongs to one run only (how it reaches a cluster, where it reports
/// progress) is neither a flag nor sent.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Input: a file, a folder or a glob of JSONL (`.jsonl`, `.jsonl.gz`,
    /// `.jsonl.zst`; one object per line) or Parquet (`.parquet`) shards,
    /// local or an object store URL (`s3://bucket/corpus/`, `file:///…`).
    /// Quote a glob so the shell leaves it alone.
    #[arg(long)]
    pub input: String,
    /// Output: a local folder or an object store URL (parts, manifest,
    /// errors file).
    #[arg(long)]
    pub output: String,
    /// Format of the output parts.
    #[arg(long, value_enum, default_value_t = Format::Parquet)]
    pub format: Format,
    /// Model folder (Hugging Face layout).
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    pub model: PathBuf,
    /// Input field with the id.
    #[arg(long = "id-column", value_name = "COLUMN", default_value = "id")]
    pub id_field: String,
    /// Input field with the text.
    #[arg(long = "text-column", value_name = "COLUMN", default_value = "text")]
    pub text_field: String,
    /// Input fields to keep in the output beside `id` and `embedding`
    /// (comma-separated; the text column may be one).
    #[arg(long, value_delimiter = ',')]
    pub output_columns: Vec<String>,
    /// Rows per batch.
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Rows read ahead and sorted by length before batches are cut from
    /// them, so batches carry little padding (0: batches in input order,
    /// as outputs written before windows; batch ids depend on it).
    #[arg(long, default_value_t = DEFAULT_SORT_WINDOW)]
    pub sort_window: usize,
    /// Estimated tokens per batch at most, padding included (rows × the
    /// longest row's 2 + bytes/4): long texts go in smaller batches. Batch
    /// ids depend on it.
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Embedding actors per node, one model and one core each (default:
    /// one per GPU where they run on GPUs, else the CPUs; on a cluster,
    /// one per GPU a worker reports, else its CPUs).
    #[arg(long)]
    pub actors_per_node: Option<usize>,
    /// Embedding actors in all (default: locally the CPUs; on a cluster
    /// one per GPU of every worker with GPUs, else one per CPU, or
    /// --actors-per-node on each worker).
    #[arg(long)]
    pub actors: Option<usize>,
    /// What the embedding actors run on: `auto` (each actor one GPU of its
    /// node where the node has GPUs and the binary was built with the
    /// `cuda` feature, else the CPU, saying why), `cpu`, or `cuda` (a GPU,
    /// or the job fails).
    #[arg(long, default_value = "auto")]
    #[serde(with = "as_text")]
    pub device: crate::DeviceChoice,
    /// Number type of the model's dense layers: f32, f16 or bf16 (and
    /// attention in it too), or int8 on the CPU (quantized matrix
    /// products, vectors within cosine 0.99 of f32's, faster). Embeddings,
    /// layer norms and pooling stay f32.
    #[arg(long, default_value = "f32")]
    #[serde(with = "as_text")]
    pub precision: crate::Precision,
    /// Text put before every input text, as sentence-transformers'
    /// `prompt` (e5 models: "query: " or "passage: "). Default: the
    /// model folder's default prompt, if it names one.
    #[arg(long, conflicts_with = "prompt_name")]
    pub prompt: Option<String>,
    /// One of the model folder's named prompts
    /// (config_sentence_transformers.json), e.g. `query`.
    #[arg(long)]
    pub prompt_name: Option<String>,
    /// Keep the first N dimensions of every vector, renormalised
    /// (Matryoshka models); at most the model's width.
    #[arg(long)]
    pub dim: Option<usize>,
    /// Texts per forward pass on the CPU, after sorting a batch by length;
    /// 0: a batch is one forward pass, tokenized while the one before runs
    /// (what actors on GPUs always do).
    #[arg(long, default_value_t = DEFAULT_MICRO_BATCH)]
    pub micro_batch: usize,
    /// What each actor's placement-group bundle reserves on a cluster, as
    /// NAME=AMOUNT[,NAME=AMOUNT…] (default `cpu=1`, or `gpu=1` when every
    /// worker has GPUs).
    #[arg(long, value_parser = flotilla::placement_groups::parse_bundle)]
    pub actor_resources: Option<flotilla::placement_groups::Resources>,
    /// How the actors' bundles are spread over the workers: pack, spread,
    /// strict-pack or strict-spread.
    #[arg(long, default_value = "spread")]
    #[serde(with = "as_text")]
    pub placement: flotilla::placement_groups::Strategy,
    /// How long the actors' placement group may wait for resources before
    /// the job fails, naming what is short where, in seconds.
    #[arg(long, default_value_t = 30)]
    pub placement_timeout_s: u64,
    /// Batches in flight at most (default: 2 per actor on a CPU, 4 per
    /// actor on a GPU).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Bytes of batches in flight at most (texts and vectors), in MiB.
    #[arg(long, default_value_t = DEFAULT_MEMORY_BUDGET >> 20)]
    pub memory_budget_mb: usize,
    /// Job id (default: from the input's content, the settings batch ids
    /// depend on, and the model revision).
    #[arg(long)]
    pub job_id: Option<String>,
    /// Restarts allowed per embedding actor within --restart-window-s (a
    /// panicking actor is restarted with its model reloaded, after a wait
    /// from 100 ms doubling to 10 s); one more and the job stops.
    #[arg(long, default_value_t = 5)]
    pub max_restarts: u32,
    /// The window of --max-restarts, in seconds.
    #[arg(long, default_value_t = 60)]
    pub restart_window_s: u64,
    /// How the driver reaches a cluster; without `head`, the job runs in
    /// this process.
    #[command(flatten)]
    #[serde(skip)]
    pub cluster: flotilla_data::job::Join,
    /// Show a progress bar (on a terminal); otherwise log progress lines.
    #[arg(skip)]
    #[serde(skip)]
    pub progress_bar: bool,
    /// Where to publish `(texts done, texts in all)` as the job goes (all
    /// known once the input is scanned; 0 before).
    #[arg(skip)]
    #[serde(skip)]
    pub progress_to: Option<tokio::sync::watch::Sender<(u64, u64)>>,
    /// Where to publish the id of the placement group the job's actors
    /// run in, once created (cluster mode).
    #[arg(skip)]
    #[serde(skip)]
    pub group_to: Option<tokio::sync::watch::Sender<String>>,
    /// The actors answer vectors of zeros without running the model: the
    /// job's CPU side (reading, tokenizing, batching, routing, writing)
    /// measured alone, as the `feed` bench does. The revision recorded in
    /// the manifest and the default job id starts with
    /// [`crate::actor::ZEROS_REVISION_PREFIX`], so such an output is never
    /// taken for, nor resumed as, the model's vectors.
    #[arg(skip)]
    #[serde(skip)]
    pub zeros: bool,
}

/// Serde of a setting by its text (`auto`, `int8`, `strict-spread`): the
/// form its flag takes.
mod as_text {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<T: std::fmt::Display, S: Serializer>(
        value: &T,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: std::str::FromStr<Err: std::fmt::Display>,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

/// The job's flags alone, parsed as `node embed` parses them.
#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    job: JobConfig,
}

impl JobConfig {
    /// Parses `args` as the flags of `node embed` (`--input`, `--output`,
    /// `--batch-size 48`, …); settings not given take their defaults.
    pub fn from_flags<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;
        let flags = std::iter::once(std::ffi::OsString::from("embed"))
            .chain(args.into_iter().map(Into::into));
        Ok(Flags::try_parse_from(flags)?.job)
    }

    /// A local job from `input` to `output` with the model in `model` and
    /// every other setting at its default.
    pub fn new(
        input: impl Into<String>,
        output: impl Into<String>,
        model: impl Into<PathBuf>,
    ) -> Self {
        let mut job = Self::from_flags(["--input=", "--output="]).expect("the defaults parse");
        job.input = input.into();
        job.output = output.into();
        job.model = model.into();
        job
    }

    /// How often one embedding actor may be restarted (after a panic or a
    /// failure) before the job stops.
    pub fn restart_limit(&self) -> flotilla::supervisor::Intensity {
        flotilla::supervisor::Intensity {
            max_restarts: self.max_restarts,
            within: Duration::from_secs(self.restart_window_s.max(1)),
        }
    }

    /// How long the actors' placement group may stay pending.
    pub fn placement_timeout(&self) -> Duration {
        Duration::from_secs(self.placement_timeout_s)
    }

    /// Bytes of batches in flight at most.
    pub fn memory_budget(&self) -> usize {
        self.memory_budget_mb.saturating_mul(1 << 20)
    }

    /// Checks every setting's range: counts that must be positive are
    /// (batch size, token budget, actors, batches in flight, memory
    /// budget, dimensions). A job that fails this reads nothing.
    pub fn check(&self) -> Result<(), SettingError> {
        let positive: [(&'static str, Option<usize>); 7] = [
            ("--batch-size", Some(self.batch_size)),
            ("--max-batch-tokens", self.max_batch_tokens),
            ("--actors", self.actors),
            ("--actors-per-node", self.actors_per_node),
            ("--max-in-flight", self.max_in_flight),
            ("--memory-budget-mb", Some(self.memory_budget_mb)),
            ("--dim", self.dim),
        ];
        for (name, value) in positive {
            if value == Some(0) {
                return Err(SettingError {
                    name,
                    value: "0".into(),
                    rule: "it must be at least 1",
                });
            }
        }
        Ok(())
    }

    /// What the job makes of the model in `folder`'s vectors, or why the
    /// folder cannot do what the job asks (a prompt name it lacks, more
    /// dimensions than it has).
    pub fn embed_options(
        &self,
        folder: &crate::ModelFolder,
    ) -> Result<crate::EmbedOptions, crate::LoadError> {
        folder.embed_options(
            self.prompt.as_deref(),
            self.prompt_name.as_deref(),
            self.dim,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_that_must_be_positive_are_refused_at_zero_by_name() {
        let ok = JobConfig::new("in", "out", "model");
        assert!(ok.check().is_ok());
        let mut c = ok.clone();
        c.batch_size = 0;
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("--batch-size is 0"), "{e}");
        let mut c = ok.clone();
        c.dim = Some(0);
        assert!(c.check().unwrap_err().to_string().contains("--dim"));
        let mut c = ok;
        c.max_in_flight = Some(0);
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("--max-in-flight")
        );
    }
}
