//! A batch job's output, exactly once: a local folder (the default), or
//! any object store `object_store` reaches by URL (`s3://bucket/prefix`,
//! `file:///path`, `memory:///`), with the same layout.
//!
//! ```text
//! OUT/manifest.json             what the job is (the application's manifest, written first)
//! OUT/parts/batch-00000042.EXT  one part per completed batch, encoded by the application
//! OUT/parts/batch-00000042-rows-0-128.EXT
//!                               a piece of a batch split to isolate rows that fail it:
//!                               its rows 0 to 127, in the batch's order
//! OUT/errors.jsonl              rows not processed: {"shard": …, "line": …, "id": …, "reason": …}
//! ```
//!
//! A part is written with one atomic put (locally: a staged file, fsync,
//! rename), so it exists whole or not at all; writing the same batch again
//! replaces it with the same content. The parts present are the completed
//! batches a resumed job skips, and the pieces present the rows of a
//! split batch it skips. An output that holds another job's manifest is
//! refused, naming both.
//!
//! Object stores are configured from the environment as `object_store`
//! reads it: for S3, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT` (an S3-compatible server) and the other
//! `AWS_*` settings.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla_proto::job_stats::{ERROR_LINE_SHOWN, ERRORS_SHOWN, clip};
use object_store::ObjectStoreExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why the output cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// Reading or writing a local folder failed.
    #[error("output {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The output holds another job's output.
    #[error("output folder holds {found}; this run is {expected}; use another folder")]
    OtherJob {
        /// The job found there, as its manifest describes itself.
        found: String,
        /// This run's job.
        expected: String,
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
        source: Box<dyn std::error::Error + Send + Sync>,
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

/// A row that was not processed, as written to the errors file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowError {
    /// The input shard it is in (its name relative to the input).
    pub shard: String,
    /// 1-based line (JSONL) or row (Parquet) in the shard.
    pub line: u64,
    /// The row's id, when known.
    pub id: Option<String>,
    /// Why.
    pub reason: String,
}

/// Errors held before the errors file becomes a multipart upload.
const ERRORS_BUFFER: usize = 1 << 20;

/// The errors file, written as rows are refused: held in memory up to
/// a megabyte, then streamed as a multipart upload, so memory
/// stays bounded however many rows are refused. The file appears whole
/// when [`ErrorLog::finish`] completes it.
pub struct ErrorLog<'a> {
    output: &'a Output,
    at: object_store::path::Path,
    buffer: Vec<u8>,
    upload: Option<object_store::WriteMultipart>,
    rows: u64,
    /// The last lines recorded, cut, for the job's account.
    tail: std::collections::VecDeque<String>,
}

impl ErrorLog<'_> {
    /// Adds one refused row.
    pub async fn record(&mut self, error: &RowError) -> Result<(), OutputError> {
        let from = self.buffer.len();
        serde_json::to_writer(&mut self.buffer, error).expect("errors serialize");
        let line = String::from_utf8_lossy(&self.buffer[from..]);
        if self.tail.len() == ERRORS_SHOWN {
            self.tail.pop_front();
        }
        self.tail
            .push_back(clip(&line, ERROR_LINE_SHOWN).to_owned());
        self.buffer.push(b'\n');
        self.rows += 1;
        if self.buffer.len() >= ERRORS_BUFFER {
            if self.upload.is_none() {
                let upload = self
                    .output
                    .store
                    .put_multipart(&self.at)
                    .await
                    .map_err(|e| self.output.fail(&self.at, e))?;
                self.upload = Some(object_store::WriteMultipart::new(upload));
            }
            let upload = self.upload.as_mut().expect("started above");
            upload
                .wait_for_capacity(2)
                .await
                .map_err(|e| self.output.fail(&self.at, e))?;
            upload.write(&self.buffer);
            self.buffer.clear();
        }
        Ok(())
    }

    /// Rows recorded so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The last lines recorded (at most [`ERRORS_SHOWN`], each cut to
    /// [`ERROR_LINE_SHOWN`] bytes), oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    /// Completes the errors file (replacing any earlier one).
    pub async fn finish(self) -> Result<(), OutputError> {
        let result = match self.upload {
            None => self
                .output
                .store
                .put(&self.at, self.buffer.into())
                .await
                .map(|_| ()),
            Some(mut upload) => {
                upload.write(&self.buffer);
                upload.finish().await.map(|_| ())
            }
        };
        result.map_err(|e| self.output.fail(&self.at, e))
    }
}

