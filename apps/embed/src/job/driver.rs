//! The job proper, once embedding actors run (in this process or on a
//! cluster): the data layer's batch job (`flotilla_data::job`) over them,
//! with the embed job's manifest, batches whose texts may travel as
//! objects, and parts of vectors.
//!
//! ```text
//! input ─► flotilla_data::job (windows, ids, pipeline, output, errors file)
//!       ─► EmbedParts::batch (texts into the driver's object store)
//!       ─► embedding actors ─► EmbedParts::part (vectors read, checked, encoded; objects released)
//! ```
//!
//! Memory is flat in the input: the batches in flight, a chunk of rows
//! read ahead, a 16-byte digest per id, a fixed-size latency histogram and
//! at most a megabyte of refused rows before they stream out.

use std::time::{Duration, Instant};

use flotilla::pipeline::PipelineConfig;
use flotilla_data::Row;
use flotilla_data::job::{
    BatchJob, BatchJobError, BatchWork, JobMeter, Links, PartError, PartOf, Parts, Pool,
};

use super::input::Input;
use super::sink::{Column, Manifest, encode_part};
use super::stage::{Batch, EmbedStage, Output, read_result};
use super::summary::Summary;
use super::{JobConfig, JobError};
use crate::actor::{EmbedMsg, EmbedderArgs, ModelInfo, Work};

/// Embedding actors the job runs on and what they loaded.
pub(crate) struct Workers {
    /// The actors, supervised.
    pub(crate) pool: Pool<EmbedMsg>,
    /// How many.
    pub(crate) actors: usize,
    /// The model every actor loaded.
    pub(crate) info: ModelInfo,
    /// Where the actors run (`cpu ×2 (f32)`, `cuda:0 (f16), cuda:1 (f16)`).
    pub(crate) devices: String,
    /// How many of them run on a GPU.
    pub(crate) gpu_actors: usize,
    /// On a cluster, where the bundles were placed (for the summary).
    pub(crate) placement: Option<String>,
}

