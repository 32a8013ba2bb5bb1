//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH (Redis 7.2 `multi.c` semantics).
//!
//! A child module of the worker (like `commit.rs`) so it can use the worker's shards,
//! outbox and batch-read ring directly; `worker.rs` only calls in at four points: queueing
//! in `dispatch`, flagging queue-time errors there, the `Unwatch` mailbox message and
//! `begin_close`.
//!
//! - **Queueing.** While a connection is in MULTI every command except EXEC, DISCARD,
//!   MULTI, WATCH, QUIT and RESET is checked as usual (unknown command, arity, ACL,
//!   loading) and, if it passes, stored with `+QUEUED`; if it fails, its error is replied
//!   and the transaction is flagged, so EXEC answers EXECABORT.
//! - **Atomic EXEC.** EXEC's key set is the union of the queued commands' declared keys and
//!   the watched keys; a queued command that needs every shard (KEYS, FLUSHALL, INFO,
//!   CONFIG, ...) makes it every shard. EXEC runs only where all of those shards are held:
//!   on the connection's worker when they are its own, otherwise in the coordinated pass
//!   that borrows every worker's shards (the EVAL path). Holding them, it checks the
//!   watches and runs the whole queue with no other command interleaved anywhere.
//! - **Device reads.** On the worker's own shards EXEC first plans the reads of every
//!   queued command's declared keys and of the watched keys, and parks them as one unit
//!   (`server::reads`, "Transactions"): the connection waits at its EXEC, the worker serves
//!   others, and when the reads are done EXEC plans again and runs with the records lent,
//!   so handlers read from memory. A transaction is never parked half-way: it parks before
//!   the WATCH check, and runs whole once it starts. On borrowed shards (the coordinated
//!   pass) it cannot park, and the pass must not wait for the device either (every worker
//!   is stopped while it runs): there `cross_prefetch` plans the same lookups with every
//!   shard held and, when records are missing, leaves EXEC unrun — before the WATCH check,
//!   nothing applied — while the owning workers fetch them (`Msg::Prefetch`, parked on
//!   their rings; this worker parks its own part) and send them back (`Msg::Prefetched`).
//!   With all parts back EXEC goes to the next pass and checks again with the records in
//!   hand; after `CROSS_PREFETCH_ROUNDS_MAX` rounds it reads what is still missing on the
//!   batch ring, once for the whole transaction. WATCH over several workers, scripts and
//!   other multi-worker keyed commands (`Worker::run_borrowed`) do the same.
//! - **WATCH** registers each key on the shard that owns it (`storage::watch`): every write
//!   of the key on that shard, from any connection, script or expiry, counts as a touch.
//!   WATCH runs where its keys' shards are held (the same rule as EXEC); releasing a watch
//!   of a shard held elsewhere is a mailbox message to its owner (`Msg::Unwatch`), which can
//!   only arrive late, never early, so a watch is never dropped while needed.
//! - **Durability.** Queued writes set `round_writes`, so with `appendfsync always` EXEC's
//!   reply is held like any write reply until the epoch covering them is durable; on
//!   borrowed shards the coordinated pass flushes and syncs before the shards go back.
//!
//! ACL permissions are checked when a command is queued and again when EXEC runs it (the
//! rules may change in between; Redis 7.2 does the same, without an ACL LOG entry here).
//!
//! - **Crash atomicity.** A transaction that writes runs in one write scope over its
//!   shards: after a crash it is wholly present or wholly absent (`docs/atomic-writes.md`).
//!
//! Deliberately missing: CLIENT LIST's `d` (dirty CAS) flag, which
//! would need the watched shards at listing time.

use super::super::conn::Conn;
use super::super::reads::{self, plan_keys, ArgList, Parked, ReadDest, PLAN_ROUNDS_MAX};
use super::super::ConnToken;
use super::{Msg, Outcome, Worker};
use crate::commands::table::key_positions;
use crate::commands::{lookup, CommandSpec, Kind};
use crate::resp::ReplyBuf;
use crate::storage::prefetch::Fetched;
use crate::storage::watch::WatchMark;
use std::sync::atomic::Ordering;

/// One watched key: where it lives and what its shard said at WATCH time.
#[derive(Debug)]
pub struct Watched {
    pub db: u8,
    pub key: Vec<u8>,
    pub shard: u32,
    pub mark: WatchMark,
}

/// A queued command: its table entry (looked up once, when queued) and its arguments.
pub struct Queued(pub &'static CommandSpec, pub Vec<Vec<u8>>);

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queued({}, {} args)", self.0.name, self.1.len())
    }
}

