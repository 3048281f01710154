//! Building and starting a node: certificates, endpoints and the actor
//! system first, then the node's parts, each handed only what it needs.
//!
//! ```text
//! certs ─► main endpoint ─► pool ──────────────┐ connections on a channel
//!       └► bulk lane (own endpoint and threads) │
//! NodeServer (ractor_cluster) ◄─ Router ◄───────┘ cluster / control streams
//! head:   HeadService (Membership, detector) ─► watch<Table>
//! member: Member (MemberLink) ── join, heartbeat ─► watch<Table>
//! watch<Table> ─► Mesh (dial policy) · spawner relay · Outbound · Lane
//! ```
//!
//! Every task goes through the node's [`Tasks`]; [`Node::shutdown`] waits
//! for all of them, the member's clean leave included.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;

use flotilla_objects::{Store, StoreConfig};
use flotilla_proto::groups::GroupsConfig;
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::member::MemberConfig;
use flotilla_proto::mesh::{Mesh, MeshConfig};
use flotilla_proto::resources::Resources;
use flotilla_proto::role::{self, Role};
use flotilla_transport::{BindError, Endpoint, Tuning};
use ractor::{Actor, ActorRef};
use ractor_cluster::{IncomingEncryptionMode, NodeServer, NodeServerMessage};
use tokio::sync::{mpsc, watch};

use crate::board::Board;
use crate::control::ControlService;
use crate::head::HeadService;
use crate::identity::{Addresses, Identity, IncarnationRecord};
use crate::jobs_slot::JobsSlot;
use crate::member::head_client::HeadClient;
use crate::member::heads::HeadAddrs;
use crate::member::{JoinError, Member, MemberParts};
use crate::net::backlog::Backlog;
use crate::net::bulk::Lane;
use crate::net::mesh::MeshShell;
use crate::net::outbound::Outbound;
use crate::net::pool::Pool;
use crate::net::quota::Quota;
use crate::net::sessions::Sessions;
use crate::node::Node;
use crate::node::config::{NodeConfig, detect_resources};
use crate::node::config_args::ConfigKind;
use crate::node::router::Router;
use crate::objects::Objects;
use crate::placement::reservations::Reservations;
use crate::placement::{PlacementParts, PlacementService};
use crate::remote::kind::ActorKind;
use crate::remote::spawner::{
    Hosted, Kind, KindOf, Spawner, SpawnerArgs, Stamp, relay_members, stamp_of,
};
use crate::remote::wire::{Decode, Encode};
use crate::table::Table;
use crate::tasks::Tasks;

