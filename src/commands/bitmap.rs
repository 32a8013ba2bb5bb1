//! Bitmap commands on string values: SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD
//! and BITFIELD_RO, with Redis 7.2's semantics, replies and error texts.
//!
//! Bits are numbered from the most significant bit of byte 0. A string is an infinite
//! run of zero bits past its end for readers; writers grow it with zero bytes (never
//! past `proto-max-bulk-len`, which bounds every bit offset). The value stays a plain
//! string: these commands read it with `read_string`, change a copy, and write it back
//! once with its expiry kept (as SETRANGE does), so a command either applies whole or
//! not at all. Every read happens before the one write.
//!
//! Where Redis 7.0 and 7.2 differ, this follows 7.2 (the version lavik reports):
//! BITCOUNT and BITPOS parse all their arguments before looking at the key, so a bad
//! argument is an error even when the key is missing (7.0 replied 0 or -1).

use super::string::{read_string, write_string};
use super::{eq_ic, parse_int, storage_error, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::ReplyBuf;

const ERR_BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";
const ERR_BIT_VALUE: &str = "ERR bit is not an integer or out of range";
const ERR_BIT_ARG: &str = "ERR The bit argument must be 1 or 0.";
const ERR_BITOP_NOT: &str = "ERR BITOP NOT must be called with a single source key.";
const ERR_BITFIELD_TYPE: &str =
    "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";
const ERR_OVERFLOW_TYPE: &str = "ERR Invalid OVERFLOW type specified";
const ERR_BITFIELD_RO: &str = "ERR BITFIELD_RO only supports the GET subcommand";

/// Widest BITFIELD types: `i64`, and `u63` (an unsigned 64-bit value would not fit
/// RESP's signed integer reply).
const SIGNED_BITS_MAX: u32 = 64;
const UNSIGNED_BITS_MAX: u32 = 63;

/// An argument as Redis's C string functions see it: up to the first NUL.
fn c_str(a: &[u8]) -> &[u8] {
    a.iter().position(|&b| b == 0).map_or(a, |n| &a[..n])
}

/// Parses a bit offset (`#n` means `n × bits` when `hash_bits` is given, as in
/// BITFIELD); refuses negatives and offsets whose byte is past `proto-max-bulk-len`.
fn parse_bit_offset(arg: &[u8], hash_bits: Option<u32>, max_bulk: usize) -> Result<u64, String> {
    let (digits, scale) = match hash_bits {
        Some(bits) if arg.first() == Some(&b'#') => (&arg[1..], bits as i64),
        _ => (arg, 1),
    };
    let n = crate::resp::parse::parse_i64(digits).ok_or(ERR_BIT_OFFSET)?;
    // Redis multiplies in C's (in practice wrapping) 64-bit arithmetic.
    let n = n.wrapping_mul(scale);
    if n < 0 || (n >> 3) as u64 >= max_bulk as u64 {
        return Err(ERR_BIT_OFFSET.into());
    }
    Ok(n as u64)
}

fn bit_at(bytes: &[u8], bit: u64) -> bool {
    let byte = (bit >> 3) as usize;
    byte < bytes.len() && bytes[byte] & (0x80 >> (bit & 7)) != 0
}

/// The value's bytes and expiry, or an empty string without one.
fn current(ctx: &mut Ctx, key: &[u8]) -> Result<(Vec<u8>, Option<u64>, bool), String> {
    Ok(match read_string(ctx, key)? {
        Some(v) => (v.bytes, v.expire_at_ms, true),
        None => (Vec::new(), None, false),
    })
}

pub fn setbit(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let offset = parse_bit_offset(a[2], None, ctx.max_bulk)?;
    let on = crate::resp::parse::parse_i64(a[3]).ok_or(ERR_BIT_VALUE)?;
    if on & !1 != 0 {
        return Err(ERR_BIT_VALUE.into());
    }
    let (mut bytes, ttl, existed) = current(ctx, a[1])?;
    let byte = (offset >> 3) as usize;
    let grew = bytes.len() <= byte;
    if grew {
        bytes.resize(byte + 1, 0);
    }
    let mask = 0x80u8 >> (offset & 7);
    let was = bytes[byte] & mask != 0;
    if !existed || grew || was != (on == 1) {
        if on == 1 {
            bytes[byte] |= mask;
        } else {
            bytes[byte] &= !mask;
        }
        write_string(ctx, a[1], &bytes, ttl)?;
        ctx.notify(super::events::STRING, "setbit", a[1]);
    }
    r.int(was as i64);
    Ok(())
}

pub fn getbit(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let offset = parse_bit_offset(a[2], None, ctx.max_bulk)?;
    let (bytes, _, _) = current(ctx, a[1])?;
    r.int(bit_at(&bytes, offset) as i64);
    Ok(())
}

/// Parses the optional `BYTE|BIT` unit; true for BIT.
fn parse_unit(arg: &[u8]) -> Result<bool, String> {
    let arg = c_str(arg);
    if eq_ic(arg, "bit") {
        Ok(true)
    } else if eq_ic(arg, "byte") {
        Ok(false)
    } else {
        Err(ERR_SYNTAX.into())
    }
}

/// Resolves a `start end` range over `total` units (bytes or bits) as Redis does:
/// negatives count from the end, both ends are clamped to the value. `None` when the
/// range is empty.
fn clamp_range(mut start: i64, mut end: i64, total: i64) -> Option<(u64, u64)> {
    if start < 0 {
        start += total;
    }
    if end < 0 {
        end += total;
    }
    start = start.max(0);
    end = end.max(0).min(total - 1);
    (start <= end).then_some((start as u64, end as u64))
}

/// The inclusive bit range a resolved unit range covers.
fn bit_range(range: (u64, u64), in_bits: bool) -> (u64, u64) {
    if in_bits {
        range
    } else {
        (range.0 * 8, range.1 * 8 + 7)
    }
}

/// Number of set bits in the inclusive bit range `[first, last]` of `bytes`.
fn count_ones(bytes: &[u8], first: u64, last: u64) -> u64 {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    let head_mask = 0xffu8 >> (first & 7);
    let tail_mask = 0xffu8 << (7 - (last & 7));
    if fb == lb {
        return (bytes[fb] & head_mask & tail_mask).count_ones() as u64;
    }
    let mut n = (bytes[fb] & head_mask).count_ones() as u64;
    n += (bytes[lb] & tail_mask).count_ones() as u64;
    let middle = &bytes[fb + 1..lb];
    let mut words = middle.chunks_exact(8);
    for w in &mut words {
        n += u64::from_ne_bytes(w.try_into().expect("8 bytes")).count_ones() as u64;
    }
    n + words
        .remainder()
        .iter()
        .map(|b| b.count_ones() as u64)
        .sum::<u64>()
}

/// Position of the first bit equal to `want` in the inclusive bit range.
fn first_bit(bytes: &[u8], first: u64, last: u64, want: bool) -> Option<u64> {
    // The bytes in which every bit differs from `want` are skipped whole.
    let skip = if want { 0x00 } else { 0xff };
    let mut bit = first;
    while bit <= last {
        if bit & 7 == 0 && bit + 7 <= last && bytes[(bit >> 3) as usize] == skip {
            bit += 8;
            continue;
        }
        if bit_at(bytes, bit) == want {
            return Some(bit);
        }
        bit += 1;
    }
    None
}

pub fn bitcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let range = match a.len() {
        2 => None,
        4 | 5 => {
            let (start, end) = (parse_int(a[2])?, parse_int(a[3])?);
            let in_bits = if a.len() == 5 {
                parse_unit(a[4])?
            } else {
                false
            };
            Some((start, end, in_bits))
        }
        _ => return Err(ERR_SYNTAX.into()),
    };
    let (bytes, _, _) = current(ctx, a[1])?;
    let len = bytes.len() as i64;
    let bits = match range {
        None => clamp_range(0, len - 1, len).map(|rg| bit_range(rg, false)),
        // Both ends negative and crossed: empty, before any clamping.
        Some((start, end, _)) if start < 0 && end < 0 && start > end => None,
        Some((start, end, in_bits)) => {
            let total = if in_bits { len * 8 } else { len };
            clamp_range(start, end, total).map(|rg| bit_range(rg, in_bits))
        }
    };
    r.int(bits.map_or(0, |(f, l)| count_ones(&bytes, f, l)) as i64);
    Ok(())
}

