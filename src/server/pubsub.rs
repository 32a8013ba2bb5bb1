//! Pub/Sub across workers: SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE and their UNSUBSCRIBEs,
//! PUBLISH, SPUBLISH, PUBSUB introspection, and the delivery of keyspace notifications
//! (`Ctx::notify`, `commands::events`) to subscribers on every worker.
//!
//! What it owns: one server-wide `Registry` (`Shared::pubsub`, behind an `RwLock`) that maps
//! each channel, pattern and shard channel to its subscribers as (worker, connection
//! token); and each connection's own list of what it subscribed to (`Conn::subs`), which
//! answers its UNSUBSCRIBE-all and its counts without touching the lock.
//!
//! Why a shared map and not per-worker tables plus broadcast: PUBLISH must reply with the
//! number of receivers on every worker, at once. With a shared map the publisher reads it
//! under the read lock (no writer in the common case: subscriptions change rarely compared
//! with messages), counts the receivers, writes the message straight into the output of
//! subscribers on its own worker and sends one message per other worker that has any,
//! carrying the list of its receiving connections. A broadcast design would need a
//! round trip to every worker before PUBLISH could reply. `docs/pubsub.md` has the cost.
//!
//! Invariants: a connection is in the registry under a name exactly when the name is in
//! its `Conn::subs` (both change together, on the connection's worker); closing or
//! RESETting a connection removes all of its entries. A message sent to another worker
//! names connections by token (slot and generation), so a connection closed meanwhile is
//! skipped, never confused with a later one in the same slot.
//!
//! Deliberately missing: Redis Cluster's shard-channel slot checks (lavik is not a
//! cluster: SSUBSCRIBE accepts channels of any slot together). Client-side caching
//! invalidations over `__redis__:invalidate` are sent by `tracking.rs`, straight to the
//! redirect client (as Redis does), not through this registry.

use super::{Outcome, Worker};
use crate::commands::{eq_ic, glob_match, CommandSpec};
use crate::resp::{Proto, ReplyBuf};
use crate::server::conn::Conn;
use crate::server::{ConnToken, Msg};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

thread_local! {
    /// The server's state, for PUBLISH from a script on this worker thread (`install`).
    static SHARED: std::cell::RefCell<Option<Arc<crate::server::Shared>>> = const {
        std::cell::RefCell::new(None)
    };
}

/// Runs `f` with the server's state, for code a script runs on this thread (`None` off a
/// worker thread, e.g. in unit tests).
pub(crate) fn with_shared<R>(f: impl FnOnce(&crate::server::Shared) -> R) -> Option<R> {
    SHARED.with(|s| s.borrow().as_deref().map(f))
}

/// Lets scripts on this thread publish (`script_publish`); called once per worker thread.
pub fn install(shared: Arc<crate::server::Shared>) {
    SHARED.with(|s| *s.borrow_mut() = Some(shared));
}

/// PUBLISH / SPUBLISH (`shard`) from a script: the number of receivers now, and the message
/// queued for delivery after the command with the thread's keyspace events
/// (`runtime::events::publish`), so a discarded (restarted) run publishes nothing. A RESP3
/// caller subscribed to the channel gets the push after the script's reply (Redis: before).
pub fn script_publish(shard: bool, channel: &[u8], message: &[u8]) -> usize {
    SHARED.with(|s| {
        let s = s.borrow();
        let Some(shared) = s.as_ref() else { return 0 };
        if shared.pubsub_subscriptions.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let count = shared
            .pubsub
            .read()
            .expect("pubsub lock")
            .receivers(shard, channel, |_, _| ());
        if count > 0 {
            crate::runtime::events::publish(shard, channel, message);
        }
        count
    })
}

/// The three kinds of subscription Redis has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubKind {
    Channel,
    Pattern,
    Shard,
}

impl SubKind {
    fn subscribe_word(self) -> &'static str {
        match self {
            SubKind::Channel => "subscribe",
            SubKind::Pattern => "psubscribe",
            SubKind::Shard => "ssubscribe",
        }
    }

    fn unsubscribe_word(self) -> &'static str {
        match self {
            SubKind::Channel => "unsubscribe",
            SubKind::Pattern => "punsubscribe",
            SubKind::Shard => "sunsubscribe",
        }
    }
}

/// One subscribing connection, server-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscriber {
    pub worker: usize,
    pub token: ConnToken,
}

/// Every subscription of the server (see the module essay).
#[derive(Default)]
pub struct Registry {
    channels: HashMap<Vec<u8>, Vec<Subscriber>>,
    patterns: HashMap<Vec<u8>, Vec<Subscriber>>,
    shard: HashMap<Vec<u8>, Vec<Subscriber>>,
}

