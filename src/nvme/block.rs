//! `NvmeBlockDevice`: the `BlockDevice` backend on the userspace driver, and the
//! `spdk://BDF/NSID` data-file syntax.
//!
//! One controller and one namespace per device object, with `io_queue_pairs` I/O queue
//! pairs (one per worker). A calling thread settles on its own queue (first free one from
//! a per-thread home index), so workers do not contend; each queue has its own pool of
//! DMA bounce buffers (the caller's `AlignedBuf` is not IOMMU-mapped). A request is split
//! into commands of at most the controller's transfer limit, submitted as deep as the
//! pool allows with one doorbell write per batch, and reaped by polling — at most
//! `max_completions_per_poll` completions per poll call, as the worker loop will do.
//!
//! Failure policy: an error status fails the request with a typed `DeviceError`; a
//! timeout, a protocol violation or a fatal controller status resets the controller
//! (all queues are locked, in index order, then the controller; every queue is recreated;
//! a reset already done by another thread is not repeated) and fails the request; if the
//! reset itself fails the device is marked failed and every later request returns an
//! I/O error.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::controller::{now_ns, Controller, ControllerOptions, IoOp, IoQueue, NamespaceInfo};
use super::queue::{CommandError, ErrorClass, SubmitError};
use super::spec::{reg, ControllerStatus};
use super::vfio::{Bar0, DmaBacking, DmaBuffer, PciAddress, VfioDevice};
use super::NvmeError;
use crate::device::{AlignedBuf, AsyncReads, BlockDevice, DeviceError, ReadEvent};

/// Default cap on completions reaped per poll (`--spdk-max-completions-per-poll`).
pub const DEFAULT_MAX_COMPLETIONS_PER_POLL: usize = 8;
/// Default I/O command deadline.
pub const DEFAULT_IO_TIMEOUT_MS: u64 = 30_000;
/// Default number of bounce buffers (commands in flight per request).
pub const DEFAULT_BOUNCE_BUFFERS: usize = 16;

/// A parsed `spdk://BDF/NSID` data-file URI, e.g. `spdk://0000:00:04.0/1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpdkUri {
    pub address: PciAddress,
    pub nsid: u32,
}

impl SpdkUri {
    pub const SCHEME: &'static str = "spdk://";

    /// Whether a `--data-file` value names an NVMe namespace rather than a path.
    pub fn is_spdk(s: &str) -> bool {
        s.starts_with(Self::SCHEME)
    }
}

impl std::str::FromStr for SpdkUri {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix(Self::SCHEME)
            .ok_or_else(|| format!("{s:?}: expected spdk://BDF/NSID"))?;
        let (bdf, ns) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: missing /NSID"))?;
        let address = bdf.parse::<PciAddress>()?;
        let nsid = ns
            .parse::<u32>()
            .ok()
            .filter(|&n| n >= 1 && n != u32::MAX)
            .ok_or_else(|| format!("{s:?}: namespace id must be 1..0xFFFFFFFE"))?;
        Ok(SpdkUri { address, nsid })
    }
}

impl std::fmt::Display for SpdkUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spdk://{}/{}", self.address, self.nsid)
    }
}

/// Driver settings. `from_env` honours Lavik's `BYCORF_EAL_ARGS` (only `--no-huge`
/// means something here: locked 4 KiB pages instead of hugepages; other EAL arguments
/// are accepted and ignored with a log line) and `BYCORF_DPDK_MEMORY_MB` (bounds the
/// DMA memory used for bounce buffers).
#[derive(Clone, Debug)]
pub struct NvmeOptions {
    pub max_completions_per_poll: usize,
    /// I/O queue pairs to create (one per worker; capped by what the controller grants).
    pub io_queue_pairs: u16,
    pub io_queue_entries: u16,
    pub io_timeout_ms: u64,
    pub bounce_buffers: usize,
    pub dma_backing: DmaBacking,
    pub dma_memory_mb: Option<u64>,
}

impl Default for NvmeOptions {
    fn default() -> Self {
        NvmeOptions {
            max_completions_per_poll: DEFAULT_MAX_COMPLETIONS_PER_POLL,
            io_queue_pairs: 1,
            io_queue_entries: 64,
            io_timeout_ms: DEFAULT_IO_TIMEOUT_MS,
            bounce_buffers: DEFAULT_BOUNCE_BUFFERS,
            dma_backing: DmaBacking::Hugepages,
            dma_memory_mb: None,
        }
    }
}

impl NvmeOptions {
    /// Defaults adjusted by the `BYCORF_*` variables (see the type's doc).
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var("BYCORF_EAL_ARGS").ok().as_deref(),
            std::env::var("BYCORF_DPDK_MEMORY_MB").ok().as_deref(),
        )
    }

    /// `from_env` with the variable values passed in.
    pub fn from_vars(eal_args: Option<&str>, memory_mb: Option<&str>) -> Self {
        let mut o = NvmeOptions::default();
        for arg in eal_args.unwrap_or("").split_whitespace() {
            match arg {
                "--no-huge" => o.dma_backing = DmaBacking::Locked4k,
                other => tracing::info!(
                    "BYCORF_EAL_ARGS: {other:?} has no meaning for the NVMe driver; ignored"
                ),
            }
        }
        if let Some(mb) = memory_mb {
            match mb.trim().parse::<u64>() {
                Ok(v) if v > 0 => o.dma_memory_mb = Some(v),
                _ => {
                    tracing::warn!("BYCORF_DPDK_MEMORY_MB={mb:?} is not a positive number; ignored")
                }
            }
        }
        o
    }

    /// Bounce buffers to allocate for transfers of `max_transfer_bytes`.
    fn bounce_count(&self, max_transfer_bytes: usize, queue_capacity: usize) -> usize {
        let by_memory = self.dma_memory_mb.map_or(usize::MAX, |mb| {
            (mb as usize * 1024 * 1024 / 2) / max_transfer_bytes.max(1)
        });
        self.bounce_buffers
            .min(by_memory)
            .min(queue_capacity)
            .max(1)
    }
}

