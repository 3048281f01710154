//! The data layer of batch jobs: where a job's rows come from, streamed in
//! flat memory with stable positions, for any actor a job runs them
//! through.
//!
//! ```text
//! Input::parse("s3://bucket/corpus/*.jsonl.gz") ─► Input::open ─► shards, in name order
//!     ─► Source (a reader thread, a few chunks ahead) ─► Item::Row { at, id, text, extra } …
//!                                                     └► Item::Invalid { at, reason } (malformed, repeated id)
//! … the application's actors … ─► Output::write_part(batch id, bytes) ─► OUT/parts/batch-…
//! ```
//!
//! - [`input`]: one file, a folder, or a glob of JSONL (plain, `.gz`,
//!   `.zst`) or Parquet shards, on local disk or behind an object-store
//!   URL; shards in the byte order of their names, so positions (and the
//!   batch ids a job makes of them) are the same on every run.
//! - [`source`]: the rows of an input, read, decompressed and parsed on a
//!   thread of their own, each with its shard and line, malformed rows and
//!   repeated ids reported where they are.
//! - [`output`]: exactly-once output — the application's manifest written
//!   first (another job's refused), one part per completed batch with one
//!   atomic put, the batches already done for a resumed job to skip, and
//!   an errors file for the rows refused.
//! - [`job`]: a batch job over any actor kind — the input cut into batches
//!   with stable ids (length-sorted windows, a token budget), the
//!   framework's bounded pipeline over the actors (backpressure,
//!   least-loaded routing, deadlines, retries, a lost member's batches sent
//!   elsewhere), one part per batch; actors placed in a placement group of
//!   the job's own under a supervisor with a restart limit
//!   ([`job::Placed`]); the settings every job takes, as flags and as
//!   the detached form ([`job::Settings`]); a driver for detached jobs
//!   ([`job::detached`]).
//! - [`parts`]: parts of an `id` and the application's columns, or of
//!   rows with a vector column, as Parquet or JSON lines; typed cells as
//!   Arrow arrays and JSON.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use flotilla_data::{Fields, Input, Item, Source};
//!
//! let dir = std::env::temp_dir().join(format!("flotilla-data-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let file = dir.join("corpus.jsonl");
//! std::fs::write(&file, "{\"id\": \"a\", \"text\": \"one\"}\nnot json\n{\"id\": 7, \"text\": \"two\"}\n")?;
//!
//! let input = Arc::new(Input::resolve(file.to_str().unwrap()).await?);
//! let mut rows = Source::open(input, Fields::new("id", "text")).await?;
//! let mut seen = Vec::new();
//! while let Some(item) = rows.next().await {
//!     match item? {
//!         Item::Row { at, id, text, .. } => seen.push((at.line, id, text)),
//!         Item::Invalid { at, reason, .. } => eprintln!("line {}: {reason}", at.line),
//!     }
//! }
//! assert_eq!(seen, vec![(1, "a".into(), "one".into()), (3, "7".into(), "two".into())]);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

#![warn(clippy::too_many_lines)]

pub mod input;
pub mod job;
pub mod output;
pub mod parts;
pub mod source;

pub use input::{Input, InputError};
pub use job::{
    BatchJob, BatchJobError, BatchSummary, Batching, Encode, Links, PartError, PartOf, Parts, Pool,
    ProgressConfig, Row,
};
pub use output::{ErrorLog, Output, OutputError, RowError};
pub use source::{Cell, CellType, Column, Fields, Item, RowAt, Source, SourceError};
