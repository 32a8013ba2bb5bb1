//! SORT and SORT_RO (Redis 7.2 semantics, replies and error texts) over lists, sets and
//! sorted sets: BY, GET (with `->field` for hashes), LIMIT, ALPHA, ASC/DESC, STORE.
//!
//! BY and GET patterns name keys that are formed from the elements, which the command
//! table cannot declare. lavik applies Redis Cluster's rule (Redis 7.4.2's `sortCommand`
//! in cluster mode) everywhere: a BY pattern containing `*` and every GET pattern but `#`
//! must hash to the slot of the sorted key — in practice, carry a hash tag `{...}` before
//! any wildcard whose content hashes there — or the command is refused with Redis's
//! "... denied in Cluster mode when keys formed by the pattern may be in different
//! slots." Every key such a pattern forms then lies in the sorted key's slot, so on the
//! shard the router already holds. Those keys are not prefetched by the asynchronous read
//! path (it knows only declared keys): one that is not in memory is read synchronously,
//! blocking the worker, and counted in `lavik_sync_reads`.
//!
//! A set sorted with `BY <no *>` is sorted by its members (ALPHA), as Redis does for
//! STORE and scripts; outside those Redis returns the set's own iteration order, which is
//! unspecified, so the sorted order is one of the orders Redis may give.
//!
//! All reads (the sorted key, BY and GET keys) come before the one write (STORE).

use super::{eq_ic, parse_int, storage_error, CmdResult, Ctx, ERR_SYNTAX, ERR_WRONGTYPE};
use crate::resp::ReplyBuf;
use crate::runtime::events;
use crate::storage::collection::{HashValue, SetValue};
use crate::storage::list_codec::ListValue;
use crate::storage::zset::ZSetValue;
use crate::storage::{key_slot, StorageError, ValueKind};
use std::cmp::Ordering;

const ERR_BY_CLUSTER: &str = "ERR BY option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.";
const ERR_GET_CLUSTER: &str = "ERR GET option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.";
const ERR_BY_ACL: &str = "ERR BY option of SORT denied due to insufficient ACL permissions.";
const ERR_GET_ACL: &str = "ERR GET option of SORT denied due to insufficient ACL permissions.";
const ERR_SCORE: &str = "ERR One or more scores can't be converted into double";

/// SORT's parsed options.
struct Options<'a> {
    desc: bool,
    alpha: bool,
    limit_start: i64,
    limit_count: i64,
    store: Option<&'a [u8]>,
    by: Option<&'a [u8]>,
    /// `BY` without `*` seen (sticky, as in Redis: a later real pattern does not undo it).
    dontsort: bool,
    gets: Vec<&'a [u8]>,
}

/// Redis Cluster's slot of every key a glob-style pattern can match, if there is one
/// (Redis's `patternHashSlot`): a wildcard or escape before a non-empty `{tag}` closes
/// means "any slot".
pub fn pattern_slot(p: &[u8]) -> Option<u16> {
    let mut open: Option<usize> = None;
    let mut empty_tag = false;
    for (i, &c) in p.iter().enumerate() {
        match c {
            b'*' | b'?' | b'[' | b'\\' => return None,
            b'{' if open.is_none() && !empty_tag => open = Some(i),
            b'}' if !empty_tag => {
                if let Some(o) = open {
                    if i == o + 1 {
                        empty_tag = true;
                    } else {
                        // The tag holds no '}', so `key_slot` hashes all of it.
                        return Some(key_slot(&p[o + 1..i]));
                    }
                }
            }
            _ => {}
        }
    }
    // No wildcard and no usable tag: the pattern is a single key.
    Some(key_slot(p))
}

