//! `my_node` (examples/src/bin/my_node.rs): the stock `node` command with
//! an actor kind of the example's own registered. Real processes on
//! 127.0.0.1.

use std::time::Duration;

use flotilla::ractor::call_t;
use flotilla_examples::text_stats::{Stats, TEXT_STATS, TextStat, TextStatsMsg, Texts, Totals};
use flotilla_testkit::cluster::*;

const MY_NODE: &str = env!("CARGO_BIN_EXE_my_node");

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
    std::fs::write(
        &config,
        format!(
            "[[supervisor]]\nname = \"stats\"\n\n[[supervisor.child]]\nkind = {TEXT_STATS:?}\nname = \"stats-1\"\n[supervisor.child.args]\nmin_word_len = 3\n"
        ),
    )
    .unwrap();
    let head_addr = free_addr();
    let _head = s.spawn_with(
        "head",
        "head",
        head_addr,
        None,
        &s.certs(),
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

    s.issue_role("d1", "driver");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut config = flotilla::NodeConfig::new("d1", free_addr(), s.certs()).join(head_addr);
        config.resources = Some(flotilla::Resources::default());
        let d1 = flotilla::Node::builder(config).start().await.unwrap();
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
            .spawn_on::<TextStatsMsg, _>(
                "w1",
                TEXT_STATS,
                "stats-w1",
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
