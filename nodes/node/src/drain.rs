//! `node drain NAME`, and a worker's own drain when it is told to stop.
//!
//! A drained member takes no new work; the head places its bundles again
//! at once, and the supervisors of the actors it hosts start them anew in
//! their bundles elsewhere, charging no restart. The member leaves once it
//! hosts nothing, or when its deadline passes.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use flotilla::{DrainOutcome, Node};

use crate::DrainArgs;

/// How long `node drain` waits past the deadline for the member to be
/// seen gone (its leave, or the failure detector).
const LEAVE_SLACK: Duration = Duration::from_secs(15);

/// Runs `node drain`.
pub async fn run(args: DrainArgs) -> ExitCode {
    let identity = match flotilla_transport::Identity::load(&args.certs, &args.name) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let within = Duration::from_secs(args.deadline);
    let started = Instant::now();
    let asked = flotilla::status::first_answer(&args.head, |head| {
        flotilla::query_drain(head, identity.clone(), &args.member, within)
    })
    .await;
    let head = match asked {
        Ok((head, DrainOutcome::Draining)) => {
            println!("{} is draining (deadline {} s)", args.member, args.deadline);
            head
        }
        Ok((_, outcome)) => {
            eprintln!("{}", outcome.describe(&args.member));
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    if args.no_wait {
        return ExitCode::SUCCESS;
    }
    let until = started + within + LEAVE_SLACK;
    loop {
        if let Ok(table) = flotilla::query_status(head, identity.clone()).await {
            let gone = table.get(&args.member).is_none_or(|m| !m.state.is_live());
            if gone {
                let how = table.get(&args.member).map_or("gone", |m| m.state.as_str());
                println!(
                    "{} {how} after {:.1} s",
                    args.member,
                    started.elapsed().as_secs_f64()
                );
                return ExitCode::SUCCESS;
            }
        }
        if Instant::now() >= until {
            eprintln!(
                "{} is still draining {:.0} s after it was asked; it leaves by itself once its deadline passes",
                args.member,
                started.elapsed().as_secs_f64()
            );
            return ExitCode::from(3);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker told to stop (SIGTERM) drains for up to `within` before it
/// leaves: it asks the head, then waits for its actors to move.
pub async fn on_stop(node: &Node, within: Duration) {
    tracing::info!(?within, "told to stop: draining first");
    match node.drain(within).await {
        Ok(drained) => report(drained),
        Err(e) => tracing::warn!(error = %e, "cannot drain; leaving without it"),
    }
}

/// A worker the head marked draining (an admin's `node drain`) waits for
/// its actors to move, for up to the `within` its drain was given.
pub async fn asked(node: &Node, within: Duration) {
    tracing::info!(?within, "drained by the cluster");
    report(node.wait_drained(within).await);
}

fn report(drained: flotilla::drain::Drained) {
    if drained.actors_left == 0 {
        tracing::info!(waited = ?drained.waited, "drained: every actor moved; leaving");
    } else {
        tracing::warn!(waited = ?drained.waited, actors = drained.actors_left,
            "drain deadline passed; leaving with these actors stopped");
    }
}
