//! The head's side of one control stream: joins, heartbeats, leaves and
//! status requests against the member table, and table pushes to a joined
//! member.
//!
//! ```text
//! (stream opened) ── Join ok ──► Joined ── table changed ──► push Changes
//!       │  Status ─► Members       │ Heartbeat      (at most once per push gap)
//!       │  Join refused ─► Refused  │   Alive: nothing; else Rejoin
//!                                   │ Leave ─► Ack
//! ```
//!
//! Pushes carry only the members that changed since the stream's last
//! table, and come at most once per push gap: a burst of joins costs each
//! member one push, and a steady heartbeat costs the head O(log n) work and
//! no push at all.
//!
//! Requests are checked against the stream's identity (the member name and
//! incarnation its hello proved, and its certificate's role): a join or
//! heartbeat for another name is refused, and so is a second live process
//! under a taken name ([`ControlReply::NameTaken`]). The machine holds no
//! table itself; the caller passes the head's [`Membership`] in.

use std::time::{Duration, Instant};

use crate::control::{ControlReply, ControlRequest};
use crate::hello::Refusal;
use crate::ids::MemberName;
use crate::incarnation::{Incarnation, MemberRef};
use crate::membership::{HeartbeatOutcome, JoinRefused, Membership, NameHolder, check_join};
use crate::role::Role;

/// The current table as a control reply (one page: see
/// [`crate::control::paginate`]).
pub fn members_reply(head: &str, m: &Membership) -> ControlReply {
    ControlReply::Members {
        version: m.version(),
        head: MemberName::from(head),
        members: m.view(),
        revoked: m.revoked().to_vec(),
        more: false,
    }
}

/// Least time between two pushes on one stream unless told otherwise.
pub const DEFAULT_PUSH_GAP: Duration = Duration::from_millis(100);

/// One control stream accepted by the head.
#[derive(Debug, Clone)]
pub struct HeadSession {
    head: MemberName,
    /// The member name the peer's hello proved.
    peer: MemberName,
    /// The incarnation the peer's hello named.
    peer_incarnation: Incarnation,
    /// The peer's certificate role.
    role: Role,
    /// The member this stream joined, once it has.
    joined: Option<MemberRef>,
    /// The table version last sent on this stream.
    pushed: u64,
    push_gap: Duration,
    /// When the next push may go.
    next_push: Option<Instant>,
}

/// What a request came to, besides the replies it produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Noted {
    /// Nothing worth logging.
    Nothing,
    /// A member joined.
    Joined(MemberRef),
    /// A join was refused.
    JoinRefused(MemberName, Refusal),
    /// A join was refused: the name is a live member's.
    NameTaken(NameHolder),
    /// A heartbeat from a member that is not up for its incarnation.
    NotUp(MemberName, HeartbeatOutcome),
    /// A member left.
    Left(MemberName),
    /// A member was drained (or already was).
    Draining(MemberName),
}

impl HeadSession {
    /// A session of the head `head` with the peer whose stream's hello
    /// proved the member name `peer` at `incarnation`, with a certificate
    /// of `role`.
    pub fn new(
        head: impl Into<MemberName>,
        peer: impl Into<MemberName>,
        incarnation: Incarnation,
        role: Role,
    ) -> Self {
        Self {
            head: head.into(),
            peer: peer.into(),
            peer_incarnation: incarnation,
            role,
            joined: None,
            pushed: 0,
            push_gap: DEFAULT_PUSH_GAP,
            next_push: None,
        }
    }

    /// Sets the least time between two pushes.
    pub fn with_push_gap(mut self, gap: Duration) -> Self {
        self.push_gap = gap;
        self
    }

    /// The member this stream joined, if any.
    pub fn joined(&self) -> Option<&MemberRef> {
        self.joined.as_ref()
    }

