//! Differential tests of Redis functions (FUNCTION ..., FCALL, FCALL_RO) against Debian's
//! `redis-server`, in RESP2 and RESP3, plus the busy-script threshold (-BUSY, SCRIPT KILL,
//! FUNCTION KILL) on both servers.
//!
//! Order: Redis lists libraries and their functions in its dictionaries' order (random per
//! process); lavik lists them by library name and registration order. FUNCTION LIST
//! replies with more than one element are compared after `canonical`, which sorts every
//! aggregate's elements; single-library DUMPs are compared byte for byte.
//!
//! 7.0 vs 7.2 (lavik follows 7.2): a RESTORE payload with a bad checksum reads "DUMP
//! payload version or checksum are wrong" in 7.2 ("payload version ..." in 7.0), see
//! `restore_checksum_text_as_7_2`.
mod common;
use common::diff::{Pair, RespConn};
use std::time::Duration;

/// Library codes loaded on both servers in order; each reply (name or error) must match.
const LIBRARIES: &[&str] = &[
    // Valid libraries: positional and table forms, every flag, descriptions.
    "#!lua name=lib1\nredis.register_function('f1', function(keys, args) return #keys + #args end)",
    "#!lua name=lib2\nredis.register_function{function_name='f2', callback=function(keys, args) return redis.call('get', keys[1]) end, flags={'no-writes'}, description='reads a key'}",
    "#!lua name=lib3\nredis.register_function('setter', function(keys, args) return redis.call('set', keys[1], args[1]) end)\nredis.register_function{function_name='ro_setter', callback=function(keys, args) return redis.call('set', keys[1], 'x') end, flags={'no-writes'}}",
    "#!lua name=lib4\nredis.register_function{function_name='allflags', callback=function() return 'ok' end, flags={'no-writes', 'ALLOW-OOM', 'allow-stale', 'no-cluster', 'allow-cross-slot-keys'}, description=42}",
    "#!lua name=lib5\nlocal function helper(x) return x * 2 end\nredis.register_function('boom', function(keys, args) error('boom') end)\nredis.register_function('errt', function(keys, args) return redis.error_reply('MY custom') end)\nredis.register_function('double', function(keys, args) return helper(tonumber(args[1])) end)\nredis.register_function('pc', function(keys, args) return redis.pcall('incr', keys[1]) end)\nredis.register_function('rf', function() return redis.register_function('x', function() end) end)\nredis.register_function('glob', function() return string.rep('ab', 3) .. tostring(redis.REDIS_VERSION ~= nil) end)\nredis.register_function('setg', function() x = 1 end)\nredis.register_function('resp3', function(keys) redis.setresp(3) redis.call('hset', keys[1], 'f', 'v') return redis.call('hgetall', keys[1]) end)\nredis.register_function('tbl', function(keys, args) return {keys[1], args[1], {1, 2}, {ok='fine'}} end)\nredis.register_function('two', function(keys, args) redis.call('set', keys[1], args[1]) redis.call('set', keys[2], args[2]) return redis.call('mget', keys[1], keys[2], keys[3]) end)",
    "#!LUA name=Mixed_Case_9\nredis.register_function('MiXeD', function() return 'mixed' end)",
    "#!lua   name=spaced  \nredis.register_function('spaced', function() return 1 end)",
    "#!lua name=withlog\nredis.log(redis.LOG_WARNING, 'loading withlog')\nredis.register_function('logged', function() return redis.LOG_NOTICE end)",
    // Load errors: metadata.
    "no shebang",
    "#!lua name=noline",
    "#!lua\nreturn",
    "#!lua foo=bar\n",
    "#!js name=x\n",
    "#!lua name=a-b\n",
    "#!lua name=\n",
    "#!lua name=a name=b\n",
    // Load errors: existing names, empty libraries, compile and run errors.
    "#!lua name=lib1\nredis.register_function('other', function() end)",
    "#!lua name=fresh\nredis.register_function('f1', function() end)",
    "#!lua name=fresh\nredis.register_function('F1', function() end)",
    "#!lua name=fresh\nreturn",
    "#!lua name=fresh\nthis is not lua",
    "#!lua name=fresh\nredis.call('ping')",
    "#!lua name=fresh\nlocal s = string.len('x')",
    "#!lua name=fresh\nglobalvar = 1",
    "#!lua name=fresh\nerror('raised')",
    "#!lua name=fresh\nlocal x = nil + 1",
    "#!lua name=fresh\nredis.register_function('f', function() end) return redis.setresp",
    "#!lua name=fresh\nlocal i = 0 while true do i = i + 1 end",
    // Load errors: register_function's arguments.
    "#!lua name=fresh\nredis.register_function()",
    "#!lua name=fresh\nredis.register_function('a')",
    "#!lua name=fresh\nredis.register_function('a', function() end, 3)",
    "#!lua name=fresh\nredis.register_function({}, function() end)",
    "#!lua name=fresh\nredis.register_function('a', 1)",
    "#!lua name=fresh\nredis.register_function('a-b', function() end)",
    "#!lua name=fresh\nredis.register_function(1.5, function() end)",
    "#!lua name=fresh\nredis.register_function('a', function() end) redis.register_function('a', function() end)",
    "#!lua name=fresh\nredis.register_function({})",
    "#!lua name=fresh\nredis.register_function({function_name='a'})",
    "#!lua name=fresh\nredis.register_function({callback=function() end})",
    "#!lua name=fresh\nredis.register_function({function_name='a', callback=function() end, flags={'bad'}})",
    "#!lua name=fresh\nredis.register_function({function_name='a', callback=function() end, flags='x'})",
    "#!lua name=fresh\nredis.register_function({function_name='a', callback=function() end, foo=1})",
    "#!lua name=fresh\nredis.register_function({function_name='a', callback=1})",
    "#!lua name=fresh\nredis.register_function({function_name={}, callback=function() end})",
    "#!lua name=fresh\nredis.register_function({function_name='a', description={}, callback=function() end})",
];

