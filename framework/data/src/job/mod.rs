//! A batch job over any actor kind: the rows of an [`Input`] cut into
//! batches with stable ids, run through actors with the framework's
//! bounded [`Pipeline`], each completed batch written as one part of an
//! [`Output`], exactly once, resumable.
//!
//! ```text
//! Source ─► Batching (windows sorted by length, cut by rows and tokens; ids 0, 1, …; done ones skipped)
//!        ─► Parts::batch (the stage's batch) ─► Pipeline (≤ M in flight, least loaded,
//!           deadlines, retries) ─► the actors ─► Parts::part (bytes, or an unusable answer
//!           sent again) ─► Output part k
//!   invalid rows, rejected batches ─► errors file
//!   a batch failed on every attempt ─► split in halves until the failing rows are isolated
//!        (split): the others written as pieces of it, the failing rows to the errors file
//! ```
//!
//! Backpressure runs end to end: a batch is read only while the pipeline
//! has credit, so reading stops when the window is full and the output is
//! the consumer. A member that goes down or leaves (or stays absent from
//! the member table past a grace, as while a restarted head fills its
//! table), or an actor that stops, leaves the pool, and its batches go to
//! the others at once. Under a supervisor, a restarted actor joins the
//! pool again, the job waits while every actor is restarting, and an
//! escalation ends the job. With no actor left the job fails
//! ([`BatchJobError::NoWorkers`]) rather than wait. Batch ids depend only
//! on the input and the [`Batching`], so a run started again on the same
//! output skips the parts already there and writes the others: every row
//! is in exactly one part. A batch split to isolate the rows that fail
//! it is written as pieces named by their rows, which a rerun finds and
//! skips in turn.

mod actor_count;
mod actors;
mod batching;
pub mod detached;
mod join;
mod logs;
mod lost;
mod meter;
mod progress;
mod settings;
mod split;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::MemberName;
use flotilla::pipeline::{
    BatchId, Event, Pipeline, PipelineConfig, PipelineError, Stage, WorkerKey,
};
use flotilla::ractor::{ActorRef, ActorStatus};
use flotilla::supervisor::{Escalation, Exit, SupervisorEvent, SupervisorMsg};
use flotilla::{Node, Outbound, Table};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

pub use actor_count::{ActorCount, BadActorCount};
pub use actors::{ActorStartError, Grown, Placed, PlacedActor, Placement, Stopper};
pub use batching::Batching;
pub use join::Join;
pub use logs::JobLogs;
pub use meter::{BatchWork, JobMeter};
pub use progress::ProgressConfig;
pub use settings::{
    DEFAULT_BATCH_SIZE, DEFAULT_MEMORY_BUDGET, DEFAULT_SORT_WINDOW, SettingError, Settings,
    as_text, positive_count, workers_of,
};

use crate::input::{Input, InputError};
use crate::output::{Output, OutputError};
pub use crate::source::Row;
use crate::source::{CellType, Fields, Source, SourceError};
use batching::Batcher;
use lost::{LostWorkers, drop_lost_workers};
use progress::Progress;
use split::{Splits, uncovered};

/// Why a row isolated by splitting its batch is refused.
const ISOLATED: &str = "failed on every attempt: the actors it was sent to failed or crashed on it (isolated by splitting its batch)";

/// How often the actors are looked over for one that stopped.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// What a batch job reads, where it writes and how it cuts batches.
#[derive(Debug, Clone)]
pub struct BatchJob<M> {
    /// The input: a file, folder or glob, local or an object-store URL.
    pub input: String,
    /// The input already resolved from `input` (as
    /// [`Input::resolve_and_scan`] gives it, with the scan a job id is
    /// made from): the job reads those shards. `None`: `input` is
    /// resolved when the job starts.
    pub resolved: Option<Arc<Input>>,
    /// The fields (columns) read from it.
    pub fields: Fields,
    /// The output: a folder or an object-store URL.
    pub output: String,
    /// The output's manifest: what makes two runs the same job.
    pub manifest: M,
    /// The parts' file extension (`parquet`, `jsonl`, …).
    pub extension: &'static str,
    /// How rows are cut into batches (batch ids depend on it).
    pub batching: Batching,
    /// The pipeline's limits (batches in flight, deadline, attempts).
    pub pipeline: PipelineConfig,
    /// How progress is shown and published.
    pub progress: ProgressConfig,
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
    #[error("input {input}: {source}")]
    Read {
        /// The input as given.
        input: String,
        /// What failed.
        source: SourceError,
    },
    /// The output cannot be used or written.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Every actor was lost with batches still to do.
    #[error("{0}; rerun to finish the job (completed batches are kept)")]
    NoWorkers(PipelineError),
    /// Batches failed on every attempt (the others are written).
    #[error("{0} batches failed on every attempt; rerun to retry them")]
    Incomplete(u64),
    /// An actor failed more often than its supervisor's restart limit
    /// allows.
    #[error(
        "actor {}: more than {} restarts within {:?}; the job stopped: rerun to resume (completed batches are kept)",
        .0.child, .0.max_restarts, .0.within
    )]
    RestartLimit(Escalation),
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
    /// Batches moved off an actor that was lost.
    pub redispatches: u64,
    /// Straggling batches sent a second time to an idle actor.
    pub hedged: u64,
    /// Actors restarted by their supervisor during the job.
    pub restarts: u64,
    /// Actors the job grew onto while it ran (workers that joined).
    pub grown: u64,
    /// Actors let go at the job's tail, their work no longer needed.
    pub let_go: u64,
    /// Batches (and pieces of them) split to isolate rows that failed
    /// them.
    pub split: u64,
    /// Rows isolated that way: refused (in the errors file) after every
    /// attempt failed on them alone.
    pub isolated: u64,
    /// When the first part was written, from the start of the run.
    pub first_part_after: Option<Duration>,
    /// Median batch latency.
    pub batch_p50: Duration,
    /// 95th percentile batch latency.
    pub batch_p95: Duration,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl BatchSummary {
    /// A part (or piece) of `rows` rows was written, `after` the start.
    fn part_written(&mut self, rows: usize, after: Duration) {
        self.first_part_after.get_or_insert(after);
        self.written += 1;
        self.rows += rows as u64;
    }

    /// Takes the pipeline's retries, the batches' latencies and the time
    /// the job took.
    fn measured(
        &mut self,
        stats: flotilla::pipeline::PipelineStats,
        latencies: &Latencies,
        elapsed: Duration,
    ) {
        self.retries = stats.retries;
        self.redispatches = stats.redispatches;
        self.hedged = stats.hedged;
        self.batch_p50 = latencies.quantile(0.5);
        self.batch_p95 = latencies.quantile(0.95);
        self.elapsed = elapsed;
    }

    /// The summary in one clause, `rows` naming what a row is and `actors`
    /// the actors it ran on: `200 texts in 4 batches (0 skipped as done)
    /// on 2 actors, 0 rows rejected, 1 retries (1 re-dispatched from lost
    /// workers), 0 actor restarts, 1.2 s, 166.7 texts/s, first batch after
    /// 0.50 s, batch p50 12 ms p95 30 ms`, then, where rows were isolated
    /// by splitting batches, `, 1 failing rows isolated (5 batches split)`,
    /// where stragglers were sent again, `, 2 straggling batches sent
    /// again`, where the job grew, `, 2 actors added as workers joined`,
    /// and where actors were let go at its tail, `, 3 actors let go as
    /// the work ran out` (`actors`: those it started with).
    pub fn line(&self, rows: &str, actors: usize) -> String {
        let rate = self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let first = self
            .first_part_after
            .map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        let mut split = if self.split > 0 || self.isolated > 0 {
            format!(
                ", {} failing rows isolated ({} batches split)",
                self.isolated, self.split
            )
        } else {
            String::new()
        };
        if self.hedged > 0 {
            split.push_str(&format!(", {} straggling batches sent again", self.hedged));
        }
        if self.grown > 0 {
            split.push_str(&format!(", {} actors added as workers joined", self.grown));
        }
        if self.let_go > 0 {
            split.push_str(&format!(
                ", {} actors let go as the work ran out",
                self.let_go
            ));
        }
        format!(
            "{} {rows} in {} batches ({} skipped as done) on {actors} actors, {} rows rejected, {} retries ({} re-dispatched from lost workers), {} actor restarts, {:.1} s, {rate:.1} {rows}/s, first batch after {first}, batch p50 {:.0} ms p95 {:.0} ms{split}",
            self.rows,
            self.written,
            self.skipped,
            self.refused,
            self.retries,
            self.redispatches,
            self.restarts,
            self.elapsed.as_secs_f64(),
            self.batch_p50.as_secs_f64() * 1e3,
            self.batch_p95.as_secs_f64() * 1e3,
        )
    }
}

