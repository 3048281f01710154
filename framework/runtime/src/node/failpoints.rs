//! Fault injection in-process: the `fail` crate's failpoints, configured at
//! run time from the environment variable [`ENV`] in that crate's syntax,
//! `name=action;name=action` (for example
//! `embedder::encode=5%panic;node::heartbeat=pause`). [`POINTS`] lists the
//! named points; docs/runtime-semantics.md says what each one does.

/// The environment variable read by [`configure_from_env`].
pub const ENV: &str = "FLOTILLA_FAILPOINTS";

/// The named failpoints: name and where it is.
pub const POINTS: &[(&str, &str)] = &[
    (
        "embedder::encode",
        "inside the embedding actor's handling of one batch, on its model thread",
    ),
    (
        "node::heartbeat",
        "the member's loop that heartbeats to the head, before each heartbeat",
    ),
    (
        "driver::result_object",
        "the embed job's driver reading a batch's result object (`return`: unreadable)",
    ),
];

/// A configuration the fail crate refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NODE-FAIL-001: {ENV} entry {entry:?}: {why}")]
pub struct FailpointError {
    /// The entry at fault.
    pub entry: String,
    /// Why.
    pub why: String,
}

/// Configures the failpoints in `spec` (`name=action;...`); returns the
/// names configured. Nothing is configured if an entry is refused.
pub fn configure(spec: &str) -> Result<Vec<String>, FailpointError> {
    let mut parsed = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let refused = |why: &str| FailpointError {
            entry: entry.to_owned(),
            why: why.to_owned(),
        };
        let (name, actions) = entry
            .split_once('=')
            .ok_or_else(|| refused("expected name=action"))?;
        let (name, actions) = (name.trim(), actions.trim());
        if name.is_empty() || actions.is_empty() {
            return Err(refused("expected name=action"));
        }
        parsed.push((name.to_owned(), actions.to_owned(), entry.to_owned()));
    }
    let mut done = Vec::new();
    for (name, actions, entry) in parsed {
        if let Err(why) = fail::cfg(name.clone(), &actions) {
            for n in &done {
                fail::remove(n);
            }
            return Err(FailpointError { entry, why });
        }
        done.push(name);
    }
    Ok(done)
}

/// Configures the failpoints named in [`ENV`], if it is set; logs each.
pub fn configure_from_env() -> Result<Vec<String>, FailpointError> {
    let Ok(spec) = std::env::var(ENV) else {
        return Ok(Vec::new());
    };
    let names = configure(&spec)?;
    for name in &names {
        if !POINTS.iter().any(|(n, _)| n == name) {
            tracing::warn!(failpoint = %name, "configured a failpoint this build does not name");
        }
    }
    if !names.is_empty() {
        tracing::warn!(failpoints = %spec, "failpoints configured");
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_configured_and_bad_ones_refused_with_nothing_left_set() {
        assert_eq!(
            configure("test::a=return; test::b=50%off").unwrap(),
            ["test::a", "test::b"]
        );
        let fired = || -> bool {
            fail::fail_point!("test::a", |_| true);
            false
        };
        assert!(fired());
        fail::remove("test::a");
        assert!(!fired());
        let e = configure("test::c=return;test::d=bogus(").unwrap_err();
        assert_eq!(e.entry, "test::d=bogus(");
        assert!(
            !fail::list().iter().any(|(n, _)| n == "test::c"),
            "nothing configured"
        );
        assert_eq!(
            configure("nothing").unwrap_err().why,
            "expected name=action"
        );
        assert_eq!(configure(" ; ").unwrap(), Vec::<String>::new());
    }
}
