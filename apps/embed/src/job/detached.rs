//! Detached embed jobs: the job's driver as a job actor
//! ([`flotilla::jobs`]) that the head runs in a bundle of its own on some
//! node of the cluster, so the job survives the machine it was submitted
//! from and the one its driver runs on. The driver uses the node it runs
//! on (no node of its own); restarted on another node, it resumes from
//! the manifest in the output store: batches already written are skipped,
//! never recomputed.
//!
//! ```text
//! node embed --detach ─► head: Jobs(Submit{kind: flotilla.embed.job, args: DetachedJob})
//! head ─► JobDriver on a node ─► the cluster job (its actors in their own group)
//!      ◄─ JobMsg::Progress: texts done / in all, then its end
//! ```
//!
//! The input, output and model must be readable where the driver lands: a
//! path every node sees, or an object-store URL. A driver that cannot open
//! its input fails the job with an error naming its node and the input.
//!
//! A node runs a detached job only on an input, output and model under the
//! roots its operator allowed (`[jobs] allow` in node.toml, or
//! `--allow-path`; [`AllowedRoots`]): anything else fails the job before
//! it is opened, naming the setting. A local path is checked as written
//! and, where it exists, again with its links resolved.

use std::sync::{Arc, Mutex};

use flotilla::jobs::{JobMsg, JobProgress, JobReport, JobSpec, JobState};
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef};
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::{Node, NodeHandle};
use flotilla_proto::roots::{AllowedRoots, NotAllowed};

use super::{Format, JobConfig};

/// The registered kind of the embed job's driver.
pub const JOB_KIND: &str = "flotilla.embed.job";

/// A detached embed job's settings, as they travel to its driver.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct DetachedJob {
    /// See [`JobConfig::input`].
    pub input: String,
    /// See [`JobConfig::output`].
    pub output: String,
    /// `parquet` or `jsonl`.
    pub format: String,
    /// See [`JobConfig::model`].
    pub model: String,
    /// See [`JobConfig::id_field`].
    pub id_field: String,
    /// See [`JobConfig::text_field`].
    pub text_field: String,
    /// See [`JobConfig::output_columns`].
    pub output_columns: Vec<String>,
    /// See [`JobConfig::batch_size`].
    pub batch_size: u64,
    /// See [`JobConfig::sort_window`].
    pub sort_window: u64,
    /// See [`JobConfig::max_batch_tokens`].
    pub max_batch_tokens: Option<u64>,
    /// See [`JobConfig::actors_per_node`].
    pub actors_per_node: Option<u64>,
    /// See [`JobConfig::actors`].
    pub actors: Option<u64>,
    /// See [`JobConfig::actor_resources`].
    pub actor_resources: Option<Vec<(String, f64)>>,
    /// See [`JobConfig::placement`].
    pub placement: String,
    /// See [`JobConfig::placement_timeout`], in seconds.
    pub placement_timeout_s: u64,
    /// See [`JobConfig::max_in_flight`].
    pub max_in_flight: Option<u64>,
    /// See [`JobConfig::memory_budget`].
    pub memory_budget: u64,
    /// See [`JobConfig::job_id`].
    pub job_id: Option<String>,
    /// See [`JobConfig::restart_limit`].
    pub max_restarts: u32,
    /// See [`JobConfig::restart_limit`], in seconds.
    pub restart_window_s: u64,
    /// See [`JobConfig::device`].
    pub device: String,
    /// See [`JobConfig::precision`].
    pub precision: String,
    /// See [`JobConfig::micro_batch`].
    pub micro_batch: u64,
    /// See [`JobConfig::prompt`].
    pub prompt: Option<String>,
    /// See [`JobConfig::prompt_name`].
    pub prompt_name: Option<String>,
    /// See [`JobConfig::dim`].
    pub dim: Option<u64>,
}

flotilla::remote_type!(DetachedJob);

