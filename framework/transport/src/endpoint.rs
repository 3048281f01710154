//! A node's QUIC endpoint: one UDP socket that accepts and dials mutually
//! authenticated connections, one per pair of nodes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_proto::role::Role;

use crate::certs::{CertInfo, Identity, cert_info};
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
    /// The peer's certificate does not carry the role expected of it (a
    /// head that is not a head).
    #[error(
        "NODE-AUTH-021: the peer at {addr} is {name:?} with role {role}, not {expected}; check --head (and --head-name)"
    )]
    WrongRole {
        /// The peer's address.
        addr: SocketAddr,
        /// Its certificate's name.
        name: String,
        /// Its certificate's role (`none` when it carries none).
        role: String,
        /// The role expected.
        expected: Role,
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

/// Transport timing, window sizes and what one peer may hold of a node.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Keep-alive interval on idle connections.
    pub keep_alive: Duration,
    /// A connection silent for this long is closed.
    pub idle_timeout: Duration,
    /// Per-stream receive window in bytes.
    pub stream_window: u32,
    /// Per-connection receive window in bytes: all of a peer's streams
    /// together never have more than this buffered here.
    pub receive_window: u32,
    /// Connection send window in bytes.
    pub send_window: u64,
    /// Bidirectional streams a peer may have open at once on one
    /// connection.
    pub max_streams: u32,
    /// Handshakes in progress at once, in all.
    pub max_handshakes: usize,
    /// Handshakes in progress at once from one source address.
    pub max_handshakes_per_source: usize,
    /// Handshakes in progress above which a connection from an address
    /// not yet validated is first asked to prove it (a QUIC retry): a
    /// spoofed source never answers, so it holds no slot.
    pub retry_above: usize,
    /// How long a handshake may take before its slot is freed.
    pub handshake_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            keep_alive: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
            stream_window: 1 << 20,
            receive_window: 8 << 20,
            send_window: 1 << 20,
            max_streams: 256,
            max_handshakes: 128,
            max_handshakes_per_source: 8,
            retry_above: 32,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

impl Tuning {
    fn transport(&self) -> Arc<quinn::TransportConfig> {
        let mut t = quinn::TransportConfig::default();
        t.keep_alive_interval(Some(self.keep_alive))
            .max_idle_timeout(quinn::IdleTimeout::try_from(self.idle_timeout).ok())
            .stream_receive_window(quinn::VarInt::from_u32(self.stream_window))
            .receive_window(quinn::VarInt::from_u32(self.receive_window))
            .send_window(self.send_window)
            .max_concurrent_bidi_streams(quinn::VarInt::from_u32(self.max_streams))
            .max_concurrent_uni_streams(quinn::VarInt::from_u32(0));
        Arc::new(t)
    }
}

/// A mutually authenticated connection and what the peer's certificate
/// proves.
#[derive(Debug, Clone)]
pub struct PeerConnection {
    /// The QUIC connection.
    pub connection: quinn::Connection,
    /// The name in the peer's certificate.
    pub peer: String,
    /// The role the peer's certificate carries, if any.
    pub role: Option<Role>,
    /// The peer certificate's serial number (normalised), for revocation.
    pub serial: Vec<u8>,
    /// When the peer's certificate expires (Unix seconds): the connection
    /// is closed then.
    pub expires_unix: i64,
}

fn peer_cert(connection: &quinn::Connection) -> Option<CertInfo> {
    let identity = connection.peer_identity()?;
    let certs = identity
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    cert_info(certs.first()?)
}

impl PeerConnection {
    /// A connection with what its peer's certificate proves; `None` when
    /// the certificate carries no node name.
    pub fn of_connection(connection: quinn::Connection) -> Option<Self> {
        Self::of(connection)
    }

    fn of(connection: quinn::Connection) -> Option<Self> {
        let info = peer_cert(&connection)?;
        Some(Self {
            connection,
            peer: info.name,
            role: info.role,
            serial: info.serial,
            expires_unix: info.not_after,
        })
    }
}

/// Why an incoming connection was not accepted, for the acceptor's
/// counters (`flotilla_tls_refused_total{reason}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NODE-AUTH-001: connection from {addr} refused ({reason}): {detail}")]
pub struct HandshakeRefused {
    /// The peer's address.
    pub addr: SocketAddr,
    /// A short, stable name: `busy` (too many handshakes at once, in all or
    /// from its address), `retry` (asked to validate its address first,
    /// under load), `timeout`, `tls` (certificate or protocol refused),
    /// `no_name` (a certificate without a node name).
    pub reason: &'static str,
    /// What went wrong.
    pub detail: String,
}

/// Handshakes in progress, in all and by source address.
#[derive(Debug, Default)]
struct Slots {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// A handshake's slot, freed when dropped.
struct Slot {
    slots: Arc<Mutex<Slots>>,
    source: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.total = s.total.saturating_sub(1);
        if let Some(n) = s.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                s.by_source.remove(&self.source);
            }
        }
    }
}

