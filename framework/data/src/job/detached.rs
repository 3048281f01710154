//! Detached jobs of any application: a driver kind ([`flotilla::jobs`])
//! that the head runs in a bundle of its own on some node of the cluster,
//! so a job survives the machine it was submitted from and the one its
//! driver runs on. The driver runs the application's function on the node
//! it lands on with the job's arguments, and answers the head's progress
//! questions with what that function reports; a driver started again
//! elsewhere runs it again, which resumes from the job's output.
//!
//! ```text
//! head ─► Driver (kind K, args A) on a node ─► run(node, args, report) ─► Ok(summary) / Err(why)
//!      ◄─ JobMsg::Progress: done / total, groups, then the end and its detail
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use flotilla::jobs::{JobMsg, JobProgress, JobReport, JobSpec, JobState};
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef};
use flotilla::wire::{Decode, Encode};
use flotilla::{ActorKind, Node, NodeBuilder, NodeHandle};
use flotilla_proto::ids::GroupId;
use flotilla_proto::roots::{AllowedRoots, NotAllowed};
use tokio::sync::watch;

use tracing::Instrument;

use super::{JobLogs, JobMeter};

/// What a detached job's driver tells the head as the job goes.
#[derive(Clone)]
pub struct Report(Arc<Mutex<JobProgress>>, JobMeter, Option<Lines>);

/// Where a driver's log lines are kept, and which it has sent.
#[derive(Clone)]
struct Lines {
    logs: JobLogs,
    job: String,
    sent: Arc<Mutex<u64>>,
}

/// Bytes of log lines one progress report carries at most (the rest go
/// with the next ones).
const LOG_BYTES_PER_REPORT: usize = 64 * 1024;

impl Report {
    fn new(lines: Option<Lines>) -> Self {
        let progress = JobProgress {
            state: JobState::Running,
            done: 0,
            total: 0,
            detail: String::new(),
            groups: Vec::new(),
            stats: Default::default(),
            log: Vec::new(),
        };
        Self(Arc::new(Mutex::new(progress)), JobMeter::default(), lines)
    }

    fn with<T>(&self, f: impl FnOnce(&mut JobProgress) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Where the job keeps its account of its batches
    /// ([`super::Settings::meter`]): each report carries what it holds.
    pub fn meter(&self) -> JobMeter {
        self.1.clone()
    }

    /// What the head is told now: the progress, the account, and the log
    /// lines not sent yet.
    fn now(&self) -> JobProgress {
        let mut progress = self.with(|r| r.clone());
        progress.stats = self.1.snapshot();
        if let Some(l) = &self.2 {
            let mut sent = l.sent.lock().unwrap_or_else(|p| p.into_inner());
            let (lines, next) = l.logs.since(&l.job, *sent, LOG_BYTES_PER_REPORT);
            progress.log = lines;
            *sent = next;
        }
        progress
    }

    /// Units done and in all (0: not known yet).
    pub fn progress(&self, done: u64, total: u64) {
        self.with(|r| (r.done, r.total) = (done, total));
    }

    /// The placement group the job's own work runs in.
    pub fn group(&self, id: GroupId) {
        self.with(|r| r.groups = vec![id]);
    }

    /// Reports what `progress` and `group` publish, until both are closed.
    pub async fn follow(
        &self,
        mut progress: watch::Receiver<(u64, u64)>,
        mut group: watch::Receiver<GroupId>,
    ) {
        let (mut counting, mut grouping) = (true, true);
        while counting || grouping {
            tokio::select! {
                c = progress.changed(), if counting => match c {
                    Ok(()) => {
                        let (done, total) = *progress.borrow_and_update();
                        self.progress(done, total);
                    }
                    Err(_) => counting = false,
                },
                c = group.changed(), if grouping => match c {
                    Ok(()) => self.group(group.borrow_and_update().clone()),
                    Err(_) => grouping = false,
                },
            }
        }
    }
}

/// The driver of a detached job of one kind: runs `run` on its node.
pub struct Driver<A, F> {
    node: NodeHandle,
    run: Arc<F>,
    /// Where the process's log subscriber keeps each job's lines.
    logs: Option<JobLogs>,
    _args: PhantomData<fn(A)>,
}

/// A driver's state: what it reports, and its job.
pub struct DriverState {
    report: Report,
    task: tokio::task::JoinHandle<()>,
}

impl<A, F, Fut> Actor for Driver<A, F>
where
    A: Decode + Send + Sync + 'static,
    F: Fn(Arc<Node>, A, Report) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    type Msg = JobMsg;
    type State = DriverState;
    type Arguments = A;

