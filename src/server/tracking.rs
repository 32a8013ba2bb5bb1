//! Client-side caching (Redis's `tracking.c`): CLIENT TRACKING, CACHING, GETREDIR,
//! TRACKINGINFO, the table of keys tracking clients read, and the invalidation messages
//! (RESP3 `invalidate` pushes, or `message`s on `__redis__:invalidate` to a RESP2
//! client that a tracking client redirects to).
//!
//! What it owns: one server-wide `Table` behind a mutex, holding every tracking client's
//! mode (redirect, NOLOOP, BCAST and its prefixes), the default-mode table key → ids of
//! the clients that read it, and the BCAST prefix table with the keys modified under each
//! prefix since the last broadcast. Each connection keeps a copy of its own mode
//! (`ConnTracking`) so that its commands decide without the lock whether their keys are
//! remembered.
//!
//! Where things happen: a read is remembered by the thread that runs its handler, while
//! that thread holds the key's shard (`after_command`, called from `exec_on` and from a
//! script's `redis.call`), and a write is reported by the shard itself
//! (`runtime::tracking::modified`, beside the WATCH touch) and turned into invalidations
//! on that same thread right after the handler. Because the shard is held in between, no
//! write of the key can fall between a read and its record: the ordering Redis gets from
//! being single-threaded. Messages are routed at the end of the worker's round
//! (`Worker::deliver_tracking`): to a connection of this worker directly, to another
//! worker's connection by mailbox (`Msg::Tracking`), so they follow the writer's reply.
//! BCAST keys are batched per round of the worker that wrote them (Redis: per event-loop
//! iteration) and sent sorted, one message per prefix and client.
//!
//! Cost: with no tracking client, one relaxed atomic load per command and per write.
//! With tracking clients, a mutex per read-only command of a tracking client, per write
//! and per round; memory per remembered key is the key bytes plus a vector of 8-byte ids
//! and a hash-map slot (about 80 bytes plus the key). `docs/tracking.md` has the rest.
//!
//! Deliberately not exact: the table is trimmed to `tracking-table-max-keys` right after
//! the read that exceeded it (Redis trims before the next command and with an effort
//! bound), evicting arbitrary keys, not random ones.

use super::{Outcome, Worker};
use crate::commands::{eq_ic, parse_int, CommandSpec};
use crate::resp::{Proto, ReplyBuf};
use crate::runtime::tracking as rt;
use crate::server::conn::Conn;
use crate::server::{ConnToken, Msg};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

/// `tracking-table-max-keys` (Redis's default; 0: no limit).
pub static MAX_KEYS: AtomicU64 = AtomicU64::new(1_000_000);

/// A connection's own tracking mode (what its commands need without the lock).
#[derive(Clone, Debug, Default)]
pub struct ConnTracking {
    pub on: bool,
    pub bcast: bool,
    pub optin: bool,
    pub optout: bool,
    pub noloop: bool,
    /// CLIENT CACHING yes (OPTIN) or no (OPTOUT) applies to the next command.
    pub caching: bool,
    pub redirect: u64,
}

impl ConnTracking {
    /// Who runs a command of this connection, and whether its reads are remembered.
    pub fn caller(&self, id: u64) -> rt::Caller {
        // OPTIN: only with CACHING yes; OPTOUT: unless CACHING no; otherwise always.
        let caching_allows = if self.optin {
            self.caching
        } else if self.optout {
            !self.caching
        } else {
            true
        };
        let track_reads = self.on && !self.bcast && caching_allows;
        rt::Caller { id, track_reads }
    }

    /// After a command: CLIENT CACHING holds for one command, except that CLIENT
    /// subcommands keep it and a transaction keeps it until EXEC (Redis's `resetClient`).
    pub fn command_done(&mut self, spec: &CommandSpec, in_multi: bool) {
        if self.caching && spec.name != "client" && !in_multi {
            self.caching = false;
        }
    }
}

/// What a tracking client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Push {
    /// These keys changed.
    Keys(Vec<Vec<u8>>),
    /// Everything changed (FLUSHDB, FLUSHALL): a null invalidation.
    Flush,
    /// The client it redirects to is gone (RESP3 only).
    RedirBroken(u64),
}

