//! Fixed-capacity byte storage for sockets: a ring buffer with zero-copy views, and an
//! assembler that tracks out-of-order ranges written past the ring's contiguous end.
//! Both are sized at socket creation and never grow.

use crate::limits::{REASSEMBLY_RANGES_MAX, SCOREBOARD_RANGES_MAX};
use crate::wire::tcp::SeqNumber;

/// A byte ring of fixed capacity. `len` bytes starting at `read_at` are allocated; the
/// rest is free and may hold not-yet-contiguous (out-of-order) data.
#[derive(Debug)]
pub(crate) struct RingBuffer {
    storage: Box<[u8]>,
    read_at: usize,
    len: usize,
}

impl RingBuffer {
    pub(crate) fn new(capacity_bytes: usize) -> RingBuffer {
        assert!(capacity_bytes > 0, "ring buffer needs capacity");
        RingBuffer {
            storage: vec![0; capacity_bytes].into_boxed_slice(),
            read_at: 0,
            len: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.storage.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn free(&self) -> usize {
        self.capacity() - self.len
    }

    /// Contiguous allocated bytes starting `offset` bytes after the read position; may be
    /// shorter than the remaining data when it wraps.
    pub(crate) fn readable_at(&self, offset: usize) -> &[u8] {
        if offset >= self.len {
            return &[];
        }
        let start = (self.read_at + offset) % self.capacity();
        let until_end = self.capacity() - start;
        &self.storage[start..start + until_end.min(self.len - offset)]
    }

    /// Releases `count` bytes from the front.
    pub(crate) fn consume(&mut self, count: usize) {
        assert!(count <= self.len, "consume beyond allocated bytes");
        self.read_at = (self.read_at + count) % self.capacity();
        // read_at is not reset when the ring empties: out-of-order bytes may already sit
        // in the free space at positions relative to the current end.
        self.len -= count;
    }

    /// The contiguous free bytes right after the allocated ones.
    pub(crate) fn writable(&mut self) -> &mut [u8] {
        let capacity = self.capacity();
        let start = (self.read_at + self.len) % capacity;
        let until_end = capacity - start;
        let free = self.free();
        &mut self.storage[start..start + until_end.min(free)]
    }

    /// Marks `count` free bytes after the allocated ones as allocated.
    pub(crate) fn commit(&mut self, count: usize) {
        assert!(count <= self.free(), "commit beyond free space");
        self.len += count;
    }

    /// Writes `data` into free space `offset` bytes after the allocated end, without
    /// allocating it. Returns how many bytes fit.
    pub(crate) fn write_unallocated(&mut self, offset: usize, data: &[u8]) -> usize {
        let free = self.free();
        if offset >= free {
            return 0;
        }
        let count = data.len().min(free - offset);
        let capacity = self.capacity();
        let start = (self.read_at + self.len + offset) % capacity;
        let first = count.min(capacity - start);
        self.storage[start..start + first].copy_from_slice(&data[..first]);
        self.storage[..count - first].copy_from_slice(&data[first..count]);
        count
    }

    /// Copies allocated bytes starting `offset` after the read position into `out`.
    /// Returns how many were copied.
    pub(crate) fn copy_out(&self, offset: usize, out: &mut [u8]) -> usize {
        let mut copied = 0;
        while copied < out.len() {
            let chunk = self.readable_at(offset + copied);
            if chunk.is_empty() {
                break;
            }
            let count = chunk.len().min(out.len() - copied);
            out[copied..copied + count].copy_from_slice(&chunk[..count]);
            copied += count;
        }
        copied
    }
}

/// Out-of-order ranges `[start, end)` of bytes, as offsets from the contiguous end of the
/// receive ring. Sorted, disjoint, not adjacent; at most `REASSEMBLY_RANGES_MAX`.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    ranges: [(usize, usize); REASSEMBLY_RANGES_MAX],
    count: usize,
}

/// The assembler has no room for another disjoint range.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AssemblerFull;

impl Assembler {
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records that `[start, end)` holds data, merging with overlapping or adjacent ranges.
    pub(crate) fn add(&mut self, start: usize, end: usize) -> Result<(), AssemblerFull> {
        if start >= end {
            return Ok(());
        }
        let mut merged = [(0usize, 0usize); REASSEMBLY_RANGES_MAX + 1];
        let mut merged_count = 0;
        let mut new_range = (start, end);
        let mut placed = false;
        for &(range_start, range_end) in &self.ranges[..self.count] {
            if range_end < new_range.0 {
                merged[merged_count] = (range_start, range_end);
                merged_count += 1;
            } else if new_range.1 < range_start {
                if !placed {
                    merged[merged_count] = new_range;
                    merged_count += 1;
                    placed = true;
                }
                merged[merged_count] = (range_start, range_end);
                merged_count += 1;
            } else {
                new_range = (new_range.0.min(range_start), new_range.1.max(range_end));
            }
        }
        if !placed {
            merged[merged_count] = new_range;
            merged_count += 1;
        }
        if merged_count > REASSEMBLY_RANGES_MAX {
            return Err(AssemblerFull);
        }
        self.ranges[..merged_count].copy_from_slice(&merged[..merged_count]);
        self.count = merged_count;
        Ok(())
    }

