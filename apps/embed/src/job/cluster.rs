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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::ractor::{ActorRef, call_t};
use flotilla::{MemberView, Node, NodeConfig, Resources};

use flotilla::placement_groups::{GroupSpec, bundle};
use flotilla::supervisor::{Child, ChildSpec, RemoteChild, RestartType, SupervisorMsg};

use super::driver::{Workers, drive, embedder_args, supervise};
use super::{
    ClusterConfig, ClusterError, JobConfig, JobError, Summary, WorkerFailure, WorkerStartError,
};
use crate::actor::{EmbedMsg, KIND, ModelInfo};
use crate::model_folder::ModelFolder;

/// How long spawning one actor (its model load included) may take.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a spawned actor may take to describe its model.
const INFO_WITHIN: Duration = Duration::from_secs(30);

/// Runs the job on the cluster of `cluster`.
pub(crate) async fn run(config: JobConfig, cluster: ClusterConfig) -> Result<Summary, JobError> {
    let started = Instant::now();
    // The driver's own copy of the model, when it has one, is the reference
    // every worker must match; otherwise the first worker's is.
    let reference = reference_revision(&config).await?;
    let mut node_config = NodeConfig::new(
        cluster.name.clone(),
        cluster
            .listen
            .unwrap_or_else(|| flotilla::config::route_to(cluster.head)),
        cluster.certs.clone(),
    )
    .join(cluster.head);
    // A driver hosts no work: other jobs must not place actors on it.
    node_config.resources = Some(Resources::default());
    node_config
        .labels
        .insert("role".to_owned(), "embed-driver".to_owned());
    node_config.cookie = cluster.cookie.clone();
    node_config.object_store_bytes = cluster.object_store_bytes;
    let node =
        Arc::new(
            Node::builder(node_config)
                .start()
                .await
                .map_err(|source| JobError::Join {
                    head: cluster.head,
                    source,
                })?,
        );
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
    let (mut workers, group) = start_workers(config, node, reference).await?;
    let mut teardown = Teardown(Some(Parts {
        node: Arc::clone(node),
        group: group.clone(),
        supervisor: None,
        actors: workers
            .actors
            .iter()
            .filter_map(|(on, a)| Some((on.clone(), a.get_name()?)))
            .collect(),
    }));
    let (s, events) = supervise(
        config,
        remote_children(config, node, &workers, &group),
        Some(node.watch_members()),
    )
    .await?;
    if let Some(parts) = teardown.0.as_mut() {
        parts.supervisor = Some(s.supervisor.clone());
    }
    workers.supervision = Some(s);
    let result = drive(
        config,
        started,
        &workers,
        flotilla_data::job::Links::of(node),
        Some(node.objects()),
        Some(events),
    )
    .await;
    teardown.finish().await;
    result.map(|mut s| {
        s.placement = workers.placement.clone();
        s
    })
}

/// What ends with the job: its actors (through their supervisor once it
/// runs) and its placement group.
struct Parts {
    node: Arc<Node>,
    group: String,
    supervisor: Option<ActorRef<SupervisorMsg>>,
    /// `(node, name)` of the first actors, stopped directly before the
    /// supervisor runs.
    actors: Vec<(String, String)>,
}

impl Parts {
    async fn stop(self) {
        match self.supervisor {
            Some(s) => {
                let within = Duration::from_secs(15);
                if flotilla::call::call(&s, SupervisorMsg::Shutdown, within)
                    .await
                    .is_err()
                {
                    s.stop(None);
                }
            }
            None => {
                for (on, name) in &self.actors {
                    let _ = self.node.stop_on(on, name, Duration::from_secs(5)).await;
                }
            }
        }
        if let Err(e) = self.node.remove_group(&self.group).await {
            tracing::warn!(group = %self.group, error = %e, "cannot remove the job's placement group");
        }
    }
}

