//! The first frame on every connection.
//!
//! After mutual TLS has proven which certificate the peer holds, the dialer
//! sends a [`Hello`]: the node name it claims, its incarnation, a digest of
//! the cluster cookie and what the connection is for. The acceptor checks
//! it against the certificate and its own cookie with [`check_hello`], and
//! against what it knows of the dialer's incarnations with
//! [`check_incarnation`], and answers with a [`HelloReply`]; only then does
//! the stream carry traffic.
//!
//! ```text
//! dialer                                        acceptor
//!   ── TLS 1.3, both certificates ──────────────────►
//!   ── Hello {version, purpose, node, inc, cookie} ─►  check_hello(cert name and role, cookie)
//!                                                      check_incarnation(table entry)
//!   ◄─ HelloReply::Accepted / Refused ──────────────
//!   ══ cluster stream (ractor_cluster), control requests or bulk frames ══
//! ```

use rkyv::{Archive, Deserialize, Serialize};

use crate::ids::MemberName;
use crate::incarnation::Incarnation;
use crate::role::{Role, may_speak_as};

/// Version of the hello exchange and of the control messages.
pub const PROTOCOL_VERSION: u16 = 8;

/// The name of the operator's certificate that `node certs init` issues
/// (role admin): `node status`, `node jobs`, and `node embed` drivers,
/// which join as members that offer no resources.
pub const ADMIN_NAME: &str = "admin";

/// The name of the head's certificate that `node certs init` issues
/// unless told another.
pub const HEAD_NAME: &str = "head";

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
    /// An object pulled from the acceptor's store (see [`crate::objects`]);
    /// on the bulk lane.
    Pull,
}

/// A digest (SHA-256) of the cluster cookie: what a hello carries instead
/// of the cookie itself.
pub type CookieDigest = [u8; 32];

/// The dialer's introduction.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the dialer.
    pub version: u16,
    /// What the connection is for.
    pub purpose: Purpose,
    /// The member name the dialer speaks as: its certificate's name, with
    /// an instance tag for roles that run many processes (see
    /// [`crate::role`]).
    pub node: MemberName,
    /// The dialer's incarnation (0 for tools, which open control streams
    /// only).
    pub incarnation: Incarnation,
    /// Digest of the dialer's cluster cookie; must equal the acceptor's.
    pub cookie: CookieDigest,
}

impl Hello {
    /// A hello of this protocol version.
    pub fn new(
        purpose: Purpose,
        node: impl Into<MemberName>,
        incarnation: Incarnation,
        cookie: CookieDigest,
    ) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            purpose,
            node: node.into(),
            incarnation,
            cookie,
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
    /// The claimed name is not one the dialer's certificate may speak as
    /// (its name for heads and workers, its name with an instance tag for
    /// other roles), or differs from the name an earlier stream of the
    /// connection proved.
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
    /// The dialer's cluster cookie differs from the acceptor's.
    #[error(
        "NODE-AUTH-005: the cluster cookie differs; give every node the `cookie` file that `node certs init` wrote into the certs folder"
    )]
    Cookie,
    /// The dialer's incarnation is no longer a member: the acceptor knows
    /// a newer one, or knows this one as down or left.
    #[error(
        "NODE-AUTH-006: this incarnation of the node is no longer a member (down, left or replaced); it must rejoin"
    )]
    OldIncarnation,
    /// Incarnation 0 is for tools, which open control streams only.
    #[error("NODE-AUTH-007: incarnation 0 opens control streams only")]
    ToolIncarnation,
    /// The dialer's certificate carries no role.
    #[error(
        "NODE-AUTH-018: the certificate carries no role; issue a new one with `node certs issue --role …`"
    )]
    NoRole,
    /// Observers read the cluster's state; they never join it.
    #[error("NODE-AUTH-019: an observer certificate queries the cluster; it cannot join it")]
    RoleCannotJoin,
    /// Cluster, bulk and pull streams are for up members only.
    #[error(
        "NODE-AUTH-016: only up members open cluster, bulk and pull streams; join the cluster first"
    )]
    NotMember,
    /// The dialer's certificate has been revoked.
    #[error(
        "NODE-AUTH-020: this certificate has been revoked; issue a new one with `node certs issue`"
    )]
    Revoked,
    /// A join whose addresses, labels or resources exceed their bounds.
    #[error(
        "NODE-JOIN-007: the join's addresses, labels or resources exceed their bounds (64 labels and 64 custom resources of at most 64-byte names and 256-byte values)"
    )]
    TooLarge,
    /// A join's incarnation differs from the one its stream's hello named.
    #[error("NODE-JOIN-008: the join names another incarnation than its stream's hello")]
    IncarnationMismatch,
    /// The certificate already has as many members in the table as one may.
    #[error(
        "NODE-JOIN-011: this certificate already has {} members in the table ({} for a worker pool; up, or ended and not yet forgotten); stop some of its processes, or give them certificates of their own",
        crate::role::MAX_MEMBERS_PER_PRINCIPAL,
        crate::role::MAX_MEMBERS_PER_POOL
    )]
    TooManyMembers,
}

