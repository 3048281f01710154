//! A node's QUIC endpoint: one UDP socket that accepts and dials mutually
//! authenticated connections, one per pair of nodes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::certs::{Identity, dns_names};
use crate::tls::{self, ANY_MEMBER, TlsError};

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The peer is unreachable or the handshake failed (refused
    /// certificate, timeout). Retry later.
    #[error("NODE-NET-001: cannot connect to {addr}: {reason}")]
    Unreachable {
        /// The address dialled.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The peer's certificate carries no usable name.
    #[error("NODE-AUTH-003: peer at {addr} presented a certificate without a node name")]
    NoPeerName {
        /// The peer's address.
        addr: SocketAddr,
    },
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The TLS identity is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP socket could not be bound.
    #[error("NODE-NET-002: cannot listen on {addr}: {source}")]
    Socket {
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
}

/// Transport timing and window sizes.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Keep-alive interval on idle connections.
    pub keep_alive: Duration,
    /// A connection silent for this long is closed.
    pub idle_timeout: Duration,
    /// Per-stream receive window in bytes.
    pub stream_window: u32,
    /// Connection send window in bytes.
    pub send_window: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            keep_alive: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
            stream_window: 1 << 20,
            send_window: 1 << 20,
        }
    }
}

impl Tuning {
    fn transport(&self) -> Arc<quinn::TransportConfig> {
        let mut t = quinn::TransportConfig::default();
        t.keep_alive_interval(Some(self.keep_alive))
            .max_idle_timeout(quinn::IdleTimeout::try_from(self.idle_timeout).ok())
            .stream_receive_window(quinn::VarInt::from_u32(self.stream_window))
            .send_window(self.send_window)
            .max_concurrent_bidi_streams(quinn::VarInt::from_u32(1024));
        Arc::new(t)
    }
}

/// A mutually authenticated connection and the name the peer's certificate
/// proves.
#[derive(Debug, Clone)]
pub struct PeerConnection {
    /// The QUIC connection.
    pub connection: quinn::Connection,
    /// The name in the peer's certificate.
    pub peer: String,
}

fn peer_name(connection: &quinn::Connection) -> Option<String> {
    let identity = connection.peer_identity()?;
    let certs = identity
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    dns_names(certs.first()?).into_iter().next()
}

/// A QUIC endpoint with the node's identity.
#[derive(Debug, Clone)]
pub struct Endpoint {
    endpoint: quinn::Endpoint,
    identity: Arc<Identity>,
}

impl Endpoint {
    /// Binds `addr` for accepting and dialling. Must run inside a tokio
    /// runtime.
    pub fn bind(addr: SocketAddr, identity: Identity, tuning: &Tuning) -> Result<Self, BindError> {
        let transport = tuning.transport();
        let server = tls::quic_server(&identity, transport.clone())?;
        let client = tls::quic_client(&identity, transport)?;
        let mut endpoint = quinn::Endpoint::server(server, addr)
            .map_err(|source| BindError::Socket { addr, source })?;
        endpoint.set_default_client_config(client);
        Ok(Self {
            endpoint,
            identity: Arc::new(identity),
        })
    }

