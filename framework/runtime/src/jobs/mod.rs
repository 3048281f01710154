//! # Room `jobs/`: detached jobs on the head
//!
//! Owns the head's service for detached jobs (this file). Drives
//! [`flotilla_proto::jobs`].
//!
//! May import: `node`, `supervisor`, `member`, `head`, `remote` and the
//! shared files.
//!
//! Detached jobs on the head: each job's actor runs in a placement-group
//! bundle of its own (a detached group, so it outlives whoever submitted
//! it), as the one child of a supervisor on the head. When the actor's
//! node is lost the head places the bundle on another node and the
//! supervisor starts the actor there; the head asks each running job for
//! its progress, and a job that reports its end is stopped and its bundle
//! released. The states are [`JobRecord`]'s (proto).
//!
//! ```text
//! Jobs(Submit) ─► detached group (1 bundle) ─► Supervisor ─► RemoteChild::in_bundle ─► job actor
//!                                                 events ─► JobRecord      ▲
//! every 500 ms: JobMsg::Progress ──────────────────────────────────────────┘
//! ```
//!
//! A job actor is any registered kind whose message type is [`JobMsg`]:
//! it answers `Progress` with where it is, and keeps answering with its
//! end once it has one, until the head stops it. Its name is the job's id
//! and a tag nobody can guess, and the head asks it only on the node its
//! supervisor started it on: no other node can answer for a job.
//!
//! Jobs that ended are kept for `node jobs` and `node jobs wait` as
//! [`Retention`] says (by default the last 1,000, a week each), then
//! forgotten, so the head's list stays bounded.
//!
//! Given a [`HeadStore`] (the `node` binary keeps one in the head's state
//! directory), the head writes every job there, committed before it
//! answers the submission and after each change of state. A head started
//! again on the same store lists the jobs that ended as before, and
//! starts again, each in a bundle of its own, the jobs that had not (the
//! nodes stopped their actors when the head's old incarnation went; the
//! embed job's driver resumes from its manifest); the bundle a job held
//! before is released (the head's placement groups come back from the same
//! store, so the group is known at once; its node is told when it reports
//! the bundle).
//!
//! Who may do what: drivers, admins and the head submit; a job belongs to
//! the certificate that submitted it, which (or an admin, or the head) may
//! stop it; any role may list jobs ([`flotilla_proto::authority`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::control::StopOutcome;
use flotilla_proto::control::{ControlReply, ControlRequest, SpawnOrder};
use flotilla_proto::incarnation::MemberRef;
use flotilla_proto::jobs::JobRecord;
use flotilla_proto::placement::Strategy;
use flotilla_proto::supervision::{Backoff, ChildSpec, Intensity, RestartType, SupervisorSpec};
use ractor::{Actor, ActorRef, RpcReplyPort};
use ractor_cluster::RactorClusterMessage;
use rkyv::{Archive, Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use futures::future::BoxFuture;

use crate::caller::{Caller, sender_of};
use crate::clock::clock_millis;
use crate::head::head_store::{HeadStore, HeadStoreError};
use crate::jobs_slot::ServeJobs;
use crate::member::head_client::HeadUnavailable;
use crate::node::placement_groups::{GroupId, GroupSpec};
use crate::node::{Node, StopError};
use crate::supervisor::{
    Child, RemoteChild, Supervisor, SupervisorArgs, SupervisorEvent, SupervisorMsg,
};
use flotilla_proto::authority::{self, Unauthorized};
use flotilla_proto::role::principal_of;

pub use flotilla_proto::ids::JobId;
pub use flotilla_proto::job_stats::{JobMetrics, JobStats};
use flotilla_proto::job_stats::{SAMPLE_EVERY, SAMPLES_KEPT, Sample};
pub use flotilla_proto::jobs::{
    JobProgress, JobSpec, JobState, JobView, JobsReply, JobsRequest, LogPage, Retention, StoredJob,
};
use flotilla_proto::jobs::{LOG_BYTES_PER_PAGE, LOG_LINES_KEPT};

/// How often the head asks running jobs for their progress.
const POLL: Duration = Duration::from_millis(500);
/// How long one start of a job's actor may take.
const START_WITHIN: Duration = Duration::from_secs(60);
/// How often at most a running job's progress (texts done) is written to
/// the store; its changes of state are written at once. Progress is not
/// what a restarted job resumes from (its driver reads its manifest), so
/// it need not cost a durable write every poll.
const SAVE_PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How long an ended job's actor left on a node is asked to stop before
/// the head gives up (its node is still up but does not answer).
const LEFT_COPY_WITHIN: Duration = Duration::from_secs(300);
/// Between two such asks.
const LEFT_COPY_EVERY: Duration = Duration::from_secs(2);

/// A progress question (no content).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressAsk;

/// A job actor's answer: where it is.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobReport(pub JobProgress);

crate::remote_type!(ProgressAsk, JobReport);

/// Messages every job actor takes.
#[derive(RactorClusterMessage)]
pub enum JobMsg {
    /// Where the job is.
    #[rpc]
    Progress(ProgressAsk, RpcReplyPort<JobReport>),
}

/// Why a jobs call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobsError {
    /// The head refused the submission.
    #[error("NODE-JOB-001: invalid job: {0}")]
    Invalid(String),
    /// The head runs no jobs service.
    #[error(
        "NODE-JOB-002: the head serves no jobs (start it with the node binary, or call Node::serve_jobs)"
    )]
    NotServed,
    /// The head did not answer.
    #[error("NODE-JOB-003: {0}")]
    Head(#[from] HeadUnavailable),
    /// The head answered with something else.
    #[error("NODE-JOB-003: the head answered a jobs request with {0}")]
    Unexpected(String),
    /// The head's permission table refused the request.
    #[error("NODE-JOB-006: the head refused: {0}")]
    Denied(Unauthorized),
}

