//! Keyspace commands: DEL, EXISTS, TYPE, RENAME, COPY, EXPIRE family, TTL
//! family, KEYS, SCAN, RANDOMKEY, DBSIZE, FLUSHDB, FLUSHALL, OBJECT ENCODING.

use super::events::GENERIC;
use super::{eq_ic, parse_int, storage_error, CmdResult, Ctx, Glob, ERR_SYNTAX};
use crate::resp::parse::parse_i64;
use crate::resp::ReplyBuf;
use crate::storage::{Collection, Db, ValueKind};

const DBS: u8 = 16;

pub fn del(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    let mut n = 0;
    for key in &a[1..] {
        if ctx
            .shards
            .for_key(key)
            .delete(db, key, now)
            .map_err(storage_error)?
        {
            ctx.notify(GENERIC, "del", key);
            n += 1;
        }
    }
    r.int(n);
    Ok(())
}

pub fn exists(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    let mut n = 0;
    for key in &a[1..] {
        if ctx
            .shards
            .for_key(key)
            .exists(db, key, now)
            .map_err(storage_error)?
        {
            n += 1;
        }
    }
    r.int(n);
    Ok(())
}

pub fn type_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::String => "string",
        ValueKind::Hash => "hash",
        ValueKind::Set => "set",
        ValueKind::ZSet => "zset",
        ValueKind::List => "list",
    }
}

/// OBJECT ENCODING's name for a value: Redis's for the same contents. Strings answer as
/// Redis encodes a value written by SET (`int`, `embstr` up to 44 bytes, `raw`); lavik does
/// not track APPEND/SETRANGE turning an embstr into a raw string.
fn encoding_name(v: &crate::storage::Value) -> Result<&'static str, String> {
    use crate::storage::collection::{HashValue, SetValue};
    let corrupt = |e: crate::storage::collection::CodecError| {
        storage_error(crate::storage::StorageError::Corrupt(e.to_string()))
    };
    Ok(match v.kind {
        ValueKind::String if v.bytes.len() <= 20 && parse_i64(&v.bytes).is_some() => "int",
        ValueKind::String if v.bytes.len() <= 44 => "embstr",
        ValueKind::String => "raw",
        ValueKind::Hash => HashValue::decode(&v.bytes)
            .map_err(corrupt)?
            .encoding()
            .name(),
        ValueKind::Set => SetValue::decode(&v.bytes)
            .map_err(corrupt)?
            .encoding()
            .name(),
        ValueKind::ZSet => crate::storage::zset::ZSetValue::decode(&v.bytes)
            .map_err(|e| storage_error(crate::storage::StorageError::Corrupt(e.to_string())))?
            .encoding()
            .name(),
        ValueKind::List => crate::storage::list_codec::ListValue::decode(&v.bytes)
            .map_err(|e| storage_error(crate::storage::StorageError::Corrupt(e.to_string())))?
            .encoding()
            .name(),
    })
}

/// OBJECT ENCODING's name for a paged collection, from its kind alone (its root is not
/// decoded, so this holds whatever the root format): only Redis's big encodings are ever
/// paged — a hash or set is paged only when hashtable-encoded (`collection::stays_paged`),
/// a list only as a quicklist of two or more nodes, a sorted set only as a skiplist
/// (`store_list`, `store_zset`) — and Redis never converts those back on the way down while
/// lavik keeps a collection paged (a paged list of one leaf is demoted to one record first).
fn paged_encoding_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Hash | ValueKind::Set => "hashtable",
        ValueKind::List => "quicklist",
        ValueKind::ZSet => "skiplist",
        // Strings are never paged (large ones are fragmented, not paged).
        ValueKind::String => "raw",
    }
}

