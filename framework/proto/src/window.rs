//! The credit window of a batch pipeline: at most `max_in_flight` batches
//! out at once, each sent to the worker with the fewest batches in flight,
//! with per-batch deadlines and classified retries.
//!
//! ```text
//!            dispatch (least loaded worker)        complete ──► Done
//!   new ──────────────────────────────► InFlight ─ rejected ──► Rejected (not retried)
//!                      ▲                  │  worker lost / deadline passed
//!                      └──── Retry ◄──────┘  (attempts < max_attempts, else GaveUp)
//! ```
//!
//! A batch that failed or ran past its deadline is sent again after a
//! backoff (`retry_backoff`, doubled for each further attempt), so that a
//! brief fault (a session being re-opened, a worker restarting) does not use
//! up its attempts within milliseconds; a batch whose worker was removed is
//! sent again at once. No new batch is sent while a retry waits.
//!
//! Attempts count the sends that failed in a way that may be the batch's
//! doing (an error answer, a deadline). A send lost with its worker (the
//! worker died holding it, or was removed) is sent again without counting
//! ([`Window::lose`]), up to [`LOST_SENDS_PER_ATTEMPT`] times the attempts:
//! a worker that crashes takes its queued batches with it, and they were
//! not the cause.
//!
//! A worker that crashes (its actor panicked, say) was most likely
//! working on the oldest batch it held, since an actor takes its messages
//! in order: [`Window::charge_crash`] counts that send as a failed attempt
//! of that batch, so a batch that crashes every worker it is given is
//! given up after its attempts instead of crashing workers on. A batch may
//! be given fewer attempts than the configured ones ([`Window::limit`]):
//! the pieces of a batch split to find a row that fails it.
//!
//! A batch that runs far longer than its peers (a straggler: past
//! `after` times the running 95th percentile of the latencies other
//! workers took, and at least `floor`; a slow worker's own batches do not
//! raise the bar) is sent a second time to an idle worker
//! ([`WindowConfig::hedge`], [`Window::poll_hedge`]): the first answer
//! wins and the other send is dropped, so a slow worker does not hold the
//! end of a job. The second send is free (it counts no attempt); if
//! either send fails, the other goes on as the batch's send.
//!
//! The window does not own the batches: callers keep them by [`BatchId`]
//! and feed results back. Results are accepted once per batch, from the
//! worker the batch was last sent to; anything else is reported stale.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How many sends of a batch may be lost with their workers, per allowed
/// attempt, before the window gives up on it anyway.
pub const LOST_SENDS_PER_ATTEMPT: u32 = 4;

/// A batch's stable identity within a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// When a straggling batch is sent a second time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedging {
    /// Sent again once it has run this many times the running 95th
    /// percentile of the batch latencies of the other workers…
    pub after: u32,
    /// …and at least this long.
    pub floor: Duration,
}

impl Default for Hedging {
    /// Three times the p95, at least two seconds.
    fn default() -> Self {
        Self {
            after: 3,
            floor: Duration::from_secs(2),
        }
    }
}

/// Latencies a window keeps to estimate the running p95.
const LATENCY_SAMPLES: usize = 256;

/// Completed batches needed before stragglers are judged.
const HEDGE_AFTER_SAMPLES: usize = 16;

/// Window limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    /// Most batches out at once.
    pub max_in_flight: usize,
    /// A batch not answered within this is sent elsewhere.
    pub deadline: Duration,
    /// Sends of one batch before the window gives up on it.
    pub max_attempts: u32,
    /// How long a failed batch waits before its first retry; each further
    /// retry waits twice as long as the one before, at most `deadline`.
    pub retry_backoff: Duration,
    /// Whether and when a straggling batch is sent a second time.
    pub hedge: Option<Hedging>,
}

impl WindowConfig {
    /// How long a batch that failed on its `attempt`-th send waits.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(16);
        self.retry_backoff
            .saturating_mul(1 << doublings)
            .min(self.deadline)
    }
}

/// A send the caller must perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch<W> {
    /// The batch to send.
    pub batch: BatchId,
    /// The worker to send it to.
    pub worker: W,
    /// 1 for the first send, 2 for the second, ... (every send counted,
    /// lost ones too: it tells the sends of a batch apart).
    pub attempt: u32,
}

/// What became of a reported result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted: the batch is done (or rejected) and its credit returned.
    Accepted,
    /// Not in flight to that worker (a late answer after a re-dispatch, or a
    /// duplicate): ignore it.
    Stale,
}

/// A batch the window stopped tracking without success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    /// Its input was refused by a worker: record it as an error.
    Rejected(BatchId),
    /// It failed `max_attempts` times: the job cannot complete it.
    GaveUp(BatchId),
}