/// A job's output: an object store (a local folder is one) and a prefix
/// in it, holding parts of one extension.
#[derive(Debug)]
pub struct Output {
    store: Arc<dyn object_store::ObjectStore>,
    prefix: object_store::path::Path,
    url: String,
    extension: &'static str,
    /// The pieces found written when it was opened: per batch, the row
    /// ranges written, in order.
    pieces: BTreeMap<u64, Vec<Range<usize>>>,
}

/// The folder under an output's root that holds its parts.
const PARTS: &str = "parts";

/// The local folders an output rooted at `root` writes into: the root
/// (its manifest) and its parts folder. A roots check resolves the links
/// of each, since either may be a link made before the job ran.
pub fn written_folders(root: &Path) -> [PathBuf; 2] {
    [root.to_path_buf(), root.join(PARTS)]
}

/// A local folder as an object store: puts go to a staged file, fsync,
/// rename. Staged files a killed run left behind (`NAME#N`, invisible to
/// listings) are removed first.
fn local_store(root: &Path) -> Result<Arc<dyn object_store::ObjectStore>, OutputError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OutputError::Io { path, source }
    };
    let folders = written_folders(root);
    let [_, parts] = &folders;
    std::fs::create_dir_all(parts).map_err(io(parts))?;
    for dir in &folders {
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            if path.is_file()
                && path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().contains('#'))
            {
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
    }
    let store = object_store::local::LocalFileSystem::new_with_prefix(root)
        .map_err(|e| OutputError::Io {
            path: root.to_path_buf(),
            source: std::io::Error::other(e),
        })?
        .with_fsync(true);
    Ok(Arc::new(store))
}

/// What the part names in `names` with `extension` hold: the ids of
/// whole batches, and per split batch the row ranges of its pieces
/// (sorted).
fn completed<'a>(
    names: impl Iterator<Item = &'a str>,
    extension: &str,
) -> (HashSet<u64>, BTreeMap<u64, Vec<Range<usize>>>) {
    let suffix = format!(".{extension}");
    let mut whole = HashSet::new();
    let mut pieces: BTreeMap<u64, Vec<Range<usize>>> = BTreeMap::new();
    for stem in names.filter_map(|name| {
        name.strip_prefix("batch-")
            .and_then(|s| s.strip_suffix(suffix.as_str()))
    }) {
        match stem.split_once("-rows-") {
            None => {
                if let Ok(id) = stem.parse::<u64>() {
                    whole.insert(id);
                }
            }
            Some((id, rows)) => {
                let parsed =
                    id.parse::<u64>()
                        .ok()
                        .zip(rows.split_once('-').and_then(|(start, end)| {
                            Some(start.parse::<usize>().ok()?..end.parse::<usize>().ok()?)
                        }));
                if let Some((id, rows)) = parsed
                    && rows.start < rows.end
                {
                    pieces.entry(id).or_default().push(rows);
                }
            }
        }
    }
    for ranges in pieces.values_mut() {
        ranges.sort_by_key(|r| r.start);
    }
    (whole, pieces)
}

