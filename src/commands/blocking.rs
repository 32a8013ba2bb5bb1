//! Blocking list and sorted-set pops (Redis 7.2 semantics, replies and error texts):
//! BLPOP BRPOP BLMOVE BRPOPLPUSH BLMPOP BZPOPMIN BZPOPMAX BZMPOP.
//!
//! A handler here is the non-blocking attempt: it parses everything (the timeout with
//! Redis's `getTimeoutFromObjectOrReply` rules), tries its keys in argument order through
//! the list/zset seams (`list::pop_from`, `list::move_element`, `zset::pop_from_key`) and
//! replies as soon as one has data. When none has, it calls [`would_block`]:
//! - if the server set up a waiter for this run (a client's own command, not MULTI/EXEC,
//!   not a script, not a serve attempt), the request (keys, deadline) is recorded for the
//!   server to register while it still holds the keys' shards, and the handler writes
//!   nothing;
//! - otherwise the handler writes the timeout reply (nil), which is what Redis answers in
//!   MULTI and scripts, and the empty flag tells a serve attempt that nothing was there.
//!
//! The registry of blocked clients, serving and timeouts are `server::blocking`'s.

use super::list::{move_element, pop_from};
use super::zset::{format_score, pop_from_key, ScorePair};
use super::{eq_ic, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::encode::Proto;
use crate::resp::ReplyBuf;
use crate::storage::list_codec::End;
use std::cell::{Cell, RefCell};

const ERR_TIMEOUT_FLOAT: &str = "ERR timeout is not a float or out of range";
const ERR_TIMEOUT_NEGATIVE: &str = "ERR timeout is negative";
const ERR_TIMEOUT_RANGE: &str = "ERR timeout is out of range";

/// What a handler asks for when none of its keys has data.
#[derive(Debug, Clone)]
pub struct BlockRequest {
    /// The keys to wait on, in argument order (duplicates removed).
    pub keys: Vec<Vec<u8>>,
    /// Absolute deadline in ms; `None` waits forever (timeout 0).
    pub deadline_ms: Option<u64>,
}

thread_local! {
    static MAY_BLOCK: Cell<bool> = const { Cell::new(false) };
    static EMPTY: Cell<bool> = const { Cell::new(false) };
    static REQUEST: RefCell<Option<BlockRequest>> = const { RefCell::new(None) };
}

/// The server allows (or stops allowing) the next handler run on this thread to block.
pub fn set_may_block(on: bool) {
    MAY_BLOCK.with(|m| m.set(on));
    EMPTY.with(|e| e.set(false));
}

/// The request recorded by the last handler run, if it blocked.
pub fn take_request() -> Option<BlockRequest> {
    REQUEST.with(|r| r.borrow_mut().take())
}

/// True when the last handler run that could not block found no data.
pub fn take_empty() -> bool {
    EMPTY.with(|e| e.replace(false))
}

/// None of `keys` has data: true when the handler must write nothing (the server
/// registers the client), false when it must reply its timeout answer now.
fn would_block(keys: &[&[u8]], deadline_ms: Option<u64>) -> bool {
    if !MAY_BLOCK.with(|m| m.replace(false)) {
        EMPTY.with(|e| e.set(true));
        return false;
    }
    let mut uniq: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
    for k in keys {
        if !uniq.iter().any(|u| u.as_slice() == *k) {
            uniq.push(k.to_vec());
        }
    }
    REQUEST.with(|r| {
        *r.borrow_mut() = Some(BlockRequest {
            keys: uniq,
            deadline_ms,
        })
    });
    true
}

/// Redis's `getTimeoutFromObjectOrReply` in seconds: a long double, times 1000, rounded
/// up; negative is an error, 0 is forever. Returns the absolute deadline (`None`: forever).
pub fn parse_timeout(a: &[u8], now_ms: u64) -> Result<Option<u64>, String> {
    let s = std::str::from_utf8(a).map_err(|_| ERR_TIMEOUT_FLOAT.to_string())?;
    // strtold: no leading space, the whole text, no NaN; "inf" parses and is out of range.
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_whitespace()) {
        return Err(ERR_TIMEOUT_FLOAT.into());
    }
    let v: f64 = parse_c_double(s).ok_or(ERR_TIMEOUT_FLOAT)?;
    if v.is_nan() {
        return Err(ERR_TIMEOUT_FLOAT.into());
    }
    let ms = v * 1000.0;
    if ms > i64::MAX as f64 {
        return Err(ERR_TIMEOUT_RANGE.into());
    }
    let ms = ms.ceil();
    if ms < 0.0 {
        return Err(ERR_TIMEOUT_NEGATIVE.into());
    }
    let ms = ms as u64;
    if ms == 0 {
        return Ok(None);
    }
    if ms > i64::MAX as u64 - now_ms {
        return Err(ERR_TIMEOUT_RANGE.into());
    }
    Ok(Some(now_ms + ms))
}