impl Refusal {
    /// A short, stable name for metrics labels and logs.
    pub fn code(self) -> &'static str {
        match self {
            Self::Version => "version",
            Self::IdentityMismatch => "identity_mismatch",
            Self::AdminCannotJoin => "admin_cannot_join",
            Self::NotHead => "not_head",
            Self::StaleIncarnation => "stale_incarnation",
            Self::WrongEndpoint => "wrong_endpoint",
            Self::Cookie => "cookie",
            Self::OldIncarnation => "old_incarnation",
            Self::ToolIncarnation => "tool_incarnation",
            Self::NoRole => "no_role",
            Self::RoleCannotJoin => "role_cannot_join",
            Self::NotMember => "not_member",
            Self::Revoked => "revoked",
            Self::TooLarge => "too_large",
            Self::IncarnationMismatch => "incarnation_mismatch",
            Self::TooManyMembers => "too_many_members",
        }
    }
}

pub use reply::HelloReply;

// rkyv's derive emits undocumented public helper items for enums with
// struct variants; the type itself is documented.
#[allow(missing_docs)]
mod reply {
    use super::{Incarnation, Refusal};
    use crate::ids::MemberName;
    use rkyv::{Archive, Deserialize, Serialize};

    /// The acceptor's answer.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    pub enum HelloReply {
        /// The stream may carry `purpose` traffic.
        Accepted {
            /// The acceptor's node name.
            node: MemberName,
            /// The acceptor's incarnation.
            incarnation: Incarnation,
        },
        /// The connection will be closed.
        Refused(Refusal),
    }
}

/// Checks a hello against the name and role proven by the dialer's
/// certificate and the acceptor's own cookie digest.
pub fn check_hello(
    hello: &Hello,
    cert_name: &str,
    role: Option<Role>,
    cookie: &CookieDigest,
) -> Result<(), Refusal> {
    if hello.version != PROTOCOL_VERSION {
        return Err(Refusal::Version);
    }
    let role = role.ok_or(Refusal::NoRole)?;
    if !may_speak_as(&hello.node, cert_name, role) {
        return Err(Refusal::IdentityMismatch);
    }
    // Compared without an early exit, so the time taken says nothing of
    // where the digests differ.
    if hello
        .cookie
        .iter()
        .zip(cookie)
        .fold(0u8, |d, (a, b)| d | (a ^ b))
        != 0
    {
        return Err(Refusal::Cookie);
    }
    if hello.incarnation.is_tool() && hello.purpose != Purpose::Control {
        return Err(Refusal::ToolIncarnation);
    }
    Ok(())
}

