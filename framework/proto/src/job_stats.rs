//! What a running batch job reports of itself beyond its count of rows,
//! and how the head shows every job's account on `/metrics`.
//!
//! A job's driver keeps a [`JobStats`] as its batches go (rows by outcome,
//! tokens, the credit window, retries by reason, restarts, each actor's
//! share, the time of each stage in histograms) and sends it with each
//! [`crate::jobs::JobProgress`]. The head keeps the last one of each job
//! and renders them all ([`render`]) in the Prometheus text format, with
//! the names of Text Embeddings Inference where the meaning is the same (a
//! "request" there is a batch here) and their buckets, labelled by job.
//!
//! ```text
//! driver: batches ─► JobStats ─► JobProgress ─► head: JobMetrics ─► render ─► /metrics
//! ```

// rkyv's derive emits undocumented public helper items; every type
// written here is documented by hand.
#![allow(missing_docs)]

use std::fmt::Write as _;

use rkyv::{Archive, Deserialize, Serialize};

use crate::ids::JobId;
use crate::job_state::JobState;

/// Actors a report lists at most (the others are summed in the last row).
pub const MAX_ACTORS_REPORTED: usize = 256;

/// How long the head keeps showing an ended job's series on `/metrics`.
pub const ENDED_SERIES_KEPT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The resource label a node's price per hour is published under (`node
/// join --price-per-hour`).
pub const PRICE_LABEL: &str = "price_per_hour";

/// What a job has cost so far: an hour of each node its actors ran on, at
/// that node's price (`price_of`), for each hour of the driver's run.
/// `None` when no such node has a price.
pub fn cost(stats: &JobStats, price_of: impl Fn(&str) -> Option<f64>) -> Option<f64> {
    let mut nodes: Vec<&str> = stats.actors.iter().map(|a| a.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let prices: Vec<f64> = nodes.into_iter().filter_map(price_of).collect();
    let hours = stats.elapsed_ms as f64 / 3_600_000.0;
    (!prices.is_empty()).then(|| prices.iter().sum::<f64>() * hours)
}

/// A cost per million of `tokens`, when there were any.
pub fn per_million_tokens(cost: f64, tokens: u64) -> Option<f64> {
    (tokens > 0).then(|| cost * 1e6 / tokens as f64)
}

/// A histogram with fixed upper bounds: `counts[i]` is the number of
/// values at most `bounds[i]` and above the bound before; the last count
/// is those above every bound.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    /// Upper bounds, increasing.
    pub bounds: Vec<f64>,
    /// One count per bound, then the count above them all.
    pub counts: Vec<u64>,
    /// The sum of the values recorded.
    pub sum: f64,
}

impl Histogram {
    /// An empty histogram over `bounds` (increasing).
    pub fn new(bounds: Vec<f64>) -> Self {
        let counts = vec![0; bounds.len() + 1];
        Self {
            bounds,
            counts,
            sum: 0.0,
        }
    }

    /// TEI's duration buckets, in seconds: 35 bounds from 15 µs, each 1.5
    /// times the one before.
    pub fn durations() -> Self {
        let mut bounds = Vec::with_capacity(35);
        let mut value = 0.00001;
        for _ in 0..35 {
            value *= 1.5;
            bounds.push(value);
        }
        Self::new(bounds)
    }

    /// Powers of two from 1 to `2^top`, as TEI buckets sizes and lengths.
    pub fn powers_of_two(top: u32) -> Self {
        Self::new((0..=top).map(|x| f64::from(2u32.pow(x))).collect())
    }

    /// TEI's bounds for texts per batch (`te_batch_next_size`): 1 to 4,096.
    pub fn batch_sizes() -> Self {
        Self::powers_of_two(12)
    }

    /// TEI's bounds for tokens per batch (`te_batch_next_tokens`): 1 to
    /// 2^20.
    pub fn batch_tokens() -> Self {
        Self::powers_of_two(20)
    }

