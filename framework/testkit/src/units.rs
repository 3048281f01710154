//! systemd units as the tests run them: a unit file's `[Service]` settings,
//! the example configuration in its leading comment, and the sandbox its
//! file-system settings describe, built with bubblewrap (`bwrap`, Debian's
//! `bubblewrap`; `scripts/fetch-test-tools` installs it).
//!
//! ```text
//! Unit::read(path) ─► settings, ExecStart, the example TOML of its comment
//!   .sandboxed(Sandbox { binary, etc, state, notify }) ─► Command:
//!       read-only system (ProtectSystem=strict), no homes (ProtectHome=yes),
//!       private /tmp (PrivateTmp=yes), the machine's /etc/NAME (read-only),
//!       /var/lib/NAME writable (StateDirectory), ReadWritePaths writable
//! ```
//!
//! A file-system setting the sandbox does not reproduce fails the test
//! that asks for it, rather than running a looser sandbox than systemd's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Settings of `[Service]` that change what a unit's process sees of the
/// file system and that [`Unit::sandboxed`] does not reproduce.
const NOT_REPRODUCED: [&str; 13] = [
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "RuntimeDirectory",
    "CacheDirectory",
    "LogsDirectory",
    "RootDirectory",
    "RootImage",
    "PrivateDevices",
    "WorkingDirectory",
    "ProtectProc",
];

/// Where the sandboxed program puts what it is run with.
const BINARY_IN_SANDBOX: &str = "/flotilla/bin/node";

/// A systemd unit file, read for its `[Service]` section and its leading
/// comment.
#[derive(Debug, Clone)]
pub struct Unit {
    /// The file.
    pub path: PathBuf,
    service: Vec<(String, String)>,
    comment: Vec<String>,
}

/// What a sandboxed unit runs on: the program in place of `ExecStart`'s,
/// and the host folders behind its machine's configuration folder and its
/// state directory.
#[derive(Debug, Clone)]
pub struct Sandbox<'a> {
    /// Run in place of `ExecStart`'s program, with its arguments.
    pub binary: &'a Path,
    /// The machine's `/etc/NAME` and what it holds, seen read-only as
    /// under `ProtectSystem=strict` whatever the unit says (the rest of
    /// `/etc` is the host's few files a process reads).
    pub etc: (&'a str, &'a Path),
    /// What `/var/lib/NAME` holds (`StateDirectory=NAME`).
    pub state: &'a Path,
    /// The systemd notification socket, seen inside as
    /// `/run/systemd/notify` (`NOTIFY_SOCKET`).
    pub notify: Option<&'a Path>,
}

