//! Streamed rows of a job's input, never held whole: JSONL (one
//! `{"id": …, "text": …}` object per line, plain or compressed) or Parquet
//! (an id and a text column, read one row group at a time), shard after
//! shard in the input's order.
//!
//! ```text
//! reader thread: shard 0 lines / row groups ─► classify ─► chunks of items ─┐
//!                shard 1 …                                                   │ bounded channel
//! driver:        Source::next ◄──────────────────────────────────────────────┘
//! ```
//!
//! Reading, decompressing and parsing run on a thread of their own, a few
//! chunks ahead of the driver (stored shards are fetched on the driver's
//! runtime from there). Malformed lines or rows and repeated ids are
//! reported with their shard and line (row) number; the first occurrence
//! of an id in the whole input wins.

use std::collections::{HashSet, VecDeque};
use std::io::BufRead;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::input::{Input, ShardChunks, ShardFormat, open_bytes};

/// Where a row is: its shard (an index into the input's shards) and its
/// 1-based line (JSONL) or row (Parquet) in that shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RowAt {
    /// Index of the shard in [`Input::shards`].
    pub shard: u32,
    /// 1-based line or row within the shard.
    pub line: u64,
}

/// One row of the input, as a batch holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Where it is in the input.
    pub at: RowAt,
    /// Its id.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Its extra columns, in [`Fields::extra`]'s order.
    pub extra: Vec<Cell>,
}

/// A value of an extra output column.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Absent or null.
    Null,
    /// Text.
    Str(String),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

/// An extra output column: its name and the type of its cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Its name (the input column it keeps).
    pub name: String,
    /// The type of its cells.
    pub cells: CellType,
}

impl Column {
    /// The column `name` of cells of type `cells`.
    pub fn new(name: impl Into<String>, cells: CellType) -> Self {
        Self {
            name: name.into(),
            cells,
        }
    }
}

/// The type of an extra output column: a JSONL field is written as text
/// (strings as they are, other values as their JSON); a Parquet column
/// keeps its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellType {
    /// UTF-8 text.
    Utf8,
    /// 64-bit integers (every Parquet integer type).
    Int64,
    /// 64-bit floats (Parquet float and double).
    Float64,
    /// Booleans.
    Boolean,
}

/// One input row, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A valid row.
    Row {
        /// Where it is.
        at: RowAt,
        /// The row's id (numbers are written in decimal).
        id: String,
        /// The text to embed.
        text: String,
        /// The extra columns kept in the output, in [`Fields::extra`]'s order.
        extra: Vec<Cell>,
    },
    /// A row that cannot be embedded.
    Invalid {
        /// Where it is.
        at: RowAt,
        /// The id, when one could be read.
        id: Option<String>,
        /// Why.
        reason: String,
    },
}

/// Which fields (columns) of the input the job reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    /// The id.
    pub id: String,
    /// The text.
    pub text: String,
    /// Columns carried to the output beside `id` and `embedding`.
    pub extra: Vec<String>,
}

impl Fields {
    /// The id and text fields, no extra columns.
    pub fn new(id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            text: text.into(),
            extra: Vec::new(),
        }
    }
}

/// The ids seen so far, as 128-bit digests: repeats are refused in flat
/// memory (16 bytes an id).
#[derive(Default)]
struct IdSet(HashSet<u128>);

impl IdSet {
    /// Whether `id` is new (and records it).
    fn insert(&mut self, id: &str) -> bool {
        let digest = Sha256::digest(id.as_bytes());
        self.0.insert(u128::from_le_bytes(
            digest[..16].try_into().expect("16 bytes"),
        ))
    }
}

const DUPLICATE: &str = "duplicate id; the first occurrence was kept";

/// Why an input cannot be read on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A shard cannot be read (or decompressed).
    #[error("shard {shard}: {source}")]
    Io {
        /// The shard's name.
        shard: String,
        /// What failed.
        source: std::io::Error,
    },
    /// A Parquet shard is malformed, lacks a column or holds one of a type
    /// the job cannot read.
    #[error("shard {shard}: {reason}")]
    Parquet {
        /// The shard's name.
        shard: String,
        /// What is wrong.
        reason: String,
    },
}

