//! Set commands (Redis 7.2 semantics, replies and error texts): SADD SREM SCARD SISMEMBER
//! SMISMEMBER SMEMBERS SRANDMEMBER SPOP SMOVE SINTER SINTERCARD SINTERSTORE SUNION
//! SUNIONSTORE SDIFF SDIFFSTORE SSCAN.
//!
//! Multi-key commands read every source before writing the destination; the router holds
//! all their shards on one thread for the call, so they are atomic across workers.
//! Results are built the way Redis 7.2 builds them (an empty intset filled member by
//! member), so their encoding and order match Redis's for the small encodings.

use super::collection::{
    distinct_indexes, load_set, load_set_for, open_set, parse_cursor, parse_rand_count,
    parse_scan_opts, point_read, point_write, random_below, random_ranks, scan_reply, scan_step,
    store_set, Loaded, Opened, Point, Preloaded,
};
use super::events::{GENERIC, SET};
use super::{eq_ic, glob_match, storage_error, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::ReplyBuf;
use crate::storage::collection::{SetEncoding, SetValue};
use crate::storage::paged::PointOp;
use crate::storage::{paged, ValueKind};

fn reply_members<'m>(r: &mut ReplyBuf, members: impl ExactSizeIterator<Item = &'m [u8]>) {
    r.set(members.len());
    for m in members {
        r.bulk(m);
    }
}

