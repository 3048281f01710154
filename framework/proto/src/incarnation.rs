//! Incarnations: the generation number a node runs under.
//!
//! A node takes a new incarnation when it starts and when the head asks it
//! to rejoin. Every stream's hello carries it, and the head fences on it: a
//! member is `up` as one incarnation at a time, and anything from an older
//! one is refused. That only works if incarnations strictly increase over a
//! node's whole life, across restarts, whatever its clock does. The rule:
//! the next incarnation is the clock's reading in microseconds, unless the
//! node has recorded one at least as large, in which case it is one more
//! than the recorded one. The node records each incarnation before it uses
//! it (the runtime keeps the record in a file next to its certificates).

use rkyv::{Archive, Deserialize, Serialize};

/// One process of a member: the member's name and the incarnation it
/// runs under. Two processes under one name (a restart, a rejoin) are told
/// apart by their incarnations; whatever a member owns (actors it spawned,
/// groups it made) belongs to one of its processes.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberRef {
    /// The member's name.
    pub name: String,
    /// The incarnation of its process.
    pub incarnation: u64,
}

impl MemberRef {
    /// The process of `name` running under `incarnation`.
    pub fn new(name: impl Into<String>, incarnation: u64) -> Self {
        Self {
            name: name.into(),
            incarnation,
        }
    }
}

impl std::fmt::Display for MemberRef {
    /// `NAME (incarnation N)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (incarnation {})", self.name, self.incarnation)
    }
}

/// The next incarnation, from the clock's reading (microseconds since the
/// Unix epoch) and the largest incarnation recorded so far, if any. Always
/// at least 1, and always larger than `recorded`.
pub fn next_incarnation(clock_micros: u64, recorded: Option<u64>) -> u64 {
    let floor = recorded.map_or(1, |r| r.saturating_add(1));
    clock_micros.max(floor)
}

/// Parses a recorded incarnation (a decimal number, surrounding white space
/// allowed).
pub fn parse_recorded(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_start_takes_the_clock() {
        assert_eq!(
            next_incarnation(1_700_000_000_000_000, None),
            1_700_000_000_000_000
        );
        assert_eq!(
            next_incarnation(0, None),
            1,
            "a clock at the epoch still gives 1"
        );
    }

    #[test]
    fn a_clock_step_backwards_still_gives_a_larger_incarnation() {
        let before = next_incarnation(1_700_000_000_000_000, None);
        // The clock is set back an hour, and the node restarts.
        let after = next_incarnation(1_699_999_996_400_000, Some(before));
        assert_eq!(after, before + 1);
        // A restart within the same microsecond.
        assert_eq!(next_incarnation(before, Some(before)), before + 1);
    }

    #[test]
    fn a_clock_ahead_of_the_record_is_taken() {
        assert_eq!(next_incarnation(2_000, Some(1_000)), 2_000);
    }

    #[test]
    fn a_sequence_of_restarts_on_a_wandering_clock_strictly_increases() {
        let clocks = [50, 40, 40, 100, 10, 0, 101, u64::MAX - 1, 3];
        let mut recorded = None;
        let mut last = 0;
        for clock in clocks {
            let next = next_incarnation(clock, recorded);
            assert!(next > last, "{next} after {last} (clock {clock})");
            recorded = Some(next);
            last = next;
        }
    }

    #[test]
    fn recorded_incarnations_parse() {
        assert_eq!(parse_recorded("123\n"), Some(123));
        assert_eq!(parse_recorded(""), None);
        assert_eq!(parse_recorded("12x"), None);
    }
}