/// Where actors that reported `infos` run, each device once with its
/// count: `cpu ×2 (f32)`, `cuda:0 (f16), cuda:1 (f16)`.
pub(crate) fn devices_of(infos: &[ModelInfo]) -> String {
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for i in infos {
        match seen
            .iter_mut()
            .find(|(d, p, _)| *d == i.device && *p == i.precision)
        {
            Some((_, _, n)) => *n += 1,
            None => seen.push((&i.device, &i.precision, 1)),
        }
    }
    seen.iter()
        .map(|(d, p, n)| match n {
            1 => format!("{d} ({p})"),
            n => format!("{d} ×{n} ({p})"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Workers {
    /// The actors of `pool`, which reported `infos` (same revision, at
    /// least one): the job's model facts are the first actor's, with the
    /// slowest load.
    pub(crate) fn new(pool: Pool<EmbedMsg>, infos: &[ModelInfo]) -> Self {
        let info = ModelInfo {
            load_ms: infos.iter().map(|i| i.load_ms).max().unwrap_or(0),
            ..infos[0].clone()
        };
        Self {
            pool,
            actors: infos.len(),
            info,
            devices: devices_of(infos),
            gpu_actors: infos.iter().filter(|i| i.device != "cpu").count(),
            placement: None,
        }
    }
}

/// What each embedding actor of the job is started with.
pub(crate) fn embedder_args(config: &JobConfig) -> EmbedderArgs {
    EmbedderArgs {
        device: config.device.to_string(),
        precision: config.precision.to_string(),
        micro_batch: config.micro_batch.min(u32::MAX as usize) as u32,
        prompt: config.prompt.clone(),
        prompt_name: config.prompt_name.clone(),
        dim: config
            .dim
            .map_or(0, |d| u32::try_from(d).unwrap_or(u32::MAX)),
        zeros: config.zeros,
        cpu_time: !config.no_cpu_time,
        // The folder as the nodes will read it: absolute, links and `..`
        // resolved where it exists here (nodes check it against their
        // roots as given).
        ..EmbedderArgs::new(
            std::fs::canonicalize(&config.model)
                .unwrap_or_else(|_| config.model.clone())
                .to_string_lossy(),
        )
    }
}

/// Batches in flight per actor on a GPU by default: one running, two
/// tokenized and queued behind it (the pipelined threads' queue), one on
/// its way, so the GPU never waits for the CPU side.
const IN_FLIGHT_PER_GPU_ACTOR: usize = 4;

/// The pipeline's limits for `actors` embedding actors of which
/// `gpu_actors` run on GPUs: `max_in_flight` if given, else the
/// framework's default of two per actor and
/// [`IN_FLIGHT_PER_GPU_ACTOR`] per GPU actor.
fn pipeline_config(actors: usize, gpu_actors: usize, config: &JobConfig) -> PipelineConfig {
    let mut defaults = PipelineConfig::for_workers(actors, crate::actor::BATCH_DEADLINE);
    defaults.max_in_flight += gpu_actors.min(actors) * IN_FLIGHT_PER_GPU_ACTOR.saturating_sub(2);
    config.job.pipeline(defaults)
}

/// How long a batch's texts wait for room in the driver's store before
/// the job sends texts in its requests instead.
const TEXTS_PUT_WITHIN: Duration = Duration::from_secs(10);

/// How long a finished job waits for its last releases.
const RELEASES_WITHIN: Duration = Duration::from_secs(5);

/// What the embed job adds to the data layer's batch job: batches whose
/// texts go into the driver's object store while it takes them, and
/// parts of the vectors each batch gets back, in the reply or in a result
/// object read in place, checked and released.
struct EmbedParts {
    manifest: Manifest,
    /// The output columns beside `id` and `embedding`.
    names: Vec<String>,
    /// Their types, once the input gave them.
    columns: Option<Vec<Column>>,
    objects: Option<flotilla::Objects>,
    /// The store batches put their texts in, while it takes them.
    texts_as_objects: Option<flotilla::Objects>,
    releases: flotilla::releases::Releases,
    /// The job's account, told what each answer says the actor did.
    meter: JobMeter,
}

/// What an actor said it did with a batch, as the job's account takes it.
fn batch_work(work: Work) -> BatchWork {
    BatchWork {
        lengths: work.lengths,
        padded_tokens: work.padded_tokens,
        tokenization: Duration::from_micros(work.tokenization_us),
        queue: Duration::from_micros(work.queue_us),
        inference: Duration::from_micros(work.inference_us),
        cpu: Duration::from_micros(work.cpu_us),
    }
}

impl Parts<EmbedStage> for EmbedParts {
    async fn batch(&mut self, rows: Vec<Row>) -> Batch {
        let mut batch = Batch { rows, object: None };
        if let Some(objects) = &self.texts_as_objects
            && let Err(e) = batch.put_texts(objects).await
        {
            // A store too small (a container's /dev/shm, say) or full:
            // this batch and the rest carry their texts in the request.
            tracing::warn!(error = %e, "the driver's object store refused a batch; texts go in the requests from now on");
            self.texts_as_objects = None;
        }
        batch
    }

    async fn part(
        &mut self,
        batch: &Batch,
        output: Output,
        of: PartOf<'_>,
    ) -> Result<Vec<u8>, PartError> {
        let columns = self.columns.get_or_insert_with(|| {
            self.names
                .iter()
                .zip(of.types.iter().copied())
                .map(|(name, cells)| Column::new(name, cells))
                .collect()
        });
        let (encoded, work) = match output {
            Output::Values(values, work) => (
                encode_part(&self.manifest, columns, &batch.rows, &values),
                work,
            ),
            Output::Object(object, work) => {
                let (objects, rows) = (self.objects.as_ref(), batch.rows.len());
                let read = read_result(objects, &object, &self.manifest, rows).await;
                // The vectors are read in place: encoded before the object
                // is released.
                let encoded = read.map(|vectors| {
                    let values = flotilla::objects::f32s(vectors.values.as_slice());
                    encode_part(&self.manifest, columns, &batch.rows, &values)
                });
                self.releases.release(Some(object), encoded.is_err());
                let encoded = encoded.map_err(|reason| {
                    PartError::Unusable(format!("result object unreadable: {reason}"))
                })?;
                (encoded, work)
            }
        };
        let bytes = encoded.map_err(|e| PartError::Encode(Box::new(e)))?;
        self.meter.work(&batch_work(work));
        Ok(bytes)
    }

    async fn finish(&mut self) {
        self.releases.finish(RELEASES_WITHIN).await;
    }
}

/// The job id a run without `--job-id` gets: a digest of the input, the
/// settings batch ids depend on, the prompt, the width and the revision.
fn job_id(config: &JobConfig, digest: &[u8], info: &ModelInfo) -> String {
    let revision = crate::ModelRevision::new(info.revision.clone());
    let mut id = config.job.default_job_id(digest);
    if !info.prompt.is_empty() {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(info.prompt.as_bytes());
        id.push_str("-p");
        id.extend(digest[..4].iter().map(|b| format!("{b:02x}")));
    }
    if config.dim.is_some() {
        id.push_str(&format!("-d{}", info.dim));
    }
    format!("{id}-{}", revision.short())
}

impl From<BatchJobError> for JobError {
    fn from(e: BatchJobError) -> Self {
        // The restart limit is told with the flags that set it.
        match e {
            BatchJobError::RestartLimit(e) => JobError::RestartLimit(e),
            other => JobError::Batch(other),
        }
    }
}

/// Runs the job over `workers`, reaching them through `links`; with
/// `objects`, texts and results may travel as objects.
pub(crate) async fn drive(
    config: &JobConfig,
    started: Instant,
    workers: Workers,
    links: Links,
    objects: Option<flotilla::Objects>,
) -> Result<Summary, JobError> {
    // Every actor has its model: what follows is the job itself.
    let ready_after = started.elapsed();
    let info = workers.info.clone();
    let info = &info;
    let settings = &config.job;
    let (input, scan) = Input::resolve_and_scan(
        &settings.input,
        settings.job_id.is_none(),
        settings.confined_to.as_ref(),
    )
    .await?;
    let job_id = match &settings.job_id {
        Some(id) => id.clone(),
        None => job_id(config, &scan.digest.expect("hashed without a job id"), info),
    };
    let manifest = Manifest {
        job_id: job_id.clone(),
        model_revision: info.revision.clone(),
        dim: info.dim,
        batch_size: settings.batch_size as u32,
        format: settings.format,
        columns: settings.output_columns.clone(),
        sort_window: u32::try_from(settings.sort_window).unwrap_or(u32::MAX),
        max_batch_tokens: settings
            .max_batch_tokens
            .map_or(0, |t| u32::try_from(t).unwrap_or(u32::MAX)),
        prompt: info.prompt.clone(),
        similarity: info.similarity.clone(),
    };
    let meter = settings.meter.clone().unwrap_or_default();
    let mut progress = settings.progress(scan.rows);
    progress.meter = Some(meter.clone());
    let job = BatchJob {
        input: settings.input.clone(),
        resolved: Some(input),
        fields: settings.fields(),
        output: settings.output.clone(),
        manifest: manifest.clone(),
        extension: settings.format.extension(),
        batching: settings.batching(),
        pipeline: pipeline_config(workers.actors, workers.gpu_actors, config),
        progress,
    };
    let stage = EmbedStage {
        revision: manifest.model_revision.clone(),
        dim: info.dim,
    };
    let parts = EmbedParts {
        meter: meter.clone(),
        names: settings.output_columns.clone(),
        columns: None,
        manifest,
        texts_as_objects: objects
            .clone()
            .map(|o| o.with_put_timeout(TEXTS_PUT_WITHIN)),
        releases: flotilla::releases::Releases::new(objects.clone()),
        objects,
    };
    let before_run = started.elapsed();
    let members = links.members.clone();
    let mut job = flotilla_data::job::run(links, job, stage, workers.pool, parts).await?;
    let account = meter.snapshot();
    let table = members.map(|rx| rx.borrow().clone());
    job.first_part_after = job.first_part_after.map(|d| before_run + d);
    job.elapsed = started.elapsed();
    Ok(Summary {
        job_id,
        output: settings.output.clone(),
        format: Some(settings.format),
        job,
        model_load: Duration::from_millis(info.load_ms),
        actors: workers.actors,
        devices: workers.devices,
        ready_after,
        peak_rss: flotilla::process::peak_rss_bytes(),
        placement: workers.placement,
        work: super::summary::Work::of(&account, table.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(device: &str, precision: &str) -> ModelInfo {
        ModelInfo {
            revision: "sha256:r".into(),
            dim: 384,
            load_ms: 1,
            device: device.into(),
            precision: precision.into(),
            prompt: String::new(),
            similarity: String::new(),
        }
    }

    #[test]
    fn devices_are_listed_once_each_with_their_count() {
        let cpu = [info("cpu", "f32"), info("cpu", "f32")];
        assert_eq!(devices_of(&cpu), "cpu ×2 (f32)");
        let gpus = [
            info("cuda:0", "f16"),
            info("cuda:1", "f16"),
            info("cpu", "f16"),
        ];
        assert_eq!(devices_of(&gpus), "cuda:0 (f16), cuda:1 (f16), cpu (f16)");
    }

    #[test]
    fn gpu_actors_get_more_batches_in_flight_unless_told() {
        let config = JobConfig::new("in", "out", "model");
        assert_eq!(pipeline_config(3, 0, &config).max_in_flight, 6);
        assert_eq!(
            pipeline_config(2, 2, &config).max_in_flight,
            2 * IN_FLIGHT_PER_GPU_ACTOR
        );
        let mut told = config;
        told.job.max_in_flight = Some(3);
        assert_eq!(pipeline_config(2, 2, &told).max_in_flight, 3);
    }
}
