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
            grower: None,
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
    /// The task growing the job onto workers that join, stopped first.
    grower: Option<tokio::task::AbortHandle>,
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
        if let Some(g) = self.grower.take() {
            g.abort();
        }
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
        if let Some(g) = self.grower.take() {
            g.abort();
        }
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
            grower: None,
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

    /// The child id of `a` under the job's supervisor: its actor's name.
    fn child_id(&self, a: &PlacedActor<M, R>) -> String {
        a.actor
            .get_name()
            .unwrap_or_else(|| format!("{}.{}.{}", self.placement.name, self.group, a.bundle))
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
            let name = self.child_id(&a);
            children.push(bundle_child(
                &self.node,
                &self.placement,
                &self.group,
                a.bundle,
                name,
                (a.member.clone(), &a.actor),
            ));
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

/// The supervised child of bundle `bundle` of `group`, named `name`,
/// adopting `running` (its member and actor) as its first start: started
/// again in its bundle, wherever the head places it.
fn bundle_child<M: Message, A: Encode>(
    node: &Arc<Node>,
    placement: &Placement<M, A>,
    group: &GroupId,
    bundle: usize,
    name: String,
    (member, actor): (MemberName, &ActorRef<M>),
) -> Child {
    let start = RemoteChild::new(
        Arc::clone(node),
        placement.kind.named(&name),
        &placement.args,
        |_: &Table| None,
        placement.spawn_timeout,
    )
    .in_bundle(group, bundle)
    .adopt(member, actor.get_cell());
    let spec = ChildSpec {
        id: name,
        restart: RestartType::Transient,
        shutdown: Duration::from_secs(5),
    };
    Child::new(spec, start)
}

/// An actor the job grew onto while it ran: its child id under the job's
/// supervisor, the member it runs on, the actor.
pub struct Grown<M> {
    /// Its child id.
    pub child: String,
    /// The member it runs on.
    pub member: MemberName,
    /// The actor.
    pub actor: ActorRef<M>,
}

/// How long a growing job waits for a change of the member table before
/// it tries to grow again anyway (resources freed by another job's end
/// change no table).
const GROW_RETRY: Duration = Duration::from_secs(5);

/// How long a grown bundle may take to be placed.
const PLACED_WITHIN: Duration = Duration::from_secs(30);

impl<M, A, R> Placed<M, A, R>
where
    M: Message,
    A: Encode + Clone + Send + Sync + 'static,
    R: Send + 'static,
{
    /// [`Placed::supervise`], and the job grows while it runs: whenever
    /// the member table changes (a worker joins, or frees room), and every
    /// few seconds, its group grows by one bundle like its first (all or
    /// nothing, under its strategy) while a worker has room, up to `most`
    /// actors; an actor is spawned in each new bundle, checked with
    /// `ready`, kept if `keep` accepts what the check found, and put
    /// under the job's supervisor. The pool hears of each
    /// ([`Pool::growing`]); a bundle whose actor is not kept is given back.
    ///
    /// At the job's tail the pool lets idle actors go, keeping at least
    /// `least` ([`Pool::letting_go`]): each is taken from the supervisor
    /// and its bundle given back, so other jobs get the room, and the job
    /// grows no more.
    pub async fn supervise_growing<F, Fut, K>(
        self,
        intensity: Intensity,
        (least, most): (usize, usize),
        ready: F,
        keep: K,
    ) -> Result<(Pool<M>, Vec<R>, Stopper), SpawnErr>
    where
        F: Fn(ActorRef<M>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, String>> + Send + 'static,
        K: Fn(&R) -> bool + Send + Sync + 'static,
    {
        let node = Arc::clone(&self.node);
        let placement = self.placement.clone();
        let group = self.group.clone();
        let have = self.actors.len();
        let bundles = self
            .actors
            .iter()
            .map(|a| (self.child_id(a), a.bundle as u32))
            .collect();
        let (pool, found, mut stopper) = self.supervise(intensity).await?;
        let Some(supervisor) = stopper
            .supervisor
            .clone()
            .filter(|_| most > have || least < have)
        else {
            return Ok((pool, found, stopper));
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (release, releases) = mpsc::unbounded_channel();
        let growth = Growth {
            node,
            placement,
            group,
            supervisor,
            ready,
            keep,
            joins: tx,
            grown: Default::default(),
        };
        let task = tokio::spawn(growth.run(have, most, bundles, releases));
        stopper.grower = Some(task.abort_handle());
        Ok((pool.growing(rx).letting_go(least, release), found, stopper))
    }
}

/// What grows a job onto workers that join (see
/// [`Placed::supervise_growing`]).
struct Growth<M, A, F, K> {
    node: Arc<Node>,
    placement: Placement<M, A>,
    group: GroupId,
    supervisor: ActorRef<SupervisorMsg>,
    ready: F,
    keep: K,
    joins: mpsc::UnboundedSender<Grown<M>>,
    /// Numbers the actors grown: a bundle given back and grown again
    /// holds a child of another id.
    grown: std::sync::atomic::AtomicU32,
}

impl<M, A, R, F, Fut, K> Growth<M, A, F, K>
where
    M: Message,
    A: Encode + Clone + Send + Sync + 'static,
    R: Send + 'static,
    F: Fn(ActorRef<M>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, String>> + Send + 'static,
    K: Fn(&R) -> bool + Send + Sync + 'static,
{
    /// Grows the job while `have < most`, gives way to lost bundles, and
    /// lets go the actors the pool names on `releases` (their children's
    /// bundles in `bundles`, with those grown here added), after which
    /// the job grows no more: its tail has begun.
    async fn run(
        self,
        mut have: usize,
        most: usize,
        mut bundles: BTreeMap<String, u32>,
        mut releases: mpsc::UnboundedReceiver<String>,
    ) {
        let mut members = self.node.watch_members();
        let Some(one) = self.placement.spec.bundles.first().cloned() else {
            return;
        };
        // Members whose actor was not kept: a bundle placed there again is
        // given back at once.
        let mut refused: std::collections::BTreeSet<MemberName> = Default::default();
        // The bundles grown, last on top, with their children.
        let mut grown_here: Vec<(u32, String)> = Vec::new();
        let mut tail = false;
        // Bundles of actors let go, given back once every bundle after
        // them is (a group gives back only its last).
        let mut vacated = std::collections::BTreeSet::new();
        loop {
            self.give_back_vacated(&mut vacated).await;
            if self.give_way(&mut grown_here, &mut vacated).await {
                have -= 1;
            } else if !tail
                && have < most
                && self.grow_once(&one, &mut refused, &mut grown_here).await
            {
                have += 1;
                if let Some((bundle, child)) = grown_here.last() {
                    bundles.insert(child.clone(), *bundle);
                }
                tracing::info!(actors = have, "the job grew onto a worker with room");
                continue;
            }
            tokio::select! {
                child = releases.recv() => {
                    let Some(child) = child else { return };
                    tail = true;
                    grown_here.retain(|(_, c)| *c != child);
                    if let Some(bundle) = bundles.remove(&child)
                        && self.release(&child)
                    {
                        vacated.insert(bundle);
                        have -= 1;
                    }
                }
                changed = tokio::time::timeout(GROW_RETRY, members.changed()) => {
                    if changed.is_ok_and(|changed| changed.is_err()) {
                        return;
                    }
                }
            }
        }
    }

    /// Takes the child `child` from the job's supervisor, which stops its
    /// actor; returns whether the supervisor was told. Told, not asked:
    /// the supervisor may be starting a lost bundle's actor again, waiting
    /// for the very room this gives ([`Growth::give_way`]); it lets the
    /// actor go once that start is done.
    fn release(&self, child: &str) -> bool {
        let (port, _) = flotilla::ractor::concurrency::oneshot();
        self.supervisor
            .cast(SupervisorMsg::Remove(child.to_owned(), port.into()))
            .is_ok()
    }

    /// Gives back the group's last bundles while their actors were let go
    /// (`vacated`); a vacated bundle before one still in use keeps its
    /// reservation until that one goes too, or the job ends.
    async fn give_back_vacated(&self, vacated: &mut std::collections::BTreeSet<u32>) {
        while !vacated.is_empty() {
            let Ok(Some(view)) = self.node.group(&self.group).await else {
                return;
            };
            let Some(last) = view.nodes.len().checked_sub(1).map(|l| l as u32) else {
                return;
            };
            if !vacated.contains(&last) {
                return;
            }
            match self.node.shrink_group(&self.group, last).await {
                Ok(true) => {}
                // Being placed (a lost bundle): tried again next round.
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(group = %self.group, error = %e, "cannot give back the bundle of an actor let go");
                    return;
                }
            }
            vacated.remove(&last);
            tracing::info!(group = %self.group, bundle = last, "the bundle of an actor let go is given back");
        }
    }

    /// A bundle of the group lost with its node and waiting for room
    /// (the group rescheduling, under PACK or SPREAD) takes the place of
    /// the last bundle grown: that actor is let go and its bundle given
    /// back, so a replacement taken for growth before its predecessor was
    /// found down serves the lost bundle. Returns whether it did.
    async fn give_way(
        &self,
        grown_here: &mut Vec<(u32, String)>,
        vacated: &mut std::collections::BTreeSet<u32>,
    ) -> bool {
        let Ok(Some(view)) = self.node.group(&self.group).await else {
            return false;
        };
        let waits = view.state == flotilla::placement_groups::GroupState::Rescheduling
            && view.why.is_some()
            && !view.strategy.starts_with("strict")
            && view.nodes.iter().any(|n| n.is_empty());
        let Some((bundle, child)) = grown_here.last().cloned().filter(|_| waits) else {
            return false;
        };
        if !self.release(&child) {
            return false;
        }
        grown_here.pop();
        tracing::info!(actor = %child, "a lost bundle waits for room: the last actor grown gives way to it");
        vacated.insert(bundle);
        self.give_back_vacated(vacated).await;
        true
    }

    /// Grows the group by one bundle and starts its actor; returns whether
    /// the job has one more actor.
    async fn grow_once(
        &self,
        one: &flotilla::placement_groups::Resources,
        refused: &mut std::collections::BTreeSet<MemberName>,
        grown_here: &mut Vec<(u32, String)>,
    ) -> bool {
        let avoid: Vec<MemberName> = refused.iter().cloned().collect();
        let bundle = match self.node.grow_group(&self.group, one.clone(), &avoid).await {
            Ok(bundle) => bundle,
            Err(PlacementError::NotGrown { .. }) => return false,
            Err(e) => {
                tracing::warn!(group = %self.group, error = %e, "cannot grow the job's group");
                return false;
            }
        };
        match self.start(bundle as usize, refused).await {
            Ok(grown) => {
                tracing::info!(member = %grown.member, actor = %grown.child, "actor started in a grown bundle");
                grown_here.push((bundle, grown.child.clone()));
                self.joins.send(grown).is_ok()
            }
            Err((member, why)) => {
                if let Some(member) = member {
                    if !refused.contains(&member) {
                        tracing::warn!(%member, error = %why, "no actor of the job grown onto this member");
                    }
                    refused.insert(member);
                }
                if let Err(e) = self.node.shrink_group(&self.group, bundle).await {
                    tracing::warn!(group = %self.group, error = %e, "cannot give back a bundle grown for nothing");
                }
                false
            }
        }
    }

    /// Spawns the actor of the new bundle `bundle` once it is placed,
    /// checks it and puts it under the job's supervisor; on failure, the
    /// member it was placed on (if it was) and why.
    async fn start(
        &self,
        bundle: usize,
        refused: &std::collections::BTreeSet<MemberName>,
    ) -> Result<Grown<M>, (Option<MemberName>, String)> {
        let view = self
            .node
            .wait_group(&self.group, PLACED_WITHIN)
            .await
            .map_err(|e| (None, e.to_string()))?;
        let member = view
            .nodes
            .get(bundle)
            .cloned()
            .ok_or_else(|| (None, format!("the group has no bundle {bundle}")))?;
        if refused.contains(&member) {
            return Err((Some(member), "its actor was not kept before".into()));
        }
        let fail = |why: String| (Some(member.clone()), why);
        let n = self
            .grown
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{}.{}.{bundle}.g{n}", self.placement.name, self.group);
        let actor: ActorRef<M> = self
            .node
            .spawn_on(
                &member,
                self.placement.kind.named(&name),
                &self.placement.args,
                self.placement.spawn_timeout,
            )
            .await
            .map_err(|e| fail(e.to_string()))?;
        let stop = |why: String| {
            let (node, member, name) = (Arc::clone(&self.node), member.clone(), name.clone());
            async move {
                let _ = node.stop_on(&member, &name, Duration::from_secs(5)).await;
                Err((Some(member), why))
            }
        };
        match (self.ready)(actor.clone()).await {
            Ok(found) if (self.keep)(&found) => {}
            Ok(_) => return stop("its check found it unlike the job's other actors".into()).await,
            Err(why) => return stop(why).await,
        }
        let child = bundle_child(
            &self.node,
            &self.placement,
            &self.group,
            bundle,
            name.clone(),
            (member.clone(), &actor),
        );
        let added = flotilla::call::call(
            &self.supervisor,
            |port| SupervisorMsg::Add(child, port),
            SHUTDOWN_WITHIN,
        )
        .await;
        if !matches!(added, Ok(true)) {
            return stop("the job's supervisor did not take it".into()).await;
        }
        Ok(Grown {
            child: name,
            member,
            actor,
        })
    }
}
