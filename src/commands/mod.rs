//! Command table and the data commands, one file per family.
//!
//! A command is described once in `TABLE` (name, arity, flags, key
//! positions — the same facts `COMMAND INFO` reports) and, for commands that
//! touch keys, implemented by a handler that sees only a `Ctx`: the shards
//! that own its keys, the selected db and the time. The server decides where
//! a command runs (which worker, or several workers' shards lent to one);
//! handlers never know, which is what makes multi-key commands atomic: all
//! their shards are held by one thread for the whole call.
//!
//! Connection and server commands (`Kind::Local`) need the connection or the
//! process state and are implemented in `server::local`.

pub mod bitmap;
pub mod blocking;
pub mod collection;
pub mod dump;
pub mod geo;
/// Keyspace notifications (lives in `runtime` so storage can fire `expired` too).
pub use crate::runtime::events;
pub mod glob;
pub mod hash;
pub mod hyperloglog;
pub mod keyspace;
pub mod list;
pub mod scripting;
pub mod set;
pub mod sort;
pub mod string;
pub mod table;
pub mod zset;

use crate::resp::ReplyBuf;
use crate::storage::{shard_of_slot, Db, Shard, StorageError, WriteGroups};

pub use glob::{glob_match, glob_match_nocase, Glob};
pub use table::{lookup, CommandSpec, Kind, TABLE};

/// The shards a command may touch, indexed by shard id. A worker holds its
/// own; a coordinator of a multi-worker command also holds lent ones.
pub struct ShardSet {
    pub slots: Vec<Option<Shard>>,
    pub shard_count: u32,
    /// Write scopes and multi-shard groups of the running command (`storage::WriteGroups`).
    pub groups: WriteGroups,
}

impl ShardSet {
    pub fn shard_id(&self, key: &[u8]) -> u32 {
        // The running command's key has its slot computed once (`runtime::keymemo`).
        shard_of_slot(crate::runtime::keymemo::key_slot(key), self.shard_count)
    }

    /// The shard owning `key`. Panics if it is not held: the router must have
    /// gathered every shard the command's keys map to (a bug otherwise).
    pub fn for_key(&mut self, key: &[u8]) -> &mut Shard {
        let id = self.shard_id(key) as usize;
        self.slots[id]
            .as_mut()
            .expect("router gathered the shard of every key")
    }

    pub fn held(&mut self) -> impl Iterator<Item = &mut Shard> {
        self.slots.iter_mut().flatten()
    }

    /// A set of the same size holding no shard (what a worker keeps while a running
    /// script owns its shards, `server::worker` "busy rounds").
    pub fn empty_like(&self) -> ShardSet {
        ShardSet {
            slots: (0..self.slots.len()).map(|_| None).collect(),
            shard_count: self.shard_count,
            groups: Default::default(),
        }
    }
}

pub struct Ctx<'a> {
    pub shards: &'a mut ShardSet,
    pub db: Db,
    pub now_ms: u64,
    /// `proto-max-bulk-len`: the largest string a command may create.
    pub max_bulk: usize,
    /// A script's "busy round" (`docs/scripting.md`, busy-reply-threshold): the worker
    /// answers its other connections once, from the script's instruction hook, while the
    /// script owns the shards. Returns true when the server is shutting down. Set only
    /// for scripts run by a worker; `None` elsewhere.
    pub busy_round: Option<&'a mut dyn FnMut() -> bool>,
}

impl Ctx<'_> {
    /// Fires keyspace notification `event` of `class` (`events::STRING`, ...) for `key`
    /// in this command's db; one atomic load when notifications are off (`events`).
    #[inline]
    pub fn notify(&self, class: u32, event: &str, key: &[u8]) {
        events::notify(class, event, key, self.db);
    }
}

/// A command's error reply text (without the leading `-`).
pub type CmdResult = Result<(), String>;

pub type Handler = fn(&mut Ctx, &[&[u8]], &mut ReplyBuf) -> CmdResult;

pub fn storage_error(e: StorageError) -> String {
    match e {
        StorageError::DeviceFull => {
            "OOM command not allowed: the data device is full (reads are still served; delete keys to free space)".into()
        }
        other => format!("ERR storage error: {other}"),
    }
}

pub const ERR_SYNTAX: &str = "ERR syntax error";
pub const ERR_NOT_INT: &str = "ERR value is not an integer or out of range";
pub const ERR_WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

pub fn wrong_args(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

pub fn parse_int(a: &[u8]) -> Result<i64, String> {
    crate::resp::parse::parse_i64(a).ok_or_else(|| ERR_NOT_INT.to_string())
}

pub fn eq_ic(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}
