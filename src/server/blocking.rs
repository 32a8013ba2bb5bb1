//! Blocked clients (BLPOP and friends): the registry, serving on writes, timeouts,
//! CLIENT UNBLOCK. Design and its limits: `docs/blocking.md`.
//!
//! One server-wide registry (a process-wide `Mutex`, since one process is one server)
//! maps (db, key) to the FIFO of clients blocked on it. A client is registered by the
//! thread that ran its handler's empty attempt *while that thread still holds the keys'
//! shards*, and a key is only ever written by a thread holding its shard, so no push can
//! fall between "found nothing" and "registered" (no lost wake-up).
//!
//! After every write command, the thread that ran it (still holding its shards) looks up
//! the command's declared keys; the lookup is one relaxed atomic load while nobody is
//! blocked. For each key with waiters it serves them in the order they blocked, each by
//! running the waiter's own handler narrowed to that key, until one attempt finds the
//! key empty; a served BLMOVE's destination is ready in turn. The served reply fills the
//! reply slot the client reserved when it blocked: locally, or by `Msg::Reply` to the
//! client's worker (the same path as any remote reply, so it obeys group commit).
//!
//! Timeouts belong to the client's own worker: its loop wakes at the earliest deadline of
//! its waiters (`next_deadline_ms`), removes the expired ones and fills their slots with
//! the nil reply. Whoever removes a waiter from the registry (serve, timeout, CLIENT
//! UNBLOCK, connection close) owns its reply, so exactly one reply is ever produced.

use super::ConnToken;
use crate::commands::blocking::{narrow_to_key, set_may_block, take_empty, BlockRequest};
use crate::commands::table::key_positions;
use crate::commands::{lookup, CommandSpec, Ctx, ShardSet};
use crate::resp::encode::Proto;
use crate::resp::ReplyBuf;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Where a blocked client's reply goes.
#[derive(Debug, Clone, Copy)]
pub struct Waiter {
    pub worker: usize,
    pub token: ConnToken,
    pub seq: u64,
    pub proto: Proto,
}

