//! The record cache: verified records recently read from the device, by address, so a hot
//! key (or, later, a collection's root) does not cost a device read every time.
//!
//! A cached key written again keeps its entry (`replace`): the entry moves to the new
//! record's address, so a key that is read and written stays cached. Records written for a
//! key that was not cached are not added (a write-heavy load would otherwise push the read
//! set out; they are in the staging buffer until their block seals anyway).
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
//!
//! The resident part (`docs/architecture.md`, "Restarting on a miss"): a paged collection's
//! newest root and directory pages, kept when the block they were written to is sealed (they
//! leave the staging buffer), whatever `--cache-size` says, within `RESIDENT_MAX_BYTES` per
//! shard (CLOCK as well; counted in `bytes`, so in `used_memory`). A superseded root or page is
//! dropped at once (`remove`). So a hot collection's root and directory pages stay in memory,
//! and a command on it reads at most its leaf from the device, with the cache off too.

use super::format::RecordType;
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

/// Budget of the resident part, per shard: the root and directory pages of a 10M-member
/// hash (about 200 directory pages of ≤ 6 KiB) fit, and a server of 8 shards spends at most
/// 16 MiB on them.
pub const RESIDENT_MAX_BYTES: usize = 2 << 20;

/// Whether a record being appended is kept resident at its block's seal: a paged root (a
/// Put with `FLAG_PAGED`) or a directory page (a Page whose payload starts with a directory
/// kind: a hash's, set's or list's, or a sorted set's).
pub fn keeps_resident(record_type: RecordType, flags: u8, payload: &[u8]) -> bool {
    match record_type {
        RecordType::Put => super::paged::is_root(flags),
        RecordType::Page => matches!(
            payload.first(),
            Some(&super::paged::PAGE_DIR) | Some(&super::paged_zset::PAGE_ZSET_DIR)
        ),
        _ => false,
    }
}

/// Entries under one byte budget, evicted by CLOCK.
#[derive(Default)]
struct Pool {
    entries: HashMap<u64, Entry>,
    /// CLOCK order (addresses; an address no longer in `entries` is skipped).
    clock: VecDeque<u64>,
    bytes: usize,
    capacity_bytes: usize,
}

#[derive(Default)]
pub struct RecordCache {
    main: Pool,
    /// Paged roots and directory pages kept at their block's seal (module essay).
    resident: Pool,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

fn charge(rec: &OwnedRecord) -> usize {
    rec.key.len() + rec.value.len() + ENTRY_OVERHEAD_BYTES
}

impl Pool {
    fn fresh(&self, addr: Address, block_seq: u64) -> Option<bool> {
        self.entries.get(&addr.0).map(|e| e.block_seq == block_seq)
    }

    fn peek(&self, addr: Address, block_seq: u64) -> Option<&OwnedRecord> {
        self.entries
            .get(&addr.0)
            .filter(|e| e.block_seq == block_seq)
            .map(|e| &e.rec)
    }

    /// Keeps `rec` if it fits the budget at all; returns the entries evicted for it.
    fn insert(&mut self, addr: Address, block_seq: u64, rec: &OwnedRecord) -> u64 {
        let cost = charge(rec);
        if self.capacity_bytes == 0 || cost > self.capacity_bytes / 4 {
            return 0;
        }
        self.remove(addr);
        let evicted = self.evict_to(self.capacity_bytes - cost);
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
        evicted
    }

    /// Moves the entry of `old` (if fresh for `old_seq`) to `new` of block `new_seq`, after
    /// `update` rewrote its record in place (the old key and value buffers are reused).
    /// Returns `None` if `old` was not cached, else the entries evicted to make room.
    fn replace(
        &mut self,
        old: Address,
        old_seq: u64,
        new: Address,
        new_seq: u64,
        update: impl FnOnce(&mut OwnedRecord),
    ) -> Option<u64> {
        if self.fresh(old, old_seq) != Some(true) {
            return None;
        }
        let mut e = self.entries.remove(&old.0)?;
        self.bytes -= charge(&e.rec);
        update(&mut e.rec);
        let cost = charge(&e.rec);
        if cost > self.capacity_bytes / 4 {
            return Some(0);
        }
        self.remove(new);
        let evicted = self.evict_to(self.capacity_bytes - cost);
        e.block_seq = new_seq;
        // It was just used (the write read it): a second chance before eviction.
        e.referenced = true;
        self.entries.insert(new.0, e);
        // The old address's queue slot is dropped lazily, as after `remove`.
        self.clock.push_back(new.0);
        self.bytes += cost;
        debug_assert!(self.bytes <= self.capacity_bytes);
        Some(evicted)
    }

