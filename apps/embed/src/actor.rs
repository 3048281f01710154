//! The embedding actor: a resident model that serves batches.
//!
//! The model is loaded once, in `pre_start`, on a thread of its own that
//! also runs every forward pass, so inference never blocks the async
//! runtime. Each batch is encoded in length-sorted micro-batches (less
//! padding, better cache use) and answered in request order, with the batch
//! id, the model revision and the dimension, so the caller can refuse a
//! result from other weights.
//!
//! The actor runs on the CPU or on one GPU of its node (see
//! [`crate::devices`]). On a GPU a batch is one forward pass, and a
//! tokenizer thread with a pool of its own prepares the next batch while
//! the GPU runs the current one.
//!
//! ```text
//! CPU: caller ── Embed ──► Embedder ──► model thread: tokenize + encode (rayon pool of `threads`)
//! GPU (or micro_batch 0): caller ── Embed ──► Embedder ──► tokenizer thread ──(2 batches)──► forward thread ──► GPU
//!             ◄─ EmbedReply ──────────────────────────────────────────────┘
//! ```

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use flotilla::ActorKind;
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla_proto::roots::AllowedRoots;
use tokio::sync::oneshot;

use crate::devices::{DeviceChoice, cuda_devices};
use crate::{EncodeError, Precision, Prompt, SentenceEncoder, SharedModels, TokenBatch};

/// The kind nodes register [`Embedder`] as.
pub const KIND: ActorKind<EmbedMsg, EmbedderArgs> = ActorKind::new("flotilla.embedder");

/// Texts to embed, identified by the caller's stable batch id.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct EmbedRequest {
    /// Stable id of the batch within its job.
    pub batch_id: u64,
    /// The texts, in order (empty when they are in `object`).
    pub texts: Vec<String>,
    /// An object holding the texts as an archived `Vec<String>`, read in
    /// place on the caller's host and pulled elsewhere, instead of `texts`.
    pub object: Option<flotilla::ObjectRef>,
}

impl EmbedRequest {
    /// A request carrying its texts.
    pub fn new(batch_id: u64, texts: Vec<String>) -> Self {
        Self {
            batch_id,
            texts,
            object: None,
        }
    }
}

/// The answer to an [`EmbedRequest`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct EmbedReply {
    /// The request's batch id.
    pub batch_id: u64,
    /// What happened.
    pub outcome: EmbedOutcome,
    /// What the actor did with the batch (empty when it was not embedded).
    pub work: Work,
}

/// What an actor did with one batch: each text's length in tokens, the
/// padding, and the time of each stage.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Work {
    /// Each text's tokens (prompt and special tokens included), in the
    /// order the batch was tokenized.
    pub lengths: Vec<u32>,
    /// Tokens the model ran over, padding included.
    pub padded_tokens: u64,
    /// Microseconds the batch waited at the actor before its threads took
    /// it.
    pub queue_us: u64,
    /// Microseconds its tokenization took.
    pub tokenization_us: u64,
    /// Microseconds of the model's forward passes.
    pub inference_us: u64,
    /// CPU microseconds the actor's threads spent on it.
    pub cpu_us: u64,
}

impl EmbedReply {
    /// An answer with no work to report.
    pub fn new(batch_id: u64, outcome: EmbedOutcome) -> Self {
        Self {
            batch_id,
            outcome,
            work: Work::default(),
        }
    }
}

/// Microseconds in `d`.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// CPU time of `pool`'s threads together (called from outside the pool).
fn pool_cpu(pool: &rayon::ThreadPool) -> Duration {
    pool.broadcast(|_| thread_cpu()).into_iter().sum()
}

/// Result of one batch.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub enum EmbedOutcome {
    /// One normalised vector per text, row-major `texts.len() × dim`.
    Embedded(Vectors),
    /// The same as an object of the actor's node holding the archived
    /// [`Vectors`], lent to the caller until it releases it (see
    /// [`RESULT_LEASE`]); the answer to a request that carried its texts as
    /// an object.
    EmbeddedObject(VectorsObject),
    /// The input cannot be embedded (the tokenizer refused it): do not retry.
    BadInput(String),
    /// The model failed (backend error): retry elsewhere.
    Failed(String),
}

