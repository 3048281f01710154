//! The `node` image (`nodes/node/image/Containerfile`, `scripts/image`):
//! built with podman, then a head and two workers of one pool (one worker
//! certificate, two instances, as the pods of a Deployment) run from it on
//! the host network, embed a corpus with the real model, and one worker
//! drains as its pod's preStop hook drains it. Where the machine refuses
//! to run containers (crun denied `setrlimit`), the image's own `node` runs
//! from its exported root filesystem, with the image's own loader and
//! libraries. And the Kubernetes manifests are checked against the
//! Kubernetes schemas, offline.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::*;

const NODE: &str = env!("CARGO_BIN_EXE_node");

/// Builds the image from the test's `node` and exports its root
/// filesystem into `dir/rootfs`; returns the image's tag.
fn build_image(dir: &Path) -> String {
    let tag = format!("localhost/flotilla-node:test-{}", std::process::id());
    succeeded(
        Command::new(root().join("scripts/image"))
            .args(["--binary", NODE, "--tag", &tag, "--export"])
            .arg(dir.join("rootfs")),
    );
    tag
}

/// A script that runs the image's `node` with its arguments: in a
/// container on the host network when this machine runs containers,
/// else from the exported root filesystem through the image's loader.
fn image_node(dir: &Path, tag: &str) -> PathBuf {
    let probe = Command::new("podman")
        .args(["run", "--rm", "--network", "host", tag, "--version"])
        .output()
        .unwrap();
    let rootfs = dir.join("rootfs");
    let script = if probe.status.success() {
        eprintln!("running the image in containers");
        // The test's folders and the model at the same paths inside.
        let mut mounts = String::new();
        for p in [
            std::env::temp_dir(),
            root().canonicalize().unwrap(),
            model().canonicalize().unwrap(),
        ] {
            mounts.push_str(&format!(" -v {0}:{0}", p.display()));
        }
        format!("exec podman run --rm -i --network host --user 0{mounts} {tag} \"$@\"\n")
    } else {
        eprintln!(
            "podman may not run containers here ({}); running the image's node from its root filesystem",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        let loader = ["lib64", "lib"]
            .iter()
            .filter_map(|d| std::fs::read_dir(rootfs.join(d)).ok())
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("ld-linux")
            })
            .expect("the image holds its loader");
        let mut libs: Vec<PathBuf> = Vec::new();
        collect_library_folders(&rootfs, &mut libs);
        let libs: Vec<String> = libs.iter().map(|p| p.display().to_string()).collect();
        format!(
            "exec {} --library-path {} {} \"$@\"\n",
            loader.display(),
            libs.join(":"),
            rootfs.join("usr/local/bin/node").display()
        )
    };
    let path = dir.join("image-node");
    std::fs::write(&path, format!("#!/bin/sh\n{script}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Folders under `dir` holding shared libraries.
fn collect_library_folders(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            collect_library_folders(&path, into);
        } else if path.to_string_lossy().contains(".so") && !into.contains(&dir.to_path_buf()) {
            into.push(dir.to_path_buf());
        }
    }
}

