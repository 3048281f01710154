//! Who sent the requests of a control stream: the member name and
//! incarnation its hello proved, and its certificate's role. Every service
//! judges a request by this, never by names written in the request.

use flotilla_proto::authority::Sender;
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::role::Role;

/// Who sent the requests of a control stream, as its hello proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The member name (checked against the certificate at the gate).
    pub(crate) member: MemberName,
    /// The certificate's role.
    pub(crate) role: Role,
    /// The incarnation the hello named (0: a tool, not a member).
    pub(crate) incarnation: Incarnation,
}

impl Caller {
    /// The caller as the permission table sees it.
    pub(crate) fn sender(&self) -> Sender<'_> {
        Sender::peer(&self.member, self.role)
    }
}

/// The permission table's view of `caller` (`None`: this node itself).
pub(crate) fn sender_of(caller: Option<&Caller>) -> Sender<'_> {
    caller.map_or(Sender::Local, Caller::sender)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::authority;

    #[test]
    fn a_caller_is_judged_by_its_member_name_and_role() {
        let c = Caller {
            member: "alice~0a".into(),
            role: Role::Driver,
            incarnation: Incarnation::new(5),
        };
        assert_eq!(c.sender(), Sender::peer("alice~0a", Role::Driver));
        assert!(authority::may_submit_job(c.sender()).is_ok());
        assert!(authority::may_change_ledger(c.sender(), "head").is_err());
        assert_eq!(sender_of(None), Sender::Local);
    }
}
