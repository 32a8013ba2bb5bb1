//! Compact ordered set of `(expire_at_ms, address)`: the per-db TTL state of a shard.
//!
//! Same contract as the `BTreeSet<(u64, Address)>` it replaces (exact insert and remove,
//! ordered by deadline then address, `first`, draining what is due), at a fraction of
//! the RAM. Entries are kept sorted and cut into chunks of at most [`CHUNK_MAX_BYTES`]
//! encoded bytes. A chunk is keyed in a `BTreeMap` by its first entry (stored whole);
//! every later entry of the chunk is stored as a delta to the entry before it:
//!
//! ```text
//! same deadline:      varint(zigzag(address delta) << 1)
//! deadline advanced:  varint(zigzag(address delta) << 1 | 1), varint(deadline delta - 1)
//! ```
//!
//! Keys written together with the same TTL have nearby deadlines and, the log being
//! append-only, nearby addresses, so such an entry takes about two bytes. Random deadlines
//! and addresses cost up to ~6-8 bytes. `docs/index.md` has the arithmetic and the measured
//! numbers. Nothing is left stale: removal is exact, so `len` is the exact count of
//! volatile records.
//!
//! Cost: appending after a chunk's last entry (the usual case: new deadlines are later
//! than older ones) touches only that chunk's tail; an insert or remove in the middle
//! decodes and re-encodes one chunk (at most [`CHUNK_MAX_BYTES`] bytes).

use super::index::Address;
use std::collections::BTreeMap;

/// Encoded bytes per chunk at most (a middle insert or remove rewrites one chunk).
const CHUNK_MAX_BYTES: usize = 1024;
/// A chunk left smaller than this by a removal is merged with its successor.
const CHUNK_MERGE_BYTES: usize = 256;
/// RAM per chunk besides its data buffer: the `BTreeMap` slot (16-byte key + 40-byte
/// `Chunk`) in leaf nodes of 11 slots (632 bytes) at a conservative 60 % fill ≈ 96 bytes,
/// plus ~16 bytes of allocator header for the data buffer.
const CHUNK_OVERHEAD_BYTES: usize = 112;

type Entry = (u64, u64);

struct Chunk {
    /// The chunk's last entry (its first is the map key).
    last: Entry,
    /// Deltas of every entry after the first.
    data: Vec<u8>,
}

