//! [`Node`]: a ractor node that joins a Flotilla cluster over QUIC.

use std::collections::{BTreeSet, HashMap};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flotilla_proto::hello::{Purpose, Refusal};
use flotilla_proto::membership::{
    DetectorConfig, HeartbeatOutcome, JoinRequest, MemberState, Membership,
};
use flotilla_proto::resources::Resources;
use flotilla_transport::{Endpoint, Identity, PeerConnection, Tuning, handshake};
use ractor::{Actor, ActorRef, Message};
use ractor_cluster::{IncomingEncryptionMode, NodeServer, NodeServerMessage};
use tokio::sync::watch;

use crate::cluster_stream::{QuicClusterStream, SessionGuard, SessionPeers, ractor_name};
use crate::config::{NodeConfig, detect_resources};
use crate::mesh::Pool;
use crate::spawner::{
    Kind, KindOf, SpawnReply, SpawnRequest, Spawner, SpawnerArgs, SpawnerMsg, spawner_group,
};
use crate::table::Table;
use crate::wire::{Decode, Encode, encode};

/// Why a node could not start. Each is fatal: the `node` binary exits
/// non-zero with the message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Certificates are missing or invalid.
    #[error(transparent)]
    Certs(#[from] flotilla_transport::CertError),
    /// The QUIC endpoint could not start.
    #[error(transparent)]
    Bind(#[from] flotilla_transport::BindError),
    /// The bulk lane could not start.
    #[error(transparent)]
    Lane(#[from] crate::bulk::LaneError),
    /// The ractor node server could not start.
    #[error("NODE-START-001: cannot start the actor system: {0}")]
    Actors(String),
    /// The head could not be reached or the join failed.
    #[error("NODE-JOIN-001: cannot join the cluster: {0}")]
    Join(String),
    /// The head refused this node.
    #[error("NODE-JOIN-002: the head refused this node: {0}")]
    Refused(Refusal),
}

/// Why a remote spawn failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// No such member is up, or its session is not ready in time.
    #[error("node {0:?} is not an up member with a ready session")]
    NoSuchNode(String),
    /// The target node refused.
    #[error("node {node:?} refused the spawn: {reply}")]
    Refused {
        /// The target node.
        node: String,
        /// Its answer.
        reply: SpawnReply,
    },
    /// The request or its answer was lost (node died, timeout). Safe to
    /// retry under a new name.
    #[error("spawn request to {node:?} failed: {reason}")]
    Unavailable {
        /// The target node.
        node: String,
        /// What happened.
        reason: String,
    },
}

/// State shared by a node's tasks.
pub(crate) struct Shared {
    pub(crate) name: String,
    incarnation: AtomicU64,
    pub(crate) advertise: SocketAddr,
    /// Address members dial for the bulk lane.
    pub(crate) bulk_addr: SocketAddr,
    pub(crate) resources: Resources,
    pub(crate) detector: DetectorConfig,
    pub(crate) endpoint: Endpoint,
    pub(crate) node_server: ActorRef<NodeServerMessage>,
    pub(crate) pool: Pool,
    pub(crate) view: watch::Sender<Table>,
    pub(crate) shutdown: watch::Sender<bool>,
    ready: watch::Receiver<BTreeSet<String>>,
    live: Arc<AtomicU32>,
    /// The member table, on the head only.
    membership: Option<Mutex<Membership>>,
    /// Peer node names by ractor session id.
    session_peers: SessionPeers,
    /// The endpoint and threads of large messages.
    pub(crate) lane: crate::bulk::Lane,
}

/// The node of this process, for [`crate::outbound`]. ractor's registries
/// are process-wide, so a process runs one node.
static CURRENT: std::sync::RwLock<Option<std::sync::Weak<Shared>>> = std::sync::RwLock::new(None);

/// The running node of this process, if any.
pub(crate) fn current() -> Option<Arc<Shared>> {
    CURRENT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(std::sync::Weak::upgrade)
}

fn fresh_incarnation(previous: u64) -> u64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    micros.max(previous + 1)
}

impl Shared {
    /// The node name behind a ractor session id.
    pub(crate) fn peer_of(&self, node_id: u64) -> Option<String> {
        self.session_peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peers
            .get(&node_id)
            .cloned()
    }

