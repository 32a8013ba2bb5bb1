//! Paged lists (`docs/collections.md` section 4a): a big list on the same two-level tree as
//! paged hashes and sets (`paged.rs`: a PAGED root listing directory pages, each listing
//! leaves, all of them type-7 page records), where each leaf is exactly one of Redis's
//! quicklist nodes and list order is leaf order, then order inside the leaf.
//!
//! The root and directory pages use `paged.rs`'s encoding unchanged, so recovery's root
//! validation, `release`, `pages_of`, defrag's `relocate_page` and the checkpoint treat a
//! list's pages as any other. An entry's `first` is the leaf's *sequence position*
//! (ascending in list order; the root's first entry is 0); elements carry no position:
//! rank → leaf is a walk of the counts in the root and in one directory page.
//!
//! A [`PagedList`] holds the root's and every directory page's entries and loads leaves on
//! demand, so a push or pop reads and rewrites one end leaf, its directory page and the
//! root; LINDEX/LSET/LRANGE read the leaves their indexes fall in.
//!
//! Invariants (checked when read): no leaf and no directory page is empty; counts add up
//! from leaves to directory pages to the root; leaf positions strictly ascend.

use super::list_codec::{
    listpack_entry_bytes, node_allows, End, ListValue, LISTPACK_OVERHEAD_BYTES,
};
use super::paged::{self, Entry, Root, DIR_MAX_ENTRIES};
use super::shard::Shard;
use super::{Db, StorageError, ValueKind};
use std::collections::VecDeque;

/// Page kind byte of a list leaf (hash/set leaves are 1, directory pages 2).
pub const PAGE_LIST_LEAF: u8 = 3;
/// The root's encoding byte: `list_codec`'s quicklist tag.
pub const QUICKLIST_ENCODING: u8 = 1;
/// Position gap between neighbouring leaves.
const STEP: u64 = 1 << 20;
/// Position of a new tree's first leaf (mid-range: head pushes go below it).
const START: u64 = 1 << 62;

fn corrupt(what: &str) -> StorageError {
    StorageError::Corrupt(format!("paged list: {what}"))
}

fn encode_leaf<'a>(elems: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![PAGE_LIST_LEAF];
    paged::put_varint(&mut out, elems.len() as u64);
    for e in elems {
        paged::put_varint(&mut out, e.len() as u64);
        out.extend_from_slice(e);
    }
    out
}

fn varint(b: &[u8], at: &mut usize) -> Result<usize, StorageError> {
    let mut v: u64 = 0;
    for i in 0..5 {
        let byte = *b.get(*at).ok_or_else(|| corrupt("truncated leaf"))?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return usize::try_from(v).map_err(|_| corrupt("varint"));
        }
    }
    Err(corrupt("varint too long"))
}

fn decode_leaf(b: &[u8]) -> Result<VecDeque<Vec<u8>>, StorageError> {
    if b.first() != Some(&PAGE_LIST_LEAF) {
        return Err(corrupt("not a list leaf"));
    }
    let mut at = 1;
    let n = varint(b, &mut at)?;
    if n == 0 || n > b.len() {
        return Err(corrupt("bad leaf count"));
    }
    let mut out = VecDeque::with_capacity(n);
    for _ in 0..n {
        let len = varint(b, &mut at)?;
        let end = at
            .checked_add(len)
            .filter(|&e| e <= b.len())
            .ok_or_else(|| corrupt("truncated leaf"))?;
        out.push_back(b[at..end].to_vec());
        at = end;
    }
    if at != b.len() {
        return Err(corrupt("trailing bytes in a leaf"));
    }
    Ok(out)
}

/// Payload bytes of a leaf holding `elems`.
fn leaf_payload_len<'a>(elems: impl ExactSizeIterator<Item = &'a Vec<u8>>) -> usize {
    let n = elems.len();
    1 + varint_len(n) + elems.map(|e| varint_len(e.len()) + e.len()).sum::<usize>()
}

