//! A batch job over any actor kind: the rows of an [`Input`] cut into
//! batches with stable ids, run through actors with the framework's
//! bounded [`Pipeline`], each completed batch written as one part of an
//! [`Output`], exactly once, resumable.
//!
//! ```text
//! Source ─► batches of N valid rows (id k: rows kN … kN+N-1; done ones skipped)
//!        ─► Pipeline (≤ M in flight, least loaded, deadlines, retries) ─► the actors
//!        ─► encode(batch, result) ─► Output part k
//!   invalid rows, rejected batches ─► errors file
//! ```
//!
//! Backpressure runs end to end: a batch is read only while the pipeline
//! has credit, so reading stops when the window is full and the output is
//! the consumer. A member that goes down, or an actor that stops, leaves
//! the pool, and its batches go to the others at once; with no actor left
//! the job fails ([`PipelineError::NoWorkers`]) rather than wait. Batch ids depend only on the
//! input and the batch size, so a run started again on the same output
//! skips the parts already there and writes the others: every row is in
//! exactly one part.

use std::collections::HashSet;
use std::sync::Arc;

use flotilla::Node;
use flotilla::pipeline::{
    BatchId, Event, Pipeline, PipelineConfig, PipelineError, Stage, WorkerKey,
};
use flotilla::ractor::{ActorRef, ActorStatus};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::input::{Input, InputError};
use crate::output::{Output, OutputError, RowError};
use crate::source::{Cell, Fields, Item, RowAt, Source, SourceError};

/// How often the actors are looked over for one that stopped.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// One row of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Where it is in the input.
    pub at: RowAt,
    /// Its id.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Its extra columns, in [`Fields::extra`]'s order.
    pub extra: Vec<Cell>,
}

/// What a batch job reads, where it writes and how it cuts batches.
#[derive(Debug, Clone)]
pub struct BatchJob<M> {
    /// The input: a file, folder or glob, local or an object-store URL.
    pub input: String,
    /// The fields (columns) read from it.
    pub fields: Fields,
    /// The output: a folder or an object-store URL.
    pub output: String,
    /// The output's manifest: what makes two runs the same job.
    pub manifest: M,
    /// The parts' file extension (`parquet`, `jsonl`, …).
    pub extension: &'static str,
    /// Valid rows per batch (batch ids depend on it).
    pub batch_size: usize,
    /// The pipeline's limits (batches in flight, deadline, attempts).
    pub pipeline: PipelineConfig,
}

/// Why a batch job failed. Rows refused one by one are not failures: they
/// go to the errors file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchJobError {
    /// A setting cannot hold.
    #[error("batch job: {0}")]
    Setting(String),
    /// The input names nothing usable.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The input could not be read on.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The output cannot be used or written.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// No actor is left to run the batches.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A batch failed on every attempt.
    #[error("batch {0} failed on every attempt")]
    GaveUp(u64),
}

/// What a finished batch job did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchSummary {
    /// Batches written by this run.
    pub written: u64,
    /// Batches found done by an earlier run, skipped.
    pub skipped: u64,
    /// Rows written by this run.
    pub rows: u64,
    /// Rows refused (in the errors file).
    pub refused: u64,
    /// Sends after the first of a batch (failures, deadlines, lost actors).
    pub retries: u64,
}

