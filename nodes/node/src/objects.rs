//! `node objects put FILE` and `node objects get REF`: the object store
//! from the command line, as a member of the cluster.
//!
//! `put` joins, reads the file straight into a shared-memory segment,
//! prints the reference and holds the object until stdin closes (or
//! SIGTERM), serving readers. `get` joins, reads the object (mapped when on
//! the owner's host, pulled once otherwise), checks the checksum over every
//! byte and prints as JSON what the read cost: the store's counters and
//! the process's private (anonymous) and shared memory before and after.

use std::io::Read;
use std::process::ExitCode;
use std::time::Instant;

use flotilla::{Node, NodeConfig, ObjectRef, Resources};
use serde::Serialize;

use crate::{ObjectsArgs, ObjectsOp};

/// Runs `node objects`.
pub async fn run(args: ObjectsArgs) -> ExitCode {
    let Some(&head) = args.head.first() else {
        eprintln!("node objects needs --head ADDR");
        return ExitCode::from(2);
    };
    // Refuse a malformed reference before joining anything.
    let reference = match &args.op {
        ObjectsOp::Get { reference, .. } => match ObjectRef::from_token(reference) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("NODE-OBJ-004: {e}");
                return ExitCode::from(2);
            }
        },
        ObjectsOp::Put { .. } => None,
    };
    let mut config = NodeConfig::new(
        args.name.clone(),
        flotilla::config::route_to(head),
        args.certs.clone(),
    )
    .join(head);
    config.standby_heads = args.head[1..].to_vec();
    config.resources = Some(Resources::default());
    config
        .labels
        .insert("role".to_owned(), "objects".to_owned());
    config.host_id = args.host_id.clone();
    config.object_store_bytes = args.object_store_mb.map(|mb| mb << 20);
    let node = match Node::builder(config).start().await {
        Ok(node) => node,
        Err(e) => {
            eprintln!("cannot join {head}: {e}");
            return ExitCode::from(3);
        }
    };
    let code = match (args.op, reference) {
        (ObjectsOp::Put { file }, _) => put(&node, &file).await,
        (ObjectsOp::Get { out, .. }, Some(reference)) => get(&node, &reference, out).await,
        (ObjectsOp::Get { .. }, None) => unreachable!("parsed above"),
    };
    node.shutdown().await;
    code
}

async fn put(node: &Node, file: &std::path::Path) -> ExitCode {
    let mut f = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot open {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let size = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            eprintln!("cannot read {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let objects = node.objects();
    let mut writer = match objects
        .store()
        .writer(size, flotilla::objects::DEFAULT_PUT_TIMEOUT)
        .await
    {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = f.read_exact(writer.bytes_mut()) {
        eprintln!("cannot read {}: {e}", file.display());
        return ExitCode::from(2);
    }
    let object = writer.seal();
    println!("{}", object.reference().to_token());
    // Hold the object until stdin closes or the process is told to stop.
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    });
    tokio::select! {
        _ = stdin_closed => {}
        () = crate::systemd::wait_for_stop() => {}
    }
    drop(object);
    ExitCode::SUCCESS
}

/// What `node objects get` prints.
#[derive(Serialize)]
struct Report {
    size: u64,
    checksum_ok: bool,
    get_us: u64,
    local_gets: u64,
    remote_pulls: u64,
    pulled_bytes: u64,
    rss_anon_kb_before: u64,
    rss_anon_kb_after: u64,
    rss_shmem_kb_after: u64,
}

async fn get(node: &Node, reference: &ObjectRef, out: Option<std::path::PathBuf>) -> ExitCode {
    let before = flotilla::process::status_kib("RssAnon:");
    let started = Instant::now();
    let bytes = match node.objects().get(reference).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let get_us = started.elapsed().as_micros() as u64;
    let checksum_ok = flotilla::objects::checksum(&bytes) == reference.checksum;
    if let Some(out) = out
        && let Err(e) = std::fs::write(&out, &*bytes)
    {
        eprintln!("cannot write {}: {e}", out.display());
        return ExitCode::from(2);
    }
    let stats = node.objects().stats();
    let report = Report {
        size: bytes.len() as u64,
        checksum_ok,
        get_us,
        local_gets: stats.local_gets,
        remote_pulls: stats.remote_pulls,
        pulled_bytes: stats.pulled_bytes,
        rss_anon_kb_before: before,
        rss_anon_kb_after: flotilla::process::status_kib("RssAnon:"),
        rss_shmem_kb_after: flotilla::process::status_kib("RssShmem:"),
    };
    println!(
        "{}",
        serde_json::to_string(&report).expect("report serializes")
    );
    if checksum_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
