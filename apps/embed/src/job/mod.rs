//! The embed job: a JSONL or Parquet input streamed in batches with stable
//! ids, resident embedding actors in this process (the embedded default) or
//! on every worker of a cluster, the framework's bounded pipeline between
//! them, idempotent output and resume.
//!
//! ```text
//! source ─► batches (id = ordinal) ─► flotilla::pipeline (≤ M in flight,
//!     least loaded, deadlines, retries) ─► Embedder actors (local or remote)
//!     ─► checks (batch id, revision, dim) ─► Sink part (local folder or object store)
//! ```
//!
//! Memory stays flat as the input grows: only the batches in flight are
//! held, plus a 16-byte digest per id to refuse duplicates.

mod cluster;
mod progress;
pub mod sink;
pub mod source;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use flotilla::pipeline::{BatchId, Event, Pipeline, PipelineConfig, RpcReplyPort, Stage, Verdict};
use flotilla::ractor::{Actor, ActorRef, call_t};

use crate::actor::{
    EmbedMsg, EmbedOutcome, EmbedReply, EmbedRequest, Embedder, EmbedderArgs, ModelInfo,
};
use crate::model_folder::ModelFolder;
pub use sink::Format;
use sink::{Manifest, RowError, Sink, SinkError};
use source::{Item, SourceError};

/// Settings of a local embed job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Input: Parquet when it ends in `.parquet`, JSONL otherwise.
    pub input: PathBuf,
    /// Output: a local folder, or an object store URL (`s3://bucket/prefix`).
    pub output: PathBuf,
    /// Part format.
    pub format: Format,
    /// Model folder.
    pub model: PathBuf,
    /// Input field holding the id.
    pub id_field: String,
    /// Input field holding the text.
    pub text_field: String,
    /// Rows per batch.
    pub batch_size: usize,
    /// Embedding actors per node, one model and one thread each (default:
    /// this machine's CPUs locally; on a cluster one per GPU a worker
    /// reports, else one per CPU).
    pub actors_per_node: Option<usize>,
    /// Batches in flight at most (default: 2 per actor).
    pub max_in_flight: Option<usize>,
    /// Bytes of batches in flight at most (texts and vectors).
    pub memory_budget: usize,
    /// Job id; default derived from the input's content, the batch size and
    /// the model revision.
    pub job_id: Option<String>,
    /// Run on a cluster instead of in this process.
    pub cluster: Option<ClusterConfig>,
    /// Show a progress bar (on a terminal); otherwise log progress lines.
    pub progress_bar: bool,
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
}

/// What a job did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Job id.
    pub job_id: String,
    /// Rows embedded by this run.
    pub texts: u64,
    /// Batches embedded by this run.
    pub batches: u64,
    /// Batches found complete and skipped.
    pub skipped_batches: u64,
    /// Rows refused (malformed, duplicate, rejected by the model).
    pub rejected_rows: u64,
    /// Sends after the first of a batch (failures, deadlines, lost workers).
    pub retries: u64,
    /// Batches moved off a worker that went down.
    pub redispatches: u64,
    /// Embedding actors used.
    pub actors: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// When every actor had its model loaded, from the start.
    pub ready_after: Duration,
    /// When the first batch was written, from the start.
    pub first_batch_after: Option<Duration>,
    /// Model load time of the slowest actor.
    pub model_load: Duration,
    /// Median batch latency.
    pub batch_p50: Duration,
    /// 95th percentile batch latency.
    pub batch_p95: Duration,
    /// Peak resident memory of this process, in bytes (Linux; 0 elsewhere).
    pub peak_rss: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = self.texts as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let first = self
            .first_batch_after
            .map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        write!(
            f,
            "job {}: {} texts in {} batches ({} skipped as done) on {} actors, {} rows rejected, {} retries ({} re-dispatched from lost workers), {:.1} s, {:.1} texts/s, first batch after {}, batch p50 {:.0} ms p95 {:.0} ms, model load {:.2} s, peak RSS {} MiB",
            self.job_id,
            self.texts,
            self.batches,
            self.skipped_batches,
            self.actors,
            self.rejected_rows,
            self.retries,
            self.redispatches,
            self.elapsed.as_secs_f64(),
            rate,
            first,
            self.batch_p50.as_secs_f64() * 1e3,
            self.batch_p95.as_secs_f64() * 1e3,
            self.model_load.as_secs_f64(),
            self.peak_rss >> 20
        )
    }
}

