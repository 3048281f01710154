//! One QUIC connection per peer: reused while it lives, dialled when there
//! is none. Every connection, dialled or accepted, is handed to the router
//! on a channel, which serves the streams the peer opens on it.
//!
//! ```text
//! Pool::connect(member) ─► live connection to the member? ─ yes ─► it
//!                       │ no
//!                       ▼
//!                 endpoint.connect (its certificate's name) ─► record ─► router channel ─► it
//! accept loop ──► handshake task ──► router channel ─► first stream's hello ─► record
//! ```
//!
//! Connections are keyed by member name: a peer's certificate proves its
//! principal, and the hello of the first stream on an accepted connection
//! says which of the principal's processes it is (see
//! [`flotilla_proto::role`]); the router records it then.

use std::collections::HashMap;
use std::net::SocketAddr;

use flotilla_proto::ids::MemberName;
use flotilla_proto::role::{Role, principal_of};
use flotilla_transport::{ConnectError, Endpoint, PeerConnection};
use tokio::sync::{Mutex, mpsc};

/// Live connections by member name.
pub(crate) struct Pool {
    endpoint: Endpoint,
    connections: Mutex<HashMap<MemberName, quinn::Connection>>,
    /// Where every connection goes, with whether it was accepted.
    router: mpsc::UnboundedSender<(PeerConnection, bool)>,
}

impl Pool {
    /// A pool dialling through `endpoint` and handing every connection to
    /// `router`.
    pub(crate) fn new(
        endpoint: Endpoint,
        router: mpsc::UnboundedSender<(PeerConnection, bool)>,
    ) -> Self {
        Self {
            endpoint,
            connections: Mutex::new(HashMap::new()),
            router,
        }
    }

    /// The endpoint connections go through.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Hands an accepted connection to the router (which records it under
    /// its member name once its first stream's hello has said it).
    pub(crate) fn accepted(&self, pc: PeerConnection) {
        let _ = self.router.send((pc, true));
    }

    /// Records that `connection` speaks for `member`: the one dials to it
    /// reuse from now on (the newest, as a restarted peer's old connection
    /// may linger until its idle timeout).
    pub(crate) async fn record(&self, member: &str, connection: &quinn::Connection) {
        let mut map = self.connections.lock().await;
        prune_closed(&mut map);
        map.insert(MemberName::from(member), connection.clone());
    }

    /// The live connection to `member`, dialling `addr` if there is none;
    /// the peer's certificate must be its principal's.
    pub(crate) async fn connect(
        &self,
        member: &str,
        addr: SocketAddr,
    ) -> Result<PeerConnection, ConnectError> {
        if let Some(c) = self.live(member).await {
            return Ok(c);
        }
        let pc = self
            .endpoint
            .connect(addr, Some(principal_of(member)))
            .await?;
        self.dialled(member, pc).await
    }

    /// The live connection to the head `name` (when known), or a new one
    /// to `addr`: the peer's certificate must carry the head role, and
    /// `name` when given.
    pub(crate) async fn connect_head(
        &self,
        name: Option<&str>,
        addr: SocketAddr,
    ) -> Result<PeerConnection, ConnectError> {
        if let Some(c) = match name {
            Some(name) => self.live(name).await,
            None => None,
        } {
            return Ok(c);
        }
        let pc = self.endpoint.connect_role(addr, name, Role::Head).await?;
        let member = pc.peer.clone();
        self.dialled(&member, pc).await
    }

    async fn live(&self, member: &str) -> Option<PeerConnection> {
        let map = self.connections.lock().await;
        let c = map.get(member).filter(|c| c.close_reason().is_none())?;
        PeerConnection::of_connection(c.clone())
    }

    async fn dialled(
        &self,
        member: &str,
        pc: PeerConnection,
    ) -> Result<PeerConnection, ConnectError> {
        {
            let mut map = self.connections.lock().await;
            prune_closed(&mut map);
            map.insert(MemberName::from(member), pc.connection.clone());
        }
        let _ = self.router.send((pc.clone(), false));
        Ok(pc)
    }
}

/// Forgets the closed connections of `map`: members that left (a driver's
/// many processes, a tool's one-off names) do not stay in it.
fn prune_closed(map: &mut HashMap<MemberName, quinn::Connection>) {
    map.retain(|_, c| c.close_reason().is_none());
}
