//! A cluster people can share: identities, roles and authority, checked on
//! real `node` processes on loopback (the `test-node` binary: the `node`
//! command with the probe actors of `flotilla_testkit::probe`).
//!
//! Each test names the clause of docs/runtime-semantics.md it checks.

use std::process::Command;
use std::time::{Duration, Instant};

use flotilla::Incarnation;
use flotilla::jobs::{JobSpec, JobsReply, JobsRequest};
use flotilla_proto::authority::Unauthorized;
use flotilla_proto::control::{ControlReply, ControlRequest, PlacementRequest, SpawnOrder};
use flotilla_proto::hello::{Hello, Purpose, Refusal};
use flotilla_proto::ledger::LedgerOp;
use flotilla_testkit::cluster::*;
use flotilla_testkit::probe::{
    FLOODER, FloodArgs, FloodGroup, FlooderMsg, LENDER, LendRequest, LenderMsg, Lent, NoArgs,
};

const NODE: &str = env!("CARGO_BIN_EXE_test-node");

fn identity(s: &Scratch, name: &str) -> flotilla_transport::Identity {
    flotilla_transport::Identity::load(&s.certs(), name).unwrap()
}

/// A node of this process joined to `head` with the certificate `name`.
async fn join(s: &Scratch, name: &str, head: std::net::SocketAddr) -> flotilla::Node {
    let mut config = flotilla::NodeConfig::new(name, free_addr(), s.certs()).join(head);
    config.resources = Some(flotilla::Resources::default());
    flotilla::Node::builder(config).start().await.unwrap()
}

/// The value of a counter on `metrics`, waiting up to 5 s for it to reach
/// `at_least`.
fn counted(metrics: std::net::SocketAddr, series: &str, at_least: u64) -> u64 {
    eventually(Duration::from_secs(5), || {
        scrape(metrics)
            .map(|m| counter(&m, series))
            .filter(|n| *n >= at_least)
    })
    .0
}

fn authority(service: &str, reason: &str) -> String {
    format!("flotilla_authority_refused_total{{service=\"{service}\",reason=\"{reason}\"}}")
}

