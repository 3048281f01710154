//! The supervision board of a node: what each of its supervisors last
//! reported (children, restarts, whether it gave up), read by the control
//! service to answer `node status`. A handle passed to the supervisors
//! that should be listed; not a global.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub use flotilla_proto::control::{ChildReport, SupervisorReport};

/// The supervisors of one node, by name.
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<BTreeMap<String, SupervisorReport>>>);

impl Board {
    /// Records `report` under its name.
    pub fn post(&self, report: SupervisorReport) {
        self.lock().insert(report.name.clone(), report);
    }

    /// Forgets the supervisor `name`.
    pub fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    /// Every supervisor's last report, by name.
    pub fn reports(&self) -> Vec<SupervisorReport> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SupervisorReport>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