/// A batch waiting to be sent again.
#[derive(Debug, Clone)]
struct Retry<W> {
    batch: BatchId,
    /// Sends made so far.
    attempts: u32,
    /// Of which lost with their worker.
    lost: u32,
    /// The worker it failed on, which the retry avoids when it can.
    failed_on: Option<W>,
    /// When it may go; `None`: at once.
    due: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Flight<W> {
    worker: W,
    attempt: u32,
    /// Earlier sends lost with their worker.
    lost: u32,
    deadline: Instant,
    /// Its place in the order of all sends.
    seq: u64,
    /// The highest send number issued for the batch (this send's, or its
    /// second send's).
    issued: u32,
    /// A second send of the straggling batch, in flight.
    hedge: Option<Hedge<W>>,
    /// Whether this send was a second send, counted free when it went.
    free: bool,
}

/// The second send of a straggling batch.
#[derive(Debug, Clone)]
struct Hedge<W> {
    worker: W,
    attempt: u32,
    deadline: Instant,
    seq: u64,
}

/// A batch's free sends once one of its sends ended, `was_lost` or
/// failed: a counted send that was lost becomes free, a free one (a
/// second send) that failed counts after all.
fn settle(lost: u32, free: bool, was_lost: bool) -> u32 {
    match (free, was_lost) {
        (false, true) => lost + 1,
        (true, false) => lost.saturating_sub(1),
        _ => lost,
    }
}

impl<W> Flight<W> {
    /// The second send becomes the batch's send; returns the worker of
    /// the first.
    ///
    /// # Panics
    ///
    /// Without a second send.
    fn promote_hedge(&mut self) -> W {
        let h = self.hedge.take().expect("a second send");
        self.free = true;
        self.attempt = h.attempt;
        self.deadline = h.deadline;
        self.seq = h.seq;
        std::mem::replace(&mut self.worker, h.worker)
    }
}

/// The batch a worker was most likely working on when it stopped
/// answering well.
#[derive(Debug, Clone, Copy)]
struct Held {
    batch: BatchId,
    /// Whether that send already counted as a failed attempt (the worker
    /// answered it with a failure, or its deadline passed).
    charged: bool,
}

/// The credit window over workers identified by `W`.
#[derive(Debug, Clone)]
pub struct Window<W: Ord + Clone> {
    config: WindowConfig,
    load: BTreeMap<W, usize>,
    flights: HashMap<BatchId, Flight<W>>,
    /// Batches to send again, oldest first.
    retry: VecDeque<Retry<W>>,
    abandoned: Vec<Abandoned>,
    /// Batches allowed fewer sends than `config.max_attempts`.
    limits: HashMap<BatchId, u32>,
    /// Per worker, the batch it was most likely working on when it last
    /// answered with a failure or lost its sends.
    held: BTreeMap<W, Held>,
    /// Sends made, numbering them in order.
    sends: u64,
    /// The latest batch latencies, with the worker that took each.
    latencies: VecDeque<(W, Duration)>,
}

impl<W: Ord + Clone> Window<W> {
    /// An empty window with no workers.
    pub fn new(config: WindowConfig) -> Self {
        Self {
            config,
            load: BTreeMap::new(),
            flights: HashMap::new(),
            retry: VecDeque::new(),
            abandoned: Vec::new(),
            limits: HashMap::new(),
            held: BTreeMap::new(),
            sends: 0,
            latencies: VecDeque::new(),
        }
    }

    /// Allows `batch` at most `max_attempts` sends (at least 1, at most the
    /// configured attempts) from now on, until it is done or abandoned.
    pub fn limit(&mut self, batch: BatchId, max_attempts: u32) {
        let max = max_attempts.clamp(1, self.config.max_attempts);
        if max < self.config.max_attempts {
            self.limits.insert(batch, max);
        }
    }

    /// The sends `batch` is allowed.
    fn max_attempts_of(&self, batch: BatchId) -> u32 {
        self.limits
            .get(&batch)
            .copied()
            .unwrap_or(self.config.max_attempts)
    }

    /// The batch of `worker`'s oldest send in flight: the first it
    /// takes from its mailbox.
    fn oldest_on(&self, worker: &W) -> Option<BatchId> {
        self.flights
            .iter()
            .filter(|(_, f)| &f.worker == worker)
            .min_by_key(|(_, f)| f.seq)
            .map(|(b, _)| *b)
    }

    /// Notes `worker`'s oldest send as the one it held when its sends were
    /// lost, unless one is noted already since its last answer.
    fn note_lost_oldest(&mut self, worker: &W) {
        if !self.held.contains_key(worker)
            && let Some(batch) = self.oldest_on(worker)
        {
            let held = Held {
                batch,
                charged: false,
            };
            self.held.insert(worker.clone(), held);
        }
    }

    /// `worker` crashed at `now` (it did not just go away with its node):
    /// the send it was most likely working on, its oldest one not
    /// answered, counts as a failed attempt of that batch. That is its
    /// oldest send in flight, failed here; or, once its sends were lost
    /// ([`Window::remove_worker`], or [`Window::lose`] for each), the
    /// oldest of those, wherever its batch is now (waiting, or sent
    /// again); or the batch its last answer failed (a worker that reports
    /// its failure, then stops), counted already. Returns that batch.
    pub fn charge_crash(&mut self, now: Instant, worker: &W) -> Option<BatchId> {
        let Some(held) = self.held.remove(worker) else {
            let batch = self.oldest_on(worker)?;
            self.fail(now, batch, worker);
            self.held.remove(worker);
            return Some(batch);
        };
        let batch = held.batch;
        if held.charged {
            return Some(batch);
        }
        let max = self.max_attempts_of(batch);
        if let Some(f) = self.flights.get_mut(&batch) {
            if f.lost == 0 {
                return None;
            }
            f.lost -= 1;
            return Some(batch);
        }
        let at = self.retry.iter().position(|r| r.batch == batch)?;
        let r = &mut self.retry[at];
        if r.lost == 0 {
            return None;
        }
        r.lost -= 1;
        if r.attempts - r.lost >= max {
            self.retry.remove(at);
            self.limits.remove(&batch);
            self.abandoned.push(Abandoned::GaveUp(batch));
        }
        Some(batch)
    }

    /// Sets the most batches in flight at once (at least 1): a pool that
    /// grows or shrinks while it runs. Batches in flight beyond a lowered
    /// limit finish; no new one goes out until the flights are under it.
    pub fn set_max_in_flight(&mut self, max: usize) {
        self.config.max_in_flight = max.max(1);
    }

    /// The most batches in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.config.max_in_flight
    }

    /// Adds a worker (no effect if present).
    pub fn add_worker(&mut self, worker: W) {
        self.load.entry(worker).or_insert(0);
    }

    /// Removes a worker; its batches in flight are queued for another one.
    pub fn remove_worker(&mut self, worker: &W) {
        if !self.load.contains_key(worker) {
            return;
        }
        self.note_lost_oldest(worker);
        self.load.remove(worker);
        // Second sends on it are dropped; a batch with a second send
        // elsewhere goes on as that send.
        for f in self.flights.values_mut() {
            if f.hedge.as_ref().is_some_and(|h| &h.worker == worker) {
                f.hedge = None;
            } else if &f.worker == worker && f.hedge.is_some() {
                f.lost = settle(f.lost, f.free, true);
                f.promote_hedge();
            }
        }
        let mut lost: Vec<(BatchId, u32, u32)> = self
            .flights
            .iter()
            .filter(|(_, f)| &f.worker == worker)
            .map(|(b, f)| (*b, f.issued, settle(f.lost, f.free, true)))
            .collect();
        lost.sort();
        for (batch, attempts, lost) in lost {
            self.flights.remove(&batch);
            self.requeue(Retry {
                batch,
                attempts,
                lost,
                failed_on: None,
                due: None,
            });
        }
    }

