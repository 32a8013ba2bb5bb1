//! Reading without blocking: the engine says *which* records a lookup needs, the caller's
//! ring reads them, the engine checks what came back; the command then runs with every
//! record it needs in memory (the anti-caching pattern).
//!
//! `plan_key_reads(db, key, have)` walks the index candidates of (db, key) the way
//! `Shard::find` does and lists the device reads needed so that a lookup of that key —
//! and, for a large value, of its fragments — finds every record in memory: in the staging
//! buffer, in the record cache, or in `have` (records the caller already fetched). The
//! caller reads each `RecordRead` into a 4096-aligned buffer and calls `complete_read`,
//! which verifies the record (block sequence, CRC) and returns it, asks for a longer read,
//! or reports that the block changed under the read. When nothing is missing any more the
//! caller lends the fetched records to the shard (`lend_prefetched`), runs the command's
//! ordinary synchronous code — whose `read_record` calls now find everything in memory —
//! and takes the records back (`take_prefetched`), which also offers them to the cache.
//!
//! Nothing here changes the index or the log, so a plan can be abandoned at any point.
//! Between planning and running the shard may change (another command overwrote the key,
//! defrag moved it, a block was freed and reused): the caller plans again after its reads
//! complete and runs only when the plan is empty. A record fetched for an address whose
//! block was reused meanwhile fails the block-sequence check and is never used.

use super::format::{decode_record, RecordHeader, FLAG_LARGE};
use super::index::Address;
use super::shard::{parse_root, OwnedRecord, Shard};
use super::{Db, StorageError};
use std::os::fd::RawFd;

/// First read window for a record (the synchronous path reads the same).
pub const READ_WINDOW_BYTES: usize = 8192;
const IO_ALIGN_BYTES: usize = 4096;

/// A record fetched ahead of the command that needs it.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub(crate) addr: Address,
    pub(crate) block_seq: u64,
    pub(crate) rec: OwnedRecord,
}

impl Fetched {
    /// A large value's root: its fragments are planned in a second round.
    pub fn is_large_root(&self) -> bool {
        self.rec.header.flags & FLAG_LARGE != 0
    }

    /// Bytes of key and value held (for the caller's memory accounting).
    pub fn len_bytes(&self) -> usize {
        self.rec.key.len() + self.rec.value.len()
    }
}

/// One device read the caller must perform.
#[derive(Clone, Debug)]
pub struct RecordRead {
    pub fd: RawFd,
    pub offset_bytes: u64,
    pub len_bytes: usize,
    /// Offset of the record inside the bytes read.
    rel: usize,
    /// Bytes from the read offset to the end of the block.
    room: usize,
    addr: Address,
    block_seq: u64,
}

impl RecordRead {
    /// Same record address (two plans asking for one record).
    pub fn same_record(&self, other: &RecordRead) -> bool {
        self.addr == other.addr && self.block_seq == other.block_seq
    }
}

/// Byte vectors of records whose command has finished, reused by `complete_read` so a
/// fetched record costs no allocation in the steady state. Bounded: at most
/// `RECORD_POOL_MAX` vectors of each kind, none above `RECORD_POOL_BYTES_MAX`, and
/// `RECORD_POOL_TOTAL_BYTES_MAX` of capacity in all.
#[derive(Default)]
pub struct RecordPool {
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
    /// Capacity held by `keys` and `values`.
    bytes: usize,
}

/// As many as a worker's reads in flight (`server::reads::READS_INFLIGHT_MAX`): a round
/// that completes every read on the ring takes that many vectors, and a pool smaller
/// than a round's completions frees and allocates the difference on every round (with
/// 200 connections each 1 KiB value was a `malloc`/`free` outside glibc's thread cache,
/// ~450 instructions per GET).
pub(crate) const RECORD_POOL_MAX: usize = 256;
const RECORD_POOL_BYTES_MAX: usize = 64 * 1024;
const RECORD_POOL_TOTAL_BYTES_MAX: usize = 2 << 20;
const _: () = assert!(RECORD_POOL_BYTES_MAX <= RECORD_POOL_TOTAL_BYTES_MAX);