/// Vectors of one batch and the identity of the model that made them.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Vectors {
    /// The model revision (`sha256:…` of the weights).
    pub revision: String,
    /// Width of each vector.
    pub dim: u32,
    /// `rows × dim` values.
    pub values: Vec<f32>,
}

/// Where a batch's vectors are, and what they claim to be.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct VectorsObject {
    /// The model revision (`sha256:…` of the weights).
    pub revision: String,
    /// Width of each vector.
    pub dim: u32,
    /// Vectors in the object.
    pub rows: u32,
    /// The object: an archived [`Vectors`].
    pub object: flotilla::ObjectRef,
}

/// Texts per forward pass on the CPU unless told otherwise.
pub const DEFAULT_MICRO_BATCH: usize = 16;

/// How long an embedder's node keeps a result object for a caller that
/// does not release it (its node died, say).
pub const RESULT_LEASE: Duration = Duration::from_secs(600);

/// What an embedder reports about its model.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct ModelInfo {
    /// The model revision.
    pub revision: String,
    /// Width of the vectors.
    pub dim: u32,
    /// How long the model took to load, in milliseconds.
    pub load_ms: u64,
    /// The device it runs on: `cpu` or `cuda:N`.
    pub device: String,
    /// The float type of its dense layers (`f32`, `f16`, `bf16`).
    pub precision: String,
    /// The prompt before every text (`""`: none).
    pub prompt: String,
    /// The similarity function the model was trained for (`""`: the
    /// folder names none).
    pub similarity: String,
}

/// Where to load the model from, and how to run it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct EmbedderArgs {
    /// The model folder, as seen by the node running the actor.
    pub model_dir: String,
    /// Threads of the model's kernels (1: one core per actor).
    pub threads: u32,
    /// Texts per forward pass after sorting by length, on the CPU. 0, and
    /// always on a GPU: a batch is one forward pass, tokenized on the
    /// actor's pool while the batch before runs (the pipelined threads).
    pub micro_batch: u32,
    /// Where to run: `auto` (a GPU of the node if it has one, else the
    /// CPU), `cpu` or `cuda` (see [`DeviceChoice`]).
    pub device: String,
    /// The float type of the dense layers: `f32`, `f16` or `bf16`.
    pub precision: String,
    /// Prepended to every text (none: see `prompt_name`).
    pub prompt: Option<String>,
    /// One of the folder's named prompts (none: the folder's default
    /// prompt, if it names one).
    pub prompt_name: Option<String>,
    /// Dimensions kept of each vector, renormalised (0: all).
    pub dim: u32,
    /// Answer vectors of zeros without running the forward pass: what
    /// measures the job's CPU side alone (reading, tokenizing, batching,
    /// routing, writing). The revision reported is the weights' with
    /// [`ZEROS_REVISION_PREFIX`] before it, so such vectors are never taken
    /// for, nor resumed as, the model's.
    pub zeros: bool,
    /// Read the CPU clocks of the actor's threads around each batch, so
    /// that its answer says the CPU time the batch took ([`Work::cpu_us`];
    /// 0 when off).
    pub cpu_time: bool,
}

/// What starts the revision an actor reports when it answers vectors of
/// zeros ([`EmbedderArgs::zeros`]).
pub const ZEROS_REVISION_PREFIX: &str = "zeros-no-forward:";

impl EmbedderArgs {
    /// Arguments for the model in `model_dir`: one thread, micro-batches of
    /// 16, on a GPU where the node has one, in `f32`.
    pub fn new(model_dir: impl Into<String>) -> Self {
        Self {
            model_dir: model_dir.into(),
            threads: 1,
            micro_batch: DEFAULT_MICRO_BATCH as u32,
            device: DeviceChoice::Auto.to_string(),
            precision: Precision::F32.to_string(),
            prompt: None,
            prompt_name: None,
            dim: 0,
            zeros: false,
            cpu_time: true,
        }
    }
}

flotilla::remote_type!(EmbedRequest, EmbedReply, ModelInfo, EmbedderArgs);

