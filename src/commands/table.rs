//! The command table: every command lavik knows, with the facts Redis's
//! `COMMAND` reports (arity, flags, key positions) and its handler.

use super::{
    bitmap as b, blocking as bl, dump as d, geo as g, hash as h, hyperloglog as hl, keyspace as k,
    list as l, scripting as sc, set as st, sort as so, string as s, zset as z, Handler,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Touches the keys at the given positions; runs where they live.
    Keyed,
    /// Touches every shard (KEYS, SCAN, DBSIZE, FLUSHALL, ...).
    AllShards,
    /// Connection or server command, run by the connection's worker.
    Local,
}

pub struct CommandSpec {
    pub name: &'static str,
    pub arity: i32,
    pub flags: &'static [&'static str],
    pub first_key: i32,
    pub last_key: i32,
    pub step: i32,
    pub group: &'static str,
    pub since: &'static str,
    pub summary: &'static str,
    pub kind: Kind,
    pub handler: Option<Handler>,
    /// Keys counted by an argument (Redis's `movablekeys`), instead of first/last/step.
    pub movable: Option<Movable>,
}

/// "The argument at `numkeys_at` says how many keys follow it" (EVAL, EVALSHA, FCALL: 2),
/// plus a fixed key before it for the commands that store (ZUNIONSTORE: `dest_at` 1).
/// `sort_store`: instead, SORT's shape — the key at 1 plus the argument after a STORE
/// keyword found by scanning the options (`sort::store_position`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Movable {
    pub numkeys_at: usize,
    pub dest_at: Option<usize>,
    pub sort_store: bool,
}

impl CommandSpec {
    /// Whether running this command may write (acknowledged writes wait for durability).
    pub fn may_write(&self) -> bool {
        self.flags.contains(&"write") || self.flags.contains(&"may_replicate")
    }
}

const W: &[&str] = &["write", "denyoom"];
const WF: &[&str] = &["write", "denyoom", "fast"];
const RF: &[&str] = &["readonly", "fast"];
const R: &[&str] = &["readonly"];
const WD: &[&str] = &["write"];
const WDF: &[&str] = &["write", "fast"];
const FAST: &[&str] = &["fast"];
const LOADING_STALE: &[&str] = &["noscript", "loading", "stale", "fast"];
const ADMIN: &[&str] = &["admin", "noscript", "loading", "stale"];
const PFDEBUG: &[&str] = &["write", "denyoom", "admin"];
const LOADING_STALE_SLOW: &[&str] = &["loading", "stale"];
const LOADING_STALE_FAST: &[&str] = &["loading", "stale", "fast"];
const EVAL: &[&str] = &[
    "noscript",
    "stale",
    "skip_monitor",
    "may_replicate",
    "no_mandatory_keys",
    "movablekeys",
];
const EVAL_RO: &[&str] = &[
    "readonly",
    "noscript",
    "stale",
    "skip_monitor",
    "no_mandatory_keys",
    "movablekeys",
];
const SCRIPT: &[&str] = &["noscript"];
/// FCALL: Redis 7.0's flags plus `may_replicate`, which lavik's group commit reads (a
/// function's writes, like EVAL's, wait for durability before the reply). COMMAND INFO
/// FCALL therefore shows one flag more than Redis 7.0.15 does.
const FCALL: &[&str] = &[
    "noscript",
    "stale",
    "skip_monitor",
    "may_replicate",
    "no_mandatory_keys",
    "movablekeys",
];
const FUNCTION: &[&str] = &[];
const ZR_MOVABLE: &[&str] = &["readonly", "movablekeys"];
const ZW_MOVABLE: &[&str] = &["write", "movablekeys"];
const ZWD_MOVABLE: &[&str] = &["write", "denyoom", "movablekeys"];
const SORT_FLAGS: &[&str] = &["write", "denyoom", "movablekeys"];
const SORT_RO_FLAGS: &[&str] = &["readonly", "movablekeys"];
const LMPOP: &[&str] = &["write", "movablekeys"];
const BLOCK_W: &[&str] = &["write", "noscript", "blocking"];
const BLOCK_WD: &[&str] = &["write", "denyoom", "noscript", "blocking"];
const BLOCK_WF: &[&str] = &["write", "noscript", "blocking", "fast"];
const BLOCK_MOVABLE: &[&str] = &["write", "blocking", "movablekeys"];
const TXN: &[&str] = &["noscript", "loading", "stale", "fast", "allow_busy"];
const EXEC: &[&str] = &["noscript", "loading", "stale", "skip_slowlog"];
const PUBSUB_SUB: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const PUBSUB_PUB: &[&str] = &["pubsub", "loading", "stale", "fast"];
const CONTAINER: &[&str] = &[];

