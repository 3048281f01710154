//! Requests on a control stream (after a [`crate::hello::Hello`] with
//! purpose `Control`): a member joining the head and then heartbeating on
//! the same stream, or a tool asking for the cluster's status.
//!
//! ```text
//! member ── Join ─────────► head        tool ── Status ──► head
//!        ◄─ Members ───────                  ◄─ Members ──
//!        ── Heartbeat ────►  (every heartbeat interval)
//!        ◄─ Changes ───────  (the members that changed, at most once per push gap)
//!        ── Leave ────────►  (clean stop)
//!
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

use crate::groups::{GroupSpec, GroupView, NodeAccount};
use crate::hello::Refusal;
use crate::jobs::{JobsReply, JobsRequest};
use crate::ledger::{LedgerOp, LedgerReply};
use crate::membership::{JoinRequest, MemberView};
use crate::objects::ObjectStats;

/// A request on a control stream.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ControlRequest {
    /// Become a member; the head answers with the member table.
    Join(JoinRequest),
    /// Still alive; `version` is the table version the member last saw.
    Heartbeat {
        /// The member's name.
        name: String,
        /// Its incarnation.
        incarnation: u64,
        /// Actors running on it.
        actors: u32,
        /// The table version it holds.
        version: u64,
    },
    /// Stopping cleanly.
    Leave {
        /// The member's name.
        name: String,
        /// Its incarnation.
        incarnation: u64,
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
}

/// A request about placement groups.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum PlacementRequest {
    /// Create a group owned by the sender (at `incarnation`).
    Create {
        /// What to create.
        spec: GroupSpec,
        /// The sender's incarnation.
        incarnation: u64,
    },
    /// Remove a group.
    Remove {
        /// Its id.
        id: String,
    },
    /// A group as it is now.
    Get {
        /// Its id.
        id: String,
    },
    /// A group once it is ready at a revision above `after_revision` (any,
    /// when `None`), failed, or removed; or as it is at the timeout.
    Wait {
        /// Its id.
        id: String,
        /// The revision the caller already knows.
        after_revision: Option<u64>,
        /// How long to wait, in milliseconds.
        timeout_ms: u64,
    },
    /// Every group, and every node's capacity and reservations.
    List,
}

/// The head's answer to a [`PlacementRequest`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum PlacementReply {
    /// The group's id.
    Created(String),
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
    /// Its children, in start order.
    pub children: Vec<ChildReport>,
}

/// One child of a supervisor.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChildReport {
    /// The child's id.
    pub id: String,
    /// Whether it runs.
    pub running: bool,
    /// Its restarts so far.
    pub restarts: u32,
    /// The node it runs on, when it runs on another one.
    pub node: Option<String>,
}

/// What became of a stop request.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StopOutcome {
    /// The actor was asked to stop.
    #[error("stopped")]
    Stopped,
    /// The node hosts no actor of that name.
    #[error("NODE-SPAWN-004: the node hosts no actor of that name")]
    NoSuchActor,
    /// The sender is neither the actor's owner nor the head.
    #[error("NODE-AUTH-009: only the node that spawned an actor, or the head, may stop it")]
    NotOwner,
}

/// An answer on a control stream.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ControlReply {
    /// The current member table and its version.
    Members {
        /// Table version.
        version: u64,
        /// Name of the node answering (the head).
        head: String,
        /// Every member.
        members: Vec<MemberView>,
    },
    /// The members that changed since the last table this stream carried.
    Changes {
        /// The table version the changes apply to.
        since: u64,
        /// Table version after the changes.
        version: u64,
        /// Name of the node answering (the head).
        head: String,
        /// The members that changed, each as it is now.
        changed: Vec<MemberView>,
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
}

/// One GPU of a node and the actors holding it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GpuReport {
    /// The GPU's index on its node.
    pub index: u32,
    /// Who holds it, in the order they took it (an actor's kind and name).
    pub holders: Vec<String>,
}
