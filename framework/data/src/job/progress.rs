//! Job progress: a bar with texts/s and ETA on a terminal, a log line every
//! few seconds otherwise.

use std::time::{Duration, Instant};

use flotilla::pipeline::{Pipeline, Stage, WorkerKey};
use indicatif::{ProgressBar, ProgressStyle};

use super::Latencies;
use super::meter::JobMeter;

/// How often progress is logged when there is no bar.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// How a job shows its progress.
#[derive(Debug, Clone, Default)]
pub struct ProgressConfig {
    /// A bar on the terminal (else a log line every few seconds).
    pub bar: bool,
    /// Rows in the input, when known: the bar's length and the ETA.
    pub total: Option<u64>,
    /// Where `(rows done or skipped, total)` is published as the job goes.
    pub report: Option<tokio::sync::watch::Sender<(u64, u64)>>,
    /// Where the job keeps its account of its batches (see [`JobMeter`]).
    pub meter: Option<JobMeter>,
}

/// Progress of one run, in rows.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
    last_log: Instant,
    /// Rows written (or refused) by this run.
    rows: u64,
    /// Rows of batches skipped as already done.
    skipped: u64,
    total: Option<u64>,
    /// Where `(done, total)` is published.
    report: Option<tokio::sync::watch::Sender<(u64, u64)>>,
    /// The job's account of its batches.
    meter: JobMeter,
    /// Rows of the errors file the account has seen.
    errors_seen: u64,
    /// Its batches' latencies.
    pub(crate) latencies: Latencies,
}

impl Progress {
    /// Progress as `config` asks.
    pub(crate) fn new(config: ProgressConfig) -> Self {
        let ProgressConfig {
            bar,
            total,
            report,
            meter,
        } = config;
        let meter = meter.unwrap_or_default();
        meter.started();
        let bar = bar.then(|| {
            let b = ProgressBar::new(total.unwrap_or(0));
            let template = if total.is_some() {
                "{bar:40} {pos}/{len} texts  {msg}  ETA {eta}"
            } else {
                "{spinner} {pos} texts  {msg}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                b.set_style(style);
            }
            b
        });
        let p = Self {
            bar,
            started: Instant::now(),
            last_log: Instant::now(),
            rows: 0,
            skipped: 0,
            errors_seen: 0,
            total,
            report,
            meter,
            latencies: Latencies::new(),
        };
        p.publish();
        p
    }

    fn publish(&self) {
        if let Some(r) = &self.report {
            let _ = r.send((self.rows + self.skipped, self.total.unwrap_or(0)));
        }
    }

    fn rate(&self) -> f64 {
        self.rows as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    /// Rows of a batch written: `worker` answered it after `latency`.
    pub(crate) fn written<S: Stage>(
        &mut self,
        rows: usize,
        pipeline: &Pipeline<S>,
        worker: WorkerKey,
        latency: Duration,
    ) {
        self.latencies.record(latency);
        let at = pipeline.node_of(worker).map(|n| (n, u64::from(worker)));
        self.meter.written(rows, at, latency);
        self.done(rows);
    }

    /// Rows refused.
    pub(crate) fn rejected(&mut self, rows: usize) {
        // Counted by the meter from the errors file (see `observe`).
        self.done(rows);
    }

    /// The pipeline as it stands, with every batch read (`read`) or not,
    /// after `restarts` restarts of its actors, and the errors file: its
    /// last rows go with the account when it has more than the account
    /// saw.
    pub(crate) fn observe<S: Stage>(
        &mut self,
        pipeline: &Pipeline<S>,
        restarts: u64,
        read: bool,
        errors: &crate::output::ErrorLog<'_>,
    ) {
        let window = (pipeline.in_flight(), pipeline.max_in_flight());
        self.meter
            .pipeline(window, !read, pipeline.stats(), restarts);
        if errors.rows() != self.errors_seen {
            self.errors_seen = errors.rows();
            self.meter.errors(errors.rows(), errors.tail());
        }
    }

    /// Rows of a batch found complete.
    pub(crate) fn skipped(&mut self, rows: usize) {
        self.meter.skipped(rows);
        self.skipped += rows as u64;
        self.publish();
        if let Some(b) = &self.bar {
            b.inc(rows as u64);
        }
    }

    /// Rows of a batch finished.
    pub(crate) fn done(&mut self, rows: usize) {
        self.rows += rows as u64;
        self.publish();
        let rate = self.rate();
        match &self.bar {
            Some(b) => {
                b.inc(rows as u64);
                b.set_message(format!("{rate:.1} texts/s"));
            }
            None if self.last_log.elapsed() >= LOG_EVERY => {
                self.last_log = Instant::now();
                let seen = self.rows + self.skipped;
                match self.total {
                    Some(total) if rate > 0.0 => {
                        let eta = total.saturating_sub(seen) as f64 / rate;
                        tracing::info!(
                            texts = self.rows,
                            skipped = self.skipped,
                            total,
                            "progress: {rate:.1} texts/s, ETA {eta:.0} s"
                        );
                    }
                    _ => tracing::info!(
                        texts = self.rows,
                        skipped = self.skipped,
                        "progress: {rate:.1} texts/s"
                    ),
                }
            }
            None => {}
        }
    }

    /// Clears the bar.
    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
