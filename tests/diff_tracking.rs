//! Differential tests of client-side caching (CLIENT TRACKING with REDIRECT, BCAST,
//! PREFIX, OPTIN, OPTOUT, NOLOOP; CLIENT CACHING, GETREDIR, TRACKINGINFO; invalidation
//! pushes in RESP3 and `__redis__:invalidate` messages in RESP2; the INFO fields and
//! `tracking-table-max-keys`) against Debian's `redis-server` (7.0.15). lavik runs on
//! `--threads 2`: the keys used are of different slots, so they live on both workers,
//! and the reading, writing and redirect clients connect to either worker.
//!
//! How invalidations are compared: after the writer's reply is back, the observing
//! client is sent PING and every frame up to the PING reply is read, on both servers;
//! the frame lists must be equal. Both servers have the invalidation queued before the
//! writer's reply leaves, so the order is deterministic.
//!
//! Client ids differ between the two servers, so commands naming one (REDIRECT) are sent
//! with each server's own id. Nothing here differs between Redis 7.0 and 7.2.
mod common;
use common::diff::{Pair, RespConn};
use std::time::{Duration, Instant};

/// One client on each server.
struct Duo {
    l: RespConn,
    r: RespConn,
    name: &'static str,
}

fn frames_text(v: &[Vec<u8>]) -> String {
    v.iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn is_ping_reply(f: &[u8]) -> bool {
    f == b"+PONG\r\n" || f.starts_with(b"*2\r\n$4\r\npong\r\n")
}

fn bytes(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|a| a.as_slice()).collect()
}

impl Duo {
    fn new(p: &Pair, name: &'static str, proto: u8) -> Duo {
        let mut d = Duo {
            l: RespConn::connect(p.lavik.port),
            r: RespConn::connect(p.redis.port),
            name,
        };
        if proto == 3 {
            for c in [&mut d.l, &mut d.r] {
                let rep = c.call(&[b"HELLO", b"3"]);
                assert!(rep.starts_with(b"%"), "HELLO 3: {rep:?}");
            }
        }
        d
    }

    /// This client's id on (lavik, redis).
    fn ids(&mut self) -> (String, String) {
        let id = |c: &mut RespConn| {
            let rep = c.call(&[b"CLIENT", b"ID"]);
            String::from_utf8_lossy(&rep[1..rep.len() - 2]).into_owned()
        };
        (id(&mut self.l), id(&mut self.r))
    }

    /// Sends `args` (lavik's and redis's) and compares the one reply.
    fn check2(&mut self, l: &[Vec<u8>], r: &[Vec<u8>]) -> Vec<u8> {
        let (a, b) = (self.l.call(&refs(l)), self.r.call(&refs(r)));
        assert_eq!(
            String::from_utf8_lossy(&a),
            String::from_utf8_lossy(&b),
            "{}: {:?} (lavik vs redis)",
            self.name,
            String::from_utf8_lossy(&l.concat())
        );
        a
    }

    /// Like `check`, for a reply naming a client id (`:id`), which differs per server.
    fn check_naming(&mut self, args: &[&str], ids: &(String, String)) {
        let a = bytes(args);
        let norm = |rep: Vec<u8>, id: &str| {
            String::from_utf8_lossy(&rep).replace(&format!(":{id}\r\n"), ":ID\r\n")
        };
        let (l, r) = (
            norm(self.l.call(&refs(&a)), &ids.0),
            norm(self.r.call(&refs(&a)), &ids.1),
        );
        assert_eq!(l, r, "{}: {args:?} (lavik vs redis)", self.name);
    }

    fn check(&mut self, args: &[&str]) -> Vec<u8> {
        let a = bytes(args);
        self.check2(&a, &a)
    }

    /// Sends `args` then PING, and compares every frame up to the PING reply: the
    /// command's reply and the pushes that came with or before it.
    fn frames(&mut self, args: &[&str]) -> Vec<Vec<u8>> {
        let read = |c: &mut RespConn| {
            if !args.is_empty() {
                c.send(&refs(&bytes(args)));
            }
            c.send(&[b"PING"]);
            let mut got = Vec::new();
            loop {
                let f = c.reply();
                let done = is_ping_reply(&f);
                got.push(f);
                if done {
                    return got;
                }
            }
        };
        let (a, b) = (read(&mut self.l), read(&mut self.r));
        assert_eq!(
            frames_text(&a),
            frames_text(&b),
            "{}: frames after {args:?} (lavik vs redis)",
            self.name
        );
        a
    }

    /// The pushes waiting for this client (compared), without a command of its own.
    fn sync(&mut self) -> Vec<Vec<u8>> {
        self.frames(&[])
    }

