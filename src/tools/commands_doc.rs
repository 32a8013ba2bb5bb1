//! `docs/commands.md`, generated from the command table (`commands::table::TABLE`): every
//! Redis 7.2 command by group with lavik's status, then lavik's own commands. Regenerate with
//! `lavik --command-reference > docs/commands.md` (or `LAVIK_WRITE_DOCS=1 cargo test --lib
//! tools::commands_doc`); a unit test fails when the file and the table disagree.
use crate::commands::table::TABLE;
use std::fmt::Write as _;

/// Redis 7.2's top-level commands and their `COMMAND DOCS` group. Taken from `COMMAND LIST`
/// and `COMMAND DOCS` of Debian's redis-server 7.0.15, plus WAITAOF, the one top-level
/// command 7.2.0 added (its `src/commands/waitaof.json`: group generic, since 7.2.0).
/// Subcommands (CLIENT NO-TOUCH, ...) are their container's business.
pub const REDIS_COMMANDS: &[(&str, &str)] = &[
    ("acl", "server"),
    ("append", "string"),
    ("asking", "cluster"),
    ("auth", "connection"),
    ("bgrewriteaof", "server"),
    ("bgsave", "server"),
    ("bitcount", "bitmap"),
    ("bitfield", "bitmap"),
    ("bitfield_ro", "bitmap"),
    ("bitop", "bitmap"),
    ("bitpos", "bitmap"),
    ("blmove", "list"),
    ("blmpop", "list"),
    ("blpop", "list"),
    ("brpop", "list"),
    ("brpoplpush", "list"),
    ("bzmpop", "sorted-set"),
    ("bzpopmax", "sorted-set"),
    ("bzpopmin", "sorted-set"),
    ("client", "connection"),
    ("cluster", "cluster"),
    ("command", "server"),
    ("config", "server"),
    ("copy", "generic"),
    ("dbsize", "server"),
    ("debug", "server"),
    ("decr", "string"),
    ("decrby", "string"),
    ("del", "generic"),
    ("discard", "transactions"),
    ("dump", "generic"),
    ("echo", "connection"),
    ("eval", "scripting"),
    ("eval_ro", "scripting"),
    ("evalsha", "scripting"),
    ("evalsha_ro", "scripting"),
    ("exec", "transactions"),
    ("exists", "generic"),
    ("expire", "generic"),
    ("expireat", "generic"),
    ("expiretime", "generic"),
    ("failover", "server"),
    ("fcall", "scripting"),
    ("fcall_ro", "scripting"),
    ("flushall", "server"),
    ("flushdb", "server"),
    ("function", "scripting"),
    ("geoadd", "geo"),
    ("geodist", "geo"),
    ("geohash", "geo"),
    ("geopos", "geo"),
    ("georadius", "geo"),
    ("georadius_ro", "geo"),
    ("georadiusbymember", "geo"),
    ("georadiusbymember_ro", "geo"),
    ("geosearch", "geo"),
    ("geosearchstore", "geo"),
    ("get", "string"),
    ("getbit", "bitmap"),
    ("getdel", "string"),
    ("getex", "string"),
    ("getrange", "string"),
    ("getset", "string"),
    ("hdel", "hash"),
    ("hello", "connection"),
    ("hexists", "hash"),
    ("hget", "hash"),
    ("hgetall", "hash"),
    ("hincrby", "hash"),
    ("hincrbyfloat", "hash"),
    ("hkeys", "hash"),
    ("hlen", "hash"),
    ("hmget", "hash"),
    ("hmset", "hash"),
    ("hrandfield", "hash"),
    ("hscan", "hash"),
    ("hset", "hash"),
    ("hsetnx", "hash"),
    ("hstrlen", "hash"),
    ("hvals", "hash"),
    ("incr", "string"),
    ("incrby", "string"),
    ("incrbyfloat", "string"),
    ("info", "server"),
    ("keys", "generic"),
    ("lastsave", "server"),
    ("latency", "server"),
    ("lcs", "string"),
    ("lindex", "list"),
    ("linsert", "list"),
    ("llen", "list"),
    ("lmove", "list"),
    ("lmpop", "list"),
    ("lolwut", "server"),
    ("lpop", "list"),
    ("lpos", "list"),
    ("lpush", "list"),
    ("lpushx", "list"),
    ("lrange", "list"),
    ("lrem", "list"),
    ("lset", "list"),
    ("ltrim", "list"),
    ("memory", "server"),
    ("mget", "string"),
    ("migrate", "generic"),
    ("module", "server"),
    ("monitor", "server"),
    ("move", "generic"),
    ("mset", "string"),
    ("msetnx", "string"),
    ("multi", "transactions"),
    ("object", "generic"),
    ("persist", "generic"),
    ("pexpire", "generic"),
    ("pexpireat", "generic"),
    ("pexpiretime", "generic"),
    ("pfadd", "hyperloglog"),
    ("pfcount", "hyperloglog"),
    ("pfdebug", "hyperloglog"),
    ("pfmerge", "hyperloglog"),
    ("pfselftest", "hyperloglog"),
    ("ping", "connection"),
    ("psetex", "string"),
    ("psubscribe", "pubsub"),
    ("psync", "server"),
    ("pttl", "generic"),
    ("publish", "pubsub"),
    ("pubsub", "pubsub"),
    ("punsubscribe", "pubsub"),
    ("quit", "connection"),
    ("randomkey", "generic"),
    ("readonly", "cluster"),
    ("readwrite", "cluster"),
    ("rename", "generic"),
    ("renamenx", "generic"),
    ("replconf", "server"),
    ("replicaof", "server"),
    ("reset", "connection"),
    ("restore", "generic"),
    ("restore-asking", "server"),
    ("role", "server"),
    ("rpop", "list"),
    ("rpoplpush", "list"),
    ("rpush", "list"),
    ("rpushx", "list"),
    ("sadd", "set"),
    ("save", "server"),
    ("scan", "generic"),
    ("scard", "set"),
    ("script", "scripting"),
    ("sdiff", "set"),
    ("sdiffstore", "set"),
    ("select", "connection"),
    ("set", "string"),
    ("setbit", "bitmap"),
    ("setex", "string"),
    ("setnx", "string"),
    ("setrange", "string"),
    ("shutdown", "server"),
    ("sinter", "set"),
    ("sintercard", "set"),
    ("sinterstore", "set"),
    ("sismember", "set"),
    ("slaveof", "server"),
    ("slowlog", "server"),
    ("smembers", "set"),
    ("smismember", "set"),
    ("smove", "set"),
    ("sort", "generic"),
    ("sort_ro", "generic"),
    ("spop", "set"),
    ("spublish", "pubsub"),
    ("srandmember", "set"),
    ("srem", "set"),
    ("sscan", "set"),
    ("ssubscribe", "pubsub"),
    ("strlen", "string"),
    ("subscribe", "pubsub"),
    ("substr", "string"),
    ("sunion", "set"),
    ("sunionstore", "set"),
    ("sunsubscribe", "pubsub"),
    ("swapdb", "server"),
    ("sync", "server"),
    ("time", "server"),
    ("touch", "generic"),
    ("ttl", "generic"),
    ("type", "generic"),
    ("unlink", "generic"),
    ("unsubscribe", "pubsub"),
    ("unwatch", "transactions"),
    ("wait", "generic"),
    ("waitaof", "generic"),
    ("watch", "transactions"),
    ("xack", "stream"),
    ("xadd", "stream"),
    ("xautoclaim", "stream"),
    ("xclaim", "stream"),
    ("xdel", "stream"),
    ("xgroup", "stream"),
    ("xinfo", "stream"),
    ("xlen", "stream"),
    ("xpending", "stream"),
    ("xrange", "stream"),
    ("xread", "stream"),
    ("xreadgroup", "stream"),
    ("xrevrange", "stream"),
    ("xsetid", "stream"),
    ("xtrim", "stream"),
    ("zadd", "sorted-set"),
    ("zcard", "sorted-set"),
    ("zcount", "sorted-set"),
    ("zdiff", "sorted-set"),
    ("zdiffstore", "sorted-set"),
    ("zincrby", "sorted-set"),
    ("zinter", "sorted-set"),
    ("zintercard", "sorted-set"),
    ("zinterstore", "sorted-set"),
    ("zlexcount", "sorted-set"),
    ("zmpop", "sorted-set"),
    ("zmscore", "sorted-set"),
    ("zpopmax", "sorted-set"),
    ("zpopmin", "sorted-set"),
    ("zrandmember", "sorted-set"),
    ("zrange", "sorted-set"),
    ("zrangebylex", "sorted-set"),
    ("zrangebyscore", "sorted-set"),
    ("zrangestore", "sorted-set"),
    ("zrank", "sorted-set"),
    ("zrem", "sorted-set"),
    ("zremrangebylex", "sorted-set"),
    ("zremrangebyrank", "sorted-set"),
    ("zremrangebyscore", "sorted-set"),
    ("zrevrange", "sorted-set"),
    ("zrevrangebylex", "sorted-set"),
    ("zrevrangebyscore", "sorted-set"),
    ("zrevrank", "sorted-set"),
    ("zscan", "sorted-set"),
    ("zscore", "sorted-set"),
    ("zunion", "sorted-set"),
    ("zunionstore", "sorted-set"),
];