    /// Handles one request at `now`; returns what to send back (nothing
    /// for a live heartbeat) and what happened.
    pub fn handle_request(
        &mut self,
        now: Instant,
        request: ControlRequest,
        m: &mut Membership,
    ) -> (Option<ControlReply>, Noted) {
        match request {
            ControlRequest::Status => (Some(members_reply(&self.head, m)), Noted::Nothing),
            // Served by the node's control service, which owns its actors.
            ControlRequest::Stop { .. }
            | ControlRequest::Supervisors
            | ControlRequest::Placement(_)
            | ControlRequest::Ledger(_)
            | ControlRequest::Jobs(_)
            | ControlRequest::Objects
            | ControlRequest::Gpus
            | ControlRequest::Heard
            | ControlRequest::Spawn(_) => (None, Noted::Nothing),
            ControlRequest::Join(req) => {
                let member = MemberRef::new(req.name.clone(), req.incarnation);
                let joined = check_join(&req, &self.peer, self.peer_incarnation, self.role)
                    .map_err(JoinRefused::from)
                    .and_then(|()| m.join(now, req, self.role));
                match joined {
                    Ok(()) => {
                        self.joined = Some(member.clone());
                        self.pushed = m.version();
                        self.next_push = Some(now + self.push_gap);
                        (Some(members_reply(&self.head, m)), Noted::Joined(member))
                    }
                    Err(JoinRefused::Refused(r)) => (
                        Some(ControlReply::Refused(r)),
                        Noted::JoinRefused(member.name.clone(), r),
                    ),
                    Err(JoinRefused::NameTaken(holder)) => (
                        Some(ControlReply::NameTaken(holder.clone())),
                        Noted::NameTaken(holder),
                    ),
                }
            }
            ControlRequest::Heartbeat {
                name,
                incarnation,
                actors,
                version,
            } => {
                if name != self.peer {
                    return (
                        Some(ControlReply::Refused(Refusal::IdentityMismatch)),
                        Noted::Nothing,
                    );
                }
                match m.heartbeat(now, &name, incarnation, actors) {
                    HeartbeatOutcome::Alive => {
                        // A member behind what was pushed lost a push (or
                        // it crossed this heartbeat): push again from its
                        // version; changes are idempotent.
                        if version < self.pushed && self.joined.is_some() {
                            self.pushed = version;
                        }
                        (None, Noted::Nothing)
                    }
                    outcome => (Some(ControlReply::Rejoin), Noted::NotUp(name, outcome)),
                }
            }
            ControlRequest::Drain { name, within_ms } => {
                let sender = crate::authority::Sender::peer(&self.peer, self.role);
                if let Err(why) = crate::authority::may_drain(sender, &name) {
                    return (Some(ControlReply::Denied(why)), Noted::Nothing);
                }
                let outcome = m.drain(&name, Duration::from_millis(within_ms));
                let noted = match outcome {
                    crate::membership::DrainOutcome::Draining => Noted::Draining(name),
                    _ => Noted::Nothing,
                };
                (Some(ControlReply::Drain(outcome)), noted)
            }
            ControlRequest::Leave { name, incarnation } => {
                // Leaving in another's name is refused (and counted), as
                // a heartbeat in another's name is.
                if name != self.peer {
                    return (
                        Some(ControlReply::Refused(Refusal::IdentityMismatch)),
                        Noted::Nothing,
                    );
                }
                let left = m.leave(now, &name, incarnation);
                (
                    Some(ControlReply::Ack),
                    if left {
                        Noted::Left(name)
                    } else {
                        Noted::Nothing
                    },
                )
            }
        }
    }

    /// The changes to push at `now`, if this stream joined, the table
    /// changed since its last table, and the push gap has passed.
    pub fn poll_push(&mut self, now: Instant, m: &Membership) -> Option<ControlReply> {
        if self.joined.is_none() || m.version() == self.pushed {
            return None;
        }
        if self.next_push.is_some_and(|at| now < at) {
            return None;
        }
        let since = self.pushed;
        let changed = m.changes_since(since);
        let revoked = m.revoked_since(since);
        let removed = m.removed_since(since);
        self.pushed = m.version();
        self.next_push = Some(now + self.push_gap);
        Some(ControlReply::Changes {
            since,
            version: self.pushed,
            head: self.head.clone(),
            changed,
            removed,
            revoked,
            more: false,
        })
    }

