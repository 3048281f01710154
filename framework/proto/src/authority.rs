//! Who may ask what of a node: the permission table.
//!
//! Every request is judged by the identity of the stream it came on — the
//! member name its hello proved (checked against the certificate) and the
//! role the certificate carries — never by a name or incarnation written
//! in the request. The rules, as docs/runtime-semantics.md states them:
//!
//! ```text
//! request                     observer driver worker admin head
//! status, lists, reads           ✓      ✓      ✓     ✓     ✓
//! join as a member               –      ✓¹     ✓     ✓¹    ✓
//! spawn an actor on a node       –      ✓      ✓     ✓     ✓
//! spawn a head-only kind         the head only (a detached job's driver)
//! stop an actor                  its owner (the member that spawned it), or the head
//! create a placement group       –      ✓      ✓     ✓     ✓     (owned by the caller)
//! create a detached group        the head's detached-job service only
//! grow, shrink, remove a group   its owner ·  any: admin, head
//! change a node's reservations   the head only
//! submit a detached job          –      ✓      –     ✓     ✓
//! stop a detached job            its owner (the submitting certificate) · any: admin, head
//! release a lent object          the member it was lent to
//! pull an object                 anyone holding its reference (its token)
//! member table to a spawner      the node itself only
//! drain a node                   –      –      itself ✓    ✓
//! ¹ offering no resources
//! ```

use rkyv::{Archive, Deserialize, Serialize};

use crate::role::{Role, principal_of};

/// Who sent a message, as the receiving node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender<'a> {
    /// The receiving node itself.
    Local,
    /// Another process, by the member name its stream's hello proved and
    /// its certificate's role.
    Peer {
        /// The member name (see [`crate::role`]).
        member: &'a str,
        /// The certificate's role.
        role: Role,
    },
    /// Another node, unauthenticated (a ractor_cluster message, which
    /// does not say which session it came on).
    Unknown,
}

impl<'a> Sender<'a> {
    /// A peer speaking as `member` with `role`.
    pub fn peer(member: &'a str, role: Role) -> Self {
        Self::Peer { member, role }
    }

    fn role(self) -> Option<Role> {
        match self {
            Self::Local => Some(Role::Head),
            Self::Peer { role, .. } => Some(role),
            Self::Unknown => None,
        }
    }

    fn is_local_or(self, roles: &[Role]) -> bool {
        match self {
            Self::Local => true,
            Self::Peer { role, .. } => roles.contains(&role),
            Self::Unknown => false,
        }
    }

    /// Whether this is the node itself, or the head the member table
    /// names (`head`), speaking with the head's certificate.
    fn is_local_or_head(self, head: &str) -> bool {
        match self {
            Self::Local => true,
            Self::Peer { member, role } => role == Role::Head && member == head,
            Self::Unknown => false,
        }
    }
}

/// Why a request was refused. Stable codes for operators.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthorized {
    /// Only the node itself tells its spawner who is up.
    #[error(
        "NODE-AUTH-008: only the node itself tells its spawner who is up; a member table from another node is refused"
    )]
    MemberTable,
    /// Only an actor's owner or the head may stop it.
    #[error("NODE-AUTH-009: only the node that spawned an actor, or the head, may stop it")]
    Stop,
    /// The caller's role may not make this request at all.
    #[error(
        "NODE-AUTH-010: a certificate of this role may not make this request; issue one with the right --role (node certs issue)"
    )]
    Role,
    /// Only a group's owner, an admin or the head may remove it.
    #[error(
        "NODE-AUTH-011: only the member that created a placement group, an admin or the head may remove it"
    )]
    NotGroupOwner,
    /// Only the head may change a node's reservations.
    #[error("NODE-AUTH-012: only the head may change this node's reservations")]
    NotHead,
    /// Only a job's owner, an admin or the head may stop it.
    #[error(
        "NODE-AUTH-013: only the certificate that submitted a job, an admin or the head may stop it"
    )]
    NotJobOwner,
    /// Only the member an object was lent to may release it.
    #[error("NODE-AUTH-014: only the member an object was lent to may release it")]
    NotBorrower,
    /// The request's reference does not carry the object's token.
    #[error("NODE-AUTH-015: the object reference does not carry the object's token")]
    BadToken,
    /// The stream's peer is not an up member of the cluster: only control
    /// streams are open to tools and to nodes that have not joined.
    #[error(
        "NODE-AUTH-016: only up members open cluster, bulk and pull streams; join the cluster first"
    )]
    NotMember,
    /// A held bundle of a group this head did not create.
    #[error(
        "NODE-AUTH-017: a reported placement group that the head neither knows nor created is not adopted"
    )]
    UnknownGroup,
    /// A kind that acts with the rights the head grants it (a detached
    /// job's driver), asked for by another than the head.
    #[error(
        "NODE-AUTH-024: only the head may spawn this kind: it acts with the rights the head grants (a detached job's driver); submit a job instead"
    )]
    HeadOnlyKind,
    /// A reported placement bundle that no record of the head gives the
    /// node reporting it.
    #[error(
        "NODE-AUTH-025: a reported placement bundle that the head's record does not give this node is not adopted"
    )]
    NotYourBundle,
    /// A detached placement group asked for by another than the head's
    /// detached-job service.
    #[error(
        "NODE-AUTH-026: only the head's detached-job service creates detached placement groups; submit a detached job instead"
    )]
    DetachedGroup,
    /// A drain of another member than the caller, by a role other than
    /// an admin's or the head's.
    #[error(
        "NODE-AUTH-031: a worker may drain only itself or another process of its pool; draining another member takes an admin's certificate"
    )]
    Drain,
    /// Only a job's owner, an admin, an observer or the head may read its
    /// driver's log.
    #[error(
        "NODE-AUTH-033: only the certificate that submitted a job, an admin, an observer or the head may read its log"
    )]
    NotJobReader,
}