fn denied(reply: Result<ControlReply, flotilla::status::StatusError>) -> Unauthorized {
    match reply {
        Err(flotilla::status::StatusError::Denied { why, .. }) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Clause "identity: one live process per worker name": a second live
/// `node join` under a worker's name is refused with a typed error naming
/// the first, and counted on the head's `/metrics`; the first keeps
/// working; once the first is killed, a restart
/// under the name rejoins as a newer incarnation.
#[test]
fn a_second_live_worker_under_a_taken_name_is_refused_and_the_first_keeps_working() {
    let s = Scratch::new("dup-name", NODE);
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    s.issue("w1");
    let mut workers = vec![s.spawn("join", "w1", free_addr(), Some(head.addr), &s.certs())];
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    let first = incarnation_of(&s.status(head.addr).unwrap(), "w1").unwrap();
    // The second process has w1's certificate but a log of its own.
    let log = s.dir.join("w1-second.log");
    let mut second = Command::new(NODE)
        .args(["join", "--name", "w1", "--listen", &free_addr().to_string()])
        .args(["--head", &head.addr.to_string()])
        .args(["--certs", s.certs().to_str().unwrap()])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let (status, took) = eventually(Duration::from_secs(20), || second.try_wait().unwrap());
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(3), "{said}");
    assert!(
        said.contains("NODE-JOIN-009") && said.contains(&format!("incarnation {first}")),
        "{said}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    // Counted on the head like every other refusal.
    let series = "flotilla_membership_refused_total{request=\"join\",reason=\"name_taken\"}";
    assert!(counted(metrics, series, 1) >= 1);
    // The first never stopped being w1.
    let st = s.status(head.addr).unwrap();
    assert_eq!(incarnation_of(&st, "w1"), Some(first));
    assert_eq!(state_of(&st, "w1").as_deref(), Some("up"));
    // A crash and a restart is not a duplicate.
    let w1 = workers.pop().unwrap();
    w1.signal("-KILL");
    drop(w1);
    let _again = s.spawn("join", "w1", free_addr(), Some(head.addr), &s.certs());
    let (newer, took) = eventually(Duration::from_secs(15), || {
        let st = s.status(head.addr)?;
        let i = incarnation_of(&st, "w1")?;
        (i > first && state_of(&st, "w1").as_deref() == Some("up")).then_some(i)
    });
    assert!(newer > first);
    assert!(took < Duration::from_secs(10), "restarted in {took:?}");
}

/// Clauses "security: authority" and "security: roles": each service
/// refuses what the permission table does not allow, with a typed error to
/// the caller and a counter labelled by service and reason on the node
/// that refused: a worker's certificate submitting a job, a driver stopping
/// another's job, a worker removing another's group, a member releasing an
/// object lent to another or pulling one without its token, and a
/// certificate that never joined asking for spawns, stops, reservation
/// changes and cluster, bulk and pull streams. An observer reads.
#[test]
fn every_service_refuses_what_the_permission_table_does_not_allow_and_counts_it() {
    let s = Scratch::new("authority", NODE);
    let (head, head_metrics) = s.spawn_metered("head", "head", None, &[]);
    let (w2, w2_metrics) = s.spawn_metered("join", "w2", Some(head.addr), &[]);
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w2"]))
    });
    s.issue_role("d1", "driver");
    s.issue_role("d2", "driver");
    s.issue_role("obs", "observer");
    s.issue("ghost");
    let spec = JobSpec {
        kind: "flotilla.nothing".into(),
        args: Vec::new(),
        message_type: "none".into(),
        resources: [("memory_mb".to_owned(), 1.0)].into_iter().collect(),
        description: "a job that never starts".into(),
        // Still trying when it is stopped.
        max_restarts: 1000,
    };
    runtime().block_on(async {
        // A worker's certificate submits a job: refused.
        let asked = flotilla::query(
            head.addr,
            identity(&s, "ghost"),
            ControlRequest::Jobs(JobsRequest::Submit(spec.clone())),
        )
        .await;
        assert_eq!(denied(asked), Unauthorized::Role);
        counted(head_metrics, &authority("jobs", "role"), 1);
        // So is an observer's; it lists jobs.
        let asked = flotilla::query(
            head.addr,
            identity(&s, "obs"),
            ControlRequest::Jobs(JobsRequest::Submit(spec.clone())),
        )
        .await;
        assert_eq!(denied(asked), Unauthorized::Role);
        let listed = flotilla::query_jobs(head.addr, identity(&s, "obs"), JobsRequest::List).await;
        assert!(matches!(listed, Ok(JobsReply::Jobs(_))), "{listed:?}");

        // d1 submits a job; d2 may not stop it, an admin may.
        let d1 = join(&s, "d1", head.addr).await;
        let job = d1.submit_job(spec.clone()).await.unwrap();
        let asked = flotilla::query(
            head.addr,
            identity(&s, "d2"),
            ControlRequest::Jobs(JobsRequest::Stop(job.clone())),
        )
        .await;
        assert_eq!(denied(asked), Unauthorized::NotJobOwner);
        counted(head_metrics, &authority("jobs", "not_job_owner"), 1);
        let stopped =
            flotilla::query_jobs(head.addr, identity(&s, "admin"), JobsRequest::Stop(job)).await;
        assert!(
            matches!(stopped, Ok(JobsReply::Stopped(true))),
            "{stopped:?}"
        );

        // d1's group: a worker's certificate may not remove it, nor create
        // one without joining.
        let group = d1
            .create_group(flotilla::placement_groups::GroupSpec::new(
                flotilla::placement_groups::Strategy::Pack,
                vec![flotilla::placement_groups::bundle(&[("cpu", 0.1)])],
            ))
            .await
            .unwrap();
        let asked = flotilla::query(
            head.addr,
            identity(&s, "ghost"),
            ControlRequest::Placement(PlacementRequest::Remove { id: group.clone() }),
        )
        .await;
        assert_eq!(denied(asked), Unauthorized::NotGroupOwner);
        counted(head_metrics, &authority("placement", "not_group_owner"), 1);
        let asked = flotilla::query(
            head.addr,
            identity(&s, "ghost"),
            ControlRequest::Placement(PlacementRequest::Create {
                spec: flotilla::placement_groups::GroupSpec::new(
                    flotilla::placement_groups::Strategy::Pack,
                    vec![flotilla::placement_groups::bundle(&[("cpu", 0.1)])],
                ),
            }),
        )
        .await;
        assert_eq!(denied(asked), Unauthorized::NotMember);
        assert!(
            d1.remove_group(&group).await.unwrap(),
            "its owner removes it"
        );

        // An object on w2 lent to d1: d2 may not release it, nor pull it
        // without its token; d1 releases it.
        let lender: flotilla::ractor::ActorRef<LenderMsg> = d1
            .spawn_on("w2", LENDER.named("lender"), &NoArgs, Duration::from_secs(15))
            .await
            .unwrap();
        let Lent(lent) = flotilla::call::call(
            &lender,
            |port| {
                LenderMsg::Lend(
                    LendRequest {
                        bytes: vec![7; 4096],
                        borrower: d1.name().to_string(),
                    },
                    port,
                )
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let reference = flotilla::ObjectRef::from_token(&lent.unwrap()).unwrap();
        let mut config = flotilla::NodeConfig::new("d2", free_addr(), s.certs()).join(head.addr);
        config.resources = Some(flotilla::Resources::default());
        config.host_id = Some("another-host".into());
        let d2 = flotilla::Node::builder(config).start().await.unwrap();
        d2.wait_members(Duration::from_secs(10), |t| t.get("w2").is_some())
            .await
            .unwrap();
        let released = d2.objects().release(&reference).await;
        assert!(
            matches!(released, Err(flotilla::ObjectsError::NotBorrower { .. })),
            "{released:?}"
        );
        counted(w2_metrics, &authority("objects", "not_borrower"), 1);
        let mut guessed = reference.clone();
        guessed.token ^= 1;
        assert!(d2.objects().get(&guessed).await.is_err());
        counted(w2_metrics, &authority("objects", "bad_token"), 1);
        let pulled = d2.objects().get(&reference).await.unwrap();
        assert_eq!(
            pulled.as_bytes(),
            &[7; 4096][..],
            "with its token it is pulled"
        );
        d1.objects().release(&reference).await.unwrap();

        // A certificate that never joined.
        let ghost = || identity(&s, "ghost");
        let order = SpawnOrder {
            kind: flotilla_testkit::probe::ECHO.name().into(),
            name: "ghost-echo".into(),
            args: flotilla::wire::encode(&NoArgs),
            message_type: std::any::type_name::<flotilla_testkit::probe::EchoMsg>().into(),
            epoch: flotilla_proto::epoch::Epoch::NONE,
        };
        let asked = flotilla::query(w2.addr, ghost(), ControlRequest::Spawn(order.clone())).await;
        assert_eq!(denied(asked), Unauthorized::NotMember);
        counted(w2_metrics, &authority("spawn", "not_member"), 1);
        // d1's name under an incarnation other than the one up: an older
        // one is refused at the hello; one the table does not hold (made
        // up) opens a stream but spawns nothing.
        eventually(Duration::from_secs(10), || {
            incarnation_of(&s.status(w2.addr)?, d1.name()).filter(|i| *i == d1.incarnation())
        });
        let d1_id = || identity(&s, "d1");
        let cookie = flotilla_transport::certs::cookie_digest(d1_id().cookie.as_deref().unwrap());
        let ep = flotilla_transport::Endpoint::client(d1_id(), &flotilla_transport::Tuning::default())
            .unwrap();
        let older = Hello::new(Purpose::Control, d1.name(), Incarnation::new(d1.incarnation().get() - 1), cookie);
        let pc = ep.connect(w2.addr, None).await.unwrap();
        let answered = flotilla_transport::handshake::dial(&pc.connection, &older).await;
        assert!(
            matches!(
                answered,
                Err(flotilla_transport::StreamError::Refused(Refusal::OldIncarnation))
            ),
            "{answered:?}"
        );
        let made_up = Hello::new(Purpose::Control, d1.name(), Incarnation::new(d1.incarnation().get() + 1_000_000), cookie);
        let pc = ep.connect(w2.addr, None).await.unwrap();
        let (mut send, mut recv, _, _) = flotilla_transport::handshake::dial(&pc.connection, &made_up)
            .await
            .unwrap();
        let max = flotilla_proto::frame::DEFAULT_MAX_FRAME;
        flotilla_transport::handshake::send_msg(&mut send, &ControlRequest::Spawn(order), max)
            .await
            .unwrap();
        let reply: ControlReply = flotilla_transport::handshake::recv_msg(&mut recv, max)
            .await
            .unwrap();
        assert_eq!(reply, ControlReply::Denied(Unauthorized::NotMember));
        counted(w2_metrics, &authority("spawn", "not_member"), 2);
        let asked = flotilla::query(
            w2.addr,
            ghost(),
            ControlRequest::Stop {
                name: "lender".into(),
            },
        )
        .await;
        assert!(
            matches!(
                asked,
                Ok(ControlReply::Stop(
                    flotilla_proto::control::StopOutcome::NotOwner
                ))
            ),
            "{asked:?}"
        );
        counted(w2_metrics, &authority("stop", "not_actor_owner"), 1);
        let asked = flotilla::query(
            w2.addr,
            ghost(),
            ControlRequest::Ledger(LedgerOp::Release {
                group: "pg-x".into(),
                bundles: Vec::new(),
            }),
        )
        .await;
        assert_eq!(denied(asked), Unauthorized::NotHead);
        counted(w2_metrics, &authority("ledger", "not_head"), 1);
        // Heartbeats and leaves in another member's name: refused and
        // counted on the head like joins; the member stays up.
        let w2_incarnation = incarnation_of(&s.status(head.addr).unwrap(), "w2").unwrap();
        for (asked, request) in [
            (
                "heartbeat",
                ControlRequest::Heartbeat {
                    name: "w2".into(),
                    incarnation: w2_incarnation,
                    actors: 0,
                    version: 0,
                },
            ),
            (
                "leave",
                ControlRequest::Leave {
                    name: "w2".into(),
                    incarnation: w2_incarnation,
                },
            ),
        ] {
            let reply = flotilla::query(head.addr, ghost(), request).await;
            assert!(
                matches!(reply, Ok(ControlReply::Refused(Refusal::IdentityMismatch))),
                "{asked}: {reply:?}"
            );
            let series = format!(
                "flotilla_membership_refused_total{{request=\"{asked}\",reason=\"identity_mismatch\"}}"
            );
            counted(head_metrics, &series, 1);
        }
        // A worker's certificate drains only that worker, a driver's none.
        for who in ["ghost", "d2"] {
            let asked = flotilla::query(
                head.addr,
                identity(&s, who),
                ControlRequest::Drain {
                    name: "w2".into(),
                    within_ms: 1_000,
                },
            )
            .await;
            assert_eq!(denied(asked), Unauthorized::Drain, "{who}");
        }
        counted(
            head_metrics,
            "flotilla_membership_refused_total{request=\"drain\",reason=\"drain\"}",
            2,
        );
        let st = s.status(head.addr).unwrap();
        assert_eq!(state_of(&st, "w2").as_deref(), Some("up"));
        let asked = flotilla::query_status(w2.addr, ghost()).await;
        assert!(asked.is_ok(), "anyone reads the table: {asked:?}");
        // Cluster, bulk and pull streams are for members.
        let st = s.status(head.addr).unwrap();
        let lane: std::net::SocketAddr = node_of(&st, "w2").unwrap()["bulk_addr"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let id = ghost();
        let cookie = flotilla_transport::certs::cookie_digest(id.cookie.as_deref().unwrap());
        let ep = flotilla_transport::Endpoint::client(id, &flotilla_transport::Tuning::default())
            .unwrap();
        for (addr, purpose) in [
            (w2.addr, Purpose::Cluster),
            (lane, Purpose::Bulk),
            (lane, Purpose::Pull),
        ] {
            let pc = ep.connect(addr, None).await.unwrap();
            let hello = Hello::new(purpose, "ghost", Incarnation::new(1), cookie);
            let answered = flotilla_transport::handshake::dial(&pc.connection, &hello).await;
            assert!(
                matches!(
                    answered,
                    Err(flotilla_transport::StreamError::Refused(Refusal::NotMember))
                ),
                "{purpose:?}: {answered:?}"
            );
        }
        counted(
            w2_metrics,
            "flotilla_hello_refused_total{reason=\"not_member\"}",
            3,
        );
        d2.shutdown().await;
        d1.shutdown().await;
    });
}

/// Clause "jobs: what a job may touch": a node runs a detached job only on
/// paths under the roots it allows; a job naming anything else fails,
/// naming the setting, before anything is opened; a node that allows none
/// runs no detached job.
#[test]
fn a_detached_job_outside_the_allowed_roots_is_refused_before_anything_is_read() {
    let s = Scratch::new("job-roots", NODE);
    let allowed = s.job_root("allowed");
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    let _w1 = s.worker_allowing("w1", head.addr, &allowed);
    // The input is outside the root (and does not exist: had the node
    // opened it, it would say so instead).
    let outside = s.dir.join("secret").join("input.jsonl");
    let output = allowed.join("out");
    let id = s.submit_embed(head.addr, &outside, &output, &allowed.join("model"));
    let (code, said) = s.wait_job(head.addr, &id);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("NODE-JOB-009") && said.contains("secret") && said.contains("[jobs] allow"),
        "{said}"
    );
    assert!(!output.exists(), "nothing was written");
}

/// Clause "security: authority": a detached job's driver acts with the
/// rights the head grants it, so only the head spawns it. A worker's or a
/// driver's certificate asking a node to spawn that kind is refused with a
/// typed error and counted on the node asked; nothing runs there. Nor
/// may either make a placement group of its own detached.
#[test]
fn a_member_other_than_the_head_cannot_spawn_a_jobs_driver() {
    let s = Scratch::new("head-only", NODE);
    let (head, head_metrics) = s.spawn_metered("head", "head", None, &[]);
    let (_w2, w2_metrics) = s.spawn_metered("join", "w2", Some(head.addr), &[]);
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w2"]))
    });
    s.issue("w3");
    s.issue_role("d1", "driver");
    runtime().block_on(async {
        for (n, who) in ["w3", "d1"].into_iter().enumerate() {
            let node = join(&s, who, head.addr).await;
            let spawned = node
                .spawn_on_raw(
                    "w2",
                    flotilla::SpawnOrder {
                        kind: "flotilla.embed.job".into(),
                        name: format!("forged-driver-{n}"),
                        args: Vec::new(),
                        message_type: "any".into(),
                        epoch: flotilla_proto::epoch::Epoch::NONE,
                    },
                    Duration::from_secs(10),
                )
                .await;
            match spawned {
                Err(flotilla::SpawnError::Denied { why, .. }) => {
                    assert_eq!(why, Unauthorized::HeadOnlyKind, "{who}");
                }
                other => panic!("{who}: expected a refusal, got {other:?}"),
            }
            counted(
                w2_metrics,
                &authority("spawn", "head_only_kind"),
                n as u64 + 1,
            );
            // Nor may it make a group of its own detached (one that would
            // outlive it, which only the head's job service makes).
            let asked = node
                .create_group(
                    flotilla::placement_groups::GroupSpec::new(
                        flotilla::placement_groups::Strategy::Pack,
                        vec![flotilla::placement_groups::bundle(&[("cpu", 0.1)])],
                    )
                    .detached(),
                )
                .await;
            assert!(
                matches!(
                    asked,
                    Err(flotilla::placement_groups::PlacementError::Denied(
                        Unauthorized::DetachedGroup
                    ))
                ),
                "{who}: {asked:?}"
            );
            counted(
                head_metrics,
                &authority("placement", "detached_group"),
                n as u64 + 1,
            );
            node.shutdown().await;
        }
    });
}

