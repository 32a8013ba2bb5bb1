//! Opening a store: label checks or formatting, metadata slots, and recovery — a scan of
//! every committed chunk, per shard in parallel, newest sequence number winning.
use super::alloc::{
    write_meta_slot, Allocator, BlockId, BlockIdHashing, Layout, MetaState, StoreShared,
};
use super::format::{
    decode_record, BlockHeaderPayload, Label, LabelState, MarkerPayload, MetaSlot, RecordHeader,
    RecordType, BLOCK_HEADER_PAYLOAD_BYTES, BLOCK_KIND_CHECKPOINT, BLOCK_KIND_EXTENT,
    BLOCK_SIZE_MAX_BYTES, BLOCK_SIZE_MIN_BYTES, CHUNK_ALIGN_BYTES, DB_COUNT, FLAG_LARGE,
    FORMAT_VERSION, LABEL_OFFSET_BYTES, META_SLOT_OFFSETS_BYTES, RECORD_HEADER_BYTES,
};
use super::format::{label_version, GroupPartPayload, FLAG_GROUPED, FLAG_PAGED, GROUP_ID_BYTES};
use super::group::{complete_groups, ScannedGroups};
use super::index::{Address, Index};
use super::shard::{parse_root, BlockInfo, Shard};
use super::{Db, OpenedStore, RecoveryProgress, StorageError, StoreConfig, StoreInfo};
use crate::device::{AlignedBuf, BlockDevice};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Most shards a store may be formatted with.
const SHARD_COUNT_MAX: u32 = 1024;
/// Blocks each shard may take beyond the free count seen by ordinary writes (deletes, defrag).
const RESERVE_BLOCKS_PER_SHARD: usize = 2;
/// A device counts as blank only if this much of its start is zero (this covers the
/// superblocks of common filesystems and partition tables, e.g. btrfs at 64 KiB).
const BLANK_CHECK_BYTES: u64 = 1 << 20;
/// Recovery logs progress every this many blocks per shard.
const PROGRESS_EVERY_BLOCKS: usize = 1024;
/// Full-scan read-ahead (`docs/storage.md` "Recovery read-ahead"): reader threads per
/// shard being recovered, each reading every `RECOVERY_READERS`-th block of the shard's
/// scan order, so that many whole-block reads are in flight while the recovery thread
/// applies the block before them.
const RECOVERY_READERS: usize = 2;
/// Block buffers per reader (read but not yet applied, or being read).
const RECOVERY_BUFFERS_PER_READER: usize = 2;
/// Records whose index buckets the scan loads together before applying them one by one
/// (`Shard::apply_chunk`): enough misses in flight to cover memory latency, few enough
/// that the buckets are still in cache when their records are applied.
const RECOVERY_PROBE_BATCH: usize = 32;
/// After this many blocks of a shard's scan, its indexes are grown at once to the key
/// count those blocks extrapolate to (`Index::reserve`; `finish_recovery` gives back what
/// an overestimate took, `Index::shrink_to_fit`).
const RECOVERY_SIZE_SAMPLE_BLOCKS: usize = 16;
/// Threads reading pass 1's block headers (one 4 KiB read per block). The reads are
/// latency-bound, not CPU-bound, so this is a queue depth, not a CPU count: a 30 GB file
/// has 30k blocks, and one read at a time took a few seconds of the open.
const HEADER_SCAN_THREADS: usize = 8;

/// CPU time and run-queue wait of the calling thread so far, from
/// `/proc/thread-self/schedstat` (nanoseconds on a CPU, nanoseconds runnable but waiting
/// for one). All zero where the file is missing (a kernel without scheduler statistics).
/// One small file read per thread per phase: cheap enough to stay on.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ThreadClock {
    cpu_ns: u64,
    runq_ns: u64,
}

impl ThreadClock {
    fn now() -> Self {
        let Ok(text) = std::fs::read_to_string("/proc/thread-self/schedstat") else {
            return ThreadClock::default();
        };
        let mut fields = text
            .split_ascii_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0));
        ThreadClock {
            cpu_ns: fields.next().unwrap_or(0),
            runq_ns: fields.next().unwrap_or(0),
        }
    }

    /// What this thread used since `start` (taken on the same thread).
    fn since(start: ThreadClock) -> Self {
        let now = ThreadClock::now();
        ThreadClock {
            cpu_ns: now.cpu_ns.saturating_sub(start.cpu_ns),
            runq_ns: now.runq_ns.saturating_sub(start.runq_ns),
        }
    }

    fn add(&mut self, other: ThreadClock) {
        self.cpu_ns += other.cpu_ns;
        self.runq_ns += other.runq_ns;
    }
}

/// Minor and major page faults of the whole process so far (`/proc/self/stat` fields 10
/// and 12); zero if unreadable.
fn process_faults() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/self/stat") else {
        return (0, 0);
    };
    // The command name (field 2) may hold spaces: count fields after its closing ')'.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_ascii_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (
        f.get(7).copied().unwrap_or(0),
        f.get(9).copied().unwrap_or(0),
    )
}

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

/// Where one shard's pass 2 spent its time (nanoseconds, summed over its threads).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScanTimes {
    /// The applying thread blocked on the readers (no block read and parsed yet).
    apply_wait_ns: u64,
    /// The applying thread applying records (`recover_block`).
    apply_ns: u64,
    /// Readers inside the device read of a whole block.
    read_ns: u64,
    /// Readers finding chunks (`scan_block`: the walk and the chunk CRC).
    parse_ns: u64,
    /// Readers blocked for a free buffer (the applying thread is behind).
    reader_idle_ns: u64,
    /// The readers' CPU time and run-queue wait.
    readers: ThreadClock,
}

impl ScanTimes {
    fn add(&mut self, o: &ScanTimes) {
        self.apply_wait_ns += o.apply_wait_ns;
        self.apply_ns += o.apply_ns;
        self.read_ns += o.read_ns;
        self.parse_ns += o.parse_ns;
        self.reader_idle_ns += o.reader_idle_ns;
        self.readers.add(o.readers);
    }
}

fn elapsed_ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Runs `f` on every (shard, input) pair on at most one thread per CPU, each thread taking
/// whole shards from a shared queue. Returns each shard's result with its id, and the CPU
/// time and run-queue wait of those threads together.
fn on_shard_threads<I: Send, T: Send>(
    work: Vec<(&mut Shard, I)>,
    f: impl Fn(&mut Shard, I) -> T + Sync,
) -> (Vec<(u32, T)>, ThreadClock) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(work.len())
        .max(1);
    let queue = Mutex::new(work);
    let f = &f;
    let queue = &queue;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let clock = ThreadClock::now();
                    let mut out = Vec::new();
                    loop {
                        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                        let Some((shard, input)) = next else {
                            return (out, ThreadClock::since(clock));
                        };
                        let id = shard.id();
                        out.push((id, f(shard, input)));
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut clock = ThreadClock::default();
        for h in handles {
            let (out, c) = h.join().expect("recovery thread panicked");
            all.extend(out);
            clock.add(c);
        }
        (all, clock)
    })
}

/// A chunk that checked out: its records (offset, header), marker and end offset.
pub(crate) struct ParsedChunk {
    pub records: Vec<(usize, RecordHeader)>,
    pub marker: MarkerPayload,
    pub marker_seq: u64,
    pub end: usize,
}

/// Parses the chunk starting at `start` of a block image; `None` unless every record checks
/// out and a marker with this chunk's start, block sequence number and CRC closes it.
pub(crate) fn parse_chunk(block: &[u8], start: usize, block_seq: u64) -> Option<ParsedChunk> {
    walk_chunk(block, start, block_seq, true)
}

/// `parse_chunk` for the full-scan recovery: every byte of the chunk is checked once, by the
/// marker's chunk CRC, instead of once per record and again per chunk (`docs/storage.md`,
/// "Recovery: one CRC pass per chunk"). `None` in exactly the cases a torn or stale chunk
/// gives `None` from `parse_chunk`: the marker must verify (its own CRC seeded with this
/// block use's sequence number), name this start and block sequence number, and carry the
/// CRC of every byte from `start` to it, headers, keys, values and padding included.
pub(crate) fn parse_chunk_once(block: &[u8], start: usize, block_seq: u64) -> Option<ParsedChunk> {
    walk_chunk(block, start, block_seq, false)
}

