//! The value encoding of hashes and sets (stage 1 of `docs/collections.md`: a collection is
//! one record whose value is the whole collection).
//!
//! What it owns. The byte layout of a `Hash` or `Set` record's value (specified in
//! `docs/storage-format.md` section 8) and the in-memory forms the commands work on:
//! `HashValue` (field/value pairs) and `SetValue` (members). Commands never see the bytes;
//! they `decode`, mutate through the methods here, and `encode` — the seam where the paged
//! layer goes later (a root + pages implementation of the same methods, loading only the
//! pages a command touches).
//!
//! Invariants (checked by `decode`, kept by every method):
//! - No two pairs of a hash share a field; no two members of a set are equal.
//! - Element order is Redis's for the small encodings: listpack keeps insertion order (an
//!   update keeps the element's place), intset is ascending by integer value and holds only
//!   canonical `i64` decimals. The hashtable encoding keeps insertion order too (Redis leaves
//!   it unspecified), so replies are deterministic.
//! - The encoding tag follows Redis's conversion rules and never goes back to a smaller
//!   encoding (Redis does not demote either), so OBJECT ENCODING answers as Redis would.
//!
//! Deliberately missing: per-field indexes (lookups are linear scans, fine for the
//! listpack-sized collections this stage targets; a big collection costs O(n) per command
//! until the paged layer lands) and `CONFIG SET` of the thresholds (they are constants).

use crate::resp::parse::parse_i64;
use std::cell::OnceCell;
use std::collections::HashMap;

/// `hash-max-listpack-entries`: more pairs than this converts a hash to a hashtable.
pub const HASH_MAX_LISTPACK_ENTRIES: usize = 128;
/// `hash-max-listpack-value`: a field or value longer than this converts it.
pub const HASH_MAX_LISTPACK_VALUE_BYTES: usize = 64;
/// `set-max-intset-entries`: more integers than this converts an intset to a hashtable.
pub const SET_MAX_INTSET_ENTRIES: usize = 512;
/// `set-max-listpack-entries`.
pub const SET_MAX_LISTPACK_ENTRIES: usize = 128;
/// `set-max-listpack-value`.
pub const SET_MAX_LISTPACK_VALUE_BYTES: usize = 64;

/// From this many elements on, lookups go through a hash map built on first use instead of
/// a linear scan (multi-member commands and set algebra on big one-record collections).
const LOOKUP_MIN_ELEMENTS: usize = 32;

/// Lookups answered by a linear scan before the map is built: building it copies every
/// element (one allocation each), which a command that looks up one member of a big loaded
/// collection (HSET, SADD, SISMEMBER on a paged hash or set: thousands of elements) paid in
/// full — 16 % of an HSET's CPU on a 1M-field hash (perf, session 13). A scan of a few
/// thousand short elements costs less than one build; repeated lookups (multi-member
/// commands, set algebra) still get the map from the fifth on.
const SCANS_BEFORE_MAP: u32 = 4;

/// Element bytes → index in the element vector, built lazily and kept in step by every
/// mutation (or dropped, to be rebuilt, when a removal shifts positions). Not part of the
/// value: equality ignores it.
#[derive(Clone, Debug, Default)]
struct Lookup(OnceCell<HashMap<Vec<u8>, usize>>, std::cell::Cell<u32>);

impl PartialEq for Lookup {
    fn eq(&self, _: &Lookup) -> bool {
        true
    }
}

impl Eq for Lookup {}

impl Lookup {
    fn find<'e>(&self, key: &[u8], mut elements: impl Iterator<Item = &'e [u8]>) -> Option<usize> {
        if self.0.get().is_none() && self.1.get() < SCANS_BEFORE_MAP {
            self.1.set(self.1.get() + 1);
            return elements.position(|e| e == key);
        }
        self.0
            .get_or_init(|| elements.enumerate().map(|(i, e)| (e.to_vec(), i)).collect())
            .get(key)
            .copied()
    }

    fn pushed(&mut self, key: &[u8], at: usize) {
        if let Some(m) = self.0.get_mut() {
            m.insert(key.to_vec(), at);
        }
    }

    /// After `swap_remove(at)` of `removed`: `moved` (if any) now sits at `at`.
    fn swap_removed(&mut self, removed: &[u8], at: usize, moved: Option<&[u8]>) {
        if let Some(m) = self.0.get_mut() {
            m.remove(removed);
            if let Some(k) = moved {
                m.insert(k.to_vec(), at);
            }
        }
    }

    fn reset(&mut self) {
        self.0 = OnceCell::new();
    }
}

