//! List commands (Redis 7.2 semantics, replies and error texts): LPUSH RPUSH LPUSHX RPUSHX
//! LPOP RPOP LLEN LINDEX LSET LRANGE LINSERT LREM LTRIM LPOS LMOVE RPOPLPUSH LMPOP.
//!
//! The seam for a blocking layer (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP). Two functions do
//! the data work and know nothing of replies or blocking:
//! - [`pop_from`]`(ctx, key, end, count)` pops up to `count` elements from one end of the
//!   list at `key`: `Ok(None)` when there is no list (missing, expired, or empty — an empty
//!   list never exists), `Err(WRONGTYPE)` for another kind, else the popped elements in pop
//!   order; the list is stored (or deleted when emptied) before it returns.
//! - [`push_to`]`(ctx, key, end, elements, create)` pushes at one end and returns the new
//!   length (`Ok(0)` without writing when the key is missing and `create` is false);
//!   `Err(WRONGTYPE)` for another kind.
//!   A blocking command tries `pop_from` on each of its keys in order; when every one gives
//!   `None` it parks the client on them, and a push (which goes through `push_to`) is the
//!   event that makes a parked client retry. LMOVE's two halves are [`move_element`].
//!   Callers must check WRONGTYPE of a destination before popping (as `move_element`
//!   does), so nothing is half-applied.
//!
//! All reads come before the first write; a command that fails writes nothing. A small
//! list is one record (`storage::list_codec`) rewritten whole; a big one is paged
//! (`storage::paged_list`, `docs/collections.md` section 4a): pushes, pops, LMOVE, LLEN,
//! LINDEX, LSET, LRANGE, LTRIM, LINSERT, LREM and LPOS work on a `ListHandle` and touch
//! only the directory pages and leaves they need (LINSERT, LREM and LPOS read leaves in
//! scanning order until their answer, as Redis walks its quicklist).

use super::collection::{
    list_len, load_list_handle, parse_rand_count, settle_list, store_list, store_list_handle,
    write_list, Loaded,
};
use super::{eq_ic, parse_int, storage_error, wrong_args, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::ReplyBuf;
use crate::runtime::events::{GENERIC, LIST};
use crate::storage::list_codec::{End, ListValue};
use crate::storage::paged_list::ListHandle;

const ERR_POSITIVE: &str = "ERR value is out of range, must be positive";

fn loaded_new() -> Loaded<ListHandle> {
    Loaded {
        value: ListHandle::Whole(ListValue::new()),
        expire_at_ms: None,
    }
}

/// Pops up to `count` (>= 1) elements from `end` of the list at `key` (see the module
/// comment): `None` when there is no list. Fires `lpop`/`rpop` (and `del` when emptied).
pub fn pop_from(
    ctx: &mut Ctx,
    key: &[u8],
    end: End,
    count: usize,
) -> Result<Option<Vec<Vec<u8>>>, String> {
    debug_assert!(count >= 1);
    let Some(mut l) = load_list_handle(ctx, key)? else {
        return Ok(None);
    };
    let n = count.min(l.value.len());
    let shard = ctx.shards.for_key(key);
    let mut popped = Vec::with_capacity(n);
    for _ in 0..n {
        popped.extend(l.value.pop(shard, end).map_err(storage_error)?);
    }
    let emptied = l.value.is_empty();
    store_list_handle(ctx, key, l.value, l.expire_at_ms, true)?;
    // Redis's listElementsRemoved: one pop event per command, `del` once emptied.
    ctx.notify(LIST, end_event(end, "lpop", "rpop"), key);
    if emptied {
        ctx.notify(GENERIC, "del", key);
    }
    Ok(Some(popped))
}

/// The event name for `end`: `head` at the head, `tail` at the tail.
fn end_event(end: End, head: &'static str, tail: &'static str) -> &'static str {
    match end {
        End::Head => head,
        End::Tail => tail,
    }
}

