//! Where blocks live and who may use them: the store layout (global block number → device and
//! byte offset, record address encoding) and the shared block allocator.
use super::format::{Label, MetaSlot, ADDRESS_BITS, META_SLOT_OFFSETS_BYTES, RECORD_ALIGN_BYTES};
use super::index::Address;
use super::StorageError;
use crate::device::{AlignedBuf, BlockDevice};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// A block number unique across all devices of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Hasher for maps keyed by `BlockId` (a shard's block table, looked up several times
/// per SET). Block ids are small integers the allocator picks, never client input, so
/// one multiply (Fibonacci hashing) spreads them well enough; SipHash, the std default,
/// cost several times more per lookup. Odd multiplier: distinct ids keep distinct low
/// bits, and the high bits hashbrown uses as tags mix every bit of the id.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockIdHasher(u64);

impl std::hash::Hasher for BlockIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, v: u32) {
        const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;
        self.0 = (self.0.rotate_left(32) ^ u64::from(v)).wrapping_mul(FIBONACCI);
    }
}

/// Builds `BlockIdHasher`s for `HashMap<BlockId, _, BlockIdHashing>`.
pub type BlockIdHashing = std::hash::BuildHasherDefault<BlockIdHasher>;

pub struct Layout {
    pub devices: Vec<Arc<dyn BlockDevice>>,
    pub block_size_bytes: u32,
    /// log2(block_size / RECORD_ALIGN_BYTES): low bits of an address.
    pub offset_bits: u32,
    /// First global block number of each device, plus a final entry = total blocks at open.
    pub device_first_block: Vec<u32>,
    /// Blocks of the store now: a growing data file (one device, `grow`) adds blocks at
    /// its end, under the allocator's lock, before they join the free list.
    total_blocks: AtomicU32,
    /// Most blocks the address space allows.
    pub max_blocks: u64,
    pub store_uuid: [u8; 16],
    pub shard_count: u32,
}

impl Layout {
    pub fn new(
        devices: Vec<Arc<dyn BlockDevice>>,
        labels: &[Label],
    ) -> Result<Layout, StorageError> {
        let block_size_bytes = labels[0].block_size_bytes;
        let offset_bits = (block_size_bytes as usize / RECORD_ALIGN_BYTES).trailing_zeros();
        let mut device_first_block = vec![0u32];
        let mut total: u64 = 0;
        for l in labels {
            total += l.block_count;
            if total >= 1 << (ADDRESS_BITS - offset_bits) {
                return Err(StorageError::Config(format!(
                    "store too large: {total} blocks of {block_size_bytes} bytes exceed the {ADDRESS_BITS}-bit address space"
                )));
            }
            device_first_block.push(total as u32);
        }
        let max_blocks = (1u64 << (ADDRESS_BITS - offset_bits)) - 1;
        Ok(Layout {
            devices,
            block_size_bytes,
            offset_bits,
            total_blocks: AtomicU32::new(total as u32),
            max_blocks,
            device_first_block,
            store_uuid: labels[0].store_uuid,
            shard_count: labels[0].shard_count,
        })
    }

    pub fn total_blocks(&self) -> u32 {
        self.total_blocks.load(Ordering::Acquire)
    }

    /// A one-device store grew to `total` blocks (call with the allocator locked, before
    /// the new blocks are handed out).
    pub fn set_total_blocks(&self, total: u32) {
        debug_assert_eq!(self.devices.len(), 1, "only a one-device store grows");
        debug_assert!(u64::from(total) <= self.max_blocks);
        self.total_blocks.fetch_max(total, Ordering::AcqRel);
    }

    /// Device index and byte offset of the start of a block. Block `i` of a device starts at
    /// `(i + 1) * block_size` (the first block-sized region holds the label and metadata).
    pub fn locate(&self, block: BlockId) -> (usize, u64) {
        // Device starts only: the last device's blocks may go past the count at open.
        let dev = self.device_first_block[..self.devices.len()]
            .partition_point(|&first| first <= block.0)
            - 1;
        debug_assert!(dev < self.devices.len(), "block {block:?} out of range");
        let local = u64::from(block.0 - self.device_first_block[dev]);
        (dev, (local + 1) * u64::from(self.block_size_bytes))
    }

    pub fn address(&self, block: BlockId, offset_in_block: usize) -> Address {
        debug_assert_eq!(offset_in_block % RECORD_ALIGN_BYTES, 0);
        debug_assert!(offset_in_block < self.block_size_bytes as usize);
        Address(
            (u64::from(block.0) << self.offset_bits)
                | (offset_in_block / RECORD_ALIGN_BYTES) as u64,
        )
    }

    pub fn split(&self, addr: Address) -> (BlockId, usize) {
        let block = BlockId((addr.0 >> self.offset_bits) as u32);
        let offset = ((addr.0 & ((1 << self.offset_bits) - 1)) as usize) * RECORD_ALIGN_BYTES;
        (block, offset)
    }
}

/// Free blocks per device, handed out round-robin across devices.
pub struct Allocator {
    free: Vec<VecDeque<BlockId>>,
    next_device: usize,
    next_block_seq: u64,
    /// Blocks kept back for deletes and defrag, so space can always be recovered.
    reserve_blocks: usize,
}

