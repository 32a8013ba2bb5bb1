//! The value encoding of lists (stage 1 of `docs/collections.md`: a list is one record whose
//! value is the whole list; `docs/storage-format.md` section 9 gives the bytes).
//!
//! What it owns. The byte layout of a `List` record's value and `ListValue`, the in-memory
//! form the list commands work on (a double-ended queue of elements plus Redis's encoding
//! tag). Commands never see the bytes: they `decode`, mutate through the methods here, and
//! `encode` — the seam where the paged chain of `docs/collections.md` section 4 goes later.
//!
//! Invariants (checked by `decode`, kept by every method):
//! - A stored list has at least one element (an emptied list is deleted by its command).
//! - `listpack_bytes` is what Redis's `lpBytes` would say for a listpack of exactly these
//!   elements (header, entries with Redis's integer and string entry encodings, back
//!   lengths, end byte), kept incrementally, so the conversion rules below cost O(1).
//! - The encoding tag follows Redis 7.2's `list-max-listpack-size -2` rules: a listpack
//!   becomes a quicklist when a write would take it past 8 KiB (`lpBytes` + the raw bytes
//!   being added, checked before the write, as `listTypeTryConversionAppend` does) and is
//!   then the quicklist's first node; a quicklist goes back to a listpack after a shrinking
//!   command when it is a single node of at most 4 KiB.
//! - A quicklist records its nodes' element counts (they add up to the length, none is
//!   zero), cut as Redis 7.2's quicklist cuts them: a push goes into the end node unless
//!   its raw length + 8 would take that node past 8 KiB; LINSERT follows
//!   `_quicklistInsert` (pivot node, neighbour, new edge node, or split and merge);
//!   LSET replaces in place; removals shrink nodes and drop emptied ones. So OBJECT
//!   ENCODING and DUMP's node boundaries are Redis's (checked byte for byte against
//!   redis-server's DUMP in `tests/diff_dump.rs`).
//!
//! Deliberately missing: Redis's PLAIN nodes for elements of 1 GiB and more (beyond
//! lavik's value limit) and list compression (`list-compress-depth`, which changes
//! neither replies nor node boundaries).
//! `list-max-listpack-size` is the constant default (-2), not a setting.

use std::collections::VecDeque;

/// `list-max-listpack-size -2`: a listpack (or quicklist node) holds at most 8 KiB.
pub const LIST_MAX_LISTPACK_BYTES: usize = 8192;
/// A quicklist shrinks back to a listpack at half the limit (hysteresis against flapping).
pub const LIST_SHRINK_LISTPACK_BYTES: usize = LIST_MAX_LISTPACK_BYTES / 2;
/// Redis's listpack header (total bytes u32 + count u16) and end byte.
pub const LISTPACK_OVERHEAD_BYTES: usize = 7;
/// What Redis's `_quicklistNodeAllowInsert` adds to an element's raw length when it
/// estimates whether the element still fits a node (`SIZE_ESTIMATE_OVERHEAD`).
pub const QUICKLIST_SIZE_ESTIMATE_OVERHEAD_BYTES: usize = 8;
/// Longest varint: lengths and counts are below 4 GiB.
const VARINT_MAX_BYTES: usize = 5;

const _: () = assert!(LIST_SHRINK_LISTPACK_BYTES * 2 == LIST_MAX_LISTPACK_BYTES);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListCodecError {
    #[error("list value truncated at byte {0}")]
    Truncated(usize),
    #[error("list value malformed: {0}")]
    Malformed(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListEncoding {
    Listpack,
    Quicklist,
}

impl ListEncoding {
    /// The name OBJECT ENCODING reports.
    pub fn name(self) -> &'static str {
        match self {
            ListEncoding::Listpack => "listpack",
            ListEncoding::Quicklist => "quicklist",
        }
    }
}

/// The end of a list a push or pop works on (Redis's `LIST_HEAD` / `LIST_TAIL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Head,
    Tail,
}