/// Walks the records from `start` to the chunk's marker by their header lengths;
/// `verify_records` also checks each record's own CRC on the way.
fn walk_chunk(
    block: &[u8],
    start: usize,
    block_seq: u64,
    verify_records: bool,
) -> Option<ParsedChunk> {
    let mut p = start;
    let mut records = Vec::new();
    loop {
        let header = RecordHeader::decode(block.get(p..)?)?;
        let len = header.record_len();
        if block.len() - p < len {
            return None;
        }
        match header.record_type {
            RecordType::Marker => {
                let r = decode_record(&block[p..], block_seq)?;
                let m = MarkerPayload::decode(r.value)?;
                if m.block_seq != block_seq || m.chunk_start as usize != start {
                    return None;
                }
                if crc32c::crc32c(&block[start..p]) != m.chunk_crc {
                    return None;
                }
                return Some(ParsedChunk {
                    records,
                    marker: m,
                    marker_seq: r.header.seq,
                    end: p + len,
                });
            }
            RecordType::BlockHeader if p != 0 => return None,
            _ => {
                if verify_records {
                    decode_record(&block[p..], block_seq)?;
                }
                records.push((p, header));
            }
        }
        p += len;
    }
}

/// Reads and checks the BlockHeader record at the start of a block image.
pub(crate) fn parse_block_header(bytes: &[u8]) -> Option<BlockHeaderPayload> {
    let hdr = RecordHeader::decode(bytes)?;
    if hdr.record_type != RecordType::BlockHeader
        || hdr.value_len as usize != BLOCK_HEADER_PAYLOAD_BYTES
    {
        return None;
    }
    let payload =
        bytes.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + BLOCK_HEADER_PAYLOAD_BYTES)?;
    let p = BlockHeaderPayload::decode(payload)?;
    decode_record(bytes, p.block_seq)?;
    Some(p)
}

