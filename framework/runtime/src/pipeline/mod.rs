//! # Room `pipeline/`: bounded batch work over actors
//!
//! Owns bounded batch work over actors (this file). Drives
//! [`flotilla_proto::window`].
//!
//! May import: `net` (the outbound lane) and the shared files.
//!
//! A bounded batch pipeline over actors: the `ray.wait` loop with the
//! bookkeeping done once, for any app.
//!
//! ```text
//! submit(id, batch) ─► Window (≤ M in flight, ≤ memory budget, least loaded)
//!      ─► call(worker) ─► Stage::judge ─► Event::Done | Rejected | GaveUp
//!                 ▲             │ Retry / deadline / worker lost
//!                 └─────────────┘ (bounded attempts, another worker)
//! ```
//!
//! The caller owns the input and output: it submits batches with stable ids
//! while [`Pipeline::has_credit`] holds and consumes [`Event`]s in completion
//! order with [`Pipeline::next`]. Workers are any actors, local or remote;
//! [`Pipeline::remove_node`] moves a lost node's batches elsewhere. The
//! policy (credits, routing, deadlines, attempts) is the sans-IO
//! [`flotilla_proto::window::Window`]; this module is its async shell.
//!
//! Sends go through the node's [`Outbound`] (backpressure, the bulk lane
//! for large batches). Each send has one deadline, the window's, on tokio's
//! clock: a send the window gives up on is dropped, its answer with it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

pub use flotilla_proto::window::Hedging;
use flotilla_proto::window::{Abandoned, Dispatch, Outcome, Window, WindowConfig};
use futures::StreamExt;
use futures::future::{AbortHandle, Abortable, BoxFuture, FutureExt};
use futures::stream::FuturesUnordered;
use ractor::{ActorRef, Message};

/// The reply port of a worker call, as ractor defines it.
pub use ractor::RpcReplyPort;
use tokio::sync::oneshot;

use crate::clock::{now, sleep_until};
use crate::net::outbound::Outbound;

pub use flotilla_proto::window::BatchId;

/// What a worker's answer means for its batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<T> {
    /// The batch is done; `T` is its result.
    Done(T),
    /// The batch's input is bad: record it, do not retry.
    BadInput(String),
    /// The answer is unusable (wrong batch id, wrong model, a worker
    /// error): send the batch again, to another worker if there is one.
    Retry(String),
}

/// How one kind of batch is sent to a worker and how its answer is judged.
pub trait Stage {
    /// The workers' message type.
    type Msg: Message;
    /// A batch's input, held by the pipeline while it is in flight.
    type Batch;
    /// The workers' answer.
    type Reply: Send + 'static;
    /// What a completed batch yields.
    type Output;

    /// The message asking a worker to process `batch`, answered on `reply`.
    fn request(
        &self,
        id: BatchId,
        batch: &Self::Batch,
        reply: RpcReplyPort<Self::Reply>,
    ) -> Self::Msg;

    /// Checks an answer to `batch`.
    fn judge(&self, id: BatchId, batch: &Self::Batch, reply: Self::Reply) -> Verdict<Self::Output>;

    /// Bytes `batch` holds while in flight, for the memory budget.
    fn weight(&self, _batch: &Self::Batch) -> usize {
        0
    }
}

/// Limits of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Batches in flight at most.
    pub max_in_flight: usize,
    /// Bytes of batches in flight at most (per [`Stage::weight`]); a batch
    /// is always allowed when none is in flight.
    pub memory_budget: usize,
    /// A batch not answered within this is sent elsewhere.
    pub deadline: Duration,
    /// Sends of one batch before the pipeline gives up on it.
    pub max_attempts: u32,
    /// How long a failed batch waits before it is sent again (doubled for
    /// each further attempt, at most `deadline`).
    pub retry_backoff: Duration,
    /// Whether and when a straggling batch is sent a second time, to an
    /// idle worker (the first answer wins).
    pub hedge: Option<Hedging>,
}