/// Why a job failed. Rows refused one by one are not failures: they go to
/// the errors file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// The input cannot be read.
    #[error("input {path}: {source}")]
    Input {
        /// The input file.
        path: PathBuf,
        /// What failed.
        source: SourceError,
    },
    /// The model folder is unusable.
    #[error(transparent)]
    Model(#[from] crate::LoadError),
    /// The output folder is unusable.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// An embedding actor did not start.
    #[error("embedding actor failed to start: {0}")]
    Actor(String),
    /// The driver could not join the cluster.
    #[error("cannot join the cluster at {head}: {source}")]
    Join {
        /// The head's address.
        head: std::net::SocketAddr,
        /// Why the node did not start or join.
        source: flotilla::StartError,
    },
    /// The cluster offers no usable worker.
    #[error("cluster: {0}")]
    Cluster(String),
    /// Every worker was lost with batches still to do.
    #[error("{0}; rerun to finish the job (completed batches are kept)")]
    NoWorkers(flotilla::pipeline::PipelineError),
    /// Batches failed on every attempt.
    #[error("{0} batches failed on every attempt; rerun to retry them")]
    Incomplete(u64),
}

/// A batch held while in flight.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    ids: Vec<String>,
    lines: Vec<u64>,
    texts: Vec<String>,
}

/// How the job talks to embedding actors: one [`EmbedRequest`] per batch,
/// and a result accepted only with the job's batch id, revision and width.
pub(crate) struct EmbedStage {
    revision: String,
    dim: u32,
}

impl Stage for EmbedStage {
    type Msg = EmbedMsg;
    type Batch = Batch;
    type Reply = EmbedReply;
    type Output = Vec<f32>;

    fn request(&self, id: BatchId, batch: &Batch, reply: RpcReplyPort<EmbedReply>) -> EmbedMsg {
        EmbedMsg::Embed(
            EmbedRequest {
                batch_id: id.0,
                texts: batch.texts.clone(),
            },
            reply,
        )
    }

    fn judge(&self, id: BatchId, batch: &Batch, reply: EmbedReply) -> Verdict<Vec<f32>> {
        match reply {
            EmbedReply {
                batch_id,
                outcome: EmbedOutcome::Embedded(v),
            } if batch_id == id.0
                && v.revision == self.revision
                && v.dim == self.dim
                && v.values.len() == batch.ids.len() * self.dim as usize =>
            {
                Verdict::Done(v.values)
            }
            EmbedReply {
                outcome: EmbedOutcome::BadInput(reason),
                ..
            } => Verdict::BadInput(reason),
            other => Verdict::Retry(format!("refused a result: {}", describe(&other))),
        }
    }

    fn weight(&self, batch: &Batch) -> usize {
        let text: usize = batch.texts.iter().map(String::len).sum();
        let ids: usize = batch.ids.iter().map(String::len).sum();
        // The request's copy of the texts, and the vectors coming back.
        2 * text + ids + batch.ids.len() * self.dim as usize * 4
    }
}

/// Embedding actors the job runs on, where they run, and what they loaded.
pub(crate) struct Workers {
    /// `(node, actor)` pairs.
    pub(crate) actors: Vec<(String, ActorRef<EmbedMsg>)>,
    /// The model every actor loaded.
    pub(crate) info: ModelInfo,
}

impl Workers {
    /// Workers whose actors reported `infos` (same revision, in order):
    /// the job's model facts are the first actor's, with the slowest load.
    pub(crate) fn new(
        actors: Vec<(String, ActorRef<EmbedMsg>)>,
        infos: &[ModelInfo],
    ) -> Option<Self> {
        let first = infos.first()?.clone();
        let info = ModelInfo {
            load_ms: infos.iter().map(|i| i.load_ms).max().unwrap_or(0),
            ..first
        };
        Some(Self { actors, info })
    }
}

/// What each embedding actor of the job is started with.
pub(crate) fn embedder_args(config: &JobConfig) -> EmbedderArgs {
    EmbedderArgs {
        model_dir: config.model.to_string_lossy().into_owned(),
        threads: 1,
        micro_batch: 16,
    }
}

/// Runs the job: in this process, or on the cluster of
/// [`JobConfig::cluster`]. Safe to run again on the same output: completed
/// batches are skipped, the rest are computed.
pub async fn run(config: JobConfig) -> Result<Summary, JobError> {
    match config.cluster.clone() {
        None => run_local(config).await,
        Some(cluster) => cluster::run(config, cluster).await,
    }
}