fn random_uuid() -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut out).is_ok() {
            return out;
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    out.copy_from_slice(&(nanos ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    out
}

fn format_store(
    devices: &[Arc<dyn BlockDevice>],
    cfg: &StoreConfig,
) -> Result<Vec<Label>, StorageError> {
    let bs = cfg.block_size_bytes;
    if !bs.is_power_of_two() || !(BLOCK_SIZE_MIN_BYTES..=BLOCK_SIZE_MAX_BYTES).contains(&bs) {
        return Err(StorageError::Config(format!(
            "block size {bs} must be a power of two in {BLOCK_SIZE_MIN_BYTES}..={BLOCK_SIZE_MAX_BYTES}"
        )));
    }
    if cfg.shard_count == 0 || cfg.shard_count > SHARD_COUNT_MAX {
        return Err(StorageError::Config(format!(
            "shard count must be 1..={SHARD_COUNT_MAX}"
        )));
    }
    let store_uuid = random_uuid();
    let mut labels = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let capacity_bytes = dev.capacity_bytes();
        let block_count = (capacity_bytes / u64::from(bs)).saturating_sub(1);
        if block_count < 2 {
            return Err(StorageError::Config(format!(
                "{}: {capacity_bytes} bytes is too small for blocks of {bs} bytes",
                dev.describe()
            )));
        }
        let label = Label {
            store_uuid,
            device_index: i as u32,
            device_count: devices.len() as u32,
            shard_count: cfg.shard_count,
            block_size_bytes: bs,
            capacity_bytes,
            block_count,
        };
        let mut buf = AlignedBuf::new_zeroed(CHUNK_ALIGN_BYTES as usize);
        buf.as_mut_slice()[..128].copy_from_slice(&label.encode());
        dev.write_at(LABEL_OFFSET_BYTES, &buf)?;
        dev.sync()?;
        labels.push(label);
    }
    let meta = MetaSlot {
        generation: 1,
        store_uuid,
        clean_shutdown: true,
        checkpoint_id: 0,
    };
    write_meta_slot(&*devices[0], &meta)?;
    tracing::info!(
        devices = devices.len(),
        block_size = bs,
        shards = cfg.shard_count,
        "formatted a new store"
    );
    Ok(labels)
}

/// Devices in store order, their labels, and whether they were just formatted.
type CheckedDevices = (Vec<Arc<dyn BlockDevice>>, Vec<Label>, bool);

/// Reads and classifies every label; formats when all devices are blank. Returns the devices
/// ordered by their index in the store, their labels, and whether we formatted.
fn check_labels(
    devices: Vec<Arc<dyn BlockDevice>>,
    cfg: &StoreConfig,
) -> Result<CheckedDevices, StorageError> {
    let mut states = Vec::new();
    let mut versions = Vec::new();
    for dev in &devices {
        if dev.capacity_bytes() < u64::from(BLOCK_SIZE_MIN_BYTES) {
            return Err(StorageError::Config(format!(
                "{}: device too small",
                dev.describe()
            )));
        }
        let check_len = BLANK_CHECK_BYTES.min(dev.capacity_bytes());
        let mut buf = AlignedBuf::new_zeroed(check_len as usize);
        dev.read_at(0, &mut buf)?;
        let bytes = buf.as_slice();
        let reserved_zero = bytes[CHUNK_ALIGN_BYTES as usize..].iter().all(|&b| b == 0);
        states.push(Label::classify(
            &bytes[..CHUNK_ALIGN_BYTES as usize],
            reserved_zero,
        ));
        versions.push(label_version(bytes));
    }
    for (dev, st) in devices.iter().zip(&states) {
        match st {
            LabelState::Foreign => {
                return Err(StorageError::ForeignLabel(format!(
                "{}: not a lavik data file (unknown data at offset 0); it will not be overwritten",
                dev.describe()
            )))
            }
            LabelState::Damaged(why) => {
                return Err(StorageError::ForeignLabel(format!(
                    "{}: damaged lavik label ({why}); it will not be overwritten",
                    dev.describe()
                )))
            }
            _ => {}
        }
    }
    if states.iter().all(|s| *s == LabelState::Blank) {
        let labels = format_store(&devices, cfg)?;
        return Ok((devices, labels, true));
    }
    let mut slots: Vec<Option<(Arc<dyn BlockDevice>, Label)>> = vec![None; devices.len()];
    let mut first: Option<Label> = None;
    let mut relabel = Vec::new();
    for ((dev, st), version) in devices.into_iter().zip(states).zip(versions) {
        let LabelState::Valid(l) = st else {
            return Err(StorageError::ForeignLabel(format!(
                "{}: blank, but the other data files belong to a store; adding devices is not supported",
                dev.describe()
            )));
        };
        let f = *first.get_or_insert(l);
        let mismatch = l.store_uuid != f.store_uuid
            || l.device_count as usize != slots.len()
            || l.block_size_bytes != f.block_size_bytes
            || l.shard_count != f.shard_count;
        if mismatch {
            return Err(StorageError::ForeignLabel(format!(
                "{}: belongs to a different store or set of data files ({} files labelled, {} given)",
                dev.describe(),
                l.device_count,
                slots.len()
            )));
        }
        if dev.capacity_bytes() < l.capacity_bytes {
            return Err(StorageError::Corrupt(format!(
                "{}: smaller than when it was formatted",
                dev.describe()
            )));
        }
        let slot = &mut slots[l.device_index as usize];
        if slot.is_some() {
            return Err(StorageError::ForeignLabel(format!(
                "{}: device index given twice",
                dev.describe()
            )));
        }
        if version < FORMAT_VERSION {
            relabel.push((dev.clone(), l));
        }
        *slot = Some((dev, l));
    }
    for (dev, l) in relabel {
        // A version-1 store (no groups, 144-byte markers) becomes version 2 before we
        // write anything a version-1 binary would misread; that binary then refuses it.
        let mut buf = AlignedBuf::new_zeroed(CHUNK_ALIGN_BYTES as usize);
        buf.as_mut_slice()[..128].copy_from_slice(&l.encode());
        dev.write_at(LABEL_OFFSET_BYTES, &buf)?;
        dev.sync()?;
        tracing::info!(device = %dev.describe(), "label rewritten as format version {FORMAT_VERSION}");
    }
    let (devs, labels) = slots
        .into_iter()
        .map(|s| s.expect("every index present"))
        .unzip();
    Ok((devs, labels, false))
}

fn read_meta(dev: &dyn BlockDevice, uuid: [u8; 16]) -> Result<Option<MetaSlot>, StorageError> {
    let mut best: Option<MetaSlot> = None;
    for off in META_SLOT_OFFSETS_BYTES {
        let mut buf = AlignedBuf::new_zeroed(CHUNK_ALIGN_BYTES as usize);
        dev.read_at(off, &mut buf)?;
        if let Some(m) = MetaSlot::decode(buf.as_slice()) {
            if m.store_uuid == uuid && best.is_none_or(|b| m.generation > b.generation) {
                best = Some(m);
            }
        }
    }
    Ok(best)
}

/// Opens (or formats) a store and recovers every shard.
pub(crate) fn open_store(
    devices: Vec<Arc<dyn BlockDevice>>,
    cfg: &StoreConfig,
) -> Result<OpenedStore, StorageError> {
    if devices.is_empty() {
        return Err(StorageError::Config("no data file given".into()));
    }
    let started = Instant::now();
    let (devices, mut labels, formatted) = check_labels(devices, cfg)?;
    if let [label] = labels.as_mut_slice() {
        // A one-file store may have grown since it was labelled (`grow`): its blocks are
        // whatever the file holds now. Blocks past the label's count are blank or were
        // written after the growth; either way their headers say which.
        let bs = u64::from(label.block_size_bytes);
        let now = (devices[0].capacity_bytes() / bs).saturating_sub(1);
        label.block_count = label.block_count.max(now);
    }
    let layout = Layout::new(devices, &labels)?;
    let growth = match (&cfg.growth, layout.devices.as_slice()) {
        (Some(g), [dev]) => {
            super::grow::Growth::new(g, &**dev, layout.block_size_bytes, layout.max_blocks)
        }
        _ => None,
    };
    let meta = read_meta(&*layout.devices[0], layout.store_uuid)?;
    if meta.is_none() {
        tracing::warn!("no valid metadata slot; continuing with a full scan");
    }
    let last_shutdown_clean = meta.is_some_and(|m| m.clean_shutdown);
    let shard_count = layout.shard_count;
    if let Some(p) = &cfg.recovery_progress {
        p.block_size_bytes
            .store(u64::from(layout.block_size_bytes), Ordering::Relaxed);
        p.shard_count.store(shard_count, Ordering::SeqCst);
    }
    let device_count = layout.devices.len();
    let shared = Arc::new(StoreShared {
        layout,
        allocator: Mutex::new(Allocator::new(device_count, 1, 0)),
        defrag_active: (0..device_count)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect(),
        meta: Mutex::new(MetaState {
            generation: meta.map_or(0, |m| m.generation),
            open_shards: shard_count,
            checkpoints_written: 0,
        }),
        growth,
        groups: Default::default(),
    });
    shared.write_meta(false, 0)?;

    let mut phases = Phases {
        labels_ns: elapsed_ns(started),
        ..Phases::default()
    };
    let t = Instant::now();
    let (mut per_shard, max_block_seq, header_reads) = scan_block_headers(&shared)?;
    phases.headers_ns = elapsed_ns(t);
    phases.header_reads = header_reads;
    // Checkpoint blocks never hold data: set them aside (they end up free either way).
    let checkpoint_blocks: Vec<Vec<(BlockId, u64, u32)>> = per_shard
        .iter_mut()
        .map(|list| {
            let (ck, data) = list.drain(..).partition(|b| b.2 == BLOCK_KIND_CHECKPOINT);
            *list = data;
            ck
        })
        .collect();
    let new_shards = || -> Vec<Shard> {
        (0..shard_count)
            .map(|i| Shard::new(i, shared.clone(), cfg))
            .collect()
    };
    let checkpoint_id = meta
        .filter(|m| m.clean_shutdown)
        .map_or(0, |m| m.checkpoint_id);
    if checkpoint_id != 0 {
        let t = Instant::now();
        let mut shards = new_shards();
        // Each shard's checkpoint is its own stream: loaded on one thread per CPU.
        let (loaded, clock) = on_shard_threads(
            shards.iter_mut().zip(checkpoint_blocks).collect(),
            |shard, pieces| shard.load_checkpoint(pieces, checkpoint_id),
        );
        phases.checkpoint_ns = elapsed_ns(t);
        phases.threads = clock;
        let mut used: HashSet<BlockId> = HashSet::new();
        let mut complete = true;
        for (_, r) in loaded {
            match r? {
                Some(kept) => used.extend(kept),
                None => complete = false,
            }
        }
        if complete {
            // Every group a clean shutdown left is complete; ids go on after the stream's.
            shared.groups.open();
            let s = shared.clone();
            let t = Instant::now();
            let mut opened = finish_open(
                s,
                shards,
                used,
                max_block_seq,
                formatted,
                last_shutdown_clean,
                started,
                true,
            );
            phases.free_list_ns = elapsed_ns(t);
            phases.total_ns = elapsed_ns(started);
            opened.info.phases = phases.log("checkpoint");
            return Ok(opened);
        }
        tracing::warn!("index checkpoint missing or damaged; scanning instead");
    }
    let mut shards = new_shards();
    if let Some(p) = &cfg.recovery_progress {
        let total: usize = per_shard.iter().map(|b| b.len()).sum();
        p.blocks_total.store(total as u64, Ordering::Relaxed);
    }
    let t = Instant::now();
    let faults_before = process_faults();
    let progress = cfg.recovery_progress.as_deref();
    let (results, clock) = on_shard_threads(
        shards.iter_mut().zip(per_shard).collect(),
        |shard, blocks| shard.recover(blocks, progress),
    );
    phases.scan_ns = elapsed_ns(t);
    phases.threads = clock;
    let faults_after = process_faults();
    phases.scan_minor_faults = faults_after.0 - faults_before.0;
    phases.scan_major_faults = faults_after.1 - faults_before.1;
    let mut used: HashSet<BlockId> = HashSet::new();
    let mut pendings: Vec<Option<Pending>> = (0..shard_count).map(|_| None).collect();
    for (id, r) in results {
        let (kept, pending) = r?;
        used.extend(kept);
        pendings[id as usize] = Some(pending);
    }
    let mut pendings: Vec<Pending> = pendings
        .into_iter()
        .map(|p| p.expect("every shard recovered"))
        .collect();
    for p in &pendings {
        phases.scan.add(&p.times);
    }
    phases.readers_per_shard = RECOVERY_READERS;
    phases.read_bytes = u64::from(shared.layout.block_size_bytes);
    // Groups: decided store-wide, then applied per shard (docs/atomic-writes.md, 3).
    let t = Instant::now();
    let scans: Vec<&ScannedGroups> = pendings.iter().map(|p| &p.groups).collect();
    let (complete, d_max) = complete_groups(&scans);
    let max_group = scans.iter().map(|g| g.max_group).max().unwrap_or(0);
    let mut aborted = Vec::with_capacity(shards.len());
    for (shard, pending) in shards.iter_mut().zip(pendings.iter_mut()) {
        aborted.push(shard.apply_groups(pending, &complete)?);
    }
    phases.groups_ns = elapsed_ns(t);
    let scan = ScanStats {
        records: pendings.iter().map(|p| p.records).sum(),
        blocks_read: pendings.iter().map(|p| p.blocks_read).sum(),
        ids_peak_bytes: pendings.iter().map(|p| p.ids_peak_bytes).sum(),
    };
    // Settling (tombstones out of the index, the index shrunk to fit, large and paged
    // roots): per shard, independent, so on one thread per CPU like the scan.
    let t = Instant::now();
    let (finished, _) = on_shard_threads(
        shards.iter_mut().zip(pendings).collect(),
        |shard, pending| {
            // `finish_recovery` drops dead extents from the shard's blocks: they are free.
            let before: Vec<BlockId> = shard.blocks.keys().copied().collect();
            shard.finish_recovery(pending, &mut Vec::new()).map(|()| {
                before
                    .into_iter()
                    .filter(|b| !shard.blocks.contains_key(b))
                    .collect::<Vec<_>>()
            })
        },
    );
    for (_, freed) in finished {
        for b in freed? {
            used.remove(&b);
        }
    }
    phases.finish_ns = elapsed_ns(t);
    shared.groups.start(max_group.max(d_max) + 1, d_max);
    let t = Instant::now();
    let mut opened = finish_open(
        shared.clone(),
        shards,
        used,
        max_block_seq,
        formatted,
        last_shutdown_clean,
        started,
        false,
    );
    phases.free_list_ns = elapsed_ns(t);
    let reads_before_neutralise: u64 = opened.shards.iter().map(|s| s.counters.sync_reads).sum();
    let aborted_records: usize = aborted.iter().map(|a| a.len()).sum();
    let t = Instant::now();
    if aborted_records > 0 {
        tracing::warn!(
            records = aborted_records,
            "writes of incomplete multi-shard groups dropped (a crash caught them in flight)"
        );
        for (shard, list) in opened.shards.iter_mut().zip(&aborted) {
            shard.neutralise(list)?;
        }
        // Every restatement durable before any marker may let decided_below pass them.
        for shard in opened.shards.iter_mut() {
            shard.group_flush_write()?;
        }
        if let Some(s) = opened.shards.first_mut() {
            s.sync_store_devices()?;
        }
    }
    phases.neutralise_ns = elapsed_ns(t);
    scan.log(&opened.shards, started, reads_before_neutralise);
    phases.total_ns = elapsed_ns(started);
    opened.info.phases = phases.log("full scan");
    shared.groups.open();
    Ok(opened)
}

/// Where an open spent its wall time, phase by phase (`docs/storage.md`, "Recovery phases"):
/// logged as "recovery phases" at its end and shown as `lavik_recovery_*` in
/// `INFO persistence`.
#[derive(Default)]
struct Phases {
    /// Labels, metadata slots, layout.
    labels_ns: u64,
    /// Pass 1: the first 4 KiB of every block.
    headers_ns: u64,
    header_reads: u64,
    /// Loading the checkpoint (clean shutdown), all shards.
    checkpoint_ns: u64,
    /// Pass 2 (full scan), all shards.
    scan_ns: u64,
    /// Pass 2 per phase, summed over shards.
    scan: ScanTimes,
    /// CPU time and run-queue wait of the threads applying pass 2 (or loading checkpoints).
    threads: ThreadClock,
    scan_minor_faults: u64,
    scan_major_faults: u64,
    readers_per_shard: usize,
    read_bytes: u64,
    /// GROUPED records of complete groups applied.
    groups_ns: u64,
    /// `finish_recovery`: tombstones out, index shrunk to fit, large and paged roots.
    finish_ns: u64,
    /// The free list (`finish_open`).
    free_list_ns: u64,
    /// Restating aborted multi-shard groups.
    neutralise_ns: u64,
    total_ns: u64,
}

impl Phases {
    /// Logs the phases and returns them as (INFO field name, value) pairs.
    fn log(&self, how: &str) -> Vec<(&'static str, u64)> {
        let s = &self.scan;
        let fields = vec![
            ("total_ms", ms(self.total_ns)),
            ("labels_ms", ms(self.labels_ns)),
            ("headers_ms", ms(self.headers_ns)),
            ("header_reads", self.header_reads),
            ("checkpoint_ms", ms(self.checkpoint_ns)),
            ("scan_ms", ms(self.scan_ns)),
            ("scan_apply_ms", ms(s.apply_ns)),
            ("scan_apply_wait_ms", ms(s.apply_wait_ns)),
            ("scan_read_ms", ms(s.read_ns)),
            ("scan_parse_ms", ms(s.parse_ns)),
            ("scan_reader_idle_ms", ms(s.reader_idle_ns)),
            ("scan_reader_cpu_ms", ms(s.readers.cpu_ns)),
            ("scan_reader_runq_ms", ms(s.readers.runq_ns)),
            ("apply_cpu_ms", ms(self.threads.cpu_ns)),
            ("apply_runq_ms", ms(self.threads.runq_ns)),
            ("scan_minor_faults", self.scan_minor_faults),
            ("scan_major_faults", self.scan_major_faults),
            ("groups_ms", ms(self.groups_ns)),
            ("finish_ms", ms(self.finish_ns)),
            ("free_list_ms", ms(self.free_list_ns)),
            ("neutralise_ms", ms(self.neutralise_ns)),
        ];
        let text: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        tracing::info!(
            how,
            readers_per_shard = self.readers_per_shard,
            read_bytes = self.read_bytes,
            "recovery phases {}",
            text.join(" ")
        );
        fields
    }
}

/// What a full-scan recovery did, for its closing log line.
struct ScanStats {
    records: u64,
    blocks_read: u64,
    /// Sum over shards of each one's largest identity table (an upper bound of the peak).
    ids_peak_bytes: usize,
}

impl ScanStats {
    /// Logs "recovery scan done": records applied, blocks read, random (per-record) reads
    /// up to the end of `finish_recovery` (`random_reads`: per big value only) and those of
    /// restating aborted groups (`aborted_group_reads`: per record a crash caught in a
    /// multi-shard group), device reads and bytes, seconds, records per second. Every device
    /// read of a new shard so far is recovery's: the block reads of the scan are counted in
    /// `device_reads`, the per-record reads in `sync_reads`.
    fn log(&self, shards: &[Shard], started: Instant, random_reads: u64) {
        let secs = started.elapsed().as_secs_f64();
        let all_random: u64 = shards.iter().map(|s| s.counters.sync_reads).sum();
        let device_reads: u64 = shards.iter().map(|s| s.counters.device_reads).sum();
        let read_bytes: u64 = shards.iter().map(|s| s.counters.device_read_bytes).sum();
        tracing::info!(
            records = self.records,
            blocks_read = self.blocks_read,
            random_reads,
            aborted_group_reads = all_random - random_reads,
            device_reads,
            device_read_bytes = read_bytes,
            identity_table_peak_bytes = self.ids_peak_bytes,
            seconds = format!("{secs:.3}"),
            records_per_sec = (self.records as f64 / secs.max(1e-9)) as u64,
            "recovery scan done"
        );
    }
}

/// Builds the free list from the blocks in use and reports.
#[allow(clippy::too_many_arguments)]
fn finish_open(
    shared: Arc<StoreShared>,
    shards: Vec<Shard>,
    used: HashSet<BlockId>,
    max_block_seq: u64,
    formatted: bool,
    last_shutdown_clean: bool,
    started: Instant,
    checkpoint_used: bool,
) -> OpenedStore {
    let shard_count = shared.layout.shard_count;
    let device_count = shared.layout.devices.len();
    let total = shared.layout.total_blocks();
    {
        let mut alloc = shared.lock_alloc();
        *alloc = Allocator::new(
            device_count,
            max_block_seq + 1,
            RESERVE_BLOCKS_PER_SHARD * shard_count as usize,
        );
        // Released in reverse so blocks are handed out from the start of each device.
        for b in (0..total).rev().map(BlockId) {
            if !used.contains(&b) {
                alloc.release(shared.layout.locate(b).0, b);
            }
        }
    }
    let recovered_keys: u64 = shards.iter().map(|s| s.stats().keys).sum();
    let info = StoreInfo {
        shard_count,
        recovered_keys,
        recovery_ms: started.elapsed().as_millis() as u64,
        formatted,
        last_shutdown_clean,
        block_size_bytes: shared.layout.block_size_bytes,
        blocks_total: u64::from(total),
        blocks_free: shared.lock_alloc().free_count() as u64,
        devices: shared.layout.devices.iter().map(|d| d.describe()).collect(),
        torn_chunks: shards.iter().map(|s| s.counters.torn_chunks).sum(),
        corrupt_chunks: shards.iter().map(|s| s.counters.corrupt_chunks).sum(),
        checkpoint_used,
        phases: Vec::new(),
    };
    tracing::info!(
        keys = info.recovered_keys,
        ms = info.recovery_ms,
        torn = info.torn_chunks,
        corrupt = info.corrupt_chunks,
        clean = last_shutdown_clean,
        checkpoint = checkpoint_used,
        "store open"
    );
    OpenedStore { shards, info }
}

/// Pass 1: the first sector of every block says whether it is in use and by which shard.
/// The blocks are read on `HEADER_SCAN_THREADS` threads (block i by thread i mod that), so
/// that many reads are in flight; each shard's list comes out in block order, as one
/// thread reading them in turn would give it. Also returns the highest block sequence
/// number and the reads done.
#[allow(clippy::type_complexity)]
fn scan_block_headers(
    shared: &StoreShared,
) -> Result<(Vec<Vec<(BlockId, u64, u32)>>, u64, u64), StorageError> {
    let layout = &shared.layout;
    let total = layout.total_blocks();
    let threads = HEADER_SCAN_THREADS.min(total as usize).max(1);
    type Found = Vec<(BlockId, u64, u32, u32)>;
    let found: Vec<Result<Found, StorageError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<Found, StorageError> {
                    let mut buf = AlignedBuf::new_zeroed(CHUNK_ALIGN_BYTES as usize);
                    let mut out = Vec::new();
                    for b in (t as u32..total).step_by(threads).map(BlockId) {
                        let (dev, base) = layout.locate(b);
                        layout.devices[dev].read_at(base, &mut buf)?;
                        let Some(p) = parse_block_header(buf.as_slice()) else {
                            continue;
                        };
                        if p.store_uuid != layout.store_uuid || p.global_block != b.0 {
                            continue;
                        }
                        out.push((b, p.block_seq, p.block_kind, p.shard_id));
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("header scan thread panicked"))
            .collect()
    });
    let mut all = Vec::new();
    for f in found {
        all.extend(f?);
    }
    all.sort_unstable_by_key(|x| x.0);
    let mut per_shard = vec![Vec::new(); layout.shard_count as usize];
    let mut max_block_seq = 0;
    for (b, block_seq, kind, shard_id) in all {
        max_block_seq = max_block_seq.max(block_seq);
        match per_shard.get_mut(shard_id as usize) {
            Some(list) => list.push((b, block_seq, kind)),
            None => tracing::warn!(
                block = b.0,
                shard = shard_id,
                "block names a shard this store does not have"
            ),
        }
    }
    Ok((per_shard, max_block_seq, u64::from(total)))
}

