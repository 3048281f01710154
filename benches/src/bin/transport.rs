//! Remote messaging over Flotilla's QUIC transport against two same-run
//! baselines: ractor_cluster over its own plain TCP, and a raw quinn stream
//! (the ceiling).
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin transport [-- --rounds 3]
//! ```
//!
//! Each transport runs in a fresh sender process with a receiver process on
//! loopback (ractor's registry is process-global, so transports never share
//! a process). Measured: cast throughput for 8 B, 64 KiB and 4 MiB payloads
//! (all casts sent, then a call that returns once the receiver counted them
//! all), call round trip p50/p99 for 8 B, the sender's peak RSS while
//! casting 256 MiB, and an 8 B call to another actor on the same node issued
//! while another task casts 256 MiB to the sink.
//! Flotilla's casts go through the node's `Outbound::cast`, which waits while
//! the remote-send backlog is over its limit; ractor over TCP has no such
//! bound and uses its plain cast.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, call_t};
use flotilla::ractor_cluster::{NodeServer, NodeServerMessage, RactorClusterMessage};
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::wire::Sealed;
use flotilla::{Node, NodeConfig, Outbound};
use flotilla_benches::{peak_rss_bytes, percentile, reset_peak_rss};
use serde::{Deserialize as De, Serialize as Ser};

// The `node` binary's allocator. With the system allocator, 4 MiB messages
// measured the allocator more than the transport: glibc maps and unmaps (or
// trims) their blocks, page-faulting every message, at rates that moved
// with the order of the bench's own allocations.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Bytes carried by a cast or call.
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
#[rkyv(crate = flotilla::rkyv)]
struct Blob(Vec<u8>);

/// Sink arguments (none).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy)]
#[rkyv(crate = flotilla::rkyv)]
struct NoArgs;

flotilla::remote_type!(Blob, NoArgs);

#[derive(RactorClusterMessage)]
enum SinkMsg {
    Put(Blob),
    /// The same bytes as an archive read in place where it lands.
    PutSealed(Sealed<Blob>),
    #[rpc]
    Count(RpcReplyPort<u64>),
    #[rpc]
    Echo(Blob, RpcReplyPort<Blob>),
}

/// Counts what it receives; answers calls.
struct Sink;

/// The kind the far node registers [`Sink`] as.
const SINK: flotilla::ActorKind<SinkMsg, NoArgs> = flotilla::ActorKind::new("sink");

impl Actor for Sink {
    type Msg = SinkMsg;
    type State = u64;
    type Arguments = NoArgs;

    async fn pre_start(&self, _: ActorRef<SinkMsg>, _: NoArgs) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }

    async fn handle(
        &self,
        _: ActorRef<SinkMsg>,
        msg: SinkMsg,
        count: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SinkMsg::Put(_) => *count += 1,
            SinkMsg::PutSealed(blob) => {
                // Read where it landed: the length of the archived bytes.
                if !blob.get().0.is_empty() {
                    *count += 1;
                }
            }
            SinkMsg::Count(r) => {
                let _ = r.send(*count);
            }
            SinkMsg::Echo(b, r) => {
                let _ = r.send(b);
            }
        }
        Ok(())
    }
}

/// One transport's results.
#[derive(Debug, Default, Ser, De)]
struct Results {
    tiny_per_s: f64,
    kib64_per_s: f64,
    mib4_per_s: f64,
    /// 4 MiB casts of a [`Sealed`] payload (messages per second).
    mib4_sealed_per_s: f64,
    rtt_p50_us: f64,
    rtt_p99_us: f64,
    rss_before_mib: f64,
    rss_256mib_mib: f64,
    /// Median of the same calls, 5 ms apart, with no bulk in flight.
    spaced_idle_ms: f64,
    /// Median of the calls issued during the bulk cast.
    behind_bulk_ms: f64,
    /// Slowest of them.
    behind_bulk_max_ms: f64,
    /// How many were issued.
    behind_bulk_calls: usize,
    /// Median of calls back to back, no bulk in flight.
    b2b_idle_ms: f64,
    /// Median of calls back to back during a second 256 MiB cast.
    b2b_bulk_ms: f64,
    /// How many of those were issued.
    b2b_bulk_calls: usize,
}