/// Stops the job's [`Parts`] when the job ends, and also when the job's
/// future is dropped mid-way (a detached driver stopped or restarted): the
/// actors and their group do not outlive it.
struct Teardown(Option<Parts>);

impl Teardown {
    async fn finish(&mut self) {
        if let Some(parts) = self.0.take() {
            parts.stop().await;
        }
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(parts) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(parts.stop());
        }
    }
}

/// The job's actors as children of its supervisor, each in its bundle of
/// the job's placement group: after a failure it is restarted there; when
/// its node is lost, the head places the bundle again and the actor is
/// restarted on the bundle's new node (waiting while the group has no room
/// for it, so a worker that returns is used again).
fn remote_children(
    config: &JobConfig,
    node: &Arc<Node>,
    workers: &Workers,
    group: &str,
) -> Vec<Child> {
    let args = embedder_args(config);
    workers
        .actors
        .iter()
        .zip(&workers.bundles)
        .enumerate()
        .map(|(i, ((on, actor), bundle))| {
            let name = actor
                .get_name()
                .unwrap_or_else(|| format!("flotilla.embed.{on}.{i}"));
            let start = RemoteChild::new::<EmbedMsg, _>(
                Arc::clone(node),
                KIND,
                name.clone(),
                &args,
                |_: &flotilla::Table| None,
                SPAWN_TIMEOUT,
            )
            .in_bundle(group, *bundle)
            .adopt(on.clone(), actor.get_cell());
            let spec = ChildSpec {
                id: name,
                restart: RestartType::Transient,
                shutdown: Duration::from_secs(5),
            };
            Child::new(spec, start)
        })
        .collect()
}

/// Worker nodes: up, not the head, offering CPUs or GPUs (a driver that
/// joined for the job offers none; a detached job's node may be one).
fn worker_nodes(node: &Node) -> Vec<MemberView> {
    let table = node.members();
    table
        .up()
        .filter(|m| m.name != table.head)
        .filter(|m| m.resources.cpus > 0 || m.resources.gpus > 0)
        .cloned()
        .collect()
}

/// The job's placement group: `--actors` bundles of `--actor-resources`
/// under `--placement`; by default one bundle per GPU of every worker
/// that has GPUs (`gpu=1`), else per CPU (`cpu=1`), or `actors_per_node`
/// on each worker, spread.
fn group_spec(config: &JobConfig, workers: &[MemberView]) -> GroupSpec {
    let gpus = workers.iter().all(|m| m.resources.gpus > 0);
    let per_node = |m: &MemberView| {
        config.actors_per_node.unwrap_or(if gpus {
            m.resources.gpus as usize
        } else {
            m.resources.cpus as usize
        })
    };
    let count = config
        .actors
        .unwrap_or_else(|| workers.iter().map(per_node).sum())
        .max(1);
    let one = config.actor_resources.clone().unwrap_or_else(|| {
        if gpus {
            bundle(&[("gpu", 1.0)])
        } else {
            // More actors than CPUs on a node share them.
            let fewest = workers.iter().map(|m| m.resources.cpus).min().unwrap_or(1);
            let share = config
                .actors_per_node
                .map_or(1.0, |n| (f64::from(fewest) / n.max(1) as f64).min(1.0));
            bundle(&[("cpu", share)])
        }
    });
    GroupSpec::new(config.placement, vec![one; count]).with_timeout(config.placement_timeout())
}