/// OBJECT ENCODING | FREQ | IDLETIME | REFCOUNT key, OBJECT HELP.
///
/// lavik keeps no per-key access time, access frequency or reference count (RAM per
/// key is the index entry only), so: FREQ gives Redis's error for a policy that is not
/// LFU (lavik has no LFU policy, nor any eviction); IDLETIME is 0 (no access time is
/// kept: "just accessed" is the answer that never claims a key is cold); REFCOUNT is
/// what Redis reports for the same value — 2147483647 for the integers 0..9999 Redis
/// shares, 1 otherwise — since lavik shares nothing and Redis's answer is the one
/// clients compare against. See `docs/operations.md`.
pub fn object(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if eq_ic(a[1], "help") && a.len() == 2 {
        let lines = [
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>.",
            "FREQ <key>",
            "    Return the access frequency index of the <key>. The returned integer is",
            "    proportional to the logarithm of the recent access frequency of the key.",
            "IDLETIME <key>",
            "    Return the idle time of the <key>, that is the approximated number of",
            "    seconds elapsed since the last access to the key.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key>.",
            "HELP",
            "    Prints this help.",
        ];
        r.array(lines.len());
        for l in lines {
            r.simple(l);
        }
        return Ok(());
    }
    if eq_ic(a[1], "help") {
        return Err("ERR wrong number of arguments for 'object|help' command".into());
    }
    let sub = ["encoding", "freq", "idletime", "refcount"]
        .into_iter()
        .find(|s| eq_ic(a[1], s));
    let Some(sub) = sub else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try OBJECT HELP.",
            String::from_utf8_lossy(a[1])
        ));
    };
    if a.len() != 3 {
        return Err(format!(
            "ERR wrong number of arguments for 'object|{sub}' command"
        ));
    }
    let (db, now) = (ctx.db, ctx.now_ms);
    // A paged collection answers from its root: no page is read (issue 13, RSS under load).
    let Some(c) = ctx
        .shards
        .for_key(a[2])
        .get_collection(db, a[2], now)
        .map_err(storage_error)?
    else {
        r.null();
        return Ok(());
    };
    match sub {
        "encoding" => r.bulk_str(match &c {
            Collection::Whole(v) => encoding_name(v)?,
            Collection::Paged { kind, .. } => paged_encoding_name(*kind),
        }),
        "freq" => return Err(ERR_NO_LFU.into()),
        "idletime" => r.int(0),
        _ => {
            let shared_int = matches!(&c, Collection::Whole(v) if v.kind == ValueKind::String
                && v.bytes.len() <= 4
                && parse_i64(&v.bytes).is_some_and(|n| (0..10_000).contains(&n)));
            r.int(if shared_int { i32::MAX as i64 } else { 1 });
        }
    }
    Ok(())
}

const ERR_NO_LFU: &str = "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.";

/// MOVE key db: to another db of the same shard (the db is part of the index key, the
/// shard is chosen by the key's slot alone). Reads (source, destination) before writing.
pub fn move_(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = parse_int(a[2])?;
    if n < i32::MIN as i64 || n > i32::MAX as i64 {
        return Err(
            "ERR value is out of range, value must between -2147483648 and 2147483647".into(),
        );
    }
    if !(0..DBS as i64).contains(&n) {
        return Err("ERR DB index is out of range".into());
    }
    let dst_db = n as Db;
    if dst_db == ctx.db {
        return Err("ERR source and destination objects are the same".into());
    }
    let (db, now, key) = (ctx.db, ctx.now_ms, a[1]);
    let shard = ctx.shards.for_key(key);
    let Some(c) = shard.get_collection(db, key, now).map_err(storage_error)? else {
        r.int(0);
        return Ok(());
    };
    if shard.exists(dst_db, key, now).map_err(storage_error)? {
        r.int(0);
        return Ok(());
    }
    let v = whole(shard, db, key, now, c)?;
    shard
        .put(dst_db, key, v.kind, &v.bytes, v.expire_at_ms, now)
        .map_err(storage_error)?;
    shard.delete(db, key, now).map_err(storage_error)?;
    drop_whole(v);
    r.int(1);
    Ok(())
}

pub fn type_(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    // A paged collection's kind is in its root: its pages are not read.
    match ctx
        .shards
        .for_key(a[1])
        .get_collection(db, a[1], now)
        .map_err(storage_error)?
    {
        Some(crate::storage::Collection::Whole(v)) => r.simple(type_name(v.kind)),
        Some(crate::storage::Collection::Paged { kind, .. }) => r.simple(type_name(kind)),
        None => r.simple("none"),
    }
    Ok(())
}

/// A value read whole, from what `get_collection` gave: a paged collection's pages are read
/// only now, by a command that has checked it will write the value somewhere.
fn whole(
    shard: &mut crate::storage::Shard,
    db: Db,
    key: &[u8],
    now: u64,
    c: Collection,
) -> Result<crate::storage::Value, String> {
    match c {
        Collection::Whole(v) => Ok(v),
        Collection::Paged { .. } => {
            shard
                .get(db, key, now)
                .map_err(storage_error)?
                .ok_or_else(|| {
                    storage_error(crate::storage::StorageError::Corrupt(
                        "a paged collection vanished while read".into(),
                    ))
                })
        }
    }
}

/// A whole value this big, built from a paged collection and written elsewhere (RENAME,
/// COPY, MOVE), is given back to the kernel once freed (`drop_whole`).
const TRIM_AFTER_BYTES: usize = 8 << 20;