/// Pushes `elements` one by one at `end` of the list at `key` (creating it when `create`);
/// returns the new length, 0 when the key is missing and not created. Fires `lpush`/`rpush`
/// when it pushed.
pub fn push_to(
    ctx: &mut Ctx,
    key: &[u8],
    end: End,
    elements: &[&[u8]],
    create: bool,
) -> Result<usize, String> {
    let mut l = match load_list_handle(ctx, key)? {
        Some(l) => l,
        None if create => loaded_new(),
        None => return Ok(0),
    };
    l.value
        .push_all(ctx.shards.for_key(key), end, elements)
        .map_err(storage_error)?;
    let len = l.value.len();
    store_list_handle(ctx, key, l.value, l.expire_at_ms, false)?;
    ctx.notify(LIST, end_event(end, "lpush", "rpush"), key);
    Ok(len)
}

/// LMOVE's work: pops one element from `from` of `src` and pushes it at `to` of `dst`
/// (the same list when the keys are equal). `None` when `src` has no list; WRONGTYPE of
/// either key before anything is written.
pub fn move_element(
    ctx: &mut Ctx,
    src: &[u8],
    dst: &[u8],
    from: End,
    to: End,
) -> Result<Option<Vec<u8>>, String> {
    let Some(mut s) = load_list_handle(ctx, src)? else {
        return Ok(None);
    };
    let popped = |ctx: &mut Ctx, s: &mut ListHandle| -> Result<Vec<u8>, String> {
        s.pop(ctx.shards.for_key(src), from)
            .map_err(storage_error)?
            .ok_or_else(|| {
                storage_error(crate::storage::StorageError::Corrupt("empty list".into()))
            })
    };
    if src == dst {
        let e = popped(ctx, &mut s.value)?;
        s.value
            .push_all(ctx.shards.for_key(src), to, &[&e])
            .map_err(storage_error)?;
        // Redis runs the source's shrinking check after the push, on the same list.
        store_list_handle(ctx, src, s.value, s.expire_at_ms, true)?;
        notify_moved(ctx, src, dst, from, to, false);
        return Ok(Some(e));
    }
    let mut d = load_list_handle(ctx, dst)?.unwrap_or_else(loaded_new);
    let e = popped(ctx, &mut s.value)?;
    d.value
        .push_all(ctx.shards.for_key(dst), to, &[&e])
        .map_err(storage_error)?;
    // Every read (a demotion reads the leaves) before the first write.
    settle_list(ctx, src, &mut s.value, true)?;
    settle_list(ctx, dst, &mut d.value, false)?;
    let emptied = s.value.is_empty();
    write_list(ctx, dst, d.value, d.expire_at_ms)?;
    write_list(ctx, src, s.value, s.expire_at_ms)?;
    notify_moved(ctx, src, dst, from, to, emptied);
    Ok(Some(e))
}

/// LMOVE's events in Redis's order: the push on `dst`, the pop on `src`, `del` of an
/// emptied `src` (Redis 7 pushes before it pops, though its docs promise the reverse).
fn notify_moved(ctx: &Ctx, src: &[u8], dst: &[u8], from: End, to: End, emptied: bool) {
    ctx.notify(LIST, end_event(to, "lpush", "rpush"), dst);
    ctx.notify(LIST, end_event(from, "lpop", "rpop"), src);
    if emptied {
        ctx.notify(GENERIC, "del", src);
    }
}

fn reply_elements(r: &mut ReplyBuf, items: &[Vec<u8>]) {
    r.array(items.len());
    for e in items {
        r.bulk(e);
    }
}

fn push_command(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, end: End, create: bool) -> CmdResult {
    let n = push_to(ctx, a[1], end, &a[2..], create)?;
    r.int(n as i64);
    Ok(())
}

pub fn lpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    push_command(ctx, a, r, End::Head, true)
}

pub fn rpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    push_command(ctx, a, r, End::Tail, true)
}

pub fn lpushx(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    push_command(ctx, a, r, End::Head, false)
}

pub fn rpushx(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    push_command(ctx, a, r, End::Tail, false)
}

/// LPOP/RPOP key [count]: without a count one bulk (null when missing); with a count an
/// array (a null array when missing, an empty array for count 0).
fn pop_command(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, end: End) -> CmdResult {
    if a.len() > 3 {
        return Err(wrong_args(if end == End::Head { "lpop" } else { "rpop" }));
    }
    let count = match a.get(2) {
        Some(c) => Some(
            crate::resp::parse::parse_i64(c)
                .filter(|&n| n >= 0)
                .ok_or(ERR_POSITIVE)?,
        ),
        None => None,
    };
    if count == Some(0) {
        // Redis looks the key up (WRONGTYPE, null array) before its count-0 fast exit.
        match load_list_handle(ctx, a[1])? {
            Some(_) => r.array(0),
            None => r.null_array(),
        }
        return Ok(());
    }
    let want = count.map_or(1, |c| usize::try_from(c).unwrap_or(usize::MAX));
    match (pop_from(ctx, a[1], end, want)?, count) {
        (None, Some(_)) => r.null_array(),
        (None, None) => r.null(),
        (Some(items), Some(_)) => reply_elements(r, &items),
        (Some(items), None) => r.bulk(&items[0]),
    }
    Ok(())
}

