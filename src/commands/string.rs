//! String commands (Redis 7 semantics, replies and error texts).

use super::events::{GENERIC, STRING};
use super::{
    eq_ic, parse_int, storage_error, wrong_args, CmdResult, Ctx, ERR_NOT_INT, ERR_SYNTAX,
    ERR_WRONGTYPE,
};
use crate::resp::ReplyBuf;
use crate::storage::{Value, ValueKind};

/// One LCS match: range in the first string, range in the second, length.
type LcsMatch = ((usize, usize), (usize, usize), usize);

const ERR_TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

/// Reads a key that must hold a string (or be missing).
pub fn read_string(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Value>, String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    match ctx
        .shards
        .for_key(key)
        .get(db, key, now)
        .map_err(storage_error)?
    {
        Some(v) if v.kind != ValueKind::String => Err(ERR_WRONGTYPE.into()),
        other => Ok(other),
    }
}

pub fn write_string(
    ctx: &mut Ctx,
    key: &[u8],
    bytes: &[u8],
    expire_at_ms: Option<u64>,
) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    ctx.shards
        .for_key(key)
        .put(db, key, ValueKind::String, bytes, expire_at_ms, now)
        .map_err(storage_error)
}

/// `write_string` for writes whose reply does not depend on the old value: the shard may
/// overwrite without reading the old record (`Shard::put_blind`).
pub fn write_string_blind(
    ctx: &mut Ctx,
    key: &[u8],
    bytes: &[u8],
    expire_at_ms: Option<u64>,
) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    ctx.shards
        .for_key(key)
        .put_blind(db, key, ValueKind::String, bytes, expire_at_ms, now)
        .map_err(storage_error)
}

/// The command (lower-case name) writes its keys without needing their old records: a
/// plain SET (no NX, XX, GET, KEEPTTL), SETEX, PSETEX, MSET. The asynchronous path plans
/// no reads for them when the shard takes blind writes.
pub fn blind_write(name: &str, args: &[&[u8]]) -> bool {
    match name {
        "setex" | "psetex" | "mset" => true,
        "set" => args
            .iter()
            .skip(3)
            .all(|o| !(eq_ic(o, "nx") || eq_ic(o, "xx") || eq_ic(o, "get") || eq_ic(o, "keepttl"))),
        _ => false,
    }
}

pub fn get(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    // The value is copied once, from where it lies (staging, a prefetched record, the
    // cache) into the reply; `read_string` is the general path.
    let (db, now) = (ctx.db, ctx.now_ms);
    let fast = ctx
        .shards
        .for_key(a[1])
        .get_in_place(db, a[1], now, |kind, v| {
            if kind != ValueKind::String {
                return Err(ERR_WRONGTYPE.to_string());
            }
            r.bulk(v);
            Ok(())
        });
    match fast {
        Some(Some(done)) => return done,
        Some(None) => {
            r.null();
            return Ok(());
        }
        None => {}
    }
    match read_string(ctx, a[1])? {
        Some(v) => r.bulk(&v.bytes),
        None => r.null(),
    }
    Ok(())
}

/// Parses a relative or absolute expire argument into absolute ms.
/// `unit_ms` is 1000 for seconds; `absolute` for EXAT/PXAT.
fn expire_at(
    arg: &[u8],
    unit_ms: i64,
    absolute: bool,
    now_ms: u64,
    cmd: &str,
) -> Result<u64, String> {
    let n = parse_int(arg)?;
    let invalid = || format!("ERR invalid expire time in '{cmd}' command");
    if n <= 0 {
        return Err(invalid());
    }
    let ms = n.checked_mul(unit_ms).ok_or_else(invalid)?;
    let at = if absolute {
        ms
    } else {
        ms.checked_add(now_ms as i64).ok_or_else(invalid)?
    };
    Ok(at as u64)
}

