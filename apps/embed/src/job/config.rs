//! What a job is told: its input, output, model and limits, defined once
//! for the command line, Rust programs and detached jobs.

use std::path::PathBuf;

use flotilla_data::job::{Settings, as_text, positive_count};
use serde::{Deserialize, Serialize};

/// Texts per forward pass on the CPU unless told otherwise (the embedding
/// actor's default).
pub use crate::actor::DEFAULT_MICRO_BATCH;
pub use flotilla_data::job::{
    DEFAULT_BATCH_SIZE, DEFAULT_MEMORY_BUDGET, DEFAULT_SORT_WINDOW, SettingError,
};

/// Settings of an embed job, defined once: the flags of `node embed`
/// (`clap`), the fields a Rust program sets, and the wire form of a
/// detached job (`serde`, see [`super::detached::DetachedJob`]): every
/// batch job's [`Settings`], and the model's.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Input, output, batches, actors and limits, as every batch job has.
    #[command(flatten)]
    pub job: Settings,
    /// Model folder (Hugging Face layout).
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    pub model: PathBuf,
    /// What the embedding actors run on: `auto` (each actor one GPU of its
    /// node where the node has GPUs and the binary was built with the
    /// `cuda` feature, else the CPU, saying why), `cpu`, or `cuda` (a GPU,
    /// or the job fails).
    #[arg(long, default_value = "auto")]
    #[serde(with = "as_text")]
    pub device: crate::DeviceChoice,
    /// Number type of the model's dense layers: f32, f16 or bf16 (and
    /// attention in it too), or int8 on the CPU (quantized matrix
    /// products, vectors within cosine 0.99 of f32's, faster). Embeddings,
    /// layer norms and pooling stay f32.
    #[arg(long, default_value = "f32")]
    #[serde(with = "as_text")]
    pub precision: crate::Precision,
    /// Text put before every input text, as sentence-transformers'
    /// `prompt` (e5 models: "query: " or "passage: "). Default: the
    /// model folder's default prompt, if it names one.
    #[arg(long, conflicts_with = "prompt_name")]
    pub prompt: Option<String>,
    /// One of the model folder's named prompts
    /// (config_sentence_transformers.json), e.g. `query`.
    #[arg(long)]
    pub prompt_name: Option<String>,
    /// Keep the first N dimensions of every vector, renormalised
    /// (Matryoshka models); at most the model's width.
    #[arg(long)]
    pub dim: Option<usize>,
    /// Texts per forward pass on the CPU, after sorting a batch by length;
    /// 0: a batch is one forward pass, tokenized while the one before runs
    /// (what actors on GPUs always do).
    #[arg(long, default_value_t = DEFAULT_MICRO_BATCH)]
    pub micro_batch: usize,
    /// The actors answer vectors of zeros without running the model: the
    /// job's CPU side (reading, tokenizing, batching, routing, writing)
    /// measured alone, as the `feed` bench does. The revision recorded in
    /// the manifest and the default job id starts with
    /// [`crate::actor::ZEROS_REVISION_PREFIX`], so such an output is never
    /// taken for, nor resumed as, the model's vectors.
    #[arg(skip)]
    #[serde(skip)]
    pub zeros: bool,
    /// The actors read no CPU clocks around each batch: the job's
    /// CPU-seconds and cost are not counted (tokens, stage times and rows
    /// still are). What the `observe_overhead` bench runs its baseline
    /// with.
    #[arg(long)]
    #[serde(default)]
    pub no_cpu_time: bool,
}

/// The job's flags alone, parsed as `node embed` parses them.
#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    job: JobConfig,
}

impl JobConfig {
    /// Parses `args` as the flags of `node embed` (`--input`, `--output`,
    /// `--batch-size 48`, …); settings not given take their defaults.
    pub fn from_flags<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;
        let flags = std::iter::once(std::ffi::OsString::from("embed"))
            .chain(args.into_iter().map(Into::into));
        Ok(Flags::try_parse_from(flags)?.job)
    }

    /// A local job from `input` to `output` with the model in `model` and
    /// every other setting at its default.
    pub fn new(
        input: impl Into<String>,
        output: impl Into<String>,
        model: impl Into<PathBuf>,
    ) -> Self {
        let mut config = Self::from_flags(["--input=", "--output="]).expect("the defaults parse");
        config.job.input = input.into();
        config.job.output = output.into();
        config.model = model.into();
        config
    }

    /// Checks every setting's range (see [`Settings::check`]; the
    /// output columns must not be `id` or `embedding`, and `--dim` is at
    /// least 1). A job that fails this reads nothing.
    pub fn check(&self) -> Result<(), SettingError> {
        self.job.check(&super::sink::RESERVED)?;
        match self.dim {
            Some(0) => Err(positive_count("--dim")),
            _ => Ok(()),
        }
    }

    /// What the job makes of the model in `folder`'s vectors, or why the
    /// folder cannot do what the job asks (a prompt name it lacks, more
    /// dimensions than it has).
    pub fn embed_options(
        &self,
        folder: &crate::ModelFolder,
    ) -> Result<crate::EmbedOptions, crate::LoadError> {
        folder.embed_options(
            self.prompt.as_deref(),
            self.prompt_name.as_deref(),
            self.dim,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_and_the_model_settings_are_checked_by_name() {
        let ok = JobConfig::new("in", "out", "model");
        assert!(ok.check().is_ok());
        let mut c = ok.clone();
        c.job.batch_size = 0;
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("--batch-size is 0"), "{e}");
        let mut c = ok.clone();
        c.dim = Some(0);
        assert!(c.check().unwrap_err().to_string().contains("--dim"));
        let mut c = ok;
        c.job.output_columns = vec!["embedding".into()];
        assert_eq!(c.check().unwrap_err().name, "--output-columns");
    }
}