/// Clause "jobs: what a job may touch", against a member that tries to
/// leave its roots: a detached job whose input, output or model is
/// spelled to resolve outside the roots (`%2e%2e`, `.%2E`, backslashes in
/// a `file:` URL, the same on `s3://` against the test kit's S3 server),
/// or that reaches outside through a link under a root (a symlinked
/// shard, an output or model folder that is a link), fails before
/// anything outside is read or written, naming why.
#[test]
fn a_detached_job_cannot_leave_its_roots_by_encoded_dots_backslashes_or_links() {
    let s = Scratch::new("job-escapes", NODE);
    let server = flotilla_testkit::s3::S3Server::start(std::path::Path::new(
        &std::env::var_os("FLOTILLA_S3_SERVER").expect("FLOTILLA_S3_SERVER: run scripts/test"),
    ));
    let env = server.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let allowed = s.job_root("allowed");
    let secret = s.job_root("secret");
    let row = b"{\"id\":\"s1\",\"text\":\"the secret row\"}\n";
    std::fs::write(secret.join("corpus.jsonl"), row).unwrap();
    std::fs::write(allowed.join("in.jsonl"), row).unwrap();
    assert!(
        server
            .put("secret/corpus.jsonl", row)
            .unwrap()
            .contains("200")
    );
    assert!(server.put("allowed/in.jsonl", row).unwrap().contains("200"));
    std::fs::create_dir_all(allowed.join("shards")).unwrap();
    std::os::unix::fs::symlink(secret.join("corpus.jsonl"), allowed.join("shards/a.jsonl"))
        .unwrap();
    std::os::unix::fs::symlink(&secret, allowed.join("elsewhere")).unwrap();

    let head = s.launch(Launch {
        role: "head",
        name: "head",
        listen: free_addr(),
        head: None,
        flags: &[],
        env: &env,
    });
    s.issue("w1");
    let _w1 = s.launch(Launch {
        role: "join",
        name: "w1",
        listen: free_addr(),
        head: Some(head.addr),
        flags: &[
            "--allow-path",
            allowed.to_str().unwrap(),
            "--allow-path",
            "s3://embeds/allowed/",
        ],
        env: &env,
    });
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    let a = allowed.to_str().unwrap();
    let model =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/all-MiniLM-L6-v2");
    let model = model.canonicalize().unwrap();
    let m = model.to_str().unwrap();
    let good_out = format!("{a}/out");
    let cases: Vec<(&str, String, String, String, &str)> = vec![
        (
            "input %2e%2e",
            format!("file://{a}/%2e%2e/secret/corpus.jsonl"),
            good_out.clone(),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "output %2e%2e",
            format!("{a}/in.jsonl"),
            format!("file://{a}/%2e%2e/secret/stolen/"),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "input .%2E",
            format!("file://{a}/.%2E/secret/corpus.jsonl"),
            good_out.clone(),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "input backslash",
            format!("file://{a}/..\\secret\\corpus.jsonl"),
            good_out.clone(),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "output backslash",
            format!("{a}/in.jsonl"),
            format!("file://{a}\\..\\secret\\stolen"),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "s3 input %2e%2e",
            "s3://embeds/allowed/%2e%2e/secret/corpus.jsonl".into(),
            good_out.clone(),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "s3 output %2E.",
            "s3://embeds/allowed/in.jsonl".into(),
            "s3://embeds/allowed/%2E./secret/stolen/".into(),
            m.into(),
            "NODE-JOB-008",
        ),
        (
            "symlinked shard",
            format!("{a}/shards"),
            good_out.clone(),
            m.into(),
            "NODE-JOB-009",
        ),
        (
            "output through a link",
            format!("{a}/in.jsonl"),
            format!("{a}/elsewhere/stolen"),
            m.into(),
            "NODE-JOB-009",
        ),
        (
            "model through a link",
            format!("{a}/in.jsonl"),
            good_out.clone(),
            format!("{a}/elsewhere"),
            "NODE-JOB-009",
        ),
    ];
    for (attack, input, output, model, code) in cases {
        let id = s.submit_embed(
            head.addr,
            std::path::Path::new(&input),
            std::path::Path::new(&output),
            std::path::Path::new(&model),
        );
        let (exit, said) = s.wait_job(head.addr, &id);
        assert_eq!(exit, Some(1), "{attack}: the job ran: {said}");
        assert!(said.contains(code), "{attack}: {said}");
        assert!(!said.contains("the secret row"), "{attack}: {said}");
        assert!(!secret.join("stolen").exists(), "{attack}: wrote outside");
        assert!(
            !std::path::Path::new(&good_out).exists(),
            "{attack}: wrote at all"
        );
        let stolen = server.request("GET", "/embeds/secret/stolen/manifest.json");
        assert!(
            stolen.is_some_and(|l| l.contains("404")),
            "{attack}: wrote to s3"
        );
    }
}

