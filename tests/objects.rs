//! The object store across real `node` processes on one machine: a member
//! puts an object (`node objects put`), others read it (`node objects
//! get`), mapped from shared memory when they share the host id, pulled
//! over the owner's bulk lane when they claim another.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::*;
use serde_json::Value;

const NODE: &str = env!("CARGO_BIN_EXE_node");

/// A `node objects put` holding its object; killed on drop.
struct Holder {
    child: Child,
    token: String,
}

impl Drop for Holder {
    /// Closes its stdin, so that it frees its object and exits; kills it
    /// only if it has not within 10 s.
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Free bytes of `/dev/shm`, from `df`.
fn shm_free() -> u64 {
    let out = Command::new("df")
        .args(["-k", "--output=avail", "/dev/shm"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

/// Issues `name`'s certificate unless it has one.
fn issue_once(s: &Scratch, name: &str) {
    if !s.certs().join(format!("{name}.crt")).exists() {
        s.issue(name);
    }
}

fn head(s: &Scratch) -> Proc {
    let addr = free_addr();
    s.issue("head");
    let head = s.spawn("head", "head", addr, None, &s.certs());
    eventually(Duration::from_secs(20), || s.status(addr));
    head
}

/// Puts `file` as member `name` and waits for the printed reference.
fn put(s: &Scratch, head: &Proc, name: &str, file: &Path, extra: &[&str]) -> Holder {
    let log = std::fs::File::create(s.dir.join(format!("{name}.log"))).unwrap();
    let mut child = objects_cmd(s, head, name, extra)
        .args(["put", file.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("obj:"),
        "no reference printed: {line:?}; log: {}",
        s.log(name)
    );
    Holder {
        child,
        token: line.trim().to_owned(),
    }
}

/// `node objects` as member `name` with `extra` flags, to be given its
/// operation.
fn objects_cmd(s: &Scratch, head: &Proc, name: &str, extra: &[&str]) -> Command {
    issue_once(s, name);
    let mut cmd = Command::new(NODE);
    cmd.args(["objects", "--head", &head.addr.to_string()])
        .args(["--certs", s.certs().to_str().unwrap(), "--name", name])
        .args(extra);
    cmd
}

/// Runs `cmd`: its success, and its stdout when it succeeded or stderr.
fn outcome(mut cmd: Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    if out.status.success() {
        (true, String::from_utf8(out.stdout).unwrap())
    } else {
        (false, String::from_utf8(out.stderr).unwrap())
    }
}

/// Reads `token` as member `name`: exit success, the report (or stderr).
fn get(s: &Scratch, head: &Proc, name: &str, token: &str, extra: &[&str]) -> (bool, String) {
    let mut cmd = objects_cmd(s, head, name, extra);
    cmd.args(["get", token]);
    outcome(cmd)
}

/// A file of `size` bytes that differ from one offset to the next.
fn data_file(dir: &Path, name: &str, size: usize) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut left = size;
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = left.min(8);
        f.write_all(&x.to_le_bytes()[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
    path
}

/// The segment files under /dev/shm of process `pid`.
fn segments_of(pid: u32) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("flotilla.") && n.split('.').nth(2) == Some(&pid.to_string()))
        .collect()
}

#[test]
fn a_large_object_is_read_by_another_process_of_the_host_in_place() {
    let s = Scratch::new("objects-in-place", NODE);
    let head = head(&s);
    // 256 MiB where /dev/shm has room for it (the default store takes at
    // most half of what is free), less on a machine with a small one.
    let size = (256u64 << 20).min(shm_free() / 4) as usize;
    assert!(size >= 16 << 20, "/dev/shm has under 64 MiB free");
    let file = data_file(&s.dir, "big.bin", size);
    let holder = put(&s, &head, "owner", &file, &[]);
    let (ok, out) = get(&s, &head, "reader", &holder.token, &[]);
    assert!(ok, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["size"], size as u64);
    assert_eq!(report["checksum_ok"], true, "every byte read back");
    assert_eq!(report["remote_pulls"], 0);
    assert_eq!(report["pulled_bytes"], 0, "no bytes over QUIC");
    assert_eq!(report["local_gets"], 1);
    let anon = report["rss_anon_kb_after"]
        .as_u64()
        .unwrap()
        .saturating_sub(report["rss_anon_kb_before"].as_u64().unwrap());
    assert!(
        anon < 32 << 10,
        "the reader's private memory grew by {anon} KiB reading {size} bytes: {out}"
    );
    assert!(
        report["rss_shmem_kb_after"].as_u64().unwrap() >= (size as u64 >> 10) * 9 / 10,
        "the bytes were read from the shared pages: {out}"
    );
}

#[test]
fn a_reader_on_another_host_pulls_the_object_once_and_checks_it() {
    let s = Scratch::new("objects-pull", NODE);
    let head = head(&s);
    const SIZE: usize = 8 << 20;
    let file = data_file(&s.dir, "mid.bin", SIZE);
    let holder = put(&s, &head, "owner", &file, &["--host-id", "host-a"]);
    let (ok, out) = get(&s, &head, "far", &holder.token, &["--host-id", "host-b"]);
    assert!(ok, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["checksum_ok"], true);
    assert_eq!(report["remote_pulls"], 1);
    assert_eq!(report["pulled_bytes"], SIZE as u64);

    // The bytes written out are the file's.
    let copy = s.dir.join("copy.bin");
    let mut cmd = objects_cmd(&s, &head, "far", &["--host-id", "host-b"]);
    cmd.args(["get", &holder.token, "--out", copy.to_str().unwrap()]);
    let (ok, out) = outcome(cmd);
    assert!(ok, "{out}");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&file).unwrap());

    // Bytes corrupted on the way are refused by the checksum.
    let mut cmd = objects_cmd(&s, &head, "far", &["--host-id", "host-b"]);
    cmd.env("FLOTILLA_FAILPOINTS", "objects::pull_corrupt=return")
        .args(["get", &holder.token]);
    let (ok, err) = outcome(cmd);
    assert!(!ok);
    assert!(err.contains("NODE-OBJ-007"), "{err}");
}

#[test]
fn malformed_references_and_truncated_segments_are_typed_errors() {
    let s = Scratch::new("objects-bad", NODE);
    let head = head(&s);
    let file = data_file(&s.dir, "small.bin", 1 << 20);
    let holder = put(&s, &head, "owner", &file, &[]);

    let (ok, err) = get(&s, &head, "reader", "obj:nonsense", &[]);
    assert!(!ok);
    assert!(err.contains("NODE-OBJ-004"), "{err}");

    // A reference whose size differs from the segment's.
    let mut parts: Vec<&str> = holder.token.split(':').collect();
    parts[2] = "999";
    let (ok, err) = get(&s, &head, "reader", &parts.join(":"), &[]);
    assert!(!ok);
    assert!(err.contains("NODE-OBJ-005"), "{err}");

    // The same asked of the owner over the network.
    let (ok, err) = get(
        &s,
        &head,
        "reader",
        &parts.join(":"),
        &["--host-id", "elsewhere"],
    );
    assert!(!ok);
    assert!(err.contains("NODE-OBJ-005"), "{err}");

    // A segment cut short under the owner.
    let id = holder.token.split(':').nth(1).unwrap();
    let fields: Vec<&str> = id.split('-').collect();
    let name = format!("flotilla.{}.{}.{}", fields[0], fields[1], fields[2]);
    let seg = std::fs::OpenOptions::new()
        .write(true)
        .open(Path::new("/dev/shm").join(&name))
        .unwrap();
    seg.set_len(100).unwrap();
    let (ok, err) = get(&s, &head, "reader", &holder.token, &[]);
    assert!(!ok);
    assert!(
        err.contains("NODE-OBJ-008") && err.contains("holds 100 bytes"),
        "{err}"
    );

    // The owner is still a member, and serves a new object.
    assert_eq!(
        state_of(&s.status(head.addr).unwrap(), "owner").as_deref(),
        Some("up")
    );
    drop(holder);
    let again = put(&s, &head, "owner2", &file, &[]);
    let (ok, out) = get(&s, &head, "reader", &again.token, &[]);
    assert!(ok, "{out}");
}

#[test]
fn segments_of_a_killed_owner_are_gone_once_it_restarts() {
    let s = Scratch::new("objects-kill", NODE);
    let head = head(&s);
    let file = data_file(&s.dir, "f.bin", 4 << 20);
    let mut first = put(&s, &head, "owner", &file, &[]);
    let pid = first.child.id();
    assert_eq!(segments_of(pid).len(), 1);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert_eq!(segments_of(pid).len(), 1, "SIGKILL unlinks nothing");
    let second = put(&s, &head, "owner", &file, &[]);
    assert!(
        segments_of(pid).is_empty(),
        "the restart swept the dead process's segments"
    );
    assert_eq!(segments_of(second.child.id()).len(), 1);
}
