//! Differential tests of big hashes and sets (thousands of members: lavik stores them as
//! paged collections, `docs/collections.md` sections 2-5) against Debian's `redis-server`,
//! replies compared in RESP2 and RESP3. Hashtable-order replies are compared sorted; a
//! full HSCAN/SSCAN walk is compared as the set of elements returned.
//!
//! Also measures, through INFO's `lavik_device_write_bytes`, the device bytes one HSET or
//! SADD writes on a paged collection (the budget of `docs/collections.md` section 5).
mod common;
use common::diff::{frame_len, settled_write_bytes, sorted_elements, sorted_pairs, Pair, Rng};
use std::collections::BTreeSet;

/// The payloads of a flat aggregate reply, or of a map / array of 2-arrays, flattened.
fn elements(reply: &[u8]) -> Vec<Vec<u8>> {
    fn walk(b: &[u8], out: &mut Vec<Vec<u8>>) -> usize {
        let end = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let head = std::str::from_utf8(&b[1..end]).unwrap();
        match b[0] {
            b'$' if head.starts_with('-') => end + 2,
            b'$' => {
                let n: usize = head.parse().unwrap();
                out.push(b[end + 2..end + 2 + n].to_vec());
                end + 4 + n
            }
            b'*' | b'~' | b'%' => {
                let n: usize = head.parse().unwrap();
                let items = if b[0] == b'%' { 2 * n } else { n };
                let mut pos = end + 2;
                for _ in 0..items {
                    pos += walk(&b[pos..], out);
                }
                pos
            }
            _ => frame_len(b).unwrap(),
        }
    }
    let mut out = Vec::new();
    walk(reply, &mut out);
    out
}

/// Everything a full cursor walk returns, on one server.
fn scan_all(c: &mut common::diff::RespConn, cmd: &str, key: &str) -> BTreeSet<Vec<u8>> {
    let mut cursor = b"0".to_vec();
    let mut seen = BTreeSet::new();
    loop {
        let rep = c.call(&[cmd.as_bytes(), key.as_bytes(), &cursor, b"COUNT", b"50"]);
        let e = elements(&rep);
        cursor = e[0].clone();
        seen.extend(e[1..].iter().cloned());
        if cursor == b"0" {
            return seen;
        }
    }
}

fn field(i: u64) -> String {
    format!("field:{i}")
}

fn member(i: u64) -> String {
    format!("member:{i}")
}

/// Fills `h` and `s` with `n` elements, 200 per command.
fn fill(p: &mut Pair, h: &str, s: &str, n: u64) {
    for start in (0..n).step_by(200) {
        let mut hset = vec!["HSET".to_string(), h.to_string()];
        let mut sadd = vec!["SADD".to_string(), s.to_string()];
        for i in start..(start + 200).min(n) {
            hset.push(field(i));
            hset.push(format!("value-{i}"));
            sadd.push(member(i));
        }
        let a: Vec<&str> = hset.iter().map(|x| x.as_str()).collect();
        p.check(&a);
        let a: Vec<&str> = sadd.iter().map(|x| x.as_str()).collect();
        p.check(&a);
    }
}

fn whole_check(p: &mut Pair, h: &str, s: &str) {
    p.check(&["HLEN", h]);
    p.check(&["SCARD", s]);
    p.check_with(&["HGETALL", h], sorted_pairs);
    p.check_with(&["HKEYS", h], sorted_elements);
    p.check_with(&["SMEMBERS", s], sorted_elements);
    p.check(&["OBJECT", "ENCODING", h]);
    p.check(&["OBJECT", "ENCODING", s]);
    for (cmd, key) in [("HSCAN", h), ("SSCAN", s)] {
        let l = scan_all(&mut p.l, cmd, key);
        let r = scan_all(&mut p.r, cmd, key);
        assert_eq!(l, r, "{cmd} {key} walk");
    }
}

