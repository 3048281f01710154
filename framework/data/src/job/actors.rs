//! A job's actors: on a cluster, placed first, one in each bundle of a
//! placement group of the job's own; then adopted by a supervisor of the
//! job's own, which restarts one that fails (in its bundle, wherever the
//! head places the bundle again after its node is lost) within the job's
//! restart limit. Everything the job started is stopped, and its group
//! removed, when the job ends or its future is dropped mid-way (a
//! detached driver stopped or restarted).
//!
//! ```text
//! Placed::start ─► create_group(spec) ─► wait_group ─► spawn_on(bundle's node, kind) per bundle
//!               ─► ready(actor) (the application's check: its model loaded, say)
//! Placed::supervise / Pool::supervise ─► Supervisor(children = the actors, adopted) ─► Pool + Stopper
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flotilla::MemberName;
use flotilla::placement_groups::{GroupId, GroupSpec, PlacementError};
use flotilla::ractor::{Actor, ActorRef, Message, SpawnErr};
use flotilla::supervisor::{
    Backoff, Child, ChildSpec, Intensity, LocalChild, RemoteChild, RestartType, Strategy,
    Supervisor, SupervisorArgs, SupervisorMsg, SupervisorSpec,
};
use flotilla::wire::Encode;
use flotilla::{ActorKind, Node, SpawnError, Table};
use tokio::sync::{mpsc, watch};

use super::Pool;

/// How long a supervisor is given to stop the job's actors.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(15);

impl<M: Message> Pool<M> {
    /// `actors` (each with its member) adopted as the first starts of
    /// `children` (same order) by a supervisor of the job's own: one for
    /// one, `intensity` for each actor, a wait from 100 ms doubling to
    /// 10 s before each restart; with `members`, remote children follow
    /// the member table. Returns the pool and what stops it.
    pub async fn supervise(
        actors: Vec<(MemberName, ActorRef<M>)>,
        children: Vec<Child>,
        intensity: Intensity,
        members: Option<watch::Receiver<Table>>,
    ) -> Result<(Self, Stopper), SpawnErr> {
        let ids = children.iter().map(|c| c.spec.id.clone()).collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let args = SupervisorArgs {
            spec: SupervisorSpec {
                strategy: Strategy::OneForOne,
                intensity,
                per_child: true,
                backoff: Backoff::default(),
            },
            children,
            events: Some(tx),
            members,
            seed,
            report: None,
        };
        let (supervisor, _) = Actor::spawn(None, Supervisor, args).await?;
        let pool = Self::supervised(actors, ids, rx).forgiving(supervisor.clone());
        let stopper = Stopper {
            supervisor: Some(supervisor),
            placed: None,
        };
        Ok((pool, stopper))
    }
}

impl<M: Message> Pool<M> {
    /// `count` actors in this process, each made by `make` and checked
    /// with `ready`, under a supervisor of the job's own (see
    /// [`Pool::supervise`]; child ids `local.0`, `local.1`, …) that
    /// restarts one that fails with `make` again. Returns the pool, what
    /// each check found, and what stops the actors.
    pub async fn local<A, F, C, Fut, R>(
        count: usize,
        make: F,
        ready: C,
        intensity: Intensity,
    ) -> Result<(Self, Vec<R>, Stopper), ActorStartError>
    where
        A: Actor<Msg = M>,
        A::Arguments: Clone + Sync,
        F: Fn() -> (A, A::Arguments) + Clone + Send + Sync + 'static,
        C: Fn(ActorRef<M>) -> Fut,
        Fut: Future<Output = Result<R, String>>,
    {
        let mut actors: Vec<(MemberName, ActorRef<M>)> = Vec::with_capacity(count);
        let mut found = Vec::with_capacity(count);
        let started = async {
            for _ in 0..count {
                let (actor, args) = make();
                let (actor, _) = Actor::spawn(None, actor, args)
                    .await
                    .map_err(ActorStartError::Start)?;
                actors.push((MemberName::from("local"), actor.clone()));
                found.push(ready(actor).await.map_err(ActorStartError::NotReady)?);
            }
            Ok(())
        };
        let children = match started.await {
            Ok(()) => actors
                .iter()
                .enumerate()
                .map(|(i, (_, actor))| {
                    let start = LocalChild::new(make.clone()).adopt(actor.clone());
                    Child::new(ChildSpec::permanent(format!("local.{i}")), start)
                })
                .collect(),
            Err(e) => {
                actors.iter().for_each(|(_, a)| a.stop(None));
                return Err(e);
            }
        };
        match Self::supervise(actors.clone(), children, intensity, None).await {
            Ok((pool, stopper)) => Ok((pool, found, stopper)),
            Err(e) => {
                actors.iter().for_each(|(_, a)| a.stop(None));
                Err(ActorStartError::Start(e))
            }
        }
    }
}