/// `full_key_access`: the user may read every key (else a BY pattern with `*` or any GET
/// is refused, in its place among the options, as Redis does).
fn parse<'a>(a: &[&'a [u8]], readonly: bool, full_key_access: bool) -> Result<Options<'a>, String> {
    let mut o = Options {
        desc: false,
        alpha: false,
        limit_start: 0,
        limit_count: -1,
        store: None,
        by: None,
        dontsort: false,
        gets: Vec::new(),
    };
    let slot = key_slot(a[1]);
    let mut j = 2;
    while j < a.len() {
        let left = a.len() - j - 1;
        let w = a[j];
        if eq_ic(w, "asc") {
            o.desc = false;
        } else if eq_ic(w, "desc") {
            o.desc = true;
        } else if eq_ic(w, "alpha") {
            o.alpha = true;
        } else if eq_ic(w, "limit") && left >= 2 {
            o.limit_start = parse_int(a[j + 1])?;
            o.limit_count = parse_int(a[j + 2])?;
            j += 2;
        } else if !readonly && eq_ic(w, "store") && left >= 1 {
            o.store = Some(a[j + 1]);
            j += 1;
        } else if eq_ic(w, "by") && left >= 1 {
            let p = a[j + 1];
            o.by = Some(p);
            if !p.contains(&b'*') {
                o.dontsort = true;
            } else if pattern_slot(p) != Some(slot) {
                return Err(ERR_BY_CLUSTER.into());
            } else if !full_key_access {
                return Err(ERR_BY_ACL.into());
            }
            j += 1;
        } else if eq_ic(w, "get") && left >= 1 {
            let p = a[j + 1];
            if p != b"#" && pattern_slot(p) != Some(slot) {
                return Err(ERR_GET_CLUSTER.into());
            }
            if !full_key_access {
                return Err(ERR_GET_ACL.into());
            }
            o.gets.push(p);
            j += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        j += 1;
    }
    Ok(o)
}

/// For the ACL gate, when the user may not read every key: the error SORT/SORT_RO `args`
/// get for using BY or GET, if that is the first error their options meet.
pub fn acl_refusal(args: &[&[u8]]) -> Option<String> {
    if args.len() < 2 {
        return None;
    }
    let readonly = eq_ic(args[0], "sort_ro");
    match parse(args, readonly, false) {
        Err(e) if e == ERR_BY_ACL || e == ERR_GET_ACL => Some(e),
        _ => None,
    }
}

/// The position of SORT's STORE destination in `args` (the last STORE wins, as in Redis's
/// `sortGetKeys`), for the router: LIMIT takes two arguments, BY, GET and STORE one.
pub fn store_position(args: &[&[u8]]) -> Option<usize> {
    let mut found = None;
    let mut j = 2;
    while j < args.len() {
        let left = args.len() - j - 1;
        let w = args[j];
        if eq_ic(w, "limit") && left >= 2 {
            j += 2;
        } else if (eq_ic(w, "get") || eq_ic(w, "by")) && left >= 1 {
            j += 1;
        } else if eq_ic(w, "store") && left >= 1 {
            found = Some(j + 1);
            j += 1;
        }
        j += 1;
    }
    found
}

/// What the sorted key holds: its kind and its elements in their own order (a list's,
/// a set's members, a sorted set's by score). A missing key is an empty list.
fn load_elements(ctx: &mut Ctx, key: &[u8]) -> Result<(ValueKind, Vec<Vec<u8>>), String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    let corrupt = |e: String| storage_error(StorageError::Corrupt(e));
    let v = ctx
        .shards
        .for_key(key)
        .get(db, key, now)
        .map_err(storage_error)?;
    crate::runtime::lookups::read_now(db, key, v.is_some()); // INFO keyspace_hits/misses
    let Some(v) = v else {
        return Ok((ValueKind::List, Vec::new()));
    };
    let elements = match v.kind {
        ValueKind::List => ListValue::decode(&v.bytes)
            .map_err(|e| corrupt(e.to_string()))?
            .iter()
            .map(<[u8]>::to_vec)
            .collect(),
        ValueKind::Set => SetValue::decode(&v.bytes)
            .map_err(|e| corrupt(e.to_string()))?
            .members()
            .to_vec(),
        ValueKind::ZSet => ZSetValue::decode(&v.bytes)
            .map_err(|e| corrupt(e.to_string()))?
            .pairs()
            .iter()
            .map(|(_, m)| m.clone())
            .collect(),
        _ => return Err(ERR_WRONGTYPE.into()),
    };
    Ok((v.kind, elements))
}

