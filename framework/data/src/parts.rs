//! Parts of the columns an application defines: an `id` column and any
//! number of columns of [`Cell`]s, typed by their values, or of a job's
//! rows with a column of vectors beside their kept columns, as Parquet or
//! JSON lines; and the ids read back from a folder of parts (to check a
//! job's output).

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::errors::ParquetError;

use serde::{Deserialize, Serialize};

use crate::source::{Cell, CellType, Column, Row};

/// The Arrow type of cells of `kind`.
pub fn arrow_type(kind: CellType) -> DataType {
    match kind {
        CellType::Utf8 => DataType::Utf8,
        CellType::Int64 => DataType::Int64,
        CellType::Float64 => DataType::Float64,
        CellType::Boolean => DataType::Boolean,
    }
}

/// `cells` as an Arrow array of `kind`: null where a cell is null or of
/// another type.
pub fn cells_array<'a>(cells: impl Iterator<Item = &'a Cell>, kind: CellType) -> ArrayRef {
    match kind {
        CellType::Utf8 => Arc::new(StringArray::from_iter(cells.map(|c| match c {
            Cell::Str(v) => Some(v.as_str()),
            _ => None,
        }))),
        CellType::Int64 => Arc::new(Int64Array::from_iter(cells.map(|c| match c {
            Cell::Int(v) => Some(*v),
            _ => None,
        }))),
        CellType::Float64 => Arc::new(Float64Array::from_iter(cells.map(|c| match c {
            Cell::Float(v) => Some(*v),
            _ => None,
        }))),
        CellType::Boolean => Arc::new(BooleanArray::from_iter(cells.map(|c| match c {
            Cell::Bool(v) => Some(*v),
            _ => None,
        }))),
    }
}

/// A cell as JSON (`null` for a null).
pub fn write_json_cell(out: &mut Vec<u8>, cell: &Cell) {
    let written = match cell {
        Cell::Null => {
            out.extend_from_slice(b"null");
            Ok(())
        }
        Cell::Str(v) => serde_json::to_writer(&mut *out, v),
        Cell::Int(v) => serde_json::to_writer(&mut *out, v),
        Cell::Float(v) => serde_json::to_writer(&mut *out, v),
        Cell::Bool(v) => serde_json::to_writer(&mut *out, v),
    };
    written.expect("cells serialize");
}

/// The Arrow type of a column of `cells`: that of its first value
/// (text where every cell is null). A cell of another type is written as
/// null.
fn column(cells: &[Cell]) -> (DataType, ArrayRef) {
    let kind = match cells.iter().find(|c| !matches!(c, Cell::Null)) {
        Some(Cell::Int(_)) => CellType::Int64,
        Some(Cell::Float(_)) => CellType::Float64,
        Some(Cell::Bool(_)) => CellType::Boolean,
        _ => CellType::Utf8,
    };
    (arrow_type(kind), cells_array(cells.iter(), kind))
}

/// One Parquet file: `id`, then each named column (as many cells as ids).
pub fn parquet_part(ids: &[&str], columns: &[(&str, Vec<Cell>)]) -> Result<Vec<u8>, ParquetError> {
    let mut fields = vec![Field::new("id", DataType::Utf8, false)];
    let mut arrays: Vec<ArrayRef> = vec![Arc::new(StringArray::from(ids.to_vec()))];
    for (name, cells) in columns {
        if cells.len() != ids.len() {
            return Err(ParquetError::General(format!(
                "column {name} has {} values for {} ids",
                cells.len(),
                ids.len()
            )));
        }
        let (kind, array) = column(cells);
        fields.push(Field::new(*name, kind, true));
        arrays.push(array);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?;
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out)
}

/// Format of a job's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Apache Parquet, one file per batch.
    Parquet,
    /// JSON lines, one file per batch: one object per row, keys in column
    /// order.
    Jsonl,
}

impl Format {
    /// The parts' file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Jsonl => "jsonl",
        }
    }
}

/// A column of vectors: `dim` values a row, row-major.
#[derive(Debug, Clone, Copy)]
pub struct Vectors<'a> {
    /// The column's name.
    pub name: &'a str,
    /// Values per row.
    pub dim: usize,
    /// Every row's values, one row after the other.
    pub values: &'a [f32],
}

