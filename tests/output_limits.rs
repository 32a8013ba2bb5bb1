//! `client-output-buffer-limit` and client buffer memory: a client that never reads its
//! replies is back-pressured, counted in `mem_clients_normal`, closed by the limit, and the
//! server's RSS comes back after it is gone.
mod common;
use common::Server;
use std::time::{Duration, Instant};

fn info_u64(s: &Server, section: &str, field: &str) -> u64 {
    let text = s.raw().bulk(&[b"INFO", section.as_bytes()]);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// CONFIG GET/SET speak Redis's syntax and errors for the limit.
#[test]
fn config_syntax() {
    let s = Server::start("obuf-config", &[]);
    let mut c = s.raw();
    c.expect(
        &[b"CONFIG", b"GET", b"client-output-buffer-limit"],
        b"*2\r\n$26\r\nclient-output-buffer-limit\r\n$67\r\nnormal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60\r\n",
    );
    c.expect(
        &[
            b"CONFIG",
            b"SET",
            b"client-output-buffer-limit",
            b"normal 1mb 512kb 5",
        ],
        b"+OK\r\n",
    );
    c.expect(
        &[b"CONFIG", b"GET", b"client-output-buffer-limit"],
        b"*2\r\n$26\r\nclient-output-buffer-limit\r\n$78\r\nnormal 1048576 524288 5 slave 268435456 67108864 60 pubsub 33554432 8388608 60\r\n",
    );
    c.expect(
        &[b"CONFIG", b"SET", b"client-output-buffer-limit", b"bogus 1 1 1"],
        b"-ERR CONFIG SET failed (possibly related to argument 'client-output-buffer-limit') - Invalid client class specified in buffer limit configuration.\r\n",
    );
}

// A client pipelining GETs of a 1 MiB value without reading: with Redis's default (no
// limit for normal clients) it is back-pressured (RSS stays bounded), with a hard limit it
// is closed, and RSS returns near where it was once it is gone.
#[test]
fn slow_reader_is_bounded_then_closed_and_memory_returns() {
    let s = Server::start("obuf-slow", &["--threads", "1"]);
    let mut c = s.raw();
    let big = vec![b'x'; 1 << 20];
    c.cmd(&[b"SET", b"big", &big]);
    assert_eq!(c.read_exact(5), b"+OK\r\n");
    let rss_before = info_u64(&s, "memory", "used_memory_rss");

    let mut slow = s.raw();
    let mut pipeline = Vec::new();
    for _ in 0..2000 {
        pipeline.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    }
    slow.send(&pipeline);
    // Its unsent replies reach lavik's back-pressure mark (64 MiB) and stop there.
    wait_for("client buffers to fill", || {
        info_u64(&s, "memory", "mem_clients_normal") >= 32 << 20
    });
    std::thread::sleep(Duration::from_millis(300));
    let rss_loaded = info_u64(&s, "memory", "used_memory_rss");
    assert!(
        rss_loaded < rss_before + (400 << 20),
        "RSS grew without bound: {rss_before} -> {rss_loaded}"
    );
    assert_eq!(
        info_u64(&s, "stats", "client_output_buffer_limit_disconnections"),
        0
    );

    c.expect(
        &[
            b"CONFIG",
            b"SET",
            b"client-output-buffer-limit",
            b"normal 16mb 8mb 10",
        ],
        b"+OK\r\n",
    );
    wait_for("the slow client to be closed", || {
        info_u64(&s, "stats", "client_output_buffer_limit_disconnections") == 1
    });
    assert!(
        slow.is_closed(),
        "the slow client's connection was not closed"
    );
    wait_for("client memory to be released", || {
        info_u64(&s, "memory", "mem_clients_normal") < 4 << 20
    });
    let rss_after = info_u64(&s, "memory", "used_memory_rss");
    assert!(
        rss_after < rss_before + (48 << 20),
        "RSS did not come back: before {rss_before}, loaded {rss_loaded}, after {rss_after}"
    );
    c.expect(&[b"PING"], b"+PONG\r\n");
}