/// FCALL / FCALL_RO calls run on both servers after the libraries loaded.
const CALLS: &[&[&str]] = &[
    &["FCALL", "f1", "0"],
    &["FCALL", "f1", "2", "ka", "kb", "a1"],
    &["FCALL", "F1", "0"],
    &["FCALL", "mixed", "0"],
    &["FCALL", "nope", "0"],
    &["FCALL", "nope", "x"],
    &["FCALL", "f1", "x"],
    &["FCALL", "f1", "3", "a"],
    &["FCALL", "f1", "-1"],
    &["FCALL", "setter", "1", "ka", "v1"],
    &["FCALL", "f2", "1", "ka"],
    &["FCALL_RO", "f2", "1", "ka"],
    &["FCALL_RO", "setter", "1", "ka", "v2"],
    &["FCALL", "ro_setter", "1", "ka"],
    &["FCALL", "allflags", "0"],
    &["FCALL", "boom", "0"],
    &["FCALL", "errt", "0"],
    &["FCALL", "double", "0", "21"],
    &["FCALL", "pc", "1", "ka"],
    &["FCALL", "rf", "0"],
    &["FCALL", "glob", "0"],
    &["FCALL", "setg", "0"],
    &["FCALL", "resp3", "1", "hk"],
    &["FCALL", "tbl", "1", "kk", "aa"],
    &["FCALL", "logged", "0"],
    // Keys on both of lavik's workers (no hash tags): the shards are gathered as for EVAL.
    &["FCALL", "two", "3", "k1", "k2", "k3", "v1", "v2"],
    &["FCALL", "two", "3", "user:1", "user:2", "other", "x", "y"],
    &["MGET", "k1", "k2", "user:1", "user:2"],
    &["FCALL", "spaced", "0"],
    &["GET", "ka"],
];

