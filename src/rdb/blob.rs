//! The compact in-memory encodings Redis serializes as one RDB string: listpack (7.0+),
//! intset, and on input the older ziplist (before 7.0) and zipmap (before 2.6). Each is
//! decoded into its list of elements (integers as their decimal text, as Redis reads them
//! back); listpack and intset are also built, byte for byte as Redis builds them.

use super::canonical_int;

/// Why a blob was refused; RESTORE answers "Bad data format" for any of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

type Result<T> = std::result::Result<T, Malformed>;

fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8]> {
    let end = at
        .checked_add(n)
        .filter(|&e| e <= b.len())
        .ok_or(Malformed("truncated"))?;
    let s = &b[*at..end];
    *at = end;
    Ok(s)
}

fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

/// Sign-extends the low `bits` bits of `v`.
fn signed(v: u64, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((v << shift) as i64) >> shift
}

// ---- listpack ---------------------------------------------------------------------------

const LISTPACK_HEADER_BYTES: usize = 6;
const LISTPACK_END: u8 = 0xff;
/// The element count field saturates here; the true count is then found by walking.
const LISTPACK_COUNT_UNKNOWN: usize = 65535;

/// Redis's `lpEncodeBacklen` length: how many bytes the back length of an entry of
/// `entry_bytes` (encoding + data) takes.
fn backlen_bytes(entry_bytes: usize) -> usize {
    match entry_bytes {
        0..=127 => 1,
        128..=16382 => 2,
        16383..=2097150 => 3,
        2097151..=268435454 => 4,
        _ => 5,
    }
}

fn put_backlen(out: &mut Vec<u8>, l: usize) {
    let n = backlen_bytes(l);
    // Written left to right: the most significant 7-bit group first, every byte but the
    // first (leftmost) carrying the continuation bit, so it can be read backwards.
    for i in (0..n).rev() {
        let group = ((l >> (7 * i)) & 127) as u8;
        out.push(if i == n - 1 { group } else { group | 128 });
    }
}

