//! Why a control query (`node status` and its siblings, a
//! [`ControlClient`](super::client::ControlClient)'s request) failed.

use std::net::SocketAddr;

use flotilla_transport::handshake::StreamError;
use flotilla_transport::{BindError, ConnectError};

/// Why the status query failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The identity's certificates folder holds no cluster cookie.
    #[error(
        "NODE-CERT-008: no cluster cookie beside the certificate; copy the `cookie` file `node certs init` wrote into the certs folder"
    )]
    NoCookie,
    /// No local endpoint could be opened.
    #[error("NODE-STATUS-001: cannot open a local endpoint: {0}")]
    Bind(#[from] BindError),
    /// The node could not be reached.
    #[error("NODE-STATUS-001: cannot reach {addr}: {source}")]
    Connect {
        /// The node asked.
        addr: SocketAddr,
        /// Why.
        source: ConnectError,
    },
    /// The exchange failed or was refused.
    #[error("NODE-STATUS-001: status request to {addr} failed: {source}")]
    Stream {
        /// The node asked.
        addr: SocketAddr,
        /// Why.
        source: StreamError,
    },
    /// The identity's certificate carries no role.
    #[error(
        "NODE-AUTH-018: the certificate carries no role; issue a new one with `node certs issue --role …`"
    )]
    NoRole,
    /// The node's permission table refused the request.
    #[error("NODE-STATUS-002: {addr} refused: {why}")]
    Denied {
        /// The node asked.
        addr: SocketAddr,
        /// Why.
        why: flotilla_proto::authority::Unauthorized,
    },
    /// No head address was given to ask.
    #[error("NODE-STATUS-003: no head address given")]
    NoAddress,
    /// The node's answer was over the frame limit.
    #[error(
        "NODE-STATUS-004: {addr}'s answer of {bytes} bytes is over the frame limit of {limit} bytes; ask for less at once"
    )]
    TooLarge {
        /// The node asked.
        addr: SocketAddr,
        /// The answer's size.
        bytes: u64,
        /// The limit.
        limit: u32,
    },
    /// The node answered with something else than a table.
    #[error("NODE-STATUS-001: {addr} answered the status request with {reply}")]
    Unexpected {
        /// The node asked.
        addr: SocketAddr,
        /// What it answered.
        reply: String,
    },
}
