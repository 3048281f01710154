//! The shipped systemd units (`nodes/node/systemd/`) as systemd would run
//! them: `systemd-analyze verify` has nothing to say about them, and their
//! commands, with the example configurations of their comments, start in
//! the sandbox their settings describe — a read-only system, no homes, a
//! private /tmp, only the unit's state directory writable — join, and write
//! their state there (`flotilla_testkit::units`). The `test-node` binary
//! stands in for `node` (the same command, with a configurable kind for
//! the example's supervision tree).

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_testkit::cluster::*;
use flotilla_testkit::units::{Sandbox, Unit};

const NODE: &str = env!("CARGO_BIN_EXE_test-node");

fn units_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../nodes/node/systemd")
}

fn unit(name: &str) -> Unit {
    Unit::read(units_dir().join(name))
}

/// The unit's example configuration, which must parse and must not set
/// the cluster cookie (the `cookie` file of the certificates is the
/// default).
fn example(unit: &Unit) -> toml::Table {
    let config: toml::Table = unit
        .example_config()
        .parse()
        .unwrap_or_else(|e| panic!("{}: the example is not TOML: {e}", unit.path.display()));
    assert!(
        !config.contains_key("cookie"),
        "{}: the example sets a cookie",
        unit.path.display()
    );
    config
}

/// The unit's example configuration on a free loopback address (listen,
/// advertise, bulk lane): the configuration and the address.
fn example_at(unit: &Unit) -> (toml::Table, std::net::SocketAddr) {
    let addr = free_addr();
    let mut config = example(unit);
    config.insert("listen".into(), addr.to_string().into());
    config.insert("advertise".into(), addr.to_string().into());
    config.insert("bulk_listen".into(), free_addr().to_string().into());
    (config, addr)
}

/// One machine's `/etc/flotilla` (the certificates `name` needs, and
/// `config` as `file`) and its empty `/var/lib/flotilla`, in the scratch
/// folder.
fn machine(s: &Scratch, name: &str, file: &str, config: &toml::Table) -> (PathBuf, PathBuf) {
    let etc = s.dir.join(format!("{name}-etc"));
    let state = s.dir.join(format!("{name}-state"));
    std::fs::create_dir_all(etc.join("certs")).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    for f in [
        "ca.crt".to_owned(),
        format!("{name}.crt"),
        format!("{name}.key"),
        "cookie".to_owned(),
    ] {
        std::fs::copy(s.certs().join(&f), etc.join("certs").join(&f)).unwrap();
    }
    std::fs::write(etc.join(file), toml::to_string(config).unwrap()).unwrap();
    (etc, state)
}

/// Starts the unit's command in its sandbox, logging to `DIR/NAME.log`,
/// with a notification socket of its own.
fn start(
    s: &Scratch,
    unit: &Unit,
    name: &str,
    etc: &Path,
    state: &Path,
    addr: std::net::SocketAddr,
) -> (Proc, UnixDatagram) {
    let socket_path = s.dir.join(format!("{name}.notify"));
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let mut command = unit.sandboxed(&Sandbox {
        binary: Path::new(NODE),
        etc: ("flotilla", etc),
        state,
        notify: Some(&socket_path),
    });
    let log = std::fs::File::create(s.dir.join(format!("{name}.log"))).unwrap();
    command.stdout(Stdio::null()).stderr(log);
    let child = command
        .spawn()
        .expect("bwrap (Debian's bubblewrap; scripts/fetch-test-tools installs it)");
    (
        Proc {
            child,
            name: name.to_owned(),
            addr,
        },
        socket,
    )
}