    /// TEI's bounds for a text's length in tokens
    /// (`te_request_input_length`): powers of two up to the model's
    /// `max_length`.
    pub fn input_lengths(max_length: usize) -> Self {
        let top = (0..20u32)
            .take_while(|&x| (1usize << x) <= max_length.max(1))
            .last()
            .unwrap_or(0);
        Self::powers_of_two(top)
    }

    /// Records `value`.
    pub fn record(&mut self, value: f64) {
        let i = self.bounds.partition_point(|&b| b < value);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += value;
    }

    /// Adds `other`'s counts (of the same bounds; a histogram of other
    /// bounds is taken whole when this one is empty, else ignored).
    pub fn merge(&mut self, other: &Histogram) {
        if self.bounds != other.bounds {
            if self.count() == 0 {
                *self = other.clone();
            }
            return;
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum += other.sum;
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// An estimate of the `q`-quantile (0..=1): the upper bound of the
    /// bucket it falls in (the last bound for the overflow), 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let total = self.count();
        if total == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return self
                    .bounds
                    .get(i)
                    .or(self.bounds.last())
                    .copied()
                    .unwrap_or(0.0);
            }
        }
        self.bounds.last().copied().unwrap_or(0.0)
    }
}

/// The time and shape of a job's batches, under TEI's names.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Stages {
    /// Texts per batch (`te_batch_next_size`).
    pub batch_size: Histogram,
    /// Real tokens per batch (`te_batch_next_tokens`).
    pub batch_tokens: Histogram,
    /// Tokens per text (`te_request_input_length`).
    pub input_length: Histogram,
    /// Seconds an actor took to tokenize a batch
    /// (`te_request_tokenization_duration`).
    pub tokenization: Histogram,
    /// Seconds a batch waited at its actor before the model took it
    /// (`te_request_queue_duration`).
    pub queue: Histogram,
    /// Seconds of the model's forward passes over a batch
    /// (`te_request_inference_duration`).
    pub inference: Histogram,
}

impl Default for Stages {
    fn default() -> Self {
        Self {
            batch_size: Histogram::batch_sizes(),
            batch_tokens: Histogram::batch_tokens(),
            input_length: Histogram::input_lengths(512),
            tokenization: Histogram::durations(),
            queue: Histogram::durations(),
            inference: Histogram::durations(),
        }
    }
}

/// Sends of a batch after its first, by why.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retries {
    /// Its deadline passed.
    pub deadline: u64,
    /// Its actor answered with an error, or an answer that could not be
    /// used.
    pub error: u64,
    /// Its actor's member was lost, or the actor dropped it unanswered.
    pub lost: u64,
    /// It straggled and was sent a second time to an idle actor.
    pub hedged: u64,
}

/// One actor's share of a job.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ActorStats {
    /// The member it runs on.
    pub node: String,
    /// Batches it completed.
    pub batches: u64,
    /// Milliseconds it spent on them (from the driver's send to its
    /// answer).
    pub busy_ms: u64,
}

/// A batch job's account of itself, as its driver reports it. Counts are
/// of the driver's current run (a driver started again counts anew, from
/// what it finds done).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct JobStats {
    /// Rows written by this run.
    pub rows_done: u64,
    /// Rows found done by an earlier run.
    pub rows_skipped: u64,
    /// Rows refused: the rows of the errors file (those the actors
    /// refused, and those that could not be read).
    pub rows_rejected: u64,
    /// Real tokens embedded (prompt and special tokens included).
    pub tokens: u64,
    /// Tokens the model ran over, padding included.
    pub padded_tokens: u64,
    /// Batches in flight now.
    pub in_flight: u32,
    /// The credit window: batches allowed in flight at once.
    pub window: u32,
    /// Milliseconds the reader waited with the window full.
    pub credit_wait_ms: u64,
    /// Sends after a batch's first, by why.
    pub retries: Retries,
    /// Actors restarted by their supervisor.
    pub restarts: u64,
    /// CPU milliseconds the actors spent on the job's batches.
    pub cpu_ms: u64,
    /// Milliseconds the driver's current run has taken.
    pub elapsed_ms: u64,
    /// Each actor's share, at most [`MAX_ACTORS_REPORTED`].
    pub actors: Vec<ActorStats>,
    /// The time and shape of its batches.
    pub stages: Stages,
    /// The last rows refused, as the errors file has them (a JSON line
    /// each, cut to [`ERROR_LINE_SHOWN`] bytes), at most [`ERRORS_SHOWN`],
    /// oldest first.
    pub errors_tail: Vec<String>,
}

