//! The embedding actor on the real model: batches come back in request
//! order, matching the encoder, with the model's revision and dimension.

use std::path::PathBuf;

use flotilla::ractor::{Actor, call_t};
use flotilla_embed::actor::{
    EmbedMsg, EmbedOutcome, EmbedRequest, Embedder, EmbedderArgs, ZEROS_REVISION_PREFIX,
};
use flotilla_embed::{SentenceEncoder, default_device};

fn model_dir() -> PathBuf {
    std::env::var_os("FLOTILLA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/all-MiniLM-L6-v2")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedder_answers_in_request_order_with_its_revision() {
    let args = EmbedderArgs {
        micro_batch: 2,
        ..EmbedderArgs::new(model_dir().to_string_lossy())
    };
    let (embedder, handle) = Actor::spawn(None, Embedder::default(), args)
        .await
        .expect("model loads");
    let info = call_t!(embedder, EmbedMsg::Info, 5_000).unwrap();
    assert_eq!(info.dim, 384);
    assert!(info.revision.starts_with("sha256:53aa5117"));

    // Lengths deliberately unsorted, so micro-batching reorders them.
    let texts: Vec<String> = [
        "a considerably longer sentence about distributed embedding jobs on many machines",
        "short",
        "",
        "東京は日本の首都です",
        "medium length text here",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let reply = call_t!(
        embedder,
        EmbedMsg::Embed,
        60_000,
        EmbedRequest::new(42, texts.clone())
    )
    .unwrap();
    assert_eq!(reply.batch_id, 42);
    // The answer says what the batch took: a length per text, and the CPU
    // time of the actor's threads (read by default).
    assert_eq!(reply.work.lengths.len(), texts.len());
    assert!(reply.work.cpu_us > 0, "{:?}", reply.work);
    let EmbedOutcome::Embedded(v) = reply.outcome else {
        panic!("not embedded: {:?}", reply.outcome);
    };
    assert_eq!(v.revision, info.revision);
    assert_eq!(v.values.len(), texts.len() * 384);

    let encoder = SentenceEncoder::load(model_dir(), &default_device()).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let alone = encoder.encode(&[t.as_str()]).unwrap();
        let got = &v.values[i * 384..(i + 1) * 384];
        let diff = alone
            .row(0)
            .iter()
            .zip(got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{t:?} differs by {diff}");
    }

    let empty = call_t!(
        embedder,
        EmbedMsg::Embed,
        5_000,
        EmbedRequest::new(7, vec![])
    )
    .unwrap();
    assert!(matches!(empty.outcome, EmbedOutcome::Embedded(ref v) if v.values.is_empty()));

    embedder.stop(None);
    handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedder_with_a_missing_model_fails_to_start() {
    let args = EmbedderArgs {
        micro_batch: 16,
        ..EmbedderArgs::new("/nonexistent/model")
    };
    let Err(err) = Actor::spawn(None, Embedder::default(), args).await else {
        panic!("spawn succeeded without a model");
    };
    assert!(format!("{err:?}").contains("config.json"), "{err:?}");
}

/// An embedder a peer spawns loads a model folder only under its node's
/// roots: one outside them, or a link under a root that leads out, fails
/// the spawn naming the setting, before anything of it is read; the
/// folder itself, as named or through a link that stays inside, loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_folder_outside_the_nodes_roots_is_refused_at_spawn() {
    let real = model_dir().canonicalize().unwrap();
    let models_root = real.parent().unwrap().to_path_buf();
    let scratch = std::env::temp_dir().join(format!("flotilla-model-roots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("allowed")).unwrap();
    let allowed = scratch.join("allowed").canonicalize().unwrap();
    std::os::unix::fs::symlink(&real, allowed.join("linked-model")).unwrap();
    let spawned = |roots: &[&std::path::Path], dir: PathBuf| {
        let roots = flotilla_proto::roots::AllowedRoots::new(
            &roots
                .iter()
                .map(|r| r.to_string_lossy())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let actor = Embedder {
            limits: Some(flotilla_embed::actor::PeerLimits {
                model_roots: roots,
                cores: 2,
            }),
            ..Embedder::default()
        };
        let args = EmbedderArgs::new(dir.to_string_lossy());
        async move { Actor::spawn(None, actor, args).await }
    };
    for (roots, dir) in [
        (vec![allowed.as_path()], real.clone()),
        (vec![allowed.as_path()], allowed.join("linked-model")),
        (vec![], real.clone()),
    ] {
        let Err(err) = spawned(&roots, dir.clone()).await else {
            panic!("{} loaded under {roots:?}", dir.display());
        };
        let said = format!("{err:?}");
        assert!(
            said.contains("refused") && said.contains("--allow-path"),
            "{said}"
        );
        assert!(!said.contains("config.json"), "nothing was read: {said}");
    }
    assert!(flotilla_embed::actor::check_threads(4, 2).is_ok());
    let e = flotilla_embed::actor::check_threads(5, 2).unwrap_err();
    assert!(e.contains("2 cores") && e.contains("4 at most"), "{e}");
    assert!(flotilla_embed::actor::check_threads(u32::MAX, 64).is_err());
    // A node that loads its own model still bounds the threads a peer asks.
    let own = Embedder {
        model_dir: Some(real.clone()),
        limits: Some(flotilla_embed::actor::PeerLimits {
            model_roots: flotilla_proto::roots::AllowedRoots::default(),
            cores: 2,
        }),
        ..Embedder::default()
    };
    let greedy = EmbedderArgs {
        threads: 1000,
        ..EmbedderArgs::new("/anywhere")
    };
    let Err(err) = Actor::spawn(None, own, greedy).await else {
        panic!("1000 threads granted on 2 cores");
    };
    assert!(format!("{err:?}").contains("threads refused"), "{err:?}");
    let both: [&std::path::Path; 2] = [&allowed, &models_root];
    let (actor, handle) = spawned(&both, allowed.join("linked-model")).await.unwrap();
    actor.stop(None);
    handle.await.unwrap();
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// Actors of one node share one loaded model: two embedders given the
/// same set hold one model between them, both answer, and the model is
/// dropped with the last of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedders_of_a_node_share_one_loaded_model() {
    let models = flotilla_embed::SharedModels::default();
    let args = EmbedderArgs {
        micro_batch: 4,
        ..EmbedderArgs::new(model_dir().to_string_lossy())
    };
    let mut actors = Vec::new();
    for _ in 0..2 {
        let embedder = Embedder {
            models: models.clone(),
            ..Embedder::default()
        };
        actors.push(
            Actor::spawn(None, embedder, args.clone())
                .await
                .expect("model loads"),
        );
    }
    assert_eq!(models.len(), 1, "one model for two actors");
    for (i, (actor, _)) in actors.iter().enumerate() {
        let reply = call_t!(
            actor,
            EmbedMsg::Embed,
            60_000,
            EmbedRequest::new(i as u64, vec!["shared weights".to_owned()])
        )
        .unwrap();
        assert!(matches!(reply.outcome, EmbedOutcome::Embedded(_)));
    }
    for (actor, handle) in actors {
        actor.stop(None);
        handle.await.unwrap();
    }
    // The model threads drop their handles as their queues close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !models.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the model outlived its actors by 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The pipelined threads (what an actor on a GPU runs; `micro_batch` 0 on
/// the CPU): batches sent at once, more than the two the tokenizer may run
/// ahead, each come back whole, with their own id and the vectors the
/// encoder gives each text alone; the actor's info names its device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_actor_answers_every_batch_with_its_own_vectors() {
    let args = EmbedderArgs {
        micro_batch: 0,
        ..EmbedderArgs::new(model_dir().to_string_lossy())
    };
    let (embedder, handle) = Actor::spawn(None, Embedder::default(), args)
        .await
        .expect("model loads");
    let info = call_t!(embedder, EmbedMsg::Info, 5_000).unwrap();
    assert_eq!(
        (info.device.as_str(), info.precision.as_str()),
        ("cpu", "f32")
    );
    let batches: Vec<Vec<String>> = (0..6)
        .map(|b| {
            (0..5)
                .map(|i| format!("batch {b} text {i} {}", "word ".repeat(i * b)))
                .collect()
        })
        .collect();
    let calls = batches.iter().enumerate().map(|(b, texts)| {
        let embedder = embedder.clone();
        let texts = texts.clone();
        async move {
            call_t!(
                embedder,
                EmbedMsg::Embed,
                60_000,
                EmbedRequest::new(b as u64, texts)
            )
        }
    });
    let replies = futures::future::join_all(calls).await;
    let encoder = SentenceEncoder::load(model_dir(), &default_device()).unwrap();
    for (b, reply) in replies.into_iter().enumerate() {
        let reply = reply.unwrap();
        assert_eq!(reply.batch_id, b as u64);
        let EmbedOutcome::Embedded(v) = reply.outcome else {
            panic!("batch {b} not embedded: {:?}", reply.outcome);
        };
        for (i, t) in batches[b].iter().enumerate() {
            let alone = encoder.encode(&[t.as_str()]).unwrap();
            let diff = alone
                .row(0)
                .iter()
                .zip(&v.values[i * 384..(i + 1) * 384])
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "batch {b} {t:?} differs by {diff}");
        }
    }
    embedder.stop(None);
    handle.await.unwrap();
}

/// An embedder told to answer zeros (what the `feed` bench measures) says
/// so in its revision and in every answer, on both thread layouts, and
/// still tokenizes: `--dim` is honoured and the vectors are all zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedder_answering_zeros_says_so_in_its_revision() {
    for micro_batch in [4, 0] {
        let args = EmbedderArgs {
            micro_batch,
            zeros: true,
            dim: 32,
            // Nor does it read its CPU clocks (`node embed --no-cpu-time`).
            cpu_time: false,
            ..EmbedderArgs::new(model_dir().to_string_lossy())
        };
        let (embedder, handle) = Actor::spawn(None, Embedder::default(), args)
            .await
            .expect("model loads");
        let info = call_t!(embedder, EmbedMsg::Info, 5_000).unwrap();
        assert!(
            info.revision
                .starts_with(&format!("{ZEROS_REVISION_PREFIX}sha256:53aa5117")),
            "{}",
            info.revision
        );
        assert_eq!(info.dim, 32);
        let texts = vec!["one".to_owned(), "two words".to_owned(), String::new()];
        let reply = call_t!(
            embedder,
            EmbedMsg::Embed,
            60_000,
            EmbedRequest::new(3, texts)
        )
        .unwrap();
        assert_eq!(reply.work.cpu_us, 0, "no clock read, no CPU time");
        assert_eq!(reply.work.lengths.len(), 3, "lengths are still counted");
        let EmbedOutcome::Embedded(v) = reply.outcome else {
            panic!("not answered: {:?}", reply.outcome);
        };
        assert_eq!(v.revision, info.revision);
        assert_eq!((v.dim, v.values.len()), (32, 3 * 32));
        assert!(v.values.iter().all(|&x| x == 0.0));
        embedder.stop(None);
        handle.await.unwrap();
    }
}