    /// When a pending push may go, if one is pending.
    pub fn poll_timeout(&self, m: &Membership) -> Option<Instant> {
        if self.joined.is_none() || m.version() == self.pushed {
            return None;
        }
        // Set by the join.
        self.next_push
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::Unauthorized;
    use crate::membership::{DetectorConfig, JoinRequest, MemberState};
    use crate::resources::Resources;

    fn join(name: &str, incarnation: Incarnation) -> ControlRequest {
        ControlRequest::Join(JoinRequest {
            name: name.into(),
            addr: "127.0.0.1:1".into(),
            bulk_addr: "127.0.0.1:2".into(),
            host: "h".into(),
            incarnation,
            resources: Resources::default(),
            held: Vec::new(),
        })
    }

    fn heartbeat(name: &str, incarnation: Incarnation, version: u64) -> ControlRequest {
        ControlRequest::Heartbeat {
            name: name.into(),
            incarnation,
            actors: 0,
            version,
        }
    }

    #[test]
    fn a_worker_drains_itself_an_admin_any_member_and_no_one_else_another() {
        use crate::membership::DrainOutcome;
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        for n in ["n1", "n2"] {
            HeadSession::new("head", n, Incarnation::new(1), Role::Worker).handle_request(
                t0,
                join(n, Incarnation::new(1)),
                &mut m,
            );
        }
        let drain = |name: &str| ControlRequest::Drain {
            name: name.into(),
            within_ms: 30_000,
        };
        let mut n1 = HeadSession::new("head", "n1", Incarnation::new(1), Role::Worker);
        let (reply, noted) = n1.handle_request(t0, drain("n2"), &mut m);
        assert_eq!(reply, Some(ControlReply::Denied(Unauthorized::Drain)));
        assert_eq!(noted, Noted::Nothing);
        assert_eq!(m.get("n2").unwrap().state, MemberState::Up);
        let mut driver = HeadSession::new("head", "d~1", Incarnation::TOOL, Role::Driver);
        assert_eq!(
            driver.handle_request(t0, drain("n2"), &mut m).0,
            Some(ControlReply::Denied(Unauthorized::Drain))
        );
        let (reply, noted) = n1.handle_request(t0, drain("n1"), &mut m);
        assert_eq!(reply, Some(ControlReply::Drain(DrainOutcome::Draining)));
        assert_eq!(noted, Noted::Draining("n1".into()));
        assert_eq!(m.get("n1").unwrap().state, MemberState::Draining);
        let mut admin = HeadSession::new("head", "ops", Incarnation::TOOL, Role::Admin);
        assert_eq!(
            admin.handle_request(t0, drain("n2"), &mut m).0,
            Some(ControlReply::Drain(DrainOutcome::Draining))
        );
        assert_eq!(
            admin.handle_request(t0, drain("n9"), &mut m).0,
            Some(ControlReply::Drain(DrainOutcome::Unknown))
        );
    }

    #[test]
    fn a_member_joins_heartbeats_gets_pushes_and_leaves() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        let mut s = HeadSession::new("head", "n1", Incarnation::new(3), Role::Worker);
        assert_eq!(s.poll_push(t0, &m), None, "not joined: no push");
        let (reply, noted) = s.handle_request(t0, join("n1", Incarnation::new(3)), &mut m);
        assert!(matches!(reply, Some(ControlReply::Members { .. })));
        assert_eq!(
            noted,
            Noted::Joined(MemberRef::new("n1", Incarnation::new(3)))
        );
        assert_eq!(
            s.poll_push(t0, &m),
            None,
            "the join reply carried this version"
        );
        let v = m.version();
        assert_eq!(
            s.handle_request(t0, heartbeat("n1", Incarnation::new(3), v), &mut m)
                .0,
            None
        );

        let mut other = HeadSession::new("head", "n2", Incarnation::new(1), Role::Worker);
        other.handle_request(t0, join("n2", Incarnation::new(1)), &mut m);
        HeadSession::new("head", "n3", Incarnation::new(1), Role::Worker).handle_request(
            t0,
            join("n3", Incarnation::new(1)),
            &mut m,
        );
        assert_eq!(s.poll_push(t0, &m), None, "within the push gap");
        let due = s.poll_timeout(&m).unwrap();
        assert_eq!(due, t0 + DEFAULT_PUSH_GAP);
        assert!(
            matches!(s.poll_push(due, &m), Some(ControlReply::Changes { changed, .. })
                if changed.iter().map(|v| v.name.as_str()).collect::<Vec<_>>() == ["n2", "n3"]),
            "both joins in one push, and only they"
        );
        assert_eq!(
            s.poll_push(due + DEFAULT_PUSH_GAP, &m),
            None,
            "pushed once per version"
        );
        assert_eq!(s.poll_timeout(&m), None);

        // A heartbeat from behind (a push was lost) brings the changes
        // since its version again.
        s.handle_request(due, heartbeat("n1", Incarnation::new(3), v), &mut m);
        assert!(matches!(
            s.poll_push(due + DEFAULT_PUSH_GAP, &m),
            Some(ControlReply::Changes { changed, .. }) if changed.len() == 2
        ));

        let (reply, noted) = s.handle_request(
            t0,
            ControlRequest::Leave {
                name: "n1".into(),
                incarnation: Incarnation::new(3),
            },
            &mut m,
        );
        assert_eq!(
            (reply, noted),
            (Some(ControlReply::Ack), Noted::Left("n1".into()))
        );
        assert_eq!(m.get("n1").unwrap().state, MemberState::Left);
    }

