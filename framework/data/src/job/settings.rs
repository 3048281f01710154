//! A batch job's settings, defined once: the flags of a driver program
//! (`clap`), the fields a Rust program sets, and the wire form of a
//! detached job (`serde`). An application flattens [`Settings`] into its
//! own (its model, its device) and gets the same three forms for both.

use std::collections::HashSet;
use std::time::Duration;

use flotilla::MemberView;
use flotilla::pipeline::PipelineConfig;
use flotilla::placement_groups::{GroupId, GroupSpec, Resources, Strategy, bundle, parse_bundle};
use flotilla::supervisor::Intensity;
use serde::{Deserialize, Serialize};

use super::{ActorCount, Batching, Join, ProgressConfig};
use crate::parts::Format;
use crate::source::Fields;

/// Rows per batch unless told otherwise.
pub const DEFAULT_BATCH_SIZE: usize = 64;
/// Rows of a length-sorted window unless told otherwise.
pub const DEFAULT_SORT_WINDOW: usize = 4096;
/// Bytes of batches in flight at most unless told otherwise: 512 MiB.
pub const DEFAULT_MEMORY_BUDGET: usize = 512 << 20;
/// Times the others' running p95 a batch runs before it is sent again to
/// an idle actor, unless told otherwise.
pub const DEFAULT_HEDGE_AFTER: u32 = 3;

fn default_hedge_after() -> u32 {
    DEFAULT_HEDGE_AFTER
}

/// A job setting out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} is {value}: {rule}")]
pub struct SettingError {
    /// The setting, as the command line names it.
    pub name: &'static str,
    /// The value given.
    pub value: String,
    /// What it must be.
    pub rule: &'static str,
}