/// Redis's `lpStringToInt64`: canonical decimal text of an `i64` only ("-0", "01", "+1"
/// and " 1" are strings).
fn listpack_int(e: &[u8]) -> Option<i64> {
    if e.is_empty() || e.len() > 20 {
        return None;
    }
    let v: i64 = std::str::from_utf8(e).ok()?.parse().ok()?;
    (v.to_string().as_bytes() == e).then_some(v)
}

/// Redis's `lpEncodeBacklen` size for an entry of `entry_bytes` (encoding + data).
fn backlen_bytes(entry_bytes: usize) -> usize {
    match entry_bytes {
        0..=127 => 1,
        128..=16382 => 2,
        16383..=2097150 => 3,
        2097151..=268435454 => 4,
        _ => 5,
    }
}

/// How many bytes `e` takes as one listpack entry (Redis's `lpEncodeGetType` sizes).
pub fn listpack_entry_bytes(e: &[u8]) -> usize {
    let body = match listpack_int(e) {
        Some(0..=127) => 1,
        Some(-4096..=4095) => 2,
        Some(-32768..=32767) => 3,
        Some(-8388608..=8388607) => 4,
        Some(-2147483648..=2147483647) => 5,
        Some(_) => 9,
        None if e.len() < 64 => 1 + e.len(),
        None if e.len() < 4096 => 2 + e.len(),
        None => 5 + e.len(),
    };
    body + backlen_bytes(body)
}

/// A list: its elements head to tail and Redis's encoding for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListValue {
    encoding: ListEncoding,
    items: VecDeque<Vec<u8>>,
    listpack_bytes: usize,
    /// Quicklist only: how many elements each node holds, head to tail (empty for a
    /// listpack). Kept as Redis's quicklist cuts them, so the shrinking rule and DUMP's
    /// node boundaries follow Redis.
    nodes: VecDeque<usize>,
    /// Set by an insert that split a node: the node around which to merge once the
    /// element is in (not part of the value).
    pending_merge: Option<usize>,
    /// Loaded from a paged list (`paged_list.rs`): stored paged again unless it shrank
    /// under the demotion threshold (not part of the encoding).
    paged_origin: bool,
}

impl Default for ListValue {
    fn default() -> Self {
        ListValue::new()
    }
}

/// Redis's `_quicklistNodeAllowInsert` for a node of `node_bytes` and an element of
/// `raw_bytes`: the estimate (raw length + 8) must keep the node within 8 KiB.
pub fn node_allows(node_bytes: usize, raw_bytes: usize) -> bool {
    node_bytes + raw_bytes + QUICKLIST_SIZE_ESTIMATE_OVERHEAD_BYTES <= LIST_MAX_LISTPACK_BYTES
}

impl ListValue {
    /// An empty list as Redis creates one for a push (`createListListpackObject`).
    pub fn new() -> ListValue {
        ListValue {
            encoding: ListEncoding::Listpack,
            items: VecDeque::new(),
            listpack_bytes: LISTPACK_OVERHEAD_BYTES,
            nodes: VecDeque::new(),
            pending_merge: None,
            paged_origin: false,
        }
    }

    /// A quicklist of exactly these nodes (non-empty, none empty), read from a paged list's
    /// leaves: no automatic conversion (the caller runs the command's own checks).
    pub fn from_paged_nodes(nodes: Vec<Vec<Vec<u8>>>) -> ListValue {
        let mut l = ListValue::new();
        l.encoding = ListEncoding::Quicklist;
        l.paged_origin = true;
        for node in nodes.into_iter().filter(|n| !n.is_empty()) {
            l.nodes.push_back(node.len());
            for e in node {
                l.listpack_bytes += listpack_entry_bytes(&e);
                l.items.push_back(e);
            }
        }
        l
    }

    /// Whether this value was loaded from a paged list.
    pub fn paged_origin(&self) -> bool {
        self.paged_origin
    }

    /// Stored as one record from now on (a paged list demoted by its command).
    pub fn forget_paged_origin(&mut self) {
        self.paged_origin = false;
    }

