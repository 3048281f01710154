//! Cluster mode: the driver joins the cluster as a node that offers no
//! resources, spawns embedding actors on every worker, keeps those whose
//! model revision is the job's, and drives the same pipeline over QUIC.
//! Workers that go down or leave are dropped and their batches sent to the
//! others.
//!
//! ```text
//! driver (node, no resources) ── spawn_on(worker, "flotilla.embedder") ──► Embedder × N per worker
//!        └─ pipeline ── EmbedRequest / EmbedReply over the QUIC mesh ──┘
//! ```
//!
//! The actors are owned by the driver's node: when it leaves or goes down,
//! the workers stop them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::ractor::{ActorRef, call_t};
use flotilla::{MemberView, Node, NodeConfig, Resources};

use flotilla::supervisor::{Child, ChildSpec, Exit, RemoteChild, RestartType};

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

/// The local address that routes to `head`, any port: what the workers dial
/// back. Nothing is sent to find it.
fn route_to(head: SocketAddr) -> SocketAddr {
    let ip = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect(head).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    SocketAddr::new(ip, 0)
}

/// Runs the job on the cluster of `cluster`.
pub(crate) async fn run(config: JobConfig, cluster: ClusterConfig) -> Result<Summary, JobError> {
    let started = Instant::now();
    // The driver's own copy of the model, when it has one, is the reference
    // every worker must match; otherwise the first worker's is.
    let reference = if config.model.exists() {
        Some(ModelFolder::open(&config.model)?.revision()?.to_string())
    } else {
        None
    };
    let mut node_config = NodeConfig::new(
        cluster.name.clone(),
        cluster.listen.unwrap_or_else(|| route_to(cluster.head)),
        cluster.certs.clone(),
    )
    .join(cluster.head);
    // A driver hosts no work: other jobs must not place actors on it.
    node_config.resources = Some(Resources::default());
    node_config
        .labels
        .insert("role".to_owned(), "embed-driver".to_owned());
    node_config.cookie = cluster.cookie.clone();
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
    let result = match start_workers(&config, &node, reference).await {
        Ok(mut workers) => match supervise(
            &config,
            remote_children(&config, &node, &workers),
            Some(node.watch_members()),
        )
        .await
        {
            Ok((s, events)) => {
                workers.supervision = Some(s);
                let result = drive(
                    &config,
                    started,
                    &workers,
                    node.outbound(),
                    Some(node.watch_members()),
                    Some(events),
                )
                .await;
                if let Some(s) = &workers.supervision {
                    // The workers stop the actors when the driver leaves.
                    s.supervisor.stop(None);
                }
                result
            }
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(e),
    };
    match Arc::try_unwrap(node) {
        Ok(node) => node.shutdown().await,
        Err(_) => tracing::warn!("driver node still in use; not leaving cleanly"),
    }
    result
}

/// The job's actors as children of its supervisor: each restarted on its
/// own node (a restart elsewhere would crowd another worker) after a
/// failure; one whose node is lost is not restarted (the job gives that
/// node's batches to the others).
fn remote_children(config: &JobConfig, node: &Arc<Node>, workers: &Workers) -> Vec<Child> {
    let args = embedder_args(config);
    workers
        .actors
        .iter()
        .enumerate()
        .map(|(i, (on, actor))| {
            let name = actor
                .get_name()
                .unwrap_or_else(|| format!("flotilla.embed.{on}.{i}"));
            let home = on.clone();
            let place = move |t: &flotilla::Table| {
                t.get(&home)
                    .filter(|m| m.state == flotilla::MemberState::Up)
                    .map(|m| m.name.clone())
            };
            let start = RemoteChild::new::<EmbedMsg, _>(
                Arc::clone(node),
                KIND,
                name.clone(),
                &args,
                place,
                SPAWN_TIMEOUT,
            )
            .on_node_lost(Exit::Shutdown)
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

/// Worker nodes: up, not the head, not this driver, offering CPUs or GPUs.
fn worker_nodes(node: &Node) -> Vec<MemberView> {
    let table = node.members();
    table
        .up()
        .filter(|m| m.name != node.name() && m.name != table.head)
        .filter(|m| m.resources.cpus > 0 || m.resources.gpus > 0)
        .cloned()
        .collect()
}

/// Spawns the embedding actors on every worker and keeps those whose model
/// is the job's.
async fn start_workers(
    config: &JobConfig,
    node: &Arc<Node>,
    reference: Option<String>,
) -> Result<Workers, JobError> {
    let members = worker_nodes(node);
    if members.is_empty() {
        return Err(ClusterError::NoWorkerUp.into());
    }
    let args = embedder_args(config);
    let tag = format!("{}-{}", node.name(), node.incarnation());
    let mut tasks = tokio::task::JoinSet::new();
    for m in &members {
        let per_node = config.actors_per_node.unwrap_or(if m.resources.gpus > 0 {
            m.resources.gpus as usize
        } else {
            m.resources.cpus as usize
        });
        // Actors on one node start one after another (the node's spawner
        // loads one model at a time); nodes start in parallel.
        let node = Arc::clone(node);
        let name = m.name.clone();
        let args = args.clone();
        let tag = tag.clone();
        tasks.spawn(async move {
            let mut out = Vec::new();
            for i in 0..per_node.max(1) {
                let actor_name = format!("flotilla.embed.{tag}.{name}.{i}");
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
                out.push((name.clone(), spawned));
                if failed {
                    break;
                }
            }
            out
        });
    }
    let mut started: Vec<(String, ActorRef<EmbedMsg>, ModelInfo)> = Vec::new();
    let mut failures: Vec<WorkerFailure> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let results = match joined {
            Ok(results) => results,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        for (name, r) in results {
            match r {
                Ok((actor, info)) => started.push((name, actor, info)),
                Err(why) => {
                    tracing::warn!(node = %name, error = %why, "no embedding actor on this worker");
                    failures.push(WorkerFailure { node: name, why });
                }
            }
        }
    }
    started.sort_by(|a, b| a.0.cmp(&b.0));
    if started.is_empty() {
        return Err(ClusterError::NoActorStarted(failures).into());
    }
    let revision = reference.unwrap_or_else(|| started[0].2.revision.clone());
    let mut actors = Vec::new();
    let mut infos: Vec<ModelInfo> = Vec::new();
    for (name, actor, info) in started {
        if info.revision == revision {
            actors.push((name, actor));
            infos.push(info);
        } else {
            // Not used; it stops when the driver leaves.
            tracing::warn!(node = %name, worker_revision = %info.revision, job_revision = %revision,
                "worker has another model revision; not using it");
        }
    }
    let mut nodes: Vec<String> = actors.iter().map(|(n, _)| n.clone()).collect();
    nodes.dedup();
    let workers = Workers::new(actors, &infos)
        .ok_or_else(|| ClusterError::NoMatchingRevision(revision.clone()))?;
    tracing::info!(actors = workers.actors.len(), nodes = ?nodes, %revision, "embedding actors ready");
    Ok(workers)
}
