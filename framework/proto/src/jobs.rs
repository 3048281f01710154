//! Detached jobs: an actor of a registered kind that the head runs in a
//! placement-group bundle of its own, under a supervisor on the head, so
//! the job outlives the node that submitted it and the node it runs on.
//! The head asks the job's actor for its progress; a job that reports an
//! end (succeeded or failed) is stopped and its bundle released.
//!
//! ```text
//!  submit ─► Pending ── actor started ──► Running ── reports an end ──► Succeeded | Failed
//!               ▲                            │ its node lost / it failed
//!               └──── restarted in its bundle (moved to another node) ◄┘
//!  the supervisor gives up, or stop: Failed
//! ```
//!
//! A [`JobRecord`] is the head's account of one job; its transitions take
//! what the supervisor and the actor said, and never move out of an end.

// rkyv's derive emits undocumented public helper items for enums with
// struct variants; every type written here is documented by hand.
#![allow(missing_docs)]

use rkyv::{Archive, Deserialize, Serialize};

use crate::groups::GroupView;
use crate::ids::{GroupId, JobId, MemberName};
use crate::placement::Resources;

pub use crate::job_state::JobState;

/// What a job actor says of itself.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobProgress {
    /// `Running`, or its end.
    pub state: JobState,
    /// Units done (texts, for the embed job).
    pub done: u64,
    /// Units in all, when known (0 otherwise).
    pub total: u64,
    /// A summary of its end, or why it failed.
    pub detail: String,
    /// The placement groups the job's own work runs in (the embed job's
    /// actors), by id.
    pub groups: Vec<GroupId>,
    /// Its account of its batches (empty for a job that keeps none).
    pub stats: crate::job_stats::JobStats,
    /// Its driver's log lines since its last report.
    pub log: Vec<String>,
}

/// A job to submit.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// The registered kind of its actor (registered on every node it may
    /// land on).
    pub kind: String,
    /// The actor's arguments, an rkyv archive of the kind's `Arguments`.
    pub args: Vec<u8>,
    /// The message type of the kind's actors (`std::any::type_name`).
    pub message_type: String,
    /// What its bundle reserves.
    pub resources: Resources,
    /// A line saying what it does, for `node jobs`.
    pub description: String,
    /// Restarts allowed within a minute before the job fails.
    pub max_restarts: u32,
}

/// Largest job description a head takes (its kind, arguments, message
/// type, resources and description together), in bytes: 1 MiB. A job's
/// arguments name where its data is; the data itself never travels in
/// them.
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// Jobs one certificate may have running (not ended) at once on a head.
pub const MAX_RUNNING_PER_PRINCIPAL: usize = 64;

impl JobSpec {
    /// The size the head counts against [`MAX_SPEC_BYTES`].
    pub fn size(&self) -> usize {
        self.kind.len()
            + self.args.len()
            + self.message_type.len()
            + self.description.len()
            + self.resources.keys().map(|k| k.len() + 8).sum::<usize>()
    }

    /// Why a head refuses the job as submitted: over [`MAX_SPEC_BYTES`], or
    /// naming no kind.
    pub fn check(&self) -> Result<(), String> {
        if self.kind.is_empty() {
            return Err("a job names the kind of its actor".into());
        }
        let size = self.size();
        if size > MAX_SPEC_BYTES {
            return Err(format!(
                "NODE-JOB-010: the job's description is {size} bytes, more than the {MAX_SPEC_BYTES} a head takes (name where the data is; do not carry it)"
            ));
        }
        Ok(())
    }
}

/// A job as `node jobs` shows it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobView {
    /// Its id.
    pub id: JobId,
    /// What it does.
    pub description: String,
    /// The certificate that submitted it (`None`: the head itself): it,
    /// an admin or the head may stop it.
    pub owner: Option<String>,
    /// Where it is.
    pub state: JobState,
    /// Units done.
    pub done: u64,
    /// Units in all (0: not known yet).
    pub total: u64,
    /// The node its actor runs on, while it runs.
    pub node: Option<MemberName>,
    /// Its actor's restarts.
    pub restarts: u32,
    /// The group of its own bundle (where its actor runs).
    pub group: Option<GroupView>,
    /// The groups its work runs in (ids; see [`JobView::work`]).
    pub work_groups: Vec<GroupId>,
    /// Those groups, with the node of each bundle, as the head has them.
    pub work: Vec<GroupView>,
    /// Its end's summary, or why it failed.
    pub detail: Option<String>,
}

/// A request about jobs, served by the head.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum JobsRequest {
    /// Run a job.
    Submit(JobSpec),
    /// Every job.
    List,
    /// One job.
    Get(JobId),
    /// Stop a job (it fails, "stopped").
    Stop(JobId),
    /// The accounts of the jobs from the `from`-th (oldest first), at
    /// most `limit` of them.
    Metrics {
        /// The first job's place.
        from: u32,
        /// Jobs at most.
        limit: u32,
    },
    /// One job's account, with its counts over the last hour.
    Account(JobId),
    /// A job's driver log, from line `after` (numbered by the head).
    Logs {
        /// The job.
        id: JobId,
        /// The first line wanted.
        after: u64,
    },
}

