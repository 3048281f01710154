//! Seeing what a job does: the head's `/metrics` shows every detached
//! job's account, under Text Embeddings Inference's names where the
//! meaning is the same, on a loopback cluster of real `node` processes
//! running the real model.

use std::path::Path;
use std::time::Duration;

mod common;

use common::*;

const NODE: &str = env!("CARGO_BIN_EXE_node");

/// TEI's histogram names, byte for byte.
const TEI_HISTOGRAMS: [&str; 6] = [
    "te_batch_next_size",
    "te_batch_next_tokens",
    "te_request_input_length",
    "te_request_tokenization_duration",
    "te_request_queue_duration",
    "te_request_inference_duration",
];

/// The job families and their types.
const JOB_FAMILIES: [(&str, &str); 11] = [
    ("flotilla_job_rows_total", "counter"),
    ("flotilla_job_tokens_total", "counter"),
    ("flotilla_job_batches_in_flight", "gauge"),
    ("flotilla_job_credit_window", "gauge"),
    ("flotilla_job_credit_wait_seconds_total", "counter"),
    ("flotilla_job_retries_total", "counter"),
    ("flotilla_job_actor_restarts_total", "counter"),
    ("flotilla_job_actor_busy_ratio", "gauge"),
    ("flotilla_job_state", "gauge"),
    ("flotilla_job_seconds_since_progress", "gauge"),
    ("flotilla_job_cpu_seconds_total", "counter"),
];

/// `node embed --detach` of `input` to `output` on two one-cpu actors, in
/// batches of 32: the job's id.
fn submit(s: &Scratch, head: &Proc, input: &Path, output: &Path) -> String {
    let extra = ["--detach", "--actors", "2", "--actor-resources", "cpu=1"];
    let (ok, printed) = finish(
        s,
        driver(s, head, input, output, "detach", &extra),
        "detach",
    );
    assert!(ok, "{printed}");
    let id = printed.trim().to_owned();
    assert!(id.starts_with("job-"), "{printed}");
    id
}

/// The value of `family{job="ID"…rest}` in a scrape.
fn of_job(scraped: &str, family: &str, id: &str, rest: &str) -> Option<f64> {
    gauge(scraped, &format!("{family}{{job=\"{id}\"{rest}}}"))
}

/// A head serving `/metrics` and two workers run a detached embed job of
/// 600 texts. While it runs, the scrape shows it running, with no more
/// batches in flight than its credit window. Once it has ended, the
/// scrape has every job family once with its type and TEI's six histogram
/// names byte for byte, and its numbers agree with `node jobs --json` and
/// with the job: 600 rows done, one input length per text, one batch size
/// per batch (19 batches of at most 32), real tokens no more than padded
/// ones and in the model's range per text, a busy share for each of the
/// two actors, CPU time spent, and the state `succeeded`.
#[test]
fn the_heads_scrape_shows_each_job_under_teis_names_and_agrees_with_node_jobs() {
    let s = Scratch::new("observe-scrape", NODE);
    let metrics = flotilla_testkit::ca::free_tcp_addr();
    let metrics_flag = metrics.to_string();
    let head = s.spawn_with(
        "head",
        "head",
        free_addr(),
        None,
        &["--metrics-listen", &metrics_flag],
    );
    let _workers = cpu_workers(&s, head.addr, &["m1", "m2"], "cpu=2");
    let (input, ids) = corpus(&s.dir, 600);
    let out = s.dir.join("out-observe");
    let id = submit(&s, &head, &input, &out);

    // While it runs.
    let (running, _) = eventually(Duration::from_secs(120), || {
        let scraped = scrape(metrics)?;
        let running = of_job(&scraped, "flotilla_job_state", &id, ",state=\"running\"")?;
        let done = of_job(
            &scraped,
            "flotilla_job_rows_total",
            &id,
            ",outcome=\"done\"",
        )?;
        (running == 1.0 && done > 0.0).then_some(scraped)
    });
    let in_flight = of_job(&running, "flotilla_job_batches_in_flight", &id, "").unwrap();
    let window = of_job(&running, "flotilla_job_credit_window", &id, "").unwrap();
    assert!(window >= 2.0 && in_flight <= window, "{running}");

    // Once it has ended.
    let (j, _) = eventually(Duration::from_secs(300), || {
        let j = jobs_json(&s, &head)?;
        (j["jobs"][0]["state"] == "succeeded").then_some(j)
    });
    assert_exactly_once(&out, &ids);
    let scraped = scrape(metrics).expect("the head serves /metrics");
    for (family, kind) in JOB_FAMILIES
        .iter()
        .copied()
        .chain(TEI_HISTOGRAMS.iter().map(|f| (*f, "histogram")))
    {
        let ty = format!("# TYPE {family} {kind}\n");
        assert_eq!(scraped.matches(&ty).count(), 1, "{ty}\n{scraped}");
    }
    let rows = |outcome: &str| {
        of_job(
            &scraped,
            "flotilla_job_rows_total",
            &id,
            &format!(",outcome=\"{outcome}\""),
        )
        .unwrap()
    };
    assert_eq!(rows("done"), 600.0, "{scraped}");
    assert_eq!(
        rows("done") + rows("skipped"),
        j["jobs"][0]["done"].as_f64().unwrap()
    );
    assert_eq!(rows("rejected"), 0.0);
    let count = |family: &str| of_job(&scraped, &format!("{family}_count"), &id, "").unwrap();
    assert_eq!(count("te_request_input_length"), 600.0, "{scraped}");
    let batches = 600u64.div_ceil(32) as f64;
    for family in [
        "te_batch_next_size",
        "te_batch_next_tokens",
        "te_request_tokenization_duration",
        "te_request_queue_duration",
        "te_request_inference_duration",
    ] {
        assert_eq!(count(family), batches, "{family}\n{scraped}");
    }
    assert_eq!(
        of_job(&scraped, "te_batch_next_size_sum", &id, "").unwrap(),
        600.0
    );
    // All-MiniLM-L6-v2 takes at most 256 tokens: its buckets end there.
    assert!(scraped.contains(&format!(
        "te_request_input_length_bucket{{job=\"{id}\",le=\"256\"}} 600\n"
    )));
    let tokens = |kind: &str| {
        of_job(
            &scraped,
            "flotilla_job_tokens_total",
            &id,
            &format!(",kind=\"{kind}\""),
        )
        .unwrap()
    };
    assert_eq!(
        tokens("real"),
        of_job(&scraped, "te_request_input_length_sum", &id, "").unwrap()
    );
    assert!(tokens("real") >= 600.0 * 3.0 && tokens("real") <= tokens("padded"));
    assert!(tokens("real") <= 600.0 * 256.0);
    let inference = of_job(&scraped, "te_request_inference_duration_sum", &id, "").unwrap();
    assert!(inference > 0.0, "{scraped}");
    let cpu = of_job(&scraped, "flotilla_job_cpu_seconds_total", &id, "").unwrap();
    assert!(cpu > 0.0, "{scraped}");
    let busy: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with(&format!("flotilla_job_actor_busy_ratio{{job=\"{id}\"")))
        .collect();
    assert_eq!(busy.len(), 2, "{scraped}");
    assert_eq!(
        of_job(&scraped, "flotilla_job_state", &id, ",state=\"succeeded\""),
        Some(1.0)
    );
    assert_eq!(
        of_job(&scraped, "flotilla_job_batches_in_flight", &id, ""),
        Some(0.0)
    );
    // No ETA once it has ended.
    assert!(!scraped.contains(&format!("flotilla_job_eta_seconds{{job=\"{id}\"}}")));
}
