//! The node's counters, through the `metrics` facade: whichever recorder
//! the program installs (the `node` binary serves Prometheus text on
//! `--metrics-listen`) receives them; with none installed they cost a
//! branch. Every name is defined here, following Prometheus conventions.
//!
//! ```text
//! flotilla_hello_refused_total{reason}          streams refused at the gate
//! flotilla_frames_dropped_total{lane,reason}    frames dropped after the gate
//! flotilla_authority_refused_total{service,reason}  requests refused by the permission table
//! flotilla_tls_refused_total{reason}            connections refused before their first stream
//! flotilla_membership_refused_total{request,reason}  joins, heartbeats and leaves the head refused
//! flotilla_principal_capped_total{what}          requests refused at a per-certificate cap
//! flotilla_cluster_frames_refused_total{reason} ractor_cluster frames dropped for breaking a rule
//! flotilla_connections_closed_total{reason}     open connections closed: certificate revoked or expired
//! flotilla_sessions_opened_total                ractor_cluster sessions opened
//! flotilla_sessions_closed_total                ractor_cluster sessions closed
//! flotilla_sent_bytes_total{lane}               bytes sent per lane
//! flotilla_batches_done_total                   pipeline batches done
//! flotilla_batch_seconds                        their latency (histogram)
//! flotilla_head_role{role}                      1 for a head's role (`primary` or `standby`), 0 for the other
//! flotilla_head_store_bytes                     size of the head's job store file
//! flotilla_head_store_last_commit_seconds       when it last committed, durably (Unix time)
//! flotilla_head_store_commit_seconds            each commit's latency (histogram)
//! ```

use flotilla_proto::hello::Refusal;

/// A stream refused at the gate, by reason.
pub(crate) fn hello_refused(refusal: Refusal) {
    metrics::counter!("flotilla_hello_refused_total", "reason" => refusal.code()).increment(1);
}

/// A connection closed because the member incarnation it spoke for is no
/// longer up (down, left or replaced): `endpoint` is `main` or `bulk`.
/// Whatever it still had queued is dropped with it.
pub(crate) fn fenced(endpoint: &'static str) {
    metrics::counter!("flotilla_fenced_connections_total", "endpoint" => endpoint).increment(1);
}

/// A frame dropped after its stream was accepted: `lane` is `bulk` or
/// `cluster`, `reason` why.
pub(crate) fn frame_dropped(lane: &'static str, reason: &'static str) {
    metrics::counter!("flotilla_frames_dropped_total", "lane" => lane, "reason" => reason)
        .increment(1);
}

/// A request refused by the permission table: `service` is what it asked
/// of (`jobs`, `placement`, `spawn`, `stop`, `ledger`, `objects`,
/// `spawner`, `status`), `reason` the refusal's code.
pub(crate) fn authority_refused(service: &'static str, reason: &'static str) {
    metrics::counter!("flotilla_authority_refused_total", "service" => service, "reason" => reason)
        .increment(1);
}

/// A connection refused before it carried a stream: its TLS handshake
/// failed or timed out, or the node had too many handshakes in progress.
pub(crate) fn tls_refused(reason: &'static str) {
    metrics::counter!("flotilla_tls_refused_total", "reason" => reason).increment(1);
}

/// A join, heartbeat or leave (`request`) the head refused, by the
/// refusal's code (`name_taken` for a name a live process holds).
pub(crate) fn membership_refused(request: &'static str, reason: &'static str) {
    metrics::counter!("flotilla_membership_refused_total", "request" => request, "reason" => reason)
        .increment(1);
}

/// A request refused because its certificate is at its cap of `what`
/// (`jobs`: jobs running at once).
pub(crate) fn principal_capped(what: &'static str) {
    metrics::counter!("flotilla_principal_capped_total", "what" => what).increment(1);
}

/// A ractor_cluster frame dropped for breaking a rule whatever its
/// certificate holds (`malformed`, `group_name`, `duplicate_call`,
/// `call_timeout`).
pub(crate) fn cluster_frame_refused(reason: &'static str) {
    metrics::counter!("flotilla_cluster_frames_refused_total", "reason" => reason).increment(1);
}

/// An open connection closed because its certificate was withdrawn
/// (`revoked` or `expired`).
pub(crate) fn connection_closed(reason: &'static str) {
    metrics::counter!("flotilla_connections_closed_total", "reason" => reason).increment(1);
}

