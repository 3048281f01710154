//! Facts about this process for summaries and benchmarks.

/// Peak resident set size of this process in bytes (`VmHWM`), 0 where
/// `/proc` is unavailable.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// Current resident set size of this process in bytes (`VmRSS`).
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// Current resident set size of process `pid` in bytes, 0 if unknown.
pub fn rss_bytes_of(pid: u32) -> u64 {
    status_kib_of(&format!("/proc/{pid}/status"), "VmRSS:") * 1024
}

/// Resets the peak-RSS mark to the current RSS, so the next
/// [`peak_rss_bytes`] covers only what follows (Linux; a no-op elsewhere).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// A `kB` field of this process's `/proc/self/status` (`RssAnon:`,
/// `RssShmem:`, …), 0 where absent.
pub fn status_kib(key: &str) -> u64 {
    status_kib_of("/proc/self/status", key)
}

/// A `kB` field of the status file at `path` (`/proc/PID/status` of
/// another process, say), 0 where absent.
pub fn status_kib_of(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_is_at_least_current() {
        let current = super::rss_bytes();
        assert!(current > 0, "VmRSS readable on Linux");
        assert!(super::peak_rss_bytes() >= current);
        assert!(super::rss_bytes_of(std::process::id()) > 0);
        assert_eq!(super::rss_bytes_of(u32::MAX), 0);
    }
}
