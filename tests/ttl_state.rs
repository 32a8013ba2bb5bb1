//! TTL state: active expiry keeps up with a mass expiry, and (ignored, a measurement) the
//! RAM the TTL state costs per key. See `docs/benchmarks/ttl-state/README.md`.
mod common;

use common::Server;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn info_field(c: &mut redis::Connection, section: &str, field: &str) -> String {
    let text: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .to_string()
}

fn info_u64(c: &mut redis::Connection, section: &str, field: &str) -> u64 {
    info_field(c, section, field).parse().unwrap()
}

/// Sum over the `shardN:` lines of INFO storage of one `name=value` field.
fn shard_sum(c: &mut redis::Connection, name: &str) -> u64 {
    let text: String = redis::cmd("INFO").arg("storage").query(c).unwrap();
    text.lines()
        .filter(|l| l.starts_with("shard"))
        .flat_map(|l| l.split([':', ',']))
        .filter_map(|kv| kv.trim().strip_prefix(&format!("{name}=")))
        .map(|v| v.parse::<u64>().unwrap())
        .sum()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Loads `n` keys `prefix:i` with `extra` arguments after the value, pipelined.
fn load(c: &mut redis::Connection, prefix: &str, n: u64, extra: &[String]) {
    let batch = 5000;
    let mut i = 0;
    while i < n {
        let mut p = redis::pipe();
        for j in i..(i + batch).min(n) {
            p.cmd("SET")
                .arg(format!("{prefix}:{j}"))
                .arg("v")
                .arg(extra)
                .ignore();
        }
        p.query::<()>(c).unwrap();
        i += batch;
    }
}

// Proves active expiry reclaims 200k keys that all expire in the same second within a bound
// (DBSIZE 0, the shards' expired_keys 200k, no TTL entries left, keyspace line gone) while no expired key
// is ever served. Ignored: with the default `--background-budget-us 10` a worker's rounds
// give active expiry about one key per shard per round, ~300 keys/s on an idle server
// (measured on the release build), so this takes ~70 s in debug (helped by the probes'
// lazy expiry) and does not meet 100k/s; see docs/benchmarks/ttl-state/README.md.
#[test]
#[ignore]
fn mass_expiry_is_reclaimed_and_never_served() {
    let n = 200_000u64;
    let s = Server::start("ttl-mass", &[]);
    let mut c = s.client();
    // One deadline for every key, far enough ahead to finish loading: twice the load time
    // projected from a warm-up of n/20 keys in db 1 (a debug build on a busy machine is slow).
    let warm = Instant::now();
    redis::cmd("SELECT").arg(1).query::<()>(&mut c).unwrap();
    load(&mut c, "w", n / 20, &[]);
    redis::cmd("SELECT").arg(0).query::<()>(&mut c).unwrap();
    let projected = warm.elapsed().as_millis() as u64 * 20;
    let t0 = now_ms();
    let deadline = t0 + 2 * projected + 3000;
    load(&mut c, "m", n, &["PXAT".into(), deadline.to_string()]);
    let loaded = now_ms();
    assert!(loaded < deadline, "load took {} ms", loaded - t0);
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, n);
    assert_eq!(
        info_field(&mut c, "keyspace", "db0"),
        format!("keys={n},expires={n}")
    );
    assert_eq!(shard_sum(&mut c, "volatile_entries"), n);
    // Before the deadline the keys are served.
    let v: Option<String> = redis::cmd("GET").arg("m:12345").query(&mut c).unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    while now_ms() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // From now on no key may be served, while expiry drains them. The bound is what today's
    // background budget allows (see above), not the 100k keys/s goal (that would be 2 s).
    let bound = Duration::from_secs(180);
    let started = Instant::now();
    let mut probe = 7u64;
    loop {
        let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        let expired = shard_sum(&mut c, "expired_keys");
        if dbsize == 0 {
            assert_eq!(expired, n);
            assert_eq!(shard_sum(&mut c, "volatile_entries"), 0);
            break;
        }
        assert!(
            started.elapsed() < bound,
            "not reclaimed in {bound:?}: dbsize {dbsize}, expired_keys {expired}"
        );
        let mut p = redis::pipe();
        for _ in 0..50 {
            probe = probe
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            p.cmd("EXISTS").arg(format!("m:{}", (probe >> 20) % n));
        }
        let hits: Vec<u64> = p.query(&mut c).unwrap();
        assert!(hits.iter().all(|&h| h == 0), "an expired key was served");
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = started.elapsed();
    eprintln!("200k keys reclaimed {took:?} after their deadline");
    let ks: String = redis::cmd("INFO").arg("keyspace").query(&mut c).unwrap();
    assert!(!ks.contains("db0:"), "keyspace: {ks}");
}

fn start_binary(bin: &str, dir: &std::path::Path, port: u16) -> std::process::Child {
    std::process::Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--data-file",
            &dir.join("lavik.data").display().to_string(),
            "--data-file-size",
            "2gb",
            "--no-pin-workers",
        ])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start lavik")
}

fn connect(port: u16) -> redis::Connection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(cl) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) {
            if let Ok(mut c) = cl.get_connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return c;
                }
            }
        }
        assert!(Instant::now() < deadline, "server did not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Measurement, not a check: used_memory per key for 1M keys with `EX 86400` and 1M without,
// each in a fresh server. Binary: $LAVIK_BIN (e.g. target/release/lavik), else the test build.
#[test]
#[ignore]
fn used_memory_per_key() {
    let bin = std::env::var("LAVIK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_lavik").into());
    let n: u64 = std::env::var("TTL_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    for (label, extra) in [
        ("EX 86400", vec!["EX".to_string(), "86400".to_string()]),
        ("no TTL", vec![]),
    ] {
        let dir = common::temp_dir("ttl-mem");
        let port = common::free_port();
        let mut child = start_binary(&bin, &dir, port);
        let mut c = connect(port);
        let before = info_u64(&mut c, "memory", "used_memory");
        load(&mut c, "key", n, &extra);
        let after = info_u64(&mut c, "memory", "used_memory");
        let index = shard_sum(&mut c, "index_bytes");
        let expiry = shard_sum(&mut c, "expiry_bytes");
        let volatile = shard_sum(&mut c, "volatile_entries");
        let ks = info_field(&mut c, "keyspace", "db0");
        println!(
            "{label}: {n} keys ({ks}, {volatile} volatile), used_memory {before} -> {after}: \
             {:.2} B/key; index {:.2} B/key, TTL state {:.2} B/key",
            (after - before) as f64 / n as f64,
            index as f64 / n as f64,
            expiry as f64 / n as f64,
        );
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
