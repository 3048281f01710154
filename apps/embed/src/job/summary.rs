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
    /// The tokens, CPU time and cost of its batches.
    pub work: Work,
}

/// The tokens, CPU time and cost of a job's batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Real tokens embedded (prompt and special tokens included).
    pub tokens: u64,
    /// Tokens the model ran over, padding included.
    pub padded_tokens: u64,
    /// CPU time the actors spent on the batches.
    pub cpu: Duration,
    /// What the job cost at its nodes' price per hour, when they have one
    /// (`node join --price-per-hour`).
    pub cost: Option<f64>,
}

impl Work {
    /// From a job's account, its cost at the prices `table` publishes.
    pub fn of(
        account: &flotilla_proto::job_stats::JobStats,
        table: Option<&flotilla::Table>,
    ) -> Self {
        let price = |node: &str| table?.price_per_hour(node);
        Self {
            tokens: account.tokens,
            padded_tokens: account.padded_tokens,
            cpu: Duration::from_millis(account.cpu_ms),
            cost: flotilla_proto::job_stats::cost(account, price),
        }
    }
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tokens ({} with padding), {:.1} CPU-s",
            self.tokens,
            self.padded_tokens,
            self.cpu.as_secs_f64()
        )?;
        if let Some(cost) = self.cost {
            write!(f, ", cost {cost:.4}")?;
            if let Some(per) = flotilla_proto::job_stats::per_million_tokens(cost, self.tokens) {
                write!(f, " ({per:.4} per million tokens)")?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {}: {}, model load {:.2} s, peak RSS {} MiB, {}",
            self.job_id,
            self.job.line("texts", self.actors),
            self.model_load.as_secs_f64(),
            self.peak_rss >> 20,
            self.work
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
    fn the_work_line_says_tokens_cpu_and_cost_per_million_tokens() {
        let mut w = Work {
            tokens: 2_000_000,
            padded_tokens: 2_500_000,
            cpu: Duration::from_millis(12_340),
            cost: None,
        };
        assert_eq!(
            w.to_string(),
            "2000000 tokens (2500000 with padding), 12.3 CPU-s"
        );
        w.cost = Some(0.5);
        assert_eq!(
            w.to_string(),
            "2000000 tokens (2500000 with padding), 12.3 CPU-s, cost 0.5000 (0.2500 per million tokens)"
        );
    }

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