pub fn set(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (mut nx, mut xx, mut get_old, mut keepttl) = (false, false, false, false);
    let mut expire: Option<u64> = None;
    let mut i = 3;
    while i < a.len() {
        let o = a[i];
        let has_next = i + 1 < a.len();
        if eq_ic(o, "nx") && !xx {
            nx = true;
        } else if eq_ic(o, "xx") && !nx {
            xx = true;
        } else if eq_ic(o, "get") {
            get_old = true;
        } else if eq_ic(o, "keepttl") && expire.is_none() {
            keepttl = true;
        } else if (eq_ic(o, "ex") || eq_ic(o, "px") || eq_ic(o, "exat") || eq_ic(o, "pxat"))
            && expire.is_none()
            && !keepttl
            && has_next
        {
            let unit = if eq_ic(o, "ex") || eq_ic(o, "exat") {
                1000
            } else {
                1
            };
            let abs = eq_ic(o, "exat") || eq_ic(o, "pxat");
            expire = Some(expire_at(a[i + 1], unit, abs, ctx.now_ms, "set")?);
            i += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 1;
    }
    let key = a[1];
    let needs_old = nx || xx || get_old || keepttl;
    let old = if needs_old {
        if get_old {
            read_string(ctx, key)?
        } else {
            let (db, now) = (ctx.db, ctx.now_ms);
            ctx.shards
                .for_key(key)
                .get(db, key, now)
                .map_err(storage_error)?
        }
    } else {
        None
    };
    let exists = old.is_some();
    if (nx && exists) || (xx && !exists) {
        if get_old {
            match old {
                Some(v) => r.bulk(&v.bytes),
                None => r.null(),
            }
        } else {
            r.null();
        }
        return Ok(());
    }
    let ttl = if keepttl {
        old.as_ref().and_then(|v| v.expire_at_ms)
    } else {
        expire
    };
    if ttl.is_some_and(|t| t <= ctx.now_ms) {
        // An absolute time in the past: Redis sets and immediately expires.
        let (db, now) = (ctx.db, ctx.now_ms);
        ctx.shards
            .for_key(key)
            .delete(db, key, now)
            .map_err(storage_error)?;
    } else if needs_old {
        write_string(ctx, key, a[2], ttl)?;
    } else {
        write_string_blind(ctx, key, a[2], ttl)?;
    }
    ctx.notify(STRING, "set", key);
    if expire.is_some() {
        ctx.notify(GENERIC, "expire", key);
    }
    if get_old {
        match old {
            Some(v) => r.bulk(&v.bytes),
            None => r.null(),
        }
    } else {
        r.ok();
    }
    Ok(())
}

pub fn setnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    if ctx
        .shards
        .for_key(a[1])
        .exists(db, a[1], now)
        .map_err(storage_error)?
    {
        r.int(0);
    } else {
        write_string(ctx, a[1], a[2], None)?;
        ctx.notify(STRING, "set", a[1]);
        r.int(1);
    }
    Ok(())
}

fn setex_common(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, unit: i64, cmd: &str) -> CmdResult {
    let at = expire_at(a[2], unit, false, ctx.now_ms, cmd)?;
    write_string_blind(ctx, a[1], a[3], Some(at))?;
    ctx.notify(STRING, "set", a[1]);
    ctx.notify(GENERIC, "expire", a[1]);
    r.ok();
    Ok(())
}

pub fn setex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    setex_common(ctx, a, r, 1000, "setex")
}

pub fn psetex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    setex_common(ctx, a, r, 1, "psetex")
}

pub fn getset(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let old = read_string(ctx, a[1])?;
    write_string(ctx, a[1], a[2], None)?;
    ctx.notify(STRING, "set", a[1]);
    match old {
        Some(v) => r.bulk(&v.bytes),
        None => r.null(),
    }
    Ok(())
}

pub fn getdel(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    match read_string(ctx, a[1])? {
        Some(v) => {
            let (db, now) = (ctx.db, ctx.now_ms);
            ctx.shards
                .for_key(a[1])
                .delete(db, a[1], now)
                .map_err(storage_error)?;
            ctx.notify(GENERIC, "del", a[1]);
            r.bulk(&v.bytes);
        }
        None => r.null(),
    }
    Ok(())
}

pub fn getex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    // None: leave TTL; Some(None): persist; Some(Some(t)): set.
    let mut change: Option<Option<u64>> = None;
    let mut i = 2;
    while i < a.len() {
        let o = a[i];
        if eq_ic(o, "persist") && change.is_none() {
            change = Some(None);
        } else if (eq_ic(o, "ex") || eq_ic(o, "px") || eq_ic(o, "exat") || eq_ic(o, "pxat"))
            && change.is_none()
            && i + 1 < a.len()
        {
            let unit = if eq_ic(o, "ex") || eq_ic(o, "exat") {
                1000
            } else {
                1
            };
            let abs = eq_ic(o, "exat") || eq_ic(o, "pxat");
            change = Some(Some(expire_at(a[i + 1], unit, abs, ctx.now_ms, "getex")?));
            i += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 1;
    }
    let Some(v) = read_string(ctx, a[1])? else {
        r.null();
        return Ok(());
    };
    let (db, now) = (ctx.db, ctx.now_ms);
    match change {
        None => {}
        Some(Some(t)) if t <= now => {
            ctx.shards
                .for_key(a[1])
                .delete(db, a[1], now)
                .map_err(storage_error)?;
            ctx.notify(GENERIC, "del", a[1]);
        }
        Some(t) => {
            if t != v.expire_at_ms {
                ctx.shards
                    .for_key(a[1])
                    .set_expiry(db, a[1], t, now)
                    .map_err(storage_error)?;
            }
            // As Redis: every EX/PX/EXAT/PXAT is an `expire`; PERSIST only of a TTL.
            if t.is_some() {
                ctx.notify(GENERIC, "expire", a[1]);
            } else if v.expire_at_ms.is_some() {
                ctx.notify(GENERIC, "persist", a[1]);
            }
        }
    }
    r.bulk(&v.bytes);
    Ok(())
}

