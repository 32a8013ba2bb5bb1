//! The value encoding of sorted sets (value kind 4; stage 1 of `docs/collections.md`: one
//! record holds the whole sorted set), specified in `docs/storage-format.md` section 9.
//!
//! What it owns. The bytes of a `ZSet` record and `ZSetValue`, the in-memory form commands
//! work on: the (score, member) pairs in Redis's order (ascending score, ties by member
//! bytes) plus a member → score map built at decode, so ZSCORE and ZADD's lookups do not
//! scan.
//!
//! Invariants (checked by `decode`, kept by every method): no NaN score, no two pairs with
//! the same member, pairs strictly ascending by (score, member). The encoding tag follows
//! Redis's rules (`zset-max-listpack-entries` 128, `zset-max-listpack-value` 64): a set that
//! grows past them becomes a skiplist and a mutation never demotes it; freshly built results
//! (the *STORE commands) take the smallest encoding that fits, as Redis converts them.
//!
//! A big sorted set is stored paged (`paged_zset.rs`, `docs/collections.md` section 4b);
//! commands that read it whole get a `ZSetValue` that remembers it (`from_paged`).

use std::cmp::Ordering;
use std::collections::HashMap;

/// `zset-max-listpack-entries`.
pub const ZSET_MAX_LISTPACK_ENTRIES: usize = 128;
/// `zset-max-listpack-value`: a member longer than this makes the set a skiplist.
pub const ZSET_MAX_LISTPACK_VALUE_BYTES: usize = 64;

const VARINT_MAX_BYTES: usize = 5;
/// Bytes of one pair at least: an 8-byte score and a one-byte member length.
const PAIR_MIN_BYTES: usize = 9;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ZSetCodecError {
    #[error("sorted set value truncated at byte {0}")]
    Truncated(usize),
    #[error("sorted set value malformed: {0}")]
    Malformed(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZSetEncoding {
    Listpack,
    Skiplist,
}

impl ZSetEncoding {
    /// The name OBJECT ENCODING reports.
    pub fn name(self) -> &'static str {
        match self {
            ZSetEncoding::Listpack => "listpack",
            ZSetEncoding::Skiplist => "skiplist",
        }
    }
}

/// Redis's order of two pairs: score (`-0` equals `0`), then member bytes.
pub fn pair_cmp(a_score: f64, a_member: &[u8], b_score: f64, b_member: &[u8]) -> Ordering {
    a_score
        .partial_cmp(&b_score)
        .expect("scores are never NaN")
        .then_with(|| a_member.cmp(b_member))
}

/// Redis 7.2's `d2string`: `inf`/`-inf`, `0`/`-0`, integral values within ±2^62 as
/// integers, everything else as `fpconv_dtoa` lays out the shortest round-trip digits.
pub fn format_score(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let half_max = (i64::MAX / 2) as f64;
    if v.trunc() == v && (-half_max..=half_max).contains(&v) {
        return (v as i64).to_string();
    }
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let e10: i32 = exp.parse().expect("decimal exponent");
    let nd = digits.len() as i32;
    let k = e10 - (nd - 1);
    let mut out = String::with_capacity(24);
    if v < 0.0 {
        out.push('-');
    }
    let exp_abs = e10.abs();
    if k >= 0 && exp_abs < nd + 7 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', k as usize));
    } else if k < 0 && (k > -7 || exp_abs < 4) {
        let offset = nd + k;
        if offset <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-offset) as usize));
            out.push_str(&digits);
        } else {
            out.push_str(&digits[..offset as usize]);
            out.push('.');
            out.push_str(&digits[offset as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if nd > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if e10 < 0 { '-' } else { '+' });
        out.push_str(&exp_abs.to_string());
    }
    out
}

#[derive(Clone, Debug, Default)]
pub struct ZSetValue {
    encoding: Option<ZSetEncoding>,
    pairs: Vec<(f64, Vec<u8>)>,
    scores: HashMap<Vec<u8>, f64>,
    /// Read whole from a paged sorted set (`paged_zset.rs`): stored paged again unless it
    /// fell under the demotion threshold. Not part of the value (equality ignores it).
    paged_origin: bool,
}