/// A stalled TLS handshake: its client verifies the server's certificate
/// for so long, holding its thread, then fails.
#[derive(Debug)]
struct Stall(Duration);

impl rustls::client::danger::ServerCertVerifier for Stall {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        std::thread::sleep(self.0);
        Err(rustls::Error::General("stalled".into()))
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("stalled".into()))
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("stalled".into()))
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        flotilla_transport::tls::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Starts `n` handshakes with `addr` from the address `from` that never
/// finish: each client sends its hello and then sits in certificate
/// verification for `hold`. Until `keep` has passed, each starts again
/// once its check gives up, so about `n` stay pending.
fn stall_handshakes(
    s: &Scratch,
    addr: std::net::SocketAddr,
    n: usize,
    from: &str,
    (hold, keep): (Duration, Duration),
) -> Vec<std::thread::JoinHandle<()>> {
    let id = identity(s, "staller");
    let source: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    let until = Instant::now() + keep;
    (0..n)
        .map(|_| {
            let id = id.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let mut tls = rustls::ClientConfig::builder_with_provider(
                        flotilla_transport::tls::provider(),
                    )
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .unwrap()
                    .dangerous()
                    .with_custom_certificate_verifier(std::sync::Arc::new(Stall(hold)))
                    .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                    .unwrap();
                    tls.alpn_protocols = vec![flotilla_transport::tls::ALPN.to_vec()];
                    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
                    let config = quinn::ClientConfig::new(std::sync::Arc::new(crypto));
                    loop {
                        // A fresh endpoint each time: a source not yet
                        // validated, as a flood's would be.
                        let mut ep = quinn::Endpoint::client(source).unwrap();
                        ep.set_default_client_config(config.clone());
                        let started = Instant::now();
                        let _ = tokio::time::timeout(
                            Duration::from_secs(30),
                            ep.connect(addr, "head").unwrap(),
                        )
                        .await;
                        if Instant::now() >= until {
                            return;
                        }
                        // Not faster than a handshake every 100 ms, should
                        // the node be gone.
                        tokio::time::sleep(
                            Duration::from_millis(100).saturating_sub(started.elapsed()),
                        )
                        .await;
                    }
                });
            })
        })
        .collect()
}