fn run(p: &mut Pair, seed: u64, tag: &str) {
    let (h, s, s2) = (
        format!("{tag}:{{b}}h"),
        format!("{tag}:{{b}}s"),
        format!("{tag}:{{b}}s2"),
    );
    let (h, s, s2) = (h.as_str(), s.as_str(), s2.as_str());
    fill(p, h, s, 3000);
    p.check(&["SADD", s2, &member(5), &member(17), "other"]);
    whole_check(p, h, s);
    let mut rng = Rng::new(seed);
    for _ in 0..300 {
        let i = rng.below(3600);
        let (f, m) = (field(i), member(i));
        match rng.below(20) {
            0 | 1 => p.check(&["HSET", h, &f, &format!("new-{}", rng.below(100))]),
            2 => p.check(&["HDEL", h, &f, &field(i + 1)]),
            3 => p.check(&["HGET", h, &f]),
            4 => p.check(&["HMGET", h, &f, &field(i + 7), "nope"]),
            5 => p.check(&["HINCRBY", h, &format!("n{}", i % 5), "3"]),
            6 => p.check(&["HSETNX", h, &f, "nx"]),
            7 => p.check(&["HEXISTS", h, &f]),
            8 => p.check(&["HSTRLEN", h, &f]),
            9 | 10 => p.check(&["SADD", s, &m, &member(i + 3600)]),
            11 => p.check(&["SREM", s, &m, &member(i + 1)]),
            12 => p.check(&["SISMEMBER", s, &m]),
            13 => p.check(&["SMISMEMBER", s, &m, "nope"]),
            14 => p.check_with(&["SINTER", s2, s], sorted_elements),
            // Single-member writes take the point path on a paged collection
            // (`paged::point_write`); the two-member forms above take the general one.
            15 => p.check(&["HDEL", h, &f]),
            16 => p.check(&["SADD", s, &m]),
            17 => p.check(&["SREM", s, &m]),
            18 => p.check(&["HMSET", h, &f, &format!("m-{}", rng.below(100))]),
            _ => p.check(&["SMOVE", s, s2, &m]),
        };
        if rng.chance(3) {
            p.check(&["HLEN", h]);
            p.check(&["SCARD", s]);
        }
    }
    // The point path's HINCRBY and HSETNX on a paged hash: a new field, an existing one,
    // a non-integer value, an overflow; HSETNX of a present and an absent field.
    p.check(&["HINCRBY", h, "counter", "5"]);
    p.check(&["HINCRBY", h, "counter", "-7"]);
    p.check(&["HINCRBY", h, &field(3), "1"]);
    p.check(&["HSET", h, "big", "9223372036854775800"]);
    p.check(&["HINCRBY", h, "big", "7"]);
    p.check(&["HINCRBY", h, "big", "1"]);
    p.check(&["HGET", h, "big"]);
    p.check(&["HSETNX", h, "counter", "x"]);
    p.check(&["HSETNX", h, "fresh-nx", "y"]);
    p.check(&["HGET", h, "fresh-nx"]);
    whole_check(p, h, s);
    partial_reads(p, h, s, s2, &mut rng);
    whole_check(p, h, s);
    // Whole-value keyspace commands on paged values.
    let (h2, s3) = (format!("{tag}:{{b}}h2"), format!("{tag}:{{b}}s3"));
    p.check(&["COPY", h, &h2]);
    p.check(&["RENAME", s, &s3]);
    p.check(&["EXISTS", s]);
    whole_check(p, &h2, &s3);
    p.check(&["HSET", &h2, "after-copy", "1"]);
    p.check(&["SADD", &s3, "after-rename"]);
    whole_check(p, &h2, &s3);
    // Shrink far enough that lavik folds the pages back into one record.
    let fields: Vec<String> = (0..3550).map(field).collect();
    for chunk in fields.chunks(400) {
        let mut a = vec!["HDEL", h];
        a.extend(chunk.iter().map(|x| x.as_str()));
        p.check(&a);
    }
    let members: Vec<String> = (0..7200).map(member).collect();
    for chunk in members.chunks(500) {
        let mut a = vec!["SREM", s3.as_str()];
        a.extend(
            chunk
                .iter()
                .map(|x| x.as_str())
                .filter(|m| *m != "member:3599"),
        );
        p.check(&a);
    }
    whole_check(p, h, &s3);
    p.check(&["TYPE", h]);
    // DUMP of a paged value restores in Redis (and Redis's DUMP in lavik) to the same contents.
    let (hd, sd) = (format!("{tag}:{{b}}hd"), format!("{tag}:{{b}}sd"));
    let from_lavik = bulk(&p.l.call(&[b"DUMP", h2.as_bytes()]));
    p.check_bytes(&[b"RESTORE", hd.as_bytes(), b"0", &from_lavik]);
    p.check_with(&["HGETALL", &hd], sorted_pairs);
    p.check(&["SADD", &sd, "seed"]);
    fill(p, &format!("{tag}:{{b}}tmp"), &sd, 2000);
    let from_redis = bulk(&p.r.call(&[b"DUMP", sd.as_bytes()]));
    p.check_bytes(&[b"RESTORE", sd.as_bytes(), b"0", &from_redis, b"REPLACE"]);
    p.check_with(&["SMEMBERS", &sd], sorted_elements);
    p.check(&["SADD", &sd, "after-restore"]);
    p.check(&["SCARD", &sd]);
    // Expiry of a paged value (lazy, on access), then DEL and FLUSHDB of paged values.
    p.check(&["PEXPIRE", &h2, "40"]);
    std::thread::sleep(std::time::Duration::from_millis(120));
    p.check(&["EXISTS", &h2]);
    p.check(&["HLEN", &h2]);
    p.check(&["DEL", h, &s3, s2, &hd]);
    p.check(&["DBSIZE"]);
    p.check(&["FLUSHDB"]);
    p.check(&["DBSIZE"]);
    p.check(&["SCARD", &sd]);
}