/// The page tree a value was loaded from (`paged.rs`), when it is stored paged; the
/// positions touched since are recorded so storing rewrites only their pages. Not part of
/// the value: equality ignores it.
#[derive(Clone, Debug, Default)]
pub struct PagedOrigin(pub Option<Box<crate::storage::paged::Tree>>);

impl PartialEq for PagedOrigin {
    fn eq(&self, _: &PagedOrigin) -> bool {
        true
    }
}

impl Eq for PagedOrigin {}

impl PagedOrigin {
    /// Members not read by a partial load (`paged::load_partial`): they count in `len`.
    fn rest_count(&self) -> usize {
        self.0.as_ref().map_or(0, |t| t.rest_count())
    }

    fn touch(&mut self, member: &[u8]) {
        if let Some(t) = self.0.as_mut() {
            t.touched.push(crate::storage::paged::position(member));
        }
    }
}

/// Largest length a varint may carry: element lengths and counts are below 4 GiB (a value is
/// far smaller: `Shard::value_len_max`).
const VARINT_MAX_BYTES: usize = 5;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("collection value truncated at byte {0}")]
    Truncated(usize),
    #[error("collection value malformed: {0}")]
    Malformed(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashEncoding {
    Listpack,
    Hashtable,
}

impl HashEncoding {
    /// The name OBJECT ENCODING reports.
    pub fn name(self) -> &'static str {
        match self {
            HashEncoding::Listpack => "listpack",
            HashEncoding::Hashtable => "hashtable",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetEncoding {
    Intset,
    Listpack,
    Hashtable,
}

impl SetEncoding {
    pub fn name(self) -> &'static str {
        match self {
            SetEncoding::Intset => "intset",
            SetEncoding::Listpack => "listpack",
            SetEncoding::Hashtable => "hashtable",
        }
    }
}

// ---- bytes ------------------------------------------------------------------------------

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Result<u8, CodecError> {
        let v = *self.b.get(self.at).ok_or(CodecError::Truncated(self.at))?;
        self.at += 1;
        Ok(v)
    }

    /// LEB128, at most 5 bytes, canonical (no redundant trailing zero groups).
    fn varint(&mut self) -> Result<u32, CodecError> {
        let mut v: u64 = 0;
        for i in 0..VARINT_MAX_BYTES {
            let byte = self.u8()?;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if i > 0 && byte == 0 {
                    return Err(CodecError::Malformed("non-canonical varint"));
                }
                return u32::try_from(v).map_err(|_| CodecError::Malformed("varint overflow"));
            }
        }
        Err(CodecError::Malformed("varint too long"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.varint()? as usize;
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(CodecError::Truncated(self.b.len()))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// A count of elements, each at least `min_bytes` long, checked against what is left so
    /// a corrupt count cannot make `decode` allocate without bound.
    fn count(&mut self, min_bytes: usize) -> Result<usize, CodecError> {
        let n = self.varint()? as usize;
        if n.saturating_mul(min_bytes) > self.b.len() - self.at {
            return Err(CodecError::Truncated(self.b.len()));
        }
        Ok(n)
    }

    fn finish(&self) -> Result<(), CodecError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(CodecError::Malformed("trailing bytes"))
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, u32::try_from(b.len()).expect("element below 4 GiB"));
    out.extend_from_slice(b);
}

// ---- hashes -----------------------------------------------------------------------------

/// A hash: field/value pairs in Redis's listpack order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashValue {
    encoding: HashEncoding,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    lookup: Lookup,
    origin: PagedOrigin,
}

impl Default for HashValue {
    fn default() -> Self {
        HashValue::new()
    }
}

impl HashValue {
    pub fn new() -> HashValue {
        HashValue {
            encoding: HashEncoding::Listpack,
            pairs: Vec::new(),
            lookup: Lookup::default(),
            origin: PagedOrigin::default(),
        }
    }

    pub fn encoding(&self) -> HashEncoding {
        self.encoding
    }

    /// A hash read from pages (hashtable encoding, `pairs` in position order).
    pub fn from_paged(
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        tree: crate::storage::paged::Tree,
    ) -> HashValue {
        HashValue {
            encoding: HashEncoding::Hashtable,
            pairs,
            lookup: Lookup::default(),
            origin: PagedOrigin(Some(Box::new(tree))),
        }
    }

    /// The page tree this value was loaded from, if it is stored paged.
    pub fn paged_tree(&self) -> Option<&crate::storage::paged::Tree> {
        self.origin.0.as_deref()
    }

    /// Bytes of the pairs in the encoding (without the header).
    pub fn body_bytes(&self) -> usize {
        self.pairs
            .iter()
            .map(crate::storage::paged::elem_bytes)
            .sum()
    }

    /// The encoding byte of `encode`.
    pub fn encoding_byte(&self) -> u8 {
        match self.encoding {
            HashEncoding::Listpack => 0,
            HashEncoding::Hashtable => 1,
        }
    }

    /// Fields of the whole hash (for a partial load, with those not read).
    pub fn len(&self) -> usize {
        self.pairs.len() + self.origin.rest_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn pairs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.pairs
    }

    fn position(&self, field: &[u8]) -> Option<usize> {
        if self.pairs.len() < LOOKUP_MIN_ELEMENTS {
            return self.pairs.iter().position(|(f, _)| f == field);
        }
        self.lookup
            .find(field, self.pairs.iter().map(|(f, _)| f.as_slice()))
    }

    pub fn get(&self, field: &[u8]) -> Option<&[u8]> {
        self.position(field).map(|i| self.pairs[i].1.as_slice())
    }

    /// Redis's `hashTypeTryConversion` before a write of `new_pairs` pairs whose longest
    /// string is `longest_bytes`: converts up front when the write cannot stay a listpack.
    pub fn prepare_write(&mut self, new_pairs: usize, longest_bytes: usize) {
        if new_pairs > HASH_MAX_LISTPACK_ENTRIES || longest_bytes > HASH_MAX_LISTPACK_VALUE_BYTES {
            self.encoding = HashEncoding::Hashtable;
        }
    }

    /// Sets `field` to `value`; true if the field is new. An existing field keeps its place.
    pub fn set(&mut self, field: &[u8], value: &[u8]) -> bool {
        if field.len().max(value.len()) > HASH_MAX_LISTPACK_VALUE_BYTES {
            self.encoding = HashEncoding::Hashtable;
        }
        self.origin.touch(field);
        let added = match self.position(field) {
            Some(i) => {
                self.pairs[i].1 = value.to_vec();
                false
            }
            None => {
                self.pairs.push((field.to_vec(), value.to_vec()));
                self.lookup.pushed(field, self.pairs.len() - 1);
                true
            }
        };
        if self.pairs.len() > HASH_MAX_LISTPACK_ENTRIES {
            self.encoding = HashEncoding::Hashtable;
        }
        added
    }

    /// Removes `field`; true if it was there. The others keep their order, except in the
    /// hashtable encoding (whose order Redis leaves unspecified): the last pair takes the
    /// removed one's place, so a removal costs O(1).
    pub fn remove(&mut self, field: &[u8]) -> bool {
        let Some(i) = self.position(field) else {
            return false;
        };
        self.origin.touch(field);
        if self.encoding == HashEncoding::Hashtable {
            let (removed, _) = self.pairs.swap_remove(i);
            let moved = self.pairs.get(i).map(|(f, _)| f.as_slice());
            self.lookup.swap_removed(&removed, i, moved);
        } else {
            self.pairs.remove(i);
            self.lookup.reset();
        }
        true
    }

    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self.pairs.iter().map(|(f, v)| f.len() + v.len() + 2).sum();
        let mut out = Vec::with_capacity(1 + VARINT_MAX_BYTES + body);
        out.push(self.encoding_byte());
        put_varint(&mut out, self.pairs.len() as u32);
        for (f, v) in &self.pairs {
            put_bytes(&mut out, f);
            put_bytes(&mut out, v);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<HashValue, CodecError> {
        let mut r = Reader { b, at: 0 };
        let encoding = match r.u8()? {
            0 => HashEncoding::Listpack,
            1 => HashEncoding::Hashtable,
            _ => return Err(CodecError::Malformed("unknown hash encoding")),
        };
        let n = r.count(2)?;
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(n);
        for _ in 0..n {
            let f = r.bytes()?.to_vec();
            let v = r.bytes()?.to_vec();
            pairs.push((f, v));
        }
        r.finish()?;
        if n == 0 {
            return Err(CodecError::Malformed("empty hash"));
        }
        if has_duplicates(pairs.iter().map(|(f, _)| f.as_slice())) {
            return Err(CodecError::Malformed("duplicate hash field"));
        }
        Ok(HashValue {
            encoding,
            pairs,
            lookup: Lookup::default(),
            origin: PagedOrigin::default(),
        })
    }
}

fn has_duplicates<'a>(items: impl Iterator<Item = &'a [u8]>) -> bool {
    let mut seen = std::collections::HashSet::new();
    items.into_iter().any(|i| !seen.insert(i))
}

// ---- sets -------------------------------------------------------------------------------

/// A set: members in Redis's order for its encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetValue {
    encoding: SetEncoding,
    members: Vec<Vec<u8>>,
    lookup: Lookup,
    origin: PagedOrigin,
}

