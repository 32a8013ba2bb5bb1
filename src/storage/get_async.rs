//! GET without blocking the worker: the engine decides *what* to read, the
//! caller's ring reads it, the engine checks what came back.
//!
//! `get_begin` looks the key up in the index and either answers at once
//! (no candidate, or the record is still in the staging buffer) or returns a
//! `ReadPlan`: an fd, an aligned offset and length. The caller reads those
//! bytes (io_uring) into a 4096-aligned buffer and calls `get_continue`,
//! which verifies the record (CRC and block sequence), compares the key, and
//! answers, or plans the next read (a tag collision's next candidate, or the
//! rest of a record longer than the first read window).
//!
//! Between the two calls the shard may change. The plan stays safe: a block
//! freed and reused meanwhile fails the block-sequence check and the lookup
//! starts over (bounded; after that the synchronous path answers); a record
//! overwritten meanwhile is still the value the key had when the GET was
//! looked up, which is when this GET takes effect. Expired records answer
//! "missing" without deleting anything here (the synchronous paths and the
//! active expiry do that). Large values (split into extents) and devices
//! without a file descriptor take the synchronous path.

use super::format::{decode_record, RecordHeader, RecordType, FLAG_LARGE, RECORD_HEADER_BYTES};
use super::index::Address;
use super::shard::{Found, OwnedRecord, Shard};
use super::{Db, StorageError, Value, ValueKind};
use std::ops::Range;
use std::os::fd::RawFd;

/// First read window for a record (matches the synchronous path).
const READ_WINDOW_BYTES: usize = 8192;
const IO_ALIGN_BYTES: usize = 4096;
/// Restarts after a stale read before falling back to the synchronous path.
const RESTARTS_MAX: u32 = 3;
/// Candidates a plan carries without a heap allocation (a key usually has one, a
/// hash-fragment collision adds one more).
const CANDIDATES_INLINE: usize = 4;

/// Index candidates still to try, oldest first. The first `CANDIDATES_INLINE` live in
/// the plan itself and only a longer chain spills to the heap, so the common GET or SET
/// allocates nothing for its plan.
#[derive(Clone, Debug)]
struct CandidateList {
    inline: [Address; CANDIDATES_INLINE],
    inline_len: usize,
    /// Candidates after the inline ones, in order.
    spill: Vec<Address>,
    /// Candidates already taken (inline ones first, then spilled ones).
    taken: usize,
}

impl CandidateList {
    fn collect(candidates: impl Iterator<Item = Address>) -> CandidateList {
        let mut list = CandidateList {
            inline: [Address(0); CANDIDATES_INLINE],
            inline_len: 0,
            spill: Vec::new(),
            taken: 0,
        };
        for a in candidates {
            if list.inline_len < CANDIDATES_INLINE {
                list.inline[list.inline_len] = a;
                list.inline_len += 1;
            } else {
                list.spill.push(a);
            }
        }
        list
    }

    /// The candidates not yet taken, in order.
    fn remaining(&self) -> impl Iterator<Item = Address> + '_ {
        let inline_from = self.taken.min(self.inline_len);
        let spill_from = self.taken.saturating_sub(self.inline_len);
        self.inline[inline_from..self.inline_len]
            .iter()
            .chain(&self.spill[spill_from.min(self.spill.len())..])
            .copied()
    }

    fn pop_front(&mut self) -> Option<Address> {
        let next = self.remaining().next()?;
        self.taken += 1;
        Some(next)
    }
}

/// One device read the caller must perform, and where the lookup stands.
#[derive(Clone, Debug)]
pub struct ReadPlan {
    pub fd: RawFd,
    pub offset_bytes: u64,
    pub len_bytes: usize,
    /// Offset of the record inside the bytes read.
    rel: usize,
    /// Bytes from the read offset to the end of the block.
    room: usize,
    addr: Address,
    block_seq: u64,
    /// Candidates not yet tried, after `addr`.
    rest: CandidateList,
    restarts: u32,
}

pub enum GetStep {
    Done(Option<Value>),
    Read(ReadPlan),
}

/// Where a GET stands after a device read, without copying the value out of the
/// caller's buffer (see [`Shard::get_continue_in_place`]).
pub enum GetReadStep {
    /// The key's current value is `buf[range]` of the buffer just passed in.
    InBuffer {
        kind: ValueKind,
        range: Range<usize>,
        expire_at_ms: Option<u64>,
    },
    /// Answered otherwise (missing, expired, or read by the synchronous path).
    Done(Option<Value>),
    Read(ReadPlan),
}

