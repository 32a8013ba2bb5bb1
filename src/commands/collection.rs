//! What hash and set commands share: loading and storing a collection (the seam the paged
//! layer of `docs/collections.md` goes under), the random source of SPOP/SRANDMEMBER/
//! HRANDFIELD, and the cursor and options of HSCAN/SSCAN.
//!
//! A command loads every key it needs first (`load_hash`/`load_set`: WRONGTYPE for another
//! kind, `None` for a missing or expired key), mutates the in-memory value, then stores
//! (`store_hash`/`store_set`, which delete a collection that became empty, as Redis does).
//! All reads come before the first write, so a command that fails half way has written
//! nothing. Stage 1 decodes and re-encodes the whole record; a paged implementation keeps
//! these signatures and loads only what a command touches.

use super::{eq_ic, parse_int, storage_error, Ctx, ERR_SYNTAX, ERR_WRONGTYPE};
use crate::resp::ReplyBuf;
use crate::storage::collection::{CodecError, HashEncoding, HashValue, SetEncoding, SetValue};
use crate::storage::list_codec::{End, ListEncoding, ListValue};
use crate::storage::paged_list::{self, ListHandle, PagedList};
use crate::storage::paged_zset::{self, PagedZSet, ZHandle};
use crate::storage::zset::{ZSetEncoding, ZSetValue};
use crate::storage::{paged, Collection};
use crate::storage::{StorageError, ValueKind};
use std::cell::Cell;

/// A collection as loaded, with the key's expiry (kept by every update).
pub struct Loaded<T> {
    pub value: T,
    pub expire_at_ms: Option<u64>,
}

fn corrupt(e: CodecError) -> String {
    storage_error(StorageError::Corrupt(e.to_string()))
}

/// A hash or set as stored: its one-record bytes, or a paged root's payload.
enum Raw {
    Whole(Vec<u8>),
    Paged(Vec<u8>),
}

fn load_coll(ctx: &mut Ctx, key: &[u8], kind: ValueKind) -> Result<Option<Loaded<Raw>>, String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    // A reader that is not the batch's coalescing push/pop (a blocked client served by a
    // push, LLEN...) sees the coalesced list only once it is stored.
    paged_list::store_coalesced_key(ctx.shards.for_key(key), db, key, now)
        .map_err(storage_error)?;
    match ctx
        .shards
        .for_key(key)
        .get_collection(db, key, now)
        .map_err(storage_error)?
    {
        None => Ok(None),
        Some(Collection::Whole(v)) if v.kind != kind => Err(ERR_WRONGTYPE.into()),
        Some(Collection::Whole(v)) => Ok(Some(Loaded {
            value: Raw::Whole(v.bytes),
            expire_at_ms: v.expire_at_ms,
        })),
        Some(Collection::Paged { kind: k, .. }) if k != kind => Err(ERR_WRONGTYPE.into()),
        Some(Collection::Paged {
            root, expire_at_ms, ..
        }) => Ok(Some(Loaded {
            value: Raw::Paged(root),
            expire_at_ms,
        })),
    }
}

/// A single-member write (HSET/HMSET of one field, HSETNX, HINCRBY, HDEL, SADD, SREM of one
/// member) on a paged hash or set, done on the leaf's bytes without loading the members
/// (`paged::point_write`; `decide` maps the member's current value to the write, as there).
/// `Ok(existed)` when done (whether the member was there before; nothing is written for
/// an SADD of a member present, a removal of one absent, or when `decide` says none);
/// `Err(loaded)` when `key` is not a paged collection of `kind` or the write splits, merges
/// or demotes: the caller then takes its general path (which the same write would take),
/// handing `loaded` to `load_hash_for`/`load_set_for` so the key is not looked up twice.
pub fn point_write(
    ctx: &mut Ctx,
    key: &[u8],
    kind: ValueKind,
    member: &[u8],
    decide: impl FnOnce(Option<&[u8]>) -> Option<paged::PointOp>,
) -> Result<Result<bool, Preloaded>, String> {
    let loaded = load_coll(ctx, key, kind)?;
    let Some(Loaded {
        value: Raw::Paged(root),
        expire_at_ms,
    }) = &loaded
    else {
        return Ok(Err(Preloaded(Some(loaded))));
    };
    let (db, now) = (ctx.db, ctx.now_ms);
    let shard = ctx.shards.for_key(key);
    let expire = *expire_at_ms;
    match paged::point_write(shard, db, key, kind, root, member, decide, expire, now)
        .map_err(storage_error)?
    {
        paged::PointOutcome::Applied { existed, .. } => Ok(Ok(existed)),
        paged::PointOutcome::General => Ok(Err(Preloaded(Some(loaded)))),
    }
}

