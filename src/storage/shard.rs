//! One shard: a slice of the keyspace with its own per-db indexes, one open (staging) block,
//! counters and expiry sets. Owned by exactly one worker thread; no locks except the shared
//! block allocator, taken once per block.
use super::alloc::{BlockId, BlockIdHashing, StoreShared};
use super::cache::RecordCache;
use super::expiry::ExpirySet;
use super::format::{
    decode_record, encode_record, encode_record_in_group, record_len, BlockHeaderPayload,
    GroupPartPayload, MarkerPayload, RecordHeader, RecordRef, RecordType,
    BLOCK_HEADER_PAYLOAD_BYTES, BLOCK_KIND_EXTENT, BLOCK_KIND_LOG, CHUNK_ALIGN_BYTES, DB_COUNT,
    FLAG_GROUPED, FLAG_LARGE, FLAG_PAGED, GROUP_ID_BYTES, KEY_LEN_MAX_BYTES, MARKER_RECORD_BYTES,
    RECORD_HEADER_BYTES, VALUE_LEN_MAX_BYTES,
};
use super::index::{Address, Index};
use super::prefetch::Fetched;
use super::tombraider::TombRaider;
use super::{Db, FsyncPolicy, StorageError, StoreConfig, Value, ValueKind};
use crate::device::AlignedBuf;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Bytes a device read fetches first: enough for a record of up to ~4 KiB at any offset.
const READ_WINDOW_BYTES: usize = 8192;
/// Bytes per root-record fragment address entry and root payload header.
const ROOT_ENTRY_BYTES: usize = 8;
const ROOT_HEADER_BYTES: usize = 24;
/// Rough cost of one unit of background work, used to turn a time budget into a work count.
const BACKGROUND_UNIT_US: u64 = 10;
/// Work units charged for reading a whole block when a defrag job starts.
const DEFRAG_BLOCK_READ_WORK: u64 = 50;
/// Due entries active expiry takes from one db's expiry set at a time (one batch).
const EXPIRY_BATCH_ENTRIES: usize = 512;
/// Most bytes one batched expiry read covers: due records of one sealed block that lie
/// within this span are read with one device read instead of one read each.
const EXPIRY_SPAN_MAX_BYTES: usize = 256 * 1024;
/// Due records of a block further apart than this start a new read (a sparse run costs
/// one small read per record rather than reading the gap).
const EXPIRY_GAP_MAX_BYTES: usize = 32 * 1024;

/// What the shard knows about one of its blocks (a few dozen bytes per MiB of device).
#[derive(Clone, Debug)]
pub(crate) struct BlockInfo {
    pub block_seq: u64,
    pub kind: u32,
    /// Bytes written so far (committed end for sealed blocks).
    pub used_bytes: u32,
    /// Bytes of live (indexed) records, per db.
    pub live_bytes: [u32; DB_COUNT],
    pub has_tombs: bool,
    /// Bytes of tombstones written here that were current when written (an upper bound of
    /// what defrag would copy forward).
    pub tomb_bytes: u32,
    /// Bytes of those tombstones the tomb raider found droppable.
    pub droppable_bytes: u32,
    pub sealed: bool,
    pub retiring: bool,
    /// Defrag found data it could not parse here; never pick it again.
    pub no_defrag: bool,
}

impl BlockInfo {
    pub(crate) fn new(block_seq: u64, kind: u32, sealed: bool) -> BlockInfo {
        BlockInfo {
            block_seq,
            kind,
            used_bytes: 0,
            live_bytes: [0; DB_COUNT],
            has_tombs: false,
            tomb_bytes: 0,
            droppable_bytes: 0,
            sealed,
            retiring: false,
            no_defrag: false,
        }
    }

    pub(crate) fn live_total(&self) -> u64 {
        self.live_bytes.iter().map(|&b| u64::from(b)).sum()
    }

    /// What defrag would have to keep: live records plus tombstones not known droppable.
    /// Counting tombstones keeps a block full of needed tombstones from being rewritten
    /// forever.
    pub(crate) fn kept_bytes(&self) -> u64 {
        self.live_total() + u64::from(self.tomb_bytes.saturating_sub(self.droppable_bytes))
    }

    pub(crate) fn note_tomb(&mut self, len: usize) {
        self.has_tombs = true;
        self.tomb_bytes += len as u32;
    }
}

pub(crate) struct OpenBlock {
    pub block: BlockId,
    pub block_seq: u64,
    pub write_pos: usize,
    pub chunk_start: usize,
    /// Bytes before this offset are known written to the device (not necessarily synced);
    /// the next chunk write starts here. Below `chunk_start` only while a chunk write
    /// handed to the worker's ring is in flight: a synchronous write then covers its bytes
    /// again (identical bytes, so the order of the two writes does not matter).
    pub device_from: usize,
}

/// A record copied out of a block.
#[derive(Clone, Debug)]
pub(crate) struct OwnedRecord {
    pub header: RecordHeader,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

pub(crate) struct Found {
    pub addr: Address,
    pub rec: OwnedRecord,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    /// Record bytes appended by defrag (relocated records, pages and the roots rewritten
    /// for them): part of `device_write_bytes`, reported apart (INFO
    /// `lavik_defrag_write_bytes`).
    pub defrag_write_bytes: u64,
    pub device_reads: u64,
    /// Device reads made synchronously by `read_record` (the worker waited for them).
    pub sync_reads: u64,
    pub device_read_bytes: u64,
    pub device_writes: u64,
    pub device_write_bytes: u64,
    pub flushes: u64,
    pub fsyncs: u64,
    /// Block seals that moved a command scope's staged records into the next block.
    pub scope_moves: u64,
    pub expired_keys: u64,
    /// Device reads active expiry made for a run of due records in one block.
    pub expiry_span_reads: u64,
    pub tombstones_written: u64,
    pub defrag_relocated_records: u64,
    pub defrag_freed_blocks: u64,
    pub torn_chunks: u64,
    pub corrupt_chunks: u64,
    /// Blind-capable writes (plain SET, SETEX, PSETEX, MSET) that had to see the old
    /// record first because it was not in RAM (read synchronously, or fetched for them by
    /// the asynchronous path before they ran): `lavik_overwrite_reads`.
    pub overwrite_reads: u64,
    /// Writes that replaced an index entry without reading its record (`put_blind`).
    pub blind_writes: u64,
    /// Blind writes settled as overwrites of the same key / as new keys.
    pub blind_settled_same: u64,
    pub blind_settled_new: u64,
    /// Span reads of the settle sweep (and of `settle_blind_all`).
    pub blind_sweep_reads: u64,
    /// Pushes/pops served from a coalesced paged list (`paged_list::Coalesced`) and the
    /// stores of the overlay (INFO `lavik_coalesced_commands`, `lavik_coalesced_flushes`).
    pub coalesced_commands: u64,
    pub coalesced_flushes: u64,
}

/// A blind write not yet settled: the record at the key of `Shard::blind` replaced the
/// index entry `prev` (same index position) without reading it, so `prev` is either the
/// same key's superseded record or another key's current one (`docs/index.md`). The new
/// record's key (at most `BLIND_KEY_MAX` bytes), length and deadline are kept so that
/// settling reads only `prev` (or nothing, where `prev`'s block is read anyway), and a
/// second blind write of the same key replaces the pending record without reading it.
#[derive(Clone, Debug)]
pub(crate) struct BlindPending {
    pub db: Db,
    pub h: u64,
    pub prev: Address,
    /// The new record's key.
    pub key: Box<[u8]>,
    /// The new record's length on the device (its live bytes) and deadline (0: none).
    pub len: u32,
    pub expire: u64,
    /// The new record may own other records (a large value's fragments; after an
    /// overwrite through the reading path, maybe a paged root's pages): then a later blind
    /// write of the key reads it instead of replacing it.
    pub large: bool,
}

/// Unsettled blind writes per shard before a blind-capable write reads instead. RAM bound
/// per shard: ~150 bytes each with a 16-byte key (map slot 8 + 64 + 1, the key's heap
/// block ~32, the reverse map `blind_prevs` ~35, the per-block count share), so ~10 MiB at
/// the bound; `stats().index_bytes` counts it.
pub(crate) const BLIND_PENDING_MAX: usize = 65_536;

/// Pending blind writes above which `background` runs the settle sweep (one span read of
/// the block holding the most pending `prev`s per step, `settle_sweep`).
pub(crate) const BLIND_SWEEP_WATERMARK: usize = 49_152;

/// Keys longer than this are never written blindly (the pending entry keeps the key).
pub(crate) const BLIND_KEY_MAX: usize = 64;

/// What `DEFRAG STATUS` reports for one shard.
#[derive(Clone, Debug)]
pub struct DefragStatus {
    pub paused: bool,
    pub live_percent_max: u32,
    pub sleep_ms: u64,
    /// Sealed log blocks currently below the live threshold.
    pub candidate_blocks: u64,
    pub relocated_records: u64,
    pub freed_blocks: u64,
}

/// A snapshot of one shard's counters and memory use.
#[derive(Clone, Debug, Default)]
pub struct ShardStats {
    pub shard_id: u32,
    /// The record cache and the synchronous reads that missed it.
    pub cache: super::prefetch::CacheStats,
    pub keys: u64,
    pub keys_per_db: [u64; DB_COUNT],
    /// Every allocation of the indexes.
    pub index_bytes: u64,
    /// Staging buffer (one block), read buffer, and a defrag job's block image if one runs.
    pub staging_bytes: u64,
    /// Per-key expiry state (the per-db expiry sets), counted separately from the index.
    pub expiry_bytes: u64,
    /// The tomb raider's droppable set and any sweep in progress.
    pub tomb_raider_bytes: u64,
    /// The per-block table.
    pub block_table_bytes: u64,
    pub volatile_entries: u64,
    pub device_reads: u64,
    pub device_read_bytes: u64,
    pub device_writes: u64,
    pub device_write_bytes: u64,
    /// Record bytes appended by defrag (`Counters::defrag_write_bytes`).
    pub defrag_write_bytes: u64,
    /// `Counters::coalesced_commands` / `coalesced_flushes`.
    pub coalesced_commands: u64,
    pub coalesced_flushes: u64,
    pub flushes: u64,
    pub fsyncs: u64,
    pub blocks_used: u64,
    /// Free blocks of the whole store (shared allocator).
    pub blocks_free: u64,
    pub live_bytes: u64,
    pub used_bytes: u64,
    pub expired_keys: u64,
    /// Device reads active expiry made for a run of due records in one block.
    pub expiry_span_reads: u64,
    pub tombstones_written: u64,
    pub defrag_relocated_records: u64,
    pub defrag_freed_blocks: u64,
    pub torn_chunks: u64,
    pub corrupt_chunks: u64,
    pub fsync_policy: Option<FsyncPolicy>,
    pub defrag_paused: bool,
    /// Released paged roots whose pages still count as live, and their directory pages
    /// not yet read (the background page release).
    pub paged_releases_pending: u64,
    pub paged_release_dirs_pending: u64,
    /// See `Counters::overwrite_reads` and the blind-write counters below it.
    pub overwrite_reads: u64,
    pub blind_writes: u64,
    pub blind_settled_same: u64,
    pub blind_settled_new: u64,
    /// Blind writes not settled yet (`keys` may be short by up to this many until they are:
    /// `settle_blind_all` makes it exact).
    pub blind_pending: u64,
    /// Span reads of the settle sweep and of `settle_blind_all` (`lavik_blind_sweep_reads`).
    pub blind_sweep_reads: u64,
}

/// One slice of the keyspace (slot % shard_count == shard id), with its own index, append
/// stream and counters. `Send`, not shared: exactly one worker thread owns it.
/// Where a chunk goes: device, byte offset, and its range in the staging buffer.
#[derive(Debug)]
struct ChunkWrite {
    dev: usize,
    offset: u64,
    start: usize,
    end: usize,
}

/// A chunk write for the caller to perform (see [`Shard::flush_chunk_begin`]): `len` bytes
/// at `ptr` (inside a staging buffer the shard keeps unchanged until
/// [`Shard::flush_chunk_done`], 4096-aligned) to `fd` at `offset`.
#[derive(Debug)]
pub struct ChunkIo {
    /// The data file's descriptor (-1 only from the test-only `flush_chunk_begin_any`).
    pub fd: RawFd,
    /// Which of the store's devices.
    pub dev: usize,
    pub offset: u64,
    pub ptr: *const u8,
    pub len: usize,
}

/// The chunk write handed out by [`Shard::flush_chunk_begin`] and not yet reported done.
#[derive(Debug)]
struct InflightChunk {
    write: ChunkWrite,
    block: BlockId,
    /// Its block was sealed meanwhile: the bytes are in `retired_staging`, not `staging`.
    retired: bool,
}

pub struct Shard {
    pub(crate) id: u32,
    pub(crate) shared: Arc<StoreShared>,
    pub(crate) fsync: FsyncPolicy,
    pub(crate) flush_max_ms: u64,
    pub(crate) staging_limit_bytes: usize,
    pub(crate) hash_mask: u64,
    pub(crate) defrag_paused: bool,
    pub(crate) defrag_live_percent_max: u32,
    pub(crate) indexes: Vec<Index>,
    pub(crate) blocks: HashMap<BlockId, BlockInfo, BlockIdHashing>,
    pub(crate) open: Option<OpenBlock>,
    pub(crate) staging: AlignedBuf,
    pub(crate) next_seq: u64,
    pub(crate) watermarks: [u64; DB_COUNT],
    /// Keys some connection WATCHes, and their touches (empty almost always).
    pub(crate) watches: super::watch::WatchTable,
    pub(crate) watermarks_dirty: bool,
    pub(crate) unflushed: bool,
    pub(crate) first_unflushed_ms: Option<u64>,
    pub(crate) dirty_devices: Vec<bool>,
    pub(crate) pending_frees: Vec<BlockId>,
    /// Per db: (expire_at_ms, address) of every current record that has an expiry.
    pub(crate) expiry: Vec<ExpirySet>,
    /// No entry of `expiry` (any db) expires before this (`u64::MAX`: none can exist).
    /// A lower bound kept by `expiry_add` and made exact when active expiry finds
    /// nothing due, so the background pass of every loop round skips the per-db walk
    /// while no key can be due.
    pub(crate) expiry_earliest_ms: u64,
    pub(crate) expiry_cursor_db: usize,
    pub(crate) rng: u64,
    pub(crate) counters: Counters,
    /// Reused for the first read of every record (one read window).
    pub(crate) read_buf: AlignedBuf,
    /// Paged lists whose store waits for the end of the batch (`docs/collections.md` 5a).
    pub(crate) coalesced: super::paged_list::Coalesced,
    /// Recently read records (see `cache.rs`).
    pub(crate) cache: RecordCache,
    /// Paged roots and directory pages appended to the open block and still current: kept in
    /// the cache's resident part when the block is sealed (`cache.rs`).
    pub(crate) resident_candidates: std::collections::HashSet<u64>,
    /// Records a waiting command fetched, lent for the time it runs (see `prefetch.rs`).
    pub(crate) prefetched: Vec<Fetched>,
    pub(crate) last_now_ms: u64,
    pub(crate) raider: TombRaider,
    /// Released paged roots whose pages still count as live (`paged::release_step`).
    pub(crate) releases: super::paged::PendingReleases,
    /// Decoded base pages of version-2 paged roots (`paged::BaseCache`).
    pub(crate) bases: super::paged::BaseCache,
    /// A paged root listing more directory pages than this is stored as version 2.
    pub(crate) base_min_dirs: usize,
    /// Set while a defrag step runs: its appends count in `defrag_write_bytes`.
    in_defrag: bool,
    pub(crate) defrag_sleep_ms: u64,
    pub(crate) defrag_max_active_per_device: u32,
    pub(crate) defrag_record_sleep_us: u64,
    /// With a record sleep: no relocation before this instant.
    defrag_next_record: Option<std::time::Instant>,
    pub(crate) last_defrag_ms: Option<u64>,
    /// The block being defragged, its image and how far relocation got.
    pub(crate) defrag_job: Option<DefragJob>,
    /// At most one chunk write performed by the caller (the worker's ring) at a time.
    inflight: Option<InflightChunk>,
    /// The staging buffer of a block sealed while its chunk write was in flight: kept
    /// untouched until that write completes, then it becomes the spare.
    retired_staging: Option<AlignedBuf>,
    spare_staging: Option<AlignedBuf>,
    /// A chunk write failed twice: the shard's log has a hole that a later record could
    /// sit behind, so it takes no more writes (reads go on).
    broken: Option<String>,
    /// `Some`: the last scan for a defrag candidate found none and nothing has made one
    /// since, so the next defrag step need not walk every block again (that walk, once per
    /// loop round, cost more than a GET's own work). See `start_defrag_job`.
    pub(crate) defrag_idle: Option<DefragIdle>,
    /// A command that may write several records here is running (`command_begin`).
    scope: Option<CommandScope>,
    /// Records a block seal moved during the current scope: (old address, new address), for
    /// `Found`s taken before the move (see `relocate_scope_tail`). Empty outside a scope.
    moved: Vec<(Address, Address)>,
    /// Page records appended in the current scope that still count as live (address ->
    /// record bytes): a seal that moves the scope's records moves exactly these pages' live
    /// bytes (a page replaced within the same scope was already unaccounted). Empty outside
    /// a scope.
    scope_pages: HashMap<u64, u32>,
    /// `StoreConfig::blind_writes`.
    pub(crate) blind_writes: bool,
    /// Unsettled blind writes, by the new record's address (see `BlindPending`). Every
    /// entry's record is in the index and is the only entry at its index position.
    pub(crate) blind: HashMap<u64, BlindPending>,
    /// The same entries by `prev` (-> the new record's address): the pending `prev`s of a
    /// block are one range (defrag, the settle sweep).
    pub(crate) blind_prevs: std::collections::BTreeMap<u64, u64>,
    /// Pending `prev`s per block (the settle sweep reads the block with the most).
    pub(crate) blind_per_block: HashMap<BlockId, u32>,
}

/// The multi-record command in progress on a shard (`Shard::command_begin`).
#[derive(Clone, Copy, Debug, Default)]
struct CommandScope {
    /// Nesting: EXEC opens a scope and each queued command opens one inside it.
    depth: u32,
    /// Block and offset of the scope's first record, while it is in the open block.
    first: Option<(BlockId, usize)>,
    /// The scope is (part of) a multi-shard group: puts and tombstones are GROUPED.
    group: Option<u64>,
    /// GROUPED records appended in this scope (the part record's count).
    group_records: u32,
}

/// Why "no defrag candidate" still holds: the open block of that scan. Sealing it (a new
/// open block) may make it a candidate; the other ways a block becomes one (live bytes
/// dropping in `unaccount`, tombstones found droppable, `flush_db`) clear the memo where
/// they happen.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DefragIdle {
    open_block: Option<BlockId>,
}