impl PipelineConfig {
    /// Two batches per worker, a 512 MiB budget, `deadline`, three attempts
    /// 250 ms and 500 ms apart, stragglers sent again past three times the
    /// p95 and two seconds.
    pub fn for_workers(workers: usize, deadline: Duration) -> Self {
        Self {
            max_in_flight: (2 * workers).max(1),
            memory_budget: 512 << 20,
            deadline,
            max_attempts: 3,
            retry_backoff: Duration::from_millis(250),
            hedge: Some(Hedging::default()),
        }
    }
}

/// A worker's handle within one pipeline.
pub type WorkerKey = u32;

/// Which send of a batch completed it: what [`Pipeline::unusable`] needs
/// to count a result found unusable afterwards against the batch's
/// attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    attempt: u32,
    worker: WorkerKey,
}

impl Receipt {
    /// The send's number (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The worker that answered.
    pub fn worker(&self) -> WorkerKey {
        self.worker
    }
}

/// What became of a batch.
#[derive(Debug)]
pub enum Event<B, T> {
    /// Done: its input, its result, and how long the successful call took.
    Done {
        /// The batch id.
        id: BatchId,
        /// Its input.
        batch: B,
        /// Its result.
        output: T,
        /// Duration of the call that succeeded.
        latency: Duration,
        /// Which send completed it (for [`Pipeline::unusable`]).
        receipt: Receipt,
    },
    /// Its input was refused; not retried.
    Rejected {
        /// The batch id.
        id: BatchId,
        /// Its input.
        batch: B,
        /// Why.
        reason: String,
    },
    /// It failed on every attempt.
    GaveUp {
        /// The batch id.
        id: BatchId,
        /// Its input.
        batch: B,
    },
}

/// Why the pipeline cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// Batches wait but no worker is left.
    #[error("{0} batches wait but no worker is left")]
    NoWorkers(usize),
}

/// Counters of a pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Sends after the first one of a batch (failures, deadlines, lost workers).
    pub retries: u64,
    /// Batches moved off a worker that was lost.
    pub redispatches: u64,
    /// Answers that came after their batch had moved on.
    pub stale: u64,
    /// Second sends of straggling batches.
    pub hedged: u64,
    /// Sends whose deadline passed unanswered.
    pub deadlines: u64,
    /// Sends answered with a failure, or with a result found unusable.
    pub failures: u64,
    /// Sends lost with their worker (it dropped them unanswered, or they
    /// never left).
    pub lost: u64,
}

struct Worker<M: Message> {
    actor: ActorRef<M>,
    node: String,
}

struct Flight<B> {
    batch: B,
    weight: usize,
}

/// What one send of a batch came to.
struct Answer<R> {
    /// The send it answers: worker, batch and attempt.
    to: Dispatch<WorkerKey>,
    result: Result<R, String>,
    latency: Duration,
}

/// A send in flight: its answer, or `None` once aborted.
type PendingSend<R> = BoxFuture<'static, Option<Answer<R>>>;

/// A bounded pipeline of batches over worker actors.
pub struct Pipeline<S: Stage> {
    stage: S,
    config: PipelineConfig,
    window: Window<WorkerKey>,
    workers: BTreeMap<WorkerKey, Worker<S::Msg>>,
    next_key: WorkerKey,
    flights: HashMap<BatchId, Flight<S::Batch>>,
    held: usize,
    backlog: VecDeque<BatchId>,
    gave_up: VecDeque<BatchId>,
    outbound: Outbound,
    sends: FuturesUnordered<PendingSend<S::Reply>>,
    /// How to drop each send in flight, by batch and attempt.
    aborts: HashMap<(BatchId, u32), AbortHandle>,
    /// Events of answers taken in early (see [`Pipeline::crashed`]),
    /// reported first by [`Pipeline::next`].
    ready: VecDeque<Event<S::Batch, S::Output>>,
    stats: PipelineStats,
}