impl RecordPool {
    /// Keeps `f`'s vectors for later records.
    pub fn recycle(&mut self, f: Fetched) {
        let OwnedRecord { key, value, .. } = f.rec;
        for (v, pool) in [(key, &mut self.keys), (value, &mut self.values)] {
            let cap = v.capacity();
            if pool.len() < RECORD_POOL_MAX
                && cap <= RECORD_POOL_BYTES_MAX
                && self.bytes + cap <= RECORD_POOL_TOTAL_BYTES_MAX
            {
                self.bytes += cap;
                pool.push(v);
            }
        }
    }

    fn copy(pool: &mut Vec<Vec<u8>>, held: &mut usize, bytes: &[u8]) -> Vec<u8> {
        match pool.pop() {
            Some(mut v) => {
                *held -= v.capacity();
                v.clear();
                v.extend_from_slice(bytes);
                v
            }
            None => bytes.to_vec(),
        }
    }
}

pub enum ReadDone {
    Record(Fetched),
    /// The record is longer than the bytes read: read again with this plan.
    More(RecordRead),
    /// The block changed under the read (freed, reused): plan again.
    Stale,
}

impl Shard {
    /// Adds to `out` the reads that a lookup of (db, key) needs; nothing when every record
    /// it would touch is in memory, or when the device has no file descriptor to read
    /// through (the synchronous path then reads, as before).
    pub fn plan_key_reads(
        &mut self,
        db: Db,
        key: &[u8],
        have: &[Fetched],
        out: &mut Vec<RecordRead>,
    ) {
        if (db as usize) >= self.indexes.len() {
            return;
        }
        let h = self.hash(db, key);
        for addr in self.candidate_addresses(db, h) {
            if let Some(p) = self
                .blind
                .get(&addr.0)
                .filter(|p| p.db != db || *p.key != *key)
            {
                // Another key's unsettled blind write (its key is kept, so its record is
                // not needed): the lookup settles it, which reads the record it replaced.
                let prev = p.prev;
                if self.in_memory(prev, have, |_, _, _| ()).is_none() {
                    self.push_read(prev, out);
                }
                continue;
            }
            match self.in_memory(addr, have, |hdr, k, v| {
                let ours = hdr.db == db && k == key;
                let large = ours && hdr.flags & FLAG_LARGE != 0;
                (
                    ours,
                    large.then(|| parse_root(v).map(|(_, _, frags)| frags)),
                )
            }) {
                Some((true, None)) => return,
                Some((true, Some(frags))) => {
                    // A large value: its fragments are read with it. A root that does not
                    // parse is left to the synchronous path, which reports it.
                    for f in frags.into_iter().flatten() {
                        if self.in_memory(f, have, |_, _, _| ()).is_none() {
                            self.push_read(f, out);
                        }
                    }
                    return;
                }
                Some((false, _)) => {
                    // Another key's unsettled blind write: the lookup settles it, which
                    // reads the record it replaced.
                    if let Some(p) = self.blind.get(&addr.0) {
                        let prev = p.prev;
                        if self.in_memory(prev, have, |_, _, _| ()).is_none() {
                            self.push_read(prev, out);
                        }
                    }
                }
                None => self.push_read(addr, out),
            }
        }
    }

    /// Runs `f` on the record at `addr` if it is in memory (staging, `have`, the lent
    /// records or the cache), without a device read.
    pub(crate) fn in_memory<R>(
        &self,
        addr: Address,
        have: &[Fetched],
        f: impl FnOnce(&RecordHeader, &[u8], &[u8]) -> R,
    ) -> Option<R> {
        let (block, off) = self.shared.layout.split(addr);
        if let Some(ob) = &self.open {
            if ob.block == block && off < ob.write_pos {
                let r = decode_record(&self.staging.as_slice()[off..ob.write_pos], ob.block_seq)?;
                return Some(f(&r.header, r.key, r.value));
            }
        }
        let block_seq = self.blocks.get(&block)?.block_seq;
        if let Some(x) = have
            .iter()
            .chain(self.prefetched.iter())
            .find(|x| x.addr == addr && x.block_seq == block_seq)
        {
            return Some(f(&x.rec.header, &x.rec.key, &x.rec.value));
        }
        let r = self.cache.peek(addr, block_seq)?;
        Some(f(&r.header, &r.key, &r.value))
    }

