//! Epochs: the fencing token of a supervised child's starts.
//!
//! A supervisor gives every start of a child an epoch larger than any it
//! gave before, across its own restarts: the clock in microseconds, unless
//! that is not above the last one issued or the floor it started with (its
//! node's incarnation, itself larger than anything that node issued
//! before), then one more. The child's effects carry its epoch, and a store
//! that has seen a newer epoch refuses an older one: once a restarted copy
//! has announced itself, a copy left running on a node cut off from the
//! rest cannot overwrite what it does.
//!
//! ```text
//! start ─► EpochClock::next(clock) ─► epoch E (> every earlier one)
//! store:  announce(E) ─► newest seen = max(seen, E)
//!         save(E', …) admitted only if E' ≥ newest seen
//!         restore(E)  takes the newest snapshot of the newest epoch ≤ E
//! ```

use rkyv::{Archive, Deserialize, Serialize};

/// A supervised child's start as its supervisor numbered it: a clock
/// reading in microseconds since the Unix epoch (or one more than the
/// last one issued), larger than every earlier start's. [`Epoch::NONE`]
/// is a start no supervisor numbered. Archived as the number.
///
/// ```
/// use flotilla_proto::epoch::{Epoch, EpochClock};
/// let mut clock = EpochClock::new(0);
/// let first = clock.next(1_700_000_000_000_000);
/// assert!(clock.next(1_700_000_000_000_000) > first, "the same microsecond");
/// assert!(Epoch::NONE < first && Epoch::NONE.is_none());
/// assert_eq!(first.to_string(), "1700000000000000");
/// ```
#[derive(
    Archive,
    Serialize,
    Deserialize,
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
pub struct Epoch(u64);

impl Epoch {
    /// A start no supervisor numbered.
    pub const NONE: Self = Self(0);

    /// The epoch that is the clock reading `micros`.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// The clock reading it is, in microseconds since the Unix epoch.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// Whether no supervisor numbered it.
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One start of a supervised child, as the node that runs it knows it:
/// the epoch its supervisor issued, and the certificate (principal) of
/// the member whose supervisor issued it. A kind whose actors fence their
/// checkpoints carries one in its arguments ([`TakesStart`]); the node
/// that spawns such a child overwrites it with what it knows.
///
/// ```
/// use flotilla_proto::epoch::Start;
/// use flotilla_proto::epoch::Epoch;
/// let start = Start::new("head", Epoch::from_micros(1_700_000_000_000_000));
/// assert!(start.is_fenced());
/// assert_eq!(start.issuer(), "head");
/// assert!(!Start::default().is_fenced());
/// ```
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Start {
    issuer: String,
    epoch: Epoch,
}

impl Start {
    /// The start at `epoch` of a child whose supervisor runs on a member
    /// holding the certificate `issuer`. A child started by its own node
    /// makes its own; a spawned one is given its node's.
    pub fn new(issuer: impl Into<String>, epoch: Epoch) -> Self {
        Self {
            issuer: issuer.into(),
            epoch,
        }
    }

    /// The epoch its supervisor issued ([`Epoch::NONE`]: none).
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The certificate of the member whose supervisor issued it.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Whether it fences checkpoints: it has an epoch and an issuer.
    pub fn is_fenced(&self) -> bool {
        !self.epoch.is_none() && !self.issuer.is_empty()
    }
}

/// Arguments of an actor kind whose actors fence their checkpoints: where
/// the node that spawns one writes its [`Start`]
/// (`NodeBuilder::fences_checkpoints`).
pub trait TakesStart {
    /// The start these arguments carry.
    fn start_mut(&mut self) -> &mut Start;
}

/// Issues strictly increasing epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochClock {
    last: u64,
}

impl EpochClock {
    /// A clock whose epochs are all above `floor` (the supervisor's node
    /// incarnation).
    pub fn new(floor: u64) -> Self {
        Self { last: floor }
    }

    /// The next epoch, from the clock's reading in microseconds since the
    /// Unix epoch: the reading, or one more than the last epoch issued if
    /// the reading is not above it.
    pub fn next(&mut self, clock_micros: u64) -> Epoch {
        let epoch = clock_micros.max(self.last.saturating_add(1));
        self.last = epoch;
        Epoch(epoch)
    }
}

/// How far ahead of a node's clock an epoch may be and still be one a
/// supervisor issued, in microseconds (a minute). Epochs are clock
/// readings ([`EpochClock`]), so one further ahead was not issued by any
/// supervisor whose clock agrees with this node's within a minute: it was
/// forged (a peer's spawn arguments can say anything), and counting it
/// would lock every later start of the child out of its checkpoints.
pub const MAX_AHEAD_MICROS: u64 = 60_000_000;

