//! Detached embed jobs: the job's driver as a job actor
//! ([`flotilla::jobs`]) that the head runs in a bundle of its own on some
//! node of the cluster, so the job survives the machine it was submitted
//! from and the one its driver runs on. The driver uses the node it runs
//! on (no node of its own); restarted on another node, it resumes from
//! the manifest in the output store: batches already written are skipped,
//! never recomputed.
//!
//! ```text
//! node embed --detach ─► head: Jobs(Submit{kind: flotilla.embed.job, args: Submission})
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

use flotilla::ActorKind;
use flotilla::jobs::{JobMsg, JobSpec};
use flotilla_data::job::detached::{self, Submission};
use flotilla_proto::roots::AllowedRoots;

use super::JobConfig;

/// The registered kind of the embed job's driver.
pub const JOB_KIND: ActorKind<JobMsg, Submission> = ActorKind::new("flotilla.embed.job");

/// The paths an embed job opens, by what they are.
fn paths(config: &JobConfig) -> Vec<(String, String)> {
    vec![
        ("input".into(), config.job.input.clone()),
        ("output".into(), config.job.output.clone()),
        ("model".into(), config.model.to_string_lossy().into_owned()),
    ]
}

/// A detached embed job: `config` as it travels to its driver (the
/// settings of one run aside).
pub fn submission(config: &JobConfig) -> Submission {
    Submission::of(config, paths(config))
}

/// The job's configuration, for its driver, or why the settings that
/// came are not one (unreadable, naming other paths, out of range).
pub fn config_of(job: &Submission) -> Result<JobConfig, String> {
    let config: JobConfig = job.settings(paths)?;
    config.check().map_err(|e| e.to_string())?;
    Ok(config)
}

/// The job to submit (see [`detached::spec`]).
pub fn spec(job: &Submission) -> JobSpec {
    let description = format!("embed {} -> {}", job.path("input"), job.path("output"));
    detached::spec(JOB_KIND, job, description)
}

/// Registers the detached job's driver kind ([`flotilla_data::job::detached`]);
/// it drives the job from the node `builder` starts (see
/// [`flotilla::NodeBuilder::start_shared`]), on inputs, outputs and models
/// under `allow` only (each as written, and a local one that exists also
/// with its links resolved). With `logs` (where the process's log
/// subscriber keeps what each job logs), each driver's log lines go to the
/// head with its progress reports.
pub fn register(
    builder: flotilla::NodeBuilder,
    allow: AllowedRoots,
    logs: Option<flotilla_data::job::JobLogs>,
) -> flotilla::NodeBuilder {
    detached::register_logged(
        builder,
        JOB_KIND,
        logs,
        move |node, job: Submission, report| {
            let allow = allow.clone();
            async move {
                // Refused before anything is opened.
                job.check_allowed(&allow).map_err(|why| why.to_string())?;
                let mut config = config_of(&job)?;
                let (progress, progress_rx) = tokio::sync::watch::channel((0, 0));
                let (group, group_rx) =
                    tokio::sync::watch::channel(flotilla::placement_groups::GroupId::default());
                config.job.progress_to = Some(progress);
                config.job.group_to = Some(group);
                config.job.meter = Some(report.meter());
                config.job.confined_to = Some(allow.clone());
                let follow = async {
                    report.follow(progress_rx, group_rx).await;
                    std::future::pending().await
                };
                tokio::select! {
                    outcome = super::cluster::run_detached(&config, &node) => {
                        outcome.map(|summary| summary.to_string()).map_err(|e| e.to_string())
                    }
                    () = follow => unreachable!("the follower never ends"),
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Format;

    /// What a detached job's driver is given is what was submitted: every
    /// setting of the model's output (prompt, prompt name, dimensions)
    /// among the rest.
    #[test]
    fn the_wire_form_keeps_every_setting() {
        let mut config = JobConfig::new("s3://corpus/", "s3://out/", "/models/e5");
        config.job.format = Format::Jsonl;
        config.prompt = Some("query: ".into());
        config.prompt_name = Some("passage".into());
        config.dim = Some(256);
        config.precision = crate::Precision::Int8;
        config.job.batch_size = 48;
        config.micro_batch = 0;
        config.job.output_columns = vec!["lang".into()];
        let back = config_of(&submission(&config)).unwrap();
        assert_eq!(back.prompt.as_deref(), Some("query: "));
        assert_eq!(back.prompt_name.as_deref(), Some("passage"));
        assert_eq!(back.dim, Some(256));
        assert_eq!(back.precision, crate::Precision::Int8);
        assert_eq!((back.job.batch_size, back.micro_batch), (48, 0));
        assert_eq!(back.job.format, Format::Jsonl);
        assert_eq!(back.job.output_columns, vec!["lang".to_owned()]);
        let plain = config_of(&submission(&JobConfig::new("a", "b", "c"))).unwrap();
        assert_eq!(
            (plain.prompt, plain.prompt_name, plain.dim),
            (None, None, None)
        );
    }

    /// Settings that are not a job's, or out of range, are refused by the
    /// driver with the reason: they crossed a trust boundary.
    #[test]
    fn settings_that_are_not_a_jobs_are_refused_with_the_reason() {
        let mut job = submission(&JobConfig::new("a", "b", "c"));
        let good = job.settings.clone();
        job.settings = good.replace("\"batch_size\":64", "\"batch_size\":0");
        let e = config_of(&job).unwrap_err();
        assert!(e.contains("--batch-size is 0"), "{e}");
        job.settings = good.replace("{", "{\"unknown\":1,");
        let e = config_of(&job).unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
        job.settings = good.replace("\"precision\":\"f32\"", "\"precision\":\"f7\"");
        let e = config_of(&job).unwrap_err();
        assert!(e.contains("f7"), "{e}");
        job.settings = good.replace("\"input\":\"a\"", "\"input\":\"/etc\"");
        let e = config_of(&job).unwrap_err();
        assert!(e.contains("other paths"), "{e}");
    }
}
