//! The record cache: verified records recently read from the device, by address, so a hot
//! key (or, later, a collection's root) does not cost a device read every time.
//!
//! A record at an address never changes while its block lives (the log is append-only),
//! so an entry stays right as long as the block it came from has the same block sequence
//! number; a block freed and reused gets a new one, and the entry is dropped the first time
//! it is looked up against the new sequence. Superseded records (the key was overwritten)
//! are never looked up again — the index no longer names their address — and age out.
//!
//! Eviction is CLOCK (second chance): each hit sets the entry's reference bit; the hand
//! evicts the first entry it finds unreferenced, clearing bits as it passes. The budget is
//! in bytes of key + value + `ENTRY_OVERHEAD_BYTES`, per shard (the server divides
//! `--cache-size` among its shards). A capacity of 0 turns the cache off: nothing is kept.

use super::index::Address;
use super::shard::OwnedRecord;
use std::collections::{HashMap, VecDeque};

/// Bookkeeping charged per entry besides its key and value: the map slot, the CLOCK queue
/// slot, the record header and the two vectors' headers.
pub const ENTRY_OVERHEAD_BYTES: usize = 128;

struct Entry {
    block_seq: u64,
    rec: OwnedRecord,
    referenced: bool,
}

#[derive(Default)]
pub struct RecordCache {
    entries: HashMap<u64, Entry>,
    /// CLOCK order (addresses; an address no longer in `entries` is skipped).
    clock: VecDeque<u64>,
    bytes: usize,
    capacity_bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

fn charge(rec: &OwnedRecord) -> usize {
    rec.key.len() + rec.value.len() + ENTRY_OVERHEAD_BYTES
}

impl RecordCache {
    pub fn new(capacity_bytes: usize) -> RecordCache {
        RecordCache {
            capacity_bytes,
            ..RecordCache::default()
        }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// Bytes charged for the entries held (at most the capacity).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Changes the budget; shrinking evicts at once.
    pub fn set_capacity(&mut self, capacity_bytes: usize) {
        self.capacity_bytes = capacity_bytes;
        self.evict_to(capacity_bytes);
        if capacity_bytes == 0 {
            self.entries = HashMap::new();
            self.clock = VecDeque::new();
            self.bytes = 0;
        }
    }

    /// The record at `addr` if cached from a block whose sequence is still `block_seq`.
    /// Counts a hit or a miss.
    pub fn get(&mut self, addr: Address, block_seq: u64) -> Option<&OwnedRecord> {
        if self.capacity_bytes == 0 {
            return None;
        }
        let stale = match self.entries.get(&addr.0) {
            None => {
                self.misses += 1;
                return None;
            }
            Some(e) => e.block_seq != block_seq,
        };
        if stale {
            self.remove(addr);
            self.misses += 1;
            return None;
        }
        self.hits += 1;
        let e = self.entries.get_mut(&addr.0)?;
        e.referenced = true;
        Some(&e.rec)
    }

    /// True when `addr` is cached for `block_seq`, without counting or touching it.
    pub fn contains(&self, addr: Address, block_seq: u64) -> bool {
        self.peek(addr, block_seq).is_some()
    }

    /// The cached record, without counting a hit or setting its reference bit (planning
    /// looks; the command that runs afterwards is what uses it).
    pub fn peek(&self, addr: Address, block_seq: u64) -> Option<&OwnedRecord> {
        self.entries
            .get(&addr.0)
            .filter(|e| e.block_seq == block_seq)
            .map(|e| &e.rec)
    }

    /// Keeps a copy of `rec` (read from `addr` in a block of sequence `block_seq`) if it
    /// fits the budget at all, evicting others as needed.
    pub fn insert(&mut self, addr: Address, block_seq: u64, rec: &OwnedRecord) {
        let cost = charge(rec);
        if self.capacity_bytes == 0 || cost > self.capacity_bytes / 4 {
            return;
        }
        self.remove(addr);
        self.evict_to(self.capacity_bytes - cost);
        self.entries.insert(
            addr.0,
            Entry {
                block_seq,
                rec: rec.clone(),
                referenced: false,
            },
        );
        self.clock.push_back(addr.0);
        self.bytes += cost;
        debug_assert!(self.bytes <= self.capacity_bytes);
    }

    pub fn remove(&mut self, addr: Address) {
        if let Some(e) = self.entries.remove(&addr.0) {
            self.bytes -= charge(&e.rec);
        }
    }

    /// Drops every entry (FLUSHALL / FLUSHDB: addresses stay valid, but memory goes back).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.clock.clear();
        self.bytes = 0;
    }

    fn evict_to(&mut self, target_bytes: usize) {
        while self.bytes > target_bytes {
            let Some(a) = self.clock.pop_front() else {
                break;
            };
            let Some(e) = self.entries.get_mut(&a) else {
                continue; // removed earlier; its queue slot goes now
            };
            if e.referenced {
                e.referenced = false;
                self.clock.push_back(a);
                continue;
            }
            self.remove(Address(a));
            self.evictions += 1;
        }
        // Queue slots of removed entries are dropped lazily; keep the queue bounded.
        if self.clock.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.clock.retain(|a| entries.contains_key(a));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::format::{RecordHeader, RecordType};

    fn rec(key: &[u8], value_len: usize) -> OwnedRecord {
        OwnedRecord {
            header: RecordHeader {
                record_type: RecordType::Put,
                flags: 0,
                value_kind: 0,
                db: 0,
                key_len: key.len() as u16,
                value_len: value_len as u32,
                crc: 0,
                seq: 1,
                expire_at_ms: 0,
            },
            key: key.to_vec(),
            value: vec![7; value_len],
        }
    }

    // A cached record is returned for its block sequence only; a reused block misses.
    #[test]
    fn entries_follow_block_sequence() {
        let mut c = RecordCache::new(1 << 20);
        c.insert(Address(10), 5, &rec(b"k", 100));
        assert_eq!(
            c.get(Address(10), 5).map(|r| r.key.clone()),
            Some(b"k".to_vec())
        );
        assert!(c.get(Address(10), 6).is_none(), "block reused: stale");
        assert!(c.get(Address(10), 5).is_none(), "stale entry was dropped");
        assert_eq!((c.hits, c.misses), (1, 2));
        assert_eq!(c.bytes(), 0);
    }

    // The byte budget holds; referenced entries survive a pass of the hand.
    #[test]
    fn clock_keeps_budget_and_second_chances() {
        let cost = 1000 + 1 + ENTRY_OVERHEAD_BYTES;
        let mut c = RecordCache::new(cost * 4);
        for a in 0..4 {
            c.insert(Address(a), 1, &rec(b"k", 1000));
        }
        assert!(c.get(Address(0), 1).is_some());
        c.insert(Address(4), 1, &rec(b"k", 1000));
        assert!(c.bytes() <= cost * 4);
        assert!(c.contains(Address(0), 1), "referenced entry kept");
        assert!(!c.contains(Address(1), 1), "oldest unreferenced evicted");
        assert_eq!(c.evictions, 1);
    }

    // Capacity 0 keeps nothing; shrinking evicts at once.
    #[test]
    fn off_and_shrink() {
        let mut c = RecordCache::new(0);
        c.insert(Address(1), 1, &rec(b"k", 10));
        assert_eq!(c.len(), 0);
        let mut c = RecordCache::new(1 << 20);
        for a in 0..100 {
            c.insert(Address(a), 1, &rec(b"k", 100));
        }
        c.set_capacity(1000);
        assert!(c.bytes() <= 1000);
        c.set_capacity(0);
        assert_eq!((c.len(), c.bytes()), (0, 0));
    }
}
