//! Streamed input: JSONL (one `{"id": …, "text": …}` object per line) or
//! Parquet (an id and a text column), never held whole. Malformed lines or
//! rows and repeated ids are reported with their line (row) number; the
//! first occurrence of an id wins.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;

use sha2::{Digest, Sha256};

/// One input line, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A valid row.
    Row {
        /// 1-based line number.
        line: u64,
        /// The row's id (numbers are written in decimal).
        id: String,
        /// The text to embed.
        text: String,
    },
    /// A line that cannot be embedded.
    Invalid {
        /// 1-based line number.
        line: u64,
        /// The id, when one could be read.
        id: Option<String>,
        /// Why.
        reason: String,
    },
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

/// Why an input cannot be read at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The file cannot be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The Parquet file is malformed or lacks a column.
    #[error("{0}")]
    Parquet(String),
}

/// An input, whatever its format: rows and invalid rows in file order.
pub type Source = Box<dyn Iterator<Item = Result<Item, SourceError>> + Send>;

/// Opens `path` as Parquet when it ends in `.parquet`, else as JSONL.
pub fn open(path: &Path, id_field: &str, text_field: &str) -> Result<Source, SourceError> {
    if path.extension().is_some_and(|e| e == "parquet") {
        Ok(Box::new(ParquetSource::open(path, id_field, text_field)?))
    } else {
        let jsonl = JsonlSource::open(path, id_field, text_field)?;
        Ok(Box::new(jsonl.map(|r| r.map_err(SourceError::from))))
    }
}

/// What one read of an input file yields before the job: its SHA-256 when
/// asked (the default job id derives from it) and its rows, for progress: the
/// non-blank lines of a JSONL file, or a Parquet file's row count from its
/// footer (`None` if the footer cannot be read; the source reports why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// SHA-256 of the file's bytes, when asked for.
    pub digest: Option<[u8; 32]>,
    /// Rows, when known.
    pub rows: Option<u64>,
}

/// Reads `path` once, hashing it if `hash` and counting JSONL rows on the
/// way. A Parquet file that need not be hashed is not read at all: its
/// footer has the row count.
pub fn scan(path: &Path, hash: bool) -> std::io::Result<Scan> {
    let parquet = path.extension().is_some_and(|e| e == "parquet");
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut hasher = hash.then(Sha256::new);
    let (mut rows, mut blank) = (0u64, true);
    while hasher.is_some() || !parquet {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        if let Some(h) = hasher.as_mut() {
            h.update(buf);
        }
        if !parquet {
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
    let rows = if parquet {
        std::fs::File::open(path)
            .ok()
            .and_then(|f| {
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).ok()
            })
            .and_then(|b| u64::try_from(b.metadata().file_metadata().num_rows()).ok())
    } else {
        Some(rows + u64::from(!blank))
    };
    Ok(Scan {
        digest: hasher.map(|h| h.finalize().into()),
        rows,
    })
}

/// Reads rows from a JSONL file.
pub struct JsonlSource {
    lines: std::io::Lines<BufReader<std::fs::File>>,
    line: u64,
    id_field: String,
    text_field: String,
    seen: IdSet,
}

impl JsonlSource {
    /// Opens `path`, reading ids from `id_field` and texts from `text_field`.
    pub fn open(path: &Path, id_field: &str, text_field: &str) -> std::io::Result<Self> {
        Ok(Self {
            lines: BufReader::new(std::fs::File::open(path)?).lines(),
            line: 0,
            id_field: id_field.to_owned(),
            text_field: text_field.to_owned(),
            seen: IdSet::default(),
        })
    }

    fn classify(&mut self, raw: &str) -> Item {
        let line = self.line;
        let invalid = |id: Option<String>, reason: String| Item::Invalid { line, id, reason };
        let value: serde_json::Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => return invalid(None, format!("not JSON: {e}")),
        };
        let id = match value.get(&self.id_field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(_) => {
                return invalid(
                    None,
                    format!("field {:?} is not a string or number", self.id_field),
                );
            }
            None => return invalid(None, format!("no field {:?}", self.id_field)),
        };
        let text = match value.get(&self.text_field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(_) => {
                return invalid(
                    Some(id),
                    format!("field {:?} is not a string", self.text_field),
                );
            }
            None => return invalid(Some(id), format!("no field {:?}", self.text_field)),
        };
        if !self.seen.insert(&id) {
            return invalid(Some(id), DUPLICATE.into());
        }
        Item::Row { line, id, text }
    }
}

