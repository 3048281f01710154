//! One QUIC connection per peer: reused while it lives, dialled when there
//! is none. Every connection, dialled or accepted, is handed to the router
//! on a channel, which serves the streams the peer opens on it.
//!
//! ```text
//! Pool::connect ─► live connection to the peer? ─ yes ─► it
//!                       │ no
//!                       ▼
//!                 endpoint.connect ─► record ─► router channel ─► it
//! accept loop ──► record ─────────────────────► router channel
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;

use flotilla_transport::{ConnectError, Endpoint, PeerConnection};
use tokio::sync::{Mutex, mpsc};

/// Live connections by peer name.
pub(crate) struct Pool {
    endpoint: Endpoint,
    connections: Mutex<HashMap<String, quinn::Connection>>,
    router: mpsc::UnboundedSender<PeerConnection>,
}

impl Pool {
    /// A pool dialling through `endpoint` and handing every connection to
    /// `router`.
    pub(crate) fn new(endpoint: Endpoint, router: mpsc::UnboundedSender<PeerConnection>) -> Self {
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

    /// Records an accepted connection and hands it to the router.
    pub(crate) async fn accepted(&self, pc: PeerConnection) {
        self.connections
            .lock()
            .await
            .insert(pc.peer.clone(), pc.connection.clone());
        let _ = self.router.send(pc);
    }

    /// The live connection to `peer` (when named), dialling `addr` if there
    /// is none.
    pub(crate) async fn connect(
        &self,
        peer: Option<&str>,
        addr: SocketAddr,
    ) -> Result<PeerConnection, ConnectError> {
        if let Some(name) = peer {
            let map = self.connections.lock().await;
            if let Some(c) = map.get(name)
                && c.close_reason().is_none()
            {
                return Ok(PeerConnection {
                    connection: c.clone(),
                    peer: name.to_owned(),
                });
            }
        }
        let pc = self.endpoint.connect(addr, peer).await?;
        self.connections
            .lock()
            .await
            .insert(pc.peer.clone(), pc.connection.clone());
        let _ = self.router.send(pc.clone());
        Ok(pc)
    }
}
