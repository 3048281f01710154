//! Real network partitions for multi-process tests: every node in a
//! network namespace of its own, the namespaces joined by veth pairs to a
//! bridge in one more namespace, and links cut by taking a host's bridge
//! port down (nothing gets through, either way) and healed by bringing it
//! up. Addresses exist only inside the namespaces (10.77.0.0/24); the test
//! creates everything and [`Net`]'s drop removes it.
//!
//! ```text
//!  ns HOST-a (10.77.0.1) ─ veth ─┐
//!  ns HOST-b (10.77.0.2) ─ veth ─┼─ bridge (ns SWITCH)   cut(b): b's port down
//!  ns HOST-c (10.77.0.3) ─ veth ─┘                        heal(b): up again
//!  block(a, c): a's packets to c dropped (nftables in a's namespace), c's to a pass
//! ```
//!
//! Needs root (CAP_NET_ADMIN), iproute2's `ip` and, for one-way and
//! pairwise cuts, nftables' `nft` (`scripts/fetch-test-tools` installs it);
//! a machine without them fails the test with the command's message rather
//! than skipping it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

use crate::cluster::{Launch, Proc, Scratch};

/// Networks made by this process so far: part of every name, so two
/// tests running at once never collide.
static NETS: AtomicU32 = AtomicU32::new(0);

/// A host of a [`Net`]: its namespace, address and bridge port.
#[derive(Debug, Clone)]
pub struct Host {
    /// The host's name in the test.
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address, inside the namespaces only.
    pub ip: Ipv4Addr,
    /// Its veth end on the bridge, in the switch namespace.
    port: String,
}