pub fn bitpos(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let want = parse_int(a[2])?;
    if want != 0 && want != 1 {
        return Err(ERR_BIT_ARG.into());
    }
    let want = want == 1;
    // (start, end if given, counted in bits); the unit is parsed before the end, as in
    // Redis, so a bad unit wins over a bad end.
    let range = match a.len() {
        3 => None,
        4..=6 => {
            let start = parse_int(a[3])?;
            let in_bits = if a.len() == 6 {
                parse_unit(a[5])?
            } else {
                false
            };
            let end = if a.len() >= 5 {
                Some(parse_int(a[4])?)
            } else {
                None
            };
            Some((start, end, in_bits))
        }
        _ => return Err(ERR_SYNTAX.into()),
    };
    let Some(v) = read_string(ctx, a[1])? else {
        // A missing key is an infinite run of zeros.
        r.int(if want { -1 } else { 0 });
        return Ok(());
    };
    let bytes = v.bytes;
    let len = bytes.len() as i64;
    let (start, end, in_bits) = range.unwrap_or((0, None, false));
    let end_given = end.is_some();
    let total = if in_bits { len * 8 } else { len };
    let Some(units) = clamp_range(start, end.unwrap_or(total - 1), total) else {
        r.int(-1);
        return Ok(());
    };
    let (first, last) = bit_range(units, in_bits);
    let pos = match first_bit(&bytes, first, last, want) {
        Some(p) => p as i64,
        // Looking for a clear bit without an explicit end: the string continues with
        // zeros, so the answer is the first bit past it.
        None if !want && !end_given => last as i64 + 1,
        None => -1,
    };
    r.int(pos);
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BitOp {
    And,
    Or,
    Xor,
    Not,
}

pub fn bitop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let name = c_str(a[1]);
    let op = if eq_ic(name, "and") {
        BitOp::And
    } else if eq_ic(name, "or") {
        BitOp::Or
    } else if eq_ic(name, "xor") {
        BitOp::Xor
    } else if eq_ic(name, "not") {
        BitOp::Not
    } else {
        return Err(ERR_SYNTAX.into());
    };
    if op == BitOp::Not && a.len() != 4 {
        return Err(ERR_BITOP_NOT.into());
    }
    let mut sources = Vec::with_capacity(a.len() - 3);
    for key in &a[3..] {
        sources.push(current(ctx, key)?.0);
    }
    let out_len = sources.iter().map(Vec::len).max().unwrap_or(0);
    // Shorter sources (and missing keys) read as zero bytes up to the longest.
    let byte = |s: &Vec<u8>, i: usize| s.get(i).copied().unwrap_or(0);
    let mut out = match op {
        BitOp::Not => sources[0].iter().map(|b| !b).collect::<Vec<u8>>(),
        _ => sources[0].clone(),
    };
    out.resize(out_len, if op == BitOp::Not { 0xff } else { 0 });
    for src in &sources[1..] {
        for (i, o) in out.iter_mut().enumerate() {
            let b = byte(src, i);
            match op {
                BitOp::And => *o &= b,
                BitOp::Or => *o |= b,
                BitOp::Xor => *o ^= b,
                BitOp::Not => unreachable!("NOT has one source"),
            }
        }
    }
    let dest = a[2];
    if out_len > 0 {
        // The result replaces the destination whole, without its old expiry.
        write_string(ctx, dest, &out, None)?;
        ctx.notify(super::events::STRING, "set", dest);
    } else {
        let (db, now) = (ctx.db, ctx.now_ms);
        if ctx
            .shards
            .for_key(dest)
            .delete(db, dest, now)
            .map_err(storage_error)?
        {
            ctx.notify(super::events::GENERIC, "del", dest);
        }
    }
    r.int(out_len as i64);
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FieldOp {
    Get,
    Set(i64),
    IncrBy(i64),
}

#[derive(Clone, Copy, Debug)]
struct Field {
    op: FieldOp,
    signed: bool,
    bits: u32,
    offset: u64,
    overflow: Overflow,
}

/// Parses `i<bits>` / `u<bits>`: case-sensitive, as in Redis.
fn parse_field_type(arg: &[u8]) -> Result<(bool, u32), String> {
    let arg = c_str(arg);
    let signed = match arg.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return Err(ERR_BITFIELD_TYPE.into()),
    };
    let bits = crate::resp::parse::parse_i64(&arg[1..]).ok_or(ERR_BITFIELD_TYPE)?;
    let max = if signed {
        SIGNED_BITS_MAX
    } else {
        UNSIGNED_BITS_MAX
    };
    if bits < 1 || bits > max as i64 {
        return Err(ERR_BITFIELD_TYPE.into());
    }
    Ok((signed, bits as u32))
}

