//! Sorted set commands (Redis 7.2 semantics, replies and error texts): ZADD ZINCRBY ZREM
//! ZCARD ZSCORE ZMSCORE ZRANK ZREVRANK ZCOUNT ZLEXCOUNT ZRANGE ZRANGEBYSCORE
//! ZREVRANGEBYSCORE ZRANGEBYLEX ZREVRANGEBYLEX ZREVRANGE ZRANGESTORE ZREMRANGEBYRANK
//! ZREMRANGEBYSCORE ZREMRANGEBYLEX ZPOPMIN ZPOPMAX ZMPOP ZRANDMEMBER ZUNION ZINTER ZDIFF
//! ZUNIONSTORE ZINTERSTORE ZDIFFSTORE ZINTERCARD ZSCAN.
//!
//! For the blocking pops (BZPOPMIN/BZPOPMAX/BZMPOP, not here): `pop_from_key` pops up to
//! `count` pairs from the min or max end of one key (storing or deleting it) and is all a
//! blocking layer needs once a key is ready; `pop_pairs` is the same on an in-memory value.
//!
//! Every handler parses all arguments first, then loads every key it needs, then writes
//! at most once per key (all reads before the first write). Scores are formatted as Redis
//! 7.2's `d2string` (integers exactly, otherwise the shortest round-trip digits in
//! `fpconv_dtoa`'s layout); Redis 7.0 used `%.17g`, so `0.1` is `0.1` here and
//! `0.10000000000000001` in 7.0.

use super::collection::{
    distinct_indexes, load_zset, load_zset_handle, parse_cursor, parse_rand_count, parse_scan_opts,
    random_below, scan_step, store_zset, store_zset_handle, Loaded,
};
use super::{
    eq_ic, glob_match, parse_int, storage_error, CmdResult, Ctx, ERR_SYNTAX, ERR_WRONGTYPE,
};
use crate::resp::encode::Proto;
use crate::resp::parse::parse_i64;
use crate::resp::ReplyBuf;
use crate::runtime::events::{GENERIC, ZSET};
use crate::storage::collection::SetValue;
use crate::storage::paged_zset::ZHandle;
pub use crate::storage::zset::format_score;
use crate::storage::zset::{ZSetEncoding, ZSetValue};
use crate::storage::Shard;
use crate::storage::{StorageError, ValueKind};

/// A (score, member) pair as popped or selected.
pub type ScorePair = (f64, Vec<u8>);

const ERR_NOT_FLOAT: &str = "ERR value is not a valid float";
const ERR_MINMAX_FLOAT: &str = "ERR min or max is not a float";
const ERR_MINMAX_LEX: &str = "ERR min or max not valid string range item";
const ERR_NAN: &str = "ERR resulting score is not a number (NaN)";

// ---- scores -----------------------------------------------------------------------------

/// A score reply: a bulk string in RESP2, a RESP3 double.
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

/// C's `strtod` over the whole text (what Redis's parsers build on); `None` if it does not
/// consume every byte. Leading whitespace and an empty text are `strtod`'s business (the
/// callers decide whether to accept them).
fn strtod_all(a: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(a).ok()?;
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    if t.is_empty() {
        return None;
    }
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if body.starts_with("0x") || lower.starts_with("+-") || lower.starts_with("-+") {
        return None;
    }
    t.parse::<f64>().ok()
}

/// Whether a decimal text names a nonzero number (to tell an underflow to 0 from a zero).
fn has_nonzero_digit(a: &[u8]) -> bool {
    a.iter()
        .take_while(|c| !matches!(c, b'e' | b'E'))
        .any(|c| (b'1'..=b'9').contains(c))
}

/// Redis's `string2d` (ZADD scores, ZINCRBY, WEIGHTS): no empty text, no leading space,
/// no overflow to infinity or underflow to zero, no NaN.
pub fn parse_score(a: &[u8]) -> Option<f64> {
    if a.is_empty() || a[0].is_ascii_whitespace() {
        return None;
    }
    let v = strtod_all(a)?;
    let named_inf = a
        .iter()
        .any(|c| c.is_ascii_alphabetic() && !matches!(c, b'e' | b'E'));
    if v.is_nan() || (v.is_infinite() && !named_inf) || (v == 0.0 && has_nonzero_digit(a)) {
        return None;
    }
    Some(v)
}

/// One end of a score range (`zslParseRange`): `strtod` with no further checks, so an
/// empty text is 0 and an overflow is infinite; `(` makes it exclusive.
fn parse_range_end(a: &[u8]) -> Option<(f64, bool)> {
    let (text, excl) = match a.first() {
        Some(b'(') => (&a[1..], true),
        _ => (a, false),
    };
    let v = if text.is_empty() {
        0.0
    } else {
        strtod_all(text)?
    };
    (!v.is_nan()).then_some((v, excl))
}

#[derive(Clone, Copy, Debug)]
struct ScoreRange {
    min: f64,
    max: f64,
    min_excl: bool,
    max_excl: bool,
}

impl ScoreRange {
    fn parse(min: &[u8], max: &[u8]) -> Result<ScoreRange, String> {
        let (min, min_excl) = parse_range_end(min).ok_or(ERR_MINMAX_FLOAT)?;
        let (max, max_excl) = parse_range_end(max).ok_or(ERR_MINMAX_FLOAT)?;
        Ok(ScoreRange {
            min,
            max,
            min_excl,
            max_excl,
        })
    }

    fn gte_min(&self, v: f64) -> bool {
        if self.min_excl {
            v > self.min
        } else {
            v >= self.min
        }
    }

    fn lte_max(&self, v: f64) -> bool {
        if self.max_excl {
            v < self.max
        } else {
            v <= self.max
        }
    }

