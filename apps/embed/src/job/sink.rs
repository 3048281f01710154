//! Idempotent output in a local folder.
//!
//! ```text
//! OUT/manifest.json             job id, model revision, dim, batch size (written first)
//! OUT/parts/batch-00000042.jsonl  one per completed batch: {"id": …, "embedding": [f32; dim]}
//! OUT/errors.jsonl              rejected rows: {"line": …, "id": …, "reason": …}
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
    /// The folder holds another job's output.
    #[error(
        "output folder holds job {found:?} (model {found_revision}), not {expected:?}; use another folder or --job-id"
    )]
    OtherJob {
        /// The job id found.
        found: String,
        /// Its model revision.
        found_revision: String,
        /// This job's id.
        expected: String,
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
                        found: found.job_id,
                        found_revision: found.model_revision,
                        expected: manifest.job_id.clone(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let json = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
                put(&path, &json)?;
            }
            Err(e) => return Err(io(&path)(e)),
        }
        let mut done = HashSet::new();
        for entry in std::fs::read_dir(&parts).map_err(io(&parts))? {
            let name = entry.map_err(io(&parts))?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name
                .strip_prefix("batch-")
                .and_then(|s| s.strip_suffix(".jsonl"))
                .and_then(|s| s.parse::<u64>().ok())
            {
                done.insert(id);
            }
        }
        Ok((
            Self {
                root: root.to_path_buf(),
            },
            done,
        ))
    }

    /// Path of a batch's part.
    pub fn part_path(&self, batch_id: u64) -> PathBuf {
        self.root
            .join("parts")
            .join(format!("batch-{batch_id:08}.jsonl"))
    }

    /// Writes a completed batch: `ids[i]` gets `values[i*dim..(i+1)*dim]`.
    pub fn write_batch(
        &self,
        batch_id: u64,
        ids: &[String],
        dim: usize,
        values: &[f32],
    ) -> Result<(), SinkError> {
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
        put(&self.part_path(batch_id), &out)
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
