//! How the job talks to embedding actors: one [`EmbedRequest`] per batch,
//! and a result accepted only with the job's batch id, revision and width.

use flotilla::pipeline::{BatchId, RpcReplyPort, Stage, Verdict};

use super::source::{Cell, RowAt};
use crate::actor::{EmbedMsg, EmbedOutcome, EmbedReply, EmbedRequest};

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
    type Output = Vec<f32>;

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

    fn judge(&self, id: BatchId, batch: &Batch, reply: EmbedReply) -> Verdict<Vec<f32>> {
        match reply {
            EmbedReply {
                batch_id,
                outcome: EmbedOutcome::Embedded(v),
            } if batch_id == id.0
                && v.revision == self.revision
                && v.dim == self.dim
                && v.values.len() == batch.len() * self.dim as usize =>
            {
                Verdict::Done(v.values)
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
        EmbedOutcome::BadInput(r) | EmbedOutcome::Failed(r) => r.clone(),
    }
}
