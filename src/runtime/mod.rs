//! The per-worker runtime: the io_uring ring code, provided-buffer rings,
//! eventfd wake-ups and CPU pinning.
//!
//! This module (with `device/` and `nvme/`) is where `unsafe` is allowed:
//! memory handed to the kernel through the ring must outlive the operation
//! that uses it, and the types here make that ownership explicit. Everything
//! above (`server`, `commands`, `storage`) is safe code.
pub mod bufring;
pub mod copies;
pub mod events;
pub mod keymemo;
pub mod lookups;
pub mod ring;
pub mod tracking;

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Kinds of operation carried in the top byte of an SQE's `user_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpKind {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Wake = 4,
    /// A device read of a record a command needs (`server::reads`).
    Read = 5,
    /// An `fdatasync` of a data file for group commit (`worker::flush_storage`).
    Fsync = 6,
    /// A group-commit chunk write of a shard's staged records (`worker::start_epoch`).
    ChunkWrite = 7,
    /// An eventfd write that wakes another, parked worker (`worker::send_outbox`).
    Signal = 8,
}

/// Packs an operation kind and a 56-bit token (listener index or connection
/// slot) into `user_data`.
pub fn user_data(kind: OpKind, token: u64) -> u64 {
    debug_assert!(token < (1 << 56));
    ((kind as u64) << 56) | token
}

pub fn split_user_data(ud: u64) -> (u8, u64) {
    ((ud >> 56) as u8, ud & ((1 << 56) - 1))
}

/// A non-blocking eventfd used to wake a parked worker.
pub fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant flags; returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd counter, waking the ring that reads it.
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live local to an fd we keep open for the
    // process lifetime; failure (EAGAIN on a saturated counter) is harmless.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Gives freed heap memory back to the kernel (glibc keeps large freed buffers in its
/// arenas otherwise, so RSS would stay at a departed client's peak).
pub fn trim_heap() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe { libc::malloc_trim(0) };
}

/// Pins the calling thread to one CPU. Failure is logged, not fatal.
pub fn pin_current_thread(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes within `set`; `cpu` is bounds-checked by libc's macro port.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is initialised and sized as passed; 0 = this thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}