    #[test]
    fn requests_for_another_name_are_refused() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        let mut s = HeadSession::new("head", "n1", Incarnation::new(3), Role::Worker);
        let (reply, _) = s.handle_request(t0, join("n2", Incarnation::new(1)), &mut m);
        assert_eq!(
            reply,
            Some(ControlReply::Refused(Refusal::IdentityMismatch))
        );
        assert!(m.get("n2").is_none());
        let (reply, _) = s.handle_request(t0, heartbeat("n2", Incarnation::new(1), 0), &mut m);
        assert_eq!(
            reply,
            Some(ControlReply::Refused(Refusal::IdentityMismatch))
        );
        // A leave for another name is refused and changes nothing.
        other_joins(&mut m, t0);
        let (reply, noted) = s.handle_request(
            t0,
            ControlRequest::Leave {
                name: "n2".into(),
                incarnation: Incarnation::new(1),
            },
            &mut m,
        );
        assert_eq!(
            (reply, noted),
            (
                Some(ControlReply::Refused(Refusal::IdentityMismatch)),
                Noted::Nothing
            )
        );
        assert_eq!(m.get("n2").unwrap().state, MemberState::Up);
    }

    fn other_joins(m: &mut Membership, t0: Instant) {
        HeadSession::new("head", "n2", Incarnation::new(1), Role::Worker).handle_request(
            t0,
            join("n2", Incarnation::new(1)),
            m,
        );
    }

    #[test]
    fn a_heartbeat_from_a_member_marked_down_asks_it_to_rejoin() {
        let t0 = Instant::now();
        let config = DetectorConfig::default();
        let mut m = Membership::new(config);
        let mut s = HeadSession::new("head", "n1", Incarnation::new(1), Role::Worker);
        s.handle_request(t0, join("n1", Incarnation::new(1)), &mut m);
        let later = t0 + config.down_after * 2;
        m.poll_down(later);
        let (reply, noted) =
            s.handle_request(later, heartbeat("n1", Incarnation::new(1), 0), &mut m);
        assert_eq!(reply, Some(ControlReply::Rejoin));
        assert_eq!(noted, Noted::NotUp("n1".into(), HeartbeatOutcome::NotUp));
        // The same incarnation may not join again; a newer one may.
        let (reply, _) = s.handle_request(later, join("n1", Incarnation::new(1)), &mut m);
        assert_eq!(
            reply,
            Some(ControlReply::Refused(Refusal::StaleIncarnation))
        );
        // A newer incarnation opens a stream of its own.
        let mut s = HeadSession::new("head", "n1", Incarnation::new(2), Role::Worker);
        let (reply, _) = s.handle_request(later, join("n1", Incarnation::new(2)), &mut m);
        assert!(matches!(reply, Some(ControlReply::Members { .. })));
    }

    #[test]
    fn a_second_live_process_is_told_the_name_is_taken_and_the_first_stays() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        HeadSession::new("head", "w1", Incarnation::new(1), Role::Worker).handle_request(
            t0,
            join("w1", Incarnation::new(1)),
            &mut m,
        );
        let mut second = HeadSession::new("head", "w1", Incarnation::new(2), Role::Worker);
        let (reply, noted) = second.handle_request(t0, join("w1", Incarnation::new(2)), &mut m);
        assert!(
            matches!(&reply, Some(ControlReply::NameTaken(h)) if h.incarnation == Incarnation::new(1)),
            "{reply:?}"
        );
        assert!(matches!(noted, Noted::NameTaken(_)));
        assert_eq!(second.joined(), None);
        assert_eq!(m.get("w1").unwrap().incarnation, Incarnation::new(1));
    }

    #[test]
    fn an_observer_may_ask_for_status_but_not_join() {
        let t0 = Instant::now();
        let mut m = Membership::new(DetectorConfig::default());
        let mut s = HeadSession::new("head", "ops~0a", Incarnation::new(1), Role::Observer);
        let (reply, _) = s.handle_request(t0, ControlRequest::Status, &mut m);
        assert!(matches!(reply, Some(ControlReply::Members { .. })));
        let (reply, _) = s.handle_request(t0, join("ops~0a", Incarnation::new(1)), &mut m);
        assert_eq!(reply, Some(ControlReply::Refused(Refusal::RoleCannotJoin)));
    }
}
