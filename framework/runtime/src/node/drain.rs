//! Draining this node: it takes no new work, hands back what it holds, and
//! leaves.
//!
//! ```text
//! Node::drain(within) ── Drain{me, within} ──► head: Draining in the table
//!                                                ├─► placement moves this node's bundles
//!                                                └─► owners' supervisors move their children
//!   wait until this node hosts no actor, or `within` passes ──► (caller) Node::shutdown: Leave
//! ```
//!
//! An admin's `node drain NAME` marks a node draining from outside; the
//! node hears of it in its member table ([`Node::drain_asked`]) and waits
//! the same way ([`Node::wait_drained`]).

use std::time::Duration;

use flotilla_proto::authority::Unauthorized;
use flotilla_proto::control::{ControlReply, ControlRequest};
use flotilla_proto::ids::MemberName;
use flotilla_proto::membership::{DrainOutcome, MemberState};

use super::Node;
use crate::member::head_client::HeadUnavailable;

/// How long the head is given to answer a drain.
const ASK: Duration = Duration::from_secs(3);

/// How often a draining node looks at what it still hosts.
const POLL: Duration = Duration::from_millis(100);

/// Why a drain was not begun.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// The head did not answer.
    #[error("NODE-DRAIN-004: the head cannot be asked to drain this node: {0}")]
    Head(#[from] HeadUnavailable),
    /// The head refused: no such member, down or left, or the head.
    #[error("{}", .outcome.describe(.name))]
    Refused {
        /// The member.
        name: MemberName,
        /// The head's answer.
        outcome: DrainOutcome,
    },
    /// The permission table refused the request.
    #[error(transparent)]
    Denied(Unauthorized),
    /// The head answered with something else.
    #[error("NODE-DRAIN-005: the head answered a drain with {0}")]
    Unexpected(String),
}

/// What a drain of this node came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Actors it still hosted when it stopped waiting (0: all moved).
    pub actors_left: u32,
    /// How long it waited for them to move.
    pub waited: Duration,
}

impl Node {
    /// The time this node's drain was given, while the member table shows
    /// it draining.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("draining").await?;
    /// assert_eq!(node.draining(), None);
    /// # node.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn draining(&self) -> Option<Duration> {
        self.view
            .borrow()
            .get(&self.identity.name)
            .filter(|m| {
                m.state == MemberState::Draining && m.incarnation == self.identity.incarnation()
            })
            .map(|m| Duration::from_millis(m.drain_within_ms))
    }

    /// Resolves once the member table shows this node draining (an
    /// admin's `node drain`, or [`Node::request_drain`]), with the time
    /// its drain was given; never on the head, which is not drained.
    pub async fn drain_asked(&self) -> Duration {
        let mut view = self.view.clone();
        loop {
            if let Some(within) = self.draining() {
                return within;
            }
            if view.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Asks the head to drain this node, giving it `within` to hand back
    /// what it holds; returns once the head has marked it draining.
    pub async fn request_drain(&self, within: Duration) -> Result<(), DrainError> {
        let name = self.identity.name.clone();
        let request = ControlRequest::Drain {
            name: name.clone(),
            within_ms: within.as_millis() as u64,
        };
        let head = self.view.borrow().head.clone();
        match self.head_client.call(&head, &request, ASK).await? {
            ControlReply::Drain(DrainOutcome::Draining) => Ok(()),
            ControlReply::Drain(outcome) => Err(DrainError::Refused { name, outcome }),
            ControlReply::Denied(why) => Err(DrainError::Denied(why)),
            other => Err(DrainError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Waits, as a draining node, until it hosts no actor (their owners'
    /// supervisors move them to other nodes) or `within` passes. Returns
    /// what it waited for; the caller then leaves
    /// ([`Node::shutdown`]), stopping whatever is left.
    pub async fn wait_drained(&self, within: Duration) -> Drained {
        let started = tokio::time::Instant::now();
        let until = started + within;
        loop {
            let actors_left = self.hosted.count();
            let now = tokio::time::Instant::now();
            if actors_left == 0 || now >= until {
                return Drained {
                    actors_left,
                    waited: now - started,
                };
            }
            tokio::time::sleep(POLL.min(until - now)).await;
        }
    }

    /// Drains this node: asks the head ([`Node::request_drain`]), waits
    /// for the member table to say so, then for its actors to move off it
    /// ([`Node::wait_drained`]), all within `within`. The caller leaves
    /// next ([`Node::shutdown`]).
    pub async fn drain(&self, within: Duration) -> Result<Drained, DrainError> {
        let started = tokio::time::Instant::now();
        self.request_drain(within).await?;
        // The head's push follows its answer; an owner moves its actors
        // once its own table shows the drain.
        let _ = tokio::time::timeout(within, self.drain_asked()).await;
        let left = within.saturating_sub(started.elapsed());
        let mut drained = self.wait_drained(left).await;
        drained.waited = started.elapsed();
        Ok(drained)
    }
}
