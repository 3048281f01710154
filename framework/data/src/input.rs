//! Where a job's rows come from: one file, a folder, or a glob of JSONL or
//! Parquet shards, on local disk or behind an object store URL.
//!
//! ```text
//! corpus.jsonl                     one shard
//! corpus/                          every shard under the folder, recursively
//! 'corpus/part-*.jsonl.gz'         the shards the glob matches
//! s3://bucket/corpus/              the same, through object_store
//! 's3://bucket/corpus/*.parquet'
//! ```
//!
//! Shards are read in the byte order of their names (relative to the
//! folder or to the glob's literal prefix), so batch ids are the same on
//! every run over the same shards. In a folder or a glob, names starting
//! with `.` or `_` (`_SUCCESS`, `.crc` files) and files of other types are
//! skipped. JSONL shards may be compressed (`.jsonl.gz`, `.jsonl.zst`);
//! JSONL and Parquet shards in one input are an error.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla_proto::roots::{AllowedRoots, NotAllowed};
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

/// How a shard's rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardFormat {
    /// One JSON object per line.
    Jsonl,
    /// Apache Parquet.
    Parquet,
}

/// How a JSONL shard's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain text.
    None,
    /// gzip (`.gz`).
    Gzip,
    /// Zstandard (`.zst`).
    Zstd,
}

/// Where a shard's bytes are.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Place {
    /// A local file.
    Local(PathBuf),
    /// An object in the input's store.
    Stored(object_store::path::Path),
}

/// One file of the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// The name errors report: relative to the input's folder or glob
    /// prefix, or the file name of a single-file input.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Row format.
    pub format: ShardFormat,
    /// Compression of a JSONL shard.
    pub compression: Compression,
    pub(crate) place: Place,
    /// The store's version tag (ETag, else last-modified) of a stored shard.
    version: Option<String>,
}

/// A resolved input: its shards in reading order.
#[derive(Debug, Clone)]
pub struct Input {
    /// What the user named.
    pub spec: String,
    /// The shards, in the order their rows are read.
    pub shards: Vec<Shard>,
    /// The format every shard shares.
    pub format: ShardFormat,
    /// The store of stored shards.
    pub(crate) store: Option<Arc<dyn ObjectStore>>,
}

/// Why an input cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Nothing exists at the path or URL.
    #[error("input {spec}: no such file, folder or object")]
    NotFound {
        /// What the user named.
        spec: String,
    },
    /// The folder or glob holds no JSONL or Parquet shard.
    #[error(
        "input {spec}: no JSONL (.jsonl, .jsonl.gz, .jsonl.zst) or Parquet (.parquet) files found"
    )]
    Empty {
        /// What the user named.
        spec: String,
    },
    /// JSONL and Parquet shards in one input.
    #[error(
        "input {spec}: mixes JSONL ({jsonl}) and Parquet ({parquet}) shards; point --input at one kind"
    )]
    Mixed {
        /// What the user named.
        spec: String,
        /// A JSONL shard.
        jsonl: String,
        /// A Parquet shard.
        parquet: String,
    },
    /// The glob is not a pattern.
    #[error("input {spec}: invalid glob: {reason}")]
    Pattern {
        /// What the user named.
        spec: String,
        /// Why.
        reason: String,
    },
    /// The URL is not one `object_store` knows.
    #[error("input {spec}: {reason}")]
    Url {
        /// What the user named.
        spec: String,
        /// Why.
        reason: String,
    },
    /// A local file or folder could not be read.
    #[error("input {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The object store failed.
    #[error("input {spec}: {source}")]
    Store {
        /// What the user named.
        spec: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A shard that is a link (or lies under one) leading out of the
    /// roots the input must stay under.
    #[error("input {spec}: shard {shard} leads out of the allowed roots: {source}")]
    Outside {
        /// What the user named.
        spec: String,
        /// The shard, as listed.
        shard: String,
        /// Where it leads, and the roots.
        source: Box<NotAllowed>,
    },
    /// A folder link that leads to a folder already walked: a cycle, or
    /// one folder reached twice (its rows would be read twice).
    #[error(
        "input {spec}: {path} leads to {target}, a folder already walked (a cycle of folder links, or one folder reached twice)"
    )]
    LinkCycle {
        /// What the user named.
        spec: String,
        /// The link.
        path: PathBuf,
        /// The folder it leads to.
        target: PathBuf,
    },
}

