//! Requests on a control stream (after a [`crate::hello::Hello`] with
//! purpose `Control`): a member joining the head and then heartbeating on
//! the same stream, or a tool asking for the cluster's status.
//!
//! ```text
//! member ── Join ─────────► head        tool ── Status ──► head
//!        ◄─ Members ───────                  ◄─ Members ──   (a large table in several pages)
//!        ── Heartbeat ────►  (every heartbeat interval)
//!        ◄─ Changes ───────  (the members that changed, at most once per push gap)
//!        ── Leave ────────►  (clean stop)
//!
//! any member ── Spawn{kind, name, args} ──► the node to run it (owned by the stream's member)
//!            ◄─ Spawned(reply)
//! owner or head ── Stop{name} ──► the node hosting `name`
//!               ◄─ Stop(outcome)
//!
//! any node ── Placement(create, wait, remove, …) ──► head
//!          ◄─ Placement(reply)
//! head ── Ledger(prepare, commit, release) ──► a member
//!      ◄─ Ledger(reply)
//! ```

// rkyv's derive emits undocumented public helper items for enums with
// struct variants; every type written here is documented by hand.
#![allow(missing_docs)]

use rkyv::{Archive, Deserialize, Serialize};

use crate::authority::Unauthorized;
use crate::epoch::Epoch;
use crate::groups::{GroupSpec, GroupView, NodeAccount};
use crate::hello::Refusal;
use crate::ids::MemberName;
use crate::incarnation::Incarnation;
use crate::jobs::{JobsReply, JobsRequest};
use crate::ledger::{LedgerOp, LedgerReply};
use crate::membership::{DrainOutcome, JoinRequest, MemberView, NameHolder};
use crate::objects::ObjectStats;

/// A request on a control stream.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ControlRequest {
    /// Become a member; the head answers with the member table.
    Join(JoinRequest),
    /// Still alive; `version` is the table version the member last saw.
    Heartbeat {
        /// The member's name.
        name: MemberName,
        /// Its incarnation.
        incarnation: Incarnation,
        /// Actors running on it.
        actors: u32,
        /// The table version it holds.
        version: u64,
    },
    /// Stopping cleanly.
    Leave {
        /// The member's name.
        name: MemberName,
        /// Its incarnation.
        incarnation: Incarnation,
    },
    /// The member table, for tools.
    Status,
    /// Stop the actor `name` that the receiving node hosts. Only its owner
    /// or the head may (see [`crate::authority::may_stop`]); served by any
    /// node, not by the head's session.
    Stop {
        /// The actor's name.
        name: String,
    },
    /// The receiving node's supervisors and their children; served by any
    /// node.
    Supervisors,
    /// A placement-group request, served by the head.
    Placement(PlacementRequest),
    /// An operation on the receiving node's reservations; only the head
    /// may send it.
    Ledger(LedgerOp),
    /// A request about detached jobs, served by the head.
    Jobs(JobsRequest),
    /// The receiving node's object-store counters; served by any node.
    Objects,
    /// The receiving node's GPUs and the actors holding them; served by
    /// any node.
    Gpus,
    /// How long ago the head last heard from each member; served by the
    /// head.
    Heard,
    /// Start an actor of a registered kind on the receiving node, owned by
    /// the member the stream's hello proved; served by any node.
    Spawn(SpawnOrder),
    /// Drain the member `name`: it takes no new work, its bundles are
    /// placed again, and it leaves once it hosts nothing or `within_ms`
    /// have passed. Served by the head; a worker may drain itself, an
    /// admin (or the head) any member (see [`crate::authority::may_drain`]).
    Drain {
        /// The member to drain.
        name: MemberName,
        /// How long it is given, in milliseconds (at most
        /// [`crate::membership::MAX_DRAIN_MS`]).
        within_ms: u64,
    },
}