    fn remove(&mut self, addr: Address) {
        if let Some(e) = self.entries.remove(&addr.0) {
            self.bytes -= charge(&e.rec);
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.clock.clear();
        self.bytes = 0;
    }

    fn evict_to(&mut self, target_bytes: usize) -> u64 {
        let mut evicted = 0;
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
            evicted += 1;
        }
        // Queue slots of removed entries are dropped lazily; keep the queue bounded.
        if self.clock.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.clock.retain(|a| entries.contains_key(a));
        }
        evicted
    }
}

impl RecordCache {
    pub fn new(capacity_bytes: usize) -> RecordCache {
        RecordCache {
            main: Pool {
                capacity_bytes,
                ..Pool::default()
            },
            resident: Pool {
                capacity_bytes: RESIDENT_MAX_BYTES,
                ..Pool::default()
            },
            ..RecordCache::default()
        }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.main.capacity_bytes
    }

    /// Bytes charged for the entries held (at most the capacity plus `RESIDENT_MAX_BYTES`).
    pub fn bytes(&self) -> usize {
        self.main.bytes + self.resident.bytes
    }

    pub fn len(&self) -> usize {
        self.main.entries.len() + self.resident.entries.len()
    }

    /// Changes the budget; shrinking evicts at once. The resident part keeps its own.
    pub fn set_capacity(&mut self, capacity_bytes: usize) {
        self.main.capacity_bytes = capacity_bytes;
        self.evictions += self.main.evict_to(capacity_bytes);
        if capacity_bytes == 0 {
            self.main = Pool::default();
        }
    }

    /// The record at `addr` if cached from a block whose sequence is still `block_seq`.
    /// Counts a hit or a miss (with the cache off, a resident hit only).
    pub fn get(&mut self, addr: Address, block_seq: u64) -> Option<&OwnedRecord> {
        let on = self.main.capacity_bytes != 0;
        let pool = match (
            self.resident.fresh(addr, block_seq),
            self.main.fresh(addr, block_seq),
        ) {
            (Some(true), _) => &mut self.resident,
            (_, Some(true)) => &mut self.main,
            (res, main) => {
                if res == Some(false) {
                    self.resident.remove(addr);
                }
                if main == Some(false) {
                    self.main.remove(addr);
                }
                if on {
                    self.misses += 1;
                }
                return None;
            }
        };
        self.hits += 1;
        let e = pool.entries.get_mut(&addr.0)?;
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
        self.resident
            .peek(addr, block_seq)
            .or_else(|| self.main.peek(addr, block_seq))
    }

    /// Keeps a copy of `rec` (read from `addr` in a block of sequence `block_seq`) if it
    /// fits the budget at all, evicting others as needed.
    pub fn insert(&mut self, addr: Address, block_seq: u64, rec: &OwnedRecord) {
        if self.resident.peek(addr, block_seq).is_some() {
            return; // already held by the resident part
        }
        self.evictions += self.main.insert(addr, block_seq, rec);
    }

    /// Keeps `rec`, a paged root or directory page at `addr` of a block just sealed (of
    /// sequence `block_seq`), in the resident part.
    pub fn insert_resident(&mut self, addr: Address, block_seq: u64, rec: &OwnedRecord) {
        self.main.remove(addr);
        self.evictions += self.resident.insert(addr, block_seq, rec);
    }

    /// The key whose record at `old` (block sequence `old_seq`) was cached has just been
    /// written again at `new` (block `new_seq`): the cached entry moves to the new record,
    /// rewritten by `update`, so a key that is read and written (INCR, APPEND, a script's
    /// GET and SET, a SET of a key a GET just read) stays cached instead of costing a
    /// device read once its new record's block is sealed. Nothing happens when `old` was
    /// not in the main part. Returns whether the entry moved.
    pub fn replace(
        &mut self,
        old: Address,
        old_seq: u64,
        new: Address,
        new_seq: u64,
        update: impl FnOnce(&mut OwnedRecord),
    ) -> bool {
        match self.main.replace(old, old_seq, new, new_seq, update) {
            Some(evicted) => {
                self.evictions += evicted;
                true
            }
            None => false,
        }
    }

