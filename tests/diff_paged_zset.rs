//! Differential tests of big sorted sets (thousands of members: lavik stores them as paged
//! sorted sets, `docs/collections.md` section 4b, both trees with several leaves and
//! directory pages) against Debian's `redis-server`, replies compared byte for byte in RESP2
//! and RESP3, with many score ties. DUMP must be byte-identical too.
//!
//! Also measures, through INFO's `lavik_device_write_bytes`, the device bytes one ZADD of a
//! new member writes on a 20k-member paged sorted set, and through `lavik_sync_reads` /
//! `lavik_restart_reads` the pages the lex and range-removal commands read.
mod common;
use common::diff::{settled_write_bytes, Pair, Rng};

fn member(i: u64) -> String {
    format!("member:{i}")
}

/// A score with many ties: small integers mostly, sometimes a fraction or an infinity.
/// Fractions are exact in binary: Redis 7.0 formats scores as `%.17g`, 7.2 (lavik) as the
/// shortest round trip, and these agree only on such values.
fn score(rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => format!("{}.{}", rng.below(40), rng.pick(&["5", "25", "125", "375"])),
        1 if rng.chance(20) => "+inf".into(),
        1 if rng.chance(20) => "-inf".into(),
        _ => rng.below(40).to_string(),
    }
}

/// Fills `z` with `n` members, 500 per ZADD.
fn fill(p: &mut Pair, z: &str, n: u64, rng: &mut Rng) {
    for start in (0..n).step_by(500) {
        let mut a = vec!["ZADD".to_string(), z.to_string()];
        for i in start..(start + 500).min(n) {
            a.push(score(rng));
            a.push(member(i));
        }
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        p.check(&a);
    }
}

fn whole_check(p: &mut Pair, z: &str) {
    p.check(&["ZCARD", z]);
    p.check(&["ZRANGE", z, "0", "-1", "WITHSCORES"]);
    p.check(&["OBJECT", "ENCODING", z]);
    p.check(&["DUMP", z]);
}

/// A score-range bound: inclusive or exclusive, sometimes infinite.
fn bound(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 => "-inf".into(),
        1 => "+inf".into(),
        2 | 3 => format!("({}", rng.below(42)),
        _ => rng.below(42).to_string(),
    }
}

/// A lex bound over `member:i` names: inclusive or exclusive, sometimes `-` or `+`.
fn lex_bound(rng: &mut Rng, top: u64) -> String {
    match rng.below(10) {
        0 => "-".into(),
        1 => "+".into(),
        2..=5 => format!("({}", member(rng.below(top))),
        _ => format!("[{}", member(rng.below(top))),
    }
}

