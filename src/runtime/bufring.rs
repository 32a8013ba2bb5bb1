//! A ring of provided buffers (`IORING_REGISTER_PBUF_RING`) for multishot
//! receives: the kernel picks a free buffer per completion and tells us its
//! id; we copy the bytes out and give the buffer back at once, so a ring of
//! a few hundred buffers serves thousands of connections.

use io_uring::types::BufRingEntry;
use io_uring::IoUring;
use std::sync::atomic::{AtomicU16, Ordering};

/// Buffer group id used for socket receives.
pub const RECV_GROUP_ID: u16 = 0;

pub struct BufRing {
    ring: *mut BufRingEntry,
    ring_bytes: usize,
    buffers: Vec<u8>,
    entries: u16,
    buf_bytes: usize,
    tail: u16,
}

impl BufRing {
    /// Allocates `entries` buffers of `buf_bytes` and registers them with the
    /// ring. `entries` must be a power of two.
    pub fn new(ring: &IoUring, entries: u16, buf_bytes: usize) -> std::io::Result<BufRing> {
        assert!(entries.is_power_of_two());
        let ring_bytes = entries as usize * std::mem::size_of::<BufRingEntry>();
        // SAFETY: anonymous private mapping, no fd; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut br = BufRing {
            ring: ptr.cast(),
            ring_bytes,
            buffers: vec![0u8; entries as usize * buf_bytes],
            entries,
            buf_bytes,
            tail: 0,
        };
        // SAFETY: the mapping is page aligned, `entries` long, and lives until
        // `Drop` unmaps it, which happens after the ring (and its registration)
        // is dropped because the worker drops its BufRing after its IoUring.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                br.ring as u64,
                entries,
                RECV_GROUP_ID,
                0,
            )?;
        }
        for bid in 0..entries {
            br.push(bid);
        }
        br.publish();
        Ok(br)
    }

    pub fn buf_bytes(&self) -> usize {
        self.buf_bytes
    }

    /// The first `len` bytes of buffer `bid`, as filled by the kernel.
    pub fn data(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * self.buf_bytes;
        &self.buffers[start..start + len.min(self.buf_bytes)]
    }

    fn push(&mut self, bid: u16) {
        let idx = (self.tail & (self.entries - 1)) as usize;
        // SAFETY: idx < entries, so the entry lies within the mapping.
        let entry = unsafe { &mut *self.ring.add(idx) };
        let addr = self.buffers.as_ptr() as u64 + bid as u64 * self.buf_bytes as u64;
        entry.set_addr(addr);
        entry.set_len(self.buf_bytes as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes pushed buffers visible to the kernel: a release store of the
    /// tail orders the entry writes before it.
    fn publish(&mut self) {
        // SAFETY: the ring base is the first entry of a live mapping; the tail
        // field is a naturally aligned u16 that only we write.
        let tail = unsafe { &*(BufRingEntry::tail(self.ring) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Returns buffer `bid` to the kernel after its bytes were consumed.
    pub fn recycle(&mut self, bid: u16) {
        self.push(bid);
        self.publish();
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`.
        unsafe { libc::munmap(self.ring.cast(), self.ring_bytes) };
    }
}
