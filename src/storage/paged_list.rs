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

/// Directory page bytes: a kind byte and a u32 entry count, then 24 bytes per entry
/// (`paged::encode_dir`).
const DIR_HEADER_BYTES: usize = 5;
const DIR_ENTRY_BYTES: usize = 24;
/// Neighbouring directory pages, one of them rewritten, are merged when together they hold
/// at most this many leaves (section 4's rule: a split makes halves of 128).
const DIR_MERGE_ENTRIES: usize = DIR_MAX_ENTRIES / 4;

/// Leaves listed by a directory page of `len` payload bytes (known from the root alone).
fn dir_entries(len: u32) -> usize {
    (len as usize).saturating_sub(DIR_HEADER_BYTES) / DIR_ENTRY_BYTES
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

impl Leaf {
    /// A leaf not written yet holding `elems` (non-empty).
    fn fresh(first: u64, elems: VecDeque<Vec<u8>>) -> Leaf {
        let lp_bytes =
            LISTPACK_OVERHEAD_BYTES + elems.iter().map(|e| listpack_entry_bytes(e)).sum::<usize>();
        Leaf {
            first,
            addr: 0,
            len: 0,
            count: elems.len() as u32,
            elems: Some(elems),
            lp_bytes,
            dirty: true,
        }
    }

    fn elems(&self) -> &VecDeque<Vec<u8>> {
        self.elems.as_ref().expect("leaf loaded")
    }

    /// Payload bytes once stored.
    fn payload_len(&self) -> usize {
        match (&self.elems, self.dirty) {
            (Some(e), true) => leaf_payload_len(e.iter()),
            _ => self.len as usize,
        }
    }

    /// Forgets a clean leaf's elements (a scan keeps in memory only what it changes).
    fn unload(&mut self) {
        if !self.dirty {
            self.elems = None;
        }
    }
}

struct Dir {
    /// The root's entry for this page: its first position (0 for the list's first page;
    /// no leaf of an earlier page is at or above it), address (0 for a page not written
    /// yet), length and element count. Once `leaves` is read they decide.
    first: u64,
    addr: u64,
    len: u32,
    root_count: u64,
    /// The page's leaves, read on demand.
    leaves: Option<Vec<Leaf>>,
    dirty: bool,
}

impl Dir {
    fn count(&self) -> u64 {
        match &self.leaves {
            Some(l) => l.iter().map(|l| u64::from(l.count)).sum(),
            None => self.root_count,
        }
    }

    fn leaf_count(&self) -> usize {
        match &self.leaves {
            Some(l) => l.len(),
            None => dir_entries(self.len),
        }
    }

    /// The first position of the page: exact once read, a lower bound from the root.
    fn first(&self) -> u64 {
        match &self.leaves {
            Some(l) => l[0].first,
            None => self.first,
        }
    }

    fn leaves(&self) -> &Vec<Leaf> {
        self.leaves.as_ref().expect("directory page loaded")
    }

    fn leaves_mut(&mut self) -> &mut Vec<Leaf> {
        self.leaves.as_mut().expect("directory page loaded")
    }
}

/// A paged list being read or updated (see the module comment).
pub struct PagedList {
    db: Db,
    key: Vec<u8>,
    count: u64,
    dirs: Vec<Dir>,
    /// Leaf payload bytes of the directory pages not read (the root's total minus those
    /// of the pages read).
    other_bytes: u64,
    /// Pages replaced or dropped: they stop counting once the new root is written.
    dead: Vec<(u64, u32)>,
    renumber: bool,
    /// The key's current root record while the list is coalesced (`remember_root`): lent
    /// to the shard during `store`, whose replacement of the root looks it up, so a store
    /// at the round's end, after the command's lent records are gone, reads nothing.
    root_rec: Option<Box<super::prefetch::Fetched>>,
}

impl PagedList {
    /// The list under `root` (of `db`/`key`): reads nothing; directory pages and leaves are
    /// read on demand, found by the counts in the root.
    pub fn open(db: Db, key: &[u8], root: &Root) -> Result<PagedList, StorageError> {
        let ascending = root.dirs.windows(2).all(|w| w[0].first < w[1].first);
        if root.dirs.is_empty()
            || !ascending
            || root.dirs.iter().any(|d| d.count == 0)
            || root.dirs.iter().map(|d| u64::from(d.count)).sum::<u64>() != root.count
        {
            return Err(corrupt("root counts"));
        }
        Ok(PagedList {
            db,
            key: key.to_vec(),
            count: root.count,
            dirs: root
                .dirs
                .iter()
                .map(|d| Dir {
                    first: d.first,
                    addr: d.addr,
                    len: d.len,
                    root_count: u64::from(d.count),
                    leaves: None,
                    dirty: false,
                })
                .collect(),
            other_bytes: root.bytes,
            dead: Vec::new(),
            renumber: false,
            root_rec: None,
        })
    }

    /// Keeps a copy of the key's current root record (once; `root_rec`). Called while the
    /// command that loaded the list still holds that record, so it reads nothing there.
    pub fn remember_root(&mut self, shard: &mut Shard) -> Result<(), StorageError> {
        if self.root_rec.is_none() {
            self.root_rec = shard.current_fetched(self.db, &self.key)?.map(Box::new);
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Number of leaves (quicklist nodes), from the root for pages not read.
    pub fn leaf_count(&self) -> usize {
        self.dirs.iter().map(|d| d.leaf_count()).sum()
    }

    /// Number of directory pages.
    pub fn dir_count(&self) -> usize {
        self.dirs.len()
    }

    /// Leaf payload bytes (what the root's byte count says once stored).
    pub fn payload_bytes(&self) -> usize {
        self.other_bytes as usize
            + self
                .dirs
                .iter()
                .filter_map(|d| d.leaves.as_ref())
                .flat_map(|l| l.iter())
                .map(Leaf::payload_len)
                .sum::<usize>()
    }

    /// Reads directory page `di` (once), checking it against the root's entry.
    fn load_dir(&mut self, shard: &mut Shard, di: usize) -> Result<(), StorageError> {
        let d = &self.dirs[di];
        if d.leaves.is_some() {
            return Ok(());
        }
        let rec = paged::read_page(shard, self.db, &self.key, d.addr)?;
        self.install_dir(di, &rec.value)
    }

    /// `load_dir` through read-ahead (`paged::Ahead`): `false` when the walk missed it or
    /// only notes pages now.
    fn load_dir_ahead(
        &mut self,
        ra: &mut paged::Ahead,
        shard: &mut Shard,
        di: usize,
    ) -> Result<bool, StorageError> {
        let d = &self.dirs[di];
        if d.leaves.is_some() {
            return Ok(true);
        }
        match ra.page(shard, self.db, &self.key, d.addr, d.len, true)? {
            Some(rec) => self.install_dir(di, &rec.value).map(|()| true),
            None => Ok(false),
        }
    }

    /// Directory page `di` read as `value`: checked against the root's entry and kept.
    fn install_dir(&mut self, di: usize, value: &[u8]) -> Result<(), StorageError> {
        let d = &self.dirs[di];
        let entries = paged::decode_dir(value)?;
        let next_first = self.dirs.get(di + 1).map(Dir::first);
        let last = entries
            .last()
            .ok_or_else(|| corrupt("empty directory page"))?;
        if entries.iter().map(|e| u64::from(e.count)).sum::<u64>() != d.root_count
            || entries.len() != dir_entries(d.len)
            || entries.iter().any(|e| e.count == 0)
            || !entries.windows(2).all(|w| w[0].first < w[1].first)
            || (di > 0 && entries[0].first < d.first)
            || next_first.is_some_and(|n| last.first >= n)
        {
            return Err(corrupt("directory page disagrees with the root"));
        }
        let bytes: u64 = entries.iter().map(|e| u64::from(e.len)).sum();
        self.other_bytes = self
            .other_bytes
            .checked_sub(bytes)
            .ok_or_else(|| corrupt("root byte count"))?;
        self.dirs[di].leaves = Some(
            entries
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
        );
        Ok(())
    }

    fn load_leaf(&mut self, shard: &mut Shard, di: usize, li: usize) -> Result<(), StorageError> {
        self.load_dir(shard, di)?;
        let leaf = &mut self.dirs[di].leaves_mut()[li];
        if leaf.elems.is_some() {
            return Ok(());
        }
        let rec = paged::read_page(shard, self.db, &self.key, leaf.addr)?;
        self.install_leaf(di, li, &rec.value)
    }

    /// `load_leaf` of a leaf of a loaded directory page through read-ahead: `false` when the
    /// walk missed it or only notes pages now.
    fn load_leaf_ahead(
        &mut self,
        ra: &mut paged::Ahead,
        shard: &mut Shard,
        di: usize,
        li: usize,
    ) -> Result<bool, StorageError> {
        let leaf = &self.dirs[di].leaves()[li];
        if leaf.elems.is_some() {
            return Ok(true);
        }
        match ra.page(shard, self.db, &self.key, leaf.addr, leaf.len, false)? {
            Some(rec) => self.install_leaf(di, li, &rec.value).map(|()| true),
            None => Ok(false),
        }
    }

    /// Leaf `li` of directory page `di` read as `value`: checked and kept.
    fn install_leaf(&mut self, di: usize, li: usize, value: &[u8]) -> Result<(), StorageError> {
        let leaf = &mut self.dirs[di].leaves_mut()[li];
        let elems = decode_leaf(value)?;
        if elems.len() != leaf.count as usize {
            return Err(corrupt("leaf count disagrees with its directory"));
        }
        leaf.lp_bytes =
            LISTPACK_OVERHEAD_BYTES + elems.iter().map(|e| listpack_entry_bytes(e)).sum::<usize>();
        leaf.elems = Some(elems);
        Ok(())
    }

    /// (directory, leaf, offset in the leaf) of element `i` (< len): the directory page by
    /// the root's counts, then the leaf by that page's (reads that one page).
    fn locate(
        &mut self,
        shard: &mut Shard,
        i: usize,
    ) -> Result<(usize, usize, usize), StorageError> {
        let mut i = i as u64;
        let mut di = 0;
        loop {
            let c = self
                .dirs
                .get(di)
                .ok_or_else(|| corrupt("index past the counts"))?
                .count();
            if i < c {
                break;
            }
            i -= c;
            di += 1;
        }
        self.load_dir(shard, di)?;
        for (li, l) in self.dirs[di].leaves().iter().enumerate() {
            if i < u64::from(l.count) {
                return Ok((di, li, i as usize));
            }
            i -= u64::from(l.count);
        }
        Err(corrupt("directory count disagrees with its leaves"))
    }

    /// The leaf at `end` (reads the end directory page only).
    fn end_leaf(&mut self, shard: &mut Shard, end: End) -> Result<(usize, usize), StorageError> {
        let di = match end {
            End::Head => 0,
            End::Tail => self.dirs.len() - 1,
        };
        self.load_dir(shard, di)?;
        Ok(match end {
            End::Head => (di, 0),
            End::Tail => (di, self.dirs[di].leaves().len() - 1),
        })
    }

    /// The leaf before `(di, li)` in list order.
    fn prev_leaf(
        &mut self,
        shard: &mut Shard,
        (di, li): (usize, usize),
    ) -> Result<Option<(usize, usize)>, StorageError> {
        if li > 0 {
            return Ok(Some((di, li - 1)));
        }
        if di == 0 {
            return Ok(None);
        }
        self.load_dir(shard, di - 1)?;
        Ok(Some((di - 1, self.dirs[di - 1].leaves().len() - 1)))
    }

    /// The leaf after `(di, li)` in list order.
    fn next_leaf(
        &mut self,
        shard: &mut Shard,
        (di, li): (usize, usize),
    ) -> Result<Option<(usize, usize)>, StorageError> {
        if li + 1 < self.dirs[di].leaves().len() {
            return Ok(Some((di, li + 1)));
        }
        if di + 1 == self.dirs.len() {
            return Ok(None);
        }
        self.load_dir(shard, di + 1)?;
        Ok(Some((di + 1, 0)))
    }

    /// Element `i` (< len), reading only its directory page and leaf.
    pub fn get(&mut self, shard: &mut Shard, i: usize) -> Result<Vec<u8>, StorageError> {
        let (di, li, off) = self.locate(shard, i)?;
        self.load_leaf(shard, di, li)?;
        Ok(self.dirs[di].leaves()[li].elems()[off].clone())
    }

    /// Replaces element `i` (< len) in its leaf (in place, as `ListValue::set`).
    pub fn set(&mut self, shard: &mut Shard, i: usize, e: &[u8]) -> Result<(), StorageError> {
        let (di, li, off) = self.locate(shard, i)?;
        self.load_leaf(shard, di, li)?;
        let leaf = &mut self.dirs[di].leaves_mut()[li];
        let elems = leaf.elems.as_mut().expect("loaded");
        let old = std::mem::replace(&mut elems[off], e.to_vec());
        leaf.lp_bytes = leaf.lp_bytes - listpack_entry_bytes(&old) + listpack_entry_bytes(e);
        leaf.dirty = true;
        self.dirs[di].dirty = true;
        Ok(())
    }

    /// Elements `from..=to` (in range), reading only the directory pages and leaves they
    /// lie in. With read-ahead (`paged::Ahead`): a miss does not end the walk, every page of
    /// the range not in memory is noted first (a directory page not read covers its count
    /// from the root).
    pub fn range(
        &mut self,
        shard: &mut Shard,
        from: usize,
        to: usize,
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        let mut ra = paged::Ahead::start();
        let mut out = Vec::with_capacity(if ra.missed() { 0 } else { to - from + 1 });
        // The directory page holding `from`, by the counts, and the elements before it there.
        let (mut di, mut skip) = (0usize, from as u64);
        while di < self.dirs.len() && skip >= self.dirs[di].count() {
            skip -= self.dirs[di].count();
            di += 1;
        }
        let mut left = (to - from + 1) as u64;
        while left > 0 && di < self.dirs.len() && !ra.full() {
            if !self.load_dir_ahead(&mut ra, shard, di)? {
                left -= left.min(self.dirs[di].count() - skip);
                (skip, di) = (0, di + 1);
                continue;
            }
            for li in 0..self.dirs[di].leaves().len() {
                let c = u64::from(self.dirs[di].leaves()[li].count);
                if skip >= c {
                    skip -= c;
                    continue;
                }
                if self.load_leaf_ahead(&mut ra, shard, di, li)? && !ra.missed() {
                    let leaf = &mut self.dirs[di].leaves_mut()[li];
                    let take = left.min(c - skip) as usize;
                    out.extend(leaf.elems().iter().skip(skip as usize).take(take).cloned());
                    leaf.unload();
                }
                left -= left.min(c - skip);
                skip = 0;
                if left == 0 || ra.full() {
                    break;
                }
            }
            di += 1;
        }
        if left > 0 && !ra.missed() {
            return Err(corrupt("range past the counts"));
        }
        ra.finish(out)
    }

    /// Adds `e` at `end` as Redis's quicklist push does: into the end node (leaf) when its
    /// insert estimate allows, else into a new node.
    pub fn push(&mut self, shard: &mut Shard, end: End, e: &[u8]) -> Result<(), StorageError> {
        if self.dirs.is_empty() {
            // Every element was popped by this command (LMOVE on one key): start over.
            self.dirs.push(Dir {
                first: START,
                addr: 0,
                len: 0,
                root_count: 0,
                leaves: Some(vec![Leaf::fresh(START, VecDeque::from([e.to_vec()]))]),
                dirty: true,
            });
            self.count += 1;
            return Ok(());
        }
        let (di, li) = self.end_leaf(shard, end)?;
        self.load_leaf(shard, di, li)?;
        let dir = &mut self.dirs[di];
        dir.dirty = true;
        self.count += 1;
        let leaves = dir.leaves.as_mut().expect("loaded");
        let leaf = &mut leaves[li];
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
        let new = Leaf::fresh(first.unwrap_or(leaf.first), VecDeque::from([e.to_vec()]));
        match end {
            End::Head => leaves.insert(0, new),
            End::Tail => leaves.push(new),
        }
        Ok(())
    }

    /// Drops leaf `li` of the (read) directory page `di`, and the page when emptied.
    fn drop_leaf(&mut self, di: usize, li: usize) {
        let leaf = self.dirs[di].leaves_mut().remove(li);
        if leaf.addr != 0 {
            self.dead.push((leaf.addr, leaf.len));
        }
        self.dirs[di].dirty = true;
        if self.dirs[di].leaves().is_empty() {
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
        let (di, li) = self.end_leaf(shard, end)?;
        self.load_leaf(shard, di, li)?;
        let leaf = &mut self.dirs[di].leaves_mut()[li];
        let elems = leaf.elems.as_mut().expect("loaded");
        let e = match end {
            End::Head => elems.pop_front(),
            End::Tail => elems.pop_back(),
        }
        .ok_or_else(|| corrupt("empty leaf"))?;
        leaf.count -= 1;
        leaf.lp_bytes -= listpack_entry_bytes(&e);
        leaf.dirty = true;
        let emptied = leaf.count == 0;
        self.count -= 1;
        if emptied {
            self.drop_leaf(di, li);
        } else {
            self.dirs[di].dirty = true;
        }
        Ok(Some(e))
    }

    /// Removes `n` (≤ len) elements at `end` without returning them: whole leaves are
    /// dropped unread (their directory pages are read), the boundary leaf is read and cut.
    fn discard(&mut self, shard: &mut Shard, end: End, mut n: u64) -> Result<(), StorageError> {
        while n > 0 {
            let (di, li) = self.end_leaf(shard, end)?;
            let c = u64::from(self.dirs[di].leaves()[li].count);
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

    /// LINSERT: puts `e` before (or after, with `after`) the first element equal to
    /// `pivot`, placed in the nodes as Redis's `_quicklistInsert` does (`ListValue::insert`
    /// run on the pivot's leaf and up to two leaves either side). Reads leaves head to tail
    /// until the pivot; rewrites only the leaves whose elements changed. False (nothing
    /// changed) without the pivot.
    pub fn insert(
        &mut self,
        shard: &mut Shard,
        pivot: &[u8],
        after: bool,
        e: &[u8],
    ) -> Result<bool, StorageError> {
        let mut found = None;
        'scan: for di in 0..self.dirs.len() {
            self.load_dir(shard, di)?;
            for li in 0..self.dirs[di].leaves().len() {
                self.load_leaf(shard, di, li)?;
                let leaf = &mut self.dirs[di].leaves_mut()[li];
                if let Some(off) = leaf.elems().iter().position(|x| x == pivot) {
                    found = Some((di, li, off));
                    break 'scan;
                }
                leaf.unload();
            }
        }
        let Some((di, li, off)) = found else {
            return Ok(false);
        };
        // The window `ListValue::insert` may look at: two nodes either side of the pivot's.
        let mut window = VecDeque::from([(di, li)]);
        for _ in 0..2 {
            match self.prev_leaf(shard, window[0])? {
                Some(p) => window.push_front(p),
                None => break,
            }
        }
        for _ in 0..2 {
            match self.next_leaf(shard, window[window.len() - 1])? {
                Some(n) => window.push_back(n),
                None => break,
            }
        }
        let mut nodes = Vec::with_capacity(window.len());
        let mut local = 0;
        for &(d, l) in &window {
            self.load_leaf(shard, d, l)?;
            let elems = self.dirs[d].leaves()[l].elems();
            if (d, l) == (di, li) {
                local += off;
            } else if (d, l) < (di, li) {
                local += elems.len();
            }
            nodes.push(elems.iter().cloned().collect::<Vec<_>>());
        }
        let mut v = ListValue::from_paged_nodes(nodes);
        v.insert(local, after, e);
        let new: Vec<Vec<Vec<u8>>> = v
            .node_elements()
            .into_iter()
            .map(|n| n.into_iter().map(|x| x.to_vec()).collect())
            .collect();
        self.replace_run(shard, window[0], window.len(), di, new)?;
        self.count += 1;
        Ok(true)
    }

    /// Replaces the `w` consecutive (read) leaves from `start` by leaves holding `new`:
    /// leading and trailing leaves whose elements are unchanged stay as they are, the ones
    /// between become new leaves with positions spread between their neighbours'. A leaf
    /// more or fewer changes directory page `grow_in`'s size (then its neighbours').
    fn replace_run(
        &mut self,
        shard: &mut Shard,
        start: (usize, usize),
        w: usize,
        grow_in: usize,
        new: Vec<Vec<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let (d0, l0) = start;
        // The pages the run spans.
        let mut d1 = d0;
        let mut left = w.saturating_sub(self.dirs[d0].leaves().len() - l0);
        while left > 0 {
            d1 += 1;
            let n = self.dirs[d1].leaves().len();
            left = left.saturating_sub(n);
        }
        let lo = if l0 > 0 {
            None
        } else if d0 > 0 {
            self.load_dir(shard, d0 - 1)?;
            Some(self.dirs[d0 - 1].leaves().last().expect("non-empty").first)
        } else {
            Some(0)
        };
        let beyond = self.dirs.get(d1 + 1).map(Dir::first).unwrap_or(1 << 63);
        // Flatten the pages d0..=d1.
        let mut sizes: Vec<isize> = Vec::new();
        let mut before: Vec<Vec<(u64, u64)>> = Vec::new();
        let mut flat: Vec<Leaf> = Vec::new();
        for d in &mut self.dirs[d0..=d1] {
            let leaves = d.leaves.take().expect("loaded");
            sizes.push(leaves.len() as isize);
            before.push(leaves.iter().map(|l| (l.first, l.addr)).collect());
            flat.extend(leaves);
        }
        let k = new.len();
        let same = |l: &Leaf, n: &Vec<Vec<u8>>| l.elems().iter().eq(n.iter());
        let mut p = 0;
        while p < w && p < k && same(&flat[l0 + p], &new[p]) {
            p += 1;
        }
        let mut s = 0;
        while s < w - p && s < k - p && same(&flat[l0 + w - 1 - s], &new[k - 1 - s]) {
            s += 1;
        }
        let lo = if l0 + p > 0 {
            flat[l0 + p - 1].first
        } else {
            lo.unwrap_or(0)
        };
        let hi = flat.get(l0 + w - s).map_or(beyond, |l| l.first);
        let m = (k - p - s) as u64;
        let step = hi.saturating_sub(lo) / (m + 1);
        if step == 0 {
            self.renumber = true;
        }
        let fresh: Vec<Leaf> = new[p..k - s]
            .iter()
            .enumerate()
            .map(|(i, n)| Leaf::fresh(lo + step * (i as u64 + 1), n.iter().cloned().collect()))
            .collect();
        for gone in flat.splice(l0 + p..l0 + w - s, fresh) {
            if gone.addr != 0 {
                self.dead.push((gone.addr, gone.len));
            }
        }
        // Give the size change to `grow_in`, taking a shortfall from the other pages.
        let g = grow_in - d0;
        sizes[g] += k as isize - w as isize;
        let mut short = (-sizes[g]).max(0);
        sizes[g] = sizes[g].max(0);
        for (i, sz) in sizes.iter_mut().enumerate() {
            if i != g && short > 0 {
                let take = short.min(*sz);
                *sz -= take;
                short -= take;
            }
        }
        let mut rest = flat.into_iter();
        for (i, d) in self.dirs[d0..=d1].iter_mut().enumerate() {
            let leaves: Vec<Leaf> = rest.by_ref().take(sizes[i] as usize).collect();
            let sig: Vec<(u64, u64)> = leaves.iter().map(|l| (l.first, l.addr)).collect();
            if sig != before[i] || leaves.iter().any(|l| l.dirty) {
                d.dirty = true;
            }
            d.leaves = Some(leaves);
        }
        for di in (d0..=d1).rev() {
            if self.dirs[di].leaves().is_empty() {
                let dir = self.dirs.remove(di);
                if dir.addr != 0 {
                    self.dead.push((dir.addr, dir.len));
                }
            }
        }
        Ok(())
    }

    /// Takes up to `limit` elements equal to `e` out of leaf `li` of page `di` (the last
    /// ones with `from_tail`); the leaf is kept even when emptied.
    fn remove_in_leaf(
        &mut self,
        shard: &mut Shard,
        (di, li): (usize, usize),
        e: &[u8],
        limit: usize,
        from_tail: bool,
    ) -> Result<usize, StorageError> {
        self.load_leaf(shard, di, li)?;
        let leaf = &mut self.dirs[di].leaves_mut()[li];
        let elems = leaf.elems.as_mut().expect("loaded");
        let matches = elems.iter().enumerate().filter(|(_, x)| x.as_slice() == e);
        let mut hits: Vec<usize> = if from_tail {
            matches.map(|(i, _)| i).rev().take(limit).collect()
        } else {
            matches.map(|(i, _)| i).take(limit).collect()
        };
        if hits.is_empty() {
            leaf.unload();
            return Ok(0);
        }
        hits.sort_unstable();
        for &i in hits.iter().rev() {
            let x = elems.remove(i).expect("in range");
            leaf.lp_bytes -= listpack_entry_bytes(&x);
        }
        leaf.count -= hits.len() as u32;
        leaf.dirty = true;
        self.dirs[di].dirty = true;
        self.count -= hits.len() as u64;
        Ok(hits.len())
    }

    /// LREM: removes up to `limit` elements equal to `e`, the first ones (the last ones
    /// with `from_tail`); returns how many. Reads leaves in that order until `limit`
    /// matches and rewrites only the leaves it changed (an emptied leaf is dropped, as
    /// Redis deletes entries in place and never merges nodes on removal).
    pub fn remove(
        &mut self,
        shard: &mut Shard,
        e: &[u8],
        limit: usize,
        from_tail: bool,
    ) -> Result<usize, StorageError> {
        let mut removed = 0;
        if from_tail {
            let mut di = self.dirs.len();
            while di > 0 && removed < limit {
                di -= 1;
                self.load_dir(shard, di)?;
                let mut li = self.dirs[di].leaves().len();
                while li > 0 && removed < limit {
                    li -= 1;
                    removed += self.remove_in_leaf(shard, (di, li), e, limit - removed, true)?;
                    if self.dirs[di].leaves()[li].count == 0 {
                        // Lower indexes stay valid (and the page goes only once empty).
                        self.drop_leaf(di, li);
                    }
                }
            }
            return Ok(removed);
        }
        let mut di = 0;
        while di < self.dirs.len() && removed < limit {
            self.load_dir(shard, di)?;
            let mut li = 0;
            let mut page_gone = false;
            while li < self.dirs[di].leaves().len() && removed < limit {
                removed += self.remove_in_leaf(shard, (di, li), e, limit - removed, false)?;
                if self.dirs[di].leaves()[li].count > 0 {
                    li += 1;
                    continue;
                }
                let last = self.dirs[di].leaves().len() == 1;
                self.drop_leaf(di, li);
                if last {
                    page_gone = true;
                    break;
                }
            }
            if !page_gone {
                di += 1;
            }
        }
        Ok(removed)
    }

    /// LPOS: the indexes of the matches of `e` met scanning from the head (the tail with
    /// `from_tail`), skipping the first `skip` matches, at most `want` of them, looking at
    /// no more than `scan` elements. Reads leaves in that order and stops at its answer.
    pub fn positions(
        &mut self,
        shard: &mut Shard,
        e: &[u8],
        from_tail: bool,
        mut skip: usize,
        want: usize,
        scan: usize,
    ) -> Result<Vec<usize>, StorageError> {
        let mut found = Vec::new();
        let mut scanned = 0usize;
        let mut base = if from_tail { self.len() } else { 0 };
        let order: Vec<usize> = if from_tail {
            (0..self.dirs.len()).rev().collect()
        } else {
            (0..self.dirs.len()).collect()
        };
        for di in order {
            self.load_dir(shard, di)?;
            let n = self.dirs[di].leaves().len();
            let leaves: Vec<usize> = if from_tail {
                (0..n).rev().collect()
            } else {
                (0..n).collect()
            };
            for li in leaves {
                if found.len() == want || scanned == scan {
                    return Ok(found);
                }
                self.load_leaf(shard, di, li)?;
                let leaf = &mut self.dirs[di].leaves_mut()[li];
                let elems = leaf.elems();
                let c = elems.len();
                if from_tail {
                    base -= c;
                }
                let offsets: Box<dyn Iterator<Item = usize>> = if from_tail {
                    Box::new((0..c).rev())
                } else {
                    Box::new(0..c)
                };
                for off in offsets {
                    if found.len() == want || scanned == scan {
                        break;
                    }
                    scanned += 1;
                    if elems[off] == e {
                        if skip > 0 {
                            skip -= 1;
                        } else {
                            found.push(base + off);
                        }
                    }
                }
                if !from_tail {
                    base += c;
                }
                leaf.unload();
            }
        }
        Ok(found)
    }

    /// Every leaf's elements, head to tail (reads every page; with read-ahead, as `range`).
    pub fn nodes(&mut self, shard: &mut Shard) -> Result<Vec<Vec<Vec<u8>>>, StorageError> {
        let mut ra = paged::Ahead::start();
        let mut out = Vec::with_capacity(self.leaf_count());
        for di in 0..self.dirs.len() {
            if ra.full() || !self.load_dir_ahead(&mut ra, shard, di)? {
                continue;
            }
            for li in 0..self.dirs[di].leaves().len() {
                if ra.full() {
                    break;
                }
                if self.load_leaf_ahead(&mut ra, shard, di, li)? && !ra.missed() {
                    let elems = self.dirs[di].leaves()[li].elems();
                    out.push(elems.iter().cloned().collect());
                }
            }
        }
        ra.finish(out)
    }

    /// The whole list as a one-record value (quicklist with one node per leaf).
    pub fn to_value(&mut self, shard: &mut Shard) -> Result<ListValue, StorageError> {
        Ok(ListValue::from_paged_nodes(self.nodes(shard)?))
    }

    /// Merges neighbouring directory pages, one of them rewritten, that together hold at
    /// most `DIR_MERGE_ENTRIES` leaves (the second page's leaves move unchanged).
    fn merge_dirs(&mut self, shard: &mut Shard) -> Result<(), StorageError> {
        let mut di = 0;
        while di + 1 < self.dirs.len() {
            let (a, b) = (&self.dirs[di], &self.dirs[di + 1]);
            if !(a.dirty || b.dirty) || a.leaf_count() + b.leaf_count() > DIR_MERGE_ENTRIES {
                di += 1;
                continue;
            }
            self.load_dir(shard, di)?;
            self.load_dir(shard, di + 1)?;
            let next = self.dirs.remove(di + 1);
            if next.addr != 0 {
                self.dead.push((next.addr, next.len));
            }
            let moved = next.leaves.expect("loaded");
            self.dirs[di].leaves_mut().extend(moved);
            self.dirs[di].dirty = true;
        }
        Ok(())
    }

    /// Whether a push (`pops` = 0) or `pops` pops at `end` can run on this state without
    /// reading a page and without a demotion: the end directory page and the end leaf are
    /// in memory, the leaf keeps an element after the pops (so no further leaf is needed),
    /// and the list stays clear of `settle_list`'s demotion rule (3+ leaves, and more than
    /// `DEMOTE_BYTES` of leaves beside the end leaf). A coalesced list that fails this is
    /// stored first and the command takes the ordinary path.
    pub fn serves_in_memory(&self, end: End, pops: usize) -> bool {
        let Some(dir) = (match end {
            End::Head => self.dirs.first(),
            End::Tail => self.dirs.last(),
        }) else {
            return false;
        };
        let Some(leaves) = dir.leaves.as_ref() else {
            return false;
        };
        let Some(leaf) = (match end {
            End::Head => leaves.first(),
            End::Tail => leaves.last(),
        }) else {
            return false;
        };
        let Some(elems) = leaf.elems.as_ref() else {
            return false;
        };
        pops < elems.len()
            && self.leaf_count() >= 3
            && self.payload_bytes() >= paged::DEMOTE_BYTES + leaf.payload_len()
            && self.store_reads_in_memory(Some(end))
    }

    /// Whether `store` would read no page (renumbering, directory-page merges), and with
    /// `end` also after one more push or pop there (that end's page counted as dirty and
    /// one leaf shorter, so a merge the command may cause is counted too). A coalesced
    /// list's store runs at the round's end, outside any restartable run, where a page
    /// read would block the worker: a list is kept coalesced only when this holds
    /// (`commands::collection::store_list_handle`, and `serves_in_memory` for the next
    /// command). The simulation follows `merge_dirs`' loop on leaf counts.
    pub fn store_reads_in_memory(&self, end: Option<End>) -> bool {
        if self.renumber && self.dirs.iter().any(|d| d.leaves.is_none()) {
            return false;
        }
        let n = self.dirs.len();
        // (leaves, dirty, read) per directory page.
        let mut sim: Vec<(usize, bool, bool)> = self
            .dirs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let touched = match end {
                    Some(End::Head) => i == 0,
                    Some(End::Tail) => i + 1 == n,
                    None => false,
                };
                let leaves = if touched {
                    d.leaf_count().saturating_sub(1)
                } else {
                    d.leaf_count()
                };
                (leaves, d.dirty || touched, d.leaves.is_some())
            })
            .collect();
        let mut i = 0;
        while i + 1 < sim.len() {
            let (a, b) = (sim[i], sim[i + 1]);
            if !(a.1 || b.1) || a.0 + b.0 > DIR_MERGE_ENTRIES {
                i += 1;
                continue;
            }
            if !(a.2 && b.2) {
                return false;
            }
            sim[i] = (a.0 + b.0, true, true);
            sim.remove(i + 1);
        }
        true
    }

    /// Writes what changed (non-empty list; the key's current root is the one this was
    /// opened from): dirty leaves, the directory pages holding them (merged with a small
    /// neighbour, split past `DIR_MAX_ENTRIES`), then the root. Pages not read keep their
    /// root entries.
    pub fn store(
        mut self,
        shard: &mut Shard,
        expire: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        let Some(lent) = self.root_rec.take() else {
            return self.store_pages(shard, expire, now_ms);
        };
        let before = shard.prefetched.len();
        shard.prefetched.push(*lent);
        let r = self.store_pages(shard, expire, now_ms);
        shard.prefetched.truncate(before);
        r
    }

    fn store_pages(
        mut self,
        shard: &mut Shard,
        expire: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StorageError> {
        if self.count == 0 || self.dirs.is_empty() {
            return Err(corrupt("store of an empty list"));
        }
        // Every read before the first write.
        if self.renumber {
            // Only directory entries carry positions: no leaf is rewritten.
            for di in 0..self.dirs.len() {
                self.load_dir(shard, di)?;
            }
            let mut p = START;
            for d in self.dirs.iter_mut() {
                d.dirty = true;
                for l in d.leaves_mut() {
                    l.first = p;
                    p += STEP;
                }
            }
        }
        self.merge_dirs(shard)?;
        let bytes = self.payload_bytes() as u64;
        let (db, kind) = (self.db, ValueKind::List);
        let key = std::mem::take(&mut self.key);
        let seq = shard.reserve_seq();
        let mut root_dirs: Vec<Entry> = Vec::with_capacity(self.dirs.len() + 1);
        for d in self.dirs.iter_mut() {
            if !d.dirty {
                root_dirs.push(Entry {
                    first: d.first(),
                    addr: d.addr,
                    len: d.len,
                    count: d.count() as u32,
                });
                continue;
            }
            let mut entries = Vec::with_capacity(d.leaf_count());
            for l in d
                .leaves
                .as_mut()
                .expect("a rewritten page is read")
                .iter_mut()
            {
                if l.dirty {
                    let payload = encode_leaf(l.elems().iter().map(|e| e.as_slice()));
                    if l.addr != 0 {
                        self.dead.push((l.addr, l.len));
                    }
                    l.addr = shard.append_page(db, &key, kind, &payload, seq)?.0;
                    l.len = payload.len() as u32;
                    l.dirty = false;
                }
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

/// Most paged lists one shard keeps coalesced at a time (`docs/collections.md` section
/// 5a); a push or pop on another list past it is stored at once, as before.
pub const COALESCED_KEYS_MAX: usize = 16;

/// Paged lists whose store is deferred to the end of the worker's batch
/// (`docs/collections.md` section 5a): the decoded state `PagedList::store` would have
/// encoded, with every change since the key's current root still dirty. The index still
/// names that root; only the coalescable commands of the batch (single-key pushes and pops
/// outside any scope, `commands::collection::coalesce_begin`) read a list from here, every
/// other command first has it stored (`store_coalesced`). Never holds a list with a TTL.
#[derive(Default)]
pub struct Coalesced {
    lists: Vec<PagedList>,
}

impl Coalesced {
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    pub fn len(&self) -> usize {
        self.lists.len()
    }

    pub fn contains(&self, db: Db, key: &[u8]) -> bool {
        self.lists.iter().any(|p| p.db == db && p.key == key)
    }

    /// Takes the list of (db, key) out, if held.
    pub fn take(&mut self, db: Db, key: &[u8]) -> Option<PagedList> {
        let i = self.lists.iter().position(|p| p.db == db && p.key == key)?;
        Some(self.lists.swap_remove(i))
    }

    /// Keeps `p` (non-empty, no other entry of its key) until the batch ends; gives it back
    /// when the overlay is full.
    pub fn put(&mut self, p: PagedList) -> Result<(), PagedList> {
        debug_assert!(!p.is_empty() && !self.contains(p.db, &p.key));
        if self.lists.len() >= COALESCED_KEYS_MAX {
            return Err(p);
        }
        self.lists.push(p);
        Ok(())
    }
}

/// Stores every coalesced list of `shard` (its pages, then its root: one store per list
/// for the whole batch). A list whose store fails is dropped (its key keeps its last
/// stored root); the first error is returned after the others were stored.
pub fn store_coalesced(shard: &mut Shard, now_ms: u64) -> Result<(), StorageError> {
    if shard.coalesced.lists.is_empty() {
        return Ok(());
    }
    let lists = std::mem::take(&mut shard.coalesced.lists);
    let mut first_err = None;
    for p in lists {
        if let Err(e) = p.store(shard, None, now_ms) {
            first_err.get_or_insert(e);
        }
    }
    shard.counters.coalesced_flushes += 1;
    first_err.map_or(Ok(()), Err)
}

/// Stores the coalesced list of (db, key) if `shard` holds one.
pub fn store_coalesced_key(
    shard: &mut Shard,
    db: Db,
    key: &[u8],
    now_ms: u64,
) -> Result<(), StorageError> {
    match shard.coalesced.take(db, key) {
        Some(p) => p.store(shard, None, now_ms),
        None => Ok(()),
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
    let mut l = PagedList::open(db, key, root)?;
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
            paged_base_min_dirs: crate::storage::paged::tests::base_min_dirs(),
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
                Some(ListHandle::Paged(PagedList::open(0, b"l", &root).unwrap()))
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
        paged::tests::check_live(s, &[b"l"]);
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
        // LINSERT and LREM calls that went through the paged path.
        let (mut paged_inserts, mut paged_removes) = (0, 0);
        for round in 0..24u64 {
            // Grow for 12 rounds, then shrink.
            let grow = round < 12;
            for _ in 0..40 {
                let r = next();
                let end = if r % 2 == 0 { End::Head } else { End::Tail };
                let mut l = load(&mut s).unwrap_or(ListHandle::Whole(ListValue::new()));
                let shrinking = match (r >> 8) % 12 {
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
                    8 if !model.is_empty() => {
                        // LINSERT next to an existing element (or a missing pivot).
                        let pivot = match (r >> 40) % 8 {
                            0 => b"no-such-pivot".to_vec(),
                            _ => model
                                .get((r >> 16) as usize % model.len())
                                .unwrap()
                                .to_vec(),
                        };
                        let after = (r >> 44) % 2 == 0;
                        let e = format!("ins{round}-{}", "z".repeat((r >> 24) as usize % 90))
                            .into_bytes();
                        let at = model.iter().position(|x| x == pivot.as_slice());
                        model.prepare_grow(e.len());
                        if let Some(at) = at {
                            model.insert(at, after, &e);
                        }
                        match &mut l {
                            ListHandle::Whole(v) => {
                                v.prepare_grow(e.len());
                                if let Some(at) = at {
                                    v.insert(at, after, &e);
                                }
                            }
                            ListHandle::Paged(p) => {
                                paged_inserts += 1;
                                assert_eq!(
                                    p.insert(&mut s, &pivot, after, &e).unwrap(),
                                    at.is_some()
                                )
                            }
                        }
                        false
                    }
                    9 if !model.is_empty() => {
                        // LPOS then LREM of an existing element, COUNT -2..=2.
                        let target = model
                            .get((r >> 16) as usize % model.len())
                            .unwrap()
                            .to_vec();
                        let count = ((r >> 24) % 5) as i64 - 2;
                        let from_tail = count < 0;
                        let limit = if count == 0 {
                            usize::MAX
                        } else {
                            count.unsigned_abs() as usize
                        };
                        let (skip, scan) =
                            ((r >> 32) as usize % 3, 1 + (r >> 36) as usize % model.len());
                        let mut hits: Vec<usize> = (0..model.len())
                            .filter(|&i| model.get(i) == Some(target.as_slice()))
                            .collect();
                        if from_tail {
                            hits.reverse();
                        }
                        let scanned = |i: usize| {
                            if from_tail {
                                model.len() - i <= scan
                            } else {
                                i < scan
                            }
                        };
                        let pos: Vec<usize> = hits
                            .iter()
                            .copied()
                            .filter(|&i| scanned(i))
                            .skip(skip)
                            .take(2)
                            .collect();
                        let doomed: Vec<usize> = hits.into_iter().take(limit).collect();
                        model.retain_indexed(|i, _| !doomed.contains(&i));
                        match &mut l {
                            ListHandle::Whole(v) => {
                                v.retain_indexed(|i, _| !doomed.contains(&i));
                            }
                            ListHandle::Paged(p) => {
                                let got = p
                                    .positions(&mut s, &target, from_tail, skip, 2, scan)
                                    .unwrap();
                                assert_eq!(got, pos, "LPOS");
                                paged_removes += 1;
                                assert_eq!(
                                    p.remove(&mut s, &target, limit, from_tail).unwrap(),
                                    doomed.len()
                                );
                            }
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
        assert!(
            paged_inserts > 10 && paged_removes > 10,
            "{paged_inserts} {paged_removes}"
        );
        s.shutdown(true).unwrap();
        let mut s = open(&dev, 256 * 1024);
        let back = contents(&mut s).unwrap_or_default();
        assert_eq!(back.node_elements(), model.node_elements());
    }

    /// Pushes `e` at `end` as one command (load, push, store).
    fn push_one(s: &mut Shard, end: End, e: &[u8]) {
        let mut l = load(s).unwrap_or(ListHandle::Whole(ListValue::new()));
        l.push_all(s, end, &[e]).unwrap();
        store(s, l, false);
    }

    fn dirs_of(s: &mut Shard) -> usize {
        match load(s) {
            Some(ListHandle::Paged(p)) => p.dir_count(),
            _ => panic!("not paged"),
        }
    }

    // A queue (RPUSH at the tail, LPOP at the head) of one-leaf elements run for three
    // times its length keeps its directory pages bounded (pages split at the tail and
    // vanish at the head); then an LREM leaving a few leaves spread over every page merges
    // the small pages into one. Contents and live bytes stay exact throughout.
    #[test]
    fn queue_keeps_directory_pages_bounded_and_small_pages_merge() {
        let dev = Arc::new(MemDevice::new("t", 96 << 20));
        let mut s = open(&dev, 256 * 1024);
        // 5000-byte elements: one per quicklist node, so one leaf each.
        let keep = |i: u64| format!("{i:06}{}", "k".repeat(4994)).into_bytes();
        let rep = vec![b'd'; 5000];
        let elem = |i: u64| {
            if i.is_multiple_of(10) {
                keep(i)
            } else {
                rep.clone()
            }
        };
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        for i in 0..300 {
            push_one(&mut s, End::Tail, &elem(i));
            model.push_back(elem(i));
        }
        let mut most = 0;
        for i in 300..1200 {
            push_one(&mut s, End::Tail, &elem(i));
            model.push_back(elem(i));
            let mut l = load(&mut s).unwrap();
            assert_eq!(l.pop(&mut s, End::Head).unwrap(), model.pop_front());
            store(&mut s, l, true);
            most = most.max(dirs_of(&mut s));
        }
        // 300 leaves: at most 300/128 full-ish pages plus a partly drained head page.
        assert!((2..=4).contains(&most), "{most} directory pages");
        let back = contents(&mut s).unwrap();
        assert!(back.iter().eq(model.iter().map(|e| e.as_slice())));
        check_live(&mut s);
        assert!(dirs_of(&mut s) >= 2);
        // LREM 0 of the repeated element: 30 leaves are left over 2-4 pages, one page now.
        let Some(ListHandle::Paged(mut p)) = load(&mut s) else {
            panic!("paged")
        };
        assert_eq!(p.remove(&mut s, &rep, usize::MAX, false).unwrap(), 270);
        store(&mut s, ListHandle::Paged(p), true);
        model.retain(|e| *e != rep);
        assert_eq!(dirs_of(&mut s), 1);
        let back = contents(&mut s).unwrap();
        assert!(back.iter().eq(model.iter().map(|e| e.as_slice())));
        check_live(&mut s);
        s.flush().unwrap();
        drop(s);
        dev.crash(None);
        let mut s = open(&dev, 256 * 1024);
        let back = contents(&mut s).unwrap();
        assert!(back.iter().eq(model.iter().map(|e| e.as_slice())));
        check_live(&mut s);
    }

    // The directory page size derived from a root entry's length matches the encoding.
    #[test]
    fn directory_entries_from_length() {
        for n in [1usize, 2, 64, 256] {
            let entries: Vec<Entry> = (0..n as u64)
                .map(|i| Entry {
                    first: i,
                    addr: i,
                    len: 1,
                    count: 1,
                })
                .collect();
            assert_eq!(dir_entries(paged::encode_dir(&entries).len() as u32), n);
        }
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

    // The tests above with every paged root stored as version 2 (`paged.rs` section 3a).
    #[test]
    fn list_model_through_crashes_and_defrag_v2() {
        crate::storage::paged::tests::with_v2_roots(list_model_through_crashes_and_defrag);
    }

    #[test]
    fn queue_keeps_directory_pages_bounded_and_small_pages_merge_v2() {
        crate::storage::paged::tests::with_v2_roots(
            queue_keeps_directory_pages_bounded_and_small_pages_merge,
        );
    }
}