/// Recovery-time bookkeeping of one shard.
#[derive(Default)]
pub(crate) struct Pending {
    tombs: Vec<(Db, u64, Address)>,
    roots: Vec<(Db, u64, Address)>,
    max_seq: u64,
    /// Groups seen (records per group, parts, the markers' decided_below).
    groups: ScannedGroups,
    /// GROUPED records, applied after the scan if their group is complete.
    grouped: Vec<GroupedRecord>,
    /// Paged collections (`paged.rs`): the roots indexed and every committed page seen.
    paged: super::paged::RecoveredPages,
    /// Identities of the indexed records: "same key?" without reading the candidate.
    ids: Identities,
    /// Puts and tombstones given to the newest-wins rule (scan and groups).
    pub(crate) records: u64,
    /// Blocks read by the scan.
    pub(crate) blocks_read: u64,
    /// Largest size the identity table reached (bytes).
    pub(crate) ids_peak_bytes: usize,
    /// Where pass 2 spent its time.
    times: ScanTimes,
}

/// A GROUPED put or tombstone found by the scan (not applied yet).
#[derive(Clone, Copy, Debug)]
struct GroupedRecord {
    group: u64,
    db: Db,
    hash: u64,
    addr: Address,
    header: RecordHeader,
    /// Its identity fingerprint (`Identities::fingerprint`).
    fp: u64,
}