/// Where a job's actors are reached and how it learns of lost members.
pub struct Links {
    /// The sending side for remote actors.
    pub outbound: Outbound,
    /// The member table; without it only actors that stop leave the pool.
    pub members: Option<watch::Receiver<Table>>,
}

impl Links {
    /// Actors of this process only.
    pub fn local() -> Self {
        Self {
            outbound: Outbound::local(),
            members: None,
        }
    }

    /// Actors anywhere in `node`'s cluster.
    pub fn of(node: &Node) -> Self {
        Self {
            outbound: node.outbound(),
            members: Some(node.watch_members()),
        }
    }
}

/// The actors a job runs on, each with the member it runs on, and the
/// supervisor over them if any.
pub struct Pool<M: flotilla::ractor::Message> {
    actors: Vec<(MemberName, ActorRef<M>)>,
    /// Each actor's child id under the supervisor, in the same order.
    ids: Vec<String>,
    events: Option<mpsc::UnboundedReceiver<SupervisorEvent>>,
    /// The supervisor, told of restarts to forgive.
    supervisor: Option<ActorRef<SupervisorMsg>>,
    /// Actors the job grows onto while it runs.
    joins: Option<mpsc::UnboundedReceiver<Grown<M>>>,
    /// Where actors are let go at the job's tail.
    release: Option<Release>,
}

/// Where a job lets its idle actors go at its tail (see
/// [`Pool::letting_go`]).
struct Release {
    /// The fewest actors the job keeps.
    least: usize,
    /// Takes the child ids of the actors let go.
    to: mpsc::UnboundedSender<String>,
}

/// How many of `idle` actors a job at its tail (every batch read) lets
/// go: those beyond one spare per batch `in_flight` (each may straggle
/// and need a second send), keeping at least `least` of its `actors`.
///
/// ```
/// use flotilla_data::job::tail_surplus;
/// // 8 actors, 5 idle, 3 batches left in flight: 2 go.
/// assert_eq!(tail_surplus(5, 3, 8, 1), 2);
/// // Never below the least the job asked for.
/// assert_eq!(tail_surplus(5, 0, 8, 6), 2);
/// assert_eq!(tail_surplus(2, 4, 8, 1), 0);
/// ```
pub fn tail_surplus(idle: usize, in_flight: usize, actors: usize, least: usize) -> usize {
    idle.saturating_sub(in_flight)
        .min(actors.saturating_sub(least))
}

impl<M: flotilla::ractor::Message> Pool<M> {
    /// `actors`, unsupervised: one that stops leaves the pool.
    pub fn new(actors: Vec<(MemberName, ActorRef<M>)>) -> Self {
        Self {
            actors,
            ids: Vec::new(),
            events: None,
            supervisor: None,
            joins: None,
            release: None,
        }
    }

    /// `actors` as the children `ids` of a supervisor reporting `events`:
    /// one that exits leaves the pool, comes back when restarted, and an
    /// escalation ends the job.
    pub fn supervised(
        actors: Vec<(MemberName, ActorRef<M>)>,
        ids: Vec<String>,
        events: mpsc::UnboundedReceiver<SupervisorEvent>,
    ) -> Self {
        Self {
            actors,
            ids,
            events: Some(events),
            supervisor: None,
            joins: None,
            release: None,
        }
    }

    /// Tells `supervisor` of restarts to forgive: a crash caused by a bad
    /// batch costs its actor's restart intensity once, however often the
    /// batch (or the pieces it is split into to find the bad rows) crashes
    /// an actor again.
    pub fn forgiving(mut self, supervisor: ActorRef<SupervisorMsg>) -> Self {
        self.supervisor = Some(supervisor);
        self
    }

    /// Actors that join the pool while the job runs, already under its
    /// supervisor (see [`Placed::supervise_growing`]): each becomes a
    /// worker at once, and the batches in flight may grow by a worker's
    /// share.
    pub fn growing(mut self, joins: mpsc::UnboundedReceiver<Grown<M>>) -> Self {
        self.joins = Some(joins);
        self
    }

