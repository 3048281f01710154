//! The job proper, once embedding actors run (in this process or on a
//! cluster): the input cut into batches with stable ids, the framework's
//! bounded pipeline over the actors, parts written as batches complete,
//! refused rows streamed to the errors file.
//!
//! ```text
//! Source ─► Batcher (ids 0, 1, 2, … in input order; done ones skipped)
//!        ─► Pipeline (≤ M in flight) ─► actors ─► Sink part per batch
//!   invalid rows ─────────────────────────────────► errors file
//! ```
//!
//! Memory is flat in the input: the batches in flight, a chunk of rows
//! read ahead, a 16-byte digest per id, a fixed-size latency histogram and
//! at most a megabyte of refused rows before they stream out.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::pipeline::{BatchId, Event, Pipeline, PipelineConfig, WorkerKey};
use flotilla::ractor::{Actor, ActorRef};
use flotilla::supervisor::{
    Backoff, Child, Strategy, Supervisor, SupervisorArgs, SupervisorEvent, SupervisorMsg,
    SupervisorSpec,
};
use tokio::sync::mpsc;

use super::input::Input;
use super::sink::{ErrorLog, Manifest, RowError, Rows, Sink};
use super::source::{Cell, Fields, Item, RowAt, Source};
use super::stage::{Batch, EmbedStage, Held, Output, read_result};
use super::summary::{Latencies, Summary};
use super::{JobConfig, JobError};
use crate::actor::{EmbedMsg, EmbedderArgs, ModelInfo};

/// Embedding actors the job runs on, where they run, and what they loaded.
pub(crate) struct Workers {
    /// `(node, actor)` pairs.
    pub(crate) actors: Vec<(String, ActorRef<EmbedMsg>)>,
    /// The model every actor loaded.
    pub(crate) info: ModelInfo,
    /// Where the actors run (`cpu ×2 (f32)`, `cuda:0 (f16), cuda:1 (f16)`).
    pub(crate) devices: String,
    /// How many of them run on a GPU.
    pub(crate) gpu_actors: usize,
    /// On a cluster, the placement-group bundle of each actor.
    pub(crate) bundles: Vec<usize>,
    /// On a cluster, where the bundles were placed (for the summary).
    pub(crate) placement: Option<String>,
    /// The job's supervisor, whose children the actors are (their ids are
    /// the actors' names, in the same order), and what it reports.
    pub(crate) supervision: Option<Supervision>,
}

/// The job's supervisor.
pub(crate) struct Supervision {
    /// The supervisor.
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
    /// Child ids, in the order of [`Workers::actors`].
    pub(crate) ids: Vec<String>,
}

/// What the job's supervisor reports: starts, exits and escalation.
pub(crate) type SupervisorEvents = mpsc::UnboundedReceiver<SupervisorEvent>;

/// Starts the job's supervisor over `children` (the running actors
/// adopted as their first start): one for one, the job's restart limit
/// for each actor, a wait from 100 ms doubling to 10 s before each
/// restart.
pub(crate) async fn supervise(
    config: &JobConfig,
    children: Vec<Child>,
    members: Option<tokio::sync::watch::Receiver<flotilla::Table>>,
) -> Result<(Supervision, SupervisorEvents), super::ActorError> {
    let ids = children.iter().map(|c| c.spec.id.clone()).collect();
    let (tx, rx) = mpsc::unbounded_channel();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let args = SupervisorArgs {
        spec: SupervisorSpec {
            strategy: Strategy::OneForOne,
            intensity: config.restart_limit,
            per_child: true,
            backoff: Backoff::default(),
        },
        children,
        events: Some(tx),
        members,
        seed,
        report: None,
    };
    let (supervisor, _) = Actor::spawn(None, Supervisor, args)
        .await
        .map_err(super::ActorError::Spawn)?;
    Ok((Supervision { supervisor, ids }, rx))
}

