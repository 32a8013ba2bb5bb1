//! Differential tests of Pub/Sub against Debian's `redis-server` (7.0.15): subscribers and
//! publishers on separate connections (lavik runs `--threads 2`, so they sit on both
//! workers), RESP2 and RESP3, replies and pushed messages compared byte for byte in a
//! deterministic order: a command's replies, then after each PUBLISH every subscriber's
//! frames up to a PING sent behind them. Also the RESP2 subscribed-mode rules, PUBSUB
//! introspection, INFO and CLIENT fields, ACL channel permissions, the pubsub output
//! buffer limit, and keyspace notifications.
mod common;
use common::diff::{sorted_elements, Pair, RespConn, Rng};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// One connection to each server, driven in lockstep.
struct Two {
    l: RespConn,
    r: RespConn,
}

fn show(args: &[&str]) -> String {
    args.join(" ")
}

impl Two {
    fn open(p: &Pair, resp3: bool) -> Two {
        let mut t = Two {
            l: RespConn::connect(p.lavik.port),
            r: RespConn::connect(p.redis.port),
        };
        if resp3 {
            for c in [&mut t.l, &mut t.r] {
                let rep = c.call(&[b"HELLO", b"3"]);
                assert!(rep.starts_with(b"%"), "HELLO 3: {rep:?}");
            }
        }
        t
    }

    fn send(&mut self, args: &[&str]) {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.l.send(&a);
        self.r.send(&a);
    }

    /// Reads `n` frames from both and compares them.
    fn frames(&mut self, n: usize, what: &str) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for _ in 0..n {
            let (l, r) = (self.l.reply(), to_72(self.r.reply()));
            assert_eq!(
                String::from_utf8_lossy(&l),
                String::from_utf8_lossy(&r),
                "frame differs after {what}"
            );
            got.push(l);
        }
        got
    }

    /// Sends a command expecting `n` reply frames; compares them.
    fn cmd(&mut self, args: &[&str], n: usize) -> Vec<Vec<u8>> {
        self.send(args);
        self.frames(n, &show(args))
    }

    fn one(&mut self, args: &[&str]) -> Vec<u8> {
        self.cmd(args, 1).remove(0)
    }

    /// Reads every frame up to the reply of a PING sent now (messages pushed before it),
    /// from both, and compares the sequences.
    fn drain(&mut self, what: &str) -> usize {
        self.send(&["PING"]);
        let mut n = 0;
        loop {
            let f = self.frames(1, what).remove(0);
            if f == b"+PONG\r\n" || f == b"*2\r\n$4\r\npong\r\n$0\r\n\r\n" {
                return n;
            }
            n += 1;
        }
    }
}

/// Redis 7.2's wording of the channel NOPERM error (7.0, the reference binary, words it
/// differently; lavik follows 7.2 as the rest of its ACL errors do).
fn to_72(reply: Vec<u8>) -> Vec<u8> {
    if reply == b"-NOPERM this user has no permissions to access one of the channels used as arguments\r\n" {
        b"-NOPERM No permissions to access a channel\r\n".to_vec()
    } else {
        reply
    }
}

/// Polls both servers with `args` until each replies `want` (60 s at most).
fn wait_both(p: &mut Pair, args: &[&str], want: &[u8]) {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (l, r) = (p.l.call(&a), p.r.call(&a));
        if l == want && r == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: lavik {:?}, redis {:?}",
            show(args),
            String::from_utf8_lossy(&l),
            String::from_utf8_lossy(&r)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn info_field(reply: &[u8], field: &str) -> String {
    let text = String::from_utf8_lossy(reply).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.to_string()))
        .unwrap_or_else(|| panic!("no {field} in INFO"))
}

fn client_field(reply: &[u8], field: &str) -> String {
    let text = String::from_utf8_lossy(reply).into_owned();
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{field}=")).map(|v| v.to_string()))
        .unwrap_or_else(|| panic!("no {field} in {text}"))
}

