//! How the job talks to embedding actors: one [`EmbedRequest`] per batch,
//! and a result accepted only with the job's batch id, revision and width.

use flotilla::pipeline::{BatchId, RpcReplyPort, Stage, Verdict};

use super::source::{Cell, RowAt};
use crate::actor::{EmbedMsg, EmbedOutcome, EmbedReply, EmbedRequest};

/// A batch's vectors as the pipeline hands them over: in the reply, or in
/// an object lent by the actor's node, read (and then released) when the
/// part is written.
#[derive(Debug)]
pub(crate) enum Output {
    /// In the reply.
    Values(Vec<f32>),
    /// In an object holding an archived `Vectors`.
    Object(flotilla::ObjectRef),
}

/// A batch held while in flight.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) ids: Vec<String>,
    /// Where each row is in the input.
    pub(crate) at: Vec<RowAt>,
    pub(crate) texts: Vec<String>,
    /// The extra output columns of each row.
    pub(crate) extra: Vec<Vec<Cell>>,
    /// The texts as an object in the driver's store, once put there (then
    /// `texts` is empty): held until the batch is done, so that every
    /// retry reads the same object.
    pub(crate) object: Option<flotilla::Object>,
}

impl Batch {
    /// Rows in the batch.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Moves the texts into an object of `objects`' store, which actors
    /// read in place on this host or pull from it.
    pub(crate) async fn put_texts(
        &mut self,
        objects: &flotilla::Objects,
    ) -> Result<(), flotilla::ObjectsError> {
        let object = objects.put_archive(&self.texts).await?;
        self.texts = Vec::new();
        self.object = Some(object);
        Ok(())
    }

    /// Bytes of the batch's texts, wherever they are.
    fn text_bytes(&self) -> usize {
        match &self.object {
            Some(object) => object.reference().size as usize,
            None => self.texts.iter().map(String::len).sum(),
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
                texts: batch.texts.clone(),
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
            } if batch_id == id.0
                && v.revision == self.revision
                && v.dim == self.dim
                && v.values.len() == batch.len() * self.dim as usize =>
            {
                Verdict::Done(Output::Values(v.values))
            }
            EmbedReply {
                batch_id,
                outcome: EmbedOutcome::EmbeddedObject(v),
            } if batch_id == id.0
                && v.revision == self.revision
                && v.dim == self.dim
                && v.rows as usize == batch.len() =>
            {
                Verdict::Done(Output::Object(v.object))
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
        let ids: usize = batch.ids.iter().map(String::len).sum();
        // The request's copy of the texts, and the vectors coming back.
        2 * text + ids + batch.len() * self.dim as usize * 4
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
/// `objects`, validated as an archived `Vectors` of `revision` and `dim`
/// with `rows` rows, read in place.
pub(crate) async fn read_result(
    objects: Option<&flotilla::Objects>,
    object: &flotilla::ObjectRef,
    revision: &str,
    dim: u32,
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
    if v.revision.as_str() != revision || v.dim.to_native() != dim {
        return Err(format!(
            "result object from model {} with dim {}",
            v.revision.as_str(),
            v.dim.to_native()
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

/// A finished batch's vectors, wherever they came in.
pub(crate) enum Held {
    /// In the reply.
    Values(Vec<f32>),
    /// In a result object, read in place.
    Object(flotilla::ArchivedObject<crate::actor::Vectors>),
}

impl Held {
    /// The values, row-major.
    pub(crate) fn values(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Held::Values(v) => std::borrow::Cow::Borrowed(v),
            Held::Object(v) => flotilla::objects::f32s(v.values.as_slice()),
        }
    }
}