pub fn mget(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    let mut vals = Vec::with_capacity(a.len() - 1);
    for key in &a[1..] {
        let v = ctx
            .shards
            .for_key(key)
            .get(db, key, now)
            .map_err(storage_error)?;
        vals.push(v.filter(|v| v.kind == ValueKind::String));
    }
    r.array(vals.len());
    for v in vals {
        match v {
            Some(v) => r.bulk(&v.bytes),
            None => r.null(),
        }
    }
    Ok(())
}

pub fn mset(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len().is_multiple_of(2) {
        return Err(wrong_args("mset"));
    }
    for pair in a[1..].chunks(2) {
        write_string_blind(ctx, pair[0], pair[1], None)?;
        ctx.notify(STRING, "set", pair[0]);
    }
    r.ok();
    Ok(())
}

pub fn msetnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len().is_multiple_of(2) {
        return Err(wrong_args("msetnx"));
    }
    let (db, now) = (ctx.db, ctx.now_ms);
    for pair in a[1..].chunks(2) {
        if ctx
            .shards
            .for_key(pair[0])
            .exists(db, pair[0], now)
            .map_err(storage_error)?
        {
            r.int(0);
            return Ok(());
        }
    }
    for pair in a[1..].chunks(2) {
        write_string(ctx, pair[0], pair[1], None)?;
        ctx.notify(STRING, "set", pair[0]);
    }
    r.int(1);
    Ok(())
}

pub fn append(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let old = read_string(ctx, a[1])?;
    let (mut bytes, ttl) = match old {
        Some(v) => (v.bytes, v.expire_at_ms),
        None => (Vec::new(), None),
    };
    if bytes.len() + a[2].len() > ctx.max_bulk {
        return Err(ERR_TOO_BIG.into());
    }
    bytes.extend_from_slice(a[2]);
    write_string(ctx, a[1], &bytes, ttl)?;
    ctx.notify(STRING, "append", a[1]);
    r.int(bytes.len() as i64);
    Ok(())
}

pub fn strlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = read_string(ctx, a[1])?.map(|v| v.bytes.len()).unwrap_or(0);
    r.int(n as i64);
    Ok(())
}

pub fn getrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (mut start, mut end) = (parse_int(a[2])?, parse_int(a[3])?);
    let v = read_string(ctx, a[1])?.map(|v| v.bytes).unwrap_or_default();
    let len = v.len() as i64;
    if start < 0 && end < 0 && start > end {
        r.bulk(b"");
        return Ok(());
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if len == 0 || start > end {
        r.bulk(b"");
    } else {
        r.bulk(&v[start as usize..=end as usize]);
    }
    Ok(())
}

pub fn setrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let offset = parse_int(a[2])?;
    if offset < 0 {
        return Err("ERR offset is out of range".into());
    }
    let old = read_string(ctx, a[1])?;
    let val = a[3];
    if val.is_empty() {
        r.int(old.map(|v| v.bytes.len()).unwrap_or(0) as i64);
        return Ok(());
    }
    if offset as u64 + val.len() as u64 > ctx.max_bulk as u64 {
        return Err(ERR_TOO_BIG.into());
    }
    let (mut bytes, ttl) = match old {
        Some(v) => (v.bytes, v.expire_at_ms),
        None => (Vec::new(), None),
    };
    let end = offset as usize + val.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset as usize..end].copy_from_slice(val);
    write_string(ctx, a[1], &bytes, ttl)?;
    ctx.notify(STRING, "setrange", a[1]);
    r.int(bytes.len() as i64);
    Ok(())
}

fn incr_by(ctx: &mut Ctx, key: &[u8], delta: i64, r: &mut ReplyBuf) -> CmdResult {
    let old = read_string(ctx, key)?;
    let (cur, ttl) = match &old {
        Some(v) => (
            crate::resp::parse::parse_i64(&v.bytes).ok_or(ERR_NOT_INT)?,
            v.expire_at_ms,
        ),
        None => (0, None),
    };
    let new = cur
        .checked_add(delta)
        .ok_or("ERR increment or decrement would overflow")?;
    write_string(ctx, key, new.to_string().as_bytes(), ttl)?;
    ctx.notify(STRING, "incrby", key);
    r.int(new);
    Ok(())
}