    /// The out-of-order ranges, lowest first.
    pub(crate) fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges[..self.count]
    }

    /// Removes the range that starts at offset 0, if any, shifting the others down, and
    /// returns its length: the bytes that just became contiguous.
    pub(crate) fn take_front(&mut self) -> usize {
        if self.count == 0 || self.ranges[0].0 != 0 {
            return 0;
        }
        let advance = self.ranges[0].1;
        for index in 1..self.count {
            let (start, end) = self.ranges[index];
            self.ranges[index - 1] = (start - advance, end - advance);
        }
        self.count -= 1;
        advance
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Proves the scoreboard merges reported ranges, trims below SND.UNA and finds holes.
    #[test]
    fn scoreboard_tracks_holes() {
        let seq = |n: u32| SeqNumber(u32::MAX - 100) + n as usize; // crosses the 2^32 wrap
        let mut board = Scoreboard::default();
        board.add(seq(300), seq(400));
        board.add(seq(100), seq(200));
        board.add(seq(200), seq(250));
        assert_eq!(board.next_hole(seq(0)), Some((seq(0), seq(100))));
        assert_eq!(board.next_hole(seq(100)), Some((seq(250), seq(300))));
        assert_eq!(board.next_hole(seq(260)), Some((seq(260), seq(300))));
        assert_eq!(board.next_hole(seq(300)), None);
        board.trim(seq(150));
        assert_eq!(board.next_hole(seq(150)), Some((seq(250), seq(300))));
        for index in 0..10u32 {
            board.add(seq(1000 + 100 * index), seq(1050 + 100 * index));
        }
        assert_eq!(
            board.next_hole(seq(150)),
            Some((seq(250), seq(300))),
            "lowest ranges kept"
        );
        board.clear();
        assert_eq!(board.next_hole(seq(0)), None);
    }

    // Proves data written across the wrap point reads back in order via two views.
    #[test]
    fn ring_wraps() {
        let mut ring = RingBuffer::new(8);
        ring.writable()[..6].copy_from_slice(b"abcdef");
        ring.commit(6);
        ring.consume(4);
        assert_eq!(ring.write_unallocated(0, b"ghijkl"), 6);
        ring.commit(6);
        assert_eq!(ring.readable_at(0), b"efgh");
        assert_eq!(ring.readable_at(4), b"ijkl");
        let mut out = [0u8; 8];
        assert_eq!(ring.copy_out(1, &mut out), 7);
        assert_eq!(&out[..7], b"fghijkl");
        assert_eq!(ring.write_unallocated(0, b"xyz"), 0);
    }

    // Proves out-of-order writes beyond the free space are clipped, not overflowed.
    #[test]
    fn ring_unallocated_write_is_bounded() {
        let mut ring = RingBuffer::new(4);
        assert_eq!(ring.write_unallocated(2, b"abc"), 2);
        assert_eq!(ring.write_unallocated(4, b"a"), 0);
    }

    // Proves ranges merge, the front drains, and a full assembler rejects new holes.
    #[test]
    fn assembler_merges_and_bounds() {
        let mut assembler = Assembler::default();
        assembler.add(10, 20).unwrap();
        assembler.add(30, 40).unwrap();
        assert_eq!(assembler.take_front(), 0);
        assembler.add(0, 10).unwrap();
        assert_eq!(assembler.take_front(), 20);
        assembler.add(0, 10).unwrap();
        assert_eq!(assembler.take_front(), 20);
        assert!(assembler.is_empty());
        for index in 0..REASSEMBLY_RANGES_MAX {
            assembler.add(10 * index + 5, 10 * index + 8).unwrap();
        }
        assert_eq!(assembler.add(1000, 1001), Err(AssemblerFull));
        assembler.add(5, 18).unwrap();
    }

    proptest! {
        // Proves the assembler agrees with a bitmap model for any sequence of additions.
        #[test]
        fn assembler_matches_model(adds in proptest::collection::vec((0usize..200, 1usize..20), 0..40)) {
            let mut assembler = Assembler::default();
            let mut model = [false; 256];
            for (start, len) in adds {
                if assembler.add(start, start + len).is_ok() {
                    model[start..start + len].iter_mut().for_each(|b| *b = true);
                }
            }
            let expected = model.iter().take_while(|&&b| b).count();
            prop_assert_eq!(assembler.take_front(), expected);
        }
    }
}

/// Sequence ranges above SND.UNA that the peer reported holding in SACK blocks
/// (RFC 2018), sorted and merged, at most `SCOREBOARD_RANGES_MAX`. Advisory only: data
/// stays in the send ring until cumulatively acknowledged, since a receiver may renege.
#[derive(Debug, Default)]
pub(crate) struct Scoreboard {
    ranges: [(SeqNumber, SeqNumber); SCOREBOARD_RANGES_MAX],
    count: usize,
}

impl Scoreboard {
    pub(crate) fn clear(&mut self) {
        self.count = 0;
    }

