//! `lavik --check-data-file PATH...`: an offline integrity check of a store that is not
//! running. It opens the files the way the server does (same exclusive `flock`, so a running
//! server's store is refused), and decodes with the recovery scan's own functions
//! (`format.rs`, `recovery::parse_chunk`): labels, metadata slots, block headers, every
//! chunk's marker and CRC, every record's CRC. Nothing is written.
//!
//! Telling a torn write from damage. A crash may leave the last chunk of a block (or, with
//! overlapping group commits, a chunk before a later committed one) partly written: the
//! sectors the write did not reach still hold zeros or a previous use's bytes, which fail
//! their CRC (the CRC is seeded with the block's sequence number). So a record that fails
//! its CRC is *damage* only if every 4096-byte sector it touches provably holds bytes of
//! the same write, i.e. also holds a record of the same chunk that verifies; otherwise the
//! chunk is reported as torn (normal after a crash). A flipped byte inside a record whose
//! neighbours verify is therefore damage, a chunk cut at a sector boundary is torn.
use super::format::{
    decode_record, Label, LabelState, MetaSlot, RecordHeader, RecordType, BLOCK_KIND_CHECKPOINT,
    BLOCK_KIND_EXTENT, BLOCK_KIND_LOG, CHUNK_ALIGN_BYTES, DB_COUNT, FLAG_LARGE,
    META_SLOT_OFFSETS_BYTES, RECORD_HEADER_BYTES,
};
use super::recovery::{parse_block_header, parse_chunk};
use crate::device::{AlignedBuf, BlockDevice, FileDevice};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Exit code: the store checked out (torn tail chunks allowed).
pub const CHECK_CLEAN: i32 = 0;
/// Exit code: damage found.
pub const CHECK_DAMAGED: i32 = 1;
/// Exit code: the files could not be checked (missing, locked, foreign, incomplete set).
pub const CHECK_CANNOT: i32 = 2;

/// Bytes of a device's start that must be zero for it to count as blank (as `recovery`).
const BLANK_CHECK_BYTES: u64 = 1 << 20;

/// What a check found; `text` is the printed report.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub text: String,
    pub exit_code: i32,
    pub blocks_total: u64,
    pub blocks_used: u64,
    pub blocks_log: u64,
    pub blocks_extent: u64,
    pub blocks_checkpoint: u64,
    pub chunks: u64,
    pub records_put: u64,
    pub records_large: u64,
    pub records_tombstone: u64,
    pub records_fragment: u64,
    pub records_checkpoint: u64,
    pub records_page: u64,
    pub live_keys: u64,
    pub live_keys_with_expiry: u64,
    pub live_tombstones: u64,
    pub torn_chunks: u64,
    pub damaged_chunks: u64,
    /// One line per damage found (block, device offset, what).
    pub damage: Vec<String>,
}

/// Newest record seen for one (shard, db, key).
struct Newest {
    seq: u64,
    tombstone: bool,
    expires: bool,
}

/// Checks the store made of `paths` and returns the report (never panics on bad bytes).
pub fn check_data_files(paths: &[PathBuf]) -> CheckReport {
    let mut r = CheckReport::default();
    match run(paths, &mut r) {
        Ok(()) => {
            r.exit_code = if r.damage.is_empty() {
                CHECK_CLEAN
            } else {
                CHECK_DAMAGED
            };
        }
        Err(why) => {
            let _ = writeln!(r.text, "cannot check: {why}");
            r.exit_code = CHECK_CANNOT;
            return r;
        }
    }
    summarise(&mut r);
    r
}

fn summarise(r: &mut CheckReport) {
    let t = &mut r.text;
    let _ = writeln!(
        t,
        "blocks: {} total, {} in use ({} log, {} extent, {} checkpoint), {} chunks",
        r.blocks_total, r.blocks_used, r.blocks_log, r.blocks_extent, r.blocks_checkpoint, r.chunks
    );
    let _ = writeln!(
        t,
        "records: {} puts ({} large), {} tombstones, {} fragments, {} checkpoint pieces, {} collection pages",
        r.records_put,
        r.records_large,
        r.records_tombstone,
        r.records_fragment,
        r.records_checkpoint,
        r.records_page
    );
    let _ = writeln!(
        t,
        "index: {} live keys ({} with an expiry, expired or not), {} tombstones newest for their key",
        r.live_keys, r.live_keys_with_expiry, r.live_tombstones
    );
    let _ = writeln!(
        t,
        "torn chunks (normal after a crash, ignored by recovery): {}",
        r.torn_chunks
    );
    let _ = writeln!(t, "damaged chunks: {}", r.damaged_chunks);
    for d in &r.damage {
        let _ = writeln!(t, "DAMAGE: {d}");
    }
    let verdict = if r.damage.is_empty() {
        "clean"
    } else {
        "DAMAGED"
    };
    let _ = writeln!(t, "result: {verdict}");
}

