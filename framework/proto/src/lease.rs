//! The head's lease: which of the heads of a set is the active one. The
//! lease is one record in a store with conditional writes (an object
//! store's `If-None-Match: *` create and `If-Match` replace); whoever last
//! wrote it, and keeps rewriting it, is the primary. A standby reads it
//! every quarter of the lease's duration and takes it over (a conditional
//! replace of the version it watched) only once that version has stood
//! unchanged for a whole duration, by its own clock.
//!
//! ```text
//! Standby ── Read ──► Absent ─────────────► Create ──┐ written
//!    ▲  └──► Held v, unchanged for a duration ─► Replace v ──┴──► Primary ── Replace (renew) every duration/4
//!    └─── conflict (someone else wrote first) ◄──────┘            │
//!                   conflict, or no renewal written for a whole duration
//!                                                                  ▼
//!                                                               Deposed
//! ```
//!
//! At most one active head: a primary counts itself active only until
//! `sent + duration × 3/4`, where `sent` is when it sent its last renewal
//! that was written; a standby first sees that renewal after it was
//! written (so after `sent`), and takes over no sooner than a whole
//! duration later. Two clocks that run at rates within a quarter of each
//! other cannot both count as active at once; a standby's replace of a
//! version the primary has since renewed fails (the store checks the
//! version), and so does a deposed primary's renewal. Every renewal
//! writes other bytes (its count grows), so its version always changes.
//!
//! A primary past its validity stops acting but is not deposed until a
//! standby may take over (a whole duration after its last written renewal
//! was sent, and never while a renewal is still unanswered): a renewal
//! that is written late proves nobody replaced the lease, so it pauses the
//! primary until the next renewal is written in time, with no failover.
//!
//! Feed it: [`HeadLease::poll_op`] says what to ask the store, the answer
//! goes to [`HeadLease::handle_read`] or [`HeadLease::handle_written`],
//! and [`HeadLease::handle_timeout`] runs at [`HeadLease::poll_timeout`].

use crate::ids::MemberName;
use crate::incarnation::Incarnation;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the lease record says: who holds it, from which term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Grows by one at each takeover.
    pub term: u64,
    /// The holder's member name.
    pub holder: MemberName,
    /// The address the holder serves the cluster on.
    pub address: String,
    /// The holder's incarnation: a head that takes over runs above it.
    pub incarnation: Incarnation,
    /// Renewals within this term (so every write changes the bytes).
    pub renewal: u64,
}

/// First line of an encoded record.
const MAGIC: &str = "flotilla-head-lease 1";

/// Why a stored lease record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the head lease record is not readable: {0}")]
pub struct LeaseRecordError(String);

impl LeaseRecord {
    /// The record as stored: plain text, one `key value` per line.
    pub fn encode(&self) -> String {
        format!(
            "{MAGIC}\nterm {}\nholder {}\naddress {}\nincarnation {}\nrenewal {}\n",
            self.term, self.holder, self.address, self.incarnation, self.renewal
        )
    }

    /// Reads a stored record; anything else is an error, never a default.
    pub fn decode(text: &str) -> Result<Self, LeaseRecordError> {
        let err = |why: &str| LeaseRecordError(why.to_owned());
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(err("it does not start as a head lease"));
        }
        let mut field = |key: &str| -> Result<String, LeaseRecordError> {
            let line = lines.next().ok_or_else(|| err(&format!("no {key}")))?;
            line.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(' '))
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| err(&format!("expected {key}, found {line:?}")))
        };
        let number = |key: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| err(&format!("{key} {v:?} is not a number")))
        };
        let term = field("term")?;
        let holder = field("holder")?;
        let address = field("address")?;
        let incarnation = field("incarnation")?;
        let renewal = field("renewal")?;
        Ok(Self {
            term: number("term", term)?,
            holder: MemberName::from(holder),
            address,
            incarnation: Incarnation::new(number("incarnation", incarnation)?),
            renewal: number("renewal", renewal)?,
        })
    }
}