    /// `field=` of CLIENT INFO on both servers (ids and addresses differ, flags do not).
    fn info_field(&mut self, field: &str) {
        let get = |c: &mut RespConn| {
            let rep = c.call(&[b"CLIENT", b"INFO"]);
            let text = String::from_utf8_lossy(&rep).into_owned();
            text.split_whitespace()
                .find(|w| w.starts_with(&format!("{field}=")))
                .map(str::to_string)
                .unwrap_or_default()
        };
        let (a, b) = (get(&mut self.l), get(&mut self.r));
        assert_eq!(a, b, "{}: CLIENT INFO {field}", self.name);
    }
}

fn info_value(c: &mut RespConn, section: &str, field: &str) -> String {
    let rep = c.call(&[b"INFO", section.as_bytes()]);
    let text = String::from_utf8_lossy(&rep).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO {section} has {field}"))
        .trim()
        .to_string()
}

/// INFO's tracking fields are equal on both servers.
fn check_info(p: &mut Pair) {
    for (section, field) in [
        ("clients", "tracking_clients"),
        ("stats", "tracking_total_keys"),
        ("stats", "tracking_total_items"),
        ("stats", "tracking_total_prefixes"),
    ] {
        let (a, b) = (
            info_value(&mut p.l, section, field),
            info_value(&mut p.r, section, field),
        );
        assert_eq!(a, b, "INFO {field}");
    }
}

fn connected(c: &mut RespConn) -> usize {
    info_value(c, "clients", "connected_clients")
        .parse()
        .expect("a count")
}

/// Waits until both servers count `n` connected clients (a closed one is gone).
fn wait_connected(p: &mut Pair, n: usize) {
    let start = Instant::now();
    while connected(&mut p.l) != n || connected(&mut p.r) != n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "clients not closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Keys of different slots: with 8 shards on 2 workers they spread over both.
const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];

// One server pair for the file (start-up dominates the cost); each scenario below says
// what it proves.
#[test]
fn client_tracking_like_redis() {
    let mut p = Pair::start("diff-tracking", &[]);
    default_mode_resp3(&p);
    optin_optout(&p);
    bcast_prefixes_resp3(&p);
    redirect_resp2(&mut p);
    option_errors(&p);
    broken_redirect(&mut p);
    check_info(&mut p);
    config_max_keys(&mut p);
}

// Default mode in RESP3: every write kind invalidates a key the reader read, once, on
// either worker; NOLOOP spares the client's own writes; expiry and FLUSHALL invalidate.
fn default_mode_resp3(p: &Pair) {
    let mut reader = Duo::new(p, "reader", 3);
    let mut writer = Duo::new(p, "writer", 2);
    reader.check(&["CLIENT", "TRACKING", "on"]);
    reader.check(&["CLIENT", "TRACKINGINFO"]);
    reader.check(&["CLIENT", "GETREDIR"]);
    reader.info_field("flags");
    for k in KEYS {
        writer.check(&["SET", k, "v"]);
        reader.check(&["GET", k]);
    }
    reader.check(&["MGET", "m0", "m1", "m2"]);
    // A second read of a key does not make a second invalidation.
    reader.check(&["STRLEN", "k0"]);
    writer.check(&["SET", "k0", "w"]);
    reader.sync();
    writer.check(&["DEL", "k1"]);
    reader.sync();
    writer.check(&["APPEND", "k2", "x"]);
    reader.sync();
    writer.check(&["MSET", "k3", "1", "k4", "2", "m1", "3"]);
    reader.sync();
    writer.check(&["RENAME", "k5", "m0"]);
    reader.sync();
    writer.check(&["EXPIRE", "m2", "100"]);
    reader.sync();
    // Forgotten after the first invalidation: a second write says nothing.
    writer.check(&["SET", "k0", "again"]);
    reader.sync();
    // The reader's own write: the reply, then the invalidation.
    reader.check(&["GET", "k0"]);
    reader.frames(&["SET", "k0", "self"]);
    // NOLOOP: no invalidation for its own writes, still for others'.
    reader.check(&["CLIENT", "TRACKING", "on", "NOLOOP"]);
    reader.check(&["CLIENT", "TRACKINGINFO"]);
    reader.check(&["GET", "k0"]);
    reader.check(&["GET", "k1"]);
    reader.frames(&["SET", "k0", "mine"]);
    writer.check(&["SET", "k1", "theirs"]);
    reader.sync();
    // Expiry (lazy or active, whichever comes first) invalidates.
    writer.check(&["SET", "e1", "v", "PX", "60"]);
    reader.check(&["GET", "e1"]);
    std::thread::sleep(Duration::from_millis(150));
    writer.check(&["EXISTS", "e1"]);
    reader.sync();
    // Active expiry (no client touches the key) invalidates as well.
    writer.check(&["SET", "e2", "v", "PX", "50"]);
    reader.check(&["GET", "e2"]);
    let size = |c: &mut RespConn| c.call(&[b"DBSIZE"]);
    let before = (size(&mut writer.l), size(&mut writer.r));
    let start = Instant::now();
    while size(&mut writer.l) == before.0 || size(&mut writer.r) == before.1 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "e2 never expired"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.sync();
    // Keys read inside MULTI/EXEC and by a script are tracked too.
    reader.check(&["MULTI"]);
    reader.check(&["GET", "k2"]);
    reader.check(&["EXEC"]);
    reader.check(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "k3"]);
    writer.check(&["SET", "k2", "1"]);
    writer.check(&["SET", "k3", "1"]);
    reader.sync();
    // FLUSHALL: a null invalidation.
    reader.check(&["GET", "k4"]);
    writer.check(&["FLUSHALL"]);
    reader.sync();
    reader.check(&["CLIENT", "TRACKING", "off"]);
    reader.check(&["CLIENT", "TRACKINGINFO"]);
    reader.check(&["CLIENT", "GETREDIR"]);
}