fn run(paths: &[PathBuf], r: &mut CheckReport) -> Result<(), String> {
    if paths.is_empty() {
        return Err("no data file given".into());
    }
    let mut devices: Vec<(Box<dyn BlockDevice>, Label)> = Vec::new();
    for path in paths {
        // The server's own open: no creation, buffered reads, the same exclusive lock.
        let dev = FileDevice::open(path, false, None).map_err(|e| e.to_string())?;
        let cap = dev.capacity_bytes();
        let len = BLANK_CHECK_BYTES.min(cap) as usize;
        if len < CHUNK_ALIGN_BYTES as usize {
            return Err(format!("{}: too small to be a data file", path.display()));
        }
        let mut buf = AlignedBuf::new_zeroed(len);
        dev.read_at(0, &mut buf).map_err(|e| e.to_string())?;
        let bytes = buf.as_slice();
        let sector0 = &bytes[..CHUNK_ALIGN_BYTES as usize];
        let reserved_zero = bytes[CHUNK_ALIGN_BYTES as usize..].iter().all(|&b| b == 0);
        match Label::classify(sector0, reserved_zero) {
            LabelState::Valid(l) => {
                let _ = writeln!(
                    r.text,
                    "{}: label ok: store {}, device {} of {}, {} shards, block size {}, {} blocks at format, {} bytes now",
                    path.display(),
                    hex(&l.store_uuid),
                    l.device_index,
                    l.device_count,
                    l.shard_count,
                    l.block_size_bytes,
                    l.block_count,
                    cap
                );
                devices.push((Box::new(dev), l));
            }
            LabelState::Blank => {
                return Err(format!(
                    "{}: blank (never formatted), nothing to check",
                    path.display()
                ))
            }
            LabelState::Foreign => {
                return Err(format!(
                    "{}: not a lavik data file (unknown data at offset 0)",
                    path.display()
                ))
            }
            LabelState::Damaged(why) => {
                r.damage
                    .push(format!("{}: damaged label ({why})", path.display()));
                let _ = writeln!(r.text, "{}: damaged label ({why})", path.display());
                return Ok(());
            }
        }
    }
    let first = devices[0].1;
    for (dev, l) in &devices {
        if l.store_uuid != first.store_uuid
            || l.block_size_bytes != first.block_size_bytes
            || l.shard_count != first.shard_count
            || l.device_count as usize != devices.len()
        {
            return Err(format!(
                "{}: belongs to a different store or set of data files ({} files labelled, {} given)",
                dev.describe(),
                l.device_count,
                devices.len()
            ));
        }
        if dev.capacity_bytes() < l.capacity_bytes {
            r.damage.push(format!(
                "{}: smaller ({} bytes) than when formatted ({} bytes)",
                dev.describe(),
                dev.capacity_bytes(),
                l.capacity_bytes
            ));
        }
    }
    devices.sort_by_key(|d| d.1.device_index);
    if devices
        .iter()
        .enumerate()
        .any(|(i, d)| d.1.device_index as usize != i)
    {
        return Err("device index given twice".into());
    }
    check_meta(&*devices[0].0, first.store_uuid, r)?;
    let bs = u64::from(first.block_size_bytes);
    let one = devices.len() == 1;
    // Global numbering: in device order; a one-file store counts its current capacity.
    let mut layout: Vec<(usize, u64)> = Vec::new();
    for (d, (dev, l)) in devices.iter().enumerate() {
        let count = if one {
            l.block_count
                .max((dev.capacity_bytes() / bs).saturating_sub(1))
        } else {
            l.block_count
        };
        layout.extend((0..count).map(|i| (d, (i + 1) * bs)));
    }
    r.blocks_total = layout.len() as u64;
    let mut keys: Vec<HashMap<(u8, Vec<u8>), Newest>> =
        (0..first.shard_count).map(|_| HashMap::new()).collect();
    let mut watermarks = vec![[0u64; DB_COUNT]; first.shard_count as usize];
    let mut buf = AlignedBuf::new_zeroed(bs as usize);
    for (g, &(d, base)) in layout.iter().enumerate() {
        let dev = &*devices[d].0;
        dev.read_at(base, &mut buf).map_err(|e| e.to_string())?;
        let bytes = buf.as_slice();
        let place = format!("block {g} ({} at byte {base})", devices[d].0.describe());
        if bytes[..CHUNK_ALIGN_BYTES as usize].iter().all(|&b| b == 0) {
            continue; // free
        }
        let Some(h) = parse_block_header(bytes) else {
            r.damage.push(format!(
                "{place}: first sector is not blank but holds no valid block header"
            ));
            continue;
        };
        if h.store_uuid != first.store_uuid
            || h.global_block as usize != g
            || h.shard_id >= first.shard_count
        {
            r.damage.push(format!(
                "{place}: block header names store {}, block {}, shard {} (expected this store, block {g}, shard < {})",
                hex(&h.store_uuid),
                h.global_block,
                h.shard_id,
                first.shard_count
            ));
            continue;
        }
        let shard = h.shard_id as usize;
        let mut used = false;
        let align = CHUNK_ALIGN_BYTES as usize;
        let mut pos = 0;
        while pos + RECORD_HEADER_BYTES <= bytes.len() {
            if let Some(chunk) = parse_chunk(bytes, pos, h.block_seq) {
                if pos == 0
                    && chunk
                        .records
                        .first()
                        .is_none_or(|x| x.1.record_type != RecordType::BlockHeader)
                {
                    r.damage.push(format!(
                        "{place}: first chunk does not start with the block header"
                    ));
                    break;
                }
                used = true;
                r.chunks += 1;
                for (have, &w) in watermarks[shard]
                    .iter_mut()
                    .zip(&chunk.marker.flush_watermarks)
                {
                    *have = (*have).max(w);
                }
                for &(off, hdr) in &chunk.records {
                    count_record(r, &mut keys[shard], bytes, off, &hdr);
                }
                pos = chunk.end.next_multiple_of(align);
                continue;
            }
            if bytes[pos..].iter().all(|&b| b == 0) {
                break; // the unwritten rest of the block
            }
            let resync = (pos + align..bytes.len())
                .step_by(align)
                .find(|&s| parse_chunk(bytes, s, h.block_seq).is_some());
            let end = resync.unwrap_or(bytes.len());
            match damaged_record(&bytes[..end], pos, h.block_seq) {
                Some(why) => {
                    r.damaged_chunks += 1;
                    r.damage.push(format!(
                        "{place} (block_seq {}, shard {shard}): chunk at block offset {pos}: {why}{}",
                        h.block_seq,
                        if pos == 0 {
                            "; recovery treats the whole block as free"
                        } else if resync.is_some() {
                            "; recovery skips this chunk and loses its records"
                        } else {
                            "; recovery ignores it and the rest of the block"
                        }
                    ));
                }
                None => {
                    // A write that did not finish. Stale bytes of a previous use after the
                    // last chunk (nothing of this use verifies there) are not a chunk.
                    if decode_record(&bytes[pos..], h.block_seq).is_some() || resync.is_some() {
                        r.torn_chunks += 1;
                        let _ = writeln!(
                            r.text,
                            "{place}: torn chunk at block offset {pos} (a write cut short by a crash; ignored by recovery)"
                        );
                    }
                }
            }
            // As recovery: a block whose first chunk does not commit is free, whatever
            // follows; otherwise the walk goes on at the next committed chunk.
            match resync {
                Some(s) if pos != 0 => pos = s,
                _ => break,
            }
        }
        if used {
            r.blocks_used += 1;
            match h.block_kind {
                BLOCK_KIND_LOG => r.blocks_log += 1,
                BLOCK_KIND_EXTENT => r.blocks_extent += 1,
                BLOCK_KIND_CHECKPOINT => r.blocks_checkpoint += 1,
                k => r.damage.push(format!("{place}: unknown block kind {k}")),
            }
        }
    }
    for (shard, map) in keys.iter().enumerate() {
        for ((db, _), n) in map {
            if n.seq < watermarks[shard][*db as usize] {
                continue; // flushed by FLUSHDB / FLUSHALL
            }
            if n.tombstone {
                r.live_tombstones += 1;
            } else {
                r.live_keys += 1;
                r.live_keys_with_expiry += u64::from(n.expires);
            }
        }
    }
    Ok(())
}

