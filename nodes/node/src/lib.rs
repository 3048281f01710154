//! The `node` command: typed configuration from flags and a TOML file
//! (flags win), turned into a [`flotilla::NodeConfig`].

#![warn(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod dashboard;
pub mod drain;
mod gather;
pub mod head_set;
mod http;
pub mod jobs;
mod log_capture;
mod metrics_http;
pub mod objects;
pub mod run;
pub mod systemd;
pub mod trees;

use clap::{Args, Parser, Subcommand};
use flotilla::NodeConfig;
use serde::Deserialize;

/// Command line of `node`.
#[derive(Debug, Parser)]
#[command(name = "node", version, about = "A Flotilla cluster node")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `node` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the cluster CA or issue node certificates.
    Certs {
        /// Which certificate operation.
        #[command(subcommand)]
        op: CertsOp,
    },
    /// Run the head: the control plane that keeps the member table.
    Head(NodeArgs),
    /// Run a worker that joins a head.
    Join(NodeArgs),
    /// Print the member table as a node sees it.
    Status(StatusArgs),
    /// Serve a read-only dashboard of the cluster and its jobs to a
    /// browser on this machine, asking the head as the given identity.
    Dashboard(DashboardArgs),
    /// Drain a member: it takes no new work, its placement bundles and the
    /// actors in them move to other nodes, and it leaves once it holds
    /// nothing (or when the deadline passes).
    Drain(DrainArgs),
    /// Embed a JSONL or Parquet corpus with resident model actors, in this
    /// process or (with --head) on every worker of a cluster.
    Embed(EmbedArgs),
    /// List the cluster's detached jobs, wait for one, or stop one.
    Jobs(JobsArgs),
    /// Put a file into the object store as a member of a cluster, or read
    /// an object by its reference.
    Objects(ObjectsArgs),
    /// Work on a model folder.
    Model {
        /// Which operation.
        #[command(subcommand)]
        op: ModelOp,
    },
}

/// Operations of `node model`.
#[derive(Debug, Subcommand)]
pub enum ModelOp {
    /// Copy a model folder with its weights stored in another float type
    /// (f16 or bf16 halve them); the encoder loads either.
    Convert {
        /// The model folder (Hugging Face layout).
        #[arg(long)]
        model: PathBuf,
        /// The new folder (must not exist).
        #[arg(long)]
        out: PathBuf,
        /// Float type of the new weights: f32, f16 or bf16.
        #[arg(long, default_value = "f16")]
        precision: flotilla_embed::Precision,
    },
}

/// Flags of `node objects`.
#[derive(Debug, Args)]
pub struct ObjectsArgs {
    /// Address of the head to join; with a head set, every head's
    /// (repeat the flag, or separate them with commas).
    #[arg(long, global = true, value_delimiter = ',', value_parser = flotilla::config::parse_address)]
    pub head: Vec<SocketAddr>,
    /// Folder with ca.crt, the node's certificate and the cluster cookie.
    #[arg(long, global = true, default_value = "certs")]
    pub certs: PathBuf,
    /// The member name to join as (it needs a certificate of its own).
    #[arg(long, global = true, default_value = "objects")]
    pub name: String,
    /// Capacity of this member's object store in MiB.
    #[arg(long, global = true)]
    pub object_store_mb: Option<u64>,
    /// Host id of this member (see `node join --host-id`).
    #[arg(long, global = true)]
    pub host_id: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub op: ObjectsOp,
}

/// Operations of `node objects`.
#[derive(Debug, clap::Subcommand)]
pub enum ObjectsOp {
    /// Put FILE's bytes as one object, print its reference, and hold it
    /// (serving readers) until stdin closes or SIGTERM.
    Put {
        /// The file.
        file: PathBuf,
    },
    /// Read the object REF names (mapped on its host, pulled elsewhere),
    /// check its checksum, and print what it cost as JSON.
    Get {
        /// The reference `node objects put` printed.
        reference: String,
        /// Also write the bytes to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Flags of `node jobs`.
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Address of the head; with a head set, every head's (repeat the
    /// flag, or separate them with commas): the active one answers.
    #[arg(long, global = true, value_delimiter = ',', value_parser = flotilla::config::parse_address)]
    pub head: Vec<SocketAddr>,
    /// Folder with ca.crt and the identity's certificate.
    #[arg(long, global = true, default_value = "certs")]
    pub certs: PathBuf,
    /// Identity to use.
    #[arg(long, global = true, default_value = "admin")]
    pub name: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do (default: list every job).
    #[command(subcommand)]
    pub op: Option<JobsOp>,
}

/// Operations of `node jobs`.
#[derive(Debug, Subcommand)]
pub enum JobsOp {
    /// Wait until the job ends: exit 0 if it succeeded, 1 if it failed.
    Wait {
        /// The job's id.
        id: String,
        /// Give up (exit 3) after this many seconds.
        #[arg(long, default_value_t = 24 * 3600)]
        timeout_s: u64,
    },
    /// Stop the job (it ends failed).
    Stop {
        /// The job's id.
        id: String,
    },
    /// Print the job's driver log, wherever the driver runs (as the head
    /// has it: the last 2,000 lines); its owner, admins and observers may.
    Logs {
        /// The job's id.
        id: String,
        /// Go on printing new lines until the job ends.
        #[arg(long)]
        follow: bool,
    },
}

/// Flags of `node embed`: the job's settings (how it reaches a cluster
/// among them), and how this run shows itself.
#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// The job's settings.
    #[command(flatten)]
    pub job: flotilla_embed::job::JobConfig,
    /// Log progress lines instead of drawing a bar, even on a terminal.
    #[arg(long)]
    pub no_progress_bar: bool,
    /// With --head: submit the job to the cluster and print its id; its
    /// driver runs on a node of the cluster, supervised by the head, and
    /// survives this process and the node it runs on (`node jobs`).
    /// Input, output and model must be readable there: paths every node
    /// sees, or object-store URLs.
    #[arg(long, requires = "head")]
    pub detach: bool,
}