pub fn lpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    pop_command(ctx, a, r, End::Head)
}

pub fn rpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    pop_command(ctx, a, r, End::Tail)
}

pub fn llen(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = list_len(ctx, a[1])?;
    r.int(n as i64);
    Ok(())
}

/// A LINDEX/LSET index resolved against a list of `len` elements.
fn resolve_index(index: i64, len: usize) -> Option<usize> {
    let len = len as i64;
    let i = if index < 0 { index + len } else { index };
    (0..len).contains(&i).then_some(i as usize)
}

/// LINDEX key index: the key is looked up before the index is parsed, as in Redis.
pub fn lindex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let Some(l) = load_list_handle(ctx, a[1])? else {
        r.null();
        return Ok(());
    };
    let index = parse_int(a[2])?;
    match (resolve_index(index, l.value.len()), l.value) {
        (Some(i), ListHandle::Whole(v)) => r.bulk(v.get(i).expect("in range")),
        (Some(i), ListHandle::Paged(mut p)) => {
            r.bulk(&p.get(ctx.shards.for_key(a[1]), i).map_err(storage_error)?)
        }
        (None, _) => r.null(),
    }
    Ok(())
}

pub fn lset(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let Some(l) = load_list_handle(ctx, a[1])? else {
        return Err("ERR no such key".into());
    };
    let index = parse_int(a[2])?;
    let mut l = match l.value {
        ListHandle::Whole(value) => Loaded {
            value,
            expire_at_ms: l.expire_at_ms,
        },
        ListHandle::Paged(mut p) => {
            // A quicklist has no growing conversion: only the index matters.
            let Some(i) = resolve_index(index, p.len()) else {
                return Err("ERR index out of range".into());
            };
            p.set(ctx.shards.for_key(a[1]), i, a[3])
                .map_err(storage_error)?;
            store_list_handle(ctx, a[1], ListHandle::Paged(p), l.expire_at_ms, true)?;
            ctx.notify(LIST, "lset", a[1]);
            r.ok();
            return Ok(());
        }
    };
    // Redis 7.2 converts for the new element before it looks for the index, so even an
    // out-of-range LSET may leave a quicklist behind: keep that encoding change.
    let before = l.value.encoding();
    l.value.prepare_grow(a[3].len());
    let Some(i) = resolve_index(index, l.value.len()) else {
        if l.value.encoding() != before {
            store_list(ctx, a[1], &l.value, l.expire_at_ms)?;
        }
        return Err("ERR index out of range".into());
    };
    l.value.set(i, a[3]);
    l.value.after_shrink();
    store_list(ctx, a[1], &l.value, l.expire_at_ms)?;
    ctx.notify(LIST, "lset", a[1]);
    r.ok();
    Ok(())
}

/// Redis's range normalisation (LRANGE, LTRIM): the inclusive index range selected by
/// `start..=stop` in a list of `len`, `None` when empty.
fn resolve_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let mut start = if start < 0 { start + len } else { start };
    let mut stop = if stop < 0 { stop + len } else { stop };
    if start < 0 {
        start = 0;
    }
    if start > stop || start >= len {
        return None;
    }
    if stop >= len {
        stop = len - 1;
    }
    Some((start as usize, stop as usize))
}

pub fn lrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (start, stop) = (parse_int(a[2])?, parse_int(a[3])?);
    let Some(l) = load_list_handle(ctx, a[1])? else {
        r.array(0);
        return Ok(());
    };
    match (resolve_range(start, stop, l.value.len()), l.value) {
        (Some((from, to)), ListHandle::Whole(v)) => {
            r.array(to - from + 1);
            for e in v.iter().skip(from).take(to - from + 1) {
                r.bulk(e);
            }
        }
        (Some((from, to)), ListHandle::Paged(mut p)) => {
            let items = p
                .range(ctx.shards.for_key(a[1]), from, to)
                .map_err(storage_error)?;
            reply_elements(r, &items);
        }
        (None, _) => r.array(0),
    }
    Ok(())
}