/// Why a node could not start. Each is fatal: the `node` binary exits
/// non-zero with the message. Sorted by what the operator should do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Certificates are missing or invalid: fix the certificates folder.
    #[error(transparent)]
    Certs(#[from] flotilla_transport::CertError),
    /// The certificate carries no role.
    #[error(
        "NODE-AUTH-018: {0}.crt carries no role; issue a new one with `node certs issue --role …`"
    )]
    NoRole(String),
    /// A head needs a certificate of the head role.
    #[error(
        "NODE-AUTH-022: {name}.crt has role {role}; a head needs the head's certificate (`node certs init` issues it)"
    )]
    NotHeadRole {
        /// The certificate's name.
        name: String,
        /// Its role.
        role: flotilla_proto::role::Role,
    },
    /// An instance name was given to a node that is not a worker, or is
    /// not a DNS label.
    #[error(
        "NODE-AUTH-032: instance {instance:?} for {name}.crt (role {role}): only a worker joins under an instance name, a DNS label (lowercase letters, digits and '-', at most 63)"
    )]
    Instance {
        /// The certificate's name.
        name: String,
        /// Its role.
        role: flotilla_proto::role::Role,
        /// The instance name refused.
        instance: String,
    },
    /// Neither the configuration nor the certificates folder gives a
    /// cluster cookie.
    #[error(
        "NODE-CERT-008: no cluster cookie: {0}/cookie is missing; copy the `cookie` file `node certs init` wrote beside ca.crt, or pass --cookie"
    )]
    NoCookie(std::path::PathBuf),
    /// The incarnation record cannot be read or written: fix the state
    /// folder.
    #[error(transparent)]
    State(#[from] crate::identity::RecordError),
    /// The certificates do not make a TLS configuration.
    #[error(transparent)]
    Tls(#[from] flotilla_transport::tls::TlsError),
    /// The head refused this node, or could not be reached or did not
    /// answer in time.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// The QUIC endpoint could not be bound: the address is taken or not
    /// local.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The bulk lane could not start.
    #[error(transparent)]
    Lane(#[from] crate::net::bulk::LaneError),
    /// A declared resource cannot hold.
    #[error("NODE-CONFIG-008: {0}")]
    Resource(#[from] flotilla_proto::resources::BadResource),
    /// The head's store cannot be read: fix or move aside the file it
    /// names.
    #[error("NODE-STORE-001: {0}")]
    Store(#[from] crate::head::head_store::HeadStoreError),
    /// The ractor node server or the spawner could not start.
    #[error("NODE-START-001: cannot start the actor system: {0}")]
    ActorSystem(#[source] ractor::SpawnErr),
    /// The ractor node server stopped while the node started.
    #[error("NODE-START-002: the actor system stopped while the node started")]
    ActorSystemStopped,
}

impl StartError {
    /// The `node` binary's exit status for this error: 2 for what the
    /// operator must fix in the configuration, certificates or folders
    /// (a service manager does not retry it), 3 for a failure to start or
    /// to join (retried).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Certs(_)
            | Self::Tls(_)
            | Self::NoCookie(_)
            | Self::NoRole(_)
            | Self::NotHeadRole { .. }
            | Self::Instance { .. }
            | Self::State(_)
            | Self::Store(_)
            | Self::Resource(_) => 2,
            Self::Join(_)
            | Self::Bind(_)
            | Self::Lane(_)
            | Self::ActorSystem(_)
            | Self::ActorSystemStopped => 3,
        }
    }
}

/// The shortest idle timeout of the node's connections (keep-alives go
/// every second).
const IDLE_AT_LEAST: std::time::Duration = std::time::Duration::from_secs(3);

/// How often the head looks at the CA's revocation list.
const REVOCATIONS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Registers actor kinds, then starts a [`Node`].
pub struct NodeBuilder {
    config: NodeConfig,
    kinds: HashMap<String, Arc<dyn Kind>>,
    /// The kinds only the head may spawn.
    head_only: std::collections::HashSet<String>,
    configurable: HashMap<String, ConfigKind>,
    /// The kinds whose actors fence their checkpoints.
    stamps: HashMap<String, Stamp>,
    handle: NodeHandle,
    gpus: crate::placement::gpus::GpuSlots,
    head_store_in: Option<std::path::PathBuf>,
    head_replica: Option<crate::head::head_replica::HeadReplica>,
    incarnation_above: Incarnation,
}

/// The node an actor runs on, for actors that use the node's API (place
/// groups, spawn, send through its outbound): given to a kind's factory
/// before the node exists, it yields the node once
/// [`NodeBuilder::start_shared`] has started it, and nothing after the
/// node is dropped.
#[derive(Clone, Default)]
pub struct NodeHandle(Arc<std::sync::OnceLock<std::sync::Weak<Node>>>);

impl NodeHandle {
    /// The node, once started and while it lives.
    pub fn get(&self) -> Option<Arc<Node>> {
        self.0.get().and_then(std::sync::Weak::upgrade)
    }
}

impl Node {
    /// Starts building a node from `config`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("builder")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register(COUNTER, || Counter)
    ///     .start()
    ///     .await?;
    /// assert_eq!(node.name(), "head");
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn builder(config: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            config,
            kinds: HashMap::new(),
            head_only: std::collections::HashSet::new(),
            configurable: HashMap::new(),
            stamps: HashMap::new(),
            handle: NodeHandle::default(),
            gpus: crate::placement::gpus::GpuSlots::default(),
            head_store_in: None,
            head_replica: None,
            incarnation_above: Incarnation::default(),
        }
    }
}

impl NodeBuilder {
    /// The handle that will yield this node (see [`NodeHandle`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("node_handle")?;
    /// let builder = flotilla::Node::builder(config);
    /// let handle = builder.node_handle();
    /// assert!(handle.get().is_none(), "not started yet");
    /// let node = builder.start_shared().await?;
    /// assert_eq!(handle.get().map(|n| n.incarnation()), Some(node.incarnation()));
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn node_handle(&self) -> NodeHandle {
        self.handle.clone()
    }

    /// The node's GPUs, for actor factories that hand them out: as many as
    /// the node declares or detects (`gpu` of its resources) once it starts,
    /// none before.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("gpu_slots")?;
    /// let builder = flotilla::Node::builder(config);
    /// let gpus = builder.gpu_slots();
    /// assert_eq!(gpus.count(), 0, "none before the node starts");
    /// let node = builder.start().await?;
    /// // As many as the node declares: this one declares none.
    /// assert!(gpus.take("an actor").is_none());
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn gpu_slots(&self) -> crate::placement::gpus::GpuSlots {
        self.gpus.clone()
    }

    /// On a head, keeps its control state in the store in `dir`
    /// ([`crate::head::head_store::FILE`], created where there is none), opened
    /// at start once the node's certificates are checked and its
    /// incarnation record is written: the placement groups it holds are
    /// taken back (pending ones pending, ready ones waiting for their nodes
    /// to report them) and every change is written before it is answered.
    /// [`Node::serve_jobs_with`] keeps the detached jobs there too. Ignored
    /// on a member.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("head_store_in")?;
    /// let state = _dir.path().join("state");
    /// std::fs::create_dir_all(&state)?;
    /// let node = flotilla::Node::builder(config).head_store_in(&state).start().await?;
    /// assert!(state.join(flotilla::head_store::FILE).exists());
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn head_store_in(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.head_store_in = Some(dir.into());
        self
    }

    /// On a head of a head set that holds the lease: every change to its
    /// store (see [`NodeBuilder::head_store_in`]) is mirrored to `replica`
    /// too before it is answered, for the standby that takes over. Ignored
    /// on a member, and without a store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, dir) = flotilla::node::doc_example::config("head_replica")?;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use flotilla::head_lease::{Candidate, LeaseStore, acquire};
    /// use flotilla::head_replica::{HeadReplica, restore, seed};
    /// use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
    /// // The head set's shared store (an in-memory one here) and its lease.
    /// let shared: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    /// let prefix = object_store::path::Path::from("heads");
    /// let me = Candidate { holder: "head".into(), address: "127.0.0.1:1".into(), incarnation: flotilla::Incarnation::new(1) };
    /// let lease = flotilla_proto::lease::LeaseConfig { duration: Duration::from_secs(4) };
    /// let stop = tokio_util::sync::CancellationToken::new();
    /// let held = acquire(LeaseStore::new(Arc::clone(&shared), &prefix), me, lease, stop.clone())
    ///     .await
    ///     .ok_or("the lease was not taken")?;
    /// // The primary seeds its term from its own state, then mirrors each change.
    /// let state = dir.path().join("state");
    /// std::fs::create_dir_all(&state)?;
    /// let replica = HeadReplica::new(Arc::clone(&shared), prefix.clone(), held.guard, held.term)?;
    /// let replica = tokio::task::block_in_place(|| seed(&state, &replica).map(|_| replica))?;
    /// let node = flotilla::Node::builder(config)
    ///     .head_store_in(&state)
    ///     .head_replica(replica)
    ///     .start()
    ///     .await?;
    /// node.create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.5)])])).await?;
    /// // What a standby taking over the next term would start from.
    /// let standby = dir.path().join("standby");
    /// std::fs::create_dir_all(&standby)?;
    /// let copied = restore(&shared, &prefix, &standby, held.term + 1).await?;
    /// assert_eq!(copied.groups, 1);
    /// node.shutdown().await;
    /// stop.cancel();
    /// # Ok(()) }
    /// ```
    pub fn head_replica(mut self, replica: crate::head::head_replica::HeadReplica) -> Self {
        self.head_replica = Some(replica);
        self
    }

    /// Runs the node under an incarnation above `floor` (a head taking
    /// over from another head of its set, under the same name, runs above
    /// the former's incarnation: what the former owned, members count as
    /// gone).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("incarnation_above")?;
    /// let floor = flotilla::Incarnation::new(u64::MAX / 2);
    /// let node = flotilla::Node::builder(config).incarnation_above(floor).start().await?;
    /// assert!(node.incarnation() > floor);
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn incarnation_above(mut self, floor: Incarnation) -> Self {
        self.incarnation_above = floor;
        self
    }

    /// [`NodeBuilder::start`], shared, and its [`NodeHandle`] filled.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("start_shared")?;
    /// let node: std::sync::Arc<flotilla::Node> =
    ///     flotilla::Node::builder(config).start_shared().await?;
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn start_shared(self) -> Result<Arc<Node>, StartError> {
        let handle = self.handle.clone();
        let node = Arc::new(self.start().await?);
        let _ = handle.0.set(Arc::downgrade(&node));
        Ok(node)
    }

    /// Registers an actor kind that other nodes may spawn here by its name.
    /// `factory` makes the actor value, whose messages and arguments are
    /// the kind's; its arguments travel as an rkyv archive and are
    /// validated before use.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("register")?;
    /// use std::time::Duration;
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, Counter, CounterMsg};
    /// let node = flotilla::Node::builder(config).register(COUNTER, || Counter).start().await?;
    /// let counter: flotilla::ractor::ActorRef<CounterMsg> = node
    ///     .spawn_on(node.name(), COUNTER.named("c"), &Count(1), Duration::from_secs(5))
    ///     .await?;
    /// let count = flotilla::call::call(&counter, |r| CounterMsg::Get(Ask, r), Duration::from_secs(5)).await?;
    /// assert_eq!(count, Count(1));
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn register<A, F>(mut self, kind: ActorKind<A::Msg, A::Arguments>, factory: F) -> Self
    where
        A: Actor,
        A::Arguments: Decode,
        F: Fn() -> A + Send + Sync + 'static,
    {
        self.kinds.insert(
            kind.name().to_owned(),
            Arc::new(KindOf {
                factory,
                _actor: PhantomData,
            }),
        );
        self
    }

    /// Registers `kind` as [`NodeBuilder::register`] does, as a kind only
    /// the head may spawn on this node (the node itself aside): one that
    /// acts with the rights the head grants it, as a detached job's driver
    /// does. Anyone else's spawn of it is refused (`NODE-AUTH-024`) and
    /// counted.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("register_head_only")?;
    /// use std::time::Duration;
    /// use flotilla::node::doc_example::{COUNTER, Count, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register_head_only(COUNTER, || Counter)
    ///     .start()
    ///     .await?;
    /// // The head itself may spawn it; a member's spawn would be refused.
    /// let spawned = node
    ///     .spawn_on(node.name(), COUNTER.named("c"), &Count(0), Duration::from_secs(5))
    ///     .await;
    /// assert!(spawned.is_ok());
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn register_head_only<A, F>(
        mut self,
        kind: ActorKind<A::Msg, A::Arguments>,
        factory: F,
    ) -> Self
    where
        A: Actor,
        A::Arguments: Decode,
        F: Fn() -> A + Send + Sync + 'static,
    {
        self.head_only.insert(kind.name().to_owned());
        self.register(kind, factory)
    }

    /// Registers `kind` as [`NodeBuilder::register`] does, and lets its
    /// arguments also be written in configuration (a `node.toml`
    /// supervision tree): they are read with serde from a JSON value
    /// ([`Node::config_args`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("register_configurable")?;
    /// use flotilla::node::doc_example::{COUNTER, Counter};
    /// let node = flotilla::Node::builder(config)
    ///     .register_configurable(COUNTER, || Counter)
    ///     .start()
    ///     .await?;
    /// // Its arguments as configuration writes them: a count is a number.
    /// assert!(node.config_args(COUNTER.name(), serde_json::json!(5)).is_ok());
    /// assert!(node.config_args(COUNTER.name(), serde_json::json!("five")).is_err());
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn register_configurable<A, F>(
        mut self,
        kind: ActorKind<A::Msg, A::Arguments>,
        factory: F,
    ) -> Self
    where
        A: Actor,
        A::Arguments: Decode + Encode + serde::de::DeserializeOwned,
        F: Fn() -> A + Send + Sync + 'static,
    {
        self.configurable.insert(
            kind.name().to_owned(),
            ConfigKind::of::<A::Msg, A::Arguments>(),
        );
        self.register(kind, factory)
    }

    /// Marks the registered `kind` as one whose actors fence their
    /// checkpoints
    /// (`flotilla::checkpoint::CheckpointStore::fence`):
    /// every spawn of it here has its [`Start`](flotilla_proto::epoch::Start)
    /// written into its arguments by this node, the epoch from the spawn
    /// order (a supervisor's `RemoteChild` sets it)
    /// and the issuer from the certificate that asked, over whatever the
    /// arguments said. A caller can then fence only the checkpoints of the
    /// children its own certificate's supervisors start.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let head = flotilla::node::doc_example::head("fences_checkpoints").await?;
    /// use std::time::Duration;
    /// use flotilla::checkpoint::{Epoch, Start};
    /// use flotilla::node::doc_example::{Ask, KEEPER, KeeperArgs, KeeperMsg, StartSeen};
    /// // `head` registered Keeper with `.fences_checkpoints(KEEPER)`.
    /// // Arguments that claim another issuer and the largest epoch...
    /// let forged = KeeperArgs { start: Start::new("someone-else", Epoch::from_micros(u64::MAX)) };
    /// let keeper: flotilla::ractor::ActorRef<KeeperMsg> = head
    ///     .spawn_on(head.name(), KEEPER.named("k"), &forged, Duration::from_secs(5))
    ///     .await?;
    /// // ...are overwritten: the asker's certificate, and no epoch (no supervisor issued one).
    /// let seen = flotilla::call::call(&keeper, |r| KeeperMsg::Start(Ask, r), Duration::from_secs(5)).await?;
    /// assert_eq!(seen, StartSeen { issuer: "head".into(), epoch: 0 });
    /// # head.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn fences_checkpoints<M, T>(mut self, kind: ActorKind<M, T>) -> Self
    where
        T: Decode + Encode + flotilla_proto::epoch::TakesStart,
    {
        self.stamps.insert(kind.name().to_owned(), stamp_of::<T>());
        self
    }

    /// Starts the node: loads certificates, binds the QUIC endpoints,
    /// starts the actor system and, unless this node is the head, joins the
    /// head. Cancel safety: a cancelled start leaves its tasks to be
    /// dropped with the runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (config, _dir) = flotilla::node::doc_example::config("start")?;
    /// let node = flotilla::Node::builder(config).start().await?;
    /// // A head of its own cluster: it is the one member up.
    /// assert_eq!(node.members().up().count(), 1);
    /// node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn start(self) -> Result<Node, StartError> {
        let config = self.config;
        crate::counters::register();
        let creds = Credentials::load(&config)?;
        let network = Network::bind(&config, &creds.certs)?;
        let cluster = ClusterServer::start(&config, &creds).await?;
        let identity = identity_of(
            &config,
            &creds,
            &network,
            &self.gpus,
            self.incarnation_above,
        )?;
        let stored = match (self.head_store_in, config.is_head()) {
            (Some(dir), true) => Some(StoredHead::open(&dir, self.head_replica)?),
            _ => None,
        };
        let store = open_objects(&config, &identity);

        let tasks = Tasks::new();
        let backlog = Arc::new(Backlog::default());
        let (view_tx, view) = watch::channel(Table::default());
        let (router_tx, router_rx) = mpsc::unbounded_channel();
        let pool = Arc::new(Pool::new(network.endpoint.clone(), router_tx));
        let hosted = Hosted::default();
        let ledger = Reservations::new(identity.join_request().resources.amounts());
        let (pulse, pulse_rx) = watch::channel(0u64);
        let side = match config.head {
            None => Side::for_head(&identity, &config, view_tx, stored.as_ref()),
            Some(addr) => Side::for_member(
                addr,
                &config,
                MemberParts {
                    identity: Arc::clone(&identity),
                    pool: Arc::clone(&pool),
                    view: view_tx,
                    hosted: hosted.clone(),
                    ledger: ledger.clone(),
                },
            ),
        };
        let spawner = spawn_spawner(self.kinds, self.stamps, &hosted, &identity).await?;
        let board = Board::default();
        let jobs = JobsSlot::default();
        let head_store = stored.as_ref().map(|s| Arc::clone(&s.store));
        let placement_handle = side.head().map(|_| {
            start_placement(
                &tasks,
                PlacementParts {
                    identity: Arc::clone(&identity),
                    pool: Arc::clone(&pool),
                    view: view.clone(),
                    ledger: ledger.clone(),
                },
                &config,
                creds.seal_key,
                stored.map(|s| (s.store, s.groups)),
            )
        });
        let control = ControlService {
            head: side.head(),
            view: view.clone(),
            spawner: spawner.clone(),
            board: board.clone(),
            gpus: self.gpus.clone(),
            ledger: ledger.clone(),
            placement: placement_handle.clone(),
            jobs: jobs.clone(),
            objects: store.clone(),
            head_only: Arc::new(self.head_only),
        };
        let node = Node {
            configurable: Arc::new(self.configurable),
            board,
            pulse: pulse_rx,
            identity: Arc::clone(&identity),
            view: view.clone(),
            sessions: cluster.sessions.clone(),
            spawner: spawner.clone(),
            hosted,
            node_server: cluster.server().clone(),
            endpoint: network.endpoint.clone(),
            lane: Arc::clone(&network.lane),
            pool: Arc::clone(&pool),
            outbound: Outbound::new(
                Arc::clone(&identity),
                Arc::clone(&backlog),
                Arc::clone(&network.lane),
                cluster.sessions.clone(),
                view.clone(),
            ),
            tasks: tasks.clone(),
            placement: placement_handle,
            head_store: head_store.clone(),
            head_client: HeadClient::new(Arc::clone(&identity), Arc::clone(&pool), side.heads()),
            ledger,
            jobs: jobs.clone(),
            objects: Objects {
                store: store.clone(),
                lane: Arc::clone(&network.lane),
                identity: Arc::clone(&identity),
                view: view.clone(),
                pulling: Arc::default(),
                put_timeout: crate::objects::DEFAULT_PUT_TIMEOUT,
            },
        };
        // From here on the node owns the node server: a failed join stops
        // it with the rest of the node.
        let node_server = cluster.into_server();

        tasks.spawn(relay_members(view.clone(), spawner.clone()));
        network
            .lane
            .serve(&tasks, Arc::clone(&identity), view.clone(), store.clone());
        sweep_objects(&tasks, store);
        serve_streams(
            &node,
            node_server.clone(),
            Arc::clone(&backlog),
            control,
            router_rx,
        );
        accept_connections(&tasks, &pool);

        match side {
            Side::Head(head) => run_head(
                &tasks,
                head,
                &config,
                creds.certs.ca.clone(),
                head_store,
                pulse,
            ),
            Side::Member(mut member) => {
                member.pulse = pulse;
                member.spawner = Some(spawner.clone());
                if let Err(e) = member.join(config.join_timeout).await {
                    node.shutdown().await;
                    return Err(e.into());
                }
                tasks.spawn_graceful(|stop| member.run(stop));
            }
        }
        run_mesh(
            &node,
            node_server,
            backlog,
            config.detector.heartbeat_interval,
        );
        tracing::info!(node = %identity.name, addr = %network.advertise, incarnation = %identity.incarnation(), head = config.is_head(), "node started");
        Ok(node)
    }
}

