//! The compact key index: 64-bit key hash → 40-bit device address, in about 9.6 bytes
//! of RAM per key (10 M keys; see `docs/index.md`).
//!
//! What it owns: a table of 8-byte entries `[hash fragment 24 bits | address+1 40 bits]`
//! packed eight to a 64-byte bucket (one cache line). Keys are never stored; the caller
//! hashes `(db, key)` to 64 bits, asks for `candidates()`, and verifies each one by
//! reading the record. The index promises only that it never loses, duplicates or
//! misplaces an entry, so `candidates(h)` always contains the address of a present key
//! whose hash is `h`. See `docs/index.md` for the design rationale and measurements.
//!
//! How a hash is used (most significant bits first):
//! - bits 63..52 pick one of [`SUBTABLE_COUNT`] independent sub-tables (implied, not stored);
//! - bits 51..28 are the stored 24-bit fragment. Inside a sub-table of `n` home buckets
//!   the home bucket is `fragment * n >> 24` — a monotone map from fragment to bucket,
//!   so the table can have any size (not just powers of two) and the fragment is all
//!   that is ever needed to rehash an entry;
//! - bits 27..0 are not used. Two hashes that agree on bits 63..28 (36 bits) are
//!   indistinguishable to the index and both show up as candidates.
//!
//! Invariants (checked by the tests' `check_invariants`):
//! - Buckets are compact: a bucket's entries fill slots `0..count`, so an empty slot
//!   means "bucket not full".
//! - Bucketed linear probing: an entry lives in its home bucket or, if that was full, in
//!   a later one. An entry at bucket `j` with home `h < j` implies buckets `h..j` are all
//!   full. Entries that run past the last home bucket go to spill buckets appended to
//!   the sub-table (no wrap-around).
//! - Ordered runs: every fragment in a bucket is ≤ every fragment in the next bucket
//!   (within a bucket, slots are unordered). Insertion keeps this by swapping the new
//!   entry for a bucket's largest fragment and carrying that one on (Robin Hood style);
//!   deletion shifts the next bucket's smallest entry back while its home allows (no
//!   tombstones). So a lookup stops at the first bucket that has room or holds a larger
//!   fragment, and a SCAN can resume at any bucket boundary by fragment value, which is
//!   what makes it resize-proof.
//! - A sub-table grows by a factor of [`GROWTH_FACTOR`] when it holds more than
//!   [`GROW_LOAD_UNITS`]/16 of its home slots, and shrinks when it falls far below.
//!   Sub-table `i` at level `L` has `ceil(GROWTH_FACTOR^(L + i/SUBTABLE_COUNT))` home
//!   buckets: the fractional phase spreads the sub-tables' resize points evenly, so the
//!   total size grows smoothly with the key count instead of in global steps.
//!
//! Deliberately missing: incremental rehash (a resize rebuilds one sub-table, 1/4096 of
//! the index, in one go; the transient is that sub-table's old plus new buckets),
//! concurrency (one worker owns one index), and key verification (the caller's job).

use std::mem::size_of;

/// Opaque device address of a record, as the storage engine encodes it (≤ ADDRESS_BITS bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(pub u64);

/// Width of an address as stored in an entry.
pub const ADDRESS_BITS: u32 = 40;
/// The one 40-bit value that cannot be stored: entries keep `address + 1` so that an
/// all-zero word means "empty slot". Inserting it is a caller bug (panic).
pub const ADDRESS_RESERVED: u64 = (1 << ADDRESS_BITS) - 1;

/// Hash bits that select a sub-table (implied by position, never stored).
pub const SUBTABLE_BITS: u32 = 12;
/// Number of independently resized sub-tables.
pub const SUBTABLE_COUNT: usize = 1 << SUBTABLE_BITS;
/// Hash bits stored in each entry.
pub const FRAGMENT_BITS: u32 = 24;
/// Entries per 64-byte bucket.
pub const BUCKET_SLOTS: usize = 8;
/// Loads are counted in half-entries per home bucket (16 = a full bucket of 8).
const LOAD_UNITS_PER_HOME_BUCKET: u64 = 2 * BUCKET_SLOTS as u64;
/// A sub-table grows when its load exceeds 15/16 (7.5 entries per home bucket).
pub const GROW_LOAD_UNITS: u64 = 15;
/// A sub-table shrinks one level when its load after shrinking would be at most 10/16
/// (5 entries per home bucket). Being below the growth trigger gives hysteresis: a
/// rebuild needs the sub-table's size to change by ~30-50% first. Worst steady cost just
/// before a shrink: 64 / (5 / GROWTH_FACTOR) = 16 bytes per key.
pub const SHRINK_LOAD_UNITS: u64 = 10;
/// Size ratio between consecutive levels of a sub-table.
pub const GROWTH_FACTOR: f64 = 1.25;
/// Highest level: keeps a sub-table at ≤ 2^20 home buckets (fragment resolution stays
/// ≥ 16 fragments per home bucket); beyond it the table stops growing and runs get long.
const LEVEL_MAX: u8 = 61;
/// Random slot probes `random_entry` tries before falling back to a walk.
const RANDOM_PROBES: u32 = 64;

/// `hash >> HASH_POSITION_SHIFT` is the 36-bit hash position that `scan` reports; the
/// index ignores the lower bits, so `insert(position << HASH_POSITION_SHIFT, addr)`
/// rebuilds an entry exactly (e.g. from an index checkpoint).
pub const HASH_POSITION_SHIFT: u32 = 64 - SUBTABLE_BITS - FRAGMENT_BITS;

const FRAGMENT_MASK: u64 = (1 << FRAGMENT_BITS) - 1;
const ADDRESS_MASK: u64 = (1 << ADDRESS_BITS) - 1;
const FRAGMENT_SHIFT: u32 = HASH_POSITION_SHIFT;
/// Scan cursors live in the 36-bit space `subtable << 24 | fragment`.
const CURSOR_LIMIT: u64 = 1 << (SUBTABLE_BITS + FRAGMENT_BITS);

const _: () = assert!(FRAGMENT_BITS + ADDRESS_BITS == 64);
const _: () = assert!(SUBTABLE_BITS + FRAGMENT_BITS <= 64);
const _: () = assert!(size_of::<Bucket>() == 64);
const _: () = assert!(GROW_LOAD_UNITS < LOAD_UNITS_PER_HOME_BUCKET);
// After shrinking, the load must be below the growth trigger (hysteresis).
const _: () = assert!(SHRINK_LOAD_UNITS < GROW_LOAD_UNITS);
// A shard (and its index) moves to the worker thread that owns it.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Index>();
};

/// One stored word: fragment in the top 24 bits, `address + 1` in the low 40 (0 = empty).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Entry(u64);

impl Entry {
    const EMPTY: Entry = Entry(0);

    fn new(fragment: u32, address: Address) -> Entry {
        assert!(
            address.0 < ADDRESS_RESERVED,
            "index: address {:#x} does not fit {} bits minus the reserved value",
            address.0,
            ADDRESS_BITS
        );
        debug_assert!(u64::from(fragment) <= FRAGMENT_MASK);
        Entry((u64::from(fragment) << ADDRESS_BITS) | (address.0 + 1))
    }

    fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn fragment(self) -> u32 {
        (self.0 >> ADDRESS_BITS) as u32
    }

    fn address(self) -> Address {
        debug_assert!(!self.is_empty());
        Address((self.0 & ADDRESS_MASK) - 1)
    }
}

