//! Differential tests of MULTI / EXEC / DISCARD / WATCH / UNWATCH against Debian's
//! `redis-server`, replies compared byte for byte in RESP2 and RESP3. lavik runs 2 workers
//! and the keys carry no hash tags, so transactions and watches span both workers. WATCH
//! races are driven by a second client on each server in a fixed interleaving.
//!
//! Plus a cross-worker invariant test against lavik alone: clients move amounts between
//! keys on both workers with WATCH + MULTI/EXEC and with EVAL while a reader's MULTI/EXEC
//! of MGET over every key must always see the same total.
mod common;
use common::diff::{Pair, RespConn};
use common::Server;
use std::time::{Duration, Instant};

/// The second client on each server.
struct Other {
    l: RespConn,
    r: RespConn,
}

impl Other {
    fn connect(p: &Pair) -> Other {
        Other {
            l: RespConn::connect(p.lavik.port),
            r: RespConn::connect(p.redis.port),
        }
    }

    /// Sends `args` on both second connections; panics unless the replies match.
    fn check(&mut self, args: &[&str]) -> Vec<u8> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let (l, r) = (self.l.call(&a), self.r.call(&a));
        assert_eq!(
            String::from_utf8_lossy(&l),
            String::from_utf8_lossy(&r),
            "second client: {args:?}"
        );
        l
    }

    fn hello(&mut self, proto: &str) {
        for c in [&mut self.l, &mut self.r] {
            let rep = c.call(&[b"HELLO", proto.as_bytes()]);
            assert!(!rep.starts_with(b"-"));
        }
    }
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// Queued replies, nesting, EXEC/DISCARD without MULTI, connection commands inside.
fn basics(p: &mut Pair) {
    p.check(&["FLUSHALL"]);
    p.check(&["EXEC"]);
    p.check(&["DISCARD"]);
    p.check(&["MULTI"]);
    p.check(&["EXEC"]);
    p.check(&["MULTI"]);
    p.check(&["MULTI"]);
    p.check(&["WATCH", "a"]);
    p.check(&["SET", "a", "1"]);
    p.check(&["SET", "b", "2"]);
    p.check(&["INCR", "a"]);
    p.check(&["MGET", "a", "b", "c"]);
    p.check(&["PING"]);
    p.check(&["ECHO", "hi"]);
    p.check(&["DEL", "b", "c"]);
    p.check(&["EXEC"]);
    p.check(&["MGET", "a", "b"]);
    p.check(&["EXEC"]);
    // DISCARD drops the queue.
    p.check(&["MULTI"]);
    p.check(&["SET", "a", "discarded"]);
    p.check(&["DISCARD"]);
    p.check(&["GET", "a"]);
    p.check(&["DISCARD"]);
    // SELECT inside the transaction moves the later commands to the other db.
    p.check(&["MULTI"]);
    p.check(&["SELECT", "1"]);
    p.check(&["SET", "a", "db1"]);
    p.check(&["SELECT", "0"]);
    p.check(&["GET", "a"]);
    p.check(&["EXEC"]);
    p.check(&["SELECT", "1"]);
    p.check(&["GET", "a"]);
    p.check(&["SELECT", "0"]);
    // A keyspace-wide command inside: the transaction needs every shard.
    p.check(&["MULTI"]);
    p.check(&["SET", "x", "1"]);
    p.check(&["DBSIZE"]);
    p.check(&["FLUSHDB"]);
    p.check(&["DBSIZE"]);
    p.check(&["SET", "y", "2"]);
    p.check(&["EXEC"]);
    p.check(&["KEYS", "*"]);
}