/// `strtod`'s accepted forms that Rust's parser spells differently (hex floats are not
/// accepted here; Redis clients do not send them as timeouts).
fn parse_c_double(s: &str) -> Option<f64> {
    let lower = s.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if matches!(body, "inf" | "infinity") {
        return Some(if lower.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    if body.starts_with("nan") || body.starts_with("0x") {
        return None;
    }
    s.parse::<f64>().ok()
}

fn reply_score(r: &mut ReplyBuf, v: f64) {
    let s = format_score(v);
    match r.proto {
        Proto::Resp2 => r.bulk(s.as_bytes()),
        Proto::Resp3 => {
            r.out.push(b',');
            r.out.extend_from_slice(s.as_bytes());
            r.out.extend_from_slice(b"\r\n");
        }
    }
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

/// BLPOP / BRPOP key [key ...] timeout: [key, element].
fn bpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, end: End) -> CmdResult {
    let deadline = parse_timeout(a[a.len() - 1], ctx.now_ms)?;
    let keys = &a[1..a.len() - 1];
    for key in keys {
        if let Some(items) = pop_from(ctx, key, end, 1)? {
            r.array(2);
            r.bulk(key);
            r.bulk(&items[0]);
            return Ok(());
        }
    }
    if !would_block(keys, deadline) {
        r.null_array();
    }
    Ok(())
}

pub fn blpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bpop(ctx, a, r, End::Head)
}

pub fn brpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bpop(ctx, a, r, End::Tail)
}

fn bmove(
    ctx: &mut Ctx,
    src: &[u8],
    dst: &[u8],
    from: End,
    to: End,
    t: &[u8],
    r: &mut ReplyBuf,
) -> CmdResult {
    let deadline = parse_timeout(t, ctx.now_ms)?;
    match move_element(ctx, src, dst, from, to)? {
        Some(e) => r.bulk(&e),
        None => {
            if !would_block(&[src], deadline) {
                r.null();
            }
        }
    }
    Ok(())
}

/// BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout.
pub fn blmove(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (from, to) = (parse_end(a[3])?, parse_end(a[4])?);
    bmove(ctx, a[1], a[2], from, to, a[5], r)
}

/// BRPOPLPUSH source destination timeout.
pub fn brpoplpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bmove(ctx, a[1], a[2], End::Tail, End::Head, a[3], r)
}

/// Parses `numkeys key... <where> [COUNT n]` starting at `a[at]` (numkeys), as LMPOP and
/// ZMPOP do; returns (keys range end, where index, count).
fn parse_mpop(a: &[&[u8]], at: usize) -> Result<(usize, usize), String> {
    let numkeys = crate::resp::parse::parse_i64(a[at])
        .filter(|&n| n >= 1)
        .ok_or("ERR numkeys should be greater than 0")?;
    let where_at = usize::try_from(numkeys)
        .ok()
        .and_then(|n| n.checked_add(at + 1))
        .filter(|&w| w < a.len())
        .ok_or(ERR_SYNTAX)?;
    let mut count = None;
    let mut j = where_at + 1;
    while j < a.len() {
        if count.is_none() && eq_ic(a[j], "count") && j + 1 < a.len() {
            j += 1;
            count = Some(
                crate::resp::parse::parse_i64(a[j])
                    .filter(|&n| n >= 1)
                    .ok_or("ERR count should be greater than 0")?,
            );
        } else {
            return Err(ERR_SYNTAX.into());
        }
        j += 1;
    }
    let count = usize::try_from(count.unwrap_or(1)).unwrap_or(usize::MAX);
    Ok((where_at, count))
}

/// BLMPOP timeout numkeys key [key ...] LEFT|RIGHT [COUNT count]: [key, [elements]].
pub fn blmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let deadline = parse_timeout(a[1], ctx.now_ms)?;
    let (where_at, count) = parse_mpop(a, 2)?;
    let end = parse_end(a[where_at])?;
    let keys = &a[3..where_at];
    for key in keys {
        if let Some(items) = pop_from(ctx, key, end, count)? {
            r.array(2);
            r.bulk(key);
            r.array(items.len());
            for e in &items {
                r.bulk(e);
            }
            return Ok(());
        }
    }
    if !would_block(keys, deadline) {
        r.null_array();
    }
    Ok(())
}

fn first_pairs(
    ctx: &mut Ctx,
    keys: &[&[u8]],
    max: bool,
    count: usize,
) -> Result<Option<(usize, Vec<ScorePair>)>, String> {
    for (i, key) in keys.iter().enumerate() {
        if let Some(popped) = pop_from_key(ctx, key, max, count)? {
            if !popped.is_empty() {
                return Ok(Some((i, popped)));
            }
        }
    }
    Ok(None)
}

