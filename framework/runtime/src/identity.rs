//! Who this node is: its member name (its certificate's name, with an
//! instance tag for roles that run many processes: see
//! [`flotilla_proto::role`]), its certificate's role, its current
//! incarnation, the addresses it advertises, what it offers, its cookie,
//! and the hello it opens streams with. Incarnations follow proto's rule
//! ([`next_incarnation`]): a head's or worker's is recorded in
//! `STATE_DIR/NAME.incarnation` before it is used, so they increase across
//! restarts even when the clock steps back; a process with an instance
//! name of its own has no earlier starts and records nothing.

use crate::clock::clock_micros;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flotilla_proto::hello::{CookieDigest, Hello, Purpose};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::{Incarnation, next_incarnation, parse_recorded};
use flotilla_proto::membership::JoinRequest;
use flotilla_proto::resources::Resources;
use flotilla_proto::role::Role;

/// Why the node's incarnation record could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error(
    "NODE-STATE-001: {path}: {source}; the node records its incarnation there (set --state-dir to a writable folder)"
)]
pub struct RecordError {
    /// The record file.
    pub path: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// Where a node records its incarnations: one file holding the last one.
#[derive(Debug)]
pub(crate) struct IncarnationRecord {
    path: PathBuf,
    /// A number every incarnation taken is above (a head taking over
    /// from another of its set runs above the former's).
    floor: Option<Incarnation>,
}

impl IncarnationRecord {
    /// The record of node `name` in `dir`.
    pub(crate) fn new(dir: &Path, name: &str) -> Self {
        Self {
            path: dir.join(format!("{name}.incarnation")),
            floor: None,
        }
    }

    /// The record, with every incarnation taken above `floor`.
    pub(crate) fn above(mut self, floor: Incarnation) -> Self {
        self.floor = Some(floor);
        self
    }

    /// Takes the next incarnation and records it (write, sync, rename)
    /// before returning it. An unreadable record is an error; a record
    /// that does not parse is replaced (the clock's reading is then the
    /// floor).
    pub(crate) fn take_next(&self) -> Result<Incarnation, RecordError> {
        let err = |source| RecordError {
            path: self.path.clone(),
            source,
        };
        let recorded = match std::fs::read_to_string(&self.path) {
            Ok(text) => {
                let recorded = parse_recorded(&text);
                if recorded.is_none() {
                    tracing::warn!(
                        path = %self.path.display(),
                        "NODE-STATE-002: the incarnation record does not hold a number; replacing it, with the clock as the floor"
                    );
                }
                recorded
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(e)),
        };
        let recorded = recorded.max(self.floor);
        let next = next_incarnation(clock_micros(), recorded);
        let tmp = self.path.with_extension("incarnation.tmp");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).map_err(err)?;
            writeln!(f, "{next}").map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        Ok(next)
    }
}

/// Where members reach a node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addresses {
    /// The address members dial.
    pub(crate) advertise: SocketAddr,
    /// The address members dial for the bulk lane.
    pub(crate) bulk: SocketAddr,
}

/// The local node's identity. Everything but the incarnation is fixed at
/// start; the incarnation grows when the head asks the node to rejoin.
#[derive(Debug)]
pub(crate) struct Identity {
    /// The node's member name.
    pub(crate) name: MemberName,
    /// Its certificate's role.
    pub(crate) role: Role,
    /// The current incarnation and where it is recorded (nowhere for an
    /// instance name).
    incarnation: Mutex<(Incarnation, Option<IncarnationRecord>)>,
    /// Digest of the cluster cookie.
    pub(crate) cookie: CookieDigest,
    /// The address members dial.
    pub(crate) advertise: SocketAddr,
    /// The address members dial for the bulk lane.
    pub(crate) bulk_addr: SocketAddr,
    /// What the node offers to work.
    pub(crate) resources: Resources,
    /// The host id members compare to share memory (see `crate::node::host`).
    pub(crate) host: String,
}

impl Identity {
    /// The identity of a node starting now, with its first incarnation
    /// taken from `record` (the clock's, for an instance name that keeps
    /// none).
    pub(crate) fn new(
        name: MemberName,
        role: Role,
        addresses: Addresses,
        resources: Resources,
        cookie: CookieDigest,
        record: Option<IncarnationRecord>,
    ) -> Result<Self, RecordError> {
        let first = match &record {
            Some(record) => record.take_next()?,
            None => next_incarnation(clock_micros(), None),
        };
        Ok(Self {
            name,
            role,
            incarnation: Mutex::new((first, record)),
            cookie,
            advertise: addresses.advertise,
            bulk_addr: addresses.bulk,
            resources,
            host: String::new(),
        })
    }

