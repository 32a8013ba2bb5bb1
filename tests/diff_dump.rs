//! DUMP/RESTORE against Debian's `redis-server` (7.0.15): payloads cross both ways and the
//! values read back identical; DUMP bytes are identical where both servers hold the value
//! in the same encoding (strings, listpack hashes, intset sets); errors are compared with
//! the differential harness.
//!
//! lavik stores small non-integer sets as listpacks (Redis 7.2) and DUMPs them as a plain
//! SET, as 7.0 does for its hashtable sets; the member order of such payloads, and of
//! hashtable hashes, is each server's own, so those are compared by content only.
mod common;
use common::diff::{device_write_bytes, sorted_elements, sorted_pairs, Pair, Rng};
use lavik::rdb::crc64::crc64;

/// The payload of a bulk string reply.
fn bulk(reply: &[u8]) -> Vec<u8> {
    assert_eq!(
        reply[0],
        b'$',
        "not a bulk reply: {:?}",
        String::from_utf8_lossy(reply)
    );
    let end = reply.windows(2).position(|w| w == b"\r\n").unwrap();
    let n: usize = std::str::from_utf8(&reply[1..end])
        .unwrap()
        .parse()
        .unwrap();
    reply[end + 2..end + 2 + n].to_vec()
}

/// An object body with a version-`version` footer and its CRC-64.
fn payload(object: &[u8], version: u16) -> Vec<u8> {
    let mut p = object.to_vec();
    p.extend_from_slice(&version.to_le_bytes());
    let crc = crc64(0, &p);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

fn random_string(rng: &mut Rng) -> Vec<u8> {
    match rng.below(7) {
        0 => (rng.next_u64() as i64 >> rng.below(64))
            .to_string()
            .into_bytes(),
        1 => (rng.below(300) as i64 - 150).to_string().into_bytes(),
        2 => vec![b'a' + rng.below(3) as u8; rng.below(400) as usize],
        3 => b"abc".repeat(rng.below(200) as usize + 1),
        4 => (0..rng.below(100)).map(|_| rng.next_u64() as u8).collect(),
        5 => format!("0{}", rng.below(1000)).into_bytes(),
        _ => (0..rng.below(3000))
            .map(|_| b'a' + rng.below(4) as u8)
            .collect(),
    }
}

fn short_field(rng: &mut Rng, i: u64) -> Vec<u8> {
    match rng.below(3) {
        0 => i.to_string().into_bytes(),
        1 => format!("f{i}").into_bytes(),
        _ => format!("field-{i}-{}", "x".repeat(rng.below(80) as usize)).into_bytes(),
    }
}

/// Builds the same random value under `key` on both servers.
fn build(p: &mut Pair, rng: &mut Rng, key: &str) {
    match rng.below(3) {
        0 => {
            let v = random_string(rng);
            p.check_bytes(&[b"SET", key.as_bytes(), &v]);
        }
        1 => {
            let n = [1, 5, 60, 130, 300][rng.below(5) as usize];
            for i in 0..n {
                let f = short_field(rng, i);
                let v = if rng.chance(3) {
                    random_string(rng)
                } else {
                    i.to_string().into_bytes()
                };
                p.check_bytes(&[b"HSET", key.as_bytes(), &f, &v]);
            }
        }
        _ => {
            let n = [1, 4, 100, 600][rng.below(4) as usize];
            let ints = rng.chance(60);
            for i in 0..n {
                let m = if ints || rng.chance(50) {
                    (rng.next_u64() as i64 >> rng.below(64))
                        .to_string()
                        .into_bytes()
                } else {
                    short_field(rng, i)
                };
                p.check_bytes(&[b"SADD", key.as_bytes(), &m]);
            }
        }
    }
}

/// The value of `key` as a comparable reply (hash and set elements sorted).
fn read_back(p: &mut Pair, key: &str) {
    let t = p.check(&["TYPE", key]);
    match &t[..] {
        b"+string\r\n" => {
            p.check(&["GET", key]);
        }
        b"+hash\r\n" => {
            p.check_with(&["HGETALL", key], sorted_pairs);
        }
        b"+set\r\n" => {
            p.check_with(&["SMEMBERS", key], sorted_elements);
        }
        b"+zset\r\n" => {
            p.check(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
        }
        b"+list\r\n" => {
            p.check(&["LRANGE", key, "0", "-1"]);
        }
        other => panic!("unexpected type {:?}", String::from_utf8_lossy(other)),
    }
}

// Random strings, hashes and sets: DUMP bytes match where encodings match, each server's
// payload RESTOREs into both, and every restored copy reads back as the original.
#[test]
fn payloads_cross_both_ways() {
    let mut p = Pair::start("diff-dump-cross", &[]);
    let mut rng = Rng::new(0xd0_3b);
    for round in 0..60 {
        let key = format!("k{round}");
        build(&mut p, &mut rng, &key);
        let enc = p.r.call(&[b"OBJECT", b"ENCODING", key.as_bytes()]);
        let typ = p.r.call(&[b"TYPE", key.as_bytes()]);
        let (l, r) = p.both(&[b"DUMP", key.as_bytes()]);
        let same_encoding =
            typ == b"+string\r\n" || enc == b"$8\r\nlistpack\r\n" || enc == b"$6\r\nintset\r\n";
        if same_encoding {
            assert_eq!(l, r, "DUMP {key} differs (redis encoding {enc:?})");
        }
        let (l, r) = (bulk(&l), bulk(&r));
        for (tag, pl) in [("from-redis", &r), ("from-lavik", &l)] {
            let copy = format!("{tag}:{key}");
            p.check_bytes(&[b"RESTORE", copy.as_bytes(), b"0", pl]);
            read_back(&mut p, &copy);
            // A restored compact value is rebuilt in payload order by both: same DUMP.
            let enc = p.r.call(&[b"OBJECT", b"ENCODING", copy.as_bytes()]);
            if enc == b"$8\r\nlistpack\r\n" && p.r.call(&[b"TYPE", copy.as_bytes()]) == b"+hash\r\n"
                || enc == b"$6\r\nintset\r\n"
            {
                p.check(&["DUMP", &copy]);
            }
        }
        read_back(&mut p, &key);
    }
}

// RESTORE's option, TTL, BUSYKEY and payload errors, in Redis's order and text.
#[test]
fn restore_errors_as_redis() {
    let mut p = Pair::start("diff-dump-errors", &[]);
    p.check(&["SET", "s", "hello"]);
    let good = bulk(&p.check(&["DUMP", "s"]));
    let g: &[u8] = &good;
    let rr = |p: &mut Pair, args: &[&[u8]]| {
        let mut a: Vec<&[u8]> = vec![b"RESTORE"];
        a.extend_from_slice(args);
        p.check_bytes(&a);
    };
    rr(&mut p, &[b"s", b"0", g]); // BUSYKEY
    rr(&mut p, &[b"s", b"abc", g]); // BUSYKEY comes before the TTL check
    rr(&mut p, &[b"n", b"abc", g]);
    rr(&mut p, &[b"n", b"-1", g]);
    rr(&mut p, &[b"n", b"0", b"short"]);
    rr(&mut p, &[b"n", b"0", b""]);
    let mut flipped = good.clone();
    flipped[1] ^= 1;
    rr(&mut p, &[b"n", b"0", &flipped]);
    rr(&mut p, &[b"n", b"0", &payload(b"\x00\x05hello", 12)]);
    rr(&mut p, &[b"n", b"0", &payload(b"\x7f", 10)]);
    rr(&mut p, &[b"n", b"0", &payload(b"\x02\x00", 10)]);
    rr(&mut p, &[b"n", b"0", &payload(b"\x02\x02\x01a\x01a", 10)]);
    rr(&mut p, &[b"n", b"0", &payload(b"\x00\x09hello", 10)]);
    rr(&mut p, &[b"n", b"0", g, b"IDLETIME", b"-1"]);
    rr(&mut p, &[b"n", b"0", g, b"IDLETIME", b"x"]);
    rr(&mut p, &[b"n", b"0", g, b"IDLETIME"]);
    rr(&mut p, &[b"n", b"0", g, b"FREQ", b"256"]);
    rr(&mut p, &[b"n", b"0", g, b"FREQ", b"-1"]);
    rr(&mut p, &[b"n", b"0", g, b"FREQ", b"5", b"IDLETIME", b"5"]);
    rr(&mut p, &[b"n", b"0", g, b"IDLETIME", b"5", b"FREQ", b"5"]);
    rr(&mut p, &[b"n", b"0", g, b"BOGUS"]);
    rr(&mut p, &[b"n", b"0"]);
    p.check(&["DUMP"]);
    p.check(&["DUMP", "missing"]);
    // Arity, flags, key positions and ACL categories as Redis (lavik reports no command
    // tips or key-spec flags for any command, so the comparison stops at the categories).
    for (name, last_category) in [("dump", "+@slow\r\n"), ("restore", "+@dangerous\r\n")] {
        p.check_with(&["COMMAND", "INFO", name], |reply| {
            let cut = reply
                .windows(last_category.len())
                .position(|w| w == last_category.as_bytes())
                .expect("categories listed");
            reply[..cut + last_category.len()].to_vec()
        });
    }
    p.check(&["EXISTS", "n"]);
    // Accepted options: the value lands; IDLETIME/FREQ have no visible effect beyond that.
    rr(&mut p, &[b"n1", b"0", g, b"IDLETIME", b"100"]);
    rr(&mut p, &[b"n2", b"0", g, b"freq", b"255", b"replace"]);
    rr(&mut p, &[b"s", b"0", g, b"REPLACE", b"ABSTTL"]);
    p.check(&["MGET", "n1", "n2", "s"]);
    p.check(&["HSET", "h", "f", "v"]);
    rr(&mut p, &[b"h", b"0", g, b"REPLACE"]); // replaces a hash with a string
    p.check(&["TYPE", "h"]);
}

// TTLs: relative and absolute, and an already-expired absolute TTL creates nothing and
// deletes the key REPLACE would have replaced.
#[test]
fn restore_ttls_as_redis() {
    let mut p = Pair::start("diff-dump-ttl", &[]);
    p.check(&["SADD", "s", "1", "2", "x"]);
    let good = bulk(&p.check_with(&["DUMP", "s"], |_| Vec::new()));
    let g: &[u8] = &good;
    p.check_bytes(&[b"RESTORE", b"t1", b"100000", g]);
    p.check(&["TTL", "t1"]);
    p.check_bytes(&[b"RESTORE", b"t2", b"4102444800000", g, b"ABSTTL"]);
    p.check(&["TTL", "t2"]);
    p.check_bytes(&[b"RESTORE", b"t3", b"1000", g, b"ABSTTL"]);
    p.check(&["EXISTS", "t3"]);
    p.check(&["SET", "t4", "old"]);
    p.check_bytes(&[b"RESTORE", b"t4", b"1000", g, b"ABSTTL", b"REPLACE"]);
    p.check(&["EXISTS", "t4"]);
    p.check_with(&["SMEMBERS", "t1"], sorted_elements);
}

// A Redis 7.0 payload of every string encoding restores in lavik and DUMPs back unchanged.
#[test]
fn redis_string_payloads_round_trip() {
    let mut p = Pair::start("diff-dump-strings", &[]);
    let values: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"7".to_vec(),
        b"-128".to_vec(),
        b"32767".to_vec(),
        b"-2147483648".to_vec(),
        b"2147483648".to_vec(),
        b"-0".to_vec(),
        b"007".to_vec(),
        vec![b'z'; 21],
        b"0123456789".repeat(900),
        (0..=255u8).cycle().take(9000).collect(),
    ];
    for (i, v) in values.iter().enumerate() {
        let key = format!("v{i}");
        p.check_bytes(&[b"SET", key.as_bytes(), v]);
        let from_redis = bulk(&p.check(&["DUMP", &key]));
        p.check_bytes(&[b"RESTORE", b"copy", b"0", &from_redis, b"REPLACE"]);
        p.check(&["GET", "copy"]);
        p.check(&["DUMP", "copy"]);
    }
}

// LZF output is Redis's byte for byte: random compressible strings DUMP identically.
#[test]
fn lzf_dump_bytes_as_redis() {
    let mut p = Pair::start("diff-dump-lzf", &[]);
    let mut rng = Rng::new(0x12f);
    for i in 0..300 {
        let len_max = if rng.chance(20) { 20000 } else { 600 };
        let len = 21 + rng.below(len_max) as usize;
        let alphabet_max = if rng.chance(50) { 4 } else { 256 };
        let alphabet = 1 + rng.below(alphabet_max) as u32;
        let mut v: Vec<u8> = Vec::with_capacity(len);
        while v.len() < len {
            if !v.is_empty() && rng.chance(30) {
                // Repeat an earlier stretch, near or up to ~9 KiB back (beyond LZF's reach).
                let back = 1 + rng.below(v.len().min(9000) as u64) as usize;
                let n = (1 + rng.below(300) as usize).min(len - v.len());
                let start = v.len() - back;
                for j in 0..n {
                    v.push(v[start + j % back]);
                }
            } else {
                v.push(b' '.wrapping_add((rng.next_u64() % u64::from(alphabet)) as u8));
            }
        }
        let key = format!("z{i}");
        p.check_bytes(&[b"SET", key.as_bytes(), &v]);
        p.check(&["DUMP", &key]);
    }
}

// Sorted sets DUMP byte for byte as Redis writes them (listpack below 129 members, ZSET_2
// from the highest pair down above), and each server's payloads RESTORE into the other
// with the same members, scores and encoding. Scores are integers, halves and infinities,
// which Redis 7.0 and 7.2 both write alike.
#[test]
fn zset_payloads_as_redis() {
    let mut p = Pair::start("diff-dump-zset", &[]);
    let mut rng = Rng::new(0x25e7);
    let scores = [
        "0",
        "1",
        "-3",
        "2.5",
        "-0.5",
        "inf",
        "-inf",
        "100000",
        "70000",
        "4294967296",
    ];
    for (round, size) in [1usize, 2, 5, 60, 128, 129, 300].into_iter().enumerate() {
        let key = format!("z{round}");
        let mut args: Vec<Vec<u8>> = vec![b"ZADD".to_vec(), key.clone().into_bytes()];
        for i in 0..size {
            args.push(rng.pick(&scores).as_bytes().to_vec());
            let member = match rng.below(4) {
                0 => i.to_string().into_bytes(),
                1 => format!("m{i}").into_bytes(),
                2 => format!("{}-{i}", "x".repeat(rng.below(30) as usize)).into_bytes(),
                _ => (-(i as i64) * 1000).to_string().into_bytes(),
            };
            args.push(member);
        }
        let a: Vec<&[u8]> = args.iter().map(|x| x.as_slice()).collect();
        p.check_bytes(&a);
        p.check(&["OBJECT", "ENCODING", &key]);
        let from_redis = bulk(&p.check(&["DUMP", &key]));
        p.check_bytes(&[b"RESTORE", b"copy", b"0", &from_redis, b"REPLACE"]);
        p.check(&["ZRANGE", "copy", "0", "-1", "WITHSCORES"]);
        p.check(&["OBJECT", "ENCODING", "copy"]);
        p.check(&["DUMP", "copy"]);
    }
    // A member longer than 64 bytes makes a small set a skiplist: written as ZSET_2.
    let long = "L".repeat(70);
    p.check(&["ZADD", "zl", "1", &long, "2", "b"]);
    p.check(&["OBJECT", "ENCODING", "zl"]);
    p.check(&["DUMP", "zl"]);
}

/// Pushes `n` random elements to `key` on both servers, all at the tail unless `head`.
fn build_list(p: &mut Pair, rng: &mut Rng, key: &str, n: usize, head: bool) {
    let cmd: &[u8] = if head { b"LPUSH" } else { b"RPUSH" };
    for _ in 0..n {
        let e = if rng.chance(70) {
            random_string(rng)
        } else {
            rng.below(100_000).to_string().into_bytes()
        };
        p.check_bytes(&[cmd, key.as_bytes(), &e]);
    }
}

// Lists built by head or tail pushes: DUMP bytes equal Redis's (one node, or quicklist
// nodes cut as Redis cuts them), every payload RESTOREs into both servers, and the copies
// read back element for element and dump identically.
#[test]
fn list_payloads_as_redis() {
    let mut p = Pair::start("diff-dump-list", &[]);
    let mut rng = Rng::new(0x11_57d);
    for (round, (n, head)) in [
        (1, false),
        (3, true),
        (20, false),
        (60, true),
        (200, false),
        (400, false),
        (150, true),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("list{round}");
        build_list(&mut p, &mut rng, &key, n, head);
        let (l, r) = p.both(&[b"DUMP", key.as_bytes()]);
        assert_eq!(
            l, r,
            "DUMP {key} ({n} elements, head pushes: {head}) differs"
        );
        let (l, r) = (bulk(&l), bulk(&r));
        for (tag, pl) in [("from-redis", &r), ("from-lavik", &l)] {
            let copy = format!("{tag}:{key}");
            p.check_bytes(&[b"RESTORE", copy.as_bytes(), b"0", pl]);
            p.check(&["TYPE", &copy]);
            p.check(&["LRANGE", &copy, "0", "-1"]);
            // RESTORE keeps the payload's nodes, so the copy dumps as Redis's copy does.
            p.check(&["DUMP", &copy]);
        }
        p.check(&["LRANGE", &key, "0", "-1"]);
    }
    // An empty quicklist (no nodes) is refused as Redis refuses an empty key.
    p.check_bytes(&[b"RESTORE", b"empty", b"0", &payload(&[18, 0], 10)]);
    // A quicklist-2 node with an unknown container is bad data.
    p.check_bytes(&[
        b"RESTORE",
        b"badnode",
        b"0",
        &payload(&[18, 1, 3, 1, b'x'], 10),
    ]);
    // A PLAIN node holds one element verbatim.
    p.check_bytes(&[
        b"RESTORE",
        b"plain",
        b"0",
        &payload(&[18, 1, 1, 3, b'a', b'b', b'c'], 10),
    ]);
    p.check(&["LRANGE", "plain", "0", "-1"]);
    // Redis's LZF-compressed inner nodes (list-compress-depth 1) load too.
    let rep = p.r.call(&[b"CONFIG", b"SET", b"list-compress-depth", b"1"]);
    assert_eq!(rep, b"+OK\r\n");
    build_list(&mut p, &mut rng, "compressed", 300, false);
    let r = bulk(&p.r.call(&[b"DUMP", b"compressed"]));
    p.check_bytes(&[b"RESTORE", b"compressed-copy", b"0", &r]);
    p.check(&["LRANGE", "compressed-copy", "0", "-1"]);
    // A version-1 LIST of strings (RDB type 1) still loads.
    p.check_bytes(&[b"RESTORE", b"old", b"0", &payload(&[1, 2, 1, b'a', 0], 9)]);
    p.check(&["LRANGE", "old", "0", "-1"]);
}

// Lists changed in the middle (LINSERT into full nodes, which splits and merges them,
// LSET, LREM) and at both ends still DUMP byte-identically: lavik's quicklist nodes are
// cut as Redis's.
#[test]
fn list_nodes_after_middle_edits() {
    let mut p = Pair::start("diff-dump-list-mid", &[]);
    let mut rng = Rng::new(0x11_57e);
    let mut names = Vec::new();
    for i in 0..300 {
        let e = format!("p{i}-{}", "y".repeat(rng.below(200) as usize));
        p.check(&["RPUSH", "m", &e]);
        names.push(e);
    }
    for round in 0..200 {
        let pivot = names[rng.below(names.len() as u64) as usize].clone();
        let e = format!("n{round}-{}", "z".repeat(rng.below(400) as usize));
        match rng.below(6) {
            0..=2 => {
                let side = if rng.chance(50) { "BEFORE" } else { "AFTER" };
                p.check(&["LINSERT", "m", side, &pivot, &e]);
                names.push(e);
            }
            3 => {
                let i = rng.below(names.len() as u64).to_string();
                p.check(&["LSET", "m", &i, &e]);
            }
            4 => {
                p.check(&["LREM", "m", "1", &pivot]);
            }
            _ => {
                p.check(&[if rng.chance(50) { "LPUSH" } else { "RPUSH" }, "m", &e]);
                names.push(e);
            }
        }
        if round % 10 == 9 {
            p.check(&["DUMP", "m"]);
        }
    }
    p.check(&["LRANGE", "m", "0", "-1"]);
}

// RESTORE of a big collection stores it paged, like the commands do: one update
// afterwards writes a few pages, not the whole value again.
#[test]
fn restore_of_big_collections_is_paged() {
    // `always`: every write is on the device before its reply, so the counter is exact.
    let mut p = Pair::start("diff-dump-big", &["--appendfsync", "always"]);
    let n = 6000;
    let mut hset: Vec<Vec<u8>> = vec![b"HSET".to_vec(), b"h".to_vec()];
    let mut sadd: Vec<Vec<u8>> = vec![b"SADD".to_vec(), b"s".to_vec()];
    let mut zadd: Vec<Vec<u8>> = vec![b"ZADD".to_vec(), b"z".to_vec()];
    let mut rpush: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), b"l".to_vec()];
    for i in 0..n {
        hset.push(format!("field:{i}").into_bytes());
        hset.push(format!("value-{i:020}").into_bytes());
        sadd.push(format!("member:{i:012}").into_bytes());
        zadd.push(format!("{}", i * 7 % 1000).into_bytes());
        zadd.push(format!("member:{i:012}").into_bytes());
        rpush.push(format!("element-{i:016}").into_bytes());
    }
    for cmd in [&hset, &sadd, &zadd, &rpush] {
        let args: Vec<&[u8]> = cmd.iter().map(|a| a.as_slice()).collect();
        p.r.call(&args);
    }
    let updates: [(&str, &[&str]); 4] = [
        ("h", &["HSET", "copy:h", "field:17", "changed"]),
        ("s", &["SADD", "copy:s", "member:new"]),
        ("z", &["ZADD", "copy:z", "5", "member:new"]),
        ("l", &["RPUSH", "copy:l", "element-new"]),
    ];
    for (key, update) in updates {
        let payload = bulk(&p.r.call(&[b"DUMP", key.as_bytes()]));
        assert!(
            payload.len() > 20_000,
            "{key}: payload of {} bytes",
            payload.len()
        );
        let copy = format!("copy:{key}");
        p.check_bytes(&[b"RESTORE", copy.as_bytes(), b"0", &payload]);
        p.check(&["OBJECT", "ENCODING", &copy]);
        let before = device_write_bytes(&mut p);
        p.check(update);
        let written = device_write_bytes(&mut p) - before;
        assert!(
            written <= 32 * 1024,
            "{key}: one update after RESTORE wrote {written} bytes (payload {})",
            payload.len()
        );
        read_back(&mut p, &copy);
    }
}