impl Allocator {
    pub fn new(device_count: usize, next_block_seq: u64, reserve_blocks: usize) -> Allocator {
        Allocator {
            free: vec![VecDeque::new(); device_count],
            next_device: 0,
            next_block_seq,
            reserve_blocks,
        }
    }

    pub fn free_count(&self) -> usize {
        self.free.iter().map(|f| f.len()).sum()
    }

    /// A free block and a fresh block sequence number. Without `use_reserve`, fails while only
    /// the reserve is left.
    pub fn alloc(&mut self, use_reserve: bool) -> Option<(BlockId, u64)> {
        let free = self.free_count();
        if free == 0 || (!use_reserve && free <= self.reserve_blocks) {
            return None;
        }
        let n = self.free.len();
        for i in 0..n {
            let dev = (self.next_device + i) % n;
            if let Some(b) = self.free[dev].pop_front() {
                self.next_device = (dev + 1) % n;
                let seq = self.next_block_seq;
                self.next_block_seq += 1;
                return Some((b, seq));
            }
        }
        None
    }

    /// Returns a block (already zeroed durably) to the front of its device's free list: the
    /// next allocation reuses it. Reusing recently written blocks keeps the set of blocks in
    /// use small, so a data file that was created sparse is not filled in by every new
    /// block (a write into a hole allocates file space, and the sync of that metadata is
    /// what makes an `fdatasync` slow).
    pub fn release(&mut self, device: usize, block: BlockId) {
        self.free[device].push_front(block);
    }

    /// Adds a block the data file just grew by (zero-filled and synced) to the back of its
    /// device's free list, after the blocks already there.
    pub fn add_new(&mut self, device: usize, block: BlockId) {
        self.free[device].push_back(block);
    }

    /// Free blocks beyond the reserve.
    pub fn free_above_reserve(&self) -> usize {
        self.free_count().saturating_sub(self.reserve_blocks)
    }
}

/// What every shard of one store shares.
pub struct StoreShared {
    pub layout: Layout,
    pub allocator: Mutex<Allocator>,
    pub meta: Mutex<MetaState>,
    /// Defrag jobs running per device (`--defrag-max-active-per-device`).
    pub defrag_active: Vec<std::sync::atomic::AtomicU32>,
    /// The data file grows with the data (one regular file, no fixed size asked for).
    pub growth: Option<super::grow::Growth>,
    /// Group ids and the groups not yet decided (`group.rs`).
    pub(crate) groups: super::group::GroupTable,
}

pub struct MetaState {
    pub generation: u64,
    pub open_shards: u32,
    /// Shards that wrote an index checkpoint during this shutdown.
    pub checkpoints_written: u32,
}

impl StoreShared {
    pub fn lock_alloc(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.allocator.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Allocator::alloc`; for a growing data file whose free blocks run low, also a growth
    /// step on its own thread (waited for only when no block is left: `grow::alloc_block`).
    pub fn alloc_block(self: &Arc<Self>, use_reserve: bool) -> Option<(BlockId, u64)> {
        super::grow::alloc_block(self, use_reserve)
    }

    /// The growing data file's state for INFO (`None` for a fixed-size store).
    pub fn growth_status(&self) -> Option<super::grow::GrowthStatus> {
        let g = self.growth.as_ref()?;
        Some(g.status(&*self.layout.devices[0]))
    }

    /// Writes the next metadata generation into the slot not holding the current one.
    pub fn write_meta(&self, clean_shutdown: bool, checkpoint_id: u64) -> Result<(), StorageError> {
        let mut meta = self.meta.lock().unwrap_or_else(|e| e.into_inner());
        meta.generation += 1;
        let slot = MetaSlot {
            generation: meta.generation,
            store_uuid: self.layout.store_uuid,
            clean_shutdown,
            checkpoint_id,
        };
        write_meta_slot(&*self.layout.devices[0], &slot)
    }
}

pub fn write_meta_slot(dev: &dyn BlockDevice, slot: &MetaSlot) -> Result<(), StorageError> {
    let mut buf = AlignedBuf::new_zeroed(4096);
    buf.as_mut_slice()[..128].copy_from_slice(&slot.encode());
    dev.write_at(
        META_SLOT_OFFSETS_BYTES[(slot.generation % 2) as usize],
        &buf,
    )?;
    dev.sync()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    // Dense block ids land in distinct buckets of a power-of-two table (the low bits of
    // their hashes are all different) and their tag bits are not all alike.
    #[test]
    fn block_id_hash_spreads_dense_ids() {
        let hash = |id: u32| BlockIdHashing::default().hash_one(BlockId(id));
        let low: std::collections::HashSet<u64> =
            (0..1u32 << 16).map(|id| hash(id) & 0xffff).collect();
        assert_eq!(low.len(), 1 << 16);
        let tags: std::collections::HashSet<u64> = (0..1024u32).map(|id| hash(id) >> 57).collect();
        assert!(tags.len() > 100, "only {} distinct tags", tags.len());
    }
}
