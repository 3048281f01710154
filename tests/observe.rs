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

/// The job's rows of `outcome` in a scrape.
fn rows_of(scraped: &str, id: &str, outcome: &str) -> Option<f64> {
    let labels = format!(",outcome=\"{outcome}\"");
    of_job(scraped, "flotilla_job_rows_total", id, &labels)
}

/// A head serving `/metrics`, and that address.
fn head_with_metrics(s: &Scratch) -> (Proc, std::net::SocketAddr) {
    let metrics = flotilla_testkit::ca::free_tcp_addr();
    let flag = metrics.to_string();
    let head = s.spawn_with(
        "head",
        "head",
        free_addr(),
        None,
        &["--metrics-listen", &flag],
    );
    (head, metrics)
}

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
/// two actors, CPU time spent, and the state `succeeded`; its workers'
/// price per hour gives it a cost, and its summary the cost per million
/// tokens. `node jobs logs ID` prints its driver's log lines from the head
/// to its owner and to an observer, and refuses another driver.
#[test]
fn the_heads_scrape_shows_each_job_under_teis_names_and_agrees_with_node_jobs() {
    let s = Scratch::new("observe-scrape", NODE);
    let (head, metrics) = head_with_metrics(&s);
    // Each worker costs 3.6 an hour: 0.001 a second.
    let price = ["--price-per-hour", "3.6"];
    let _workers = cpu_workers_env(&s, head.addr, &["m1", "m2"], "cpu=2", &[], &price);
    let (input, ids) = corpus(&s.dir, 600);
    let out = s.dir.join("out-observe");
    let id = submit(&s, &head, &input, &out);

    // While it runs.
    let (running, _) = eventually(Duration::from_secs(120), || {
        let scraped = scrape(metrics)?;
        let running = of_job(&scraped, "flotilla_job_state", &id, ",state=\"running\"")?;
        let done = rows_of(&scraped, &id, "done")?;
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
    let rows = |outcome: &str| rows_of(&scraped, &id, outcome).unwrap();
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
    // Two nodes at 0.001 a second for the driver's run; the summary has
    // the cost per million tokens.
    let cost = of_job(&scraped, "flotilla_job_cost", &id, "").expect("a cost");
    assert!(cost > 0.0 && cost < 0.002 * 300.0, "{cost}");
    let detail = j["jobs"][0]["detail"].as_str().unwrap();
    assert!(
        detail.contains(" tokens (") && detail.contains("per million tokens)"),
        "{detail}"
    );
    // Its driver's log, from the head: to its owner and an observer, not
    // to another driver.
    let logs = |name: &str| {
        std::process::Command::new(NODE)
            .args(["jobs", "logs", &id, "--head", &head.addr.to_string()])
            .args(["--certs", s.certs().to_str().unwrap(), "--name", name])
            .output()
            .unwrap()
    };
    let owned = logs("admin");
    let text = String::from_utf8_lossy(&owned.stdout).into_owned();
    assert!(owned.status.success(), "{text}");
    assert!(!text.is_empty(), "no log lines");
    for line in text.lines() {
        assert!(
            line.len() > 13 && line.as_bytes()[2] == b':' && line.as_bytes()[8] == b'.',
            "{line}"
        );
    }
    assert!(text.contains(" INFO "), "{text}");
    s.issue_role("watcher", "observer");
    s.issue_role("someone", "driver");
    assert_eq!(logs("watcher").stdout, owned.stdout);
    let refused = logs("someone");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("NODE-AUTH-033"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // No ETA once it has ended.
    assert!(!scraped.contains(&format!("flotilla_job_eta_seconds{{job=\"{id}\"}}")));
}

/// Chromium, run headless on `url`, with `flags` (`--dump-dom` prints the
/// page as its script left it).
fn chromium(flags: &[&str], url: &str) -> std::process::Output {
    let profile = tempfile_dir("chromium-profile");
    let out = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=4000",
            &format!("--user-data-dir={}", profile.display()),
        ])
        .args(flags)
        .arg(url)
        .output()
        .expect("chromium runs (scripts/fetch-test-tools installs it)");
    let _ = std::fs::remove_dir_all(&profile);
    out
}

/// A fresh folder for one browser run.
fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "flotilla-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The page at `url` as the browser's script drew it, once it shows
/// `page` (every load is a fresh browser).
fn page_dom(url: &str, page: &str) -> String {
    let (dom, _) = eventually(Duration::from_secs(60), || {
        let out = chromium(&["--dump-dom"], url);
        let dom = String::from_utf8_lossy(&out.stdout).into_owned();
        dom.contains(&format!("data-page=\"{page}\""))
            .then_some(dom)
    });
    dom
}

/// The value of `data-field="FIELD" data-value="…"` in the element whose
/// opening tag holds `anchor` (a row or list), as a number.
fn field(dom: &str, anchor: &str, field: &str) -> Option<f64> {
    let from = dom.find(anchor)?;
    let rest = &dom[from..];
    let at = rest.find(&format!("data-field=\"{field}\" data-value=\""))?;
    let value = &rest[at + field.len() + 26..];
    value[..value.find('"')?].parse().ok()
}

/// Everything the page fetched (its own address first), as its script
/// listed it.
fn fetched(dom: &str) -> Vec<String> {
    let start = dom
        .find("<pre id=\"resources\" hidden=\"\">")
        .expect("the list")
        + 30;
    let end = start + dom[start..].find("</pre>").unwrap();
    dom[start..end]
        .lines()
        .map(|l| l.replace("&amp;", "&"))
        .collect()
}

/// A head serving `/metrics`, two workers (their actors slowed six times,
/// so the job is still running while the pages load) and a detached embed
/// job of 1,200 texts, seen through `node dashboard` (with an `observer`
/// certificate) in Chromium: every page loads; the cluster page lists each
/// member with the role, incarnation and state `node status --json`
/// gives; the jobs page and the job's page show rows done and tokens
/// between what `/metrics` said just before and just after, no more
/// batches in flight than the window, both charts, and a running cost at
/// the workers' price; the supervisors
/// page lists every supervisor `node status --json` lists; no page fetches
/// anything from another origin. A screenshot of the job's page is taken
/// (written to docs/dashboard.png with FLOTILLA_WRITE_SCREENSHOT=1).
#[test]
fn the_dashboard_shows_the_cluster_and_a_running_job_in_a_real_browser() {
    let s = Scratch::new("observe-dashboard", NODE);
    let (head, metrics) = head_with_metrics(&s);
    let slow = [("FLOTILLA_FAILPOINTS", "embedder::slow=return(6)")];
    let price = ["--price-per-hour", "1.2"];
    let _workers = cpu_workers_env(&s, head.addr, &["v1", "v2"], "cpu=2", &slow, &price);
    let (input, _) = corpus(&s.dir, 1200);
    // A row the job refuses, first: its page shows it from errors.jsonl.
    let rows = std::fs::read_to_string(&input).unwrap();
    std::fs::write(
        &input,
        format!("{{\"id\": \"broken-1\", \"text\": 7}}\n{rows}"),
    )
    .unwrap();
    let id = submit(&s, &head, &input, &s.dir.join("out-dashboard"));
    eventually(Duration::from_secs(120), || {
        let scraped = scrape(metrics)?;
        let done = rows_of(&scraped, &id, "done")?;
        (done > 0.0).then_some(())
    });

    s.issue_role("watcher", "observer");
    let listen = flotilla_testkit::ca::free_tcp_addr();
    let dashboard = std::process::Command::new(NODE)
        .args(["dashboard", "--listen", &listen.to_string()])
        .args(["--head", &head.addr.to_string()])
        .args(["--certs", s.certs().to_str().unwrap(), "--name", "watcher"])
        .stderr(std::fs::File::create(s.dir.join("dashboard.log")).unwrap())
        .spawn()
        .unwrap();
    let _dashboard = Killed(dashboard);
    let origin = format!("http://{listen}/");
    eventually(Duration::from_secs(30), || {
        std::net::TcpStream::connect(listen).ok().map(|_| ())
    });

    let mut pages = Vec::new();
    // The cluster, against `node status --json`.
    let dom = page_dom(&format!("{origin}#/cluster"), "cluster");
    let st = s.status(head.addr).unwrap();
    for n in st["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let anchor = format!("data-node=\"{name}\"");
        assert!(dom.contains(&anchor), "{name}\n{dom}");
        assert_eq!(
            field(&dom, &anchor, "incarnation"),
            n["incarnation"].as_f64(),
            "{name}\n{dom}"
        );
        // Heard from within the down threshold (the head: always).
        let heard = field(&dom, &anchor, "heard_ms_ago").expect("a last heartbeat");
        assert!(heard < 5000.0, "{name}: {heard} ms\n{dom}");
        assert!(n["heard_ms_ago"].as_u64().is_some(), "{n}");
        let row = &dom[dom.find(&anchor).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(
            row.contains(&format!(">{}<", n["role"].as_str().unwrap())),
            "{row}"
        );
        assert!(
            row.contains(&format!(">{}<", n["state"].as_str().unwrap())),
            "{row}"
        );
    }
    pages.push(dom);

    // The jobs, and the job, against `/metrics` just before and after.
    let done_now = || {
        let scraped = scrape(metrics).unwrap();
        let rows = |o: &str| rows_of(&scraped, &id, o).unwrap();
        let tokens = of_job(&scraped, "flotilla_job_tokens_total", &id, ",kind=\"real\"").unwrap();
        (rows("done") + rows("skipped"), tokens)
    };
    let before = done_now();
    let jobs = page_dom(&format!("{origin}#/jobs"), "jobs");
    let job = page_dom(&format!("{origin}#/job/{id}"), "job");
    let after = done_now();
    let anchor = format!("data-job=\"{id}\"");
    let shown = field(&jobs, &anchor, "done").expect("the job's row");
    assert!(
        before.0 <= shown && shown <= after.0,
        "{before:?} {shown} {after:?}"
    );
    // The total as `node jobs --json` says it (every line of the input).
    let listed = jobs_json(&s, &head).unwrap();
    assert_eq!(
        field(&jobs, &anchor, "total"),
        listed["jobs"][0]["total"].as_f64(),
        "{jobs}"
    );
    let tokens = field(&job, "<main", "tokens").expect("the job's tokens");
    assert!(
        before.1 <= tokens && tokens <= after.1,
        "{before:?} {tokens} {after:?}"
    );
    let in_flight = field(&job, "<main", "in_flight").unwrap();
    assert!(job.contains(&format!("{} / ", in_flight as u64)), "{job}");
    assert!(job.contains("data-chart=\"rows\"") && job.contains("data-chart=\"tokens\""));
    assert!(job.contains("data-stage=\"inference\""), "{job}");
    // The refused row, and the driver's log as `node jobs logs` prints it.
    let errors = &job[job.find("data-errors=").expect("the errors")..];
    assert!(
        errors[..errors.find("</pre>").unwrap()].contains("broken-1"),
        "{job}"
    );
    let head_addr = head.addr.to_string();
    let certs = s.certs();
    let logged = s.node(&[
        "jobs",
        "logs",
        &id,
        "--head",
        &head_addr,
        "--certs",
        certs.to_str().unwrap(),
    ]);
    let log = &job[job.find("data-log=").expect("the log")..];
    let log = &log[log.find('>').unwrap() + 1..log.find("</pre>").unwrap()];
    let shown: Vec<&str> = log.lines().collect();
    assert!(!shown.is_empty() && shown.len() <= 50, "{job}");
    for line in shown {
        assert!(
            logged.lines().any(|l| html_text(l) == line),
            "{line}\n{logged}"
        );
    }
    // Its workers' price gives it a running cost.
    assert!(
        field(&job, "<main", "cost").is_some_and(|c| c > 0.0),
        "{job}"
    );
    pages.push(jobs);
    pages.push(job);

    // The supervisors, against `node status --json` with them.
    let sup = page_dom(&format!("{origin}#/supervisors"), "supervisors");
    let st = s.status_with_supervisors(head.addr).unwrap();
    for n in st["nodes"].as_array().unwrap() {
        for sv in n["supervisors"].as_array().into_iter().flatten() {
            let name = sv["name"].as_str().unwrap();
            assert!(sup.contains(name), "{name}\n{sup}");
            let anchor = format!("data-supervisor=\"{name}\"");
            assert_eq!(
                field(&sup, &anchor, "restarts_left"),
                sv["restarts_left"].as_f64(),
                "{name}\n{sup}"
            );
        }
    }
    pages.push(sup);

    // Nothing from another origin.
    for dom in &pages {
        let urls = fetched(dom);
        assert!(urls.len() >= 3, "{urls:?}");
        for url in urls {
            assert!(url.starts_with(&origin), "{url} is not of {origin}");
        }
    }

    // The screenshot of the job's page.
    let png = if std::env::var_os("FLOTILLA_WRITE_SCREENSHOT").is_some() {
        root().join("docs/dashboard.png")
    } else {
        s.dir.join("dashboard.png")
    };
    let shot = format!("--screenshot={}", png.display());
    chromium(
        &[&shot, "--window-size=1280,1100"],
        &format!("{origin}#/job/{id}"),
    );
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{}",
        bytes.len()
    );
}

/// `text` as an HTML document's text shows it.
fn html_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A child process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