/// An incoming connection admitted to a handshake slot: finish it in a
/// task of its own ([`Handshake::finish`]), so one peer that stalls its
/// handshake holds only its own slot.
pub struct Handshake {
    incoming: quinn::Incoming,
    timeout: Duration,
    _slot: Slot,
}

impl Handshake {
    /// The peer's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }

    /// Completes the mutual TLS handshake within the endpoint's handshake
    /// timeout. Cancel safety: dropping it abandons the connection.
    pub async fn finish(self) -> Result<PeerConnection, HandshakeRefused> {
        let addr = self.incoming.remote_address();
        let refused = |reason, detail: String| HandshakeRefused {
            addr,
            reason,
            detail,
        };
        let connecting = self
            .incoming
            .accept()
            .map_err(|e| refused("tls", e.to_string()))?;
        let connection = match tokio::time::timeout(self.timeout, connecting).await {
            Err(_) => {
                return Err(refused(
                    "timeout",
                    format!("no handshake within {:?}", self.timeout),
                ));
            }
            Ok(Err(e)) => return Err(refused("tls", e.to_string())),
            Ok(Ok(c)) => c,
        };
        match PeerConnection::of(connection.clone()) {
            Some(pc) => Ok(pc),
            None => {
                crate::Closing::NoName.close(&connection);
                Err(refused(
                    "no_name",
                    "peer certificate without a node name".into(),
                ))
            }
        }
    }
}

