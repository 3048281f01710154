//! The owner's side of a pull (see [`crate::objects`]): one stream of
//! purpose `Pull` accepted on the bulk lane, answered from this node's
//! store; or a holder's release of objects lent to it.

use flotilla_objects::{ObjectId, Store};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::objects::{ObjectRequest, PullReply};
use flotilla_transport::handshake::{self, StreamError};

/// Answers one pull stream from `peer`: the object's bytes straight from
/// its mapping, or why not.
pub(crate) async fn serve_pull(
    store: Store,
    peer: String,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let served = async {
        let request = match handshake::recv_msg(&mut recv, DEFAULT_MAX_FRAME).await? {
            ObjectRequest::Pull(request) => request,
            ObjectRequest::Release(keys) => {
                for k in keys {
                    store.release(ObjectId {
                        scope: k.scope,
                        pid: k.pid,
                        seq: k.seq,
                    });
                }
                let _ = send.finish();
                return Ok(());
            }
        };
        let id = ObjectId {
            scope: request.scope,
            pid: request.pid,
            seq: request.seq,
        };
        let found = store.lookup(id);
        let reply = match &found {
            None => PullReply::Gone,
            Some(bytes)
                if bytes.len() as u64 != request.size || bytes.checksum() != request.checksum =>
            {
                PullReply::Mismatch
            }
            Some(bytes) => PullReply::Sending {
                size: bytes.len() as u64,
            },
        };
        handshake::send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
        if let (PullReply::Sending { size }, Some(bytes)) = (reply, found) {
            handshake::write_all(&mut send, &bytes).await?;
            crate::counters::sent_bytes("pull", size);
        }
        let _ = send.finish();
        Ok::<(), StreamError>(())
    }
    .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "pull stream ended early");
    }
}
