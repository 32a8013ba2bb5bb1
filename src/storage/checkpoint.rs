//! The index checkpoint: written by a clean shutdown, used by the next start instead of
//! scanning every block.
//!
//! A shard's checkpoint is a byte stream (layout in `docs/storage-format.md`, section 7) cut
//! into pieces, one per *checkpoint block* (kind 2): block header, one Checkpoint record whose
//! sequence field is the checkpoint id and whose payload is the piece, marker. The metadata
//! slot written last by the clean shutdown names the id, and only when every shard wrote its
//! checkpoint; opening writes a new slot without it, so a checkpoint is used at most once and
//! never after anything changed. Anything missing or failing a check means: scan instead.
//!
//! The index does not keep full hashes, so writing the checkpoint re-reads every block that
//! holds live records (sequentially, one read per block) to hash their keys; the cost moves
//! from the next start to this shutdown.
use super::alloc::BlockId;
use super::format::{
    decode_record, encode_record, record_len, BlockHeaderPayload, MarkerPayload, RecordHeader,
    RecordType, BLOCK_KIND_CHECKPOINT, CHUNK_ALIGN_BYTES, DB_COUNT, MARKER_RECORD_BYTES,
};
use super::index::Address;
use super::recovery::parse_chunk;
use super::shard::{BlockInfo, Shard};
use super::{Db, StorageError};
use crate::device::AlignedBuf;
use std::collections::BTreeMap;

const CHECKPOINT_MAGIC: [u8; 8] = *b"LVKCKPT2";
/// A version-1 stream: no next-group-id trailer (its store holds no groups).
const CHECKPOINT_MAGIC_V1: [u8; 8] = *b"LVKCKPT1";
/// The next group id, after the expiry entries of a version-2 stream.
const STREAM_TRAILER_BYTES: usize = 8;
const STREAM_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8 * DB_COUNT + 8 + 8 + 8;
const BLOCK_ENTRY_BYTES: usize = 32 + 4 * DB_COUNT;
const INDEX_ENTRY_BYTES: usize = 16;
const EXPIRY_ENTRY_BYTES: usize = 16;
/// Address bits of an index entry's second word; the db sits above them.
const DB_SHIFT: u32 = 56;

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A little-endian reader over the stream that fails instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

impl Shard {
    /// Serialises this shard's index, block table and sequence state into checkpoint blocks
    /// (not entered in the block table: the next start frees them, used or not). Call only
    /// after a flush with nothing staged.
    pub(crate) fn write_checkpoint(&mut self, id: u64) -> Result<(), StorageError> {
        let stream = self.checkpoint_stream()?;
        let piece_max = self.fragment_payload_max();
        let pieces = stream.len().div_ceil(piece_max).max(1);
        let mut written: Vec<BlockId> = Vec::new();
        for piece in stream.chunks(piece_max) {
            written.push(self.write_checkpoint_block(id, piece)?);
        }
        debug_assert_eq!(written.len(), pieces);
        self.sync_dirty()?;
        tracing::info!(
            shard = self.id,
            bytes = stream.len(),
            blocks = pieces,
            "index checkpoint written"
        );
        Ok(())
    }