/// One cache line of entries, kept compact (entries first, then empty slots).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    slots: [Entry; BUCKET_SLOTS],
}

impl Bucket {
    const EMPTY: Bucket = Bucket {
        slots: [Entry::EMPTY; BUCKET_SLOTS],
    };

    fn count(&self) -> usize {
        self.slots
            .iter()
            .position(|e| e.is_empty())
            .unwrap_or(BUCKET_SLOTS)
    }

    fn is_full(&self) -> bool {
        !self.slots[BUCKET_SLOTS - 1].is_empty()
    }

    fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        self.slots.iter().copied().take_while(|e| !e.is_empty())
    }

    /// Appends `entry`; false if the bucket is full.
    fn push(&mut self, entry: Entry) -> bool {
        let count = self.count();
        if count == BUCKET_SLOTS {
            return false;
        }
        self.slots[count] = entry;
        true
    }

    /// Slot of the largest fragment (bucket not empty).
    fn largest_slot(&self) -> usize {
        let entries = &self.slots[..self.count()];
        let (slot, _) = entries
            .iter()
            .enumerate()
            .max_by_key(|(_, e)| e.fragment())
            .expect("index: largest_slot of an empty bucket");
        slot
    }

    /// Slot of the smallest fragment; None if the bucket is empty.
    fn smallest_slot(&self) -> Option<usize> {
        let entries = &self.slots[..self.count()];
        entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.fragment())
            .map(|(slot, _)| slot)
    }

    /// True if no entry with `fragment` can live after this bucket: it has room, or
    /// (runs being ordered) it holds a larger fragment.
    fn ends_run_for(&self, fragment: u32) -> bool {
        !self.is_full() || self.slots.iter().any(|e| e.fragment() > fragment)
    }

    /// Removes the entry in `slot`, moving the last entry into its place.
    fn take(&mut self, slot: usize) -> Entry {
        let count = self.count();
        assert!(slot < count, "index: take from an empty slot");
        let last = count - 1;
        let entry = self.slots[slot];
        self.slots[slot] = self.slots[last];
        self.slots[last] = Entry::EMPTY;
        entry
    }
}

/// Splits a hash into (sub-table number, stored fragment).
fn split_hash(hash: u64) -> (usize, u32) {
    let subtable = (hash >> (64 - SUBTABLE_BITS)) as usize;
    let fragment = ((hash >> FRAGMENT_SHIFT) & FRAGMENT_MASK) as u32;
    (subtable, fragment)
}

/// Home bucket of `fragment` in a sub-table with `home_buckets` home buckets.
fn home_of(fragment: u32, home_buckets: u32) -> usize {
    ((u64::from(fragment) * u64::from(home_buckets)) >> FRAGMENT_BITS) as usize
}

/// Smallest fragment whose home is `bucket` or later (`bucket < home_buckets`).
fn first_fragment_of(bucket: usize, home_buckets: u32) -> u32 {
    let n = u64::from(home_buckets);
    let fragment = ((bucket as u64) << FRAGMENT_BITS).div_ceil(n);
    debug_assert!(fragment <= FRAGMENT_MASK);
    fragment as u32
}

/// `entries` in load units (two per entry: see `LOAD_UNITS_PER_HOME_BUCKET`).
fn load_units(entries: impl Into<u64>) -> u64 {
    2 * entries.into()
}

/// Home buckets of sub-table `subtable` at `level` (see the module essay).
fn home_buckets_at(level: u8, subtable: usize) -> u32 {
    let phase = subtable as f64 / SUBTABLE_COUNT as f64;
    let buckets = GROWTH_FACTOR.powf(f64::from(level) + phase).ceil();
    assert!(buckets >= 1.0 && buckets <= f64::from(1u32 << 20));
    buckets as u32
}

/// One independently resized slice of the index.
struct Subtable {
    /// `home_buckets` home buckets followed by spill buckets; empty when unallocated.
    buckets: Box<[Bucket]>,
    home_buckets: u32,
    len: u32,
    level: u8,
}

impl Subtable {
    fn unallocated(level: u8) -> Subtable {
        Subtable {
            buckets: Box::new([]),
            home_buckets: 0,
            len: 0,
            level,
        }
    }

    fn allocated(level: u8, subtable: usize) -> Subtable {
        let home_buckets = home_buckets_at(level, subtable);
        let buckets = vec![Bucket::EMPTY; home_buckets as usize].into_boxed_slice();
        Subtable {
            buckets,
            home_buckets,
            len: 0,
            level,
        }
    }

    fn home(&self, fragment: u32) -> usize {
        home_of(fragment, self.home_buckets)
    }

    /// Places an entry by linear probing from its home, appending a spill bucket if
    /// the probe runs off the end. Does not touch `len`.
    fn place(&mut self, entry: Entry) {
        debug_assert!(self.home_buckets > 0);
        let mut carry = entry;
        let mut number = self.home(entry.fragment());
        loop {
            let Some(bucket) = self.buckets.get_mut(number) else {
                self.append_spill(carry);
                return;
            };
            if bucket.push(carry) {
                return;
            }
            // Keep the run ordered: the carried entry takes the place of this bucket's
            // largest fragment if that is not smaller, and the largest moves on.
            let largest = bucket.largest_slot();
            if bucket.slots[largest].fragment() >= carry.fragment() {
                carry = std::mem::replace(&mut bucket.slots[largest], carry);
            }
            number += 1;
        }
    }

    fn append_spill(&mut self, entry: Entry) {
        let mut buckets = std::mem::take(&mut self.buckets).into_vec();
        buckets.reserve_exact(1);
        let mut spill = Bucket::EMPTY;
        spill.slots[0] = entry;
        buckets.push(spill);
        self.buckets = buckets.into_boxed_slice();
    }

    /// (bucket, slot) of the entry with this fragment and address.
    fn find(&self, fragment: u32, address: Address) -> Option<(usize, usize)> {
        if self.buckets.is_empty() {
            return None;
        }
        let wanted = Entry::new(fragment, address);
        let home = self.home(fragment);
        for (offset, bucket) in self.buckets[home..].iter().enumerate() {
            if let Some(slot) = bucket.slots.iter().position(|e| *e == wanted) {
                return Some((home + offset, slot));
            }
            if bucket.ends_run_for(fragment) {
                return None;
            }
        }
        None
    }

    /// Removes the entry at (bucket, slot) and shifts later entries back so that the
    /// probing invariant holds again.
    fn remove_at(&mut self, bucket: usize, slot: usize) {
        let was_full = self.buckets[bucket].is_full();
        self.buckets[bucket].take(slot);
        self.len -= 1;
        if was_full {
            self.shift_back(bucket);
        }
    }

    /// `hole` has just lost an entry and was full before: entries beyond it whose home
    /// is at or before `hole` must move into it, and so on down the run.
    /// Runs are ordered, so only the next bucket's smallest fragment can belong earlier.
    fn shift_back(&mut self, mut hole: usize) {
        let home_buckets = self.home_buckets;
        let mut next = hole + 1;
        while next < self.buckets.len() {
            let bucket = &self.buckets[next];
            let Some(smallest) = bucket.smallest_slot() else {
                return;
            };
            if home_of(bucket.slots[smallest].fragment(), home_buckets) > hole {
                return;
            }
            let next_was_full = bucket.is_full();
            let entry = self.buckets[next].take(smallest);
            let pushed = self.buckets[hole].push(entry);
            assert!(pushed, "index: shift-back target has no free slot");
            if !next_was_full {
                return;
            }
            hole = next;
            next += 1;
        }
    }

