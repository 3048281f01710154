//! `my_node` (examples/src/bin/my_node.rs): the stock `node` command with
//! an actor kind of the example's own registered. Real processes on
//! 127.0.0.1.

use std::time::Duration;

use flotilla::ractor::call_t;
use flotilla_examples::text_stats::{Stats, TEXT_STATS, TextStat, TextStatsMsg, Texts, Totals};
use flotilla_testkit::cluster::*;

const MY_NODE: &str = env!("CARGO_BIN_EXE_my_node");

/// The driver `d1`, in this process, offering nothing, joined to `head`.
async fn driver(s: &Scratch, head: std::net::SocketAddr) -> flotilla::Node {
    s.issue_role("d1", "driver");
    let mut config = flotilla::NodeConfig::new("d1", free_addr(), s.certs()).join(head);
    config.resources = Some(flotilla::Resources::default());
    flotilla::Node::builder(config).start().await.unwrap()
}

/// A user's own `node` binary: a head started with a `[[supervisor]]`
/// tree in its `node.toml` naming the example's kind runs the child with
/// the arguments written there, `status` lists it, and a driver that
/// joins calls it by name; a worker of the same binary hosts more of the
/// kind, spawned by name from the driver.
#[test]
fn my_node_runs_a_tree_of_its_own_kind_from_node_toml() {
    let s = Scratch::new("my-node", MY_NODE);
    s.issue("head");
    let config = s.dir.join("head.toml");
    let kind = TEXT_STATS.name();
    std::fs::write(
        &config,
        format!(
            "[[supervisor]]\nname = \"stats\"\n\n[[supervisor.child]]\nkind = {kind:?}\nname = \"stats-1\"\n[supervisor.child.args]\nmin_word_len = 3\n"
        ),
    )
    .unwrap();
    let head_addr = free_addr();
    let _head = s.spawn_with(
        "head",
        "head",
        head_addr,
        None,
        &["--config", config.to_str().unwrap()],
    );
    s.issue("w1");
    let _w1 = s.spawn("join", "w1", free_addr(), Some(head_addr), &s.certs());
    let (st, _) = eventually(Duration::from_secs(30), || {
        s.status_with_supervisors(head_addr).filter(|st| {
            all_up(st, &["head", "w1"])
                && supervisor_of(st, "head", "stats")
                    .is_some_and(|t| t["children"][0]["running"] == true)
        })
    });
    let tree = supervisor_of(&st, "head", "stats").unwrap();
    assert_eq!(tree["children"][0]["id"], "stats-1", "{st}");

    runtime().block_on(async {
        let d1 = driver(&s, head_addr).await;
        let stats = d1
            .wait_actor::<TextStatsMsg>("stats-1", Duration::from_secs(15))
            .await
            .unwrap();
        let texts = Texts(vec!["a bb ccc dddd".into(), "où est-il".into()]);
        let Stats(measured) = call_t!(stats, TextStatsMsg::Measure, 5_000, texts).unwrap();
        assert_eq!(
            measured,
            vec![
                TextStat {
                    chars: 13,
                    words: 2
                },
                TextStat { chars: 9, words: 1 }
            ],
            "min_word_len = 3, from node.toml"
        );
        let totals: Totals = call_t!(stats, TextStatsMsg::Totals, 5_000).unwrap();
        assert_eq!(totals, Totals { texts: 2, words: 3 });

        // The worker, the same binary, hosts the kind too.
        let more = d1
            .spawn_on(
                "w1",
                TEXT_STATS.named("stats-w1"),
                &flotilla_examples::text_stats::TextStatsArgs {
                    min_word_len: 0,
                    work_ms: 0,
                },
                Duration::from_secs(15),
            )
            .await
            .unwrap();
        let Stats(measured) = call_t!(
            more,
            TextStatsMsg::Measure,
            5_000,
            Texts(vec!["a bb".into()])
        )
        .unwrap();
        assert_eq!(measured, vec![TextStat { chars: 4, words: 2 }]);
        d1.shutdown().await;
    });
}