/// A connection's transaction state.
#[derive(Debug, Default)]
pub struct TxnState {
    pub in_multi: bool,
    /// An error at queue time: EXEC will answer EXECABORT.
    pub aborted: bool,
    /// The queued commands, each with its table entry (looked up once, when queued).
    pub queued: Vec<Queued>,
    /// Commands of the queue taken out by a running EXEC (CLIENT INFO inside EXEC still
    /// reports them, as Redis does).
    pub executing: usize,
    pub watched: Vec<Watched>,
    /// Records EXEC's parked reads fetched (with their shards), lent when it runs.
    pub prefetched: Vec<Fetched>,
    pub prefetched_shard: Vec<u32>,
    /// Times this EXEC parked for reads; at `PLAN_ROUNDS_MAX` it runs with what it has.
    pub prefetch_rounds: u32,
    /// The shards the parked reads were for, and their `change_signature` sum when the
    /// reads were done: unchanged when EXEC runs, planning again would find nothing new.
    pub prefetch_shards: Vec<u32>,
    pub prefetch_signature: Option<u64>,
    /// Cross-worker prefetch units (`Worker::cross_prefetch`) not back yet; the connection
    /// waits at its command until they are.
    pub xwaiting: u32,
    /// Cross-worker prefetch rounds of the command at hand (`CROSS_PREFETCH_ROUNDS_MAX`).
    /// `prefetched` also carries such a command's records when it is not an EXEC or WATCH
    /// (a script or another multi-worker keyed command): it waits at that command, so no
    /// other use of them can come in between.
    pub xrounds: u32,
}

/// What `Worker::cross_prefetch` decided for a command about to run in the coordinated
/// pass.
pub(super) enum Cross {
    /// Every record its lookups need is in memory (or fetched): run it.
    Ready,
    /// Its owners (and this worker, for its own shards) are fetching records: the command
    /// waits outside the pass and runs in a later one.
    Parked,
    /// Still missing records after `CROSS_PREFETCH_ROUNDS_MAX` rounds or a failed read:
    /// the pass reads them on the batch ring.
    Fallback,
}

/// Prefetch rounds per cross-worker command before the pass reads what it still misses
/// itself (a key rewritten between every prefetch and pass).
pub const CROSS_PREFETCH_ROUNDS_MAX: u32 = 3;

impl TxnState {
    /// CLIENT LIST's `multi=`: queued commands while in MULTI, -1 otherwise.
    pub fn multi_field(&self) -> i64 {
        if self.in_multi {
            (self.queued.len() + self.executing) as i64
        } else {
            -1
        }
    }

    fn end_multi(&mut self) {
        self.in_multi = false;
        self.aborted = false;
        self.queued = Vec::new();
        self.executing = 0;
        self.prefetched = Vec::new();
        self.prefetched_shard = Vec::new();
        self.prefetch_rounds = 0;
        self.prefetch_shards = Vec::new();
        self.prefetch_signature = None;
        self.xrounds = 0;
    }
}

const ERR_EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";
const ERR_ACL_CHANGED: &str = "NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following reason: ";

/// Commands that run at once inside MULTI instead of being queued (Redis's list).
fn runs_inside_multi(name: &str) -> bool {
    matches!(
        name,
        "exec" | "discard" | "multi" | "watch" | "quit" | "reset"
    )
}

/// Connection commands that need no shard: they do not widen EXEC's key set.
fn needs_no_shard(name: &str) -> bool {
    matches!(name, "ping" | "echo" | "select" | "time")
}

impl Worker {
    /// A command was refused before running (unknown, arity, ACL, loading): inside MULTI
    /// that dooms the transaction.
    pub(super) fn txn_flag_error(conn: &mut Conn) {
        if conn.txn.in_multi {
            conn.txn.aborted = true;
        }
    }

    /// Inside MULTI, queues `args` and replies `+QUEUED`; `true` when it did.
    pub(super) fn txn_queue(conn: &mut Conn, spec: &'static CommandSpec, args: &[&[u8]]) -> bool {
        if !conn.txn.in_multi || runs_inside_multi(spec.name) {
            return false;
        }
        conn.txn
            .queued
            .push(Queued(spec, args.iter().map(|a| a.to_vec()).collect()));
        conn.reply(|r| r.simple("QUEUED"));
        true
    }