#[derive(Debug, Default)]
struct ClientState {
    bcast: bool,
    noloop: bool,
    redirect: u64,
    broken_redirect: bool,
    prefixes: BTreeSet<Vec<u8>>,
}

#[derive(Debug, Default)]
struct PrefixState {
    clients: BTreeSet<u64>,
    /// Keys modified under this prefix since the last broadcast, with their last writer.
    pending: BTreeMap<Vec<u8>, u64>,
}

/// A message for one tracking client, to be sent to `target` (itself or its redirect).
#[derive(Debug, PartialEq, Eq)]
struct Outgoing {
    client: u64,
    target: u64,
    push: Push,
}

#[derive(Debug, Default)]
struct Table {
    clients: HashMap<u64, ClientState>,
    keys: HashMap<Vec<u8>, Vec<u64>>,
    items: usize,
    prefixes: BTreeMap<Vec<u8>, PrefixState>,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Default::default);

thread_local! {
    static OUTGOING: RefCell<Vec<Outgoing>> = const { RefCell::new(Vec::new()) };
    /// Keys modified on this thread under some BCAST prefix since its last broadcast
    /// (with their writer): a batch is one round of one worker, which sends it before
    /// the replies of that round leave.
    static BCAST_KEYS: RefCell<Vec<(Vec<u8>, u64)>> = const { RefCell::new(Vec::new()) };
}

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    fn send(&self, client: u64, push: Push, out: &mut Vec<Outgoing>) {
        let redirect = self.clients.get(&client).map_or(0, |c| c.redirect);
        let target = if redirect != 0 { redirect } else { client };
        out.push(Outgoing {
            client,
            target,
            push,
        });
    }

    /// A write to `key` by client `by`: BCAST bookkeeping, then one invalidation per
    /// client that read it (except BCAST clients and a NOLOOP writer), and the key is
    /// forgotten.
    fn modified(&mut self, key: &[u8], by: u64, out: &mut Vec<Outgoing>) {
        if self.prefixes.keys().any(|p| key.starts_with(p)) {
            BCAST_KEYS.with(|b| b.borrow_mut().push((key.to_vec(), by)));
        }
        let Some(ids) = self.keys.remove(key) else {
            return;
        };
        self.items -= ids.len();
        for id in ids {
            let Some(c) = self.clients.get(&id) else {
                continue;
            };
            if c.bcast || (c.noloop && id == by) {
                continue;
            }
            self.send(id, Push::Keys(vec![key.to_vec()]), out);
        }
    }

    /// FLUSHDB/FLUSHALL: a null invalidation to every tracking client; the table empties.
    fn flushed(&mut self, out: &mut Vec<Outgoing>) {
        let mut ids: Vec<u64> = self.clients.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.send(id, Push::Flush, out);
        }
        self.keys.clear();
        self.items = 0;
    }

    fn remember(&mut self, key: &[u8], id: u64) {
        let ids = self.keys.entry(key.to_vec()).or_default();
        if !ids.contains(&id) {
            ids.push(id);
            self.items += 1;
        }
    }

    /// `tracking-table-max-keys`: keys beyond it are invalidated (and forgotten).
    fn trim(&mut self, max: usize, out: &mut Vec<Outgoing>) {
        while max > 0 && self.keys.len() > max {
            let Some(key) = self.keys.keys().next().cloned() else {
                break;
            };
            self.modified(&key, 0, out);
        }
    }

    /// The BCAST messages for `keys` (one batch): per prefix, its keys sorted and
    /// deduplicated (the last writer counts for NOLOOP), to each of its clients.
    fn broadcast(&mut self, keys: Vec<(Vec<u8>, u64)>, out: &mut Vec<Outgoing>) {
        for (key, by) in keys {
            for (prefix, p) in self.prefixes.iter_mut() {
                if key.starts_with(prefix) {
                    p.pending.insert(key.clone(), by);
                }
            }
        }
        let mut sends = Vec::new();
        for p in self.prefixes.values_mut() {
            if p.pending.is_empty() {
                continue;
            }
            let pending = std::mem::take(&mut p.pending);
            for &id in &p.clients {
                let noloop = self.clients.get(&id).is_some_and(|c| c.noloop);
                let keys: Vec<Vec<u8>> = pending
                    .iter()
                    .filter(|(_, &by)| !(noloop && by == id))
                    .map(|(k, _)| k.clone())
                    .collect();
                if !keys.is_empty() {
                    sends.push((id, Push::Keys(keys)));
                }
            }
        }
        for (id, push) in sends {
            self.send(id, push, out);
        }
    }

    fn enable(&mut self, id: u64, t: &ConnTracking, prefixes: &[&[u8]]) {
        let c = self.clients.entry(id).or_default();
        c.bcast = t.bcast;
        c.noloop = t.noloop;
        c.redirect = t.redirect;
        c.broken_redirect = false;
        if !t.bcast {
            return;
        }
        let list: Vec<Vec<u8>> = if prefixes.is_empty() {
            vec![Vec::new()]
        } else {
            prefixes.iter().map(|p| p.to_vec()).collect()
        };
        for p in list {
            c.prefixes.insert(p.clone());
            self.prefixes.entry(p).or_default().clients.insert(id);
        }
    }

    fn disable(&mut self, id: u64) {
        let Some(c) = self.clients.remove(&id) else {
            return;
        };
        for p in c.prefixes {
            if let Some(ps) = self.prefixes.get_mut(&p) {
                ps.clients.remove(&id);
                if ps.clients.is_empty() {
                    self.prefixes.remove(&p);
                }
            }
        }
    }
}