    fn checkpoint_stream(&mut self) -> Result<Vec<u8>, StorageError> {
        let mut by_block: BTreeMap<BlockId, Vec<(Db, Address)>> = BTreeMap::new();
        for (d, ix) in self.indexes.iter().enumerate() {
            let layout = &self.shared.layout;
            ix.for_each(|a| {
                by_block
                    .entry(layout.split(a).0)
                    .or_default()
                    .push((d as Db, a))
            });
        }
        let mut entries: Vec<(u64, u64)> = Vec::new();
        let mut volatile: Vec<(u64, u64)> = Vec::new();
        let bs = self.shared.layout.block_size_bytes as usize;
        let mut buf = AlignedBuf::new_zeroed(bs);
        for (block, addrs) in by_block {
            let block_seq = self
                .blocks
                .get(&block)
                .ok_or_else(|| {
                    StorageError::Corrupt(format!("index points into unknown block {}", block.0))
                })?
                .block_seq;
            let (dev, base) = self.shared.layout.locate(block);
            self.shared.layout.devices[dev].read_at(base, &mut buf)?;
            self.counters.device_reads += 1;
            self.counters.device_read_bytes += bs as u64;
            for (db, a) in addrs {
                let (_, off) = self.shared.layout.split(a);
                let rec = decode_record(&buf.as_slice()[off..], block_seq).ok_or_else(|| {
                    StorageError::Corrupt(format!("record at {a:?} fails its check"))
                })?;
                let word = a.0 | (u64::from(db) << DB_SHIFT);
                entries.push((self.hash(db, rec.key), word));
                if rec.header.expire_at_ms != 0 {
                    volatile.push((word, rec.header.expire_at_ms));
                }
            }
        }
        let mut out = Vec::with_capacity(
            STREAM_HEADER_BYTES
                + self.blocks.len() * BLOCK_ENTRY_BYTES
                + entries.len() * INDEX_ENTRY_BYTES
                + volatile.len() * EXPIRY_ENTRY_BYTES
                + STREAM_TRAILER_BYTES,
        );
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        put_u32(&mut out, self.id);
        put_u32(&mut out, 0);
        put_u64(&mut out, self.next_seq);
        for w in self.watermarks {
            put_u64(&mut out, w);
        }
        put_u64(&mut out, self.blocks.len() as u64);
        put_u64(&mut out, entries.len() as u64);
        put_u64(&mut out, volatile.len() as u64);
        let mut blocks: Vec<(&BlockId, &BlockInfo)> = self.blocks.iter().collect();
        blocks.sort_by_key(|(b, _)| **b);
        for (b, i) in blocks {
            put_u32(&mut out, b.0);
            put_u32(&mut out, i.kind);
            put_u64(&mut out, i.block_seq);
            put_u32(&mut out, i.used_bytes);
            put_u32(&mut out, i.tomb_bytes);
            put_u32(
                &mut out,
                u32::from(i.has_tombs) | (u32::from(i.no_defrag) << 1),
            );
            put_u32(&mut out, 0);
            for l in i.live_bytes {
                put_u32(&mut out, l);
            }
        }
        for (h, w) in entries {
            put_u64(&mut out, h);
            put_u64(&mut out, w);
        }
        for (w, e) in volatile {
            put_u64(&mut out, w);
            put_u64(&mut out, e);
        }
        put_u64(&mut out, self.shared.groups.next());
        Ok(out)
    }

    fn write_checkpoint_block(&mut self, id: u64, piece: &[u8]) -> Result<BlockId, StorageError> {
        let (block, block_seq) = self
            .shared
            .alloc_block(false)
            .ok_or(StorageError::DeviceFull)?;
        let payload = BlockHeaderPayload {
            store_uuid: self.shared.layout.store_uuid,
            block_seq,
            shard_id: self.id,
            block_kind: BLOCK_KIND_CHECKPOINT,
            global_block: block.0,
        }
        .encode();
        let total =
            (record_len(0, payload.len()) + record_len(0, piece.len()) + MARKER_RECORD_BYTES)
                .next_multiple_of(CHUNK_ALIGN_BYTES as usize);
        let mut buf = AlignedBuf::new_zeroed(total);
        let out = buf.as_mut_slice();
        let plain = |record_type, seq, len: usize| RecordHeader {
            record_type,
            flags: 0,
            value_kind: 0,
            db: 0,
            key_len: 0,
            value_len: len as u32,
            crc: 0,
            seq,
            expire_at_ms: 0,
        };
        let mut pos = encode_record(
            out,
            block_seq,
            plain(RecordType::BlockHeader, id, payload.len()),
            &[],
            &payload,
        );
        pos += encode_record(
            &mut out[pos..],
            block_seq,
            plain(RecordType::Checkpoint, id, piece.len()),
            &[],
            piece,
        );
        let marker = MarkerPayload {
            chunk_start: 0,
            chunk_crc: crc32c::crc32c(&out[..pos]),
            block_seq,
            flush_watermarks: self.watermarks,
            decided_below: self.shared.groups.decided_below(),
        }
        .encode();
        encode_record(
            &mut out[pos..],
            block_seq,
            plain(RecordType::Marker, id, marker.len()),
            &[],
            &marker,
        );
        let (dev, base) = self.shared.layout.locate(block);
        self.shared.layout.devices[dev].write_at(base, &buf)?;
        self.counters.device_writes += 1;
        self.counters.device_write_bytes += total as u64;
        self.dirty_devices[dev] = true;
        Ok(block)
    }

