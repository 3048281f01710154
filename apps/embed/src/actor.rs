//! The embedding actor: a resident model that serves batches.
//!
//! The model is loaded once, in `pre_start`, on a thread of its own that
//! also runs every forward pass, so inference never blocks the async
//! runtime. Each batch is encoded in length-sorted micro-batches (less
//! padding, better cache use) and answered in request order, with the batch
//! id, the model revision and the dimension, so the caller can refuse a
//! result from other weights.
//!
//! ```text
//! caller ── Embed(EmbedRequest) ──► Embedder ──► model thread (rayon pool of `threads`)
//!        ◄─ EmbedReply ───────────────┘◄────────── vectors
//! ```

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::{EncodeError, SentenceEncoder, SharedModels, default_device};

/// Kind name under which nodes register [`Embedder`].
pub const KIND: &str = "flotilla.embedder";

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
}

/// Where to load the model from, and how to run it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct EmbedderArgs {
    /// The model folder, as seen by the node running the actor.
    pub model_dir: String,
    /// Threads of the model's kernels (1: one core per actor).
    pub threads: u32,
    /// Texts per forward pass after sorting by length.
    pub micro_batch: u32,
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

type Job = (u64, Texts, oneshot::Sender<EmbedReply>);

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
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("model_dir", &self.model_dir)
            .finish_non_exhaustive()
    }
}

/// The embedder's state: the queue to its model thread.
pub struct EmbedderState {
    jobs: mpsc::Sender<Job>,
    info: ModelInfo,
}

/// Embeds `texts` in length-sorted micro-batches, answering in input order:
/// what an [`Embedder`] runs for each batch.
pub fn embed_sorted<S: AsRef<str>>(
    encoder: &SentenceEncoder,
    texts: &[S],
    micro_batch: usize,
) -> Result<Vec<f32>, EncodeError> {
    let dim = encoder.dim();
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].as_ref().len());
    let mut values = vec![0.0f32; texts.len() * dim];
    for chunk in order.chunks(micro_batch.max(1)) {
        let refs: Vec<&str> = chunk.iter().map(|&i| texts[i].as_ref()).collect();
        let out = encoder.encode(&refs)?;
        for (row, &i) in chunk.iter().enumerate() {
            values[i * dim..(i + 1) * dim].copy_from_slice(out.row(row));
        }
    }
    Ok(values)
}

fn model_thread(
    encoder: std::sync::Arc<SentenceEncoder>,
    pool: rayon::ThreadPool,
    micro_batch: usize,
    jobs: mpsc::Receiver<Job>,
) {
    let revision = encoder.revision().to_string();
    let dim = encoder.dim() as u32;
    while let Ok((batch_id, texts, reply)) = jobs.recv() {
        // Fault injection: `embedder::encode=panic` kills this thread, and
        // with it the actor (see `Embedder::handle`).
        flotilla::fail::fail_point!("embedder::encode");
        let embedded = match &texts {
            Texts::Owned(texts) => pool.install(|| embed_sorted(&encoder, texts, micro_batch)),
            Texts::Object(bytes) => match bytes.archive::<Vec<String>>() {
                Ok(archived) => {
                    let texts: Vec<&str> = archived.iter().map(|s| s.as_str()).collect();
                    pool.install(|| embed_sorted(&encoder, &texts, micro_batch))
                }
                Err(e) => {
                    let _ = reply.send(EmbedReply {
                        batch_id,
                        outcome: EmbedOutcome::BadInput(e.to_string()),
                    });
                    continue;
                }
            },
        };
        let outcome = match embedded {
            Ok(values) => EmbedOutcome::Embedded(Vectors {
                revision: revision.clone(),
                dim,
                values,
            }),
            Err(EncodeError::Tokenize(e)) => EmbedOutcome::BadInput(e.to_string()),
            Err(e) => EmbedOutcome::Failed(e.to_string()),
        };
        let _ = reply.send(EmbedReply { batch_id, outcome });
    }
}

impl Embedder {
    /// The answer with its vectors moved into an object of this node's
    /// store, lent to the caller; unchanged if the store cannot take them.
    async fn lend_result(&self, answer: EmbedReply) -> EmbedReply {
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
                    object: objects.lend(object, RESULT_LEASE),
                }),
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
        _me: ActorRef<EmbedMsg>,
        args: EmbedderArgs,
    ) -> Result<EmbedderState, ActorProcessingErr> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (loaded_tx, loaded) = oneshot::channel::<Result<ModelInfo, String>>();
        let dir = self
            .model_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&args.model_dir));
        let models = self.models.clone();
        std::thread::Builder::new()
            .name("flotilla-embedder".into())
            .spawn(move || {
                let pool = match rayon::ThreadPoolBuilder::new()
                    .num_threads(args.threads.max(1) as usize)
                    .build()
                {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                match models.load(&dir, &default_device()) {
                    Ok(encoder) => {
                        let info = ModelInfo {
                            revision: encoder.revision().to_string(),
                            dim: encoder.dim() as u32,
                            load_ms: encoder.load_time().as_millis() as u64,
                        };
                        let _ = loaded_tx.send(Ok(info));
                        model_thread(encoder, pool, args.micro_batch as usize, queue);
                    }
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                    }
                }
            })?;
        let info = loaded
            .await
            .map_err(|_| "model thread ended while loading")?
            .map_err(|e| format!("cannot load the model: {e}"))?;
        tracing::info!(revision = %info.revision, load_ms = info.load_ms, "embedding model loaded");
        Ok(EmbedderState { jobs, info })
    }

    async fn handle(
        &self,
        _me: ActorRef<EmbedMsg>,
        msg: EmbedMsg,
        state: &mut EmbedderState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            EmbedMsg::Embed(req, reply) => {
                let batch_id = req.batch_id;
                let as_object = req.object.is_some();
                let texts = match req.object {
                    None => Texts::Owned(req.texts),
                    Some(object) => match self.read(&object).await {
                        Ok(bytes) => Texts::Object(bytes),
                        Err(reason) => {
                            // The driver may send it again (to another
                            // actor, or once the owner is reachable).
                            let _ = reply.send(EmbedReply {
                                batch_id,
                                outcome: EmbedOutcome::Failed(reason),
                            });
                            return Ok(());
                        }
                    },
                };
                let (tx, rx) = oneshot::channel();
                if state.jobs.send((batch_id, texts, tx)).is_err() {
                    return Err("model thread is gone".into());
                }
                // One batch at a time per actor: the caller's window decides
                // how many are queued here.
                let Ok(answer) = rx.await else {
                    // The model thread panicked: answer, then fail, so that
                    // a supervisor restarts the actor with its model
                    // reloaded instead of keeping a worker that fails every
                    // batch.
                    let _ = reply.send(EmbedReply {
                        batch_id,
                        outcome: EmbedOutcome::Failed("the model thread panicked".into()),
                    });
                    return Err("the model thread panicked".into());
                };
                let answer = if as_object {
                    self.lend_result(answer).await
                } else {
                    answer
                };
                let _ = reply.send(answer);
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
/// names; without, the job's `--model` path as seen on this node. The
/// node's embedders share one loaded model per folder.
pub fn register(
    builder: flotilla::NodeBuilder,
    model_dir: Option<PathBuf>,
) -> flotilla::NodeBuilder {
    let node = builder.node_handle();
    let models = SharedModels::default();
    builder.register(KIND, move || Embedder {
        model_dir: model_dir.clone(),
        node: Some(node.clone()),
        models: models.clone(),
    })
}

/// Default time a caller should allow for one batch.
pub const BATCH_DEADLINE: Duration = Duration::from_secs(120);
