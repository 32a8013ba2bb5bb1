//! Full-scan recovery (no checkpoint) through the real server: exact after SIGKILL mid-load
//! with overwrites, deletes, TTLs, multi-shard MSETs and forced index collisions, and
//! without per-record device reads (the "recovery scan done" log line counts them).
mod common;
use common::{Raw, Server};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Index hash mask: 4 distinct index hashes, so most keys of a shard share their hash.
const HASH_MASK: u64 = 0xC000_0000_0000_0000;
/// Keys per connection.
const KEYS_PER_CONN: u64 = 60;
const CONNS: u64 = 4;

/// What a key holds: its value and whether it has a TTL; `None` = absent.
type State = Option<(Vec<u8>, bool)>;

fn key_name(conn: u64, i: u64) -> String {
    // Two hash tags on different shards (slots 15495 and 3300): most keys share a shard,
    // so it spans several 1 MiB blocks, and an MSET of both tags is a multi-shard group.
    let tag = if i.is_multiple_of(5) { "b" } else { "a" };
    format!("{{{tag}}}:c{conn}:{i}")
}

fn value(conn: u64, i: u64, version: u64) -> Vec<u8> {
    let len = 200 + (i * 7919 + version * 104_729) % 2500;
    (0..len)
        .map(|j| b'a' + ((conn + i + j + version) % 26) as u8)
        .collect()
}

fn bulk(arg: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", arg.len()).into_bytes();
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
    out
}

fn request(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(bulk(a));
    }
    out
}

/// One connection's load: a seeded sequence of SET, SET EX, DEL and two-key MSET on its own
/// keys, one command at a time. Returns the acknowledged states and the writes of the one
/// command that may have been in flight when the server died.
fn load(
    port: u16,
    conn: u64,
    round: u64,
    mut model: HashMap<String, State>,
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> (HashMap<String, State>, Vec<(String, State)>) {
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (model, Vec::new());
    };
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (conn << 32) ^ round;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut version = round * 1_000_000;
    use std::io::{Read, Write};
    while !stop.load(Ordering::SeqCst) {
        version += 1;
        let i = next() % KEYS_PER_CONN;
        let k = key_name(conn, i);
        let op = next() % 10;
        let (req, writes, reply): (Vec<u8>, Vec<(String, State)>, &[u8]) = match op {
            0..=4 => {
                let v = value(conn, i, version);
                let req = request(&[b"SET", k.as_bytes(), &v]);
                (req, vec![(k, Some((v, false)))], b"+OK\r\n")
            }
            5 => {
                let v = value(conn, i, version);
                let req = request(&[b"SET", k.as_bytes(), &v, b"EX", b"100000"]);
                (req, vec![(k, Some((v, true)))], b"+OK\r\n")
            }
            6 | 7 => {
                // DEL's reply is the count: the model knows it.
                let had = model.get(&k).is_some_and(|s| s.is_some());
                let reply: &[u8] = if had { b":1\r\n" } else { b":0\r\n" };
                (request(&[b"DEL", k.as_bytes()]), vec![(k, None)], reply)
            }
            _ => {
                // One key of each tag: usually a group across two shards.
                let j = (next() % (KEYS_PER_CONN / 5)) * 5;
                let i2 = if i.is_multiple_of(5) { i + 1 } else { i };
                let (ka, kb) = (key_name(conn, i2 % KEYS_PER_CONN), key_name(conn, j));
                if ka == kb {
                    continue;
                }
                let (va, vb) = (value(conn, i2, version), value(conn, j, version + 7));
                let req = request(&[b"MSET", ka.as_bytes(), &va, kb.as_bytes(), &vb]);
                (
                    req,
                    vec![(ka, Some((va, false))), (kb, Some((vb, false)))],
                    b"+OK\r\n",
                )
            }
        };
        if c.write_all(&req).is_err() {
            return (model, writes);
        }
        let mut got = vec![0u8; reply.len()];
        if c.read_exact(&mut got).is_err() {
            return (model, writes);
        }
        assert_eq!(
            got,
            reply,
            "reply to {}",
            String::from_utf8_lossy(&req[..40])
        );
        for (k, s) in writes {
            model.insert(k, s);
        }
        acked.fetch_add(1, Ordering::SeqCst);
    }
    (model, Vec::new())
}

