//! A tool's control sessions: one local endpoint, one connection to each
//! node asked, kept open, and one stream per request. What a long-lived
//! tool (`node dashboard`) asks through, so that a refresh costs a stream
//! and not a TLS handshake per node; the one-shot queries of
//! [`super::status`] open one for a single request.
//!
//! ```text
//! ControlClient ─ connection to A (kept) ─┬─ stream: hello, request, reply pages
//!               │                         └─ stream: …
//!               └ connection to B (kept) ─── stream: …
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use flotilla_proto::control::{ControlReply, ControlRequest, Pages};
use flotilla_proto::frame::DEFAULT_MAX_FRAME;
use flotilla_proto::hello::{CookieDigest, Hello, Purpose};
use flotilla_proto::incarnation::Incarnation;
use flotilla_transport::handshake::{self, recv_msg, send_msg};

use super::query_error::StatusError;

/// How long [`ControlClient::close`] waits for the peers to be told.
const CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Control sessions of a tool speaking for one identity, to any number of
/// nodes. Requests to one node share its connection (each on its own
/// stream, so they may run at once); a connection found closed is opened
/// again before the request is sent.
///
/// ```no_run
/// # async fn demo(identity: flotilla_transport::Identity) -> Result<(), flotilla::status::StatusError> {
/// use flotilla::ControlClient;
/// use flotilla_proto::control::ControlRequest;
///
/// let client = ControlClient::new(identity)?;
/// let head = "10.0.0.1:7420".parse().unwrap();
/// for _ in 0..3 {
///     // One handshake with the head, three streams.
///     let table = client.ask(head, ControlRequest::Status).await?;
///     println!("{table:?}");
/// }
/// client.close().await;
/// # Ok(()) }
/// ```
pub struct ControlClient {
    endpoint: flotilla_transport::Endpoint,
    /// The member name every stream's hello gives (a tool of a role that
    /// runs many processes gets an instance name of its own).
    name: String,
    cookie: CookieDigest,
    /// The connection to each node asked, while it stands.
    connections: Mutex<HashMap<SocketAddr, quinn::Connection>>,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ControlClient {
    /// A client speaking for `identity`, which must carry a role and the
    /// cluster's cookie; opens its local endpoint.
    pub fn new(identity: flotilla_transport::Identity) -> Result<Self, StatusError> {
        let role = identity.role.ok_or(StatusError::NoRole)?;
        let name = flotilla_proto::role::member_name(&identity.name, role, crate::nonce::nonce());
        let cookie = identity
            .cookie
            .as_deref()
            .map(flotilla_transport::certs::cookie_digest)
            .ok_or(StatusError::NoCookie)?;
        let endpoint =
            flotilla_transport::Endpoint::client(identity, &flotilla_transport::Tuning::default())?;
        Ok(Self {
            endpoint,
            name,
            cookie,
            connections: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `request` to the node at `addr` and returns its answer (a
    /// table in pages joined back). A refusal by the node's permission
    /// table is [`StatusError::Denied`]. A kept connection that has
    /// closed since is opened again; a request is sent once.
    pub async fn ask(
        &self,
        addr: SocketAddr,
        request: ControlRequest,
    ) -> Result<ControlReply, StatusError> {
        let connection = self.connection(addr).await?;
        let reply = self.exchange(&connection, addr, &request).await;
        if reply.is_err() && connection.close_reason().is_some() {
            self.forget(addr, &connection);
        }
        match reply? {
            ControlReply::Denied(why) => Err(StatusError::Denied { addr, why }),
            ControlReply::TooLarge { bytes, limit } => {
                Err(StatusError::TooLarge { addr, bytes, limit })
            }
            reply => Ok(reply),
        }
    }

    /// The nodes this client holds an open connection to, in address
    /// order.
    pub fn connected(&self) -> Vec<SocketAddr> {
        let mut open: Vec<SocketAddr> = self
            .locked()
            .iter()
            .filter(|(_, c)| c.close_reason().is_none())
            .map(|(addr, _)| *addr)
            .collect();
        open.sort();
        open
    }

    /// Closes every connection and waits until the peers have been told
    /// (a second at most).
    pub async fn close(&self) {
        let open: Vec<quinn::Connection> = self
            .locked()
            .drain()
            .map(|(_, connection)| connection)
            .collect();
        for connection in &open {
            flotilla_transport::Closing::Done.close(connection);
        }
        // A handshake still under way (with a node that does not answer,
        // its request given up) ends here rather than at its idle timeout.
        self.endpoint.close();
        let _ = tokio::time::timeout(CLOSE_WITHIN, self.endpoint.wait_idle()).await;
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, quinn::Connection>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connection to `addr`, dialled when there is none.
    async fn connection(&self, addr: SocketAddr) -> Result<quinn::Connection, StatusError> {
        let kept = self.locked().get(&addr).cloned();
        match kept {
            Some(connection) if connection.close_reason().is_none() => return Ok(connection),
            Some(closed) => self.forget(addr, &closed),
            None => {}
        }
        let dialled = self
            .endpoint
            .connect(addr, None)
            .await
            .map_err(|source| StatusError::Connect { addr, source })?
            .connection;
        // Two requests may have dialled at once: the first kept is used.
        let mut connections = self.locked();
        let kept = connections.entry(addr).or_insert_with(|| dialled.clone());
        if kept.stable_id() != dialled.stable_id() {
            flotilla_transport::Closing::Done.close(&dialled);
        }
        Ok(kept.clone())
    }

    /// Drops `connection` as the one kept for `addr`, if it still is.
    fn forget(&self, addr: SocketAddr, connection: &quinn::Connection) {
        let mut connections = self.locked();
        if connections
            .get(&addr)
            .is_some_and(|c| c.stable_id() == connection.stable_id())
        {
            connections.remove(&addr);
        }
    }

    /// One request on a stream of its own.
    async fn exchange(
        &self,
        connection: &quinn::Connection,
        addr: SocketAddr,
        request: &ControlRequest,
    ) -> Result<ControlReply, StatusError> {
        let stream = |source| StatusError::Stream { addr, source };
        let hello = Hello::new(
            Purpose::Control,
            self.name.clone(),
            Incarnation::TOOL,
            self.cookie,
        );
        let (mut send, mut recv, _, _) =
            handshake::dial(connection, &hello).await.map_err(stream)?;
        send_msg(&mut send, request, DEFAULT_MAX_FRAME)
            .await
            .map_err(stream)?;
        let mut pages = Pages::default();
        let reply = loop {
            let page = recv_msg::<ControlReply>(&mut recv, DEFAULT_MAX_FRAME)
                .await
                .map_err(stream)?;
            if let Some(reply) = pages.push(page) {
                break reply;
            }
        };
        let _ = send.finish();
        Ok(reply)
    }
}
