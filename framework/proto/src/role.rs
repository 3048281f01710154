//! Who a peer is: the role its certificate carries, and the member name
//! each of its processes speaks under.
//!
//! A certificate names a *principal* (its DNS name) and carries one
//! [`Role`]. Processes of the head and of workers speak under the
//! principal's name itself: there is one such process per name at a time
//! (a second live one is refused, as Erlang refuses a duplicate node
//! name). Drivers, admins and observers are tools and jobs that any
//! number of processes run from one certificate: each process speaks
//! under a name of its own, the principal's followed by `~` and a random
//! instance tag, so their groups, actors and sessions never collide.
//!
//! A *pool* of workers (the pods of one Kubernetes Deployment, which
//! share one Secret) holds one worker certificate: each of its processes
//! names its instance (`node join --instance`, the pod's name), a DNS
//! label, and speaks as the principal's name, `~` and that label. One
//! live process per such name still holds; the pool's processes are one
//! principal (revoking the certificate revokes them all, and each may
//! drain the others), and they hold at most [`MAX_MEMBERS_PER_POOL`]
//! entries of the member table between them, those ended being forgotten
//! as a tool's are.
//!
//! ```text
//! certificate  name "w1",      role worker  ─► member "w1"
//! certificate  name "workers", role worker  ─► members "workers~pod-7d9f-x2k4q", "workers~…", …
//! certificate  name "admin",   role admin   ─► members "admin~3f09c1d2e4b5a697", "admin~…", …
//! ```

use rkyv::{Archive, Deserialize, Serialize};

/// What a certificate allows its holder to be.
#[derive(
    Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum Role {
    /// The control plane: keeps the member table, places groups, runs
    /// detached jobs, changes other nodes' reservations.
    Head,
    /// A machine that offers resources and runs actors.
    Worker,
    /// A user's job: joins without resources, places groups, spawns
    /// actors, submits and stops its own detached jobs.
    Driver,
    /// An operator: what a driver may, and stopping anyone's jobs and
    /// removing anyone's groups.
    Admin,
    /// Reads the cluster's state (status, jobs, groups), changes nothing.
    Observer,
}

/// Every role, in the order of [`Role::as_str`]'s documentation.
pub const ROLES: [Role; 5] = [
    Role::Head,
    Role::Worker,
    Role::Driver,
    Role::Admin,
    Role::Observer,
];

impl Role {
    /// `head`, `worker`, `driver`, `admin` or `observer`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Head => "head",
            Self::Worker => "worker",
            Self::Driver => "driver",
            Self::Admin => "admin",
            Self::Observer => "observer",
        }
    }

    /// Whether processes of this role speak under the principal's own name
    /// (one live process per name) rather than a per-process instance name.
    pub fn is_singular(self) -> bool {
        matches!(self, Self::Head | Self::Worker)
    }

    /// Whether a member of this role may offer resources (work is placed
    /// only on such members).
    pub fn may_offer_resources(self) -> bool {
        matches!(self, Self::Head | Self::Worker)
    }

    /// The marker a certificate carries for this role (its subject's
    /// organizational unit).
    pub fn certificate_marker(self) -> String {
        format!("{ROLE_MARKER_PREFIX}{}", self.as_str())
    }

    /// The role a certificate's marker names, if it is one.
    pub fn from_certificate_marker(marker: &str) -> Option<Self> {
        marker.strip_prefix(ROLE_MARKER_PREFIX)?.parse().ok()
    }
}

/// What precedes a role's name in a certificate's organizational unit.
pub const ROLE_MARKER_PREFIX: &str = "flotilla-role:";

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ROLES
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?} (head, worker, driver, admin, observer)"))
    }
}

/// What separates a principal's name from a process's instance tag.
pub const INSTANCE_SEPARATOR: char = '~';

/// Longest instance tag.
pub const MAX_INSTANCE_LEN: usize = 32;

/// Longest instance name of a pooled worker (a DNS label's length).
pub const MAX_WORKER_INSTANCE_LEN: usize = 63;

/// Whether `instance` may name a pooled worker's process: a DNS label
/// (lowercase letters, digits and `-`, neither first nor last, at most
/// [`MAX_WORKER_INSTANCE_LEN`] long), as a pod's name is.
pub fn is_worker_instance(instance: &str) -> bool {
    !instance.is_empty()
        && instance.len() <= MAX_WORKER_INSTANCE_LEN
        && !instance.starts_with('-')
        && !instance.ends_with('-')
        && instance
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
}

/// The member name of the pooled worker process `instance` holding the
/// worker certificate `principal`; `None` where `instance` is not a DNS
/// label ([`is_worker_instance`]).
pub fn worker_instance_name(principal: &str, instance: &str) -> Option<String> {
    is_worker_instance(instance).then(|| format!("{principal}{INSTANCE_SEPARATOR}{instance}"))
}