/// What recovery needs to know about a record the index points at, without reading it:
/// who it belongs to (a keyed fingerprint) and what `apply_record` asks of an older record.
#[derive(Clone, Copy, Debug)]
struct Ident {
    /// Offset in its block (bits 0..24) and the `IDENT_*` flags.
    off_flags: u32,
    /// Bytes the record occupies (padding and group trailer included).
    len: u32,
    /// Keyed 64-bit hash of (db, key), independent of the index hash.
    fp: u64,
    seq: u64,
    /// The put's expiry time (0 = none). Kept here rather than in a side map keyed by
    /// address: one less hash insert and cache miss per volatile record.
    expire_at_ms: u64,
}

const IDENT_OFFSET_MASK: u32 = (1 << 24) - 1;
/// Superseded: no longer in the index (kept until the block's list is compacted).
const IDENT_DEAD: u32 = 1 << 31;
const IDENT_TOMB: u32 = 1 << 30;
const IDENT_PAGED_ROOT: u32 = 1 << 29;

/// What `apply_record` needs of the record it may supersede.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OldRecord {
    seq: u64,
    is_put: bool,
    is_paged_root: bool,
    len: usize,
    expire_at_ms: u64,
}

/// The block's identities, in offset order.
#[derive(Default)]
struct BlockIdents {
    list: Vec<Ident>,
    dead: usize,
}

/// Recovery's transient side table (docs/storage.md, "Recovery without per-record reads"):
/// for every record the recovering index points at, its identity, keyed by address. Built
/// during the scan, used by the grouped records after it, dropped when recovery ends.
pub(crate) struct Identities {
    /// Per-recovery random key of the fingerprint: nobody can choose keys that collide.
    keys: std::collections::hash_map::RandomState,
    blocks: HashMap<BlockId, BlockIdents, BlockIdHashing>,
}

impl Default for Identities {
    fn default() -> Self {
        Identities {
            keys: std::collections::hash_map::RandomState::new(),
            blocks: HashMap::default(),
        }
    }
}

impl Identities {
    fn fingerprint(&self, db: Db, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.keys.hash_one((db, key))
    }

    /// Records `hdr` at (block, off) as indexed.
    fn add(&mut self, block: BlockId, off: usize, fp: u64, hdr: &RecordHeader) {
        debug_assert!(off as u32 <= IDENT_OFFSET_MASK);
        let mut flags = 0;
        if hdr.record_type == RecordType::Tombstone {
            flags |= IDENT_TOMB;
        } else if super::paged::is_root(hdr.flags) {
            flags |= IDENT_PAGED_ROOT;
        }
        let ident = Ident {
            off_flags: off as u32 | flags,
            len: hdr.record_len() as u32,
            fp,
            seq: hdr.seq,
            expire_at_ms: if hdr.record_type == RecordType::Put {
                hdr.expire_at_ms
            } else {
                0
            },
        };
        let b = self.blocks.entry(block).or_default();
        match b.list.last() {
            Some(last) if last.off_flags & IDENT_OFFSET_MASK >= off as u32 => {
                // Out of order (a grouped record applied after the scan).
                let at = b
                    .list
                    .partition_point(|x| x.off_flags & IDENT_OFFSET_MASK < off as u32);
                b.list.insert(at, ident);
            }
            _ => b.list.push(ident),
        }
    }

    fn position(&self, block: BlockId, off: usize) -> Option<(&BlockIdents, usize)> {
        let b = self.blocks.get(&block)?;
        let at = b
            .list
            .binary_search_by_key(&(off as u32), |x| x.off_flags & IDENT_OFFSET_MASK)
            .ok()?;
        Some((b, at))
    }

    /// The identity of the live record at (block, off), if it is known.
    fn get(&self, block: BlockId, off: usize) -> Option<(u64, OldRecord)> {
        let (b, at) = self.position(block, off)?;
        let x = b.list[at];
        if x.off_flags & IDENT_DEAD != 0 {
            return None;
        }
        let expire_at_ms = x.expire_at_ms;
        Some((
            x.fp,
            OldRecord {
                seq: x.seq,
                is_put: x.off_flags & IDENT_TOMB == 0,
                is_paged_root: x.off_flags & IDENT_PAGED_ROOT != 0,
                len: x.len as usize,
                expire_at_ms,
            },
        ))
    }

