//! Where a node lets detached jobs read and write: roots, and the check of
//! a path or URL against them.
//!
//! A detached job runs with the credentials of the node it lands on, so a
//! node runs one only on inputs and outputs under roots its operator
//! allowed (`[jobs] allow = ["/data/", "s3://corpus-bucket/"]` in its
//! configuration, or `--allow-path`). The check is lexical and refuses
//! before anything is opened: a path must be absolute, a URL must name a
//! scheme, neither may hold a `.` or `..` segment, and it must be the root
//! or lie under it, segment by segment (`/data` allows `/data/x`, not
//! `/database`). A node with no roots runs no detached jobs.
//!
//! ```text
//! allow ["/data/", "s3://corpus/"]
//!   /data/in.jsonl            ✓        /data/../etc/passwd   ✗ (..)
//!   /database/x               ✗        s3://corpus/run1/     ✓
//!   s3://corpus-other/x       ✗        relative/path         ✗ (not absolute)
//! ```

/// Why a path or URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAllowed {
    /// The node allows no roots at all.
    #[error(
        "NODE-JOB-007: this node runs no detached jobs: it allows no input or output roots (set `[jobs] allow = [...]` in node.toml, or --allow-path)"
    )]
    NoRoots,
    /// A local path that is not absolute.
    #[error("NODE-JOB-008: {what} {path:?} is not an absolute path")]
    NotAbsolute {
        /// What it is (input, output, model).
        what: String,
        /// The path.
        path: String,
    },
    /// A path or URL with a `.` or `..` segment.
    #[error("NODE-JOB-008: {what} {path:?} holds a '.' or '..' segment")]
    DotSegment {
        /// What it is.
        what: String,
        /// The path.
        path: String,
    },
    /// Under none of the roots.
    #[error(
        "NODE-JOB-009: {what} {path:?} is outside the roots this node allows for jobs ({roots}); see `[jobs] allow` in node.toml, or --allow-path"
    )]
    Outside {
        /// What it is.
        what: String,
        /// The path.
        path: String,
        /// The roots, comma-separated.
        roots: String,
    },
}

/// The roots a node allows detached jobs to read and write under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedRoots {
    roots: Vec<Target>,
    text: Vec<String>,
}

/// A path or URL cut into what the check compares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `""` for a local path, else the scheme and authority
    /// (`s3://bucket`).
    base: String,
    /// The path's segments, empty ones dropped.
    segments: Vec<String>,
}

/// Cuts `path` into a [`Target`]: `Err` with what is wrong.
fn target(what: &str, path: &str) -> Result<Target, NotAllowed> {
    let (base, rest) = match path.split_once("://") {
        // A `file://` URL is a local path.
        Some(("file", rest)) => (String::new(), rest),
        Some((scheme, rest)) => {
            let (authority, rest) = rest.split_once('/').unwrap_or((rest, ""));
            (format!("{scheme}://{authority}"), rest)
        }
        None if path.starts_with('/') => (String::new(), path),
        None => {
            return Err(NotAllowed::NotAbsolute {
                what: what.to_owned(),
                path: path.to_owned(),
            });
        }
    };
    if base.is_empty() && !rest.starts_with('/') {
        return Err(NotAllowed::NotAbsolute {
            what: what.to_owned(),
            path: path.to_owned(),
        });
    }
    let segments: Vec<String> = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if segments.iter().any(|s| s == "." || s == "..") {
        return Err(NotAllowed::DotSegment {
            what: what.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(Target { base, segments })
}

impl AllowedRoots {
    /// The roots `roots` (absolute paths or URLs); `Err` names the first
    /// that cannot be one.
    pub fn new<S: AsRef<str>>(roots: &[S]) -> Result<Self, NotAllowed> {
        let mut out = Self::default();
        for r in roots {
            let r = r.as_ref();
            out.roots.push(target("root", r)?);
            out.text.push(r.to_owned());
        }
        Ok(out)
    }

    /// Whether no root is allowed.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The roots as given.
    pub fn roots(&self) -> &[String] {
        &self.text
    }

    /// Checks that `path` (`what` it is: input, output, model) lies under
    /// one of the roots.
    pub fn check(&self, what: &str, path: &str) -> Result<(), NotAllowed> {
        if self.roots.is_empty() {
            return Err(NotAllowed::NoRoots);
        }
        let t = target(what, path)?;
        let under = |r: &Target| {
            r.base == t.base
                && r.segments.len() <= t.segments.len()
                && r.segments.iter().zip(&t.segments).all(|(a, b)| a == b)
        };
        if self.roots.iter().any(under) {
            Ok(())
        } else {
            Err(NotAllowed::Outside {
                what: what.to_owned(),
                path: path.to_owned(),
                roots: self.text.join(", "),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_a_root_pass_and_the_others_are_refused_with_why() {
        let roots =
            AllowedRoots::new(&["/data/", "s3://corpus/runs", "file:///srv/models"]).unwrap();
        for ok in [
            "/data",
            "/data/in.jsonl",
            "/data//nested/shards/*.parquet",
            "s3://corpus/runs/1/",
            "s3://corpus/runs",
            "/srv/models/all-MiniLM-L6-v2",
            "file:///data/x.jsonl",
        ] {
            assert_eq!(roots.check("input", ok), Ok(()), "{ok}");
        }
        for (bad, code) in [
            ("/database/x", "NODE-JOB-009"),
            ("/etc/passwd", "NODE-JOB-009"),
            ("/data/../etc/passwd", "NODE-JOB-008"),
            ("/data/./x", "NODE-JOB-008"),
            ("s3://corpus/runs/../private/x", "NODE-JOB-008"),
            ("s3://corpus-other/runs/x", "NODE-JOB-009"),
            ("s3://corpus/run", "NODE-JOB-009"),
            ("gs://corpus/runs/x", "NODE-JOB-009"),
            ("data/in.jsonl", "NODE-JOB-008"),
            ("file://relative", "NODE-JOB-008"),
        ] {
            let e = roots.check("output", bad).unwrap_err().to_string();
            assert!(e.starts_with(code), "{bad}: {e}");
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn a_node_without_roots_runs_no_jobs_and_says_which_setting() {
        let e = AllowedRoots::default()
            .check("input", "/data/x")
            .unwrap_err();
        assert_eq!(e, NotAllowed::NoRoots);
        assert!(e.to_string().contains("[jobs] allow"));
        assert!(AllowedRoots::new(&["relative"]).is_err());
    }
}