macro_rules! keyed {
    ($name:expr, $arity:expr, $flags:expr, $f:expr, $l:expr, $st:expr, $group:expr, $since:expr, $sum:expr, $h:expr) => {
        CommandSpec {
            name: $name,
            arity: $arity,
            flags: $flags,
            first_key: $f,
            last_key: $l,
            step: $st,
            group: $group,
            since: $since,
            summary: $sum,
            kind: Kind::Keyed,
            handler: Some($h),
            movable: None,
        }
    };
}
/// A keyed command whose keys follow a numkeys argument at `$at` (movable keys).
macro_rules! keyed_numkeys {
    ($name:expr, $arity:expr, $flags:expr, $at:expr, $group:expr, $since:expr, $sum:expr, $h:expr) => {
        CommandSpec {
            name: $name,
            arity: $arity,
            flags: $flags,
            first_key: 0,
            last_key: 0,
            step: 0,
            group: $group,
            since: $since,
            summary: $sum,
            kind: Kind::Keyed,
            handler: Some($h),
            movable: Some(Movable {
                numkeys_at: $at,
                dest_at: None,
                sort_store: false,
            }),
        }
    };
}
/// Movable keys with a destination key at 1 and numkeys at 2 (ZUNIONSTORE and friends).
macro_rules! keyed_dest_numkeys {
    ($name:expr, $arity:expr, $flags:expr, $group:expr, $since:expr, $sum:expr, $h:expr) => {
        CommandSpec {
            name: $name,
            arity: $arity,
            flags: $flags,
            first_key: 0,
            last_key: 0,
            step: 0,
            group: $group,
            since: $since,
            summary: $sum,
            kind: Kind::Keyed,
            handler: Some($h),
            movable: Some(Movable {
                numkeys_at: 2,
                dest_at: Some(1),
                sort_store: false,
            }),
        }
    };
}
/// SORT and SORT_RO: the key at 1 (first/last/step 1 1 1, as COMMAND reports) and, for
/// SORT, a STORE destination found by keyword (movable keys).
macro_rules! keyed_sort {
    ($name:expr, $flags:expr, $since:expr, $sum:expr, $h:expr) => {
        CommandSpec {
            name: $name,
            arity: -2,
            flags: $flags,
            first_key: 1,
            last_key: 1,
            step: 1,
            group: "generic",
            since: $since,
            summary: $sum,
            kind: Kind::Keyed,
            handler: Some($h),
            movable: Some(Movable {
                numkeys_at: 0,
                dest_at: None,
                sort_store: true,
            }),
        }
    };
}
macro_rules! all {
    ($name:expr, $arity:expr, $flags:expr, $group:expr, $since:expr, $sum:expr, $h:expr) => {
        CommandSpec {
            name: $name,
            arity: $arity,
            flags: $flags,
            first_key: 0,
            last_key: 0,
            step: 0,
            group: $group,
            since: $since,
            summary: $sum,
            kind: Kind::AllShards,
            handler: Some($h),
            movable: None,
        }
    };
}
macro_rules! local {
    ($name:expr, $arity:expr, $flags:expr, $group:expr, $since:expr, $sum:expr) => {
        CommandSpec {
            name: $name,
            arity: $arity,
            flags: $flags,
            first_key: 0,
            last_key: 0,
            step: 0,
            group: $group,
            since: $since,
            summary: $sum,
            kind: Kind::Local,
            handler: None,
            movable: None,
        }
    };
}