/// Opens each `spdk://BDF/NSID` data file as a block device (for `storage::open_on`).
/// Two namespaces on one controller are refused for now (one controller object per
/// device), as is a malformed URI; both before any device is touched.
pub fn open_spdk_data_files(
    uris: &[&str],
    options: &NvmeOptions,
) -> Result<Vec<std::sync::Arc<dyn BlockDevice>>, NvmeError> {
    let parsed = parse_spdk_data_files(uris)?;
    let mut out: Vec<std::sync::Arc<dyn BlockDevice>> = Vec::with_capacity(parsed.len());
    for uri in parsed {
        out.push(std::sync::Arc::new(NvmeBlockDevice::open(
            uri,
            options.clone(),
        )?));
    }
    Ok(out)
}

/// Parses and validates the `--data-file` values of `--storage=spdk`.
pub fn parse_spdk_data_files(uris: &[&str]) -> Result<Vec<SpdkUri>, NvmeError> {
    let mut parsed: Vec<SpdkUri> = Vec::with_capacity(uris.len());
    for s in uris {
        let uri: SpdkUri = s.parse().map_err(NvmeError::Invalid)?;
        if let Some(prev) = parsed.iter().find(|p| p.address == uri.address) {
            return Err(NvmeError::Unsupported(format!(
                "{uri} and {prev}: one namespace per controller is supported"
            )));
        }
        parsed.push(uri);
    }
    if parsed.is_empty() {
        return Err(NvmeError::Invalid(
            "--storage=spdk needs at least one --data-file=spdk://BDF/NSID".into(),
        ));
    }
    Ok(parsed)
}

/// One I/O queue pair with its bounce buffers. `queue` is `None` once the device failed.
struct QueueState {
    queue: Option<IoQueue>,
    pool: Vec<DmaBuffer>,
    /// Bounce buffers allocated for this queue (in `pool` or lent to commands).
    pool_total: usize,
    /// The asynchronous reads of the threads whose home this queue is.
    reads: AsyncState,
}

/// Tags of asynchronous reads' commands carry this bit; the rest is the read's slot
/// (bits 32..63) and the chunk's byte offset in the read (bits 0..32). Synchronous
/// requests tag a command with its byte offset in the request, always below this bit.
const ASYNC_TAG: u64 = 1 << 63;
/// Asynchronous reads per queue (slots); more are refused with an error.
pub const ASYNC_READS_PER_QUEUE_MAX: usize = 1024;
/// Largest asynchronous read (its chunk offsets fit the tag's 32 bits).
const ASYNC_READ_BYTES_MAX: usize = u32::MAX as usize / 2;

fn async_tag(slot: u32, at: usize) -> u64 {
    ASYNC_TAG | (u64::from(slot) << 32) | at as u64
}

fn async_untag(tag: u64) -> Option<(u32, usize)> {
    (tag & ASYNC_TAG != 0).then_some((((tag & !ASYNC_TAG) >> 32) as u32, tag as u32 as usize))
}

/// Bounce buffers of a queue that asynchronous reads leave free, so a synchronous request
/// (a group-commit write, a flush, a handler's read) always has some and never waits for
/// an asynchronous read's owner to poll.
fn sync_reserve(pool_total: usize) -> usize {
    (pool_total / 4).max(1)
}

/// One asynchronous read: split into commands of at most the transfer limit like a
/// synchronous request, submitted as buffers and command slots allow.
struct AsyncRead {
    /// `thread_home_index` of the thread that submitted it (and polls for it).
    owner: usize,
    token: u64,
    offset_bytes: u64,
    len_bytes: usize,
    /// Byte offset of the next chunk to submit.
    next: usize,
    /// Commands in flight or reaped and not handled yet.
    outstanding: u32,
    retries: u32,
    error: Option<DeviceError>,
}

impl AsyncRead {
    fn finished(&self) -> bool {
        self.outstanding == 0 && (self.next >= self.len_bytes || self.error.is_some())
    }
}

/// A command completion of an asynchronous read, reaped and not handled yet.
struct Reaped {
    slot: u32,
    at: usize,
    result: Result<u32, CommandError>,
    after_timeout: bool,
    buffer: Option<DmaBuffer>,
}

/// The asynchronous reads of one queue. Completions are reaped by whichever path polls
/// the queue (the owner's `poll_reads`, or a synchronous request of any thread on this
/// queue) into `reaped`, holding their buffers, and handled — data copied out, buffer
/// back to the pool — only by the owner's `poll_reads`.
#[derive(Default)]
struct AsyncState {
    slots: Vec<Option<AsyncRead>>,
    free: Vec<u32>,
    /// Reads with chunks to submit, oldest first.
    waiting: std::collections::VecDeque<u32>,
    /// Chunks to submit again after a retryable status, with their buffers.
    retry: Vec<(u32, usize, DmaBuffer)>,
    reaped: Vec<Reaped>,
    /// Bounce buffers held by asynchronous reads (in flight, reaped, or to retry).
    held: usize,
    /// Commands of asynchronous reads on the device.
    in_flight: usize,
    /// When a poll last looked for overdue commands and a fatal controller.
    last_check: Option<Instant>,
    /// Reads refused for want of a slot: (owner, token), reported failed at its poll.
    refused: Vec<(usize, u64)>,
}

impl AsyncState {
    fn insert(&mut self, r: AsyncRead) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.slots.len() < ASYNC_READS_PER_QUEUE_MAX => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
            None => return None,
        };
        self.slots[slot as usize] = Some(r);
        Some(slot)
    }

    /// A command of a read was reaped by some poll.
    fn reap(&mut self, c: super::controller::IoCompletion) -> bool {
        let Some((slot, at)) = async_untag(c.tag) else {
            return false;
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        self.reaped.push(Reaped {
            slot,
            at,
            result: c.result,
            after_timeout: c.after_timeout,
            buffer: c.buffer,
        });
        true
    }

    /// A command of a read was lost in a controller reset (the caller takes its buffer
    /// back: `held` counts it no more).
    fn lost(&mut self, tag: u64, had_buffer: bool) -> bool {
        let Some((slot, _)) = async_untag(tag) else {
            return false;
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        if had_buffer {
            self.held = self.held.saturating_sub(1);
        }
        if let Some(r) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) {
            r.outstanding = r.outstanding.saturating_sub(1);
            r.error.get_or_insert_with(|| {
                DeviceError::Io(std::io::Error::other("NVMe controller reset"))
            });
        }
        true
    }
}

