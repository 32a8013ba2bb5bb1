//! The tomb raider: a periodic, incremental sweep that finds tombstones which no longer
//! shadow anything, so that defrag drops them instead of copying them forward.
//!
//! A tombstone (db, key, seq t) in block B is needed while some *other* block still holds a
//! dead put of the same key with a smaller sequence number: dropping it then could resurrect
//! that put at the next recovery. The sweep runs in two phases over a snapshot of the shard's
//! log blocks taken when it starts, one block per `background` call:
//! 1. collect: every put that is not the current record of its key is recorded as
//!    (db, hash) → (seq, block);
//! 2. mark: every tombstone with seq below the sweep's start sequence whose (db, hash) has no
//!    dead put with a smaller seq in another block becomes *droppable*.
//!
//! Hash equality stands in for key equality here, which only errs towards keeping a
//! tombstone. Dead versions never move (defrag relocates live records only) and blocks are
//! freed only after zeroing, so what phase 1 saw stays true for every tombstone phase 2 marks.
use super::alloc::BlockId;
use super::format::{decode_record, RecordType, BLOCK_KIND_LOG};
use super::index::Address;
use super::recovery::parse_chunk;
use super::shard::Shard;
use super::{Db, StorageError};
use crate::device::AlignedBuf;
use std::collections::{HashMap, HashSet};

/// Dead versions remembered per (db, hash) before the key is simply treated as "has many".
const DEAD_VERSIONS_PER_KEY_MAX: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TombRaiderPhase {
    Idle,
    Collecting,
    Marking,
}

/// What `TOMBRAIDER STATUS` reports for one shard.
#[derive(Clone, Debug)]
pub struct TombRaiderStatus {
    pub enabled: bool,
    pub interval_ms: u64,
    pub phase: TombRaiderPhase,
    pub runs_completed: u64,
    pub next_due_ms: Option<u64>,
    /// Tombstones found droppable and not yet dropped by defrag.
    pub droppable_tombstones: u64,
    /// Tombstones defrag has dropped (by this sweep's verdict or because no older block existed).
    pub tombstones_dropped: u64,
}

#[derive(Default)]
pub(crate) struct TombRaider {
    pub enabled: bool,
    pub interval_ms: u64,
    pub next_due_ms: Option<u64>,
    pub runs_completed: u64,
    pub tombstones_dropped: u64,
    pub droppable: HashSet<Address>,
    sweep: Option<Sweep>,
}

struct Sweep {
    blocks: Vec<BlockId>,
    pos: usize,
    marking: bool,
    start_seq: u64,
    dead: HashMap<(Db, u64), Vec<(u64, BlockId)>>,
}

impl TombRaider {
    pub(crate) fn new(interval_ms: u64) -> TombRaider {
        TombRaider {
            enabled: interval_ms > 0,
            interval_ms,
            ..TombRaider::default()
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        let sweep = self
            .sweep
            .as_ref()
            .map_or(0, |s| s.blocks.capacity() * 4 + s.dead.capacity() * 64);
        self.droppable.capacity() * 16 + sweep
    }
}

impl Shard {
    pub fn set_tomb_raider_enabled(&mut self, enabled: bool) {
        self.raider.enabled = enabled;
        if !enabled {
            self.raider.sweep = None;
            self.raider.next_due_ms = None;
        }
    }

    pub fn set_tomb_raider_interval_ms(&mut self, interval_ms: u64) {
        self.raider.interval_ms = interval_ms;
        self.raider.next_due_ms = None;
    }

    /// Starts a sweep at the next `background` call regardless of the interval.
    pub fn tomb_raider_start_now(&mut self) {
        self.raider.next_due_ms = Some(0);
    }

    pub fn tomb_raider_status(&self) -> TombRaiderStatus {
        let r = &self.raider;
        TombRaiderStatus {
            enabled: r.enabled,
            interval_ms: r.interval_ms,
            phase: match &r.sweep {
                None => TombRaiderPhase::Idle,
                Some(s) if s.marking => TombRaiderPhase::Marking,
                Some(_) => TombRaiderPhase::Collecting,
            },
            runs_completed: r.runs_completed,
            next_due_ms: r.next_due_ms,
            droppable_tombstones: r.droppable.len() as u64,
            tombstones_dropped: r.tombstones_dropped,
        }
    }