/// What a command of the table lacks compared with Redis 7.2 (hand-written; a unit test
/// checks every name is in the table).
pub const PARTIAL: &[(&str, &str)] = &[
    ("bgsave", "flushes and syncs every shard before replying (no RDB file: the data devices are the persistent copy)"),
    ("client", "ID, GETNAME, SETNAME, SETINFO, INFO, LIST, KILL, UNBLOCK, NO-EVICT, NO-TOUCH, TRACKING, CACHING, GETREDIR, TRACKINGINFO only: no PAUSE, UNPAUSE, REPLY"),
    ("command", "COMMAND, COUNT, DOCS, INFO, LIST only: no GETKEYS, GETKEYSANDFLAGS"),
    ("config", "GET, SET, RESETSTAT, REWRITE on the parameters lavik has only (REWRITE writes the runtime-settable ones)"),
    ("debug", "only DEBUG SLEEP"),
    ("spublish", "COMMAND reports no key position for the shard channel (Redis: 1 1 1, flag not_key); no cluster slot check"),
    ("ssubscribe", "COMMAND reports no key positions for the shard channels (Redis: 1 -1 1, flag not_key); channels of any slot together"),
    ("sunsubscribe", "COMMAND reports no key positions for the shard channels (Redis: 1 -1 1, flag not_key)"),
    ("latency", "events are command, fast-command and lavik-commit; GRAPH and DOCTOR are lavik's own renderings"),
    ("memory", "USAGE counts RAM only (index share and expiry entry; values live on the device); MALLOC-STATS answers as Redis on libc malloc"),
    ("object", "FREQ always errs (no LFU), IDLETIME is 0 (no access times kept), REFCOUNT is Redis's figure for the same value"),
    ("sort", "BY/GET patterns as in Redis Cluster: a BY pattern with `*` and a GET pattern other than `#` must hash to the sorted key's slot (a hash tag, e.g. `{k}:w_*` for key `{k}`), else refused with Redis 7.4.2's cluster error (lavik refuses also outside cluster mode); their keys are read synchronously (not prefetched; counted in lavik_sync_reads); a set with BY nosort is returned sorted (ALPHA)"),
    ("sort_ro", "BY/GET patterns as in Redis Cluster (see SORT); a set with BY nosort is returned sorted (ALPHA)"),
    ("save", "flushes and syncs every shard (no RDB file: the data devices are the persistent copy)"),
    ("touch", "counts the existing keys; lavik keeps no access times (no LRU/LFU)"),
];

