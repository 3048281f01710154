//! What a job is told: its input, output, model and limits.

use std::net::SocketAddr;
use std::path::PathBuf;

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

/// Settings of an embed job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Input: a file, a folder or a glob of JSONL or Parquet shards, local
    /// or an object store URL (see [`super::input`]).
    pub input: String,
    /// Output: a local folder, or an object store URL (`s3://bucket/prefix`).
    pub output: String,
    /// Part format.
    pub format: Format,
    /// Model folder.
    pub model: PathBuf,
    /// Input field holding the id.
    pub id_field: String,
    /// Input field holding the text.
    pub text_field: String,
    /// Input fields kept in the output beside `id` and `embedding`.
    pub output_columns: Vec<String>,
    /// Rows per batch.
    pub batch_size: usize,
    /// Rows read ahead and sorted by length before batches are cut from
    /// them (so a batch carries little padding); 0 cuts batches in input
    /// order. Batch ids depend on it.
    pub sort_window: usize,
    /// At most this many estimated tokens per batch, padding included
    /// (rows × the longest row's estimate: 2 + its bytes / 4); a batch
    /// closes early rather than pass it. Batch ids depend on it.
    pub max_batch_tokens: Option<usize>,
    /// Embedding actors per node, one model and one thread each (default:
    /// locally one per GPU where the actors run on GPUs, else this
    /// machine's CPUs; on a cluster one per GPU a worker reports, else one
    /// per CPU).
    pub actors_per_node: Option<usize>,
    /// What the embedding actors run on: a GPU of their node where there
    /// is one (`auto`, each actor its own GPU), the CPU, or a GPU or fail.
    pub device: crate::DeviceChoice,
    /// The float type of the model's dense layers and attention.
    pub precision: crate::Precision,
    /// Prepended to every text, as sentence-transformers' `prompt` (none:
    /// `prompt_name`'s, else the folder's default prompt, if it names one).
    pub prompt: Option<String>,
    /// One of the model folder's named prompts
    /// (`config_sentence_transformers.json`).
    pub prompt_name: Option<String>,
    /// Leading dimensions kept of each vector, renormalised (Matryoshka
    /// models); none: all of them.
    pub dim: Option<usize>,
    /// Texts per forward pass on the CPU, after sorting a batch by length;
    /// 0: a batch is one forward pass, tokenized while the one before runs
    /// (what an actor on a GPU always does).
    pub micro_batch: usize,
    /// Embedding actors in all (default: locally, `actors_per_node`; on a
    /// cluster, one per GPU or else per CPU of every worker, or
    /// `actors_per_node` on each).
    pub actors: Option<usize>,
    /// What each actor's bundle reserves on a cluster (default `cpu=1`, or
    /// `gpu=1` when every worker has GPUs).
    pub actor_resources: Option<flotilla::placement_groups::Resources>,
    /// How the actors' bundles are spread over the workers.
    pub placement: flotilla::placement_groups::Strategy,
    /// How long the actors' placement group may stay pending before the
    /// job fails.
    pub placement_timeout: std::time::Duration,
    /// Batches in flight at most (default: 2 per actor on a CPU, 4 per
    /// actor on a GPU).
    pub max_in_flight: Option<usize>,
    /// Bytes of batches in flight at most (texts and vectors).
    pub memory_budget: usize,
    /// Job id; default derived from the input, the batch size and the
    /// model revision.
    pub job_id: Option<String>,
    /// Run on a cluster instead of in this process.
    pub cluster: Option<ClusterConfig>,
    /// Show a progress bar (on a terminal); otherwise log progress lines.
    pub progress_bar: bool,
    /// How often one embedding actor may be restarted (after a panic or a
    /// failure) before the job stops.
    pub restart_limit: flotilla::supervisor::Intensity,
    /// Where to publish `(texts done, texts in all)` as the job goes (all
    /// known once the input is scanned; 0 before).
    pub progress_to: Option<tokio::sync::watch::Sender<(u64, u64)>>,
    /// Where to publish the id of the placement group the job's actors
    /// run in, once created (cluster mode).
    pub group_to: Option<tokio::sync::watch::Sender<String>>,
    /// The actors answer vectors of zeros without running the model: the
    /// job's CPU side (reading, tokenizing, batching, routing, writing)
    /// measured alone, as the `feed` bench does. The revision recorded in
    /// the manifest and the default job id starts with
    /// [`crate::actor::ZEROS_REVISION_PREFIX`], so such an output is never
    /// taken for, nor resumed as, the model's vectors.
    pub zeros: bool,
}

impl JobConfig {
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
            ("--memory-budget-mb", Some(self.memory_budget)),
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

    /// A local job from `input` to `output` with the model in `model` and
    /// every other setting at its default.
    pub fn new(
        input: impl Into<String>,
        output: impl Into<String>,
        model: impl Into<PathBuf>,
    ) -> Self {
        Self {
            input: input.into(),
            output: output.into(),
            format: Format::Parquet,
            model: model.into(),
            id_field: "id".into(),
            text_field: "text".into(),
            output_columns: Vec::new(),
            batch_size: DEFAULT_BATCH_SIZE,
            sort_window: DEFAULT_SORT_WINDOW,
            max_batch_tokens: None,
            actors_per_node: None,
            device: crate::DeviceChoice::Auto,
            precision: crate::Precision::F32,
            prompt: None,
            prompt_name: None,
            dim: None,
            micro_batch: DEFAULT_MICRO_BATCH,
            actors: None,
            actor_resources: None,
            placement: flotilla::placement_groups::Strategy::Spread,
            placement_timeout: std::time::Duration::from_secs(30),
            max_in_flight: None,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            job_id: None,
            cluster: None,
            progress_bar: false,
            restart_limit: flotilla::supervisor::Intensity::default(),
            progress_to: None,
            group_to: None,
            zeros: false,
        }
    }
}

/// How the driver joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The head's address.
    pub head: SocketAddr,
    /// Folder with `ca.crt` and the driver's certificate and key.
    pub certs: PathBuf,
    /// The driver's node name (its certificate's name).
    pub name: String,
    /// UDP address the driver listens on (default: the local address that
    /// routes to the head, any port).
    pub listen: Option<SocketAddr>,
    /// The cluster cookie.
    pub cookie: Option<String>,
    /// Capacity of the driver's object store in bytes (`None`: the node
    /// default). Batches hand their texts to the actors as objects of it
    /// while it takes them, and carry them in the requests otherwise.
    pub object_store_bytes: Option<u64>,
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