/// What the certificates folder (and the configuration's cookie) give a
/// starting node.
struct Credentials {
    /// The node's certificate, key and CA.
    certs: flotilla_transport::Identity,
    /// Its certificate's role.
    role: Role,
    /// Its member name (with an instance tag for roles that run many).
    member_name: String,
    /// The key that seals placement-group records.
    seal_key: [u8; 32],
    /// The cluster cookie.
    cookie: String,
    /// The TLS configuration of ractor_cluster's own listener.
    tls: tokio_rustls::rustls::ServerConfig,
}

impl Credentials {
    fn load(config: &NodeConfig) -> Result<Self, StartError> {
        let certs = flotilla_transport::Identity::load(&config.certs, &config.name)?;
        let role = certs
            .role
            .ok_or_else(|| StartError::NoRole(config.name.clone()))?;
        if config.is_head() && role != Role::Head {
            return Err(StartError::NotHeadRole {
                name: config.name.clone(),
                role,
            });
        }
        let cookie = config
            .cookie
            .clone()
            .or_else(|| certs.cookie.clone())
            .ok_or_else(|| StartError::NoCookie(config.certs.clone()))?;
        let member_name = match &config.instance {
            None => role::member_name(&config.name, role, crate::nonce::nonce()),
            Some(instance) => role::worker_instance_name(&config.name, instance)
                .filter(|_| role == Role::Worker)
                .ok_or_else(|| StartError::Instance {
                    name: config.name.clone(),
                    role,
                    instance: instance.clone(),
                })?,
        };
        Ok(Self {
            role,
            member_name,
            seal_key: certs.derived_key("placement-groups"),
            cookie,
            tls: flotilla_transport::tls::refuse_every_client_tls(&certs)?,
            certs,
        })
    }
}

