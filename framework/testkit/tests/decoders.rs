//! Every decoder a peer reaches, fed the real types' bytes mutated at
//! random: hellos, control requests (joins, heartbeats, spawn orders,
//! placement, ledger and jobs requests), the replies a client decodes
//! (member tables, spawn, placement and jobs answers), bulk headers,
//! object requests and the frames around them (whole, and arriving in
//! pieces), and the arguments and messages of the kinds a
//! node registers (what a spawn order and a remote cast carry). None may panic, and none may allocate more than
//! its bound: a constant plus a small multiple of the bytes it was given,
//! whatever lengths the bytes claim.
//!
//! The allocator of this test binary counts, per thread, the bytes alive
//! and their peak while a decode runs ([`flotilla_objects::meter`]). Case
//! counts are fixed, so CI runs the same amount of fuzzing every time.

use std::collections::BTreeMap;

use flotilla_proto::bulk::BulkHeader;
use flotilla_proto::control::{ControlReply, ControlRequest, PlacementRequest, SpawnOrder};
use flotilla_proto::groups::GroupSpec;
use flotilla_proto::hello::{Hello, HelloReply, Purpose, Refusal};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::jobs::{JobSpec, JobsRequest};
use flotilla_proto::ledger::{GroupRecord, Held, LedgerOp};
use flotilla_proto::membership::JoinRequest;
use flotilla_proto::objects::{ObjectKey, ObjectRequest, PullRequest, ReleaseReply};
use flotilla_proto::resources::Resources;
use flotilla_proto::wire::{self, Decode, Encode};
use proptest::prelude::*;

#[global_allocator]
static ALLOCATOR: flotilla_objects::meter::Metered = flotilla_objects::meter::Metered::system();

/// Bytes allocated at the peak of `f` beyond what was alive before it.
fn peak_of<R>(f: impl FnOnce() -> R) -> (R, usize) {
    flotilla_objects::meter::peak_during(f)
}

/// What decoding `len` bytes may allocate at most: the aligned copy of the
/// input, the owned values (strings, vectors, maps) it deserializes into,
/// and a constant.
fn bound(len: usize) -> usize {
    64 * 1024 + 32 * len
}

/// Decodes mutated `bytes` as `T`: never a panic, never past the bound.
fn decodes_within_bound<T: Decode>(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (decoded, peak) = peak_of(|| std::panic::catch_unwind(|| wire::decode::<T>(bytes)));
    prop_assert!(
        decoded.is_ok(),
        "decoding {} panicked",
        std::any::type_name::<T>()
    );
    prop_assert!(
        peak <= bound(bytes.len()),
        "decoding {} bytes as {} allocated {peak} bytes",
        bytes.len(),
        std::any::type_name::<T>()
    );
    Ok(())
}

/// One way to spoil an archive.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flip bits of the byte at (position modulo length).
    Flip(usize, u8),
    /// Overwrite 8 bytes from a position with a value (a length or offset
    /// claimed to be huge, or zero).
    Word(usize, u64),
    /// Cut the bytes to (position modulo length).
    Truncate(usize),
    /// Append bytes.
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        3 => (any::<usize>(), prop_oneof![Just(u64::MAX), Just(u64::from(u32::MAX)), Just(0), any::<u64>()])
            .prop_map(|(at, w)| Mutation::Word(at, w)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len().max(1);
        match m {
            Mutation::Flip(at, bits) => {
                if let Some(b) = bytes.get_mut(at % len) {
                    *b ^= bits;
                }
            }
            Mutation::Word(at, w) => {
                let at = at % len;
                for (i, b) in w.to_le_bytes().into_iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = b;
                    }
                }
            }
            Mutation::Truncate(at) => bytes.truncate(at % len),
            Mutation::Extend(more) => bytes.extend_from_slice(more),
        }
    }
    bytes
}

fn resources() -> Resources {
    Resources {
        cpus: 16,
        memory_bytes: 64 << 30,
        gpus: 2,
        labels: [("zone".to_owned(), "eu-west-1a".to_owned())].into(),
        custom: [("ssd".to_owned(), 1.5)].into(),
    }
}