impl Default for SetValue {
    fn default() -> Self {
        SetValue::new()
    }
}

/// Redis's `string2ll` acceptance: what an intset may hold.
pub fn as_set_int(member: &[u8]) -> Option<i64> {
    parse_i64(member)
}

impl SetValue {
    /// An empty set as Redis's `createIntsetObject` makes it (the destination of
    /// SUNIONSTORE/SINTERSTORE/SDIFFSTORE, filled member by member).
    pub fn new() -> SetValue {
        SetValue {
            encoding: SetEncoding::Intset,
            members: Vec::new(),
            lookup: Lookup::default(),
            origin: PagedOrigin::default(),
        }
    }

    /// An empty set for a key created by a command adding `size_hint` members, the first of
    /// which is `first` (Redis's `setTypeCreate`).
    pub fn create(first: &[u8], size_hint: usize) -> SetValue {
        let encoding = if as_set_int(first).is_some() && size_hint <= SET_MAX_INTSET_ENTRIES {
            SetEncoding::Intset
        } else if size_hint <= SET_MAX_LISTPACK_ENTRIES {
            SetEncoding::Listpack
        } else {
            SetEncoding::Hashtable
        };
        SetValue {
            encoding,
            members: Vec::new(),
            lookup: Lookup::default(),
            origin: PagedOrigin::default(),
        }
    }

