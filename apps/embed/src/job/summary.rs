//! What a job did, printed at its end.

use std::time::Duration;

use flotilla_data::BatchSummary;

use super::sink::Format;

/// What a job did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Job id.
    pub job_id: String,
    /// Where the output is.
    pub output: String,
    /// Format of its parts.
    pub format: Option<Format>,
    /// What the batch job did (rows are texts; its times count from the
    /// start of the job, model loading included).
    pub job: BatchSummary,
    /// Embedding actors used.
    pub actors: usize,
    /// Where they ran (`cpu ×2 (f32)`, `cuda:0 (f16), cuda:1 (f16)`).
    pub devices: String,
    /// When every actor had its model loaded, from the start.
    pub ready_after: Duration,
    /// Model load time of the slowest actor.
    pub model_load: Duration,
    /// Peak resident memory of this process, in bytes (Linux; 0 elsewhere).
    pub peak_rss: u64,
    /// On a cluster, where the actors' bundles were first placed
    /// (`group G (spread): 0→w1 1→w2 …`).
    pub placement: Option<String>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {}: {}, model load {:.2} s, peak RSS {} MiB",
            self.job_id,
            self.job.line("texts", self.actors),
            self.model_load.as_secs_f64(),
            self.peak_rss >> 20
        )?;
        if !self.devices.is_empty() {
            write!(f, "\ndevices: {}", self.devices)?;
        }
        if let Some(p) = &self.placement {
            write!(f, "\nplacement: {p}")?;
        }
        if let Some(format) = self.format {
            let out = self.output.trim_end_matches('/');
            write!(f, "\noutput: {out}/parts/ (one file per batch)")?;
            match format {
                Format::Parquet => write!(
                    f,
                    ", read it whole with pyarrow.dataset.dataset(\"{out}/parts\"), polars.scan_parquet(\"{out}/parts/*.parquet\") or DuckDB's read_parquet('{out}/parts/*.parquet')"
                )?,
                Format::Jsonl => {
                    write!(f, ", JSON lines: {{\"id\": …, \"embedding\": […]}} per row")?
                }
            }
            write!(f, "; rows not embedded: {out}/errors.jsonl")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_where_the_output_is_and_how_to_read_it() {
        let s = Summary {
            job_id: "j".into(),
            output: "out/".into(),
            format: Some(Format::Parquet),
            ..Summary::default()
        };
        let text = s.to_string();
        assert!(text.contains("output: out/parts/"), "{text}");
        assert!(
            text.contains("pyarrow.dataset.dataset(\"out/parts\")"),
            "{text}"
        );
        assert!(text.contains("out/errors.jsonl"), "{text}");
    }
}