impl Registry {
    fn table(&mut self, kind: SubKind) -> &mut HashMap<Vec<u8>, Vec<Subscriber>> {
        match kind {
            SubKind::Channel => &mut self.channels,
            SubKind::Pattern => &mut self.patterns,
            SubKind::Shard => &mut self.shard,
        }
    }

    fn add(&mut self, kind: SubKind, name: &[u8], sub: Subscriber) {
        let list = self.table(kind).entry(name.to_vec()).or_default();
        if !list.contains(&sub) {
            list.push(sub);
        }
    }

    fn remove(&mut self, kind: SubKind, name: &[u8], sub: Subscriber) {
        let table = self.table(kind);
        if let Some(list) = table.get_mut(name) {
            list.retain(|s| *s != sub);
            if list.is_empty() {
                table.remove(name);
            }
        }
    }

    /// Calls `take` for every subscriber a message on `channel` reaches (`shard`: a
    /// SPUBLISH), with the pattern it matched through; returns how many there are.
    fn receivers(
        &self,
        shard: bool,
        channel: &[u8],
        mut take: impl FnMut(&Subscriber, Option<Arc<[u8]>>),
    ) -> usize {
        let mut count = 0;
        let direct = if shard { &self.shard } else { &self.channels };
        if let Some(list) = direct.get(channel) {
            for s in list {
                count += 1;
                take(s, None);
            }
        }
        if !shard {
            for (pat, list) in &self.patterns {
                if glob_match(pat, channel) {
                    let p: Arc<[u8]> = Arc::from(pat.as_slice());
                    for s in list {
                        count += 1;
                        take(s, Some(p.clone()));
                    }
                }
            }
        }
        count
    }

    /// Subscribers among `of` holding a subscription that `allowed(name, is_pattern)`
    /// refuses (an ACL change took the channel away: Redis disconnects them).
    pub fn subscribers_denied(
        &self,
        of: &[Subscriber],
        allowed: impl Fn(&[u8], bool) -> bool,
    ) -> Vec<Subscriber> {
        let mut out: Vec<Subscriber> = Vec::new();
        for (table, is_pattern) in [
            (&self.channels, false),
            (&self.shard, false),
            (&self.patterns, true),
        ] {
            for (name, subs) in table {
                for s in subs {
                    if of.contains(s) && !out.contains(s) && !allowed(name, is_pattern) {
                        out.push(*s);
                    }
                }
            }
        }
        out
    }

    /// Distinct channels, patterns and shard channels with at least one subscriber
    /// (INFO's `pubsub_channels`, `pubsub_patterns`, `pubsubshard_channels`).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.channels.len(), self.patterns.len(), self.shard.len())
    }
}

/// What one connection subscribed to, in subscription order.
#[derive(Default, Debug)]
pub struct Subs {
    pub channels: Vec<Vec<u8>>,
    pub patterns: Vec<Vec<u8>>,
    pub shard: Vec<Vec<u8>>,
}

impl Subs {
    fn list(&mut self, kind: SubKind) -> &mut Vec<Vec<u8>> {
        match kind {
            SubKind::Channel => &mut self.channels,
            SubKind::Pattern => &mut self.patterns,
            SubKind::Shard => &mut self.shard,
        }
    }

    /// Redis's count in (un)subscribe replies: channels plus patterns, or shard channels.
    fn count(&self, kind: SubKind) -> usize {
        match kind {
            SubKind::Channel | SubKind::Pattern => self.channels.len() + self.patterns.len(),
            SubKind::Shard => self.shard.len(),
        }
    }

    /// Any subscription at all: the connection is a Pub/Sub client (RESP2 subscribed
    /// mode, the `pubsub` output-limit class, flag `P`).
    pub fn active(&self) -> bool {
        !(self.channels.is_empty() && self.patterns.is_empty() && self.shard.is_empty())
    }
}

/// A receiving connection, with the pattern it matched (`pmessage`) or `None`.
pub type Target = (ConnToken, Option<Arc<[u8]>>);

/// A message for subscribers on one other worker.
pub struct Publication {
    pub shard: bool,
    pub channel: Arc<[u8]>,
    pub message: Arc<[u8]>,
    pub targets: Vec<Target>,
}

/// Commands a RESP2 client may send while subscribed (Redis's list).
const SUBSCRIBED_MODE_ALLOWED: &[&str] = &[
    "ping",
    "subscribe",
    "ssubscribe",
    "unsubscribe",
    "sunsubscribe",
    "psubscribe",
    "punsubscribe",
    "quit",
    "reset",
];

