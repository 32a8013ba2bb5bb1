//! `MemDevice`: an in-memory device for tests, with fault injection.
//!
//! It keeps two images: `visible` (what reads return: every completed write) and `durable`
//! (the state as of the last successful `sync()`). A simulated power loss (`crash*`) resets
//! `visible` to `durable`, optionally letting some unsynced writes (or the first sectors of
//! the last one) survive, which is what a real disk without ordering guarantees may do.
use super::{check_access, check_range, AlignedBuf, BlockDevice, DeviceError, IO_ALIGN_BYTES};
use std::ops::Range;
use std::sync::Mutex;

/// How much of the last unsynced write survives a crash: its first `keep_sectors` 4096-byte
/// sectors (a torn write at a sector boundary).
#[derive(Clone, Copy, Debug)]
pub struct TearLastWrite {
    pub keep_sectors: u32,
}

struct MemState {
    visible: Vec<u8>,
    durable: Vec<u8>,
    /// Writes completed since the last sync, oldest first: (offset, bytes).
    unsynced: Vec<(u64, Vec<u8>)>,
    fail_next_writes: u32,
    fail_next_syncs: u32,
    /// Every write since `record_writes`, in issue order (for cutting a run anywhere).
    journal: Option<Vec<(u64, Vec<u8>)>>,
}

pub struct MemDevice {
    state: Mutex<MemState>,
    capacity_bytes: u64,
    name: String,
}