/// Redis's `lookupKeyByPattern`: the value a BY/GET pattern names for `element` — the
/// element itself for `#`; `None` for a pattern without `*`, a missing key, a key of the
/// wrong kind (a string, or a hash when the pattern ends in `->field`) or a missing field.
fn lookup_by_pattern(
    ctx: &mut Ctx,
    pattern: &[u8],
    element: &[u8],
) -> Result<Option<Vec<u8>>, String> {
    if pattern == b"#" {
        return Ok(Some(element.to_vec()));
    }
    let Some(star) = pattern.iter().position(|&c| c == b'*') else {
        return Ok(None);
    };
    let after = &pattern[star + 1..];
    let (postfix, field) = match after.windows(2).position(|w| w == b"->") {
        Some(f) if f + 2 < after.len() => (&after[..f], Some(&after[f + 2..])),
        _ => (after, None),
    };
    let mut key = Vec::with_capacity(star + element.len() + postfix.len());
    key.extend_from_slice(&pattern[..star]);
    key.extend_from_slice(element);
    key.extend_from_slice(postfix);
    let (db, now) = (ctx.db, ctx.now_ms);
    // Same slot as the sorted key (the cluster rule in `parse`), so this shard is held.
    let v = ctx
        .shards
        .for_key(&key)
        .get(db, &key, now)
        .map_err(storage_error)?;
    crate::runtime::lookups::read_now(db, &key, v.is_some()); // INFO keyspace_hits/misses
    let Some(v) = v else {
        return Ok(None);
    };
    match (field, v.kind) {
        (None, ValueKind::String) => Ok(Some(v.bytes)),
        (Some(f), ValueKind::Hash) => {
            let h = HashValue::decode(&v.bytes)
                .map_err(|e| storage_error(StorageError::Corrupt(e.to_string())))?;
            Ok(h.get(f).map(<[u8]>::to_vec))
        }
        _ => Ok(None),
    }
}

/// C's `strtod` as SORT uses it: the whole text (to a NUL) must convert, no overflow or
/// underflow (`ERANGE`), no NaN. An empty text is 0 (strtod converts nothing and stops at
/// the end); a text of only spaces is not.
fn sort_score(v: &[u8]) -> Option<f64> {
    let v = &v[..v.iter().position(|&c| c == 0).unwrap_or(v.len())];
    if v.is_empty() {
        return Some(0.0);
    }
    let skip = v
        .iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
        .count();
    let t = &v[skip..];
    let (x, used) = crate::scripting::cjson::strtod(t)?;
    if used == 0 || used != t.len() || x.is_nan() {
        return None;
    }
    let named_inf = t.iter().any(|c| matches!(c, b'i' | b'I'));
    let nonzero_digit = t
        .iter()
        .take_while(|c| !matches!(c, b'e' | b'E'))
        .any(|c| (b'1'..=b'9').contains(c));
    if (x.is_infinite() && !named_inf) || (x == 0.0 && nonzero_digit) || x.is_subnormal() {
        return None;
    }
    Some(x)
}

/// One element of the vector SORT sorts, with what it is compared by.
struct Item {
    element: Vec<u8>,
    score: f64,
    /// ALPHA with BY: the BY value (`None` sorts first).
    cmp: Option<Vec<u8>>,
}

/// Redis's `sortCompare` (numeric ties fall back to the elements' bytes).
fn compare(a: &Item, b: &Item, alpha: bool, by: bool) -> Ordering {
    if !alpha {
        return a
            .score
            .partial_cmp(&b.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.element.cmp(&b.element));
    }
    if by {
        return a.cmp.cmp(&b.cmp);
    }
    a.element.cmp(&b.element)
}

/// Redis's LIMIT clamping: the inclusive range of output positions (empty when `end <
/// start`) over `len` sorted elements.
fn limit_range(start: i64, count: i64, len: usize) -> (i64, i64) {
    let n = len as i64;
    let start = start.max(0).min(n);
    let count = count.max(-1).min(n);
    let mut end = if count < 0 { n - 1 } else { start + count - 1 };
    if start >= n {
        return (n - 1, n - 2);
    }
    if end >= n {
        end = n - 1;
    }
    (start, end)
}

fn sort_generic(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, readonly: bool) -> CmdResult {
    // The ACL gate refuses BY/GET for users without full key access (`acl_refusal`).
    let mut o = parse(a, readonly, true)?;
    let (kind, elements) = load_elements(ctx, a[1])?;
    if o.dontsort && kind == ValueKind::Set {
        // See the module comment: a set has no order of its own to keep.
        o.dontsort = false;
        o.alpha = true;
        o.by = None;
    }
    let (start, end) = limit_range(o.limit_start, o.limit_count, elements.len());
    let mut items: Vec<Item> = elements
        .into_iter()
        .map(|element| Item {
            element,
            score: 0.0,
            cmp: None,
        })
        .collect();
    if o.dontsort {
        if o.desc {
            items.reverse();
        }
    } else {
        let mut bad_score = false;
        for it in items.iter_mut() {
            let by_value = match o.by {
                Some(p) => match lookup_by_pattern(ctx, p, &it.element)? {
                    Some(v) => v,
                    None => continue,
                },
                None => it.element.clone(),
            };
            if o.alpha {
                if o.by.is_some() {
                    it.cmp = Some(by_value);
                }
            } else {
                match sort_score(&by_value) {
                    Some(s) => it.score = s,
                    None => bad_score = true,
                }
            }
        }
        if bad_score {
            return Err(ERR_SCORE.into());
        }
        let (alpha, by, desc) = (o.alpha, o.by.is_some(), o.desc);
        items.sort_by(|x, y| {
            let c = compare(x, y, alpha, by);
            if desc {
                c.reverse()
            } else {
                c
            }
        });
    }
    let range = if end >= start {
        &items[start as usize..=end as usize]
    } else {
        &items[..0]
    };
    let mut output: Vec<Option<Vec<u8>>> = Vec::with_capacity(range.len() * o.gets.len().max(1));
    for it in range {
        if o.gets.is_empty() {
            output.push(Some(it.element.clone()));
        }
        for p in &o.gets {
            output.push(lookup_by_pattern(ctx, p, &it.element)?);
        }
    }
    match o.store {
        None => {
            r.array(output.len());
            for v in &output {
                match v {
                    Some(v) => r.bulk(v),
                    None => r.null(),
                }
            }
        }
        Some(dest) => store(ctx, dest, output, r)?,
    }
    Ok(())
}