// OPTIN tracks only the command after CLIENT CACHING yes; OPTOUT tracks all but the one
// after CLIENT CACHING no; TRACKINGINFO shows the caching flag while it holds.
fn optin_optout(p: &Pair) {
    let mut c = Duo::new(p, "optin", 3);
    let mut writer = Duo::new(p, "writer2", 2);
    c.check(&["CLIENT", "TRACKING", "on", "OPTIN"]);
    c.check(&["GET", "k0"]);
    c.check(&["CLIENT", "CACHING", "yes"]);
    c.check(&["CLIENT", "TRACKINGINFO"]);
    c.check(&["GET", "k1"]);
    c.check(&["GET", "k2"]);
    c.check(&["CLIENT", "TRACKINGINFO"]);
    c.check(&["CLIENT", "CACHING", "no"]);
    c.check(&["CLIENT", "TRACKING", "on", "OPTOUT"]);
    for k in ["k0", "k1", "k2"] {
        writer.check(&["SET", k, "x"]);
    }
    c.sync();
    c.check(&["CLIENT", "TRACKING", "off"]);
    c.check(&["CLIENT", "CACHING", "yes"]);
    c.check(&["CLIENT", "TRACKING", "on", "OPTOUT"]);
    c.check(&["CLIENT", "CACHING", "yes"]);
    c.check(&["CLIENT", "CACHING", "no"]);
    c.check(&["CLIENT", "TRACKINGINFO"]);
    c.check(&["GET", "k3"]);
    c.check(&["GET", "k4"]);
    for k in ["k3", "k4"] {
        writer.check(&["SET", k, "x"]);
    }
    c.sync();
    c.check(&["CLIENT", "CACHING", "maybe"]);
    c.check(&["CLIENT", "TRACKING", "off"]);
}