/// The node's QUIC endpoints: the main one and the bulk lane.
struct Network {
    endpoint: Endpoint,
    /// The address members dial.
    advertise: SocketAddr,
    lane: Arc<Lane>,
    /// The bulk lane's address as members dial it.
    bulk_addr: SocketAddr,
}

impl Network {
    fn bind(config: &NodeConfig, certs: &flotilla_transport::Identity) -> Result<Self, StartError> {
        // A connection silent for as long as a member takes to be marked
        // down is closed: a member notices a head killed outright (and
        // fails over to the next of a head set) within the same time. A
        // handshake is given up before its connection could idle out, so
        // that it is counted as the timeout it is.
        let idle_timeout = config
            .detector
            .down_after
            .clamp(IDLE_AT_LEAST, Tuning::default().idle_timeout);
        let tuning = Tuning {
            idle_timeout,
            handshake_timeout: Tuning::default()
                .handshake_timeout
                .min(idle_timeout * 3 / 4),
            ..Tuning::default()
        };
        let endpoint = Endpoint::bind(config.listen, certs.clone(), &tuning)?;
        let local = endpoint.local_addr().map_err(|source| BindError::Socket {
            addr: config.listen,
            source,
        })?;
        let advertise = config.advertise.unwrap_or(local);
        let lane = Arc::new(Lane::bind(
            config.bulk_listen.unwrap_or((local.ip(), 0).into()),
            certs.clone(),
        )?);
        let bulk_addr = SocketAddr::new(advertise.ip(), lane.local_addr().port());
        Ok(Self {
            endpoint,
            advertise,
            lane,
            bulk_addr,
        })
    }
}

