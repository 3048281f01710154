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

use flotilla_data::output::OutputError;
pub use flotilla_data::output::{ErrorLog, RowError};
use flotilla_data::{CellType, Row, parts};
use serde::{Deserialize, Serialize};

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
    #[serde(default = "Format::jsonl")]
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

/// Format of the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Apache Parquet, one file per batch: id (string), embedding
    /// (fixed-size list of f32), the output columns.
    Parquet,
    /// JSON lines, one file per batch: {"id": …, "embedding": […], …}.
    Jsonl,
}

impl Format {
    fn jsonl() -> Self {
        Self::Jsonl
    }

    /// The parts' file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Jsonl => "jsonl",
        }
    }
}

/// Why the output cannot be used (the data layer's [`OutputError`]).
pub type SinkError = OutputError;

/// An output column beside `id` and `embedding`: its name and type.
pub type Column = (String, CellType);

/// The part of a completed batch in the manifest's format: its `rows`
/// (their output columns in `columns`' order) and their `values`, `dim`
/// of them a row, row-major.
pub fn encode_part(
    manifest: &Manifest,
    columns: &[Column],
    rows: &[Row],
    values: &[f32],
) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    match manifest.format {
        Format::Jsonl => Ok(jsonl_part(manifest.dim as usize, columns, rows, values)),
        Format::Parquet => parquet_part(manifest, columns, rows, values),
    }
}

/// The Arrow schema every Parquet part of a job has.
pub fn part_schema(manifest: &Manifest, columns: &[Column]) -> arrow_schema::Schema {
    use arrow_schema::{DataType, Field, Schema};
    let item = std::sync::Arc::new(Field::new("item", DataType::Float32, false));
    let mut fields = vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(item, manifest.dim as i32),
            false,
        ),
    ];
    fields.extend(
        columns
            .iter()
            .map(|(name, kind)| Field::new(name, parts::arrow_type(*kind), true)),
    );
    Schema::new(fields).with_metadata(std::collections::HashMap::from([
        ("flotilla.job_id".to_owned(), manifest.job_id.clone()),
        (
            "flotilla.model_revision".to_owned(),
            manifest.model_revision.clone(),
        ),
        ("flotilla.prompt".to_owned(), manifest.prompt.clone()),
        (
            "flotilla.similarity".to_owned(),
            manifest.similarity.clone(),
        ),
    ]))
}

/// The Parquet column of the vectors' values.
const EMBEDDING_VALUES: [&str; 3] = ["embedding", "list", "item"];

fn parquet_part(
    manifest: &Manifest,
    columns: &[Column],
    rows: &[Row],
    values: &[f32],
) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    use parquet::schema::types::ColumnPath;

    let schema = Arc::new(part_schema(manifest, columns));
    let arrow_schema::DataType::FixedSizeList(item, dim) = schema.field(1).data_type().clone()
    else {
        unreachable!("the embedding is a fixed-size list")
    };
    let embeddings = FixedSizeListArray::try_new(
        item,
        dim,
        Arc::new(Float32Array::from(values.to_vec())) as ArrayRef,
        None,
    )?;
    let mut arrays = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.id.as_str()),
        )) as ArrayRef,
        Arc::new(embeddings) as ArrayRef,
    ];
    for (c, (_, kind)) in columns.iter().enumerate() {
        arrays.push(parts::cells_array(
            rows.iter().map(|row| &row.extra[c]),
            *kind,
        ));
    }
    let batch = RecordBatch::try_new(schema.clone(), arrays)?;
    // Ids are unique and vectors are floats: a dictionary of either only
    // costs the writer time, and so do the minimum and maximum of every
    // vector value (an output column keeps the defaults).
    let values = ColumnPath::new(EMBEDDING_VALUES.map(str::to_owned).to_vec());
    let props = WriterProperties::builder()
        .set_column_dictionary_enabled(ColumnPath::from("id"), false)
        .set_column_dictionary_enabled(values.clone(), false)
        .set_column_statistics_enabled(values, EnabledStatistics::None)
        .set_key_value_metadata(Some(vec![
            KeyValue::new("flotilla.job_id".into(), manifest.job_id.clone()),
            KeyValue::new(
                "flotilla.model_revision".into(),
                manifest.model_revision.clone(),
            ),
        ]))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out)
}