impl Output {
    /// Opens `output` for the job `manifest` describes, its parts ending in
    /// `.extension`: a URL (`scheme://…`) names an object store, anything
    /// else a local folder. Writes the manifest where there is none;
    /// refuses an output whose manifest is another job's. Returns the ids
    /// of the batches already completed there.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla_data::{Output, RowError};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, PartialEq)]
    /// struct Manifest {
    ///     job: String,
    /// }
    /// impl std::fmt::Display for Manifest {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         write!(f, "job {}", self.job)
    ///     }
    /// }
    ///
    /// let dir = std::env::temp_dir().join(format!("flotilla-output-doc-{}", std::process::id()));
    /// let out = dir.to_str().unwrap();
    /// let ours = Manifest { job: "a".into() };
    /// let (output, done) = Output::open(out, &ours, "jsonl").await?;
    /// assert!(done.is_empty());
    /// output.write_part(42, b"{\"id\": \"1\"}\n".to_vec()).await?;
    /// assert!(output.part_location(42).ends_with("parts/batch-00000042.jsonl)"));
    /// let mut errors = output.errors();
    /// let refused = RowError { shard: "in.jsonl".into(), line: 2, id: None, reason: "not JSON".into() };
    /// errors.record(&refused).await?;
    /// assert_eq!(errors.rows(), 1);
    /// errors.finish().await?;
    /// // Opened again for the same job: batch 42 is done. Another job's is refused.
    /// let (_, done) = Output::open(out, &ours, "jsonl").await?;
    /// assert!(done.contains(&42));
    /// assert!(Output::open(out, &Manifest { job: "b".into() }, "jsonl").await.is_err());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub async fn open<M>(
        output: &str,
        manifest: &M,
        extension: &'static str,
    ) -> Result<(Self, HashSet<u64>), OutputError>
    where
        M: Serialize + DeserializeOwned + PartialEq + std::fmt::Display,
    {
        let (store, prefix) = if flotilla::object_url::is_url(output) {
            flotilla::object_url::open_url(output).map_err(|reason| OutputError::Url {
                url: output.to_owned(),
                reason,
            })?
        } else {
            (
                local_store(Path::new(output))?,
                object_store::path::Path::default(),
            )
        };
        let this = Self {
            store,
            prefix,
            url: output.trim_end_matches('/').to_owned(),
            extension,
            pieces: BTreeMap::new(),
        };
        let at = this.prefix.clone().join("manifest.json");
        match this.store.get(&at).await {
            Ok(found) => {
                let bytes = found.bytes().await.map_err(|e| this.fail(&at, e))?;
                let found: M =
                    serde_json::from_slice(&bytes).map_err(|source| OutputError::Manifest {
                        path: PathBuf::from(this.location(&at)),
                        source,
                    })?;
                if found != *manifest {
                    return Err(OutputError::OtherJob {
                        found: found.to_string(),
                        expected: manifest.to_string(),
                    });
                }
            }
            Err(object_store::Error::NotFound { .. }) => {
                let json = serde_json::to_vec_pretty(manifest).map_err(|source| {
                    OutputError::Manifest {
                        path: PathBuf::from(this.location(&at)),
                        source,
                    }
                })?;
                this.store
                    .put(&at, json.into())
                    .await
                    .map_err(|e| this.fail(&at, e))?;
            }
            Err(e) => return Err(this.fail(&at, e)),
        }
        let parts = this.prefix.clone().join(PARTS);
        let listed = this
            .store
            .list_with_delimiter(Some(&parts))
            .await
            .map_err(|e| this.fail(&parts, e))?;
        let (done, pieces) = completed(
            listed.objects.iter().filter_map(|o| o.location.filename()),
            extension,
        );
        Ok((Self { pieces, ..this }, done))
    }

    fn part(&self, batch_id: u64) -> object_store::path::Path {
        self.prefix
            .clone()
            .join(PARTS)
            .join(format!("batch-{batch_id:08}.{}", self.extension))
    }

    fn location(&self, path: &object_store::path::Path) -> String {
        format!("{} ({path})", self.url)
    }

    fn fail(&self, path: &object_store::path::Path, source: object_store::Error) -> OutputError {
        OutputError::Store {
            location: self.location(path),
            source,
        }
    }

    /// Where the part of `batch_id` goes, for messages.
    pub fn part_location(&self, batch_id: u64) -> String {
        self.location(&self.part(batch_id))
    }

    fn piece(&self, batch_id: u64, rows: &Range<usize>) -> object_store::path::Path {
        self.prefix.clone().join(PARTS).join(format!(
            "batch-{batch_id:08}-rows-{}-{}.{}",
            rows.start, rows.end, self.extension
        ))
    }

    /// The row ranges of batch `batch_id` found written as pieces when
    /// the output was opened (sorted; empty for a batch never split).
    pub fn pieces_of(&self, batch_id: u64) -> &[Range<usize>] {
        self.pieces.get(&batch_id).map_or(&[], Vec::as_slice)
    }

    /// Writes a piece of batch `batch_id`, its rows `rows` (in the batch's
    /// order), with one put: a batch split to isolate the rows that fail
    /// it is written as the pieces that succeed.
    pub async fn write_piece(
        &self,
        batch_id: u64,
        rows: &Range<usize>,
        bytes: Vec<u8>,
    ) -> Result<(), OutputError> {
        let at = self.piece(batch_id, rows);
        self.store
            .put(&at, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| self.fail(&at, e))
    }

    /// Writes the part of a completed batch with one put.
    pub async fn write_part(&self, batch_id: u64, bytes: Vec<u8>) -> Result<(), OutputError> {
        let at = self.part(batch_id);
        self.store
            .put(&at, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| self.fail(&at, e))
    }

    /// Starts this run's errors file.
    pub fn errors(&self) -> ErrorLog<'_> {
        ErrorLog {
            output: self,
            at: self.prefix.clone().join("errors.jsonl"),
            buffer: Vec::new(),
            upload: None,
            rows: 0,
            tail: std::collections::VecDeque::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Job {
        id: String,
        width: u32,
    }

    impl std::fmt::Display for Job {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "job {} (width {})", self.id, self.width)
        }
    }

    fn job(id: &str) -> Job {
        Job {
            id: id.into(),
            width: 3,
        }
    }

    /// Parts written are the batches a reopened output reports done (parts
    /// of another extension, and files that are not parts, are not); a
    /// manifest of another job is refused naming both.
    #[tokio::test]
    async fn parts_written_are_done_when_reopened_and_another_job_is_refused() {
        let dir = std::env::temp_dir().join(format!("flotilla-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.to_string_lossy().into_owned();
        let (output, done) = Output::open(&out, &job("a"), "bin").await.unwrap();
        assert!(done.is_empty());
        output.write_part(3, b"three".to_vec()).await.unwrap();
        output.write_part(12, b"twelve".to_vec()).await.unwrap();
        std::fs::write(dir.join("parts/batch-00000007.txt"), b"x").unwrap();
        std::fs::write(dir.join("parts/notes"), b"x").unwrap();
        std::fs::write(dir.join("parts/batch-00000009.bin#1"), b"staged").unwrap();
        let (_, done) = Output::open(&out, &job("a"), "bin").await.unwrap();
        assert_eq!(done, HashSet::from([3, 12]));
        assert!(
            !dir.join("parts/batch-00000009.bin#1").exists(),
            "staged leftovers removed"
        );
        assert_eq!(
            std::fs::read(dir.join("parts/batch-00000012.bin")).unwrap(),
            b"twelve"
        );
        let err = Output::open(&out, &job("b"), "bin").await.unwrap_err();
        assert!(
            matches!(&err, OutputError::OtherJob { found, expected }
                if found == "job a (width 3)" && expected == "job b (width 3)"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pieces of split batches are found again by batch, their row ranges
    /// sorted, apart from the whole batches; names that only look like
    /// pieces are not pieces.
    #[tokio::test]
    #[allow(
        clippy::single_range_in_vec_init,
        reason = "lists of row ranges, not ranges to collect"
    )]
    async fn pieces_written_are_found_again_by_batch() {
        let dir =
            std::env::temp_dir().join(format!("flotilla-output-pieces-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.to_string_lossy().into_owned();
        let (output, _) = Output::open(&out, &job("a"), "bin").await.unwrap();
        assert!(output.pieces_of(4).is_empty());
        output
            .write_piece(4, &(64..128), b"b".to_vec())
            .await
            .unwrap();
        output
            .write_piece(4, &(0..32), b"a".to_vec())
            .await
            .unwrap();
        output.write_piece(5, &(1..2), b"c".to_vec()).await.unwrap();
        output.write_part(6, b"d".to_vec()).await.unwrap();
        for junk in [
            "batch-00000007-rows-3-3.bin",
            "batch-00000007-rows-x-4.bin",
            "batch-00000007-rows-4.bin",
        ] {
            std::fs::write(dir.join("parts").join(junk), b"x").unwrap();
        }
        let (reopened, done) = Output::open(&out, &job("a"), "bin").await.unwrap();
        assert_eq!(done, HashSet::from([6]));
        assert_eq!(reopened.pieces_of(4), [0..32, 64..128]);
        assert_eq!(reopened.pieces_of(5), [1..2]);
        assert!(reopened.pieces_of(7).is_empty());
        assert_eq!(
            std::fs::read(dir.join("parts/batch-00000004-rows-64-128.bin")).unwrap(),
            b"b"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An object-store URL (`file://`, a real local store) holds the same
    /// layout: parts under its prefix and the errors file, found again by
    /// a reopened output; another job is refused there too.
    #[tokio::test]
    async fn an_object_store_url_holds_the_same_layout_and_resumes() {
        let dir = std::env::temp_dir().join(format!("flotilla-output-url-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("file://{}/out", dir.display());
        let (output, done) = Output::open(&url, &job("a"), "bin").await.unwrap();
        assert!(done.is_empty());
        output.write_part(7, b"seven".to_vec()).await.unwrap();
        output.errors().finish().await.unwrap();
        let part = std::fs::read(dir.join("out/parts/batch-00000007.bin")).unwrap();
        assert_eq!(part, b"seven");
        assert_eq!(std::fs::read(dir.join("out/errors.jsonl")).unwrap(), b"");
        let (_, done) = Output::open(&url, &job("a"), "bin").await.unwrap();
        assert_eq!(done, HashSet::from([7]));
        let err = Output::open(&url, &job("b"), "bin").await.unwrap_err();
        assert!(matches!(err, OutputError::OtherJob { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A local folder: staged files a killed run left (a part's, the errors
    /// file's) are removed and do not count as parts; a written part does.
    #[tokio::test]
    async fn a_local_folder_drops_staged_leftovers_and_resumes() {
        let dir =
            std::env::temp_dir().join(format!("flotilla-output-staged-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("parts")).unwrap();
        let out = dir.to_string_lossy().into_owned();
        let leftover = dir.join("parts/batch-00000003.bin#1");
        std::fs::write(&leftover, "half a part").unwrap();
        let errors_leftover = dir.join("errors.jsonl#2");
        std::fs::write(&errors_leftover, "half an errors file").unwrap();
        let (output, done) = Output::open(&out, &job("a"), "bin").await.unwrap();
        assert!(done.is_empty());
        assert!(!leftover.exists() && !errors_leftover.exists());
        output.write_part(3, b"three".to_vec()).await.unwrap();
        let (_, done) = Output::open(&out, &job("a"), "bin").await.unwrap();
        assert_eq!(done, HashSet::from([3]));
        let names: Vec<String> = std::fs::read_dir(dir.join("parts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["batch-00000003.bin"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_unknown_scheme_is_a_typed_error() {
        let err = Output::open("nosuch://bucket/x", &job("a"), "bin")
            .await
            .unwrap_err();
        assert!(matches!(err, OutputError::Url { .. }), "{err}");
    }

    /// More refused rows than the in-memory buffer holds stream out as a
    /// multipart upload; every row arrives, in order.
    #[tokio::test]
    async fn many_errors_stream_out_in_order() {
        let dir =
            std::env::temp_dir().join(format!("flotilla-output-errors-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.to_string_lossy().into_owned();
        let (output, _) = Output::open(&out, &job("a"), "bin").await.unwrap();
        let mut log = output.errors();
        let n = 30_000u64;
        for line in 1..=n {
            log.record(&RowError {
                shard: "a.jsonl".into(),
                line,
                id: Some(format!("id-{line}")),
                reason: "a reason long enough to pass the buffer".into(),
            })
            .await
            .unwrap();
        }
        assert_eq!(log.rows(), n);
        assert!(log.upload.is_some(), "streamed, not held");
        log.finish().await.unwrap();
        let text = std::fs::read_to_string(dir.join("errors.jsonl")).unwrap();
        let lines: Vec<RowError> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64, n);
        assert!(
            lines
                .iter()
                .enumerate()
                .all(|(i, e)| e.line == i as u64 + 1)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
