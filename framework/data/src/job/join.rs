//! How a job's driver reaches a cluster: as a node of its own that offers
//! no resources, so no work lands on it. The flags a driver program takes
//! (`clap`); without `--head` the job runs in its own process.

use std::net::SocketAddr;
use std::path::PathBuf;

use flotilla::{NodeConfig, Resources};

/// How a job's driver joins a cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct Join {
    /// Run on the cluster whose head listens here (the driver joins it and
    /// runs the job's actors on its workers); without it, the job runs in
    /// this process. With a head set, every head's address (repeat the
    /// flag, or separate them with commas): the driver fails over to the
    /// head that takes over.
    #[arg(long, value_delimiter = ',', value_parser = flotilla::config::parse_address)]
    pub head: Vec<SocketAddr>,
    /// Folder with ca.crt and the driver's certificate (with --head).
    #[arg(long, default_value = "certs")]
    pub certs: PathBuf,
    /// The driver's node name, as in its certificate (with --head).
    #[arg(long, default_value = "admin")]
    pub name: String,
    /// UDP address the driver listens on (with --head; default: the local
    /// address that routes to the head, any port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Cluster cookie (with --head; default: the certs folder's `cookie`).
    #[arg(long)]
    pub cookie: Option<String>,
    /// Capacity of the driver's object store in MiB (with --head; default
    /// as for nodes). Batches hand their data to the actors as objects of
    /// it while it takes them, and carry it in the requests otherwise.
    #[arg(long)]
    pub object_store_mb: Option<u64>,
}

impl Default for Join {
    /// This process (no head), with the flags' defaults.
    fn default() -> Self {
        Self {
            head: Vec::new(),
            certs: PathBuf::from("certs"),
            name: "admin".to_owned(),
            listen: None,
            cookie: None,
            object_store_mb: None,
        }
    }
}

impl Join {
    /// The head dialled first, if the job runs on a cluster.
    pub fn first_head(&self) -> Option<SocketAddr> {
        self.head.first().copied()
    }

    /// The driver's node for the cluster at `head` (and the other heads
    /// of its head set given in [`Join::head`]): offering no resources
    /// (other jobs must not place work on it), labelled `role=ROLE`.
    pub fn node_config(&self, head: SocketAddr, role: &str) -> NodeConfig {
        let listen = self
            .listen
            .unwrap_or_else(|| flotilla::config::route_to(head));
        let mut config = NodeConfig::new(self.name.clone(), listen, self.certs.clone()).join(head);
        config.standby_heads = self.head.iter().copied().filter(|a| *a != head).collect();
        config.resources = Some(Resources::default());
        config.labels.insert("role".to_owned(), role.to_owned());
        config.cookie = self.cookie.clone();
        config.object_store_bytes = self.object_store_mb.map(|mb| mb << 20);
        config
    }
}