/// What to spawn (see [`ControlRequest::Spawn`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SpawnOrder {
    /// The registered kind.
    pub kind: String,
    /// The actor's name, unique on the node.
    pub name: String,
    /// The actor's arguments, an rkyv archive of the kind's `Arguments`.
    pub args: Vec<u8>,
    /// The message type the caller will send the actor
    /// (`std::any::type_name`); the kind's must be the same.
    pub message_type: String,
    /// The epoch the caller's supervisor issued this start
    /// ([`Epoch::NONE`]: none). The
    /// node that spawns it stamps this epoch, with the certificate of the
    /// member that asked, into the arguments of a kind whose actors fence
    /// their checkpoints, whatever the arguments themselves say: a caller
    /// can fence only its own children's checkpoints.
    pub epoch: Epoch,
}

impl SpawnOrder {
    /// An order for an actor of `kind` named `name`, with its arguments
    /// archived already, whose callers send it messages of type `M`.
    pub fn of<M: ?Sized>(kind: &str, name: &str, args: Vec<u8>) -> Self {
        Self {
            kind: kind.to_owned(),
            name: name.to_owned(),
            args,
            message_type: std::any::type_name::<M>().to_owned(),
            epoch: Epoch::NONE,
        }
    }
}

/// A kind asked for with another message type than its actors take.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TypeMismatch {
    /// The kind.
    pub kind: String,
    /// Its actors' message type.
    pub takes: String,
    /// The caller's.
    pub asked: String,
}

/// The spawning node's answer.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpawnReply {
    /// Started; the actor is in the process group of its name.
    #[error("spawned")]
    Spawned,
    /// The node has no kind of that name registered.
    #[error(
        "no actor kind {0:?} is registered on that node; register it with NodeBuilder::register"
    )]
    UnknownKind(String),
    /// An actor of that name already runs on the node.
    #[error("an actor named {0:?} already runs there")]
    NameTaken(String),
    /// The arguments are not a valid archive of the kind's arguments.
    #[error("invalid arguments: {0}")]
    BadArgs(String),
    /// The kind's actors take another message type than the caller's.
    #[error("actors of kind {:?} take {}, not {}", .0.kind, .0.takes, .0.asked)]
    WrongMessageType(TypeMismatch),
    /// The actor failed in `pre_start`.
    #[error("actor failed to start: {0}")]
    Failed(String),
    /// The caller's certificate owns as many actors on the node as one may
    /// ([`MAX_ACTORS_PER_PRINCIPAL`]).
    #[error(
        "NODE-SPAWN-006: {0} already owns {most} actors on that node; stop some first",
        most = MAX_ACTORS_PER_PRINCIPAL
    )]
    TooMany(String),
}

/// Most actors the members of one certificate may own on one node through
/// spawns (the node's own are not counted).
pub const MAX_ACTORS_PER_PRINCIPAL: usize = 1024;

/// A request about placement groups.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum PlacementRequest {
    /// Create a group owned by the member (and incarnation) the stream's
    /// hello proved.
    Create {
        /// What to create.
        spec: GroupSpec,
    },
    /// Remove a group.
    Remove {
        /// Its id.
        id: crate::groups::GroupId,
    },
    /// A group as it is now.
    Get {
        /// Its id.
        id: crate::groups::GroupId,
    },
    /// A group once it is ready at a revision above `after_revision` (any,
    /// when `None`), failed, or removed; or as it is at the timeout.
    Wait {
        /// Its id.
        id: crate::groups::GroupId,
        /// The revision the caller already knows.
        after_revision: Option<u64>,
        /// How long to wait, in milliseconds.
        timeout_ms: u64,
    },
    /// Every group, and every node's capacity and reservations.
    List,
    /// Add one bundle to a ready group, if a node has room for it now
    /// under the group's strategy (see `Groups::grow`).
    Grow {
        /// The group.
        id: crate::groups::GroupId,
        /// The bundle.
        bundle: crate::placement::Resources,
        /// Members none of the group's bundles is to go to from now on
        /// (its owner found them unfit).
        avoid: Vec<MemberName>,
    },
    /// Take the last bundle off a group, releasing it.
    Shrink {
        /// The group.
        id: crate::groups::GroupId,
        /// The bundle: the group's last.
        bundle: u32,
    },
}