/// Where actors that reported `infos` run, each device once with its
/// count: `cpu ×2 (f32)`, `cuda:0 (f16), cuda:1 (f16)`.
pub(crate) fn devices_of(infos: &[ModelInfo]) -> String {
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for i in infos {
        match seen
            .iter_mut()
            .find(|(d, p, _)| *d == i.device && *p == i.precision)
        {
            Some((_, _, n)) => *n += 1,
            None => seen.push((&i.device, &i.precision, 1)),
        }
    }
    seen.iter()
        .map(|(d, p, n)| match n {
            1 => format!("{d} ({p})"),
            n => format!("{d} ×{n} ({p})"),
        })
        .collect::<Vec<_>>()
        .join(", ")
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
        Some(Self {
            actors,
            info,
            devices: devices_of(infos),
            gpu_actors: infos.iter().filter(|i| i.device != "cpu").count(),
            bundles: Vec::new(),
            placement: None,
            supervision: None,
        })
    }

    /// Stops every actor: through the supervisor (the last first, each
    /// given its shutdown time), or directly before there is one.
    pub(crate) async fn stop(&self) {
        match &self.supervision {
            Some(s) => {
                let within = Duration::from_secs(10);
                if flotilla::call::call(&s.supervisor, SupervisorMsg::Shutdown, within)
                    .await
                    .is_err()
                {
                    s.supervisor.stop(None);
                }
            }
            None => {
                for (_, a) in &self.actors {
                    a.stop(None);
                }
            }
        }
    }
}

/// What each embedding actor of the job is started with.
pub(crate) fn embedder_args(config: &JobConfig) -> EmbedderArgs {
    EmbedderArgs {
        device: config.device.to_string(),
        precision: config.precision.to_string(),
        micro_batch: config.micro_batch.min(u32::MAX as usize) as u32,
        prompt: config.prompt.clone(),
        prompt_name: config.prompt_name.clone(),
        dim: config
            .dim
            .map_or(0, |d| u32::try_from(d).unwrap_or(u32::MAX)),
        zeros: config.zeros,
        ..EmbedderArgs::new(config.model.to_string_lossy())
    }
}

/// Batches in flight per actor on a GPU by default: one running, two
/// tokenized and queued behind it (the pipelined threads' queue), one on
/// its way, so the GPU never waits for the CPU side.
const IN_FLIGHT_PER_GPU_ACTOR: usize = 4;

/// The pipeline's limits for `actors` embedding actors of which
/// `gpu_actors` run on GPUs: `max_in_flight` if given, else the
/// framework's default of two per actor and
/// [`IN_FLIGHT_PER_GPU_ACTOR`] per GPU actor.
fn pipeline_config(actors: usize, gpu_actors: usize, config: &JobConfig) -> PipelineConfig {
    let defaults = PipelineConfig::for_workers(actors, crate::actor::BATCH_DEADLINE);
    let gpu_extra = gpu_actors.min(actors) * IN_FLIGHT_PER_GPU_ACTOR.saturating_sub(2);
    PipelineConfig {
        max_in_flight: config
            .max_in_flight
            .map_or(defaults.max_in_flight + gpu_extra, |m| m.max(1)),
        memory_budget: config.memory_budget,
        ..defaults
    }
}

/// How long a worker node may be missing from the member table (not down
/// or left: absent, as after a head restart, until it rejoins the new
/// head) before its workers are given up.
const ABSENT_GRACE: Duration = Duration::from_secs(15);

/// Which worker nodes the job has lost, from the member tables it sees. A
/// node `down` or `left` is lost at once. A node absent from the table is
/// lost only once it has stayed absent for the grace: a restarted head
/// starts with an empty table that the members fill as they rejoin. Time
/// is passed in.
#[derive(Debug, Default)]
struct LostWorkers {
    /// Nodes absent from the last table, since when.
    absent: std::collections::BTreeMap<String, Instant>,
}

/// What the table says of a worker node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Up,
    Gone,
    Absent,
}