/// ractor_cluster's node server and its sessions, stopped when dropped
/// unless the node took them over ([`ClusterServer::into_server`]): one
/// cleanup for every early return of a start.
struct ClusterServer {
    server: Option<ActorRef<NodeServerMessage>>,
    sessions: Sessions,
}

impl ClusterServer {
    async fn start(config: &NodeConfig, creds: &Credentials) -> Result<Self, StartError> {
        // ractor_cluster always opens a TCP listener, though every session
        // comes over QUIC through the gate: keep it on loopback, behind a
        // handshake that refuses every certificate.
        let server = NodeServer::new(
            0,
            creds.cookie.clone(),
            creds.member_name.clone(),
            creds.member_name.clone(),
            Some(IncomingEncryptionMode::Tls(
                tokio_rustls::TlsAcceptor::from(Arc::new(creds.tls.clone())),
            )),
            Some(ractor_cluster::node::NodeConnectionMode::Isolated),
        )
        .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into())
        .with_max_inbound_frame_size(config.max_frame_bytes);
        let (server, _) = Actor::spawn(None, server, ())
            .await
            .map_err(StartError::ActorSystem)?;
        let started = Self {
            server: Some(server),
            sessions: Sessions::new(config.max_frame_bytes),
        };
        started
            .server()
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "flotilla.guard".into(),
                subscription: Box::new(started.sessions.guard()),
            })
            .map_err(|_| StartError::ActorSystemStopped)?;
        Ok(started)
    }

    fn server(&self) -> &ActorRef<NodeServerMessage> {
        self.server.as_ref().expect("held until taken over")
    }

    /// The node server, no longer stopped when this is dropped.
    fn into_server(mut self) -> ActorRef<NodeServerMessage> {
        self.server.take().expect("held until taken over")
    }
}