/// Stops what a job started: its supervisor (which stops the actors, the
/// last first, each given its shutdown time), or its placed actors
/// themselves before there is one; then removes its placement group.
/// Dropped without [`Stopper::stop`], it does the same in the background.
#[derive(Default)]
pub struct Stopper {
    supervisor: Option<ActorRef<SupervisorMsg>>,
    placed: Option<Group>,
}

/// The node that placed a job's actors, their group, and each actor
/// still to stop by name.
struct Group {
    node: Arc<Node>,
    id: GroupId,
    /// `(member, actor name)`.
    named: Vec<(String, String)>,
}

impl Stopper {
    /// Stops everything now.
    pub async fn stop(mut self) {
        Self::stop_parts(self.supervisor.take(), self.placed.take()).await;
    }

    async fn stop_parts(supervisor: Option<ActorRef<SupervisorMsg>>, placed: Option<Group>) {
        if let Some(s) = supervisor
            && flotilla::call::call(&s, SupervisorMsg::Shutdown, SHUTDOWN_WITHIN)
                .await
                .is_err()
        {
            s.stop(None);
        }
        if let Some(Group { node, id, named }) = placed {
            for (member, name) in &named {
                let _ = node.stop_on(member, name, Duration::from_secs(5)).await;
            }
            if let Err(e) = node.remove_group(&id).await {
                tracing::warn!(group = %id, error = %e, "cannot remove the job's placement group");
            }
        }
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        let (supervisor, placed) = (self.supervisor.take(), self.placed.take());
        if supervisor.is_none() && placed.is_none() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(Self::stop_parts(supervisor, placed));
        }
    }
}

/// Where a job's actors go on a cluster, and what they are.
#[derive(Debug)]
pub struct Placement<M, A> {
    /// The group: one bundle per actor.
    pub spec: GroupSpec,
    /// The registered kind of the actors.
    pub kind: ActorKind<M, A>,
    /// The start of their names: each is `NAME.GROUP.BUNDLE`, unique to
    /// this start of the job, so a driver started again runs beside the
    /// actors of the one before until those stop.
    pub name: String,
    /// Their arguments.
    pub args: A,
    /// How long one spawn may take (the actor's start included).
    pub spawn_timeout: Duration,
}

impl<M, A: Clone> Clone for Placement<M, A> {
    fn clone(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            kind: self.kind,
            name: self.name.clone(),
            args: self.args.clone(),
            spawn_timeout: self.spawn_timeout,
        }
    }
}

/// One actor placed in its bundle.
pub struct PlacedActor<M, R> {
    /// Its bundle.
    pub bundle: usize,
    /// The member it runs on.
    pub member: MemberName,
    /// The actor.
    pub actor: ActorRef<M>,
    /// What the application's check of it found.
    pub ready: R,
}

/// Why a bundle has no actor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActorStartError {
    /// The spawn on a member failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// An actor (or the job's supervisor) in this process failed to start.
    #[error("actor failed to start: {0}")]
    Start(#[source] SpawnErr),
    /// The application's check of the actor failed.
    #[error("actor not ready: {0}")]
    NotReady(String),
}

/// A job's actors on a cluster, placed and checked, not yet supervised.
pub struct Placed<M, A, R> {
    node: Arc<Node>,
    placement: Placement<M, A>,
    /// The group's id.
    pub group: GroupId,
    /// Where the bundles were placed (`group G (spread): 0→w1 1→w2 …`).
    pub placed: String,
    /// The actors started, by bundle.
    pub actors: Vec<PlacedActor<M, R>>,
    /// The members whose actors did not start, and why (a member stops
    /// at its first failure).
    pub failures: Vec<(MemberName, ActorStartError)>,
    /// Removes the group if the job goes no further.
    stopper: Stopper,
}