/// Frees `v`; the heap is trimmed after a big one (glibc keeps freed memory otherwise, and
/// RSS would stay at the command's peak: issue 13, RSS under load).
fn drop_whole(v: crate::storage::Value) {
    let big = v.bytes.len() >= TRIM_AFTER_BYTES;
    drop(v);
    if big {
        crate::runtime::trim_heap();
    }
}

fn move_key(ctx: &mut Ctx, src: &[u8], dst: &[u8], nx: bool) -> Result<bool, String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    // Pages are read only once the move is known to happen (not for RENAMENX onto an
    // existing key, nor a rename onto itself).
    let Some(c) = ctx
        .shards
        .for_key(src)
        .get_collection(db, src, now)
        .map_err(storage_error)?
    else {
        return Err("ERR no such key".into());
    };
    if src == dst {
        return Ok(!nx);
    }
    if nx
        && ctx
            .shards
            .for_key(dst)
            .exists(db, dst, now)
            .map_err(storage_error)?
    {
        return Ok(false);
    }
    let v = whole(ctx.shards.for_key(src), db, src, now, c)?;
    ctx.shards
        .for_key(dst)
        .put(db, dst, v.kind, &v.bytes, v.expire_at_ms, now)
        .map_err(storage_error)?;
    ctx.shards
        .for_key(src)
        .delete(db, src, now)
        .map_err(storage_error)?;
    drop_whole(v);
    ctx.notify(GENERIC, "rename_from", src);
    ctx.notify(GENERIC, "rename_to", dst);
    Ok(true)
}

pub fn rename(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    move_key(ctx, a[1], a[2], false)?;
    r.ok();
    Ok(())
}

pub fn renamenx(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let done = move_key(ctx, a[1], a[2], true)?;
    r.int(done as i64);
    Ok(())
}

