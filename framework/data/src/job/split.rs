//! Batches split to find the rows that fail them. A batch that fails on
//! every attempt (each actor it is given answers with an error, or
//! crashes on it) is cut in halves, and each half is sent with one
//! attempt; a half that fails is cut again, and a single row is given two
//! attempts before it is refused. The good rows are written as pieces of
//! their batch, the failing ones go to the errors file: a bad row costs
//! at most ⌈log2(batch)⌉ + 1 sends after its batch's own attempts.
//!
//! ```text
//! batch 42 (256 rows) gave up ─► 0..128 ✓ (piece)   128..256 ✗ ─► 128..192 ✓  192..256 ✗ ─► … ─► row 200 ✗✗ ─► errors file
//! ```
//!
//! Pieces are named by their batch and row range, so a rerun finds the
//! rows of a split batch already written and sends only the others
//! ([`uncovered`]). The crashes charged to a batch and its pieces cost
//! the actors' restart intensity once: later ones are forgiven, as many
//! as one bad row can cause ([`Splits::forgive`]). An actor that crashes
//! on every batch is not bad input: past that many, its crashes count
//! again and its restart limit stops the job. Plain bookkeeping, no I/O.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use flotilla::pipeline::BatchId;

/// Pipeline ids of pieces have this bit set; a job's batch ids never do.
const PIECE: u64 = 1 << 63;

/// A piece of a batch: which batch, which of its rows (in its order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The batch's id.
    pub batch: u64,
    /// Its rows within the batch.
    pub rows: Range<usize>,
}

/// The pieces in flight and the crashes charged to each batch.
#[derive(Debug, Default)]
pub(crate) struct Splits {
    next: u64,
    pieces: HashMap<BatchId, Piece>,
    /// The batch each piece ever made belongs to, kept after the piece is
    /// done: a crash may be reported after its piece was split.
    origin: HashMap<BatchId, u64>,
    /// Crashes charged per batch (its pieces included).
    crashes: HashMap<u64, u32>,
    /// Crashes of one batch forgiven after its first.
    forgivable: u32,
    /// Batches whose answer could not be read: given up, they fail the
    /// job rather than being split (their rows are not the cause).
    unreadable: HashSet<BatchId>,
    /// Batches and pieces split so far.
    pub split: u64,
}

impl Splits {
    /// Bookkeeping for batches of at most `batch_rows` rows, each sent at
    /// most `attempts` times before it is split: a batch's crashes after
    /// its first are forgiven up to what one bad row can cause, its
    /// attempts and ⌈log2(batch_rows)⌉ + 1 sends of pieces.
    pub fn new(batch_rows: usize, attempts: u32) -> Self {
        Self {
            forgivable: attempts + batch_rows.next_power_of_two().trailing_zeros() + 1,
            ..Self::default()
        }
    }

    /// A new piece of `batch`, its rows `rows`: its pipeline id.
    pub fn piece(&mut self, batch: u64, rows: Range<usize>) -> BatchId {
        let id = BatchId(PIECE | self.next);
        self.next += 1;
        self.pieces.insert(id, Piece { batch, rows });
        self.origin.insert(id, batch);
        id
    }

    /// The piece `id` is done with (written, refused or split).
    pub fn finish(&mut self, id: BatchId) -> Option<Piece> {
        self.unreadable.remove(&id);
        self.pieces.remove(&id)
    }

    /// An answer to `id` could not be read: if it is given up, its rows
    /// are not the cause.
    pub fn unreadable(&mut self, id: BatchId) {
        self.unreadable.insert(id);
    }

    /// Whether `id`, given up, is split to isolate its failing rows (an
    /// answer of it could be read each time).
    pub fn splittable(&self, id: BatchId) -> bool {
        !self.unreadable.contains(&id)
    }

    /// The batch the pipeline id `id` belongs to: itself, or the batch
    /// it is a piece of.
    pub fn batch_of(&self, id: BatchId) -> u64 {
        self.origin.get(&id).copied().unwrap_or(id.0)
    }

    /// A crash was charged to `id`: whether to forgive it to the actor's
    /// supervisor. The first charged to its batch (and its pieces) is
    /// not; the next are the same bad input's doing, up to as many as one
    /// bad row causes; past those, the actor is at fault.
    pub fn forgive(&mut self, id: BatchId) -> bool {
        let crashes = self.crashes.entry(self.batch_of(id)).or_default();
        *crashes += 1;
        *crashes > 1 && *crashes <= 1 + self.forgivable
    }