impl DetachedJob {
    /// The settings of `config` (its cluster part aside).
    pub fn of(config: &JobConfig) -> Self {
        Self {
            input: config.input.clone(),
            output: config.output.clone(),
            format: match config.format {
                Format::Parquet => "parquet".into(),
                Format::Jsonl => "jsonl".into(),
            },
            model: config.model.to_string_lossy().into_owned(),
            id_field: config.id_field.clone(),
            text_field: config.text_field.clone(),
            output_columns: config.output_columns.clone(),
            batch_size: config.batch_size as u64,
            sort_window: config.sort_window as u64,
            max_batch_tokens: config.max_batch_tokens.map(|n| n as u64),
            actors_per_node: config.actors_per_node.map(|n| n as u64),
            actors: config.actors.map(|n| n as u64),
            actor_resources: config
                .actor_resources
                .as_ref()
                .map(|r| r.iter().map(|(k, v)| (k.clone(), *v)).collect()),
            placement: config.placement.as_str().to_owned(),
            placement_timeout_s: config.placement_timeout.as_secs(),
            max_in_flight: config.max_in_flight.map(|n| n as u64),
            memory_budget: config.memory_budget as u64,
            job_id: config.job_id.clone(),
            max_restarts: config.restart_limit.max_restarts,
            restart_window_s: config.restart_limit.within.as_secs(),
            device: config.device.to_string(),
            precision: config.precision.to_string(),
            micro_batch: config.micro_batch as u64,
            prompt: config.prompt.clone(),
            prompt_name: config.prompt_name.clone(),
            dim: config.dim.map(|d| d as u64),
        }
    }

    /// The job's configuration, for its driver.
    pub fn config(&self) -> JobConfig {
        let mut c = JobConfig::new(&self.input, &self.output, &self.model);
        c.format = if self.format == "jsonl" {
            Format::Jsonl
        } else {
            Format::Parquet
        };
        c.id_field = self.id_field.clone();
        c.text_field = self.text_field.clone();
        c.output_columns = self.output_columns.clone();
        c.batch_size = self.batch_size as usize;
        c.sort_window = self.sort_window as usize;
        c.max_batch_tokens = self.max_batch_tokens.map(|n| n as usize);
        c.actors_per_node = self.actors_per_node.map(|n| n as usize);
        c.actors = self.actors.map(|n| n as usize);
        c.actor_resources = self
            .actor_resources
            .as_ref()
            .map(|r| r.iter().cloned().collect());
        c.placement = self.placement.parse().unwrap_or(c.placement);
        c.placement_timeout = std::time::Duration::from_secs(self.placement_timeout_s);
        c.max_in_flight = self.max_in_flight.map(|n| n as usize);
        c.memory_budget = self.memory_budget as usize;
        c.job_id = self.job_id.clone();
        c.device = self.device.parse().unwrap_or(c.device);
        c.precision = self.precision.parse().unwrap_or(c.precision);
        c.micro_batch = self.micro_batch as usize;
        c.prompt = self.prompt.clone();
        c.prompt_name = self.prompt_name.clone();
        c.dim = self.dim.map(|d| d as usize);
        c.restart_limit = flotilla::supervisor::Intensity {
            max_restarts: self.max_restarts,
            within: std::time::Duration::from_secs(self.restart_window_s.max(1)),
        };
        c
    }

    /// The job to submit: its driver in a bundle reserving `memory_mb=256`
    /// (so it lands on a worker, not on a head that offers nothing), three
    /// restarts a minute.
    pub fn spec(&self) -> JobSpec {
        JobSpec {
            kind: JOB_KIND.to_owned(),
            args: flotilla::wire::encode(self),
            message_type: std::any::type_name::<JobMsg>().to_owned(),
            resources: [("memory_mb".to_owned(), 256.0)].into_iter().collect(),
            description: format!("embed {} -> {}", self.input, self.output),
            max_restarts: 3,
        }
    }
}

/// Registers the detached job's driver kind; it drives the job from the
/// node `builder` starts (see [`flotilla::NodeBuilder::start_shared`]),
/// on inputs, outputs and models under `allow` only.
pub fn register(builder: flotilla::NodeBuilder, allow: AllowedRoots) -> flotilla::NodeBuilder {
    let handle = builder.node_handle();
    builder.register(JOB_KIND, move || JobDriver {
        node: handle.clone(),
        allow: allow.clone(),
    })
}

/// The driver of a detached job.
pub struct JobDriver {
    node: NodeHandle,
    allow: AllowedRoots,
}

impl DetachedJob {
    /// Checks the job's input, output and model against the roots `allow`:
    /// each as written, and a local one that exists also with its links
    /// resolved (a link under a root that leads out of it is refused).
    pub fn check_allowed(&self, allow: &AllowedRoots) -> Result<(), NotAllowed> {
        for (what, path) in [
            ("input", &self.input),
            ("output", &self.output),
            ("model", &self.model),
        ] {
            allow.check(what, path)?;
            let local = path.strip_prefix("file://").unwrap_or(path);
            if !local.contains("://") {
                // A glob's folder, or the path itself.
                let literal: std::path::PathBuf = std::path::Path::new(local)
                    .components()
                    .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
                    .collect();
                if let Ok(real) = std::fs::canonicalize(&literal) {
                    allow.check(what, &real.to_string_lossy())?;
                }
            }
        }
        Ok(())
    }
}