/// Whether `epoch` could have been issued by a supervisor whose clock is
/// within [`MAX_AHEAD_MICROS`] of `now_micros` (this node's clock).
pub fn plausible(epoch: Epoch, now_micros: u64) -> bool {
    epoch.0 <= now_micros.saturating_add(MAX_AHEAD_MICROS)
}

/// Whether a store that has seen epochs up to `newest` admits an effect of
/// `epoch` (a store that has seen none admits any).
pub fn admits(epoch: Epoch, newest: Option<Epoch>) -> bool {
    newest.is_none_or(|n| epoch >= n)
}

/// Orders the snapshots a copy of `epoch` may restore, each keyed by
/// `(epoch, sequence)`, best first: the newest sequence of the newest epoch
/// not above its own. A newer epoch's snapshots belong to a copy that
/// replaced it, and are dropped.
pub fn restore_order<T>(epoch: Epoch, snapshots: &mut Vec<((Epoch, u64), T)>) {
    snapshots.retain(|(key, _)| key.0 <= epoch);
    snapshots.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(micros: u64) -> Epoch {
        Epoch::from_micros(micros)
    }

    #[test]
    fn epochs_follow_the_clock_above_the_floor() {
        let mut c = EpochClock::new(1_000);
        assert_eq!(c.next(5_000), e(5_000));
        assert_eq!(c.next(5_000), e(5_001), "the same microsecond");
        assert_eq!(c.next(4_000), e(5_002), "a clock set back");
        let mut c = EpochClock::new(9_000);
        assert_eq!(c.next(5_000), e(9_001), "never at or below the floor");
    }

    #[test]
    fn an_epoch_far_ahead_of_the_clock_is_not_plausible() {
        let now = 1_700_000_000_000_000;
        let mut c = EpochClock::new(now - 5);
        assert!(plausible(c.next(now), now));
        assert!(
            plausible(e(now + MAX_AHEAD_MICROS), now),
            "a clock a minute ahead"
        );
        assert!(!plausible(e(now + MAX_AHEAD_MICROS + 1), now));
        assert!(!plausible(e(u64::MAX), now));
        assert!(plausible(e(u64::MAX), u64::MAX - 1), "no overflow");
    }

    #[test]
    fn a_store_admits_its_newest_epoch_and_later_ones_only() {
        assert!(admits(e(3), None));
        assert!(admits(e(3), Some(e(3))));
        assert!(admits(e(4), Some(e(3))));
        assert!(!admits(e(2), Some(e(3))));
    }

    #[test]
    fn restore_takes_the_newest_sequence_of_the_newest_epoch_not_above_its_own() {
        let mut s: Vec<_> = [(1, 90), (2, 10), (2, 30), (3, 5), (1, 100)]
            .into_iter()
            .map(|(epoch, seq)| ((e(epoch), seq), ()))
            .collect();
        restore_order(e(2), &mut s);
        let keys: Vec<_> = s
            .iter()
            .map(|((epoch, seq), ())| (epoch.micros(), *seq))
            .collect();
        assert_eq!(keys, [(2, 30), (2, 10), (1, 100), (1, 90)]);
        let mut s = vec![((e(5), 1), ())];
        restore_order(e(4), &mut s);
        assert!(s.is_empty(), "a newer copy's snapshots are not this one's");
    }

    proptest! {
        /// Whatever the clock does, epochs strictly increase and stay
        /// above the floor.
        #[test]
        fn epochs_strictly_increase(floor in 0u64..1 << 60, readings in proptest::collection::vec(0u64..1 << 61, 1..64)) {
            let mut c = EpochClock::new(floor);
            let mut last = floor;
            for r in readings {
                let next = c.next(r).micros();
                prop_assert!(next > last);
                prop_assert!(next >= r);
                last = next;
            }
        }

        /// Two copies' saves interleaved at random, the older copy having
        /// announced first: from the newer copy's announcement on, every
        /// save of the older is refused, and none of the newer's is.
        #[test]
        fn a_stale_copy_is_refused_from_the_newer_ones_announcement_on(
            old in 1u64..1 << 40,
            gap in 1u64..1 << 20,
            turns in proptest::collection::vec(any::<bool>(), 1..40),
        ) {
            let (old, new) = (e(old), e(old + gap));
            let mut newest = Some(old);
            let mut announced = false;
            for newer_acts in turns {
                if newer_acts {
                    prop_assert!(admits(new, newest));
                    newest = newest.max(Some(new));
                    announced = true;
                } else {
                    prop_assert_eq!(admits(old, newest), !announced);
                }
            }
        }
    }
}