/// Format and compression of a file called `name`, if it is a shard.
fn classify(name: &str) -> Option<(ShardFormat, Compression)> {
    let lower = name.to_ascii_lowercase();
    let (stem, compression) = if let Some(s) = lower.strip_suffix(".gz") {
        (s, Compression::Gzip)
    } else if let Some(s) = lower
        .strip_suffix(".zst")
        .or_else(|| lower.strip_suffix(".zstd"))
    {
        (s, Compression::Zstd)
    } else {
        (lower.as_str(), Compression::None)
    };
    if stem.ends_with(".parquet") || stem.ends_with(".pq") {
        (compression == Compression::None).then_some((ShardFormat::Parquet, compression))
    } else if stem.ends_with(".jsonl") || stem.ends_with(".ndjson") || stem.ends_with(".json") {
        Some((ShardFormat::Jsonl, compression))
    } else {
        None
    }
}

/// Whether a path relative to the input root is hidden (a component
/// starting with `.` or `_`).
fn hidden(relative: &str) -> bool {
    relative
        .split('/')
        .any(|c| c.starts_with('.') || c.starts_with('_'))
}

/// The part of a glob before its first component with a wildcard, and
/// the rest. `None` when `spec` has no wildcard.
fn split_glob(spec: &str) -> Option<(&str, &str)> {
    let wild = spec.find(['*', '?', '['])?;
    let cut = spec[..wild].rfind('/').map_or(0, |i| i + 1);
    Some((&spec[..cut], &spec[cut..]))
}

fn glob_options() -> glob::MatchOptions {
    glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    }
}

impl Input {
    /// Resolves `spec` (a path, a folder, a glob, or any of them as an
    /// object store URL) into its shards.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla_data::Input;
    /// let dir = std::env::temp_dir().join(format!("flotilla-resolve-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// std::fs::write(dir.join("b.jsonl"), "{\"id\": \"2\", \"text\": \"two\"}\n")?;
    /// std::fs::write(dir.join("a.jsonl"), "{\"id\": \"1\", \"text\": \"one\"}\n")?;
    /// std::fs::write(dir.join("_SUCCESS"), "")?;
    /// let input = Input::resolve(dir.to_str().unwrap()).await?;
    /// let names: Vec<&str> = input.shards.iter().map(|s| s.name.as_str()).collect();
    /// assert_eq!(names, ["a.jsonl", "b.jsonl"], "in name order, markers skipped");
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub async fn resolve(spec: &str) -> Result<Self, InputError> {
        Self::resolve_within(spec, None).await
    }