/// What a read of the store found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No lease yet.
    Absent,
    /// A lease, at a version the store names (its ETag).
    Held {
        /// The record.
        record: LeaseRecord,
        /// The store's version of it.
        version: String,
    },
}

/// What to ask the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOp {
    /// Read the record and its version.
    Read,
    /// Write the record only if there is none.
    Create(LeaseRecord),
    /// Write the record only if the stored one is still at `version`.
    Replace {
        /// The version the write depends on.
        version: String,
        /// What to write.
        record: LeaseRecord,
    },
}

/// What a conditional write came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Written; the store's new version.
    Done(String),
    /// The condition failed: someone else wrote first.
    Conflict,
    /// The store could not be asked (unreachable, an error).
    Failed,
}

/// Why a primary stopped being one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostWhy {
    /// Another head replaced the lease.
    Replaced,
    /// No renewal was written before the lease's validity ended.
    Expired,
}

/// What the lease came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// This head is now the primary; `former` held the lease before it.
    Acquired {
        /// The record this head took over from, if any.
        former: Option<LeaseRecord>,
    },
    /// This head is no longer the primary and must stop serving at once.
    Lost(LostWhy),
}

/// Timing of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a lease version stands before a standby may take it over.
    pub duration: Duration,
}

impl LeaseConfig {
    /// How often a primary renews and a standby reads.
    pub fn interval(&self) -> Duration {
        self.duration / 4
    }

    /// How long after sending a written renewal a primary counts itself
    /// active.
    pub fn validity(&self) -> Duration {
        self.duration - self.duration / 4
    }
}

/// A version being watched by a standby.
#[derive(Debug, Clone)]
struct Watch {
    record: LeaseRecord,
    version: String,
    since: Instant,
}

#[derive(Debug, Clone)]
enum State {
    Standby {
        next_at: Instant,
        absent: bool,
        watch: Option<Watch>,
    },
    Primary {
        record: LeaseRecord,
        version: String,
        valid_until: Instant,
        renew_at: Instant,
        /// The earliest a standby may take over: a whole duration after
        /// the last written renewal was sent. Past `valid_until` and
        /// before this, the primary does not act but still renews: a
        /// renewal written then makes it valid again, with no failover.
        replaceable_at: Instant,
    },
    Deposed,
}

/// One head's side of the lease.
#[derive(Debug)]
pub struct HeadLease {
    me: LeaseRecord,
    config: LeaseConfig,
    state: State,
    /// When the write in flight was sent, if one is.
    in_flight: Option<Instant>,
    /// The record taken over, once a takeover is sent.
    former: Option<LeaseRecord>,
    events: VecDeque<LeaseEvent>,
}

impl HeadLease {
    /// A standby that reads the lease at once. `holder`, `address` and
    /// `incarnation` are what it writes when it takes the lease.
    pub fn new(
        now: Instant,
        holder: impl Into<MemberName>,
        address: impl Into<String>,
        incarnation: Incarnation,
        config: LeaseConfig,
    ) -> Self {
        Self {
            me: LeaseRecord {
                term: 0,
                holder: holder.into(),
                address: address.into(),
                incarnation,
                renewal: 0,
            },
            config,
            state: State::Standby {
                next_at: now,
                absent: false,
                watch: None,
            },
            in_flight: None,
            former: None,
            events: VecDeque::new(),
        }
    }

    /// The incarnation written from the next write on (a head learns its
    /// own once it has started, after taking the lease).
    pub fn set_incarnation(&mut self, incarnation: Incarnation) {
        self.me.incarnation = incarnation;
        if let State::Primary { record, .. } = &mut self.state {
            record.incarnation = incarnation;
        }
    }

    /// Whether this head is the primary and its lease still valid.
    pub fn holds(&self, now: Instant) -> bool {
        matches!(self.state, State::Primary { valid_until, .. } if now < valid_until)
    }