    fn is_empty(&self) -> bool {
        self.min > self.max || (self.min == self.max && (self.min_excl || self.max_excl))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LexBound {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

impl LexBound {
    fn parse(a: &[u8]) -> Result<LexBound, String> {
        match a {
            b"+" => Ok(LexBound::Max),
            b"-" => Ok(LexBound::Min),
            [b'(', rest @ ..] => Ok(LexBound::Excl(rest.to_vec())),
            [b'[', rest @ ..] => Ok(LexBound::Incl(rest.to_vec())),
            _ => Err(ERR_MINMAX_LEX.into()),
        }
    }
}

#[derive(Clone, Debug)]
struct LexRange {
    min: LexBound,
    max: LexBound,
}

impl LexRange {
    fn parse(min: &[u8], max: &[u8]) -> Result<LexRange, String> {
        Ok(LexRange {
            min: LexBound::parse(min)?,
            max: LexBound::parse(max)?,
        })
    }

    fn gte_min(&self, m: &[u8]) -> bool {
        match &self.min {
            LexBound::Min => true,
            LexBound::Max => false,
            LexBound::Incl(s) => m >= s.as_slice(),
            LexBound::Excl(s) => m > s.as_slice(),
        }
    }

    fn lte_max(&self, m: &[u8]) -> bool {
        match &self.max {
            LexBound::Max => true,
            LexBound::Min => false,
            LexBound::Incl(s) => m <= s.as_slice(),
            LexBound::Excl(s) => m < s.as_slice(),
        }
    }

    /// `zslIsInLexRange`'s emptiness test.
    fn is_empty(&self) -> bool {
        use LexBound::*;
        match (&self.min, &self.max) {
            (Max, _) | (_, Min) => true,
            (Min, _) | (_, Max) => false,
            (Incl(a) | Excl(a), Incl(b) | Excl(b)) => {
                let both_incl = matches!(self.min, Incl(_)) && matches!(self.max, Incl(_));
                a > b || (a == b && !both_incl)
            }
        }
    }
}

// ---- selections over a loaded value -----------------------------------------------------

/// The ranks of a score range on a handle: two rank lookups (on a paged sorted set, the
/// leaves of the two bounds).
fn score_span(
    z: &mut ZHandle,
    shard: &mut Shard,
    range: &ScoreRange,
) -> Result<std::ops::Range<usize>, String> {
    if range.is_empty() {
        return Ok(0..0);
    }
    let start = z
        .count_below(shard, &|p: &ScorePair| !range.gte_min(p.0))
        .map_err(storage_error)?;
    let end = z
        .count_below(shard, &|p: &ScorePair| range.lte_max(p.0))
        .map_err(storage_error)?;
    Ok(start..end.max(start))
}

/// The ranks of a lex range on a handle by two searches of the score tree's keys (on a
/// paged sorted set, the leaves of the two bounds). Exact when the scores in the set are
/// equal, the case lex ranges are meant for; with mixed scores Redis's skiplist answer
/// depends on its random levels, and this is the answer of a binary search.
fn lex_span(
    z: &mut ZHandle,
    shard: &mut Shard,
    range: &LexRange,
) -> Result<std::ops::Range<usize>, String> {
    if range.is_empty() {
        return Ok(0..0);
    }
    let start = z
        .count_below(shard, &|p: &ScorePair| !range.gte_min(&p.1))
        .map_err(storage_error)?;
    let end = z
        .count_below(shard, &|p: &ScorePair| range.lte_max(&p.1))
        .map_err(storage_error)?;
    Ok(start..end.max(start))
}

/// A BYSCORE or BYLEX range with LIMIT on a handle, as the skiplist walk of Redis's
/// `genericZrangebyscoreCommand`/`genericZrangebylexCommand`: from the first pair past
/// the start bound (found by a search of the score tree's keys), skip `offset` pairs, then
/// take pairs while they are within the end bound, at most `limit`. Pairs in walk order
/// (descending when `reverse`); only the leaves walked are read.
fn bounded_walk(
    z: &mut ZHandle,
    shard: &mut Shard,
    range: &ParsedRange,
    reverse: bool,
    offset: i64,
    limit: i64,
) -> Result<Vec<ScorePair>, String> {
    let empty = match range {
        ParsedRange::Score(r) => r.is_empty(),
        ParsedRange::Lex(r) => r.is_empty(),
        ParsedRange::Rank(..) => unreachable!("rank ranges are not walked"),
    };
    if empty || offset < 0 || limit == 0 {
        return Ok(Vec::new());
    }
    let before_min = |p: &ScorePair| match range {
        ParsedRange::Score(r) => !r.gte_min(p.0),
        ParsedRange::Lex(r) => !r.gte_min(&p.1),
        ParsedRange::Rank(..) => false,
    };
    let within_max = |p: &ScorePair| match range {
        ParsedRange::Score(r) => r.lte_max(p.0),
        ParsedRange::Lex(r) => r.lte_max(&p.1),
        ParsedRange::Rank(..) => false,
    };
    let max = if limit < 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let offset = offset as usize;
    let got = if reverse {
        // From the last pair within the upper bound, downward while past the lower one.
        let top = z.count_below(shard, &within_max).map_err(storage_error)?;
        if offset >= top {
            return Ok(Vec::new());
        }
        z.walk(shard, top - 1 - offset, true, max, &|p| !before_min(p))
    } else {
        let start = z.count_below(shard, &before_min).map_err(storage_error)?;
        z.walk(shard, start.saturating_add(offset), false, max, &within_max)
    };
    got.map_err(storage_error)
}

/// Indexes of the pairs within a lex range, walking from the low end (forward) or the
/// high end (reverse) as Redis's listpack walk does, so sets with mixed scores answer the
/// way a small Redis set does.
fn lex_indexes(z: &ZSetValue, range: &LexRange, reverse: bool) -> Vec<usize> {
    if range.is_empty() {
        return Vec::new();
    }
    let p = z.pairs();
    let mut out = Vec::new();
    // Redis first checks the range against the two ends (`zzlIsInLexRange`).
    match (p.first(), p.last()) {
        (Some(first), Some(last)) if range.gte_min(&last.1) && range.lte_max(&first.1) => {}
        _ => return out,
    }
    if !reverse {
        let Some(start) = p.iter().position(|(_, m)| range.gte_min(m)) else {
            return out;
        };
        if !range.lte_max(&p[start].1) {
            return out;
        }
        out.extend((start..p.len()).take_while(|&i| range.lte_max(&p[i].1)));
    } else {
        let Some(start) = p.iter().rposition(|(_, m)| range.lte_max(m)) else {
            return out;
        };
        if !range.gte_min(&p[start].1) {
            return out;
        }
        out.extend((0..=start).rev().take_while(|&i| range.gte_min(&p[i].1)));
    }
    out
}

/// ZRANGE BYLEX with LIMIT as Redis walks a listpack: from the first pair in range, skip
/// `offset` positions without looking at them, then emit while in range (up to `limit`).
/// On a set whose scores differ this can resume past pairs that are out of range.
fn lex_walk(z: &ZSetValue, range: &LexRange, reverse: bool, offset: i64, limit: i64) -> Vec<usize> {
    let Some(&start) = lex_indexes(z, range, reverse).first() else {
        return Vec::new();
    };
    if offset < 0 {
        return Vec::new();
    }
    let p = z.pairs();
    let positions: Box<dyn Iterator<Item = usize>> = if reverse {
        Box::new((0..=start).rev())
    } else {
        Box::new(start..p.len())
    };
    let in_range = |i: &usize| {
        if reverse {
            range.gte_min(&p[*i].1)
        } else {
            range.lte_max(&p[*i].1)
        }
    };
    let walk = positions.skip(offset as usize).take_while(in_range);
    if limit < 0 {
        walk.collect()
    } else {
        walk.take(limit as usize).collect()
    }
}

/// Redis's rank normalization: negative from the end, clamped; `None` when empty.
fn rank_span(start: i64, end: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let mut start = if start < 0 { len + start } else { start };
    let mut end = if end < 0 { len + end } else { end };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return None;
    }
    if end >= len {
        end = len - 1;
    }
    Some((start as usize, end as usize))
}

/// Replies with pairs: members only, or with scores (flat in RESP2, pairs in RESP3).
fn reply_pairs<'p>(
    r: &mut ReplyBuf,
    pairs: impl ExactSizeIterator<Item = (f64, &'p [u8])>,
    withscores: bool,
) {
    let n = pairs.len();
    if !withscores {
        r.array(n);
        for (_, m) in pairs {
            r.bulk(m);
        }
        return;
    }
    match r.proto {
        Proto::Resp2 => r.array(n * 2),
        Proto::Resp3 => r.array(n),
    }
    for (s, m) in pairs {
        if r.proto == Proto::Resp3 {
            r.array(2);
        }
        r.bulk(m);
        reply_score(r, s);
    }
}

// ---- ZADD / ZINCRBY / ZREM / simple reads -----------------------------------------------

#[derive(Default)]
struct AddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// What adding one (member, score) did.
enum AddOutcome {
    Added(f64),
    Updated(f64),
    Unchanged(f64),
    Skipped,
}

/// Redis's `zsetAdd` for one pair.
fn zset_add(
    z: &mut ZHandle,
    shard: &mut Shard,
    member: &[u8],
    score: f64,
    f: &AddFlags,
) -> Result<AddOutcome, String> {
    match z.score(shard, member).map_err(storage_error)? {
        Some(cur) => {
            if f.nx {
                return Ok(AddOutcome::Skipped);
            }
            let new = if f.incr {
                let n = cur + score;
                if n.is_nan() {
                    return Err(ERR_NAN.into());
                }
                n
            } else {
                score
            };
            if (f.lt && new >= cur) || (f.gt && new <= cur) {
                return Ok(AddOutcome::Skipped);
            }
            if new != cur {
                z.insert(shard, member, new).map_err(storage_error)?;
                return Ok(AddOutcome::Updated(new));
            }
            Ok(AddOutcome::Unchanged(new))
        }
        None => {
            if f.xx {
                return Ok(AddOutcome::Skipped);
            }
            z.insert(shard, member, score).map_err(storage_error)?;
            Ok(AddOutcome::Added(score))
        }
    }
}

/// ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...].
pub fn zadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zadd_generic(ctx, a, r, false)
}

/// ZINCRBY key increment member: ZADD INCR.
pub fn zincrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zadd_generic(ctx, a, r, true)
}