/// Namespaces joined by a bridge; removed on drop.
#[derive(Debug)]
pub struct Net {
    switch: String,
    hosts: Vec<Host>,
    /// Hosts whose namespace has the table of blocked addresses.
    filtered: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// Runs `nft ARGS` in namespace `ns`, failing the test with its message.
fn nft(ns: &str, args: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", args])
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip netns exec {ns} nft`: {e}"));
    assert!(
        out.status.success(),
        "nft {args}: {} (one-way cuts need nftables: scripts/fetch-test-tools installs it)",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs `ip ARGS`, failing the test with its message.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip` (iproute2 is needed): {e}"));
    assert!(
        out.status.success(),
        "ip {}: {} (partition tests need root and network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

impl Net {
    /// A namespace per name in `hosts`, addressed 10.77.0.1, .2, … in
    /// order, all on one bridge.
    pub fn new(hosts: &[&str]) -> Self {
        let id = format!(
            "{}{}",
            std::process::id() % 100_000,
            NETS.fetch_add(1, Ordering::Relaxed)
        );
        let switch = format!("flsw{id}");
        ip(&["netns", "add", &switch]);
        let mut net = Self {
            switch,
            hosts: Vec::new(),
            filtered: Default::default(),
        };
        ip(&["-n", &net.switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &net.switch, "link", "set", "br0", "up"]);
        for (i, name) in hosts.iter().enumerate() {
            let n = i + 1;
            let host = Host {
                name: (*name).to_owned(),
                ns: format!("flh{id}x{n}"),
                ip: Ipv4Addr::new(10, 77, 0, n as u8),
                // Interface names: at most 15 bytes.
                port: format!("fp{id}x{n}"),
            };
            ip(&["netns", "add", &host.ns]);
            // Pushed before its links exist, so a failure below still
            // removes the namespace.
            net.hosts.push(host.clone());
            ip(&[
                "link",
                "add",
                "eth0",
                "netns",
                &host.ns,
                "type",
                "veth",
                "peer",
                "name",
                &host.port,
                "netns",
                &net.switch,
            ]);
            ip(&[
                "-n",
                &net.switch,
                "link",
                "set",
                &host.port,
                "master",
                "br0",
                "up",
            ]);
            let cidr = format!("{}/24", host.ip);
            ip(&["-n", &host.ns, "addr", "add", &cidr, "dev", "eth0"]);
            ip(&["-n", &host.ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &host.ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in this net"))
    }

    /// `name`'s address with `port`.
    pub fn addr(&self, name: &str, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.host(name).ip), port)
    }

    /// Cuts `name` off from every other host, both ways.
    pub fn cut(&self, name: &str) {
        let port = &self.host(name).port;
        ip(&["-n", &self.switch, "link", "set", port, "down"]);
    }

    /// Joins `name` to the others again.
    pub fn heal(&self, name: &str) {
        let port = &self.host(name).port;
        ip(&["-n", &self.switch, "link", "set", port, "up"]);
    }

    /// Drops every packet `from` sends to `to`; what `to` sends to `from`
    /// still arrives.
    pub fn block(&self, from: &str, to: &str) {
        let ns = &self.host(from).ns;
        let mut filtered = self.filtered.lock().unwrap_or_else(|p| p.into_inner());
        if filtered.insert(ns.clone()) {
            nft(ns, "add table inet flcut");
            nft(ns, "add set inet flcut blocked { type ipv4_addr; }");
            nft(
                ns,
                "add chain inet flcut out { type filter hook output priority 0; policy accept; }",
            );
            nft(ns, "add rule inet flcut out ip daddr @blocked drop");
        }
        nft(
            ns,
            &format!("add element inet flcut blocked {{ {} }}", self.host(to).ip),
        );
    }

    /// Lets `from`'s packets to `to` through again.
    pub fn unblock(&self, from: &str, to: &str) {
        let ns = &self.host(from).ns;
        nft(
            ns,
            &format!(
                "delete element inet flcut blocked {{ {} }}",
                self.host(to).ip
            ),
        );
    }

    /// Cuts the link between `a` and `b` only, both ways.
    pub fn cut_between(&self, a: &str, b: &str) {
        self.block(a, b);
        self.block(b, a);
    }

    /// Restores the link between `a` and `b`.
    pub fn heal_between(&self, a: &str, b: &str) {
        self.unblock(a, b);
        self.unblock(b, a);
    }

    /// A command that runs `program` inside `name`'s namespace.
    pub fn command(&self, name: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(name).ns])
            .arg(program);
        cmd
    }

    /// Starts the node of host `name`: `node head` where `head` is
    /// `None`, else `node join` to `head`; listening on the host's address
    /// at `port`, with `flags`. Its log goes to the scratch folder as for
    /// [`Scratch::spawn`].
    pub fn spawn(
        &self,
        s: &Scratch,
        name: &str,
        port: u16,
        head: Option<SocketAddr>,
        flags: &[&str],
    ) -> Proc {
        s.issue(name);
        // `ip netns exec` enters the namespace and execs the program: the
        // child is the node itself, and signals reach it.
        s.launch_in(
            self.command(name, s.binary()),
            &s.certs(),
            Launch {
                role: if head.is_none() { "head" } else { "join" },
                name,
                listen: self.addr(name, port),
                head,
                flags,
                env: &[],
            },
        )
    }

    /// `node status --json --no-supervisors` against `head`, asked from
    /// host `from`, if it answers; with `supervisors`, every node's
    /// supervisors too.
    pub fn status(
        &self,
        s: &Scratch,
        from: &str,
        head: SocketAddr,
        supervisors: bool,
    ) -> Option<Value> {
        let mut cmd = self.command(from, s.binary());
        cmd.args(["status", "--json", "--head", &head.to_string()])
            .args(["--certs", s.certs().to_str().unwrap()]);
        if !supervisors {
            cmd.arg("--no-supervisors");
        }
        let out = cmd.output().ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

impl Drop for Net {
    /// Removes every namespace (their veth pairs go with them).
    fn drop(&mut self) {
        for ns in self.hosts.iter().map(|h| &h.ns).chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