impl Unit {
    /// Reads a unit file.
    ///
    /// # Panics
    ///
    /// When the file cannot be read.
    pub fn read(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("unit {}: {e}", path.display()));
        let mut service = Vec::new();
        let mut comment = Vec::new();
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim_end();
            if section.is_empty() && line.starts_with('#') {
                comment.push(line.trim_start_matches('#').to_owned());
            } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
            } else if section == "Service"
                && !line.starts_with('#')
                && let Some((key, value)) = line.split_once('=')
            {
                service.push((key.trim().to_owned(), value.trim().to_owned()));
            }
        }
        Self {
            path,
            service,
            comment,
        }
    }

    /// The last value of `key` in `[Service]`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.service
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The words of every `key` line in `[Service]` (lists such as
    /// `StateDirectory=a b`).
    pub fn words(&self, key: &str) -> Vec<&str> {
        self.service
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, v)| v.split_whitespace())
            .collect()
    }

    /// The unit with every `key` line removed.
    pub fn without(&self, key: &str) -> Self {
        let mut unit = self.clone();
        unit.service.retain(|(k, _)| k != key);
        unit
    }

    /// `ExecStart`'s program and arguments.
    ///
    /// # Panics
    ///
    /// When the unit has no `ExecStart`.
    pub fn exec(&self) -> (String, Vec<String>) {
        let line = self
            .get("ExecStart")
            .unwrap_or_else(|| panic!("{}: no ExecStart", self.path.display()));
        let mut words = line.split_whitespace().map(str::to_owned);
        let program = words.next().expect("ExecStart names a program");
        (program, words.collect())
    }

    /// The example configuration of the unit's leading comment: its lines
    /// indented past the comment's text (`#   name = "head"`), as one TOML
    /// document.
    pub fn example_config(&self) -> String {
        self.comment
            .iter()
            .filter_map(|l| l.strip_prefix("   "))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The unit's command in the sandbox its settings describe.
    ///
    /// # Panics
    ///
    /// When the unit asks for a file-system setting the sandbox does not
    /// reproduce, or a `ProtectSystem`/`ProtectHome` level other than
    /// `strict`/`yes`.
    pub fn sandboxed(&self, sandbox: &Sandbox<'_>) -> Command {
        for key in NOT_REPRODUCED {
            assert!(
                self.get(key).is_none(),
                "{}: {key} is not reproduced by the test sandbox",
                self.path.display()
            );
        }
        let mut c = Command::new("bwrap");
        c.arg("--die-with-parent");
        // The system, read-only: /usr, and the top-level folders or the
        // links into /usr that a merged-/usr system has instead.
        for top in [
            "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt",
        ] {
            let host = Path::new("/").join(top);
            match std::fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = std::fs::read_link(&host).unwrap();
                    c.arg("--symlink").arg(target).arg(&host);
                }
                Ok(m) if m.is_dir() => {
                    c.arg("--ro-bind").arg(&host).arg(&host);
                }
                _ => {}
            }
        }
        c.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/etc"]);
        for file in ["hosts", "passwd", "group", "nsswitch.conf", "resolv.conf"] {
            let host = Path::new("/etc").join(file);
            if host.exists() {
                c.arg("--ro-bind").arg(&host).arg(&host);
            }
        }
        let (etc_name, etc_host) = sandbox.etc;
        c.arg("--ro-bind")
            .arg(etc_host)
            .arg(Path::new("/etc").join(etc_name));
        c.args(["--tmpfs", "/var"]);
        for name in self.words("StateDirectory") {
            c.arg("--bind")
                .arg(sandbox.state)
                .arg(Path::new("/var/lib").join(name));
        }
        for path in self.words("ReadWritePaths") {
            let path = path.trim_start_matches('-');
            c.args(["--bind", path, path]);
        }
        let mut read_only = vec!["/", "/etc", "/var"];
        match self.get("ProtectHome") {
            Some("yes" | "true") => {
                c.args(["--tmpfs", "/home", "--tmpfs", "/root"]);
                read_only.extend(["/home", "/root"]);
            }
            None | Some("no" | "false") => {}
            Some(other) => panic!("ProtectHome={other} is not reproduced by the test sandbox"),
        }
        match self.get("PrivateTmp") {
            Some("yes" | "true") => {
                c.args(["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]);
            }
            _ => {
                c.args(["--dir", "/tmp", "--dir", "/var/tmp"]);
            }
        }
        c.args(["--tmpfs", "/run"]);
        read_only.push("/run");
        c.arg("--clearenv")
            .args(["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]);
        if let Some(socket) = sandbox.notify {
            c.arg("--bind").arg(socket).arg("/run/systemd/notify");
            c.args(["--setenv", "NOTIFY_SOCKET", "/run/systemd/notify"]);
            if let Some(secs) = self.get("WatchdogSec") {
                let usec = secs.parse::<u64>().expect("WatchdogSec in seconds") * 1_000_000;
                c.args(["--setenv", "WATCHDOG_USEC", &usec.to_string()]);
            }
        }
        if let Some(name) = self.words("StateDirectory").first() {
            c.args(["--setenv", "STATE_DIRECTORY", &format!("/var/lib/{name}")]);
        }
        if let Some(name) = self.words("ConfigurationDirectory").first() {
            c.args([
                "--setenv",
                "CONFIGURATION_DIRECTORY",
                &format!("/etc/{name}"),
            ]);
        }
        c.arg("--ro-bind")
            .arg(sandbox.binary)
            .arg(BINARY_IN_SANDBOX);
        match self.get("ProtectSystem") {
            Some("strict") => {
                for path in read_only {
                    c.args(["--remount-ro", path]);
                }
            }
            other => panic!("ProtectSystem={other:?} is not reproduced by the test sandbox"),
        }
        let (_, args) = self.exec();
        c.args(["--chdir", "/", "--", BINARY_IN_SANDBOX]).args(args);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = "# A unit, e.g.:\n#\n#   name = \"w1\"\n#   [labels]\n#   zone = \"a\"\n#\n# More words.\n[Unit]\nDescription=x\n\n[Service]\nExecStart=/usr/local/bin/node join --config /etc/flotilla/node.toml\nStateDirectory=flotilla other\nProtectSystem=strict\n# ProtectHome=no\n";

    fn unit(body: &str) -> Unit {
        let path = std::env::temp_dir().join(format!(
            "flotilla-unit-{}-{}",
            std::process::id(),
            body.len()
        ));
        std::fs::write(&path, body).unwrap();
        let unit = Unit::read(&path);
        std::fs::remove_file(&path).unwrap();
        unit
    }

    #[test]
    fn settings_exec_and_example_are_read() {
        let u = unit(UNIT);
        assert_eq!(u.words("StateDirectory"), vec!["flotilla", "other"]);
        assert_eq!(u.get("ProtectHome"), None, "commented out");
        assert_eq!(u.get("Description"), None, "not in [Service]");
        let (program, args) = u.exec();
        assert_eq!(program, "/usr/local/bin/node");
        assert_eq!(args, ["join", "--config", "/etc/flotilla/node.toml"]);
        assert_eq!(
            u.example_config(),
            "name = \"w1\"\n[labels]\nzone = \"a\"\n"
        );
        assert_eq!(
            u.without("StateDirectory").words("StateDirectory"),
            Vec::<&str>::new()
        );
    }

    #[test]
    #[should_panic(expected = "BindPaths is not reproduced")]
    fn a_setting_the_sandbox_cannot_reproduce_is_refused() {
        let u = unit(&format!("{UNIT}BindPaths=/srv\n"));
        let dir = std::env::temp_dir();
        u.sandboxed(&Sandbox {
            binary: &dir,
            etc: ("flotilla", &dir),
            state: &dir,
            notify: None,
        });
    }
}