pub fn ltrim(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (start, stop) = (parse_int(a[2])?, parse_int(a[3])?);
    let Some(l) = load_list_handle(ctx, a[1])? else {
        r.ok();
        return Ok(());
    };
    let mut l = match l.value {
        ListHandle::Whole(value) => Loaded {
            value,
            expire_at_ms: l.expire_at_ms,
        },
        ListHandle::Paged(mut p) => {
            let keep = resolve_range(start, stop, p.len());
            let emptied = keep.is_none();
            match keep {
                None => store_list(ctx, a[1], &ListValue::new(), None)?,
                Some((from, to)) if (from, to) != (0, p.len() - 1) => {
                    p.trim(ctx.shards.for_key(a[1]), from, to)
                        .map_err(storage_error)?;
                    store_list_handle(ctx, a[1], ListHandle::Paged(p), l.expire_at_ms, true)?;
                }
                // Nothing trimmed; a paged list has several nodes, so no conversion either.
                Some(_) => {}
            }
            ctx.notify(LIST, "ltrim", a[1]);
            if emptied {
                ctx.notify(GENERIC, "del", a[1]);
            }
            r.ok();
            return Ok(());
        }
    };
    let keep = resolve_range(start, stop, l.value.len());
    let before = l.value.encoding();
    let changed = keep != Some((0, l.value.len() - 1));
    if changed {
        l.value.trim(keep);
    }
    // Redis checks the shrinking conversion even when nothing was trimmed.
    l.value.after_shrink();
    if changed || l.value.encoding() != before {
        store_list(ctx, a[1], &l.value, l.expire_at_ms)?;
    }
    // Redis fires `ltrim` whenever the list exists, trimmed or not.
    ctx.notify(LIST, "ltrim", a[1]);
    if l.value.is_empty() {
        ctx.notify(GENERIC, "del", a[1]);
    }
    r.ok();
    Ok(())
}

/// LINSERT key BEFORE|AFTER pivot element: the new length, -1 without the pivot, 0 without
/// the key.
pub fn linsert(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let after = if eq_ic(a[2], "after") {
        true
    } else if eq_ic(a[2], "before") {
        false
    } else {
        return Err(ERR_SYNTAX.into());
    };
    let Some(l) = load_list_handle(ctx, a[1])? else {
        r.int(0);
        return Ok(());
    };
    let mut l = match l.value {
        ListHandle::Whole(value) => Loaded {
            value,
            expire_at_ms: l.expire_at_ms,
        },
        ListHandle::Paged(mut p) => {
            // A quicklist has no growing conversion; the leaves are read up to the pivot.
            let inserted = p
                .insert(ctx.shards.for_key(a[1]), a[3], after, a[4])
                .map_err(storage_error)?;
            if !inserted {
                r.int(-1);
                return Ok(());
            }
            let len = p.len();
            store_list_handle(ctx, a[1], ListHandle::Paged(p), l.expire_at_ms, false)?;
            ctx.notify(LIST, "linsert", a[1]);
            r.int(len as i64);
            return Ok(());
        }
    };
    // As LSET: Redis 7.2 converts for the new element before it looks for the pivot.
    let before = l.value.encoding();
    l.value.prepare_grow(a[4].len());
    let Some(at) = l.value.iter().position(|e| e == a[3]) else {
        if l.value.encoding() != before {
            store_list(ctx, a[1], &l.value, l.expire_at_ms)?;
        }
        r.int(-1);
        return Ok(());
    };
    l.value.insert(at, after, a[4]);
    store_list(ctx, a[1], &l.value, l.expire_at_ms)?;
    ctx.notify(LIST, "linsert", a[1]);
    r.int(l.value.len() as i64);
    Ok(())
}

