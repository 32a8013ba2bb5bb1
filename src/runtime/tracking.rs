//! Client-side caching, the part the storage engine and the handlers call: which client is
//! running the command on this thread, and the keys it modified.
//!
//! The tracking table itself and the CLIENT TRACKING commands live in
//! `server::tracking`; this module sits under `storage` so the shard's write, delete,
//! expiry and flush paths can report a modified key (`modified`, `flushed`) without
//! knowing about clients. What it costs when no client tracks (the default): one relaxed
//! load of a process-wide counter and a branch per write; nothing is queued.
//!
//! The queue is thread-local: a key is modified on the thread that holds its shard, and
//! that thread hands the queue to `server::tracking` right after the command's handler
//! (or at the end of its round for background expiry), while it still holds the shard, so
//! a read recorded for the same key can never slip between the write and its invalidation.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Connections with CLIENT TRACKING on, server-wide (INFO `tracking_clients`).
static TRACKING_CLIENTS: AtomicUsize = AtomicUsize::new(0);

/// Whether any client tracks keys: the one branch on the hot paths.
#[inline]
pub fn active() -> bool {
    TRACKING_CLIENTS.load(Ordering::Relaxed) > 0
}

pub fn tracking_clients() -> usize {
    TRACKING_CLIENTS.load(Ordering::Relaxed)
}

pub fn client_enabled() {
    TRACKING_CLIENTS.fetch_add(1, Ordering::Relaxed);
}

pub fn client_disabled() {
    TRACKING_CLIENTS.fetch_sub(1, Ordering::Relaxed);
}

/// The client whose command runs on this thread: its id (NOLOOP compares writers with
/// it) and whether the keys its read-only commands read are to be remembered (tracking
/// on, not BCAST, and OPTIN/OPTOUT with CLIENT CACHING agreeing). `id` 0: no client
/// (background expiry, or nobody tracks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    pub id: u64,
    pub track_reads: bool,
}

thread_local! {
    static CURRENT: Cell<Caller> = const { Cell::new(Caller { id: 0, track_reads: false }) };
    static MODIFIED: RefCell<Vec<(Vec<u8>, u64)>> = const { RefCell::new(Vec::new()) };
    static FLUSHED: Cell<u64> = const { Cell::new(0) };
}

pub fn current() -> Caller {
    CURRENT.with(|c| c.get())
}

/// Sets the running client and returns the previous one (to restore).
pub fn set_current(caller: Caller) -> Caller {
    CURRENT.with(|c| c.replace(caller))
}

/// A write to `key` (any db: Redis's tracking table ignores the db). One branch when no
/// client tracks.
#[inline]
pub fn modified(key: &[u8]) {
    if active() {
        queue(key);
    }
}

#[cold]
fn queue(key: &[u8]) {
    let by = current().id;
    MODIFIED.with(|m| m.borrow_mut().push((key.to_vec(), by)));
}

/// A FLUSHDB or FLUSHALL ran (one per command, however many shards and dbs it empties).
#[inline]
pub fn flushed() {
    if active() {
        FLUSHED.with(|f| f.set(current().id.max(1)));
    }
}

/// The keys modified on this thread since the last call, with the client that modified
/// each (0: none), and whether a flush ran.
pub fn take() -> (Vec<(Vec<u8>, u64)>, bool) {
    let keys = MODIFIED.with(|m| std::mem::take(&mut *m.borrow_mut()));
    let flushed = FLUSHED.with(|f| f.replace(0)) != 0;
    (keys, flushed)
}

/// Whether anything is queued (the end-of-round check; no allocation).
pub fn pending() -> bool {
    MODIFIED.with(|m| !m.borrow().is_empty()) || FLUSHED.with(|f| f.get() != 0)
}
