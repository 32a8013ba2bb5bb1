//! The paged layout of big hashes and sets (`docs/collections.md` section 3): a root record
//! (a Put of kind hash/set with `FLAG_PAGED`) lists directory pages; each directory page
//! lists leaf pages; each leaf holds the members whose *position* (a 63-bit hash of the
//! member, the HSCAN/SSCAN order) falls in its range, sorted by (position, bytes).
//!
//! It is a two-level B+tree over positions with fixed depth: the root and directory entries
//! carry the first position of the range below them, so a lookup is two binary searches.
//! An update rewrites the leaves it changed, the directory pages whose entries changed, and
//! the root: one leaf (≤ 8 KiB) + one directory page (≤ 6 KiB) + a small root per
//! single-member command without a split or merge.
//!
//! Pages are log records of type 7 (`RecordType::Page`) carrying their owner's db, key and
//! value kind, never indexed: a page is live exactly while the current root reaches it.
//! Live-byte accounting of pages is done here (written pages count, replaced pages stop
//! counting; a root deleted or overwritten releases all of its pages, `release`).
//!
//! Invariants (checked by `load`): the first entry of the root and of the first directory
//! page starts at position 0; entries are strictly ascending; every leaf's members fall in
//! its range, are strictly ascending by (position, bytes) and non-empty; counts add up.

use super::format::{RecordType, FLAG_PAGED};
use super::index::Address;
use super::shard::{OwnedRecord, Shard};
use super::{Db, StorageError, ValueKind};

/// A hashtable-encoded collection whose one-record encoding passes this is stored paged.
pub const PROMOTE_BYTES: usize = 16 * 1024;
/// A paged collection whose members' encoding falls under this goes back to one record.
pub const DEMOTE_BYTES: usize = 4 * 1024;
/// A leaf whose payload would pass this is split into halves of about half of it.
pub const LEAF_MAX_BYTES: usize = 8 * 1024;
/// Two neighbouring leaves are merged when together they fall under this (the size of a
/// split's halves: a split leaf must lose about half of its contents before a merge).
pub const LEAF_MERGE_BYTES: usize = 4 * 1024;
/// Leaves are filled up to this when a collection is paged from scratch.
const LEAF_FILL_BYTES: usize = 6 * 1024;
/// A directory page holds at most this many leaf entries (24 bytes each: ≤ 6 KiB).
pub const DIR_MAX_ENTRIES: usize = 256;
/// Neighbouring directory pages are merged when together they hold at most this many.
const DIR_MERGE_ENTRIES: usize = 64;

const ROOT_VERSION: u8 = 1;
const PAGE_LEAF: u8 = 1;
pub(crate) const PAGE_DIR: u8 = 2;
const ENTRY_BYTES: usize = 24;
/// Where a directory page's entries start: its kind byte and entry count.
const DIR_ENTRIES_AT: usize = 1 + 4;
const ROOT_HEADER_BYTES: usize = 1 + 1 + 8 + 8 + 4;

/// Where a member sits in the position space: a fixed hash of its bytes, never 0 and below
/// 2^63 (the HSCAN/SSCAN cursor of the hashtable encoding).
pub fn position(member: &[u8]) -> u64 {
    (super::key_hash(0, member) >> 1) | 1
}

/// A root or directory entry: the page covering positions from `first` up to the next
/// entry's `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub first: u64,
    pub addr: u64,
    /// Payload bytes of the page record.
    pub len: u32,
    /// Members below this entry.
    pub count: u32,
}

/// The tree of a loaded paged collection, kept by the in-memory value so that storing it
/// rewrites only what changed.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    dirs: Vec<Entry>,
    leaves: Vec<Vec<Entry>>,
    /// Positions of members added, changed or removed since the load.
    pub touched: Vec<u64>,
    /// Set by `load_partial`: only some leaves' members were read.
    partial: Option<Partial>,
}

/// What a partial load read (`load_partial`): directory pages and leaves, and the totals of
/// the members it did not read, so an update can count the whole collection.
#[derive(Clone, Debug, Default)]
struct Partial {
    dir_read: Vec<bool>,
    /// Per directory page, per leaf entry (empty for a page not read).
    leaf_read: Vec<Vec<bool>>,
    rest_count: u64,
    rest_bytes: u64,
}

impl Tree {
    /// Members of the collection that the load did not read (0 after a whole load).
    pub fn rest_count(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.rest_count as usize)
    }

    /// Encoded bytes of the members the load did not read.
    pub fn rest_bytes(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.rest_bytes as usize)
    }

    pub fn is_partial(&self) -> bool {
        self.partial.is_some()
    }
}

/// An element of a collection: a hash pair or a set member.
pub trait Elem {
    fn name(&self) -> &[u8];
    fn value(&self) -> Option<&[u8]>;
    fn make(name: Vec<u8>, value: Option<Vec<u8>>) -> Self;
}

impl Elem for (Vec<u8>, Vec<u8>) {
    fn name(&self) -> &[u8] {
        &self.0
    }
    fn value(&self) -> Option<&[u8]> {
        Some(&self.1)
    }
    fn make(name: Vec<u8>, value: Option<Vec<u8>>) -> Self {
        (name, value.unwrap_or_default())
    }
}

impl Elem for Vec<u8> {
    fn name(&self) -> &[u8] {
        self
    }
    fn value(&self) -> Option<&[u8]> {
        None
    }
    fn make(name: Vec<u8>, _: Option<Vec<u8>>) -> Self {
        name
    }
}

pub(crate) fn varint_len(n: usize) -> usize {
    let mut v = n as u64;
    let mut l = 1;
    while v >= 0x80 {
        v >>= 7;
        l += 1;
    }
    l
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes `e` takes in a leaf (and in the one-record encoding).
pub fn elem_bytes<E: Elem>(e: &E) -> usize {
    let n = e.name().len();
    varint_len(n) + n + e.value().map_or(0, |v| varint_len(v.len()) + v.len())
}

fn corrupt(what: &str) -> StorageError {
    StorageError::Corrupt(format!("paged collection: {what}"))
}

/// A bounds-checked reader over a page's bytes (shared with `paged_zset`).
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| corrupt("truncated"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, StorageError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, StorageError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(crate) fn varint(&mut self) -> Result<usize, StorageError> {
        let mut v: u64 = 0;
        for i in 0..5 {
            let byte = self.u8()?;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return usize::try_from(v).map_err(|_| corrupt("varint"));
            }
        }
        Err(corrupt("varint too long"))
    }
    fn string(&mut self) -> Result<&'a [u8], StorageError> {
        let n = self.varint()?;
        self.take(n)
    }
    fn done(&self) -> Result<(), StorageError> {
        (self.at == self.b.len())
            .then_some(())
            .ok_or_else(|| corrupt("trailing bytes"))
    }
}

// ---- root and directory encodings ---------------------------------------------------------

/// A decoded root payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    /// The one-record codec's encoding byte (the hashtable encoding).
    pub encoding: u8,
    pub count: u64,
    /// Sum of `elem_bytes` over the members.
    pub bytes: u64,
    pub dirs: Vec<Entry>,
}

fn put_entries(out: &mut Vec<u8>, entries: &[Entry]) {
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.first.to_le_bytes());
        out.extend_from_slice(&e.addr.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&e.count.to_le_bytes());
    }
}

fn read_entries(r: &mut Reader) -> Result<Vec<Entry>, StorageError> {
    let n = r.u32()? as usize;
    if n == 0 || n.saturating_mul(ENTRY_BYTES) > r.b.len() - r.at {
        return Err(corrupt("bad entry count"));
    }
    read_entry_run(r, n, "entries out of order or empty")
}

/// `n` directory entries in order of their first member, none empty (`what`: the error
/// otherwise).
fn read_entry_run(r: &mut Reader, n: usize, what: &str) -> Result<Vec<Entry>, StorageError> {
    let mut v: Vec<Entry> = Vec::with_capacity(n);
    for _ in 0..n {
        let e = Entry {
            first: r.u64()?,
            addr: r.u64()?,
            len: r.u32()?,
            count: r.u32()?,
        };
        if v.last().is_some_and(|p| p.first >= e.first) || e.count == 0 {
            return Err(corrupt(what));
        }
        v.push(e);
    }
    Ok(v)
}

impl Root {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ROOT_HEADER_BYTES + self.dirs.len() * ENTRY_BYTES);
        out.push(ROOT_VERSION);
        out.push(self.encoding);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
        put_entries(&mut out, &self.dirs);
        out
    }

    pub fn decode(b: &[u8]) -> Result<Root, StorageError> {
        let mut r = Reader { b, at: 0 };
        if r.u8()? != ROOT_VERSION {
            return Err(corrupt("unknown root version"));
        }
        let encoding = r.u8()?;
        let count = r.u64()?;
        let bytes = r.u64()?;
        let dirs = read_entries(&mut r)?;
        r.done()?;
        if dirs[0].first != 0 || dirs.iter().map(|e| u64::from(e.count)).sum::<u64>() != count {
            return Err(corrupt("root entries do not cover the collection"));
        }
        Ok(Root {
            encoding,
            count,
            bytes,
            dirs,
        })
    }
}

// ---- version-2 roots: base page + change list (`docs/collections.md` section 3a) ----------

const ROOT_VERSION_BASED: u8 = 2;
/// Page kind of a version-2 root's base page: the directory entries as of its write.
pub(crate) const PAGE_BASE: u8 = 6;
/// A root listing more directory pages than this is written as version 2 (default of
/// `StoreConfig::paged_base_min_dirs`).
pub const BASE_MIN_DIRS: usize = 64;
/// A version-2 root's change list is kept while its entries take at most this many bytes;
/// past it the next root write writes a new base page.
pub const CHANGE_MAX_BYTES: usize = 2 * 1024;
/// Budget of the per-shard cache of decoded base pages.
const BASE_CACHE_BYTES: usize = 1 << 20;
const ROOT_V2_HEADER_BYTES: usize = 1 + 1 + 8 + 8 + 8 + 4;

/// A version-2 root as it is on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BasedRoot {
    pub(crate) encoding: u8,
    pub(crate) count: u64,
    pub(crate) bytes: u64,
    pub(crate) base_addr: u64,
    pub(crate) base_len: u32,
    /// Entries replacing or inserting the base's entry of the same first position.
    pub(crate) upserts: Vec<Entry>,
    /// First positions of base entries removed (strictly ascending).
    pub(crate) deletes: Vec<u64>,
}