fn record() -> GroupRecord {
    GroupRecord {
        id: "pg1a2b-7".into(),
        revision: 3,
        strategy: "strict-spread".into(),
        bundles: vec![BTreeMap::from([("cpu".to_owned(), 1.0)]); 3],
        nodes: vec!["w1".into(), "w2".into(), MemberName::from(String::new())],
        selector: [("zone".to_owned(), "a".to_owned())].into(),
        owner: Some(flotilla_proto::incarnation::MemberRef::new(
            "admin~00aa",
            Incarnation::new(42),
        )),
        seal: vec![9; 32],
    }
}

/// A value of every variant of every request a peer may send.
fn requests() -> Vec<ControlRequest> {
    let spec = GroupSpec {
        bundles: vec![BTreeMap::from([("gpu".to_owned(), 1.0)]); 4],
        strategy: "spread".into(),
        selector: BTreeMap::new(),
        timeout_ms: 30_000,
        detached: false,
    };
    vec![
        ControlRequest::Join(JoinRequest {
            name: "w1".into(),
            addr: "10.0.0.1:7420".into(),
            bulk_addr: "10.0.0.1:7421".into(),
            host: "boot-id-digest".into(),
            incarnation: Incarnation::new(1_700_000_000_000_000),
            resources: resources(),
            held: vec![Held {
                record: record(),
                bundles: vec![0, 2],
            }],
        }),
        ControlRequest::Heartbeat {
            name: "w1".into(),
            incarnation: Incarnation::new(7),
            actors: 12,
            version: 99,
        },
        ControlRequest::Leave {
            name: "w1".into(),
            incarnation: Incarnation::new(7),
        },
        ControlRequest::Status,
        ControlRequest::Stop {
            name: "flotilla.embed.admin~00aa-1.3".into(),
        },
        ControlRequest::Supervisors,
        ControlRequest::Placement(PlacementRequest::Create { spec }),
        ControlRequest::Placement(PlacementRequest::Remove { id: "pg1-1".into() }),
        ControlRequest::Placement(PlacementRequest::Wait {
            id: "pg1-1".into(),
            after_revision: Some(2),
            timeout_ms: 5_000,
        }),
        ControlRequest::Placement(PlacementRequest::List),
        ControlRequest::Ledger(LedgerOp::Prepare {
            record: record(),
            bundles: vec![1],
        }),
        ControlRequest::Ledger(LedgerOp::Release {
            group: "pg1-1".into(),
            bundles: Vec::new(),
        }),
        ControlRequest::Jobs(JobsRequest::Submit(JobSpec {
            kind: "flotilla.embed.job".into(),
            args: vec![0xab; 300],
            message_type: "flotilla::jobs::JobMsg".into(),
            resources: BTreeMap::from([("memory_mb".to_owned(), 256.0)]),
            description: "embed /data/in -> /data/out".into(),
            max_restarts: 3,
        })),
        ControlRequest::Jobs(JobsRequest::Stop("job-1-1".into())),
        ControlRequest::Objects,
        ControlRequest::Gpus,
        ControlRequest::Heard,
        ControlRequest::Spawn(SpawnOrder {
            kind: "flotilla.echo".into(),
            name: "echo-1".into(),
            args: wire::encode(&resources()),
            message_type: "flotilla_testkit::probe::EchoMsg".into(),
            epoch: flotilla_proto::epoch::Epoch::from_micros(1_700_000_000_000_000),
        }),
        ControlRequest::Drain {
            name: "w1".into(),
            within_ms: 30_000,
        },
    ]
}

fn hellos() -> Vec<Hello> {
    [
        Purpose::Cluster,
        Purpose::Control,
        Purpose::Bulk,
        Purpose::Pull,
    ]
    .into_iter()
    .map(|p| {
        Hello::new(
            p,
            "admin~0123456789abcdef",
            Incarnation::new(1_700_000_000_000_000),
            [7; 32],
        )
    })
    .collect()
}

fn object_requests() -> Vec<ObjectRequest> {
    vec![
        ObjectRequest::Pull(PullRequest {
            scope: 0xdead_beef,
            pid: 4242,
            seq: 0xab_0000_0001,
            size: 4 << 20,
            checksum: 0x1234,
            token: 0x5678,
        }),
        ObjectRequest::Release(vec![
            ObjectKey {
                scope: 1,
                pid: 2,
                seq: 3,
            };
            32
        ]),
    ]
}