/// The jobs service's side of the node's [`crate::jobs_slot::JobsSlot`].
struct JobsHandle {
    tx: mpsc::UnboundedSender<Command>,
}

type Answer = Result<JobsReply, Unauthorized>;

impl ServeJobs for JobsHandle {
    fn request(&self, caller: Option<Caller>, request: JobsRequest) -> BoxFuture<'_, Answer> {
        Box::pin(async move {
            let (reply, rx) = oneshot::channel();
            if self
                .tx
                .send(Command::Request(caller, request, reply))
                .is_err()
            {
                return Ok(JobsReply::NotServed);
            }
            rx.await.unwrap_or(Ok(JobsReply::NotServed))
        })
    }
}

enum Command {
    Request(Option<Caller>, JobsRequest, oneshot::Sender<Answer>),
    Event(JobId, SupervisorEvent),
    Progress(JobId, Box<JobProgress>),
}

/// The head's jobs service, running until [`Jobs::stop`].
pub struct Jobs {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Jobs {
    /// Stops every job's supervisor (the jobs' actors stop) and the
    /// service.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

struct Entry {
    record: JobRecord,
    /// What was submitted (what a restarted head starts again).
    spec: JobSpec,
    /// Its actor's name: the job's id and a tag nobody can guess.
    actor: String,
    group: Option<GroupId>,
    supervisor: Option<ActorRef<SupervisorMsg>>,
    /// The node (and incarnation) its actor was last started on.
    placed: Option<MemberRef>,
    /// When it ended, once it has.
    ended_at: Option<std::time::Instant>,
    /// When it was last written to the store.
    saved_at: Option<std::time::Instant>,
    /// What its driver last reported of its batches.
    stats: JobStats,
    /// When this head took it (submitted, or read back from the store).
    taken_at: std::time::Instant,
    /// When its count of rows last grew.
    progressed_at: Option<std::time::Instant>,
    /// Its counts over the last hour, with when each was taken.
    samples: std::collections::VecDeque<(std::time::Instant, u64, u64)>,
    /// Its driver's log lines, the last [`LOG_LINES_KEPT`], and the
    /// number of the first.
    log: (std::collections::VecDeque<String>, u64),
}

impl Entry {
    /// Its account at `now`, as `/metrics` and the dashboard show it, its
    /// cost at the prices of `table`'s nodes.
    fn metrics(&self, now: std::time::Instant, table: &crate::table::Table) -> JobMetrics {
        let r = &self.record;
        let since = |at: std::time::Instant| now.saturating_duration_since(at).as_secs_f64();
        JobMetrics {
            id: r.id.clone(),
            description: r.description.clone(),
            history: Vec::new(),
            owner: r.owner.clone(),
            state: r.state,
            done: r.done,
            total: r.total,
            restarts: r.restarts,
            age_s: since(self.taken_at),
            since_progress_s: self.progressed_at.map_or(0.0, since),
            ended_s: self.ended_at.map(since),
            cost: flotilla_proto::job_stats::cost(&self.stats, |node| table.price_per_hour(node)),
            stats: self.stats.clone(),
        }
    }

    /// Its account at `now` with its counts over the last hour.
    fn account(&self, now: std::time::Instant, table: &crate::table::Table) -> JobMetrics {
        let mut m = self.metrics(now, table);
        m.history = self
            .samples
            .iter()
            .map(|&(at, rows, tokens)| Sample {
                ago_s: now.saturating_duration_since(at).as_secs() as u32,
                rows,
                tokens,
            })
            .collect();
        m
    }

