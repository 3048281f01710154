//! Where the embedder's tests find their models.

use std::path::PathBuf;

/// The folder of the test models: `FLOTILLA_TEST_MODELS`, else the
/// default of scripts/make-test-models.
pub fn models_dir() -> PathBuf {
    let dir = std::env::var_os("FLOTILLA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/flotilla/test-models")
        });
    assert!(
        dir.join("references.json").exists(),
        "no test models in {}: run scripts/test, or scripts/make-test-models",
        dir.display()
    );
    dir
}