    fn push_read(&self, addr: Address, out: &mut Vec<RecordRead>) {
        let (block, off) = self.shared.layout.split(addr);
        let Some(info) = self.blocks.get(&block) else {
            return; // not ours: the synchronous path reports the corruption
        };
        let (dev, base) = self.shared.layout.locate(block);
        // A device without a descriptor that reads asynchronously (NVMe) is named by a
        // stand-in descriptor; one that does neither is read synchronously by the handler.
        let device = &self.shared.layout.devices[dev];
        let fd = match device.raw_fd() {
            Some(fd) => fd,
            None if device.async_reads().is_some() => crate::device::async_device_fd(dev),
            None => return,
        };
        let bs = self.shared.layout.block_size_bytes as usize;
        let aligned = off & !(IO_ALIGN_BYTES - 1);
        let read = RecordRead {
            fd,
            offset_bytes: base + aligned as u64,
            len_bytes: READ_WINDOW_BYTES.min(bs - aligned),
            rel: off - aligned,
            room: bs - aligned,
            addr,
            block_seq: info.block_seq,
        };
        if !out.iter().any(|r| r.same_record(&read)) {
            out.push(read);
        }
    }

    /// Checks the bytes a `RecordRead` asked for (`buf.len() >= read.len_bytes`).
    pub fn complete_read(
        &mut self,
        read: &RecordRead,
        buf: &[u8],
        pool: &mut RecordPool,
    ) -> ReadDone {
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += read.len_bytes as u64;
        let (block, _) = self.shared.layout.split(read.addr);
        if self.blocks.get(&block).map(|b| b.block_seq) != Some(read.block_seq) {
            return ReadDone::Stale;
        }
        let bytes = &buf[..read.len_bytes.min(buf.len())];
        let Some(hdr) = RecordHeader::decode(&bytes[read.rel.min(bytes.len())..]) else {
            return ReadDone::Stale;
        };
        let need = read.rel + hdr.record_len();
        if need > read.len_bytes {
            if need > read.room {
                return ReadDone::Stale;
            }
            let len = need.div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
            return ReadDone::More(RecordRead {
                len_bytes: len.min(read.room),
                ..read.clone()
            });
        }
        let Some(r) = decode_record(&bytes[read.rel..need], read.block_seq) else {
            return ReadDone::Stale;
        };
        let rec = OwnedRecord {
            header: r.header,
            key: RecordPool::copy(&mut pool.keys, &mut pool.bytes, r.key),
            value: RecordPool::copy(&mut pool.values, &mut pool.bytes, r.value),
        };
        self.cache.insert(read.addr, read.block_seq, &rec);
        ReadDone::Record(Fetched {
            addr: read.addr,
            block_seq: read.block_seq,
            rec,
        })
    }

    /// Changes whenever something this shard's plans depend on may have changed: a write
    /// (every write takes the next sequence number) or a defrag relocation. Both counters
    /// only grow, so a sum over several shards is unchanged only if each one is.
    pub fn change_signature(&self) -> u64 {
        self.next_seq
            .wrapping_add(self.counters.defrag_relocated_records)
    }

    /// Makes `fetched` visible to this shard's lookups until `take_prefetched`.
    pub fn lend_prefetched(&mut self, fetched: &mut Vec<Fetched>) {
        debug_assert!(self.prefetched.is_empty(), "one command at a time");
        std::mem::swap(&mut self.prefetched, fetched);
    }

    /// Ends `lend_prefetched`: the records go back to the caller.
    pub fn take_prefetched(&mut self, fetched: &mut Vec<Fetched>) {
        std::mem::swap(&mut self.prefetched, fetched);
        self.prefetched.clear();
    }

