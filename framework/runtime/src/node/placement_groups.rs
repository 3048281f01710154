//! Placement groups from any node: create one, wait until it is ready,
//! spawn actors into its bundles, watch it move, remove it. The head
//! serves every request ([`crate::placement`]); a member asks it on a
//! control stream.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let node = flotilla::node::doc_example::head("groups-module").await?;
//! use std::time::Duration;
//! use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
//! // Two bundles packed on one node (this example's cluster is one head).
//! let spec = GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.25)]); 2])
//!     .with_timeout(Duration::from_secs(30));
//! let id = node.create_group(spec).await?;
//! let group = node.wait_group(&id, Duration::from_secs(30)).await?;
//! assert_eq!(group.nodes, ["head", "head"]);
//! node.remove_group(&id).await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use flotilla_proto::control::{
    ControlReply, ControlRequest, PlacementReply, PlacementRequest, SpawnOrder,
};
use flotilla_proto::ids::MemberName;
use ractor::{ActorRef, Message};

pub use flotilla_proto::groups::NodeAccount;
pub use flotilla_proto::groups::{GroupId, GroupSpec, GroupState, GroupView, bundle};
pub use flotilla_proto::placement::{Resources, Strategy, parse_amount, parse_bundle};

pub use crate::member::head_client::HeadUnavailable;
use crate::node::{Node, SpawnError};
use crate::remote::kind::Named;
use crate::remote::wire::{Encode, encode};

/// Why a placement-group call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// The spec cannot be placed by any cluster (no bundle, a bad amount,
    /// an unknown strategy).
    #[error("NODE-PG-001: invalid placement group: {0}")]
    Invalid(String),
    /// It could not be placed within its timeout.
    #[error("NODE-PG-002: placement group {id} failed: {why}")]
    Failed {
        /// The group.
        id: GroupId,
        /// Which resource is short on which nodes.
        why: String,
    },
    /// It is not ready yet.
    #[error("NODE-PG-003: placement group {id} is not ready after {waited:?} ({}): {why}", state.as_str())]
    NotReady {
        /// The group.
        id: GroupId,
        /// Its state.
        state: GroupState,
        /// Why it is not ready.
        why: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// No group of that id (never created, or removed).
    #[error("NODE-PG-004: no placement group {0}")]
    NoSuchGroup(GroupId),
    /// The group has fewer bundles.
    #[error("NODE-PG-005: placement group {id} has no bundle {bundle}")]
    NoSuchBundle {
        /// The group.
        id: GroupId,
        /// The bundle asked for.
        bundle: usize,
    },
    /// The head did not answer.
    #[error("NODE-PG-006: {0}")]
    Head(#[from] HeadUnavailable),
    /// The head answered with something else.
    #[error("NODE-PG-006: the head answered a placement request with {0}")]
    Unexpected(String),
    /// Spawning into the bundle failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The head's permission table refused the request (removing another
    /// member's group, creating one as an observer or a tool).
    #[error("NODE-PG-007: the head refused: {0}")]
    Denied(flotilla_proto::authority::Unauthorized),
    /// The group did not grow: not ready, or no node has room for one
    /// more bundle under its strategy now.
    #[error("NODE-PG-009: placement group {id} did not grow: {why}")]
    NotGrown {
        /// The group.
        id: GroupId,
        /// Why.
        why: String,
    },
}

/// How long a request other than a wait may take.
const ASK: Duration = Duration::from_secs(10);

/// Bundle `index` of the placement group `group`: where
/// [`Node::spawn_in_group`] puts an actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleRef<'a> {
    /// The group's id.
    pub group: &'a GroupId,
    /// The bundle's index in the group.
    pub index: usize,
}

impl Node {
    /// Sends a placement request to the head (in-process on the head).
    async fn placement(
        &self,
        request: PlacementRequest,
        timeout: Duration,
    ) -> Result<PlacementReply, PlacementError> {
        let reply = if let Some(service) = &self.placement {
            service
                .request_as(None, request)
                .await
                .map_err(PlacementError::Denied)?
        } else {
            let head = self.view.borrow().head.clone();
            match self
                .head_client
                .call(&head, &ControlRequest::Placement(request), timeout)
                .await?
            {
                ControlReply::Placement(reply) => reply,
                ControlReply::Denied(why) => return Err(PlacementError::Denied(why)),
                other => return Err(PlacementError::Unexpected(format!("{other:?}"))),
            }
        };
        match reply {
            PlacementReply::Invalid(why) => Err(PlacementError::Invalid(why)),
            PlacementReply::NotHead => Err(PlacementError::Unexpected(
                "not the head (it may be stopping)".into(),
            )),
            reply => Ok(reply),
        }
    }

