//! The `node` command: parse the command line, run, map errors to exit
//! codes.
//!
//! Exit codes: 0 success, 1 the embed job failed, 2 usage or configuration
//! error (certificates included), 3 the node could not start or join, 4 a
//! status query failed, 5 a configured supervisor gave up, 6 a head of a
//! head set lost its lease.

use std::process::ExitCode;

use clap::Parser;
use flotilla::{Node, NodeBuilder};

use crate::{CertsOp, Cli, Command, NodeArgs, node_config};

/// Runs the `node` command line with the embedding actors and whatever
/// `extra` registers (the test kit adds its probe actors) on the nodes it
/// starts, and maps the outcome to an exit code.
pub fn main(extra: fn(NodeBuilder) -> NodeBuilder) -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // What detached jobs' drivers log is also kept for the head.
    let job_logs = flotilla_data::job::JobLogs::default();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| "info,ractor_cluster=warn,ractor=warn".into()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(crate::log_capture::JobLogLayer::new(job_logs.clone()))
        .init();
    let cli = Cli::parse();
    if let Err(e) = flotilla::failpoints::configure_from_env() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(cli, extra, job_logs))
}

async fn run(
    cli: Cli,
    extra: fn(NodeBuilder) -> NodeBuilder,
    job_logs: flotilla_data::job::JobLogs,
) -> ExitCode {
    match cli.command {
        Command::Certs { op } => certs(op),
        Command::Embed(args) if args.detach => submit(args).await,
        Command::Jobs(args) => crate::jobs::run(args).await,
        Command::Objects(args) => crate::objects::run(args).await,
        Command::Embed(args) => match flotilla_embed::job::run(args.job()).await {
            Ok(summary) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("embed job failed: {e}");
                ExitCode::from(1)
            }
        },
        Command::Model {
            op:
                crate::ModelOp::Convert {
                    model,
                    out,
                    precision,
                },
        } => match flotilla_embed::convert_folder(&model, &out, precision) {
            Ok(c) => {
                println!(
                    "{}: {} tensors stored as {precision}, {} kept, {:.1} MiB",
                    c.weights.display(),
                    c.converted,
                    c.kept,
                    c.bytes as f64 / (1 << 20) as f64
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        Command::Head(args) => serve(args, false, extra, job_logs).await,
        Command::Join(args) => serve(args, true, extra, job_logs).await,
        Command::Status(args) => status(args).await,
        Command::Dashboard(args) => crate::dashboard::run(args).await,
        Command::Drain(args) => crate::drain::run(args).await,
    }
}

/// `node certs …`: the cluster's CA and certificates.
fn certs(op: CertsOp) -> ExitCode {
    let days = |d: u64| std::time::Duration::from_secs(d.saturating_mul(24 * 3600));
    let result = match op {
        CertsOp::Init {
            out,
            cluster,
            head_name,
        } => flotilla_transport::certs::init_ca(&out, &cluster, &head_name).map(|()| {
            format!(
                "cluster CA, cookie, head certificate ({head_name}) and admin certificate written to {}",
                out.display()
            )
        }),
        CertsOp::Issue {
            ca,
            name,
            role,
            valid_days,
            out,
        } => flotilla_transport::certs::issue(&ca, &name, role, days(valid_days), &out)
            .map(|()| {
                format!(
                    "certificate for {name} (role {role}, valid {valid_days} days) written to {}",
                    out.display()
                )
            }),
        CertsOp::Renew {
            ca,
            name,
            dir,
            valid_days,
        } => {
            let dir = dir.unwrap_or_else(|| ca.clone());
            flotilla_transport::certs::renew(&ca, &name, &dir, days(valid_days)).map(
                |role| {
                    format!(
                        "certificate for {name} (role {role}) renewed for {valid_days} days in {}",
                        dir.display()
                    )
                },
            )
        }
        CertsOp::Revoke { ca, name } => flotilla_transport::certs::revoke(&ca, &name)
            .map(|n| {
                format!(
                    "{n} certificate(s) of {name} revoked; {} lists them (the head reads it within a second)",
                    ca.join(flotilla_transport::certs::CRL_FILE).display()
                )
            }),
    };
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// `node status`: the member table, supervisors, placement, GPUs and
/// objects, as text or JSON.
async fn status(args: crate::StatusArgs) -> ExitCode {
    let identity = match flotilla_transport::Identity::load(&args.ask.certs, &args.ask.name) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let asked = crate::gather::Gather {
        supervisors: !args.no_supervisors,
        objects: args.json,
    };
    let client = match flotilla::ControlClient::new(identity) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(4);
        }
    };
    let gathered = crate::gather::gather_status(&args.ask.head, &client, asked).await;
    client.close().await;
    match gathered {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(4)
        }
    }
}