/// The head's answer to a [`PlacementRequest`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum PlacementReply {
    /// The group's id.
    Created(crate::groups::GroupId),
    /// The spec cannot be created (why).
    Invalid(String),
    /// Whether a group was removed.
    Removed(bool),
    /// The group, if it exists.
    Group(Option<GroupView>),
    /// Every group and every node's account.
    Groups {
        /// The groups, in creation order.
        groups: Vec<GroupView>,
        /// The up nodes.
        nodes: Vec<NodeAccount>,
    },
    /// The receiving node is not the head.
    NotHead,
    /// The new bundle's index: the group grew.
    Grown(u32),
    /// The group did not grow (why).
    NotGrown(String),
    /// Whether the bundle was taken off.
    Shrunk(bool),
}

/// One supervisor of a node, as `node status` shows it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SupervisorReport {
    /// The supervisor's name.
    pub name: String,
    /// Its strategy (`one_for_one`, …).
    pub strategy: String,
    /// Whether it gave up (past its restart intensity).
    pub gave_up: bool,
    /// Restarts allowed within its window (its intensity).
    pub max_restarts: u32,
    /// Its window, in milliseconds.
    pub within_ms: u64,
    /// When the restarts counted against its intensity happened, in
    /// milliseconds since the Unix epoch, oldest first (when it
    /// reported: those older than the window when read no longer count).
    pub restarts_unix_ms: Vec<u64>,
    /// Its children, in start order.
    pub children: Vec<ChildReport>,
}

/// How long ago the head last heard from a member (its join or its
/// latest heartbeat).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HeardFrom {
    /// The member.
    pub name: MemberName,
    /// Milliseconds since (0 for the head itself).
    pub ms_ago: u64,
}

/// Bytes of a child's last exit reason a report carries.
pub const EXIT_REASON_SHOWN: usize = 512;

/// One child of a supervisor.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChildReport {
    /// The child's id.
    pub id: String,
    /// Whether it runs.
    pub running: bool,
    /// Its restarts so far.
    pub restarts: u32,
    /// The epoch of its latest start ([`Epoch::NONE`] before the first).
    pub epoch: Epoch,
    /// The node it runs on, when it runs on another one.
    pub node: Option<MemberName>,
    /// How its last run ended (none: it has not ended yet), at most
    /// [`EXIT_REASON_SHOWN`] bytes.
    pub last_exit: Option<String>,
}

/// What became of a stop request.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StopOutcome {
    /// The actor has ended: asked to stop, and killed if it ignored
    /// that. Its name is free for its owner's next copy.
    #[error("stopped")]
    Stopped,
    /// The node hosts no actor of that name.
    #[error("NODE-SPAWN-004: the node hosts no actor of that name")]
    NoSuchActor,
    /// The sender is neither the actor's owner nor the head.
    #[error("NODE-AUTH-009: only the node that spawned an actor, or the head, may stop it")]
    NotOwner,
    /// The actor was asked to stop and killed, but had not ended within
    /// the node's wait (it is stuck in a call that does not yield): ask
    /// again before starting another copy under its name.
    #[error("NODE-SPAWN-005: the actor was asked to stop but has not ended yet")]
    Stopping,
}

