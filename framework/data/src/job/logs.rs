//! The log lines of the detached jobs whose drivers run in this process,
//! kept per job in a bounded ring until the head has them: the process's
//! log subscriber puts each line logged within a job's span here
//! ([`JobLogs::push`]), and the job's driver sends the new ones with each
//! progress report ([`JobLogs::since`]), so `node jobs logs ID` reads them
//! from the head wherever the driver runs.
//!
//! ```
//! use flotilla_data::job::JobLogs;
//! let logs = JobLogs::default();
//! logs.push("job-1", "12:00:00.000 INFO started".into());
//! logs.push("job-1", "12:00:01.000 INFO 64 texts".into());
//! let (lines, next) = logs.since("job-1", 1, 1 << 16);
//! assert_eq!((lines, next), (vec!["12:00:01.000 INFO 64 texts".to_owned()], 2));
//! assert_eq!(logs.since("job-2", 0, 1 << 16), (Vec::<String>::new(), 0));
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Lines kept per job.
pub const LINES_KEPT: usize = 2000;
/// Bytes of lines kept per job.
pub const BYTES_KEPT: usize = 512 * 1024;
/// Jobs kept at once (the least recently written goes first).
pub const JOBS_KEPT: usize = 64;
/// The longest line kept (longer ones are cut, marked `…`).
pub const MAX_LINE: usize = 4096;

/// The log lines of this process's detached jobs, by job id.
#[derive(Clone, Default)]
pub struct JobLogs(Arc<Mutex<Inner>>);

impl std::fmt::Debug for JobLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobLogs").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    jobs: HashMap<String, Ring>,
    /// Job ids, least recently written first.
    order: VecDeque<String>,
}

#[derive(Default)]
struct Ring {
    /// `(number, line)`, oldest first.
    lines: VecDeque<(u64, String)>,
    next: u64,
    bytes: usize,
}

impl JobLogs {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Keeps `line` of job `job`, the oldest lines going past
    /// [`LINES_KEPT`] or [`BYTES_KEPT`].
    pub fn push(&self, job: &str, mut line: String) {
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        self.with(|inner| {
            if let Some(at) = inner.order.iter().position(|j| j == job) {
                inner.order.remove(at);
            } else if inner.order.len() >= JOBS_KEPT
                && let Some(oldest) = inner.order.pop_front()
            {
                inner.jobs.remove(&oldest);
            }
            inner.order.push_back(job.to_owned());
            let ring = inner.jobs.entry(job.to_owned()).or_default();
            ring.bytes += line.len();
            ring.lines.push_back((ring.next, line));
            ring.next += 1;
            while ring.lines.len() > LINES_KEPT || ring.bytes > BYTES_KEPT {
                match ring.lines.pop_front() {
                    Some((_, gone)) => ring.bytes -= gone.len(),
                    None => break,
                }
            }
        });
    }

    /// Job `job`'s lines numbered `after` and later that are still kept,
    /// at most `max_bytes` of them (at least one), and the number of the
    /// line after the last one given.
    pub fn since(&self, job: &str, after: u64, max_bytes: usize) -> (Vec<String>, u64) {
        self.with(|inner| {
            let Some(ring) = inner.jobs.get(job) else {
                return (Vec::new(), after);
            };
            let (mut out, mut next, mut bytes) = (Vec::new(), after.max(ring.first()), 0);
            for (n, line) in ring.lines.iter().filter(|(n, _)| *n >= after) {
                if !out.is_empty() && bytes + line.len() > max_bytes {
                    break;
                }
                bytes += line.len();
                out.push(line.clone());
                next = n + 1;
            }
            (out, next)
        })
    }
}

impl Ring {
    /// The number of the oldest line kept.
    fn first(&self) -> u64 {
        self.lines.front().map_or(self.next, |(n, _)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_newest_lines_within_its_bounds() {
        let logs = JobLogs::default();
        for i in 0..LINES_KEPT + 10 {
            logs.push("j", format!("line {i}"));
        }
        let (lines, next) = logs.since("j", 0, usize::MAX);
        assert_eq!(lines.len(), LINES_KEPT);
        assert_eq!(lines[0], "line 10");
        assert_eq!(next, (LINES_KEPT + 10) as u64);
        // Read in pieces of at most 20 bytes (one line at least).
        let (piece, next) = logs.since("j", 100, 20);
        assert_eq!(piece, vec!["line 100", "line 101"]);
        assert_eq!(next, 102);
        let (one, _) = logs.since("j", 100, 1);
        assert_eq!(one, vec!["line 100"]);
        // Nothing new: the same place.
        assert_eq!(logs.since("j", next + 5000, 100), (vec![], next + 5000));
    }

    #[test]
    fn long_lines_are_cut_and_old_jobs_forgotten() {
        let logs = JobLogs::default();
        logs.push("j", "é".repeat(MAX_LINE));
        let (lines, _) = logs.since("j", 0, usize::MAX);
        assert!(lines[0].len() <= MAX_LINE + '…'.len_utf8() && lines[0].ends_with('…'));
        for i in 0..JOBS_KEPT {
            logs.push(&format!("k{i}"), "x".into());
        }
        assert!(logs.since("j", 0, 100).0.is_empty());
        assert_eq!(logs.since("k0", 0, 100).0, vec!["x"]);
    }
}