/// Errors at queue time abort the transaction; errors at run time only fill their place.
fn errors(p: &mut Pair) {
    p.check(&["FLUSHALL"]);
    p.check(&["MULTI"]);
    p.check(&["SET", "a", "1"]);
    p.check(&["NOSUCHCOMMAND", "x"]);
    p.check(&["SET", "b", "2"]);
    p.check(&["EXEC"]);
    p.check(&["MGET", "a", "b"]);
    p.check(&["EXEC"]);
    p.check(&["MULTI"]);
    p.check(&["GET"]);
    p.check(&["SET", "a", "1"]);
    p.check(&["EXEC"]);
    p.check(&["EXISTS", "a"]);
    // Runtime errors: WRONGTYPE, not an integer, a syntax error; the rest still run.
    p.check(&["SET", "s", "str"]);
    p.check(&["MULTI"]);
    p.check(&["HSET", "s", "f", "v"]);
    p.check(&["INCR", "s"]);
    p.check(&["SET", "n", "5", "BADOPT"]);
    p.check(&["INCRBY", "n", "3"]);
    p.check(&["SADD", "set", "m"]);
    p.check(&["EXPIRE", "n", "nope"]);
    p.check(&["EXEC"]);
    p.check(&["MGET", "s", "n"]);
    // A command refused by ACL at queue time aborts as well.
    p.check(&[
        "ACL", "SETUSER", "limited", "on", "nopass", "+@all", "-get", "~*",
    ]);
    let mut lu = RespConn::connect(p.lavik.port);
    let mut ru = RespConn::connect(p.redis.port);
    for cmd in [
        &["AUTH", "limited", "x"][..],
        &["MULTI"],
        &["SET", "a", "by-limited"],
        &["GET", "a"],
        &["EXEC"],
        &["GET", "a"],
    ] {
        let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        let (l, r) = (lu.call(&a), ru.call(&a));
        // Redis 7.2's NOPERM text names the user; 7.0.15 says "this user" (lavik is 7.2).
        let l = String::from_utf8_lossy(&l).replace("User limited has", "this user has");
        assert_eq!(l, String::from_utf8_lossy(&r), "{cmd:?}");
    }
    // Rules changed between queueing and EXEC: the command is refused in its place.
    for (conn, cmd) in [
        (0, &["MULTI"][..]),
        (0, &["SET", "a", "queued-then-denied"]),
        (0, &["INCR", "counter"]),
        (1, &["ACL", "SETUSER", "limited", "-set"]),
        (0, &["EXEC"]),
        (0, &["INCR", "counter"]),
    ] {
        let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        let (l, r) = if conn == 0 {
            (lu.call(&a), ru.call(&a))
        } else {
            p.both(&a)
        };
        assert_eq!(
            String::from_utf8_lossy(&l),
            String::from_utf8_lossy(&r),
            "{cmd:?}"
        );
    }
    p.check(&["ACL", "DELUSER", "limited"]);
    p.check(&["GET", "a"]);
}