    /// Stops every ractor session with `node`; returns how many there were.
    pub(crate) fn close_sessions_of(&self, node: &str) -> usize {
        crate::cluster_stream::close_sessions_of(&self.session_peers, node)
    }

    /// Whether the ractor session with `node` is ready.
    pub(crate) fn session_ready(&self, node: &str) -> bool {
        self.ready.borrow().contains(&ractor_name(node))
    }

    /// A receiver of the set of ready sessions.
    pub(crate) fn ready_sessions(&self) -> watch::Receiver<BTreeSet<String>> {
        self.ready.clone()
    }

    /// This node's hello for a stream of `purpose`.
    pub(crate) fn hello(&self, purpose: Purpose) -> flotilla_proto::hello::Hello {
        flotilla_proto::hello::Hello::new(purpose, self.name.clone(), self.incarnation())
    }

    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    pub(crate) fn new_incarnation(&self) {
        let next = fresh_incarnation(self.incarnation());
        self.incarnation.store(next, Ordering::SeqCst);
    }

    pub(crate) fn live_actors(&self) -> u32 {
        self.live.load(Ordering::Relaxed)
    }

    fn publish(&self, m: &Membership) {
        self.view.send_if_modified(|t| {
            if t.version == m.version() && !t.members.is_empty() {
                return false;
            }
            t.version = m.version();
            t.head = self.name.clone();
            t.members = m.view();
            true
        });
    }

    fn with_membership<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> Option<R> {
        let lock = self.membership.as_ref()?;
        let mut m = lock.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut m);
        self.publish(&m);
        Some(r)
    }

    /// Head: admits `req` if `peer` (its certificate name) matches.
    pub(crate) fn head_join(&self, peer: &str, req: JoinRequest) -> Result<Table, Refusal> {
        flotilla_proto::hello::check_join(&req, peer)?;
        self.with_membership(|m| m.join(Instant::now(), req))
            .ok_or(Refusal::NotHead)??;
        Ok(self.view.borrow().clone())
    }

    pub(crate) fn head_heartbeat(
        &self,
        name: &str,
        incarnation: u64,
        actors: u32,
    ) -> HeartbeatOutcome {
        self.with_membership(|m| m.heartbeat(Instant::now(), name, incarnation, actors))
            .unwrap_or(HeartbeatOutcome::Unknown)
    }

    pub(crate) fn head_leave(&self, name: &str, incarnation: u64) -> bool {
        self.with_membership(|m| m.leave(name, incarnation))
            .unwrap_or(false)
    }
}

/// Serves every stream the peer opens on `pc`: cluster streams go to
/// ractor_cluster, control streams to the control service. A peer that
/// sends a bad hello (oversized frame, invalid archive, wrong name) has its
/// connection closed; the node keeps serving others.
pub(crate) fn serve_connection(shared: Arc<Shared>, pc: PeerConnection) {
    tokio::spawn(async move {
        loop {
            let accepted = handshake::accept(
                &pc.connection,
                &pc.peer,
                &shared.name,
                shared.incarnation(),
                &[Purpose::Cluster, Purpose::Control],
            )
            .await;
            match accepted {
                Ok((send, recv, hello)) => match hello.purpose {
                    Purpose::Cluster => {
                        // The peer opens a cluster stream only when it has no
                        // session with us: any we still hold is stale.
                        if shared.close_sessions_of(&pc.peer) > 0 {
                            tracing::info!(peer = %pc.peer, "replaced a stale cluster session");
                        }
                        let stream = QuicClusterStream {
                            send,
                            recv,
                            peer: pc.peer.clone(),
                        };
                        let _ =
                            shared
                                .node_server
                                .cast(NodeServerMessage::ConnectionOpenedExternal {
                                    stream: Box::new(stream),
                                    is_server: true,
                                });
                    }
                    Purpose::Bulk => unreachable!("accept refuses bulk streams here"),
                    Purpose::Control => {
                        let (shared, peer, conn) =
                            (Arc::clone(&shared), pc.peer.clone(), pc.connection.clone());
                        tokio::spawn(async move {
                            if let Err(e) =
                                crate::control::serve(shared, peer.clone(), send, recv).await
                            {
                                tracing::warn!(%peer, error = %e, "control stream closed");
                                if matches!(
                                    e,
                                    handshake::StreamError::Frame(_)
                                        | handshake::StreamError::Wire(_)
                                ) {
                                    conn.close(
                                        quinn::VarInt::from_u32(e.close_code()),
                                        b"malformed control frame",
                                    );
                                }
                            }
                        });
                    }
                },
                Err(handshake::StreamError::Io(_)) => return,
                Err(e) => {
                    handshake::close_after_accept(&pc, &e).await;
                    return;
                }
            }
        }
    });
}

