//! What ACL rules name: command ids, subcommands, categories and the key
//! access each command's key arguments need.
//!
//! Every command of `commands::TABLE` gets the id of its table index; the
//! subcommands of the containers lavik has (CLIENT, CONFIG, COMMAND,
//! SLOWLOG, ACL) follow, with Redis 7.2's full subcommand list, so a rule
//! like `+client|pause` is accepted as in Redis even where lavik answers
//! "unknown subcommand". Categories are Redis 7.2's: implied by the
//! command flags (write, readonly, admin, fast; not fast means slow) and the
//! command group (string, generic = keyspace, connection), plus a short list
//! of commands whose JSON file adds more (`EXTRA_CATEGORIES`). Containers
//! carry only `@slow` (COMMAND also `@connection`), like Redis's.

use crate::commands::{CommandSpec, TABLE};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Redis's category names in its order (`ACL CAT` and `COMMAND INFO` list them so).
pub const CATEGORIES: [&str; 21] = [
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "hyperloglog",
    "geo",
    "stream",
    "pubsub",
    "admin",
    "fast",
    "slow",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

/// The bit of category `name` (case-insensitive), or `None` if Redis has no such category.
pub fn category_bit(name: &[u8]) -> Option<u32> {
    CATEGORIES
        .iter()
        .position(|c| c.as_bytes().eq_ignore_ascii_case(name))
        .map(|i| 1u32 << i)
}

fn cat(name: &str) -> u32 {
    category_bit(name.as_bytes()).expect("known category")
}

/// Category names of a bit set, in Redis's order.
pub fn category_names(bits: u32) -> Vec<&'static str> {
    CATEGORIES
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Commands whose Redis JSON file lists categories the flags and group do not imply.
const EXTRA_CATEGORIES: &[(&str, &[&str])] = &[
    ("keys", &["dangerous"]),
    ("dbsize", &["keyspace"]),
    ("flushdb", &["keyspace", "dangerous"]),
    ("flushall", &["keyspace", "dangerous"]),
    ("info", &["dangerous"]),
    ("lastsave", &["admin", "dangerous"]),
    ("restore", &["dangerous"]),
    ("sort", &["set", "sortedset", "list", "dangerous"]),
    ("sort_ro", &["set", "sortedset", "list", "dangerous"]),
];

/// Subcommands of lavik's containers, as Redis 7.2 defines them, with their categories.
const ADMIN_SUB: &[&str] = &["admin", "slow", "dangerous"];
const ADMIN_CONN_SUB: &[&str] = &["admin", "slow", "dangerous", "connection"];
const CONN_SUB: &[&str] = &["slow", "connection"];
const SLOW_SUB: &[&str] = &["slow"];
const READ_SUB: &[&str] = &["read", "slow"];
const KEYSPACE_READ_SUB: &[&str] = &["keyspace", "read", "slow"];
const KEYSPACE_SUB: &[&str] = &["keyspace", "slow"];
const SCRIPTING_SUB: &[&str] = &["slow", "scripting"];
const SCRIPTING_WRITE_SUB: &[&str] = &["write", "slow", "scripting"];
const PUBSUB_SUB: &[&str] = &["pubsub", "slow"];
/// A subcommand name, its arity (Redis's, counting the container and the subcommand)
/// and its category names.
type Subcommand = (&'static str, i32, &'static [&'static str]);
const SUBCOMMANDS: &[(&str, &[Subcommand])] = &[
    (
        "client",
        &[
            ("caching", 3, CONN_SUB),
            ("getname", 2, CONN_SUB),
            ("getredir", 2, CONN_SUB),
            ("help", 2, CONN_SUB),
            ("id", 2, CONN_SUB),
            ("info", 2, CONN_SUB),
            ("kill", -3, ADMIN_CONN_SUB),
            ("list", -2, ADMIN_CONN_SUB),
            ("no-evict", 3, ADMIN_CONN_SUB),
            ("no-touch", 3, CONN_SUB),
            ("pause", -3, ADMIN_CONN_SUB),
            ("reply", 3, CONN_SUB),
            ("setinfo", 4, CONN_SUB),
            ("setname", 3, CONN_SUB),
            ("tracking", -3, CONN_SUB),
            ("trackinginfo", 2, CONN_SUB),
            ("unblock", -3, ADMIN_CONN_SUB),
            ("unpause", 2, ADMIN_CONN_SUB),
        ],
    ),
    (
        "config",
        &[
            ("get", -3, ADMIN_SUB),
            ("help", 2, SLOW_SUB),
            ("resetstat", 2, ADMIN_SUB),
            ("rewrite", 2, ADMIN_SUB),
            ("set", -4, ADMIN_SUB),
        ],
    ),
    (
        "command",
        &[
            ("count", 2, CONN_SUB),
            ("docs", -2, CONN_SUB),
            ("getkeys", -4, CONN_SUB),
            ("getkeysandflags", -4, CONN_SUB),
            ("help", 2, CONN_SUB),
            ("info", -2, CONN_SUB),
            ("list", -2, CONN_SUB),
        ],
    ),
    (
        "script",
        &[
            ("debug", 3, SCRIPTING_SUB),
            ("exists", -3, SCRIPTING_SUB),
            ("flush", -2, SCRIPTING_SUB),
            ("help", 2, SCRIPTING_SUB),
            ("kill", 2, SCRIPTING_SUB),
            ("load", 3, SCRIPTING_SUB),
        ],
    ),
    (
        "function",
        &[
            ("delete", 3, SCRIPTING_WRITE_SUB),
            ("dump", 2, SCRIPTING_SUB),
            ("flush", -2, SCRIPTING_WRITE_SUB),
            ("help", 2, SCRIPTING_SUB),
            ("kill", 2, SCRIPTING_SUB),
            ("list", -2, SCRIPTING_SUB),
            ("load", -3, SCRIPTING_WRITE_SUB),
            ("restore", -3, SCRIPTING_WRITE_SUB),
            ("stats", 2, SCRIPTING_SUB),
        ],
    ),
    (
        "object",
        &[
            ("encoding", 3, KEYSPACE_READ_SUB),
            ("freq", 3, KEYSPACE_READ_SUB),
            ("help", 2, KEYSPACE_SUB),
            ("idletime", 3, KEYSPACE_READ_SUB),
            ("refcount", 3, KEYSPACE_READ_SUB),
        ],
    ),
    (
        "pubsub",
        &[
            ("channels", -2, PUBSUB_SUB),
            ("help", 2, SLOW_SUB),
            ("numpat", 2, PUBSUB_SUB),
            ("numsub", -2, PUBSUB_SUB),
            ("shardchannels", -2, PUBSUB_SUB),
            ("shardnumsub", -2, PUBSUB_SUB),
        ],
    ),
    (
        "memory",
        &[
            ("doctor", 2, SLOW_SUB),
            ("help", 2, SLOW_SUB),
            ("malloc-stats", 2, SLOW_SUB),
            ("purge", 2, SLOW_SUB),
            ("stats", 2, SLOW_SUB),
            ("usage", -3, READ_SUB),
        ],
    ),
    (
        "latency",
        &[
            ("doctor", 2, ADMIN_SUB),
            ("graph", 3, ADMIN_SUB),
            ("help", 2, SLOW_SUB),
            ("histogram", -2, ADMIN_SUB),
            ("history", 3, ADMIN_SUB),
            ("latest", 2, ADMIN_SUB),
            ("reset", -2, ADMIN_SUB),
        ],
    ),
    (
        "slowlog",
        &[
            ("get", -2, ADMIN_SUB),
            ("help", 2, SLOW_SUB),
            ("len", 2, ADMIN_SUB),
            ("reset", 2, ADMIN_SUB),
        ],
    ),
    (
        "acl",
        &[
            ("cat", -2, SLOW_SUB),
            ("deluser", -3, ADMIN_SUB),
            ("dryrun", -4, ADMIN_SUB),
            ("genpass", -2, SLOW_SUB),
            ("getuser", 3, ADMIN_SUB),
            ("help", 2, SLOW_SUB),
            ("list", 2, ADMIN_SUB),
            ("load", 2, ADMIN_SUB),
            ("log", -2, ADMIN_SUB),
            ("save", 2, ADMIN_SUB),
            ("setuser", -3, ADMIN_SUB),
            ("users", 2, ADMIN_SUB),
            ("whoami", 2, SLOW_SUB),
        ],
    ),
];

/// Commands Redis flags `no_auth`: an ACL never stops them (they have no keys).
const NO_AUTH: &[&str] = &["auth", "hello", "quit", "reset"];

/// One command or subcommand as ACL rules see it.
#[derive(Debug)]
pub struct AclCommand {
    /// `get`, or `config|get` for a subcommand.
    pub fullname: String,
    pub arity: i32,
    pub parent: Option<usize>,
    pub subcommands: Vec<usize>,
    pub categories: u32,
    pub no_auth: bool,
}

#[derive(Debug)]
pub struct Catalog {
    pub commands: Vec<AclCommand>,
    by_name: HashMap<String, usize>,
}

/// Command ids are indices into this many bits; the last bit is reserved for
/// "commands added later", which only `+@all` sets (as in Redis).
/// (512: the table plus subcommands passed 255 with SORT/SORT_RO.)
pub const COMMAND_BITS: usize = 512;

fn top_categories(spec: &CommandSpec) -> u32 {
    if SUBCOMMANDS.iter().any(|(c, _)| *c == spec.name) {
        return if spec.name == "command" {
            cat("slow") | cat("connection")
        } else {
            cat("slow")
        };
    }
    let mut bits = match spec.group {
        "string" => cat("string"),
        // SORT's JSON names its value types instead of @keyspace (EXTRA_CATEGORIES).
        "generic" if !matches!(spec.name, "sort" | "sort_ro") => cat("keyspace"),
        "connection" => cat("connection"),
        "hash" => cat("hash"),
        "set" => cat("set"),
        "bitmap" => cat("bitmap"),
        "hyperloglog" => cat("hyperloglog"),
        "scripting" => cat("scripting"),
        "list" => cat("list"),
        "sorted_set" | "sorted-set" => cat("sortedset"),
        "geo" => cat("geo"),
        "stream" => cat("stream"),
        "pubsub" => cat("pubsub"),
        "transactions" => cat("transaction"),
        _ => 0,
    };
    for (name, extra) in EXTRA_CATEGORIES {
        if *name == spec.name {
            bits |= extra.iter().map(|c| cat(c)).fold(0, |a, b| a | b);
        }
    }
    for flag in spec.flags {
        bits |= match *flag {
            "write" => cat("write"),
            // As Redis: scripting commands are not @read although flagged readonly.
            "readonly" if spec.group != "scripting" => cat("read"),
            "admin" => cat("admin") | cat("dangerous"),
            "fast" => cat("fast"),
            "blocking" => cat("blocking"),
            _ => 0,
        };
    }
    if bits & cat("fast") == 0 {
        bits |= cat("slow");
    }
    bits
}

impl Catalog {
    fn build() -> Catalog {
        let mut commands: Vec<AclCommand> = TABLE
            .iter()
            .map(|spec| AclCommand {
                fullname: spec.name.to_string(),
                arity: spec.arity,
                parent: None,
                subcommands: Vec::new(),
                categories: top_categories(spec),
                no_auth: NO_AUTH.contains(&spec.name),
            })
            .collect();
        for (container, subs) in SUBCOMMANDS {
            let Some(parent) = TABLE.iter().position(|c| c.name == *container) else {
                continue;
            };
            for (sub, arity, cats) in *subs {
                let id = commands.len();
                commands.push(AclCommand {
                    fullname: format!("{container}|{sub}"),
                    arity: *arity,
                    parent: Some(parent),
                    subcommands: Vec::new(),
                    categories: cats.iter().map(|c| cat(c)).fold(0, |a, b| a | b),
                    no_auth: false,
                });
                commands[parent].subcommands.push(id);
            }
        }
        assert!(commands.len() < COMMAND_BITS, "command ids fit the bitmap");
        let by_name = commands
            .iter()
            .enumerate()
            .map(|(i, c)| (c.fullname.clone(), i))
            .collect();
        Catalog { commands, by_name }
    }

    /// The id of `name` (`get`, `config|get`), case-insensitive, as Redis's
    /// `lookupCommandBySds`: more than one `|` or a `|` after a command without
    /// subcommands finds nothing.
    pub fn lookup(&self, name: &[u8]) -> Option<usize> {
        let lower = String::from_utf8_lossy(name).to_ascii_lowercase();
        self.by_name.get(&lower).copied()
    }

    /// The id a call runs as: the subcommand of a container, or the command.
    /// `None` for an unknown subcommand (the handler replies with Redis's
    /// "unknown subcommand" error, which comes before any ACL check in Redis).
    pub fn resolve(&self, table_index: usize, args: &[&[u8]]) -> Option<usize> {
        let cmd = &self.commands[table_index];
        if cmd.subcommands.is_empty() {
            return Some(table_index);
        }
        // COMMAND alone runs the container itself (the others need a subcommand by arity).
        let Some(sub) = args.get(1) else {
            return Some(table_index);
        };
        let mut name = cmd.fullname.clone().into_bytes();
        name.push(b'|');
        name.extend_from_slice(sub);
        self.lookup(&name)
    }
}

/// Redis checks a subcommand's arity before its permissions:
/// `ERR wrong number of arguments for 'config|get' command` for everyone.
pub fn subcommand_arity_error(spec: &CommandSpec, args: &[&[u8]]) -> Option<String> {
    if !SUBCOMMANDS.iter().any(|(c, _)| *c == spec.name) || args.len() < 2 {
        return None;
    }
    let cat = catalog();
    let table_index = TABLE.iter().position(|c| std::ptr::eq(c, spec))?;
    let sub = &cat.commands[cat.resolve(table_index, args)?];
    let n = args.len() as i64;
    let arity = sub.arity as i64;
    ((arity > 0 && n != arity) || (arity < 0 && n < -arity)).then(|| {
        format!(
            "ERR wrong number of arguments for '{}' command",
            sub.fullname
        )
    })
}

pub fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(Catalog::build)
}

/// The key needs read access (the key spec's `access` flag).
pub const KEY_READ: u8 = 1;
/// The key needs write access (`insert`, `update` or `delete`).
pub const KEY_WRITE: u8 = 2;

/// The access the key at `ordinal` (0 = first key argument) of `name` needs,
/// from Redis 7.2's key specs. Some specs (STRLEN, EXISTS, TYPE, TOUCH) name
/// no access at all: any pattern that matches the key allows them.
pub fn key_access(name: &str, ordinal: usize, args: &[&[u8]]) -> u8 {
    const R: u8 = KEY_READ;
    const W: u8 = KEY_WRITE;
    match name {
        "get" | "mget" | "getrange" | "substr" | "lcs" | "ttl" | "pttl" | "expiretime"
        | "pexpiretime" | "dump" | "watch" => R,
        "strlen" | "exists" | "touch" | "type" | "zcard" => 0,
        // Sorted sets (Redis 7.2 key specs): reads are RO ACCESS; ZADD/ZREM/ZREMRANGEBY*
        // only update; the pops and ZINCRBY read what they change; a *STORE's destination
        // (the first key) is written, its sources read.
        "zscore" | "zmscore" | "zrank" | "zrevrank" | "zcount" | "zlexcount" | "zrange"
        | "zrangebyscore" | "zrevrangebyscore" | "zrangebylex" | "zrevrangebylex" | "zrevrange"
        | "zrandmember" | "zunion" | "zinter" | "zdiff" | "zintercard" | "zscan" => R,
        "zincrby" | "zpopmin" | "zpopmax" | "zmpop" => R | W,
        "blpop" | "brpop" | "blmpop" | "bzpopmin" | "bzpopmax" | "bzmpop" => R | W,
        "blmove" | "brpoplpush" => {
            if ordinal == 0 {
                R | W
            } else {
                W
            }
        }
        "zrangestore" | "zunionstore" | "zinterstore" | "zdiffstore" | "geosearchstore" => {
            if ordinal == 0 {
                W
            } else {
                R
            }
        }
        "llen" | "lindex" | "lrange" | "lpos" => R,
        "getset" | "getdel" | "getex" | "incr" | "decr" | "incrby" | "decrby" | "incrbyfloat" => {
            R | W
        }
        // SET's flags vary: with GET it reads the key too.
        "set" => {
            if args.iter().skip(3).any(|a| a.eq_ignore_ascii_case(b"get")) {
                R | W
            } else {
                W
            }
        }
        "rename" | "renamenx" => {
            if ordinal == 0 {
                R | W
            } else {
                W
            }
        }
        "copy" => {
            if ordinal == 0 {
                R
            } else {
                W
            }
        }
        // SORT's key is read; its STORE destination (the first key position when there
        // is one, `key_positions`) is written.
        "sort_ro" => R,
        "sort" => {
            if ordinal == 0 && crate::commands::sort::store_position(args).is_some() {
                W
            } else {
                R
            }
        }
        _ => W,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cats(name: &str) -> Vec<&'static str> {
        let c = catalog();
        category_names(c.commands[c.lookup(name.as_bytes()).unwrap()].categories)
    }

    // Categories match what Redis 7.2's COMMAND INFO reports for a sample of each shape.
    #[test]
    fn categories_as_redis() {
        assert_eq!(cats("get"), ["read", "string", "fast"]);
        assert_eq!(cats("set"), ["write", "string", "slow"]);
        assert_eq!(cats("multi"), ["fast", "transaction"]);
        assert_eq!(cats("exec"), ["slow", "transaction"]);
        assert_eq!(cats("watch"), ["fast", "transaction"]);
        assert_eq!(cats("del"), ["keyspace", "write", "slow"]);
        assert_eq!(cats("keys"), ["keyspace", "read", "slow", "dangerous"]);
        assert_eq!(cats("dbsize"), ["keyspace", "read", "fast"]);
        assert_eq!(cats("flushall"), ["keyspace", "write", "slow", "dangerous"]);
        assert_eq!(cats("ping"), ["fast", "connection"]);
        assert_eq!(cats("client"), ["slow"]);
        assert_eq!(cats("command"), ["slow", "connection"]);
        assert_eq!(cats("info"), ["slow", "dangerous"]);
        assert_eq!(cats("time"), ["fast"]);
        assert_eq!(cats("lastsave"), ["admin", "fast", "dangerous"]);
        assert_eq!(cats("debug"), ["admin", "slow", "dangerous"]);
        assert_eq!(cats("config|get"), ["admin", "slow", "dangerous"]);
        assert_eq!(cats("client|id"), ["slow", "connection"]);
        assert_eq!(cats("acl|whoami"), ["slow"]);
        assert_eq!(cats("lpush"), ["write", "list", "fast"]);
        assert_eq!(cats("lindex"), ["read", "list", "slow"]);
        assert_eq!(cats("lmpop"), ["write", "list", "slow"]);
        assert_eq!(cats("blpop"), ["write", "list", "slow", "blocking"]);
        assert_eq!(cats("bzpopmin"), ["write", "sortedset", "fast", "blocking"]);
    }

    // Lookup is case-insensitive, finds subcommands, and rejects nonsense as Redis does.
    #[test]
    fn lookup_shapes() {
        let c = catalog();
        assert!(c.lookup(b"GET").is_some());
        assert!(c.lookup(b"Config|Get").is_some());
        assert!(c.lookup(b"config|nope").is_none());
        assert!(c.lookup(b"get|x").is_none());
        assert!(c.lookup(b"config|get|x").is_none());
        let config = TABLE.iter().position(|s| s.name == "config").unwrap();
        let id = c.resolve(config, &[b"config", b"GET", b"x"]).unwrap();
        assert_eq!(c.commands[id].fullname, "config|get");
        assert_eq!(c.resolve(config, &[b"config", b"bogus"]), None);
        let command = TABLE.iter().position(|s| s.name == "command").unwrap();
        assert_eq!(c.resolve(command, &[b"command"]), Some(command));
    }

    // Key access follows the key specs, SET's depending on its GET option.
    #[test]
    fn key_access_per_spec() {
        assert_eq!(key_access("get", 0, &[]), KEY_READ);
        let sort_store: &[&[u8]] = &[b"sort", b"k", b"STORE", b"d"];
        assert_eq!(key_access("sort", 0, sort_store), KEY_WRITE);
        assert_eq!(key_access("sort", 1, sort_store), KEY_READ);
        assert_eq!(key_access("sort", 0, &[b"sort", b"k"]), KEY_READ);
        assert_eq!(key_access("sort_ro", 0, &[b"sort_ro", b"k"]), KEY_READ);
        assert_eq!(key_access("set", 0, &[b"set", b"k", b"v"]), KEY_WRITE);
        assert_eq!(
            key_access("set", 0, &[b"set", b"k", b"v", b"GET"]),
            KEY_READ | KEY_WRITE
        );
        assert_eq!(key_access("copy", 0, &[]), KEY_READ);
        assert_eq!(key_access("copy", 1, &[]), KEY_WRITE);
        assert_eq!(key_access("exists", 0, &[]), 0);
        assert_eq!(key_access("incr", 0, &[]), KEY_READ | KEY_WRITE);
    }
}