    /// The record at (block, off) left the index: forget it (compacting the block's list
    /// once half of it is dead, so the table follows the live records, not the scanned ones).
    fn kill(&mut self, block: BlockId, off: usize) {
        let Some(b) = self.blocks.get_mut(&block) else {
            return;
        };
        let Ok(at) = b
            .list
            .binary_search_by_key(&(off as u32), |x| x.off_flags & IDENT_OFFSET_MASK)
        else {
            return;
        };
        let x = &mut b.list[at];
        if x.off_flags & IDENT_DEAD != 0 {
            return;
        }
        x.off_flags |= IDENT_DEAD;
        b.dead += 1;
        if b.dead * 2 > b.list.len() {
            b.list.retain(|x| x.off_flags & IDENT_DEAD == 0);
            b.dead = 0;
            if b.list.is_empty() {
                self.blocks.remove(&block);
            } else if b.list.capacity() > 2 * b.list.len() {
                b.list.shrink_to_fit();
            }
        }
    }

    /// Gives back the slack of the block just scanned.
    fn seal(&mut self, block: BlockId) {
        if let Some(b) = self.blocks.get_mut(&block) {
            b.list.shrink_to_fit();
        }
    }

    /// RAM held by the table (approximate: allocations' payloads and the maps' slots).
    pub(crate) fn memory_bytes(&self) -> usize {
        let lists: usize = self
            .blocks
            .values()
            .map(|b| b.list.capacity() * std::mem::size_of::<Ident>())
            .sum();
        lists + self.blocks.capacity() * (std::mem::size_of::<(BlockId, BlockIdents)>() + 1)
    }
}

/// The key of a record in a chunk `parse_chunk_once` verified (no second CRC pass).
fn key_in<'a>(bytes: &'a [u8], off: usize, hdr: &RecordHeader) -> &'a [u8] {
    let start = off + RECORD_HEADER_BYTES;
    &bytes[start..start + hdr.key_len as usize]
}

/// The value of a record in a chunk `parse_chunk_once` verified.
fn value_in<'a>(bytes: &'a [u8], off: usize, hdr: &RecordHeader) -> &'a [u8] {
    let start = off + RECORD_HEADER_BYTES + hdr.key_len as usize;
    &bytes[start..start + hdr.value_len as usize]
}

/// The group id trailer of a verified GROUPED record.
fn group_in(bytes: &[u8], off: usize, hdr: &RecordHeader) -> Option<u64> {
    if hdr.flags & FLAG_GROUPED == 0 {
        return None;
    }
    let end = off + hdr.record_len();
    let t = &bytes[end - GROUP_ID_BYTES..end];
    Some(u64::from_le_bytes(t.try_into().expect("8 bytes")))
}

/// What `scan_block` found in one block image: its committed chunks in order, the
/// committed length (0 = the block holds nothing) and the damage met, as (offset, torn):
/// torn = a tail chunk cut short (nothing verifies after it), else a damaged chunk skipped
/// because a later one verifies.
pub(crate) struct BlockScan {
    chunks: Vec<ParsedChunk>,
    used: usize,
    damage: Vec<(usize, bool)>,
}

/// Finds the committed chunks of a block image (pure: no shard state, so the read-ahead
/// threads run it while the recovery thread applies the block before).
pub(crate) fn scan_block(bytes: &[u8], block_seq: u64) -> BlockScan {
    let bs = bytes.len();
    let align = CHUNK_ALIGN_BYTES as usize;
    let mut scan = BlockScan {
        chunks: Vec::new(),
        used: 0,
        damage: Vec::new(),
    };
    let mut pos = 0;
    while pos + RECORD_HEADER_BYTES <= bs {
        if let Some(chunk) = parse_chunk_once(bytes, pos, block_seq) {
            if pos == 0
                && chunk
                    .records
                    .first()
                    .is_none_or(|r| r.1.record_type != RecordType::BlockHeader)
            {
                break;
            }
            pos = chunk.end.next_multiple_of(align);
            scan.used = pos;
            scan.chunks.push(chunk);
            continue;
        }
        if scan.used == 0 {
            break;
        }
        let resync = (pos + align..bs)
            .step_by(align)
            .find(|&s| parse_chunk_once(bytes, s, block_seq).is_some());
        match resync {
            Some(s) => {
                scan.damage.push((pos, false));
                pos = s;
            }
            None => {
                if decode_record(&bytes[pos..], block_seq).is_some() {
                    scan.damage.push((pos, true));
                }
                break;
            }
        }
    }
    scan
}

impl Shard {
    /// Pass 2 for this shard: applies every committed chunk of its blocks in block order.
    /// Returns the blocks that hold committed data (the rest are free).
    pub(crate) fn recover(
        &mut self,
        mut blocks: Vec<(BlockId, u64, u32)>,
        progress: Option<&RecoveryProgress>,
    ) -> Result<(Vec<BlockId>, Pending), StorageError> {
        blocks.sort_by_key(|b| b.1);
        let bs = self.shared.layout.block_size_bytes as usize;
        let mut pending = Pending::default();
        let mut kept = Vec::new();
        let readers = RECOVERY_READERS.min(blocks.len()).max(1);
        let shared = self.shared.clone();
        std::thread::scope(|scope| -> Result<(), StorageError> {
            // Reader r reads blocks r, r + readers, ... into its buffers and hands them over
            // in that order; the loop below takes them round robin, so it sees the scan order.
            let mut full = Vec::with_capacity(readers);
            let mut free = Vec::with_capacity(readers);
            let mut handles = Vec::with_capacity(readers);
            for r in 0..readers {
                let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<
                    Result<(AlignedBuf, BlockScan), StorageError>,
                >(RECOVERY_BUFFERS_PER_READER);
                let (free_tx, free_rx) = std::sync::mpsc::channel::<AlignedBuf>();
                for _ in 0..RECOVERY_BUFFERS_PER_READER {
                    free_tx
                        .send(AlignedBuf::new_zeroed(bs))
                        .expect("receiver alive");
                }
                let mine: Vec<(BlockId, u64)> = blocks
                    .iter()
                    .skip(r)
                    .step_by(readers)
                    .map(|b| (b.0, b.1))
                    .collect();
                let shared = &shared;
                handles.push(scope.spawn(move || {
                    let clock = ThreadClock::now();
                    let mut t = ScanTimes::default();
                    for (block, block_seq) in mine {
                        // The applying side hung up (an error): stop.
                        let idle = Instant::now();
                        let Ok(mut buf) = free_rx.recv() else {
                            break;
                        };
                        t.reader_idle_ns += elapsed_ns(idle);
                        let (dev, base) = shared.layout.locate(block);
                        let reading = Instant::now();
                        let read = shared.layout.devices[dev].read_at(base, &mut buf);
                        t.read_ns += elapsed_ns(reading);
                        let failed = read.is_err();
                        // Finding the chunks (the one CRC pass) is done here, off the
                        // recovery thread, while it applies the blocks before this one.
                        let parsing = Instant::now();
                        let msg = read
                            .map(|()| {
                                let scan = scan_block(buf.as_slice(), block_seq);
                                (buf, scan)
                            })
                            .map_err(StorageError::from);
                        t.parse_ns += elapsed_ns(parsing);
                        if full_tx.send(msg).is_err() || failed {
                            break;
                        }
                    }
                    t.readers = ThreadClock::since(clock);
                    t
                }));
                full.push(full_rx);
                free.push(free_tx);
            }
            for (n, &(block, block_seq, kind)) in blocks.iter().enumerate() {
                let waiting = Instant::now();
                let (buf, scan) = full[n % readers]
                    .recv()
                    .expect("a reader sends every block it was given or an error")?;
                pending.times.apply_wait_ns += elapsed_ns(waiting);
                let applying = Instant::now();
                self.counters.device_reads += 1;
                self.counters.device_read_bytes += bs as u64;
                if n == RECOVERY_SIZE_SAMPLE_BLOCKS && blocks.len() > 2 * n {
                    for index in self.indexes.iter_mut() {
                        index.reserve(index.len() * blocks.len() / n);
                    }
                }
                self.blocks
                    .insert(block, BlockInfo::new(block_seq, kind, true));
                pending.blocks_read += 1;
                let used = self.recover_block(block, buf.as_slice(), &scan, &mut pending)?;
                pending.times.apply_ns += elapsed_ns(applying);
                // The reader may already be done (then the buffer is not needed).
                let _ = free[n % readers].send(buf);
                pending.ids.seal(block);
                if n % 32 == 31 {
                    pending.ids_peak_bytes = pending.ids_peak_bytes.max(pending.ids.memory_bytes());
                }
                if used == 0 {
                    self.blocks.remove(&block);
                } else {
                    self.blocks.get_mut(&block).expect("inserted").used_bytes = used as u32;
                    kept.push(block);
                }
                if let Some(p) = progress {
                    p.blocks_done.fetch_add(1, Ordering::Relaxed);
                    p.bytes_done.fetch_add(bs as u64, Ordering::Relaxed);
                }
                if (n + 1) % PROGRESS_EVERY_BLOCKS == 0 {
                    tracing::info!(
                        shard = self.id,
                        blocks_done = n + 1,
                        blocks_total = blocks.len(),
                        "recovery progress"
                    );
                }
            }
            // Every block was handed over: the readers are done or about to be.
            drop(free);
            for h in handles {
                let t = h.join().expect("recovery reader panicked");
                pending.times.add(&t);
            }
            Ok(())
        })?;
        pending.ids_peak_bytes = pending.ids_peak_bytes.max(pending.ids.memory_bytes());
        Ok((kept, pending))
    }