impl Unauthorized {
    /// A short, stable name for metrics labels and logs.
    pub fn code(self) -> &'static str {
        match self {
            Self::MemberTable => "member_table",
            Self::Stop => "not_actor_owner",
            Self::Role => "role",
            Self::NotGroupOwner => "not_group_owner",
            Self::NotHead => "not_head",
            Self::NotJobOwner => "not_job_owner",
            Self::NotBorrower => "not_borrower",
            Self::BadToken => "bad_token",
            Self::NotMember => "not_member",
            Self::UnknownGroup => "unknown_group",
            Self::HeadOnlyKind => "head_only_kind",
            Self::NotYourBundle => "not_your_bundle",
            Self::DetachedGroup => "detached_group",
            Self::Drain => "drain",
            Self::NotJobReader => "not_job_reader",
        }
    }
}

/// Whether `sender` may set the member table a spawner reaps by.
pub fn may_set_members(sender: Sender<'_>) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer { .. } | Sender::Unknown => Err(Unauthorized::MemberTable),
    }
}

/// Whether `sender` may stop an actor owned by the member `owner`, on a
/// node whose head is `head`.
pub fn may_stop(sender: Sender<'_>, owner: &str, head: &str) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer { member, .. } if member == owner => Ok(()),
        Sender::Peer { member, role } if role == Role::Head && member == head => Ok(()),
        Sender::Peer { .. } | Sender::Unknown => Err(Unauthorized::Stop),
    }
}

/// Whether `sender` may drain the member `name`: a worker itself (its
/// preemption notice) or another process of its pool (one certificate,
/// one principal), an admin or the head any member.
pub fn may_drain(sender: Sender<'_>, name: &str) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local
        | Sender::Peer {
            role: Role::Admin | Role::Head,
            ..
        } => Ok(()),
        Sender::Peer {
            member,
            role: Role::Worker,
        } if principal_of(member) == principal_of(name) => Ok(()),
        Sender::Peer { .. } | Sender::Unknown => Err(Unauthorized::Drain),
    }
}

/// Whether `sender` may read: status, lists, a node's own state.
pub fn may_read(sender: Sender<'_>) -> Result<(), Unauthorized> {
    sender.role().map(|_| ()).ok_or(Unauthorized::Role)
}

/// Whether `sender` may spawn actors on a node.
pub fn may_spawn(sender: Sender<'_>) -> Result<(), Unauthorized> {
    acting(sender)
}

/// Whether `sender` may spawn a kind only the head spawns (a detached
/// job's driver, which acts with the rights the head grants it), `head`
/// being the head the member table names.
pub fn may_spawn_head_only(sender: Sender<'_>, head: &str) -> Result<(), Unauthorized> {
    if sender.is_local_or_head(head) {
        Ok(())
    } else {
        Err(Unauthorized::HeadOnlyKind)
    }
}

/// Whether `sender` may create a detached placement group (one with no
/// owner, which outlives whoever asked): the head's own detached-job
/// service only, on the head itself.
pub fn may_create_detached_group(sender: Sender<'_>) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        _ => Err(Unauthorized::DetachedGroup),
    }
}

/// Whether `sender` may create a placement group (owned by itself).
pub fn may_create_group(sender: Sender<'_>) -> Result<(), Unauthorized> {
    acting(sender)
}

