//! The storage engine: a compact key index in RAM, values in log-structured blocks on the
//! devices, explicit durability, recovery.
//!
//! What it owns. A store is one or more devices sharing a label (store UUID, block size,
//! shard count). Each device is cut into large blocks (1 MiB by default) handed out by one
//! shared allocator (a mutex taken once per block, never per request). The keyspace is split
//! into shards (`key_slot % shard_count`); a `Shard` is owned by exactly one worker thread and
//! holds that slice's per-db indexes, its one open block (the staging buffer), its counters
//! and its per-db expiry sets. Records are appended to the open block and written out in chunks,
//! each closed by a commit marker carrying the chunk's CRC32C; `docs/storage-format.md`
//! specifies every byte and the crash argument.
//!
//! Invariants.
//! - The index never holds keys: each entry is (hash of db+key → record address) and every
//!   lookup reads the record and compares db and key, so a hash collision can cost a read but
//!   never returns, overwrites or deletes the wrong key.
//! - Recovery trusts only chunks whose marker checks out, and newest sequence number wins.
//! - Sequence numbers grow by one per write within a shard; a relocated record keeps its own.
//! - A block is only reused after it was zeroed and the zeroing was made durable, and only
//!   after whatever superseded its contents was made durable.
//!
//! - Extents (large-value fragments) are durable before the root that lists them; checkpoint
//!   blocks never hold data and a checkpoint is used at most once.
//!
//! Files: `format` (bytes), `alloc` (layout, allocator, metadata), `shard` (operations,
//! append stream, flush, defrag), `recovery` (open, scan), `checkpoint`, `tombraider`,
//! `group` (crash atomicity of multi-shard writes: group ids, write scopes, the recovery
//! decision; `docs/atomic-writes.md`), `hash`, `index` (stand-in for the compact index).
//!
//! Reads that do not block: `prefetch` plans the device reads a command needs and checks
//! what the caller's ring brought back; `cache` keeps recently read records by address.
//!
//! Deliberately missing (see `docs/storage.md`): an index-native checkpoint dump (the
//! current one re-reads live blocks at shutdown), and paged collections: hashes and sets
//! are stored as one record per collection (value kinds 1 and 2, encoded by `collection`;
//! lists kind 3, encoded by `list_codec`);
//! `docs/collections.md` designs the root + pages layer.
use crate::device::{BlockDevice, DeviceError, FileDevice};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

mod alloc;
mod cache;
pub mod check;
mod checkpoint;
pub mod collection;
pub mod expiry;
pub mod format;
mod group;
pub mod grow;
mod hash;
pub mod index;
pub mod list_codec;
pub mod paged;
pub mod paged_list;
pub mod paged_zset;
pub mod prefetch;
mod recovery;
mod shard;
mod tombraider;
pub mod watch;
pub mod zset;

pub use group::WriteGroups;
pub use grow::{GrowthConfig, GrowthStatus};
pub use hash::{key_hash, key_slot, shard_of_slot};
pub use shard::{ChunkIo, DefragStatus, Shard, ShardStats};
pub use tombraider::{TombRaiderPhase, TombRaiderStatus};

pub type Db = u8;

/// Redis `appendfsync` vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    Always,
    EverySec,
    No,
}

impl FsyncPolicy {
    /// The name `CONFIG GET appendfsync` reports.
    pub fn as_str(&self) -> &'static str {
        match self {
            FsyncPolicy::Always => "always",
            FsyncPolicy::EverySec => "everysec",
            FsyncPolicy::No => "no",
        }
    }
}

/// What a record's value is, carried in the record header's value-kind byte
/// (`docs/storage-format.md` 4.1). The engine stores every kind the same way (inline or as
/// a LARGE root over fragments); only the commands interpret the bytes. A collection's
/// value is the encoding of `collection` (one record per collection in stage 1 of
/// `docs/collections.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    String,
    Hash,
    Set,
    /// A sorted set (`zset::ZSetValue`); kind 3 is the list's.
    ZSet,
    List,
}

impl ValueKind {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            ValueKind::String => 0,
            ValueKind::Hash => 1,
            ValueKind::Set => 2,
            ValueKind::ZSet => 4,
            ValueKind::List => 3,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<ValueKind> {
        match v {
            0 => Some(ValueKind::String),
            1 => Some(ValueKind::Hash),
            2 => Some(ValueKind::Set),
            4 => Some(ValueKind::ZSet),
            3 => Some(ValueKind::List),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub data_files: Vec<PathBuf>,
    /// Size given to a data file we create (default 1 GiB); its first size when it grows.
    pub create_size_bytes: u64,
    /// Grow a store of one regular file with the data (`None` = fixed size).
    pub growth: Option<GrowthConfig>,
    /// Used only when formatting a fresh store.
    pub shard_count: u32,
    pub fsync: FsyncPolicy,
    /// Everysec window (default 100).
    pub flush_max_ms: u64,
    /// Per shard; flush early when reached. Capped at the block size.
    pub staging_limit_bytes: u64,
    pub direct_io: bool,
    /// 0 = off.
    pub tomb_raider_interval_ms: u64,
    pub defrag_paused: bool,
    /// Used only when formatting a fresh store: a power of two in 64 KiB..=16 MiB.
    pub block_size_bytes: u32,
    /// Least time between two defrag steps of a shard (`--defrag-sleep-ms`), 0 = every round.
    pub defrag_sleep_ms: u64,
    /// Defrag relocates blocks whose live bytes are below this percentage of their used bytes.
    pub defrag_live_percent_max: u32,
    /// Blocks being defragged at once per device, across all shards (0 = no limit).
    pub defrag_max_active_per_device: u32,
    /// Least time between two relocated records of a shard (`--defrag-record-sleep-us`).
    pub defrag_record_sleep_us: u64,
    /// Record cache budget of each shard (the server divides `--cache-size`); 0 = off.
    pub cache_capacity_bytes: usize,
    /// Updated while `open` recovers, for `INFO` loading fields (read it from another thread).
    pub recovery_progress: Option<Arc<RecoveryProgress>>,
    /// Test hook: the index hash is ANDed with this (0 forces every key to collide).
    #[doc(hidden)]
    pub debug_hash_mask: u64,
    /// Blind overwrites (`docs/index.md`, "Blind overwrites"): a plain SET of a key whose
    /// index position holds one record not in memory replaces it without reading it first;
    /// whether it was the same key is settled later. On by default.
    pub blind_writes: bool,
    /// A paged collection's root listing more directory pages than this is stored as a
    /// version-2 root (base page + change list, `docs/collections.md` section 3a).
    pub paged_base_min_dirs: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            data_files: vec![PathBuf::from("lavik.data")],
            create_size_bytes: 1 << 30,
            growth: None,
            shard_count: 1,
            fsync: FsyncPolicy::EverySec,
            flush_max_ms: 100,
            staging_limit_bytes: 1 << 20,
            direct_io: true,
            tomb_raider_interval_ms: 24 * 3600 * 1000,
            defrag_paused: false,
            block_size_bytes: 1 << 20,
            defrag_live_percent_max: 50,
            defrag_sleep_ms: 0,
            defrag_max_active_per_device: 1,
            defrag_record_sleep_us: 0,
            cache_capacity_bytes: 0,
            recovery_progress: None,
            debug_hash_mask: u64::MAX,
            blind_writes: true,
            paged_base_min_dirs: paged::BASE_MIN_DIRS,
        }
    }
}

