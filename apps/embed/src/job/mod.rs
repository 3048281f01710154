//! The embed job on the embedded default: one process, resident embedding
//! actors, a JSONL or Parquet input streamed in batches with stable ids, a credit
//! window of at most `max_in_flight` batches, idempotent output and resume.
//!
//! ```text
//! JsonlSource ─► batches (id = ordinal) ─► Window (≤ M in flight, least loaded)
//!     ─► Embedder actors ─► checks (batch id, revision, dim) ─► LocalSink part
//! ```
//!
//! Memory stays flat as the input grows: only the batches in flight are
//! held, plus a 16-byte digest per id to refuse duplicates.

pub mod sink;
pub mod source;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use flotilla::ractor::{Actor, ActorRef, call_t};
use flotilla_proto::window::{Abandoned, BatchId, Window, WindowConfig};
use tokio::sync::mpsc;

use crate::actor::{EmbedMsg, EmbedOutcome, EmbedReply, EmbedRequest, Embedder, EmbedderArgs};
use crate::model_folder::ModelFolder;
pub use sink::Format;
use sink::{LocalSink, Manifest, RowError, SinkError};
use source::{Item, SourceError};

/// Settings of a local embed job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Input: Parquet when it ends in `.parquet`, JSONL otherwise.
    pub input: PathBuf,
    /// Output folder.
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
    /// Embedding actors (each one model, one thread).
    pub actors: usize,
    /// Batches in flight at most (default: 2 per actor).
    pub max_in_flight: Option<usize>,
    /// Job id; default derived from the input's content, the batch size and
    /// the model revision.
    pub job_id: Option<String>,
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
    /// Re-dispatches after a failure or deadline.
    pub retries: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
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
        write!(
            f,
            "job {}: {} texts in {} batches ({} skipped as done), {} rows rejected, {} retries, {:.1} s, {:.1} texts/s, batch p50 {:.0} ms p95 {:.0} ms, model load {:.2} s, peak RSS {} MiB",
            self.job_id,
            self.texts,
            self.batches,
            self.skipped_batches,
            self.rejected_rows,
            self.retries,
            self.elapsed.as_secs_f64(),
            rate,
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
    /// Batches failed on every attempt.
    #[error("{0} batches failed on every attempt; rerun to retry them")]
    Incomplete(u64),
}

/// A batch held while in flight.
struct Batch {
    ids: Vec<String>,
    lines: Vec<u64>,
    texts: Vec<String>,
}