    /// The identity with host id `host`.
    pub(crate) fn with_host(mut self, host: String) -> Self {
        self.host = host;
        self
    }

    /// The current incarnation.
    pub(crate) fn incarnation(&self) -> Incarnation {
        self.incarnation.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Moves to a new, larger incarnation and returns it. Should the record
    /// fail, the node still moves on (in memory the incarnation grows
    /// anyway) and the failure is logged: only a restart that also meets a
    /// clock stepped back could then reuse a number.
    pub(crate) fn reincarnate(&self) -> Incarnation {
        let mut current = self.incarnation.lock().unwrap_or_else(|e| e.into_inner());
        let next = match current.1.as_ref().map(IncarnationRecord::take_next) {
            Some(Ok(next)) => next.max(current.0.next()),
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot record the new incarnation");
                next_incarnation(clock_micros(), Some(current.0))
            }
            None => next_incarnation(clock_micros(), Some(current.0)),
        };
        current.0 = next;
        next
    }

    /// This node's hello for a stream of `purpose`.
    pub(crate) fn hello(&self, purpose: Purpose) -> Hello {
        Hello::new(purpose, self.name.clone(), self.incarnation(), self.cookie)
    }

    /// The join request of the current incarnation.
    pub(crate) fn join_request(&self) -> JoinRequest {
        JoinRequest {
            name: self.name.clone(),
            addr: self.advertise.to_string(),
            bulk_addr: self.bulk_addr.to_string(),
            host: self.host.clone(),
            incarnation: self.incarnation(),
            resources: self.resources.clone(),
            held: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flotilla-identity-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn identity(dir: &Path) -> Identity {
        Identity::new(
            "n1".into(),
            Role::Worker,
            Addresses {
                advertise: "127.0.0.1:1".parse().unwrap(),
                bulk: "127.0.0.1:2".parse().unwrap(),
            },
            Resources::default(),
            [1; 32],
            Some(IncarnationRecord::new(dir, "n1")),
        )
        .unwrap()
    }

    #[test]
    fn a_new_incarnation_is_always_larger() {
        let dir = scratch("larger");
        let id = identity(&dir);
        let first = id.incarnation();
        assert!(id.reincarnate() > first);
        assert_eq!(id.join_request().incarnation, id.incarnation());
        assert_eq!(id.hello(Purpose::Cluster).incarnation, id.incarnation());
        assert_eq!(id.hello(Purpose::Cluster).cookie, [1; 32]);
    }

    #[test]
    fn a_restart_after_the_clock_stepped_back_takes_a_larger_incarnation() {
        let dir = scratch("restart");
        let record = IncarnationRecord::new(&dir, "n1");
        // A previous life ran with a clock an hour ahead of this one.
        let ahead = clock_micros() + 3_600_000_000;
        std::fs::write(&record.path, format!("{ahead}\n")).unwrap();
        let id = identity(&dir);
        assert_eq!(id.incarnation(), Incarnation::new(ahead + 1));
        let again = id.reincarnate();
        assert_eq!(again, Incarnation::new(ahead + 2));
        // The record holds what the node runs as; a restart goes past it.
        assert_eq!(identity(&dir).incarnation(), Incarnation::new(ahead + 3));
    }

    #[test]
    fn an_instance_name_records_nothing_and_still_grows() {
        let dir = scratch("instance");
        let id = Identity::new(
            "admin~00aa".into(),
            Role::Admin,
            Addresses {
                advertise: "127.0.0.1:1".parse().unwrap(),
                bulk: "127.0.0.1:2".parse().unwrap(),
            },
            Resources::default(),
            [1; 32],
            None,
        )
        .unwrap();
        let first = id.incarnation();
        assert!(first > Incarnation::new(0));
        assert!(id.reincarnate() > first);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no record");
    }

    #[test]
    fn a_record_that_cannot_be_written_is_a_typed_error() {
        let dir = scratch("unwritable").join("missing-folder");
        let record = IncarnationRecord::new(&dir, "n1");
        let e = record.take_next().unwrap_err();
        assert!(e.to_string().contains("NODE-STATE-001"), "{e}");
    }
}