impl<M, A, R> Placed<M, A, R>
where
    M: Message,
    A: Encode + Clone + Send + Sync + 'static,
    R: Send + 'static,
{
    /// Creates the group (its id sent to `announce` at once), waits up to
    /// `wait` for it, spawns an actor in each bundle (one after another
    /// on a member, members in parallel) and checks each with `ready`.
    pub async fn start<F, Fut>(
        node: &Arc<Node>,
        placement: Placement<M, A>,
        wait: Duration,
        announce: Option<&watch::Sender<GroupId>>,
        ready: F,
    ) -> Result<Self, PlacementError>
    where
        F: Fn(ActorRef<M>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<R, String>> + Send,
    {
        let group = node.create_group(placement.spec.clone()).await?;
        let mut stopper = Stopper {
            supervisor: None,
            placed: Some(Group {
                node: Arc::clone(node),
                id: group.clone(),
                named: Vec::new(),
            }),
        };
        if let Some(to) = announce {
            let _ = to.send(group.clone());
        }
        let view = node.wait_group(&group, wait).await?;
        tracing::info!(%group, strategy = %view.strategy, nodes = ?view.nodes, "actors placed");
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
        let mut per_member: BTreeMap<MemberName, Vec<usize>> = BTreeMap::new();
        for (b, n) in view.nodes.iter().enumerate() {
            per_member.entry(n.clone()).or_default().push(b);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (member, bundles) in per_member {
            let (node, placement, ready) = (Arc::clone(node), placement.clone(), ready.clone());
            let group = group.clone();
            tasks.spawn(async move {
                let mut out = Vec::new();
                for bundle in bundles {
                    let name = format!("{}.{group}.{bundle}", placement.name);
                    let started = async {
                        let actor: ActorRef<M> = node
                            .spawn_on(
                                &member,
                                placement.kind.named(&name),
                                &placement.args,
                                placement.spawn_timeout,
                            )
                            .await?;
                        let found = ready(actor.clone())
                            .await
                            .map_err(ActorStartError::NotReady)?;
                        Ok::<_, ActorStartError>((actor, found))
                    }
                    .await;
                    let failed = started.is_err();
                    out.push((member.clone(), bundle, started));
                    if failed {
                        break;
                    }
                }
                out
            });
        }
        let mut actors = Vec::new();
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let results = match joined {
                Ok(results) => results,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            for (member, bundle, started) in results {
                match started {
                    Ok((actor, ready)) => {
                        if let (Some(placed), Some(name)) =
                            (stopper.placed.as_mut(), actor.get_name())
                        {
                            placed.named.push((member.to_string(), name));
                        }
                        actors.push(PlacedActor {
                            bundle,
                            member,
                            actor,
                            ready,
                        })
                    }
                    Err(why) => {
                        tracing::warn!(%member, error = %why, "no actor on this member");
                        failures.push((member, why));
                    }
                }
            }
        }
        actors.sort_by_key(|a| a.bundle);
        Ok(Self {
            node: Arc::clone(node),
            placement,
            group,
            placed,
            actors,
            failures,
            stopper,
        })
    }

    /// Keeps the actors `keep` accepts; the others are stopped.
    pub async fn retain(&mut self, keep: impl Fn(&PlacedActor<M, R>) -> bool) {
        let (kept, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut self.actors)
            .into_iter()
            .partition(&keep);
        self.actors = kept;
        for a in dropped {
            if let Some(name) = a.actor.get_name() {
                let _ = self
                    .node
                    .stop_on(&a.member, &name, Duration::from_secs(5))
                    .await;
            }
        }
    }

    /// Puts the actors under a supervisor of the job's own (see
    /// [`Pool::supervise`]), each restarted in its bundle. Returns the
    /// pool, what each actor's check found (in the pool's order), and what
    /// stops the actors and removes the group.
    pub async fn supervise(
        mut self,
        intensity: Intensity,
    ) -> Result<(Pool<M>, Vec<R>, Stopper), SpawnErr> {
        let mut stopper = std::mem::take(&mut self.stopper);
        let mut actors = Vec::new();
        let mut children = Vec::new();
        let mut found = Vec::new();
        for a in std::mem::take(&mut self.actors) {
            let name = a
                .actor
                .get_name()
                .unwrap_or_else(|| format!("{}.{}.{}", self.placement.name, self.group, a.bundle));
            let start = RemoteChild::new(
                Arc::clone(&self.node),
                self.placement.kind.named(&name),
                &self.placement.args,
                |_: &Table| None,
                self.placement.spawn_timeout,
            )
            .in_bundle(&self.group, a.bundle)
            .adopt(a.member.clone(), a.actor.get_cell());
            let spec = ChildSpec {
                id: name,
                restart: RestartType::Transient,
                shutdown: Duration::from_secs(5),
            };
            children.push(Child::new(spec, start));
            actors.push((a.member, a.actor));
            found.push(a.ready);
        }
        let members = Some(self.node.watch_members());
        let (pool, mut supervised) = Pool::supervise(actors, children, intensity, members).await?;
        // The supervisor stops the actors from now on; the group stays
        // the stopper's to remove.
        stopper.supervisor = supervised.supervisor.take();
        if let Some(placed) = stopper.placed.as_mut() {
            placed.named.clear();
        }
        Ok((pool, found, stopper))
    }
}
