//! Redis's serialization format for one value, as DUMP emits and RESTORE takes it: an RDB
//! object (type byte + body), the RDB version as 2 little-endian bytes, and a CRC-64/Jones
//! of everything before it, as 8 little-endian bytes. Sans-IO: bytes in, bytes out.
//!
//! What it owns: the object encodings of the types lavik has — strings (verbatim,
//! integer-encoded in 8/16/32 bits, LZF-compressed), hashes (`HASH`, `HASH_LISTPACK`, and
//! on input `HASH_ZIPLIST`, `HASH_ZIPMAP`), sets (`SET`, `SET_INTSET`, and on input
//! `SET_LISTPACK`), sorted sets (`ZSET_LISTPACK`, `ZSET_2`, and on input `ZSET`,
//! `ZSET_ZIPLIST`), lists (`LIST_QUICKLIST_2` with listpack nodes, and on input
//! `LIST_QUICKLIST`, `LIST_ZIPLIST`, `LIST`) — and the compact blobs inside them (`blob`),
//! LZF (`lzf`) and the checksum (`crc64`).
//!
//! Version: lavik reports Redis 7.2, whose payloads say RDB 11, but Redis 7.0 (Debian's
//! 7.0.15, and many deployments migrating with DUMP/RESTORE) refuses any version above 10.
//! Every encoding lavik emits exists in RDB 10, so DUMP writes version 10 and its output is
//! what Redis 7.0 writes for the same encoding (a listpack set, which 7.0 does not have, is
//! written as a plain `SET`, as 7.0 would hold those members in a hashtable). RESTORE
//! accepts versions up to 11 (so 7.2's `SET_LISTPACK` payloads load too).
//!
//! Emission is byte-identical to Redis for strings, listpack hashes, intset sets and
//! sorted sets in both encodings (a score written as text uses 7.2's `d2string`, which 7.0
//! matches for integers and short binary fractions) and lists (one node for a listpack; a
//! quicklist's nodes as lavik models Redis's; the layouts are deterministic); for hashtable
//! hashes and listpack/hashtable sets the body is
//! the same type but the element order is lavik's (Redis's follows its dict's buckets).

pub mod blob;
pub mod crc64;
pub mod lzf;

use crate::resp::parse::parse_i64;
use crate::storage::collection::{as_set_int, HashEncoding, HashValue, SetEncoding, SetValue};
use crate::storage::list_codec::ListValue;
use crate::storage::zset::{format_score, ZSetEncoding, ZSetValue};

/// The RDB version DUMP writes (Redis 7.0's; see the module comment).
pub const RDB_VERSION_EMITTED: u16 = 10;
/// The newest RDB version RESTORE accepts (Redis 7.2's).
pub const RDB_VERSION_ACCEPTED_MAX: u16 = 11;
/// Version (2 bytes) and CRC-64 (8 bytes) after the object.
pub const FOOTER_BYTES: usize = 10;
/// Redis does not try LZF on strings of up to 20 bytes.
const LZF_MIN_INPUT_BYTES: usize = 21;
/// Nor keeps a compression that saves fewer than 4 bytes... it asks for at most len - 4.
const LZF_SAVING_MIN_BYTES: usize = 4;
/// Redis tries the integer encoding on strings of up to 11 bytes ("-2147483648").
const INT_ENCODING_MAX_BYTES: usize = 11;

/// RDB object type bytes (rdb.h `RDB_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ObjectType {
    String = 0,
    List = 1,
    Set = 2,
    Zset = 3,
    Hash = 4,
    Zset2 = 5,
    HashZipmap = 9,
    ListZiplist = 10,
    SetIntset = 11,
    ZsetZiplist = 12,
    HashZiplist = 13,
    ListQuicklist = 14,
    HashListpack = 16,
    ZsetListpack = 17,
    ListQuicklist2 = 18,
    SetListpack = 20,
}

/// Quicklist node containers (quicklist.h `QUICKLIST_NODE_CONTAINER_*`).
const QUICKLIST_CONTAINER_PLAIN: usize = 1;
const QUICKLIST_CONTAINER_PACKED: usize = 2;

/// Length-prefix forms (rdb.h `RDB_6BITLEN`.. and `RDB_ENC_*`).
const LEN_14BIT_TAG: u8 = 0x40;
const LEN_32BIT: u8 = 0x80;
const LEN_64BIT: u8 = 0x81;
const ENCODED_TAG: u8 = 0xc0;
const ENC_INT8: u8 = 0;
const ENC_INT16: u8 = 1;
const ENC_INT32: u8 = 2;
const ENC_LZF: u8 = 3;