/// The replies a client decodes: member tables and their changes, spawn,
/// stop and status answers, placement and jobs replies, refusals.
fn replies() -> Vec<ControlReply> {
    use flotilla_proto::authority::Unauthorized;
    use flotilla_proto::control::{PlacementReply, SpawnReply};
    use flotilla_proto::groups::{GroupState, GroupView};
    use flotilla_proto::incarnation::Incarnation;
    use flotilla_proto::jobs::{JobRecord, JobsReply};
    use flotilla_proto::membership::{MemberState, MemberView};
    let member = MemberView {
        name: "w1".into(),
        addr: "10.0.0.1:7420".into(),
        bulk_addr: "10.0.0.1:7421".into(),
        host: "boot-id-digest".into(),
        incarnation: Incarnation::new(1_700_000_000_000_000),
        state: MemberState::Up,
        resources: resources(),
        actors: 3,
        role: flotilla_proto::role::Role::Worker,
        drain_within_ms: 0,
    };
    let group = GroupView {
        id: "pg-1".into(),
        state: GroupState::Ready,
        revision: 4,
        strategy: "spread".into(),
        bundles: vec![BTreeMap::from([("cpu".to_owned(), 1.0)]); 3],
        nodes: vec!["w1".into(), "w2".into(), "w3".into()],
        owner: Some("alice~3f09".into()),
        why: None,
    };
    let job = JobRecord::new("job-1", "embed /data -> s3://out", Some("alice".into()))
        .view(Some(group.clone()), vec![group.clone()]);
    vec![
        ControlReply::Members {
            version: 9,
            head: "head".into(),
            members: vec![member.clone(); 8],
            revoked: vec![vec![1, 2, 3]],
            more: true,
        },
        ControlReply::Changes {
            since: 8,
            version: 9,
            head: "head".into(),
            changed: vec![member],
            removed: vec!["w9".into()],
            revoked: Some(vec![vec![4, 5]]),
            more: false,
        },
        ControlReply::Spawned(SpawnReply::Spawned),
        ControlReply::Denied(Unauthorized::HeadOnlyKind),
        ControlReply::Placement(PlacementReply::Group(Some(group.clone()))),
        ControlReply::Placement(PlacementReply::Groups {
            groups: vec![group; 4],
            nodes: Vec::new(),
        }),
        ControlReply::Jobs(JobsReply::Jobs(vec![job.clone(); 4])),
        ControlReply::Jobs(JobsReply::Job(Some(Box::new(job)))),
    ]
}

/// The bytes of every value, each with the decoder it meets.
type Case = (Vec<u8>, fn(&[u8]) -> Result<(), TestCaseError>);