impl BasedRoot {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            ROOT_V2_HEADER_BYTES + 8 + self.upserts.len() * ENTRY_BYTES + self.deletes.len() * 8,
        );
        out.push(ROOT_VERSION_BASED);
        out.push(self.encoding);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
        out.extend_from_slice(&self.base_addr.to_le_bytes());
        out.extend_from_slice(&self.base_len.to_le_bytes());
        // `put_entries` refuses nothing; an empty change list is a count of 0.
        out.extend_from_slice(&(self.upserts.len() as u32).to_le_bytes());
        for e in &self.upserts {
            out.extend_from_slice(&e.first.to_le_bytes());
            out.extend_from_slice(&e.addr.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.extend_from_slice(&e.count.to_le_bytes());
        }
        out.extend_from_slice(&(self.deletes.len() as u32).to_le_bytes());
        for f in &self.deletes {
            out.extend_from_slice(&f.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Result<BasedRoot, StorageError> {
        let mut r = Reader { b, at: 0 };
        if r.u8()? != ROOT_VERSION_BASED {
            return Err(corrupt("not a version-2 root"));
        }
        let encoding = r.u8()?;
        let count = r.u64()?;
        let bytes = r.u64()?;
        let base_addr = r.u64()?;
        let base_len = r.u32()?;
        let n = r.u32()? as usize;
        if n.saturating_mul(ENTRY_BYTES) > b.len() - r.at {
            return Err(corrupt("bad change count"));
        }
        let upserts = read_entry_run(&mut r, n, "changes out of order or empty")?;
        let n = r.u32()? as usize;
        if n.saturating_mul(8) > b.len() - r.at {
            return Err(corrupt("bad delete count"));
        }
        let mut deletes: Vec<u64> = Vec::with_capacity(n);
        for _ in 0..n {
            let f = r.u64()?;
            if deletes.last().is_some_and(|&p| p >= f) {
                return Err(corrupt("deletes out of order"));
            }
            deletes.push(f);
        }
        r.done()?;
        Ok(BasedRoot {
            encoding,
            count,
            bytes,
            base_addr,
            base_len,
            upserts,
            deletes,
        })
    }

    /// The directory list: `base` with the changes applied, checked as a version-1 root.
    pub(crate) fn apply(&self, base: &[Entry]) -> Result<Root, StorageError> {
        let mut dirs = Vec::with_capacity(base.len() + self.upserts.len());
        let (mut ui, mut di) = (0, 0);
        for b in base {
            while ui < self.upserts.len() && self.upserts[ui].first < b.first {
                dirs.push(self.upserts[ui]);
                ui += 1;
            }
            if di < self.deletes.len() && self.deletes[di] < b.first {
                return Err(corrupt("change list deletes an entry not in the base"));
            }
            let deleted = di < self.deletes.len() && self.deletes[di] == b.first;
            if deleted {
                di += 1;
            }
            if ui < self.upserts.len() && self.upserts[ui].first == b.first {
                dirs.push(self.upserts[ui]);
                ui += 1;
            } else if !deleted {
                dirs.push(*b);
            }
        }
        dirs.extend_from_slice(&self.upserts[ui..]);
        if di != self.deletes.len() {
            return Err(corrupt("change list deletes an entry not in the base"));
        }
        let root = Root {
            encoding: self.encoding,
            count: self.count,
            bytes: self.bytes,
            dirs,
        };
        // The version-1 rules (order, first entry 0, counts) hold for the result.
        Root::decode(&root.encode())
    }

    /// The change list turning `base` into `dirs` (both strictly ascending by first).
    pub(crate) fn diff(base: &[Entry], dirs: &[Entry]) -> (Vec<Entry>, Vec<u64>) {
        let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        while i < base.len() || j < dirs.len() {
            match (base.get(i), dirs.get(j)) {
                (Some(b), Some(d)) if b.first == d.first => {
                    if b != d {
                        upserts.push(*d);
                    }
                    i += 1;
                    j += 1;
                }
                (Some(b), Some(d)) if b.first < d.first => {
                    deletes.push(b.first);
                    i += 1;
                }
                (Some(b), None) => {
                    deletes.push(b.first);
                    i += 1;
                }
                (_, Some(d)) => {
                    upserts.push(*d);
                    j += 1;
                }
                (None, None) => unreachable!("loop condition"),
            }
        }
        (upserts, deletes)
    }

    fn change_bytes(upserts: &[Entry], deletes: &[u64]) -> usize {
        upserts.len() * ENTRY_BYTES + deletes.len() * 8
    }
}

/// The version byte of a root payload (1 or 2), if any.
pub(crate) fn root_version(payload: &[u8]) -> Option<u8> {
    payload.first().copied()
}

/// The base page (address, payload length) a root payload names, if it is version 2.
pub(crate) fn base_of(payload: &[u8]) -> Option<(u64, u32)> {
    (root_version(payload) == Some(ROOT_VERSION_BASED))
        .then(|| BasedRoot::decode(payload).ok())
        .flatten()
        .map(|b| (b.base_addr, b.base_len))
}

pub(crate) fn encode_base(entries: &[Entry]) -> Vec<u8> {
    let mut out = vec![PAGE_BASE];
    put_entries(&mut out, entries);
    out
}

fn decode_base(b: &[u8]) -> Result<Vec<Entry>, StorageError> {
    let mut r = Reader { b, at: 0 };
    if r.u8()? != PAGE_BASE {
        return Err(corrupt("not a base page"));
    }
    let v = read_entries(&mut r)?;
    r.done()?;
    Ok(v)
}

/// The shard's cache of decoded base pages, keyed by (address, sequence number of the
/// address's block): an entry is the contents of the page at that address for as long as
/// its block is not reused, so a hit never needs checking against the device.
#[derive(Default)]
pub(crate) struct BaseCache {
    map: std::collections::HashMap<(u64, u64), std::sync::Arc<Vec<Entry>>>,
    bytes: usize,
}

impl BaseCache {
    fn get(&self, addr: u64, block_seq: u64) -> Option<std::sync::Arc<Vec<Entry>>> {
        self.map.get(&(addr, block_seq)).cloned()
    }

    fn put(&mut self, addr: u64, block_seq: u64, v: std::sync::Arc<Vec<Entry>>) {
        let add = v.len() * ENTRY_BYTES;
        if add > BASE_CACHE_BYTES {
            return;
        }
        if self.bytes + add > BASE_CACHE_BYTES {
            self.map.clear();
            self.bytes = 0;
        }
        if let Some(old) = self.map.insert((addr, block_seq), v) {
            self.bytes -= old.len() * ENTRY_BYTES;
        }
        self.bytes += add;
    }
}

fn block_seq_of(shard: &Shard, addr: u64) -> Option<u64> {
    let (block, _) = shard.shared.layout.split(Address(addr));
    shard.blocks.get(&block).map(|b| b.block_seq)
}

/// The entries of (db, key)'s base page at `addr` (`len` bytes of payload): from the cache,
/// else read (on the asynchronous path a miss defers the command like any page).
pub(crate) fn base_entries(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    addr: u64,
    len: u32,
) -> Result<std::sync::Arc<Vec<Entry>>, StorageError> {
    let addr = shard.current_address(Address(addr)).0;
    let seq = block_seq_of(shard, addr).ok_or_else(|| corrupt("base page in no block"))?;
    if let Some(v) = shard.bases.get(addr, seq) {
        return Ok(v);
    }
    let rec = read_page(shard, db, key, addr)?;
    if rec.value.len() != len as usize {
        return Err(corrupt("base page length differs from its root's"));
    }
    let v = std::sync::Arc::new(decode_base(&rec.value)?);
    shard.bases.put(addr, seq, v.clone());
    Ok(v)
}

/// A root payload as on the device decoded to the version-1 form every reader uses (a
/// version-2 root's base page is read, or found in the cache).
pub(crate) fn decode_stored(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    payload: &[u8],
) -> Result<Root, StorageError> {
    if root_version(payload) != Some(ROOT_VERSION_BASED) {
        return Root::decode(payload);
    }
    let based = BasedRoot::decode(payload)?;
    let base = base_entries(shard, db, key, based.base_addr, based.base_len)?;
    based.apply(&base)
}

/// `decode_stored`, re-encoded as a version-1 payload (what `Shard::get_collection` hands
/// to commands); a version-1 payload is returned as it is.
pub(crate) fn expand_stored(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    payload: Vec<u8>,
) -> Result<Vec<u8>, StorageError> {
    if root_version(&payload) != Some(ROOT_VERSION_BASED) {
        return Ok(payload);
    }
    Ok(decode_stored(shard, db, key, &payload)?.encode())
}

/// The payload to append for a root whose version-1 form is `root` (`Shard::put_paged_root_as`):
/// version 1 up to `base_min_dirs` directory pages; else version 2 keeping the base of
/// `old` (the key's current root, when the new one was derived from it: `shares`) if it is
/// cached and the change list fits, or a new base page appended now under `seq`. Also
/// returns the old base page (address, length) when the new root no longer names it and
/// `shares` (the caller stops counting it once the new root is installed; without
/// `shares` the old root's release covers it), and whether a base page was appended.
/// Never reads the device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stored_form(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    kind: ValueKind,
    root: &[u8],
    old: Option<&[u8]>,
    shares: bool,
    seq: u64,
) -> Result<StoredRoot, StorageError> {
    let old_base = if shares { old.and_then(base_of) } else { None };
    if root_version(root) == Some(ROOT_VERSION_BASED) {
        // Already in the stored form (defrag's relocation of a base page).
        let keeps = base_of(root);
        return Ok(StoredRoot::new(
            root.to_vec(),
            old_base.filter(|b| Some(*b) != keeps),
            false,
        ));
    }
    let new = Root::decode(root)?;
    if new.dirs.len() <= shard.base_min_dirs {
        return Ok(StoredRoot::new(root.to_vec(), old_base, false));
    }
    if let Some((addr, len)) = old_base {
        let cur = shard.current_address(Address(addr)).0;
        let cached = block_seq_of(shard, cur).and_then(|s| shard.bases.get(cur, s));
        if let Some(base) = cached {
            let (upserts, deletes) = BasedRoot::diff(&base, &new.dirs);
            if BasedRoot::change_bytes(&upserts, &deletes) <= CHANGE_MAX_BYTES {
                let based = BasedRoot {
                    encoding: new.encoding,
                    count: new.count,
                    bytes: new.bytes,
                    base_addr: cur,
                    base_len: len,
                    upserts,
                    deletes,
                };
                return Ok(StoredRoot::new(based.encode(), None, false));
            }
        }
    }
    let payload = encode_base(&new.dirs);
    let addr = shard.append_page(db, key, kind, &payload, seq)?.0;
    if let Some(s) = block_seq_of(shard, addr) {
        shard
            .bases
            .put(addr, s, std::sync::Arc::new(new.dirs.clone()));
    }
    let based = BasedRoot {
        encoding: new.encoding,
        count: new.count,
        bytes: new.bytes,
        base_addr: addr,
        base_len: payload.len() as u32,
        upserts: Vec::new(),
        deletes: Vec::new(),
    };
    Ok(StoredRoot::new(based.encode(), old_base, true))
}

/// What `stored_form` decided.
pub(crate) struct StoredRoot {
    /// The root payload to append.
    pub(crate) payload: Vec<u8>,
    /// The old root's base page (address, length), no longer named.
    pub(crate) dead_base: Option<(u64, u32)>,
    /// A base page was appended.
    pub(crate) appended: bool,
}

impl StoredRoot {
    fn new(payload: Vec<u8>, dead_base: Option<(u64, u32)>, appended: bool) -> StoredRoot {
        StoredRoot {
            payload,
            dead_base,
            appended,
        }
    }
}

pub(crate) fn encode_dir(entries: &[Entry]) -> Vec<u8> {
    let mut out = vec![PAGE_DIR];
    put_entries(&mut out, entries);
    out
}

pub(crate) fn decode_dir(b: &[u8]) -> Result<Vec<Entry>, StorageError> {
    let mut r = Reader { b, at: 0 };
    let kind = r.u8()?;
    if kind != PAGE_DIR && kind != super::paged_zset::PAGE_ZSET_DIR {
        return Err(corrupt("not a directory page"));
    }
    let v = read_entries(&mut r)?;
    if kind == super::paged_zset::PAGE_ZSET_DIR {
        // A sorted set's score-tree directory page: the same entries, then one key per
        // leaf (`paged_zset.rs`), which generic walkers skip.
        r.at = super::paged_zset::dir_keys_end(b, r.at, v.len())?;
    }
    r.done()?;
    Ok(v)
}

fn encode_leaf<E: Elem>(elems: &[&E]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + elems.iter().map(|e| elem_bytes(*e)).sum::<usize>());
    out.push(PAGE_LEAF);
    put_varint(&mut out, elems.len() as u64);
    for e in elems {
        put_varint(&mut out, e.name().len() as u64);
        out.extend_from_slice(e.name());
        if let Some(v) = e.value() {
            put_varint(&mut out, v.len() as u64);
            out.extend_from_slice(v);
        }
    }
    out
}

/// Bytes of a leaf's members (what `update`'s merge rules compare), from its entry: the
/// leaf payload less its kind byte and member count.
fn leaf_members_bytes(e: &Entry) -> usize {
    (e.len as usize).saturating_sub(1 + varint_len(e.count as usize))
}

fn decode_leaf<E: Elem>(
    b: &[u8],
    has_values: bool,
    range: (u64, u64),
    out: &mut Vec<E>,
) -> Result<usize, StorageError> {
    let mut r = Reader { b, at: 0 };
    if r.u8()? != PAGE_LEAF {
        return Err(corrupt("not a leaf page"));
    }
    let n = r.varint()?;
    if n == 0 || n > b.len() {
        return Err(corrupt("bad leaf count"));
    }
    let mut prev: Option<(u64, &[u8])> = None;
    for _ in 0..n {
        let name = r.string()?;
        let value = if has_values {
            Some(r.string()?.to_vec())
        } else {
            None
        };
        let p = position(name);
        if p < range.0 || p >= range.1 || prev.is_some_and(|q| q >= (p, name)) {
            return Err(corrupt("leaf member out of its range or order"));
        }
        prev = Some((p, name));
        out.push(E::make(name.to_vec(), value));
    }
    r.done()?;
    Ok(n)
}

// ---- reading ---------------------------------------------------------------------------------

pub(crate) fn read_page(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    addr: u64,
) -> Result<OwnedRecord, StorageError> {
    let rec = shard.read_record(Address(addr))?;
    if rec.header.record_type != RecordType::Page || rec.header.db != db || rec.key != key {
        return Err(corrupt("page does not belong to its root"));
    }
    Ok(rec)
}

/// Read-ahead of one page walk in a restartable run (`prefetch`, "Read-ahead"): until its
/// first miss the walk reads pages as usual; from then on every page it reaches is only
/// noted as wanted unless it is in memory (a directory page in memory is still read, to
/// name its leaves), until the walk ends or the round's budget is spent (`full`); the walk
/// then fails with `Deferred` (`finish`). Outside a restartable run nothing is ever missed
/// and this is a plain `read_page`.
#[derive(Default)]
pub(crate) struct Ahead {
    missed: bool,
    full: bool,
}

impl Ahead {
    /// A walk starting now: in read-ahead mode at once when the run already missed (an
    /// earlier key of the command), so its pages count against the same budget.
    pub(crate) fn start() -> Ahead {
        Ahead {
            missed: super::prefetch::run_missed(),
            full: false,
        }
    }

    /// The page at `addr` (`len_bytes` of payload) when the walk can use it now; `None`
    /// when it missed (noted as wanted) or the budget is spent. After a miss a page is
    /// read only if `contents` (a directory page) and in memory.
    pub(crate) fn page(
        &mut self,
        shard: &mut Shard,
        db: Db,
        key: &[u8],
        addr: u64,
        len_bytes: u32,
        contents: bool,
    ) -> Result<Option<OwnedRecord>, StorageError> {
        let len = len_bytes as usize;
        if !self.missed {
            return match read_page(shard, db, key, addr) {
                Err(StorageError::Deferred) => {
                    self.missed = true;
                    super::prefetch::readahead_charge(len);
                    Ok(None)
                }
                r => r.map(Some),
            };
        }
        if self.full || !super::prefetch::readahead_allows(len) {
            self.full = true;
            return Ok(None);
        }
        match shard.note_ahead(Address(addr)) {
            super::prefetch::Ahead::InMemory if contents => {
                read_page(shard, db, key, addr).map(Some)
            }
            super::prefetch::Ahead::InMemory | super::prefetch::Ahead::NotNew => Ok(None),
            super::prefetch::Ahead::Noted => {
                super::prefetch::readahead_charge(len);
                Ok(None)
            }
        }
    }

    /// The walk missed: it now only notes pages.
    pub(crate) fn missed(&self) -> bool {
        self.missed
    }

    /// The round's budget is spent: the walk may stop.
    pub(crate) fn full(&self) -> bool {
        self.full
    }

    /// The walk's result, or `Deferred` when it missed a page.
    pub(crate) fn finish<T>(&self, v: T) -> Result<T, StorageError> {
        if self.missed {
            Err(StorageError::Deferred)
        } else {
            Ok(v)
        }
    }
}

/// A paged root's payload (`root`) or a page's, with every page address passed through
/// `map`; `None` when it names no page or `map` changes none. Addresses are fixed-width, so
/// the length stays the same. Used when a block seal moved a command scope's staged records
/// (`Shard::move_scope_tail`).
pub(crate) fn rebase_addresses(
    root: bool,
    payload: &[u8],
    map: impl Fn(u64) -> u64,
) -> Option<Vec<u8>> {
    let remap = |entries: &mut [Entry]| {
        let mut changed = false;
        for e in entries {
            let a = map(e.addr);
            changed |= a != e.addr;
            e.addr = a;
        }
        changed
    };
    if root && root_version(payload) == Some(ROOT_VERSION_BASED) {
        let mut r = BasedRoot::decode(payload).ok()?;
        let a = map(r.base_addr);
        let changed = remap(&mut r.upserts) | (a != r.base_addr);
        r.base_addr = a;
        changed.then(|| r.encode())
    } else if root {
        let mut r = Root::decode(payload).ok()?;
        remap(&mut r.dirs).then(|| r.encode())
    } else if payload.first() == Some(&PAGE_BASE) {
        let mut entries = decode_base(payload).ok()?;
        if !remap(&mut entries) {
            return None;
        }
        Some(encode_base(&entries))
    } else if matches!(
        payload.first(),
        Some(&PAGE_DIR) | Some(&super::paged_zset::PAGE_ZSET_DIR)
    ) {
        // Patched in place: a sorted set's score directory page carries keys after its
        // entries, which re-encoding would drop.
        let mut entries = decode_dir(payload).ok()?;
        if !remap(&mut entries) {
            return None;
        }
        let mut out = payload.to_vec();
        for (i, e) in entries.iter().enumerate() {
            let at = DIR_ENTRIES_AT + i * ENTRY_BYTES + 8;
            out[at..at + 8].copy_from_slice(&e.addr.to_le_bytes());
        }
        Some(out)
    } else {
        None
    }
}

/// Whether a Put record is a paged root.
pub fn is_root(flags: u8) -> bool {
    flags & FLAG_PAGED != 0
}

/// Reads every page under `root` (of `db`/`key`): the members in position order and the
/// tree an update needs. In a restartable run a miss does not end the walk: every page not
/// in memory is noted for one round of reads (`Ahead`), then it fails with `Deferred`.
pub fn load<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    has_values: bool,
) -> Result<(Vec<E>, Tree), StorageError> {
    let mut ra = Ahead::start();
    let mut elems = Vec::with_capacity(if ra.missed() { 0 } else { root.count as usize });
    let mut leaves = Vec::with_capacity(root.dirs.len());
    for di in 0..root.dirs.len() {
        if ra.full() {
            break;
        }
        let Some(entries) = dir_ahead(&mut ra, shard, db, key, root, di)? else {
            continue;
        };
        for li in 0..entries.len() {
            if ra.full() {
                break;
            }
            leaf_ahead(
                &mut ra, shard, db, key, root, di, &entries, li, has_values, &mut elems,
            )?;
        }
        leaves.push(entries);
    }
    ra.finish(())?;
    Ok((
        elems,
        Tree {
            dirs: root.dirs.clone(),
            leaves,
            touched: Vec::new(),
            partial: None,
        },
    ))
}