/// LREM key count element: up to |count| matches from the head (count > 0) or the tail
/// (count < 0), every match for 0.
pub fn lrem(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let count = parse_int(a[2])?;
    let Some(l) = load_list_handle(ctx, a[1])? else {
        r.int(0);
        return Ok(());
    };
    let limit = if count == 0 {
        usize::MAX
    } else {
        usize::try_from(count.unsigned_abs()).unwrap_or(usize::MAX)
    };
    let mut l = match l.value {
        ListHandle::Whole(value) => Loaded {
            value,
            expire_at_ms: l.expire_at_ms,
        },
        ListHandle::Paged(mut p) => {
            // Leaves are read in Redis's visiting order until `limit` matches.
            let removed = p
                .remove(ctx.shards.for_key(a[1]), a[3], limit, count < 0)
                .map_err(storage_error)?;
            if removed > 0 {
                let emptied = p.is_empty();
                store_list_handle(ctx, a[1], ListHandle::Paged(p), l.expire_at_ms, true)?;
                ctx.notify(LIST, "lrem", a[1]);
                if emptied {
                    ctx.notify(GENERIC, "del", a[1]);
                }
            }
            r.int(removed as i64);
            return Ok(());
        }
    };
    let len = l.value.len();
    // Mark the matches in the order Redis visits them, then drop the marked ones.
    let mut drop = vec![false; len];
    let mut marked = 0;
    let order: Box<dyn Iterator<Item = (usize, &[u8])>> = if count < 0 {
        Box::new(l.value.iter().enumerate().rev())
    } else {
        Box::new(l.value.iter().enumerate())
    };
    for (i, e) in order {
        if marked == limit {
            break;
        }
        if e == a[3] {
            drop[i] = true;
            marked += 1;
        }
    }
    if marked > 0 {
        l.value.retain_indexed(|i, _| !drop[i]);
        l.value.after_shrink();
        store_list(ctx, a[1], &l.value, l.expire_at_ms)?;
        ctx.notify(LIST, "lrem", a[1]);
        if l.value.is_empty() {
            ctx.notify(GENERIC, "del", a[1]);
        }
    }
    r.int(marked as i64);
    Ok(())
}

struct LposOptions {
    rank: i64,
    /// `None` without COUNT (a single reply); `Some(0)` means every match.
    count: Option<u64>,
    /// 0 means no limit.
    maxlen: u64,
}

fn lpos_options(a: &[&[u8]]) -> Result<LposOptions, String> {
    let mut o = LposOptions {
        rank: 1,
        count: None,
        maxlen: 0,
    };
    let mut j = 3;
    while j < a.len() {
        let more = j + 1 < a.len();
        let positive = |v: &[u8], msg: &str| -> Result<u64, String> {
            crate::resp::parse::parse_i64(v)
                .filter(|&n| n >= 0)
                .map(|n| n as u64)
                .ok_or_else(|| msg.to_string())
        };
        if eq_ic(a[j], "rank") && more {
            j += 1;
            o.rank = parse_rand_count(a[j])?;
            if o.rank == 0 {
                return Err("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list".into());
            }
        } else if eq_ic(a[j], "count") && more {
            j += 1;
            o.count = Some(positive(a[j], "ERR COUNT can't be negative")?);
        } else if eq_ic(a[j], "maxlen") && more {
            j += 1;
            o.maxlen = positive(a[j], "ERR MAXLEN can't be negative")?;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        j += 1;
    }
    Ok(o)
}

/// LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len].
pub fn lpos(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let o = lpos_options(a)?;
    let Some(l) = load_list_handle(ctx, a[1])? else {
        match o.count {
            Some(_) => r.array(0),
            None => r.null(),
        }
        return Ok(());
    };
    let len = l.value.len();
    let from_tail = o.rank < 0;
    let skip = o.rank.unsigned_abs() - 1;
    let scanned = if o.maxlen == 0 {
        len
    } else {
        len.min(usize::try_from(o.maxlen).unwrap_or(usize::MAX))
    };
    let want = match o.count {
        None => 1,
        Some(0) => u64::MAX,
        Some(c) => c,
    };
    let (skip, want) = (
        usize::try_from(skip).unwrap_or(usize::MAX),
        usize::try_from(want).unwrap_or(usize::MAX),
    );
    let found: Vec<usize> = match l.value {
        // Leaves are read in scanning order until the answer is complete.
        ListHandle::Paged(mut p) => p
            .positions(
                ctx.shards.for_key(a[1]),
                a[2],
                from_tail,
                skip,
                want,
                scanned,
            )
            .map_err(storage_error)?,
        ListHandle::Whole(v) => {
            let order: Box<dyn Iterator<Item = (usize, &[u8])>> = if from_tail {
                Box::new(v.iter().enumerate().rev().take(scanned))
            } else {
                Box::new(v.iter().enumerate().take(scanned))
            };
            order
                .filter(|(_, e)| *e == a[2])
                .map(|(i, _)| i)
                .skip(skip)
                .take(want)
                .collect()
        }
    };
    match o.count {
        Some(_) => {
            r.array(found.len());
            for i in found {
                r.int(i as i64);
            }
        }
        None => match found.first() {
            Some(&i) => r.int(i as i64),
            None => r.null(),
        },
    }
    Ok(())
}

fn parse_end(a: &[u8]) -> Result<End, String> {
    if eq_ic(a, "left") {
        Ok(End::Head)
    } else if eq_ic(a, "right") {
        Ok(End::Tail)
    } else {
        Err(ERR_SYNTAX.into())
    }
}

fn reply_moved(r: &mut ReplyBuf, moved: Option<Vec<u8>>) {
    match moved {
        Some(e) => r.bulk(&e),
        None => r.null(),
    }
}

/// LMOVE source destination LEFT|RIGHT LEFT|RIGHT.
pub fn lmove(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (from, to) = (parse_end(a[3])?, parse_end(a[4])?);
    let moved = move_element(ctx, a[1], a[2], from, to)?;
    reply_moved(r, moved);
    Ok(())
}

pub fn rpoplpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let moved = move_element(ctx, a[1], a[2], End::Tail, End::Head)?;
    reply_moved(r, moved);
    Ok(())
}