    fn requeue(&mut self, retry: Retry<W>) {
        let max = self.max_attempts_of(retry.batch);
        if retry.attempts - retry.lost >= max || retry.lost > max * LOST_SENDS_PER_ATTEMPT {
            self.limits.remove(&retry.batch);
            self.abandoned.push(Abandoned::GaveUp(retry.batch));
        } else {
            self.retry.push_back(retry);
        }
    }

    /// The send of `batch` in flight, if any: its worker and attempt
    /// number. An answer belongs to that send only if both match.
    pub fn flight_of(&self, batch: BatchId) -> Option<(&W, u32)> {
        self.flights.get(&batch).map(|f| (&f.worker, f.attempt))
    }

    /// Batches in flight to `worker`.
    pub fn load_of(&self, worker: &W) -> Option<usize> {
        self.load.get(worker).copied()
    }

    /// Batches in flight.
    pub fn in_flight(&self) -> usize {
        self.flights.len()
    }

    /// Batches waiting to be sent again.
    pub fn pending_retries(&self) -> usize {
        self.retry.len()
    }

    /// Whether nothing is in flight or waiting for a retry.
    pub fn is_idle(&self) -> bool {
        self.flights.is_empty() && self.retry.is_empty()
    }

    /// The least-loaded worker if a credit is free.
    fn pick(&self) -> Option<W> {
        if self.flights.len() >= self.config.max_in_flight {
            return None;
        }
        self.load
            .iter()
            .min_by_key(|(_, n)| **n)
            .map(|(w, _)| w.clone())
    }

    fn send(
        &mut self,
        now: Instant,
        batch: BatchId,
        attempt: u32,
        lost: u32,
        worker: W,
    ) -> Dispatch<W> {
        *self.load.get_mut(&worker).expect("picked from load") += 1;
        self.sends += 1;
        self.flights.insert(
            batch,
            Flight {
                worker: worker.clone(),
                attempt,
                lost,
                deadline: now + self.config.deadline,
                seq: self.sends,
                issued: attempt,
                hedge: None,
                free: false,
            },
        );
        Dispatch {
            batch,
            worker,
            attempt,
        }
    }

    /// The next retry to send, if one is due and a credit and a worker are
    /// free (the oldest due first). Retries go before new batches.
    pub fn poll_retry(&mut self, now: Instant) -> Option<Dispatch<W>> {
        let at = self
            .retry
            .iter()
            .position(|r| r.due.is_none_or(|due| due <= now))?;
        let worker = self.pick()?;
        let Retry {
            batch,
            attempts,
            lost,
            failed_on,
            ..
        } = self.retry.remove(at)?;
        // To the least-loaded of the other workers when there is one, however
        // loaded: the worker that failed the batch may fail it again.
        let worker = match failed_on {
            Some(bad) if bad == worker => self
                .load
                .iter()
                .filter(|(w, _)| **w != bad)
                .min_by_key(|(_, n)| **n)
                .map(|(w, _)| w.clone())
                .unwrap_or(worker),
            _ => worker,
        };
        Some(self.send(now, batch, attempts + 1, lost, worker))
    }

    /// Whether [`Window::dispatch_new`] would accept a new batch now.
    pub fn has_credit(&self) -> bool {
        self.retry.is_empty() && self.pick().is_some()
    }

    /// Sends a new batch if a credit and a worker are free and no retry
    /// waits; returns the send to perform, or gives the id back.
    pub fn dispatch_new(&mut self, now: Instant, batch: BatchId) -> Result<Dispatch<W>, BatchId> {
        if !self.retry.is_empty() {
            return Err(batch);
        }
        match self.pick() {
            Some(worker) => Ok(self.send(now, batch, 1, 0, worker)),
            None => Err(batch),
        }
    }

    /// Takes `batch` off the window on an answer from `from`, either of
    /// its sends: the first answer wins, the other send is dropped.
    fn land(&mut self, batch: BatchId, from: &W) -> Option<Flight<W>> {
        match self.flights.get(&batch) {
            Some(f) if &f.worker == from || f.hedge.as_ref().is_some_and(|h| &h.worker == from) => {
            }
            _ => return None,
        }
        let flight = self.flights.remove(&batch)?;
        self.unload(&flight.worker);
        if let Some(h) = &flight.hedge {
            self.unload(&h.worker);
        }
        Some(flight)
    }

    fn unload(&mut self, worker: &W) {
        if let Some(n) = self.load.get_mut(worker) {
            *n -= 1;
        }
    }

    /// Whether the send `attempt` of `batch` to `worker` is one the window
    /// waits for (its send, or its second send).
    pub fn is_live(&self, batch: BatchId, worker: &W, attempt: u32) -> bool {
        self.flights.get(&batch).is_some_and(|f| {
            (&f.worker == worker && f.attempt == attempt)
                || f.hedge
                    .as_ref()
                    .is_some_and(|h| &h.worker == worker && h.attempt == attempt)
        })
    }

    /// Whether the send `attempt` of `batch` is one the window waits for.
    pub fn is_live_attempt(&self, batch: BatchId, attempt: u32) -> bool {
        self.flights.get(&batch).is_some_and(|f| {
            f.attempt == attempt || f.hedge.as_ref().is_some_and(|h| h.attempt == attempt)
        })
    }

    /// A batch took `worker` `latency` to complete: what stragglers on
    /// the other workers are judged by.
    pub fn observe(&mut self, worker: &W, latency: Duration) {
        if self.latencies.len() == LATENCY_SAMPLES {
            self.latencies.pop_front();
        }
        self.latencies.push_back((worker.clone(), latency));
    }

    /// How long a batch on `worker` runs before it is a straggler: once
    /// enough batches of the other workers were observed, `after` times
    /// their p95, at least the floor.
    fn straggling_after(&self, worker: &W) -> Option<Duration> {
        let hedge = self.config.hedge?;
        let mut peers: Vec<Duration> = self
            .latencies
            .iter()
            .filter(|(w, _)| w != worker)
            .map(|(_, d)| *d)
            .collect();
        if peers.len() < HEDGE_AFTER_SAMPLES {
            return None;
        }
        peers.sort_unstable();
        let p95 = peers[(peers.len() - 1) * 95 / 100];
        Some(p95.saturating_mul(hedge.after).max(hedge.floor))
    }

