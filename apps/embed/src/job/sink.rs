//! Idempotent output: a local folder (the default), or any object store
//! `object_store` reaches by URL (`s3://bucket/prefix`, `file:///path`,
//! `memory:///`), with the same layout.
//!
//! ```text
//! OUT/manifest.json               job id, model revision, dim, batch size, format,
//!                                 output columns (written first)
//! OUT/parts/batch-00000042.parquet  one per completed batch: id (string), embedding
//!                                   (fixed-size list of f32, dim), the output columns;
//!                                   job id and model revision in the schema metadata
//! OUT/parts/batch-00000042.jsonl    (with --format jsonl) {"id": …, "embedding": [f32; dim], …}
//! OUT/errors.jsonl                rows not embedded: {"shard": …, "line": …, "id": …, "reason": …}
//! ```
//!
//! Every Parquet part has the same schema, so the parts folder reads as one
//! dataset (`pyarrow.dataset`, polars' `scan_parquet`, DuckDB's
//! `read_parquet` over `parts/*.parquet`).
//!
//! The output itself — manifest first, one atomic put per part, the parts
//! present as the batches a resumed job skips, the errors file — is the
//! data layer's [`Output`]; this module is what the embed job writes
//! there: its manifest and the encoding of its parts.

use flotilla_data::Row;
use flotilla_data::output::OutputError;
pub use flotilla_data::output::{ErrorLog, RowError};
pub use flotilla_data::parts::Format;
use flotilla_data::parts::{self, Vectors};
use serde::{Deserialize, Serialize};

/// Output column names the job writes itself.
pub const RESERVED: [&str; 2] = ["id", "embedding"];

/// What identifies a job's output; a folder holds one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The job id.
    pub job_id: String,
    /// The model revision every vector came from.
    pub model_revision: String,
    /// Vector width.
    pub dim: u32,
    /// Rows per batch (batch ids depend on it).
    pub batch_size: u32,
    /// Part format (outputs written before parts had a format are JSON
    /// lines).
    #[serde(default = "jsonl")]
    pub format: Format,
    /// Input columns kept beside `id` and `embedding`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// Rows of each length-sorted window batches were cut from (0: input
    /// order, as outputs written before windows were).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sort_window: u32,
    /// The token budget per batch (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_batch_tokens: u32,
    /// The prompt before every text (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prompt: String,
    /// The similarity function the model was trained for, as its folder
    /// names it (empty: not named).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub similarity: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl std::fmt::Display for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} (model {}, {} dimensions, prompt {:?}, batch size {}, sort window {}, token budget {}, format {:?})",
            self.job_id,
            self.model_revision,
            self.dim,
            self.prompt,
            self.batch_size,
            self.sort_window,
            self.max_batch_tokens,
            self.format
        )
    }
}

fn jsonl() -> Format {
    Format::Jsonl
}

/// Why the output cannot be used (the data layer's [`OutputError`]).
pub type SinkError = OutputError;

/// An output column beside `id` and `embedding`: its name and type.
pub use flotilla_data::Column;

/// The part of a completed batch in the manifest's format: its `rows`
/// (their output columns in `columns`' order) and their `values`, `dim`
/// of them a row, row-major; the job id, model revision, prompt and
/// similarity in a Parquet part's metadata.
pub fn encode_part(
    manifest: &Manifest,
    columns: &[Column],
    rows: &[Row],
    values: &[f32],
) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    let vectors = Vectors {
        name: "embedding",
        dim: manifest.dim as usize,
        values,
    };
    let metadata = metadata(manifest);
    parts::vector_part(manifest.format, rows, vectors, columns, &metadata)
}

/// The Arrow schema every Parquet part of a job has.
pub fn part_schema(manifest: &Manifest, columns: &[Column]) -> arrow_schema::Schema {
    parts::vector_schema(
        "embedding",
        manifest.dim as usize,
        columns,
        &metadata(manifest),
    )
}

fn metadata(manifest: &Manifest) -> [(&str, &str); 4] {
    [
        ("flotilla.job_id", &manifest.job_id),
        ("flotilla.model_revision", &manifest.model_revision),
        ("flotilla.prompt", &manifest.prompt),
        ("flotilla.similarity", &manifest.similarity),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::path::PathBuf;

    use flotilla_data::{Cell, Output, RowAt};

    use super::*;
    use flotilla_data::CellType;

    fn manifest(job: &str) -> Manifest {
        Manifest {
            job_id: job.into(),
            model_revision: "sha256:00".into(),
            dim: 2,
            batch_size: 2,
            format: Format::Jsonl,
            columns: Vec::new(),
            sort_window: 0,
            max_batch_tokens: 0,
            prompt: String::new(),
            similarity: String::new(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("flotilla-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Opens `out` for the job `m` describes, as the job does.
    async fn open(out: &str, m: &Manifest) -> Result<(Output, HashSet<u64>), SinkError> {
        Output::open(out, m, m.format.extension()).await
    }

    /// A manifest from before parts had a format describes JSON-lines
    /// output and resumes as such; one that is not a manifest is refused
    /// with the parser's reason.
    #[tokio::test]
    async fn manifests_without_a_format_are_jsonl_and_bad_ones_say_why() {
        let dir = scratch("old");
        let out = dir.to_string_lossy().into_owned();
        let old = r#"{"job_id":"j","model_revision":"sha256:00","dim":2,"batch_size":2}"#;
        std::fs::write(dir.join("manifest.json"), old).unwrap();
        open(&out, &manifest("j")).await.unwrap();

        std::fs::write(dir.join("manifest.json"), r#"{"job_id": 3}"#).unwrap();
        let err = open(&out, &manifest("j")).await.unwrap_err();
        assert!(matches!(err, SinkError::Manifest { .. }), "{err}");
        assert!(err.to_string().contains("invalid type"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Another set of output columns is another job.
    #[tokio::test]
    async fn other_output_columns_are_another_job() {
        let dir = scratch("columns");
        let out = dir.to_string_lossy().into_owned();
        let mut m = manifest("j");
        m.columns = vec!["lang".into()];
        open(&out, &m).await.unwrap();
        let err = open(&out, &manifest("j")).await.unwrap_err();
        assert!(matches!(err, SinkError::OtherJob { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_part_has_the_schema_with_the_revision_in_its_metadata() {
        let mut m = manifest("j");
        m.format = Format::Parquet;
        let columns = vec![
            Column::new("n", CellType::Int64),
            Column::new("ok", CellType::Boolean),
        ];
        let row = Row {
            at: RowAt { shard: 0, line: 1 },
            id: "a".into(),
            text: String::new(),
            extra: vec![Cell::Int(4), Cell::Bool(true)],
        };
        let bytes = encode_part(&m, &columns, &[row], &[0.6, 0.8]).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .unwrap();
        let schema = reader.schema().clone();
        assert_eq!(*schema, part_schema(&m, &columns));
        assert_eq!(
            schema
                .metadata()
                .get("flotilla.model_revision")
                .map(String::as_str),
            Some("sha256:00")
        );
    }
}