/// Applies the writes queued on this thread (`runtime::tracking`) to the table. With
/// the command's `args`, its keys are taken in the order of its arguments, as Redis
/// signals them (RENAME: source, then destination), whatever order the handler wrote.
fn apply_modified(t: &mut Table, args: Option<(&CommandSpec, &[&[u8]])>, out: &mut Vec<Outgoing>) {
    let (mut keys, flushed) = rt::take();
    if let (Some((spec, args)), true) = (args, keys.len() > 1) {
        let order: Vec<&[u8]> = crate::commands::table::key_positions(spec, args)
            .map(|p| args[p])
            .collect();
        keys.sort_by_key(|(k, _)| order.iter().position(|o| o == k).unwrap_or(usize::MAX));
    }
    if flushed {
        t.flushed(out);
    }
    for (key, by) in keys {
        t.modified(&key, by, out);
    }
}

/// Commands whose keys are not remembered even though they are read-only: read-only
/// scripts (the commands they run are remembered instead) and shard-channel commands.
fn remembers_keys(spec: &CommandSpec) -> bool {
    spec.flags.contains(&"readonly")
        && !spec.flags.contains(&"pubsub")
        && !matches!(spec.name, "eval_ro" | "evalsha_ro" | "fcall_ro")
}

/// Right after a keyed handler ran on this thread (shards still held): its writes become
/// invalidations, then, for a read-only command of a tracking client, its keys are
/// remembered. Call only when `runtime::tracking::active()`.
pub fn after_command(spec: &CommandSpec, args: &[&[u8]]) {
    let caller = rt::current();
    let remember = caller.track_reads && remembers_keys(spec);
    if !remember && !rt::pending() {
        return;
    }
    let mut out = Vec::new();
    {
        let mut t = table();
        apply_modified(&mut t, Some((spec, args)), &mut out);
        if remember {
            for pos in crate::commands::table::key_positions(spec, args) {
                t.remember(args[pos], caller.id);
            }
            let max = MAX_KEYS.load(Ordering::Relaxed) as usize;
            t.trim(max, &mut out);
        }
    }
    if !out.is_empty() {
        OUTGOING.with(|o| o.borrow_mut().append(&mut out));
    }
}

