//! The first frame on every connection.
//!
//! After mutual TLS has proven which certificate the peer holds, the dialer
//! sends a [`Hello`]: the node name it claims, its incarnation and what the
//! connection is for. The acceptor checks it against the certificate with
//! [`check_hello`] and answers with a [`HelloReply`]; only then does the
//! stream carry cluster traffic.
//!
//! ```text
//! dialer                                acceptor
//!   ── TLS 1.3, both certificates ──────────►
//!   ── Hello {version, purpose, node, inc} ─►  check_hello(cert name)
//!   ◄─ HelloReply::Accepted / Refused ──────
//!   ══ cluster stream (ractor_cluster) or control requests ══
//! ```

use rkyv::{Archive, Deserialize, Serialize};

/// Version of the hello exchange and of the control messages.
pub const PROTOCOL_VERSION: u16 = 3;

/// The certificate name of operators' tools: `node status`, and `node embed`
/// drivers, which join as members that offer no resources.
pub const ADMIN_NAME: &str = "admin";

/// What a connection is for.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A node session: the stream is handed to ractor_cluster.
    Cluster,
    /// Requests from a tool or a node: status, join.
    Control,
    /// Large messages for actors on the acceptor, one after another, each a
    /// [`crate::bulk::BulkHeader`] frame followed by a payload frame.
    Bulk,
}

/// The dialer's introduction.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the dialer.
    pub version: u16,
    /// What the connection is for.
    pub purpose: Purpose,
    /// The name the dialer claims; must equal its certificate's name.
    pub node: String,
    /// The dialer's incarnation (0 for tools).
    pub incarnation: u64,
}

impl Hello {
    /// A hello of this protocol version.
    pub fn new(purpose: Purpose, node: impl Into<String>, incarnation: u64) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            purpose,
            node: node.into(),
            incarnation,
        }
    }
}

/// Why a hello was refused. Stable codes for operators.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The dialer speaks another protocol version.
    #[error(
        "NODE-PROTO-001: protocol version mismatch; run the same `node` release on every member"
    )]
    Version,
    /// The claimed name differs from the name in the dialer's certificate.
    #[error(
        "NODE-AUTH-002: claimed node name differs from the certificate's name; issue a certificate for this name with `node certs issue`"
    )]
    IdentityMismatch,
    /// The admin certificate may query, or join as a driver that offers no
    /// resources; it cannot host work.
    #[error(
        "NODE-AUTH-004: the admin certificate joins only as a driver that offers no resources; issue a node certificate with `node certs issue`"
    )]
    AdminCannotJoin,
    /// Joins go to the head; this node is not it.
    #[error("NODE-JOIN-003: this node is not the head; point --head at the head's address")]
    NotHead,
    /// A member with this name and a newer incarnation is already up.
    #[error("NODE-JOIN-005: a newer incarnation of this node is a member; stop it first")]
    StaleIncarnation,
    /// The stream's purpose belongs on the node's other endpoint: bulk
    /// streams on its bulk lane (`bulk_addr`), everything else on its
    /// listen address.
    #[error("NODE-WIRE-004: this endpoint does not take streams of that purpose")]
    WrongEndpoint,
}

pub use reply::HelloReply;

// rkyv's derive emits undocumented public helper items for enums with
// struct variants; the type itself is documented.
#[allow(missing_docs)]
mod reply {
    use super::Refusal;
    use rkyv::{Archive, Deserialize, Serialize};

    /// The acceptor's answer.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    pub enum HelloReply {
        /// The stream may carry `purpose` traffic.
        Accepted {
            /// The acceptor's node name.
            node: String,
            /// The acceptor's incarnation.
            incarnation: u64,
        },
        /// The connection will be closed.
        Refused(Refusal),
    }
}

/// Checks a hello against the name proven by the dialer's certificate.
pub fn check_hello(hello: &Hello, cert_name: &str) -> Result<(), Refusal> {
    if hello.version != PROTOCOL_VERSION {
        return Err(Refusal::Version);
    }
    if hello.node != cert_name {
        return Err(Refusal::IdentityMismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    fn hello(node: &str, purpose: Purpose) -> Hello {
        Hello::new(purpose, node, 7)
    }

    #[test]
    fn matching_name_is_accepted() {
        assert_eq!(check_hello(&hello("n1", Purpose::Cluster), "n1"), Ok(()));
        assert_eq!(
            check_hello(&hello("admin", Purpose::Control), "admin"),
            Ok(())
        );
    }

    #[test]
    fn name_other_than_certificate_is_refused() {
        assert_eq!(
            check_hello(&hello("n2", Purpose::Cluster), "n1"),
            Err(Refusal::IdentityMismatch)
        );
    }

    #[test]
    fn other_version_is_refused() {
        let mut h = hello("n1", Purpose::Cluster);
        h.version = PROTOCOL_VERSION + 1;
        assert_eq!(check_hello(&h, "n1"), Err(Refusal::Version));
    }

    #[test]
    fn hello_survives_the_wire() {
        let h = hello("n1", Purpose::Control);
        assert_eq!(wire::decode::<Hello>(&wire::encode(&h)).unwrap(), h);
        let r = HelloReply::Refused(Refusal::StaleIncarnation);
        assert_eq!(wire::decode::<HelloReply>(&wire::encode(&r)).unwrap(), r);
    }
}