/// A value lavik can hold, as it moves through DUMP/RESTORE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdbValue {
    String(Vec<u8>),
    Hash(HashValue),
    Set(SetValue),
    ZSet(ZSetValue),
    List(ListValue),
}

/// Why RESTORE refuses a payload; the two texts are Redis's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpError {
    /// Too short, a newer RDB version, or a checksum mismatch.
    VersionOrChecksum,
    /// The object does not parse (or is of a type lavik does not store yet).
    BadFormat(&'static str),
}

impl DumpError {
    pub fn reply_text(self) -> &'static str {
        match self {
            DumpError::VersionOrChecksum => "ERR DUMP payload version or checksum are wrong",
            DumpError::BadFormat(_) => "ERR Bad data format",
        }
    }
}

impl From<blob::Malformed> for DumpError {
    fn from(m: blob::Malformed) -> Self {
        DumpError::BadFormat(m.0)
    }
}

type Result<T> = std::result::Result<T, DumpError>;

/// `s` as an integer if it is one's canonical text (Redis's `string2ll`, which, unlike
/// `parse_i64`, refuses "-0").
pub fn canonical_int(s: &[u8]) -> Option<i64> {
    parse_i64(s).filter(|v| v.to_string().as_bytes() == s)
}

// ---- emit -------------------------------------------------------------------------------

fn put_len(out: &mut Vec<u8>, n: usize) {
    if n < 64 {
        out.push(n as u8);
    } else if n < 16384 {
        out.push(LEN_14BIT_TAG | (n >> 8) as u8);
        out.push(n as u8);
    } else if let Ok(n32) = u32::try_from(n) {
        out.push(LEN_32BIT);
        out.extend_from_slice(&n32.to_be_bytes());
    } else {
        out.push(LEN_64BIT);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
}

/// Redis's `rdbSaveRawString`: integer encoding for short canonical integers that fit
/// 32 bits, LZF when it saves at least 4 bytes of a string over 20, verbatim otherwise.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    if s.len() <= INT_ENCODING_MAX_BYTES {
        if let Some(v) = canonical_int(s) {
            if let Ok(b) = i8::try_from(v) {
                out.extend_from_slice(&[ENCODED_TAG | ENC_INT8, b as u8]);
                return;
            }
            if let Ok(h) = i16::try_from(v) {
                out.push(ENCODED_TAG | ENC_INT16);
                out.extend_from_slice(&h.to_le_bytes());
                return;
            }
            if let Ok(w) = i32::try_from(v) {
                out.push(ENCODED_TAG | ENC_INT32);
                out.extend_from_slice(&w.to_le_bytes());
                return;
            }
        }
    }
    if s.len() >= LZF_MIN_INPUT_BYTES {
        if let Some(c) = lzf::compress(s, s.len() - LZF_SAVING_MIN_BYTES) {
            out.push(ENCODED_TAG | ENC_LZF);
            put_len(out, c.len());
            put_len(out, s.len());
            out.extend_from_slice(&c);
            return;
        }
    }
    put_len(out, s.len());
    out.extend_from_slice(s);
}

fn put_object(out: &mut Vec<u8>, v: &RdbValue) {
    match v {
        RdbValue::String(s) => {
            out.push(ObjectType::String as u8);
            put_string(out, s);
        }
        RdbValue::Hash(h) if h.encoding() == HashEncoding::Listpack => {
            out.push(ObjectType::HashListpack as u8);
            let elements = h
                .pairs()
                .iter()
                .flat_map(|(f, v)| [f.as_slice(), v.as_slice()]);
            put_string(out, &blob::listpack_build(elements));
        }
        RdbValue::Hash(h) => {
            out.push(ObjectType::Hash as u8);
            put_len(out, h.len());
            for (f, v) in h.pairs() {
                put_string(out, f);
                put_string(out, v);
            }
        }
        RdbValue::Set(s) if s.encoding() == SetEncoding::Intset && intset_exact(s) => {
            out.push(ObjectType::SetIntset as u8);
            let values: Vec<i64> = s
                .members()
                .iter()
                .map(|m| as_set_int(m).expect("an intset holds integers"))
                .collect();
            put_string(out, &blob::intset_build(&values));
        }
        RdbValue::Set(s) => {
            out.push(ObjectType::Set as u8);
            put_len(out, s.len());
            for m in s.members() {
                put_string(out, m);
            }
        }
        // A listpack zset holds member, score-text pairs in ascending order (the score as
        // Redis's d2string writes it into the listpack).
        RdbValue::ZSet(z) if z.encoding() == ZSetEncoding::Listpack => {
            out.push(ObjectType::ZsetListpack as u8);
            let texts: Vec<Vec<u8>> = z
                .pairs()
                .iter()
                .map(|(s, _)| format_score(*s).into_bytes())
                .collect();
            let elements = z
                .pairs()
                .iter()
                .zip(&texts)
                .flat_map(|((_, m), t)| [m.as_slice(), t.as_slice()]);
            put_string(out, &blob::listpack_build(elements));
        }
        // A skiplist zset is written from the highest pair to the lowest, scores as binary
        // little-endian doubles (`ZSET_2`), as Redis writes it.
        RdbValue::ZSet(z) => {
            out.push(ObjectType::Zset2 as u8);
            put_len(out, z.len());
            for (s, m) in z.pairs().iter().rev() {
                put_string(out, m);
                out.extend_from_slice(&s.to_bits().to_le_bytes());
            }
        }
        RdbValue::List(l) => {
            out.push(ObjectType::ListQuicklist2 as u8);
            let nodes = l.node_elements();
            put_len(out, nodes.len());
            for node in nodes {
                put_len(out, QUICKLIST_CONTAINER_PACKED);
                put_string(out, &blob::listpack_build(node.into_iter()));
            }
        }
    }
}

