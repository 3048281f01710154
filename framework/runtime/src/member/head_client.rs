//! Requests from this node to the head on control streams kept open
//! between calls: one stream per call in flight, taken from and put back
//! into an idle set, so a request costs one round trip and no handshake.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_proto::control::{ControlReply, ControlRequest};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::hello::Purpose;
use flotilla_transport::handshake::{self, Frames, send_msg};

use crate::identity::Identity;
use crate::member::heads::HeadAddrs;
use crate::net::pool::Pool;

/// An open control stream to the head.
struct Stream {
    send: quinn::SendStream,
    replies: Frames<ControlReply>,
}

/// Calls to the head from a member (none on the head itself).
pub(crate) struct HeadClient {
    identity: Arc<Identity>,
    pool: Arc<Pool>,
    heads: Option<HeadAddrs>,
    idle: Mutex<Vec<Stream>>,
}

/// Why a call to the head got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadUnavailable {
    /// This node is the head.
    #[error("this node is the head")]
    IsHead,
    /// The head could not be reached, or the stream broke.
    #[error("the head at {addr} cannot be reached: {why}")]
    Unreachable {
        /// The head's address.
        addr: SocketAddr,
        /// Why.
        why: String,
    },
    /// No answer within the time allowed.
    #[error("the head did not answer within {0:?}")]
    Timeout(Duration),
}

impl HeadClient {
    /// A client of the heads at `heads` (`None` on the head), shared with
    /// the member's link.
    pub(crate) fn new(identity: Arc<Identity>, pool: Arc<Pool>, heads: Option<HeadAddrs>) -> Self {
        Self {
            identity,
            pool,
            heads,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends `request` to the head named `head_name` and returns its reply,
    /// within `timeout`.
    pub(crate) async fn call(
        &self,
        head_name: &str,
        request: &ControlRequest,
        timeout: Duration,
    ) -> Result<ControlReply, HeadUnavailable> {
        let heads = self.heads.as_ref().ok_or(HeadUnavailable::IsHead)?;
        let addr = heads.current();
        let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let reused = taken.is_some();
        let answer = match self
            .exchange(head_name, addr, taken, request, timeout)
            .await
        {
            // An idle stream may be to a head that has since restarted.
            Err(HeadUnavailable::Unreachable { .. }) if reused => {
                self.exchange(head_name, addr, None, request, timeout).await
            }
            r => r,
        };
        match answer {
            // With a head set, a standby may have taken over: once more,
            // at the next head.
            Err(HeadUnavailable::Unreachable { .. }) if heads.len() > 1 => {
                heads.failed(addr);
                self.exchange(head_name, heads.current(), None, request, timeout)
                    .await
            }
            r => r,
        }
    }

    async fn exchange(
        &self,
        head_name: &str,
        addr: SocketAddr,
        taken: Option<Stream>,
        request: &ControlRequest,
        timeout: Duration,
    ) -> Result<ControlReply, HeadUnavailable> {
        let unreachable = |why: String| HeadUnavailable::Unreachable { addr, why };
        let exchange = async {
            let mut stream = match taken {
                Some(s) => s,
                None => {
                    let pc = self
                        .pool
                        .connect_head(Some(head_name), addr)
                        .await
                        .map_err(|e| unreachable(e.to_string()))?;
                    let hello = self.identity.hello(Purpose::Control);
                    let (send, recv, _, _) = handshake::dial(&pc.connection, &hello)
                        .await
                        .map_err(|e| unreachable(e.to_string()))?;
                    Stream {
                        send,
                        replies: Frames::new(recv, DEFAULT_MAX_FRAME),
                    }
                }
            };
            send_msg(&mut stream.send, request, DEFAULT_MAX_FRAME)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            match stream.replies.next().await {
                Some(Ok(reply)) => Ok((stream, reply)),
                Some(Err(e)) => Err(unreachable(e.to_string())),
                None => Err(unreachable("the stream ended".into())),
            }
        };
        // A stream whose exchange failed or timed out is dropped: its next
        // frame could be this request's late reply.
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok((stream, reply))) => {
                self.idle
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(stream);
                Ok(reply)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(HeadUnavailable::Timeout(timeout)),
        }
    }
}