fn count_record(
    r: &mut CheckReport,
    keys: &mut HashMap<(u8, Vec<u8>), Newest>,
    bytes: &[u8],
    off: usize,
    hdr: &RecordHeader,
) {
    let tombstone = match hdr.record_type {
        RecordType::Put => {
            r.records_put += 1;
            r.records_large += u64::from(hdr.flags & FLAG_LARGE != 0);
            false
        }
        RecordType::Tombstone => {
            r.records_tombstone += 1;
            true
        }
        RecordType::Fragment => {
            r.records_fragment += 1;
            return;
        }
        RecordType::Checkpoint => {
            r.records_checkpoint += 1;
            return;
        }
        RecordType::Page => {
            r.records_page += 1;
            return;
        }
        RecordType::BlockHeader | RecordType::Marker | RecordType::GroupPart => return,
    };
    let k = off + RECORD_HEADER_BYTES;
    let key = bytes[k..k + hdr.key_len as usize].to_vec();
    let e = keys.entry((hdr.db, key)).or_insert(Newest {
        seq: 0,
        tombstone: true,
        expires: false,
    });
    if hdr.seq >= e.seq {
        *e = Newest {
            seq: hdr.seq,
            tombstone,
            expires: hdr.expire_at_ms != 0,
        };
    }
}