    /// Binds `addr` like [`Endpoint::bind`], but runs everything of the
    /// endpoint (its socket, its driver, and the driver of every connection
    /// it accepts or dials, whoever calls) on the runtime behind `runtime`.
    /// A node gives its bulk lane such an endpoint on a runtime of its own,
    /// so bulk traffic is encrypted and decrypted on threads the OS can
    /// schedule below the rest of the node.
    pub fn bind_on(
        addr: SocketAddr,
        identity: Identity,
        tuning: &Tuning,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, BindError> {
        let transport = tuning.transport();
        let server = tls::quic_server(&identity, transport.clone())?;
        let client = tls::quic_client(&identity, transport)?;
        let socket_error = |source| BindError::Socket { addr, source };
        let socket = std::net::UdpSocket::bind(addr).map_err(socket_error)?;
        let mut endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server),
            socket,
            Arc::new(OnRuntime(runtime)),
        )
        .map_err(socket_error)?;
        endpoint.set_default_client_config(client);
        Ok(Self {
            endpoint,
            identity: Arc::new(identity),
        })
    }

    /// A dial-only endpoint on an ephemeral port (for tools).
    pub fn client(identity: Identity, tuning: &Tuning) -> Result<Self, BindError> {
        let addr: SocketAddr = ([0, 0, 0, 0], 0).into();
        let client = tls::quic_client(&identity, tuning.transport())?;
        let mut endpoint =
            quinn::Endpoint::client(addr).map_err(|source| BindError::Socket { addr, source })?;
        endpoint.set_default_client_config(client);
        Ok(Self {
            endpoint,
            identity: Arc::new(identity),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.identity.name
    }

    /// Dials `addr`. With `expected`, the peer's certificate must be issued
    /// for that name; without, any member certificate of the CA is accepted
    /// and its name is returned.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        expected: Option<&str>,
    ) -> Result<PeerConnection, ConnectError> {
        let unreachable = |reason: String| ConnectError::Unreachable { addr, reason };
        let connecting = self
            .endpoint
            .connect(addr, expected.unwrap_or(ANY_MEMBER))
            .map_err(|e| unreachable(e.to_string()))?;
        let connection = connecting.await.map_err(|e| unreachable(e.to_string()))?;
        let peer = peer_name(&connection).ok_or(ConnectError::NoPeerName { addr })?;
        Ok(PeerConnection { connection, peer })
    }

    /// Waits for the next incoming connection that completes the mutual TLS
    /// handshake. Returns `None` once the endpoint is closed. Failed
    /// handshakes are logged and skipped.
    pub async fn accept(&self) -> Option<PeerConnection> {
        loop {
            let incoming = self.endpoint.accept().await?;
            let addr = incoming.remote_address();
            match incoming.await {
                Ok(connection) => match peer_name(&connection) {
                    Some(peer) => return Some(PeerConnection { connection, peer }),
                    None => {
                        tracing::warn!(%addr, "NODE-AUTH-003: peer certificate without a node name");
                        connection.close(quinn::VarInt::from_u32(3), b"no node name");
                    }
                },
                Err(e) => tracing::warn!(%addr, error = %e, "NODE-AUTH-001: handshake refused"),
            }
        }
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        self.endpoint.close(quinn::VarInt::from_u32(0), b"shutdown");
    }

    /// Waits until every connection has been closed, so the last frames
    /// reach their peers.
    pub async fn wait_idle(&self) {
        self.endpoint.wait_idle().await;
    }
}

/// quinn's tokio runtime pinned to one tokio runtime: tasks are spawned on
/// it and its socket and timers are registered with it, whichever runtime
/// the caller is on.
#[derive(Debug)]
struct OnRuntime(tokio::runtime::Handle);

impl quinn::Runtime for OnRuntime {
    fn new_timer(&self, at: std::time::Instant) -> std::pin::Pin<Box<dyn quinn::AsyncTimer>> {
        let _on = self.0.enter();
        quinn::TokioRuntime.new_timer(at)
    }

    fn spawn(&self, future: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) {
        self.0.spawn(future);
    }

    fn wrap_udp_socket(
        &self,
        socket: std::net::UdpSocket,
    ) -> std::io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        let _on = self.0.enter();
        quinn::TokioRuntime.wrap_udp_socket(socket)
    }

    fn now(&self) -> std::time::Instant {
        quinn::TokioRuntime.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A connection dialled through an endpoint pinned to one runtime keeps
    /// working after the runtime it was dialled from is gone: its driver
    /// runs on the endpoint's runtime, not the caller's.
    #[test]
    fn pinned_endpoint_drives_its_connections_whoever_dials() {
        let dir = std::env::temp_dir().join(format!("flotilla-pinned-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        crate::certs::init_ca(&dir, "test").unwrap();
        for name in ["a", "b"] {
            crate::certs::issue(&dir, name, &dir).unwrap();
        }
        let local: SocketAddr = ([127, 0, 0, 1], 0).into();

        // b echoes every stream.
        let server_rt = runtime();
        let server = server_rt
            .block_on(async {
                Endpoint::bind(
                    local,
                    Identity::load(&dir, "b").unwrap(),
                    &Tuning::default(),
                )
            })
            .unwrap();
        let addr = server.local_addr().unwrap();
        server_rt.spawn(async move {
            while let Some(pc) = server.accept().await {
                tokio::spawn(async move {
                    while let Ok((mut send, mut recv)) = pc.connection.accept_bi().await {
                        let bytes = recv.read_to_end(1 << 10).await.unwrap();
                        send.write_all(&bytes).await.unwrap();
                        send.finish().unwrap();
                    }
                });
            }
        });

        let lane = runtime();
        let client = Endpoint::bind_on(
            local,
            Identity::load(&dir, "a").unwrap(),
            &Tuning::default(),
            lane.handle().clone(),
        )
        .unwrap();
        let dialer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let pc = dialer
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(5), client.connect(addr, Some("b"))).await
            })
            .expect("handshake in time")
            .unwrap();
        assert_eq!(pc.peer, "b");
        drop(dialer);

        let user = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let echoed = user.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), async {
                let (mut send, mut recv) = pc.connection.open_bi().await.unwrap();
                send.write_all(b"still driven").await.unwrap();
                send.finish().unwrap();
                recv.read_to_end(1 << 10).await.unwrap()
            })
            .await
        });
        assert_eq!(
            echoed.expect("the connection outlives the dialling runtime"),
            b"still driven"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