/// Right after a command's reply went into `out`: the invalidations its own writes made
/// for the client running it follow that reply at once, before the replies of its later
/// commands (Redis sends them after the command, not later). `proto` is the client's.
pub fn append_own(out: &mut Vec<u8>, proto: Proto) {
    if !rt::active() {
        return;
    }
    let me = rt::current().id;
    if me == 0 {
        return;
    }
    OUTGOING.with(|o| {
        let mut o = o.borrow_mut();
        if !o.iter().any(|m| m.target == me && m.client == me) {
            return;
        }
        let mut r = ReplyBuf::new(out, proto);
        o.retain(|m| {
            if m.target != me || m.client != me {
                return true;
            }
            // RESP2 without a redirect hears nothing (as at delivery).
            if proto == Proto::Resp3 {
                invalidate_push(&mut r, &m.push);
            }
            false
        });
    });
}

/// A RESP3 `invalidate` push (or `tracking-redir-broken`).
fn invalidate_push(r: &mut ReplyBuf, push: &Push) {
    r.push(2);
    match push {
        Push::Keys(keys) => {
            r.bulk(b"invalidate");
            r.array(keys.len());
            for k in keys {
                r.bulk(k);
            }
        }
        Push::Flush => {
            r.bulk(b"invalidate");
            r.null();
        }
        Push::RedirBroken(id) => {
            r.bulk(b"tracking-redir-broken");
            r.int(*id as i64);
        }
    }
}

/// INFO: `tracking_total_keys`, `tracking_total_items`, `tracking_total_prefixes`.
pub fn info_counts() -> (usize, usize, usize) {
    let t = table();
    (t.keys.len(), t.items, t.prefixes.len())
}

/// CLIENT LIST's `R` flag.
pub fn broken_redirect(id: u64) -> bool {
    table().clients.get(&id).is_some_and(|c| c.broken_redirect)
}

/// Turns tracking off for a connection (CLIENT TRACKING off, RESET, close). Keys it read
/// stay in the table until they are invalidated, as in Redis; they are skipped then.
pub fn disable(conn: &mut Conn) {
    if !conn.tracking.on {
        return;
    }
    table().disable(conn.id);
    conn.tracking = ConnTracking::default();
    rt::client_disabled();
}

/// Writes one tracking message into `conn`'s output, in order behind its replies.
fn write_push(conn: &mut Conn, via_redirect: bool, push: &Push) {
    if conn.closing {
        return;
    }
    if conn.proto == Proto::Resp3 {
        conn.reply(|r| invalidate_push(r, push));
        return;
    }
    // RESP2 has no pushes: only a redirect target in Pub/Sub mode hears anything.
    if !via_redirect || !conn.subs.active() {
        return;
    }
    conn.reply(|r| {
        r.push(3);
        r.bulk(b"message");
        r.bulk(b"__redis__:invalidate");
        match push {
            Push::Keys(keys) => {
                r.array(keys.len());
                for k in keys {
                    r.bulk(k);
                }
            }
            Push::Flush => r.null(),
            Push::RedirBroken(_) => {}
        }
    });
}

impl Worker {
    /// End of round: background expiry's invalidations, the BCAST batch, and every
    /// message produced on this thread, to its connections here or on other workers.
    pub(super) fn deliver_tracking(&mut self) {
        if !rt::active() && OUTGOING.with(|o| o.borrow().is_empty()) {
            // Nobody tracks: drop what expiry may have queued meanwhile.
            if rt::pending() {
                rt::take();
            }
            return;
        }
        let mut out = OUTGOING.with(|o| std::mem::take(&mut *o.borrow_mut()));
        let bcast_pending = BCAST_KEYS.with(|b| !b.borrow().is_empty());
        if rt::pending() || bcast_pending {
            let mut t = table();
            apply_modified(&mut t, None, &mut out);
            let keys = BCAST_KEYS.with(|b| std::mem::take(&mut *b.borrow_mut()));
            if !keys.is_empty() {
                t.broadcast(keys, &mut out);
            }
        }
        if out.is_empty() {
            return;
        }
        let mut broken = Vec::new();
        let clients = self.shared.clients.lock().expect("clients lock");
        let place = |id: u64| clients.get(&id).map(|e| (e.worker, e.token));
        let mut routed: Vec<(usize, ConnToken, bool, Push)> = Vec::new();
        for o in out {
            let via_redirect = o.target != o.client;
            match place(o.target) {
                Some((w, token)) => routed.push((w, token, via_redirect, o.push)),
                None if via_redirect => {
                    broken.push(o.client);
                    if let Some((w, token)) = place(o.client) {
                        routed.push((w, token, false, Push::RedirBroken(o.target)));
                    }
                }
                None => {}
            }
        }
        drop(clients);
        if !broken.is_empty() {
            let mut t = table();
            for id in broken {
                if let Some(c) = t.clients.get_mut(&id) {
                    c.broken_redirect = true;
                }
            }
        }
        for (w, token, via_redirect, push) in routed {
            if w == self.id {
                if let Some(conn) = self.conn_mut(token.packed()) {
                    write_push(conn, via_redirect, &push);
                }
            } else {
                self.outbox[w].push(Msg::Tracking {
                    token,
                    via_redirect,
                    push,
                });
            }
        }
    }

