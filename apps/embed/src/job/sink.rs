//! Idempotent output: a local folder (the default), or any object store
//! `object_store` reaches by URL (`s3://bucket/prefix`, `file:///path`,
//! `memory:///`), with the same layout.
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
//! Every output goes through `object_store` (a local folder is its
//! `LocalFileSystem` with fsync). A part is written with one atomic put
//! (locally: a staged file, fsync, rename), so it exists whole or not at
//! all; writing the same batch again replaces it with the same content. The parts present
//! are the completed batches a resumed job skips.
//!
//! Object stores are configured from the environment as `object_store`
//! reads it: for S3, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT` (an S3-compatible server) and the other
//! `AWS_*` settings.

use std::collections::HashSet;
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
    /// Part format (outputs written before parts had a format are JSON
    /// lines).
    #[serde(default = "Format::jsonl")]
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
    fn jsonl() -> Self {
        Self::Jsonl
    }

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
    /// The manifest is not a manifest.
    #[error("malformed manifest {path}: {source}")]
    Manifest {
        /// Where it is.
        path: PathBuf,
        /// What is wrong with it.
        source: serde_json::Error,
    },
    /// A part could not be encoded.
    #[error("output {location}: cannot encode the part: {source}")]
    Encode {
        /// The part's location.
        location: String,
        /// The encoder's error.
        source: parquet::errors::ParquetError,
    },
    /// The output URL is not one `object_store` knows.
    #[error("output {url}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// An object store operation failed.
    #[error("output {location}: {source}")]
    Store {
        /// The object's location.
        location: String,
        /// The store's error.
        source: object_store::Error,
    },
}

/// A part's bytes in the manifest's format.
fn encode_part(
    manifest: &Manifest,
    ids: &[String],
    dim: usize,
    values: &[f32],
) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    match manifest.format {
        Format::Jsonl => Ok(jsonl_part(ids, dim, values)),
        Format::Parquet => parquet_part(manifest, ids, dim, values),
    }
}

fn errors_file(errors: &[RowError]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in errors {
        serde_json::to_writer(&mut out, e).expect("errors serialize");
        out.push(b'\n');
    }
    out
}

/// Batch ids of the part names in `names`.
fn completed<'a>(names: impl Iterator<Item = &'a str>, format: Format) -> HashSet<u64> {
    let suffix = format!(".{}", format.extension());
    names
        .filter_map(|name| {
            name.strip_prefix("batch-")
                .and_then(|s| s.strip_suffix(suffix.as_str()))
                .and_then(|s| s.parse::<u64>().ok())
        })
        .collect()
}

fn part_name(batch_id: u64, format: Format) -> String {
    format!("batch-{batch_id:08}.{}", format.extension())
}

fn parquet_part(
    manifest: &Manifest,
    ids: &[String],
    dim: usize,
    values: &[f32],
) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

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
    )?;
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(ids)) as ArrayRef,
            Arc::new(embeddings) as ArrayRef,
        ],
    )?;
    let props = WriterProperties::builder()
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

/// A job's output: an object store (a local folder is one) and a prefix
/// in it.
#[derive(Debug)]
pub struct Sink {
    store: Box<dyn object_store::ObjectStore>,
    prefix: object_store::path::Path,
    url: String,
    manifest: Manifest,
}

/// A local folder as an object store: puts go to a staged file, fsync,
/// rename. Staged files a killed run left behind (`NAME#N`, invisible to
/// listings) are removed first.
fn local_store(root: &Path) -> Result<Box<dyn object_store::ObjectStore>, SinkError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SinkError::Io { path, source }
    };
    let parts = root.join("parts");
    std::fs::create_dir_all(&parts).map_err(io(&parts))?;
    for entry in std::fs::read_dir(&parts).map_err(io(&parts))? {
        let path = entry.map_err(io(&parts))?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains('#'))
        {
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    let store = object_store::local::LocalFileSystem::new_with_prefix(root)
        .map_err(|e| SinkError::Io {
            path: root.to_path_buf(),
            source: std::io::Error::other(e),
        })?
        .with_fsync(true);
    Ok(Box::new(store))
}