/// Rows refused a job's account shows ([`JobStats::errors_tail`]).
pub const ERRORS_SHOWN: usize = 20;

/// Bytes of a refused row's line the account keeps.
pub const ERROR_LINE_SHOWN: usize = 1024;

/// The first `max` bytes of `line` (fewer, to end at a character's
/// boundary): how long lines are cut for an account or a page.
///
/// ```
/// use flotilla_proto::job_stats::clip;
/// assert_eq!(clip("héllo", 2), "h");
/// assert_eq!(clip("héllo", 3), "hé");
/// assert_eq!(clip("hi", 10), "hi");
/// ```
pub fn clip(line: &str, max: usize) -> &str {
    let mut end = line.len().min(max);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// A job's count at one moment, for its rates over time.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Seconds before the answer it was taken.
    pub ago_s: u32,
    /// Rows done (written this run).
    pub rows: u64,
    /// Real tokens embedded.
    pub tokens: u64,
}

/// How often the head keeps a sample of a running job's counts.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Samples the head keeps per job: an hour's.
pub const SAMPLES_KEPT: usize = 360;

/// One job's account on the head: what `/metrics` and the dashboard show.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobMetrics {
    /// Its id.
    pub id: JobId,
    /// What it does (for the embed job, its input and output).
    pub description: String,
    /// The certificate that submitted it.
    pub owner: Option<String>,
    /// Where it is.
    pub state: JobState,
    /// Rows done (written or found done) and in all (0: not known).
    pub done: u64,
    /// Rows in all (0: not known yet).
    pub total: u64,
    /// Its driver's restarts.
    pub restarts: u32,
    /// Seconds since it was submitted (to the head that runs it now).
    pub age_s: f64,
    /// Seconds since its count of rows last grew (0 while none was
    /// reported yet).
    pub since_progress_s: f64,
    /// Seconds since it ended, once it has.
    pub ended_s: Option<f64>,
    /// What it has cost so far ([`cost`]), when its nodes have a price.
    pub cost: Option<f64>,
    /// What its driver last reported.
    pub stats: JobStats,
    /// Its counts over the last hour, oldest first, one every
    /// [`SAMPLE_EVERY`] (only when one job's account is asked for).
    pub history: Vec<Sample>,
}

impl JobMetrics {
    /// Rows per second over the driver's current run.
    pub fn rows_per_s(&self) -> f64 {
        per_s(self.stats.rows_done, self.stats.elapsed_ms)
    }

    /// Real tokens per second over the driver's current run.
    pub fn tokens_per_s(&self) -> f64 {
        per_s(self.stats.tokens, self.stats.elapsed_ms)
    }

    /// Seconds left at the current rate, when the total and a rate are
    /// known.
    pub fn eta_s(&self) -> Option<f64> {
        let rate = self.rows_per_s();
        (self.total > 0 && rate > 0.0 && !self.state.is_end())
            .then(|| self.total.saturating_sub(self.done) as f64 / rate)
    }
}

fn per_s(n: u64, ms: u64) -> f64 {
    if ms == 0 {
        0.0
    } else {
        n as f64 * 1000.0 / ms as f64
    }
}

/// A metric family: its name, type and help line.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const fn family(name: &'static str, kind: &'static str, help: &'static str) -> Family {
    Family { name, kind, help }
}

