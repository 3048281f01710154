//! The addresses of the heads a member may follow: the head, or every
//! head of a head set (one primary, standbys that take over). The member's
//! link and its calls to the head share one [`HeadAddrs`]: whichever
//! finds the head it used unreachable moves on to the next address, and
//! both then use the one that answered.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Every head address a member may use, and the one it uses now.
#[derive(Debug, Clone)]
pub(crate) struct HeadAddrs {
    all: Arc<[SocketAddr]>,
    at: Arc<AtomicUsize>,
}

impl HeadAddrs {
    /// The heads at `first` and `others`, `first` used first.
    pub(crate) fn new(first: SocketAddr, others: &[SocketAddr]) -> Self {
        let mut all = vec![first];
        all.extend(others.iter().filter(|a| **a != first));
        Self {
            all: all.into(),
            at: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The address to use now.
    pub(crate) fn current(&self) -> SocketAddr {
        self.all[self.at.load(Ordering::Relaxed) % self.all.len()]
    }

    /// How many heads there are.
    pub(crate) fn len(&self) -> usize {
        self.all.len()
    }

    /// `addr` did not answer: the next address is used, unless another
    /// caller moved on already.
    pub(crate) fn failed(&self, addr: SocketAddr) {
        let at = self.at.load(Ordering::Relaxed);
        if self.all[at % self.all.len()] == addr {
            let _ = self.at.compare_exchange(
                at,
                (at + 1) % self.all.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_failed_head_moves_every_user_to_the_next_once() {
        let heads = HeadAddrs::new(addr(1), &[addr(2), addr(1), addr(3)]);
        assert_eq!(heads.len(), 3, "the first is not listed twice");
        let link = heads.clone();
        assert_eq!(heads.current(), addr(1));
        heads.failed(addr(1));
        // The link also found 1 unreachable, later: no second move.
        link.failed(addr(1));
        assert_eq!(link.current(), addr(2));
        link.failed(addr(2));
        link.failed(addr(3));
        assert_eq!(heads.current(), addr(1), "round again");
    }

    #[test]
    fn a_single_head_stays_put() {
        let heads = HeadAddrs::new(addr(1), &[]);
        heads.failed(addr(1));
        assert_eq!(heads.current(), addr(1));
    }
}
