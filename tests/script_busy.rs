//! A script running past `busy-reply-threshold` no longer freezes its worker (issue 15):
//! every other connection — on the script's own worker, on a worker lending it shards, or
//! on any other — gets Redis's `-BUSY` text, and SCRIPT KILL / FUNCTION KILL / SHUTDOWN
//! NOSAVE sent from any of them take effect. The same scenario runs on `redis-server` and
//! on lavik with `--threads 1` (every connection is on the script's worker) and
//! `--threads 2`, and the replies are compared byte for byte.
//!
//! No wall-clock assertion: the threshold is 100 ms and every wait is "until the reply
//! comes" (60 s read timeouts); a connection asks PING until it is answered -BUSY.
mod common;
use common::diff::{Redis, RespConn};
use std::time::Duration;

const LOOP: &str = "while true do end";
const WRITE_THEN_LOOP: &str = "redis.call('set', KEYS[1], 'new') while true do end";
const LIBRARY: &str =
    "#!lua name=busylib\nredis.register_function('spin', function() while true do end end)";

/// PING until the reply is not +PONG (the script has started and passed the threshold).
fn until_busy(c: &mut RespConn) -> Vec<u8> {
    loop {
        let r = c.call(&[b"PING"]);
        if r != b"+PONG\r\n" {
            return r;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Keys enough that a script declaring them all gathers shards from both of lavik's
/// workers (no hash tags), so its run is a coordinated pass.
fn spread_keys() -> Vec<String> {
    (0..16).map(|i| format!("spread:{i}")).collect()
}

/// The busy scenario on the server at `port` with `others` extra connections; returns
/// every reply in order.
fn busy_transcript(port: u16, others: usize, keys: &[String]) -> Vec<Vec<u8>> {
    let mut t = Vec::new();
    let mut admin = RespConn::connect(port);
    t.push(admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"100"]));
    t.push(admin.call(&[b"FUNCTION", b"LOAD", b"REPLACE", LIBRARY.as_bytes()]));
    let mut conns: Vec<RespConn> = (0..others).map(|_| RespConn::connect(port)).collect();
    for c in &mut conns {
        t.push(c.call(&[b"PING"]));
    }
    let numkeys = keys.len().to_string();
    let mut eval: Vec<&[u8]> = vec![b"EVAL", LOOP.as_bytes(), numkeys.as_bytes()];
    eval.extend(keys.iter().map(|k| k.as_bytes()));

    // A looping script that has not written: every connection is answered -BUSY for
    // PING, GET and SHUTDOWN (without NOSAVE), EXEC is aborted, FUNCTION KILL names the
    // wrong kind, SCRIPT KILL (from the last connection) stops it.
    let mut runner = RespConn::connect(port);
    runner.send(&eval);
    for c in &mut conns {
        t.push(until_busy(c));
        t.push(c.call(&[b"GET", b"k"]));
        t.push(c.call(&[b"SHUTDOWN"]));
        t.push(c.call(&[b"EXEC"]));
    }
    t.push(conns[0].call(&[b"FUNCTION", b"KILL"]));
    t.push(conns.last_mut().unwrap().call(&[b"SCRIPT", b"KILL"]));
    t.push(runner.reply());
    for c in &mut conns {
        t.push(c.call(&[b"PING"]));
    }

    // A function: FUNCTION KILL stops it; SCRIPT KILL names the wrong kind first.
    let mut fcall: Vec<&[u8]> = vec![b"FCALL", b"spin", numkeys.as_bytes()];
    fcall.extend(keys.iter().map(|k| k.as_bytes()));
    runner.send(&fcall);
    for c in &mut conns {
        t.push(until_busy(c));
    }
    t.push(conns[0].call(&[b"SCRIPT", b"KILL"]));
    t.push(conns.last_mut().unwrap().call(&[b"FUNCTION", b"KILL"]));
    t.push(runner.reply());
    t.push(admin.call(&[b"PING"]));
    t
}

/// The written-then-looping script: -BUSY for everybody, SCRIPT KILL is refused as
/// UNKILLABLE, and SHUTDOWN NOSAVE ends the server (no reply; the script's client sees its
/// connection close). Returns the replies.
fn unkillable_transcript(port: u16, others: usize, key: &str) -> Vec<Vec<u8>> {
    let mut t = Vec::new();
    let mut admin = RespConn::connect(port);
    t.push(admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"100"]));
    t.push(admin.call(&[b"SET", key.as_bytes(), b"old"]));
    let mut conns: Vec<RespConn> = (0..others).map(|_| RespConn::connect(port)).collect();
    for c in &mut conns {
        t.push(c.call(&[b"PING"]));
    }
    let mut runner = RespConn::connect(port);
    runner.send(&[b"EVAL", WRITE_THEN_LOOP.as_bytes(), b"1", key.as_bytes()]);
    for c in &mut conns {
        t.push(until_busy(c));
        t.push(c.call(&[b"SCRIPT", b"KILL"]));
    }
    let last = conns.last_mut().unwrap();
    last.send(&[b"SHUTDOWN", b"NOSAVE"]);
    assert!(last.closed(), "SHUTDOWN NOSAVE closes its connection");
    assert!(runner.closed(), "the script's client sees the server go");
    t
}

/// Waits (bounded, 60 s) until nothing accepts connections on `port`.
fn wait_gone(port: u16) {
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("server on {port} still accepts connections after SHUTDOWN NOSAVE");
}

// One worker: every connection is on the script's worker; it answers -BUSY from the
// script's hook and runs SCRIPT KILL / FUNCTION KILL there, as redis-server does.
#[test]
fn busy_script_answers_on_its_own_worker() {
    let redis = Redis::start("busy-1");
    let expected = busy_transcript(redis.port, 3, &[]);
    let lavik = common::Server::start("busy-1", &["--threads", "1"]);
    assert_eq!(
        busy_transcript(lavik.port, 3, &[]),
        expected,
        "lavik --threads 1 differs from redis-server"
    );
}

// Two workers: a keyless script (on its connection's worker; 6 connections land on both
// workers) and one whose keys span both workers (a coordinated pass: one worker runs it,
// the other lends its shards) — every connection is answered as by redis-server.
#[test]
fn busy_script_answers_on_every_worker() {
    let redis = Redis::start("busy-2");
    let keys = spread_keys();
    let expected_keyless = busy_transcript(redis.port, 6, &[]);
    let expected_spread = busy_transcript(redis.port, 6, &keys);
    let lavik = common::Server::start("busy-2", &["--threads", "2"]);
    assert_eq!(busy_transcript(lavik.port, 6, &[]), expected_keyless);
    assert_eq!(busy_transcript(lavik.port, 6, &keys), expected_spread);
}

// A script that wrote cannot be killed (UNKILLABLE, for connections on every worker);
// SHUTDOWN NOSAVE stops the server, and the script's write is not there after a restart
// (its write group was never closed: as after a crash), on one and on two workers.
#[test]
fn busy_script_that_wrote_ends_with_shutdown_nosave() {
    let redis = Redis::start("busy-w");
    let expected = unkillable_transcript(redis.port, 3, "wk");
    wait_gone(redis.port);
    drop(redis);
    for threads in ["1", "2"] {
        let mut lavik =
            common::Server::start("busy-w", &["--threads", threads, "--appendfsync", "always"]);
        assert_eq!(unkillable_transcript(lavik.port, 3, "wk"), expected);
        wait_gone(lavik.port);
        lavik.restart_after_kill();
        let mut c = RespConn::connect(lavik.port);
        assert_eq!(c.call(&[b"GET", b"wk"]), b"$3\r\nold\r\n");
    }
}