impl PartialEq for ZSetValue {
    fn eq(&self, o: &ZSetValue) -> bool {
        self.encoding() == o.encoding()
            && self.pairs.len() == o.pairs.len()
            && self
                .pairs
                .iter()
                .zip(&o.pairs)
                .all(|(a, b)| a.0.to_bits() == b.0.to_bits() && a.1 == b.1)
    }
}

impl Eq for ZSetValue {}

impl ZSetValue {
    pub fn new() -> ZSetValue {
        ZSetValue::default()
    }

    /// An empty set that will hold about `size_hint` members of at most `longest_bytes`
    /// (Redis's `zsetTypeCreate`: a skiplist from the start when they cannot fit a listpack).
    pub fn with_hint(size_hint: usize, longest_bytes: usize) -> ZSetValue {
        let mut z = ZSetValue::new();
        if size_hint > ZSET_MAX_LISTPACK_ENTRIES || longest_bytes > ZSET_MAX_LISTPACK_VALUE_BYTES {
            z.encoding = Some(ZSetEncoding::Skiplist);
        }
        z
    }

    pub fn encoding(&self) -> ZSetEncoding {
        self.encoding.unwrap_or(ZSetEncoding::Listpack)
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The pairs in ascending (score, member) order.
    pub fn pairs(&self) -> &[(f64, Vec<u8>)] {
        &self.pairs
    }

    pub fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// Where (score, member) sits or would sit.
    fn position(&self, score: f64, member: &[u8]) -> Result<usize, usize> {
        self.pairs
            .binary_search_by(|(s, m)| pair_cmp(*s, m, score, member))
    }

    /// 0-based ascending rank of `member`.
    pub fn rank(&self, member: &[u8]) -> Option<usize> {
        let s = self.score(member)?;
        self.position(s, member).ok()
    }

    /// Sets `member`'s score, adding it if new; returns the previous score.
    pub fn insert(&mut self, member: &[u8], score: f64) -> Option<f64> {
        debug_assert!(!score.is_nan());
        let old = self.remove(member);
        if old.is_none()
            && (self.pairs.len() + 1 > ZSET_MAX_LISTPACK_ENTRIES
                || member.len() > ZSET_MAX_LISTPACK_VALUE_BYTES)
        {
            self.encoding = Some(ZSetEncoding::Skiplist);
        }
        let at = self.position(score, member).unwrap_err();
        self.pairs.insert(at, (score, member.to_vec()));
        self.scores.insert(member.to_vec(), score);
        old
    }

    /// Removes `member`; returns its score.
    pub fn remove(&mut self, member: &[u8]) -> Option<f64> {
        let s = self.scores.remove(member)?;
        let at = self.position(s, member).expect("map and pairs agree");
        self.pairs.remove(at);
        Some(s)
    }

    /// Removes and returns the pairs at ranks `range` (ascending).
    pub fn remove_ranks(&mut self, range: std::ops::Range<usize>) -> Vec<(f64, Vec<u8>)> {
        let gone: Vec<(f64, Vec<u8>)> = self.pairs.drain(range).collect();
        for (_, m) in &gone {
            self.scores.remove(m);
        }
        gone
    }

    /// A freshly built result (ZUNIONSTORE, ZRANGESTORE, ...): pairs in any order, distinct
    /// members; the smallest encoding that fits, as Redis converts a stored result.
    pub fn from_pairs(mut pairs: Vec<(f64, Vec<u8>)>) -> ZSetValue {
        pairs.sort_by(|a, b| pair_cmp(a.0, &a.1, b.0, &b.1));
        let fits = pairs.len() <= ZSET_MAX_LISTPACK_ENTRIES
            && pairs
                .iter()
                .all(|(_, m)| m.len() <= ZSET_MAX_LISTPACK_VALUE_BYTES);
        let scores = pairs.iter().map(|(s, m)| (m.clone(), *s)).collect();
        ZSetValue {
            encoding: Some(if fits {
                ZSetEncoding::Listpack
            } else {
                ZSetEncoding::Skiplist
            }),
            pairs,
            scores,
            paged_origin: false,
        }
    }

    /// A skiplist of `pairs` (in order, distinct members) read whole from a paged sorted set.
    pub fn from_paged(pairs: Vec<(f64, Vec<u8>)>) -> ZSetValue {
        let scores = pairs.iter().map(|(s, m)| (m.clone(), *s)).collect();
        ZSetValue {
            encoding: Some(ZSetEncoding::Skiplist),
            pairs,
            scores,
            paged_origin: true,
        }
    }

    /// Stored as one record from now on (a paged sorted set demoted by its command).
    pub fn forget_paged_origin(&mut self) {
        self.paged_origin = false;
    }

    /// Whether this value was read from a paged sorted set.
    pub fn paged_origin(&self) -> bool {
        self.paged_origin
    }

    /// Bytes the members take in a paged sorted set's member tree (the promotion measure,
    /// `docs/collections.md` section 4b): per member its length varint, bytes and score.
    pub fn member_bytes(&self) -> usize {
        self.pairs
            .iter()
            .map(|(_, m)| m.len() + 10 + usize::from(m.len() >= 128))
            .sum()
    }

    /// Layout: encoding byte (0 listpack, 1 skiplist), varint count, then per pair the
    /// score as 8 little-endian bytes of its IEEE-754 bits and the member as a string.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(8 + self.pairs.iter().map(|p| p.1.len() + 10).sum::<usize>());
        out.push(match self.encoding() {
            ZSetEncoding::Listpack => 0,
            ZSetEncoding::Skiplist => 1,
        });
        put_varint(&mut out, self.pairs.len() as u32);
        for (s, m) in &self.pairs {
            out.extend_from_slice(&s.to_bits().to_le_bytes());
            put_varint(&mut out, m.len() as u32);
            out.extend_from_slice(m);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<ZSetValue, ZSetCodecError> {
        let mut r = Reader { b, at: 0 };
        let encoding = match r.u8()? {
            0 => ZSetEncoding::Listpack,
            1 => ZSetEncoding::Skiplist,
            _ => return Err(ZSetCodecError::Malformed("unknown encoding")),
        };
        let n = r.varint()? as usize;
        if n == 0 {
            return Err(ZSetCodecError::Malformed("empty sorted set"));
        }
        if n.saturating_mul(PAIR_MIN_BYTES) > b.len() - r.at {
            return Err(ZSetCodecError::Truncated(b.len()));
        }
        let mut pairs: Vec<(f64, Vec<u8>)> = Vec::with_capacity(n);
        for _ in 0..n {
            let bits = r.take(8)?;
            let score = f64::from_bits(u64::from_le_bytes(bits.try_into().expect("8 bytes")));
            if score.is_nan() {
                return Err(ZSetCodecError::Malformed("NaN score"));
            }
            let len = r.varint()? as usize;
            let member = r.take(len)?.to_vec();
            if let Some(prev) = pairs.last() {
                if pair_cmp(prev.0, &prev.1, score, &member) != Ordering::Less {
                    return Err(ZSetCodecError::Malformed("pairs out of order"));
                }
            }
            pairs.push((score, member));
        }
        if r.at != b.len() {
            return Err(ZSetCodecError::Malformed("trailing bytes"));
        }
        let scores: HashMap<Vec<u8>, f64> = pairs.iter().map(|(s, m)| (m.clone(), *s)).collect();
        if scores.len() != pairs.len() {
            return Err(ZSetCodecError::Malformed("duplicate member"));
        }
        Ok(ZSetValue {
            encoding: Some(encoding),
            pairs,
            scores,
            paged_origin: false,
        })
    }
}

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
    fn u8(&mut self) -> Result<u8, ZSetCodecError> {
        Ok(self.take(1)?[0])
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ZSetCodecError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(ZSetCodecError::Truncated(self.b.len()))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// LEB128, at most 5 bytes, canonical.
    fn varint(&mut self) -> Result<u32, ZSetCodecError> {
        let mut v: u64 = 0;
        for i in 0..VARINT_MAX_BYTES {
            let byte = self.u8()?;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if i > 0 && byte == 0 {
                    return Err(ZSetCodecError::Malformed("non-canonical varint"));
                }
                return u32::try_from(v).map_err(|_| ZSetCodecError::Malformed("varint overflow"));
            }
        }
        Err(ZSetCodecError::Malformed("varint too long"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ZADD z 1.5 a 1 b` as stored.
    const KNOWN: &[u8] = &[
        0x00, 0x02, // listpack, 2 pairs
        0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x01, b'b', // 1.0 "b"
        0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x01, b'a', // 1.5 "a"
    ];

    fn known_value() -> ZSetValue {
        let mut z = ZSetValue::new();
        z.insert(b"a", 1.5);
        z.insert(b"b", 1.0);
        z
    }

    // A known byte literal decodes to the pairs in score order with working lookups.
    #[test]
    fn parse_known() {
        let z = ZSetValue::decode(KNOWN).unwrap();
        assert_eq!(z, known_value());
        assert_eq!(z.score(b"a"), Some(1.5));
        assert_eq!(z.rank(b"a"), Some(1));
        assert_eq!(z.encoding(), ZSetEncoding::Listpack);
    }

    // Encoding the same set gives exactly the known bytes.
    #[test]
    fn emit_known() {
        assert_eq!(known_value().encode(), KNOWN);
    }

    // Every strict prefix of a valid value is rejected.
    #[test]
    fn truncated() {
        for n in 0..KNOWN.len() {
            assert!(ZSetValue::decode(&KNOWN[..n]).is_err(), "prefix {n}");
        }
    }

    // Out-of-order pairs, duplicates, NaN, an unknown tag, an empty set and trailing bytes
    // are all corrupt.
    #[test]
    fn malformed() {
        let mut swapped = vec![0x00, 0x02];
        swapped.extend_from_slice(&KNOWN[12..]);
        swapped.extend_from_slice(&KNOWN[2..12]);
        assert!(ZSetValue::decode(&swapped).is_err());
        let mut dup = vec![0x00, 0x02];
        dup.extend_from_slice(&KNOWN[2..12]);
        dup.extend_from_slice(&2.0f64.to_bits().to_le_bytes());
        dup.extend_from_slice(&[1, b'b']);
        assert!(ZSetValue::decode(&dup).is_err());
        let mut nan = vec![0x00, 0x01];
        nan.extend_from_slice(&f64::NAN.to_bits().to_le_bytes());
        nan.extend_from_slice(&[1, b'x']);
        assert!(ZSetValue::decode(&nan).is_err());
        let mut tag = KNOWN.to_vec();
        tag[0] = 7;
        assert!(ZSetValue::decode(&tag).is_err());
        assert!(ZSetValue::decode(&[0, 0]).is_err());
        let mut trailing = KNOWN.to_vec();
        trailing.push(0);
        assert!(ZSetValue::decode(&trailing).is_err());
    }

    // Growing past 128 members or adding a 65-byte member makes a skiplist; removing does
    // not demote; a built result takes the encoding that fits.
    #[test]
    fn encoding_rules() {
        let mut z = ZSetValue::new();
        for i in 0..128 {
            z.insert(format!("m{i}").as_bytes(), i as f64);
        }
        assert_eq!(z.encoding(), ZSetEncoding::Listpack);
        z.insert(b"one-more", 0.0);
        assert_eq!(z.encoding(), ZSetEncoding::Skiplist);
        z.remove(b"one-more");
        assert_eq!(z.encoding(), ZSetEncoding::Skiplist);
        let mut w = ZSetValue::new();
        w.insert(&[b'x'; 65], 1.0);
        assert_eq!(w.encoding(), ZSetEncoding::Skiplist);
        let r = ZSetValue::from_pairs(z.pairs()[..3].to_vec());
        assert_eq!(r.encoding(), ZSetEncoding::Listpack);
    }

    proptest::proptest! {
        // Any sequence of inserts and removes round-trips through the bytes, and the pairs
        // stay sorted and agree with a model map.
        #[test]
        fn round_trip(ops in proptest::collection::vec((0u8..20, -4i32..4, proptest::bool::ANY), 1..60)) {
            let mut z = ZSetValue::new();
            let mut model = std::collections::BTreeMap::new();
            for (m, s, add) in ops {
                let member = vec![b'a' + m];
                if add {
                    z.insert(&member, s as f64 / 2.0);
                    model.insert(member, s as f64 / 2.0);
                } else {
                    z.remove(&member);
                    model.remove(&member);
                }
            }
            proptest::prop_assert_eq!(z.len(), model.len());
            for (m, s) in &model {
                proptest::prop_assert_eq!(z.score(m), Some(*s));
            }
            if !z.is_empty() {
                let back = ZSetValue::decode(&z.encode()).unwrap();
                proptest::prop_assert!(back == z);
            }
        }
    }
}