    /// Applies the committed chunks of one block (found by `scan_block`); returns the
    /// committed length (0 = none).
    fn recover_block(
        &mut self,
        block: BlockId,
        bytes: &[u8],
        scan: &BlockScan,
        pending: &mut Pending,
    ) -> Result<usize, StorageError> {
        for chunk in &scan.chunks {
            self.apply_chunk(block, bytes, chunk, pending)?;
        }
        for &(offset, torn) in &scan.damage {
            if torn {
                self.counters.torn_chunks += 1;
                tracing::warn!(
                    shard = self.id,
                    block = block.0,
                    offset,
                    "torn tail chunk ignored"
                );
            } else {
                self.counters.corrupt_chunks += 1;
                tracing::warn!(
                    shard = self.id,
                    block = block.0,
                    offset,
                    "damaged chunk skipped"
                );
            }
        }
        Ok(scan.used)
    }

    fn apply_chunk(
        &mut self,
        block: BlockId,
        bytes: &[u8],
        chunk: &ParsedChunk,
        pending: &mut Pending,
    ) -> Result<(), StorageError> {
        for d in 0..DB_COUNT {
            let w = chunk.marker.flush_watermarks[d];
            if w > self.watermarks[d] {
                self.watermarks[d] = w;
                self.indexes[d] = Index::new();
                self.expiry[d].clear();
                for info in self.blocks.values_mut() {
                    info.live_bytes[d] = 0;
                }
            }
        }
        pending.max_seq = pending.max_seq.max(chunk.marker_seq);
        let groups = &mut pending.groups;
        groups.decided_below = groups.decided_below.max(chunk.marker.decided_below);
        let mut hashes = [0u64; RECOVERY_PROBE_BATCH];
        for batch in chunk.records.chunks(RECOVERY_PROBE_BATCH) {
            // Hash the batch's keys and load each one's home bucket first: these loads are
            // independent, so their cache misses overlap, and the probes below hit cache
            // (probed one by one, each record would wait for memory on its own).
            let mut touched = 0u64;
            for (h, &(off, hdr)) in hashes.iter_mut().zip(batch) {
                if matches!(hdr.record_type, RecordType::Put | RecordType::Tombstone) {
                    *h = self.hash(hdr.db, key_in(bytes, off, &hdr));
                    touched ^= self.indexes[hdr.db as usize].touch(*h);
                }
            }
            std::hint::black_box(touched);
            for (&h, &(off, hdr)) in hashes.iter().zip(batch) {
                self.apply_scanned(block, bytes, off, hdr, h, pending)?;
            }
        }
        Ok(())
    }

    /// One record of a verified chunk; `h` is its key's index hash if it is a put or a
    /// tombstone.
    fn apply_scanned(
        &mut self,
        block: BlockId,
        bytes: &[u8],
        off: usize,
        hdr: RecordHeader,
        h: u64,
        pending: &mut Pending,
    ) -> Result<(), StorageError> {
        {
            pending.max_seq = pending.max_seq.max(hdr.seq);
            match hdr.record_type {
                RecordType::Put | RecordType::Tombstone => {}
                RecordType::GroupPart => {
                    match GroupPartPayload::decode(value_in(bytes, off, &hdr)) {
                        Some(p) => {
                            pending.groups.max_group = pending.groups.max_group.max(p.group);
                            pending.groups.parts.push(p);
                        }
                        None => tracing::warn!(shard = self.id, "malformed group part ignored"),
                    }
                    return Ok(());
                }
                RecordType::Page => {
                    // Not indexed: live only if the chosen root reaches it (finish_recovery).
                    pending
                        .paged
                        .page(self.shared.layout.address(block, off), hdr.db);
                    return Ok(());
                }
                _ => return Ok(()),
            }
            let key = key_in(bytes, off, &hdr);
            let addr = self.shared.layout.address(block, off);
            let fp = pending.ids.fingerprint(hdr.db, key);
            if let Some(group) = group_in(bytes, off, &hdr) {
                // Counted now, applied after every shard's scan if the group is complete.
                let g = &mut pending.groups;
                g.max_group = g.max_group.max(group);
                g.records.entry(group).or_default().insert(hdr.seq);
                pending.grouped.push(GroupedRecord {
                    group,
                    db: hdr.db,
                    hash: h,
                    addr,
                    header: hdr,
                    fp,
                });
                return Ok(());
            }
            if hdr.seq < self.watermarks[hdr.db as usize] {
                return Ok(());
            }
            let existing = self.find_by_identity(hdr.db, h, fp, &pending.ids)?;
            self.apply_record(block, addr, h, fp, hdr, existing, pending);
        }
        Ok(())
    }

    /// The newest-wins rule for one put or tombstone at `addr` in `block`, given the
    /// current record of its key (`existing`).
    #[allow(clippy::too_many_arguments)]
    fn apply_record(
        &mut self,
        block: BlockId,
        addr: Address,
        h: u64,
        fp: u64,
        hdr: RecordHeader,
        existing: Option<(Address, OldRecord)>,
        pending: &mut Pending,
    ) {
        pending.records += 1;
        let is_put = hdr.record_type == RecordType::Put;
        let db = hdr.db;
        match existing {
            Some((_, old)) if old.seq >= hdr.seq => {
                // Kept in case the newer paged root turns out to miss pages.
                if old.is_put && old.is_paged_root {
                    pending.paged.superseded(db, h, addr, hdr.seq);
                }
                return;
            }
            Some((old_addr, old)) => {
                if is_put && super::paged::is_root(hdr.flags) {
                    pending.paged.superseded(db, h, old_addr, old.seq);
                }
                self.indexes[db as usize].replace(h, old_addr, addr);
                let (ob, ooff) = self.shared.layout.split(old_addr);
                pending.ids.kill(ob, ooff);
                if old.is_put {
                    self.unaccount(db, old_addr, old.len);
                    self.expiry_remove(db, old.expire_at_ms, old_addr);
                }
            }
            None => self.indexes[db as usize].insert(h, addr),
        }
        let (_, off) = self.shared.layout.split(addr);
        pending.ids.add(block, off, fp, &hdr);
        let info = self.blocks.get_mut(&block).expect("block registered");
        if is_put {
            info.live_bytes[db as usize] += hdr.record_len() as u32;
            self.expiry_add(db, hdr.expire_at_ms, addr);
            if hdr.flags & FLAG_LARGE != 0 {
                pending.roots.push((db, h, addr));
            }
            if super::paged::is_root(hdr.flags) {
                pending.paged.root(db, h, addr);
            }
        } else {
            info.note_tomb(hdr.record_len());
            pending.tombs.push((db, h, addr));
        }
    }