/// RESP2 subscribed mode: `Some(error)` when the command may not run now. One branch
/// for a connection without subscriptions.
pub fn subscribed_mode_error(conn: &Conn, spec: &CommandSpec, args: &[&[u8]]) -> Option<String> {
    if !conn.subs.active()
        || conn.proto != Proto::Resp2
        || SUBSCRIBED_MODE_ALLOWED.contains(&spec.name)
    {
        return None;
    }
    // Redis names a subcommand as `client|list`.
    let cat = crate::acl::catalog::catalog();
    let fullname = crate::commands::TABLE
        .iter()
        .position(|c| std::ptr::eq(c, spec))
        .and_then(|i| cat.resolve(i, args))
        .map(|id| cat.commands[id].fullname.clone())
        .unwrap_or_else(|| spec.name.to_string());
    Some(format!(
        "ERR Can't execute '{fullname}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
    ))
}

/// Writes one message push into `conn`'s output, in order behind its pending replies.
fn write_message(
    conn: &mut Conn,
    shard: bool,
    pattern: Option<&[u8]>,
    channel: &[u8],
    message: &[u8],
) {
    if conn.closing {
        return;
    }
    conn.reply(|r| match pattern {
        Some(p) => {
            r.push(4);
            r.bulk(b"pmessage");
            r.bulk(p);
            r.bulk(channel);
            r.bulk(message);
        }
        None => {
            r.push(3);
            r.bulk(if shard { b"smessage" } else { b"message" });
            r.bulk(channel);
            r.bulk(message);
        }
    });
}

fn subscribed_reply(r: &mut ReplyBuf, word: &str, name: Option<&[u8]>, count: usize) {
    r.push(3);
    r.bulk_str(word);
    match name {
        Some(n) => r.bulk(n),
        None => r.null(),
    }
    r.int(count as i64);
}

impl Worker {
    /// Publishes `message` on `channel` (`shard`: SPUBLISH) to every subscriber on every
    /// worker; returns how many receive it. `me` is the connection running the command
    /// (out of its slot while it runs), so a RESP3 client subscribed to its own channel
    /// gets the message before the reply, as in Redis.
    pub fn publish(
        &mut self,
        mut me: Option<(&mut Conn, u32)>,
        shard: bool,
        channel: &[u8],
        message: &[u8],
    ) -> usize {
        if self.shared.pubsub_subscriptions.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let workers = self.shared.workers.len();
        let mut local: Vec<Target> = Vec::new();
        let mut remote: Vec<Vec<Target>> = Vec::new();
        let count = {
            let reg = self.shared.pubsub.read().expect("pubsub lock");
            reg.receivers(shard, channel, |s, pat| {
                if s.worker == self.id {
                    local.push((s.token, pat));
                } else {
                    if remote.is_empty() {
                        remote.resize_with(workers, Vec::new);
                    }
                    remote[s.worker].push((s.token, pat));
                }
            })
        };
        for (token, pat) in local {
            match me.as_mut() {
                Some((conn, slot)) if *slot == token.slot && conn.gen == token.gen => {
                    write_message(conn, shard, pat.as_deref(), channel, message)
                }
                _ => {
                    if let Some(conn) = self.conn_mut(token.packed()) {
                        write_message(conn, shard, pat.as_deref(), channel, message);
                    }
                }
            }
        }
        if !remote.is_empty() {
            let channel: Arc<[u8]> = Arc::from(channel);
            let message: Arc<[u8]> = Arc::from(message);
            for (w, targets) in remote.into_iter().enumerate() {
                if targets.is_empty() {
                    continue;
                }
                self.outbox[w].push(Msg::Publish(Box::new(Publication {
                    shard,
                    channel: channel.clone(),
                    message: message.clone(),
                    targets,
                })));
            }
        }
        count
    }

    /// A publication from another worker: into the output of each target still here.
    pub(super) fn deliver(&mut self, p: Publication) {
        for (token, pat) in &p.targets {
            if let Some(conn) = self.conn_mut(token.packed()) {
                write_message(conn, p.shard, pat.as_deref(), &p.channel, &p.message);
            }
        }
    }

    /// Keyspace notifications queued by handlers on this thread (`commands::events`),
    /// published now. One thread-local check when there are none.
    pub(super) fn publish_keyspace_events(&mut self) {
        let events = crate::commands::events::take();
        for e in events {
            self.publish(None, e.shard, &e.channel, &e.message);
        }
    }