/// Order of the groups in the document (Redis's group names).
const GROUPS: &[&str] = &[
    "string",
    "bitmap",
    "hash",
    "list",
    "set",
    "sorted-set",
    "hyperloglog",
    "geo",
    "stream",
    "generic",
    "pubsub",
    "transactions",
    "scripting",
    "connection",
    "server",
    "cluster",
];

fn status(name: &str) -> (&'static str, String) {
    match TABLE.iter().find(|c| c.name == name) {
        None => ("not supported", String::new()),
        Some(_) => match PARTIAL.iter().find(|p| p.0 == name) {
            Some((_, what)) => ("partial", (*what).to_string()),
            None => ("supported", String::new()),
        },
    }
}

/// The text of `docs/commands.md`.
pub fn render() -> String {
    let mut out = String::new();
    let supported = REDIS_COMMANDS
        .iter()
        .filter(|c| status(c.0).0 == "supported")
        .count();
    let partial = REDIS_COMMANDS
        .iter()
        .filter(|c| status(c.0).0 == "partial")
        .count();
    let own: Vec<_> = TABLE
        .iter()
        .filter(|c| !REDIS_COMMANDS.iter().any(|r| r.0 == c.name))
        .collect();
    let _ = writeln!(out, "# Command reference");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Generated from the command table (`src/commands/table.rs`) by `lavik --command-reference`;"
    );
    let _ = writeln!(
        out,
        "do not edit by hand (a unit test in `src/tools/commands_doc.rs` fails when they disagree)."
    );
    let _ = writeln!(
        out,
        "Every top-level Redis 7.2 command by its Redis group. *Supported* means in the command table"
    );
    let _ = writeln!(
        out,
        "and answering as Redis does (subcommands of containers such as CLIENT or CONFIG may still"
    );
    let _ = writeln!(out, "differ); *partial* says what is missing.");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Redis 7.2: {} commands, {supported} supported, {partial} partial, {} not supported; lavik's own: {}.",
        REDIS_COMMANDS.len(),
        REDIS_COMMANDS.len() - supported - partial,
        own.len()
    );
    for g in GROUPS {
        let _ = writeln!(out);
        let _ = writeln!(out, "## {g}");
        let _ = writeln!(out);
        let _ = writeln!(out, "| command | status | notes |");
        let _ = writeln!(out, "|---|---|---|");
        for (name, _) in REDIS_COMMANDS.iter().filter(|c| c.1 == *g) {
            let (st, note) = status(name);
            let _ = writeln!(out, "| {} | {st} | {note} |", name.to_uppercase());
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "## lavik's own commands");
    let _ = writeln!(out);
    let _ = writeln!(out, "| command | group | summary |");
    let _ = writeln!(out, "|---|---|---|");
    for c in own {
        let summary = c.summary.trim_start_matches("lavik: ");
        let _ = writeln!(
            out,
            "| {} | {} | {summary} |",
            c.name.to_uppercase(),
            c.group
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves docs/commands.md is exactly what the command table generates (set LAVIK_WRITE_DOCS=1 to rewrite it).
    #[test]
    fn commands_md_matches_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md");
        let want = render();
        if std::env::var_os("LAVIK_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/commands.md is stale: run `LAVIK_WRITE_DOCS=1 cargo test --lib tools::commands_doc`"
        );
    }

    // Proves the hand-written notes and the Redis list are consistent with the table and each other.
    #[test]
    fn lists_are_consistent() {
        for (name, _) in PARTIAL {
            assert!(
                TABLE.iter().any(|c| c.name == *name),
                "{name} is not in the table"
            );
        }
        for (i, (name, group)) in REDIS_COMMANDS.iter().enumerate() {
            assert!(GROUPS.contains(group), "{name}: unknown group {group}");
            assert!(
                !REDIS_COMMANDS[i + 1..].iter().any(|c| c.0 == *name),
                "{name} twice"
            );
        }
        // The table's own commands say so in their summary; anything else is a Redis name
        // missing from the list above.
        for c in TABLE
            .iter()
            .filter(|c| !REDIS_COMMANDS.iter().any(|r| r.0 == c.name))
        {
            assert!(
                c.summary.starts_with("lavik: "),
                "{}: not in the Redis list",
                c.name
            );
        }
        let text = render();
        assert!(text.contains("| GET | supported |  |"));
        assert!(text.contains("| LPUSH | supported |  |"));
        assert!(text.contains("| XADD | not supported |  |"));
        assert!(text.contains("| DEFRAG | server |"));
    }
}
