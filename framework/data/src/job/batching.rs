//! How the rows of an input become batches with stable ids: windows of
//! rows read in input order, each sorted by length (when asked) and cut
//! into batches of a row count and an estimated token budget. The same
//! input and settings give the same batches, so a resumed job skips
//! exactly the ones written.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{BatchJobError, Row};
use crate::input::Input;
use crate::output::{ErrorLog, OutputError, RowError};
use crate::source::{Item, RowAt, Source};

/// How a job cuts its rows into batches. Batch ids depend on these
/// settings and the input only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Rows per batch at most (at least 1).
    pub size: usize,
    /// Rows per window sorted by text length before it is cut (0: no
    /// sort, batches in input order). Sorted batches pad less.
    pub sort_window: usize,
    /// Estimated tokens per batch at most, padding included (a row's
    /// estimate: 2 + one per four bytes of text).
    pub max_tokens: Option<usize>,
}

impl Batching {
    /// Batches of `size` rows in input order.
    pub fn rows(size: usize) -> Self {
        Self {
            size,
            sort_window: 0,
            max_tokens: None,
        }
    }

    /// Rows a window holds.
    fn window_rows(&self) -> usize {
        if self.sort_window == 0 {
            self.size
        } else {
            self.sort_window.max(self.size)
        }
    }

    /// A window's rows, sorted by length (stably: equal lengths keep input
    /// order) unless windows are off, cut into batches.
    pub(crate) fn cut(&self, mut rows: Vec<Row>) -> Vec<Vec<Row>> {
        if self.sort_window > 0 {
            rows.sort_by_key(|r| r.text.len());
        }
        let mut out = Vec::new();
        let mut batch: Vec<Row> = Vec::new();
        let mut longest = 0;
        for row in rows {
            let tokens = estimated_tokens(&row.text);
            let would = (batch.len() + 1) * longest.max(tokens);
            let over = self.max_tokens.is_some_and(|t| would > t);
            if batch.len() == self.size || (over && !batch.is_empty()) {
                out.push(std::mem::take(&mut batch));
                longest = 0;
            }
            longest = longest.max(tokens);
            batch.push(row);
        }
        if !batch.is_empty() {
            out.push(batch);
        }
        out
    }
}

/// Bytes of a window at most, whatever its row count: the driver's memory
/// stays bounded on long texts.
const WINDOW_BYTES: usize = 16 << 20;

/// A row's tokens as the token budget estimates them: its two special
/// tokens and one per four bytes.
fn estimated_tokens(text: &str) -> usize {
    2 + text.len() / 4
}

/// Hands out the batches of a source with ids 0, 1, 2, …; invalid rows go
/// to the errors file as they are read.
pub(crate) struct Batcher {
    source: Source,
    input: Arc<Input>,
    batching: Batching,
    /// Batches cut from the current window, not yet handed out.
    ready: VecDeque<Vec<Row>>,
    next_id: u64,
    exhausted: bool,
}

impl Batcher {
    pub(crate) fn new(source: Source, input: Arc<Input>, batching: Batching) -> Self {
        Self {
            source,
            input,
            batching,
            ready: VecDeque::new(),
            next_id: 0,
            exhausted: false,
        }
    }

    /// Whether every batch has been handed out.
    pub(crate) fn is_done(&self) -> bool {
        self.exhausted && self.ready.is_empty()
    }

    /// The next batch and its id, `None` at the end of the input.
    pub(crate) async fn next(
        &mut self,
        errors: &mut ErrorLog<'_>,
    ) -> Result<Option<(u64, Vec<Row>)>, BatchJobError> {
        if self.ready.is_empty() && !self.exhausted {
            let rows = self.window(errors).await?;
            self.ready.extend(self.batching.cut(rows));
        }
        let Some(batch) = self.ready.pop_front() else {
            return Ok(None);
        };
        let id = self.next_id;
        self.next_id += 1;
        Ok(Some((id, batch)))
    }