impl EmbedArgs {
    /// The job configuration.
    pub fn job(self) -> flotilla_embed::job::JobConfig {
        use std::io::IsTerminal;
        let mut config = self.job;
        config.job.progress_bar = !self.no_progress_bar && std::io::stderr().is_terminal();
        config
    }
}

/// Certificate operations.
#[derive(Debug, Subcommand)]
pub enum CertsOp {
    /// Create a cluster CA (ca.crt, ca.key), a random cluster cookie
    /// (cookie, 0600), the head's certificate (role head) and an `admin`
    /// certificate (role admin).
    Init {
        /// Folder to write into.
        #[arg(long)]
        out: PathBuf,
        /// Common name of the CA.
        #[arg(long, default_value = "flotilla-cluster")]
        cluster: String,
        /// Name of the head's certificate.
        #[arg(long, default_value = flotilla_proto::hello::HEAD_NAME)]
        head_name: String,
    },
    /// Issue a certificate for a name and a role, signed by the CA.
    Issue {
        /// Folder holding ca.crt and ca.key.
        #[arg(long)]
        ca: PathBuf,
        /// Node name (the certificate's DNS name).
        #[arg(long)]
        name: String,
        /// What its holder may do: `worker` (offers resources, runs
        /// actors), `driver` (runs jobs: places groups, spawns actors,
        /// submits and stops its own detached jobs), `admin` (a driver that
        /// may also stop anyone's jobs and remove anyone's groups),
        /// `observer` (reads status and jobs only) or `head`.
        #[arg(long, default_value = "worker")]
        role: flotilla_proto::role::Role,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        valid_days: u64,
        /// Folder to write NAME.crt and NAME.key into.
        #[arg(long)]
        out: PathBuf,
    },
    /// Renew DIR/NAME.crt: a new key and certificate of the same name and
    /// role, valid from now (the old one stays valid until it expires or
    /// is revoked).
    Renew {
        /// Folder holding ca.crt and ca.key.
        #[arg(long)]
        ca: PathBuf,
        /// The certificate's name.
        #[arg(long)]
        name: String,
        /// Folder holding NAME.crt and NAME.key (default: the CA folder).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Days the new certificate is valid.
        #[arg(long, default_value_t = 365)]
        valid_days: u64,
    },
    /// Revoke every certificate the CA issued for NAME: they go into the
    /// CA folder's signed revocation list (crl.pem), which the head reads
    /// (within a second) and hands to every member; every node then
    /// refuses the certificates and closes their connections.
    Revoke {
        /// Folder holding ca.crt and ca.key.
        #[arg(long)]
        ca: PathBuf,
        /// The certificates' name.
        #[arg(long)]
        name: String,
    },
}