/// Parses BITFIELD's subcommands into the operations to run, in order.
fn parse_fields(a: &[&[u8]], max_bulk: usize) -> Result<Vec<Field>, String> {
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut j = 2;
    while j < a.len() {
        let left = a.len() - j - 1;
        let sub = c_str(a[j]);
        let op_args = if eq_ic(sub, "get") && left >= 2 {
            2
        } else if (eq_ic(sub, "set") || eq_ic(sub, "incrby")) && left >= 3 {
            3
        } else if eq_ic(sub, "overflow") && left >= 1 {
            let kind = c_str(a[j + 1]);
            overflow = if eq_ic(kind, "wrap") {
                Overflow::Wrap
            } else if eq_ic(kind, "sat") {
                Overflow::Sat
            } else if eq_ic(kind, "fail") {
                Overflow::Fail
            } else {
                return Err(ERR_OVERFLOW_TYPE.into());
            };
            j += 2;
            continue;
        } else {
            return Err(ERR_SYNTAX.into());
        };
        let (signed, bits) = parse_field_type(a[j + 1])?;
        let offset = parse_bit_offset(a[j + 2], Some(bits), max_bulk)?;
        let op = if op_args == 2 {
            FieldOp::Get
        } else {
            let n = parse_int(a[j + 3])?;
            if eq_ic(sub, "set") {
                FieldOp::Set(n)
            } else {
                FieldOp::IncrBy(n)
            }
        };
        fields.push(Field {
            op,
            signed,
            bits,
            offset,
            overflow,
        });
        j += 1 + op_args;
    }
    Ok(fields)
}

