//! INFO `keyspace_hits` / `keyspace_misses` and the `keymiss` keyspace event (class `m`).
//!
//! Redis counts in `lookupKey`: a *read* lookup that finds the key is a hit, one that does
//! not (or finds it expired) is a miss and fires `keymiss`; *write* lookups count nothing.
//! Which of a command's keys Redis looks up for reading was measured against
//! redis-server 7.0.15 (`tools/measure-keymiss.py`, its table in
//! `docs/keymiss-redis-7.0.15.txt`) and is written down per command in `rule_for`:
//!
//! - read-only commands: every declared key, each position once (MGET/EXISTS/TOUCH with a
//!   key twice count it twice); OBJECT counts but fires no event (Redis's NONOTIFY);
//! - writing commands that read a source: only the sources (BITOP, SINTERSTORE and
//!   friends, ZUNIONSTORE and friends, ZRANGESTORE, GEOSEARCHSTORE, COPY,
//!   GEORADIUS[BYMEMBER]); SORT and SORT_RO count in the handler (`lookups::read_now`),
//!   their key and each key a BY/GET pattern names, as Redis does; PFMERGE reads every key, the destination too;
//!   GETSET/GETDEL/GETEX read their key; SET reads it only with GET; BITFIELD only when it
//!   has no SET/INCRBY operation;
//! - every other writing command (and EVAL/FCALL themselves, whose `redis.call`s count as
//!   commands of their own, and the blocking commands): nothing.
//!
//! How a command pays for it: the rule is looked up by the spec's index in `TABLE` (no
//! string compare on the hot path); a command without read keys does nothing more. One
//! with read keys arms the thread's lookup note (`runtime::lookups`); the handler's own
//! storage lookups fill it; after the handler, `settle` matches each read-key position
//! with the note (by index hash, searching on from the previous match, so keys looked up
//! in argument order cost one compare each) and counts. A read key the handler never
//! looked up (an argument error before the lookup) counts nothing, as in Redis.
//!
//! The counters are relaxed atomics in per-thread slots (one cache line per worker, summed
//! by INFO), one `fetch_add` per command that counted something. `keymiss` goes through `events::notify` (one relaxed load when
//! class `m` is off), so it reaches subscribers on every worker.
//!
//! `keymiss` is found out after the handler but queued where the command's events began
//! (`events::notify_at`), so it precedes the command's own events, as Redis's lookup does.

use crate::commands::table::{key_positions, TABLE};
use crate::commands::{eq_ic, events, CommandSpec, ShardSet};
use crate::runtime::lookups;
use std::sync::OnceLock;

/// INFO `keyspace_hits`.
pub fn hits() -> u64 {
    lookups::hits()
}

/// INFO `keyspace_misses`.
pub fn misses() -> u64 {
    lookups::misses()
}

/// CONFIG RESETSTAT.
pub fn reset() {
    lookups::reset()
}

/// Which argument positions of a command Redis looks up for reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// No read lookups (writes, scripts, blocking commands, keyless commands).
    Nothing,
    /// Every declared key; `notify`: false for OBJECT (counted, no `keymiss`).
    Declared { notify: bool },
    /// The declared keys from this position on (the sources after a destination).
    DeclaredFrom(usize),
    /// The one key at this position (COPY's source, GETDEL's key, ...).
    Only(usize),
    /// The numkeys keys, without the destination (ZUNIONSTORE and friends).
    Sources,
    /// SET: the key, when the GET option is given.
    SetGet,
    /// BITFIELD: the key, when no operation writes.
    BitfieldRead,
}

/// The rule of a command, from its name and flags (see the module essay).
pub fn rule_for(spec: &CommandSpec) -> Rule {
    match spec.name {
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro" => Rule::Nothing,
        "object" => Rule::Declared { notify: false },
        "getset" | "getdel" | "getex" | "copy" | "georadius" | "georadiusbymember" => Rule::Only(1),
        // SORT counts its own lookups where it makes them (`lookups::read_now`), its key's
        // and its BY/GET patterns', in Redis's order.
        "sort" | "sort_ro" => Rule::Nothing,
        "zrangestore" | "geosearchstore" => Rule::Only(2),
        "sinterstore" | "sunionstore" | "sdiffstore" => Rule::DeclaredFrom(2),
        "bitop" => Rule::DeclaredFrom(3),
        "zunionstore" | "zinterstore" | "zdiffstore" => Rule::Sources,
        "pfmerge" => Rule::Declared { notify: true },
        "set" => Rule::SetGet,
        "bitfield" => Rule::BitfieldRead,
        _ if spec.first_key == 0 && spec.movable.is_none() => Rule::Nothing,
        _ if spec.flags.contains(&"readonly") => Rule::Declared { notify: true },
        _ => Rule::Nothing,
    }
}

