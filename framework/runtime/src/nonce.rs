//! Numbers nobody outside the process can predict: instance tags of
//! member names, the names of detached jobs' actors.
//!
//! Each is SipHash-1-3 (the standard library's `RandomState`) of the clock
//! and the process id, under keys drawn from the operating system's
//! generator for each thread and counted up for each `RandomState`: a
//! keyed pseudo-random function of inputs an observer may know, under keys
//! it does not, and no two calls alike.

use std::hash::BuildHasher;

/// A fresh unpredictable number.
pub(crate) fn nonce() -> u64 {
    std::collections::hash_map::RandomState::new()
        .hash_one((std::time::SystemTime::now(), std::process::id()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn nonces_differ() {
        let a: std::collections::BTreeSet<u64> = (0..1000).map(|_| super::nonce()).collect();
        assert_eq!(a.len(), 1000);
    }
}