fn acting(sender: Sender<'_>) -> Result<(), Unauthorized> {
    if sender.is_local_or(&[Role::Head, Role::Worker, Role::Driver, Role::Admin]) {
        Ok(())
    } else {
        Err(Unauthorized::Role)
    }
}

/// Whether `sender` may remove a group owned by the member `owner`
/// (`None`: a detached group, owned by the cluster).
pub fn may_remove_group(sender: Sender<'_>, owner: Option<&str>) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer {
            role: Role::Admin | Role::Head,
            ..
        } => Ok(()),
        Sender::Peer { member, role } if role != Role::Observer && owner == Some(member) => Ok(()),
        _ => Err(Unauthorized::NotGroupOwner),
    }
}

/// Whether `sender` may change this node's reservations, on a node whose
/// head is the member `head`.
pub fn may_change_ledger(sender: Sender<'_>, head: &str) -> Result<(), Unauthorized> {
    if sender.is_local_or_head(head) {
        Ok(())
    } else {
        Err(Unauthorized::NotHead)
    }
}

/// Whether `sender` may submit a detached job.
pub fn may_submit_job(sender: Sender<'_>) -> Result<(), Unauthorized> {
    if sender.is_local_or(&[Role::Head, Role::Driver, Role::Admin]) {
        Ok(())
    } else {
        Err(Unauthorized::Role)
    }
}

/// Whether `sender` may read the driver log of a job submitted by the
/// certificate `owner` (`None`: by the head itself): its owner, admins,
/// observers and the head. A job's log may name its data; other drivers
/// and workers do not read it.
pub fn may_read_job_log(sender: Sender<'_>, owner: Option<&str>) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer {
            role: Role::Admin | Role::Head | Role::Observer,
            ..
        } => Ok(()),
        Sender::Peer { member, role }
            if matches!(role, Role::Driver) && owner == Some(principal_of(member)) =>
        {
            Ok(())
        }
        _ => Err(Unauthorized::NotJobReader),
    }
}

/// Whether `sender` may stop a job submitted by the certificate `owner`
/// (a principal; `None`: submitted by the head itself).
pub fn may_stop_job(sender: Sender<'_>, owner: Option<&str>) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer {
            role: Role::Admin | Role::Head,
            ..
        } => Ok(()),
        Sender::Peer { member, role }
            if matches!(role, Role::Driver) && owner == Some(principal_of(member)) =>
        {
            Ok(())
        }
        _ => Err(Unauthorized::NotJobOwner),
    }
}

/// Whether `sender` may release an object lent to the member `borrower`.
pub fn may_release(sender: Sender<'_>, borrower: &str) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer { member, .. } if member == borrower => Ok(()),
        _ => Err(Unauthorized::NotBorrower),
    }
}