/// Runs `job` on `node` through `actors` (each with the member it runs
/// on): `stage` makes each actor's request of a batch and judges its
/// answer; `encode` makes the part of a completed batch. Returns when every
/// batch is written.
pub async fn run<S, M, E>(
    node: &Node,
    job: BatchJob<M>,
    stage: S,
    actors: Vec<(String, ActorRef<S::Msg>)>,
    encode: E,
) -> Result<BatchSummary, BatchJobError>
where
    S: Stage<Batch = Vec<Row>>,
    M: Serialize + DeserializeOwned + PartialEq + std::fmt::Display,
    E: Fn(&[Row], S::Output) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>>,
{
    if job.batch_size == 0 {
        return Err(BatchJobError::Setting(
            "batch_size must be at least 1".into(),
        ));
    }
    if actors.is_empty() {
        return Err(BatchJobError::Setting("no actor to run the batches".into()));
    }
    let input = Arc::new(Input::resolve(&job.input).await?);
    let shard_of = |at: RowAt| {
        input
            .shards
            .get(at.shard as usize)
            .map(|s| s.name.clone())
            .unwrap_or_default()
    };
    let (output, done) = Output::open(&job.output, &job.manifest, job.extension).await?;
    let mut source = Source::open(Arc::clone(&input), job.fields.clone()).await?;
    let mut errors = output.errors();
    let mut pipeline = Pipeline::new(stage, job.pipeline, node.outbound());
    let mut pool: Vec<(WorkerKey, ActorRef<S::Msg>)> = actors
        .into_iter()
        .map(|(member, actor)| (pipeline.add_worker(&member, actor.clone()), actor))
        .collect();
    // How often the pool is looked over for actors that stopped.
    let mut look = tokio::time::interval(LOOK_EVERY);
    let mut members = node.watch_members();
    let mut summary = BatchSummary::default();
    let mut next_id = 0u64;
    let mut batch = Vec::with_capacity(job.batch_size);
    let mut exhausted = false;
    let mut watching = true;
    loop {
        // Read while the window has room.
        while !exhausted && pipeline.has_credit() {
            match source.next().await.transpose()? {
                Some(Item::Row {
                    at,
                    id,
                    text,
                    extra,
                }) => batch.push(Row {
                    at,
                    id,
                    text,
                    extra,
                }),
                Some(Item::Invalid { at, id, reason }) => {
                    errors
                        .record(&RowError {
                            shard: shard_of(at),
                            line: at.line,
                            id,
                            reason,
                        })
                        .await?;
                }
                None => exhausted = true,
            }
            if batch.len() == job.batch_size || (exhausted && !batch.is_empty()) {
                let rows = std::mem::replace(&mut batch, Vec::with_capacity(job.batch_size));
                if done.contains(&next_id) {
                    summary.skipped += 1;
                } else {
                    pipeline.submit(BatchId(next_id), rows);
                }
                next_id += 1;
            }
        }
        if exhausted && pipeline.is_idle() {
            break;
        }
        pool.retain(|(key, actor)| {
            let stopped = matches!(
                actor.get_status(),
                ActorStatus::Stopped | ActorStatus::Stopping
            );
            if stopped {
                pipeline.remove_worker(*key);
            }
            !stopped
        });
        tokio::select! {
            event = pipeline.next() => match event? {
                Some(Event::Done { id: BatchId(id), batch, output: result, .. }) => {
                    let bytes = encode(&batch, result).map_err(|source| OutputError::Encode {
                        location: output.part_location(id),
                        source,
                    })?;
                    output.write_part(id, bytes).await?;
                    summary.written += 1;
                    summary.rows += batch.len() as u64;
                }
                Some(Event::Rejected { batch, reason, .. }) => {
                    for row in batch {
                        errors
                            .record(&RowError {
                                shard: shard_of(row.at),
                                line: row.at.line,
                                id: Some(row.id),
                                reason: reason.clone(),
                            })
                            .await?;
                    }
                }
                Some(Event::GaveUp { id: BatchId(id), .. }) => return Err(BatchJobError::GaveUp(id)),
                None => {}
            },
            _ = look.tick() => {}
            changed = members.changed(), if watching => {
                if changed.is_err() {
                    // The node is stopping; the pipeline's deadlines still
                    // move the batches of actors that do not answer.
                    watching = false;
                    continue;
                }
                let table = members.borrow_and_update().clone();
                let up: HashSet<&str> = table.up().map(|m| m.name.as_str()).collect();
                // A node's workers leave the pipeline with it, so it is
                // removed once.
                let gone: Vec<String> = pipeline
                    .nodes()
                    .filter(|n| !up.contains(n))
                    .map(str::to_owned)
                    .collect();
                for n in gone {
                    pipeline.remove_node(&n);
                }
            }
        }
    }
    summary.refused = errors.rows();
    summary.retries = pipeline.stats().retries;
    errors.finish().await?;
    Ok(summary)
}
