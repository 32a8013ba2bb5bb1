//! Hash commands (Redis 7.2 semantics, replies and error texts): HSET HSETNX HMSET HGET
//! HMGET HDEL HLEN HSTRLEN HEXISTS HKEYS HVALS HGETALL HINCRBY HINCRBYFLOAT HRANDFIELD
//! HSCAN. Every handler loads its key once (`collection::load_hash`), then writes at most
//! once, so nothing is half-applied.

use super::collection::{
    load_hash, load_hash_for, open_hash, parse_cursor, parse_rand_count, parse_scan_opts,
    point_read, point_write, random_below, random_ranks, scan_reply, scan_step, store_hash, Loaded,
    Opened, Point, Preloaded,
};
use super::events::{GENERIC, HASH};
use super::{eq_ic, glob_match, parse_int, storage_error, wrong_args, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::encode::Proto;
use crate::resp::parse::parse_i64;
use crate::resp::ReplyBuf;
use crate::storage::collection::{HashEncoding, HashValue};
use crate::storage::paged::PointOp;
use crate::storage::{paged, ValueKind};

/// Field/value pairs as a reply is built from them.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The hash at `key` with (at least) the fields `names` read, or a new empty one.
fn load_or_new(
    ctx: &mut Ctx,
    key: &[u8],
    names: &[&[u8]],
    pre: Preloaded,
) -> Result<Loaded<HashValue>, String> {
    Ok(load_hash_for(ctx, key, names, pre)?.unwrap_or(Loaded {
        value: HashValue::new(),
        expire_at_ms: None,
    }))
}

/// HSET and HMSET: sets every pair, returns how many fields were new.
fn set_pairs(ctx: &mut Ctx, a: &[&[u8]], name: &str) -> Result<i64, String> {
    if a.len() % 2 == 1 {
        return Err(wrong_args(name));
    }
    let mut pre = Preloaded::default();
    if let [_, key, field, value] = a {
        let put = |_: Option<&[u8]>| Some(PointOp::Upsert(Some(value.to_vec())));
        match point_write(ctx, key, ValueKind::Hash, field, put)? {
            Ok(existed) => {
                ctx.notify(HASH, "hset", key);
                return Ok(i64::from(!existed));
            }
            Err(loaded) => pre = loaded,
        }
    }
    let fields: Vec<&[u8]> = a[2..].iter().step_by(2).copied().collect();
    let mut h = load_or_new(ctx, a[1], &fields, pre)?;
    let longest = a[2..].iter().map(|x| x.len()).max().unwrap_or(0);
    h.value.prepare_write((a.len() - 2) / 2, longest);
    let mut added = 0;
    for pair in a[2..].chunks_exact(2) {
        added += h.value.set(pair[0], pair[1]) as i64;
    }
    store_hash(ctx, a[1], &h.value, h.expire_at_ms)?;
    ctx.notify(HASH, "hset", a[1]);
    Ok(added)
}

pub fn hset(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = set_pairs(ctx, a, "hset")?;
    r.int(n);
    Ok(())
}

pub fn hmset(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    set_pairs(ctx, a, "hmset")?;
    r.ok();
    Ok(())
}

pub fn hsetnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let put = |old: Option<&[u8]>| old.is_none().then(|| PointOp::Upsert(Some(a[3].to_vec())));
    let pre = match point_write(ctx, a[1], ValueKind::Hash, a[2], put)? {
        Ok(existed) => {
            if !existed {
                ctx.notify(HASH, "hset", a[1]);
            }
            r.int(i64::from(!existed));
            return Ok(());
        }
        Err(loaded) => loaded,
    };
    let mut h = load_or_new(ctx, a[1], &a[2..3], pre)?;
    if h.value.get(a[2]).is_some() {
        r.int(0);
        return Ok(());
    }
    h.value.prepare_write(1, a[2].len().max(a[3].len()));
    h.value.set(a[2], a[3]);
    store_hash(ctx, a[1], &h.value, h.expire_at_ms)?;
    ctx.notify(HASH, "hset", a[1]);
    r.int(1);
    Ok(())
}

/// One field of `key` through a point read (one leaf of a paged hash).
fn field_of(ctx: &mut Ctx, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let q = Point::Lookup(vec![field.to_vec()]);
    Ok(point_read(ctx, key, ValueKind::Hash, &q)?.and_then(|(_, mut f)| f.pop().flatten()))
}

pub fn hget(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    match field_of(ctx, a[1], a[2])? {
        Some(v) => r.bulk(&v),
        None => r.null(),
    }
    Ok(())
}

/// HMGET: a point read of the asked fields (of a paged hash only the directory pages and
/// leaves that can hold them).
pub fn hmget(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let q = Point::Lookup(a[2..].iter().map(|f| f.to_vec()).collect());
    let found = point_read(ctx, a[1], ValueKind::Hash, &q)?;
    r.array(a.len() - 2);
    for i in 0..a.len() - 2 {
        match found.as_ref().and_then(|(_, f)| f[i].as_ref()) {
            Some(v) => r.bulk(v),
            None => r.null(),
        }
    }
    Ok(())
}