    /// Reads the next window of valid rows.
    async fn window(&mut self, errors: &mut ErrorLog<'_>) -> Result<Vec<Row>, BatchJobError> {
        let (limit, mut bytes) = (self.batching.window_rows(), 0usize);
        let mut rows = Vec::new();
        while !self.exhausted && rows.len() < limit && bytes < WINDOW_BYTES {
            match self.source.next().await {
                None => self.exhausted = true,
                Some(Err(source)) => {
                    return Err(BatchJobError::Read {
                        input: self.input.spec.clone(),
                        source,
                    });
                }
                Some(Ok(Item::Invalid { at, id, reason })) => {
                    errors.record(&self.row_error(at, id, reason)).await?;
                }
                Some(Ok(Item::Row {
                    at,
                    id,
                    text,
                    extra,
                })) => {
                    bytes += text.len();
                    rows.push(Row {
                        at,
                        id,
                        text,
                        extra,
                    });
                }
            }
        }
        Ok(rows)
    }

    /// The errors-file line of the row at `at`.
    /// Records each of `rows` in `errors`, refused for `reason`.
    pub(crate) async fn refuse(
        &self,
        errors: &mut ErrorLog<'_>,
        rows: &[Row],
        reason: &str,
    ) -> Result<(), OutputError> {
        for row in rows {
            let error = self.row_error(row.at, Some(row.id.clone()), reason.to_owned());
            errors.record(&error).await?;
        }
        Ok(())
    }

    pub(crate) fn row_error(&self, at: RowAt, id: Option<String>, reason: String) -> RowError {
        RowError {
            shard: self
                .input
                .shards
                .get(at.shard as usize)
                .map(|s| s.name.clone())
                .unwrap_or_default(),
            line: at.line,
            id,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(texts: &[&str]) -> Vec<Row> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| Row {
                at: RowAt {
                    shard: 0,
                    line: i as u64,
                },
                id: format!("r{i}"),
                text: (*t).to_owned(),
                extra: Vec::new(),
            })
            .collect()
    }

    fn ids(batches: &[Vec<Row>]) -> Vec<Vec<&str>> {
        batches
            .iter()
            .map(|b| b.iter().map(|r| r.id.as_str()).collect())
            .collect()
    }

    #[test]
    fn without_a_window_batches_keep_input_order() {
        let cut = Batching::rows(2);
        assert_eq!(cut.window_rows(), 2);
        let b = cut.cut(rows(&["ccc", "a", "bb"]));
        assert_eq!(ids(&b), [vec!["r0", "r1"], vec!["r2"]]);
    }

    #[test]
    fn a_window_is_sorted_by_length_stably_and_cut_the_same_every_time() {
        let cut = Batching {
            sort_window: 8,
            ..Batching::rows(2)
        };
        let texts = ["cccc", "a", "bb", "dd", "e", "ffffff"];
        let b = cut.cut(rows(&texts));
        assert_eq!(
            ids(&b),
            [vec!["r1", "r4"], vec!["r2", "r3"], vec!["r0", "r5"]],
            "shortest first; equal lengths in input order"
        );
        assert_eq!(ids(&cut.cut(rows(&texts))), ids(&b), "deterministic");
    }

    #[test]
    fn a_token_budget_closes_batches_early_and_a_long_row_goes_alone() {
        let cut = Batching {
            size: 8,
            sort_window: 8,
            max_tokens: Some(12),
        };
        // Estimates: 2 + bytes / 4 → 3, 3, 4, 4, 27.
        let long = "x".repeat(100);
        let b = cut.cut(rows(&["aaaa", "bbbb", "cccccccc", "dddddddd", &long]));
        assert_eq!(
            ids(&b),
            [vec!["r0", "r1", "r2"], vec!["r3"], vec!["r4"]],
            "3 rows × 4 ≤ 12; a fourth would make 16; the long row alone"
        );
    }
}
