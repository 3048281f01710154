//! Models loaded once per node and shared by its embedding actors.
//!
//! Every actor of a node that names the same folder on the same device, in
//! the same precision, gets the same [`SentenceEncoder`]: one copy of the weights in memory and
//! in the CPU's caches, however many actors serve it. On a two-core
//! machine, two actors sharing one model embed 12–15% more texts per
//! CPU-second than two actors with a copy each (docs/BENCHMARKS.md). A
//! model is dropped with the last actor holding it; an actor started after
//! that loads it again.
//!
//! ```text
//! actor 1 ── load(dir, device) ──► miss: load, keep a weak handle ──► Arc<SentenceEncoder>
//! actor 2 ── load(dir, device) ──► hit ───────────────────────────────┘
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use burn::tensor::Device;

use crate::{LoadError, Precision, SentenceEncoder};

/// One loaded model: its folder, the device it is loaded on (as `Debug`
/// prints it) and its precision.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    folder: PathBuf,
    device: String,
    precision: Precision,
}

/// The models loaded on one node, by folder and device. Cloning shares the
/// set; [`SharedModels::default`] starts an empty one.
#[derive(Clone, Default)]
pub struct SharedModels {
    loaded: Arc<Mutex<HashMap<Key, Weak<SentenceEncoder>>>>,
}

impl std::fmt::Debug for SharedModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedModels").finish_non_exhaustive()
    }
}

impl SharedModels {
    /// The model in `dir` on `device` in `precision`: the one already
    /// loaded if an actor still holds it, else loaded now. Blocks while
    /// another caller loads a model (call it from a model thread, not an
    /// async task).
    pub fn load(
        &self,
        dir: &Path,
        device: &Device,
        precision: Precision,
    ) -> Result<Arc<SentenceEncoder>, LoadError> {
        let key = Key {
            folder: dir.to_path_buf(),
            device: format!("{device:?}"),
            precision,
        };
        // A poisoned lock only means a load panicked: the map is intact.
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(model) = loaded.get(&key).and_then(Weak::upgrade) {
            return Ok(model);
        }
        loaded.retain(|_, model| model.strong_count() > 0);
        let model = Arc::new(SentenceEncoder::load_with(dir, device, precision)?);
        loaded.insert(key, Arc::downgrade(&model));
        Ok(model)
    }

    /// How many models are loaded and held now.
    pub fn len(&self) -> usize {
        let loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        loaded.values().filter(|m| m.strong_count() > 0).count()
    }

    /// Whether no model is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_that_does_not_load_is_an_error_and_caches_nothing() {
        let models = SharedModels::default();
        let dir = std::env::temp_dir().join("flotilla-no-such-model");
        assert!(models.load(&dir, &Device::flex(), Precision::F32).is_err());
        assert!(models.is_empty());
    }
}
