//! Keyspace notifications (`notify-keyspace-events`): the one entry point handlers call,
//! `Ctx::notify(class, event, key)` (or `events::notify` where no `Ctx` is at hand).
//!
//! How to use it from a command family (lists, sorted sets, streams, ...): after the
//! command has changed a key, call `ctx.notify(events::LIST, "lpush", key)` with Redis's
//! class and event name — the ones its `notifyKeyspaceEvent` calls use in `t_list.c`,
//! `t_zset.c`, ... — once per event Redis fires, in Redis's order (e.g. `del` after the
//! last element is removed: `ctx.notify(events::GENERIC, "del", key)`). Call it only
//! after the command succeeded; never for a read.
//!
//! What it costs: when the class is not enabled (the default: none is), one relaxed load
//! of a process-wide atomic and a branch. When enabled, the channel names are built and
//! queued on the running thread (a thread-local list); the worker publishes the queue
//! once per round after its commands ran (`Worker::publish_keyspace_events`), to
//! subscribers on every worker, with Redis's channels `__keyspace@<db>__:<key>`
//! (message: the event) and `__keyevent@<db>__:<event>` (message: the key).
//!
//! Lives under `runtime` (below `commands` and `storage`) because the storage engine
//! fires `expired` itself, from lazy and active expiry (`Shard::expire_lazily`).
//!
//! The setting is process-wide (a server has one), set from the config file or flag at
//! start and by CONFIG SET.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// `K`: publish on `__keyspace@<db>__:<key>`.
pub const KEYSPACE: u32 = 1 << 0;
/// `E`: publish on `__keyevent@<db>__:<event>`.
pub const KEYEVENT: u32 = 1 << 1;
/// `g`: generic commands (DEL, EXPIRE, RENAME, ...).
pub const GENERIC: u32 = 1 << 2;
/// `$`: string commands.
pub const STRING: u32 = 1 << 3;
/// `l`: list commands.
pub const LIST: u32 = 1 << 4;
/// `s`: set commands.
pub const SET: u32 = 1 << 5;
/// `h`: hash commands.
pub const HASH: u32 = 1 << 6;
/// `z`: sorted-set commands.
pub const ZSET: u32 = 1 << 7;
/// `x`: expired events (a key found or swept past its expiry).
pub const EXPIRED: u32 = 1 << 8;
/// `e`: evicted events (lavik does not evict; accepted as in Redis).
pub const EVICTED: u32 = 1 << 9;
/// `t`: stream commands.
pub const STREAM: u32 = 1 << 10;
/// `m`: key-miss events (excluded from `A`).
pub const KEY_MISS: u32 = 1 << 11;
/// `d`: module events.
pub const MODULE: u32 = 1 << 12;
/// `n`: new-key events (excluded from `A`).
pub const NEW: u32 = 1 << 13;
/// `A`: alias of `g$lshzxetd`.
pub const ALL: u32 =
    GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

/// The letters of the classes `A` covers, in the order CONFIG GET prints them.
const CLASS_LETTERS: [(u32, char); 10] = [
    (GENERIC, 'g'),
    (STRING, '$'),
    (LIST, 'l'),
    (SET, 's'),
    (HASH, 'h'),
    (ZSET, 'z'),
    (EXPIRED, 'x'),
    (EVICTED, 'e'),
    (STREAM, 't'),
    (MODULE, 'd'),
];

static FLAGS: AtomicU32 = AtomicU32::new(0);

/// The classes in force.
pub fn flags() -> u32 {
    FLAGS.load(Ordering::Relaxed)
}

pub fn set_flags(flags: u32) {
    FLAGS.store(flags, Ordering::Relaxed);
}

/// Parses Redis's class string; `None` for a character Redis refuses.
pub fn parse(text: &str) -> Option<u32> {
    let mut flags = 0;
    for c in text.chars() {
        flags |= match c {
            'A' => ALL,
            'K' => KEYSPACE,
            'E' => KEYEVENT,
            'm' => KEY_MISS,
            'n' => NEW,
            _ => CLASS_LETTERS.iter().find(|(_, l)| *l == c)?.0,
        };
    }
    Some(flags)
}