    /// Lets idle actors go at the job's tail, keeping at least `least`:
    /// once every batch is read, an idle actor beyond one spare per batch
    /// in flight ([`tail_surplus`]) leaves the pipeline and its child id
    /// goes to `to`, whose reader takes it from the supervisor and gives
    /// its bundle back (see [`Placed::supervise_growing`]).
    pub fn letting_go(mut self, least: usize, to: mpsc::UnboundedSender<String>) -> Self {
        self.release = Some(Release { least, to });
        self
    }
}

/// What a part is written for: its batch id and the types of the input's
/// extra columns (in [`Fields::extra`]'s order).
#[derive(Debug, Clone, Copy)]
pub struct PartOf<'a> {
    /// The batch id.
    pub id: u64,
    /// The extra columns' types.
    pub types: &'a [CellType],
}

/// Why a completed batch gives no part.
#[derive(Debug)]
pub enum PartError {
    /// The answer cannot be used (a result that cannot be read, say): a
    /// failed attempt of the batch, sent again within its attempts.
    Unusable(String),
    /// The part cannot be encoded: the job fails.
    Encode(Box<dyn std::error::Error + Send + Sync>),
}

/// What an application adds around its stage: the batch the stage holds,
/// made of rows, and the part a completed batch becomes.
pub trait Parts<S: Stage>: Send {
    /// The stage's batch of `rows` (the application may move its texts
    /// into the object store, say).
    fn batch(&mut self, rows: Vec<Row>) -> impl Future<Output = S::Batch> + Send;

    /// The part of a completed batch.
    fn part(
        &mut self,
        batch: &S::Batch,
        output: S::Output,
        of: PartOf<'_>,
    ) -> impl Future<Output = Result<Vec<u8>, PartError>> + Send;

    /// Called once every part is written, before the job returns.
    fn finish(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

impl<S: Stage, P: Parts<S>> Parts<S> for &mut P {
    fn batch(&mut self, rows: Vec<Row>) -> impl Future<Output = S::Batch> + Send {
        (**self).batch(rows)
    }

    fn part(
        &mut self,
        batch: &S::Batch,
        output: S::Output,
        of: PartOf<'_>,
    ) -> impl Future<Output = Result<Vec<u8>, PartError>> + Send {
        (**self).part(batch, output, of)
    }

    fn finish(&mut self) -> impl Future<Output = ()> + Send {
        (**self).finish()
    }
}

/// [`Parts`] of a stage whose batch is its rows: a function encodes each
/// completed batch's part.
pub struct Encode<F>(pub F);

impl<S, F> Parts<S> for Encode<F>
where
    S: Stage<Batch = Vec<Row>>,
    F: Fn(&[Row], S::Output) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> + Send,
    S::Output: Send,
{
    fn batch(&mut self, rows: Vec<Row>) -> impl Future<Output = Vec<Row>> + Send {
        std::future::ready(rows)
    }

    fn part(
        &mut self,
        batch: &Vec<Row>,
        output: S::Output,
        _: PartOf<'_>,
    ) -> impl Future<Output = Result<Vec<u8>, PartError>> + Send {
        std::future::ready((self.0)(batch, output).map_err(PartError::Encode))
    }
}

/// Batch latencies in a histogram of fixed size, whatever the number of
/// batches: microseconds from 1 µs to an hour, three significant digits.
pub(crate) struct Latencies(hdrhistogram::Histogram<u64>);

impl Latencies {
    pub(crate) fn new() -> Self {
        Self(
            hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("bounds and precision are valid"),
        )
    }

    /// Records one batch's latency (clamped to the range).
    pub(crate) fn record(&mut self, latency: Duration) {
        self.0.saturating_record(latency.as_micros().max(1) as u64);
    }

    /// The `q`-quantile (0..=1), zero when nothing was recorded.
    fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.0.value_at_quantile(q))
    }
}

/// What a running job hears of its pool: its supervisor's events, and the
/// actors it grows onto.
struct Feeds<M: flotilla::ractor::Message> {
    events: Option<mpsc::UnboundedReceiver<SupervisorEvent>>,
    joins: Option<mpsc::UnboundedReceiver<Grown<M>>>,
}

/// The pool as the pipeline sees it: which worker each supervised actor
/// is, which are being restarted.
struct Members<M: flotilla::ractor::Message> {
    actors: Vec<(WorkerKey, ActorRef<M>)>,
    /// Each actor's share of the batches in flight, given to each that
    /// joins while the job runs.
    share: usize,
    keys: HashMap<String, WorkerKey>,
    restarting: BTreeSet<String>,
    supervisor: Option<ActorRef<SupervisorMsg>>,
    release: Option<Release>,
}

impl<M: flotilla::ractor::Message> Members<M> {
    /// The `pool`'s actors (on their members), each added to `pipeline`
    /// as a worker, known by their child ids under the supervisor; with
    /// where the pool hears of its supervisor's events and of the actors
    /// it grows onto.
    fn join<S: Stage<Msg = M>>(pool: Pool<M>, pipeline: &mut Pipeline<S>) -> (Self, Feeds<M>) {
        let Pool {
            actors,
            ids,
            events,
            supervisor,
            joins,
            release,
        } = pool;
        let mut members = Self {
            share: (pipeline.max_in_flight() / actors.len().max(1)).max(1),
            actors: Vec::with_capacity(actors.len()),
            keys: HashMap::new(),
            restarting: BTreeSet::new(),
            supervisor,
            release,
        };
        for (i, (member, actor)) in actors.into_iter().enumerate() {
            let key = pipeline.add_worker(&member, actor.clone());
            if let Some(id) = ids.get(i) {
                members.keys.insert(id.clone(), key);
            }
            members.actors.push((key, actor));
        }
        (members, Feeds { events, joins })
    }

    /// An actor the job grew onto, under its supervisor already, becomes
    /// a worker, and the batches in flight grow by an actor's share;
    /// returns 1 if it did, 0 if not (a restart of its child came first
    /// and is the worker already).
    fn grown<S: Stage<Msg = M>>(&mut self, grown: Grown<M>, pipeline: &mut Pipeline<S>) -> u64 {
        if self.keys.contains_key(&grown.child) || self.restarting.contains(&grown.child) {
            return 0;
        }
        let key = pipeline.add_worker(&grown.member, grown.actor.clone());
        self.keys.insert(grown.child, key);
        self.actors.push((key, grown.actor));
        pipeline.set_max_in_flight(pipeline.max_in_flight() + self.share);
        1
    }

