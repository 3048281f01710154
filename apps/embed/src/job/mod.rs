//! The embed job: the data layer's batch job (`flotilla_data::job`) with
//! resident embedding actors, in this process (the embedded default) or
//! in a placement group of the job's own on the workers of a cluster.
//!
//! ```text
//! input ─► flotilla_data::job (windows, ids, pipeline, supervision, output, errors file)
//!       ─► Embedder actors (texts in the request or as an object) ─► EmbedStage::judge
//!          (batch id, revision, width) ─► parts of vectors (Parquet or JSON lines)
//! ```
//!
//! What is the embed job's own: its settings ([`JobConfig`], the flags of
//! `node embed` and the detached form), its stage, its manifest and parts,
//! its job id, and the model facts in its [`Summary`]. Memory stays flat
//! as the input grows: only the batches in flight and a few chunks of rows
//! read ahead are held, plus a 16-byte digest per id to refuse duplicates.
//!
//! May import: `actor`, `encoder` and the shared files.

mod cluster;
mod config;
pub mod detached;
mod driver;
mod local;
pub mod sink;
mod stage;
mod summary;

pub use config::{
    DEFAULT_BATCH_SIZE, DEFAULT_MEMORY_BUDGET, DEFAULT_MICRO_BATCH, DEFAULT_SORT_WINDOW, JobConfig,
    SettingError,
};
pub use flotilla_data::SourceError;
pub use flotilla_data::job::ActorStartError;
pub use flotilla_data::{Input, InputError, input, source};
pub use sink::{Format, SinkError};
pub use summary::Summary;

/// Why a job failed. Rows refused one by one are not failures: they go to
/// the errors file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// The input names nothing usable.
    #[error(transparent)]
    Input(#[from] InputError),
    /// There is no model folder where the job looks.
    #[error(
        "no model folder at {0}: run `scripts/fetch-model` to place all-MiniLM-L6-v2 there, or pass --model DIR (a sentence-transformers folder in Hugging Face layout)"
    )]
    NoModel(std::path::PathBuf),
    /// The model folder is unusable.
    #[error(transparent)]
    Model(#[from] crate::LoadError),
    /// A setting is out of its range (`--batch-size 0`, say).
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// An embedding actor in this process did not start.
    #[error(transparent)]
    Actor(#[from] ActorError),
    /// The driver could not join the cluster.
    #[error("cannot join the cluster at {head}: {source}")]
    Join {
        /// The head's address.
        head: std::net::SocketAddr,
        /// Why the node did not start or join.
        source: flotilla::StartError,
    },
    /// The cluster offers no usable worker.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The batch job failed: its input could not be read on, its output
    /// written, every worker was lost, or batches failed on every attempt.
    #[error(transparent)]
    Batch(flotilla_data::BatchJobError),
    /// An embedding actor failed more often than its restart limit allows.
    #[error(
        "embedding actor {}: more than {} restarts within {:?} (--max-restarts, --restart-window-s); the job stopped: rerun to resume (completed batches are kept)",
        .0.child, .0.max_restarts, .0.within
    )]
    RestartLimit(flotilla::supervisor::Escalation),
}

/// Why the embedding actors of a local job did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActorError {
    /// An actor (or the job's supervisor) did not start (its model did
    /// not load), or did not describe its model in time.
    #[error("embedding {0}")]
    Start(#[source] ActorStartError),
    /// Two actors loaded different weights.
    #[error("actors loaded different weights: {0} and {1}")]
    Revisions(String, String),
}

/// Why a cluster job found no usable worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// No worker node is up.
    #[error("cluster: no worker node is up (`node status` lists the members)")]
    NoWorkerUp,
    /// No embedding actor started anywhere.
    #[error("cluster: no embedding actor started on any worker: {}", list(.0))]
    NoActorStarted(Vec<(flotilla::MemberName, ActorStartError)>),
    /// No worker has the job's model revision.
    #[error("cluster: no worker has model revision {0}")]
    NoMatchingRevision(String),
    /// The actors' placement group could not be placed.
    #[error("cluster: the embedding actors cannot be placed: {0}")]
    Placement(Box<flotilla::placement_groups::PlacementError>),
}

fn list(failures: &[(flotilla::MemberName, ActorStartError)]) -> String {
    failures
        .iter()
        .map(|(node, why)| format!("{node}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the job: in this process, or on the cluster of
/// [`JobConfig::cluster`]. Safe to run again on the same output: completed
/// batches are skipped, the rest are computed.
pub async fn run(config: JobConfig) -> Result<Summary, JobError> {
    config.check()?;
    match config.job.cluster.first_head() {
        None => local::run(config).await,
        Some(head) => cluster::run(config, head).await,
    }
}