/// STORE: the output as a list at `dest` (no expiry, replacing any value); an empty
/// output deletes `dest`. A missing GET value is stored as an empty string.
fn store(ctx: &mut Ctx, dest: &[u8], output: Vec<Option<Vec<u8>>>, r: &mut ReplyBuf) -> CmdResult {
    let (db, now) = (ctx.db, ctx.now_ms);
    let n = output.len();
    let shard = ctx.shards.for_key(dest);
    if n > 0 {
        let list = ListValue::from_tail_pushes(output.into_iter().map(Option::unwrap_or_default));
        shard
            .put(db, dest, ValueKind::List, &list.encode(), None, now)
            .map_err(storage_error)?;
        ctx.notify(events::LIST, "sortstore", dest);
    } else if shard.delete(db, dest, now).map_err(storage_error)? {
        ctx.notify(events::GENERIC, "del", dest);
    }
    r.int(n as i64);
    Ok(())
}

pub fn sort(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    sort_generic(ctx, a, r, false)
}

pub fn sort_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    sort_generic(ctx, a, r, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the pattern slot follows Redis's patternHashSlot: tags before wildcards count.
    #[test]
    fn pattern_slots() {
        assert_eq!(pattern_slot(b"{t}:w_*"), Some(key_slot(b"t")));
        assert_eq!(pattern_slot(b"{t}:*->f"), Some(key_slot(b"{t}x")));
        assert_eq!(pattern_slot(b"w_*"), None);
        assert_eq!(pattern_slot(b"*{t}"), None);
        assert_eq!(pattern_slot(b"{}{t}*"), None);
        assert_eq!(pattern_slot(b"a\\{t}*"), None);
        assert_eq!(pattern_slot(b"fixed"), Some(key_slot(b"fixed")));
        assert_eq!(pattern_slot(b"{a{b}*"), Some(key_slot(b"a{b")));
    }

    // Proves STORE's position is found past LIMIT/BY/GET arguments, the last STORE winning.
    #[test]
    fn store_positions() {
        let a: Vec<&[u8]> = vec![b"sort", b"k", b"get", b"store", b"limit", b"0", b"1"];
        assert_eq!(store_position(&a), None);
        let a: Vec<&[u8]> = vec![b"sort", b"k", b"store", b"d1", b"by", b"x", b"STORE", b"d2"];
        assert_eq!(store_position(&a), Some(7));
    }

    // Proves SORT's number parsing matches strtod's edge cases as Redis uses them.
    #[test]
    fn scores() {
        assert_eq!(sort_score(b""), Some(0.0));
        assert_eq!(sort_score(b" 1.5"), Some(1.5));
        assert_eq!(sort_score(b"  "), None);
        assert_eq!(sort_score(b"1 "), None);
        assert_eq!(sort_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(sort_score(b"nan"), None);
        assert_eq!(sort_score(b"1e400"), None);
        assert_eq!(sort_score(b"abc"), None);
        assert_eq!(sort_score(b"3e2"), Some(300.0));
    }

    // Proves the LIMIT clamping of Redis (negative start, huge count, start past the end).
    #[test]
    fn limits() {
        assert_eq!(limit_range(0, -1, 5), (0, 4));
        assert_eq!(limit_range(-3, 2, 5), (0, 1));
        assert_eq!(limit_range(3, 100, 5), (3, 4));
        assert_eq!(limit_range(5, 1, 5), (4, 3));
        assert_eq!(limit_range(0, 0, 5), (0, -1));
        assert_eq!(limit_range(0, -1, 0), (-1, -2));
    }
}
