//! Mutual TLS 1.3 configurations for quinn from a cluster [`Identity`].
//!
//! Both sides present a certificate signed by the cluster CA; anything else
//! fails the handshake. 0-RTT is off (rustls' defaults, never enabled here).

use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::certs::{Identity, dns_names};

/// ALPN of Flotilla's cluster protocol.
pub const ALPN: &[u8] = b"flotilla/1";

/// The server name a dialer passes when it does not know the acceptor's
/// name yet (joining a head by address): the chain is still verified
/// against the cluster CA, and the name is taken from the certificate.
pub const ANY_MEMBER: &str = "any-member.flotilla.invalid";

/// Why a TLS configuration could not be built from an identity.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// rustls refused the certificates or key.
    #[error("NODE-TLS-001: invalid certificate or key: {0}")]
    Rustls(#[from] rustls::Error),
    /// The CA file yields no usable root.
    #[error("NODE-TLS-002: invalid cluster CA: {0}")]
    Roots(String),
}

/// The crypto provider: aws-lc-rs (the workspace's only one) with
/// AES-128-GCM first (fast on AES-NI, and QUIC's initial packets need it).
pub fn provider() -> Arc<CryptoProvider> {
    let base = rustls::crypto::aws_lc_rs::default_provider();
    let mut suites = vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
    suites.extend(
        base.cipher_suites
            .iter()
            .copied()
            .filter(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256),
    );
    Arc::new(CryptoProvider {
        cipher_suites: suites,
        ..base
    })
}

fn roots(identity: &Identity) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in &identity.ca {
        roots
            .add(ca.clone())
            .map_err(|e| TlsError::Roots(e.to_string()))?;
    }
    Ok(Arc::new(roots))
}

/// rustls server configuration requiring a client certificate from the CA.
pub fn server_tls(identity: &Identity) -> Result<rustls::ServerConfig, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(identity)?, provider())
        .build()
        .map_err(|e| TlsError::Roots(e.to_string()))?;
    server_with(identity, verifier)
}

/// rustls server configuration for a listener no peer may use: the
/// handshake asks for a client certificate and refuses every one, even
/// the cluster CA's own. ractor_cluster always opens a TCP listener, while
/// members only ever speak to each other over QUIC, behind the gate that
/// checks revocations, incarnations and roles: that listener gets this
/// configuration, so a process on the same host holding a revoked (or
/// any) certificate cannot skip the gate through it.
pub fn refuse_every_client_tls(identity: &Identity) -> Result<rustls::ServerConfig, TlsError> {
    server_with(identity, Arc::new(RefuseEveryClient))
}

/// TLS 1.3 only, the node's certificate, client certificates checked by
/// `verifier`, no early data.
fn server_with(
    identity: &Identity,
    verifier: Arc<dyn ClientCertVerifier>,
) -> Result<rustls::ServerConfig, TlsError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.max_early_data_size = 0;
    Ok(tls)
}

/// Refuses every client certificate (and so never checks a signature).
#[derive(Debug)]
struct RefuseEveryClient;

impl RefuseEveryClient {
    fn refused() -> rustls::Error {
        rustls::Error::General(
            "NODE-TLS-003: this listener takes no connections; members speak over QUIC".into(),
        )
    }
}

impl ClientCertVerifier for RefuseEveryClient {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Err(Self::refused())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(Self::refused())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(Self::refused())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// rustls client configuration presenting the node's certificate and
/// verifying the acceptor against the CA.
pub fn client_tls(identity: &Identity) -> Result<rustls::ClientConfig, TlsError> {
    let inner = WebPkiServerVerifier::builder_with_provider(roots(identity)?, provider())
        .build()
        .map_err(|e| TlsError::Roots(e.to_string()))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(MemberVerifier { inner }))
        .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.enable_early_data = false;
    Ok(tls)
}

/// quinn server configuration.
pub fn quic_server(
    identity: &Identity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig, TlsError> {
    let tls = QuicServerConfig::try_from(server_tls(identity)?)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(tls));
    config.transport_config(transport);
    Ok(config)
}

/// quinn client configuration.
pub fn quic_client(
    identity: &Identity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, TlsError> {
    let tls = QuicClientConfig::try_from(client_tls(identity)?)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut config = quinn::ClientConfig::new(Arc::new(tls));
    config.transport_config(transport);
    Ok(config)
}

/// Verifies the acceptor's chain against the cluster CA and its name against
/// the one dialled, or, for [`ANY_MEMBER`], against the certificate's own
/// name (the caller learns and checks the name after the handshake).
#[derive(Debug)]
struct MemberVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for MemberVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let dialled = server_name.to_str();
        if dialled != ANY_MEMBER {
            return self.inner.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            );
        }
        let own =
            dns_names(end_entity)
                .into_iter()
                .next()
                .ok_or(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::BadEncoding,
                ))?;
        let own = ServerName::try_from(own).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        self.inner
            .verify_server_cert(end_entity, intermediates, &own, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{DEFAULT_VALIDITY, init_ca, issue};
    use flotilla_proto::role::Role;

    /// Runs a handshake between `client` and `server` in memory; the
    /// error that ended it, if one did.
    fn handshake(
        mut client: rustls::ClientConnection,
        mut server: rustls::ServerConnection,
    ) -> Result<(), rustls::Error> {
        for _ in 0..16 {
            let mut bytes = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut bytes).unwrap();
            }
            let mut unread = bytes.as_slice();
            while !unread.is_empty() {
                server.read_tls(&mut unread).unwrap();
                server.process_new_packets()?;
            }
            let mut bytes = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut bytes).unwrap();
            }
            let mut unread = bytes.as_slice();
            while !unread.is_empty() {
                client.read_tls(&mut unread).unwrap();
                client.process_new_packets()?;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake neither ended nor failed");
    }

    #[test]
    fn a_member_certificate_cannot_reach_the_ractor_listener_around_the_gate() {
        let dir = std::env::temp_dir().join(format!("flotilla-tls-refuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        init_ca(&dir, "c", "head").unwrap();
        issue(&dir, "n1", Role::Worker, DEFAULT_VALIDITY, &dir).unwrap();
        let head = Identity::load(&dir, "head").unwrap();
        let member = Identity::load(&dir, "n1").unwrap();
        let client = || {
            rustls::ClientConnection::new(
                Arc::new(client_tls(&member).unwrap()),
                ServerName::try_from(ANY_MEMBER).unwrap(),
            )
            .unwrap()
        };
        let open = rustls::ServerConnection::new(Arc::new(server_tls(&head).unwrap())).unwrap();
        handshake(client(), open).unwrap();
        let closed =
            rustls::ServerConnection::new(Arc::new(refuse_every_client_tls(&head).unwrap()))
                .unwrap();
        let err = handshake(client(), closed).unwrap_err();
        assert!(err.to_string().contains("NODE-TLS-003"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