impl MemDevice {
    /// A zero-filled device of `capacity_bytes` (rounded down to 4096).
    pub fn new(name: &str, capacity_bytes: u64) -> MemDevice {
        let capacity_bytes = capacity_bytes - capacity_bytes % IO_ALIGN_BYTES as u64;
        MemDevice {
            state: Mutex::new(MemState {
                visible: vec![0; capacity_bytes as usize],
                durable: vec![0; capacity_bytes as usize],
                unsynced: Vec::new(),
                fail_next_writes: 0,
                fail_next_syncs: 0,
                journal: None,
            }),
            capacity_bytes,
            name: name.to_string(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `n` writes fail with `DeviceError::Injected` and change nothing.
    pub fn fail_next_writes(&self, n: u32) {
        self.lock().fail_next_writes = n;
    }

    /// The next `n` syncs fail with `DeviceError::Injected` (nothing becomes durable).
    pub fn fail_next_syncs(&self, n: u32) {
        self.lock().fail_next_syncs = n;
    }

    /// Starts recording every write, from this zero-filled device's creation on (call it
    /// before the first write), so [`MemDevice::replay_first`] can cut the run anywhere.
    pub fn record_writes(&self) {
        self.lock().journal = Some(Vec::new());
    }

    /// Writes recorded so far.
    pub fn recorded_writes(&self) -> usize {
        self.lock().journal.as_ref().map_or(0, |j| j.len())
    }

    /// A new device holding the first `n` recorded writes over zeros, all durable: the
    /// state a process killed right after its `n`th write leaves (completed writes survive,
    /// none after).
    pub fn replay_first(&self, n: usize) -> MemDevice {
        let st = self.lock();
        let dev = MemDevice::new(&self.name, self.capacity_bytes);
        {
            let mut d = dev.lock();
            for (off, data) in st.journal.iter().flatten().take(n) {
                let start = *off as usize;
                d.visible[start..start + data.len()].copy_from_slice(data);
            }
            d.durable = d.visible.clone();
        }
        dev
    }

    /// Number of writes completed since the last sync.
    pub fn unsynced_writes(&self) -> usize {
        self.lock().unsynced.len()
    }

    /// Power loss: every write since the last sync is dropped, except, with `tear`, the first
    /// sectors of the last one.
    pub fn crash(&self, tear: Option<TearLastWrite>) {
        let mut st = self.lock();
        let last = st.unsynced.pop();
        st.unsynced.clear();
        let mut image = st.durable.clone();
        if let (Some(t), Some((off, data))) = (tear, last) {
            let keep = (t.keep_sectors as usize * IO_ALIGN_BYTES).min(data.len());
            image[off as usize..off as usize + keep].copy_from_slice(&data[..keep]);
        }
        st.durable = image.clone();
        st.visible = image;
    }

    /// Power loss where each unsynced write independently survives whole, is lost, or is torn
    /// at a random sector boundary, chosen by a deterministic generator seeded with `seed`.
    /// Surviving writes are applied in issue order.
    pub fn crash_random(&self, seed: u64) {
        let mut st = self.lock();
        let writes = std::mem::take(&mut st.unsynced);
        let mut image = st.durable.clone();
        let mut rng = seed ^ 0x9e37_79b9_7f4a_7c15;
        for (off, data) in writes {
            let roll = splitmix(&mut rng) % 3;
            let sectors = data.len() / IO_ALIGN_BYTES;
            let keep = match roll {
                0 => 0,
                1 => data.len(),
                _ => (splitmix(&mut rng) as usize % (sectors + 1)) * IO_ALIGN_BYTES,
            };
            image[off as usize..off as usize + keep].copy_from_slice(&data[..keep]);
        }
        st.durable = image.clone();
        st.visible = image;
    }

    /// Flips every bit in `[offset, offset + len)` in both the visible and durable images
    /// (media corruption).
    pub fn flip_bits(&self, offset_bytes: u64, len_bytes: u64) {
        let mut st = self.lock();
        let range = offset_bytes as usize..(offset_bytes + len_bytes) as usize;
        for b in &mut st.visible[range.clone()] {
            *b ^= 0xff;
        }
        for b in &mut st.durable[range] {
            *b ^= 0xff;
        }
    }

    /// A copy of the visible bytes `[offset, offset + len)`, for tests.
    pub fn peek(&self, offset_bytes: u64, len_bytes: usize) -> Vec<u8> {
        let st = self.lock();
        st.visible[offset_bytes as usize..offset_bytes as usize + len_bytes].to_vec()
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl BlockDevice for MemDevice {
    fn sector_size_bytes(&self) -> u32 {
        IO_ALIGN_BYTES as u32
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        check_access(offset_bytes, buf.len(), self.capacity_bytes)?;
        let st = self.lock();
        let start = offset_bytes as usize;
        let len = buf.len();
        buf.as_mut_slice()
            .copy_from_slice(&st.visible[start..start + len]);
        Ok(())
    }

    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.write_range_at(offset_bytes, buf, 0..buf.len())
    }

    fn write_range_at(
        &self,
        offset_bytes: u64,
        buf: &AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        check_range(&range, buf.len())?;
        check_access(offset_bytes, range.len(), self.capacity_bytes)?;
        let data = &buf.as_slice()[range];
        let mut st = self.lock();
        if st.fail_next_writes > 0 {
            st.fail_next_writes -= 1;
            return Err(DeviceError::Injected("write failed".into()));
        }
        let start = offset_bytes as usize;
        st.visible[start..start + data.len()].copy_from_slice(data);
        st.unsynced.push((offset_bytes, data.to_vec()));
        if let Some(j) = st.journal.as_mut() {
            j.push((offset_bytes, data.to_vec()));
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), DeviceError> {
        let mut st = self.lock();
        if st.fail_next_syncs > 0 {
            st.fail_next_syncs -= 1;
            return Err(DeviceError::Injected("sync failed".into()));
        }
        let writes = std::mem::take(&mut st.unsynced);
        for (off, data) in writes {
            let start = off as usize;
            st.durable[start..start + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("mem://{}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf_with(byte: u8, len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new_zeroed(len);
        b.as_mut_slice().fill(byte);
        b
    }

    // Proves a crash keeps synced writes and drops unsynced ones.
    #[test]
    fn crash_drops_unsynced_writes() {
        let dev = MemDevice::new("t", 1 << 16);
        dev.write_at(0, &buf_with(1, 4096)).unwrap();
        dev.sync().unwrap();
        dev.write_at(4096, &buf_with(2, 4096)).unwrap();
        dev.crash(None);
        assert_eq!(dev.peek(0, 1)[0], 1);
        assert_eq!(dev.peek(4096, 1)[0], 0);
    }

    // Proves a torn crash keeps exactly the requested prefix of the last write.
    #[test]
    fn crash_can_tear_last_write() {
        let dev = MemDevice::new("t", 1 << 16);
        dev.write_at(0, &buf_with(3, 3 * 4096)).unwrap();
        dev.crash(Some(TearLastWrite { keep_sectors: 1 }));
        assert_eq!(dev.peek(0, 1)[0], 3);
        assert_eq!(dev.peek(4096, 1)[0], 0);
    }

    // Proves injected write failures fail and leave the device unchanged.
    #[test]
    fn injected_write_failure() {
        let dev = MemDevice::new("t", 1 << 16);
        dev.fail_next_writes(1);
        assert!(dev.write_at(0, &buf_with(5, 4096)).is_err());
        assert_eq!(dev.peek(0, 1)[0], 0);
        dev.write_at(0, &buf_with(5, 4096)).unwrap();
        assert_eq!(dev.peek(0, 1)[0], 5);
    }
}