    /// Rebuilds at `level`, re-placing every entry. Transient: old + new buckets.
    fn rebuild(&mut self, level: u8, subtable: usize) {
        let old = std::mem::replace(self, Subtable::allocated(level, subtable));
        self.len = old.len;
        for bucket in old.buckets.iter() {
            for entry in bucket.entries() {
                self.place(entry);
            }
        }
    }

    fn maybe_grow(&mut self, subtable: usize) {
        let limit = GROW_LOAD_UNITS * u64::from(self.home_buckets);
        if load_units(self.len) <= limit || self.level >= LEVEL_MAX {
            return;
        }
        // Small levels can round to the same size; skip to the first one that is larger.
        let mut level = self.level + 1;
        while level < LEVEL_MAX && home_buckets_at(level, subtable) <= self.home_buckets {
            level += 1;
        }
        self.rebuild(level, subtable);
    }

    fn maybe_shrink(&mut self, subtable: usize, level_min: u8) {
        if self.len == 0 && level_min == 0 {
            *self = Subtable::unallocated(0);
            return;
        }
        if self.level <= level_min {
            return;
        }
        let smaller = home_buckets_at(self.level - 1, subtable);
        if smaller == self.home_buckets {
            // Same size after rounding: step down without moving anything.
            self.level -= 1;
        } else if load_units(self.len) <= SHRINK_LOAD_UNITS * u64::from(smaller) {
            self.rebuild(self.level - 1, subtable);
        }
    }

    /// A fragment at which a scan that has visited every bucket up to and including
    /// `bucket_number` can resume without missing anything: entries with a smaller
    /// fragment all live at or before that bucket. Runs are ordered, so the bucket's
    /// largest fragment qualifies (one past it when the next bucket starts higher); after
    /// a non-full home bucket nothing homed at or before it lives later, so the next
    /// bucket's first fragment qualifies too.
    fn resume_after(&self, bucket_number: usize) -> Option<u32> {
        let bucket = &self.buckets[bucket_number];
        let mut largest = bucket.entries().map(Entry::fragment).max();
        // If nothing later shares the largest fragment, resume just past it.
        let later = self.buckets.get(bucket_number + 1);
        let later_smallest = later.and_then(|b| b.entries().map(Entry::fragment).min());
        if let Some(l) = largest {
            let next_starts_higher = match later_smallest {
                Some(smallest) => smallest > l,
                None => true,
            };
            if next_starts_higher && u64::from(l) < FRAGMENT_MASK {
                largest = Some(l + 1);
            }
        }
        let next_home = bucket_number + 1;
        if !bucket.is_full() && next_home < self.home_buckets as usize {
            let first = first_fragment_of(next_home, self.home_buckets);
            return Some(largest.map_or(first, |l| l.max(first)));
        }
        largest
    }

    /// Visits whole buckets from the home of `fragment` until `budget` entries are
    /// visited and a bucket boundary is safe to resume from (with a larger fragment, so
    /// that every call makes progress). Returns the number of
    /// entries visited and the fragment to resume at (None = sub-table finished).
    fn scan_from(
        &self,
        fragment: u32,
        budget: usize,
        position_base: u64,
        f: &mut impl FnMut(u64, Address),
    ) -> (usize, Option<u32>) {
        if self.buckets.is_empty() {
            return (0, None);
        }
        let mut visited = 0;
        for bucket_number in self.home(fragment)..self.buckets.len() {
            let bucket = &self.buckets[bucket_number];
            // Entries below the cursor were visited by earlier calls (or arrived since,
            // which SCAN does not promise to report): skipping them avoids repeats.
            for entry in bucket.entries().filter(|e| e.fragment() >= fragment) {
                f(position_base | u64::from(entry.fragment()), entry.address());
                visited += 1;
            }
            if visited >= budget {
                let resume = self.resume_after(bucket_number);
                if resume.is_some_and(|r| r > fragment) {
                    return (visited, resume);
                }
            }
        }
        (visited, None)
    }
}

/// Keys are never stored: the caller hashes (db,key) to 64 bits and verifies each candidate by
/// reading the record. Exactness is the caller's job; the index must never lose an entry.
pub struct Index {
    subtables: Box<[Subtable]>,
    len: usize,
    /// Sub-tables never shrink below this level (set by `with_capacity`).
    level_min: u8,
}

impl Default for Index {
    fn default() -> Self {
        Index::new()
    }
}

impl Index {
    /// An empty index; sub-tables allocate on their first insert.
    pub fn new() -> Index {
        let subtables = (0..SUBTABLE_COUNT)
            .map(|_| Subtable::unallocated(0))
            .collect();
        Index {
            subtables,
            len: 0,
            level_min: 0,
        }
    }

    /// An index sized so that `keys` uniformly hashed entries fit without any resize.
    pub fn with_capacity(keys: usize) -> Index {
        let level_min = Self::level_for(keys);
        if level_min == 0 {
            return Index::new();
        }
        let subtables = (0..SUBTABLE_COUNT)
            .map(|i| Subtable::allocated(level_min, i))
            .collect();
        Index {
            subtables,
            len: 0,
            level_min,
        }
    }

    /// Grows every sub-table now to what `keys` uniformly hashed entries need, without
    /// setting a minimum (later removals, or `shrink_to_fit`, may shrink it again).
    /// Recovery calls it with an estimate so that its scan does not rebuild each
    /// sub-table several times over as the index fills.
    pub fn reserve(&mut self, keys: usize) {
        let level = Self::level_for(keys);
        if level == 0 {
            return;
        }
        for (i, table) in self.subtables.iter_mut().enumerate() {
            if table.buckets.is_empty() {
                *table = Subtable::allocated(level.max(table.level), i);
            } else if table.level < level && home_buckets_at(level, i) > table.home_buckets {
                table.rebuild(level, i);
            }
        }
    }

    /// Rebuilds every sub-table larger than its entries need (after a `reserve` that
    /// overestimated) at the smallest level that holds them below the growth trigger,
    /// never below the minimum level; frees empty ones as `remove` would.
    pub fn shrink_to_fit(&mut self) {
        let level_min = self.level_min;
        for (i, table) in self.subtables.iter_mut().enumerate() {
            if table.buckets.is_empty() {
                continue;
            }
            if table.len == 0 && level_min == 0 {
                *table = Subtable::unallocated(0);
                continue;
            }
            let mut level = level_min;
            while level < table.level
                && GROW_LOAD_UNITS * u64::from(home_buckets_at(level, i)) < load_units(table.len)
            {
                level += 1;
            }
            if level < table.level && home_buckets_at(level, i) < table.home_buckets {
                table.rebuild(level, i);
            }
        }
    }

