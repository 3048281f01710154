//! The owner's side of a pull (see [`crate::objects`]): one stream of
//! purpose `Pull` accepted on the bulk lane, answered from this node's
//! store; or a holder's release of objects lent to it.
//!
//! A pull is served only with the object's token (which only its
//! reference carries); without it the object is gone as far as the asker
//! can tell, and the refusal is counted. A release is honoured only for
//! objects lent to the asking member.

use flotilla_objects::{ObjectId, Release, Store};
use flotilla_proto::authority::Unauthorized;
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::ids::MemberName;
use flotilla_proto::objects::{ObjectRequest, PullReply, ReleaseReply};
use flotilla_transport::handshake::{self, StreamError};

/// Answers one pull stream from the member `peer`: the object's bytes
/// straight from its mapping, or why not.
pub(crate) async fn serve_pull(
    store: Store,
    peer: MemberName,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let served = async {
        let request = match handshake::recv_msg(&mut recv, DEFAULT_MAX_FRAME).await? {
            ObjectRequest::Pull(request) => request,
            ObjectRequest::Release(keys) => {
                let mut reply = ReleaseReply {
                    released: 0,
                    refused: Vec::new(),
                };
                for k in keys {
                    let id = ObjectId {
                        scope: k.scope,
                        pid: k.pid,
                        seq: k.seq,
                    };
                    match store.release(id, Some(&peer)) {
                        Release::Released => reply.released += 1,
                        Release::NotLent => {}
                        Release::NotBorrower => reply.refused.push(k),
                    }
                }
                if !reply.refused.is_empty() {
                    let why = Unauthorized::NotBorrower;
                    crate::counters::authority_refused("objects", why.code());
                    tracing::warn!(%peer, refused = reply.refused.len(), error = %why, "release refused");
                }
                handshake::send_msg(&mut send, &reply, DEFAULT_MAX_FRAME).await?;
                let _ = send.finish();
                return Ok(());
            }
        };
        let id = ObjectId {
            scope: request.scope,
            pid: request.pid,
            seq: request.seq,
        };
        let found = store.lookup(id, request.token);
        if found.is_none() && store.token_of(id) != request.token {
            let why = Unauthorized::BadToken;
            crate::counters::authority_refused("objects", why.code());
            tracing::warn!(%peer, object = %id, error = %why, "pull refused");
        }
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