/// The commands that read only some pages of a paged collection (random picks, pops,
/// multi-key probes): random replies are checked for size, membership and distinctness
/// (Redis's own picks cannot match byte for byte), SPOP's pops are applied to Redis by
/// SREM so both stay equal; the rest is compared as usual.
fn partial_reads(p: &mut Pair, h: &str, s: &str, s2: &str, rng: &mut Rng) {
    let hlen = p.check(&["HLEN", h]);
    let n: i64 = String::from_utf8_lossy(&hlen[1..hlen.len() - 2])
        .parse()
        .unwrap();
    for count in ["1", "7", "-9", "200", "-3000", "100000", "0"] {
        let c: i64 = count.parse().unwrap();
        let want = if c < 0 { -c } else { c.min(n) } as usize;
        for with in [false, true] {
            let mut args = vec!["HRANDFIELD", h, count];
            if with {
                args.push("WITHVALUES");
            }
            let a: Vec<&[u8]> = args.iter().map(|x| x.as_bytes()).collect();
            let (l, r) = p.both(&a);
            let (le, re) = (elements(&l), elements(&r));
            assert_eq!(le.len(), re.len(), "{args:?} reply sizes");
            let per = if with { 2 } else { 1 };
            assert_eq!(le.len(), want * per, "{args:?}");
            let fields: Vec<&Vec<u8>> = le.iter().step_by(per).collect();
            if c >= 0 {
                let d: BTreeSet<&Vec<u8>> = fields.iter().copied().collect();
                assert_eq!(d.len(), fields.len(), "{args:?} distinct");
            }
            for (i, f) in fields.iter().enumerate().take(40) {
                let v = p.r.call(&[b"HGET", h.as_bytes(), f]);
                let v = elements(&v);
                assert_eq!(v.len(), 1, "{args:?}: {f:?} is a field");
                if with {
                    assert_eq!(v[0], le[i * 2 + 1], "{args:?}: value of {f:?}");
                }
            }
        }
        let (l, r) = p.both(&[b"SRANDMEMBER", s.as_bytes(), count.as_bytes()]);
        let (le, re) = (elements(&l), elements(&r));
        assert_eq!(le.len(), re.len(), "SRANDMEMBER {count}");
        for m in le.iter().take(40) {
            assert_eq!(p.r.call(&[b"SISMEMBER", s.as_bytes(), m]), b":1\r\n");
        }
    }
    let one = elements(&p.l.call(&[b"HRANDFIELD", h.as_bytes()]));
    assert_eq!(p.r.call(&[b"HEXISTS", h.as_bytes(), &one[0]]), b":1\r\n");
    let one = elements(&p.l.call(&[b"SRANDMEMBER", s.as_bytes()]));
    assert_eq!(p.r.call(&[b"SISMEMBER", s.as_bytes(), &one[0]]), b":1\r\n");
    // SPOP on lavik only, the same members removed from Redis by SREM.
    for count in [None, Some(1), Some(5), Some(60)] {
        let mut a: Vec<Vec<u8>> = vec![b"SPOP".to_vec(), s.as_bytes().to_vec()];
        if let Some(c) = count {
            a.push(c.to_string().into_bytes());
        }
        let refs: Vec<&[u8]> = a.iter().map(|x| x.as_slice()).collect();
        let popped = elements(&p.l.call(&refs));
        assert_eq!(popped.len(), count.unwrap_or(1));
        let d: BTreeSet<&Vec<u8>> = popped.iter().collect();
        assert_eq!(d.len(), popped.len(), "SPOP {count:?} distinct");
        let mut srem: Vec<&[u8]> = vec![b"SREM", s.as_bytes()];
        srem.extend(popped.iter().map(|m| m.as_slice()));
        let removed = p.r.call(&srem);
        assert_eq!(
            removed,
            format!(":{}\r\n", popped.len()).into_bytes(),
            "popped members were members"
        );
        p.check(&["SCARD", s]);
    }
    p.check(&["SPOP", s, "0"]);
    // Multi-key probes between paged and small sets.
    let s4 = format!("{s}4");
    let s4 = s4.as_str();
    for i in 0..2500 {
        if rng.chance(50) {
            p.check(&["SADD", s4, &member(i * 2)]);
        }
    }
    p.check(&["SADD", s2, &member(2), &member(4), &member(3000)]);
    for args in [
        vec!["SINTER", s, s4],
        vec!["SINTER", s4, s, s2],
        vec!["SINTER", s, s, "nosuchkey"],
        vec!["SDIFF", s, s4],
        vec!["SDIFF", s4, s, s2],
        vec!["SDIFF", s2, s],
        vec!["SDIFF", s, s2],
    ] {
        p.check_with(&args, sorted_elements);
    }
    for limit in ["0", "1", "10", "100000"] {
        p.check(&["SINTERCARD", "2", s, s4, "LIMIT", limit]);
        p.check(&["SINTERCARD", "3", s4, s, s2, "LIMIT", limit]);
    }
    let dst = format!("{s}dst");
    p.check(&["SINTERSTORE", &dst, s, s4]);
    p.check_with(&["SMEMBERS", &dst], sorted_elements);
    p.check(&["OBJECT", "ENCODING", &dst]);
    p.check(&["SDIFFSTORE", &dst, s, s4]);
    p.check_with(&["SMEMBERS", &dst], sorted_elements);
    p.check(&["OBJECT", "ENCODING", &dst]);
    // A small result's encoding is 7.2's listpack in lavik, 7.0's hashtable in redis-server:
    // its contents are compared.
    p.check(&["SDIFFSTORE", &dst, s2, s]);
    p.check_with(&["SMEMBERS", &dst], sorted_elements);
    p.check(&["DEL", &dst, s4]);
}