/// Reads `bits` bits from bit `offset` (zeros past the end), most significant first.
fn get_unsigned(bytes: &[u8], offset: u64, bits: u32) -> u64 {
    (0..bits as u64).fold(0, |v, i| (v << 1) | bit_at(bytes, offset + i) as u64)
}

fn get_signed(bytes: &[u8], offset: u64, bits: u32) -> i64 {
    let v = get_unsigned(bytes, offset, bits);
    if bits < 64 && v >> (bits - 1) & 1 == 1 {
        (v | (u64::MAX << bits)) as i64
    } else {
        v as i64
    }
}

/// Writes the low `bits` bits of `value` at bit `offset`; `bytes` is long enough.
fn put_bits(bytes: &mut [u8], offset: u64, bits: u32, value: u64) {
    for i in 0..bits as u64 {
        let bit = offset + i;
        let mask = 0x80u8 >> (bit & 7);
        let byte = &mut bytes[(bit >> 3) as usize];
        if value >> (bits as u64 - 1 - i) & 1 == 1 {
            *byte |= mask;
        } else {
            *byte &= !mask;
        }
    }
}

/// `value + incr` in a signed field of `bits`: the value to store, or `None` when it
/// overflows under FAIL. The range tests use Redis's wrapping arithmetic, which also
/// decides SET values far below the field's range (they count as *over*flow and
/// saturate to the maximum, as in Redis).
fn signed_add(value: i64, incr: i64, bits: u32, mode: Overflow) -> Option<i64> {
    let max = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let room_up = (max as u64).wrapping_sub(value as u64) as i64;
    let room_down = min.wrapping_sub(value);
    let narrow = bits != 64;
    let over =
        value > max || (narrow && incr > room_up) || (value >= 0 && incr > 0 && incr > room_up);
    let under = !over
        && (value < min
            || (narrow && incr < room_down)
            || (value < 0 && incr < 0 && incr < room_down));
    if !over && !under {
        return Some(value.wrapping_add(incr));
    }
    match mode {
        Overflow::Fail => None,
        Overflow::Sat => Some(if over { max } else { min }),
        Overflow::Wrap => {
            let sum = (value as u64).wrapping_add(incr as u64);
            if !narrow {
                return Some(sum as i64);
            }
            let high = u64::MAX << bits;
            Some(if sum >> (bits - 1) & 1 == 1 {
                (sum | high) as i64
            } else {
                (sum & !high) as i64
            })
        }
    }
}

/// `value + incr` in an unsigned field of `bits` (at most 63), as `signed_add`.
fn unsigned_add(value: u64, incr: i64, bits: u32, mode: Overflow) -> Option<u64> {
    let max = (1u64 << bits) - 1;
    let room_up = max.wrapping_sub(value) as i64;
    let room_down = (value as i64).wrapping_neg();
    let over = value > max || (incr > 0 && incr > room_up);
    let under = !over && incr < 0 && incr < room_down;
    let sum = value.wrapping_add(incr as u64);
    if !over && !under {
        return Some(sum);
    }
    match mode {
        Overflow::Fail => None,
        Overflow::Sat => Some(if over { max } else { 0 }),
        Overflow::Wrap => Some(sum & max),
    }
}