/// Reads only what a write of the members `names` needs: for each name the directory page
/// and the leaf that can hold it, with those of that leaf's neighbours in the same directory
/// page that a merge may take in (the small ones). Returns those leaves' members in position order and a partial
/// tree: `update` then rewrites only leaves it read, and counts the rest from the root.
pub fn load_partial<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    names: &[&[u8]],
    has_values: bool,
) -> Result<(Vec<E>, Tree), StorageError> {
    let nd = root.dirs.len();
    let mut ra = Ahead::start();
    let mut leaves: Vec<Vec<Entry>> = vec![Vec::new(); nd];
    let mut dir_read = vec![false; nd];
    let mut dir_tried = vec![false; nd];
    let mut leaf_read: Vec<Vec<bool>> = vec![Vec::new(); nd];
    for name in names {
        let p = position(name);
        let di = root
            .dirs
            .partition_point(|e| e.first <= p)
            .saturating_sub(1);
        if !dir_tried[di] {
            dir_tried[di] = true;
            if let Some(entries) = dir_ahead(&mut ra, shard, db, key, root, di)? {
                leaf_read[di] = vec![false; entries.len()];
                leaves[di] = entries;
                dir_read[di] = true;
            }
        }
        if !dir_read[di] {
            continue; // missed: noted, the next run places the name
        }
        let entries = &leaves[di];
        let li = entries.partition_point(|e| e.first <= p).saturating_sub(1);
        leaf_read[di][li] = true;
        // A neighbour is read only when `update` could merge it with the rewritten leaf:
        // both merge rules need the neighbour's members under `LEAF_MERGE_BYTES` on its
        // own, which its entry tells without reading it. So the leaves `update` writes are
        // the same as when every neighbour was read.
        let neighbours = [
            li.checked_sub(1),
            Some(li + 1).filter(|&n| n < entries.len()),
        ];
        for n in neighbours.into_iter().flatten() {
            if leaf_members_bytes(&entries[n]) < LEAF_MERGE_BYTES {
                leaf_read[di][n] = true;
            }
        }
    }
    let mut elems: Vec<E> = Vec::new();
    for di in 0..nd {
        for (li, &read) in leaf_read[di].iter().enumerate() {
            if read && !ra.full() {
                leaf_ahead(
                    &mut ra,
                    shard,
                    db,
                    key,
                    root,
                    di,
                    &leaves[di],
                    li,
                    has_values,
                    &mut elems,
                )?;
            }
        }
    }
    ra.finish(())?;
    let read_bytes = elems.iter().map(elem_bytes).sum::<usize>() as u64;
    let (Some(rest_count), Some(rest_bytes)) = (
        root.count.checked_sub(elems.len() as u64),
        root.bytes.checked_sub(read_bytes),
    ) else {
        return Err(corrupt("root totals below the members of its leaves"));
    };
    Ok((
        elems,
        Tree {
            dirs: root.dirs.clone(),
            leaves,
            touched: Vec::new(),
            partial: Some(Partial {
                dir_read,
                leaf_read,
                rest_count,
                rest_bytes,
            }),
        },
    ))
}

/// The members of the leaves a partial load did not read (everything else of the
/// collection), in position order: what a demotion to one record needs besides them.
pub fn load_rest<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    tree: &Tree,
    has_values: bool,
) -> Result<Vec<E>, StorageError> {
    let Some(part) = &tree.partial else {
        return Ok(Vec::new());
    };
    // Checked against the tree's own root entries (those the partial load read).
    let root = Root {
        encoding: 0,
        count: 0,
        bytes: 0,
        dirs: tree.dirs.clone(),
    };
    let mut ra = Ahead::start();
    let mut elems: Vec<E> = Vec::new();
    for di in 0..tree.dirs.len() {
        if ra.full() {
            break;
        }
        let entries = if part.dir_read[di] {
            tree.leaves[di].clone()
        } else {
            match dir_ahead(&mut ra, shard, db, key, &root, di)? {
                Some(e) => e,
                None => continue,
            }
        };
        for li in 0..entries.len() {
            if (part.dir_read[di] && part.leaf_read[di][li]) || ra.full() {
                continue;
            }
            leaf_ahead(
                &mut ra, shard, db, key, &root, di, &entries, li, has_values, &mut elems,
            )?;
        }
    }
    ra.finish(elems)
}

// ---- reading only what a command needs ---------------------------------------------------

/// Checks directory page `di`'s entries against its root entry.
fn check_dir(root: &Root, di: usize, entries: &[Entry]) -> Result<(), StorageError> {
    let d = root.dirs[di];
    let dir_end = root.dirs.get(di + 1).map_or(u64::MAX, |n| n.first);
    if (di > 0 && entries[0].first != d.first)
        || entries.last().is_some_and(|e| e.first >= dir_end)
        || entries.iter().map(|e| u64::from(e.count)).sum::<u64>() != u64::from(d.count)
    {
        return Err(corrupt("directory page disagrees with the root"));
    }
    Ok(())
}

/// Directory page `di` of `root`, checked against its root entry.
fn read_dir_at(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    di: usize,
) -> Result<Vec<Entry>, StorageError> {
    let entries = decode_dir(&read_page(shard, db, key, root.dirs[di].addr)?.value)?;
    check_dir(root, di, &entries)?;
    Ok(entries)
}

/// `read_dir_at` through read-ahead: `None` when the walk missed it or is out of budget.
fn dir_ahead(
    ra: &mut Ahead,
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    di: usize,
) -> Result<Option<Vec<Entry>>, StorageError> {
    let d = root.dirs[di];
    let Some(rec) = ra.page(shard, db, key, d.addr, d.len, true)? else {
        return Ok(None);
    };
    let entries = decode_dir(&rec.value)?;
    check_dir(root, di, &entries)?;
    Ok(Some(entries))
}

/// The positions `[start, end)` leaf `li` of directory page `di` covers (`end` is
/// `u64::MAX` for the collection's last leaf).
fn leaf_range(root: &Root, di: usize, entries: &[Entry], li: usize) -> (u64, u64) {
    let dir_end = root.dirs.get(di + 1).map_or(u64::MAX, |n| n.first);
    let start = if di == 0 && li == 0 {
        0
    } else {
        entries[li].first
    };
    (start, entries.get(li + 1).map_or(dir_end, |n| n.first))
}

/// Appends the members of leaf `li` of directory page `di` (whose entries are `entries`)
/// from its record `rec`.
fn decode_leaf_at<E: Elem>(
    rec: &OwnedRecord,
    root: &Root,
    di: usize,
    entries: &[Entry],
    li: usize,
    has_values: bool,
    out: &mut Vec<E>,
) -> Result<(), StorageError> {
    let n = decode_leaf(
        &rec.value,
        has_values,
        leaf_range(root, di, entries, li),
        out,
    )?;
    if n != entries[li].count as usize {
        return Err(corrupt("leaf count disagrees with its directory"));
    }
    Ok(())
}

/// Appends the members of leaf `li` of directory page `di` (whose entries are `entries`).
#[allow(clippy::too_many_arguments)]
fn read_leaf_at<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    di: usize,
    entries: &[Entry],
    li: usize,
    has_values: bool,
    out: &mut Vec<E>,
) -> Result<(), StorageError> {
    let rec = read_page(shard, db, key, entries[li].addr)?;
    decode_leaf_at(&rec, root, di, entries, li, has_values, out)
}

/// `read_leaf_at` through read-ahead: `false` (nothing appended) when the walk missed it
/// or only notes pages now.
#[allow(clippy::too_many_arguments)]
fn leaf_ahead<E: Elem>(
    ra: &mut Ahead,
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    di: usize,
    entries: &[Entry],
    li: usize,
    has_values: bool,
    out: &mut Vec<E>,
) -> Result<bool, StorageError> {
    let l = entries[li];
    let Some(rec) = ra.page(shard, db, key, l.addr, l.len, false)? else {
        return Ok(false);
    };
    decode_leaf_at(&rec, root, di, entries, li, has_values, out)?;
    Ok(true)
}

/// One HSCAN/SSCAN step on a paged collection: the members whose position is at least
/// `cursor`, in position order, at least `count` of them unless the collection ends (ties
/// at the last position all included), and the next cursor (0 at the end). Reads the
/// directory page holding `cursor` and the leaves from the one holding it on, until
/// `count` members are gathered (a following directory page only when a page's last leaf
/// ends the step short).
///
/// A step returns exactly the members with positions in `[cursor, next)`, and the steps of
/// a walk cover `[0, 2^63)` without overlap whatever splits and merges move the leaf
/// boundaries, so a member present for the whole walk is returned exactly once.
pub fn scan<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    cursor: u64,
    count: usize,
    has_values: bool,
) -> Result<(Vec<E>, u64), StorageError> {
    let mut di = root
        .dirs
        .partition_point(|e| e.first <= cursor)
        .saturating_sub(1);
    let mut entries = read_dir_at(shard, db, key, root, di)?;
    let mut li = entries
        .partition_point(|e| e.first <= cursor)
        .saturating_sub(1);
    let mut out: Vec<E> = Vec::new();
    let mut last: Option<u64> = None;
    loop {
        let (_, end) = leaf_range(root, di, &entries, li);
        let mut leaf: Vec<E> = Vec::new();
        read_leaf_at(
            shard, db, key, root, di, &entries, li, has_values, &mut leaf,
        )?;
        for e in leaf {
            let p = position(e.name());
            if p < cursor {
                continue;
            }
            if out.len() >= count && last != Some(p) {
                return Ok((out, p));
            }
            last = Some(p);
            out.push(e);
        }
        if end == u64::MAX {
            return Ok((out, 0));
        }
        if out.len() >= count {
            return Ok((out, end));
        }
        li += 1;
        if li == entries.len() {
            di += 1;
            entries = read_dir_at(shard, db, key, root, di)?;
            li = 0;
        }
    }
}

/// The members of ranks `ranks` (0-based, in position order; repeats allowed, each below
/// `root.count`), in the order asked. Finds each rank's directory page and leaf by the
/// counts in the root and directory entries and reads only those pages, each once.
pub fn pick<E: Elem + Clone>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    ranks: &[u64],
    has_values: bool,
) -> Result<Vec<E>, StorageError> {
    use std::collections::HashMap;
    // Rank of the first member below each root entry.
    let mut dir_starts = Vec::with_capacity(root.dirs.len());
    let mut acc = 0u64;
    for d in &root.dirs {
        dir_starts.push(acc);
        acc += u64::from(d.count);
    }
    // Read-ahead (`Ahead`): a missed page is noted and the ranks below it skipped, so the
    // pages of every rank are asked for in one round per level.
    let mut ra = Ahead::start();
    // Per directory page read: its entries and the rank of the first member below each.
    type DirRanks = Option<(Vec<Entry>, Vec<u64>)>;
    let mut dirs: HashMap<usize, DirRanks> = HashMap::new();
    let mut leaves: HashMap<(usize, usize), Option<Vec<E>>> = HashMap::new();
    let mut out = Vec::with_capacity(ranks.len());
    for &rank in ranks {
        if rank >= acc {
            return Err(corrupt("rank past the collection's count"));
        }
        if ra.full() {
            break;
        }
        let di = dir_starts.partition_point(|&s| s <= rank) - 1;
        if let std::collections::hash_map::Entry::Vacant(slot) = dirs.entry(di) {
            let read = dir_ahead(&mut ra, shard, db, key, root, di)?.map(|entries| {
                let mut starts = Vec::with_capacity(entries.len());
                let mut a = dir_starts[di];
                for e in &entries {
                    starts.push(a);
                    a += u64::from(e.count);
                }
                (entries, starts)
            });
            slot.insert(read);
        }
        let Some((entries, starts)) = &dirs[&di] else {
            continue;
        };
        let li = starts.partition_point(|&s| s <= rank) - 1;
        if let std::collections::hash_map::Entry::Vacant(slot) = leaves.entry((di, li)) {
            let mut v = Vec::new();
            let read = leaf_ahead(
                &mut ra, shard, db, key, root, di, entries, li, has_values, &mut v,
            )?;
            slot.insert(read.then_some(v));
        }
        if let Some(leaf) = &leaves[&(di, li)] {
            out.push(leaf[(rank - starts[li]) as usize].clone());
        }
    }
    ra.finish(out)
}

/// A walk over a paged collection's leaves in position order, one leaf per step (the
/// directory pages read as the walk reaches them).
#[derive(Default)]
pub struct LeafWalk {
    di: usize,
    li: usize,
    entries: Option<Vec<Entry>>,
    /// The caller will walk to the end: a miss notes every later leaf too (`to_end`).
    to_end: bool,
}

impl LeafWalk {
    /// A walk its caller takes to the last leaf (no early stop): a step that misses a page
    /// notes, within the round's budget, every page the rest of the walk will read, so the
    /// whole walk costs about one restart per `prefetch::READAHEAD_READS_MAX` pages.
    pub fn to_end() -> LeafWalk {
        LeafWalk {
            to_end: true,
            ..LeafWalk::default()
        }
    }

    /// The next leaf's members, `None` after the last.
    pub fn next<E: Elem>(
        &mut self,
        shard: &mut Shard,
        db: Db,
        key: &[u8],
        root: &Root,
        has_values: bool,
    ) -> Result<Option<Vec<E>>, StorageError> {
        if self.di >= root.dirs.len() {
            return Ok(None);
        }
        match self.step(shard, db, key, root, has_values) {
            Err(StorageError::Deferred) if self.to_end => {
                self.note_rest(shard, db, key, root);
                Err(StorageError::Deferred)
            }
            r => r.map(Some),
        }
    }

    fn step<E: Elem>(
        &mut self,
        shard: &mut Shard,
        db: Db,
        key: &[u8],
        root: &Root,
        has_values: bool,
    ) -> Result<Vec<E>, StorageError> {
        if self.entries.is_none() {
            self.entries = Some(read_dir_at(shard, db, key, root, self.di)?);
        }
        let entries = self.entries.as_ref().expect("read above");
        let mut out = Vec::new();
        read_leaf_at(
            shard, db, key, root, self.di, entries, self.li, has_values, &mut out,
        )?;
        self.li += 1;
        if self.li == entries.len() {
            self.li = 0;
            self.di += 1;
            self.entries = None;
        }
        Ok(out)
    }

    /// After a missed step: notes the pages of every leaf after the missed one (the walk
    /// stays where it was; its next run repeats the step).
    fn note_rest(&self, shard: &mut Shard, db: Db, key: &[u8], root: &Root) {
        let mut ra = Ahead::start();
        debug_assert!(ra.missed(), "called after a miss");
        for di in self.di..root.dirs.len() {
            if ra.full() {
                return;
            }
            let held = if di == self.di {
                self.entries.clone()
            } else {
                None
            };
            // A corrupt page is reported by the run that reads it.
            let entries = match held {
                Some(e) => e,
                None => match dir_ahead(&mut ra, shard, db, key, root, di) {
                    Ok(Some(e)) => e,
                    _ => continue,
                },
            };
            let from = if di == self.di { self.li + 1 } else { 0 };
            for li in from..entries.len() {
                if ra.full() {
                    return;
                }
                let mut none: Vec<Vec<u8>> = Vec::new();
                let _ = leaf_ahead(
                    &mut ra, shard, db, key, root, di, &entries, li, false, &mut none,
                );
            }
        }
    }
}

/// Which of `names` the paged set (or hash) `root` holds (`lookup_many`).
pub fn contains_many(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    names: &[&[u8]],
    has_values: bool,
    dirs: &mut std::collections::HashMap<usize, Vec<Entry>>,
) -> Result<Vec<bool>, StorageError> {
    let found = lookup_many(shard, db, key, root, names, has_values, dirs)?;
    Ok(found.iter().map(Option::is_some).collect())
}

/// Per name of `names`, its value when the paged hash (or set: an empty value) `root` holds
/// it. The names are grouped by the leaf that can hold them and each such leaf is read once;
/// `dirs` caches directory pages between calls of one command. HMGET of n fields reads at
/// most n directory pages and n leaves. With read-ahead (`Ahead`), a miss does not end the
/// probe: the directory pages of every name are noted in one round, then their leaves in
/// the next.
pub fn lookup_many(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
    names: &[&[u8]],
    has_values: bool,
    dirs: &mut std::collections::HashMap<usize, Vec<Entry>>,
) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
    let mut ra = Ahead::start();
    let mut missed_dirs: Vec<usize> = Vec::new();
    let mut at: Vec<(usize, usize, usize)> = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if ra.full() {
            break;
        }
        let p = position(name);
        let di = root
            .dirs
            .partition_point(|e| e.first <= p)
            .saturating_sub(1);
        if let std::collections::hash_map::Entry::Vacant(slot) = dirs.entry(di) {
            if missed_dirs.contains(&di) {
                continue;
            }
            match dir_ahead(&mut ra, shard, db, key, root, di)? {
                Some(entries) => {
                    slot.insert(entries);
                }
                None => {
                    missed_dirs.push(di);
                    continue;
                }
            }
        }
        let li = dirs[&di]
            .partition_point(|e| e.first <= p)
            .saturating_sub(1);
        at.push((di, li, i));
    }
    at.sort_unstable();
    let mut out = vec![None; names.len()];
    let mut k = 0;
    while k < at.len() && !ra.full() {
        let (di, li, _) = at[k];
        let end = k + at[k..].partition_point(|x| (x.0, x.1) == (di, li));
        let l = dirs[&di][li];
        if let Some(rec) = ra.page(shard, db, key, l.addr, l.len, false)? {
            for &(_, _, i) in &at[k..end] {
                let (count, found) = find_in_leaf(&rec.value, has_values, names[i])?;
                if count != l.count as usize {
                    return Err(corrupt("leaf count disagrees with its directory"));
                }
                out[i] = found.map(|v| v.unwrap_or_default().to_vec());
            }
        }
        k = end;
    }
    ra.finish(out)
}