pub static TABLE: &[CommandSpec] = &[
    // strings
    keyed!("get", 2, RF, 1, 1, 1, "string", "1.0.0", "Returns the string value of a key.", s::get),
    keyed!("set", -3, W, 1, 1, 1, "string", "1.0.0", "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.", s::set),
    keyed!("setnx", 3, WF, 1, 1, 1, "string", "1.0.0", "Set the string value of a key only when the key doesn't exist.", s::setnx),
    keyed!("setex", 4, W, 1, 1, 1, "string", "2.0.0", "Sets the string value and expiration time of a key. Creates the key if it doesn't exist.", s::setex),
    keyed!("psetex", 4, W, 1, 1, 1, "string", "2.6.0", "Sets both string value and expiration time in milliseconds of a key. The key is created if it doesn't exist.", s::psetex),
    keyed!("getset", 3, WF, 1, 1, 1, "string", "1.0.0", "Returns the previous string value of a key after setting it to a new value.", s::getset),
    keyed!("getdel", 2, WDF, 1, 1, 1, "string", "6.2.0", "Returns the string value of a key after deleting the key.", s::getdel),
    keyed!("getex", -2, WDF, 1, 1, 1, "string", "6.2.0", "Returns the string value of a key after setting its expiration time.", s::getex),
    keyed!("mget", -2, RF, 1, -1, 1, "string", "1.0.0", "Atomically returns the string values of one or more keys.", s::mget),
    keyed!("mset", -3, W, 1, -1, 2, "string", "1.0.1", "Atomically creates or modifies the string values of one or more keys.", s::mset),
    keyed!("msetnx", -3, W, 1, -1, 2, "string", "1.0.1", "Atomically modifies the string values of one or more keys only when all keys don't exist.", s::msetnx),
    keyed!("append", 3, WF, 1, 1, 1, "string", "2.0.0", "Appends a string to the value of a key. Creates the key if it doesn't exist.", s::append),
    keyed!("strlen", 2, RF, 1, 1, 1, "string", "2.2.0", "Returns the length of a string value.", s::strlen),
    keyed!("getrange", 4, R, 1, 1, 1, "string", "2.4.0", "Returns a substring of the string stored at a key.", s::getrange),
    keyed!("substr", 4, R, 1, 1, 1, "string", "1.0.0", "Returns a substring from a string value.", s::getrange),
    keyed!("setrange", 4, W, 1, 1, 1, "string", "2.2.0", "Overwrites a part of a string value with another by an offset. Creates the key if it doesn't exist.", s::setrange),
    keyed!("incr", 2, WF, 1, 1, 1, "string", "1.0.0", "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", s::incr),
    keyed!("decr", 2, WF, 1, 1, 1, "string", "1.0.0", "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", s::decr),
    keyed!("incrby", 3, WF, 1, 1, 1, "string", "1.0.0", "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist.", s::incrby),
    keyed!("decrby", 3, WF, 1, 1, 1, "string", "1.0.0", "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist.", s::decrby),
    keyed!("incrbyfloat", 3, WF, 1, 1, 1, "string", "2.6.0", "Increment the floating point value of a key by a number. Uses 0 as initial value if the key doesn't exist.", s::incrbyfloat),
    keyed!("lcs", -3, R, 1, 2, 1, "string", "7.0.0", "Finds the longest common substring.", s::lcs),
    // bitmaps
    keyed!("setbit", 4, W, 1, 1, 1, "bitmap", "2.2.0", "Sets or clears the bit at offset of the string value. Creates the key if it doesn't exist.", b::setbit),
    keyed!("getbit", 3, RF, 1, 1, 1, "bitmap", "2.2.0", "Returns a bit value by offset.", b::getbit),
    keyed!("bitcount", -2, R, 1, 1, 1, "bitmap", "2.6.0", "Counts the number of set bits (population counting) in a string.", b::bitcount),
    keyed!("bitpos", -3, R, 1, 1, 1, "bitmap", "2.8.7", "Finds the first set (1) or clear (0) bit in a string.", b::bitpos),
    keyed!("bitop", -4, W, 2, -1, 1, "bitmap", "2.6.0", "Performs bitwise operations on multiple strings, and stores the result.", b::bitop),
    keyed!("bitfield", -2, W, 1, 1, 1, "bitmap", "3.2.0", "Performs arbitrary bitfield integer operations on strings.", b::bitfield),
    keyed!("bitfield_ro", -2, RF, 1, 1, 1, "bitmap", "6.0.0", "Performs arbitrary read-only bitfield integer operations on strings.", b::bitfield_ro),
    // hyperloglog (PFCOUNT is readonly in Redis 7.0/7.2 although it may rewrite the cache)
    keyed!("pfadd", -2, WF, 1, 1, 1, "hyperloglog", "2.8.9", "Adds elements to a HyperLogLog key. Creates the key if it doesn't exist.", hl::pfadd),
    keyed!("pfcount", -2, R, 1, -1, 1, "hyperloglog", "2.8.9", "Returns the approximated cardinality of the set(s) observed by the HyperLogLog key(s).", hl::pfcount),
    keyed!("pfmerge", -2, W, 1, -1, 1, "hyperloglog", "2.8.9", "Merges one or more HyperLogLog values into a single key.", hl::pfmerge),
    keyed!("pfdebug", 3, PFDEBUG, 2, 2, 1, "hyperloglog", "2.8.9", "Internal commands for debugging HyperLogLog values.", hl::pfdebug),
    keyed!("pfselftest", 1, &["admin"], 0, 0, 0, "hyperloglog", "2.8.9", "An internal command for testing HyperLogLog values.", hl::pfselftest),
    // hashes
    keyed!("hset", -4, WF, 1, 1, 1, "hash", "2.0.0", "Creates or modifies the value of a field in a hash.", h::hset),
    keyed!("hsetnx", 4, WF, 1, 1, 1, "hash", "2.0.0", "Sets the value of a field in a hash only when the field doesn't exist.", h::hsetnx),
    keyed!("hmset", -4, WF, 1, 1, 1, "hash", "2.0.0", "Sets the values of multiple fields.", h::hmset),
    keyed!("hget", 3, RF, 1, 1, 1, "hash", "2.0.0", "Returns the value of a field in a hash.", h::hget),
    keyed!("hmget", -3, RF, 1, 1, 1, "hash", "2.0.0", "Returns the values of all fields in a hash.", h::hmget),
    keyed!("hdel", -3, WDF, 1, 1, 1, "hash", "2.0.0", "Deletes one or more fields and their values from a hash. Deletes the hash if no fields remain.", h::hdel),
    keyed!("hlen", 2, RF, 1, 1, 1, "hash", "2.0.0", "Returns the number of fields in a hash.", h::hlen),
    keyed!("hstrlen", 3, RF, 1, 1, 1, "hash", "3.2.0", "Returns the length of the value of a field.", h::hstrlen),
    keyed!("hexists", 3, RF, 1, 1, 1, "hash", "2.0.0", "Determines whether a field exists in a hash.", h::hexists),
    keyed!("hkeys", 2, R, 1, 1, 1, "hash", "2.0.0", "Returns all fields in a hash.", h::hkeys),
    keyed!("hvals", 2, R, 1, 1, 1, "hash", "2.0.0", "Returns all values in a hash.", h::hvals),
    keyed!("hgetall", 2, R, 1, 1, 1, "hash", "2.0.0", "Returns all fields and values in a hash.", h::hgetall),
    keyed!("hincrby", 4, WF, 1, 1, 1, "hash", "2.0.0", "Increments the integer value of a field in a hash by a number. Uses 0 as initial value if the field doesn't exist.", h::hincrby),
    keyed!("hincrbyfloat", 4, WF, 1, 1, 1, "hash", "2.6.0", "Increments the floating point value of a field by a number. Uses 0 as initial value if the field doesn't exist.", h::hincrbyfloat),
    keyed!("hrandfield", -2, R, 1, 1, 1, "hash", "6.2.0", "Returns one or more random fields from a hash.", h::hrandfield),
    keyed!("hscan", -3, R, 1, 1, 1, "hash", "2.8.0", "Iterates over fields and values of a hash.", h::hscan),
    // sets
    keyed!("sadd", -3, WF, 1, 1, 1, "set", "1.0.0", "Adds one or more members to a set. Creates the key if it doesn't exist.", st::sadd),
    keyed!("srem", -3, WDF, 1, 1, 1, "set", "1.0.0", "Removes one or more members from a set. Deletes the set if the last member was removed.", st::srem),
    keyed!("scard", 2, RF, 1, 1, 1, "set", "1.0.0", "Returns the number of members in a set.", st::scard),
    keyed!("sismember", 3, RF, 1, 1, 1, "set", "1.0.0", "Determines whether a member belongs to a set.", st::sismember),
    keyed!("smismember", -3, RF, 1, 1, 1, "set", "6.2.0", "Determines whether multiple members belong to a set.", st::smismember),
    keyed!("smembers", 2, R, 1, 1, 1, "set", "1.0.0", "Returns all members of a set.", st::smembers),
    keyed!("srandmember", -2, R, 1, 1, 1, "set", "1.0.0", "Get one or multiple random members from a set", st::srandmember),
    keyed!("spop", -2, WDF, 1, 1, 1, "set", "1.0.0", "Returns one or more random members from a set after removing them. Deletes the set if the last member was popped.", st::spop),
    keyed!("smove", 4, WDF, 1, 2, 1, "set", "1.0.0", "Moves a member from one set to another.", st::smove),
    keyed!("sinter", -2, R, 1, -1, 1, "set", "1.0.0", "Returns the intersect of multiple sets.", st::sinter),
    // Redis declares SINTERCARD's keys movable (numkeys at 1); lavik routes on every
    // argument after numkeys, which covers the keys (LIMIT and its value only add shards).
    keyed!("sintercard", -3, R, 2, -1, 1, "set", "7.0.0", "Returns the number of members of the intersect of multiple sets.", st::sintercard),
    keyed!("sinterstore", -3, W, 1, -1, 1, "set", "1.0.0", "Stores the intersect of multiple sets in a key.", st::sinterstore),
    keyed!("sunion", -2, R, 1, -1, 1, "set", "1.0.0", "Returns the union of multiple sets.", st::sunion),
    keyed!("sunionstore", -3, W, 1, -1, 1, "set", "1.0.0", "Stores the union of multiple sets in a key.", st::sunionstore),
    keyed!("sdiff", -2, R, 1, -1, 1, "set", "1.0.0", "Returns the difference of multiple sets.", st::sdiff),
    keyed!("sdiffstore", -3, W, 1, -1, 1, "set", "1.0.0", "Stores the difference of multiple sets in a key.", st::sdiffstore),
    keyed!("sscan", -3, R, 1, 1, 1, "set", "2.8.0", "Iterates over members of a set.", st::sscan),
    // lists
    keyed!("lpush", -3, WF, 1, 1, 1, "list", "1.0.0", "Prepends one or more elements to a list. Creates the key if it doesn't exist.", l::lpush),
    keyed!("rpush", -3, WF, 1, 1, 1, "list", "1.0.0", "Appends one or more elements to a list. Creates the key if it doesn't exist.", l::rpush),
    keyed!("lpushx", -3, WF, 1, 1, 1, "list", "2.2.0", "Prepends one or more elements to a list only when the list exists.", l::lpushx),
    keyed!("rpushx", -3, WF, 1, 1, 1, "list", "2.2.0", "Appends an element to a list only when the list exists.", l::rpushx),
    keyed!("lpop", -2, WDF, 1, 1, 1, "list", "1.0.0", "Returns the first elements in a list after removing it. Deletes the list if the last element was popped.", l::lpop),
    keyed!("rpop", -2, WDF, 1, 1, 1, "list", "1.0.0", "Returns and removes the last elements of the list. Deletes the list if the last element was popped.", l::rpop),
    keyed!("llen", 2, RF, 1, 1, 1, "list", "1.0.0", "Returns the length of a list.", l::llen),
    keyed!("lindex", 3, R, 1, 1, 1, "list", "1.0.0", "Returns an element from a list by its index.", l::lindex),
    keyed!("lset", 4, W, 1, 1, 1, "list", "1.0.0", "Sets the value of an element in a list by its index.", l::lset),
    keyed!("lrange", 4, R, 1, 1, 1, "list", "1.0.0", "Returns a range of elements from a list.", l::lrange),
    keyed!("linsert", 5, W, 1, 1, 1, "list", "2.2.0", "Inserts an element before or after another element in a list.", l::linsert),
    keyed!("lrem", 4, WD, 1, 1, 1, "list", "1.0.0", "Removes elements from a list. Deletes the list if the last element was removed.", l::lrem),
    keyed!("ltrim", 4, WD, 1, 1, 1, "list", "1.0.0", "Removes elements from both ends a list. Deletes the list if all elements were trimmed.", l::ltrim),
    keyed!("lpos", -3, R, 1, 1, 1, "list", "6.0.6", "Returns the index of matching elements in a list.", l::lpos),
    keyed!("lmove", 5, W, 1, 2, 1, "list", "6.2.0", "Returns an element after popping it from one list and pushing it to another. Deletes the list if the last element was moved.", l::lmove),
    keyed!("rpoplpush", 3, W, 1, 2, 1, "list", "1.2.0", "Returns the last element of a list after removing and pushing it to another list. Deletes the list if the last element was popped.", l::rpoplpush),
    keyed_numkeys!("lmpop", -4, LMPOP, 1, "list", "7.0.0", "Returns multiple elements from a list after removing them. Deletes the list if the last element was popped.", l::lmpop),
    // blocking pops (src/commands/blocking.rs, src/server/blocking.rs)
    keyed!("blpop", -3, BLOCK_W, 1, -2, 1, "list", "2.0.0", "Removes and returns the first element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped.", bl::blpop),
    keyed!("brpop", -3, BLOCK_W, 1, -2, 1, "list", "2.0.0", "Removes and returns the last element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped.", bl::brpop),
    keyed!("blmove", 6, BLOCK_WD, 1, 2, 1, "list", "6.2.0", "Pops an element from a list, pushes it to another list and returns it. Blocks until an element is available otherwise. Deletes the list if the last element was moved.", bl::blmove),
    keyed!("brpoplpush", 4, BLOCK_WD, 1, 2, 1, "list", "2.2.0", "Pops an element from a list, pushes it to another list and returns it. Block until an element is available otherwise. Deletes the list if the last element was popped.", bl::brpoplpush),
    keyed_numkeys!("blmpop", -5, BLOCK_MOVABLE, 2, "list", "7.0.0", "Pops the first element from one of multiple lists. Blocks until an element is available otherwise. Deletes the list if the last element was popped.", bl::blmpop),
    keyed!("bzpopmin", -3, BLOCK_WF, 1, -2, 1, "sorted-set", "5.0.0", "Removes and returns the member with the lowest score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped.", bl::bzpopmin),
    keyed!("bzpopmax", -3, BLOCK_WF, 1, -2, 1, "sorted-set", "5.0.0", "Removes and returns the member with the highest score from one or more sorted sets. Blocks until a member available otherwise.  Deletes the sorted set if the last element was popped.", bl::bzpopmax),
    keyed_numkeys!("bzmpop", -5, BLOCK_MOVABLE, 2, "sorted-set", "7.0.0", "Removes and returns a member by score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped.", bl::bzmpop),
    // keyspace
    keyed!("del", -2, WD, 1, -1, 1, "generic", "1.0.0", "Deletes one or more keys.", k::del),
    keyed!("unlink", -2, WDF, 1, -1, 1, "generic", "4.0.0", "Asynchronously deletes one or more keys.", k::del),
    keyed!("exists", -2, RF, 1, -1, 1, "generic", "1.0.0", "Determines whether one or more keys exist.", k::exists),
    keyed!("touch", -2, RF, 1, -1, 1, "generic", "3.2.1", "Returns the number of existing keys out of those specified after updating the time they were last accessed.", k::exists),
    keyed!("type", 2, RF, 1, 1, 1, "generic", "1.0.0", "Determines the type of value stored at a key.", k::type_),
    keyed_sort!("sort", SORT_FLAGS, "1.0.0", "Sorts the elements in a list, a set, or a sorted set, optionally storing the result.", so::sort),
    keyed_sort!("sort_ro", SORT_RO_FLAGS, "7.0.0", "Returns the sorted elements of a list, a set, or a sorted set.", so::sort_ro),
    keyed!("rename", 3, WD, 1, 2, 1, "generic", "1.0.0", "Renames a key and overwrites the destination.", k::rename),
    keyed!("renamenx", 3, WDF, 1, 2, 1, "generic", "1.0.0", "Renames a key only when the target key name doesn't exist.", k::renamenx),
    keyed!("move", 3, WDF, 1, 1, 1, "generic", "1.0.0", "Moves a key to another database.", k::move_),
    keyed!("copy", -3, W, 1, 2, 1, "generic", "6.2.0", "Copies the value of a key to a new key.", k::copy),
    keyed!("dump", 2, R, 1, 1, 1, "generic", "2.6.0", "Returns a serialized representation of the value stored at a key.", d::dump),
    keyed!("restore", -4, W, 1, 1, 1, "generic", "2.6.0", "Creates a key from the serialized representation of a value.", d::restore),
    // OBJECT's key is its third argument (OBJECT HELP has none).
    keyed!("object", -2, R, 2, 2, 1, "generic", "2.2.3", "A container for object introspection commands.", k::object),
    keyed!("expire", -3, WDF, 1, 1, 1, "generic", "1.0.0", "Sets the expiration time of a key in seconds.", k::expire),
    keyed!("pexpire", -3, WDF, 1, 1, 1, "generic", "2.6.0", "Sets the expiration time of a key in milliseconds.", k::pexpire),
    keyed!("expireat", -3, WDF, 1, 1, 1, "generic", "1.2.0", "Sets the expiration time of a key to a Unix timestamp.", k::expireat),
    keyed!("pexpireat", -3, WDF, 1, 1, 1, "generic", "2.6.0", "Sets the expiration time of a key to a Unix milliseconds timestamp.", k::pexpireat),
    keyed!("ttl", 2, RF, 1, 1, 1, "generic", "1.0.0", "Returns the expiration time in seconds of a key.", k::ttl),
    keyed!("pttl", 2, RF, 1, 1, 1, "generic", "2.6.0", "Returns the expiration time in milliseconds of a key.", k::pttl),
    keyed!("expiretime", 2, RF, 1, 1, 1, "generic", "7.0.0", "Returns the expiration time of a key as a Unix timestamp.", k::expiretime),
    keyed!("pexpiretime", 2, RF, 1, 1, 1, "generic", "7.0.0", "Returns the expiration time of a key as a Unix milliseconds timestamp.", k::pexpiretime),
    keyed!("persist", 2, WDF, 1, 1, 1, "generic", "2.2.0", "Removes the expiration time of a key.", k::persist),
    // scripting
    keyed_numkeys!("eval", -3, EVAL, 2, "scripting", "2.6.0", "Executes a server-side Lua script.", sc::eval),
    keyed_numkeys!("evalsha", -3, EVAL, 2, "scripting", "2.6.0", "Executes a server-side Lua script by SHA1 digest.", sc::evalsha),
    keyed_numkeys!("eval_ro", -3, EVAL_RO, 2, "scripting", "7.0.0", "Executes a read-only server-side Lua script.", sc::eval_ro),
    keyed_numkeys!("evalsha_ro", -3, EVAL_RO, 2, "scripting", "7.0.0", "Executes a read-only server-side Lua script by SHA1 digest.", sc::evalsha_ro),
    // sorted sets
    keyed!("zadd", -4, WF, 1, 1, 1, "sorted-set", "1.2.0", "Adds one or more members to a sorted set, or updates their scores. Creates the key if it doesn't exist.", z::zadd),
    keyed!("zincrby", 4, WF, 1, 1, 1, "sorted-set", "1.2.0", "Increments the score of a member in a sorted set.", z::zincrby),
    keyed!("zrem", -3, WDF, 1, 1, 1, "sorted-set", "1.2.0", "Removes one or more members from a sorted set. Deletes the sorted set if all members were removed.", z::zrem),
    keyed!("zcard", 2, RF, 1, 1, 1, "sorted-set", "1.2.0", "Returns the number of members in a sorted set.", z::zcard),
    keyed!("zscore", 3, RF, 1, 1, 1, "sorted-set", "1.2.0", "Returns the score of a member in a sorted set.", z::zscore),
    keyed!("zmscore", -3, RF, 1, 1, 1, "sorted-set", "6.2.0", "Returns the score of one or more members in a sorted set.", z::zmscore),
    keyed!("zrank", -3, RF, 1, 1, 1, "sorted-set", "2.0.0", "Returns the index of a member in a sorted set ordered by ascending scores.", z::zrank),
    keyed!("zrevrank", -3, RF, 1, 1, 1, "sorted-set", "2.0.0", "Returns the index of a member in a sorted set ordered by descending scores.", z::zrevrank),
    keyed!("zcount", 4, RF, 1, 1, 1, "sorted-set", "2.0.0", "Returns the count of members in a sorted set that have scores within a range.", z::zcount),
    keyed!("zlexcount", 4, RF, 1, 1, 1, "sorted-set", "2.8.9", "Returns the number of members in a sorted set within a lexicographical range.", z::zlexcount),
    keyed!("zrange", -4, R, 1, 1, 1, "sorted-set", "1.2.0", "Returns members in a sorted set within a range of indexes.", z::zrange),
    keyed!("zrangebyscore", -4, R, 1, 1, 1, "sorted-set", "1.0.5", "Returns members in a sorted set within a range of scores.", z::zrangebyscore),
    keyed!("zrevrangebyscore", -4, R, 1, 1, 1, "sorted-set", "2.2.0", "Returns members in a sorted set within a range of scores in reverse order.", z::zrevrangebyscore),
    keyed!("zrangebylex", -4, R, 1, 1, 1, "sorted-set", "2.8.9", "Returns members in a sorted set within a lexicographical range.", z::zrangebylex),
    keyed!("zrevrangebylex", -4, R, 1, 1, 1, "sorted-set", "2.8.9", "Returns members in a sorted set within a lexicographical range in reverse order.", z::zrevrangebylex),
    keyed!("zrevrange", -4, R, 1, 1, 1, "sorted-set", "1.2.0", "Returns members in a sorted set within a range of indexes in reverse order.", z::zrevrange),
    keyed!("zrangestore", -5, W, 1, 2, 1, "sorted-set", "6.2.0", "Stores a range of members from sorted set in a key.", z::zrangestore),
    keyed!("zremrangebyrank", 4, WD, 1, 1, 1, "sorted-set", "2.0.0", "Removes members in a sorted set within a range of indexes. Deletes the sorted set if all members were removed.", z::zremrangebyrank),
    keyed!("zremrangebyscore", 4, WD, 1, 1, 1, "sorted-set", "1.2.0", "Removes members in a sorted set within a range of scores. Deletes the sorted set if all members were removed.", z::zremrangebyscore),
    keyed!("zremrangebylex", 4, WD, 1, 1, 1, "sorted-set", "2.8.9", "Removes members in a sorted set within a lexicographical range. Deletes the sorted set if all members were removed.", z::zremrangebylex),
    keyed!("zpopmin", -2, WDF, 1, 1, 1, "sorted-set", "5.0.0", "Returns the lowest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped.", z::zpopmin),
    keyed!("zpopmax", -2, WDF, 1, 1, 1, "sorted-set", "5.0.0", "Returns the highest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped.", z::zpopmax),
    keyed_numkeys!("zmpop", -4, ZW_MOVABLE, 1, "sorted-set", "7.0.0", "Returns the highest- or lowest-scoring members from one or more sorted sets after removing them. Deletes the sorted set if the last member was popped.", z::zmpop),
    keyed!("zrandmember", -2, R, 1, 1, 1, "sorted-set", "6.2.0", "Returns one or more random members from a sorted set.", z::zrandmember),
    keyed_numkeys!("zunion", -3, ZR_MOVABLE, 1, "sorted-set", "6.2.0", "Returns the union of multiple sorted sets.", z::zunion),
    keyed_numkeys!("zinter", -3, ZR_MOVABLE, 1, "sorted-set", "6.2.0", "Returns the intersect of multiple sorted sets.", z::zinter),
    keyed_numkeys!("zdiff", -3, ZR_MOVABLE, 1, "sorted-set", "6.2.0", "Returns the difference between multiple sorted sets.", z::zdiff),
    keyed_dest_numkeys!("zunionstore", -4, ZWD_MOVABLE, "sorted-set", "2.0.0", "Stores the union of multiple sorted sets in a key.", z::zunionstore),
    keyed_dest_numkeys!("zinterstore", -4, ZWD_MOVABLE, "sorted-set", "2.0.0", "Stores the intersect of multiple sorted sets in a key.", z::zinterstore),
    keyed_dest_numkeys!("zdiffstore", -4, ZWD_MOVABLE, "sorted-set", "6.2.0", "Stores the difference of multiple sorted sets in a key.", z::zdiffstore),
    keyed_numkeys!("zintercard", -3, ZR_MOVABLE, 1, "sorted-set", "7.0.0", "Returns the number of members of the intersect of multiple sorted sets.", z::zintercard),
    keyed!("zscan", -3, R, 1, 1, 1, "sorted-set", "2.8.0", "Iterates over members and scores of a sorted set.", z::zscan),
    // geo (GEORADIUS's STORE key is found by keyword: refused, see geo.rs)
    keyed!("geoadd", -5, W, 1, 1, 1, "geo", "3.2.0", "Adds one or more members to a geospatial index. The key is created if it doesn't exist.", g::geoadd),
    keyed!("geodist", -4, R, 1, 1, 1, "geo", "3.2.0", "Returns the distance between two members of a geospatial index.", g::geodist),
    keyed!("geohash", -2, R, 1, 1, 1, "geo", "3.2.0", "Returns members from a geospatial index as geohash strings.", g::geohash),
    keyed!("geopos", -2, R, 1, 1, 1, "geo", "3.2.0", "Returns the longitude and latitude of members from a geospatial index.", g::geopos),
    keyed!("georadius", -6, W, 1, 1, 1, "geo", "3.2.0", "Queries a geospatial index for members within a distance from a coordinate, optionally stores the result.", g::georadius),
    keyed!("georadius_ro", -6, R, 1, 1, 1, "geo", "3.2.10", "Returns members from a geospatial index that are within a distance from a coordinate.", g::georadius_ro),
    keyed!("georadiusbymember", -5, W, 1, 1, 1, "geo", "3.2.0", "Queries a geospatial index for members within a distance from a member, optionally stores the result.", g::georadiusbymember),
    keyed!("georadiusbymember_ro", -5, R, 1, 1, 1, "geo", "3.2.10", "Returns members from a geospatial index that are within a distance from a member.", g::georadiusbymember_ro),
    keyed!("geosearch", -7, R, 1, 1, 1, "geo", "6.2.0", "Queries a geospatial index for members inside an area of a box or a circle.", g::geosearch),
    keyed!("geosearchstore", -8, W, 1, 2, 1, "geo", "6.2.0", "Queries a geospatial index for members inside an area of a box or a circle, optionally stores the result.", g::geosearchstore),
    // Keyless (no key positions): runs on the connection's worker; the catalog is server-wide.
    keyed!("script", -2, SCRIPT, 0, 0, 0, "scripting", "2.6.0", "A container for Lua scripts management commands.", sc::script),
    keyed_numkeys!("fcall", -3, FCALL, 2, "scripting", "7.0.0", "Invokes a function.", sc::fcall),
    keyed_numkeys!("fcall_ro", -3, EVAL_RO, 2, "scripting", "7.0.0", "Invokes a read-only function.", sc::fcall_ro),
    keyed!("function", -2, FUNCTION, 0, 0, 0, "scripting", "7.0.0", "A container for function commands.", sc::function),
    all!("keys", 2, R, "generic", "1.0.0", "Returns all key names that match a pattern.", k::keys),
    all!("scan", -2, R, "generic", "2.8.0", "Iterates over the key names in the database.", k::scan),
    all!("randomkey", 1, R, "generic", "1.0.0", "Returns a random key name from the database.", k::randomkey),
    all!("dbsize", 1, RF, "server", "1.0.0", "Returns the number of keys in the database.", k::dbsize),
    all!("flushdb", -1, WD, "server", "1.0.0", "Removes all keys from the current database.", k::flushdb),
    all!("flushall", -1, WD, "server", "1.0.0", "Removes all keys from all databases.", k::flushall),
    // connection
    local!("ping", -1, FAST, "connection", "1.0.0", "Returns the server's liveliness response."),
    local!("echo", 2, LOADING_STALE_FAST, "connection", "1.0.0", "Returns the given string."),
    local!("hello", -1, LOADING_STALE, "connection", "6.0.0", "Handshakes with the Redis server."),
    local!("auth", -2, LOADING_STALE, "connection", "1.0.0", "Authenticates the connection."),
    local!("select", 2, LOADING_STALE, "connection", "1.0.0", "Changes the selected database."),
    local!("quit", -1, LOADING_STALE, "connection", "1.0.0", "Closes the connection."),
    local!("reset", 1, LOADING_STALE, "connection", "6.2.0", "Resets the connection."),
    local!("client", -2, ADMIN, "connection", "2.4.0", "A container for client connection commands."),
    local!("command", -1, LOADING_STALE, "server", "2.8.13", "Returns detailed information about all commands."),
    local!("acl", -2, ADMIN, "server", "6.0.0", "A container for Access List Control commands."),
    // transactions (server::txn): connection commands; WATCH declares its keys, which
    // ACL key permissions and COMMAND report, and runs where their shards are held.
    local!("multi", 1, TXN, "transactions", "1.2.0", "Starts a transaction."),
    local!("exec", 1, EXEC, "transactions", "1.2.0", "Executes all commands in a transaction."),
    local!("discard", 1, TXN, "transactions", "2.0.0", "Discards a transaction."),
    CommandSpec {
        first_key: 1,
        last_key: -1,
        step: 1,
        ..local!("watch", -2, TXN, "transactions", "2.2.0", "Monitors changes to keys to determine the execution of a transaction.")
    },
    local!("unwatch", 1, TXN, "transactions", "2.2.0", "Forgets about watched keys of a transaction."),
    // server
    local!("info", -1, LOADING_STALE_SLOW, "server", "1.0.0", "Returns information and statistics about the server."),
    local!("config", -2, ADMIN, "server", "2.0.0", "A container for server configuration commands."),
    local!("time", 1, LOADING_STALE_FAST, "server", "2.6.0", "Returns the server time."),
    local!("shutdown", -1, ADMIN, "server", "1.0.0", "Synchronously saves the database(s) to disk and shuts down the Redis server."),
    local!("save", 1, ADMIN, "server", "1.0.0", "Synchronously saves the database(s) to disk."),
    local!("bgsave", -1, ADMIN, "server", "1.0.0", "Asynchronously saves the database(s) to disk."),
    local!("lastsave", 1, LOADING_STALE, "server", "1.0.0", "Returns the Unix timestamp of the last successful save to disk."),
    local!("slowlog", -2, ADMIN, "server", "2.2.12", "A container for slow log commands."),
    local!("debug", -2, ADMIN, "server", "1.0.0", "A container for debugging commands."),
    local!("memory", -2, &[], "server", "4.0.0", "A container for memory diagnostics commands."),
    local!("latency", -2, &[], "server", "2.8.13", "A container for latency diagnostics commands."),
    local!("monitor", 1, ADMIN, "server", "1.0.0", "Listens for all requests received by the server in real-time."),
    // pubsub (SSUBSCRIBE/SUNSUBSCRIBE/SPUBLISH name no keys here: their channels are not
    // keys, and lavik has no cluster slots to check them against)
    local!("subscribe", -2, PUBSUB_SUB, "pubsub", "2.0.0", "Listens for messages published to channels."),
    local!("unsubscribe", -1, PUBSUB_SUB, "pubsub", "2.0.0", "Stops listening to messages posted to channels."),
    local!("psubscribe", -2, PUBSUB_SUB, "pubsub", "2.0.0", "Listens for messages published to channels that match one or more patterns."),
    local!("punsubscribe", -1, PUBSUB_SUB, "pubsub", "2.0.0", "Stops listening to messages published to channels that match one or more patterns."),
    local!("publish", 3, PUBSUB_PUB, "pubsub", "2.0.0", "Posts a message to a channel."),
    local!("pubsub", -2, CONTAINER, "pubsub", "2.8.0", "A container for Pub/Sub commands."),
    local!("ssubscribe", -2, PUBSUB_SUB, "pubsub", "7.0.0", "Listens for messages published to shard channels."),
    local!("sunsubscribe", -1, PUBSUB_SUB, "pubsub", "7.0.0", "Stops listening to messages posted to shard channels."),
    local!("spublish", 3, PUBSUB_PUB, "pubsub", "7.0.0", "Post a message to a shard channel"),
    local!("defrag", 2, ADMIN, "server", "0.1.0", "lavik: pauses, resumes or reports online defragmentation of the data devices."),
    local!("tombraider", -2, ADMIN, "server", "0.1.0", "lavik: switches, paces or reports the tombstone sweep."),
];