    /// At the job's tail (`tail`: every batch read), lets the idle actors
    /// beyond what the batches left may need go ([`tail_surplus`]), the
    /// last added first: each leaves the pipeline with its share of the
    /// batches in flight, and its child id goes to the release. Returns
    /// how many went.
    fn let_go_idle<S: Stage<Msg = M>>(&mut self, pipeline: &mut Pipeline<S>, tail: bool) -> u64 {
        let Some(release) = self.release.as_ref().filter(|_| tail) else {
            return 0;
        };
        let idle = pipeline.idle_workers();
        let surplus = tail_surplus(
            idle.len(),
            pipeline.in_flight(),
            pipeline.workers(),
            release.least,
        );
        let mut gone = 0;
        for key in idle.into_iter().rev().take(surplus) {
            let Some(child) = self
                .keys
                .iter()
                .find_map(|(child, k)| (*k == key).then(|| child.clone()))
            else {
                continue;
            };
            if release.to.send(child.clone()).is_err() {
                break;
            }
            tracing::info!(actor = %child, in_flight = pipeline.in_flight(), "the work left needs fewer actors: one is let go");
            self.keys.remove(&child);
            self.actors.retain(|(k, _)| *k != key);
            pipeline.remove_worker(key);
            let max = pipeline.max_in_flight().saturating_sub(self.share);
            pipeline.set_max_in_flight(max);
            gone += 1;
        }
        gone
    }

    /// Removes actors that stopped.
    fn prune<S: Stage<Msg = M>>(&mut self, pipeline: &mut Pipeline<S>) {
        self.actors.retain(|(key, actor)| {
            let stopped = matches!(
                actor.get_status(),
                ActorStatus::Stopped | ActorStatus::Stopping
            );
            if stopped {
                pipeline.remove_worker(*key);
            }
            !stopped
        });
    }

    /// Applies what the supervisor reports: an actor that exited leaves
    /// the pipeline (its batches go to the others at once), a restarted
    /// one joins it, an escalation ends the job. An actor that failed on a
    /// node up in `table` crashed: the batch it was working on is
    /// charged an attempt, and the crashes after the first charged to the
    /// same batch, as many as one bad row causes, are forgiven to its
    /// supervisor.
    fn on_supervision<S: Stage<Msg = M>>(
        &mut self,
        event: SupervisorEvent,
        pipeline: &mut Pipeline<S>,
        restarts: &mut u64,
        splits: &mut Splits,
        table: Option<&Table>,
    ) -> Result<(), Escalation> {
        // Without a member table, every actor is on this node.
        let up = |node: &str| {
            table.is_none_or(|t| {
                t.get(node)
                    .is_some_and(|m| m.state == flotilla::MemberState::Up)
            })
        };
        match event {
            SupervisorEvent::Exited {
                child,
                exit,
                restarting,
            } => {
                if let Some(key) = self.keys.remove(&child) {
                    // Charged before the worker leaves, while its sends
                    // still tell which it was working on.
                    let crashed = exit == Exit::Failure && pipeline.node_of(key).is_some_and(&up);
                    let charged = if crashed { pipeline.crashed(key) } else { None };
                    if pipeline.remove_worker(key) {
                        tracing::warn!(actor = %child, ?exit, restart = restarting, in_flight = pipeline.in_flight(),
                            "actor exited; its batches go to the other actors");
                    }
                    if !restarting {
                        // Let go for good: its share of the batches in
                        // flight goes with it.
                        let max = pipeline.max_in_flight().saturating_sub(self.share);
                        pipeline.set_max_in_flight(max);
                    }
                    if let Some(batch) = charged
                        && splits.forgive(batch)
                        && restarting
                        && let Some(supervisor) = &self.supervisor
                    {
                        let _ = supervisor.cast(SupervisorMsg::Pardon(child.clone()));
                    }
                }
                if restarting {
                    self.restarting.insert(child);
                } else {
                    self.restarting.remove(&child);
                }
            }
            SupervisorEvent::Started {
                child,
                running,
                restarts: n,
            } => {
                self.restarting.remove(&child);
                if n > 0 {
                    let node = running
                        .node
                        .as_ref()
                        .map_or_else(|| "local".to_owned(), |n| n.name.to_string());
                    let actor = ActorRef::<M>::from(running.cell);
                    let key = pipeline.add_worker(&node, actor.clone());
                    self.keys.insert(child, key);
                    self.actors.push((key, actor));
                    *restarts += 1;
                }
            }
            SupervisorEvent::Escalated(e) => return Err(e),
        }
        Ok(())
    }
}

/// Submits batch `id` of `rows`: whole, or, where an earlier run split it
/// and wrote the pieces `written`, the rows not written yet, as pieces.
/// Returns the rows skipped as written.
async fn submit<S, P>(
    id: u64,
    rows: Vec<Row>,
    written: &[Range<usize>],
    splits: &mut Splits,
    parts: &mut P,
    pipeline: &mut Pipeline<S>,
) -> usize
where
    S: Stage,
    P: Parts<S>,
{
    if written.is_empty() {
        let batch = parts.batch(rows).await;
        pipeline.submit(BatchId(id), batch);
        return 0;
    }
    let gaps = uncovered(rows.len(), written);
    let skipped = rows.len() - gaps.iter().map(Range::len).sum::<usize>();
    for gap in gaps {
        let piece = splits.piece(id, gap.clone());
        let batch = parts.batch(rows[gap].to_vec()).await;
        pipeline.submit(piece, batch);
    }
    skipped
}

/// A batch (or piece) `id` of `rows` failed on every attempt: split in
/// halves sent again, or, a single row, given back to be refused.
async fn split_or_refuse<S, P>(
    id: BatchId,
    rows: &[Row],
    splits: &mut Splits,
    parts: &mut P,
    pipeline: &mut Pipeline<S>,
) -> Option<Row>
where
    S: Stage,
    P: Parts<S>,
{
    let piece = splits.finish(id);
    if let [row] = rows {
        tracing::error!(id = %row.id, "row failed on every attempt; refused");
        return Some(row.clone());
    }
    let (batch, at) = piece.map_or((id.0, 0), |p| (p.batch, p.rows.start));
    tracing::warn!(
        batch,
        rows = rows.len(),
        "batch failed on every attempt; split in halves to find the rows that fail it"
    );
    for (piece, half, attempts) in splits.halves(batch, at..at + rows.len()) {
        let half = parts
            .batch(rows[half.start - at..half.end - at].to_vec())
            .await;
        pipeline.submit_limited(piece, half, attempts);
    }
    None
}

