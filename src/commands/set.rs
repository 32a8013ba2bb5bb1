//! Set commands (Redis 7.2 semantics, replies and error texts): SADD SREM SCARD SISMEMBER
//! SMISMEMBER SMEMBERS SRANDMEMBER SPOP SMOVE SINTER SINTERCARD SINTERSTORE SUNION
//! SUNIONSTORE SDIFF SDIFFSTORE SSCAN.
//!
//! Multi-key commands read every source before writing the destination; the router holds
//! all their shards on one thread for the call, so they are atomic across workers.
//! Results are built the way Redis 7.2 builds them (an empty intset filled member by
//! member), so their encoding and order match Redis's for the small encodings.

use super::collection::{
    distinct_indexes, load_set, load_set_for, parse_cursor, parse_rand_count, parse_scan_opts,
    point_read, random_below, scan_reply, scan_step, store_set, Loaded, Point,
};
use super::events::{GENERIC, SET};
use super::{eq_ic, glob_match, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::ReplyBuf;
use crate::storage::collection::{SetEncoding, SetValue};
use crate::storage::ValueKind;

fn reply_members<'m>(r: &mut ReplyBuf, members: impl ExactSizeIterator<Item = &'m [u8]>) {
    r.set(members.len());
    for m in members {
        r.bulk(m);
    }
}

pub fn sadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let hint = a.len() - 2;
    let mut s = match load_set_for(ctx, a[1], &a[2..])? {
        Some(mut s) => {
            s.value.prepare_add(hint);
            s
        }
        None => Loaded {
            value: SetValue::create(a[2], hint),
            expire_at_ms: None,
        },
    };
    let added = a[2..].iter().filter(|m| s.value.add(m)).count();
    if added > 0 {
        store_set(ctx, a[1], &s.value, s.expire_at_ms)?;
        ctx.notify(SET, "sadd", a[1]);
    }
    r.int(added as i64);
    Ok(())
}

pub fn srem(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let Some(mut s) = load_set_for(ctx, a[1], &a[2..])? else {
        r.int(0);
        return Ok(());
    };
    let removed = a[2..].iter().filter(|m| s.value.remove(m)).count();
    if removed > 0 {
        store_set(ctx, a[1], &s.value, s.expire_at_ms)?;
        ctx.notify(SET, "srem", a[1]);
        if s.value.is_empty() {
            ctx.notify(GENERIC, "del", a[1]);
        }
    }
    r.int(removed as i64);
    Ok(())
}

pub fn scard(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = point_read(ctx, a[1], ValueKind::Set, &Point::Count)?.map_or(0, |(n, _)| n);
    r.int(n as i64);
    Ok(())
}

pub fn sismember(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let q = Point::Lookup(vec![a[2].to_vec()]);
    let found = point_read(ctx, a[1], ValueKind::Set, &q)?;
    r.int(found.is_some_and(|(_, f)| f[0].is_some()) as i64);
    Ok(())
}

pub fn smismember(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let q = Point::Lookup(a[2..].iter().map(|m| m.to_vec()).collect());
    let found = point_read(ctx, a[1], ValueKind::Set, &q)?;
    r.array(a.len() - 2);
    for i in 0..a.len() - 2 {
        r.int(found.as_ref().is_some_and(|(_, f)| f[i].is_some()) as i64);
    }
    Ok(())
}

pub fn smembers(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let s = load_set(ctx, a[1])?;
    let members = s.as_ref().map_or(&[][..], |s| s.value.members());
    reply_members(r, members.iter().map(|m| m.as_slice()));
    Ok(())
}

/// SRANDMEMBER key [count].
pub fn srandmember(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len() > 3 {
        return Err(ERR_SYNTAX.into());
    }
    if a.len() == 2 {
        let s = load_set(ctx, a[1])?;
        match s.as_ref().filter(|s| !s.value.is_empty()) {
            Some(s) => r.bulk(&s.value.members()[random_below(s.value.len())]),
            None => r.null(),
        }
        return Ok(());
    }
    let count = parse_rand_count(a[2])?;
    let Some(s) = load_set(ctx, a[1])? else {
        r.array(0);
        return Ok(());
    };
    let members = s.value.members();
    let picks: Vec<usize> = if count < 0 {
        (0..count.unsigned_abs())
            .map(|_| random_below(members.len()))
            .collect()
    } else if count as usize >= members.len() {
        (0..members.len()).collect()
    } else {
        distinct_indexes(members.len(), count as usize)
    };
    r.array(picks.len());
    for i in picks {
        r.bulk(&members[i]);
    }
    Ok(())
}

