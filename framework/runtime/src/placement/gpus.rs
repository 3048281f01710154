//! The GPUs of one node and the actors holding them.
//!
//! An actor that runs on a GPU takes a [`GpuSlot`] from its node's
//! [`GpuSlots`]: the GPU with the fewest holders, the lowest index on a
//! tie. On a node with N GPUs, N actors started one after another get GPUs
//! 0 to N−1, never all GPU 0; an actor restarted after a failure gets the
//! GPU its predecessor freed. The slot is given back when dropped, so an
//! actor holds it for as long as its state lives. `node status` lists the
//! holders (the control service reads [`GpuSlots::report`]).
//!
//! ```text
//! actor a ── take("a") ──► GPU 0   (holders [1, 0])
//! actor b ── take("b") ──► GPU 1   (holders [1, 1])
//! actor a stops ─ drop ──► GPU 0   (holders [0, 1])
//! actor c ── take("c") ──► GPU 0
//! ```
//!
//! A handle passed to whoever hands out GPUs; not a global.

use std::sync::{Arc, Mutex};

pub use flotilla_proto::control::GpuReport;

/// A node's GPUs and who holds each. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct GpuSlots(Arc<Mutex<Holders>>);

/// Per GPU, the names of its holders, in the order they took it.
#[derive(Debug, Default)]
struct Holders(Vec<Vec<String>>);

impl Holders {
    /// The GPU to hand out next: fewest holders, lowest index on a tie.
    fn least_held(&self) -> Option<usize> {
        (0..self.0.len()).min_by_key(|&i| (self.0[i].len(), i))
    }
}

impl GpuSlots {
    /// `count` GPUs, none held.
    pub fn new(count: usize) -> Self {
        let slots = Self::default();
        slots.set_count(count);
        slots
    }

    /// Sets how many GPUs the node has (once known, when it starts).
    /// Holders of GPUs past a smaller count keep their slot until they drop
    /// it, but are no longer listed.
    pub fn set_count(&self, count: usize) {
        self.lock().0.resize_with(count, Vec::new);
    }

    /// How many GPUs the node has.
    pub fn count(&self) -> usize {
        self.lock().0.len()
    }

    /// Takes the least-held GPU for `holder`; `None` when the node has no
    /// GPU.
    pub fn take(&self, holder: impl Into<String>) -> Option<GpuSlot> {
        let holder = holder.into();
        let mut holders = self.lock();
        let index = holders.least_held()?;
        holders.0[index].push(holder.clone());
        Some(GpuSlot {
            slots: self.clone(),
            index,
            holder,
        })
    }

    /// Each GPU and its holders, by index.
    pub fn report(&self) -> Vec<GpuReport> {
        self.lock()
            .0
            .iter()
            .enumerate()
            .map(|(index, holders)| GpuReport {
                index: index as u32,
                holders: holders.clone(),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Holders> {
        // A poisoned lock only means a holder panicked while listed: the
        // lists are intact.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One GPU held by one actor; given back when dropped.
#[derive(Debug)]
pub struct GpuSlot {
    slots: GpuSlots,
    index: usize,
    holder: String,
}

impl GpuSlot {
    /// The GPU's index on its node (CUDA's device ordinal).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The name the holder took it under.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

impl Drop for GpuSlot {
    fn drop(&mut self) {
        let mut holders = self.slots.lock();
        if let Some(list) = holders.0.get_mut(self.index)
            && let Some(at) = list.iter().position(|h| *h == self.holder)
        {
            list.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(slots: &GpuSlots) -> Vec<usize> {
        slots.report().iter().map(|r| r.holders.len()).collect()
    }

    #[test]
    fn actors_spread_over_the_gpus_in_index_order() {
        let slots = GpuSlots::new(4);
        let taken: Vec<GpuSlot> = (0..4)
            .map(|i| slots.take(format!("a{i}")).unwrap())
            .collect();
        assert_eq!(
            taken.iter().map(GpuSlot::index).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        // A fifth shares the least-held GPU, the lowest index on a tie.
        let fifth = slots.take("a4").unwrap();
        assert_eq!(fifth.index(), 0);
        assert_eq!(held(&slots), [2, 1, 1, 1]);
    }

    #[test]
    fn a_dropped_slot_is_the_next_one_handed_out() {
        let slots = GpuSlots::new(3);
        let a = slots.take("a").unwrap();
        let b = slots.take("b").unwrap();
        let _c = slots.take("c").unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        drop(b);
        assert_eq!(held(&slots), [1, 0, 1]);
        let restarted = slots.take("b'").unwrap();
        assert_eq!(restarted.index(), 1);
        assert_eq!(slots.report()[1].holders, ["b'"]);
    }

    #[test]
    fn holders_with_the_same_name_give_back_one_place_each() {
        let slots = GpuSlots::new(1);
        let first = slots.take("embedder").unwrap();
        let second = slots.take("embedder").unwrap();
        assert_eq!(held(&slots), [2]);
        drop(first);
        assert_eq!(held(&slots), [1]);
        drop(second);
        assert_eq!(held(&slots), [0]);
    }

    #[test]
    fn a_node_without_gpus_hands_out_none() {
        let slots = GpuSlots::default();
        assert!(slots.take("a").is_none());
        slots.set_count(2);
        assert_eq!(slots.take("a").map(|s| s.index()), Some(0));
    }

    #[test]
    fn a_slot_past_a_smaller_count_drops_quietly() {
        let slots = GpuSlots::new(2);
        let _a = slots.take("a").unwrap();
        let b = slots.take("b").unwrap();
        slots.set_count(1);
        drop(b);
        assert_eq!(held(&slots), [1]);
    }
}