    /// [`Input::resolve`], each local shard checked where it really is
    /// (links resolved) against `allow` when given: a shard inside an
    /// allowed folder that is a link out of the roots is refused, naming
    /// the shard. A folder link that leads back to a folder already walked
    /// is an error either way.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla_data::Input;
    /// use flotilla_proto::roots::AllowedRoots;
    /// let dir = std::env::temp_dir().join(format!("flotilla-within-doc-{}", std::process::id()));
    /// let (allowed, secret) = (dir.join("allowed"), dir.join("secret"));
    /// std::fs::create_dir_all(&allowed)?;
    /// std::fs::create_dir_all(&secret)?;
    /// std::fs::write(allowed.join("in.jsonl"), "{\"id\": \"1\", \"text\": \"one\"}\n")?;
    /// std::fs::write(secret.join("corpus.jsonl"), "{\"id\": \"s\", \"text\": \"secret\"}\n")?;
    /// let roots = AllowedRoots::new(&[format!("{}/", allowed.display())])?;
    /// let inside = allowed.join("in.jsonl");
    /// assert!(Input::resolve_within(inside.to_str().unwrap(), Some(&roots)).await.is_ok());
    /// // Spelled to climb out, or linked out: refused either way.
    /// let climbing = format!("{}/../secret/corpus.jsonl", allowed.display());
    /// assert!(Input::resolve_within(&climbing, Some(&roots)).await.is_err());
    /// std::os::unix::fs::symlink(secret.join("corpus.jsonl"), allowed.join("linked.jsonl"))?;
    /// let linked = allowed.join("linked.jsonl");
    /// assert!(Input::resolve_within(linked.to_str().unwrap(), Some(&roots)).await.is_err());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub async fn resolve_within(
        spec: &str,
        allow: Option<&AllowedRoots>,
    ) -> Result<Self, InputError> {
        let (shards, store) = if flotilla::object_url::is_url(spec) {
            let (shards, store) = Self::stored(spec).await?;
            (shards, Some(store))
        } else {
            (Self::local(spec)?, None)
        };
        if let Some(allow) = allow {
            let file = spec
                .split_once("://")
                .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("file"));
            for shard in &shards {
                let at = match &shard.place {
                    Place::Local(path) => path.clone(),
                    Place::Stored(location) if file => Path::new("/").join(location.as_ref()),
                    Place::Stored(_) => continue,
                };
                let real = std::fs::canonicalize(&at).map_err(|source| InputError::Io {
                    path: at.clone(),
                    source,
                })?;
                allow
                    .check_local("input", &real)
                    .map_err(|source| InputError::Outside {
                        spec: spec.to_owned(),
                        shard: shard.name.clone(),
                        source: Box::new(source),
                    })?;
            }
        }
        let Some(first) = shards.first() else {
            return Err(InputError::Empty {
                spec: spec.to_owned(),
            });
        };
        let format = first.format;
        if let Some(other) = shards.iter().find(|s| s.format != format) {
            let (jsonl, parquet) = match format {
                ShardFormat::Jsonl => (first, other),
                ShardFormat::Parquet => (other, first),
            };
            return Err(InputError::Mixed {
                spec: spec.to_owned(),
                jsonl: jsonl.name.clone(),
                parquet: parquet.name.clone(),
            });
        }
        Ok(Self {
            spec: spec.to_owned(),
            shards,
            format,
            store,
        })
    }

    /// Shards on local disk.
    fn local(spec: &str) -> Result<Vec<Shard>, InputError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| InputError::Io { path, source }
        };
        let shard = |path: PathBuf, name: String, explicit: bool| -> Result<_, InputError> {
            let found = classify(&name);
            let (format, compression) = match found {
                Some(f) => f,
                // A file named on its own is JSONL whatever its name.
                None if explicit => (ShardFormat::Jsonl, Compression::None),
                None => return Ok(None),
            };
            let size = std::fs::metadata(&path).map_err(io(&path))?.len();
            Ok(Some(Shard {
                name,
                size,
                format,
                compression,
                place: Place::Local(path),
                version: None,
            }))
        };
        let mut shards = Vec::new();
        if let Some((prefix, _)) = split_glob(spec) {
            let paths = glob::glob_with(spec, glob_options()).map_err(|e| InputError::Pattern {
                spec: spec.to_owned(),
                reason: e.to_string(),
            })?;
            for entry in paths {
                let path = entry.map_err(|e| InputError::Io {
                    path: e.path().to_path_buf(),
                    source: std::io::Error::new(e.error().kind(), e.error().to_string()),
                })?;
                if !path.is_file() {
                    continue;
                }
                let full = path.to_string_lossy().into_owned();
                let name = full.strip_prefix(prefix).unwrap_or(&full).to_owned();
                if hidden(&name) {
                    continue;
                }
                shards.extend(shard(path, name, false)?);
            }
        } else {
            let root = PathBuf::from(spec);
            let meta = std::fs::metadata(&root).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => InputError::NotFound {
                    spec: spec.to_owned(),
                },
                _ => InputError::Io {
                    path: root.clone(),
                    source: e,
                },
            })?;
            if meta.is_file() {
                let name = root
                    .file_name()
                    .map_or_else(|| spec.to_owned(), |n| n.to_string_lossy().into_owned());
                shards.extend(shard(root, name, true)?);
            } else {
                // Folders walked, by their real path: a folder link back to
                // one of them is a cycle, not a walk without end.
                let mut walked = std::collections::HashSet::new();
                walked.insert(std::fs::canonicalize(&root).map_err(io(&root))?);
                let mut stack = vec![root.clone()];
                while let Some(dir) = stack.pop() {
                    for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
                        let path = entry.map_err(io(&dir))?.path();
                        let relative = path
                            .strip_prefix(&root)
                            .unwrap_or(&path)
                            .to_string_lossy()
                            .into_owned();
                        if hidden(&relative) {
                            continue;
                        }
                        if path.is_dir() {
                            let real = std::fs::canonicalize(&path).map_err(io(&path))?;
                            if !walked.insert(real.clone()) {
                                return Err(InputError::LinkCycle {
                                    spec: spec.to_owned(),
                                    path,
                                    target: real,
                                });
                            }
                            stack.push(path);
                        } else {
                            shards.extend(shard(path, relative, false)?);
                        }
                    }
                }
            }
        }
        shards.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(shards)
    }

    /// Shards behind an object store URL.
    async fn stored(spec: &str) -> Result<(Vec<Shard>, Arc<dyn ObjectStore>), InputError> {
        use futures::TryStreamExt;

        let url_error = |reason: String| InputError::Url {
            spec: spec.to_owned(),
            reason,
        };
        let store_error = |source| InputError::Store {
            spec: spec.to_owned(),
            source,
        };
        let (base, pattern) = match split_glob(spec) {
            Some((prefix, rest)) => {
                let pattern = glob::Pattern::new(rest).map_err(|e| InputError::Pattern {
                    spec: spec.to_owned(),
                    reason: e.to_string(),
                })?;
                (prefix, Some(pattern))
            }
            None => (spec, None),
        };
        let (store, root) = flotilla::object_url::open_url(base).map_err(url_error)?;
        let shard = |meta: object_store::ObjectMeta, name: String, explicit: bool| {
            let (format, compression) = match classify(&name) {
                Some(f) => f,
                None if explicit => (ShardFormat::Jsonl, Compression::None),
                None => return None,
            };
            Some(Shard {
                name,
                size: meta.size,
                format,
                compression,
                version: meta
                    .e_tag
                    .clone()
                    .or_else(|| Some(meta.last_modified.to_rfc3339())),
                place: Place::Stored(meta.location),
            })
        };
        // A single object, when nothing lists under the path.
        if pattern.is_none() && !spec.ends_with('/') && root.filename().is_some() {
            match store.head(&root).await {
                Ok(meta) => {
                    let name = root.filename().unwrap_or_default().to_owned();
                    return Ok((shard(meta, name, true).into_iter().collect(), store));
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error(e)),
            }
        }
        let listed: Vec<object_store::ObjectMeta> = store
            .list(Some(&root))
            .try_collect()
            .await
            .map_err(store_error)?;
        if listed.is_empty() && pattern.is_none() {
            return Err(InputError::NotFound {
                spec: spec.to_owned(),
            });
        }
        let mut shards: Vec<Shard> = listed
            .into_iter()
            .filter_map(|meta| {
                let relative: Vec<String> = meta
                    .location
                    .prefix_match(&root)?
                    .map(|p| p.as_ref().to_owned())
                    .collect();
                let name = relative.join("/");
                if hidden(&name)
                    || pattern
                        .as_ref()
                        .is_some_and(|p| !p.matches_with(&name, glob_options()))
                {
                    return None;
                }
                shard(meta, name, false)
            })
            .collect();
        shards.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((shards, store))
    }

    /// The input `spec` names, resolved, and its [`Input::scan`] (on a
    /// thread where blocking reads are allowed). Give the input to the job
    /// ([`crate::BatchJob::resolved`]): it then reads exactly the shards
    /// whose fingerprint the scan took, resolved once.
    /// With `allow`, each local shard must lie under those roots where it
    /// really is (see [`Input::resolve_within`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla_data::Input;
    /// let file = std::env::temp_dir().join(format!("flotilla-scan-doc-{}.jsonl", std::process::id()));
    /// std::fs::write(&file, "{\"id\": \"1\", \"text\": \"one\"}\n{\"id\": \"2\", \"text\": \"two\"}\n")?;
    /// let (input, scan) = Input::resolve_and_scan(file.to_str().unwrap(), true, None).await?;
    /// assert_eq!((input.shards.len(), scan.rows), (1, Some(2)));
    /// assert!(scan.digest.is_some());
    /// # std::fs::remove_file(&file)?;
    /// # Ok(()) }
    /// ```
    pub async fn resolve_and_scan(
        spec: &str,
        hash: bool,
        allow: Option<&AllowedRoots>,
    ) -> Result<(std::sync::Arc<Self>, Scan), InputError> {
        let input = std::sync::Arc::new(Self::resolve_within(spec, allow).await?);
        let scanned = std::sync::Arc::clone(&input);
        match tokio::task::spawn_blocking(move || scanned.scan(hash)).await {
            Ok(scan) => Ok((input, scan?)),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The input's fingerprint and row count, for the default job id and
    /// for progress. Local uncompressed shards are read once (hashed when
    /// `hash`, JSONL lines counted on the way); a Parquet shard's rows come
    /// from its footer; compressed and stored shards are not read: their
    /// fingerprint is their size (and the store's version tag), and their
    /// rows are unknown. A single local file's digest is the SHA-256 of its
    /// bytes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla_data::Input;
    /// let file = std::env::temp_dir().join(format!("flotilla-scan2-doc-{}.jsonl", std::process::id()));
    /// std::fs::write(&file, "{\"id\": \"1\", \"text\": \"one\"}\n")?;
    /// let input = Input::resolve(file.to_str().unwrap()).await?;
    /// let scan = input.scan(false)?;
    /// assert_eq!((scan.rows, scan.digest), (Some(1), None), "lines counted, nothing hashed");
    /// # std::fs::remove_file(&file)?;
    /// # Ok(()) }
    /// ```
    pub fn scan(&self, hash: bool) -> Result<Scan, InputError> {
        let mut total = Sha256::new();
        let mut rows = Some(0u64);
        let mut single = None;
        for shard in &self.shards {
            let (digest, counted) = match &shard.place {
                Place::Local(path) => {
                    let read = shard.compression == Compression::None
                        && (hash || shard.format == ShardFormat::Jsonl);
                    let (digest, lines) = if read {
                        read_local(path, hash, shard.format == ShardFormat::Jsonl).map_err(
                            |source| InputError::Io {
                                path: path.clone(),
                                source,
                            },
                        )?
                    } else {
                        (None, None)
                    };
                    let counted = match shard.format {
                        ShardFormat::Jsonl => lines,
                        ShardFormat::Parquet => parquet_rows(path),
                    };
                    (digest, counted)
                }
                Place::Stored(_) => (None, None),
            };
            rows = rows.zip(counted).map(|(a, b)| a + b);
            if self.shards.len() == 1 && shard.compression == Compression::None {
                single = digest;
            }
            total.update(shard.name.as_bytes());
            total.update([0]);
            total.update(shard.size.to_le_bytes());
            if let Some(d) = digest {
                total.update(d);
            }
            if let Some(v) = &shard.version {
                total.update(v.as_bytes());
            }
            total.update([0]);
        }
        Ok(Scan {
            digest: hash.then(|| single.unwrap_or_else(|| total.finalize().into())),
            rows,
        })
    }
}

/// A Parquet file's row count from its footer.
fn parquet_rows(path: &Path) -> Option<u64> {
    let file = std::fs::File::open(path).ok()?;
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).ok()?;
    u64::try_from(builder.metadata().file_metadata().num_rows()).ok()
}