    /// Redis's `setTypeMaybeConvert` before adding `size_hint` members to an existing set.
    pub fn prepare_add(&mut self, size_hint: usize) {
        let too_many = match self.encoding {
            SetEncoding::Intset => size_hint > SET_MAX_INTSET_ENTRIES,
            SetEncoding::Listpack => size_hint > SET_MAX_LISTPACK_ENTRIES,
            SetEncoding::Hashtable => false,
        };
        if too_many {
            self.encoding = SetEncoding::Hashtable;
        }
    }

    pub fn encoding(&self) -> SetEncoding {
        self.encoding
    }

    /// A set read from pages (hashtable encoding, members in position order).
    pub fn from_paged(members: Vec<Vec<u8>>, tree: crate::storage::paged::Tree) -> SetValue {
        SetValue {
            encoding: SetEncoding::Hashtable,
            members,
            lookup: Lookup::default(),
            origin: PagedOrigin(Some(Box::new(tree))),
        }
    }

    /// The page tree this value was loaded from, if it is stored paged.
    pub fn paged_tree(&self) -> Option<&crate::storage::paged::Tree> {
        self.origin.0.as_deref()
    }

    /// Bytes of the members in the encoding (without the header).
    pub fn body_bytes(&self) -> usize {
        self.members
            .iter()
            .map(crate::storage::paged::elem_bytes)
            .sum()
    }

    /// The encoding byte of `encode`.
    pub fn encoding_byte(&self) -> u8 {
        match self.encoding {
            SetEncoding::Intset => 0,
            SetEncoding::Listpack => 1,
            SetEncoding::Hashtable => 2,
        }
    }