struct Entry {
    waiter: Waiter,
    db: u8,
    args: Vec<Vec<u8>>,
    keys: Vec<Vec<u8>>,
    deadline_ms: Option<u64>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    by_key: HashMap<(u8, Vec<u8>), VecDeque<u64>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// Clients blocked right now (INFO `blocked_clients`); 0 makes the write hook free.
static BLOCKED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The waiter for the next handler run on this thread (set by the worker around a
    /// client's own blocking command).
    static CURRENT: Cell<Option<Waiter>> = const { Cell::new(None) };
    /// Replies produced on this thread for blocked clients, for the worker to route.
    static DELIVER: RefCell<Vec<(Waiter, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    /// The last handler run registered its client (its reply slot stays unfilled).
    static LAST_BLOCKED: Cell<bool> = const { Cell::new(false) };
    static RETRY: RefCell<Vec<Retry>> = const { RefCell::new(Vec::new()) };
    /// Nesting of `defer_begin` stretches on this thread.
    static DEFER_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Keys written inside the current stretch, in write order.
    static PENDING_READY: RefCell<Vec<(u8, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

/// True (once) when the last handler run on this thread blocked its client.
pub fn take_blocked() -> bool {
    LAST_BLOCKED.with(|b| b.replace(false))
}

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REGISTRY.lock().expect("blocking registry lock");
    f(g.get_or_insert_with(Registry::default))
}

/// Number of blocked clients.
pub fn blocked_clients() -> usize {
    BLOCKED.load(Ordering::Relaxed)
}

/// The next handler run on this thread is `waiter`'s own command and may block.
pub fn set_current(waiter: Option<Waiter>) {
    CURRENT.with(|c| c.set(waiter));
}

/// Called around a keyed handler (`exec_on`): arms the handler's permission to block.
pub fn before_handler() -> Option<Waiter> {
    let w = CURRENT.with(|c| c.take());
    set_may_block(w.is_some());
    w
}

/// Called after a keyed handler: registers the client when it blocked (then
/// `take_blocked` is true: its reply slot stays unfilled), else serves clients waiting on
/// the keys it wrote.
pub fn after_handler(
    waiter: Option<Waiter>,
    shards: &mut ShardSet,
    spec: &CommandSpec,
    args: &[&[u8]],
    db: u8,
    now_ms: u64,
    max_bulk: usize,
) {
    set_may_block(false);
    let blocked = match (crate::commands::blocking::take_request(), waiter) {
        (Some(req), Some(w)) => {
            register(w, req, args, db);
            true
        }
        _ => false,
    };
    if !blocked && spec.may_write() && blocked_clients() > 0 {
        PENDING_READY.with(|p| {
            let mut p = p.borrow_mut();
            for pos in key_positions(spec, args) {
                p.push((db, args[pos].to_vec()));
            }
        });
    }
    LAST_BLOCKED.with(|b| b.set(blocked));
    if DEFER_DEPTH.with(|d| d.get()) == 0 {
        serve_pending(shards, now_ms, max_bulk);
    }
}

/// Starts a stretch (EXEC, a script, one handler) whose writes serve blocked clients
/// only when it ends, as Redis serves ready keys after the whole command.
pub fn defer_begin() {
    DEFER_DEPTH.with(|d| d.set(d.get() + 1));
}

/// Ends a `defer_begin` stretch; the outermost serves the keys written in it.
pub fn defer_end(shards: &mut ShardSet, now_ms: u64, max_bulk: usize) {
    let depth = DEFER_DEPTH.with(|d| {
        let v = d.get().saturating_sub(1);
        d.set(v);
        v
    });
    if depth == 0 {
        serve_pending(shards, now_ms, max_bulk);
    }
}

fn serve_pending(shards: &mut ShardSet, now_ms: u64, max_bulk: usize) {
    let ready = PENDING_READY.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if !ready.is_empty() && blocked_clients() > 0 {
        serve_keys(shards, ready, now_ms, max_bulk);
    }
}

fn register(w: Waiter, req: BlockRequest, args: &[&[u8]], db: u8) {
    with_registry(|reg| {
        let id = reg.next_id;
        reg.next_id += 1;
        for k in &req.keys {
            reg.by_key.entry((db, k.clone())).or_default().push_back(id);
        }
        reg.entries.insert(
            id,
            Entry {
                waiter: w,
                db,
                args: args.iter().map(|a| a.to_vec()).collect(),
                keys: req.keys,
                deadline_ms: req.deadline_ms,
            },
        );
    });
    BLOCKED.fetch_add(1, Ordering::Relaxed);
}

fn remove(reg: &mut Registry, id: u64) -> Option<Entry> {
    let e = reg.entries.remove(&id)?;
    for k in &e.keys {
        let key = (e.db, k.clone());
        if let Some(q) = reg.by_key.get_mut(&key) {
            q.retain(|&x| x != id);
            if q.is_empty() {
                reg.by_key.remove(&key);
            }
        }
    }
    BLOCKED.fetch_sub(1, Ordering::Relaxed);
    Some(e)
}

/// Serves the clients blocked on `keys` (just written on this thread) in order.
fn serve_keys(shards: &mut ShardSet, keys: Vec<(u8, Vec<u8>)>, now_ms: u64, max_bulk: usize) {
    with_registry(|reg| {
        let mut ready: VecDeque<(u8, Vec<u8>)> = keys.into();
        while let Some((db, key)) = ready.pop_front() {
            let Some(queue) = reg.by_key.get(&(db, key.clone())) else {
                continue;
            };
            let ids: Vec<u64> = queue.iter().copied().collect();
            for id in ids {
                let Some(e) = reg.entries.get(&id) else {
                    continue;
                };
                let args = narrow_to_key(&e.args, &key);
                let Some(spec) = lookup(&args[0]) else {
                    continue;
                };
                let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
                // Every key of the attempt must be held here. BLMOVE's destination may
                // live on another worker: the client's worker runs it again with every
                // shard held; nobody behind it on this key is served before that run
                // (whose own write serves them), so the blocking order holds.
                if key_positions(spec, &refs)
                    .any(|p| shards.slots[shards.shard_id(refs[p]) as usize].is_none())
                {
                    if let Some(e) = remove(reg, id) {
                        retry_later(Retry {
                            waiter: e.waiter,
                            db: e.db,
                            args: e.args,
                        });
                    }
                    break;
                }
                let handler = spec.handler.expect("blocking commands have handlers");
                let mut out = Vec::new();
                // BLMOVE/BRPOPLPUSH write two keys: one write scope, as `exec_on` opens.
                let mut ids: Vec<u32> = key_positions(spec, &refs)
                    .map(|p| shards.shard_id(refs[p]))
                    .collect();
                let scoped = spec.may_write() && ids.len() > 1;
                if scoped {
                    ids.sort_unstable();
                    ids.dedup();
                    let set = &mut *shards;
                    set.groups.begin(&mut set.slots, ids);
                }
                let mut ctx = Ctx {
                    shards,
                    db,
                    now_ms,
                    max_bulk,
                    busy_round: None,
                };
                set_may_block(false);
                let mut r = ReplyBuf::new(&mut out, e.waiter.proto);
                let result = handler(&mut ctx, &refs, &mut r);
                if scoped {
                    if let Err(err) = super::worker::close_write_scope(shards) {
                        tracing::error!("a served blocked write could not be made durable: {err}");
                        out.clear();
                        let msg = crate::commands::storage_error(err);
                        ReplyBuf::new(&mut out, e.waiter.proto).error(&msg);
                    }
                }
                if take_empty() {
                    break; // the key has nothing left for anyone behind
                }
                if result.is_err() {
                    continue; // another kind now (WRONGTYPE): Redis keeps it blocked
                }
                for p in key_positions(spec, &refs) {
                    if refs[p] != key.as_slice() {
                        ready.push_back((db, refs[p].to_vec()));
                    }
                }
                if let Some(e) = remove(reg, id) {
                    DELIVER.with(|d| d.borrow_mut().push((e.waiter, out)));
                }
            }
        }
    });
}

/// A blocked client whose serve attempt needs shards the serving thread does not hold
/// (BLMOVE with the destination on another worker): its worker runs the command again
/// with every shard held, into the same reply slot.
#[derive(Debug)]
pub struct Retry {
    pub waiter: Waiter,
    pub db: u8,
    pub args: Vec<Vec<u8>>,
}

/// Retries produced on this thread (or queued for a later round) since the last call.
pub fn take_retries() -> Vec<Retry> {
    RETRY.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Queues a retry on this thread (received from another worker, or not run yet).
pub fn retry_later(r: Retry) {
    RETRY.with(|q| q.borrow_mut().push(r));
}

/// Replies for blocked clients produced on this thread since the last call.
pub fn take_deliveries() -> Vec<(Waiter, Vec<u8>)> {
    DELIVER.with(|d| std::mem::take(&mut *d.borrow_mut()))
}

/// The timeout (or CLIENT UNBLOCK TIMEOUT) reply: a nil array for every blocking
/// command, BLMOVE and BRPOPLPUSH included (Redis's `replyToBlockedClientTimedOut`; in
/// MULTI those two answer a nil bulk instead, which their handlers write).
fn timeout_reply(_args: &[Vec<u8>], proto: Proto) -> Vec<u8> {
    let mut out = Vec::new();
    ReplyBuf::new(&mut out, proto).null_array();
    out
}

/// The earliest deadline among `worker`'s blocked clients.
pub fn next_deadline_ms(worker: usize) -> Option<u64> {
    if blocked_clients() == 0 {
        return None;
    }
    with_registry(|reg| {
        reg.entries
            .values()
            .filter(|e| e.waiter.worker == worker)
            .filter_map(|e| e.deadline_ms)
            .min()
    })
}

/// Removes `worker`'s clients whose deadline has passed; returns their nil replies.
pub fn expire(worker: usize, now_ms: u64) -> Vec<(Waiter, Vec<u8>)> {
    if blocked_clients() == 0 {
        return Vec::new();
    }
    with_registry(|reg| {
        let due: Vec<u64> = reg
            .entries
            .iter()
            .filter(|(_, e)| {
                e.waiter.worker == worker && e.deadline_ms.is_some_and(|d| d <= now_ms)
            })
            .map(|(&id, _)| id)
            .collect();
        let mut out: Vec<(u64, Waiter, Vec<u8>)> = Vec::new();
        for id in due {
            if let Some(e) = remove(reg, id) {
                out.push((id, e.waiter, timeout_reply(&e.args, e.waiter.proto)));
            }
        }
        // In the order they blocked.
        out.sort_by_key(|x| x.0);
        out.into_iter().map(|(_, w, b)| (w, b)).collect()
    })
}

/// A connection closed: forget its blocked command, if any.
pub fn forget(worker: usize, token: ConnToken) {
    if blocked_clients() == 0 {
        return;
    }
    with_registry(|reg| {
        let ids: Vec<u64> = reg
            .entries
            .iter()
            .filter(|(_, e)| same_conn(&e.waiter, worker, token))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            remove(reg, id);
        }
    });
}

fn same_conn(w: &Waiter, worker: usize, token: ConnToken) -> bool {
    w.worker == worker && w.token.packed() == token.packed()
}

/// True when the connection `token` of `worker` is blocked (CLIENT LIST flag `b`).
pub fn is_blocked(worker: usize, token: ConnToken) -> bool {
    blocked_clients() > 0
        && with_registry(|reg| {
            reg.entries
                .values()
                .any(|e| same_conn(&e.waiter, worker, token))
        })
}

/// CLIENT UNBLOCK: removes the client's blocked command and returns the reply it gets
/// (its timeout reply, or the UNBLOCKED error); `None` when it is not blocked.
pub fn unblock(worker: usize, token: ConnToken, error: bool) -> Option<(Waiter, Vec<u8>)> {
    if blocked_clients() == 0 {
        return None;
    }
    with_registry(|reg| {
        let id = reg
            .entries
            .iter()
            .find(|(_, e)| same_conn(&e.waiter, worker, token))
            .map(|(&id, _)| id)?;
        let e = remove(reg, id)?;
        let bytes = if error {
            b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n".to_vec()
        } else {
            timeout_reply(&e.args, e.waiter.proto)
        };
        Some((e.waiter, bytes))
    })
}

/// Queues a reply for a waiter on this thread (CLIENT UNBLOCK).
pub fn deliver_later(w: Waiter, bytes: Vec<u8>) {
    DELIVER.with(|d| d.borrow_mut().push((w, bytes)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(worker: usize, slot: u32, seq: u64) -> Waiter {
        Waiter {
            worker,
            token: ConnToken { slot, gen: 1 },
            seq,
            proto: Proto::Resp2,
        }
    }

    fn block(w: Waiter, keys: &[&[u8]], deadline_ms: Option<u64>) {
        let req = BlockRequest {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            deadline_ms,
        };
        let mut args: Vec<&[u8]> = vec![b"blpop"];
        args.extend_from_slice(keys);
        args.push(b"0");
        register(w, req, &args, 0);
    }

    // Expiry answers only the worker's own due waiters, in blocking order, with a nil
    // array; CLIENT UNBLOCK and close remove exactly their connection's waiter.
    #[test]
    fn registry_lifecycle() {
        let before = blocked_clients();
        block(waiter(7, 1, 10), &[b"rk1", b"rk2"], Some(100));
        block(waiter(7, 2, 20), &[b"rk1"], Some(50));
        block(waiter(8, 3, 30), &[b"rk1"], Some(10));
        block(waiter(7, 4, 40), &[b"rk2"], None);
        assert_eq!(blocked_clients(), before + 4);
        assert_eq!(next_deadline_ms(7), Some(50));
        let due = expire(7, 100);
        assert_eq!(
            due.iter().map(|(w, _)| w.seq).collect::<Vec<_>>(),
            vec![10, 20]
        );
        assert!(due.iter().all(|(_, b)| b == b"*-1\r\n"));
        assert!(is_blocked(8, ConnToken { slot: 3, gen: 1 }));
        let (w, bytes) = unblock(8, ConnToken { slot: 3, gen: 1 }, true).unwrap();
        assert_eq!((w.seq, bytes.starts_with(b"-UNBLOCKED")), (30, true));
        assert!(unblock(8, ConnToken { slot: 3, gen: 1 }, false).is_none());
        forget(7, ConnToken { slot: 4, gen: 1 });
        assert!(!is_blocked(7, ConnToken { slot: 4, gen: 1 }));
        assert_eq!(blocked_clients(), before);
    }
}
