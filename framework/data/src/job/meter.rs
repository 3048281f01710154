//! A job's account of its batches as it runs ([`JobStats`]): kept by the
//! job loop (rows, the credit window, retries, restarts, each actor's
//! share) and by the application for what only it sees in an answer
//! ([`BatchWork`]: tokens and the time of each stage at the actor). A
//! detached job's driver sends it to the head with each progress report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla::pipeline::PipelineStats;
use flotilla_proto::job_stats::{ActorStats, Histogram, JobStats, MAX_ACTORS_REPORTED, Retries};

/// What an actor did with one batch, as its answer says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchWork {
    /// Each text's length in tokens (prompt and special tokens included).
    pub lengths: Vec<u32>,
    /// Tokens the model ran over, padding included.
    pub padded_tokens: u64,
    /// How long the actor took to tokenize the batch.
    pub tokenization: Duration,
    /// How long the batch waited at the actor before the model took it.
    pub queue: Duration,
    /// How long the model's forward passes over it took.
    pub inference: Duration,
    /// CPU time the actor spent on it.
    pub cpu: Duration,
}

/// A running job's account, shared by the job and whoever reports it.
#[derive(Clone, Default)]
pub struct JobMeter(Arc<Mutex<State>>);

impl std::fmt::Debug for JobMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobMeter").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    stats: JobStats,
    started: Option<Instant>,
    /// Since when the window has been full while batches wait to be read.
    full_since: Option<Instant>,
    /// Each actor's place in `stats.actors`, by node and worker.
    actors: HashMap<(String, u64), usize>,
    /// Until when each actor (by place) is counted busy: the end of the
    /// last answer counted, so overlapping sends count once.
    busy_until: Vec<Instant>,
    /// CPU microseconds of the actors (reported in milliseconds).
    cpu_us: u64,
}