pub fn incr(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    incr_by(ctx, a[1], 1, r)
}

pub fn decr(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    incr_by(ctx, a[1], -1, r)
}

pub fn incrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let d = parse_int(a[2])?;
    incr_by(ctx, a[1], d, r)
}

pub fn decrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let d = parse_int(a[2])?;
    let d = d.checked_neg().ok_or("ERR decrement would overflow")?;
    incr_by(ctx, a[1], d, r)
}

pub fn incrbyfloat(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let old = read_string(ctx, a[1])?;
    // Redis adds in C `long double` and prints with "%.17Lf": so does lavik.
    let s =
        ldouble_sys::incr(old.as_ref().map(|v| v.bytes.as_slice()), a[2]).map_err(|e| match e {
            ldouble_sys::IncrError::NanOrInfinity => {
                "ERR increment would produce NaN or Infinity".to_string()
            }
            _ => "ERR value is not a valid float".to_string(),
        })?;
    write_string(ctx, a[1], s.as_bytes(), old.and_then(|v| v.expire_at_ms))?;
    ctx.notify(STRING, "incrbyfloat", a[1]);
    r.bulk(s.as_bytes());
    Ok(())
}

pub fn lcs(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (mut want_len, mut want_idx, mut with_match_len) = (false, false, false);
    let mut min_match_len: i64 = 0;
    let mut i = 3;
    while i < a.len() {
        if eq_ic(a[i], "len") {
            want_len = true;
        } else if eq_ic(a[i], "idx") {
            want_idx = true;
        } else if eq_ic(a[i], "withmatchlen") {
            with_match_len = true;
        } else if eq_ic(a[i], "minmatchlen") && i + 1 < a.len() {
            min_match_len = parse_int(a[i + 1])?.max(0);
            i += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 1;
    }
    if want_len && want_idx {
        return Err("ERR If you want both the length and indexes, please just use IDX.".into());
    }
    let x = read_string(ctx, a[1])?.map(|v| v.bytes).unwrap_or_default();
    let y = read_string(ctx, a[2])?.map(|v| v.bytes).unwrap_or_default();
    let cells = (x.len() as u64 + 1) * (y.len() as u64 + 1);
    if cells.saturating_mul(4) > ctx.max_bulk as u64 {
        return Err(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len".into(),
        );
    }
    let w = y.len() + 1;
    let mut dp = vec![0u32; (x.len() + 1) * w];
    for i in 1..=x.len() {
        for j in 1..=y.len() {
            dp[i * w + j] = if x[i - 1] == y[j - 1] {
                dp[(i - 1) * w + j - 1] + 1
            } else {
                dp[(i - 1) * w + j].max(dp[i * w + j - 1])
            };
        }
    }
    let total = dp[x.len() * w + y.len()] as usize;
    if want_len {
        r.int(total as i64);
        return Ok(());
    }
    // Walk back from the end, collecting the LCS and (for IDX) the ranges.
    let mut out = vec![0u8; total];
    let mut idx = total;
    let (mut i, mut j) = (x.len(), y.len());
    let mut matches: Vec<LcsMatch> = Vec::new();
    let mut cur: Option<((usize, usize), (usize, usize))> = None;
    while i > 0 && j > 0 {
        if x[i - 1] == y[j - 1] {
            idx -= 1;
            out[idx] = x[i - 1];
            match &mut cur {
                Some((ra, rb)) if ra.0 == i && rb.0 == j => {
                    ra.0 = i - 1;
                    rb.0 = j - 1;
                }
                _ => {
                    if let Some((ra, rb)) = cur.take() {
                        matches.push((ra, rb, ra.1 - ra.0 + 1));
                    }
                    cur = Some(((i - 1, i - 1), (j - 1, j - 1)));
                }
            }
            i -= 1;
            j -= 1;
        } else if dp[(i - 1) * w + j] > dp[i * w + j - 1] {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    if let Some((ra, rb)) = cur.take() {
        matches.push((ra, rb, ra.1 - ra.0 + 1));
    }
    if !want_idx {
        r.bulk(&out);
        return Ok(());
    }
    let kept: Vec<_> = matches
        .into_iter()
        .filter(|m| m.2 as i64 >= min_match_len)
        .collect();
    r.map(2);
    r.bulk_str("matches");
    r.array(kept.len());
    for (ra, rb, len) in kept {
        r.array(if with_match_len { 3 } else { 2 });
        r.array(2);
        r.int(ra.0 as i64);
        r.int(ra.1 as i64);
        r.array(2);
        r.int(rb.0 as i64);
        r.int(rb.1 as i64);
        if with_match_len {
            r.int(len as i64);
        }
    }
    r.bulk_str("len");
    r.int(total as i64);
    Ok(())
}
