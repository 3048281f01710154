//! Parquet parts of the columns an application defines: an `id` column
//! and any number of columns of [`Cell`]s, typed by their values, and the
//! ids read back from a folder of parts (to check a job's output).

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::errors::ParquetError;

use crate::source::{Cell, CellType};

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
}