    /// Keeps its driver's new log `lines`, the last [`LOG_LINES_KEPT`].
    fn keep_log(&mut self, lines: Vec<String>) {
        let (kept, first) = &mut self.log;
        kept.extend(lines);
        while kept.len() > LOG_LINES_KEPT {
            kept.pop_front();
            *first += 1;
        }
    }

    /// Its driver's log from line `after`, at most [`LOG_BYTES_PER_PAGE`].
    fn log_page(&self, after: u64) -> LogPage {
        let (kept, first) = &self.log;
        // Past the end: none, and where the end is.
        let end = first + kept.len() as u64;
        let from = after.clamp(*first, end);
        let (mut lines, mut bytes) = (Vec::new(), 0);
        for line in kept.iter().skip((from - first) as usize) {
            if !lines.is_empty() && bytes + line.len() > LOG_BYTES_PER_PAGE {
                break;
            }
            bytes += line.len();
            lines.push(line.clone());
        }
        LogPage {
            next: from + lines.len() as u64,
            dropped: first.saturating_sub(after),
            ended: self.record.state.is_end(),
            lines,
        }
    }

    /// Keeps a sample of its counts at `now`, one every [`SAMPLE_EVERY`],
    /// the last hour's.
    fn sample(&mut self, now: std::time::Instant) {
        let due = self
            .samples
            .back()
            .is_none_or(|(at, ..)| now.saturating_duration_since(*at) >= SAMPLE_EVERY);
        if due {
            if self.samples.len() >= SAMPLES_KEPT {
                self.samples.pop_front();
            }
            self.samples
                .push_back((now, self.stats.rows_done, self.stats.tokens));
        }
    }
}

struct Service {
    node: Arc<Node>,
    tx: mpsc::UnboundedSender<Command>,
    jobs: BTreeMap<u64, Entry>,
    next: u64,
    retention: Retention,
    /// Where jobs are kept across restarts of the head.
    store: Option<Arc<HeadStore>>,
}

impl Node {
    /// Serves detached jobs from this node, the head (`None` elsewhere):
    /// [`Node::submit_job`] from any node, and `node jobs`; ended jobs are
    /// kept as [`Retention::default`] says.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("serve_jobs")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start_shared()
    ///     .await?;
    /// let _jobs = node.serve_jobs()?.expect("a head serves jobs");
    /// let spec = flotilla::node::doc_example::counter_job();
    /// let id = node.submit_job(spec).await?;
    /// assert_eq!(node.jobs().await?[0].id, id);
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn serve_jobs(self: &Arc<Self>) -> Result<Option<Jobs>, HeadStoreError> {
        self.serve_jobs_with(Retention::default())
    }