/// Messages of [`Embedder`].
#[derive(RactorClusterMessage)]
pub enum EmbedMsg {
    /// Embed a batch.
    #[rpc]
    Embed(EmbedRequest, RpcReplyPort<EmbedReply>),
    /// Describe the loaded model.
    #[rpc]
    Info(RpcReplyPort<ModelInfo>),
}

/// A batch's texts as the model thread reads them.
enum Texts {
    /// Carried in the request.
    Owned(Vec<String>),
    /// An archived `Vec<String>` in shared memory, read in place.
    Object(flotilla::ObjectBytes),
}

/// A batch for the model's thread: its id, its texts, and where its
/// reply goes.
struct Job {
    batch_id: u64,
    texts: Texts,
    reply: oneshot::Sender<EmbedReply>,
    /// When the actor took it.
    queued: std::time::Instant,
}

/// A resident embedding model.
#[derive(Clone, Default)]
pub struct Embedder {
    /// The node's own model folder: when set, it is loaded instead of the
    /// folder named in [`EmbedderArgs::model_dir`].
    pub model_dir: Option<PathBuf>,
    /// The node the actor runs on, whose object store reads requests that
    /// carry their texts as an object.
    pub node: Option<flotilla::NodeHandle>,
    /// The models of the actor's node: actors sharing this set and naming
    /// the same folder share one loaded model.
    pub models: SharedModels,
    /// The GPUs of the actor's node: an actor that runs on a GPU holds
    /// the least-held one (none: the CPU).
    pub gpus: flotilla::gpus::GpuSlots,
    /// What a spawn may ask of the node, for actors its peers spawn.
    /// `None`: any model folder and thread count (actors a program spawns
    /// itself).
    pub limits: Option<PeerLimits>,
}

/// What an embedder spawned by a peer may ask of its node.
#[derive(Clone, Debug)]
pub struct PeerLimits {
    /// Where a folder named in [`EmbedderArgs::model_dir`] must lie (as
    /// named, and with its links resolved) for the actor to load it: the
    /// node's allowed roots.
    pub model_roots: AllowedRoots,
    /// The node's cores: a spawn may ask for [`MAX_THREADS_PER_CORE`]
    /// kernel threads per core at most.
    pub cores: usize,
}

impl PeerLimits {
    /// The limits of a node allowing `model_roots`, with the cores this
    /// machine has.
    pub fn on_this_machine(model_roots: AllowedRoots) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self { model_roots, cores }
    }

    /// Why a spawn's `args` ask more than these limits allow: too many
    /// threads, or (when the actor loads the folder the spawn names,
    /// `loads_named`) a model folder outside the roots.
    pub fn check(&self, args: &EmbedderArgs, loads_named: bool) -> Result<(), String> {
        check_threads(args.threads, self.cores)?;
        if loads_named {
            check_model_dir(&self.model_roots, &args.model_dir)?;
        }
        Ok(())
    }
}

/// Most kernel threads a peer may ask of one actor, per core of the node.
pub const MAX_THREADS_PER_CORE: u32 = 2;

/// Why an actor a peer spawned refuses `threads` kernel threads on a node
/// of `cores` cores: more than [`MAX_THREADS_PER_CORE`] per core.
pub fn check_threads(threads: u32, cores: usize) -> Result<(), String> {
    let most = (cores as u32).max(1).saturating_mul(MAX_THREADS_PER_CORE);
    if threads > most {
        return Err(format!(
            "{threads} threads refused: this node has {cores} cores, and an actor may ask for {most} at most ({MAX_THREADS_PER_CORE} per core)"
        ));
    }
    Ok(())
}

/// Why an actor refuses the model folder `dir` its spawn named: not under
/// `roots` as named, or with its links resolved.
pub fn check_model_dir(roots: &AllowedRoots, dir: &str) -> Result<(), String> {
    let refused = |why: flotilla_proto::roots::NotAllowed| {
        format!(
            "model folder {dir:?} refused: {why} (a node loads the models jobs name only under the roots it allows, --allow-path or [jobs] allow; or give it its own with --model)"
        )
    };
    roots.check("model", dir).map_err(refused)?;
    if let Ok(real) = std::fs::canonicalize(dir) {
        roots.check_local("model", &real).map_err(refused)?;
    }
    Ok(())
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("model_dir", &self.model_dir)
            .finish_non_exhaustive()
    }
}