/// Registers actor kinds, then starts a [`Node`].
pub struct NodeBuilder {
    config: NodeConfig,
    kinds: HashMap<String, Arc<dyn Kind>>,
}

impl NodeBuilder {
    /// Registers an actor kind that other nodes may spawn here by name.
    /// `factory` makes the actor value; its `Arguments` travel as an rkyv
    /// archive and are validated before use.
    pub fn register<A, F>(mut self, kind: &str, factory: F) -> Self
    where
        A: Actor,
        A::Arguments: Decode,
        F: Fn() -> A + Send + Sync + 'static,
    {
        self.kinds.insert(
            kind.to_owned(),
            Arc::new(KindOf {
                factory,
                _actor: PhantomData,
            }),
        );
        self
    }

    /// Starts the node: loads certificates, binds the QUIC endpoint, starts
    /// the actor system and, unless this node is the head, joins the head.
    pub async fn start(self) -> Result<Node, StartError> {
        let config = self.config;
        let identity = Identity::load(&config.certs, &config.name)?;
        let tls = flotilla_transport::tls::server_tls(&identity)
            .map_err(|e| StartError::Actors(e.to_string()))?;
        let lane_identity = identity.clone();
        let endpoint = Endpoint::bind(config.listen, identity, &Tuning::default())?;
        let local = endpoint
            .local_addr()
            .map_err(|e| StartError::Actors(e.to_string()))?;
        let advertise = config.advertise.unwrap_or(local);
        let lane = crate::bulk::Lane::bind(
            config.bulk_listen.unwrap_or((local.ip(), 0).into()),
            lane_identity,
        )?;
        let bulk_addr = SocketAddr::new(advertise.ip(), lane.local_addr().port());

        // ractor_cluster always opens a TCP listener: keep it on loopback and
        // behind the same mutual TLS as QUIC.
        let server = NodeServer::new(
            0,
            config.cookie.clone(),
            config.name.clone(),
            config.name.clone(),
            Some(IncomingEncryptionMode::Tls(
                tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
            )),
            Some(ractor_cluster::node::NodeConnectionMode::Isolated),
        )
        .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into())
        .with_max_inbound_frame_size(config.max_frame_bytes);
        let (node_server, _) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| StartError::Actors(e.to_string()))?;
        let (ready_tx, ready) = watch::channel(BTreeSet::new());
        let session_peers = SessionPeers::default();
        node_server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "flotilla.guard".into(),
                subscription: Box::new(SessionGuard {
                    ready: ready_tx,
                    peers: Arc::clone(&session_peers),
                }),
            })
            .map_err(|e| StartError::Actors(e.to_string()))?;

        let mut resources = config.resources.clone().unwrap_or_else(|| {
            if config.is_head() {
                Resources::default()
            } else {
                detect_resources()
            }
        });
        resources.labels.extend(config.labels.clone());
        let incarnation = fresh_incarnation(0);
        let membership = config.is_head().then(|| {
            let mut m = Membership::new(config.detector);
            m.add_local(
                Instant::now(),
                JoinRequest {
                    name: config.name.clone(),
                    addr: advertise.to_string(),
                    bulk_addr: bulk_addr.to_string(),
                    incarnation,
                    resources: resources.clone(),
                },
            );
            Mutex::new(m)
        });
        let live = Arc::new(AtomicU32::new(0));
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            incarnation: AtomicU64::new(incarnation),
            advertise,
            bulk_addr,
            resources,
            detector: config.detector,
            endpoint,
            node_server,
            pool: Pool::default(),
            view: watch::channel(Table::default()).0,
            shutdown: watch::channel(false).0,
            ready,
            live: Arc::clone(&live),
            membership,
            session_peers,
            lane,
        });
        shared.with_membership(|_| ());
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(&shared));

        let (spawner, _) = Actor::spawn(
            Some(format!("flotilla.spawner.{}", config.name)),
            Spawner,
            SpawnerArgs {
                node: config.name.clone(),
                kinds: Arc::new(self.kinds),
                live,
            },
        )
        .await
        .map_err(|e| StartError::Actors(e.to_string()))?;

        // The spawner stops actors whose owner is no longer up.
        {
            let mut view = shared.view.subscribe();
            let spawner = spawner.clone();
            tokio::spawn(async move {
                // Most table changes are actor counts: pass on only changes
                // of who is up.
                let mut last = Vec::new();
                loop {
                    let states: Vec<(String, u64, bool)> = {
                        let t = view.borrow_and_update();
                        t.members
                            .iter()
                            .map(|m| (m.name.clone(), m.incarnation, m.state == MemberState::Up))
                            .collect()
                    };
                    if !states.is_empty()
                        && states != last
                        && spawner
                            .cast(SpawnerMsg::Members(crate::spawner::MemberStates(
                                states.clone(),
                            )))
                            .is_err()
                    {
                        return;
                    }
                    last = states;
                    if view.changed().await.is_err() {
                        return;
                    }
                }
            });
        }

        crate::bulk::Lane::serve(&shared);
        // Accept loop.
        {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                while let Some(pc) = shared.endpoint.accept().await {
                    tracing::debug!(peer = %pc.peer, "connection accepted");
                    shared.pool.insert(&pc.peer, pc.connection.clone()).await;
                    serve_connection(Arc::clone(&shared), pc);
                }
            });
        }

        if let Some(head) = config.head {
            let (link, table) =
                tokio::time::timeout(config.join_timeout, crate::control::join(&shared, head))
                    .await
                    .map_err(|_| {
                        StartError::Join(format!(
                            "no answer from the head at {head} within {:?}",
                            config.join_timeout
                        ))
                    })??;
            shared.view.send_replace(table);
            tokio::spawn(crate::control::run_member(Arc::clone(&shared), head, link));
        } else {
            tokio::spawn(detector_loop(Arc::clone(&shared)));
        }
        tokio::spawn(crate::mesh::run(Arc::clone(&shared)));
        tracing::info!(node = %shared.name, addr = %advertise, incarnation, head = config.is_head(), "node started");
        Ok(Node { shared, spawner })
    }
}