    /// Removes every subscription of the connection at `slot` (close, RESET), without
    /// replies; `subs` was taken out of it.
    pub(crate) fn forget_subscriptions(&self, subs: Subs, slot: u32, gen: u32) {
        if !subs.active() {
            return;
        }
        let me = Subscriber {
            worker: self.id,
            token: ConnToken { slot, gen },
        };
        let mut removed = 0;
        let mut reg = self.shared.pubsub.write().expect("pubsub lock");
        for (kind, list) in [
            (SubKind::Channel, &subs.channels),
            (SubKind::Pattern, &subs.patterns),
            (SubKind::Shard, &subs.shard),
        ] {
            for name in list {
                reg.remove(kind, name, me);
                removed += 1;
            }
        }
        drop(reg);
        self.shared
            .pubsub_subscriptions
            .fetch_sub(removed, Ordering::Relaxed);
    }

    fn subscribe(&mut self, conn: &mut Conn, slot: u32, kind: SubKind, names: &[&[u8]]) {
        let me = Subscriber {
            worker: self.id,
            token: ConnToken {
                slot,
                gen: conn.gen,
            },
        };
        let word = kind.subscribe_word();
        let mut added = 0;
        let mut reg = self.shared.pubsub.write().expect("pubsub lock");
        for name in names {
            let list = conn.subs.list(kind);
            if !list.iter().any(|n| n[..] == **name) {
                list.push(name.to_vec());
                reg.add(kind, name, me);
                added += 1;
            }
            // One reply per name, with the count after it (a repeated name repeats it).
            let count = conn.subs.count(kind);
            conn.reply(|r| subscribed_reply(r, word, Some(name), count));
        }
        drop(reg);
        self.shared
            .pubsub_subscriptions
            .fetch_add(added, Ordering::Relaxed);
    }

    fn unsubscribe(&mut self, conn: &mut Conn, slot: u32, kind: SubKind, names: &[&[u8]]) {
        let me = Subscriber {
            worker: self.id,
            token: ConnToken {
                slot,
                gen: conn.gen,
            },
        };
        let word = kind.unsubscribe_word();
        let names: Vec<Vec<u8>> = if names.is_empty() {
            if conn.subs.list(kind).is_empty() {
                let count = conn.subs.count(kind);
                conn.reply(|r| subscribed_reply(r, word, None, count));
                return;
            }
            conn.subs.list(kind).clone()
        } else {
            names.iter().map(|n| n.to_vec()).collect()
        };
        let mut reg = self.shared.pubsub.write().expect("pubsub lock");
        for name in &names {
            let list = conn.subs.list(kind);
            if let Some(i) = list.iter().position(|n| n == name) {
                list.remove(i);
                reg.remove(kind, name, me);
                self.shared
                    .pubsub_subscriptions
                    .fetch_sub(1, Ordering::Relaxed);
            }
            let count = conn.subs.count(kind);
            conn.reply(|r| subscribed_reply(r, word, Some(name), count));
        }
    }

    /// The Pub/Sub commands (run by `server::local`).
    pub fn pubsub_command(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        name: &str,
        a: &[&[u8]],
    ) -> Outcome {
        match name {
            "subscribe" => self.subscribe(conn, slot, SubKind::Channel, &a[1..]),
            "psubscribe" => self.subscribe(conn, slot, SubKind::Pattern, &a[1..]),
            "ssubscribe" => self.subscribe(conn, slot, SubKind::Shard, &a[1..]),
            "unsubscribe" => self.unsubscribe(conn, slot, SubKind::Channel, &a[1..]),
            "punsubscribe" => self.unsubscribe(conn, slot, SubKind::Pattern, &a[1..]),
            "sunsubscribe" => self.unsubscribe(conn, slot, SubKind::Shard, &a[1..]),
            "publish" | "spublish" => {
                let n = self.publish(Some((conn, slot)), name == "spublish", a[1], a[2]);
                conn.reply(|r| r.int(n as i64));
            }
            _ => return self.pubsub_introspection(conn, a),
        }
        Outcome::Done
    }

