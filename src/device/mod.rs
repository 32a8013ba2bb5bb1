//! Block devices: the only layer of the storage stack that touches files, kernels or hardware.
//!
//! What it owns: a byte-addressed, sector-aligned, synchronous `BlockDevice` interface and its
//! backends — `FileDevice` (regular files and raw block devices, `O_DIRECT` when the
//! filesystem allows it, `pread`/`pwrite` for now) and `MemDevice` (in memory, for tests, with
//! fault injection: failing writes, crashes that drop or tear unsynced writes, bit flips).
//!
//! Invariants: every transfer starts at a multiple of 4096 bytes and moves a whole
//! `AlignedBuf` (4096-aligned start, length a multiple of 4096), so the same buffers are valid
//! for `O_DIRECT` and for DMA. Nothing written is durable until `sync()` returns `Ok`.
//!
//! Asynchronous reads: kernel files are read asynchronously by the worker's own io_uring
//! (`raw_fd`); a device without a file descriptor may offer `AsyncReads` instead (the
//! userspace NVMe driver, `nvme::block`: the worker submits to its own I/O queue pair and
//! polls it every round). Writes are synchronous through this trait on such devices.
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::Range;
use std::ptr::NonNull;

mod file;
mod gated;
mod mem;

pub use file::FileDevice;
pub use gated::GatedDevice;
pub use mem::{MemDevice, TearLastWrite};

/// What `AsyncReads::poll_reads` reports.
pub enum ReadEvent<'a> {
    /// Bytes of read `token`, to be placed at byte `at` of the caller's buffer for it.
    Data {
        token: u64,
        at: usize,
        bytes: &'a [u8],
    },
    /// Read `token` is over (every `Data` event of it came before): all its bytes were
    /// delivered when `result` is `Ok`.
    Done {
        token: u64,
        result: Result<(), DeviceError>,
    },
}

/// Reads submitted now and completed later, by polling on the calling thread (a worker's
/// round). Every method works on the calling thread's own queue: a read is polled for by
/// the thread that submitted it, and `token`s need only be unique per thread.
pub trait AsyncReads: Send + Sync {
    /// Queues a read of `len_bytes` at `offset_bytes`; never waits for the device. A read
    /// that cannot start now (no free command slot or buffer) starts in a later poll; a
    /// read that cannot be done at all reports its error as its `Done` event.
    fn submit_read(&self, token: u64, offset_bytes: u64, len_bytes: usize);
    /// Reaps completions of the calling thread's reads (at most the device's per-poll cap
    /// of device completions), starts queued ones, and reports what finished. Returns the
    /// number of events reported.
    fn poll_reads(&self, on_event: &mut dyn FnMut(ReadEvent<'_>)) -> usize;
    /// Reads of the calling thread submitted and not yet reported `Done`.
    fn reads_outstanding(&self) -> usize;
}

/// The stand-in file descriptor that names device number `dev` of a store in a planned
/// read (`storage::prefetch::RecordRead::fd`) when the device has no descriptor but reads
/// asynchronously (`AsyncReads`): -2, -3, ... (-1 stays "no descriptor").
pub fn async_device_fd(dev: usize) -> std::os::fd::RawFd {
    -2 - dev as std::os::fd::RawFd
}

/// The device number an `async_device_fd` names (`None` for a real descriptor or -1).
pub fn async_device_index(fd: std::os::fd::RawFd) -> Option<usize> {
    (fd <= -2).then(|| (-2 - fd) as usize)
}

/// The errno a device error stands for, for completion results (negative errno) shared
/// with io_uring's reads.
pub fn error_errno(e: &DeviceError) -> i32 {
    match e {
        DeviceError::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        DeviceError::OutOfRange { .. } | DeviceError::Misaligned { .. } => libc::EINVAL,
        DeviceError::Timeout => libc::ETIMEDOUT,
        DeviceError::Media(_) | DeviceError::Injected(_) => libc::EIO,
    }
}

/// Alignment of every buffer and of every transfer offset, in bytes.
pub const IO_ALIGN_BYTES: usize = 4096;

/// A DMA/O_DIRECT-safe buffer: 4096-byte aligned start, length a multiple of 4096.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `AlignedBuf` exclusively owns its allocation (like a `Vec<u8>`); sharing `&AlignedBuf`
// only allows reads through `as_slice`.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; all mutation requires `&mut self`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len_bytes` rounded up to a multiple of 4096 (at least 4096).
    pub fn new_zeroed(len_bytes: usize) -> AlignedBuf {
        let len = len_bytes.max(1).div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
        let layout = Layout::from_size_align(len, IO_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, IO_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: allocated in `new_zeroed` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("access out of range: offset {offset_bytes} + {len_bytes} bytes > capacity {capacity_bytes}")]
    OutOfRange {
        offset_bytes: u64,
        len_bytes: u64,
        capacity_bytes: u64,
    },
    #[error(
        "misaligned access: offset {offset_bytes}, length {len_bytes} (alignment {align_bytes})"
    )]
    Misaligned {
        offset_bytes: u64,
        len_bytes: u64,
        align_bytes: u64,
    },
    #[error("device timeout")]
    Timeout,
    #[error("media error: {0}")]
    Media(String),
    #[error("injected fault: {0}")]
    Injected(String),
}

