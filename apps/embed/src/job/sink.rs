//! Idempotent output in a local folder.
//!
//! ```text
//! OUT/manifest.json               job id, model revision, dim, batch size, format (written first)
//! OUT/parts/batch-00000042.parquet  one per completed batch: id (string), embedding
//!                                   (fixed-size list of f32, dim); model and revision in
//!                                   the file metadata
//! OUT/parts/batch-00000042.jsonl    (with --format jsonl) {"id": …, "embedding": [f32; dim]}
//! OUT/errors.jsonl                rejected rows: {"line": …, "id": …, "reason": …}
//! ```
//!
//! A part is written to a temporary name and renamed into place, so it
//! exists whole or not at all; writing the same batch again replaces it with
//! the same content. The parts present are the completed batches a resumed
//! job skips.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    /// Part format.
    pub format: Format,
}

impl std::fmt::Display for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} (model {}, batch size {}, format {:?})",
            self.job_id, self.model_revision, self.batch_size, self.format
        )
    }
}

/// Format of the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Apache Parquet, one file per batch.
    Parquet,
    /// JSON lines, one file per batch.
    Jsonl,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Jsonl => "jsonl",
        }
    }
}

/// Why the output folder cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// Reading or writing failed.
    #[error("output {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The folder holds another job's output (another input, model,
    /// batch size or format).
    #[error("output folder holds {found}; this run is {expected}; use another folder")]
    OtherJob {
        /// The job found there.
        found: Box<Manifest>,
        /// This run's job.
        expected: Box<Manifest>,
    },
    /// The manifest is not valid JSON.
    #[error("malformed manifest {0}")]
    Manifest(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SinkError + '_ {
    move |source| SinkError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically (temporary file, then rename).
fn put(path: &Path, bytes: &[u8]) -> Result<(), SinkError> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_data().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// A job's output folder.
#[derive(Debug)]
pub struct LocalSink {
    root: PathBuf,
    manifest: Manifest,
}

impl LocalSink {
    /// Opens (or creates) `root` for the job described by `manifest`, and
    /// returns the ids of the batches already completed there.
    pub fn open(root: &Path, manifest: &Manifest) -> Result<(Self, HashSet<u64>), SinkError> {
        let parts = root.join("parts");
        std::fs::create_dir_all(&parts).map_err(io(&parts))?;
        let path = root.join("manifest.json");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let found: Manifest = serde_json::from_slice(&bytes)
                    .map_err(|_| SinkError::Manifest(path.clone()))?;
                if found != *manifest {
                    return Err(SinkError::OtherJob {
                        found: Box::new(found),
                        expected: Box::new(manifest.clone()),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let json = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
                put(&path, &json)?;
            }
            Err(e) => return Err(io(&path)(e)),
        }
        let suffix = format!(".{}", manifest.format.extension());
        let mut done = HashSet::new();
        for entry in std::fs::read_dir(&parts).map_err(io(&parts))? {
            let name = entry.map_err(io(&parts))?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name
                .strip_prefix("batch-")
                .and_then(|s| s.strip_suffix(suffix.as_str()))
                .and_then(|s| s.parse::<u64>().ok())
            {
                done.insert(id);
            }
        }
        Ok((
            Self {
                root: root.to_path_buf(),
                manifest: manifest.clone(),
            },
            done,
        ))
    }

    /// Path of a batch's part.
    pub fn part_path(&self, batch_id: u64) -> PathBuf {
        let ext = self.manifest.format.extension();
        self.root
            .join("parts")
            .join(format!("batch-{batch_id:08}.{ext}"))
    }

    /// Writes a completed batch: `ids[i]` gets `values[i*dim..(i+1)*dim]`.
    pub fn write_batch(
        &self,
        batch_id: u64,
        ids: &[String],
        dim: usize,
        values: &[f32],
    ) -> Result<(), SinkError> {
        let bytes = match self.manifest.format {
            Format::Jsonl => jsonl_part(ids, dim, values),
            Format::Parquet => self.parquet_part(ids, dim, values)?,
        };
        put(&self.part_path(batch_id), &bytes)
    }

    fn parquet_part(
        &self,
        ids: &[String],
        dim: usize,
        values: &[f32],
    ) -> Result<Vec<u8>, SinkError> {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        use parquet::arrow::ArrowWriter;
        use parquet::file::metadata::KeyValue;
        use parquet::file::properties::WriterProperties;

        let path = self.root.join("parts");
        let fail = |e: String| SinkError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        };
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new(
                "embedding",
                DataType::FixedSizeList(item.clone(), dim as i32),
                false,
            ),
        ]));
        let embeddings = FixedSizeListArray::try_new(
            item,
            dim as i32,
            Arc::new(Float32Array::from(values.to_vec())) as ArrayRef,
            None,
        )
        .map_err(|e| fail(e.to_string()))?;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(ids)) as ArrayRef,
                Arc::new(embeddings) as ArrayRef,
            ],
        )
        .map_err(|e| fail(e.to_string()))?;
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![
                KeyValue::new("flotilla.job_id".into(), self.manifest.job_id.clone()),
                KeyValue::new(
                    "flotilla.model_revision".into(),
                    self.manifest.model_revision.clone(),
                ),
            ]))
            .build();
        let mut out = Vec::new();
        let mut writer =
            ArrowWriter::try_new(&mut out, schema, Some(props)).map_err(|e| fail(e.to_string()))?;
        writer.write(&batch).map_err(|e| fail(e.to_string()))?;
        writer.close().map_err(|e| fail(e.to_string()))?;
        Ok(out)
    }

    /// Replaces the errors file with `errors` (one JSON object per line).
    pub fn write_errors(&self, errors: &[RowError]) -> Result<(), SinkError> {
        let mut out = Vec::new();
        for e in errors {
            serde_json::to_writer(&mut out, e).expect("errors serialize");
            out.push(b'\n');
        }
        put(&self.root.join("errors.jsonl"), &out)
    }
}

fn jsonl_part(ids: &[String], dim: usize, values: &[f32]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Line<'a> {
        id: &'a str,
        embedding: &'a [f32],
    }
    let mut out = Vec::with_capacity(ids.len() * (dim * 12 + 32));
    for (i, id) in ids.iter().enumerate() {
        let line = Line {
            id,
            embedding: &values[i * dim..(i + 1) * dim],
        };
        serde_json::to_writer(&mut out, &line).expect("vectors serialize");
        out.push(b'\n');
    }
    out
}

/// A row that was not embedded, as written to the errors file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowError {
    /// 1-based input line.
    pub line: u64,
    /// The row's id, when known.
    pub id: Option<String>,
    /// Why.
    pub reason: String,
}
