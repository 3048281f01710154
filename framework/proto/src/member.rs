//! A member's side of its control stream to the head: join, heartbeat,
//! apply the tables the head pushes, rejoin when told to, leave cleanly.
//!
//! ```text
//!            connect due                connected            Members
//! Disconnected ──────────► Connecting ────────────► Joining ──────────► Joined ─┐
//!      ▲                      │ failed               │ Refused ─► Refused      │ heartbeat every
//!      └──────────────────────┴──────── link lost ───┴──── or Rejoin ◄─────────┘ interval
//!                                    (Rejoin: a new incarnation first)
//! shutdown (Joined): Leave ──► Leaving ── Ack, or leave_grace passed ──► Left
//! Joining ── NameTaken ──► Disconnected (retry) … past name_grace ──► Refused
//! ```
//!
//! A join answered [`ControlReply::NameTaken`] (another live process has
//! the name) is tried again every heartbeat interval for `name_grace`: a
//! restart after a crash gets in once the head has not heard its
//! predecessor for two heartbeat intervals; a second live process gives
//! up, naming the first ([`MemberEvent::NameTaken`]).
//!
//! The caller owns the stream: it opens one on [`MemberEvent::Connect`],
//! reports [`MemberLink::handle_connected`] or [`MemberLink::handle_link_lost`],
//! sends what [`MemberLink::poll_transmit`] yields, feeds replies to
//! [`MemberLink::handle_reply`] and wakes at [`MemberLink::poll_timeout`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::control::{ControlReply, ControlRequest, Pages};
use crate::hello::Refusal;
use crate::ids::MemberName;
use crate::incarnation::Incarnation;
use crate::membership::{JoinRequest, MemberView, NameHolder};

/// Timing of a member's control link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberConfig {
    /// How often a joined member heartbeats, and how long it waits before
    /// reconnecting after the link broke.
    pub heartbeat_interval: Duration,
    /// How long a leaving member waits for the head's acknowledgement.
    pub leave_grace: Duration,
    /// How long a join may wait for its answer before the stream is given
    /// up and opened again.
    pub join_timeout: Duration,
    /// How long a join keeps trying while the head says another live
    /// process has the name.
    pub name_grace: Duration,
}

impl Default for MemberConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            leave_grace: Duration::from_secs(2),
            join_timeout: Duration::from_secs(10),
            name_grace: Duration::from_secs(5),
        }
    }
}

/// Members received from the head.
#[derive(Debug, Clone, PartialEq)]
pub struct TableUpdate {
    /// The head's table version.
    pub version: u64,
    /// The head's name.
    pub head: MemberName,
    /// Whether `members` is the whole table (else: only what changed).
    pub whole: bool,
    /// Every member, or the members that changed.
    pub members: Vec<MemberView>,
    /// Members forgotten: drop them (with changes only).
    pub removed: Vec<MemberName>,
    /// The serials of revoked certificates, when they changed (always with
    /// a whole table).
    pub revoked: Option<Vec<Vec<u8>>>,
}

/// What the caller must know or do.
#[derive(Debug, Clone, PartialEq)]
pub enum MemberEvent {
    /// Open a control stream to the head.
    Connect,
    /// The head sent the member table.
    Table(TableUpdate),
    /// The head no longer counts this incarnation as up: give the member a
    /// new, larger incarnation with [`MemberLink::set_incarnation`] before
    /// it reconnects.
    Reincarnate,
    /// The head refused the join.
    Refused(Refusal),
    /// The head refused the join for `name_grace`: another live process
    /// has the name.
    NameTaken(NameHolder),
    /// The leave is done (acknowledged, or its grace ran out).
    Left,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Disconnected { retry_at: Instant },
    Connecting,
    Joining { until: Instant },
    Joined { next_heartbeat: Instant },
    Leaving { until: Instant },
    Left,
    Refused,
}

