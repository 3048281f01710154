//! Arguments of registered kinds written in configuration: a kind
//! registered with [`crate::NodeBuilder::register_configurable`] takes its
//! arguments as a JSON value (a `node.toml` table), deserialized with
//! serde into the kind's `Arguments` and archived for the spawner.

use std::collections::HashMap;
use std::sync::Arc;

use crate::remote::wire::{Encode, encode};

/// Why configured arguments cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigArgsError {
    /// This node registered no kind of that name as configurable.
    #[error("NODE-CONFIG-006: kind {0:?} is not registered as configurable on this node")]
    UnknownKind(String),
    /// The value is not the kind's arguments.
    #[error("NODE-CONFIG-006: arguments of kind {kind:?}: {why}")]
    Invalid {
        /// The kind.
        kind: String,
        /// What serde said.
        why: String,
    },
}

type EncodeFn = dyn Fn(serde_json::Value) -> Result<Vec<u8>, String> + Send + Sync;

/// A configurable kind: how to archive its arguments, and its message type.
#[derive(Clone)]
pub(crate) struct ConfigKind {
    encode: Arc<EncodeFn>,
    message_type: &'static str,
}

impl ConfigKind {
    /// The kind whose actors take `M` and whose arguments are `A`.
    pub(crate) fn of<M: 'static, A: serde::de::DeserializeOwned + Encode>() -> Self {
        Self {
            encode: Arc::new(|value| {
                serde_json::from_value::<A>(value)
                    .map(|a| encode(&a))
                    .map_err(|e| e.to_string())
            }),
            message_type: std::any::type_name::<M>(),
        }
    }
}

/// The configurable kinds of a node, by name.
pub(crate) type ConfigKinds = Arc<HashMap<String, ConfigKind>>;

/// The archived arguments and the message type of `kind` for `value`.
pub(crate) fn archive(
    kinds: &ConfigKinds,
    kind: &str,
    value: serde_json::Value,
) -> Result<(Vec<u8>, &'static str), ConfigArgsError> {
    let k = kinds
        .get(kind)
        .ok_or_else(|| ConfigArgsError::UnknownKind(kind.to_owned()))?;
    let bytes = (k.encode)(value).map_err(|why| ConfigArgsError::Invalid {
        kind: kind.to_owned(),
        why,
    })?;
    Ok((bytes, k.message_type))
}