/// BZPOPMIN / BZPOPMAX key [key ...] timeout: [key, member, score].
fn bzpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, max: bool) -> CmdResult {
    let deadline = parse_timeout(a[a.len() - 1], ctx.now_ms)?;
    let keys = &a[1..a.len() - 1];
    if let Some((i, popped)) = first_pairs(ctx, keys, max, 1)? {
        let (score, member) = &popped[0];
        r.array(3);
        r.bulk(keys[i]);
        r.bulk(member);
        reply_score(r, *score);
        return Ok(());
    }
    if !would_block(keys, deadline) {
        r.null_array();
    }
    Ok(())
}

pub fn bzpopmin(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bzpop(ctx, a, r, false)
}

pub fn bzpopmax(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    bzpop(ctx, a, r, true)
}

/// BZMPOP timeout numkeys key [key ...] MIN|MAX [COUNT count]: [key, [[member, score]...]].
pub fn bzmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let deadline = parse_timeout(a[1], ctx.now_ms)?;
    let (where_at, count) = parse_mpop(a, 2)?;
    let max = if eq_ic(a[where_at], "min") {
        false
    } else if eq_ic(a[where_at], "max") {
        true
    } else {
        return Err(ERR_SYNTAX.into());
    };
    let keys = &a[3..where_at];
    if let Some((i, popped)) = first_pairs(ctx, keys, max, count)? {
        r.array(2);
        r.bulk(keys[i]);
        r.array(popped.len());
        for (s, m) in &popped {
            r.array(2);
            r.bulk(m);
            reply_score(r, *s);
        }
        return Ok(());
    }
    if !would_block(keys, deadline) {
        r.null_array();
    }
    Ok(())
}

/// The arguments of `args` (a blocking command) narrowed to the one ready `key`, for a
/// serve attempt: its reply then names that key whatever the other keys hold.
pub fn narrow_to_key(args: &[Vec<u8>], key: &[u8]) -> Vec<Vec<u8>> {
    let name = args[0].to_ascii_lowercase();
    match name.as_slice() {
        b"blpop" | b"brpop" | b"bzpopmin" | b"bzpopmax" => {
            vec![args[0].clone(), key.to_vec(), args[args.len() - 1].clone()]
        }
        b"blmpop" | b"bzmpop" => {
            let n = crate::resp::parse::parse_i64(&args[2]).unwrap_or(1).max(1) as usize;
            let mut v = vec![
                args[0].clone(),
                args[1].clone(),
                b"1".to_vec(),
                key.to_vec(),
            ];
            v.extend_from_slice(&args[3 + n..]);
            v
        }
        _ => args.to_vec(),
    }
}

/// True for the commands of this family.
pub fn is_blocking(name: &str) -> bool {
    matches!(
        name,
        "blpop" | "brpop" | "blmove" | "brpoplpush" | "blmpop" | "bzpopmin" | "bzpopmax" | "bzmpop"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Timeouts follow Redis: fractions round up to ms, 0 is forever, errors by kind.
    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(b"0", 1000), Ok(None));
        assert_eq!(parse_timeout(b"0.1", 1000), Ok(Some(1100)));
        assert_eq!(parse_timeout(b"0.0001", 1000), Ok(Some(1001)));
        assert_eq!(parse_timeout(b"-0.0001", 1000), Ok(None));
        assert_eq!(parse_timeout(b"-1", 0), Err(ERR_TIMEOUT_NEGATIVE.into()));
        assert_eq!(parse_timeout(b"abc", 0), Err(ERR_TIMEOUT_FLOAT.into()));
        assert_eq!(parse_timeout(b"nan", 0), Err(ERR_TIMEOUT_FLOAT.into()));
        assert_eq!(parse_timeout(b"inf", 0), Err(ERR_TIMEOUT_RANGE.into()));
        assert_eq!(parse_timeout(b" 1", 0), Err(ERR_TIMEOUT_FLOAT.into()));
    }

    // A serve attempt names only the ready key and keeps the other options.
    #[test]
    fn narrowing() {
        let a: Vec<Vec<u8>> = ["BLMPOP", "0", "2", "a", "b", "LEFT", "COUNT", "2"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        let n = narrow_to_key(&a, b"b");
        let want: Vec<Vec<u8>> = ["BLMPOP", "0", "1", "b", "LEFT", "COUNT", "2"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        assert_eq!(n, want);
        let b: Vec<Vec<u8>> = ["blpop", "a", "b", "0"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        assert_eq!(narrow_to_key(&b, b"b").len(), 3);
    }
}