    /// Record cache statistics: (capacity, bytes, entries, hits, misses, evictions).
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            capacity_bytes: self.cache.capacity_bytes() as u64,
            bytes: self.cache.bytes() as u64,
            entries: self.cache.len() as u64,
            hits: self.cache.hits,
            misses: self.cache.misses,
            evictions: self.cache.evictions,
            sync_reads: self.counters.sync_reads,
        }
    }

    /// Changes this shard's share of `--cache-size`.
    pub fn set_cache_capacity(&mut self, capacity_bytes: usize) {
        self.cache.set_capacity(capacity_bytes);
    }
}

/// What one shard's record cache holds and did.
#[derive(Clone, Copy, Default)]
pub struct CacheStats {
    pub capacity_bytes: u64,
    pub bytes: u64,
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Records read synchronously (blocking the worker): a command read a record nobody
    /// planned for (should stay near 0).
    pub sync_reads: u64,
}

// Flat `name: value` pairs, so INFO's storage lines (built from `Debug`) stay one level.
impl std::fmt::Debug for CacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cache_capacity_bytes: {}, cache_bytes: {}, cache_entries: {}, cache_hits: {}, cache_misses: {}, cache_evictions: {}, sync_reads: {}",
            self.capacity_bytes, self.bytes, self.entries, self.hits, self.misses, self.evictions, self.sync_reads
        )
    }
}

// ---- restarting on a miss (the anti-caching pattern for pages) ------------------------

/// The state of a *restartable run* on this thread (see `docs/architecture.md`, "Pages
/// and other records found while running"): a handler that the worker can discard and
/// run again. While one is active, a record that is not in memory is not read from the
/// device: its read is recorded as *wanted* and the lookup fails with
/// [`StorageError::Deferred`]; the worker reads what is wanted on its ring and runs the
/// command again. Two rules keep that sound whatever the handler does with the error:
/// a miss after the run has written anything is read synchronously as before (the run
/// can no longer be discarded), and a write after a miss is refused (the run will be
/// discarded, so nothing of it may be applied).
#[derive(Default)]
struct RestartState {
    active: bool,
    wrote: bool,
    /// Reads wanted by the run, with the shard of each; non-empty = the run missed.
    wanted: Vec<(u32, RecordRead)>,
    /// Payload bytes of the pages the run's walks noted (`readahead_charge`).
    ahead_bytes: usize,
}

/// Read-ahead budget of one restartable run (see "Read-ahead" below): at most this many
/// wanted reads. One round's reads then fit the worker's ring at once
/// (`server::reads::READS_INFLIGHT_MAX`, asserted there).
pub const READAHEAD_READS_MAX: usize = 256;
/// ... and at most this many payload bytes of noted pages (256 leaves of 8 KiB): what one
/// round adds to the records a parked command holds until its next run.
pub const READAHEAD_BYTES_MAX: usize = 2 << 20;

thread_local! {
    static RESTART: std::cell::RefCell<RestartState> = Default::default();
}

/// Starts a restartable run on this thread.
pub fn restartable_begin() {
    RESTART.with(|s| {
        let mut s = s.borrow_mut();
        s.active = true;
        s.wrote = false;
        s.wanted.clear();
        s.ahead_bytes = 0;
    });
}

/// Ends a restartable run: the reads it wanted (empty: the run is valid and final).
pub fn restartable_end(out: &mut Vec<(u32, RecordRead)>) {
    RESTART.with(|s| {
        let mut s = s.borrow_mut();
        s.active = false;
        s.wrote = false;
        out.append(&mut s.wanted);
    });
}

// Read-ahead. A run ends at its first miss, so a walk over many pages (HGETALL's leaves,
// HMGET's fields, LRANGE 0 -1) would cost one restart per page. Instead a page walker
// (`paged::Ahead`) that missed keeps walking: the pages it will need that are not in
// memory are noted as wanted too (`Shard::note_ahead`), in-memory directory pages are still
// read to name their leaves, and the walk fails with `Deferred` only at its end, or when
// the round's budget (`READAHEAD_READS_MAX` reads, `READAHEAD_BYTES_MAX` bytes) is
// spent. Only pages the walk reaches are noted: nothing the command would not read.

/// Whether the running restartable run has missed a record (it will be discarded).
pub fn run_missed() -> bool {
    RESTART.with(|s| {
        let s = s.borrow();
        s.active && !s.wanted.is_empty()
    })
}