/// What every batch job is told: its input and output, how rows are cut
/// into batches, how many actors run where, its limits. What belongs to
/// one run only (how it reaches a cluster, where it reports progress) is
/// neither sent nor kept.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Input: a file, a folder or a glob of JSONL (`.jsonl`, `.jsonl.gz`,
    /// `.jsonl.zst`; one object per line) or Parquet (`.parquet`) shards,
    /// local or an object store URL (`s3://bucket/corpus/`, `file:///…`).
    /// Quote a glob so the shell leaves it alone.
    #[arg(long)]
    pub input: String,
    /// Output: a local folder or an object store URL (parts, manifest,
    /// errors file).
    #[arg(long)]
    pub output: String,
    /// Format of the output parts.
    #[arg(long, value_enum, default_value_t = Format::Parquet)]
    pub format: Format,
    /// Input field with the id.
    #[arg(long = "id-column", value_name = "COLUMN", default_value = "id")]
    pub id_field: String,
    /// Input field with the text.
    #[arg(long = "text-column", value_name = "COLUMN", default_value = "text")]
    pub text_field: String,
    /// Input fields to keep in the output beside the job's own columns
    /// (comma-separated; the text column may be one).
    #[arg(long, value_delimiter = ',')]
    pub output_columns: Vec<String>,
    /// Rows per batch.
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Rows read ahead and sorted by length before batches are cut from
    /// them, so batches carry little padding (0: batches in input order;
    /// batch ids depend on it).
    #[arg(long, default_value_t = DEFAULT_SORT_WINDOW)]
    pub sort_window: usize,
    /// Estimated tokens per batch at most, padding included (rows × the
    /// longest row's 2 + bytes/4): long texts go in smaller batches. Batch
    /// ids depend on it.
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Actors per node (default: one per GPU where they run on GPUs, else
    /// one per CPU).
    #[arg(long)]
    pub actors_per_node: Option<usize>,
    /// Actors in all: a count, MIN..MAX (on a cluster the job starts once
    /// MIN are placed and grows to MAX as workers with room join), or
    /// auto (one per free slot, growing onto every worker that joins).
    /// Default: locally one per GPU, else per CPU; on a cluster one per
    /// GPU of every worker with GPUs, else one per CPU, or
    /// --actors-per-node on each worker.
    #[arg(long)]
    pub actors: Option<ActorCount>,
    /// What each actor's placement-group bundle reserves on a cluster, as
    /// NAME=AMOUNT[,NAME=AMOUNT…] (default `cpu=1`, or `gpu=1` when every
    /// worker has GPUs).
    #[arg(long, value_parser = parse_bundle)]
    pub actor_resources: Option<Resources>,
    /// How the actors' bundles are spread over the workers: pack, spread,
    /// strict-pack or strict-spread.
    #[arg(long, default_value = "spread")]
    #[serde(with = "as_text")]
    pub placement: Strategy,
    /// How long the actors' placement group may wait for resources before
    /// the job fails, naming what is short where, in seconds.
    #[arg(long, default_value_t = 30)]
    pub placement_timeout_s: u64,
    /// Batches in flight at most (default: 2 per actor, more on GPUs).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Bytes of batches in flight at most (inputs and results), in MiB.
    #[arg(long, default_value_t = DEFAULT_MEMORY_BUDGET >> 20)]
    pub memory_budget_mb: usize,
    /// A batch running this many times the running p95 of the other
    /// actors' batches (and at least 2 s) is sent again to an idle actor;
    /// the first answer wins. 0: never sent again before its deadline.
    #[arg(long, default_value_t = DEFAULT_HEDGE_AFTER)]
    #[serde(default = "default_hedge_after")]
    pub hedge_after: u32,
    /// Job id (default: from the input's content, the settings batch ids
    /// depend on, and what the application adds).
    #[arg(long)]
    pub job_id: Option<String>,
    /// Restarts allowed per actor within --restart-window-s (a failed
    /// actor is restarted after a wait from 100 ms doubling to 10 s); one
    /// more and the job stops.
    #[arg(long, default_value_t = 5)]
    pub max_restarts: u32,
    /// The window of --max-restarts, in seconds.
    #[arg(long, default_value_t = 60)]
    pub restart_window_s: u64,
    /// How the driver reaches a cluster; without `head`, the job runs in
    /// this process.
    #[command(flatten)]
    #[serde(skip)]
    pub cluster: Join,
    /// Show a progress bar (on a terminal); otherwise log progress lines.
    #[arg(skip)]
    #[serde(skip)]
    pub progress_bar: bool,
    /// Where to publish `(rows done, rows in all)` as the job goes (all
    /// known once the input is scanned; 0 before).
    #[arg(skip)]
    #[serde(skip)]
    pub progress_to: Option<tokio::sync::watch::Sender<(u64, u64)>>,
    /// Where to publish the id of the placement group the job's actors
    /// run in, once created (on a cluster).
    #[arg(skip)]
    #[serde(skip)]
    pub group_to: Option<tokio::sync::watch::Sender<GroupId>>,
    /// Where the job keeps its account of its batches (a detached job's
    /// driver reports it to the head).
    #[arg(skip)]
    #[serde(skip)]
    pub meter: Option<super::JobMeter>,
    /// The roots the job's input shards must lie under where they really
    /// are (links resolved): a detached job's, its node's allowed roots.
    /// `None`: any.
    #[arg(skip)]
    #[serde(skip)]
    pub confined_to: Option<flotilla_proto::roots::AllowedRoots>,
}