/// The head's answer.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum JobsReply {
    /// The new job's id.
    Submitted(JobId),
    /// Every job, oldest first.
    Jobs(Vec<JobView>),
    /// The job, if it exists.
    Job(Option<Box<JobView>>),
    /// Whether a job was stopped (false: unknown or over).
    Stopped(bool),
    /// The jobs' accounts asked for, oldest first.
    Metrics(Vec<crate::job_stats::JobMetrics>),
    /// The job's account, if the head knows the job.
    Account(Option<Box<crate::job_stats::JobMetrics>>),
    /// Lines of a job's driver log (`None`: the head knows no such job).
    Logs(Option<LogPage>),
    /// The submission is refused (why).
    Invalid(String),
    /// The receiving node serves no jobs (it is not the head, or the head
    /// runs none).
    NotServed,
}

/// Lines of a job's driver log, as the head keeps them.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LogPage {
    /// The lines, oldest first.
    pub lines: Vec<String>,
    /// The number of the line after the last one given: where to ask
    /// next (asked from past the end: the end, with no lines).
    pub next: u64,
    /// Lines before those that the head no longer keeps (or that came
    /// before it was started).
    pub dropped: u64,
    /// Whether the job is over (no line will follow).
    pub ended: bool,
}

/// Lines of a driver's log the head keeps per job.
pub const LOG_LINES_KEPT: usize = 2000;

/// Bytes of log lines one answer carries at most.
pub const LOG_BYTES_PER_PAGE: usize = 256 * 1024;

/// A detached job as the head keeps it on disk: what it was asked to run,
/// its account, the group of its bundle, and when it ended.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StoredJob {
    /// Its place in submission order.
    pub seq: u64,
    /// What was submitted.
    pub spec: JobSpec,
    /// Its account ([`JobRecord`]'s view, without groups).
    pub view: JobView,
    /// The placement group of its bundle, while it holds one.
    pub group: Option<crate::groups::GroupId>,
    /// When it ended, in milliseconds since the Unix epoch.
    pub ended_unix_ms: Option<u64>,
}

/// The head's account of one job: its view, without its group.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord(JobView);

impl std::ops::Deref for JobRecord {
    type Target = JobView;

    fn deref(&self) -> &JobView {
        &self.0
    }
}

impl JobRecord {
    /// A job just submitted by the certificate `owner` (`None`: the head
    /// itself).
    pub fn new(
        id: impl Into<JobId>,
        description: impl Into<String>,
        owner: Option<String>,
    ) -> Self {
        Self(JobView {
            id: id.into(),
            description: description.into(),
            owner,
            state: JobState::Pending,
            done: 0,
            total: 0,
            node: None,
            restarts: 0,
            group: None,
            work_groups: Vec::new(),
            work: Vec::new(),
            detail: None,
        })
    }

    /// The account kept on disk, as it was ([`StoredJob::view`]).
    pub fn restored(view: JobView) -> Self {
        Self(JobView {
            group: None,
            work: Vec::new(),
            ..view
        })
    }

    /// Its actor started on `node` (after `restarts` restarts).
    pub fn started(&mut self, node: &str, restarts: u32) {
        let j = &mut self.0;
        if !j.state.is_end() {
            j.state = JobState::Running;
            j.node = Some(MemberName::from(node));
            j.restarts = restarts;
        }
    }

    /// Its actor answered; true when that is the job's end (the caller
    /// then stops the actor and releases its bundle).
    pub fn progress(&mut self, p: JobProgress) -> bool {
        let j = &mut self.0;
        if j.state.is_end() {
            return false;
        }
        // Progress never goes back: a restarted actor counts from what it
        // finds done, which is at least what was reported.
        j.done = j.done.max(p.done);
        j.total = j.total.max(p.total);
        if !p.groups.is_empty() {
            j.work_groups = p.groups;
        }
        if p.state.is_end() {
            j.state = p.state;
            j.detail = Some(p.detail);
            j.node = None;
            return true;
        }
        false
    }

    /// Its actor exited; `restarting` when the supervisor starts it again.
    pub fn exited(&mut self, restarting: bool) {
        let j = &mut self.0;
        if !j.state.is_end() {
            j.node = None;
            if restarting {
                j.state = JobState::Pending;
            }
        }
    }

    /// The job failed for good (its supervisor gave up, its bundle could
    /// not be placed, or it was stopped).
    pub fn failed(&mut self, why: impl Into<String>) {
        let j = &mut self.0;
        if !j.state.is_end() {
            j.state = JobState::Failed;
            j.detail = Some(why.into());
            j.node = None;
        }
    }

    /// As `node jobs` shows it, with its bundle's group and those of its
    /// work.
    pub fn view(&self, group: Option<GroupView>, work: Vec<GroupView>) -> JobView {
        JobView {
            group,
            work,
            ..self.0.clone()
        }
    }
}