/// Whether every member of an intset-encoded set is its integer's canonical text, so the
/// intset form gives the same members back. (lavik's intset admits "-0", which Redis's
/// `string2ll` refuses; such a set is written as a plain SET to keep the member intact.)
fn intset_exact(s: &SetValue) -> bool {
    s.members().iter().all(|m| canonical_int(m).is_some())
}

/// The DUMP payload of `v`.
pub fn dump(v: &RdbValue) -> Vec<u8> {
    let mut out = Vec::new();
    put_object(&mut out, v);
    append_footer(&mut out);
    out
}

/// Appends the RDB version and the CRC-64 of everything before it (a payload's footer).
pub fn append_footer(out: &mut Vec<u8>) {
    out.extend_from_slice(&RDB_VERSION_EMITTED.to_le_bytes());
    let crc = crc64::crc64(0, out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// One RDB string as Redis writes it (FUNCTION DUMP writes library code this way).
pub fn put_rdb_string(out: &mut Vec<u8>, s: &[u8]) {
    put_string(out, s);
}

/// One RDB string at the start of `b`, and the bytes it took.
pub fn read_rdb_string(b: &[u8]) -> Result<(Vec<u8>, usize)> {
    let mut r = Reader { b, at: 0 };
    let s = r.string()?;
    Ok((s, r.at))
}

// ---- parse ------------------------------------------------------------------------------

/// The object part of `payload` once its footer checks out (Redis's `verifyDumpPayload`).
pub fn verify(payload: &[u8]) -> Result<&[u8]> {
    if payload.len() < FOOTER_BYTES {
        return Err(DumpError::VersionOrChecksum);
    }
    let footer_at = payload.len() - FOOTER_BYTES;
    let version = u16::from_le_bytes([payload[footer_at], payload[footer_at + 1]]);
    if version > RDB_VERSION_ACCEPTED_MAX {
        return Err(DumpError::VersionOrChecksum);
    }
    let mut crc_bytes = [0u8; 8];
    crc_bytes.copy_from_slice(&payload[footer_at + 2..]);
    if crc64::crc64(0, &payload[..payload.len() - 8]) != u64::from_le_bytes(crc_bytes) {
        return Err(DumpError::VersionOrChecksum);
    }
    Ok(&payload[..footer_at])
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

const TRUNCATED: DumpError = DumpError::BadFormat("truncated");

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(TRUNCATED)?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// A length, or `Err(encoding)` for the special string encodings (`11xxxxxx`).
    fn len_or_encoding(&mut self) -> Result<std::result::Result<usize, u8>> {
        let first = self.u8()?;
        Ok(match first >> 6 {
            0 => Ok(usize::from(first & 0x3f)),
            1 => Ok((usize::from(first & 0x3f) << 8) | usize::from(self.u8()?)),
            3 => Err(first & 0x3f),
            _ if first == LEN_32BIT => {
                let b = self.take(4)?;
                Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            }
            _ if first == LEN_64BIT => {
                let mut b = [0u8; 8];
                b.copy_from_slice(self.take(8)?);
                Ok(usize::try_from(u64::from_be_bytes(b)).map_err(|_| TRUNCATED)?)
            }
            _ => return Err(DumpError::BadFormat("length encoding")),
        })
    }

    fn len(&mut self) -> Result<usize> {
        self.len_or_encoding()?
            .map_err(|_| DumpError::BadFormat("encoded value where a length belongs"))
    }

    /// Redis's `rdbGenericLoadStringObject`.
    fn string(&mut self) -> Result<Vec<u8>> {
        match self.len_or_encoding()? {
            Ok(n) => Ok(self.take(n)?.to_vec()),
            Err(ENC_INT8) => Ok((self.u8()? as i8).to_string().into_bytes()),
            Err(ENC_INT16) => {
                let b = self.take(2)?;
                Ok(i16::from_le_bytes([b[0], b[1]]).to_string().into_bytes())
            }
            Err(ENC_INT32) => {
                let b = self.take(4)?;
                Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]])
                    .to_string()
                    .into_bytes())
            }
            Err(ENC_LZF) => {
                let compressed_len = self.len()?;
                let len = self.len()?;
                let c = self.take(compressed_len)?;
                // Redis refuses a zero-length LZF string (liblzf returns 0 for it).
                if len == 0 {
                    return Err(DumpError::BadFormat("empty LZF string"));
                }
                lzf::decompress(c, len).ok_or(DumpError::BadFormat("LZF data"))
            }
            Err(_) => Err(DumpError::BadFormat("unknown string encoding")),
        }
    }
}