    async fn pre_start(
        &self,
        me: ActorRef<JobMsg>,
        args: A,
    ) -> Result<DriverState, ActorProcessingErr> {
        let node: Arc<Node> = self
            .node
            .get()
            .ok_or("this node was not started to host detached jobs")?;
        // The actor is named after its job: `ID.TAG`.
        let name = me.get_name().unwrap_or_default();
        let job_id = name.split('.').next().unwrap_or_default().to_owned();
        let lines = self.logs.clone().map(|logs| Lines {
            logs,
            job: job_id.clone(),
            sent: Arc::default(),
        });
        let report = Report::new(lines);
        // What the job logs is its own: the log subscriber keeps the lines
        // within this span for the head (see `JobLogs`).
        let span = tracing::info_span!("job", job = %job_id);
        let job = (self.run)(Arc::clone(&node), args, report.clone()).instrument(span);
        let task = tokio::spawn({
            let report = report.clone();
            async move {
                // A job that fails (or refuses to start) ends failed with
                // why; it is no crash and is not restarted elsewhere.
                let outcome = job.await;
                report.with(|r| match outcome {
                    Ok(summary) => {
                        r.state = JobState::Succeeded;
                        r.detail = summary;
                    }
                    Err(why) => {
                        tracing::warn!(error = %why, "detached job failed");
                        r.state = JobState::Failed;
                        r.detail = format!("on node {}: {why}", node.name());
                    }
                });
            }
        });
        Ok(DriverState { report, task })
    }

    async fn post_stop(
        &self,
        _: ActorRef<JobMsg>,
        state: &mut DriverState,
    ) -> Result<(), ActorProcessingErr> {
        // What the job started stops with it (or with its groups' owner
        // gone): a driver started again resumes the output.
        state.task.abort();
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<JobMsg>,
        msg: JobMsg,
        state: &mut DriverState,
    ) -> Result<(), ActorProcessingErr> {
        let JobMsg::Progress(_, reply) = msg;
        let _ = reply.send(JobReport(state.report.now()));
        Ok(())
    }
}

/// A detached job of `kind` with `args` to submit: its driver in a bundle
/// reserving `memory_mb=256` (so it lands on a worker, not on a head that
/// offers nothing), three restarts a minute.
pub fn spec<A: Encode>(kind: ActorKind<JobMsg, A>, args: &A, description: String) -> JobSpec {
    JobSpec {
        kind: kind.name().to_owned(),
        args: flotilla::wire::encode(args),
        message_type: std::any::type_name::<JobMsg>().to_owned(),
        resources: [("memory_mb".to_owned(), 256.0)].into_iter().collect(),
        description,
        max_restarts: 3,
    }
}

/// A detached job as it travels to its driver: the application's
/// settings as JSON (their one definition, by `serde`; read back by the
/// driver with a typed error), and the paths the job opens, by what they
/// are, for its description and the roots check where it runs.
#[derive(
    flotilla::rkyv::Archive,
    flotilla::rkyv::Serialize,
    flotilla::rkyv::Deserialize,
    Debug,
    Clone,
    PartialEq,
)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Submission {
    /// The settings, as JSON.
    pub settings: String,
    /// `(what, path)` for every path the settings name: the input, the
    /// output, a model…
    pub paths: Vec<(String, String)>,
}

flotilla::remote_type!(Submission);