/// The set. See the module docs.
#[derive(Default)]
pub struct ExpirySet {
    chunks: BTreeMap<Entry, Chunk>,
    len: usize,
    /// Sum of the chunks' data capacities.
    data_bytes: usize,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(data: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = data[*pos];
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Appends the encoding of `e` following `prev` (`e > prev`).
fn encode_step(out: &mut Vec<u8>, prev: Entry, e: Entry) {
    let diff = e.1.wrapping_sub(prev.1) as i64;
    let zz = ((diff << 1) ^ (diff >> 63)) as u64;
    let dt = e.0 - prev.0;
    if dt == 0 {
        put_varint(out, zz << 1);
    } else {
        put_varint(out, (zz << 1) | 1);
        put_varint(out, dt - 1);
    }
}

/// Longest encoding of one step: two varints of at most 10 bytes each.
const STEP_BYTES_MAX: usize = 20;

/// `encode_step` into a stack buffer (the append path: no allocation per insert).
fn encode_step_into(buf: &mut [u8; STEP_BYTES_MAX], prev: Entry, e: Entry) -> &[u8] {
    let mut n = 0;
    let mut put = |mut v: u64| {
        while v >= 0x80 {
            buf[n] = v as u8 | 0x80;
            n += 1;
            v >>= 7;
        }
        buf[n] = v as u8;
        n += 1;
    };
    let diff = e.1.wrapping_sub(prev.1) as i64;
    let zz = ((diff << 1) ^ (diff >> 63)) as u64;
    let dt = e.0 - prev.0;
    if dt == 0 {
        put(zz << 1);
    } else {
        put((zz << 1) | 1);
        put(dt - 1);
    }
    &buf[..n]
}

fn decode(key: Entry, data: &[u8], out: &mut Vec<Entry>) {
    out.push(key);
    let mut prev = key;
    let mut pos = 0;
    while pos < data.len() {
        let v = get_varint(data, &mut pos);
        let dt = if v & 1 == 1 {
            get_varint(data, &mut pos) + 1
        } else {
            0
        };
        let zz = v >> 1;
        let diff = ((zz >> 1) as i64) ^ -((zz & 1) as i64);
        prev = (prev.0 + dt, prev.1.wrapping_add(diff as u64));
        out.push(prev);
    }
}

impl ExpirySet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries (exact).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// RAM held: the struct, every chunk's data capacity and a per-chunk estimate of the
    /// map's node share and allocator header ([`CHUNK_OVERHEAD_BYTES`]).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.data_bytes + self.chunks.len() * CHUNK_OVERHEAD_BYTES
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// The earliest entry.
    pub fn first(&self) -> Option<(u64, Address)> {
        self.chunks.keys().next().map(|&(at, a)| (at, Address(a)))
    }

    /// Every entry in order (tests and tools; allocates).
    pub fn entries(&self) -> Vec<(u64, Address)> {
        let mut out = Vec::with_capacity(self.len);
        for (&k, c) in &self.chunks {
            decode(k, &c.data, &mut out);
        }
        out.into_iter().map(|(at, a)| (at, Address(a))).collect()
    }

    /// Adds an entry; false if it was already present.
    pub fn insert(&mut self, expire_at_ms: u64, addr: Address) -> bool {
        let e = (expire_at_ms, addr.0);
        let Some((&k, c)) = self.chunks.range_mut(..=e).next_back() else {
            // Before every chunk (or the set is empty).
            match self
                .chunks
                .first_key_value()
                .map(|(&k, c)| (k, c.data.len()))
            {
                Some((k, len)) if len < CHUNK_MAX_BYTES / 2 => {
                    let mut all = vec![e];
                    let c = self.take(k);
                    decode(k, &c.data, &mut all);
                    self.put_run(&all);
                }
                _ => self.put_chunk(
                    e,
                    Chunk {
                        last: e,
                        data: Vec::new(),
                    },
                ),
            }
            self.len += 1;
            return true;
        };
        if k == e || c.last == e {
            return false;
        }
        if e > c.last {
            let mut buf = [0u8; STEP_BYTES_MAX];
            let step = encode_step_into(&mut buf, c.last, e);
            if c.data.len() + step.len() > CHUNK_MAX_BYTES {
                // The chunk is full: start the next one (the left one stays full).
                self.put_chunk(
                    e,
                    Chunk {
                        last: e,
                        data: Vec::new(),
                    },
                );
            } else {
                let cap = c.data.capacity();
                if c.data.len() + step.len() > cap {
                    let new_cap = (cap * 2).clamp(16, CHUNK_MAX_BYTES);
                    c.data.reserve_exact(new_cap - c.data.len());
                    self.data_bytes += c.data.capacity() - cap;
                }
                c.data.extend_from_slice(step);
                c.last = e;
            }
            self.len += 1;
            return true;
        }
        let mut all = Vec::new();
        decode(k, &c.data, &mut all);
        let Err(i) = all.binary_search(&e) else {
            return false;
        };
        all.insert(i, e);
        self.take(k);
        self.put_run(&all);
        self.len += 1;
        true
    }

    /// Removes an entry; false if it was not present.
    pub fn remove(&mut self, expire_at_ms: u64, addr: Address) -> bool {
        let e = (expire_at_ms, addr.0);
        let Some((&k, c)) = self.chunks.range(..=e).next_back() else {
            return false;
        };
        if e > c.last {
            return false;
        }
        let mut all = Vec::new();
        decode(k, &c.data, &mut all);
        let Ok(i) = all.binary_search(&e) else {
            return false;
        };
        all.remove(i);
        self.take(k);
        self.len -= 1;
        if all.is_empty() {
            return true;
        }
        // Merge a small remainder with its successor so removals do not leave many tiny
        // chunks behind.
        let next = self
            .chunks
            .range(all[0]..)
            .next()
            .map(|(&nk, nc)| (nk, nc.data.len()));
        let mut encoded_small = true;
        if let Some((_, nlen)) = next {
            let mut probe = Vec::new();
            for w in all.windows(2) {
                encode_step(&mut probe, w[0], w[1]);
            }
            encoded_small = probe.len() < CHUNK_MERGE_BYTES && probe.len() + nlen < CHUNK_MAX_BYTES;
        }
        if let (Some((nk, _)), true) = (next, encoded_small) {
            let nc = self.take(nk);
            decode(nk, &nc.data, &mut all);
        }
        self.put_run(&all);
        true
    }

    /// Removes and appends to `out` up to `max` entries due at `now_ms` (deadline <= now),
    /// earliest first. Returns how many were taken.
    pub fn pop_due(&mut self, now_ms: u64, max: usize, out: &mut Vec<(u64, Address)>) -> usize {
        let mut taken = 0;
        while taken < max {
            let Some((&k, _)) = self.chunks.first_key_value() else {
                break;
            };
            if k.0 > now_ms {
                break;
            }
            let c = self.take(k);
            let mut all = Vec::new();
            decode(k, &c.data, &mut all);
            let due = all.partition_point(|&(at, _)| at <= now_ms);
            let n = due.min(max - taken);
            out.extend(all[..n].iter().map(|&(at, a)| (at, Address(a))));
            taken += n;
            self.len -= n;
            if n < all.len() {
                self.put_run(&all[n..]);
                break;
            }
        }
        taken
    }

    /// Removes a chunk from the map, keeping the byte count.
    fn take(&mut self, k: Entry) -> Chunk {
        let c = self.chunks.remove(&k).expect("chunk key just looked up");
        self.data_bytes -= c.data.capacity();
        c
    }

    fn put_chunk(&mut self, k: Entry, c: Chunk) {
        self.data_bytes += c.data.capacity();
        self.chunks.insert(k, c);
    }

    /// Stores sorted `entries` as one chunk, or halves recursively while too large.
    fn put_run(&mut self, entries: &[Entry]) {
        let mut data = Vec::new();
        for w in entries.windows(2) {
            encode_step(&mut data, w[0], w[1]);
        }
        if data.len() > CHUNK_MAX_BYTES && entries.len() > 1 {
            let mid = entries.len() / 2;
            self.put_run(&entries[..mid]);
            self.put_run(&entries[mid..]);
            return;
        }
        data.shrink_to_fit();
        let last = *entries.last().expect("non-empty run");
        self.put_chunk(entries[0], Chunk { last, data });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn check_same(s: &ExpirySet, model: &BTreeSet<(u64, u64)>) {
        let got: Vec<(u64, u64)> = s.entries().into_iter().map(|(t, a)| (t, a.0)).collect();
        let want: Vec<(u64, u64)> = model.iter().copied().collect();
        assert_eq!(got, want);
        assert_eq!(s.len(), model.len());
        assert_eq!(s.first().map(|(t, a)| (t, a.0)), model.first().copied());
        for (&k, c) in &s.chunks {
            assert!(c.data.len() <= CHUNK_MAX_BYTES);
            assert!(k <= c.last);
        }
        let cap: usize = s.chunks.values().map(|c| c.data.capacity()).sum();
        assert_eq!(cap, s.data_bytes);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
        /// Remove an entry known to be present (index into the model).
        RemovePresent(usize),
        PopDue(u64, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Small deadline and address ranges make duplicates and same-deadline runs common;
        // addresses span the full 40 bits sometimes.
        let addr = prop_oneof![0u64..64, 0u64..(1 << 40) - 1];
        prop_oneof![
            4 => (0u64..200, addr.clone()).prop_map(|(t, a)| Op::Insert(t, a)),
            1 => (0u64..200, addr).prop_map(|(t, a)| Op::Remove(t, a)),
            2 => any::<usize>().prop_map(Op::RemovePresent),
            1 => (0u64..200, 0usize..50).prop_map(|(t, m)| Op::PopDue(t, m)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        // Proves insert/remove/pop_due agree exactly with a BTreeSet model (membership,
        // return values, order, len, first, and pop_due returning exactly the due entries).
        #[test]
        fn matches_btreeset_model(ops in proptest::collection::vec(op(), 1..1500)) {
            let mut s = ExpirySet::new();
            let mut model = BTreeSet::new();
            for o in ops {
                match o {
                    Op::Insert(t, a) => {
                        prop_assert_eq!(s.insert(t, Address(a)), model.insert((t, a)));
                    }
                    Op::Remove(t, a) => {
                        prop_assert_eq!(s.remove(t, Address(a)), model.remove(&(t, a)));
                    }
                    Op::RemovePresent(i) => {
                        if !model.is_empty() {
                            let e = *model.iter().nth(i % model.len()).unwrap();
                            model.remove(&e);
                            prop_assert!(s.remove(e.0, Address(e.1)));
                        }
                    }
                    Op::PopDue(now, max) => {
                        let mut out = Vec::new();
                        let n = s.pop_due(now, max, &mut out);
                        let want: Vec<(u64, u64)> =
                            model.iter().take_while(|e| e.0 <= now).take(max).copied().collect();
                        for e in &want {
                            model.remove(e);
                        }
                        prop_assert_eq!(n, want.len());
                        let got: Vec<(u64, u64)> = out.iter().map(|&(t, a)| (t, a.0)).collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
            check_same(&s, &model);
        }
    }

    // Proves the RAM target for the common case: 1M entries written in deadline order with
    // log-like addresses (~40 bytes apart, ~50 per millisecond) cost under 3 bytes each, and
    // random deadlines over a day with random addresses stay under 10.
    #[test]
    fn bytes_per_entry() {
        let mut s = ExpirySet::new();
        let n = 1_000_000u64;
        for i in 0..n {
            assert!(s.insert(86_400_000 + i / 50, Address(i * 40)));
        }
        let seq = s.memory_bytes() as f64 / n as f64;
        assert!(seq < 3.0, "sequential: {seq} bytes/entry");
        let mut r = ExpirySet::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            r.insert(x % 86_400_000, Address((x >> 20) % (1 << 36)));
        }
        let rnd = r.memory_bytes() as f64 / r.len() as f64;
        assert!(rnd < 10.0, "random: {rnd} bytes/entry");
        eprintln!("bytes/entry: sequential {seq:.2}, random {rnd:.2}");
    }
}
