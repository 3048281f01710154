//! Reclaiming the segments of processes that died.
//!
//! A store unlinks its segments as their objects are freed and when it is
//! dropped; a process killed with SIGKILL unlinks nothing. Every segment's
//! name carries its cluster scope and creating pid (see
//! [`crate::ObjectId`]), so a store opening on the host removes the
//! segments of its cluster whose process is gone. Readers that still map
//! such a segment keep their mapping; new readers get
//! [`crate::ObjectError::Gone`].

use crate::object_ref::ObjectId;

/// Where POSIX shared memory appears as files.
#[cfg(target_os = "linux")]
const SHM_DIR: &str = "/dev/shm";

/// Removes the segments of `scope` whose creating process is not running
/// (any but `me`); returns how many it removed.
#[cfg(target_os = "linux")]
pub(crate) fn sweep(scope: u32, me: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(ObjectId::from_file_name) else {
            continue;
        };
        if id.scope != scope || id.pid == me || alive(id.pid) {
            continue;
        }
        if std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(
            removed,
            "removed shared-memory segments left by processes that died"
        );
    }
    removed
}

/// Removes the segments of cluster `scope` on this host whose creating
/// process is gone (any process may call it: live processes' segments
/// stay); returns how many it removed.
pub fn sweep_dead(scope: u32) -> usize {
    sweep(scope, std::process::id())
}

/// Elsewhere segments are not files to list: nothing is swept.
#[cfg(not(target_os = "linux"))]
pub(crate) fn sweep(_scope: u32, _me: u32) -> usize {
    0
}

/// Whether process `pid` exists.
#[cfg(target_os = "linux")]
fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The segment files of `scope` on this host, by id: what tests and
/// `node status` count.
pub fn segments(scope: u32) -> Vec<ObjectId> {
    #[cfg(target_os = "linux")]
    {
        let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
            return Vec::new();
        };
        let mut ids: Vec<ObjectId> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(ObjectId::from_file_name))
            .filter(|id| id.scope == scope)
            .collect();
        ids.sort();
        ids
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = scope;
        Vec::new()
    }
}