fn value_of(header: &RecordHeader, bytes: Vec<u8>) -> Result<Value, StorageError> {
    let kind = ValueKind::from_u8(header.value_kind).ok_or_else(|| {
        StorageError::Corrupt(format!("unknown value kind {}", header.value_kind))
    })?;
    Ok(Value {
        kind,
        bytes,
        expire_at_ms: (header.expire_at_ms != 0).then_some(header.expire_at_ms),
    })
}

fn expired(h: &RecordHeader, now_ms: u64) -> bool {
    h.expire_at_ms != 0 && h.expire_at_ms <= now_ms
}

impl Shard {
    /// Starts a GET. See the module essay.
    pub fn get_begin(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<GetStep, StorageError> {
        self.get_begin_inner(db, key, now_ms, 0)
    }

    fn get_begin_inner(
        &mut self,
        db: Db,
        key: &[u8],
        now_ms: u64,
        restarts: u32,
    ) -> Result<GetStep, StorageError> {
        if (db as usize) >= self.indexes.len() {
            return self.get(db, key, now_ms).map(GetStep::Done);
        }
        if restarts > RESTARTS_MAX {
            return self.get(db, key, now_ms).map(GetStep::Done);
        }
        let h = self.hash(db, key);
        let candidates = CandidateList::collect(self.indexes[db as usize].candidates(h));
        self.plan_from(db, key, candidates, now_ms, restarts)
    }

    /// Tries candidates in order: staged ones are checked in memory, the
    /// first on the device becomes a read plan.
    fn plan_from(
        &mut self,
        db: Db,
        key: &[u8],
        mut candidates: CandidateList,
        now_ms: u64,
        restarts: u32,
    ) -> Result<GetStep, StorageError> {
        while let Some(addr) = candidates.pop_front() {
            let (block, off) = self.shared.layout.split(addr);
            if let Some(ob) = &self.open {
                if ob.block == block && off < ob.write_pos {
                    let r =
                        decode_record(&self.staging.as_slice()[off..ob.write_pos], ob.block_seq)
                            .ok_or_else(|| {
                                StorageError::Corrupt(format!(
                                    "staged record at {addr:?} fails its check"
                                ))
                            })?;
                    if r.header.db != db || r.key != key {
                        continue;
                    }
                    if r.header.flags & FLAG_LARGE != 0 {
                        return self.get(db, key, now_ms).map(GetStep::Done);
                    }
                    if expired(&r.header, now_ms) {
                        return Ok(GetStep::Done(None));
                    }
                    let header = r.header;
                    return value_of(&header, r.value.to_vec()).map(|v| GetStep::Done(Some(v)));
                }
            }
            let Some(info) = self.blocks.get(&block) else {
                return Err(StorageError::Corrupt(format!(
                    "address {addr:?} in a block this shard does not own"
                )));
            };
            let block_seq = info.block_seq;
            let (dev, base) = self.shared.layout.locate(block);
            let Some(fd) = self.shared.layout.devices[dev].raw_fd() else {
                return self.get(db, key, now_ms).map(GetStep::Done);
            };
            let bs = self.shared.layout.block_size_bytes as usize;
            let aligned = off & !(IO_ALIGN_BYTES - 1);
            let len = READ_WINDOW_BYTES.min(bs - aligned);
            return Ok(GetStep::Read(ReadPlan {
                fd,
                offset_bytes: base + aligned as u64,
                len_bytes: len,
                rel: off - aligned,
                room: bs - aligned,
                addr,
                block_seq,
                rest: candidates,
                restarts,
            }));
        }
        Ok(GetStep::Done(None))
    }

    /// Continues a GET with the bytes `plan` asked for (`buf.len() >= plan.len_bytes`).
    pub fn get_continue(
        &mut self,
        db: Db,
        key: &[u8],
        plan: ReadPlan,
        buf: &[u8],
        now_ms: u64,
    ) -> Result<GetStep, StorageError> {
        Ok(
            match self.get_continue_in_place(db, key, plan, buf, now_ms)? {
                GetReadStep::InBuffer {
                    kind,
                    range,
                    expire_at_ms,
                } => GetStep::Done(Some(Value {
                    kind,
                    bytes: buf[range].to_vec(),
                    expire_at_ms,
                })),
                GetReadStep::Done(v) => GetStep::Done(v),
                GetReadStep::Read(plan) => GetStep::Read(plan),
            },
        )
    }

    /// As [`Shard::get_continue`], but a value found in `buf` is answered as its range
    /// there: the caller encodes the reply straight from the read buffer, no copy.
    pub fn get_continue_in_place(
        &mut self,
        db: Db,
        key: &[u8],
        plan: ReadPlan,
        buf: &[u8],
        now_ms: u64,
    ) -> Result<GetReadStep, StorageError> {
        let step = |s: Result<GetStep, StorageError>| {
            s.map(|step| match step {
                GetStep::Done(v) => GetReadStep::Done(v),
                GetStep::Read(plan) => GetReadStep::Read(plan),
            })
        };
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += plan.len_bytes as u64;
        let bytes = &buf[..plan.len_bytes.min(buf.len())];
        let Some(hdr) = RecordHeader::decode(&bytes[plan.rel.min(bytes.len())..]) else {
            return step(self.get_begin_inner(db, key, now_ms, plan.restarts + 1));
        };
        let need = plan.rel + hdr.record_len();
        if need > plan.len_bytes {
            if need > plan.room {
                // Cannot be a record of this block: the block changed under the read.
                return step(self.get_begin_inner(db, key, now_ms, plan.restarts + 1));
            }
            let len = need.div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
            return Ok(GetReadStep::Read(ReadPlan {
                len_bytes: len.min(plan.room),
                ..plan
            }));
        }
        let Some(r) = decode_record(&bytes[plan.rel..need], plan.block_seq) else {
            return step(self.get_begin_inner(db, key, now_ms, plan.restarts + 1));
        };
        if r.header.record_type != RecordType::Put || r.header.db != db || r.key != key {
            let rest = plan.rest;
            return step(self.plan_from(db, key, rest, now_ms, plan.restarts));
        }
        if r.header.flags & FLAG_LARGE != 0 {
            return self.get(db, key, now_ms).map(GetReadStep::Done);
        }
        if expired(&r.header, now_ms) {
            return Ok(GetReadStep::Done(None));
        }
        let header = r.header;
        let kind = ValueKind::from_u8(header.value_kind).ok_or_else(|| {
            StorageError::Corrupt(format!("unknown value kind {}", header.value_kind))
        })?;
        // The record's layout: header, key, value (see `decode_record`).
        let start = plan.rel + RECORD_HEADER_BYTES + usize::from(header.key_len);
        let range = start..start + header.value_len as usize;
        debug_assert_eq!(&buf[range.clone()], r.value);
        Ok(GetReadStep::InBuffer {
            kind,
            range,
            expire_at_ms: (header.expire_at_ms != 0).then_some(header.expire_at_ms),
        })
    }
}

/// Where an asynchronous SET stands.
pub enum PutStep {
    Done,
    Read(ReadPlan),
}

impl Shard {
    /// Starts a plain SET (insert or overwrite, no conditions). When the key may
    /// already exist on the device, returns the read that verifies it instead of
    /// blocking on it; everything else completes here.
    #[allow(clippy::too_many_arguments)]
    pub fn put_begin(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<PutStep, StorageError> {
        self.put_begin_inner(db, key, kind, bytes, expire_at_ms, now_ms, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn put_begin_inner(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
        restarts: u32,
    ) -> Result<PutStep, StorageError> {
        let sync = |s: &mut Shard| {
            s.put(db, key, kind, bytes, expire_at_ms, now_ms)
                .map(|_| PutStep::Done)
        };
        let too_big = key.len() > self.key_len_max() || bytes.len() as u64 > self.value_len_max();
        if (db as usize) >= self.indexes.len() || restarts > RESTARTS_MAX || too_big {
            return sync(self);
        }
        let h = self.hash(db, key);
        let mut candidates = CandidateList::collect(self.indexes[db as usize].candidates(h));
        // Any staged candidate, or a device without an fd: the synchronous path is cheap
        // or unavoidable.
        for a in candidates.remaining() {
            let (block, off) = self.shared.layout.split(a);
            if self
                .open
                .as_ref()
                .is_some_and(|ob| ob.block == block && off < ob.write_pos)
            {
                return sync(self);
            }
        }
        let Some(first) = candidates.pop_front() else {
            return sync(self);
        };
        let (block, off) = self.shared.layout.split(first);
        let Some(info) = self.blocks.get(&block) else {
            return sync(self);
        };
        let block_seq = info.block_seq;
        let (dev, base) = self.shared.layout.locate(block);
        let Some(fd) = self.shared.layout.devices[dev].raw_fd() else {
            return sync(self);
        };
        let bs = self.shared.layout.block_size_bytes as usize;
        let aligned = off & !(IO_ALIGN_BYTES - 1);
        Ok(PutStep::Read(ReadPlan {
            fd,
            offset_bytes: base + aligned as u64,
            len_bytes: READ_WINDOW_BYTES.min(bs - aligned),
            rel: off - aligned,
            room: bs - aligned,
            addr: first,
            block_seq,
            rest: candidates,
            restarts,
        }))
    }

    /// Continues a SET with the bytes `plan` asked for.
    #[allow(clippy::too_many_arguments)]
    pub fn put_continue(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire_at_ms: Option<u64>,
        plan: ReadPlan,
        buf: &[u8],
        now_ms: u64,
    ) -> Result<PutStep, StorageError> {
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += plan.len_bytes as u64;
        let restart = plan.restarts + 1;
        let data = &buf[..plan.len_bytes.min(buf.len())];
        let Some(hdr) = RecordHeader::decode(&data[plan.rel.min(data.len())..]) else {
            return self.put_begin_inner(db, key, kind, bytes, expire_at_ms, now_ms, restart);
        };
        let need = plan.rel + hdr.record_len();
        if need > plan.len_bytes {
            if need > plan.room {
                return self.put_begin_inner(db, key, kind, bytes, expire_at_ms, now_ms, restart);
            }
            let len = need.div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
            return Ok(PutStep::Read(ReadPlan {
                len_bytes: len.min(plan.room),
                ..plan
            }));
        }
        let Some(r) = decode_record(&data[plan.rel..need], plan.block_seq) else {
            return self.put_begin_inner(db, key, kind, bytes, expire_at_ms, now_ms, restart);
        };
        let h = self.hash(db, key);
        let still_indexed = self.indexes[db as usize]
            .candidates(h)
            .any(|a| a == plan.addr);
        if !still_indexed {
            // The index moved on while we read: look again.
            return self.put_begin_inner(db, key, kind, bytes, expire_at_ms, now_ms, restart);
        }
        if r.header.record_type == RecordType::Put && r.header.db == db && r.key == key {
            // `put_found` needs the old record's header, and its payload only when it is a
            // large value's root (to retire the extents): no copy of key or value otherwise.
            let large = r.header.flags & FLAG_LARGE != 0;
            let old = Found {
                addr: plan.addr,
                rec: OwnedRecord {
                    header: r.header,
                    key: Vec::new(),
                    value: if large { r.value.to_vec() } else { Vec::new() },
                },
            };
            let expire = expire_at_ms.unwrap_or(0);
            self.put_found(db, key, kind, bytes, expire, h, Some(old))?;
            return Ok(PutStep::Done);
        }
        // A different key behind the same hash fragment (rare): the synchronous path
        // checks the remaining candidates.
        self.put(db, key, kind, bytes, expire_at_ms, now_ms)?;
        Ok(PutStep::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::{CandidateList, GetReadStep, PutStep, ReadPlan};
    use crate::device::{BlockDevice, MemDevice};
    use crate::storage::index::Address;
    use crate::storage::{open, open_on, FsyncPolicy, Shard, StoreConfig, ValueKind};
    use std::os::unix::fs::FileExt;
    use std::path::PathBuf;
    use std::sync::Arc;

    /// A one-shard store on a file (`fresh`: a new one); `hash_mask` 0 makes every key
    /// collide.
    fn file_shard(name: &str, hash_mask: u64, fresh: bool) -> (Shard, PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "lavik-get-async-{}-{name}.data",
            std::process::id()
        ));
        if fresh {
            let _ = std::fs::remove_file(&path);
        }
        let cfg = StoreConfig {
            data_files: vec![path.clone()],
            create_size_bytes: 16 << 20,
            shard_count: 1,
            fsync: FsyncPolicy::Always,
            direct_io: false,
            block_size_bytes: 64 << 10,
            debug_hash_mask: hash_mask,
            ..StoreConfig::default()
        };
        let shard = open(&cfg).unwrap().shards.pop().unwrap();
        (shard, path)
    }

    /// Performs a plan's read the way the worker's ring does.
    fn read(path: &PathBuf, plan: &ReadPlan) -> Vec<u8> {
        let mut buf = vec![0u8; plan.len_bytes];
        let file = std::fs::File::open(path).unwrap();
        file.read_exact_at(&mut buf, plan.offset_bytes).unwrap();
        buf
    }

    /// Runs an asynchronous GET to its end: the value bytes, or None when missing. A value
    /// found on the device must come back as a range of the read buffer.
    fn get_async(shard: &mut Shard, path: &PathBuf, key: &[u8]) -> Option<Vec<u8>> {
        let mut plan = match shard.get_begin(0, key, 1).unwrap() {
            super::GetStep::Done(v) => {
                assert!(v.is_none(), "flushed values are read from the device");
                return None;
            }
            super::GetStep::Read(plan) => plan,
        };
        loop {
            let buf = read(path, &plan);
            match shard.get_continue_in_place(0, key, plan, &buf, 1).unwrap() {
                GetReadStep::InBuffer { kind, range, .. } => {
                    assert_eq!(kind, ValueKind::String);
                    return Some(buf[range].to_vec());
                }
                GetReadStep::Done(v) => return v.map(|v| v.bytes),
                GetReadStep::Read(next) => plan = next,
            }
        }
    }

    // Candidates come back in index order whether they fit inline or spill to the heap.
    #[test]
    fn candidate_list_keeps_order_past_the_inline_slots() {
        for n in [0u64, 1, 4, 5, 9] {
            let mut list = CandidateList::collect((0..n).map(Address));
            assert_eq!(list.remaining().count() as u64, n);
            let popped: Vec<u64> = std::iter::from_fn(|| list.pop_front().map(|a| a.0)).collect();
            assert_eq!(popped, (0..n).collect::<Vec<_>>());
            assert!(list.pop_front().is_none());
        }
    }

    // With every key on one hash fragment (more candidates than fit inline), the
    // asynchronous GET still answers each key with its own value, from the read buffer.
    #[test]
    fn async_get_walks_colliding_candidates() {
        let (mut shard, _) = file_shard("collide-get", 0, true);
        for i in 0..7u8 {
            let value = vec![i; 100 + usize::from(i)];
            shard
                .put(0, &[b'k', i], ValueKind::String, &value, None, 1)
                .unwrap();
        }
        // Reopened, nothing is staged: every value is on the device.
        shard.shutdown(false).unwrap();
        let (mut shard, path) = file_shard("collide-get", 0, false);
        for i in 0..7u8 {
            let got = get_async(&mut shard, &path, &[b'k', i]);
            assert_eq!(got, Some(vec![i; 100 + usize::from(i)]), "key {i}");
        }
        assert_eq!(get_async(&mut shard, &path, b"absent"), None);
        drop(shard);
        let _ = std::fs::remove_file(&path);
    }

    // An asynchronous SET, with distinct hashes and with every key colliding, overwrites
    // its key only, and its old record's bytes stop counting as live.
    #[test]
    fn async_set_overwrites_the_right_key() {
        for mask in [u64::MAX, 0] {
            async_set_overwrites(mask);
        }
    }

    fn async_set_overwrites(mask: u64) {
        let name = format!("set-{mask:x}");
        let (mut shard, _) = file_shard(&name, mask, true);
        for i in 0..6u8 {
            shard
                .put(0, &[b'k', i], ValueKind::String, &[i; 64], None, 1)
                .unwrap();
        }
        shard.shutdown(false).unwrap();
        let (mut shard, path) = file_shard(&name, mask, false);
        let live_before = shard.stats().live_bytes;
        let key = [b'k', 0];
        let mut step = shard
            .put_begin(0, &key, ValueKind::String, b"new", None, 1)
            .unwrap();
        assert!(
            matches!(step, PutStep::Read(_)),
            "the old record is on the device"
        );
        while let PutStep::Read(plan) = step {
            let buf = read(&path, &plan);
            step = shard
                .put_continue(0, &key, ValueKind::String, b"new", None, plan, &buf, 1)
                .unwrap();
        }
        assert_eq!(shard.key_count(0), 6);
        for i in 0..6u8 {
            let want = if i == 0 { b"new".to_vec() } else { vec![i; 64] };
            let got = shard.get(0, &[b'k', i], 1).unwrap().map(|v| v.bytes);
            assert_eq!(got, Some(want), "key {i}");
        }
        let shrink =
            crate::storage::format::record_len(2, 64) - crate::storage::format::record_len(2, 3);
        assert_eq!(shard.stats().live_bytes, live_before - shrink as u64);
        drop(shard);
        let _ = std::fs::remove_file(&path);
    }

    // Without a file descriptor (memory device) the async GET answers
    // synchronously and agrees with get().
    #[test]
    fn mem_device_answers_synchronously() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("m", 64 << 20));
        let cfg = StoreConfig {
            shard_count: 1,
            fsync: FsyncPolicy::Always,
            ..StoreConfig::default()
        };
        let mut shard = open_on(vec![dev], &cfg).unwrap().shards.pop().unwrap();
        shard
            .put(0, b"k", ValueKind::String, b"v", None, 1)
            .unwrap();
        shard.flush().unwrap();
        match shard.get_begin(0, b"k", 1).unwrap() {
            super::GetStep::Done(Some(v)) => assert_eq!(v.bytes, b"v"),
            _ => panic!("expected an immediate answer"),
        }
        assert!(matches!(
            shard.get_begin(0, b"nope", 1).unwrap(),
            super::GetStep::Done(None)
        ));
    }
}