pub fn sadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let mut pre = Preloaded::default();
    if let [_, key, member] = a {
        let add = |old: Option<&[u8]>| old.is_none().then_some(PointOp::Upsert(None));
        match point_write(ctx, key, ValueKind::Set, member, add)? {
            Ok(existed) => {
                if !existed {
                    ctx.notify(SET, "sadd", key);
                }
                r.int(i64::from(!existed));
                return Ok(());
            }
            Err(loaded) => pre = loaded,
        }
    }
    let hint = a.len() - 2;
    let mut s = match load_set_for(ctx, a[1], &a[2..], pre)? {
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
    let mut pre = Preloaded::default();
    if let [_, key, member] = a {
        let remove = |old: Option<&[u8]>| old.map(|_| PointOp::Remove);
        match point_write(ctx, key, ValueKind::Set, member, remove)? {
            Ok(existed) => {
                if existed {
                    ctx.notify(SET, "srem", key);
                }
                r.int(i64::from(existed));
                return Ok(());
            }
            Err(loaded) => pre = loaded,
        }
    }
    let Some(mut s) = load_set_for(ctx, a[1], &a[2..], pre)? else {
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

/// SRANDMEMBER key [count]. On a paged set only the leaves holding the picked members are
/// read; a count covering the whole set reads it whole.
pub fn srandmember(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len() > 3 {
        return Err(ERR_SYNTAX.into());
    }
    let count = match a.get(2) {
        Some(c) => Some(parse_rand_count(c)?),
        None => None,
    };
    let Some(s) = open_set(ctx, a[1])?.filter(|s| size_of(s) > 0) else {
        match count {
            None => r.null(),
            Some(_) => r.array(0),
        }
        return Ok(());
    };
    let n = size_of(&s);
    let whole = count.is_some_and(|c| c >= 0 && c as usize >= n);
    let picks: Vec<usize> = match count {
        None => vec![random_below(n)],
        Some(_) if whole => (0..n).collect(),
        Some(c) => random_ranks(n, c),
    };
    let members = picked_members(ctx, a[1], s, &picks, whole)?;
    match count {
        None => r.bulk(&members[0]),
        Some(_) => {
            r.array(members.len());
            for m in &members {
                r.bulk(m);
            }
        }
    }
    Ok(())
}

/// Members of a set by rank (the set's member order), for the random commands: a paged set
/// reads only the leaves holding them, unless `whole` (every rank asked).
fn picked_members(
    ctx: &mut Ctx,
    key: &[u8],
    s: Opened<SetValue>,
    picks: &[usize],
    whole: bool,
) -> Result<Vec<Vec<u8>>, String> {
    Ok(match s {
        Opened::Whole(v) => picks.iter().map(|&i| v.members()[i].clone()).collect(),
        Opened::Paged(_) if whole => match load_set(ctx, key)? {
            Some(v) => picks
                .iter()
                .map(|&i| v.value.members()[i].clone())
                .collect(),
            None => Vec::new(),
        },
        Opened::Paged(root) => {
            let (db, shard) = (ctx.db, ctx.shards.for_key(key));
            let ranks: Vec<u64> = picks.iter().map(|&i| i as u64).collect();
            paged::pick(shard, db, key, &root, &ranks, false).map_err(storage_error)?
        }
    })
}

fn size_of(s: &Opened<SetValue>) -> usize {
    match s {
        Opened::Whole(v) => v.len(),
        Opened::Paged(root) => root.count as usize,
    }
}

/// SPOP key [count]. On a paged set popping fewer members than it holds reads the leaves
/// holding the picked members (and their neighbours, for merges) and rewrites only those.
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
    if let Some(Opened::Paged(root)) = open_set(ctx, a[1])? {
        let n = root.count as usize;
        if count == Some(0) {
            r.set(0);
            return Ok(());
        }
        if count.is_none_or(|c| c > 0 && c < n) {
            let picks = distinct_indexes(n, count.unwrap_or(1));
            let popped = picked_members(ctx, a[1], Opened::Paged(root), &picks, false)?;
            let names: Vec<&[u8]> = popped.iter().map(|m| m.as_slice()).collect();
            let Some(mut s) = load_set_for(ctx, a[1], &names, Preloaded::default())? else {
                return Err(storage_error(crate::storage::StorageError::Corrupt(
                    "paged set vanished between two reads".into(),
                )));
            };
            for m in &names {
                s.value.remove(m);
            }
            store_set(ctx, a[1], &s.value, s.expire_at_ms)?;
            notify_popped(ctx, a[1], s.value.is_empty());
            match count {
                None => r.bulk(&popped[0]),
                Some(_) => reply_members(r, names.into_iter()),
            }
            return Ok(());
        }
    }
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
    let src = load_set_for(ctx, src_key, &a[3..4], Preloaded::default());
    let dst = load_set_for(ctx, dst_key, &a[3..4], Preloaded::default());
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

/// Loads every key as a set (`None` for a missing one); the first WRONGTYPE aborts. A key
/// whose pages missed (a restartable run, `prefetch::run_missed`) does not stop the others
/// from being loaded: their pages are asked for in the same round (read-ahead), and the
/// run fails after the last key.
fn load_all(ctx: &mut Ctx, keys: &[&[u8]]) -> Result<Vec<Option<SetValue>>, String> {
    let mut out = Vec::with_capacity(keys.len());
    let mut missed = None;
    for k in keys {
        match load_set(ctx, k) {
            Ok(s) => out.push(s.map(|s| s.value)),
            Err(e) if crate::storage::prefetch::run_missed() => {
                missed.get_or_insert(e);
                out.push(None);
            }
            Err(e) => return Err(e),
        }
    }
    match missed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Opens every key as a set (`None` for a missing one; no page of a paged set read); the
/// first WRONGTYPE aborts.
fn open_all(ctx: &mut Ctx, keys: &[&[u8]]) -> Result<Vec<Option<Opened<SetValue>>>, String> {
    keys.iter().map(|k| open_set(ctx, k)).collect()
}

/// Directory pages of a paged source read so far by one command (by root entry index).
type DirCache = std::collections::HashMap<usize, Vec<paged::Entry>>;

/// Members per batch when a one-record source is iterated (a paged one goes leaf by leaf).
const BATCH: usize = 256;

/// Iterates the members of source `s` (of `key`) in its member order, a batch at a time
/// (a paged set one leaf at a time), until `f` returns false. `to_end`: `f` never does, so
/// a missed leaf asks for the rest of the walk's pages with it (`paged::LeafWalk::to_end`).
fn for_each_batch(
    ctx: &mut Ctx,
    key: &[u8],
    s: &Opened<SetValue>,
    to_end: bool,
    mut f: impl FnMut(&mut Ctx, Vec<Vec<u8>>) -> Result<bool, String>,
) -> Result<(), String> {
    match s {
        Opened::Whole(v) => {
            for chunk in v.members().chunks(BATCH) {
                if !f(ctx, chunk.to_vec())? {
                    break;
                }
            }
        }
        Opened::Paged(root) => {
            let mut walk = if to_end {
                paged::LeafWalk::to_end()
            } else {
                paged::LeafWalk::default()
            };
            loop {
                let (db, shard) = (ctx.db, ctx.shards.for_key(key));
                let Some(leaf) = walk
                    .next::<Vec<u8>>(shard, db, key, root, false)
                    .map_err(storage_error)?
                else {
                    break;
                };
                if !f(ctx, leaf)? {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Keeps the members of `batch` that source `s` (of `key`) holds: a one-record set by its
/// lookup, a paged one through `paged::contains_many` (each leaf a probe needs read once
/// per batch; `dirs` caches its directory pages for the command).
fn keep_held(
    ctx: &mut Ctx,
    key: &[u8],
    s: &Opened<SetValue>,
    batch: &mut Vec<Vec<u8>>,
    dirs: &mut DirCache,
    want: bool,
) -> Result<(), String> {
    match s {
        Opened::Whole(v) => batch.retain(|m| v.contains(m) == want),
        Opened::Paged(root) => {
            let names: Vec<&[u8]> = batch.iter().map(|m| m.as_slice()).collect();
            let (db, shard) = (ctx.db, ctx.shards.for_key(key));
            let held = paged::contains_many(shard, db, key, root, &names, false, dirs)
                .map_err(storage_error)?;
            let mut i = 0;
            batch.retain(|_| {
                i += 1;
                held[i - 1] == want
            });
        }
    }
    Ok(())
}

/// The members common to the sets at `keys`, in the member order of the smallest (the
/// first of the smallest on a tie), stopping after `limit` (0 = no limit). Any missing set
/// → empty. The smallest is read a batch (a leaf) at a time and every member of a batch is
/// probed in the others, a paged one reading only the leaves that can hold them.
fn intersection(ctx: &mut Ctx, keys: &[&[u8]], limit: usize) -> Result<Vec<Vec<u8>>, String> {
    let sets = open_all(ctx, keys)?;
    let mut out = Vec::new();
    let Some(present) = sets.iter().map(|s| s.as_ref()).collect::<Option<Vec<_>>>() else {
        return Ok(out);
    };
    let mut order: Vec<usize> = (0..present.len()).collect();
    order.sort_by_key(|&i| size_of(present[i]));
    let Some((&first, rest)) = order.split_first() else {
        return Ok(out);
    };
    let mut dirs: Vec<DirCache> = vec![DirCache::new(); present.len()];
    let mut missed = None;
    for_each_batch(
        ctx,
        keys[first],
        present[first],
        limit == 0,
        |ctx, mut batch| {
            for &j in rest {
                if batch.is_empty() {
                    break;
                }
                let probe = keep_held(ctx, keys[j], present[j], &mut batch, &mut dirs[j], true);
                if let Some(go_on) = probe_missed(probe, limit == 0, &mut missed)? {
                    return Ok(go_on);
                }
            }
            if missed.is_some() {
                return Ok(crate::storage::prefetch::readahead_room());
            }
            for m in batch {
                out.push(m);
                if limit != 0 && out.len() >= limit {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )?;
    match missed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Read-ahead for the probes of a walk that goes to its end (`to_end`): a probe that missed
/// pages ends its batch (`Some`: go on with the next batch while the round has budget), not
/// the walk, so the next batches' probes ask for their pages in the same round; only the
/// sources a batch is sure to be probed in are probed (those before the miss filtered it).
/// `None`: the probe succeeded. Any other error, or a miss without `to_end`, is returned.
fn probe_missed(
    probe: Result<(), String>,
    to_end: bool,
    missed: &mut Option<String>,
) -> Result<Option<bool>, String> {
    match probe {
        Ok(()) => Ok(None),
        Err(e) if to_end && crate::storage::prefetch::run_missed() => {
            missed.get_or_insert(e);
            Ok(Some(crate::storage::prefetch::readahead_room()))
        }
        Err(e) => Err(e),
    }
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
/// result ends with): members of the first set in none of the others. The first set is
/// read a batch (a leaf) at a time; the others are probed per batch (algorithm 1) or read
/// a batch at a time and removed from the result (algorithm 2).
fn difference(ctx: &mut Ctx, keys: &[&[u8]]) -> Result<SetValue, String> {
    let sets = open_all(ctx, keys)?;
    let mut out = SetValue::new();
    let Some(Some(first)) = sets.first() else {
        return Ok(out);
    };
    let rest: Vec<usize> = (1..sets.len()).filter(|&j| sets[j].is_some()).collect();
    let size = |j: usize| sets[j].as_ref().map_or(0, size_of);
    let algo_one_work = size_of(first) * sets.len() / 2;
    let algo_two_work: usize = (0..sets.len()).map(size).sum();
    if algo_one_work <= algo_two_work {
        let mut dirs: Vec<DirCache> = vec![DirCache::new(); sets.len()];
        let mut missed = None;
        for_each_batch(ctx, keys[0], first, true, |ctx, mut batch| {
            for &j in &rest {
                if batch.is_empty() {
                    break;
                }
                let s = sets[j].as_ref().expect("present");
                let probe = keep_held(ctx, keys[j], s, &mut batch, &mut dirs[j], false);
                if let Some(go_on) = probe_missed(probe, true, &mut missed)? {
                    return Ok(go_on);
                }
            }
            if missed.is_some() {
                return Ok(crate::storage::prefetch::readahead_room());
            }
            for m in &batch {
                out.add(m);
            }
            Ok(true)
        })?;
        if let Some(e) = missed {
            return Err(e);
        }
    } else {
        for_each_batch(ctx, keys[0], first, true, |_, batch| {
            for m in &batch {
                out.add(m);
            }
            Ok(true)
        })?;
        for &j in &rest {
            let s = sets[j].as_ref().expect("present");
            for_each_batch(ctx, keys[j], s, false, |_, batch| {
                for m in &batch {
                    out.remove(m);
                }
                Ok(!out.is_empty())
            })?;
        }
    }
    Ok(out)
}

pub fn sinter(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let common = intersection(ctx, &a[1..], 0)?;
    reply_members(r, common.iter().map(|m| m.as_slice()));
    Ok(())
}

pub fn sinterstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let mut out = SetValue::new();
    for m in intersection(ctx, &a[2..], 0)? {
        out.add(&m);
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
    let n = intersection(ctx, &a[2..2 + numkeys], limit)?.len();
    r.int(n as i64);
    Ok(())
}

fn union_or_diff(ctx: &mut Ctx, keys: &[&[u8]], diff: bool) -> Result<SetValue, String> {
    if diff {
        return difference(ctx, keys);
    }
    let sets = load_all(ctx, keys)?;
    let refs: Vec<Option<&SetValue>> = sets.iter().map(|s| s.as_ref()).collect();
    Ok(union_of(&refs))
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

/// SSCAN key cursor [MATCH pattern] [COUNT count]. On a paged set a step reads one
/// directory page and the leaves it returns members from (`paged::scan`).
pub fn sscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let cursor = parse_cursor(a[2])?;
    let Some(s) = open_set(ctx, a[1])? else {
        scan_reply(r, 0, &[]);
        return Ok(());
    };
    let opts = parse_scan_opts(a)?;
    let (members, next): (Vec<Vec<u8>>, u64) = match s {
        Opened::Whole(v) => match v.encoding() {
            SetEncoding::Intset | SetEncoding::Listpack => (v.members().to_vec(), 0),
            SetEncoding::Hashtable => {
                let m = v.members();
                let (picked, next) = scan_step(m.iter().map(|x| x.as_slice()), cursor, opts.count);
                (picked.into_iter().map(|i| m[i].clone()).collect(), next)
            }
        },
        Opened::Paged(root) => {
            let (db, shard) = (ctx.db, ctx.shards.for_key(a[1]));
            paged::scan(shard, db, a[1], &root, cursor, opts.count, false).map_err(storage_error)?
        }
    };
    let items: Vec<&[u8]> = members
        .iter()
        .map(|m| m.as_slice())
        .filter(|m| opts.pattern.is_none_or(|p| glob_match(p, m)))
        .collect();
    scan_reply(r, next, &items);
    Ok(())
}