    /// Drops the resident record at `addr` (superseded: never looked up again).
    pub fn remove_resident(&mut self, addr: Address) {
        if !self.resident.entries.is_empty() {
            self.resident.remove(addr);
        }
    }

    /// Drops every entry (FLUSHALL / FLUSHDB: addresses stay valid, but memory goes back).
    pub fn clear(&mut self) {
        self.main.clear();
        self.resident.clear();
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

    // A cached key written again: the entry moves to the new address and block sequence
    // with the new record, the old address is gone; an uncached or stale old address moves
    // nothing.
    #[test]
    fn replace_moves_a_cached_entry_to_the_new_record() {
        let mut c = RecordCache::new(1 << 20);
        c.insert(Address(10), 5, &rec(b"k", 100));
        let new = rec(b"k", 300);
        assert!(c.replace(Address(10), 5, Address(90), 7, |r| {
            r.value.clear();
            r.value.extend_from_slice(&new.value);
            r.header = new.header;
        }));
        assert!(!c.contains(Address(10), 5), "the old address is dropped");
        assert_eq!(c.peek(Address(90), 7).map(|r| r.value.len()), Some(300));
        assert_eq!(c.bytes(), 1 + 300 + ENTRY_OVERHEAD_BYTES);
        assert!(
            !c.replace(Address(11), 5, Address(91), 7, |_| {}),
            "not cached"
        );
        assert!(!c.replace(Address(90), 6, Address(92), 7, |_| {}), "stale");
        assert!(!c.contains(Address(92), 7));
        // With the cache off nothing is cached, so nothing moves.
        let mut off = RecordCache::new(0);
        off.insert(Address(1), 1, &rec(b"k", 10));
        assert!(!off.replace(Address(1), 1, Address(2), 1, |_| {}));
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

    // The resident part works with the cache off: kept records are found (counted as
    // hits), a stale or superseded one is dropped, and its budget holds.
    #[test]
    fn resident_part_with_cache_off() {
        let mut c = RecordCache::new(0);
        c.insert(Address(1), 1, &rec(b"k", 10));
        assert_eq!(c.len(), 0, "cache off: a read record is not kept");
        c.insert_resident(Address(2), 1, &rec(b"root", 100));
        assert!(c.contains(Address(2), 1));
        assert!(c.get(Address(2), 1).is_some());
        assert_eq!((c.hits, c.misses), (1, 0));
        assert!(c.get(Address(2), 2).is_none(), "block reused");
        assert_eq!(c.len(), 0);
        c.insert_resident(Address(3), 1, &rec(b"root", 100));
        c.remove_resident(Address(3));
        assert_eq!((c.len(), c.bytes()), (0, 0));
        for a in 0..10_000 {
            c.insert_resident(Address(a), 1, &rec(b"dir", 4000));
        }
        assert!(c.bytes() <= RESIDENT_MAX_BYTES);
        assert!(c.contains(Address(9_999), 1), "the newest is kept");
        c.set_capacity(0);
        assert!(
            c.contains(Address(9_999), 1),
            "resizing keeps the resident part"
        );
        c.clear();
        assert_eq!((c.len(), c.bytes()), (0, 0));
    }

    // A paged root and directory pages are kept resident; leaves and strings are not.
    #[test]
    fn what_stays_resident() {
        use crate::storage::format::FLAG_PAGED;
        assert!(keeps_resident(RecordType::Put, FLAG_PAGED, &[1]));
        assert!(!keeps_resident(RecordType::Put, 0, b"value"));
        let dir = crate::storage::paged::encode_dir(&[crate::storage::paged::Entry {
            first: 0,
            addr: 1,
            len: 1,
            count: 1,
        }]);
        assert!(keeps_resident(RecordType::Page, 0, &dir));
        assert!(keeps_resident(
            RecordType::Page,
            0,
            &[crate::storage::paged_zset::PAGE_ZSET_DIR]
        ));
        assert!(!keeps_resident(
            RecordType::Page,
            0,
            &[crate::storage::paged_list::PAGE_LIST_LEAF]
        ));
        assert!(!keeps_resident(RecordType::Tombstone, FLAG_PAGED, &[]));
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