/// FUNCTION subcommands whose replies do not depend on library order.
const ADMIN: &[&[&str]] = &[
    &["FUNCTION", "LIST", "LIBRARYNAME", "lib1"],
    &["FUNCTION", "LIST", "LIBRARYNAME", "lib2", "WITHCODE"],
    &["FUNCTION", "LIST", "WITHCODE", "LIBRARYNAME", "LIB4"],
    &["FUNCTION", "LIST", "LIBRARYNAME", "nomatch*"],
    &["FUNCTION", "LIST", "LIBRARYNAME"],
    &["FUNCTION", "LIST", "bogus"],
    &["FUNCTION", "LIST", "WITHCODE", "WITHCODE"],
    &["FUNCTION", "STATS"],
    &["FUNCTION", "HELP"],
    &["FUNCTION", "BOGUS"],
    &["FUNCTION"],
    &["FUNCTION", "DELETE"],
    &["FUNCTION", "DELETE", "nolib"],
    &["FUNCTION", "DELETE", "LIB1"],
    &["FUNCTION", "LOAD"],
    &["FUNCTION", "LOAD", "BADOPT", "#!lua name=q\n"],
    &["FUNCTION", "FLUSH", "bogus"],
    &["FUNCTION", "FLUSH", "SYNC", "x"],
    &["FUNCTION", "RESTORE", "x", "BADPOLICY"],
    &["FUNCTION", "RESTORE", "x", "APPEND", "extra"],
    &["FUNCTION", "KILL"],
    &["FUNCTION", "KILL", "x"],
    &["FUNCTION", "STATS", "x"],
    &["FUNCTION", "DUMP", "x"],
    &["SCRIPT", "KILL"],
    &["FCALL"],
    &["FCALL_RO", "f1"],
];

/// A parsed RESP reply.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Leaf(Vec<u8>),
    Agg(u8, Vec<Node>),
}

fn parse(b: &[u8], at: &mut usize) -> Node {
    let line_end = *at + b[*at..].windows(2).position(|w| w == b"\r\n").unwrap();
    let kind = b[*at];
    let head = &b[*at + 1..line_end];
    let n: i64 = std::str::from_utf8(head).unwrap().parse().unwrap_or(-1);
    match kind {
        b'$' | b'=' | b'!' if n >= 0 => {
            let start = *at;
            *at = line_end + 2 + n as usize + 2;
            Node::Leaf(b[start..*at].to_vec())
        }
        b'*' | b'~' | b'%' | b'>' if n >= 0 => {
            *at = line_end + 2;
            let count = if kind == b'%' { 2 * n } else { n };
            let mut items = Vec::new();
            for _ in 0..count {
                items.push(parse(b, at));
            }
            if kind == b'%' {
                // Map entries stay pairs; the map's pairs are sorted below.
                let pairs = items
                    .chunks(2)
                    .map(|p| Node::Agg(b'p', p.to_vec()))
                    .collect();
                return Node::Agg(kind, pairs);
            }
            Node::Agg(kind, items)
        }
        _ => {
            let start = *at;
            *at = line_end + 2;
            Node::Leaf(b[start..*at].to_vec())
        }
    }
}

fn sort_tree(n: &mut Node) {
    if let Node::Agg(kind, items) = n {
        for i in items.iter_mut() {
            sort_tree(i);
        }
        // RESP2 maps are flat arrays of key/value pairs: keep the pairs together.
        if *kind != b'p' {
            items.sort();
        }
    }
}

/// A reply with every aggregate's elements sorted (for replies in dictionary order).
fn canonical(reply: &[u8]) -> Vec<u8> {
    let mut at = 0;
    let mut tree = parse(reply, &mut at);
    sort_tree(&mut tree);
    format!("{tree:?}").into_bytes()
}

fn bulk_body(reply: &[u8]) -> Vec<u8> {
    assert_eq!(
        reply[0],
        b'$',
        "not a bulk: {:?}",
        String::from_utf8_lossy(reply)
    );
    let nl = reply.windows(2).position(|w| w == b"\r\n").unwrap();
    reply[nl + 2..reply.len() - 2].to_vec()
}