fn zadd_generic(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, zincrby: bool) -> CmdResult {
    let mut f = AddFlags {
        incr: zincrby,
        ..AddFlags::default()
    };
    let mut i = 2;
    if !zincrby {
        while i < a.len() {
            let o = a[i];
            if eq_ic(o, "nx") {
                f.nx = true;
            } else if eq_ic(o, "xx") {
                f.xx = true;
            } else if eq_ic(o, "ch") {
                f.ch = true;
            } else if eq_ic(o, "incr") {
                f.incr = true;
            } else if eq_ic(o, "gt") {
                f.gt = true;
            } else if eq_ic(o, "lt") {
                f.lt = true;
            } else {
                break;
            }
            i += 1;
        }
    }
    let elements = a.len() - i;
    if !elements.is_multiple_of(2) || elements == 0 {
        return Err(ERR_SYNTAX.into());
    }
    let elements = elements / 2;
    if f.nx && f.xx {
        return Err("ERR XX and NX options at the same time are not compatible".into());
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        return Err("ERR GT, LT, and/or NX options at the same time are not compatible".into());
    }
    if f.incr && elements > 1 {
        return Err("ERR INCR option supports a single increment-element pair".into());
    }
    let mut scores = Vec::with_capacity(elements);
    for pair in a[i..].chunks_exact(2) {
        scores.push(parse_score(pair[0]).ok_or(ERR_NOT_FLOAT)?);
    }
    let key = a[1];
    let loaded = load_zset_handle(ctx, key)?;
    let mut z = match loaded {
        Some(l) => l,
        None if f.xx => {
            if f.incr {
                r.null();
            } else {
                r.int(0);
            }
            return Ok(());
        }
        None => {
            let longest = a[i..]
                .chunks_exact(2)
                .map(|p| p[1].len())
                .max()
                .unwrap_or(0);
            Loaded {
                value: ZHandle::Whole(ZSetValue::with_hint(elements, longest)),
                expire_at_ms: None,
            }
        }
    };
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last_score = 0.0;
    for (pair, &score) in a[i..].chunks_exact(2).zip(&scores) {
        match zset_add(&mut z.value, ctx.shards.for_key(key), pair[1], score, &f)? {
            AddOutcome::Added(s) => {
                added += 1;
                processed += 1;
                last_score = s;
            }
            AddOutcome::Updated(s) => {
                updated += 1;
                processed += 1;
                last_score = s;
            }
            AddOutcome::Unchanged(s) => {
                processed += 1;
                last_score = s;
            }
            AddOutcome::Skipped => {}
        }
    }
    if added + updated > 0 {
        store_zset_handle(ctx, key, z.value, z.expire_at_ms)?;
        ctx.notify(ZSET, if f.incr { "zincr" } else { "zadd" }, key);
    }
    if f.incr {
        if processed > 0 {
            reply_score(r, last_score);
        } else {
            r.null();
        }
    } else {
        r.int(if f.ch { added + updated } else { added });
    }
    Ok(())
}

