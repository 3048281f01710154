//! The embedded default: embedding actors in this process, one per GPU
//! where they run on GPUs, else one per core.

use std::time::{Duration, Instant};

use flotilla::ractor::{ActorRef, call_t};
use flotilla_data::job::{Links, Pool};

use super::driver::{Workers, drive, embedder_args};
use super::{ActorError, JobConfig, JobError, Summary};
use crate::actor::{EmbedMsg, Embedder};
use crate::encoder::model_folder::ModelFolder;

/// Runs the job with actors in this process.
pub(crate) async fn run(config: JobConfig) -> Result<Summary, JobError> {
    let started = Instant::now();
    if !config.model.is_dir() {
        return Err(JobError::NoModel(config.model.clone()));
    }
    // Configuration errors name the file at fault before any model loads,
    // and so do prompts and dimensions the folder cannot give.
    config.embed_options(&ModelFolder::open(&config.model)?)?;

    // The actors load the model; the revision and width of the job are what
    // they report, so the weights are read and hashed once per actor only.
    // This machine's GPUs, handed out one per actor (none asked with
    // `--device cpu`).
    let gpus = match config.device {
        crate::DeviceChoice::Cpu => 0,
        _ => crate::cuda_devices().len(),
    };
    let slots = flotilla::gpus::GpuSlots::new(gpus);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let free = config
        .job
        .actors_per_node
        .unwrap_or(if gpus > 0 { gpus } else { cpus });
    // This machine does not change under the job: a range takes as many
    // of its slots as it may from the start.
    let count = config
        .job
        .actors
        .map_or(free, |a| a.initial(free).max(a.most(free).min(free)))
        .max(1);
    const INFO_WITHIN: Duration = Duration::from_secs(10);
    // The actors share one loaded model (restarted ones too).
    let models = crate::SharedModels::default();
    let args = embedder_args(&config);
    let embedder = move || {
        let actor = Embedder {
            models: models.clone(),
            gpus: slots.clone(),
            ..Embedder::default()
        };
        (actor, args.clone())
    };
    let describe = |actor: ActorRef<EmbedMsg>| async move {
        call_t!(actor, EmbedMsg::Info, INFO_WITHIN.as_millis() as u64)
            .map_err(|_| format!("it did not describe its model within {INFO_WITHIN:?}"))
    };
    let limit = config.job.restart_limit();
    let (pool, infos, stopper) = Pool::local(count, embedder, describe, limit)
        .await
        .map_err(ActorError::Start)?;
    if let Some(other) = infos.iter().find(|i| i.revision != infos[0].revision) {
        let revisions = ActorError::Revisions(infos[0].revision.clone(), other.revision.clone());
        stopper.stop().await;
        return Err(revisions.into());
    }
    let workers = Workers::new(pool, &infos);
    let result = drive(&config, started, workers, Links::local(), None).await;
    stopper.stop().await;
    result
}
