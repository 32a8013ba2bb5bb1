//! Block devices: the byte-addressed, sector-aligned storage the engine writes to.
//!
//! This copy holds only the contract (`AlignedBuf`, `DeviceError`, `BlockDevice`) so the
//! NVMe adapter in `crate::nvme` can implement it; the storage helper owns the real module
//! (with `FileDevice` and `MemDevice`) and it replaces this one at merge.
use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment and length granule of every `AlignedBuf`.
pub const BUF_ALIGN_BYTES: usize = 4096;

/// A DMA/O_DIRECT-safe buffer: 4096-byte aligned start, length a multiple of 4096.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation (like Vec<u8>); no interior mutability.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` rounded up to 4096 (at least 4096).
    pub fn new_zeroed(len_bytes: usize) -> AlignedBuf {
        let len = len_bytes.max(1).div_ceil(BUF_ALIGN_BYTES) * BUF_ALIGN_BYTES;
        let layout = Layout::from_size_align(len, BUF_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BUF_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: allocated in new_zeroed with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("device I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("access out of range: offset {offset_bytes} + {len_bytes} bytes > capacity {capacity_bytes}")]
    OutOfRange {
        offset_bytes: u64,
        len_bytes: u64,
        capacity_bytes: u64,
    },
    #[error(
        "misaligned access: offset {offset_bytes}, {len_bytes} bytes, sector {sector_size_bytes}"
    )]
    Misaligned {
        offset_bytes: u64,
        len_bytes: u64,
        sector_size_bytes: u32,
    },
    #[error("device timed out")]
    Timeout,
    #[error("media error: {0}")]
    Media(String),
}

/// A byte-addressed device with sector-aligned access. Thread-safe (`&self`), synchronous.
pub trait BlockDevice: Send + Sync {
    fn sector_size_bytes(&self) -> u32; // 512 or 4096
    fn capacity_bytes(&self) -> u64;
    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError>; // reads buf.len() bytes
    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError>;
    fn sync(&self) -> Result<(), DeviceError>; // durable barrier (fdatasync / NVMe Flush)
    fn describe(&self) -> String; // for logs: path or spdk://BDF/NSID
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves lengths round up to the 4096 granule and the start is 4096-aligned and zeroed.
    #[test]
    fn aligned_buf_rounds_and_aligns() {
        let b = AlignedBuf::new_zeroed(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
    }
}
