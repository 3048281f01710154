//! A batch job over an actor kind of your own (`example.text_stats`):
//! a JSONL corpus measured by supervised actors in a SPREAD placement group
//! on two workers, written as Parquet parts, every id exactly once though a
//! worker is killed with SIGKILL mid-job (its batches go to the other
//! actor at once). The cluster is `my_node` processes, the
//! stock `node` with the kind registered; this process is the driver.
//!
//! ```text
//! cargo build -p flotilla-examples --bins && cargo run -p flotilla-examples --bin batch_job
//! ```

use std::collections::HashSet;
use std::time::Duration;

use flotilla::pipeline::PipelineConfig;
use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
use flotilla::ractor::ActorRef;
use flotilla::supervisor::Intensity;
use flotilla::{Node, NodeConfig, Resources};
use flotilla_data::job::{Placed, Placement};
use flotilla_data::source::Cell;
use flotilla_data::{BatchJob, Batching, Encode, Fields, Links, Pool, Row, parts};
use flotilla_examples::text_stats::{
    MeasureStage, TEXT_STATS, TextStat, TextStatsArgs, TextStatsMsg,
};
use flotilla_examples::{free_addr, init_logs, issue_driver, my_node_cluster, scratch_certs};

const TEXTS: usize = 20_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    let certs = scratch_certs("batch-job", &["head", "w1", "w2"])?;
    issue_driver(&certs, "driver")?;
    let dir = certs.join("job");
    std::fs::create_dir_all(&dir)?;
    let (head, _head, mut workers) = my_node_cluster(&certs, &dir, &["w1", "w2"])?;

    // The driver: a node of its own that offers nothing.
    let mut config = NodeConfig::new("driver", free_addr(), &certs).join(head);
    config.resources = Some(Resources::default());
    let node = std::sync::Arc::new(Node::builder(config).start().await?);
    let all_up = |t: &flotilla::Table| t.up().count() == 4;
    node.wait_members(Duration::from_secs(30), all_up)
        .await
        .ok_or_else(|| anyhow::anyhow!("the workers did not join"))?;
    // Two actors of the kind in a SPREAD group of the job's own, supervised.
    let placement = Placement {
        spec: GroupSpec::new(Strategy::Spread, vec![bundle(&[("cpu", 1.0)]); 2]),
        kind: TEXT_STATS,
        name: "stats".to_owned(),
        args: TextStatsArgs {
            min_word_len: 3,
            work_ms: 20,
        },
        spawn_timeout: Duration::from_secs(15),
    };
    let ready = |_: ActorRef<TextStatsMsg>| async { Ok(()) };
    let placed = Placed::start(&node, placement, Duration::from_secs(30), None, ready).await?;
    println!("actors placed: {}", placed.placed);
    let survivor = (
        placed.actors[1].member.clone(),
        placed.actors[1].actor.clone(),
    );
    let (pool, _, stopper) = placed.supervise(Intensity::default()).await?;

    let corpus = dir.join("corpus.jsonl");
    let lines: Vec<String> = (0..TEXTS)
        .map(|i| {
            format!(
                "{{\"id\": \"t{i}\", \"text\": \"text number {i} says {}\"}}",
                "word ".repeat(i % 17)
            )
        })
        .collect();
    std::fs::write(&corpus, lines.join("\n"))?;
    let out = dir.join("out");
    let job = BatchJob {
        input: corpus.to_string_lossy().into_owned(),
        resolved: None,
        fields: Fields::new("id", "text"),
        output: out.to_string_lossy().into_owned(),
        manifest: serde_json::json!({"job": "text-stats", "min_word_len": 3}).to_string(),
        extension: "parquet",
        batching: Batching::rows(100),
        pipeline: PipelineConfig {
            max_attempts: 10,
            ..PipelineConfig::for_workers(2, Duration::from_secs(2))
        },
        progress: Default::default(),
    };

    // w1 is killed once 30 parts are written.
    let parts_dir = out.join("parts");
    let mut w1 = workers.remove(0);
    let killer = tokio::spawn(async move {
        while std::fs::read_dir(&parts_dir).map_or(0, |d| d.count()) < 30 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        w1.kill();
        println!("w1 killed with SIGKILL");
    });
    let encode = |rows: &[Row], stats: Vec<TextStat>| {
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let chars = stats.iter().map(|s| Cell::Int(s.chars.into())).collect();
        let words = stats.iter().map(|s| Cell::Int(s.words.into())).collect();
        Ok(parts::parquet_part(
            &ids,
            &[("chars", chars), ("words", words)],
        )?)
    };
    let links = Links::of(&node);
    let summary = flotilla_data::job::run(links, job.clone(), MeasureStage, pool, Encode(encode));
    let summary = summary.await?;
    anyhow::ensure!(killer.is_finished(), "the job ended before w1 was killed");
    println!("{}", summary.line("texts", 2));

    let ids = parts::parquet_ids(&out.join("parts"))?;
    let unique: HashSet<&String> = ids.iter().collect();
    anyhow::ensure!(
        ids.len() == TEXTS && unique.len() == TEXTS,
        "{} rows, {} ids",
        ids.len(),
        unique.len()
    );
    println!(
        "{TEXTS} ids, each exactly once, in {} parts",
        summary.written
    );
    // Run again on the same output: every batch is found done.
    let pool = Pool::new(vec![survivor]);
    let again = flotilla_data::job::run(Links::of(&node), job, MeasureStage, pool, Encode(encode));
    let again = again.await?;
    anyhow::ensure!(
        again.skipped == summary.written && again.written == 0,
        "{again:?}"
    );
    println!(
        "run again: {} batches found done, none written",
        again.skipped
    );
    stopper.stop().await;
    node.shutdown().await;
    Ok(())
}