/// Seconds from starting `node join --name NAME` until the head lists it
/// up.
fn join_time(s: &Scratch, head: &Proc, name: &str) -> (Proc, Duration) {
    s.issue(name);
    let started = Instant::now();
    let p = s.spawn("join", name, free_addr(), Some(head.addr), &s.certs());
    eventually(Duration::from_secs(30), || {
        s.status(head.addr).filter(|st| all_up(st, &[name]))
    });
    (p, started.elapsed())
}

/// Clause "security: handshakes": handshakes run side by side, a bounded
/// number per source address and in all; a peer that holds handshakes
/// open holds only its own slots. A join while six handshakes stall takes
/// no more than a second longer than one without; the stalled ones are
/// refused at their deadline and counted, and nobody is asked to retry.
/// Past 32 pending (the default threshold), held there from eight
/// addresses, new sources are asked to validate their address (QUIC
/// retry, counted as `reason="retry"`) and a join is still as fast.
#[test]
fn a_peer_holding_handshakes_open_does_not_delay_a_join() {
    let s = Scratch::new("stall", NODE);
    s.issue("staller");
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head"]))
    });
    let (_w1, baseline) = join_time(&s, &head, "w1");
    let stallers = stall_handshakes(
        &s,
        head.addr,
        6,
        "127.0.0.2",
        (Duration::from_secs(60), Duration::ZERO),
    );
    std::thread::sleep(Duration::from_millis(500));
    let (_w2, stalled) = join_time(&s, &head, "w2");
    eprintln!("join: {baseline:?} alone, {stalled:?} beside 6 stalled handshakes");
    assert!(
        stalled <= baseline + Duration::from_secs(1),
        "{stalled:?} against {baseline:?}"
    );
    counted(metrics, "flotilla_tls_refused_total{reason=\"timeout\"}", 6);
    // Six pending is under the threshold: nobody was asked to retry.
    let retried = scrape(metrics).map(|m| counter(&m, RETRIED));
    assert_eq!(retried, Some(0));
    drop(stallers);

    // Past the default threshold of 32 pending, and held there: eight (the
    // cap) from each of eight addresses, each started again as soon as the
    // node gives up on it. Every new source is asked to prove its address
    // first, so a flood of spoofed ones would cost nothing, and a real node,
    // which does, joins as fast.
    let stallers: Vec<_> = (2..10)
        .flat_map(|last| {
            let from = format!("127.0.0.{last}");
            stall_handshakes(
                &s,
                head.addr,
                8,
                &from,
                (Duration::from_millis(5_500), Duration::from_secs(10)),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (_w3, flooded) = join_time(&s, &head, "w3");
    eprintln!("join: {flooded:?} beside 32 stalled handshakes held open");
    assert!(
        flooded <= baseline + Duration::from_secs(1),
        "{flooded:?} against {baseline:?}"
    );
    counted(metrics, RETRIED, 1);
    for staller in stallers {
        staller.join().unwrap();
    }
}

/// Connections asked to validate their address with a QUIC retry.
const RETRIED: &str = "flotilla_tls_refused_total{reason=\"retry\"}";

/// Asserts that the node at `addr` refuses `identity` as revoked (after
/// `what`).
fn assert_revoked(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    identity: flotilla_transport::Identity,
    what: &str,
) {
    let asked = rt.block_on(flotilla::query_status(addr, identity));
    assert!(
        asked
            .as_ref()
            .is_err_and(|e| e.to_string().contains("NODE-AUTH-020")),
        "not refused as revoked once {what}: {asked:?}"
    );
}

/// Clause "security: revocation": `node certs revoke` lists a certificate
/// in the CA's revocation list; the head reads it within a second and hands
/// it to every member; within 5 s the certificate is refused at every gate
/// and its connections are closed. An expired certificate is refused at
/// once, in the handshake, and counted; one that expires while its
/// connection is open has it closed then, counted. A head started again
/// without the list keeps the revocations it enforced.
#[test]
fn a_revoked_certificate_is_refused_within_five_seconds_and_an_expired_one_at_once() {
    let s = Scratch::new("revoke", NODE);
    let (head, head_metrics) = s.spawn_metered("head", "head", None, &[]);
    s.issue("w1");
    s.issue("w2");
    let _w1 = s.spawn("join", "w1", free_addr(), Some(head.addr), &s.certs());
    let _w2 = s.spawn("join", "w2", free_addr(), Some(head.addr), &s.certs());
    eventually(Duration::from_secs(20), || {
        s.status(head.addr)
            .filter(|st| all_up(st, &["head", "w1", "w2"]))
    });
    let w1_addr: std::net::SocketAddr =
        node_of(&s.status(head.addr).unwrap(), "w1").unwrap()["addr"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    let rt = runtime();
    assert!(
        rt.block_on(flotilla::query_status(w1_addr, identity(&s, "w2")))
            .is_ok()
    );
    let certs = s.certs();
    // A list from before w2's revocation, naming another certificate.
    s.issue("w3");
    let revoke = |name: &str| {
        s.node(&[
            "certs",
            "revoke",
            "--ca",
            certs.to_str().unwrap(),
            "--name",
            name,
        ])
    };
    revoke("w3");
    let older = std::fs::read(certs.join("crl.pem")).unwrap();
    revoke("w2");
    let revoked = Instant::now();
    // Refused by the head and by another member.
    for addr in [head.addr, w1_addr] {
        let (_, took) = eventually(Duration::from_secs(10), || {
            let asked = rt.block_on(flotilla::query_status(addr, identity(&s, "w2")));
            asked
                .err()
                .filter(|e| e.to_string().contains("NODE-AUTH-020"))
                .map(|_| ())
        });
        let since = revoked.elapsed();
        eprintln!("{addr}: revoked certificate refused {since:?} after `node certs revoke`");
        assert!(
            since < Duration::from_secs(5),
            "{addr}: refused {since:?} after the revocation ({took:?})"
        );
    }
    // Its open connections were closed: the head loses w2.
    eventually(Duration::from_secs(15), || {
        let st = s.status(head.addr)?;
        (state_of(&st, "w2").as_deref() == Some("down")).then_some(())
    });
    counted(
        head_metrics,
        "flotilla_hello_refused_total{reason=\"revoked\"}",
        1,
    );
    // The list disappears (a stale copy put back, a mistake): the
    // revocation stays in force.
    std::fs::remove_file(certs.join("crl.pem")).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_revoked(&rt, head.addr, identity(&s, "w2"), "the list went away");
    // An older list put back (a standby's stale copy): the revocations
    // the head knows stay.
    std::fs::write(certs.join("crl.pem"), &older).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_revoked(&rt, head.addr, identity(&s, "w2"), "an older list");
    std::fs::remove_file(certs.join("crl.pem")).unwrap();

    // Expired a day ago: refused in the handshake.
    let day = 24 * 3600;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    flotilla_transport::certs::dangerous_issue_between(
        &certs,
        "old",
        flotilla_proto::role::Role::Worker,
        now - 30 * day,
        now - day,
        &certs,
    )
    .unwrap();
    let started = Instant::now();
    let asked = rt.block_on(flotilla::query_status(head.addr, identity(&s, "old")));
    assert!(asked.is_err(), "{asked:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    counted(
        head_metrics,
        "flotilla_tls_refused_total{reason=\"tls\"}",
        1,
    );

    // Valid for 20 s: it joins, and its connection is closed when the
    // certificate expires, not at its next handshake.
    let until = now + 20;
    flotilla_transport::certs::dangerous_issue_between(
        &certs,
        "brief",
        flotilla_proto::role::Role::Worker,
        now - day,
        until,
        &certs,
    )
    .unwrap();
    let _brief = s.spawn("join", "brief", free_addr(), Some(head.addr), &s.certs());
    eventually(Duration::from_secs(15), || {
        let st = s.status(head.addr)?;
        (state_of(&st, "brief").as_deref() == Some("up")).then_some(())
    });
    let expired = "flotilla_connections_closed_total{reason=\"expired\"}";
    eventually(Duration::from_secs(30), || {
        scrape(head_metrics)
            .map(|m| counter(&m, expired))
            .filter(|n| *n >= 1)
    });
    let closed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        closed >= until,
        "closed at {closed}, before the expiry at {until}"
    );
    eventually(Duration::from_secs(20), || {
        let st = s.status(head.addr)?;
        (state_of(&st, "brief").as_deref() != Some("up")).then_some(())
    });

    // The head killed and started again on its state, with no list beside
    // it: the revocation it enforced is still in force.
    drop(head);
    assert!(!certs.join("crl.pem").exists());
    let again = s.spawn("head", "head", free_addr(), None, &s.certs());
    eventually(Duration::from_secs(20), || {
        s.status(again.addr).filter(|st| all_up(st, &["head"]))
    });
    assert_revoked(&rt, again.addr, identity(&s, "w2"), "the head restarted");
    assert!(
        rt.block_on(flotilla::query_status(again.addr, identity(&s, "w1")))
            .is_ok()
    );
}

/// Clause "membership: bounded joins": a join whose labels exceed their
/// bounds is refused with the typed error, and the node exits.
#[test]
fn a_join_with_oversized_labels_is_refused() {
    let s = Scratch::new("labels", NODE);
    let head = s.spawn("head", "head", free_addr(), None, &s.certs());
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head"]))
    });
    s.issue("w1");
    let long = format!("note={}", "x".repeat(300));
    let mut w1 = s.spawn_with(
        "join",
        "w1",
        free_addr(),
        Some(head.addr),
        &["--label", &long],
    );
    let status = w1.exit_within(Duration::from_secs(15));
    assert_eq!(status.code(), Some(3));
    assert!(s.log("w1").contains("NODE-JOIN-007"), "{}", s.log("w1"));
    assert_eq!(state_of(&s.status(head.addr).unwrap(), "w1"), None);
}