/// Fences a stream on the dialer's incarnation: `known` is what the
/// acceptor's member table holds for the dialer's name (its incarnation
/// and whether it is up), if anything. A stream from an incarnation older
/// than the known one, or from the known one when it is down or left, is
/// refused. An incarnation the table does not hold yet (a node that has
/// just joined or rejoined, whose entry is still on its way) is let in, and
/// so are tools (incarnation 0, control streams only).
pub fn check_incarnation(
    incarnation: Incarnation,
    known: Option<(Incarnation, bool)>,
) -> Result<(), Refusal> {
    match known {
        _ if incarnation.is_tool() => Ok(()),
        Some((current, _)) if incarnation < current => Err(Refusal::OldIncarnation),
        Some((current, false)) if incarnation == current => Err(Refusal::OldIncarnation),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    const COOKIE: CookieDigest = [7; 32];
    const W: Option<Role> = Some(Role::Worker);
    const A: Option<Role> = Some(Role::Admin);

    #[test]
    fn a_certificate_without_a_role_or_speaking_as_another_is_refused() {
        assert_eq!(
            check_hello(&hello("n1", Purpose::Control), "n1", None, &COOKIE),
            Err(Refusal::NoRole)
        );
        // An admin's process speaks with an instance tag; a worker as
        // itself, or as a pool's instance named by a DNS label.
        assert_eq!(
            check_hello(&hello("admin", Purpose::Control), "admin", A, &COOKIE),
            Err(Refusal::IdentityMismatch)
        );
        assert_eq!(
            check_hello(&hello("n1~pod-0a", Purpose::Control), "n1", W, &COOKIE),
            Ok(())
        );
        assert_eq!(
            check_hello(&hello("n1~Pod_0a", Purpose::Control), "n1", W, &COOKIE),
            Err(Refusal::IdentityMismatch)
        );
        assert_eq!(
            check_hello(&hello("n2~pod-0a", Purpose::Control), "n1", W, &COOKIE),
            Err(Refusal::IdentityMismatch)
        );
    }

    fn hello(node: &str, purpose: Purpose) -> Hello {
        Hello::new(purpose, node, Incarnation::new(7), COOKIE)
    }

    #[test]
    fn matching_name_is_accepted() {
        assert_eq!(
            check_hello(&hello("n1", Purpose::Cluster), "n1", W, &COOKIE),
            Ok(())
        );
        assert_eq!(
            check_hello(&hello("admin~0a", Purpose::Control), "admin", A, &COOKIE),
            Ok(())
        );
    }

    #[test]
    fn name_other_than_certificate_is_refused() {
        assert_eq!(
            check_hello(&hello("n2", Purpose::Cluster), "n1", W, &COOKIE),
            Err(Refusal::IdentityMismatch)
        );
    }

    #[test]
    fn other_version_is_refused() {
        let mut h = hello("n1", Purpose::Cluster);
        h.version = PROTOCOL_VERSION + 1;
        assert_eq!(check_hello(&h, "n1", W, &COOKIE), Err(Refusal::Version));
    }

    #[test]
    fn another_cookie_is_refused_for_every_purpose() {
        for purpose in [Purpose::Cluster, Purpose::Control, Purpose::Bulk] {
            let mut h = hello("n1", purpose);
            h.cookie[31] ^= 1;
            assert_eq!(check_hello(&h, "n1", W, &COOKIE), Err(Refusal::Cookie));
        }
    }

    #[test]
    fn incarnation_zero_opens_control_streams_only() {
        let tool = |purpose| Hello::new(purpose, "admin~0a", Incarnation::new(0), COOKIE);
        assert_eq!(
            check_hello(&tool(Purpose::Control), "admin", A, &COOKIE),
            Ok(())
        );
        for purpose in [Purpose::Cluster, Purpose::Bulk] {
            assert_eq!(
                check_hello(&tool(purpose), "admin", A, &COOKIE),
                Err(Refusal::ToolIncarnation)
            );
        }
    }

    #[test]
    fn streams_are_fenced_on_the_known_incarnation() {
        // Unknown yet: a node that has just joined.
        assert_eq!(check_incarnation(Incarnation::new(5), None), Ok(()));
        // The current, up incarnation.
        assert_eq!(
            check_incarnation(Incarnation::new(5), Some((Incarnation::new(5), true))),
            Ok(())
        );
        // Newer than the table: its rejoin is on its way.
        assert_eq!(
            check_incarnation(Incarnation::new(6), Some((Incarnation::new(5), false))),
            Ok(())
        );
        assert_eq!(
            check_incarnation(Incarnation::new(6), Some((Incarnation::new(5), true))),
            Ok(())
        );
        // The known incarnation, marked down or left.
        assert_eq!(
            check_incarnation(Incarnation::new(5), Some((Incarnation::new(5), false))),
            Err(Refusal::OldIncarnation)
        );
        // Older than the known one, whatever its state.
        assert_eq!(
            check_incarnation(Incarnation::new(4), Some((Incarnation::new(5), true))),
            Err(Refusal::OldIncarnation)
        );
        assert_eq!(
            check_incarnation(Incarnation::new(4), Some((Incarnation::new(5), false))),
            Err(Refusal::OldIncarnation)
        );
        // Tools.
        assert_eq!(
            check_incarnation(Incarnation::new(0), Some((Incarnation::new(5), true))),
            Ok(())
        );
    }

    #[test]
    fn hello_survives_the_wire() {
        let h = hello("n1", Purpose::Control);
        assert_eq!(wire::decode::<Hello>(&wire::encode(&h)).unwrap(), h);
        let r = HelloReply::Refused(Refusal::OldIncarnation);
        assert_eq!(wire::decode::<HelloReply>(&wire::encode(&r)).unwrap(), r);
    }
}