/// SPOP key [count].
pub fn spop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len() > 3 {
        return Err(ERR_SYNTAX.into());
    }
    let count = match a.get(2) {
        Some(c) => Some(
            crate::resp::parse::parse_i64(c)
                .filter(|&n| n >= 0)
                .ok_or("ERR value is out of range, must be positive")? as usize,
        ),
        None => None,
    };
    let Some(mut s) = load_set(ctx, a[1])? else {
        match count {
            Some(_) => r.set(0),
            None => r.null(),
        }
        return Ok(());
    };
    let Some(count) = count else {
        let m = s.value.remove_at(random_below(s.value.len()));
        store_set(ctx, a[1], &s.value, s.expire_at_ms)?;
        notify_popped(ctx, a[1], s.value.is_empty());
        r.bulk(&m);
        return Ok(());
    };
    if count == 0 {
        r.set(0);
        return Ok(());
    }
    if count >= s.value.len() {
        // The whole set, as SUNION of it would list it; the key goes.
        let all = union_of(&[Some(&s.value)]);
        store_set(ctx, a[1], &SetValue::new(), None)?;
        notify_popped(ctx, a[1], true);
        reply_members(r, all.members().iter().map(|m| m.as_slice()));
        return Ok(());
    }
    let mut picks = distinct_indexes(s.value.len(), count);
    let popped: Vec<Vec<u8>> = picks
        .iter()
        .map(|&i| s.value.members()[i].clone())
        .collect();
    // Remove from the highest index down so the others stay valid.
    picks.sort_unstable_by(|x, y| y.cmp(x));
    for i in picks {
        s.value.remove_at(i);
    }
    store_set(ctx, a[1], &s.value, s.expire_at_ms)?;
    notify_popped(ctx, a[1], s.value.is_empty());
    reply_members(r, popped.iter().map(|m| m.as_slice()));
    Ok(())
}

/// SMOVE source destination member.
pub fn smove(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (src_key, dst_key, member) = (a[1], a[2], a[3]);
    // Redis looks both up, answers 0 for a missing source, then checks both types.
    let src = load_set_for(ctx, src_key, &a[3..4]);
    let dst = load_set_for(ctx, dst_key, &a[3..4]);
    let Some(mut src) = src? else {
        dst.map(|_| ()).or_else(|e| {
            if e.starts_with("WRONGTYPE") {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        r.int(0);
        return Ok(());
    };
    let dst = dst?;
    if src_key == dst_key {
        r.int(src.value.contains(member) as i64);
        return Ok(());
    }
    if !src.value.remove(member) {
        r.int(0);
        return Ok(());
    }
    let mut dst = dst.unwrap_or(Loaded {
        value: SetValue::create(member, 1),
        expire_at_ms: None,
    });
    let added = dst.value.add(member);
    store_set(ctx, src_key, &src.value, src.expire_at_ms)?;
    store_set(ctx, dst_key, &dst.value, dst.expire_at_ms)?;
    ctx.notify(SET, "srem", src_key);
    if src.value.is_empty() {
        ctx.notify(GENERIC, "del", src_key);
    }
    if added {
        ctx.notify(SET, "sadd", dst_key);
    }
    r.int(1);
    Ok(())
}

/// Loads every key as a set (`None` for a missing one); the first WRONGTYPE aborts.
fn load_all(ctx: &mut Ctx, keys: &[&[u8]]) -> Result<Vec<Option<SetValue>>, String> {
    keys.iter()
        .map(|k| Ok(load_set(ctx, k)?.map(|s| s.value)))
        .collect()
}

/// The members common to every set, in the order of the smallest (the first of the
/// smallest on a tie), stopping after `limit` (0 = no limit). Any missing set → empty.
fn intersection<'s>(sets: &[&'s SetValue], limit: usize) -> Vec<&'s [u8]> {
    let mut order: Vec<&SetValue> = sets.to_vec();
    order.sort_by_key(|s| s.len());
    let mut out = Vec::new();
    let Some((first, rest)) = order.split_first() else {
        return out;
    };
    for m in first.members() {
        if rest.iter().all(|s| s.contains(m)) {
            out.push(m.as_slice());
            if limit != 0 && out.len() >= limit {
                break;
            }
        }
    }
    out
}

/// SUNION's result: an empty intset filled with every set's members in turn.
fn union_of(sets: &[Option<&SetValue>]) -> SetValue {
    let mut out = SetValue::new();
    for s in sets.iter().flatten() {
        for m in s.members() {
            out.add(m);
        }
    }
    out
}

/// SDIFF's result, by the algorithm Redis 7.2 would choose (it decides the encoding a big
/// result ends with): members of the first set in none of the others.
fn difference_of(sets: &[Option<&SetValue>]) -> SetValue {
    let mut out = SetValue::new();
    let Some(Some(first)) = sets.first() else {
        return out;
    };
    let rest: Vec<&SetValue> = sets[1..].iter().flatten().copied().collect();
    let algo_one_work = first.len() * sets.len() / 2;
    let algo_two_work: usize = sets.iter().flatten().map(|s| s.len()).sum();
    if algo_one_work <= algo_two_work {
        for m in first.members() {
            if !rest.iter().any(|s| s.contains(m)) {
                out.add(m);
            }
        }
    } else {
        for m in first.members() {
            out.add(m);
        }
        for s in &rest {
            for m in s.members() {
                out.remove(m);
            }
        }
    }
    out
}