/// A positive `long` with Redis's `getRangeLongFromObjectOrReply(1, LONG_MAX, msg)`: any
/// failure (not an integer, below 1) replies `msg`.
fn parse_at_least_one(a: &[u8], msg: &str) -> Result<u64, String> {
    crate::resp::parse::parse_i64(a)
        .filter(|&n| n >= 1)
        .map(|n| n as u64)
        .ok_or_else(|| msg.to_string())
}

/// LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]: `[key, [elements]]` from the first
/// key holding a list, a null array when none does. The arguments are checked before any
/// key is read, so a bad numkeys (the table's movable key count then names no keys) never
/// reaches a key.
pub fn lmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let numkeys = parse_at_least_one(a[1], "ERR numkeys should be greater than 0")?;
    let where_at = usize::try_from(numkeys)
        .ok()
        .and_then(|n| n.checked_add(2))
        .filter(|&w| w < a.len())
        .ok_or(ERR_SYNTAX)?;
    let end = parse_end(a[where_at])?;
    let mut count = None;
    let mut j = where_at + 1;
    while j < a.len() {
        if count.is_none() && eq_ic(a[j], "count") && j + 1 < a.len() {
            j += 1;
            count = Some(parse_at_least_one(
                a[j],
                "ERR count should be greater than 0",
            )?);
        } else {
            return Err(ERR_SYNTAX.into());
        }
        j += 1;
    }
    let count = usize::try_from(count.unwrap_or(1)).unwrap_or(usize::MAX);
    let keys = &a[2..where_at];
    // Redis stops at the first key of another kind with WRONGTYPE, even after missing keys.
    for key in keys {
        if let Some(items) = pop_from(ctx, key, end, count)? {
            r.array(2);
            r.bulk(key);
            reply_elements(r, &items);
            return Ok(());
        }
    }
    r.null_array();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Range normalisation follows Redis's for negative, reversed and out-of-range bounds.
    #[test]
    fn ranges() {
        assert_eq!(resolve_range(0, -1, 5), Some((0, 4)));
        assert_eq!(resolve_range(-100, 100, 5), Some((0, 4)));
        assert_eq!(resolve_range(3, 1, 5), None);
        assert_eq!(resolve_range(5, 10, 5), None);
        assert_eq!(resolve_range(-2, -1, 5), Some((3, 4)));
        assert_eq!(resolve_range(i64::MIN, i64::MAX, 5), Some((0, 4)));
        assert_eq!(resolve_index(-1, 3), Some(2));
        assert_eq!(resolve_index(3, 3), None);
        assert_eq!(resolve_index(i64::MIN, 3), None);
    }
}