impl LostWorkers {
    /// The nodes among `nodes` lost as of `now`, given what the table
    /// says of each.
    fn lost<'a>(
        &mut self,
        now: Instant,
        nodes: impl Iterator<Item = &'a str>,
        seen: impl Fn(&str) -> Seen,
    ) -> Vec<String> {
        let mut lost = Vec::new();
        let mut still_absent = std::collections::BTreeMap::new();
        for node in nodes {
            match seen(node) {
                Seen::Up => {}
                Seen::Gone => lost.push(node.to_owned()),
                Seen::Absent => {
                    let since = self.absent.get(node).copied().unwrap_or(now);
                    if now.duration_since(since) >= ABSENT_GRACE {
                        lost.push(node.to_owned());
                    } else {
                        still_absent.insert(node.to_owned(), since);
                    }
                }
            }
        }
        self.absent = still_absent;
        lost
    }

    /// When the next absent node's grace ends, if any is absent.
    fn next_deadline(&self) -> Option<Instant> {
        self.absent
            .values()
            .min()
            .map(|since| *since + ABSENT_GRACE)
    }
}

/// Removes the workers of every node the job has lost; their batches go to
/// the others.
fn drop_lost_workers(
    pipeline: &mut Pipeline<EmbedStage>,
    tracker: &mut LostWorkers,
    table: &flotilla::Table,
) {
    let seen = |node: &str| match table.get(node) {
        Some(m) if m.state == flotilla::MemberState::Up => Seen::Up,
        Some(_) => Seen::Gone,
        None => Seen::Absent,
    };
    let lost = tracker.lost(Instant::now(), pipeline.nodes(), seen);
    for node in lost {
        let actors = pipeline.remove_node(&node);
        tracing::warn!(%node, actors, in_flight = pipeline.in_flight(), "worker node lost; its batches go to the other workers");
    }
}

/// Applies what the job's supervisor reports to the pipeline: an actor
/// that exited leaves it (its batches go to the others at once), a
/// restarted one joins it, an escalation ends the job.
fn on_supervision(
    event: SupervisorEvent,
    pipeline: &mut Pipeline<EmbedStage>,
    keys: &mut HashMap<String, WorkerKey>,
    restarting: &mut BTreeSet<String>,
    summary: &mut Summary,
) -> Result<(), flotilla::supervisor::Escalation> {
    match event {
        SupervisorEvent::Exited {
            child,
            exit,
            restarting: again,
        } => {
            if let Some(key) = keys.remove(&child)
                && pipeline.remove_worker(key)
            {
                tracing::warn!(actor = %child, ?exit, restart = again, in_flight = pipeline.in_flight(),
                    "embedding actor exited; its batches go to the other actors");
            }
            if again {
                restarting.insert(child);
            } else {
                restarting.remove(&child);
            }
        }
        SupervisorEvent::Started {
            child,
            running,
            restarts,
        } => {
            restarting.remove(&child);
            if restarts > 0 {
                let node = running
                    .node
                    .as_ref()
                    .map_or_else(|| "local".to_owned(), |(n, _)| n.clone());
                let key = pipeline.add_worker(&node, ActorRef::from(running.cell));
                keys.insert(child, key);
                summary.restarts += 1;
            }
        }
        SupervisorEvent::Escalated(e) => return Err(e),
    }
    Ok(())
}

/// Output column names the job itself writes.
const RESERVED: [&str; 2] = ["id", "embedding"];

/// Cuts the input into batches with ids 0, 1, 2, …: windows of rows read
/// in input order, each sorted by length and cut into batches (see
/// [`Cut`]). Invalid rows go to the errors file as they are read.
struct Batcher {
    source: Source,
    input: Arc<Input>,
    cut: Cut,
    /// Batches cut from the current window, not yet handed out.
    ready: std::collections::VecDeque<Batch>,
    next_id: u64,
    exhausted: bool,
}

/// How a window of rows becomes batches. Deterministic: the same input and
/// settings give the same batches (so resume skips exactly the written
/// ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    /// Rows per batch at most.
    size: usize,
    /// Rows per window (0: a window is one batch, in input order).
    window: usize,
    /// Estimated tokens per batch at most, padding included.
    max_tokens: Option<usize>,
}

/// Bytes of a window at most, whatever its row count: the driver's memory
/// stays bounded on long texts.
const WINDOW_BYTES: usize = 16 << 20;

/// A row's tokens as the token budget estimates them: its two special
/// tokens and one per four bytes.
fn estimated_tokens(text: &str) -> usize {
    2 + text.len() / 4
}

