//! What a node offers to run work: CPUs, memory, GPUs and custom labels.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

/// Resources a node reports to the cluster.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Resources {
    /// Logical CPUs available to work.
    pub cpus: u32,
    /// Memory available to work, in bytes.
    pub memory_bytes: u64,
    /// GPUs available to work.
    pub gpus: u32,
    /// Custom labels from configuration (`zone = "a"`, `model = "minilm"`).
    pub labels: BTreeMap<String, String>,
}