impl<S: Stage> Pipeline<S> {
    /// A pipeline with no workers yet, sending through `outbound` (a
    /// node's, or [`Outbound::local`] for local workers only).
    pub fn new(stage: S, config: PipelineConfig, outbound: Outbound) -> Self {
        Self {
            stage,
            window: Window::new(WindowConfig {
                max_in_flight: config.max_in_flight.max(1),
                deadline: config.deadline,
                max_attempts: config.max_attempts.max(1),
                retry_backoff: config.retry_backoff,
                hedge: config.hedge,
            }),
            config,
            workers: BTreeMap::new(),
            next_key: 0,
            flights: HashMap::new(),
            held: 0,
            backlog: VecDeque::new(),
            gave_up: VecDeque::new(),
            outbound,
            sends: FuturesUnordered::new(),
            aborts: HashMap::new(),
            ready: VecDeque::new(),
            stats: PipelineStats::default(),
        }
    }

    /// Adds a worker running on `node`.
    pub fn add_worker(&mut self, node: &str, actor: ActorRef<S::Msg>) -> WorkerKey {
        let key = self.next_key;
        self.next_key += 1;
        self.workers.insert(
            key,
            Worker {
                actor,
                node: node.to_owned(),
            },
        );
        self.window.add_worker(key);
        key
    }

    /// Workers in the pipeline.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Workers with no send in flight, in the order they were added.
    pub fn idle_workers(&self) -> Vec<WorkerKey> {
        self.workers
            .keys()
            .filter(|k| self.window.load_of(k) == Some(0))
            .copied()
            .collect()
    }