// SUBSCRIBE/PSUBSCRIBE/SSUBSCRIBE replies, PUBLISH counts and the messages each kind of
// subscriber receives, across connections on both workers, in RESP2 and RESP3.
#[test]
fn publish_reaches_every_kind_of_subscriber() {
    let mut p = Pair::start("pubsub-basic", &["--threads", "2"]);
    let mut subs: Vec<Two> = (0..6).map(|i| Two::open(&p, i % 2 == 1)).collect();
    subs[0].cmd(&["SUBSCRIBE", "news", "sport"], 2);
    subs[1].cmd(&["SUBSCRIBE", "news", "news"], 2);
    subs[2].cmd(&["PSUBSCRIBE", "n*"], 1);
    subs[3].cmd(&["SUBSCRIBE", "news"], 1);
    subs[3].cmd(&["PSUBSCRIBE", "ne?s", "x"], 2);
    subs[4].cmd(&["SSUBSCRIBE", "news", "{t}a"], 2);
    subs[5].cmd(&["SSUBSCRIBE", "news"], 1);
    subs[5].cmd(&["SUBSCRIBE", "sport"], 1);
    for (ch, msg) in [
        ("news", "hello"),
        ("sport", ""),
        ("nope", "x"),
        ("nx", "binary\r\n\x00"),
    ] {
        p.check(&["PUBLISH", ch, msg]);
        for (i, s) in subs.iter_mut().enumerate() {
            s.drain(&format!("PUBLISH {ch} (subscriber {i})"));
        }
    }
    for (ch, msg) in [("news", "shard"), ("{t}a", "tagged"), ("sport", "none")] {
        p.check(&["SPUBLISH", ch, msg]);
        for (i, s) in subs.iter_mut().enumerate() {
            s.drain(&format!("SPUBLISH {ch} (subscriber {i})"));
        }
    }
    // PUBLISH and SPUBLISH from scripts: the same counts and messages (delivered after the
    // script), PUBLISH refused in a read-only script, a wrong arity as Redis words it.
    for args in [
        &[
            "EVAL",
            "return {redis.call('PUBLISH', ARGV[1], ARGV[2]), redis.call('SPUBLISH', 'news', 'sh')}",
            "0",
            "news",
            "from-lua",
        ][..],
        &["EVAL", "return redis.call('PUBLISH', 'nobody', 'x')", "0"],
        &["EVAL", "return redis.pcall('PUBLISH', 'news')", "0"],
        &["EVAL_RO", "return redis.pcall('PUBLISH', 'news', 'ro')", "0"],
        &["EVAL", "#!lua flags=no-writes\nreturn redis.pcall('PUBLISH', 'news', 'nw')", "0"],
    ] {
        p.check(args);
        for (i, s) in subs.iter_mut().enumerate() {
            s.drain(&format!("{} (subscriber {i})", args[1]));
        }
    }
    // A RESP3 subscriber publishing to its own channel gets the push before the reply.
    subs[1].cmd(&["PUBLISH", "news", "self"], 2);
    for s in subs.iter_mut() {
        s.drain("PUBLISH news self");
    }
    // A RESP3 subscriber may run any command.
    subs[1].one(&["SET", "k", "v"]);
    subs[1].one(&["GET", "k"]);
}

// RESP2 subscribed mode: only (P|S)(UN)SUBSCRIBE, PING, QUIT, RESET run, with Redis's
// error for the rest; PING answers `*2 pong ...`; UNSUBSCRIBE without arguments, with and
// without subscriptions; RESET leaves the mode.
#[test]
fn subscribed_mode_rules() {
    let p = Pair::start("pubsub-mode", &["--threads", "2"]);
    let mut s = Two::open(&p, false);
    s.one(&["UNSUBSCRIBE"]);
    s.one(&["PUNSUBSCRIBE"]);
    s.one(&["SUNSUBSCRIBE"]);
    s.one(&["UNSUBSCRIBE", "never"]);
    s.cmd(&["SUBSCRIBE", "a"], 1);
    s.one(&["GET", "k"]);
    s.one(&["CLIENT", "LIST"]);
    s.one(&["PUBLISH", "a", "m"]);
    s.one(&["PING"]);
    s.one(&["PING", "hello"]);
    s.cmd(&["PSUBSCRIBE", "p*"], 1);
    s.cmd(&["SSUBSCRIBE", "sh"], 1);
    s.one(&["UNSUBSCRIBE"]);
    s.one(&["GET", "k"]);
    s.one(&["PUNSUBSCRIBE", "p*", "q*"]);
    s.one(&["GET", "k"]);
    s.one(&["SUNSUBSCRIBE"]);
    s.one(&["GET", "k"]);
    s.one(&["SUNSUBSCRIBE"]);
    // RESET leaves subscribed mode and drops the subscriptions.
    s.cmd(&["SUBSCRIBE", "a", "b"], 2);
    s.one(&["RESET"]);
    s.one(&["GET", "k"]);
    s.one(&["PUBSUB", "NUMSUB", "a", "b"]);
    // RESP3: push replies, no restrictions, null for an empty UNSUBSCRIBE.
    // (Channels other than s's: a reply of s still unread may be computed after these
    // subscriptions on lavik, which runs PUBSUB NUMSUB in a later round.)
    let mut t = Two::open(&p, true);
    t.one(&["UNSUBSCRIBE"]);
    t.cmd(&["SUBSCRIBE", "x", "y"], 2);
    t.one(&["GET", "k"]);
    t.one(&["PING"]);
    t.cmd(&["UNSUBSCRIBE", "x", "y", "z"], 3);
    t.one(&["PING"]);
    // Arity errors come first.
    s.one(&["SUBSCRIBE"]);
    s.one(&["PUBLISH", "a"]);
    s.one(&["PUBSUB"]);
    s.one(&["PUBSUB", "NUMPAT", "x"]);
    s.one(&["PUBSUB", "BOGUS"]);
    s.one(&["PUBSUB", "HELP"]);
    s.one(&["QUIT"]);
}