    /// An idle worker other than `busy`, if any.
    fn idle_worker_but(&self, busy: &W) -> Option<W> {
        self.load
            .iter()
            .find(|(w, n)| **n == 0 && *w != busy)
            .map(|(w, _)| w.clone())
    }

    /// The second send of the oldest straggling batch, to an idle worker,
    /// if one straggles at `now` and a worker is idle. The second send is
    /// free: it counts no attempt of the batch.
    pub fn poll_hedge(&mut self, now: Instant) -> Option<Dispatch<W>> {
        self.config.hedge?;
        let deadline = self.config.deadline;
        let (batch, worker) = self
            .flights
            .iter()
            .filter(|(_, f)| {
                f.hedge.is_none()
                    && self
                        .straggling_after(&f.worker)
                        .is_some_and(|after| now >= f.deadline - deadline + after)
            })
            .min_by_key(|(_, f)| f.seq)
            .and_then(|(b, f)| Some((*b, self.idle_worker_but(&f.worker)?)))?;
        *self.load.get_mut(&worker).expect("an idle worker") += 1;
        self.sends += 1;
        let f = self.flights.get_mut(&batch).expect("found above");
        f.issued += 1;
        f.lost += 1;
        f.hedge = Some(Hedge {
            worker: worker.clone(),
            attempt: f.issued,
            deadline: now + deadline,
            seq: self.sends,
        });
        Some(Dispatch {
            batch,
            worker,
            attempt: f.issued,
        })
    }

    /// When the next batch in flight becomes a straggler, while a worker
    /// is idle to take its second send.
    fn next_straggler(&self) -> Option<Instant> {
        self.config.hedge?;
        let deadline = self.config.deadline;
        self.flights
            .values()
            .filter(|f| f.hedge.is_none() && self.idle_worker_but(&f.worker).is_some())
            .filter_map(|f| Some(f.deadline - deadline + self.straggling_after(&f.worker)?))
            .min()
    }

    /// A worker answered `batch` successfully.
    pub fn complete(&mut self, batch: BatchId, from: &W) -> Outcome {
        match self.land(batch, from) {
            Some(_) => {
                self.answered(batch, from);
                Outcome::Accepted
            }
            None => Outcome::Stale,
        }
    }

    /// `batch` left the window with an answer from `worker`, which is
    /// alive after all: no lost send of its is a crash's.
    fn answered(&mut self, batch: BatchId, worker: &W) {
        self.limits.remove(&batch);
        self.held.remove(worker);
    }

    /// A worker refused `batch` as bad input: it is abandoned, not retried.
    pub fn reject(&mut self, batch: BatchId, from: &W) -> Outcome {
        match self.land(batch, from) {
            Some(_) => {
                self.answered(batch, from);
                self.abandoned.push(Abandoned::Rejected(batch));
                Outcome::Accepted
            }
            None => Outcome::Stale,
        }
    }

    /// A send of `batch` failed at `now` (worker error, lost answer): send
    /// it again elsewhere after its backoff, within `max_attempts`.
    pub fn fail(&mut self, now: Instant, batch: BatchId, from: &W) -> Outcome {
        self.fail_or_lose(now, batch, from, false)
    }

    /// A send of `batch` was lost with its worker at `now` (it died holding
    /// it, or the send never left): send it again elsewhere after its
    /// backoff, without counting an attempt.
    pub fn lose(&mut self, now: Instant, batch: BatchId, from: &W) -> Outcome {
        self.fail_or_lose(now, batch, from, true)
    }

    fn fail_or_lose(&mut self, now: Instant, batch: BatchId, from: &W, lost: bool) -> Outcome {
        // With two sends out, the one that failed is dropped and the
        // other goes on as the batch's send.
        if let Some(f) = self.flights.get_mut(&batch)
            && let Some(h) = &f.hedge
        {
            let (hedge_failed, first_failed) = (&h.worker == from, &f.worker == from);
            if hedge_failed || first_failed {
                let gone = if hedge_failed {
                    f.lost = settle(f.lost, true, lost);
                    f.hedge.take().map(|h| h.worker)
                } else {
                    f.lost = settle(f.lost, f.free, lost);
                    Some(f.promote_hedge())
                };
                if let Some(w) = gone {
                    self.unload(&w);
                }
                return Outcome::Accepted;
            }
        }
        if self.flight_of(batch).is_some_and(|(w, _)| w == from) {
            if lost {
                self.note_lost_oldest(from);
            } else {
                let held = Held {
                    batch,
                    charged: true,
                };
                self.held.insert(from.clone(), held);
            }
        }
        match self.land(batch, from) {
            Some(f) => {
                let lost = settle(f.lost, f.free, lost);
                let counted = f.issued - lost;
                let due = now + self.config.backoff(counted.max(1));
                self.requeue(Retry {
                    batch,
                    attempts: f.issued,
                    lost,
                    failed_on: Some(f.worker),
                    due: Some(due),
                });
                Outcome::Accepted
            }
            None => Outcome::Stale,
        }
    }

    /// `batch` was completed by `worker` on its `attempt`-th send, and its
    /// result then proved unusable (its caller could not read it): that
    /// send failed after all. The batch goes out again after its backoff,
    /// to another worker when there is one, or is given up once
    /// `max_attempts` sends have failed — the count the batch had, not a
    /// fresh one.
    pub fn redo(&mut self, now: Instant, batch: BatchId, attempt: u32, worker: W) {
        let attempts = attempt.max(1);
        self.requeue(Retry {
            batch,
            attempts,
            lost: 0,
            failed_on: Some(worker),
            due: Some(now + self.config.backoff(attempts)),
        });
    }

    /// Moves every batch past its deadline to the retry queue (or gives up
    /// on it); returns how many timed out.
    pub fn poll_deadlines(&mut self, now: Instant) -> usize {
        let mut late: Vec<(BatchId, W)> = self
            .flights
            .iter()
            .flat_map(|(b, f)| {
                let first = (f.deadline <= now).then(|| (*b, f.worker.clone()));
                let second = f
                    .hedge
                    .as_ref()
                    .filter(|h| h.deadline <= now)
                    .map(|h| (*b, h.worker.clone()));
                first.into_iter().chain(second)
            })
            .collect();
        late.sort_by_key(|(b, _)| *b);
        for (batch, worker) in &late {
            self.fail(now, *batch, worker);
        }
        late.len()
    }

