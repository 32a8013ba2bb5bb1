//! DUMP and RESTORE: a value in Redis's serialization format (`crate::rdb`), so values move
//! between lavik and Redis (migration tools such as redis-shake use these two commands).
//!
//! IDLETIME and FREQ are parsed and validated as Redis does, then dropped: lavik keeps no
//! LRU clock or LFU counter per key (OBJECT IDLETIME/FREQ do not reflect them).

use super::collection;
use super::{eq_ic, parse_int, storage_error, CmdResult, Ctx, ERR_SYNTAX};
use crate::rdb::{self, RdbValue};
use crate::resp::ReplyBuf;
use crate::storage::collection::{HashValue, SetValue};
use crate::storage::list_codec::ListValue;
use crate::storage::zset::ZSetValue;
use crate::storage::{StorageError, ValueKind};

/// Largest FREQ (an LFU counter is 8 bits).
const FREQ_MAX: i64 = 255;

fn corrupt(e: impl std::fmt::Display) -> String {
    storage_error(StorageError::Corrupt(e.to_string()))
}

pub fn dump(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    let Some(v) = ctx
        .shards
        .for_key(a[1])
        .get(db, a[1], now)
        .map_err(storage_error)?
    else {
        r.null();
        return Ok(());
    };
    let value = match v.kind {
        ValueKind::String => RdbValue::String(v.bytes),
        ValueKind::Hash => RdbValue::Hash(HashValue::decode(&v.bytes).map_err(corrupt)?),
        ValueKind::Set => RdbValue::Set(SetValue::decode(&v.bytes).map_err(corrupt)?),
        ValueKind::ZSet => RdbValue::ZSet(ZSetValue::decode(&v.bytes).map_err(corrupt)?),
        ValueKind::List => RdbValue::List(ListValue::decode(&v.bytes).map_err(corrupt)?),
    };
    r.bulk(&rdb::dump(&value));
    Ok(())
}

/// RESTORE's options after the payload.
struct RestoreOptions {
    replace: bool,
    absolute_ttl: bool,
}

/// Redis's option loop: IDLETIME and FREQ exclude each other (the second is a syntax
/// error), and each value is checked where it is read.
fn restore_options(a: &[&[u8]]) -> Result<RestoreOptions, String> {
    let mut o = RestoreOptions {
        replace: false,
        absolute_ttl: false,
    };
    let (mut idle, mut freq) = (false, false);
    let mut i = 4;
    while i < a.len() {
        let has_value = i + 1 < a.len();
        if eq_ic(a[i], "replace") {
            o.replace = true;
        } else if eq_ic(a[i], "absttl") {
            o.absolute_ttl = true;
        } else if eq_ic(a[i], "idletime") && has_value && !freq {
            if parse_int(a[i + 1])? < 0 {
                return Err("ERR Invalid IDLETIME value, must be >= 0".into());
            }
            idle = true;
            i += 1;
        } else if eq_ic(a[i], "freq") && has_value && !idle {
            if !(0..=FREQ_MAX).contains(&parse_int(a[i + 1])?) {
                return Err("ERR Invalid FREQ value, must be >= 0 and <= 255".into());
            }
            freq = true;
            i += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 1;
    }
    Ok(o)
}

/// RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ f], checks in Redis's
/// order: options, BUSYKEY, TTL, payload footer, payload body.
pub fn restore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let o = restore_options(a)?;
    let (key, db, now) = (a[1], ctx.db, ctx.now_ms);
    let exists = ctx
        .shards
        .for_key(key)
        .exists(db, key, now)
        .map_err(storage_error)?;
    if exists && !o.replace {
        return Err("BUSYKEY Target key name already exists.".into());
    }
    let ttl = parse_int(a[2])?;
    if ttl < 0 {
        return Err("ERR Invalid TTL value, must be >= 0".into());
    }
    let value = rdb::restore(a[3]).map_err(|e| e.reply_text().to_string())?;
    let expire_at_ms = match ttl {
        0 => None,
        t if o.absolute_ttl => Some(t as u64),
        t => Some(now.saturating_add(t as u64)),
    };
    let shard = ctx.shards.for_key(key);
    if expire_at_ms.is_some_and(|at| at <= now) {
        // Already expired: Redis deletes the key it would replace and creates nothing.
        if exists {
            shard.delete(db, key, now).map_err(storage_error)?;
            ctx.notify(crate::commands::events::GENERIC, "del", key);
        }
        r.ok();
        return Ok(());
    }
    // A collection goes through the same store as its commands, so one past the paging
    // threshold is written as a root and pages, never as one huge record that every later
    // read would have to decode whole.
    match value {
        RdbValue::String(s) => {
            shard
                .put(db, key, ValueKind::String, &s, expire_at_ms, now)
                .map_err(storage_error)?;
        }
        RdbValue::Hash(h) => collection::store_hash(ctx, key, &h, expire_at_ms)?,
        RdbValue::Set(s) => collection::store_set(ctx, key, &s, expire_at_ms)?,
        RdbValue::ZSet(z) => collection::store_zset(ctx, key, &z, expire_at_ms)?,
        RdbValue::List(l) => collection::store_list(ctx, key, &l, expire_at_ms)?,
    }
    ctx.notify(crate::commands::events::GENERIC, "restore", key);
    r.ok();
    Ok(())
}