// PUBSUB CHANNELS/NUMSUB/NUMPAT/SHARDCHANNELS/SHARDNUMSUB, INFO's pubsub fields and CLIENT
// INFO's sub/psub/ssub and flags, as subscribers on both workers come and go.
#[test]
fn introspection() {
    let mut p = Pair::start("pubsub-intro", &["--threads", "2"]);
    let mut subs: Vec<Two> = (0..4).map(|i| Two::open(&p, i >= 2)).collect();
    subs[0].one(&["CLIENT", "SETNAME", "sub0"]);
    subs[0].cmd(&["SUBSCRIBE", "c1", "c2", "x"], 3);
    subs[1].cmd(&["PSUBSCRIBE", "c*", "d*"], 2);
    subs[2].cmd(&["SUBSCRIBE", "c1"], 1);
    subs[2].cmd(&["SSUBSCRIBE", "s1", "s2"], 2);
    subs[3].cmd(&["PSUBSCRIBE", "c*"], 1);
    subs[3].cmd(&["SSUBSCRIBE", "s1"], 1);
    let check_all = |p: &mut Pair| {
        p.check_with(&["PUBSUB", "CHANNELS"], sorted_elements);
        p.check_with(&["PUBSUB", "CHANNELS", "c*"], sorted_elements);
        p.check(&["PUBSUB", "CHANNELS", "nothing*"]);
        p.check(&["PUBSUB", "NUMSUB"]);
        p.check(&["PUBSUB", "NUMSUB", "c1", "c2", "x", "zz", "c1"]);
        p.check(&["PUBSUB", "NUMPAT"]);
        p.check_with(&["PUBSUB", "SHARDCHANNELS"], sorted_elements);
        p.check(&["PUBSUB", "SHARDCHANNELS", "s1"]);
        p.check(&["PUBSUB", "SHARDNUMSUB", "s1", "s2", "c1"]);
        let (l, r) = p.both(&[b"INFO", b"stats"]);
        for f in ["pubsub_channels", "pubsub_patterns", "pubsubshard_channels"] {
            assert_eq!(info_field(&l, f), info_field(&r, f), "INFO {f}");
        }
    };
    check_all(&mut p);
    // The commands' ACL category and COMMAND facts are Redis's.
    p.check_with(&["ACL", "CAT", "pubsub"], sorted_elements);
    for c in [
        "subscribe",
        "unsubscribe",
        "psubscribe",
        "punsubscribe",
        "publish",
    ] {
        p.check(&["COMMAND", "INFO", c]);
    }
    // CLIENT INFO of a RESP3 subscriber: flag P and the three counts.
    let (l, r) = (
        subs[2].l.call(&[b"CLIENT", b"INFO"]),
        subs[2].r.call(&[b"CLIENT", b"INFO"]),
    );
    for f in ["flags", "sub", "psub", "ssub"] {
        assert_eq!(client_field(&l, f), client_field(&r, f), "CLIENT INFO {f}");
    }
    // CLIENT LIST seen from another connection: the RESP2 subscriber's line.
    let (l, r) = p.both(&[b"CLIENT", b"LIST"]);
    let line = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .find(|l| l.contains("name=sub0"))
            .expect("sub0 listed")
            .to_string()
    };
    for f in ["flags", "sub", "psub", "ssub"] {
        let (lf, rf) = (
            client_field(line(&l).as_bytes(), f),
            client_field(line(&r).as_bytes(), f),
        );
        assert_eq!(lf, rf, "CLIENT LIST {f}");
    }
    subs[0].cmd(&["UNSUBSCRIBE", "c2"], 1);
    subs[1].cmd(&["PUNSUBSCRIBE", "d*"], 1);
    subs[3].one(&["SUNSUBSCRIBE"]);
    check_all(&mut p);
    // A closed subscriber leaves the registry (each server handles the close a moment
    // after it: wait until neither counts sub0's only remaining channel `x`).
    drop(subs.remove(0));
    wait_both(
        &mut p,
        &["PUBSUB", "NUMSUB", "x"],
        b"*2\r\n$1\r\nx\r\n:0\r\n",
    );
    check_all(&mut p);
    subs[1].one(&["RESET"]);
    check_all(&mut p);
}

/// What one random connection subscribed to (to size UNSUBSCRIBE replies).
#[derive(Default)]
struct Model {
    channels: BTreeSet<&'static str>,
    patterns: BTreeSet<&'static str>,
    shard: BTreeSet<&'static str>,
}