/// A ractor_cluster session opened.
pub(crate) fn session_opened() {
    metrics::counter!("flotilla_sessions_opened_total").increment(1);
}

/// A ractor_cluster session closed.
pub(crate) fn session_closed() {
    metrics::counter!("flotilla_sessions_closed_total").increment(1);
}

/// `bytes` sent on `lane` (`bulk` or `cluster`).
pub(crate) fn sent_bytes(lane: &'static str, bytes: u64) {
    metrics::counter!("flotilla_sent_bytes_total", "lane" => lane).increment(bytes);
}

/// A pipeline batch done, `latency` after its last send.
pub(crate) fn batch_done(latency: std::time::Duration) {
    metrics::counter!("flotilla_batches_done_total").increment(1);
    metrics::histogram!("flotilla_batch_seconds").record(latency.as_secs_f64());
}

/// This node is a head, in `role` (`primary` or `standby`): 1 for its
/// role, 0 for the other.
pub(crate) fn head_role(role: &'static str) {
    for r in ["primary", "standby"] {
        metrics::gauge!("flotilla_head_role", "role" => r).set(if r == role { 1.0 } else { 0.0 });
    }
}

/// The head's job store committed a change durably, in `took`; its file
/// is now `bytes` long.
pub(crate) fn store_committed(bytes: u64, took: std::time::Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    metrics::gauge!("flotilla_head_store_bytes").set(bytes as f64);
    metrics::gauge!("flotilla_head_store_last_commit_seconds").set(now.as_secs_f64());
    metrics::histogram!("flotilla_head_store_commit_seconds").record(took.as_secs_f64());
}

/// Describes every counter and shows the unlabelled ones at 0, so a scrape
/// of a node that has seen nothing yet lists them.
pub(crate) fn register() {
    metrics::describe_counter!(
        "flotilla_hello_refused_total",
        "Streams refused at the gate, by reason"
    );
    metrics::describe_counter!(
        "flotilla_frames_dropped_total",
        "Frames dropped after their stream was accepted"
    );
    metrics::describe_counter!(
        "flotilla_authority_refused_total",
        "Requests refused by the permission table, by service and reason"
    );
    metrics::describe_counter!(
        "flotilla_connections_closed_total",
        "Open connections closed because their certificate was revoked or expired"
    );
    metrics::describe_counter!(
        "flotilla_principal_capped_total",
        "Requests refused because their certificate is at its cap, by what is capped"
    );
    metrics::describe_counter!(
        "flotilla_cluster_frames_refused_total",
        "ractor_cluster frames dropped for breaking a rule (malformed, an over-long group name, a repeated call tag, a call without a bounded timeout), by reason"
    );
    metrics::describe_counter!(
        "flotilla_membership_refused_total",
        "Joins, heartbeats and leaves the head refused, by request and reason"
    );
    metrics::describe_counter!(
        "flotilla_tls_refused_total",
        "Connections refused before their first stream (handshake failed, timed out, or too many at once)"
    );
    metrics::describe_counter!(
        "flotilla_sessions_opened_total",
        "ractor_cluster sessions opened"
    );
    metrics::describe_counter!(
        "flotilla_sessions_closed_total",
        "ractor_cluster sessions closed"
    );
    metrics::describe_counter!("flotilla_sent_bytes_total", "Bytes written, per lane");
    metrics::describe_counter!("flotilla_batches_done_total", "Pipeline batches done");
    metrics::describe_histogram!(
        "flotilla_batch_seconds",
        metrics::Unit::Seconds,
        "Latency of pipeline batches done"
    );
    metrics::describe_gauge!(
        "flotilla_head_role",
        "1 on the head, labelled with its role (primary)"
    );
    metrics::describe_gauge!(
        "flotilla_head_store_bytes",
        metrics::Unit::Bytes,
        "Size of the head's job store file"
    );
    metrics::describe_gauge!(
        "flotilla_head_store_last_commit_seconds",
        metrics::Unit::Seconds,
        "When the head's job store last committed a change, durably (Unix time)"
    );
    metrics::describe_histogram!(
        "flotilla_head_store_commit_seconds",
        metrics::Unit::Seconds,
        "Latency of the head's job store commits"
    );
    metrics::counter!("flotilla_sessions_opened_total").increment(0);
    metrics::counter!("flotilla_sessions_closed_total").increment(0);
    metrics::counter!("flotilla_batches_done_total").increment(0);
}