    /// Until when the primary counts itself active; `None` unless primary.
    pub fn valid_until(&self) -> Option<Instant> {
        match self.state {
            State::Primary { valid_until, .. } => Some(valid_until),
            _ => None,
        }
    }

    /// Whether this head lost the lease (it never takes it again).
    pub fn is_deposed(&self) -> bool {
        matches!(self.state, State::Deposed)
    }

    /// The term held, when primary.
    pub fn term(&self) -> Option<u64> {
        match &self.state {
            State::Primary { record, .. } => Some(record.term),
            _ => None,
        }
    }

    /// What to ask the store now, if anything (one request at a time).
    pub fn poll_op(&mut self, now: Instant) -> Option<LeaseOp> {
        if self.in_flight.is_some() {
            return None;
        }
        let op = match &self.state {
            State::Standby { next_at, .. } if now < *next_at => return None,
            State::Standby { absent: true, .. } => {
                self.former = None;
                LeaseOp::Create(LeaseRecord {
                    term: 1,
                    ..self.me.clone()
                })
            }
            State::Standby { watch: Some(w), .. }
                if now.saturating_duration_since(w.since) >= self.config.duration =>
            {
                self.former = Some(w.record.clone());
                LeaseOp::Replace {
                    version: w.version.clone(),
                    record: LeaseRecord {
                        term: w.record.term + 1,
                        ..self.me.clone()
                    },
                }
            }
            State::Standby { .. } => LeaseOp::Read,
            State::Primary {
                record,
                version,
                renew_at,
                ..
            } if now >= *renew_at => LeaseOp::Replace {
                version: version.clone(),
                record: LeaseRecord {
                    renewal: record.renewal + 1,
                    ..record.clone()
                },
            },
            State::Primary { .. } | State::Deposed => return None,
        };
        self.in_flight = Some(now);
        Some(op)
    }

    /// The answer to a [`LeaseOp::Read`] (`None`: the store could not be
    /// read).
    pub fn handle_read(&mut self, now: Instant, seen: Option<Seen>) {
        self.in_flight = None;
        let next = now + self.config.interval();
        let State::Standby {
            next_at,
            absent,
            watch,
        } = &mut self.state
        else {
            return;
        };
        match seen {
            None => *next_at = next,
            Some(Seen::Absent) => {
                *absent = true;
                *watch = None;
                *next_at = now;
            }
            Some(Seen::Held { record, version }) => {
                *absent = false;
                if watch.as_ref().is_none_or(|w| w.version != version) {
                    *watch = Some(Watch {
                        record,
                        version,
                        since: now,
                    });
                }
                *next_at = next;
            }
        }
    }

    /// The answer to a [`LeaseOp::Create`] or [`LeaseOp::Replace`]: `record`
    /// is what was written.
    pub fn handle_written(&mut self, now: Instant, record: LeaseRecord, written: Written) {
        let sent = self.in_flight.take().unwrap_or(now);
        match (&mut self.state, written) {
            (State::Standby { .. }, Written::Done(version)) => {
                self.state = State::Primary {
                    record,
                    version,
                    valid_until: sent + self.config.validity(),
                    renew_at: sent + self.config.interval(),
                    replaceable_at: sent + self.config.duration,
                };
                self.events.push_back(LeaseEvent::Acquired {
                    former: self.former.take(),
                });
            }
            (
                State::Standby {
                    next_at,
                    absent,
                    watch,
                },
                Written::Conflict,
            ) => {
                // Someone else wrote first: watch afresh.
                *absent = false;
                *watch = None;
                *next_at = now;
            }
            (State::Standby { next_at, .. }, Written::Failed) => {
                *next_at = now + self.config.interval();
            }
            (
                State::Primary {
                    record: held,
                    version: v,
                    valid_until,
                    renew_at,
                    replaceable_at,
                },
                Written::Done(version),
            ) => {
                // Written, however late: the replace was conditional on
                // the version this head wrote last, so no standby has
                // replaced it, and none can before a whole duration after
                // this renewal landed (after it was sent). One answered
                // after its validity leaves the head paused (not deposed)
                // until the next, sent at once, is written in time.
                *held = record;
                *v = version;
                *valid_until = sent + self.config.validity();
                *renew_at = sent + self.config.interval();
                *replaceable_at = sent + self.config.duration;
            }
            (State::Primary { .. }, Written::Conflict) => self.lose(LostWhy::Replaced),
            (
                State::Primary {
                    renew_at,
                    replaceable_at,
                    ..
                },
                Written::Failed,
            ) => {
                if now >= *replaceable_at {
                    self.lose(LostWhy::Expired);
                } else {
                    *renew_at = now + self.config.interval() / 4;
                }
            }
            (State::Deposed, _) => {}
        }
    }