/// Flags of `node head` and `node join`; each may also come from `--config`.
#[derive(Debug, Args, Default)]
pub struct NodeArgs {
    /// TOML file with any of the settings below; flags win.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Node name; must equal the name in its certificate.
    #[arg(long)]
    pub name: Option<String>,
    /// Instance name of a pooled worker (join only), a DNS label such as
    /// its pod's name: the worker joins as `NAME~INSTANCE`, so the pods of
    /// one Deployment share one worker certificate.
    #[arg(long)]
    pub instance: Option<String>,
    /// UDP address to listen on.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address other members dial (default: the listen address).
    #[arg(long)]
    pub advertise: Option<SocketAddr>,
    /// UDP address of the bulk lane, the second endpoint that carries large
    /// messages (default: the listen IP, a port the OS picks).
    #[arg(long)]
    pub bulk_listen: Option<SocketAddr>,
    /// Capacity of the node's shared-memory object store in MiB (default:
    /// 30% of memory, at most half of what /dev/shm has free).
    #[arg(long)]
    pub object_store_mb: Option<u64>,
    /// Host id: nodes with the same one read each other's objects through
    /// shared memory (default: detected from the kernel's boot id and
    /// /dev/shm). Give nodes of one machine different ids to make them
    /// pull objects over the network instead.
    #[arg(long)]
    pub host_id: Option<String>,
    /// Address of the head (join only), `IP:PORT` or `HOST:PORT`; with a
    /// head set, every head's
    /// (repeat the flag, or separate them with commas), the primary's
    /// first: the node fails over to the next when one cannot be reached.
    #[arg(long, value_delimiter = ',', value_parser = flotilla::config::parse_address)]
    pub head: Vec<SocketAddr>,
    /// Object-store URL (such as `s3://bucket/heads`) the heads of a head
    /// set share (head only): each holds the lease there in turn, and the
    /// one holding it keeps its state there too. A head given one waits as
    /// a standby until the lease is free, then takes over.
    #[arg(long)]
    pub lease_store: Option<String>,
    /// How long the lease stands unrenewed before a standby takes over,
    /// in milliseconds (head only; default: down_after_ms).
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// Name of the head's certificate (join only): the head joined must
    /// carry it (it must carry the head role in any case).
    #[arg(long)]
    pub head_name: Option<String>,
    /// A root (absolute path or object-store URL) under which detached
    /// jobs that land on this node may read and write; repeatable. Without
    /// any (here or `[jobs] allow` in the file) the node runs no detached
    /// job.
    #[arg(long = "allow-path")]
    pub allow_paths: Vec<String>,
    /// Ended detached jobs the head keeps listing (head only; default
    /// 1000, or `[jobs] keep_finished`); older ones are forgotten.
    #[arg(long)]
    pub keep_finished_jobs: Option<usize>,
    /// How long the head keeps an ended detached job, in seconds (head
    /// only; default a week, or `[jobs] keep_finished_for_s`).
    #[arg(long)]
    pub keep_finished_jobs_for_s: Option<u64>,
    /// The CA's revocation list the head follows (head only; default:
    /// crl.pem in the certs folder).
    #[arg(long)]
    pub revocation_list: Option<PathBuf>,
    /// Seconds a worker stopped by SIGTERM (systemd's stop, a cloud
    /// machine's preemption notice, a pod's termination) drains before it
    /// leaves: its bundles and actors move to other nodes first. 0 leaves
    /// at once. Worker only.
    #[arg(long, default_value_t = 30)]
    pub drain_on_stop_s: u64,
    /// Folder with ca.crt, NAME.crt and NAME.key.
    #[arg(long)]
    pub certs: Option<PathBuf>,
    /// Cluster cookie (default: the certs folder's `cookie` file, which
    /// `node certs init` writes).
    #[arg(long)]
    pub cookie: Option<String>,
    /// Folder where the node records its last incarnation (default: the
    /// certs folder).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Serve the node's counters in Prometheus text format on
    /// `http://ADDR/metrics`.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Heartbeat interval in milliseconds (default 1000).
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Silence in milliseconds after which a member is down (default 5000).
    #[arg(long)]
    pub down_after_ms: Option<u64>,
    /// How long `join` may wait for the head, in milliseconds (default 10000).
    #[arg(long)]
    pub join_timeout_ms: Option<u64>,
    /// Custom resource label, `KEY=VALUE`; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// What an hour of this node costs, in any currency: jobs whose actors
    /// run here are charged for it (the dashboard's running cost, their
    /// summary's cost per million tokens). Published as the label
    /// `price_per_hour`.
    #[arg(long)]
    pub price_per_hour: Option<f64>,
    /// A resource this node offers, `NAME=AMOUNT`, replacing what is
    /// detected: `cpu` and `gpu` (whole numbers), `memory_mb`, or any
    /// custom name (fractions allowed); repeatable. A head offers none
    /// unless it declares some.
    #[arg(long = "resource", value_parser = parse_resource)]
    pub resources: Vec<(String, f64)>,
    /// This node's embedding model folder: its embedding actors load it
    /// whatever folder a job names (default: the job's `--model` path as
    /// seen on this node).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// Flags of `node drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The member to drain, as `node status` names it (default: the
    /// environment's FLOTILLA_MEMBER, which a pod's preStop hook inherits).
    #[arg(env = "FLOTILLA_MEMBER")]
    pub member: String,
    /// Seconds the member is given to hand back what it holds before it
    /// leaves anyway.
    #[arg(long, default_value_t = 30)]
    pub deadline: u64,
    /// Address of the head; with a head set, every head's (repeat the
    /// flag, or separate them with commas): the active one answers.
    #[arg(long, required = true, value_delimiter = ',', value_parser = flotilla::config::parse_address)]
    pub head: Vec<SocketAddr>,
    /// Folder with ca.crt and the identity's certificate.
    #[arg(long, default_value = "certs")]
    pub certs: PathBuf,
    /// Identity to use: an admin's drains any member, a worker's only
    /// that worker, or the processes of its pool (a pod's preStop hook).
    #[arg(long, default_value = "admin")]
    pub name: String,
    /// Return once the head marks the member draining, without waiting
    /// for it to leave.
    #[arg(long)]
    pub no_wait: bool,
}

/// Whom a tool asks, and as whom.
#[derive(Debug, Args)]
pub struct AskArgs {
    /// Address of the head (or of any member, for its view); with a head
    /// set, every head's (repeat the flag, or separate them with commas):
    /// the active one answers.
    #[arg(long, required = true, value_delimiter = ',', value_parser = flotilla::config::parse_address)]
    pub head: Vec<SocketAddr>,
    /// Folder with ca.crt and the identity's certificate.
    #[arg(long)]
    pub certs: PathBuf,
    /// Identity to use (default: admin; an `observer` certificate may
    /// read).
    #[arg(long, default_value = "admin")]
    pub name: String,
}

/// Flags of `node status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Whom to ask, as whom.
    #[command(flatten)]
    pub ask: AskArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Leave out each node's supervisors (asked of every up node, each
    /// given 1 s: a node that is up in the table but not answering delays
    /// the answer by that much).
    #[arg(long)]
    pub no_supervisors: bool,
}

