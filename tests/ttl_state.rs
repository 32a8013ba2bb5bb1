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

// Proves active expiry reclaims a mass expiry of 200k keys (all due within the load's few
// seconds of each other) promptly, counted in work rather than time: DBSIZE reaches 0 with
// exactly 200k `expired_keys` (INFO stats and the shards' sum), no TTL entry left, the
// keyspace line gone, no expired key served while the rest drain, and with the record cache
// off the device reads it took stay under one per 16 keys (runs of due records sharing a
// block are read at once; one read per key before). Fails without batching (~200k reads).
#[test]
fn mass_expiry_is_reclaimed_and_never_served() {
    let n = 200_000u64;
    let s = Server::start("ttl-mass", &["--cache-size", "0"]);
    let mut c = s.client();
    // One TTL for every key, long enough to finish loading: twice the load time projected
    // from a warm-up of n/20 keys in db 1, plus 3 s.
    let warm = Instant::now();
    redis::cmd("SELECT").arg(1).query::<()>(&mut c).unwrap();
    load(&mut c, "w", n / 20, &[]);
    redis::cmd("SELECT").arg(0).query::<()>(&mut c).unwrap();
    let ttl = warm.elapsed().as_millis() as u64 * 40 + 3000;
    // Per batch of `BATCH` keys: when its replies had arrived. The server set each deadline
    // (its time + ttl) before replying, so a batch is due once that time + ttl has passed.
    const BATCH: u64 = 5000;
    let mut done_ms = Vec::new();
    let mut i = 0;
    while i < n {
        let mut p = redis::pipe();
        for j in i..(i + BATCH).min(n) {
            p.cmd("SET")
                .arg(format!("m:{j}"))
                .arg("v")
                .arg("PX")
                .arg(ttl)
                .ignore();
        }
        p.query::<()>(&mut c).unwrap();
        done_ms.push(now_ms());
        i += BATCH;
    }
    let all_due = done_ms[done_ms.len() - 1] + ttl + 1;
    let reads0 = shard_sum(&mut c, "device_reads");
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, n, "the load outran the TTL");
    assert_eq!(info_u64(&mut c, "stats", "expired_keys"), 0);
    assert_eq!(shard_sum(&mut c, "volatile_entries"), n);
    // From the first deadline until DBSIZE is 0: no key of a due batch may be served. The
    // bound only guards against a hang; the claim is the read count below.
    let guard = Duration::from_secs(300);
    let started = Instant::now();
    let mut probe = 7u64;
    let mut probes = 0u64;
    loop {
        let now = now_ms();
        let due_batches = done_ms.iter().take_while(|&&t| t + ttl < now).count() as u64;
        let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        if dbsize == 0 && now >= all_due {
            break;
        }
        assert!(
            started.elapsed() < guard,
            "not reclaimed in {guard:?}: dbsize {dbsize}"
        );
        if due_batches > 0 && probes < 4000 {
            let mut p = redis::pipe();
            for _ in 0..20 {
                probe = probe
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                p.cmd("EXISTS").arg(format!(
                    "m:{}",
                    (probe >> 20) % (due_batches * BATCH).min(n)
                ));
            }
            probes += 20;
            let hits: Vec<u64> = p.query(&mut c).unwrap();
            assert!(hits.iter().all(|&h| h == 0), "an expired key was served");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let reads = shard_sum(&mut c, "device_reads") - reads0;
    let span_reads = shard_sum(&mut c, "expiry_span_reads");
    eprintln!(
        "200k keys reclaimed {:?} after the load (TTL {ttl} ms): {reads} device reads ({span_reads} \
         span reads), {probes} probes",
        started.elapsed()
    );
    assert_eq!(info_u64(&mut c, "stats", "expired_keys"), n);
    assert_eq!(shard_sum(&mut c, "expired_keys"), n);
    assert_eq!(shard_sum(&mut c, "volatile_entries"), 0);
    assert!(
        reads <= n / 16 + 2 * probes,
        "{reads} device reads to expire {n} keys ({probes} probes)"
    );
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
        let port = std::env::var("TTL_PORT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(common::free_port);
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

// Measurement, not a check: active expiry throughput. $EXPIRY_KEYS keys (default 500k,
// value `v`) with PXAT deadlines spread evenly over $EXPIRY_SPREAD_MS (default 5000 ms;
// 100k keys/s), loaded before the first deadline, into a fresh idle server
// ($LAVIK_BIN, port $EXPIRY_PORT or a free one). Every 100 ms: keys due by the client's
// clock, INFO stats expired_keys, and the backlog (due − expired); at the end the rate over
// the spread and the time from the last deadline to DBSIZE 0.
// See docs/benchmarks/ttl-state/README.md.
#[test]
#[ignore]
fn active_expiry_throughput() {
    let bin = std::env::var("LAVIK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_lavik").into());
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("EXPIRY_KEYS", 500_000);
    let spread = env("EXPIRY_SPREAD_MS", 5000);
    let port = env("EXPIRY_PORT", u64::from(common::free_port())) as u16;
    let dir = common::temp_dir("ttl-rate");
    let mut child = start_binary(&bin, &dir, port);
    let mut c = connect(port);
    let t0 = now_ms() + 20_000;
    let deadline = |i: u64| t0 + i * spread / n;
    let batch = 5000;
    let mut i = 0;
    while i < n {
        let mut p = redis::pipe();
        for j in i..(i + batch).min(n) {
            p.cmd("SET")
                .arg(format!("e:{j}"))
                .arg("v")
                .arg("PXAT")
                .arg(deadline(j))
                .ignore();
        }
        p.query::<()>(&mut c).unwrap();
        i += batch;
    }
    let loaded = now_ms();
    assert!(loaded < t0, "load took past the first deadline");
    println!(
        "loaded {n} keys in {} ms before the first deadline",
        20_000 - (t0 - loaded)
    );
    while now_ms() < t0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut max_backlog = 0u64;
    let mut at_end: Option<(u64, u64)> = None;
    loop {
        let now = now_ms();
        let due = if now < t0 {
            0
        } else {
            (((now - t0) * n) / spread + 1).min(n)
        };
        let expired = info_u64(&mut c, "stats", "expired_keys");
        let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        let backlog = due.saturating_sub(expired);
        max_backlog = max_backlog.max(backlog);
        println!(
            "t={:+6} ms due={due:7} expired={expired:7} backlog={backlog:6} dbsize={dbsize}",
            now as i64 - t0 as i64
        );
        if at_end.is_none() && now >= t0 + spread {
            at_end = Some((now - t0, expired));
        }
        if dbsize == 0 || now > t0 + spread + 60_000 {
            let (end_t, end_expired) = at_end.unwrap_or((now - t0, expired));
            println!(
                "{n} keys over {spread} ms: {end_expired} expired by t={end_t} ms \
                 ({:.0} keys/s over the spread), max backlog {max_backlog}, DBSIZE {dbsize} \
                 {} ms after the last deadline",
                end_expired as f64 * 1000.0 / end_t as f64,
                now as i64 - (t0 + spread) as i64
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