pub fn hdel(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let mut pre = Preloaded::default();
    if let [_, key, field] = a {
        let remove = |old: Option<&[u8]>| old.map(|_| PointOp::Remove);
        match point_write(ctx, key, ValueKind::Hash, field, remove)? {
            Ok(existed) => {
                if existed {
                    ctx.notify(HASH, "hdel", key);
                }
                r.int(i64::from(existed));
                return Ok(());
            }
            Err(loaded) => pre = loaded,
        }
    }
    let Some(mut h) = load_hash_for(ctx, a[1], &a[2..], pre)? else {
        r.int(0);
        return Ok(());
    };
    let removed = a[2..].iter().filter(|f| h.value.remove(f)).count();
    if removed > 0 {
        store_hash(ctx, a[1], &h.value, h.expire_at_ms)?;
        ctx.notify(HASH, "hdel", a[1]);
        if h.value.is_empty() {
            ctx.notify(GENERIC, "del", a[1]);
        }
    }
    r.int(removed as i64);
    Ok(())
}

pub fn hlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = point_read(ctx, a[1], ValueKind::Hash, &Point::Count)?.map_or(0, |(n, _)| n);
    r.int(n as i64);
    Ok(())
}

pub fn hstrlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = field_of(ctx, a[1], a[2])?.map_or(0, |v| v.len());
    r.int(n as i64);
    Ok(())
}

pub fn hexists(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let there = field_of(ctx, a[1], a[2])?.is_some();
    r.int(there as i64);
    Ok(())
}

pub fn hkeys(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let h = load_hash(ctx, a[1])?;
    let pairs = h.as_ref().map_or(&[][..], |h| h.value.pairs());
    r.array(pairs.len());
    for (f, _) in pairs {
        r.bulk(f);
    }
    Ok(())
}

pub fn hvals(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let h = load_hash(ctx, a[1])?;
    let pairs = h.as_ref().map_or(&[][..], |h| h.value.pairs());
    r.array(pairs.len());
    for (_, v) in pairs {
        r.bulk(v);
    }
    Ok(())
}

pub fn hgetall(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let h = load_hash(ctx, a[1])?;
    let pairs = h.as_ref().map_or(&[][..], |h| h.value.pairs());
    r.map(pairs.len());
    for (f, v) in pairs {
        r.bulk(f);
        r.bulk(v);
    }
    Ok(())
}

pub fn hincrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let incr = parse_int(a[3])?;
    let add = |old: Option<&[u8]>| -> Result<i64, String> {
        let old = match old {
            Some(v) => parse_i64(v).ok_or("ERR hash value is not an integer")?,
            None => 0,
        };
        Ok(old
            .checked_add(incr)
            .ok_or("ERR increment or decrement would overflow")?)
    };
    let mut sum = None;
    let put = |old: Option<&[u8]>| {
        let r = add(old);
        let op = r
            .as_ref()
            .ok()
            .map(|n| PointOp::Upsert(Some(n.to_string().into_bytes())));
        sum = Some(r);
        op
    };
    let pre = match point_write(ctx, a[1], ValueKind::Hash, a[2], put)? {
        Ok(_) => {
            let new = sum.expect("decided once the leaf was read")?;
            ctx.notify(HASH, "hincrby", a[1]);
            r.int(new);
            return Ok(());
        }
        Err(loaded) => loaded,
    };
    let mut h = load_or_new(ctx, a[1], &a[2..3], pre)?;
    let old = match h.value.get(a[2]) {
        Some(v) => parse_i64(v).ok_or("ERR hash value is not an integer")?,
        None => 0,
    };
    let new = old
        .checked_add(incr)
        .ok_or("ERR increment or decrement would overflow")?;
    h.value.set(a[2], new.to_string().as_bytes());
    store_hash(ctx, a[1], &h.value, h.expire_at_ms)?;
    ctx.notify(HASH, "hincrby", a[1]);
    r.int(new);
    Ok(())
}

pub fn hincrbyfloat(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    // Redis's order of checks, and its C `long double` arithmetic (as INCRBYFLOAT).
    match ldouble_sys::check(a[3]) {
        None => return Err("ERR value is not a valid float".into()),
        Some(false) => return Err("ERR value is NaN or Infinity".into()),
        Some(true) => {}
    }
    let mut h = load_or_new(ctx, a[1], &a[2..3], Preloaded::default())?;
    let old = h.value.get(a[2]).map(|v| v.to_vec());
    if old
        .as_deref()
        .is_some_and(|v| ldouble_sys::check(v).is_none())
    {
        return Err("ERR hash value is not a float".into());
    }
    let s = ldouble_sys::incr(old.as_deref(), a[3]).map_err(|e| match e {
        ldouble_sys::IncrError::NanOrInfinity => {
            "ERR increment would produce NaN or Infinity".to_string()
        }
        _ => "ERR hash value is not a float".to_string(),
    })?;
    h.value.set(a[2], s.as_bytes());
    store_hash(ctx, a[1], &h.value, h.expire_at_ms)?;
    ctx.notify(HASH, "hincrbyfloat", a[1]);
    r.bulk(s.as_bytes());
    Ok(())
}