fn hash_from_pairs(
    pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    n: usize,
) -> Result<RdbValue> {
    if n == 0 {
        return Err(DumpError::BadFormat("empty hash"));
    }
    let mut h = HashValue::new();
    h.prepare_write(n, 0);
    for (f, v) in pairs {
        if !h.set(&f, &v) {
            return Err(DumpError::BadFormat("duplicate hash field"));
        }
    }
    Ok(RdbValue::Hash(h))
}

fn hash_from_elements(e: Vec<Vec<u8>>) -> Result<RdbValue> {
    if !e.len().is_multiple_of(2) {
        return Err(DumpError::BadFormat("odd hash listpack"));
    }
    let n = e.len() / 2;
    let mut it = e.into_iter();
    let pairs = std::iter::from_fn(|| Some((it.next()?, it.next()?)));
    hash_from_pairs(pairs, n)
}

fn set_from_members(m: Vec<Vec<u8>>) -> Result<RdbValue> {
    let Some(first) = m.first() else {
        return Err(DumpError::BadFormat("empty set"));
    };
    let mut s = SetValue::create(first, m.len());
    for x in &m {
        if !s.add(x) {
            return Err(DumpError::BadFormat("duplicate set member"));
        }
    }
    Ok(RdbValue::Set(s))
}

/// A sorted set from (member, score) pairs; the encoding Redis converts a loaded set to.
fn zset_from_pairs(pairs: Vec<(f64, Vec<u8>)>) -> Result<RdbValue> {
    if pairs.is_empty() {
        return Err(DumpError::BadFormat("empty sorted set"));
    }
    if pairs.iter().any(|(s, _)| s.is_nan()) {
        return Err(DumpError::BadFormat("NaN score"));
    }
    let n = pairs.len();
    let z = ZSetValue::from_pairs(pairs);
    let distinct: std::collections::HashSet<&[u8]> =
        z.pairs().iter().map(|(_, m)| m.as_slice()).collect();
    if distinct.len() != n {
        return Err(DumpError::BadFormat("duplicate sorted set member"));
    }
    Ok(RdbValue::ZSet(z))
}

/// Listpack/ziplist zset elements: member, score text, alternating.
fn zset_from_elements(e: Vec<Vec<u8>>) -> Result<RdbValue> {
    if !e.len().is_multiple_of(2) {
        return Err(DumpError::BadFormat("odd zset listpack"));
    }
    let mut pairs = Vec::with_capacity(e.len() / 2);
    let mut it = e.into_iter();
    while let (Some(m), Some(s)) = (it.next(), it.next()) {
        let score = std::str::from_utf8(&s)
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .ok_or(DumpError::BadFormat("zset score text"))?;
        pairs.push((score, m));
    }
    zset_from_pairs(pairs)
}
fn list_value(l: ListValue) -> Result<RdbValue> {
    if l.is_empty() {
        return Err(DumpError::BadFormat("empty list"));
    }
    Ok(RdbValue::List(l))
}

/// A `LIST_QUICKLIST` (ziplist nodes) or `LIST_QUICKLIST_2` (listpack or plain nodes)
/// body: a node count, then per node its container (version 2 only) and its blob.
fn quicklist_nodes(r: &mut Reader, version_2: bool) -> Result<Vec<Vec<Vec<u8>>>> {
    let count = r.len()?;
    let mut nodes = Vec::new();
    for _ in 0..count {
        let container = if version_2 {
            r.len()?
        } else {
            QUICKLIST_CONTAINER_PACKED
        };
        let blob = r.string()?;
        nodes.push(match container {
            QUICKLIST_CONTAINER_PLAIN => vec![blob],
            QUICKLIST_CONTAINER_PACKED if version_2 => blob::listpack_decode(&blob)?,
            QUICKLIST_CONTAINER_PACKED => blob::ziplist_decode(&blob)?,
            _ => return Err(DumpError::BadFormat("quicklist container")),
        });
    }
    Ok(nodes)
}