/// The canonical form CONFIG GET reports (`A` when every class it covers is on).
pub fn render(flags: u32) -> String {
    let mut s = String::new();
    // As Redis: `n` is printed only outside `A` (so `An` reads back as `A`).
    if flags & ALL == ALL {
        s.push('A');
    } else {
        for (bit, letter) in CLASS_LETTERS.iter().copied().chain([(NEW, 'n')]) {
            if flags & bit != 0 {
                s.push(letter);
            }
        }
    }
    for (bit, letter) in [(KEYSPACE, 'K'), (KEYEVENT, 'E'), (KEY_MISS, 'm')] {
        if flags & bit != 0 {
            s.push(letter);
        }
    }
    s
}

/// One message to publish: channel and payload (`shard`: to shard-channel subscribers, as
/// SPUBLISH).
pub struct Event {
    pub channel: Vec<u8>,
    pub message: Vec<u8>,
    pub shard: bool,
}

/// Queues a PUBLISH (`shard`: SPUBLISH) a script made: delivered with the thread's keyspace
/// events, in order with them, and dropped with them when the run is discarded
/// (`truncate`).
pub fn publish(shard: bool, channel: &[u8], message: &[u8]) {
    QUEUE.with(|q| {
        q.borrow_mut().push(Event {
            channel: channel.to_vec(),
            message: message.to_vec(),
            shard,
        })
    });
}

thread_local! {
    static QUEUE: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
}

/// Fires `event` of `class` for `key` in `db` (see the module essay).
#[inline]
pub fn notify(class: u32, event: &str, key: &[u8], db: u8) {
    let flags = flags();
    if flags & class == 0 {
        return;
    }
    queue(flags, event, key, db);
}

#[cold]
fn queue(flags: u32, event: &str, key: &[u8], db: u8) {
    QUEUE.with(|q| {
        let at = q.borrow().len();
        queue_at(&mut q.borrow_mut(), at, flags, event, key, db);
    });
}

/// Queues the keyspace and keyevent messages of one event at position `at`; returns the
/// position after them.
fn queue_at(
    q: &mut Vec<Event>,
    mut at: usize,
    flags: u32,
    event: &str,
    key: &[u8],
    db: u8,
) -> usize {
    if flags & KEYSPACE != 0 {
        let mut channel = format!("__keyspace@{db}__:").into_bytes();
        channel.extend_from_slice(key);
        let message = event.as_bytes().to_vec();
        q.insert(
            at,
            Event {
                channel,
                message,
                shard: false,
            },
        );
        at += 1;
    }
    if flags & KEYEVENT != 0 {
        let channel = format!("__keyevent@{db}__:{event}").into_bytes();
        q.insert(
            at,
            Event {
                channel,
                message: key.to_vec(),
                shard: false,
            },
        );
        at += 1;
    }
    at
}

/// How many events this thread has queued (a position for `notify_at`).
pub fn queued() -> usize {
    QUEUE.with(|q| q.borrow().len())
}

/// Drops the events queued after the first `len` (a discarded restartable run's, e.g. the
/// `keymiss` of a lookup it made before it stopped at a record not in memory).
pub fn truncate(len: usize) {
    QUEUE.with(|q| q.borrow_mut().truncate(len));
}

/// `notify`, but the messages go in at queue position `*at` (advanced past them): for an
/// event found out after the command's later events were queued (`keymiss`, settled after
/// the handler, belongs where the lookup happened, before the command's writes).
pub fn notify_at(at: &mut usize, class: u32, event: &str, key: &[u8], db: u8) {
    let flags = flags();
    if flags & class == 0 {
        return;
    }
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        let pos = (*at).min(q.len());
        *at = queue_at(&mut q, pos, flags, event, key, db);
    });
}

/// Takes the events queued on this thread (no allocation when there are none).
pub fn take() -> Vec<Event> {
    QUEUE.with(|q| std::mem::take(&mut *q.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Parsing and rendering follow Redis: `A` folds, `n` shows only outside `A`, bad letters fail.
    #[test]
    fn parse_and_render_like_redis() {
        assert_eq!(render(parse("KEA").unwrap()), "AKE");
        assert_eq!(render(parse("Kg$lshzxetd").unwrap()), "AK");
        assert_eq!(render(parse("Ex$").unwrap()), "$xE");
        assert_eq!(render(parse("Amn").unwrap()), "Am");
        assert_eq!(render(parse("nKgm").unwrap()), "gnKm");
        assert_eq!(render(parse("").unwrap()), "");
        assert_eq!(parse("Kq"), None);
        assert_eq!(parse("k"), None);
    }
}