    /// One bounded step: at most one block read.
    pub(crate) fn tomb_raider_step(&mut self, now_ms: u64) -> Result<(), StorageError> {
        let forced = self.raider.next_due_ms == Some(0);
        if !self.raider.enabled && !forced {
            return Ok(());
        }
        if self.raider.sweep.is_none() {
            match self.raider.next_due_ms {
                None => {
                    if self.raider.interval_ms > 0 {
                        self.raider.next_due_ms = Some(now_ms + self.raider.interval_ms);
                    }
                    return Ok(());
                }
                Some(due) if due > now_ms => return Ok(()),
                Some(_) => self.start_sweep(),
            }
        }
        let Some(sweep) = self.raider.sweep.as_mut() else {
            return Ok(());
        };
        if sweep.pos == sweep.blocks.len() {
            if sweep.marking {
                self.raider.sweep = None;
                self.raider.runs_completed += 1;
                self.raider.next_due_ms =
                    (self.raider.interval_ms > 0).then(|| now_ms + self.raider.interval_ms);
                return Ok(());
            }
            sweep.marking = true;
            sweep.pos = 0;
            return Ok(());
        }
        let block = sweep.blocks[sweep.pos];
        let marking = sweep.marking;
        sweep.pos += 1;
        self.sweep_block(block, marking)
    }

    fn start_sweep(&mut self) {
        let open = self.open.as_ref().map(|o| o.block);
        let mut blocks: Vec<(u64, BlockId)> = self
            .blocks
            .iter()
            .filter(|(b, i)| i.kind == BLOCK_KIND_LOG && Some(**b) != open)
            .map(|(b, i)| (i.block_seq, *b))
            .collect();
        blocks.sort();
        self.raider.droppable.clear();
        for info in self.blocks.values_mut() {
            info.droppable_bytes = 0;
        }
        self.raider.sweep = Some(Sweep {
            blocks: blocks.into_iter().map(|(_, b)| b).collect(),
            pos: 0,
            marking: false,
            start_seq: self.next_seq,
            dead: HashMap::new(),
        });
    }

    fn sweep_block(&mut self, block: BlockId, marking: bool) -> Result<(), StorageError> {
        let Some(info) = self.blocks.get(&block).cloned() else {
            return Ok(());
        };
        if marking && !info.has_tombs {
            return Ok(());
        }
        let bs = self.shared.layout.block_size_bytes as usize;
        let (dev, base) = self.shared.layout.locate(block);
        let mut buf = AlignedBuf::new_zeroed(bs);
        self.shared.layout.devices[dev].read_at(base, &mut buf)?;
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += bs as u64;
        let bytes = buf.as_slice();
        let mut pos = 0;
        while pos < info.used_bytes as usize {
            let Some(chunk) = parse_chunk(bytes, pos, info.block_seq) else {
                break;
            };
            for &(off, hdr) in &chunk.records {
                let rec = decode_record(&bytes[off..], info.block_seq).expect("parsed before");
                let addr = self.shared.layout.address(block, off);
                let h = self.hash(hdr.db, rec.key);
                match (hdr.record_type, marking) {
                    (RecordType::Put, false) => {
                        if self.indexes[hdr.db as usize]
                            .candidates(h)
                            .any(|a| a == addr)
                        {
                            continue;
                        }
                        let sweep = self.raider.sweep.as_mut().expect("sweeping");
                        let v = sweep.dead.entry((hdr.db, h)).or_default();
                        if v.len() < DEAD_VERSIONS_PER_KEY_MAX {
                            v.push((hdr.seq, block));
                        } else {
                            v[0] = (0, BlockId(u32::MAX));
                        }
                    }
                    (RecordType::Tombstone, true) => {
                        let sweep = self.raider.sweep.as_ref().expect("sweeping");
                        if hdr.seq >= sweep.start_seq {
                            continue;
                        }
                        let shadows = sweep
                            .dead
                            .get(&(hdr.db, h))
                            .is_some_and(|v| v.iter().any(|&(s, b)| s < hdr.seq && b != block));
                        // A tombstone whose key has a newer record is superseded as well.
                        if !shadows || self.find(hdr.db, rec.key, h)?.is_some() {
                            self.raider.droppable.insert(addr);
                            if let Some(i) = self.blocks.get_mut(&block) {
                                i.droppable_bytes += hdr.record_len() as u32;
                            }
                            // Less to keep may make this block a defrag candidate.
                            self.defrag_idle = None;
                        }
                    }
                    _ => {}
                }
            }
            pos = chunk.end.next_multiple_of(4096);
        }
        Ok(())
    }
}