/// Head: marks silent members down at the failure detector's deadlines.
async fn detector_loop(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let (deadline, downed) = shared
            .with_membership(|m| {
                let downed = m.poll_down(Instant::now());
                (m.poll_timeout(), downed)
            })
            .unwrap_or((None, Vec::new()));
        for name in downed {
            tracing::warn!(node = %name, "member marked down: no heartbeat within the threshold");
        }
        let sleep = match deadline {
            Some(d) => tokio::time::sleep_until(
                tokio::time::Instant::from_std(d) + Duration::from_millis(1),
            ),
            None => tokio::time::sleep_until(
                tokio::time::Instant::now() + shared.detector.heartbeat_interval,
            ),
        };
        tokio::select! {
            _ = sleep => {}
            _ = shared.shutdown_requested(&mut shutdown) => return,
        }
    }
}

impl Shared {
    async fn shutdown_requested(&self, rx: &mut watch::Receiver<bool>) {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// A running node of a Flotilla cluster.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla::{Node, NodeConfig};
/// let config = NodeConfig::new("n1", "127.0.0.1:7421".parse()?, "certs/")
///     .join("127.0.0.1:7420".parse()?);
/// let node = Node::builder(config).start().await?;
/// println!("{}", node.members().to_text());
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Node {
    shared: Arc<Shared>,
    spawner: ActorRef<SpawnerMsg>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.shared.name)
            .field("incarnation", &self.shared.incarnation())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts building a node from `config`.
    pub fn builder(config: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            config,
            kinds: HashMap::new(),
        }
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// This node's current incarnation.
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation()
    }