    /// Quicklist nodes (1 for a listpack).
    pub fn node_count(&self) -> usize {
        match self.encoding {
            ListEncoding::Listpack => 1,
            ListEncoding::Quicklist => self.nodes.len(),
        }
    }

    /// A list loaded from quicklist nodes (RDB): Redis keeps the nodes, then turns a single
    /// node that fits the limit into a listpack (`LIST_CONV_AUTO`). Empty nodes are dropped.
    pub fn from_nodes(nodes: Vec<Vec<Vec<u8>>>) -> ListValue {
        let mut l = ListValue::new();
        l.encoding = ListEncoding::Quicklist;
        for node in nodes.into_iter().filter(|n| !n.is_empty()) {
            l.nodes.push_back(node.len());
            for e in node {
                l.listpack_bytes += listpack_entry_bytes(&e);
                l.items.push_back(e);
            }
        }
        if l.nodes.len() <= 1 && l.listpack_bytes <= LIST_MAX_LISTPACK_BYTES {
            l.become_listpack();
        }
        l
    }

    /// A list loaded as Redis loads an RDB `LIST` of plain strings: tail pushes into a
    /// quicklist, then the same automatic conversion as `from_nodes`.
    pub fn from_tail_pushes(elements: impl IntoIterator<Item = Vec<u8>>) -> ListValue {
        let mut l = ListValue::new();
        l.encoding = ListEncoding::Quicklist;
        for e in elements {
            l.push(End::Tail, &e);
        }
        if l.nodes.len() <= 1 && l.listpack_bytes <= LIST_MAX_LISTPACK_BYTES {
            l.become_listpack();
        }
        l
    }