/// Runs one SET or INCRBY on `bytes`: the reply (`None` for a FAIL overflow) and
/// whether the field changed.
fn apply_write(bytes: &mut [u8], f: &Field) -> (Option<i64>, bool) {
    let (delta, is_set) = match f.op {
        FieldOp::Set(v) => (v, true),
        FieldOp::IncrBy(d) => (d, false),
        FieldOp::Get => unreachable!("GET is not a write"),
    };
    if f.signed {
        let old = get_signed(bytes, f.offset, f.bits);
        let new = if is_set {
            signed_add(delta, 0, f.bits, f.overflow)
        } else {
            signed_add(old, delta, f.bits, f.overflow)
        };
        let Some(new) = new else {
            return (None, false);
        };
        put_bits(bytes, f.offset, f.bits, new as u64);
        (Some(if is_set { old } else { new }), old != new)
    } else {
        let old = get_unsigned(bytes, f.offset, f.bits);
        let new = if is_set {
            unsigned_add(delta as u64, 0, f.bits, f.overflow)
        } else {
            unsigned_add(old, delta, f.bits, f.overflow)
        };
        let Some(new) = new else {
            return (None, false);
        };
        put_bits(bytes, f.offset, f.bits, new);
        // Fields are at most 63 bits wide, so the reply fits a signed integer.
        (Some((if is_set { old } else { new }) as i64), old != new)
    }
}

fn read_field(bytes: &[u8], f: &Field) -> i64 {
    if f.signed {
        get_signed(bytes, f.offset, f.bits)
    } else {
        get_unsigned(bytes, f.offset, f.bits) as i64
    }
}

fn bitfield_common(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, read_only: bool) -> CmdResult {
    let fields = parse_fields(a, ctx.max_bulk)?;
    // The last bit any write reaches: the string grows to hold it before the first op.
    let reach = fields
        .iter()
        .filter(|f| f.op != FieldOp::Get)
        .map(|f| f.offset + f.bits as u64 - 1)
        .max();
    let Some(reach) = reach else {
        let (bytes, _, _) = current(ctx, a[1])?;
        r.array(fields.len());
        for f in &fields {
            r.int(read_field(&bytes, f));
        }
        return Ok(());
    };
    if read_only {
        return Err(ERR_BITFIELD_RO.into());
    }
    let (mut bytes, ttl, existed) = current(ctx, a[1])?;
    let need = (reach >> 3) as usize + 1;
    // Redis creates or grows the key even when every write then fails its overflow test.
    let mut dirty = !existed || bytes.len() < need;
    if bytes.len() < need {
        bytes.resize(need, 0);
    }
    let mut replies = Vec::with_capacity(fields.len());
    for f in &fields {
        if f.op == FieldOp::Get {
            replies.push(Some(read_field(&bytes, f)));
        } else {
            let (reply, changed) = apply_write(&mut bytes, f);
            dirty |= changed;
            replies.push(reply);
        }
    }
    if dirty {
        write_string(ctx, a[1], &bytes, ttl)?;
        ctx.notify(super::events::STRING, "setbit", a[1]);
    }
    r.array(replies.len());
    for reply in replies {
        match reply {
            Some(v) => r.int(v),
            None => r.null(),
        }
    }
    Ok(())
}

pub fn bitfield(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bitfield_common(ctx, a, r, false)
}