impl Drop for ClusterServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop(None);
        }
    }
}

/// The node's identity: its resources (declared or detected), host id,
/// and first incarnation (from its record, for roles that keep one).
fn identity_of(
    config: &NodeConfig,
    creds: &Credentials,
    network: &Network,
    gpus: &crate::placement::gpus::GpuSlots,
    incarnation_above: Incarnation,
) -> Result<Arc<Identity>, StartError> {
    let mut resources = config.resources.clone().unwrap_or_else(|| {
        if config.is_head() {
            Resources::default()
        } else {
            detect_resources()
        }
    });
    resources.labels.extend(config.labels.clone());
    for (name, amount) in &config.declared {
        resources.declare(name, *amount)?;
    }
    gpus.set_count(resources.gpus as usize);
    let host = config
        .host_id
        .clone()
        .unwrap_or_else(crate::node::host::detect_host_id);
    let record = creds.role.is_singular().then(|| {
        IncarnationRecord::new(config.state_folder(), &creds.member_name).above(incarnation_above)
    });
    let identity = Identity::new(
        MemberName::from(creds.member_name.clone()),
        creds.role,
        Addresses {
            advertise: network.advertise,
            bulk: network.bulk_addr,
        },
        resources,
        flotilla_transport::certs::cookie_digest(&creds.cookie),
        record,
    )?;
    Ok(Arc::new(identity.with_host(host)))
}

