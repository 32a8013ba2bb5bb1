//! Submission helpers shared by the worker's parts (connections, device reads, group
//! commit): pushing an SQE, and naming a data file by its registered index.

use io_uring::{squeue, IoUring};
use std::os::fd::RawFd;

/// How an operation names a data file: registered index or plain descriptor.
pub enum FileTarget {
    Fixed(u32),
    Fd(RawFd),
}

/// The ring's name for `fd`: its index in `fixed` (the files registered with the ring)
/// if it has one.
pub fn file_target(fixed: &[RawFd], fd: RawFd) -> FileTarget {
    match fixed.iter().position(|&f| f == fd) {
        Some(i) => FileTarget::Fixed(i as u32),
        None => FileTarget::Fd(fd),
    }
}

/// Queues `sqe`, submitting what is queued first when the submission queue is full.
pub fn push_sqe(ring: &mut IoUring, sqe: &squeue::Entry) {
    loop {
        // SAFETY: every SQE the worker builds points at memory that outlives the
        // operation: connection buffers are not touched while their send is in flight
        // (`send_inflight`), device-read buffers are owned by their pending read until its
        // completion (`server::reads`; a batch read's buffers until the coordinator has
        // reaped every completion of the batch), receive buffers belong to the buffer ring, the wake
        // buffer is a Box owned by the worker, and a chunk write's bytes are in a staging
        // buffer its shard keeps unchanged and alive (parked if the block is sealed
        // meanwhile) until the write's completion reaches `Shard::flush_chunk_done`; the
        // worker's `finish` waits for those completions.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return;
        }
        let _ = ring.submit();
    }
}