    /// A tracking message from another worker for one of our connections.
    pub(super) fn deliver_tracking_msg(
        &mut self,
        token: ConnToken,
        via_redirect: bool,
        push: Push,
    ) {
        if let Some(conn) = self.conn_mut(token.packed()) {
            write_push(conn, via_redirect, &push);
        }
    }
}

fn reply_err(conn: &mut Conn, msg: &str) -> Outcome {
    conn.reply(|r| r.error(msg));
    Outcome::Done
}

fn wrong_args(conn: &mut Conn, sub: &str) -> Outcome {
    reply_err(
        conn,
        &format!("ERR wrong number of arguments for 'client|{sub}' command"),
    )
}

/// CLIENT TRACKING, CACHING, GETREDIR, TRACKINGINFO; `None` for other subcommands.
pub fn client_command(w: &Worker, conn: &mut Conn, a: &[&[u8]]) -> Option<Outcome> {
    let sub = a[1];
    Some(if eq_ic(sub, "tracking") {
        if a.len() < 3 {
            return Some(wrong_args(conn, "tracking"));
        }
        client_tracking(w, conn, a)
    } else if eq_ic(sub, "caching") {
        if a.len() != 3 {
            return Some(wrong_args(conn, "caching"));
        }
        client_caching(conn, a[2])
    } else if eq_ic(sub, "getredir") {
        if a.len() != 2 {
            return Some(wrong_args(conn, "getredir"));
        }
        let v = if conn.tracking.on {
            conn.tracking.redirect as i64
        } else {
            -1
        };
        conn.reply(|r| r.int(v));
        Outcome::Done
    } else if eq_ic(sub, "trackinginfo") {
        if a.len() != 2 {
            return Some(wrong_args(conn, "trackinginfo"));
        }
        client_trackinginfo(conn)
    } else {
        return None;
    })
}