impl Cut {
    /// Rows a window holds.
    fn rows(&self) -> usize {
        if self.window == 0 {
            self.size
        } else {
            self.window.max(self.size)
        }
    }

    /// The window's rows, sorted by length (stably: equal lengths keep
    /// input order) unless windows are off, cut into batches of at most
    /// `size` rows and `max_tokens` estimated tokens.
    fn batches(&self, mut rows: Vec<Row>) -> Vec<Batch> {
        if self.window > 0 {
            rows.sort_by_key(|r| r.text.len());
        }
        let mut out = Vec::new();
        let mut batch = Batch::default();
        let mut longest = 0;
        for row in rows {
            let tokens = estimated_tokens(&row.text);
            let would = (batch.len() + 1) * longest.max(tokens);
            let over = self.max_tokens.is_some_and(|t| would > t);
            if batch.len() == self.size || (over && batch.len() > 0) {
                out.push(std::mem::take(&mut batch));
                longest = 0;
            }
            longest = longest.max(tokens);
            batch.ids.push(row.id);
            batch.at.push(row.at);
            batch.texts.push(row.text);
            batch.extra.push(row.extra);
        }
        if batch.len() > 0 {
            out.push(batch);
        }
        out
    }
}

/// One valid input row.
struct Row {
    at: RowAt,
    id: String,
    text: String,
    extra: Vec<Cell>,
}

impl Batcher {
    /// Whether every batch has been handed out.
    fn is_done(&self) -> bool {
        self.exhausted && self.ready.is_empty()
    }

    /// The next batch and its id, `None` at the end of the input.
    async fn next(&mut self, errors: &mut ErrorLog<'_>) -> Result<Option<(u64, Batch)>, JobError> {
        if self.ready.is_empty() && !self.exhausted {
            let rows = self.window(errors).await?;
            self.ready.extend(self.cut.batches(rows));
        }
        let Some(batch) = self.ready.pop_front() else {
            return Ok(None);
        };
        let id = self.next_id;
        self.next_id += 1;
        Ok(Some((id, batch)))
    }

    /// Reads the next window of valid rows.
    async fn window(&mut self, errors: &mut ErrorLog<'_>) -> Result<Vec<Row>, JobError> {
        let (limit, mut bytes) = (self.cut.rows(), 0usize);
        let mut rows = Vec::new();
        while !self.exhausted && rows.len() < limit && bytes < WINDOW_BYTES {
            match self.source.next().await {
                None => self.exhausted = true,
                Some(Err(source)) => {
                    return Err(JobError::Read {
                        input: self.input.spec.clone(),
                        source,
                    });
                }
                Some(Ok(Item::Invalid { at, id, reason })) => {
                    errors.record(&self.row_error(at, id, reason)).await?;
                }
                Some(Ok(Item::Row {
                    at,
                    id,
                    text,
                    extra,
                })) => {
                    bytes += text.len();
                    rows.push(Row {
                        at,
                        id,
                        text,
                        extra,
                    });
                }
            }
        }
        Ok(rows)
    }

    fn row_error(&self, at: RowAt, id: Option<String>, reason: String) -> RowError {
        RowError {
            shard: self.input.shards[at.shard as usize].name.clone(),
            line: at.line,
            id,
            reason,
        }
    }
}

/// Result objects whose parts are written, released to their actors'
/// nodes a few at a time (one request per node for each lot), without
/// holding up the job; the job waits for what is still on its way before
/// it ends. A release that does not arrive leaves the object to its lease.
struct Releases {
    objects: Option<flotilla::Objects>,
    pending: Vec<flotilla::ObjectRef>,
    sending: tokio::task::JoinSet<()>,
}

/// Result objects released in one lot.
const RELEASE_LOT: usize = 32;

impl Releases {
    fn new(objects: Option<flotilla::Objects>) -> Self {
        Self {
            objects,
            pending: Vec::new(),
            sending: tokio::task::JoinSet::new(),
        }
    }