// A seeded random mix of subscriptions, unsubscriptions and publications over six
// connections (RESP2 and RESP3, both workers); after every PUBLISH each connection's pushed
// frames are compared.
#[test]
fn random_sequences() {
    const CHANNELS: &[&str] = &["a1", "a2", "b1", "b2", "c", "{x}a"];
    // Disjoint: a channel matches at most one pattern, so a message's frames have one order.
    const PATTERNS: &[&str] = &["a*", "b?", "[c]"];
    let mut p = Pair::start("pubsub-random", &["--threads", "2"]);
    let mut rng = Rng::new(0x5eed_0015);
    let mut conns: Vec<(Two, Model)> = (0..6)
        .map(|i| (Two::open(&p, i % 3 == 2), Model::default()))
        .collect();
    for step in 0..300 {
        let i = rng.below(conns.len() as u64) as usize;
        let (c, m) = &mut conns[i];
        match rng.below(10) {
            0 | 1 => {
                let names: Vec<&str> = (0..1 + rng.below(3)).map(|_| *rng.pick(CHANNELS)).collect();
                let mut args = vec!["SUBSCRIBE"];
                args.extend(&names);
                c.cmd(&args, names.len());
                m.channels.extend(names);
            }
            2 => {
                let pat = *rng.pick(PATTERNS);
                c.cmd(&["PSUBSCRIBE", pat], 1);
                m.patterns.insert(pat);
            }
            3 => {
                let ch = *rng.pick(CHANNELS);
                c.cmd(&["SSUBSCRIBE", ch], 1);
                m.shard.insert(ch);
            }
            4 => {
                // UNSUBSCRIBE of named channels, or of all when at most one (the order
                // of an unsubscribe-all is Redis's hashtable order).
                if m.channels.len() <= 1 && rng.chance(50) {
                    let n = m.channels.len().max(1);
                    c.cmd(&["UNSUBSCRIBE"], n);
                    m.channels.clear();
                } else {
                    let ch = *rng.pick(CHANNELS);
                    c.cmd(&["UNSUBSCRIBE", ch], 1);
                    m.channels.remove(ch);
                }
            }
            5 => {
                let pat = *rng.pick(PATTERNS);
                c.cmd(&["PUNSUBSCRIBE", pat], 1);
                m.patterns.remove(pat);
            }
            6 => {
                let ch = *rng.pick(CHANNELS);
                c.cmd(&["SUNSUBSCRIBE", ch], 1);
                m.shard.remove(ch);
            }
            _ => {
                let ch = *rng.pick(CHANNELS);
                let msg = format!("m{step}");
                let shard = rng.chance(25);
                p.check(&[if shard { "SPUBLISH" } else { "PUBLISH" }, ch, &msg]);
                for (j, (c, _)) in conns.iter_mut().enumerate() {
                    c.drain(&format!("step {step}: PUBLISH {ch} (connection {j})"));
                }
            }
        }
    }
    p.check(&["PUBSUB", "NUMPAT"]);
    p.check(&["PUBSUB", "NUMSUB", "a1", "a2", "b1", "b2", "c", "{x}a"]);
    p.check(&["PUBSUB", "SHARDNUMSUB", "a1", "a2", "b1", "b2", "c", "{x}a"]);
}

// ACL channel rules: PUBLISH, SUBSCRIBE, PSUBSCRIBE and SSUBSCRIBE are refused with
// Redis's NOPERM text outside the user's `&` patterns, and logged with context "channel".
#[test]
fn acl_channel_permissions() {
    let mut p = Pair::start("pubsub-acl", &["--threads", "2"]);
    p.check(&[
        "ACL",
        "SETUSER",
        "u",
        "on",
        "nopass",
        "resetchannels",
        "&news*",
        "+@all",
    ]);
    p.check(&["AUTH", "u", "x"]);
    p.check(&["PUBLISH", "news1", "m"]);
    p.check_with(&["PUBLISH", "other", "m"], |b| to_72(b.to_vec()));
    p.check_with(&["SPUBLISH", "other", "m"], |b| to_72(b.to_vec()));
    p.check(&["PUBSUB", "NUMSUB", "other"]);
    let mut s = Two::open(&p, true);
    s.one(&["AUTH", "u", "x"]);
    s.one(&["SUBSCRIBE", "other"]);
    s.one(&["SSUBSCRIBE", "other"]);
    s.one(&["PSUBSCRIBE", "news*x"]);
    s.one(&["PSUBSCRIBE", "news*"]);
    s.cmd(&["SUBSCRIBE", "news", "newsy"], 2);
    s.one(&["UNSUBSCRIBE", "other"]);
    p.check(&["AUTH", "default", "x"]);
    let (l, r) = p.both(&[b"ACL", b"LOG"]);
    let fields = |b: &[u8]| {
        let t = String::from_utf8_lossy(b).into_owned();
        (t.matches("channel").count(), t.matches("other").count())
    };
    assert_eq!(
        fields(&l),
        fields(&r),
        "ACL LOG: {:?}",
        String::from_utf8_lossy(&l)
    );
    // An ACL change that takes a subscribed channel away disconnects that subscriber only.
    let mut keep = Two::open(&p, false);
    keep.one(&["AUTH", "u", "x"]);
    keep.cmd(&["SUBSCRIBE", "news1"], 1);
    p.check(&["ACL", "SETUSER", "u", "&other"]);
    p.check(&["PUBSUB", "NUMSUB", "news1", "news"]);
    p.check(&["ACL", "SETUSER", "u", "resetchannels", "&news1"]);
    assert!(
        s.l.closed() && s.r.closed(),
        "subscriber of a refused channel stays"
    );
    // Its subscriptions go when each server handles the close.
    wait_both(
        &mut p,
        &["PUBSUB", "NUMSUB", "news"],
        b"*2\r\n$4\r\nnews\r\n:0\r\n",
    );
    wait_both(&mut p, &["PUBSUB", "NUMPAT"], b":0\r\n");
    p.check(&["PUBSUB", "NUMSUB", "news1", "news"]);
    p.check(&["PUBSUB", "NUMPAT"]);
    p.check(&["PUBLISH", "news1", "still"]);
    keep.drain("PUBLISH news1 after the ACL change");
}

