//! Cluster mode: the driver joins the cluster as a node that offers no
//! resources, places its embedding actors with a placement group (one
//! bundle per actor), spawns one in each bundle, keeps those whose model
//! revision is the job's, and drives the same pipeline over QUIC. The
//! batches of an actor that is lost go to the others at once; the actor
//! is restarted in its bundle, which the head places again when its node
//! is lost.
//!
//! ```text
//! driver (node, no resources) ── create_group(N × bundle, strategy) ──► head
//!        ── spawn_on(bundle's node, "flotilla.embedder") ──► Embedder in each bundle
//!        └─ pipeline ── EmbedRequest / EmbedReply over the QUIC mesh ──┘
//! ```
//!
//! The actors are owned by the driver's node: when it leaves or goes down,
//! the workers stop them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::Node;
use flotilla::ractor::{ActorRef, call_t};
use flotilla_data::job::{Placed, Placement, Stopper};

use super::driver::{Workers, drive, embedder_args};
use super::{ActorError, ActorStartError, ClusterError, JobConfig, JobError, Summary};
use crate::actor::{EmbedMsg, KIND};
use crate::encoder::model_folder::ModelFolder;

/// How long spawning one actor (its model load included) may take.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a spawned actor may take to describe its model.
const INFO_WITHIN: Duration = Duration::from_secs(30);

/// Runs the job on the cluster whose head listens at `head`.
pub(crate) async fn run(config: JobConfig, head: SocketAddr) -> Result<Summary, JobError> {
    let started = Instant::now();
    // The driver's own copy of the model, when it has one, is the reference
    // every worker must match; otherwise the first worker's is.
    let reference = reference_revision(&config).await?;
    let node_config = config.job.cluster.node_config(head, "embed-driver");
    let node = Node::builder(node_config)
        .start()
        .await
        .map_err(|source| JobError::Join { head, source })?;
    let node = Arc::new(node);
    let result = run_on(&config, &node, started, reference).await;
    node.shutdown().await;
    result
}

/// The model revision of the driver's own copy of the model, when it has
/// one: the reference every worker must match (otherwise the first
/// worker's is).
async fn reference_revision(config: &JobConfig) -> Result<Option<String>, JobError> {
    if config.model.exists() {
        let folder = ModelFolder::open(&config.model)?;
        config.embed_options(&folder)?;
        Ok(Some(folder.revision()?.to_string()))
    } else {
        Ok(None)
    }
}

/// Runs the job with `node` as its driver: a node of the cluster already
/// (this process's own, or the node a detached job runs on).
pub(crate) async fn run_detached(
    config: &JobConfig,
    node: &Arc<Node>,
) -> Result<Summary, JobError> {
    let started = Instant::now();
    // A job submitted through the library, not `node embed`, is checked
    // here, where it runs.
    config.check()?;
    let reference = reference_revision(config).await?;
    run_on(config, node, started, reference).await
}

async fn run_on(
    config: &JobConfig,
    node: &Arc<Node>,
    started: Instant,
    reference: Option<String>,
) -> Result<Summary, JobError> {
    let (workers, stopper) = start_workers(config, node, reference).await?;
    let links = flotilla_data::job::Links::of(node);
    let result = drive(config, started, workers, links, Some(node.objects())).await;
    stopper.stop().await;
    result
}

/// Places the job's actors with a placement group, spawns one in each
/// bundle, keeps those whose model is the job's, and puts them under the
/// job's supervisor, each restarted in its bundle.
async fn start_workers(
    config: &JobConfig,
    node: &Arc<Node>,
    reference: Option<String>,
) -> Result<(Workers, Stopper), JobError> {
    let members = flotilla_data::job::workers_of(&node.members());
    if members.is_empty() {
        return Err(ClusterError::NoWorkerUp.into());
    }
    let placement = Placement {
        spec: config.job.group_spec(&members),
        kind: KIND,
        name: format!("flotilla.embed.{}", node.name()),
        args: embedder_args(config),
        spawn_timeout: SPAWN_TIMEOUT,
    };
    let wait = config.job.placement_timeout() + Duration::from_secs(5);
    let describe = |actor: ActorRef<EmbedMsg>| async move {
        call_t!(actor, EmbedMsg::Info, INFO_WITHIN.as_millis() as u64)
            .map_err(|_| format!("it did not describe its model within {INFO_WITHIN:?}"))
    };
    let mut placed = Placed::start(
        node,
        placement,
        wait,
        config.job.group_to.as_ref(),
        describe,
    )
    .await
    .map_err(|e| ClusterError::Placement(Box::new(e)))?;
    if placed.actors.is_empty() {
        let failures = std::mem::take(&mut placed.failures);
        return Err(ClusterError::NoActorStarted(failures).into());
    }
    let revision = reference.unwrap_or_else(|| placed.actors[0].ready.revision.clone());
    for a in placed
        .actors
        .iter()
        .filter(|a| a.ready.revision != revision)
    {
        tracing::warn!(node = %a.member, worker_revision = %a.ready.revision, job_revision = %revision,
            "worker has another model revision; not using it");
    }
    placed.retain(|a| a.ready.revision == revision).await;
    if placed.actors.is_empty() {
        return Err(ClusterError::NoMatchingRevision(revision).into());
    }
    let at = placed.placed.clone();
    // `--actors MIN..MAX` or `auto`: the job grows onto workers that join.
    let slots = placed.actors.len();
    // It lets actors go at its tail, down to MIN (or one, for `auto`).
    let growing = config.job.actors.filter(|a| a.grows());
    let most = growing.map_or(slots, |a| a.most(slots));
    let least = growing.map_or(slots, |a| a.least().min(slots));
    let same = revision.clone();
    let (pool, infos, stopper) = placed
        .supervise_growing(
            config.job.restart_limit(),
            (least, most),
            describe,
            move |info| info.revision == same,
        )
        .await
        .map_err(|e| ActorError::Start(ActorStartError::Start(e)))?;
    let mut workers = Workers::new(pool, &infos);
    workers.placement = Some(at);
    tracing::info!(actors = infos.len(), %revision, "embedding actors ready");
    Ok((workers, stopper))
}
