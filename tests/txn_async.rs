//! MULTI/EXEC, WATCH, EVALSHA and FCALL over keys on the device wait for their reads
//! without blocking the worker (parked, not read synchronously), keep their semantics, and
//! a queued read of a key an earlier queued command wrote sees the new value.
mod common;
use common::{Raw, Server};
use std::io::Read;
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 1000;
/// Enough 1 KB values to seal blocks in every shard: the first keys are on the device.
const FILL_KEYS: usize = 12_000;
/// The test-only read delay of the stall test.
const READ_DELAY_MS: u64 = 2000;

fn fill(s: &Server) {
    fill_batched(s, 500);
}

/// `fill` pipelining `per_batch` SETs at a time.
fn fill_batched(s: &Server, per_batch: usize) {
    common::fill_strings(s, FILL_KEYS, VALUE_BYTES, per_batch);
}

fn info_field(s: &Server, field: &str) -> u64 {
    s.info_u64("stats", field)
}

/// RESP2 bulk string of the fill value.
fn old_value() -> String {
    format!("${VALUE_BYTES}\r\n{}\r\n", "v".repeat(VALUE_BYTES))
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn expect_text(c: &mut Raw, args: &[&str], want: &str) {
    let a: Vec<&[u8]> = args.iter().map(|x| x.as_bytes()).collect();
    c.cmd(&a);
    let got = c.read_exact(want.len());
    assert_eq!(String::from_utf8_lossy(&got), want, "reply to {args:?}");
}

/// Runs `probe` and checks that it parked and read nothing synchronously.
fn assert_parks(s: &Server, what: &str, probe: impl FnOnce()) {
    let sync = info_field(s, "lavik_sync_reads");
    let parked = info_field(s, "lavik_parked_commands");
    probe();
    assert_eq!(
        info_field(s, "lavik_sync_reads"),
        sync,
        "{what} read the device synchronously (blocked its worker)"
    );
    assert!(
        info_field(s, "lavik_parked_commands") > parked,
        "{what} did not park for its reads"
    );
}

// One server (cache off, one worker) for the two checks below.
#[test]
fn device_reads_of_transactions_and_scripts() {
    let s = Server::start("txn-async", &["--threads", "1", "--cache-size", "0"]);
    fill(&s);
    exec_watch_and_scripts_park_for_device_reads(&s);
    queued_read_sees_earlier_queued_write(&s);
    blind_writes_in_exec_read_nothing(&s);
}

// With the cache off, EXEC, WATCH, EVALSHA and FCALL over device-resident keys park for their
// reads (lavik_parked_commands grows) and never read synchronously (lavik_sync_reads stays),
// and answer what Redis would; a touched WATCH still aborts the EXEC.
fn exec_watch_and_scripts_park_for_device_reads(s: &Server) {
    let old = old_value();
    let mut c = s.raw();

    assert_parks(s, "MULTI/EXEC", || {
        expect_text(&mut c, &["MULTI"], "+OK\r\n");
        expect_text(&mut c, &["SET", "k100", "x"], "+QUEUED\r\n");
        expect_text(&mut c, &["GET", "k101"], "+QUEUED\r\n");
        expect_text(&mut c, &["STRLEN", "k102"], "+QUEUED\r\n");
        expect_text(&mut c, &["GET", "k100"], "+QUEUED\r\n");
        expect_text(
            &mut c,
            &["EXEC"],
            &format!("*4\r\n+OK\r\n{old}:{VALUE_BYTES}\r\n$1\r\nx\r\n"),
        );
    });

    assert_parks(s, "WATCH", || {
        expect_text(&mut c, &["WATCH", "k110", "k111"], "+OK\r\n");
    });
    // The watch holds: EXEC runs (and parks for k112 and the watched keys' records).
    assert_parks(s, "EXEC after WATCH", || {
        expect_text(&mut c, &["MULTI"], "+OK\r\n");
        expect_text(&mut c, &["GET", "k112"], "+QUEUED\r\n");
        expect_text(&mut c, &["EXEC"], &format!("*1\r\n{old}"));
    });
    // A touched watched key aborts the transaction: a null array, nothing applied.
    expect_text(&mut c, &["WATCH", "k120"], "+OK\r\n");
    expect_text(
        &mut s.raw(),
        &["APPEND", "k120", "!"],
        &format!(":{}\r\n", VALUE_BYTES + 1),
    );
    expect_text(&mut c, &["MULTI"], "+OK\r\n");
    expect_text(&mut c, &["SET", "k121", "lost"], "+QUEUED\r\n");
    expect_text(&mut c, &["EXEC"], "*-1\r\n");
    expect_text(&mut c, &["STRLEN", "k121"], &format!(":{VALUE_BYTES}\r\n"));

    let script = "return redis.call('STRLEN', KEYS[1]) + #redis.call('GET', KEYS[2])";
    let sha = c.bulk(&[b"SCRIPT", b"LOAD", script.as_bytes()]);
    assert_parks(s, "EVALSHA", || {
        expect_text(
            &mut c,
            &["EVALSHA", &sha, "2", "k130", "k131"],
            &format!(":{}\r\n", 2 * VALUE_BYTES),
        );
    });
    let lib = "#!lua name=t\nredis.register_function('len', function(keys) return redis.call('STRLEN', keys[1]) end)";
    expect_text(&mut c, &["FUNCTION", "LOAD", lib], &bulk("t"));
    assert_parks(s, "FCALL", || {
        expect_text(
            &mut c,
            &["FCALL", "len", "1", "k140"],
            &format!(":{VALUE_BYTES}\r\n"),
        );
    });
    // A script inside a transaction: its declared keys are part of EXEC's reads.
    assert_parks(s, "EVALSHA inside MULTI/EXEC", || {
        expect_text(&mut c, &["MULTI"], "+OK\r\n");
        expect_text(
            &mut c,
            &["EVALSHA", &sha, "2", "k150", "k151"],
            "+QUEUED\r\n",
        );
        expect_text(
            &mut c,
            &["EXEC"],
            &format!("*1\r\n:{}\r\n", 2 * VALUE_BYTES),
        );
    });
}

// Inside one EXEC (and one script), a read of a device-resident key that an earlier queued
// command wrote, appended to or deleted sees that write, not the record fetched before it.
fn queued_read_sees_earlier_queued_write(s: &Server) {
    let old = old_value();
    let mut c = s.raw();
    let steps: [(&[&str], String); 9] = [
        (&["GET", "k200"], old.clone()),
        (&["SET", "k200", "new"], "+OK\r\n".into()),
        (&["GET", "k200"], bulk("new")),
        (&["APPEND", "k200", "!"], ":4\r\n".into()),
        (&["GET", "k200"], bulk("new!")),
        (
            &["APPEND", "k201", "!"],
            format!(":{}\r\n", VALUE_BYTES + 1),
        ),
        (&["STRLEN", "k201"], format!(":{}\r\n", VALUE_BYTES + 1)),
        (&["DEL", "k200"], ":1\r\n".into()),
        (&["GET", "k200"], "$-1\r\n".into()),
    ];
    assert_parks(s, "MULTI/EXEC", || {
        expect_text(&mut c, &["MULTI"], "+OK\r\n");
        for (args, _) in &steps {
            expect_text(&mut c, args, "+QUEUED\r\n");
        }
        let mut want = format!("*{}\r\n", steps.len());
        for (_, reply) in &steps {
            want.push_str(reply);
        }
        expect_text(&mut c, &["EXEC"], &want);
    });
    // After EXEC the writes are there for everyone.
    expect_text(&mut s.raw(), &["GET", "k200"], "$-1\r\n");
    expect_text(
        &mut s.raw(),
        &["STRLEN", "k201"],
        &format!(":{}\r\n", VALUE_BYTES + 1),
    );
    // The same inside a script: SET then GET of a declared key on the device.
    let script = "local before = #redis.call('GET', KEYS[1]); redis.call('SET', KEYS[1], 'z'); return {before, redis.call('GET', KEYS[1])}";
    assert_parks(s, "EVAL", || {
        expect_text(
            &mut c,
            &["EVAL", script, "1", "k202"],
            &format!("*2\r\n:{VALUE_BYTES}\r\n$1\r\nz\r\n"),
        );
    });
}

// A transaction of blind writes only (plain SET, SETEX, PSETEX, MSET) over device-resident
// keys neither parks nor reads synchronously, as the same commands outside MULTI do, and its
// writes are there afterwards. (Before: EXEC planned reads of every queued key and parked,
// so its reply left a round after the +QUEUED replies.)
fn blind_writes_in_exec_read_nothing(s: &Server) {
    let mut c = s.raw();
    let sync = info_field(s, "lavik_sync_reads");
    let parked = info_field(s, "lavik_parked_commands");
    expect_text(&mut c, &["MULTI"], "+OK\r\n");
    expect_text(&mut c, &["SET", "k300", "a"], "+QUEUED\r\n");
    expect_text(&mut c, &["SETEX", "k301", "1000", "b"], "+QUEUED\r\n");
    expect_text(&mut c, &["PSETEX", "k302", "1000000", "c"], "+QUEUED\r\n");
    expect_text(&mut c, &["MSET", "k303", "d", "k304", "e"], "+QUEUED\r\n");
    expect_text(&mut c, &["SET", "k305", "f", "EX", "1000"], "+QUEUED\r\n");
    expect_text(
        &mut c,
        &["EXEC"],
        "*5\r\n+OK\r\n+OK\r\n+OK\r\n+OK\r\n+OK\r\n",
    );
    assert_eq!(
        info_field(s, "lavik_parked_commands"),
        parked,
        "an EXEC of blind writes parked for reads it does not need"
    );
    assert_eq!(
        info_field(s, "lavik_sync_reads"),
        sync,
        "an EXEC of blind writes read the device synchronously"
    );
    for (k, v) in [
        ("k300", "a"),
        ("k301", "b"),
        ("k302", "c"),
        ("k303", "d"),
        ("k304", "e"),
        ("k305", "f"),
    ] {
        expect_text(&mut c, &["GET", k], &bulk(v));
    }
    // A non-blind command on one of the keys still makes EXEC wait for its record.
    assert_parks(s, "SET NX inside MULTI/EXEC", || {
        expect_text(&mut c, &["MULTI"], "+OK\r\n");
        expect_text(&mut c, &["SET", "k310", "x"], "+QUEUED\r\n");
        expect_text(&mut c, &["SET", "k311", "y", "NX"], "+QUEUED\r\n");
        expect_text(&mut c, &["EXEC"], "*2\r\n+OK\r\n$-1\r\n");
    });
}

// While one connection's EXEC waits for a (deliberately slow) device read, another
// connection on the same, only worker is served; the EXEC then answers in full.
#[test]
fn parked_exec_does_not_stall_the_worker() {
    let delay = READ_DELAY_MS.to_string();
    let s = Server::start(
        "txn-async-stall",
        &[
            "--threads",
            "1",
            "--cache-size",
            "0",
            "--debug-read-delay-ms",
            &delay,
        ],
    );
    fill(&s);
    let mut other = s.raw();
    expect_text(&mut other, &["SET", "hot", "staged"], "+OK\r\n");
    let parked_before = info_field(&s, "lavik_parked_commands");
    let sync_before = info_field(&s, "lavik_sync_reads");

    let mut slow = s.raw();
    expect_text(&mut slow, &["MULTI"], "+OK\r\n");
    expect_text(&mut slow, &["GET", "k0"], "+QUEUED\r\n");
    expect_text(&mut slow, &["INCR", "counter"], "+QUEUED\r\n");
    let sent = Instant::now();
    slow.cmd(&[b"EXEC"]);
    // Wait until the EXEC is parked (INFO answering at all shows the worker is free).
    let deadline = Instant::now() + Duration::from_secs(60);
    while info_field(&s, "lavik_parked_commands") == parked_before {
        assert!(Instant::now() < deadline, "EXEC never parked");
        std::thread::sleep(Duration::from_millis(5));
    }
    expect_text(&mut other, &["PING"], "+PONG\r\n");
    expect_text(&mut other, &["GET", "hot"], &bulk("staged"));
    // The EXEC's read is held back READ_DELAY_MS from its submission, after `sent`: if the
    // other connection was answered sooner than that, the EXEC cannot have answered yet
    // (a blocking EXEC would have, with a synchronous read the delay does not hold back).
    if sent.elapsed() < Duration::from_millis(READ_DELAY_MS) {
        slow.s.set_nonblocking(true).unwrap();
        let mut tmp = [0u8; 16];
        assert!(
            matches!(slow.s.read(&mut tmp), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the EXEC answered before the other connection's commands"
        );
        slow.s.set_nonblocking(false).unwrap();
    }
    let want = format!("*2\r\n{}:1\r\n", old_value());
    assert_eq!(String::from_utf8_lossy(&slow.read_exact(want.len())), want);
    assert_eq!(
        info_field(&s, "lavik_sync_reads"),
        sync_before,
        "EXEC read synchronously"
    );
}

// With appendfsync always, a parked EXEC that writes still holds its reply until the write
// is durable (the test-only sync delay shows the hold: a lower bound, not a race), and the
// write survives SIGKILL.
#[test]
fn parked_exec_reply_waits_for_durability() {
    let mut s = Server::start(
        "txn-async-durable",
        &[
            "--threads",
            "1",
            "--cache-size",
            "0",
            "--appendfsync",
            "always",
            "--debug-sync-delay-ms",
            "300",
            "--flush-max-ms",
            "60000",
        ],
    );
    fill_batched(&s, 4000);
    let mut c = s.raw();
    assert_parks(&s, "MULTI/EXEC", || {
        expect_text(&mut c, &["MULTI"], "+OK\r\n");
        expect_text(&mut c, &["STRLEN", "k5"], "+QUEUED\r\n");
        expect_text(&mut c, &["SET", "k5", "durable"], "+QUEUED\r\n");
        let t0 = Instant::now();
        expect_text(
            &mut c,
            &["EXEC"],
            &format!("*2\r\n:{VALUE_BYTES}\r\n+OK\r\n"),
        );
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(290),
            "EXEC answered after {took:?}"
        );
    });
    s.kill9();
    s.restart_after_kill();
    expect_text(&mut s.raw(), &["GET", "k5"], &bulk("durable"));
}

/// The test-only read delay of the cross-worker test.
const CROSS_DELAY_MS: u64 = 1000;

/// Redis Cluster's key slot: CRC16/XMODEM of the key mod 16384 (no hash tags here).
fn key_slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in key.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The worker owning `key` with `--threads 2` (eight shards: shard = slot % 8, worker =
/// shard % 2).
fn worker_of(key: &str) -> usize {
    usize::from(key_slot(key) % 8 % 2)
}

/// `n` names `{prefix}{i}` owned by worker `w`, lowest `i` first.
fn names_on(w: usize, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| worker_of(k) == w)
        .take(n)
        .collect()
}

// With two workers, the cache off and a slow device, cross-worker WATCH, MULTI/EXEC and
// EVAL over device-resident keys have their records fetched by the owning workers before
// the coordinated pass: while the EXEC waits, PING and GETs of keys of both workers are
// answered; no pass waits for the device (lavik_batch_read_waits stays 0, no synchronous
// read), lavik_cross_prefetches counts the prefetches, and the replies and WATCH outcomes
// are Redis's.
#[test]
fn cross_worker_exec_waits_outside_the_pass() {
    assert_eq!(key_slot("foo"), 12182, "Redis's documented slot of 'foo'");
    let delay = CROSS_DELAY_MS.to_string();
    let s = Server::start(
        "txn-async-cross",
        &[
            "--threads",
            "2",
            "--cache-size",
            "0",
            "--debug-read-delay-ms",
            &delay,
        ],
    );
    fill(&s);
    let (a, b) = (names_on(0, "k", 5), names_on(1, "k", 5));
    let (hot_a, hot_b) = (&names_on(0, "hot", 1)[0], &names_on(1, "hot", 1)[0]);
    let old = old_value();
    let mut other = s.raw();
    expect_text(&mut other, &["SET", hot_a, "a"], "+OK\r\n");
    expect_text(&mut other, &["SET", hot_b, "b"], "+OK\r\n");
    let waits = info_field(&s, "lavik_batch_read_waits");
    let sync = info_field(&s, "lavik_sync_reads");
    let prefetches = info_field(&s, "lavik_cross_prefetches");

    // WATCH of keys on both workers, then a transaction over both workers' device keys.
    let mut slow = s.raw();
    expect_text(&mut slow, &["WATCH", &a[0], &b[0]], "+OK\r\n");
    expect_text(&mut slow, &["MULTI"], "+OK\r\n");
    expect_text(&mut slow, &["GET", &a[1]], "+QUEUED\r\n");
    expect_text(&mut slow, &["STRLEN", &b[1]], "+QUEUED\r\n");
    expect_text(&mut slow, &["SET", &b[0], "new"], "+QUEUED\r\n");
    expect_text(&mut slow, &["GET", &b[0]], "+QUEUED\r\n");
    let prefetches_before_exec = info_field(&s, "lavik_cross_prefetches");
    let sent = Instant::now();
    slow.cmd(&[b"EXEC"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while info_field(&s, "lavik_cross_prefetches") == prefetches_before_exec {
        assert!(Instant::now() < deadline, "EXEC never prefetched");
        std::thread::sleep(Duration::from_millis(5));
    }
    expect_text(&mut other, &["PING"], "+PONG\r\n");
    expect_text(&mut other, &["GET", hot_a], &bulk("a"));
    expect_text(&mut other, &["GET", hot_b], &bulk("b"));
    // The EXEC's reads are held back CROSS_DELAY_MS after `sent`: answered sooner than
    // that, the other connection's commands cannot have waited for the EXEC's reads.
    if sent.elapsed() < Duration::from_millis(CROSS_DELAY_MS) {
        slow.s.set_nonblocking(true).unwrap();
        let mut tmp = [0u8; 16];
        assert!(
            matches!(slow.s.read(&mut tmp), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the EXEC answered before the other connection's commands"
        );
        slow.s.set_nonblocking(false).unwrap();
    }
    let want = format!("*4\r\n{old}:{VALUE_BYTES}\r\n+OK\r\n{}", bulk("new"));
    assert_eq!(String::from_utf8_lossy(&slow.read_exact(want.len())), want);

    // A watched key of the other worker touched before EXEC: a null array, nothing applied.
    expect_text(&mut slow, &["WATCH", &a[2], &b[2]], "+OK\r\n");
    expect_text(
        &mut other,
        &["APPEND", &b[2], "!"],
        &format!(":{}\r\n", VALUE_BYTES + 1),
    );
    expect_text(&mut slow, &["MULTI"], "+OK\r\n");
    expect_text(&mut slow, &["SET", &a[3], "lost"], "+QUEUED\r\n");
    expect_text(&mut slow, &["STRLEN", &b[3]], "+QUEUED\r\n");
    expect_text(&mut slow, &["EXEC"], "*-1\r\n");
    expect_text(
        &mut other,
        &["STRLEN", &a[3]],
        &format!(":{VALUE_BYTES}\r\n"),
    );

    // A script over both workers' device keys.
    let script = "return redis.call('STRLEN', KEYS[1]) + #redis.call('GET', KEYS[2])";
    expect_text(
        &mut slow,
        &["EVAL", script, "2", &a[4], &b[4]],
        &format!(":{}\r\n", 2 * VALUE_BYTES),
    );

    assert_eq!(
        info_field(&s, "lavik_batch_read_waits"),
        waits,
        "a coordinated pass waited for the device"
    );
    assert_eq!(
        info_field(&s, "lavik_sync_reads"),
        sync,
        "a cross-worker command read synchronously"
    );
    // Two WATCHes, two EXECs and the EVAL each had records fetched first.
    assert!(info_field(&s, "lavik_cross_prefetches") >= prefetches + 5);
}