/// The per-job families, in the order they are rendered.
const ROWS: Family = family(
    "flotilla_job_rows_total",
    "counter",
    "Rows of a job by outcome (done, skipped as done before, rejected)",
);
const TOKENS: Family = family(
    "flotilla_job_tokens_total",
    "counter",
    "Tokens of a job's texts (real), and those the model ran over (padded)",
);
const IN_FLIGHT: Family = family(
    "flotilla_job_batches_in_flight",
    "gauge",
    "Batches of a job in flight now",
);
const WINDOW: Family = family(
    "flotilla_job_credit_window",
    "gauge",
    "Batches a job may have in flight at once",
);
const CREDIT_WAIT: Family = family(
    "flotilla_job_credit_wait_seconds_total",
    "counter",
    "Seconds a job's reader waited with its credit window full",
);
const RETRIES: Family = family(
    "flotilla_job_retries_total",
    "counter",
    "Sends of a job's batches after their first, by reason",
);
const RESTARTS: Family = family(
    "flotilla_job_actor_restarts_total",
    "counter",
    "A job's actors restarted by their supervisor (reason: crash), and its driver restarted by the head (reason: driver)",
);
const BUSY: Family = family(
    "flotilla_job_actor_busy_ratio",
    "gauge",
    "Share of the job's run its actors on a node spent on their batches (their mean; each actor's is on the dashboard)",
);
const STATE: Family = family(
    "flotilla_job_state",
    "gauge",
    "1 for a job's state, 0 for the others",
);
const ETA: Family = family(
    "flotilla_job_eta_seconds",
    "gauge",
    "Seconds a job has left at its current rate (absent when not known)",
);
const STALLED: Family = family(
    "flotilla_job_seconds_since_progress",
    "gauge",
    "Seconds since a running job's count of rows last grew",
);
const CPU: Family = family(
    "flotilla_job_cpu_seconds_total",
    "counter",
    "CPU seconds a job's actors spent on its batches",
);
const COST: Family = family(
    "flotilla_job_cost",
    "gauge",
    "What a job has cost so far, at its nodes' price per hour (absent when none has one)",
);
/// Which histogram of a job's stages a family shows.
type Pick = fn(&Stages) -> &Histogram;

/// TEI's histograms: name, help, and which of a job's stages each shows.
const TEI: [(&str, &str, Pick); 6] = [
    ("te_batch_next_size", "Batch size", |s| &s.batch_size),
    (
        "te_batch_next_tokens",
        "Number of tokens in the batch",
        |s| &s.batch_tokens,
    ),
    ("te_request_input_length", "Input length", |s| {
        &s.input_length
    }),
    (
        "te_request_tokenization_duration",
        "Request tokenization duration",
        |s| &s.tokenization,
    ),
    ("te_request_queue_duration", "Request queue duration", |s| {
        &s.queue
    }),
    (
        "te_request_inference_duration",
        "Request inference duration",
        |s| &s.inference,
    ),
];