// A subscriber that stops reading is disconnected by the pubsub class of
// client-output-buffer-limit; publishers and other subscribers carry on.
#[test]
fn slow_subscriber_is_disconnected() {
    let s = common::Server::start("pubsub-slow", &["--threads", "2"]);
    let mut admin = RespConn::connect(s.port);
    assert_eq!(
        admin.call(&[
            b"CONFIG",
            b"SET",
            b"client-output-buffer-limit",
            b"pubsub 256kb 128kb 1"
        ]),
        b"+OK\r\n"
    );
    let mut slow = RespConn::connect(s.port);
    slow.call(&[b"SUBSCRIBE", b"feed"]);
    let mut fine = RespConn::connect(s.port);
    fine.call(&[b"SUBSCRIBE", b"feed"]);
    let msg = vec![b'x'; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    loop {
        let n = admin.call(&[b"PUBLISH", b"feed", &msg]);
        sent += 1;
        // The reading subscriber keeps up.
        let m = fine.reply();
        assert!(
            m.ends_with(&msg[..100]) || m.len() > msg.len(),
            "message to fine"
        );
        if n == b":1\r\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slow subscriber never closed ({sent} sent)"
        );
    }
    let info = admin.call(&[b"INFO", b"stats"]);
    let closes: u64 = info_field(&info, "client_output_buffer_limit_disconnections")
        .trim()
        .parse()
        .unwrap();
    assert!(closes >= 1);
    assert_eq!(
        admin.call(&[b"PUBSUB", b"NUMSUB", b"feed"]),
        b"*2\r\n$4\r\nfeed\r\n:1\r\n"
    );
    // The slow client's socket ends after what the kernel already held.
    let end = Instant::now() + Duration::from_secs(20);
    while !slow.closed() {
        assert!(Instant::now() < end, "slow subscriber still open");
    }
    assert_eq!(admin.call(&[b"PING"]), b"+PONG\r\n");
}