/// Runs the job with actors in this process.
async fn run_local(config: JobConfig) -> Result<Summary, JobError> {
    let started = Instant::now();
    // Configuration errors name the file at fault before any model loads.
    ModelFolder::open(&config.model)?;

    // The actors load the model; the revision and width of the job are what
    // they report, so the weights are read and hashed once per actor only.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let count = config.actors_per_node.unwrap_or(cpus).max(1);
    let mut actors: Vec<(String, ActorRef<EmbedMsg>)> = Vec::with_capacity(count);
    let mut infos: Vec<ModelInfo> = Vec::with_capacity(count);
    for _ in 0..count {
        let spawned = match Actor::spawn(None, Embedder::default(), embedder_args(&config)).await {
            Ok((actor, _)) => call_t!(actor, EmbedMsg::Info, 10_000)
                .map(|info| (actor, info))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match spawned {
            Ok((actor, info)) => {
                actors.push(("local".to_owned(), actor));
                infos.push(info);
            }
            Err(e) => {
                stop(&actors);
                return Err(JobError::Actor(e));
            }
        }
    }
    let first = infos[0].clone();
    if let Some(other) = infos.iter().find(|i| i.revision != first.revision) {
        stop(&actors);
        return Err(JobError::Actor(format!(
            "actors loaded different weights: {} and {}",
            first.revision, other.revision
        )));
    }
    let workers = Workers::new(actors, &infos).expect("at least one actor");
    let result = drive(&config, started, &workers, None).await;
    stop(&workers.actors);
    result
}

fn stop(actors: &[(String, ActorRef<EmbedMsg>)]) {
    for (_, a) in actors {
        a.stop(None);
    }
}

/// The pipeline's limits for `actors` embedding actors: `max_in_flight`
/// if given, else the framework's default of two per actor.
fn pipeline_config(actors: usize, max_in_flight: Option<usize>) -> PipelineConfig {
    let config = PipelineConfig::for_workers(actors, crate::actor::BATCH_DEADLINE);
    PipelineConfig {
        max_in_flight: max_in_flight.map_or(config.max_in_flight, |m| m.max(1)),
        ..config
    }
}

/// Removes the workers of every node that is no longer up; their batches
/// go to the others.
fn drop_lost_workers(pipeline: &mut Pipeline<EmbedStage>, table: &flotilla::Table) {
    let lost: std::collections::BTreeSet<String> = pipeline
        .nodes()
        .filter(|node| {
            table
                .get(node)
                .is_none_or(|m| m.state != flotilla::MemberState::Up)
        })
        .map(str::to_owned)
        .collect();
    for node in lost {
        let actors = pipeline.remove_node(&node);
        tracing::warn!(%node, actors, in_flight = pipeline.in_flight(), "worker node lost; its batches go to the other workers");
    }
}

/// The job proper, once the actors run. With `members`, workers whose node
/// goes down or leaves are dropped and their batches sent elsewhere.
pub(crate) async fn drive(
    config: &JobConfig,
    started: Instant,
    workers: &Workers,
    mut members: Option<tokio::sync::watch::Receiver<flotilla::Table>>,
) -> Result<Summary, JobError> {
    // Every actor has its model: what follows is the job itself.
    let ready_after = started.elapsed();
    let info = &workers.info;
    let revision = crate::ModelRevision::new(info.revision.clone());
    let batch_size = config.batch_size.max(1);
    let scan =
        source::scan(&config.input, config.job_id.is_none()).map_err(|e| JobError::Input {
            path: config.input.clone(),
            source: e.into(),
        })?;
    let job_id = match &config.job_id {
        Some(id) => id.clone(),
        None => {
            let digest: String = scan.digest.expect("hashed without a job id")[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("{digest}-b{batch_size}-{}", revision.short())
        }
    };
    let manifest = Manifest {
        job_id: job_id.clone(),
        model_revision: revision.to_string(),
        dim: info.dim,
        batch_size: batch_size as u32,
        format: config.format,
    };
    let (sink, done) = Sink::open(&config.output, &manifest).await?;
    let mut source =
        source::open(&config.input, &config.id_field, &config.text_field).map_err(|source| {
            JobError::Input {
                path: config.input.clone(),
                source,
            }
        })?;

    let mut pipeline = Pipeline::new(
        EmbedStage {
            revision: manifest.model_revision.clone(),
            dim: info.dim,
        },
        PipelineConfig {
            memory_budget: config.memory_budget,
            ..pipeline_config(workers.actors.len(), config.max_in_flight)
        },
    );
    for (node, actor) in &workers.actors {
        pipeline.add_worker(node, actor.clone());
    }

    let mut summary = Summary {
        job_id,
        model_load: Duration::from_millis(info.load_ms),
        actors: workers.actors.len(),
        ready_after,
        ..Summary::default()
    };
    let mut progress = progress::Progress::new(config.progress_bar, scan.rows);
    let mut errors: Vec<RowError> = Vec::new();
    let mut next_batch = 0u64;
    let mut pending = Batch::default();
    let mut exhausted = false;
    let mut latencies: Vec<Duration> = Vec::new();
    let mut gave_up = 0u64;

    loop {
        // Fill free credits with the next batches not already done.
        while !exhausted && pipeline.has_credit() {
            while pending.ids.len() < batch_size {
                match source.next() {
                    None => {
                        exhausted = true;
                        break;
                    }
                    Some(Err(e)) => {
                        return Err(JobError::Input {
                            path: config.input.clone(),
                            source: e,
                        });
                    }
                    Some(Ok(Item::Invalid { line, id, reason })) => {
                        errors.push(RowError { line, id, reason })
                    }
                    Some(Ok(Item::Row { line, id, text })) => {
                        pending.ids.push(id);
                        pending.lines.push(line);
                        pending.texts.push(text);
                    }
                }
            }
            if pending.ids.is_empty() {
                break;
            }
            let batch = std::mem::take(&mut pending);
            let id = next_batch;
            next_batch += 1;
            if done.contains(&id) {
                summary.skipped_batches += 1;
                progress.skipped(batch.ids.len());
                continue;
            }
            pipeline.submit(BatchId(id), batch);
        }
        if exhausted && pipeline.is_idle() {
            break;
        }
        let event = match members.as_mut() {
            None => pipeline.next().await,
            Some(rx) => {
                tokio::select! {
                    e = pipeline.next() => e,
                    changed = rx.changed() => {
                        if changed.is_err() {
                            members = None;
                            continue;
                        }
                        drop_lost_workers(&mut pipeline, &rx.borrow_and_update());
                        continue;
                    }
                }
            }
        };
        match event.map_err(JobError::NoWorkers)? {
            None => {}
            Some(Event::Done {
                id,
                batch,
                output,
                latency,
            }) => {
                sink.write_batch(id.0, &batch.ids, info.dim as usize, &output)
                    .await?;
                summary
                    .first_batch_after
                    .get_or_insert_with(|| started.elapsed());
                summary.texts += batch.ids.len() as u64;
                summary.batches += 1;
                latencies.push(latency);
                progress.done(batch.ids.len());
            }
            Some(Event::Rejected { batch, reason, .. }) => {
                for (id, line) in batch.ids.iter().zip(&batch.lines) {
                    errors.push(RowError {
                        line: *line,
                        id: Some(id.clone()),
                        reason: reason.clone(),
                    });
                }
                progress.done(batch.ids.len());
            }
            Some(Event::GaveUp { id, .. }) => {
                tracing::error!(batch = id.0, "batch failed on every attempt");
                gave_up += 1;
            }
        }
    }
    progress.finish();
    errors.sort_by_key(|e| e.line);
    summary.rejected_rows = errors.len() as u64;
    sink.write_errors(&errors).await?;
    latencies.sort();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let stats = pipeline.stats();
    summary.retries = stats.retries;
    summary.redispatches = stats.redispatches;
    summary.batch_p50 = pick(0.5);
    summary.batch_p95 = pick(0.95);
    summary.elapsed = started.elapsed();
    summary.peak_rss = flotilla::process::peak_rss_bytes();
    if gave_up > 0 {
        return Err(JobError::Incomplete(gave_up));
    }
    Ok(summary)
}

fn describe(reply: &EmbedReply) -> String {
    match &reply.outcome {
        EmbedOutcome::Embedded(v) => format!(
            "batch {} from model {} with dim {} and {} values",
            reply.batch_id,
            v.revision,
            v.dim,
            v.values.len()
        ),
        EmbedOutcome::BadInput(r) | EmbedOutcome::Failed(r) => r.clone(),
    }
}