/// An object store URL: `object_store` parses it and reads its settings
/// (`AWS_*`) from the environment.
fn url_store(
    url: &str,
) -> Result<(Box<dyn object_store::ObjectStore>, object_store::path::Path), SinkError> {
    let bad = |reason: String| SinkError::Url {
        url: url.to_owned(),
        reason,
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let options: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    object_store::parse_url_opts(&parsed, options).map_err(|e| bad(e.to_string()))
}

impl Sink {
    /// Opens `output` for the job described by `manifest`: a URL
    /// (`scheme://…`) names an object store, anything else a local folder.
    /// Returns the ids of the batches already completed there.
    pub async fn open(
        output: &Path,
        manifest: &Manifest,
    ) -> Result<(Self, HashSet<u64>), SinkError> {
        use object_store::ObjectStoreExt;

        let (store, prefix) = match output.to_str().filter(|s| s.contains("://")) {
            Some(url) => url_store(url)?,
            None => (local_store(output)?, object_store::path::Path::default()),
        };
        let sink = Self {
            store,
            prefix,
            url: output.to_string_lossy().trim_end_matches('/').to_owned(),
            manifest: manifest.clone(),
        };
        let at = sink.prefix.clone().join("manifest.json");
        match sink.store.get(&at).await {
            Ok(found) => {
                let bytes = found.bytes().await.map_err(|e| sink.fail(&at, e))?;
                let found: Manifest =
                    serde_json::from_slice(&bytes).map_err(|source| SinkError::Manifest {
                        path: PathBuf::from(sink.location(&at)),
                        source,
                    })?;
                if found != *manifest {
                    return Err(SinkError::OtherJob {
                        found: Box::new(found),
                        expected: Box::new(manifest.clone()),
                    });
                }
            }
            Err(object_store::Error::NotFound { .. }) => {
                let json = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
                sink.store
                    .put(&at, json.into())
                    .await
                    .map_err(|e| sink.fail(&at, e))?;
            }
            Err(e) => return Err(sink.fail(&at, e)),
        }
        let parts = sink.prefix.clone().join("parts");
        let listed = sink
            .store
            .list_with_delimiter(Some(&parts))
            .await
            .map_err(|e| sink.fail(&parts, e))?;
        let done = completed(
            listed.objects.iter().filter_map(|o| o.location.filename()),
            manifest.format,
        );
        Ok((sink, done))
    }

    fn location(&self, path: &object_store::path::Path) -> String {
        format!("{} ({path})", self.url)
    }

    fn fail(&self, path: &object_store::path::Path, source: object_store::Error) -> SinkError {
        SinkError::Store {
            location: self.location(path),
            source,
        }
    }

    /// Writes a completed batch with one put.
    pub async fn write_batch(
        &self,
        batch_id: u64,
        ids: &[String],
        dim: usize,
        values: &[f32],
    ) -> Result<(), SinkError> {
        use object_store::ObjectStoreExt;
        let at = self
            .prefix
            .clone()
            .join("parts")
            .join(part_name(batch_id, self.manifest.format));
        let bytes =
            encode_part(&self.manifest, ids, dim, values).map_err(|source| SinkError::Encode {
                location: self.location(&at),
                source,
            })?;
        self.store
            .put(&at, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| self.fail(&at, e))
    }

    /// Replaces the errors object.
    pub async fn write_errors(&self, errors: &[RowError]) -> Result<(), SinkError> {
        use object_store::ObjectStoreExt;
        let at = self.prefix.clone().join("errors.jsonl");
        self.store
            .put(&at, errors_file(errors).into())
            .await
            .map(|_| ())
            .map_err(|e| self.fail(&at, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(job: &str) -> Manifest {
        Manifest {
            job_id: job.into(),
            model_revision: "sha256:00".into(),
            dim: 2,
            batch_size: 2,
            format: Format::Jsonl,
        }
    }

    /// A manifest from before parts had a format describes JSON-lines
    /// output and resumes as such; one that is not a manifest is refused
    /// with the parser's reason.
    #[tokio::test]
    async fn manifests_without_a_format_are_jsonl_and_bad_ones_say_why() {
        let dir = std::env::temp_dir().join(format!("flotilla-sink-old-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let old = r#"{"job_id":"j","model_revision":"sha256:00","dim":2,"batch_size":2}"#;
        std::fs::write(dir.join("manifest.json"), old).unwrap();
        Sink::open(&dir, &manifest("j")).await.unwrap();

        std::fs::write(dir.join("manifest.json"), r#"{"job_id": 3}"#).unwrap();
        let err = Sink::open(&dir, &manifest("j")).await.unwrap_err();
        assert!(matches!(err, SinkError::Manifest { .. }), "{err}");
        assert!(err.to_string().contains("invalid type"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The object-store path: a real local-filesystem store reached by a
    /// `file://` URL. Parts land under the prefix, a reopened sink finds
    /// them, and another job is refused.
    #[tokio::test]
    async fn object_store_output_resumes_and_refuses_another_job() {
        let dir = std::env::temp_dir().join(format!("flotilla-sink-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("file://{}/out", dir.display());
        let out = PathBuf::from(&url);
        let (sink, done) = Sink::open(&out, &manifest("j")).await.unwrap();
        assert!(done.is_empty());
        let ids = vec!["a".to_owned(), "b".to_owned()];
        sink.write_batch(7, &ids, 2, &[1.0, 0.0, 0.0, 1.0])
            .await
            .unwrap();
        sink.write_errors(&[]).await.unwrap();
        let part = std::fs::read_to_string(dir.join("out/parts/batch-00000007.jsonl")).unwrap();
        assert_eq!(part.lines().count(), 2);
        assert!(
            part.starts_with("{\"id\":\"a\",\"embedding\":[1.0,0.0]}"),
            "{part}"
        );

        let (_, done) = Sink::open(&out, &manifest("j")).await.unwrap();
        assert_eq!(done, HashSet::from([7]));
        let err = Sink::open(&out, &manifest("other")).await.unwrap_err();
        assert!(matches!(err, SinkError::OtherJob { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A local folder: a staged file left by a killed run is removed and
    /// does not count as a part; a written part does.
    #[tokio::test]
    async fn local_output_drops_staged_leftovers_and_resumes() {
        let dir = std::env::temp_dir().join(format!("flotilla-sink-local-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("parts")).unwrap();
        let leftover = dir.join("parts/batch-00000003.jsonl#1");
        std::fs::write(&leftover, "half a part").unwrap();
        let (sink, done) = Sink::open(&dir, &manifest("j")).await.unwrap();
        assert!(done.is_empty());
        assert!(!leftover.exists());
        let ids = vec!["a".to_owned()];
        sink.write_batch(3, &ids, 2, &[0.6, 0.8]).await.unwrap();
        let (_, done) = Sink::open(&dir, &manifest("j")).await.unwrap();
        assert_eq!(done, HashSet::from([3]));
        let names: Vec<String> = std::fs::read_dir(dir.join("parts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["batch-00000003.jsonl"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_unknown_scheme_is_a_typed_error() {
        let err = Sink::open(Path::new("nosuch://bucket/x"), &manifest("j"))
            .await
            .unwrap_err();
        assert!(matches!(err, SinkError::Url { .. }), "{err}");
    }
}