/// An answer on a control stream.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ControlReply {
    /// The current member table and its version; a table too large for
    /// one frame comes as several, each but the last with `more` set (see
    /// [`paginate`]).
    Members {
        /// Table version.
        version: u64,
        /// Name of the node answering (the head).
        head: MemberName,
        /// Every member (of this page).
        members: Vec<MemberView>,
        /// Serial numbers of revoked certificates (on the first page).
        revoked: Vec<Vec<u8>>,
        /// Whether more pages of this table follow.
        more: bool,
    },
    /// The members that changed since the last table this stream carried,
    /// in pages as [`ControlReply::Members`].
    Changes {
        /// The table version the changes apply to.
        since: u64,
        /// Table version after the changes.
        version: u64,
        /// Name of the node answering (the head).
        head: MemberName,
        /// The members that changed, each as it is now (of this page).
        changed: Vec<MemberView>,
        /// The members forgotten (on the first page): drop them.
        removed: Vec<MemberName>,
        /// The revoked serials, when they changed (on the first page).
        revoked: Option<Vec<Vec<u8>>>,
        /// Whether more pages of these changes follow.
        more: bool,
    },
    /// The leave is recorded.
    Ack,
    /// The request was refused.
    Refused(Refusal),
    /// The member is no longer up for this incarnation and must rejoin.
    Rejoin,
    /// The answer to a stop request.
    Stop(StopOutcome),
    /// The node's supervisors.
    Supervisors(Vec<SupervisorReport>),
    /// The answer to a placement request.
    Placement(PlacementReply),
    /// The answer to a ledger operation.
    Ledger(LedgerReply),
    /// The answer to a jobs request.
    Jobs(JobsReply),
    /// The node's object-store counters.
    Objects(ObjectStats),
    /// The node's GPUs and their holders, by index.
    Gpus(Vec<GpuReport>),
    /// How long ago the head last heard from each member.
    Heard(Vec<HeardFrom>),
    /// The answer to a spawn request.
    Spawned(SpawnReply),
    /// What became of a drain request.
    Drain(DrainOutcome),
    /// The request was refused by the permission table
    /// ([`crate::authority`]).
    Denied(Unauthorized),
    /// The join was refused: another live process holds the name.
    NameTaken(NameHolder),
    /// The answer was too large for one frame and could not be paged
    /// ([`fit_to_frame`]): the requester learns why, and its connection
    /// stays open.
    TooLarge {
        /// The answer's size.
        bytes: u64,
        /// The frame limit in force.
        limit: u32,
    },
}

/// `page` if its archive fits a frame of `max` bytes, else a
/// [`ControlReply::TooLarge`] saying how large it was: an answer too large
/// to send is refused to the requester, never a reason to close its
/// connection.
pub fn fit_to_frame(page: ControlReply, max: u32) -> ControlReply {
    let bytes = crate::wire::encode(&page).len() as u64;
    if bytes > u64::from(max) {
        ControlReply::TooLarge { bytes, limit: max }
    } else {
        page
    }
}

/// Largest encoded page of a table reply: well under the frame limit
/// ([`crate::frame::DEFAULT_MAX_FRAME`]), whatever the members carry.
pub const PAGE_BYTES: usize = 512 << 10;

/// Splits a table reply ([`ControlReply::Members`] or
/// [`ControlReply::Changes`]) into pages whose members encode to at most
/// [`PAGE_BYTES`] (a member alone larger than that still gets a page of
/// its own), each but the last with `more` set; any other reply is
/// returned as it is. The receiver joins the pages back ([`Pages`]).
pub fn paginate(reply: ControlReply) -> Vec<ControlReply> {
    paginate_by(reply, PAGE_BYTES)
}

pub(crate) fn paginate_by(reply: ControlReply, budget: usize) -> Vec<ControlReply> {
    fn split(members: Vec<MemberView>, budget: usize) -> Vec<Vec<MemberView>> {
        let mut pages = vec![Vec::new()];
        let mut used = 0;
        for m in members {
            let size = crate::wire::encode(&m).len();
            let page = pages.last_mut().expect("one page at least");
            if !page.is_empty() && used + size > budget {
                pages.push(Vec::new());
                used = 0;
            }
            used += size;
            pages.last_mut().expect("one page at least").push(m);
        }
        pages
    }
    match reply {
        ControlReply::Members {
            version,
            head,
            members,
            mut revoked,
            ..
        } => {
            let pages = split(members, budget);
            let last = pages.len() - 1;
            pages
                .into_iter()
                .enumerate()
                .map(|(i, members)| ControlReply::Members {
                    version,
                    head: head.clone(),
                    members,
                    revoked: std::mem::take(&mut revoked),
                    more: i < last,
                })
                .collect()
        }
        ControlReply::Changes {
            since,
            version,
            head,
            changed,
            mut removed,
            mut revoked,
            ..
        } => {
            let pages = split(changed, budget);
            let last = pages.len() - 1;
            pages
                .into_iter()
                .enumerate()
                .map(|(i, changed)| ControlReply::Changes {
                    since,
                    version,
                    head: head.clone(),
                    changed,
                    removed: std::mem::take(&mut removed),
                    revoked: revoked.take(),
                    more: i < last,
                })
                .collect()
        }
        other => vec![other],
    }
}