/// Flags of `node dashboard`.
#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Loopback address to serve the dashboard on (reach it from another
    /// machine through an SSH tunnel).
    #[arg(long, default_value = "127.0.0.1:8265")]
    pub listen: SocketAddr,
    /// Whom to ask, as whom.
    #[command(flatten)]
    pub ask: AskArgs,
}

/// A node's resource declaration: checked as a node declares it (`cpu`
/// and `gpu` whole; a bundle may ask for fractions of them).
fn parse_resource(s: &str) -> Result<(String, f64), String> {
    let (name, amount) = flotilla::placement_groups::parse_amount(s)?;
    let mut check = flotilla::Resources::default();
    check.declare(&name, amount).map_err(|e| e.to_string())?;
    Ok((name, amount))
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("label {s:?} is not KEY=VALUE"))
}

/// The TOML form of [`NodeArgs`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    name: Option<String>,
    instance: Option<String>,
    listen: Option<SocketAddr>,
    advertise: Option<SocketAddr>,
    bulk_listen: Option<SocketAddr>,
    object_store_mb: Option<u64>,
    host_id: Option<String>,
    head: Option<Heads>,
    head_name: Option<String>,
    lease_store: Option<String>,
    lease_ms: Option<u64>,
    revocation_list: Option<PathBuf>,
    certs: Option<PathBuf>,
    cookie: Option<String>,
    state_dir: Option<PathBuf>,
    metrics_listen: Option<SocketAddr>,
    heartbeat_ms: Option<u64>,
    down_after_ms: Option<u64>,
    join_timeout_ms: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    price_per_hour: Option<f64>,
    model: Option<PathBuf>,
    /// Resources offered, by name (flags win, name by name).
    #[serde(default)]
    resources: BTreeMap<String, f64>,
    /// Supervision trees this node starts once joined.
    #[serde(default)]
    supervisor: Vec<TreeFile>,
    /// What detached jobs may touch here.
    #[serde(default)]
    jobs: JobsFile,
}

/// `head` in node.toml: one address, or every head of a head set.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Heads {
    One(SocketAddr),
    Set(Vec<SocketAddr>),
}

impl Heads {
    fn into_vec(self) -> Vec<SocketAddr> {
        match self {
            Self::One(a) => vec![a],
            Self::Set(all) => all,
        }
    }
}

/// A head set's lease: where, and how long it stands unrenewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The object-store URL the heads share.
    pub url: String,
    /// How long the lease stands before a standby takes over.
    pub duration: Duration,
}

/// The `[jobs]` table of node.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsFile {
    /// Roots (absolute paths or object-store URLs) under which detached
    /// jobs may read and write.
    #[serde(default)]
    allow: Vec<String>,
    /// Ended jobs the head keeps listing.
    keep_finished: Option<usize>,
    /// How long the head keeps an ended job, in seconds.
    keep_finished_for_s: Option<u64>,
}

/// A `[[supervisor]]` table: a supervisor and its children.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TreeFile {
    /// The supervisor's name (what `node status` lists).
    pub name: String,
    /// `one_for_one` (default), `one_for_all` or `rest_for_one`.
    pub strategy: Option<String>,
    /// Restarts allowed within `restart_window_s` (default 5).
    pub max_restarts: Option<u32>,
    /// The window, in seconds (default 60).
    pub restart_window_s: Option<u64>,
    /// Count restarts per child instead of for the whole supervisor.
    #[serde(default)]
    pub per_child: bool,
    /// The first wait before a restart, in milliseconds (default 100,
    /// doubling to 10 s).
    pub backoff_ms: Option<u64>,
    /// Its children, in start order.
    #[serde(default, rename = "child")]
    pub children: Vec<ChildFile>,
}

/// A `[[supervisor.child]]` table.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChildFile {
    /// A kind registered (as configurable) on this node and on the nodes
    /// it may run on.
    pub kind: String,
    /// The actor's name, unique in the cluster; also the child's id.
    pub name: String,
    /// `permanent` (default), `transient` or `temporary`.
    pub restart: Option<String>,
    /// Nodes it may run on, the first up one first (default: this node).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Where it checkpoints (a folder or URL), passed in its arguments as
    /// `checkpoint`.
    pub checkpoint: Option<String>,
    /// How long it has to stop before it is killed, in milliseconds
    /// (default 5000).
    pub shutdown_ms: Option<u64>,
    /// The kind's arguments.
    #[serde(default)]
    pub args: toml::Table,
}

/// A supervision tree as the node starts it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    /// The supervisor's name.
    pub name: String,
    /// Strategy, intensity, backoff.
    pub spec: flotilla::supervisor::SupervisorSpec,
    /// Its children, in start order.
    pub children: Vec<TreeChild>,
}

/// One configured child.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeChild {
    /// Id (the actor's name), restart type, shutdown time.
    pub spec: flotilla::supervisor::ChildSpec,
    /// The registered kind.
    pub kind: String,
    /// Where it may run, in order; empty: this node.
    pub nodes: Vec<String>,
    /// Its arguments as JSON (with `checkpoint` set when configured).
    pub args: serde_json::Value,
}