/// Waits for `READY=1` on a notification socket.
fn ready(socket: &UnixDatagram, name: &str, s: &Scratch, budget: Duration) {
    let deadline = Instant::now() + budget;
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        socket
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ))
            .unwrap();
        if let Ok(n) = socket.recv(&mut buf)
            && String::from_utf8_lossy(&buf[..n]).contains("READY=1")
        {
            return;
        }
    }
    panic!("{name} sent no READY=1 within {budget:?}: {}", s.log(name));
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn systemd_analyze_verify_has_nothing_to_say_about_the_units() {
    let s = Scratch::new("units-verify", NODE);
    for name in ["flotilla-head.service", "flotilla-node.service"] {
        // The binary the unit names must exist for verify: the test's.
        let text = std::fs::read_to_string(units_dir().join(name))
            .unwrap()
            .replace("/usr/local/bin/node", NODE);
        let path = s.dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", path.to_str().unwrap()])
            .output()
            .expect("systemd-analyze (Debian's systemd)");
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Clause "systemd: units": the head and a worker, each in its unit's
/// sandbox with its example configuration (addresses made the test's, the
/// example tree's kind a checkpointing ticker), start, tell systemd they
/// are ready, see each other up, and write their incarnation records and
/// the tree's checkpoints in their state directories — the only place
/// they can write.
#[test]
fn head_and_worker_units_start_join_and_write_their_state_in_their_sandbox() {
    let s = Scratch::new("units", NODE);
    s.issue("w1");
    let head_unit = unit("flotilla-head.service");
    let node_unit = unit("flotilla-node.service");
    assert_eq!(head_unit.get("Restart"), Some("always"));
    assert!(head_unit.words("RestartPreventExitStatus").contains(&"2"));

    let (head_config, head_addr) = example_at(&head_unit);
    let (head_etc, head_state) = machine(&s, "head", "head.toml", &head_config);

    let (mut w1_config, w1_addr) = example_at(&node_unit);
    assert_eq!(w1_config["name"].as_str(), Some("w1"));
    w1_config.insert("head".into(), head_addr.to_string().into());
    let child = w1_config["supervisor"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap()["child"]
        .as_array_mut()
        .unwrap()[0]
        .as_table_mut()
        .unwrap();
    assert_eq!(
        child["checkpoint"].as_str(),
        Some("/var/lib/flotilla/checkpoints")
    );
    child.insert("kind".into(), "flotilla.ticker".into());
    let mut args = toml::Table::new();
    args.insert("tick_ms".into(), 20.into());
    args.insert("every".into(), 10.into());
    child.insert("args".into(), args.into());
    let (w1_etc, w1_state) = machine(&s, "w1", "node.toml", &w1_config);

    let (_head, head_notify) = start(&s, &head_unit, "head", &head_etc, &head_state, head_addr);
    ready(&head_notify, "head", &s, Duration::from_secs(20));
    let (_w1, w1_notify) = start(&s, &node_unit, "w1", &w1_etc, &w1_state, w1_addr);
    ready(&w1_notify, "w1", &s, Duration::from_secs(20));
    eventually(Duration::from_secs(20), || {
        s.status(head_addr).filter(|st| all_up(st, &["head", "w1"]))
    });

    assert!(
        head_state.join("head.incarnation").exists(),
        "{}",
        s.log("head")
    );
    assert!(w1_state.join("w1.incarnation").exists(), "{}", s.log("w1"));
    let (checkpoints, _) = eventually(Duration::from_secs(20), || {
        let found: Vec<PathBuf> = files(&w1_state.join("checkpoints"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
            .collect();
        (!found.is_empty()).then_some(found)
    });
    assert!(!checkpoints.is_empty());
    // The folders behind /etc/flotilla took nothing new.
    for etc in [&head_etc, &w1_etc] {
        assert_eq!(files(etc).len(), 5, "{}", etc.display());
    }
}

/// The sandbox is as read-only as systemd's: without `StateDirectory=` the
/// head's command cannot write its incarnation record and stops with
/// NODE-STATE-001 and exit code 2, which the unit does not restart.
#[test]
fn without_its_state_directory_a_unit_stops_with_a_configuration_error() {
    let s = Scratch::new("units-nostate", NODE);
    let head_unit = unit("flotilla-head.service").without("StateDirectory");
    let (config, addr) = example_at(&head_unit);
    let (etc, state) = machine(&s, "head", "head.toml", &config);
    let (mut head, _notify) = start(&s, &head_unit, "head", &etc, &state, addr);
    let status = head.exit_within(Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "{}", s.log("head"));
    assert!(
        s.log("head").contains("NODE-STATE-001"),
        "{}",
        s.log("head")
    );
    assert!(files(&state).is_empty());
}
