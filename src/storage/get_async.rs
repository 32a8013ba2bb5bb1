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

use super::format::{decode_record, RecordHeader, RecordType, FLAG_LARGE};
use super::index::Address;
use super::shard::{Found, OwnedRecord, Shard};
use super::{Db, StorageError, Value, ValueKind};
use std::os::fd::RawFd;

/// First read window for a record (matches the synchronous path).
const READ_WINDOW_BYTES: usize = 8192;
const IO_ALIGN_BYTES: usize = 4096;
/// Restarts after a stale read before falling back to the synchronous path.
const RESTARTS_MAX: u32 = 3;

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
    rest: Vec<Address>,
    restarts: u32,
}

pub enum GetStep {
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
        let candidates: Vec<Address> = self.indexes[db as usize].candidates(h).collect();
        self.plan_from(db, key, candidates, now_ms, restarts)
    }

    /// Tries candidates in order: staged ones are checked in memory, the
    /// first on the device becomes a read plan.
    fn plan_from(
        &mut self,
        db: Db,
        key: &[u8],
        mut candidates: Vec<Address>,
        now_ms: u64,
        restarts: u32,
    ) -> Result<GetStep, StorageError> {
        candidates.reverse();
        while let Some(addr) = candidates.pop() {
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
            candidates.reverse();
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
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += plan.len_bytes as u64;
        let bytes = &buf[..plan.len_bytes.min(buf.len())];
        let Some(hdr) = RecordHeader::decode(&bytes[plan.rel.min(bytes.len())..]) else {
            return self.get_begin_inner(db, key, now_ms, plan.restarts + 1);
        };
        let need = plan.rel + hdr.record_len();
        if need > plan.len_bytes {
            if need > plan.room {
                // Cannot be a record of this block: the block changed under the read.
                return self.get_begin_inner(db, key, now_ms, plan.restarts + 1);
            }
            let len = need.div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
            return Ok(GetStep::Read(ReadPlan {
                len_bytes: len.min(plan.room),
                ..plan
            }));
        }
        let Some(r) = decode_record(&bytes[plan.rel..need], plan.block_seq) else {
            return self.get_begin_inner(db, key, now_ms, plan.restarts + 1);
        };
        if r.header.record_type != RecordType::Put || r.header.db != db || r.key != key {
            let rest = plan.rest;
            return self.plan_from(db, key, rest, now_ms, plan.restarts);
        }
        if r.header.flags & FLAG_LARGE != 0 {
            return self.get(db, key, now_ms).map(GetStep::Done);
        }
        if expired(&r.header, now_ms) {
            return Ok(GetStep::Done(None));
        }
        let header = r.header;
        value_of(&header, r.value.to_vec()).map(|v| GetStep::Done(Some(v)))
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
        let candidates: Vec<Address> = self.indexes[db as usize].candidates(h).collect();
        let Some(&first) = candidates.first() else {
            return sync(self);
        };
        // Any staged candidate, or a device without an fd: the synchronous path is cheap
        // or unavoidable.
        for &a in &candidates {
            let (block, off) = self.shared.layout.split(a);
            if self
                .open
                .as_ref()
                .is_some_and(|ob| ob.block == block && off < ob.write_pos)
            {
                return sync(self);
            }
        }
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
            rest: candidates[1..].to_vec(),
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
            let old = Found {
                addr: plan.addr,
                rec: OwnedRecord {
                    header: r.header,
                    key: r.key.to_vec(),
                    value: r.value.to_vec(),
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
    use crate::device::{BlockDevice, MemDevice};
    use crate::storage::{open_on, FsyncPolicy, StoreConfig, ValueKind};
    use std::sync::Arc;

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