/// Rows handed over at a time.
const CHUNK: usize = 256;
/// Chunks read ahead of the driver.
const AHEAD: usize = 8;
/// Parquet rows decoded at a time.
const PARQUET_BATCH: usize = 1024;

type Chunk = Result<Vec<Item>, SourceError>;

/// The rows of an input, in order, read ahead on a thread of their own.
/// Dropping it stops the reading.
pub struct Source {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    ready: VecDeque<Item>,
    types: Vec<CellType>,
}

impl Source {
    /// Starts reading `input`. The types of the extra columns are settled
    /// first (from the first Parquet shard's schema; text for JSONL), so a
    /// missing column or one of an unreadable type fails here.
    pub async fn open(input: Arc<Input>, fields: Fields) -> Result<Self, SourceError> {
        let (tx, rx) = tokio::sync::mpsc::channel(AHEAD);
        let (types_tx, types_rx) = tokio::sync::oneshot::channel();
        let handle = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("flotilla-input".into())
            .spawn(move || {
                let mut reader = Reader {
                    input: &input,
                    fields: &fields,
                    handle,
                    seen: IdSet::default(),
                    types: None,
                    chunk: Vec::with_capacity(CHUNK),
                    tx,
                };
                let types = reader.settle_types();
                let failed = types.is_err();
                let _ = types_tx.send(types);
                if !failed {
                    reader.read_all();
                }
            })
            .map_err(|source| SourceError::Io {
                shard: String::new(),
                source,
            })?;
        let types = types_rx.await.map_err(|_| SourceError::Io {
            shard: String::new(),
            source: std::io::Error::other("the input reader stopped"),
        })??;
        Ok(Self {
            rx,
            ready: VecDeque::new(),
            types,
        })
    }

    /// The types of the extra columns, in [`Fields::extra`]'s order.
    pub fn types(&self) -> &[CellType] {
        &self.types
    }

    /// The next row, `None` at the end of the input.
    ///
    /// Cancel safety: cancelling loses nothing; the next call resumes.
    pub async fn next(&mut self) -> Option<Result<Item, SourceError>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(Ok(item));
            }
            match self.rx.recv().await? {
                Ok(items) => self.ready.extend(items),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// The reader thread's state.
struct Reader<'a> {
    input: &'a Input,
    fields: &'a Fields,
    handle: tokio::runtime::Handle,
    seen: IdSet,
    /// Types of the extra columns, once settled.
    types: Option<Vec<CellType>>,
    chunk: Vec<Item>,
    tx: tokio::sync::mpsc::Sender<Chunk>,
}

/// The reading stopped: the source was dropped.
struct Stopped;

