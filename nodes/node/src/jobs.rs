//! `node jobs`: the cluster's detached jobs, as the head reports them
//! (id, state, texts done and in all, the driver's node, the group with
//! each bundle's node); `node jobs wait ID` and `node jobs stop ID`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use flotilla::jobs::{JobView, JobsReply, JobsRequest};
use serde::Serialize;

use crate::{JobsArgs, JobsOp};

/// Runs `node jobs`.
pub async fn run(args: JobsArgs) -> ExitCode {
    if args.head.is_empty() {
        eprintln!("node jobs needs --head ADDR");
        return ExitCode::from(2);
    }
    let heads = args.head.clone();
    let identity = match flotilla_transport::Identity::load(&args.certs, &args.name) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // Every head of a head set is asked; the active one answers.
    let ask = |request: JobsRequest| {
        let (heads, identity) = (heads.clone(), identity.clone());
        async move {
            flotilla::status::first_answer(&heads, |head| {
                flotilla::query_jobs(head, identity.clone(), request.clone())
            })
            .await
            .map(|(_, reply)| reply)
        }
    };
    match args.op {
        None => match ask(JobsRequest::List).await {
            Ok(JobsReply::Jobs(jobs)) => {
                if args.json {
                    println!("{}", to_json(&jobs));
                } else {
                    print!("{}", to_text(&jobs));
                }
                ExitCode::SUCCESS
            }
            other => refused(other),
        },
        Some(JobsOp::Stop { id }) => match ask(JobsRequest::Stop(id.as_str().into())).await {
            Ok(JobsReply::Stopped(true)) => {
                println!("stopped {id}");
                ExitCode::SUCCESS
            }
            Ok(JobsReply::Stopped(false)) => {
                eprintln!("NODE-JOB-004: no running job {id}");
                ExitCode::from(1)
            }
            other => refused(other),
        },
        Some(JobsOp::Logs { id, follow }) => {
            let mut after = 0;
            loop {
                match ask(JobsRequest::Logs {
                    id: id.as_str().into(),
                    after,
                })
                .await
                {
                    Ok(JobsReply::Logs(Some(page))) => {
                        if page.dropped > 0 && after == 0 {
                            println!("… {} earlier lines are no longer kept", page.dropped);
                        }
                        for line in &page.lines {
                            println!("{line}");
                        }
                        after = page.next;
                        if !follow || (page.ended && page.lines.is_empty()) {
                            return ExitCode::SUCCESS;
                        }
                        if !page.lines.is_empty() {
                            // More may be waiting: ask at once.
                            continue;
                        }
                    }
                    Ok(JobsReply::Logs(None)) => {
                        eprintln!("NODE-JOB-004: no job {id}");
                        return ExitCode::from(1);
                    }
                    // The head may be restarting: ask again.
                    Err(e) if follow => {
                        tracing::warn!(error = %e, "cannot ask the head; asking again")
                    }
                    other => return refused(other),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Some(JobsOp::Wait { id, timeout_s }) => {
            let until = Instant::now() + Duration::from_secs(timeout_s);
            loop {
                match ask(JobsRequest::Get(id.as_str().into())).await {
                    Ok(JobsReply::Job(Some(job))) if job.state.is_end() => {
                        if args.json {
                            println!("{}", to_json(std::slice::from_ref(&job)));
                        } else {
                            println!(
                                "{} {}: {}",
                                job.id,
                                job.state.as_str(),
                                job.detail.as_deref().unwrap_or("")
                            );
                        }
                        return if job.state == flotilla::jobs::JobState::Succeeded {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::from(1)
                        };
                    }
                    Ok(JobsReply::Job(Some(_))) => {}
                    Ok(JobsReply::Job(None)) => {
                        eprintln!("NODE-JOB-004: no job {id}");
                        return ExitCode::from(1);
                    }
                    // The head may be restarting: ask again.
                    Err(e) => tracing::warn!(error = %e, "cannot ask the head; asking again"),
                    other => return refused(other),
                }
                if Instant::now() >= until {
                    eprintln!("NODE-JOB-005: job {id} did not end within {timeout_s} s");
                    return ExitCode::from(3);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn refused(reply: Result<JobsReply, flotilla::status::StatusError>) -> ExitCode {
    match reply {
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(4)
        }
        Ok(JobsReply::NotServed) => {
            eprintln!("NODE-JOB-002: that node serves no jobs (ask the head)");
            ExitCode::from(4)
        }
        Ok(other) => {
            eprintln!("NODE-JOB-003: unexpected answer {other:?}");
            ExitCode::from(4)
        }
    }
}

/// The jobs as JSON: `{"jobs": [{id, state, done, total, node, owner, restarts,
/// detail, group: {id, state, strategy, revision, owner, why, bundles:
/// [{resources, node}]}, work: [groups of the same shape]}]}`: `group` is
/// the job's own bundle, `work` the groups its work runs in (the embed
/// job's actors).
pub fn to_json(jobs: &[JobView]) -> String {
    #[derive(Serialize)]
    struct Job<'a> {
        id: &'a str,
        description: &'a str,
        state: &'static str,
        done: u64,
        total: u64,
        node: Option<&'a str>,
        owner: Option<&'a str>,
        restarts: u32,
        detail: Option<&'a str>,
        group: Option<flotilla::render::GroupJson<'a>>,
        work: Vec<flotilla::render::GroupJson<'a>>,
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        jobs: Vec<Job<'a>>,
    }
    let doc = Doc {
        jobs: jobs
            .iter()
            .map(|j| Job {
                id: &j.id,
                description: &j.description,
                state: j.state.as_str(),
                done: j.done,
                total: j.total,
                node: j.node.as_deref(),
                owner: j.owner.as_deref(),
                restarts: j.restarts,
                detail: j.detail.as_deref(),
                group: j.group.as_ref().map(flotilla::render::GroupJson::from),
                work: j
                    .work
                    .iter()
                    .map(flotilla::render::GroupJson::from)
                    .collect(),
            })
            .collect(),
    };
    serde_json::to_string(&doc).expect("jobs document serializes")
}

/// The jobs as a table.
pub fn to_text(jobs: &[JobView]) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:>17}  {:<12} {:<12} {:>8}  {}\n",
        "ID", "STATE", "TEXTS", "DRIVER ON", "OWNER", "RESTARTS", "WHAT"
    );
    for j in jobs {
        out.push_str(&format!(
            "{:<24} {:<10} {:>17}  {:<12} {:<12} {:>8}  {}\n",
            j.id,
            j.state.as_str(),
            format!("{}/{}", j.done, j.total),
            j.node.as_deref().unwrap_or("-"),
            j.owner.as_deref().unwrap_or("(head)"),
            j.restarts,
            j.description
        ));
        for g in j.group.iter().chain(&j.work) {
            out.push_str(&format!(
                "  group {} ({}, {}): {}\n",
                g.id,
                g.strategy,
                g.state.as_str(),
                g.nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("{i}→{}", if n.is_empty() { "-" } else { n }))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        if let Some(d) = &j.detail {
            out.push_str(&format!("  {d}\n"));
        }
    }
    out
}