/// A batch job (`flotilla_data::job::run`) over `my_node` actors: one
/// actor stopped mid-job leaves the pool and the other completes every
/// batch, each id exactly once; a job whose only actor has stopped fails
/// with `NoWorkers` at once rather than wait for it.
#[test]
fn a_batch_job_goes_on_without_a_stopped_actor_and_fails_typed_with_none_left() {
    use flotilla::pipeline::{PipelineConfig, PipelineError};
    use flotilla_data::{BatchJob, BatchJobError, Batching, Encode, Fields, Links, Pool, parts};
    use flotilla_examples::text_stats::{MeasureStage, TextStatsArgs};

    let s = Scratch::new("batch-stop", MY_NODE);
    s.issue("head");
    let head_addr = free_addr();
    let _head = s.spawn("head", "head", head_addr, None, &s.certs());
    s.issue("w1");
    let _w1 = s.spawn("join", "w1", free_addr(), Some(head_addr), &s.certs());
    eventually(Duration::from_secs(30), || {
        s.status(head_addr).filter(|st| all_up(st, &["head", "w1"]))
    });
    let corpus = s.dir.join("corpus.jsonl");
    let rows: Vec<String> = (0..3000)
        .map(|i| format!("{{\"id\": \"r{i}\", \"text\": \"row {i}\"}}"))
        .collect();
    std::fs::write(&corpus, rows.join("\n")).unwrap();
    let job = |out: &str| BatchJob {
        input: corpus.to_string_lossy().into_owned(),
        resolved: None,
        fields: Fields::new("id", "text"),
        output: s.dir.join(out).to_string_lossy().into_owned(),
        manifest: "stats".to_owned(),
        extension: "parquet",
        batching: Batching::rows(50),
        pipeline: PipelineConfig::for_workers(2, Duration::from_secs(2)),
        progress: Default::default(),
    };
    let encode = |rows: &[flotilla_data::Row], stats: Vec<TextStat>| {
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let words = stats
            .iter()
            .map(|s| flotilla_data::source::Cell::Int(s.words.into()))
            .collect();
        Ok(parts::parquet_part(&ids, &[("words", words)])?)
    };

    runtime().block_on(async {
        let d1 = std::sync::Arc::new(driver(&s, head_addr).await);
        let args = TextStatsArgs {
            min_word_len: 0,
            work_ms: 20,
        };
        let mut actors = Vec::new();
        for name in ["a1", "a2"] {
            let actor = d1
                .spawn_on("w1", TEXT_STATS.named(name), &args, Duration::from_secs(15))
                .await
                .unwrap();
            actors.push(("w1".into(), actor));
        }
        let last = actors[1].clone();
        let (parts_dir, stopper) = (s.dir.join("out-1/parts"), std::sync::Arc::clone(&d1));
        let stop = tokio::spawn(async move {
            while std::fs::read_dir(&parts_dir).map_or(0, |d| d.count()) < 10 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            stopper
                .stop_on("w1", "a1", Duration::from_secs(5))
                .await
                .unwrap();
        });
        let (links, pool) = (Links::of(&d1), Pool::new(actors));
        let summary =
            flotilla_data::job::run(links, job("out-1"), MeasureStage, pool, Encode(encode))
                .await
                .unwrap();
        assert!(stop.is_finished(), "a1 was stopped mid-job");
        assert_eq!((summary.written, summary.rows), (60, 3000));
        let ids = parts::parquet_ids(&s.dir.join("out-1/parts")).unwrap();
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!((ids.len(), unique.len()), (3000, 3000));

        d1.stop_on("w1", "a2", Duration::from_secs(5))
            .await
            .unwrap();
        let (links, pool) = (Links::of(&d1), Pool::new(vec![last]));
        let alone =
            flotilla_data::job::run(links, job("out-2"), MeasureStage, pool, Encode(encode));
        let failed = tokio::time::timeout(Duration::from_secs(20), alone)
            .await
            .expect("a job with no actor left fails, not waits");
        assert!(
            matches!(
                failed,
                Err(BatchJobError::NoWorkers(PipelineError::NoWorkers(_)))
            ),
            "{failed:?}"
        );
        d1.shutdown().await;
    });
}