pub fn bitfield_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bitfield_common(ctx, a, r, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Offsets: plain, `#n` scaled by the width, negatives and past-the-limit refused.
    #[test]
    fn bit_offsets() {
        assert_eq!(parse_bit_offset(b"17", None, 1 << 20), Ok(17));
        assert_eq!(parse_bit_offset(b"#3", Some(8), 1 << 20), Ok(24));
        assert!(parse_bit_offset(b"#3", None, 1 << 20).is_err());
        assert!(parse_bit_offset(b"-1", None, 1 << 20).is_err());
        assert!(parse_bit_offset(b"#-1", Some(8), 1 << 20).is_err());
        assert_eq!(parse_bit_offset(b"8388607", None, 1 << 20), Ok(8_388_607));
        assert!(parse_bit_offset(b"8388608", None, 1 << 20).is_err());
        assert!(parse_bit_offset(b"1.5", None, 1 << 20).is_err());
        assert!(parse_bit_offset(b"", None, 1 << 20).is_err());
    }

    // Bitfield types: i1..i64 and u1..u63, lowercase only.
    #[test]
    fn field_types() {
        assert_eq!(parse_field_type(b"i64"), Ok((true, 64)));
        assert_eq!(parse_field_type(b"u63"), Ok((false, 63)));
        assert_eq!(parse_field_type(b"u1"), Ok((false, 1)));
        for bad in [
            &b"u64"[..],
            b"i65",
            b"i0",
            b"U8",
            b"I8",
            b"8",
            b"",
            b"i",
            b"i08",
            b"i+8",
        ] {
            assert!(parse_field_type(bad).is_err(), "{:?}", bad);
        }
    }

    // Field reads and writes are MSB-first and sign-extend; reads past the end are zero.
    #[test]
    fn field_bits() {
        let mut b = vec![0u8; 3];
        put_bits(&mut b, 4, 8, 0xab);
        assert_eq!(b, [0x0a, 0xb0, 0x00]);
        assert_eq!(get_unsigned(&b, 4, 8), 0xab);
        assert_eq!(get_signed(&b, 4, 8), 0xab_u8 as i8 as i64);
        assert_eq!(get_unsigned(&b, 20, 16), 0);
        put_bits(&mut b, 0, 24, 0xff_ffff);
        assert_eq!(get_signed(&b, 0, 24), -1);
        assert_eq!(get_unsigned(&[0xff; 8], 0, 63), (1 << 63) - 1);
        assert_eq!(get_signed(&[0xff; 8], 0, 64), -1);
    }

    // Overflow: wrap, saturate and fail for signed and unsigned fields.
    #[test]
    fn overflow_modes() {
        use Overflow::*;
        assert_eq!(signed_add(127, 1, 8, Wrap), Some(-128));
        assert_eq!(signed_add(127, 1, 8, Sat), Some(127));
        assert_eq!(signed_add(127, 1, 8, Fail), None);
        assert_eq!(signed_add(-128, -1, 8, Sat), Some(-128));
        assert_eq!(signed_add(-128, -1, 8, Wrap), Some(127));
        assert_eq!(signed_add(5, -3, 8, Fail), Some(2));
        assert_eq!(signed_add(i64::MAX, 1, 64, Wrap), Some(i64::MIN));
        assert_eq!(signed_add(i64::MIN, -1, 64, Sat), Some(i64::MIN));
        // SET of a value far below an i8's range counts as overflow upwards (Redis).
        assert_eq!(signed_add(i64::MIN, 0, 8, Sat), Some(127));
        assert_eq!(signed_add(-1000, 0, 8, Sat), Some(-128));
        assert_eq!(unsigned_add(255, 1, 8, Wrap), Some(0));
        assert_eq!(unsigned_add(255, 1, 8, Sat), Some(255));
        assert_eq!(unsigned_add(0, -1, 8, Sat), Some(0));
        assert_eq!(unsigned_add(0, -1, 8, Wrap), Some(255));
        assert_eq!(unsigned_add(0, -1, 8, Fail), None);
        // SET u8 -1: the value reads as huge, so it saturates to the maximum.
        assert_eq!(unsigned_add(-1i64 as u64, 0, 8, Sat), Some(255));
        assert_eq!(unsigned_add(-1i64 as u64, 0, 8, Wrap), Some(255));
        assert_eq!(unsigned_add(300, 0, 8, Wrap), Some(44));
    }

    // Counting and searching bit ranges, including partial first and last bytes.
    #[test]
    fn ranges() {
        let b = [0b1010_0000u8, 0xff, 0x00, 0b0000_0001];
        assert_eq!(count_ones(&b, 0, 31), 11);
        assert_eq!(count_ones(&b, 1, 2), 1);
        assert_eq!(count_ones(&b, 2, 9), 3);
        assert_eq!(first_bit(&b, 3, 31, true), Some(8));
        assert_eq!(first_bit(&b, 16, 30, true), None);
        assert_eq!(first_bit(&b, 16, 31, true), Some(31));
        assert_eq!(first_bit(&b, 8, 15, false), None);
        assert_eq!(first_bit(&b, 1, 31, false), Some(1));
        assert_eq!(clamp_range(-2, -1, 4), Some((2, 3)));
        assert_eq!(clamp_range(5, 10, 4), None);
        assert_eq!(clamp_range(0, -1, 0), None);
        assert_eq!(clamp_range(-100, 100, 4), Some((0, 3)));
    }
}
