//! `GatedDevice`: a test stand-in for the userspace NVMe driver's asynchronous reads
//! (`--debug-async-device-hold PATH`, hidden). It wraps a `FileDevice` and hides its file
//! descriptor, so the worker reads it the way it reads an NVMe namespace: through
//! `AsyncReads`, submitted in one round and reaped by polling in later ones. While the file
//! `hold` exists no read completes: asynchronous reads stay queued (as commands would on a
//! slow NVMe queue) and a synchronous read waits for the file to go (the worker stalls, as
//! it would on a device read that busy-polls). Writes and syncs are never held.
//!
//! A test creates the hold file, sends a GET that needs the device, checks that another
//! connection of the same worker is served meanwhile, then removes the file: no clock is
//! involved in what passes.
use super::{
    AlignedBuf, AsyncReads, BlockDevice, DeviceError, FileDevice, ReadEvent, IO_ALIGN_BYTES,
};
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;
use std::thread::ThreadId;

/// Reads submitted and not yet reported, per submitting thread: (token, offset, len).
type Queued = HashMap<ThreadId, Vec<(u64, u64, usize)>>;

pub struct GatedDevice {
    inner: FileDevice,
    hold: PathBuf,
    queued: Mutex<Queued>,
}

impl GatedDevice {
    pub fn new(inner: FileDevice, hold: PathBuf) -> GatedDevice {
        GatedDevice {
            inner,
            hold,
            queued: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> bool {
        self.hold.exists()
    }

    fn wait_released(&self) {
        while self.held() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl BlockDevice for GatedDevice {
    fn sector_size_bytes(&self) -> u32 {
        self.inner.sector_size_bytes()
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        self.wait_released();
        self.inner.read_at(offset_bytes, buf)
    }
    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.inner.write_at(offset_bytes, buf)
    }
    fn sync(&self) -> Result<(), DeviceError> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        format!(
            "{} (held while {} exists)",
            self.inner.describe(),
            self.hold.display()
        )
    }
    fn write_range_at(
        &self,
        offset_bytes: u64,
        buf: &AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        self.inner.write_range_at(offset_bytes, buf, range)
    }
    fn read_range_at(
        &self,
        offset_bytes: u64,
        buf: &mut AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        self.wait_released();
        self.inner.read_range_at(offset_bytes, buf, range)
    }
    fn async_reads(&self) -> Option<&dyn AsyncReads> {
        Some(self)
    }
    fn can_grow(&self) -> bool {
        self.inner.can_grow()
    }
    fn reserve_to(&self, capacity_bytes: u64) -> Result<(), DeviceError> {
        self.inner.reserve_to(capacity_bytes)
    }
    fn grow_to(&self, capacity_bytes: u64) -> Result<(), DeviceError> {
        self.inner.grow_to(capacity_bytes)
    }
    fn free_space_bytes(&self) -> Option<u64> {
        self.inner.free_space_bytes()
    }
}

impl AsyncReads for GatedDevice {
    fn submit_read(&self, token: u64, offset_bytes: u64, len_bytes: usize) {
        self.queued()
            .entry(std::thread::current().id())
            .or_default()
            .push((token, offset_bytes, len_bytes));
    }

    fn poll_reads(&self, on_event: &mut dyn FnMut(ReadEvent<'_>)) -> usize {
        let me = std::thread::current().id();
        if self.queued().get(&me).is_none_or(|q| q.is_empty()) || self.held() {
            return 0;
        }
        let todo = self.queued().remove(&me).unwrap_or_default();
        let mut events = 0;
        for (token, offset_bytes, len_bytes) in todo {
            let mut buf = AlignedBuf::new_zeroed(len_bytes.max(IO_ALIGN_BYTES));
            let result = self
                .inner
                .read_range_at(offset_bytes, &mut buf, 0..len_bytes);
            if result.is_ok() {
                on_event(ReadEvent::Data {
                    token,
                    at: 0,
                    bytes: &buf.as_slice()[..len_bytes],
                });
                events += 1;
            }
            on_event(ReadEvent::Done { token, result });
            events += 1;
        }
        events
    }

    fn reads_outstanding(&self) -> usize {
        self.queued()
            .get(&std::thread::current().id())
            .map_or(0, |q| q.len())
    }
}