/// The embedder's state: the queue to its model thread, and the GPU it
/// holds while it lives.
pub struct EmbedderState {
    jobs: mpsc::Sender<Job>,
    info: ModelInfo,
    /// Whether batches run on the pipelined threads (answered as they
    /// finish, the next one taken meanwhile).
    pipelined: bool,
    _gpu: Option<flotilla::gpus::GpuSlot>,
}

/// A batch tokenized: its micro-batches, each with the input positions of
/// its rows, in the order they run.
struct Prepared {
    rows: usize,
    parts: Vec<(Vec<usize>, TokenBatch)>,
    /// What was done with it so far.
    work: Work,
}

/// Tokenizes `texts` in length-sorted micro-batches of `micro_batch`, with
/// `prompt` before each.
fn prepare<S: AsRef<str>>(
    encoder: &SentenceEncoder,
    prompt: &Prompt,
    texts: &[S],
    micro_batch: usize,
) -> Result<Prepared, crate::TokenizeError> {
    // Fault injection: `embedder::poison=return(MARK)` panics the model
    // thread, and with it the actor, on any batch holding a text that
    // contains MARK: a row the model cannot take.
    if let Some(Some(mark)) = flotilla::fail::eval("embedder::poison", |mark| mark)
        && texts.iter().any(|t| t.as_ref().contains(mark.as_str()))
    {
        panic!("embedder::poison: a text holds {mark:?}");
    }
    let started = std::time::Instant::now();
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].as_ref().len());
    let parts: Vec<(Vec<usize>, TokenBatch)> = order
        .chunks(micro_batch.max(1))
        .map(|chunk| {
            let refs: Vec<&str> = chunk.iter().map(|&i| texts[i].as_ref()).collect();
            Ok((chunk.to_vec(), encoder.tokenize_prompted(&refs, prompt)?))
        })
        .collect::<Result<_, crate::TokenizeError>>()?;
    let mut work = Work {
        tokenization_us: micros(started.elapsed()),
        ..Work::default()
    };
    for (_, t) in &parts {
        work.padded_tokens += (t.batch * t.seq_len) as u64;
        work.lengths.extend(
            t.mask
                .chunks(t.seq_len.max(1))
                .map(|row| row.iter().filter(|&&m| m != 0).count() as u32),
        );
    }
    Ok(Prepared {
        rows: texts.len(),
        parts,
        work,
    })
}

/// Runs a prepared batch, answering in input order with `dim` dimensions
/// of each vector.
fn encode_prepared(
    encoder: &SentenceEncoder,
    dim: usize,
    prepared: &Prepared,
) -> Result<Vec<f32>, crate::BackendError> {
    let mut values = vec![0.0f32; prepared.rows * dim];
    for (rows, tokens) in &prepared.parts {
        let out = encoder.encode_tokens(tokens)?.truncated(dim);
        for (row, &i) in rows.iter().enumerate() {
            values[i * dim..(i + 1) * dim].copy_from_slice(out.row(row));
        }
    }
    Ok(values)
}

/// Embeds `texts` in length-sorted micro-batches, answering in input order:
/// what an [`Embedder`] runs for each batch (with the folder's default
/// prompt and every dimension).
pub fn embed_sorted<S: AsRef<str>>(
    encoder: &SentenceEncoder,
    texts: &[S],
    micro_batch: usize,
) -> Result<Vec<f32>, EncodeError> {
    let prompt = encoder.prompt(encoder.folder().default_prompt())?;
    let prepared = prepare(encoder, &prompt, texts, micro_batch)?;
    Ok(encode_prepared(encoder, encoder.dim(), &prepared)?)
}

