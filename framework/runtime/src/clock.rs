//! Time for the async shells: tokio's clock (so tests run on paused time),
//! handed to the proto machines as the `Instant`s they take.

/// Now, on tokio's clock.
pub(crate) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Microseconds since the Unix epoch on the wall clock (0 for a clock
/// before it): what incarnations and epochs are read from.
pub(crate) fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Milliseconds since the Unix epoch on the wall clock (0 for a clock
/// before it): what times kept across restarts are written in.
pub(crate) fn clock_millis() -> u64 {
    clock_micros() / 1000
}

/// Sleeps until `at` (an instant of [`now`]'s clock), or forever.
pub(crate) async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
