//! Shared measuring helpers for the benchmark programs in `src/bin/`.

use std::time::Duration;

/// Process CPU time (user + system, all threads) since start.
pub fn process_cpu() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}

/// Peak resident set size of this process in bytes (`VmHWM`), or 0 where
/// `/proc` is unavailable.
pub fn peak_rss_bytes() -> u64 {
    proc_status_kib("VmHWM:") * 1024
}

/// Resets the peak-RSS mark (`VmHWM`) to the current RSS, so the next
/// [`peak_rss_bytes`] covers only what follows. Linux only; a no-op elsewhere.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Current resident set size of this process in bytes (`VmRSS`).
pub fn rss_bytes() -> u64 {
    proc_status_kib("VmRSS:") * 1024
}

fn proc_status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

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
