//! The per-command note of key lookups that feeds INFO's `keyspace_hits` /
//! `keyspace_misses` and the `keymiss` event (`server::keystats` owns the rule and the
//! counters; this part sits under `storage` so the shard's read entry points can write
//! the note without knowing about commands).
//!
//! How it works: before a keyed handler whose command has read keys, the dispatcher arms
//! the note (`arm`); the shard's read entry points (`Shard::get`, `get_in_place`,
//! `exists`, `get_collection`) append (index hash, found) for the lookup they just made,
//! after lazy expiry (an expired record is a miss, as in Redis, which expires first).
//! After the handler, the dispatcher settles the note against the command's read-key
//! positions and disarms it. Writes, deletes and background work record nothing, and
//! nothing is recorded while the note is disarmed (SCAN's TYPE filter, expiry sweeps).
//!
//! The hit and miss counters live here too, so a handler can count a lookup itself
//! (`read_now`) without depending on `server`.
//!
//! What it costs: one thread-local flag test per lookup; when armed, a push onto a
//! thread-local vector whose capacity is kept between commands (no allocation once a
//! command with that many lookups has run).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Capacity above which the note is given back after a command (one huge MGET must not
/// pin its memory for the thread's life).
const NOTE_RETAINED_MAX_ENTRIES: usize = 4096;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static NOTE: RefCell<Vec<(u64, bool)>> = const { RefCell::new(Vec::new()) };
    /// The event queue's length when the note was armed (with class `m` on): where the
    /// command's `keymiss` events belong (`events::notify_at`).
    static EVENT_MARK: Cell<usize> = const { Cell::new(0) };
}

/// Starts a note for the command about to run on this thread (clearing any earlier one).
pub fn arm() {
    NOTE.with(|n| n.borrow_mut().clear());
    if super::events::flags() & super::events::KEY_MISS != 0 {
        EVENT_MARK.with(|m| m.set(super::events::queued()));
    }
    ARMED.with(|a| a.set(true));
}

/// Whether a note is being taken on this thread.
#[inline]
pub fn armed() -> bool {
    ARMED.with(|a| a.get())
}

/// Notes that the lookup of the key whose (shard-masked) index hash is `hash` found it
/// (`found`) or not. Called by the shard's read entry points.
#[inline]
pub fn record(hash: u64, found: bool) {
    if armed() {
        NOTE.with(|n| n.borrow_mut().push((hash, found)));
    }
}

/// Ends the note and runs `f` on it (the lookups in the order they were made) and on
/// the event-queue position its `keymiss` events go to (meaningful when class `m` is on).
pub fn disarm<R>(f: impl FnOnce(&[(u64, bool)], &mut usize) -> R) -> R {
    ARMED.with(|a| a.set(false));
    let mut mark = EVENT_MARK.with(|m| m.get());
    NOTE.with(|n| {
        let mut n = n.borrow_mut();
        let r = f(&n, &mut mark);
        n.clear();
        if n.capacity() > NOTE_RETAINED_MAX_ENTRIES {
            n.shrink_to(NOTE_RETAINED_MAX_ENTRIES);
        }
        r
    })
}

/// Counter slots: each thread (worker) adds to its own cache line, so workers never
/// contend; INFO sums them. Threads beyond the count share slots (still exact: atomics).
const COUNTER_SLOTS: usize = 64;

#[repr(align(64))]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
}

static SLOTS: [Counters; COUNTER_SLOTS] = [const {
    Counters {
        hits: AtomicU64::new(0),
        misses: AtomicU64::new(0),
    }
}; COUNTER_SLOTS];
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % COUNTER_SLOTS;
}

/// Adds to this thread's hit and miss counters.
pub fn count(hits: u64, misses: u64) {
    let c = &SLOTS[SLOT.with(|s| *s)];
    if hits > 0 {
        c.hits.fetch_add(hits, Ordering::Relaxed);
    }
    if misses > 0 {
        c.misses.fetch_add(misses, Ordering::Relaxed);
    }
}

/// INFO `keyspace_hits`.
pub fn hits() -> u64 {
    SLOTS.iter().map(|c| c.hits.load(Ordering::Relaxed)).sum()
}

/// INFO `keyspace_misses`.
pub fn misses() -> u64 {
    SLOTS.iter().map(|c| c.misses.load(Ordering::Relaxed)).sum()
}

/// CONFIG RESETSTAT.
pub fn reset() {
    for c in &SLOTS {
        c.hits.store(0, Ordering::Relaxed);
        c.misses.store(0, Ordering::Relaxed);
    }
}

thread_local! {
    /// While a restartable run is active (`hold`): the hits and misses `read_now` counted,
    /// applied only if the run is kept (`release`).
    static HELD: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Holds `read_now`'s counts back until [`release`]: the run may be discarded and run again.
pub fn hold() {
    HELD.with(|h| h.set(Some((0, 0))));
}

/// Ends [`hold`]: the held counts are added if the run is kept (`keep`), else dropped.
pub fn release(keep: bool) {
    if let Some((hits, misses)) = HELD.with(|h| h.take()) {
        if keep {
            count(hits, misses);
        }
    }
}

/// Counts a read lookup at once and fires `keymiss` for a miss: for a handler whose read
/// lookups are not at its declared key positions (SORT's BY/GET patterns), whose command
/// therefore has no read rule in `server::keystats`.
pub fn read_now(db: u8, key: &[u8], found: bool) {
    let (h, m) = if found { (1, 0) } else { (0, 1) };
    let held = HELD.with(|c| {
        c.get().map(|(hits, misses)| {
            c.set(Some((hits + h, misses + m)));
        })
    });
    if held.is_none() {
        count(h, m);
    }
    if !found {
        super::events::notify(super::events::KEY_MISS, "keymiss", key, db);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Only lookups made while armed are noted, in order, and disarming empties the note.
    #[test]
    fn records_only_while_armed() {
        record(1, true);
        arm();
        record(2, false);
        record(3, true);
        assert_eq!(disarm(|n, _| n.to_vec()), vec![(2, false), (3, true)]);
        record(4, true);
        arm();
        assert!(disarm(|n, _| n.is_empty()));
    }
}