// BCAST in RESP3: every write under a prefix is announced (sorted, deduplicated, one
// message per prefix per batch) whether or not it was read; NOLOOP drops own writes.
fn bcast_prefixes_resp3(p: &Pair) {
    let mut b = Duo::new(p, "bcast", 3);
    let mut all = Duo::new(p, "bcast-all", 3);
    let mut writer = Duo::new(p, "writer3", 2);
    b.check(&[
        "CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "a", "PREFIX", "b",
    ]);
    b.check(&["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "c", "NOLOOP"]);
    b.check(&["CLIENT", "TRACKINGINFO"]);
    b.info_field("flags");
    all.check(&["CLIENT", "TRACKING", "on", "BCAST"]);
    writer.check(&["SET", "a1", "1"]);
    b.sync();
    all.sync();
    writer.check(&["MSET", "b2", "1", "b1", "2", "zz", "3", "a9", "4"]);
    b.sync();
    all.sync();
    writer.check(&["DEL", "a1", "b1", "nothing"]);
    b.sync();
    all.sync();
    // The NOLOOP client's own write under its prefix: nothing for it, the others hear.
    b.frames(&["SET", "c1", "own"]);
    all.sync();
    writer.check(&["SET", "c2", "theirs"]);
    b.sync();
    all.sync();
    b.check(&["CLIENT", "TRACKING", "off"]);
    all.check(&["CLIENT", "TRACKING", "off"]);
}

// RESP2 with REDIRECT: invalidations arrive as messages on `__redis__:invalidate` at the
// subscribed redirect client (FLUSHALL as a null); the tracking client itself hears
// nothing; GETREDIR, TRACKINGINFO and CLIENT INFO show the redirect.
fn redirect_resp2(p: &mut Pair) {
    let mut sink = Duo::new(p, "sink", 2);
    let mut t = Duo::new(p, "tracker", 2);
    let mut writer = Duo::new(p, "writer4", 2);
    let (ls, rs) = sink.ids();
    sink.check(&["SUBSCRIBE", "__redis__:invalidate"]);
    let on = |id: &str| bytes(&["CLIENT", "TRACKING", "on", "REDIRECT", id]);
    t.check2(&on(&ls), &on(&rs));
    t.info_field("flags");
    let redir = |c: &mut RespConn, id: &str| {
        let rep = c.call(&[b"CLIENT", b"GETREDIR"]);
        assert_eq!(rep, format!(":{id}\r\n").into_bytes());
    };
    redir(&mut t.l, &ls);
    redir(&mut t.r, &rs);
    t.check_naming(&["CLIENT", "TRACKINGINFO"], &(ls.clone(), rs.clone()));
    for (c, id) in [(&mut t.l, &ls), (&mut t.r, &rs)] {
        let info = String::from_utf8_lossy(&c.call(&[b"CLIENT", b"INFO"])).into_owned();
        assert!(info.contains(&format!(" redir={id} ")), "{info}");
    }
    for k in KEYS {
        t.check(&["GET", k]);
    }
    check_info(p);
    for k in KEYS {
        writer.check(&["SET", k, "r"]);
    }
    sink.sync();
    t.sync();
    t.check(&["GET", "k0"]);
    writer.check(&["FLUSHALL"]);
    sink.sync();
    // BCAST redirected as well.
    let on_bcast = |id: &str| {
        bytes(&[
            "CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST", "PREFIX", "k",
        ])
    };
    t.check(&["CLIENT", "TRACKING", "off"]);
    t.check2(&on_bcast(&ls), &on_bcast(&rs));
    writer.check(&["MSET", "k1", "1", "k2", "2", "x", "3"]);
    sink.sync();
    // A RESP3 redirect target needs no subscription: it gets pushes.
    let mut sink3 = Duo::new(p, "sink3", 3);
    let (l3, r3) = sink3.ids();
    t.check(&["CLIENT", "TRACKING", "off"]);
    t.check2(&on(&l3), &on(&r3));
    t.check(&["GET", "k3"]);
    writer.check(&["SET", "k3", "y"]);
    sink3.sync();
    sink.sync();
    // Without REDIRECT a RESP2 client hears nothing at all.
    t.check(&["CLIENT", "TRACKING", "off"]);
    t.check(&["CLIENT", "TRACKING", "on"]);
    t.check(&["GET", "k1"]);
    writer.check(&["SET", "k1", "z"]);
    t.sync();
    sink.sync();
    t.check(&["CLIENT", "TRACKING", "off"]);
}

// Every option error of CLIENT TRACKING / CACHING / GETREDIR / TRACKINGINFO, with Redis's
// texts and precedence.
fn option_errors(p: &Pair) {
    let mut c = Duo::new(p, "errors", 3);
    let cases: &[&[&str]] = &[
        &["CLIENT", "TRACKING"],
        &["CLIENT", "TRACKING", "maybe"],
        &["CLIENT", "TRACKING", "on", "BCAST", "foo"],
        &["CLIENT", "TRACKING", "on", "REDIRECT"],
        &["CLIENT", "TRACKING", "on", "REDIRECT", "x"],
        &["CLIENT", "TRACKING", "on", "REDIRECT", "99999"],
        &["CLIENT", "TRACKING", "on", "REDIRECT", "0"],
        &["CLIENT", "TRACKING", "on", "PREFIX", "a"],
        &["CLIENT", "TRACKING", "on", "BCAST", "OPTIN"],
        &["CLIENT", "TRACKING", "on", "BCAST", "OPTOUT"],
        &["CLIENT", "TRACKING", "on", "OPTIN", "OPTOUT"],
        &[
            "CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "a", "PREFIX", "ab",
        ],
        &[
            "CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "ab", "PREFIX", "a",
        ],
        &["CLIENT", "CACHING", "yes"],
        &["CLIENT", "CACHING"],
        &["CLIENT", "GETREDIR", "x"],
        &["CLIENT", "TRACKINGINFO", "x"],
        &["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "a"],
        &["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "a"],
        &["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "abc"],
        &[
            "CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "b", "PREFIX", "c",
        ],
        &["CLIENT", "TRACKING", "on"],
        &["CLIENT", "TRACKING", "on", "PREFIX", "d"],
        &["CLIENT", "TRACKING", "on", "BCAST", "OPTIN"],
        &["CLIENT", "CACHING", "yes"],
        &["CLIENT", "TRACKINGINFO"],
        &["CLIENT", "TRACKING", "off"],
        &["CLIENT", "TRACKING", "on", "OPTIN"],
        &["CLIENT", "TRACKING", "on", "OPTOUT"],
        &["CLIENT", "TRACKING", "on", "BCAST"],
        &["CLIENT", "CACHING", "no"],
        &["CLIENT", "TRACKING", "off"],
        &["CLIENT", "TRACKING", "off"],
    ];
    for args in cases {
        c.check(args);
    }
    let (l, r) = c.ids();
    let twice = |id: &str| bytes(&["CLIENT", "TRACKING", "on", "REDIRECT", id, "REDIRECT", id]);
    c.check2(&twice(&l), &twice(&r));
    // RESET turns tracking off (and the connection back to RESP2).
    c.check(&["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "q"]);
    c.check(&["RESET"]);
    c.check(&["CLIENT", "TRACKINGINFO"]);
}

// A redirect client that goes away: the RESP3 tracking client gets `tracking-redir-broken`
// when an invalidation is due, and TRACKINGINFO says `broken_redirect`.
fn broken_redirect(p: &mut Pair) {
    let before = connected(&mut p.l);
    let mut t = Duo::new(p, "orphan", 3);
    let mut gone = Duo::new(p, "gone", 2);
    let mut writer = Duo::new(p, "writer5", 2);
    let (lg, rg) = gone.ids();
    let on = |id: &str| bytes(&["CLIENT", "TRACKING", "on", "REDIRECT", id]);
    t.check2(&on(&lg), &on(&rg));
    t.check(&["GET", "k5"]);
    drop(gone);
    wait_connected(p, before + 2);
    writer.check(&["SET", "k5", "1"]);
    // The push names the lost client's id, which differs between the servers.
    let expect = |id: &str| format!(">2\r\n$21\r\ntracking-redir-broken\r\n:{id}\r\n");
    for (c, id) in [(&mut t.l, &lg), (&mut t.r, &rg)] {
        c.send(&[b"PING"]);
        assert_eq!(String::from_utf8_lossy(&c.reply()), expect(id));
        assert_eq!(c.reply(), b"+PONG\r\n");
    }
    t.info_field("flags");
    let lost = (lg, rg);
    t.check_naming(&["CLIENT", "TRACKINGINFO"], &lost);
    t.check_naming(&["CLIENT", "GETREDIR"], &lost);
    t.check(&["CLIENT", "TRACKING", "off"]);
}

// `tracking-table-max-keys`: CONFIG GET/SET and its errors as Redis; a smaller table
// invalidates keys beyond it (which ones differs: Redis evicts random keys).
fn config_max_keys(p: &mut Pair) {
    p.check(&["CONFIG", "GET", "tracking-table-max-keys"]);
    p.check(&["CONFIG", "SET", "tracking-table-max-keys", "-1"]);
    p.check(&["CONFIG", "SET", "tracking-table-max-keys", "x"]);
    p.check(&["CONFIG", "SET", "tracking-table-max-keys", "2"]);
    p.check(&["CONFIG", "GET", "tracking-table-max-keys"]);
    let mut c = RespConn::connect(p.lavik.port);
    assert!(c.call(&[b"HELLO", b"3"]).starts_with(b"%"));
    assert_eq!(c.call(&[b"CLIENT", b"TRACKING", b"on"]), b"+OK\r\n");
    // Six reads, pipelined: each one beyond the second evicts a key with its invalidation.
    for k in KEYS {
        c.send(&[b"GET", k.as_bytes()]);
    }
    c.send(&[b"PING"]);
    let (mut replies, mut pushes) = (0, 0);
    loop {
        let f = c.reply();
        if is_ping_reply(&f) {
            break;
        }
        if f.starts_with(b">2\r\n$10\r\ninvalidate\r\n") {
            pushes += 1;
        } else {
            replies += 1;
        }
    }
    assert_eq!((replies, pushes), (KEYS.len(), KEYS.len() - 2));
    let keys = info_value(&mut p.l, "stats", "tracking_total_keys");
    assert_eq!(keys, "2");
    p.check(&["CONFIG", "SET", "tracking-table-max-keys", "1000000"]);
}