/// A member found in a leaf: its value, `None` for a set member.
type LeafHit<'a> = Option<&'a [u8]>;

/// The member count of an encoded leaf and its member `name`: `Some(value)` (`Some(None)`
/// for a set member) when present. A point lookup walks the encoded members without building them, hashing them or
/// allocating: the whole-leaf decode (`decode_leaf`, which also checks every member's
/// position and order) is what the write paths use.
fn find_in_leaf<'a>(
    b: &'a [u8],
    has_values: bool,
    name: &[u8],
) -> Result<(usize, Option<LeafHit<'a>>), StorageError> {
    let mut r = Reader { b, at: 0 };
    if r.u8()? != PAGE_LEAF {
        return Err(corrupt("not a leaf page"));
    }
    let n = r.varint()?;
    if n == 0 || n > b.len() {
        return Err(corrupt("bad leaf count"));
    }
    let mut found = None;
    for _ in 0..n {
        let m = r.string()?;
        let value = if has_values { Some(r.string()?) } else { None };
        if found.is_none() && m == name {
            found = Some(value);
        }
    }
    r.done()?;
    Ok((n, found))
}

/// Addresses and payload lengths of every page under `root` (directory pages read).
pub fn pages_of(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
) -> Result<Vec<(u64, u32)>, StorageError> {
    let mut out = Vec::new();
    for d in &root.dirs {
        out.push((d.addr, d.len));
        let rec = read_page(shard, db, key, d.addr)?;
        for l in decode_dir(&rec.value)? {
            out.push((l.addr, l.len));
        }
    }
    Ok(out)
}

/// `pages_of` of a root record as stored, its base page (version 2) included.
pub(crate) fn pages_of_stored(
    shard: &mut Shard,
    rec: &OwnedRecord,
) -> Result<Vec<(u64, u32)>, StorageError> {
    let db = rec.header.db;
    let root = decode_stored(shard, db, &rec.key, &rec.value)?;
    let mut out = pages_of(shard, db, &rec.key, &root)?;
    out.extend(base_of(&rec.value));
    Ok(out)
}

/// A paged root that stopped being current (deleted, expired or overwritten) whose pages
/// still count as live: the background job reads its directory pages one by one and stops
/// counting them and their leaves (`docs/collections.md` section 7a).
struct Released {
    db: Db,
    key: Vec<u8>,
    /// The root's directory pages (address, payload length); those before `next` are done.
    dirs: Vec<(u64, u32)>,
    next: usize,
    /// The newest block sequence number when the root was released: a page of it can only
    /// be in a block of this sequence number or older (a block reused since has a newer
    /// one, and is never unaccounted for this root).
    block_seq_max: u64,
    /// A version-2 root whose base page (at the address given) is not read yet: the first
    /// step reads it, fills `dirs` and stops counting the base.
    based: Option<(u64, BasedRoot)>,
}

/// Background work units charged per directory page a release reads (a device read).
const RELEASE_DIR_WORK: u64 = 5;

/// The shard's queue of released paged roots (the background page release).
#[derive(Default)]
pub(crate) struct PendingReleases {
    queue: std::collections::VecDeque<Released>,
    /// Directory pages of queued roots not yet read.
    dirs: u64,
}

impl PendingReleases {
    /// A block seal moved a command scope's staged records (`Shard::move_scope_tail`) into
    /// the block of sequence number `block_seq`: queued directory pages among them are now at
    /// `map(address)`. (No block is freed inside a command, so the others are unchanged.)
    pub(crate) fn rebase(&mut self, map: impl Fn(u64) -> u64, block_seq: u64) {
        for r in &mut self.queue {
            let mut changed = false;
            if let Some((a, _)) = &mut r.based {
                let m = map(*a);
                changed |= m != *a;
                *a = m;
            }
            for d in r.dirs.iter_mut().skip(r.next) {
                let a = map(d.0);
                changed |= a != d.0;
                d.0 = a;
            }
            if changed {
                r.block_seq_max = r.block_seq_max.max(block_seq);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Released roots whose pages still count as live.
    pub(crate) fn roots(&self) -> u64 {
        self.queue.len() as u64
    }

    /// Their directory pages not yet read.
    pub(crate) fn dirs(&self) -> u64 {
        self.dirs
    }

    /// FLUSHDB zeroed the live bytes of `db` (pages included): its releases are moot.
    pub(crate) fn drop_db(&mut self, db: Db) {
        self.queue.retain(|r| r.db != db);
        self.dirs = self
            .queue
            .iter()
            .map(|r| (r.dirs.len() - r.next) as u64 + u64::from(r.based.is_some()))
            .sum();
    }
}

/// Stops counting the pages of a root that is no longer current (deleted, expired or
/// overwritten by a value that does not share them), **without reading any page**: the
/// root's tombstone (or the new value) is already the commit, and the root joins the
/// shard's queue of pending releases, which `release_step` works off in the background.
pub(crate) fn release(shard: &mut Shard, db: Db, root_rec: &OwnedRecord) {
    if root_version(&root_rec.value) == Some(ROOT_VERSION_BASED) {
        // A version-2 root: its directory list needs the base page, which the background
        // job reads first (`release_step`).
        let Ok(based) = BasedRoot::decode(&root_rec.value) else {
            return;
        };
        let base_addr = shard.current_address(Address(based.base_addr)).0;
        let cached = block_seq_of(shard, base_addr).and_then(|s| shard.bases.get(base_addr, s));
        if let Some(root) = cached.and_then(|base| based.apply(&base).ok()) {
            // The base is in the cache: no read needed, the base stops counting now and the
            // directory pages are queued as a version-1 root's.
            shard.unaccount_page(db, Address(base_addr), root_rec.key.len(), based.base_len);
            queue_release(shard, db, &root_rec.key, &root);
            return;
        }
        let block_seq_max = shard
            .blocks
            .values()
            .map(|b| b.block_seq)
            .max()
            .unwrap_or(0);
        shard.releases.dirs += 1;
        shard.releases.queue.push_back(Released {
            db,
            key: root_rec.key.clone(),
            dirs: Vec::new(),
            next: 0,
            block_seq_max,
            based: Some((base_addr, based)),
        });
        return;
    }
    let Ok(root) = Root::decode(&root_rec.value) else {
        return;
    };
    queue_release(shard, db, &root_rec.key, &root);
}

/// Queues the directory pages of `root` (of db/key) for the background release.
fn queue_release(shard: &mut Shard, db: Db, key: &[u8], root: &Root) {
    let block_seq_max = shard
        .blocks
        .values()
        .map(|b| b.block_seq)
        .max()
        .unwrap_or(0);
    shard.releases.dirs += root.dirs.len() as u64;
    shard.releases.queue.push_back(Released {
        db,
        key: key.to_vec(),
        // A root loaded before a seal moved this scope's records names old addresses.
        dirs: root
            .dirs
            .iter()
            .map(|d| (shard.current_address(Address(d.addr)).0, d.len))
            .collect(),
        next: 0,
        block_seq_max,
        based: None,
    });
}

/// Whether the page at `addr` may still be one of a root released when the newest block
/// sequence number was `block_seq_max` (its block was not freed and reused since).
fn page_block_unchanged(shard: &Shard, addr: u64, block_seq_max: u64) -> bool {
    let (block, _) = shard.shared.layout.split(Address(addr));
    shard
        .blocks
        .get(&block)
        .is_some_and(|b| b.block_seq <= block_seq_max)
}

/// Background page release: reads queued directory pages, about one per unit of `work`
/// (at least one per call while any is queued), and stops counting each with its leaves.
/// A directory page that cannot be read leaves its leaves counted (their blocks look more
/// live than they are until a restart recomputes live bytes: defrag is delayed, never
/// wrong).
pub(crate) fn release_step(shard: &mut Shard, work: &mut u64) {
    let mut first = true;
    while first || *work > 0 {
        first = false;
        let Some(r) = shard.releases.queue.front_mut() else {
            return;
        };
        if let Some((base_addr, based)) = r.based.take() {
            let (db, seq_max, key) = (r.db, r.block_seq_max, r.key.clone());
            shard.releases.dirs -= 1;
            *work = work.saturating_sub(RELEASE_DIR_WORK);
            if !page_block_unchanged(shard, base_addr, seq_max) {
                shard.releases.queue.pop_front();
                continue;
            }
            let dirs = base_entries(shard, db, &key, base_addr, based.base_len)
                .and_then(|base| based.apply(&base));
            shard.unaccount_page(db, Address(base_addr), key.len(), based.base_len);
            let r = shard.releases.queue.front_mut().expect("front");
            match dirs {
                Ok(root) if !root.dirs.is_empty() => {
                    r.dirs = root.dirs.iter().map(|d| (d.addr, d.len)).collect();
                    shard.releases.dirs += r.dirs.len() as u64;
                }
                other => {
                    if let Err(e) = other {
                        tracing::warn!(
                            shard = shard.id(),
                            "released paged root's base page unreadable: {e}"
                        );
                    }
                    shard.releases.queue.pop_front();
                }
            }
            continue;
        }
        let (addr, len) = r.dirs[r.next];
        r.next += 1;
        let (db, seq_max) = (r.db, r.block_seq_max);
        let key = if r.next == r.dirs.len() {
            shard.releases.queue.pop_front().expect("front").key
        } else {
            r.key.clone()
        };
        shard.releases.dirs -= 1;
        *work = work.saturating_sub(RELEASE_DIR_WORK);
        if !page_block_unchanged(shard, addr, seq_max) {
            continue;
        }
        match read_page(shard, db, &key, addr).and_then(|rec| decode_dir(&rec.value)) {
            Ok(entries) => {
                for l in entries {
                    if page_block_unchanged(shard, l.addr, seq_max) {
                        shard.unaccount_page(db, Address(l.addr), key.len(), l.len);
                    }
                }
            }
            Err(e) => tracing::warn!(
                shard = shard.id(),
                "released paged root's directory page unreadable: {e}"
            ),
        }
        shard.unaccount_page(db, Address(addr), key.len(), len);
    }
}

/// Works off every pending release (shutdown, before the checkpoint records live bytes;
/// tests).
pub(crate) fn release_all(shard: &mut Shard) {
    while !shard.releases.is_empty() {
        let mut work = u64::MAX;
        release_step(shard, &mut work);
    }
}

/// The one-record bytes of a paged collection (for GET-like generic readers: RENAME, COPY,
/// MOVE, DUMP read whole values).
pub(crate) fn materialize(shard: &mut Shard, rec: &OwnedRecord) -> Result<Vec<u8>, StorageError> {
    let root = decode_stored(shard, rec.header.db, &rec.key, &rec.value)?;
    let db = rec.header.db;
    if ValueKind::from_u8(rec.header.value_kind) == Some(ValueKind::List) {
        // Lists have their own leaves (quicklist nodes, `paged_list.rs`).
        return super::paged_list::materialize(shard, db, &rec.key, &root);
    }
    if ValueKind::from_u8(rec.header.value_kind) == Some(ValueKind::ZSet) {
        // Sorted sets have two trees (`paged_zset.rs`).
        return super::paged_zset::materialize(shard, db, &rec.key, &root);
    }
    let mut out = vec![root.encoding];
    put_varint(&mut out, root.count);
    match ValueKind::from_u8(rec.header.value_kind) {
        Some(ValueKind::Hash) => {
            let (elems, _) = load::<(Vec<u8>, Vec<u8>)>(shard, db, &rec.key, &root, true)?;
            for (f, v) in &elems {
                put_varint(&mut out, f.len() as u64);
                out.extend_from_slice(f);
                put_varint(&mut out, v.len() as u64);
                out.extend_from_slice(v);
            }
        }
        Some(ValueKind::Set) => {
            let (elems, _) = load::<Vec<u8>>(shard, db, &rec.key, &root, false)?;
            for m in &elems {
                put_varint(&mut out, m.len() as u64);
                out.extend_from_slice(m);
            }
        }
        _ => return Err(corrupt("paged root of a kind that is not paged")),
    }
    Ok(out)
}

// ---- writing ---------------------------------------------------------------------------------

/// Cuts members sorted by (position, bytes) into runs of about `fill` bytes each (at least
/// one member each, never splitting equal positions), returning run boundaries.
fn cut<E: Elem>(sorted: &[(u64, &E)], fill: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = sorted.iter().map(|(_, e)| elem_bytes(*e)).sum();
    let pieces = total.div_ceil(fill).max(1);
    let target = total.div_ceil(pieces);
    let mut out = Vec::new();
    let mut start = 0;
    let mut acc = 0;
    for i in 0..sorted.len() {
        acc += elem_bytes(sorted[i].1);
        let boundary = i + 1 < sorted.len() && sorted[i + 1].0 != sorted[i].0;
        if acc >= target && boundary {
            out.push(start..i + 1);
            start = i + 1;
            acc = 0;
        }
    }
    if start < sorted.len() {
        out.push(start..sorted.len());
    }
    out
}

struct Writer<'s> {
    shard: &'s mut Shard,
    db: Db,
    key: &'s [u8],
    kind: ValueKind,
    seq: u64,
}

impl Writer<'_> {
    fn page(&mut self, payload: &[u8]) -> Result<u64, StorageError> {
        let addr = self
            .shard
            .append_page(self.db, self.key, self.kind, payload, self.seq)?;
        Ok(addr.0)
    }

    fn leaf<E: Elem>(&mut self, first: u64, run: &[(u64, &E)]) -> Result<Entry, StorageError> {
        let refs: Vec<&E> = run.iter().map(|(_, e)| *e).collect();
        let payload = encode_leaf(&refs);
        Ok(Entry {
            first,
            addr: self.page(&payload)?,
            len: payload.len() as u32,
            count: run.len() as u32,
        })
    }

    fn dir(&mut self, entries: &[Entry]) -> Result<Entry, StorageError> {
        let payload = encode_dir(entries);
        Ok(Entry {
            first: entries[0].first,
            addr: self.page(&payload)?,
            len: payload.len() as u32,
            count: entries.iter().map(|e| e.count).sum(),
        })
    }
}

fn sorted_refs<'e, E: Elem + 'e>(elems: impl Iterator<Item = &'e E>) -> Vec<(u64, &'e E)> {
    let mut v: Vec<(u64, &E)> = elems.map(|e| (position(e.name()), e)).collect();
    v.sort_unstable_by(|a, b| (a.0, a.1.name()).cmp(&(b.0, b.1.name())));
    v
}

/// Writes `elems` (a hashtable-encoded collection, non-empty) as a fresh paged collection
/// under `key`, replacing whatever the key held (its pages, if it was paged, are released).
#[allow(clippy::too_many_arguments)]
pub fn build<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    kind: ValueKind,
    encoding: u8,
    elems: &[E],
    expire: Option<u64>,
    now_ms: u64,
) -> Result<(), StorageError> {
    let sorted = sorted_refs(elems.iter());
    let seq = shard.reserve_seq();
    let mut w = Writer {
        shard,
        db,
        key,
        kind,
        seq,
    };
    let mut leaves = Vec::new();
    for r in cut(&sorted, LEAF_FILL_BYTES) {
        let first = if r.start == 0 { 0 } else { sorted[r.start].0 };
        leaves.push(w.leaf(first, &sorted[r])?);
    }
    let mut dirs = Vec::new();
    for chunk in leaves.chunks(DIR_MAX_ENTRIES * 3 / 4) {
        dirs.push(w.dir(chunk)?);
    }
    let root = Root {
        encoding,
        count: elems.len() as u64,
        bytes: elems.iter().map(elem_bytes).sum::<usize>() as u64,
        dirs,
    };
    shard.put_paged_root(db, key, kind, &root.encode(), expire, now_ms, seq, false)
}