/// Why a request stopped early.
enum Stop {
    /// The request failed; the queue is fine.
    Failed(DeviceError),
    /// The request failed and the controller must be reset first.
    NeedsReset(DeviceError),
}

/// An NVMe namespace as a `BlockDevice`, with one I/O queue pair per worker.
pub struct NvmeBlockDevice {
    uri: SpdkUri,
    namespace: NamespaceInfo,
    chunk_bytes: usize,
    options: NvmeOptions,
    /// Lock order: queues by index, then the controller.
    queues: Vec<Mutex<QueueState>>,
    controller: Mutex<Option<Controller>>,
    registers: Arc<Bar0>,
    resets: AtomicU64,
    retries: AtomicU64,
    io_timeout_ms: AtomicU64,
}

/// The caller's side of one request.
enum Data<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Read(d) => d.len(),
            Data::Write(d) => d.len(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NvmeBlockDevice {
    /// Opens the controller at `uri.address` via VFIO, brings it up, identifies the
    /// namespace and creates `options.io_queue_pairs` I/O queue pairs (one per worker).
    pub fn open(uri: SpdkUri, options: NvmeOptions) -> Result<NvmeBlockDevice, NvmeError> {
        let vfio = VfioDevice::open(uri.address)?;
        let copts = ControllerOptions {
            io_queue_pairs: options.io_queue_pairs.max(1),
            io_queue_entries: options.io_queue_entries,
            dma_backing: options.dma_backing,
        };
        let mut controller = Controller::open(vfio, copts)?;
        let namespace = controller.identify_namespace(uri.nsid)?;
        let pairs = controller.io_queue_pairs_allocated();
        let mut queues = Vec::with_capacity(pairs as usize);
        let mut chunk_bytes = 0;
        for qid in 1..=pairs {
            let queue = controller.create_io_queue(qid, namespace)?;
            let bs = namespace.block_size_bytes as usize;
            chunk_bytes = queue.max_transfer_bytes() / bs * bs;
            if chunk_bytes == 0 {
                return Err(NvmeError::Unsupported(format!(
                    "block size {bs} exceeds the transfer limit"
                )));
            }
            let count = options.bounce_count(chunk_bytes * pairs as usize, queue.capacity());
            let pool = (0..count)
                .map(|_| controller.alloc_dma(chunk_bytes, options.dma_backing))
                .collect::<Result<Vec<_>, _>>()?;
            queues.push(Mutex::new(QueueState {
                queue: Some(queue),
                pool_total: pool.len(),
                pool,
                reads: AsyncState::default(),
            }));
        }
        tracing::info!(
            "{uri}: {} blocks of {} bytes, {pairs} queue pair(s), {} KiB per command",
            namespace.block_count,
            namespace.block_size_bytes,
            chunk_bytes / 1024
        );
        Ok(NvmeBlockDevice {
            uri,
            namespace,
            chunk_bytes,
            queues,
            registers: controller.registers(),
            controller: Mutex::new(Some(controller)),
            resets: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            io_timeout_ms: AtomicU64::new(options.io_timeout_ms),
            options,
        })
    }

    pub fn namespace(&self) -> NamespaceInfo {
        self.namespace
    }

    /// I/O queue pairs in use.
    pub fn queue_pairs(&self) -> usize {
        self.queues.len()
    }

    /// Controller resets done so far (diagnostics).
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Commands resubmitted after a retryable error status so far (diagnostics).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Changes the deadline given to commands submitted from now on.
    pub fn set_io_timeout_ms(&self, timeout_ms: u64) {
        self.io_timeout_ms.store(timeout_ms, Ordering::Relaxed);
    }

    fn deadline_ns(&self) -> u64 {
        now_ns() + self.io_timeout_ms.load(Ordering::Relaxed) * 1_000_000
    }

    /// Resets the controller now (operator action or after an error seen elsewhere):
    /// waits for requests in progress, then recreates every queue pair.
    pub fn reset(&self) -> Result<(), DeviceError> {
        self.reset_controller(self.resets.load(Ordering::Acquire));
        if lock(&self.controller).is_none() {
            return Err(self.failed());
        }
        Ok(())
    }

    /// Normal shutdown (CC.SHN). Also done on drop; this form reports the outcome.
    pub fn shutdown(&self) -> Result<(), NvmeError> {
        let mut guards: Vec<_> = self.queues.iter().map(lock).collect();
        let queues: Vec<IoQueue> = guards.iter_mut().filter_map(|g| g.queue.take()).collect();
        match lock(&self.controller).take() {
            Some(c) => {
                c.shutdown(queues)?;
                tracing::info!("{}: controller shut down", self.uri);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The queue for the calling thread: the first free one starting from a per-thread
    /// home index, so each worker settles on its own queue; blocks on the home queue
    /// when all are busy.
    fn queue_for_thread(&self) -> MutexGuard<'_, QueueState> {
        let home = thread_home_index() % self.queues.len();
        for i in 0..self.queues.len() {
            if let Ok(g) = self.queues[(home + i) % self.queues.len()].try_lock() {
                return g;
            }
        }
        lock(&self.queues[home])
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DeviceError> {
        check_range(self.namespace, offset_bytes, len_bytes)
    }

    fn map_command_error(&self, e: CommandError, offset_bytes: u64, len_bytes: u64) -> DeviceError {
        map_command_error(self.uri, self.capacity_bytes(), e, offset_bytes, len_bytes)
    }

    fn failed(&self) -> DeviceError {
        DeviceError::Io(std::io::Error::other(format!(
            "{}: controller failed and could not be reset",
            self.uri
        )))
    }

    /// Resets the controller after a timeout / violation / fatal status seen when the
    /// reset count was `seen_resets`; if another thread reset it since, nothing is done.
    /// Outstanding buffers go back to their pools. If the reset fails, every queue is
    /// dropped and the device is failed for good.
    fn reset_controller(&self, seen_resets: u64) {
        let mut guards: Vec<_> = self.queues.iter().map(lock).collect();
        let mut controller = lock(&self.controller);
        if self.resets.load(Ordering::Acquire) != seen_resets {
            return;
        }
        let Some(ctrl) = controller.as_mut() else {
            return;
        };
        let mut queues: Vec<&mut IoQueue> =
            guards.iter_mut().filter_map(|g| g.queue.as_mut()).collect();
        let outcome = ctrl.reset(&mut queues);
        drop(queues);
        match outcome {
            Ok(lost) => {
                for (g, lost) in guards.iter_mut().zip(lost) {
                    let QueueState { pool, reads, .. } = &mut **g;
                    for (b, tag) in lost {
                        reads.lost(tag, b.is_some());
                        pool.extend(b);
                    }
                }
            }
            Err(e) => {
                tracing::error!("{}: controller reset failed: {e}; device failed", self.uri);
                guards.iter_mut().for_each(|g| g.queue = None);
                *controller = None;
            }
        }
        self.resets.fetch_add(1, Ordering::Release);
    }

    /// Runs one request on the caller's queue; resets the controller when needed.
    fn run(
        &self,
        op: IoOp,
        offset_bytes: u64,
        mut data: Option<Data<'_>>,
    ) -> Result<(), DeviceError> {
        let seen_resets = self.resets.load(Ordering::Acquire);
        let mut q = self.queue_for_thread();
        let outcome = match data.as_mut() {
            Some(d) => self.transfer(&mut q, op, offset_bytes, d),
            None => self.flush_on(&mut q),
        };
        drop(q);
        match outcome {
            Ok(()) => Ok(()),
            Err(Stop::Failed(e)) => Err(e),
            Err(Stop::NeedsReset(e)) => {
                self.reset_controller(seen_resets);
                Err(e)
            }
        }
    }

    /// Moves `data` through bounce buffers, as deep as the pool allows, one doorbell
    /// write per batch, reaping at most `max_completions_per_poll` per poll.
    fn transfer(
        &self,
        qs: &mut QueueState,
        op: IoOp,
        offset_bytes: u64,
        data: &mut Data<'_>,
    ) -> Result<(), Stop> {
        let len = data.len();
        let chunk = self.chunk_bytes;
        let QueueState {
            queue, pool, reads, ..
        } = qs;
        let queue = queue.as_mut().ok_or_else(|| Stop::Failed(self.failed()))?;
        let (mut next, mut outstanding) = (0usize, 0usize);
        let mut first_error: Option<DeviceError> = None;
        // Chunks whose command failed with a retryable status, with their buffer (still
        // holding the data for a write), and how often each chunk was retried.
        let mut retry: Vec<(usize, DmaBuffer)> = Vec::new();
        let mut retried: Vec<(usize, u32)> = Vec::new();
        let mut idle_since = Instant::now();
        while next < len || outstanding > 0 || (!retry.is_empty() && first_error.is_none()) {
            while first_error.is_none() {
                let Some((at, buf)) = retry.pop() else { break };
                match self.submit_chunk(queue, op, offset_bytes, at, chunk.min(len - at), buf) {
                    Ok(()) => outstanding += 1,
                    Err((e, b)) => {
                        pool.extend(b);
                        first_error = Some(DeviceError::Io(std::io::Error::other(e.to_string())));
                    }
                }
            }
            while next < len && first_error.is_none() {
                let Some(mut buf) = pool.pop() else { break };
                let n = chunk.min(len - next);
                if let Data::Write(src) = data {
                    buf.as_mut_slice()[..n].copy_from_slice(&src[next..next + n]);
                }
                match self.submit_chunk(queue, op, offset_bytes, next, n, buf) {
                    Ok(()) => {
                        outstanding += 1;
                        next += n;
                    }
                    Err((e, b)) => {
                        pool.extend(b);
                        if !matches!(e, NvmeError::Submit(SubmitError::Full)) {
                            first_error =
                                Some(DeviceError::Io(std::io::Error::other(e.to_string())));
                        }
                        break;
                    }
                }
            }
            queue.ring();
            if first_error.is_some() && outstanding == 0 {
                break;
            }
            let polled = queue.poll(self.options.max_completions_per_poll, |mut c| {
                if async_untag(c.tag).is_some() {
                    reads.reap(c);
                    return;
                }
                outstanding -= 1;
                let at = c.tag as usize;
                let n = chunk.min(len - at);
                match c.result {
                    Ok(_) if !c.after_timeout => {
                        if let (Data::Read(dst), Some(b)) = (&mut *data, &c.buffer) {
                            dst[at..at + n].copy_from_slice(&b.as_slice()[..n]);
                        }
                    }
                    Ok(_) => {}
                    Err(e)
                        if e.is_retryable()
                            && c.buffer.is_some()
                            && count_retry(&mut retried, at) =>
                    {
                        tracing::warn!(
                            "{}: {e} at byte {}; retrying",
                            self.uri,
                            offset_bytes + at as u64
                        );
                        self.retries.fetch_add(1, Ordering::Relaxed);
                        retry.extend(c.buffer.take().map(|b| (at, b)));
                    }
                    Err(e) => {
                        first_error.get_or_insert_with(|| {
                            self.map_command_error(e, offset_bytes + at as u64, n as u64)
                        });
                    }
                }
                pool.extend(c.buffer);
            });
            match polled {
                Ok(0) => self.check_stuck(queue, &mut idle_since)?,
                Ok(_) => idle_since = Instant::now(),
                Err(e) => return Err(self.violation(e)),
            }
        }
        pool.extend(retry.into_iter().map(|(_, b)| b));
        first_error.map_or(Ok(()), |e| Err(Stop::Failed(e)))
    }

    /// Submits the chunk at byte `at` of the request (`n` bytes) with its bounce buffer.
    fn submit_chunk(
        &self,
        queue: &mut IoQueue,
        op: IoOp,
        offset_bytes: u64,
        at: usize,
        n: usize,
        buf: DmaBuffer,
    ) -> Result<(), (NvmeError, Option<DmaBuffer>)> {
        let bs = self.namespace.block_size_bytes as u64;
        let lba = (offset_bytes + at as u64) / bs;
        let blocks = (n as u64 / bs) as u32;
        queue
            .submit(op, lba, blocks, Some(buf), at as u64, self.deadline_ns())
            .map(|_| ())
    }

    fn violation(&self, e: NvmeError) -> Stop {
        tracing::error!("{}: {e}", self.uri);
        Stop::NeedsReset(DeviceError::Io(std::io::Error::other(format!(
            "{}: {e}",
            self.uri
        ))))
    }

    /// Called when a poll found nothing: at most once per millisecond, looks for commands
    /// past their deadline and for a fatal or vanished controller.
    fn check_stuck(&self, queue: &mut IoQueue, idle_since: &mut Instant) -> Result<(), Stop> {
        if idle_since.elapsed().as_millis() < 1 {
            std::hint::spin_loop();
            return Ok(());
        }
        *idle_since = Instant::now();
        let timed_out = queue.expire(now_ns(), |_| {});
        let csts = ControllerStatus(self.registers.read32(reg::CSTS));
        let fatal = csts.fatal() || csts.is_all_ones();
        if timed_out == 0 && !fatal {
            return Ok(());
        }
        tracing::error!(
            "{}: {timed_out} command(s) timed out, CSTS {:#x}",
            self.uri,
            csts.0
        );
        Err(Stop::NeedsReset(if timed_out > 0 {
            DeviceError::Timeout
        } else {
            self.failed()
        }))
    }

    fn flush_on(&self, qs: &mut QueueState) -> Result<(), Stop> {
        let QueueState { queue, reads, .. } = qs;
        let queue = queue.as_mut().ok_or_else(|| Stop::Failed(self.failed()))?;
        let deadline = self.deadline_ns();
        queue
            .submit(IoOp::Flush, 0, 0, None, 0, deadline)
            .map_err(|(e, _)| {
                Stop::Failed(DeviceError::Io(std::io::Error::other(e.to_string())))
            })?;
        queue.ring();
        let mut idle_since = Instant::now();
        loop {
            let mut result = None;
            match queue.poll(self.options.max_completions_per_poll, |c| {
                if async_untag(c.tag).is_none() {
                    result = Some(c.result);
                } else {
                    reads.reap(c);
                }
            }) {
                Ok(0) => self.check_stuck(queue, &mut idle_since)?,
                Ok(_) => {}
                Err(e) => return Err(self.violation(e)),
            }
            if let Some(r) = result {
                return r
                    .map(|_| ())
                    .map_err(|e| Stop::Failed(self.map_command_error(e, 0, 0)));
            }
        }
    }
}

/// Requests must be whole blocks inside the namespace.
fn check_range(ns: NamespaceInfo, offset_bytes: u64, len_bytes: u64) -> Result<(), DeviceError> {
    let bs = ns.block_size_bytes;
    if !offset_bytes.is_multiple_of(bs as u64) || !len_bytes.is_multiple_of(bs as u64) {
        return Err(DeviceError::Misaligned {
            offset_bytes,
            len_bytes,
            align_bytes: bs as u64,
        });
    }
    let capacity_bytes = ns.block_count * bs as u64;
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

/// An NVMe error status as the engine's `DeviceError`.
fn map_command_error(
    uri: SpdkUri,
    capacity_bytes: u64,
    e: CommandError,
    offset_bytes: u64,
    len_bytes: u64,
) -> DeviceError {
    match e.class() {
        ErrorClass::OutOfRange => DeviceError::OutOfRange {
            offset_bytes,
            len_bytes,
            capacity_bytes,
        },
        ErrorClass::Media => DeviceError::Media(format!("{uri}: {e} at byte {offset_bytes}")),
        _ => DeviceError::Io(std::io::Error::other(format!("{uri}: {e}"))),
    }
}

/// Resubmissions allowed per chunk for statuses with DNR clear.
pub const RETRIES_PER_COMMAND_MAX: u32 = 2;

/// Records one more retry of the chunk at `at`; false once it used up its retries.
fn count_retry(retried: &mut Vec<(usize, u32)>, at: usize) -> bool {
    match retried.iter_mut().find(|(a, _)| *a == at) {
        Some((_, n)) if *n >= RETRIES_PER_COMMAND_MAX => false,
        Some((_, n)) => {
            *n += 1;
            true
        }
        None => {
            retried.push((at, 1));
            true
        }
    }
}

/// A small per-thread number, handed out in order of first use, so workers spread over
/// the queue pairs.
fn thread_home_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HOME: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    HOME.with(|h| *h)
}

impl BlockDevice for NvmeBlockDevice {
    fn sector_size_bytes(&self) -> u32 {
        self.namespace.block_size_bytes
    }
    fn capacity_bytes(&self) -> u64 {
        self.namespace.block_count * self.namespace.block_size_bytes as u64
    }
    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        self.check_range(offset_bytes, buf.len() as u64)?;
        self.run(
            IoOp::Read,
            offset_bytes,
            Some(Data::Read(buf.as_mut_slice())),
        )
    }
    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.check_range(offset_bytes, buf.len() as u64)?;
        self.run(IoOp::Write, offset_bytes, Some(Data::Write(buf.as_slice())))
    }
    fn sync(&self) -> Result<(), DeviceError> {
        self.run(IoOp::Flush, 0, None)
    }
    fn describe(&self) -> String {
        self.uri.to_string()
    }
    fn async_reads(&self) -> Option<&dyn AsyncReads> {
        Some(self)
    }
}

/// The worker loop's asynchronous reads (see `docs/nvme.md`, "Asynchronous reads"): a
/// thread submits to and polls its home queue only (`thread_home_index` modulo the queue
/// count — each worker its own queue pair when there are as many as workers), so nothing
/// waits for the device. Bounds: `ASYNC_READS_PER_QUEUE_MAX` reads per queue; commands
/// in flight for them at most the queue's capacity and the bounce buffers less
/// `sync_reserve`; at most `max_completions_per_poll` completions reaped per poll.
impl AsyncReads for NvmeBlockDevice {
    fn submit_read(&self, token: u64, offset_bytes: u64, len_bytes: usize) {
        let owner = thread_home_index();
        let mut q = lock(&self.queues[owner % self.queues.len()]);
        let error = if len_bytes > ASYNC_READ_BYTES_MAX {
            Some(DeviceError::Io(std::io::Error::other(format!(
                "{}: asynchronous read of {len_bytes} bytes is too long",
                self.uri
            ))))
        } else {
            self.check_range(offset_bytes, len_bytes as u64).err()
        };
        let failed = error.is_some();
        let read = AsyncRead {
            owner,
            token,
            offset_bytes,
            len_bytes,
            next: if failed { len_bytes } else { 0 },
            outstanding: 0,
            retries: 0,
            error,
        };
        match q.reads.insert(read) {
            Some(slot) if !failed && len_bytes > 0 => {
                q.reads.waiting.push_back(slot);
                self.start_async(&mut q);
            }
            Some(_) => {}
            None => {
                // No slot: the read fails, reported at the owner's next poll.
                tracing::error!(
                    "{}: more than {ASYNC_READS_PER_QUEUE_MAX} asynchronous reads on one queue",
                    self.uri
                );
                q.reads.refused.push((owner, token));
            }
        }
    }

    fn poll_reads(&self, on_event: &mut dyn FnMut(ReadEvent<'_>)) -> usize {
        let owner = thread_home_index();
        let seen_resets = self.resets.load(Ordering::Acquire);
        let mut q = lock(&self.queues[owner % self.queues.len()]);
        let mut needs_reset = false;
        if q.queue.is_some() {
            self.start_async(&mut q);
            let QueueState { queue, reads, .. } = &mut *q;
            if let Some(queue) = queue.as_mut() {
                if reads.in_flight > 0 {
                    match queue.poll(self.options.max_completions_per_poll, |c| {
                        reads.reap(c);
                    }) {
                        Ok(0) => needs_reset = self.async_stuck(queue, reads),
                        Ok(_) => reads.last_check = None,
                        Err(e) => {
                            tracing::error!("{}: {e}", self.uri);
                            needs_reset = true;
                        }
                    }
                }
            }
        } else {
            // The device failed: every read of ours ends with that error.
            let err = || self.failed();
            for r in q.reads.slots.iter_mut().flatten() {
                if r.owner == owner {
                    r.outstanding = 0;
                    r.error.get_or_insert_with(err);
                }
            }
        }
        let events = self.deliver_async(&mut q, owner, on_event);
        if q.queue.is_some() {
            self.start_async(&mut q);
        }
        drop(q);
        if needs_reset {
            self.reset_controller(seen_resets);
        }
        events
    }

    fn reads_outstanding(&self) -> usize {
        let owner = thread_home_index();
        let q = lock(&self.queues[owner % self.queues.len()]);
        q.reads
            .slots
            .iter()
            .flatten()
            .filter(|r| r.owner == owner)
            .count()
    }
}

impl NvmeBlockDevice {
    /// Submits what fits of the queue's waiting asynchronous reads (retries first), then
    /// rings the doorbell once.
    fn start_async(&self, qs: &mut QueueState) {
        let QueueState {
            queue,
            pool,
            pool_total,
            reads,
        } = qs;
        let Some(queue) = queue.as_mut() else {
            return;
        };
        let limit = pool_total.saturating_sub(sync_reserve(*pool_total));
        let bs = self.namespace.block_size_bytes as u64;
        let mut submitted = false;
        while let Some((slot, at, buf)) = reads.retry.pop() {
            let Some(r) = reads.slots[slot as usize].as_mut() else {
                reads.held -= 1;
                pool.push(buf);
                continue;
            };
            let n = self.chunk_bytes.min(r.len_bytes - at);
            let lba = (r.offset_bytes + at as u64) / bs;
            match queue.submit(
                IoOp::Read,
                lba,
                (n as u64 / bs) as u32,
                Some(buf),
                async_tag(slot, at),
                self.deadline_ns(),
            ) {
                Ok(_) => {
                    reads.in_flight += 1;
                    submitted = true;
                }
                Err((e, b)) => {
                    r.outstanding -= 1;
                    reads.held -= b.is_some() as usize;
                    pool.extend(b);
                    r.error.get_or_insert_with(|| {
                        DeviceError::Io(std::io::Error::other(e.to_string()))
                    });
                }
            }
        }
        'reads: while let Some(&slot) = reads.waiting.front() {
            while let Some(r) = reads.slots[slot as usize].as_mut() {
                if r.next >= r.len_bytes || r.error.is_some() {
                    break;
                }
                if reads.held >= limit || queue.in_flight() >= queue.capacity() {
                    break 'reads;
                }
                let Some(buf) = pool.pop() else {
                    break 'reads;
                };
                let at = r.next;
                let n = self.chunk_bytes.min(r.len_bytes - at);
                let lba = (r.offset_bytes + at as u64) / bs;
                match queue.submit(
                    IoOp::Read,
                    lba,
                    (n as u64 / bs) as u32,
                    Some(buf),
                    async_tag(slot, at),
                    self.deadline_ns(),
                ) {
                    Ok(_) => {
                        r.next += n;
                        r.outstanding += 1;
                        reads.held += 1;
                        reads.in_flight += 1;
                        submitted = true;
                    }
                    Err((NvmeError::Submit(SubmitError::Full), b)) => {
                        pool.extend(b);
                        break 'reads;
                    }
                    Err((e, b)) => {
                        pool.extend(b);
                        r.error.get_or_insert_with(|| {
                            DeviceError::Io(std::io::Error::other(e.to_string()))
                        });
                    }
                }
            }
            reads.waiting.pop_front();
        }
        if submitted {
            queue.ring();
        }
    }

    /// Handles the reaped completions of `owner`'s reads (data out, buffers back, retries
    /// queued) and reports every read of `owner` that is over.
    fn deliver_async(
        &self,
        qs: &mut QueueState,
        owner: usize,
        on_event: &mut dyn FnMut(ReadEvent<'_>),
    ) -> usize {
        let QueueState { pool, reads, .. } = qs;
        let mut events = 0;
        let mut i = 0;
        let mut touched: Vec<u32> = Vec::new();
        while i < reads.reaped.len() {
            let slot = reads.reaped[i].slot;
            let Some(r) = reads.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
                let c = reads.reaped.swap_remove(i);
                reads.held -= c.buffer.is_some() as usize;
                pool.extend(c.buffer);
                continue;
            };
            if r.owner != owner {
                i += 1;
                continue;
            }
            let mut c = reads.reaped.swap_remove(i);
            let n = self.chunk_bytes.min(r.len_bytes - c.at);
            match &c.result {
                Ok(_) if c.after_timeout => {
                    r.error.get_or_insert(DeviceError::Timeout);
                }
                Ok(_) => {
                    if let (Some(b), None) = (&c.buffer, &r.error) {
                        on_event(ReadEvent::Data {
                            token: r.token,
                            at: c.at,
                            bytes: &b.as_slice()[..n],
                        });
                        events += 1;
                    }
                }
                Err(e)
                    if e.is_retryable()
                        && c.buffer.is_some()
                        && r.error.is_none()
                        && r.retries
                            < RETRIES_PER_COMMAND_MAX
                                * r.len_bytes.div_ceil(self.chunk_bytes) as u32 =>
                {
                    tracing::warn!(
                        "{}: {e} at byte {}; retrying",
                        self.uri,
                        r.offset_bytes + c.at as u64
                    );
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    r.retries += 1;
                    if let Some(b) = c.buffer.take() {
                        reads.retry.push((slot, c.at, b));
                    }
                    continue;
                }
                Err(e) => {
                    let e = *e;
                    let at = r.offset_bytes + c.at as u64;
                    r.error
                        .get_or_insert_with(|| self.map_command_error(e, at, n as u64));
                }
            }
            r.outstanding = r.outstanding.saturating_sub(1);
            reads.held -= c.buffer.is_some() as usize;
            pool.extend(c.buffer);
            if !touched.contains(&slot) {
                touched.push(slot);
            }
        }
        // Reads that were failed without a completion (submission refused, a reset, a
        // failed device) are over too.
        for (slot, r) in reads.slots.iter().enumerate() {
            if let Some(r) = r {
                if r.owner == owner && r.finished() && !touched.contains(&(slot as u32)) {
                    touched.push(slot as u32);
                }
            }
        }
        let mut k = 0;
        while k < reads.refused.len() {
            if reads.refused[k].0 != owner {
                k += 1;
                continue;
            }
            let (_, token) = reads.refused.swap_remove(k);
            on_event(ReadEvent::Done {
                token,
                result: Err(DeviceError::Io(std::io::Error::other(format!(
                    "{}: too many asynchronous reads",
                    self.uri
                )))),
            });
            events += 1;
        }
        for slot in touched {
            let over = reads.slots[slot as usize]
                .as_ref()
                .is_some_and(|r| r.finished());
            if !over {
                continue;
            }
            if let Some(r) = reads.slots[slot as usize].take() {
                reads.free.push(slot);
                on_event(ReadEvent::Done {
                    token: r.token,
                    result: r.error.map_or(Ok(()), Err),
                });
                events += 1;
            }
        }
        events
    }

    /// A poll found nothing while asynchronous reads are on the device: at most once per
    /// millisecond, looks for overdue commands and a fatal or vanished controller. True:
    /// reset the controller (the reads in flight then fail).
    fn async_stuck(&self, queue: &mut IoQueue, reads: &mut AsyncState) -> bool {
        let now = Instant::now();
        match reads.last_check {
            Some(t) if now.duration_since(t).as_millis() < 1 => return false,
            Some(_) => {}
            None => {
                reads.last_check = Some(now);
                return false;
            }
        }
        reads.last_check = Some(now);
        let timed_out = queue.expire(now_ns(), |_| {});
        let csts = ControllerStatus(self.registers.read32(reg::CSTS));
        let fatal = csts.fatal() || csts.is_all_ones();
        if timed_out == 0 && !fatal {
            return false;
        }
        tracing::error!(
            "{}: {timed_out} command(s) timed out, CSTS {:#x} (asynchronous reads)",
            self.uri,
            csts.0
        );
        true
    }
}

impl Drop for NvmeBlockDevice {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("{}: shutdown: {e}", self.uri);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the spdk:// URI syntax: BDF and namespace parsed, display round-trips, bad forms rejected.
    #[test]
    fn spdk_uri_parse() {
        let u: SpdkUri = "spdk://0000:00:04.0/1".parse().unwrap();
        assert_eq!(u.nsid, 1);
        assert_eq!(u.address.device, 4);
        assert_eq!(u.to_string(), "spdk://0000:00:04.0/1");
        assert!(SpdkUri::is_spdk("spdk://x") && !SpdkUri::is_spdk("/var/lib/lavik/data"));
        for bad in [
            "0000:00:04.0/1",
            "spdk://0000:00:04.0",
            "spdk://0000:00:04.0/0",
            "spdk://0000:00:04.0/x",
            "spdk://zz/1",
        ] {
            assert!(bad.parse::<SpdkUri>().is_err(), "{bad}");
        }
    }

    // Proves requests are checked for block alignment and namespace bounds, overflow included.
    #[test]
    fn range_and_alignment_checks() {
        let ns = NamespaceInfo {
            nsid: 1,
            block_size_bytes: 4096,
            block_count: 100,
        };
        assert!(check_range(ns, 0, 4096).is_ok());
        assert!(check_range(ns, 99 * 4096, 4096).is_ok());
        assert!(matches!(
            check_range(ns, 99 * 4096, 8192),
            Err(DeviceError::OutOfRange {
                capacity_bytes: 409_600,
                ..
            })
        ));
        assert!(matches!(
            check_range(ns, 512, 4096),
            Err(DeviceError::Misaligned {
                align_bytes: 4096,
                ..
            })
        ));
        assert!(matches!(
            check_range(ns, 0, 1000),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            check_range(ns, u64::MAX - 4095, 8192),
            Err(DeviceError::OutOfRange { .. })
        ));
    }

    // Proves NVMe statuses map to the engine's error kinds: range, media, everything else I/O.
    #[test]
    fn command_errors_map_to_device_errors() {
        use crate::nvme::spec::{Status, StatusCodeType};
        let uri: SpdkUri = "spdk://0000:00:04.0/1".parse().unwrap();
        let err = |sct, sc| CommandError {
            status: Status {
                code_type: sct,
                code: sc,
                retry_delay: 0,
                more: false,
                do_not_retry: true,
            },
        };
        let range = map_command_error(uri, 1 << 20, err(StatusCodeType::Generic, 0x80), 4096, 512);
        assert!(matches!(
            range,
            DeviceError::OutOfRange {
                offset_bytes: 4096,
                len_bytes: 512,
                capacity_bytes: 1_048_576
            }
        ));
        match map_command_error(
            uri,
            1 << 20,
            err(StatusCodeType::MediaAndDataIntegrity, 0x81),
            8192,
            512,
        ) {
            DeviceError::Media(m) => assert!(
                m.contains("UnrecoveredReadError") && m.contains("8192"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        let io = map_command_error(uri, 1 << 20, err(StatusCodeType::Generic, 0x06), 0, 512);
        assert!(
            matches!(io, DeviceError::Io(ref e) if e.to_string().contains("InternalError")),
            "{io:?}"
        );
    }

    // Proves each chunk gets exactly RETRIES_PER_COMMAND_MAX retries, independently.
    #[test]
    fn retry_budget_per_chunk() {
        let mut r = Vec::new();
        for _ in 0..RETRIES_PER_COMMAND_MAX {
            assert!(count_retry(&mut r, 4096));
        }
        assert!(!count_retry(&mut r, 4096));
        assert!(count_retry(&mut r, 0), "another chunk has its own budget");
    }

    // Proves data-file lists are validated before any device is opened: bad syntax,
    // two namespaces of one controller, and an empty list are refused.
    #[test]
    fn data_file_list_validation() {
        let ok =
            parse_spdk_data_files(&["spdk://0000:00:04.0/1", "spdk://0000:00:05.0/1"]).unwrap();
        assert_eq!(ok.len(), 2);
        let dup = parse_spdk_data_files(&["spdk://0000:00:04.0/1", "spdk://00:04.0/2"]);
        assert!(matches!(dup, Err(NvmeError::Unsupported(_))));
        assert!(matches!(
            parse_spdk_data_files(&["/data/file"]),
            Err(NvmeError::Invalid(_))
        ));
        assert!(matches!(
            parse_spdk_data_files(&[]),
            Err(NvmeError::Invalid(_))
        ));
        assert!(open_spdk_data_files(&["spdk://0000:00:04.0/0"], &NvmeOptions::default()).is_err());
    }

    // Proves BYCORF_* handling: --no-huge selects locked pages, memory bounds the bounce pool.
    #[test]
    fn options_from_bycorf_vars() {
        let o = NvmeOptions::from_vars(Some("-l 0-1 --no-huge"), Some("8"));
        assert_eq!(o.dma_backing, DmaBacking::Locked4k);
        assert_eq!(o.dma_memory_mb, Some(8));
        // 8 MiB, half for bounce buffers, 512 KiB each → 8.
        assert_eq!(o.bounce_count(512 * 1024, 63), 8);
        assert_eq!(
            o.bounce_count(512 * 1024, 3),
            3,
            "never more than the queue holds"
        );
        let d = NvmeOptions::from_vars(None, Some("lots"));
        assert_eq!(
            (d.dma_backing, d.dma_memory_mb),
            (DmaBacking::Hugepages, None)
        );
        assert_eq!(d.max_completions_per_poll, 8);
        assert_eq!(d.bounce_count(2 << 20, 63), DEFAULT_BOUNCE_BUFFERS);
    }

    // Proves asynchronous reads' tags round-trip (slot, chunk offset), never collide with
    // a synchronous request's tag (its byte offset), and that the reserve leaves the
    // synchronous path at least one bounce buffer.
    #[test]
    fn async_tags_and_reserve() {
        for (slot, at) in [(0u32, 0usize), (1, 4096), (1023, (1 << 31) - 4096)] {
            assert_eq!(async_untag(async_tag(slot, at)), Some((slot, at)));
        }
        assert_eq!(async_untag(0), None);
        assert_eq!(async_untag((5 << 20) + 4096), None);
        const { assert!(ASYNC_READ_BYTES_MAX < 1 << 32) };
        assert_eq!(sync_reserve(1), 1);
        assert_eq!(sync_reserve(16), 4);
        for total in 1..64 {
            assert!(sync_reserve(total) >= 1 && sync_reserve(total) <= total);
        }
    }

    // Proves the bookkeeping of a read whose command is lost in a reset: the read fails,
    // nothing stays counted as in flight or held, and a synchronous tag is not taken for one.
    #[test]
    fn async_read_lost_in_reset_fails() {
        let mut st = AsyncState::default();
        let slot = st
            .insert(AsyncRead {
                owner: 3,
                token: 7,
                offset_bytes: 0,
                len_bytes: 8192,
                next: 8192,
                outstanding: 1,
                retries: 0,
                error: None,
            })
            .unwrap();
        st.held = 1;
        st.in_flight = 1;
        assert!(!st.lost(4096, true), "a synchronous request's tag");
        assert!(st.lost(async_tag(slot, 0), true));
        assert_eq!((st.held, st.in_flight), (0, 0));
        let r = st.slots[slot as usize].as_ref().unwrap();
        assert!(r.finished() && r.error.is_some());
    }

    // Proves the slot bound: reads beyond ASYNC_READS_PER_QUEUE_MAX are refused, and a
    // freed slot is reused.
    #[test]
    fn async_slots_are_bounded() {
        let mut st = AsyncState::default();
        let read = |token| AsyncRead {
            owner: 0,
            token,
            offset_bytes: 0,
            len_bytes: 4096,
            next: 0,
            outstanding: 0,
            retries: 0,
            error: None,
        };
        for t in 0..ASYNC_READS_PER_QUEUE_MAX as u64 {
            assert!(st.insert(read(t)).is_some());
        }
        assert!(st.insert(read(9999)).is_none());
        st.slots[5] = None;
        st.free.push(5);
        assert_eq!(st.insert(read(9999)), Some(5));
    }
}