pub fn sinter(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let sets = load_all(ctx, &a[1..])?;
    let present: Option<Vec<&SetValue>> = sets.iter().map(|s| s.as_ref()).collect();
    let common = present.map_or(Vec::new(), |p| intersection(&p, 0));
    reply_members(r, common.into_iter());
    Ok(())
}

pub fn sinterstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let sets = load_all(ctx, &a[2..])?;
    let present: Option<Vec<&SetValue>> = sets.iter().map(|s| s.as_ref()).collect();
    let mut out = SetValue::new();
    if let Some(p) = present {
        for m in intersection(&p, 0) {
            out.add(m);
        }
    }
    store_result(ctx, a[1], &out, "sinterstore")?;
    r.int(out.len() as i64);
    Ok(())
}

/// Writes a *STORE result; fires its event, or `del` when an empty result removed the key.
fn store_result(ctx: &mut Ctx, dst: &[u8], out: &SetValue, event: &str) -> CmdResult {
    let existed = out.is_empty() && {
        let (db, now) = (ctx.db, ctx.now_ms);
        ctx.shards
            .for_key(dst)
            .exists(db, dst, now)
            .map_err(super::storage_error)?
    };
    store_set(ctx, dst, out, None)?;
    if !out.is_empty() {
        ctx.notify(SET, event, dst);
    } else if existed {
        ctx.notify(GENERIC, "del", dst);
    }
    Ok(())
}

/// SPOP's events: `spop`, then `del` when the set is gone.
fn notify_popped(ctx: &Ctx, key: &[u8], emptied: bool) {
    ctx.notify(SET, "spop", key);
    if emptied {
        ctx.notify(GENERIC, "del", key);
    }
}

/// SINTERCARD numkeys key [key ...] [LIMIT limit].
pub fn sintercard(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let numkeys = crate::resp::parse::parse_i64(a[1])
        .filter(|&n| n >= 1)
        .ok_or("ERR numkeys should be greater than 0")? as usize;
    if numkeys > a.len() - 2 {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    let mut limit = 0usize;
    let mut i = 2 + numkeys;
    while i < a.len() {
        if eq_ic(a[i], "limit") && i + 1 < a.len() {
            limit = crate::resp::parse::parse_i64(a[i + 1])
                .filter(|&n| n >= 0)
                .ok_or("ERR LIMIT can't be negative")? as usize;
            i += 2;
        } else {
            return Err(ERR_SYNTAX.into());
        }
    }
    let sets = load_all(ctx, &a[2..2 + numkeys])?;
    let present: Option<Vec<&SetValue>> = sets.iter().map(|s| s.as_ref()).collect();
    let n = present.map_or(0, |p| intersection(&p, limit).len());
    r.int(n as i64);
    Ok(())
}

fn union_or_diff(ctx: &mut Ctx, keys: &[&[u8]], diff: bool) -> Result<SetValue, String> {
    let sets = load_all(ctx, keys)?;
    let refs: Vec<Option<&SetValue>> = sets.iter().map(|s| s.as_ref()).collect();
    Ok(if diff {
        difference_of(&refs)
    } else {
        union_of(&refs)
    })
}

pub fn sunion(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let out = union_or_diff(ctx, &a[1..], false)?;
    reply_members(r, out.members().iter().map(|m| m.as_slice()));
    Ok(())
}

pub fn sdiff(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let out = union_or_diff(ctx, &a[1..], true)?;
    reply_members(r, out.members().iter().map(|m| m.as_slice()));
    Ok(())
}

pub fn sunionstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let out = union_or_diff(ctx, &a[2..], false)?;
    store_result(ctx, a[1], &out, "sunionstore")?;
    r.int(out.len() as i64);
    Ok(())
}

pub fn sdiffstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let out = union_or_diff(ctx, &a[2..], true)?;
    store_result(ctx, a[1], &out, "sdiffstore")?;
    r.int(out.len() as i64);
    Ok(())
}

/// SSCAN key cursor [MATCH pattern] [COUNT count].
pub fn sscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let cursor = parse_cursor(a[2])?;
    let Some(s) = load_set(ctx, a[1])? else {
        scan_reply(r, 0, &[]);
        return Ok(());
    };
    let opts = parse_scan_opts(a)?;
    let members = s.value.members();
    let (picked, next): (Vec<usize>, u64) = match s.value.encoding() {
        SetEncoding::Intset | SetEncoding::Listpack => ((0..members.len()).collect(), 0),
        SetEncoding::Hashtable => {
            scan_step(members.iter().map(|m| m.as_slice()), cursor, opts.count)
        }
    };
    let items: Vec<&[u8]> = picked
        .into_iter()
        .map(|i| members[i].as_slice())
        .filter(|m| opts.pattern.is_none_or(|p| glob_match(p, m)))
        .collect();
    scan_reply(r, next, &items);
    Ok(())
}