/// Reads a local file once: its SHA-256 if `hash`, its non-blank lines if
/// `count`.
fn read_local(
    path: &Path,
    hash: bool,
    count: bool,
) -> std::io::Result<(Option<[u8; 32]>, Option<u64>)> {
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut hasher = hash.then(Sha256::new);
    let (mut rows, mut blank) = (0u64, true);
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        if let Some(h) = hasher.as_mut() {
            h.update(buf);
        }
        if count {
            for &b in buf {
                if b == b'\n' {
                    rows += u64::from(!blank);
                    blank = true;
                } else if !b.is_ascii_whitespace() {
                    blank = false;
                }
            }
        }
        let n = buf.len();
        reader.consume(n);
    }
    Ok((
        hasher.map(|h| h.finalize().into()),
        count.then_some(rows + u64::from(!blank)),
    ))
}

/// What one look at the input yields before the job: a fingerprint (the
/// default job id derives from it) and the row count, for progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// The input's fingerprint, when asked for.
    pub digest: Option<[u8; 32]>,
    /// Rows, when known for every shard.
    pub rows: Option<u64>,
}

/// A shard's bytes as a blocking reader, decompressed. Stored shards are
/// streamed from the store on the runtime of `handle`; call this from a
/// thread that is not a runtime worker.
pub(crate) fn open_bytes(
    input: &Input,
    shard: &Shard,
    handle: &tokio::runtime::Handle,
) -> std::io::Result<Box<dyn BufRead + Send>> {
    let raw: Box<dyn Read + Send> = match &shard.place {
        Place::Local(path) => Box::new(std::fs::File::open(path)?),
        Place::Stored(path) => {
            let store = input
                .store
                .clone()
                .ok_or_else(|| std::io::Error::other("stored shard without a store".to_owned()))?;
            let result = handle
                .block_on(store.get(path))
                .map_err(std::io::Error::other)?;
            Box::new(StreamRead {
                stream: result.into_stream(),
                chunk: bytes::Bytes::new(),
                handle: handle.clone(),
            })
        }
    };
    let raw = BufReader::with_capacity(1 << 20, raw);
    Ok(match shard.compression {
        Compression::None => Box::new(raw),
        Compression::Gzip => Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::bufread::MultiGzDecoder::new(raw),
        )),
        Compression::Zstd => {
            let decoder = ruzstd::decoding::StreamingDecoder::new(raw)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            Box::new(BufReader::with_capacity(1 << 16, decoder))
        }
    })
}