    /// Queues `object`; sends the lot once it is full (or when `now`).
    fn release(&mut self, object: Option<flotilla::ObjectRef>, now: bool) {
        self.pending.extend(object);
        if self.pending.len() >= RELEASE_LOT || (now && !self.pending.is_empty()) {
            self.flush();
        }
    }

    fn flush(&mut self) {
        // Forget the lots already sent: the set holds those on their way.
        while self.sending.try_join_next().is_some() {}
        let lot = std::mem::take(&mut self.pending);
        if let (Some(objects), false) = (self.objects.clone(), lot.is_empty()) {
            self.sending.spawn(async move {
                if let Err(e) = objects.release_all(&lot).await {
                    tracing::debug!(error = %e, "result objects not released; their lease ends them");
                }
            });
        }
    }

    /// Sends what is queued and waits up to `within` for every lot.
    async fn finish(mut self, within: Duration) {
        self.flush();
        let _ = tokio::time::timeout(within, self.sending.join_all()).await;
    }
}

/// How long a batch's texts wait for room in the driver's store before
/// the job sends texts in its requests instead.
const TEXTS_PUT_WITHIN: Duration = Duration::from_secs(10);

/// How long a finished job waits for its last releases.
const RELEASES_WITHIN: Duration = Duration::from_secs(5);