/// `node embed --detach`: submits the job to the head and prints its id.
async fn submit(args: crate::EmbedArgs) -> ExitCode {
    let join = &args.job.job.cluster;
    let (heads, certs, name) = (join.head.clone(), join.certs.clone(), join.name.clone());
    if heads.is_empty() {
        eprintln!("--detach needs --head");
        return ExitCode::from(2);
    }
    let mut config = args.job();
    // Refused here, before the head is asked.
    if let Err(e) = config.check() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    // The driver runs elsewhere: local paths are made absolute here, with
    // their links and `..` resolved where they exist (the node that runs
    // the job checks them against the roots it allows).
    for path in [&mut config.job.input, &mut config.job.output] {
        if !path.contains("://") {
            *path = resolved(std::path::Path::new(path))
                .to_string_lossy()
                .into_owned();
        }
    }
    config.model = resolved(&config.model);
    let job = flotilla_embed::job::detached::submission(&config);
    let identity = match flotilla_transport::Identity::load(&certs, &name) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let request = flotilla::jobs::JobsRequest::Submit(flotilla_embed::job::detached::spec(&job));
    let submitted = flotilla::status::first_answer(&heads, |head| {
        flotilla::query_jobs(head, identity.clone(), request.clone())
    })
    .await
    .map(|(_, reply)| reply);
    match submitted {
        Ok(flotilla::jobs::JobsReply::Submitted(id)) => {
            println!("{id}");
            ExitCode::SUCCESS
        }
        Ok(other) => {
            eprintln!("NODE-JOB-003: the head did not take the job: {other:?}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(4)
        }
    }
}

/// `path` made absolute: canonical where it (or, for a path still to be
/// made, its folder) exists, else as written from the working folder.
fn resolved(path: &std::path::Path) -> std::path::PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
        && let Ok(real) = std::fs::canonicalize(if parent.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            parent
        })
    {
        return real.join(name);
    }
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