impl Reader<'_> {
    fn settle_types(&mut self) -> Result<Vec<CellType>, SourceError> {
        let types = match self.input.format {
            ShardFormat::Jsonl => vec![CellType::Utf8; self.fields.extra.len()],
            ShardFormat::Parquet => {
                let shard = &self.input.shards[0];
                let chunks =
                    ShardChunks::open(self.input, shard, &self.handle).map_err(|source| {
                        SourceError::Io {
                            shard: shard.name.clone(),
                            source,
                        }
                    })?;
                ParquetShard::open(chunks, &shard.name, self.fields)?.types
            }
        };
        self.types = Some(types.clone());
        Ok(types)
    }

    fn read_all(&mut self) {
        for index in 0..self.input.shards.len() {
            let result = match self.input.format {
                ShardFormat::Jsonl => self.jsonl(index),
                ShardFormat::Parquet => self.parquet(index),
            };
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let _ = self.tx.blocking_send(Err(e));
                    return;
                }
                Err(Stopped) => return,
            }
        }
        let _ = self.flush();
    }

    fn push(&mut self, item: Item) -> Result<(), Stopped> {
        self.chunk.push(item);
        if self.chunk.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Stopped> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| Stopped)
    }

    fn jsonl(&mut self, index: usize) -> Result<Result<(), SourceError>, Stopped> {
        let shard = &self.input.shards[index];
        let io = |source| SourceError::Io {
            shard: shard.name.clone(),
            source,
        };
        let reader = match open_bytes(self.input, shard, &self.handle) {
            Ok(r) => r,
            Err(e) => return Ok(Err(io(e))),
        };
        for (i, raw) in reader.split(b'\n').enumerate() {
            let raw = match raw {
                Ok(raw) => raw,
                Err(e) => return Ok(Err(io(e))),
            };
            let at = RowAt {
                shard: index as u32,
                line: i as u64 + 1,
            };
            let item = match String::from_utf8(raw) {
                Err(_) => Item::Invalid {
                    at,
                    id: None,
                    reason: "not UTF-8".into(),
                },
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => classify_json(at, &text, self.fields, &mut self.seen),
            };
            self.push(item)?;
        }
        Ok(Ok(()))
    }

    fn parquet(&mut self, index: usize) -> Result<Result<(), SourceError>, Stopped> {
        let shard = &self.input.shards[index];
        let name = shard.name.clone();
        let opened = ShardChunks::open(self.input, shard, &self.handle)
            .map_err(|source| SourceError::Io {
                shard: name.clone(),
                source,
            })
            .and_then(|chunks| ParquetShard::open(chunks, &name, self.fields));
        let mut file = match opened {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        if Some(&file.types) != self.types.as_ref() {
            return Ok(Err(SourceError::Parquet {
                shard: name,
                reason: format!(
                    "the columns {:?} have other types than in the first shard",
                    self.fields.extra
                ),
            }));
        }
        let mut row = 0u64;
        for group in 0..file.row_groups() {
            let batches = match file.row_group(group) {
                Ok(b) => b,
                Err(e) => return Ok(Err(e)),
            };
            for batch in batches {
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        return Ok(Err(SourceError::Parquet {
                            shard: name,
                            reason: e.to_string(),
                        }));
                    }
                };
                for item in
                    classify_batch(index as u32, &mut row, &batch, self.fields, &mut self.seen)
                {
                    self.push(item)?;
                }
            }
        }
        Ok(Ok(()))
    }
}

/// Classifies one JSONL line.
fn classify_json(at: RowAt, raw: &str, fields: &Fields, seen: &mut IdSet) -> Item {
    let invalid = |id: Option<String>, reason: String| Item::Invalid { at, id, reason };
    let value: serde_json::Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => return invalid(None, format!("not JSON: {e}")),
    };
    let id = match value.get(&fields.id) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(_) => {
            return invalid(
                None,
                format!("field {:?} is not a string or number", fields.id),
            );
        }
        None => return invalid(None, format!("no field {:?}", fields.id)),
    };
    let text = match value.get(&fields.text) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => {
            return invalid(Some(id), format!("field {:?} is not a string", fields.text));
        }
        None => return invalid(Some(id), format!("no field {:?}", fields.text)),
    };
    if !seen.insert(&id) {
        return invalid(Some(id), DUPLICATE.into());
    }
    let extra = fields
        .extra
        .iter()
        .map(|name| match value.get(name) {
            None | Some(serde_json::Value::Null) => Cell::Null,
            Some(serde_json::Value::String(s)) => Cell::Str(s.clone()),
            Some(other) => Cell::Str(other.to_string()),
        })
        .collect();
    Item::Row {
        at,
        id,
        text,
        extra,
    }
}

/// A Parquet shard opened for reading: its metadata, the columns the job
/// reads, and the types of the extra ones.
struct ParquetShard {
    chunks: ShardChunks,
    metadata: parquet::arrow::arrow_reader::ArrowReaderMetadata,
    /// Leaf column indices of the projection.
    leaves: Vec<usize>,
    types: Vec<CellType>,
    name: String,
}