fn listpack_push_int(out: &mut Vec<u8>, v: i64) {
    let start = out.len();
    match v {
        0..=127 => out.push(v as u8),
        -4096..=4095 => {
            let u = (v as u64) & 0x1fff;
            out.push(0xc0 | (u >> 8) as u8);
            out.push(u as u8);
        }
        -32768..=32767 => {
            out.push(0xf1);
            out.extend_from_slice(&(v as i16).to_le_bytes());
        }
        -8388608..=8388607 => {
            out.push(0xf2);
            out.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
        }
        -2147483648..=2147483647 => {
            out.push(0xf3);
            out.extend_from_slice(&(v as i32).to_le_bytes());
        }
        _ => {
            out.push(0xf4);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    put_backlen(out, out.len() - start);
}

fn listpack_push(out: &mut Vec<u8>, e: &[u8]) {
    // Redis's `lpStringToInt64`: canonical decimal text only.
    if let Some(v) = canonical_int(e) {
        return listpack_push_int(out, v);
    }
    let start = out.len();
    let n = e.len();
    if n < 64 {
        out.push(0x80 | n as u8);
    } else if n < 4096 {
        out.push(0xe0 | (n >> 8) as u8);
        out.push(n as u8);
    } else {
        out.push(0xf0);
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    out.extend_from_slice(e);
    put_backlen(out, out.len() - start);
}

/// A listpack holding `elements` in order, as Redis's `lpAppend` builds it.
pub fn listpack_build<'a>(elements: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![0u8; LISTPACK_HEADER_BYTES];
    let mut count = 0usize;
    for e in elements {
        listpack_push(&mut out, e);
        count += 1;
    }
    out.push(LISTPACK_END);
    let total = out.len() as u32;
    out[0..4].copy_from_slice(&total.to_le_bytes());
    let count_field = count.min(LISTPACK_COUNT_UNKNOWN) as u16;
    out[4..6].copy_from_slice(&count_field.to_le_bytes());
    out
}

/// Reads one listpack entry at `at` (its encoding, data and back length).
fn listpack_entry(b: &[u8], at: &mut usize) -> Result<Vec<u8>> {
    let start = *at;
    let tag = take(b, at, 1)?[0];
    let value = match tag {
        0x00..=0x7f => Ok(i64::from(tag)),
        0x80..=0xbf => Err(take(b, at, usize::from(tag & 0x3f))?),
        0xc0..=0xdf => {
            let lo = take(b, at, 1)?[0];
            Ok(signed((u64::from(tag & 0x1f) << 8) | u64::from(lo), 13))
        }
        0xe0..=0xef => {
            let lo = take(b, at, 1)?[0];
            Err(take(
                b,
                at,
                (usize::from(tag & 0x0f) << 8) | usize::from(lo),
            )?)
        }
        0xf0 => {
            let n = le(take(b, at, 4)?) as usize;
            Err(take(b, at, n)?)
        }
        0xf1 => Ok(signed(le(take(b, at, 2)?), 16)),
        0xf2 => Ok(signed(le(take(b, at, 3)?), 24)),
        0xf3 => Ok(signed(le(take(b, at, 4)?), 32)),
        0xf4 => Ok(le(take(b, at, 8)?) as i64),
        _ => return Err(Malformed("listpack entry encoding")),
    };
    let entry_bytes = *at - start;
    let back = take(b, at, backlen_bytes(entry_bytes))?;
    let mut expected = Vec::with_capacity(5);
    put_backlen(&mut expected, entry_bytes);
    if back != expected.as_slice() {
        return Err(Malformed("listpack back length"));
    }
    Ok(match value {
        Ok(v) => v.to_string().into_bytes(),
        Err(s) => s.to_vec(),
    })
}

/// The elements of a listpack, validated as Redis's `lpValidateIntegrity` does.
pub fn listpack_decode(b: &[u8]) -> Result<Vec<Vec<u8>>> {
    if b.len() < LISTPACK_HEADER_BYTES + 1 {
        return Err(Malformed("listpack shorter than its header"));
    }
    if le(&b[0..4]) as usize != b.len() {
        return Err(Malformed("listpack total bytes"));
    }
    let count = le(&b[4..6]) as usize;
    let mut at = LISTPACK_HEADER_BYTES;
    let mut out = Vec::new();
    while b.get(at) != Some(&LISTPACK_END) {
        out.push(listpack_entry(b, &mut at)?);
    }
    if at + 1 != b.len() {
        return Err(Malformed("listpack bytes after its end"));
    }
    if count != LISTPACK_COUNT_UNKNOWN && count != out.len() {
        return Err(Malformed("listpack element count"));
    }
    Ok(out)
}

// ---- intset -----------------------------------------------------------------------------

const INTSET_HEADER_BYTES: usize = 8;

/// An intset of `values` (sorted, distinct), with the narrowest width that holds them all.
pub fn intset_build(values: &[i64]) -> Vec<u8> {
    debug_assert!(values.windows(2).all(|w| w[0] < w[1]));
    let width = values.iter().fold(2usize, |w, &v| {
        if i16::try_from(v).is_ok() {
            w
        } else if i32::try_from(v).is_ok() {
            w.max(4)
        } else {
            8
        }
    });
    let mut out = Vec::with_capacity(INTSET_HEADER_BYTES + width * values.len());
    out.extend_from_slice(&(width as u32).to_le_bytes());
    out.extend_from_slice(&(values.len() as u32).to_le_bytes());
    for &v in values {
        out.extend_from_slice(&v.to_le_bytes()[..width]);
    }
    out
}

/// The members of an intset; strictly ascending as `intsetValidateIntegrity` requires.
pub fn intset_decode(b: &[u8]) -> Result<Vec<i64>> {
    if b.len() < INTSET_HEADER_BYTES {
        return Err(Malformed("intset shorter than its header"));
    }
    let width = le(&b[0..4]) as usize;
    if !matches!(width, 2 | 4 | 8) {
        return Err(Malformed("intset width"));
    }
    let count = le(&b[4..8]) as usize;
    if count == 0 || count.checked_mul(width) != Some(b.len() - INTSET_HEADER_BYTES) {
        return Err(Malformed("intset length"));
    }
    let values: Vec<i64> = b[INTSET_HEADER_BYTES..]
        .chunks_exact(width)
        .map(|c| signed(le(c), 8 * width as u32))
        .collect();
    if !values.windows(2).all(|w| w[0] < w[1]) {
        return Err(Malformed("intset not strictly ascending"));
    }
    Ok(values)
}

// ---- ziplist (input only) ---------------------------------------------------------------

const ZIPLIST_HEADER_BYTES: usize = 10;
const ZIPLIST_END: u8 = 0xff;
const ZIPLIST_COUNT_UNKNOWN: usize = 65535;

fn ziplist_entry(b: &[u8], at: &mut usize, prev_entry_bytes: usize) -> Result<Vec<u8>> {
    let first = take(b, at, 1)?[0];
    let prevlen = if first < 254 {
        usize::from(first)
    } else if first == 254 {
        le(take(b, at, 4)?) as usize
    } else {
        return Err(Malformed("ziplist previous length"));
    };
    if prevlen != prev_entry_bytes {
        return Err(Malformed("ziplist previous length"));
    }
    let tag = take(b, at, 1)?[0];
    let value: std::result::Result<i64, &[u8]> = match tag >> 6 {
        0 => Err(take(b, at, usize::from(tag & 0x3f))?),
        1 => {
            let lo = take(b, at, 1)?[0];
            Err(take(
                b,
                at,
                (usize::from(tag & 0x3f) << 8) | usize::from(lo),
            )?)
        }
        2 if tag == 0x80 => {
            let n = take(b, at, 4)?;
            let n = u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize;
            Err(take(b, at, n)?)
        }
        2 => return Err(Malformed("ziplist string encoding")),
        _ => match tag {
            0xc0 => Ok(signed(le(take(b, at, 2)?), 16)),
            0xd0 => Ok(signed(le(take(b, at, 4)?), 32)),
            0xe0 => Ok(le(take(b, at, 8)?) as i64),
            0xf0 => Ok(signed(le(take(b, at, 3)?), 24)),
            0xfe => Ok(signed(le(take(b, at, 1)?), 8)),
            0xf1..=0xfd => Ok(i64::from(tag & 0x0f) - 1),
            _ => return Err(Malformed("ziplist integer encoding")),
        },
    };
    Ok(match value {
        Ok(v) => v.to_string().into_bytes(),
        Err(s) => s.to_vec(),
    })
}

/// The elements of a ziplist (the hash encoding RDB 9 and earlier carry).
pub fn ziplist_decode(b: &[u8]) -> Result<Vec<Vec<u8>>> {
    if b.len() < ZIPLIST_HEADER_BYTES + 1 {
        return Err(Malformed("ziplist shorter than its header"));
    }
    if le(&b[0..4]) as usize != b.len() {
        return Err(Malformed("ziplist total bytes"));
    }
    let tail = le(&b[4..8]) as usize;
    let count = le(&b[8..10]) as usize;
    let mut at = ZIPLIST_HEADER_BYTES;
    let (mut out, mut prev, mut last_start) = (Vec::new(), 0usize, ZIPLIST_HEADER_BYTES);
    while b.get(at) != Some(&ZIPLIST_END) {
        let start = at;
        out.push(ziplist_entry(b, &mut at, prev)?);
        prev = at - start;
        last_start = start;
    }
    if at + 1 != b.len() {
        return Err(Malformed("ziplist bytes after its end"));
    }
    if tail != last_start {
        return Err(Malformed("ziplist tail offset"));
    }
    if count != ZIPLIST_COUNT_UNKNOWN && count != out.len() {
        return Err(Malformed("ziplist element count"));
    }
    Ok(out)
}

// ---- zipmap (input only) ----------------------------------------------------------------

const ZIPMAP_END: u8 = 0xff;
const ZIPMAP_BIGLEN: u8 = 254;

fn zipmap_len(b: &[u8], at: &mut usize) -> Result<usize> {
    let first = take(b, at, 1)?[0];
    match first {
        0..=253 => Ok(usize::from(first)),
        ZIPMAP_BIGLEN => Ok(le(take(b, at, 4)?) as usize),
        _ => Err(Malformed("zipmap length")),
    }
}

/// The field/value pairs of a zipmap (hashes in RDB files of Redis 2.4 and earlier).
pub fn zipmap_decode(b: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut at = 1; // The first byte is a saturating count; the end marker is what counts.
    take(b, &mut 0, 1)?;
    let mut out = Vec::new();
    while b.get(at) != Some(&ZIPMAP_END) {
        if at >= b.len() {
            return Err(Malformed("zipmap truncated"));
        }
        let n = zipmap_len(b, &mut at)?;
        let field = take(b, &mut at, n)?.to_vec();
        let n = zipmap_len(b, &mut at)?;
        let free = usize::from(take(b, &mut at, 1)?[0]);
        let value = take(b, &mut at, n)?.to_vec();
        take(b, &mut at, free)?;
        out.push((field, value));
    }
    if at + 1 != b.len() {
        return Err(Malformed("zipmap bytes after its end"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The listpack of `HSET h1 a 1 b hello c -5000` in Redis 7.0.15 (from its DUMP).
    const HASH_LISTPACK: &[u8] =
        b"\x1d\x00\x00\x00\x06\x00\x81a\x02\x01\x01\x81b\x02\x85hello\x06\x81c\x02\xf1x\xec\x03\xff";
    /// The intset of `SADD i1 1 2 3 70000` in Redis 7.0.15.
    const INTSET: &[u8] =
        b"\x04\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00p\x11\x01\x00";

    fn strs(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    // A listpack from Redis decodes, and building the same elements gives Redis's bytes.
    #[test]
    fn listpack_known_bytes() {
        let e = listpack_decode(HASH_LISTPACK).unwrap();
        assert_eq!(e, strs(&["a", "1", "b", "hello", "c", "-5000"]));
        assert_eq!(
            listpack_build(e.iter().map(|x| x.as_slice())),
            HASH_LISTPACK
        );
    }

    // An intset from Redis decodes, and building it again gives Redis's bytes.
    #[test]
    fn intset_known_bytes() {
        let v = intset_decode(INTSET).unwrap();
        assert_eq!(v, vec![1, 2, 3, 70000]);
        assert_eq!(intset_build(&v), INTSET);
    }

    // Every proper prefix of a listpack or intset is refused.
    #[test]
    fn truncated_refused() {
        for n in 0..HASH_LISTPACK.len() {
            assert!(listpack_decode(&HASH_LISTPACK[..n]).is_err());
        }
        for n in 0..INTSET.len() {
            assert!(intset_decode(&INTSET[..n]).is_err());
        }
    }

    // Corrupt counts, back lengths, widths and orders are refused.
    #[test]
    fn malformed_refused() {
        let mut lp = HASH_LISTPACK.to_vec();
        lp[4] = 5;
        assert!(listpack_decode(&lp).is_err());
        let mut lp = HASH_LISTPACK.to_vec();
        lp[8] = 3; // back length of the first entry
        assert!(listpack_decode(&lp).is_err());
        let mut is = INTSET.to_vec();
        is[0] = 3;
        assert!(intset_decode(&is).is_err());
        let is = intset_build(&[1, 2]);
        let swapped = [&is[..8], &is[10..12], &is[8..10]].concat();
        assert!(intset_decode(&swapped).is_err());
    }

    // A ziplist of ["a", "1", "hello", "-5000", "300000"] in Redis 6's layout decodes.
    #[test]
    fn ziplist_known_bytes() {
        let zl: &[u8] = b"\x20\x00\x00\x00\x1a\x00\x00\x00\x05\x00\
            \x00\x01a\x03\xf2\x02\x05hello\x07\xc0\x78\xec\x04\xf0\xe0\x93\x04\xff";
        assert_eq!(
            ziplist_decode(zl).unwrap(),
            strs(&["a", "1", "hello", "-5000", "300000"])
        );
        for n in 0..zl.len() {
            assert!(ziplist_decode(&zl[..n]).is_err());
        }
    }

    // A zipmap {"foo": "bar", "k": "v"} (with one free byte) decodes.
    #[test]
    fn zipmap_known_bytes() {
        let zm: &[u8] = b"\x02\x03foo\x03\x00bar\x01k\x01\x01vX\xff";
        assert_eq!(
            zipmap_decode(zm).unwrap(),
            vec![
                (b"foo".to_vec(), b"bar".to_vec()),
                (b"k".to_vec(), b"v".to_vec())
            ]
        );
        assert!(zipmap_decode(&zm[..zm.len() - 1]).is_err());
    }

    proptest! {
        // Any elements survive a listpack round trip (integers in canonical form).
        #[test]
        fn listpack_round_trip(e in proptest::collection::vec(prop_oneof![
            any::<i64>().prop_map(|v| v.to_string().into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..5000),
        ], 0..20)) {
            let lp = listpack_build(e.iter().map(|x| x.as_slice()));
            prop_assert_eq!(listpack_decode(&lp).unwrap(), e);
        }

        // Any sorted distinct integers survive an intset round trip.
        #[test]
        fn intset_round_trip(v in proptest::collection::btree_set(any::<i64>(), 1..50)) {
            let v: Vec<i64> = v.into_iter().collect();
            prop_assert_eq!(intset_decode(&intset_build(&v)).unwrap(), v);
        }
    }
}