/// Whether a member of `role` may join; `offers` says whether it offers
/// resources. Observers never join; drivers and admins only without
/// resources (work is never placed on them).
pub fn may_join(role: Role, offers: bool) -> Result<(), crate::hello::Refusal> {
    match role {
        Role::Observer => Err(crate::hello::Refusal::RoleCannotJoin),
        r if offers && !r.may_offer_resources() => Err(crate::hello::Refusal::AdminCannotJoin),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::role::ROLES;

    fn peer(member: &str, role: Role) -> Sender<'_> {
        Sender::peer(member, role)
    }

    #[test]
    fn only_the_node_itself_sets_its_spawners_member_table() {
        assert_eq!(may_set_members(Sender::Local), Ok(()));
        for sender in [
            peer("head", Role::Head),
            peer("w1", Role::Worker),
            Sender::Unknown,
        ] {
            assert_eq!(may_set_members(sender), Err(Unauthorized::MemberTable));
        }
    }

    #[test]
    fn an_actor_is_stopped_by_its_owner_the_head_or_its_node_only() {
        let d = "admin~0a";
        assert_eq!(may_stop(Sender::Local, d, "head"), Ok(()));
        assert_eq!(may_stop(peer(d, Role::Admin), d, "head"), Ok(()));
        assert_eq!(may_stop(peer("head", Role::Head), d, "head"), Ok(()));
        // Another process of the same certificate is another member.
        assert_eq!(
            may_stop(peer("admin~0b", Role::Admin), d, "head"),
            Err(Unauthorized::Stop)
        );
        // A worker named like the head is not the head.
        assert_eq!(
            may_stop(peer("head", Role::Worker), d, "head"),
            Err(Unauthorized::Stop)
        );
        assert_eq!(
            may_stop(Sender::Unknown, d, "head"),
            Err(Unauthorized::Stop)
        );
        // No table received yet (no head name): only the owner.
        assert_eq!(
            may_stop(peer("w1", Role::Worker), d, ""),
            Err(Unauthorized::Stop)
        );
    }

    /// The permission table of the module documentation, row by row, for
    /// every role.
    #[test]
    fn the_permission_table_holds_for_every_role() {
        for role in ROLES {
            let me = "me";
            let s = peer(me, role);
            let acting = role != Role::Observer;
            assert!(may_read(s).is_ok(), "{role}: read");
            assert_eq!(may_spawn(s).is_ok(), acting, "{role}: spawn");
            assert_eq!(
                may_spawn_head_only(s, me).is_ok(),
                role == Role::Head,
                "{role}: spawn a head-only kind"
            );
            assert_eq!(
                may_spawn_head_only(s, "other"),
                Err(Unauthorized::HeadOnlyKind),
                "{role}: spawn a head-only kind as another than the head"
            );
            assert_eq!(may_create_group(s).is_ok(), acting, "{role}: create group");
            assert_eq!(
                may_create_detached_group(s),
                Err(Unauthorized::DetachedGroup),
                "{role}: create a detached group"
            );
            assert_eq!(
                may_remove_group(s, Some(me)).is_ok(),
                acting,
                "{role}: remove own group"
            );
            let any = matches!(role, Role::Admin | Role::Head);
            assert_eq!(
                may_remove_group(s, Some("other")).is_ok(),
                any,
                "{role}: remove another's group"
            );
            assert_eq!(may_remove_group(s, None).is_ok(), any, "{role}: detached");
            assert_eq!(
                may_change_ledger(s, me).is_ok(),
                role == Role::Head,
                "{role}: ledger"
            );
            assert_eq!(
                may_submit_job(s).is_ok(),
                matches!(role, Role::Driver | Role::Admin | Role::Head),
                "{role}: submit"
            );
            assert_eq!(
                may_stop_job(s, Some(me)).is_ok(),
                matches!(role, Role::Driver | Role::Admin | Role::Head),
                "{role}: stop own job"
            );
            assert_eq!(
                may_stop_job(s, Some("other")).is_ok(),
                any,
                "{role}: stop another's job"
            );
            assert!(may_release(s, me).is_ok(), "{role}: release own loan");
            assert!(
                may_release(s, "other").is_err(),
                "{role}: release another's"
            );
            assert_eq!(
                may_join(role, false).is_ok(),
                role != Role::Observer,
                "{role}: join"
            );
            assert_eq!(
                may_join(role, true).is_ok(),
                matches!(role, Role::Worker | Role::Head),
                "{role}: join offering resources"
            );
            assert_eq!(
                may_drain(s, me).is_ok(),
                matches!(role, Role::Worker | Role::Admin | Role::Head),
                "{role}: drain itself"
            );
            assert_eq!(may_drain(s, "other").is_ok(), any, "{role}: drain another");
        }
        // The processes of a worker pool share a certificate: each may
        // drain the others (its pod's preStop hook speaks as the pool),
        // and no other worker's.
        let pod = peer("pool~pod-a", Role::Worker);
        assert_eq!(may_drain(pod, "pool~pod-b"), Ok(()));
        assert_eq!(may_drain(peer("pool", Role::Worker), "pool~pod-b"), Ok(()));
        assert_eq!(may_drain(pod, "w1"), Err(Unauthorized::Drain));
        assert_eq!(may_drain(pod, "w1~pod-a"), Err(Unauthorized::Drain));
        // A job is owned by the certificate: any process of it may stop it.
        assert_eq!(
            may_stop_job(peer("alice~01", Role::Driver), Some("alice")),
            Ok(())
        );
        assert_eq!(
            may_stop_job(peer("bob~01", Role::Driver), Some("alice")),
            Err(Unauthorized::NotJobOwner)
        );
        // Its log: its owner, admins, observers and the head.
        for (who, role, may) in [
            ("alice~02", Role::Driver, true),
            ("bob~01", Role::Driver, false),
            ("ops", Role::Observer, true),
            ("root", Role::Admin, true),
            ("w1", Role::Worker, false),
            ("head", Role::Head, true),
        ] {
            assert_eq!(
                may_read_job_log(peer(who, role), Some("alice")).is_ok(),
                may,
                "{who}"
            );
        }
        assert_eq!(
            may_read_job_log(peer("bob~01", Role::Driver), None),
            Err(Unauthorized::NotJobReader)
        );
        // The ledger's head is a member named as the table's head.
        assert_eq!(
            may_change_ledger(peer("h2", Role::Head), "head"),
            Err(Unauthorized::NotHead)
        );
        assert_eq!(may_read(Sender::Unknown), Err(Unauthorized::Role));
    }
}