    /// Loads the checkpoint `id` from this shard's checkpoint blocks. `Ok(None)` when it is
    /// missing or damaged (the caller then scans); on success returns the blocks in use.
    pub(crate) fn load_checkpoint(
        &mut self,
        mut pieces: Vec<(BlockId, u64, u32)>,
        id: u64,
    ) -> Result<Option<Vec<BlockId>>, StorageError> {
        pieces.sort_by_key(|p| p.1);
        let bs = self.shared.layout.block_size_bytes as usize;
        let mut buf = AlignedBuf::new_zeroed(bs);
        let mut stream = Vec::new();
        for &(block, block_seq, _) in &pieces {
            let (dev, base) = self.shared.layout.locate(block);
            self.shared.layout.devices[dev].read_at(base, &mut buf)?;
            let bytes = buf.as_slice();
            let Some(chunk) = parse_chunk(bytes, 0, block_seq) else {
                continue;
            };
            let Some(&(off, hdr)) = chunk.records.get(1) else {
                continue;
            };
            if hdr.record_type != RecordType::Checkpoint || hdr.seq != id {
                continue;
            }
            let rec = decode_record(&bytes[off..], block_seq).expect("chunk parsed");
            stream.extend_from_slice(rec.value);
        }
        Ok(self.apply_checkpoint(&stream))
    }

    fn apply_checkpoint(&mut self, stream: &[u8]) -> Option<Vec<BlockId>> {
        let mut r = Reader {
            bytes: stream,
            pos: 0,
        };
        let trailer = match r.take(8)? {
            m if m == CHECKPOINT_MAGIC => STREAM_TRAILER_BYTES as u64,
            m if m == CHECKPOINT_MAGIC_V1 => 0,
            _ => return None,
        };
        if r.u32()? != self.id {
            return None;
        }
        r.u32()?;
        self.next_seq = r.u64()?;
        for d in 0..DB_COUNT {
            self.watermarks[d] = r.u64()?;
        }
        let (n_blocks, n_entries, n_volatile) = (r.u64()?, r.u64()?, r.u64()?);
        let expected = STREAM_HEADER_BYTES as u64
            + n_blocks * BLOCK_ENTRY_BYTES as u64
            + n_entries * INDEX_ENTRY_BYTES as u64
            + n_volatile * EXPIRY_ENTRY_BYTES as u64
            + trailer;
        if expected != stream.len() as u64 {
            return None;
        }
        let mut kept = Vec::with_capacity(n_blocks as usize);
        for _ in 0..n_blocks {
            let block = BlockId(r.u32()?);
            let kind = r.u32()?;
            let block_seq = r.u64()?;
            let mut info = BlockInfo::new(block_seq, kind, true);
            info.used_bytes = r.u32()?;
            info.tomb_bytes = r.u32()?;
            let flags = r.u32()?;
            info.has_tombs = flags & 1 != 0;
            info.no_defrag = flags & 2 != 0;
            r.u32()?;
            for d in 0..DB_COUNT {
                info.live_bytes[d] = r.u32()?;
            }
            if block.0 >= self.shared.layout.total_blocks() {
                return None;
            }
            self.blocks.insert(block, info);
            kept.push(block);
        }
        let offset_mask = (1u64 << DB_SHIFT) - 1;
        for _ in 0..n_entries {
            let (h, word) = (r.u64()?, r.u64()?);
            let db = (word >> DB_SHIFT) as usize;
            let addr = Address(word & offset_mask);
            if db >= DB_COUNT || !self.blocks.contains_key(&self.shared.layout.split(addr).0) {
                return None;
            }
            self.indexes[db].insert(h, addr);
        }
        for _ in 0..n_volatile {
            let (word, expire) = (r.u64()?, r.u64()?);
            let db = (word >> DB_SHIFT) as usize;
            if db >= DB_COUNT {
                return None;
            }
            self.expiry_add(db as Db, expire, Address(word & offset_mask));
        }
        if trailer != 0 {
            self.shared.groups.raise_next(r.u64()?);
        }
        Some(kept)
    }
}