/// The Arrow schema of every Parquet part of rows with `vectors` (their
/// name and width) and the kept `columns`: `id` (text), the vectors (a
/// fixed-size list of f32), then the columns; `metadata` in the schema.
pub fn vector_schema(
    vectors: &str,
    dim: usize,
    columns: &[Column],
    metadata: &[(&str, &str)],
) -> Schema {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let mut fields = vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(vectors, DataType::FixedSizeList(item, dim as i32), false),
    ];
    fields.extend(
        columns
            .iter()
            .map(|c| Field::new(&c.name, arrow_type(c.cells), true)),
    );
    let metadata = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    Schema::new(fields).with_metadata(metadata.collect::<std::collections::HashMap<_, _>>())
}

/// One part of `rows` in `format`: each row's id, its vector, then its
/// cells of the kept `columns` (in [`Row::extra`]'s order). In Parquet,
/// `metadata` is in the schema and the file's key-value metadata; ids and
/// vectors are written without a dictionary (each id is unique; a
/// dictionary of floats only costs time) and vector values without
/// statistics, while kept columns keep the writer's defaults.
pub fn vector_part(
    format: Format,
    rows: &[Row],
    vectors: Vectors<'_>,
    columns: &[Column],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, ParquetError> {
    if vectors.values.len() != rows.len() * vectors.dim {
        return Err(ParquetError::General(format!(
            "{} values for {} rows of {}",
            vectors.values.len(),
            rows.len(),
            vectors.dim
        )));
    }
    match format {
        Format::Jsonl => Ok(jsonl_vector_part(rows, vectors, columns)),
        Format::Parquet => parquet_vector_part(rows, vectors, columns, metadata),
    }
}

fn parquet_vector_part(
    rows: &[Row],
    vectors: Vectors<'_>,
    columns: &[Column],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, ParquetError> {
    use arrow_array::{FixedSizeListArray, Float32Array};
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    use parquet::schema::types::ColumnPath;

    let schema = Arc::new(vector_schema(vectors.name, vectors.dim, columns, metadata));
    let DataType::FixedSizeList(item, dim) = schema.field(1).data_type().clone() else {
        unreachable!("the vectors are a fixed-size list")
    };
    let values = Arc::new(Float32Array::from(vectors.values.to_vec())) as ArrayRef;
    let mut arrays = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.id.as_str()),
        )) as ArrayRef,
        Arc::new(FixedSizeListArray::try_new(item, dim, values, None)?) as ArrayRef,
    ];
    for (c, column) in columns.iter().enumerate() {
        arrays.push(cells_array(
            rows.iter().map(|row| &row.extra[c]),
            column.cells,
        ));
    }
    let batch = RecordBatch::try_new(schema.clone(), arrays)?;
    let values = ColumnPath::new(vec![vectors.name.to_owned(), "list".into(), "item".into()]);
    let props = WriterProperties::builder()
        .set_column_dictionary_enabled(ColumnPath::from("id"), false)
        .set_column_dictionary_enabled(values.clone(), false)
        .set_column_statistics_enabled(values, EnabledStatistics::None)
        .set_key_value_metadata(Some(
            metadata
                .iter()
                .map(|(k, v)| KeyValue::new((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out)
}

/// JSON lines with the keys in column order: `id`, the vectors, then the
/// kept columns.
fn jsonl_vector_part(rows: &[Row], vectors: Vectors<'_>, columns: &[Column]) -> Vec<u8> {
    fn put<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
        serde_json::to_writer(&mut *out, value).expect("values serialize");
    }
    let dim = vectors.dim;
    let mut out = Vec::with_capacity(rows.len() * (dim * 12 + 32));
    for (i, row) in rows.iter().enumerate() {
        out.extend_from_slice(b"{\"id\":");
        put(&mut out, &row.id);
        out.push(b',');
        put(&mut out, vectors.name);
        out.push(b':');
        put(&mut out, &vectors.values[i * dim..(i + 1) * dim]);
        for (column, cell) in columns.iter().zip(&row.extra) {
            out.push(b',');
            put(&mut out, &column.name);
            out.push(b':');
            write_json_cell(&mut out, cell);
        }
        out.extend_from_slice(b"}\n");
    }
    out
}

/// The `id` column of every Parquet part in `folder`, part after part.
pub fn parquet_ids(folder: &std::path::Path) -> Result<Vec<String>, ParquetError> {
    let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| ParquetError::External(Box::new(e)))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    names.sort();
    let mut ids = Vec::new();
    for path in names {
        let file = std::fs::File::open(&path).map_err(|e| ParquetError::External(Box::new(e)))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?
            .build()?;
        for batch in reader {
            let batch = batch?;
            let column = batch
                .column_by_name("id")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| {
                    ParquetError::General(format!("{}: no text id column", path.display()))
                })?;
            ids.extend(column.iter().map(|v| v.unwrap_or_default().to_owned()));
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_typed_by_their_values_and_ids_read_back() {
        let dir = std::env::temp_dir().join(format!("flotilla-parts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let part = parquet_part(
            &["a", "b"],
            &[
                ("n", vec![Cell::Int(3), Cell::Null]),
                ("name", vec![Cell::Null, Cell::Str("x".into())]),
            ],
        )
        .unwrap();
        std::fs::write(dir.join("batch-00000001.parquet"), &part).unwrap();
        std::fs::write(
            dir.join("batch-00000000.parquet"),
            parquet_part(&["z"], &[]).unwrap(),
        )
        .unwrap();
        assert_eq!(parquet_ids(&dir).unwrap(), vec!["z", "a", "b"]);
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(dir.join("batch-00000001.parquet")).unwrap(),
        )
        .unwrap();
        let schema = reader.schema().clone();
        assert_eq!(schema.field(1).data_type(), &DataType::Int64);
        assert_eq!(schema.field(2).data_type(), &DataType::Utf8);
        assert!(
            parquet_part(&["a"], &[("n", vec![])]).is_err(),
            "lengths must match"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn row(id: &str, extra: Vec<Cell>) -> Row {
        Row {
            at: crate::RowAt { shard: 0, line: 1 },
            id: id.into(),
            text: String::new(),
            extra,
        }
    }

    /// Ids and vectors are written without a dictionary (each id is
    /// unique; a dictionary of floats only costs time), and vector values
    /// without statistics; a kept column keeps both, and the metadata is
    /// in the schema and the file.
    #[test]
    fn vector_parts_skip_dictionaries_and_value_statistics_but_keep_metadata() {
        use parquet::basic::Encoding;
        use parquet::file::reader::FileReader;
        let columns = vec![Column::new("lang", CellType::Utf8)];
        let rows: Vec<Row> = (0..50)
            .map(|i| row(&format!("id-{i}"), vec![Cell::Str("en".into())]))
            .collect();
        let values = vec![0.5f32; 50 * 2];
        let vectors = Vectors {
            name: "vec",
            dim: 2,
            values: &values,
        };
        let meta = [("k", "v")];
        let bytes = vector_part(Format::Parquet, &rows, vectors, &columns, &meta).unwrap();
        let reader =
            parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(bytes)).unwrap();
        let kv = reader
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap();
        assert!(
            kv.iter()
                .any(|e| e.key == "k" && e.value.as_deref() == Some("v"))
        );
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
        assert!(!dictionary("id"));
        assert!(!dictionary("vec.list.item"));
        assert!(dictionary("lang"), "a kept column keeps the default");
        assert!(!statistics("vec.list.item"));
        assert!(statistics("id"), "ids keep their statistics");
        let short = Vectors {
            values: &values[1..],
            ..vectors
        };
        assert!(vector_part(Format::Jsonl, &rows, short, &columns, &meta).is_err());
    }

    #[test]
    fn jsonl_parts_keep_the_column_order_and_write_nulls() {
        let columns = vec![Column::new("n", CellType::Int64)];
        let rows = [row("a", vec![Cell::Int(3)]), row("b", vec![Cell::Null])];
        let vectors = Vectors {
            name: "v",
            dim: 1,
            values: &[0.5, 1.0],
        };
        let bytes = vector_part(Format::Jsonl, &rows, vectors, &columns, &[]).unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"id\":\"a\",\"v\":[0.5],\"n\":3}\n{\"id\":\"b\",\"v\":[1.0],\"n\":null}\n"
        );
    }
}