/// A defrag in progress: the block's image (read once) and the records still to consider.
pub(crate) struct DefragJob {
    /// Counts the job against its device's limit until the job is dropped.
    _active: DefragSlot,
    block: BlockId,
    block_seq: u64,
    image: AlignedBuf,
    records: Vec<usize>,
    next: usize,
    /// Every committed chunk up to the block's used length parsed.
    parsed_all: bool,
}

/// One of a device's `--defrag-max-active-per-device` places, held by a running job.
pub(crate) struct DefragSlot {
    shared: Arc<StoreShared>,
    dev: usize,
}

impl DefragSlot {
    fn take(shared: &Arc<StoreShared>, dev: usize, max: u32) -> Option<DefragSlot> {
        let counter = &shared.defrag_active[dev];
        let mut cur = counter.load(std::sync::atomic::Ordering::Relaxed);
        loop {
            if max != 0 && cur >= max {
                return None;
            }
            match counter.compare_exchange_weak(
                cur,
                cur + 1,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(DefragSlot {
                        shared: shared.clone(),
                        dev,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for DefragSlot {
    fn drop(&mut self) {
        self.shared.defrag_active[self.dev].fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

fn is_expired(h: &RecordHeader, now_ms: u64) -> bool {
    h.expire_at_ms != 0 && h.expire_at_ms <= now_ms
}

fn check_db(db: Db) -> Result<usize, StorageError> {
    if (db as usize) < DB_COUNT {
        Ok(db as usize)
    } else {
        Err(StorageError::Config(format!(
            "db {db} out of range 0..{DB_COUNT}"
        )))
    }
}

fn align_up(v: usize) -> usize {
    v.next_multiple_of(CHUNK_ALIGN_BYTES as usize)
}

impl Shard {
    pub(crate) fn new(id: u32, shared: Arc<StoreShared>, cfg: &StoreConfig) -> Shard {
        let block_size = shared.layout.block_size_bytes as usize;
        let device_count = shared.layout.devices.len();
        Shard {
            id,
            fsync: cfg.fsync,
            flush_max_ms: cfg.flush_max_ms,
            staging_limit_bytes: (cfg.staging_limit_bytes as usize).clamp(4096, block_size),
            hash_mask: cfg.debug_hash_mask,
            defrag_paused: cfg.defrag_paused,
            defrag_live_percent_max: cfg.defrag_live_percent_max.min(100),
            indexes: (0..DB_COUNT).map(|_| Index::new()).collect(),
            blocks: HashMap::default(),
            open: None,
            staging: AlignedBuf::new_zeroed(block_size),
            next_seq: 1,
            watermarks: [0; DB_COUNT],
            watches: Default::default(),
            watermarks_dirty: false,
            unflushed: false,
            first_unflushed_ms: None,
            dirty_devices: vec![false; device_count],
            pending_frees: Vec::new(),
            expiry: (0..DB_COUNT).map(|_| ExpirySet::new()).collect(),
            expiry_earliest_ms: u64::MAX,
            expiry_cursor_db: 0,
            rng: 0x2545_f491_4f6c_dd1d ^ u64::from(id),
            counters: Counters::default(),
            read_buf: AlignedBuf::new_zeroed(READ_WINDOW_BYTES),
            coalesced: Default::default(),
            cache: RecordCache::new(cfg.cache_capacity_bytes),
            resident_candidates: Default::default(),
            prefetched: Vec::new(),
            last_now_ms: 0,
            raider: TombRaider::new(cfg.tomb_raider_interval_ms),
            releases: Default::default(),
            defrag_sleep_ms: cfg.defrag_sleep_ms,
            defrag_max_active_per_device: cfg.defrag_max_active_per_device,
            defrag_record_sleep_us: cfg.defrag_record_sleep_us,
            bases: Default::default(),
            base_min_dirs: cfg.paged_base_min_dirs,
            in_defrag: false,
            defrag_next_record: None,
            last_defrag_ms: None,
            defrag_job: None,
            inflight: None,
            retired_staging: None,
            spare_staging: None,
            broken: None,
            defrag_idle: None,
            scope: None,
            moved: Vec::new(),
            scope_pages: HashMap::new(),
            blind_writes: cfg.blind_writes,
            blind: HashMap::new(),
            blind_prevs: std::collections::BTreeMap::new(),
            blind_per_block: HashMap::new(),
            shared,
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub(crate) fn hash(&self, db: Db, key: &[u8]) -> u64 {
        // The running command's key is hashed once (`runtime::keymemo`).
        crate::runtime::keymemo::key_hash(db, key) & self.hash_mask
    }

    fn block_size(&self) -> usize {
        self.shared.layout.block_size_bytes as usize
    }

    /// Largest record that fits a fresh log block next to its header and a marker.
    fn inline_record_max(&self) -> usize {
        self.block_size() - record_len(0, BLOCK_HEADER_PAYLOAD_BYTES) - MARKER_RECORD_BYTES
    }

    /// Largest fragment payload one extent block holds.
    pub(crate) fn fragment_payload_max(&self) -> usize {
        (self.inline_record_max() - RECORD_HEADER_BYTES) & !7
    }

    /// Longest key accepted: 64 KiB - 1, or a quarter of a block's payload if less.
    pub fn key_len_max(&self) -> usize {
        KEY_LEN_MAX_BYTES.min(self.inline_record_max() / 4)
    }

    /// Largest value accepted: bounded by the root record fitting one block, and 512 MiB.
    pub fn value_len_max(&self) -> u64 {
        let max_entries = (self.inline_record_max()
            - RECORD_HEADER_BYTES
            - self.key_len_max()
            - ROOT_HEADER_BYTES)
            / ROOT_ENTRY_BYTES;
        VALUE_LEN_MAX_BYTES.min((max_entries * self.fragment_payload_max()) as u64)
    }

    // ---- public operations -------------------------------------------------------------

    pub fn get(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<Option<Value>, StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        let h = self.hash(db, key);
        let Some(found) = self.find(db, key, h)? else {
            crate::runtime::lookups::record(h, false);
            return Ok(None);
        };
        if is_expired(&found.rec.header, now_ms) {
            self.expire_lazily(db, h, found)?;
            crate::runtime::lookups::record(h, false);
            return Ok(None);
        }
        crate::runtime::lookups::record(h, true);
        let header = found.rec.header;
        let kind = ValueKind::from_u8(header.value_kind).ok_or_else(|| {
            StorageError::Corrupt(format!("unknown value kind {}", header.value_kind))
        })?;
        let bytes = if header.flags & FLAG_PAGED != 0 {
            // A paged collection read whole, in the one-record encoding (generic readers:
            // RENAME, COPY, MOVE, DUMP). Collection commands use `get_collection`.
            super::paged::materialize(self, &found.rec)?
        } else {
            self.materialize(found.rec)?
        };
        Ok(Some(Value {
            kind,
            bytes,
            expire_at_ms: (header.expire_at_ms != 0).then_some(header.expire_at_ms),
        }))
    }

    /// `get` without copies, for the hot path: when the record of (db, key) and every
    /// index candidate tried before it are in memory (staging, lent prefetched records, the
    /// record cache), runs `f` on the value's kind and bytes where they lie. `Some(None)`:
    /// the key does not exist. `None`: the caller must use `get` (a candidate only on the
    /// device, an expired key to delete, a large value, a record that does not verify).
    pub fn get_in_place<R>(
        &mut self,
        db: Db,
        key: &[u8],
        now_ms: u64,
        f: impl FnOnce(ValueKind, &[u8]) -> R,
    ) -> Option<Option<R>> {
        if (db as usize) >= self.indexes.len() {
            return None;
        }
        self.last_now_ms = now_ms;
        let h = self.hash(db, key);
        for addr in self.candidate_addresses(db, h) {
            let (block, off) = self.shared.layout.split(addr);
            let staged = self
                .open
                .as_ref()
                .filter(|ob| ob.block == block && off < ob.write_pos)
                .map(|ob| (ob.write_pos, ob.block_seq));
            let rec = if let Some((end, seq)) = staged {
                decode_record(&self.staging.as_slice()[off..end], seq)?
            } else {
                let block_seq = self.blocks.get(&block)?.block_seq;
                let rec = match self
                    .prefetched
                    .iter()
                    .find(|x| x.addr == addr && x.block_seq == block_seq)
                {
                    Some(x) => &x.rec,
                    None => {
                        if !self.cache.contains(addr, block_seq) {
                            return None;
                        }
                        self.cache.get(addr, block_seq)?
                    }
                };
                RecordRef {
                    header: rec.header,
                    key: &rec.key,
                    value: &rec.value,
                    group: None,
                }
            };
            if rec.header.db != db || rec.key != key {
                if self.blind.contains_key(&addr.0) {
                    return None; // the key may be below another key's blind write
                }
                continue;
            }
            if is_expired(&rec.header, now_ms) || rec.header.flags & (FLAG_LARGE | FLAG_PAGED) != 0
            {
                return None;
            }
            let kind = ValueKind::from_u8(rec.header.value_kind)?;
            crate::runtime::lookups::record(h, true);
            return Some(Some(f(kind, rec.value)));
        }
        crate::runtime::lookups::record(h, false);
        Some(None)
    }

    pub fn exists(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<bool, StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        let h = self.hash(db, key);
        let Some(found) = self.find(db, key, h)? else {
            crate::runtime::lookups::record(h, false);
            return Ok(false);
        };
        if is_expired(&found.rec.header, now_ms) {
            self.expire_lazily(db, h, found)?;
            crate::runtime::lookups::record(h, false);
            return Ok(false);
        }
        crate::runtime::lookups::record(h, true);
        Ok(true)
    }

    /// Insert or overwrite.
    pub fn put(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        self.check_put(db, key, bytes, now_ms)?;
        let expire = expire_at_ms.unwrap_or(0);
        let h = self.hash(db, key);
        let old = self.find(db, key, h)?;
        self.put_found(db, key, kind, bytes, expire, h, old)
    }

    /// `put` for writes whose reply does not depend on the old value (plain SET, SETEX,
    /// PSETEX, MSET): with `StoreConfig::blind_writes`, when the key's index position holds
    /// exactly one entry whose record is not in memory, the new record replaces that entry
    /// without reading it (a *blind write*, `docs/index.md` "Blind overwrites"); whether it
    /// was the same key is settled later (`settle_blind`). When that one entry is itself
    /// this key's pending blind write, the new record replaces it the same way (the pending
    /// entry's key proves it is the same key). Otherwise exactly `put`.
    #[allow(clippy::too_many_arguments)]
    pub fn put_blind(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        self.check_put(db, key, bytes, now_ms)?;
        let expire = expire_at_ms.unwrap_or(0);
        let h = self.hash(db, key);
        let mut cands = self.candidate_addresses(db, h);
        let (first, second) = (cands.next(), cands.next());
        drop(cands);
        // Our own pending blind write: replace it (no read; its length and deadline are kept).
        let ours = first.filter(|c| {
            second.is_none()
                && self.blind_writes
                && self
                    .blind
                    .get(&c.0)
                    .is_some_and(|p| p.db == db && !p.large && *p.key == *key)
        });
        let blind = match (first, second) {
            _ if ours.is_some() => None,
            (Some(c), None) => (self.blind_writes
                && key.len() <= BLIND_KEY_MAX
                // Keyspace event `new` needs to know whether the key existed.
                && crate::runtime::events::flags() & crate::runtime::events::NEW == 0
                && self.blind.len() < BLIND_PENDING_MAX
                && !self.blind.contains_key(&c.0)
                && self.in_memory(c, &[], |_, _, _| ()).is_none())
            .then_some(c),
            _ => None,
        };
        if ours.is_none() && blind.is_none() {
            if [first, second]
                .into_iter()
                .flatten()
                .any(|c| !self.in_ram(c))
            {
                self.counters.overwrite_reads += 1;
            }
            let old = self.find(db, key, h)?;
            return self.put_found(db, key, kind, bytes, expire, h, old);
        }
        let (addr, len) = if self.appended_len(key.len(), bytes.len()) <= self.inline_record_max() {
            let (addr, _) = self.append(
                RecordType::Put,
                0,
                kind.to_u8(),
                db,
                key,
                bytes,
                expire,
                None,
                false,
            )?;
            (addr, self.appended_len(key.len(), bytes.len()))
        } else {
            self.put_large(db, key, kind, bytes, expire)?
        };
        let large = self.appended_len(key.len(), bytes.len()) > self.inline_record_max();
        // The entry replaced: `prev` (unknown), or our pending record (its `prev` stays).
        let replaced_addr = ours.or(blind).expect("one of them");
        let replaced_addr = self.current_address(replaced_addr);
        let d = db as usize;
        let replaced = self.indexes[d].replace(h, replaced_addr, addr);
        assert!(replaced, "index lost an entry it just returned");
        let (block, _) = self.shared.layout.split(addr);
        if let Some(info) = self.blocks.get_mut(&block) {
            info.live_bytes[d] += len as u32;
        }
        self.expiry_add(db, expire, addr);
        let prev = match ours {
            Some(_) => {
                let old = self.blind_remove(replaced_addr).expect("checked above");
                self.expiry_remove(db, old.expire, replaced_addr);
                self.unaccount(db, replaced_addr, old.len as usize);
                old.prev
            }
            None => {
                self.counters.blind_writes += 1;
                replaced_addr
            }
        };
        self.blind_insert(
            addr,
            BlindPending {
                db,
                h,
                prev,
                key: key.into(),
                len: len as u32,
                expire,
                large,
            },
        );
        if !self.watches.is_empty() {
            self.watches.touch(db, key, false);
        }
        crate::runtime::tracking::modified(key);
        Ok(())
    }

    /// Adds a pending blind write (all three maps).
    fn blind_insert(&mut self, addr: Address, p: BlindPending) {
        let (pb, _) = self.shared.layout.split(p.prev);
        *self.blind_per_block.entry(pb).or_insert(0) += 1;
        self.blind_prevs.insert(p.prev.0, addr.0);
        self.blind.insert(addr.0, p);
    }

    /// Removes the pending blind write whose new record is at `addr` (all three maps).
    pub(crate) fn blind_remove(&mut self, addr: Address) -> Option<BlindPending> {
        let p = self.blind.remove(&addr.0)?;
        self.blind_prevs.remove(&p.prev.0);
        let (pb, _) = self.shared.layout.split(p.prev);
        if let Some(n) = self.blind_per_block.get_mut(&pb) {
            *n -= 1;
            if *n == 0 {
                self.blind_per_block.remove(&pb);
            }
        }
        Some(p)
    }

    /// The pending record at `old` moved to `new` (an overwrite through the reading path,
    /// a block seal, a defrag relocation): same unknown, new address.
    pub(crate) fn blind_move(&mut self, old: Address, new: Address) {
        if let Some(p) = self.blind.remove(&old.0) {
            self.blind_prevs.insert(p.prev.0, new.0);
            self.blind.insert(new.0, p);
        }
    }

    /// Drops every pending entry of `db` (FLUSHDB: every record of the db is dead).
    fn blind_drop_db(&mut self, db: Db) {
        let gone: Vec<u64> = self
            .blind
            .iter()
            .filter(|(_, p)| p.db == db)
            .map(|(a, _)| *a)
            .collect();
        for a in gone {
            self.blind_remove(Address(a));
        }
    }

    /// The record at `addr` is in the staging buffer or the record cache (not counting
    /// records fetched for the running command).
    fn in_ram(&self, addr: Address) -> bool {
        let (block, off) = self.shared.layout.split(addr);
        if self
            .open
            .as_ref()
            .is_some_and(|ob| ob.block == block && off < ob.write_pos)
        {
            return true;
        }
        self.blocks
            .get(&block)
            .is_some_and(|i| self.cache.peek(addr, i.block_seq).is_some())
    }

    /// Settles the blind write whose record is at `addr`, if it is one: reads the record it
    /// replaced in the index (`prev`; the new record's key is in the pending entry) and
    /// settles with it (`settle_with`). A deferred read leaves it unsettled.
    pub(crate) fn settle_blind(&mut self, addr: Address) -> Result<(), StorageError> {
        let Some(prev) = self.blind.get(&addr.0).map(|p| p.prev) else {
            return Ok(());
        };
        match self.read_record(prev) {
            Ok(old) => self.settle_with(addr, Some(&old.header), &old.key, Some(&old)),
            Err(StorageError::Corrupt(why)) => {
                self.settle_unreadable(addr, &why);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `prev` of the pending write at `addr` cannot be read: whichever key it held cannot
    /// be served any more, and it is left out of the index (its bytes stay counted until
    /// defrag finds them unreadable too).
    fn settle_unreadable(&mut self, addr: Address, why: &str) {
        tracing::warn!(
            shard = self.id,
            why,
            "blind write settled over a record that fails its check"
        );
        self.blind_remove(addr);
    }

    /// Settles the pending write at `addr` with its `prev` record in hand (`header` and key
    /// from wherever it was read: a record read, defrag's block image, the sweep's span;
    /// `full` is the whole record when a same-key settle must see its value: a large root's
    /// extents, a paged root's pages — without it such a record is read). The same key:
    /// `prev` is superseded (its live bytes, expiry entry, extents or pages go, as an
    /// overwrite's would). Another key: `prev` is that key's current record and goes back
    /// into the index.
    pub(crate) fn settle_with(
        &mut self,
        addr: Address,
        header: Option<&RecordHeader>,
        prev_key: &[u8],
        full: Option<&OwnedRecord>,
    ) -> Result<(), StorageError> {
        let Some(p) = self.blind.get(&addr.0) else {
            return Ok(());
        };
        let Some(hdr) = header else {
            self.settle_unreadable(addr, "no record");
            return Ok(());
        };
        let same = hdr.record_type == RecordType::Put && hdr.db == p.db && *p.key == *prev_key;
        let (db, h, prev) = (p.db, p.h, p.prev);
        if same && hdr.flags & (FLAG_LARGE | FLAG_PAGED) != 0 && full.is_none() {
            // Its value is needed to retire what it owns: one record read (rare).
            return self.settle_blind(addr);
        }
        self.blind_remove(addr);
        if same {
            self.expiry_remove(db, hdr.expire_at_ms, prev);
            self.unaccount(db, prev, hdr.record_len());
            if let Some(old) = full {
                if hdr.flags & FLAG_LARGE != 0 {
                    self.retire_extents_of(old);
                }
                if hdr.flags & FLAG_PAGED != 0 {
                    super::paged::release(self, db, old);
                }
            }
            self.counters.blind_settled_same += 1;
        } else {
            self.indexes[db as usize].insert(h, prev);
            self.counters.blind_settled_new += 1;
        }
        Ok(())
    }

    /// Settles every pending `prev` in `block` from the bytes `image` of the block starting
    /// at offset `start` (defrag's block image, the sweep's span). A `prev` past the bytes
    /// read, or whose record does not decode, is settled with a record read / as unreadable.
    fn settle_block_from(
        &mut self,
        block: BlockId,
        block_seq: u64,
        image: &[u8],
        start: usize,
    ) -> Result<(), StorageError> {
        let lo = self.shared.layout.address(block, 0).0;
        let hi = lo | ((1u64 << self.shared.layout.offset_bits) - 1);
        let pending: Vec<(u64, u64)> = self
            .blind_prevs
            .range(lo..=hi)
            .map(|(p, a)| (*p, *a))
            .collect();
        for (prev, addr) in pending {
            let (_, off) = self.shared.layout.split(Address(prev));
            let rel = off.wrapping_sub(start);
            let hdr = (off >= start && rel < image.len())
                .then(|| RecordHeader::decode(&image[rel..]))
                .flatten();
            match hdr {
                Some(hd) if rel + hd.record_len() <= image.len() => {
                    match decode_record(&image[rel..rel + hd.record_len()], block_seq) {
                        Some(r) => {
                            let full =
                                (r.header.flags & (FLAG_LARGE | FLAG_PAGED) != 0).then(|| {
                                    OwnedRecord {
                                        header: r.header,
                                        key: r.key.to_vec(),
                                        value: r.value.to_vec(),
                                    }
                                });
                            let header = r.header;
                            let key = r.key.to_vec();
                            self.settle_with(Address(addr), Some(&header), &key, full.as_ref())?;
                        }
                        None => self.settle_unreadable(Address(addr), "fails its checksum"),
                    }
                }
                _ => self.settle_blind(Address(addr))?,
            }
        }
        Ok(())
    }

    /// The settle sweep: while more than `BLIND_SWEEP_WATERMARK` blind writes are pending,
    /// reads the part of the block holding the most pending `prev`s that spans them in one
    /// read and settles all of them (`settle_block_from`). At most `blocks` reads.
    fn settle_sweep(&mut self, watermark: usize, blocks: usize) -> Result<(), StorageError> {
        for _ in 0..blocks {
            if self.blind.len() <= watermark {
                break;
            }
            let Some((&block, _)) = self.blind_per_block.iter().max_by_key(|(b, n)| (**n, b.0))
            else {
                break;
            };
            self.settle_block_read(block)?;
        }
        Ok(())
    }

    /// Reads the span of `block` holding its pending `prev`s (one read, `device_reads`;
    /// not a per-record `sync_reads` read) and settles them.
    fn settle_block_read(&mut self, block: BlockId) -> Result<(), StorageError> {
        let lo = self.shared.layout.address(block, 0).0;
        let hi = lo | ((1u64 << self.shared.layout.offset_bits) - 1);
        let first = self.blind_prevs.range(lo..=hi).next().map(|(p, _)| *p);
        let last = self.blind_prevs.range(lo..=hi).next_back().map(|(p, _)| *p);
        let (Some(first), Some(last)) = (first, last) else {
            return Ok(());
        };
        let Some(info) = self.blocks.get(&block) else {
            // Not a block of ours: nothing readable (should not happen; settle each).
            let addrs: Vec<u64> = self.blind_prevs.range(lo..=hi).map(|(_, a)| *a).collect();
            for a in addrs {
                self.settle_unreadable(Address(a), "prev outside the shard's blocks");
            }
            return Ok(());
        };
        let block_seq = info.block_seq;
        let bs = self.block_size();
        let (_, off0) = self.shared.layout.split(Address(first));
        let (_, off1) = self.shared.layout.split(Address(last));
        let start = off0 & !(CHUNK_ALIGN_BYTES as usize - 1);
        let end = align_up(off1 + READ_WINDOW_BYTES).min(bs);
        let len = end - start;
        let (dev, base) = self.shared.layout.locate(block);
        let mut buf = AlignedBuf::new_zeroed(len.next_multiple_of(4096));
        self.shared.layout.devices[dev].read_range_at(base + start as u64, &mut buf, 0..len)?;
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += len as u64;
        self.counters.blind_sweep_reads += 1;
        self.settle_block_from(block, block_seq, &buf.as_slice()[..len], start)
    }

    /// RAM of the pending blind writes (`stats().index_bytes`): map slots, key heap blocks
    /// (rounded to 16 plus a 16-byte header), the reverse map (B-tree leaves of 11 slots of
    /// 16 bytes, counted at 60 % full) and the per-block counts.
    fn blind_memory_bytes(&self) -> u64 {
        let slots = self.blind.capacity() * (8 + std::mem::size_of::<BlindPending>() + 1);
        let keys: usize = self
            .blind
            .values()
            .map(|p| p.key.len().next_multiple_of(16) + 16)
            .sum();
        let reverse = self.blind_prevs.len() * 16 * 10 / 6 + self.blind_prevs.len() / 11 * 16;
        let per_block = self.blind_per_block.capacity() * (4 + 4 + 1);
        (slots + keys + reverse + per_block) as u64
    }

    /// Settles every blind write of this shard (DBSIZE, INFO keyspace, RANDOMKEY, SCAN,
    /// the checkpoint: whatever needs the index exact), one span read per block holding
    /// pending `prev`s. After it `key_count` is exact.
    pub fn settle_blind_all(&mut self) -> Result<(), StorageError> {
        self.settle_sweep(0, usize::MAX)
    }

    /// Size checks shared by `put` and `put_blind`.
    fn check_put(
        &mut self,
        db: Db,
        key: &[u8],
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<(), StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        if key.len() > self.key_len_max() {
            return Err(StorageError::KeyTooLarge {
                len_bytes: key.len() as u64,
                max_bytes: self.key_len_max() as u64,
            });
        }
        let max = self.value_len_max();
        if bytes.len() as u64 > max {
            return Err(StorageError::ValueTooLarge {
                len_bytes: bytes.len() as u64,
                max_bytes: max,
            });
        }
        Ok(())
    }

    /// The second half of `put`: `old` is what `find` returned for (db, key) — the caller
    /// guarantees it is still current (its address is in the index) or `None` when the
    /// key is absent. Used by the asynchronous SET after it read the old record itself.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_found(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire: u64,
        h: u64,
        old: Option<Found>,
    ) -> Result<(), StorageError> {
        let (addr, len) = if self.appended_len(key.len(), bytes.len()) <= self.inline_record_max() {
            let (addr, _) = self.append(
                RecordType::Put,
                0,
                kind.to_u8(),
                db,
                key,
                bytes,
                expire,
                None,
                false,
            )?;
            (addr, self.appended_len(key.len(), bytes.len()))
        } else {
            self.put_large(db, key, kind, bytes, expire)?
        };
        // Keyspace event `new` (class `n`): the key was absent (or only an expired record).
        let created = crate::runtime::events::flags() & crate::runtime::events::NEW != 0
            && old
                .as_ref()
                .is_none_or(|f| is_expired(&f.rec.header, self.last_now_ms));
        let old_addr = old.as_ref().map(|f| f.addr);
        self.install(db, h, old, addr, len, expire, true);
        if let Some(old_addr) = old_addr {
            self.recache_written(old_addr, addr);
        }
        if !self.watches.is_empty() {
            self.watches.touch(db, key, false);
        }
        crate::runtime::tracking::modified(key);
        if created {
            crate::runtime::events::notify(crate::runtime::events::NEW, "new", key, db);
        }
        Ok(())
    }

    // ---- paged collections (hooks of `paged.rs`) ---------------------------------------

    /// `get` for collection commands: a paged collection comes back as its root payload
    /// (`Collection::Paged`), everything else as `get` returns it.
    pub fn get_collection(
        &mut self,
        db: Db,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<super::Collection>, StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        let h = self.hash(db, key);
        let Some(found) = self.find(db, key, h)? else {
            crate::runtime::lookups::record(h, false);
            return Ok(None);
        };
        if found.rec.header.flags & FLAG_PAGED == 0 || is_expired(&found.rec.header, now_ms) {
            // `get` notes this lookup (`runtime::lookups`).
            return Ok(self.get(db, key, now_ms)?.map(super::Collection::Whole));
        }
        crate::runtime::lookups::record(h, true);
        let hdr = found.rec.header;
        let kind = ValueKind::from_u8(hdr.value_kind).ok_or_else(|| {
            StorageError::Corrupt(format!("unknown value kind {}", hdr.value_kind))
        })?;
        // A version-2 root comes back in the version-1 form (its base page applied).
        let root = super::paged::expand_stored(self, db, key, found.rec.value)?;
        Ok(Some(super::Collection::Paged {
            kind,
            root,
            expire_at_ms: (hdr.expire_at_ms != 0).then_some(hdr.expire_at_ms),
        }))
    }

    /// Takes a sequence number for a paged write: its pages carry it, its root takes it.
    pub(crate) fn reserve_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// Appends a page record of (db, key)'s collection; it counts as live from now on.
    pub(crate) fn append_page(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        payload: &[u8],
        seq: u64,
    ) -> Result<Address, StorageError> {
        check_db(db)?;
        let (addr, _) = self.append(
            RecordType::Page,
            0,
            kind.to_u8(),
            db,
            key,
            payload,
            0,
            Some(seq),
            false,
        )?;
        let (block, _) = self.shared.layout.split(addr);
        let len = record_len(key.len(), payload.len()) as u32;
        if let Some(info) = self.blocks.get_mut(&block) {
            info.live_bytes[db as usize] += len;
        }
        if self.scope.is_some() {
            self.scope_pages.insert(addr.0, len);
        }
        Ok(addr)
    }

    /// A page of a collection whose key is `key_len` bytes is reachable (recovery).
    pub(crate) fn account_page(&mut self, db: Db, addr: Address, key_len: usize, len: u32) {
        let (block, _) = self.shared.layout.split(addr);
        if let Some(info) = self.blocks.get_mut(&block) {
            info.live_bytes[db as usize] += record_len(key_len, len as usize) as u32;
        }
    }

    /// A page of a collection whose key is `key_len` bytes stopped being reachable.
    pub(crate) fn unaccount_page(&mut self, db: Db, addr: Address, key_len: usize, len: u32) {
        let addr = self.current_address(addr);
        if !self.scope_pages.is_empty() {
            self.scope_pages.remove(&addr.0);
        }
        self.unaccount(db, addr, record_len(key_len, len as usize));
    }

    /// `payload` (a paged root's when `root`, else a page's) with every page address a seal
    /// moved in the current scope replaced by the new one; `None` if nothing changes. Trees
    /// loaded before the move still hold the old addresses (`moved` maps them).
    fn rebase_payload(&self, root: bool, payload: &[u8]) -> Option<Vec<u8>> {
        if self.moved.is_empty() {
            return None;
        }
        super::paged::rebase_addresses(root, payload, |a| self.current_address(Address(a)).0)
    }

    /// Appends a paged root for (db, key) under sequence number `seq` (its pages were
    /// appended before it) and points the index at it. `shares_pages`: the old record is
    /// the root this one was derived from and the caller unaccounted the pages it dropped;
    /// otherwise an old paged root's pages are all released.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_paged_root(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        root: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
        seq: u64,
        shares_pages: bool,
    ) -> Result<(), StorageError> {
        self.put_paged_root_as(
            db,
            key,
            kind,
            root,
            expire_at_ms,
            now_ms,
            seq,
            shares_pages,
            true,
        )
    }

    /// `put_paged_root`; `visible` false for defrag's relocation (same contents: WATCH and
    /// keyspace events are not told).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_paged_root_as(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        root: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
        seq: u64,
        shares_pages: bool,
        visible: bool,
    ) -> Result<(), StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        let expire = expire_at_ms.unwrap_or(0);
        let h = self.hash(db, key);
        let mut old = self.find(db, key, h)?;
        // The stored form (version 2 above `base_min_dirs` directory pages, which may
        // append a new base page first: then the old record is looked up again, a seal
        // may have moved it).
        let old_root = old
            .as_ref()
            .filter(|f| f.rec.header.record_type == RecordType::Put)
            .filter(|f| f.rec.header.flags & FLAG_PAGED != 0)
            .map(|f| f.rec.value.as_slice());
        let stored =
            super::paged::stored_form(self, db, key, kind, root, old_root, shares_pages, seq)?;
        if stored.appended {
            old = self.find(db, key, h)?;
        }
        let (root, dead_base) = (stored.payload.as_slice(), stored.dead_base);
        let created = crate::runtime::events::flags() & crate::runtime::events::NEW != 0
            && old
                .as_ref()
                .is_none_or(|f| is_expired(&f.rec.header, self.last_now_ms));
        // The record's length as appended (a GROUPED root carries its group id too).
        let len = self.appended_len(key.len(), root.len());
        let (addr, _) = self.append(
            RecordType::Put,
            FLAG_PAGED,
            kind.to_u8(),
            db,
            key,
            root,
            expire,
            Some(seq),
            false,
        )?;
        let retire = !(shares_pages
            && old
                .as_ref()
                .is_some_and(|f| f.rec.header.flags & FLAG_PAGED != 0));
        self.install(db, h, old, addr, len, expire, retire);
        if let Some((a, l)) = dead_base {
            self.unaccount_page(db, Address(a), key.len(), l);
        }
        if !visible {
            return Ok(());
        }
        if !self.watches.is_empty() {
            self.watches.touch(db, key, false);
        }
        if created {
            crate::runtime::events::notify(crate::runtime::events::NEW, "new", key, db);
        }
        Ok(())
    }

    /// True if the key existed (and was not expired).
    pub fn delete(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<bool, StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        let h = self.hash(db, key);
        let Some(found) = self.find(db, key, h)? else {
            return Ok(false);
        };
        let expired = is_expired(&found.rec.header, now_ms);
        self.remove_found(db, h, found)?;
        if expired {
            self.counters.expired_keys += 1;
        }
        Ok(!expired)
    }

    /// Sets or clears the expiry; false if the key is missing (or already expired).
    pub fn set_expiry(
        &mut self,
        db: Db,
        key: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<bool, StorageError> {
        check_db(db)?;
        self.last_now_ms = now_ms;
        let h = self.hash(db, key);
        let Some(found) = self.find(db, key, h)? else {
            return Ok(false);
        };
        if is_expired(&found.rec.header, now_ms) {
            self.expire_lazily(db, h, found)?;
            return Ok(false);
        }
        let hdr = found.rec.header;
        let expire = expire_at_ms.unwrap_or(0);
        // The payload is rewritten as is; for a large value that is the fragment list, so the
        // new root shares the old root's extents and they must not be retired.
        let (addr, _) = self.append(
            RecordType::Put,
            hdr.flags,
            hdr.value_kind,
            db,
            key,
            &found.rec.value,
            expire,
            None,
            false,
        )?;
        let len = hdr.record_len();
        self.install(db, h, Some(found), addr, len, expire, false);
        if !self.watches.is_empty() {
            self.watches.touch(db, key, false);
        }
        crate::runtime::tracking::modified(key);
        Ok(true)
    }

    /// FLUSHDB touches the watched keys of `db` that exist (expired or not), as Redis does;
    /// a watched key that is absent is not changed by the flush.
    fn touch_watched_before_flush(&mut self, db: Db) {
        if self.watches.is_empty() {
            return;
        }
        for key in self.watches.keys_of_db(db) {
            let h = self.hash(db, &key);
            // A read error counts as present: failing an EXEC is safe, a lost touch is not.
            if !matches!(self.find(db, &key, h), Ok(None)) {
                self.watches.touch(db, &key, true);
            }
        }
    }

    /// WATCH: registers one more watcher of (db, key) and returns what EXEC compares.
    pub fn watch_register(
        &mut self,
        db: Db,
        key: &[u8],
        now_ms: u64,
    ) -> Result<super::watch::WatchMark, StorageError> {
        check_db(db)?;
        let expired = self.watch_key_expired(db, key, now_ms)?;
        let touches = self.watches.register(db, key);
        Ok(super::watch::WatchMark { touches, expired })
    }

    /// Drops a watcher of (db, key) (UNWATCH, EXEC, DISCARD, a closed connection).
    pub fn watch_release(&mut self, db: Db, key: &[u8]) {
        self.watches.release(db, key);
    }

    /// EXEC's test of one watched key: touched since `mark`, or (for a key that was not
    /// already expired at WATCH time) logically expired now though not yet deleted.
    pub fn watch_changed(
        &mut self,
        db: Db,
        key: &[u8],
        mark: super::watch::WatchMark,
        now_ms: u64,
    ) -> Result<bool, StorageError> {
        let Some(touched) = self.watches.touched_since(db, key, mark) else {
            return Ok(true);
        };
        if touched {
            return Ok(true);
        }
        if mark.expired {
            return Ok(false);
        }
        self.watch_key_expired(db, key, now_ms)
    }

    /// The key is in the index with an expiry that has passed (without deleting it).
    fn watch_key_expired(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<bool, StorageError> {
        let h = self.hash(db, key);
        Ok(self
            .find(db, key, h)?
            .is_some_and(|f| is_expired(&f.rec.header, now_ms)))
    }

    /// MEMORY USAGE: the RAM `key` costs — its share of its db's index (the index keeps
    /// no key bytes: its memory divided by its entries, rounded up, capped as below) plus its expiry entry
    /// if it has a TTL. `None` if the key is absent. The value lives on the device.
    pub fn key_ram_bytes(
        &mut self,
        db: Db,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<u64>, StorageError> {
        check_db(db)?;
        let h = self.hash(db, key);
        let Some(found) = self.find(db, key, h)? else {
            return Ok(None);
        };
        if is_expired(&found.rec.header, now_ms) {
            return Ok(None);
        }
        // A small index's preallocated table is a fixed cost of the db, not of a key:
        // the share is capped at what an entry costs at the lowest load a grown index
        // keeps (8-byte entries, shrink below SHRINK_LOAD_UNITS/16 full: 12.8 B).
        let ix = &self.indexes[db as usize];
        let cap = (8 * 16u64).div_ceil(super::index::SHRINK_LOAD_UNITS);
        let share = (ix.memory_bytes() as u64)
            .div_ceil(ix.len().max(1) as u64)
            .min(cap);
        // A volatile key's share of its db's expiry set (entries are delta-coded: the
        // average, rounded up).
        let expiry = if found.rec.header.expire_at_ms != 0 {
            let set = &self.expiry[db as usize];
            (set.memory_bytes() as u64).div_ceil(set.len().max(1) as u64)
        } else {
            0
        };
        Ok(Some(share + expiry))
    }

    /// Keys watched on this shard (INFO's `watching_keys`-like figures, tests).
    pub fn watched_key_count(&self) -> usize {
        self.watches.len()
    }

    /// Exact (may include expired keys not yet reaped, as Redis DBSIZE does) once no blind
    /// write is unsettled: callers that need it exact run `settle_blind_all` first (until
    /// then it may be short by up to `blind.len()`).
    pub fn key_count(&self, db: Db) -> u64 {
        self.indexes
            .get(db as usize)
            .map_or(0, |ix| ix.len() as u64)
    }

    /// Drops every key of `db`: a new watermark (durable at the next flush) and a fresh index.
    pub fn flush_db(&mut self, db: Db) -> Result<(), StorageError> {
        let d = check_db(db)?;
        super::prefetch::restartable_write()?;
        self.touch_watched_before_flush(db);
        crate::runtime::tracking::flushed();
        self.cache.clear();
        self.watermarks[d] = self.next_seq;
        self.next_seq += 1;
        self.watermarks_dirty = true;
        self.mark_unflushed();
        self.indexes[d] = Index::new();
        // Every record of the db is dead now, whatever its blind writes replaced.
        self.blind_drop_db(db);
        self.expiry[d].clear();
        // The db's live bytes go to zero below, its released pages' with them.
        self.releases.drop_db(db);
        let mut dead_extents = Vec::new();
        self.defrag_idle = None;
        for (b, info) in self.blocks.iter_mut() {
            info.live_bytes[d] = 0;
            if info.kind == BLOCK_KIND_EXTENT && info.live_total() == 0 && !info.retiring {
                dead_extents.push(*b);
            }
        }
        for b in dead_extents {
            self.retire(b);
        }
        Ok(())
    }

    /// Redis SCAN over one db: returns (next cursor, keys); cursor 0 starts and ends.
    pub fn scan(
        &mut self,
        db: Db,
        cursor: u64,
        count: usize,
        now_ms: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), StorageError> {
        let d = check_db(db)?;
        self.settle_blind_all()?;
        let mut addrs = Vec::new();
        let next = self.indexes[d].scan(cursor, count.max(1), |_, a| addrs.push(a));
        let mut keys = Vec::with_capacity(addrs.len());
        for a in addrs {
            let rec = self.read_record(a)?;
            if !is_expired(&rec.header, now_ms) {
                keys.push(rec.key);
            }
        }
        Ok((next, keys))
    }

    pub fn random_key(&mut self, db: Db, now_ms: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let d = check_db(db)?;
        self.settle_blind_all()?;
        for _ in 0..16 {
            let seed = self.next_random();
            let Some(a) = self.indexes[d].random_entry(seed) else {
                return Ok(None);
            };
            let rec = self.read_record(a)?;
            if !is_expired(&rec.header, now_ms) {
                return Ok(Some(rec.key));
            }
        }
        Ok(None)
    }

    pub fn has_unflushed(&self) -> bool {
        self.unflushed || !self.pending_frees.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn staged_bytes_for_tests(&self) -> usize {
        self.staged_bytes()
    }

    fn staged_bytes(&self) -> usize {
        self.open
            .as_ref()
            .map_or(0, |o| o.write_pos - o.chunk_start)
    }

    /// Whether the policy says flush now: Always — anything unflushed; EverySec and No —
    /// the oldest unflushed write is `flush_max_ms` old, or staging is full (No writes
    /// without syncing).
    pub fn flush_due(&self, now_ms: u64) -> bool {
        let staging_full = self.staged_bytes() >= self.staging_limit_bytes;
        match self.fsync {
            FsyncPolicy::Always => self.has_unflushed(),
            FsyncPolicy::EverySec => {
                staging_full
                    || !self.pending_frees.is_empty()
                    || self
                        .first_unflushed_ms
                        .is_some_and(|t| now_ms.saturating_sub(t) >= self.flush_max_ms)
            }
            // Written (not synced) within the same window, so an idle store still hands its
            // data to the device, as Redis hands it to the kernel.
            FsyncPolicy::No => {
                staging_full
                    || !self.pending_frees.is_empty()
                    || self
                        .first_unflushed_ms
                        .is_some_and(|t| now_ms.saturating_sub(t) >= self.flush_max_ms)
            }
        }
    }

    /// Writes staged records and a commit marker; syncs unless the policy is No. After `Ok`,
    /// everything put or deleted before is durable (Always/EverySec).
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.check_broken()?;
        let frees = !self.pending_frees.is_empty();
        if !self.unflushed && !frees && self.inflight.is_none() {
            return Ok(());
        }
        self.write_chunk(self.watermarks_dirty || frees)?;
        if self.fsync != FsyncPolicy::No || frees {
            self.sync_dirty()?;
        }
        self.counters.flushes += 1;
        self.unflushed = false;
        self.first_unflushed_ms = None;
        if frees {
            self.free_retired()?;
        }
        Ok(())
    }

    /// Group commit with the sync left to the caller: the worker submits `fdatasync` on its
    /// io_uring and keeps serving while the device flushes its cache. Writes the staged
    /// records and their commit marker in one device write, as [`Shard::flush`] does, and
    /// returns the file descriptors to sync before anything staged so far may be
    /// acknowledged. Devices without a file descriptor, and flushes that also free blocks
    /// (defrag; rare), are synced here, synchronously, and are not in the list.
    pub fn flush_write(&mut self) -> Result<Vec<RawFd>, StorageError> {
        if !self.pending_frees.is_empty() {
            self.flush()?;
            return Ok(Vec::new());
        }
        self.check_broken()?;
        if self.unflushed || self.inflight.is_some() {
            self.write_chunk(self.watermarks_dirty)?;
            self.counters.flushes += 1;
            self.unflushed = false;
            self.first_unflushed_ms = None;
        }
        self.take_sync_fds()
    }

    /// Bounded background work: active expiry, one tomb-raider step (at most one block
    /// read), then one defrag step (at most one block read and its live records rewritten).
    pub fn background(&mut self, now_ms: u64, budget_us: u64) -> Result<(), StorageError> {
        self.last_now_ms = now_ms;
        let mut work = (budget_us / BACKGROUND_UNIT_US).max(1);
        // Pending blind writes live on: active expiry and defrag settle a pending `prev`
        // when they meet it, the tomb raider takes it for dead (that only keeps tombstones),
        // and the sweep settles the most crowded block once too many are pending.
        if self.blind.len() > BLIND_SWEEP_WATERMARK {
            let before = self.counters.blind_sweep_reads;
            self.settle_sweep(
                BLIND_SWEEP_WATERMARK,
                (work / DEFRAG_BLOCK_READ_WORK).max(1) as usize,
            )?;
            work = work.saturating_sub(
                (self.counters.blind_sweep_reads - before) * DEFRAG_BLOCK_READ_WORK,
            );
        }
        self.active_expiry(now_ms, &mut work)?;
        // Pages of deleted/overwritten paged roots stop counting here, not in the command
        // (`docs/collections.md` 7a). Defrag waits while any is pending: it would take
        // their pages for dead and could free a block holding a directory page the
        // release has yet to read.
        super::paged::release_step(self, &mut work);
        self.tomb_raider_step(now_ms)?;
        let rested = self
            .last_defrag_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= self.defrag_sleep_ms);
        if !self.defrag_paused
            && work > 0
            && self.releases.is_empty()
            && (rested || self.defrag_job.is_some())
        {
            self.last_defrag_ms = Some(now_ms);
            self.defrag_step(&mut work)?;
        }
        Ok(())
    }

    /// Some key of this shard may be due to expire (a lower bound: active expiry makes it
    /// exact when it finds nothing due).
    pub fn expiry_due(&self, now_ms: u64) -> bool {
        self.expiry_earliest_ms <= now_ms
    }

    /// What `DEFRAG STATUS` reports for this shard.
    pub fn defrag_status(&self) -> DefragStatus {
        let pct = u64::from(self.defrag_live_percent_max);
        let open_block = self.open.as_ref().map(|o| o.block);
        DefragStatus {
            paused: self.defrag_paused,
            live_percent_max: self.defrag_live_percent_max,
            sleep_ms: self.defrag_sleep_ms,
            candidate_blocks: self
                .blocks
                .iter()
                .filter(|(b, i)| Some(**b) != open_block && Self::defrag_candidate(i, pct))
                .count() as u64,
            relocated_records: self.counters.defrag_relocated_records,
            freed_blocks: self.counters.defrag_freed_blocks,
        }
    }

    pub fn set_defrag_sleep_ms(&mut self, sleep_ms: u64) {
        self.defrag_sleep_ms = sleep_ms;
    }

    fn defrag_candidate(i: &BlockInfo, pct: u64) -> bool {
        i.kind == BLOCK_KIND_LOG
            && i.sealed
            && !i.retiring
            && !i.no_defrag
            && i.kept_bytes() * 100 < u64::from(i.used_bytes) * pct
    }

    pub fn set_defrag_paused(&mut self, paused: bool) {
        self.defrag_paused = paused;
    }

    pub fn fsync_policy(&self) -> FsyncPolicy {
        self.fsync
    }

    pub fn set_fsync_policy(&mut self, policy: FsyncPolicy) {
        self.fsync = policy;
    }

    /// The store's growing data file, for INFO (`None` when its size is fixed).
    pub fn growth_status(&self) -> Option<super::GrowthStatus> {
        self.shared.growth_status()
    }

    pub fn stats(&self) -> ShardStats {
        let mut keys_per_db = [0u64; DB_COUNT];
        for (i, ix) in self.indexes.iter().enumerate() {
            keys_per_db[i] = ix.len() as u64;
        }
        let c = &self.counters;
        ShardStats {
            shard_id: self.id,
            keys: keys_per_db.iter().sum(),
            keys_per_db,
            cache: self.cache_stats(),
            // Unsettled blind writes are index state too (map slot: key, value, control).
            index_bytes: self
                .indexes
                .iter()
                .map(|ix| ix.memory_bytes() as u64)
                .sum::<u64>()
                + self.blind_memory_bytes(),
            staging_bytes: (self.staging.len()
                + self.read_buf.len()
                + self.defrag_job.as_ref().map_or(0, |j| j.image.len()))
                as u64,
            expiry_bytes: self.expiry.iter().map(|e| e.memory_bytes() as u64).sum(),
            tomb_raider_bytes: self.raider.memory_bytes() as u64,
            block_table_bytes: (self.blocks.capacity() * (std::mem::size_of::<BlockInfo>() + 8))
                as u64,
            volatile_entries: self.volatile_count(),
            device_reads: c.device_reads,
            device_read_bytes: c.device_read_bytes,
            device_writes: c.device_writes,
            device_write_bytes: c.device_write_bytes,
            defrag_write_bytes: c.defrag_write_bytes,
            coalesced_commands: c.coalesced_commands,
            coalesced_flushes: c.coalesced_flushes,
            flushes: c.flushes,
            fsyncs: c.fsyncs,
            blocks_used: self.blocks.len() as u64,
            blocks_free: self.shared.lock_alloc().free_count() as u64,
            live_bytes: self.blocks.values().map(|b| b.live_total()).sum(),
            used_bytes: self.blocks.values().map(|b| u64::from(b.used_bytes)).sum(),
            expired_keys: c.expired_keys,
            expiry_span_reads: c.expiry_span_reads,
            tombstones_written: c.tombstones_written,
            defrag_relocated_records: c.defrag_relocated_records,
            defrag_freed_blocks: c.defrag_freed_blocks,
            torn_chunks: c.torn_chunks,
            corrupt_chunks: c.corrupt_chunks,
            fsync_policy: Some(self.fsync),
            defrag_paused: self.defrag_paused,
            paged_releases_pending: self.releases.roots(),
            paged_release_dirs_pending: self.releases.dirs(),
            overwrite_reads: c.overwrite_reads,
            blind_writes: c.blind_writes,
            blind_settled_same: c.blind_settled_same,
            blind_settled_new: c.blind_settled_new,
            blind_pending: self.blind.len() as u64,
            blind_sweep_reads: c.blind_sweep_reads,
        }
    }

    /// Flushes and syncs everything; with `write_checkpoint`, also writes this shard's index
    /// checkpoint (a failure to write it is logged and only means the next start scans).
    /// The last shard to shut down marks the store clean.
    pub fn shutdown(mut self, mut write_checkpoint: bool) -> Result<(), StorageError> {
        // Lists the last batch coalesced (the worker stores them every round; a guard).
        let now_ms = self.last_now_ms;
        super::paged_list::store_coalesced(&mut self, now_ms)?;
        // The checkpoint holds the index and per-block live bytes: blind writes settled
        // (they may release pages), then pending page releases.
        if let Err(e) = self.settle_blind_all() {
            tracing::warn!(shard = self.id, error = %e, "blind writes not settled: no checkpoint");
            write_checkpoint = false;
        }
        super::paged::release_all(&mut self);
        self.flush()?;
        self.sync_dirty()?;
        let checkpoint_id = {
            let meta = self.shared.meta.lock().unwrap_or_else(|e| e.into_inner());
            meta.generation + 1
        };
        let mut wrote = false;
        if write_checkpoint {
            match self.write_checkpoint(checkpoint_id) {
                Ok(()) => wrote = true,
                Err(e) => {
                    tracing::warn!(shard = self.id, error = %e, "index checkpoint not written; the next start will scan")
                }
            }
        }
        let (last, all) = {
            let mut meta = self.shared.meta.lock().unwrap_or_else(|e| e.into_inner());
            meta.open_shards -= 1;
            meta.checkpoints_written += u32::from(wrote);
            (
                meta.open_shards == 0,
                meta.checkpoints_written == self.shared.layout.shard_count,
            )
        };
        if last {
            self.shared
                .write_meta(true, if all { checkpoint_id } else { 0 })?;
        }
        Ok(())
    }

    // ---- lookups and reads -------------------------------------------------------------

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The index candidates of hash `h` in `db`, copied out (reading them needs `&mut
    /// self`); usually 0 or 1 of them, so a small array avoids a heap allocation per lookup.
    pub(crate) fn candidate_addresses(&self, db: Db, h: u64) -> impl Iterator<Item = Address> {
        let mut small = [Address(0); 4];
        let mut n = 0;
        let mut more: Vec<Address> = Vec::new();
        for a in self.indexes[db as usize].candidates(h) {
            if n < small.len() {
                small[n] = a;
                n += 1;
            } else {
                more.push(a);
            }
        }
        small.into_iter().take(n).chain(more)
    }

    /// The current record of (db, key), verified by reading it: never another key's record.
    /// The current record of (db, key) as a lendable copy (read as `find` reads it),
    /// for a coalesced list's deferred store (`PagedList::remember_root`).
    pub(crate) fn current_fetched(
        &mut self,
        db: Db,
        key: &[u8],
    ) -> Result<Option<super::prefetch::Fetched>, StorageError> {
        let h = self.hash(db, key);
        let Some(f) = self.find(db, key, h)? else {
            return Ok(None);
        };
        let (block, _) = self.shared.layout.split(f.addr);
        Ok(self.blocks.get(&block).map(|b| super::prefetch::Fetched {
            addr: f.addr,
            block_seq: b.block_seq,
            rec: f.rec,
        }))
    }

    pub(crate) fn find(
        &mut self,
        db: Db,
        key: &[u8],
        h: u64,
    ) -> Result<Option<Found>, StorageError> {
        'again: loop {
            for addr in self.candidate_addresses(db, h) {
                if self
                    .blind
                    .get(&addr.0)
                    .is_some_and(|p| p.db != db || *p.key != *key)
                {
                    // Another key's blind write (its key is kept): (db, key) may be the
                    // record it replaced. Settling reads only that one; then look again.
                    self.settle_blind(addr)?;
                    continue 'again;
                }
                let rec = self.read_record(addr)?;
                if rec.header.db == db && rec.key == key {
                    return Ok(Some(Found { addr, rec }));
                }
                if self.blind.contains_key(&addr.0) {
                    // Another key's blind write: (db, key) may be the record it replaced
                    // in the index. Settling puts that back if so; then look again.
                    self.settle_blind(addr)?;
                    continue 'again;
                }
            }
            return Ok(None);
        }
    }

    /// Reads and verifies the record at `addr`: from the staging buffer if it is in the open
    /// block, otherwise with one device read (two for records over ~4 KiB).
    pub(crate) fn read_record(&mut self, addr: Address) -> Result<OwnedRecord, StorageError> {
        // A page address from a tree loaded before a seal moved this scope's records.
        let addr = if self.moved.is_empty() {
            addr
        } else {
            self.current_address(addr)
        };
        let (block, off) = self.shared.layout.split(addr);
        if let Some(ob) = &self.open {
            if ob.block == block && off < ob.write_pos {
                let r = decode_record(&self.staging.as_slice()[off..ob.write_pos], ob.block_seq)
                    .ok_or_else(|| {
                        StorageError::Corrupt(format!("staged record at {addr:?} fails its check"))
                    })?;
                return Ok(OwnedRecord {
                    header: r.header,
                    key: r.key.to_vec(),
                    value: r.value.to_vec(),
                });
            }
        }
        let block_seq = self
            .blocks
            .get(&block)
            .ok_or_else(|| {
                StorageError::Corrupt(format!(
                    "address {addr:?} in a block this shard does not own"
                ))
            })?
            .block_seq;
        if let Some(x) = self
            .prefetched
            .iter()
            .find(|x| x.addr == addr && x.block_seq == block_seq)
        {
            return Ok(x.rec.clone());
        }
        if let Some(rec) = self.cache.get(addr, block_seq) {
            return Ok(rec.clone());
        }
        // In a restartable command (a page below a root, any record nobody planned for)
        // the read is not waited for here: it is recorded and the command runs again once
        // the worker's ring has read it (`prefetch::restartable_begin`).
        if self.defer_miss(addr) {
            return Err(StorageError::Deferred);
        }
        let rec = self.read_record_from_device(addr, block, off, block_seq)?;
        self.cache.insert(addr, block_seq, &rec);
        Ok(rec)
    }

    /// The device half of `read_record`: one read (two for records over ~4 KiB) that the
    /// worker waits for.
    fn read_record_from_device(
        &mut self,
        addr: Address,
        block: BlockId,
        off: usize,
        block_seq: u64,
    ) -> Result<OwnedRecord, StorageError> {
        self.counters.sync_reads += 1;
        let bs = self.block_size();
        let (dev, base) = self.shared.layout.locate(block);
        let aligned = off & !(CHUNK_ALIGN_BYTES as usize - 1);
        let rel = off - aligned;
        let mut len = READ_WINDOW_BYTES.min(bs - aligned);
        let device = &self.shared.layout.devices[dev];
        let mut big: Option<AlignedBuf> = None;
        for _ in 0..2 {
            let buf = match big.as_mut() {
                Some(b) => b,
                None => &mut self.read_buf,
            };
            device.read_range_at(base + aligned as u64, buf, 0..len)?;
            self.counters.device_reads += 1;
            self.counters.device_read_bytes += len as u64;
            let bytes = &buf.as_slice()[..len];
            let hdr = RecordHeader::decode(&bytes[rel..])
                .ok_or_else(|| StorageError::Corrupt(format!("no record header at {addr:?}")))?;
            let need = rel + hdr.record_len();
            if need > bs - aligned {
                return Err(StorageError::Corrupt(format!(
                    "record at {addr:?} overruns its block"
                )));
            }
            if need <= len {
                let r = decode_record(&bytes[rel..need], block_seq).ok_or_else(|| {
                    StorageError::Corrupt(format!("record at {addr:?} fails its checksum"))
                })?;
                return Ok(OwnedRecord {
                    header: r.header,
                    key: r.key.to_vec(),
                    value: r.value.to_vec(),
                });
            }
            len = align_up(need);
            big = Some(AlignedBuf::new_zeroed(len));
        }
        Err(StorageError::Corrupt(format!(
            "record at {addr:?} changed size between reads"
        )))
    }

    /// The value bytes of a Put record: inline, or gathered from its extents.
    fn materialize(&mut self, rec: OwnedRecord) -> Result<Vec<u8>, StorageError> {
        if rec.header.flags & FLAG_LARGE == 0 {
            return Ok(rec.value);
        }
        let (total, frag_seq, addrs) = parse_root(&rec.value)?;
        let mut out = Vec::with_capacity(total as usize);
        for a in addrs {
            let frag = self.read_record(a)?;
            if frag.header.record_type != RecordType::Fragment || frag.header.seq != frag_seq {
                return Err(StorageError::Corrupt(format!(
                    "fragment {a:?} does not belong to its root"
                )));
            }
            out.extend_from_slice(&frag.value);
        }
        if out.len() as u64 != total {
            return Err(StorageError::Corrupt("large value length mismatch".into()));
        }
        // Roots written before the value checksum existed carry 0 there: nothing to check.
        let stored = root_value_crc_field(&rec.value);
        if stored != 0 && stored != value_crc_field(&out) {
            return Err(StorageError::Corrupt(format!(
                "large value of {} bytes fails its checksum (its fragments verify: an extent \
                 holds another value's bytes)",
                out.len()
            )));
        }
        Ok(out)
    }

    // ---- index maintenance -------------------------------------------------------------

    /// Points (db, key) at a freshly appended Put and moves the live-byte accounting.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn install(
        &mut self,
        db: Db,
        h: u64,
        old: Option<Found>,
        addr: Address,
        len: usize,
        expire: u64,
        retire_old_extents: bool,
    ) {
        let d = db as usize;
        match old {
            Some(f) => {
                let fa = self.current_address(f.addr);
                let replaced = self.indexes[d].replace(h, fa, addr);
                assert!(replaced, "index lost an entry it just returned");
                // The new record of the same key heads an unsettled blind write now.
                if let Some(p) = self.blind.get_mut(&fa.0) {
                    p.len = len as u32;
                    p.expire = expire;
                    // Maybe a large or paged root now: never replaced without a read.
                    p.large = true;
                }
                self.blind_move(fa, addr);
                self.expiry_remove(db, f.rec.header.expire_at_ms, fa);
                self.unaccount(db, fa, f.rec.header.record_len());
                if retire_old_extents && f.rec.header.flags & FLAG_LARGE != 0 {
                    self.retire_extents_of(&f.rec);
                }
                if retire_old_extents && f.rec.header.flags & FLAG_PAGED != 0 {
                    super::paged::release(self, db, &f.rec);
                }
            }
            None => self.indexes[d].insert(h, addr),
        }
        let (block, _) = self.shared.layout.split(addr);
        if let Some(info) = self.blocks.get_mut(&block) {
            info.live_bytes[d] += len as u32;
        }
        self.expiry_add(db, expire, addr);
    }

    /// Counts a tombstone just appended at `addr` in its block.
    pub(crate) fn note_tomb_at(&mut self, addr: Address, len: usize) {
        let (block, _) = self.shared.layout.split(addr);
        if let Some(info) = self.blocks.get_mut(&block) {
            info.note_tomb(len);
        }
    }

    pub(crate) fn expiry_add(&mut self, db: Db, expire_at_ms: u64, addr: Address) {
        if expire_at_ms != 0 {
            self.expiry_earliest_ms = self.expiry_earliest_ms.min(expire_at_ms);
            self.expiry[db as usize].insert(expire_at_ms, addr);
        }
    }

    pub(crate) fn expiry_remove(&mut self, db: Db, expire_at_ms: u64, addr: Address) {
        if expire_at_ms != 0 {
            self.expiry[db as usize].remove(expire_at_ms, addr);
        }
    }

    /// Keys of `db` with an expiry (INFO keyspace `expires=`).
    pub fn volatile_count_db(&self, db: Db) -> u64 {
        self.expiry.get(db as usize).map_or(0, |e| e.len() as u64)
    }

    fn volatile_count(&self) -> u64 {
        self.expiry.iter().map(|e| e.len() as u64).sum()
    }

    pub(crate) fn unaccount(&mut self, db: Db, addr: Address, len: usize) {
        // A superseded paged root or directory page is never looked up again.
        if !self.resident_candidates.is_empty() {
            self.resident_candidates.remove(&addr.0);
        }
        self.cache.remove_resident(addr);
        let (block, _) = self.shared.layout.split(addr);
        let pct = u64::from(self.defrag_live_percent_max);
        if let Some(info) = self.blocks.get_mut(&block) {
            let live = &mut info.live_bytes[db as usize];
            *live = live.saturating_sub(len as u32);
            // Fewer live bytes may make this block the defrag candidate the idle memo
            // says does not exist.
            if self.defrag_idle.is_some() && Self::defrag_candidate(info, pct) {
                self.defrag_idle = None;
            }
        }
    }

    fn retire_extents_of(&mut self, root: &OwnedRecord) {
        if let Ok((_, _, addrs)) = parse_root(&root.value) {
            for a in addrs {
                let (b, _) = self.shared.layout.split(a);
                if self
                    .blocks
                    .get(&b)
                    .is_some_and(|i| i.kind == BLOCK_KIND_EXTENT)
                {
                    self.retire(b);
                }
            }
        }
    }

    /// Deletes a found record with a tombstone (may use the allocator's reserve).
    pub(crate) fn remove_found(
        &mut self,
        db: Db,
        h: u64,
        found: Found,
    ) -> Result<(), StorageError> {
        // Deleting a blind write's record would drop the entry it replaced: settle first
        // (that never moves or removes `found`'s own entry).
        let fa = self.current_address(found.addr);
        if self.blind.contains_key(&fa.0) {
            self.settle_blind(fa)?;
        }
        let (taddr, _) = self.append(
            RecordType::Tombstone,
            0,
            0,
            db,
            &found.rec.key,
            &[],
            0,
            None,
            true,
        )?;
        let (tblock, _) = self.shared.layout.split(taddr);
        let tlen = self.appended_len(found.rec.key.len(), 0);
        if let Some(info) = self.blocks.get_mut(&tblock) {
            info.note_tomb(tlen);
        }
        self.counters.tombstones_written += 1;
        let fa = self.current_address(found.addr);
        let removed = self.indexes[db as usize].remove(h, fa);
        assert!(removed, "index lost an entry it just returned");
        self.expiry_remove(db, found.rec.header.expire_at_ms, fa);
        self.unaccount(db, fa, found.rec.header.record_len());
        if found.rec.header.flags & FLAG_LARGE != 0 {
            self.retire_extents_of(&found.rec);
        }
        if found.rec.header.flags & FLAG_PAGED != 0 {
            super::paged::release(self, db, &found.rec);
        }
        if !self.watches.is_empty() {
            self.watches.touch(db, &found.rec.key, true);
        }
        crate::runtime::tracking::modified(&found.rec.key);
        Ok(())
    }

    /// Lazy expiry on access. If even the reserve is exhausted the key simply stays (expired,
    /// invisible) until space returns.
    fn expire_lazily(&mut self, db: Db, h: u64, found: Found) -> Result<(), StorageError> {
        // The key is copied only when `expired` events are on (one load otherwise).
        let key = (crate::runtime::events::flags() & crate::runtime::events::EXPIRED != 0)
            .then(|| found.rec.key.clone());
        match self.remove_found(db, h, found) {
            Ok(()) => {
                if let Some(key) = key {
                    crate::runtime::events::notify(
                        crate::runtime::events::EXPIRED,
                        "expired",
                        &key,
                        db,
                    );
                }
                self.counters.expired_keys += 1;
                Ok(())
            }
            Err(StorageError::DeviceFull) => Ok(()),
            Err(e) => Err(e),
        }
    }

    // ---- the append stream -------------------------------------------------------------

    fn mark_unflushed(&mut self) {
        self.unflushed = true;
        if self.first_unflushed_ms.is_none() {
            self.first_unflushed_ms = Some(self.last_now_ms);
        }
    }

    /// Appends one record to the open block (opening/sealing blocks as needed). `seq` None
    /// takes the next sequence number. Returns the record's address and sequence number.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        record_type: RecordType,
        flags: u8,
        value_kind: u8,
        db: Db,
        key: &[u8],
        value: &[u8],
        expire_at_ms: u64,
        seq: Option<u64>,
        use_reserve: bool,
    ) -> Result<(Address, u64), StorageError> {
        if self.in_defrag {
            self.counters.defrag_write_bytes += record_len(key.len(), value.len()) as u64;
        }
        let group = match record_type {
            RecordType::Put | RecordType::Tombstone => self.current_group(),
            _ => None,
        };
        let group = group.filter(|_| {
            record_len(key.len(), value.len()) + GROUP_ID_BYTES <= self.inline_record_max()
        });
        let r = self.append_in_group(
            record_type,
            flags,
            value_kind,
            db,
            key,
            value,
            expire_at_ms,
            seq,
            use_reserve,
            group,
        )?;
        if group.is_some() {
            if let Some(sc) = self.scope.as_mut() {
                sc.group_records += 1;
            }
        }
        Ok(r)
    }

    /// The group the records appended now belong to (a multi-shard command is running).
    fn current_group(&self) -> Option<u64> {
        self.scope.and_then(|sc| sc.group)
    }

    /// Bytes a put or tombstone of these lengths takes if appended now.
    fn appended_len(&self, key_len: usize, value_len: usize) -> usize {
        record_len(key_len, value_len) + self.current_group().map_or(0, |_| GROUP_ID_BYTES)
    }

    /// [`Shard::append`] with the group given: `Some` writes the record GROUPED.
    #[allow(clippy::too_many_arguments)]
    fn append_in_group(
        &mut self,
        record_type: RecordType,
        flags: u8,
        value_kind: u8,
        db: Db,
        key: &[u8],
        value: &[u8],
        expire_at_ms: u64,
        seq: Option<u64>,
        use_reserve: bool,
        group: Option<u64>,
    ) -> Result<(Address, u64), StorageError> {
        self.check_broken()?;
        // No write after a restartable command's miss (see `prefetch.rs`).
        super::prefetch::restartable_write()?;
        let flags = (flags & !FLAG_GROUPED) | group.map_or(0, |_| FLAG_GROUPED);
        let len = record_len(key.len(), value.len()) + group.map_or(0, |_| GROUP_ID_BYTES);
        assert!(
            len <= self.inline_record_max(),
            "record of {len} bytes cannot fit a block"
        );
        self.ensure_room(len, use_reserve)?;
        // A seal inside a command scope may just have moved the scope's staged records (in
        // `ensure_room` above, or earlier in the scope): a paged root or directory page built
        // before names their old addresses. Same length, so the room found still fits.
        let rebased = match record_type {
            RecordType::Page => self.rebase_payload(false, value),
            RecordType::Put if flags & FLAG_PAGED != 0 => self.rebase_payload(true, value),
            _ => None,
        };
        let value = rebased.as_deref().unwrap_or(value);
        if let (Some(sc), Some(ob)) = (self.scope.as_mut(), self.open.as_ref()) {
            sc.first.get_or_insert((ob.block, ob.write_pos));
        }
        let seq = seq.unwrap_or_else(|| {
            self.next_seq += 1;
            self.next_seq - 1
        });
        let ob = self.open.as_mut().expect("ensure_room opened a block");
        let hdr = RecordHeader {
            record_type,
            flags,
            value_kind,
            db,
            key_len: key.len() as u16,
            value_len: value.len() as u32,
            crc: 0,
            seq,
            expire_at_ms,
        };
        encode_record_in_group(
            &mut self.staging.as_mut_slice()[ob.write_pos..],
            ob.block_seq,
            hdr,
            key,
            value,
            group.unwrap_or(0),
        );
        let addr = self.shared.layout.address(ob.block, ob.write_pos);
        ob.write_pos += len;
        let (block, used) = (ob.block, ob.write_pos as u32);
        if let Some(info) = self.blocks.get_mut(&block) {
            info.used_bytes = used;
        }
        if super::cache::keeps_resident(record_type, flags, value) {
            self.resident_candidates.insert(addr.0);
        }
        self.mark_unflushed();
        Ok((addr, seq))
    }

    fn ensure_room(&mut self, len: usize, use_reserve: bool) -> Result<(), StorageError> {
        if let Some(ob) = &self.open {
            if ob.write_pos + len + MARKER_RECORD_BYTES <= self.block_size() {
                return Ok(());
            }
            if let Some(from) = self.scope_tail_to_move(len) {
                if let Some((block, block_seq)) = self.shared.alloc_block(use_reserve) {
                    return self.move_scope_tail(from, block, block_seq);
                }
            }
            self.seal_open()?;
        }
        self.open_new_block(use_reserve)
    }

    /// Opens a command scope: until the matching [`Shard::command_end`], a block seal does
    /// not split this shard's records of the command. When the open block cannot take the
    /// next record and the command already staged records in it, those records (never yet
    /// handed to a write) are cut from the block being sealed and appended again, with their
    /// sequence numbers, to the new block, so all of them land in one chunk and a crash
    /// keeps all or none of them. Scopes nest (EXEC, then each queued command); the
    /// outermost one counts. A command writing one record needs no scope. Limit: a
    /// command whose records here do not fit one block is still split at its second seal.
    pub fn command_begin(&mut self) {
        self.scope.get_or_insert_with(CommandScope::default).depth += 1;
    }

    /// Ends the scope opened by the matching [`Shard::command_begin`].
    pub fn command_end(&mut self) {
        if let Some(sc) = self.scope.as_mut() {
            sc.depth -= 1;
            if sc.depth == 0 {
                self.scope = None;
                self.moved.clear();
                self.scope_pages.clear();
            }
        }
    }

    /// Opens a group scope (a command scope whose puts and tombstones here are GROUPED with
    /// `group`, `docs/atomic-writes.md`). Inside an open group only the nesting grows.
    pub fn group_begin(&mut self, group: u64) {
        let sc = self.scope.get_or_insert_with(CommandScope::default);
        sc.depth += 1;
        if sc.group.is_none() {
            sc.group = Some(group);
            sc.group_records = 0;
        }
    }

    /// GROUPED records this shard wrote in its open group so far.
    pub fn group_records(&self) -> u32 {
        self.scope.map_or(0, |sc| sc.group_records)
    }

    /// Closes the scope of [`Shard::group_begin`]. At the outermost level, if this shard
    /// wrote records of the group, appends its part record naming `shards` (every shard
    /// that wrote one, ascending).
    pub fn group_end(&mut self, shards: &[u32]) -> Result<(), StorageError> {
        let result = match self.scope {
            Some(CommandScope {
                depth: 1,
                group: Some(group),
                group_records,
                ..
            }) if group_records > 0 => {
                debug_assert!(shards.contains(&self.id) && shards.is_sorted());
                let payload = GroupPartPayload {
                    group,
                    records: group_records,
                    shards: shards.to_vec(),
                }
                .encode();
                let seq = self.next_seq - 1;
                self.append_in_group(
                    RecordType::GroupPart,
                    0,
                    0,
                    0,
                    &[],
                    &payload,
                    0,
                    Some(seq),
                    true,
                    None,
                )
                .map(|_| ())
            }
            _ => Ok(()),
        };
        self.command_end();
        result
    }

    /// Writes what is staged (records and a marker) without syncing and without freeing
    /// retired blocks: the participants of a group are written this way, then the store's
    /// devices are synced once ([`Shard::sync_store_devices`]), and only then is the group
    /// decided. Freeing waits for the next [`Shard::flush`], whose marker carries a
    /// `decided_below` past the group.
    pub fn group_flush_write(&mut self) -> Result<(), StorageError> {
        self.check_broken()?;
        if self.unflushed || self.inflight.is_some() {
            self.write_chunk(self.watermarks_dirty)?;
            self.counters.flushes += 1;
            self.unflushed = false;
            self.first_unflushed_ms = None;
        }
        Ok(())
    }

    /// A new group id from the store's counter (one per multi-shard command).
    pub fn group_alloc(&self) -> u64 {
        self.shared.groups.alloc()
    }

    /// All parts of `group` are durable (after [`Shard::group_flush_write`] of every
    /// participant and one sync): later markers may say so.
    pub fn group_decide(&self, group: u64) {
        self.shared.groups.decide(group);
    }

    /// Where the record at `a` is now: a seal inside the current scope may have moved it.
    pub(crate) fn current_address(&self, a: Address) -> Address {
        resolve_moved(&self.moved, a)
    }

    /// The staging offset of the scope's records in the open block, if moving them to a
    /// fresh block (with the `len`-byte record that does not fit) keeps them together.
    fn scope_tail_to_move(&self, len: usize) -> Option<usize> {
        let scope = self.scope?;
        if scope.group.is_some() {
            // A group's records count only with all of them: a seal may split them.
            return None;
        }
        let (block, from) = scope.first?;
        let ob = self.open.as_ref()?;
        let first_record = record_len(0, BLOCK_HEADER_PAYLOAD_BYTES);
        let fits =
            first_record + (ob.write_pos - from) + len + MARKER_RECORD_BYTES <= self.block_size();
        (block == ob.block && from >= ob.chunk_start && from > first_record && fits).then_some(from)
    }

    /// Seals the open block without the scope's records from `from` on and appends them
    /// again to the freshly allocated `block`, re-pointing the index, expiry and live-byte
    /// accounting (see [`Shard::command_begin`]).
    fn move_scope_tail(
        &mut self,
        from: usize,
        block: BlockId,
        block_seq: u64,
    ) -> Result<(), StorageError> {
        let (old_block, old_seq, end) = {
            let ob = self.open.as_ref().expect("a block to seal");
            (ob.block, ob.block_seq, ob.write_pos)
        };
        let tail = self.staging.as_slice()[from..end].to_vec();
        self.staging.as_mut_slice()[from..end].fill(0);
        self.set_write_pos(from);
        if let Err(e) = self.seal_open() {
            // Nothing was sealed: put the records back where the index expects them.
            self.staging.as_mut_slice()[from..end].copy_from_slice(&tail);
            self.set_write_pos(end);
            let (dev, _) = self.shared.layout.locate(block);
            self.shared.lock_alloc().release(dev, block);
            return Err(e);
        }
        self.open_allocated_block(block, block_seq);
        self.counters.scope_moves += 1;
        if let Some(sc) = self.scope.as_mut() {
            sc.first = None;
        }
        let mut pos = 0;
        while pos < tail.len() {
            let r = decode_record(&tail[pos..], old_seq).expect("a staged record verifies");
            let (h, rlen) = (r.header, r.header.record_len());
            let old = self.shared.layout.address(old_block, from + pos);
            // Roots and directory pages naming pages moved before them are re-pointed as
            // they are appended again (`append_in_group`).
            let (new, _) = self.append_in_group(
                h.record_type,
                h.flags,
                h.value_kind,
                h.db,
                r.key,
                r.value,
                h.expire_at_ms,
                Some(h.seq),
                true,
                r.group,
            )?;
            self.repoint_moved(&h, r.key, old, new, rlen);
            pos += rlen;
        }
        // Released roots queued in this scope may name directory pages that just moved.
        if !self.releases.is_empty() {
            let moved = std::mem::take(&mut self.moved);
            self.releases
                .rebase(|a| resolve_moved(&moved, Address(a)).0, block_seq);
            self.moved = moved;
        }
        Ok(())
    }

    fn set_write_pos(&mut self, pos: usize) {
        if let Some(ob) = self.open.as_mut() {
            ob.write_pos = pos;
            let block = ob.block;
            if let Some(info) = self.blocks.get_mut(&block) {
                info.used_bytes = pos as u32;
            }
        }
    }

    /// Moves what pointed at a staged record from `old` to its copy at `new`.
    fn repoint_moved(
        &mut self,
        h: &RecordHeader,
        key: &[u8],
        old: Address,
        new: Address,
        len: usize,
    ) {
        let (old_block, _) = self.shared.layout.split(old);
        let (new_block, _) = self.shared.layout.split(new);
        let hash = self.hash(h.db, key);
        if h.record_type == RecordType::Tombstone {
            if let Some(i) = self.blocks.get_mut(&old_block) {
                i.tomb_bytes = i.tomb_bytes.saturating_sub(len as u32);
            }
            if let Some(i) = self.blocks.get_mut(&new_block) {
                i.note_tomb(len);
            }
        } else if h.record_type == RecordType::Page {
            // Not indexed: a page moves its live bytes if it still counts (`scope_pages`).
            if let Some(live) = self.scope_pages.remove(&old.0) {
                self.unaccount(h.db, old, live as usize);
                if let Some(i) = self.blocks.get_mut(&new_block) {
                    i.live_bytes[h.db as usize] += live;
                }
                self.scope_pages.insert(new.0, live);
            }
        } else if self.indexes[h.db as usize].replace(hash, old, new) {
            // Any indexed record (a put, or another kind the index points at).
            self.blind_move(old, new);
            self.unaccount(h.db, old, len);
            if let Some(i) = self.blocks.get_mut(&new_block) {
                i.live_bytes[h.db as usize] += len as u32;
            }
            self.expiry_remove(h.db, h.expire_at_ms, old);
            self.expiry_add(h.db, h.expire_at_ms, new);
        }
        self.moved.push((old, new));
    }

    fn seal_open(&mut self) -> Result<(), StorageError> {
        self.write_chunk(false)?;
        self.keep_resident_of_open();
        if let Some(ob) = self.open.take() {
            if let Some(info) = self.blocks.get_mut(&ob.block) {
                info.sealed = true;
            }
        }
        Ok(())
    }

    /// The open block is being sealed: its current paged roots and directory pages leave the
    /// staging buffer, so they go to the cache's resident part (`cache.rs`). Each is decoded
    /// and verified from the staged bytes; one cut from the block (a moved command scope's
    /// tail, past `write_pos`) or that does not verify is skipped.
    /// A cached key was just written again (`put_found`): its cache entry moves to the new
    /// record, still in the staging buffer at `new` (`RecordCache::replace`).
    fn recache_written(&mut self, old: Address, new: Address) {
        if self.cache.capacity_bytes() == 0 {
            return;
        }
        let layout = &self.shared.layout;
        let Some(old_seq) = self.blocks.get(&layout.split(old).0).map(|b| b.block_seq) else {
            return;
        };
        let Some(ob) = self.open.as_ref() else {
            return;
        };
        let (block, off) = layout.split(new);
        if block != ob.block || off >= ob.write_pos {
            return;
        }
        let Some(r) = decode_record(&self.staging.as_slice()[off..ob.write_pos], ob.block_seq)
        else {
            return;
        };
        self.cache.replace(old, old_seq, new, ob.block_seq, |rec| {
            rec.header = r.header;
            rec.key.clear();
            rec.key.extend_from_slice(r.key);
            rec.value.clear();
            rec.value.extend_from_slice(r.value);
        });
    }

    fn keep_resident_of_open(&mut self) {
        if self.resident_candidates.is_empty() {
            return;
        }
        let Some(ob) = self.open.as_ref() else {
            self.resident_candidates.clear();
            return;
        };
        let (block, block_seq, end) = (ob.block, ob.block_seq, ob.write_pos);
        for a in std::mem::take(&mut self.resident_candidates) {
            let (b, off) = self.shared.layout.split(Address(a));
            if b != block || off >= end {
                continue;
            }
            if let Some(r) = decode_record(&self.staging.as_slice()[off..end], block_seq) {
                let rec = OwnedRecord {
                    header: r.header,
                    key: r.key.to_vec(),
                    value: r.value.to_vec(),
                };
                self.cache.insert_resident(Address(a), block_seq, &rec);
            }
        }
    }

    fn open_new_block(&mut self, use_reserve: bool) -> Result<(), StorageError> {
        let (block, block_seq) = self
            .shared
            .alloc_block(use_reserve)
            .ok_or(StorageError::DeviceFull)?;
        self.open_allocated_block(block, block_seq);
        Ok(())
    }

    fn open_allocated_block(&mut self, block: BlockId, block_seq: u64) {
        if let Some(f) = self.inflight.as_mut().filter(|f| !f.retired) {
            // The worker's ring is still writing from this buffer: park it untouched and
            // stage the new block in another one.
            let fresh = self
                .spare_staging
                .take()
                .unwrap_or_else(|| AlignedBuf::new_zeroed(self.staging.len()));
            self.retired_staging = Some(std::mem::replace(&mut self.staging, fresh));
            f.retired = true;
        }
        self.staging.as_mut_slice().fill(0);
        let payload = BlockHeaderPayload {
            store_uuid: self.shared.layout.store_uuid,
            block_seq,
            shard_id: self.id,
            block_kind: BLOCK_KIND_LOG,
            global_block: block.0,
        }
        .encode();
        let hdr = header_record(RecordType::BlockHeader, 0, self.next_seq, payload.len());
        let len = encode_record(self.staging.as_mut_slice(), block_seq, hdr, &[], &payload);
        let mut info = BlockInfo::new(block_seq, BLOCK_KIND_LOG, false);
        info.used_bytes = len as u32;
        self.blocks.insert(block, info);
        self.open = Some(OpenBlock {
            block,
            block_seq,
            write_pos: len,
            chunk_start: 0,
            device_from: 0,
        });
        self.mark_unflushed();
    }

    /// Writes the staged part of the open block plus its commit marker, padded to 4096, in
    /// one device write. With `force_marker`, writes a marker even if nothing is staged (to
    /// make new FLUSHDB watermarks durable, or before retiring blocks).
    fn write_chunk(&mut self, force_marker: bool) -> Result<(), StorageError> {
        let Some(w) = self.prepare_chunk(force_marker)? else {
            return Ok(());
        };
        self.shared.layout.devices[w.dev].write_range_at(
            w.offset,
            &self.staging,
            w.start..w.end,
        )?;
        self.chunk_written(&w);
        Ok(())
    }

    /// First half of [`Shard::write_chunk`]: seals and opens blocks if needed, encodes the
    /// commit marker into staging and says which bytes of staging go where.
    fn prepare_chunk(&mut self, force_marker: bool) -> Result<Option<ChunkWrite>, StorageError> {
        let bs = self.block_size();
        let needs_new_block = match &self.open {
            None => force_marker,
            Some(ob) => {
                force_marker
                    && ob.write_pos == ob.chunk_start
                    && ob.write_pos + MARKER_RECORD_BYTES > bs
            }
        };
        if needs_new_block {
            self.seal_open()?;
            self.open_new_block(true)?;
        }
        let Some(ob) = self.open.as_mut() else {
            return Ok(None);
        };
        if ob.write_pos == ob.chunk_start && !force_marker {
            if ob.device_from == ob.chunk_start {
                return Ok(None);
            }
            // Nothing new, but a chunk write in flight is not known done: write its bytes
            // again (no new marker) so what the caller syncs next covers them.
            let (dev, base) = self.shared.layout.locate(ob.block);
            return Ok(Some(ChunkWrite {
                dev,
                offset: base + ob.device_from as u64,
                start: ob.device_from,
                end: ob.chunk_start,
            }));
        }
        let staging = self.staging.as_mut_slice();
        let marker_pos = ob.write_pos;
        let payload = MarkerPayload {
            chunk_start: ob.chunk_start as u32,
            chunk_crc: crc32c::crc32c(&staging[ob.chunk_start..marker_pos]),
            block_seq: ob.block_seq,
            flush_watermarks: self.watermarks,
            decided_below: self.shared.groups.decided_below(),
        }
        .encode();
        let hdr = header_record(RecordType::Marker, 0, self.next_seq - 1, payload.len());
        let mlen = encode_record(&mut staging[marker_pos..], ob.block_seq, hdr, &[], &payload);
        let end = align_up(marker_pos + mlen);
        debug_assert!(end <= bs);
        let (dev, base) = self.shared.layout.locate(ob.block);
        Ok(Some(ChunkWrite {
            dev,
            offset: base + ob.device_from as u64,
            start: ob.device_from,
            end,
        }))
    }

    /// Second half of [`Shard::write_chunk`], once the bytes are on the device.
    fn chunk_written(&mut self, w: &ChunkWrite) {
        self.counters.device_writes += 1;
        self.counters.device_write_bytes += (w.end - w.start) as u64;
        self.dirty_devices[w.dev] = true;
        self.chunk_advance(w);
        if let Some(ob) = self.open.as_mut() {
            ob.device_from = ob.device_from.max(w.end);
        }
    }

    /// The chunk's records and marker are handed to a write: later records go after it.
    fn chunk_advance(&mut self, w: &ChunkWrite) {
        let Some(ob) = self.open.as_mut() else {
            return;
        };
        if w.end <= ob.chunk_start {
            return; // a rewrite of bytes already handed out
        }
        ob.chunk_start = w.end;
        ob.write_pos = w.end;
        let block = ob.block;
        if let Some(info) = self.blocks.get_mut(&block) {
            info.used_bytes = w.end as u32;
        }
        self.watermarks_dirty = false;
    }

    fn check_broken(&self) -> Result<(), StorageError> {
        match &self.broken {
            Some(e) => Err(StorageError::WriteFailed(e.clone())),
            None => Ok(()),
        }
    }

    /// The store's devices, in the order `crate::device::async_device_fd` numbers them.
    pub fn devices(&self) -> &[std::sync::Arc<dyn crate::device::BlockDevice>] {
        &self.shared.layout.devices
    }

    /// The file descriptors of the store's devices that have one (for io_uring file
    /// registration).
    pub fn device_fds(&self) -> Vec<RawFd> {
        self.shared
            .layout
            .devices
            .iter()
            .filter_map(|d| d.raw_fd())
            .collect()
    }

    /// A chunk write handed to the worker is still in flight (see `flush_chunk_begin`).
    pub fn chunk_write_inflight(&self) -> bool {
        self.inflight.is_some()
    }

    /// Group commit with the chunk write done by the caller, so the worker keeps serving
    /// while it runs: `Some` names the staged bytes to write (file descriptor, offset, the
    /// bytes). Records staged from now on go after them, in the same buffer, which never
    /// changes under the write: sealing the block meanwhile parks the buffer. The caller
    /// must report the write's result to [`Shard::flush_chunk_done`]; until then a
    /// synchronous flush (sealing, SAVE, a coordinator's flush) writes those bytes again
    /// itself. `None`: nothing to write this way (nothing staged, a write already in
    /// flight, blocks to free, or a device without a file descriptor); use
    /// [`Shard::flush_write`].
    pub fn flush_chunk_begin(&mut self) -> Result<Option<ChunkIo>, StorageError> {
        self.chunk_begin(true)
    }

    /// [`Shard::flush_chunk_begin`] on any device (fd -1 without one): tests perform the
    /// write themselves, whenever they like.
    #[cfg(test)]
    pub(crate) fn flush_chunk_begin_any(&mut self) -> Result<Option<ChunkIo>, StorageError> {
        self.chunk_begin(false)
    }

    fn chunk_begin(&mut self, need_fd: bool) -> Result<Option<ChunkIo>, StorageError> {
        self.check_broken()?;
        if self.inflight.is_some() || !self.unflushed || !self.pending_frees.is_empty() {
            return Ok(None);
        }
        let dev_fd = |s: &Self, dev: usize| match s.shared.layout.devices[dev].raw_fd() {
            None if !need_fd => Some(-1),
            fd => fd,
        };
        if self
            .open
            .as_ref()
            .is_some_and(|ob| dev_fd(self, self.shared.layout.locate(ob.block).0).is_none())
        {
            return Ok(None);
        }
        let Some(w) = self.prepare_chunk(self.watermarks_dirty)? else {
            return Ok(None);
        };
        let Some(fd) = dev_fd(self, w.dev) else {
            // Sealing moved the open block to a device without a descriptor.
            self.shared.layout.devices[w.dev].write_range_at(
                w.offset,
                &self.staging,
                w.start..w.end,
            )?;
            self.chunk_written(&w);
            return Ok(None);
        };
        let bytes = &self.staging.as_slice()[w.start..w.end];
        let io = ChunkIo {
            fd,
            dev: w.dev,
            offset: w.offset,
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        };
        self.chunk_advance(&w);
        self.counters.flushes += 1;
        self.unflushed = false;
        self.first_unflushed_ms = None;
        let block = self.open.as_ref().map(|ob| ob.block).unwrap_or(BlockId(0));
        self.inflight = Some(InflightChunk {
            write: w,
            block,
            retired: false,
        });
        Ok(Some(io))
    }

    /// Ends [`Shard::flush_chunk_begin`] with the write's result (bytes written or
    /// `-errno`). A failed or short write is retried once, synchronously, from the
    /// untouched buffer; if that fails too the shard stops taking writes. On success
    /// returns the descriptors to sync before the chunk's records may be acknowledged.
    pub fn flush_chunk_done(&mut self, res: i32) -> Result<Vec<RawFd>, StorageError> {
        let Some(f) = self.inflight.take() else {
            return Err(StorageError::Corrupt(
                "chunk write completion without a write in flight".into(),
            ));
        };
        let w = &f.write;
        let want = w.end - w.start;
        if res < 0 || res as usize != want {
            let why = if res < 0 {
                std::io::Error::from_raw_os_error(-res).to_string()
            } else {
                format!("short write: {res} of {want} bytes")
            };
            tracing::warn!("shard {}: chunk write failed ({why}); retrying", self.id);
            let buf = if f.retired {
                self.retired_staging.as_ref()
            } else {
                Some(&self.staging)
            };
            let retry = match buf {
                Some(b) => self.shared.layout.devices[w.dev]
                    .write_range_at(w.offset, b, w.start..w.end)
                    .map_err(StorageError::from),
                None => Err(StorageError::Corrupt(
                    "parked staging buffer missing".into(),
                )),
            };
            if let Err(e) = retry {
                let msg = format!("chunk write failed twice ({why}; then {e})");
                tracing::error!("shard {}: {msg}; refusing further writes", self.id);
                self.broken = Some(msg.clone());
                if f.retired {
                    self.spare_staging = self.retired_staging.take();
                }
                return Err(StorageError::WriteFailed(msg));
            }
        }
        self.counters.device_writes += 1;
        self.counters.device_write_bytes += want as u64;
        self.dirty_devices[w.dev] = true;
        if f.retired {
            self.spare_staging = self.retired_staging.take();
        } else if let Some(ob) = self.open.as_mut().filter(|ob| ob.block == f.block) {
            ob.device_from = ob.device_from.max(w.end);
        }
        self.take_sync_fds()
    }

    /// The data files written since their last sync (devices without a descriptor are
    /// synced here), marked clean: the caller syncs them.
    fn take_sync_fds(&mut self) -> Result<Vec<RawFd>, StorageError> {
        let mut fds = Vec::new();
        for dev in 0..self.dirty_devices.len() {
            if !self.dirty_devices[dev] {
                continue;
            }
            match self.shared.layout.devices[dev].raw_fd() {
                Some(fd) => fds.push(fd),
                None => self.shared.layout.devices[dev].sync()?,
            }
            self.dirty_devices[dev] = false;
            self.counters.fsyncs += 1;
        }
        Ok(fds)
    }

    /// Syncs every device of the store now, whatever this shard wrote: what another
    /// worker wrote into this shard and is still syncing on its own ring becomes durable
    /// too (a coordinator about to answer from borrowed shards needs that).
    pub fn sync_store_devices(&mut self) -> Result<(), StorageError> {
        for dev in &self.shared.layout.devices {
            dev.sync()?;
            self.counters.fsyncs += 1;
        }
        self.dirty_devices.iter_mut().for_each(|d| *d = false);
        Ok(())
    }

    pub(crate) fn sync_dirty(&mut self) -> Result<(), StorageError> {
        for dev in 0..self.dirty_devices.len() {
            if self.dirty_devices[dev] {
                self.shared.layout.devices[dev].sync()?;
                self.dirty_devices[dev] = false;
                self.counters.fsyncs += 1;
            }
        }
        Ok(())
    }

    /// Schedules a block for freeing; it is zeroed and released during the next flush, after
    /// whatever superseded its contents is durable.
    pub(crate) fn retire(&mut self, block: BlockId) {
        self.debug_assert_unreferenced(block);
        if let Some(info) = self.blocks.get_mut(&block) {
            if !info.retiring {
                info.retiring = true;
                self.pending_frees.push(block);
                self.mark_unflushed();
            }
        }
    }

    /// Debug builds (tests) check that no index entry points into a log block being retired:
    /// the live-byte accounting that decides retirement must never be wrong. Skipped for big
    /// indexes so a debug server stays usable.
    fn debug_assert_unreferenced(&self, block: BlockId) {
        const CHECK_KEYS_MAX: usize = 100_000;
        if !cfg!(debug_assertions)
            || self.indexes.iter().map(Index::len).sum::<usize>() > CHECK_KEYS_MAX
        {
            return;
        }
        if self
            .blocks
            .get(&block)
            .is_some_and(|i| i.kind == BLOCK_KIND_LOG)
        {
            for ix in &self.indexes {
                ix.for_each(|a| {
                    assert_ne!(
                        self.shared.layout.split(a).0,
                        block,
                        "retiring a block an index entry points into"
                    );
                });
            }
        }
    }

    /// Zeroes the header sector of every retired block, makes that durable, then hands the
    /// blocks back to the allocator.
    fn free_retired(&mut self) -> Result<(), StorageError> {
        let mut frees = std::mem::take(&mut self.pending_frees);
        if let Some(f) = &self.inflight {
            // A chunk write may still land on this block: it is not handed back before
            // that write completes (the next flush frees it).
            if frees.contains(&f.block) {
                frees.retain(|&b| b != f.block);
                self.pending_frees.push(f.block);
            }
        }
        let zero = AlignedBuf::new_zeroed(CHUNK_ALIGN_BYTES as usize);
        for (i, &b) in frees.iter().enumerate() {
            let (dev, base) = self.shared.layout.locate(b);
            if let Err(e) = self.shared.layout.devices[dev].write_at(base, &zero) {
                self.pending_frees.extend_from_slice(&frees[i..]);
                return Err(e.into());
            }
            self.counters.device_writes += 1;
            self.counters.device_write_bytes += zero.len() as u64;
            self.dirty_devices[dev] = true;
        }
        if let Err(e) = self.sync_dirty() {
            self.pending_frees.extend_from_slice(&frees);
            return Err(e);
        }
        if !self.raider.droppable.is_empty() {
            let layout = &self.shared.layout;
            self.raider
                .droppable
                .retain(|a| !frees.contains(&layout.split(*a).0));
        }
        let mut alloc = self.shared.lock_alloc();
        for b in frees {
            let (dev, _) = self.shared.layout.locate(b);
            self.blocks.remove(&b);
            alloc.release(dev, b);
            self.counters.defrag_freed_blocks += 1;
        }
        Ok(())
    }

    // ---- large values ------------------------------------------------------------------

    /// Writes a value too big for a log block: one extent block per fragment, made durable,
    /// then a root record (listing the fragments) in the log.
    fn put_large(
        &mut self,
        db: Db,
        key: &[u8],
        kind: ValueKind,
        bytes: &[u8],
        expire: u64,
    ) -> Result<(Address, usize), StorageError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut frags: Vec<(BlockId, Address)> = Vec::new();
        for piece in bytes.chunks(self.fragment_payload_max()) {
            match self.write_extent(db, piece, seq) {
                Ok(f) => frags.push(f),
                Err(e) => {
                    for (b, _) in frags {
                        self.retire(b);
                    }
                    return Err(e);
                }
            }
        }
        // Barrier: the fragments are durable before any root can point at them.
        if let Err(e) = self.sync_dirty() {
            for (b, _) in frags {
                self.retire(b);
            }
            return Err(e);
        }
        let mut root = Vec::with_capacity(ROOT_HEADER_BYTES + frags.len() * ROOT_ENTRY_BYTES);
        root.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        root.extend_from_slice(&(frags.len() as u32).to_le_bytes());
        // The whole value's checksum (root offset 12, once reserved): each fragment's
        // record CRC only proves the fragment is intact, not that it is the one this root
        // wrote (docs/storage.md, "Large values: crash and reuse").
        root.extend_from_slice(&value_crc_field(bytes).to_le_bytes());
        root.extend_from_slice(&seq.to_le_bytes());
        for (_, a) in &frags {
            root.extend_from_slice(&a.0.to_le_bytes());
        }
        let appended = self.append(
            RecordType::Put,
            FLAG_LARGE,
            kind.to_u8(),
            db,
            key,
            &root,
            expire,
            Some(seq),
            false,
        );
        let (addr, _) = match appended {
            Ok(x) => x,
            Err(e) => {
                for (b, _) in frags {
                    self.retire(b);
                }
                return Err(e);
            }
        };
        for (b, _) in frags {
            if let Some(info) = self.blocks.get_mut(&b) {
                info.live_bytes[db as usize] = info.used_bytes;
            }
        }
        Ok((addr, self.appended_len(key.len(), root.len())))
    }

    fn write_extent(
        &mut self,
        db: Db,
        piece: &[u8],
        seq: u64,
    ) -> Result<(BlockId, Address), StorageError> {
        self.check_broken()?;
        super::prefetch::restartable_write()?;
        let (block, block_seq) = self
            .shared
            .alloc_block(false)
            .ok_or(StorageError::DeviceFull)?;
        let payload = BlockHeaderPayload {
            store_uuid: self.shared.layout.store_uuid,
            block_seq,
            shard_id: self.id,
            block_kind: BLOCK_KIND_EXTENT,
            global_block: block.0,
        }
        .encode();
        let total = align_up(
            record_len(0, payload.len()) + record_len(0, piece.len()) + MARKER_RECORD_BYTES,
        );
        let mut buf = AlignedBuf::new_zeroed(total);
        let out = buf.as_mut_slice();
        let hdr = header_record(RecordType::BlockHeader, 0, seq, payload.len());
        let mut pos = encode_record(out, block_seq, hdr, &[], &payload);
        let frag_off = pos;
        let mut fh = header_record(RecordType::Fragment, db, seq, piece.len());
        fh.db = db;
        pos += encode_record(&mut out[pos..], block_seq, fh, &[], piece);
        let marker = MarkerPayload {
            chunk_start: 0,
            chunk_crc: crc32c::crc32c(&out[..pos]),
            block_seq,
            flush_watermarks: self.watermarks,
            decided_below: self.shared.groups.decided_below(),
        }
        .encode();
        let mh = header_record(RecordType::Marker, 0, seq, marker.len());
        encode_record(&mut out[pos..], block_seq, mh, &[], &marker);
        let (dev, base) = self.shared.layout.locate(block);
        let mut info = BlockInfo::new(block_seq, BLOCK_KIND_EXTENT, true);
        info.used_bytes = total as u32;
        self.blocks.insert(block, info);
        if let Err(e) = self.shared.layout.devices[dev].write_at(base, &buf) {
            self.retire(block);
            return Err(e.into());
        }
        self.counters.device_writes += 1;
        self.counters.device_write_bytes += total as u64;
        self.dirty_devices[dev] = true;
        Ok((block, self.shared.layout.address(block, frag_off)))
    }

    // ---- background: expiry and defrag -------------------------------------------------

    /// Active expiry inside `background`: one key per unit of `work`.
    fn active_expiry(&mut self, now_ms: u64, work: &mut u64) -> Result<(), StorageError> {
        while *work > 0 && self.expiry_earliest_ms <= now_ms {
            let max = (*work).min(EXPIRY_BATCH_ENTRIES as u64) as usize;
            let n = self.expire_batch(now_ms, max)?;
            *work = work.saturating_sub(n as u64);
        }
        Ok(())
    }

    /// Active expiry with a time budget, for the worker's expiry share of a loop round
    /// (`docs/storage.md` "Active expiry"): batches of due entries until none is due or
    /// `budget_us` has passed (checked after each batch, so at least one batch runs).
    /// Returns the entries handled (expired keys and stale entries).
    pub fn expire_due(&mut self, now_ms: u64, budget_us: u64) -> Result<u64, StorageError> {
        if self.expiry_earliest_ms > now_ms {
            return Ok(0);
        }
        self.last_now_ms = now_ms;
        // Pending blind writes need no settling first: a due `prev` is settled from the
        // record expiry reads (`expire_record`), a due `R` when it is removed
        // (`remove_found`); see docs/index.md "Blind overwrites".
        let started = std::time::Instant::now();
        let mut handled = 0;
        while self.expiry_earliest_ms <= now_ms {
            handled += self.expire_batch(now_ms, EXPIRY_BATCH_ENTRIES)? as u64;
            if started.elapsed().as_micros() as u64 >= budget_us {
                break;
            }
        }
        Ok(handled)
    }

    /// Takes up to `max` due entries from the next db (round robin) that has any and
    /// expires what is still current, reading the records of a run that share a block
    /// with one device read. When no db has a due entry, makes `expiry_earliest_ms`
    /// exact. Returns the entries taken (0: nothing was due).
    fn expire_batch(&mut self, now_ms: u64, max: usize) -> Result<usize, StorageError> {
        let mut due = Vec::new();
        for _ in 0..DB_COUNT {
            let d = self.expiry_cursor_db;
            let n = self.expiry[d].pop_due(now_ms, max, &mut due);
            if n == 0 {
                self.expiry_cursor_db = (d + 1) % DB_COUNT;
                continue;
            }
            self.expire_entries(d as Db, &mut due, now_ms)?;
            return Ok(n);
        }
        // Nothing is due in any db: the earliest entry is the next time to look.
        self.expiry_earliest_ms = self
            .expiry
            .iter()
            .filter_map(|e| e.first().map(|(at, _)| at))
            .min()
            .unwrap_or(u64::MAX);
        Ok(0)
    }

    /// Expires the current records among `due` (entries just taken from db `db`'s set), in
    /// address order: consecutive entries of one sealed block no more than
    /// [`EXPIRY_GAP_MAX_BYTES`] apart and within [`EXPIRY_SPAN_MAX_BYTES`] form a span whose
    /// records not in the record cache are read with one device read. On an error the
    /// entries not yet handled go back to the set (the failing one is dropped, as with one
    /// read per entry).
    fn expire_entries(
        &mut self,
        db: Db,
        due: &mut [(u64, Address)],
        now_ms: u64,
    ) -> Result<(), StorageError> {
        due.sort_unstable_by_key(|&(_, a)| a.0);
        let mut handled = vec![false; due.len()];
        let mut i = 0;
        while i < due.len() {
            let (block, first) = self.shared.layout.split(due[i].1);
            let mut prev = first;
            let mut j = i + 1;
            while j < due.len() {
                let (b, off) = self.shared.layout.split(due[j].1);
                if b != block
                    || off - prev > EXPIRY_GAP_MAX_BYTES
                    || off - first > EXPIRY_SPAN_MAX_BYTES
                {
                    break;
                }
                prev = off;
                j += 1;
            }
            if let Err(e) = self.expire_span(db, &due[i..j], &mut handled[i..j], now_ms) {
                for (k, &(at, addr)) in due.iter().enumerate() {
                    if !handled[k] {
                        self.expiry[db as usize].insert(at, addr);
                    }
                }
                return Err(e);
            }
            i = j;
        }
        Ok(())
    }

    /// Expires the current records of `span` (address-ordered entries of one block, see
    /// `expire_entries`), marking each in `handled` before it is tried.
    fn expire_span(
        &mut self,
        db: Db,
        span: &[(u64, Address)],
        handled: &mut [bool],
        now_ms: u64,
    ) -> Result<(), StorageError> {
        let (block, _) = self.shared.layout.split(span[0].1);
        let Some(info) = self.blocks.get(&block) else {
            handled.fill(true);
            return Ok(()); // freed: every entry is stale
        };
        if info.retiring {
            handled.fill(true);
            return Ok(());
        }
        let block_seq = info.block_seq;
        let in_open = self.open.as_ref().is_some_and(|o| o.block == block);
        // Entries whose record is in RAM (staging, cache) or that stand alone: one by one.
        let mut missing = Vec::new();
        for (k, &(_, addr)) in span.iter().enumerate() {
            if span.len() == 1
                || in_open
                || !self.moved.is_empty()
                || self.cache.contains(addr, block_seq)
            {
                handled[k] = true;
                self.expire_if_current(db, addr, now_ms)?;
            } else {
                missing.push(k);
            }
        }
        if let [k] = missing[..] {
            handled[k] = true;
            return self.expire_if_current(db, span[k].1, now_ms);
        }
        let (Some(&k0), Some(&k1)) = (missing.first(), missing.last()) else {
            return Ok(());
        };
        let (_, first) = self.shared.layout.split(span[k0].1);
        let (_, last) = self.shared.layout.split(span[k1].1);
        let bs = self.block_size();
        let aligned = first & !(CHUNK_ALIGN_BYTES as usize - 1);
        let end = align_up(last + READ_WINDOW_BYTES).min(bs);
        let (dev, base) = self.shared.layout.locate(block);
        let mut buf = AlignedBuf::new_zeroed(end - aligned);
        self.shared.layout.devices[dev].read_at(base + aligned as u64, &mut buf)?;
        self.counters.sync_reads += 1;
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += (end - aligned) as u64;
        self.counters.expiry_span_reads += 1;
        for k in missing {
            handled[k] = true;
            let addr = span[k].1;
            let (_, off) = self.shared.layout.split(addr);
            let bytes = &buf.as_slice()[off - aligned..];
            let Some(h) = RecordHeader::decode(bytes) else {
                continue; // no record here: the entry is stale (as a read would find)
            };
            if h.record_len() > bytes.len() {
                // Longer than the window read after the span's last record: alone.
                self.expire_if_current(db, addr, now_ms)?;
                continue;
            }
            let Some(r) = decode_record(&bytes[..h.record_len()], block_seq) else {
                continue; // fails its check: not a current record
            };
            let rec = OwnedRecord {
                header: r.header,
                key: r.key.to_vec(),
                value: r.value.to_vec(),
            };
            self.expire_record(db, addr, rec, now_ms)?;
        }
        Ok(())
    }

    /// Expires the record at `addr` if it is still the current, expired record of its key.
    /// Stale entries (overwritten, relocated, freed) are recognised and ignored.
    fn expire_if_current(
        &mut self,
        db: Db,
        addr: Address,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        let (block, _) = self.shared.layout.split(addr);
        if self.blocks.get(&block).is_none_or(|i| i.retiring) {
            return Ok(());
        }
        let rec = match self.read_record(addr) {
            Ok(r) => r,
            Err(StorageError::Corrupt(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.expire_record(db, addr, rec, now_ms)
    }

    /// Expires `rec`, read from `addr`, if it is the current, expired record of its key.
    fn expire_record(
        &mut self,
        db: Db,
        addr: Address,
        rec: OwnedRecord,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        if rec.header.record_type != RecordType::Put
            || rec.header.db != db
            || !is_expired(&rec.header, now_ms)
        {
            return Ok(());
        }
        if let Some(&r) = self.blind_prevs.get(&addr.0) {
            // A pending blind write's `prev`: settle it with the record just read.
            self.settle_with(Address(r), Some(&rec.header), &rec.key.clone(), Some(&rec))?;
        }
        let h = self.hash(db, &rec.key);
        if !self.indexes[db as usize].candidates(h).any(|a| a == addr) {
            return Ok(());
        }
        self.expire_lazily(db, h, Found { addr, rec })
    }

    /// One bounded defrag step. Starting a job picks the sealed log block with the lowest
    /// kept ratio under the threshold and either retires it at once (nothing live, no
    /// tombstones) or reads it and lists its records; each step then relocates what still
    /// matters, at most one record per unit of `work`, and the last step retires the block.
    fn defrag_step(&mut self, work: &mut u64) -> Result<(), StorageError> {
        self.in_defrag = true;
        let r = self.defrag_step_inner(work);
        self.in_defrag = false;
        r
    }

    fn defrag_step_inner(&mut self, work: &mut u64) -> Result<(), StorageError> {
        let job = match self.defrag_job.take() {
            Some(job) => job,
            None => match self.start_defrag_job()? {
                Some(job) => {
                    *work = work.saturating_sub(DEFRAG_BLOCK_READ_WORK);
                    job
                }
                None => return Ok(()),
            },
        };
        match self.run_defrag_job(job, work) {
            Ok(()) | Err(StorageError::DeviceFull) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn start_defrag_job(&mut self) -> Result<Option<DefragJob>, StorageError> {
        let open_block = self.open.as_ref().map(|o| o.block);
        if self
            .defrag_idle
            .is_some_and(|idle| idle.open_block == open_block)
        {
            return Ok(None);
        }
        // Every device already runs its share of defrag jobs: no scan (with many blocks
        // and shards, scanning every round only to be refused costs more than the work).
        let max = self.defrag_max_active_per_device;
        if max != 0
            && self
                .shared
                .defrag_active
                .iter()
                .all(|a| a.load(std::sync::atomic::Ordering::Relaxed) >= max)
        {
            return Ok(None);
        }
        let pct = u64::from(self.defrag_live_percent_max);
        let pick = self
            .blocks
            .iter()
            .filter(|(b, i)| Some(**b) != open_block && Self::defrag_candidate(i, pct))
            .min_by_key(|(b, i)| {
                (
                    i.kept_bytes() * 1000 / u64::from(i.used_bytes.max(1)),
                    i.block_seq,
                    b.0,
                )
            })
            .map(|(b, i)| (*b, i.clone()));
        let Some((block, info)) = pick else {
            self.defrag_idle = Some(DefragIdle { open_block });
            return Ok(None);
        };
        self.defrag_idle = None;
        if info.live_total() == 0 && !info.has_tombs {
            self.retire(block);
            return Ok(None);
        }
        let bs = self.block_size();
        let (dev, base) = self.shared.layout.locate(block);
        let Some(active) = DefragSlot::take(&self.shared, dev, self.defrag_max_active_per_device)
        else {
            return Ok(None); // the device has its share of defrag jobs; try later
        };
        let mut image = AlignedBuf::new_zeroed(bs);
        self.shared.layout.devices[dev].read_at(base, &mut image)?;
        self.counters.device_reads += 1;
        self.counters.device_read_bytes += bs as u64;
        // Pending blind writes over records of this block settle from the image (no read).
        self.settle_block_from(block, info.block_seq, &image.as_slice()[..bs], 0)?;
        if !self.releases.is_empty() {
            return Ok(None); // a paged root was released: its pages stay until read
        }
        let mut records = Vec::new();
        let mut pos = 0;
        while pos < info.used_bytes as usize {
            let Some(chunk) = super::recovery::parse_chunk(image.as_slice(), pos, info.block_seq)
            else {
                break;
            };
            records.extend(chunk.records.iter().map(|&(off, _)| off));
            pos = align_up(chunk.end);
        }
        Ok(Some(DefragJob {
            _active: active,
            block,
            block_seq: info.block_seq,
            image,
            records,
            next: 0,
            parsed_all: pos >= info.used_bytes as usize,
        }))
    }

    fn run_defrag_job(&mut self, mut job: DefragJob, work: &mut u64) -> Result<(), StorageError> {
        if self.blocks.get(&job.block).is_none_or(|i| i.retiring) {
            return Ok(());
        }
        let older_log_block_exists = self.blocks.iter().any(|(b, i)| {
            *b != job.block && i.kind == BLOCK_KIND_LOG && i.block_seq < job.block_seq
        });
        while job.next < job.records.len() {
            let resting = self.defrag_record_sleep_us > 0
                && self
                    .defrag_next_record
                    .is_some_and(|t| std::time::Instant::now() < t);
            if *work == 0 || resting {
                self.defrag_job = Some(job);
                return Ok(());
            }
            *work -= 1;
            let off = job.records[job.next];
            job.next += 1;
            let moved_before = self.counters.defrag_relocated_records;
            if !self.relocate_record(&job, off, older_log_block_exists)? {
                // An undecided group's record: drop the job, the block stays (retried later).
                return Ok(());
            }
            let moved = self.counters.defrag_relocated_records > moved_before;
            if moved && self.defrag_record_sleep_us > 0 {
                self.defrag_next_record = Some(
                    std::time::Instant::now()
                        + std::time::Duration::from_micros(self.defrag_record_sleep_us),
                );
            }
        }
        let live_left = self.blocks.get(&job.block).map_or(0, |i| i.live_total());
        if !job.parsed_all || live_left != 0 {
            tracing::warn!(
                shard = self.id,
                block = job.block.0,
                "defrag could not read all of a block; leaving it in place"
            );
            if let Some(i) = self.blocks.get_mut(&job.block) {
                i.no_defrag = true;
            }
            return Ok(());
        }
        self.retire(job.block);
        Ok(())
    }

    /// Copies one record of a block being defragged forward if it still matters: a put that
    /// is its key's current record, or a tombstone that may still shadow an older record.
    /// A GROUPED record of a decided group is copied plain (same sequence number). `false`:
    /// the record belongs to a group not decided yet, so the block must stay.
    fn relocate_record(
        &mut self,
        job: &DefragJob,
        off: usize,
        older_log_block_exists: bool,
    ) -> Result<bool, StorageError> {
        let rec =
            decode_record(&job.image.as_slice()[off..], job.block_seq).expect("parsed before");
        let hdr = rec.header;
        let addr = self.shared.layout.address(job.block, off);
        if rec
            .group
            .is_some_and(|g| g >= self.shared.groups.decided_below())
        {
            // Its group is not decided (only after a failed settle): a plain copy could
            // outlive the group's other parts. The block stays until the group is decided.
            return Ok(false);
        }
        match hdr.record_type {
            RecordType::Put => {
                if let Some(&r) = self.blind_prevs.get(&addr.0) {
                    // A pending blind write's `prev`: settled from the image (no read).
                    let full = OwnedRecord {
                        header: hdr,
                        key: rec.key.to_vec(),
                        value: rec.value.to_vec(),
                    };
                    self.settle_with(Address(r), Some(&hdr), rec.key, Some(&full))?;
                    if !self.releases.is_empty() {
                        // It released a paged root: its pages must stay until read.
                        return Ok(false);
                    }
                }
                let h = self.hash(hdr.db, rec.key);
                if !self.indexes[hdr.db as usize]
                    .candidates(h)
                    .any(|a| a == addr)
                {
                    return Ok(true);
                }
                let (new, _) = self.append(
                    RecordType::Put,
                    hdr.flags,
                    hdr.value_kind,
                    hdr.db,
                    rec.key,
                    rec.value,
                    hdr.expire_at_ms,
                    Some(hdr.seq),
                    true,
                )?;
                let replaced = self.indexes[hdr.db as usize].replace(h, addr, new);
                assert!(replaced, "index lost an entry it just returned");
                self.blind_move(addr, new);
                let len = hdr.record_len() as u32;
                // The copy is plain: no group id.
                let copy_len = len - hdr.group_id_len() as u32;
                let (nb, _) = self.shared.layout.split(new);
                if let Some(i) = self.blocks.get_mut(&nb) {
                    i.live_bytes[hdr.db as usize] += copy_len;
                }
                self.unaccount(hdr.db, addr, len as usize);
                self.expiry_remove(hdr.db, hdr.expire_at_ms, addr);
                self.expiry_add(hdr.db, hdr.expire_at_ms, new);
                self.counters.defrag_relocated_records += 1;
            }
            RecordType::Tombstone => {
                // Not needed: nothing older to shadow, the raider found nothing it shadows,
                // or a newer record of the key exists.
                if !older_log_block_exists
                    || self.raider.droppable.remove(&addr)
                    || self
                        .find(hdr.db, rec.key, self.hash(hdr.db, rec.key))?
                        .is_some()
                {
                    self.raider.tombstones_dropped += 1;
                    return Ok(true);
                }
                let (new, _) = self.append(
                    RecordType::Tombstone,
                    0,
                    0,
                    hdr.db,
                    rec.key,
                    &[],
                    0,
                    Some(hdr.seq),
                    true,
                )?;
                let (nb, _) = self.shared.layout.split(new);
                if let Some(i) = self.blocks.get_mut(&nb) {
                    i.note_tomb(hdr.record_len() - hdr.group_id_len());
                }
                self.counters.defrag_relocated_records += 1;
            }
            RecordType::Page => {
                // A page still reachable from its collection's current root is copied and
                // the root (and directory page) rewritten to point at the copy (paged.rs).
                let (key, payload) = (rec.key.to_vec(), rec.value.to_vec());
                match super::paged::relocate_page(self, hdr.db, &key, addr, &payload) {
                    Ok(true) => self.counters.defrag_relocated_records += 1,
                    Ok(false) | Err(StorageError::DeviceFull) => {}
                    Err(e) => return Err(e),
                }
            }
            _ => {}
        }
        Ok(true)
    }
}

fn header_record(record_type: RecordType, db: Db, seq: u64, value_len: usize) -> RecordHeader {
    RecordHeader {
        record_type,
        flags: 0,
        value_kind: 0,
        db,
        key_len: 0,
        value_len: value_len as u32,
        crc: 0,
        seq,
        expire_at_ms: 0,
    }
}

/// Parses a large value's root payload: (total length, fragments' seq, fragment addresses).
/// What a LARGE root stores at offset 12: the CRC32C of the whole value, with 0 (the
/// field's value in roots written before it existed, meaning "not recorded") stored as
/// `u32::MAX`, so every value written now is checked.
fn value_crc_field(value: &[u8]) -> u32 {
    match crc32c::crc32c(value) {
        0 => u32::MAX,
        c => c,
    }
}

/// The value checksum field of a root payload (0: not recorded, or a payload too short,
/// which `parse_root` reports).
fn root_value_crc_field(payload: &[u8]) -> u32 {
    payload
        .get(12..16)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

pub(crate) fn parse_root(payload: &[u8]) -> Result<(u64, u64, Vec<Address>), StorageError> {
    let bad = || StorageError::Corrupt("malformed large-value root".into());
    if payload.len() < ROOT_HEADER_BYTES {
        return Err(bad());
    }
    let total = u64::from_le_bytes(payload[0..8].try_into().map_err(|_| bad())?);
    let count = u32::from_le_bytes(payload[8..12].try_into().map_err(|_| bad())?) as usize;
    let frag_seq = u64::from_le_bytes(payload[16..24].try_into().map_err(|_| bad())?);
    if payload.len() != ROOT_HEADER_BYTES + count * ROOT_ENTRY_BYTES {
        return Err(bad());
    }
    let addrs = payload[ROOT_HEADER_BYTES..]
        .chunks_exact(ROOT_ENTRY_BYTES)
        .map(|c| Address(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
        .collect();
    Ok((total, frag_seq, addrs))
}

/// Where the record at `a` is after the moves in `moved` (old address, new address).
fn resolve_moved(moved: &[(Address, Address)], mut a: Address) -> Address {
    while let Some(&(_, new)) = moved.iter().find(|(old, _)| *old == a) {
        a = new;
    }
    a
}