pub fn zrem(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let Some(mut z) = load_zset_handle(ctx, a[1])? else {
        r.int(0);
        return Ok(());
    };
    let mut removed = 0;
    for m in &a[2..] {
        if z.value
            .remove(ctx.shards.for_key(a[1]), m)
            .map_err(storage_error)?
            .is_some()
        {
            removed += 1;
        }
    }
    if removed > 0 {
        let emptied = z.value.is_empty();
        store_zset_handle(ctx, a[1], z.value, z.expire_at_ms)?;
        notify_removed(ctx, a[1], "zrem", emptied);
    }
    r.int(removed as i64);
    Ok(())
}

/// A removal's event, then `del` when it emptied the key (Redis's order).
fn notify_removed(ctx: &Ctx, key: &[u8], event: &str, emptied: bool) {
    ctx.notify(ZSET, event, key);
    if emptied {
        ctx.notify(GENERIC, "del", key);
    }
}

pub fn zcard(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let n = load_zset_handle(ctx, a[1])?.map_or(0, |z| z.value.len());
    r.int(n as i64);
    Ok(())
}

pub fn zscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let score = match load_zset_handle(ctx, a[1])? {
        Some(mut z) => z
            .value
            .score(ctx.shards.for_key(a[1]), a[2])
            .map_err(storage_error)?,
        None => None,
    };
    match score {
        Some(s) => reply_score(r, s),
        None => r.null(),
    }
    Ok(())
}

pub fn zmscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let mut z = load_zset_handle(ctx, a[1])?;
    let mut scores = Vec::with_capacity(a.len() - 2);
    for m in &a[2..] {
        scores.push(match z.as_mut() {
            Some(z) => z
                .value
                .score(ctx.shards.for_key(a[1]), m)
                .map_err(storage_error)?,
            None => None,
        });
    }
    r.array(scores.len());
    for s in scores {
        match s {
            Some(s) => reply_score(r, s),
            None => r.null(),
        }
    }
    Ok(())
}

/// ZRANK / ZREVRANK key member [WITHSCORE] (WITHSCORE is Redis 7.2).
fn rank_generic(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, reverse: bool) -> CmdResult {
    if a.len() > 4 || (a.len() == 4 && !eq_ic(a[3], "withscore")) {
        return Err(ERR_SYNTAX.into());
    }
    let withscore = a.len() == 4;
    let found = match load_zset_handle(ctx, a[1])? {
        Some(mut z) => {
            let len = z.value.len();
            z.value
                .rank(ctx.shards.for_key(a[1]), a[2])
                .map_err(storage_error)?
                .map(|(rank, s)| (if reverse { len - 1 - rank } else { rank }, s))
        }
        None => None,
    };
    match found {
        Some((rank, score)) => {
            if withscore {
                r.array(2);
            }
            r.int(rank as i64);
            if withscore {
                reply_score(r, score);
            }
        }
        None if withscore => r.null_array(),
        None => r.null(),
    }
    Ok(())
}

pub fn zrank(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    rank_generic(ctx, a, r, false)
}

pub fn zrevrank(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    rank_generic(ctx, a, r, true)
}

pub fn zcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let range = ScoreRange::parse(a[2], a[3])?;
    let n = match load_zset_handle(ctx, a[1])? {
        Some(mut z) => score_span(&mut z.value, ctx.shards.for_key(a[1]), &range)?.len(),
        None => 0,
    };
    r.int(n as i64);
    Ok(())
}

pub fn zlexcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let range = LexRange::parse(a[2], a[3])?;
    let n = match load_zset_handle(ctx, a[1])?.map(|z| z.value) {
        None => 0,
        Some(ZHandle::Whole(v)) => lex_indexes(&v, &range, false).len(),
        Some(mut z) => lex_span(&mut z, ctx.shards.for_key(a[1]), &range)?.len(),
    };
    r.int(n as i64);
    Ok(())
}

// ---- ZRANGE and its family --------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum RangeType {
    Auto,
    Rank,
    Score,
    Lex,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Auto,
    Forward,
    Reverse,
}

enum ParsedRange {
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(LexRange),
}