    /// [`Node::serve_jobs`], keeping ended jobs as `retention` says. A head
    /// built with [`crate::NodeBuilder::head_store_in`] keeps every job in
    /// that store as well: the jobs it holds are taken back first (those
    /// that ended listed, the others started again). A store that cannot
    /// be read is an error and no job is served.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("serve_jobs_with")?;
    /// use std::time::Duration;
    /// use flotilla::jobs::Retention;
    /// let head = flotilla::Node::builder(config).start_shared().await?;
    /// // The last 10 ended jobs, for an hour each.
    /// let retention = Retention { keep: 10, keep_for: Duration::from_secs(3600) };
    /// let jobs = head.serve_jobs_with(retention)?;
    /// assert!(jobs.is_some(), "served by the head (a member serves none)");
    /// assert!(head.jobs().await?.is_empty());
    /// head.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn serve_jobs_with(
        self: &Arc<Self>,
        retention: Retention,
    ) -> Result<Option<Jobs>, HeadStoreError> {
        let store = self.head_store.clone();
        if self.placement.is_none() {
            return Ok(None);
        }
        let stored = match &store {
            Some(store) => store.load_jobs()?,
            None => Vec::new(),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        if !self.jobs.set(Arc::new(JobsHandle { tx: tx.clone() })) {
            return Ok(None);
        }
        let stop = CancellationToken::new();
        let service = Service {
            node: Arc::clone(self),
            tx,
            jobs: BTreeMap::new(),
            next: 1,
            retention,
            store,
        };
        let task = tokio::spawn(service.run(stored, rx, stop.clone()));
        Ok(Some(Jobs { stop, task }))
    }

    async fn jobs_request(&self, request: JobsRequest) -> Result<JobsReply, JobsError> {
        let reply = if self.placement.is_some() {
            self.jobs
                .request_as(None, request)
                .await
                .map_err(JobsError::Denied)?
        } else {
            let head = self.view.borrow().head.clone();
            match self
                .head_client
                .call(
                    &head,
                    &ControlRequest::Jobs(request),
                    Duration::from_secs(30),
                )
                .await?
            {
                ControlReply::Jobs(r) => r,
                ControlReply::Denied(why) => return Err(JobsError::Denied(why)),
                other => return Err(JobsError::Unexpected(format!("{other:?}"))),
            }
        };
        match reply {
            JobsReply::NotServed => Err(JobsError::NotServed),
            JobsReply::Invalid(why) => Err(JobsError::Invalid(why)),
            r => Ok(r),
        }
    }

    /// Submits a detached job; its id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("submit_job")?;
    /// use flotilla::jobs::JobSpec;
    /// use flotilla::node::doc_example::{COUNTER, Count, Counter, CounterMsg};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start_shared()
    ///     .await?;
    /// let _jobs = node.serve_jobs()?.expect("a head serves jobs");
    /// // A counter run as a job, in a bundle of half a CPU.
    /// let spec = JobSpec {
    ///     kind: COUNTER.name().into(),
    ///     args: flotilla::wire::encode(&Count(0)),
    ///     message_type: std::any::type_name::<CounterMsg>().into(),
    ///     resources: [("cpu".to_owned(), 0.5)].into_iter().collect(),
    ///     description: "a counter as a job".into(),
    ///     max_restarts: 3,
    /// };
    /// let id = node.submit_job(spec).await?;
    /// assert!(id.starts_with("job-"));
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn submit_job(&self, spec: JobSpec) -> Result<JobId, JobsError> {
        match self.jobs_request(JobsRequest::Submit(spec)).await? {
            JobsReply::Submitted(id) => Ok(id),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Every job the head knows, oldest first.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("jobs")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start_shared()
    ///     .await?;
    /// let _jobs = node.serve_jobs()?.expect("a head serves jobs");
    /// let spec = flotilla::node::doc_example::counter_job();
    /// let first = node.submit_job(spec.clone()).await?;
    /// let second = node.submit_job(spec).await?;
    /// let ids: Vec<flotilla::jobs::JobId> = node.jobs().await?.into_iter().map(|j| j.id).collect();
    /// assert_eq!(ids, [first, second]);
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn jobs(&self) -> Result<Vec<JobView>, JobsError> {
        match self.jobs_request(JobsRequest::List).await? {
            JobsReply::Jobs(j) => Ok(j),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The accounts of the jobs the head knows, from the `from`-th (oldest
    /// first), at most `limit` of them: what `/metrics` and the dashboard
    /// show of each.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("job-metrics")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start_shared()
    ///     .await?;
    /// let _jobs = node.serve_jobs()?.expect("a head serves jobs");
    /// let id = node.submit_job(flotilla::node::doc_example::counter_job()).await?;
    /// let accounts = node.job_metrics(0, 100).await?;
    /// assert_eq!(accounts.len(), 1);
    /// assert_eq!(accounts[0].id, id);
    /// assert!(node.job_metrics(1, 100).await?.is_empty());
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn job_metrics(&self, from: u32, limit: u32) -> Result<Vec<JobMetrics>, JobsError> {
        match self
            .jobs_request(JobsRequest::Metrics { from, limit })
            .await?
        {
            JobsReply::Metrics(m) => Ok(m),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// One job, if the head knows it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("job")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start_shared()
    ///     .await?;
    /// let _jobs = node.serve_jobs()?.expect("a head serves jobs");
    /// let spec = flotilla::node::doc_example::counter_job();
    /// let id = node.submit_job(spec).await?;
    /// let job = node.job(&id).await?.expect("known");
    /// assert_eq!(job.description, "a counter as a job");
    /// assert!(node.job(&flotilla::jobs::JobId::from("job-none")).await?.is_none());
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn job(&self, id: &JobId) -> Result<Option<JobView>, JobsError> {
        match self.jobs_request(JobsRequest::Get(id.into())).await? {
            JobsReply::Job(j) => Ok(j.map(|j| *j)),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Stops a job (it ends failed, "stopped"); false if unknown or over.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("stop_job")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start_shared()
    ///     .await?;
    /// let _jobs = node.serve_jobs()?.expect("a head serves jobs");
    /// let spec = flotilla::node::doc_example::counter_job();
    /// use flotilla::jobs::JobState;
    /// let id = node.submit_job(spec).await?;
    /// assert!(node.stop_job(&id).await?);
    /// assert_eq!(node.job(&id).await?.map(|j| j.state), Some(JobState::Failed));
    /// assert!(!node.stop_job(&id).await?, "over already");
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn stop_job(&self, id: &JobId) -> Result<bool, JobsError> {
        match self.jobs_request(JobsRequest::Stop(id.into())).await? {
            JobsReply::Stopped(b) => Ok(b),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }
}

impl Service {
    async fn run(
        mut self,
        stored: Vec<StoredJob>,
        mut rx: mpsc::UnboundedReceiver<Command>,
        stop: CancellationToken,
    ) {
        self.take_back(stored).await;
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Command::Request(caller, r, reply)) => {
                        let answer = self.request(caller.as_ref(), r).await;
                        let _ = reply.send(answer);
                    }
                    Some(Command::Event(id, e)) => self.event(&id, e).await,
                    Some(Command::Progress(id, p)) => self.progress(&id, *p).await,
                    None => return,
                },
                _ = poll.tick() => {
                    self.forget_expired(std::time::Instant::now());
                    self.poll();
                }
                () = stop.cancelled() => {
                    for e in self.jobs.values_mut() {
                        if let Some(s) = e.supervisor.take() {
                            let _ = crate::remote::call::call(&s, SupervisorMsg::Shutdown, Duration::from_secs(10)).await;
                            s.stop(None);
                        }
                    }
                    return;
                }
            }
        }
    }

    fn find(&mut self, id: &JobId) -> Option<&mut Entry> {
        self.jobs.values_mut().find(|e| e.record.id == *id)
    }

    /// Writes the job at `key` to the store, if there is one.
    fn save(&mut self, key: u64) -> Result<(), HeadStoreError> {
        let (Some(store), Some(e)) = (&self.store, self.jobs.get_mut(&key)) else {
            return Ok(());
        };
        e.saved_at = Some(std::time::Instant::now());
        let ended_unix_ms = e.ended_at.map(|at| {
            let ago = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
            clock_millis().saturating_sub(ago)
        });
        store.put_job(&StoredJob {
            seq: key,
            spec: e.spec.clone(),
            view: (*e.record).clone(),
            group: e.group.clone(),
            ended_unix_ms,
        })
    }

    /// [`Service::save`], a failure logged: the change is made, and lost
    /// only if the head restarts before a later write.
    fn save_logged(&mut self, key: u64) {
        if let Err(e) = self.save(key) {
            let id = self.jobs.get(&key).map(|e| e.record.id.clone());
            tracing::error!(job = ?id, error = %e, "cannot record the job's change");
        }
    }

    /// [`Service::save_logged`] of the job `id`.
    fn save_id(&mut self, id: &JobId) {
        if let Some((&key, _)) = self.jobs.iter().find(|(_, e)| e.record.id == *id) {
            self.save_logged(key);
        }
    }

    /// Takes back the jobs a store held: those that ended are listed (and
    /// kept for what is left of their retention), the others are started
    /// again in a bundle of their own; the bundles they held before are
    /// released once their nodes report them.
    async fn take_back(&mut self, stored: Vec<StoredJob>) {
        let now_ms = clock_millis();
        for job in stored {
            self.next = self.next.max(job.seq + 1);
            let mut entry = Entry {
                record: JobRecord::restored(job.view),
                spec: job.spec,
                actor: String::new(),
                group: None,
                supervisor: None,
                placed: None,
                ended_at: None,
                saved_at: None,
                stats: JobStats::default(),
                taken_at: std::time::Instant::now(),
                progressed_at: None,
                samples: Default::default(),
                log: Default::default(),
            };
            if entry.record.state.is_end() {
                let ago = job
                    .ended_unix_ms
                    .map(|ms| Duration::from_millis(now_ms.saturating_sub(ms)))
                    .unwrap_or_default();
                let now = std::time::Instant::now();
                entry.ended_at = Some(now.checked_sub(ago).unwrap_or(now));
                self.jobs.insert(job.seq, entry);
                continue;
            }
            if let Some(old) = job.group {
                self.release_former(&old).await;
            }
            entry.record.exited(true);
            match self.launch(job.seq, &entry.record.id, &entry.spec).await {
                Ok((actor, group, supervisor)) => {
                    tracing::info!(job = %entry.record.id, %group, "job started again after the head's restart");
                    entry.actor = actor;
                    entry.group = Some(group);
                    entry.supervisor = Some(supervisor);
                }
                Err(why) => {
                    entry.record.failed(format!(
                        "cannot start it again after the head's restart: {why}"
                    ));
                    entry.ended_at = Some(std::time::Instant::now());
                }
            }
            self.jobs.insert(job.seq, entry);
            self.save_logged(job.seq);
        }
    }

    /// Releases the bundle a job held before the head restarted (its group
    /// came back from the store; the node holding the bundle is told when
    /// it reports it).
    async fn release_former(&self, group: &GroupId) {
        match self.node.remove_group(group).await {
            Ok(true) => {
                tracing::info!(%group, "released the bundle a job held before the head's restart")
            }
            Ok(false) => {
                tracing::warn!(%group, "the group a job held before the head's restart is not known")
            }
            Err(e) => {
                tracing::warn!(%group, error = %e, "cannot release the bundle a job held before the head's restart")
            }
        }
    }

    async fn view(&self, e: &Entry) -> JobView {
        let group = match &e.group {
            Some(g) => self.node.group(g).await.ok().flatten(),
            None => None,
        };
        let mut work = Vec::new();
        for g in &e.record.work_groups {
            if let Ok(Some(v)) = self.node.group(g).await {
                work.push(v);
            }
        }
        e.record.view(group, work)
    }

    async fn request(&mut self, caller: Option<&Caller>, r: JobsRequest) -> Answer {
        let sender = sender_of(caller);
        Ok(match r {
            JobsRequest::Submit(spec) => {
                authority::may_submit_job(sender)?;
                let owner = caller.map(|c| principal_of(&c.member).to_owned());
                self.submit(spec, owner).await
            }
            JobsRequest::List => {
                authority::may_read(sender)?;
                let mut out = Vec::new();
                for e in self.jobs.values() {
                    out.push(self.view(e).await);
                }
                JobsReply::Jobs(out)
            }
            JobsRequest::Get(id) => {
                authority::may_read(sender)?;
                let e = self.jobs.values().find(|e| e.record.id == *id);
                match e {
                    Some(e) => JobsReply::Job(Some(Box::new(self.view(e).await))),
                    None => JobsReply::Job(None),
                }
            }
            JobsRequest::Metrics { from, limit } => {
                authority::may_read(sender)?;
                let (now, table) = (std::time::Instant::now(), self.node.members());
                let out = self
                    .jobs
                    .values()
                    .skip(from as usize)
                    .take(limit as usize)
                    .map(|e| e.metrics(now, &table))
                    .collect();
                JobsReply::Metrics(out)
            }
            JobsRequest::Logs { id, after } => {
                let Some(e) = self.jobs.values().find(|e| e.record.id == id) else {
                    authority::may_read(sender)?;
                    return Ok(JobsReply::Logs(None));
                };
                authority::may_read_job_log(sender, e.record.owner.as_deref())?;
                JobsReply::Logs(Some(e.log_page(after)))
            }
            JobsRequest::Account(id) => {
                authority::may_read(sender)?;
                let (now, table) = (std::time::Instant::now(), self.node.members());
                let e = self.jobs.values().find(|e| e.record.id == id);
                JobsReply::Account(e.map(|e| Box::new(e.account(now, &table))))
            }
            JobsRequest::Stop(id) => {
                let Some(e) = self.find(&id) else {
                    return Ok(JobsReply::Stopped(false));
                };
                authority::may_stop_job(sender, e.record.owner.as_deref())?;
                if e.record.state.is_end() {
                    return Ok(JobsReply::Stopped(false));
                }
                e.record.failed("stopped by request");
                self.finish(&id).await;
                JobsReply::Stopped(true)
            }
        })
    }

    async fn submit(&mut self, spec: JobSpec, owner: Option<String>) -> JobsReply {
        if let Err(why) = spec.check() {
            return JobsReply::Invalid(why);
        }
        if let Some(owner) = &owner {
            let running = self
                .jobs
                .values()
                .filter(|e| e.record.owner.as_ref() == Some(owner) && !e.record.state.is_end())
                .count();
            if running >= flotilla_proto::jobs::MAX_RUNNING_PER_PRINCIPAL {
                crate::counters::principal_capped("jobs");
                return JobsReply::Invalid(format!(
                    "NODE-JOB-011: {owner} has {running} jobs running, the most one certificate may have at once ({}); wait for one to end or stop one",
                    flotilla_proto::jobs::MAX_RUNNING_PER_PRINCIPAL
                ));
            }
        }
        let n = self.next;
        self.next += 1;
        let id = JobId::new(format!("job-{:x}-{n}", self.node.incarnation()));
        let (actor, group, supervisor) = match self.launch(n, &id, &spec).await {
            Ok(started) => started,
            Err(why) => return JobsReply::Invalid(why),
        };
        tracing::info!(job = %id, kind = %spec.kind, %group, "job submitted");
        self.jobs.insert(
            n,
            Entry {
                record: JobRecord::new(id.clone(), spec.description.clone(), owner),
                spec,
                actor,
                group: Some(group),
                supervisor: Some(supervisor),
                placed: None,
                ended_at: None,
                saved_at: None,
                stats: JobStats::default(),
                taken_at: std::time::Instant::now(),
                progressed_at: None,
                samples: Default::default(),
                log: Default::default(),
            },
        );
        // Recorded before it is acknowledged: a job the head cannot keep
        // is not taken.
        if let Err(e) = self.save(n) {
            if let Some(entry) = self.jobs.get_mut(&n) {
                entry.record.failed(format!("not recorded: {e}"));
            }
            self.finish(&id).await;
            self.jobs.remove(&n);
            return JobsReply::Invalid(format!("the head cannot record the job: {e}"));
        }
        JobsReply::Submitted(id)
    }

    /// Starts job `id` (its place `n`): a detached group of one bundle and
    /// a supervisor that runs its actor there. Its actor's name, group and
    /// supervisor.
    async fn launch(
        &self,
        n: u64,
        id: &JobId,
        spec: &JobSpec,
    ) -> Result<(String, GroupId, ActorRef<SupervisorMsg>), String> {
        let actor = format!("{id}.{:016x}", crate::nonce::nonce());
        let group = GroupSpec::new(Strategy::Pack, vec![spec.resources.clone()])
            .with_timeout(Duration::from_secs(24 * 3600))
            .detached();
        let group = self
            .node
            .create_group(group)
            .await
            .map_err(|e| e.to_string())?;
        let child = RemoteChild::raw(
            Arc::clone(&self.node),
            SpawnOrder {
                kind: spec.kind.clone(),
                name: actor.clone(),
                args: spec.args.clone(),
                message_type: spec.message_type.clone(),
                epoch: flotilla_proto::epoch::Epoch::NONE,
            },
            |_: &crate::Table| None,
            START_WITHIN,
        )
        .in_bundle(group.clone(), 0);
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let args = SupervisorArgs {
            spec: SupervisorSpec {
                strategy: flotilla_proto::supervision::Strategy::OneForOne,
                intensity: Intensity {
                    max_restarts: spec.max_restarts,
                    within: Duration::from_secs(60),
                },
                per_child: false,
                backoff: Backoff::default(),
            },
            children: vec![Child::new(
                ChildSpec {
                    id: id.to_string(),
                    restart: RestartType::Transient,
                    shutdown: Duration::from_secs(10),
                },
                child,
            )],
            events: Some(events),
            members: Some(self.node.watch_members()),
            seed: n,
            report: Some((format!("job {id}"), self.node.board())),
        };
        let supervisor = match Actor::spawn(None, Supervisor, args).await {
            Ok((s, _)) => s,
            Err(e) => {
                let _ = self.node.remove_group(&group).await;
                return Err(format!("cannot start its supervisor: {e}"));
            }
        };
        let tx = self.tx.clone();
        let job = id.clone();
        tokio::spawn(async move {
            while let Some(e) = events_rx.recv().await {
                if tx.send(Command::Event(job.clone(), e)).is_err() {
                    return;
                }
            }
        });
        Ok((actor, group, supervisor))
    }

    async fn event(&mut self, id: &JobId, e: SupervisorEvent) {
        let Some(entry) = self.find(id) else { return };
        match e {
            SupervisorEvent::Started {
                running, restarts, ..
            } => {
                let on = running
                    .node
                    .as_ref()
                    .map(|n| n.name.clone())
                    .unwrap_or_default();
                tracing::info!(job = %id, node = %on, restarts, "job actor started");
                entry.record.started(&on, restarts);
                entry.placed = running.node;
            }
            SupervisorEvent::Exited { restarting, .. } => entry.record.exited(restarting),
            SupervisorEvent::Escalated(e) => {
                entry.record.failed(format!("its supervisor gave up: {e}"));
                // `finish` writes the end.
                self.finish(id).await;
                return;
            }
        }
        self.save_id(id);
    }

    async fn progress(&mut self, id: &JobId, mut p: JobProgress) {
        let Some((&key, entry)) = self.jobs.iter_mut().find(|(_, e)| e.record.id == *id) else {
            return;
        };
        let before = entry.record.clone();
        if !entry.record.state.is_end() {
            entry.stats = std::mem::take(&mut p.stats);
            entry.sample(std::time::Instant::now());
            entry.keep_log(std::mem::take(&mut p.log));
        }
        let ended = entry.record.progress(p);
        if entry.record.done > before.done {
            entry.progressed_at = Some(std::time::Instant::now());
        }
        if ended {
            tracing::info!(job = %id, state = entry.record.state.as_str(), "job ended");
            // `finish` writes the end.
            self.finish(id).await;
            return;
        }
        // A change of state or of the groups its work runs in is written at
        // once; texts done at most every SAVE_PROGRESS_EVERY.
        let after = &entry.record;
        let changed = after.state != before.state || after.work_groups != before.work_groups;
        let due = *after != before
            && entry
                .saved_at
                .is_none_or(|at| at.elapsed() >= SAVE_PROGRESS_EVERY);
        if changed || due {
            self.save_logged(key);
        }
    }

    /// Forgets the ended jobs that `retention` no longer keeps.
    fn forget_expired(&mut self, now: std::time::Instant) {
        let ended: Vec<(u64, std::time::Instant)> = self
            .jobs
            .iter()
            .filter_map(|(k, e)| e.ended_at.map(|at| (*k, at)))
            .collect();
        for key in self.retention.expired(now, &ended) {
            if let Some(e) = self.jobs.remove(&key) {
                tracing::info!(job = %e.record.id, "ended job forgotten");
                if let Some(store) = &self.store
                    && let Err(err) = store.remove_job(key)
                {
                    tracing::error!(job = %e.record.id, error = %err, "cannot forget the job on disk");
                }
            }
        }
    }

    /// Stops an ended job's actor and releases its bundle.
    async fn finish(&mut self, id: &JobId) {
        let Some(entry) = self.find(id) else { return };
        entry.ended_at.get_or_insert_with(std::time::Instant::now);
        let (supervisor, group) = (entry.supervisor.take(), entry.group.clone());
        let left = entry.placed.take().map(|on| (on, entry.actor.clone()));
        if let Some(s) = supervisor {
            let _ = crate::remote::call::call(&s, SupervisorMsg::Shutdown, Duration::from_secs(15))
                .await;
            s.stop(None);
        }
        if let Some((on, actor)) = left {
            stop_left_copy(Arc::clone(&self.node), on, actor, id.clone());
        }
        if let Some(g) = group {
            match self.node.remove_group(&g).await {
                Ok(_) => {
                    if let Some(entry) = self.find(id) {
                        entry.group = None;
                    }
                }
                Err(e) => {
                    tracing::warn!(job = %id, group = %g, error = %e, "cannot release a job's bundle")
                }
            }
        }
        self.save_id(id);
    }

    /// Asks every running job where it is, on the node its actor was
    /// started on.
    fn poll(&self) {
        for e in self.jobs.values() {
            if e.record.state != JobState::Running {
                continue;
            }
            let Some(on) = e.record.node.clone() else {
                continue;
            };
            let (node, tx, id) = (Arc::clone(&self.node), self.tx.clone(), e.record.id.clone());
            let name = e.actor.clone();
            tokio::spawn(async move {
                let Ok(actor) = node.lookup_on::<JobMsg>(&on, &name) else {
                    return;
                };
                let asked = crate::remote::call::call(
                    &actor,
                    |port| JobMsg::Progress(ProgressAsk, port),
                    Duration::from_secs(2),
                )
                .await;
                if let Ok(JobReport(p)) = asked {
                    let _ = tx.send(Command::Progress(id, Box::new(p)));
                }
            });
        }
    }
}
/// Makes sure the actor of ended job `job` is not left running as
/// `actor` on `on`: a supervisor that gave up after losing its link to that
/// node stops nothing there, and the node may run the actor on, writing
/// for a job marked ended. Asked until the node has stopped it or hosts no
/// such actor, or that incarnation of the node has ended (its spawner then
/// stops what it hosted for others); given up after [`LEFT_COPY_WITHIN`].
fn stop_left_copy(node: Arc<Node>, on: MemberRef, actor: String, job: JobId) {
    // On the node's tasks: a head that shuts down stops asking.
    let tasks = node.tasks.clone();
    tasks.spawn(async move {
        let deadline = tokio::time::Instant::now() + LEFT_COPY_WITHIN;
        loop {
            let ended = node
                .members()
                .get(&on.name)
                .is_none_or(|m| m.incarnation != on.incarnation || !m.state.is_live());
            if ended {
                return;
            }
            match node.stop_on(&on.name, &actor, LEFT_COPY_EVERY * 5).await {
                Ok(()) => {
                    tracing::warn!(%job, node = %on.name, "stopped the actor of an ended job, still running on its node");
                    return;
                }
                Err(StopError::Refused {
                    outcome: StopOutcome::NoSuchActor,
                    ..
                }) => return,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::error!(%job, node = %on.name, error = %e, "cannot stop the actor of an ended job; it may still run there");
                    return;
                }
                Err(e) => {
                    tracing::debug!(%job, node = %on.name, error = %e, "the actor of an ended job: asking its node again");
                    tokio::time::sleep(LEFT_COPY_EVERY).await;
                }
            }
        }
    });
}