/// A stored object's byte stream as a blocking reader.
struct StreamRead {
    stream: futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    chunk: bytes::Bytes,
    handle: tokio::runtime::Handle,
}

impl Read for StreamRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use futures::StreamExt;
        while self.chunk.is_empty() {
            match self.handle.block_on(self.stream.next()) {
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        let _ = self.chunk.split_to(n);
        Ok(n)
    }
}

/// A Parquet shard as parquet's random-access reader. A local file is read
/// where parquet asks; a stored one is fetched by ranges: the footer once,
/// then, before each row group is decoded, the column chunks it needs
/// ([`ShardChunks::prefetch`]), never the file whole.
#[derive(Clone)]
pub(crate) enum ShardChunks {
    /// A local file.
    Local(Arc<std::fs::File>),
    /// A stored object.
    Stored(Arc<StoredObject>),
}

/// A stored Parquet shard and the ranges fetched for the row group at hand.
pub(crate) struct StoredObject {
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    size: u64,
    /// The runtime fetches run on.
    handle: tokio::runtime::Handle,
    /// Fetched ranges: `(start, bytes)`.
    cache: std::sync::Mutex<Vec<(u64, bytes::Bytes)>>,
}

/// How much a page-header read of a stored shard fetches at a time when the
/// range is not prefetched.
const HEADER_WINDOW: u64 = 64 << 10;