/// Stores `elems` (the whole current collection, non-empty) under `key`, whose current
/// root is the one `tree` was loaded from: rewrites the leaves holding a touched position
/// (splitting and merging them), the directory pages whose entries changed, and the root.
#[allow(clippy::too_many_arguments)]
pub fn update<E: Elem>(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    kind: ValueKind,
    encoding: u8,
    elems: &[E],
    tree: &Tree,
    expire: Option<u64>,
    now_ms: u64,
) -> Result<(), StorageError> {
    // Flatten the leaves: (dir index, entry).
    let flat: Vec<(usize, Entry)> = tree
        .leaves
        .iter()
        .enumerate()
        .flat_map(|(d, v)| v.iter().map(move |e| (d, *e)))
        .collect();
    if flat.is_empty() {
        return Err(corrupt("update of a tree without leaves"));
    }
    // After a partial load only some leaves' members are in `elems` (`read`), and `flat`
    // holds the leaves of the directory pages read: two neighbours in `flat` are neighbours
    // in the collection only when their pages are the same or consecutive (`adjacent`).
    let read: Vec<bool> = match &tree.partial {
        None => vec![true; flat.len()],
        Some(p) => p.leaf_read.iter().flatten().copied().collect(),
    };
    let adjacent = |i: usize| flat[i].0 + 1 >= flat[i + 1].0;
    // Whether flat[0] is the collection's first leaf (it covers from position 0).
    let has_first = !tree.leaves[0].is_empty();
    let mut first_of: Vec<u64> = flat.iter().map(|(_, e)| e.first).collect();
    if has_first {
        first_of[0] = 0;
    }
    let leaf_of = |p: u64| first_of.partition_point(|&f| f <= p).saturating_sub(1);
    let mut dirty = vec![false; flat.len()];
    for &p in &tree.touched {
        let i = leaf_of(p);
        if !read[i] || (i == 0 && !has_first && p < first_of[0]) {
            return Err(corrupt(
                "a write touched a leaf its partial load did not read",
            ));
        }
        dirty[i] = true;
    }
    // Leaves next to a dirty one are gathered too: a merge may take them in.
    let mut gather = dirty.clone();
    for i in 0..flat.len() {
        if dirty[i] {
            if i > 0 && read[i - 1] && adjacent(i - 1) {
                gather[i - 1] = true;
            }
            if i + 1 < flat.len() && read[i + 1] && adjacent(i) {
                gather[i + 1] = true;
            }
        }
    }
    let mut buckets: Vec<Vec<(u64, &E)>> = vec![Vec::new(); flat.len()];
    for e in elems {
        let p = position(e.name());
        let i = leaf_of(p);
        if gather[i] {
            buckets[i].push((p, e));
        }
    }
    for b in buckets.iter_mut() {
        b.sort_unstable_by(|a, c| (a.0, a.1.name()).cmp(&(c.0, c.1.name())));
    }
    let bucket_bytes =
        |b: &Vec<(u64, &E)>| -> usize { b.iter().map(|(_, e)| elem_bytes(*e)).sum::<usize>() };
    let seq = shard.reserve_seq();
    let mut w = Writer {
        shard,
        db,
        key,
        kind,
        seq,
    };
    let mut dead: Vec<(u64, u32)> = Vec::new();
    // New leaf list, each with the directory page it goes to.
    let mut new_leaves: Vec<(usize, Entry)> = Vec::with_capacity(flat.len() + 2);
    let mut changed_dirs = vec![false; tree.dirs.len()];
    // Index of the original leaf last pushed unchanged (a backward merge may take it in;
    // never a leaf just rewritten, whose members are no longer in its bucket).
    let mut last_kept: Option<usize> = None;
    let mut i = 0;
    while i < flat.len() {
        let (d, e) = flat[i];
        if !dirty[i] {
            new_leaves.push((d, e));
            last_kept = Some(i);
            i += 1;
            continue;
        }
        let kept_before = last_kept.take();
        // A dirty leaf, merged with following gathered leaves while the sum stays small.
        let mut run: Vec<(u64, &E)> = std::mem::take(&mut buckets[i]);
        let first = first_of[i];
        dead.push((e.addr, e.len));
        changed_dirs[d] = true;
        let mut j = i + 1;
        while j < flat.len()
            && gather[j]
            && adjacent(j - 1)
            && bucket_bytes(&run) + bucket_bytes(&buckets[j]) < LEAF_MERGE_BYTES
        {
            run.append(&mut buckets[j]);
            dead.push((flat[j].1.addr, flat[j].1.len));
            changed_dirs[flat[j].0] = true;
            j += 1;
        }
        // Or into the previous leaf, when it was kept as is and both are small.
        if j == i + 1 && !run.is_empty() {
            if let Some(&(pd, pe)) = new_leaves.last() {
                let prev = i - 1;
                if kept_before == Some(prev)
                    && gather[prev]
                    && adjacent(prev)
                    && (pe.len as usize) + bucket_bytes(&run) < LEAF_MERGE_BYTES
                {
                    let mut merged = std::mem::take(&mut buckets[prev]);
                    merged.append(&mut run);
                    run = merged;
                    new_leaves.pop();
                    dead.push((pe.addr, pe.len));
                    changed_dirs[pd] = true;
                    let first = pe.first;
                    for r in cut(&run, LEAF_FILL_BYTES.max(bucket_bytes(&run) + 1)) {
                        let f = if r.start == 0 { first } else { run[r.start].0 };
                        new_leaves.push((pd, w.leaf(f, &run[r])?));
                    }
                    i = j;
                    continue;
                }
            }
        }
        run.sort_unstable_by(|a, c| (a.0, a.1.name()).cmp(&(c.0, c.1.name())));
        if !run.is_empty() {
            let size = bucket_bytes(&run);
            let fill = if size > LEAF_MAX_BYTES {
                LEAF_MAX_BYTES / 2
            } else {
                size + 1
            };
            for r in cut(&run, fill) {
                let f = if r.start == 0 { first } else { run[r.start].0 };
                new_leaves.push((d, w.leaf(f, &run[r])?));
            }
        }
        i = j;
    }
    if new_leaves.is_empty() && tree.partial.is_none() {
        return Err(corrupt("update of an empty collection"));
    }
    if has_first {
        if let Some(l) = new_leaves.first_mut() {
            l.1.first = 0;
        }
    }
    // Directory pages: regroup by old directory; rewrite the changed ones.
    let mut groups: Vec<(usize, Vec<Entry>)> = Vec::new();
    for (d, e) in new_leaves {
        match groups.last_mut() {
            Some((gd, v)) if *gd == d => v.push(e),
            _ => groups.push((d, vec![e])),
        }
    }
    let mut dirs: Vec<Entry> = Vec::with_capacity(groups.len() + 1);
    // The directory pages written here, with their entries (`merge_small_dirs` needs them).
    let mut written: Vec<(u64, Vec<Entry>)> = Vec::new();
    let mut gi = 0;
    for (d, _) in tree.dirs.iter().enumerate() {
        let present = groups.get(gi).is_some_and(|(gd, _)| *gd == d);
        if tree.partial.as_ref().is_some_and(|p| !p.dir_read[d]) {
            // A directory page the partial load did not read: unchanged.
            dirs.push(tree.dirs[d]);
            continue;
        }
        if !present {
            // Every leaf of this directory page went away (merged into a neighbour's).
            dead.push((tree.dirs[d].addr, tree.dirs[d].len));
            continue;
        }
        let entries = std::mem::take(&mut groups[gi].1);
        gi += 1;
        if !changed_dirs[d] {
            dirs.push(tree.dirs[d]);
            continue;
        }
        dead.push((tree.dirs[d].addr, tree.dirs[d].len));
        let pieces = entries.len().div_ceil(DIR_MAX_ENTRIES);
        let per = entries.len().div_ceil(pieces);
        for chunk in entries.chunks(per) {
            let d = w.dir(chunk)?;
            written.push((d.addr, chunk.to_vec()));
            dirs.push(d);
        }
    }
    if dirs.is_empty() {
        return Err(corrupt("update of an empty collection"));
    }
    dirs = merge_small_dirs(&mut w, &tree.dirs, dirs, written, &mut dead)?;
    dirs[0].first = 0;
    let root = Root {
        encoding,
        count: (tree.rest_count() + elems.len()) as u64,
        bytes: (tree.rest_bytes() + elems.iter().map(elem_bytes).sum::<usize>()) as u64,
        dirs,
    };
    let key_len = key.len();
    for (addr, len) in dead {
        w.shard.unaccount_page(db, Address(addr), key_len, len);
    }
    w.shard
        .put_paged_root(db, key, kind, &root.encode(), expire, now_ms, seq, true)
}

/// A single-member write on a paged hash or set (`point_write`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PointOp {
    /// Adds the member or replaces its value (a hash field's value; `None` for a set
    /// member). A set member already present is left as it is.
    Upsert(Option<Vec<u8>>),
    Remove,
}

/// What `point_write` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointOutcome {
    /// Applied: `existed` tells whether the member was there before; `written` is false
    /// when there was nothing to change (SADD of a member present, a removal of one absent).
    Applied { existed: bool, written: bool },
    /// The write would split or merge a leaf, or demote the collection: the caller takes
    /// the general path (`load_partial` + `update`), which writes the same pages either way.
    General,
}

/// One member added, replaced or removed in the paged collection whose current root is
/// `root_payload`, without decoding the leaf: the member's place is found by walking the
/// leaf's bytes (hashing names only up to it), and the new leaf is the old one's bytes
/// with the member spliced in or out. Writes exactly what `update` writes for the same
/// change when it splits and merges nothing — that leaf, its directory page (and a
/// directory merge `merge_small_dirs` makes), the root — and leaves every other case to it
/// (`PointOutcome::General`), so the pages are the same whichever path ran. Reads the
/// directory page and the one leaf through read-ahead: `Deferred` before any write.
///
/// `decide` is given the member's current value (a set member's is empty; `None` when it
/// is absent) and returns the write, or `None` for none (HSETNX of a field present, an
/// HINCRBY whose old value is not a number). It runs only once the pages are in memory and
/// may run for a write that then takes the general path, so it must have no effect beyond
/// its result and what it records for its caller.
#[allow(clippy::too_many_arguments)]
pub fn point_write(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    kind: ValueKind,
    root_payload: &[u8],
    member: &[u8],
    decide: impl FnOnce(Option<&[u8]>) -> Option<PointOp>,
    expire: Option<u64>,
    now_ms: u64,
) -> Result<PointOutcome, StorageError> {
    let has_values = kind == ValueKind::Hash;
    let root = Root::decode(root_payload)?;
    if root.dirs.is_empty() {
        return Ok(PointOutcome::General);
    }
    let p = position(member);
    let di = root
        .dirs
        .partition_point(|e| e.first <= p)
        .saturating_sub(1);
    let mut ra = Ahead::start();
    let entries = dir_ahead(&mut ra, shard, db, key, &root, di)?;
    let Some(entries) = entries else {
        ra.finish(())?;
        return Ok(PointOutcome::General);
    };
    let li = entries.partition_point(|e| e.first <= p).saturating_sub(1);
    let l = entries[li];
    let rec = ra.page(shard, db, key, l.addr, l.len, false)?;
    ra.finish(())?;
    let Some(rec) = rec else {
        return Ok(PointOutcome::General);
    };
    let b = &rec.value;
    let LeafSpot {
        body,
        from,
        to,
        old,
    } = find_in_leaf_bytes(
        b,
        has_values,
        leaf_range(&root, di, &entries, li),
        l.count,
        p,
        member,
    )?;
    let existed = old.is_some();
    let Some(op) = decide(old) else {
        return Ok(PointOutcome::Applied {
            existed,
            written: false,
        });
    };
    if matches!(&op, PointOp::Upsert(v) if v.is_some() != has_values) {
        return Ok(PointOutcome::General);
    }
    let (added, count) = match &op {
        PointOp::Upsert(_) if existed && !has_values => {
            return Ok(PointOutcome::Applied {
                existed,
                written: false,
            })
        }
        PointOp::Remove if !existed => {
            return Ok(PointOutcome::Applied {
                existed,
                written: false,
            })
        }
        PointOp::Upsert(v) => {
            let n = varint_len(member.len()) + member.len();
            let v = v.as_ref().map_or(0, |v| varint_len(v.len()) + v.len());
            (n + v, l.count as usize + usize::from(!existed))
        }
        PointOp::Remove => (0, l.count as usize - 1),
    };
    let removed = to - from;
    let members = b.len() - body - removed + added;
    // `update`'s rules for a rewritten leaf: split above LEAF_MAX_BYTES, dropped when
    // empty, merged with the next leaf of its directory page or else the previous one when
    // together under LEAF_MERGE_BYTES; `store_hash`/`store_set` demote under DEMOTE_BYTES.
    let total_bytes = (root.bytes as usize + added).checked_sub(removed);
    let next_small = entries
        .get(li + 1)
        .is_some_and(|n| members + leaf_members_bytes(n) < LEAF_MERGE_BYTES);
    let prev_small = li > 0 && entries[li - 1].len as usize + members < LEAF_MERGE_BYTES;
    if count == 0
        || members > LEAF_MAX_BYTES
        || next_small
        || prev_small
        || total_bytes.is_none_or(|t| t < DEMOTE_BYTES)
    {
        return Ok(PointOutcome::General);
    }
    let mut payload = Vec::with_capacity(1 + varint_len(count) + members);
    payload.push(PAGE_LEAF);
    put_varint(&mut payload, count as u64);
    payload.extend_from_slice(&b[body..from]);
    if let PointOp::Upsert(v) = &op {
        put_varint(&mut payload, member.len() as u64);
        payload.extend_from_slice(member);
        if let Some(v) = v {
            put_varint(&mut payload, v.len() as u64);
            payload.extend_from_slice(v);
        }
    }
    payload.extend_from_slice(&b[to..]);
    let seq = shard.reserve_seq();
    let mut w = Writer {
        shard,
        db,
        key,
        kind,
        seq,
    };
    let mut new_entries = entries;
    new_entries[li] = Entry {
        first: l.first,
        addr: w.page(&payload)?,
        len: payload.len() as u32,
        count: count as u32,
    };
    let old_dir = root.dirs[di];
    let mut dead = vec![(l.addr, l.len), (old_dir.addr, old_dir.len)];
    let mut dirs = root.dirs.clone();
    dirs[di] = w.dir(&new_entries)?;
    let written = vec![(dirs[di].addr, new_entries)];
    let mut dirs = merge_small_dirs(&mut w, &root.dirs, dirs, written, &mut dead)?;
    dirs[0].first = 0;
    let new_root = Root {
        encoding: root.encoding,
        count: root.count + u64::from(!existed) - u64::from(op == PointOp::Remove),
        bytes: total_bytes.unwrap_or(0) as u64,
        dirs,
    };
    let key_len = key.len();
    for (addr, len) in dead {
        w.shard.unaccount_page(db, Address(addr), key_len, len);
    }
    w.shard
        .put_paged_root(db, key, kind, &new_root.encode(), expire, now_ms, seq, true)?;
    Ok(PointOutcome::Applied {
        existed,
        written: true,
    })
}

/// Where a member is, or goes, in a leaf's bytes (`find_in_leaf_bytes`).
struct LeafSpot<'b> {
    /// Where the members start (after the kind byte and the count).
    body: usize,
    /// The member's byte span (empty, at its sorted place, when it is absent).
    from: usize,
    to: usize,
    /// Its value when present (empty for a set member).
    old: Option<&'b [u8]>,
}

