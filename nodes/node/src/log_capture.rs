//! The log subscriber's layer that keeps what a detached job's driver logs
//! for the head: every event within a `job` span (whose `job` field is
//! the job's id, see `flotilla_data::job::detached`) is formatted as one
//! line (`HH:MM:SS.mmm LEVEL target: message key=value…`, UTC) into
//! [`JobLogs`], from which the driver sends it with its next progress
//! report.

use std::fmt::Write as _;

use flotilla_data::job::JobLogs;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Keeps the lines logged within each job's span in `logs`.
pub(crate) struct JobLogLayer {
    logs: JobLogs,
}

impl JobLogLayer {
    /// A layer keeping lines in `logs`.
    pub(crate) fn new(logs: JobLogs) -> Self {
        Self { logs }
    }
}

/// The job a span belongs to.
struct JobTag(String);

/// Reads the `job` field of a span.
struct JobField(Option<String>);

impl Visit for JobField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "job" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "job" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

/// Writes an event's message, then its other fields as `key=value`.
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

/// The time of day in UTC, `HH:MM:SS.mmm`.
fn time_of_day(now: std::time::SystemTime) -> String {
    let ms = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let day_ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

impl<S> Layer<S> for JobLogLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "job" {
            return;
        }
        let mut field = JobField(None);
        attrs.record(&mut field);
        if let (Some(job), Some(span)) = (field.0, ctx.span(id)) {
            span.extensions_mut().insert(JobTag(job));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some(job) = scope
            .from_root()
            .find_map(|span| span.extensions().get::<JobTag>().map(|t| t.0.clone()))
        else {
            return;
        };
        let mut line = Line {
            message: String::new(),
            fields: String::new(),
        };
        event.record(&mut line);
        let meta = event.metadata();
        self.logs.push(
            &job,
            format!(
                "{} {} {}: {}{}",
                time_of_day(std::time::SystemTime::now()),
                meta.level(),
                meta.target(),
                line.message,
                line.fields
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn only_what_is_logged_within_a_jobs_span_is_kept_for_it() {
        let logs = JobLogs::default();
        let subscriber = tracing_subscriber::registry().with(JobLogLayer::new(logs.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside any job");
            let span = tracing::info_span!("job", job = "job-1-1");
            let _in = span.enter();
            tracing::warn!(rows = 64, "batch written");
            let inner = tracing::info_span!("pipeline");
            let _deeper = inner.enter();
            tracing::info!("within a span inside the job's");
        });
        let (lines, next) = logs.since("job-1-1", 0, usize::MAX);
        assert_eq!(next, 2);
        assert!(
            lines[0].ends_with(" WARN flotilla_node::log_capture::tests: batch written rows=64"),
            "{lines:?}"
        );
        assert!(
            lines[1].ends_with("within a span inside the job's"),
            "{lines:?}"
        );
        assert_eq!(lines[0].as_bytes()[2], b':');
    }

    #[test]
    fn the_time_of_day_is_utc() {
        let t =
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(86_400_000 * 3 + 3_723_004);
        assert_eq!(time_of_day(t), "01:02:03.004");
    }
}