    /// The address other members dial.
    pub fn addr(&self) -> SocketAddr {
        self.shared.advertise
    }

    /// The member table as this node knows it.
    pub fn members(&self) -> Table {
        self.shared.view.borrow().clone()
    }

    /// A receiver of the member table, updated on every change.
    pub fn watch_members(&self) -> watch::Receiver<Table> {
        self.shared.view.subscribe()
    }

    /// Waits until `pred` holds for the member table, at most `timeout`.
    pub async fn wait_members(
        &self,
        timeout: Duration,
        pred: impl Fn(&Table) -> bool,
    ) -> Option<Table> {
        let mut rx = self.shared.view.subscribe();
        tokio::time::timeout(timeout, async {
            rx.wait_for(|t| pred(t)).await.ok().map(|t| t.clone())
        })
        .await
        .ok()
        .flatten()
    }

    /// Waits until the ractor session with `node` is ready.
    pub async fn wait_session(&self, node: &str, timeout: Duration) -> bool {
        if node == self.shared.name {
            return true;
        }
        let want = ractor_name(node);
        let mut rx = self.shared.ready.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.contains(&want)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Spawns an actor of a kind registered on `node`, named `name`, with
    /// `args`, and returns a reference usable from this node.
    ///
    /// Delivery: the request is sent once; if the answer is lost the actor
    /// may or may not run (look it up before retrying under the same name).
    pub async fn spawn_on<M: Message, A: Encode>(
        &self,
        node: &str,
        kind: &str,
        name: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SpawnError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let spawner: ActorRef<SpawnerMsg> = if node == self.shared.name {
            self.spawner.clone()
        } else {
            if !self.wait_session(node, timeout).await {
                return Err(SpawnError::NoSuchNode(node.to_owned()));
            }
            let group = spawner_group(node);
            let cell = ractor::pg::get_members(&group)
                .into_iter()
                .find(|c| !c.get_id().is_local())
                .ok_or_else(|| SpawnError::NoSuchNode(node.to_owned()))?;
            cell.into()
        };
        let req = SpawnRequest {
            kind: kind.to_owned(),
            name: name.to_owned(),
            args: encode(args),
            owner: self.shared.name.clone(),
            owner_incarnation: self.shared.incarnation(),
        };
        let ms = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_millis() as u64;
        let reply = ractor::call_t!(spawner, SpawnerMsg::Spawn, ms.max(1), req).map_err(|e| {
            SpawnError::Unavailable {
                node: node.to_owned(),
                reason: e.to_string(),
            }
        })?;
        if reply != SpawnReply::Spawned {
            return Err(SpawnError::Refused {
                node: node.to_owned(),
                reply,
            });
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.wait_actor(name, left)
            .await
            .ok_or_else(|| SpawnError::Unavailable {
                node: node.to_owned(),
                reason: "spawned, but its process group did not reach this node in time".into(),
            })
    }

    /// Looks up a named actor anywhere in the cluster (local first).
    /// The reference's message type is the caller's claim, as with ractor's
    /// registry: a wrong `M` is a programming error.
    pub fn lookup<M: Message>(&self, name: &str) -> Option<ActorRef<M>> {
        let members = ractor::pg::get_members(&name.to_owned());
        members
            .iter()
            .find(|c| c.get_id().is_local())
            .or_else(|| members.first())
            .cloned()
            .map(Into::into)
    }

    /// Waits until a named actor is visible from this node.
    pub async fn wait_actor<M: Message>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Option<ActorRef<M>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(a) = self.lookup(name) {
                return Some(a);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Leaves the cluster cleanly (members see this node as `left`), closes
    /// every connection and stops the actor system.
    pub async fn shutdown(self) {
        CURRENT.write().unwrap_or_else(|p| p.into_inner()).take();
        let _ = self.shared.shutdown.send(true);
        // Give the member link a moment to deliver the leave and its ack.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.spawner.stop(None);
        self.shared.node_server.stop(None);
        self.shared.endpoint.close();
        self.shared.lane.close();
        let _ =
            tokio::time::timeout(Duration::from_secs(1), self.shared.endpoint.wait_idle()).await;
        tracing::info!(node = %self.shared.name, "node stopped");
    }
}