/// A byte-addressed device with sector-aligned access. Thread-safe (`&self`), synchronous.
pub trait BlockDevice: Send + Sync {
    /// 512 or 4096.
    fn sector_size_bytes(&self) -> u32;
    fn capacity_bytes(&self) -> u64;
    /// Reads `buf.len()` bytes starting at `offset_bytes`.
    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError>;
    /// Writes all of `buf` starting at `offset_bytes`.
    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError>;
    /// Durable barrier (fdatasync / NVMe Flush): every write that returned before is durable.
    fn sync(&self) -> Result<(), DeviceError>;
    /// For logs: the path or `spdk://BDF/NSID`.
    fn describe(&self) -> String;

    /// Writes `buf[range]` at `offset_bytes`; the range must start and end on 4096-byte
    /// boundaries (so the slice is as aligned as the buffer). The default copies into a
    /// temporary buffer; backends override it to write straight from `buf`.
    fn write_range_at(
        &self,
        offset_bytes: u64,
        buf: &AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        check_range(&range, buf.len())?;
        let mut tmp = AlignedBuf::new_zeroed(range.len());
        tmp.as_mut_slice().copy_from_slice(&buf.as_slice()[range]);
        self.write_at(offset_bytes, &tmp)
    }

    /// Reads `range.len()` bytes at `offset_bytes` into `buf[range]` (same rules as
    /// `write_range_at`).
    fn read_range_at(
        &self,
        offset_bytes: u64,
        buf: &mut AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        check_range(&range, buf.len())?;
        let mut tmp = AlignedBuf::new_zeroed(range.len());
        self.read_at(offset_bytes, &mut tmp)?;
        buf.as_mut_slice()[range].copy_from_slice(tmp.as_slice());
        Ok(())
    }
    /// The file descriptor to read with the caller's own io_uring, when the
    /// backend is a kernel file or block device (`None` otherwise).
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// The asynchronous read interface of a backend without a file descriptor that has one
    /// (the userspace NVMe driver), for the worker's asynchronous command path.
    fn async_reads(&self) -> Option<&dyn AsyncReads> {
        None
    }

    /// Whether `reserve_to`/`grow_to` work: a regular file can grow, a block device or an
    /// NVMe namespace cannot.
    fn can_grow(&self) -> bool {
        false
    }

    /// Claims room up to `capacity_bytes` (fallocate) without making it addressable yet:
    /// a file system without that much room says so now, before anything is written there.
    fn reserve_to(&self, capacity_bytes: u64) -> Result<(), DeviceError> {
        Err(cannot_grow(self.describe(), capacity_bytes))
    }

    /// Zero-fills and syncs the bytes from the current capacity up to `capacity_bytes`, then
    /// makes them addressable. Afterwards writes there land in allocated, written space, so
    /// an `fdatasync` commits no file-system metadata for them.
    fn grow_to(&self, capacity_bytes: u64) -> Result<(), DeviceError> {
        Err(cannot_grow(self.describe(), capacity_bytes))
    }

    /// Bytes an unprivileged writer may still allocate on the device's file system
    /// (`statvfs` f_bavail), when that means anything.
    fn free_space_bytes(&self) -> Option<u64> {
        None
    }
}

fn cannot_grow(what: String, capacity_bytes: u64) -> DeviceError {
    DeviceError::Io(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("{what}: cannot grow to {capacity_bytes} bytes (fixed-size device)"),
    ))
}

/// A sub-range of an `AlignedBuf` usable for a transfer: non-empty, 4096-aligned, inside.
pub(crate) fn check_range(range: &Range<usize>, buf_len: usize) -> Result<(), DeviceError> {
    let align = IO_ALIGN_BYTES;
    if range.start >= range.end
        || !range.start.is_multiple_of(align)
        || !range.end.is_multiple_of(align)
    {
        return Err(DeviceError::Misaligned {
            offset_bytes: range.start as u64,
            len_bytes: range.len() as u64,
            align_bytes: align as u64,
        });
    }
    if range.end > buf_len {
        return Err(DeviceError::OutOfRange {
            offset_bytes: range.start as u64,
            len_bytes: range.len() as u64,
            capacity_bytes: buf_len as u64,
        });
    }
    Ok(())
}

/// Shared argument check for the backends: aligned and inside the device.
pub(crate) fn check_access(
    offset_bytes: u64,
    len_bytes: usize,
    capacity_bytes: u64,
) -> Result<(), DeviceError> {
    let len_bytes = len_bytes as u64;
    let align_bytes = IO_ALIGN_BYTES as u64;
    if !offset_bytes.is_multiple_of(align_bytes) || !len_bytes.is_multiple_of(align_bytes) {
        return Err(DeviceError::Misaligned {
            offset_bytes,
            len_bytes,
            align_bytes,
        });
    }
    if offset_bytes
        .checked_add(len_bytes)
        .is_none_or(|end| end > capacity_bytes)
    {
        return Err(DeviceError::OutOfRange {
            offset_bytes,
            len_bytes,
            capacity_bytes,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves buffers are 4096-aligned, rounded up to whole sectors, and start zeroed.
    #[test]
    fn aligned_buf_is_aligned_rounded_and_zeroed() {
        let mut b = AlignedBuf::new_zeroed(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN_BYTES, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
        assert_eq!(AlignedBuf::new_zeroed(0).len(), 4096);
    }

    // Proves the shared access check rejects misaligned and out-of-range requests.
    #[test]
    fn access_check_rejects_bad_requests() {
        assert!(check_access(0, 4096, 8192).is_ok());
        assert!(matches!(
            check_access(1, 4096, 8192),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            check_access(0, 100, 8192),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            check_access(4096, 8192, 8192),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            check_access(u64::MAX - 4095, 4096, 8192),
            Err(DeviceError::OutOfRange { .. })
        ));
    }
}