    /// The halves of `rows` (at least two rows) of `batch` that failed,
    /// each with the attempts it is given: one, or two for a single row.
    pub fn halves(&mut self, batch: u64, rows: Range<usize>) -> [(BatchId, Range<usize>, u32); 2] {
        debug_assert!(rows.len() >= 2);
        self.split += 1;
        let mid = rows.start + rows.len() / 2;
        [rows.start..mid, mid..rows.end].map(|half| {
            let attempts = if half.len() == 1 { 2 } else { 1 };
            (self.piece(batch, half.clone()), half, attempts)
        })
    }
}

/// The ranges of rows `0..n` that `written` (sorted, disjoint) leaves
/// out, in order.
pub(crate) fn uncovered(n: usize, written: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut gaps = Vec::new();
    let mut at = 0;
    for r in written {
        let start = r.start.min(n);
        if start > at {
            gaps.push(at..start);
        }
        at = at.max(r.end.min(n));
    }
    if at < n {
        gaps.push(at..n);
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splitting down to one bad row of a batch of `n`: the sends of
    /// pieces holding it, and the pieces the others end up in.
    fn isolate(n: usize, bad: usize) -> (u32, Vec<Range<usize>>) {
        let mut s = Splits::default();
        let mut sends = 0;
        let mut good = Vec::new();
        let mut failing = vec![(BatchId(9), 0..n)];
        while let Some((_, rows)) = failing.pop() {
            if rows.len() == 1 {
                continue;
            }
            for (id, half, attempts) in s.halves(9, rows) {
                assert_eq!(s.pieces[&id].rows, half);
                if half.contains(&bad) {
                    sends += attempts;
                    failing.push((id, half));
                } else {
                    good.push(half);
                }
            }
        }
        good.sort_by_key(|r| r.start);
        (sends, good)
    }

    #[test]
    fn a_bad_row_costs_at_most_log2_of_its_batch_plus_one_sends() {
        for n in [2usize, 3, 7, 64, 100, 256, 1000] {
            for bad in [0, n / 3, n - 1] {
                let (sends, good) = isolate(n, bad);
                let bound = n.next_power_of_two().trailing_zeros() + 1;
                assert!(sends <= bound, "n {n} bad {bad}: {sends} > {bound}");
                let mut rows: Vec<usize> = good.into_iter().flatten().collect();
                rows.push(bad);
                rows.sort();
                assert_eq!(rows, (0..n).collect::<Vec<_>>(), "every other row once");
            }
        }
    }

    #[test]
    fn pieces_are_told_from_batches_and_a_batch_is_charged_one_crash() {
        let mut s = Splits::new(10, 3);
        let [(a, _, _), (b, _, _)] = s.halves(3, 0..10);
        assert_eq!(
            (s.batch_of(a), s.batch_of(b), s.batch_of(BatchId(3))),
            (3, 3, 3)
        );
        assert_ne!(a, b);
        assert!(!s.pieces.contains_key(&BatchId(3)));
        assert!(!s.forgive(BatchId(3)), "the first is charged");
        assert!(s.forgive(a), "its piece: the same batch");
        assert!(!s.forgive(BatchId(4)));
        // 3 attempts, ⌈log2 10⌉ = 4 levels of pieces, a single row's
        // second send: 8 forgiven in all, then charged again.
        for _ in 0..7 {
            assert!(s.forgive(b));
        }
        assert!(!s.forgive(b), "an actor crashing on everything");
        assert_eq!(s.finish(a).unwrap().rows, 0..5);
        assert!(!s.pieces.contains_key(&a));
        // A crash reported after its piece was split is still its batch's.
        assert_eq!(s.batch_of(a), 3);
        assert_eq!(s.split, 1);
        s.unreadable(b);
        assert!(!s.splittable(b));
        assert!(s.splittable(BatchId(3)));
        s.finish(b);
        assert!(s.splittable(b), "forgotten once done");
    }

    #[test]
    #[allow(
        clippy::single_range_in_vec_init,
        reason = "lists of row ranges, not ranges to collect"
    )]
    fn uncovered_rows_are_the_gaps_between_pieces() {
        assert_eq!(uncovered(10, &[]), [0..10]);
        assert!(uncovered(10, &[0..10]).is_empty());
        assert_eq!(uncovered(10, &[2..4, 6..7]), [0..2, 4..6, 7..10]);
        assert_eq!(uncovered(10, &[0..5, 5..9]), [9..10]);
        assert_eq!(uncovered(4, &[2..8]), [0..2], "a piece past the end");
    }
}