impl ParquetShard {
    /// Reads the footer and checks the columns: ids strings or integers,
    /// texts strings, extra columns of a kind [`CellType`] holds.
    fn open(chunks: ShardChunks, name: &str, fields: &Fields) -> Result<Self, SourceError> {
        use arrow_schema::DataType::{
            Boolean, Float32, Float64, Int8, Int16, Int32, Int64, LargeUtf8, UInt8, UInt16, UInt32,
            UInt64, Utf8,
        };
        use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
        let bad = |reason: String| SourceError::Parquet {
            shard: name.to_owned(),
            reason,
        };
        let metadata = ArrowReaderMetadata::load(&chunks, ArrowReaderOptions::default())
            .map_err(|e| bad(e.to_string()))?;
        let schema = metadata.schema().clone();
        let field = |column: &str| {
            schema
                .field_with_name(column)
                .map_err(|_| bad(format!("no column {column:?}")))
        };
        let ints = [Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64];
        let id = field(&fields.id)?;
        if !matches!(id.data_type(), Utf8 | LargeUtf8) && !ints.contains(id.data_type()) {
            return Err(bad(format!(
                "column {:?} is {}; it must hold strings or integers",
                fields.id,
                id.data_type()
            )));
        }
        let text = field(&fields.text)?;
        if !matches!(text.data_type(), Utf8 | LargeUtf8) {
            return Err(bad(format!(
                "column {:?} is {}; it must hold strings",
                fields.text,
                text.data_type()
            )));
        }
        let mut types = Vec::with_capacity(fields.extra.len());
        for column in &fields.extra {
            let f = field(column)?;
            types.push(match f.data_type() {
                Utf8 | LargeUtf8 => CellType::Utf8,
                t if ints.contains(t) => CellType::Int64,
                Float32 | Float64 => CellType::Float64,
                Boolean => CellType::Boolean,
                t => {
                    return Err(bad(format!(
                        "column {column:?} is {t}; output columns hold strings, integers, floats or booleans"
                    )));
                }
            });
        }
        let wanted: Vec<&str> = [fields.id.as_str(), fields.text.as_str()]
            .into_iter()
            .chain(fields.extra.iter().map(String::as_str))
            .collect();
        let leaves = metadata
            .parquet_schema()
            .columns()
            .iter()
            .enumerate()
            .filter(|(_, c)| wanted.contains(&c.path().parts()[0].as_str()))
            .map(|(i, _)| i)
            .collect();
        Ok(Self {
            chunks,
            metadata,
            leaves,
            types,
            name: name.to_owned(),
        })
    }

    fn row_groups(&self) -> usize {
        self.metadata.metadata().num_row_groups()
    }

    /// The record batches of row group `group`, with its column chunks
    /// fetched first for a stored shard.
    fn row_group(
        &mut self,
        group: usize,
    ) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader, SourceError> {
        use parquet::arrow::ProjectionMask;
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let bad = |e: parquet::errors::ParquetError| SourceError::Parquet {
            shard: self.name.clone(),
            reason: e.to_string(),
        };
        let rg = self.metadata.metadata().row_group(group);
        let ranges: Vec<std::ops::Range<u64>> = self
            .leaves
            .iter()
            .map(|&i| {
                let (start, len) = rg.column(i).byte_range();
                start..start + len
            })
            .collect();
        self.chunks.prefetch(&ranges).map_err(bad)?;
        let mask =
            ProjectionMask::leaves(self.metadata.parquet_schema(), self.leaves.iter().copied());
        ParquetRecordBatchReaderBuilder::new_with_metadata(
            self.chunks.clone(),
            self.metadata.clone(),
        )
        .with_row_groups(vec![group])
        .with_projection(mask)
        .with_batch_size(PARQUET_BATCH)
        .build()
        .map_err(bad)
    }
}

/// The value at `i` of a string or integer column, as text.
fn text_at(col: &dyn arrow_array::Array, i: usize) -> Option<String> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
    };
    use arrow_schema::DataType;
    if col.is_null(i) {
        return None;
    }
    Some(match col.data_type() {
        DataType::Utf8 => col.as_string::<i32>().value(i).to_owned(),
        DataType::LargeUtf8 => col.as_string::<i64>().value(i).to_owned(),
        DataType::Int8 => col.as_primitive::<Int8Type>().value(i).to_string(),
        DataType::Int16 => col.as_primitive::<Int16Type>().value(i).to_string(),
        DataType::Int32 => col.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::Int64 => col.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::UInt8 => col.as_primitive::<UInt8Type>().value(i).to_string(),
        DataType::UInt16 => col.as_primitive::<UInt16Type>().value(i).to_string(),
        DataType::UInt32 => col.as_primitive::<UInt32Type>().value(i).to_string(),
        DataType::UInt64 => col.as_primitive::<UInt64Type>().value(i).to_string(),
        _ => return None,
    })
}