/// Redis's prefix-overlap rule: one of the two is a prefix of the other.
fn overlaps(a: &[u8], b: &[u8]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn client_tracking(w: &Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let mut redirect: u64 = 0;
    let (mut bcast, mut optin, mut optout, mut noloop) = (false, false, false, false);
    let mut prefixes: Vec<&[u8]> = Vec::new();
    let mut j = 3;
    while j < a.len() {
        let more = j + 1 < a.len();
        let opt = a[j];
        if eq_ic(opt, "redirect") && more {
            j += 1;
            if redirect != 0 {
                return reply_err(
                    conn,
                    "ERR A client can only redirect to a single other client",
                );
            }
            let id = match parse_int(a[j]) {
                Ok(n) => n,
                Err(e) => return reply_err(conn, &e),
            };
            let exists = id > 0
                && w.shared
                    .clients
                    .lock()
                    .expect("clients lock")
                    .contains_key(&(id as u64));
            if !exists {
                return reply_err(
                    conn,
                    "ERR The client ID you want redirect to does not exist",
                );
            }
            redirect = id as u64;
        } else if eq_ic(opt, "bcast") {
            bcast = true;
        } else if eq_ic(opt, "optin") {
            optin = true;
        } else if eq_ic(opt, "optout") {
            optout = true;
        } else if eq_ic(opt, "noloop") {
            noloop = true;
        } else if eq_ic(opt, "prefix") && more {
            j += 1;
            prefixes.push(a[j]);
        } else {
            return reply_err(conn, crate::commands::ERR_SYNTAX);
        }
        j += 1;
    }
    if eq_ic(a[2], "off") {
        disable(conn);
        conn.reply(|r| r.ok());
        return Outcome::Done;
    }
    if !eq_ic(a[2], "on") {
        return reply_err(conn, crate::commands::ERR_SYNTAX);
    }
    let cur = conn.tracking.clone();
    if !bcast && !prefixes.is_empty() {
        return reply_err(conn, "ERR PREFIX option requires BCAST mode to be enabled");
    }
    if cur.on && cur.bcast != bcast {
        return reply_err(conn, "ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.");
    }
    if bcast && (optin || optout) {
        return reply_err(conn, "ERR OPTIN and OPTOUT are not compatible with BCAST");
    }
    if optin && optout {
        return reply_err(
            conn,
            "ERR You can't specify both OPTIN mode and OPTOUT mode",
        );
    }
    if (optin && cur.optout) || (optout && cur.optin) {
        return reply_err(conn, "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.");
    }
    let mut t = table();
    if bcast {
        let existing = t.clients.get(&conn.id).map(|c| &c.prefixes);
        for (i, p) in prefixes.iter().enumerate() {
            if let Some(old) = existing.and_then(|s| s.iter().find(|o| overlaps(o, p))) {
                let msg = format!(
                    "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must not overlap.",
                    String::from_utf8_lossy(p),
                    String::from_utf8_lossy(old)
                );
                drop(t);
                return reply_err(conn, &msg);
            }
            if let Some(other) = prefixes[i + 1..].iter().find(|o| overlaps(o, p)) {
                let msg = format!(
                    "ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a single client must not overlap.",
                    String::from_utf8_lossy(p),
                    String::from_utf8_lossy(other)
                );
                drop(t);
                return reply_err(conn, &msg);
            }
        }
    }
    let mode = ConnTracking {
        on: true,
        bcast,
        optin,
        optout,
        noloop,
        caching: cur.caching,
        redirect,
    };
    t.enable(conn.id, &mode, &prefixes);
    drop(t);
    if !cur.on {
        rt::client_enabled();
    }
    conn.tracking = mode;
    conn.reply(|r| r.ok());
    Outcome::Done
}

fn client_caching(conn: &mut Conn, opt: &[u8]) -> Outcome {
    if !conn.tracking.on {
        return reply_err(conn, "ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled");
    }
    if eq_ic(opt, "yes") {
        if !conn.tracking.optin {
            return reply_err(
                conn,
                "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
            );
        }
    } else if eq_ic(opt, "no") {
        if !conn.tracking.optout {
            return reply_err(
                conn,
                "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.",
            );
        }
    } else {
        return reply_err(conn, crate::commands::ERR_SYNTAX);
    }
    conn.tracking.caching = true;
    conn.reply(|r| r.ok());
    Outcome::Done
}

fn client_trackinginfo(conn: &mut Conn) -> Outcome {
    let t = conn.tracking.clone();
    let (broken, prefixes) = if t.on {
        let tab = table();
        let c = tab.clients.get(&conn.id);
        (
            c.is_some_and(|c| c.broken_redirect),
            c.map(|c| c.prefixes.iter().cloned().collect::<Vec<_>>())
                .unwrap_or_default(),
        )
    } else {
        (false, Vec::new())
    };
    let mut flags: Vec<&str> = vec![if t.on { "on" } else { "off" }];
    if t.bcast {
        flags.push("bcast");
    }
    if t.optin {
        flags.push("optin");
        if t.caching {
            flags.push("caching-yes");
        }
    }
    if t.optout {
        flags.push("optout");
        if t.caching {
            flags.push("caching-no");
        }
    }
    if t.noloop {
        flags.push("noloop");
    }
    if broken {
        flags.push("broken_redirect");
    }
    let redirect = if t.on { t.redirect as i64 } else { -1 };
    conn.reply(|r| {
        r.map(3);
        r.bulk_str("flags");
        r.set(flags.len());
        for f in &flags {
            r.bulk_str(f);
        }
        r.bulk_str("redirect");
        r.int(redirect);
        r.bulk_str("prefixes");
        r.array(prefixes.len());
        for p in &prefixes {
            r.bulk(p);
        }
    });
    Outcome::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(bcast: bool, noloop: bool, redirect: u64) -> ConnTracking {
        ConnTracking {
            on: true,
            bcast,
            noloop,
            redirect,
            ..Default::default()
        }
    }

    // A write invalidates every reader once (NOLOOP spares its own writes), then the key is forgotten.
    #[test]
    fn default_mode_invalidates_once() {
        let mut t = Table::default();
        t.enable(1, &mode(false, false, 0), &[]);
        t.enable(2, &mode(false, true, 9), &[]);
        t.remember(b"k", 1);
        t.remember(b"k", 1);
        t.remember(b"k", 2);
        assert_eq!((t.keys.len(), t.items), (1, 2));
        let mut out = Vec::new();
        t.modified(b"k", 2, &mut out);
        assert_eq!(
            out,
            vec![Outgoing {
                client: 1,
                target: 1,
                push: Push::Keys(vec![b"k".to_vec()])
            }]
        );
        out.clear();
        t.modified(b"k", 0, &mut out);
        assert!(out.is_empty());
        assert_eq!(t.items, 0);
    }

    // BCAST gathers keys per prefix, sorted and deduplicated; NOLOOP drops the client's own.
    #[test]
    fn bcast_batches_sorted_keys() {
        let mut t = Table::default();
        t.enable(1, &mode(true, true, 0), &[b"a"]);
        t.enable(2, &mode(true, false, 7), &[]);
        let mut out = Vec::new();
        t.modified(b"ab", 1, &mut out);
        t.modified(b"aa", 3, &mut out);
        t.modified(b"ab", 1, &mut out);
        t.modified(b"b", 3, &mut out);
        assert!(out.is_empty());
        let batch = BCAST_KEYS.with(|b| std::mem::take(&mut *b.borrow_mut()));
        assert_eq!(batch.len(), 4);
        t.broadcast(batch, &mut out);
        let keys = |v: &[&[u8]]| Push::Keys(v.iter().map(|k| k.to_vec()).collect());
        assert!(out.contains(&Outgoing {
            client: 2,
            target: 7,
            push: keys(&[b"aa", b"ab", b"b"])
        }));
        assert!(out.contains(&Outgoing {
            client: 1,
            target: 1,
            push: keys(&[b"aa"])
        }));
        assert_eq!(out.len(), 2);
        out.clear();
        t.broadcast(Vec::new(), &mut out);
        assert!(out.is_empty());
        t.disable(1);
        t.disable(2);
        assert!(t.prefixes.is_empty());
    }

    // The key limit invalidates (and forgets) keys beyond it; a flush empties the table.
    #[test]
    fn trim_and_flush() {
        let mut t = Table::default();
        t.enable(1, &mode(false, false, 0), &[]);
        for k in [b"a", b"b", b"c"] {
            t.remember(k, 1);
        }
        let mut out = Vec::new();
        t.trim(2, &mut out);
        assert_eq!((t.keys.len(), out.len()), (2, 1));
        out.clear();
        t.flushed(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].push, Push::Flush);
        assert_eq!((t.keys.len(), t.items), (0, 0));
    }

    // CLIENT CACHING decides the next command's reads in OPTIN and OPTOUT modes.
    #[test]
    fn caching_flag_decides_reads() {
        let mut c = ConnTracking {
            on: true,
            optin: true,
            ..Default::default()
        };
        assert!(!c.caller(1).track_reads);
        c.caching = true;
        assert!(c.caller(1).track_reads);
        c.optin = false;
        c.optout = true;
        assert!(!c.caller(1).track_reads);
        c.caching = false;
        assert!(c.caller(1).track_reads);
    }
}