/// Whether a walk of a run that missed may note one more page of `len_bytes` payload.
pub(crate) fn readahead_allows(len_bytes: usize) -> bool {
    RESTART.with(|s| {
        let s = s.borrow();
        s.active
            && !s.wrote
            && s.wanted.len() < READAHEAD_READS_MAX
            && s.ahead_bytes + len_bytes <= READAHEAD_BYTES_MAX
    })
}

/// Counts `len_bytes` of a page noted as wanted against the round's budget.
pub(crate) fn readahead_charge(len_bytes: usize) {
    RESTART.with(|s| s.borrow_mut().ahead_bytes += len_bytes);
}

/// Every shard write path calls this first: refuses the write when the running command
/// already missed a record (it will be discarded and run again), and otherwise notes that
/// the run wrote (from now on its misses are read synchronously).
pub(crate) fn restartable_write() -> Result<(), StorageError> {
    RESTART.with(|s| {
        let mut s = s.borrow_mut();
        if !s.active {
            return Ok(());
        }
        if !s.wanted.is_empty() {
            return Err(StorageError::Deferred);
        }
        s.wrote = true;
        Ok(())
    })
}

impl Shard {
    /// `read_record` missed staging, the lent records and the cache for `addr`: in a
    /// restartable run that has not written, records the read as wanted and returns true
    /// (the caller fails with `Deferred`); otherwise false (read it synchronously).
    pub(crate) fn defer_miss(&self, addr: Address) -> bool {
        RESTART.with(|s| {
            let mut s = s.borrow_mut();
            if !s.active || s.wrote {
                return false;
            }
            let mut one = Vec::new();
            self.push_read(addr, &mut one);
            let Some(read) = one.pop() else {
                return false; // no file descriptor to read through: the sync path reads
            };
            if !s.wanted.iter().any(|(_, r)| r.same_record(&read)) {
                s.wanted.push((self.id, read));
            }
            true
        })
    }
}

/// What `Shard::note_ahead` did with a record.
pub(crate) enum Ahead {
    /// In memory: the walk may read it.
    InMemory,
    /// Noted as wanted now (it counts against the round's budget).
    Noted,
    /// Already wanted by this run, or no file descriptor to read it through (the next run
    /// reads it as it would have).
    NotNew,
}

/// Whether the running restartable run has noted budget left for read-ahead
/// (`readahead_allows` for a page of 0 bytes): a walk that only notes may stop when not.
pub fn readahead_room() -> bool {
    readahead_allows(0)
}