impl TreeFile {
    /// The tree this table declares, checked.
    pub fn tree(self) -> Result<Tree, ConfigError> {
        use flotilla::supervisor::{Backoff, ChildSpec, Intensity, RestartType, Strategy};
        let invalid = |why: String| ConfigError::Tree(self.name.clone(), why);
        let strategy: Strategy = self
            .strategy
            .as_deref()
            .unwrap_or("one_for_one")
            .parse()
            .map_err(invalid)?;
        let mut seen = std::collections::BTreeSet::new();
        let mut children = Vec::new();
        for c in &self.children {
            if !seen.insert(c.name.clone()) {
                return Err(invalid(format!("child {:?} is named twice", c.name)));
            }
            let restart: RestartType = c
                .restart
                .as_deref()
                .unwrap_or("permanent")
                .parse()
                .map_err(|e: String| invalid(format!("child {:?}: {e}", c.name)))?;
            let mut args = serde_json::to_value(&c.args)
                .map_err(|e| invalid(format!("child {:?}: args: {e}", c.name)))?;
            if let (Some(url), Some(map)) = (&c.checkpoint, args.as_object_mut()) {
                map.insert("checkpoint".into(), serde_json::Value::String(url.clone()));
            }
            children.push(TreeChild {
                spec: ChildSpec {
                    id: c.name.clone(),
                    restart,
                    shutdown: Duration::from_millis(c.shutdown_ms.unwrap_or(5_000)),
                },
                kind: c.kind.clone(),
                nodes: c.nodes.clone(),
                args,
            });
        }
        if children.is_empty() {
            return Err(invalid("it has no [[supervisor.child]]".into()));
        }
        let initial = Duration::from_millis(self.backoff_ms.unwrap_or(100));
        Ok(Tree {
            name: self.name.clone(),
            spec: flotilla::supervisor::SupervisorSpec {
                strategy,
                intensity: Intensity {
                    max_restarts: self.max_restarts.unwrap_or(5),
                    within: Duration::from_secs(self.restart_window_s.unwrap_or(60).max(1)),
                },
                per_child: self.per_child,
                backoff: Backoff {
                    initial,
                    max: Duration::from_secs(10).max(initial),
                    ..Backoff::default()
                },
            },
            children,
        })
    }
}

/// Everything `node head` / `node join` run with.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The node's configuration.
    pub config: NodeConfig,
    /// The node's own embedding model folder, if configured.
    pub model: Option<PathBuf>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Supervision trees to start once joined.
    pub trees: Vec<Tree>,
    /// Where detached jobs that land here may read and write.
    pub allow: flotilla_proto::roots::AllowedRoots,
    /// How long the head keeps ended jobs.
    pub retention: flotilla::jobs::Retention,
    /// The head set's lease, for a head that is one of several.
    pub lease: Option<LeaseSettings>,
}

/// A configuration problem: the node does not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("NODE-CONFIG-001: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for a node.
    #[error("NODE-CONFIG-002: {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A required setting is missing from both flags and file.
    #[error("NODE-CONFIG-003: --{0} is required (as a flag or in --config)")]
    Missing(&'static str),
    /// A setting is out of range.
    #[error("NODE-CONFIG-004: {0}")]
    Invalid(String),
    /// A supervision tree is not well formed.
    #[error("NODE-CONFIG-007: supervisor {0:?}: {1}")]
    Tree(String, String),
}