    /// Smallest level at which every sub-table holds its share of `keys` (mean plus four
    /// standard deviations) below the growth trigger.
    fn level_for(keys: usize) -> u8 {
        let mean = keys as f64 / SUBTABLE_COUNT as f64;
        let share = (mean + 4.0 * mean.sqrt()).ceil() as u64;
        let mut level = 0;
        while level < LEVEL_MAX
            && GROW_LOAD_UNITS * u64::from(home_buckets_at(level, 0)) < load_units(share)
        {
            level += 1;
        }
        level
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of every allocation the index owns (the struct, the sub-table headers and
    /// every bucket, home and spill). Allocator bookkeeping (~16 bytes per allocation,
    /// at most one allocation per sub-table) is not included.
    pub fn memory_bytes(&self) -> usize {
        let buckets: usize = self.subtables.iter().map(|s| s.buckets.len()).sum();
        size_of::<Index>()
            + self.subtables.len() * size_of::<Subtable>()
            + buckets * size_of::<Bucket>()
    }

    /// All addresses whose stored hash fragment matches `hash` (usually 0 or 1). Small, no heap alloc.
    pub fn candidates(&self, hash: u64) -> Candidates<'_> {
        let (subtable, fragment) = split_hash(hash);
        let table = &self.subtables[subtable];
        let start = if table.buckets.is_empty() {
            0
        } else {
            table.home(fragment)
        };
        Candidates {
            buckets: &table.buckets[start..],
            fragment,
            bucket: 0,
            slot: 0,
        }
    }

    /// Loads the home bucket of `hash` and returns one of its words (a hint, meaningless
    /// otherwise): a caller about to probe many hashes loads their buckets together
    /// first, so that the cache misses overlap (recovery's scan does).
    pub fn touch(&self, hash: u64) -> u64 {
        let (subtable, fragment) = split_hash(hash);
        let table = &self.subtables[subtable];
        if table.buckets.is_empty() {
            return 0;
        }
        table.buckets[table.home(fragment)].slots[0].0
    }

    /// Adds an entry. The caller has verified that the key is absent.
    pub fn insert(&mut self, hash: u64, addr: Address) {
        let (subtable, fragment) = split_hash(hash);
        let entry = Entry::new(fragment, addr);
        let level_min = self.level_min;
        let table = &mut self.subtables[subtable];
        debug_assert!(
            table.find(fragment, addr).is_none(),
            "index: duplicate insert"
        );
        if table.buckets.is_empty() {
            *table = Subtable::allocated(level_min.max(table.level), subtable);
        }
        table.place(entry);
        table.len += 1;
        self.len += 1;
        table.maybe_grow(subtable);
    }

    /// Changes the address of the entry (`hash`, `old`) to `new`. False if absent.
    pub fn replace(&mut self, hash: u64, old: Address, new: Address) -> bool {
        let (subtable, fragment) = split_hash(hash);
        let replacement = Entry::new(fragment, new);
        let table = &mut self.subtables[subtable];
        match table.find(fragment, old) {
            Some((bucket, slot)) => {
                table.buckets[bucket].slots[slot] = replacement;
                true
            }
            None => false,
        }
    }

    /// Removes the entry (`hash`, `addr`). False if absent.
    pub fn remove(&mut self, hash: u64, addr: Address) -> bool {
        let (subtable, fragment) = split_hash(hash);
        let level_min = self.level_min;
        let table = &mut self.subtables[subtable];
        let Some((bucket, slot)) = table.find(fragment, addr) else {
            return false;
        };
        table.remove_at(bucket, slot);
        self.len -= 1;
        table.maybe_shrink(subtable, level_min);
        true
    }

    /// Redis-style reverse-binary cursor scan: every entry present for the whole scan is
    /// visited at least once even across resizes. Returns next cursor (0 = done).
    ///
    /// Here the cursor is a position in hash order (`subtable << 24 | fragment`), which
    /// is resize-proof because bucket order follows fragment order at every size. The
    /// callback gets that 36-bit position of the entry and its address. At least
    /// `max_entries` entries are visited unless the scan ends (whole buckets at a time;
    /// a long probe run can add a few more). Entries may be visited more than once.
    /// An out-of-range cursor ends the scan (returns 0 without visiting).
    pub fn scan(
        &self,
        cursor: u64,
        max_entries: usize,
        mut f: impl FnMut(u64 /*hash fragment or bucket*/, Address),
    ) -> u64 {
        if cursor >= CURSOR_LIMIT {
            return 0;
        }
        let max_entries = max_entries.max(1);
        let mut subtable = (cursor >> FRAGMENT_BITS) as usize;
        let mut fragment = (cursor & FRAGMENT_MASK) as u32;
        let mut visited = 0;
        while subtable < SUBTABLE_COUNT {
            let base = (subtable as u64) << FRAGMENT_BITS;
            let budget = max_entries - visited;
            let (count, resume) =
                self.subtables[subtable].scan_from(fragment, budget, base, &mut f);
            visited += count;
            if let Some(next) = resume {
                return base | u64::from(next);
            }
            subtable += 1;
            fragment = 0;
            if visited >= max_entries && subtable < SUBTABLE_COUNT {
                return (subtable as u64) << FRAGMENT_BITS;
            }
        }
        0
    }

    /// Calls `f` once for every entry's address.
    pub fn for_each(&self, mut f: impl FnMut(Address)) {
        for table in self.subtables.iter() {
            for bucket in table.buckets.iter() {
                bucket.entries().for_each(|e| f(e.address()));
            }
        }
    }

    /// Removes every entry and returns to the size given at construction.
    pub fn clear(&mut self) {
        let level_min = self.level_min;
        for (i, table) in self.subtables.iter_mut().enumerate() {
            *table = if level_min == 0 {
                Subtable::unallocated(0)
            } else {
                Subtable::allocated(level_min, i)
            };
        }
        self.len = 0;
    }

    /// Some entry's address, chosen by `seed` (deterministic for a given index state).
    /// Roughly uniform: a random slot of a random sub-table, retried a few times, then a
    /// walk from a random sub-table.
    pub fn random_entry(&self, seed: u64) -> Option<Address> {
        if self.len == 0 {
            return None;
        }
        let mut state = seed;
        for _ in 0..RANDOM_PROBES {
            let table = &self.subtables[(splitmix64(&mut state) % SUBTABLE_COUNT as u64) as usize];
            if table.buckets.is_empty() {
                continue;
            }
            let slot = splitmix64(&mut state) % (table.buckets.len() * BUCKET_SLOTS) as u64;
            let entry =
                table.buckets[slot as usize / BUCKET_SLOTS].slots[slot as usize % BUCKET_SLOTS];
            if !entry.is_empty() {
                return Some(entry.address());
            }
        }
        let start = (splitmix64(&mut state) % SUBTABLE_COUNT as u64) as usize;
        (0..SUBTABLE_COUNT)
            .map(|i| &self.subtables[(start + i) % SUBTABLE_COUNT])
            .find_map(|t| t.buckets.iter().find_map(|b| b.entries().next()))
            .map(|e| e.address())
    }

    /// Shape of the table, for benchmarks and `INFO`-style reporting.
    pub fn shape(&self) -> IndexShape {
        let mut shape = IndexShape {
            entries: self.len,
            ..IndexShape::default()
        };
        for table in self.subtables.iter() {
            shape.home_buckets += table.home_buckets as usize;
            shape.spill_buckets += table.buckets.len() - table.home_buckets as usize;
            shape.full_buckets += table.buckets.iter().filter(|b| b.is_full()).count();
        }
        shape
    }
}

/// Counts describing how the index is laid out (see [`Index::shape`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexShape {
    pub entries: usize,
    pub home_buckets: usize,
    pub spill_buckets: usize,
    pub full_buckets: usize,
}

/// Iterator over candidate addresses for one hash; borrows the index, never allocates.
pub struct Candidates<'a> {
    /// The probe run: buckets from the home bucket to the end of the sub-table.
    buckets: &'a [Bucket],
    fragment: u32,
    bucket: usize,
    slot: usize,
}