/// Whether `member` carries an instance tag: a tool's process or a
/// pooled worker's, forgotten some time after it ends (the principal's
/// own name is kept, as a worker's, to fence its later incarnations).
pub fn has_instance(member: &str) -> bool {
    member.contains(INSTANCE_SEPARATOR)
}

/// Most entries one certificate (principal) may hold in the member table:
/// its processes up, and those ended and not yet forgotten.
pub const MAX_MEMBERS_PER_PRINCIPAL: usize = 64;

/// Most entries one worker certificate may hold in the member table: a
/// pool of workers (the pods of a Deployment) is one certificate.
pub const MAX_MEMBERS_PER_POOL: usize = 4096;

/// Most entries one certificate of `role` may hold in the member table.
pub fn max_members(role: Role) -> usize {
    match role {
        Role::Worker => MAX_MEMBERS_PER_POOL,
        _ => MAX_MEMBERS_PER_PRINCIPAL,
    }
}

/// The principal (certificate name) a member name speaks for: the name
/// itself, or what precedes its instance tag.
pub fn principal_of(member: &str) -> &str {
    member
        .split_once(INSTANCE_SEPARATOR)
        .map_or(member, |(principal, _)| principal)
}

/// The member name of a process holding the certificate `principal` of
/// `role`: the name itself for singular roles, the name and the instance
/// tag `instance` (lowercase hex) otherwise.
pub fn member_name(principal: &str, role: Role, instance: u64) -> String {
    if role.is_singular() {
        principal.to_owned()
    } else {
        format!("{principal}{INSTANCE_SEPARATOR}{instance:016x}")
    }
}

/// Whether a peer whose certificate names `principal` with `role` may
/// speak under `member`: a singular role under the principal's own name,
/// a worker also under the principal's name with an instance name (a
/// pool's process, [`is_worker_instance`]), any other role under the
/// principal's name with an instance tag of lowercase hex digits.
pub fn may_speak_as(member: &str, principal: &str, role: Role) -> bool {
    match member.split_once(INSTANCE_SEPARATOR) {
        None => role.is_singular() && member == principal,
        Some((p, tag)) if p == principal => match role {
            Role::Head => false,
            Role::Worker => is_worker_instance(tag),
            Role::Driver | Role::Admin | Role::Observer => {
                !tag.is_empty()
                    && tag.len() <= MAX_INSTANCE_LEN
                    && tag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            }
        },
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_back_from_their_names_and_markers() {
        for role in ROLES {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
            assert_eq!(
                Role::from_certificate_marker(&role.certificate_marker()),
                Some(role)
            );
        }
        assert!("root".parse::<Role>().is_err());
        assert_eq!(Role::from_certificate_marker("worker"), None);
        assert_eq!(Role::from_certificate_marker("flotilla-role:root"), None);
    }

    #[test]
    fn workers_speak_as_themselves_and_tools_as_instances() {
        assert_eq!(member_name("w1", Role::Worker, 7), "w1");
        let m = member_name("admin", Role::Admin, 0xabc);
        assert_eq!(m, "admin~0000000000000abc");
        assert_eq!(principal_of(&m), "admin");
        assert_eq!(principal_of("w1"), "w1");
        assert!(may_speak_as("w1", "w1", Role::Worker));
        assert!(may_speak_as(&m, "admin", Role::Admin));
        // A tool may not take the bare name, nor the head an instance.
        assert!(!may_speak_as("admin", "admin", Role::Admin));
        assert!(!may_speak_as("head~00ab", "head", Role::Head));
        // A pool's worker speaks under its instance, a DNS label.
        let pod = worker_instance_name("workers", "flotilla-worker-7d9f-x2k4q").unwrap();
        assert!(may_speak_as(&pod, "workers", Role::Worker));
        assert!(has_instance(&pod) && !has_instance("w1"));
        assert_eq!(principal_of(&pod), "workers");
        assert!(!may_speak_as(&pod, "w1", Role::Worker));
        assert!(!may_speak_as(&pod, "workers", Role::Driver));
        for bad in ["", "-a", "a-", "Pod", "a.b", "a~b", "a_b", &"a".repeat(64)] {
            assert!(worker_instance_name("workers", bad).is_none(), "{bad:?}");
            assert!(
                !may_speak_as(&format!("workers~{bad}"), "workers", Role::Worker),
                "{bad:?}"
            );
        }
        assert!(worker_instance_name("workers", &"a".repeat(63)).is_some());
        // Another principal's name, or a malformed tag.
        assert!(!may_speak_as("w2", "w1", Role::Worker));
        assert!(!may_speak_as("alice~00ab", "admin", Role::Admin));
        for tag in ["", "XYZ", "00-1", &"a".repeat(MAX_INSTANCE_LEN + 1)] {
            assert!(
                !may_speak_as(&format!("admin~{tag}"), "admin", Role::Driver),
                "{tag:?}"
            );
        }
    }
}