fn varint_len(n: usize) -> usize {
    let mut v = n as u64;
    let mut l = 1;
    while v >= 0x80 {
        v >>= 7;
        l += 1;
    }
    l
}

struct Leaf {
    first: u64,
    /// 0 for a leaf not written yet.
    addr: u64,
    len: u32,
    count: u32,
    elems: Option<VecDeque<Vec<u8>>>,
    /// Redis's `lpBytes` of this node (known once loaded).
    lp_bytes: usize,
    dirty: bool,
}

struct Dir {
    /// 0 for a directory page not written yet.
    addr: u64,
    len: u32,
    leaves: Vec<Leaf>,
    dirty: bool,
}

impl Dir {
    fn count(&self) -> u64 {
        self.leaves.iter().map(|l| u64::from(l.count)).sum()
    }
}

/// A paged list being read or updated (see the module comment).
pub struct PagedList {
    db: Db,
    key: Vec<u8>,
    count: u64,
    dirs: Vec<Dir>,
    /// Pages replaced or dropped: they stop counting once the new root is written.
    dead: Vec<(u64, u32)>,
    renumber: bool,
}

impl PagedList {
    /// Reads the directory pages under `root` (of `db`/`key`); leaves are read on demand.
    pub fn open(
        shard: &mut Shard,
        db: Db,
        key: &[u8],
        root: &Root,
    ) -> Result<PagedList, StorageError> {
        let mut dirs = Vec::with_capacity(root.dirs.len());
        let mut prev: Option<u64> = None;
        for d in &root.dirs {
            let rec = paged::read_page(shard, db, key, d.addr)?;
            let entries = paged::decode_dir(&rec.value)?;
            if entries.iter().map(|e| u64::from(e.count)).sum::<u64>() != u64::from(d.count)
                || prev.is_some_and(|p| p >= entries[0].first)
            {
                return Err(corrupt("directory page disagrees with the root"));
            }
            prev = entries.last().map(|e| e.first);
            dirs.push(Dir {
                addr: d.addr,
                len: d.len,
                leaves: entries
                    .iter()
                    .map(|e| Leaf {
                        first: e.first,
                        addr: e.addr,
                        len: e.len,
                        count: e.count,
                        elems: None,
                        lp_bytes: 0,
                        dirty: false,
                    })
                    .collect(),
                dirty: false,
            });
        }
        Ok(PagedList {
            db,
            key: key.to_vec(),
            count: root.count,
            dirs,
            dead: Vec::new(),
            renumber: false,
        })
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Number of leaves (quicklist nodes).
    pub fn leaf_count(&self) -> usize {
        self.dirs.iter().map(|d| d.leaves.len()).sum()
    }

    /// Leaf payload bytes (what the root's byte count says once stored).
    pub fn payload_bytes(&self) -> usize {
        self.dirs
            .iter()
            .flat_map(|d| d.leaves.iter())
            .map(|l| match (&l.elems, l.dirty) {
                (Some(e), true) => leaf_payload_len(e.iter()),
                _ => l.len as usize,
            })
            .sum()
    }

    fn load_leaf(&mut self, shard: &mut Shard, di: usize, li: usize) -> Result<(), StorageError> {
        let leaf = &mut self.dirs[di].leaves[li];
        if leaf.elems.is_some() {
            return Ok(());
        }
        let rec = paged::read_page(shard, self.db, &self.key, leaf.addr)?;
        let elems = decode_leaf(&rec.value)?;
        if elems.len() != leaf.count as usize {
            return Err(corrupt("leaf count disagrees with its directory"));
        }
        leaf.lp_bytes =
            LISTPACK_OVERHEAD_BYTES + elems.iter().map(|e| listpack_entry_bytes(e)).sum::<usize>();
        leaf.elems = Some(elems);
        Ok(())
    }

    /// (directory, leaf, offset in the leaf) of element `i` (< len), by counts only.
    fn locate(&self, mut i: u64) -> (usize, usize, usize) {
        for (di, d) in self.dirs.iter().enumerate() {
            let c = d.count();
            if i >= c {
                i -= c;
                continue;
            }
            for (li, l) in d.leaves.iter().enumerate() {
                if i < u64::from(l.count) {
                    return (di, li, i as usize);
                }
                i -= u64::from(l.count);
            }
        }
        unreachable!("index below the list length")
    }

    fn end_leaf(&self, end: End) -> (usize, usize) {
        match end {
            End::Head => (0, 0),
            End::Tail => {
                let di = self.dirs.len() - 1;
                (di, self.dirs[di].leaves.len() - 1)
            }
        }
    }

    /// Element `i` (< len), reading only its leaf.
    pub fn get(&mut self, shard: &mut Shard, i: usize) -> Result<Vec<u8>, StorageError> {
        let (di, li, off) = self.locate(i as u64);
        self.load_leaf(shard, di, li)?;
        Ok(self.dirs[di].leaves[li].elems.as_ref().expect("loaded")[off].clone())
    }

    /// Replaces element `i` (< len) in its leaf (in place, as `ListValue::set`).
    pub fn set(&mut self, shard: &mut Shard, i: usize, e: &[u8]) -> Result<(), StorageError> {
        let (di, li, off) = self.locate(i as u64);
        self.load_leaf(shard, di, li)?;
        let leaf = &mut self.dirs[di].leaves[li];
        let elems = leaf.elems.as_mut().expect("loaded");
        let old = std::mem::replace(&mut elems[off], e.to_vec());
        leaf.lp_bytes = leaf.lp_bytes - listpack_entry_bytes(&old) + listpack_entry_bytes(e);
        leaf.dirty = true;
        self.dirs[di].dirty = true;
        Ok(())
    }

    /// Elements `from..=to` (in range), reading only the leaves they lie in.
    pub fn range(
        &mut self,
        shard: &mut Shard,
        from: usize,
        to: usize,
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        let mut out = Vec::with_capacity(to - from + 1);
        let (mut di, mut li, mut off) = self.locate(from as u64);
        while out.len() < to - from + 1 {
            self.load_leaf(shard, di, li)?;
            let elems = self.dirs[di].leaves[li].elems.as_ref().expect("loaded");
            let want = to - from + 1 - out.len();
            out.extend(elems.iter().skip(off).take(want).cloned());
            off = 0;
            li += 1;
            if li == self.dirs[di].leaves.len() {
                di += 1;
                li = 0;
            }
        }
        Ok(out)
    }

    /// Adds `e` at `end` as Redis's quicklist push does: into the end node (leaf) when its
    /// insert estimate allows, else into a new node.
    pub fn push(&mut self, shard: &mut Shard, end: End, e: &[u8]) -> Result<(), StorageError> {
        if self.dirs.is_empty() {
            // Every element was popped by this command (LMOVE on one key): start over.
            self.dirs.push(Dir {
                addr: 0,
                len: 0,
                leaves: vec![Leaf {
                    first: START,
                    addr: 0,
                    len: 0,
                    count: 1,
                    elems: Some(VecDeque::from([e.to_vec()])),
                    lp_bytes: LISTPACK_OVERHEAD_BYTES + listpack_entry_bytes(e),
                    dirty: true,
                }],
                dirty: true,
            });
            self.count += 1;
            return Ok(());
        }
        let (di, li) = self.end_leaf(end);
        self.load_leaf(shard, di, li)?;
        let dir = &mut self.dirs[di];
        dir.dirty = true;
        self.count += 1;
        let leaf = &mut dir.leaves[li];
        if node_allows(leaf.lp_bytes, e.len()) {
            let elems = leaf.elems.as_mut().expect("loaded");
            match end {
                End::Head => elems.push_front(e.to_vec()),
                End::Tail => elems.push_back(e.to_vec()),
            }
            leaf.count += 1;
            leaf.lp_bytes += listpack_entry_bytes(e);
            leaf.dirty = true;
            return Ok(());
        }
        let first = match end {
            End::Head => leaf.first.checked_sub(STEP).filter(|&f| f >= STEP),
            End::Tail => leaf.first.checked_add(STEP).filter(|&f| f < 1 << 63),
        };
        if first.is_none() {
            self.renumber = true;
        }
        let new = Leaf {
            first: first.unwrap_or(leaf.first),
            addr: 0,
            len: 0,
            count: 1,
            elems: Some(VecDeque::from([e.to_vec()])),
            lp_bytes: LISTPACK_OVERHEAD_BYTES + listpack_entry_bytes(e),
            dirty: true,
        };
        match end {
            End::Head => dir.leaves.insert(0, new),
            End::Tail => dir.leaves.push(new),
        }
        Ok(())
    }

    fn drop_leaf(&mut self, di: usize, li: usize) {
        let leaf = self.dirs[di].leaves.remove(li);
        if leaf.addr != 0 {
            self.dead.push((leaf.addr, leaf.len));
        }
        self.dirs[di].dirty = true;
        if self.dirs[di].leaves.is_empty() {
            let dir = self.dirs.remove(di);
            if dir.addr != 0 {
                self.dead.push((dir.addr, dir.len));
            }
        }
    }

    /// Removes the element at `end` (its node is dropped when emptied).
    pub fn pop(&mut self, shard: &mut Shard, end: End) -> Result<Option<Vec<u8>>, StorageError> {
        if self.count == 0 {
            return Ok(None);
        }
        let (di, li) = self.end_leaf(end);
        self.load_leaf(shard, di, li)?;
        let leaf = &mut self.dirs[di].leaves[li];
        let elems = leaf.elems.as_mut().expect("loaded");
        let e = match end {
            End::Head => elems.pop_front(),
            End::Tail => elems.pop_back(),
        }
        .ok_or_else(|| corrupt("empty leaf"))?;
        leaf.count -= 1;
        leaf.lp_bytes -= listpack_entry_bytes(&e);
        leaf.dirty = true;
        self.count -= 1;
        if leaf.count == 0 {
            self.drop_leaf(di, li);
        } else {
            self.dirs[di].dirty = true;
        }
        Ok(Some(e))
    }

    /// Removes `n` (≤ len) elements at `end` without returning them: whole leaves are
    /// dropped unread, the boundary leaf is read and cut.
    fn discard(&mut self, shard: &mut Shard, end: End, mut n: u64) -> Result<(), StorageError> {
        while n > 0 {
            let (di, li) = self.end_leaf(end);
            let c = u64::from(self.dirs[di].leaves[li].count);
            if c <= n {
                self.drop_leaf(di, li);
                self.count -= c;
                n -= c;
                continue;
            }
            for _ in 0..n {
                self.pop(shard, end)?;
            }
            n = 0;
        }
        Ok(())
    }

    /// LTRIM: keeps elements `start..=end` (in range, start <= end).
    pub fn trim(
        &mut self,
        shard: &mut Shard,
        start: usize,
        end: usize,
    ) -> Result<(), StorageError> {
        let tail = self.count - 1 - end as u64;
        self.discard(shard, End::Tail, tail)?;
        self.discard(shard, End::Head, start as u64)
    }

    /// Every leaf's elements, head to tail (reads every leaf).
    pub fn nodes(&mut self, shard: &mut Shard) -> Result<Vec<Vec<Vec<u8>>>, StorageError> {
        let mut out = Vec::with_capacity(self.leaf_count());
        for di in 0..self.dirs.len() {
            for li in 0..self.dirs[di].leaves.len() {
                self.load_leaf(shard, di, li)?;
                let elems = self.dirs[di].leaves[li].elems.as_ref().expect("loaded");
                out.push(elems.iter().cloned().collect());
            }
        }
        Ok(out)
    }

    /// The whole list as a one-record value (quicklist with one node per leaf).
    pub fn to_value(&mut self, shard: &mut Shard) -> Result<ListValue, StorageError> {
        Ok(ListValue::from_paged_nodes(self.nodes(shard)?))
    }

    /// Writes what changed (non-empty list; the key's current root is the one this was
    /// opened from): dirty leaves, the directory pages holding them (split past
    /// `DIR_MAX_ENTRIES`), then the root.
    pub fn store(
        mut self,
        shard: &mut Shard,
        expire: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        if self.count == 0 || self.dirs.is_empty() {
            return Err(corrupt("store of an empty list"));
        }
        if self.renumber {
            // Only directory entries carry positions: no leaf is rewritten.
            let mut p = START;
            for d in self.dirs.iter_mut() {
                d.dirty = true;
                for l in d.leaves.iter_mut() {
                    l.first = p;
                    p += STEP;
                }
            }
        }
        let (db, kind) = (self.db, ValueKind::List);
        let key = std::mem::take(&mut self.key);
        let seq = shard.reserve_seq();
        let mut root_dirs: Vec<Entry> = Vec::with_capacity(self.dirs.len() + 1);
        let mut bytes = 0u64;
        for d in self.dirs.iter_mut() {
            if !d.dirty {
                bytes += d.leaves.iter().map(|l| u64::from(l.len)).sum::<u64>();
                root_dirs.push(Entry {
                    first: d.leaves[0].first,
                    addr: d.addr,
                    len: d.len,
                    count: d.count() as u32,
                });
                continue;
            }
            let mut entries = Vec::with_capacity(d.leaves.len());
            for l in d.leaves.iter_mut() {
                if l.dirty {
                    let elems = l.elems.as_ref().expect("a dirty leaf is loaded");
                    let payload = encode_leaf(elems.iter().map(|e| e.as_slice()));
                    if l.addr != 0 {
                        self.dead.push((l.addr, l.len));
                    }
                    l.addr = shard.append_page(db, &key, kind, &payload, seq)?.0;
                    l.len = payload.len() as u32;
                    l.dirty = false;
                }
                bytes += u64::from(l.len);
                entries.push(Entry {
                    first: l.first,
                    addr: l.addr,
                    len: l.len,
                    count: l.count,
                });
            }
            if d.addr != 0 {
                self.dead.push((d.addr, d.len));
            }
            let pieces = entries.len().div_ceil(DIR_MAX_ENTRIES);
            let per = entries.len().div_ceil(pieces);
            for chunk in entries.chunks(per) {
                let payload = paged::encode_dir(chunk);
                let addr = shard.append_page(db, &key, kind, &payload, seq)?;
                root_dirs.push(Entry {
                    first: chunk[0].first,
                    addr: addr.0,
                    len: payload.len() as u32,
                    count: chunk.iter().map(|e| e.count).sum(),
                });
            }
        }
        root_dirs[0].first = 0;
        let root = Root {
            encoding: QUICKLIST_ENCODING,
            count: self.count,
            bytes,
            dirs: root_dirs,
        };
        for (addr, len) in std::mem::take(&mut self.dead) {
            shard.unaccount_page(db, super::index::Address(addr), key.len(), len);
        }
        shard.put_paged_root(db, &key, kind, &root.encode(), expire, now_ms, seq, true)
    }
}

/// Writes `nodes` (non-empty quicklist nodes, at least one) as a fresh paged list under
/// `key`, one leaf per node, replacing whatever the key held (an old paged root's pages are
/// released).
pub fn build(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    nodes: &[Vec<&[u8]>],
    expire: Option<u64>,
    now_ms: u64,
) -> Result<(), StorageError> {
    let kind = ValueKind::List;
    let seq = shard.reserve_seq();
    let mut leaves = Vec::with_capacity(nodes.len());
    let mut bytes = 0u64;
    let mut count = 0u64;
    for (i, n) in nodes.iter().enumerate() {
        if n.is_empty() {
            return Err(corrupt("empty node"));
        }
        let payload = encode_leaf(n.iter().copied());
        let addr = shard.append_page(db, key, kind, &payload, seq)?;
        bytes += payload.len() as u64;
        count += n.len() as u64;
        leaves.push(Entry {
            first: START + i as u64 * STEP,
            addr: addr.0,
            len: payload.len() as u32,
            count: n.len() as u32,
        });
    }
    if leaves.is_empty() {
        return Err(corrupt("build of an empty list"));
    }
    let mut dirs = Vec::new();
    for chunk in leaves.chunks(DIR_MAX_ENTRIES * 3 / 4) {
        let payload = paged::encode_dir(chunk);
        let addr = shard.append_page(db, key, kind, &payload, seq)?;
        dirs.push(Entry {
            first: chunk[0].first,
            addr: addr.0,
            len: payload.len() as u32,
            count: chunk.iter().map(|e| e.count).sum(),
        });
    }
    dirs[0].first = 0;
    let root = Root {
        encoding: QUICKLIST_ENCODING,
        count,
        bytes,
        dirs,
    };
    shard.put_paged_root(db, key, kind, &root.encode(), expire, now_ms, seq, false)
}

/// The one-record bytes (`list_codec`, quicklist with one node per leaf) of the paged list
/// under `root`, for generic readers (RENAME, COPY, MOVE, DUMP, OBJECT, SORT).
pub(crate) fn materialize(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    root: &Root,
) -> Result<Vec<u8>, StorageError> {
    let mut l = PagedList::open(shard, db, key, root)?;
    Ok(l.to_value(shard)?.encode())
}

/// A list as a command sees it: one record, or a paged list.
pub enum ListHandle {
    Whole(ListValue),
    Paged(PagedList),
}

impl ListHandle {
    pub fn len(&self) -> usize {
        match self {
            ListHandle::Whole(l) => l.len(),
            ListHandle::Paged(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pushes `elements` one by one at `end`, with the one-record value's growing check
    /// first (a paged list is a quicklist already).
    pub fn push_all(
        &mut self,
        shard: &mut Shard,
        end: End,
        elements: &[&[u8]],
    ) -> Result<(), StorageError> {
        match self {
            ListHandle::Whole(l) => {
                l.prepare_grow(elements.iter().map(|e| e.len()).sum());
                for e in elements {
                    l.push(end, e);
                }
            }
            ListHandle::Paged(p) => {
                for e in elements {
                    p.push(shard, end, e)?;
                }
            }
        }
        Ok(())
    }

    pub fn pop(&mut self, shard: &mut Shard, end: End) -> Result<Option<Vec<u8>>, StorageError> {
        match self {
            ListHandle::Whole(l) => Ok(l.pop(end)),
            ListHandle::Paged(p) => p.pop(shard, end),
        }
    }

    /// Redis's shrinking check. For a paged list it is applied when the list is stored
    /// (`Demote`): with more than one node it never converts.
    pub fn after_shrink(&mut self) {
        if let ListHandle::Whole(l) = self {
            l.after_shrink();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{BlockDevice, MemDevice};
    use crate::storage::list_codec::ListEncoding;
    use crate::storage::{open_on, Collection, FsyncPolicy, StoreConfig};
    use std::sync::Arc;

    fn open(dev: &Arc<MemDevice>, block: u32) -> Shard {
        let cfg = StoreConfig {
            block_size_bytes: block,
            fsync: FsyncPolicy::Always,
            shard_count: 1,
            staging_limit_bytes: u64::from(block),
            ..StoreConfig::default()
        };
        open_on(vec![dev.clone() as Arc<dyn BlockDevice>], &cfg)
            .expect("open")
            .shards
            .pop()
            .expect("one shard")
    }

    /// The command layer's load: a one-record value or a paged list.
    fn load(s: &mut Shard) -> Option<ListHandle> {
        match s.get_collection(0, b"l", 0).unwrap()? {
            Collection::Whole(v) => Some(ListHandle::Whole(ListValue::decode(&v.bytes).unwrap())),
            Collection::Paged { root, .. } => {
                let root = Root::decode(&root).unwrap();
                Some(ListHandle::Paged(
                    PagedList::open(s, 0, b"l", &root).unwrap(),
                ))
            }
        }
    }

    /// The command layer's store (`commands::collection::store_list_handle`).
    fn store(s: &mut Shard, mut l: ListHandle, shrinking: bool) {
        if let ListHandle::Paged(p) = &mut l {
            if !p.is_empty() && (p.leaf_count() <= 1 || p.payload_bytes() < paged::DEMOTE_BYTES) {
                let mut v = p.to_value(s).unwrap();
                v.forget_paged_origin();
                l = ListHandle::Whole(v);
            }
        }
        if shrinking {
            l.after_shrink();
        }
        match l {
            ListHandle::Paged(p) if p.is_empty() => {
                s.delete(0, b"l", 0).unwrap();
            }
            ListHandle::Paged(p) => p.store(s, None, 0).unwrap(),
            ListHandle::Whole(v) if v.is_empty() => {
                s.delete(0, b"l", 0).unwrap();
            }
            ListHandle::Whole(v) => {
                let big = v.listpack_bytes() > paged::PROMOTE_BYTES;
                if v.encoding() == ListEncoding::Quicklist && v.node_count() >= 2 && big {
                    build(s, 0, b"l", &v.node_elements(), None, 0).unwrap();
                } else {
                    s.put(0, b"l", ValueKind::List, &v.encode(), None, 0)
                        .unwrap();
                }
            }
        }
    }

    /// The list as stored, read whole (`Shard::get` materializes a paged list), with its
    /// node counts.
    fn contents(s: &mut Shard) -> Option<ListValue> {
        s.get(0, b"l", 0)
            .unwrap()
            .map(|v| ListValue::decode(&v.bytes).unwrap())
    }

    fn is_paged(s: &mut Shard) -> bool {
        matches!(
            s.get_collection(0, b"l", 0).unwrap(),
            Some(Collection::Paged { .. })
        )
    }

    /// Live bytes the shard counts equal what the index and the root reach.
    fn check_live(s: &mut Shard) {
        // Released roots' pages stop counting in the background: finish that first.
        paged::release_all(s);
        let mut want = 0u64;
        let h = s.hash(0, b"l");
        if let Some(f) = s.find(0, b"l", h).unwrap() {
            want += f.rec.header.record_len() as u64;
            if paged::is_root(f.rec.header.flags) {
                let root = Root::decode(&f.rec.value).unwrap();
                for (_, len) in paged::pages_of(s, 0, b"l", &root).unwrap() {
                    want += super::super::format::record_len(1, len as usize) as u64;
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

    // A list driven by random pushes and pops at both ends, LSETs and LTRIMs through the
    // paged path equals a one-record model of the same operations (elements and Redis's
    // quicklist node counts) after every batch, is paged while big and one record once
    // small, keeps exact live-byte accounting, and survives crashes, defrag and a reopen.
    #[test]
    fn list_model_through_crashes_and_defrag() {
        let dev = Arc::new(MemDevice::new("t", 64 << 20));
        let mut s = open(&dev, 256 * 1024);
        let mut model = ListValue::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut was_paged = false;
        for round in 0..24u64 {
            // Grow for 12 rounds, then shrink.
            let grow = round < 12;
            for _ in 0..40 {
                let r = next();
                let end = if r % 2 == 0 { End::Head } else { End::Tail };
                let mut l = load(&mut s).unwrap_or(ListHandle::Whole(ListValue::new()));
                let shrinking = match (r >> 8) % 10 {
                    0..=5 if grow => {
                        let items: Vec<Vec<u8>> = (0..1 + (r >> 16) % 40)
                            .map(|i| {
                                format!("e{}-{i}-{}", r % 977, "y".repeat((r >> 20) as usize % 30))
                                    .into_bytes()
                            })
                            .collect();
                        let refs: Vec<&[u8]> = items.iter().map(|e| e.as_slice()).collect();
                        model.prepare_grow(refs.iter().map(|e| e.len()).sum());
                        for e in &refs {
                            model.push(end, e);
                        }
                        l.push_all(&mut s, end, &refs).unwrap();
                        false
                    }
                    6 if !model.is_empty() => {
                        let i = (r >> 16) as usize % model.len();
                        let e = format!("set{round}").into_bytes();
                        model.set(i, &e);
                        match &mut l {
                            ListHandle::Whole(v) => v.set(i, &e),
                            ListHandle::Paged(p) => p.set(&mut s, i, &e).unwrap(),
                        }
                        true
                    }
                    7 if !model.is_empty() && model.len() > 50 => {
                        let (a, b) = (
                            ((r >> 16) % 20) as usize,
                            model.len() - 1 - ((r >> 24) % 20) as usize,
                        );
                        model.trim(Some((a, b)));
                        match &mut l {
                            ListHandle::Whole(v) => v.trim(Some((a, b))),
                            ListHandle::Paged(p) => p.trim(&mut s, a, b).unwrap(),
                        }
                        true
                    }
                    _ => {
                        let n = 1 + (r >> 16) as usize % if grow { 10 } else { 120 };
                        for _ in 0..n {
                            assert_eq!(l.pop(&mut s, end).unwrap(), model.pop(end));
                        }
                        true
                    }
                };
                if shrinking {
                    model.after_shrink();
                }
                store(&mut s, l, shrinking);
                was_paged |= is_paged(&mut s);
            }
            let back = contents(&mut s).unwrap_or_default();
            assert_eq!(back.node_elements(), model.node_elements(), "round {round}");
            assert_eq!(back.encoding(), model.encoding(), "round {round}");
            check_live(&mut s);
            if round % 4 == 3 {
                for t in 0..60 {
                    s.background(1000 * round + t, 100_000).unwrap();
                }
                s.flush().unwrap();
                drop(s);
                dev.crash(None);
                s = open(&dev, 256 * 1024);
                let back = contents(&mut s).unwrap_or_default();
                assert_eq!(
                    back.node_elements(),
                    model.node_elements(),
                    "after crash {round}"
                );
                check_live(&mut s);
            }
        }
        assert!(was_paged, "the list was paged at some point");
        s.shutdown(true).unwrap();
        let mut s = open(&dev, 256 * 1024);
        let back = contents(&mut s).unwrap_or_default();
        assert_eq!(back.node_elements(), model.node_elements());
    }

    // Leaves read back as written (quartet: round trip), and a torn or foreign payload is
    // refused.
    #[test]
    fn leaf_round_trip_and_refusals() {
        let elems: Vec<&[u8]> = vec![b"a", b"", b"12345", &[0u8; 300]];
        let b = encode_leaf(elems.iter().copied());
        let back = decode_leaf(&b).unwrap();
        assert_eq!(back.iter().map(|e| e.as_slice()).collect::<Vec<_>>(), elems);
        assert_eq!(leaf_payload_len(back.iter()), b.len());
        for n in 0..b.len() {
            assert!(decode_leaf(&b[..n]).is_err(), "prefix {n}");
        }
        let mut other = b.clone();
        other[0] = 1;
        assert!(decode_leaf(&other).is_err());
    }
}