    /// MULTI, EXEC, DISCARD, WATCH and UNWATCH (from `server::local`).
    pub fn txn_command(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        spec: &CommandSpec,
        args: &[&[u8]],
        now: u64,
    ) -> Outcome {
        match spec.name {
            "multi" => {
                if conn.txn.in_multi {
                    conn.reply(|r| r.error("ERR MULTI calls can not be nested"));
                } else {
                    conn.txn.in_multi = true;
                    conn.reply(|r| r.ok());
                }
                Outcome::Done
            }
            "discard" => {
                if !conn.txn.in_multi {
                    conn.reply(|r| r.error("ERR DISCARD without MULTI"));
                } else {
                    self.txn_reset(conn);
                    conn.reply(|r| r.ok());
                }
                Outcome::Done
            }
            "unwatch" => {
                self.txn_unwatch_all(conn);
                conn.reply(|r| r.ok());
                Outcome::Done
            }
            "watch" => self.txn_watch(conn, slot, args, now),
            "exec" => self.txn_exec(conn, slot, now),
            _ => unreachable!("txn_command is called for transaction commands only"),
        }
    }

    /// Leaves MULTI and drops every watch (DISCARD, RESET).
    pub fn txn_reset(&mut self, conn: &mut Conn) {
        conn.txn.end_multi();
        self.txn_unwatch_all(conn);
    }

    pub(super) fn txn_unwatch_all(&mut self, conn: &mut Conn) {
        let watched = std::mem::take(&mut conn.txn.watched);
        self.txn_release(watched);
    }

    /// Releases watches: on shards held here at once, others by a message to their owner.
    pub(super) fn txn_release(&mut self, watched: Vec<Watched>) {
        for w in watched {
            match self.shards.slots[w.shard as usize].as_mut() {
                Some(s) => s.watch_release(w.db, &w.key),
                None => {
                    let owner = self.shared.worker_of_shard(w.shard);
                    self.outbox[owner].push(super::Msg::Unwatch {
                        db: w.db,
                        shard: w.shard,
                        key: w.key,
                    });
                }
            }
        }
    }

    /// `Msg::Unwatch`: a connection elsewhere stopped watching a key of our shard.
    pub(super) fn txn_on_unwatch(&mut self, db: u8, shard: u32, key: &[u8]) {
        if let Some(s) = self
            .shards
            .slots
            .get_mut(shard as usize)
            .and_then(|s| s.as_mut())
        {
            s.watch_release(db, key);
        }
    }

    /// Whether this thread holds every shard in `shards` (`None`: every shard there is).
    fn txn_holds(&self, shards: Option<&[u32]>) -> bool {
        match shards {
            None => self.shards.slots.iter().all(Option::is_some),
            Some(ids) => ids
                .iter()
                .all(|&id| self.shards.slots[id as usize].is_some()),
        }
    }

    /// Not all shards held: wait for earlier remote replies first (order), else go to the
    /// coordinated pass, where every shard is held.
    fn txn_elsewhere(conn: &Conn) -> Outcome {
        let waiting_remote = conn
            .pending
            .iter()
            .any(|p| matches!(p, super::Slot::Waiting(_)));
        if waiting_remote {
            Outcome::Blocked
        } else {
            Outcome::Retry
        }
    }

    fn txn_watch(&mut self, conn: &mut Conn, slot: u32, args: &[&[u8]], now: u64) -> Outcome {
        if conn.txn.in_multi {
            conn.reply(|r| r.error("ERR WATCH inside MULTI is not allowed"));
            return Outcome::Done;
        }
        // While loading no worker holds shards yet: nothing to register on.
        if self
            .shared
            .loading
            .load(std::sync::atomic::Ordering::Acquire)
        {
            conn.reply(|r| r.error("LOADING Redis is loading the dataset in memory"));
            return Outcome::Done;
        }
        // An earlier parked command of this connection may write a key watched here: it
        // must run first, as it would in Redis.
        if conn.parked > 0 {
            return Outcome::Blocked;
        }
        let ids: Vec<u32> = args[1..].iter().map(|k| self.shards.shard_id(k)).collect();
        if !self.txn_holds(Some(&ids)) {
            return Self::txn_elsewhere(conn);
        }
        let db = conn.db;
        // WATCH reads each key's record (an expired key is watched as absent): on the
        // device, the connection waits at WATCH for them without blocking the worker.
        let keys: Vec<(u8, Vec<u8>)> = args[1..].iter().map(|k| (db, k.to_vec())).collect();
        if !self.txn_all_own(Some(&ids)) {
            // In the coordinated pass: the owners fetch the records first.
            match self.cross_prefetch(conn, slot, &keys) {
                Cross::Parked => return Outcome::Blocked,
                Cross::Fallback => self.txn_batch_fetch(conn, &keys),
                Cross::Ready => {}
            }
        } else if self.txn_park_for(conn, slot, &ids, keys) {
            return Outcome::Blocked;
        }
        let lent = (!conn.txn.prefetched.is_empty()).then(|| {
            let fetched = std::mem::take(&mut conn.txn.prefetched);
            let fetched_shard = std::mem::take(&mut conn.txn.prefetched_shard);
            reads::lend(&mut self.shards, fetched, fetched_shard)
        });
        conn.txn.prefetch_rounds = 0;
        conn.txn.prefetch_signature = None;
        conn.txn.xrounds = 0;
        let outcome = self.txn_watch_keys(conn, args, &ids, now);
        self.txn_give_back(lent);
        outcome
    }