/// WATCH invalidated (or not) by the other client's writes, in a fixed interleaving.
fn watch_races(p: &mut Pair, o: &mut Other) {
    p.check(&["FLUSHALL"]);
    p.check(&["SET", "k", "1"]);
    // Touched by SET from the other connection: EXEC answers nil and runs nothing.
    p.check(&["WATCH", "k", "j"]);
    o.check(&["SET", "k", "2"]);
    p.check(&["MULTI"]);
    p.check(&["SET", "j", "from-txn"]);
    p.check(&["EXEC"]);
    p.check(&["EXISTS", "j"]);
    // Untouched: it runs. A read or a no-op DEL of a missing key is not a touch.
    p.check(&["WATCH", "k", "missing"]);
    o.check(&["GET", "k"]);
    o.check(&["DEL", "missing"]);
    p.check(&["MULTI"]);
    p.check(&["INCR", "k"]);
    p.check(&["EXEC"]);
    // A missing key created and deleted again between WATCH and EXEC was touched.
    p.check(&["WATCH", "missing"]);
    o.check(&["SET", "missing", "x"]);
    o.check(&["DEL", "missing"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    // EXEC unwatches: a later write does not affect the next transaction.
    p.check(&["WATCH", "k"]);
    p.check(&["MULTI"]);
    p.check(&["EXEC"]);
    o.check(&["SET", "k", "3"]);
    p.check(&["MULTI"]);
    p.check(&["GET", "k"]);
    p.check(&["EXEC"]);
    // UNWATCH forgets; DISCARD forgets too.
    p.check(&["WATCH", "k"]);
    o.check(&["SET", "k", "4"]);
    p.check(&["UNWATCH"]);
    p.check(&["MULTI"]);
    p.check(&["GET", "k"]);
    p.check(&["EXEC"]);
    p.check(&["WATCH", "k"]);
    p.check(&["MULTI"]);
    p.check(&["DISCARD"]);
    o.check(&["SET", "k", "5"]);
    p.check(&["MULTI"]);
    p.check(&["GET", "k"]);
    p.check(&["EXEC"]);
    // Own writes before MULTI count as well.
    p.check(&["WATCH", "k"]);
    p.check(&["SET", "k", "6"]);
    p.check(&["MULTI"]);
    p.check(&["GET", "k"]);
    p.check(&["EXEC"]);
    // EXPIRE, PERSIST, DEL, RENAME and COPY destinations, MSET, a script: all touch.
    p.check(&["SET", "e", "1"]);
    type Touch<'a> = &'a [&'a [&'a str]];
    let touches: &[(&str, Touch)] = &[
        ("e", &[&["EXPIRE", "e", "100"]]),
        ("e", &[&["PERSIST", "e"]]),
        ("e", &[&["DEL", "e"]]),
        ("dst", &[&["SET", "src", "v"], &["RENAME", "src", "dst"]]),
        ("cp", &[&["SET", "src", "v"], &["COPY", "src", "cp"]]),
        ("m2", &[&["MSET", "m1", "a", "m2", "b", "m3", "c"]]),
        (
            "sc",
            &[&["EVAL", "return redis.call('set', KEYS[1], 'x')", "1", "sc"]],
        ),
        ("h", &[&["HSET", "h", "f", "v"]]),
        ("st", &[&["SADD", "st", "m"]]),
    ];
    for (key, writes) in touches {
        p.check(&["WATCH", key, "k"]);
        for w in *writes {
            o.check(w);
        }
        p.check(&["MULTI"]);
        p.check(&["SET", "k", "t"]);
        p.check(&["EXEC"]);
    }
    // PERSIST of a key without a TTL changes nothing (Redis does not signal it).
    p.check(&["SET", "np", "v"]);
    p.check(&["WATCH", "np"]);
    o.check(&["PERSIST", "np"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
}

/// FLUSHALL / FLUSHDB touch watched keys that exist in the flushed db only; expiry.
fn watch_flush_and_expiry(p: &mut Pair, o: &mut Other) {
    p.check(&["FLUSHALL"]);
    p.check(&["SET", "k", "1"]);
    p.check(&["WATCH", "k"]);
    o.check(&["FLUSHALL"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    // A watched key that did not exist is not changed by a flush.
    p.check(&["WATCH", "nothing"]);
    o.check(&["FLUSHALL"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    // FLUSHDB of another db leaves a watch in db 1 alone; FLUSHDB of its db does not.
    p.check(&["SELECT", "1"]);
    p.check(&["SET", "k", "1"]);
    p.check(&["WATCH", "k"]);
    o.check(&["FLUSHDB"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    p.check(&["WATCH", "k"]);
    o.check(&["SELECT", "1"]);
    o.check(&["FLUSHDB"]);
    o.check(&["SELECT", "0"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    p.check(&["SELECT", "0"]);
    // A key that expires after WATCH fails the EXEC (whether or not expiry deleted it).
    p.check(&["SET", "v", "1", "PX", "60"]);
    p.check(&["WATCH", "v"]);
    sleep_ms(150);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    // A key already expired when watched: its deletion is no change, a new value is.
    p.check(&["SET", "v", "1", "PX", "20"]);
    sleep_ms(60);
    p.check(&["WATCH", "v"]);
    o.check(&["GET", "v"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
    p.check(&["SET", "v", "1", "PX", "20"]);
    sleep_ms(60);
    p.check(&["WATCH", "v"]);
    o.check(&["SET", "v", "2"]);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["EXEC"]);
}

/// EVAL inside a transaction runs atomically with the rest; scripts' errors fill a place.
fn exec_of_eval(p: &mut Pair) {
    p.check(&["FLUSHALL"]);
    p.check(&["MULTI"]);
    p.check(&["SET", "a", "10"]);
    p.check(&[
        "EVAL",
        "redis.call('incrby', KEYS[1], ARGV[1]) return redis.call('get', KEYS[2])",
        "2",
        "a",
        "b",
        "5",
    ]);
    p.check(&["EVAL", "return redis.call('incr', KEYS[1])", "1", "a"]);
    p.check(&["EVAL", "return redis.error_reply('OOPS failed')", "0"]);
    p.check(&["EVAL", "return {1, 'two', {3}}", "0"]);
    p.check(&["GET", "a"]);
    p.check(&["EXEC"]);
}

/// CLIENT INFO's `flags` and `multi` fields inside and outside a transaction.
fn client_fields(p: &mut Pair) {
    let fields = |reply: &[u8]| -> Vec<u8> {
        let text = String::from_utf8_lossy(reply);
        let pick: Vec<&str> = text
            .split([' ', '\n', '\r'])
            .filter(|f| f.starts_with("flags=") || f.starts_with("multi="))
            .collect();
        pick.join(" ").into_bytes()
    };
    p.check_with(&["CLIENT", "INFO"], fields);
    p.check(&["MULTI"]);
    p.check(&["PING"]);
    p.check(&["CLIENT", "INFO"]);
    p.check_with(&["EXEC"], fields);
}

/// MONITOR sees MULTI, then the queued commands when EXEC runs them, then EXEC.
fn monitor_order(p: &mut Pair) {
    let mut ml = RespConn::connect(p.lavik.port);
    let mut mr = RespConn::connect(p.redis.port);
    for m in [&mut ml, &mut mr] {
        assert_eq!(m.call(&[b"MONITOR"]), b"+OK\r\n");
    }
    p.check(&["MULTI"]);
    p.check(&["SET", "mon", "1"]);
    p.check(&["GET", "mon"]);
    p.check(&["EXEC"]);
    p.check(&["PING"]);
    // Each line is `+<time> [<db> <addr>] "CMD" ...`: compare what follows the address.
    let commands = |m: &mut RespConn| -> Vec<String> {
        (0..5)
            .map(|_| {
                let line = String::from_utf8_lossy(&m.reply()).into_owned();
                line.split_once("] ")
                    .map(|(_, c)| c.to_string())
                    .unwrap_or(line)
            })
            .collect()
    };
    assert_eq!(commands(&mut ml), commands(&mut mr));
}

fn all_scenarios(p: &mut Pair, o: &mut Other) {
    monitor_order(p);
    basics(p);
    errors(p);
    watch_races(p, o);
    watch_flush_and_expiry(p, o);
    exec_of_eval(p);
    client_fields(p);
}

// Every transaction scenario gives Redis's reply bytes in RESP2 and then in RESP3.
#[test]
fn transactions_match_redis() {
    let mut p = Pair::start("diff-txn", &[]);
    let mut o = Other::connect(&p);
    all_scenarios(&mut p, &mut o);
    p.hello(3);
    o.hello("3");
    all_scenarios(&mut p, &mut o);
}

fn int_of(reply: &[u8]) -> i64 {
    // A bulk string `$n\r\nDIGITS\r\n`.
    let text = String::from_utf8_lossy(reply);
    let body = text.split("\r\n").nth(1).expect("bulk body");
    body.parse().expect("integer value")
}

/// The values of an EXEC whose one element is an MGET reply: `*1\r\n*N\r\n$..`.
fn mget_values(reply: &[u8]) -> Vec<i64> {
    let text = String::from_utf8_lossy(reply);
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert!(lines[0] == "*1" && lines[1].starts_with('*'), "{text}");
    lines[2..]
        .chunks(2)
        .filter(|c| c.len() == 2 && c[0].starts_with('$'))
        .map(|c| c[1].parse().expect("integer"))
        .collect()
}

const ACCOUNTS: usize = 8;
const START_BALANCE: i64 = 100;

fn account(i: usize) -> String {
    format!("acct:{i}")
}

fn mover_watch(port: u16, seed: u64, until: Instant) -> (u64, u64) {
    let mut c = RespConn::connect(port);
    let mut rng = common::diff::Rng::new(seed);
    let (mut done, mut retries) = (0, 0);
    while Instant::now() < until {
        let a = rng.below(ACCOUNTS as u64) as usize;
        let b = (a + 1 + rng.below(ACCOUNTS as u64 - 1) as usize) % ACCOUNTS;
        let (ka, kb) = (account(a), account(b));
        let amount = rng.below(10) as i64;
        loop {
            c.call(&[b"WATCH", ka.as_bytes(), kb.as_bytes()]);
            let va = int_of(&c.call(&[b"GET", ka.as_bytes()]));
            let vb = int_of(&c.call(&[b"GET", kb.as_bytes()]));
            assert_eq!(c.call(&[b"MULTI"]), b"+OK\r\n");
            let na = (va - amount).to_string();
            let nb = (vb + amount).to_string();
            c.call(&[b"SET", ka.as_bytes(), na.as_bytes()]);
            c.call(&[b"SET", kb.as_bytes(), nb.as_bytes()]);
            let rep = c.call(&[b"EXEC"]);
            if rep == b"*-1\r\n" {
                retries += 1;
                continue;
            }
            assert_eq!(rep, b"*2\r\n+OK\r\n+OK\r\n");
            done += 1;
            break;
        }
    }
    (done, retries)
}

fn mover_eval(port: u16, seed: u64, until: Instant) -> u64 {
    let mut c = RespConn::connect(port);
    let mut rng = common::diff::Rng::new(seed);
    let script =
        b"redis.call('decrby', KEYS[1], ARGV[1]) redis.call('incrby', KEYS[2], ARGV[1]) return 1";
    let mut done = 0;
    while Instant::now() < until {
        let a = rng.below(ACCOUNTS as u64) as usize;
        let b = (a + 1 + rng.below(ACCOUNTS as u64 - 1) as usize) % ACCOUNTS;
        let amount = rng.below(10).to_string();
        let rep = c.call(&[
            b"EVAL",
            script,
            b"2",
            account(a).as_bytes(),
            account(b).as_bytes(),
            amount.as_bytes(),
        ]);
        assert_eq!(rep, b":1\r\n");
        done += 1;
    }
    done
}

fn read_total(c: &mut RespConn) -> i64 {
    let keys: Vec<String> = (0..ACCOUNTS).map(account).collect();
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(keys.iter().map(|k| k.as_bytes()));
    assert_eq!(c.call(&[b"MULTI"]), b"+OK\r\n");
    assert_eq!(c.call(&mget), b"+QUEUED\r\n");
    let values = mget_values(&c.call(&[b"EXEC"]));
    assert_eq!(values.len(), ACCOUNTS);
    values.iter().sum()
}

// Transfers by WATCH+MULTI/EXEC and by EVAL across both workers never change the total a
// concurrent MULTI/EXEC reader sees, and the total survives SIGKILL + restart (`always`).
#[test]
fn cross_worker_transfers_keep_the_total() {
    let mut server = Server::start(
        "txn-invariant",
        &["--threads", "2", "--appendfsync", "always"],
    );
    let port = server.port;
    let mut c = RespConn::connect(port);
    let expected = START_BALANCE * ACCOUNTS as i64;
    for i in 0..ACCOUNTS {
        let v = START_BALANCE.to_string();
        assert_eq!(
            c.call(&[b"SET", account(i).as_bytes(), v.as_bytes()]),
            b"+OK\r\n"
        );
    }
    let until = Instant::now() + Duration::from_secs(4);
    let watchers: Vec<_> = (0..3)
        .map(|i| std::thread::spawn(move || mover_watch(port, 11 + i, until)))
        .collect();
    let evals = std::thread::spawn(move || mover_eval(port, 99, until));
    let mut reads = 0;
    while Instant::now() < until {
        assert_eq!(
            read_total(&mut c),
            expected,
            "after {reads} consistent reads"
        );
        reads += 1;
    }
    let mut committed = 0;
    for w in watchers {
        let (done, _retries) = w.join().unwrap();
        committed += done;
    }
    let scripted = evals.join().unwrap();
    assert!(committed > 0 && scripted > 0 && reads > 0);
    assert_eq!(read_total(&mut c), expected);
    // One more cross-worker transaction, killed right after its reply: acknowledged means
    // durable with `always`.
    let (k0, k1) = (account(0), account(1));
    let v0 = int_of(&c.call(&[b"GET", k0.as_bytes()]));
    let v1 = int_of(&c.call(&[b"GET", k1.as_bytes()]));
    assert_eq!(c.call(&[b"MULTI"]), b"+OK\r\n");
    let (n0, n1) = ((v0 - 7).to_string(), (v1 + 7).to_string());
    c.call(&[b"SET", k0.as_bytes(), n0.as_bytes()]);
    c.call(&[b"SET", k1.as_bytes(), n1.as_bytes()]);
    c.call(&[b"SET", b"last-txn", b"acknowledged"]);
    assert_eq!(c.call(&[b"EXEC"]), b"*3\r\n+OK\r\n+OK\r\n+OK\r\n");
    server.restart_after_kill();
    let mut c = RespConn::connect(server.port);
    assert_eq!(read_total(&mut c), expected, "after SIGKILL and restart");
    assert_eq!(c.call(&[b"GET", b"last-txn"]), b"$12\r\nacknowledged\r\n");
    assert_eq!(int_of(&c.call(&[b"GET", k0.as_bytes()])), v0 - 7);
}