/// HRANDFIELD key [count [WITHVALUES]]. On a paged hash only the leaves holding the
/// picked fields are read (ranks found by the counts in the root and directory pages);
/// a count covering the whole hash reads it whole.
pub fn hrandfield(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let count = match a.len() {
        2 => None,
        _ => Some(parse_rand_count(a[2])?),
    };
    let with_values = match a.len() {
        2 | 3 => false,
        4 if eq_ic(a[3], "withvalues") => true,
        _ => return Err(ERR_SYNTAX.into()),
    };
    let Some(h) = open_hash(ctx, a[1])? else {
        match count {
            None => r.null(),
            Some(_) => r.array(0),
        }
        return Ok(());
    };
    let n = match &h {
        Opened::Whole(v) => v.len(),
        Opened::Paged(root) => root.count as usize,
    };
    if n == 0 {
        match count {
            None => r.null(),
            Some(_) => r.array(0),
        }
        return Ok(());
    }
    let whole = count.is_some_and(|c| c >= 0 && c as usize >= n);
    let picks: Vec<usize> = match count {
        None => vec![random_below(n)],
        Some(_) if whole => (0..n).collect(),
        Some(c) => random_ranks(n, c),
    };
    let (pairs, picks): (Pairs, Vec<usize>) = match h {
        Opened::Whole(v) => (v.pairs().to_vec(), picks),
        Opened::Paged(_) if whole => match load_hash(ctx, a[1])? {
            Some(v) => (v.value.pairs().to_vec(), picks),
            None => (Vec::new(), Vec::new()),
        },
        Opened::Paged(root) => {
            let (db, shard) = (ctx.db, ctx.shards.for_key(a[1]));
            let ranks: Vec<u64> = picks.iter().map(|&i| i as u64).collect();
            let got = paged::pick(shard, db, a[1], &root, &ranks, true).map_err(storage_error)?;
            let k = got.len();
            (got, (0..k).collect())
        }
    };
    if count.is_none() {
        r.bulk(&pairs[picks[0]].0);
        return Ok(());
    }
    write_pairs(r, &pairs, &picks, with_values);
    Ok(())
}

/// HRANDFIELD's reply: fields, or field/value pairs (flat in RESP2, 2-arrays in RESP3).
fn write_pairs(r: &mut ReplyBuf, pairs: &[(Vec<u8>, Vec<u8>)], picks: &[usize], with_values: bool) {
    let resp3 = r.proto == Proto::Resp3;
    if with_values && !resp3 {
        r.array(picks.len() * 2);
    } else {
        r.array(picks.len());
    }
    for &i in picks {
        let (f, v) = &pairs[i];
        if with_values && resp3 {
            r.array(2);
        }
        r.bulk(f);
        if with_values {
            r.bulk(v);
        }
    }
}

/// HSCAN key cursor [MATCH pattern] [COUNT count]. On a paged hash a step reads one
/// directory page and the leaves it returns fields from (`paged::scan`).
pub fn hscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let cursor = parse_cursor(a[2])?;
    let Some(h) = open_hash(ctx, a[1])? else {
        scan_reply(r, 0, &[]);
        return Ok(());
    };
    let opts = parse_scan_opts(a)?;
    let (pairs, picked, next): (Pairs, Vec<usize>, u64) = match h {
        // Small encodings answer whole in one step with cursor 0, as Redis does.
        Opened::Whole(v) if v.encoding() == HashEncoding::Listpack => {
            let n = v.len();
            (v.pairs().to_vec(), (0..n).collect(), 0)
        }
        Opened::Whole(v) => {
            let (picked, next) = scan_step(
                v.pairs().iter().map(|(f, _)| f.as_slice()),
                cursor,
                opts.count,
            );
            (v.pairs().to_vec(), picked, next)
        }
        Opened::Paged(root) => {
            let (db, shard) = (ctx.db, ctx.shards.for_key(a[1]));
            let (got, next) = paged::scan(shard, db, a[1], &root, cursor, opts.count, true)
                .map_err(storage_error)?;
            let n = got.len();
            (got, (0..n).collect(), next)
        }
    };
    let mut items: Vec<&[u8]> = Vec::with_capacity(picked.len() * 2);
    for i in picked {
        let (f, v) = &pairs[i];
        if opts.pattern.is_none_or(|p| glob_match(p, f)) {
            items.push(f);
            items.push(v);
        }
    }
    scan_reply(r, next, &items);
    Ok(())
}