impl Submission {
    /// `settings`, which name `paths`.
    pub fn of<S: serde::Serialize>(settings: &S, paths: Vec<(String, String)>) -> Self {
        Self {
            settings: serde_json::to_string(settings).expect("settings serialize"),
            paths,
        }
    }

    /// The path named `what`, or `""`.
    pub fn path(&self, what: &str) -> &str {
        self.paths
            .iter()
            .find(|(w, _)| w == what)
            .map_or("", |(_, p)| p.as_str())
    }

    /// The settings, or why what came is not them: JSON that does not
    /// read as `S`, or settings whose paths (as `paths` finds them) are not
    /// those that came, which the roots check saw.
    pub fn settings<S: serde::de::DeserializeOwned>(
        &self,
        paths: impl FnOnce(&S) -> Vec<(String, String)>,
    ) -> Result<S, String> {
        let settings: S = serde_json::from_str(&self.settings)
            .map_err(|e| format!("the job's settings cannot be read: {e}"))?;
        if paths(&settings) != self.paths {
            return Err("the job's settings name other paths than those submitted".into());
        }
        Ok(settings)
    }

    /// Checks every path against the roots `allow` (see [`check_paths`]).
    pub fn check_allowed(&self, allow: &AllowedRoots) -> Result<(), NotAllowed> {
        check_paths(
            allow,
            self.paths.iter().map(|(w, p)| (w.as_str(), p.as_str())),
        )
    }
}

/// Checks the paths a job names (`(what, path)`: input, output, model…)
/// against the roots `allow` before anything is opened: each as it will be
/// opened (a URL decoded, see [`AllowedRoots::check`]), and a local one
/// also with its links resolved: the real path of its nearest existing
/// ancestor (an output not made yet, a glob's folder), and of an output's
/// `parts` folder where there is one. A link under a root that leads out
/// of it is refused. The shards an input lists are checked again as they
/// are listed ([`crate::Input::resolve_within`]).
pub fn check_paths<'a>(
    allow: &AllowedRoots,
    paths: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), NotAllowed> {
    for (what, path) in paths {
        let Some(local) = allow.check(what, path)?.local_path() else {
            continue;
        };
        let real = if what == "output" {
            crate::output::written_folders(&local).to_vec()
        } else {
            vec![local]
        };
        for at in real {
            if let Some(resolved) = real_path(&at) {
                allow.check_local(what, &resolved)?;
            }
        }
    }
    Ok(())
}

/// `path` with its links resolved: the real path of its nearest existing
/// ancestor, with the rest of `path` after it. `None` when not even the
/// root resolves.
pub fn real_path(path: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            let mut out = real;
            out.extend(rest.iter().rev());
            return Some(out);
        }
        rest.push(at.file_name()?.to_owned());
        at = at.parent()?;
    }
}

/// Registers `kind` as the driver of detached jobs whose arguments are
/// `A`: each runs `run` on the node `builder` starts (see
/// [`flotilla::NodeBuilder::start_shared`]), which returns the job's
/// summary or why it failed. Only the head may spawn the kind
/// ([`NodeBuilder::register_head_only`]): the driver acts with the rights
/// the head granted the job.
pub fn register<A, F, Fut>(builder: NodeBuilder, kind: ActorKind<JobMsg, A>, run: F) -> NodeBuilder
where
    A: Decode + Send + Sync + 'static,
    F: Fn(Arc<Node>, A, Report) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    register_logged(builder, kind, None, run)
}

