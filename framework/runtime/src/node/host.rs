//! Which machine a node runs on, as far as shared memory goes, and how
//! much of it the object store may take.
//!
//! Two nodes share memory when they see the same kernel (its boot id) and
//! the same shared-memory filesystem (the device and inode of `/dev/shm`):
//! processes of one machine do, containers with a private `/dev/shm` do
//! not. The host id is a digest of both; a node's configuration may set
//! another (`--host-id`).

use sha2::{Digest, Sha256};

/// This machine's host id: 16 hex digits.
pub fn detect_host_id() -> String {
    let mut h = Sha256::new();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    h.update(boot.trim().as_bytes());
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata("/dev/shm") {
            h.update(m.dev().to_le_bytes());
            h.update(m.ino().to_le_bytes());
        }
    }
    if boot.is_empty() {
        // Without a boot id, the host name tells machines apart.
        let name = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        h.update(name.trim().as_bytes());
    }
    let digest = h.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The object store's default capacity: 30% of the machine's memory (as
/// Ray's object store takes), at most half of what `/dev/shm` has free, and
/// at least 64 MiB.
pub fn default_object_store_bytes() -> u64 {
    const FLOOR: u64 = 64 << 20;
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(4 << 30, |kib| kib * 1024);
    let share = memory / 10 * 3;
    let shm = shm_free_bytes().map_or(share, |free| free / 2);
    share.min(shm).max(FLOOR)
}

/// Free bytes of the filesystem behind `/dev/shm`.
fn shm_free_bytes() -> Option<u64> {
    #[cfg(unix)]
    {
        let st = nix::sys::statvfs::statvfs("/dev/shm").ok()?;
        Some(st.blocks_available() as u64 * st.fragment_size() as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_id_is_stable_and_short() {
        let id = detect_host_id();
        assert_eq!(id.len(), 16);
        assert_eq!(id, detect_host_id());
    }

    #[test]
    fn the_default_capacity_is_at_least_the_floor() {
        assert!(default_object_store_bytes() >= 64 << 20);
    }
}
