//! systemd's notification protocol, for units of `Type=notify` with
//! `WatchdogSec=`: `READY=1` once the node has started (and, for a member,
//! joined), `WATCHDOG=1` every third of the interval systemd passes in
//! `WATCHDOG_USEC` (systemd asks for at least every half: a third leaves
//! room for a late wake-up) while the node's heartbeat loop runs (a wedged runtime
//! stops feeding it and systemd restarts the process), `STOPPING=1` when
//! it is told to stop. Without `NOTIFY_SOCKET` (not under systemd) each is
//! a no-op. Being told to stop is SIGTERM (what systemd sends) or Ctrl-C
//! ([`wait_for_stop`]).

use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;

/// Tells systemd the node is up.
pub fn ready() {
    send(NotifyState::Ready);
}

/// Feeds systemd's watchdog once.
pub fn watchdog() {
    send(NotifyState::Watchdog);
}

/// Tells systemd the node is stopping.
pub fn stopping() {
    send(NotifyState::Stopping);
}

fn send(state: NotifyState) {
    if let Err(e) = sd_notify::notify(false, &[state]) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// The watchdog interval systemd asks for, if it asks: `WATCHDOG_USEC`,
/// unless `WATCHDOG_PID` names another process (as sd_watchdog_enabled(3)
/// reads them).
pub fn watchdog_interval() -> Option<Duration> {
    let var = |name| std::env::var(name).ok();
    interval_for(
        var("WATCHDOG_USEC").as_deref(),
        var("WATCHDOG_PID").as_deref(),
        std::process::id(),
    )
}

fn interval_for(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    match pid {
        Some(p) if p.trim().parse::<u32>().ok() != Some(me) => None,
        _ => Some(Duration::from_micros(usec)),
    }
}

/// Whether to feed the watchdog: the heartbeat loop ran since the last
/// feed.
pub fn due(pulse: u64, fed_at: Option<u64>) -> bool {
    fed_at != Some(pulse)
}

/// Feeds systemd's watchdog every third of `interval` while `pulse` moves;
/// a pass that finds it still skips the feed and says so once.
pub async fn feed_watchdog(interval: Duration, pulse: watch::Receiver<u64>) {
    let mut tick = tokio::time::interval(interval / 3);
    let mut fed_at = None;
    let mut warned = false;
    loop {
        tick.tick().await;
        let now = *pulse.borrow();
        if due(now, fed_at) {
            send(NotifyState::Watchdog);
            fed_at = Some(now);
            warned = false;
        } else if !warned {
            tracing::error!(
                "the heartbeat loop has not run since the last feed; not feeding systemd's watchdog"
            );
            warned = true;
        }
    }
}

/// Waits for SIGTERM or Ctrl-C.
pub(crate) async fn wait_for_stop() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_systemds_unless_it_is_meant_for_another_process() {
        assert_eq!(
            interval_for(Some("2000000"), None, 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            interval_for(Some("2000000"), Some("7"), 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(interval_for(Some("2000000"), Some("8"), 7), None);
        assert_eq!(interval_for(Some("0"), None, 7), None);
        assert_eq!(interval_for(Some("soon"), None, 7), None);
        assert_eq!(interval_for(None, Some("7"), 7), None);
    }

    #[test]
    fn the_watchdog_is_fed_only_after_the_heartbeat_loop_ran() {
        assert!(due(0, None), "the first pass feeds");
        assert!(!due(0, Some(0)), "no pulse since: no feed");
        assert!(due(1, Some(0)));
    }
}