/// Recovery progress counters, shared with whoever reports `-LOADING` / `INFO` loading.
#[derive(Debug, Default)]
pub struct RecoveryProgress {
    /// Blocks holding data, known after the first pass over block headers.
    pub blocks_total: AtomicU64,
    pub blocks_done: AtomicU64,
    pub bytes_done: AtomicU64,
    /// The store's shard count, set (non-zero) as soon as the labels are read, so a
    /// server can route and listen while the rest of recovery runs.
    pub shard_count: AtomicU32,
    pub block_size_bytes: AtomicU64,
}

pub struct OpenedStore {
    pub shards: Vec<Shard>,
    pub info: StoreInfo,
}

#[derive(Clone, Debug, Default)]
pub struct StoreInfo {
    pub shard_count: u32,
    pub recovered_keys: u64,
    pub recovery_ms: u64,
    /// True when the devices were blank and have just been formatted.
    pub formatted: bool,
    /// What the metadata slot said about the previous shutdown.
    pub last_shutdown_clean: bool,
    pub block_size_bytes: u32,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub devices: Vec<String>,
    /// Chunks whose marker did not check out at the tail of a block (torn last writes).
    pub torn_chunks: u64,
    /// Damaged chunks skipped in the middle of a block (data after them was still used).
    pub corrupt_chunks: u64,
    /// The index came from the checkpoint of the previous clean shutdown (no scan).
    pub checkpoint_used: bool,
    /// Where the open spent its time, as (name, value) pairs: `lavik_recovery_NAME` in
    /// `INFO persistence` (`docs/storage.md`, "Recovery phases").
    pub phases: Vec<(&'static str, u64)>,
}

/// A value as read back. `bytes` is a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    pub kind: ValueKind,
    pub bytes: Vec<u8>,
    pub expire_at_ms: Option<u64>,
}

/// What `Shard::get_collection` returns: a value as `get` gives it, or a paged
/// collection's root (`paged.rs`), whose pages the caller loads.
pub enum Collection {
    Whole(Value),
    Paged {
        kind: ValueKind,
        root: Vec<u8>,
        expire_at_ms: Option<u64>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
    #[error("device full: no free block left for new data")]
    DeviceFull,
    #[error("value too large: {len_bytes} bytes (maximum {max_bytes})")]
    ValueTooLarge { len_bytes: u64, max_bytes: u64 },
    #[error("key too large: {len_bytes} bytes (maximum {max_bytes})")]
    KeyTooLarge { len_bytes: u64, max_bytes: u64 },
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("refusing to use {0}")]
    ForeignLabel(String),
    #[error("writes refused after a failed device write: {0}")]
    WriteFailed(String),
    #[error("invalid storage configuration: {0}")]
    Config(String),
    /// A restartable command met a record that is not in memory: its read was recorded
    /// and the command runs again once it is done (`prefetch::restartable_begin`). Never
    /// reaches a client: the worker discards the run's reply.
    #[error("record not in memory (the command is run again after its read)")]
    Deferred,
}

// The engine's addresses must fit the index's.
const _: () = assert!(format::ADDRESS_BITS == index::ADDRESS_BITS);

// A shard moves to its worker thread.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Shard>();
};

/// Opens (or creates and formats) the store named by `cfg.data_files`.
pub fn open(cfg: &StoreConfig) -> Result<OpenedStore, StorageError> {
    if cfg.data_files.is_empty() {
        return Err(StorageError::Config("no data file given".into()));
    }
    let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for path in &cfg.data_files {
        let dev = FileDevice::open(path, cfg.direct_io, Some(cfg.create_size_bytes))?;
        devices.push(Arc::new(dev));
    }
    open_on(devices, cfg)
}

/// Opens (or formats, when every device is blank) a store on the given devices.
pub fn open_on(
    devices: Vec<Arc<dyn BlockDevice>>,
    cfg: &StoreConfig,
) -> Result<OpenedStore, StorageError> {
    recovery::open_store(devices, cfg)
}

#[cfg(test)]
mod tests;