    /// After every shard's scan: applies the GROUPED records of complete groups (the rule of
    /// `apply_record`, final FLUSHDB watermarks) and returns the others (aborted).
    pub(crate) fn apply_groups(
        &mut self,
        pending: &mut Pending,
        complete: &BTreeSet<u64>,
    ) -> Result<Vec<(Db, u64, Address)>, StorageError> {
        let mut aborted = Vec::new();
        for r in std::mem::take(&mut pending.grouped) {
            if !complete.contains(&r.group) {
                aborted.push((r.db, r.hash, r.addr));
                continue;
            }
            if r.header.seq < self.watermarks[r.db as usize] {
                continue;
            }
            let existing = self.find_by_identity(r.db, r.hash, r.fp, &pending.ids)?;
            let (block, _) = self.shared.layout.split(r.addr);
            self.apply_record(block, r.addr, r.hash, r.fp, r.header, existing, pending);
        }
        Ok(aborted)
    }

    /// Restates, with new sequence numbers, the recovered state of every key an aborted
    /// group wrote: the current record re-appended (a LARGE root with the same fragment
    /// list), or a tombstone if the key is absent. Afterwards no later recovery can take the
    /// aborted records as current, whatever `decided_below` says.
    pub(crate) fn neutralise(
        &mut self,
        aborted: &[(Db, u64, Address)],
    ) -> Result<(), StorageError> {
        let mut done: HashSet<(Db, Vec<u8>)> = HashSet::new();
        for &(db, h, addr) in aborted {
            let key = self.read_record(addr)?.key;
            if !done.insert((db, key.clone())) {
                continue;
            }
            match self.find(db, &key, h)? {
                Some(found) => {
                    let hdr = found.rec.header;
                    let (new, _) = self.append(
                        RecordType::Put,
                        // A paged root is restated as it is: the same pages stay reachable.
                        hdr.flags & (FLAG_LARGE | FLAG_PAGED),
                        hdr.value_kind,
                        db,
                        &key,
                        &found.rec.value,
                        hdr.expire_at_ms,
                        None,
                        true,
                    )?;
                    let len = super::format::record_len(key.len(), found.rec.value.len());
                    let expire = hdr.expire_at_ms;
                    self.install(db, h, Some(found), new, len, expire, false);
                }
                None => {
                    let (taddr, _) =
                        self.append(RecordType::Tombstone, 0, 0, db, &key, &[], 0, None, true)?;
                    self.note_tomb_at(taddr, super::format::record_len(key.len(), 0));
                }
            }
        }
        Ok(())
    }

    /// `find` for recovery, without reading: the candidate whose identity fingerprint is
    /// `fp`. A candidate the table does not know (none should exist) is read and compared.
    fn find_by_identity(
        &mut self,
        db: Db,
        h: u64,
        fp: u64,
        ids: &Identities,
    ) -> Result<Option<(Address, OldRecord)>, StorageError> {
        let mut unknown: Vec<Address> = Vec::new();
        for addr in self.indexes[db as usize].candidates(h) {
            let (b, off) = self.shared.layout.split(addr);
            match ids.get(b, off) {
                Some((f, old)) if f == fp => return Ok(Some((addr, old))),
                Some(_) => {}
                None => unknown.push(addr),
            }
        }
        for addr in unknown {
            // Not expected: every indexed record went through `apply_record`. Stay exact.
            tracing::warn!(
                shard = self.id,
                ?addr,
                "recovery: candidate without identity"
            );
            let r = self.read_record(addr)?;
            if r.header.db == db && ids.fingerprint(db, &r.key) == fp {
                let hdr = r.header;
                return Ok(Some((
                    addr,
                    OldRecord {
                        seq: hdr.seq,
                        is_put: hdr.record_type == RecordType::Put,
                        is_paged_root: super::paged::is_root(hdr.flags),
                        len: hdr.record_len(),
                        expire_at_ms: hdr.expire_at_ms,
                    },
                )));
            }
        }
        Ok(None)
    }

    /// Drops tombstones from the index, settles which extents are live, and sets the next
    /// sequence number.
    pub(crate) fn finish_recovery(
        &mut self,
        mut pending: Pending,
        kept: &mut Vec<BlockId>,
    ) -> Result<(), StorageError> {
        // The identity table has served its purpose (the scan and the groups).
        drop(std::mem::take(&mut pending.ids));
        for (db, h, a) in pending.tombs {
            self.indexes[db as usize].remove(h, a);
        }
        for index in self.indexes.iter_mut() {
            index.shrink_to_fit();
        }
        // Paged roots count only if all their pages were found; their pages become live.
        let paged = std::mem::take(&mut pending.paged);
        super::paged::finish_recovery(self, paged, &mut pending.roots)?;
        let mut live_extents: HashMap<BlockId, Db> = HashMap::new();
        for (db, h, a) in pending.roots {
            if !self.indexes[db as usize].candidates(h).any(|x| x == a) {
                continue;
            }
            let root = self.read_record(a)?;
            for frag in parse_root(&root.value)?.2 {
                live_extents.insert(self.shared.layout.split(frag).0, db);
            }
        }
        let mut dead = Vec::new();
        for (b, info) in self.blocks.iter_mut() {
            if info.kind != BLOCK_KIND_EXTENT {
                continue;
            }
            match live_extents.get(b) {
                Some(&db) => info.live_bytes[db as usize] = info.used_bytes,
                None => dead.push(*b),
            }
        }
        for b in &dead {
            self.blocks.remove(b);
        }
        kept.retain(|b| !dead.contains(b));
        let max_watermark = self.watermarks.iter().copied().max().unwrap_or(0);
        self.next_seq = pending.max_seq.max(max_watermark) + 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{open_on, FsyncPolicy, StoreConfig, ValueKind};
    use crate::device::{BlockDevice, MemDevice};
    use std::collections::HashMap;
    use std::sync::Arc;

    // A full-scan reopen (no shutdown, so no checkpoint) with index hashes forced to collide,
    // overwrites across many blocks, deletes, TTLs set and dropped, and a few values over a
    // block in size recovers exactly what was written, and reads no record except each live
    // large value's root (the scan's identity table decides "same key").
    #[test]
    fn full_scan_is_exact_without_record_reads() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let c = StoreConfig {
            block_size_bytes: 64 * 1024,
            fsync: FsyncPolicy::Always,
            shard_count: 1,
            staging_limit_bytes: 64 * 1024,
            defrag_paused: true,
            debug_hash_mask: 0xC000_0000_0000_0000,
            ..StoreConfig::default()
        };
        let open = || {
            open_on(vec![dev.clone() as Arc<dyn BlockDevice>], &c)
                .expect("open")
                .shards
                .pop()
                .expect("one shard")
        };
        let mut s = open();
        let mut model: HashMap<Vec<u8>, (Vec<u8>, Option<u64>)> = HashMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for step in 0..6000u64 {
            let k = format!("key:{}", next() % 400).into_bytes();
            match next() % 10 {
                0 | 1 => {
                    s.delete(0, &k, 0).unwrap();
                    model.remove(&k);
                }
                op => {
                    let big = step % 1500 == 7;
                    let len = if big {
                        150_000
                    } else {
                        20 + (next() % 600) as usize
                    };
                    let v: Vec<u8> = (0..len).map(|i| (i as u64 + step) as u8).collect();
                    let ttl = (op == 2).then_some(10_000_000 + step);
                    s.put(0, &k, ValueKind::String, &v, ttl, 0).unwrap();
                    model.insert(k, (v, ttl));
                }
            }
        }
        s.flush().unwrap();
        drop(s);
        let mut s = open();
        let large_live = model.values().filter(|v| v.0.len() > 100_000).count() as u64;
        assert!(
            s.counters.sync_reads <= large_live,
            "{} record reads, {large_live} live large values",
            s.counters.sync_reads
        );
        assert_eq!(s.key_count(0), model.len() as u64);
        assert_eq!(
            s.volatile_count_db(0),
            model.values().filter(|v| v.1.is_some()).count() as u64
        );
        for i in 0..400 {
            let k = format!("key:{i}").into_bytes();
            let got = s.get(0, &k, 0).unwrap().map(|v| (v.bytes, v.expire_at_ms));
            assert_eq!(got, model.get(&k).cloned(), "key:{i}");
        }
    }
}