/// Walks leaf payload `b` (`count` members, positions in `range`) for `member` at position
/// `p`: returns where the members start, the byte span the member takes (empty, at its
/// sorted place, when absent) and its value when it is there (empty for a set member). Names are hashed only up to the
/// member's place, and checked for range and order as far; the rest is walked for its
/// lengths only.
fn find_in_leaf_bytes<'b>(
    b: &'b [u8],
    has_values: bool,
    range: (u64, u64),
    count: u32,
    p: u64,
    member: &[u8],
) -> Result<LeafSpot<'b>, StorageError> {
    let mut r = Reader { b, at: 0 };
    if r.u8()? != PAGE_LEAF {
        return Err(corrupt("not a leaf page"));
    }
    let n = r.varint()?;
    if n == 0 || n != count as usize {
        return Err(corrupt("leaf count disagrees with its directory"));
    }
    let body = r.at;
    let mut found: Option<(usize, usize, Option<&[u8]>)> = None;
    let mut prev: Option<(u64, &[u8])> = None;
    for _ in 0..n {
        let at = r.at;
        let name = r.string()?;
        let value = if has_values { r.string()? } else { &[] };
        if found.is_some() {
            continue;
        }
        let q = position(name);
        if q < range.0 || q >= range.1 || prev.is_some_and(|x| x >= (q, name)) {
            return Err(corrupt("leaf member out of its range or order"));
        }
        match (q, name).cmp(&(p, member)) {
            std::cmp::Ordering::Less => prev = Some((q, name)),
            std::cmp::Ordering::Equal => found = Some((at, r.at, Some(value))),
            std::cmp::Ordering::Greater => found = Some((at, at, None)),
        }
    }
    r.done()?;
    let (from, to, old) = found.unwrap_or((b.len(), b.len(), None));
    Ok(LeafSpot {
        body,
        from,
        to,
        old,
    })
}

/// Merges neighbouring directory pages that together hold at most `DIR_MERGE_ENTRIES`
/// leaves, when at least one of them was just rewritten (so a merge never rewrites two
/// untouched pages).
fn merge_small_dirs(
    w: &mut Writer,
    old_dirs: &[Entry],
    dirs: Vec<Entry>,
    mut written: Vec<(u64, Vec<Entry>)>,
    dead: &mut Vec<(u64, u32)>,
) -> Result<Vec<Entry>, StorageError> {
    let old: std::collections::HashSet<u64> = old_dirs.iter().map(|d| d.addr).collect();
    let mut out: Vec<Entry> = Vec::with_capacity(dirs.len());
    let mut pending_entries: Option<Vec<Entry>> = None;
    for d in dirs {
        let fresh = !old.contains(&d.addr);
        // A page just written comes with its entries (`written`); others are read.
        let known = written
            .iter()
            .position(|(a, _)| *a == d.addr)
            .map(|i| written.swap_remove(i).1);
        let entries = match known {
            Some(e) => Some(e),
            None if fresh || pending_entries.is_some() => Some(read_dir_entries(w, &d)?),
            None => None,
        };
        match (pending_entries.take(), entries) {
            (Some(mut prev), Some(cur)) if prev.len() + cur.len() <= DIR_MERGE_ENTRIES => {
                let last = out.pop().expect("pending has an entry");
                dead.push((last.addr, last.len));
                dead.push((d.addr, d.len));
                prev.extend(cur);
                let merged = w.dir(&prev)?;
                out.push(merged);
                pending_entries = Some(prev);
            }
            (_, cur) => {
                out.push(d);
                pending_entries = cur.filter(|c| fresh && c.len() <= DIR_MERGE_ENTRIES);
            }
        }
    }
    Ok(out)
}

fn read_dir_entries(w: &mut Writer, d: &Entry) -> Result<Vec<Entry>, StorageError> {
    let rec = read_page(w.shard, w.db, w.key, d.addr)?;
    decode_dir(&rec.value)
}

// ---- defrag ----------------------------------------------------------------------------------

/// The first member of an encoded leaf page (`None` if it is not one).
fn first_member(b: &[u8]) -> Option<&[u8]> {
    let mut r = Reader { b, at: 0 };
    if r.u8().ok()? != PAGE_LEAF || r.varint().ok()? == 0 {
        return None;
    }
    r.string().ok()
}

/// Defrag found the page record `payload` of (db, key) at `addr` in a block it empties: if
/// the key's current root still reaches it, appends a copy and a new root (and, for a
/// leaf, a new directory page) pointing at the copy, under a new sequence number, and stops
/// counting the old page. False if the page is dead (nothing to copy).
pub(crate) fn relocate_page(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    addr: Address,
    payload: &[u8],
) -> Result<bool, StorageError> {
    let h = shard.hash(db, key);
    let Some(found) = shard.find(db, key, h)? else {
        return Ok(false);
    };
    if found.rec.header.record_type != RecordType::Put || !is_root(found.rec.header.flags) {
        return Ok(false);
    }
    let kind = ValueKind::from_u8(found.rec.header.value_kind)
        .ok_or_else(|| corrupt("unknown value kind of a paged root"))?;
    let expire = (found.rec.header.expire_at_ms != 0).then_some(found.rec.header.expire_at_ms);
    let now = shard.last_now_ms;
    if let Some((base_addr, base_len)) = base_of(&found.rec.value) {
        if shard.current_address(Address(base_addr)) == addr {
            // The base page of a version-2 root: copied, and the root (same change list)
            // pointed at the copy; `put_paged_root_as` stops counting the old base.
            let Ok(entries) = decode_base(payload) else {
                return Ok(false);
            };
            let mut based = BasedRoot::decode(&found.rec.value)?;
            let seq = shard.reserve_seq();
            let new = shard.append_page(db, key, kind, payload, seq)?.0;
            if let Some(s) = block_seq_of(shard, new) {
                shard.bases.put(new, s, std::sync::Arc::new(entries));
            }
            based.base_addr = new;
            based.base_len = base_len;
            shard.put_paged_root_as(
                db,
                key,
                kind,
                &based.encode(),
                expire,
                now,
                seq,
                true,
                false,
            )?;
            return Ok(true);
        }
    }
    let Ok(mut root) = decode_stored(shard, db, key, &found.rec.value) else {
        return Ok(false);
    };
    let mut dead: Vec<(u64, u32)> = Vec::new();
    let seq;
    if let Some(di) = root.dirs.iter().position(|d| d.addr == addr.0) {
        seq = shard.reserve_seq();
        let new = shard.append_page(db, key, kind, payload, seq)?;
        dead.push((addr.0, root.dirs[di].len));
        root.dirs[di].addr = new.0;
    } else {
        // A hash or set leaf can only be named by the directory page whose range holds its
        // first member's position: one read decides. Other kinds' leaves (list chains,
        // sorted-set trees) are looked for in every directory page.
        let only = match kind {
            ValueKind::Hash | ValueKind::Set => match first_member(payload) {
                Some(name) => {
                    let p = position(name);
                    let di = root
                        .dirs
                        .partition_point(|e| e.first <= p)
                        .saturating_sub(1);
                    Some(di..di + 1)
                }
                None => return Ok(false),
            },
            _ => None,
        };
        let mut hit = None;
        for di in only.unwrap_or(0..root.dirs.len()) {
            let rec = read_page(shard, db, key, root.dirs[di].addr)?;
            let entries = decode_dir(&rec.value)?;
            if let Some(li) = entries.iter().position(|e| e.addr == addr.0) {
                hit = Some((di, li, entries, rec.value));
                break;
            }
        }
        let Some((di, li, entries, mut dir_payload)) = hit else {
            return Ok(false);
        };
        seq = shard.reserve_seq();
        let new = shard.append_page(db, key, kind, payload, seq)?;
        dead.push((addr.0, entries[li].len));
        // The directory page with the leaf's address patched in place (byte-identical to
        // re-encoding its entries; it also keeps a keyed page's keys, `paged_zset.rs`).
        let at = DIR_ENTRIES_AT + li * ENTRY_BYTES + 8;
        dir_payload[at..at + 8].copy_from_slice(&new.0.to_le_bytes());
        let new_dir = shard.append_page(db, key, kind, &dir_payload, seq)?;
        dead.push((root.dirs[di].addr, root.dirs[di].len));
        root.dirs[di].addr = new_dir.0;
        root.dirs[di].len = dir_payload.len() as u32;
    }
    // The old pages stop counting only once the new root replaced the old one.
    shard.put_paged_root_as(db, key, kind, &root.encode(), expire, now, seq, true, false)?;
    for (a, len) in dead {
        shard.unaccount_page(db, Address(a), key.len(), len);
    }
    Ok(true)
}

// ---- recovery --------------------------------------------------------------------------------

/// Paged roots recovery found incomplete and replaced by an older version (process-wide).
pub static RECOVERY_FALLBACKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What recovery's pass 2 gathers for paged collections (transient, dropped after the
/// open): every committed page record (address and db), every paged root it indexed, and
/// the records a paged root superseded or shadowed (the fallbacks of section 6).
#[derive(Default)]
pub(crate) struct RecoveredPages {
    pages: std::collections::HashMap<u64, Db>,
    roots: Vec<(Db, u64, Address)>,
    /// (db, key hash, address, sequence number).
    history: Vec<(Db, u64, Address, u64)>,
}

impl RecoveredPages {
    pub(crate) fn page(&mut self, addr: Address, db: Db) {
        self.pages.insert(addr.0, db);
    }

    pub(crate) fn root(&mut self, db: Db, h: u64, addr: Address) {
        self.roots.push((db, h, addr));
    }

    /// A record of the key at `addr` older than a paged root of the same key.
    pub(crate) fn superseded(&mut self, db: Db, h: u64, addr: Address, seq: u64) {
        self.history.push((db, h, addr, seq));
    }

    /// The pages of the paged root `rec`, if every one is a committed page record of its db.
    fn complete(&self, shard: &mut Shard, rec: &OwnedRecord) -> Option<Vec<(u64, u32)>> {
        let db = rec.header.db;
        if let Some((a, _)) = base_of(&rec.value) {
            // The base page must be committed before it is read.
            if self.pages.get(&a) != Some(&db) {
                return None;
            }
        }
        pages_of_stored(shard, rec)
            .ok()
            .filter(|pages| pages.iter().all(|(a, _)| self.pages.get(a) == Some(&db)))
    }
}

