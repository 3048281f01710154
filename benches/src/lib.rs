//! Shared measuring helpers for the benchmark programs in `src/bin/`.

use std::time::Duration;

/// Process CPU time (user + system, all threads) since start.
pub fn process_cpu() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}

pub use flotilla::process::{peak_rss_bytes, reset_peak_rss, rss_bytes};

/// Median of a slice of samples (sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    percentile(samples, 0.5)
}

/// The `p`-quantile (0..=1) of samples, nearest-rank; sorts in place.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[rank]
}
