//! WATCH support: which keys of a shard some connection watches, and how often each was
//! touched (written, deleted, expired, flushed) since.
//!
//! The table holds only watched keys, so a shard nobody watches pays one `is_empty` test per
//! write and no memory. A connection registers a key on the shard that owns it and keeps the
//! `WatchMark` it got; EXEC, holding that shard, asks `changed`. Entries are reference-counted
//! by watchers (a connection watches a key once) and dropped with their last watcher.
//!
//! Redis 7's rule for a key that was already logically expired when watched: the deletion
//! of that expired key (lazy or active expiry, DEL, FLUSHDB) is not a change, so the first
//! touch that leaves the key absent is forgiven for such a watcher (`last_touch_absent`).
//! For any other watcher a key that has expired by EXEC time counts as changed even before
//! anything deleted it; the shard answers that part (`Shard::watch_changed`).

use super::Db;
use std::collections::HashMap;

/// What a watcher remembers of a key when it registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchMark {
    /// The key's touch count at WATCH time.
    pub touches: u64,
    /// The key existed but was logically expired at WATCH time.
    pub expired: bool,
}

#[derive(Debug, Default)]
struct Entry {
    touches: u64,
    watchers: u32,
    /// The latest touch left the key absent (a delete, an expiry, a flush).
    last_touch_absent: bool,
}

#[derive(Debug, Default)]
pub struct WatchTable {
    entries: HashMap<(Db, Vec<u8>), Entry>,
}

impl WatchTable {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// One more watcher of (db, key); returns its current touch count.
    pub fn register(&mut self, db: Db, key: &[u8]) -> u64 {
        let e = self.entries.entry((db, key.to_vec())).or_default();
        e.watchers += 1;
        e.touches
    }

    /// One watcher fewer; the entry goes with the last one. Unknown keys are ignored (a
    /// release may arrive for a table that was rebuilt, e.g. never registered).
    pub fn release(&mut self, db: Db, key: &[u8]) {
        let k = (db, key.to_vec());
        if let Some(e) = self.entries.get_mut(&k) {
            e.watchers = e.watchers.saturating_sub(1);
            if e.watchers == 0 {
                self.entries.remove(&k);
            }
        }
    }

    /// A write to (db, key); `absent_after` when it left the key absent.
    pub fn touch(&mut self, db: Db, key: &[u8], absent_after: bool) {
        // The lookup needs an owned key; watched keys are few, so this runs rarely.
        if let Some(e) = self.entries.get_mut(&(db, key.to_vec())) {
            e.touches += 1;
            e.last_touch_absent = absent_after;
        }
    }

    /// The watched keys of `db` (FLUSHDB decides per key whether it existed).
    pub fn keys_of_db(&self, db: Db) -> Vec<Vec<u8>> {
        self.entries
            .keys()
            .filter(|(d, _)| *d == db)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// Whether the touches since `mark` make EXEC fail. `None`: the key is not registered
    /// (a bug in the caller's bookkeeping): treated as changed by the caller.
    pub fn touched_since(&self, db: Db, key: &[u8], mark: WatchMark) -> Option<bool> {
        let e = self.entries.get(&(db, key.to_vec()))?;
        let since = e.touches - mark.touches;
        Some(if mark.expired {
            !(since == 0 || (since == 1 && e.last_touch_absent))
        } else {
            since > 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A touch after registration is seen; touches of other keys or dbs are not.
    #[test]
    fn touch_is_per_db_and_key() {
        let mut t = WatchTable::default();
        let n = t.register(0, b"k");
        let mark = WatchMark {
            touches: n,
            expired: false,
        };
        t.touch(1, b"k", false);
        t.touch(0, b"other", false);
        assert_eq!(t.touched_since(0, b"k", mark), Some(false));
        t.touch(0, b"k", false);
        assert_eq!(t.touched_since(0, b"k", mark), Some(true));
    }

    // A key expired at WATCH time: its deletion is forgiven once, any further touch is not.
    #[test]
    fn expired_at_watch_forgives_one_deletion() {
        let mut t = WatchTable::default();
        let mark = WatchMark {
            touches: t.register(0, b"k"),
            expired: true,
        };
        t.touch(0, b"k", true);
        assert_eq!(t.touched_since(0, b"k", mark), Some(false));
        t.touch(0, b"k", false);
        assert_eq!(t.touched_since(0, b"k", mark), Some(true));
        let mut t = WatchTable::default();
        let mark = WatchMark {
            touches: t.register(0, b"k"),
            expired: true,
        };
        t.touch(0, b"k", false);
        assert_eq!(t.touched_since(0, b"k", mark), Some(true));
    }

    // Entries are counted by watchers and vanish with the last one.
    #[test]
    fn release_counts_watchers() {
        let mut t = WatchTable::default();
        t.register(0, b"k");
        t.register(0, b"k");
        t.release(0, b"k");
        assert!(!t.is_empty());
        t.release(0, b"k");
        assert!(t.is_empty());
        t.release(0, b"k");
        assert_eq!(t.len(), 0);
    }
}