/// The value at `i` of an extra column, as a [`Cell`].
fn cell_at(col: &dyn arrow_array::Array, i: usize) -> Cell {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, Float64Type};
    use arrow_schema::DataType;
    if col.is_null(i) {
        return Cell::Null;
    }
    match col.data_type() {
        DataType::Float32 => Cell::Float(f64::from(col.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => Cell::Float(col.as_primitive::<Float64Type>().value(i)),
        DataType::Boolean => Cell::Bool(col.as_boolean().value(i)),
        DataType::Utf8 | DataType::LargeUtf8 => text_at(col, i).map_or(Cell::Null, Cell::Str),
        // Integers, checked at open.
        _ => text_at(col, i)
            .and_then(|s| s.parse::<i64>().ok())
            .map_or(Cell::Null, Cell::Int),
    }
}

/// Classifies the rows of one Parquet record batch; `row` counts the
/// shard's rows so far.
fn classify_batch(
    shard: u32,
    row: &mut u64,
    batch: &arrow_array::RecordBatch,
    fields: &Fields,
    seen: &mut IdSet,
) -> Vec<Item> {
    let column = |name: &str| batch.column_by_name(name).expect("projected and checked");
    let (ids, texts) = (column(&fields.id), column(&fields.text));
    let extra: Vec<&arrow_array::ArrayRef> = fields.extra.iter().map(|c| column(c)).collect();
    let mut items = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        *row += 1;
        let at = RowAt { shard, line: *row };
        let Some(id) = text_at(ids.as_ref(), i) else {
            items.push(Item::Invalid {
                at,
                id: None,
                reason: format!("column {:?} is null", fields.id),
            });
            continue;
        };
        items.push(match text_at(texts.as_ref(), i) {
            None => Item::Invalid {
                at,
                id: Some(id),
                reason: format!("column {:?} is null", fields.text),
            },
            Some(_) if !seen.insert(&id) => Item::Invalid {
                at,
                id: Some(id),
                reason: DUPLICATE.into(),
            },
            Some(text) => Item::Row {
                at,
                id,
                text,
                extra: extra.iter().map(|c| cell_at(c.as_ref(), i)).collect(),
            },
        });
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::{Path, PathBuf};

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flotilla-source-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    async fn read(spec: &Path, fields: Fields) -> Result<Vec<Item>, SourceError> {
        let input = Arc::new(Input::resolve(&spec.to_string_lossy()).await.unwrap());
        let mut source = Source::open(input, fields).await?;
        let mut items = Vec::new();
        while let Some(item) = source.next().await {
            items.push(item?);
        }
        Ok(items)
    }

    fn write_parquet(path: &Path, batch: &arrow_array::RecordBatch, rows_per_group: usize) {
        let file = std::fs::File::create(path).unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows_per_group))
            .build();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    }

    /// A Parquet file whose columns hold types the source cannot read is
    /// refused when opened, naming the column and its type, instead of
    /// every row becoming an error.
    #[tokio::test]
    async fn parquet_columns_of_unreadable_types_are_refused_at_open() {
        use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
        let dir = scratch("types");
        let path = dir.join("in.parquet");
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
            ("text", Arc::new(StringArray::from(vec!["one"])) as ArrayRef),
            ("score", Arc::new(Float64Array::from(vec![0.5])) as ArrayRef),
        ])
        .unwrap();
        write_parquet(&path, &batch, 1024);
        let rows = read(&path, Fields::new("id", "text")).await.unwrap();
        assert_eq!(rows.len(), 1);
        for (id, text) in [("score", "text"), ("id", "score")] {
            let err = read(&path, Fields::new(id, text)).await.unwrap_err();
            assert!(
                err.to_string().contains("column \"score\" is Float64"),
                "{err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn parquet_row_groups_are_read_in_order_with_extra_columns_typed() {
        use arrow_array::{ArrayRef, Float64Array, Int32Array, RecordBatch, StringArray};
        let dir = scratch("groups");
        let path = dir.join("in.parquet");
        let n = 2500;
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int32Array::from_iter_values(0..n)) as ArrayRef,
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("t{i}")),
                )) as ArrayRef,
            ),
            (
                "score",
                Arc::new(Float64Array::from_iter_values((0..n).map(f64::from))) as ArrayRef,
            ),
        ])
        .unwrap();
        write_parquet(&path, &batch, 700);
        // On local disk, and through the object store (fetched by ranges).
        for spec in [
            path.to_string_lossy().into_owned(),
            format!("file://{}", path.display()),
        ] {
            let mut fields = Fields::new("id", "text");
            fields.extra = vec!["score".into()];
            let input = Arc::new(Input::resolve(&spec).await.unwrap());
            let mut source = Source::open(input, fields).await.unwrap();
            assert_eq!(source.types(), [CellType::Float64]);
            let mut count = 0;
            while let Some(item) = source.next().await {
                let Item::Row { at, id, extra, .. } = item.unwrap() else {
                    panic!("every row is valid")
                };
                assert_eq!(at.line, count as u64 + 1);
                assert_eq!(id, count.to_string());
                assert_eq!(extra, [Cell::Float(f64::from(count))]);
                count += 1;
            }
            assert_eq!(count, n, "{spec}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn rows_errors_and_duplicates_are_classified_with_shard_and_line() {
        let dir = scratch("classify");
        std::fs::write(
            dir.join("a.jsonl"),
            "{\"id\":\"a\",\"text\":\"one\",\"lang\":\"en\"}\n{broken\n\n{\"id\":7,\"text\":\"two\",\"lang\":3}\n{\"id\":\"a\",\"text\":\"again\"}\n{\"id\":\"b\"}\n{\"text\":\"no id\"}\n",
        )
        .unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"{\"id\":\"c\",\"text\":\"three\"}\n\xff\xfe\n{\"id\":\"a\",\"text\":\"dup across shards\"}\n")
            .unwrap();
        std::fs::write(dir.join("b.jsonl.gz"), gz.finish().unwrap()).unwrap();
        let mut fields = Fields::new("id", "text");
        fields.extra = vec!["lang".into()];
        let items = read(&dir, fields).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let at = |shard, line| RowAt { shard, line };
        assert_eq!(
            items[0],
            Item::Row {
                at: at(0, 1),
                id: "a".into(),
                text: "one".into(),
                extra: vec![Cell::Str("en".into())],
            }
        );
        assert!(matches!(&items[1], Item::Invalid { at: a, id: None, .. } if *a == at(0, 2)));
        assert_eq!(
            items[2],
            Item::Row {
                at: at(0, 4),
                id: "7".into(),
                text: "two".into(),
                extra: vec![Cell::Str("3".into())],
            }
        );
        assert!(
            matches!(&items[3], Item::Invalid { at: a, id: Some(id), reason } if *a == at(0, 5) && id == "a" && reason.contains("duplicate"))
        );
        assert!(
            matches!(&items[4], Item::Invalid { at: a, id: Some(id), .. } if *a == at(0, 6) && id == "b")
        );
        assert!(matches!(&items[5], Item::Invalid { at: a, id: None, .. } if *a == at(0, 7)));
        assert!(
            matches!(&items[6], Item::Row { at: a, id, extra, .. } if *a == at(1, 1) && id == "c" && extra == &[Cell::Null])
        );
        assert!(
            matches!(&items[7], Item::Invalid { at: a, reason, .. } if *a == at(1, 2) && reason == "not UTF-8")
        );
        assert!(
            matches!(&items[8], Item::Invalid { at: a, reason, .. } if *a == at(1, 3) && reason.contains("duplicate"))
        );
        assert_eq!(items.len(), 9);
    }

    #[tokio::test]
    async fn zstd_shards_read_as_they_are_and_a_corrupt_one_names_its_shard() {
        let dir = scratch("zstd");
        // A Zstandard frame of one raw block holding the text (RFC 8878).
        let text = b"{\"id\":\"z\",\"text\":\"zed\"}\n";
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x20, text.len() as u8];
        let header = ((text.len() as u32) << 3) | 1; // last block, raw
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.extend_from_slice(text);
        std::fs::write(dir.join("a.jsonl.zst"), &frame).unwrap();
        let items = read(&dir, Fields::new("id", "text")).await.unwrap();
        assert!(matches!(&items[..], [Item::Row { id, .. }] if id == "z"));
        std::fs::write(dir.join("b.jsonl.gz"), b"not gzip at all").unwrap();
        let err = read(&dir, Fields::new("id", "text")).await.unwrap_err();
        assert!(err.to_string().contains("b.jsonl.gz"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
