//! `node`: parse the command line, run, map errors to exit codes.
//!
//! Exit codes: 0 success, 1 the embed job failed, 2 usage or configuration
//! error (certificates included), 3 the node could not start or join, 4 a
//! status query failed.

use std::process::ExitCode;

use clap::Parser;
use flotilla::Node;
use flotilla_node::{CertsOp, Cli, Command, node_config};

/// mimalloc keeps freed blocks for reuse; glibc's malloc hands large blocks
/// back to the kernel and pays page faults to get them again, which costs
/// the model actors several percent of their CPU time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| "info,ractor_cluster=warn,ractor=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Certs { op } => {
            let result = match op {
                CertsOp::Init { out, cluster } => {
                    flotilla_transport::certs::init_ca(&out, &cluster).map(|()| {
                        format!(
                            "cluster CA and admin certificate written to {}",
                            out.display()
                        )
                    })
                }
                CertsOp::Issue { ca, name, out } => {
                    flotilla_transport::certs::issue(&ca, &name, &out)
                        .map(|()| format!("certificate for {name} written to {}", out.display()))
                }
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
        Command::Head(args) => serve(args, false).await,
        Command::Join(args) => serve(args, true).await,
        Command::Status(args) => {
            let identity = match flotilla_transport::Identity::load(&args.certs, &args.name) {
                Ok(i) => i,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            };
            match flotilla::query_status(args.head, identity).await {
                Ok(table) => {
                    if args.json {
                        println!("{}", table.to_json());
                    } else {
                        print!("{}", table.to_text());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(4)
                }
            }
        }
    }
}

async fn serve(args: flotilla_node::NodeArgs, join: bool) -> ExitCode {
    let settings = match node_config(args, join) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let builder = flotilla::probe::register(Node::builder(settings.config));
    let node = match flotilla_embed::actor::register(builder, settings.model)
        .start()
        .await
    {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            // Certificates are configuration; everything else is a failure
            // to start or to join.
            let code = if matches!(e, flotilla::StartError::Certs(_)) {
                2
            } else {
                3
            };
            return ExitCode::from(code);
        }
    };
    wait_for_stop().await;
    node.shutdown().await;
    ExitCode::SUCCESS
}

/// Waits for SIGTERM or Ctrl-C.
async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