/// The payload of a bulk reply.
fn bulk(reply: &[u8]) -> Vec<u8> {
    let e = elements(reply);
    assert_eq!(
        e.len(),
        1,
        "a bulk reply: {:?}",
        String::from_utf8_lossy(reply)
    );
    e[0].clone()
}

fn start(tag: &str) -> Pair {
    let mut p = Pair::start(tag, &[]);
    let rep =
        p.r.call(&[b"CONFIG", b"SET", b"hash-max-listpack-entries", b"128"]);
    assert_eq!(rep, b"+OK\r\n");
    p
}

// Big hashes and sets (paged in lavik) answer every hash/set command as Redis does, through
// updates, splits and merges, COPY/RENAME and demotion, in RESP2 and then RESP3.
#[test]
fn big_collections_resp2_and_resp3() {
    let mut p = start("diff-paged");
    run(&mut p, 7, "r2");
    p.hello(3);
    run(&mut p, 11, "r3");
}

// One HSET or SADD of a new member on a 100k-member paged collection writes at most two
// 8 KiB pages, the root and a chunk's alignment, as counted by INFO (a whole-record
// rewrite would write megabytes).
#[test]
fn device_bytes_per_update_on_100k_members() {
    // Defrag paused: its relocations (of the pages the fill made dead) would be counted too.
    let mut p = Pair::start(
        "paged-bytes",
        &["--appendfsync", "always", "--defrag-paused"],
    );
    for (cmd, key) in [("HSET", "{w}h"), ("SADD", "{w}s")] {
        for start in (0..100_000u64).step_by(2000) {
            let mut a: Vec<String> = vec![cmd.into(), key.into()];
            for i in start..start + 2000 {
                a.push(format!("element:{i}"));
                if cmd == "HSET" {
                    a.push("v".into());
                }
            }
            let refs: Vec<&[u8]> = a.iter().map(|x| x.as_bytes()).collect();
            p.l.call(&refs);
        }
        let mut worst = 0;
        for i in 0..10u64 {
            let before = settled_write_bytes(&mut p);
            let m = format!("new:{i}");
            let rep = if cmd == "HSET" {
                p.l.call(&[b"HSET", key.as_bytes(), m.as_bytes(), b"v"])
            } else {
                p.l.call(&[b"SADD", key.as_bytes(), m.as_bytes()])
            };
            assert_eq!(rep, b":1\r\n");
            worst = worst.max(settled_write_bytes(&mut p) - before);
        }
        // 100k members of ~14 bytes: a root of a few directory entries (24 B each).
        let bound = 2 * 8192 + 1024 + 4096;
        assert!(
            worst > 0 && worst <= bound,
            "{cmd}: {worst} bytes per update > {bound}"
        );
        eprintln!("{cmd} on 100k members: at most {worst} device bytes per update");
    }
    // HSCAN COUNT 10 reads the root, one directory page and a leaf or two, not the ~250
    // leaves of the hash; a walk's steps each read a few records.
    let mut cursor = b"0".to_vec();
    for step in 0..5 {
        let before = record_reads(&mut p);
        let rep = p.l.call(&[b"HSCAN", b"{w}h", &cursor, b"COUNT", b"10"]);
        let reads = record_reads(&mut p) - before;
        let e = elements(&rep);
        assert!(e.len() >= 21, "step {step}: {} elements", e.len());
        assert!(
            reads <= 6,
            "HSCAN COUNT 10 step {step} read {reads} records"
        );
        cursor = e[0].clone();
    }
    // DEL of the paged hash and set answers without reading their pages; the background
    // job releases them (the INFO counter of pending releases drains).
    let before = record_reads(&mut p);
    assert_eq!(p.l.call(&[b"DEL", b"{w}h", b"{w}s"]), b":2\r\n");
    let reads = record_reads(&mut p) - before;
    // The two roots and an index candidate or so; releasing synchronously would add their
    // four directory pages.
    assert!(reads <= 4, "DEL read {reads} records");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while info_field(&mut p, "storage", "lavik_paged_releases_pending") != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "releases never drained"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A numeric INFO field of `section`.
fn info_field(p: &mut Pair, section: &str, name: &str) -> u64 {
    let rep = p.l.call(&[b"INFO", section.as_bytes()]);
    let text = String::from_utf8_lossy(&rep).into_owned();
    let prefix = format!("{name}:");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("INFO {section} reports {name}"))
        .trim()
        .parse()
        .unwrap()
}

/// Records the server read so far (record cache hits and misses).
fn record_reads(p: &mut Pair) -> u64 {
    info_field(p, "stats", "lavik_cache_hits") + info_field(p, "stats", "lavik_cache_misses")
}
