//! Differential tests of the blocking pops (BLPOP BRPOP BLMOVE BRPOPLPUSH BLMPOP BZPOPMIN
//! BZPOPMAX BZMPOP), CLIENT UNBLOCK and blocked-client bookkeeping against Debian's
//! `redis-server` (7.0.15), lavik on `--threads 2` so keys live on both workers and
//! clients connect to either. Every scenario is deterministic: each blocking client is
//! sent its command and the test waits until INFO shows it blocked on both servers before
//! the next one, so the blocking order is fixed; pushes come from a separate client; then
//! each blocked client's reply is compared byte for byte. RESP2 and RESP3.
//!
//! 7.0 vs 7.2: a timeout of `inf` is "timeout is negative" in 7.0 and "timeout is out of
//! range" in 7.2 (lavik follows 7.2), so that case is checked against 7.2's text directly.
mod common;
use common::diff::{Pair, RespConn};
use std::time::{Duration, Instant};

fn args(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|a| a.as_slice()).collect()
}

fn blocked_count(c: &mut RespConn) -> usize {
    let info = c.call(&[b"INFO", b"clients"]);
    let text = String::from_utf8_lossy(&info).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO clients has blocked_clients")
}

/// Waits until both servers report `n` blocked clients.
fn wait_blocked(p: &mut Pair, n: usize) {
    let start = Instant::now();
    loop {
        let (l, r) = (blocked_count(&mut p.l), blocked_count(&mut p.r));
        if l == n && r == n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "blocked_clients: lavik {l}, redis {r}, want {n}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One client on each server, in RESP `proto`.
struct Client {
    l: RespConn,
    r: RespConn,
}

impl Client {
    fn new(p: &Pair, proto: u8) -> Client {
        let mut c = Client {
            l: RespConn::connect(p.lavik.port),
            r: RespConn::connect(p.redis.port),
        };
        let v = proto.to_string();
        for s in [&mut c.l, &mut c.r] {
            let rep = s.call(&[b"HELLO", v.as_bytes()]);
            assert!(!rep.starts_with(b"-"));
        }
        c
    }

    fn send(&mut self, cmd: &[&str]) {
        let a = args(cmd);
        self.l.send(&refs(&a));
        self.r.send(&refs(&a));
    }

    /// Reads one reply from each and panics unless they are identical.
    fn same_reply(&mut self, what: &str) -> Vec<u8> {
        let (l, r) = (self.l.reply(), self.r.reply());
        assert_eq!(
            String::from_utf8_lossy(&l),
            String::from_utf8_lossy(&r),
            "reply of {what}"
        );
        l
    }

    /// Asserts that no reply arrives within `ms` on either server.
    fn no_reply(&mut self, ms: u64) {
        for s in [&mut self.l, &mut self.r] {
            s.set_timeout(Duration::from_millis(ms));
            assert!(s.try_reply().is_none(), "unexpected reply");
            s.set_timeout(Duration::from_secs(20));
        }
    }
}

/// Blocks `blockers` in order (each fully blocked before the next), runs `pushes` from the
/// pair's own connection, then compares every blocker's reply in order.
fn scenario(p: &mut Pair, proto: u8, keys: &[&str], blockers: &[&[&str]], pushes: &[&[&str]]) {
    let mut del = vec!["DEL"];
    del.extend_from_slice(keys);
    p.check(&del);
    let base = blocked_count(&mut p.l);
    let mut clients: Vec<Client> = Vec::new();
    for (i, b) in blockers.iter().enumerate() {
        let mut c = Client::new(p, proto);
        c.send(b);
        wait_blocked(p, base + i + 1);
        clients.push(c);
    }
    for push in pushes {
        p.check(push);
    }
    for (c, b) in clients.iter_mut().zip(blockers) {
        c.same_reply(&b.join(" "));
    }
    wait_blocked(p, base);
    for k in keys {
        p.check(&["TYPE", k]);
        p.check(&["DUMP", k]);
    }
}

fn serving_order(p: &mut Pair, proto: u8) {
    // Several clients on one key are served in the order they blocked, one element each.
    scenario(
        p,
        proto,
        &["q1"],
        &[
            &["BLPOP", "q1", "0"],
            &["BRPOP", "q1", "0"],
            &["BLPOP", "q1", "0"],
        ],
        &[&["RPUSH", "q1", "a", "b"], &["LPUSH", "q1", "c", "d"]],
    );
    // A client on several keys is served by the first key that gets data; the others keep
    // their place on the keys they wait on.
    scenario(
        p,
        proto,
        &["k1", "k2", "k3"],
        &[
            &["BLPOP", "k1", "k2", "k3", "0"],
            &["BLPOP", "k2", "0"],
            &["BRPOP", "k3", "k1", "0"],
            &["BLMPOP", "0", "2", "k1", "k3", "RIGHT", "COUNT", "5"],
        ],
        &[
            &["RPUSH", "k2", "x", "y"],
            &["RPUSH", "k3", "z"],
            &["RPUSH", "k1", "1", "2", "3"],
        ],
    );
    // Several keys get data at once (one transaction): served in the order they were written.
    scenario(
        p,
        proto,
        &["m1", "m2"],
        &[&["BLPOP", "m1", "m2", "0"], &["BLPOP", "m1", "m2", "0"]],
        &[
            &["MULTI"],
            &["RPUSH", "m2", "a"],
            &["RPUSH", "m1", "b"],
            &["EXEC"],
        ],
    );
    // Written and emptied inside one transaction: nobody is served, the pushes then serve.
    scenario(
        p,
        proto,
        &["e1"],
        &[&["BLPOP", "e1", "0"]],
        &[
            &["MULTI"],
            &["RPUSH", "e1", "a"],
            &["LPOP", "e1"],
            &["EXEC"],
            &["RPUSH", "e1", "late"],
        ],
    );
    // A script's writes serve when the script ends (the pushed-then-popped element never).
    scenario(
        p,
        proto,
        &["sc1"],
        &[&["BLPOP", "sc1", "0"], &["BLPOP", "sc1", "0"]],
        &[&[
            "EVAL",
            "redis.call('rpush', KEYS[1], 'a'); redis.call('lpop', KEYS[1]); return redis.call('rpush', KEYS[1], 'b', 'c')",
            "1",
            "sc1",
        ]],
    );
    // BLMOVE chains: the moved element serves a client blocked on the destination.
    scenario(
        p,
        proto,
        &["{t}src", "{t}dst"],
        &[
            &["BLMOVE", "{t}src", "{t}dst", "LEFT", "RIGHT", "0"],
            &["BRPOPLPUSH", "{t}src", "{t}dst", "0"],
            &["BLPOP", "{t}dst", "0"],
        ],
        &[&["RPUSH", "{t}src", "one", "two"]],
    );
    // Sorted sets: BZPOPMIN/BZPOPMAX/BZMPOP served by ZADD, scores as the protocol has them.
    scenario(
        p,
        proto,
        &["z1", "z2"],
        &[
            &["BZPOPMIN", "z1", "z2", "0"],
            &["BZPOPMAX", "z2", "0"],
            &["BZMPOP", "0", "2", "z1", "z2", "MAX", "COUNT", "2"],
        ],
        &[
            &["ZADD", "z2", "1.5", "a", "2", "b", "-3", "c"],
            &["ZADD", "z1", "0.25", "x", "7", "y", "inf", "w"],
        ],
    );
    // A key of another kind does not serve a list client; a later list push does.
    scenario(
        p,
        proto,
        &["w1"],
        &[&["BLPOP", "w1", "0"]],
        &[
            &["SET", "w1", "str"],
            &["DEL", "w1"],
            &["RPUSH", "w1", "ok"],
        ],
    );
}

fn immediate_and_errors(p: &mut Pair) {
    p.check(&["DEL", "i1", "i2", "s1", "iz"]);
    p.check(&["RPUSH", "i2", "a", "b", "c"]);
    p.check(&["SET", "s1", "v"]);
    p.check(&["ZADD", "iz", "1", "m"]);
    // Data present: answered at once, the first key with data in argument order.
    p.check(&["BLPOP", "i1", "i2", "0"]);
    p.check(&["BRPOP", "i1", "i2", "1"]);
    p.check(&["BLMPOP", "0", "2", "i1", "i2", "LEFT", "COUNT", "9"]);
    p.check(&["BZPOPMAX", "i1", "iz", "0"]);
    p.check(&["BLPOP", "s1", "0"]);
    p.check(&["BLMOVE", "s1", "i1", "LEFT", "LEFT", "0"]);
    p.check(&["BZPOPMIN", "s1", "0"]);
    // Timeout parsing.
    for t in ["-1", "abc", "", " 1", "1x", "nan", "-0.5"] {
        p.check(&["BLPOP", "i1", t]);
        p.check(&["BZMPOP", t, "1", "i1", "MIN"]);
    }
    p.check(&["BLMPOP", "0", "0", "i1", "LEFT"]);
    p.check(&["BLMPOP", "0", "1", "i1", "UP"]);
    p.check(&["BLMPOP", "0", "1", "i1", "LEFT", "COUNT", "0"]);
    p.check(&["BZMPOP", "0", "2", "i1", "MIN"]);
    p.check(&["BLMOVE", "i1", "i2", "UP", "LEFT", "0"]);
    p.check(&["BLPOP", "i1"]);
    // Redis 7.2's text for an infinite timeout (7.0 said "timeout is negative").
    let l = p.l.call(&[b"BLPOP", b"i1", b"inf"]);
    assert_eq!(l, b"-ERR timeout is out of range\r\n".to_vec());
}

fn timeouts_multi_unblock(p: &mut Pair, proto: u8) {
    p.check(&["DEL", "t1", "t2"]);
    // Short timeouts answer nil (array or bulk as each command does).
    for cmd in [
        &["BLPOP", "t1", "t2", "0.1"][..],
        &["BRPOPLPUSH", "t1", "t2", "0.05"],
        &["BLMOVE", "t1", "t2", "LEFT", "RIGHT", "0.05"],
        &["BZPOPMIN", "t1", "0.05"],
        &["BLMPOP", "0.05", "1", "t1", "LEFT"],
        &["BZMPOP", "0.05", "1", "t1", "MIN"],
    ] {
        let started = Instant::now();
        p.check(cmd);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
    // MULTI never blocks: the command answers as if timed out.
    p.check(&["MULTI"]);
    p.check(&["BLPOP", "t1", "0"]);
    p.check(&["BZPOPMAX", "t1", "0"]);
    p.check(&["BLMOVE", "t1", "t2", "LEFT", "RIGHT", "0"]);
    p.check(&["EXEC"]);
    // A blocked client answers nothing else until it is served (pipelined PING waits).
    let mut c = Client::new(p, proto);
    let lid = client_id(&mut c.l);
    let rid = client_id(&mut c.r);
    c.send(&["BLPOP", "t1", "0"]);
    c.send(&["PING"]);
    wait_blocked(p, 1);
    c.no_reply(50);
    // CLIENT LIST shows the blocked client with flag b.
    assert_eq!(blocked_in_list(&mut p.l), vec![lid.clone()]);
    assert_eq!(blocked_in_list(&mut p.r), vec![rid.clone()]);
    // CLIENT UNBLOCK with TIMEOUT (the default) and ERROR; not blocked: 0.
    let unblock = |p: &mut Pair, how: Option<&str>| {
        let mut la: Vec<Vec<u8>> = args(&["CLIENT", "UNBLOCK", &lid]);
        let mut ra: Vec<Vec<u8>> = args(&["CLIENT", "UNBLOCK", &rid]);
        if let Some(h) = how {
            la.push(h.as_bytes().to_vec());
            ra.push(h.as_bytes().to_vec());
        }
        let (l, r) = (p.l.call(&refs(&la)), p.r.call(&refs(&ra)));
        assert_eq!(l, r, "CLIENT UNBLOCK reply");
        l
    };
    assert_eq!(unblock(p, None), b":1\r\n");
    c.same_reply("BLPOP after CLIENT UNBLOCK");
    c.same_reply("PING after the unblocked BLPOP");
    assert_eq!(unblock(p, Some("ERROR")), b":0\r\n");
    c.send(&["BZPOPMIN", "t1", "t2", "0"]);
    wait_blocked(p, 1);
    assert_eq!(unblock(p, Some("error")), b":1\r\n");
    c.same_reply("BZPOPMIN after CLIENT UNBLOCK ERROR");
    c.send(&["BLMOVE", "t1", "t2", "LEFT", "LEFT", "0"]);
    wait_blocked(p, 1);
    assert_eq!(unblock(p, Some("TIMEOUT")), b":1\r\n");
    c.same_reply("BLMOVE after CLIENT UNBLOCK TIMEOUT");
    p.check(&["CLIENT", "UNBLOCK", "999999"]);
    p.check(&["CLIENT", "UNBLOCK", "x"]);
    p.check(&["CLIENT", "UNBLOCK", "1", "MAYBE"]);
    // A blocked client that closes is forgotten: the push stays in the list.
    let mut gone = Client::new(p, proto);
    gone.send(&["BLPOP", "t1", "0"]);
    wait_blocked(p, 1);
    drop(gone);
    wait_blocked(p, 0);
    p.check(&["RPUSH", "t1", "kept"]);
    p.check(&["LRANGE", "t1", "0", "-1"]);
    p.check(&["DEL", "t1"]);
}

fn client_id(c: &mut RespConn) -> String {
    let rep = c.call(&[b"CLIENT", b"ID"]);
    String::from_utf8_lossy(&rep[1..rep.len() - 2]).to_string()
}

/// The ids CLIENT LIST shows with flag `b`.
fn blocked_in_list(ctl: &mut RespConn) -> Vec<String> {
    let list = ctl.call(&[b"CLIENT", b"LIST"]);
    let text = String::from_utf8_lossy(&list).to_string();
    text.lines()
        .filter(|l| l.contains(" flags=b "))
        .filter_map(|l| l.split(' ').next())
        .filter_map(|f| f.split("id=").nth(1))
        .map(str::to_string)
        .collect()
}

// The blocking pops serve, time out, unblock and clean up as Redis does, in RESP2 and
// RESP3, with keys and clients spread over both workers.
#[test]
fn blocking_matches_redis() {
    let mut p = Pair::start("diff-blocking", &[]);
    immediate_and_errors(&mut p);
    for proto in [2u8, 3] {
        p.hello(proto);
        serving_order(&mut p, proto);
        timeouts_multi_unblock(&mut p, proto);
    }
}

// Clients blocked on keys owned by both workers are served by pushes arriving on
// connections of either worker, each exactly once, and a 0.1 s timeout fires (not before).
#[test]
fn blocking_across_workers() {
    let mut p = Pair::start("diff-blocking-workers", &[]);
    let keys: Vec<String> = (0..12).map(|i| format!("w{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
    let blockers: Vec<Vec<&str>> = key_refs.iter().map(|k| vec!["BRPOP", *k, "0"]).collect();
    let blocker_refs: Vec<&[&str]> = blockers.iter().map(|v| v.as_slice()).collect();
    let pushes: Vec<Vec<String>> = keys
        .iter()
        .rev()
        .map(|k| vec!["LPUSH".to_string(), k.clone(), format!("v-{k}")])
        .collect();
    let push_strs: Vec<Vec<&str>> = pushes
        .iter()
        .map(|v| v.iter().map(|s| s.as_str()).collect())
        .collect();
    let push_refs: Vec<&[&str]> = push_strs.iter().map(|v| v.as_slice()).collect();
    // Pushes from several connections (spread over the workers by the kernel).
    scenario(&mut p, 2, &key_refs, &blocker_refs, &push_refs);
    let mut pushers: Vec<Client> = (0..4).map(|_| Client::new(&p, 2)).collect();
    let mut waiters: Vec<Client> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let mut c = Client::new(&p, 2);
        c.send(&["BLPOP", k, "0"]);
        wait_blocked(&mut p, i + 1);
        waiters.push(c);
    }
    for (i, k) in keys.iter().enumerate() {
        let pusher = &mut pushers[i % 4];
        pusher.send(&["RPUSH", k, "x", "y"]);
        pusher.same_reply("RPUSH");
    }
    for (c, k) in waiters.iter_mut().zip(&keys) {
        c.same_reply(&format!("BLPOP {k}"));
    }
    wait_blocked(&mut p, 0);
    for k in &keys {
        p.check(&["LRANGE", k, "0", "-1"]);
    }
    // BLMOVE with source and destination on different workers (some of these pairs are),
    // chained into clients blocked on the destinations, served in blocking order.
    // (With 8 shards on 2 workers, "srcN"/"dstN" share a worker and "srcN"/"to(N^1)" do
    // not: the odd pairs cross.)
    let pairs: Vec<(String, String)> = (0..6)
        .map(|i| {
            let dst = if i % 2 == 1 {
                format!("to{}", i ^ 1)
            } else {
                format!("dst{i}")
            };
            (format!("src{i}"), dst)
        })
        .collect();
    let mut all_keys: Vec<&str> = Vec::new();
    let mut chain: Vec<Vec<&str>> = Vec::new();
    let mut feed: Vec<Vec<&str>> = Vec::new();
    for (src, dst) in &pairs {
        all_keys.push(src);
        all_keys.push(dst);
        chain.push(vec!["BLMOVE", src, dst, "LEFT", "RIGHT", "0"]);
        chain.push(vec!["BLPOP", src, "0"]);
        chain.push(vec!["BRPOP", dst, "0"]);
        feed.push(vec!["RPUSH", src, "first", "second"]);
    }
    let chain_refs: Vec<&[&str]> = chain.iter().map(|v| v.as_slice()).collect();
    let feed_refs: Vec<&[&str]> = feed.iter().map(|v| v.as_slice()).collect();
    scenario(&mut p, 3, &all_keys, &chain_refs, &feed_refs);
    // Timeouts on clients of both workers fire within a bound of their deadline.
    let mut timed: Vec<Client> = (0..4).map(|_| Client::new(&p, 2)).collect();
    let started = Instant::now();
    for c in timed.iter_mut() {
        c.l.send(&[b"BLPOP", b"nothing-here", b"0.1"]);
    }
    for c in timed.iter_mut() {
        assert_eq!(c.l.reply(), b"*-1\r\n".to_vec());
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(100), "{took:?}");
    // The timer fired on both workers (a reply at all, not a missed timer that only a push
    // would end). The upper bound is for a loaded machine, not a latency claim.
    assert!(took < Duration::from_secs(30), "{took:?}");
}