impl Iterator for JsonlSource {
    type Item = std::io::Result<Item>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let raw = match self.lines.next()? {
                Ok(raw) => raw,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    self.line += 1;
                    return Some(Ok(Item::Invalid {
                        line: self.line,
                        id: None,
                        reason: "not UTF-8".into(),
                    }));
                }
                Err(e) => return Some(Err(e)),
            };
            self.line += 1;
            if raw.trim().is_empty() {
                continue;
            }
            return Some(Ok(self.classify(&raw)));
        }
    }
}

/// Reads rows from a Parquet file, one record batch at a time.
pub struct ParquetSource {
    reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
    id_field: String,
    text_field: String,
    /// Rows of the current record batch, classified.
    ready: std::collections::VecDeque<Item>,
    row: u64,
    seen: IdSet,
}

impl ParquetSource {
    /// Opens `path`, checking that both columns exist with types it reads:
    /// ids strings or integers, texts strings.
    pub fn open(path: &Path, id_field: &str, text_field: &str) -> Result<Self, SourceError> {
        use arrow_schema::DataType::{Int32, Int64, LargeUtf8, UInt32, UInt64, Utf8};
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let file = std::fs::File::open(path)?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| SourceError::Parquet(format!("{}: {e}", path.display())))?;
        let columns = [
            (
                id_field,
                &[Utf8, LargeUtf8, Int32, Int64, UInt32, UInt64][..],
                "strings or integers",
            ),
            (text_field, &[Utf8, LargeUtf8][..], "strings"),
        ];
        for (column, readable, what) in columns {
            let field = builder.schema().field_with_name(column).map_err(|_| {
                SourceError::Parquet(format!("{} has no column {column:?}", path.display()))
            })?;
            if !readable.contains(field.data_type()) {
                return Err(SourceError::Parquet(format!(
                    "{}: column {column:?} is {}; it must hold {what}",
                    path.display(),
                    field.data_type()
                )));
            }
        }
        let reader = builder
            .with_batch_size(1024)
            .build()
            .map_err(|e| SourceError::Parquet(e.to_string()))?;
        Ok(Self {
            reader,
            id_field: id_field.to_owned(),
            text_field: text_field.to_owned(),
            ready: Default::default(),
            row: 0,
            seen: IdSet::default(),
        })
    }

    fn fill(&mut self, batch: &arrow_array::RecordBatch) {
        use arrow_array::{
            Array, Int32Array, Int64Array, LargeStringArray, StringArray, UInt32Array, UInt64Array,
        };
        let text_col = batch
            .column_by_name(&self.text_field)
            .expect("checked at open");
        let id_col = batch
            .column_by_name(&self.id_field)
            .expect("checked at open");
        let any_text = text_col.as_any();
        let any_id = id_col.as_any();
        for i in 0..batch.num_rows() {
            self.row += 1;
            let line = self.row;
            let id = if id_col.is_null(i) {
                None
            } else if let Some(a) = any_id.downcast_ref::<StringArray>() {
                Some(a.value(i).to_owned())
            } else if let Some(a) = any_id.downcast_ref::<LargeStringArray>() {
                Some(a.value(i).to_owned())
            } else if let Some(a) = any_id.downcast_ref::<Int64Array>() {
                Some(a.value(i).to_string())
            } else if let Some(a) = any_id.downcast_ref::<Int32Array>() {
                Some(a.value(i).to_string())
            } else if let Some(a) = any_id.downcast_ref::<UInt64Array>() {
                Some(a.value(i).to_string())
            } else {
                any_id
                    .downcast_ref::<UInt32Array>()
                    .map(|a| a.value(i).to_string())
            };
            let Some(id) = id else {
                let reason = format!("column {:?} is null", self.id_field);
                self.ready.push_back(Item::Invalid {
                    line,
                    id: None,
                    reason,
                });
                continue;
            };
            let text = if text_col.is_null(i) {
                None
            } else if let Some(a) = any_text.downcast_ref::<StringArray>() {
                Some(a.value(i).to_owned())
            } else {
                any_text
                    .downcast_ref::<LargeStringArray>()
                    .map(|a| a.value(i).to_owned())
            };
            let item = match text {
                None => Item::Invalid {
                    line,
                    id: Some(id),
                    reason: format!("column {:?} is null", self.text_field),
                },
                Some(_) if !self.seen.insert(&id) => Item::Invalid {
                    line,
                    id: Some(id),
                    reason: DUPLICATE.into(),
                },
                Some(text) => Item::Row { line, id, text },
            };
            self.ready.push_back(item);
        }
    }
}