/// Redis's `zrangeGenericCommand`: `src_at` is the source key's position (1, or 2 for
/// ZRANGESTORE, whose destination is at 1).
fn zrange_generic(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut ReplyBuf,
    src_at: usize,
    mut rtype: RangeType,
    mut dir: Direction,
) -> CmdResult {
    let store = src_at == 2;
    let (mut min_at, mut max_at) = (src_at + 1, src_at + 2);
    let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = src_at + 3;
    while j < a.len() {
        let left = a.len() - j - 1;
        if !store && eq_ic(a[j], "withscores") {
            withscores = true;
        } else if eq_ic(a[j], "limit") && left >= 2 {
            offset = parse_int(a[j + 1])?;
            limit = parse_int(a[j + 2])?;
            j += 2;
        } else if dir == Direction::Auto && eq_ic(a[j], "rev") {
            dir = Direction::Reverse;
        } else if rtype == RangeType::Auto && eq_ic(a[j], "bylex") {
            rtype = RangeType::Lex;
        } else if rtype == RangeType::Auto && eq_ic(a[j], "byscore") {
            rtype = RangeType::Score;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        j += 1;
    }
    let reverse = dir == Direction::Reverse;
    if rtype == RangeType::Auto {
        rtype = RangeType::Rank;
    }
    if limit != -1 && rtype == RangeType::Rank {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
                .into(),
        );
    }
    if withscores && rtype == RangeType::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX".into());
    }
    if reverse && rtype != RangeType::Rank {
        std::mem::swap(&mut min_at, &mut max_at);
    }
    let range = match rtype {
        RangeType::Score => ParsedRange::Score(ScoreRange::parse(a[min_at], a[max_at])?),
        RangeType::Lex => ParsedRange::Lex(LexRange::parse(a[min_at], a[max_at])?),
        _ => ParsedRange::Rank(parse_int(a[min_at])?, parse_int(a[max_at])?),
    };
    let key = a[src_at];
    let Some(mut z) = load_zset_handle(ctx, key)? else {
        if store {
            store_result(ctx, a[1], &ZSetValue::new(), "zrangestore")?;
            r.int(0);
        } else {
            r.array(0);
        }
        return Ok(());
    };
    let picked: Vec<ScorePair> = match (&range, &mut z.value) {
        // A one-record sorted set walks BYLEX as Redis walks a listpack (which differs from
        // a search when scores are mixed).
        (ParsedRange::Lex(lex), ZHandle::Whole(v)) => lex_walk(v, lex, reverse, offset, limit)
            .into_iter()
            .map(|i| v.pairs()[i].clone())
            .collect(),
        (ParsedRange::Rank(start, end), z) => {
            // Rank ranges read only the leaves they cover.
            let len = z.len();
            match rank_span(*start, *end, len) {
                None => Vec::new(),
                Some((s, e)) => {
                    let (lo, hi) = if reverse {
                        (len - 1 - e, len - 1 - s)
                    } else {
                        (s, e)
                    };
                    let mut v = z
                        .range(ctx.shards.for_key(key), lo, hi)
                        .map_err(storage_error)?;
                    if reverse {
                        v.reverse();
                    }
                    v
                }
            }
        }
        (range, z) => bounded_walk(z, ctx.shards.for_key(key), range, reverse, offset, limit)?,
    };
    if store {
        let out = ZSetValue::from_pairs(picked);
        store_result(ctx, a[1], &out, "zrangestore")?;
        r.int(out.len() as i64);
        return Ok(());
    }
    reply_pairs(
        r,
        picked.iter().map(|(s, m)| (*s, m.as_slice())),
        withscores,
    );
    Ok(())
}

pub fn zrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 1, RangeType::Auto, Direction::Auto)
}

pub fn zrangestore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 2, RangeType::Auto, Direction::Auto)
}

pub fn zrevrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 1, RangeType::Rank, Direction::Reverse)
}

pub fn zrangebyscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 1, RangeType::Score, Direction::Forward)
}

pub fn zrevrangebyscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 1, RangeType::Score, Direction::Reverse)
}

pub fn zrangebylex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 1, RangeType::Lex, Direction::Forward)
}

pub fn zrevrangebylex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zrange_generic(ctx, a, r, 1, RangeType::Lex, Direction::Reverse)
}

// ---- ZREMRANGEBY* -----------------------------------------------------------------------

fn zremrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, rtype: RangeType) -> CmdResult {
    let range = match rtype {
        RangeType::Score => ParsedRange::Score(ScoreRange::parse(a[2], a[3])?),
        RangeType::Lex => ParsedRange::Lex(LexRange::parse(a[2], a[3])?),
        _ => ParsedRange::Rank(parse_int(a[2])?, parse_int(a[3])?),
    };
    let Some(mut z) = load_zset_handle(ctx, a[1])? else {
        r.int(0);
        return Ok(());
    };
    let shard = ctx.shards.for_key(a[1]);
    let span = match (&range, &mut z.value) {
        (ParsedRange::Rank(s, e), z) => rank_span(*s, *e, z.len()).map_or(0..0, |(s, e)| s..e + 1),
        (ParsedRange::Score(range), z) => score_span(z, shard, range)?,
        (ParsedRange::Lex(range), ZHandle::Whole(v)) => {
            let idx = lex_indexes(v, range, false);
            idx.first().map_or(0..0, |&s| s..s + idx.len())
        }
        (ParsedRange::Lex(range), z) => lex_span(z, shard, range)?,
    };
    // A paged sorted set reads and rewrites only the score leaves of the span and the
    // removed members' leaves (`docs/collections.md` section 4b).
    let removed = z.value.remove_ranks(shard, span).map_err(storage_error)?;
    if removed > 0 {
        let emptied = z.value.is_empty();
        store_zset_handle(ctx, a[1], z.value, z.expire_at_ms)?;
        let event = match rtype {
            RangeType::Score => "zremrangebyscore",
            RangeType::Lex => "zremrangebylex",
            _ => "zremrangebyrank",
        };
        notify_removed(ctx, a[1], event, emptied);
    }
    r.int(removed as i64);
    Ok(())
}

pub fn zremrangebyrank(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zremrange(ctx, a, r, RangeType::Rank)
}

pub fn zremrangebyscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zremrange(ctx, a, r, RangeType::Score)
}

pub fn zremrangebylex(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zremrange(ctx, a, r, RangeType::Lex)
}

