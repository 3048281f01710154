//! How many actors a job runs: exactly `N`, a range `MIN..MAX` it grows
//! within as workers join, or `auto` (one per free slot of the workers
//! allowed, growing onto every worker that joins).

use std::fmt;
use std::str::FromStr;

use flotilla_proto::groups::MAX_BUNDLES;
use serde::{Deserialize, Serialize};

/// How many actors a job runs (the `--actors` flag).
///
/// ```
/// use flotilla_data::job::ActorCount;
/// let range: ActorCount = "2..8".parse().unwrap();
/// assert_eq!((range.initial(4), range.most(4)), (2, 8));
/// let auto: ActorCount = "auto".parse().unwrap();
/// assert_eq!(auto.initial(4), 4);
/// assert!(auto.grows());
/// assert!("8..2".parse::<ActorCount>().is_err());
/// assert_eq!("3".parse::<ActorCount>(), Ok(ActorCount::Exactly(3)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ActorCount {
    /// Exactly this many, placed before the job starts.
    Exactly(usize),
    /// Starts once `min` are placed; grows to `max` as workers with room
    /// join.
    Between {
        /// Placed before the job starts.
        min: usize,
        /// The most it grows to.
        max: usize,
    },
    /// One per free slot of the workers allowed when it starts, growing
    /// onto every worker that joins.
    Auto,
}

impl ActorCount {
    /// The actors placed before the job starts; `slots` is one per free
    /// slot of the workers allowed (what `auto` takes).
    pub fn initial(self, slots: usize) -> usize {
        match self {
            Self::Exactly(n) => n,
            Self::Between { min, .. } => min,
            Self::Auto => slots.max(1),
        }
    }

    /// The most actors the job grows to.
    pub fn most(self, slots: usize) -> usize {
        match self {
            Self::Exactly(n) => n,
            Self::Between { max, .. } => max,
            Self::Auto => MAX_BUNDLES.max(slots),
        }
    }

    /// The fewest actors the job keeps as its work runs out: `N`, `MIN`,
    /// or one for `auto`.
    pub fn least(self) -> usize {
        match self {
            Self::Exactly(n) => n,
            Self::Between { min, .. } => min,
            Self::Auto => 1,
        }
    }

    /// Whether the job grows onto workers that join.
    pub fn grows(self) -> bool {
        match self {
            Self::Exactly(_) => false,
            Self::Between { min, max } => max > min,
            Self::Auto => true,
        }
    }
}

/// Why an actor count does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--actors {given:?}: {rule}")]
pub struct BadActorCount {
    given: String,
    rule: &'static str,
}

impl FromStr for ActorCount {
    type Err = BadActorCount;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |rule| BadActorCount {
            given: s.to_owned(),
            rule,
        };
        let count = |n: &str| -> Result<usize, BadActorCount> {
            match n.trim().parse::<usize>() {
                Ok(0) => Err(bad("a count must be at least 1")),
                Ok(n) if n > MAX_BUNDLES => Err(bad("a job runs at most 4096 actors")),
                Ok(n) => Ok(n),
                Err(_) => Err(bad("give a count, MIN..MAX, or auto")),
            }
        };
        if s.trim() == "auto" {
            return Ok(Self::Auto);
        }
        match s.split_once("..") {
            Some((min, max)) => {
                let (min, max) = (count(min)?, count(max)?);
                if min > max {
                    return Err(bad("MIN must not be above MAX"));
                }
                Ok(Self::Between { min, max })
            }
            None => count(s).map(Self::Exactly),
        }
    }
}

impl fmt::Display for ActorCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exactly(n) => write!(f, "{n}"),
            Self::Between { min, max } => write!(f, "{min}..{max}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

impl From<ActorCount> for String {
    fn from(c: ActorCount) -> Self {
        c.to_string()
    }
}

impl TryFrom<String> for ActorCount {
    type Error = BadActorCount;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_ranges_and_auto_read_and_print_back() {
        for text in ["1", "12", "2..8", "3..3", "auto"] {
            let c: ActorCount = text.parse().unwrap();
            assert_eq!(c.to_string(), text);
        }
        assert!(!ActorCount::Exactly(4).grows());
        assert!(!ActorCount::Between { min: 3, max: 3 }.grows());
        assert!(ActorCount::Between { min: 1, max: 3 }.grows());
        assert_eq!(ActorCount::Between { min: 2, max: 8 }.least(), 2);
        assert_eq!(ActorCount::Auto.least(), 1);
        assert_eq!(ActorCount::Exactly(4).least(), 4);
        for bad in ["0", "0..4", "5..4", "x", "1..", "..4", "", "99999"] {
            assert!(bad.parse::<ActorCount>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&ActorCount::Between { min: 2, max: 6 }).unwrap();
        assert_eq!(json, "\"2..6\"");
        assert_eq!(
            serde_json::from_str::<ActorCount>(&json).unwrap(),
            ActorCount::Between { min: 2, max: 6 }
        );
    }
}