/// Joins the pages of table replies back into one reply: feed every reply
/// received; a whole table reply comes out once its last page is in, any
/// other reply at once. Pages of a table are sent back to back on one
/// stream, so a reply of another kind, or a page of another table, before
/// the last page means the stream is corrupt: the pages gathered so far
/// are dropped.
#[derive(Debug, Clone, Default)]
pub struct Pages {
    gathered: Option<ControlReply>,
    members: usize,
}

/// Most members a joined table may hold: a table past it is dropped, so a
/// peer cannot grow a receiver's memory without bound one page at a time.
pub const MAX_TABLE_MEMBERS: usize = 1 << 20;

impl Pages {
    /// Takes one received reply; the whole reply once complete.
    pub fn push(&mut self, reply: ControlReply) -> Option<ControlReply> {
        let (more, page_len) = match &reply {
            ControlReply::Members { more, members, .. } => (*more, members.len()),
            ControlReply::Changes { more, changed, .. } => (*more, changed.len()),
            _ => {
                self.gathered = None;
                return Some(reply);
            }
        };
        let merged = match (self.gathered.take(), reply) {
            (None, first) => {
                self.members = page_len;
                first
            }
            (
                Some(ControlReply::Members {
                    version,
                    head,
                    mut members,
                    revoked,
                    ..
                }),
                ControlReply::Members {
                    version: v,
                    members: page,
                    ..
                },
            ) if v == version => {
                members.extend(page);
                ControlReply::Members {
                    version,
                    head,
                    members,
                    revoked,
                    more,
                }
            }
            (
                Some(ControlReply::Changes {
                    since,
                    version,
                    head,
                    mut changed,
                    removed,
                    revoked,
                    ..
                }),
                ControlReply::Changes {
                    since: s,
                    version: v,
                    changed: page,
                    ..
                },
            ) if s == since && v == version => {
                changed.extend(page);
                ControlReply::Changes {
                    since,
                    version,
                    head,
                    changed,
                    removed,
                    revoked,
                    more,
                }
            }
            // A page of another table: start again from it.
            (Some(_), other) => {
                self.members = 0;
                other
            }
        };
        self.members = match &merged {
            ControlReply::Members { members, .. } => members.len(),
            ControlReply::Changes { changed, .. } => changed.len(),
            _ => 0,
        };
        if self.members > MAX_TABLE_MEMBERS {
            self.members = 0;
            return None;
        }
        if more {
            self.gathered = Some(merged);
            None
        } else {
            Some(merged)
        }
    }
}