impl Shard {
    /// Read-ahead (a walk of a restartable run that already missed): checks whether the
    /// record at `addr` is in memory (staging, lent records, cache), and otherwise notes it
    /// as wanted, without reading it.
    pub(crate) fn note_ahead(&self, addr: Address) -> Ahead {
        let addr = self.current_address(addr);
        if self.in_memory(addr, &[], |_, _, _| ()).is_some() {
            return Ahead::InMemory;
        }
        let before = RESTART.with(|s| s.borrow().wanted.len());
        if self.defer_miss(addr) && RESTART.with(|s| s.borrow().wanted.len()) > before {
            Ahead::Noted
        } else {
            Ahead::NotNew
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{open, FsyncPolicy, StoreConfig, ValueKind};

    // Proves the restartable-run rules on a real file device: a record not in memory is
    // wanted, not read; a write after that miss is refused (nothing applied); a miss after
    // the run wrote is read synchronously; outside a run nothing changes.
    #[test]
    fn restartable_run_rules() {
        let dir = std::env::temp_dir().join(format!("lavik-prefetch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = StoreConfig {
            data_files: vec![dir.join("data")],
            create_size_bytes: 16 << 20,
            shard_count: 1,
            block_size_bytes: 64 * 1024,
            staging_limit_bytes: 64 * 1024,
            fsync: FsyncPolicy::No,
            direct_io: false,
            defrag_paused: true,
            cache_capacity_bytes: 0,
            ..StoreConfig::default()
        };
        let mut s = open(&cfg).unwrap().shards.pop().unwrap();
        for i in 0..2000u32 {
            let v = vec![b'v'; 100 + (i as usize % 900)];
            let k = format!("k{i}");
            s.put(0, k.as_bytes(), ValueKind::String, &v, None, 0)
                .unwrap();
        }
        s.flush().unwrap();
        let sync0 = s.cache_stats().sync_reads;

        restartable_begin();
        assert!(matches!(s.get(0, b"k0", 0), Err(StorageError::Deferred)));
        let refused = s.put(0, b"new", ValueKind::String, b"x", None, 0);
        assert!(matches!(refused, Err(StorageError::Deferred)));
        let mut wanted = Vec::new();
        restartable_end(&mut wanted);
        assert_eq!(wanted.len(), 1, "k0's record is wanted");
        assert_eq!(wanted[0].0, 0);
        assert_eq!(
            s.cache_stats().sync_reads,
            sync0,
            "nothing read synchronously"
        );
        assert!(
            s.get(0, b"new", 0).unwrap().is_none(),
            "the refused write left nothing"
        );

        restartable_begin();
        s.put(0, b"new", ValueKind::String, b"x", None, 0).unwrap();
        let v = s.get(0, b"k1", 0).unwrap().expect("k1 exists");
        assert_eq!(v.bytes.len(), 101);
        restartable_end(&mut wanted);
        assert_eq!(wanted.len(), 1, "a miss after a write is not wanted");
        assert_eq!(
            s.cache_stats().sync_reads,
            sync0 + 1,
            "it was read synchronously"
        );

        assert!(
            s.get(0, b"k2", 0).unwrap().is_some(),
            "outside a run: read as before"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn fetched_of(value_len: usize) -> Fetched {
        let header = RecordHeader {
            record_type: crate::storage::format::RecordType::Put,
            flags: 0,
            value_kind: 0,
            db: 0,
            key_len: 3,
            value_len: value_len as u32,
            crc: 0,
            seq: 1,
            expire_at_ms: 0,
        };
        Fetched {
            addr: Address(0),
            block_seq: 1,
            rec: OwnedRecord {
                header,
                key: b"key".to_vec(),
                value: vec![7; value_len],
            },
        }
    }

    // Proves a round that completes every read the ring can hold takes its value vectors
    // from the pool, none newly allocated, once that many were recycled (the pool used to
    // keep 64, so rounds of more completions freed and reallocated the surplus).
    #[test]
    fn record_pool_covers_a_round_of_reads() {
        let round = 256; // `server::reads::READS_INFLIGHT_MAX`
        let mut pool = RecordPool::default();
        for _ in 0..round {
            pool.recycle(fetched_of(1024));
        }
        assert_eq!(pool.values.len(), round);
        let held: Vec<*const u8> = pool.values.iter().map(|v| v.as_ptr()).collect();
        let value = [9u8; 1024];
        for _ in 0..round {
            let v = RecordPool::copy(&mut pool.values, &mut pool.bytes, &value);
            assert!(held.contains(&v.as_ptr()), "a pooled vector was reused");
            assert_eq!(v, value);
        }
        assert!(pool.values.is_empty());
    }

    // Proves the pool's byte bound: big vectors are kept only while the pool holds at most
    // `RECORD_POOL_TOTAL_BYTES_MAX` of capacity, and taking one out gives its room back.
    #[test]
    fn record_pool_bytes_bounded() {
        let mut pool = RecordPool::default();
        for _ in 0..RECORD_POOL_MAX {
            pool.recycle(fetched_of(RECORD_POOL_BYTES_MAX - 16));
        }
        assert!(pool.bytes <= RECORD_POOL_TOTAL_BYTES_MAX);
        assert!(pool.values.len() < RECORD_POOL_MAX);
        let before = pool.bytes;
        let v = RecordPool::copy(&mut pool.values, &mut pool.bytes, b"x");
        assert_eq!(pool.bytes, before - v.capacity());
        pool.recycle(fetched_of(1));
        assert!(pool.bytes <= RECORD_POOL_TOTAL_BYTES_MAX);
    }
}