const STATES: [JobState; 4] = [
    JobState::Pending,
    JobState::Running,
    JobState::Succeeded,
    JobState::Failed,
];

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders `jobs` in the Prometheus text format: one block per family,
/// each job's series labelled `job="…"`. A family with no series is left
/// out.
pub fn render(jobs: &[JobMetrics], out: &mut String) {
    let line = |out: &mut String, f: &Family| {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
    };
    let series = |out: &mut String, f: &Family, each: &dyn Fn(&JobMetrics, &str, &mut String)| {
        if jobs.is_empty() {
            return;
        }
        line(out, f);
        for j in jobs {
            each(j, &escape(&j.id), out);
        }
    };
    series(out, &ROWS, &|j, id, out| {
        let s = &j.stats;
        let rows = [
            ("done", s.rows_done),
            ("skipped", s.rows_skipped),
            ("rejected", s.rows_rejected),
        ];
        by(out, ROWS.name, id, "outcome", &rows);
    });
    series(out, &TOKENS, &|j, id, out| {
        let tokens = [("real", j.stats.tokens), ("padded", j.stats.padded_tokens)];
        by(out, TOKENS.name, id, "kind", &tokens);
    });
    series(out, &IN_FLIGHT, &|j, id, out| {
        one(out, IN_FLIGHT.name, id, f64::from(j.stats.in_flight));
    });
    series(out, &WINDOW, &|j, id, out| {
        one(out, WINDOW.name, id, f64::from(j.stats.window));
    });
    series(out, &CREDIT_WAIT, &|j, id, out| {
        one(
            out,
            CREDIT_WAIT.name,
            id,
            j.stats.credit_wait_ms as f64 / 1000.0,
        );
    });
    series(out, &RETRIES, &|j, id, out| {
        let r = &j.stats.retries;
        let reasons = [
            ("deadline", r.deadline),
            ("error", r.error),
            ("lost", r.lost),
            ("hedged", r.hedged),
        ];
        by(out, RETRIES.name, id, "reason", &reasons);
    });
    series(out, &RESTARTS, &|j, id, out| {
        let reasons = [
            ("crash", j.stats.restarts),
            ("driver", u64::from(j.restarts)),
        ];
        by(out, RESTARTS.name, id, "reason", &reasons);
    });
    series(out, &BUSY, &|j, id, out| {
        let elapsed = j.stats.elapsed_ms.max(1) as f64;
        // By node: one series per node the job ran on, not per actor.
        let mut nodes: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
        for a in &j.stats.actors {
            let (busy, actors) = nodes.entry(a.node.as_str()).or_default();
            *busy += a.busy_ms;
            *actors += 1;
        }
        for (node, (busy, actors)) in nodes {
            let ratio = busy as f64 / actors as f64 / elapsed;
            let node = escape(node);
            let _ = writeln!(out, "{}{{job=\"{id}\",node=\"{node}\"}} {ratio}", BUSY.name);
        }
    });
    series(out, &STATE, &|j, id, out| {
        let states = STATES.map(|s| (s.as_str(), u64::from(s == j.state)));
        by(out, STATE.name, id, "state", &states);
    });
    if jobs.iter().any(|j| j.eta_s().is_some()) {
        line(out, &ETA);
        for j in jobs {
            if let Some(eta) = j.eta_s() {
                one(out, ETA.name, &escape(&j.id), eta);
            }
        }
    }
    if jobs.iter().any(|j| j.cost.is_some()) {
        line(out, &COST);
        for j in jobs {
            if let Some(cost) = j.cost {
                one(out, COST.name, &escape(&j.id), cost);
            }
        }
    }
    series(out, &STALLED, &|j, id, out| {
        one(out, STALLED.name, id, j.since_progress_s);
    });
    series(out, &CPU, &|j, id, out| {
        one(out, CPU.name, id, j.stats.cpu_ms as f64 / 1000.0);
    });
    for (name, help, of) in TEI {
        let f = family(name, "histogram", help);
        series(out, &f, &|j, id, out| {
            histogram(out, name, id, of(&j.stats.stages))
        });
    }
}

/// One job's series `name{job="id"} value`.
fn one(out: &mut String, name: &str, id: &str, value: f64) {
    let _ = writeln!(out, "{name}{{job=\"{id}\"}} {value}");
}

/// One job's series `name{job="id",label="…"} n`, one per value.
fn by(out: &mut String, name: &str, id: &str, label: &str, values: &[(&str, u64)]) {
    for (v, n) in values {
        let _ = writeln!(out, "{name}{{job=\"{id}\",{label}=\"{v}\"}} {n}");
    }
}