    /// The earliest deadline in flight or retry falling due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadlines = self
            .flights
            .values()
            .flat_map(|f| std::iter::once(f.deadline).chain(f.hedge.as_ref().map(|h| h.deadline)));
        deadlines
            .chain(self.retry.iter().filter_map(|r| r.due))
            .chain(self.next_straggler())
            .min()
    }

    /// Batches abandoned since the last call.
    pub fn take_abandoned(&mut self) -> Vec<Abandoned> {
        std::mem::take(&mut self.abandoned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> WindowConfig {
        WindowConfig {
            max_in_flight: 4,
            deadline: Duration::from_secs(10),
            max_attempts: 3,
            retry_backoff: Duration::from_millis(100),
            hedge: None,
        }
    }

    #[test]
    fn routes_to_the_least_loaded_worker_within_the_window() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.add_worker("b");
        let sent: Vec<&str> = (0..4)
            .map(|i| w.dispatch_new(t, BatchId(i)).unwrap().worker)
            .collect();
        assert_eq!(sent, ["a", "b", "a", "b"]);
        assert_eq!(
            w.dispatch_new(t, BatchId(4)),
            Err(BatchId(4)),
            "window full"
        );
        assert_eq!(w.complete(BatchId(1), &"b"), Outcome::Accepted);
        assert_eq!(w.dispatch_new(t, BatchId(4)).unwrap().worker, "b");
    }

    #[test]
    fn late_answer_after_redispatch_is_stale() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.dispatch_new(t, BatchId(0)).unwrap();
        assert_eq!(w.poll_deadlines(t + Duration::from_secs(10)), 1);
        w.add_worker("b");
        w.remove_worker(&"a");
        let again = w.poll_retry(t + Duration::from_secs(11)).unwrap();
        assert_eq!((again.worker, again.attempt), ("b", 2));
        assert_eq!(w.complete(BatchId(0), &"a"), Outcome::Stale);
        assert_eq!(w.complete(BatchId(0), &"b"), Outcome::Accepted);
        assert_eq!(w.complete(BatchId(0), &"b"), Outcome::Stale, "idempotent");
    }

    #[test]
    fn rejected_input_is_not_retried_and_failures_give_up_after_max_attempts() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.dispatch_new(t, BatchId(0)).unwrap();
        w.reject(BatchId(0), &"a");
        assert_eq!(w.take_abandoned(), vec![Abandoned::Rejected(BatchId(0))]);
        assert!(w.is_idle());
        w.dispatch_new(t, BatchId(1)).unwrap();
        let mut t = t;
        for attempt in 1..=3 {
            assert_eq!(
                w.fail(t, BatchId(1), &"a"),
                Outcome::Accepted,
                "attempt {attempt}"
            );
            if attempt < 3 {
                t += config().backoff(attempt);
                assert_eq!(w.poll_retry(t).unwrap().attempt, attempt + 1);
            }
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(1))]);
        assert!(w.is_idle());
    }

    /// A batch that crashes each worker it is sent to (the oldest each
    /// crashed worker held) is charged an attempt per crash and given up
    /// after its attempts; the batches queued behind it on the same
    /// workers are lost with them, not charged, and go on.
    #[test]
    fn a_batch_that_crashes_every_worker_is_given_up_and_those_queued_behind_it_are_not() {
        let t = Instant::now();
        let mut w = Window::new(WindowConfig {
            max_in_flight: 2,
            ..config()
        });
        w.add_worker(0u32);
        assert_eq!(w.dispatch_new(t, BatchId(7)).unwrap().worker, 0);
        let later = t + Duration::from_millis(1);
        assert_eq!(w.dispatch_new(later, BatchId(8)).unwrap().worker, 0);
        let mut t = later;
        for crash in 1..=3u32 {
            // The worker dies: its sends are lost with it (their answers
            // come back before or after it is removed), and the crash is
            // put on the oldest.
            if crash == 2 {
                assert_eq!(w.lose(t, BatchId(8), &(crash - 1)), Outcome::Accepted);
                assert_eq!(w.lose(t, BatchId(7), &(crash - 1)), Outcome::Accepted);
            }
            w.remove_worker(&(crash - 1));
            assert_eq!(
                w.charge_crash(t, &(crash - 1)),
                Some(BatchId(7)),
                "crash {crash}"
            );
            assert_eq!(w.charge_crash(t, &(crash - 1)), None, "once per crash");
            if crash == 3 {
                break;
            }
            w.add_worker(crash);
            t += Duration::from_secs(1);
            while w.poll_retry(t).is_some() {}
            // Sent ahead of 7 this time, 8 is answered before the worker
            // takes 7 and crashes.
            if w.flights
                .get(&BatchId(8))
                .is_some_and(|f| f.seq < w.flights[&BatchId(7)].seq)
            {
                assert_eq!(w.complete(BatchId(8), &crash), Outcome::Accepted);
            }
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(7))]);
        assert!(w.pending_retries() <= 1, "8 goes on, if not done");
    }

    /// A crash reported while the worker still holds its sends fails the
    /// oldest of them (counted) and leaves the others to be lost with it.
    #[test]
    fn a_crash_reported_first_fails_the_oldest_send_it_held() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.add_worker("b");
        w.dispatch_new(t, BatchId(5)).unwrap();
        w.dispatch_new(t, BatchId(2)).unwrap();
        w.dispatch_new(t, BatchId(1)).unwrap();
        assert_eq!(w.flight_of(BatchId(1)), Some((&"a", 1)));
        assert_eq!(w.charge_crash(t, &"a"), Some(BatchId(5)), "sent first");
        w.remove_worker(&"a");
        let t = t + Duration::from_secs(1);
        let mut again: Vec<(BatchId, u32)> = std::iter::from_fn(|| w.poll_retry(t))
            .map(|d| (d.batch, d.attempt))
            .collect();
        again.sort();
        assert_eq!(again, [(BatchId(1), 2), (BatchId(5), 2)]);
        // 1 was lost (free), 5 failed (counted): two more failures give up 5.
        for _ in 0..2 {
            w.fail(t, BatchId(5), &"b");
            w.fail(t, BatchId(1), &"b");
            let t = t + Duration::from_secs(5);
            while let Some(d) = w.poll_retry(t) {
                assert_eq!(d.worker, "b");
            }
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(5))]);
    }

    /// A worker that answers its batch with a failure and then stops has
    /// that batch charged once (by the answer), not the next one it held.
    #[test]
    fn a_crash_after_a_failure_answer_is_that_batchs() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.dispatch_new(t, BatchId(4)).unwrap();
        w.dispatch_new(t, BatchId(3)).unwrap();
        assert_eq!(w.fail(t, BatchId(4), &"a"), Outcome::Accepted);
        assert_eq!(w.charge_crash(t, &"a"), Some(BatchId(4)));
        w.remove_worker(&"a");
        assert_eq!(w.flight_of(BatchId(3)), None);
        w.add_worker("b");
        let t = t + Duration::from_secs(1);
        let again: Vec<(BatchId, u32)> = std::iter::from_fn(|| w.poll_retry(t))
            .map(|d| (d.batch, d.attempt))
            .collect();
        assert!(again.contains(&(BatchId(3), 2)));
        // 3 was lost (free), 4 failed once: two more failures give up 4
        // and leave 3 one attempt.
        for _ in 0..2 {
            w.fail(t, BatchId(4), &"b");
            w.fail(t, BatchId(3), &"b");
            let t = t + Duration::from_secs(5);
            while w.poll_retry(t).is_some() {}
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(4))]);
    }

    fn hedging() -> WindowConfig {
        WindowConfig {
            hedge: Some(Hedging {
                after: 3,
                floor: Duration::from_millis(500),
            }),
            ..config()
        }
    }

    /// `w` observed 16 batches of `ms` milliseconds on `worker`.
    fn observed(w: &mut Window<&'static str>, worker: &'static str, ms: u64) {
        for _ in 0..HEDGE_AFTER_SAMPLES {
            w.observe(&worker, Duration::from_millis(ms));
        }
    }

    /// A batch past three times the p95 (and the floor) is sent a second
    /// time to an idle worker; the first answer wins and the other send
    /// is stale; the second send counts no attempt.
    #[test]
    fn a_straggler_is_sent_again_to_an_idle_worker_and_the_first_answer_wins() {
        let t = Instant::now();
        let mut w = Window::new(hedging());
        w.add_worker("slow");
        w.add_worker("fast");
        let first = w.dispatch_new(t, BatchId(1)).unwrap();
        assert_eq!(first.worker, "fast", "least loaded, then by name");
        let slow = w.dispatch_new(t, BatchId(2)).unwrap();
        assert_eq!(slow.worker, "slow");
        assert_eq!(
            w.poll_hedge(t + Duration::from_secs(5)),
            None,
            "nothing observed yet"
        );
        // The slow worker's own batches do not raise the bar.
        observed(&mut w, "slow", 5000);
        assert_eq!(
            w.poll_hedge(t + Duration::from_secs(5)),
            None,
            "no peer observed"
        );
        observed(&mut w, "fast", 100);
        assert_eq!(
            w.poll_hedge(t + Duration::from_millis(400)),
            None,
            "under the floor"
        );
        assert_eq!(
            w.poll_hedge(t + Duration::from_secs(1)),
            None,
            "no idle worker"
        );
        assert_eq!(w.complete(BatchId(1), &"fast"), Outcome::Accepted);
        assert_eq!(
            w.poll_timeout(),
            Some(t + Duration::from_millis(500)),
            "the straggler's due time, now a worker is idle"
        );
        let hedge = w.poll_hedge(t + Duration::from_secs(1)).unwrap();
        assert_eq!(
            (hedge.batch, hedge.worker, hedge.attempt),
            (BatchId(2), "fast", 2)
        );
        assert_eq!(
            w.poll_hedge(t + Duration::from_secs(1)),
            None,
            "once per batch"
        );
        assert!(w.is_live(BatchId(2), &"slow", 1) && w.is_live(BatchId(2), &"fast", 2));
        assert!(!w.has_credit() || w.load_of(&"fast") == Some(1));
        assert_eq!(w.complete(BatchId(2), &"fast"), Outcome::Accepted);
        assert!(
            !w.is_live_attempt(BatchId(2), 1),
            "the slow send is dropped"
        );
        assert_eq!(w.complete(BatchId(2), &"slow"), Outcome::Stale);
        assert_eq!((w.load_of(&"slow"), w.load_of(&"fast")), (Some(0), Some(0)));
        assert!(w.is_idle());
    }

    /// Either send failing leaves the other as the batch's send; the
    /// second send's loss is free, its failure counts.
    #[test]
    fn a_failed_send_of_a_hedged_batch_leaves_the_other() {
        let t = Instant::now();
        let mut w = Window::new(hedging());
        for name in ["a", "b", "c"] {
            w.add_worker(name);
        }
        observed(&mut w, "elsewhere", 10);
        w.dispatch_new(t, BatchId(0)).unwrap();
        let later = t + Duration::from_secs(1);
        let h = w.poll_hedge(later).unwrap();
        assert_eq!((h.worker, h.attempt), ("b", 2));
        // The first send fails: the second goes on.
        assert_eq!(w.fail(later, BatchId(0), &"a"), Outcome::Accepted);
        assert_eq!(w.flight_of(BatchId(0)), Some((&"b", 2)));
        assert_eq!(w.pending_retries(), 0);
        // Hedged again (to a, idle), then b removed: a goes on.
        let h = w.poll_hedge(later + Duration::from_secs(1)).unwrap();
        assert_eq!((h.worker, h.attempt), ("a", 3));
        w.remove_worker(&"b");
        assert_eq!(w.flight_of(BatchId(0)), Some((&"a", 3)));
        // Hedged to c, which loses it: free.
        let h = w.poll_hedge(later + Duration::from_secs(5)).unwrap();
        assert_eq!((h.worker, h.attempt), ("c", 4));
        w.lose(later, BatchId(0), &"c");
        assert_eq!(w.load_of(&"c"), Some(0));
        // Counted so far: the first send's failure. Two more give it up.
        w.fail(later, BatchId(0), &"a");
        let again = w.poll_retry(later + Duration::from_secs(9)).unwrap();
        assert_eq!(again.attempt, 5);
        w.fail(later, BatchId(0), &again.worker);
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(0))]);
    }

    /// A worker that answers after a send of its was lost is alive: a
    /// later crash report does not charge the lost send's batch.
    #[test]
    fn an_answer_clears_what_a_lost_send_noted() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.dispatch_new(t, BatchId(0)).unwrap();
        w.dispatch_new(t + Duration::from_millis(1), BatchId(1))
            .unwrap();
        w.lose(t, BatchId(0), &"a");
        assert_eq!(w.complete(BatchId(1), &"a"), Outcome::Accepted);
        assert_eq!(w.charge_crash(t, &"a"), None);
    }

    /// A batch limited to one send is given up on its first failure; to
    /// two, on its second; the limit goes with the batch.
    #[test]
    fn a_limited_batch_is_given_up_after_its_own_attempts() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.limit(BatchId(0), 1);
        w.limit(BatchId(1), 2);
        w.limit(BatchId(2), 99);
        for b in 0..3 {
            w.dispatch_new(t, BatchId(b)).unwrap();
        }
        for b in 0..3 {
            w.fail(t, BatchId(b), &"a");
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(0))]);
        let t = t + Duration::from_secs(1);
        for _ in 0..2 {
            let d = w.poll_retry(t).unwrap();
            w.fail(t, d.batch, &"a");
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(1))]);
        assert_eq!(w.pending_retries(), 1, "2 has the configured three");
        assert!(!w.limits.contains_key(&BatchId(1)));
    }

    #[test]
    fn a_failed_batch_waits_its_backoff_and_holds_new_batches_back() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.add_worker("b");
        w.dispatch_new(t, BatchId(0)).unwrap();
        w.fail(t, BatchId(0), &"a");
        assert_eq!(w.poll_timeout(), Some(t + Duration::from_millis(100)));
        assert_eq!(
            w.poll_retry(t + Duration::from_millis(99)),
            None,
            "too soon"
        );
        assert!(!w.has_credit(), "a waiting retry holds new batches back");
        assert_eq!(w.dispatch_new(t, BatchId(1)), Err(BatchId(1)));
        let again = w.poll_retry(t + Duration::from_millis(100)).unwrap();
        assert_eq!((again.worker, again.attempt), ("b", 2));
        let t2 = t + Duration::from_secs(1);
        w.fail(t2, BatchId(0), &"b");
        assert_eq!(
            w.poll_timeout(),
            Some(t2 + Duration::from_millis(200)),
            "doubled"
        );
        assert_eq!(
            config().backoff(40),
            config().deadline,
            "at most the deadline"
        );
    }

    #[test]
    fn sends_lost_with_their_worker_do_not_count_as_attempts_up_to_a_bound() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.add_worker("b");
        w.dispatch_new(t, BatchId(0)).unwrap();
        let mut t = t;
        let mut sends = 1;
        // Lost with its worker again and again: sent again every time,
        // until the bound.
        loop {
            let (worker, _) = w.flight_of(BatchId(0)).unwrap();
            let worker = *worker;
            w.lose(t, BatchId(0), &worker);
            t += Duration::from_secs(11);
            match w.poll_retry(t) {
                Some(d) => {
                    sends += 1;
                    assert_eq!(d.attempt, sends);
                }
                None => break,
            }
        }
        assert_eq!(sends, 3 * LOST_SENDS_PER_ATTEMPT + 1);
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(0))]);
        // Lost twice, then failed three times: given up after the third
        // counted failure.
        w.dispatch_new(t, BatchId(1)).unwrap();
        for (i, lose) in [true, true, false, false, false].into_iter().enumerate() {
            let (worker, _) = w.flight_of(BatchId(1)).unwrap();
            let worker = *worker;
            if lose {
                w.lose(t, BatchId(1), &worker);
            } else {
                w.fail(t, BatchId(1), &worker);
            }
            t += Duration::from_secs(11);
            assert_eq!(w.poll_retry(t).is_some(), i < 4, "send {i}");
        }
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(1))]);
    }

    #[test]
    fn a_batch_of_a_removed_worker_is_sent_again_at_once() {
        let t = Instant::now();
        let mut w = Window::new(config());
        w.add_worker("a");
        w.dispatch_new(t, BatchId(0)).unwrap();
        w.add_worker("b");
        w.remove_worker(&"a");
        assert_eq!(w.poll_retry(t).unwrap().worker, "b");
    }

    #[derive(Debug, Clone)]
    enum Op {
        AddWorker(u8),
        RemoveWorker(u8),
        New,
        Retry,
        Complete(usize),
        Reject(usize),
        Fail(usize),
        Stale(usize, u8),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3).prop_map(Op::AddWorker),
            (0u8..3).prop_map(Op::RemoveWorker),
            Just(Op::New),
            Just(Op::New),
            Just(Op::Retry),
            any::<usize>().prop_map(Op::Complete),
            any::<usize>().prop_map(Op::Reject),
            any::<usize>().prop_map(Op::Fail),
            (any::<usize>(), 0u8..3).prop_map(|(b, w)| Op::Stale(b, w)),
            (0u64..15_000).prop_map(Op::Advance),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum State {
        InFlight(u8, u32),
        Retry,
        Done,
        Rejected,
        GaveUp,
    }

    proptest! {
        /// Against a model of every batch's state: the window never exceeds
        /// its credits, always picks a least-loaded worker, accepts each
        /// result once from the right worker, and accounts for every batch.
        #[test]
        fn window_matches_batch_state_model(ops in proptest::collection::vec(op(), 0..120)) {
            let cfg = config();
            let mut now = Instant::now();
            let mut w: Window<u8> = Window::new(cfg);
            let mut model: BTreeMap<u64, State> = BTreeMap::new();
            let mut next = 0u64;
            let mut last_worker: BTreeMap<u64, u8> = BTreeMap::new();
            // When a batch failed by `Fail` may be sent again.
            let mut due: BTreeMap<u64, Instant> = BTreeMap::new();
            let in_flight_ids = |m: &BTreeMap<u64, State>| -> Vec<u64> {
                m.iter().filter(|(_, s)| matches!(s, State::InFlight(..))).map(|(b, _)| *b).collect()
            };
            for op in ops {
                match op {
                    Op::AddWorker(x) => w.add_worker(x),
                    Op::RemoveWorker(x) => {
                        // Batches in flight on a removed worker are retried
                        // without preference: none failed them.
                        for (b, st) in &model {
                            if matches!(st, State::InFlight(worker, _) if *worker == x) {
                                last_worker.remove(b);
                            }
                        }
                        w.remove_worker(&x)
                    }
                    Op::New | Op::Retry => {
                        let before: Vec<(u8, usize)> =
                            (0..3).filter_map(|x| w.load_of(&x).map(|n| (x, n))).collect();
                        let sent = if matches!(op, Op::New) {
                            let r = w.dispatch_new(now, BatchId(next));
                            if r.is_ok() { next += 1; }
                            r.ok()
                        } else {
                            w.poll_retry(now)
                        };
                        if let Some(d) = sent {
                            if let Some(due) = due.remove(&d.batch.0) {
                                prop_assert!(now >= due, "a retry went before its backoff");
                            }
                            // Least loaded; a retry avoids the worker it last ran on
                            // when there is another.
                            let last = last_worker.get(&d.batch.0).copied();
                            let others: Vec<usize> = before.iter()
                                .filter(|(x, _)| Some(*x) != last).map(|(_, n)| *n).collect();
                            let min = if others.is_empty() {
                                before.iter().map(|(_, n)| *n).min()
                            } else {
                                others.iter().min().copied()
                            };
                            prop_assert_eq!(Some(w.load_of(&d.worker).unwrap() - 1), min, "least loaded");
                            last_worker.insert(d.batch.0, d.worker);
                            prop_assert!(d.attempt <= cfg.max_attempts * (1 + LOST_SENDS_PER_ATTEMPT) + 1);
                            let prev = model.insert(d.batch.0, State::InFlight(d.worker, d.attempt));
                            prop_assert!(prev.is_none() || prev == Some(State::Retry), "{:?} was {:?}", d, prev);
                        }
                    }
                    Op::Complete(i) | Op::Reject(i) | Op::Fail(i) => {
                        let ids = in_flight_ids(&model);
                        if ids.is_empty() { continue; }
                        let b = ids[i % ids.len()];
                        let model_attempt = model[&b];
                        let State::InFlight(worker, _) = model_attempt else { unreachable!() };
                        let out = match op {
                            Op::Complete(_) => { model.insert(b, State::Done); w.complete(BatchId(b), &worker) }
                            Op::Reject(_) => { model.insert(b, State::Rejected); w.reject(BatchId(b), &worker) }
                            _ => {
                                model.insert(b, State::Retry);
                                let State::InFlight(_, attempt) = model_attempt else { unreachable!() };
                                let _ = attempt;
                                // At least the first wait (later ones are longer).
                                due.insert(b, now + cfg.backoff(1));
                                w.fail(now, BatchId(b), &worker)
                            }
                        };
                        prop_assert_eq!(out, Outcome::Accepted);
                    }
                    Op::Stale(i, x) => {
                        if next == 0 { continue; }
                        let b = (i as u64) % next;
                        let right = matches!(model.get(&b), Some(State::InFlight(wk, _)) if *wk == x);
                        if !right {
                            prop_assert_eq!(w.complete(BatchId(b), &x), Outcome::Stale);
                        }
                    }
                    Op::Advance(ms) => {
                        now += Duration::from_millis(ms);
                        w.poll_deadlines(now);
                    }
                }
                // Batches the window no longer holds in flight went to retry.
                for b in in_flight_ids(&model) {
                    let State::InFlight(worker, attempt) = model[&b] else { unreachable!() };
                    if w.flight_of(BatchId(b)) != Some((&worker, attempt)) {
                        model.insert(b, State::Retry);
                    }
                }
                for a in w.take_abandoned() {
                    match a {
                        Abandoned::Rejected(b) => prop_assert_eq!(model[&b.0], State::Rejected),
                        Abandoned::GaveUp(b) => {
                            prop_assert_eq!(model[&b.0], State::Retry);
                            model.insert(b.0, State::GaveUp);
                        }
                    }
                }
                let flying = in_flight_ids(&model).len();
                let retrying = model.values().filter(|s| **s == State::Retry).count();
                prop_assert!(w.in_flight() <= cfg.max_in_flight);
                prop_assert_eq!(w.in_flight(), flying);
                prop_assert_eq!(w.pending_retries(), retrying);
                prop_assert_eq!((0..3).filter_map(|x| w.load_of(&x)).sum::<usize>(), flying);
                prop_assert_eq!(model.len() as u64, next);
            }
        }
    }

    #[test]
    fn a_result_found_unusable_after_completion_counts_as_a_failed_attempt() {
        let t0 = Instant::now();
        let mut w = Window::new(config());
        w.add_worker('a');
        w.add_worker('b');
        let d = w.dispatch_new(t0, BatchId(1)).unwrap();
        assert_eq!(w.complete(BatchId(1), &d.worker), Outcome::Accepted);
        // Its result could not be read: sent again, elsewhere, as attempt 2.
        w.redo(t0, BatchId(1), d.attempt, d.worker);
        assert!(!w.is_idle());
        let later = t0 + Duration::from_secs(10);
        let again = w.poll_retry(later).unwrap();
        assert_eq!((again.batch, again.attempt), (BatchId(1), 2));
        assert_ne!(again.worker, d.worker);
        // Twice more unreadable: the third failed attempt gives up on it.
        assert_eq!(w.complete(BatchId(1), &again.worker), Outcome::Accepted);
        w.redo(later, BatchId(1), again.attempt, again.worker);
        let third = w.poll_retry(later + Duration::from_secs(10)).unwrap();
        assert_eq!(third.attempt, 3);
        assert_eq!(w.complete(BatchId(1), &third.worker), Outcome::Accepted);
        w.redo(later, BatchId(1), third.attempt, third.worker);
        assert_eq!(w.take_abandoned(), vec![Abandoned::GaveUp(BatchId(1))]);
        assert!(w.is_idle());
    }
}