/// Starts the pool `workers`' instance `instance`, as its pod's
/// arguments do (`nodes/node/kubernetes/workers.yaml`).
fn pooled_worker(s: &Scratch, head: &Proc, instance: &str) -> Proc {
    let name = format!("workers~{instance}");
    let listen = free_addr();
    let state = s.dir.join(format!("state-{instance}"));
    std::fs::create_dir_all(&state).unwrap();
    let log = std::fs::File::create(s.dir.join(format!("{instance}.log"))).unwrap();
    let child = Command::new(s.binary())
        .args(["join", "--name", "workers", "--instance", instance])
        .args([
            "--listen",
            &listen.to_string(),
            "--head",
            &head.addr.to_string(),
        ])
        .args(["--head-name", "head", "--resource", "cpu=1"])
        .arg("--certs")
        .arg(s.certs())
        .arg("--state-dir")
        .arg(&state)
        .arg("--model")
        .arg(model())
        .args(["--drain-on-stop-s", "25"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc {
        child,
        name,
        addr: listen,
    }
}

/// Clauses "image": what `scripts/image` builds runs a head and two
/// pooled workers on the host network, which embed every row exactly
/// once; a worker drained as its preStop hook drains it leaves cleanly.
#[test]
fn the_image_runs_a_cluster_of_pooled_workers_that_embeds_and_drains() {
    let work = scratch("image");
    let tag = build_image(&work);
    let _image = Image(tag.clone());
    let node = image_node(&work, &tag);
    let version = Command::new(&node).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("node {}", env!("CARGO_PKG_VERSION")),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );
    // Everything from here on runs the image's node: the CA, the
    // certificates, the head, the workers, the driver, the drain.
    let s = Scratch::new("image", &node);
    s.issue_role("workers", "worker");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    let mut a = pooled_worker(&s, &head, "flotilla-worker-7d9f-a");
    let mut b = pooled_worker(&s, &head, "flotilla-worker-7d9f-b");
    let names = ["head", a.name.as_str(), b.name.as_str()];
    eventually(Duration::from_secs(60), || {
        s.status(head.addr).filter(|st| all_up(st, &names))
    });

    let (input, ids) = corpus(&s.dir, 600);
    let out = s.dir.join("out");
    let mut cmd = Command::new(&node);
    embed_on_cluster(&mut cmd, &input, &out, head.addr, &s.certs());
    let summary = succeeded(&mut cmd);
    assert!(summary.contains("on 2 actors"), "{summary}");
    assert_exactly_once(&out, &ids);

    // b's pod is terminated: its preStop hook drains it with the pool's
    // certificate, naming the member from the pod's environment.
    let asked = Instant::now();
    let said = succeeded(
        Command::new(&node)
            .args(["drain", "--deadline", "25", "--name", "workers"])
            .args(["--head", &head.addr.to_string()])
            .arg("--certs")
            .arg(s.certs())
            .env("FLOTILLA_MEMBER", &b.name),
    );
    assert!(said.contains(&format!("{} left after", b.name)), "{said}");
    let status = b.exit_within(Duration::from_secs(30));
    assert!(status.success(), "{}: {status:?}", b.name);
    let st = s.status(head.addr).unwrap();
    assert_eq!(state_of(&st, &b.name).as_deref(), Some("left"));
    assert_eq!(state_of(&st, &a.name).as_deref(), Some("up"));
    eprintln!(
        "image: 600 rows on two pooled workers; {} drained and left {:?} after its preStop's drain",
        b.name,
        asked.elapsed()
    );
    a.signal("-TERM");
    assert!(a.exit_within(Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(&work);
}

/// The test's image: removed at the end, with any container left of it
/// (a container outlives a `podman run` killed with SIGKILL).
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let filter = format!("ancestor={}", self.0);
        if let Ok(out) = Command::new("podman")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("podman").args(["rm", "-f", id]).output();
            }
        }
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

/// The manifests of `nodes/node/kubernetes/` are valid objects of the
/// Kubernetes API (`kubernetes-validate --strict`, which carries the
/// schemas: nothing is fetched), and their `node` arguments are ones
/// `node` takes.
#[test]
fn the_kubernetes_manifests_match_the_kubernetes_schemas_and_the_node_flags() {
    let dir = root().join("nodes/node/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
    let validate = test_tool("FLOTILLA_KUBERNETES_VALIDATE", "kubernetes-validate");
    let said = succeeded(Command::new(&validate).arg("--strict").args(&files));
    assert_eq!(said.matches(" passed for resource ").count(), 5, "{said}");

    // Every `node` command line of the manifests (a container's
    // arguments, a preStop hook's command) parses as `node` reads it,
    // with the pod's variables given values and the head's name one this
    // machine resolves.
    let python = validate.with_file_name("python");
    let out = succeeded(
        Command::new(python)
            .arg("-c")
            .arg(COMMAND_LINES)
            .args(&files),
    );
    let lines: Vec<Vec<String>> = serde_json::from_str(&out).unwrap();
    assert_eq!(
        lines.len(),
        4,
        "head, worker, its preStop, driver: {lines:?}"
    );
    for line in lines {
        let args: Vec<String> = std::iter::once("node".to_owned())
            .chain(line.iter().map(|a| {
                a.replace("$(POD_NAME)", "flotilla-worker-7d9f-x2k4q")
                    .replace("$(POD_IP)", "10.0.0.7")
                    .replace("flotilla-head:", "localhost:")
            }))
            .collect();
        use clap::Parser;
        if let Err(e) = flotilla_node::Cli::try_parse_from(&args) {
            panic!("{args:?}: {e}");
        }
    }
}

/// Prints, as JSON, the `node` command lines of the manifests named in
/// its arguments: each container's `args`, each preStop hook's `command`
/// less the program, followed by the member the container's environment
/// names (FLOTILLA_MEMBER, which `node drain` reads).
const COMMAND_LINES: &str = r#"
import json, sys, yaml
lines = []
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            lines.append(c["args"])
            hook = c.get("lifecycle", {}).get("preStop", {}).get("exec")
            if hook:
                assert hook["command"][0] == "/usr/local/bin/node", hook
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                lines.append(hook["command"][1:] + [env["FLOTILLA_MEMBER"]])
print(json.dumps(lines))
"#;
