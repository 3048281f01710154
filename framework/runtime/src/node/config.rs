//! A node's configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use flotilla_proto::membership::DetectorConfig;
use flotilla_proto::resources::Resources;

/// Everything a node needs to start. Build one in code, or let the `node`
/// binary read it from flags and a TOML file.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The certificate's name (`certs/NAME.crt`). A head or worker is the
    /// member of that name; a driver's, admin's or observer's process is
    /// the member `NAME~TAG`, with a tag of its own (see
    /// [`flotilla_proto::role`]).
    pub name: String,
    /// A pooled worker's instance name (a DNS label, such as its pod's
    /// name): the worker joins as the member `NAME~INSTANCE`, so that the
    /// processes of one pool share one worker certificate (see
    /// [`flotilla_proto::role`]). Workers only.
    pub instance: Option<String>,
    /// UDP address to listen on.
    pub listen: SocketAddr,
    /// Address other members dial; defaults to `listen`.
    pub advertise: Option<SocketAddr>,
    /// The head to join; `None` makes this node the head (its certificate
    /// must carry the head role).
    pub head: Option<SocketAddr>,
    /// The head's name, when known: joining checks the head's certificate
    /// is issued for it (it must carry the head role in any case).
    pub head_name: Option<String>,
    /// The other heads of a head set (standbys that take over when the
    /// primary is lost): the member fails over to them in turn when the
    /// head it follows cannot be reached. Empty for a single head.
    pub standby_heads: Vec<SocketAddr>,
    /// The CA's revocation list the head follows and hands to every
    /// member; `None` is `crl.pem` in the certificates folder.
    pub revocation_list: Option<PathBuf>,
    /// Folder with `ca.crt`, `NAME.crt` and `NAME.key`.
    pub certs: PathBuf,
    /// The cluster cookie: every hello carries its digest, and
    /// ractor_cluster's session handshake uses it (defence in depth behind
    /// mutual TLS). `None` takes the certificates folder's `cookie` file.
    pub cookie: Option<String>,
    /// Folder where the node records its last incarnation
    /// (`NAME.incarnation`), so that incarnations increase across restarts
    /// whatever the clock does; `None` is the certificates folder.
    pub state_dir: Option<PathBuf>,
    /// Heartbeat interval and down threshold.
    pub detector: DetectorConfig,
    /// Resources offered to work; `None` detects them (a head offers none).
    pub resources: Option<Resources>,
    /// Custom labels added to the resources.
    pub labels: BTreeMap<String, String>,
    /// Resources declared in configuration (`cpu`, `gpu`, `memory_mb` or
    /// custom names), replacing what is detected.
    pub declared: BTreeMap<String, f64>,
    /// Largest cluster frame accepted from a peer, in bytes.
    pub max_frame_bytes: u64,
    /// How long joining may take before the node gives up.
    pub join_timeout: Duration,
    /// UDP address of the bulk lane's endpoint; defaults to the listen
    /// address's IP with a port the OS picks. Members learn it from the
    /// member table.
    pub bulk_listen: Option<SocketAddr>,
    /// The host id: nodes with the same one read each other's objects
    /// through shared memory. `None` detects it (see [`crate::node::host`]);
    /// set it to make nodes of one machine behave as if on different
    /// hosts.
    pub host_id: Option<String>,
    /// Capacity of the node's object store in bytes; `None` is
    /// [`crate::node::host::default_object_store_bytes`].
    pub object_store_bytes: Option<u64>,
}

impl NodeConfig {
    /// A configuration with defaults for everything but name, address and
    /// certificates.
    pub fn new(name: impl Into<String>, listen: SocketAddr, certs: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            instance: None,
            listen,
            advertise: None,
            head: None,
            head_name: None,
            standby_heads: Vec::new(),
            revocation_list: None,
            certs: certs.into(),
            cookie: None,
            state_dir: None,
            detector: DetectorConfig::default(),
            resources: None,
            declared: BTreeMap::new(),
            labels: BTreeMap::new(),
            max_frame_bytes: 64 << 20,
            join_timeout: Duration::from_secs(10),
            bulk_listen: None,
            host_id: None,
            object_store_bytes: None,
        }
    }

    /// Joins the cluster whose head listens at `head`.
    pub fn join(mut self, head: SocketAddr) -> Self {
        self.head = Some(head);
        self
    }

    /// Whether this node is the head.
    pub fn is_head(&self) -> bool {
        self.head.is_none()
    }

    /// The folder the node keeps its state in: [`NodeConfig::state_dir`],
    /// else the certificates folder.
    pub fn state_folder(&self) -> &std::path::Path {
        self.state_dir.as_deref().unwrap_or(&self.certs)
    }
}

/// Resources of this machine: logical CPUs, total memory and NVIDIA GPUs
/// (counted with `nvidia-smi -L` when present, else 0).
pub fn detect_resources() -> Resources {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024);
    Resources {
        cpus,
        memory_bytes,
        gpus: detect_gpus(),
        labels: BTreeMap::new(),
        custom: BTreeMap::new(),
    }
}

/// NVIDIA GPUs of this machine, counted with `nvidia-smi -L` (0 where it is
/// absent or fails: no driver, no GPU).
pub fn detect_gpus() -> u32 {
    std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or(0, |o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count() as u32
        })
}

/// The local address that routes to `head`, any port: what a member that
/// joins `head` listens on so that the others can dial it back. Nothing is
/// sent to find it.
pub fn route_to(head: SocketAddr) -> SocketAddr {
    let ip = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect(head).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    SocketAddr::new(ip, 0)
}

/// Reads an address as flags give it: `IP:PORT`, or `HOST:PORT` looked up
/// with the system's resolver (the first address it gives), as a
/// Kubernetes service's name is (`flotilla-head-0.flotilla-head:7400`).
///
/// ```
/// let a = flotilla::config::parse_address("127.0.0.1:7400").unwrap();
/// assert_eq!(a.port(), 7400);
/// let l = flotilla::config::parse_address("localhost:7400").unwrap();
/// assert!(l.ip().is_loopback());
/// assert!(flotilla::config::parse_address("no-port").is_err());
/// ```
pub fn parse_address(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    if s.rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(format!("{s:?} is not HOST:PORT"));
    }
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| format!("cannot look up {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s:?} names no address"))
}
