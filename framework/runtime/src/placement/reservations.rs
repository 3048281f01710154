//! This node's reservations for placement-group bundles: its
//! [`Ledger`], shared by the control service (which applies the head's
//! operations) and the member link (which reports what the node holds on
//! every join).

use std::sync::{Arc, Mutex};

use flotilla_proto::ledger::{Held, Ledger, LedgerOp, LedgerReply};
use flotilla_proto::placement::Resources;

/// A handle on this node's ledger.
#[derive(Clone)]
pub(crate) struct Reservations(Arc<Mutex<Ledger>>);

impl Reservations {
    /// An empty ledger of a node offering `capacity`.
    pub(crate) fn new(capacity: Resources) -> Self {
        Self(Arc::new(Mutex::new(Ledger::new(capacity))))
    }

    fn with<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Applies an operation of the head.
    pub(crate) fn apply(&self, op: LedgerOp) -> LedgerReply {
        self.with(|l| l.apply(op))
    }

    /// Drops unfinished prepares and returns what the node holds, for a
    /// join.
    pub(crate) fn rejoin(&self) -> Vec<Held> {
        self.with(Ledger::rejoin)
    }

    /// What every entry sets aside.
    pub(crate) fn reserved(&self) -> Resources {
        self.with(|l| l.reserved())
    }
}