// ---- pops -------------------------------------------------------------------------------

/// Removes up to `count` pairs from the low (`max` false) or high end of `z`, in pop order.
pub fn pop_pairs(z: &mut ZSetValue, max: bool, count: usize) -> Vec<(f64, Vec<u8>)> {
    let n = count.min(z.len());
    if max {
        let len = z.len();
        let mut out = z.remove_ranks(len - n..len);
        out.reverse();
        out
    } else {
        z.remove_ranks(0..n)
    }
}

/// Pops up to `count` pairs from the sorted set at `key` and writes the key back (deleted
/// when emptied). `Ok(None)`: no such key. The seam for BZPOPMIN/BZPOPMAX/BZMPOP. Fires
/// `zpopmin`/`zpopmax` (and `del` when emptied) when it popped.
pub fn pop_from_key(
    ctx: &mut Ctx,
    key: &[u8],
    max: bool,
    count: usize,
) -> Result<Option<Vec<ScorePair>>, String> {
    let Some(mut z) = load_zset_handle(ctx, key)? else {
        return Ok(None);
    };
    let popped = z
        .value
        .pop(ctx.shards.for_key(key), max, count)
        .map_err(storage_error)?;
    if !popped.is_empty() {
        let emptied = z.value.is_empty();
        store_zset_handle(ctx, key, z.value, z.expire_at_ms)?;
        let event = if max { "zpopmax" } else { "zpopmin" };
        notify_removed(ctx, key, event, emptied);
    }
    Ok(Some(popped))
}

/// ZPOPMIN / ZPOPMAX key [count]: flat [member, score, ...]; RESP3 with a count nests pairs.
fn zpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf, max: bool) -> CmdResult {
    if a.len() > 3 {
        return Err(ERR_SYNTAX.into());
    }
    let count = match a.get(2) {
        Some(c) => parse_i64(c)
            .filter(|&n| n >= 0)
            .ok_or("ERR value is out of range, must be positive")? as usize,
        None => 1,
    };
    let popped = pop_from_key(ctx, a[1], max, count)?.unwrap_or_default();
    let nested = a.len() == 3 && r.proto == Proto::Resp3;
    r.array(if nested {
        popped.len()
    } else {
        popped.len() * 2
    });
    for (s, m) in &popped {
        if nested {
            r.array(2);
        }
        r.bulk(m);
        reply_score(r, *s);
    }
    Ok(())
}

pub fn zpopmin(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zpop(ctx, a, r, false)
}

pub fn zpopmax(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zpop(ctx, a, r, true)
}

/// ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]: pops from the first non-empty key.
pub fn zmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let numkeys = parse_i64(a[1])
        .filter(|&n| n >= 1)
        .ok_or("ERR numkeys should be greater than 0")? as usize;
    let where_at = 2usize.saturating_add(numkeys);
    if where_at >= a.len() {
        return Err(ERR_SYNTAX.into());
    }
    let max = if eq_ic(a[where_at], "min") {
        false
    } else if eq_ic(a[where_at], "max") {
        true
    } else {
        return Err(ERR_SYNTAX.into());
    };
    let mut count: Option<usize> = None;
    let mut j = where_at + 1;
    while j < a.len() {
        if count.is_none() && eq_ic(a[j], "count") && j + 1 < a.len() {
            j += 1;
            count = Some(
                parse_i64(a[j])
                    .filter(|&n| n >= 1)
                    .ok_or("ERR count should be greater than 0")? as usize,
            );
        } else {
            return Err(ERR_SYNTAX.into());
        }
        j += 1;
    }
    let count = count.unwrap_or(1);
    for key in &a[2..where_at] {
        if let Some(popped) = pop_from_key(ctx, key, max, count)? {
            r.array(2);
            r.bulk(key);
            r.array(popped.len());
            for (s, m) in &popped {
                r.array(2);
                r.bulk(m);
                reply_score(r, *s);
            }
            return Ok(());
        }
    }
    r.null_array();
    Ok(())
}

// ---- ZRANDMEMBER ------------------------------------------------------------------------

/// ZRANDMEMBER key [count [WITHSCORES]].
pub fn zrandmember(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len() == 2 {
        match load_zset(ctx, a[1])? {
            Some(z) => r.bulk(&z.value.pairs()[random_below(z.value.len())].1),
            None => r.null(),
        }
        return Ok(());
    }
    let count = parse_rand_count(a[2])?;
    if a.len() > 4 || (a.len() == 4 && !eq_ic(a[3], "withscores")) {
        return Err(ERR_SYNTAX.into());
    }
    let withscores = a.len() == 4;
    if withscores && !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&count) {
        return Err("ERR value is out of range".into());
    }
    let Some(z) = load_zset(ctx, a[1])? else {
        r.array(0);
        return Ok(());
    };
    let p = z.value.pairs();
    let picks: Vec<usize> = if count < 0 {
        (0..count.unsigned_abs())
            .map(|_| random_below(p.len()))
            .collect()
    } else if count as usize >= p.len() {
        (0..p.len()).collect()
    } else {
        distinct_indexes(p.len(), count as usize)
    };
    reply_pairs(
        r,
        picks.iter().map(|&i| (p[i].0, p[i].1.as_slice())),
        withscores,
    );
    Ok(())
}

// ---- ZUNION / ZINTER / ZDIFF ------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

fn aggregate(target: &mut f64, v: f64, how: Aggregate) {
    match how {
        Aggregate::Sum => {
            *target += v;
            if target.is_nan() {
                *target = 0.0;
            }
        }
        Aggregate::Min => {
            if v < *target {
                *target = v;
            }
        }
        Aggregate::Max => {
            if v > *target {
                *target = v;
            }
        }
    }
}

