//! An allocator that measures, per thread, how many heap bytes a piece of
//! code has alive at its peak: what the decoder fuzz tests bound. A test
//! binary installs it as its global allocator; the counting is two
//! thread-local cells per allocation, on top of the wrapped allocator.
//!
//! ```
//! use flotilla_objects::meter::{Metered, peak_during};
//!
//! #[global_allocator]
//! static ALLOCATOR: Metered = Metered::system();
//!
//! let (v, peak) = peak_during(|| vec![0u8; 4096]);
//! assert_eq!(v.len(), 4096);
//! assert!(peak >= 4096);
//! ```
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// A global allocator that passes every call to the system's and counts,
/// per thread, the bytes alive and their peak.
#[derive(Debug, Default)]
pub struct Metered(System);

impl Metered {
    /// The system allocator, metered.
    pub const fn system() -> Self {
        Self(System)
    }
}

// SAFETY: every call goes to the system allocator with the caller's
// pointer and layout unchanged; the counters are thread-local cells with
// constant initialisers, which neither allocate nor panic (`try_with`
// ignores a thread being torn down).
unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|live| {
            let now = live.get() + layout.size();
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
        // SAFETY: the caller's layout, passed on (the caller upholds
        // `alloc`'s contract).
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(layout.size())));
        // SAFETY: `ptr` was allocated by this allocator (so by the system's)
        // with `layout`, as the caller guarantees.
        unsafe { self.0.dealloc(ptr, layout) }
    }
}

/// Runs `f` on this thread and returns what it returned and the most heap
/// bytes it had alive at once beyond what was alive before it (0 unless
/// the program's global allocator is a [`Metered`]).
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, PEAK.with(Cell::get).saturating_sub(base))
}