    fn pubsub_introspection(&mut self, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
        let sub = a[1];
        let reg = self.shared.pubsub.read().expect("pubsub lock");
        let listing = |table: &HashMap<Vec<u8>, Vec<Subscriber>>, pat: Option<&[u8]>| {
            table
                .keys()
                .filter(|k| pat.is_none_or(|p| glob_match(p, k)))
                .cloned()
                .collect::<Vec<_>>()
        };
        if eq_ic(sub, "help") && a.len() == 2 {
            drop(reg);
            conn.reply(|r| {
                r.array(HELP.len());
                for l in HELP {
                    r.simple(l);
                }
            });
        } else if (eq_ic(sub, "channels") || eq_ic(sub, "shardchannels")) && a.len() <= 3 {
            let table = if eq_ic(sub, "channels") {
                &reg.channels
            } else {
                &reg.shard
            };
            let names = listing(table, a.get(2).copied());
            drop(reg);
            conn.reply(|r| {
                r.array(names.len());
                for n in &names {
                    r.bulk(n);
                }
            });
        } else if eq_ic(sub, "numpat") && a.len() == 2 {
            let n = reg.patterns.len();
            drop(reg);
            conn.reply(|r| r.int(n as i64));
        } else if eq_ic(sub, "numsub") || eq_ic(sub, "shardnumsub") {
            let table = if eq_ic(sub, "numsub") {
                &reg.channels
            } else {
                &reg.shard
            };
            let counts: Vec<usize> = a[2..]
                .iter()
                .map(|c| table.get(*c).map_or(0, |l| l.len()))
                .collect();
            drop(reg);
            conn.reply(|r| {
                r.map(counts.len());
                for (c, n) in a[2..].iter().zip(&counts) {
                    r.bulk(c);
                    r.int(*n as i64);
                }
            });
        } else {
            drop(reg);
            let msg = format!(
                "ERR unknown subcommand '{}'. Try PUBSUB HELP.",
                String::from_utf8_lossy(sub)
            );
            conn.reply(|r| r.error(&msg));
        }
        Outcome::Done
    }
}

const HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(worker: usize, slot: u32) -> Subscriber {
        Subscriber {
            worker,
            token: ConnToken { slot, gen: 1 },
        }
    }

    // The registry keeps one entry per (name, subscriber), drops empty names, and counts
    // distinct names per kind.
    #[test]
    fn registry_add_remove_counts() {
        let mut r = Registry::default();
        r.add(SubKind::Channel, b"a", sub(0, 1));
        r.add(SubKind::Channel, b"a", sub(0, 1));
        r.add(SubKind::Channel, b"a", sub(1, 1));
        r.add(SubKind::Pattern, b"a*", sub(1, 1));
        r.add(SubKind::Shard, b"s", sub(0, 2));
        assert_eq!(r.counts(), (1, 1, 1));
        assert_eq!(r.channels[&b"a".to_vec()].len(), 2);
        r.remove(SubKind::Channel, b"a", sub(0, 1));
        r.remove(SubKind::Channel, b"a", sub(0, 9));
        assert_eq!(r.channels[&b"a".to_vec()], vec![sub(1, 1)]);
        r.remove(SubKind::Channel, b"a", sub(1, 1));
        r.remove(SubKind::Shard, b"s", sub(0, 2));
        assert_eq!(r.counts(), (0, 1, 0));
    }

    // Only the given subscribers are judged, each once, patterns as patterns.
    #[test]
    fn subscribers_denied_by_rule() {
        let mut r = Registry::default();
        r.add(SubKind::Channel, b"ok", sub(0, 1));
        r.add(SubKind::Channel, b"no", sub(0, 2));
        r.add(SubKind::Pattern, b"no*", sub(1, 3));
        r.add(SubKind::Shard, b"no", sub(1, 4));
        r.add(SubKind::Channel, b"no", sub(1, 5));
        let of = [sub(0, 1), sub(0, 2), sub(1, 3), sub(1, 4)];
        let allowed = |name: &[u8], is_pattern: bool| {
            assert_eq!(is_pattern, name.ends_with(b"*"));
            name == b"ok"
        };
        let mut denied = r.subscribers_denied(&of, allowed);
        denied.sort_by_key(|s| s.token.slot);
        assert_eq!(denied, vec![sub(0, 2), sub(1, 3), sub(1, 4)]);
    }

    // Subscription counts follow Redis: channels plus patterns, shard channels apart.
    #[test]
    fn subs_counts() {
        let mut s = Subs::default();
        assert!(!s.active());
        s.list(SubKind::Channel).push(b"a".to_vec());
        s.list(SubKind::Pattern).push(b"p*".to_vec());
        s.list(SubKind::Shard).push(b"s".to_vec());
        assert!(s.active());
        assert_eq!(s.count(SubKind::Channel), 2);
        assert_eq!(s.count(SubKind::Pattern), 2);
        assert_eq!(s.count(SubKind::Shard), 1);
    }
}