/// Tokenizes a job's texts; `None` when the job was answered already (its
/// input cannot be embedded).
fn prepare_job(
    encoder: &SentenceEncoder,
    prompt: &Prompt,
    batch_id: u64,
    texts: &Texts,
    micro_batch: usize,
    reply: &mut Option<oneshot::Sender<EmbedReply>>,
) -> Option<Prepared> {
    let prepared = match texts {
        Texts::Owned(texts) => {
            prepare(encoder, prompt, texts, micro_batch).map_err(|e| e.to_string())
        }
        Texts::Object(bytes) => match bytes.archive::<Vec<String>>() {
            Ok(archived) => {
                let texts: Vec<&str> = archived.iter().map(|s| s.as_str()).collect();
                prepare(encoder, prompt, &texts, micro_batch).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        },
    };
    match prepared {
        Ok(p) => Some(p),
        Err(reason) => {
            if let Some(reply) = reply.take() {
                let _ = reply.send(EmbedReply::new(batch_id, EmbedOutcome::BadInput(reason)));
            }
            None
        }
    }
}

/// Runs a prepared batch (or, told to answer zeros, does not): the
/// answer, with what was done.
fn answer(
    encoder: &SentenceEncoder,
    output: &Output,
    batch_id: u64,
    prepared: &Prepared,
) -> EmbedReply {
    // Fault injection: `embedder::encode=panic` kills the model thread,
    // and with it the actor (see `Embedder::handle`).
    flotilla::fail::fail_point!("embedder::encode");
    let (dim, revision) = (output.dim, &output.revision);
    let started = std::time::Instant::now();
    let encoded = if output.zeros {
        Ok(vec![0.0f32; prepared.rows * dim])
    } else {
        encode_prepared(encoder, dim, prepared)
    };
    if output.slowdown > 1 {
        // A straggler: a machine this many times slower.
        std::thread::sleep(started.elapsed() * (output.slowdown - 1));
    }
    let outcome = match encoded {
        Ok(values) => EmbedOutcome::Embedded(Vectors {
            revision: revision.to_owned(),
            dim: dim as u32,
            values,
        }),
        Err(e) => EmbedOutcome::Failed(e.to_string()),
    };
    let mut work = prepared.work.clone();
    work.inference_us = micros(started.elapsed());
    EmbedReply {
        batch_id,
        outcome,
        work,
    }
}

/// What the actor makes of each batch: the prompt before every text, its
/// length measured once, and what it answers.
struct Shaping {
    prompt: Prompt,
    output: Output,
    /// Whether each answer says the CPU time its batch took.
    cpu_time: bool,
}

/// What an actor's answers hold: `dim` dimensions of each vector, made by
/// the weights of `revision`, or zeros without a forward pass.
#[derive(Clone)]
struct Output {
    dim: usize,
    revision: String,
    zeros: bool,
    /// How many times slower than the model the actor answers (1: as
    /// fast as it can; more under the failpoint `embedder::slow`).
    slowdown: u32,
}

/// The CPU's model thread: tokenizes and encodes each batch in the actor's
/// pool.
fn model_thread(
    encoder: std::sync::Arc<SentenceEncoder>,
    shaping: Shaping,
    pool: rayon::ThreadPool,
    micro_batch: usize,
    jobs: mpsc::Receiver<Job>,
) {
    while let Ok(Job {
        batch_id,
        texts,
        reply,
        queued,
    }) = jobs.recv()
    {
        let mut reply = Some(reply);
        let waited = micros(queued.elapsed());
        let cpu = shaping.cpu_time.then(|| pool_cpu(&pool));
        let answered = pool.install(|| {
            let prepared = prepare_job(
                &encoder,
                &shaping.prompt,
                batch_id,
                &texts,
                micro_batch,
                &mut reply,
            )?;
            Some(answer(&encoder, &shaping.output, batch_id, &prepared))
        });
        if let (Some(mut answered), Some(reply)) = (answered, reply) {
            answered.work.queue_us = waited;
            if let Some(cpu) = cpu {
                answered.work.cpu_us = micros(pool_cpu(&pool).saturating_sub(cpu));
            }
            let _ = reply.send(answered);
        }
    }
}

/// The pipelined model threads (what a GPU runs): this one tokenizes each
/// batch in `pool` while the model thread it starts runs the batch before
/// as one forward pass, up to two batches ahead.
fn pipelined_threads(
    encoder: std::sync::Arc<SentenceEncoder>,
    shaping: Shaping,
    pool: rayon::ThreadPool,
    jobs: mpsc::Receiver<Job>,
) {
    let (output, cpu_time) = (shaping.output.clone(), shaping.cpu_time);
    let (ready, queue) = mpsc::sync_channel::<(u64, Prepared, oneshot::Sender<EmbedReply>)>(2);
    let model = std::sync::Arc::clone(&encoder);
    let runner = std::thread::Builder::new()
        .name("flotilla-forward".into())
        .spawn(move || {
            while let Ok((batch_id, prepared, reply)) = queue.recv() {
                let cpu = cpu_time.then(thread_cpu);
                let mut answered = answer(&model, &output, batch_id, &prepared);
                if let Some(cpu) = cpu {
                    answered.work.cpu_us += micros(thread_cpu().saturating_sub(cpu));
                }
                let _ = reply.send(answered);
            }
        });
    if let Err(e) = runner {
        tracing::error!(error = %e, "cannot start the forward-pass thread");
        return;
    }
    while let Ok(Job {
        batch_id,
        texts,
        reply,
        queued,
    }) = jobs.recv()
    {
        let mut reply = Some(reply);
        let waited = micros(queued.elapsed());
        let cpu = shaping.cpu_time.then(|| pool_cpu(&pool));
        // A batch is one forward pass on a GPU.
        let prepared = pool.install(|| {
            prepare_job(
                &encoder,
                &shaping.prompt,
                batch_id,
                &texts,
                usize::MAX,
                &mut reply,
            )
        });
        let prepared = prepared.map(|mut p| {
            p.work.queue_us = waited;
            if let Some(cpu) = cpu {
                p.work.cpu_us = micros(pool_cpu(&pool).saturating_sub(cpu));
            }
            p
        });
        if let (Some(prepared), Some(reply)) = (prepared, reply)
            && ready.send((batch_id, prepared, reply)).is_err()
        {
            // The forward-pass thread ended (it panicked): dropping the
            // queue ends the actor's batches as failed.
            return;
        }
    }
}

impl Embedder {
    /// Waits for the model threads' answer to batch `batch_id` and sends
    /// it to the caller (its vectors lent as an object when the batch came
    /// as one). When the threads dropped the batch (they panicked), the
    /// caller is told the batch failed and the error says why.
    async fn deliver(
        &self,
        batch_id: u64,
        as_object: Option<String>,
        answer: oneshot::Receiver<EmbedReply>,
        reply: RpcReplyPort<EmbedReply>,
    ) -> Result<(), &'static str> {
        const PANICKED: &str = "the model thread panicked";
        let Ok(answer) = answer.await else {
            let _ = reply.send(EmbedReply::new(
                batch_id,
                EmbedOutcome::Failed(PANICKED.into()),
            ));
            return Err(PANICKED);
        };
        let answer = match as_object {
            Some(borrower) => self.lend_result(answer, &borrower).await,
            None => answer,
        };
        let _ = reply.send(answer);
        Ok(())
    }

    /// The answer with its vectors moved into an object of this node's
    /// store, lent to `borrower` (the caller: the owner of the request's
    /// texts object); unchanged if the store cannot take them.
    async fn lend_result(&self, answer: EmbedReply, borrower: &str) -> EmbedReply {
        let (EmbedOutcome::Embedded(vectors), Some(node)) = (
            &answer.outcome,
            self.node.as_ref().and_then(flotilla::NodeHandle::get),
        ) else {
            return answer;
        };
        let objects = node.objects();
        match objects.put_archive(vectors).await {
            Ok(object) => EmbedReply {
                batch_id: answer.batch_id,
                outcome: EmbedOutcome::EmbeddedObject(VectorsObject {
                    revision: vectors.revision.clone(),
                    dim: vectors.dim,
                    rows: (vectors.values.len() / vectors.dim.max(1) as usize) as u32,
                    object: objects.lend(object, borrower, RESULT_LEASE),
                }),
                work: answer.work.clone(),
            },
            Err(e) => {
                tracing::warn!(error = %e, "result sent inline: the object store did not take it");
                answer
            }
        }
    }

    /// The bytes of a request's texts object, through this node's store.
    async fn read(&self, object: &flotilla::ObjectRef) -> Result<flotilla::ObjectBytes, String> {
        let node = self
            .node
            .as_ref()
            .and_then(flotilla::NodeHandle::get)
            .ok_or("this embedder runs outside a node: it cannot read objects")?;
        node.objects().get(object).await.map_err(|e| e.to_string())
    }
}