/// Runs the job over `workers`, sending through `outbound`. With `members`,
/// workers whose node goes down or leaves are dropped and their batches
/// sent elsewhere.
pub(crate) async fn drive(
    config: &JobConfig,
    started: Instant,
    workers: &Workers,
    outbound: flotilla::Outbound,
    objects: Option<flotilla::Objects>,
    mut members: Option<tokio::sync::watch::Receiver<flotilla::Table>>,
    mut events: Option<SupervisorEvents>,
) -> Result<Summary, JobError> {
    // Every actor has its model: what follows is the job itself.
    let ready_after = started.elapsed();
    let info = &workers.info;
    let revision = crate::ModelRevision::new(info.revision.clone());
    // At least 1 (JobConfig::check).
    let batch_size = config.batch_size;
    let mut seen = HashSet::new();
    for column in &config.output_columns {
        if RESERVED.contains(&column.as_str()) || !seen.insert(column) {
            return Err(JobError::OutputColumn(column.clone()));
        }
    }

    let input = Arc::new(Input::resolve(&config.input).await?);
    let scan = {
        let input = Arc::clone(&input);
        let hash = config.job_id.is_none();
        match tokio::task::spawn_blocking(move || input.scan(hash)).await {
            Ok(scan) => scan?,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    };
    let job_id = match &config.job_id {
        Some(id) => id.clone(),
        None => {
            let digest: String = scan.digest.expect("hashed without a job id")[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let mut id = format!("{digest}-b{batch_size}");
            if config.sort_window > 0 {
                id.push_str(&format!("-w{}", config.sort_window));
            }
            if let Some(t) = config.max_batch_tokens {
                id.push_str(&format!("-t{t}"));
            }
            if !info.prompt.is_empty() {
                let digest = <sha2::Sha256 as sha2::Digest>::digest(info.prompt.as_bytes());
                id.push_str("-p");
                id.extend(digest[..4].iter().map(|b| format!("{b:02x}")));
            }
            if config.dim.is_some() {
                id.push_str(&format!("-d{}", info.dim));
            }
            format!("{id}-{}", revision.short())
        }
    };
    let fields = Fields {
        id: config.id_field.clone(),
        text: config.text_field.clone(),
        extra: config.output_columns.clone(),
    };
    let source = Source::open(Arc::clone(&input), fields)
        .await
        .map_err(|source| JobError::Read {
            input: config.input.clone(),
            source,
        })?;
    let columns = config
        .output_columns
        .iter()
        .cloned()
        .zip(source.types().iter().copied())
        .collect();
    let manifest = Manifest {
        job_id: job_id.clone(),
        model_revision: revision.to_string(),
        dim: info.dim,
        batch_size: batch_size as u32,
        format: config.format,
        columns: config.output_columns.clone(),
        sort_window: u32::try_from(config.sort_window).unwrap_or(u32::MAX),
        max_batch_tokens: config
            .max_batch_tokens
            .map_or(0, |t| u32::try_from(t).unwrap_or(u32::MAX)),
        prompt: info.prompt.clone(),
        similarity: info.similarity.clone(),
    };
    let (sink, done) = Sink::open(&config.output, &manifest, columns).await?;
    let mut errors = sink.errors();
    let mut batcher = Batcher {
        source,
        input: Arc::clone(&input),
        cut: Cut {
            size: batch_size,
            window: config.sort_window,
            max_tokens: config.max_batch_tokens,
        },
        ready: std::collections::VecDeque::new(),
        next_id: 0,
        exhausted: false,
    };

    let mut pipeline = Pipeline::new(
        EmbedStage {
            revision: manifest.model_revision.clone(),
            dim: info.dim,
        },
        pipeline_config(workers.actors.len(), workers.gpu_actors, config),
        outbound,
    );
    // Which worker each supervised actor is.
    let mut keys: HashMap<String, WorkerKey> = HashMap::new();
    for (i, (node, actor)) in workers.actors.iter().enumerate() {
        let key = pipeline.add_worker(node, actor.clone());
        if let Some(s) = &workers.supervision {
            keys.insert(s.ids[i].clone(), key);
        }
    }
    // Actors that exited and are being restarted.
    let mut restarting: BTreeSet<String> = BTreeSet::new();

    let mut summary = Summary {
        job_id,
        output: config.output.clone(),
        format: Some(config.format),
        model_load: Duration::from_millis(info.load_ms),
        actors: workers.actors.len(),
        devices: workers.devices.clone(),
        ready_after,
        ..Summary::default()
    };
    let mut progress =
        super::progress::Progress::new(config.progress_bar, scan.rows, config.progress_to.clone());
    let mut latencies = Latencies::new();
    let mut gave_up = 0u64;
    let mut lost_workers = LostWorkers::default();
    let mut releases = Releases::new(objects.clone());
    // Batches hand their texts over as objects of the driver's store while
    // it takes them.
    let mut texts_as_objects = objects
        .clone()
        .map(|o| o.with_put_timeout(TEXTS_PUT_WITHIN));

    loop {
        // Fill free credits with the next batches not already done.
        while !batcher.is_done() && pipeline.has_credit() {
            let Some((id, mut batch)) = batcher.next(&mut errors).await? else {
                break;
            };
            if done.contains(&id) {
                summary.skipped_batches += 1;
                progress.skipped(batch.len());
                continue;
            }
            if let Some(objects) = &texts_as_objects
                && let Err(e) = batch.put_texts(objects).await
            {
                // A store too small (a container's /dev/shm, say) or full:
                // this batch and the rest carry their texts in the request.
                tracing::warn!(error = %e, "the driver's object store refused a batch; texts go in the requests from now on");
                texts_as_objects = None;
            }
            pipeline.submit(BatchId(id), batch);
        }
        if batcher.is_done() && pipeline.is_idle() {
            break;
        }
        let grace_ends = lost_workers.next_deadline();
        let grace = async {
            match grace_ends {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let table_changed = async {
            match members.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let supervised = async {
            match events.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        // With every worker restarting, wait for them rather than give up.
        let serving = pipeline.workers() > 0 || restarting.is_empty();
        let event = tokio::select! {
            e = pipeline.next(), if serving => e,
            open = table_changed => {
                match members.as_mut() {
                    Some(rx) if open => {
                        drop_lost_workers(&mut pipeline, &mut lost_workers, &rx.borrow_and_update());
                    }
                    _ => members = None,
                }
                continue;
            }
            () = grace => {
                if let Some(rx) = &members {
                    drop_lost_workers(&mut pipeline, &mut lost_workers, &rx.borrow());
                }
                continue;
            }
            event = supervised => {
                match event {
                    Some(event) => on_supervision(event, &mut pipeline, &mut keys, &mut restarting, &mut summary)
                        .map_err(JobError::RestartLimit)?,
                    None => events = None,
                }
                continue;
            }
        };
        // A supervisor that gives up says so before the exits it causes, so
        // an escalation ends the job above before its last worker leaves.
        match event.map_err(JobError::NoWorkers)? {
            None => {}
            Some(Event::Done {
                id,
                batch,
                output,
                latency,
                receipt,
            }) => {
                let (held, lent) = match output {
                    Output::Values(values) => (Held::Values(values), None),
                    Output::Object(object) => match read_result(
                        objects.as_ref(),
                        &object,
                        &manifest.model_revision,
                        info.dim,
                        batch.len(),
                    )
                    .await
                    {
                        Ok(vectors) => (Held::Object(vectors), Some(object)),
                        Err(reason) => {
                            // A failed attempt of the batch: sent again
                            // within the attempts it has left.
                            tracing::warn!(batch = id.0, attempt = receipt.attempt(), %reason, "result object unreadable; the batch goes out again");
                            releases.release(Some(object), true);
                            pipeline.unusable(id, batch, receipt);
                            continue;
                        }
                    },
                };
                let values = held.values();
                let rows = Rows {
                    ids: &batch.ids,
                    extra: &batch.extra,
                    values: &values,
                };
                sink.write_batch(id.0, rows).await?;
                drop(values);
                drop(held);
                releases.release(lent, false);
                summary
                    .first_batch_after
                    .get_or_insert_with(|| started.elapsed());
                summary.texts += batch.len() as u64;
                summary.batches += 1;
                latencies.record(latency);
                progress.done(batch.len());
            }
            Some(Event::Rejected { batch, reason, .. }) => {
                for (id, at) in batch.ids.iter().zip(&batch.at) {
                    errors
                        .record(&batcher.row_error(*at, Some(id.clone()), reason.clone()))
                        .await?;
                }
                progress.done(batch.len());
            }
            Some(Event::GaveUp { id, .. }) => {
                tracing::error!(batch = id.0, "batch failed on every attempt");
                gave_up += 1;
            }
        }
    }
    progress.finish();
    releases.finish(RELEASES_WITHIN).await;
    summary.rejected_rows = errors.rows();
    errors.finish().await?;
    let stats = pipeline.stats();
    summary.retries = stats.retries;
    summary.redispatches = stats.redispatches;
    summary.batch_p50 = latencies.quantile(0.5);
    summary.batch_p95 = latencies.quantile(0.95);
    summary.elapsed = started.elapsed();
    summary.peak_rss = flotilla::process::peak_rss_bytes();
    if gave_up > 0 {
        return Err(JobError::Incomplete(gave_up));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(texts: &[&str]) -> Vec<Row> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| Row {
                at: RowAt {
                    shard: 0,
                    line: i as u64,
                },
                id: format!("r{i}"),
                text: (*t).to_owned(),
                extra: Vec::new(),
            })
            .collect()
    }

    fn ids(batches: &[Batch]) -> Vec<Vec<&str>> {
        batches
            .iter()
            .map(|b| b.ids.iter().map(String::as_str).collect())
            .collect()
    }

    fn info(device: &str, precision: &str) -> ModelInfo {
        ModelInfo {
            revision: "sha256:r".into(),
            dim: 384,
            load_ms: 1,
            device: device.into(),
            precision: precision.into(),
            prompt: String::new(),
            similarity: String::new(),
        }
    }

    #[test]
    fn devices_are_listed_once_each_with_their_count() {
        let cpu = [info("cpu", "f32"), info("cpu", "f32")];
        assert_eq!(devices_of(&cpu), "cpu ×2 (f32)");
        let gpus = [
            info("cuda:0", "f16"),
            info("cuda:1", "f16"),
            info("cpu", "f16"),
        ];
        assert_eq!(devices_of(&gpus), "cuda:0 (f16), cuda:1 (f16), cpu (f16)");
    }

    #[test]
    fn gpu_actors_get_more_batches_in_flight_unless_told() {
        let config = JobConfig::new("in", "out", "model");
        assert_eq!(pipeline_config(3, 0, &config).max_in_flight, 6);
        assert_eq!(
            pipeline_config(2, 2, &config).max_in_flight,
            2 * IN_FLIGHT_PER_GPU_ACTOR
        );
        let told = JobConfig {
            max_in_flight: Some(3),
            ..config
        };
        assert_eq!(pipeline_config(2, 2, &told).max_in_flight, 3);
    }

    #[test]
    fn without_a_window_batches_keep_input_order() {
        let cut = Cut {
            size: 2,
            window: 0,
            max_tokens: None,
        };
        assert_eq!(cut.rows(), 2);
        let b = cut.batches(rows(&["ccc", "a", "bb"]));
        assert_eq!(ids(&b), [vec!["r0", "r1"], vec!["r2"]]);
    }

    #[test]
    fn a_window_is_sorted_by_length_stably_and_cut_the_same_every_time() {
        let cut = Cut {
            size: 2,
            window: 8,
            max_tokens: None,
        };
        let texts = ["cccc", "a", "bb", "dd", "e", "ffffff"];
        let b = cut.batches(rows(&texts));
        assert_eq!(
            ids(&b),
            [vec!["r1", "r4"], vec!["r2", "r3"], vec!["r0", "r5"]],
            "shortest first; equal lengths in input order"
        );
        assert_eq!(ids(&cut.batches(rows(&texts))), ids(&b), "deterministic");
    }

    #[test]
    fn a_token_budget_closes_batches_early_and_a_long_row_goes_alone() {
        let cut = Cut {
            size: 8,
            window: 8,
            max_tokens: Some(12),
        };
        // Estimates: 2 + bytes / 4 → 3, 3, 4, 4, 27.
        let long = "x".repeat(100);
        let b = cut.batches(rows(&["aaaa", "bbbb", "cccccccc", "dddddddd", &long]));
        assert_eq!(
            ids(&b),
            [vec!["r0", "r1", "r2"], vec!["r3"], vec!["r4"]],
            "3 rows × 4 ≤ 12; a fourth would make 16; the long row alone"
        );
    }

    fn seen(up: &[&str], gone: &[&str]) -> impl Fn(&str) -> Seen {
        let (up, gone): (Vec<String>, Vec<String>) = (
            up.iter().map(|s| s.to_string()).collect(),
            gone.iter().map(|s| s.to_string()).collect(),
        );
        move |n: &str| {
            if up.iter().any(|u| u == n) {
                Seen::Up
            } else if gone.iter().any(|g| g == n) {
                Seen::Gone
            } else {
                Seen::Absent
            }
        }
    }

    #[test]
    fn a_node_down_or_left_is_lost_at_once() {
        let mut t = LostWorkers::default();
        let now = Instant::now();
        let lost = t.lost(now, ["w1", "w2"].into_iter(), seen(&["w1"], &["w2"]));
        assert_eq!(lost, vec!["w2".to_owned()]);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_node_absent_from_a_fresh_table_is_kept_for_the_grace() {
        // A restarted head's first table holds only the members that have
        // rejoined so far.
        let mut t = LostWorkers::default();
        let t0 = Instant::now();
        let nodes = ["w1", "w2"];
        assert!(t.lost(t0, nodes.into_iter(), seen(&["w1"], &[])).is_empty());
        assert_eq!(t.next_deadline(), Some(t0 + ABSENT_GRACE));
        // Still absent a little later: kept, and its grace still counts
        // from when it went missing.
        let t1 = t0 + Duration::from_secs(3);
        assert!(t.lost(t1, nodes.into_iter(), seen(&["w1"], &[])).is_empty());
        assert_eq!(t.next_deadline(), Some(t0 + ABSENT_GRACE));
        // It rejoins: nothing lost, nothing pending.
        let t2 = t0 + Duration::from_secs(5);
        assert!(
            t.lost(t2, nodes.into_iter(), seen(&["w1", "w2"], &[]))
                .is_empty()
        );
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_node_absent_past_the_grace_is_lost() {
        let mut t = LostWorkers::default();
        let t0 = Instant::now();
        assert!(t.lost(t0, ["w2"].into_iter(), seen(&[], &[])).is_empty());
        let lost = t.lost(t0 + ABSENT_GRACE, ["w2"].into_iter(), seen(&[], &[]));
        assert_eq!(lost, vec!["w2".to_owned()]);
        assert_eq!(t.next_deadline(), None);
    }
}
