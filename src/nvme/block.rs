//! `NvmeBlockDevice`: the `BlockDevice` backend on the userspace driver, and the
//! `spdk://BDF/NSID` data-file syntax.
//!
//! One controller, one namespace, one I/O queue pair per device object, behind a mutex
//! (the engine's `BlockDevice` is synchronous and `&self`). A request is split into
//! commands of at most the controller's transfer limit, staged through a pool of DMA
//! bounce buffers (the caller's `AlignedBuf` is not IOMMU-mapped), submitted as deep as
//! the pool allows with one doorbell write per batch, and reaped by polling — at most
//! `max_completions_per_poll` completions per poll call, as the worker loop will do.
//!
//! Failure policy: an error status fails the request with a typed `DeviceError`; a
//! timeout, a protocol violation or a fatal controller status resets the controller
//! (recreating the queue) and fails the request; if the reset itself fails the device
//! is marked failed and every later request returns an I/O error.
use std::sync::Mutex;
use std::time::Instant;

use super::controller::{now_ns, Controller, ControllerOptions, IoOp, IoQueue, NamespaceInfo};
use super::queue::{CommandError, ErrorClass, SubmitError};
use super::vfio::{DmaBacking, DmaBuffer, PciAddress, VfioDevice};
use super::NvmeError;
use crate::device::{AlignedBuf, BlockDevice, DeviceError};

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

struct Inner {
    controller: Option<Controller>,
    queue: Option<IoQueue>,
    pool: Vec<DmaBuffer>,
}

/// An NVMe namespace as a `BlockDevice`.
pub struct NvmeBlockDevice {
    uri: SpdkUri,
    namespace: NamespaceInfo,
    chunk_bytes: usize,
    options: NvmeOptions,
    inner: Mutex<Inner>,
}

/// The caller's side of one request.
enum Data<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl NvmeBlockDevice {
    /// Opens the controller at `uri.address` via VFIO, brings it up, identifies the
    /// namespace and creates one I/O queue pair.
    pub fn open(uri: SpdkUri, options: NvmeOptions) -> Result<NvmeBlockDevice, NvmeError> {
        let vfio = VfioDevice::open(uri.address)?;
        let copts = ControllerOptions {
            io_queue_pairs: 1,
            io_queue_entries: options.io_queue_entries,
            dma_backing: options.dma_backing,
        };
        let mut controller = Controller::open(vfio, copts)?;
        let namespace = controller.identify_namespace(uri.nsid)?;
        let queue = controller.create_io_queue(1, namespace)?;
        let bs = namespace.block_size_bytes as usize;
        let chunk_bytes = queue.max_transfer_bytes() / bs * bs;
        if chunk_bytes == 0 {
            return Err(NvmeError::Unsupported(format!(
                "block size {bs} exceeds the transfer limit"
            )));
        }
        let count = options.bounce_count(chunk_bytes, queue.capacity());
        let pool = (0..count)
            .map(|_| controller.alloc_dma(chunk_bytes, options.dma_backing))
            .collect::<Result<Vec<_>, _>>()?;
        tracing::info!(
            "{uri}: {} blocks of {} bytes, {} bounce buffers of {} KiB",
            namespace.block_count,
            namespace.block_size_bytes,
            count,
            chunk_bytes / 1024
        );
        Ok(NvmeBlockDevice {
            uri,
            namespace,
            chunk_bytes,
            options,
            inner: Mutex::new(Inner {
                controller: Some(controller),
                queue: Some(queue),
                pool,
            }),
        })
    }

    pub fn namespace(&self) -> NamespaceInfo {
        self.namespace
    }