/// The head's store, with the groups and revocations it kept.
struct StoredHead {
    store: Arc<crate::head::head_store::HeadStore>,
    groups: Vec<flotilla_proto::groups::StoredGroup>,
    revoked: Vec<Vec<u8>>,
}

impl StoredHead {
    fn open(
        dir: &std::path::Path,
        replica: Option<crate::head::head_replica::HeadReplica>,
    ) -> Result<Self, StartError> {
        let store = crate::head::head_store::HeadStore::open_in(dir)?;
        let store = match replica {
            Some(replica) => store.with_replica(replica),
            None => store,
        };
        Ok(Self {
            groups: store.load_groups()?,
            revoked: store.load_revoked()?,
            store: Arc::new(store),
        })
    }
}

/// The node's object store, after sweeping the segments of this
/// cluster's processes that died.
fn open_objects(config: &NodeConfig, identity: &Identity) -> Store {
    let (store, swept) = Store::open(StoreConfig {
        scope: crate::objects::scope_of(&identity.cookie),
        owner: identity.name.to_string(),
        host: identity.host.clone(),
        capacity: config
            .object_store_bytes
            .unwrap_or_else(crate::node::host::default_object_store_bytes),
    });
    if swept > 0 {
        tracing::info!(
            swept,
            "removed the object segments of processes of this cluster that died"
        );
    }
    store
}

/// Which side of the head a node is on.
enum Side {
    /// The head: its membership service.
    Head(Arc<HeadService>),
    /// A member: its link to the head, not joined yet.
    Member(Box<Member>),
}

impl Side {
    /// The head's side, with the revocations its store kept in force
    /// before the first connection is served.
    fn for_head(
        identity: &Identity,
        config: &NodeConfig,
        view_tx: watch::Sender<Table>,
        stored: Option<&StoredHead>,
    ) -> Self {
        let head = Arc::new(HeadService::new(
            identity.join_request(),
            config.detector,
            view_tx,
        ));
        if let Some(stored) = stored
            && !stored.revoked.is_empty()
        {
            let n = head.revoke(stored.revoked.clone());
            tracing::info!(
                revoked = n,
                "revocations kept in the head's store are in force"
            );
        }
        Self::Head(head)
    }

    /// A member's side: its link to the head at `addr` (and the standby
    /// heads of `config`), not joined yet.
    fn for_member(addr: SocketAddr, config: &NodeConfig, parts: MemberParts) -> Self {
        Self::Member(Box::new(Member::new(
            parts,
            HeadAddrs::new(addr, &config.standby_heads),
            config.head_name.clone(),
            MemberConfig {
                heartbeat_interval: config.detector.heartbeat_interval,
                name_grace: config.detector.down_after,
                ..MemberConfig::default()
            },
        )))
    }

    fn head(&self) -> Option<Arc<HeadService>> {
        match self {
            Self::Head(head) => Some(Arc::clone(head)),
            Self::Member(_) => None,
        }
    }

    /// The head addresses a member follows.
    fn heads(&self) -> Option<HeadAddrs> {
        match self {
            Self::Head(_) => None,
            Self::Member(member) => Some(member.heads.clone()),
        }
    }
}

/// The head's placement service, running in `tasks`; with what the
/// head's store kept, its groups taken back.
fn start_placement(
    tasks: &Tasks,
    parts: PlacementParts,
    config: &NodeConfig,
    seal_key: [u8; 32],
    stored: Option<(
        Arc<crate::head::head_store::HeadStore>,
        Vec<flotilla_proto::groups::StoredGroup>,
    )>,
) -> crate::placement::PlacementHandle {
    crate::counters::head_role("primary");
    let (service, handle) = PlacementService::new(
        parts,
        GroupsConfig {
            confirm_grace: config.detector.down_after * 2,
            ..GroupsConfig::default()
        },
        seal_key,
        stored,
    );
    tasks.spawn_graceful(|stop| service.run(stop));
    handle
}