/// A sorted set or a set (members scored 1, as Redis's zset operations read sets);
/// a missing key is an empty input.
fn load_zset_source(ctx: &mut Ctx, key: &[u8]) -> Result<ZSetValue, String> {
    let (db, now) = (ctx.db, ctx.now_ms);
    let v = ctx
        .shards
        .for_key(key)
        .get(db, key, now)
        .map_err(storage_error)?;
    let corrupt = |e: String| storage_error(StorageError::Corrupt(e));
    match v {
        None => Ok(ZSetValue::new()),
        Some(v) if v.kind == ValueKind::ZSet => {
            ZSetValue::decode(&v.bytes).map_err(|e| corrupt(e.to_string()))
        }
        Some(v) if v.kind == ValueKind::Set => {
            let s = SetValue::decode(&v.bytes).map_err(|e| corrupt(e.to_string()))?;
            Ok(ZSetValue::from_pairs(
                s.members().iter().map(|m| (1.0, m.clone())).collect(),
            ))
        }
        Some(_) => Err(ERR_WRONGTYPE.into()),
    }
}

/// The result of a set operation over `srcs` with their weights, as (score, member) pairs.
fn set_operation(srcs: &[(ZSetValue, f64)], op: SetOp, how: Aggregate) -> Vec<(f64, Vec<u8>)> {
    match op {
        SetOp::Diff => {
            let (first, rest) = srcs.split_first().expect("at least one input");
            first
                .0
                .pairs()
                .iter()
                .filter(|(_, m)| rest.iter().all(|(z, _)| z.score(m).is_none()))
                .cloned()
                .collect()
        }
        SetOp::Union => {
            // Smallest inputs first, as Redis orders them (it decides how NaN sums resolve).
            let mut order: Vec<&(ZSetValue, f64)> = srcs.iter().collect();
            order.sort_by_key(|(z, _)| z.len());
            let mut acc: std::collections::HashMap<&[u8], f64> = Default::default();
            let mut members: Vec<&[u8]> = Vec::new();
            for (z, w) in order {
                for (s, m) in z.pairs() {
                    let mut v = w * s;
                    if v.is_nan() {
                        v = 0.0;
                    }
                    match acc.get_mut(m.as_slice()) {
                        Some(t) => aggregate(t, v, how),
                        None => {
                            acc.insert(m, v);
                            members.push(m);
                        }
                    }
                }
            }
            members.into_iter().map(|m| (acc[m], m.to_vec())).collect()
        }
        SetOp::Inter => {
            let mut order: Vec<&(ZSetValue, f64)> = srcs.iter().collect();
            order.sort_by_key(|(z, _)| z.len());
            if order.first().is_none_or(|(z, _)| z.is_empty()) {
                return Vec::new();
            }
            let (first, rest) = order.split_first().expect("non-empty");
            let mut out = Vec::new();
            'member: for (s, m) in first.0.pairs() {
                let mut score = first.1 * s;
                if score.is_nan() {
                    score = 0.0;
                }
                for (z, w) in rest {
                    match z.score(m) {
                        Some(v) => aggregate(&mut score, v * w, how),
                        None => continue 'member,
                    }
                }
                out.push((score, m.clone()));
            }
            out
        }
    }
}

/// Writes a *STORE result at `dst` (ZUNIONSTORE ... ZRANGESTORE, GEOSEARCHSTORE): fires
/// `event` when it stored members, `del` when an empty result removed an existing key.
pub(crate) fn store_result(ctx: &mut Ctx, dst: &[u8], out: &ZSetValue, event: &str) -> CmdResult {
    let existed = out.is_empty() && {
        let (db, now) = (ctx.db, ctx.now_ms);
        ctx.shards
            .for_key(dst)
            .exists(db, dst, now)
            .map_err(storage_error)?
    };
    store_zset(ctx, dst, out, None)?;
    if !out.is_empty() {
        ctx.notify(ZSET, event, dst);
    } else if existed {
        ctx.notify(GENERIC, "del", dst);
    }
    Ok(())
}

fn command_name(a: &[&[u8]]) -> String {
    String::from_utf8_lossy(a[0]).to_ascii_lowercase()
}

/// Redis's `zunionInterDiffGenericCommand` for ZUNION/ZINTER/ZDIFF (`numkeys_at` 1) and
/// their *STORE forms (destination at 1, `numkeys_at` 2).
fn zsetop_generic(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut ReplyBuf,
    op: SetOp,
    numkeys_at: usize,
) -> CmdResult {
    let store = numkeys_at == 2;
    let setnum = parse_int(a[numkeys_at])?;
    if setnum < 1 {
        return Err(format!(
            "ERR at least 1 input key is needed for '{}' command",
            command_name(a)
        ));
    }
    if setnum as u64 > (a.len() - numkeys_at - 1) as u64 {
        return Err(ERR_SYNTAX.into());
    }
    let setnum = setnum as usize;
    let keys = &a[numkeys_at + 1..numkeys_at + 1 + setnum];
    let mut srcs: Vec<(ZSetValue, f64)> = Vec::with_capacity(setnum);
    for k in keys {
        srcs.push((load_zset_source(ctx, k)?, 1.0));
    }
    let (mut how, mut withscores) = (Aggregate::Sum, false);
    let mut j = numkeys_at + 1 + setnum;
    while j < a.len() {
        let remaining = a.len() - j;
        if op != SetOp::Diff && remaining > setnum && eq_ic(a[j], "weights") {
            j += 1;
            for src in srcs.iter_mut() {
                src.1 = parse_score(a[j]).ok_or("ERR weight value is not a float")?;
                j += 1;
            }
        } else if op != SetOp::Diff && remaining >= 2 && eq_ic(a[j], "aggregate") {
            how = if eq_ic(a[j + 1], "sum") {
                Aggregate::Sum
            } else if eq_ic(a[j + 1], "min") {
                Aggregate::Min
            } else if eq_ic(a[j + 1], "max") {
                Aggregate::Max
            } else {
                return Err(ERR_SYNTAX.into());
            };
            j += 2;
        } else if !store && eq_ic(a[j], "withscores") {
            withscores = true;
            j += 1;
        } else {
            return Err(ERR_SYNTAX.into());
        }
    }
    let out = ZSetValue::from_pairs(set_operation(&srcs, op, how));
    if store {
        let event = match op {
            SetOp::Union => "zunionstore",
            SetOp::Inter => "zinterstore",
            SetOp::Diff => "zdiffstore",
        };
        store_result(ctx, a[1], &out, event)?;
        r.int(out.len() as i64);
    } else {
        reply_pairs(
            r,
            out.pairs().iter().map(|(s, m)| (*s, m.as_slice())),
            withscores,
        );
    }
    Ok(())
}