/// The actors of other nodes in process group `group`, as this process's
/// nodes know them.
fn remote_members(group: &str) -> usize {
    flotilla::ractor::pg::get_members(&group.to_owned())
        .iter()
        .filter(|a| !a.get_id().is_local())
        .count()
}

/// Clause "security: bounds": a member that announces more actors than
/// its certificate's cap (each one a reference and a group membership on
/// every node it has a session with) has the announcement past the cap
/// refused and counted on each node, and its sessions go on: what it
/// announced under the cap is known, a call through the session is
/// answered.
#[test]
fn a_member_announcing_actors_past_its_certificates_cap_has_the_rest_refused_and_its_session_kept()
{
    use flotilla::ractor::{ActorRef, call_t};
    use flotilla_proto::cluster_frames::MAX_MEMBERSHIPS_PER_PRINCIPAL;

    let s = Scratch::new("flood", NODE);
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    s.issue("w1");
    s.issue_role("d1", "driver");
    let _w1 = s.spawn("join", "w1", free_addr(), Some(head.addr), &s.certs());
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    // Room under the cap for the groups w1's own actors join.
    let under = MAX_MEMBERSHIPS_PER_PRINCIPAL as u32 - 64;
    let groups = FloodArgs(vec![
        FloodGroup {
            name: "flood-under".into(),
            actors: under,
        },
        FloodGroup {
            name: "flood-past".into(),
            actors: 128,
        },
    ]);
    runtime().block_on(async {
        let d1 = join(&s, "d1", head.addr).await;
        assert!(d1.wait_session("w1", Duration::from_secs(15)).await);
        let flooder: ActorRef<FlooderMsg> = d1
            .spawn_on(
                "w1",
                FLOODER.named("flooder"),
                &groups,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        // This process's node holds what came under the cap, nothing past.
        eventually(Duration::from_secs(30), || {
            (remote_members("flood-under") == under as usize).then_some(())
        });
        let capped = "flotilla_principal_capped_total{what=\"group_memberships\"}";
        counted(metrics, capped, 1);
        assert_eq!(remote_members("flood-past"), 0);
        // The sessions go on.
        let started = call_t!(flooder, FlooderMsg::Started, 5_000).unwrap();
        assert_eq!(started, u64::from(under) + 128);
        let st = s.status(head.addr).unwrap();
        assert_eq!(state_of(&st, "w1").as_deref(), Some("up"));
        d1.shutdown().await;
    });
}

/// Clause "security: bounds": one certificate has at most
/// `MAX_RUNNING_PER_PRINCIPAL` jobs running at once; the next is refused
/// with NODE-JOB-011 and counted, another certificate is not held back,
/// and a job that ends frees its place.
#[test]
fn one_certificate_cannot_run_more_than_its_cap_of_jobs_at_once() {
    use flotilla_proto::jobs::MAX_RUNNING_PER_PRINCIPAL;

    let s = Scratch::new("jobs-cap", NODE);
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    s.issue_role("d1", "driver");
    s.issue_role("d2", "driver");
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head"]))
    });
    // Never placed (no node has the CPUs): each stays pending, cheaply.
    let spec = JobSpec {
        kind: "flotilla.nothing".into(),
        args: Vec::new(),
        message_type: "none".into(),
        resources: [("cpu".to_owned(), 100_000.0)].into_iter().collect(),
        description: "a job that is never placed".into(),
        max_restarts: 1000,
    };
    runtime().block_on(async {
        let d1 = join(&s, "d1", head.addr).await;
        let mut jobs = Vec::new();
        for _ in 0..MAX_RUNNING_PER_PRINCIPAL {
            jobs.push(d1.submit_job(spec.clone()).await.unwrap());
        }
        let refused = d1.submit_job(spec.clone()).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("NODE-JOB-011")),
            "{refused:?}"
        );
        counted(metrics, "flotilla_principal_capped_total{what=\"jobs\"}", 1);
        let d2 = join(&s, "d2", head.addr).await;
        d2.submit_job(spec.clone()).await.unwrap();
        assert!(d1.stop_job(&jobs[0]).await.unwrap());
        d1.submit_job(spec.clone()).await.unwrap();
        d2.shutdown().await;
        d1.shutdown().await;
    });
}