    pub fn encoding(&self) -> ListEncoding {
        self.encoding
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// What Redis's `lpBytes` would be for these elements in one listpack.
    pub fn listpack_bytes(&self) -> usize {
        self.listpack_bytes
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.items.get(i).map(|e| e.as_slice())
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &[u8]> + ExactSizeIterator {
        self.items.iter().map(|e| e.as_slice())
    }

    /// The elements cut into Redis's quicklist nodes (one node for a listpack).
    pub fn node_elements(&self) -> Vec<Vec<&[u8]>> {
        if self.encoding == ListEncoding::Listpack {
            return vec![self.iter().collect()];
        }
        let mut it = self.iter();
        self.nodes
            .iter()
            .map(|&n| it.by_ref().take(n).collect())
            .collect()
    }

    fn become_listpack(&mut self) {
        self.encoding = ListEncoding::Listpack;
        self.nodes.clear();
    }

    /// `lpBytes` of the node holding elements `first..first + count`.
    fn node_bytes(&self, first: usize, count: usize) -> usize {
        LISTPACK_OVERHEAD_BYTES
            + self
                .items
                .range(first..first + count)
                .map(|e| listpack_entry_bytes(e))
                .sum::<usize>()
    }

    /// Which node holds element `i` (i < len), and the index of that node's first element.
    fn node_of(&self, i: usize) -> (usize, usize) {
        let mut first = 0;
        for (n, &count) in self.nodes.iter().enumerate() {
            if i < first + count {
                return (n, first);
            }
            first += count;
        }
        unreachable!("index {i} below the list length")
    }

    /// Redis's growing check before writing elements whose raw lengths sum to `add_bytes`
    /// (`listTypeTryConvertListpack`): a listpack that would pass the limit converts, and
    /// becomes the quicklist's first node.
    pub fn prepare_grow(&mut self, add_bytes: usize) {
        if self.encoding == ListEncoding::Listpack
            && self.listpack_bytes + add_bytes > LIST_MAX_LISTPACK_BYTES
        {
            self.encoding = ListEncoding::Quicklist;
            self.nodes.clear();
            if !self.items.is_empty() {
                self.nodes.push_back(self.items.len());
            }
        }
    }

    /// Redis's shrinking check after a removal (`listTypeTryConvertQuicklist` with
    /// `shrinking`): a quicklist of one node of at most 4 KiB becomes a listpack.
    pub fn after_shrink(&mut self) {
        if self.encoding == ListEncoding::Quicklist
            && self.nodes.len() == 1
            && self.listpack_bytes <= LIST_SHRINK_LISTPACK_BYTES
        {
            self.become_listpack();
        }
    }

    /// Adds `e` at `end` (no conversion check: callers run `prepare_grow` for the batch).
    /// A quicklist puts it in the end node if Redis's insert estimate allows, else in a
    /// new node.
    pub fn push(&mut self, end: End, e: &[u8]) {
        if self.encoding == ListEncoding::Quicklist {
            let allowed = match end {
                End::Head => self
                    .nodes
                    .front()
                    .is_some_and(|&n| node_allows(self.node_bytes(0, n), e.len())),
                End::Tail => self.nodes.back().is_some_and(|&n| {
                    node_allows(self.node_bytes(self.items.len() - n, n), e.len())
                }),
            };
            match (end, allowed) {
                (End::Head, true) => self.nodes[0] += 1,
                (End::Tail, true) => *self.nodes.back_mut().expect("checked") += 1,
                (End::Head, false) => self.nodes.push_front(1),
                (End::Tail, false) => self.nodes.push_back(1),
            }
        }
        self.listpack_bytes += listpack_entry_bytes(e);
        match end {
            End::Head => self.items.push_front(e.to_vec()),
            End::Tail => self.items.push_back(e.to_vec()),
        }
    }

    /// Takes one element out of node `n` (dropping the node when it empties).
    fn node_removed(&mut self, n: usize) {
        self.nodes[n] -= 1;
        if self.nodes[n] == 0 {
            self.nodes.remove(n);
        }
    }

    /// Removes the element at `end` (no conversion check: callers run `after_shrink`).
    pub fn pop(&mut self, end: End) -> Option<Vec<u8>> {
        let e = match end {
            End::Head => self.items.pop_front(),
            End::Tail => self.items.pop_back(),
        }?;
        if self.encoding == ListEncoding::Quicklist {
            let n = if end == End::Head {
                0
            } else {
                self.nodes.len() - 1
            };
            self.node_removed(n);
        }
        self.listpack_bytes -= listpack_entry_bytes(&e);
        Some(e)
    }

    /// Replaces element `i` (which must exist), in its node as Redis 7.2's
    /// `quicklistReplaceEntry` does for any element below 1 GiB.
    pub fn set(&mut self, i: usize, e: &[u8]) {
        let old = std::mem::replace(&mut self.items[i], e.to_vec());
        self.listpack_bytes =
            self.listpack_bytes - listpack_entry_bytes(&old) + listpack_entry_bytes(e);
    }

    /// `lpBytes` of node `n`.
    fn node_size(&self, n: usize) -> usize {
        let first: usize = self.nodes.range(..n).sum();
        self.node_bytes(first, self.nodes[n])
    }

    /// Inserts `e` next to element `pivot` (before it, or after it when `after`), as
    /// LINSERT does. A quicklist places it as Redis's `_quicklistInsert` does: in the
    /// pivot's node if that allows the insert, else at the near end of a neighbour that
    /// allows it, else in a new node at the pivot node's edge, else by splitting the
    /// pivot's node and merging around the split (`_quicklistMergeNodes`).
    pub fn insert(&mut self, pivot: usize, after: bool, e: &[u8]) {
        debug_assert!(pivot < self.items.len());
        if self.encoding == ListEncoding::Quicklist {
            self.insert_node_counts(pivot, after, e.len());
        }
        self.listpack_bytes += listpack_entry_bytes(e);
        self.items.insert(pivot + after as usize, e.to_vec());
        if self.encoding == ListEncoding::Quicklist {
            if let Some(center) = self.pending_merge.take() {
                self.merge_around(center);
            }
        }
    }

    /// The node bookkeeping of `insert`, decided on the sizes before the element goes in.
    fn insert_node_counts(&mut self, pivot: usize, after: bool, raw_bytes: usize) {
        let (n, first) = self.node_of(pivot);
        let count = self.nodes[n];
        let offset = pivot - first;
        let full = !node_allows(self.node_size(n), raw_bytes);
        let at_tail = after && offset == count - 1;
        let at_head = !after && offset == 0;
        let avail_next =
            at_tail && n + 1 < self.nodes.len() && node_allows(self.node_size(n + 1), raw_bytes);
        let avail_prev = at_head && n > 0 && node_allows(self.node_size(n - 1), raw_bytes);
        if !full {
            self.nodes[n] += 1;
        } else if avail_next {
            self.nodes[n + 1] += 1;
        } else if avail_prev {
            self.nodes[n - 1] += 1;
        } else if at_tail {
            self.nodes.insert(n + 1, 1);
        } else if at_head {
            self.nodes.insert(n, 1);
        } else if after {
            // The pivot's node keeps elements 0..=offset; the rest and the new element
            // form a node after it.
            self.nodes[n] = offset + 1;
            self.nodes.insert(n + 1, count - offset);
            self.pending_merge = Some(n);
        } else {
            // The pivot's node keeps elements offset..; the ones before it and the new
            // element form a node before it.
            self.nodes[n] = count - offset;
            self.nodes.insert(n, offset + 1);
            self.pending_merge = Some(n + 1);
        }
    }

    /// Redis's `_quicklistNodeAllowMerge`: two nodes merge when the merged listpack (one
    /// header and end byte fewer) stays within 8 KiB.
    fn merge_allowed(&self, a: usize, b: usize) -> bool {
        self.node_size(a) + self.node_size(b) - LISTPACK_OVERHEAD_BYTES <= LIST_MAX_LISTPACK_BYTES
    }

    /// Merges node `b` into node `a` (its left neighbour).
    fn merge_into(&mut self, a: usize, b: usize) {
        debug_assert_eq!(a + 1, b);
        self.nodes[a] += self.nodes[b];
        self.nodes.remove(b);
    }

    /// Redis's `_quicklistMergeNodes` around node `center`: the two nodes before it, the
    /// two after it, then the center with its previous and the result with its next.
    fn merge_around(&mut self, mut center: usize) {
        if center >= 2 && self.merge_allowed(center - 2, center - 1) {
            self.merge_into(center - 2, center - 1);
            center -= 1;
        }
        if center + 2 < self.nodes.len() && self.merge_allowed(center + 1, center + 2) {
            self.merge_into(center + 1, center + 2);
        }
        let target = if center >= 1 && self.merge_allowed(center, center - 1) {
            self.merge_into(center - 1, center);
            center - 1
        } else {
            center
        };
        if target + 1 < self.nodes.len() && self.merge_allowed(target, target + 1) {
            self.merge_into(target, target + 1);
        }
    }

    /// Keeps only the elements for which `keep` says so, in order; returns how many went.
    /// Quicklist nodes lose their removed elements and vanish when emptied (Redis deletes
    /// entries in place and never merges nodes on removal).
    pub fn retain_indexed(&mut self, mut keep: impl FnMut(usize, &[u8]) -> bool) -> usize {
        let before = self.items.len();
        let kept: Vec<bool> = self
            .items
            .iter()
            .enumerate()
            .map(|(i, e)| keep(i, e))
            .collect();
        if self.encoding == ListEncoding::Quicklist {
            let mut first = 0;
            for count in self.nodes.iter_mut() {
                let gone = kept[first..first + *count].iter().filter(|k| !**k).count();
                first += *count;
                *count -= gone;
            }
            self.nodes.retain(|&c| c > 0);
        }
        let mut i = 0;
        let mut dropped_bytes = 0;
        self.items.retain(|e| {
            let k = kept[i];
            i += 1;
            if !k {
                dropped_bytes += listpack_entry_bytes(e);
            }
            k
        });
        self.listpack_bytes -= dropped_bytes;
        before - self.items.len()
    }

    /// Keeps elements `start..=end` (both in range, start <= end), or none when `None`.
    pub fn trim(&mut self, keep: Option<(usize, usize)>) {
        match keep {
            None => {
                self.items.clear();
                self.nodes.clear();
                self.listpack_bytes = LISTPACK_OVERHEAD_BYTES;
            }
            Some((start, end)) => {
                debug_assert!(start <= end && end < self.items.len());
                for _ in end + 1..self.items.len() {
                    self.pop(End::Tail);
                }
                for _ in 0..start {
                    self.pop(End::Head);
                }
            }
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self.items.iter().map(|e| e.len() + 2).sum();
        let mut out = Vec::with_capacity(1 + 2 * VARINT_MAX_BYTES + body);
        out.push(match self.encoding {
            ListEncoding::Listpack => 0,
            ListEncoding::Quicklist => 1,
        });
        put_varint(
            &mut out,
            u32::try_from(self.items.len()).expect("below 2^32 elements"),
        );
        if self.encoding == ListEncoding::Quicklist {
            put_varint(&mut out, self.nodes.len() as u32);
            for &n in &self.nodes {
                put_varint(&mut out, n as u32);
            }
        }
        for e in &self.items {
            put_varint(
                &mut out,
                u32::try_from(e.len()).expect("element below 4 GiB"),
            );
            out.extend_from_slice(e);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<ListValue, ListCodecError> {
        let mut at = 0;
        let encoding = match b.first() {
            Some(0) => ListEncoding::Listpack,
            Some(1) => ListEncoding::Quicklist,
            Some(_) => return Err(ListCodecError::Malformed("unknown list encoding")),
            None => return Err(ListCodecError::Truncated(0)),
        };
        at += 1;
        let n = varint(b, &mut at)? as usize;
        // Each element (and each node count) takes at least one byte: a corrupt count
        // cannot make decode allocate beyond the input.
        if n > b.len() - at {
            return Err(ListCodecError::Truncated(b.len()));
        }
        if n == 0 {
            return Err(ListCodecError::Malformed("empty list"));
        }
        let mut l = ListValue::new();
        l.encoding = encoding;
        if encoding == ListEncoding::Quicklist {
            let node_count = varint(b, &mut at)? as usize;
            if node_count > b.len() - at {
                return Err(ListCodecError::Truncated(b.len()));
            }
            let mut total = 0usize;
            for _ in 0..node_count {
                let c = varint(b, &mut at)? as usize;
                if c == 0 {
                    return Err(ListCodecError::Malformed("empty quicklist node"));
                }
                total += c;
                l.nodes.push_back(c);
            }
            if total != n {
                return Err(ListCodecError::Malformed("node counts do not add up"));
            }
        }
        l.items.reserve(n);
        for _ in 0..n {
            let len = varint(b, &mut at)? as usize;
            let end = at
                .checked_add(len)
                .filter(|&e| e <= b.len())
                .ok_or(ListCodecError::Truncated(b.len()))?;
            l.listpack_bytes += listpack_entry_bytes(&b[at..end]);
            l.items.push_back(b[at..end].to_vec());
            at = end;
        }
        if at != b.len() {
            return Err(ListCodecError::Malformed("trailing bytes"));
        }
        Ok(l)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// LEB128, at most 5 bytes, canonical (no redundant trailing zero groups), below 2^32.
fn varint(b: &[u8], at: &mut usize) -> Result<u32, ListCodecError> {
    let mut v: u64 = 0;
    for i in 0..VARINT_MAX_BYTES {
        let byte = *b.get(*at).ok_or(ListCodecError::Truncated(*at))?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return Err(ListCodecError::Malformed("non-canonical varint"));
            }
            return u32::try_from(v).map_err(|_| ListCodecError::Malformed("varint overflow"));
        }
    }
    Err(ListCodecError::Malformed("varint too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&[u8]]) -> ListValue {
        let mut l = ListValue::new();
        for i in items {
            l.push(End::Tail, i);
        }
        l
    }

    // A known byte literal decodes to the list it describes (quartet: parse).
    #[test]
    fn parse_known_bytes() {
        let l = ListValue::decode(&[0, 3, 1, b'a', 0, 2, b'4', b'2']).unwrap();
        assert_eq!(l.encoding(), ListEncoding::Listpack);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![&b"a"[..], b"", b"42"]);
        // 7 overhead + "a" (1+1+1) + "" (1+1) + 42 as a 7-bit int (1+1).
        assert_eq!(l.listpack_bytes(), 7 + 3 + 2 + 2);
        // Quicklist: 3 elements in nodes of 2 and 1.
        let q = ListValue::decode(&[1, 3, 2, 2, 1, 1, b'x', 0, 1, b'y']).unwrap();
        assert_eq!(q.encoding(), ListEncoding::Quicklist);
        assert_eq!(
            q.node_elements(),
            vec![vec![&b"x"[..], b""], vec![&b"y"[..]]]
        );
    }

    // Encoding produces the documented bytes (quartet: emit).
    #[test]
    fn emit_known_bytes() {
        let mut l = list(&[b"x", b"yz"]);
        l.push(End::Head, b"");
        assert_eq!(l.encode(), vec![0, 3, 0, 1, b'x', 2, b'y', b'z']);
    }

    // Every proper prefix of a valid value is refused (quartet: truncated).
    #[test]
    fn truncated_refused() {
        let b = list(&[b"hello", &[7u8; 200], b"-12"]).encode();
        for n in 0..b.len() {
            assert!(ListValue::decode(&b[..n]).is_err(), "prefix {n}");
        }
    }

    // Unknown tags, empty lists, trailing bytes and bad varints are refused (quartet:
    // malformed).
    #[test]
    fn malformed_refused() {
        for bad in [
            &[2u8, 1, 0][..],
            &[0, 0],
            &[0, 1, 0, 9],
            &[0, 0x81, 0x00, 0],
            &[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0],
            &[0, 5, 0],
            &[1, 1, 1, 2, 0],
            &[1, 1, 2, 0, 1, 0],
            &[1, 1, 0, 0],
        ] {
            assert!(ListValue::decode(bad).is_err(), "{bad:?}");
        }
    }

    // Entry sizes follow Redis's listpack encodings at every boundary.
    #[test]
    fn entry_sizes() {
        for (e, n) in [
            (&b"0"[..], 2),
            (b"127", 2),
            (b"128", 3),
            (b"-4096", 3),
            (b"4096", 4),
            (b"-32769", 5),
            (b"8388608", 6),
            (b"9223372036854775807", 10),
            (b"-0", 4),
            (b"01", 4),
            (b"", 2),
        ] {
            assert_eq!(
                listpack_entry_bytes(e),
                n,
                "{:?}",
                String::from_utf8_lossy(e)
            );
        }
        assert_eq!(listpack_entry_bytes(&[b'a'; 63]), 65);
        assert_eq!(listpack_entry_bytes(&[b'a'; 64]), 66 + 1);
        assert_eq!(listpack_entry_bytes(&[b'a'; 4096]), 4101 + 2);
    }

    /// A list grown by tail pushes of 100-byte elements up to its first quicklist push.
    fn grown() -> ListValue {
        let mut l = ListValue::new();
        let e = [b'v'; 100]; // 103 bytes per entry
        while l.listpack_bytes() + e.len() <= LIST_MAX_LISTPACK_BYTES {
            l.prepare_grow(e.len());
            l.push(End::Tail, &e);
        }
        assert_eq!((l.encoding(), l.len()), (ListEncoding::Listpack, 79));
        l.prepare_grow(e.len());
        l.push(End::Tail, &e);
        l
    }

    // A listpack converts when a push would pass 8 KiB and becomes the first node; the
    // next element does not fit it (8144 + 100 + 8 > 8192) and opens a second node.
    #[test]
    fn conversion_on_growth() {
        let l = grown();
        assert_eq!(l.encoding(), ListEncoding::Quicklist);
        let sizes: Vec<usize> = l.node_elements().iter().map(|n| n.len()).collect();
        assert_eq!(sizes, vec![79, 1]);
    }

    // Back to a listpack only with one node of at most 4 KiB: popping the tail drops the
    // one-element node and then converts at 39 elements (7 + 39 * 103 = 4024); popping the
    // head keeps two nodes until the first empties.
    #[test]
    fn conversion_on_shrinking() {
        let mut l = grown();
        while l.len() > 40 {
            l.pop(End::Tail);
            l.after_shrink();
            assert_eq!(l.encoding(), ListEncoding::Quicklist, "{}", l.len());
        }
        l.pop(End::Tail);
        l.after_shrink();
        assert_eq!((l.encoding(), l.len()), (ListEncoding::Listpack, 39));

        let mut l = grown();
        while l.len() > 2 {
            l.pop(End::Head);
            l.after_shrink();
            assert_eq!(l.encoding(), ListEncoding::Quicklist, "{}", l.len());
        }
        l.pop(End::Head);
        l.after_shrink();
        assert_eq!((l.encoding(), l.len()), (ListEncoding::Listpack, 1));
    }

    // Removals inside a quicklist shrink their nodes and drop emptied ones.
    #[test]
    fn removal_keeps_nodes() {
        let mut l = grown();
        l.push(End::Head, b"h");
        let sizes =
            |l: &ListValue| -> Vec<usize> { l.node_elements().iter().map(|n| n.len()).collect() };
        assert_eq!(sizes(&l), vec![80, 1]);
        let last = l.len() - 1;
        assert_eq!(l.retain_indexed(|i, _| i != last && i % 2 == 1), 41);
        assert_eq!(sizes(&l), vec![40]);
        let back = ListValue::decode(&l.encode()).unwrap();
        assert_eq!(back, l);
    }

    // An insert into a full node splits it and merges around the split, as Redis's
    // `_quicklistInsert`: [79][1] + 1 after element 10 -> [11][69][1] -> [11][70].
    #[test]
    fn insert_splits_and_merges() {
        let mut l = grown();
        l.insert(10, true, &[b'n'; 100]);
        let sizes: Vec<usize> = l.node_elements().iter().map(|n| n.len()).collect();
        assert_eq!(sizes, vec![11, 70]);
        assert_eq!(l.get(11), Some(&[b'n'; 100][..]));
        // Before the head of a node with room: that node takes it.
        l.insert(0, false, &[b'h'; 100]);
        let sizes: Vec<usize> = l.node_elements().iter().map(|n| n.len()).collect();
        assert_eq!(sizes, vec![12, 70]);
        assert_eq!(ListValue::decode(&l.encode()).unwrap(), l);
    }

    // Trim, retain, set and insert keep the listpack size equal to a fresh build's.
    #[test]
    fn size_tracking() {
        let mut l = list(&[b"1", b"200", b"abc", b"-5", b"x"]);
        l.set(1, b"hello world");
        l.insert(1, true, b"99999");
        l.retain_indexed(|i, _| i != 0);
        l.trim(Some((1, 3)));
        let fresh = list(&l.iter().collect::<Vec<_>>());
        assert_eq!(l.listpack_bytes(), fresh.listpack_bytes());
        assert_eq!(l, fresh);
    }

    proptest::proptest! {
        // Any sequence of pushes and pops round-trips through encode/decode.
        #[test]
        fn round_trip(ops in proptest::collection::vec(
            (proptest::bool::ANY, proptest::bool::ANY, proptest::collection::vec(proptest::num::u8::ANY, 0..90)), 1..60)) {
            let mut l = ListValue::new();
            for (push, head, bytes) in &ops {
                let end = if *head { End::Head } else { End::Tail };
                if *push || l.is_empty() {
                    l.prepare_grow(bytes.len());
                    l.push(end, bytes);
                } else {
                    l.pop(end);
                    l.after_shrink();
                }
            }
            if l.is_empty() {
                proptest::prop_assert!(ListValue::decode(&l.encode()).is_err());
            } else {
                let back = ListValue::decode(&l.encode()).unwrap();
                proptest::prop_assert_eq!(back, l);
            }
        }
    }
}