/// JSON lines with the keys in column order: `id`, `embedding`, then the
/// output columns.
fn jsonl_part(dim: usize, columns: &[Column], rows: &[Row], values: &[f32]) -> Vec<u8> {
    fn put<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
        serde_json::to_writer(&mut *out, value).expect("values serialize");
    }
    let mut out = Vec::with_capacity(rows.len() * (dim * 12 + 32));
    for (i, row) in rows.iter().enumerate() {
        out.extend_from_slice(b"{\"id\":");
        put(&mut out, &row.id);
        out.extend_from_slice(b",\"embedding\":");
        put(&mut out, &values[i * dim..(i + 1) * dim]);
        for ((name, _), cell) in columns.iter().zip(&row.extra) {
            out.push(b',');
            put(&mut out, name);
            out.push(b':');
            parts::write_json_cell(&mut out, cell);
        }
        out.extend_from_slice(b"}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::path::PathBuf;

    use flotilla_data::{Cell, Output, RowAt};

    use super::*;

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

    fn rows(ids: &[String], extra: &[Vec<Cell>]) -> Vec<Row> {
        ids.iter()
            .zip(extra)
            .enumerate()
            .map(|(i, (id, extra))| Row {
                at: RowAt {
                    shard: 0,
                    line: i as u64,
                },
                id: id.clone(),
                text: String::new(),
                extra: extra.clone(),
            })
            .collect()
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

    /// The object-store path: a real local-filesystem store reached by a
    /// `file://` URL. Parts land under the prefix, a reopened sink finds
    /// them, and another job is refused.
    #[tokio::test]
    async fn object_store_output_resumes_and_refuses_another_job() {
        let dir = scratch("url");
        let url = format!("file://{}/out", dir.display());
        let mut m = manifest("j");
        m.columns = vec!["lang".into()];
        let columns = vec![("lang".to_owned(), CellType::Utf8)];
        let (sink, done) = open(&url, &m).await.unwrap();
        assert!(done.is_empty());
        let ids = vec!["a".to_owned(), "b".to_owned()];
        let extra = vec![vec![Cell::Str("en".into())], vec![Cell::Null]];
        let part = encode_part(&m, &columns, &rows(&ids, &extra), &[1.0, 0.0, 0.0, 1.0]).unwrap();
        sink.write_part(7, part).await.unwrap();
        sink.errors().finish().await.unwrap();
        let part = std::fs::read_to_string(dir.join("out/parts/batch-00000007.jsonl")).unwrap();
        assert_eq!(part.lines().count(), 2);
        assert!(
            part.starts_with("{\"id\":\"a\",\"embedding\":[1.0,0.0],\"lang\":\"en\"}"),
            "{part}"
        );
        assert!(part.contains("\"lang\":null"), "{part}");
        assert_eq!(std::fs::read(dir.join("out/errors.jsonl")).unwrap(), b"");

        let (_, done) = open(&url, &m).await.unwrap();
        assert_eq!(done, HashSet::from([7]));
        let err = open(&url, &manifest("j")).await.unwrap_err();
        assert!(
            matches!(err, SinkError::OtherJob { .. }),
            "other columns: {err}"
        );
        let err = open(&url, &manifest("other")).await.unwrap_err();
        assert!(matches!(err, SinkError::OtherJob { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_part_has_the_schema_with_the_revision_in_its_metadata() {
        let mut m = manifest("j");
        m.format = Format::Parquet;
        let columns = vec![
            ("n".to_owned(), CellType::Int64),
            ("ok".to_owned(), CellType::Boolean),
        ];
        let ids = vec!["a".to_owned()];
        let extra = vec![vec![Cell::Int(4), Cell::Bool(true)]];
        let bytes = encode_part(&m, &columns, &rows(&ids, &extra), &[0.6, 0.8]).unwrap();
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

    /// Ids and vectors are written without a dictionary (each id is
    /// unique; a dictionary of floats only costs time), and vector values
    /// without statistics; an output column keeps both.
    #[test]
    fn ids_and_vectors_are_written_without_a_dictionary_nor_value_statistics() {
        use parquet::basic::Encoding;
        use parquet::file::reader::FileReader;
        let mut m = manifest("j");
        m.format = Format::Parquet;
        let columns = vec![("lang".to_owned(), CellType::Utf8)];
        let ids: Vec<String> = (0..50).map(|i| format!("id-{i}")).collect();
        let extra: Vec<Vec<Cell>> = (0..50).map(|_| vec![Cell::Str("en".into())]).collect();
        let values = vec![0.5f32; 50 * 2];
        let bytes = encode_part(&m, &columns, &rows(&ids, &extra), &values).unwrap();
        let reader =
            parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(bytes)).unwrap();
        let group = reader.metadata().row_group(0);
        let column = |path: &str| {
            group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == path)
                .unwrap_or_else(|| panic!("no column {path}"))
        };
        let dictionary = |path: &str| {
            column(path)
                .encodings()
                .any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY))
        };
        let statistics = |path: &str| column(path).statistics().is_some();
        let values = EMBEDDING_VALUES.join(".");
        assert!(!dictionary("id"));
        assert!(!dictionary(&values));
        assert!(dictionary("lang"), "an output column keeps the default");
        assert!(!statistics(&values));
        assert!(statistics("id"), "ids keep their statistics");
    }
}