    /// Members of the whole set (for a partial load, with those not read).
    pub fn len(&self) -> usize {
        self.members.len() + self.origin.rest_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn members(&self) -> &[Vec<u8>] {
        &self.members
    }

    fn position(&self, member: &[u8]) -> Option<usize> {
        if self.encoding == SetEncoding::Intset {
            let v = as_set_int(member)?;
            return self.int_search(v).ok();
        }
        if self.members.len() < LOOKUP_MIN_ELEMENTS {
            return self.members.iter().position(|m| m == member);
        }
        self.lookup
            .find(member, self.members.iter().map(|m| m.as_slice()))
    }

    fn int_search(&self, v: i64) -> Result<usize, usize> {
        self.members
            .binary_search_by_key(&v, |m| as_set_int(m).expect("intset holds integers"))
    }

    pub fn contains(&self, member: &[u8]) -> bool {
        self.position(member).is_some()
    }

    /// Adds `member`; true if it is new. Converts as Redis's `setTypeAdd` does.
    pub fn add(&mut self, member: &[u8]) -> bool {
        if self.encoding == SetEncoding::Intset {
            if let Some(v) = as_set_int(member) {
                let Err(at) = self.int_search(v) else {
                    return false;
                };
                self.members.insert(at, member.to_vec());
                self.lookup.reset();
                if self.members.len() > SET_MAX_INTSET_ENTRIES {
                    self.encoding = SetEncoding::Hashtable;
                }
                return true;
            }
            // A non-integer: the intset becomes a listpack if everything fits, else a
            // hashtable (an intset's longest decimal is 20 bytes, below the value limit).
            self.encoding = if self.members.len() < SET_MAX_LISTPACK_ENTRIES
                && member.len() <= SET_MAX_LISTPACK_VALUE_BYTES
            {
                SetEncoding::Listpack
            } else {
                SetEncoding::Hashtable
            };
            self.members.push(member.to_vec());
            self.lookup.reset();
            return true;
        }
        if self.position(member).is_some() {
            return false;
        }
        self.origin.touch(member);
        if self.encoding == SetEncoding::Listpack
            && (self.members.len() >= SET_MAX_LISTPACK_ENTRIES
                || member.len() > SET_MAX_LISTPACK_VALUE_BYTES)
        {
            self.encoding = SetEncoding::Hashtable;
        }
        self.members.push(member.to_vec());
        self.lookup.pushed(member, self.members.len() - 1);
        true
    }

    /// Removes `member`; true if it was there. The others keep their order, except in the
    /// hashtable encoding (order unspecified in Redis): the last member takes its place.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match self.position(member) {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Removes and returns the member at `index` (for SPOP), as `remove` does.
    pub fn remove_at(&mut self, index: usize) -> Vec<u8> {
        if let Some(m) = self.members.get(index) {
            let m = m.clone();
            self.origin.touch(&m);
        }
        if self.encoding == SetEncoding::Hashtable {
            let removed = self.members.swap_remove(index);
            let moved = self.members.get(index).map(|m| m.as_slice());
            self.lookup.swap_removed(&removed, index, moved);
            removed
        } else {
            self.lookup.reset();
            self.members.remove(index)
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self.members.iter().map(|m| m.len() + 1).sum();
        let mut out = Vec::with_capacity(1 + VARINT_MAX_BYTES + body);
        out.push(self.encoding_byte());
        put_varint(&mut out, self.members.len() as u32);
        for m in &self.members {
            put_bytes(&mut out, m);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<SetValue, CodecError> {
        let mut r = Reader { b, at: 0 };
        let encoding = match r.u8()? {
            0 => SetEncoding::Intset,
            1 => SetEncoding::Listpack,
            2 => SetEncoding::Hashtable,
            _ => return Err(CodecError::Malformed("unknown set encoding")),
        };
        let n = r.count(1)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(r.bytes()?.to_vec());
        }
        r.finish()?;
        if n == 0 {
            return Err(CodecError::Malformed("empty set"));
        }
        if encoding == SetEncoding::Intset {
            let mut prev: Option<i64> = None;
            for m in &members {
                let v =
                    as_set_int(m).ok_or(CodecError::Malformed("intset member not an integer"))?;
                if prev.is_some_and(|p| p >= v) {
                    return Err(CodecError::Malformed("intset not ascending"));
                }
                prev = Some(v);
            }
        } else if has_duplicates(members.iter().map(|m| m.as_slice())) {
            return Err(CodecError::Malformed("duplicate set member"));
        }
        Ok(SetValue {
            encoding,
            members,
            lookup: Lookup::default(),
            origin: PagedOrigin::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    // A known hash literal decodes to its pairs in order, and encodes back to the same bytes.
    #[test]
    fn hash_known_bytes() {
        let bytes = b"\x00\x02\x01a\x02xy\x01b\x00";
        let h = HashValue::decode(bytes).unwrap();
        assert_eq!(h.encoding(), HashEncoding::Listpack);
        assert_eq!(h.get(b"a"), Some(&b"xy"[..]));
        assert_eq!(h.get(b"b"), Some(&b""[..]));
        assert_eq!(h.pairs()[0].0, b"a");
        assert_eq!(h.encode(), bytes);
    }

    // A set built by commands encodes to the documented bytes (intset, ascending).
    #[test]
    fn set_emit_bytes() {
        let mut s = SetValue::create(b"10", 3);
        assert!(s.add(b"10"));
        assert!(s.add(b"-2"));
        assert!(!s.add(b"10"));
        assert_eq!(s.encode(), b"\x00\x02\x02-2\x0210");
        assert!(s.add(b"x"));
        assert_eq!(s.encoding(), SetEncoding::Listpack);
        assert_eq!(s.encode(), b"\x01\x03\x02-2\x0210\x01x");
        assert_eq!(SetValue::decode(&s.encode()).unwrap(), s);
    }

    // Every proper prefix of a valid encoding is rejected, never misread.
    #[test]
    fn truncated() {
        let mut h = HashValue::new();
        h.set(b"field", b"value");
        h.set(&[7u8; 200], b"v");
        let hb = h.encode();
        for n in 0..hb.len() {
            assert!(HashValue::decode(&hb[..n]).is_err(), "hash prefix {n}");
        }
        let mut s = SetValue::create(b"a", 2);
        s.add(b"a");
        s.add(&[9u8; 300]);
        let sb = s.encode();
        for n in 0..sb.len() {
            assert!(SetValue::decode(&sb[..n]).is_err(), "set prefix {n}");
        }
    }

    // Malformed encodings (bad tag, duplicates, unordered intset, trailing bytes, huge
    // counts, non-canonical varints, empty collections) are errors.
    #[test]
    fn malformed() {
        for b in [
            &b"\x02\x01\x01a\x01b"[..],
            b"\x00\x02\x01a\x01b\x01a\x01c",
            b"\x00\x01\x01a\x01bX",
            b"\x00\xff\xff\xff\xff\x0f",
            b"\x00\x81\x00\x01a\x01b",
            b"\x00\x00",
            b"\x00\x01\xff\xff\xff\xff\xff\x01a",
        ] {
            assert!(HashValue::decode(b).is_err(), "{b:?}");
        }
        for b in [
            &b"\x03\x01\x01a"[..],
            b"\x00\x02\x012\x011",
            b"\x00\x01\x01x",
            b"\x00\x01\x0201",
            b"\x01\x02\x01a\x01a",
            b"\x02\x00",
            b"\x01\x01\x01a\x00",
        ] {
            assert!(SetValue::decode(b).is_err(), "{b:?}");
        }
    }

    // Redis's conversion thresholds: entries and value length for hashes; intset, listpack
    // and hashtable for sets, including the creation hint.
    #[test]
    fn conversions() {
        let mut h = HashValue::new();
        for i in 0..HASH_MAX_LISTPACK_ENTRIES {
            h.set(i.to_string().as_bytes(), b"v");
        }
        assert_eq!(h.encoding(), HashEncoding::Listpack);
        h.set(b"one more", b"v");
        assert_eq!(h.encoding(), HashEncoding::Hashtable);
        h.remove(b"one more");
        assert_eq!(h.encoding(), HashEncoding::Hashtable, "no demotion");
        let mut h = HashValue::new();
        h.set(b"f", &[b'x'; 65]);
        assert_eq!(h.encoding(), HashEncoding::Hashtable);

        let mut s = SetValue::create(b"1", 1);
        for i in 0..SET_MAX_INTSET_ENTRIES {
            s.add(i.to_string().as_bytes());
        }
        assert_eq!(s.encoding(), SetEncoding::Intset);
        s.add(b"100000");
        assert_eq!(s.encoding(), SetEncoding::Hashtable);
        assert_eq!(
            SetValue::create(b"a", 128).encoding(),
            SetEncoding::Listpack
        );
        assert_eq!(
            SetValue::create(b"a", 129).encoding(),
            SetEncoding::Hashtable
        );
        assert_eq!(SetValue::create(b"01", 1).encoding(), SetEncoding::Listpack);
        let mut s = SetValue::create(b"a", 1);
        s.add(&[b'y'; 65]);
        assert_eq!(s.encoding(), SetEncoding::Hashtable);
    }

    // Big collections answer lookups through the index, kept right across adds and
    // swap-removals (hashtable) and order-keeping removals (listpack).
    #[test]
    fn lookup_stays_consistent() {
        let mut s = SetValue::create(b"a", 1000);
        let mut h = HashValue::new();
        h.prepare_write(1000, 1);
        for i in 0..300 {
            let m = format!("m{i}");
            assert!(s.add(m.as_bytes()));
            assert!(h.set(m.as_bytes(), b"v"));
        }
        for i in (0..300).step_by(3) {
            let m = format!("m{i}");
            assert!(s.remove(m.as_bytes()));
            assert!(h.remove(m.as_bytes()));
        }
        for i in 0..300 {
            let m = format!("m{i}");
            assert_eq!(s.contains(m.as_bytes()), i % 3 != 0, "{m}");
            assert_eq!(h.get(m.as_bytes()).is_some(), i % 3 != 0, "{m}");
        }
        assert_eq!(SetValue::decode(&s.encode()).unwrap(), s);
        let mut l = SetValue::create(b"a", 100);
        for i in 0..100 {
            l.add(format!("x{i}").as_bytes());
        }
        l.remove(b"x5");
        assert!(l.contains(b"x99") && !l.contains(b"x5"));
        assert_eq!(l.members()[5], b"x6", "listpack keeps order");
    }

    proptest::proptest! {
        // Any hash built by set/remove round-trips through its bytes unchanged.
        #[test]
        fn hash_round_trip(ops in proptest::collection::vec(
            (proptest::collection::vec(0u8..4, 0..3), proptest::collection::vec(proptest::num::u8::ANY, 0..80), proptest::bool::ANY), 0..60)) {
            let mut h = HashValue::new();
            for (f, v, del) in &ops {
                if *del { h.remove(f); } else { h.set(f, v); }
            }
            if h.is_empty() {
                proptest::prop_assert!(HashValue::decode(&h.encode()).is_err());
            } else {
                proptest::prop_assert_eq!(HashValue::decode(&h.encode()).unwrap(), h);
            }
        }

        // Any set built by add/remove round-trips, and an intset stays ascending.
        #[test]
        fn set_round_trip(ops in proptest::collection::vec(
            (proptest::prop_oneof![
                (-50i64..50).prop_map(|v| v.to_string().into_bytes()),
                proptest::collection::vec(proptest::num::u8::ANY, 0..70),
                (0u8..60).prop_map(|v| vec![b'k', v])
            ], proptest::bool::ANY), 1..200)) {
            let mut s = SetValue::create(&ops[0].0, ops.len());
            let mut model = std::collections::BTreeSet::new();
            for (m, del) in &ops {
                if *del {
                    proptest::prop_assert_eq!(s.remove(m), model.remove(m));
                } else {
                    proptest::prop_assert_eq!(s.add(m), model.insert(m.clone()));
                }
            }
            proptest::prop_assert_eq!(s.len(), model.len());
            for m in &model {
                proptest::prop_assert!(s.contains(m));
            }
            if s.is_empty() {
                proptest::prop_assert!(SetValue::decode(&s.encode()).is_err());
            } else {
                proptest::prop_assert_eq!(SetValue::decode(&s.encode()).unwrap(), s);
            }
        }
    }
}