pub fn copy(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (mut dst_db, mut replace) = (ctx.db, false);
    let mut i = 3;
    while i < a.len() {
        if eq_ic(a[i], "replace") {
            replace = true;
        } else if eq_ic(a[i], "db") && i + 1 < a.len() {
            let n = parse_int(a[i + 1])?;
            if !(0..DBS as i64).contains(&n) {
                return Err("ERR DB index is out of range".into());
            }
            dst_db = n as Db;
            i += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 1;
    }
    let (src, dst) = (a[1], a[2]);
    if src == dst && dst_db == ctx.db {
        return Err("ERR source and destination objects are the same".into());
    }
    let (db, now) = (ctx.db, ctx.now_ms);
    let Some(c) = ctx
        .shards
        .for_key(src)
        .get_collection(db, src, now)
        .map_err(storage_error)?
    else {
        r.int(0);
        return Ok(());
    };
    if !replace
        && ctx
            .shards
            .for_key(dst)
            .exists(dst_db, dst, now)
            .map_err(storage_error)?
    {
        r.int(0);
        return Ok(());
    }
    let v = whole(ctx.shards.for_key(src), db, src, now, c)?;
    ctx.shards
        .for_key(dst)
        .put(dst_db, dst, v.kind, &v.bytes, v.expire_at_ms, now)
        .map_err(storage_error)?;
    drop_whole(v);
    super::events::notify(GENERIC, "copy_to", dst, dst_db);
    r.int(1);
    Ok(())
}

/// EXPIRE/PEXPIRE/EXPIREAT/PEXPIREAT with NX|XX|GT|LT.
fn expire_generic(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut ReplyBuf,
    unit_ms: i64,
    absolute: bool,
    cmd: &str,
) -> CmdResult {
    let n = parse_int(a[2])?;
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in &a[3..] {
        if eq_ic(o, "nx") {
            nx = true;
        } else if eq_ic(o, "xx") {
            xx = true;
        } else if eq_ic(o, "gt") {
            gt = true;
        } else if eq_ic(o, "lt") {
            lt = true;
        } else {
            return Err(format!(
                "ERR Unsupported option {}",
                String::from_utf8_lossy(o)
            ));
        }
    }
    if nx && (xx || gt || lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if gt && lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    let invalid = || format!("ERR invalid expire time in '{cmd}' command");
    let mut when = n.checked_mul(unit_ms).ok_or_else(invalid)?;
    if !absolute {
        when = when.checked_add(ctx.now_ms as i64).ok_or_else(invalid)?;
    }
    let (db, now) = (ctx.db, ctx.now_ms);
    let shard = ctx.shards.for_key(a[1]);
    // The expiry only: a paged collection's root has it, its pages are not read.
    let Some(c) = shard.get_collection(db, a[1], now).map_err(storage_error)? else {
        r.int(0);
        return Ok(());
    };
    let cur = expiry_of_collection(&c);
    let ok = match cur {
        None => !(xx || gt),
        Some(c) => !(nx || (gt && when <= c as i64) || (lt && when >= c as i64)),
    };
    if !ok {
        r.int(0);
        return Ok(());
    }
    if when <= now as i64 {
        shard.delete(db, a[1], now).map_err(storage_error)?;
        ctx.notify(GENERIC, "del", a[1]);
    } else {
        shard
            .set_expiry(db, a[1], Some(when as u64), now)
            .map_err(storage_error)?;
        ctx.notify(GENERIC, "expire", a[1]);
    }
    r.int(1);
    Ok(())
}

pub fn expire(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    expire_generic(ctx, a, r, 1000, false, "expire")
}
pub fn pexpire(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    expire_generic(ctx, a, r, 1, false, "pexpire")
}
pub fn expireat(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    expire_generic(ctx, a, r, 1000, true, "expireat")
}
pub fn pexpireat(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    expire_generic(ctx, a, r, 1, true, "pexpireat")
}

fn expiry_of_collection(c: &Collection) -> Option<u64> {
    match c {
        Collection::Whole(v) => v.expire_at_ms,
        Collection::Paged { expire_at_ms, .. } => *expire_at_ms,
    }
}

/// TTL family: `Ok(None)` = missing key (-2), `Some(None)` = no TTL (-1). A paged
/// collection's expiry is its root's: its pages are not read.
fn expiry_of(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Option<u64>>, String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    Ok(ctx
        .shards
        .for_key(key)
        .get_collection(db, key, now)
        .map_err(storage_error)?
        .map(|c| expiry_of_collection(&c)))
}

fn ttl_generic(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut ReplyBuf,
    ms: bool,
    absolute: bool,
) -> CmdResult {
    let now = ctx.now_ms;
    match expiry_of(ctx, a[1])? {
        None => r.int(-2),
        Some(None) => r.int(-1),
        Some(Some(at)) => {
            if absolute {
                r.int(if ms { at as i64 } else { (at / 1000) as i64 });
            } else {
                let left = at.saturating_sub(now) as i64;
                r.int(if ms { left } else { (left + 500) / 1000 });
            }
        }
    }
    Ok(())
}

pub fn ttl(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    ttl_generic(ctx, a, r, false, false)
}
pub fn pttl(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    ttl_generic(ctx, a, r, true, false)
}
pub fn expiretime(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    ttl_generic(ctx, a, r, false, true)
}
pub fn pexpiretime(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    ttl_generic(ctx, a, r, true, true)
}

pub fn persist(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    match expiry_of(ctx, a[1])? {
        Some(Some(_)) => {
            ctx.shards
                .for_key(a[1])
                .set_expiry(db, a[1], None, now)
                .map_err(storage_error)?;
            ctx.notify(GENERIC, "persist", a[1]);
            r.int(1);
        }
        _ => r.int(0),
    }
    Ok(())
}

/// Shards in id order, as SCAN walks them.
fn held_ids(ctx: &mut Ctx) -> Vec<usize> {
    ctx.shards
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_some())
        .map(|(i, _)| i)
        .collect()
}

pub fn keys(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    // Redis lists every key for the pattern `*` without matching (so the empty key is
    // listed, which the matcher itself would refuse).
    let glob = (a[1] != b"*").then(|| Glob::new(a[1]));
    let mut found = Vec::new();
    for id in held_ids(ctx) {
        let shard = ctx.shards.slots[id].as_mut().expect("held");
        let mut cursor = 0;
        loop {
            let (next, batch) = shard.scan(db, cursor, 1024, now).map_err(storage_error)?;
            found.extend(
                batch
                    .into_iter()
                    .filter(|k| glob.as_ref().is_none_or(|g| g.matches(k))),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    // A shard scan may repeat a key at its resume points; KEYS must not.
    found.sort_unstable();
    found.dedup();
    r.array(found.len());
    for k in found {
        r.bulk(&k);
    }
    Ok(())
}

pub fn scan(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let cursor: u64 = std::str::from_utf8(a[1])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("ERR invalid cursor")?;
    let (mut pattern, mut count, mut type_filter): (Option<&[u8]>, usize, Option<&[u8]>) =
        (None, 10, None);
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return Err(ERR_SYNTAX.into());
        }
        if eq_ic(a[i], "match") {
            pattern = Some(a[i + 1]);
        } else if eq_ic(a[i], "count") {
            let n = parse_int(a[i + 1])?;
            if n < 1 {
                return Err(ERR_SYNTAX.into());
            }
            count = n as usize;
        } else if eq_ic(a[i], "type") {
            type_filter = Some(a[i + 1]);
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 2;
    }
    let shard_count = ctx.shards.shard_count as u64;
    let (mut shard_idx, mut shard_cursor) = (cursor % shard_count, cursor / shard_count);
    let (db, now) = (ctx.db, ctx.now_ms);
    let mut keys = Vec::new();
    let mut next_cursor = 0;
    while shard_idx < shard_count {
        let shard = ctx.shards.slots[shard_idx as usize]
            .as_mut()
            .expect("all shards held for SCAN");
        let (next, batch) = shard
            .scan(db, shard_cursor, count, now)
            .map_err(storage_error)?;
        keys.extend(batch);
        if next == 0 {
            shard_idx += 1;
            shard_cursor = 0;
        } else {
            shard_cursor = next;
        }
        if keys.len() >= count {
            if shard_idx < shard_count {
                next_cursor = shard_cursor
                    .checked_mul(shard_count)
                    .and_then(|c| c.checked_add(shard_idx))
                    .ok_or("ERR scan cursor overflow")?;
            }
            break;
        }
    }
    // As in KEYS, the pattern `*` is not matched (the empty key passes).
    if let Some(p) = pattern.filter(|p| *p != b"*") {
        let glob = Glob::new(p);
        keys.retain(|k| glob.matches(k));
    }
    if let Some(t) = type_filter {
        let mut kept = Vec::with_capacity(keys.len());
        for k in keys {
            let shard = ctx.shards.for_key(&k);
            // A paged collection's kind is in its root: its pages are not read.
            let kind = match shard.get_collection(db, &k, now).map_err(storage_error)? {
                Some(Collection::Whole(v)) => Some(v.kind),
                Some(Collection::Paged { kind, .. }) => Some(kind),
                None => None,
            };
            if kind.is_some_and(|kind| eq_ic(t, type_name(kind))) {
                kept.push(k);
            }
        }
        keys = kept;
    }
    r.array(2);
    r.bulk(next_cursor.to_string().as_bytes());
    r.array(keys.len());
    for k in keys {
        r.bulk(&k);
    }
    Ok(())
}

pub fn randomkey(ctx: &mut Ctx, _a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    let ids = held_ids(ctx);
    // Exact key counts: unsettled blind writes first.
    for s in ctx.shards.held() {
        s.settle_blind_all().map_err(storage_error)?;
    }
    let total: u64 = ids
        .iter()
        .map(|&i| ctx.shards.slots[i].as_ref().map_or(0, |s| s.key_count(db)))
        .sum();
    if total == 0 {
        r.null();
        return Ok(());
    }
    // Pick a shard with probability proportional to its key count.
    let mut pick = now.wrapping_mul(0x9E37_79B9_7F4A_7C15) % total;
    for &i in &ids {
        let shard = ctx.shards.slots[i].as_mut().expect("held");
        let n = shard.key_count(db);
        if pick < n {
            if let Some(k) = shard.random_key(db, now).map_err(storage_error)? {
                r.bulk(&k);
                return Ok(());
            }
        }
        pick = pick.saturating_sub(n);
    }
    for &i in &ids {
        if let Some(k) = ctx.shards.slots[i]
            .as_mut()
            .expect("held")
            .random_key(db, now)
            .map_err(storage_error)?
        {
            r.bulk(&k);
            return Ok(());
        }
    }
    r.null();
    Ok(())
}

pub fn dbsize(ctx: &mut Ctx, _a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let db = ctx.db;
    // Exact: unsettled blind writes first (each costs its two records' reads).
    for s in ctx.shards.held() {
        s.settle_blind_all().map_err(storage_error)?;
    }
    let n: u64 = ctx.shards.held().map(|s| s.key_count(db)).sum();
    r.int(n as i64);
    Ok(())
}

fn flush_mode_ok(a: &[&[u8]]) -> CmdResult {
    match a.len() {
        1 => Ok(()),
        2 if eq_ic(a[1], "async") || eq_ic(a[1], "sync") => Ok(()),
        _ => Err(ERR_SYNTAX.into()),
    }
}

pub fn flushdb(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    flush_mode_ok(a)?;
    let db = ctx.db;
    for s in ctx.shards.held() {
        s.flush_db(db).map_err(storage_error)?;
    }
    r.ok();
    Ok(())
}

pub fn flushall(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    flush_mode_ok(a)?;
    for s in ctx.shards.held() {
        for db in 0..DBS {
            s.flush_db(db).map_err(storage_error)?;
        }
    }
    r.ok();
    Ok(())
}