/// Places the job's actors with a placement group, spawns one in each
/// bundle, and keeps those whose model is the job's.
async fn start_workers(
    config: &JobConfig,
    node: &Arc<Node>,
    reference: Option<String>,
) -> Result<(Workers, String), JobError> {
    let members = worker_nodes(node);
    if members.is_empty() {
        return Err(ClusterError::NoWorkerUp.into());
    }
    let spec = group_spec(config, &members);
    let group = node
        .create_group(spec)
        .await
        .map_err(|e| ClusterError::Placement(Box::new(e)))?;
    if let Some(to) = &config.group_to {
        let _ = to.send(group.clone());
    }
    let wait = config.placement_timeout() + Duration::from_secs(5);
    let view = match node.wait_group(&group, wait).await {
        Ok(v) => v,
        Err(e) => {
            let _ = node.remove_group(&group).await;
            return Err(ClusterError::Placement(Box::new(e)).into());
        }
    };
    tracing::info!(%group, strategy = %view.strategy, nodes = ?view.nodes, "embedding actors placed");
    let placed = format!(
        "group {group} ({}): {}",
        view.strategy,
        view.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{i}→{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let args = embedder_args(config);
    // Names no other start of the job takes: a driver started again on the
    // same node (its head restarted) runs beside the actors of the one
    // before until those stop.
    let tag = format!("{}-{group}", node.name());
    // Actors on one node start one after another (the node's spawner
    // loads one model at a time); nodes start in parallel.
    let mut per_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (b, n) in view.nodes.iter().enumerate() {
        per_node.entry(n.clone()).or_default().push(b);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (name, bundles) in per_node {
        let node = Arc::clone(node);
        let args = args.clone();
        let tag = tag.clone();
        tasks.spawn(async move {
            let mut out = Vec::new();
            for b in bundles {
                let actor_name = format!("flotilla.embed.{tag}.{b}");
                let spawned: Result<(ActorRef<EmbedMsg>, ModelInfo), WorkerStartError> = async {
                    let actor: ActorRef<EmbedMsg> = node
                        .spawn_on(&name, KIND, &actor_name, &args, SPAWN_TIMEOUT)
                        .await?;
                    let info = call_t!(actor, EmbedMsg::Info, INFO_WITHIN.as_millis() as u64)
                        .map_err(|_| WorkerStartError::NoInfo(INFO_WITHIN))?;
                    Ok((actor, info))
                }
                .await;
                let failed = spawned.is_err();
                out.push((name.clone(), b, spawned));
                if failed {
                    break;
                }
            }
            out
        });
    }
    let mut started: Vec<(String, usize, ActorRef<EmbedMsg>, ModelInfo)> = Vec::new();
    let mut failures: Vec<WorkerFailure> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let results = match joined {
            Ok(results) => results,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        for (name, b, r) in results {
            match r {
                Ok((actor, info)) => started.push((name, b, actor, info)),
                Err(why) => {
                    tracing::warn!(node = %name, error = %why, "no embedding actor on this worker");
                    failures.push(WorkerFailure { node: name, why });
                }
            }
        }
    }
    started.sort_by_key(|s| s.1);
    if started.is_empty() {
        let _ = node.remove_group(&group).await;
        return Err(ClusterError::NoActorStarted(failures).into());
    }
    let revision = reference.unwrap_or_else(|| started[0].3.revision.clone());
    let mut actors = Vec::new();
    let mut bundles = Vec::new();
    let mut infos: Vec<ModelInfo> = Vec::new();
    for (name, b, actor, info) in started {
        if info.revision == revision {
            actors.push((name, actor));
            bundles.push(b);
            infos.push(info);
        } else {
            // Not used; it stops when the driver leaves.
            tracing::warn!(node = %name, worker_revision = %info.revision, job_revision = %revision,
                "worker has another model revision; not using it");
        }
    }
    let mut nodes: Vec<String> = actors.iter().map(|(n, _)| n.clone()).collect();
    nodes.dedup();
    let Some(mut workers) = Workers::new(actors, &infos) else {
        let _ = node.remove_group(&group).await;
        return Err(ClusterError::NoMatchingRevision(revision.clone()).into());
    };
    workers.bundles = bundles;
    workers.placement = Some(placed);
    tracing::info!(actors = workers.actors.len(), nodes = ?nodes, %revision, "embedding actors ready");
    Ok((workers, group))
}