impl Iterator for Candidates<'_> {
    type Item = Address;

    fn next(&mut self) -> Option<Address> {
        while let Some(bucket) = self.buckets.get(self.bucket) {
            while self.slot < BUCKET_SLOTS {
                let entry = bucket.slots[self.slot];
                self.slot += 1;
                if entry.fragment() == self.fragment && !entry.is_empty() {
                    return Some(entry.address());
                }
            }
            if bucket.ends_run_for(self.fragment) {
                self.bucket = self.buckets.len();
                return None;
            }
            self.bucket += 1;
            self.slot = 0;
        }
        None
    }
}

// Once a walk has ended, `next` keeps returning None.
impl std::iter::FusedIterator for Candidates<'_> {}

/// SplitMix64 step: a small, well-mixed sequence from any seed.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    /// Builds a hash from its parts: sub-table, stored fragment, bits the index ignores.
    fn hash_of(subtable: u64, fragment: u64, low: u64) -> u64 {
        assert!(subtable < SUBTABLE_COUNT as u64 && fragment <= FRAGMENT_MASK);
        assert!(low < 1 << FRAGMENT_SHIFT);
        (subtable << (64 - SUBTABLE_BITS)) | (fragment << FRAGMENT_SHIFT) | low
    }

    fn sorted(addresses: impl Iterator<Item = Address>) -> Vec<Address> {
        let mut v: Vec<Address> = addresses.collect();
        v.sort();
        v
    }

    /// A complete scan from cursor 0, with a bound on the number of calls.
    fn full_scan(index: &Index, count: usize) -> Vec<Address> {
        let mut seen = Vec::new();
        let mut cursor = 0;
        for _ in 0..10_000_000 {
            cursor = index.scan(cursor, count, |_, a| seen.push(a));
            if cursor == 0 {
                return seen;
            }
        }
        panic!("scan did not terminate");
    }

    /// Every structural invariant: compact buckets, the probing invariant, counts.
    fn check_invariants(index: &Index) {
        let mut total = 0;
        for table in index.subtables.iter() {
            let mut count = 0;
            let mut largest_before = 0;
            for (j, bucket) in table.buckets.iter().enumerate() {
                let filled = bucket.count();
                if let Some(smallest) = bucket.entries().map(Entry::fragment).min() {
                    assert!(smallest >= largest_before, "run out of fragment order");
                    largest_before = bucket.entries().map(Entry::fragment).max().unwrap();
                }
                assert!(
                    bucket.slots[filled..].iter().all(|e| e.is_empty()),
                    "not compact"
                );
                for entry in bucket.entries() {
                    let home = table.home(entry.fragment());
                    assert!(home <= j, "entry before its home");
                    assert!(
                        table.buckets[home..j].iter().all(Bucket::is_full),
                        "gap in run"
                    );
                }
                count += filled;
            }
            assert_eq!(count, table.len as usize);
            total += count;
        }
        assert_eq!(total, index.len());
    }

    /// Keeps hashes uniform but confined to sub-tables 0..4, so those resize often.
    const NARROW_MASK: u64 = u64::MAX >> (SUBTABLE_BITS - 2);

    fn random_hashes(seed: u64, count: usize) -> Vec<u64> {
        let mut state = seed;
        (0..count).map(|_| splitmix64(&mut state)).collect()
    }

    // Proves inserted entries are found, removed ones vanish, and the rest survive removals.
    #[test]
    fn insert_lookup_remove_roundtrip() {
        let hashes = random_hashes(1, 20_000);
        let mut index = Index::new();
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        assert_eq!(index.len(), hashes.len());
        for (i, &h) in hashes.iter().enumerate() {
            assert!(index.candidates(h).any(|a| a == Address(i as u64)));
        }
        for (i, &h) in hashes.iter().enumerate().step_by(2) {
            assert!(index.remove(h, Address(i as u64)));
        }
        check_invariants(&index);
        for (i, &h) in hashes.iter().enumerate() {
            let found = index.candidates(h).any(|a| a == Address(i as u64));
            assert_eq!(found, i % 2 == 1, "entry {i}");
        }
        assert_eq!(index.len(), hashes.len() / 2);
    }

    // Proves many entries with one fragment are all returned, in runs longer than a bucket.
    #[test]
    fn equal_fragments_are_all_candidates() {
        let mut index = Index::new();
        let entries = 300u64;
        for i in 0..entries {
            index.insert(hash_of(9, 0x123456, i), Address(1000 + i));
        }
        check_invariants(&index);
        let all = sorted(index.candidates(hash_of(9, 0x123456, 77_777)));
        assert_eq!(all, (1000..1000 + entries).map(Address).collect::<Vec<_>>());
        for i in (0..entries).step_by(2) {
            assert!(index.remove(hash_of(9, 0x123456, i), Address(1000 + i)));
        }
        check_invariants(&index);
        let rest = sorted(index.candidates(hash_of(9, 0x123456, 0)));
        assert_eq!(
            rest,
            (1000..1000 + entries)
                .skip(1)
                .step_by(2)
                .map(Address)
                .collect::<Vec<_>>()
        );
    }

    // Proves a neighbouring fragment in the same bucket is filtered out of candidates.
    #[test]
    fn other_fragments_are_not_candidates() {
        let mut index = Index::new();
        index.insert(hash_of(3, 0x100, 0), Address(1));
        index.insert(hash_of(3, 0x101, 0), Address(2));
        index.insert(hash_of(4, 0x100, 0), Address(3));
        assert_eq!(
            sorted(index.candidates(hash_of(3, 0x100, 5))),
            vec![Address(1)]
        );
        assert_eq!(
            sorted(index.candidates(hash_of(3, 0x101, 5))),
            vec![Address(2)]
        );
        assert_eq!(
            sorted(index.candidates(hash_of(4, 0x100, 5))),
            vec![Address(3)]
        );
        assert_eq!(index.candidates(hash_of(3, 0x102, 0)).count(), 0);
    }

    // Proves entries homed in the last bucket spill past the end and stay reachable.
    #[test]
    fn runs_past_the_last_bucket_use_spill_buckets() {
        let mut index = Index::new();
        for i in 0..100u64 {
            index.insert(hash_of(7, FRAGMENT_MASK, i), Address(i));
        }
        assert!(index.shape().spill_buckets > 0, "{:?}", index.shape());
        check_invariants(&index);
        assert_eq!(index.candidates(hash_of(7, FRAGMENT_MASK, 0)).count(), 100);
        let mut scanned = sorted(full_scan(&index, 3).into_iter());
        scanned.dedup(); // SCAN may repeat entries; it must not miss or invent any.
        assert_eq!(scanned, (0..100).map(Address).collect::<Vec<_>>());
        for i in 0..100u64 {
            assert!(index.remove(hash_of(7, FRAGMENT_MASK, i), Address(i)));
            check_invariants(&index);
        }
        assert!(index.is_empty());
    }

    // Proves replace changes only the matching (hash, old) entry and reports misses.
    #[test]
    fn replace_moves_only_the_matching_entry() {
        let mut index = Index::new();
        let h = hash_of(1, 42, 0);
        index.insert(h, Address(10));
        index.insert(h, Address(11));
        assert!(index.replace(h, Address(10), Address(20)));
        assert!(!index.replace(h, Address(10), Address(30)));
        assert!(!index.replace(hash_of(1, 43, 0), Address(11), Address(30)));
        assert_eq!(sorted(index.candidates(h)), vec![Address(11), Address(20)]);
        assert_eq!(index.len(), 2);
    }

    // Proves remove reports false for absent entries and changes nothing.
    #[test]
    fn remove_absent_is_false() {
        let mut index = Index::new();
        assert!(!index.remove(5, Address(5)));
        index.insert(hash_of(2, 2, 0), Address(5));
        assert!(!index.remove(hash_of(2, 2, 0), Address(6)));
        assert!(!index.remove(hash_of(2, 3, 0), Address(5)));
        assert_eq!(index.len(), 1);
    }

    // Proves the extreme storable addresses round-trip and the reserved one is refused.
    #[test]
    fn address_limits() {
        let mut index = Index::new();
        index.insert(hash_of(0, 0, 0), Address(0));
        index.insert(hash_of(0, 0, 1), Address(ADDRESS_RESERVED - 1));
        let found = sorted(index.candidates(hash_of(0, 0, 0)));
        assert_eq!(found, vec![Address(0), Address(ADDRESS_RESERVED - 1)]);
        let refused = std::panic::catch_unwind(move || {
            index.insert(hash_of(0, 0, 2), Address(ADDRESS_RESERVED));
        });
        assert!(refused.is_err());
    }

    // Proves a scan interrupted by growth (many inserts) still visits every original entry.
    #[test]
    fn scan_across_growth_visits_everything_present() {
        let mut index = Index::new();
        let mut state = 11;
        let narrow = |state: &mut u64| splitmix64(state) & NARROW_MASK;
        let originals: Vec<(u64, Address)> = (0..20_000)
            .map(|i| (narrow(&mut state), Address(i)))
            .collect();
        for &(h, a) in &originals {
            index.insert(h, a);
        }
        let home_buckets_before = index.shape().home_buckets;
        let mut seen = HashSet::new();
        let mut cursor = index.scan(0, 500, |_, a| {
            seen.insert(a);
        });
        let mut next_address = 1_000_000;
        while cursor != 0 {
            for _ in 0..500 {
                index.insert(narrow(&mut state), Address(next_address));
                next_address += 1;
            }
            cursor = index.scan(cursor, 500, |_, a| {
                seen.insert(a);
            });
        }
        check_invariants(&index);
        assert!(
            index.shape().home_buckets > 2 * home_buckets_before,
            "no growth mid-scan"
        );
        assert!(originals.iter().all(|(_, a)| seen.contains(a)));
    }

    // Proves a scan interrupted by shrinking and shift-back deletions still visits survivors.
    #[test]
    fn scan_across_shrink_visits_everything_present() {
        let mut index = Index::new();
        let hashes = random_hashes(5, 60_000);
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h & NARROW_MASK, Address(i as u64));
        }
        let home_buckets_before = index.shape().home_buckets;
        let keep = |i: usize| i % 7 == 3;
        let mut seen = HashSet::new();
        let mut cursor = 0;
        let mut doomed = (0..hashes.len()).filter(|&i| !keep(i));
        loop {
            cursor = index.scan(cursor, 300, |_, a| {
                seen.insert(a);
            });
            if cursor == 0 {
                break;
            }
            for i in doomed.by_ref().take(1_500) {
                assert!(index.remove(hashes[i] & NARROW_MASK, Address(i as u64)));
            }
        }
        check_invariants(&index);
        assert!(
            index.shape().home_buckets * 2 < home_buckets_before,
            "no shrink mid-scan"
        );
        assert!((0..hashes.len())
            .filter(|&i| keep(i))
            .all(|i| seen.contains(&Address(i as u64))));
    }

    // Proves scan passes each entry's 36-bit hash position and honours small counts.
    #[test]
    fn scan_reports_hash_positions_in_small_steps() {
        let mut index = Index::new();
        let hashes = random_hashes(21, 5_000);
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        let mut calls = 0;
        let mut cursor = 0;
        let mut seen = 0;
        loop {
            let mut step = 0;
            cursor = index.scan(cursor, 10, |position, a| {
                assert_eq!(position, hashes[a.0 as usize] >> FRAGMENT_SHIFT);
                step += 1;
            });
            seen += step;
            calls += 1;
            if cursor == 0 {
                break;
            }
            assert!(
                step >= 10,
                "a call that is not the last visits at least `count`"
            );
        }
        assert!(
            seen >= hashes.len() && calls > 100,
            "seen {seen} in {calls} calls"
        );
        assert_eq!(index.scan(CURSOR_LIMIT, 10, |_, _| panic!("visited")), 0);
    }

    // Proves (position, address) pairs from a scan rebuild an equivalent index (checkpoint use).
    #[test]
    fn scan_positions_rebuild_the_index() {
        let hashes = random_hashes(31, 20_000);
        let mut index = Index::new();
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        let mut saved = Vec::new();
        let mut cursor = 0;
        loop {
            cursor = index.scan(cursor, 1000, |position, a| saved.push((position, a)));
            if cursor == 0 {
                break;
            }
        }
        saved.sort();
        saved.dedup();
        let mut rebuilt = Index::new();
        for &(position, a) in &saved {
            rebuilt.insert(position << HASH_POSITION_SHIFT, a);
        }
        assert_eq!(rebuilt.len(), index.len());
        for &h in hashes.iter().step_by(13) {
            assert_eq!(sorted(rebuilt.candidates(h)), sorted(index.candidates(h)));
        }
    }

    // Proves removing every entry gives the memory back and clear() resets everything.
    #[test]
    fn memory_returns_after_removal_and_clear() {
        let mut index = Index::new();
        let empty_bytes = index.memory_bytes();
        let hashes = random_hashes(3, 50_000);
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        assert!(index.memory_bytes() > empty_bytes + 50_000 * 8);
        for (i, &h) in hashes.iter().enumerate() {
            assert!(index.remove(h, Address(i as u64)));
        }
        assert_eq!(index.memory_bytes(), empty_bytes);
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.memory_bytes(), empty_bytes);
        assert_eq!(index.candidates(hashes[0]).count(), 0);
        assert_eq!(full_scan(&index, 100).len(), 0);
    }

    // Proves with_capacity pre-sizes: filling to capacity rebuilds no sub-table (only a
    // few spill buckets may be appended) and clear() returns to the pre-sized state.
    #[test]
    fn with_capacity_does_not_resize() {
        let keys = 200_000;
        let mut index = Index::with_capacity(keys);
        let bytes = index.memory_bytes();
        let home_buckets = index.shape().home_buckets;
        assert!(bytes >= keys * 8, "too small: {bytes}");
        for (i, h) in random_hashes(8, keys).into_iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        assert_eq!(index.shape().home_buckets, home_buckets);
        assert!(
            index.memory_bytes() < bytes + bytes / 100,
            "{:?}",
            index.shape()
        );
        index.clear();
        assert_eq!(index.memory_bytes(), bytes);
    }

    // Proves the RAM cost stays within the 16 bytes/key target at one million keys.
    #[test]
    fn bytes_per_key_at_one_million() {
        let keys = 1_000_000;
        let mut index = Index::new();
        for (i, h) in random_hashes(4, keys).into_iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        let per_key = index.memory_bytes() as f64 / keys as f64;
        assert!(per_key <= 16.0, "{per_key} bytes/key, {:?}", index.shape());
    }

    // Proves mass removal keeps RAM per remaining key within 16 bytes plus fixed headers.
    #[test]
    fn bytes_per_key_while_shrinking() {
        let keys = 400_000;
        let hashes = random_hashes(12, keys);
        let mut index = Index::new();
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        let fixed_bytes = Index::new().memory_bytes() as f64;
        for (i, &h) in hashes.iter().enumerate().take(keys - 50_000) {
            assert!(index.remove(h, Address(i as u64)));
            if i % 10_000 == 0 {
                let per_key = (index.memory_bytes() as f64 - fixed_bytes) / index.len() as f64;
                assert!(
                    per_key <= 16.0,
                    "{per_key} bytes/key at {} keys",
                    index.len()
                );
            }
        }
        check_invariants(&index);
    }

    // Proves random_entry returns only present entries, spreads over them, and handles empty.
    #[test]
    fn random_entry_returns_present_entries() {
        let mut index = Index::new();
        assert_eq!(index.random_entry(1), None);
        for i in 0..1_000u64 {
            index.insert(hash_of(i % SUBTABLE_COUNT as u64, i, 0), Address(i));
        }
        let picks: HashSet<Address> = (0..2_000).filter_map(|s| index.random_entry(s)).collect();
        assert!(picks.iter().all(|a| a.0 < 1_000));
        assert!(picks.len() > 500, "only {} distinct", picks.len());
        let mut single = Index::new();
        single.insert(hash_of(4000, 5, 0), Address(77));
        assert!((0..50).all(|s| single.random_entry(s) == Some(Address(77))));
    }

    // Proves for_each reports each entry exactly once.
    #[test]
    fn for_each_reports_each_entry_once() {
        let mut index = Index::new();
        for (i, h) in random_hashes(6, 30_000).into_iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        let mut all = Vec::new();
        index.for_each(|a| all.push(a));
        all.sort();
        assert_eq!(all, (0..30_000).map(Address).collect::<Vec<_>>());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert {
            subtable: u8,
            fragment: Option<u8>,
            random_fragment: u32,
            low: u32,
        },
        Remove(usize),
        RemoveAbsent(usize),
        Replace(usize),
        Check(usize),
        CheckAbsent {
            subtable: u8,
            fragment: u32,
        },
        ScanStep(u8),
    }

    /// Few sub-tables (so they resize a lot) and few fragments (so they collide and spill).
    const TEST_SUBTABLES: [u64; 4] = [0, 1, 2049, 4095];
    const TEST_FRAGMENTS: [u64; 4] = [0, 1, 0x80_0000, FRAGMENT_MASK];

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..4u8, prop::option::weighted(0.3, 0..4u8), any::<u32>(), any::<u32>()).prop_map(
                |(subtable, fragment, random_fragment, low)| Op::Insert { subtable, fragment, random_fragment, low }
            ),
            4 => any::<usize>().prop_map(Op::Remove),
            1 => any::<usize>().prop_map(Op::RemoveAbsent),
            1 => any::<usize>().prop_map(Op::Replace),
            2 => any::<usize>().prop_map(Op::Check),
            1 => (0..4u8, any::<u32>()).prop_map(|(subtable, fragment)| Op::CheckAbsent { subtable, fragment }),
            2 => (1..40u8).prop_map(Op::ScanStep),
        ]
    }

    /// The model and the bookkeeping of one in-progress scan.
    #[derive(Default)]
    struct Model {
        by_hash: HashMap<u64, Vec<Address>>,
        /// Addresses by the 36 hash bits the index compares (what candidates must return).
        by_position: HashMap<u64, Vec<Address>>,
        /// Answer candidates from `by_position` alone (long runs) instead of cross-checking.
        fast: bool,
        live: Vec<(u64, Address)>,
        next_address: u64,
        scan: Option<ScanState>,
    }

    struct ScanState {
        cursor: u64,
        visited: HashSet<Address>,
        present_throughout: HashSet<Address>,
        present_ever: HashSet<Address>,
    }

    impl Model {
        fn fresh_address(&mut self) -> Address {
            self.next_address += 1;
            Address(self.next_address * 7919 % (1 << 39))
        }

        fn add(&mut self, hash: u64, address: Address) {
            self.by_hash.entry(hash).or_default().push(address);
            self.by_position
                .entry(hash >> FRAGMENT_SHIFT)
                .or_default()
                .push(address);
            self.live.push((hash, address));
            if let Some(scan) = &mut self.scan {
                scan.present_ever.insert(address);
            }
        }

        fn take(&mut self, pick: usize) -> Option<(u64, Address)> {
            if self.live.is_empty() {
                return None;
            }
            let (hash, address) = self.live.swap_remove(pick % self.live.len());
            let list = self.by_hash.get_mut(&hash).unwrap();
            list.retain(|a| *a != address);
            let list = self.by_position.get_mut(&(hash >> FRAGMENT_SHIFT)).unwrap();
            list.retain(|a| *a != address);
            if let Some(scan) = &mut self.scan {
                scan.present_throughout.remove(&address);
            }
            Some((hash, address))
        }

        /// Model answer for candidates(hash): every address whose hash agrees on 36 bits.
        fn candidates(&self, hash: u64) -> Vec<Address> {
            let prefix = hash >> FRAGMENT_SHIFT;
            let matching = self
                .by_hash
                .iter()
                .filter(|(h, _)| *h >> FRAGMENT_SHIFT == prefix);
            let fast = self.by_position.get(&prefix).into_iter().flatten().copied();
            let fast = sorted(fast);
            if !self.fast {
                let slow = sorted(matching.flat_map(|(_, list)| list.iter().copied()));
                assert_eq!(slow, fast, "model bookkeeping");
            }
            fast
        }
    }

    fn apply(index: &mut Index, model: &mut Model, op: Op) {
        match op {
            Op::Insert {
                subtable,
                fragment,
                random_fragment,
                low,
            } => {
                let fragment = match fragment {
                    Some(i) => TEST_FRAGMENTS[i as usize],
                    None => u64::from(random_fragment) & FRAGMENT_MASK,
                };
                let low = u64::from(low) & ((1 << FRAGMENT_SHIFT) - 1);
                let hash = hash_of(TEST_SUBTABLES[subtable as usize], fragment, low);
                let address = model.fresh_address();
                index.insert(hash, address);
                model.add(hash, address);
            }
            Op::Remove(pick) => {
                if let Some((hash, address)) = model.take(pick) {
                    assert!(index.remove(hash, address));
                }
            }
            Op::RemoveAbsent(pick) => {
                let hash = model
                    .live
                    .get(pick % model.live.len().max(1))
                    .map_or(pick as u64, |e| e.0);
                let absent = model.fresh_address();
                assert!(!index.remove(hash, absent));
            }
            Op::Replace(pick) => {
                if let Some((hash, old)) = model.take(pick) {
                    let new = model.fresh_address();
                    assert!(index.replace(hash, old, new));
                    model.add(hash, new);
                }
            }
            Op::Check(pick) => {
                if let Some(&(hash, _)) = model.live.get(pick % model.live.len().max(1)) {
                    assert_eq!(sorted(index.candidates(hash)), model.candidates(hash));
                }
            }
            Op::CheckAbsent { subtable, fragment } => {
                let hash = hash_of(
                    TEST_SUBTABLES[subtable as usize],
                    u64::from(fragment) & FRAGMENT_MASK,
                    0,
                );
                assert_eq!(sorted(index.candidates(hash)), model.candidates(hash));
            }
            Op::ScanStep(count) => scan_step(index, model, usize::from(count)),
        }
    }

    fn scan_step(index: &Index, model: &mut Model, count: usize) {
        let scan = model.scan.get_or_insert_with(|| {
            let present: HashSet<Address> = model.live.iter().map(|e| e.1).collect();
            ScanState {
                cursor: 0,
                visited: HashSet::new(),
                present_throughout: present.clone(),
                present_ever: present,
            }
        });
        scan.cursor = index.scan(scan.cursor, count, |_, a| {
            scan.visited.insert(a);
        });
        if scan.cursor == 0 {
            let scan = model.scan.take().unwrap();
            assert!(
                scan.present_throughout.is_subset(&scan.visited),
                "scan missed an entry"
            );
            assert!(
                scan.visited.is_subset(&scan.present_ever),
                "scan invented an entry"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        // Proves the index matches a HashMap model under random inserts, removes, replaces,
        // candidate checks and interleaved scans, across many resizes and collision runs.
        #[test]
        fn matches_hashmap_model(ops in prop::collection::vec(op_strategy(), 1..1500)) {
            let mut index = Index::new();
            let mut model = Model::default();
            for (step, op) in ops.into_iter().enumerate() {
                apply(&mut index, &mut model, op);
                prop_assert_eq!(index.len(), model.live.len());
                if step % 100 == 0 {
                    check_invariants(&index);
                }
            }
            check_invariants(&index);
            let mut all = Vec::new();
            index.for_each(|a| all.push(a));
            all.sort();
            prop_assert_eq!(&all, &sorted(model.live.iter().map(|e| e.1)));
            let scanned: HashSet<Address> = full_scan(&index, 7).into_iter().collect();
            prop_assert_eq!(scanned, all.into_iter().collect::<HashSet<_>>());
        }
    }

    // Proves the model agreement over a long deterministic run (2M ops; live entries in 4
    // sub-tables swing between ~0 and ~125k); run with `--release -- --ignored`.
    #[test]
    #[ignore]
    fn long_model_soak() {
        let mut index = Index::new();
        let mut model = Model {
            fast: true,
            ..Model::default()
        };
        let mut state = 77u64;
        for step in 0..2_000_000u64 {
            let r = splitmix64(&mut state);
            let pick = splitmix64(&mut state) as usize;
            let growing = (step / 400_000) % 2 == 0;
            let inserts = if growing { 8 } else { 3 };
            let op = match r % 16 {
                k if k < inserts => Op::Insert {
                    subtable: (r >> 8) as u8 % 4,
                    fragment: if r & (1 << 20) != 0 {
                        Some((r >> 12) as u8 % 4)
                    } else {
                        None
                    },
                    random_fragment: (r >> 24) as u32,
                    low: (r >> 40) as u32,
                },
                0..=10 => Op::Remove(pick),
                11 => Op::Replace(pick),
                12 => Op::Check(pick),
                13 => Op::CheckAbsent {
                    subtable: (r >> 8) as u8 % 4,
                    fragment: (r >> 24) as u32,
                },
                14 => Op::RemoveAbsent(pick),
                _ => Op::ScanStep((r >> 8) as u8 % 200 + 1),
            };
            apply(&mut index, &mut model, op);
            assert_eq!(index.len(), model.live.len());
            if step % 50_000 == 0 {
                check_invariants(&index);
            }
        }
        check_invariants(&index);
        let mut all = Vec::new();
        index.for_each(|a| all.push(a));
        all.sort();
        assert_eq!(all, sorted(model.live.iter().map(|e| e.1)));
    }

    // Prints bytes/key and ns/op at ten million keys; run with
    // `cargo test --release --lib index::tests::ten_million -- --ignored --nocapture`.
    // Proves (asserts) the 16 bytes/key target at 10M keys.
    #[test]
    #[ignore]
    fn ten_million_keys_report() {
        let keys = 10_000_000;
        let hashes = random_hashes(10, keys);
        let rss_before = resident_bytes();
        let started = std::time::Instant::now();
        let mut index = Index::new();
        for (i, &h) in hashes.iter().enumerate() {
            index.insert(h, Address(i as u64));
        }
        let insert_ns = started.elapsed().as_nanos() as f64 / keys as f64;
        let rss_after = resident_bytes();
        let started = std::time::Instant::now();
        let mut found = 0usize;
        for (i, &h) in hashes.iter().enumerate() {
            found += index.candidates(h).filter(|a| a.0 == i as u64).count();
        }
        let hit_ns = started.elapsed().as_nanos() as f64 / keys as f64;
        let misses = random_hashes(99, keys);
        let started = std::time::Instant::now();
        let false_candidates: usize = misses.iter().map(|&h| index.candidates(h).count()).sum();
        let miss_ns = started.elapsed().as_nanos() as f64 / keys as f64;
        let per_key = index.memory_bytes() as f64 / keys as f64;
        let probed: usize = misses.iter().map(|&h| miss_probe_buckets(&index, h)).sum();
        let walked: usize = misses.iter().map(|&h| insert_walk_buckets(&index, h)).sum();
        println!(
            "buckets walked per insert (to the end of the run): {:.3}",
            walked as f64 / keys as f64
        );
        let (mut calls, mut visited, mut cursor) = (0usize, 0usize, 0);
        loop {
            cursor = index.scan(cursor, 10, |_, _| visited += 1);
            calls += 1;
            if cursor == 0 {
                break;
            }
        }
        println!(
            "scan count 10: {calls} calls, {:.2} entries per call, {:.4} visits per entry",
            visited as f64 / calls as f64,
            visited as f64 / keys as f64
        );
        println!(
            "buckets read per miss (and per full candidates() walk): {:.3}",
            probed as f64 / keys as f64
        );
        println!(
            "keys {keys}: {per_key:.2} bytes/key (memory_bytes {}), rss delta {:.2} bytes/key, \
             insert {insert_ns:.1} ns/op, hit {hit_ns:.1} ns/op, miss {miss_ns:.1} ns/op, \
             false candidates per miss {:.5}, shape {:?}",
            index.memory_bytes(),
            (rss_after.saturating_sub(rss_before)) as f64 / keys as f64,
            false_candidates as f64 / keys as f64,
            index.shape()
        );
        assert_eq!(found, keys);
        assert!(per_key <= 16.0);
    }

    /// Buckets a lookup of `hash` reads: from its home through the first non-full bucket.
    fn miss_probe_buckets(index: &Index, hash: u64) -> usize {
        let (subtable, fragment) = split_hash(hash);
        let table = &index.subtables[subtable];
        if table.buckets.is_empty() {
            return 0;
        }
        let run = table.buckets[table.home(fragment)..]
            .iter()
            .take_while(|b| !b.ends_run_for(fragment))
            .count();
        (run + 1).min(table.buckets.len() - table.home(fragment))
    }

    /// Buckets an insert of `hash` touches: from its home through the first non-full bucket.
    fn insert_walk_buckets(index: &Index, hash: u64) -> usize {
        let (subtable, fragment) = split_hash(hash);
        let table = &index.subtables[subtable];
        let home = table.home(fragment);
        let run = table.buckets[home..]
            .iter()
            .take_while(|b| b.is_full())
            .count();
        (run + 1).min(table.buckets.len() - home)
    }

    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: usize = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }
}