    /// Records `[left, right)`; when full, the highest range is forgotten.
    pub(crate) fn add(&mut self, left: SeqNumber, right: SeqNumber) {
        if left >= right {
            return;
        }
        let mut merged = [(SeqNumber(0), SeqNumber(0)); SCOREBOARD_RANGES_MAX + 1];
        let mut merged_count = 0;
        let mut new_range = (left, right);
        let mut placed = false;
        for &(range_left, range_right) in &self.ranges[..self.count] {
            if range_right < new_range.0 {
                merged[merged_count] = (range_left, range_right);
            } else if new_range.1 < range_left {
                if !placed {
                    merged[merged_count] = new_range;
                    merged_count += 1;
                    placed = true;
                }
                merged[merged_count] = (range_left, range_right);
            } else {
                new_range = (new_range.0.min(range_left), new_range.1.max(range_right));
                continue;
            }
            merged_count += 1;
        }
        if !placed {
            merged[merged_count] = new_range;
            merged_count += 1;
        }
        self.count = merged_count.min(SCOREBOARD_RANGES_MAX);
        self.ranges[..self.count].copy_from_slice(&merged[..self.count]);
    }

    /// Forgets everything below `una` (now cumulatively acknowledged).
    pub(crate) fn trim(&mut self, una: SeqNumber) {
        let mut kept = 0;
        for index in 0..self.count {
            let (left, right) = self.ranges[index];
            if right > una {
                self.ranges[kept] = (left.max(una), right);
                kept += 1;
            }
        }
        self.count = kept;
    }

    /// The first unreported range at or after `from` that lies below a reported one:
    /// a hole the peer is missing while holding later data.
    pub(crate) fn next_hole(&self, from: SeqNumber) -> Option<(SeqNumber, SeqNumber)> {
        let mut cursor = from;
        for &(left, right) in &self.ranges[..self.count] {
            if cursor < left {
                return Some((cursor, left));
            }
            cursor = cursor.max(right);
        }
        None
    }
}