/// Reads and parses a node TOML file.
pub fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Merges flags over the file and checks the result. `join` says whether
/// this is `node join` (a head address is required) or `node head`.
pub fn node_config(args: NodeArgs, join: bool) -> Result<NodeSettings, ConfigError> {
    let file = match &args.config {
        Some(path) => read_file_config(path)?,
        None => FileConfig::default(),
    };
    let name = args
        .name
        .or(file.name)
        .ok_or(ConfigError::Missing("name"))?;
    let listen = args
        .listen
        .or(file.listen)
        .ok_or(ConfigError::Missing("listen"))?;
    let certs = args
        .certs
        .or(file.certs)
        .ok_or(ConfigError::Missing("certs"))?;
    let heads = if args.head.is_empty() {
        file.head.map(Heads::into_vec).unwrap_or_default()
    } else {
        args.head
    };
    let mut config = NodeConfig::new(name, listen, certs);
    config.instance = args.instance.or(file.instance);
    if config.instance.is_some() && !join {
        return Err(ConfigError::Invalid(
            "instance names a pooled worker's process; a head has none".into(),
        ));
    }
    match (join, heads.split_first()) {
        (true, None) => return Err(ConfigError::Missing("head")),
        (true, Some((first, others))) => {
            config.head = Some(*first);
            config.standby_heads = others.to_vec();
        }
        (false, Some(_)) => {
            return Err(ConfigError::Invalid(
                "a head does not join another head; use `node join --head` (the heads of a head set share --lease-store)".into(),
            ));
        }
        (false, None) => {}
    }
    let lease_ms = args.lease_ms.or(file.lease_ms);
    let lease = match (args.lease_store.or(file.lease_store), lease_ms) {
        (Some(_), _) if join => {
            return Err(ConfigError::Invalid(
                "lease_store is a head's setting; a member lists every head in --head".into(),
            ));
        }
        (Some(url), _) if !flotilla::object_url::is_url(&url) => {
            return Err(ConfigError::Invalid(format!(
                "lease_store {url:?} is not an object-store URL (such as s3://bucket/heads)"
            )));
        }
        (Some(url), ms) => Some((url, ms)),
        (None, Some(_)) => {
            return Err(ConfigError::Invalid("lease_ms needs lease_store".into()));
        }
        (None, None) => None,
    };
    config.head_name = args.head_name.or(file.head_name);
    config.revocation_list = args.revocation_list.or(file.revocation_list);
    let mut allow = file.jobs.allow;
    allow.extend(args.allow_paths);
    let allow = flotilla_proto::roots::AllowedRoots::new(&allow)
        .map_err(|e| ConfigError::Invalid(format!("[jobs] allow / --allow-path: {e}")))?;
    let mut retention = flotilla::jobs::Retention::default();
    if let Some(keep) = args.keep_finished_jobs.or(file.jobs.keep_finished) {
        retention.keep = keep;
    }
    if let Some(s) = args
        .keep_finished_jobs_for_s
        .or(file.jobs.keep_finished_for_s)
    {
        retention.keep_for = Duration::from_secs(s);
    }
    config.advertise = args.advertise.or(file.advertise);
    config.bulk_listen = args.bulk_listen.or(file.bulk_listen);
    config.object_store_bytes = args
        .object_store_mb
        .or(file.object_store_mb)
        .map(|mb| mb << 20);
    config.host_id = args.host_id.or(file.host_id);
    config.cookie = args.cookie.or(file.cookie);
    config.state_dir = args.state_dir.or(file.state_dir);
    if let Some(ms) = args.heartbeat_ms.or(file.heartbeat_ms) {
        config.detector.heartbeat_interval = Duration::from_millis(ms);
    }
    if let Some(ms) = args.down_after_ms.or(file.down_after_ms) {
        config.detector.down_after = Duration::from_millis(ms);
    }
    if let Some(ms) = args.join_timeout_ms.or(file.join_timeout_ms) {
        config.join_timeout = Duration::from_millis(ms);
    }
    if config.detector.heartbeat_interval.is_zero()
        || config.detector.down_after <= config.detector.heartbeat_interval
    {
        return Err(ConfigError::Invalid(
            "down_after_ms must exceed heartbeat_ms, and both must be positive".into(),
        ));
    }
    config.labels = file.labels;
    config.labels.extend(args.labels);
    if let Some(price) = args.price_per_hour.or(file.price_per_hour) {
        if !(price.is_finite() && price >= 0.0) {
            return Err(ConfigError::Invalid(format!(
                "price_per_hour must be a number of at least 0, not {price}"
            )));
        }
        config.labels.insert(
            flotilla_proto::job_stats::PRICE_LABEL.to_owned(),
            price.to_string(),
        );
    }
    config.declared = file.resources;
    config.declared.extend(args.resources);
    let mut check = flotilla::Resources::default();
    for (name, amount) in &config.declared {
        check
            .declare(name, *amount)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    }
    let mut trees: Vec<Tree> = Vec::new();
    for t in file.supervisor {
        let tree = t.tree()?;
        if trees.iter().any(|o| o.name == tree.name) {
            return Err(ConfigError::Tree(tree.name, "declared twice".into()));
        }
        trees.push(tree);
    }
    let lease = lease.map(|(url, ms)| LeaseSettings {
        url,
        duration: ms
            .map(Duration::from_millis)
            .unwrap_or(config.detector.down_after),
    });
    if lease
        .as_ref()
        .is_some_and(|l| l.duration < Duration::from_millis(200))
    {
        return Err(ConfigError::Invalid("lease_ms must be at least 200".into()));
    }
    Ok(NodeSettings {
        config,
        model: args.model.or(file.model),
        metrics_listen: args.metrics_listen.or(file.metrics_listen),
        lease,
        trees,
        allow,
        retention,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> NodeArgs {
        NodeArgs {
            name: Some("n1".into()),
            listen: Some("127.0.0.1:7421".parse().unwrap()),
            certs: Some("certs".into()),
            head: vec!["127.0.0.1:7420".parse().unwrap()],
            ..NodeArgs::default()
        }
    }

    #[test]
    fn flags_win_over_the_file() {
        let path = std::env::temp_dir().join(format!("flotilla-node-{}.toml", std::process::id()));
        std::fs::write(&path, "name = \"from-file\"\nheartbeat_ms = 200\ndown_after_ms = 900\nmodel = \"/srv/model\"\nbulk_listen = \"127.0.0.1:7431\"\nmetrics_listen = \"127.0.0.1:9464\"\nstate_dir = \"/var/lib/flotilla\"\nprice_per_hour = 0.5\n[labels]\nzone = \"a\"\n").unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        a.labels = vec![("rack".into(), "2".into())];
        let settings = node_config(a, true).unwrap();
        assert_eq!(settings.model, Some(PathBuf::from("/srv/model")));
        assert_eq!(
            settings.metrics_listen,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        let c = settings.config;
        assert_eq!(c.state_dir, Some(PathBuf::from("/var/lib/flotilla")));
        assert_eq!(c.cookie, None, "the certs folder's cookie by default");
        assert_eq!(c.name, "n1");
        assert_eq!(c.bulk_listen, Some("127.0.0.1:7431".parse().unwrap()));
        assert_eq!(c.detector.heartbeat_interval, Duration::from_millis(200));
        assert_eq!(c.labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(c.labels.get("rack").map(String::as_str), Some("2"));
        assert_eq!(
            c.labels.get("price_per_hour").map(String::as_str),
            Some("0.5")
        );
        std::fs::remove_file(path).unwrap();
    }

    fn tree(toml_text: &str) -> Result<Vec<Tree>, ConfigError> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("flotilla-tree-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, toml_text).unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        let result = node_config(a, true).map(|s| s.trees);
        std::fs::remove_file(path).unwrap();
        result
    }

    #[test]
    fn supervision_trees_are_read_with_their_defaults() {
        let trees = tree(
            "[[supervisor]]\nname = \"t\"\nstrategy = \"rest_for_one\"\nmax_restarts = 2\n\
             [[supervisor.child]]\nkind = \"k\"\nname = \"a\"\ncheckpoint = \"s3://b/c\"\n\
             [supervisor.child.args]\nevery = 3\n\
             [[supervisor.child]]\nkind = \"k\"\nname = \"b\"\nrestart = \"transient\"\nnodes = [\"w1\"]\n",
        )
        .unwrap();
        assert_eq!(trees.len(), 1);
        let t = &trees[0];
        assert_eq!(t.spec.strategy, flotilla::supervisor::Strategy::RestForOne);
        assert_eq!(t.spec.intensity.max_restarts, 2);
        assert_eq!(t.spec.intensity.within, Duration::from_secs(60));
        assert_eq!(
            t.children[0].args,
            serde_json::json!({"every": 3, "checkpoint": "s3://b/c"})
        );
        assert_eq!(
            t.children[0].spec.restart,
            flotilla::supervisor::RestartType::Permanent
        );
        assert!(t.children[0].nodes.is_empty(), "this node by default");
        assert_eq!(
            t.children[1].spec.restart,
            flotilla::supervisor::RestartType::Transient
        );
        assert_eq!(t.children[1].nodes, ["w1"]);
    }

    #[test]
    fn malformed_trees_are_refused_with_what_is_wrong() {
        for (text, says) in [
            (
                "[[supervisor]]\nname = \"t\"\nstrategy = \"all_for_one\"\n[[supervisor.child]]\nkind = \"k\"\nname = \"a\"\n",
                "unknown strategy",
            ),
            (
                "[[supervisor]]\nname = \"t\"\n[[supervisor.child]]\nkind = \"k\"\nname = \"a\"\nrestart = \"sometimes\"\n",
                "unknown restart type",
            ),
            (
                "[[supervisor]]\nname = \"t\"\n[[supervisor.child]]\nkind = \"k\"\nname = \"a\"\n[[supervisor.child]]\nkind = \"k\"\nname = \"a\"\n",
                "named twice",
            ),
            ("[[supervisor]]\nname = \"t\"\n", "no [[supervisor.child]]"),
            (
                "[[supervisor]]\nname = \"t\"\n[[supervisor.child]]\nkind = \"k\"\nname = \"a\"\n[[supervisor]]\nname = \"t\"\n[[supervisor.child]]\nkind = \"k\"\nname = \"b\"\n",
                "declared twice",
            ),
        ] {
            let e = tree(text).unwrap_err().to_string();
            assert!(e.starts_with("NODE-CONFIG-007") && e.contains(says), "{e}");
        }
        let e = tree("[[supervisor]]\nname = \"t\"\nbogus = 1\n").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn resources_come_from_the_file_and_flags_win_name_by_name() {
        let path = std::env::temp_dir().join(format!("flotilla-res-{}.toml", std::process::id()));
        std::fs::write(&path, "[resources]\ncpu = 4\nssd = 1.5\n").unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        a.resources = vec![
            parse_resource("cpu=2").unwrap(),
            parse_resource("tpu=0.5").unwrap(),
        ];
        let c = node_config(a, true).unwrap().config;
        let want: BTreeMap<String, f64> = [
            ("cpu".into(), 2.0),
            ("ssd".into(), 1.5),
            ("tpu".into(), 0.5),
        ]
        .into();
        assert_eq!(c.declared, want);
        std::fs::write(&path, "[resources]\ngpu = 0.5\n").unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        let e = node_config(a, true).unwrap_err().to_string();
        assert!(e.contains("gpu is a whole number"), "{e}");
        assert!(parse_resource("cpu").unwrap_err().contains("NAME=AMOUNT"));
        assert!(
            parse_resource("cpu=lots")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(parse_resource("ssd=-1").is_err());
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn missing_required_setting_is_named() {
        let mut a = args();
        a.certs = None;
        assert!(matches!(
            node_config(a, true),
            Err(ConfigError::Missing("certs"))
        ));
        let mut a = args();
        a.head = Vec::new();
        assert!(matches!(
            node_config(a, true),
            Err(ConfigError::Missing("head"))
        ));
    }

    #[test]
    fn a_pooled_worker_takes_its_instance_and_a_head_none() {
        let mut a = args();
        a.instance = Some("flotilla-worker-7d9f-x2k4q".into());
        let c = node_config(a, true).unwrap().config;
        assert_eq!(c.instance.as_deref(), Some("flotilla-worker-7d9f-x2k4q"));
        let mut a = args();
        a.head = Vec::new();
        a.instance = Some("pod-a".into());
        let err = node_config(a, false).unwrap_err();
        assert!(err.to_string().contains("instance"), "{err}");
        // Heads by name, as a Kubernetes service names its pods.
        use clap::Parser;
        let cli = Cli::try_parse_from(["node", "join", "--name", "w", "--head", "localhost:7400"])
            .unwrap();
        let Command::Join(a) = cli.command else {
            panic!("join")
        };
        assert!(a.head[0].ip().is_loopback() && a.head[0].port() == 7400);
        let err = Cli::try_parse_from(["node", "join", "--head", "no-port"]).unwrap_err();
        assert!(err.to_string().contains("HOST:PORT"), "{err}");
    }

    #[test]
    fn unknown_file_key_is_an_error() {
        let path =
            std::env::temp_dir().join(format!("flotilla-node-bad-{}.toml", std::process::id()));
        std::fs::write(&path, "nmae = \"typo\"\n").unwrap();
        let err = read_file_config(&path).unwrap_err();
        assert!(err.to_string().contains("nmae"), "{err}");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn job_roots_come_from_the_file_and_the_flags() {
        let path = std::env::temp_dir().join(format!("flotilla-allow-{}.toml", std::process::id()));
        std::fs::write(&path, "[jobs]\nallow = [\"/data/\"]\n").unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        a.allow_paths = vec!["s3://corpus/".into()];
        let allow = node_config(a, true).unwrap().allow;
        assert_eq!(allow.roots(), ["/data/", "s3://corpus/"]);
        assert!(allow.check("input", "/data/x.jsonl").is_ok());
        assert!(allow.check("input", "/etc/passwd").is_err());
        let mut a = args();
        a.allow_paths = vec!["relative/root".into()];
        assert!(matches!(node_config(a, true), Err(ConfigError::Invalid(_))));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn job_retention_comes_from_the_file_and_the_flags() {
        let path =
            std::env::temp_dir().join(format!("flotilla-retention-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "[jobs]\nkeep_finished = 20\nkeep_finished_for_s = 3600\n",
        )
        .unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        let r = node_config(a, true).unwrap().retention;
        assert_eq!((r.keep, r.keep_for), (20, Duration::from_secs(3600)));
        let mut a = args();
        a.config = Some(path.clone());
        a.keep_finished_jobs = Some(5);
        let r = node_config(a, true).unwrap().retention;
        assert_eq!(
            (r.keep, r.keep_for),
            (5, Duration::from_secs(3600)),
            "flags win"
        );
        assert_eq!(
            node_config(args(), true).unwrap().retention,
            flotilla::jobs::Retention::default()
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn detector_timing_must_be_consistent() {
        let mut a = args();
        a.heartbeat_ms = Some(1000);
        a.down_after_ms = Some(500);
        assert!(matches!(node_config(a, true), Err(ConfigError::Invalid(_))));
    }

    #[test]
    fn a_member_of_a_head_set_lists_every_head_in_flags_or_the_file() {
        let (a1, a2): (SocketAddr, SocketAddr) = (
            "127.0.0.1:7420".parse().unwrap(),
            "127.0.0.1:7520".parse().unwrap(),
        );
        let mut a = args();
        a.head = vec![a1, a2];
        let c = node_config(a, true).unwrap().config;
        assert_eq!((c.head, c.standby_heads), (Some(a1), vec![a2]));
        let path =
            std::env::temp_dir().join(format!("flotilla-node-set-{}.toml", std::process::id()));
        std::fs::write(&path, "head = [\"127.0.0.1:7520\", \"127.0.0.1:7420\"]\n").unwrap();
        let mut a = args();
        a.head = Vec::new();
        a.config = Some(path.clone());
        let c = node_config(a, true).unwrap().config;
        assert_eq!((c.head, c.standby_heads), (Some(a2), vec![a1]));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_head_sets_lease_is_a_heads_url_and_defaults_to_the_down_threshold() {
        let head = || {
            let mut a = args();
            a.head = Vec::new();
            a.down_after_ms = Some(4000);
            a
        };
        let mut a = head();
        a.lease_store = Some("s3://bucket/heads".into());
        assert_eq!(
            node_config(a, false).unwrap().lease,
            Some(LeaseSettings {
                url: "s3://bucket/heads".into(),
                duration: Duration::from_secs(4),
            })
        );
        let mut a = head();
        a.lease_store = Some("/srv/heads".into());
        let e = node_config(a, false).unwrap_err();
        assert!(e.to_string().contains("not an object-store URL"), "{e}");
        let mut a = head();
        a.lease_ms = Some(3000);
        assert!(matches!(
            node_config(a, false),
            Err(ConfigError::Invalid(_))
        ));
        let mut a = args();
        a.lease_store = Some("s3://bucket/heads".into());
        let e = node_config(a, true).unwrap_err();
        assert!(e.to_string().contains("head's setting"), "{e}");
        let mut a = head();
        a.lease_store = Some("s3://bucket/heads".into());
        a.lease_ms = Some(50);
        assert!(matches!(
            node_config(a, false),
            Err(ConfigError::Invalid(_))
        ));
    }
}