impl ShardChunks {
    /// The reader of `shard`.
    pub(crate) fn open(
        input: &Input,
        shard: &Shard,
        handle: &tokio::runtime::Handle,
    ) -> std::io::Result<Self> {
        match (&shard.place, &input.store) {
            (Place::Local(path), _) => Ok(Self::Local(Arc::new(std::fs::File::open(path)?))),
            (Place::Stored(path), Some(store)) => Ok(Self::Stored(Arc::new(StoredObject {
                store: Arc::clone(store),
                path: path.clone(),
                size: shard.size,
                handle: handle.clone(),
                cache: std::sync::Mutex::default(),
            }))),
            (Place::Stored(_), None) => Err(std::io::Error::other("stored shard without a store")),
        }
    }

    /// Fetches `ranges` (of the next row group) in one request and keeps
    /// only them; a local file needs nothing.
    pub(crate) fn prefetch(&self, ranges: &[std::ops::Range<u64>]) -> parquet::errors::Result<()> {
        match self {
            Self::Local(_) => Ok(()),
            Self::Stored(object) => object.prefetch(ranges),
        }
    }
}

fn external(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl StoredObject {
    fn prefetch(&self, ranges: &[std::ops::Range<u64>]) -> parquet::errors::Result<()> {
        let fetched = self
            .handle
            .block_on(self.store.get_ranges(&self.path, ranges))
            .map_err(external)?;
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) =
            ranges.iter().map(|r| r.start).zip(fetched).collect();
        Ok(())
    }

    /// `length` bytes at `start`: from the cache when a prefetched range
    /// holds them, else from the store.
    fn bytes(&self, start: u64, length: u64) -> parquet::errors::Result<bytes::Bytes> {
        let end = start + length;
        if let Some((at, bytes)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(at, b)| *at <= start && end <= at + b.len() as u64)
        {
            return Ok(bytes.slice((start - at) as usize..(end - at) as usize));
        }
        self.handle
            .block_on(self.store.get_range(&self.path, start..end))
            .map_err(external)
    }
}

impl parquet::file::reader::Length for ShardChunks {
    fn len(&self) -> u64 {
        match self {
            Self::Local(file) => file.len(),
            Self::Stored(object) => object.size,
        }
    }
}

