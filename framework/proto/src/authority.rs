//! Who may change what a node runs.
//!
//! Two kinds of message change what a node runs: the member table its
//! spawner reaps orphans by, and requests to stop one of its actors. The
//! rules, checked where each message arrives:
//!
//! ```text
//! member table to a spawner   the node itself only (from the head's pushes
//!                             on its authenticated control stream)
//! stop actor A on node N      A's owner (the node that spawned it), or the
//!                             head; the sender is the certificate name of
//!                             the control stream the request came on
//! ```

/// Who sent a message, as the receiving node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender<'a> {
    /// The receiving node itself.
    Local,
    /// Another node, by the name its certificate proves.
    Peer(&'a str),
    /// Another node, unauthenticated (a ractor_cluster message, which
    /// does not say which session it came on).
    Unknown,
}

/// Why a change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthorized {
    /// Only the node itself tells its spawner who is up.
    #[error(
        "NODE-AUTH-008: only the node itself tells its spawner who is up; a member table from another node is refused"
    )]
    MemberTable,
    /// Only an actor's owner or the head may stop it.
    #[error("NODE-AUTH-009: only the node that spawned an actor, or the head, may stop it")]
    Stop,
}

/// Whether `sender` may set the member table a spawner reaps by.
pub fn may_set_members(sender: Sender<'_>) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer(_) | Sender::Unknown => Err(Unauthorized::MemberTable),
    }
}

/// Whether `sender` may stop an actor owned by `owner`, on a node whose
/// head is `head`.
pub fn may_stop(sender: Sender<'_>, owner: &str, head: &str) -> Result<(), Unauthorized> {
    match sender {
        Sender::Local => Ok(()),
        Sender::Peer(name) if name == owner || name == head => Ok(()),
        Sender::Peer(_) | Sender::Unknown => Err(Unauthorized::Stop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_node_itself_sets_its_spawners_member_table() {
        assert_eq!(may_set_members(Sender::Local), Ok(()));
        for sender in [Sender::Peer("head"), Sender::Peer("w1"), Sender::Unknown] {
            assert_eq!(may_set_members(sender), Err(Unauthorized::MemberTable));
        }
    }

    #[test]
    fn an_actor_is_stopped_by_its_owner_the_head_or_its_node_only() {
        assert_eq!(may_stop(Sender::Local, "driver", "head"), Ok(()));
        assert_eq!(may_stop(Sender::Peer("driver"), "driver", "head"), Ok(()));
        assert_eq!(may_stop(Sender::Peer("head"), "driver", "head"), Ok(()));
        assert_eq!(
            may_stop(Sender::Peer("w1"), "driver", "head"),
            Err(Unauthorized::Stop)
        );
        assert_eq!(
            may_stop(Sender::Unknown, "driver", "head"),
            Err(Unauthorized::Stop)
        );
        // No table received yet (no head name): only the owner.
        assert_eq!(
            may_stop(Sender::Peer("w1"), "driver", ""),
            Err(Unauthorized::Stop)
        );
        assert_eq!(may_stop(Sender::Peer("driver"), "driver", ""), Ok(()));
    }
}