    /// Creates a placement group owned by this node (removed when this
    /// node is gone, unless the spec is detached); returns its id. It is
    /// placed in the background: [`Node::wait_group`] waits until it is
    /// ready.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("create_group").await?;
    /// use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Spread, vec![bundle(&[("cpu", 0.5)])]))
    ///     .await?;
    /// assert!(node.group(&id).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn create_group(&self, spec: GroupSpec) -> Result<GroupId, PlacementError> {
        let request = PlacementRequest::Create { spec };
        match self.placement(request, ASK).await? {
            PlacementReply::Created(id) => Ok(id),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The group once it is ready at a revision above `after_revision`
    /// (any revision when `None`), failed, or removed (`None`); or as it
    /// is when `timeout` passes. This is how an owner hears that bundles
    /// moved: wait above the revision it last saw.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("watch_group").await?;
    /// use std::time::Duration;
    /// use flotilla::placement_groups::{GroupSpec, GroupState, Strategy, bundle};
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.5)])]))
    ///     .await?;
    /// let seen = node.watch_group(&id, None, Duration::from_secs(30)).await?;
    /// let seen = seen.expect("not removed");
    /// assert_eq!(seen.state, GroupState::Ready);
    /// // Nothing moves on a cluster of one: waiting above its revision
    /// // gives the group back as it is when the time is up.
    /// let later = node.watch_group(&id, Some(seen.revision), Duration::from_millis(200)).await?;
    /// assert_eq!(later.map(|g| g.revision), Some(seen.revision));
    /// # Ok(()) }
    /// ```
    pub async fn watch_group(
        &self,
        id: &GroupId,
        after_revision: Option<u64>,
        timeout: Duration,
    ) -> Result<Option<GroupView>, PlacementError> {
        let request = PlacementRequest::Wait {
            id: id.into(),
            after_revision,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        match self.placement(request, timeout + ASK).await? {
            PlacementReply::Group(g) => Ok(g),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Waits until the group is ready: every bundle reserved on its node.
    /// A group that failed (its timeout passed) is
    /// [`PlacementError::Failed`] with the shortage; one still pending at
    /// `timeout` is [`PlacementError::NotReady`] with why.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("wait_group").await?;
    /// use std::time::Duration;
    /// use flotilla::placement_groups::{GroupSpec, PlacementError, Strategy, bundle};
    /// // More than any node has: failed once its timeout passes.
    /// let spec = GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 100_000.0)])])
    ///     .with_timeout(Duration::from_millis(300));
    /// let id = node.create_group(spec).await?;
    /// let waited = node.wait_group(&id, Duration::from_secs(10)).await;
    /// assert!(matches!(waited, Err(PlacementError::Failed { .. })), "{waited:?}");
    /// # Ok(()) }
    /// ```
    pub async fn wait_group(
        &self,
        id: &GroupId,
        timeout: Duration,
    ) -> Result<GroupView, PlacementError> {
        let view = self
            .watch_group(id, None, timeout)
            .await?
            .ok_or_else(|| PlacementError::NoSuchGroup(id.clone()))?;
        match view.state {
            GroupState::Ready => Ok(view),
            GroupState::Failed => Err(PlacementError::Failed {
                id: id.clone(),
                why: view.why.unwrap_or_default(),
            }),
            state => Err(PlacementError::NotReady {
                id: id.clone(),
                state,
                why: view.why.unwrap_or_else(|| "being reserved".into()),
                waited: timeout,
            }),
        }
    }

    /// The group as it is now, if it exists.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("group").await?;
    /// use flotilla::placement_groups::GroupId;
    /// assert!(node.group(&GroupId::from("pg-none")).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn group(&self, id: &GroupId) -> Result<Option<GroupView>, PlacementError> {
        match self
            .placement(PlacementRequest::Get { id: id.into() }, ASK)
            .await?
        {
            PlacementReply::Group(g) => Ok(g),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Every group, and what each up node has and has reserved.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("groups").await?;
    /// let (groups, nodes) = node.groups().await?;
    /// assert!(groups.is_empty());
    /// assert_eq!(nodes[0].name, "head");
    /// # Ok(()) }
    /// ```
    pub async fn groups(&self) -> Result<(Vec<GroupView>, Vec<NodeAccount>), PlacementError> {
        match self.placement(PlacementRequest::List, ASK).await? {
            PlacementReply::Groups { groups, nodes } => Ok((groups, nodes)),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Removes the group, releasing its reservations on every node; false
    /// if there was none of that id. Actors spawned into its bundles keep
    /// running: stop them first.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("remove_group").await?;
    /// use std::time::Duration;
    /// use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.5)])]))
    ///     .await?;
    /// node.wait_group(&id, Duration::from_secs(30)).await?;
    /// assert!(node.remove_group(&id).await?);
    /// assert!(!node.remove_group(&id).await?, "gone already");
    /// # Ok(()) }
    /// ```
    pub async fn remove_group(&self, id: &GroupId) -> Result<bool, PlacementError> {
        match self
            .placement(PlacementRequest::Remove { id: id.into() }, ASK)
            .await?
        {
            PlacementReply::Removed(r) => Ok(r),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Adds one bundle of `bundle`'s resources to the ready group `id`
    /// (which this node owns), if a node has room for it now under the
    /// group's strategy: all or nothing. Returns the new bundle's index;
    /// the group is ready again, with it placed, at its next revision
    /// ([`Node::watch_group`]). The members in `avoid` get none of the
    /// group's bundles from now on (the owner found them unfit).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("grow_group").await?;
    /// use std::time::Duration;
    /// use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.25)])]))
    ///     .await?;
    /// let view = node.wait_group(&id, Duration::from_secs(30)).await?;
    /// let b = node.grow_group(&id, bundle(&[("cpu", 0.25)]), &[]).await?;
    /// assert_eq!(b, 1);
    /// let grown = node.watch_group(&id, Some(view.revision), Duration::from_secs(30)).await?;
    /// assert_eq!(grown.map(|g| g.nodes.len()), Some(2));
    /// assert!(node.shrink_group(&id, 1).await?);
    /// # node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn grow_group(
        &self,
        id: &GroupId,
        bundle: flotilla_proto::placement::Resources,
        avoid: &[MemberName],
    ) -> Result<u32, PlacementError> {
        let request = PlacementRequest::Grow {
            id: id.clone(),
            bundle,
            avoid: avoid.to_vec(),
        };
        match self.placement(request, ASK).await? {
            PlacementReply::Grown(b) => Ok(b),
            PlacementReply::NotGrown(why) => Err(PlacementError::NotGrown {
                id: id.clone(),
                why,
            }),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Takes the last bundle, `bundle`, off the group `id`, releasing its
    /// reservation (its actor should be stopped first). Returns whether
    /// it went (not when it is not the last, or the only one).
    pub async fn shrink_group(&self, id: &GroupId, bundle: u32) -> Result<bool, PlacementError> {
        let request = PlacementRequest::Shrink {
            id: id.clone(),
            bundle,
        };
        match self.placement(request, ASK).await? {
            PlacementReply::Shrunk(done) => Ok(done),
            other => Err(PlacementError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The node bundle `bundle` of the ready group `id` is on, waiting up
    /// to `timeout` for the group to be ready.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("bundle_node").await?;
    /// use std::time::Duration;
    /// use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.5)])]))
    ///     .await?;
    /// assert_eq!(node.bundle_node(&id, 0, Duration::from_secs(30)).await?, "head");
    /// assert!(node.bundle_node(&id, 1, Duration::from_secs(30)).await.is_err(), "one bundle");
    /// # Ok(()) }
    /// ```
    pub async fn bundle_node(
        &self,
        id: &GroupId,
        bundle: usize,
        timeout: Duration,
    ) -> Result<MemberName, PlacementError> {
        let view = self.wait_group(id, timeout).await?;
        view.nodes
            .get(bundle)
            .cloned()
            .ok_or_else(|| PlacementError::NoSuchBundle {
                id: id.clone(),
                bundle,
            })
    }

    /// Spawns `actor` (a kind registered on the node of `bundle`, and its
    /// name there), waiting for its group to be ready within `timeout`. The actor
    /// runs on what the bundle reserved, not on the node's free resources.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("spawn_in_group").await?;
    /// use std::time::Duration;
    /// use flotilla::node::doc_example::{Ask, COUNTER, Count, CounterMsg};
    /// use flotilla::placement_groups::{BundleRef, GroupSpec, Strategy, bundle};
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.5)])]))
    ///     .await?;
    /// let counter: flotilla::ractor::ActorRef<CounterMsg> = node
    ///     .spawn_in_group(BundleRef { group: &id, index: 0 }, COUNTER.named("c"), &Count(3), Duration::from_secs(30))
    ///     .await?;
    /// let count = flotilla::call::call(&counter, |r| CounterMsg::Get(Ask, r), Duration::from_secs(5)).await?;
    /// assert_eq!(count, Count(3));
    /// # Ok(()) }
    /// ```
    pub async fn spawn_in_group<M: Message, A: Encode>(
        &self,
        bundle: BundleRef<'_>,
        actor: Named<M, A>,
        args: &A,
        timeout: Duration,
    ) -> Result<ActorRef<M>, PlacementError> {
        let started = tokio::time::Instant::now();
        let node = self
            .bundle_node(bundle.group, bundle.index, timeout)
            .await?;
        let left = timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(1));
        let cell = self
            .spawn_on_raw(
                &node,
                SpawnOrder::of::<M>(actor.kind().name(), actor.name(), encode(args)),
                left,
            )
            .await?;
        Ok(cell.into())
    }

    /// What this node's own ledger has set aside for bundles.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = flotilla::node::doc_example::head("reserved_here").await?;
    /// use std::time::Duration;
    /// use flotilla::placement_groups::{GroupSpec, Strategy, bundle};
    /// assert!(node.reserved_here().values().all(|n| *n == 0.0));
    /// let id = node
    ///     .create_group(GroupSpec::new(Strategy::Pack, vec![bundle(&[("cpu", 0.5)])]))
    ///     .await?;
    /// node.wait_group(&id, Duration::from_secs(30)).await?;
    /// assert_eq!(node.reserved_here().get("cpu"), Some(&0.5));
    /// # Ok(()) }
    /// ```
    pub fn reserved_here(&self) -> Resources {
        self.ledger.reserved()
    }
}