/// Walks the records of a chunk that did not verify, from `start`, by their headers. Returns
/// why it is damage, or `None` if it is consistent with a torn write (see the module doc).
fn damaged_record(bytes: &[u8], start: usize, block_seq: u64) -> Option<String> {
    let sector = CHUNK_ALIGN_BYTES as usize;
    let mut written = vec![false; bytes.len().div_ceil(sector)];
    let mut bad: Vec<(usize, usize)> = Vec::new();
    let mut p = start;
    let mut marker: Option<usize> = None;
    while p + RECORD_HEADER_BYTES <= bytes.len() {
        match decode_record(&bytes[p..], block_seq) {
            Some(rec) => {
                let len = rec.header.record_len();
                written[p / sector..=(p + len - 1) / sector].fill(true);
                if rec.header.record_type == RecordType::Marker {
                    marker = Some(p);
                    break;
                }
                p += len;
            }
            None => match RecordHeader::decode(&bytes[p..]) {
                Some(h) if p + h.record_len() <= bytes.len() => {
                    bad.push((p, h.record_len()));
                    p += h.record_len();
                }
                _ => {
                    bad.push((p, RECORD_HEADER_BYTES));
                    break;
                }
            },
        }
    }
    for &(off, len) in &bad {
        if written[off / sector..=(off + len - 1) / sector]
            .iter()
            .all(|&w| w)
        {
            return Some(format!(
                "record at block offset {off} ({len} bytes) fails its CRC among records that verify"
            ));
        }
    }
    if bad.is_empty() {
        if let Some(m) = marker {
            return Some(format!(
                "every record verifies but the marker at block offset {m} does not match the chunk (start, block_seq or chunk CRC)"
            ));
        }
    }
    None
}

fn check_meta(dev: &dyn BlockDevice, uuid: [u8; 16], r: &mut CheckReport) -> Result<(), String> {
    let mut best: Option<MetaSlot> = None;
    for (i, off) in META_SLOT_OFFSETS_BYTES.into_iter().enumerate() {
        let mut buf = AlignedBuf::new_zeroed(CHUNK_ALIGN_BYTES as usize);
        dev.read_at(off, &mut buf).map_err(|e| e.to_string())?;
        let name = ["A", "B"][i];
        match MetaSlot::decode(buf.as_slice()) {
            Some(m) if m.store_uuid == uuid => {
                if best.is_none_or(|b| m.generation > b.generation) {
                    best = Some(m);
                }
            }
            Some(_) => {
                let _ = writeln!(r.text, "metadata slot {name}: names another store");
            }
            None if buf.as_slice().iter().all(|&b| b == 0) => {}
            None => {
                // A torn slot write leaves the other slot intact: not damage by itself.
                let _ = writeln!(
                    r.text,
                    "metadata slot {name}: does not verify (torn write?)"
                );
            }
        }
    }
    match best {
        Some(m) => {
            let _ = writeln!(
                r.text,
                "metadata: generation {}, {}, checkpoint id {}",
                m.generation,
                if m.clean_shutdown {
                    "shut down cleanly"
                } else {
                    "not shut down cleanly (crash, or still open)"
                },
                m.checkpoint_id
            );
        }
        None => r
            .damage
            .push("no valid metadata slot on device 0".to_string()),
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