fn input_digest(path: &std::path::Path) -> Result<String, JobError> {
    let digest = crate::model_folder::sha256_file(path).map_err(|e| JobError::Input {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// Runs the job in this process. Safe to run again on the same output:
/// completed batches are skipped, the rest are computed.
pub async fn run_local(config: JobConfig) -> Result<Summary, JobError> {
    let started = Instant::now();
    // Configuration errors name the file at fault before any model loads.
    ModelFolder::open(&config.model)?;

    // The actors load the model; the revision and width of the job are what
    // they report, so the weights are read and hashed once per actor only.
    let actors = config.actors.max(1);
    let mut workers: Vec<ActorRef<EmbedMsg>> = Vec::with_capacity(actors);
    let mut infos = Vec::with_capacity(actors);
    for _ in 0..actors {
        let args = EmbedderArgs {
            model_dir: config.model.to_string_lossy().into_owned(),
            threads: 1,
            micro_batch: 16,
        };
        let spawned = match Actor::spawn(None, Embedder, args).await {
            Ok((actor, _)) => call_t!(actor, EmbedMsg::Info, 10_000)
                .map(|info| (actor, info))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match spawned {
            Ok((actor, info)) => {
                workers.push(actor);
                infos.push(info);
            }
            Err(e) => {
                stop(&workers);
                return Err(JobError::Actor(e));
            }
        }
    }
    let result = drive(&config, started, &workers, &infos).await;
    stop(&workers);
    result
}

fn stop(workers: &[ActorRef<EmbedMsg>]) {
    for w in workers {
        w.stop(None);
    }
}

/// The job proper, once the actors run.
async fn drive(
    config: &JobConfig,
    started: Instant,
    workers: &[ActorRef<EmbedMsg>],
    infos: &[crate::actor::ModelInfo],
) -> Result<Summary, JobError> {
    let first = &infos[0];
    if let Some(other) = infos.iter().find(|i| i.revision != first.revision) {
        return Err(JobError::Actor(format!(
            "actors loaded different weights: {} and {}",
            first.revision, other.revision
        )));
    }
    let model_load = infos
        .iter()
        .map(|i| Duration::from_millis(i.load_ms))
        .max()
        .unwrap_or_default();
    let revision = crate::ModelRevision::new(first.revision.clone());
    let batch_size = config.batch_size.max(1);
    let job_id = match &config.job_id {
        Some(id) => id.clone(),
        None => format!(
            "{}-b{batch_size}-{}",
            input_digest(&config.input)?,
            revision.short()
        ),
    };
    let manifest = Manifest {
        job_id: job_id.clone(),
        model_revision: revision.to_string(),
        dim: first.dim,
        batch_size: batch_size as u32,
        format: config.format,
    };
    let (sink, done) = LocalSink::open(&config.output, &manifest)?;
    let mut source =
        source::open(&config.input, &config.id_field, &config.text_field).map_err(|source| {
            JobError::Input {
                path: config.input.clone(),
                source,
            }
        })?;
    let actors = workers.len();

    let mut window: Window<usize> = Window::new(WindowConfig {
        max_in_flight: config.max_in_flight.unwrap_or(2 * actors).max(1),
        deadline: crate::actor::BATCH_DEADLINE,
        max_attempts: 3,
    });
    for w in 0..actors {
        window.add_worker(w);
    }

    type Answer = (usize, BatchId, Result<EmbedReply, String>, Duration);
    let (tx, mut rx) = mpsc::unbounded_channel::<Answer>();
    let send = |d: flotilla_proto::window::Dispatch<usize>, batch: &Batch| {
        let actor = workers[d.worker].clone();
        let tx = tx.clone();
        let req = EmbedRequest {
            batch_id: d.batch.0,
            texts: batch.texts.clone(),
        };
        tokio::spawn(async move {
            let t = Instant::now();
            let ms = crate::actor::BATCH_DEADLINE.as_millis() as u64;
            let result = call_t!(actor, EmbedMsg::Embed, ms, req).map_err(|e| e.to_string());
            let _ = tx.send((d.worker, d.batch, result, t.elapsed()));
        });
    };

    let mut summary = Summary {
        job_id,
        model_load,
        ..Summary::default()
    };
    let mut errors: Vec<RowError> = Vec::new();
    let mut flights: HashMap<u64, Batch> = HashMap::new();
    let mut next_batch = 0u64;
    let mut pending: Batch = Batch {
        ids: vec![],
        lines: vec![],
        texts: vec![],
    };
    let mut exhausted = false;
    let mut latencies: Vec<Duration> = Vec::new();
    let mut gave_up = 0u64;
    let mut last_report = Instant::now();
    let dim = manifest.dim as usize;

    loop {
        let now = Instant::now();
        while let Some(d) = window.poll_retry(now) {
            summary.retries += 1;
            send(d.clone(), &flights[&d.batch.0]);
        }
        // Fill free credits with the next batches not already done.
        while !exhausted && window.has_credit() {
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
            let batch = std::mem::replace(
                &mut pending,
                Batch {
                    ids: vec![],
                    lines: vec![],
                    texts: vec![],
                },
            );
            let id = next_batch;
            next_batch += 1;
            if done.contains(&id) {
                summary.skipped_batches += 1;
                continue;
            }
            let d = window
                .dispatch_new(now, BatchId(id))
                .expect("credit checked");
            send(d, &batch);
            flights.insert(id, batch);
        }
        if exhausted && window.is_idle() {
            break;
        }
        let deadline = window
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1));
        tokio::select! {
            answer = rx.recv() => {
                let Some((worker, batch_id, result, took)) = answer else { break };
                let Some(batch) = flights.get(&batch_id.0) else { continue };
                match result {
                    Ok(EmbedReply { batch_id: got, outcome: EmbedOutcome::Embedded(v) })
                        if got == batch_id.0
                            && v.revision == manifest.model_revision
                            && v.dim as usize == dim
                            && v.values.len() == batch.ids.len() * dim =>
                    {
                        if window.complete(batch_id, &worker) == flotilla_proto::window::Outcome::Accepted {
                            sink.write_batch(batch_id.0, &batch.ids, dim, &v.values)?;
                            summary.texts += batch.ids.len() as u64;
                            summary.batches += 1;
                            latencies.push(took);
                            flights.remove(&batch_id.0);
                        }
                    }
                    Ok(EmbedReply { outcome: EmbedOutcome::BadInput(reason), .. }) => {
                        if window.reject(batch_id, &worker) == flotilla_proto::window::Outcome::Accepted {
                            for (id, line) in batch.ids.iter().zip(&batch.lines) {
                                errors.push(RowError { line: *line, id: Some(id.clone()), reason: reason.clone() });
                            }
                        }
                    }
                    Ok(other) => {
                        tracing::warn!(batch = batch_id.0, ?worker, "refused a result: {}", describe(&other));
                        window.fail(batch_id, &worker);
                    }
                    Err(e) => {
                        tracing::warn!(batch = batch_id.0, ?worker, error = %e, "batch failed; re-dispatching");
                        window.fail(batch_id, &worker);
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                window.poll_deadlines(Instant::now());
            }
        }
        for a in window.take_abandoned() {
            match a {
                Abandoned::Rejected(b) => {
                    flights.remove(&b.0);
                }
                Abandoned::GaveUp(b) => {
                    gave_up += 1;
                    flights.remove(&b.0);
                }
            }
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            let rate = summary.texts as f64 / started.elapsed().as_secs_f64();
            tracing::info!(
                texts = summary.texts,
                batches = summary.batches,
                "progress: {rate:.1} texts/s"
            );
        }
    }
    errors.sort_by_key(|e| e.line);
    summary.rejected_rows = errors.len() as u64;
    sink.write_errors(&errors)?;
    latencies.sort();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
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