    /// Normal shutdown (CC.SHN). Also done on drop; this form reports the outcome.
    pub fn shutdown(&self) -> Result<(), NvmeError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let queue = inner.queue.take();
        match inner.controller.take() {
            Some(c) => c.shutdown(queue.into_iter().collect()),
            None => Ok(()),
        }
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DeviceError> {
        let bs = self.namespace.block_size_bytes;
        if !offset_bytes.is_multiple_of(bs as u64) || !len_bytes.is_multiple_of(bs as u64) {
            return Err(DeviceError::Misaligned {
                offset_bytes,
                len_bytes,
                sector_size_bytes: bs,
            });
        }
        let capacity_bytes = self.capacity_bytes();
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

    fn map_command_error(&self, e: CommandError, offset_bytes: u64, len_bytes: u64) -> DeviceError {
        match e.class() {
            ErrorClass::OutOfRange => DeviceError::OutOfRange {
                offset_bytes,
                len_bytes,
                capacity_bytes: self.capacity_bytes(),
            },
            ErrorClass::Media => {
                DeviceError::Media(format!("{}: {e} at byte {offset_bytes}", self.uri))
            }
            _ => DeviceError::Io(std::io::Error::other(format!("{}: {e}", self.uri))),
        }
    }

    fn failed(&self) -> DeviceError {
        DeviceError::Io(std::io::Error::other(format!(
            "{}: controller failed and could not be reset",
            self.uri
        )))
    }

    /// Resets the controller after a timeout/violation/fatal status; buffers the device
    /// owned come back to the pool. On failure the device is left failed.
    fn recover(&self, inner: &mut Inner) {
        let (Some(ctrl), Some(queue)) = (inner.controller.as_mut(), inner.queue.as_mut()) else {
            return;
        };
        match ctrl.reset(&mut [queue]) {
            Ok(lost) => inner.pool.extend(lost.into_iter().filter_map(|(b, _)| b)),
            Err(e) => {
                tracing::error!("{}: controller reset failed: {e}; device failed", self.uri);
                inner.controller = None;
                inner.queue = None;
            }
        }
    }

    /// Runs one read or write request to completion.
    fn transfer(&self, offset_bytes: u64, mut data: Data<'_>) -> Result<(), DeviceError> {
        let len = match &data {
            Data::Read(d) => d.len(),
            Data::Write(d) => d.len(),
        };
        self.check_range(offset_bytes, len as u64)?;
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *guard;
        let bs = self.namespace.block_size_bytes as u64;
        let op = if matches!(data, Data::Read(_)) {
            IoOp::Read
        } else {
            IoOp::Write
        };
        let mut next = 0usize;
        let mut outstanding = 0usize;
        let mut first_error: Option<DeviceError> = None;
        let mut idle_since = Instant::now();
        while next < len || outstanding > 0 {
            let Some(queue) = inner.queue.as_mut() else {
                return Err(self.failed());
            };
            // Submit as deep as bounce buffers and queue slots allow; one doorbell.
            while next < len && first_error.is_none() {
                let Some(mut buf) = inner.pool.pop() else {
                    break;
                };
                let n = self.chunk_bytes.min(len - next);
                if let Data::Write(src) = &data {
                    buf.as_mut_slice()[..n].copy_from_slice(&src[next..next + n]);
                }
                let lba = (offset_bytes + next as u64) / bs;
                let deadline = now_ns() + self.options.io_timeout_ms * 1_000_000;
                match queue.submit(
                    op,
                    lba,
                    (n as u64 / bs) as u32,
                    Some(buf),
                    next as u64,
                    deadline,
                ) {
                    Ok(_) => {
                        outstanding += 1;
                        next += n;
                    }
                    Err((e, b)) => {
                        inner.pool.extend(b);
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
            let chunk = self.chunk_bytes;
            let pool = &mut inner.pool;
            let polled = queue.poll(self.options.max_completions_per_poll, |c| {
                outstanding -= 1;
                let at = c.tag as usize;
                let n = chunk.min(len - at);
                match c.result {
                    Ok(_) if !c.after_timeout => {
                        if let (Data::Read(dst), Some(b)) = (&mut data, &c.buffer) {
                            dst[at..at + n].copy_from_slice(&b.as_slice()[..n]);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        first_error.get_or_insert_with(|| {
                            self.map_command_error(e, offset_bytes + at as u64, n as u64)
                        });
                    }
                }
                pool.extend(c.buffer);
            });
            match polled {
                Ok(0) => {}
                Ok(_) => {
                    idle_since = Instant::now();
                    continue;
                }
                Err(e) => {
                    tracing::error!("{}: {e}", self.uri);
                    self.recover(inner);
                    return Err(DeviceError::Io(std::io::Error::other(e.to_string())));
                }
            }
            if let Some(err) = self.check_stuck(inner, &mut idle_since) {
                return Err(err);
            }
            std::hint::spin_loop();
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Called when a poll found nothing: detects timeouts and fatal controller status
    /// (checked at most once per millisecond) and resets the controller for them.
    fn check_stuck(&self, inner: &mut Inner, idle_since: &mut Instant) -> Option<DeviceError> {
        if idle_since.elapsed().as_millis() < 1 {
            return None;
        }
        *idle_since = Instant::now();
        let queue = inner.queue.as_mut()?;
        let timed_out = queue.expire(now_ns(), |_| {});
        let fatal = inner
            .controller
            .as_ref()
            .is_some_and(|c| c.status().fatal() || c.status().is_all_ones());
        if timed_out == 0 && !fatal {
            return None;
        }
        tracing::error!(
            "{}: {timed_out} command(s) timed out, fatal status {fatal}",
            self.uri
        );
        self.recover(inner);
        Some(if timed_out > 0 {
            DeviceError::Timeout
        } else {
            self.failed()
        })
    }

    fn flush(&self) -> Result<(), DeviceError> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *guard;
        let deadline = now_ns() + self.options.io_timeout_ms * 1_000_000;
        let queue = inner.queue.as_mut().ok_or_else(|| self.failed())?;
        queue
            .submit(IoOp::Flush, 0, 0, None, 0, deadline)
            .map_err(|(e, _)| DeviceError::Io(std::io::Error::other(e.to_string())))?;
        queue.ring();
        let mut idle_since = Instant::now();
        loop {
            let queue = inner.queue.as_mut().ok_or_else(|| self.failed())?;
            let mut result = None;
            match queue.poll(self.options.max_completions_per_poll, |c| {
                result = Some(c.result)
            }) {
                Ok(_) => {}
                Err(e) => {
                    self.recover(inner);
                    return Err(DeviceError::Io(std::io::Error::other(e.to_string())));
                }
            }
            if let Some(r) = result {
                return r.map(|_| ()).map_err(|e| self.map_command_error(e, 0, 0));
            }
            if let Some(err) = self.check_stuck(inner, &mut idle_since) {
                return Err(err);
            }
            std::hint::spin_loop();
        }
    }
}

impl BlockDevice for NvmeBlockDevice {
    fn sector_size_bytes(&self) -> u32 {
        self.namespace.block_size_bytes
    }
    fn capacity_bytes(&self) -> u64 {
        self.namespace.block_count * self.namespace.block_size_bytes as u64
    }
    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        self.transfer(offset_bytes, Data::Read(buf.as_mut_slice()))
    }
    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.transfer(offset_bytes, Data::Write(buf.as_slice()))
    }
    fn sync(&self) -> Result<(), DeviceError> {
        self.flush()
    }
    fn describe(&self) -> String {
        self.uri.to_string()
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
}
