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

use crate::ids::MemberName;
use rkyv::{Archive, Deserialize, Serialize};

/// The generation number one process of a node runs under: a clock
/// reading in microseconds since the Unix epoch (or one more than the last
/// one recorded), larger than every earlier process's of that node.
/// [`Incarnation::TOOL`] (0) is a tool's, which opens control streams
/// only. Archived and printed as the number.
///
/// ```
/// use flotilla_proto::incarnation::{next_incarnation, Incarnation};
/// let first = next_incarnation(1_700_000_000_000_000, None);
/// let again = next_incarnation(1_700_000_000_000_000, Some(first));
/// assert_eq!(again, first.next(), "a restart within the same microsecond");
/// assert!(Incarnation::TOOL < first && Incarnation::TOOL.is_tool());
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
pub struct Incarnation(u64);

impl Incarnation {
    /// A tool's incarnation: it opens control streams only, and is never a
    /// member.
    pub const TOOL: Self = Self(0);

    /// The incarnation numbered `n`.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// Its number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whether it is a tool's.
    pub const fn is_tool(self) -> bool {
        self.0 == 0
    }

    /// The incarnation right after it.
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl std::fmt::Display for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::LowerHex for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Incarnation {
    type Err = std::num::ParseIntError;
    /// The decimal number.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}

impl ArchivedIncarnation {
    /// The incarnation it archives.
    pub fn to_native(&self) -> Incarnation {
        Incarnation(self.0.to_native())
    }
}

/// One process of a member: the member's name and the incarnation it
/// runs under. Two processes under one name (a restart, a rejoin) are told
/// apart by their incarnations; whatever a member owns (actors it spawned,
/// groups it made) belongs to one of its processes.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberRef {
    /// The member's name.
    pub name: MemberName,
    /// The incarnation of its process.
    pub incarnation: Incarnation,
}

impl MemberRef {
    /// The process of `name` running under `incarnation`.
    pub fn new(name: impl Into<MemberName>, incarnation: Incarnation) -> Self {
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
pub fn next_incarnation(clock_micros: u64, recorded: Option<Incarnation>) -> Incarnation {
    let floor = recorded.map_or(Incarnation(1), Incarnation::next);
    Incarnation(clock_micros).max(floor)
}

/// Parses a recorded incarnation (a decimal number, surrounding white space
/// allowed).
pub fn parse_recorded(text: &str) -> Option<Incarnation> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_start_takes_the_clock() {
        assert_eq!(
            next_incarnation(1_700_000_000_000_000, None),
            Incarnation::new(1_700_000_000_000_000)
        );
        assert_eq!(
            next_incarnation(0, None),
            Incarnation::new(1),
            "a clock at the epoch still gives 1"
        );
    }

    #[test]
    fn a_clock_step_backwards_still_gives_a_larger_incarnation() {
        let before = next_incarnation(1_700_000_000_000_000, None);
        // The clock is set back an hour, and the node restarts.
        let after = next_incarnation(1_699_999_996_400_000, Some(before));
        assert_eq!(after, before.next());
        // A restart within the same microsecond.
        assert_eq!(next_incarnation(before.get(), Some(before)), before.next());
    }

    #[test]
    fn a_clock_ahead_of_the_record_is_taken() {
        assert_eq!(
            next_incarnation(2_000, Some(Incarnation::new(1_000))),
            Incarnation::new(2_000)
        );
    }

    #[test]
    fn a_sequence_of_restarts_on_a_wandering_clock_strictly_increases() {
        let clocks = [50, 40, 40, 100, 10, 0, 101, u64::MAX - 1, 3];
        let mut recorded = None;
        let mut last = Incarnation::TOOL;
        for clock in clocks {
            let next = next_incarnation(clock, recorded);
            assert!(next > last, "{next} after {last} (clock {clock})");
            recorded = Some(next);
            last = next;
        }
    }

    #[test]
    fn recorded_incarnations_parse() {
        assert_eq!(parse_recorded("123\n"), Some(Incarnation::new(123)));
        assert_eq!(parse_recorded(""), None);
        assert_eq!(parse_recorded("12x"), None);
    }
}