/// Reads `n` elements one by one, growing the vector as they arrive (a corrupt count
/// runs out of input instead of allocating).
fn strings(r: &mut Reader, n: usize) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(r.string()?);
    }
    Ok(out)
}

/// Redis's `rdbLoadObjectType` + `rdbLoadObject` for the types lavik stores. Bytes after
/// the object are ignored, as Redis ignores them.
fn parse_object(body: &[u8]) -> Result<RdbValue> {
    let mut r = Reader { b: body, at: 0 };
    let t = r.u8()?;
    match t {
        x if x == ObjectType::String as u8 => Ok(RdbValue::String(r.string()?)),
        x if x == ObjectType::Hash as u8 => {
            let n = r.len()?;
            let flat = strings(&mut r, n.checked_mul(2).ok_or(TRUNCATED)?)?;
            hash_from_elements(flat)
        }
        x if x == ObjectType::HashListpack as u8 => {
            hash_from_elements(blob::listpack_decode(&r.string()?)?)
        }
        x if x == ObjectType::HashZiplist as u8 => {
            hash_from_elements(blob::ziplist_decode(&r.string()?)?)
        }
        x if x == ObjectType::HashZipmap as u8 => {
            let pairs = blob::zipmap_decode(&r.string()?)?;
            let n = pairs.len();
            hash_from_pairs(pairs, n)
        }
        x if x == ObjectType::Set as u8 => {
            let n = r.len()?;
            set_from_members(strings(&mut r, n)?)
        }
        x if x == ObjectType::SetIntset as u8 => {
            let values = blob::intset_decode(&r.string()?)?;
            set_from_members(values.iter().map(|v| v.to_string().into_bytes()).collect())
        }
        x if x == ObjectType::SetListpack as u8 => {
            set_from_members(blob::listpack_decode(&r.string()?)?)
        }
        x if x == ObjectType::ZsetListpack as u8 => {
            zset_from_elements(blob::listpack_decode(&r.string()?)?)
        }
        x if x == ObjectType::ZsetZiplist as u8 => {
            zset_from_elements(blob::ziplist_decode(&r.string()?)?)
        }
        x if x == ObjectType::Zset2 as u8 => {
            let n = r.len()?;
            let mut pairs = Vec::new();
            for _ in 0..n {
                let m = r.string()?;
                let b = r.take(8)?;
                let bits = u64::from_le_bytes(b.try_into().map_err(|_| TRUNCATED)?);
                pairs.push((f64::from_bits(bits), m));
            }
            zset_from_pairs(pairs)
        }
        x if x == ObjectType::Zset as u8 => {
            let n = r.len()?;
            let mut pairs = Vec::new();
            for _ in 0..n {
                let m = r.string()?;
                let score = match r.u8()? {
                    253 => f64::NAN,
                    254 => f64::INFINITY,
                    255 => f64::NEG_INFINITY,
                    len => std::str::from_utf8(r.take(len as usize)?)
                        .ok()
                        .and_then(|t| t.parse::<f64>().ok())
                        .ok_or(DumpError::BadFormat("zset score text"))?,
                };
                pairs.push((score, m));
            }
            zset_from_pairs(pairs)
        }
        x if x == ObjectType::List as u8 => {
            let n = r.len()?;
            list_value(ListValue::from_tail_pushes(strings(&mut r, n)?))
        }
        x if x == ObjectType::ListZiplist as u8 => {
            list_value(ListValue::from_nodes(vec![blob::ziplist_decode(
                &r.string()?,
            )?]))
        }
        x if x == ObjectType::ListQuicklist as u8 => {
            list_value(ListValue::from_nodes(quicklist_nodes(&mut r, false)?))
        }
        x if x == ObjectType::ListQuicklist2 as u8 => {
            list_value(ListValue::from_nodes(quicklist_nodes(&mut r, true)?))
        }
        _ => Err(DumpError::BadFormat("object type lavik does not store")),
    }
}

/// The value in a RESTORE payload. Like Redis, which reads the object from a buffer
/// holding the whole payload, an object may run into the footer bytes.
pub fn restore(payload: &[u8]) -> Result<RdbValue> {
    verify(payload)?;
    parse_object(payload)
}

#[cfg(test)]
mod tests;