impl JobMeter {
    /// A new account; `max_length` is the model's longest input in tokens
    /// (the bounds of the input-length histogram, as TEI sets them).
    pub fn new(max_length: usize) -> Self {
        let meter = Self::default();
        meter.with(|s| s.stats.stages.input_length = Histogram::input_lengths(max_length));
        meter
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The account now.
    pub fn snapshot(&self) -> JobStats {
        self.with(|s| {
            let mut stats = s.stats.clone();
            if let Some(at) = s.started {
                stats.elapsed_ms = at.elapsed().as_millis() as u64;
            }
            if let Some(at) = s.full_since {
                stats.credit_wait_ms += at.elapsed().as_millis() as u64;
            }
            stats
        })
    }

    /// An actor's answer to a batch said `work`.
    pub fn work(&self, work: &BatchWork) {
        self.with(|s| {
            let st = &mut s.stats;
            let stages = &mut st.stages;
            let tokens: u64 = work.lengths.iter().map(|&l| u64::from(l)).sum();
            stages.batch_size.record(work.lengths.len() as f64);
            stages.batch_tokens.record(tokens as f64);
            for &l in &work.lengths {
                stages.input_length.record(f64::from(l));
            }
            stages.tokenization.record(work.tokenization.as_secs_f64());
            stages.queue.record(work.queue.as_secs_f64());
            stages.inference.record(work.inference.as_secs_f64());
            st.tokens += tokens;
            st.padded_tokens += work.padded_tokens;
            s.cpu_us += work.cpu.as_micros() as u64;
            s.stats.cpu_ms = s.cpu_us / 1000;
        });
    }

    /// The job's run started.
    pub(crate) fn started(&self) {
        self.with(|s| s.started = Some(Instant::now()));
    }

    /// Rows written; `worker` on `node` answered the batch after `latency`.
    /// An actor is busy while it holds at least one batch: the time its
    /// sends overlap is counted once.
    pub(crate) fn written(&self, rows: usize, at: Option<(&str, u64)>, latency: Duration) {
        let now = Instant::now();
        let sent = now.checked_sub(latency).unwrap_or(now);
        self.with(|s| {
            s.stats.rows_done += rows as u64;
            let Some((node, worker)) = at else { return };
            let len = s.stats.actors.len();
            let i = *s
                .actors
                .entry((node.to_owned(), worker))
                .or_insert(len.min(MAX_ACTORS_REPORTED - 1));
            if i == s.stats.actors.len() {
                s.stats.actors.push(ActorStats {
                    node: node.to_owned(),
                    ..ActorStats::default()
                });
                s.busy_until.push(sent);
            }
            if let (Some(a), Some(until)) = (s.stats.actors.get_mut(i), s.busy_until.get_mut(i)) {
                let from = sent.max(*until);
                a.batches += 1;
                a.busy_ms += now.saturating_duration_since(from).as_millis() as u64;
                *until = now;
            }
        });
    }

    /// Rows found done by an earlier run.
    pub(crate) fn skipped(&self, rows: usize) {
        self.with(|s| s.stats.rows_skipped += rows as u64);
    }

    /// The errors file holds `rows` rows refused (those the model
    /// refused, and those that could not be read), the last of them
    /// `tail`.
    pub(crate) fn errors(&self, rows: u64, tail: Vec<String>) {
        self.with(|s| {
            s.stats.rows_rejected = rows;
            s.stats.errors_tail = tail;
        });
    }

    /// The pipeline as it stands: `in_flight` of `window` batches, full
    /// while batches `wait` to be read, its counters, and the actors
    /// restarted so far.
    pub(crate) fn pipeline(
        &self,
        (in_flight, window): (usize, usize),
        wait: bool,
        p: PipelineStats,
        restarts: u64,
    ) {
        self.with(|s| {
            let st = &mut s.stats;
            st.in_flight = in_flight as u32;
            st.window = window as u32;
            st.retries = Retries {
                deadline: p.deadlines,
                error: p.failures,
                lost: p.lost + p.redispatches,
                hedged: p.hedged,
            };
            st.restarts = restarts;
            let full = wait && in_flight >= window;
            match (full, s.full_since) {
                (true, None) => s.full_since = Some(Instant::now()),
                (false, Some(at)) => {
                    st.credit_wait_ms += at.elapsed().as_millis() as u64;
                    s.full_since = None;
                }
                _ => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_fills_teis_histograms_and_the_token_counts() {
        let meter = JobMeter::new(512);
        meter.work(&BatchWork {
            lengths: vec![3, 10, 600],
            padded_tokens: 1800,
            tokenization: Duration::from_millis(1),
            queue: Duration::from_millis(2),
            inference: Duration::from_millis(30),
            cpu: Duration::from_millis(60),
        });
        let s = meter.snapshot();
        assert_eq!((s.tokens, s.padded_tokens, s.cpu_ms), (613, 1800, 60));
        assert_eq!(s.stages.batch_size.count(), 1);
        assert_eq!(s.stages.input_length.count(), 3);
        // 600 is over the model's 512: counted above every bound.
        assert_eq!(s.stages.input_length.counts.last(), Some(&1));
        assert!((s.stages.inference.sum - 0.03).abs() < 1e-9);
    }

    #[test]
    fn each_actor_is_one_row_and_the_window_wait_is_timed() {
        let meter = JobMeter::new(512);
        meter.started();
        meter.written(4, Some(("w1", 1)), Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(15));
        meter.written(4, Some(("w1", 1)), Duration::from_millis(10));
        // Sent while the one before was out: the overlap counts once.
        meter.written(4, Some(("w1", 1)), Duration::from_millis(1000));
        meter.written(4, Some(("w2", 2)), Duration::from_millis(5));
        meter.written(4, None, Duration::from_millis(5));
        meter.skipped(3);
        meter.errors(1, vec!["{\"line\":7}".into()]);
        let stats = PipelineStats {
            retries: 4,
            redispatches: 1,
            stale: 0,
            hedged: 1,
            deadlines: 1,
            failures: 1,
            lost: 1,
        };
        meter.pipeline((2, 2), true, stats, 1);
        std::thread::sleep(Duration::from_millis(20));
        meter.pipeline((1, 2), true, stats, 1);
        let s = meter.snapshot();
        assert_eq!((s.rows_done, s.rows_skipped, s.rows_rejected), (20, 3, 1));
        assert_eq!(s.errors_tail, ["{\"line\":7}"]);
        assert_eq!(s.actors.len(), 2);
        assert_eq!(s.actors[0].batches, 3);
        assert!(
            (20..25).contains(&s.actors[0].busy_ms),
            "{}",
            s.actors[0].busy_ms
        );
        assert_eq!(s.actors[1].node, "w2");
        assert_eq!(
            s.retries,
            Retries {
                deadline: 1,
                error: 1,
                lost: 2,
                hedged: 1
            }
        );
        assert!(s.credit_wait_ms >= 20, "{}", s.credit_wait_ms);
        assert_eq!((s.in_flight, s.window, s.restarts), (1, 2, 1));
    }
}