impl Iterator for ParquetSource {
    type Item = Result<Item, SourceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(Ok(item));
            }
            match self.reader.next()? {
                Ok(batch) => self.fill(&batch),
                Err(e) => return Some(Err(SourceError::Parquet(e.to_string()))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Parquet file whose columns hold types the source cannot read is
    /// refused when opened, naming the column and its type, instead of
    /// every row becoming an error.
    #[test]
    fn parquet_columns_of_unreadable_types_are_refused_at_open() {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
        let path =
            std::env::temp_dir().join(format!("flotilla-src-{}.parquet", std::process::id()));
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
            ("text", Arc::new(StringArray::from(vec!["one"])) as ArrayRef),
            ("score", Arc::new(Float64Array::from(vec![0.5])) as ArrayRef),
        ])
        .unwrap();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let rows: Vec<Item> = ParquetSource::open(&path, "id", "text")
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(rows.len(), 1);
        for (id, text) in [("score", "text"), ("id", "score")] {
            let err = ParquetSource::open(&path, id, text).err().expect("refused");
            assert!(
                err.to_string().contains("column \"score\" is Float64"),
                "{err}"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn one_scan_hashes_the_file_and_counts_non_blank_lines() {
        let path = std::env::temp_dir().join(format!("flotilla-scan-{}.jsonl", std::process::id()));
        let text = "{\"id\":1}\n\n  \n{\"id\":2}\n{\"id\":3}";
        std::fs::write(&path, text).unwrap();
        let hashed = scan(&path, true).unwrap();
        let counted = scan(&path, false).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(hashed.rows, Some(3));
        let want: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(hashed.digest, Some(want));
        assert_eq!(
            counted,
            Scan {
                digest: None,
                rows: Some(3)
            }
        );
    }

    #[test]
    fn rows_errors_and_duplicates_are_classified_with_line_numbers() {
        let path = std::env::temp_dir().join(format!("flotilla-src-{}.jsonl", std::process::id()));
        std::fs::write(
            &path,
            "{\"id\":\"a\",\"text\":\"one\"}\n{broken\n\n{\"id\":7,\"text\":\"two\"}\n{\"id\":\"a\",\"text\":\"again\"}\n{\"id\":\"b\"}\n{\"text\":\"no id\"}\n",
        )
        .unwrap();
        let items: Vec<Item> = JsonlSource::open(&path, "id", "text")
            .unwrap()
            .map(Result::unwrap)
            .collect();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            items[0],
            Item::Row {
                line: 1,
                id: "a".into(),
                text: "one".into()
            }
        );
        assert!(matches!(
            &items[1],
            Item::Invalid {
                line: 2,
                id: None,
                ..
            }
        ));
        assert_eq!(
            items[2],
            Item::Row {
                line: 4,
                id: "7".into(),
                text: "two".into()
            }
        );
        assert!(
            matches!(&items[3], Item::Invalid { line: 5, id: Some(id), reason } if id == "a" && reason.contains("duplicate"))
        );
        assert!(matches!(&items[4], Item::Invalid { line: 6, id: Some(id), .. } if id == "b"));
        assert!(matches!(
            &items[5],
            Item::Invalid {
                line: 7,
                id: None,
                ..
            }
        ));
        assert_eq!(items.len(), 6);
    }
}