/// Lex ranges (meaningful when every score is equal, so the set is paged with one score),
/// the range removals and ZRANGESTORE on a big sorted set, with small ZADD/ZREM between.
fn lex_run(p: &mut Pair, seed: u64, tag: &str, n: u64, ops: u64) {
    let (z, dst) = (format!("{tag}:{{z}}lex"), format!("{tag}:{{z}}dst"));
    let (z, dst) = (z.as_str(), dst.as_str());
    let mut rng = Rng::new(seed);
    for start in (0..n).step_by(500) {
        let mut a = vec!["ZADD".to_string(), z.to_string()];
        for i in start..(start + 500).min(n) {
            a.push("0".into());
            a.push(member(i));
        }
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        p.check(&a);
    }
    whole_check(p, z);
    for _ in 0..ops {
        let (l1, l2) = (lex_bound(&mut rng, n), lex_bound(&mut rng, n));
        let (off, cnt) = (
            rng.below(20).to_string(),
            (rng.below(15) as i64 - 1).to_string(),
        );
        let m = member(rng.below(n + n / 5));
        let i = rng.below(n);
        let (r1, r2) = (i.to_string(), (i + rng.below(6)).to_string());
        match rng.below(16) {
            0 => p.check(&["ZRANGE", z, &l1, &l2, "BYLEX", "LIMIT", &off, &cnt]),
            1 => p.check(&["ZRANGE", z, &l2, &l1, "BYLEX", "REV", "LIMIT", &off, &cnt]),
            2 => p.check(&["ZRANGEBYLEX", z, &l1, &l2, "LIMIT", &off, &cnt]),
            3 => p.check(&["ZREVRANGEBYLEX", z, &l2, &l1, "LIMIT", &off, &cnt]),
            4 => p.check(&["ZLEXCOUNT", z, &l1, &l2]),
            5 => p.check(&["ZADD", z, "0", &m]),
            6 => p.check(&["ZREM", z, &m]),
            7 => {
                // A narrow lex removal: a few members from one name on.
                let other = member(rng.below(n));
                let lo = format!("[{m}");
                let hi = if other > m && other.len() <= m.len() + 1 {
                    format!("({other}")
                } else {
                    format!("[{m}")
                };
                p.check(&["ZREMRANGEBYLEX", z, &lo, &hi])
            }
            8 => p.check(&["ZREMRANGEBYRANK", z, &r1, &r2]),
            9 => p.check(&["ZREMRANGEBYRANK", z, "-3", "-1"]),
            10 => p.check(&["ZREMRANGEBYSCORE", z, "(0", "+inf"]),
            11 => p.check(&[
                "ZRANGESTORE",
                dst,
                z,
                &l1,
                &l2,
                "BYLEX",
                "LIMIT",
                &off,
                &cnt,
            ]),
            12 => p.check(&[
                "ZRANGESTORE",
                dst,
                z,
                &l2,
                &l1,
                "BYLEX",
                "REV",
                "LIMIT",
                &off,
                "9",
            ]),
            13 => p.check(&[
                "ZRANGESTORE",
                dst,
                z,
                "-inf",
                "+inf",
                "BYSCORE",
                "LIMIT",
                &r1,
                "7",
            ]),
            14 => p.check(&["ZRANGESTORE", dst, z, &r1, &r2]),
            _ => p.check(&["ZRANGE", dst, "0", "-1", "WITHSCORES"]),
        };
    }
    whole_check(p, z);
    // A wide lex removal and a wide rank removal (the rest is folded back into one record).
    p.check(&["ZREMRANGEBYLEX", z, "[member:1", "(member:5"]);
    whole_check(p, z);
    p.check(&["ZREMRANGEBYRANK", z, "10", "-10"]);
    whole_check(p, z);
    p.check(&["DEL", z, dst]);
}

