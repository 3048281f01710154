//! How the job talks to embedding actors: one [`EmbedRequest`] per batch,
//! and a result accepted only with the job's batch id, revision and width.

use flotilla::pipeline::{BatchId, RpcReplyPort, Stage, Verdict};

use crate::actor::{EmbedMsg, EmbedOutcome, EmbedReply, EmbedRequest, Work};
use flotilla_data::Row;

/// A batch's vectors as the pipeline hands them over: in the reply, or in
/// an object lent by the actor's node, read (and then released) when the
/// part is written.
#[derive(Debug)]
pub(crate) enum Output {
    /// In the reply, with what the actor did.
    Values(Vec<f32>, Work),
    /// In an object holding an archived `Vectors`, with what the actor
    /// did.
    Object(flotilla::ObjectRef, Work),
}

/// A batch held while in flight.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Its rows; their texts are empty once in [`Batch::object`].
    pub(crate) rows: Vec<Row>,
    /// The texts as an object in the driver's store, once put there:
    /// held until the batch is done, so that every retry reads the same
    /// object.
    pub(crate) object: Option<flotilla::Object>,
}

impl AsRef<[Row]> for Batch {
    fn as_ref(&self) -> &[Row] {
        &self.rows
    }
}

impl Batch {
    /// Moves the texts into an object of `objects`' store, which actors
    /// read in place on this host or pull from it.
    pub(crate) async fn put_texts(
        &mut self,
        objects: &flotilla::Objects,
    ) -> Result<(), flotilla::ObjectsError> {
        let texts: Vec<String> = self
            .rows
            .iter_mut()
            .map(|r| std::mem::take(&mut r.text))
            .collect();
        match objects.put_archive(&texts).await {
            Ok(object) => {
                self.object = Some(object);
                Ok(())
            }
            Err(e) => {
                // The texts go back in the rows, for the request to carry.
                for (row, text) in self.rows.iter_mut().zip(texts) {
                    row.text = text;
                }
                Err(e)
            }
        }
    }

    /// The texts for a request: empty when they are in the object.
    fn texts(&self) -> Vec<String> {
        match self.object {
            Some(_) => Vec::new(),
            None => self.rows.iter().map(|r| r.text.clone()).collect(),
        }
    }

    /// Bytes of the batch's texts, wherever they are.
    fn text_bytes(&self) -> usize {
        match &self.object {
            Some(object) => object.reference().size as usize,
            None => self.rows.iter().map(|r| r.text.len()).sum(),
        }
    }
}

/// The embed job's [`Stage`].
pub(crate) struct EmbedStage {
    pub(crate) revision: String,
    pub(crate) dim: u32,
}

impl Stage for EmbedStage {
    type Msg = EmbedMsg;
    type Batch = Batch;
    type Reply = EmbedReply;
    type Output = Output;

    fn request(&self, id: BatchId, batch: &Batch, reply: RpcReplyPort<EmbedReply>) -> EmbedMsg {
        EmbedMsg::Embed(
            EmbedRequest {
                batch_id: id.0,
                texts: batch.texts(),
                object: batch.object.as_ref().map(|o| o.reference().clone()),
            },
            reply,
        )
    }

    fn judge(&self, id: BatchId, batch: &Batch, reply: EmbedReply) -> Verdict<Output> {
        match reply {
            EmbedReply {
                batch_id,
                outcome: EmbedOutcome::Embedded(v),
                work,
            } if batch_id == id.0
                && v.revision == self.revision
                && v.dim == self.dim
                && v.values.len() == batch.rows.len() * self.dim as usize =>
            {
                Verdict::Done(Output::Values(v.values, work))
            }
            EmbedReply {
                batch_id,
                outcome: EmbedOutcome::EmbeddedObject(v),
                work,
            } if batch_id == id.0
                && v.revision == self.revision
                && v.dim == self.dim
                && v.rows as usize == batch.rows.len() =>
            {
                Verdict::Done(Output::Object(v.object, work))
            }
            EmbedReply {
                outcome: EmbedOutcome::BadInput(reason),
                ..
            } => Verdict::BadInput(reason),
            other => Verdict::Retry(format!("refused a result: {}", describe(&other))),
        }
    }

    fn weight(&self, batch: &Batch) -> usize {
        let text = batch.text_bytes();
        let ids: usize = batch.rows.iter().map(|r| r.id.len()).sum();
        // The request's copy of the texts, and the vectors coming back.
        2 * text + ids + batch.rows.len() * self.dim as usize * 4
    }
}

fn describe(reply: &EmbedReply) -> String {
    match &reply.outcome {
        EmbedOutcome::Embedded(v) => format!(
            "batch {} from model {} with dim {} and {} values",
            reply.batch_id,
            v.revision,
            v.dim,
            v.values.len()
        ),
        EmbedOutcome::EmbeddedObject(v) => format!(
            "batch {} from model {} with dim {} and {} rows in object {}",
            reply.batch_id, v.revision, v.dim, v.rows, v.object
        ),
        EmbedOutcome::BadInput(r) | EmbedOutcome::Failed(r) => r.clone(),
    }
}

/// Reads the vectors of a result object: pulled or mapped through
/// `objects`, validated as an archived `Vectors` of the `manifest`'s
/// revision and width with `rows` rows, read in place.
pub(crate) async fn read_result(
    objects: Option<&flotilla::Objects>,
    object: &flotilla::ObjectRef,
    manifest: &super::sink::Manifest,
    rows: usize,
) -> Result<flotilla::ArchivedObject<crate::actor::Vectors>, String> {
    // Fault injection: `driver::result_object=return` makes every result
    // object unreadable to the driver.
    flotilla::fail::fail_point!("driver::result_object", |_| Err(
        "injected: the result object cannot be read".to_owned()
    ));
    let objects = objects.ok_or("a result object, but this job reads no objects")?;
    let v = objects
        .get_archive::<crate::actor::Vectors>(object)
        .await
        .map_err(|e| e.to_string())?;
    let (revision, dim) = (v.revision.as_str(), v.dim.to_native());
    if revision != manifest.model_revision || dim != manifest.dim {
        return Err(format!(
            "result object from model {revision} with dim {dim}"
        ));
    }
    if v.values.len() != rows * dim as usize {
        return Err(format!(
            "result object holds {} values for {rows} rows of {dim}",
            v.values.len()
        ));
    }
    Ok(v)
}