/// How long the head keeps jobs that ended, so that `node jobs` lists
/// them and `node jobs wait` finds them: the newest `keep` of them, each
/// for at most `keep_for` after it ended. Older ones are forgotten (their
/// output stays where they wrote it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Ended jobs kept at most.
    pub keep: usize,
    /// How long an ended job is kept.
    pub keep_for: std::time::Duration,
}

impl Default for Retention {
    /// The last 1,000 ended jobs, for a week each.
    fn default() -> Self {
        Self {
            keep: 1000,
            keep_for: std::time::Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl Retention {
    /// Which ended jobs to forget at `now`: `ended` lists each ended job's
    /// key and when it ended, in any order; the keys returned are those
    /// past `keep_for`, and of the rest all but the `keep` that ended last.
    pub fn expired<K: Clone>(
        &self,
        now: std::time::Instant,
        ended: &[(K, std::time::Instant)],
    ) -> Vec<K> {
        let mut by_age: Vec<&(K, std::time::Instant)> = ended.iter().collect();
        // Newest first; a stable sort keeps the given order among equals.
        by_age.sort_by_key(|e| std::cmp::Reverse(e.1));
        by_age
            .into_iter()
            .enumerate()
            .filter(|(rank, (_, at))| {
                *rank >= self.keep || now.saturating_duration_since(*at) > self.keep_for
            })
            .map(|(_, (k, _))| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(state: JobState, done: u64) -> JobProgress {
        JobProgress {
            state,
            done,
            total: 100,
            detail: "d".into(),
            groups: vec!["g".into()],
            stats: Default::default(),
            log: Vec::new(),
        }
    }

    #[test]
    fn a_job_description_over_the_limit_or_without_a_kind_is_refused() {
        let mut spec = JobSpec {
            kind: "k".into(),
            args: vec![0; MAX_SPEC_BYTES - 64],
            message_type: "m".into(),
            resources: Resources::new(),
            description: "d".into(),
            max_restarts: 1,
        };
        assert_eq!(spec.check(), Ok(()));
        spec.description = "x".repeat(100);
        let e = spec.check().unwrap_err();
        assert!(
            e.starts_with("NODE-JOB-010") && e.contains("1048576"),
            "{e}"
        );
        spec.args.clear();
        spec.kind.clear();
        assert!(spec.check().unwrap_err().contains("kind"));
    }

    #[test]
    fn a_job_runs_moves_and_ends_once() {
        let mut j = JobRecord::new("j1", "embed", Some("alice".into()));
        assert_eq!(j.state, JobState::Pending);
        j.started("w1", 0);
        assert_eq!(
            (j.state, j.node.as_deref()),
            (JobState::Running, Some("w1"))
        );
        assert!(!j.progress(progress(JobState::Running, 40)));
        // Its node is lost: restarted elsewhere, progress kept.
        j.exited(true);
        assert_eq!((j.state, j.node.clone()), (JobState::Pending, None));
        j.started("w2", 1);
        assert!(!j.progress(progress(JobState::Running, 30)));
        assert_eq!(j.done, 40, "never goes back");
        assert_eq!(j.work_groups, vec!["g".to_owned()]);
        assert!(j.progress(progress(JobState::Succeeded, 100)));
        assert_eq!(j.state, JobState::Succeeded);
        // Nothing moves it out of its end.
        j.exited(true);
        j.failed("late");
        j.started("w3", 2);
        assert!(!j.progress(progress(JobState::Failed, 100)));
        assert_eq!(
            (j.state, j.detail.as_deref()),
            (JobState::Succeeded, Some("d"))
        );
    }

    #[test]
    fn a_supervisor_that_gives_up_fails_the_job() {
        let mut j = JobRecord::new("j2", "embed", None);
        j.started("w1", 0);
        j.exited(false);
        assert_eq!(j.state, JobState::Running, "an exit alone is not an end");
        j.failed("restart limit");
        assert_eq!(j.state, JobState::Failed);
        assert_eq!(
            j.view(None, Vec::new()).detail.as_deref(),
            Some("restart limit")
        );
    }

    #[test]
    fn retention_forgets_the_old_and_all_but_the_newest() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let r = Retention {
            keep: 2,
            keep_for: Duration::from_secs(100),
        };
        let ended = [(1, at(0)), (2, at(50)), (3, at(60)), (4, at(10))];
        // At 70 s none is past 100 s: the two that ended last stay.
        let mut gone = r.expired(at(70), &ended);
        gone.sort();
        assert_eq!(gone, vec![1, 4]);
        // At 155 s, job 2 (ended at 50) is past its 100 s too.
        let mut gone = r.expired(at(155), &ended);
        gone.sort();
        assert_eq!(gone, vec![1, 2, 4]);
        assert!(r.expired(at(0), &[] as &[(u32, Instant)]).is_empty());
        let none = Retention {
            keep: 0,
            keep_for: Duration::from_secs(100),
        };
        assert_eq!(none.expired(at(1), &[(7, at(0))]), vec![7]);
    }
}