impl parquet::file::reader::ChunkReader for ShardChunks {
    type T = Box<dyn Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            Self::Local(file) => Ok(Box::new(file.get_read(start)?)),
            Self::Stored(object) => Ok(Box::new(StoredRead {
                object: Arc::clone(object),
                at: start,
                buf: bytes::Bytes::new(),
            })),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        match self {
            Self::Local(file) => file.get_bytes(start, length),
            Self::Stored(object) => object.bytes(start, length as u64),
        }
    }
}

/// A stored shard read from an offset onwards, a window at a time.
struct StoredRead {
    object: Arc<StoredObject>,
    at: u64,
    buf: bytes::Bytes,
}

impl Read for StoredRead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() {
            let size = self.object.size;
            if self.at >= size {
                return Ok(0);
            }
            let len = HEADER_WINDOW.min(size - self.at);
            self.buf = self
                .object
                .bytes(self.at, len)
                .map_err(std::io::Error::other)?;
            self.at += len;
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        let _ = self.buf.split_to(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_types_come_from_their_names() {
        use Compression as C;
        use ShardFormat as F;
        assert_eq!(classify("a.jsonl"), Some((F::Jsonl, C::None)));
        assert_eq!(classify("a.JSONL.gz"), Some((F::Jsonl, C::Gzip)));
        assert_eq!(classify("x/a.ndjson.zst"), Some((F::Jsonl, C::Zstd)));
        assert_eq!(classify("a.parquet"), Some((F::Parquet, C::None)));
        assert_eq!(classify("a.parquet.gz"), None, "parquet compresses inside");
        assert_eq!(classify("README.md"), None);
    }

    #[test]
    fn globs_split_at_their_first_wild_component() {
        assert_eq!(split_glob("data/*.jsonl"), Some(("data/", "*.jsonl")));
        assert_eq!(
            split_glob("s3://b/c/part-?/x.jsonl"),
            Some(("s3://b/c/", "part-?/x.jsonl"))
        );
        assert_eq!(split_glob("*.parquet"), Some(("", "*.parquet")));
        assert_eq!(split_glob("data/x.jsonl"), None);
        assert!(hidden("_SUCCESS") && hidden("a/.part.crc") && !hidden("a/b.jsonl"));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flotilla-input-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn folders_and_globs_list_shards_in_name_order_skipping_hidden_and_other_files() {
        let dir = scratch("folder");
        for name in [
            "b.jsonl",
            "a.jsonl.gz",
            "_SUCCESS",
            "notes.txt",
            "sub/c.jsonl",
            ".x.jsonl",
        ] {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "{}\n").unwrap();
        }
        let root = dir.to_string_lossy().into_owned();
        let input = Input::resolve(&root).await.unwrap();
        let names: Vec<&str> = input.shards.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a.jsonl.gz", "b.jsonl", "sub/c.jsonl"]);
        assert_eq!(input.shards[0].compression, Compression::Gzip);

        let glob = format!("{root}/*.jsonl*");
        let input = Input::resolve(&glob).await.unwrap();
        let names: Vec<&str> = input.shards.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a.jsonl.gz", "b.jsonl"], "* does not cross folders");

        std::fs::write(dir.join("d.parquet"), "not really").unwrap();
        let err = Input::resolve(&root).await.unwrap_err();
        assert!(matches!(err, InputError::Mixed { .. }), "{err}");
        let err = Input::resolve(&format!("{root}/*.csv")).await.unwrap_err();
        assert!(matches!(err, InputError::Empty { .. }), "{err}");
        let err = Input::resolve(&format!("{root}/missing"))
            .await
            .unwrap_err();
        assert!(matches!(err, InputError::NotFound { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A shard inside an allowed folder that is a link out of the roots
    /// is refused, naming the shard, whether the input names the folder,
    /// a glob, the file itself or a `file:` URL; a link that stays inside
    /// is read; a cycle of folder links is an error, not a walk without
    /// end.
    #[tokio::test]
    async fn a_symlinked_shard_leaving_the_roots_is_refused_and_a_link_cycle_is_an_error() {
        let dir = scratch("links").canonicalize().unwrap();
        let (allowed, secret) = (dir.join("allowed"), dir.join("secret"));
        std::fs::create_dir_all(allowed.join("shards")).unwrap();
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("corpus.jsonl"), "{}\n").unwrap();
        std::fs::write(allowed.join("shards/a.jsonl"), "{}\n").unwrap();
        std::os::unix::fs::symlink(
            allowed.join("shards/a.jsonl"),
            allowed.join("shards/inside.jsonl"),
        )
        .unwrap();
        let roots = AllowedRoots::new(&[allowed.to_string_lossy()]).unwrap();
        let folder = allowed.join("shards").to_string_lossy().into_owned();
        let input = Input::resolve_within(&folder, Some(&roots)).await.unwrap();
        assert_eq!(input.shards.len(), 2, "a link inside the roots is read");

        std::os::unix::fs::symlink(secret.join("corpus.jsonl"), allowed.join("shards/b.jsonl"))
            .unwrap();
        for spec in [
            folder.clone(),
            format!("{folder}/*.jsonl"),
            format!("{folder}/b.jsonl"),
            format!("file://{folder}/"),
            format!("file://{folder}/b.jsonl"),
        ] {
            let err = Input::resolve_within(&spec, Some(&roots))
                .await
                .unwrap_err();
            assert!(
                matches!(&err, InputError::Outside { shard, .. } if shard == "b.jsonl"),
                "{spec}: {err}"
            );
            assert!(err.to_string().contains("NODE-JOB-009"), "{err}");
            // Without roots to keep to, the link is read as before.
            assert!(Input::resolve(&spec).await.is_ok(), "{spec}");
        }

        // A folder of the input linked back to one above it.
        std::fs::remove_file(allowed.join("shards/b.jsonl")).unwrap();
        std::os::unix::fs::symlink(&allowed, allowed.join("shards/loop")).unwrap();
        let err = Input::resolve(&allowed.to_string_lossy())
            .await
            .unwrap_err();
        assert!(matches!(err, InputError::LinkCycle { .. }), "{err}");
        // A link to itself.
        std::fs::remove_file(allowed.join("shards/loop")).unwrap();
        std::os::unix::fs::symlink(
            allowed.join("shards/self.jsonl"),
            allowed.join("shards/self.jsonl"),
        )
        .unwrap();
        let err = Input::resolve(&folder).await.unwrap_err();
        assert!(matches!(err, InputError::Io { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_single_file_digest_is_its_content_hash_and_rows_are_counted() {
        let dir = scratch("scan");
        let path = dir.join("in.jsonl");
        let text = "{\"id\":1}\n\n  \n{\"id\":2}\n{\"id\":3}";
        std::fs::write(&path, text).unwrap();
        let input = Input::resolve(&path.to_string_lossy()).await.unwrap();
        let hashed = input.scan(true).unwrap();
        assert_eq!(hashed.rows, Some(3));
        let want: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(hashed.digest, Some(want));
        assert_eq!(
            input.scan(false).unwrap(),
            Scan {
                digest: None,
                rows: Some(3)
            }
        );
        // Two shards: the digest covers names and contents.
        std::fs::write(dir.join("more.jsonl"), "{\"id\":4}\n").unwrap();
        let both = Input::resolve(&dir.to_string_lossy()).await.unwrap();
        let scan = both.scan(true).unwrap();
        assert_eq!(scan.rows, Some(4));
        assert_ne!(scan.digest, Some(want));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn stored_inputs_list_folders_globs_and_single_objects() {
        let dir = scratch("stored");
        for name in ["p/b.jsonl", "p/a.jsonl", "p/_tmp/x.jsonl", "p/c.txt"] {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "{\"id\":\"x\",\"text\":\"y\"}\n").unwrap();
        }
        let url = format!("file://{}/p", dir.display());
        let input = Input::resolve(&url).await.unwrap();
        let names: Vec<&str> = input.shards.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a.jsonl", "b.jsonl"]);
        let input = Input::resolve(&format!("{url}/b*")).await.unwrap();
        assert_eq!(input.shards.len(), 1);
        let input = Input::resolve(&format!("{url}/a.jsonl")).await.unwrap();
        assert_eq!(input.shards[0].name, "a.jsonl");
        let handle = tokio::runtime::Handle::current();
        let shard = input.shards[0].clone();
        let text = tokio::task::spawn_blocking(move || {
            let mut s = String::new();
            open_bytes(&input, &shard, &handle)
                .unwrap()
                .read_to_string(&mut s)
                .unwrap();
            s
        })
        .await
        .unwrap();
        assert_eq!(text, "{\"id\":\"x\",\"text\":\"y\"}\n");
        let err = Input::resolve(&format!("{url}/nothing")).await.unwrap_err();
        assert!(matches!(err, InputError::NotFound { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