/// [`register`], with the drivers' log lines sent to the head from `logs`,
/// where the process's log subscriber keeps every line logged within a
/// job's span (`job`, with the field `job` = its id): `node jobs logs ID`
/// reads them there.
pub fn register_logged<A, F, Fut>(
    builder: NodeBuilder,
    kind: ActorKind<JobMsg, A>,
    logs: Option<JobLogs>,
    run: F,
) -> NodeBuilder
where
    A: Decode + Send + Sync + 'static,
    F: Fn(Arc<Node>, A, Report) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    let (node, run) = (builder.node_handle(), Arc::new(run));
    builder.register_head_only(kind, move || Driver {
        node: node.clone(),
        run: Arc::clone(&run),
        logs: logs.clone(),
        _args: PhantomData,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Settings {
        input: String,
        rows: u32,
    }

    fn paths(s: &Settings) -> Vec<(String, String)> {
        vec![("input".into(), s.input.clone())]
    }

    /// What the driver reads is what was submitted; settings that do not
    /// read, or that name other paths than the roots check saw, are
    /// refused with the reason.
    #[test]
    fn a_submission_carries_its_settings_and_refuses_other_paths() {
        let s = Settings {
            input: "/data/in".into(),
            rows: 7,
        };
        let mut job = Submission::of(&s, paths(&s));
        let bytes = flotilla::wire::encode(&job);
        assert_eq!(flotilla::wire::decode::<Submission>(&bytes).unwrap(), job);
        assert_eq!(job.path("input"), "/data/in");
        assert_eq!(job.path("model"), "");
        assert_eq!(job.settings(paths).map(|s: Settings| s.rows), Ok(7));
        let good = job.settings.clone();
        job.settings = good.replace("/data/in", "/etc");
        let e = job.settings(paths).map(|_: Settings| ()).unwrap_err();
        assert!(e.contains("other paths"), "{e}");
        job.settings = good.replace("7", "\"seven\"");
        let e = job.settings(paths).map(|_: Settings| ()).unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
        let allow = AllowedRoots::new(&["/data"]).unwrap();
        assert!(Submission::of(&s, paths(&s)).check_allowed(&allow).is_ok());
        let outside = Settings {
            input: "/etc/passwd".into(),
            rows: 1,
        };
        let refused = Submission::of(&outside, paths(&outside)).check_allowed(&allow);
        assert!(refused.is_err());
    }

    /// An output or model reached through a link under a root that leads
    /// out of it is refused, whether the output exists yet or not, and an
    /// output whose `parts` folder is such a link too; encoded dot
    /// segments are refused before any of it.
    #[test]
    fn outputs_and_models_through_links_out_of_the_roots_are_refused() {
        let dir = std::env::temp_dir().join(format!("flotilla-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (allowed, secret) = (dir.join("allowed"), dir.join("secret"));
        std::fs::create_dir_all(allowed.join("out")).unwrap();
        std::fs::create_dir_all(&secret).unwrap();
        let (allowed, secret) = (
            allowed.canonicalize().unwrap(),
            secret.canonicalize().unwrap(),
        );
        std::os::unix::fs::symlink(&secret, allowed.join("elsewhere")).unwrap();
        let allow = AllowedRoots::new(&[allowed.to_string_lossy()]).unwrap();
        let at = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let check = |what: &str, path: String| check_paths(&allow, [(what, path.as_str())]);
        assert!(check("output", at(&allowed.join("new/deeper/out"))).is_ok());
        assert!(check("output", at(&allowed.join("out"))).is_ok());
        for (what, path) in [
            ("output", at(&allowed.join("elsewhere"))),
            ("output", at(&allowed.join("elsewhere/stolen/new"))),
            (
                "output",
                format!("file://{}", at(&allowed.join("elsewhere/stolen"))),
            ),
            ("model", at(&allowed.join("elsewhere"))),
            ("input", at(&allowed.join("elsewhere/*.jsonl"))),
        ] {
            let e = check(what, path.clone()).unwrap_err();
            assert!(
                matches!(e, NotAllowed::Outside { .. }),
                "{what} {path}: {e}"
            );
            assert!(e.to_string().contains(&at(&secret)), "{e}");
        }
        std::os::unix::fs::symlink(&secret, allowed.join("out/parts")).unwrap();
        let e = check("output", at(&allowed.join("out"))).unwrap_err();
        assert!(matches!(e, NotAllowed::Outside { .. }), "{e}");
        let e = check("output", format!("file://{}/%2e%2e/stolen", at(&allowed))).unwrap_err();
        assert!(matches!(e, NotAllowed::DotSegment { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