fn cases() -> Vec<Case> {
    fn of<T: Encode + Decode>(v: &T) -> Case {
        (wire::encode(v), decodes_within_bound::<T>)
    }
    let mut out: Vec<Case> = Vec::new();
    out.extend(hellos().iter().map(of));
    out.extend(requests().iter().map(of));
    out.extend(object_requests().iter().map(of));
    out.push(of(&BulkHeader {
        pid: 17,
        variant: "Embed".into(),
    }));
    out.push(of(&HelloReply::Refused(Refusal::Revoked)));
    out.push(of(&ControlReply::Ack));
    // What a client decodes: the replies a head or a node sends back.
    out.extend(replies().iter().map(of));
    out.push(of(&ReleaseReply {
        released: 3,
        refused: Vec::new(),
    }));
    // What spawn orders and casts carry to registered kinds.
    out.push(of(&flotilla_testkit::probe::TickerArgs {
        checkpoint: "s3://bucket/ckpt".into(),
        tick_ms: 20,
        every: 10,
        start: flotilla::checkpoint::Start::new(
            "head",
            flotilla::checkpoint::Epoch::from_micros(1_700_000_000_000_000),
        ),
    }));
    out.push(of(&flotilla_testkit::probe::LendRequest {
        bytes: vec![1; 200],
        borrower: "admin~00aa".into(),
    }));
    out.push(of(&flotilla_embed::actor::EmbedderArgs::new(
        "/srv/models/all-MiniLM-L6-v2",
    )));
    out.push(of(&flotilla_embed::actor::EmbedRequest::new(
        7,
        vec!["a text".into(); 32],
    )));
    out.push(of(&flotilla_embed::job::detached::submission(
        &flotilla_embed::job::JobConfig::new("/data/in/*.jsonl", "s3://out/run1", "/srv/model"),
    )));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Mutated archives of every type a peer sends: decoded or refused,
    /// never a panic, never an allocation past the bound.
    #[test]
    fn mutated_archives_never_panic_nor_allocate_past_their_bound(
        which in any::<usize>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let all = cases();
        let (bytes, decode) = &all[which % all.len()];
        let spoiled = mutate(bytes.clone(), &mutations);
        decode(&spoiled)?;
    }

    /// Bytes that were never an archive, of any length.
    #[test]
    fn random_bytes_never_panic_nor_allocate_past_their_bound(
        which in any::<usize>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let all = cases();
        let (_, decode) = &all[which % all.len()];
        decode(&bytes)?;
    }

    /// A frame's length prefix is checked before anything is allocated:
    /// whatever the prefix claims, reading a frame allocates at most the
    /// bytes present.
    #[test]
    fn frame_prefixes_never_allocate_what_they_claim(
        claimed in prop_oneof![Just(u32::MAX), Just(flotilla_proto::frame::DEFAULT_MAX_FRAME + 1), any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = claimed.to_be_bytes().to_vec();
        bytes.extend_from_slice(&body);
        let (result, peak) = peak_of(|| {
            flotilla_proto::frame::decode(&bytes, flotilla_proto::frame::DEFAULT_MAX_FRAME)
                .map(|f| f.map(|(payload, used)| (payload.len(), used)))
        });
        prop_assert!(peak <= 1024, "{peak} bytes for a frame of {}", bytes.len());
        if claimed > flotilla_proto::frame::DEFAULT_MAX_FRAME {
            prop_assert!(result.is_err());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The frame-reading path as a stream delivers bytes: a real framed
    /// message (and a mutated one) fed in pieces of any sizes reads as
    /// nothing until whole, then as exactly the message, and never
    /// allocates more than the bytes present nor panics; the nodes' own
    /// reader, fed the same pieces, reads it whole.
    #[test]
    fn frames_arriving_in_pieces_read_whole_or_not_at_all(
        which in any::<usize>(),
        cuts in proptest::collection::vec(1usize..64, 1..40),
        spoil in any::<bool>(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let all = cases();
        let (payload, _) = &all[which % all.len()];
        let payload = if spoil { mutate(payload.clone(), &mutations) } else { payload.clone() };
        let max = flotilla_proto::frame::DEFAULT_MAX_FRAME;
        let mut framed = (payload.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&payload);
        // The nodes' own reader, fed the same pieces, reads it whole.
        let (read, _) = read_in_pieces(framed.clone(), cuts.clone(), max);
        prop_assert_eq!(read, Ok(Some(payload.clone())));
        let mut got = Vec::new();
        let mut at = 0;
        let mut cuts = cuts.into_iter().cycle();
        while at < framed.len() {
            at = (at + cuts.next().unwrap_or(1)).min(framed.len());
            got.truncate(0);
            got.extend_from_slice(&framed[..at]);
            let (read, peak) = peak_of(|| {
                std::panic::catch_unwind(|| {
                    flotilla_proto::frame::decode(&got, max)
                        .map(|f| f.map(|(body, used)| (body.to_vec(), used)))
                })
            });
            prop_assert!(read.is_ok(), "reading a frame panicked");
            prop_assert!(peak <= 1024 + 2 * got.len(), "{peak} bytes for {} present", got.len());
            match read.unwrap() {
                Ok(Some((body, used))) => {
                    prop_assert_eq!(at, framed.len(), "whole only once every byte is there");
                    prop_assert_eq!(&body, &payload);
                    prop_assert_eq!(used, framed.len());
                }
                Ok(None) => prop_assert!(at < framed.len()),
                Err(e) => prop_assert!(false, "a frame under the limit refused: {e}"),
            }
        }
    }
}

/// A stream that hands over `bytes` in pieces of the sizes in `cuts`
/// (never more than asked), as QUIC hands over a stream.
struct Pieces {
    bytes: Vec<u8>,
    at: usize,
    cuts: Vec<usize>,
    next: usize,
}

impl flotilla_transport::handshake::FrameSource for Pieces {
    type Error = std::convert::Infallible;

    async fn read_chunk(&mut self, max: usize) -> Result<Option<bytes::Bytes>, Self::Error> {
        if self.at == self.bytes.len() {
            return Ok(None);
        }
        let cut = self.cuts[self.next % self.cuts.len()];
        self.next += 1;
        let n = cut.min(max).min(self.bytes.len() - self.at);
        let chunk = bytes::Bytes::copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(Some(chunk))
    }
}

/// Reads one frame of `bytes`, delivered in pieces of `cuts`, through the
/// nodes' frame reader; what it allocated at its peak.
fn read_in_pieces(
    bytes: Vec<u8>,
    cuts: Vec<usize>,
    max: u32,
) -> (Result<Option<Vec<u8>>, String>, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut source = Pieces {
        bytes,
        at: 0,
        cuts,
        next: 0,
    };
    peak_of(|| {
        rt.block_on(flotilla_transport::handshake::read_frame(&mut source, max))
            .map_err(|e| e.to_string())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The nodes' own frame reader, fed a stream in pieces, on the bulk
    /// lane's limit: whatever the prefix claims, it holds no more than
    /// what arrived (a peer announcing 256 MiB and sending 100 bytes
    /// costs 100 bytes), and a frame cut short is an error, not a wait.
    #[test]
    fn the_frame_reader_allocates_with_the_bytes_that_arrive_not_what_the_prefix_claims(
        claimed in prop_oneof![Just(flotilla_proto::bulk::MAX_BULK_PAYLOAD), Just(u32::MAX), any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..4096),
        cuts in proptest::collection::vec(1usize..1024, 1..16),
    ) {
        let max = flotilla_proto::bulk::MAX_BULK_PAYLOAD;
        let mut bytes = claimed.to_be_bytes().to_vec();
        bytes.extend_from_slice(&body);
        let present = bytes.len();
        let (read, peak) = read_in_pieces(bytes, cuts, max);
        prop_assert!(peak <= 64 * 1024 + 4 * present, "{peak} bytes held for {present} received");
        match read {
            Ok(Some(payload)) => prop_assert_eq!(payload, body),
            Ok(None) => prop_assert!(false, "a prefix was sent"),
            Err(e) if claimed > max => prop_assert!(e.contains("exceeds"), "{e}"),
            Err(e) => prop_assert!(e.contains("ended"), "{e}"),
        }
    }
}

/// Every value, unspoiled, reads back as itself: the cases above start
/// from real archives.
#[test]
fn every_case_round_trips() {
    for r in requests() {
        assert_eq!(
            wire::decode::<ControlRequest>(&wire::encode(&r)).unwrap(),
            r
        );
    }
    for h in hellos() {
        assert_eq!(wire::decode::<Hello>(&wire::encode(&h)).unwrap(), h);
    }
    for o in object_requests() {
        assert_eq!(wire::decode::<ObjectRequest>(&wire::encode(&o)).unwrap(), o);
    }
    for r in replies() {
        assert_eq!(wire::decode::<ControlReply>(&wire::encode(&r)).unwrap(), r);
    }
}

/// The counting allocator sees what a decode allocates: a request holding
/// a 64 KiB argument archive allocates at least that much.
#[test]
fn the_allocator_counts_what_a_decode_allocates() {
    let big = ControlRequest::Spawn(SpawnOrder {
        kind: "k".into(),
        name: "n".into(),
        args: vec![1; 64 << 10],
        message_type: "m".into(),
        epoch: flotilla_proto::epoch::Epoch::NONE,
    });
    let bytes = wire::encode(&big);
    let (decoded, peak) = peak_of(|| wire::decode::<ControlRequest>(&bytes));
    assert!(decoded.is_ok());
    assert!(peak >= 64 << 10, "{peak}");
    assert!(peak <= bound(bytes.len()), "{peak}");
}
