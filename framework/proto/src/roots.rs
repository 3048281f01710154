//! Where a node lets detached jobs read and write: roots, and the check of
//! a path or URL against them.
//!
//! A detached job runs with the credentials of the node it lands on, so a
//! node runs one only on inputs, outputs and models under roots its
//! operator allowed (`[jobs] allow = ["/data/", "s3://corpus-bucket/"]` in
//! its configuration, or `--allow-path`). A node with no roots runs no
//! detached jobs.
//!
//! The check compares what will be opened, not the text as written. A URL
//! is read the way the opener reads it: parsed as a URL (which resolves
//! `%2e%2e`, `.%2e` and, in `file:` URLs, backslashes), its path
//! percent-decoded and split where the object store splits it. Before
//! that, a `.` or `..` segment is refused however it is spelled (`..`,
//! `%2e%2e`, `.%2E`, `..\` in a `file:` URL), so such a path is never
//! silently read as another. A local path must be absolute and is taken
//! literally, as the operating system opens it. The path must then be the
//! root or lie under it, segment by segment (`/data` allows `/data/x`, not
//! `/database`). A glob is checked by its folder, and its pattern may not
//! hold a `.` or `..` segment.
//!
//! The check is of names; links are the caller's to resolve (the data
//! layer checks each local shard's and output's real path again).
//!
//! ```text
//! allow ["/data/", "s3://corpus/"]
//!   /data/in.jsonl            ✓        /data/../etc/passwd          ✗ (..)
//!   /database/x               ✗        file:///data/%2e%2e/etc      ✗ (..)
//!   s3://corpus/run1/         ✓        s3://corpus/a/.%2E/b         ✗ (..)
//!   s3://corpus-other/x       ✗        relative/path                ✗ (not absolute)
//! ```
//!
//! ```
//! use flotilla_proto::roots::AllowedRoots;
//!
//! let roots = AllowedRoots::new(&["/data/", "s3://corpus/"]).unwrap();
//! assert!(roots.check("input", "file:///data/in.jsonl").is_ok());
//! let refused = roots.check("input", "file:///data/%2e%2e/secret/in.jsonl");
//! assert!(refused.unwrap_err().to_string().starts_with("NODE-JOB-008"));
//! ```

use std::path::PathBuf;

use percent_encoding::percent_decode_str;

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
    /// A path or URL with a `.` or `..` segment, however spelled.
    #[error("NODE-JOB-008: {what} {path:?} holds a '.' or '..' segment")]
    DotSegment {
        /// What it is.
        what: String,
        /// The path.
        path: String,
    },
    /// A URL that does not parse, or whose path does not decode.
    #[error("NODE-JOB-008: {what} {path:?} is not a URL that can be opened: {reason}")]
    Unreadable {
        /// What it is.
        what: String,
        /// The path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Under none of the roots.
    #[error(
        "NODE-JOB-009: {what} {path:?} is outside the roots this node allows for jobs ({roots}); see `[jobs] allow` in node.toml, or --allow-path"
    )]
    Outside {
        /// What it is.
        what: String,
        /// The path (for a link, where it leads).
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

/// What a path or URL opens, cut into what the check compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `""` for a local path, else the scheme and authority
    /// (`s3://bucket`).
    base: String,
    /// The decoded segments of the path before any wildcard, empty ones
    /// dropped.
    segments: Vec<String>,
}

impl Target {
    /// The local path opened (its literal part, before any wildcard), for
    /// a local path or a `file:` URL; `None` for other stores.
    pub fn local_path(&self) -> Option<PathBuf> {
        self.base.is_empty().then(|| {
            let mut p = PathBuf::from("/");
            p.extend(&self.segments);
            p
        })
    }
}

/// Whether `spec` starts with a URL scheme (`scheme://`).
fn scheme_of(spec: &str) -> Option<&str> {
    let (scheme, _) = spec.split_once("://")?;
    let valid = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme)
}

/// `spec` cut before the component holding its first wildcard (the glob's
/// folder, as the input reader cuts it), and the pattern after it.
fn split_wildcard(spec: &str) -> (&str, &str) {
    match spec.find(['*', '?', '[']) {
        Some(wild) => {
            let cut = spec[..wild].rfind('/').map_or(0, |i| i + 1);
            (&spec[..cut], &spec[cut..])
        }
        None => (spec, ""),
    }
}

/// Whether `segment` is `.` or `..` once percent-decoded (`%2e`, `%2E`).
fn is_dot(segment: &str) -> bool {
    let decoded = percent_decode_str(segment).decode_utf8_lossy();
    decoded == "." || decoded == ".."
}

/// The non-empty `/`-separated segments of `path`; `None` when one is
/// `.` or `..`.
fn segments_of(path: &str) -> Option<Vec<String>> {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (!segments.iter().any(|s| s == "." || s == "..")).then_some(segments)
}