/// Writes the part of batch `id` (or of a piece of it).
async fn write(
    output: &Output,
    splits: &mut Splits,
    id: BatchId,
    bytes: Vec<u8>,
) -> Result<(), OutputError> {
    match splits.finish(id) {
        Some(piece) => output.write_piece(piece.batch, &piece.rows, bytes).await,
        None => output.write_part(id.0, bytes).await,
    }
}

/// The job's error when the part of batch `id` cannot be encoded.
fn encode_error(
    output: &Output,
    id: BatchId,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> BatchJobError {
    OutputError::Encode {
        location: output.part_location(id.0),
        source,
    }
    .into()
}

/// What `wait` comes to, or never, without one.
async fn or_pending<T>(wait: Option<impl Future<Output = T>>) -> T {
    match wait {
        Some(wait) => wait.await,
        None => std::future::pending().await,
    }
}

/// Refuses a job that cannot run: batches of no rows, or no actor.
fn check_settings(batching: &Batching, actors: usize) -> Result<(), BatchJobError> {
    if batching.size == 0 {
        return Err(BatchJobError::Setting(
            "the batch size must be at least 1".into(),
        ));
    }
    if actors == 0 {
        return Err(BatchJobError::Setting("no actor to run the batches".into()));
    }
    Ok(())
}

/// The job's input, resolved unless it was already, and its reader.
async fn open_input<M>(job: &BatchJob<M>) -> Result<(Arc<Input>, Source), BatchJobError> {
    let input = match &job.resolved {
        Some(input) => Arc::clone(input),
        None => Arc::new(Input::resolve(&job.input).await?),
    };
    let source = Source::open(Arc::clone(&input), job.fields.clone())
        .await
        .map_err(|source| BatchJobError::Read {
            input: job.input.clone(),
            source,
        })?;
    Ok((input, source))
}

/// Runs `job` through the actors of `pool`, reached through `links`:
/// `stage` makes each actor's request of a batch and judges its answer;
/// `parts` makes the stage's batches and the parts of completed ones.
/// Returns when every batch is written (or refused).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla::pipeline::{BatchId, PipelineConfig, RpcReplyPort, Stage, Verdict};
/// use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, Message};
/// use flotilla_data::{BatchJob, Batching, Cell, Encode, Fields, Links, Pool, Row, parts};
///
/// // An actor kind: the length of each text.
/// struct Lengths;
/// struct Measure(Vec<String>, RpcReplyPort<Vec<i64>>);
/// impl Message for Measure {}
/// impl Actor for Lengths {
///     type Msg = Measure;
///     type State = ();
///     type Arguments = ();
///     async fn pre_start(&self, _: ActorRef<Measure>, _: ()) -> Result<(), ActorProcessingErr> {
///         Ok(())
///     }
///     async fn handle(&self, _: ActorRef<Measure>, m: Measure, _: &mut ()) -> Result<(), ActorProcessingErr> {
///         let _ = m.1.send(m.0.iter().map(|t| t.len() as i64).collect());
///         Ok(())
///     }
/// }
/// // How a batch is asked of it and its answer checked.
/// struct Measuring;
/// impl Stage for Measuring {
///     type Msg = Measure;
///     type Batch = Vec<Row>;
///     type Reply = Vec<i64>;
///     type Output = Vec<i64>;
///     fn request(&self, _: BatchId, rows: &Vec<Row>, reply: RpcReplyPort<Vec<i64>>) -> Measure {
///         Measure(rows.iter().map(|r| r.text.clone()).collect(), reply)
///     }
///     fn judge(&self, _: BatchId, rows: &Vec<Row>, lengths: Vec<i64>) -> Verdict<Vec<i64>> {
///         if lengths.len() == rows.len() { Verdict::Done(lengths) } else { Verdict::Retry("short".into()) }
///     }
/// }
///
/// let dir = std::env::temp_dir().join(format!("flotilla-job-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let lines: Vec<String> = (0..10).map(|i| format!("{{\"id\": {i}, \"text\": \"{}\"}}", "x".repeat(i))).collect();
/// std::fs::write(dir.join("in.jsonl"), lines.join("\n"))?;
/// let (actor, _) = Actor::spawn(None, Lengths, ()).await?;
/// let job = BatchJob {
///     input: dir.join("in.jsonl").to_string_lossy().into_owned(),
///     resolved: None,
///     fields: Fields::new("id", "text"),
///     output: dir.join("out").to_string_lossy().into_owned(),
///     manifest: "lengths-v1".to_owned(),
///     extension: "parquet",
///     batching: Batching::rows(4),
///     pipeline: PipelineConfig::for_workers(1, std::time::Duration::from_secs(5)),
///     progress: Default::default(),
/// };
/// let encode = |rows: &[Row], lengths: Vec<i64>| {
///     let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
///     Ok(parts::parquet_part(&ids, &[("len", lengths.into_iter().map(Cell::Int).collect())])?)
/// };
/// let pool = Pool::new(vec![("local".into(), actor.clone())]);
/// let done = flotilla_data::job::run(Links::local(), job.clone(), Measuring, pool, Encode(encode)).await?;
/// assert_eq!((done.written, done.rows), (3, 10));
/// // Run again on the same output: every batch is found done.
/// let pool = Pool::new(vec![("local".into(), actor.clone())]);
/// let again = flotilla_data::job::run(Links::local(), job, Measuring, pool, Encode(encode)).await?;
/// assert_eq!((again.written, again.skipped), (0, 3));
/// assert_eq!(parts::parquet_ids(&dir.join("out/parts"))?.len(), 10);
/// # actor.stop(None);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
pub async fn run<S, M, P>(
    links: Links,
    job: BatchJob<M>,
    stage: S,
    pool: Pool<S::Msg>,
    mut parts: P,
) -> Result<BatchSummary, BatchJobError>
where
    S: Stage<Batch: AsRef<[Row]>>,
    M: Serialize + DeserializeOwned + PartialEq + std::fmt::Display,
    P: Parts<S>,
{
    let started = Instant::now();
    check_settings(&job.batching, pool.actors.len())?;
    let (input, source) = open_input(&job).await?;
    let types = source.types().to_vec();
    let (output, done) = Output::open(&job.output, &job.manifest, job.extension).await?;
    let mut errors = output.errors();
    let mut batcher = Batcher::new(source, input, job.batching);
    let (outbound, mut members) = (links.outbound, links.members);
    let mut pipeline = Pipeline::new(stage, job.pipeline, outbound);
    let (mut pool_state, feeds) = Members::join(pool, &mut pipeline);
    let (mut events, mut joins) = (feeds.events, feeds.joins);
    let mut look = tokio::time::interval(LOOK_EVERY);
    let mut lost = LostWorkers::default();
    let mut progress = Progress::new(job.progress);
    let mut summary = BatchSummary::default();
    let mut gave_up = 0u64;
    let mut splits = Splits::new(job.batching.size, job.pipeline.max_attempts);
    loop {
        // Fill free credits with the next batches not already done.
        while !batcher.is_done() && pipeline.has_credit() {
            let Some((id, rows)) = batcher.next(&mut errors).await? else {
                break;
            };
            if done.contains(&id) {
                summary.skipped += 1;
                progress.skipped(rows.len());
                continue;
            }
            let written = output.pieces_of(id);
            progress
                .skipped(submit(id, rows, written, &mut splits, &mut parts, &mut pipeline).await);
        }
        if batcher.is_done() && pipeline.is_idle() {
            break;
        }
        progress.observe(&pipeline, summary.restarts, batcher.is_done(), &errors);
        summary.let_go += pool_state.let_go_idle(&mut pipeline, batcher.is_done());
        // A supervised pool learns of exits from its supervisor, whose
        // escalation must end the job before the exits it causes do.
        if events.is_none() {
            pool_state.prune(&mut pipeline);
        }
        let grace = or_pending(
            lost.next_deadline()
                .map(|at| tokio::time::sleep_until(at.into())),
        );
        let table_changed = or_pending(members.as_mut().map(|rx| rx.changed()));
        let supervised = or_pending(events.as_mut().map(|rx| rx.recv()));
        let joined = or_pending(joins.as_mut().map(|rx| rx.recv()));
        // With every actor restarting, wait for them rather than give up.
        let serving = pipeline.workers() > 0 || pool_state.restarting.is_empty();
        let event = tokio::select! {
            biased;
            event = supervised => {
                match event {
                    Some(event) => {
                        let table = members.as_ref().map(|rx| rx.borrow().clone());
                        pool_state
                            .on_supervision(event, &mut pipeline, &mut summary.restarts, &mut splits, table.as_ref())
                            .map_err(BatchJobError::RestartLimit)?;
                    }
                    None => events = None,
                }
                continue;
            }
            e = pipeline.next(), if serving => e,
            grown = joined => {
                match grown {
                    Some(grown) => summary.grown += pool_state.grown(grown, &mut pipeline),
                    None => joins = None,
                }
                continue;
            }
            open = table_changed => {
                match members.as_mut() {
                    Some(rx) if open.is_ok() => {
                        drop_lost_workers(&mut pipeline, &mut lost, &rx.borrow_and_update());
                    }
                    // The node is stopping; the pipeline's deadlines still
                    // move the batches of actors that do not answer.
                    _ => members = None,
                }
                continue;
            }
            () = grace => {
                if let Some(rx) = &members {
                    drop_lost_workers(&mut pipeline, &mut lost, &rx.borrow());
                }
                continue;
            }
            _ = look.tick() => continue,
        };
        // A supervisor that gives up says so before the exits it causes, so
        // an escalation ends the job above before its last actor leaves.
        match event.map_err(BatchJobError::NoWorkers)? {
            None => {}
            Some(Event::Done {
                id,
                batch,
                output: answer,
                latency,
                receipt,
            }) => {
                let of = PartOf {
                    id: splits.batch_of(id),
                    types: &types,
                };
                let bytes = match parts.part(&batch, answer, of).await {
                    Ok(bytes) => bytes,
                    Err(PartError::Unusable(reason)) => {
                        // A failed attempt of the batch: sent again within
                        // the attempts it has left.
                        tracing::warn!(batch = id.0, attempt = receipt.attempt(), %reason, "answer unusable; the batch goes out again");
                        splits.unreadable(id);
                        pipeline.unusable(id, batch, receipt);
                        continue;
                    }
                    Err(PartError::Encode(source)) => {
                        return Err(encode_error(&output, id, source));
                    }
                };
                write(&output, &mut splits, id, bytes).await?;
                let rows = batch.as_ref().len();
                summary.part_written(rows, started.elapsed());
                progress.written(rows, &pipeline, receipt.worker(), latency);
            }
            Some(Event::Rejected { id, batch, reason }) => {
                splits.finish(id);
                batcher.refuse(&mut errors, batch.as_ref(), &reason).await?;
                progress.rejected(batch.as_ref().len());
            }
            Some(Event::GaveUp { id, batch }) => {
                if !splits.splittable(id) || batch.as_ref().is_empty() {
                    tracing::error!(batch = id.0, "batch failed on every attempt");
                    splits.finish(id);
                    gave_up += 1;
                } else if let Some(row) =
                    split_or_refuse(id, batch.as_ref(), &mut splits, &mut parts, &mut pipeline)
                        .await
                {
                    batcher.refuse(&mut errors, &[row], ISOLATED).await?;
                    summary.isolated += 1;
                    progress.rejected(1);
                }
            }
        }
    }
    progress.observe(&pipeline, summary.restarts, true, &errors);
    progress.finish();
    parts.finish().await;
    summary.refused = errors.rows();
    errors.finish().await?;
    summary.split = splits.split;
    summary.measured(pipeline.stats(), &progress.latencies, started.elapsed());
    if gave_up > 0 {
        return Err(BatchJobError::Incomplete(gave_up));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use flotilla::pipeline::{RpcReplyPort, Verdict};
    use flotilla::ractor::{Actor, ActorProcessingErr, Message};

    use super::*;

    #[test]
    fn the_summary_line_names_what_a_row_is() {
        let s = BatchSummary {
            rows: 200,
            written: 4,
            elapsed: Duration::from_secs(2),
            ..BatchSummary::default()
        };
        let line = s.line("texts", 2);
        assert!(
            line.starts_with("200 texts in 4 batches (0 skipped as done) on 2 actors"),
            "{line}"
        );
        assert!(
            line.contains(", 100.0 texts/s, first batch after -,"),
            "{line}"
        );
    }

    /// Answers each batch with its row count.
    struct Count;
    struct Rows(usize, RpcReplyPort<usize>);
    impl Message for Rows {}
    impl Actor for Count {
        type Msg = Rows;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<Rows>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ActorRef<Rows>,
            Rows(n, reply): Rows,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            let _ = reply.send(n);
            Ok(())
        }
    }
    struct Counting;
    impl Stage for Counting {
        type Msg = Rows;
        type Batch = Vec<Row>;
        type Reply = usize;
        type Output = usize;
        fn request(&self, _: BatchId, rows: &Vec<Row>, reply: RpcReplyPort<usize>) -> Rows {
            Rows(rows.len(), reply)
        }
        fn judge(&self, _: BatchId, _: &Vec<Row>, n: usize) -> Verdict<usize> {
            Verdict::Done(n)
        }
    }

    /// A job over `rows` rows of one text each, batches of 2, in `dir`.
    fn counting_job(dir: &std::path::Path, rows: usize) -> BatchJob<String> {
        std::fs::create_dir_all(dir).unwrap();
        let lines: Vec<String> = (0..rows)
            .map(|i| format!("{{\"id\": {i}, \"text\": \"t\"}}"))
            .collect();
        std::fs::write(dir.join("in.jsonl"), lines.join("\n")).unwrap();
        BatchJob {
            input: dir.join("in.jsonl").to_string_lossy().into_owned(),
            resolved: None,
            fields: Fields::new("id", "text"),
            output: dir.join("out").to_string_lossy().into_owned(),
            manifest: "count".to_owned(),
            extension: "bin",
            batching: Batching::rows(2),
            pipeline: PipelineConfig {
                max_attempts: 3,
                retry_backoff: Duration::from_millis(1),
                ..PipelineConfig::for_workers(1, Duration::from_secs(5))
            },
            progress: ProgressConfig::default(),
        }
    }

    /// Parts whose every answer is unusable, counting how often each
    /// batch's was looked at.
    #[derive(Default)]
    struct Unreadable(HashMap<u64, u32>);
    impl Parts<Counting> for Unreadable {
        async fn batch(&mut self, rows: Vec<Row>) -> Vec<Row> {
            rows
        }
        async fn part(
            &mut self,
            _: &Vec<Row>,
            _: usize,
            of: PartOf<'_>,
        ) -> Result<Vec<u8>, PartError> {
            *self.0.entry(of.id).or_default() += 1;
            Err(PartError::Unusable("cannot be read".into()))
        }
    }

    /// An answer that cannot be used is a failed attempt of its batch: the
    /// batch goes out again within its attempts, then counts as failed,
    /// rather than being sent again without limit.
    #[tokio::test]
    async fn an_unusable_answer_is_a_failed_attempt_within_the_limit() {
        let dir =
            std::env::temp_dir().join(format!("flotilla-job-unusable-{}", std::process::id()));
        let job = counting_job(&dir, 5);
        let (actor, _) = Actor::spawn(None, Count, ()).await.unwrap();
        let mut parts = Unreadable::default();
        let pool = Pool::new(vec![(MemberName::from("local"), actor.clone())]);
        let result = tokio::time::timeout(
            Duration::from_secs(20),
            run(Links::local(), job, Counting, pool, &mut parts),
        )
        .await
        .expect("the job ends");
        assert!(
            matches!(result, Err(BatchJobError::Incomplete(3))),
            "{result:?}"
        );
        assert_eq!(parts.0, HashMap::from([(0, 3), (1, 3), (2, 3)]));
        let written = std::fs::read_dir(dir.join("out/parts")).unwrap().count();
        assert_eq!(written, 0);
        actor.stop(None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Answers with its batch's row count; refuses a batch holding the
    /// text `refuse` with an error answer, panics on one holding
    /// `poison`, counting the sends that held it, and answers one holding
    /// `slow` after 400 ms.
    struct Fragile(Arc<std::sync::atomic::AtomicU32>);
    struct Texts(Vec<String>, RpcReplyPort<Result<usize, String>>);
    impl Message for Texts {}
    impl Actor for Fragile {
        type Msg = Texts;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<Texts>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ActorRef<Texts>,
            Texts(texts, reply): Texts,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            if texts.iter().any(|t| t == "poison") {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                panic!("a row this actor cannot take");
            }
            if texts.iter().any(|t| t == "slow") {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            let answer = if texts.iter().any(|t| t == "refuse") {
                Err("cannot embed this".to_owned())
            } else {
                Ok(texts.len())
            };
            let _ = reply.send(answer);
            Ok(())
        }
    }
    struct Judging;
    impl Stage for Judging {
        type Msg = Texts;
        type Batch = Vec<Row>;
        type Reply = Result<usize, String>;
        type Output = usize;
        fn request(&self, _: BatchId, rows: &Vec<Row>, reply: RpcReplyPort<Self::Reply>) -> Texts {
            Texts(rows.iter().map(|r| r.text.clone()).collect(), reply)
        }
        fn judge(&self, _: BatchId, rows: &Vec<Row>, answer: Self::Reply) -> Verdict<usize> {
            match answer {
                Ok(n) if n == rows.len() => Verdict::Done(n),
                Ok(n) => Verdict::Retry(format!("{n} answers for {} rows", rows.len())),
                Err(e) => Verdict::Retry(e),
            }
        }
    }

    /// Runs the job of 64 rows in `dir`, the rows `bad` with their texts
    /// (`poison`, `refuse`) and the others `fine`, on two supervised
    /// actors allowed three restarts a minute; returns the summary and
    /// the sends that held a poison row.
    async fn run_fragile(
        dir: &std::path::Path,
        bad: &[(usize, &str)],
    ) -> (Result<BatchSummary, BatchJobError>, u32) {
        std::fs::create_dir_all(dir).unwrap();
        let text = |i: usize| {
            bad.iter()
                .find(|(row, _)| *row == i)
                .map_or("fine", |(_, text)| text)
        };
        let lines: Vec<String> = (0..64)
            .map(|i| format!("{{\"id\": {i}, \"text\": \"{}\"}}", text(i)))
            .collect();
        std::fs::write(dir.join("in.jsonl"), lines.join("\n")).unwrap();
        let job = BatchJob {
            batching: Batching::rows(16),
            extension: "txt",
            pipeline: PipelineConfig {
                max_attempts: 3,
                retry_backoff: Duration::from_millis(1),
                ..PipelineConfig::for_workers(2, Duration::from_secs(10))
            },
            ..counting_job(dir, 0)
        };
        std::fs::write(dir.join("in.jsonl"), lines.join("\n")).unwrap();
        let sends = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let make = {
            let sends = Arc::clone(&sends);
            move || (Fragile(Arc::clone(&sends)), ())
        };
        let limit = flotilla::supervisor::Intensity {
            max_restarts: 3,
            within: Duration::from_secs(60),
        };
        let (pool, _, stopper) = Pool::local(2, make, |_| async { Ok(()) }, limit)
            .await
            .unwrap();
        let encode = Encode(id_lines);
        let result = tokio::time::timeout(
            Duration::from_secs(60),
            run(Links::local(), job, Judging, pool, encode),
        )
        .await
        .expect("the job ends");
        stopper.stop().await;
        (result, sends.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// At the job's tail, the idle actors beyond one spare per batch left
    /// are let go, the last added first and never below the least asked:
    /// four actors, the last batch slow, so while it alone is in flight
    /// two of the three idle actors go. Every row is still written once.
    #[tokio::test]
    async fn idle_actors_are_let_go_at_the_tail_keeping_one_spare_per_batch_left() {
        let dir = std::env::temp_dir().join(format!("flotilla-job-tail-{}", std::process::id()));
        let job = BatchJob {
            batching: Batching::rows(4),
            extension: "txt",
            pipeline: PipelineConfig {
                max_attempts: 3,
                ..PipelineConfig::for_workers(4, Duration::from_secs(10))
            },
            ..counting_job(&dir, 64)
        };
        let lines: Vec<String> = (0..64)
            .map(|i| {
                format!(
                    "{{\"id\": {i}, \"text\": \"{}\"}}",
                    if i == 63 { "slow" } else { "t" }
                )
            })
            .collect();
        std::fs::write(dir.join("in.jsonl"), lines.join("\n")).unwrap();
        let limit = flotilla::supervisor::Intensity {
            max_restarts: 3,
            within: Duration::from_secs(60),
        };
        let (pool, _, stopper) = Pool::local(
            4,
            || (Fragile(Arc::default()), ()),
            |_| async { Ok(()) },
            limit,
        )
        .await
        .unwrap();
        let (release, mut let_go) = mpsc::unbounded_channel();
        let encode = Encode(id_lines);
        let summary = tokio::time::timeout(
            Duration::from_secs(60),
            run(
                Links::local(),
                job,
                Judging,
                pool.letting_go(1, release),
                encode,
            ),
        )
        .await
        .expect("the job ends")
        .unwrap();
        stopper.stop().await;
        let mut gone = Vec::new();
        while let Ok(child) = let_go.try_recv() {
            gone.push(child);
        }
        assert_eq!(summary.let_go, 2, "{summary:?}");
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(
            summary
                .line("rows", 4)
                .ends_with(", 2 actors let go as the work ran out"),
            "{}",
            summary.line("rows", 4)
        );
        let (written, _) = written_and_refused(&dir);
        assert_eq!(written, (0..64).collect::<Vec<u64>>());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A part listing its rows' ids, one a line.
    fn id_lines(
        rows: &[Row],
        _: usize,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(rows
            .iter()
            .map(|r| format!("{}\n", r.id))
            .collect::<String>()
            .into_bytes())
    }

    /// The ids in the parts of `dir`'s output, sorted, and those in its
    /// errors file.
    fn written_and_refused(dir: &std::path::Path) -> (Vec<u64>, Vec<u64>) {
        let mut written = Vec::new();
        for part in std::fs::read_dir(dir.join("out/parts")).unwrap() {
            let text = std::fs::read_to_string(part.unwrap().path()).unwrap();
            written.extend(text.lines().map(|l| l.parse::<u64>().unwrap()));
        }
        written.sort();
        let errors = std::fs::read_to_string(dir.join("out/errors.jsonl")).unwrap();
        let mut refused: Vec<u64> = errors
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        refused.sort();
        (written, refused)
    }

    /// Rows that panic the actor on every attempt are isolated by
    /// splitting their batches: they go to the errors file, every other
    /// row is written once, a poison row is sent at most its batch's
    /// attempts plus ⌈log2(16)⌉ + 1 times, and the crashes it causes cost
    /// its actor's restart limit once (three restarts a minute would not
    /// hold the dozen crashes otherwise). A rerun writes nothing twice
    /// and refuses the same rows.
    #[tokio::test]
    async fn rows_that_panic_the_actor_are_isolated_and_the_rest_written_once() {
        let dir = std::env::temp_dir().join(format!("flotilla-job-poison-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bad = [(10, "poison"), (40, "poison")];
        let (result, sends) = run_fragile(&dir, &bad).await;
        let summary = result.unwrap();
        assert_eq!(
            (summary.rows, summary.isolated, summary.refused),
            (62, 2, 2)
        );
        assert!(summary.split >= 2 * 4, "{summary:?}");
        assert!(sends <= 2 * (3 + 4 + 1), "{sends} sends held a poison row");
        assert!(summary.line("rows", 2).ends_with(&format!(
            ", 2 failing rows isolated ({} batches split)",
            summary.split
        )));
        let expected: Vec<u64> = (0..64).filter(|i| ![10, 40].contains(i)).collect();
        assert_eq!(written_and_refused(&dir), (expected.clone(), vec![10, 40]));

        let (again, _) = run_fragile(&dir, &bad).await;
        let again = again.unwrap();
        assert_eq!((again.rows, again.isolated, again.written), (0, 2, 0));
        assert_eq!(written_and_refused(&dir), (expected, vec![10, 40]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A row answered with an error on every attempt is isolated the same
    /// way, beside a row that panics the actor.
    #[tokio::test]
    async fn rows_answered_with_errors_are_isolated_beside_panicking_ones() {
        let dir = std::env::temp_dir().join(format!("flotilla-job-refuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (result, _) = run_fragile(&dir, &[(25, "refuse"), (40, "poison")]).await;
        let summary = result.unwrap();
        assert_eq!((summary.rows, summary.isolated), (62, 2));
        let expected: Vec<u64> = (0..64).filter(|i| ![25, 40].contains(i)).collect();
        assert_eq!(written_and_refused(&dir), (expected, vec![25, 40]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn quantiles_of_latencies_are_within_the_histogram_precision() {
        let mut l = Latencies::new();
        assert_eq!(l.quantile(0.5), Duration::ZERO);
        for ms in 1..=100u64 {
            l.record(Duration::from_millis(ms));
        }
        let p50 = l.quantile(0.5).as_secs_f64() * 1e3;
        let p95 = l.quantile(0.95).as_secs_f64() * 1e3;
        assert!((p50 - 50.0).abs() < 0.1, "{p50}");
        assert!((p95 - 95.0).abs() < 0.1, "{p95}");
    }
}