// notify-keyspace-events: CONFIG SET/GET with Redis's parsing, canonical form and error;
// then the events of string, keyspace, hash, set, bitmap and HyperLogLog commands (and
// `expired`) reach a pattern subscriber (RESP2) and a channel subscriber (RESP3) on any
// worker, frame for frame as Redis sends them.
#[test]
fn keyspace_notifications() {
    let mut p = Pair::start("pubsub-keyspace", &["--threads", "2"]);
    for v in ["KEA", "Kg$lshzxetd", "$xE", "Amn", "nKgm", "gK", "", "Kq"] {
        p.check(&["CONFIG", "SET", "notify-keyspace-events", v]);
        p.check(&["CONFIG", "GET", "notify-keyspace-events"]);
    }
    let mut all = Two::open(&p, false);
    all.cmd(&["PSUBSCRIBE", "__key*__:*"], 1);
    let mut sets = Two::open(&p, true);
    sets.cmd(&["SUBSCRIBE", "__keyevent@0__:set", "__keyspace@1__:k"], 2);
    // Only K and $: string events on keyspace channels, nothing else.
    p.check(&["CONFIG", "SET", "notify-keyspace-events", "K$"]);
    let run = |p: &mut Pair, all: &mut Two, sets: &mut Two, cmd: &[&str]| {
        if cmd[0] == "SPOP" {
            // Which members are popped is random: only the events are compared.
            let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
            p.both(&a);
        } else {
            p.check(cmd);
        }
        all.drain(&show(cmd));
        sets.drain(&show(cmd));
    };
    run(&mut p, &mut all, &mut sets, &["SET", "s", "v"]);
    run(&mut p, &mut all, &mut sets, &["HSET", "h0", "a", "1"]);
    run(&mut p, &mut all, &mut sets, &["DEL", "h0"]);
    p.check(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
    let script: &[&[&str]] = &[
        &["SET", "s", "v2", "EX", "100"],
        &["SETNX", "s", "x"],
        &["SETNX", "s2", "x"],
        &["GETSET", "s2", "y"],
        &["APPEND", "s2", "z"],
        &["SETRANGE", "s2", "1", "ab"],
        &["SETRANGE", "s2", "1", ""],
        &["INCR", "n"],
        &["INCRBY", "n", "5"],
        &["DECR", "n"],
        &["DECRBY", "n", "2"],
        &["INCRBYFLOAT", "f", "1.5"],
        &["MSET", "m1", "a", "m2", "b"],
        &["MSETNX", "m3", "a", "m4", "b"],
        &["MSETNX", "m3", "a", "m9", "b"],
        &["GETEX", "s", "PERSIST"],
        &["GETEX", "s", "EX", "100"],
        &["GETEX", "s", "PERSIST"],
        &["GETEX", "s", "PERSIST"],
        &["GETDEL", "s2"],
        &["GETDEL", "s2"],
        &["SETEX", "e", "100", "v"],
        &["PSETEX", "e", "100000", "v"],
        &["EXPIRE", "n", "100"],
        &["PERSIST", "n"],
        &["PEXPIRE", "n", "100000"],
        &["EXPIRE", "n", "-1"],
        &["EXPIRE", "nothere", "10"],
        &["RENAME", "m1", "m5"],
        &["RENAMENX", "m5", "m2"],
        &["RENAMENX", "m5", "m6"],
        &["COPY", "m6", "m7"],
        &["COPY", "m6", "m7", "DB", "1"],
        &["DEL", "m6", "m7", "nothere"],
        &["HSET", "h", "a", "1", "b", "2"],
        &["HMSET", "h", "a", "1"],
        &["HSETNX", "h", "a", "1"],
        &["HSETNX", "h", "c", "3"],
        &["HINCRBY", "h", "a", "2"],
        &["HINCRBYFLOAT", "h", "a", "1.5"],
        &["HDEL", "h", "a", "b", "zz"],
        &["HDEL", "h", "zz"],
        &["HDEL", "h", "c"],
        &["SADD", "st", "a", "b", "c"],
        &["SADD", "st", "a"],
        &["SREM", "st", "a"],
        &["SMOVE", "st", "st2", "b"],
        &["SMOVE", "st", "st2", "c"],
        &["SPOP", "st2"],
        &["SADD", "x", "1", "2", "3"],
        &["SADD", "y", "2", "3", "4"],
        &["SINTERSTORE", "z", "x", "y"],
        &["SUNIONSTORE", "z", "x", "y"],
        &["SDIFFSTORE", "z", "x", "y"],
        &["SINTERSTORE", "z", "x", "nothere"],
        &["SINTERSTORE", "z", "x", "nothere"],
        &["SADD", "sp", "1", "2", "3"],
        &["SPOP", "sp", "2"],
        &["SPOP", "sp", "5"],
        &["SETBIT", "b", "7", "1"],
        &["SETBIT", "b", "7", "1"],
        &["BITOP", "OR", "b2", "b", "b"],
        &["BITOP", "AND", "b2", "nothere"],
        &["BITFIELD", "b", "SET", "u8", "0", "255"],
        &["PFADD", "hl", "a", "b"],
        &["PFADD", "hl", "a"],
        &["PFMERGE", "hl2", "hl"],
        &["SELECT", "1"],
        &["SET", "k", "in-db-1"],
        &["DEL", "k"],
        &["SELECT", "0"],
    ];
    for cmd in script {
        run(&mut p, &mut all, &mut sets, cmd);
    }
    // Lists, sorted sets and GEO: every write command's events (and none from reads,
    // failures or no-ops), in Redis's order, to the RESP2 pattern subscriber and to a RESP3
    // pattern subscriber on the other connection pair.
    let mut push3 = Two::open(&p, true);
    push3.cmd(&["PSUBSCRIBE", "__keyevent@0__:*", "__keyspace@0__:*"], 2);
    let lists_zsets_geo: &[&[&str]] = &[
        &["LPUSH", "l", "a", "b", "c"],
        &["RPUSH", "l", "d", "e"],
        &["LPUSHX", "nol", "x"],
        &["RPUSHX", "nol", "x"],
        &["RPUSHX", "l", "f"],
        &["LPUSHX", "l", "z"],
        &["LPUSH", "s", "x"],
        &["LINSERT", "l", "BEFORE", "a", "x"],
        &["LINSERT", "l", "AFTER", "nothere", "y"],
        &["LINSERT", "nol", "BEFORE", "a", "b"],
        &["LSET", "l", "0", "q"],
        &["LSET", "l", "100", "q"],
        &["LSET", "nol", "0", "q"],
        &["LRANGE", "l", "0", "-1"],
        &["LINDEX", "l", "0"],
        &["LLEN", "l"],
        &["LPOS", "l", "a"],
        &["LREM", "l", "1", "x"],
        &["LREM", "l", "0", "nothere"],
        &["LPOP", "l"],
        &["RPOP", "l", "2"],
        &["LPOP", "l", "0"],
        &["LPOP", "nol"],
        &["RPOP", "nol", "2"],
        &["LTRIM", "l", "0", "-1"],
        &["LTRIM", "l", "0", "2"],
        &["LTRIM", "nol", "0", "2"],
        &["LMOVE", "l", "l2", "LEFT", "RIGHT"],
        &["LMOVE", "l2", "l2", "RIGHT", "LEFT"],
        &["LMOVE", "nol", "l2", "RIGHT", "LEFT"],
        &["RPOPLPUSH", "l", "l2"],
        &["LMPOP", "2", "nol", "l2", "LEFT", "COUNT", "1"],
        &["LMPOP", "1", "nol", "LEFT"],
        &["LTRIM", "l2", "5", "10"],
        &["RPUSH", "l3", "a", "a", "a"],
        &["LREM", "l3", "0", "a"],
        &["LPUSH", "l4", "a"],
        &["LPOP", "l4"],
        &["RPUSH", "l5", "a", "b"],
        &["LMOVE", "l5", "l6", "LEFT", "LEFT"],
        &["LMOVE", "l5", "l6", "RIGHT", "RIGHT"],
        &["RPUSH", "l6", "c"],
        &["LMPOP", "1", "l6", "RIGHT", "COUNT", "10"],
        &["RPUSH", "l7", "a"],
        &["RPOPLPUSH", "l7", "l7"],
        &["RPOP", "l7", "5"],
        &["ZADD", "z", "1", "a", "2", "b", "3", "c"],
        &["ZADD", "z", "1", "a"],
        &["ZADD", "z", "XX", "5", "a"],
        &["ZADD", "z", "NX", "1", "a"],
        &["ZADD", "z", "CH", "6", "a"],
        &["ZADD", "z", "INCR", "1", "a"],
        &["ZADD", "z", "NX", "INCR", "1", "a"],
        &["ZINCRBY", "z", "2", "b"],
        &["ZINCRBY", "z", "0", "b"],
        &["ZADD", "z", "GT", "1", "b"],
        &["ZADD", "z", "LT", "1", "b"],
        &["ZADD", "nz", "XX", "1", "a"],
        &["ZADD", "zi", "INCR", "5", "a"],
        &["ZADD", "zi", "XX", "INCR", "5", "b"],
        &["ZREM", "zi", "a"],
        &["ZADD", "s", "1", "a"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["ZSCORE", "z", "a"],
        &["ZCARD", "z"],
        &["ZREM", "z", "nothere"],
        &["ZREM", "nz", "a"],
        &["ZREM", "z", "a"],
        &["ZREMRANGEBYRANK", "z", "0", "0"],
        &["ZREMRANGEBYSCORE", "z", "100", "200"],
        &["ZADD", "z", "1", "m", "1", "n", "1", "o", "1", "p"],
        &["ZREMRANGEBYLEX", "z", "[m", "[n"],
        &["ZREMRANGEBYLEX", "z", "[x", "[y"],
        &["ZREMRANGEBYRANK", "nz", "0", "-1"],
        &["ZREMRANGEBYSCORE", "z", "-inf", "+inf"],
        &["ZADD", "z1", "1", "a"],
        &["ZREMRANGEBYRANK", "z1", "0", "-1"],
        &["ZADD", "z1", "1", "a"],
        &["ZREMRANGEBYLEX", "z1", "-", "+"],
        &["ZADD", "z1", "1", "a"],
        &["ZREM", "z1", "a", "b"],
        &["ZADD", "z2", "1", "a", "2", "b", "3", "c", "4", "d"],
        &["ZPOPMIN", "z2"],
        &["ZPOPMAX", "z2", "2"],
        &["ZPOPMIN", "z2", "0"],
        &["ZPOPMAX", "z2", "-1"],
        &["ZPOPMIN", "nz"],
        &["ZPOPMAX", "nz", "3"],
        &["ZMPOP", "2", "nz", "z2", "MAX", "COUNT", "5"],
        &["ZMPOP", "1", "nz", "MIN"],
        &["ZADD", "z2", "1", "a", "2", "b"],
        &["ZMPOP", "1", "z2", "MIN"],
        &["ZPOPMAX", "z2", "1"],
        &["ZADD", "za", "1", "a", "2", "b"],
        &["ZADD", "zb", "2", "b", "3", "c"],
        &["ZUNIONSTORE", "zu", "2", "za", "zb"],
        &["ZINTERSTORE", "zu", "2", "za", "zb", "WEIGHTS", "2", "3"],
        &["ZDIFFSTORE", "zu", "2", "za", "zb"],
        &["ZINTERSTORE", "zu", "2", "za", "nz"],
        &["ZINTERSTORE", "zu", "2", "za", "nz"],
        &["ZDIFFSTORE", "zu", "1", "za"],
        &["ZDIFFSTORE", "zu", "2", "za", "za"],
        &["ZUNIONSTORE", "zu", "1", "nz"],
        &["ZUNION", "2", "za", "zb"],
        &["ZRANGESTORE", "zr", "za", "0", "-1"],
        &["ZRANGESTORE", "zr", "za", "5", "10"],
        &["ZRANGESTORE", "zr", "za", "5", "10"],
        &["ZRANGESTORE", "zr", "za", "(1", "+inf", "BYSCORE"],
        &["ZRANGESTORE", "zr", "nz", "0", "-1"],
        &["ZRANGESTORE", "zr", "nz", "0", "-1"],
        &["ZREM", "za", "a", "b"],
        &[
            "GEOADD",
            "g",
            "13.361389",
            "38.115556",
            "Palermo",
            "15.087269",
            "37.502669",
            "Catania",
        ],
        &["GEOADD", "g", "NX", "13.361389", "38.115556", "Palermo"],
        &["GEOADD", "g", "XX", "CH", "13.5", "38.1", "Palermo"],
        &["GEOADD", "g", "13.5", "38.1", "Palermo"],
        &["GEOADD", "g", "XX", "1", "2", "Nowhere"],
        &["GEOPOS", "g", "Palermo"],
        &["GEODIST", "g", "Palermo", "Catania"],
        &[
            "GEOSEARCH",
            "g",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "200",
            "km",
            "ASC",
        ],
        &[
            "GEOSEARCHSTORE",
            "gss",
            "g",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "200",
            "km",
        ],
        &[
            "GEOSEARCHSTORE",
            "gss",
            "g",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "1",
            "km",
        ],
        &[
            "GEOSEARCHSTORE",
            "gss",
            "nothere",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "1",
            "km",
        ],
        &[
            "GEOSEARCHSTORE",
            "gss",
            "g",
            "FROMMEMBER",
            "Palermo",
            "BYBOX",
            "400",
            "400",
            "km",
            "STOREDIST",
        ],
        &[
            "GEOSEARCHSTORE",
            "gss",
            "nothere",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "1",
            "km",
        ],
        &["ZREM", "g", "Palermo", "Catania"],
        &[
            "DEL", "zb", "zu", "zr", "gss", "l", "l2", "l6", "l7", "z", "z2",
        ],
    ];
    let run3 = |p: &mut Pair, all: &mut Two, push3: &mut Two, cmd: &[&str]| {
        p.check(cmd);
        all.drain(&show(cmd));
        push3.drain(&show(cmd));
    };
    for hello in [2, 3] {
        p.hello(hello);
        for cmd in lists_zsets_geo {
            run3(&mut p, &mut all, &mut push3, cmd);
        }
    }
    // `new` before the first event of a created list / sorted set (an LMOVE destination
    // too), never on update.
    p.check(&["CONFIG", "SET", "notify-keyspace-events", "KElzgn"]);
    for cmd in [
        &["LPUSH", "nl", "a"][..],
        &["LPUSH", "nl", "b"],
        &["LMOVE", "nl", "nl2", "LEFT", "LEFT"],
        &["LMOVE", "nl", "nl2", "LEFT", "LEFT"],
        &["ZADD", "nz2", "1", "a"],
        &["ZUNIONSTORE", "nz3", "1", "nz2"],
        &["ZRANGESTORE", "nz4", "nz2", "0", "-1"],
        &["GEOADD", "ng", "13.361389", "38.115556", "Palermo"],
        &[
            "GEOSEARCHSTORE",
            "ng2",
            "ng",
            "FROMMEMBER",
            "Palermo",
            "BYRADIUS",
            "1",
            "km",
        ],
        &["DEL", "nl2", "nz2", "nz3", "nz4", "ng", "ng2"],
    ] {
        run3(&mut p, &mut all, &mut push3, cmd);
    }
    p.hello(2);
    drop(push3);
    sets.drain("lists, sorted sets and GEO");
    p.check(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
    // `n`: `new` when a key is created (before the command's own event), not on overwrite.
    p.check(&["CONFIG", "SET", "notify-keyspace-events", "KEg$hsn"]);
    for cmd in [
        &["SET", "new1", "v"][..],
        &["SET", "new1", "v2"],
        &["HSET", "nh", "a", "1"],
        &["HSET", "nh", "b", "1"],
        &["SADD", "ns", "a"],
        &["RENAME", "new1", "new2"],
        &["COPY", "new2", "new3"],
        &["MSET", "new4", "x", "new2", "y"],
        &["DEL", "new2", "new3", "new4", "nh", "ns"],
    ] {
        run(&mut p, &mut all, &mut sets, cmd);
    }
    p.check(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
    // `expired`: from lazy or active expiry, whichever comes first on either server.
    run(&mut p, &mut all, &mut sets, &["SET", "px", "v", "PX", "50"]);
    std::thread::sleep(Duration::from_millis(250));
    run(&mut p, &mut all, &mut sets, &["GET", "px"]);
    // Off again: nothing is delivered.
    p.check(&["CONFIG", "SET", "notify-keyspace-events", ""]);
    run(&mut p, &mut all, &mut sets, &["SET", "s", "quiet"]);
}