/// The rules of `TABLE`, by index.
fn rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| TABLE.iter().map(rule_for).collect())
}

/// The rule of `spec` (a `TABLE` entry: found by its address, no name compare).
fn rule_of(spec: &CommandSpec) -> Rule {
    let base = TABLE.as_ptr() as usize;
    let at = (spec as *const CommandSpec as usize).wrapping_sub(base)
        / std::mem::size_of::<CommandSpec>();
    match TABLE.get(at) {
        Some(s) if std::ptr::eq(s, spec) => rules()[at],
        _ => rule_for(spec),
    }
}

/// Before a keyed handler: the command's read rule, with the lookup note armed when it
/// has read keys. `None`: nothing to count (nothing armed; `settle` is then free).
#[inline]
pub fn begin(spec: &CommandSpec, args: &[&[u8]]) -> Option<Rule> {
    let rule = match rule_of(spec) {
        Rule::Nothing => return None,
        Rule::SetGet if !args.iter().skip(3).any(|a| eq_ic(a, "get")) => return None,
        Rule::BitfieldRead
            if args
                .iter()
                .skip(2)
                .any(|a| eq_ic(a, "set") || eq_ic(a, "incrby")) =>
        {
            return None
        }
        r => r,
    };
    lookups::arm();
    Some(rule)
}

/// After the handler `begin` armed the note for: counts each read key against the note
/// and fires `keymiss` for the misses, then disarms the note.
pub fn settle(
    rule: Option<Rule>,
    spec: &CommandSpec,
    shards: &mut ShardSet,
    args: &[&[u8]],
    db: u8,
) {
    let Some(rule) = rule else { return };
    lookups::disarm(|note, mark| {
        if note.is_empty() {
            return;
        }
        let notify = rule != Rule::Declared { notify: false };
        let (mut hits, mut misses, mut cursor) = (0u64, 0u64, 0usize);
        let mut count = |pos: usize| {
            let Some(&key) = args.get(pos) else { return };
            let h = shards.for_key(key).hash(db, key);
            // The first noted lookup of this key at or after the previous match.
            let at = (cursor..note.len())
                .chain(0..cursor)
                .find(|&i| note[i].0 == h);
            let Some(i) = at else { return };
            cursor = i + 1;
            if note[i].1 {
                hits += 1;
            } else {
                misses += 1;
                if notify {
                    events::notify_at(mark, events::KEY_MISS, "keymiss", key, db);
                }
            }
        };
        match rule {
            Rule::Only(p) => count(p),
            Rule::SetGet | Rule::BitfieldRead => count(1),
            Rule::DeclaredFrom(from) => key_positions(spec, args)
                .filter(|&p| p >= from)
                .for_each(&mut count),
            Rule::Sources => {
                let dest = spec.movable.and_then(|m| m.dest_at);
                key_positions(spec, args)
                    .filter(|&p| Some(p) != dest)
                    .for_each(&mut count)
            }
            Rule::Declared { .. } => key_positions(spec, args).for_each(&mut count),
            Rule::Nothing => {}
        }
        if hits + misses > 0 {
            lookups::count(hits, misses);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str) -> Rule {
        rule_of(crate::commands::lookup(name.as_bytes()).unwrap())
    }

    // The measured shapes: reads count every key, stores only their sources, writes nothing.
    #[test]
    fn rules_follow_the_measured_table() {
        assert_eq!(rule("get"), Rule::Declared { notify: true });
        assert_eq!(rule("mget"), Rule::Declared { notify: true });
        assert_eq!(rule("object"), Rule::Declared { notify: false });
        assert_eq!(rule("incr"), Rule::Nothing);
        assert_eq!(rule("lmove"), Rule::Nothing);
        assert_eq!(rule("blpop"), Rule::Nothing);
        assert_eq!(rule("eval_ro"), Rule::Nothing);
        assert_eq!(rule("sinterstore"), Rule::DeclaredFrom(2));
        assert_eq!(rule("zunionstore"), Rule::Sources);
        assert_eq!(rule("copy"), Rule::Only(1));
        assert_eq!(rule("pfmerge"), Rule::Declared { notify: true });
        assert_eq!(rule("ping"), Rule::Nothing);
        let set = crate::commands::lookup(b"set").unwrap();
        assert_eq!(begin(set, &[&b"set"[..], b"k", b"get"]), None);
        assert!(begin(set, &[&b"set"[..], b"k", b"v", b"GET"]).is_some());
        crate::runtime::lookups::disarm(|_, _| ());
    }
}
