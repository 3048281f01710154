//! Supervision trees declared in `node.toml` (`[[supervisor]]`), started
//! once the node has joined: each a root supervisor whose children are
//! actors of configurable kinds, spawned on the first up node of their
//! `nodes` (this node by default), and listed by `node status`.

use std::sync::Arc;
use std::time::Duration;

use flotilla::MemberState;
use flotilla::Node;
use flotilla::SpawnOrder;
use flotilla::config_args::ConfigArgsError;
use flotilla::ractor::{Actor, ActorRef};
use flotilla::supervisor::{
    Child, Escalation, RemoteChild, Supervisor, SupervisorArgs, SupervisorEvent, SupervisorMsg,
};
use tokio::sync::mpsc;

use crate::Tree;

/// How long one configured child may take to spawn.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a tree did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// A child's arguments are not its kind's.
    #[error("supervisor {tree:?}, child {child:?}: {source}")]
    Args {
        /// The tree.
        tree: String,
        /// The child.
        child: String,
        /// Why.
        source: ConfigArgsError,
    },
    /// The supervisor actor did not start.
    #[error("NODE-TREE-002: supervisor {0:?} did not start: {1}")]
    Spawn(String, flotilla::ractor::SpawnErr),
}

/// The trees a node runs.
pub struct Trees {
    roots: Vec<(String, ActorRef<SupervisorMsg>)>,
    escalated: mpsc::UnboundedReceiver<(String, Escalation)>,
}

/// Starts `trees` on `node`; returns once every root has started its
/// children (or begun restarting those that failed).
pub async fn start(node: &Arc<Node>, trees: Vec<Tree>) -> Result<Trees, TreeError> {
    let (tx, escalated) = mpsc::unbounded_channel();
    let mut roots = Vec::new();
    for tree in trees {
        let mut children = Vec::new();
        for c in tree.children {
            let (args, message_type) =
                node.config_args(&c.kind, c.args)
                    .map_err(|source| TreeError::Args {
                        tree: tree.name.clone(),
                        child: c.spec.id.clone(),
                        source,
                    })?;
            let nodes = if c.nodes.is_empty() {
                vec![node.name().to_string()]
            } else {
                c.nodes
            };
            let place = move |t: &flotilla::Table| {
                nodes
                    .iter()
                    .find(|n| t.get(n).is_some_and(|m| m.state == MemberState::Up))
                    .map(|n| n.as_str().into())
            };
            let start = RemoteChild::raw(
                Arc::clone(node),
                SpawnOrder {
                    kind: c.kind,
                    name: c.spec.id.clone(),
                    args,
                    message_type: message_type.to_owned(),
                    // Each start's own: a child of a kind that fences its
                    // checkpoints has it written into its arguments by the
                    // node that spawns it.
                    epoch: flotilla_proto::epoch::Epoch::NONE,
                },
                place,
                SPAWN_TIMEOUT,
            );
            children.push(Child::new(c.spec, start));
        }
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let args = SupervisorArgs {
            spec: tree.spec,
            children,
            events: Some(events_tx),
            members: Some(node.watch_members()),
            seed: node.incarnation().get(),
            report: Some((tree.name.clone(), node.board())),
        };
        let (root, _) = Actor::spawn(None, Supervisor, args)
            .await
            .map_err(|e| TreeError::Spawn(tree.name.clone(), e))?;
        // Answered once its first starts are done; no answer means it gave
        // up already, which its escalation (below) reports.
        match flotilla::call::call(&root, SupervisorMsg::Status, SPAWN_TIMEOUT).await {
            Ok(_) => tracing::info!(supervisor = %tree.name, "supervision tree started"),
            Err(e) => {
                tracing::warn!(supervisor = %tree.name, error = %e, "supervision tree did not answer once started")
            }
        }
        let (tx, name) = (tx.clone(), tree.name.clone());
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let SupervisorEvent::Escalated(e) = event {
                    let _ = tx.send((name.clone(), e));
                }
            }
        });
        roots.push((tree.name, root));
    }
    Ok(Trees { roots, escalated })
}

impl Trees {
    /// The first root to give up, and why; pending forever if none does.
    pub async fn escalated(&mut self) -> (String, Escalation) {
        match self.escalated.recv().await {
            Some(e) => e,
            None => std::future::pending().await,
        }
    }

    /// Stops every tree, the last started first.
    pub async fn stop(self) {
        for (name, root) in self.roots.into_iter().rev() {
            if flotilla::call::call(&root, SupervisorMsg::Shutdown, Duration::from_secs(30))
                .await
                .is_err()
            {
                tracing::warn!(supervisor = %name, "supervisor did not stop in time");
                root.stop(None);
            }
        }
    }
}