pub fn zunion(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zsetop_generic(ctx, a, r, SetOp::Union, 1)
}

pub fn zinter(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zsetop_generic(ctx, a, r, SetOp::Inter, 1)
}

pub fn zdiff(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zsetop_generic(ctx, a, r, SetOp::Diff, 1)
}

pub fn zunionstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zsetop_generic(ctx, a, r, SetOp::Union, 2)
}

pub fn zinterstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zsetop_generic(ctx, a, r, SetOp::Inter, 2)
}

pub fn zdiffstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    zsetop_generic(ctx, a, r, SetOp::Diff, 2)
}

/// ZINTERCARD numkeys key [key ...] [LIMIT limit].
pub fn zintercard(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let setnum = parse_int(a[1])?;
    if setnum < 1 {
        return Err("ERR at least 1 input key is needed for 'zintercard' command".into());
    }
    if setnum as u64 > (a.len() - 2) as u64 {
        return Err(ERR_SYNTAX.into());
    }
    let setnum = setnum as usize;
    let mut srcs = Vec::with_capacity(setnum);
    for k in &a[2..2 + setnum] {
        srcs.push((load_zset_source(ctx, k)?, 1.0));
    }
    let mut limit = 0usize;
    let mut j = 2 + setnum;
    while j < a.len() {
        if a.len() - j >= 2 && eq_ic(a[j], "limit") {
            limit = parse_i64(a[j + 1])
                .filter(|&n| n >= 0)
                .ok_or("ERR LIMIT can't be negative")? as usize;
            j += 2;
        } else {
            return Err(ERR_SYNTAX.into());
        }
    }
    let n = set_operation(&srcs, SetOp::Inter, Aggregate::Sum).len();
    r.int(if limit > 0 { n.min(limit) } else { n } as i64);
    Ok(())
}

// ---- ZSCAN ------------------------------------------------------------------------------

/// ZSCAN key cursor [MATCH pattern] [COUNT count]: [cursor, [member, score, ...]].
pub fn zscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let cursor = parse_cursor(a[2])?;
    let Some(z) = load_zset(ctx, a[1])? else {
        r.array(2);
        r.bulk(b"0");
        r.array(0);
        return Ok(());
    };
    let opts = parse_scan_opts(a)?;
    let p = z.value.pairs();
    let (picked, next): (Vec<usize>, u64) = match z.value.encoding() {
        ZSetEncoding::Listpack => ((0..p.len()).collect(), 0),
        ZSetEncoding::Skiplist => scan_step(p.iter().map(|x| x.1.as_slice()), cursor, opts.count),
    };
    let items: Vec<usize> = picked
        .into_iter()
        .filter(|&i| opts.pattern.is_none_or(|pat| glob_match(pat, &p[i].1)))
        .collect();
    r.array(2);
    r.bulk(next.to_string().as_bytes());
    r.array(items.len() * 2);
    for i in items {
        r.bulk(&p[i].1);
        r.bulk(format_score(p[i].0).as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Scores print as Redis 7.2's d2string: integers whole, fractions shortest, fpconv's
    // exponent layout outside its plain-notation window.
    #[test]
    fn score_format() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1"),
            (-0.0, "-0"),
            (0.0, "0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (-2.25, "-2.25"),
            (1e18, "1000000000000000000"),
            (1e19, "1e+19"),
            (1.5e20, "1.5e+20"),
            (12345678901234567890.0, "12345678901234567000"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-7"),
            (1e-300, "1e-300"),
            (123.456, "123.456"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (0.30000000000000004, "0.30000000000000004"),
            (3.0e-5, "0.00003"),
        ];
        for (v, want) in cases {
            assert_eq!(format_score(*v), *want, "{v:e}");
        }
    }

    // Score parsing follows string2d: infinities by name, no NaN, no blanks, no overflow.
    #[test]
    fn score_parse() {
        assert_eq!(parse_score(b"1.5"), Some(1.5));
        assert_eq!(parse_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_score(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_score(b"1e3"), Some(1000.0));
        for bad in [
            &b"nan"[..],
            b"",
            b" 1",
            b"1e400",
            b"1e-400",
            b"abc",
            b"1 ",
            b"0x10",
        ] {
            assert_eq!(parse_score(bad), None, "{bad:?}");
        }
        assert_eq!(parse_range_end(b"(1.5"), Some((1.5, true)));
        assert_eq!(parse_range_end(b""), Some((0.0, false)));
        assert_eq!(parse_range_end(b"("), Some((0.0, true)));
        assert_eq!(parse_range_end(b"1e400"), Some((f64::INFINITY, false)));
        assert_eq!(parse_range_end(b"nan"), None);
    }

    // Popping from either end returns pairs in pop order and leaves the rest.
    #[test]
    fn pops() {
        let mut z = ZSetValue::new();
        for (i, m) in ["a", "b", "c", "d"].iter().enumerate() {
            z.insert(m.as_bytes(), i as f64);
        }
        let hi = pop_pairs(&mut z, true, 2);
        assert_eq!(hi, vec![(3.0, b"d".to_vec()), (2.0, b"c".to_vec())]);
        let lo = pop_pairs(&mut z, false, 5);
        assert_eq!(lo, vec![(0.0, b"a".to_vec()), (1.0, b"b".to_vec())]);
        assert!(z.is_empty());
    }
}