/// A QUIC endpoint with the node's identity.
#[derive(Debug, Clone)]
pub struct Endpoint {
    endpoint: quinn::Endpoint,
    identity: Arc<Identity>,
    tuning: Tuning,
    slots: Arc<Mutex<Slots>>,
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
        Ok(Self::of(endpoint, identity, tuning))
    }

    fn of(endpoint: quinn::Endpoint, identity: Identity, tuning: &Tuning) -> Self {
        Self {
            endpoint,
            identity: Arc::new(identity),
            tuning: tuning.clone(),
            slots: Arc::default(),
        }
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
        Ok(Self::of(endpoint, identity, tuning))
    }

    /// A dial-only endpoint on an ephemeral port (for tools).
    pub fn client(identity: Identity, tuning: &Tuning) -> Result<Self, BindError> {
        let addr: SocketAddr = ([0, 0, 0, 0], 0).into();
        let client = tls::quic_client(&identity, tuning.transport())?;
        let mut endpoint =
            quinn::Endpoint::client(addr).map_err(|source| BindError::Socket { addr, source })?;
        endpoint.set_default_client_config(client);
        Ok(Self::of(endpoint, identity, tuning))
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
        PeerConnection::of(connection).ok_or(ConnectError::NoPeerName { addr })
    }

    /// [`Endpoint::connect`] to a peer whose certificate must carry `role`
    /// (and, with `expected`, that name): how a node makes sure the head
    /// it joins by address is a head.
    pub async fn connect_role(
        &self,
        addr: SocketAddr,
        expected: Option<&str>,
        role: Role,
    ) -> Result<PeerConnection, ConnectError> {
        let pc = self.connect(addr, expected).await?;
        if pc.role != Some(role) {
            crate::Closing::UnexpectedRole.close(&pc.connection);
            return Err(ConnectError::WrongRole {
                addr,
                name: pc.peer,
                role: pc.role.map_or_else(|| "none".to_owned(), |r| r.to_string()),
                expected: role,
            });
        }
        Ok(pc)
    }

    /// Waits for the next incoming connection and admits it to a handshake
    /// slot; `None` once the endpoint is closed. A connection over the
    /// bounds ([`Tuning::max_handshakes`] in all,
    /// [`Tuning::max_handshakes_per_source`] from its address) is refused
    /// at once and returned as the error: it costs the node nothing more.
    pub async fn accept_incoming(&self) -> Option<Result<Handshake, HandshakeRefused>> {
        let incoming = self.endpoint.accept().await?;
        let source = incoming.remote_address().ip();
        let busy = {
            let s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            s.total >= self.tuning.retry_above
        };
        if busy && !incoming.remote_address_validated() && incoming.may_retry() {
            let addr = incoming.remote_address();
            // Answered by a retry packet: no state is kept until the
            // source comes back with the token it carries.
            if incoming.retry().is_ok() {
                return Some(Err(HandshakeRefused {
                    addr,
                    reason: "retry",
                    detail: "asked to validate its address first".into(),
                }));
            }
            return Some(Err(HandshakeRefused {
                addr,
                reason: "busy",
                detail: "too many handshakes in progress".into(),
            }));
        }
        let admitted = {
            let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let from_source = s.by_source.get(&source).copied().unwrap_or(0);
            if s.total >= self.tuning.max_handshakes
                || from_source >= self.tuning.max_handshakes_per_source
            {
                false
            } else {
                s.total += 1;
                *s.by_source.entry(source).or_default() += 1;
                true
            }
        };
        if !admitted {
            let addr = incoming.remote_address();
            incoming.refuse();
            return Some(Err(HandshakeRefused {
                addr,
                reason: "busy",
                detail: "too many handshakes in progress".into(),
            }));
        }
        Some(Ok(Handshake {
            incoming,
            timeout: self.tuning.handshake_timeout,
            _slot: Slot {
                slots: Arc::clone(&self.slots),
                source,
            },
        }))
    }

    /// Waits for the next incoming connection that completes the mutual
    /// TLS handshake, one handshake at a time (for tools and benches; a
    /// node finishes each [`Endpoint::accept_incoming`] in a task of its
    /// own). Returns `None` once the endpoint is closed. Failed handshakes
    /// are logged and skipped.
    pub async fn accept(&self) -> Option<PeerConnection> {
        loop {
            match self.accept_incoming().await? {
                Ok(handshake) => match handshake.finish().await {
                    Ok(pc) => return Some(pc),
                    Err(e) => tracing::warn!(error = %e, "handshake refused"),
                },
                Err(e) => tracing::warn!(error = %e, "handshake refused"),
            }
        }
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        crate::Closing::Shutdown.close_all(&self.endpoint);
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

    /// A fresh CA folder (`tag` in its name) with workers `a` and `b`.
    fn ca_of(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("flotilla-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        crate::certs::init_ca(&dir, "test", "head").unwrap();
        for name in ["a", "b"] {
            let validity = crate::certs::DEFAULT_VALIDITY;
            crate::certs::issue(&dir, name, Role::Worker, validity, &dir).unwrap();
        }
        dir
    }

    /// Above the threshold, a connection from an address not yet validated
    /// is answered with a QUIC retry and holds no slot; the real client
    /// comes back with the token, validated, and connects.
    #[test]
    fn under_load_an_unvalidated_source_is_asked_to_retry_and_a_real_one_connects() {
        let dir = ca_of("retry");
        let local: SocketAddr = ([127, 0, 0, 1], 0).into();
        let rt = runtime();
        let tuning = Tuning {
            retry_above: 0,
            ..Tuning::default()
        };
        let server = rt
            .block_on(async { Endpoint::bind(local, Identity::load(&dir, "b").unwrap(), &tuning) })
            .unwrap();
        let addr = server.local_addr().unwrap();
        let client = rt
            .block_on(async {
                Endpoint::bind(
                    local,
                    Identity::load(&dir, "a").unwrap(),
                    &Tuning::default(),
                )
            })
            .unwrap();
        let (reasons, pc) = rt.block_on(async {
            let dial = tokio::spawn(async move { client.connect(addr, Some("b")).await });
            let mut reasons = Vec::new();
            let accepted = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match server.accept_incoming().await.unwrap() {
                        Ok(handshake) => return handshake.finish().await,
                        Err(refused) => reasons.push(refused.reason),
                    }
                }
            })
            .await
            .expect("accepted in time");
            let dialled = dial.await.unwrap();
            assert!(dialled.is_ok(), "{dialled:?}");
            (reasons, accepted)
        });
        assert_eq!(reasons, ["retry"], "one retry, then the validated source");
        assert_eq!(pc.unwrap().peer, "a");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A connection dialled through an endpoint pinned to one runtime keeps
    /// working after the runtime it was dialled from is gone: its driver
    /// runs on the endpoint's runtime, not the caller's.
    #[test]
    fn pinned_endpoint_drives_its_connections_whoever_dials() {
        let dir = ca_of("pinned");
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