impl Actor for Embedder {
    type Msg = EmbedMsg;
    type State = EmbedderState;
    type Arguments = EmbedderArgs;

    async fn pre_start(
        &self,
        me: ActorRef<EmbedMsg>,
        args: EmbedderArgs,
    ) -> Result<EmbedderState, ActorProcessingErr> {
        let choice: DeviceChoice = args.device.parse()?;
        let precision: Precision = args.precision.parse()?;
        let choice = if precision.cpu_only() && choice == DeviceChoice::Auto {
            DeviceChoice::Cpu
        } else {
            choice
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        type Loaded = Result<(ModelInfo, Option<flotilla::gpus::GpuSlot>, bool), String>;
        let (loaded_tx, loaded) = oneshot::channel::<Loaded>();
        if let Some(limits) = &self.limits {
            limits.check(&args, self.model_dir.is_none())?;
        }
        let dir = self
            .model_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&args.model_dir));
        let models = self.models.clone();
        let gpus = self.gpus.clone();
        let holder = format!(
            "{KIND} {}",
            me.get_name().unwrap_or_else(|| me.get_id().to_string())
        );
        std::thread::Builder::new()
            .name("flotilla-embedder".into())
            .spawn(move || {
                // CUDA is looked for only where a GPU may be used.
                let found = if choice == DeviceChoice::Cpu || gpus.count() == 0 {
                    Vec::new()
                } else {
                    cuda_devices()
                };
                let chosen = match crate::devices::choose(choice, &gpus, &found, &holder) {
                    Ok(chosen) => chosen,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                if let Some(why) = &chosen.fallback {
                    tracing::warn!(reason = %why, "embedding actor runs on the CPU");
                }
                let on_gpu = chosen.slot.is_some();
                // On a GPU the actor's threads tokenize: a share of the
                // machine's cores per GPU, one left for the GPU threads.
                let threads = if on_gpu {
                    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                    (cpus / gpus.count().max(1)).saturating_sub(1).max(1)
                } else {
                    args.threads.max(1) as usize
                };
                let pool = match rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("flotilla-embed-{i}"))
                    .build()
                {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let encoder = match models.load(&dir, &chosen.device, precision) {
                    Ok(encoder) => encoder,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                if on_gpu {
                    // The first batch compiles the GPU kernels: a driver or
                    // NVRTC that fails there fails the load, not a batch.
                    let warm = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        encoder.encode(&["warm up"])
                    }));
                    let failed = match warm {
                        Ok(Ok(_)) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(panic) => Some(
                            panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "the CUDA backend panicked".into()),
                        ),
                    };
                    if let Some(e) = failed {
                        let _ = loaded_tx.send(Err(format!("{} failed: {e}", chosen.label)));
                        return;
                    }
                }
                let options = match encoder.folder().embed_options(
                    args.prompt.as_deref(),
                    args.prompt_name.as_deref(),
                    (args.dim > 0).then_some(args.dim as usize),
                ) {
                    Ok(options) => options,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let revision = match args.zeros {
                    false => encoder.revision().to_string(),
                    true => format!("{ZEROS_REVISION_PREFIX}{}", encoder.revision()),
                };
                let shaping = match encoder.prompt(&options.prompt) {
                    Ok(prompt) => Shaping {
                        prompt,
                        output: Output {
                            dim: options.dim,
                            revision: revision.clone(),
                            zeros: args.zeros,
                            // Fault injection: `embedder::slow=1*return(10)->off`
                            // makes the first actor started 10 times slower.
                            slowdown: flotilla::fail::eval("embedder::slow", |n| {
                                n.and_then(|n| n.parse::<u32>().ok())
                            })
                            .flatten()
                            .unwrap_or(1)
                            .max(1),
                        },
                        cpu_time: args.cpu_time,
                    },
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let pipelined = on_gpu || args.micro_batch == 0;
                let info = ModelInfo {
                    revision,
                    dim: options.dim as u32,
                    load_ms: encoder.load_time().as_millis() as u64,
                    device: chosen.label.clone(),
                    precision: precision.to_string(),
                    prompt: options.prompt.clone(),
                    similarity: encoder.folder().similarity.clone().unwrap_or_default(),
                };
                if loaded_tx.send(Ok((info, chosen.slot, pipelined))).is_err() {
                    return;
                }
                if pipelined {
                    pipelined_threads(encoder, shaping, pool, queue);
                } else {
                    model_thread(encoder, shaping, pool, args.micro_batch as usize, queue);
                }
            })?;
        let (info, gpu, pipelined) = loaded
            .await
            .map_err(|_| "model thread ended while loading")?
            .map_err(|e| format!("cannot load the model: {e}"))?;
        tracing::info!(
            revision = %info.revision,
            load_ms = info.load_ms,
            device = %info.device,
            precision = %info.precision,
            "embedding model loaded"
        );
        Ok(EmbedderState {
            jobs,
            info,
            pipelined,
            _gpu: gpu,
        })
    }

    async fn handle(
        &self,
        me: ActorRef<EmbedMsg>,
        msg: EmbedMsg,
        state: &mut EmbedderState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            EmbedMsg::Embed(req, reply) => {
                let batch_id = req.batch_id;
                // Results go back as objects to a caller that sent its texts
                // as one, lent to it.
                let as_object = req.object.as_ref().map(|o| o.owner.clone());
                let texts = match req.object {
                    None => Texts::Owned(req.texts),
                    Some(object) => match self.read(&object).await {
                        Ok(bytes) => Texts::Object(bytes),
                        Err(reason) => {
                            // The driver may send it again (to another
                            // actor, or once the owner is reachable).
                            let _ =
                                reply.send(EmbedReply::new(batch_id, EmbedOutcome::Failed(reason)));
                            return Ok(());
                        }
                    },
                };
                let (tx, rx) = oneshot::channel();
                if state
                    .jobs
                    .send(Job {
                        batch_id,
                        texts,
                        reply: tx,
                        queued: std::time::Instant::now(),
                    })
                    .is_err()
                {
                    return Err("model thread is gone".into());
                }
                if state.pipelined {
                    // The next batch is taken (and tokenized) while this one
                    // runs: its answer is sent from a task of its own. A
                    // forward-pass thread that panicked stops the actor, so
                    // that its supervisor restarts it with the model
                    // reloaded.
                    let this = self.clone();
                    tokio::spawn(async move {
                        if let Err(why) = this.deliver(batch_id, as_object, rx, reply).await {
                            me.stop(Some(why.into()));
                        }
                    });
                    return Ok(());
                }
                // One batch at a time per actor: the caller's window decides
                // how many are queued here. A model thread that panicked
                // fails the actor, so that a supervisor restarts it with
                // its model reloaded instead of keeping a worker that fails
                // every batch.
                self.deliver(batch_id, as_object, rx, reply).await?;
            }
            EmbedMsg::Info(reply) => {
                let _ = reply.send(state.info.clone());
            }
        }
        Ok(())
    }
}

/// Registers [`Embedder`] under [`KIND`] on a node builder. With
/// `model_dir`, the node's embedders load that folder whatever the job
/// names; without, the job's `--model` path as seen on this node, which
/// must lie under `roots` (the node's allowed roots), as named and with
/// its links resolved: a spawn naming any other folder fails, naming the
/// setting. The node's embedders share one loaded model per folder, and
/// each takes one of the node's GPUs when it runs on one.
pub fn register(
    builder: flotilla::NodeBuilder,
    model_dir: Option<PathBuf>,
    roots: AllowedRoots,
) -> flotilla::NodeBuilder {
    let node = builder.node_handle();
    let gpus = builder.gpu_slots();
    let models = SharedModels::default();
    let limits = PeerLimits::on_this_machine(roots);
    builder.register(KIND, move || Embedder {
        model_dir: model_dir.clone(),
        node: Some(node.clone()),
        models: models.clone(),
        gpus: gpus.clone(),
        limits: Some(limits.clone()),
    })
}

/// Default time a caller should allow for one batch.
pub const BATCH_DEADLINE: Duration = Duration::from_secs(120);
