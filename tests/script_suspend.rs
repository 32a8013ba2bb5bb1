//! A script that reads pages of a paged collection *after* its first write (issue 15,
//! `docs/scripting.md`, "Not done yet"): the acceptance tests of the suspended run. Both
//! are `#[ignore]`d until the suspension is built: today the page is read synchronously
//! (`lavik_sync_reads` grows; with the device held the whole worker stalls). Checked on
//! this tree: the first fails on its `sync_reads` assertion ("hash": 12 vs 11, after its
//! replies matched redis-server's), the second on the read timeout of the INFO it polls
//! while the script waits (the worker is stuck in the synchronous read). Run them with
//! `cargo test -p lavik --test script_suspend -- --ignored`.
mod common;
use common::diff::Pair;
use common::Server;

/// Bytes of each value and member: leaves of 4-8 KiB hold 20-40 of them.
const PAD: usize = 200;
const FIELDS: usize = 3_000;
const BATCH: usize = 1_000;

fn padded(prefix: &str, i: usize) -> String {
    let s = format!("{prefix}:{i}:");
    format!("{s}{}", "x".repeat(PAD - s.len()))
}

fn sync_reads(s: &Server) -> u64 {
    s.info_u64("stats", "lavik_sync_reads")
}

/// Redis Cluster's key slot (CRC16/XMODEM of the key or its hash tag, mod 16384): lavik's
/// shard of a key is its slot mod `lavik_shards`.
fn key_slot(key: &[u8]) -> u16 {
    let k = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in k {
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

/// A script writes, then reads pages of a paged hash and a paged sorted set that are on
/// the device (`--cache-size 0`, after a restart): replies equal redis-server's and no
/// page is read synchronously.
#[test]
#[ignore = "issue 15: the suspended script run is not built yet (docs/scripting.md)"]
fn script_reading_pages_after_a_write_reads_none_synchronously() {
    let mut p = Pair::start(
        "script-suspend",
        &["--threads", "1", "--cache-size", "0", "--defrag-paused"],
    );
    let mut pairs = Vec::new();
    let mut members = Vec::new();
    for i in 0..FIELDS {
        pairs.push(format!("f{i}"));
        pairs.push(padded("v", i));
        members.push(i.to_string());
        members.push(padded("m", i));
    }
    for chunk in pairs.chunks(BATCH) {
        let mut args = vec!["HSET", "h"];
        args.extend(chunk.iter().map(|s| s.as_str()));
        p.check(&args);
    }
    for chunk in members.chunks(BATCH) {
        let mut args = vec!["ZADD", "z"];
        args.extend(chunk.iter().map(|s| s.as_str()));
        p.check(&args);
    }
    p.lavik.restart();
    p.l = common::diff::RespConn::connect(p.lavik.port);

    let hash = "redis.call('HSET', KEYS[1], 'new', ARGV[2]) \
                local a = redis.call('HGET', KEYS[1], ARGV[1]) \
                local n = redis.call('HLEN', KEYS[1]) \
                return {a, n, redis.call('HGET', KEYS[1], 'new')}";
    let zset = "redis.call('ZADD', KEYS[1], -1, 'first') \
                local r = redis.call('ZRANGE', KEYS[1], 1500, 1502, 'WITHSCORES') \
                table.insert(r, redis.call('ZSCORE', KEYS[1], ARGV[1])) \
                return r";
    let whole = "redis.call('HSET', KEYS[1], 'f0', 'changed') \
                 return #redis.call('HGETALL', KEYS[1])";
    let cases: [(&str, Vec<&str>); 3] = [
        ("hash", vec!["EVAL", hash, "1", "h", "f2500", "x"]),
        (
            "sorted set",
            vec!["EVAL", zset, "1", "z", &members[2 * 2900 + 1]],
        ),
        ("whole hash", vec!["EVAL", whole, "1", "h"]),
    ];
    for (what, args) in cases {
        let before = sync_reads(&p.lavik);
        p.check(&args);
        assert_eq!(
            sync_reads(&p.lavik),
            before,
            "{what}: a page read synchronously after the script's write"
        );
    }
    p.check(&["HGET", "h", "f0"]);
    p.check(&["ZRANGE", "z", "0", "1", "WITHSCORES"]);
}

/// While the run waits for a page after its first write (the device held: no read
/// completes), the same worker answers a PING and a GET of a key on another shard; a
/// command on the script's key waits and then sees the script's final value, never the
/// partial one. Released, the script answers what redis-server answers.
#[test]
#[ignore = "issue 15: the suspended script run is not built yet (docs/scripting.md)"]
fn suspended_script_lets_its_worker_serve_other_shards() {
    let dir = common::temp_dir("script-suspend-hold");
    let hold = dir.join("hold");
    let hold_arg = hold.display().to_string();
    let mut s = Server::start_in(
        dir.clone(),
        &[
            "--threads",
            "1",
            // A cache, so that the path to f0 (read just before) is in memory and the
            // script's first wait comes after its write; f2500's leaf is never read
            // before the script.
            "--cache-size",
            "64mb",
            "--defrag-paused",
            "--debug-async-device-hold",
            &hold_arg,
        ],
    );
    let r = common::diff::Redis::start("script-suspend-hold");
    let mut rc = common::diff::RespConn::connect(r.port);
    let mut c = s.raw();
    let mut pairs: Vec<String> = Vec::new();
    for i in 0..FIELDS {
        pairs.push(format!("f{i}"));
        pairs.push(padded("v", i));
    }
    for chunk in pairs.chunks(BATCH) {
        let mut args: Vec<&[u8]> = vec![b"HSET", b"h"];
        args.extend(chunk.iter().map(|s| s.as_bytes()));
        c.expect(&args, b":500\r\n");
        rc.call(&args);
    }
    // A key on another shard of the (only) worker.
    let shards = s.info_u64("storage", "lavik_shards");
    assert!(shards > 1, "one shard: nothing to tell apart");
    let shard = |k: &[u8]| u64::from(key_slot(k)) % shards;
    let other = (0..)
        .map(|i| format!("other{i}"))
        .find(|k| shard(k.as_bytes()) != shard(b"h"))
        .unwrap();
    c.expect(&[b"SET", other.as_bytes(), b"o"], b"+OK\r\n");
    // After a restart the cache is empty. What the script's first write needs (f0's path:
    // root, directory page, leaf, and what HSET reads besides) is brought into it by the
    // same write, and `other` by a GET; f2500's leaf stays on the device only, so the
    // script's first wait comes after its write.
    s.restart();
    let mut c = s.raw();
    c.expect(&[b"HSET", b"h", b"f0", b"v0"], b":0\r\n");
    rc.call(&[b"HSET", b"h", b"f0", b"v0"]);
    c.expect(&[b"GET", other.as_bytes()], b"$1\r\no\r\n");
    let sync_before = sync_reads(&s);
    let parked_before = s.info_u64("stats", "lavik_parked_commands");

    std::fs::write(&hold, b"").unwrap();
    let script = "redis.call('HSET', KEYS[1], 'f0', 'partial') \
                  local v = redis.call('HGET', KEYS[1], ARGV[1]) \
                  redis.call('HSET', KEYS[1], 'f0', 'final') \
                  return v";
    let eval: [&[u8]; 5] = [b"EVAL", script.as_bytes(), b"1", b"h", b"f2500"];
    let mut slow = s.raw();
    slow.cmd(&eval);
    // The run wrote f0 and waits for f2500's leaf: a parked entry (INFO is answered by
    // the same worker meanwhile; with a synchronous read it is not, and this fails).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut other_conn = s.raw();
    while s.info_u64("stats", "lavik_parked_commands") == parked_before {
        assert!(
            std::time::Instant::now() < deadline,
            "the script never waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    other_conn.expect(&[b"PING"], b"+PONG\r\n");
    other_conn.expect(&[b"GET", other.as_bytes()], b"$1\r\no\r\n");
    let mut same = s.raw();
    same.cmd(&[b"HGET", b"h", b"f0"]);
    assert!(slow.nothing_arrived(), "the script answered while held");
    assert!(
        same.nothing_arrived(),
        "a command on the script's shard ran while the script was suspended"
    );

    std::fs::remove_file(&hold).unwrap();
    let want = rc.call(&eval);
    assert_eq!(
        String::from_utf8_lossy(&slow.read_exact(want.len())),
        String::from_utf8_lossy(&want)
    );
    assert_eq!(
        same.read_exact(b"$5\r\nfinal\r\n".len()),
        b"$5\r\nfinal\r\n"
    );
    assert_eq!(sync_reads(&s), sync_before, "the script read synchronously");
}
