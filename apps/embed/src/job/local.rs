//! The embedded default: embedding actors in this process, one per GPU
//! where they run on GPUs, else one per core.

use std::time::{Duration, Instant};

use flotilla::ractor::{Actor, ActorRef, call_t};
use flotilla::supervisor::{Child, ChildSpec, LocalChild};
use flotilla_data::job::{Links, Pool};

use super::driver::{Workers, drive, embedder_args};
use super::{ActorError, JobConfig, JobError, Summary};
use crate::actor::{EmbedMsg, Embedder, ModelInfo};
use crate::model_folder::ModelFolder;

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
    let count = config
        .actors
        .or(config.actors_per_node)
        .unwrap_or(if gpus > 0 { gpus } else { cpus })
        .max(1);
    let mut actors: Vec<(String, ActorRef<EmbedMsg>)> = Vec::with_capacity(count);
    let mut infos: Vec<ModelInfo> = Vec::with_capacity(count);
    let stop = |actors: &[(String, ActorRef<EmbedMsg>)]| {
        for (_, a) in actors {
            a.stop(None);
        }
    };
    const INFO_WITHIN: Duration = Duration::from_secs(10);
    // The actors share one loaded model (restarted ones too).
    let models = crate::SharedModels::default();
    let embedder = move || Embedder {
        models: models.clone(),
        gpus: slots.clone(),
        ..Embedder::default()
    };
    for _ in 0..count {
        let spawned = match Actor::spawn(None, embedder(), embedder_args(&config)).await {
            Ok((actor, _)) => call_t!(actor, EmbedMsg::Info, INFO_WITHIN.as_millis() as u64)
                .map(|info| (actor, info))
                .map_err(|_| ActorError::NoInfo(INFO_WITHIN)),
            Err(e) => Err(ActorError::Spawn(e)),
        };
        match spawned {
            Ok((actor, info)) => {
                actors.push(("local".to_owned(), actor));
                infos.push(info);
            }
            Err(e) => {
                stop(&actors);
                return Err(e.into());
            }
        }
    }
    let first = infos[0].clone();
    if let Some(other) = infos.iter().find(|i| i.revision != first.revision) {
        stop(&actors);
        return Err(ActorError::Revisions(first.revision.clone(), other.revision.clone()).into());
    }
    // The actors become children of the job's supervisor, which restarts
    // one that fails (its model reloaded) within the job's limit.
    let children = actors
        .iter()
        .enumerate()
        .map(|(i, (_, actor))| {
            let args = embedder_args(&config);
            let embedder = embedder.clone();
            let start = LocalChild::new(move || (embedder(), args.clone())).adopt(actor.clone());
            Child::new(ChildSpec::permanent(format!("local.{i}")), start)
        })
        .collect();
    let limit = config.restart_limit();
    let (pool, stopper) = match Pool::supervise(actors.clone(), children, limit, None).await {
        Ok(supervised) => supervised,
        Err(e) => {
            stop(&actors);
            return Err(ActorError::Spawn(e).into());
        }
    };
    let workers = Workers::new(pool, &infos);
    let result = drive(&config, started, workers, Links::local(), None).await;
    stopper.stop().await;
    result
}