/// Serde of a setting by its text (`auto`, `int8`, `strict-spread`): the
/// form its flag takes, for `#[serde(with = "as_text")]`.
pub mod as_text {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Writes `value` as its `Display` text.
    pub fn serialize<T: std::fmt::Display, S: Serializer>(
        value: &T,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    /// Reads a value from its text, with its parser's error.
    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: std::str::FromStr<Err: std::fmt::Display>,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

impl Settings {
    /// How often one actor may be restarted (after a panic or a failure)
    /// before the job stops.
    pub fn restart_limit(&self) -> Intensity {
        Intensity {
            max_restarts: self.max_restarts,
            within: Duration::from_secs(self.restart_window_s.max(1)),
        }
    }

    /// How long the actors' placement group may stay pending.
    pub fn placement_timeout(&self) -> Duration {
        Duration::from_secs(self.placement_timeout_s)
    }

    /// Bytes of batches in flight at most.
    pub fn memory_budget(&self) -> usize {
        self.memory_budget_mb.saturating_mul(1 << 20)
    }

    /// How rows are cut into batches.
    pub fn batching(&self) -> Batching {
        Batching {
            size: self.batch_size,
            sort_window: self.sort_window,
            max_tokens: self.max_batch_tokens,
        }
    }

    /// The fields read from the input.
    pub fn fields(&self) -> Fields {
        Fields {
            id: self.id_field.clone(),
            text: self.text_field.clone(),
            extra: self.output_columns.clone(),
        }
    }

    /// How progress is shown and published, for an input of `total` rows
    /// (when known).
    pub fn progress(&self, total: Option<u64>) -> ProgressConfig {
        ProgressConfig {
            bar: self.progress_bar,
            total,
            report: self.progress_to.clone(),
            meter: self.meter.clone(),
        }
    }

    /// `defaults` with the batches in flight, the memory budget and the
    /// hedging these settings give.
    pub fn pipeline(&self, defaults: PipelineConfig) -> PipelineConfig {
        PipelineConfig {
            max_in_flight: self
                .max_in_flight
                .map_or(defaults.max_in_flight, |m| m.max(1)),
            memory_budget: self.memory_budget(),
            hedge: defaults.hedge.filter(|_| self.hedge_after > 0).map(|h| {
                flotilla::pipeline::Hedging {
                    after: self.hedge_after,
                    ..h
                }
            }),
            ..defaults
        }
    }

    /// The job id a run without `--job-id` starts from: the first bytes of
    /// the input's `digest` and the settings batch ids depend on
    /// (`0a1b2c3d4e5f6a7b-b64-w4096`). The application appends what else
    /// makes its output differ.
    pub fn default_job_id(&self, digest: &[u8]) -> String {
        let digest: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let mut id = format!("{digest}-b{}", self.batch_size);
        if self.sort_window > 0 {
            id.push_str(&format!("-w{}", self.sort_window));
        }
        if let Some(t) = self.max_batch_tokens {
            id.push_str(&format!("-t{t}"));
        }
        id
    }

    /// The job's placement group on `workers`: `--actors` bundles of
    /// `--actor-resources` under `--placement`; by default one bundle per
    /// GPU of every worker when all have GPUs (`gpu=1`), else per CPU
    /// (`cpu=1`), or `--actors-per-node` on each worker (sharing the
    /// CPUs of the smallest worker when they outnumber them).
    pub fn group_spec(&self, workers: &[MemberView]) -> GroupSpec {
        let gpus = workers.iter().all(|m| m.resources.gpus > 0);
        let per_node = |m: &MemberView| {
            self.actors_per_node.unwrap_or(if gpus {
                m.resources.gpus as usize
            } else {
                m.resources.cpus as usize
            })
        };
        let slots = workers.iter().map(per_node).sum();
        let count = self.actors.map_or(slots, |a| a.initial(slots)).max(1);
        let one = self.actor_resources.clone().unwrap_or_else(|| {
            if gpus {
                bundle(&[("gpu", 1.0)])
            } else {
                let fewest = workers.iter().map(|m| m.resources.cpus).min().unwrap_or(1);
                let share = self
                    .actors_per_node
                    .map_or(1.0, |n| (f64::from(fewest) / n.max(1) as f64).min(1.0));
                bundle(&[("cpu", share)])
            }
        });
        GroupSpec::new(self.placement, vec![one; count]).with_timeout(self.placement_timeout())
    }

    /// Checks every setting's range, with `reserved` the output columns
    /// the job writes itself: counts that must be positive are (batch
    /// size, token budget, actors, batches in flight, memory budget), and
    /// no output column is named twice or takes a reserved name. A job
    /// that fails this reads nothing.
    pub fn check(&self, reserved: &[&str]) -> Result<(), SettingError> {
        let positive: [(&'static str, Option<usize>); 5] = [
            ("--batch-size", Some(self.batch_size)),
            ("--max-batch-tokens", self.max_batch_tokens),
            ("--actors-per-node", self.actors_per_node),
            ("--max-in-flight", self.max_in_flight),
            ("--memory-budget-mb", Some(self.memory_budget_mb)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == Some(0)) {
            return Err(positive_count(name));
        }
        let mut seen = HashSet::new();
        match self
            .output_columns
            .iter()
            .find(|c| reserved.contains(&c.as_str()) || !seen.insert(*c))
        {
            Some(column) => Err(SettingError {
                name: "--output-columns",
                value: column.clone(),
                rule: "a column is named once and not as one the job writes itself",
            }),
            None => Ok(()),
        }
    }
}

/// The error of a count that must be positive, given 0.
pub fn positive_count(name: &'static str) -> SettingError {
    SettingError {
        name,
        value: "0".into(),
        rule: "it must be at least 1",
    }
}

/// Workers a job may place actors on: up, not the head, offering CPUs or
/// GPUs (a driver that joined for the job offers none).
pub fn workers_of(table: &flotilla::Table) -> Vec<MemberView> {
    table
        .up()
        .filter(|m| m.name != table.head)
        .filter(|m| m.resources.cpus > 0 || m.resources.gpus > 0)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        settings: Settings,
    }

    fn settings(flags: &[&str]) -> Settings {
        use clap::Parser;
        let args = ["job", "--input=in", "--output=out"].iter().chain(flags);
        Flags::try_parse_from(args).unwrap().settings
    }

    #[test]
    fn counts_that_must_be_positive_are_refused_at_zero_by_name() {
        assert!(settings(&[]).check(&["id"]).is_ok());
        let e = settings(&["--batch-size=0"]).check(&[]).unwrap_err();
        assert!(e.to_string().contains("--batch-size is 0"), "{e}");
        let e = settings(&["--max-in-flight=0"]).check(&[]).unwrap_err();
        assert_eq!(e.name, "--max-in-flight");
    }

    #[test]
    fn output_columns_are_named_once_and_never_as_the_jobs_own() {
        let twice = settings(&["--output-columns=a,b,a"]);
        assert_eq!(twice.check(&[]).unwrap_err().value, "a");
        let own = settings(&["--output-columns=lang,id"]);
        assert_eq!(own.check(&["id"]).unwrap_err().value, "id");
        assert!(own.check(&["embedding"]).is_ok());
    }

    #[test]
    fn the_settings_travel_as_json_and_unknown_fields_are_refused() {
        let s = settings(&["--placement=strict-pack", "--batch-size=3"]);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"placement\":\"strict-pack\""), "{json}");
        let back: Settings = serde_json::from_str(&json).unwrap();
        assert_eq!((back.placement, back.batch_size), (Strategy::StrictPack, 3));
        let unknown = json.replacen('{', "{\"surprise\":1,", 1);
        assert!(serde_json::from_str::<Settings>(&unknown).is_err());
    }

    #[test]
    fn hedging_is_set_by_its_multiple_and_turned_off_at_zero() {
        let defaults = PipelineConfig::for_workers(2, std::time::Duration::from_secs(60));
        let hedge = |flags: &[&str]| settings(flags).pipeline(defaults).hedge;
        assert_eq!(hedge(&[]).map(|h| h.after), Some(DEFAULT_HEDGE_AFTER));
        assert_eq!(hedge(&["--hedge-after=5"]).map(|h| h.after), Some(5));
        assert_eq!(hedge(&["--hedge-after=0"]), None);
        // Settings kept before the flag existed read back with its default.
        let json = serde_json::to_string(&settings(&[])).unwrap();
        let old = json.replace(",\"hedge_after\":3", "");
        assert_ne!(old, json);
        let back: Settings = serde_json::from_str(&old).unwrap();
        assert_eq!(back.hedge_after, DEFAULT_HEDGE_AFTER);
    }

    #[test]
    fn the_default_job_id_names_what_batch_ids_depend_on() {
        let digest = [0xab; 32];
        assert_eq!(
            settings(&[]).default_job_id(&digest),
            "abababababababab-b64-w4096"
        );
        let s = settings(&["--sort-window=0", "--max-batch-tokens=900"]);
        assert_eq!(s.default_job_id(&digest), "abababababababab-b64-t900");
    }
}