/// The driver's state: what it reports, and its job.
pub struct DriverState {
    report: Arc<Mutex<JobProgress>>,
    task: tokio::task::JoinHandle<()>,
}

impl Actor for JobDriver {
    type Msg = JobMsg;
    type State = DriverState;
    type Arguments = DetachedJob;

    async fn pre_start(
        &self,
        _: ActorRef<JobMsg>,
        job: DetachedJob,
    ) -> Result<DriverState, ActorProcessingErr> {
        let node: Arc<Node> = self
            .node
            .get()
            .ok_or("this node was not started to host detached jobs")?;
        // Refused before anything is opened: the job ends failed with why
        // (a refusal is no crash: it is not restarted elsewhere).
        if let Err(why) = job.check_allowed(&self.allow) {
            tracing::warn!(error = %why, "detached embed job refused");
            let report = Arc::new(Mutex::new(JobProgress {
                state: JobState::Failed,
                done: 0,
                total: 0,
                detail: format!("on node {}: {why}", node.name()),
                groups: Vec::new(),
            }));
            return Ok(DriverState {
                report,
                task: tokio::spawn(async {}),
            });
        }
        let report = Arc::new(Mutex::new(JobProgress {
            state: JobState::Running,
            done: 0,
            total: 0,
            detail: String::new(),
            groups: Vec::new(),
        }));
        let (tx, mut rx) = tokio::sync::watch::channel((0, 0));
        let (group_tx, mut group_rx) = tokio::sync::watch::channel(String::new());
        let mut config = job.config();
        config.progress_to = Some(tx);
        config.group_to = Some(group_tx);
        let task = tokio::spawn({
            let report = Arc::clone(&report);
            async move {
                let follow = {
                    let report = Arc::clone(&report);
                    async move {
                        loop {
                            tokio::select! {
                                c = rx.changed() => {
                                    if c.is_err() { break; }
                                    let (done, total) = *rx.borrow_and_update();
                                    let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                                    r.done = done;
                                    r.total = total;
                                }
                                c = group_rx.changed() => {
                                    if c.is_err() { break; }
                                    let g = group_rx.borrow_and_update().clone();
                                    let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                                    r.groups = vec![g];
                                }
                            }
                        }
                        std::future::pending::<()>().await;
                    }
                };
                let outcome = tokio::select! {
                    r = super::cluster::run_detached(&config, &node) => r,
                    () = follow => unreachable!("the follower never ends"),
                };
                let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                match outcome {
                    Ok(summary) => {
                        r.state = JobState::Succeeded;
                        r.detail = summary.to_string();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "detached embed job failed");
                        r.state = JobState::Failed;
                        r.detail = format!("on node {}: {e}", node.name());
                    }
                }
            }
        });
        Ok(DriverState { report, task })
    }

    async fn post_stop(
        &self,
        _: ActorRef<JobMsg>,
        state: &mut DriverState,
    ) -> Result<(), ActorProcessingErr> {
        // The job's actors stop with their placement group's owner gone,
        // or with this task: a driver started again resumes the output.
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
        let r = state
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let _ = reply.send(JobReport(r));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a detached job's driver is given is what was submitted: every
    /// setting of the model's output (prompt, prompt name, dimensions)
    /// among the rest.
    #[test]
    fn the_wire_form_keeps_every_setting() {
        let mut config = JobConfig::new("s3://corpus/", "s3://out/", "/models/e5");
        config.format = Format::Jsonl;
        config.prompt = Some("query: ".into());
        config.prompt_name = Some("passage".into());
        config.dim = Some(256);
        config.precision = crate::Precision::Int8;
        config.batch_size = 48;
        config.micro_batch = 0;
        config.output_columns = vec!["lang".into()];
        let back = DetachedJob::of(&config).config();
        assert_eq!(back.prompt.as_deref(), Some("query: "));
        assert_eq!(back.prompt_name.as_deref(), Some("passage"));
        assert_eq!(back.dim, Some(256));
        assert_eq!(back.precision, crate::Precision::Int8);
        assert_eq!((back.batch_size, back.micro_batch), (48, 0));
        assert_eq!(back.format, Format::Jsonl);
        assert_eq!(back.output_columns, vec!["lang".to_owned()]);
        let plain = DetachedJob::of(&JobConfig::new("a", "b", "c")).config();
        assert_eq!(
            (plain.prompt, plain.prompt_name, plain.dim),
            (None, None, None)
        );
    }
}
