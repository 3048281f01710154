//! Object stores named by URL, for checkpoints and the embed job's input
//! and output alike.
//!
//! `s3://bucket/prefix`, `file:///path`, `memory:///` and whatever else
//! `object_store` parses; settings come from the environment as
//! `object_store` reads them (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT`, … for S3).
//!
//! HTTPS goes through rustls on aws-lc-rs, the workspace's one crypto
//! provider (the cluster's QUIC and TLS use it too).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

/// Whether `spec` is a URL (`scheme://…`) rather than a local path.
pub fn is_url(spec: &str) -> bool {
    spec.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// The store and the path inside it that `url` names.
pub fn open_url(url: &str) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    let options: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let (store, path) =
        object_store::parse_url_opts(&parsed, options).map_err(|e| e.to_string())?;
    Ok((Arc::from(store), path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_have_a_scheme_paths_do_not() {
        assert!(is_url("s3://bucket/prefix"));
        assert!(is_url("file:///tmp/x"));
        assert!(!is_url("out/"));
        assert!(!is_url("/data/corpus.jsonl"));
        assert!(!is_url("data/a b://c"));
        assert!(!is_url("://nothing"));
    }
}