/// One job's histogram: cumulative buckets, `+Inf`, sum and count.
fn histogram(out: &mut String, name: &str, id: &str, h: &Histogram) {
    let mut seen = 0;
    for (bound, c) in h.bounds.iter().zip(&h.counts) {
        seen += c;
        let _ = writeln!(out, "{name}_bucket{{job=\"{id}\",le=\"{bound}\"}} {seen}");
    }
    let count = h.count();
    let _ = writeln!(out, "{name}_bucket{{job=\"{id}\",le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{job=\"{id}\"}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{job=\"{id}\"}} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, state: JobState) -> JobMetrics {
        let mut stats = JobStats {
            rows_done: 90,
            rows_skipped: 10,
            rows_rejected: 1,
            tokens: 1200,
            padded_tokens: 1500,
            in_flight: 2,
            window: 4,
            credit_wait_ms: 1500,
            retries: Retries {
                deadline: 1,
                error: 2,
                lost: 3,
                hedged: 4,
            },
            restarts: 1,
            cpu_ms: 2500,
            elapsed_ms: 10_000,
            // Two actors on one node: one series, their mean.
            actors: vec![
                ActorStats {
                    node: "w\"1".into(),
                    batches: 3,
                    busy_ms: 5000,
                },
                ActorStats {
                    node: "w\"1".into(),
                    batches: 1,
                    busy_ms: 1000,
                },
            ],
            errors_tail: vec!["{\"line\":3}".into()],
            stages: Stages::default(),
        };
        stats.stages.batch_size.record(3.0);
        stats.stages.batch_size.record(64.0);
        stats.stages.inference.record(0.02);
        JobMetrics {
            id: JobId::new(id),
            description: "embed a -> b".into(),
            history: Vec::new(),
            owner: Some("alice".into()),
            state,
            done: 100,
            total: 190,
            restarts: 2,
            age_s: 12.0,
            since_progress_s: 0.5,
            ended_s: None,
            cost: Some(0.25),
            stats,
        }
    }

    #[test]
    fn tei_buckets_are_teis() {
        let d = Histogram::durations();
        assert_eq!(d.bounds.len(), 35);
        assert!((d.bounds[0] - 0.000015).abs() < 1e-12);
        assert!((d.bounds[34] / d.bounds[33] - 1.5).abs() < 1e-9);
        assert_eq!(Histogram::batch_sizes().bounds.last(), Some(&4096.0));
        assert_eq!(Histogram::batch_tokens().bounds.len(), 21);
        // Up to the model's length, as TEI filters them.
        assert_eq!(Histogram::input_lengths(512).bounds.last(), Some(&512.0));
        assert_eq!(Histogram::input_lengths(8192).bounds.last(), Some(&8192.0));
        assert_eq!(Histogram::input_lengths(500).bounds.last(), Some(&256.0));
    }

    #[test]
    fn a_histogram_counts_each_value_in_the_first_bucket_that_holds_it() {
        let mut h = Histogram::new(vec![1.0, 2.0, 4.0]);
        for v in [0.5, 1.0, 1.5, 4.0, 9.0] {
            h.record(v);
        }
        assert_eq!(h.counts, vec![2, 1, 1, 1]);
        assert_eq!(h.count(), 5);
        assert!((h.sum - 16.0).abs() < 1e-9);
        assert_eq!(h.quantile(0.4), 1.0);
        assert_eq!(h.quantile(0.6), 2.0);
        assert_eq!(h.quantile(1.0), 4.0);
        let mut sum = Histogram::new(vec![1.0, 2.0, 4.0]);
        sum.merge(&h);
        sum.merge(&h);
        assert_eq!(sum.counts, vec![4, 2, 2, 2]);
        // A histogram of other bounds is not added to a non-empty one.
        sum.merge(&Histogram::new(vec![3.0]));
        assert_eq!(sum.count(), 10);
    }

    #[test]
    fn every_family_is_rendered_once_with_each_jobs_series() {
        let jobs = [job("j1", JobState::Running), job("j2", JobState::Succeeded)];
        let mut out = String::new();
        render(&jobs, &mut out);
        for (name, kind) in [
            &ROWS,
            &TOKENS,
            &IN_FLIGHT,
            &WINDOW,
            &CREDIT_WAIT,
            &RETRIES,
            &RESTARTS,
            &BUSY,
            &STATE,
            &ETA,
            &COST,
            &STALLED,
            &CPU,
        ]
        .into_iter()
        .map(|f| (f.name, f.kind))
        .chain(TEI.iter().map(|(name, _, _)| (*name, "histogram")))
        {
            let ty = format!("# TYPE {name} {kind}\n");
            assert_eq!(out.matches(&ty).count(), 1, "{ty}");
        }
        assert!(out.contains("flotilla_job_rows_total{job=\"j1\",outcome=\"done\"} 90\n"));
        assert!(out.contains("flotilla_job_retries_total{job=\"j2\",reason=\"hedged\"} 4\n"));
        assert!(out.contains("flotilla_job_credit_wait_seconds_total{job=\"j1\"} 1.5\n"));
        assert!(out.contains("flotilla_job_state{job=\"j2\",state=\"succeeded\"} 1\n"));
        assert!(out.contains("flotilla_job_state{job=\"j2\",state=\"running\"} 0\n"));
        assert!(out.contains("flotilla_job_actor_busy_ratio{job=\"j1\",node=\"w\\\"1\"} 0.3\n"));
        assert_eq!(
            out.matches("flotilla_job_actor_busy_ratio{job=\"j1\"")
                .count(),
            1
        );
        // 90 rows in 10 s, 90 left: 10 s; none for the job that ended.
        assert!(out.contains("flotilla_job_eta_seconds{job=\"j1\"} 10\n"));
        assert!(!out.contains("flotilla_job_eta_seconds{job=\"j2\"}"));
        // Cumulative buckets, then +Inf, sum and count.
        assert!(out.contains("te_batch_next_size_bucket{job=\"j1\",le=\"2\"} 0\n"));
        assert!(out.contains("te_batch_next_size_bucket{job=\"j1\",le=\"4\"} 1\n"));
        assert!(out.contains("te_batch_next_size_bucket{job=\"j1\",le=\"64\"} 2\n"));
        assert!(out.contains("te_batch_next_size_bucket{job=\"j1\",le=\"+Inf\"} 2\n"));
        assert!(out.contains("te_batch_next_size_sum{job=\"j1\"} 67\n"));
        assert!(out.contains("te_batch_next_size_count{job=\"j1\"} 2\n"));
        assert!(out.contains("# TYPE te_request_inference_duration histogram\n"));
        let mut none = String::new();
        render(&[], &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn a_job_costs_each_priced_node_its_actors_ran_on_for_its_hours() {
        let mut s = JobStats {
            elapsed_ms: 1_800_000,
            ..JobStats::default()
        };
        assert_eq!(cost(&s, |_| Some(1.0)), None);
        for node in ["a", "a", "b", "c"] {
            s.actors.push(ActorStats {
                node: node.into(),
                ..ActorStats::default()
            });
        }
        let price = |n: &str| match n {
            "a" => Some(2.0),
            "b" => Some(0.5),
            _ => None,
        };
        // Half an hour of a (2.0) and b (0.5); c has no price.
        assert_eq!(cost(&s, price), Some(1.25));
        assert_eq!(cost(&s, |_| None), None);
        assert_eq!(per_million_tokens(1.25, 2_500_000), Some(0.5));
        assert_eq!(per_million_tokens(1.25, 0), None);
    }

    #[test]
    fn rates_and_eta_come_from_the_drivers_run() {
        let j = job("j", JobState::Running);
        assert!((j.rows_per_s() - 9.0).abs() < 1e-9);
        assert!((j.tokens_per_s() - 120.0).abs() < 1e-9);
        assert_eq!(j.eta_s(), Some(10.0));
        let mut unknown = j.clone();
        unknown.total = 0;
        assert_eq!(unknown.eta_s(), None);
    }
}