    /// Nodes with a worker in the pipeline (a node once per worker).
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.workers.values().map(|w| w.node.as_str())
    }

    /// Removes the worker `key` (its actor exited): its batches in flight
    /// are sent to the others. Returns whether it was there.
    pub fn remove_worker(&mut self, key: WorkerKey) -> bool {
        if self.workers.remove(&key).is_none() {
            return false;
        }
        self.stats.redispatches += self.window.load_of(&key).unwrap_or(0) as u64;
        self.window.remove_worker(&key);
        self.drop_stale_sends();
        true
    }

    /// Removes every worker on `node` (down or gone): their batches in
    /// flight are sent to the others. Returns how many workers went.
    pub fn remove_node(&mut self, node: &str) -> usize {
        let gone: Vec<WorkerKey> = self
            .workers
            .iter()
            .filter(|(_, w)| w.node == node)
            .map(|(k, _)| *k)
            .collect();
        for key in &gone {
            let lost = self.window.load_of(key).unwrap_or(0) as u64;
            self.stats.redispatches += lost;
            self.window.remove_worker(key);
            self.workers.remove(key);
        }
        self.drop_stale_sends();
        gone.len()
    }

    /// Sets the most batches in flight at once (see
    /// [`flotilla_proto::window::Window::set_max_in_flight`]): a pool that
    /// grows raises it by its share per worker.
    pub fn set_max_in_flight(&mut self, max: usize) {
        self.window.set_max_in_flight(max);
    }

    /// The most batches in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.window.max_in_flight()
    }

    /// Whether a new batch may be submitted now: a credit and a worker are
    /// free, no retry waits, and the batches held are under the budget.
    pub fn has_credit(&self) -> bool {
        self.backlog.is_empty()
            && self.window.has_credit()
            && (self.held < self.config.memory_budget || self.flights.is_empty())
    }

    /// Batches in flight or waiting for a retry.
    pub fn in_flight(&self) -> usize {
        self.flights.len()
    }

    /// Whether no batch is in flight or waiting.
    pub fn is_idle(&self) -> bool {
        self.flights.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> PipelineStats {
        self.stats
    }

    /// A batch the pipeline reported done whose result its caller then
    /// found unusable (a result object it could not read): that send
    /// failed after all. The batch is taken back and sent again after its
    /// backoff, to another worker when there is one, within the attempts it
    /// had left; past them it comes back as [`Event::GaveUp`]. So a result
    /// that can never be used is not asked for without end.
    pub fn unusable(&mut self, id: BatchId, batch: S::Batch, receipt: Receipt) {
        self.stats.failures += 1;
        self.hold(id, batch);
        self.window.redo(now(), id, receipt.attempt, receipt.worker);
        self.pump();
    }

    /// Takes a new batch and sends it as soon as a credit is free (at once
    /// while [`Pipeline::has_credit`] holds). Ids must be unique among the
    /// batches not yet reported (a batch reported done goes back through
    /// [`Pipeline::unusable`], not here).
    pub fn submit(&mut self, id: BatchId, batch: S::Batch) {
        self.hold(id, batch);
        self.backlog.push_back(id);
        self.pump();
    }

    /// [`Pipeline::submit`], allowing the batch `max_attempts` sends (at
    /// most the configured ones): the pieces of a batch split to find a
    /// row that fails it are given one or two.
    pub fn submit_limited(&mut self, id: BatchId, batch: S::Batch, max_attempts: u32) {
        self.window.limit(id, max_attempts);
        self.submit(id, batch);
    }

    /// The worker `key` crashed (its actor failed while its node stays
    /// up): the batch it was most likely working on, its oldest send
    /// not answered, is charged a failed attempt (see
    /// [`Window::charge_crash`]), so a batch that crashes every worker is
    /// given up rather than crashing them on. Call it before
    /// [`Pipeline::remove_worker`]. Answers already back are taken in
    /// first (their events come from [`Pipeline::next`] in turn): a batch
    /// the worker answered before it crashed is not the one it crashed
    /// on. Returns the batch charged.
    pub fn crashed(&mut self, key: WorkerKey) -> Option<BatchId> {
        while let Some(Some(answer)) = self.sends.next().now_or_never() {
            if let Some(answer) = answer
                && let Some(event) = self.on_answer(answer)
            {
                self.ready.push_back(event);
            }
        }
        let batch = self.window.charge_crash(now(), &key)?;
        self.drop_stale_sends();
        tracing::warn!(
            batch = batch.0,
            "a worker crashed holding this batch; charged an attempt"
        );
        Some(batch)
    }

    /// The node the worker `key` runs on, while it is in the pipeline.
    pub fn node_of(&self, key: WorkerKey) -> Option<&str> {
        self.workers.get(&key).map(|w| w.node.as_str())
    }

    /// Holds `batch` until it is reported, counting its weight.
    fn hold(&mut self, id: BatchId, batch: S::Batch) {
        let weight = self.stage.weight(&batch);
        self.held += weight;
        self.flights.insert(id, Flight { batch, weight });
    }

    fn send(&mut self, d: Dispatch<WorkerKey>) {
        if d.attempt > 1 {
            self.stats.retries += 1;
        }
        self.dispatch(d);
    }

    fn dispatch(&mut self, d: Dispatch<WorkerKey>) {
        // The window dispatches only known batches to known workers.
        let (worker, flight) = (
            self.workers
                .get(&d.worker)
                .expect("window and workers agree"),
            self.flights
                .get(&d.batch)
                .expect("window and flights agree"),
        );
        let (port_tx, port_rx) = oneshot::channel();
        // The port's timeout only lets ractor_cluster forget a remote reply
        // it will never get; the window's deadline is the one acted on.
        let port: RpcReplyPort<S::Reply> = (port_tx, self.config.deadline).into();
        let msg = self.stage.request(d.batch, &flight.batch, port);
        let (actor, outbound, to) = (worker.actor.clone(), self.outbound.clone(), d.clone());
        let send = async move {
            let started = tokio::time::Instant::now();
            let result = match outbound.cast(&actor, msg).await {
                Err(e) => Err(e.to_string()),
                Ok(()) => port_rx
                    .await
                    .map_err(|_| "the worker dropped the request".to_owned()),
            };
            Answer {
                to,
                result,
                latency: started.elapsed(),
            }
        };
        let (handle, registration) = AbortHandle::new_pair();
        self.aborts.insert((d.batch, d.attempt), handle);
        self.sends.push(Box::pin(async move {
            Abortable::new(send, registration).await.ok()
        }));
    }

    /// Drops the sends the window no longer waits for (deadline passed,
    /// worker lost, failed and sent again).
    fn drop_stale_sends(&mut self) {
        let window = &self.window;
        self.aborts.retain(|(batch, attempt), handle| {
            let live = window.is_live_attempt(*batch, *attempt);
            if !live {
                handle.abort();
            }
            live
        });
    }

    /// Sends retries first, then submitted batches, while credits last.
    fn pump(&mut self) {
        let now = now();
        while let Some(d) = self.window.poll_retry(now) {
            self.send(d);
        }
        while let Some(&id) = self.backlog.front() {
            match self.window.dispatch_new(now, id) {
                Ok(d) => {
                    self.backlog.pop_front();
                    self.send(d);
                }
                Err(_) => break,
            }
        }
        // Workers left idle take second sends of stragglers.
        while let Some(d) = self.window.poll_hedge(now) {
            self.stats.hedged += 1;
            tracing::info!(
                batch = d.batch.0,
                "batch straggling; sent a second time to an idle worker"
            );
            self.dispatch(d);
        }
    }

    fn finish(&mut self, id: BatchId) -> Option<S::Batch> {
        let flight = self.flights.remove(&id)?;
        self.held -= flight.weight;
        Some(flight.batch)
    }

    /// Waits for the next batch to finish one way or another. Returns
    /// `Ok(None)` when nothing is in flight. Cancel-safe: use it in
    /// `select!` beside other events (membership changes).
    pub async fn next(&mut self) -> Result<Option<Event<S::Batch, S::Output>>, PipelineError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            for a in self.window.take_abandoned() {
                // Rejections are reported where they are judged.
                if let Abandoned::GaveUp(id) = a {
                    self.gave_up.push_back(id);
                }
            }
            if let Some(id) = self.gave_up.pop_front() {
                if let Some(batch) = self.finish(id) {
                    return Ok(Some(Event::GaveUp { id, batch }));
                }
                continue;
            }
            self.pump();
            if self.flights.is_empty() {
                return Ok(None);
            }
            if self.workers.is_empty() {
                return Err(PipelineError::NoWorkers(self.flights.len()));
            }
            // Nothing due: look again in a second (a retry waiting for a
            // free worker).
            let wake = self
                .window
                .poll_timeout()
                .or_else(|| Some(now() + Duration::from_secs(1)));
            let answer = tokio::select! {
                a = self.sends.next(), if !self.sends.is_empty() => a,
                () = sleep_until(wake) => {
                    self.stats.deadlines += self.window.poll_deadlines(now()) as u64;
                    self.drop_stale_sends();
                    continue;
                }
            };
            if let Some(Some(answer)) = answer
                && let Some(event) = self.on_answer(answer)
            {
                return Ok(Some(event));
            }
        }
    }

    /// Applies one send's answer: the batch's event when it is done or
    /// rejected; nothing when the answer is stale or the batch goes out
    /// again.
    fn on_answer(
        &mut self,
        Answer {
            to,
            result,
            latency,
        }: Answer<S::Reply>,
    ) -> Option<Event<S::Batch, S::Output>> {
        self.aborts.remove(&(to.batch, to.attempt));
        let (id, worker) = (to.batch, to.worker);
        // An answer to an earlier send of the batch (to this worker or
        // another) is stale, even when it arrives after a retry.
        if !self.window.is_live(id, &worker, to.attempt) {
            self.stats.stale += 1;
            return None;
        }
        // A send that never left, or that its worker dropped unanswered
        // (it died holding it), was lost with the worker: not counted
        // as one of the batch's attempts.
        let lost = result.is_err();
        let verdict = match result {
            Ok(reply) => {
                let f = self.flights.get(&id)?;
                self.stage.judge(id, &f.batch, reply)
            }
            Err(e) => Verdict::Retry(e),
        };
        match verdict {
            Verdict::Done(output) => {
                if self.window.complete(id, &worker) == Outcome::Accepted
                    && let Some(batch) = self.finish(id)
                {
                    self.window.observe(&worker, latency);
                    self.drop_stale_sends();
                    crate::counters::batch_done(latency);
                    return Some(Event::Done {
                        id,
                        batch,
                        output,
                        latency,
                        receipt: Receipt {
                            attempt: to.attempt,
                            worker,
                        },
                    });
                }
            }
            Verdict::BadInput(reason) => {
                if self.window.reject(id, &worker) == Outcome::Accepted
                    && let Some(batch) = self.finish(id)
                {
                    return Some(Event::Rejected { id, batch, reason });
                }
            }
            Verdict::Retry(reason) => {
                let node = self
                    .workers
                    .get(&worker)
                    .map(|w| w.node.as_str())
                    .unwrap_or("");
                tracing::warn!(batch = id.0, node, %reason, "batch failed; sending it again");
                if lost {
                    self.stats.lost += 1;
                    self.window.lose(now(), id, &worker);
                } else {
                    self.stats.failures += 1;
                    self.window.fail(now(), id, &worker);
                }
                self.drop_stale_sends();
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};

    /// Doubles numbers; refuses negatives; never answers 13 (keeping the
    /// reply port, so only a deadline ends the wait); answers with a wrong
    /// id for 7 when `liar`.
    struct Doubler {
        liar: bool,
    }

    enum Msg {
        Work(u64, i64, RpcReplyPort<(u64, i64)>),
    }

    impl ractor::Message for Msg {}

    impl Actor for Doubler {
        type Msg = Msg;
        type State = Vec<RpcReplyPort<(u64, i64)>>;
        type Arguments = ();
        async fn pre_start(
            &self,
            _: ActorRef<Msg>,
            _: (),
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(Vec::new())
        }
        async fn handle(
            &self,
            _: ActorRef<Msg>,
            msg: Msg,
            unanswered: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            let Msg::Work(id, x, reply) = msg;
            match x {
                13 => unanswered.push(reply),
                7 if self.liar => {
                    let _ = reply.send((id + 1, 14));
                }
                _ => {
                    let _ = reply.send((id, 2 * x));
                }
            }
            Ok(())
        }
    }

    struct Double;

    impl Stage for Double {
        type Msg = Msg;
        type Batch = i64;
        type Reply = (u64, i64);
        type Output = i64;
        fn request(&self, id: BatchId, batch: &i64, reply: RpcReplyPort<(u64, i64)>) -> Msg {
            Msg::Work(id.0, *batch, reply)
        }
        fn judge(&self, id: BatchId, batch: &i64, (got, y): (u64, i64)) -> Verdict<i64> {
            if got != id.0 {
                Verdict::Retry(format!("answer for batch {got}"))
            } else if *batch < 0 {
                Verdict::BadInput("negative".into())
            } else {
                Verdict::Done(y)
            }
        }
        fn weight(&self, _: &i64) -> usize {
            8
        }
    }

    async fn worker(liar: bool) -> ActorRef<Msg> {
        Actor::spawn(None, Doubler { liar }, ()).await.unwrap().0
    }

    fn pipeline(config: PipelineConfig) -> Pipeline<Double> {
        Pipeline::new(Double, config, Outbound::local())
    }

    fn config(max_in_flight: usize) -> PipelineConfig {
        PipelineConfig {
            max_in_flight,
            memory_budget: usize::MAX,
            deadline: Duration::from_millis(300),
            max_attempts: 3,
            retry_backoff: Duration::from_millis(20),
            hedge: None,
        }
    }

    /// Feeds `inputs` through the pipeline, checking the window bound.
    async fn run(
        pipeline: &mut Pipeline<Double>,
        inputs: &[i64],
        bound: usize,
    ) -> Vec<Event<i64, i64>> {
        let mut events = Vec::new();
        let mut next = 0;
        loop {
            while next < inputs.len() && pipeline.has_credit() {
                pipeline.submit(BatchId(next as u64), inputs[next]);
                next += 1;
                assert!(pipeline.in_flight() <= bound);
            }
            match pipeline.next().await.unwrap() {
                Some(e) => events.push(e),
                None if next == inputs.len() => return events,
                None => {}
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_batch_once_within_the_window() {
        let mut p = pipeline(config(4));
        for _ in 0..3 {
            p.add_worker("local", worker(false).await);
        }
        let inputs: Vec<i64> = (0..200).filter(|x| *x != 13).collect();
        let events = run(&mut p, &inputs, 4).await;
        let mut done: Vec<(u64, i64)> = events
            .iter()
            .map(|e| match e {
                Event::Done { id, output, .. } => (id.0, *output),
                other => panic!("{other:?}"),
            })
            .collect();
        done.sort();
        assert_eq!(done.len(), inputs.len());
        for (i, (id, y)) in done.iter().enumerate() {
            assert_eq!(*id, i as u64);
            assert_eq!(*y, 2 * inputs[i]);
        }
        assert_eq!(p.stats().retries, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn bad_input_is_rejected_once_and_silence_gives_up_after_the_attempts() {
        let mut p = pipeline(config(2));
        p.add_worker("local", worker(false).await);
        let started = tokio::time::Instant::now();
        let events = run(&mut p, &[1, -5, 13, 2], 2).await;
        // Each of 13's three sends waited out its whole deadline, and each
        // retry its backoff (20 ms, then 40 ms), and no more, on tokio's
        // (paused) clock.
        let deadlines = config(2).deadline * 3 + Duration::from_millis(20 + 40);
        let took = started.elapsed();
        assert!(
            took >= deadlines && took < deadlines + Duration::from_millis(5),
            "gave up after {took:?}"
        );
        let mut rejected = 0;
        let mut gave_up = 0;
        let mut done = 0;
        for e in &events {
            match e {
                Event::Rejected { batch, reason, .. } => {
                    assert_eq!((*batch, reason.as_str()), (-5, "negative"));
                    rejected += 1;
                }
                Event::GaveUp { batch, .. } => {
                    assert_eq!(*batch, 13);
                    gave_up += 1;
                }
                Event::Done { .. } => done += 1,
            }
        }
        assert_eq!((done, rejected, gave_up), (2, 1, 1));
        // 13 was sent three times: two retries after two deadlines.
        assert_eq!(p.stats().retries, 2);
    }

    /// A result its caller cannot use (a result object it cannot read) is
    /// a failed attempt of its batch: sent again, and given up once the
    /// batch's attempts are spent — not asked for without end.
    #[tokio::test(start_paused = true)]
    async fn a_result_found_unusable_is_a_failed_attempt_and_the_attempts_stay_bounded() {
        let mut p = pipeline(config(2));
        p.add_worker("a", worker(false).await);
        p.add_worker("b", worker(false).await);
        p.submit(BatchId(9), 21);
        let mut dones = Vec::new();
        let gave_up = loop {
            match p.next().await.unwrap() {
                Some(Event::Done {
                    id, batch, receipt, ..
                }) => {
                    dones.push(receipt.attempt());
                    p.unusable(id, batch, receipt);
                }
                Some(Event::GaveUp { id, batch }) => break (id, batch),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(gave_up, (BatchId(9), 21));
        assert_eq!(dones, vec![1, 2, 3], "three sends, then given up");
        assert_eq!(p.stats().retries, 2);
        assert!(p.next().await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wrong_answer_is_sent_again_to_another_worker() {
        let mut p = pipeline(config(2));
        p.add_worker("a", worker(true).await);
        p.add_worker("b", worker(false).await);
        let events = run(&mut p, &[7, 7, 7, 7], 2).await;
        assert!(
            events
                .iter()
                .all(|e| matches!(e, Event::Done { output: 14, .. })),
            "{events:?}"
        );
        assert_eq!(events.len(), 4);
        assert!(p.stats().retries >= 1);
    }

    /// Doubles numbers after `0` of sleep.
    struct Sleeper(Duration);

    impl Actor for Sleeper {
        type Msg = Msg;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<Msg>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ActorRef<Msg>,
            msg: Msg,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            let Msg::Work(id, x, reply) = msg;
            tokio::time::sleep(self.0).await;
            let _ = reply.send((id, 2 * x));
            Ok(())
        }
    }

    /// 40 batches over a worker 100 times slower than the other: how long
    /// they take (tokio's paused clock), and the pipeline's counters.
    async fn with_a_straggler(hedge: Option<Hedging>) -> (Duration, PipelineStats) {
        let mut p = pipeline(PipelineConfig {
            deadline: Duration::from_secs(60),
            hedge,
            ..config(4)
        });
        let slow = Actor::spawn(None, Sleeper(Duration::from_secs(1)), ())
            .await
            .unwrap()
            .0;
        let fast = Actor::spawn(None, Sleeper(Duration::from_millis(10)), ())
            .await
            .unwrap()
            .0;
        p.add_worker("slow", slow.clone());
        p.add_worker("fast", fast.clone());
        let started = tokio::time::Instant::now();
        let mut done = std::collections::BTreeSet::new();
        let mut next = 0;
        loop {
            while next < 40 && p.has_credit() {
                p.submit(BatchId(next), next as i64);
                next += 1;
            }
            match p.next().await.unwrap() {
                Some(Event::Done { id, output, .. }) => {
                    assert_eq!(output, 2 * id.0 as i64);
                    assert!(done.insert(id.0), "batch {} reported twice", id.0);
                }
                Some(other) => panic!("{other:?}"),
                None if next == 40 => break,
                None => {}
            }
        }
        assert_eq!(done.len(), 40);
        slow.stop(None);
        fast.stop(None);
        (started.elapsed(), p.stats())
    }

    /// Batches held by a straggling worker are sent again to the idle one
    /// and reported once; without hedging the job waits for the
    /// straggler's last batch.
    #[tokio::test(start_paused = true)]
    async fn a_straggling_workers_batches_are_sent_again_and_reported_once() {
        let hedge = Hedging {
            after: 3,
            floor: Duration::from_millis(50),
        };
        let (hedged, stats) = with_a_straggler(Some(hedge)).await;
        let (waited, plain) = with_a_straggler(None).await;
        assert!(stats.hedged >= 1, "{stats:?}");
        assert_eq!(plain.hedged, 0);
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
        assert!(
            hedged < Duration::from_millis(700),
            "{hedged:?} with hedging"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_node_s_batches_go_to_the_others_and_no_worker_is_an_error() {
        let mut p = pipeline(config(4));
        let silent = worker(false).await;
        p.add_worker("gone", silent.clone());
        p.add_worker("here", worker(false).await);
        // Two batches that the first worker never answers (13 is ignored),
        // then the node is lost: the batches move, and give up nowhere.
        p.submit(BatchId(0), 13);
        p.submit(BatchId(1), 13);
        assert_eq!(p.remove_node("gone"), 1);
        assert_eq!(p.workers(), 1);
        assert!(p.stats().redispatches >= 1);
        p.remove_node("here");
        assert_eq!(p.next().await.unwrap_err(), PipelineError::NoWorkers(2));
        silent.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_budget_bounds_what_is_held() {
        let mut p = pipeline(PipelineConfig {
            memory_budget: 16,
            ..config(100)
        });
        p.add_worker("local", worker(false).await);
        let inputs: Vec<i64> = (0..50).filter(|x| *x != 13).collect();
        // 8 bytes per batch, 16 allowed: at most two held at once.
        let events = run(&mut p, &inputs, 2).await;
        assert_eq!(events.len(), inputs.len());
    }
}
