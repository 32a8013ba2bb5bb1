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

pub mod keyspace;
pub mod scripting;
pub mod string;
pub mod table;

use crate::resp::ReplyBuf;
use crate::storage::{key_slot, shard_of_slot, Db, Shard, StorageError};

pub use table::{lookup, CommandSpec, Kind, TABLE};

/// The shards a command may touch, indexed by shard id. A worker holds its
/// own; a coordinator of a multi-worker command also holds lent ones.
pub struct ShardSet {
    pub slots: Vec<Option<Shard>>,
    pub shard_count: u32,
}

impl ShardSet {
    pub fn shard_id(&self, key: &[u8]) -> u32 {
        shard_of_slot(key_slot(key), self.shard_count)
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
}

pub struct Ctx<'a> {
    pub shards: &'a mut ShardSet,
    pub db: Db,
    pub now_ms: u64,
    /// `proto-max-bulk-len`: the largest string a command may create.
    pub max_bulk: usize,
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

/// Redis's glob matcher (`stringmatchlen`): `*`, `?`, `[a-z]`, `[^x]`, `\`.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    fn m(p: &[u8], s: &[u8], depth: u32) -> bool {
        if depth > 1000 {
            return false;
        }
        let (mut pi, mut si) = (0, 0);
        while pi < p.len() {
            match p[pi] {
                b'*' => {
                    while pi + 1 < p.len() && p[pi + 1] == b'*' {
                        pi += 1;
                    }
                    if pi + 1 == p.len() {
                        return true;
                    }
                    for start in si..=s.len() {
                        if m(&p[pi + 1..], &s[start..], depth + 1) {
                            return true;
                        }
                    }
                    return false;
                }
                b'?' => {
                    if si >= s.len() {
                        return false;
                    }
                    si += 1;
                }
                b'[' => {
                    if si >= s.len() {
                        return false;
                    }
                    pi += 1;
                    let not = pi < p.len() && p[pi] == b'^';
                    if not {
                        pi += 1;
                    }
                    let mut matched = false;
                    loop {
                        if pi >= p.len() {
                            pi -= 1;
                            break;
                        }
                        if p[pi] == b'\\' && pi + 1 < p.len() {
                            pi += 1;
                            if p[pi] == s[si] {
                                matched = true;
                            }
                        } else if p[pi] == b']' {
                            break;
                        } else if pi + 2 < p.len() && p[pi + 1] == b'-' {
                            let (mut lo, mut hi) = (p[pi], p[pi + 2]);
                            if lo > hi {
                                std::mem::swap(&mut lo, &mut hi);
                            }
                            if s[si] >= lo && s[si] <= hi {
                                matched = true;
                            }
                            pi += 2;
                        } else if p[pi] == s[si] {
                            matched = true;
                        }
                        pi += 1;
                    }
                    if not {
                        matched = !matched;
                    }
                    if !matched {
                        return false;
                    }
                    si += 1;
                }
                b'\\' if pi + 1 < p.len() => {
                    pi += 1;
                    if si >= s.len() || p[pi] != s[si] {
                        return false;
                    }
                    si += 1;
                }
                c => {
                    if si >= s.len() || c != s[si] {
                        return false;
                    }
                    si += 1;
                }
            }
            pi += 1;
        }
        si == s.len()
    }
    m(pat, s, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The glob matcher agrees with Redis on the pattern features KEYS/SCAN use.
    #[test]
    fn glob() {
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"h?llo", b"hello"));
        assert!(glob_match(b"h*llo", b"heeeello"));
        assert!(glob_match(b"h[ae]llo", b"hallo"));
        assert!(!glob_match(b"h[ae]llo", b"hillo"));
        assert!(glob_match(b"h[^e]llo", b"hallo"));
        assert!(!glob_match(b"h[^e]llo", b"hello"));
        assert!(glob_match(b"h[a-b]llo", b"hbllo"));
        assert!(glob_match(b"key:\\*", b"key:*"));
        assert!(!glob_match(b"key:\\*", b"key:a"));
        assert!(!glob_match(b"a*b", b"acd"));
        assert!(glob_match(b"", b""));
    }
}