fn run_corpus(p: &mut Pair) {
    p.check(&["FUNCTION", "FLUSH"]);
    p.check(&["FLUSHALL"]);
    for code in LIBRARIES {
        p.check(&["FUNCTION", "LOAD", code]);
    }
    p.check(&["FUNCTION", "LOAD", "REPLACE", LIBRARIES[0]]);
    p.check(&["FUNCTION", "LOAD", "replace", "REPLACE", LIBRARIES[0]]);
    for call in CALLS {
        p.check(call);
    }
    for cmd in ADMIN {
        p.check(cmd);
    }
    p.check_with(&["ACL", "CAT", "scripting"], canonical);
    p.check_with(&["FUNCTION", "LIST"], canonical);
    p.check_with(&["FUNCTION", "LIST", "WITHCODE"], canonical);
    p.check_with(&["FUNCTION", "LIST", "LIBRARYNAME", "LIB*"], canonical);
    // FLUSHALL leaves the libraries; FUNCTION FLUSH removes them.
    p.check(&["FLUSHALL"]);
    p.check(&["FCALL", "f1", "0"]);
    p.check(&["FUNCTION", "DELETE", "lib1"]);
    p.check(&["FCALL", "f1", "0"]);
    p.check(&["FUNCTION", "DELETE", "lib1"]);
    p.check(&["FUNCTION", "FLUSH", "ASYNC"]);
    p.check(&["FUNCTION", "LIST"]);
    p.check(&["FUNCTION", "STATS"]);
    p.check(&["FCALL", "f2", "1", "ka"]);
}

// Every library, call, error and admin reply of the corpus matches Redis in RESP2 and RESP3.
#[test]
fn corpus_matches_redis() {
    let mut p = Pair::start("diff-func", &["--threads", "2"]);
    run_corpus(&mut p);
    p.hello(3);
    run_corpus(&mut p);
}

/// Library codes for the DUMP/RESTORE round trips (long enough to be LZF-compressed).
const DUMP_LIBS: &[&str] = &[
    "#!lua name=dl1\nredis.register_function('d1', function(keys, args) return 'one one one one one one one one' end)",
    "#!lua name=dl2\nredis.register_function('d2', function() return 2 end)",
    "#!lua name=dl3\nredis.register_function('d1', function() return 3 end)",
];

// DUMP payloads cross both ways (Redis's RESTOREs into lavik and back), with every
// policy and the collision errors, and single-library DUMPs are byte-identical.
#[test]
fn dump_restore_cross() {
    let mut p = Pair::start("diff-func-dump", &["--threads", "2"]);
    for proto in [2, 3] {
        if proto == 3 {
            p.hello(3);
        }
        p.check(&["FUNCTION", "FLUSH"]);
        let empty = p.check(&["FUNCTION", "DUMP"]);
        p.check(&["FUNCTION", "LOAD", DUMP_LIBS[0]]);
        let one = bulk_body(&p.check(&["FUNCTION", "DUMP"]));
        p.check(&["FUNCTION", "LOAD", DUMP_LIBS[1]]);
        let (lavik_two, redis_two) = p.both(&[b"FUNCTION", b"DUMP"]);
        let (lavik_two, redis_two) = (bulk_body(&lavik_two), bulk_body(&redis_two));
        assert_eq!(lavik_two.len(), redis_two.len());
        // Each server restores the other's payload, under each policy.
        for (payload, label) in [(&redis_two, "redis"), (&lavik_two, "lavik")] {
            // Which of two colliding libraries an error names follows dictionary order:
            // the digit is masked.
            let c = |p: &mut Pair, args: &[&[u8]]| {
                let (l, r) = p.both(args);
                let mask = |b: &[u8]| String::from_utf8_lossy(b).replace(['1', '2'], "?");
                assert_eq!(
                    mask(&l),
                    mask(&r),
                    "{label} payload: {:?}",
                    String::from_utf8_lossy(args[2])
                );
            };
            c(&mut p, &[b"FUNCTION", b"RESTORE", payload]);
            c(&mut p, &[b"FUNCTION", b"RESTORE", payload, b"APPEND"]);
            c(&mut p, &[b"FUNCTION", b"RESTORE", payload, b"replace"]);
            c(&mut p, &[b"FUNCTION", b"FLUSH"]);
            c(&mut p, &[b"FUNCTION", b"RESTORE", payload]);
            p.check_with(&["FUNCTION", "LIST", "WITHCODE"], canonical);
            p.check(&["FCALL", "d1", "0"]);
            p.check(&["FCALL", "d2", "0"]);
            // A library whose function name another library holds.
            p.check(&["FUNCTION", "DELETE", "dl1"]);
            p.check(&["FUNCTION", "LOAD", DUMP_LIBS[2]]);
            c(&mut p, &[b"FUNCTION", b"RESTORE", payload, b"REPLACE"]);
            c(&mut p, &[b"FUNCTION", b"RESTORE", payload, b"FLUSH"]);
            p.check_with(&["FUNCTION", "LIST"], canonical);
        }
        p.check(&["FUNCTION", "FLUSH"]);
        p.check_bytes(&[b"FUNCTION", b"RESTORE", &one]);
        p.check(&["FUNCTION", "DUMP"]);
        p.check_bytes(&[
            b"FUNCTION",
            b"RESTORE",
            bulk_body(&empty).as_slice(),
            b"FLUSH",
        ]);
        p.check(&["FUNCTION", "LIST"]);
        // Payloads that pass the checksum but hold no function, or a truncated one.
        let mut not_function = vec![0u8, 1, b'x'];
        footer(&mut not_function);
        p.check_bytes(&[b"FUNCTION", b"RESTORE", &not_function]);
        let mut bad_lib = vec![245u8, 5];
        bad_lib.extend_from_slice(b"#!lua");
        footer(&mut bad_lib);
        p.check_bytes(&[b"FUNCTION", b"RESTORE", &bad_lib]);
    }
}