/// The end of recovery for paged collections (`docs/collections.md` section 6): a root
/// still indexed counts only if every page it reaches is a committed page record of its
/// collection; its pages then become live bytes of their blocks. A root that fails (a page
/// lost in a chunk that did not survive while a later one did) is replaced by the newest
/// older record of its key that is complete (a tombstone deletes the key; a plain value or
/// a complete paged root is reinstated); with none, the key is dropped. Reinstated large
/// values are added to `large_roots`, whose extents recovery then keeps.
pub(crate) fn finish_recovery(
    shard: &mut Shard,
    rp: RecoveredPages,
    large_roots: &mut Vec<(Db, u64, Address)>,
) -> Result<(), StorageError> {
    for &(db, h, addr) in &rp.roots {
        if !shard.indexes[db as usize].candidates(h).any(|a| a == addr) {
            continue;
        }
        let rec = shard.read_record(addr)?;
        if let Some(pages) = rp.complete(shard, &rec) {
            for (a, len) in pages {
                shard.account_page(db, Address(a), rec.key.len(), len);
            }
            continue;
        }
        tracing::warn!(
            shard = shard.id(),
            db,
            "paged collection root with missing pages: falling back to an older version"
        );
        RECOVERY_FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shard.indexes[db as usize].remove(h, addr);
        shard.unaccount(db, addr, rec.header.record_len());
        shard.expiry_remove(db, rec.header.expire_at_ms, addr);
        let watermark = shard.watermarks[db as usize];
        let mut older: Vec<(u64, Address)> = rp
            .history
            .iter()
            .filter(|x| x.0 == db && x.1 == h && x.3 < rec.header.seq && x.3 >= watermark)
            .map(|x| (x.3, x.2))
            .collect();
        older.sort_unstable_by(|a, b| b.cmp(a));
        older.dedup();
        for (seq, a) in older {
            let Ok(old) = shard.read_record(a) else {
                continue;
            };
            if old.key != rec.key || old.header.db != db || old.header.seq != seq {
                continue;
            }
            if old.header.record_type == RecordType::Tombstone {
                break;
            }
            if old.header.record_type != RecordType::Put {
                continue;
            }
            if is_root(old.header.flags) {
                let Some(pages) = rp.complete(shard, &old) else {
                    continue;
                };
                for (pa, len) in pages {
                    shard.account_page(db, Address(pa), old.key.len(), len);
                }
            }
            shard.indexes[db as usize].insert(h, a);
            let (block, _) = shard.shared.layout.split(a);
            if let Some(info) = shard.blocks.get_mut(&block) {
                info.live_bytes[db as usize] += old.header.record_len() as u32;
            }
            shard.expiry_add(db, old.header.expire_at_ms, a);
            if old.header.flags & super::format::FLAG_LARGE != 0 {
                large_roots.push((db, h, a));
            }
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::{BlockDevice, MemDevice};
    use crate::storage::collection::{HashEncoding, HashValue, SetValue};
    use crate::storage::{open_on, Collection, FsyncPolicy, StoreConfig};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    thread_local! {
        /// `StoreConfig::paged_base_min_dirs` of the shards this test thread opens.
        static BASE_MIN: std::cell::Cell<usize> = const { std::cell::Cell::new(BASE_MIN_DIRS) };
    }

    /// Runs `test` with every paged root stored as version 2 (base page + change list).
    pub(crate) fn with_v2_roots(test: impl FnOnce()) {
        with_base_min_dirs(0, test);
    }

    /// Runs `test` with roots of more than `n` directory pages stored as version 2.
    pub(crate) fn with_base_min_dirs(n: usize, test: impl FnOnce()) {
        BASE_MIN.with(|c| c.set(n));
        test();
        BASE_MIN.with(|c| c.set(BASE_MIN_DIRS));
    }

    pub(crate) fn base_min_dirs() -> usize {
        BASE_MIN.with(|c| c.get())
    }

    fn cfg() -> StoreConfig {
        StoreConfig {
            block_size_bytes: 256 * 1024,
            fsync: FsyncPolicy::Always,
            shard_count: 1,
            staging_limit_bytes: 256 * 1024,
            paged_base_min_dirs: base_min_dirs(),
            ..StoreConfig::default()
        }
    }

    fn open(dev: &Arc<MemDevice>) -> Shard {
        open_on(vec![dev.clone() as Arc<dyn BlockDevice>], &cfg())
            .expect("open")
            .shards
            .pop()
            .expect("one shard")
    }

    /// `load_hash` of the command layer, against a shard.
    fn load_hash(s: &mut Shard, key: &[u8]) -> Option<HashValue> {
        match s.get_collection(0, key, 0).unwrap()? {
            Collection::Whole(v) => Some(HashValue::decode(&v.bytes).unwrap()),
            Collection::Paged { root, .. } => {
                let root = Root::decode(&root).unwrap();
                let (pairs, tree) = load(s, 0, key, &root, true).unwrap();
                Some(HashValue::from_paged(pairs, tree))
            }
        }
    }

    /// `store_hash` of the command layer, against a shard.
    fn store_hash(s: &mut Shard, key: &[u8], h: &HashValue) {
        if h.is_empty() {
            s.delete(0, key, 0).unwrap();
            return;
        }
        let ht = h.encoding() == HashEncoding::Hashtable;
        let paged = match h.paged_tree() {
            Some(_) => h.body_bytes() >= DEMOTE_BYTES,
            None => ht && h.body_bytes() > PROMOTE_BYTES,
        };
        let enc = h.encoding_byte();
        match (paged, h.paged_tree()) {
            (true, Some(t)) => update(s, 0, key, ValueKind::Hash, enc, h.pairs(), t, None, 0),
            (true, None) => build(s, 0, key, ValueKind::Hash, enc, h.pairs(), None, 0),
            (false, _) => s.put(0, key, ValueKind::Hash, &h.encode(), None, 0),
        }
        .unwrap();
    }

    fn is_paged(s: &mut Shard, key: &[u8]) -> bool {
        matches!(
            s.get_collection(0, key, 0).unwrap(),
            Some(Collection::Paged { .. })
        )
    }

    fn contents(h: &HashValue) -> BTreeMap<Vec<u8>, Vec<u8>> {
        h.pairs().iter().cloned().collect()
    }

    /// Live bytes the shard counts, against what the index and the roots reach (db 0;
    /// shared by the `paged_list` and `paged_zset` tests).
    pub(crate) fn check_live(s: &mut Shard, keys: &[&[u8]]) {
        // Released roots' pages stop counting in the background job: run it to the end,
        // in the smallest steps it takes.
        while !s.releases.is_empty() {
            release_step(s, &mut 0);
        }
        let mut want = 0u64;
        for k in keys {
            let h = s.hash(0, k);
            let Some(f) = s.find(0, k, h).unwrap() else {
                continue;
            };
            want += f.rec.header.record_len() as u64;
            if is_root(f.rec.header.flags) {
                for (_, len) in pages_of_stored(s, &f.rec).unwrap() {
                    want += super::super::format::record_len(k.len(), len as usize) as u64;
                }
            }
        }
        let have: u64 = s
            .blocks
            .values()
            .filter(|i| i.kind == super::super::format::BLOCK_KIND_LOG)
            .map(|i| i.live_total())
            .sum();
        assert_eq!(have, want, "live bytes");
    }

    /// The shape of a paged collection's tree (no addresses): root totals, then per
    /// directory page its entry and its leaves' (first, len, count).
    fn tree_shape(s: &mut Shard, key: &[u8]) -> Vec<(u64, u32, u32)> {
        let Some(Collection::Paged { root, .. }) = s.get_collection(0, key, 0).unwrap() else {
            panic!("not paged");
        };
        let root = Root::decode(&root).unwrap();
        let mut out = vec![(root.count, root.bytes as u32, root.dirs.len() as u32)];
        for d in &root.dirs {
            out.push((d.first, d.len, d.count));
            let entries = decode_dir(&read_page(s, 0, key, d.addr).unwrap().value).unwrap();
            out.extend(entries.iter().map(|e| (e.first, e.len, e.count)));
        }
        out
    }

    /// One member written the general way, as the command layer does: `load_partial` of
    /// that member, the change, `update` (the collections here stay far above demotion).
    fn general_write(s: &mut Shard, key: &[u8], member: &[u8], op: PointOp) {
        let Some(Collection::Paged { root, .. }) = s.get_collection(0, key, 0).unwrap() else {
            panic!("not paged");
        };
        let root = Root::decode(&root).unwrap();
        let names = [member];
        match op {
            PointOp::Upsert(Some(v)) => {
                let (pairs, tree) = load_partial(s, 0, key, &root, &names, true).unwrap();
                let mut h = HashValue::from_paged(pairs, tree);
                h.set(member, &v);
                let t = h.paged_tree().unwrap();
                update(s, 0, key, ValueKind::Hash, 1, h.pairs(), t, None, 0).unwrap();
            }
            PointOp::Remove if root.encoding == 1 => {
                let (pairs, tree) = load_partial(s, 0, key, &root, &names, true).unwrap();
                let mut h = HashValue::from_paged(pairs, tree);
                if h.remove(member) {
                    let t = h.paged_tree().unwrap();
                    update(s, 0, key, ValueKind::Hash, 1, h.pairs(), t, None, 0).unwrap();
                }
            }
            _ => {
                let (members, tree) = load_partial(s, 0, key, &root, &names, false).unwrap();
                let mut v = SetValue::from_paged(members, tree);
                let changed = match op {
                    PointOp::Remove => v.remove(member),
                    _ => v.add(member),
                };
                if changed {
                    let (t, enc) = (v.paged_tree().unwrap(), root.encoding);
                    update(s, 0, key, ValueKind::Set, enc, v.members(), t, None, 0).unwrap();
                }
            }
        }
    }

    // Single-member writes through `point_write` leave exactly the tree the general path
    // (`load_partial` + `update`) leaves for the same writes: the same leaves, directory
    // pages and totals after every write, through splits, leaf merges (both ways) and
    // directory merges; and the same members. The point path must do most of the writes.
    #[test]
    fn point_writes_leave_the_tree_the_general_path_leaves() {
        for has_values in [true, false] {
            let (da, db_) = (
                Arc::new(MemDevice::new("a", 256 << 20)),
                Arc::new(MemDevice::new("b", 256 << 20)),
            );
            let (mut a, mut b) = (open(&da), open(&db_));
            let key = b"k".as_slice();
            let kind = if has_values {
                ValueKind::Hash
            } else {
                ValueKind::Set
            };
            let name = |i: u64| format!("member:{i:08}").into_bytes();
            // ~2 directory pages of leaves, so directory merges can happen too.
            let n0 = if has_values { 60_000u64 } else { 110_000 };
            for s in [&mut a, &mut b] {
                if has_values {
                    let pairs: Vec<(Vec<u8>, Vec<u8>)> =
                        (0..n0).map(|i| (name(i), b"v".repeat(12))).collect();
                    build(s, 0, key, kind, 1, &pairs, None, 0).unwrap();
                } else {
                    let members: Vec<Vec<u8>> = (0..n0).map(name).collect();
                    build(s, 0, key, kind, 2, &members, None, 0).unwrap();
                }
            }
            assert_eq!(tree_shape(&mut a, key), tree_shape(&mut b, key));
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            // Removals that empty whole leaves: every member of the first 1/16 of the
            // position space (forward merges, emptied leaves) and of the leaves around the
            // boundary of the two directory pages (a page's last leaf merges backwards),
            // in random order; then random adds and upserts with values up to 300 bytes
            // (splits).
            let Some(Collection::Paged { root, .. }) = a.get_collection(0, key, 0).unwrap() else {
                panic!("not paged");
            };
            let boundary = Root::decode(&root).unwrap().dirs[1].first;
            let span = (1u64 << 63) / 16;
            let mut doomed: Vec<Vec<u8>> = (0..n0)
                .map(name)
                .filter(|m| {
                    let p = position(m);
                    p < span || p.abs_diff(boundary) < span / 2
                })
                .collect();
            for i in (1..doomed.len()).rev() {
                doomed.swap(i, next() as usize % (i + 1));
            }
            let (mut point, mut general) = (0, 0);
            for step in 0..doomed.len() + 2500 {
                let r = next();
                let value = b"x".repeat((r >> 20) as usize % 300 + 1);
                let (m, op) = if let Some(m) = doomed.get(step) {
                    (m.clone(), PointOp::Remove)
                } else if r >> 40 & 3 == 0 {
                    (name(r % (n0 * 2)), PointOp::Remove)
                } else {
                    let v = has_values.then(|| value.clone());
                    (name(r % (n0 * 2)), PointOp::Upsert(v))
                };
                let root = root_of(&mut a, key);
                let decide = |_: Option<&[u8]>| Some(op.clone());
                match point_write(&mut a, 0, key, kind, &root, &m, decide, None, 0).unwrap() {
                    PointOutcome::Applied { .. } => point += 1,
                    PointOutcome::General => {
                        general += 1;
                        general_write(&mut a, key, &m, op.clone());
                    }
                }
                general_write(&mut b, key, &m, op);
                assert_eq!(
                    tree_shape(&mut a, key),
                    tree_shape(&mut b, key),
                    "step {step}"
                );
            }
            assert!(point > general * 2, "point {point} general {general}");
            if has_values {
                let (ha, hb) = (
                    load_hash(&mut a, key).unwrap(),
                    load_hash(&mut b, key).unwrap(),
                );
                assert_eq!(contents(&ha), contents(&hb));
            }
            check_live(&mut a, &[key]);
        }
    }

    fn root_of(s: &mut Shard, key: &[u8]) -> Vec<u8> {
        match s.get_collection(0, key, 0).unwrap() {
            Some(Collection::Paged { root, .. }) => root,
            _ => panic!("not paged"),
        }
    }

    // A hash grown to thousands of fields, updated and shrunk at random, reads back as its
    // model after every batch, promotes past PROMOTE_BYTES and demotes under DEMOTE_BYTES,
    // keeps exact live-byte accounting, and survives a crash and a clean reopen.
    #[test]
    fn hash_model_through_crashes() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut was_paged = false;
        for round in 0..14u64 {
            let grow = round < 8;
            let mut h = load_hash(&mut s, b"h").unwrap_or_default();
            h.prepare_write(200, 1);
            for _ in 0..400 {
                let r = next();
                let f = format!("f{}", r % 3000).into_bytes();
                if grow || r % 5 == 0 {
                    let v = format!("v{}-{round}", r % 97).into_bytes();
                    assert_eq!(h.set(&f, &v), model.insert(f, v).is_none());
                } else {
                    assert_eq!(h.remove(&f), model.remove(&f).is_some());
                }
                // Store every few ops, so updates touch one or a few leaves.
                if r % 8 == 0 {
                    store_hash(&mut s, b"h", &h);
                    h = load_hash(&mut s, b"h").unwrap_or_default();
                }
            }
            store_hash(&mut s, b"h", &h);
            let back = load_hash(&mut s, b"h")
                .map(|h| contents(&h))
                .unwrap_or_default();
            assert_eq!(back, model, "round {round}");
            was_paged |= is_paged(&mut s, b"h");
            check_live(&mut s, &[b"h"]);
            if round % 3 == 2 {
                s.flush().unwrap();
                drop(s);
                dev.crash(None);
                s = open(&dev);
                let back = load_hash(&mut s, b"h")
                    .map(|h| contents(&h))
                    .unwrap_or_default();
                assert_eq!(back, model, "after crash, round {round}");
                check_live(&mut s, &[b"h"]);
            }
        }
        assert!(was_paged, "the hash was paged at some point");
        // Shrink under DEMOTE_BYTES: one record again.
        let mut h = load_hash(&mut s, b"h").unwrap();
        let fields: Vec<Vec<u8>> = h.pairs().iter().map(|(f, _)| f.clone()).collect();
        for f in fields.iter().skip(20) {
            h.remove(f);
            model.remove(f);
        }
        store_hash(&mut s, b"h", &h);
        assert!(!is_paged(&mut s, b"h"));
        assert_eq!(contents(&load_hash(&mut s, b"h").unwrap()), model);
        check_live(&mut s, &[b"h"]);
        s.shutdown(true).unwrap();
        let mut s = open(&dev);
        assert_eq!(contents(&load_hash(&mut s, b"h").unwrap()), model);
    }

    // A single-field update of a big paged set writes one leaf, at most one directory page
    // and the root; DEL releases every page (live bytes back to zero).
    #[test]
    fn set_update_writes_few_pages_and_delete_releases() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev);
        let mut set = SetValue::create(b"m", 100_000);
        for i in 0..100_000u32 {
            set.add(format!("member:{i}").as_bytes());
        }
        build(
            &mut s,
            0,
            b"s",
            ValueKind::Set,
            set.encoding_byte(),
            set.members(),
            None,
            0,
        )
        .unwrap();
        s.flush().unwrap();
        for i in 0..20u32 {
            let Some(Collection::Paged { root, .. }) = s.get_collection(0, b"s", 0).unwrap() else {
                panic!("not paged");
            };
            let root = Root::decode(&root).unwrap();
            let (members, tree) = load::<Vec<u8>>(&mut s, 0, b"s", &root, false).unwrap();
            let mut v = SetValue::from_paged(members, tree);
            assert!(v.add(format!("new:{i}").as_bytes()));
            let before = s.stats().device_write_bytes;
            let t = v.paged_tree().unwrap().clone();
            update(
                &mut s,
                0,
                b"s",
                ValueKind::Set,
                v.encoding_byte(),
                v.members(),
                &t,
                None,
                0,
            )
            .unwrap();
            s.flush().unwrap();
            let written = s.stats().device_write_bytes - before;
            // Two pages of 8 KiB, the root, and the chunk's marker and 4 KiB alignment.
            let root_len = s.get_collection(0, b"s", 0).map(|c| match c {
                Some(Collection::Paged { root, .. }) => root.len(),
                _ => usize::MAX,
            });
            let bound = 2 * LEAF_MAX_BYTES + root_len.unwrap() + 4096;
            assert!(
                written as usize <= bound,
                "one update wrote {written} bytes > {bound}"
            );
        }
        check_live(&mut s, &[b"s"]);
        assert!(s.delete(0, b"s", 0).unwrap());
        check_live(&mut s, &[b"s"]);
    }

    // Writes of successive updates of a paged hash, written in sealed blocks but not synced
    // (pages and roots straddling block seals), then power loss keeping a random
    // subset of the writes: the hash is always exactly one of the versions written, never a
    // mix, and some runs need recovery's fallback to an older root.
    #[test]
    fn crash_keeping_later_chunks_falls_back_to_a_complete_root() {
        let small = StoreConfig {
            block_size_bytes: 64 * 1024,
            staging_limit_bytes: 64 * 1024,
            ..cfg()
        };
        let before = RECOVERY_FALLBACKS.load(std::sync::atomic::Ordering::Relaxed);
        for seed in 0..8u64 {
            let dev = Arc::new(MemDevice::new("t", 32 << 20));
            let open_small = |dev: &Arc<MemDevice>| {
                open_on(vec![dev.clone() as Arc<dyn BlockDevice>], &small)
                    .expect("open")
                    .shards
                    .pop()
                    .expect("one shard")
            };
            let mut s = open_small(&dev);
            let mut h = HashValue::new();
            h.prepare_write(6000, 1);
            for i in 0..6000u32 {
                h.set(format!("field-{i}").as_bytes(), format!("v{i}").as_bytes());
            }
            store_hash(&mut s, b"h", &h);
            s.flush().unwrap();
            let mut versions = vec![contents(&h)];
            let mut rng = seed * 7919 + 1;
            // Unsynced writes: the blocks sealed as the log fills (MemDevice syncs on flush).
            for round in 0..60u64 {
                let mut h = load_hash(&mut s, b"h").unwrap();
                for _ in 0..1 {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let f = format!("field-{}", (rng >> 33) % 7000);
                    if rng % 3 == 0 {
                        h.remove(f.as_bytes());
                    } else {
                        h.set(f.as_bytes(), format!("r{round}").as_bytes());
                    }
                }
                store_hash(&mut s, b"h", &h);
                versions.push(contents(&h));
            }
            drop(s);
            dev.crash_random(seed);
            let mut s = open_small(&dev);
            let back = load_hash(&mut s, b"h")
                .map(|h| contents(&h))
                .unwrap_or_default();
            assert!(
                versions.contains(&back),
                "seed {seed}: a state no command produced"
            );
            check_live(&mut s, &[b"h"]);
        }
        let after = RECOVERY_FALLBACKS.load(std::sync::atomic::Ordering::Relaxed);
        assert!(after > before, "no run needed the fallback");
    }

    // Defrag empties blocks holding live pages of a paged hash and a paged set by copying
    // the pages and rewriting their roots: contents unchanged, blocks freed, live bytes
    // exact, and the result survives a crash and reopen.
    #[test]
    fn defrag_relocates_pages() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev);
        let mut h = HashValue::new();
        h.prepare_write(4000, 1);
        for i in 0..4000u32 {
            h.set(
                format!("field-{i}").as_bytes(),
                format!("value-{i}").as_bytes(),
            );
        }
        store_hash(&mut s, b"h", &h);
        let mut set = SetValue::create(b"m", 4000);
        for i in 0..4000u32 {
            set.add(format!("member-{i}").as_bytes());
        }
        build(
            &mut s,
            0,
            b"s",
            ValueKind::Set,
            set.encoding_byte(),
            set.members(),
            None,
            0,
        )
        .unwrap();
        // Many small updates: the blocks fill with dead pages and old roots.
        for i in 0..300u32 {
            let mut h = load_hash(&mut s, b"h").unwrap();
            h.set(format!("field-{}", i * 13 % 4000).as_bytes(), b"updated");
            store_hash(&mut s, b"h", &h);
        }
        let want = contents(&load_hash(&mut s, b"h").unwrap());
        s.flush().unwrap();
        let before = s.stats();
        for round in 0..400u64 {
            s.background(1000 + round, 100_000).unwrap();
            s.flush().unwrap();
        }
        let after = s.stats();
        assert!(after.defrag_relocated_records > before.defrag_relocated_records);
        assert!(after.defrag_freed_blocks > before.defrag_freed_blocks);
        // No block was left in place for holding pages defrag could not move.
        assert!(s.blocks.values().all(|i| !i.no_defrag));
        assert_eq!(contents(&load_hash(&mut s, b"h").unwrap()), want);
        let Some(Collection::Whole(v)) = s.get(0, b"s", 0).unwrap().map(Collection::Whole) else {
            panic!("set missing");
        };
        assert_eq!(SetValue::decode(&v.bytes).unwrap().len(), 4000);
        check_live(&mut s, &[b"h", b"s"]);
        drop(s);
        dev.crash(None);
        let mut s = open(&dev);
        assert_eq!(contents(&load_hash(&mut s, b"h").unwrap()), want);
        check_live(&mut s, &[b"h", b"s"]);
    }

    // Defrag finds a hash leaf's directory page by the leaf's first position: one directory
    // read per relocated leaf, not a scan of every directory page (which, at 10M members,
    // was ~160 synchronous reads per leaf and stalled the worker).
    #[test]
    fn defrag_reads_one_directory_page_per_leaf() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev);
        let mut h = HashValue::new();
        h.prepare_write(20_000, 300);
        let big = vec![b'v'; 300];
        for i in 0..20_000u32 {
            h.set(format!("field-{i}").as_bytes(), &big);
        }
        store_hash(&mut s, b"h", &h);
        let Some(Collection::Paged { root, .. }) = s.get_collection(0, b"h", 0).unwrap() else {
            panic!("not paged");
        };
        let dirs = Root::decode(&root).unwrap().dirs.len();
        assert!(dirs >= 4, "{dirs} directory pages");
        // Updates spread over most leaves: the first blocks become mostly dead pages.
        for round in 0..30u32 {
            let mut h = load_hash(&mut s, b"h").unwrap();
            for j in 0..40u32 {
                let i = (round * 40 + j) * 16 % 20_000;
                h.set(format!("field-{i}").as_bytes(), b"updated");
            }
            store_hash(&mut s, b"h", &h);
        }
        let want = contents(&load_hash(&mut s, b"h").unwrap());
        s.flush().unwrap();
        let before = s.stats();
        for round in 0..400u64 {
            s.background(1000 + round, 100_000).unwrap();
            s.flush().unwrap();
        }
        let after = s.stats();
        let moved = after.defrag_relocated_records - before.defrag_relocated_records;
        let blocks = after.defrag_freed_blocks - before.defrag_freed_blocks;
        let reads = after.device_reads - before.device_reads;
        assert!(moved > 100 && blocks > 0, "moved {moved}, freed {blocks}");
        // Per relocated record: the root lookup and one directory page; per block: its image.
        assert!(
            reads <= 2 * moved + 2 * blocks + 16,
            "{reads} reads for {moved} relocated records in {blocks} blocks"
        );
        assert_eq!(contents(&load_hash(&mut s, b"h").unwrap()), want);
        check_live(&mut s, &[b"h"]);
    }

    // Shrinking a paged hash by removals spread over many leaves per store (interleaved
    // dirty and untouched leaves, forward and backward merges) keeps every remaining field,
    // down to the demotion to one record.
    #[test]
    fn shrink_with_spread_removals_merges_without_loss() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev);
        let mut h = HashValue::new();
        h.prepare_write(3000, 1);
        let mut model = BTreeMap::new();
        for i in 0..3000u32 {
            let (f, v) = (format!("field-{i}"), format!("value-{i}"));
            h.set(f.as_bytes(), v.as_bytes());
            model.insert(f.into_bytes(), v.into_bytes());
        }
        store_hash(&mut s, b"h", &h);
        let mut rng = 12345u64;
        let mut stores = 0;
        while model.len() > 60 {
            let mut h = load_hash(&mut s, b"h").unwrap();
            for _ in 0..12 {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let f = format!("field-{}", (rng >> 33) % 3000).into_bytes();
                assert_eq!(h.remove(&f), model.remove(&f).is_some());
            }
            store_hash(&mut s, b"h", &h);
            stores += 1;
            if stores % 5 == 0 {
                assert_eq!(
                    contents(&load_hash(&mut s, b"h").unwrap()),
                    model,
                    "store {stores}"
                );
            }
        }
        assert!(!is_paged(&mut s, b"h"), "demoted at the end");
        assert_eq!(contents(&load_hash(&mut s, b"h").unwrap()), model);
        check_live(&mut s, &[b"h"]);
    }

    // DEL of a big paged hash reads no page (no device read, no cache lookup: the release
    // is queued), live bytes converge to exactly what is reachable once the background job
    // ran, and defrag (held back while releases are pending), a crash with releases
    // pending and a clean reopen all end with the right contents and exact live bytes.
    #[test]
    fn delete_releases_pages_in_the_background() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev);
        let mk = |n: u32, tag: &str| {
            let mut h = HashValue::new();
            h.prepare_write(n as usize, 1);
            for i in 0..n {
                h.set(format!("f-{tag}-{i}").as_bytes(), b"some value bytes");
            }
            h
        };
        store_hash(&mut s, b"big", &mk(20_000, "a"));
        store_hash(&mut s, b"keep", &mk(3000, "k"));
        store_hash(&mut s, b"over", &mk(3000, "o"));
        s.flush().unwrap();
        s.cache.clear();
        // The roots in the record cache (DEL reads the record it deletes), pages not.
        for k in [&b"big"[..], b"over"] {
            assert!(is_paged(&mut s, k));
        }
        let before = s.stats();
        assert!(s.delete(0, b"big", 0).unwrap());
        // Overwrite of a paged root by a one-record value: also queued.
        s.put(0, b"over", ValueKind::Hash, &mk(3, "x").encode(), None, 0)
            .unwrap();
        let after = s.stats();
        assert_eq!(after.device_reads, before.device_reads, "DEL read a page");
        assert_eq!(after.paged_releases_pending, 2);
        assert!(after.paged_release_dirs_pending >= 2);
        // Defrag waits while releases are pending; a background step with a small budget
        // releases some directory pages, not necessarily all.
        let relocated = after.defrag_relocated_records;
        s.background(10, 10).unwrap();
        assert_eq!(s.stats().defrag_relocated_records, relocated);
        assert!(s.stats().paged_release_dirs_pending < after.paged_release_dirs_pending);
        let mut now = 20;
        while s.stats().paged_releases_pending > 0 {
            s.background(now, 1000).unwrap();
            now += 10;
        }
        check_live(&mut s, &[b"big", b"keep", b"over"]);
        // Defrag now runs and frees the dead pages' blocks; contents unchanged.
        let keep = contents(&load_hash(&mut s, b"keep").unwrap());
        for _ in 0..300 {
            s.background(now, 100_000).unwrap();
            s.flush().unwrap();
            now += 10;
        }
        assert!(s.stats().defrag_freed_blocks > 0);
        assert_eq!(contents(&load_hash(&mut s, b"keep").unwrap()), keep);
        check_live(&mut s, &[b"big", b"keep", b"over"]);
        // A crash with releases pending: recovery counts only what roots reach.
        assert!(s.delete(0, b"keep", 0).unwrap());
        store_hash(&mut s, b"new", &mk(5000, "n"));
        let newc = contents(&load_hash(&mut s, b"new").unwrap());
        assert_eq!(s.stats().paged_releases_pending, 1);
        s.flush().unwrap();
        drop(s);
        dev.crash(None);
        let mut s = open(&dev);
        assert_eq!(s.stats().paged_releases_pending, 0);
        assert!(load_hash(&mut s, b"keep").is_none());
        assert_eq!(contents(&load_hash(&mut s, b"new").unwrap()), newc);
        check_live(&mut s, &[b"big", b"keep", b"over", b"new"]);
        // A clean shutdown with a release pending writes exact live bytes in its checkpoint.
        assert!(s.delete(0, b"new", 0).unwrap());
        s.shutdown(true).unwrap();
        let mut s = open(&dev);
        check_live(&mut s, &[b"big", b"keep", b"over", b"new"]);
    }

    /// Performs the reads a restartable run wanted, as the worker's ring would (through the
    /// data file at `path`), and returns the verified records.
    fn read_wanted(
        s: &mut Shard,
        path: &std::path::Path,
        wanted: Vec<(u32, crate::storage::prefetch::RecordRead)>,
    ) -> Vec<crate::storage::prefetch::Fetched> {
        use crate::storage::prefetch::{ReadDone, RecordPool};
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path).unwrap();
        let mut pool = RecordPool::default();
        let mut out = Vec::new();
        for (_, mut r) in wanted {
            loop {
                let mut buf = vec![0u8; r.len_bytes];
                file.read_exact_at(&mut buf, r.offset_bytes).unwrap();
                match s.complete_read(&r, &buf, &mut pool) {
                    ReadDone::Record(f) => break out.push(f),
                    ReadDone::More(longer) => r = longer,
                    ReadDone::Stale => panic!("nothing changed under the read"),
                }
            }
        }
        out
    }

    /// Runs `f` restartably, round after round, each round's wanted reads performed and
    /// lent to the next run; returns its result and the reads each round wanted.
    fn rounds<T>(
        s: &mut Shard,
        path: &std::path::Path,
        mut f: impl FnMut(&mut Shard) -> Result<T, StorageError>,
    ) -> (T, Vec<usize>) {
        use crate::storage::prefetch::{restartable_begin, restartable_end};
        let mut fetched = Vec::new();
        let mut per_round = Vec::new();
        loop {
            s.lend_prefetched(&mut fetched);
            restartable_begin();
            let r = f(s);
            let mut wanted = Vec::new();
            restartable_end(&mut wanted);
            s.take_prefetched(&mut fetched);
            match r {
                Ok(v) => {
                    assert!(wanted.is_empty(), "a valid run wants nothing");
                    return (v, per_round);
                }
                Err(StorageError::Deferred) => {
                    assert!(!wanted.is_empty(), "a deferred run wants reads");
                    per_round.push(wanted.len());
                    fetched.extend(read_wanted(s, path, wanted));
                }
                Err(e) => panic!("{e}"),
            }
            assert!(per_round.len() < 20, "the rounds do not converge");
        }
    }

    // Proves read-ahead on a real file with the cache off: a restartable `load` of a hash of
    // ~500 leaves wants the directory pages in its first round, then up to
    // READAHEAD_READS_MAX leaves per round, every page exactly once, never a synchronous
    // read; `lookup_many` of 3 names wants only their directory pages, then their leaves;
    // `pick` and a list-less `LeafWalk::to_end` walk likewise converge in a few rounds.
    #[test]
    fn read_ahead_asks_a_level_per_round() {
        use crate::storage::prefetch::{READAHEAD_BYTES_MAX, READAHEAD_READS_MAX};
        let dir = std::env::temp_dir().join(format!("lavik-readahead-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data");
        let cfg = StoreConfig {
            data_files: vec![path.clone()],
            create_size_bytes: 64 << 20,
            shard_count: 1,
            block_size_bytes: 1 << 20,
            staging_limit_bytes: 1 << 20,
            fsync: FsyncPolicy::No,
            direct_io: false,
            defrag_paused: true,
            cache_capacity_bytes: 0,
            ..StoreConfig::default()
        };
        let mut s = crate::storage::open(&cfg).unwrap().shards.pop().unwrap();
        let pad = "v".repeat(190);
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..18_000u32)
            .map(|i| {
                (
                    format!("f{i}").into_bytes(),
                    format!("{i}{pad}").into_bytes(),
                )
            })
            .collect();
        let enc = HashEncoding::Hashtable as u8;
        build(&mut s, 0, b"h", ValueKind::Hash, enc, &pairs, None, 0).unwrap();
        s.shutdown(true).unwrap();
        // Reopened: every page on the file, none in a staging buffer.
        let mut s = crate::storage::open(&cfg).unwrap().shards.pop().unwrap();
        let Some(Collection::Paged { root, .. }) = s.get_collection(0, b"h", 0).unwrap() else {
            panic!("not paged");
        };
        let root = Root::decode(&root).unwrap();
        let pages = pages_of(&mut s, 0, b"h", &root).unwrap();
        let (dirs, leaves) = (root.dirs.len(), pages.len() - root.dirs.len());
        assert!(
            dirs >= 2 && leaves > 2 * READAHEAD_READS_MAX,
            "{dirs} dirs, {leaves} leaves"
        );
        let sync0 = s.cache_stats().sync_reads;

        let ((got, _), per_round) = rounds(&mut s, &path, |s| {
            load::<(Vec<u8>, Vec<u8>)>(s, 0, b"h", &root, true)
        });
        assert_eq!(got.len(), pairs.len());
        assert_eq!(per_round[0], dirs, "round 1: the directory pages");
        assert_eq!(
            per_round.iter().sum::<usize>(),
            pages.len(),
            "every page once"
        );
        assert!(per_round.iter().all(|&n| n <= READAHEAD_READS_MAX));
        let leaf_bytes: usize = pages[..].iter().map(|p| p.1 as usize).sum();
        let per_round_min = READAHEAD_READS_MAX.min(READAHEAD_BYTES_MAX * leaves / leaf_bytes);
        assert!(
            per_round.len() <= 2 + leaves / (per_round_min - 1),
            "{per_round:?} for {leaves} leaves"
        );

        let names: [&[u8]; 3] = [b"f3", b"f7000", b"nope"];
        let (found, per_round) = rounds(&mut s, &path, |s| {
            lookup_many(s, 0, b"h", &root, &names, true, &mut Default::default())
        });
        assert_eq!(found[0].as_deref(), Some(format!("3{pad}").as_bytes()));
        assert_eq!(found[1].as_deref(), Some(format!("7000{pad}").as_bytes()));
        assert_eq!(found[2], None);
        assert_eq!(
            per_round.len(),
            2,
            "directory pages, then leaves: {per_round:?}"
        );
        assert!(per_round.iter().all(|&n| n <= 3), "{per_round:?}");

        let ranks: Vec<u64> = (0..40).map(|i| i * 373).collect();
        let (picked, per_round) = rounds(&mut s, &path, |s| {
            pick::<(Vec<u8>, Vec<u8>)>(s, 0, b"h", &root, &ranks, true)
        });
        assert_eq!(picked.len(), ranks.len());
        assert_eq!(per_round.len(), 2, "{per_round:?}");

        let (walked, per_round) = rounds(&mut s, &path, |s| {
            let mut walk = LeafWalk::to_end();
            let mut n = 0;
            while let Some(leaf) = walk.next::<(Vec<u8>, Vec<u8>)>(s, 0, b"h", &root, true)? {
                n += leaf.len();
            }
            Ok(n)
        });
        assert_eq!(walked, pairs.len());
        assert_eq!(
            per_round.iter().sum::<usize>(),
            pages.len(),
            "every page once"
        );
        assert!(
            per_round.len() <= 2 + leaves / (per_round_min - 1),
            "{per_round:?}"
        );

        assert_eq!(
            s.cache_stats().sync_reads,
            sync0,
            "nothing read synchronously"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    // The tests above with every paged root stored as version 2 (section 3a).
    #[test]
    fn hash_model_through_crashes_v2() {
        with_v2_roots(hash_model_through_crashes);
    }

    #[test]
    fn set_update_writes_few_pages_and_delete_releases_v2() {
        with_v2_roots(set_update_writes_few_pages_and_delete_releases);
    }

    #[test]
    fn crash_keeping_later_chunks_falls_back_to_a_complete_root_v2() {
        with_v2_roots(crash_keeping_later_chunks_falls_back_to_a_complete_root);
    }

    #[test]
    fn defrag_relocates_pages_v2() {
        with_v2_roots(defrag_relocates_pages);
    }

    #[test]
    fn defrag_reads_one_directory_page_per_leaf_v2() {
        with_v2_roots(defrag_reads_one_directory_page_per_leaf);
    }

    #[test]
    fn shrink_with_spread_removals_merges_without_loss_v2() {
        with_v2_roots(shrink_with_spread_removals_merges_without_loss);
    }

    #[test]
    fn delete_releases_pages_in_the_background_v2() {
        with_v2_roots(delete_releases_pages_in_the_background);
    }
}