    fn txn_watch_keys(
        &mut self,
        conn: &mut Conn,
        args: &[&[u8]],
        ids: &[u32],
        now: u64,
    ) -> Outcome {
        let db = conn.db;
        for (key, &shard) in args[1..].iter().zip(ids) {
            if conn
                .txn
                .watched
                .iter()
                .any(|w| w.db == db && w.key.as_slice() == *key)
            {
                continue;
            }
            let s = self.shards.slots[shard as usize]
                .as_mut()
                .expect("held: checked above");
            match s.watch_register(db, key, now) {
                Ok(mark) => conn.txn.watched.push(Watched {
                    db,
                    key: key.to_vec(),
                    shard,
                    mark,
                }),
                Err(e) => {
                    let msg = crate::commands::storage_error(e);
                    conn.reply(|r| r.error(&msg));
                    return Outcome::Done;
                }
            }
        }
        conn.reply(|r| r.ok());
        Outcome::Done
    }

    /// The shards EXEC must hold: watched keys and queued commands' keys; `None` = all.
    fn txn_key_set(&self, conn: &Conn) -> Option<Vec<u32>> {
        let mut ids: Vec<u32> = conn.txn.watched.iter().map(|w| w.shard).collect();
        for Queued(spec, cmd) in &conn.txn.queued {
            match spec.kind {
                Kind::Keyed => {
                    let refs: Vec<&[u8]> = cmd.iter().map(|a| a.as_slice()).collect();
                    for p in key_positions(spec, &refs) {
                        ids.push(self.shards.shard_id(refs[p]));
                    }
                }
                Kind::Local if needs_no_shard(spec.name) => {}
                Kind::Local | Kind::AllShards => return None,
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    fn txn_exec(&mut self, conn: &mut Conn, slot: u32, now: u64) -> Outcome {
        if !conn.txn.in_multi {
            conn.reply(|r| r.error("ERR EXEC without MULTI"));
            return Outcome::Done;
        }
        if conn.txn.aborted {
            self.txn_reset(conn);
            conn.reply(|r| r.error(ERR_EXECABORT));
            return Outcome::Done;
        }
        if conn.parked > 0 {
            return Outcome::Blocked;
        }
        let need = self.txn_key_set(conn);
        if !self.txn_holds(need.as_deref()) {
            return Self::txn_elsewhere(conn);
        }
        // Records still on the device: wait for them without blocking the worker. On
        // borrowed shards (the coordinated pass) their owners fetch them first, and the
        // EXEC runs in a later pass.
        if !self.txn_all_own(need.as_deref()) {
            let keys = self.txn_read_keys(conn);
            match self.cross_prefetch(conn, slot, &keys) {
                Cross::Parked => return Outcome::Blocked,
                Cross::Fallback => self.txn_batch_fetch(conn, &keys),
                Cross::Ready => {}
            }
        } else if self.txn_park_reads(conn, slot, need.as_deref()) {
            return Outcome::Blocked;
        }
        // Every shard of the transaction is held: from here to the reply nothing else runs
        // on them. What the parked reads fetched is lent for all of it.
        let lent = (!conn.txn.prefetched.is_empty()).then(|| {
            let fetched = std::mem::take(&mut conn.txn.prefetched);
            let fetched_shard = std::mem::take(&mut conn.txn.prefetched_shard);
            reads::lend(&mut self.shards, fetched, fetched_shard)
        });
        let watched = std::mem::take(&mut conn.txn.watched);
        let mut dirty = false;
        for w in &watched {
            let s = self.shards.slots[w.shard as usize]
                .as_mut()
                .expect("watched shards are in the key set");
            // A read error fails the EXEC: better than running on a stale check.
            if s.watch_changed(w.db, &w.key, w.mark, now).unwrap_or(true) {
                dirty = true;
                break;
            }
        }
        self.txn_release(watched);
        if dirty {
            self.txn_give_back(lent);
            conn.txn.end_multi();
            conn.reply(|r| r.null_array());
            return Outcome::Done;
        }
        let queued = std::mem::take(&mut conn.txn.queued);
        conn.txn.executing = queued.len();
        // Crash atomicity: the whole EXEC is one write scope over its shards (a group when
        // they are several, `storage::WriteGroups`); queued commands nest inside it.
        let writes = queued.iter().any(|Queued(spec, _)| spec.may_write());
        let scope_ids: Option<Vec<u32>> = writes.then(|| {
            let held = |id: &u32| self.shards.slots[*id as usize].is_some();
            match &need {
                Some(ids) => ids.iter().copied().filter(held).collect(),
                None => (0..self.shards.shard_count).filter(held).collect(),
            }
        });
        if let Some(ids) = scope_ids.clone().filter(|ids| !ids.is_empty()) {
            let set = &mut self.shards;
            set.groups.begin(&mut set.slots, ids);
        }
        let mut out = Vec::new();
        ReplyBuf::new(&mut out, conn.proto).array(queued.len());
        // Clients blocked on keys the transaction writes are served after all of it.
        super::super::blocking::defer_begin();
        for Queued(spec, cmd) in &queued {
            let spec: &'static CommandSpec = spec;
            let refs: Vec<&[u8]> = cmd.iter().map(|a| a.as_slice()).collect();
            if let Some(reason) = super::super::acl_cmd::recheck(self, conn, spec, &refs) {
                let msg = format!("{ERR_ACL_CHANGED}{reason}");
                ReplyBuf::new(&mut out, conn.proto).error(&msg);
                continue;
            }
            if spec.may_write() {
                self.round_writes = true;
            }
            // Every record the declared keys' lookups need is in memory or lent (parked
            // for, prefetched or batch-read above): handlers run from memory.
            match spec.kind {
                Kind::Keyed | Kind::AllShards => {
                    let (db, proto) = (conn.db, conn.proto);
                    self.exec_handler(spec, &refs, db, proto, now, &mut out);
                }
                Kind::Local => self.txn_run_local(conn, slot, spec, &refs, now, &mut out),
            }
            // As Redis: a queued command counts, and reaches MONITOR, when EXEC runs it.
            self.commands_this_round += 1;
            if self.shared.monitor_count.load(Ordering::Relaxed) > 0 {
                self.feed_monitors(conn, &refs);
            }
        }
        // Back before blocked clients are served (their handlers lend records of their own).
        self.txn_give_back(lent);
        if scope_ids.is_some_and(|ids| !ids.is_empty()) {
            if let Err(e) = super::close_write_scope(&mut self.shards) {
                tracing::error!("a transaction's writes could not be made durable: {e}");
                out.clear();
                ReplyBuf::new(&mut out, conn.proto).error(&crate::commands::storage_error(e));
            }
        }
        super::super::blocking::defer_end(&mut self.shards, now, self.max_bulk);
        conn.txn.end_multi();
        super::tracking::append_own(&mut out, conn.proto);
        if conn.pending.is_empty() {
            conn.out.extend_from_slice(&out);
        } else {
            conn.push_ready(out);
        }
        Outcome::Done
    }

    /// Parks EXEC for the device reads its WATCH check and queue need (`true`: parked,
    /// the connection waits at EXEC). Only when every shard of the transaction is this
    /// worker's own: borrowed shards cannot wait (their reads must not outlive the loan).
    fn txn_park_reads(&mut self, conn: &mut Conn, slot: u32, need: Option<&[u32]>) -> bool {
        let Some(ids) = need else {
            return false;
        };
        let keys = self.txn_read_keys(conn);
        self.txn_park_for(conn, slot, ids, keys)
    }

    /// Parks the connection's EXEC or WATCH for the reads that lookups of `keys` need
    /// (`true`: parked), when all of `ids` (the shards) are the worker's own.
    fn txn_park_for(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        ids: &[u32],
        keys: Vec<(u8, Vec<u8>)>,
    ) -> bool {
        let (n, me) = (self.shared.workers.len(), self.id);
        let own = move |s: u32| s as usize % n == me;
        if ids.is_empty()
            || !ids.iter().all(|&id| own(id))
            || conn.txn.prefetch_rounds >= PLAN_ROUNDS_MAX
        {
            return false;
        }
        // The reads are back and nothing they depended on changed since: run now.
        if conn.txn.prefetch_signature.take().is_some_and(|sig| {
            conn.txn.prefetch_shards == ids && reads::shard_signature(&self.shards, ids) == sig
        }) {
            return false;
        }
        let mut todo = self.reads.plan_vec();
        plan_keys(
            &mut self.shards,
            own,
            &keys,
            &conn.txn.prefetched,
            &mut todo,
        );
        if todo.is_empty() {
            self.reads.give_plan_vec(todo);
            return false;
        }
        let exec = lookup(b"exec").expect("EXEC is in the command table");
        let dest = ReadDest::Local {
            token: ConnToken {
                slot,
                gen: conn.gen,
            },
            seq: conn.next_seq,
        };
        let no_args: &[&[u8]] = &[];
        let mut p = Parked::new(dest, exec, ArgList::new(no_args), conn.db, conn.proto);
        p.keyset = Some(keys);
        p.note_plan(&self.shards, &todo);
        self.shared
            .stats
            .parked_reads
            .fetch_add(todo.len() as u64, Ordering::Relaxed);
        self.shared
            .stats
            .parked_commands
            .fetch_add(1, Ordering::Relaxed);
        self.reads.park(p, todo, &mut self.ring, &self.fixed_files);
        conn.txn.prefetch_shards.clear();
        conn.txn.prefetch_shards.extend_from_slice(ids);
        conn.parked += 1;
        conn.txn.prefetch_rounds += 1;
        true
    }

    /// The lookups EXEC will make: the watched keys (for the WATCH check's expiry test)
    /// and every queued keyed command's declared keys, in the database each runs in
    /// (following queued SELECTs). A blind write's keys (plain SET, SETEX, PSETEX, MSET)
    /// are left out when the shards take blind writes, as `reads::plan` leaves them out
    /// for the same command outside a transaction: `Shard::put_blind` reads nothing it
    /// does not have. (Planning them parked nearly every `MULTI; SET; SET; SET; EXEC` for
    /// one round, splitting its replies over two sends.)
    fn txn_read_keys(&self, conn: &Conn) -> Vec<(u8, Vec<u8>)> {
        let blind_ok = self.shared.settings.blind_writes;
        let mut keys: Vec<(u8, Vec<u8>)> = conn
            .txn
            .watched
            .iter()
            .filter(|w| !w.mark.expired)
            .map(|w| (w.db, w.key.clone()))
            .collect();
        let mut db = conn.db;
        for Queued(spec, cmd) in &conn.txn.queued {
            let refs: Vec<&[u8]> = cmd.iter().map(|a| a.as_slice()).collect();
            match spec.kind {
                Kind::Keyed
                    if blind_ok && crate::commands::string::blind_write(spec.name, &refs) => {}
                Kind::Keyed => {
                    for p in key_positions(spec, &refs) {
                        if !keys
                            .iter()
                            .any(|(d, k)| *d == db && k.as_slice() == refs[p])
                        {
                            keys.push((db, refs[p].to_vec()));
                        }
                    }
                }
                // A wrong guess (SELECT of a db that does not exist) costs a read, no more.
                Kind::Local if spec.name == "select" => {
                    if let Some(d) = refs.get(1).and_then(|a| std::str::from_utf8(a).ok()) {
                        db = d.parse().unwrap_or(db);
                    }
                }
                _ => {}
            }
        }
        keys
    }

    /// EXEC's (or WATCH's) parked reads are done (from `run_parked`): the records go to
    /// the connection and its EXEC is dispatched again. A failed read runs EXEC without parking again (its
    /// handler's own read reports the error).
    pub(super) fn txn_reads_done(&mut self, mut p: Parked) {
        let fetched = std::mem::take(&mut p.fetched);
        let fetched_shard = std::mem::take(&mut p.fetched_shard);
        if p.cross {
            let failed = p.error.is_some();
            match p.dest {
                ReadDest::Remote { from, token, .. } => self.outbox[from].push(Msg::Prefetched {
                    token,
                    fetched,
                    fetched_shard,
                    failed,
                }),
                ReadDest::Local { token, .. } => {
                    self.txn_prefetched(token, fetched, fetched_shard, failed)
                }
            }
            return;
        }
        let token = match p.dest {
            ReadDest::Local { token, .. } => token,
            ReadDest::Remote { token, .. } => token,
        };
        let failed = p.error.is_some();
        let shards = &self.shards;
        let conn = self
            .conns
            .get_mut(token.slot as usize)
            .and_then(|c| c.as_deref_mut())
            .filter(|c| c.gen == token.gen);
        let unused = match conn {
            Some(conn) => {
                conn.parked -= 1;
                if failed {
                    conn.txn.prefetch_rounds = PLAN_ROUNDS_MAX;
                } else {
                    let sig = reads::shard_signature(shards, &conn.txn.prefetch_shards);
                    conn.txn.prefetch_signature = Some(sig);
                }
                conn.txn.prefetched.extend(fetched);
                conn.txn.prefetched_shard.extend(fetched_shard);
                self.mark_ready(token.slot);
                None
            }
            None => Some((fetched, fetched_shard)),
        };
        if let Some((fetched, fetched_shard)) = unused {
            self.reads.recycle_fetched(fetched, fetched_shard);
        }
    }

    /// Takes back the records EXEC lent (see `txn_exec`), for reuse.
    fn txn_give_back(&mut self, lent: Option<reads::Lent>) {
        if let Some(lent) = lent {
            let (fetched, fetched_shard) = lent.give_back(&mut self.shards);
            self.reads.recycle_fetched(fetched, fetched_shard);
        }
    }

    /// Whether every shard in `ids` (`None`: every shard) is this worker's own, so that
    /// reads of them may park here; otherwise the command runs in the coordinated pass.
    fn txn_all_own(&self, ids: Option<&[u32]>) -> bool {
        let (n, me) = (self.shared.workers.len(), self.id);
        match ids {
            None => n == 1,
            Some(ids) => ids.iter().all(|&id| id as usize % n == me),
        }
    }

    /// Before a command runs in the coordinated pass (a cross-worker EXEC, WATCH, script
    /// or other multi-worker keyed command; every shard is held): plans the lookups of
    /// `keys` against memory and the records `conn` already holds. When reads are needed
    /// it asks each owning worker to fetch its part (`Msg::Prefetch`; this worker parks
    /// its own part on its ring) and answers `Parked`: the command is not run, nothing was
    /// written, the connection waits at it outside the pass, and once every part is back
    /// (`txn_prefetched`) it goes to the next pass with the records, where this check runs
    /// again. So the pass itself never waits for the device, unless a command still misses
    /// records after `CROSS_PREFETCH_ROUNDS_MAX` rounds (`Fallback`).
    pub(super) fn cross_prefetch(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        keys: &[(u8, Vec<u8>)],
    ) -> Cross {
        if conn.txn.xwaiting > 0 {
            return Cross::Parked;
        }
        let (n, me) = (self.shared.workers.len(), self.id);
        let mut by_worker: Vec<Vec<(u8, Vec<u8>)>> = vec![Vec::new(); n];
        let mut reads = Vec::new();
        for (db, key) in keys {
            let id = self.shards.shard_id(key);
            let Some(shard) = self.shards.slots[id as usize].as_mut() else {
                continue;
            };
            reads.clear();
            shard.plan_key_reads(*db, key, &conn.txn.prefetched, &mut reads);
            let w = id as usize % n;
            if !reads.is_empty() && !by_worker[w].iter().any(|(d, k)| d == db && k == key) {
                by_worker[w].push((*db, key.clone()));
            }
        }
        if by_worker.iter().all(Vec::is_empty) {
            return Cross::Ready;
        }
        let stats = &self.shared.stats;
        if conn.txn.xrounds >= CROSS_PREFETCH_ROUNDS_MAX {
            stats
                .cross_prefetch_fallbacks
                .fetch_add(1, Ordering::Relaxed);
            return Cross::Fallback;
        }
        stats.cross_prefetches.fetch_add(1, Ordering::Relaxed);
        if conn.txn.xrounds > 0 {
            stats.cross_prefetch_retries.fetch_add(1, Ordering::Relaxed);
        }
        conn.txn.xrounds += 1;
        let token = ConnToken {
            slot,
            gen: conn.gen,
        };
        for (w, part) in by_worker.into_iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            if w == me {
                let own = move |s: u32| s as usize % n == me;
                let mut todo = self.reads.plan_vec();
                plan_keys(
                    &mut self.shards,
                    own,
                    &part,
                    &conn.txn.prefetched,
                    &mut todo,
                );
                if todo.is_empty() {
                    self.reads.give_plan_vec(todo);
                    continue;
                }
                let dest = ReadDest::Local {
                    token,
                    seq: conn.next_seq,
                };
                self.cross_park(dest, part, todo);
            } else {
                self.outbox[w].push(Msg::Prefetch {
                    from: me,
                    token,
                    keys: part,
                });
            }
            conn.parked += 1;
            conn.txn.xwaiting += 1;
        }
        if conn.txn.xwaiting == 0 {
            Cross::Ready
        } else {
            Cross::Parked
        }
    }

    /// Parks a cross-worker prefetch unit for `keys` with its planned reads `todo`.
    fn cross_park(
        &mut self,
        dest: ReadDest,
        keys: Vec<(u8, Vec<u8>)>,
        todo: Vec<(u32, crate::storage::prefetch::RecordRead)>,
    ) {
        let exec = lookup(b"exec").expect("EXEC is in the command table");
        let no_args: &[&[u8]] = &[];
        let mut p = Parked::new(
            dest,
            exec,
            ArgList::new(no_args),
            0,
            crate::resp::Proto::Resp2,
        );
        p.keyset = Some(keys);
        p.cross = true;
        p.note_plan(&self.shards, &todo);
        self.shared
            .stats
            .parked_reads
            .fetch_add(todo.len() as u64, Ordering::Relaxed);
        self.shared
            .stats
            .parked_commands
            .fetch_add(1, Ordering::Relaxed);
        self.reads.park(p, todo, &mut self.ring, &self.fixed_files);
    }

    /// `Msg::Prefetch`: another worker's connection needs these records of our shards in
    /// memory before its coordinated pass. Nothing is applied; the reads park here like
    /// any command's and the records go back with `Msg::Prefetched`.
    pub(super) fn txn_on_prefetch(
        &mut self,
        from: usize,
        token: ConnToken,
        keys: Vec<(u8, Vec<u8>)>,
    ) {
        let (n, me) = (self.shared.workers.len(), self.id);
        let own = move |s: u32| s as usize % n == me;
        let mut todo = self.reads.plan_vec();
        plan_keys(&mut self.shards, own, &keys, &[], &mut todo);
        if todo.is_empty() {
            self.reads.give_plan_vec(todo);
            self.outbox[from].push(Msg::Prefetched {
                token,
                fetched: Vec::new(),
                fetched_shard: Vec::new(),
                failed: false,
            });
            return;
        }
        let dest = ReadDest::Remote {
            from,
            token,
            seq: 0,
        };
        self.cross_park(dest, keys, todo);
    }

    /// One part of a cross-worker prefetch is back (from another worker, or parked here):
    /// its records join the connection's, and with the last part the command is
    /// dispatched again (to the next coordinated pass).
    pub(super) fn txn_prefetched(
        &mut self,
        token: ConnToken,
        fetched: Vec<Fetched>,
        fetched_shard: Vec<u32>,
        failed: bool,
    ) {
        let conn = self
            .conns
            .get_mut(token.slot as usize)
            .and_then(|c| c.as_deref_mut())
            .filter(|c| c.gen == token.gen);
        let Some(conn) = conn else {
            self.reads.recycle_fetched(fetched, fetched_shard);
            return;
        };
        conn.parked -= 1;
        conn.txn.xwaiting -= 1;
        if failed {
            // The command's own reads report the error: no more rounds.
            conn.txn.xrounds = CROSS_PREFETCH_ROUNDS_MAX;
        }
        conn.txn.prefetched.extend(fetched);
        conn.txn.prefetched_shard.extend(fetched_shard);
        if conn.txn.xwaiting == 0 {
            self.mark_ready(token.slot);
        }
    }

    /// The fallback of `cross_prefetch`: what `keys`' lookups still miss is read on the
    /// batch ring, inside the pass (the whole server waits, once for the transaction).
    fn txn_batch_fetch(&mut self, conn: &mut Conn, keys: &[(u8, Vec<u8>)]) {
        let mut fetched = std::mem::take(&mut conn.txn.prefetched);
        let mut fetched_shard = std::mem::take(&mut conn.txn.prefetched_shard);
        self.ensure_batch_reads();
        if let Some(batch) = self.batch.as_mut() {
            batch.fetch_keys(&mut self.shards, keys, &mut fetched, &mut fetched_shard);
        }
        self.count_batch_waits();
        conn.txn.prefetched = fetched;
        conn.txn.prefetched_shard = fetched_shard;
    }

    /// A queued connection or server command: its reply is captured into `out`.
    fn txn_run_local(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        spec: &CommandSpec,
        args: &[&[u8]],
        now: u64,
        out: &mut Vec<u8>,
    ) {
        let saved_pending = std::mem::take(&mut conn.pending);
        let saved_ready = std::mem::take(&mut conn.pending_ready_bytes);
        let saved_out = std::mem::take(&mut conn.out);
        let saved_cleared = std::mem::take(&mut conn.out_cleared);
        let outcome = (self.run_connection_command)(self, conn, slot, spec, args, now);
        let mut produced = std::mem::replace(&mut conn.out, saved_out);
        for s in std::mem::replace(&mut conn.pending, saved_pending) {
            if let super::Slot::Ready(b) = s {
                produced.extend_from_slice(&b);
            }
        }
        conn.pending_ready_bytes = saved_ready;
        conn.out_cleared = saved_cleared;
        if matches!(outcome, Outcome::Done) {
            out.extend_from_slice(&produced);
        } else {
            // Every shard is held while a transaction with such a command runs, so a
            // connection command has nothing to wait for; should one still ask to, its
            // place in the reply array gets an error rather than a hole.
            ReplyBuf::new(out, conn.proto).error("ERR command cannot run inside a transaction");
        }
    }
}