/// Appends RDB version 10 and the CRC-64 Redis checks.
fn footer(b: &mut Vec<u8>) {
    b.extend_from_slice(&10u16.to_le_bytes());
    let crc = lavik::rdb::crc64::crc64(0, b);
    b.extend_from_slice(&crc.to_le_bytes());
}

// lavik gives 7.2's text for a payload whose checksum fails (7.0.15 lacks "DUMP ").
#[test]
fn restore_checksum_text_as_7_2() {
    let s = common::Server::start("func-crc", &[]);
    let mut c = RespConn::connect(s.port);
    let rep = c.call(&[b"FUNCTION", b"RESTORE", b"garbage-payload"]);
    assert_eq!(rep, b"-ERR DUMP payload version or checksum are wrong\r\n");
}

/// Sends `args` and returns the reply, or `None` if none came within `wait`.
fn try_call(c: &mut RespConn, args: &[&[u8]], wait: Duration) -> Option<Vec<u8>> {
    c.send(args);
    c.set_timeout(wait);
    let out = c.try_reply();
    c.set_timeout(Duration::from_secs(30));
    out
}

/// Opens connections to `port` until one answers `args` within 300 ms with a reply
/// `done` accepts (retrying on that connection while it answers something else, e.g.
/// +PONG before the script has run past busy-reply-threshold, or -NOTBUSY before it
/// started). Connections that answered nothing yet are pushed to `stuck` (on lavik: on the
/// runner's worker; their reply comes after the kill). Which worker the kernel gives a new
/// connection is its hash's choice, so connections are opened until one lands elsewhere.
fn answering_conn(
    port: u16,
    args: &[&[u8]],
    done: impl Fn(&[u8]) -> bool,
    stuck: &mut Vec<RespConn>,
) -> (RespConn, Vec<u8>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "{port}: no connection answered {:?} as expected",
            String::from_utf8_lossy(args[0])
        );
        let mut c = RespConn::connect(port);
        // Retry on this connection while it answers, but not done yet (a connection on
        // lavik's runner worker answers until the script starts there, then goes quiet).
        while let Some(rep) = try_call(&mut c, args, Duration::from_millis(300)) {
            if done(&rep) {
                return (c, rep);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{port}: {:?} kept answering {}",
                String::from_utf8_lossy(args[0]),
                String::from_utf8_lossy(&rep)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        stuck.push(c);
    }
}