async fn serve(
    args: NodeArgs,
    join: bool,
    extra: fn(NodeBuilder) -> NodeBuilder,
    job_logs: flotilla_data::job::JobLogs,
) -> ExitCode {
    // A worker drains when it is told to stop; the head is not drained.
    let drain_on_stop =
        Some(std::time::Duration::from_secs(args.drain_on_stop_s)).filter(|d| join && !d.is_zero());
    let settings = match node_config(args, join) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let metrics = match settings.metrics_listen {
        // The recorder is the process's; it serves every counter the
        // runtime emits through the `metrics` facade, and on a head every
        // job's account.
        Some(addr) => match crate::metrics_http::MetricsEndpoint::start(addr).await {
            Ok(endpoint) => {
                tracing::info!(%addr, "serving metrics on /metrics");
                Some(endpoint)
            }
            Err(e) => {
                eprintln!("NODE-CONFIG-005: cannot serve metrics on {addr}: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    // A head of a head set waits as a standby until it holds the lease,
    // then starts from the state the former primary left beside it.
    let leased = match &settings.lease {
        Some(lease) => {
            let stop = tokio_util::sync::CancellationToken::new();
            let stopped = {
                let stop = stop.clone();
                tokio::spawn(async move {
                    crate::systemd::wait_for_stop().await;
                    stop.cancel();
                })
            };
            // A standby is up as what it is.
            crate::systemd::ready();
            let feeding = crate::systemd::watchdog_interval()
                .map(|i| tokio::spawn(crate::head_set::feed_while_standby(i)));
            let taken = crate::head_set::take_lease(&settings.config, lease, stop).await;
            if let Some(f) = feeding {
                f.abort();
            }
            match taken {
                Ok(Some(leased)) => {
                    stopped.abort();
                    Some(leased)
                }
                Ok(None) => {
                    crate::systemd::stopping();
                    return ExitCode::SUCCESS;
                }
                Err(e) => {
                    eprintln!("{e}");
                    // A URL that names no store is configuration.
                    let code = match e {
                        crate::head_set::HeadSetError::Store { .. } => 2,
                        _ => 3,
                    };
                    return ExitCode::from(code);
                }
            }
        }
        None => None,
    };
    // The head keeps its detached jobs and placement groups in its state
    // directory.
    let state = settings.config.state_folder().to_path_buf();
    let builder = extra(Node::builder(settings.config)).head_store_in(state);
    let (builder, lease) = match leased {
        Some(leased) => {
            let (builder, guard) = leased.apply(builder);
            (builder, Some(guard))
        }
        None => (builder, None),
    };
    let builder =
        flotilla_embed::job::detached::register(builder, settings.allow.clone(), Some(job_logs));
    let settings_trees = settings.trees;
    let retention = settings.retention;
    let node = match flotilla_embed::actor::register(builder, settings.model, settings.allow)
        .start_shared()
        .await
    {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(e.exit_code());
        }
    };
    if let Some(metrics) = &metrics {
        metrics.show_jobs_of(std::sync::Arc::clone(&node));
    }
    let mut trees = match crate::trees::start(&node, settings_trees).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            node.shutdown().await;
            return ExitCode::from(2);
        }
    };
    // The head supervises detached jobs, kept on disk across its restarts.
    let jobs = match node.serve_jobs_with(retention) {
        Ok(jobs) => jobs,
        Err(e) => {
            eprintln!("NODE-STORE-001: {e}");
            trees.stop().await;
            node.shutdown().await;
            return ExitCode::from(2);
        }
    };
    crate::systemd::ready();
    let watchdog = crate::systemd::watchdog_interval()
        .map(|interval| tokio::spawn(crate::systemd::feed_watchdog(interval, node.pulse())));
    if let Some(guard) = &lease {
        guard.set_incarnation(node.incarnation());
    }
    let lost = async {
        match &lease {
            Some(guard) => guard.lost().await,
            None => std::future::pending().await,
        }
    };
    let code = tokio::select! {
        () = crate::systemd::wait_for_stop() => {
            if let Some(within) = drain_on_stop {
                crate::systemd::stopping();
                crate::drain::on_stop(&node, within).await;
            }
            0
        }
        within = node.drain_asked() => {
            crate::systemd::stopping();
            crate::drain::asked(&node, within).await;
            0
        }
        () = lost => {
            // Another head has taken over, or may at any moment: end now,
            // with nothing stopped (the jobs and groups are its own).
            eprintln!("NODE-LEASE-004: this head lost the head set's lease; ending at once");
            std::process::exit(i32::from(crate::head_set::LOST_EXIT_CODE));
        }
        (tree, e) = trees.escalated() => {
            eprintln!("NODE-TREE-001: supervisor {tree:?} gave up: {e}");
            5
        }
    };
    crate::systemd::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    trees.stop().await;
    if let Some(jobs) = jobs {
        jobs.stop().await;
    }
    node.shutdown().await;
    ExitCode::from(code)
}
