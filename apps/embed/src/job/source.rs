//! Streaming JSONL input: one `{"id": …, "text": …}` object per line, read
//! line by line, never held whole. Malformed lines and repeated ids are
//! reported with their line number; the first occurrence of an id wins.

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

/// Reads rows from a JSONL file.
pub struct JsonlSource {
    lines: std::io::Lines<BufReader<std::fs::File>>,
    line: u64,
    id_field: String,
    text_field: String,
    /// 128-bit digests of the ids seen, to refuse repeats in flat memory.
    seen: HashSet<u128>,
}

impl JsonlSource {
    /// Opens `path`, reading ids from `id_field` and texts from `text_field`.
    pub fn open(path: &Path, id_field: &str, text_field: &str) -> std::io::Result<Self> {
        Ok(Self {
            lines: BufReader::new(std::fs::File::open(path)?).lines(),
            line: 0,
            id_field: id_field.to_owned(),
            text_field: text_field.to_owned(),
            seen: HashSet::new(),
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
        let digest = Sha256::digest(id.as_bytes());
        let key = u128::from_le_bytes(digest[..16].try_into().expect("16 bytes"));
        if !self.seen.insert(key) {
            return invalid(
                Some(id),
                "duplicate id; the first occurrence was kept".into(),
            );
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

#[cfg(test)]
mod tests {
    use super::*;

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