    /// Runs what is due at `now`: a primary that has written no renewal
    /// for so long that a standby may take over is deposed (it stopped
    /// acting a quarter of the duration before, at its validity's end).
    /// While a renewal is in flight the head waits for its answer instead
    /// (the shell bounds each request): written, it still holds the lease.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let State::Primary { replaceable_at, .. } = self.state
            && now >= replaceable_at
            && self.in_flight.is_none()
        {
            self.lose(LostWhy::Expired);
        }
    }

    fn lose(&mut self, why: LostWhy) {
        self.state = State::Deposed;
        self.events.push_back(LeaseEvent::Lost(why));
    }

    /// When to call [`HeadLease::handle_timeout`] and poll again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Standby { next_at, watch, .. } => Some(match watch {
                Some(w) => (*next_at).min(w.since + self.config.duration),
                None => *next_at,
            }),
            State::Primary {
                valid_until,
                renew_at,
                replaceable_at,
                ..
            } => Some((*valid_until).min(*renew_at).min(*replaceable_at)),
            State::Deposed => None,
        }
    }

    /// The next thing the lease came to.
    pub fn poll_event(&mut self) -> Option<LeaseEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(4);

    fn lease(t: Instant, name: &str) -> HeadLease {
        HeadLease::new(
            t,
            name,
            "127.0.0.1:7000",
            Incarnation::new(10),
            LeaseConfig { duration: D },
        )
    }

    fn record(term: u64, holder: &str, renewal: u64) -> LeaseRecord {
        LeaseRecord {
            term,
            holder: holder.into(),
            address: "127.0.0.1:7000".into(),
            incarnation: Incarnation::new(10),
            renewal,
        }
    }

    /// A head that created the lease in `store` at `t0`, its event taken.
    fn primary(store: &mut Store, t0: Instant, name: &str) -> HeadLease {
        let mut head = lease(t0, name);
        store.ask(&mut head, t0); // read: absent
        store.ask(&mut head, t0); // create
        assert_eq!(
            head.poll_event(),
            Some(LeaseEvent::Acquired { former: None })
        );
        head
    }

    fn written(op: &LeaseOp) -> LeaseRecord {
        match op {
            LeaseOp::Create(r) | LeaseOp::Replace { record: r, .. } => r.clone(),
            LeaseOp::Read => panic!("a read, not a write"),
        }
    }

    /// A store with conditional writes, in memory: versions count up.
    #[derive(Default)]
    struct Store {
        held: Option<(LeaseRecord, String)>,
        writes: u64,
    }

    impl Store {
        fn ask(&mut self, lease: &mut HeadLease, now: Instant) {
            let Some(op) = lease.poll_op(now) else {
                return;
            };
            match op {
                LeaseOp::Read => lease.handle_read(
                    now,
                    Some(match &self.held {
                        None => Seen::Absent,
                        Some((record, version)) => Seen::Held {
                            record: record.clone(),
                            version: version.clone(),
                        },
                    }),
                ),
                LeaseOp::Create(record) => {
                    let w = if self.held.is_some() {
                        Written::Conflict
                    } else {
                        self.put(record.clone())
                    };
                    lease.handle_written(now, record, w);
                }
                LeaseOp::Replace { version, record } => {
                    let w = match &self.held {
                        Some((_, v)) if *v == version => self.put(record.clone()),
                        _ => Written::Conflict,
                    };
                    lease.handle_written(now, record, w);
                }
            }
        }

        fn put(&mut self, record: LeaseRecord) -> Written {
            self.writes += 1;
            let version = format!("v{}", self.writes);
            self.held = Some((record, version.clone()));
            Written::Done(version)
        }
    }

    #[test]
    fn a_record_reads_back_and_anything_else_is_refused() {
        let r = record(3, "head", 7);
        assert_eq!(LeaseRecord::decode(&r.encode()), Ok(r));
        assert!(LeaseRecord::decode("").is_err());
        assert!(LeaseRecord::decode("flotilla-head-lease 1\nterm x\n").is_err());
        let shuffled =
            "flotilla-head-lease 1\nholder h\nterm 1\naddress a\nincarnation 1\nrenewal 0\n";
        assert!(LeaseRecord::decode(shuffled).is_err());
        let empty = "flotilla-head-lease 1\nterm 1\nholder \naddress a\nincarnation 1\nrenewal 0\n";
        assert!(LeaseRecord::decode(empty).is_err());
    }

    #[test]
    fn the_first_head_creates_the_lease_and_renews_it_with_new_versions() {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut a = lease(t0, "a");
        store.ask(&mut a, t0); // read: absent
        store.ask(&mut a, t0); // create
        assert_eq!(a.poll_event(), Some(LeaseEvent::Acquired { former: None }));
        assert!(a.holds(t0));
        assert_eq!(a.term(), Some(1));
        let mut t = t0;
        for _ in 0..20 {
            t += D / 4;
            a.handle_timeout(t);
            store.ask(&mut a, t);
            assert!(a.holds(t), "renewed in time");
        }
        assert_eq!(store.writes, 21);
        assert_eq!(store.held.as_ref().unwrap().0.renewal, 20);
    }

    #[test]
    fn a_standby_waits_a_whole_duration_of_an_unchanged_version_then_takes_over() {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut a = primary(&mut store, t0, "a");
        let mut b = lease(t0, "b");
        // While a renews, b never takes over.
        let mut t = t0;
        for _ in 0..40 {
            t += D / 8;
            a.handle_timeout(t);
            store.ask(&mut a, t);
            b.handle_timeout(t);
            store.ask(&mut b, t);
            assert!(!b.holds(t));
            assert!(b.poll_event().is_none());
        }
        // a falls silent at `t`: b takes over no sooner than a duration
        // after a's last renewal, and then a no longer counts itself active.
        let silent = t;
        let mut took = None;
        while took.is_none() {
            t += Duration::from_millis(50);
            b.handle_timeout(t);
            store.ask(&mut b, t);
            if let Some(LeaseEvent::Acquired { former }) = b.poll_event() {
                assert_eq!(former.map(|f| f.holder), Some(MemberName::from("a")));
                took = Some(t);
            }
            assert!(
                !(a.holds(t) && b.holds(t)),
                "two active heads at {:?}",
                t - t0
            );
            assert!(t - silent < D * 2, "b never took over");
        }
        assert!(took.unwrap() - silent >= D - D / 4);
        assert_eq!(b.term(), Some(2));
        a.handle_timeout(t);
        assert_eq!(a.poll_event(), Some(LeaseEvent::Lost(LostWhy::Expired)));
    }

    #[test]
    fn a_primary_whose_lease_was_replaced_is_deposed_on_its_next_renewal() {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut a = primary(&mut store, t0, "a");
        // Someone else wrote the lease (an operator, a clock gone wrong).
        store.put(record(9, "z", 0));
        let t = t0 + D / 4;
        store.ask(&mut a, t);
        assert_eq!(a.poll_event(), Some(LeaseEvent::Lost(LostWhy::Replaced)));
        assert!(!a.holds(t));
        assert!(a.is_deposed());
        assert_eq!(a.poll_op(t + D), None, "a deposed head never asks again");
    }

    #[test]
    fn a_primary_that_cannot_reach_the_store_stops_acting_at_its_validity_and_steps_down_at_the_duration()
     {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut a = primary(&mut store, t0, "a");
        let mut t = t0;
        let mut stopped_acting = None;
        loop {
            t += Duration::from_millis(100);
            a.handle_timeout(t);
            if let Some(op) = a.poll_op(t) {
                a.handle_written(t, written(&op), Written::Failed);
            }
            if a.is_deposed() {
                break;
            }
            if !a.holds(t) && stopped_acting.is_none() {
                stopped_acting = Some(t);
            }
        }
        let config = LeaseConfig { duration: D };
        assert_eq!(stopped_acting.map(|s| s - t0), Some(config.validity()));
        assert_eq!(t - t0, D, "deposed once a standby may take over");
        assert_eq!(a.poll_event(), Some(LeaseEvent::Lost(LostWhy::Expired)));
    }

    #[test]
    fn a_renewal_that_succeeds_late_pauses_the_primary_without_a_failover() {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut a = primary(&mut store, t0, "a");
        let mut b = lease(t0, "b");
        store.ask(&mut b, t0); // b watches a's first version
        let sent = t0 + D / 4;
        let op = a.poll_op(sent).unwrap();
        // The store writes the renewal when it is sent…
        let version = match store.put(written(&op)) {
            Written::Done(v) => v,
            other => panic!("{other:?}"),
        };
        // …but its answer arrives only after the validity (a slow store),
        // while the standby keeps reading.
        let late = sent + LeaseConfig { duration: D }.validity() + D / 8;
        let mut t = sent;
        while t < late {
            a.handle_timeout(t);
            store.ask(&mut b, t);
            assert!(!b.holds(t));
            t += D / 8;
        }
        assert!(!a.holds(late), "the primary stops acting at its validity");
        assert!(!a.is_deposed(), "not while its renewal is unanswered");
        a.handle_written(late, written(&op), Written::Done(version));
        assert_eq!(a.poll_event(), None, "no loss, so no failover");
        assert!(!a.holds(late), "paused until a renewal is written in time");
        // The next renewal goes at once, and is answered in time.
        store.ask(&mut a, late);
        assert!(a.holds(late));
        // From then on the primary renews and the standby never sees a
        // version stand for a whole duration.
        let mut t = late;
        while t < late + 3 * D {
            t += D / 8;
            a.handle_timeout(t);
            store.ask(&mut a, t);
            store.ask(&mut b, t);
            assert!(!b.holds(t), "the standby took over at {:?}", t - t0);
            assert!(a.holds(t));
        }
        assert_eq!(a.poll_event(), None);
    }

    #[test]
    fn two_standbys_racing_for_an_absent_lease_leave_one_primary() {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut a = lease(t0, "a");
        let mut b = lease(t0, "b");
        // Both read "absent" before either writes.
        store.ask(&mut a, t0);
        store.ask(&mut b, t0);
        store.ask(&mut a, t0);
        store.ask(&mut b, t0);
        assert!(a.holds(t0));
        assert!(!b.holds(t0));
        assert!(b.poll_event().is_none());
        // b goes back to watching: it reads a's lease next.
        assert_eq!(b.poll_op(t0), Some(LeaseOp::Read));
    }

    #[test]
    fn a_store_that_cannot_be_read_keeps_a_standby_waiting() {
        let t0 = Instant::now();
        let mut b = lease(t0, "b");
        let mut t = t0;
        for _ in 0..100 {
            if let Some(op) = b.poll_op(t) {
                assert_eq!(op, LeaseOp::Read);
                b.handle_read(t, None);
            }
            t += D / 8;
            assert!(!b.holds(t));
        }
        assert!(b.poll_event().is_none());
    }
}
