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
//! ```text
//! certificate  name "w1",    role worker    ─► member "w1"
//! certificate  name "admin", role admin     ─► members "admin~3f09c1d2e4b5a697", "admin~…", …
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

/// Most entries one certificate (principal) may hold in the member table:
/// its processes up, and those ended and not yet forgotten.
pub const MAX_MEMBERS_PER_PRINCIPAL: usize = 64;

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
/// any other under the principal's name with an instance tag of
/// lowercase hex digits.
pub fn may_speak_as(member: &str, principal: &str, role: Role) -> bool {
    match member.split_once(INSTANCE_SEPARATOR) {
        None => role.is_singular() && member == principal,
        Some((p, tag)) => {
            !role.is_singular()
                && p == principal
                && !tag.is_empty()
                && tag.len() <= MAX_INSTANCE_LEN
                && tag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
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
        // A worker may not take an instance name, nor a tool the bare one.
        assert!(!may_speak_as("w1~00ab", "w1", Role::Worker));
        assert!(!may_speak_as("admin", "admin", Role::Admin));
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