/// Clause "security: others' placement bundles": a node that joins
/// reporting a group the head never sealed (made up, or with its nodes
/// rewritten) has it refused and counted on the head, which adopts
/// nothing of it.
#[test]
fn a_joining_node_that_claims_a_group_the_head_never_sealed_is_refused_and_counted() {
    use flotilla::Incarnation;
    use flotilla_proto::ledger::{GroupRecord, Held};
    use flotilla_proto::membership::JoinRequest;
    use flotilla_transport::handshake::{dial, recv_msg, send_msg};

    let s = Scratch::new("forged-held", NODE);
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    s.issue("w9");
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head"]))
    });
    runtime().block_on(async {
        let id = identity(&s, "w9");
        let cookie = flotilla_transport::certs::cookie_digest(id.cookie.as_deref().unwrap());
        let ep = flotilla_transport::Endpoint::client(id, &flotilla_transport::Tuning::default())
            .unwrap();
        let pc = ep.connect(head.addr, None).await.unwrap();
        let incarnation = Incarnation::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64,
        );
        let hello = Hello::new(Purpose::Control, "w9", incarnation, cookie);
        let (mut send, mut recv, _, _) = dial(&pc.connection, &hello).await.unwrap();
        let forged = Held {
            record: GroupRecord {
                id: "pg-forged-1".into(),
                revision: 1,
                strategy: "pack".into(),
                bundles: vec![[("cpu".to_owned(), 1.0)].into_iter().collect()],
                nodes: vec!["w9".into()],
                selector: Default::default(),
                owner: None,
                seal: vec![0; 32],
            },
            bundles: vec![0],
        };
        let join = JoinRequest {
            name: "w9".into(),
            addr: free_addr().to_string(),
            bulk_addr: free_addr().to_string(),
            host: "a forger".into(),
            incarnation,
            resources: flotilla::Resources {
                cpus: 1,
                ..Default::default()
            },
            held: vec![forged],
        };
        let max = flotilla_proto::frame::DEFAULT_MAX_FRAME;
        send_msg(&mut send, &ControlRequest::Join(join), max)
            .await
            .unwrap();
        let reply: ControlReply = recv_msg(&mut recv, max).await.unwrap();
        assert!(matches!(reply, ControlReply::Members { .. }), "{reply:?}");
        counted(metrics, &authority("placement", "unknown_group"), 1);
        let (groups, _) = match flotilla::query(
            head.addr,
            identity(&s, "w9"),
            ControlRequest::Placement(PlacementRequest::List),
        )
        .await
        {
            Ok(ControlReply::Placement(flotilla_proto::control::PlacementReply::Groups {
                groups,
                nodes,
            })) => (groups, nodes),
            other => panic!("{other:?}"),
        };
        assert!(groups.is_empty(), "nothing adopted: {groups:?}");
    });
}