/// Hands each stream the node accepts to its room (see [`Router`]).
fn serve_streams(
    node: &Node,
    node_server: ActorRef<NodeServerMessage>,
    backlog: Arc<Backlog>,
    control: ControlService,
    streams: mpsc::UnboundedReceiver<(flotilla_transport::PeerConnection, bool)>,
) {
    node.tasks.spawn(
        Router {
            identity: Arc::clone(&node.identity),
            view: node.view.clone(),
            node_server,
            sessions: node.sessions.clone(),
            backlog,
            control,
            pool: Arc::clone(&node.pool),
            tasks: node.tasks.clone(),
        }
        .run(streams),
    );
}

/// The mesh of `node`: one ractor_cluster session to every up member,
/// looked at every `tick`.
fn run_mesh(
    node: &Node,
    node_server: ActorRef<NodeServerMessage>,
    backlog: Arc<Backlog>,
    tick: std::time::Duration,
) {
    let mesh = MeshShell {
        identity: Arc::clone(&node.identity),
        pool: Arc::clone(&node.pool),
        sessions: node.sessions.clone(),
        node_server,
        lane: Arc::clone(&node.lane),
        backlog,
        tasks: node.tasks.clone(),
        view: node.view.clone(),
        tick,
    };
    let policy = Mesh::new(node.identity.name.clone(), MeshConfig::default());
    node.tasks.spawn_graceful(|stop| mesh.run(policy, stop));
}

/// The spawner actor, with the node's registered kinds.
async fn spawn_spawner(
    kinds: HashMap<String, Arc<dyn Kind>>,
    stamps: HashMap<String, Stamp>,
    hosted: &Hosted,
    identity: &Identity,
) -> Result<ActorRef<crate::remote::spawner::SpawnerMsg>, StartError> {
    let (spawner, _) = Actor::spawn(
        None,
        Spawner,
        SpawnerArgs {
            kinds: Arc::new(kinds),
            stamps: Arc::new(stamps),
            hosted: hosted.clone(),
            node: identity.name.clone(),
        },
    )
    .await
    .map_err(StartError::ActorSystem)?;
    Ok(spawner)
}

/// Every so often, removes the segments of dead processes.
fn sweep_objects(tasks: &Tasks, store: Store) {
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(crate::objects::SWEEP_EVERY).await;
            // A listing of /dev/shm and a stat per segment: file system
            // calls, kept off the runtime's worker threads.
            let store = store.clone();
            let _ = tokio::task::spawn_blocking(move || store.sweep()).await;
        }
    });
}

/// Accepts the main endpoint's connections: each handshake in a task of
/// its own (a peer that stalls holds only its own slot), each certificate
/// within its cap.
fn accept_connections(tasks: &Tasks, pool: &Arc<Pool>) {
    let (pool, handshakes) = (Arc::clone(pool), tasks.clone());
    let quota = Quota::new(crate::net::quota::MAX_CONNECTIONS_PER_PRINCIPAL);
    tasks.spawn(async move {
        while let Some(incoming) = pool.endpoint().accept_incoming().await {
            let handshake = match incoming {
                Ok(h) => h,
                Err(refused) => {
                    crate::counters::tls_refused(refused.reason);
                    tracing::warn!(error = %refused, "connection refused");
                    continue;
                }
            };
            let (pool, quota, held) = (Arc::clone(&pool), quota.clone(), handshakes.clone());
            handshakes.spawn(async move {
                match handshake.finish().await {
                    Ok(pc) => {
                        tracing::debug!(peer = %pc.peer, "connection accepted");
                        if crate::net::quota::admit(&quota, &pc, &held) {
                            pool.accepted(pc);
                        }
                    }
                    Err(refused) => {
                        crate::counters::tls_refused(refused.reason);
                        tracing::warn!(error = %refused, "connection refused");
                    }
                }
            });
        }
    });
}

/// The head's own loops: the CA's revocation list it follows, and the
/// failure detector.
fn run_head(
    tasks: &Tasks,
    head: Arc<HeadService>,
    config: &NodeConfig,
    ca: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    store: Option<Arc<crate::head::head_store::HeadStore>>,
    pulse: watch::Sender<u64>,
) {
    let idle = config.detector.heartbeat_interval;
    let crl = config
        .revocation_list
        .clone()
        .unwrap_or_else(|| config.certs.join(flotilla_transport::certs::CRL_FILE));
    let follower = Arc::clone(&head);
    tasks.spawn_graceful(|stop| async move {
        follower
            .follow_revocations(crl, ca, store, REVOCATIONS_EVERY, stop)
            .await
    });
    tasks.spawn_graceful(|stop| async move { head.run_detector(stop, idle, pulse).await });
}