/// Runs the busy scenario on one server: a looping script on `runner`, then -BUSY for
/// others once `busy-reply-threshold` passed, the wrong kill command's reply, FUNCTION
/// STATS, the right kill, and the killed script's error. Returns the replies in order.
fn busy_scenario(port: u16, runner_cmd: &[&[u8]], wrong_kill: &[u8], kill: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut admin = RespConn::connect(port);
    out.push(admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"200"]));
    out.push(admin.call(&[b"CONFIG", b"GET", b"lua-time-limit"]));
    let mut runner = RespConn::connect(port);
    runner.send(runner_cmd);
    // The first -BUSY an answering connection gets (the script loops until killed, so
    // waiting for it is waiting for a condition, not a race).
    let mut stuck = Vec::new();
    let (mut c, busy) = answering_conn(port, &[b"PING"], |r| r.starts_with(b"-BUSY"), &mut stuck);
    out.push(busy);
    out.push(c.call(&[b"GET", b"somekey"]));
    out.push(c.call(&[b"HELLO", b"2"]).iter().take(4).copied().collect());
    out.push(c.call(&[wrong_kill, b"KILL"]));
    let stats = c.call(&[b"FUNCTION", b"STATS"]);
    out.push(stats.iter().take(60).copied().collect());
    out.push(c.call(&[kill, b"KILL"]));
    out.push(runner.reply());
    for mut s in stuck {
        out.push(s.reply());
    }
    out.push(c.call(&[b"PING"]));
    out.push(admin.call(&[b"CONFIG", b"SET", b"lua-time-limit", b"5000"]));
    out.push(admin.call(&[b"CONFIG", b"GET", b"busy-reply-threshold"]));
    out
}

fn show(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|x| String::from_utf8_lossy(x).into_owned())
        .collect()
}

// A script or function running past busy-reply-threshold makes other connections get
// Redis's -BUSY texts; SCRIPT KILL / FUNCTION KILL stop it with Redis's replies.
#[test]
fn busy_threshold_and_kill() {
    let p = Pair::start("diff-func-busy", &["--threads", "2"]);
    let (lport, rport) = (p.lavik.port, p.redis.port);
    let eval: &[&[u8]] = &[b"EVAL", b"local i = 0 while true do i = i + 1 end", b"0"];
    let l = busy_scenario(lport, eval, b"FUNCTION", b"SCRIPT");
    let r = busy_scenario(rport, eval, b"FUNCTION", b"SCRIPT");
    // Connections on lavik's busy worker get their reply after the kill; Redis has none
    // such, so compare up to the killed script's reply and the last three.
    assert_eq!(show(&l[..9]), show(&r[..9]));
    assert_eq!(show(&l[l.len() - 3..]), show(&r[r.len() - 3..]));
    let lib = "#!lua name=busy\nredis.register_function('spin', function()\n local i = 0 while true do i = i + 1 end end)";
    for port in [lport, rport] {
        let mut c = RespConn::connect(port);
        c.call(&[b"FUNCTION", b"LOAD", b"REPLACE", lib.as_bytes()]);
    }
    let fcall: &[&[u8]] = &[b"FCALL", b"spin", b"0"];
    let l = busy_scenario(lport, fcall, b"SCRIPT", b"FUNCTION");
    let r = busy_scenario(rport, fcall, b"SCRIPT", b"FUNCTION");
    assert_eq!(show(&l[..9]), show(&r[..9]));
    assert_eq!(show(&l[l.len() - 3..]), show(&r[r.len() - 3..]));
}

// A script that wrote cannot be killed: both servers reply UNKILLABLE while it runs. The
// script loops far longer than the test (a bounded loop finished within the 300 ms wait on
// a fast release build): each server is left running it and SIGKILLed when the pair drops.
#[test]
fn unkillable_after_write() {
    let p = Pair::start("diff-func-unkill", &["--threads", "2"]);
    for port in [p.lavik.port, p.redis.port] {
        let mut admin = RespConn::connect(port);
        admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"100"]);
        let mut runner = RespConn::connect(port);
        runner.send(&[
            b"EVAL",
            b"redis.call('set', KEYS[1], 'x') local i = 0 while i < 1e12 do i = i + 1 end return i",
            b"1",
            b"wk",
        ]);
        // Until the script has started, SCRIPT KILL answers -NOTBUSY: retry past that.
        let mut stuck = Vec::new();
        let (_, rep) = answering_conn(
            port,
            &[b"SCRIPT", b"KILL"],
            |r| !r.starts_with(b"-NOTBUSY"),
            &mut stuck,
        );
        assert!(
            rep.starts_with(b"-UNKILLABLE Sorry the script already executed write commands"),
            "{port}: {}",
            String::from_utf8_lossy(&rep)
        );
        drop(runner);
    }
}
