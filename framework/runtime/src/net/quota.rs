//! Per-certificate quotas on what a peer holds open at this node: each
//! certificate (a principal: every process it runs counts against it) may
//! hold at most a fixed number at once; what one gives back frees its
//! place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most connections one certificate may hold open to a node, on each of
/// its endpoints (the main one and the bulk lane).
pub const MAX_CONNECTIONS_PER_PRINCIPAL: usize = 256;

/// Counts what each certificate holds, refusing past the cap.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    cap: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One place of a [`Quota`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    principal: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl Quota {
    /// A quota of `cap` per certificate.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap,
            held: Arc::default(),
        }
    }

    /// A place for `principal`, or `None` when it holds the cap already.
    pub(crate) fn take(&self, principal: &str) -> Option<Place> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(principal.to_owned()).or_default();
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(Place {
            principal: principal.to_owned(),
            held: Arc::clone(&self.held),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.principal);
            }
        }
    }
}

/// Admits `pc` under `quota`: holds its place until the connection
/// closes, or closes it at once (counted, the peer told why) when its
/// certificate holds the cap already.
pub(crate) fn admit(
    quota: &Quota,
    pc: &flotilla_transport::PeerConnection,
    tasks: &crate::tasks::Tasks,
) -> bool {
    let Some(place) = quota.take(&pc.peer) else {
        crate::counters::principal_capped("connections");
        tracing::warn!(peer = %pc.peer, "NODE-AUTH-029: closing a connection past its certificate's cap");
        flotilla_transport::Closing::TooManyConnections.close(&pc.connection);
        return false;
    };
    let connection = pc.connection.clone();
    tasks.spawn(async move {
        connection.closed().await;
        drop(place);
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_certificate_cannot_hold_more_than_its_cap_and_a_place_given_back_is_free_again() {
        let quota = Quota::new(MAX_CONNECTIONS_PER_PRINCIPAL);
        let held: Vec<Place> = (0..MAX_CONNECTIONS_PER_PRINCIPAL)
            .map(|_| quota.take("ops").unwrap())
            .collect();
        assert!(quota.take("ops").is_none());
        assert!(quota.take("other").is_some(), "another certificate");
        drop(held);
        let again = quota.take("ops");
        assert!(again.is_some());
        assert_eq!(
            quota.held.lock().unwrap().get("ops"),
            Some(&1),
            "only the new place is held"
        );
        drop(again);
        assert!(quota.held.lock().unwrap().is_empty(), "nothing left behind");
    }
}