const TINY: usize = 100_000;
const KIB64: usize = 2_048;
const MIB4: usize = 64;
const CALLS: usize = 2_000;
/// Calls of the spaced probe without bulk traffic.
const SPACED: usize = 100;

/// Casts one message: through the node's bounded cast when `bounded` (it
/// waits while the node's remote-send backlog is over its limit), else
/// ractor's plain cast (never waits).
async fn send(
    sink: &ActorRef<SinkMsg>,
    msg: SinkMsg,
    bounded: Option<&Outbound>,
) -> anyhow::Result<()> {
    match bounded {
        Some(outbound) => outbound
            .cast(sink, msg)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        None => sink.cast(msg)?,
    }
    Ok(())
}

/// Casts `n` payloads of `size` bytes, then waits until the sink counted
/// them; returns messages per second. `sealed` sends them as [`Sealed`]
/// archives (serialized once, as a sender of large payloads would).
async fn cast_rate(
    sink: &ActorRef<SinkMsg>,
    size: usize,
    n: usize,
    already: &mut u64,
    bounded: Option<&Outbound>,
    sealed: bool,
) -> anyhow::Result<f64> {
    let payload = Blob(vec![7u8; size]);
    let archive = sealed.then(|| Sealed::new(&payload));
    let t = Instant::now();
    for _ in 0..n {
        let msg = match &archive {
            Some(a) => SinkMsg::PutSealed(a.clone()),
            None => SinkMsg::Put(payload.clone()),
        };
        send(sink, msg, bounded).await?;
    }
    *already += n as u64;
    loop {
        let got = call_t!(sink, SinkMsg::Count, 120_000)?;
        if got >= *already {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

async fn rtt(sink: &ActorRef<SinkMsg>) -> anyhow::Result<(f64, f64)> {
    let mut samples = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        call_t!(sink, SinkMsg::Echo, 5_000, Blob(vec![1; 8]))?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok((
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99),
    ))
}

/// 8-byte calls to `actor`, `gap` apart, while `go_on(calls so far)`;
/// returns each call's time in ms.
async fn probe(
    actor: &ActorRef<SinkMsg>,
    gap: Duration,
    mut go_on: impl FnMut(usize) -> bool,
) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::new();
    while go_on(times.len()) {
        let t = Instant::now();
        call_t!(actor, SinkMsg::Echo, 120_000, Blob(vec![1; 8]))?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    Ok(times)
}

/// Casts 256 MiB to `sink` as 4 MiB messages on a task of its own.
fn spawn_bulk(
    sink: &ActorRef<SinkMsg>,
    bounded: Option<&Outbound>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let sink = sink.clone();
    let bounded = bounded.cloned();
    tokio::spawn(async move {
        let payload = vec![7u8; 4 << 20];
        for _ in 0..MIB4 {
            send(&sink, SinkMsg::Put(Blob(payload.clone())), bounded.as_ref()).await?;
        }
        Ok(())
    })
}

/// Runs every actor measurement against `sink`.
async fn measure_actor(
    sink: ActorRef<SinkMsg>,
    other: ActorRef<SinkMsg>,
    bounded: Option<&Outbound>,
) -> anyhow::Result<Results> {
    let mut done = 0;
    let mut r = Results::default();
    // Warm up the session, then measure the 256 MiB cast first, from the
    // sender's resting RSS.
    cast_rate(&sink, 8, 1_000, &mut done, bounded, false).await?;
    r.rss_before_mib = flotilla_benches::rss_bytes() as f64 / (1 << 20) as f64;
    reset_peak_rss();
    r.mib4_per_s = cast_rate(&sink, 4 << 20, MIB4, &mut done, bounded, false).await?;
    r.rss_256mib_mib = peak_rss_bytes() as f64 / (1 << 20) as f64;
    r.mib4_sealed_per_s = cast_rate(&sink, 4 << 20, MIB4, &mut done, bounded, true).await?;
    // 8-byte calls to another actor on the same node: 5 ms apart and back
    // to back, each without bulk traffic and while another task casts
    // 256 MiB to the sink.
    let gap = Duration::from_millis(5);
    r.spaced_idle_ms = flotilla_benches::median(&mut probe(&other, gap, |n| n < SPACED).await?);
    let bulk = spawn_bulk(&sink, bounded);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut behind = probe(&other, gap, |n| n == 0 || !bulk.is_finished()).await?;
    bulk.await??;
    r.behind_bulk_calls = behind.len();
    r.behind_bulk_max_ms = behind.iter().copied().fold(0.0, f64::max);
    r.behind_bulk_ms = flotilla_benches::median(&mut behind);
    r.b2b_idle_ms =
        flotilla_benches::median(&mut probe(&other, Duration::ZERO, |n| n < CALLS).await?);
    let bulk = spawn_bulk(&sink, bounded);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut b2b = probe(&other, Duration::ZERO, |n| n == 0 || !bulk.is_finished()).await?;
    bulk.await??;
    r.b2b_bulk_calls = b2b.len();
    r.b2b_bulk_ms = flotilla_benches::median(&mut b2b);
    done += 2 * MIB4 as u64;
    cast_rate(&sink, 8, 1, &mut done, bounded, false).await?;
    r.tiny_per_s = cast_rate(&sink, 8, TINY, &mut done, bounded, false).await?;
    r.kib64_per_s = cast_rate(&sink, 64 << 10, KIB64, &mut done, bounded, false).await?;
    (r.rtt_p50_us, r.rtt_p99_us) = rtt(&sink).await?;
    Ok(r)
}

fn exe() -> anyhow::Result<PathBuf> {
    Ok(std::env::current_exe()?)
}

fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Receiver(Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn receiver(args: &[&str]) -> anyhow::Result<Receiver> {
    Ok(Receiver(
        Command::new(exe()?)
            .args(args)
            .stdout(Stdio::null())
            .spawn()?,
    ))
}

async fn sender_quic(certs: &Path) -> anyhow::Result<Results> {
    let node = Node::builder(NodeConfig::new(
        "sender",
        flotilla_testkit::ca::free_addr(),
        certs,
    ))
    .start()
    .await?;
    let head = node.addr().to_string();
    let _rx = receiver(&[
        "--role",
        "quic-receiver",
        "--head",
        &head,
        "--certs",
        &certs.to_string_lossy(),
    ])?;
    node.wait_members(Duration::from_secs(30), |t| t.up().count() == 2)
        .await
        .context("receiver did not join")?;
    let sink: ActorRef<SinkMsg> = node
        .spawn_on(
            "receiver",
            SINK.named("sink"),
            &NoArgs,
            Duration::from_secs(10),
        )
        .await?;
    let other: ActorRef<SinkMsg> = node
        .spawn_on(
            "receiver",
            SINK.named("other"),
            &NoArgs,
            Duration::from_secs(10),
        )
        .await?;
    let r = measure_actor(sink, other, Some(&node.outbound())).await?;
    node.shutdown().await;
    Ok(r)
}

async fn receiver_quic(head: SocketAddr, certs: PathBuf) -> anyhow::Result<()> {
    let config = NodeConfig::new("receiver", flotilla_testkit::ca::free_addr(), certs).join(head);
    let _node = Node::builder(config)
        .register(SINK, || Sink)
        .start()
        .await?;
    std::future::pending::<()>().await;
    Ok(())
}

async fn tcp_node(name: &str, port: u16) -> anyhow::Result<ActorRef<NodeServerMessage>> {
    let server = NodeServer::new(port, "bench".into(), name.into(), name.into(), None, None)
        .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into())
        .with_max_inbound_frame_size(64 << 20);
    Ok(Actor::spawn(None, server, ()).await?.0)
}

async fn sender_tcp() -> anyhow::Result<Results> {
    let port = free_tcp_port()?;
    let _rx = receiver(&["--role", "tcp-receiver", "--port", &port.to_string()])?;
    let node = tcp_node("sender", 0).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if flotilla::ractor_cluster::client_connect(&node, ("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "receiver never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let find = |name: &str| {
        flotilla::ractor::pg::get_members(&name.to_owned())
            .into_iter()
            .next()
            .map(ActorRef::<SinkMsg>::from)
    };
    let (sink, other) = loop {
        if let (Some(s), Some(o)) = (find("sink"), find("other")) {
            break (s, o);
        }
        anyhow::ensure!(Instant::now() < deadline, "sinks never appeared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    measure_actor(sink, other, None).await
}

async fn receiver_tcp(port: u16) -> anyhow::Result<()> {
    let _node = tcp_node("receiver", port).await?;
    for name in ["sink", "other"] {
        let (actor, _) = Actor::spawn(Some(name.into()), Sink, NoArgs).await?;
        flotilla::ractor::pg::join(name.into(), vec![actor.get_cell()]);
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// Raw quinn: the same workloads as length-prefixed frames on one stream.
async fn sender_raw(certs: &Path) -> anyhow::Result<Results> {
    use flotilla_transport::{Endpoint, Identity, Tuning};
    let addr = flotilla_testkit::ca::free_addr();
    let _rx = receiver(&[
        "--role",
        "raw-receiver",
        "--listen",
        &addr.to_string(),
        "--certs",
        &certs.to_string_lossy(),
    ])?;
    let ep = Endpoint::client(Identity::load(certs, "sender")?, &Tuning::default())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let pc = loop {
        match ep.connect(addr, Some("receiver")).await {
            Ok(pc) => break pc,
            Err(e) => anyhow::ensure!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (mut send, mut recv) = pc.connection.open_bi().await?;
    let mut r = Results::default();
    // Frames: u32 length, payload. A zero-length frame asks for the count
    // of frames received so far (u64 reply); the receiver echoes 8-byte
    // frames tagged 0xEE.
    async fn count(
        send: &mut quinn::SendStream,
        recv: &mut quinn::RecvStream,
    ) -> anyhow::Result<u64> {
        send.write_all(&0u32.to_be_bytes()).await?;
        let mut b = [0u8; 8];
        recv.read_exact(&mut b).await?;
        Ok(u64::from_be_bytes(b))
    }
    async fn frames(
        send: &mut quinn::SendStream,
        recv: &mut quinn::RecvStream,
        size: usize,
        n: usize,
    ) -> anyhow::Result<f64> {
        let mut frame = (size as u32).to_be_bytes().to_vec();
        frame.extend(vec![7u8; size]);
        let before = count(send, recv).await?;
        let t = Instant::now();
        for _ in 0..n {
            send.write_all(&frame).await?;
        }
        while count(send, recv).await? < before + n as u64 {}
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }
    frames(&mut send, &mut recv, 8, 1_000).await?;
    r.rss_before_mib = flotilla_benches::rss_bytes() as f64 / (1 << 20) as f64;
    reset_peak_rss();
    r.mib4_per_s = frames(&mut send, &mut recv, 4 << 20, MIB4).await?;
    // Raw frames have no archive to seal: the same bytes, the same figure.
    r.mib4_sealed_per_s = r.mib4_per_s;
    r.rss_256mib_mib = peak_rss_bytes() as f64 / (1 << 20) as f64;
    r.tiny_per_s = frames(&mut send, &mut recv, 8, TINY).await?;
    r.kib64_per_s = frames(&mut send, &mut recv, 64 << 10, KIB64).await?;
    let mut samples = Vec::with_capacity(CALLS);
    let mut ping = 8u32.to_be_bytes().to_vec();
    ping.extend([0xEE; 8]);
    for _ in 0..CALLS {
        let t = Instant::now();
        send.write_all(&ping).await?;
        let mut b = [0u8; 8];
        recv.read_exact(&mut b).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    r.rtt_p50_us = percentile(&mut samples, 0.5);
    r.rtt_p99_us = percentile(&mut samples, 0.99);
    pc.connection.close(0u32.into(), b"done");
    Ok(r)
}

async fn receiver_raw(listen: SocketAddr, certs: PathBuf) -> anyhow::Result<()> {
    use flotilla_transport::{Endpoint, Identity, Tuning};
    let ep = Endpoint::bind(
        listen,
        Identity::load(&certs, "receiver")?,
        &Tuning::default(),
    )?;
    let pc = ep.accept().await.context("no connection")?;
    let (mut send, mut recv) = pc.connection.accept_bi().await?;
    let mut received = 0u64;
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let mut len = [0u8; 4];
        if recv.read_exact(&mut len).await.is_err() {
            return Ok(());
        }
        let len = u32::from_be_bytes(len) as usize;
        if len == 0 {
            send.write_all(&received.to_be_bytes()).await?;
            continue;
        }
        recv.read_exact(&mut buf[..len]).await?;
        if len == 8 && buf[0] == 0xEE {
            send.write_all(&buf[..8]).await?;
        } else {
            received += 1;
        }
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn run_sender(mode: &str, certs: &Path) -> anyhow::Result<Results> {
    let out = Command::new(exe()?)
        .args([
            "--role",
            &format!("{mode}-sender"),
            "--certs",
            &certs.to_string_lossy(),
        ])
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(out.status.success(), "{mode} sender failed");
    let text = String::from_utf8(out.stdout)?;
    Ok(serde_json::from_str(
        text.lines().last().context("no result")?,
    )?)
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    if let Some(role) = arg("--role") {
        let certs: PathBuf = arg("--certs").unwrap_or_default().into();
        return rt.block_on(async {
            let result = match role.as_str() {
                "quic-sender" => sender_quic(&certs).await?,
                "tcp-sender" => sender_tcp().await?,
                "raw-sender" => sender_raw(&certs).await?,
                "quic-receiver" => {
                    return receiver_quic(arg("--head").context("--head")?.parse()?, certs).await;
                }
                "tcp-receiver" => {
                    return receiver_tcp(arg("--port").context("--port")?.parse()?).await;
                }
                "raw-receiver" => {
                    return receiver_raw(arg("--listen").context("--listen")?.parse()?, certs)
                        .await;
                }
                other => anyhow::bail!("unknown role {other}"),
            };
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        });
    }

    let certs =
        std::env::temp_dir().join(format!("flotilla-bench-transport-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&certs);
    // The sender runs the head; the receiver joins it.
    flotilla_transport::certs::init_ca(&certs, "bench", "sender")?;
    flotilla_testkit::ca::issue_role(&certs, "receiver", flotilla_proto::role::Role::Worker)?;
    // Rounds alternate the transports, so that a slow spell of a shared
    // machine falls on all three; each figure is the median of its rounds.
    let rounds: usize = arg("--rounds").map_or(Ok(3), |r| r.parse())?;
    anyhow::ensure!(rounds > 0, "--rounds must be at least 1");
    let (mut quics, mut tcps, mut raws) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        quics.push(run_sender("quic", &certs)?);
        tcps.push(run_sender("tcp", &certs)?);
        raws.push(run_sender("raw", &certs)?);
    }
    let _ = std::fs::remove_dir_all(&certs);
    let median_of = |runs: &[Results], field: fn(&Results) -> f64| {
        flotilla_benches::median(&mut runs.iter().map(field).collect::<Vec<_>>())
    };

    println!("medians of {rounds} rounds (transports alternating)");
    println!(
        "{:<40} {:>14} {:>16} {:>14} {:>12} {:>12}",
        "measure", "flotilla QUIC", "ractor over TCP", "raw quinn", "QUIC / TCP", "QUIC / raw"
    );
    let row = |name: &str, field: fn(&Results) -> f64, unit: &str| {
        let (q, t, r) = (
            median_of(&quics, field),
            median_of(&tcps, field),
            median_of(&raws, field),
        );
        let vs_raw = if r > 0.0 {
            format!("{:>11.2}x", q / r)
        } else {
            format!("{:>12}", "-")
        };
        println!(
            "{name:<40} {q:>14.1} {t:>16.1} {r:>14.1} {:>11.2}x {vs_raw}   {unit}",
            q / t
        );
    };
    row("cast 8 B", |r| r.tiny_per_s, "msgs/s");
    row("cast 64 KiB", |r| r.kib64_per_s, "msgs/s");
    row("cast 4 MiB", |r| r.mib4_per_s, "msgs/s");
    row("cast 4 MiB throughput", |r| r.mib4_per_s * 4.0, "MiB/s");
    row(
        "cast 4 MiB Sealed throughput",
        |r| r.mib4_sealed_per_s * 4.0,
        "MiB/s",
    );
    row("call 8 B p50", |r| r.rtt_p50_us, "µs");
    row("call 8 B p99", |r| r.rtt_p99_us, "µs");
    row(
        "sender RSS before the 256 MiB cast",
        |r| r.rss_before_mib,
        "MiB",
    );
    row("sender peak RSS, 256 MiB cast", |r| r.rss_256mib_mib, "MiB");
    row(
        "8 B calls back to back, no bulk, median",
        |r| r.b2b_idle_ms * 1e3,
        "µs",
    );
    row(
        "8 B calls back to back during 256 MiB, median",
        |r| r.b2b_bulk_ms * 1e3,
        "µs",
    );
    row(
        "8 B call 5 ms apart, no bulk, median",
        |r| r.spaced_idle_ms * 1e3,
        "µs",
    );
    row(
        "8 B call during a 256 MiB cast, median",
        |r| r.behind_bulk_ms * 1e3,
        "µs",
    );
    row(
        "8 B call during a 256 MiB cast, max",
        |r| r.behind_bulk_max_ms,
        "ms",
    );
    let ratio = |field: fn(&Results) -> f64| {
        let mut each: Vec<f64> = quics
            .iter()
            .zip(&raws)
            .map(|(q, r)| field(q) / field(r))
            .collect();
        let (lo, hi) = each
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        (flotilla_benches::median(&mut each), lo, hi)
    };
    for (what, field) in [
        ("owned", (|r: &Results| r.mib4_per_s) as fn(&Results) -> f64),
        ("Sealed", |r: &Results| r.mib4_sealed_per_s),
    ] {
        let (bulk, lo, hi) = ratio(field);
        println!(
            "4 MiB casts ({what} payload) against raw quinn, same round: median {bulk:.2}x, range {lo:.2}x-{hi:.2}x over {rounds} rounds (target >= 0.7x)"
        );
    }
    let med = |field: fn(&Results) -> f64| median_of(&quics, field);
    println!(
        "call p50 vs raw quinn round trip: {:.2}x (target ≤ 2x); calls during a 256 MiB cast against the same calls without it (target ≤ 2x): back to back {:.2}x ({} calls), 5 ms apart {:.2}x ({} calls; {} over TCP)",
        ratio(|r| r.rtt_p50_us).0,
        med(|r| r.b2b_bulk_ms) / med(|r| r.b2b_idle_ms),
        med(|r| r.b2b_bulk_calls as f64),
        med(|r| r.behind_bulk_ms) / med(|r| r.spaced_idle_ms),
        med(|r| r.behind_bulk_calls as f64),
        median_of(&tcps, |r| r.behind_bulk_calls as f64),
    );
    Ok(())
}