/// What `point_write` looked up for a write it left to the general path, or nothing
/// (`Preloaded::default()`: the loader looks the key up itself).
#[derive(Default)]
pub struct Preloaded(Option<Option<Loaded<Raw>>>);

pub fn load_hash(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Loaded<HashValue>>, String> {
    let raw = load_coll(ctx, key, ValueKind::Hash)?;
    load_hash_with(ctx, key, None, raw)
}

/// `load_hash` for a command that reads and writes only the fields `names`: of a paged hash
/// only the leaves that can hold them are read (`paged::load_partial`); the value then holds
/// just those leaves' fields (its `len` still counts the whole hash) and `store_hash`
/// rewrites only them.
pub fn load_hash_for(
    ctx: &mut Ctx,
    key: &[u8],
    names: &[&[u8]],
    pre: Preloaded,
) -> Result<Option<Loaded<HashValue>>, String> {
    let raw = match pre.0 {
        Some(raw) => raw,
        None => load_coll(ctx, key, ValueKind::Hash)?,
    };
    load_hash_with(ctx, key, Some(names), raw)
}

fn load_hash_with(
    ctx: &mut Ctx,
    key: &[u8],
    names: Option<&[&[u8]]>,
    raw: Option<Loaded<Raw>>,
) -> Result<Option<Loaded<HashValue>>, String> {
    let Some(Loaded {
        value: raw,
        expire_at_ms,
    }) = raw
    else {
        return Ok(None);
    };
    let value = match raw {
        Raw::Whole(bytes) => HashValue::decode(&bytes).map_err(corrupt)?,
        Raw::Paged(root) => {
            let db = ctx.db;
            let shard = ctx.shards.for_key(key);
            let root = paged::Root::decode(&root).map_err(storage_error)?;
            let (pairs, tree) = match names {
                Some(n) => paged::load_partial(shard, db, key, &root, n, true),
                None => paged::load(shard, db, key, &root, true),
            }
            .map_err(storage_error)?;
            HashValue::from_paged(pairs, tree)
        }
    };
    Ok(Some(Loaded {
        value,
        expire_at_ms,
    }))
}

pub fn load_set(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Loaded<SetValue>>, String> {
    let raw = load_coll(ctx, key, ValueKind::Set)?;
    load_set_with(ctx, key, None, raw)
}

/// `load_set` for a command that reads and writes only the members `names` (as
/// `load_hash_for`).
pub fn load_set_for(
    ctx: &mut Ctx,
    key: &[u8],
    names: &[&[u8]],
    pre: Preloaded,
) -> Result<Option<Loaded<SetValue>>, String> {
    let raw = match pre.0 {
        Some(raw) => raw,
        None => load_coll(ctx, key, ValueKind::Set)?,
    };
    load_set_with(ctx, key, Some(names), raw)
}

fn load_set_with(
    ctx: &mut Ctx,
    key: &[u8],
    names: Option<&[&[u8]]>,
    raw: Option<Loaded<Raw>>,
) -> Result<Option<Loaded<SetValue>>, String> {
    let Some(Loaded {
        value: raw,
        expire_at_ms,
    }) = raw
    else {
        return Ok(None);
    };
    let value = match raw {
        Raw::Whole(bytes) => SetValue::decode(&bytes).map_err(corrupt)?,
        Raw::Paged(root) => {
            let db = ctx.db;
            let shard = ctx.shards.for_key(key);
            let root = paged::Root::decode(&root).map_err(storage_error)?;
            let (members, tree) = match names {
                Some(n) => paged::load_partial(shard, db, key, &root, n, false),
                None => paged::load(shard, db, key, &root, false),
            }
            .map_err(storage_error)?;
            SetValue::from_paged(members, tree)
        }
    };
    Ok(Some(Loaded {
        value,
        expire_at_ms,
    }))
}

/// A hash or set as opened by a command that reads only what it needs of a paged one: the
/// decoded one-record value, or a paged collection's root (no page read yet).
pub enum Opened<T> {
    Whole(T),
    Paged(paged::Root),
}

impl<T> Opened<T> {
    /// The paged root, if paged.
    pub fn root(&self) -> Option<&paged::Root> {
        match self {
            Opened::Paged(r) => Some(r),
            Opened::Whole(_) => None,
        }
    }
}

/// Opens the hash at `key` (WRONGTYPE for another kind, `None` when missing or expired).
pub fn open_hash(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Opened<HashValue>>, String> {
    Ok(match load_coll(ctx, key, ValueKind::Hash)? {
        None => None,
        Some(Loaded {
            value: Raw::Whole(b),
            ..
        }) => Some(Opened::Whole(HashValue::decode(&b).map_err(corrupt)?)),
        Some(Loaded {
            value: Raw::Paged(r),
            ..
        }) => Some(Opened::Paged(
            paged::Root::decode(&r).map_err(storage_error)?,
        )),
    })
}

/// Opens the set at `key` (as `open_hash`).
pub fn open_set(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Opened<SetValue>>, String> {
    Ok(match load_coll(ctx, key, ValueKind::Set)? {
        None => None,
        Some(Loaded {
            value: Raw::Whole(b),
            ..
        }) => Some(Opened::Whole(SetValue::decode(&b).map_err(corrupt)?)),
        Some(Loaded {
            value: Raw::Paged(r),
            ..
        }) => Some(Opened::Paged(
            paged::Root::decode(&r).map_err(storage_error)?,
        )),
    })
}

/// The random ranks HRANDFIELD/SRANDMEMBER/SPOP pick among `n` members for `count`
/// (negative: `|count|` picks, repeats allowed; otherwise `count` distinct ranks, `count <
/// n`).
pub fn random_ranks(n: usize, count: i64) -> Vec<usize> {
    if count < 0 {
        (0..count.unsigned_abs()).map(|_| random_below(n)).collect()
    } else {
        distinct_indexes(n, count as usize)
    }
}

/// Point reads that need only the root (counts) or, per name, one directory page and one
/// leaf of a paged collection (HGET, HMGET, HEXISTS, HSTRLEN, HLEN, SISMEMBER, SMISMEMBER,
/// SCARD; `paged::lookup_many`); a one-record value is decoded as `load_*` does.
pub enum Point {
    Count,
    Lookup(Vec<Vec<u8>>),
}

/// `None`: the key is missing. Otherwise the count, or per name its value (`None` when
/// absent; an empty value for a set member).
#[allow(clippy::type_complexity)]
pub fn point_read(
    ctx: &mut Ctx,
    key: &[u8],
    kind: ValueKind,
    q: &Point,
) -> Result<Option<(usize, Vec<Option<Vec<u8>>>)>, String> {
    let Some(Loaded { value: raw, .. }) = load_coll(ctx, key, kind)? else {
        return Ok(None);
    };
    let has_values = kind == ValueKind::Hash;
    match raw {
        Raw::Whole(bytes) => {
            let (n, found) = if has_values {
                let h = HashValue::decode(&bytes).map_err(corrupt)?;
                let found = match q {
                    Point::Count => Vec::new(),
                    Point::Lookup(names) => {
                        names.iter().map(|f| h.get(f).map(|v| v.to_vec())).collect()
                    }
                };
                (h.len(), found)
            } else {
                let s = SetValue::decode(&bytes).map_err(corrupt)?;
                let found = match q {
                    Point::Count => Vec::new(),
                    Point::Lookup(names) => {
                        names.iter().map(|m| s.contains(m).then(Vec::new)).collect()
                    }
                };
                (s.len(), found)
            };
            Ok(Some((n, found)))
        }
        Raw::Paged(root) => {
            let root = paged::Root::decode(&root).map_err(storage_error)?;
            let db = ctx.db;
            let shard = ctx.shards.for_key(key);
            let found = match q {
                Point::Count => Vec::new(),
                // Each name's leaf read once; every page asked for in one round per level.
                Point::Lookup(names) => {
                    let names: Vec<&[u8]> = names.iter().map(|n| n.as_slice()).collect();
                    let mut dirs = std::collections::HashMap::new();
                    paged::lookup_many(shard, db, key, &root, &names, has_values, &mut dirs)
                        .map_err(storage_error)?
                }
            };
            Ok(Some((root.count as usize, found)))
        }
    }
}

fn store_raw(
    ctx: &mut Ctx,
    key: &[u8],
    kind: ValueKind,
    bytes: Option<Vec<u8>>,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    let shard = ctx.shards.for_key(key);
    match bytes {
        Some(b) => shard
            .put(db, key, kind, &b, expire_at_ms, now)
            .map_err(storage_error),
        None => shard
            .delete(db, key, now)
            .map(|_| ())
            .map_err(storage_error),
    }
}

/// How a hashtable-encoded collection is stored (`docs/collections.md` section 2): paged
/// above `PROMOTE_BYTES` of members, one record again only under `DEMOTE_BYTES`.
fn stays_paged(tree: Option<&paged::Tree>, hashtable: bool, body_bytes: usize) -> bool {
    match tree {
        Some(_) => body_bytes >= paged::DEMOTE_BYTES,
        None => hashtable && body_bytes > paged::PROMOTE_BYTES,
    }
}

#[allow(clippy::too_many_arguments)]
fn store_paged<E: paged::Elem>(
    ctx: &mut Ctx,
    key: &[u8],
    kind: ValueKind,
    encoding: u8,
    elems: &[E],
    tree: Option<&paged::Tree>,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    let shard = ctx.shards.for_key(key);
    match tree {
        Some(t) => paged::update(shard, db, key, kind, encoding, elems, t, expire_at_ms, now),
        None => paged::build(shard, db, key, kind, encoding, elems, expire_at_ms, now),
    }
    .map_err(storage_error)
}

/// Writes `h` under `key` (deleting the key when `h` is empty).
pub fn store_hash(
    ctx: &mut Ctx,
    key: &[u8],
    h: &HashValue,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    if let Some(t) = h.paged_tree().filter(|t| t.is_partial()) {
        if h.is_empty() {
            return store_raw(ctx, key, ValueKind::Hash, None, expire_at_ms);
        }
        if t.rest_bytes() + h.body_bytes() >= paged::DEMOTE_BYTES {
            let enc = h.encoding_byte();
            return store_paged(
                ctx,
                key,
                ValueKind::Hash,
                enc,
                h.pairs(),
                Some(t),
                expire_at_ms,
            );
        }
        // Small enough for one record again: the fields not read join those read.
        let (db, shard) = (ctx.db, ctx.shards.for_key(key));
        let mut all = paged::load_rest(shard, db, key, t, true).map_err(storage_error)?;
        all.extend_from_slice(h.pairs());
        all.sort_by_cached_key(|(f, _)| (paged::position(f), f.clone()));
        let whole = HashValue::from_paged(all, paged::Tree::default());
        return store_raw(
            ctx,
            key,
            ValueKind::Hash,
            Some(whole.encode()),
            expire_at_ms,
        );
    }
    let hashtable = h.encoding() == HashEncoding::Hashtable;
    if !h.is_empty() && stays_paged(h.paged_tree(), hashtable, h.body_bytes()) {
        let (kind, enc) = (ValueKind::Hash, h.encoding_byte());
        return store_paged(ctx, key, kind, enc, h.pairs(), h.paged_tree(), expire_at_ms);
    }
    let bytes = (!h.is_empty()).then(|| h.encode());
    store_raw(ctx, key, ValueKind::Hash, bytes, expire_at_ms)
}

pub fn store_set(
    ctx: &mut Ctx,
    key: &[u8],
    s: &SetValue,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    if let Some(t) = s.paged_tree().filter(|t| t.is_partial()) {
        if s.is_empty() {
            return store_raw(ctx, key, ValueKind::Set, None, expire_at_ms);
        }
        if t.rest_bytes() + s.body_bytes() >= paged::DEMOTE_BYTES {
            let enc = s.encoding_byte();
            return store_paged(
                ctx,
                key,
                ValueKind::Set,
                enc,
                s.members(),
                Some(t),
                expire_at_ms,
            );
        }
        // Small enough for one record again: the members not read join those read.
        let (db, shard) = (ctx.db, ctx.shards.for_key(key));
        let mut all = paged::load_rest(shard, db, key, t, false).map_err(storage_error)?;
        all.extend_from_slice(s.members());
        all.sort_by_cached_key(|m| (paged::position(m), m.clone()));
        let whole = SetValue::from_paged(all, paged::Tree::default());
        return store_raw(ctx, key, ValueKind::Set, Some(whole.encode()), expire_at_ms);
    }
    let hashtable = s.encoding() == SetEncoding::Hashtable;
    if !s.is_empty() && stays_paged(s.paged_tree(), hashtable, s.body_bytes()) {
        let (kind, enc) = (ValueKind::Set, s.encoding_byte());
        return store_paged(
            ctx,
            key,
            kind,
            enc,
            s.members(),
            s.paged_tree(),
            expire_at_ms,
        );
    }
    let bytes = (!s.is_empty()).then(|| s.encode());
    store_raw(ctx, key, ValueKind::Set, bytes, expire_at_ms)
}

/// Loads a sorted set whole (`None` for a missing or expired key; WRONGTYPE for another
/// kind): a paged sorted set is read leaf by leaf into a value that remembers it was paged
/// (`store_zset` keeps it paged above the demotion threshold).
pub fn load_zset(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Loaded<ZSetValue>>, String> {
    let Some(l) = load_zset_handle(ctx, key)? else {
        return Ok(None);
    };
    let value = match l.value {
        ZHandle::Whole(v) => v,
        ZHandle::Paged(mut p) => {
            ZSetValue::from_paged(p.pairs(ctx.shards.for_key(key)).map_err(storage_error)?)
        }
    };
    Ok(Some(Loaded {
        value,
        expire_at_ms: l.expire_at_ms,
    }))
}

/// Loads the sorted set at `key` for a command that touches only some of its pairs: a paged
/// sorted set comes back with only its root read, its pages read on demand
/// (`docs/collections.md` section 4b).
pub fn load_zset_handle(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Loaded<ZHandle>>, String> {
    let Some(Loaded {
        value: raw,
        expire_at_ms,
    }) = load_coll(ctx, key, ValueKind::ZSet)?
    else {
        return Ok(None);
    };
    let value = match raw {
        Raw::Whole(bytes) => ZHandle::Whole(
            ZSetValue::decode(&bytes)
                .map_err(|e| storage_error(StorageError::Corrupt(e.to_string())))?,
        ),
        Raw::Paged(root) => {
            let root = paged::Root::decode(&root).map_err(storage_error)?;
            ZHandle::Paged(PagedZSet::open(ctx.db, key, &root).map_err(storage_error)?)
        }
    };
    Ok(Some(Loaded {
        value,
        expire_at_ms,
    }))
}

/// Writes a sorted set handle back: a paged one writes its changed pages and root, or goes
/// back to one record under `DEMOTE_BYTES` (reading the rest of its pages); an empty one
/// deletes the key.
pub fn store_zset_handle(
    ctx: &mut Ctx,
    key: &[u8],
    z: ZHandle,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    match z {
        ZHandle::Whole(v) => store_zset(ctx, key, &v, expire_at_ms),
        ZHandle::Paged(p) if p.is_empty() => store_raw(ctx, key, ValueKind::ZSet, None, None),
        ZHandle::Paged(mut p) if p.member_bytes() < paged::DEMOTE_BYTES => {
            let pairs = p.pairs(ctx.shards.for_key(key)).map_err(storage_error)?;
            let mut v = ZSetValue::from_paged(pairs);
            v.forget_paged_origin();
            store_zset(ctx, key, &v, expire_at_ms)
        }
        ZHandle::Paged(p) => {
            let now = ctx.now_ms;
            p.store(ctx.shards.for_key(key), expire_at_ms, now)
                .map_err(storage_error)
        }
    }
}

/// Loads the list at `key` whole (WRONGTYPE for another kind, `None` when missing or
/// expired): a paged list is read leaf by leaf into a quicklist value that remembers it was
/// paged (`store_list` keeps it paged above the demotion threshold).
pub fn load_list(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Loaded<ListValue>>, String> {
    let Some(l) = load_list_handle(ctx, key)? else {
        return Ok(None);
    };
    let value = match l.value {
        ListHandle::Whole(v) => v,
        ListHandle::Paged(mut p) => p.to_value(ctx.shards.for_key(key)).map_err(storage_error)?,
    };
    Ok(Some(Loaded {
        value,
        expire_at_ms: l.expire_at_ms,
    }))
}

/// Loads the list at `key` for a command that touches only some of its elements: a paged
/// list comes back with its root and directory pages read, its leaves read on demand.
pub fn load_list_handle(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Loaded<ListHandle>>, String> {
    if COALESCING.get() {
        let db = ctx.db;
        let shard = ctx.shards.for_key(key);
        if let Some(p) = shard.coalesced.take(db, key) {
            // `coalesce_begin` checked that this state serves the command without a read.
            shard.counters.coalesced_commands += 1;
            FROM_OVERLAY.set(true);
            return Ok(Some(Loaded {
                value: ListHandle::Paged(p),
                expire_at_ms: None,
            }));
        }
    }
    let Some(Loaded {
        value: raw,
        expire_at_ms,
    }) = load_coll(ctx, key, ValueKind::List)?
    else {
        return Ok(None);
    };
    let value = match raw {
        Raw::Whole(bytes) => ListHandle::Whole(
            ListValue::decode(&bytes)
                .map_err(|e| storage_error(StorageError::Corrupt(e.to_string())))?,
        ),
        Raw::Paged(root) => {
            let db = ctx.db;
            let root = paged::Root::decode(&root).map_err(storage_error)?;
            ListHandle::Paged(PagedList::open(db, key, &root).map_err(storage_error)?)
        }
    };
    Ok(Some(Loaded {
        value,
        expire_at_ms,
    }))
}

/// LLEN: a paged list's length is in its root (no page read).
pub fn list_len(ctx: &mut Ctx, key: &[u8]) -> Result<usize, String> {
    match load_coll(ctx, key, ValueKind::List)? {
        None => Ok(0),
        Some(Loaded {
            value: Raw::Whole(bytes),
            ..
        }) => Ok(ListValue::decode(&bytes)
            .map_err(|e| storage_error(StorageError::Corrupt(e.to_string())))?
            .len()),
        Some(Loaded {
            value: Raw::Paged(root),
            ..
        }) => Ok(paged::Root::decode(&root).map_err(storage_error)?.count as usize),
    }
}

/// The reading half of storing a list handle: runs Redis's shrinking check when the
/// command is a shrinking one, and turns a paged list due for demotion (under
/// `DEMOTE_BYTES` of leaves, or a single leaf left) into its one-record value, reading its
/// leaves. Multi-key commands call this for every key before writing any.
pub fn settle_list(
    ctx: &mut Ctx,
    key: &[u8],
    l: &mut ListHandle,
    shrinking: bool,
) -> Result<(), String> {
    if let ListHandle::Paged(p) = l {
        if !p.is_empty() && (p.leaf_count() <= 1 || p.payload_bytes() < paged::DEMOTE_BYTES) {
            let mut v = p.to_value(ctx.shards.for_key(key)).map_err(storage_error)?;
            v.forget_paged_origin();
            *l = ListHandle::Whole(v);
        }
    }
    if shrinking {
        l.after_shrink();
    }
    Ok(())
}

/// The writing half: a paged list writes its changed pages and root; a one-record value
/// goes through `store_list`; an empty list deletes the key.
pub fn write_list(
    ctx: &mut Ctx,
    key: &[u8],
    l: ListHandle,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    match l {
        ListHandle::Whole(v) => store_list(ctx, key, &v, expire_at_ms),
        ListHandle::Paged(p) if p.is_empty() => store_raw(ctx, key, ValueKind::List, None, None),
        ListHandle::Paged(p) => {
            let now = ctx.now_ms;
            p.store(ctx.shards.for_key(key), expire_at_ms, now)
                .map_err(storage_error)
        }
    }
}

/// `settle_list` then `write_list`, for single-key commands.
pub fn store_list_handle(
    ctx: &mut Ctx,
    key: &[u8],
    mut l: ListHandle,
    expire_at_ms: Option<u64>,
    shrinking: bool,
) -> Result<(), String> {
    settle_list(ctx, key, &mut l, shrinking)?;
    let l = match l {
        ListHandle::Paged(p)
            if COALESCING.get()
                && expire_at_ms.is_none()
                && !p.is_empty()
                && !crate::storage::prefetch::run_missed()
                && (FROM_OVERLAY.get() || p.store_reads_in_memory(None)) =>
        {
            // Kept for the batch's next push/pop on this key; stored when the batch ends.
            let mut p = p;
            let shard = ctx.shards.for_key(key);
            p.remember_root(shard).map_err(storage_error)?;
            match shard.coalesced.put(p) {
                Ok(()) => return Ok(()),
                Err(p) => ListHandle::Paged(p),
            }
        }
        l => l,
    };
    write_list(ctx, key, l, expire_at_ms)
}

// ---- coalescing pushes and pops within a batch (docs/collections.md section 5a) ------

thread_local! {
    /// Set by `coalesce_begin` for the handler of a coalescable command.
    static COALESCING: Cell<bool> = const { Cell::new(false) };
    /// The running handler took its list from the overlay (`load_list_handle`): its
    /// changes since the key's root exist only there, so they go back there even when
    /// the store would read (a restart would lose them).
    static FROM_OVERLAY: Cell<bool> = const { Cell::new(false) };
}

/// `--coalesce-lists` (default yes): whether pushes and pops may coalesce at all.
static COALESCING_ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets `--coalesce-lists` (at start).
pub fn set_coalescing(enabled: bool) {
    COALESCING_ENABLED.store(enabled, std::sync::atomic::Ordering::Relaxed);
}

/// The end and pop count of a command that may use the batch overlay: a single-key push
/// (LPUSH RPUSH LPUSHX RPUSHX, pops 0) or pop (LPOP RPOP, COUNT > 0); `None` otherwise.
fn coalescable(name: &str, args: &[&[u8]]) -> Option<(End, usize)> {
    let pops = || match args.len() {
        2 => Some(1),
        3 => crate::resp::parse::parse_i64(args[2])
            .filter(|&n| n > 0)
            .map(|n| n as usize),
        _ => None,
    };
    match name {
        "lpush" | "lpushx" if args.len() >= 3 => Some((End::Head, 0)),
        "rpush" | "rpushx" if args.len() >= 3 => Some((End::Tail, 0)),
        "lpop" => Some((End::Head, pops()?)),
        "rpop" => Some((End::Tail, pops()?)),
        _ => None,
    }
}

/// Called by the worker before every keyed command's handler, outside any restartable
/// run (so the stores below may read synchronously). A coalescable command (`allowed`:
/// no write scope, no coordinated pass, no client tracking) on a list whose coalesced
/// state serves it without a read runs on that state; its coalesced list is stored
/// first when it would not. Any other command stores every coalesced list of the held
/// shards first, so it sees (and DUMP, RENAME, defrag, the checkpoint... see) the latest
/// state. Returns whether the handler coalesces (`coalesce_end` after it).
pub fn coalesce_begin(
    shards: &mut super::ShardSet,
    name: &str,
    args: &[&[u8]],
    db: u8,
    now_ms: u64,
    allowed: bool,
) -> Result<bool, StorageError> {
    let enabled = COALESCING_ENABLED.load(std::sync::atomic::Ordering::Relaxed);
    let Some((end, pops)) = coalescable(name, args).filter(|_| allowed && enabled) else {
        store_all_coalesced(shards, now_ms)?;
        return Ok(false);
    };
    let shard = shards.for_key(args[1]);
    if let Some(p) = shard.coalesced.take(db, args[1]) {
        if p.serves_in_memory(end, pops) {
            let _ = shard.coalesced.put(p);
        } else {
            p.store(shard, None, now_ms)?;
        }
    }
    COALESCING.set(true);
    FROM_OVERLAY.set(false);
    Ok(true)
}

/// Ends what `coalesce_begin` began (idempotent).
pub fn coalesce_end() {
    COALESCING.set(false);
    FROM_OVERLAY.set(false);
}

/// Stores every coalesced list of the held shards (the batch's end, before a shard is
/// lent, before any command that is not a coalescing push/pop).
pub fn store_all_coalesced(shards: &mut super::ShardSet, now_ms: u64) -> Result<(), StorageError> {
    let mut first_err = None;
    for shard in shards.held() {
        if !shard.coalesced.is_empty() {
            if let Err(e) = paged_list::store_coalesced(shard, now_ms) {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Writes `z` under `key` (deleting the key when `z` is empty). A skiplist whose members
/// pass `PROMOTE_BYTES` is written paged (`docs/collections.md` section 4b), and one read
/// from pages stays paged down to `DEMOTE_BYTES` (rewritten whole as a new tree: the
/// commands that load a sorted set whole).
pub fn store_zset(
    ctx: &mut Ctx,
    key: &[u8],
    z: &ZSetValue,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    let big = if z.paged_origin() {
        z.member_bytes() >= paged::DEMOTE_BYTES
    } else {
        z.member_bytes() > paged::PROMOTE_BYTES
    };
    if !z.is_empty() && z.encoding() == ZSetEncoding::Skiplist && big {
        let (db, now) = (ctx.db, ctx.now_ms);
        return paged_zset::build(
            ctx.shards.for_key(key),
            db,
            key,
            z.pairs(),
            expire_at_ms,
            now,
        )
        .map_err(storage_error);
    }
    let bytes = (!z.is_empty()).then(|| z.encode());
    store_raw(ctx, key, ValueKind::ZSet, bytes, expire_at_ms)
}

/// Writes `l` under `key` (deleting the key when `l` is empty, as Redis does). A quicklist
/// of two or more nodes is written paged (`docs/collections.md` section 4a) above
/// `PROMOTE_BYTES`, and stays paged (when loaded paged) down to `DEMOTE_BYTES`.
pub fn store_list(
    ctx: &mut Ctx,
    key: &[u8],
    l: &ListValue,
    expire_at_ms: Option<u64>,
) -> Result<(), String> {
    let big = if l.paged_origin() {
        l.listpack_bytes() >= paged::DEMOTE_BYTES
    } else {
        l.listpack_bytes() > paged::PROMOTE_BYTES
    };
    if !l.is_empty() && l.encoding() == ListEncoding::Quicklist && l.node_count() >= 2 && big {
        let (db, now) = (ctx.db, ctx.now_ms);
        let nodes = l.node_elements();
        return paged_list::build(ctx.shards.for_key(key), db, key, &nodes, expire_at_ms, now)
            .map_err(storage_error);
    }
    let bytes = (!l.is_empty()).then(|| l.encode());
    store_raw(ctx, key, ValueKind::List, bytes, expire_at_ms)
}

// ---- randomness -------------------------------------------------------------------------

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos | 1
}

/// Uniform in `0..n` (n > 0), from a per-thread xorshift64*: random replies need no
/// cryptographic quality, only independence from the data.
pub fn random_below(n: usize) -> usize {
    debug_assert!(n > 0);
    RNG.with(|c| {
        let mut x = c.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
    })
}

/// `count` distinct indexes below `n` (count <= n), in random order (partial Fisher-Yates
/// when `count` is a large share of `n`, rejection sampling otherwise).
pub fn distinct_indexes(n: usize, count: usize) -> Vec<usize> {
    debug_assert!(count <= n);
    if count * 4 >= n {
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..count {
            let j = i + random_below(n - i);
            all.swap(i, j);
        }
        all.truncate(count);
        return all;
    }
    let mut seen = std::collections::HashSet::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let i = random_below(n);
        if seen.insert(i) {
            out.push(i);
        }
    }
    out
}

/// The COUNT of SRANDMEMBER/HRANDFIELD: Redis accepts `-LONG_MAX..=LONG_MAX`.
pub fn parse_rand_count(a: &[u8]) -> Result<i64, String> {
    match crate::resp::parse::parse_i64(a) {
        Some(i64::MIN) => Err(
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807"
                .into(),
        ),
        Some(v) => Ok(v),
        None => Err(super::ERR_NOT_INT.into()),
    }
}

// ---- HSCAN / SSCAN ----------------------------------------------------------------------

/// Parses a SCAN-family cursor as Redis's `parseScanCursorOrReply` (decimal u64).
pub fn parse_cursor(a: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(a)
        .ok()
        .filter(|s| !s.starts_with(|c: char| c.is_ascii_whitespace()))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "ERR invalid cursor".into())
}

pub struct ScanOpts<'a> {
    pub pattern: Option<&'a [u8]>,
    pub count: usize,
}

/// MATCH and COUNT after the cursor (`a[3..]`); TYPE is SCAN's only.
pub fn parse_scan_opts<'a>(a: &[&'a [u8]]) -> Result<ScanOpts<'a>, String> {
    let mut o = ScanOpts {
        pattern: None,
        count: 10,
    };
    let mut i = 3;
    while i < a.len() {
        if i + 1 >= a.len() {
            return Err(ERR_SYNTAX.into());
        }
        if eq_ic(a[i], "count") {
            let n = parse_int(a[i + 1])?;
            if n < 1 {
                return Err(ERR_SYNTAX.into());
            }
            o.count = n as usize;
        } else if eq_ic(a[i], "match") {
            // As Redis's scan: the pattern `*` means no filter (the matcher alone would
            // not match an empty member).
            o.pattern = Some(a[i + 1]).filter(|p| *p != b"*");
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 2;
    }
    Ok(o)
}

/// Where an element sits in the hashtable scan order: a fixed hash of its bytes, never 0
/// (0 is the cursor that starts and ends an iteration) and below 2^63.
fn scan_position(element: &[u8]) -> u64 {
    paged::position(element)
}

/// One step of a hashtable-encoded collection's cursor iteration over `elements`: the
/// indexes of the elements whose scan position is at least `cursor`, at least `count` of
/// them unless the iteration ends (ties at the last position are all included), and the
/// next cursor (0 when done).
///
/// Positions depend only on an element's bytes, so an element present for the whole
/// iteration is returned exactly once whatever is added or removed meanwhile — Redis's
/// guarantee (at least once) and stronger.
pub fn scan_step<'e>(
    elements: impl Iterator<Item = &'e [u8]>,
    cursor: u64,
    count: usize,
) -> (Vec<usize>, u64) {
    let mut order: Vec<(u64, usize)> = elements
        .enumerate()
        .map(|(i, e)| (scan_position(e), i))
        .filter(|&(p, _)| p >= cursor)
        .collect();
    order.sort_unstable();
    let mut take = count.min(order.len());
    while take < order.len() && take > 0 && order[take].0 == order[take - 1].0 {
        take += 1;
    }
    let next = order.get(take).map_or(0, |&(p, _)| p);
    (order[..take].iter().map(|&(_, i)| i).collect(), next)
}

/// The reply of HSCAN/SSCAN: `[cursor, [elements...]]`.
pub fn scan_reply(r: &mut ReplyBuf, cursor: u64, items: &[&[u8]]) {
    r.array(2);
    r.bulk(cursor.to_string().as_bytes());
    r.array(items.len());
    for i in items {
        r.bulk(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A full cursor walk returns every element once, and an element present throughout
    // is still returned once when others are removed and added between steps.
    #[test]
    fn scan_walk_survives_changes() {
        let mut elems: Vec<Vec<u8>> = (0..500).map(|i| format!("e{i}").into_bytes()).collect();
        let mut seen = std::collections::HashMap::<Vec<u8>, u32>::new();
        let mut cursor = 0;
        let mut round = 0;
        loop {
            let (idx, next) = scan_step(elems.iter().map(|e| e.as_slice()), cursor, 7);
            for i in idx {
                *seen.entry(elems[i].clone()).or_default() += 1;
            }
            // Churn: drop one of the volatile elements, add a new one.
            elems.retain(|e| e != format!("e{}", 400 + round).as_bytes());
            elems.push(format!("new{round}").into_bytes());
            round += 1;
            if next == 0 {
                break;
            }
            cursor = next;
        }
        for i in 0..400 {
            assert_eq!(seen.get(format!("e{i}").as_bytes()), Some(&1), "e{i}");
        }
        assert!(seen.values().all(|&n| n == 1));
    }

    // Distinct indexes are distinct, in range, and as many as asked, on both strategies.
    #[test]
    fn distinct() {
        for (n, c) in [(10, 10), (10, 3), (1000, 5), (1, 1), (5, 0)] {
            let v = distinct_indexes(n, c);
            assert_eq!(v.len(), c);
            let s: std::collections::HashSet<_> = v.iter().collect();
            assert_eq!(s.len(), c);
            assert!(v.iter().all(|&i| i < n));
        }
    }
}