/// Clause "security: bounds": one certificate holds at most
/// `MAX_CONNECTIONS_PER_PRINCIPAL` connections open to a node's endpoint;
/// the next is closed at once, saying why, and counted; another
/// certificate still connects, and a connection given back frees a place.
#[test]
fn one_certificate_cannot_hold_more_than_its_cap_of_connections_to_a_node() {
    use flotilla::quota::MAX_CONNECTIONS_PER_PRINCIPAL;
    use flotilla_transport::Closing;

    let s = Scratch::new("conn-cap", NODE);
    let (head, metrics) = s.spawn_metered("head", "head", None, &[]);
    s.issue("many");
    s.issue("other");
    eventually(Duration::from_secs(20), || {
        s.status(head.addr).filter(|st| all_up(st, &["head"]))
    });
    runtime().block_on(async {
        let tuning = flotilla_transport::Tuning::default();
        let ep = flotilla_transport::Endpoint::client(identity(&s, "many"), &tuning).unwrap();
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS_PER_PRINCIPAL {
            held.push(ep.connect(head.addr, None).await.unwrap());
        }
        let past = ep.connect(head.addr, None).await.unwrap();
        let why = tokio::time::timeout(Duration::from_secs(5), past.connection.closed())
            .await
            .expect("closed by the node");
        assert_eq!(
            Closing::of(&why),
            Some(Closing::TooManyConnections),
            "{why}"
        );
        counted(
            metrics,
            "flotilla_principal_capped_total{what=\"connections\"}",
            1,
        );
        assert!(held.iter().all(|pc| pc.connection.close_reason().is_none()));
        // Another certificate is not held back.
        let other = flotilla_transport::Endpoint::client(identity(&s, "other"), &tuning).unwrap();
        let theirs = other.connect(head.addr, None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(theirs.connection.close_reason().is_none());
        // One given back: the next one stays.
        held.pop().unwrap().connection.close(0u32.into(), b"done");
        let deadline = Instant::now() + Duration::from_secs(10);
        let _again = loop {
            let again = ep.connect(head.addr, None).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            if again.connection.close_reason().is_none() {
                break again;
            }
            // The node had not yet seen the place given back.
            assert!(
                Instant::now() < deadline,
                "{:?}",
                again.connection.close_reason()
            );
        };
    });
}

/// Clause "supervision: checkpoints fenced by epochs", against a driver
/// that forges a start: it spawns a copy of a supervised child under the
/// child's name on the other worker, the spawn order's epoch half a minute
/// ahead of the clock and the copy's arguments claiming the child's own
/// supervisor as issuer. The worker writes the driver's certificate into
/// the copy's start, so the copy fences a folder of its own: the child
/// keeps saving where it did, is never restarted, and nothing the copy
/// saved is where the child restores from.
#[test]
fn a_driver_copy_of_a_supervised_child_with_a_forged_epoch_neither_locks_it_out_nor_feeds_it_state()
{
    use flotilla_testkit::probe::{TICKER, TickerArgs, TickerMsg};
    let s = Scratch::new("forged-start", NODE);
    let (head, _workers) = cluster(&s, &["w1", "w2"]);
    let config = ticker_tree(&s);
    s.issue("sup");
    let _sup = s.spawn_with(
        "join",
        "sup",
        free_addr(),
        Some(head.addr),
        &["--config", config.to_str().unwrap()],
    );
    let child = |st: &serde_json::Value| {
        supervisor_of(st, "sup", "tickers").map(|t| t["children"][0].clone())
    };
    eventually(Duration::from_secs(30), || {
        s.status_with_supervisors(head.addr)
            .filter(|st| child(st).is_some_and(|c| c["node"] == "w1" && c["running"] == true))
    });
    let ckpt = s.dir.join("ckpt");
    let own = ckpt.join("@sup").join("ticker-1");
    let ckpts = |dir: &std::path::Path| -> usize {
        std::fs::read_dir(dir).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
                .count()
        })
    };
    eventually(Duration::from_secs(20), || (ckpts(&own) > 0).then_some(()));

    s.issue_role("d1", "driver");
    let ahead = flotilla::checkpoint::Epoch::from_micros(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
            + 30_000_000,
    );
    runtime().block_on(async {
        let driver = join(&s, "d1", head.addr).await;
        let forged = TickerArgs {
            checkpoint: ckpt.to_str().unwrap().into(),
            tick_ms: 20,
            every: 10,
            start: flotilla::checkpoint::Start::new("sup", ahead),
        };
        let order = SpawnOrder {
            epoch: ahead,
            ..SpawnOrder::of::<TickerMsg>(
                TICKER.name(),
                "ticker-1",
                flotilla::wire::encode(&forged),
            )
        };
        driver
            .spawn_on_raw("w2", order, Duration::from_secs(10))
            .await
            .expect("a driver may spawn a ticker on a worker");
        // The copy runs and saves (every 200 ms), beside the child, for a
        // while.
        tokio::time::sleep(Duration::from_secs(3)).await;
        driver.shutdown().await;
    });
    let w1 = s.log("w1");
    assert!(
        !w1.contains("NODE-CKPT-006"),
        "the child's saves were refused: {w1}"
    );
    let w2 = s.log("w2");
    assert!(
        w2.contains("ticker restored") && w2.contains("issuer=d1"),
        "the copy was started as the driver's: {w2}"
    );
    assert!(
        ckpts(&ckpt.join("@d1").join("ticker-1")) > 0,
        "the copy saved in a folder of its own"
    );
    let (st, _) = eventually(Duration::from_secs(5), || {
        s.status_with_supervisors(head.addr)
    });
    let c = child(&st).unwrap();
    assert_eq!(
        (c["node"].as_str(), c["restarts"].as_u64()),
        (Some("w1"), Some(0)),
        "{st}"
    );
    // No epoch of the driver's copy is among the child's.
    let theirs = format!("{:020}", ahead.micros());
    let mixed: Vec<String> = std::fs::read_dir(&own)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_owned()))
        .filter(|n| n.starts_with(&theirs))
        .collect();
    assert!(mixed.is_empty(), "{mixed:?}");
}

/// The TCP addresses the process `pid` listens on (from /proc).
fn tcp_listeners(pid: u32) -> Vec<std::net::SocketAddr> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| {
            let link = std::fs::read_link(fd.ok()?.path()).ok()?;
            let link = link.to_str()?;
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // Listening sockets (state 0A) of this process only.
            if cols.get(3) != Some(&"0A") || !inodes.contains(*cols.get(9)?) {
                return None;
            }
            let (ip, port) = cols[1].split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some(std::net::SocketAddr::from((
                std::net::Ipv4Addr::from(u32::from_be(ip)),
                port,
            )))
        })
        .collect()
}

/// Clause "security: the runtime's own listener": ractor_cluster's TCP
/// listener is the one way into a node that does not pass the QUIC gate.
/// A process on the same host that finds it (here from /proc) and offers
/// a valid member certificate, or none, is refused in the TLS handshake
/// (`NODE-TLS-003` on the node's side), before any byte of ractor's own
/// protocol is read.
#[test]
fn a_process_on_the_host_that_skips_the_quic_gate_is_refused_at_the_ractor_listener() {
    use std::io::{Read, Write};
    let s = Scratch::new("ractor-listener", NODE);
    let (head, _) = cluster(&s, &[]);
    let listeners = tcp_listeners(head.child.id());
    assert_eq!(listeners.len(), 1, "ractor's listener alone: {listeners:?}");
    let listener = listeners[0];
    assert!(listener.ip().is_loopback(), "{listener}");

    s.issue("w1");
    let member = identity(&s, "w1");
    let with_cert = flotilla_transport::tls::client_tls(&member).unwrap();
    let mut without_cert =
        rustls::ClientConfig::builder_with_provider(flotilla_transport::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates({
                let mut roots = rustls::RootCertStore::empty();
                roots.add_parsable_certificates(member.ca.clone());
                roots
            })
            .with_no_client_auth();
    without_cert.alpn_protocols = with_cert.alpn_protocols.clone();
    // A member checks a peer as any member; a plain client, by its name.
    let tries = [
        (
            "a member certificate",
            with_cert,
            flotilla_transport::tls::ANY_MEMBER,
        ),
        ("no certificate", without_cert, "head"),
    ];
    for (what, tls, server) in tries {
        let name = rustls::pki_types::ServerName::try_from(server).unwrap();
        let conn = rustls::ClientConnection::new(std::sync::Arc::new(tls), name).unwrap();
        let tcp = std::net::TcpStream::connect(listener).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        // Whatever ractor's protocol would read first; then its answer.
        let wrote = stream
            .write_all(b"\0\0\0\x10hello, ractor")
            .and_then(|()| stream.flush());
        let mut answer = [0u8; 64];
        let read = wrote.and_then(|()| stream.read(&mut answer));
        match read {
            Err(e) if e.to_string().contains("alert") => {}
            other => panic!("{what}: expected the handshake refused, got {other:?}"),
        }
    }
    eventually(Duration::from_secs(5), || {
        s.log("head").contains("NODE-TLS-003").then_some(())
    });
}