/// The longest command name ("georadiusbymember_ro").
const COMMAND_NAME_MAX_BYTES: usize = 20;

/// Finds a command by name, case-insensitively, without allocating.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    if name.len() > COMMAND_NAME_MAX_BYTES {
        return None;
    }
    TABLE
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// The key count of a movable-keys command, if its numkeys argument is valid (an integer
/// from 0 to the number of arguments after it); the handler reports Redis's error otherwise.
pub fn movable_key_count(m: Movable, args: &[&[u8]]) -> Option<usize> {
    let n = crate::resp::parse::parse_i64(args.get(m.numkeys_at)?)?;
    let after = args.len() - m.numkeys_at - 1;
    (n >= 0 && n as u64 <= after as u64).then_some(n as usize)
}

/// Positions of the keys of a `Keyed` command in `args`.
pub fn key_positions(
    spec: &CommandSpec,
    args: &[&[u8]],
) -> std::iter::Chain<std::option::IntoIter<usize>, std::iter::StepBy<std::ops::Range<usize>>> {
    if spec.movable.is_some_and(|m| m.sort_store) {
        let dest = super::sort::store_position(args);
        let key_end = args.len().min(2);
        return dest.into_iter().chain((1.min(key_end)..key_end).step_by(1));
    }
    if let Some(m) = spec.movable {
        let n = movable_key_count(m, args).unwrap_or(0);
        let first = m.numkeys_at + 1;
        let dest = m.dest_at.filter(|&d| d < args.len());
        return dest.into_iter().chain((first..first + n).step_by(1));
    }
    let argc = args.len();
    let first = spec.first_key.max(0) as usize;
    let last = if spec.last_key < 0 {
        argc as i64 + spec.last_key as i64
    } else {
        spec.last_key as i64
    };
    let last = if last < 0 {
        0
    } else {
        (last as usize).min(argc.saturating_sub(1))
    };
    let step = spec.step.max(1) as usize;
    // No keys (`first` 0): an empty range.
    let (start, end) = if first > 0 {
        (first, (last + 1).max(first))
    } else {
        (0, 0)
    };
    None.into_iter().chain((start..end).step_by(step))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Key positions follow Redis's first/last/step for the multi-key shapes.
    #[test]
    fn positions() {
        let args = |n: usize| vec![&b"x"[..]; n];
        let mset = lookup(b"MSET").unwrap();
        assert_eq!(
            key_positions(mset, &args(5)).collect::<Vec<_>>(),
            vec![1, 3]
        );
        let del = lookup(b"del").unwrap();
        assert_eq!(
            key_positions(del, &args(4)).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        let get = lookup(b"Get").unwrap();
        assert_eq!(key_positions(get, &args(2)).collect::<Vec<_>>(), vec![1]);
        let copy = lookup(b"copy").unwrap();
        assert_eq!(
            key_positions(copy, &args(5)).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let bitop = lookup(b"BITOP").unwrap();
        assert_eq!(
            key_positions(bitop, &args(6)).collect::<Vec<_>>(),
            vec![2, 3, 4, 5]
        );
        let ping = lookup(b"script").unwrap();
        assert_eq!(key_positions(ping, &args(3)).count(), 0);
    }

    // EVAL's keys are the numkeys arguments after its numkeys; a bad numkeys means none.
    #[test]
    fn movable_positions() {
        let eval = lookup(b"EVAL").unwrap();
        let a: Vec<&[u8]> = vec![b"eval", b"return 1", b"2", b"k1", b"k2", b"arg"];
        assert_eq!(key_positions(eval, &a).collect::<Vec<_>>(), vec![3, 4]);
        let none: Vec<&[u8]> = vec![b"eval", b"return 1", b"0", b"arg"];
        assert_eq!(key_positions(eval, &none).count(), 0);
        for bad in [&b"3"[..], b"-1", b"x"] {
            let a: Vec<&[u8]> = vec![b"eval", b"s", bad, b"k1"];
            assert_eq!(key_positions(eval, &a).count(), 0, "{bad:?}");
        }
    }

    // ZUNIONSTORE's keys are its destination and the numkeys sources; ZUNION's only the sources.
    #[test]
    fn dest_numkeys_positions() {
        let zs = lookup(b"ZUNIONSTORE").unwrap();
        let a: Vec<&[u8]> = vec![
            b"zunionstore",
            b"d",
            b"2",
            b"k1",
            b"k2",
            b"WEIGHTS",
            b"1",
            b"2",
        ];
        assert_eq!(key_positions(zs, &a).collect::<Vec<_>>(), vec![1, 3, 4]);
        let zu = lookup(b"zunion").unwrap();
        let a: Vec<&[u8]> = vec![b"zunion", b"2", b"k1", b"k2", b"withscores"];
        assert_eq!(key_positions(zu, &a).collect::<Vec<_>>(), vec![2, 3]);
    }

    // LMPOP's keys are the numkeys arguments after its numkeys at position 1.
    #[test]
    fn lmpop_positions() {
        let lmpop = lookup(b"LMPOP").unwrap();
        let a: Vec<&[u8]> = vec![b"lmpop", b"2", b"k1", b"k2", b"left", b"count", b"3"];
        assert_eq!(key_positions(lmpop, &a).collect::<Vec<_>>(), vec![2, 3]);
        let bad: Vec<&[u8]> = vec![b"lmpop", b"3", b"k1", b"left"];
        assert_eq!(key_positions(lmpop, &bad).count(), 0);
    }

    // Every name is lowercase and unique, so lookup is unambiguous.
    #[test]
    fn names_unique() {
        let mut names: Vec<_> = TABLE.iter().map(|c| c.name).collect();
        assert!(names
            .iter()
            .all(|n| n.chars().all(|c| !c.is_ascii_uppercase())));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
    }
}