/// A field `name=N` of the "recovery scan done" log line.
fn scan_field(log: &str, name: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("recovery scan done"))
        .unwrap_or_else(|| panic!("no recovery scan line in the log:\n{log}"));
    let at = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("no {name} in {line}"));
    line[at + name.len() + 2..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn get(c: &mut Raw, key: &str) -> Option<Vec<u8>> {
    c.cmd(&[b"GET", key.as_bytes()]);
    let mut head = Vec::new();
    loop {
        head.extend(c.read_exact(1));
        if head.ends_with(b"\r\n") {
            break;
        }
    }
    let head = String::from_utf8(head).unwrap();
    let n: i64 = head[1..head.len() - 2].parse().unwrap();
    if n < 0 {
        return None;
    }
    let body = c.read_exact(n as usize + 2);
    Some(body[..n as usize].to_vec())
}

// After SIGKILL mid-load (overwrites, deletes, TTLs, multi-shard MSETs, index hashes forced to
// collide), a full-scan restart has every key's acknowledged value or its in-flight one (both
// keys of an in-flight MSET together), an exact DBSIZE and expires count, and the recovery
// read no record on its own (random_reads=0: no big values here).
#[test]
fn sigkill_recovery_is_exact_and_reads_no_record() {
    let mask = HASH_MASK.to_string();
    let mut s = Server::start(
        "recovery-scan",
        &[
            "--appendfsync",
            "always",
            "--debug-hash-mask",
            &mask,
            "--cache-size",
            "0",
            // Overwritten blocks stay, so the scan meets old versions in other blocks.
            "--defrag-paused",
        ],
    );
    let mut models: Vec<HashMap<String, State>> = (0..CONNS).map(|_| HashMap::new()).collect();
    for round in 0..2u64 {
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = models
            .drain(..)
            .enumerate()
            .map(|(conn, m)| {
                let (a, st, port) = (acked.clone(), stop.clone(), s.port);
                std::thread::spawn(move || load(port, conn as u64, round, m, a, st))
            })
            .collect();
        // Kill mid-load, once enough writes were acknowledged to span several blocks.
        let deadline = Instant::now() + Duration::from_secs(120);
        while acked.load(Ordering::SeqCst) < 1500 {
            assert!(Instant::now() < deadline, "load too slow");
            std::thread::sleep(Duration::from_millis(10));
        }
        s.kill9();
        stop.store(true, Ordering::SeqCst);
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        s.restart_after_kill();
        let log = s.stderr();
        assert_eq!(scan_field(&log, "random_reads"), 0, "round {round}: {log}");
        assert!(scan_field(&log, "records") >= 1200, "round {round}: {log}");
        assert!(scan_field(&log, "blocks_read") >= 3, "round {round}: {log}");

        let mut c = s.raw();
        let (mut present, mut volatile) = (0u64, 0u64);
        for (conn, (mut model, in_flight)) in results.into_iter().enumerate() {
            let keys: Vec<String> = (0..KEYS_PER_CONN)
                .map(|i| key_name(conn as u64, i))
                .collect();
            let got: HashMap<String, Option<Vec<u8>>> =
                keys.iter().map(|k| (k.clone(), get(&mut c, k))).collect();
            let is = |k: &str, st: &State| st.as_ref().map(|v| &v.0) == got[k].as_ref();
            // Whether the in-flight command landed: every key must agree (MSET is atomic).
            let mut landed: Option<bool> = None;
            for (k, new) in &in_flight {
                let old = model.get(k).cloned().flatten();
                let (o, n) = (is(k, &old), is(k, new));
                assert!(
                    o || n,
                    "{k} (round {round}): neither the acked nor the in-flight value"
                );
                if o != n {
                    assert!(landed.is_none_or(|l| l == n), "{k}: half of an MSET landed");
                    landed = Some(n);
                }
            }
            if landed == Some(true) {
                for (k, new) in in_flight {
                    model.insert(k, new);
                }
            }
            for k in &keys {
                let st = model.get(k).cloned().flatten();
                assert!(is(k, &st), "{k} (round {round}): wrong value after restart");
                if let Some((_, ttl)) = st {
                    present += 1;
                    volatile += u64::from(ttl);
                }
            }
            models.push(model);
        }
        c.expect(&[b"DBSIZE"], format!(":{present}\r\n").as_bytes());
        let info = c.bulk(&[b"INFO", b"keyspace"]);
        let want = format!("db0:keys={present},expires={volatile}");
        assert!(
            info.lines()
                .any(|l| l == want || l.starts_with(&format!("{want},"))),
            "round {round}: want {want} in {info}"
        );
    }
}