fn run(p: &mut Pair, seed: u64, tag: &str, n: u64, ops: u64) {
    let (z, z2) = (format!("{tag}:{{z}}a"), format!("{tag}:{{z}}b"));
    let (z, z2) = (z.as_str(), z2.as_str());
    let mut rng = Rng::new(seed);
    fill(p, z, n, &mut rng);
    whole_check(p, z);
    let top = n + n / 5;
    for _ in 0..ops {
        let i = rng.below(top);
        let m = member(i);
        let (lo, hi) = (rng.below(n) as i64, rng.below(n) as i64);
        let (slo, shi) = (lo.to_string(), (lo + rng.below(40) as i64).to_string());
        let neg = (-(rng.below(60) as i64) - 1).to_string();
        let (b1, b2) = (bound(&mut rng), bound(&mut rng));
        let (off, cnt) = (
            rng.below(30).to_string(),
            (rng.below(12) as i64 - 1).to_string(),
        );
        let sc = score(&mut rng);
        match rng.below(26) {
            0..=2 => p.check(&["ZADD", z, &sc, &m]),
            3 => p.check(&["ZADD", z, "NX", "CH", &sc, &m, &sc, &member(i + 1)]),
            4 => p.check(&["ZADD", z, "XX", "CH", &sc, &m]),
            5 => p.check(&["ZADD", z, "GT", "CH", &sc, &m]),
            6 => p.check(&["ZADD", z, "LT", "INCR", &sc, &m]),
            7 => p.check(&["ZINCRBY", z, &sc, &m]),
            8 | 9 => p.check(&["ZREM", z, &m, &member(i + 1), "nope"]),
            10 => p.check(&["ZSCORE", z, &m]),
            11 => p.check(&["ZMSCORE", z, &m, "nope", &member(i + 3)]),
            12 => p.check(&["ZRANK", z, &m]),
            13 => p.check(&["ZREVRANK", z, &m]),
            14 => p.check(&["ZRANGE", z, &slo, &shi, "WITHSCORES"]),
            15 => p.check(&["ZRANGE", z, &neg, "-1", "REV"]),
            16 => p.check(&["ZREVRANGE", z, &slo, &shi, "WITHSCORES"]),
            17 => p.check(&[
                "ZRANGE",
                z,
                &b1,
                &b2,
                "BYSCORE",
                "LIMIT",
                &off,
                &cnt,
                "WITHSCORES",
            ]),
            18 => p.check(&["ZRANGE", z, &b2, &b1, "BYSCORE", "REV", "LIMIT", &off, &cnt]),
            19 => p.check(&["ZRANGEBYSCORE", z, &b1, &b2, "LIMIT", &off, "5"]),
            20 => p.check(&[
                "ZREVRANGEBYSCORE",
                z,
                &b2,
                &b1,
                "WITHSCORES",
                "LIMIT",
                "0",
                "7",
            ]),
            21 => p.check(&["ZCOUNT", z, &b1, &b2]),
            22 => p.check(&["ZPOPMIN", z, &rng.below(4).to_string()]),
            23 => p.check(&["ZPOPMAX", z, &rng.below(4).to_string()]),
            24 => p.check(&["ZMPOP", "2", z2, z, "MAX", "COUNT", "2"]),
            _ => p.check(&["BZPOPMIN", z, "0.01"]),
        };
        if hi == lo || rng.chance(3) {
            // Range removals and ZRANGESTORE by score and rank on mixed scores.
            p.check(&["ZREMRANGEBYSCORE", z, &b1, &slo]);
            p.check(&["ZREMRANGEBYRANK", z, &slo, &(lo + 3).to_string()]);
            p.check(&[
                "ZRANGESTORE",
                z2,
                z,
                &b2,
                &b1,
                "BYSCORE",
                "REV",
                "LIMIT",
                &off,
                &cnt,
            ]);
            p.check(&["ZRANGE", z2, "0", "-1", "WITHSCORES"]);
        }
        if rng.chance(5) {
            p.check(&["ZCARD", z]);
        }
    }
    whole_check(p, z);
    // Whole-value commands, COPY and RENAME, then updates of the copies.
    let (zc, zr) = (format!("{tag}:{{z}}c"), format!("{tag}:{{z}}r"));
    p.check(&["ZRANGESTORE", z2, z, "0", "99"]);
    p.check(&["ZUNIONSTORE", z2, "2", z, z2]);
    p.check(&["COPY", z, &zc]);
    p.check(&["ZADD", &zc, "3", "after-copy"]);
    whole_check(p, &zc);
    p.check(&["RENAME", &zc, &zr]);
    p.check(&["ZREM", &zr, &member(3)]);
    whole_check(p, &zr);
    // DUMP of a paged sorted set restores in Redis, and Redis's DUMP in lavik.
    let zd = format!("{tag}:{{z}}d");
    let from_lavik = bulk(&p.l.call(&[b"DUMP", z.as_bytes()]));
    p.check_bytes(&[b"RESTORE", zd.as_bytes(), b"0", &from_lavik]);
    whole_check(p, &zd);
    let from_redis = bulk(&p.r.call(&[b"DUMP", z.as_bytes()]));
    p.check_bytes(&[b"RESTORE", zd.as_bytes(), b"0", &from_redis, b"REPLACE"]);
    p.check(&["ZADD", &zd, "1", "after-restore"]);
    whole_check(p, &zd);
    // Shrink until lavik folds the pages back into one record: by pops, then by a
    // whole-value removal.
    let card: u64 = std::str::from_utf8(&p.check(&["ZCARD", z])[1..])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut left = card;
    while left > 300 {
        p.check(&["ZPOPMIN", z, "97"]);
        p.check(&["ZPOPMAX", z, "103"]);
        left = left.saturating_sub(200);
    }
    whole_check(p, z);
    p.check(&["ZREMRANGEBYRANK", z, "5", "-5"]);
    whole_check(p, z);
    // Expiry of a paged value, then DEL and FLUSHDB of paged values.
    p.check(&["PEXPIRE", &zr, "30"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while p.l.call(&[b"EXISTS", zr.as_bytes()]) != b":0\r\n" {
        assert!(std::time::Instant::now() < deadline, "no expiry");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    while p.r.call(&[b"EXISTS", zr.as_bytes()]) != b":0\r\n" {
        assert!(std::time::Instant::now() < deadline, "no expiry in redis");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    p.check(&["ZCARD", &zr]);
    p.check(&["DEL", z, &zd]);
    p.check(&["DBSIZE"]);
    p.check(&["FLUSHDB"]);
    p.check(&["DBSIZE"]);
}

/// The payload of a bulk reply.
fn bulk(reply: &[u8]) -> Vec<u8> {
    let end = reply.windows(2).position(|w| w == b"\r\n").unwrap();
    assert_eq!(reply[0], b'$', "a bulk reply");
    let n: usize = std::str::from_utf8(&reply[1..end])
        .unwrap()
        .parse()
        .unwrap();
    reply[end + 2..end + 2 + n].to_vec()
}

// Big sorted sets (paged in lavik) answer every zset command as Redis does, through random
// adds with ties, flags, increments, removals, ranks, rank/score ranges, pops, COPY/RENAME/
// DUMP/RESTORE and demotion, in RESP2 (16k members: several directory pages per tree) and
// then RESP3.
#[test]
fn big_sorted_sets_resp2_and_resp3() {
    let mut p = Pair::start("diff-pzset", &[]);
    run(&mut p, 7, "r2", 16_000, 500);
    lex_run(&mut p, 8, "r2", 6000, 400);
    p.hello(3);
    run(&mut p, 11, "r3", 4000, 300);
    lex_run(&mut p, 12, "r3", 2000, 200);
}

/// Page reads so far: synchronous record reads plus the reads restartable runs asked for
/// (`lavik_restart_reads`: pages below a prefetched root, read without blocking).
fn page_reads(c: &mut redis::Connection) -> u64 {
    let text: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in INFO"))
            .trim()
            .parse()
            .unwrap()
    };
    field("lavik_sync_reads:") + field("lavik_restart_reads:")
}

/// The page reads (the root is prefetched) one command makes, and its reply.
fn reads_of(c: &mut redis::Connection, args: &[&str]) -> (u64, redis::Value) {
    let before = page_reads(c);
    let v: redis::Value = redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap();
    (page_reads(c) - before, v)
}

// With no record cache, lex ranges, ZLEXCOUNT, ZRANGESTORE and the range removals on a
// 20k-member paged sorted set (one score: ~150 leaves per tree, two directory pages each)
// read only the directory pages and leaves around their bounds and, for removals, the
// removed members' leaves; a whole-value read would be ~320 pages (lavik alone).
#[test]
fn range_commands_read_only_their_pages() {
    let s = common::Server::start(
        "pzset-reads",
        &["--threads", "1", "--cache-size", "0", "--defrag-paused"],
    );
    let mut c = s.client();
    let name = |i: u64| format!("element:{i:06}");
    for start in (0..20_000u64).step_by(2000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg("{z}");
        for i in start..start + 2000 {
            cmd.arg(0).arg(name(i));
        }
        let _: u64 = cmd.query(&mut c).unwrap();
    }
    // Push the pages out of the open block (reads from it touch no device).
    let filler = "f".repeat(10_000);
    let mut pipe = redis::pipe();
    for i in 0..300 {
        pipe.cmd("SET")
            .arg(format!("{{z}}f{i}"))
            .arg(&filler)
            .ignore();
    }
    let () = pipe.query(&mut c).unwrap();
    let lo = format!("[{}", name(10_000));
    let hi = format!("({}", name(10_500));
    let cases: [(&[&str], u64, redis::Value); 7] = [
        (&["ZLEXCOUNT", "{z}", &lo, &hi], 6, redis::Value::Int(500)),
        (
            &["ZRANGEBYLEX", "{z}", &lo, &hi, "LIMIT", "0", "3"],
            5,
            bulks(&[name(10_000), name(10_001), name(10_002)]),
        ),
        (
            &["ZREVRANGEBYLEX", "{z}", &hi, &lo, "LIMIT", "2", "1"],
            5,
            bulks(&[name(10_497)]),
        ),
        (
            &[
                "ZRANGESTORE",
                "{z}d",
                "{z}",
                &lo,
                &hi,
                "BYLEX",
                "LIMIT",
                "0",
                "10",
            ],
            5,
            redis::Value::Int(10),
        ),
        (
            &["ZREMRANGEBYLEX", "{z}", &lo, &format!("({}", name(10_005))],
            14,
            redis::Value::Int(5),
        ),
        (
            &["ZREMRANGEBYRANK", "{z}", "3000", "3004"],
            14,
            redis::Value::Int(5),
        ),
        (
            &["ZREMRANGEBYSCORE", "{z}", "(0", "+inf"],
            6,
            redis::Value::Int(0),
        ),
    ];
    // Background work (releases of the fill's replaced pages) reads pages too: wait until
    // a command reading only the root counts none.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while reads_of(&mut c, &["ZCARD", "{z}"]).0 != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "background reads never stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut seen = Vec::new();
    for (args, bound, want) in cases {
        let (reads, got) = reads_of(&mut c, args);
        assert_eq!(got, want, "{args:?}");
        eprintln!("{}: {reads} page reads", args[0]);
        seen.push((args[0], reads, bound));
    }
    for (name, reads, bound) in seen {
        assert!(reads <= bound, "{name}: {reads} page reads > {bound}");
    }
    let card: u64 = redis::cmd("ZCARD").arg("{z}").query(&mut c).unwrap();
    assert_eq!(card, 19_990);
    let gone: Option<f64> = redis::cmd("ZSCORE")
        .arg("{z}")
        .arg(name(10_003))
        .query(&mut c)
        .unwrap();
    assert_eq!(gone, None);
}

fn bulks(items: &[String]) -> redis::Value {
    redis::Value::Array(
        items
            .iter()
            .map(|i| redis::Value::BulkString(i.clone().into_bytes()))
            .collect(),
    )
}

// One ZADD of a new member (or ZREM of one) on a 20k-member paged sorted set writes at
// most two leaves of each tree's size, two directory pages and the root, as counted by
// INFO: within 2 × 8 KiB plus one sector of alignment (a whole-record rewrite would write
// ~450 KB).
#[test]
fn device_bytes_per_zadd_on_20k_members() {
    // Defrag paused: its relocations (of the pages the fill made dead) would be counted too.
    let mut p = Pair::start(
        "pzset-bytes",
        &["--appendfsync", "always", "--defrag-paused"],
    );
    for start in (0..20_000u64).step_by(2000) {
        let mut a: Vec<String> = vec!["ZADD".into(), "{w}z".into()];
        for i in start..start + 2000 {
            a.push((i % 1000).to_string());
            a.push(format!("element:{i}"));
        }
        let refs: Vec<&[u8]> = a.iter().map(|x| x.as_bytes()).collect();
        p.l.call(&refs);
    }
    let mut worst = 0;
    for i in 0..10u64 {
        let before = settled_write_bytes(&mut p);
        let m = format!("new:{i}");
        let s = (i * 97 % 1000).to_string();
        let rep = p.l.call(&[b"ZADD", b"{w}z", s.as_bytes(), m.as_bytes()]);
        assert_eq!(rep, b":1\r\n");
        worst = worst.max(settled_write_bytes(&mut p) - before);
        let before = settled_write_bytes(&mut p);
        let rep =
            p.l.call(&[b"ZREM", b"{w}z", format!("element:{}", i * 1999).as_bytes()]);
        assert_eq!(rep, b":1\r\n");
        worst = worst.max(settled_write_bytes(&mut p) - before);
    }
    let bound = 2 * 8192 + 4096;
    assert!(
        worst > 0 && worst <= bound,
        "{worst} bytes per ZADD/ZREM > {bound}"
    );
    eprintln!("ZADD/ZREM on 20k members: at most {worst} device bytes per command");
}