/// The member's control link state machine.
#[derive(Debug, Clone)]
pub struct MemberLink {
    config: MemberConfig,
    join: JoinRequest,
    actors: u32,
    version: u64,
    state: State,
    /// Joins sent so far.
    joins_sent: u32,
    /// Since when the head has said the name is taken.
    name_taken_since: Option<Instant>,
    /// Pages of a table reply not yet complete.
    pages: Pages,
    transmits: VecDeque<ControlRequest>,
    events: VecDeque<MemberEvent>,
}

impl MemberLink {
    /// A link that will join with `join` (name, addresses, incarnation,
    /// resources), connecting at once.
    pub fn new(now: Instant, config: MemberConfig, join: JoinRequest) -> Self {
        Self {
            config,
            join,
            actors: 0,
            version: 0,
            state: State::Disconnected { retry_at: now },
            joins_sent: 0,
            name_taken_since: None,
            pages: Pages::default(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The link's timing.
    pub fn config(&self) -> &MemberConfig {
        &self.config
    }

    /// The incarnation the member joins and heartbeats with.
    pub fn incarnation(&self) -> Incarnation {
        self.join.incarnation
    }

    /// Sets a new incarnation (after [`MemberEvent::Reincarnate`]).
    pub fn set_incarnation(&mut self, incarnation: Incarnation) {
        self.join.incarnation = incarnation;
    }

    /// Sets the placement-group bundles the next join reports.
    pub fn set_held(&mut self, held: Vec<crate::ledger::Held>) {
        self.join.held = held;
    }

    /// Sets the actor count the next heartbeats report.
    pub fn set_actors(&mut self, actors: u32) {
        self.actors = actors;
    }

    /// Whether the member is joined (its last join was accepted and the
    /// link has not broken since).
    pub fn is_joined(&self) -> bool {
        matches!(self.state, State::Joined { .. })
    }

    /// Whether the link is finished (left or refused).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Left | State::Refused)
    }

    /// The stream asked for by [`MemberEvent::Connect`] is open.
    pub fn handle_connected(&mut self, now: Instant) {
        if self.state == State::Connecting {
            self.state = State::Joining {
                until: now + self.config.join_timeout,
            };
            self.transmits
                .push_back(ControlRequest::Join(self.join.clone()));
            self.joins_sent += 1;
        }
    }

    /// The head refused the stream itself at its gate (its hello), while
    /// connecting: a refusal of this incarnation as no longer a member
    /// (the head marked it down while the link was cut) brings the member
    /// back as a new incarnation; any other refusal is final.
    pub fn handle_refused(&mut self, now: Instant, refusal: Refusal) {
        match self.state {
            State::Left | State::Refused => {}
            State::Leaving { .. } => self.finish_leave(),
            _ if refusal == Refusal::OldIncarnation => self.reincarnate(now),
            _ => {
                self.transmits.clear();
                self.state = State::Refused;
                self.events.push_back(MemberEvent::Refused(refusal));
            }
        }
    }

    /// The stream could not be opened, or broke.
    pub fn handle_link_lost(&mut self, now: Instant) {
        self.pages = Pages::default();
        match self.state {
            State::Leaving { .. } => self.finish_leave(),
            State::Left | State::Refused => {}
            _ => {
                self.transmits.clear();
                self.state = State::Disconnected {
                    retry_at: now + self.config.heartbeat_interval,
                };
            }
        }
    }

    /// A reply from the head arrived (a page of a table is held until its
    /// last page is in).
    pub fn handle_reply(&mut self, now: Instant, reply: ControlReply) {
        let Some(reply) = self.pages.push(reply) else {
            return;
        };
        match (self.state, reply) {
            (
                State::Joining { .. } | State::Joined { .. },
                ControlReply::Members {
                    version,
                    head,
                    members,
                    revoked,
                    ..
                },
            ) => {
                self.name_taken_since = None;
                // An older table than the one held is stale.
                if version < self.version && self.is_joined() {
                    return;
                }
                if matches!(self.state, State::Joining { .. }) {
                    self.state = State::Joined {
                        next_heartbeat: now + self.config.heartbeat_interval,
                    };
                }
                self.version = version;
                self.events.push_back(MemberEvent::Table(TableUpdate {
                    version,
                    head,
                    whole: true,
                    members,
                    removed: Vec::new(),
                    revoked: Some(revoked),
                }));
            }
            (
                State::Joined { .. },
                ControlReply::Changes {
                    since,
                    version,
                    head,
                    changed,
                    removed,
                    revoked,
                    ..
                },
            ) => {
                // Changes against a later table than the one held mean a
                // push was lost: keep the version, so the next heartbeat
                // asks for them again. An older push is stale.
                if since > self.version || version < self.version {
                    return;
                }
                self.version = version;
                self.events.push_back(MemberEvent::Table(TableUpdate {
                    version,
                    head,
                    whole: false,
                    members: changed,
                    removed,
                    revoked,
                }));
            }
            // This incarnation's earlier join was recorded and then marked
            // down before its answer got through: come back as a new one.
            (State::Joining { .. }, ControlReply::Refused(Refusal::StaleIncarnation))
                if self.joins_sent > 1 =>
            {
                self.reincarnate(now);
            }
            (State::Joining { .. }, ControlReply::Refused(r)) => {
                self.state = State::Refused;
                self.events.push_back(MemberEvent::Refused(r));
            }
            (State::Joining { .. }, ControlReply::NameTaken(holder)) => {
                let since = *self.name_taken_since.get_or_insert(now);
                self.transmits.clear();
                if now.saturating_duration_since(since) >= self.config.name_grace {
                    self.state = State::Refused;
                    self.events.push_back(MemberEvent::NameTaken(holder));
                } else {
                    self.state = State::Disconnected {
                        retry_at: now + self.config.heartbeat_interval,
                    };
                }
            }
            (State::Joined { .. }, ControlReply::Rejoin | ControlReply::Refused(_)) => {
                self.reincarnate(now);
            }
            (State::Leaving { .. }, ControlReply::Ack) => self.finish_leave(),
            _ => {}
        }
    }

    /// Leave cleanly: a joined member sends its leave and waits for the
    /// acknowledgement; any other is done at once.
    pub fn handle_shutdown(&mut self, now: Instant) {
        match self.state {
            State::Joined { .. } => {
                self.transmits.clear();
                self.transmits.push_back(ControlRequest::Leave {
                    name: self.join.name.clone(),
                    incarnation: self.join.incarnation,
                });
                self.state = State::Leaving {
                    until: now + self.config.leave_grace,
                };
            }
            State::Leaving { .. } | State::Left | State::Refused => {}
            _ => self.finish_leave(),
        }
    }

    fn reincarnate(&mut self, now: Instant) {
        self.transmits.clear();
        self.events.push_back(MemberEvent::Reincarnate);
        self.state = State::Disconnected {
            retry_at: now + self.config.heartbeat_interval,
        };
    }

    fn finish_leave(&mut self) {
        self.transmits.clear();
        self.state = State::Left;
        self.events.push_back(MemberEvent::Left);
    }

    /// Time passed: heartbeats fall due, reconnects are asked for, a leave
    /// gives up waiting.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Disconnected { retry_at } if now >= retry_at => {
                self.state = State::Connecting;
                self.events.push_back(MemberEvent::Connect);
            }
            State::Joined { next_heartbeat } if now >= next_heartbeat => {
                self.transmits.push_back(ControlRequest::Heartbeat {
                    name: self.join.name.clone(),
                    incarnation: self.join.incarnation,
                    actors: self.actors,
                    version: self.version,
                });
                self.state = State::Joined {
                    next_heartbeat: now + self.config.heartbeat_interval,
                };
            }
            State::Leaving { until } if now >= until => self.finish_leave(),
            State::Joining { until } if now >= until => {
                // No answer: open the stream again.
                self.transmits.clear();
                self.state = State::Connecting;
                self.events.push_back(MemberEvent::Connect);
            }
            _ => {}
        }
    }

    /// When [`MemberLink::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Disconnected { retry_at } => Some(retry_at),
            State::Joined { next_heartbeat } => Some(next_heartbeat),
            State::Leaving { until } | State::Joining { until } => Some(until),
            _ => None,
        }
    }

    /// The next request to send on the stream.
    pub fn poll_transmit(&mut self) -> Option<ControlRequest> {
        self.transmits.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<MemberEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    fn join(incarnation: Incarnation) -> JoinRequest {
        JoinRequest {
            name: "n1".into(),
            addr: "127.0.0.1:1".into(),
            bulk_addr: "127.0.0.1:2".into(),
            host: "h".into(),
            incarnation,
            resources: Resources::default(),
            held: Vec::new(),
        }
    }

    fn table(version: u64) -> ControlReply {
        ControlReply::Members {
            version,
            head: "head".into(),
            members: Vec::new(),
            revoked: Vec::new(),
            more: false,
        }
    }

    fn drain(link: &mut MemberLink) -> (Vec<ControlRequest>, Vec<MemberEvent>) {
        (
            std::iter::from_fn(|| link.poll_transmit()).collect(),
            std::iter::from_fn(|| link.poll_event()).collect(),
        )
    }

    fn joined(t0: Instant) -> MemberLink {
        let mut link = MemberLink::new(t0, MemberConfig::default(), join(Incarnation::new(1)));
        link.handle_timeout(t0);
        link.handle_connected(t0);
        link.handle_reply(t0, table(1));
        drain(&mut link);
        link
    }

    #[test]
    fn joins_then_heartbeats_every_interval() {
        let t0 = Instant::now();
        let mut link = MemberLink::new(t0, MemberConfig::default(), join(Incarnation::new(1)));
        assert_eq!(link.poll_timeout(), Some(t0));
        link.handle_timeout(t0);
        assert_eq!(drain(&mut link), (vec![], vec![MemberEvent::Connect]));
        link.handle_connected(t0);
        let (sent, _) = drain(&mut link);
        assert!(
            matches!(&sent[..], [ControlRequest::Join(j)] if j.incarnation == Incarnation::new(1))
        );
        link.handle_reply(t0, table(4));
        assert!(link.is_joined());
        let second = t0 + Duration::from_secs(1);
        assert_eq!(link.poll_timeout(), Some(second));
        link.set_actors(3);
        link.handle_timeout(second);
        let (sent, _) = drain(&mut link);
        assert_eq!(
            sent,
            [ControlRequest::Heartbeat {
                name: "n1".into(),
                incarnation: Incarnation::new(1),
                actors: 3,
                version: 4
            }]
        );
        link.handle_timeout(second + Duration::from_millis(500));
        assert_eq!(drain(&mut link).0, [], "not due yet");
    }

    fn changes(since: u64, version: u64) -> ControlReply {
        ControlReply::Changes {
            since,
            version,
            head: "head".into(),
            changed: Vec::new(),
            removed: Vec::new(),
            revoked: None,
            more: false,
        }
    }

    #[test]
    fn a_gap_in_the_pushes_is_not_applied_and_the_heartbeat_reports_the_last_good_version() {
        let t0 = Instant::now();
        let mut link = joined(t0); // at version 1
        link.handle_reply(t0, changes(3, 4));
        assert_eq!(drain(&mut link).1, [], "changes since 3 do not apply to 1");
        link.handle_reply(t0, changes(1, 4));
        assert!(
            matches!(&drain(&mut link).1[..], [MemberEvent::Table(t)] if !t.whole && t.version == 4)
        );
        link.handle_reply(t0, changes(1, 2));
        assert_eq!(drain(&mut link).1, [], "older than what is held");
        link.handle_timeout(t0 + Duration::from_secs(1));
        assert!(matches!(
            &drain(&mut link).0[..],
            [ControlRequest::Heartbeat { version: 4, .. }]
        ));
    }

    #[test]
    fn a_broken_link_reconnects_after_an_interval_and_joins_again() {
        let t0 = Instant::now();
        let mut link = joined(t0);
        link.handle_link_lost(t0);
        assert!(!link.is_joined());
        link.handle_timeout(t0 + Duration::from_millis(999));
        assert_eq!(drain(&mut link).1, []);
        link.handle_timeout(t0 + Duration::from_secs(1));
        assert_eq!(drain(&mut link).1, [MemberEvent::Connect]);
        link.handle_connected(t0 + Duration::from_secs(1));
        assert!(matches!(&drain(&mut link).0[..], [ControlRequest::Join(_)]));
    }

    #[test]
    fn rejoin_asks_for_a_new_incarnation_before_joining_again() {
        let t0 = Instant::now();
        let mut link = joined(t0);
        link.handle_reply(t0, ControlReply::Rejoin);
        assert_eq!(drain(&mut link).1, [MemberEvent::Reincarnate]);
        link.set_incarnation(Incarnation::new(9));
        link.handle_timeout(t0 + Duration::from_secs(1));
        link.handle_connected(t0 + Duration::from_secs(1));
        let (sent, _) = drain(&mut link);
        assert!(
            matches!(&sent[..], [ControlRequest::Join(j)] if j.incarnation == Incarnation::new(9))
        );
    }

    #[test]
    fn an_unanswered_join_opens_the_stream_again() {
        let t0 = Instant::now();
        let config = MemberConfig::default();
        let mut link = MemberLink::new(t0, config, join(Incarnation::new(1)));
        link.handle_timeout(t0);
        link.handle_connected(t0);
        drain(&mut link);
        assert_eq!(link.poll_timeout(), Some(t0 + config.join_timeout));
        link.handle_timeout(t0 + config.join_timeout);
        assert_eq!(drain(&mut link).1, [MemberEvent::Connect]);
        link.handle_connected(t0 + config.join_timeout);
        assert!(matches!(&drain(&mut link).0[..], [ControlRequest::Join(_)]));
    }

    #[test]
    fn a_retried_join_refused_as_stale_comes_back_as_a_new_incarnation() {
        let t0 = Instant::now();
        let config = MemberConfig::default();
        let mut link = MemberLink::new(t0, config, join(Incarnation::new(1)));
        link.handle_timeout(t0);
        link.handle_connected(t0);
        // The answer was lost; meanwhile the head marked the join down.
        let later = t0 + config.join_timeout;
        link.handle_timeout(later);
        link.handle_connected(later);
        drain(&mut link);
        link.handle_reply(later, ControlReply::Refused(Refusal::StaleIncarnation));
        assert_eq!(drain(&mut link).1, [MemberEvent::Reincarnate]);
        assert!(!link.is_done());
    }

    #[test]
    fn a_refused_join_is_final() {
        let t0 = Instant::now();
        let mut link = MemberLink::new(t0, MemberConfig::default(), join(Incarnation::new(1)));
        link.handle_timeout(t0);
        link.handle_connected(t0);
        link.handle_reply(t0, ControlReply::Refused(Refusal::StaleIncarnation));
        let (_, events) = drain(&mut link);
        assert_eq!(
            events,
            [
                MemberEvent::Connect,
                MemberEvent::Refused(Refusal::StaleIncarnation)
            ]
        );
        assert!(link.is_done());
        assert_eq!(link.poll_timeout(), None);
    }

    #[test]
    fn leave_waits_for_the_ack_or_its_grace() {
        let t0 = Instant::now();
        let mut link = joined(t0);
        link.handle_shutdown(t0);
        assert!(matches!(
            &drain(&mut link).0[..],
            [ControlRequest::Leave { incarnation, .. }] if *incarnation == Incarnation::new(1)
        ));
        link.handle_reply(t0, ControlReply::Ack);
        assert_eq!(drain(&mut link).1, [MemberEvent::Left]);

        let mut link = joined(t0);
        link.handle_shutdown(t0);
        drain(&mut link);
        link.handle_timeout(t0 + Duration::from_secs(2));
        assert_eq!(drain(&mut link).1, [MemberEvent::Left], "grace ran out");

        let mut link = MemberLink::new(t0, MemberConfig::default(), join(Incarnation::new(1)));
        link.handle_shutdown(t0);
        assert_eq!(drain(&mut link).1, [MemberEvent::Left], "never joined");
    }

    #[test]
    fn a_taken_name_is_tried_again_until_its_grace_then_refused_naming_the_holder() {
        let t0 = Instant::now();
        let config = MemberConfig::default();
        let mut link = MemberLink::new(t0, config, join(Incarnation::new(2)));
        let holder = NameHolder {
            name: "n1".into(),
            addr: "127.0.0.1:9".into(),
            incarnation: Incarnation::new(1),
            silent_ms: 100,
        };
        let mut now = t0;
        loop {
            link.handle_timeout(now);
            link.handle_connected(now);
            drain(&mut link);
            link.handle_reply(now, ControlReply::NameTaken(holder.clone()));
            if link.is_done() {
                break;
            }
            assert_eq!(link.poll_timeout(), Some(now + config.heartbeat_interval));
            now += config.heartbeat_interval;
        }
        assert_eq!(now, t0 + config.name_grace);
        assert_eq!(drain(&mut link).1, [MemberEvent::NameTaken(holder.clone())]);

        // The holder fell silent (it had crashed): the next try gets in.
        let mut link = MemberLink::new(t0, config, join(Incarnation::new(2)));
        link.handle_timeout(t0);
        link.handle_connected(t0);
        link.handle_reply(t0, ControlReply::NameTaken(holder));
        let later = t0 + config.heartbeat_interval;
        link.handle_timeout(later);
        link.handle_connected(later);
        link.handle_reply(later, table(3));
        assert!(link.is_joined());
    }

    #[test]
    fn a_table_in_pages_is_applied_once_whole() {
        let t0 = Instant::now();
        let mut link = MemberLink::new(t0, MemberConfig::default(), join(Incarnation::new(1)));
        link.handle_timeout(t0);
        link.handle_connected(t0);
        drain(&mut link);
        let member = |i: u32| MemberView {
            name: format!("m{i:05}").into(),
            addr: "127.0.0.1:1".into(),
            bulk_addr: "127.0.0.1:2".into(),
            host: "h".into(),
            incarnation: Incarnation::new(1),
            state: crate::membership::MemberState::Up,
            resources: Resources::default(),
            actors: 0,
            role: crate::role::Role::Worker,
            drain_within_ms: 0,
        };
        let whole = ControlReply::Members {
            version: 7,
            head: "head".into(),
            members: (0..3000).map(member).collect(),
            revoked: Vec::new(),
            more: false,
        };
        let pages = crate::control::paginate_by(whole, 16 << 10);
        assert!(pages.len() > 3);
        let last = pages.len() - 1;
        for (i, page) in pages.into_iter().enumerate() {
            link.handle_reply(t0, page);
            let (_, events) = drain(&mut link);
            if i < last {
                assert_eq!(events, [], "page {i} of a table is not applied alone");
                assert!(!link.is_joined());
            } else {
                assert!(
                    matches!(&events[..], [MemberEvent::Table(t)] if t.whole && t.members.len() == 3000)
                );
            }
        }
        assert!(link.is_joined());
    }

    #[test]
    fn a_gate_refusal_of_an_old_incarnation_rejoins_and_any_other_is_final() {
        let t0 = Instant::now();
        let mut link = joined(t0);
        link.handle_link_lost(t0);
        let later = t0 + Duration::from_secs(1);
        link.handle_timeout(later);
        drain(&mut link);
        link.handle_refused(later, Refusal::OldIncarnation);
        assert_eq!(drain(&mut link).1, [MemberEvent::Reincarnate]);
        assert!(!link.is_done());
        link.handle_timeout(later + Duration::from_secs(1));
        assert_eq!(drain(&mut link).1, [MemberEvent::Connect]);
        link.handle_refused(later, Refusal::Revoked);
        assert_eq!(drain(&mut link).1, [MemberEvent::Refused(Refusal::Revoked)]);
        assert!(link.is_done());
    }
}