/// One GPU of a node and the actors holding it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GpuReport {
    /// The GPU's index on its node.
    pub index: u32,
    /// Who holds it, in the order they took it (an actor's kind and name).
    pub holders: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{DetectorConfig, MemberState, Membership};
    use crate::resources::Resources;
    use crate::role::Role;

    #[test]
    fn an_answer_too_large_for_a_frame_is_refused_to_the_requester_not_sent() {
        let big = ControlReply::Members {
            version: 1,
            head: "head".into(),
            members: (0..1000).map(member).collect(),
            revoked: Vec::new(),
            more: false,
        };
        let size = crate::wire::encode(&big).len() as u64;
        assert!(size > 64 * 1024);
        assert_eq!(fit_to_frame(big.clone(), size as u32), big);
        let refused = fit_to_frame(big, 64 * 1024);
        assert_eq!(
            refused,
            ControlReply::TooLarge {
                bytes: size,
                limit: 64 * 1024
            }
        );
        // The refusal itself fits any frame a node uses.
        assert!(crate::wire::encode(&refused).len() < 1024);
    }

    fn member(i: usize) -> MemberView {
        MemberView {
            name: format!("w{i:05}").into(),
            addr: format!("10.0.{}.{}:7420", i / 250, i % 250),
            bulk_addr: format!("10.0.{}.{}:7430", i / 250, i % 250),
            host: format!("host-{i}"),
            incarnation: Incarnation::new(1_700_000_000_000_000 + i as u64),
            state: MemberState::Up,
            resources: Resources {
                cpus: 64,
                memory_bytes: 256 << 30,
                gpus: 8,
                labels: [("zone".to_owned(), "eu-west-1a".to_owned())].into(),
                custom: Default::default(),
            },
            actors: 12,
            role: Role::Worker,
            drain_within_ms: 0,
        }
    }

    /// A cluster of 10,000 members: its table does not fit one frame, so
    /// the head's join reply goes in pages under the frame limit, and they
    /// join back into the whole table.
    #[test]
    fn a_ten_thousand_member_table_lists_in_pages_under_the_frame_limit() {
        let members: Vec<MemberView> = (0..10_000).map(member).collect();
        let whole = ControlReply::Members {
            version: 42,
            head: "head".into(),
            members: members.clone(),
            revoked: vec![vec![7; 16]],
            more: false,
        };
        assert!(
            crate::wire::encode(&whole).len() > crate::frame::DEFAULT_MAX_FRAME as usize,
            "the table would not fit one frame"
        );
        let pages = paginate(whole);
        assert!(pages.len() >= 2, "{} pages", pages.len());
        let mut joined = Pages::default();
        let last = pages.len() - 1;
        for (i, page) in pages.into_iter().enumerate() {
            let bytes = crate::wire::encode(&page);
            assert!(bytes.len() <= crate::frame::DEFAULT_MAX_FRAME as usize);
            let page = crate::wire::decode::<ControlReply>(&bytes).unwrap();
            match joined.push(page) {
                Some(ControlReply::Members {
                    version,
                    members: got,
                    revoked,
                    more: false,
                    ..
                }) => {
                    assert_eq!(i, last);
                    assert_eq!(version, 42);
                    assert_eq!(got, members);
                    assert_eq!(revoked, vec![vec![7; 16]]);
                }
                None => assert!(i < last),
                other => panic!("page {i}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_small_reply_is_one_page_and_other_replies_pass_through() {
        let mut m = Membership::new(DetectorConfig::default());
        let _ = &mut m;
        let reply = crate::head::members_reply("head", &m);
        assert_eq!(paginate(reply.clone()), vec![reply.clone()]);
        assert_eq!(paginate(ControlReply::Ack), vec![ControlReply::Ack]);
        let mut pages = Pages::default();
        assert_eq!(pages.push(reply.clone()), Some(reply));
        assert_eq!(pages.push(ControlReply::Ack), Some(ControlReply::Ack));
    }

    #[test]
    fn a_page_of_another_table_drops_what_was_gathered() {
        let page = |version, from: usize, more| ControlReply::Members {
            version,
            head: "head".into(),
            members: (from..from + 2).map(member).collect(),
            revoked: Vec::new(),
            more,
        };
        let mut pages = Pages::default();
        assert_eq!(pages.push(page(1, 0, true)), None);
        // Version 2 starts over: only its own pages come out.
        assert_eq!(pages.push(page(2, 10, true)), None);
        match pages.push(page(2, 12, false)) {
            Some(ControlReply::Members { members, .. }) => {
                assert_eq!(members.len(), 4);
                assert_eq!(members[0].name, "w00010");
            }
            other => panic!("{other:?}"),
        }
    }
}