/// Reads `path` (`what` it is: input, output, model, root) as what it
/// opens: `Err` with what is wrong.
pub fn target(what: &str, path: &str) -> Result<Target, NotAllowed> {
    let dots = || NotAllowed::DotSegment {
        what: what.to_owned(),
        path: path.to_owned(),
    };
    let not_absolute = || NotAllowed::NotAbsolute {
        what: what.to_owned(),
        path: path.to_owned(),
    };
    let (literal, pattern) = split_wildcard(path);
    if pattern.split('/').any(|s| s == "." || s == "..") {
        return Err(dots());
    }
    let Some(scheme) = scheme_of(literal) else {
        // A local path, opened as written.
        if !literal.starts_with('/') {
            return Err(not_absolute());
        }
        let segments = segments_of(literal).ok_or_else(dots)?;
        return Ok(Target {
            base: String::new(),
            segments,
        });
    };
    let file = scheme.eq_ignore_ascii_case("file");
    let rest = &literal[scheme.len() + 3..];
    if file && !rest.starts_with('/') {
        // `file://host/…`: only local files.
        return Err(not_absolute());
    }
    // As written: no dot segment however it is spelled. In a `file:` URL a
    // backslash separates segments too.
    let written = rest.split_once('/').map_or("", |(_, p)| p);
    let written = written.split(['?', '#']).next().unwrap_or_default();
    let separators: &[char] = if file { &['/', '\\'] } else { &['/'] };
    if written.split(separators).any(is_dot) {
        return Err(dots());
    }
    // As opened: the URL's path, percent-decoded, split on `/`.
    let url = url::Url::parse(literal).map_err(|e| NotAllowed::Unreadable {
        what: what.to_owned(),
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let decoded = percent_decode_str(url.path())
        .decode_utf8()
        .map(|d| d.into_owned())
        .map_err(|_| NotAllowed::Unreadable {
            what: what.to_owned(),
            path: path.to_owned(),
            reason: "its path is not UTF-8 once decoded".into(),
        })?;
    let segments = segments_of(&decoded).ok_or_else(dots)?;
    let base = if file {
        String::new()
    } else {
        let host = url.host_str().unwrap_or_default();
        match url.port() {
            Some(port) => format!("{}://{host}:{port}", url.scheme()),
            None => format!("{}://{host}", url.scheme()),
        }
    };
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

    /// Checks that what `path` (`what` it is: input, output, model) opens
    /// lies under one of the roots, and returns it.
    pub fn check(&self, what: &str, path: &str) -> Result<Target, NotAllowed> {
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
            Ok(t)
        } else {
            Err(NotAllowed::Outside {
                what: what.to_owned(),
                path: path.to_owned(),
                roots: self.text.join(", "),
            })
        }
    }

    /// Checks that the local path `real` (a link's end, say) lies under
    /// one of the roots.
    pub fn check_local(&self, what: &str, real: &std::path::Path) -> Result<(), NotAllowed> {
        self.check(what, &real.to_string_lossy()).map(drop)
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
            assert!(roots.check("input", ok).is_ok(), "{ok}");
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

    /// The escapes a URL's parser or a store's decoder would resolve are
    /// refused as dot segments, however spelled, for local files and
    /// object stores alike; what they would open is checked too.
    #[test]
    fn encoded_dot_segments_and_backslashes_cannot_leave_a_root() {
        let roots = AllowedRoots::new(&["/data/allowed", "s3://corpus/allowed/"]).unwrap();
        for bad in [
            "file:///data/allowed/%2e%2e/secret/corpus.jsonl",
            "file:///data/allowed/%2E%2E/secret/",
            "file:///data/allowed/.%2e/secret/x",
            "file:///data/allowed/%2e./secret/x",
            "file:///data/allowed/%2e/x",
            "file:///data/allowed/..\\secret\\x",
            "file:///data/allowed\\..\\secret",
            "file:///data/allowed/x%2F..%2F..%2Fsecret",
            "s3://corpus/allowed/%2e%2e/private/x",
            "s3://corpus/allowed/.%2E/private/",
            "s3://corpus/allowed/x%2F..%2F..%2Fprivate",
            "/data/allowed/*/../../secret/*.jsonl",
            "s3://corpus/allowed/?/../x",
        ] {
            let e = roots.check("input", bad).unwrap_err();
            assert!(matches!(e, NotAllowed::DotSegment { .. }), "{bad}: {e}");
        }
        // Names that only look like escapes open what they say.
        for ok in [
            "/data/allowed/%2e%2e/x",
            "file:///data/allowed/a%20b/x.jsonl",
            "file:///data/allowed/..x/y",
            "s3://corpus/allowed/%2e%2ex/y",
            "s3://corpus/allowed/part-*/x.jsonl",
        ] {
            assert!(roots.check("input", ok).is_ok(), "{ok}");
        }
        // What a URL opens is compared decoded, and a host is no root.
        let t = roots.check("input", "file:///data/allowed/a%20b").unwrap();
        assert_eq!(
            t.local_path(),
            Some(std::path::PathBuf::from("/data/allowed/a b"))
        );
        for (bad, code) in [
            ("file:///data/%61llowed2/x", "NODE-JOB-009"),
            ("file://host/data/allowed/x", "NODE-JOB-008"),
            ("s3://corpus/other#/allowed/x", "NODE-JOB-009"),
            ("s3://corpus/allowed/%FF", "NODE-JOB-008"),
        ] {
            let e = roots
                .check("output", bad)
                .map(drop)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(code), "{bad}: {e}");
        }
        for ok in ["s3://corpus/%61llowed/x", "s3://corpus/allowed/x?y=%FF"] {
            assert!(roots.check("input", ok).is_ok(), "{ok}");
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
